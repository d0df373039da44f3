# -*- test-case-name: tests.kep.test_grpc,tests.kep.test_h2 -*-
"""
A gRPC server over HTTP/2 cleartext with prior knowledge (h2c).

The agent-sandbox SDK opens ``grpc.insecure_channel(target)``: HTTP/2
from the first byte, no TLS, no upgrade.  Twisted's own HTTP/2 is reached
only through TLS ALPN and cannot send trailers, where gRPC puts its
status; so this is a protocol of its own around ``h2``'s sans-I/O
connection, on the model of ``twisted.web._http2`` for flow control and
producers.

What it does, and why:

- One :class:`Call` per stream.  The request is one message (every RPC of
  the door is unary-request); the handler runs once the request's
  END_STREAM arrives, and the call ends when the handler's result is known
  (see :class:`Method`).
- A request message over the limit is refused as soon as its 5-byte
  prefix announces it, before any of it is buffered.
- Response messages are queued per stream and written as the peer's
  flow-control windows allow.  A stream's queue over a high-water mark
  pauses the producer the handler registered (which is how a slow reader
  holds back a process's output); past a hard bound the stream is reset.
  When the transport's own buffer is full (it pauses this protocol),
  nothing more is moved from the queues, so they fill and pause their
  producers too.
- ``grpc-timeout`` is a timer; a reset from the client and a lost
  connection end the call as cancelled.  Either way the handler hears it
  through :meth:`Call.on_end`, its Deferred is cancelled, and nothing more
  is written for it.
- Every ``h2`` protocol error ends the connection with GOAWAY, quietly: a
  client speaking HTTP/1.1 to this port is one of them.  A malformed
  request head is not one: RFC 9113 makes it an error of its stream, so
  it ends that call (INVALID_ARGUMENT) and the connection's other calls
  go on.  A value's surrounding spaces are dropped first, as the HTTP/1.1
  parser drops them on the REST port (``Bearer `` is then no credential:
  401, as there).
- Bounds: connections, streams per connection, header list size, message
  size, queued bytes per stream, idle connections (all in
  :mod:`sandboxd.policy.defaults`).

Requests that are not gRPC are answered as grpc-go answers them (HTTP 415
for a content-type that is not ``application/grpc[+proto]``, 405 for a
method other than POST, 400 for a malformed ``grpc-timeout``), so that a
client sees the same errors from this daemon as from the reference one.
"""

from __future__ import annotations

import enum
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    RemoteSettingsChanged,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import ProtocolError, StreamClosedError
from h2.settings import SettingCodes, Settings
from h2.utilities import HeaderValidationFlags, validate_headers
from hyperframe.frame import GoAwayFrame
from twisted.internet import defer
from twisted.internet.interfaces import (
    IAddress,
    IDelayedCall,
    IPushProducer,
    IReactorTime,
)
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from sandboxd.policy.defaults import (
    BODY_MIN_RATE_BYTES,
    CAP_WARNING_INTERVAL_SECONDS,
    HEADER_DEADLINE_SECONDS,
    KEP_DEADLINE_SLACK_SECONDS,
    KEP_IDLE_TIMEOUT_SECONDS,
    KEP_MAX_BUFFERED_REQUEST_BYTES,
    KEP_MAX_BUFFERED_REQUEST_BYTES_TOTAL,
    KEP_MAX_CONCURRENT_CALLS,
    KEP_MAX_CONCURRENT_STREAMS,
    KEP_MAX_CONNECTIONS,
    KEP_MAX_HEADER_LIST_BYTES,
    KEP_MAX_MESSAGE_BYTES,
    KEP_MAX_STATUS_MESSAGE_BYTES,
    KEP_MAX_UNREAD_CONTROL_BYTES,
    KEP_STOP_GRACE_SECONDS,
    KEP_STREAM_HIGH_WATER_BYTES,
    KEP_STREAM_MAX_QUEUED_BYTES,
)
from sandboxd.proto3 import Schema, WireError, decode, encode

__all__ = [
    "Call",
    "EndReason",
    "GrpcError",
    "GrpcFactory",
    "HeadCheck",
    "Method",
    "Status",
    "parse_timeout",
    "percent_encode",
    "status_message",
]

log = Logger(namespace="sandboxd.kep")

#: Why a call ended other than by :meth:`Call.finish`: the client reset the
#: stream or the connection went away (``cancelled``), its deadline passed
#: (``deadline``), or it read so slowly that the stream's queue passed its
#: hard bound (``overrun``).
EndReason = Literal["cancelled", "deadline", "overrun"]

_PREFIX = 5
_FRAME_HEADER = 9
_GRPC_TYPES = (b"application/grpc", b"application/grpc+proto")
#: What a request's head is checked as (a server's, not trailers).
_REQUEST_HEAD = HeaderValidationFlags(
    is_client=False, is_trailer=False, is_response_header=False, is_push_promise=False
)


def _path_of(raw: list[tuple[bytes, bytes]]) -> str:
    """A request head's ``:path``, for the audit of a refused one."""
    for name, value in raw:
        if name == b":path":
            return value.decode("latin-1")
    return ""


_TRAILER_NAME = re.compile(r"[0-9a-z_.\-]+\Z")
_TIMEOUT = re.compile(rb"([0-9]{1,8})([HMSmun])\Z")
_TIMEOUT_UNITS = {
    b"H": 3600.0,
    b"M": 60.0,
    b"S": 1.0,
    b"m": 1e-3,
    b"u": 1e-6,
    b"n": 1e-9,
}


