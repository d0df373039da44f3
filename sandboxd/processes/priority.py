# -*- test-case-name: tests.processes.test_priority -*-
"""
The control plane stays responsive while the sandbox is busy: the
daemon's CPU, I/O and memory priority above its children's.

An agent's build or test run, started through the daemon, keeps every
core and the disk busy; the agent's next call still has to be answered
at once.  As envd does for its sandboxes, the daemon:

- starts every child at a lower CPU priority (``nice``), a low best-effort
  I/O priority (``ioprio``), and a higher ``oom_score_adj`` than its own;
- when it may (root), raises its own CPU priority and lowers its own
  ``oom_score_adj``, so the kernel kills a runaway build before it.

With the kernel's autogroup scheduling (most distributions' default), a
child that leads its own session is also a scheduling group of its own,
whose weight is the group's nice value, not the task's: the daemon sets
that too (``/proc/PID/autogroup``), for the child's whole session.  A
group weighs the same whatever it holds, so n busy sessions weigh n
groups: with many children alive each one's group is lighter
(:func:`group_nice_for`), so that on the daemon's CPU they never
outweigh the daemon's one group.  While some children are still starting
(nothing printed yet), a stream's child that has printed its first line
waits at the lightest weight (:meth:`ChildPriority.first_output`): with
many streams started at once, the shells not yet started go first.

A child gets its priorities before it execs: the spawning thread takes
the child's nice value and I/O priority (both are per thread on Linux and
inherited by a new task) and the process takes the child's
``oom_score_adj`` for the duration of the spawn, then both go back.  A
child that forks in its first instructions therefore cannot leave a
grandchild at the daemon's priority.  Where the daemon cannot raise its
thread's priority back (not root and no ``RLIMIT_NICE`` room), the
child's nice value is set by its pid just after the spawn instead.

All of it is policy (``priority`` in the policy document); see
docs/operations.md.
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.threadable import isInIOThread

from sandboxd.policy.defaults import (
    CHILD_STARTING_GRACE_SECONDS,
    CHILD_STARTING_SECONDS,
    CHILD_UNSTARTED_CPU_MS,
)
from sandboxd.policy.priorities import Priorities
from sandboxd.processes.cgroups import place_child

log = Logger()

# ioprio_set(2): who, classes, and the system call's number per machine.
_IOPRIO_WHO_PROCESS = 1
_IOPRIO_CLASS_BE = 2
_IOPRIO_CLASS_SHIFT = 13
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "i686": 289, "armv7l": 314}
_IOPRIO_GET = {"x86_64": 252, "aarch64": 31, "i686": 290, "armv7l": 315}


_MACHINE = os.uname().machine

#: The lightest nice value, of a group or a task.
LIGHTEST = 19

#: How often, and how many times, a child's session group is looked for
#: again when the child has not called ``setsid`` yet (the fork path does
#: it in the child, after the fork has returned in the daemon).
LEADER_RETRY_SECONDS = 0.002
LEADER_TRIES = 250

#: When a child's process group is given its nice value once more, where
#: the daemon gives it by pid: a process whose fork was under way at the
#: first call copied its parent's value from before and joined the group
#: after the kernel had gone through it.
GROUP_AGAIN_SECONDS = 0.01

#: The scheduler's weight of each nice value, -20 to 19 (the kernel's
#: ``sched_prio_to_weight``).
_WEIGHTS = (
    *(88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916),
    *(9548, 7620, 6100, 4904, 3906, 3121, 2501, 1991, 1586, 1277),
    *(1024, 820, 655, 526, 423, 335, 272, 215, 172, 137),
    *(110, 87, 70, 56, 45, 36, 29, 23, 18, 15),
)


def weight(nice: int) -> int:
    """The scheduler's weight of a task or group at ``nice``."""
    return _WEIGHTS[min(max(nice, -20), 19) + 20]


def _cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def group_nice_for(base: int, budget: int, alive: int) -> int:
    """
    The nice value, ``base`` or above, at which ``alive`` session groups
    together weigh at most ``budget`` (the daemon's own group, once per
    CPU); 19, the lightest, when none does.
    """
    for nice in range(max(base, 0), 20):
        if alive * weight(nice) <= budget:
            return nice
    return 19


