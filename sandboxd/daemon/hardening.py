# -*- test-case-name: tests.test_hardening -*-
"""
What the daemon does to itself at start so that its children cannot read
its secrets out of ``/proc`` (security catalogue E11).

- The environment a process starts with stays readable as
  ``/proc/<pid>/environ`` for its whole life: ``os.environ.pop()`` changes
  Python's copy, not that block of memory.  A child that runs
  ``cat /proc/$PPID/environ`` would read ``ABX_SERVER_TOKEN``.  The values
  of the secret variables are overwritten in place (Python keeps its own
  copy, which reloads read).
- ``prctl(PR_SET_DUMPABLE, 0)``: the daemon's ``/proc/<pid>/environ``,
  ``mem`` and ``maps``, and ``ptrace`` on it, then need root
  (``CAP_SYS_PTRACE``), so a child running as the daemon's own non-root user
  cannot read its memory either.  Children are dumpable again after their
  ``exec``.  The price: a same-user ``py-spy`` or ``gdb`` needs root.

A child running as root can still read the daemon's memory; that is
documented in docs/security.md.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

from sandboxd.libc import libc

_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3

# Fields of /proc/self/stat (proc(5), counted from 1) that bound the
# startup environment block.
_ENV_START_FIELD = 50
_ENV_END_FIELD = 51


def _environ_block() -> tuple[int, bytes] | None:
    """The address of the startup environment block and its bytes."""
    try:
        with open("/proc/self/stat", "rb") as f:
            # Fields after the command name, which may hold spaces and ")".
            after = f.read().rsplit(b")", 1)[1].split()
        start = int(after[_ENV_START_FIELD - 3])
        end = int(after[_ENV_END_FIELD - 3])
        with open("/proc/self/environ", "rb") as f:
            block = f.read()
    except (OSError, IndexError, ValueError):
        return None
    if not start or len(block) != end - start:
        return None
    return start, block


def scrub_startup_environ(names: Iterable[str]) -> list[str]:
    """
    Overwrite with NULs the values of ``names`` in the startup environment
    block, so ``/proc/<pid>/environ`` no longer shows them; returns the
    names scrubbed.

    Each value is compared with the memory it is about to overwrite first;
    anything unexpected leaves that entry alone.
    """
    wanted = {os.fsencode(n) for n in names}
    found = _environ_block()
    if found is None or not wanted:
        return []
    start, block = found
    scrubbed: list[str] = []
    offset = 0
    for entry in block.split(b"\0"):
        name, eq, value = entry.partition(b"=")
        if eq and value and name in wanted:
            address = start + offset + len(name) + 1
            if ctypes.string_at(address, len(value)) == value:
                ctypes.memset(address, 0, len(value))
                scrubbed.append(os.fsdecode(name))
        offset += len(entry) + 1
    return scrubbed


def forbid_tracing() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)``; whether it took."""
    c = libc()
    prctl = getattr(c, "prctl", None)
    if prctl is None:
        return False
    return bool(prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)


def is_dumpable() -> bool:
    """``prctl(PR_GET_DUMPABLE)``: whether this process may be traced by its user."""
    prctl = getattr(libc(), "prctl", None)
    return prctl is None or bool(prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0))
