# -*- test-case-name: tests.processes.test_cgroups -*-
"""
The daemon and its children in cgroups of their own, where a cgroup v2
hierarchy is delegated to the daemon.

Nice values and I/O priorities (:mod:`sandboxd.processes.priority`) order
tasks; a cgroup bounds what a whole tree of them may take, whatever they
fork and however many sessions they open.  As envd does inside an E2B
sandbox, and as ``systemd-run`` does for a unit, the daemon at start:

1. finds its own cgroup v2 directory, and goes on only when it may write
   it (its ``cgroup.procs`` and ``cgroup.subtree_control``) and the
   hierarchy offers at least one of the ``cpu``, ``memory`` and ``pids``
   controllers;
2. creates two leaves under it, moves itself into the daemon's leaf and
   then enables the controllers for them.  cgroup v2 lets a non-root
   cgroup hand controllers to its children only while it holds no
   processes itself ("no internal processes"), hence the move first; a
   cgroup that still holds other processes after it is refused, and the
   daemon moves back;
3. gives its own leaf a higher ``cpu.weight`` and a memory reserve
   (``memory.min``, ``memory.low``), and the children's leaf its weight,
   ``memory.high``, ``memory.max`` and ``pids.max``, from the policy's
   ``cgroups`` object.

Every child is moved into the children's leaf by its pid, from the
parent, just after the spawn (:func:`place_child`, called where the
child's priorities are set), on a thread of its own (:class:`_Placer`:
a move can wait milliseconds for the kernel), together with whatever the
child started before it was moved.  ``clone3(CLONE_INTO_CGROUP)`` would
start it there, with no window at all and no wait, but Python has no
``clone3`` (a raw system call from ctypes would return into a copy of
the interpreter with its locks as other threads left them), and the C
library's ``posix_spawnattr_setcgroup_np`` arrived in glibc 2.39.  Until
it is moved the child runs at the children's nice value and
``oom_score_adj`` all the same (it inherits those before exec).

When no writable hierarchy is there the daemon does nothing, says why
once in its log, and ``GET /system/info`` reports
``"cgroups": {"state": "unavailable", "reason": ...}``.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import attrs
from twisted.logger import Logger

from sandboxd.policy.cgroup_limits import CgroupLimits
from sandboxd.policy.defaults import (
    CGROUP_CHILDREN_LEAF,
    CGROUP_DAEMON_LEAF,
    CGROUP_PLACEMENTS_QUEUED,
    CGROUP_STOP_SECONDS,
    CGROUP_TREE_MOVES,
)

if TYPE_CHECKING:
    from sandboxd.sysinfo import Cgroup

log = Logger()

#: The controllers the leaves use, in the order they are enabled.
CONTROLLERS = ("cpu", "memory", "pids")


class Unavailable(Exception):
    """No delegated cgroup v2 hierarchy here; the message says why."""


class CgroupFiles:
    """
    The file operations on a cgroup tree, one place to fake them: tests
    refuse a write the way the kernel does (``EBUSY``, ``EACCES``).
    """

    def read(self, path: str) -> str:
        """A cgroup interface file's text."""
        with open(path) as f:
            return f.read()

    def write(self, path: str, text: str) -> None:
        """One write of ``text`` to an interface file (the kernel acts per write)."""
        with open(path, "w") as f:
            f.write(text)

    def writable(self, path: str) -> bool:
        """Whether this process may write ``path``."""
        return os.access(path, os.W_OK)

    def mkdir(self, path: str) -> None:
        """Create a cgroup (a directory); one left from an earlier run is reused."""
        os.makedirs(path, exist_ok=True)

    def rmdir(self, path: str) -> None:
        """Remove a cgroup; the kernel refuses while it holds processes."""
        os.rmdir(path)


