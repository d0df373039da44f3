# -*- test-case-name: tests.processes.test_children -*-
"""
Process trees, read from /proc: who belongs to a child's tree, how the
whole tree is ended, and how orphans the daemon adopts are reaped.

- :func:`kill_tree` ends a tree: TERM to the group and every descendant
  found in /proc (also one that left with ``setsid``, and one adopted by
  the daemon as child subreaper that still carries the tree's marker),
  then KILL to whatever is left after the grace period.
- :class:`OrphanReaper` reaps, by pid only, the orphans the daemon adopts
  as subreaper (or as PID 1); it never calls ``waitpid(-1)``, which would
  steal statuses from Twisted.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

from twisted.internet import process as _twisted_process
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from sandboxd.libc import libc
from sandboxd.policy.defaults import KILL_GRACE_SECONDS, ORPHAN_REAP_SECONDS
from sandboxd.processes import reaping
from sandboxd.turns import after_next_poll

log = Logger(namespace="sandboxd.processes.tree")

#: The environment name carrying a tree's marker.  Every process of the
#: tree inherits it, so a double-forked daemon adopted by the daemon (as
#: subreaper) is still recognised as part of the tree when it is killed.
TREE_MARKER = "SANDBOXD_PROCESS_TREE"

_T = TypeVar("_T")

#: Between a marker's instance and its own random part.
_MARKER_SEPARATOR = "."

#: How often a kill in progress looks for survivors (seconds, growing).
_KILL_POLLS = (0.01, 0.02, 0.05, 0.1, 0.2)

#: How long a tree kill keeps looking for an orphan caught mid-exec.
_SETTLE_SECONDS = 0.2

#: How old a /proc scan tree kills may share (see _RecentScan).
_SHARED_SCAN_SECONDS = 0.002

_PR_SET_CHILD_SUBREAPER = 36

#: How many times a walk looks again for orphans adopted while it walked.
_ORPHAN_ROUNDS = 4


class ProcInfo(NamedTuple):
    """
    What /proc/<pid>/stat says about one process.

    (A named tuple: a tree kill reads every process's line, several times,
    and building these is most of the Python cost of a scan.)
    """

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start: int


def proc_info(pid: int) -> ProcInfo | None:
    """One process's stat line, or None when it is gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        stat = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return ProcInfo(
            pid,
            int(fields[1]),
            int(fields[2]),
            int(fields[3]),
            fields[0].decode(),
            int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


@functools.cache
def _instance_of(pid: int) -> str:
    info = proc_info(pid)
    return f"{pid}-{info.start if info is not None else 0}"


def instance() -> str:
    """
    This daemon process's instance, ``PID-START``: a pid alone is reused,
    with its start time (clock ticks since boot) it names one process.
    """
    return _instance_of(os.getpid())


def marker_scope(base_dir: str) -> str:
    """
    The part of a daemon's markers that names what it serves (its base
    dir), so that a daemon ends only the strays of one that served the
    same (:mod:`sandboxd.processes.strays`).
    """
    return hashlib.sha256(os.fsencode(base_dir)).hexdigest()[:12]


def new_marker(scope: str = "") -> str:
    """
    A tree's marker, ``PID-START-SCOPE.RANDOM``: this daemon's instance and
    :func:`marker_scope`, then a random part, so that a process found
    carrying it says which daemon started its tree, whether that daemon
    still runs, and what it served.
    """
    return f"{instance()}-{scope}{_MARKER_SEPARATOR}{secrets.token_hex(8)}"


class MarkedBy(NamedTuple):
    """The daemon a marker names (:func:`new_marker`)."""

    pid: int
    start: int
    scope: str


def marked_by(environ: bytes) -> MarkedBy | None:
    """
    The daemon whose marker an environment block carries, or None (no
    marker, or one not in :func:`new_marker`'s form).
    """
    prefix = f"{TREE_MARKER}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            who = entry[len(prefix) :].partition(_MARKER_SEPARATOR.encode())[0]
            parts = who.split(b"-")
            if len(parts) != 3:
                return None
            try:
                return MarkedBy(int(parts[0]), int(parts[1]), parts[2].decode())
            except (ValueError, UnicodeDecodeError):
                return None
    return None


