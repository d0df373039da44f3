# -*- test-case-name: tests.terminals.test_session -*-
"""
Terminal sessions (SPEC §7.5, §8): a shell on a pseudo-terminal, its
scrollback, and the clients watching it.

A session outlives its WebSockets.  Output is decoded once, framed once and
fanned out to every attached client; it is also kept in a bounded ring so
a client that reconnects can replay what it missed.  A client whose socket
backs up pauses the PTY (so the shell blocks in ``write`` rather than the
daemon growing memory) and is dropped if it stays behind for too long.
"""

from __future__ import annotations

import codecs
import fcntl
import json
import os
import signal
import struct
import termios
import time
import uuid
from typing import TYPE_CHECKING, Any, Protocol

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from sandboxd.policy.confinement import Confinement
from sandboxd.policy.defaults import (
    KILL_GRACE_SECONDS,
    PTY_COALESCE_SECONDS,
    PTY_EXIT_DRAIN_SECONDS,
    PTY_FRAME_BYTES,
    PTY_HANGUP_GRACE_SECONDS,
    PTY_MAX_CLIENTS,
    PTY_SCROLLBACK_BYTES,
    PTY_SLOW_CLIENT_SECONDS,
)
from sandboxd.processes.command import RunAs, exit_code
from sandboxd.processes.priority import CHILD_PRIORITY
from sandboxd.processes.spawning import SessionPTYProcess, confined
from sandboxd.processes.tree import (
    TREE_MARKER,
    descendants,
    member_alive,
    never_signalled,
    new_marker,
    signal_member,
    signal_tree,
    tree_members,
)

if TYPE_CHECKING:
    from sandboxd.access.auth import Identity

log = Logger(namespace="sandboxd.terminals.session")

#: How often a closing session hangs up again on a shell still there, and
#: looks again for jobs the shell left while they end.
HANG_UP_AGAIN_SECONDS = 0.1

#: Signals a client may send to the terminal's foreground job (SPEC §8).
CLIENT_SIGNALS = {
    "SIGINT": signal.SIGINT,
    "SIGTERM": signal.SIGTERM,
    "SIGKILL": signal.SIGKILL,
    "SIGHUP": signal.SIGHUP,
    "SIGQUIT": signal.SIGQUIT,
}

#: Output at least this large is bulk (not an echo): worth gathering.
_BULK_BYTES = 512


class OutputLost(Exception):
    """A client asked for output the scrollback has already forgotten."""

    def __init__(self, offset: int, kept_from: int) -> None:
        super().__init__(
            f"terminal output from byte {offset} was asked for, "
            f"but only output from byte {kept_from} is kept"
        )
        self.offset = offset
        self.kept_from = kept_from


class Client(Protocol):
    """What a session needs from an attached client (a WebSocket)."""

    def send_frame(self, frame: bytes) -> None:
        """Send one ready-made JSON text frame."""

    def session_ended(self, frame: bytes) -> None:
        """Send the ``exited`` frame, then close normally."""

    def pause_input(self) -> None:
        """Stop reading input: the terminal cannot take more yet."""

    def resume_input(self) -> None:
        """Read input again."""

    def drop_slow(self) -> None:
        """Close a client that left output unread for too long."""


def event_frame(event: str, **fields: Any) -> bytes:
    """A ``{"type": "event"}`` frame, encoded."""
    return json.dumps({"type": "event", "event": event, **fields}).encode()


#: Input up to this size is written to the terminal at once when possible.
_KEYSTROKE_BYTES = 256


def _nothing_queued(transport: Any) -> bool:
    """Whether Twisted holds no unwritten input for the terminal (False if unknown)."""
    try:
        return not (transport.dataBuffer or transport._tempDataBuffer)
    except AttributeError:
        return False


def output_frame(text: str, offset: int, end: int) -> bytes:
    """
    An ``{"type": "output"}`` frame: ``offset`` bytes of output came before
    it, ``end`` with it.  ``end`` is where a client resumes: the text's own
    length says less where output that is not UTF-8 became U+FFFD.
    """
    return json.dumps(
        {"type": "output", "data": text, "offset": offset, "end": end},
        ensure_ascii=False,
    ).encode()


