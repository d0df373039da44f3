"""
The process machinery of SPEC §7.4: every child the daemon runs through
pipes (``/shell``, ``/shell/stream``, background processes, code runs, git,
package listings) is driven from here.

- :class:`Child` is the one ``ProcessProtocol``: the command runs in its
  own session (spawned through ``setsid``), stdin is ``/dev/null`` unless a
  pipe is asked for, ``processExited`` means "finished" and the pipes are
  closed shortly after (a grandchild holding them cannot hang a call), hard
  and idle timeouts end the whole tree, and reading can be paused by a slow
  client.
- :func:`kill_tree` ends a tree: TERM to the group and every descendant
  found in /proc (also one that left with ``setsid``, and one adopted by
  the daemon as child subreaper that still carries the tree's marker),
  then KILL to whatever is left after the grace period.
- :class:`OrphanReaper` reaps, by pid only, the orphans the daemon adopts
  as subreaper (or as PID 1); it never calls ``waitpid(-1)``, which would
  steal statuses from Twisted.
- :func:`run_collect` runs a command to completion and collects its
  output with the head-and-tail cap of :class:`HeadTail`.
- :class:`ProcessService` is the table of background processes, each with
  an :class:`~sandboxd.eventlog.EventLog` of its output; stopping it ends
  every child's tree.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import re
import secrets
import select
import signal
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import attrs
from twisted.application.service import Service
from twisted.internet import process as _twisted_process
from twisted.internet.defer import CancelledError, Deferred, DeferredList, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from sandboxd.children import RunAs, exit_code, find_executable, spawn_session
from sandboxd.eventlog import EventLog
from sandboxd.policy.defaults import (
    ENDPOINT_LIMITS,
    EVENT_OVERHEAD_BYTES,
    EXIT_DRAIN_MAX_SECONDS,
    EXIT_DRAIN_SECONDS,
    KILL_GRACE_SECONDS,
    MAX_LINE_BYTES,
    ORPHAN_REAP_SECONDS,
    PROCESS_HISTORY,
    STREAM_FLUSH_BYTES,
    STREAM_FLUSH_SECONDS,
)
from sandboxd.web.sse import frame

log = Logger(namespace="sandboxd.processes")

#: The environment name carrying a tree's marker.  Every process of the
#: tree inherits it, so a double-forked daemon adopted by the daemon (as
#: subreaper) is still recognised as part of the tree when it is killed.
TREE_MARKER = "SANDBOXD_PROCESS_TREE"

#: How often a kill in progress looks for survivors (seconds, growing).
_KILL_POLLS = (0.01, 0.02, 0.05, 0.1, 0.2)

_PR_SET_CHILD_SUBREAPER = 36

#: A capture with no ``max_output_bytes`` keeps what /shell keeps.
DEFAULT_CAPTURE_BYTES: int = ENDPOINT_LIMITS["shell"]["max_output_bytes"]

#: A background process's log with no ``max_output_bytes`` keeps this much.
DEFAULT_RETENTION_BYTES: int = ENDPOINT_LIMITS["process_start"]["max_output_bytes"]


# --------------------------------------------------------------------------
# Output caps


class HeadTail:
    """
    A byte sink that keeps the first and the last ``cap // 2`` bytes.

    Memory stays bounded by ``cap`` however much is written; what falls in
    between is counted in :attr:`dropped_bytes`, so an error at the end of
    a huge log is never lost.
    """

    def __init__(self, cap: int) -> None:
        self.cap = max(0, cap)
        self._head_cap = self.cap // 2
        self._tail_cap = self.cap - self._head_cap
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self.dropped_bytes = 0
        self.total_bytes = 0

    @property
    def truncated(self) -> bool:
        """Whether anything was dropped."""
        return self.dropped_bytes > 0

    def write(self, data: bytes) -> None:
        """Take the next bytes."""
        self.total_bytes += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data:
            return
        if len(data) >= self._tail_cap:
            self.dropped_bytes += self._tail_len + len(data) - self._tail_cap
            self._tail.clear()
            data = data[len(data) - self._tail_cap :] if self._tail_cap else b""
            self._tail_len = 0
        if data:
            self._tail.append(data)
            self._tail_len += len(data)
        while self._tail_len > self._tail_cap:
            excess = self._tail_len - self._tail_cap
            first = self._tail[0]
            if len(first) <= excess:
                self._tail.popleft()
                self._tail_len -= len(first)
                self.dropped_bytes += len(first)
            else:
                self._tail[0] = first[excess:]
                self._tail_len -= excess
                self.dropped_bytes += excess

    def value(self, marker: bool = True) -> bytes:
        """Head and tail, with a line naming the dropped bytes between them."""
        tail = b"".join(self._tail)
        if not self.truncated:
            return bytes(self._head) + tail
        middle = (
            f"\n[... {self.dropped_bytes} bytes dropped ...]\n".encode()
            if marker
            else b""
        )
        return bytes(self._head) + middle + tail


# --------------------------------------------------------------------------
# /proc


@attrs.frozen
class ProcInfo:
    """What /proc/<pid>/stat says about one process."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start: int


