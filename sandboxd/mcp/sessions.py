# -*- test-case-name: tests.mcp.test_sessions -*-
"""
MCP sessions (``Mcp-Session-Id``) and their resumable SSE streams.

A session belongs to the identity that opened it, holds the protocol
version it negotiated, the calls it has in flight and its streams: stream 0
is the standalone ``GET`` stream, every POST answered with SSE gets the
next number.  Every event is kept (bounded in bytes per session) under an
id ``STREAM-SEQ``, so a client that lost a stream resumes it with
``Last-Event-ID`` and gets exactly the events after that one, then the
live ones (the §9 stream contract, with the stream named in the id as the
MCP transport asks).
"""

from __future__ import annotations

import collections
import secrets
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

from sandboxd import jsonrpc
from sandboxd.policy.defaults import MCP_REPLAY_BYTES
from sandboxd.web.jsonbody import line_safe

if TYPE_CHECKING:
    from sandboxd.access.auth import Identity
    from sandboxd.mcp.calls import ToolCall
    from sandboxd.web.sse import SSEChannel


def event_frame(stream: int, seq: int, message: dict[str, Any] | None) -> bytes:
    """One SSE event of an MCP stream (no ``data`` for a priming event)."""
    head = f"id: {stream}-{seq}\n"
    if message is None:
        return (head + "data:\n\n").encode()
    data = line_safe(jsonrpc.encode(message))
    return head.encode() + b"event: message\ndata: " + data + b"\n\n"


def parse_event_id(value: str) -> tuple[int, int] | None:
    """``(stream, seq)`` of a ``Last-Event-ID``, or None when it is not ours."""
    stream, sep, seq = value.strip().partition("-")
    if not sep or not stream.isdigit() or not seq.isdigit():
        return None
    return int(stream), int(seq)


@implementer(IPushProducer)
class Backlog:
    """
    Told by the transport when a client stops reading: while it is paused,
    progress notifications are skipped (the next one carries the bytes so
    far, and the result the output), so a stalled client costs no memory.
    """

    paused = False

    def pauseProducing(self) -> None:
        """The transport's buffer is full."""
        self.paused = True

    def resumeProducing(self) -> None:
        """The client has read."""
        self.paused = False

    def stopProducing(self) -> None:
        """The connection is gone (the channel notices on its own)."""


@attrs.define(eq=False)
class Stream:
    """One SSE stream of a session and the connection showing it, if any."""

    number: int
    seq: int = 0
    channel: SSEChannel | None = None
    backlog: Backlog | None = None
    finished: bool = False
    #: The request key of the call this stream answers (None for GET's).
    call: str | None = None
    #: When its connection was lost, while no other shows it.
    lost_at: float | None = None

    @property
    def stalled(self) -> bool:
        """Whether the connection showing it has stopped reading."""
        return self.backlog is not None and self.backlog.paused


@attrs.define(eq=False)
class Session:
    """One MCP session."""

    id: str
    identity: Identity
    version: str
    last_seen: float
    client_info: dict[str, Any] = attrs.Factory(dict)
    initialized: bool = False
    listed: frozenset[str] | None = None
    calls: dict[str, ToolCall] = attrs.Factory(dict)
    streams: dict[int, Stream] = attrs.Factory(dict)
    next_stream: int = 1
    replay: collections.deque[tuple[int, int, bytes]] = attrs.Factory(collections.deque)
    replay_bytes: int = 0
    closed: bool = False
    clock: Callable[[], float] = time.monotonic

    def __attrs_post_init__(self) -> None:
        self.streams[0] = Stream(0)

    @property
    def standalone(self) -> Stream:
        """The ``GET`` stream's state."""
        return self.streams[0]

    def open_stream(self, call: str | None = None) -> Stream:
        """A new stream for one POST's answer (to the call keyed ``call``)."""
        stream = Stream(self.next_stream, call=call)
        self.next_stream += 1
        self.streams[stream.number] = stream
        return stream

    def emit(
        self,
        stream: Stream,
        message: dict[str, Any] | None,
        droppable: bool = False,
    ) -> None:
        """
        Send one message on ``stream`` (kept for replay).

        :param droppable: skip it while the connection is stalled (progress).
        """
        if droppable and stream.stalled:
            return
        if message is not None:
            stream.seq += 1
        frame = event_frame(stream.number, stream.seq, message)
        if message is not None:
            self._keep(stream.number, stream.seq, frame)
        channel = stream.channel
        if channel is not None and channel.open:
            channel.write_raw(frame)

    def _keep(self, number: int, seq: int, frame: bytes) -> None:
        self.replay.append((number, seq, frame))
        self.replay_bytes += len(frame)
        while self.replay_bytes > MCP_REPLAY_BYTES and len(self.replay) > 1:
            _, _, old = self.replay.popleft()
            self.replay_bytes -= len(old)

    def since(self, number: int, seq: int) -> Iterator[bytes]:
        """The kept frames of stream ``number`` after ``seq``, in order."""
        for n, s, frame in self.replay:
            if n == number and s > seq:
                yield frame

    def finish(self, stream: Stream) -> None:
        """The stream's answer is sent: end it and close its connection."""
        stream.finished = True
        channel, stream.channel = stream.channel, None
        stream.backlog = None
        if channel is not None and channel.open:
            channel.close()
        if stream.number:
            # Its kept events stay (within the replay bound) for a client
            # that lost the connection just before the answer.
            self.streams.pop(stream.number, None)

    def attach(self, stream: Stream, channel: SSEChannel, after: int) -> None:
        """
        Show ``stream`` on ``channel`` from ``after`` on: the kept events,
        then the live ones.  A connection already showing it is closed.
        """
        old, stream.channel = stream.channel, channel
        stream.lost_at = None
        if old is not None and old is not channel and old.open:
            old.close()
        backlog = stream.backlog = Backlog()
        channel.register_producer(backlog)
        for frame in self.since(stream.number, after):
            channel.write_raw(frame)

        def gone() -> None:
            if stream.channel is channel:
                stream.channel = None
                stream.backlog = None
                stream.lost_at = self.clock()

        channel.on_disconnect(gone)

    def connected(self) -> bool:
        """Whether a connection shows any of its streams."""
        return any(
            stream.channel is not None and stream.channel.open
            for stream in self.streams.values()
        )

    def let_go(self, now: float, grace: float) -> list[str]:
        """
        Cancel the calls whose stream was lost ``grace`` seconds ago and not
        resumed: their client is gone, and a call kept for it (a follow
        that lasts as long as its process) would keep the session open for
        good.  The cancellation's answer is kept for a late resume.

        :returns: the request keys of the calls cancelled.
        """
        gone: list[str] = []
        for stream in list(self.streams.values()):
            if (
                stream.call is None
                or stream.finished
                or stream.lost_at is None
                or now - stream.lost_at < grace
            ):
                continue
            call = self.calls.get(stream.call)
            if call is not None:
                gone.append(stream.call)
                call.cancel()
        return gone

    def close(self) -> None:
        """End the session: cancel its calls, close its connections."""
        self.closed = True
        for call in list(self.calls.values()):
            call.cancel()
        self.calls.clear()
        for stream in list(self.streams.values()):
            channel, stream.channel = stream.channel, None
            if channel is not None and channel.open:
                channel.close()
        self.replay.clear()
        self.replay_bytes = 0


