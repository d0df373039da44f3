# -*- test-case-name: tests.test_running -*-
"""
Finding the running daemon for ``sandboxd reload`` when no pid is given.

The documented invocations (``twistd -n --pidfile= sandboxd``, ``sandboxd
serve``, the systemd unit, the container) write no pidfile, so ``reload``
looks for the daemon among this machine's processes: a ``twistd`` whose
arguments name the ``sandboxd`` plugin, or a ``sandboxd serve``.
"""

from __future__ import annotations

import os


def _is_daemon(argv: list[str]) -> bool:
    names = [os.path.basename(a) for a in argv[:3]]
    if "twistd" in names:
        return "sandboxd" in argv[1:]
    if "sandboxd" in names:
        i = names.index("sandboxd")
        return argv[i + 1 : i + 2] == ["serve"]
    return False


def command_of(pid: int, proc: str = "/proc") -> list[str] | None:
    """The arguments ``pid`` was started with; None when it does not run."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def is_daemon(pid: int, proc: str = "/proc") -> bool:
    """Whether ``pid`` is a running sandboxd daemon (``sandboxd reload`` checks, then signals)."""
    argv = command_of(pid, proc)
    return argv is not None and _is_daemon(argv)


def parent_of(pid: int, proc: str = "/proc") -> int | None:
    """The parent of ``pid``; None when it does not run."""
    try:
        with open(os.path.join(proc, str(pid), "stat"), "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces and parentheses.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def running_daemons(proc: str = "/proc") -> list[int]:
    """
    The pids of sandboxd daemons on this machine (not this process).

    A match that is the parent of another is a wrapper whose own argv
    names the daemon's (the container's ``tini -- sandboxd serve``), not
    a second daemon: it is left out.
    """
    found = []
    me = os.getpid()
    for name in os.listdir(proc):
        if not name.isdigit() or int(name) == me:
            continue
        if is_daemon(int(name), proc):
            found.append(int(name))
    wrappers = {parent_of(pid, proc) for pid in found}
    return sorted(pid for pid in found if pid not in wrappers)