def set_window_size(fd: int, cols: int, rows: int) -> None:
    """
    Size the terminal behind ``fd``.  When the size changes, the kernel
    sends SIGWINCH to the terminal's foreground process group itself.
    """
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


@attrs.define(eq=False)
class Scrollback:
    """
    The last ``limit`` bytes of a session's output, addressed by absolute
    byte offsets (bytes of output since the session started).
    """

    limit: int = PTY_SCROLLBACK_BYTES
    data: bytearray = attrs.Factory(bytearray)
    #: the absolute offset of ``data[0]``.
    start: int = 0

    @property
    def end(self) -> int:
        """Bytes of output so far."""
        return self.start + len(self.data)

    def append(self, chunk: bytes, keep: int | None = None) -> None:
        """
        Keep ``chunk``, forgetting the oldest bytes beyond the limit, but
        none from ``keep`` on: output not yet sent to the clients stays
        until it is, however much one flush gathers.
        """
        self.data += chunk
        self.trim(keep)

    def trim(self, keep: int | None = None) -> None:
        """Forget the oldest bytes beyond the limit, but none from ``keep`` on."""
        over = len(self.data) - self.limit
        if keep is not None:
            over = min(over, keep - self.start)
        if over > 0:
            # Deleting from a bytearray's front only moves its start pointer.
            del self.data[:over]
            self.start += over

    def since(self, offset: int | None, upto: int) -> tuple[int, bytes]:
        """
        What followed ``offset`` (everything kept when None or forgotten),
        up to ``upto``, starting on a character boundary.

        :returns: ``(absolute offset of the first byte, bytes)``.
        """
        upto = min(upto, self.end)
        begin = (
            self.start if offset is None or offset < self.start else min(offset, upto)
        )
        chunk = bytes(self.data[begin - self.start : upto - self.start])
        skip = 0
        # Trimming can cut a character: its continuation bytes would only
        # decode to replacement characters.
        while skip < min(3, len(chunk)) and 0x80 <= chunk[skip] < 0xC0:
            skip += 1
        return begin + skip, chunk[skip:]


@implementer(IPushProducer)
class _InputThrottle:
    """
    Registered with the PTY transport: when the shell stops reading input,
    every client stops being read, so pasted input never piles up here.
    """

    def __init__(self, session: PtySession) -> None:
        self.session = session
        self.paused = False

    def pauseProducing(self) -> None:
        self.paused = True
        for client in list(self.session.clients):
            client.pause_input()

    def resumeProducing(self) -> None:
        self.paused = False
        for client in list(self.session.clients):
            client.resume_input()

    def stopProducing(self) -> None:
        self.paused = False


class _ShellProtocol(ProcessProtocol):
    """Forwards the shell's events to its session."""

    def __init__(self, session: PtySession) -> None:
        self.session = session

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        self.session.output(data)

    def processExited(self, reason: Failure) -> None:
        self.session.shell_exited(reason)

    def processEnded(self, reason: Failure) -> None:
        self.session.shell_ended(reason)


