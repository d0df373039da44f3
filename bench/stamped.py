#!/usr/bin/env python3
"""
Run ``twistd`` with the steps of a ``/shell/stream`` stamped: where one
stream's first event spends its time, read sample by sample
(``bench/stream_stamps.py`` drives it).

    python bench/stamped.py OUT PROGRAM [ARGS...]

Each step is wrapped to note ``(time.perf_counter(), step, detail,
thread)`` in a list (``perf_counter`` is ``CLOCK_MONOTONIC``, the client's
clock too): connections accepted and lost, the reactor's polls and timed
calls, ``epoll_wait``, the handler's spawn, ``posix_spawn`` on whichever thread, the hand-off
to a spawn thread and back, the child's adoption, each read of a child's
pipe, the first output, the stream's headers and event writes, tree kills,
and every run of the cyclic garbage collector (with its generation).
``SIGUSR2`` writes the notes taken so far to ``OUT`` as JSON lines and
empties the list (the handler runs on the reactor's thread between two
bytecodes).  The wrappers cost microseconds a step: compare stamped
daemons with each other, not with unstamped ones.
"""

from __future__ import annotations

import functools
import gc
import json
import runpy
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

NOTES: list[tuple[float, str, Any, str]] = []
_clock = time.perf_counter


def note(step: str, detail: Any = None) -> None:
    NOTES.append((_clock(), step, detail, threading.current_thread().name))


def around(
    owner: Any,
    name: str,
    step: str,
    detail: Callable[..., Any] | None = None,
    after: bool = True,
    result: bool = False,
) -> None:
    """
    ``owner.name`` noting ``step`` (``step+`` at its end with ``after``,
    with what it returned as the detail with ``result``).
    """
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        note(step, detail(*args, **kwargs) if detail is not None else None)
        got = None
        try:
            got = original(*args, **kwargs)
        finally:
            if after:
                note(step + "+", got if result else None)
        return got

    setattr(owner, name, wrapper)


def _peer_port(channel: Any, *_: Any) -> Any:
    peer = getattr(channel, "_peer", None)
    return getattr(peer, "port", None)


def _pid(proc: Any) -> Any:
    return getattr(proc, "leader", None) or getattr(proc, "pid", None)


class _Poller:
    """The reactor's ``epoll`` object, its waits noted (``wait``, ``wait+``)."""

    def __init__(self, poller: Any) -> None:
        self._poller = poller

    def poll(self, *args: Any) -> Any:
        note("wait")
        try:
            return self._poller.poll(*args)
        finally:
            note("wait+")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._poller, name)


def _collected(phase: str, info: dict[str, int]) -> None:
    """The collector's runs, noted as ``gc`` and ``gc+`` with their generation."""
    note("gc" if phase == "start" else "gc+", info["generation"])


def _labelled(module: Any, label: str) -> None:
    """``module.after_next_poll``'s calls noted as ``label`` when they run."""
    original = module.after_next_poll

    def after_next_poll(clock: Any, f: Callable[[], object]) -> None:
        def run() -> object:
            note(label)
            try:
                return f()
            finally:
                note(label + "+")

        original(clock, run)

    module.after_next_poll = after_next_poll


def install() -> None:
    """The wrappers, on the modules a ``/shell/stream`` goes through."""
    from twisted.internet import reactor

    from sandboxd.processes import child, posix_spawn, spawning, tree
    from sandboxd.processes.priority import CHILD_PRIORITY
    from sandboxd.routes import process as routes_process
    from sandboxd.web import channel, dispatch, sse

    def made(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(self: Any) -> Any:
            result = original(self)
            note("accept", _peer_port(self))
            return result

        return wrapper

    channel.SandboxChannel.connectionMade = made(  # type: ignore[method-assign]
        channel.SandboxChannel.connectionMade
    )
    around(channel.SandboxChannel, "connectionLost", "lost", _peer_port)
    around(routes_process, "spawn", "spawn_called")
    around(routes_process, "shell_stream", "handler", after=False)
    routes_process.HANDLERS["shell_stream"] = routes_process.shell_stream
    around(posix_spawn, "posix_spawn", "posix_spawn", result=True)
    around(posix_spawn, "posix_spawn_alone", "posix_spawn", result=True)
    around(spawning.SPAWN_THREADS_POOL, "run", "queued", after=False)
    around(
        spawning.AdoptedProcess,
        "__init__",
        "adopted",
        lambda self, reactor, pid, *_a, **_k: pid,
    )
    around(
        spawning._OutputReader,
        "doRead",
        "read",
        lambda self: (_pid(self.proc), self.name),
    )
    around(CHILD_PRIORITY, "first_output", "first_output", lambda pid: pid)
    around(sse.SSEChannel, "__init__", "headers")
    around(sse.SSEChannel, "write_raw", "write")
    around(child, "kill_tree", "kill_tree", lambda clock, pid, *_a, **_k: pid)
    killed = child.Child.kill

    @functools.wraps(killed)
    def kill(self: Any, *args: Any, **kwargs: Any) -> Any:
        pending = self.pending
        result = killed(self, *args, **kwargs)
        if pending:
            note("kill_pending", self.has_ended)
        return result

    child.Child.kill = kill  # type: ignore[method-assign]
    _labelled(dispatch, "cancel")
    _labelled(tree, "tree_look")
    gc.callbacks.append(_collected)
    around(reactor, "doIteration", "turn", lambda delay: delay)
    around(reactor, "runUntilCurrent", "timers")
    reactor._poller = _Poller(reactor._poller)  # type: ignore[attr-defined]


def main() -> None:
    out, program = sys.argv[1], sys.argv[2]

    def dump(_signum: int, _frame: FrameType | None) -> None:
        notes = NOTES[:]
        del NOTES[:]
        with open(out, "a") as f:
            for row in notes:
                f.write(json.dumps(row) + "\n")
            f.write(json.dumps([_clock(), "dumped", None, "MainThread"]) + "\n")

    signal.signal(signal.SIGUSR2, dump)
    # The daemon's modules are imported by twistd's plugin; the reactor is
    # installed once the plugin has been read: stamp from the first poll.
    from twisted.internet import epollreactor

    epollreactor.install()
    install()
    sys.argv = sys.argv[2:]
    runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main()
