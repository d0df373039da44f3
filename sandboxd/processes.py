# -*- test-case-name: tests.test_processes -*-
"""
The process machinery of SPEC §7.4: every child the daemon runs through
pipes (``/shell``, ``/shell/stream``, background processes, code runs, git,
package listings) is driven from here.

- :class:`Child` is the one ``ProcessProtocol``: the command runs in its
  own session, stdin is ``/dev/null`` unless a
  pipe is asked for, ``processExited`` means "finished" and the pipes are
  closed shortly after (a grandchild holding them cannot hang a call), hard
  and idle timeouts end the whole tree, and reading can be paused by a slow
  client.
- Trees are found and ended by :mod:`sandboxd.proctree`; the lines of
  ``/shell/stream`` are framed by :mod:`sandboxd.linestream`.
- :func:`run_collect` runs a command to completion and collects its
  output with the head-and-tail cap of :class:`HeadTail`.
- :class:`ProcessService` is the table of background processes, each with
  an :class:`~sandboxd.eventlog.EventLog` of its output; stopping it ends
  every child's tree.
"""

from __future__ import annotations

import codecs
import functools
import os
import secrets
import select
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import attrs
from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred, DeferredList, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from sandboxd.children import (
    RunAs,
    exit_code,
    find_executable,
    spawn_anywhere,
    spawn_session,
    spawn_session_later,
)
from sandboxd.eventlog import EventLog
from sandboxd.linestream import STREAM_NAMES
from sandboxd.policy.defaults import (
    ENDPOINT_LIMITS,
    EVENT_OVERHEAD_BYTES,
    EXIT_DRAIN_MAX_SECONDS,
    EXIT_DRAIN_SECONDS,
    KILL_GRACE_SECONDS,
    PROCESS_HISTORY,
)
from sandboxd.proctree import (
    KILLING,
    TREE_MARKER,
    OrphanReaper,
    adopted_orphans,
    become_subreaper,
    kill_tree,
    never_signalled,
    proc_info,
    reap_orphans,
    signal_group,
    signal_member,
    tree_members,
    tree_table,
)
from sandboxd.waiters import Waiters

log = Logger(namespace="sandboxd.processes")

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
# The one ProcessProtocol


#: Children alive now (spawned and not yet ended); shutdown ends them all.
LIVE: set[Child] = set()

