# -*- test-case-name: tests.web.test_request -*-
"""
Server-Sent Events over a twisted.web request (SPEC §9).

An :class:`SSEChannel` writes one frame per event as it happens, sends a
``: keep-alive`` comment after 4 s of silence, notices the client leaving,
and lets a producer pause whatever feeds it when the client reads slowly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.python.failure import Failure
from twisted.web.server import Request
from zope.interface import implementer

from sandboxd.access.gate import still_allowed
from sandboxd.errors import ApiError, not_json
from sandboxd.eventlog import Event, EventLog
from sandboxd.policy.defaults import HEARTBEAT_SECONDS
from sandboxd.web.jsonbody import json_bytes, line_safe
from sandboxd.web.params import integer
from sandboxd.web.sending import send_now, write_chunk_now


def frame(event: str, data: Any, id: int | None = None) -> bytes:
    """
    One SSE frame; ``data`` is JSON (so it never holds a bare newline) and
    :func:`~sandboxd.web.jsonbody.line_safe` (nor anything else a client's
    line reader may split at).
    """
    parts = frame_parts(event, data, id)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def frame_parts(event: str, data: Any, id: int | None = None) -> list[bytes]:
    """
    :func:`frame` in parts: a big chunk of output's text is not joined to
    the frame around it here (:meth:`SSEChannel.write_raw` sends the
    parts as they are).
    """
    head = f"id: {id}\n" if id is not None else ""
    big = big_text_parts(data)
    if big is not None:  # a big chunk of output: escaped from its bytes
        return [
            f"{head}event: {event}\ndata: ".encode(),
            *(line_safe(part) for part in big),
            b"\n\n",
        ]
    try:
        payload = json_bytes(data)  # a lone surrogate as a \u escape
    except ApiError:
        # Data JSON cannot carry (a non-finite number): the stream has
        # begun, so the event becomes an ``error`` event saying so, in its
        # place, rather than a ``NaN`` no client's parser takes.
        event, data = "error", not_json(data, f"the {event} event").event()
        payload = json_bytes(data)
    return [f"{head}event: {event}\ndata: ".encode() + line_safe(payload) + b"\n\n"]


#: An event whose ``text`` has at least this many characters (a big chunk
#: of output) is encoded by :func:`big_text_parts`.
BIG_TEXT_CHARS = 64 * 1024


def big_text_json(data: Any) -> bytes | None:
    """:func:`big_text_parts`, joined."""
    parts = big_text_parts(data)
    return None if parts is None else b"".join(parts)


def big_text_parts(data: Any) -> list[bytes] | None:
    """
    ``data``'s JSON when it is an object with a big ``text``, its text
    escaped from its bytes (a fraction of the cost of encoding it whole,
    the same bytes), in parts; else None.
    """
    if not isinstance(data, dict):
        return None
    text = data.get("text")
    if not isinstance(text, str) or len(text) < BIG_TEXT_CHARS:
        return None
    # Only for code contexts' output, so only imported once one prints.
    from sandboxd.kernels.jsontext import text_object_parts

    return text_object_parts(data)


@implementer(IPushProducer)
class _ProducerAdapter:
    """Pass pause/resume through; turn stop into the channel's close."""

    def __init__(self, target: Any, on_stop: Callable[[], None]) -> None:
        self._target = target
        self._on_stop = on_stop

    def pauseProducing(self) -> None:
        self._target.pauseProducing()

    def resumeProducing(self) -> None:
        self._target.resumeProducing()

    def stopProducing(self) -> None:
        self._on_stop()


def _send_now(request: Request) -> None:
    """
    Send what the transport holds now rather than on the reactor's next
    turn (:func:`sandboxd.web.sending.send_now`): every event, the first
    one included, whose latency is the one a client notices (a command's
    first line, a line among hundreds of streams).  The stream's own
    coalescing (``LineStream``) already makes one write of what arrives
    close together; waiting for the turn only added the rest of the turn's
    work to each event and a dispatch of the socket's writability per
    write.
    """
    send_now(getattr(getattr(request, "channel", None), "transport", None))


