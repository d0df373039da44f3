# -*- test-case-name: tests.agents.test_agents, tests.agents.test_process -*-
"""
The agent's own commands (ACP ``terminal/*``), run like any other child
(SPEC §7.4: own session, guarded cwd, scrubbed environment, allow/deny
lists) with two views of the output: the bounded tail ACP's
``terminal/output`` returns (truncated from the start, on a UTF-8
boundary), and an :class:`~sandboxd.eventlog.EventLog` that HTTP callers
read and follow with the ``process_output`` contract.  The session's
part, the ``terminal/*`` handlers, is
:class:`~sandboxd.agents.terminalrequests.TerminalRequests`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from signal import SIGTERM
from typing import Any

from twisted.internet.defer import Deferred, succeed

from sandboxd.agents.process import AgentChild
from sandboxd.eventlog import EventLog
from sandboxd.policy.confinement import Confinement
from sandboxd.processes.child import STREAM_NAMES, signal_child
from sandboxd.processes.command import RunAs
from sandboxd.processes.run import spawn
from sandboxd.processes.table import ChildTable
from sandboxd.waiters import Waiters


def utf8_tail(data: bytes, limit: int) -> bytes:
    """The last ``limit`` bytes of ``data``, starting on a character boundary."""
    if len(data) <= limit:
        return data
    cut = data[len(data) - limit :]
    skip = 0
    while skip < len(cut) and skip < 4 and (cut[skip] & 0xC0) == 0x80:
        skip += 1
    return cut[skip:]


class AgentTerminal:
    """One ``terminal/create`` command, run as an :class:`AgentChild`."""

    def __init__(
        self,
        reactor: Any,
        children: ChildTable,
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
        self.children = children
        self.terminal_id = terminal_id
        self.command = command
        self.args = args
        self.cwd = cwd
        self.output_limit = output_limit
        self.tool_call_id = tool_call_id
        self.log = EventLog(log_bytes)
        self.released = False
        self.truncated = False
        self.started_at = time.time()
        self._tail = bytearray()
        self._on_exit = on_exit
        self._waiters: Waiters[None] = Waiters()
        self.child = AgentChild(reactor, self._output)
        self.child.ended.addCallback(self._finish)

    def start(
        self,
        executable: str,
        env: dict[str, str],
        run_as: RunAs | None,
        confine: Confinement | None = None,
    ) -> None:
        """Spawn it in its own session, stdin at ``/dev/null``, under ``confine``."""
        argv = [executable, *self.args]
        spawn(
            self.reactor,
            self.child,
            argv,
            children=self.children,
            env=env,
            cwd=self.cwd,
            run_as=run_as,
            confine=confine,
        )

    @property
    def pid(self) -> int | None:
        """The command's pid once spawned (kept after it exits)."""
        return self.child.pid or None

    @property
    def state(self) -> str:
        """``running`` or ``exited``."""
        return "exited" if self.child.has_exited else "running"

    @property
    def exit_code(self) -> int | None:
        """ACP's ``exitCode``: the status, None while running or if signalled."""
        code = self.child.exit_code
        return None if code is None or code < 0 else code

    @property
    def signal(self) -> str | None:
        """ACP's ``signal``: the name of the signal that ended it, if one did."""
        return self.child.exit_signal

    def _output(self, fd: int, data: bytes) -> None:
        self._tail += data
        if len(self._tail) > self.output_limit:
            self._tail = bytearray(utf8_tail(bytes(self._tail), self.output_limit))
            self.truncated = True
        stream = STREAM_NAMES.get(fd)
        if stream is not None and not self.log.closed:
            self.log.append(stream, {"data": data.decode("utf-8", "replace")})

    def _finish(self, code: int | None) -> None:
        """Exited and the pipes closed: the ``exit`` event, then the listeners."""
        self.log.append("exit", {"exit_code": code})
        self.log.close()
        self._waiters.fire(None)
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
        if self.finished:
            return succeed(None)
        return self._waiters.wait()

    def kill(self, sig: int = SIGTERM) -> None:
        """Signal the tree; TERM ends it, with KILL after the grace period."""
        if self.child.has_exited:
            return
        if sig == SIGTERM:
            self.child.kill()
        else:
            signal_child(self.child, sig)

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