class Status(enum.IntEnum):
    """The gRPC status codes."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GrpcError(Exception):
    """
    Raised by a handler (or its Deferred's failure) to end the call with
    ``status``; any other exception ends it with ``INTERNAL`` and is logged.

    :ivar trailers: extra trailers sent with the status (lower-case ASCII
        names, printable ASCII values).
    """

    def __init__(
        self,
        status: Status,
        message: str = "",
        trailers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message
        self.trailers: dict[str, str] = dict(trailers or {})

    def __str__(self) -> str:
        return f"{self.status.name}: {self.message}"


#: A handler: the call and its decoded request in; a response dict, None,
#: or a Deferred of either out.
Handler = Callable[["Call", dict[str, Any]], object]

#: :attr:`GrpcFactory.check_head`: the method, the request's headers and
#: the peer in; a refusal, or None.
HeadCheck = Callable[["Method", dict[bytes, list[bytes]], str], "GrpcError | None"]


@attrs.frozen
class Method:
    """
    One RPC the server answers.

    The call ends when the handler's result is known: a Mapping (directly
    or from its Deferred) is sent as a response message, then the call
    finishes with ``OK`` unless the handler finished it already.  So a
    server-streaming handler returns a Deferred that fires when the
    stream is done, calling :meth:`Call.send` meanwhile; a unary one may
    simply return its response.  A :class:`GrpcError` ends the call with
    its status; any other failure with ``INTERNAL`` (logged).  When the
    call ends early (:meth:`Call.on_end`) the handler's Deferred is
    cancelled.

    :ivar path: the ``:path``, e.g. ``/process.v1.ProcessService/Start``.
    """

    path: str
    request: Schema
    response: Schema
    server_streaming: bool
    handler: Handler


def percent_encode(message: str) -> str:
    """``grpc-message``'s encoding: UTF-8, with bytes outside printable ASCII and ``%`` escaped."""
    out = []
    for byte in message.encode("utf-8", "replace"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(chr(byte))
        else:
            out.append(f"%{byte:02X}")
    return "".join(out)


#: How a cut ``grpc-message`` ends: an ellipsis, percent-encoded.
_ELLIPSIS = percent_encode("\u2026")


def status_message(message: str, limit: int = KEP_MAX_STATUS_MESSAGE_BYTES) -> bytes:
    """
    ``grpc-message``'s value, percent-encoded (:func:`percent_encode`), at
    most ``limit`` bytes (cut between characters, an ellipsis after).  A
    refusal may quote what the caller sent, and h2 codes header blocks on
    the reactor in time that grows faster than their size, so an unbounded
    message would stall every connection of the daemon.
    """
    # Each character is at least one byte: what is past the limit goes first.
    encoded = percent_encode(message[: limit + 1])
    if len(encoded) <= limit and len(message) <= limit:
        return encoded.encode("ascii")
    budget = limit - len(_ELLIPSIS)
    pieces: list[str] = []
    for char in message:
        # A character at a time: a cut never splits an escape or a character.
        piece = percent_encode(char)
        budget -= len(piece)
        if budget < 0:
            break
        pieces.append(piece)
    return ("".join(pieces) + _ELLIPSIS).encode("ascii")


def parse_timeout(value: bytes) -> float:
    """
    ``grpc-timeout`` in seconds: at most eight digits and a unit among
    ``H M S m u n``.

    :raises ValueError: for anything else.
    """
    match = _TIMEOUT.match(value.strip())
    if match is None:
        raise ValueError(f"malformed grpc-timeout: {value!r}")
    return int(match.group(1)) * _TIMEOUT_UNITS[match.group(2)]


def _clean_trailers(trailers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    out = []
    for name, value in trailers.items():
        if (
            not _TRAILER_NAME.match(name)
            or name.startswith("grpc-")
            or name.endswith("-bin")
            or not all(0x20 <= ord(c) <= 0x7E for c in value)
        ):
            log.warn(
                "kep: trailer {name!r} dropped: not a plain ASCII trailer", name=name
            )
            continue
        if len(value) > KEP_MAX_STATUS_MESSAGE_BYTES:
            # Bounded as grpc-message is (the value may echo a caller's).
            value = value[: KEP_MAX_STATUS_MESSAGE_BYTES - 3] + "..."
        out.append((name.encode("ascii"), value.encode("ascii")))
    return out


class Call:
    """
    One RPC on one stream, as a handler sees it.

    :ivar method: the method called.
    :ivar headers: the request's headers (lower-case names, raw values,
        pseudo-headers left out); the gate reads ``authorization`` here.
    :ivar peer: the client's host.
    :ivar deadline: seconds the client allowed from ``grpc-timeout``, or None.
    :ivar started: ``time.monotonic()`` when the headers arrived.
    :ivar bytes_in: request message bytes received (prefix included).
    :ivar bytes_out: response message bytes queued (prefixes included).
    :ivar finished: the call has ended, whichever way.
    :ivar cancelled: it ended through :meth:`on_end` (reset, lost
        connection, deadline, overrun).
    """

    def __init__(
        self,
        connection: _Connection,
        stream_id: int,
        method: Method,
        headers: dict[bytes, list[bytes]],
        peer: str,
        deadline: float | None,
    ) -> None:
        self.method = method
        self.headers = headers
        self.peer = peer
        self.deadline = deadline
        self.started = time.monotonic()
        self.bytes_in = 0
        self.bytes_out = 0
        self.finished = False
        self.cancelled = False
        self._connection = connection
        self._stream_id = stream_id
        self._pending: deque[memoryview] = deque()
        self._pending_bytes = 0
        self._headers_sent = False
        self._trailers: list[tuple[bytes, bytes]] | None = None
        self._sent_messages = 0
        self._end_callbacks: list[Callable[[str], None]] = []
        self._producer: IPushProducer | None = None
        self._producer_paused = False
        self._timer: IDelayedCall | None = None
        self._handler_result: defer.Deferred[object] | None = None

    def __repr__(self) -> str:
        return f"<Call {self.method.path} stream {self._stream_id} from {self.peer}>"

    def send(self, message: Mapping[str, Any]) -> None:
        """
        Queue one response message; a no-op once the call has ended.

        :raises RuntimeError: for a second message on a unary method.
        :raises sandboxd.proto3.WireError: when ``message`` does not fit
            the response schema.
        """
        if self.finished:
            return
        if not self.method.server_streaming and self._sent_messages:
            raise RuntimeError(f"{self.method.path} is unary: one response message")
        payload = encode(self.method.response, message)
        if len(payload) > self._connection.factory.max_message_bytes:
            raise GrpcError(
                Status.RESOURCE_EXHAUSTED,
                f"response message of {len(payload)} bytes is over the limit of "
                f"{self._connection.factory.max_message_bytes}",
            )
        self._sent_messages += 1
        framed = b"\x00" + len(payload).to_bytes(4, "big") + payload
        self.bytes_out += len(framed)
        self._connection.send_headers_once(self)
        self._pending.append(memoryview(framed))
        self._pending_bytes += len(framed)
        self._connection.flush_stream(self)
        if self.finished:
            return
        if self._pending_bytes > self._connection.factory.max_queued_bytes:
            log.warn(
                "kep: {call} reset: {n} bytes unread by the client",
                call=self,
                n=self._pending_bytes,
            )
            self._connection.reset(self, ErrorCodes.CANCEL)
            self._end("overrun")
            return
        self._check_producer()

    def finish(
        self,
        status: Status = Status.OK,
        message: str = "",
        trailers: Mapping[str, str] | None = None,
    ) -> None:
        """
        End the call with ``status``: trailers follow the messages still
        queued.  Idempotent; a no-op once the call has ended.  A call that
        sent nothing is answered with headers and status in one frame
        (trailers-only).
        """
        if self.finished:
            return
        fields = [(b"grpc-status", b"%d" % int(status))]
        if message:
            fields.append((b"grpc-message", status_message(message)))
        fields.extend(_clean_trailers(trailers or {}))
        self._close()
        if not self._headers_sent:
            self._headers_sent = True
            self._connection.send_trailers_only(self, 200, fields)
            return
        self._trailers = fields
        self._connection.flush_stream(self)

    def on_end(self, callback: Callable[[str], None]) -> None:
        """
        Call ``callback(reason)`` once if the call ends other than by
        :meth:`finish` (an :data:`EndReason`).  After such an end nothing
        more is written for the call.
        """
        self._end_callbacks.append(callback)

    def register_producer(self, producer: IPushProducer) -> None:
        """
        Pause ``producer`` while this stream's unsent bytes are over the
        high-water mark, resume it once they drain; on an end through
        :meth:`on_end` it is stopped.  Unregistered when the call ends.
        """
        self._producer = producer
        self._producer_paused = False
        self._check_producer()

    def unregister_producer(self) -> None:
        """Forget the producer (it is neither paused, resumed nor stopped again)."""
        self._producer = None

    # -- the connection's side -----------------------------------------------

    @property
    def stream_id(self) -> int:
        """The HTTP/2 stream of the call."""
        return self._stream_id

    def _check_producer(self) -> None:
        producer = self._producer
        if producer is None:
            return
        high = self._connection.factory.high_water_bytes
        if not self._producer_paused and self._pending_bytes > high:
            self._producer_paused = True
            producer.pauseProducing()
        elif self._producer_paused and self._pending_bytes <= high // 4:
            self._producer_paused = False
            producer.resumeProducing()

    def _close(self) -> None:
        """Mark the call ended: timer off, producer forgotten."""
        self.finished = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self._producer = None

    def _end(self, reason: EndReason) -> None:
        """End the call early: nothing more is written; tell the handler."""
        if self.finished and self.cancelled:
            return
        producer = self._producer
        self._close()
        self.cancelled = True
        self._pending.clear()
        self._pending_bytes = 0
        self._trailers = None
        self._connection.forget(self)
        if producer is not None:
            try:
                producer.stopProducing()
            except Exception:
                log.failure("kep: stopping the producer of {call}", call=self)
        callbacks, self._end_callbacks = self._end_callbacks, []
        for callback in callbacks:
            try:
                callback(reason)
            except Exception:
                log.failure("kep: on_end callback of {call}", call=self)
        result = self._handler_result
        if result is not None and not result.called:
            result.cancel()

    def _deadline_passed(self) -> None:
        self._timer = None
        if self.finished:
            return
        if self._pending:
            # Trailers cannot overtake queued data: the stream is reset.
            self._connection.reset(self, ErrorCodes.CANCEL)
        else:
            fields = [
                (b"grpc-status", b"%d" % Status.DEADLINE_EXCEEDED),
                (b"grpc-message", b"deadline exceeded"),
            ]
            if self._headers_sent:
                self._connection.send_trailers(self, fields)
            else:
                self._headers_sent = True
                self._connection.send_trailers_only(self, 200, fields)
        self._end("deadline")

    def _reset_by_client(self) -> None:
        reason: EndReason = "cancelled"
        if self.deadline is not None:
            now = time.monotonic()
            if now >= self.started + self.deadline - KEP_DEADLINE_SLACK_SECONDS:
                reason = "deadline"
        self._end(reason)


@implementer(IPushProducer)
class _Connection(Protocol):
    """One HTTP/2 connection: the ``h2`` state machine and its calls."""

    factory: GrpcFactory

    def __init__(self, factory: GrpcFactory, reactor: IReactorTime) -> None:
        self.factory = factory
        self._reactor = reactor
        self._h2: H2Connection | None = None
        self._calls: dict[int, Call] = {}
        #: Streams being read: the request bytes so far (prefix included).
        self._reading: dict[int, _Request] = {}
        #: Request bytes held for streams being read (the factory sums all).
        self.buffered = 0
        self._paused = False
        #: Bytes written while the transport is paused (its client not reading).
        self._unread = 0
        self._idle: IDelayedCall | None = None
        #: When the connection last had no call open (None: one is open).
        self.idle_since: float | None = None
        #: Closes a connection whose client has not said HTTP/2's preface.
        self._preface: IDelayedCall | None = None
        self._last_stream_id = 0
        self._draining = False
        self._gone = False
        self.peer = ""

    # -- Twisted's hooks ----------------------------------------------------

    def connectionMade(self) -> None:
        address: IAddress = self.transport.getPeer()  # type: ignore[union-attr]
        self.peer = str(getattr(address, "host", address))
        # Request heads are checked per stream (:meth:`_request`): h2's own
        # check would end the connection, and every call on it, for one
        # call's bad header.
        h2 = H2Connection(
            H2Configuration(
                client_side=False, header_encoding=None, validate_inbound_headers=False
            )
        )
        factory = self.factory
        h2.local_settings = Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: factory.max_concurrent_streams,
                SettingCodes.MAX_HEADER_LIST_SIZE: factory.max_header_list_bytes,
                SettingCodes.ENABLE_PUSH: 0,
            },
        )
        # The settings above are the initial ones, so no ACK changes the
        # decoder's bound: set it here.
        h2.decoder.max_header_list_size = factory.max_header_list_bytes
        h2.initiate_connection()
        self._h2 = h2
        self.transport.registerProducer(self, True)  # type: ignore[union-attr]
        self._write()
        self._arm_idle()
        self._preface = self._reactor.callLater(
            HEADER_DEADLINE_SECONDS, self._preface_overdue
        )

    def _preface_overdue(self) -> None:
        """A client that opened and never spoke HTTP/2 makes room for others."""
        self._preface = None
        log.info("kep: connection from {peer} closed: no preface", peer=self.peer)
        self._abort()

    def dataReceived(self, data: bytes) -> None:
        h2 = self._h2
        if h2 is None or self._gone:
            return
        try:
            events = h2.receive_data(data)
        except ProtocolError as e:
            log.info(
                "kep: connection from {peer} closed: {error}", peer=self.peer, error=e
            )
            self._write()
            self._abort()
            return
        # What h2 left unparsed starts with the next frame's header; h2
        # checks its length only once the whole frame is in, so one
        # announcing 16 MiB would be waited for and buffered to the end.
        pending = h2.incoming_buffer._data
        if (
            len(pending) >= _FRAME_HEADER
            and int.from_bytes(pending[:3], "big") > h2.max_inbound_frame_size
        ):
            log.info(
                "kep: connection from {peer} closed: a frame over {n} bytes",
                peer=self.peer,
                n=h2.max_inbound_frame_size,
            )
            self._abort()
            return
        for event in events:
            self._handle(event)
        self._write()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._gone = True
        for timer in (self._idle, self._preface):
            if timer is not None and timer.active():
                timer.cancel()
        self._idle = self._preface = None
        for call in list(self._calls.values()):
            if not call.finished:
                call._end("cancelled")
        self._calls.clear()
        self._reading.clear()
        self.factory.buffered -= self.buffered
        self.buffered = 0
        self.factory._forget(self)

    # -- IPushProducer, for the transport -------------------------------------

    def pauseProducing(self) -> None:
        """The transport's buffer is full: stop moving queued bytes into it."""
        self._paused = True

    def resumeProducing(self) -> None:
        """The transport drained: move queued bytes again."""
        self._paused = False
        self._unread = 0
        self._flush_all()
        self._write()

    def stopProducing(self) -> None:
        """The transport is going away; connectionLost follows."""
        self._paused = True

    # -- events ---------------------------------------------------------------

    def _handle(self, event: Event) -> None:
        if self._preface is not None and isinstance(event, RemoteSettingsChanged):
            # The preface ends with the client's SETTINGS.
            if self._preface.active():
                self._preface.cancel()
            self._preface = None
        if isinstance(event, RequestReceived):
            assert event.stream_id is not None and event.headers is not None
            self._request(event.stream_id, event.headers, bool(event.stream_ended))
        elif isinstance(event, DataReceived):
            assert event.stream_id is not None
            self._data(
                event.stream_id, event.data or b"", event.flow_controlled_length or 0
            )
        elif isinstance(event, StreamEnded):
            assert event.stream_id is not None
            self._request_ended(event.stream_id)
        elif isinstance(event, StreamReset):
            assert event.stream_id is not None
            self._take(event.stream_id)
            call = self._calls.pop(event.stream_id, None)
            if call is not None and not call.finished:
                call._reset_by_client()
            self._check_idle()
        elif isinstance(event, WindowUpdated):
            if event.stream_id:
                call = self._calls.get(event.stream_id)
                if call is not None:
                    self.flush_stream(call)
            else:
                self._flush_all()
        elif isinstance(event, RemoteSettingsChanged):
            self._flush_all()
        elif isinstance(event, ConnectionTerminated):
            # The client will open no stream; those it has may finish.
            self._draining = True
            self._check_idle()

    def _request(
        self, stream_id: int, raw: list[tuple[bytes, bytes]], ended: bool
    ) -> None:
        self._last_stream_id = max(self._last_stream_id, stream_id)
        if self._draining:
            self._reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            return
        self._cancel_idle()
        raw = [
            (name, value if name.startswith(b":") else value.strip(b" \t"))
            for name, value in raw
        ]
        try:
            list(validate_headers(raw, _REQUEST_HEAD))
        except ProtocolError as e:
            self._early(
                stream_id,
                ended,
                200,
                Status.INVALID_ARGUMENT,
                # Without the value h2 quotes: it may be a credential.
                f"malformed request headers: {str(e).split(': b', 1)[0]}",
                path=_path_of(raw),
            )
            return
        pseudo: dict[bytes, bytes] = {}
        headers: dict[bytes, list[bytes]] = {}
        for name, value in raw:
            if name.startswith(b":"):
                pseudo[name] = value
            else:
                headers.setdefault(name.lower(), []).append(value)
        authority = pseudo.get(b":authority")
        if authority is not None and b"host" not in headers:
            # HTTP/2's Host: the gate's local-mode Host rule reads it there.
            headers[b"host"] = [authority]
        path = pseudo.get(b":path", b"").decode("latin-1")
        if len(self._calls) >= self.factory.max_concurrent_calls:
            self._early(
                stream_id,
                ended,
                200,
                Status.RESOURCE_EXHAUSTED,
                f"too many calls open on this connection (at most "
                f"{self.factory.max_concurrent_calls}); end one, or open another "
                "connection",
                [(b"x-sandboxd-code", b"concurrency_limited")],
                path=path,
                headers=headers,
                code="concurrency_limited",
            )
            return
        content_type = (headers.get(b"content-type") or [b""])[0]
        bare = content_type.split(b";", 1)[0].strip().lower()
        if bare not in _GRPC_TYPES:
            self._early(
                stream_id,
                ended,
                415,
                Status.INVALID_ARGUMENT,
                f'invalid gRPC request content-type "{content_type.decode("latin-1")}"',
                path=path,
                headers=headers,
            )
            return
        verb = pseudo.get(b":method", b"")
        if verb != b"POST":
            self._early(
                stream_id,
                ended,
                405,
                Status.INTERNAL,
                f"gRPC requires POST, not {verb.decode('latin-1')}",
                path=path,
                headers=headers,
            )
            return
        deadline: float | None = None
        timeout = headers.get(b"grpc-timeout")
        if timeout:
            try:
                deadline = parse_timeout(timeout[0])
            except ValueError as e:
                self._early(
                    stream_id,
                    ended,
                    400,
                    Status.INTERNAL,
                    str(e),
                    path=path,
                    headers=headers,
                )
                return
        encoding = (headers.get(b"grpc-encoding") or [b"identity"])[0]
        if encoding != b"identity":
            self._early(
                stream_id,
                ended,
                200,
                Status.UNIMPLEMENTED,
                f"grpc-encoding {encoding.decode('latin-1')} is not supported "
                "(messages are not compressed here)",
                [(b"grpc-accept-encoding", b"identity")],
                path=path,
                headers=headers,
            )
            return
        method = self.factory.methods.get(path)
        if method is None:
            self._early(
                stream_id,
                ended,
                200,
                Status.UNIMPLEMENTED,
                f"unknown method {path}",
                path=path,
                headers=headers,
            )
            return
        check = self.factory.check_head
        refused = check(method, headers, self.peer) if check is not None else None
        if refused is not None:
            # Before any of the body: a caller the door would refuse makes
            # it hold nothing (the hook has written the refusal's audit).
            fields = [
                (b"grpc-status", b"%d" % refused.status),
                (b"grpc-message", status_message(refused.message)),
                *_clean_trailers(refused.trailers),
            ]
            self._trailers_only(stream_id, 200, fields)
            if not ended:
                self._reset_stream(stream_id, ErrorCodes.NO_ERROR)
            self._check_idle()
            return
        call = Call(self, stream_id, method, headers, self.peer, deadline)
        self._calls[stream_id] = call
        request = self._reading[stream_id] = _Request(started=call.started)
        if not ended:
            self._arm_read_check(stream_id, request)
        if deadline is not None:
            call._timer = self._reactor.callLater(deadline, call._deadline_passed)
        if ended:
            self._request_ended(stream_id)

    def _data(self, stream_id: int, data: bytes, flow_length: int) -> None:
        h2 = self._h2
        assert h2 is not None
        # The request is bounded by the message limit, so what arrives is
        # acknowledged at once: the client's window refills.
        try:
            h2.acknowledge_received_data(flow_length, stream_id)
        except StreamClosedError:
            pass
        request = self._reading.get(stream_id)
        call = self._calls.get(stream_id)
        if request is None or call is None or call.finished:
            return
        call.bytes_in += len(data)
        request.body += data
        self.buffered += len(data)
        self.factory.buffered += len(data)
        if request.length is None and len(request.body) >= _PREFIX:
            flag = request.body[0]
            length = int.from_bytes(request.body[1:_PREFIX], "big")
            if flag == 1:
                self._refuse(
                    call,
                    Status.UNIMPLEMENTED,
                    "the request message is compressed, with no grpc-encoding "
                    "negotiated (messages are not compressed here)",
                )
                return
            if flag != 0:
                self._refuse(call, Status.INVALID_ARGUMENT, f"bad message flag {flag}")
                return
            limit = self.factory.max_message_bytes
            if length > limit:
                self._refuse(
                    call,
                    Status.RESOURCE_EXHAUSTED,
                    f"request message of {length} bytes is over the limit of {limit}",
                )
                return
            request.length = length
        if request.length is not None and len(request.body) > _PREFIX + request.length:
            self._refuse(
                call,
                Status.INVALID_ARGUMENT,
                f"more than one request message for {call.method.path}",
            )
            return
        factory = self.factory
        if (
            self.buffered > factory.max_buffered_bytes
            or factory.buffered > factory.max_buffered_bytes_total
        ):
            self._refuse(
                call,
                Status.RESOURCE_EXHAUSTED,
                "too many request bytes are waiting for their messages to end "
                "(on this connection or the port); try again",
            )

    def _take(self, stream_id: int) -> _Request | None:
        """Stop reading a stream's request; its bytes no longer count."""
        request = self._reading.pop(stream_id, None)
        if request is not None:
            self.buffered -= len(request.body)
            self.factory.buffered -= len(request.body)
            if request.timer is not None and request.timer.active():
                request.timer.cancel()
            request.timer = None
        return request

    def _read_check(self, stream_id: int) -> None:
        """
        Whether a request still being read has come fast enough: whole
        within the factory's ``read_grace``, or averaging ``read_min_rate``
        bytes a second after it, as the HTTP door bounds a body.  Without
        it, a client that sends part of a message (or a whole one and no
        end) held the call, its stream and its bytes for as long as it
        liked.  Looked at again when the bytes in would fall short.
        """
        request = self._reading.get(stream_id)
        call = self._calls.get(stream_id)
        if request is None or call is None or call.finished:
            return
        request.timer = None
        factory = self.factory
        elapsed = time.monotonic() - request.started
        owed = (elapsed - factory.read_grace) * factory.read_min_rate
        if len(request.body) < owed:
            self._refuse(
                call,
                Status.DEADLINE_EXCEEDED,
                f"the request message of {call.method.path} came too slowly: "
                f"{len(request.body)} bytes and no end in {elapsed:.0f} s (it must "
                f"be whole within {factory.read_grace:g} s, or average "
                f"{factory.read_min_rate:g} bytes a second after them)",
            )
            return
        self._arm_read_check(stream_id, request)

    def _arm_read_check(self, stream_id: int, request: _Request) -> None:
        """Look at the request again when its bytes so far stop being enough."""
        factory = self.factory
        due = (
            request.started
            + factory.read_grace
            + len(request.body) / factory.read_min_rate
        )
        request.timer = self._reactor.callLater(
            max(0.0, due - time.monotonic()) + 0.01, self._read_check, stream_id
        )

    def _request_ended(self, stream_id: int) -> None:
        request = self._take(stream_id)
        call = self._calls.get(stream_id)
        if request is None or call is None or call.finished:
            return
        if request.length is None or len(request.body) < _PREFIX + request.length:
            what = (
                "no request message"
                if not request.body
                else "a truncated request message"
            )
            self._refuse(
                call, Status.INVALID_ARGUMENT, f"{call.method.path} got {what}"
            )
            return
        try:
            message = decode(call.method.request, bytes(request.body[_PREFIX:]))
        except WireError as e:
            self._refuse(call, Status.INVALID_ARGUMENT, f"undecodable request: {e}")
            return
        del request.body[:]
        self._run(call, message)

    def _run(self, call: Call, message: dict[str, Any]) -> None:
        result: defer.Deferred[object] = defer.maybeDeferred(
            call.method.handler, call, message
        )
        if not call.finished:
            call._handler_result = result
        result.addCallbacks(
            lambda value: self._handler_done(call, value),
            lambda failure: self._handler_failed(call, failure),
        )

    def _handler_done(self, call: Call, value: object) -> None:
        call._handler_result = None
        if call.finished:
            return
        try:
            if isinstance(value, Mapping):
                call.send(value)
        except Exception:
            self._handler_failed(call, Failure())
            return
        call.finish()

    def _handler_failed(self, call: Call, failure: Failure) -> None:
        call._handler_result = None
        error = failure.value
        if call.finished:
            if not isinstance(error, defer.CancelledError):
                log.failure("kep: {call} failed after it ended", failure, call=call)
            return
        if isinstance(error, GrpcError):
            call.finish(error.status, error.message, error.trailers)
            return
        log.failure("kep: {call} failed", failure, call=call)
        call.finish(Status.INTERNAL, "internal error")

    # -- writing ----------------------------------------------------------------

    def send_headers_once(self, call: Call) -> None:
        """Send the response headers before the first message."""
        if call._headers_sent or self._gone:
            return
        call._headers_sent = True
        assert self._h2 is not None
        self._h2.send_headers(
            call.stream_id,
            [(b":status", b"200"), (b"content-type", b"application/grpc")],
        )

    def send_trailers_only(
        self, call: Call, status: int, fields: list[tuple[bytes, bytes]]
    ) -> None:
        """Answer a call that sent nothing with one HEADERS frame."""
        self._trailers_only(call.stream_id, status, fields)
        request_open = call.stream_id in self._reading
        self.forget(call)
        if request_open:
            self._reset_stream(call.stream_id, ErrorCodes.NO_ERROR)
        self._write()

    def send_trailers(self, call: Call, fields: list[tuple[bytes, bytes]]) -> None:
        """End a call's stream with its trailers."""
        if not self._gone:
            assert self._h2 is not None
            try:
                self._h2.send_headers(call.stream_id, fields, end_stream=True)
            except (ProtocolError, StreamClosedError):
                pass
            if call.stream_id in self._reading:
                self._reset_stream(call.stream_id, ErrorCodes.NO_ERROR)
        self.forget(call)
        self._write()

    def flush_stream(self, call: Call) -> None:
        """Move a call's queued bytes into h2 as its windows allow, then its trailers."""
        h2 = self._h2
        if h2 is None or self._gone or call.stream_id not in self._calls:
            return
        stream_id = call.stream_id
        pending = call._pending
        while pending and not self._paused:
            try:
                window = h2.local_flow_control_window(stream_id)
            except (ProtocolError, StreamClosedError):
                return
            if window <= 0:
                break
            head = pending[0]
            size = min(window, h2.max_outbound_frame_size, len(head))
            h2.send_data(stream_id, bytes(head[:size]))
            call._pending_bytes -= size
            if size == len(head):
                pending.popleft()
            else:
                pending[0] = head[size:]
        if not pending and call._trailers is not None:
            fields, call._trailers = call._trailers, None
            self.send_trailers(call, fields)
            return
        call._check_producer()
        self._write()

    def reset(self, call: Call, code: ErrorCodes) -> None:
        """Reset a call's stream."""
        self._reset_stream(call.stream_id, code)
        self.forget(call)
        self._write()

    def forget(self, call: Call) -> None:
        """The call's stream is done with."""
        self._calls.pop(call.stream_id, None)
        self._take(call.stream_id)
        self._check_idle()

    def _trailers_only(
        self,
        stream_id: int,
        status: int,
        fields: list[tuple[bytes, bytes]],
    ) -> None:
        if self._gone:
            return
        assert self._h2 is not None
        headers = [
            (b":status", str(status).encode("ascii")),
            (b"content-type", b"application/grpc"),
            *fields,
        ]
        try:
            self._h2.send_headers(stream_id, headers, end_stream=True)
        except (ProtocolError, StreamClosedError):
            pass

    def _early(
        self,
        stream_id: int,
        ended: bool,
        http_status: int,
        status: Status,
        message: str,
        extra: list[tuple[bytes, bytes]] | None = None,
        *,
        path: str = "",
        headers: dict[bytes, list[bytes]] | None = None,
        code: str | None = None,
    ) -> None:
        self.report(
            Refusal(
                path,
                headers or {},
                self.peer,
                status,
                message,
                time.monotonic(),
                code=code,
            )
        )
        fields = [
            (b"grpc-status", b"%d" % status),
            (b"grpc-message", status_message(message)),
            *(extra or []),
        ]
        self._trailers_only(stream_id, http_status, fields)
        if not ended:
            self._reset_stream(stream_id, ErrorCodes.NO_ERROR)
        self._check_idle()

    def _refuse(self, call: Call, status: Status, message: str) -> None:
        """Answer a call whose request the transport cannot take."""
        self.report(
            Refusal(
                call.method.path,
                call.headers,
                self.peer,
                status,
                message,
                call.started,
                call.bytes_in,
            )
        )
        call.finish(status, message)

    def report(self, refusal: Refusal) -> None:
        """Tell the factory's ``on_refusal`` (a failing one is logged)."""
        hook = self.factory.on_refusal
        if hook is None:
            return
        try:
            hook(refusal)
        except Exception:
            log.failure("kep: reporting a refused call failed")

    def _reset_stream(self, stream_id: int, code: ErrorCodes) -> None:
        if self._gone or self._h2 is None:
            return
        try:
            self._h2.reset_stream(stream_id, code)
        except (ProtocolError, StreamClosedError):
            pass

    def _flush_all(self) -> None:
        for call in list(self._calls.values()):
            if call._pending or call._trailers is not None:
                self.flush_stream(call)

    def _write(self) -> None:
        if self._h2 is None or self.transport is None:
            return
        data = self._h2.data_to_send()
        if data and not self._gone:
            if self._paused:
                # Only what h2 answers by itself moves now (a PING's or a
                # SETTINGS' acknowledgement): a flood of them is cut here.
                self._unread += len(data)
                if self._unread > self.factory.max_unread_bytes:
                    log.info(
                        "kep: connection from {peer} cut: {n} bytes unread",
                        peer=self.peer,
                        n=self._unread,
                    )
                    self._abort(hard=True)
                    return
            self.transport.write(data)

    def _abort(self, hard: bool = False) -> None:
        self._gone = True
        if self.transport is None:
            return
        if hard:
            self.transport.abortConnection()  # type: ignore[attr-defined]
        else:
            self.transport.loseConnection()

    # -- idle connections and stops -----------------------------------------------

    def _arm_idle(self) -> None:
        self._cancel_idle()
        self.idle_since = self._reactor.seconds()
        self._idle = self._reactor.callLater(
            self.factory.idle_timeout, self._idle_expired
        )

    def _cancel_idle(self) -> None:
        self.idle_since = None
        if self._idle is not None and self._idle.active():
            self._idle.cancel()
        self._idle = None

    def _check_idle(self) -> None:
        if self._calls or self._gone:
            return
        if self._draining:
            self.close()
        elif self._idle is None:
            self._arm_idle()

    def _idle_expired(self) -> None:
        self._idle = None
        if not self._calls:
            self.close()

    def go_away(self) -> None:
        """
        Tell the client no new stream will be taken, keeping those open.

        ``h2``'s own GOAWAY closes its state machine, after which the open
        streams could not finish; so the frame is written here, and h2's
        comes with :meth:`close`.
        """
        if self._gone or self._h2 is None:
            return
        self._draining = True
        self._write()
        frame = GoAwayFrame(stream_id=0)
        frame.last_stream_id = self._last_stream_id
        frame.error_code = ErrorCodes.NO_ERROR
        assert self.transport is not None
        self.transport.write(frame.serialize())
        self._check_idle()

    def close(self) -> None:
        """GOAWAY and close; open calls end as cancelled."""
        if self._gone or self._h2 is None:
            return
        try:
            self._h2.close_connection(last_stream_id=self._last_stream_id)
        except ProtocolError:
            pass
        self._write()
        self._abort()

    @property
    def open_calls(self) -> int:
        """Calls still running on this connection."""
        return len(self._calls)


