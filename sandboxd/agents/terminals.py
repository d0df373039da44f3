# -*- test-case-name: tests.test_agents -*-
"""
The agent's own commands (ACP ``terminal/*``), run like any other child
(SPEC §7.4: own session, guarded cwd, scrubbed environment, allow/deny
lists) with two views of the output: the bounded tail ACP's
``terminal/output`` returns (truncated from the start, on a UTF-8
boundary), and an :class:`~sandboxd.eventlog.EventLog` that HTTP callers
read and follow with the ``process_output`` contract.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

from sandboxd.children import exit_code, signal_name, spawn_session
from sandboxd.eventlog import EventLog
from sandboxd.policy.defaults import KILL_GRACE_SECONDS
from sandboxd.proctree import signal_tree


def utf8_tail(data: bytes, limit: int) -> bytes:
    """The last ``limit`` bytes of ``data``, starting on a character boundary."""
    if len(data) <= limit:
        return data
    cut = data[len(data) - limit :]
    skip = 0
    while skip < len(cut) and skip < 4 and (cut[skip] & 0xC0) == 0x80:
        skip += 1
    return cut[skip:]


class AgentTerminal(ProcessProtocol):
    """One ``terminal/create`` command."""

    def __init__(
        self,
        reactor: Any,
        terminal_id: str,
        command: str,
        args: list[str],
        cwd: str,
        output_limit: int,
        log_bytes: int,
        tool_call_id: str | None,
        on_exit: Callable[[AgentTerminal], None],
    ) -> None:
        self.reactor = reactor
        self.terminal_id = terminal_id
        self.command = command
        self.args = args
        self.cwd = cwd
        self.output_limit = output_limit
        self.tool_call_id = tool_call_id
        self.log = EventLog(log_bytes)
        self.pid: int | None = None
        self.state = "running"
        self.exit_code: int | None = None
        self.signal: str | None = None
        self.released = False
        self.truncated = False
        self.started_at = time.time()
        self._tail = bytearray()
        self._on_exit = on_exit
        self._waiters: list[Deferred[None]] = []
        self._kill_call: Any = None
        self._drop_call: Any = None
        self._end_call: Any = None

    def start(
        self, executable: str, env: dict[str, str], uid: int | None, gid: int | None
    ) -> None:
        """Spawn it in its own session."""
        argv = [executable, *self.args]
        spawn_session(self.reactor, self, executable, argv, env, self.cwd, uid, gid)

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.pid = self.transport.pid
        self.transport.closeStdin()

    def _output(self, stream: str, data: bytes) -> None:
        self._tail += data
        if len(self._tail) > self.output_limit:
            self._tail = bytearray(utf8_tail(bytes(self._tail), self.output_limit))
            self.truncated = True
        if not self.log.closed:
            self.log.append(stream, {"data": data.decode("utf-8", "replace")})

    def outReceived(self, data: bytes) -> None:
        self._output("stdout", data)

    def errReceived(self, data: bytes) -> None:
        self._output("stderr", data)

    def processExited(self, reason: Failure) -> None:
        if self.state == "exited":
            return
        code = exit_code(reason)
        self.state = "exited"
        if code is not None and code < 0:
            self.signal = signal_name(-code)
            self.exit_code = None
        else:
            self.exit_code = code
        if self.pid is not None:
            signal_tree(self.pid, signal.SIGKILL)
        self._drop_call = self.reactor.callLater(0.2, self._drop_pipes)
        if self._kill_call is not None and self._kill_call.active():
            self._kill_call.cancel()

    def processEnded(self, reason: Failure) -> None:
        self.processExited(reason)
        for call in (self._drop_call, self._end_call):
            if call is not None and call.active():
                call.cancel()
        self._finish(reason)

    def _drop_pipes(self) -> None:
        if self.transport is not None:
            try:
                self.transport.loseConnection()
            except Exception:
                pass
        # processEnded follows; if a grandchild still holds a pipe, end anyway.
        self._end_call = self.reactor.callLater(1.0, self._finish, None)

    def _finish(self, reason: Failure | None) -> None:
        if self.log.closed:
            return
        code = (
            self.exit_code
            if self.signal is None
            else -int(getattr(signal, self.signal, 0) or 0)
        )
        self.log.append("exit", {"exit_code": code})
        self.log.close()
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.callback(None)
        self._on_exit(self)

    @property
    def finished(self) -> bool:
        """Exited and its output fully read."""
        return self.log.closed

    def exit_status(self) -> dict[str, Any] | None:
        """ACP's ``TerminalExitStatus``, or None while running."""
        if not self.finished:
            return None
        return {"exitCode": self.exit_code, "signal": self.signal}

    def output(self) -> dict[str, Any]:
        """ACP's ``terminal/output`` result."""
        out: dict[str, Any] = {
            "output": bytes(self._tail).decode("utf-8", "replace"),
            "truncated": self.truncated,
        }
        status = self.exit_status()
        if status is not None:
            out["exitStatus"] = status
        return out

    def wait(self) -> Deferred[None]:
        """Fires once it has exited and its output is read."""
        d: Deferred[None] = Deferred()
        if self.finished:
            d.callback(None)
        else:
            self._waiters.append(d)
        return d

    def kill(
        self, sig: int = signal.SIGTERM, grace: float = KILL_GRACE_SECONDS
    ) -> None:
        """Signal the tree; after TERM, KILL follows if it lingers."""
        if self.pid is None or self.state == "exited":
            return
        signal_tree(self.pid, sig)
        if sig == signal.SIGTERM and (
            self._kill_call is None or not self._kill_call.active()
        ):
            self._kill_call = self.reactor.callLater(grace, self._force)

    def _force(self) -> None:
        if self.pid is not None and self.state != "exited":
            signal_tree(self.pid, signal.SIGKILL)

    def describe(self) -> dict[str, Any]:
        """The ``agents_terminals`` entry."""
        return {
            "terminal_id": self.terminal_id,
            "command": self.command,
            "args": self.args,
            "cwd": self.cwd,
            "pid": self.pid,
            "state": self.state,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "truncated": self.truncated,
            "released": self.released,
            "tool_call_id": self.tool_call_id,
        }