def proc_table() -> dict[int, ProcInfo]:
    """Every process visible in /proc."""
    table: dict[int, ProcInfo] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if name.isdigit():
            info = proc_info(int(name))
            if info is not None:
                table[info.pid] = info
    return table


def _children(pid: int) -> list[int]:
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


@functools.cache
def _children_files() -> bool:
    """Whether the kernel lists a thread's children (CONFIG_PROC_CHILDREN)."""
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


#: Set once the daemon is the child subreaper of its descendants.
_subreaper = False


def walkable() -> bool:
    """
    Whether a tree can be read by walking down from its leader and from the
    daemon's adopted orphans, instead of scanning every process.

    That holds when every process that leaves a tree by losing its parent
    is reparented to a tree member (one that is itself a subreaper) or to
    the daemon: when the daemon is the child subreaper of its descendants,
    or PID 1.  A process that joins a tree's session or group is always one
    of the leader's descendants (the leader started its own session), so
    nothing else can belong to it.
    """
    return (_subreaper or os.getpid() == 1) and _children_files()


def tree_table(leader: int, *others: int) -> dict[int, ProcInfo]:
    """
    The processes that can belong to ``leader``'s tree (and the trees of
    ``others``, in the same walk): the leader, the daemon's adopted
    orphans, and every descendant of either; every process when the tree
    cannot be walked (see :func:`walkable`).

    A walk costs a few reads per process of the tree; a scan costs them for
    every process on the machine, which the reactor pays before it reads
    the next request (docs/performance.md).
    """
    if not walkable():
        return proc_table()
    table: dict[int, ProcInfo] = {}

    def walk(stack: list[int]) -> None:
        while stack:
            pid = stack.pop()
            if pid in table:
                continue
            info = proc_info(pid)
            if info is not None:
                table[pid] = info
                stack.extend(_children(pid))

    # The tree first, the daemon's orphans after: a member whose parent
    # dies meanwhile moves from its parent's children to the daemon's, so
    # it is in one list or the other only when the parent's is read first
    # (the other way round, a grandchild reparented between the two reads
    # was in neither, and a signal 9 missed a setsid'd one on a fresh
    # daemon one time in five).  Its own subtree is walked when it turns
    # up among the orphans; a few rounds catch moves made during a round.
    walk([leader, *others])
    for _ in range(_ORPHAN_ROUNDS):
        new = [pid for pid in adopted_orphans() if pid not in table]
        if not new:
            break
        walk(new)
    return table


def environ_block(pid: int) -> bytes | None:
    """A process's environment block (empty while it execs), or None."""

    def read() -> bytes:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()

    return as_its_owner(pid, read)


def as_its_owner(pid: int, read: Callable[[], _T]) -> _T | None:
    """
    ``read()`` of what the kernel shows of process ``pid`` only to whom may
    trace it (its environment, its namespaces), or None where it cannot.

    A root daemon that lacks ``CAP_SYS_PTRACE`` (Docker's default
    capabilities, most Kubernetes security contexts) is refused these for
    a child running as another user; the kernel lets a reader whose
    file-system uid and gid are the process's have them, and switching
    those takes only ``CAP_SETUID``/``CAP_SETGID``, which a daemon that runs
    children as another user holds anyway.  They are this thread's own and
    put back at once.
    """
    try:
        return read()
    except PermissionError:
        pass
    except OSError:
        return None
    lib = libc()
    if lib is None or os.geteuid() != 0:
        return None
    try:
        owner = os.stat(f"/proc/{pid}")
    except OSError:
        return None
    old_gid = lib.setfsgid(owner.st_gid)
    old_uid = lib.setfsuid(owner.st_uid)
    try:
        return read()
    except OSError:
        return None
    finally:
        lib.setfsuid(old_uid)
        lib.setfsgid(old_gid)


