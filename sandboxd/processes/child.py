# -*- test-case-name: tests.processes.test_children -*-
"""
The one ``ProcessProtocol`` every piped child of the daemon runs under
(SPEC §7.4): :class:`Child` runs the command in its own session, with stdin
from ``/dev/null`` unless a pipe is asked for; ``processExited`` means
"finished" and the pipes are closed shortly after (a grandchild holding
them cannot hang a call); hard and idle timeouts end the whole tree; reading
can be paused by a slow client.  :class:`HeadTail` is the output cap that
keeps the start and the end.
"""

from __future__ import annotations

import errno
import math
import os
import select
import signal
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IPushProducer
from twisted.internet.main import CONNECTION_DONE, CONNECTION_LOST
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from sandboxd.access.metrics import child_timed_out
from sandboxd.errors import ApiError, timed_out
from sandboxd.policy.defaults import (
    ENDPOINT_LIMITS,
    EXIT_DRAIN_MAX_SECONDS,
    EXIT_DRAIN_SECONDS,
    KILL_GRACE_SECONDS,
)
from sandboxd.processes.command import exit_code
from sandboxd.processes.table import ChildTable
from sandboxd.processes.tree import (
    Window,
    boot_ticks,
    kill_tree,
    leftovers,
    never_signalled,
    new_marker,
    reap_orphans,
    signal_group,
    signal_leftovers,
    signal_member,
    tree_members,
    tree_table,
)
from sandboxd.waiters import Waiters

log = Logger(namespace="sandboxd.processes")

#: The names of a child's output streams, by file descriptor.
STREAM_NAMES = {1: "stdout", 2: "stderr"}

#: A capture with no ``max_output_bytes`` keeps what /shell keeps.
DEFAULT_CAPTURE_BYTES: int = ENDPOINT_LIMITS["shell"]["max_output_bytes"]

#: A background process's log with no ``max_output_bytes`` keeps this much.
DEFAULT_RETENTION_BYTES: int = ENDPOINT_LIMITS["process_start"]["max_output_bytes"]


# --------------------------------------------------------------------------
# Output caps


#: Output chunks under this many bytes are copied together into one
#: buffer; bigger ones are kept as the objects they arrived as.
SMALL_CHUNK_BYTES = 4096