@functools.cache
def holding_gil(name: str) -> Any:
    """
    The C library's ``name`` called with the interpreter lock held (a
    ``PyDLL`` function), or None.

    A ``CDLL`` function, like ``os.pread`` and ``os.pwrite``, lets go of
    the lock for the call and takes it back after: on a spawn worker each
    such call then waited for the reactor to hand the lock back, for a
    system call on a ``/proc`` value that never blocks.
    """
    try:
        return getattr(ctypes.PyDLL(None), name)
    except (OSError, AttributeError):
        return None


def _syscall(table: Mapping[str, int], *args: int) -> int:
    """One ioprio system call; -1 where this machine's number is unknown."""
    number = table.get(_MACHINE)
    call = holding_gil("syscall")
    if number is None or call is None:
        return -1
    return int(call(number, *args))


def ioprio_of(pid: int) -> int:
    """A task's raw I/O priority (class << 13 | level), -1 when unknown."""
    return _syscall(_IOPRIO_GET, _IOPRIO_WHO_PROCESS, pid)


def _set_ioprio(tid: int, value: int) -> bool:
    return _syscall(_IOPRIO_SET, _IOPRIO_WHO_PROCESS, tid, value) == 0


def best_effort(level: int) -> int:
    """The raw I/O priority of best-effort ``level``."""
    return (_IOPRIO_CLASS_BE << _IOPRIO_CLASS_SHIFT) | level


_CAP_SYS_NICE = 23


def _capable(bit: int) -> bool:
    """
    Whether the process's effective capabilities hold ``bit``.  Root is
    not enough: a container's root commonly runs without ``CAP_SYS_NICE``
    (Docker's default set leaves it out).
    """
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def _may_raise_priority() -> bool:
    """
    Whether a thread that lowers its CPU priority may raise it back: with
    ``CAP_SYS_NICE``, or within ``RLIMIT_NICE``.
    """
    if _capable(_CAP_SYS_NICE):
        return True
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    floor = 20 - soft if soft != resource.RLIM_INFINITY else -20
    return floor <= os.getpriority(os.PRIO_PROCESS, 0)


def _lower_group(pid: int, nice: int) -> None:
    """
    ``nice`` for a child that did not inherit it (the daemon could not
    have taken its own back), given by pid just after its spawn: for every
    thread of every process in its process group, else (the child has not
    made its group yet, so has started nothing) for the child alone.

    The child alone is not enough: by then a shell has often forked its
    first command, a Go or Node program started its threads, and those
    would keep the daemon's priority for good (a pid names one thread).
    Never the daemon's group: a child that leads none makes the call fail
    (a group's id is never a live pid of another process's).
    """
    try:
        os.setpriority(os.PRIO_PGRP, pid, nice)
        return
    except OSError:
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError:
        pass


def _write_value(path: str, value: int) -> bool:
    """
    ``value`` written to a ``/proc`` file: an open, one write and a close
    (a text-mode file object adds a ``fstat``, an ``ioctl`` and two
    ``lseek``, per spawn).
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, b"%d" % value)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _leads_session(pid: int) -> bool | None:
    """
    Whether ``pid`` leads a session of its own: True, False (not yet), or
    None (gone).

    ``/proc/PID/autogroup`` sets the group the process is in *now*: a
    child forked but not yet in a session of its own (a fork path calls
    ``setsid`` in the child, after the fork has returned in the daemon) is
    still in the daemon's group, which a write by its pid would lower for
    good.  A session leader cannot leave its session, so a True cannot go
    stale before the write.
    """
    try:
        return os.getsid(pid) == pid
    except OSError:
        return None


def waiting_for_cpu(pid: int) -> bool:
    """
    Whether ``pid`` is runnable but has had almost no CPU yet
    (``CHILD_UNSTARTED_CPU_MS``): a child the machine has not run, as
    opposed to one that runs or sleeps.  False when it cannot say.

    ``schedstat``'s first field is the CPU time the task has had; its
    current wait on a run queue is counted only once it runs, so a task
    that never got a CPU reads as runnable with next to nothing run.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state != "R":
            return False
        with open(f"/proc/{pid}/schedstat") as f:
            ran = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return ran < CHILD_UNSTARTED_CPU_MS * 1_000_000