@attrs.frozen
class CgroupStatus:
    """
    What ``GET /system/info`` says of the daemon's cgroups.

    :ivar state: ``active``, ``unavailable`` or ``disabled`` (by policy).
    :ivar reason: why not active.
    :ivar daemon: the daemon's leaf, as a path in the hierarchy.
    :ivar children: the children's leaf.
    :ivar controllers: the controllers enabled for the leaves.
    :ivar errors: interface files the kernel refused to set, with why.
    """

    state: str
    reason: str | None = None
    daemon: str | None = None
    children: str | None = None
    controllers: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """The status as a JSON object (absent fields left out)."""
        out: dict[str, Any] = {"state": self.state}
        if self.reason is not None:
            out["reason"] = self.reason
        if self.state == "active":
            out.update(
                daemon=self.daemon,
                children=self.children,
                controllers=list(self.controllers),
                errors=list(self.errors),
            )
        return out


@attrs.define
class _Leaves:
    """The cgroups the daemon set up, and how to undo it."""

    mount: str
    parent: str
    daemon: str
    children: str
    controllers: tuple[str, ...]
    #: The controllers the parent handed down before the daemon came.
    enabled_before: tuple[str, ...]
    #: ``cgroup.procs`` of the children's leaf, kept open: one write per spawn.
    procs_fd: int


def _hierarchy_path(mount: str, directory: str) -> str:
    """``directory`` as the kernel names it in ``/proc/PID/cgroup``."""
    return "/" + os.path.relpath(directory, mount).lstrip(".").lstrip("/")