class SessionTable:
    """The open sessions, bounded by the ``mcp`` endpoint's ``max_sessions``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """:param clock: the time a lost stream is noted at (the reactor's)."""
        self.sessions: dict[str, Session] = {}
        self.clock = clock

    def __len__(self) -> int:
        return len(self.sessions)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self.sessions.values()))

    def create(self, identity: Identity, version: str, now: float) -> Session:
        """A new session with an unguessable id."""
        session = Session(
            secrets.token_urlsafe(24), identity, version, now, clock=self.clock
        )
        self.sessions[session.id] = session
        return session

    def held_by(self, identity: Identity) -> int:
        """
        How many open sessions count against ``identity``'s share: its own
        and its minter's links' (a link's are its minter's).  Using one
        stays with the exact identity that opened it (:meth:`get`), whose
        scopes its calls carry.
        """
        root = identity.root
        return sum(1 for s in self.sessions.values() if s.identity.root == root)

    def get(self, session_id: str, identity: Identity) -> Session | None:
        """
        The session, if it exists and belongs to ``identity`` (another
        identity's session is as unknown as a made-up id).
        """
        session = self.sessions.get(session_id)
        if session is None or session.identity.id != identity.id:
            return None
        return session

    def remove(self, session: Session) -> None:
        """Close and forget a session."""
        self.sessions.pop(session.id, None)
        session.close()

    def quietest(
        self, now: float, quiet: float, root: str | None = None
    ) -> Session | None:
        """
        The session least recently used of those with no call running and
        no connection open for ``quiet`` seconds (of ``root``'s share when
        given): one whose client is likely gone, to close for a new one.
        """
        candidates = [
            s
            for s in self.sessions.values()
            if not s.calls
            and not s.connected()
            and now - s.last_seen >= quiet
            and (root is None or s.identity.root == root)
        ]
        return min(candidates, key=lambda s: s.last_seen, default=None)

    def next_quiet(
        self, now: float, quiet: float, root: str | None = None
    ) -> float | None:
        """
        Seconds until the first session with no call running and no
        connection open (of ``root``'s share when given) has been quiet
        for ``quiet`` seconds and can make room, if its client stays away;
        None when each has a call or a connection.
        """
        waits = [
            quiet - (now - s.last_seen)
            for s in self.sessions.values()
            if not s.calls
            and not s.connected()
            and (root is None or s.identity.root == root)
        ]
        return max(0.0, min(waits)) if waits else None

    def let_go(self, now: float, grace: float) -> int:
        """
        Cancel every session's calls whose stream was lost ``grace``
        seconds ago (:meth:`Session.let_go`); how many.
        """
        return sum(len(s.let_go(now, grace)) for s in self.sessions.values())

    def expire(self, now: float, idle: float) -> list[Session]:
        """Close the sessions idle for ``idle`` seconds with no call running."""
        gone = [
            s
            for s in self.sessions.values()
            if not s.calls and now - s.last_seen >= idle
        ]
        for session in gone:
            self.remove(session)
        return gone