class SSEChannel:
    """
    A live event stream to one client.

    :ivar done: fires (with None) once the stream is over, whether the
        server closed it or the client went away.
    """

    def __init__(
        self,
        request: Request,
        clock: IReactorTime,
        heartbeat: float = HEARTBEAT_SECONDS,
        headers: dict[str, str] | None = None,
        streams: set[SSEChannel] | None = None,
    ) -> None:
        """
        :param streams: the daemon's set of open streams (``GET /metrics``
            counts it); this channel is in it while it is open.
        """
        self._request = request
        self._clock = clock
        self._last_write = clock.seconds()
        self._disconnect_callbacks: list[Callable[[], None]] = []
        self.open = True
        self._streams = streams if streams is not None else set()
        self._streams.add(self)
        self.client_gone = False
        self.done: Deferred[None] = Deferred()
        request.setResponseCode(200)
        request.setHeader(b"content-type", b"text/event-stream")
        request.setHeader(b"cache-control", b"no-cache")
        request.setHeader(b"x-accel-buffering", b"no")
        for k, v in (headers or {}).items():
            request.setHeader(k, v)
        request.notifyFinish().addErrback(self._lost)
        # One timer, due ``heartbeat`` after the last write: writes only
        # note their time, and the timer moves itself on when it finds the
        # stream was not silent (a fixed period let a stream go quiet for
        # almost two periods).
        self._every = heartbeat
        self._beat_call: Any = clock.callLater(heartbeat, self._beat)
        self._producer: _ProducerAdapter | None = None
        #: How an end from the server side (:meth:`end_with`) is framed:
        #: None for the ``error`` event of SPEC §9; a door whose clients
        #: read errors their own way (the ``/v1`` door's OpenAI SDKs) sets
        #: its own.
        self.error_frame: Callable[[ApiError], bytes] | None = None
        # The status and headers leave now: a client whose command prints
        # nothing for a while would otherwise wait for them until the first
        # event or heartbeat, and one with a read timeout (httpx's default
        # is 5 s) would give up on a stream that is running fine.
        request.write(b"")
        _send_now(request)

    def send(self, event: str, data: Any, id: int | None = None) -> None:
        """Write one event now."""
        self.write_raw(frame_parts(event, data, id))

    def write_raw(self, data: bytes | list[bytes]) -> None:
        """
        Write pre-formatted frame bytes (template streams yield these), or
        a frame in parts (:func:`frame_parts`), sent without joining them.

        Every write goes to the socket in the call when it can
        (:func:`~sandboxd.web.sending.write_chunk_now`): through Twisted's
        ``Request.write`` each event also asked the reactor to watch the
        socket and then to stop (two ``epoll_ctl`` calls beside the one
        ``send``), for hundreds of streams' lines a second.
        """
        if not self.open:
            return
        self._last_write = self._clock.seconds()
        if not write_chunk_now(
            self._request, [data] if isinstance(data, bytes) else data
        ):
            _send_now(self._request)

    def comment(self, text: str = "keep-alive") -> None:
        """A comment line, ignored by clients, that keeps proxies awake."""
        self.write_raw(f": {text}\n\n".encode())

    #: What a heartbeat writes: a comment, then the blank line that ends a
    #: frame (what every stream's clients have read since the start).
    heartbeat_frame = b": keep-alive\n\n"

    def _beat(self) -> None:
        if not self.open:
            return
        quiet = self._clock.seconds() - self._last_write
        if quiet >= self._every - 0.001:
            self.write_raw(self.heartbeat_frame)
            quiet = 0.0
        self._beat_call = self._clock.callLater(self._every - quiet, self._beat)

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` if the client leaves before the stream ends."""
        self._disconnect_callbacks.append(callback)

    def register_producer(
        self, producer: Any, on_stop: Callable[[], None] | None = None
    ) -> None:
        """
        Let a slow client pause ``producer`` (``pauseProducing``/``resumeProducing``).

        Never register a process transport directly: it has no
        ``stopProducing`` and the disconnect would go unnoticed.
        """
        self._producer = _ProducerAdapter(producer, on_stop or (lambda: None))
        self._request.registerProducer(self._producer, True)

    def close(self) -> None:
        """End the stream from the server side."""
        if not self.open:
            return
        self._stop()
        if not self.client_gone:
            self._request.finish()
        self.done.callback(None)

    def end_with(self, error: ApiError) -> None:
        """
        End the stream from the server side with an ``error`` event (a
        policy reload took its caller's access away), and stop what feeds
        it as when its client leaves.
        """
        if not self.open:
            return
        if self.error_frame is not None:
            self.write_raw(self.error_frame(error))
        else:
            self.send("error", error.event())
        callbacks, self._disconnect_callbacks = self._disconnect_callbacks, []
        for callback in callbacks:
            callback()
        self.close()

    def _stop(self) -> None:
        self._streams.discard(self)
        self.open = False
        if self._beat_call.active():
            self._beat_call.cancel()
        if self._producer is not None:
            self._producer = None
            # After a disconnect the request has no channel left to unregister from.
            if self._request.channel is not None:
                self._request.unregisterProducer()

    def _lost(self, reason: Failure) -> None:
        if not self.open:
            return
        self.client_gone = True
        self._stop()
        for callback in self._disconnect_callbacks:
            callback()
        self.done.callback(None)


def end_revoked(context: Any) -> None:
    """
    After a policy reload, end (with an ``error`` event) every open stream
    of the HTTP door whose caller may no longer use its endpoint: the
    endpoint switched off, the identity gone, a scope no longer held.  A
    stream lasts as long as its client keeps it (a process's output
    followed, a directory watched), so it is asked again here rather than
    only at its start.  Streams of other doors (MCP's) are their door's.
    """
    for stream in list(context.streams):
        if not isinstance(stream, SSEChannel):
            continue
        admission = getattr(stream._request, "admission", None)
        if admission is None or admission.identity is None:
            continue
        _, error = still_allowed(context, admission.identity, admission.endpoint)
        if error is not None:
            stream.end_with(error)


def resume_point(query: Mapping[str, str], headers: Mapping[str, str]) -> int:
    """
    ``after`` from the query, else ``Last-Event-ID``, else 0; an error names
    the one the client sent.
    """
    raw, name = query.get("after"), "after"
    if raw is None:
        raw, name = headers.get("last-event-id"), "Last-Event-ID"
    return integer(raw, name, 0, low=0)


EventFormatter = Callable[[Event], bytes | list[bytes]]


def default_format(event: Event) -> bytes | list[bytes]:
    """
    ``id: SEQ`` / ``event: NAME`` / ``data: JSON``; a big chunk of output
    in parts (:func:`frame_parts`).
    """
    parts = frame_parts(event.event, event.data, event.seq)
    return parts[0] if len(parts) == 1 else parts


@implementer(IPushProducer)
class Follower:
    """
    Serves one :class:`EventLog` to one SSE client from a resume point.

    The listener is registered before the replay is read, and every write
    goes through :meth:`_pump`, which only ever sends ``seq > last sent``:
    no gap between replay and live, and no repeat.
    """

    def __init__(
        self,
        log: EventLog,
        channel: SSEChannel,
        after: int,
        formatter: EventFormatter = default_format,
        ending: Callable[[], bytes] | None = None,
    ) -> None:
        """
        :param ending: the last frame to write when the log closes, before
            the stream ends (a stream whose clients expect an ``end`` event);
            nothing when it gives no bytes.
        """
        self.log = log
        self.channel = channel
        # An id past the log's end is another log's: from the start.
        self.sent = log.resumed(after)
        self.paused = False
        self.format = formatter
        self.ending = ending
        self.done: Deferred[None] = channel.done
        self._unsubscribe = log.subscribe(self._on_event)
        channel.on_disconnect(self._unsubscribe)
        channel.register_producer(self)
        self._pump()

    def _on_event(self, event: Event | None) -> None:
        if not self.paused:
            self._pump()

    def _pump(self) -> None:
        gap, events = self.log.since(self.sent)
        if gap is not None:
            self.on_gap(gap)
            # Said once, even when no event follows it yet (an id from
            # before a log that numbers from a later start).
            self.sent = max(self.sent, gap[1])
        for event in events:
            if not self.channel.open:
                return
            self.channel.write_raw(self.format(event))
            self.sent = event.seq
            if self.paused:
                # The write filled the connection: the rest waits in the
                # log for resumeProducing, not in the transport's buffer.
                return
        if self.log.closed and self.channel.open:
            self._unsubscribe()
            last = self.ending() if self.ending is not None else b""
            if last:
                self.channel.write_raw(last)
            self.channel.close()

    def on_gap(self, gap: tuple[int, int]) -> None:
        """
        Events ``gap`` (from, to) were dropped before they were sent: a
        ``gap`` frame says so (a stream whose events have a shape of their
        own says it its own way).
        """
        self.channel.send("gap", {"from": gap[0], "to": gap[1]})

    def pauseProducing(self) -> None:
        """The client is slow: stop writing; the log keeps the events."""
        self.paused = True

    def resumeProducing(self) -> None:
        """The client drained: catch up from the log."""
        if self.paused:
            self.paused = False
            self._pump()

    def stopProducing(self) -> None:
        """The client is gone."""
        self._unsubscribe()