def _has_marker(pid: int, marker: bytes) -> bool:
    return marker in (environ_block(pid) or b"").split(b"\0")


def command_line(pid: int) -> bytes | None:
    """A process's arguments, each ended by NUL (empty while it execs), or None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def _unmarked(pid: int) -> bool:
    """
    Whether a process carries no tree's marker at all: it (or a process it
    descends from) cleared its environment.  One in the middle of an exec,
    whose environment and command line both read empty for a moment, is
    not counted: it may carry a marker once the exec is done.
    """
    environ = environ_block(pid)
    if environ == b"":
        # Opened just before an exec and read just after, the block reads
        # empty too: a second read sees the new one.
        environ = environ_block(pid)
    if environ is None:
        return False
    if not environ:
        return bool(command_line(pid))
    prefix = f"{TREE_MARKER}=".encode()
    return not any(entry.startswith(prefix) for entry in environ.split(b"\0"))


#: Clock ticks since boot during which a tree's leader ran, ``(since,
#: until)``; ``until`` is None while it runs (see :func:`boot_ticks`).
Window = tuple[int, int | None]


def boot_ticks() -> int:
    """
    Now, in the unit and clock of ``/proc/PID/stat``'s start time (clock
    ticks of ``CLOCK_BOOTTIME``).
    """
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // reaping.TICK_NS


def _in_window(start: int, window: Window) -> bool:
    since, until = window
    return since <= start and (until is None or start <= until)


#: The adopted orphans known to descend from an adopted orphan that has
#: exited: pid -> (its start time, the start times of those lost
#: ancestors).  Only live children of the daemon are kept, so the table is
#: bounded by the processes it has adopted.
_LINEAGE: dict[int, tuple[int, frozenset[int]]] = {}


def note_lineage(orphans: Sequence[ProcInfo]) -> None:
    """
    Remember, from a look at every orphan the daemon adopted (zombies
    included), which of them descend from one that has exited.

    A double-fork daemon's last process starts after the command that
    started it has exited, and clears its environment: neither its start
    time nor its marker ties it to the command.  Its parent, the first
    fork, was adopted by the daemon and is gone by then; but the session
    (or group) it led lives on in the grandchild, and the number cannot be
    handed to another process while anything is in that session.  The
    parent's zombie stays in ``/proc`` until the daemon reaps it, and
    :func:`reap_orphans` looks here first, so the link is seen every time:
    an orphan in the session or group of a zombie orphan descends from it,
    and inherits its start time (and those it inherited) as its origins.
    """
    own_session = os.getsid(0)
    starts = {p.pid: p.start for p in orphans}
    for pid in [
        pid for pid, (start, _) in _LINEAGE.items() if starts.get(pid) != start
    ]:
        del _LINEAGE[pid]
    lost = {
        p.pid: p
        for p in orphans
        if p.state == "Z"
        and p.sid != own_session
        and not reaping.may_be_unadopted(p.pid, p.start)
    }
    if not lost:
        return
    # Oldest first: a lost parent's own origins are known before its
    # children take them.
    for p in sorted(orphans, key=lambda p: p.start):
        origins: set[int] = set()
        for leader in {p.sid, p.pgid} - {p.pid}:
            parent = lost.get(leader)
            if parent is not None and parent.start <= p.start:
                origins.add(parent.start)
                origins.update(lineage(parent.pid, parent.start))
        if origins:
            _LINEAGE[p.pid] = (p.start, lineage(p.pid, p.start) | origins)


def lineage(pid: int, start: int) -> frozenset[int]:
    """
    The start times of the exited adopted orphans ``pid`` (started at
    ``start``) descends from, as :func:`note_lineage` found them.
    """
    known = _LINEAGE.get(pid)
    return known[1] if known is not None and known[0] == start else frozenset()


def _adoptees(table: dict[int, ProcInfo]) -> list[ProcInfo]:
    """Every child of the daemon in ``table`` that Twisted did not spawn."""
    me = os.getpid()
    registered = _twisted_process.reapProcessHandlers
    return [p for p in table.values() if p.ppid == me and p.pid not in registered]


def _escapees(table: dict[int, ProcInfo], leader: int, window: Window) -> Iterator[int]:
    """
    Adopted orphans that carry no marker and started while the tree's
    leader ran, or descend from an adopted orphan that did (see
    :func:`note_lineage`): processes that left some tree (reparented to
    the daemon) and cleared their environment.  Nothing the kernel keeps
    says which tree they left, so each is counted in every tree that was
    running when it (or that ancestor) started.  A spawn in flight (whose
    child is not adopted yet) is not one of them, nor a child of the
    daemon in the daemon's own session (one it started some other way):
    every tree starts a session of its own, and nothing in it can join the
    daemon's.
    """
    own_session = os.getsid(0)
    note_lineage(_adoptees(table))
    for pid in _live_orphans(table, leader):
        start = table[pid].start
        if (
            (
                _in_window(start, window)
                or any(_in_window(o, window) for o in lineage(pid, start))
            )
            and table[pid].sid != own_session
            and not reaping.may_be_unadopted(pid, start)
            and _unmarked(pid)
        ):
            yield pid


def _live_orphans(table: dict[int, ProcInfo], leader: int) -> Iterator[int]:
    """Live children of the daemon that Twisted did not spawn, but ``leader``."""
    me = os.getpid()
    for p in table.values():
        if (
            p.ppid == me
            and p.pid != leader
            and p.state != "Z"
            and p.pid not in _twisted_process.reapProcessHandlers
        ):
            yield p.pid


def own_children() -> list[int]:
    """
    The daemon's direct children: from its threads' ``children`` files,
    or from a scan where the kernel keeps none.
    """
    me = os.getpid()
    if _children_files():
        return sorted(set(_children(me)))
    return sorted(p.pid for p in proc_table().values() if p.ppid == me)


def adopted_orphans() -> list[int]:
    """Children of the daemon that Twisted did not spawn (orphans it adopted)."""
    registered = _twisted_process.reapProcessHandlers
    return [pid for pid in own_children() if pid not in registered]


def tree_members(
    leader: int,
    marker: str | None,
    table: dict[int, ProcInfo] | None = None,
    by_id: bool = True,
    window: Window | None = None,
) -> dict[int, int]:
    """
    The live members of ``leader``'s tree as ``{pid: start time}``: its
    session and group, every descendant by parent link, and adopted
    orphans (with their descendants) that carry ``marker``; with
    ``window``, also the unmarked orphans that started within it
    (:func:`_escapees`).

    ``by_id=False`` says the number ``leader`` no longer names the tree
    (see :func:`kill_tree`): only the marked orphans and their descendants
    are members then, not whoever now has that pid, session or group.
    """
    table = tree_table(leader) if table is None else table
    found = {
        p.pid
        for p in table.values()
        if by_id
        and p.pid != leader
        and (p.sid == leader or p.pgid == leader)
        and p.state != "Z"
    }
    roots = {leader} if by_id else set()
    if marker is not None:
        needle = f"{TREE_MARKER}={marker}".encode()
        found.update(p for p in _live_orphans(table, leader) if _has_marker(p, needle))
    if window is not None:
        found.update(_escapees(table, leader, window))
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    stack = list(roots | found)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found and child != leader and table[child].state != "Z":
                found.add(child)
                stack.append(child)
    return {pid: table[pid].start for pid in found}


def _unreadable_orphans(
    table: dict[int, ProcInfo], leader: int, members: dict[int, int]
) -> bool:
    """
    Whether an adopted orphan outside ``members`` has an environment that
    reads empty, as one does while it execs: it may carry the marker a
    moment later.
    """
    return any(
        pid not in members and environ_block(pid) == b""
        for pid in _live_orphans(table, leader)
    )


def member_alive(pid: int, start: int) -> bool:
    """Whether ``pid`` still names the live process that started at ``start``."""
    info = proc_info(pid)
    return info is not None and info.start == start and info.state != "Z"


def never_signalled(target: int) -> bool:
    """
    Whether ``target``, as a pid or as a process group, must never be
    signalled: init, the daemon itself, or the daemon's own group.

    ``kill(0)`` and ``killpg(0)`` mean the caller's own group and
    ``killpg(1)`` means every process the caller may signal.  A daemon
    started by a runner that never called ``setsid`` (a CI job, a plain
    container entrypoint) sits in group 0 with everything else the runner
    started, so one stray 0 would kill the runner too.
    """
    return target <= 1 or target == os.getpid() or target == os.getpgrp()


def signal_member(pid: int, start: int | None, sig: int) -> None:
    if never_signalled(pid):
        return
    if start is not None and not member_alive(pid, start):
        return
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_group(pgid: int, sig: int) -> None:
    if never_signalled(pgid):
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------
# Killing trees and reaping orphans


class _RecentScan:
    """
    One ``/proc`` scan shared by tree kills that look within a few
    milliseconds of each other.

    A client that drops eight connections with commands in flight starts
    eight kills at once, and each used to scan every process at least twice
    (about a millisecond a scan) before the reactor could read the next
    request.  A recent scan is as good for each of them, because a tree
    found dead in it cannot come back: only a live member can start a new
    process.  A member the scan does not show may simply be younger than
    it, so :func:`kill_tree` asks ``/proc`` about it directly before
    counting it gone.
    """

    def __init__(self, max_age: float) -> None:
        self.max_age = max_age
        self._taken = -1.0
        self._table: dict[int, ProcInfo] = {}

    def table(self) -> dict[int, ProcInfo]:
        """A scan at most ``max_age`` seconds old."""
        now = time.monotonic()
        if now - self._taken > self.max_age:
            self._table = proc_table()
            self._taken = time.monotonic()
        return self._table


_RECENT_SCAN = _RecentScan(_SHARED_SCAN_SECONDS)


def _look(leader: int) -> dict[int, ProcInfo]:
    """What a tree kill looks at: a walk of the tree, else a shared scan."""
    return tree_table(leader) if walkable() else _RECENT_SCAN.table()


def _names_tree(
    table: dict[int, ProcInfo], leader: int, leader_start: int | None
) -> bool:
    """
    Whether the number ``leader`` still names the tree's session and group
    in ``table``: no other process has taken the pid (the leader's own
    entry, zombie included, has its start time), and the leader or some
    process of that session or group is there to hold the number.
    """
    holder = table.get(leader)
    if holder is not None:
        return leader_start is not None and holder.start == leader_start
    return any(p.pgid == leader or p.sid == leader for p in table.values())


def signal_leftovers(
    leader: int,
    marker: str | None,
    sig: int,
    done: frozenset[int] = frozenset(),
    window: Window | None = None,
) -> tuple[set[int], bool]:
    """
    Send ``sig`` to what a reaped leader's tree left running: its group
    while a member still holds the number, and every member found by
    ``marker`` (but those in ``done``, signalled already).  The members
    found, and whether an adopted orphan was in the middle of an exec (its
    environment reads empty, so it may carry the marker a moment later).
    With ``window``, the unmarked orphans that started while the leader
    ran are members too (:func:`tree_members`).
    """
    if never_signalled(leader):
        return set(), False
    table = _look(leader)
    by_id = _names_tree(table, leader, None)
    members = tree_members(leader, marker, table, by_id, window)
    if by_id and not done:
        signal_group(leader, sig)
    for pid, start in members.items():
        if pid not in done and not (by_id and not done and table[pid].pgid == leader):
            signal_member(pid, start, sig)
    return set(members), _unreadable_orphans(table, leader, members)


def leftovers(
    trees: Sequence[tuple[int, str | None, Window | None]],
) -> list[set[int]]:
    """
    What each reaped leader's tree left running, for ``(leader, marker,
    window)`` each, from one look at ``/proc`` shared by all (see
    :func:`signal_leftovers`, which signals the same members).
    """
    if not trees:
        return []
    leaders = [leader for leader, _, _ in trees]
    table = tree_table(*leaders) if walkable() else proc_table()
    found: list[set[int]] = []
    for leader, marker, window in trees:
        if never_signalled(leader):
            found.append(set())
            continue
        by_id = _names_tree(table, leader, None)
        found.append(set(tree_members(leader, marker, table, by_id, window)))
    return found


def kill_tree(
    clock: Any,
    leader: int,
    marker: str | None = None,
    grace: float = KILL_GRACE_SECONDS,
    leader_start: int | None = None,
    leader_reaped: bool = False,
    window: Window | None = None,
) -> Deferred[None]:
    """
    End ``leader``'s whole tree: TERM now, KILL to survivors after ``grace``.

    Members are remembered by (pid, start time) from the first look, so a
    grandchild that ignores TERM and is reparented when its parent dies is
    still killed, and a pid reused meanwhile is left alone.  Fires once no
    member is left (or shortly after the KILL).

    ``leader_reaped`` says the leader itself is gone: its pid is then not
    a member (it may name another process by now), only its group and
    marker are.

    The number ``leader`` names the tree's session and group only while
    something holds it: the leader (even a zombie), or a process still in
    that session or group.  Once nothing does, the kernel may hand it to a
    new process, whose children, session and group are strangers; from
    the first look that shows this, only the members already known and
    the marked orphans are signalled.

    ``window`` counts the unmarked orphans that started while the leader
    ran as members (:func:`tree_members`).
    """
    if never_signalled(leader):
        return succeed(None)
    done: Deferred[None] = Deferred()
    if leader_start is None and not leader_reaped:
        info = proc_info(leader)
        leader_start = info.start if info is not None else None
    first = _look(leader)
    by_id = _names_tree(first, leader, leader_start)
    state = {"polls": 0, "killed": False}
    members = tree_members(leader, marker, first, by_id, window)
    if leader_start is not None:
        members[leader] = leader_start
    deadline = clock.seconds() + grace
    settle_until = clock.seconds() + _SETTLE_SECONDS

    def signal_all(sig: int) -> None:
        if by_id:
            signal_group(leader, sig)
        for pid, start in list(members.items()):
            signal_member(pid, start, sig)

    def survivors() -> bool:
        nonlocal by_id
        table = _look(leader)
        by_id = by_id and _names_tree(table, leader, leader_start)
        for pid, start in list(members.items()):
            # Missing from the scan: gone, or younger than the scan.
            info = table.get(pid) or proc_info(pid)
            if info is None or info.start != start or info.state == "Z":
                del members[pid]
        # Members found late (an escapee whose environment could not be
        # read at the first look) get the signal of the current phase.
        late = {
            pid: start
            for pid, start in tree_members(leader, marker, table, by_id, window).items()
            if pid not in members
        }
        members.update(late)
        for pid, start in late.items():
            signal_member(
                pid, start, signal.SIGKILL if state["killed"] else signal.SIGTERM
            )
            signal_member(pid, start, signal.SIGCONT)
        group = by_id and any(
            p.pgid == leader and p.state != "Z" for p in table.values()
        )
        # An orphan in the middle of exec shows an empty environment: look
        # again shortly before saying the tree is gone.
        unsettled = (
            (marker is not None or window is not None)
            and clock.seconds() < settle_until
            and _unreadable_orphans(table, leader, members)
        )
        return bool(members) or group or unsettled

    def check() -> None:
        reap_orphans()
        if not survivors():
            done.callback(None)
            return
        now = clock.seconds()
        if state["killed"]:
            if now > deadline + 1.0:
                done.callback(None)
                return
        elif now >= deadline:
            state["killed"] = True
            signal_all(signal.SIGKILL)
        delay = _KILL_POLLS[min(state["polls"], len(_KILL_POLLS) - 1)]
        state["polls"] += 1
        if not state["killed"]:
            delay = min(delay, max(0.001, deadline - now))
        clock.callLater(delay, check)

    if grace <= 0:
        # KILL only: a TERM sent just before would be what a leader that
        # does not trap it dies of, and its exit code would say -15.
        state["killed"] = True
        signal_all(signal.SIGKILL)
    else:
        signal_all(signal.SIGTERM)
        signal_all(signal.SIGCONT)  # a stopped process cannot act on TERM
    KILLING.add(done)
    done.addBoth(_forget_killer, done)
    # Just after the signals most members are still there: the first look
    # waits for what the reactor has to read (sandboxd.turns).
    after_next_poll(clock, check)
    return done


#: Tree kills in progress (shutdown waits for them).
KILLING: set[Deferred[None]] = set()


def _forget_killer(result: Any, done: Deferred[None]) -> Any:
    KILLING.discard(done)
    return result


def reap_orphans() -> int:
    """
    Reap adopted orphans that have exited, by pid only; returns how many.

    Only children Twisted did not spawn are touched, so Twisted's own
    reaping (and ``processEnded``) is never disturbed: a child a worker
    thread has just started is not registered with Twisted yet and looks
    like an orphan, so a zombie that may be one is left for a later sweep
    (:func:`sandboxd.processes.reaping.may_be_unadopted`).
    """
    reaped = 0
    orphans = [info for info in map(proc_info, adopted_orphans()) if info is not None]
    # Before any is reaped: a zombie's session is how its adopted children
    # are known to descend from it (note_lineage).
    note_lineage(orphans)
    for info in orphans:
        pid = info.pid
        if info.state != "Z":
            continue
        if reaping.may_be_unadopted(pid, info.start):
            continue
        try:
            got, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if got:
            reaped += 1
    return reaped


def become_subreaper() -> bool:
    """
    Make the daemon the child subreaper of its descendants (Linux), so an
    orphan that escaped its group is reparented here, where it can be
    found, killed and reaped, instead of to init.
    """
    global _subreaper
    if not reaps_own_orphans():
        return False
    _subreaper = True
    return True


def reaps_own_orphans() -> bool:
    """
    Make the calling process the child subreaper of its own descendants
    (Linux; kept across ``execve``, not passed on to its children).  A
    terminal's shell calls it before it execs: a job that leaves with
    ``setsid`` and whose parent dies is then reparented to the shell, where
    a walk down from the shell still finds it, whatever it did to its
    environment.  Interactive shells reap whatever children they have.
    """
    prctl = getattr(libc(), "prctl", None)
    return prctl is not None and prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


class OrphanReaper:
    """Reaps adopted orphans now and then while the daemon runs."""

    def __init__(self, clock: Any, interval: float = ORPHAN_REAP_SECONDS) -> None:
        self._loop = LoopingCall(reap_orphans)
        self._loop.clock = clock
        self._interval = interval

    def start(self) -> None:
        """Start reaping (when the daemon is a subreaper or PID 1)."""
        if not self._loop.running:
            self._loop.start(self._interval, now=False).addErrback(
                lambda f: log.failure("orphan reaping failed", f)
            )

    def stop(self) -> None:
        """Stop reaping."""
        if self._loop.running:
            self._loop.stop()


def descendants(root: int, marker: str | None = None) -> list[int]:
    """
    The live members of ``root``'s tree, sorted: :func:`tree_members`
    (session, group, parent links and, with ``marker``, the adopted
    orphans carrying it), without their start times.
    """
    return sorted(tree_members(root, marker))


def signal_tree(pid: int, sig: int, marker: str | None = None) -> None:
    """
    Send ``sig`` to ``pid``'s process group and every descendant (see
    :func:`descendants` for what ``marker`` adds).
    """
    if never_signalled(pid):
        return
    targets = descendants(pid, marker)
    signal_group(pid, sig)
    for target in [pid, *targets]:
        signal_member(target, None, sig)