class ChildCgroups:
    """
    Sets up the leaves once, applies the policy's values at every
    (re)load, and places children.  One instance per daemon process
    (:data:`CHILD_CGROUPS`): a process is in one cgroup.

    :param root: where ``/proc`` and ``/sys`` are found (a fake tree in
        tests).
    :param files: the file operations (:class:`CgroupFiles`).
    """

    def __init__(self, root: str = "/", files: CgroupFiles | None = None) -> None:
        self.root = root
        self.files = files or CgroupFiles()
        self.status = CgroupStatus("unavailable", reason="not configured yet")
        self._leaves: _Leaves | None = None
        self._placing = False
        self._told: str | None = None
        self._place_failed = False
        #: The placing thread moves children while the reactor may restore.
        self._lock = threading.Lock()
        self._placer: _Placer | None = None

    def configure(self, limits: CgroupLimits) -> CgroupStatus:
        """
        Take a (re)loaded policy's ``cgroups``: set the leaves up on the
        first call that finds a delegated hierarchy, then write the values.
        """
        if not limits.enabled:
            self._placing = False
            self.status = CgroupStatus("disabled", reason="policy cgroups: false")
            return self.status
        if self._leaves is None:
            try:
                self._leaves = self._set_up()
            except Unavailable as e:
                self.status = CgroupStatus("unavailable", reason=str(e))
                self._tell(f"sandboxd: cgroups unavailable: {e}")
                return self.status
        leaves = self._leaves
        errors = self._apply(leaves, limits)
        self._placing = True
        if self._placer is None:
            self._placer = _Placer(self._move, self._children_of)
            self._placer.start()
        self.status = CgroupStatus(
            "active",
            daemon=_hierarchy_path(leaves.mount, leaves.daemon),
            children=_hierarchy_path(leaves.mount, leaves.children),
            controllers=leaves.controllers,
            errors=tuple(errors),
        )
        self._tell(
            f"sandboxd: cgroups active: daemon in {self.status.daemon}, children in "
            f"{self.status.children} ({', '.join(leaves.controllers)})"
        )
        for error in errors:
            log.warn("sandboxd: cgroups: {error}", error=error)
        return self.status

    def _tell(self, line: str) -> None:
        """Log ``line`` once (not again at every reload)."""
        if line != self._told:
            self._told = line
            log.info("{line}", line=line)

    def _set_up(self) -> _Leaves:
        """Find the daemon's cgroup, create the leaves, move in, enable."""
        parent, mount, wanted = self._locate()
        return self._enter(parent, mount, wanted)

    def _locate(self) -> tuple[str, str, tuple[str, ...]]:
        """
        The daemon's cgroup v2 directory, its mount, and the controllers it
        offers that the leaves use, once it is known to be delegated.
        """
        from sandboxd.sysinfo import Cgroup  # at start, not at import

        found = Cgroup.find(self.root)
        if found.v2 is None:
            raise Unavailable(_no_v2_reason(found))
        parent, mount = found.v2
        offered = self._controllers(parent)
        wanted = tuple(c for c in CONTROLLERS if c in offered)
        if not wanted:
            raise Unavailable(_no_controllers_reason(mount, offered, found))
        for path in (
            parent,
            os.path.join(parent, "cgroup.procs"),
            os.path.join(parent, "cgroup.subtree_control"),
        ):
            if not os.path.exists(path) or not self.files.writable(path):
                raise Unavailable(
                    f"{path} is not writable: the cgroup is not delegated to the daemon"
                )
        try:
            members = self.files.read(os.path.join(parent, "cgroup.procs")).split()
        except OSError as e:
            raise Unavailable(f"cannot read {parent}/cgroup.procs: {e.strerror}") from e
        if str(os.getpid()) not in members:
            raise Unavailable(
                f"the daemon's own cgroup was not found ({parent} does not list it)"
            )
        return parent, mount, wanted

    def _enter(self, parent: str, mount: str, wanted: tuple[str, ...]) -> _Leaves:
        """
        The leaves created, the daemon moved into its own and only then the
        controllers enabled (no internal processes); undone when refused.
        """
        try:
            enabled_before = tuple(
                self.files.read(os.path.join(parent, "cgroup.subtree_control")).split()
            )
        except OSError as e:
            raise Unavailable(
                f"cannot read {parent}/cgroup.subtree_control: {e}"
            ) from e
        daemon = os.path.join(parent, CGROUP_DAEMON_LEAF)
        children = os.path.join(parent, CGROUP_CHILDREN_LEAF)
        try:
            self.files.mkdir(daemon)
            self.files.mkdir(children)
        except OSError as e:
            raise Unavailable(
                f"cannot create a cgroup under {parent}: {e.strerror}"
            ) from e
        try:
            self.files.write(os.path.join(daemon, "cgroup.procs"), str(os.getpid()))
        except OSError as e:
            self._remove(daemon, children)
            raise Unavailable(
                f"cannot move the daemon into {daemon}: {e.strerror}"
            ) from e
        missing = [c for c in wanted if c not in enabled_before]
        try:
            if missing:
                self.files.write(
                    os.path.join(parent, "cgroup.subtree_control"),
                    " ".join(f"+{c}" for c in missing),
                )
        except OSError as e:
            reason = self._enable_refused(parent, e)
            self._move_back(parent)
            self._remove(daemon, children)
            raise Unavailable(reason) from e
        try:
            procs_fd = os.open(
                os.path.join(children, "cgroup.procs"),
                os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC,
            )
        except OSError as e:
            self._undo(parent, daemon, children, missing)
            raise Unavailable(
                f"cannot open {children}/cgroup.procs: {e.strerror}"
            ) from e
        return _Leaves(
            mount, parent, daemon, children, wanted, enabled_before, procs_fd
        )

    def _controllers(self, directory: str) -> list[str]:
        try:
            return self.files.read(
                os.path.join(directory, "cgroup.controllers")
            ).split()
        except OSError:
            return []

    def _enable_refused(self, parent: str, error: OSError) -> str:
        """Why the parent would not hand its controllers down."""
        if error.errno == errno.EBUSY:
            try:
                others = self.files.read(os.path.join(parent, "cgroup.procs")).split()
            except OSError:
                others = []
            others = [p for p in others if p != str(os.getpid())]
            if others:
                return (
                    f"{parent} holds other processes ({', '.join(others[:5])}): a "
                    "cgroup with processes cannot give its controllers to cgroups "
                    "below it; start the daemon in a cgroup of its own"
                )
        return f"cannot enable controllers in {parent}: {error.strerror}"

    def _move_back(self, parent: str) -> bool:
        try:
            self.files.write(os.path.join(parent, "cgroup.procs"), str(os.getpid()))
        except OSError:
            return False
        return True

    def _undo(
        self, parent: str, daemon: str, children: str, added: Iterable[str]
    ) -> bool:
        """
        The parent's controllers as they were, the daemon back in it and the
        leaves gone; False when the parent cannot take it back.
        """
        added = list(added)
        try:
            if added:
                self.files.write(
                    os.path.join(parent, "cgroup.subtree_control"),
                    " ".join(f"-{c}" for c in added),
                )
        except OSError:
            return False
        if not self._move_back(parent):
            return False
        self._remove(daemon, children)
        return True

    def _remove(self, *leaves: str) -> None:
        for leaf in leaves:
            try:
                self.files.rmdir(leaf)
            except OSError:
                pass  # a leaf that still holds processes stays

    def _apply(self, leaves: _Leaves, limits: CgroupLimits) -> list[str]:
        """Write the policy's values; the refused ones, with the kernel's reason."""
        settings = [
            ("cpu", leaves.daemon, "cpu.weight", limits.daemon_cpu_weight),
            ("cpu", leaves.children, "cpu.weight", limits.children_cpu_weight),
            ("memory", leaves.daemon, "memory.min", limits.daemon_memory_min),
            ("memory", leaves.daemon, "memory.low", limits.daemon_memory_low),
            ("memory", leaves.children, "memory.high", limits.children_memory_high),
            ("memory", leaves.children, "memory.max", limits.children_memory_max),
            ("pids", leaves.children, "pids.max", limits.children_pids_max),
        ]
        errors = []
        for controller, leaf, name, value in settings:
            if controller not in leaves.controllers:
                continue
            path = os.path.join(leaf, name)
            try:
                self.files.write(path, "max" if value is None else str(value))
            except OSError as e:
                errors.append(
                    f"{_hierarchy_path(leaves.mount, path)}: {e.strerror or e}"
                )
        return errors

    def place(self, pid: int) -> None:
        """
        Have a child just spawned moved into the children's leaf, with
        whatever it has started meanwhile (on the placing thread: see
        :class:`_Placer`).
        """
        placer = self._placer
        if placer is None or not self._placing:
            return
        if not placer.submit(pid):
            placer.place_tree(pid)  # queue full: here, slow as it is

    def settle(self, timeout: float) -> bool:
        """Wait until the children handed over so far are placed (tests)."""
        placer = self._placer
        return placer is None or placer.settle(timeout)

    def _move(self, pid: int) -> bool:
        """One process into the children's leaf; False when it is not there."""
        with self._lock:
            leaves = self._leaves
            if leaves is None or not self._placing:
                return False
            try:
                os.write(leaves.procs_fd, b"%d\n" % pid)
                return True
            except OSError as e:
                failed = e
        self._place_failed_with(pid, leaves, failed)
        return False

    def _children_of(self, pid: int) -> list[int]:
        """A process's children, from each of its threads' ``children`` list."""
        task_dir = os.path.join(self.root, f"proc/{pid}/task")
        try:
            tasks = os.listdir(task_dir)
        except OSError:
            return []
        found: list[int] = []
        for task in tasks:
            try:
                with open(os.path.join(task_dir, task, "children"), "rb") as f:
                    found.extend(int(p) for p in f.read().split())
            except (OSError, ValueError):
                continue
        return found

    def _place_failed_with(self, pid: int, leaves: _Leaves, e: OSError) -> None:
        """A child the kernel would not move: said once."""
        if e.errno == errno.ESRCH or self._place_failed:
            return  # ESRCH: already gone, nothing to place
        self._place_failed = True
        log.warn(
            "sandboxd: cgroups: cannot move child {pid} into {leaf}: {error}",
            pid=pid,
            leaf=leaves.children,
            error=e.strerror,
        )

    def restore(self) -> None:
        """
        At stop: the daemon back in the cgroup it started in, and the leaves
        removed when empty (a daemon embedded in another program gives its
        process back as it found it).
        """
        placer, self._placer = self._placer, None
        if placer is not None:
            placer.stop(CGROUP_STOP_SECONDS)
        with self._lock:
            leaves, self._leaves = self._leaves, None
            self._placing = False
            if leaves is not None:
                os.close(leaves.procs_fd)
        self._told = None
        self.status = CgroupStatus("unavailable", reason="stopped")
        if leaves is None:
            return
        added = [c for c in leaves.controllers if c not in leaves.enabled_before]
        self._undo(leaves.parent, leaves.daemon, leaves.children, added)