@attrs.define(eq=False)
class PtySession:
    """
    One shell on one PTY, and the clients attached to it.

    :ivar owner: the identity that created it (only it, or ``*``, may attach).
    :ivar emitted: bytes of output decoded and sent so far (a character
        boundary; a split multi-byte character waits in the decoder).
    """

    id: str
    owner: str
    clock: Any
    cols: int
    rows: int
    idle_timeout: float | None = None
    scrollback: Scrollback = attrs.Factory(Scrollback)
    max_clients: int = PTY_MAX_CLIENTS
    frame_bytes: int = PTY_FRAME_BYTES
    slow_client_seconds: float = PTY_SLOW_CLIENT_SECONDS
    kill_grace: float = KILL_GRACE_SECONDS
    hangup_grace: float = PTY_HANGUP_GRACE_SECONDS
    created_at: float = attrs.Factory(time.time)
    pid: int = 0
    #: Carried in the shell's environment (``TREE_MARKER``), so a job that
    #: left the terminal's session (``setsid``, double fork) is still found
    #: and ended with it.
    marker: str = attrs.Factory(new_marker)
    transport: Any = None
    clients: list[Client] = attrs.Factory(list)
    exit_code: int | None = None
    alive: bool = True
    ended: bool = False
    emitted: int = 0
    #: Whether the last client went away and nobody has used the session
    #: since: its shell runs at the lightest weight meanwhile.
    unattended: bool = False
    #: Bytes clients sent to the shell (keystrokes, pastes), for the audit.
    bytes_in: int = 0
    last_activity: float = 0.0
    _decoder: Any = attrs.Factory(
        lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )
    _paused: dict[Client, Any] = attrs.Factory(dict)
    _throttle: _InputThrottle | None = None
    _waiters: list[Deferred[None]] = attrs.Factory(list)
    _idle_timer: Any = None
    _kill_timer: Any = None
    _hangup_timer: Any = None
    _term_timer: Any = None
    _closing: bool = False
    #: When the hang-up was sent (the clock's seconds).
    _closing_since: float = 0.0
    #: Whether the shell has ended and its jobs are still being waited for
    #: (what DELETE answers after).
    _settling: bool = False
    #: Every member of the shell's tree seen since it began to close, as
    #: ``{pid: start time}``: the KILL after the grace reaches a job that
    #: ignored the hang-up even once the shell is gone and the job, no
    #: longer below it, carries nothing else that ties it to the session.
    _members: dict[int, int] = attrs.Factory(dict)
    #: Whether clients were told the shell exited before the terminal
    #: closed (see :meth:`shell_exited`), and the timer that tells them.
    _told: bool = False
    _tell_timer: Any = None
    _pending: list[bytes] = attrs.Factory(list)
    _pending_size: int = 0
    _flush_timer: Any = None
    _last_flush: float = 0.0
    _last_frame_size: int = 0

    # -- starting -------------------------------------------------------------

    def protocol(self) -> _ShellProtocol:
        """The process protocol to spawn the shell with."""
        return _ShellProtocol(self)

    def started(self, transport: Any) -> None:
        """The shell is running on ``transport``."""
        self.transport = transport
        self.pid = transport.pid
        self._throttle = _InputThrottle(self)
        transport.registerProducer(self._throttle, True)
        self.touch()

    # -- output ---------------------------------------------------------------

    def output(self, data: bytes) -> None:
        """
        Output from the shell: kept at once, sent to every client in frames.

        A small chunk after a quiet spell (a keystroke's echo) goes out at
        once.  Bulk output (a big read, or any read soon after a big frame)
        is gathered for :data:`PTY_COALESCE_SECONDS` (or up to one frame),
        so ``seq 1 300000`` costs a few hundred frames, not thousands.
        """
        now = self.clock.seconds()
        self.last_activity = now
        if len(data) >= _BULK_BYTES:
            data = self._drain(data)
        # What is pending is not sent yet: a flush can gather more than the
        # scrollback holds, and clients that want the bytes read them here.
        self.scrollback.append(data, keep=self.emitted)
        self._pending.append(data)
        self._pending_size += len(data)
        if self._flush_timer is not None:
            if self._pending_size >= self.frame_bytes:
                self._flush()
            return
        bulk = self._pending_size >= _BULK_BYTES or (
            self._last_frame_size >= _BULK_BYTES
            and now - self._last_flush < PTY_COALESCE_SECONDS
        )
        if bulk and self._pending_size < self.frame_bytes:
            self._flush_timer = self.clock.callLater(PTY_COALESCE_SECONDS, self._flush)
        else:
            self._flush()

    def _drain(self, data: bytes) -> bytes:
        """
        Read whatever else the PTY holds now, up to a frame: Twisted reads
        once per reactor turn, and a terminal hands over at most 4 KiB at a
        time, so bulk output would otherwise cost a turn per 4 KiB.
        """
        try:
            fd = self.transport.fileno()
        except Exception:
            return data
        parts = [data]
        size = len(data)
        while size < self.frame_bytes:
            try:
                more = os.read(fd, self.frame_bytes - size)
            except OSError:
                # EAGAIN: drained.  EIO: the shell is gone; Twisted's next
                # read sees it too and ends the process.
                break
            if not more:
                break
            parts.append(more)
            size += len(more)
        return b"".join(parts) if len(parts) > 1 else data

    def _flush(self) -> None:
        """Decode what is pending (holding back a split character) and send it."""
        if self._flush_timer is not None:
            if self._flush_timer.active():
                self._flush_timer.cancel()
            self._flush_timer = None
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        self._pending_size = 0
        self._last_flush = self.clock.seconds()
        self._last_frame_size = len(data)
        text = self._decoder.decode(data)
        if not text:
            return
        start = self.emitted
        self.emitted = self.scrollback.end - len(self._decoder.getstate()[0])
        if self.clients:
            frame = output_frame(text, start, self.emitted)
            for client in list(self.clients):
                client.send_frame(frame)
        self.scrollback.trim(keep=self.emitted)

    def output_bytes(self, frame: bytes) -> tuple[int, bytes] | None:
        """
        Where an ``output`` frame starts and the bytes it carries, as the
        terminal wrote them, for a client that wants them rather than the
        frame's text (where what is not UTF-8 became U+FFFD); None for any
        other frame.

        The frame says where its bytes are (``offset`` to ``end``); they
        are still in the scrollback while the frame is being sent, since
        output is kept until it has been sent.

        :raises OutputLost: the scrollback no longer holds the frame's
            first bytes (never silently skipped).
        """
        message = json.loads(frame)
        if message.get("type") != "output":
            return None
        offset, end = int(message["offset"]), int(message["end"])
        kept = self.scrollback
        if offset < kept.start or end > kept.end:
            raise OutputLost(offset, kept.start)
        return offset, bytes(kept.data[offset - kept.start : end - kept.start])

    # -- clients --------------------------------------------------------------

    def attach(self, client: Client, offset: int | None = None) -> bool:
        """
        Add a client: ``started``, then the scrollback (all of it, or what
        followed ``offset`` when still kept), then live output.

        :returns: False when the session already has its maximum of clients.
        """
        if len(self.clients) >= self.max_clients:
            return False
        self._flush()
        client.send_frame(event_frame("started", session_id=self.id, pid=self.pid))
        begin, kept = self.scrollback.since(offset, self.emitted)
        if kept:
            client.send_frame(
                output_frame(kept.decode("utf-8", "replace"), begin, begin + len(kept))
            )
        if self.ended or self._told:
            client.session_ended(self._exited_frame())
            return True
        first = not self.clients
        self.clients.append(client)
        if self._throttle is not None and self._throttle.paused:
            client.pause_input()
        if first or self.unattended:
            self._attended()
        self.touch()
        return True

    def detach(self, client: Client) -> None:
        """A client went away; the session lives on."""
        if client in self.clients:
            self.clients.remove(client)
        self.resume(client)
        if not self.clients:
            self.touch()
            if self.alive and self.pid and not self.unattended:
                self.unattended = True
                CHILD_PRIORITY.unattended(self.pid)

    def _attended(self) -> None:
        """Someone is attached: the shell's group at an attended terminal's weight."""
        self.unattended = False
        if self.alive and self.pid:
            CHILD_PRIORITY.attended(self.pid)

    def pause(self, client: Client, seconds: float | None = None) -> None:
        """
        ``client``'s socket is full: pause the PTY until it drains.

        :param seconds: how long it may stay behind before it is dropped
            (``slow_client_seconds`` when None): a door whose clients
            expect the shell to wait for them (E2B's) gives its own.
        """
        if client in self._paused or client not in self.clients:
            return
        self._paused[client] = self.clock.callLater(
            self.slow_client_seconds if seconds is None else seconds,
            self._too_slow,
            client,
        )
        if len(self._paused) == 1 and self.transport is not None and not self.ended:
            self.transport.pauseProducing()

    def resume(self, client: Client) -> None:
        """``client``'s socket drained; resume the PTY if nobody else lags."""
        timer = self._paused.pop(client, None)
        if timer is None:
            return
        if timer.active():
            timer.cancel()
        if not self._paused and self.transport is not None and not self.ended:
            self.transport.resumeProducing()

    def _too_slow(self, client: Client) -> None:
        self.detach(client)
        client.drop_slow()

    # -- input and control ----------------------------------------------------

    def write(self, data: bytes) -> None:
        """Keystrokes or pasted text for the shell."""
        if self.alive and self.transport is not None and data:
            if self.unattended:
                self._attended()
            self.last_activity = self.clock.seconds()
            self.bytes_in += len(data)
            transport = self.transport
            if len(data) <= _KEYSTROKE_BYTES and _nothing_queued(transport):
                # A keystroke goes to the terminal now rather than on the
                # reactor's next turn: one loop less on every echo's round
                # trip.  Only when nothing is queued, so order is kept.
                try:
                    data = data[os.write(transport.fileno(), data) :]
                except OSError:
                    pass  # EAGAIN, or the terminal is gone: Twisted's path says
                if not data:
                    return
            transport.write(data)

    def input_waiting(self) -> bool:
        """Whether the shell takes no input now (what was written waits)."""
        return self._throttle is not None and self._throttle.paused

    def resize(self, cols: int, rows: int) -> None:
        """Resize the window (TIOCSWINSZ; the kernel sends SIGWINCH)."""
        if self.alive and self.transport is not None:
            set_window_size(self.transport.fileno(), cols, rows)
        self.cols, self.rows = cols, rows

    def send_signal(self, name: str) -> bool:
        """
        Signal the terminal's foreground process group, as a keyboard would
        (the shell itself when nothing runs).  Unknown names are ignored.
        """
        number = CLIENT_SIGNALS.get(name)
        if number is None or not self.alive or self.transport is None or self.pid <= 0:
            # pid 0 would make killpg signal the daemon's own group.
            return False
        try:
            group = os.tcgetpgrp(self.transport.fileno())
        except OSError:
            group = self.pid
        if never_signalled(group):
            # 0 when the terminal has no foreground group (the shell has
            # not taken it yet, or has just exited): killpg(0) would hit
            # the daemon's own group.  The shell's group is the one meant.
            group = self.pid
        if never_signalled(group):
            return False
        try:
            os.killpg(group, number)
        except ProcessLookupError:
            if group != self.pid:
                return False
            # Just forked: not yet the leader of a group of its own (its
            # setsid is still to come), so the process itself is signalled.
            try:
                os.kill(self.pid, number)
            except (ProcessLookupError, PermissionError):
                return False
        except PermissionError:
            return False
        return True

    def usable_by(self, identity: Identity) -> bool:
        """
        Whether ``identity`` may see, attach to or drive this terminal: its
        creator, a link its creator minted, or an identity holding ``*``
        (SPEC §4).  Every door asks this, and answers "not yours" exactly
        as "not there".
        """
        return identity.acts_for(self.owner)

    def describe(self) -> dict[str, Any]:
        """The JSON of SPEC §7.5."""
        return {
            "id": self.id,
            "pid": self.pid,
            "created_at": self.created_at,
            "cols": self.cols,
            "rows": self.rows,
            "alive": self.alive,
            "clients": len(self.clients),
        }

    # -- idle -----------------------------------------------------------------

    def touch(self) -> None:
        """Note activity, and make sure the idle check is scheduled."""
        self.last_activity = self.clock.seconds()
        if self.idle_timeout and self._idle_timer is None and not self.ended:
            self._idle_timer = self.clock.callLater(self.idle_timeout, self._idle_check)

    def _idle_check(self) -> None:
        self._idle_timer = None
        if self.ended or not self.idle_timeout:
            return
        quiet = self.clock.seconds() - self.last_activity
        if not self.clients and quiet >= self.idle_timeout:
            log.info(
                "sandboxd: terminal {id} idle for {s:.0f} s, closing",
                id=self.id,
                s=quiet,
            )
            self.close()
            return
        wait = self.idle_timeout - quiet if not self.clients else self.idle_timeout
        self._idle_timer = self.clock.callLater(max(wait, 1.0), self._idle_check)

    # -- ending ---------------------------------------------------------------

    def close(self) -> Deferred[None]:
        """
        End the whole session (hang up the shell and every job it started,
        KILL after a grace period); fires once the shell has ended.
        """
        if self.ended and not self._settling:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiters.append(d)
        self._terminate()
        return d

    def when_ended(self) -> Deferred[None]:
        """
        Fires once the shell has ended, and the jobs it left with it,
        however it ends (it is not ended here).
        """
        if self.ended and not self._settling:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiters.append(d)
        return d

    def _terminate(self) -> None:
        """
        Hang up as a terminal closing does (HUP, and CONT for a stopped
        job), and only HUP: a job's trap (a lock file removed, a file
        saved) runs before anything harder comes, TERM after
        :attr:`hangup_grace` and KILL after :attr:`kill_grace`.
        """
        if self._closing:
            return
        self._closing = True
        self._closing_since = self.clock.seconds()
        if self.pid:
            for sig in (signal.SIGHUP, signal.SIGCONT):
                self._signal_tree(sig)
        if self._term_timer is None:
            self._term_timer = self.clock.callLater(self.hangup_grace, self._term)
        if self._kill_timer is None:
            self._kill_timer = self.clock.callLater(self.kill_grace, self._kill)
        if self.alive and self._hangup_timer is None:
            self._hangup_timer = self.clock.callLater(
                HANG_UP_AGAIN_SECONDS, self._hang_up_again
            )

    def _hang_up_again(self) -> None:
        """
        Hang up on a shell that is still there: bash can miss the first
        hangup while it starts (its handler taken, the shell still
        running), which would leave the session to the KILL's grace.  The
        shell alone: its jobs had theirs, and a second hangup can cut an
        editor's save short.
        """
        self._hangup_timer = None
        if not self.alive or self.ended or not self.pid:
            return
        signal_member(self.pid, None, signal.SIGHUP)
        if self._kill_timer is not None:
            self._hangup_timer = self.clock.callLater(
                HANG_UP_AGAIN_SECONDS, self._hang_up_again
            )

    def _term(self) -> None:
        """The hang-up's grace is over: TERM to what is left of the tree."""
        self._term_timer = None
        if self.pid and not self.ended:
            self._signal_tree(signal.SIGTERM)

    def _signal_tree(self, sig: int) -> None:
        """``sig`` to the shell's tree as it is now and to every member seen before."""
        self._members.update(tree_members(self.pid, self.marker))
        signal_tree(self.pid, sig, self.marker)
        for pid, start in list(self._members.items()):
            signal_member(pid, start, sig)

    def _kill(self) -> None:
        self._kill_timer = None
        if self.pid:
            self._signal_tree(signal.SIGKILL)
        if self.transport is not None and not self.ended:
            # A process outside the session may hold the terminal open.
            self.transport.loseConnection()

    def shell_exited(self, reason: Failure) -> None:
        """The shell was reaped: end what it left behind in its session."""
        self.alive = False
        if self.pid:
            # Its group is no longer weighed with the children's.
            CHILD_PRIORITY.ended(self.pid)
        self.exit_code = exit_code(reason)
        self._terminate()
        if not self.ended and self._tell_timer is None:
            # The terminal usually closes at once; a job that ignores the
            # hang-up keeps it open until the KILL after the grace, and
            # clients would wait that long to hear the shell exited.
            self._tell_timer = self.clock.callLater(
                PTY_EXIT_DRAIN_SECONDS, self._tell_exited
            )

    def _tell_exited(self) -> None:
        """
        Tell every client the shell exited, and let them go, while what it
        left is still being ended (:meth:`shell_ended` finishes the job).
        """
        self._tell_timer = None
        if self.ended:
            return
        self._flush()
        self._told = True
        frame = self._exited_frame()
        clients, self.clients = self.clients, []
        for client in clients:
            client.session_ended(frame)

    def shell_ended(self, reason: Failure) -> None:
        """Shell reaped and terminal drained: tell every client, clean up."""
        self.alive = False
        self._flush()
        self.ended = True
        if self.exit_code is None:
            self.exit_code = exit_code(reason)
        tail = self._decoder.decode(b"", final=True)
        if tail and self.clients:
            frame = output_frame(tail, self.emitted, self.scrollback.end)
            for client in list(self.clients):
                client.send_frame(frame)
        self.emitted = self.scrollback.end
        timers = (self._hangup_timer, self._idle_timer, self._tell_timer)
        for timer in (*timers, *self._paused.values()):
            if timer is not None and timer.active():
                timer.cancel()
        self._hangup_timer = self._idle_timer = self._tell_timer = None
        self._paused.clear()
        frame = self._exited_frame()
        clients, self.clients = self.clients, []
        for client in clients:
            client.session_ended(frame)
        self._settling = True
        self._settle()

    def _tree_left(self) -> bool:
        """Whether anything of the shell's tree is still alive."""
        return bool(self.pid) and bool(
            descendants(self.pid, self.marker)
            or any(member_alive(pid, start) for pid, start in self._members.items())
        )

    def _settle(self) -> None:
        """
        The shell has ended: the jobs it left have what remains of the
        hang-up's grace to end by themselves, as when a terminal window
        closes (a script's trap still running when the shell went, its
        lock file not yet removed), then the tree is KILLed; the session
        is over once nothing of it is left.
        """
        self._hangup_timer = None
        if self._tree_left():
            if not self._closing:
                self._terminate()
            deadline = self._closing_since + self.hangup_grace
            if self.clock.seconds() < deadline:
                self._hangup_timer = self.clock.callLater(
                    min(HANG_UP_AGAIN_SECONDS, deadline - self.clock.seconds()),
                    self._settle,
                )
                return
            self._signal_tree(signal.SIGKILL)
        for timer in (self._kill_timer, self._term_timer):
            if timer is not None and timer.active():
                timer.cancel()
        self._kill_timer = self._term_timer = None
        self._settling = False
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.callback(None)

    def _exited_frame(self) -> bytes:
        return event_frame("exited", session_id=self.id, exit_code=self.exit_code)


