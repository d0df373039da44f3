# -*- test-case-name: tests.processes.test_children -*-
"""
Starting piped children and running them to completion: :func:`spawn`
starts a :class:`~sandboxd.processes.child.Child` in its own session,
:func:`run_collect` runs a command and collects its output under the
head-and-tail cap, and :func:`end_all` ends every tree at shutdown.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import CancelledError, Deferred, DeferredList

from sandboxd.policy.confinement import Confinement
from sandboxd.policy.defaults import (
    KILL_GRACE_SECONDS,
)
from sandboxd.processes.child import (
    DEFAULT_CAPTURE_BYTES,
    Child,
    HeadTail,
    share,
)
from sandboxd.processes.command import RunAs, find_executable
from sandboxd.processes.spawning import (
    spawn_anywhere,
    spawn_session,
    spawn_session_later,
)
from sandboxd.processes.table import ChildTable
from sandboxd.processes.tree import (
    KILLING,
    TREE_MARKER,
    adopted_orphans,
    kill_tree,
    new_marker,
    proc_info,
    reap_orphans,
)


def _env_has_chdir() -> bool:
    # coreutils >= 8.28 knows ``env -C DIR``; busybox's env does not.
    try:
        with open(ENV_PROGRAM, "rb") as f:
            return b"--chdir" in f.read()
    except OSError:
        return False


ENV_PROGRAM = "/usr/bin/env"
_ENV_CHDIR = _env_has_chdir()


def _spawn_in(
    reactor: Any,
    child: Child,
    args: list[str],
    env: dict[str, str],
    cwd: str,
    uid: int | None,
    gid: int | None,
    child_fds: dict[int, Any],
    confine: Confinement | None = None,
) -> None:
    """
    ``spawnProcess`` in ``cwd``, on a posix_spawn path when possible.

    :func:`~sandboxd.processes.spawning.spawn_session` starts a child in any
    directory with one ``posix_spawn`` where the C library allows
    (:mod:`sandboxd.spawn`).  Elsewhere Twisted forks (and runs Python in the child before exec) whenever
    ``path`` differs from the daemon's own working directory; that costs
    several times a posix_spawn.  So when the daemon has no other thread
    that could observe it, its working directory is moved to ``cwd`` just
    for the spawn; otherwise ``env -C`` changes directory in the child.
    (A user switch goes through ``setpriv``, see
    :class:`~sandboxd.processes.spawning.SessionProcess`.)  The daemon itself never
    resolves a relative path.
    """
    if not spawn_anywhere() and cwd != os.getcwd():
        if threading.active_count() == 1:
            previous = os.getcwd()
            os.chdir(cwd)
            try:
                spawn_session(
                    reactor,
                    child,
                    args[0],
                    args,
                    env,
                    cwd,
                    uid,
                    gid,
                    child_fds,
                    confine,
                )
            finally:
                os.chdir(previous)
            return
        if _ENV_CHDIR and uid is None:
            # (As another user, env would change directory after the switch,
            # where the user may not be allowed to: the fork path does it
            # before.)
            args = [ENV_PROGRAM, "-C", cwd, "--", *args]
            spawn_session(
                reactor, child, args[0], args, env, None, uid, gid, child_fds, confine
            )
            return
    spawn_session(reactor, child, args[0], args, env, cwd, uid, gid, child_fds, confine)


def held_directory(fd: int) -> str:
    """
    A ``cwd`` for :func:`spawn` that is the directory the daemon holds open
    at ``fd``, whatever its path names by the time the child starts.

    A path checked, then handed to a child as text, is looked up again by
    the child: a directory renamed away and a link put in its place in
    between sends the child elsewhere.  ``/proc/<daemon>/fd/N`` is a magic
    link: the kernel's lookup lands on the open directory itself, never on
    a name.  Every spawn path changes directory before the child switches
    user (posix_spawn's file actions run before ``setpriv`` is exec'd;
    Twisted's fork calls ``chdir`` before ``switchUID``; ``env -C`` is used
    only when no switch happens), so the lookup is made with the daemon's
    own credentials, which may read its own descriptors.  The caller keeps
    ``fd`` open until the child has started.
    """
    return f"/proc/{os.getpid()}/fd/{fd}"


@functools.cache
def _devnull() -> int:
    """
    One read-only ``/dev/null`` descriptor for the daemon's life: every
    child without a stdin pipe reads it (an open and a close fewer per
    command, and the same descriptor set for the spawn's cached actions).
    """
    return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)


def spawn(
    reactor: Any,
    child: Child,
    argv: list[str],
    *,
    children: ChildTable,
    env: dict[str, str],
    cwd: str,
    run_as: RunAs | None = None,
    stdin_pipe: bool = False,
    may_wait: bool = False,
    confine: Confinement | None = None,
) -> Child:
    """
    Start ``argv`` under ``child``, in its own session, as one of
    ``children`` (the daemon's table, whose shutdown ends it).

    With ``may_wait``, a caller that can wait for its child (see
    :meth:`Child.when_spawned`) lets the spawn happen on a worker thread
    while spawns are slow (:class:`~sandboxd.processes.spawning.SpawnTimes`), so the
    reactor keeps serving meanwhile; a failure of that spawn comes through
    ``when_spawned``.

    The executable is resolved against the child's PATH (never the
    daemon's) and passed absolute, so both of Twisted's spawn paths behave
    alike.

    :raises FileNotFoundError: no such executable.
    :raises OSError: the spawn itself failed.
    """
    child.table = children
    if not argv:
        raise FileNotFoundError("empty command")
    env = dict(env)
    if run_as is not None:
        run_as.apply(env)
    executable = find_executable(argv[0], env)
    if executable is None:
        raise FileNotFoundError(f"command not found: {argv[0]}")
    child.marker = new_marker(children.scope)
    env[TREE_MARKER] = child.marker
    args = [executable, *argv[1:]]
    child_fds: dict[int, Any] = {1: "r", 2: "r", 0: "w" if stdin_pipe else _devnull()}
    uid = gid = None
    if run_as is not None and os.geteuid() == 0:
        uid, gid = run_as.uid, run_as.gid
    if may_wait:
        later = spawn_session_later(
            reactor, child, args[0], args, env, cwd, uid, gid, child_fds, confine
        )
        if later is not None:
            child.spawning(later, stdin_pipe)
            return child
    _spawn_in(reactor, child, args, env, cwd, uid, gid, child_fds, confine)
    child.stdin_open = stdin_pipe
    child.started()
    return child


# --------------------------------------------------------------------------
# Run to completion


@attrs.define
class RunResult:
    """What :func:`run_collect` gathered."""

    stdout: bytes
    stderr: bytes
    exit_code: int | None
    timed_out: bool
    idle_timed_out: bool
    truncated: bool
    dropped_bytes: int
    duration_ms: float


def _after(d: Deferred[Any]) -> Deferred[None]:
    """A Deferred that fires once ``d`` has, leaving ``d``'s own result alone."""
    after: Deferred[None] = Deferred()

    def fire(result: Any) -> Any:
        after.callback(None)
        return result

    d.addBoth(fire)
    return after


async def run_collect(
    reactor: Any,
    argv: list[str],
    *,
    children: ChildTable,
    env: dict[str, str],
    cwd: str,
    timeout: float | None,
    max_output_bytes: int,
    idle_timeout: float | None = None,
    run_as: RunAs | None = None,
    stdin: bytes | None = None,
    observe: Callable[[int, bytes], None] | None = None,
    on_spawned: Callable[[Child], None] | None = None,
    confine: Confinement | None = None,
    max_total_bytes: int | None = None,
) -> RunResult:
    """
    Run ``argv`` to completion and collect its output.

    Each stream keeps its head and tail within ``max_output_bytes``.  Past
    ``timeout`` (or ``idle_timeout`` seconds without output) the whole tree
    is ended and the result says so.  Cancelling the awaiting Deferred ends
    the tree too.

    :param observe: also sees every chunk of output as it comes (git's
        progress), before the cap applies.
    :param on_spawned: called with the child once it runs (its pid known),
        for callers that must recognise the tree or end it themselves.
    :param max_total_bytes: what both streams may keep together (a door
        whose answer has a size limit): past it, each keeps its head and
        tail within its share.
    :raises FileNotFoundError: the executable is not on the child's PATH.
    """
    cap = DEFAULT_CAPTURE_BYTES if max_output_bytes is None else max_output_bytes
    out, err = HeadTail(cap), HeadTail(cap)
    sinks = {1: out, 2: err}

    def on_output(fd: int, data: bytes) -> None:
        sink = sinks.get(fd)
        if sink is not None:
            sink.write(data)
        if observe is not None:
            observe(fd, data)

    child = Child(
        reactor,
        on_output,
        timeout=timeout,
        idle_timeout=idle_timeout,
        claims_escapees=True,
    )
    began = time.monotonic()
    spawn(
        reactor,
        child,
        argv,
        children=children,
        env=env,
        cwd=cwd,
        run_as=run_as,
        stdin_pipe=stdin is not None,
        may_wait=True,
        confine=confine,
    )
    if child.pending:
        try:
            await child.when_spawned()
        except CancelledError:
            child.kill("cancelled")
            raise
    if on_spawned is not None:
        on_spawned(child)
    if stdin is not None:
        if stdin:
            child.write_stdin(stdin)
        child.close_stdin()

    def cancel(_: Deferred[Any]) -> None:
        child.kill("cancelled")

    waiting: Deferred[int | None] = Deferred(cancel)

    def finished(code: int | None) -> None:
        if not waiting.called:
            waiting.callback(code)

    child.ended.addCallback(finished)
    try:
        code = await waiting
    except CancelledError:
        child.kill("cancelled")
        raise
    if child.killing is not None:
        # The answer promises the tree is gone: wait for the kill to finish
        # (it also leaves no timer running behind the call).
        await _after(child.killing)
    if max_total_bytes is not None:
        share([out, err], max_total_bytes)
    return RunResult(
        stdout=out.value(),
        stderr=err.value(),
        exit_code=code,
        timed_out=child.reason == "timeout",
        idle_timed_out=child.reason == "idle_timeout",
        truncated=out.truncated or err.truncated,
        dropped_bytes=out.dropped_bytes + err.dropped_bytes,
        duration_ms=(time.monotonic() - began) * 1000.0,
    )


def end_all(
    clock: Any, children: ChildTable, grace: float = KILL_GRACE_SECONDS
) -> Deferred[Any]:
    """
    End every tree of ``children`` and every adopted orphan; fires when all
    are gone (the caller bounds the wait).
    """
    waits: list[Deferred[Any]] = []
    for child in list(children.live | children.pending):
        child.grace = min(child.grace, grace)
        waits.append(child.kill("shutdown"))
        if not child.has_ended:
            waits.append(child.ended)
    for pid in adopted_orphans():
        info = proc_info(pid)
        if info is not None and info.state != "Z":
            waits.append(kill_tree(clock, pid, None, grace, info.start))
    waits.extend(KILLING)
    reap_orphans()
    return DeferredList(waits, consumeErrors=True)
