# -*- test-case-name: tests.processes.test_strays -*-
"""
Processes that a daemon killed outright left running.

An orderly stop ends every child the daemon started, with whatever those
started (docs/operations.md, "Shutdown").  A daemon killed outright
(``SIGKILL``, the OOM killer) cannot: its children, adopted by the
container's init, would run on with no daemon to list, signal or bound
them, and a supervisor that restarts the daemon again and again would pile
them up.  Every child's tree carries a marker in its environment that
starts with its daemon's instance and what it served
(:func:`~sandboxd.processes.tree.new_marker`), so a start finds the
processes of instances that no longer run and served the same base dir,
and their descendants, and ends them as the stop would have: ``SIGTERM``,
then ``SIGKILL`` after the grace.  Daemons serving other directories
(several on one host) leave each other's alone.

A process that cleared its environment (``env -i``) and is no longer below
a marked one cannot be told from anybody else's, and is left alone.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from sandboxd.policy.defaults import KILL_GRACE_SECONDS
from sandboxd.processes.tree import (
    ProcInfo,
    as_its_owner,
    command_line,
    environ_block,
    marked_by,
    member_alive,
    proc_table,
    signal_member,
)

#: How often the ending looks for those still running (seconds).
_POLL_SECONDS = 0.05


def _pid_namespace(pid: int) -> str | None:
    return as_its_owner(pid, lambda: os.readlink(f"/proc/{pid}/ns/pid"))


def strays(scope: str, table: dict[int, ProcInfo] | None = None) -> dict[int, int]:
    """
    The processes whose tree's daemon served ``scope`` and no longer runs,
    and their descendants, as ``{pid: start time}`` (a scan of every
    process).

    Only processes of this daemon's pid namespace count: a marker names
    its daemon by the pid it has in its own namespace, so one seen from a
    namespace above (a daemon on a host whose containers run daemons of
    their own) would name somebody else.
    """
    table = proc_table() if table is None else table
    me = os.getpid()
    namespace = _pid_namespace(me)
    found: set[int] = set()
    for p in table.values():
        if p.pid == me or p.state == "Z":
            continue
        who = marked_by(environ_block(p.pid) or b"")
        if who is None or who.scope != scope:
            continue
        if namespace is None or _pid_namespace(p.pid) != namespace:
            continue
        daemon = table.get(who.pid)
        if daemon is None or daemon.start != who.start:
            found.add(p.pid)
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    stack = list(found)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found and child != me and table[child].state != "Z":
                found.add(child)
                stack.append(child)
    return {pid: table[pid].start for pid in found}


def _signal(members: dict[int, int], sig: int) -> None:
    for pid, start in members.items():
        signal_member(pid, start, sig)  # never a reused pid


def _name(pid: int) -> str:
    argv = (command_line(pid) or b"").split(b"\0")
    return os.fsdecode(argv[0])[:64] or "?"


def end_strays(
    scope: str,
    grace: float = KILL_GRACE_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[tuple[int, str]]:
    """
    End the :func:`strays` of ``scope`` (blocking, up to ``grace`` and a little more):
    ``SIGTERM``, ``SIGKILL`` to those still running after ``grace``.

    :return: each one's pid and program, for the log.
    """
    found = strays(scope)
    if not found:
        return []
    ended = [(pid, _name(pid)) for pid in sorted(found)]
    _signal(found, signal.SIGTERM)
    deadline = clock() + grace
    while True:
        found = {pid: start for pid, start in found.items() if member_alive(pid, start)}
        if not found or clock() >= deadline:
            break
        sleep(_POLL_SECONDS)
    _signal(found, signal.SIGKILL)
    return ended