class _Placer:
    """
    The thread that moves children into the children's leaf.

    A move (a write to ``cgroup.procs``) waits for an RCU grace period
    whenever no other move happened in the last few milliseconds: 5 to 15
    ms each on a busy machine, for spawns one call apart.  The reactor
    never waits for one; the child runs meanwhile, as it would during a
    write made from the reactor (the kernel moves it when the write
    returns).  So after the child the thread moves what the child has
    started by then, and what those have started, walking down
    ``/proc/PID/task/TID/children`` (a process moved first, its children
    listed after, so none is missed), at most :data:`CGROUP_TREE_MOVES`
    per child.
    """

    def __init__(
        self,
        move: Callable[[int], bool],
        children_of: Callable[[int], list[int]],
        queued: int = CGROUP_PLACEMENTS_QUEUED,
    ) -> None:
        self._move = move
        self._children_of = children_of
        self._queue: queue.Queue[int | None] = queue.Queue(queued)
        self._thread = threading.Thread(
            target=self._run, name="sandboxd-cgroups", daemon=True
        )

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def submit(self, pid: int) -> bool:
        """Queue a child; False when the queue is full."""
        try:
            self._queue.put_nowait(pid)
        except queue.Full:
            return False
        return True

    def _run(self) -> None:
        while True:
            pid = self._queue.get()
            try:
                if pid is None:
                    return
                self.place_tree(pid)
            finally:
                self._queue.task_done()

    def place_tree(self, pid: int) -> None:
        """``pid`` and what it has started, each moved before its children are read."""
        stack, seen = [pid], set[int]()
        while stack and len(seen) < CGROUP_TREE_MOVES:
            member = stack.pop()
            if member in seen:
                continue
            seen.add(member)
            if self._move(member):
                stack.extend(self._children_of(member))

    def settle(self, timeout: float) -> bool:
        """Whether the queue is empty and its last child placed within ``timeout``."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
        return True

    def stop(self, timeout: float) -> None:
        """Let the thread finish what is queued (at most ``timeout`` seconds)."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return  # a daemon thread: it ends with the process
        self._thread.join(timeout)


def _no_v2_reason(found: Cgroup) -> str:
    if found.v1:
        return (
            "no cgroup v2 hierarchy for this process (cgroup v1 only: "
            f"{', '.join(sorted(found.v1))})"
        )
    return "no cgroup v2 hierarchy is mounted"


def _no_controllers_reason(mount: str, offered: Iterable[str], found: Cgroup) -> str:
    offered = list(offered)
    text = (
        f"the cgroup v2 hierarchy at {mount} offers none of {', '.join(CONTROLLERS)}"
        f" (it offers: {', '.join(offered) or 'nothing'})"
    )
    in_v1 = [c for c in CONTROLLERS if c in found.v1]
    if in_v1:
        text += f"; {', '.join(in_v1)} are bound to cgroup v1 hierarchies"
    return text


#: The daemon's one :class:`ChildCgroups`.
CHILD_CGROUPS = ChildCgroups()


def place_child(pid: int) -> None:
    """The spawn path's one hook: ``pid`` into the children's cgroup, if any."""
    CHILD_CGROUPS.place(pid)