#: Children whose spawn is on a worker thread (no process yet).
PENDING: set[Child] = set()

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
        self._spawned: Waiters[None] = Waiters()

    # -- lifecycle ---------------------------------------------------------

    def connectionMade(self) -> None:
        """
        Spawned: remember the leader's pid (the transport forgets it once
        reaped).

        Its start time is not read here: /proc/<pid>/stat of a child still
        loading its executable waits on that child, and until Twisted reaps
        the leader its pid cannot be reused anyway (see :meth:`kill`).
        """
        self.pid = int(getattr(self.transport, "pid", 0) or 0)

    @property
    def pending(self) -> bool:
        """Whether its spawn is still on a worker thread (no process yet)."""
        return self in PENDING

    def spawning(self, later: Deferred[Any], stdin_pipe: bool) -> None:
        """
        Its spawn is on a worker thread: start (and carry out a kill asked
        for meanwhile) once ``later`` has the process.
        """
        PENDING.add(self)

        def done(_: Any) -> None:
            PENDING.discard(self)
            self.stdin_open = stdin_pipe
            self.started()
            if self.killing is not None:
                asked, self.killing = self.killing, None
                self.kill(self.reason or "killed").chainDeferred(asked)
            self._spawned.fire(None)

        def failed(failure: Failure) -> None:
            PENDING.discard(self)
            # Never started: over, for whoever waits on it (shutdown).
            self.has_exited = self.has_ended = True
            if self.killing is not None and not self.killing.called:
                self.killing.callback(None)
            self.ended.callback(None)
            self._spawned.fail(failure)

        later.addCallbacks(done, failed)

    def when_spawned(self) -> Deferred[None]:
        """
        Fires once the child runs (at once unless its spawn is still on a
        worker thread); fails with that spawn's ``OSError``.  Cancelling
        it leaves the child alone: whoever cancels decides its fate.
        """
        if not self.pending:
            return succeed(None)
        return self._spawned.wait()

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
        if self.pending:
            # No process yet: ended as soon as its spawn is done.
            if self.killing is None:
                self.killing = Deferred()
            return self.killing
        if self.killing is None:
            # An unreaped leader (even a zombie) still owns its pid, so
            # kill_tree may read its start time now; a reaped one's pid may
            # already belong to someone else.
            self.killing = kill_tree(
                self.clock,
                self.pid,
                self.marker,
                self.grace,
                leader_reaped=self.has_exited,
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
    if child.has_exited or never_signalled(child.pid):
        return
    signal_group(child.pid, sig)
    table = tree_table(child.pid)
    for pid, start in tree_members(child.pid, child.marker, table).items():
        if table[pid].pgid != child.pid:
            signal_member(pid, start, sig)


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
    ``spawnProcess`` in ``cwd``, on a posix_spawn path when possible.

    :func:`~sandboxd.children.spawn_session` starts a child in any
    directory with one ``posix_spawn`` where the C library allows
    (:mod:`sandboxd.spawn`).  Elsewhere Twisted forks (and runs Python in the child before exec) whenever
    ``path`` differs from the daemon's own working directory; that costs
    several times a posix_spawn.  So when the daemon has no other thread
    that could observe it, its working directory is moved to ``cwd`` just
    for the spawn; otherwise ``env -C`` changes directory in the child.
    (A user switch goes through ``setpriv``, see
    :class:`~sandboxd.children.SessionProcess`.)  The daemon itself never
    resolves a relative path.
    """
    if not spawn_anywhere() and cwd != os.getcwd():
        if threading.active_count() == 1:
            previous = os.getcwd()
            os.chdir(cwd)
            try:
                spawn_session(
                    reactor, child, args[0], args, env, cwd, uid, gid, child_fds
                )
            finally:
                os.chdir(previous)
            return
        if _ENV_CHDIR and uid is None:
            # (As another user, env would change directory after the switch,
            # where the user may not be allowed to: the fork path does it
            # before.)
            args = [ENV_PROGRAM, "-C", cwd, "--", *args]
            spawn_session(reactor, child, args[0], args, env, None, uid, gid, child_fds)
            return
    spawn_session(reactor, child, args[0], args, env, cwd, uid, gid, child_fds)


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
    env: dict[str, str],
    cwd: str,
    run_as: RunAs | None = None,
    stdin_pipe: bool = False,
    may_wait: bool = False,
) -> Child:
    """
    Start ``argv`` under ``child``, in its own session.

    With ``may_wait``, a caller that can wait for its child (see
    :meth:`Child.when_spawned`) lets the spawn happen on a worker thread
    while spawns are slow (:class:`~sandboxd.children.SpawnTimes`), so the
    reactor keeps serving meanwhile; a failure of that spawn comes through
    ``when_spawned``.

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
    child_fds: dict[int, Any] = {1: "r", 2: "r", 0: "w" if stdin_pipe else _devnull()}
    uid = gid = None
    if run_as is not None and os.geteuid() == 0:
        uid, gid = run_as.uid, run_as.gid
    if may_wait:
        later = spawn_session_later(
            reactor, child, args[0], args, env, cwd, uid, gid, child_fds
        )
        if later is not None:
            child.spawning(later, stdin_pipe)
            return child
    _spawn_in(reactor, child, args, env, cwd, uid, gid, child_fds)
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
        may_wait=True,
    )
    if child.pending:
        try:
            await child.when_spawned()
        except CancelledError:
            child.kill("cancelled")
            raise
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
    for child in list(LIVE | PENDING):
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
            fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in STREAM_NAMES
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
                STREAM_NAMES[fd], {"data": text}, len(data) + EVENT_OVERHEAD_BYTES
            )

    def on_ended(self, code: int | None) -> None:
        """Pipes closed: flush decoders, then ``error`` and ``exit``; close the log."""
        self.ended_at = time.time()
        for fd, decoder in self._decoders.items():
            text = decoder.decode(b"", final=True)
            if text:
                self.log.append(
                    STREAM_NAMES[fd], {"data": text}, len(text) + EVENT_OVERHEAD_BYTES
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
        #: Started, with the spawn still on a worker thread (not in the table yet).
        self.starting = 0
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
        """Background processes not yet exited (or still being spawned)."""
        return self.starting + sum(1 for m in self.table.values() if m.running)

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
        may_wait: bool = False,
    ) -> Managed:
        """
        Start a background process and record it.

        With ``may_wait`` (see :func:`spawn`) the spawn may still be on a
        worker thread on return: the process is recorded once it runs, and
        ``managed.child.when_spawned()`` says when (or why not).

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
            may_wait=may_wait,
        )
        if not child.pending:
            self._record(managed)
            return managed
        self.starting += 1

        def spawned(_: object) -> None:
            self.starting -= 1
            self._record(managed)

        def not_spawned(_: Failure) -> None:
            # Whoever started it hears why through its own when_spawned().
            self.starting -= 1

        child.when_spawned().addCallbacks(spawned, not_spawned)
        return managed

    def _record(self, managed: Managed) -> None:
        child = managed.child
        self.table.pop(child.pid, None)  # a pid reused after an old entry exited
        self.table[child.pid] = managed
        child.ended.addCallback(managed.on_ended)
        child.exited.addCallback(lambda _: self._prune())

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