class HeadTail:
    """
    A byte sink that keeps the first and the last ``cap // 2`` bytes.

    Memory stays bounded by ``cap`` however much is written; what falls in
    between is counted in :attr:`dropped_bytes`, so an error at the end of
    a huge log is never lost.

    A chunk of :data:`SMALL_CHUNK_BYTES` or more is kept as it is, not
    copied into a buffer (the head of a 10 MiB output is then never copied
    before the one join that returns it); smaller ones are gathered into
    one buffer, so a child that writes a byte at a time costs no object
    per byte.
    """

    def __init__(self, cap: int) -> None:
        self.cap = max(0, cap)
        self._head_cap = self.cap // 2
        self._tail_cap = self.cap - self._head_cap
        self._head: list[bytes | bytearray] = []
        self._head_len = 0
        self._tail: deque[bytes | bytearray] = deque()
        self._tail_len = 0
        self.dropped_bytes = 0
        self.total_bytes = 0

    @property
    def truncated(self) -> bool:
        """Whether anything was dropped."""
        return self.dropped_bytes > 0

    def write(self, data: bytes | bytearray) -> None:
        """Take the next bytes."""
        self.total_bytes += len(data)
        room = self._head_cap - self._head_len
        if room > 0:
            piece = data[:room] if len(data) > room else data
            _keep(self._head, piece)
            self._head_len += len(piece)
            data = data[len(piece) :] if len(piece) < len(data) else b""
        if not data:
            return
        if len(data) >= self._tail_cap:
            self.dropped_bytes += self._tail_len + len(data) - self._tail_cap
            self._tail.clear()
            data = data[len(data) - self._tail_cap :] if self._tail_cap else b""
            self._tail_len = 0
        if data:
            _keep(self._tail, data)
            self._tail_len += len(data)
        while self._tail_len > self._tail_cap:
            excess = self._tail_len - self._tail_cap
            first = self._tail[0]
            if len(first) <= excess:
                self._tail.popleft()
                self._tail_len -= len(first)
                self.dropped_bytes += len(first)
            else:
                if isinstance(first, _Gathered):
                    del first[:excess]  # in place, no copy of the rest
                else:
                    self._tail[0] = first[excess:]
                self._tail_len -= excess
                self.dropped_bytes += excess

    def value(self, marker: bool = True) -> bytes:
        """
        Head and tail, with a line naming the dropped bytes between them.

        The line counts against the cap (the cap bounds everything
        returned): head and tail give up room for it, and what they give
        up is counted in :attr:`dropped_bytes`, which the line then names.
        """
        if not self.truncated or not marker:
            # One copy of all of it (a 10 MiB output: head, tail, whole
            # made one after the other cost three).
            return b"".join((*self._head, *self._tail))
        head = b"".join(self._head)
        tail = b"".join(self._tail)
        middle = self._marker()
        while len(head) + len(middle) + len(tail) > self.cap:
            over = len(head) + len(middle) + len(tail) - self.cap
            if over > len(head) + len(tail):
                return self._marker()[: self.cap]  # a cap smaller than the line
            from_head = min(len(head), over // 2)
            from_tail = min(len(tail), over - from_head)
            from_head = over - from_tail
            head = head[: len(head) - from_head]
            tail = tail[from_tail:]
            self._head = [head] if head else []
            self._head_len = len(head)
            self._tail = deque([tail]) if tail else deque()
            self._tail_len = len(tail)
            self.dropped_bytes += over
            middle = self._marker()  # one digit longer, perhaps: look again
        return b"".join((head, middle, tail))

    @property
    def kept_bytes(self) -> int:
        """The bytes kept (head and tail), before any marker."""
        return self._head_len + self._tail_len

    def shrink(self, cap: int) -> None:
        """
        Keep at most ``cap`` bytes from now on: what is kept beyond it is
        dropped from the middle (the head's end and the tail's start) and
        counted, so :meth:`value` fits ``cap`` and names what is gone.
        """
        cap = max(0, cap)
        if cap >= self.cap:
            return
        self.cap = cap
        self._head_cap = cap // 2
        self._tail_cap = cap - self._head_cap
        head = b"".join(self._head)
        tail = b"".join(self._tail)
        if len(head) + len(tail) > cap:
            kept_head = head[: self._head_cap]
            rest = head[len(kept_head) :] + tail
            kept_tail = rest[len(rest) - self._tail_cap :] if self._tail_cap else b""
            self.dropped_bytes += (
                len(head) + len(tail) - len(kept_head) - len(kept_tail)
            )
            head, tail = kept_head, kept_tail
        self._head = [head] if head else []
        self._head_len = len(head)
        self._tail = deque([tail]) if tail else deque()
        self._tail_len = len(tail)

    def _marker(self) -> bytes:
        return f"\n[... {self.dropped_bytes} bytes dropped ...]\n".encode()


def share(sinks: list[HeadTail], budget: int) -> None:
    """
    Shrink ``sinks`` to ``budget`` bytes together (markers included): each
    gets an even share, and what one leaves unused goes to the others.
    """
    # A marker's line, which value() fits within its sink's cap.
    marker = len(HeadTail(0)._marker()) + 20
    need = [s.kept_bytes + (marker if s.truncated else 0) for s in sinks]
    if sum(need) <= budget:
        return
    left = budget
    order = sorted(range(len(sinks)), key=lambda i: need[i])
    for place, index in enumerate(order):
        fair = left // (len(order) - place)
        give = min(need[index], fair)
        sinks[index].shrink(give)
        left -= give


def _keep(
    chunks: list[bytes | bytearray] | deque[bytes | bytearray], data: bytes | bytearray
) -> None:
    """
    Add ``data`` to ``chunks``: as it is when big, else copied into the
    last chunk when that is a buffer of small ones.
    """
    if len(data) >= SMALL_CHUNK_BYTES:
        chunks.append(data)
        return
    last = chunks[-1] if chunks else None
    if isinstance(last, _Gathered):
        last += data
    else:
        chunks.append(_Gathered(data))


class _Gathered(bytearray):
    """
    A buffer of small chunks, :class:`HeadTail`'s own: the only kind it
    grows or trims in place (a big chunk that came as a ``bytearray`` is
    the caller's, perhaps kept elsewhere too, and never changed).
    """


# --------------------------------------------------------------------------
# The one ProcessProtocol


OutputCallback = Callable[[int, bytes], None]


def _reads_with(fd: int, take: Callable[[int], int]) -> Callable[[], Any]:
    """
    A pipe reader's ``doRead`` that reads ``fd`` with ``take`` (which hands
    on what it read and returns how many bytes, 0 at the end), in Twisted's
    terms: nothing for a read that found nothing to read yet, the pipe's
    end, or its loss on any other error.
    """

    def do_read() -> Any:
        try:
            got = take(fd)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EINTR):
                return None
            return CONNECTION_LOST
        return None if got else CONNECTION_DONE

    return do_read


