# -*- test-case-name: tests.agents.test_agents, tests.agents.test_process -*-
"""
An agent child: spawned in its own session, stdout framed into JSON-RPC,
stderr kept head and tail, and its whole tree ended on the way out.

Both the agent and its terminals run as an :class:`AgentChild`, the
daemon's one :class:`~sandboxd.processes.Child` (so a tree kill finds a
descendant that left with ``setsid``, and shutdown ends them) with one
rule of their own: what the leader started dies with it.  A dead agent
must never leave a caller waiting, so the exit is reported from
``processExited`` (the agent is gone even if a grandchild still holds
the pipes), every pending request fails at once, and what is left of the
tree is killed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from twisted.internet.defer import Deferred, succeed

from sandboxd.policy.confinement import Confinement
from sandboxd.policy.defaults import SECRET_MIN_CHARS
from sandboxd.processes.child import Child, OutputCallback
from sandboxd.processes.command import RunAs, signal_name
from sandboxd.processes.priority import CHILD_PRIORITY
from sandboxd.processes.run import spawn
from sandboxd.processes.table import ChildTable
from sandboxd.processes.tree import kill_tree, proc_info, reap_orphans
from sandboxd.waiters import Waiters


class Framer(Protocol):
    """What splits a child's stdout into messages (:mod:`sandboxd.jsonrpc`)."""

    def feed(self, data: bytes) -> None:
        """Take the next chunk of stdout."""

    def stop(self) -> None:
        """Ignore further input."""


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
        #: The values masked, longest first.
        self.secrets = sorted(
            {s for s in secrets if len(s) >= SECRET_MIN_CHARS}, key=len, reverse=True
        )

    def redact(self, text: str) -> str:
        """``text`` with every known secret value replaced."""
        for secret in self.secrets:
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


class AgentChild(Child):
    """
    A :class:`~sandboxd.processes.Child` whose tree goes with its leader.

    An agent's tools and a terminal's background jobs have no one left to
    answer to once the leader has exited, and a grandchild holding the
    pipes would keep them open: they are killed at once, before anyone
    hears of the exit.
    """

    def __init__(self, clock: Any, on_output: OutputCallback) -> None:
        super().__init__(clock, on_output)
        #: The leftovers' kill once the leader has exited (None before).
        self.leftovers: Deferred[None] | None = None
        # First in line on ``exited``, ahead of every listener.
        self.exited.addCallback(self._leader_exited)

    def _leader_exited(self, code: int | None) -> int | None:
        self.leftovers = self.kill_now()
        return code

    def kill_now(self) -> Deferred[None]:
        """
        KILL the whole tree without a grace period (a misbehaving agent, or
        the leftovers of an exited leader); fires once all are gone.

        Unlike :meth:`kill` this is not once-only: it escalates a polite
        kill already under way.  It sets no ``reason``, so output the
        leader wrote before exiting is still read.
        """
        killing = kill_tree(
            self.clock, self.pid, self.marker, 0.0, leader_reaped=self.has_exited
        )
        return killing.addBoth(lambda _: reap_orphans() and None)

    @property
    def exit_signal(self) -> str | None:
        """The name of the signal that ended the leader, if one did."""
        code = self.exit_code
        return signal_name(-code) if code is not None and code < 0 else None


class AgentProcess:
    """
    One agent child (or a language server), as its session drives it.

    :param framer: splits stdout into messages (lines for ACP,
        ``Content-Length`` frames for LSP).
    :param on_exit: ``(exit_code, signal_name)`` once the agent has exited.
    """

    def __init__(
        self,
        reactor: Any,
        children: ChildTable,
        stderr: HeadTailLog,
        framer: Framer,
        on_exit: Callable[[int | None, str | None], None],
    ) -> None:
        self.reactor = reactor
        self.children = children
        self.stderr = stderr
        self.framer = framer
        self.child = AgentChild(reactor, self._output)
        self.child.exited.addCallback(self._exited)
        self._on_exit = on_exit
        self._exit_waiters: Waiters[int | None] = Waiters()

    def spawn(
        self,
        executable: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        run_as: RunAs | None,
        confine: Confinement | None = None,
    ) -> None:
        """
        Start ``argv`` (``argv[0]`` resolved as ``executable``) with a stdin
        pipe, at the policy's ``agents_nice``: the user waits on the agent's
        every answer, so it does not queue behind the sandbox's own work.
        Under ``confine``, the agent and every tool it runs are confined.
        """
        with CHILD_PRIORITY.awaited():
            spawn(
                self.reactor,
                self.child,
                [executable, *argv[1:]],
                children=self.children,
                env=env,
                cwd=cwd,
                run_as=run_as,
                stdin_pipe=True,
                confine=confine,
            )

    @property
    def pid(self) -> int | None:
        """The agent's pid once spawned (kept after it exits)."""
        return self.child.pid or None

    @property
    def exited(self) -> bool:
        """Whether the agent has exited."""
        return self.child.has_exited

    @property
    def exit_code(self) -> int | None:
        """
        The exit status; None while running or when a signal ended the
        agent (:attr:`signal` names it), as every process of the API
        reports it.
        """
        code = self.child.exit_code
        return code if code is None or code >= 0 else None

    @property
    def signal(self) -> str | None:
        """The name of the signal that ended the agent, if one did."""
        return self.child.exit_signal

    def _output(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self.framer.feed(data)
        elif fd == 2:
            self.stderr.append(data)

    def _exited(self, code: int | None) -> int | None:
        self._exit_waiters.fire(self.exit_code)
        self._on_exit(self.exit_code, self.signal)
        return code

    def write(self, data: bytes) -> None:
        """Send bytes to the agent's stdin (dropped once it has exited)."""
        if not self.exited:
            self.child.write_stdin(data)

    def close_stdin(self) -> None:
        """ACP's polite shutdown: the agent sees EOF."""
        self.child.close_stdin()

    def wait_exit(self) -> Deferred[int | None]:
        """Fires with the exit code once the agent has exited."""
        if self.exited:
            return succeed(self.exit_code)
        return self._exit_waiters.wait()

    def wait_gone(self) -> Deferred[int | None]:
        """
        Fires with the exit code once the agent has exited and what it left
        behind is gone too (a stop that waits for it leaves no timer).
        """

        def after_leftovers(code: int | None) -> Deferred[int | None] | int | None:
            leftovers = self.child.leftovers
            if leftovers is None or leftovers.called:
                return code
            waiting: Deferred[int | None] = Deferred()
            leftovers.addBoth(lambda _: waiting.callback(code))
            return waiting

        return self.wait_exit().addCallback(after_leftovers)

    def terminate(self) -> Deferred[int | None]:
        """TERM the whole tree now, KILL it after the grace; fires at exit."""
        d = self.wait_exit()
        if not self.exited:
            self.child.kill()
        return d

    def kill(self) -> None:
        """KILL the whole tree at once."""
        self.child.kill_now()


def is_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting to be reaped does not)."""
    info = proc_info(pid)
    return info is not None and info.state not in ("Z", "X")