def proc_info(pid: int) -> ProcInfo | None:
    """One process's stat line, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
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


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def own_children() -> list[int]:
    """The daemon's direct children (``/proc/self/task/*/children``)."""
    pids: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        tasks = []
    found = False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children", "rb") as f:
                pids.update(int(p) for p in f.read().split())
            found = True
        except OSError:
            continue
    if not found:
        me = os.getpid()
        pids = {p.pid for p in proc_table().values() if p.ppid == me}
    return sorted(pids)


def adopted_orphans() -> list[int]:
    """Children of the daemon that Twisted did not spawn (orphans it adopted)."""
    registered = _twisted_process.reapProcessHandlers
    return [pid for pid in own_children() if pid not in registered]


def tree_members(
    leader: int, marker: str | None, table: dict[int, ProcInfo] | None = None
) -> dict[int, int]:
    """
    The live members of ``leader``'s tree as ``{pid: start time}``: its
    session and group, every descendant by parent link, and adopted
    orphans (with their descendants) that carry ``marker``.
    """
    table = proc_table() if table is None else table
    found = {
        p.pid
        for p in table.values()
        if p.pid != leader and (p.sid == leader or p.pgid == leader) and p.state != "Z"
    }
    roots = {leader}
    if marker is not None:
        needle = f"{TREE_MARKER}={marker}".encode()
        me = os.getpid()
        for p in table.values():
            if (
                p.ppid == me
                and p.pid != leader
                and p.state != "Z"
                and p.pid not in _twisted_process.reapProcessHandlers
                and _has_marker(p.pid, needle)
            ):
                found.add(p.pid)
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


def _alive(pid: int, start: int) -> bool:
    info = proc_info(pid)
    return info is not None and info.start == start and info.state != "Z"


def _send(pid: int, start: int | None, sig: int) -> None:
    if start is not None and not _alive(pid, start):
        return
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _send_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------
# Killing trees and reaping orphans