class Child(ProcessProtocol):
    """
    One child and its tree.

    :ivar pid: the session leader's pid (kept after it is reaped).
    :ivar exited: fires with the exit code at ``processExited``.
    :ivar ended: fires with the exit code once the pipes are closed too.
    :ivar reason: why the daemon ended it: ``timeout``, ``idle_timeout``,
        ``cancelled``, ``disconnected``, ``shutdown``, ``killed`` or None.
    :ivar window: with ``claims_escapees``, the clock ticks during which
        its leader ran (see :func:`sandboxd.processes.tree.tree_members`),
        else None.
    """

    def __init__(
        self,
        clock: Any,
        on_output: OutputCallback,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        grace: float = KILL_GRACE_SECONDS,
        claims_escapees: bool = False,
    ) -> None:
        """
        :param claims_escapees: its tree also counts the processes that
            left some tree and cleared their environment while it ran
            (a user's command: its kill must not miss ``setsid -f env -i
            ...``, which nothing else ties to it; not a long-lived helper,
            which would take every such process started in its lifetime).
        """
        for name, bound in (("timeout", timeout), ("idle_timeout", idle_timeout)):
            # Refused here, before anything is spawned: the timer would
            # refuse it only once the child runs, leaving it untimed and
            # untracked behind an error answer.
            if bound is not None and not (math.isfinite(bound) and bound >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, not {bound!r}")
        self.clock = clock
        self.on_output = on_output
        #: The table of the daemon that spawned it (set by ``spawn``).
        self.table = ChildTable()
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self.grace = grace
        #: Its tree's marker, given at its spawn (:func:`~sandboxd.processes.run.spawn`).
        self.marker = new_marker()
        # Taken before the spawn: no process of its tree started earlier.
        self.window: Window | None = (
            (boot_ticks() - 1, None) if claims_escapees else None
        )
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
        #: Once the leader exited: how long the pipes may stay quiet before
        #: they are closed (None: until whoever holds them closes them),
        #: and how long they are kept at most.
        self.drain_quiet: float | None = EXIT_DRAIN_SECONDS
        self.drain_max = EXIT_DRAIN_MAX_SECONDS
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
        return self in self.table.pending

    def spawning(self, later: Deferred[Any], stdin_pipe: bool) -> None:
        """
        Its spawn is on a worker thread: start (and carry out a kill asked
        for meanwhile) once ``later`` has the process.
        """
        self.table.pending.add(self)

        def done(_: Any) -> None:
            self.table.pending.discard(self)
            self.stdin_open = stdin_pipe
            self.started()
            if self.killing is not None:
                asked, self.killing = self.killing, None
                self.kill(self.reason or "killed").chainDeferred(asked)
            self._spawned.fire(None)

        def failed(failure: Failure) -> None:
            self.table.pending.discard(self)
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
        self.table.live.add(self)
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
        # Most children have neither timer to reset: no call for them on
        # every read.
        if self._idle is not None or self.has_exited:
            self._heard()
        self.on_output(childFD, data)

    def _heard(self) -> None:
        """The child wrote: its idle and exit-drain timers start again."""
        if (
            self._idle is not None
            and self._idle.active()
            and self.idle_timeout is not None
        ):
            self._idle.reset(self.idle_timeout)
        if self.has_exited:
            self._arm_drain()

    def wait_for_pipes(self, seconds: float) -> None:
        """
        Once the leader exits, keep reading until whatever still holds its
        output pipes (a job it left in the background, ``cmd &``) closes
        them, for at most ``seconds``: its output is kept rather than cut
        off with a SIGPIPE.
        """
        self.drain_quiet = None
        self.drain_max = seconds

    def processExited(self, reason: Failure) -> None:
        """The command finished: this is its result; close the pipes soon."""
        self.has_exited = True
        self.exit_code = exit_code(reason)
        if self.window is not None:
            # Reaped by now: whatever it started, it started before this.
            self.window = (self.window[0], boot_ticks() + 1)
        for timer in (self._hard, self._idle):
            if timer is not None and timer.active():
                timer.cancel()
        self._drain_limit = self.clock.seconds() + self.drain_max
        pipes = getattr(self.transport, "pipes", None)
        if pipes is None or pipes:
            # Pipes still open: a grandchild may hold them, or the last
            # output is still on its way.  (With all of them closed
            # already, the usual order for a short command, processEnded
            # comes next and there is nothing to drain or cancel.)
            self._arm_drain()
        self.exited.callback(self.exit_code)

    def _arm_drain(self) -> None:
        if self.has_ended:
            return
        if self.paused and self.reason is None:
            return  # a slow reader: keep what is still in the pipes
        # Ended by the daemon: what is left is not worth waiting for.
        quiet = self.drain_quiet if self.reason is None else EXIT_DRAIN_SECONDS
        if self._drain is not None and self._drain.active():
            if quiet is None:
                return  # waiting for the bound already
            self._drain.cancel()
        delay = self.drain_max if quiet is None else quiet
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
        self.table.live.discard(self)
        self.ended.callback(self.exit_code)

    # -- control -----------------------------------------------------------

    def kill(self, reason: str = "killed") -> Deferred[None]:
        """End the whole tree (TERM, grace, KILL); idempotent."""
        if self.reason is None:
            self.reason = reason
            child_timed_out(reason)
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
                window=self.window,
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

    def write_stdin(self, data: bytes, now: bool = False) -> None:
        """
        Queue bytes for the stdin pipe.

        :param now: write them in this call rather than on the reactor's
            next turn (a command a child waits for: one ``epoll_wait``
            less on its way). What the pipe does not take stays queued,
            and an error is left for the reactor, which sees the pipe again.
        """
        if self.transport is None or not self.stdin_open:
            return
        self.transport.write(data)
        if now:
            writer = getattr(self.transport, "pipes", {}).get(0)
            if writer is not None and writer.connected and not writer.disconnecting:
                writer.doWrite()

    def read_chunks(self, fd: int, size: int) -> None:
        """
        Read the child's ``fd`` ``size`` bytes at a time instead of
        Twisted's 8 KiB: a child that writes much (the kernel hub) then
        hands it over in a few reactor turns, not one turn per 8 KiB.
        """
        reader = getattr(self.transport, "pipes", {}).get(fd)
        if reader is None:
            return
        # One buffer for every read: os.read(fd, 1 MiB) would allocate (and
        # shrink) a megabyte each time, dearer than the read itself.
        buffer = memoryview(bytearray(size))

        def take(pipe: int) -> int:
            got = os.readv(pipe, [buffer])
            if got:
                reader.dataReceived(bytes(buffer[:got]))
            return got

        reader.doRead = _reads_with(reader.fd, take)

    def read_with(self, fd: int, read: Callable[[int], int]) -> None:
        """
        Let ``read`` read the child's ``fd`` itself, whenever it is readable:
        called with the pipe's descriptor, it returns how many bytes it took
        (0 at the end) and hands them on its own way, not through
        ``on_output`` (a reader that knows what comes next can read it
        straight into the object that keeps it). An ``OSError`` it raises
        ends the pipe as a failed read does, but for ``EAGAIN``.
        """
        reader = getattr(self.transport, "pipes", {}).get(fd)
        if reader is None:
            return

        def take(pipe: int) -> int:
            got = read(pipe)
            if got:
                self._heard()
            return got

        reader.doRead = _reads_with(reader.fd, take)

    def close_stdin(self) -> None:
        """Send EOF."""
        if self.transport is not None and self.stdin_open:
            self.stdin_open = False
            self.transport.closeStdin()

    def throttle_stdin(self, producer: Any) -> None:
        """
        Pause ``producer`` (whoever feeds stdin: a client's connection)
        while the pipe holds more than the child has taken, and resume it
        once drained, so a child that reads slowly bounds what waits for
        it.  The pipe's end never stops ``producer``: its owner decides.
        """
        writer = (
            getattr(self.transport, "pipes", {}).get(0)
            if self.transport is not None
            else None
        )
        if writer is not None and writer.producer is None:
            writer.registerProducer(_PauseOnly(producer), True)

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


@implementer(IPushProducer)
class _PauseOnly:
    """A producer's pause and resume, passed on; its stop left to its owner."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer

    def pauseProducing(self) -> None:
        self.producer.pauseProducing()

    def resumeProducing(self) -> None:
        self.producer.resumeProducing()

    def stopProducing(self) -> None:
        """The pipe closed (the child exited): the producer's owner decides."""


#: The stops the kernel discards, when their action is the default one, in
#: a process group with no parent in its session outside it (an orphaned
#: group): every child's group, since each leads a session of its own.
JOB_CONTROL_STOPS = frozenset({signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})


def deliverable(sig: int) -> int:
    """
    What to send for ``sig``: SIGSTOP for a job-control stop (TSTP, TTIN,
    TTOU), which would otherwise do nothing to a child's orphaned group, so
    that "pause" pauses and 18 (CONT) has something to resume; else ``sig``.
    """
    return signal.SIGSTOP if sig in JOB_CONTROL_STOPS else sig


def signal_child(child: Child, sig: int) -> None:
    """
    Send ``sig`` to a running child's process group and to the members of
    its tree that left the group (never to a pid reused since); a stop
    as SIGSTOP (:func:`deliverable`).
    """
    if child.has_exited or never_signalled(child.pid):
        return
    sig = deliverable(sig)
    if sig == signal.SIGKILL and child.killing is None:
        # 9 is "kill it" (SPEC §7.4): the whole tree, every time, as a
        # timeout does, but with no TERM first and no grace; the kill keeps
        # looking until no member (also one forked meanwhile) is left.
        # ``reason`` stays unset: the output already read is the answer.
        child.killing = kill_tree(
            child.clock, child.pid, child.marker, grace=0, window=child.window
        )
        child.killing.addBoth(lambda _: reap_orphans() and None)
        return
    # Look first, signal after: once the leader dies its setsid'd
    # children are reparented to the daemon, and a look taken while that
    # happens could find them under neither.
    table = tree_table(child.pid)
    members = tree_members(child.pid, child.marker, table, window=child.window)
    signal_group(child.pid, sig)
    for pid, start in members.items():
        if table[pid].pgid != child.pid:
            signal_member(pid, start, sig)


#: How often, and for how long at most, the daemon looks again at an exited
#: command's leftovers while one of them is in the middle of an exec.
LEFTOVER_SETTLE_SECONDS = 0.05
LEFTOVER_SETTLE_LIMIT = 5.0


def signal_exited_tree(child: Child, sig: int) -> int:
    """
    Send ``sig`` to what an exited child's tree left running (a command
    that started something in the background and ended): how many
    processes that was.  9 then ends them all, as it does a running tree;
    a stop is sent as SIGSTOP (:func:`deliverable`).
    """
    sig = deliverable(sig)
    found, unsettled = signal_leftovers(
        child.pid, child.marker, sig, window=child.window
    )
    if found and sig == signal.SIGKILL:
        kill_tree(
            child.clock,
            child.pid,
            child.marker,
            grace=0,
            leader_reaped=True,
            window=child.window,
        ).addBoth(lambda _: reap_orphans() and None)
    elif unsettled:
        _settle_leftovers(
            child, sig, frozenset(found), child.clock.seconds() + LEFTOVER_SETTLE_LIMIT
        )
    return len(found)


def count_leftovers(children: list[Child]) -> list[int]:
    """
    How many processes each exited child's tree left running, as a signal
    to it would find them (one look for all): a command that put something
    in the background and ended shows that it did.
    """
    trees = [(child.pid, child.marker, child.window) for child in children]
    return [len(found) for found in leftovers(trees)]


def _settle_leftovers(
    child: Child, sig: int, done: frozenset[int], until: float
) -> None:
    """
    Look again, shortly, for leftovers an exec hid (a setsid'd child's
    environment reads empty until its exec ends, which a busy machine can
    stretch well past one look) and signal those found, until none is
    mid-exec or ``until`` passes.
    """

    def look() -> None:
        found, unsettled = signal_leftovers(
            child.pid, child.marker, sig, done, child.window
        )
        if unsettled and child.clock.seconds() < until:
            _settle_leftovers(child, sig, done | found, until)

    child.clock.callLater(LEFTOVER_SETTLE_SECONDS, look)


def timeout_message(seconds: float | None, idle: bool = False) -> str:
    """What a client is told of a child ended on its hard or idle timeout."""
    if idle:
        return (
            f"IdleTimeout: no output for {seconds:g} seconds; "
            "its process group was killed"
        )
    return f"Command timed out after {seconds:g} seconds; its process group was killed"


def timeout_error(child: Child) -> ApiError | None:
    """The error of a child the daemon ended on a timeout, else None."""
    if child.reason == "timeout":
        return timed_out(timeout_message(child.timeout))
    if child.reason == "idle_timeout":
        return timed_out(timeout_message(child.idle_timeout, True), idle=True)
    return None