@attrs.define
class _Request:
    body: bytearray = attrs.field(factory=bytearray)
    length: int | None = None
    #: ``time.monotonic()`` when its headers arrived.
    started: float = 0.0
    #: Ends the call when the request comes too slowly (see ``_read_check``).
    timer: IDelayedCall | None = None


@attrs.frozen
class Refusal:
    """
    A call the transport answered itself, before any handler ran (not
    gRPC, a method it does not serve, a message it cannot take): the
    factory's ``on_refusal`` is told, so the door can audit it.
    """

    path: str
    headers: dict[bytes, list[bytes]]
    peer: str
    status: Status
    message: str
    started: float
    bytes_in: int = 0
    #: sandboxd's code for it, where its status alone does not say.
    code: str | None = None


class GrpcFactory(Factory):
    """
    The gRPC door's listening factory.

    :param methods: the methods by ``:path``.
    :param max_concurrent_calls: calls running at once on one connection;
        one more is answered ``RESOURCE_EXHAUSTED`` at once (the streams
        advertised, ``max_concurrent_streams``, are more, so that it
        reaches the door rather than wait unseen in the client).
    :param max_connections: connections over it are closed as they open.
    :param max_unread_bytes: what may be written to a client that reads
        nothing before its connection is cut.
    :param idle_timeout: seconds a connection may have no open stream.
    :param max_buffered_bytes: request bytes one connection may have the
        daemon hold for messages not yet whole; a stream that passes it
        is refused ``RESOURCE_EXHAUSTED``.
    :param max_buffered_bytes_total: the same, all connections together.
    :ivar check_head: asked of each call on its headers, before any of its
        body is taken: a :class:`GrpcError` answers the call at once
        (the hook audits it), None lets it in.
    """

    #: The daemon logs what its ports do itself, once, at start.
    noisy = False

    def logPrefix(self) -> str:
        """How the log names this listener."""
        return "kep-grpc"

    def __init__(
        self,
        reactor: IReactorTime,
        methods: Mapping[str, Method],
        *,
        max_message_bytes: int = KEP_MAX_MESSAGE_BYTES,
        max_concurrent_streams: int = KEP_MAX_CONCURRENT_STREAMS,
        max_concurrent_calls: int = KEP_MAX_CONCURRENT_CALLS,
        max_connections: int = KEP_MAX_CONNECTIONS,
        idle_timeout: float = KEP_IDLE_TIMEOUT_SECONDS,
        max_header_list_bytes: int = KEP_MAX_HEADER_LIST_BYTES,
        high_water_bytes: int = KEP_STREAM_HIGH_WATER_BYTES,
        max_queued_bytes: int = KEP_STREAM_MAX_QUEUED_BYTES,
        max_unread_bytes: int = KEP_MAX_UNREAD_CONTROL_BYTES,
        max_buffered_bytes: int = KEP_MAX_BUFFERED_REQUEST_BYTES,
        max_buffered_bytes_total: int = KEP_MAX_BUFFERED_REQUEST_BYTES_TOTAL,
        read_grace: float = HEADER_DEADLINE_SECONDS,
        read_min_rate: float = BODY_MIN_RATE_BYTES,
        on_refusal: Callable[[Refusal], None] | None = None,
        check_head: HeadCheck | None = None,
    ) -> None:
        for path, method in methods.items():
            if path != method.path:
                raise ValueError(f"method {method.path} listed under {path}")
        self.reactor = reactor
        self.methods = dict(methods)
        self.max_message_bytes = max_message_bytes
        self.max_concurrent_streams = max_concurrent_streams
        self.max_concurrent_calls = max_concurrent_calls
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.max_header_list_bytes = max_header_list_bytes
        self.high_water_bytes = high_water_bytes
        self.max_unread_bytes = max_unread_bytes
        # A single message may always be queued whole.
        self.max_queued_bytes = max(
            max_queued_bytes, max_message_bytes + high_water_bytes
        )
        self.max_buffered_bytes = max_buffered_bytes
        self.max_buffered_bytes_total = max_buffered_bytes_total
        #: A request message must be whole within ``read_grace`` seconds,
        #: or average ``read_min_rate`` bytes a second after them.
        self.read_grace = read_grace
        self.read_min_rate = read_min_rate
        #: Request bytes held, all connections together.
        self.buffered = 0
        self.on_refusal = on_refusal
        self.check_head = check_head
        self.connections: set[_Connection] = set()
        self._stopping = False
        self._stopped: list[defer.Deferred[None]] = []
        self._refused = 0
        self._last_warning = float("-inf")

    def buildProtocol(self, addr: IAddress) -> _Connection | None:  # type: ignore[override]
        """
        A connection, or None (closed at once) when stopping or at the cap;
        at the cap, the connection idle the longest (no call open) is closed
        to make room, as the HTTP port does, so idle clients cannot keep a
        working one out.
        """
        if not self._stopping and len(self.connections) >= self.max_connections:
            self._reclaim()
        if self._stopping or len(self.connections) >= self.max_connections:
            self._refused += 1
            now = self.reactor.seconds()
            if now - self._last_warning >= CAP_WARNING_INTERVAL_SECONDS:
                log.warn(
                    "kep: {n} connection(s) refused ({why})",
                    n=self._refused,
                    why="stopping"
                    if self._stopping
                    else f"{self.max_connections} open",
                )
                self._last_warning = now
                self._refused = 0
            return None
        connection = _Connection(self, self.reactor)
        self.connections.add(connection)
        return connection

    def _reclaim(self) -> None:
        """Close the connection idle the longest, if one is."""
        idle = [c for c in self.connections if c.idle_since is not None]
        if idle:
            oldest = min(idle, key=lambda c: c.idle_since or 0.0)
            self.connections.discard(oldest)
            oldest.close()

    def _forget(self, connection: _Connection) -> None:
        self.connections.discard(connection)
        if not self.connections and self._stopped:
            waiting, self._stopped = self._stopped, []
            for d in waiting:
                d.callback(None)

    def stop(self, grace: float = KEP_STOP_GRACE_SECONDS) -> defer.Deferred[None]:
        """
        Refuse new connections, send GOAWAY on each open one, let running
        calls finish for ``grace`` seconds, then close what is left (its
        calls end as cancelled).  Fires when every connection is gone.
        """
        self._stopping = True
        d: defer.Deferred[None] = defer.Deferred()
        if not self.connections:
            d.callback(None)
            return d
        self._stopped.append(d)
        for connection in list(self.connections):
            connection.go_away()

        def deadline() -> None:
            for connection in list(self.connections):
                connection.close()

        timer = self.reactor.callLater(grace, deadline)

        def stopped(result: None) -> None:
            if timer.active():
                timer.cancel()
            return result

        d.addCallback(stopped)
        return d