def kill_tree(
    clock: Any,
    leader: int,
    marker: str | None = None,
    grace: float = KILL_GRACE_SECONDS,
    leader_start: int | None = None,
) -> Deferred[None]:
    """
    End ``leader``'s whole tree: TERM now, KILL to survivors after ``grace``.

    Members are remembered by (pid, start time) from the first look, so a
    grandchild that ignores TERM and is reparented when its parent dies is
    still killed, and a pid reused meanwhile is left alone.  Fires once no
    member is left (or shortly after the KILL).
    """
    if leader in (0, 1, os.getpid()) or leader < 0:
        return succeed(None)
    done: Deferred[None] = Deferred()
    members = tree_members(leader, marker)
    if leader_start is None:
        info = proc_info(leader)
        leader_start = info.start if info is not None else None
    if leader_start is not None:
        members[leader] = leader_start
    deadline = clock.seconds() + grace
    state = {"polls": 0, "killed": False}

    def signal_all(sig: int) -> None:
        _send_group(leader, sig)
        for pid, start in list(members.items()):
            _send(pid, start, sig)

    def survivors() -> bool:
        table = proc_table()
        for pid, start in list(members.items()):
            info = table.get(pid)
            if info is None or info.start != start or info.state == "Z":
                del members[pid]
        group = any(p.pgid == leader and p.state != "Z" for p in table.values())
        if members or group:
            members.update(tree_members(leader, marker, table))
            return True
        return False

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

    signal_all(signal.SIGTERM)
    signal_all(signal.SIGCONT)  # a stopped process cannot act on TERM
    if grace <= 0:
        state["killed"] = True
        signal_all(signal.SIGKILL)
    KILLING.add(done)
    done.addBoth(_forget_killer, done)
    clock.callLater(0, check)
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
    reaping (and ``processEnded``) is never disturbed.
    """
    reaped = 0
    for pid in adopted_orphans():
        info = proc_info(pid)
        if info is None or info.state != "Z":
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
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


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


# --------------------------------------------------------------------------
# The one ProcessProtocol


#: Children alive now (spawned and not yet ended); shutdown ends them all.
LIVE: set[Child] = set()

OutputCallback = Callable[[int, bytes], None]


class Child(ProcessProtocol):
    """
    One child and its tree.

    :ivar pid: the session leader's pid (kept after it is reaped).
    :ivar exited: fires with the exit code at ``processExited``.
    :ivar ended: fires with the exit code once the pipes are closed too.
    :ivar reason: why the daemon ended it: ``timeout``, ``idle_timeout``,
        ``cancelled``, ``disconnected``, ``shutdown``, ``killed`` or None.
    """

    def __init__(
        self,
        clock: Any,
        on_output: OutputCallback,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        grace: float = KILL_GRACE_SECONDS,
    ) -> None:
        self.clock = clock
        self.on_output = on_output
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self.grace = grace
        self.marker = secrets.token_hex(8)
        self.pid = 0
        self.start = 0
        self.started_at = time.time()
        self.exit_code: int | None = None
        self.has_exited = False
        self.has_ended = False
        self.reason: str | None = None
        self.paused = False
        self.exited: Deferred[int | None] = Deferred()
        self.ended: Deferred[int | None] = Deferred()
        self.killing: Deferred[None] | None = None
        self._hard: IDelayedCall | None = None
        self._idle: IDelayedCall | None = None
        self._drain: IDelayedCall | None = None
        self._drain_limit: float | None = None
        self.stdin_open = False

    # -- lifecycle ---------------------------------------------------------

    def connectionMade(self) -> None:
        """Spawned: remember the leader (its pid is gone from the transport once reaped)."""
        self.pid = int(getattr(self.transport, "pid", 0) or 0)
        info = proc_info(self.pid) if self.pid else None
        self.start = info.start if info is not None else 0

    def started(self) -> None:
        """Called once spawned: arm the timers."""
        if self.has_exited:
            return
        LIVE.add(self)
        if self.timeout is not None:
            self._hard = self.clock.callLater(self.timeout, self.kill, "timeout")
        self._arm_idle()

    def _arm_idle(self) -> None:
        if self.idle_timeout is None or self.has_exited or self.paused:
            return
        if self._idle is not None and self._idle.active():
            self._idle.reset(self.idle_timeout)
        else:
            self._idle = self.clock.callLater(
                self.idle_timeout, self.kill, "idle_timeout"
            )

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        """Output: hand it on; it resets the idle and exit-drain timers."""
        if (
            self._idle is not None
            and self._idle.active()
            and self.idle_timeout is not None
        ):
            self._idle.reset(self.idle_timeout)
        if self.has_exited:
            self._arm_drain()
        self.on_output(childFD, data)

    def processExited(self, reason: Failure) -> None:
        """The command finished: this is its result; close the pipes soon."""
        self.has_exited = True
        self.exit_code = exit_code(reason)
        for timer in (self._hard, self._idle):
            if timer is not None and timer.active():
                timer.cancel()
        self._drain_limit = self.clock.seconds() + EXIT_DRAIN_MAX_SECONDS
        self._arm_drain()
        self.exited.callback(self.exit_code)

    def _arm_drain(self) -> None:
        if self.has_ended:
            return
        if self.paused and self.reason is None:
            return  # a slow reader: keep what is still in the pipes
        if self._drain is not None and self._drain.active():
            self._drain.cancel()
        delay = EXIT_DRAIN_SECONDS
        if self._drain_limit is not None:
            delay = max(0.0, min(delay, self._drain_limit - self.clock.seconds()))
        self._drain = self.clock.callLater(delay, self._close_pipes)

    def _close_pipes(self) -> None:
        if self.has_ended or self.transport is None:
            return
        within = self._drain_limit is None or self.clock.seconds() < self._drain_limit
        if within and self.reason is None and self._unread():
            # A busy reactor ran this timer before reading what is already
            # in the pipes: read it first, never drop it.
            self._drain = self.clock.callLater(
                EXIT_DRAIN_SECONDS / 10, self._close_pipes
            )
            return
        self.transport.loseConnection()

    def _unread(self) -> bool:
        """Whether a stdout/stderr pipe has bytes (or EOF) waiting to be read."""
        pipes = getattr(self.transport, "pipes", {})
        fds = [pipes[fd].fileno() for fd in (1, 2) if fd in pipes]
        if not fds:
            return False
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))

    def processEnded(self, reason: Failure) -> None:
        """Pipes closed and the leader reaped."""
        if not self.has_exited:
            self.processExited(reason)
        self.has_ended = True
        if self._drain is not None and self._drain.active():
            self._drain.cancel()
        LIVE.discard(self)
        self.ended.callback(self.exit_code)

    # -- control -----------------------------------------------------------

    def kill(self, reason: str = "killed") -> Deferred[None]:
        """End the whole tree (TERM, grace, KILL); idempotent."""
        if self.reason is None:
            self.reason = reason
        if self.killing is None:
            self.killing = kill_tree(
                self.clock, self.pid, self.marker, self.grace, self.start or None
            )
            self.killing.addBoth(lambda _: reap_orphans() and None)
        if self.paused:
            # A killed child's leftovers are not worth waiting for.
            self.resume_reading()
        if self.has_exited:
            self._arm_drain()
        return self.killing

    def pause_reading(self) -> None:
        """A slow client: stop reading (the child blocks in write)."""
        if self.paused or self.has_ended or self.transport is None:
            return
        self.paused = True
        if self._idle is not None and self._idle.active():
            self._idle.cancel()
        if self._drain is not None and self._drain.active():
            self._drain.cancel()
        self.transport.pauseProducing()  # type: ignore[attr-defined]

    def resume_reading(self) -> None:
        """The client drained: read again."""
        if not self.paused:
            return
        self.paused = False
        if self.transport is not None and not self.has_ended:
            self.transport.resumeProducing()  # type: ignore[attr-defined]
        self._arm_idle()
        if self.has_exited:
            self._arm_drain()

    def write_stdin(self, data: bytes) -> None:
        """Queue bytes for the stdin pipe."""
        if self.transport is not None and self.stdin_open:
            self.transport.write(data)

    def close_stdin(self) -> None:
        """Send EOF."""
        if self.transport is not None and self.stdin_open:
            self.stdin_open = False
            self.transport.closeStdin()

    def stdin_pending(self) -> int:
        """Bytes written to stdin but not yet taken by the child."""
        writer = (
            getattr(self.transport, "pipes", {}).get(0)
            if self.transport is not None
            else None
        )
        if writer is None:
            return 0
        return len(getattr(writer, "dataBuffer", b"")) + int(
            getattr(writer, "_tempDataLen", 0)
        )

    def childConnectionLost(self, childFD: int) -> None:
        """A pipe closed (stdin: the child closed it or exited)."""
        if childFD == 0:
            self.stdin_open = False


def signal_child(child: Child, sig: int) -> None:
    """
    Send ``sig`` to a running child's process group and to the members of
    its tree that left the group (never to a pid reused since).
    """
    if child.has_exited or child.pid <= 1 or child.pid == os.getpid():
        return
    _send_group(child.pid, sig)
    table = proc_table()
    for pid, start in tree_members(child.pid, child.marker, table).items():
        if table[pid].pgid != child.pid:
            _send(pid, start, sig)


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
) -> None:
    """
    ``spawnProcess`` in ``cwd``, on Twisted's posix_spawn path when possible.

    Twisted forks (and runs Python in the child before exec) whenever
    ``path`` differs from the daemon's own working directory or a user is
    switched; that costs several times a posix_spawn.  So, unless a user
    is switched: when the daemon has no other thread that could observe it,
    its working directory is moved to ``cwd`` just for the spawn; otherwise
    ``env -C`` changes directory in the child.  The daemon itself never
    resolves a relative path (its working directory is twistd's rundir).
    """
    if uid is None and gid is None and cwd != os.getcwd():
        if threading.active_count() == 1:
            previous = os.getcwd()
            os.chdir(cwd)
            try:
                spawn_session(
                    reactor, child, args[0], args, env, cwd, None, None, child_fds
                )
            finally:
                os.chdir(previous)
            return
        if _ENV_CHDIR:
            args = [ENV_PROGRAM, "-C", cwd, "--", *args]
            spawn_session(
                reactor, child, args[0], args, env, None, None, None, child_fds
            )
            return
    spawn_session(reactor, child, args[0], args, env, cwd, uid, gid, child_fds)


def spawn(
    reactor: Any,
    child: Child,
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str,
    run_as: RunAs | None = None,
    stdin_pipe: bool = False,
) -> Child:
    """
    Start ``argv`` under ``child``, in its own session.

    The executable is resolved against the child's PATH (never the
    daemon's) and passed absolute, so both of Twisted's spawn paths behave
    alike.

    :raises FileNotFoundError: no such executable.
    :raises OSError: the spawn itself failed.
    """
    if not argv:
        raise FileNotFoundError("empty command")
    env = dict(env)
    if run_as is not None:
        run_as.apply(env)
    executable = find_executable(argv[0], env)
    if executable is None:
        raise FileNotFoundError(f"command not found: {argv[0]}")
    env[TREE_MARKER] = child.marker
    args = [executable, *argv[1:]]
    devnull = None
    child_fds: dict[int, Any] = {1: "r", 2: "r"}
    if stdin_pipe:
        child_fds[0] = "w"
    else:
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        child_fds[0] = devnull
    uid = gid = None
    if run_as is not None and os.geteuid() == 0:
        uid, gid = run_as.uid, run_as.gid
    try:
        _spawn_in(reactor, child, args, env, cwd, uid, gid, child_fds)
    finally:
        if devnull is not None:
            os.close(devnull)
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


async def run_collect(
    reactor: Any,
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str,
    timeout: float | None,
    max_output_bytes: int,
    idle_timeout: float | None = None,
    run_as: RunAs | None = None,
    stdin: bytes | None = None,
) -> RunResult:
    """
    Run ``argv`` to completion and collect its output.

    Each stream keeps its head and tail within ``max_output_bytes``.  Past
    ``timeout`` (or ``idle_timeout`` seconds without output) the whole tree
    is ended and the result says so.  Cancelling the awaiting Deferred ends
    the tree too.

    :raises FileNotFoundError: the executable is not on the child's PATH.
    """
    cap = DEFAULT_CAPTURE_BYTES if max_output_bytes is None else max_output_bytes
    out, err = HeadTail(cap), HeadTail(cap)
    sinks = {1: out, 2: err}

    def on_output(fd: int, data: bytes) -> None:
        sink = sinks.get(fd)
        if sink is not None:
            sink.write(data)

    child = Child(reactor, on_output, timeout=timeout, idle_timeout=idle_timeout)
    began = time.monotonic()
    spawn(
        reactor,
        child,
        argv,
        env=env,
        cwd=cwd,
        run_as=run_as,
        stdin_pipe=stdin is not None,
    )
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


def end_all(clock: Any, grace: float = KILL_GRACE_SECONDS) -> Deferred[Any]:
    """
    End every live child's tree and every adopted orphan; fires when all
    are gone (the caller bounds the wait).
    """
    waits: list[Deferred[Any]] = []
    for child in list(LIVE):
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


# --------------------------------------------------------------------------
# /shell/stream: lines as they complete, coalesced into few writes

_NEEDS_JSON = re.compile(rb'[\x00-\x09\x0b-\x1f"\\\x80-\xff]')
_STREAM_NAMES = {1: "stdout", 2: "stderr"}
_PREFIX = {
    fd: f'event: {name}\ndata: {{"data":"'.encode()
    for fd, name in _STREAM_NAMES.items()
}
_SUFFIX = b'"}\n\n'


class LineStream:
    """
    Turns a child's output into SSE ``stdout``/``stderr`` line events.

    Lines are sent in the order their reads arrived, each as soon as it is
    complete; writes closer together than ``flush_seconds`` are coalesced
    (the first one goes out at once, so the first event is never delayed).
    Each stream sends its first ``cap // 2`` bytes live and keeps the last
    ``cap // 2`` for the end, announcing what was dropped between them.

    :param write: takes the frame bytes (``SSEChannel.write_raw``).
    """

    def __init__(
        self,
        clock: Any,
        write: Callable[[bytes], None],
        cap: int,
        flush_seconds: float = STREAM_FLUSH_SECONDS,
        flush_bytes: int = STREAM_FLUSH_BYTES,
        max_line: int = MAX_LINE_BYTES,
    ) -> None:
        self.clock = clock
        self.write = write
        self.flush_seconds = flush_seconds
        self.flush_bytes = flush_bytes
        self.max_line = max_line
        self._partial = {1: b"", 2: b""}
        self._live = {1: cap // 2, 2: cap // 2}
        self._tail_cap = cap - cap // 2
        self._tail: dict[int, deque[bytes]] = {1: deque(), 2: deque()}
        self._tail_len = {1: 0, 2: 0}
        self.dropped = {1: 0, 2: 0}
        self._pending: list[bytes] = []
        self._pending_len = 0
        self._last_flush = -1e9
        self._timer: IDelayedCall | None = None
        self.closed = False

    # -- input -------------------------------------------------------------

    def feed(self, fd: int, data: bytes) -> None:
        """A read from the child's stdout (1) or stderr (2)."""
        if fd not in _PREFIX or self.closed:
            return
        buf = self._partial[fd] + data if self._partial[fd] else data
        cut = buf.rfind(b"\n")
        if cut >= 0:
            self._lines(fd, buf[:cut])
            buf = buf[cut + 1 :]
        while len(buf) >= self.max_line:
            self._line(fd, buf[: self.max_line])
            buf = buf[self.max_line :]
        self._partial[fd] = buf
        self._queued()

    def _lines(self, fd: int, block: bytes) -> None:
        size = len(block) + 1
        if size <= self._live[fd] and _NEEDS_JSON.search(block) is None:
            self._live[fd] -= size
            self._add(
                _PREFIX[fd] + block.replace(b"\n", _SUFFIX + _PREFIX[fd]) + _SUFFIX
            )
            return
        for line in block.split(b"\n"):
            self._line(fd, line)

    def _line(self, fd: int, line: bytes) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        size = len(line) + 1
        if size <= self._live[fd]:
            self._live[fd] -= size
            self._add(
                frame(_STREAM_NAMES[fd], {"data": line.decode("utf-8", "replace")})
            )
            return
        self._live[fd] = 0
        tail = self._tail[fd]
        tail.append(line)
        self._tail_len[fd] += size
        while self._tail_len[fd] > self._tail_cap and tail:
            old = tail.popleft()
            self._tail_len[fd] -= len(old) + 1
            self.dropped[fd] += len(old) + 1

    # -- output ------------------------------------------------------------

    def _add(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_len += len(data)

    def _queued(self) -> None:
        if not self._pending:
            return
        waited = self.clock.seconds() - self._last_flush
        if self._pending_len >= self.flush_bytes or waited >= self.flush_seconds:
            self.flush()
        elif self._timer is None:
            self._timer = self.clock.callLater(self.flush_seconds - waited, self.flush)

    def flush(self) -> None:
        """Write whatever is pending as one write."""
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending.clear()
        self._pending_len = 0
        self._last_flush = self.clock.seconds()
        self.write(data)

    def event(self, name: str, data: Any) -> None:
        """Queue a non-line event (``truncated``, ``error``, ``exit``)."""
        self._add(frame(name, data))

    def finish(self) -> None:
        """The child's pipes are closed: last partial lines, then the kept tails."""
        for fd in (1, 2):
            if self._partial[fd]:
                self._line(fd, self._partial[fd])
                self._partial[fd] = b""
        for fd in (1, 2):
            if self.dropped[fd] or self._tail[fd]:
                if self.dropped[fd]:
                    self.event(
                        "truncated",
                        {
                            "stream": _STREAM_NAMES[fd],
                            "dropped_bytes": self.dropped[fd],
                        },
                    )
                for line in self._tail[fd]:
                    self.event(
                        _STREAM_NAMES[fd], {"data": line.decode("utf-8", "replace")}
                    )
                self._tail[fd].clear()

    def close(self) -> None:
        """No more writes (flushes first)."""
        self.flush()
        self.closed = True


def timeout_error(child: Child) -> dict[str, Any] | None:
    """The ``error`` of a child the daemon ended on a timeout, else None."""
    if child.reason == "timeout":
        return {
            "error": f"Command timed out after {child.timeout:g} seconds; its process group was killed",
            "type": "TimeoutError",
            "code": "timeout",
        }
    if child.reason == "idle_timeout":
        return {
            "error": (
                f"IdleTimeout: no output for {child.idle_timeout:g} seconds; "
                "its process group was killed"
            ),
            "type": "TimeoutError",
            "code": "idle_timeout",
        }
    return None


# --------------------------------------------------------------------------
# Background processes


class Managed:
    """
    One background process: its child, its label, and its output log.

    Output is recorded as it is read, one event per read (``stdout`` or
    ``stderr``, ``{"data": text}``), then ``error`` (timeouts) and ``exit``.
    """

    def __init__(
        self, child: Child, command: str, tag: str | None, retention: int
    ) -> None:
        self.child = child
        self.command = command
        self.tag = tag
        self.log = EventLog(retention)
        self.output_bytes = 0
        self.ended_at: float | None = None
        self._decoders = {
            fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in _STREAM_NAMES
        }

    @property
    def pid(self) -> int:
        """The leader's pid."""
        return self.child.pid

    @property
    def running(self) -> bool:
        """Whether the command has not exited yet."""
        return not self.child.has_exited

    def on_output(self, fd: int, data: bytes) -> None:
        """Record one read."""
        decoder = self._decoders.get(fd)
        if decoder is None:
            return
        self.output_bytes += len(data)
        text = decoder.decode(data)
        if text:
            self.log.append(
                _STREAM_NAMES[fd], {"data": text}, len(data) + EVENT_OVERHEAD_BYTES
            )

    def on_ended(self, code: int | None) -> None:
        """Pipes closed: flush decoders, then ``error`` and ``exit``; close the log."""
        self.ended_at = time.time()
        for fd, decoder in self._decoders.items():
            text = decoder.decode(b"", final=True)
            if text:
                self.log.append(
                    _STREAM_NAMES[fd], {"data": text}, len(text) + EVENT_OVERHEAD_BYTES
                )
        error = timeout_error(self.child)
        if error is not None:
            self.log.append("error", error)
        self.log.append("exit", {"exit_code": code})
        self.log.close()

    def dropped_bytes(self) -> int:
        """Output bytes no longer kept."""
        _, events = self.log.since(0)
        kept = sum(
            e.size - EVENT_OVERHEAD_BYTES
            for e in events
            if e.event in ("stdout", "stderr")
        )
        return max(0, self.output_bytes - kept)

    def describe(self) -> dict[str, Any]:
        """The fields of process_list / process_get."""
        return {
            "pid": self.pid,
            "command": self.command,
            "tag": self.tag,
            "state": "running" if self.running else "exited",
            "started_at": self.child.started_at,
            "exit_code": None if self.running else self.child.exit_code,
            "stdin": self.child.stdin_open,
        }


class ProcessService(Service):
    """
    The daemon's table of background processes and the keeper of every
    child's tree.

    Running processes are capped by the caller (``max_processes``); exited
    ones stay listed, the :data:`PROCESS_HISTORY` most recent.  Stopping
    the service ends every live child's tree (background, shell, code runs)
    and every adopted orphan, within the kill grace.
    """

    name = "processes"

    def __init__(self, reactor: Any, grace: float = KILL_GRACE_SECONDS) -> None:
        self.reactor = reactor
        self.grace = grace
        self.table: OrderedDict[int, Managed] = OrderedDict()
        self.reaper = OrphanReaper(reactor)
        self.subreaper = False

    def startService(self) -> None:
        """Become the subreaper of every descendant and reap orphans."""
        super().startService()  # type: ignore[no-untyped-call]
        self.subreaper = become_subreaper()
        if self.subreaper or os.getpid() == 1:
            self.reaper.start()

    def stopService(self) -> Deferred[Any]:
        """End every child's tree and adopted orphan; bounded by the grace."""
        super().stopService()  # type: ignore[no-untyped-call]
        self.reaper.stop()
        d = end_all(self.reactor, self.grace)
        d.addTimeout(self.grace + 2.0, self.reactor)
        d.addErrback(
            lambda f: log.warn("sandboxd: children still ending at shutdown: {f}", f=f)
        )
        d.addBoth(lambda _: reap_orphans() and None)
        return d

    def running_count(self) -> int:
        """Background processes not yet exited."""
        return sum(1 for m in self.table.values() if m.running)

    def start(
        self,
        argv: list[str],
        *,
        command: str,
        env: dict[str, str],
        cwd: str,
        run_as: RunAs | None,
        stdin_pipe: bool,
        tag: str | None,
        retention: int,
        timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> Managed:
        """
        Start a background process and record it.

        :raises FileNotFoundError: no such executable.
        """
        holder: list[Managed] = []

        def on_output(fd: int, data: bytes) -> None:
            holder[0].on_output(fd, data)

        child = Child(
            self.reactor, on_output, timeout=timeout, idle_timeout=idle_timeout
        )
        managed = Managed(child, command, tag, retention)
        holder.append(managed)
        spawn(
            self.reactor,
            child,
            argv,
            env=env,
            cwd=cwd,
            run_as=run_as,
            stdin_pipe=stdin_pipe,
        )
        self.table.pop(child.pid, None)  # a pid reused after an old entry exited
        self.table[child.pid] = managed
        child.ended.addCallback(managed.on_ended)
        child.exited.addCallback(lambda _: self._prune())
        return managed

    def _prune(self) -> None:
        exited = [pid for pid, m in self.table.items() if not m.running]
        for pid in exited[: max(0, len(exited) - PROCESS_HISTORY)]:
            del self.table[pid]

    def get(self, pid: int) -> Managed | None:
        """A managed process by pid."""
        return self.table.get(pid)

    def list(self, tag: str | None = None) -> list[Managed]:
        """Managed processes, oldest first, optionally with one tag."""
        return [m for m in self.table.values() if tag is None or m.tag == tag]
