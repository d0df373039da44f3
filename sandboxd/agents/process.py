# -*- test-case-name: tests.test_agents -*-
"""
An agent child: spawned in its own session, stdout framed into JSON-RPC,
stderr kept head and tail, and its whole tree ended on the way out.

A dead agent must never leave a caller waiting, so the exit is reported
from ``processExited`` (the agent is gone even if a grandchild still holds
the pipes), every pending request fails at once, and what is left of the
tree is killed.
"""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

from sandboxd.agents.jsonrpc import LineFramer
from sandboxd.children import exit_code, signal_name, spawn_session
from sandboxd.policy.defaults import KILL_GRACE_SECONDS
from sandboxd.proctree import signal_tree


class HeadTailLog:
    """
    The agent's stderr: the first half of the budget kept as it came, then
    the latest chunks, numbered by ``seq``; secrets replaced before storing.
    """

    def __init__(self, max_bytes: int, secrets: Iterable[str] = ()) -> None:
        self.max_bytes = max_bytes
        self._head: list[tuple[int, str]] = []
        self._head_bytes = 0
        self._tail: deque[tuple[int, str]] = deque()
        self._tail_bytes = 0
        self.dropped_bytes = 0
        self.last_seq = 0
        self._secrets = sorted(
            {s for s in secrets if len(s) >= 4}, key=len, reverse=True
        )

    def redact(self, text: str) -> str:
        """``text`` with every known secret value replaced."""
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        return text

    def append(self, data: bytes) -> None:
        """Keep one chunk of stderr."""
        text = self.redact(data.decode("utf-8", "replace"))
        self.last_seq += 1
        size = len(text.encode())
        half = self.max_bytes // 2
        if self._head_bytes + size <= half and not self._tail:
            self._head.append((self.last_seq, text))
            self._head_bytes += size
            return
        self._tail.append((self.last_seq, text))
        self._tail_bytes += size
        while self._tail_bytes > half and len(self._tail) > 1:
            _, old = self._tail.popleft()
            self._tail_bytes -= len(old.encode())
            self.dropped_bytes += len(old.encode())

    def chunks(self, after: int = 0) -> list[dict[str, Any]]:
        """The kept chunks with ``seq > after``."""
        return [
            {"seq": s, "data": d} for s, d in [*self._head, *self._tail] if s > after
        ]

    def tail_text(self, limit: int = 4096) -> str:
        """The last ``limit`` characters, for errors and ``agent.exited``."""
        text = "".join(d for _, d in [*self._head, *self._tail])
        return text[-limit:]


class AgentProcess(ProcessProtocol):
    """
    The ProcessProtocol of one agent child.

    :param on_line: each complete stdout line.
    :param on_overflow: a stdout line went over ``max_message_bytes``.
    :param on_exit: ``(exit_code, signal_name)`` once the agent has exited.
    """

    def __init__(
        self,
        reactor: Any,
        max_message_bytes: int,
        stderr: HeadTailLog,
        on_line: Callable[[bytes], None],
        on_overflow: Callable[[int], None],
        on_exit: Callable[[int | None, str | None], None],
    ) -> None:
        self.reactor = reactor
        self.stderr = stderr
        self.framer = LineFramer(max_message_bytes, on_line, on_overflow)
        self._on_exit = on_exit
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.signal: str | None = None
        self.exited = False
        self.ended: Deferred[None] = Deferred()
        self._exit_waiters: list[Deferred[int | None]] = []
        self._kill_call: Any = None
        self._drop_call: Any = None

    @classmethod
    def spawn(
        cls,
        reactor: Any,
        protocol: AgentProcess,
        executable: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        uid: int | None = None,
        gid: int | None = None,
    ) -> AgentProcess:
        """Start ``argv`` (``argv[0]`` already resolved) in its own session."""
        full = [executable, *argv[1:]]
        spawn_session(reactor, protocol, executable, full, env, cwd, uid, gid)
        return protocol

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.pid = self.transport.pid

    def outReceived(self, data: bytes) -> None:
        self.framer.feed(data)

    def errReceived(self, data: bytes) -> None:
        self.stderr.append(data)

    def write(self, data: bytes) -> None:
        """Send bytes to the agent's stdin (dropped once it has exited)."""
        if not self.exited and self.transport is not None:
            self.transport.write(data)

    def close_stdin(self) -> None:
        """ACP's polite shutdown: the agent sees EOF."""
        if not self.exited and self.transport is not None:
            self.transport.closeStdin()

    def processExited(self, reason: Failure) -> None:
        self.exited = True
        code = exit_code(reason)
        if code is not None and code < 0:
            self.signal = signal_name(-code)
        self.exit_code = code
        # What the agent started dies with it; a grandchild holding the
        # pipes would otherwise keep processEnded (and the caller) waiting.
        if self.pid is not None:
            signal_tree(self.pid, signal.SIGKILL)
        self._drop_call = self.reactor.callLater(0.5, self._drop_pipes)
        if self._kill_call is not None and self._kill_call.active():
            self._kill_call.cancel()
        waiters, self._exit_waiters = self._exit_waiters, []
        for d in waiters:
            d.callback(code)
        self._on_exit(code, self.signal)

    def _drop_pipes(self) -> None:
        if self.transport is not None:
            try:
                self.transport.loseConnection()
            except Exception:
                pass

    def processEnded(self, reason: Failure) -> None:
        if not self.exited:
            self.processExited(reason)
        if self._drop_call is not None and self._drop_call.active():
            self._drop_call.cancel()
        if not self.ended.called:
            self.ended.callback(None)

    def wait_exit(self) -> Deferred[int | None]:
        """Fires with the exit code once the agent has exited."""
        d: Deferred[int | None] = Deferred()
        if self.exited:
            d.callback(self.exit_code)
        else:
            self._exit_waiters.append(d)
        return d

    def terminate(self, grace: float = KILL_GRACE_SECONDS) -> Deferred[int | None]:
        """TERM the whole tree now, KILL it after ``grace``; fires at exit."""
        d = self.wait_exit()
        if self.exited or self.pid is None:
            return d
        signal_tree(self.pid, signal.SIGTERM)
        if self._kill_call is None or not self._kill_call.active():
            self._kill_call = self.reactor.callLater(grace, self.kill)
        return d

    def kill(self) -> None:
        """KILL the whole tree at once."""
        if self.pid is None:
            return
        signal_tree(self.pid, signal.SIGKILL)
        if not self.exited and self.transport is not None:
            try:
                self.transport.signalProcess("KILL")
            except (ProcessExitedAlready, OSError):
                pass


def is_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")