@attrs.define
class SpawnRequest:
    """Everything needed to start a shell on a PTY."""

    executable: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    cols: int
    rows: int
    run_as: RunAs | None = None
    confine: Confinement | None = None


def new_session_id() -> str:
    """An unguessable session id."""
    return uuid.uuid4().hex


def spawn_shell(reactor: Any, session: PtySession, spec: SpawnRequest) -> None:
    """
    Start the shell on a PTY sized before it runs (no first-read race),
    in its own session with the PTY as its controlling terminal.

    :raises OSError: the PTY could not be opened or the fork failed.
    """
    # os.openpty, not pty.openpty: the latter, when openpty(3) fails (no
    # descriptor left), tries BSD pty names and raises "out of pty
    # devices" without the errno that says why.
    master, slave = os.openpty()
    try:
        set_window_size(master, spec.cols, spec.rows)
        uid = gid = None
        if spec.run_as is not None:
            uid, gid = spec.run_as.uid, spec.run_as.gid
            os.fchown(slave, uid, -1)
        executable, argv, env, uid, gid = confined(
            spec.confine,
            spec.executable,
            spec.argv,
            {**spec.env, TREE_MARKER: session.marker},
            uid,
            gid,
            forked=True,
        )
        with CHILD_PRIORITY.spawning():
            # Twisted's PTY transport (reactor.spawnProcess with usePTY),
            # its signals held at the fork: a session deleted right after
            # it was made hangs up a shell that has not exec'd yet.
            transport = SessionPTYProcess(  # type: ignore[no-untyped-call]
                reactor,
                executable,
                argv,
                env,
                spec.cwd,
                session.protocol(),
                uid,
                gid,
                (master, slave, os.ttyname(slave)),
            )
        if transport.pid is not None:
            # A terminal's group is weighed once: Twisted's PTY transport
            # reaps it without telling the priorities.
            CHILD_PRIORITY.spawned(transport.pid, tracked=False)
    except BaseException:
        # Twisted closes neither end of a PTY it was handed when it fails.
        for fd in (master, slave):
            try:
                os.close(fd)
            except OSError:
                pass
        raise
    session.started(transport)
