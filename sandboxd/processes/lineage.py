# -*- test-case-name: tests.processes.test_tree_walk,tests.processes.test_priority -*-
"""
Who descends from whom, as the kernel lists it: each thread's
``/proc/PID/task/TID/children`` (``CONFIG_PROC_CHILDREN``).

Reading down from a process costs a few reads per member of its tree,
where finding the same members by their parent links costs a read of
every process on the machine; kernels built without the lists leave the
second way only (:func:`lists_children` says which).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable


@functools.cache
def lists_children() -> bool:
    """Whether the kernel lists a thread's children (``CONFIG_PROC_CHILDREN``)."""
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def children(pid: int) -> list[int]:
    """A process's children, from every thread's ``children`` file."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for task in tasks:
        try:
            fd = os.open(
                f"/proc/{pid}/task/{task}/children", os.O_RDONLY | os.O_CLOEXEC
            )
        except OSError:
            continue
        try:
            kids.extend(int(p) for p in os.read(fd, 1 << 16).split())
        except OSError:
            pass
        finally:
            os.close(fd)
    return kids


def each_descendant(leader: int, visit: Callable[[int], None]) -> None:
    """
    ``visit`` ``leader``, then each of its descendants, each before its
    own children are read: a process ``visit`` changes in a way its
    children inherit (a scheduling class, a priority) and that forks
    meanwhile has either forked before the read, and its child is
    visited, or after the change, and its child inherited it.  The leader
    alone where the kernel keeps no lists.
    """
    seen: set[int] = set()
    stack = [leader]
    walk = lists_children()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        visit(pid)
        if walk:
            stack.extend(children(pid))