def _autogroups() -> bool:
    """Whether the scheduler groups tasks by session (``CONFIG_SCHED_AUTOGROUP``)."""
    global _AUTOGROUPS
    if _AUTOGROUPS is None:
        _AUTOGROUPS = _read_oom("/proc/sys/kernel/sched_autogroup_enabled") == 1
    return _AUTOGROUPS


_AUTOGROUPS: bool | None = None


def _read_autogroup_nice() -> int | None:
    """This process's autogroup nice value (``/autogroup-N nice V``)."""
    try:
        with open("/proc/self/autogroup") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _read_oom(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


class ChildPriority:
    """
    Applies :class:`Priorities` to the daemon and to every spawn.

    One instance per daemon process (:data:`CHILD_PRIORITY`): priorities
    are a property of the process, not of a request.
    """

    def __init__(self) -> None:
        self.priorities = Priorities(enabled=False)
        self._lock = threading.Lock()
        self._spawning = 0
        self._own_oom: int | None = None
        self._restorable = False
        #: Whether the daemon runs above the default priority (it raised
        #: itself): a child must then be lowered even to nice 0.
        self._raised = False
        self._original: tuple[int, int | None, int | None] | None = None
        #: The weight the children's session groups share: the daemon's
        #: group's on each CPU the daemon may run on (the daemon is one busy
        #: thread; the children spread over all of them).
        self._budget = weight(0) * _cpus()
        #: Live children's session leaders, by pid, with their group's nice value.
        self._groups: dict[int, int] = {}
        #: Live children whose group is not lowered to the base yet, by pid,
        #: with when it will be and until when it may still wait for the
        #: child's first CPU time (:meth:`_lower_due`); the clock's seconds,
        #: in order of the first, so the first is due first.
        self._young: OrderedDict[int, tuple[float, float]] = OrderedDict()
        #: Whether a child is runnable with no CPU had yet (:func:`waiting_for_cpu`).
        self.waiting_for_cpu = waiting_for_cpu
        #: What runs the lowering of young groups (the global reactor unless set).
        self.clock: Any = None
        #: Whether a lowering is scheduled (or about to be), and its timer.
        self._armed = False
        self._lowering: IDelayedCall | None = None
        #: Per thread: set while :meth:`awaited` spawns a child someone waits on.
        self._local = threading.local()
        #: Live tracked children that have printed nothing yet, by pid, with
        #: when they stop counting as starting (spawn order, so the first
        #: is due first).
        self._starting: OrderedDict[int, float] = OrderedDict()
        #: The second givings of a child's nice value by pid still to come
        #: (:meth:`_arm_again`), by pid.
        self._again: dict[int, IDelayedCall] = {}
        #: Children whose group waits at the lightest weight while others
        #: start (:meth:`first_output`); their own level stays in ``_groups``.
        self._yielding: set[int] = set()
        #: The timer that ends the wait when the last starting child is due.
        self._yield_call: IDelayedCall | None = None

    def configure(self, priorities: Priorities) -> None:
        """
        Take a (re)loaded policy's priorities; raise the daemon's own when it may.

        The daemon's session group is raised only when the daemon leads its
        session (a service, a container's process): started from a shell
        (``make serve``, a test run, a benchmark), the session is the
        shell's, and raising it would raise the shell and everything else
        it runs, for good when two daemons in that session overlap (the
        second would give back the first's raised value at its stop).
        """
        self.priorities = priorities
        self._restorable = _may_raise_priority()
        self._raised = False
        if not priorities.enabled or os.geteuid() != 0:
            return
        own_group = _autogroups() and _leads_session(os.getpid()) is True
        if self._original is None:
            self._original = (
                os.getpriority(os.PRIO_PROCESS, 0),
                _read_autogroup_nice() if own_group else None,
                _read_oom("/proc/self/oom_score_adj"),
            )
        try:
            if os.getpriority(os.PRIO_PROCESS, 0) > priorities.daemon_nice:
                os.setpriority(os.PRIO_PROCESS, 0, priorities.daemon_nice)
        except OSError:
            pass
        self._raised = os.getpriority(os.PRIO_PROCESS, 0) < 0
        if own_group:
            _write_value("/proc/self/autogroup", priorities.daemon_nice)
        group = _read_autogroup_nice()
        if group is not None:
            self._budget = weight(group) * _cpus()
        own = _read_oom("/proc/self/oom_score_adj")
        if own is not None and own > priorities.daemon_oom_score_adj:
            _write_value("/proc/self/oom_score_adj", priorities.daemon_oom_score_adj)

    def restore(self) -> None:
        """
        At stop: the process's own priorities as they were before
        :meth:`configure` (a daemon embedded in another program gives
        them back).
        """
        original, self._original = self._original, None
        self.priorities = Priorities(enabled=False)
        self._stop_lowering()
        again, self._again = self._again, {}
        for call in again.values():
            if call.active():
                call.cancel()
        with self._lock:
            self._starting.clear()
        self._end_yielding()
        if original is None:
            return
        nice, group, oom = original
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError:
            pass
        if group is not None:
            _write_value("/proc/self/autogroup", group)
        if oom is not None:
            _write_value("/proc/self/oom_score_adj", oom)

    @contextmanager
    def awaited(self) -> Iterator[None]:
        """
        Around a spawn on this thread of a child the user waits on (an
        agent): it and its session group run at ``agents_nice`` rather
        than ``children_nice``, and its group is never lowered later.
        Only a spawn made synchronously on the calling thread sees it (not
        one handed to a worker thread).
        """
        self._local.awaited = True
        try:
            yield
        finally:
            self._local.awaited = False

    def _child_nice(self) -> tuple[int, bool]:
        """The nice value of the child spawned now, and whether it is awaited."""
        p = self.priorities
        if getattr(self._local, "awaited", False):
            return p.agents_nice, True
        return p.children_nice, False

    @contextmanager
    def spawning(self, dedicated: bool = False) -> Iterator[None]:
        """
        Around one spawn on the calling thread: the child inherits lower
        CPU and I/O priority and a higher ``oom_score_adj``; the thread and
        the daemon get theirs back after.

        :param dedicated: the thread does nothing but spawn (a spawn
            worker): it keeps the children's I/O priority from one spawn to
            the next instead of taking it and giving it back each time
            (three system calls a spawn), since it does no I/O of its own.
            Its CPU priority still goes back after each spawn: between
            spawns it holds the interpreter's lock, which the reactor
            waits for.
        """
        p = self.priorities
        tid = threading.get_native_id()
        if dedicated:
            self._keep_io(tid, p.children_io_level if p.enabled else None)
        if not p.enabled:
            yield
            return
        nice = before_nice = None
        child_nice, awaited = self._child_nice()
        # Nice 0 is a change too under a daemon above the default priority:
        # a child never inherits the daemon's own.
        if (child_nice or awaited or self._raised) and self._restorable:
            before_nice = os.getpriority(os.PRIO_PROCESS, tid)
            target = max(before_nice, child_nice)
            if target != before_nice:
                os.setpriority(os.PRIO_PROCESS, tid, target)
                nice = target
        before_io = None
        if p.children_io_level is not None and not dedicated:
            before_io = ioprio_of(tid)
            if before_io < 0 or not _set_ioprio(tid, best_effort(p.children_io_level)):
                before_io = None
        self._raise_oom(p.children_oom_score_adj)
        try:
            yield
        finally:
            self._restore_oom()
            if before_io is not None:
                _set_ioprio(tid, before_io)
            if nice is not None and before_nice is not None:
                self._raise_back(tid, before_nice)

    def nice_to_take(self) -> int | None:
        """
        The nice value a child about to be spawned on this thread must give
        itself before it switches to another user: where the thread cannot
        carry it (the daemon could not take its own back), the daemon may
        not give it by pid once the child runs as that user (without
        CAP_SYS_NICE).  None when the child inherits it, or needs none.
        """
        p = self.priorities
        if not p.enabled or self._restorable:
            return None
        child_nice, _ = self._child_nice()
        own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return child_nice if child_nice > own else None

    def _raise_back(self, tid: int, nice: int) -> None:
        """
        The spawning thread's CPU priority back after a spawn.  Refused
        (the process lost the right since it was checked), the spawn still
        stands: the child is running and is the caller's; later children
        get their nice value by pid instead.
        """
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError as e:
            self._restorable = False
            log.warn(
                "sandboxd: a thread that started a child could not take its "
                "priority back ({why}); it stays at the children's",
                why=e,
            )

    def _keep_io(self, tid: int, level: int | None) -> None:
        """
        A dedicated spawning thread's I/O priority: best-effort ``level``
        (the children's), or its own from before again (None).
        """
        local = self._local
        if getattr(local, "io_level", None) == level:
            return
        own = getattr(local, "own_io", None)
        if own is None:
            own = ioprio_of(tid)
            if own < 0:
                return
            local.own_io = own
        if _set_ioprio(tid, own if level is None else best_effort(level)):
            local.io_level = level

    def spawned(
        self, pid: int, tracked: bool = True, lowers_itself: bool = False
    ) -> None:
        """
        After a spawn: the child's nice value by pid where the thread could
        not carry it (the daemon could not have raised its own back), and
        its session group's; and the child into the children's cgroup
        (:mod:`sandboxd.processes.cgroups`).

        :param tracked: the caller calls :meth:`ended` once the child is
            reaped; its group is made lighter while more children start.
        :param lowers_itself: the child was started through ``nice`` with
            :meth:`nice_to_take`'s value, which adds to whatever it finds:
            a value given by pid meanwhile would count twice.
        """
        place_child(pid)
        p = self.priorities
        if not p.enabled:
            return
        child_nice, _ = self._child_nice()
        if child_nice and not self._restorable and not lowers_itself:
            _lower_group(pid, child_nice)
            if isInIOThread():
                self._arm_again(pid, child_nice)
            else:
                self._reactor().callFromThread(self._arm_again, pid, child_nice)
        if _autogroups():
            self._weigh_group(pid, tracked)

    def _weigh_group(self, pid: int, tracked: bool) -> None:
        """
        The child leads a session of its own, hence an autogroup of its own,
        whose weight (not the task's nice) sets its CPU share against the
        daemon's group.  The more children are alive, the lighter a new
        one's group, and the live ones' follow when the level drops.

        A tracked child's group starts only as light as that requires
        (a new autogroup is at nice 0: often no write at all) and is
        lowered to the base ``children_group_after_ms`` later if the child
        still runs (:meth:`_lower_due`): a short command is over before,
        with nothing written, and never waits behind other work at the
        base's weight.  The daemon's share holds throughout.
        """
        p = self.priorities
        child_nice, awaited = self._child_nice()
        if awaited:
            # An agent's group stays at its own level (never lowered later).
            base, after = child_nice, 0.0
        else:
            base = self._base()
            after = p.children_group_after_ms / 1000.0 if tracked else 0.0
        with self._lock:
            # What keeping every group within the daemon's share requires
            # of each; the new child's own level is the base unless young.
            level = group_nice_for(0, self._budget, len(self._groups) + 1)
            nice = level if after else max(level, base)
            heavier = [other for other, was in self._groups.items() if was < level]
            for other in heavier:
                self._groups[other] = level
            # A yielding group is lighter than any level already.
            heavier = [other for other in heavier if other not in self._yielding]
            if tracked:
                self._groups[pid] = nice
            arm = False
            if after and nice < base:
                now = self._reactor().seconds()
                self._young[pid] = (
                    now + after,
                    now + max(after, CHILD_STARTING_SECONDS),
                )
                arm, self._armed = not self._armed, True
        # A tracked pid names a child not yet reaped, or reaped this very
        # moment: the kernel hands pids out in turn and gives a number
        # again only after going round pid_max, so never a stranger.
        for other in heavier:
            self._set_group(other, level)
        if nice:
            self._set_group(pid, nice)
        if arm:
            if isInIOThread():
                self._arm()
            else:
                self._reactor().callFromThread(self._arm)

    def _set_group(self, pid: int, nice: int, tries: int = LEADER_TRIES) -> None:
        """
        ``nice`` for the session group ``pid`` leads; if the child has not
        called ``setsid`` yet, once it has (checked every
        ``LEADER_RETRY_SECONDS``, ``tries`` times), with the level it
        should have by then.
        """
        leads = _leads_session(pid)
        if leads:
            _write_value(f"/proc/{pid}/autogroup", nice)
        elif leads is False and tries > 0:
            if isInIOThread():
                self._reactor().callLater(
                    LEADER_RETRY_SECONDS, self._set_group_again, pid, nice, tries - 1
                )
            else:
                self._reactor().callFromThread(self._set_group_again, pid, nice, tries)

    def _arm_again(self, pid: int, nice: int) -> None:
        """
        On the reactor thread: ``nice`` for ``pid``'s process group once
        more, ``GROUP_AGAIN_SECONDS`` from now.  The pid cannot name a
        stranger that soon, reaped or not: the kernel hands pids out in
        turn.
        """
        earlier = self._again.pop(pid, None)
        if earlier is not None and earlier.active():
            earlier.cancel()
        self._again[pid] = self._reactor().callLater(
            GROUP_AGAIN_SECONDS, self._lower_again, pid, nice
        )

    def _lower_again(self, pid: int, nice: int) -> None:
        self._again.pop(pid, None)
        _lower_group(pid, nice)

    def _set_group_again(self, pid: int, nice: int, tries: int) -> None:
        """A retry of :meth:`_set_group`, at the level the child should have now."""
        with self._lock:
            if pid in self._yielding:
                nice = LIGHTEST
            elif pid in self._groups:
                nice = self._groups[pid]
        self._set_group(pid, nice, tries)

    def _base(self) -> int:
        """The nice value of a child's session group once it has run a while."""
        p = self.priorities
        return (
            p.children_nice if p.children_group_nice is None else p.children_group_nice
        )

    def _reactor(self) -> Any:
        if self.clock is None:
            from twisted.internet import reactor

            self.clock = reactor
        return self.clock

    def _arm(self) -> None:
        """On the reactor thread: a timer for the first young group due."""
        with self._lock:
            first = next(iter(self._young.values()), None)
            self._armed = first is not None
        if first is None:
            self._lowering = None
            return
        delay = max(0.0, first[0] - self._reactor().seconds())
        self._lowering = self._reactor().callLater(delay, self._lower_due)

    def _stop_lowering(self) -> None:
        """No young group left (or the daemon stops): no timer behind."""
        with self._lock:
            self._young.clear()
            self._armed = False
        call, self._lowering = self._lowering, None
        if call is not None and call.active():
            call.cancel()

    def _lower_due(self) -> None:
        """
        The young groups whose time is up, lowered to the base (or lighter
        while many children run); reaped children have left already.

        A child still waiting for its first CPU time is not lowered yet:
        on a busy machine a short command can wait that long for a CPU,
        and lowering it then would only make it wait longer behind the
        machine's other work, not slow down anything it runs.  It is
        looked at again a period later, and lowered at the latest
        ``CHILD_STARTING_SECONDS`` after its spawn (or at its first look,
        if the period is longer).  The daemon's share
        holds meanwhile: the group stays at the level that keeps it.
        """
        now = self._reactor().seconds()
        base = self._base()
        after = self.priorities.children_group_after_ms / 1000.0
        with self._lock:
            due: list[tuple[int, float]] = []
            while self._young:
                pid, (when, until) = next(iter(self._young.items()))
                if when > now:
                    break
                self._young.popitem(last=False)
                due.append((pid, until))
            nice = group_nice_for(base, self._budget, len(self._groups))
            # Only a group that would be lowered now is worth a look.
            candidates = [
                pid
                for pid, until in due
                if now + after <= until and self._groups.get(pid, nice) < nice
            ]
        # Read outside the lock: the spawn workers take it for every spawn.
        waiting = {pid for pid in candidates if self.waiting_for_cpu(pid)}
        with self._lock:
            nice = group_nice_for(base, self._budget, len(self._groups))
            lowered = []
            for pid, until in due:
                was = self._groups.get(pid)
                if was is None or was >= nice:
                    continue
                if pid in waiting:
                    # Later than every young child's due time so far: the
                    # order stays the order of due times.
                    self._young[pid] = (now + after, until)
                    continue
                self._groups[pid] = nice
                if pid not in self._yielding:
                    lowered.append(pid)
        for pid in lowered:
            self._set_group(pid, nice)
        self._arm()

    def tracked(self) -> frozenset[int]:
        """The live children whose groups are weighed together."""
        with self._lock:
            return frozenset(self._groups)

    def ended(self, pid: int) -> None:
        """A tracked child was reaped: its pid stops being ours."""
        with self._lock:
            self._groups.pop(pid, None)
            self._yielding.discard(pid)
            last_starting = (
                self._starting.pop(pid, None) is not None and not self._starting
            )
        if last_starting:
            self._settle()
        with self._lock:
            if self._young.pop(pid, None) is None or self._young:
                return
        if isInIOThread():
            self._stop_lowering()

    # -- terminals nobody is attached to --------------------------------------

    def unattended(self, pid: int) -> None:
        """
        A terminal whose last client went away: its session group at the
        lightest weight until someone uses it again (:meth:`attended`).

        A terminal outlives its socket so that its client can come back,
        and whatever it still runs (a shell still reading its start-up
        files, a build left going) goes on; nobody is watching it, so it
        yields to the work somebody waits for, and still has the CPUs
        whenever nothing else wants them.
        """
        if self.priorities.enabled and _autogroups():
            with self._lock:
                self._groups.pop(pid, None)
            self._set_group(pid, LIGHTEST)

    def attended(self, pid: int) -> None:
        """
        A terminal a client is attached to: its session group at an
        agent's level (``agents_nice``), not at the children's.

        Somebody waits on every keystroke: what echoes it (the shell's line
        editor, an editor, a REPL) runs in this group, and at the
        children's weight it would share the CPUs evenly with each busy
        session of the sandbox's own work.  Its tasks keep the children's
        nice value, so a build started in the terminal still yields to
        its shell.  The group is weighed with the live children's (and
        lowered with them while many run): the daemon's share holds.
        """
        if not self.priorities.enabled or not _autogroups():
            return
        with self._lock:
            alive = len(self._groups) + (pid not in self._groups)
            level = group_nice_for(self.priorities.agents_nice, self._budget, alive)
            heavier = [
                other
                for other, was in self._groups.items()
                if was < level and other != pid
            ]
            for other in heavier:
                self._groups[other] = level
            heavier = [other for other in heavier if other not in self._yielding]
            self._groups[pid] = level
            # Still young, its lowering to the children's base is due: an
            # attended group is never lowered by that (a client that
            # attaches, or a kernel that starts, within its first moment).
            self._young.pop(pid, None)
        for other in heavier:
            self._set_group(other, level)
        self._set_group(pid, level)

    # -- the first line of many streams started at once ---------------------

    def starting(self, pid: int) -> None:
        """
        On the reactor thread, once a stream's child runs: it has printed
        nothing yet, and counts as starting until it does (:meth:`first_output`),
        is reaped, or has run ``CHILD_STARTING_SECONDS``.  Only streams
        count: a command whose output nobody watches line by line (a
        ``/shell true``, a quiet background job) never makes others wait.
        """
        if not self.priorities.enabled or not _autogroups():
            return
        with self._lock:
            if pid in self._groups:
                self._starting[pid] = self._reactor().seconds() + CHILD_STARTING_SECONDS

    def first_output(self, pid: int) -> None:
        """
        On the reactor thread, when a stream's child prints for the first
        time.  While other streams' children are still starting
        (:meth:`starting`), its group waits at
        the lightest weight: a stream's first line comes once its shell has
        started, and with hundreds started together the ones that have
        printed (forking a ``sleep`` per line) would otherwise share the
        CPUs evenly with the ones not started yet, and every first line
        would come late.  The group gets its level back once no child is
        starting (each counts for ``CHILD_STARTING_SECONDS`` at most), and
        has not been for ``CHILD_STARTING_GRACE_SECONDS``.
        Lighter only: the children's groups stay within the daemon's share.
        """
        if not self.priorities.enabled or not _autogroups():
            return
        now = self._reactor().seconds()
        with self._lock:
            if self._starting.pop(pid, None) is None:
                return
            self._drop_due_starting(now)
            others = bool(self._starting) and pid in self._groups
            if others:
                self._yielding.add(pid)
        if not others:
            self._settle()
            return
        self._set_group(pid, LIGHTEST)
        if self._yield_call is None or not self._yield_call.active():
            self._arm_yielding(now)

    def _settle(self) -> None:
        """
        No child counts as starting right now: the waiting groups get their
        level back ``CHILD_STARTING_GRACE_SECONDS`` later unless another
        stream's child starts meanwhile (answering hundreds of requests,
        the daemon adopts their children one after another: between two,
        the ones already started may all have printed).
        """
        with self._lock:
            waiting = bool(self._yielding)
        call, self._yield_call = self._yield_call, None
        if call is not None and call.active():
            call.cancel()
        if waiting:
            self._yield_call = self._reactor().callLater(
                CHILD_STARTING_GRACE_SECONDS, self._yield_due
            )

    def _drop_due_starting(self, now: float) -> None:
        """Under the lock: the children that no longer count as starting."""
        while self._starting:
            due = next(iter(self._starting.values()))
            if due > now:
                break
            self._starting.popitem(last=False)

    def _arm_yielding(self, now: float) -> None:
        """A timer for when the first starting child stops counting."""
        with self._lock:
            first = next(iter(self._starting.values()), None)
        if first is None:
            self._yield_call = None
            return
        self._yield_call = self._reactor().callLater(
            max(0.0, first - now), self._yield_due
        )

    def _yield_due(self) -> None:
        """The wait's timer: end it if no child is starting any more."""
        now = self._reactor().seconds()
        with self._lock:
            self._drop_due_starting(now)
            starting = bool(self._starting)
        if starting:
            self._arm_yielding(now)
        else:
            self._yield_call = None
            self._end_yielding()

    def _end_yielding(self) -> None:
        """No child is starting: the waiting groups back at their level."""
        with self._lock:
            back = [
                (pid, self._groups[pid])
                for pid in self._yielding
                if pid in self._groups
            ]
            self._yielding.clear()
        for pid, nice in back:
            self._set_group(pid, nice)
        call, self._yield_call = self._yield_call, None
        if call is not None and call.active() and isInIOThread():
            call.cancel()

    def _raise_oom(self, value: int) -> None:
        # Process-wide: spawns on several threads at once share one raise.
        with self._lock:
            if self._spawning == 0:
                own = _OWN_OOM.read()
                if own is not None and own != value and _OWN_OOM.write(value):
                    self._own_oom = own
            self._spawning += 1

    def _restore_oom(self) -> None:
        with self._lock:
            self._spawning -= 1
            if self._spawning == 0 and self._own_oom is not None:
                _OWN_OOM.write(self._own_oom)
                self._own_oom = None


class _OwnOom:
    """
    ``/proc/self/oom_score_adj`` kept open: read and written twice per
    spawn, one system call each instead of an open, a call and a close,
    with the interpreter lock held (:func:`holding_gil`).
    """

    def __init__(self) -> None:
        self._fd: int | None = None
        # Built once: ctypes' conversions of declared argument types cost
        # more than the call.  Only used under ChildPriority's lock.
        self._buffer = ctypes.create_string_buffer(16)
        self._size = ctypes.c_size_t(16)
        self._start = ctypes.c_long(0)

    def _open(self) -> int | None:
        if self._fd is None:
            try:
                self._fd = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                return None
        return self._fd

    def read(self) -> int | None:
        fd = self._open()
        pread = holding_gil("pread")
        if fd is None or pread is None:
            return None
        got = pread(fd, self._buffer, self._size, self._start)
        try:
            return int(self._buffer.raw[:got]) if got > 0 else None
        except ValueError:
            return None

    def write(self, value: int) -> bool:
        fd = self._open()
        pwrite = holding_gil("pwrite")
        if fd is None or pwrite is None:
            return False
        data = b"%d" % value
        size = len(data)
        return bool(pwrite(fd, data, ctypes.c_size_t(size), self._start) == size)


_OWN_OOM = _OwnOom()


#: The daemon's one :class:`ChildPriority`.
CHILD_PRIORITY = ChildPriority()
