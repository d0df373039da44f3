# -*- test-case-name: tests.web.test_request -*-
"""
The HTTP connection: Twisted's ``HTTPChannel`` with the bounds a daemon
facing untrusted clients needs and Twisted does not set.

- At most :data:`~sandboxd.policy.defaults.MAX_HTTP_CONNECTIONS` open
  connections, and :data:`~sandboxd.policy.defaults.MAX_CONNECTIONS_PER_PEER`
  from one address, so a flood cannot take the file descriptors that
  files, children and terminals need; a request's head must be complete
  within :data:`~sandboxd.policy.defaults.HEADER_DEADLINE_SECONDS`
  (slowloris: Twisted's idle timeout is reset by every byte).  The channel
  tells the site's :class:`~sandboxd.web.connections.ConnectionTable` when
  a head starts and ends and when it goes idle; the table decides.
- A request's head is read in one pass by :func:`~sandboxd.web.heads.parse_head`
  once it is all in the buffer, not line by line through Twisted's
  ``LineReceiver`` and a method call per header: fewer headers than
  Twisted allows (500), obs-folded lines refused (Twisted joins them, so a
  token, Host or length could read differently to a proxy in front of
  us), the body framing decided by the RFC 9112 rules.  What follows the
  head is Twisted's again: its body decoders, its pipelining (one request
  at a time, the next one's bytes held), its ``Request`` and the
  pipeline's hooks on it.
- A request's body must keep coming (the table's minimum rate after the
  head deadline's grace: 408 ``timeout`` otherwise), and a response's
  client must keep taking it: the idle timeout, which Twisted resets with
  every byte the client sends and this channel keeps running while a
  request is handled, cuts a connection whose client took none of the
  bytes waiting for it for two idle periods in a row (a download or a
  stream whose client reads nothing would otherwise hold its request,
  slot and descriptors for good; its memory is already bounded, since
  the response is paused).  What the client took is the kernel's count
  (:mod:`sandboxd.web.delivery`), so a client reading 1 KB/s is never
  taken for one reading nothing.
- Whatever the parser (or Twisted's body decoder) refuses gets a 400
  ``malformed_request`` in the framing of the site's door, like every
  other error of that door, not a bare status line: the site's
  ``refusal`` frames it (:class:`~sandboxd.web.factory.HardenedSite`).
- A request answered before it was read whole (any refusal written
  before its body) is closed the way nginx's ``lingering_close`` does:
  its answer first, then what its client still sends read and dropped
  for a bounded time (:meth:`SandboxChannel.close_after_answer`), so
  the answer is not destroyed by the reset that closing on unread bytes
  sends: on TCP, unix sockets and TLS alike.

HTTP/2 is not offered (HTTP/1.1 only; see docs/operations.md), so the
channel is used directly rather than through Twisted's protocol switcher.
"""

from __future__ import annotations

import select
import socket
from typing import Any

from twisted.internet.interfaces import IProtocol, ISSLTransport
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from twisted.web.http import (
    HTTPChannel,
    _ChunkedTransferDecoder,
    _IdentityTransferDecoder,
)
from twisted.web.http_headers import _nameEncoder

from sandboxd.errors import ApiError, malformed_request, timed_out
from sandboxd.policy.defaults import LINGER_MAX_BYTES, MAX_HEADERS
from sandboxd.web.connections import ConnectionLimits
from sandboxd.web.delivery import Delivery, delivery, stalled, untouched
from sandboxd.web.dispatch import reason_phrase
from sandboxd.web.heads import Head, HeadError, parse_head
from sandboxd.web.sending import send_now

log = Logger(namespace="sandboxd.connections")


def target_path(head: bytes) -> str:
    """
    The path of the request line at the front of ``head`` (which may end
    anywhere, even inside the target), or ``""`` when none was read.
    """
    _, space, rest = head.partition(b" ")
    if not space:
        return ""
    target = rest.split(b" ", 1)[0].split(b"\r", 1)[0].split(b"\n", 1)[0]
    return target.partition(b"?")[0].decode("latin-1")


def header_value(head: bytes, name: bytes) -> bytes | None:
    """
    The first value of header ``name`` (lower-case) among the lines of a
    head the parser refused (which may end anywhere), or None: read only
    to choose how the refusal is presented, never to act on.
    """
    for line in head.split(b"\r\n")[1 : MAX_HEADERS + 1]:
        field, colon, value = line.partition(b":")
        if colon and field.lower() == name:
            return value.strip(b" \t")
    return None


class SandboxChannel(HTTPChannel):
    """One client connection."""

    maxHeaders = MAX_HEADERS
    peer_host = ""
    #: Whether a request head is on its way (see :meth:`dataReceived`).
    _in_head = False
    _secure: bool | None = None
    #: The head of the request being read or handled.
    head: Head | None = None
    #: Handed to another protocol (see :meth:`take_over`): read no more.
    _taken = False
    _peer: Any = None
    #: What the client had taken at the last idle check of a response.
    _delivered: Delivery | None = None
    #: Answered before its request was read whole, and reading what the
    #: client still sends before closing (see :meth:`close_after_answer`).
    _lingering = False
    #: Bytes the lingering connection may still read and drop.
    _linger_left = 0
    #: When the lingering connection is cut, whatever its client does.
    _linger_end: Any = None

    def isSecure(self) -> bool:
        """
        Whether the connection is TLS: asked once per connection, not per
        request (a transport never changes between the two).
        """
        if self._secure is None:
            self._secure = bool(super().isSecure())
        return self._secure

    def connectionMade(self) -> None:
        """Count the connection; close it at once when over a cap."""
        super().connectionMade()
        # A response, an SSE event or a streamed chunk goes out as soon as
        # it is written: with Nagle's algorithm a small write waits for the
        # ACK of the one before, which a client may delay by 40 ms.
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            try:
                set_no_delay(True)
            except OSError:
                pass
        peer = self._peer = (
            self.transport.getPeer() if self.transport is not None else None
        )
        self.peer_host = getattr(peer, "host", "") or ""
        site: Any = self.site  # type: ignore[attr-defined]
        self._site_table = getattr(site, "table", None)
        # The first request's head is due from now, before any byte.
        self._in_head = True
        if not site.connection_opened(self):
            self.transport.abortConnection()  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        """
        Read heads whole, and hand bodies (and the bytes of requests that
        wait behind the one being handled) to Twisted's raw mode.

        The first byte of a request on a kept-alive connection starts its
        head's deadline.  A call made while this one runs (a request
        finished synchronously hands its successor's bytes back) only
        appends to the buffer, which this loop then reads, as
        ``LineReceiver`` does.
        """
        self.resetTimeout()
        if self._lingering:
            self._linger_left -= len(data)
            if self._linger_left < 0:
                self.cut_lingering()
            return
        if self._busyReceiving:
            self._buffer += data
            return
        if not self._in_head and not self.requests and not self._handlingRequest:
            self._in_head = True
            table = self._site_table
            if table is False:
                table = self._table()
            if table is not None:
                table.head_started(self)
        self._busyReceiving = True
        try:
            self._buffer += data
            while (
                self._buffer
                and not self.paused
                and not self._taken
                and not self._lingering
            ):
                if self.line_mode:
                    if not self._read_head():
                        return
                else:
                    data, self._buffer = self._buffer, b""
                    table = self._site_table
                    if table:
                        table.body_read(self, len(data))
                    self.rawDataReceived(data)
        finally:
            self._busyReceiving = False

    def _read_head(self) -> bool:
        """
        Start the request whose head is at the front of the buffer.

        :return: whether to read on (False: the head is incomplete, refused,
            or the connection is closing).
        """
        buffer = self._buffer
        if not self.persistent:
            # Bytes after the last request of a closing connection.
            self._buffer = b""
            return False
        try:
            head = parse_head(buffer)
        except HeadError as e:
            self._buffer = b""
            self._refuse_head(e.reason, buffer)
            return False
        if head is None:
            return False
        self._buffer = buffer[head.size :]
        self._start_request(head)
        transport = self.transport
        return transport is not None and not transport.disconnecting  # type: ignore[attr-defined]

    def _start_request(self, head: Head) -> None:
        """
        Build the request from ``head`` and take it as far as Twisted's
        line parser would have at the blank line: headers received, then
        the body (raw mode) or, without one, the request itself.
        """
        request: Any = self.requestFactory(self, len(self.requests))
        self.requests.append(request)
        self.head = head
        self._command = head.method
        self._path = head.target
        self._version = head.version
        # The names are checked tokens: Twisted's Headers holds them in
        # its canonical case, which its encoder keeps cached.
        raw = request.requestHeaders._rawHeaders
        # Its cache first: a look-up rather than a call per header.
        canonical = _nameEncoder._canonicalHeaderCache.get
        encode = _nameEncoder.encode
        for name, values in head.fields.items():
            raw[canonical(name) or encode(name)] = values
        if head.chunked:
            self.length = None
            self._transferDecoder = _ChunkedTransferDecoder(
                request.handleContentChunk, self._finishRequestBody
            )
        else:
            self.length = head.length
            if head.length:
                self._transferDecoder = _IdentityTransferDecoder(
                    head.length, request.handleContentChunk, self._finishRequestBody
                )
        self.allHeadersReceived()
        if self.length == 0:
            self.allContentReceived()
        else:
            table = self._site_table
            if (
                table
                and not self._lingering
                and getattr(request, "live", None) is None
                and not getattr(request, "paced_by_its_source", False)
            ):
                # A live body (a client stream, served as it comes) is
                # no upload: its client sends when it has something; nor
                # is a stream a door paces by its source (the idle bound
                # holds each of their reads).
                table.body_started(self)
            self.setRawMode()

    def allHeadersReceived(self) -> None:
        """
        The head is complete: no deadline while the request is handled;
        keep-alive, cookies and ``100 Continue`` from the parsed head.
        """
        self._in_head = False
        table = self._site_table
        if table is False:
            table = self._table()
        if table is not None:
            table.head_done(self)
        request: Any = self.requests[-1]
        head = self.head
        assert head is not None
        if b"cookie" in head.fields:
            request.parseCookies()
        # While the daemon stops, every answer ends its connection: a client
        # that kept one open (a keep-alive prober) learns of the stop.
        stopping = getattr(getattr(self.site, "context", None), "draining", False)  # type: ignore[attr-defined]
        self.persistent = head.keep_alive and not stopping
        if not self.persistent and head.version == b"HTTP/1.1":
            request.responseHeaders.setRawHeaders(b"connection", [b"close"])
        request.gotLength(self.length)
        # A request answered at header time drops its Expect.
        if head.expect_continue and request.requestHeaders.hasHeader(b"expect"):
            self._send100Continue()

    def allContentReceived(self) -> None:
        """
        The request is whole: it is handled with the idle timer left
        running (see :meth:`timeoutConnection`).

        Twisted cancels the timer here and schedules a new one when the
        response is done: a timed call made and cancelled per request.
        """
        table = self._site_table
        if table:
            table.body_done(self)
        self._delivered = None
        timeout = self.timeOut
        self.timeOut = None
        try:
            super().allContentReceived()
        finally:
            if self.timeOut is None and not self._taken:
                self.timeOut = timeout

    def timeoutConnection(self) -> None:
        """
        Idle too long: close, unless a request is being handled (that one
        is not idle; the timer starts again, and again from its response)
        and its client keeps taking what is sent to it.  A client that
        took none of the bytes waiting for it since the last check, with
        bytes waiting then too, reads nothing: its connection is cut (the
        response cannot end, and the request would hold its slot for good).
        """
        if self._lingering:
            # Its client sent nothing for the quiet bound: whatever it
            # sent is read, its answer long out; an orderly close.
            self._close_lingering()
            return
        if self._handlingRequest:
            before, self._delivered = self._delivered, delivery(self.transport)
            if (
                stalled(before, self._delivered)
                or (
                    self.site.silence_ends_requests  # type: ignore[attr-defined]
                    and untouched(before, self._delivered)
                )
            ) and not self._waits_for_its_client():
                self._cut_stalled()
                return
            # A timer that fired is gone (``resetTimeout`` only moves a
            # live one): a new one, or the connection would keep none
            # after this request, idle for good.
            self.setTimeout(self.timeOut)
            return
        if self._waits_for_its_client():
            # A request served while its body still comes (a live client
            # stream: keystrokes) is quiet while its client is.
            self.setTimeout(self.timeOut)
            return
        table = self._table()
        if not table:
            super().timeoutConnection()
            return
        # Twisted's own, without its line per connection: the table
        # counts it for a line at the caps' pace.
        table.timed_out()
        if self.abortTimeout is not None:
            self._abortingCall = self.callLater(
                self.abortTimeout, self.forceAbortClient
            )
        self.loseConnection()

    def _waits_for_its_client(self) -> bool:
        """
        Whether the request in hand says its client may be quiet for now
        (``patient``), bounding the wait itself: its response's source is
        paused for a client that reads nothing (an E2B stream whose process
        waits on backpressure, as envd's does), so it is not cut as
        stalled; or its body is a live stream whose client sends only now
        and then, so it is not closed as idle.
        """
        request = self.requests[0] if self.requests else None
        patient = getattr(request, "patient", None)
        return bool(patient is not None and patient())

    def _cut_stalled(self) -> None:
        """
        Abort a connection whose client stopped taking its response (or,
        on a door whose idle bound covers requests in flight, one during
        which no byte moved either way).
        """
        transport: Any = self.transport
        if transport is None:
            return
        table = self._table()
        if table:
            table.timed_out(stalled=True)
        else:
            log.info(
                "HTTP: cut a connection from {peer} whose client took nothing of "
                "its response for {seconds:g} s",
                peer=self.peer_host,
                seconds=self.timeOut or 0,
            )
        transport.abortConnection()

    def requestDone(self, request: Any) -> None:
        """
        A response is done: the connection is idle from now, or a
        pipelined request already waiting in the buffer has its head read
        now.
        """
        table = self._site_table
        if table is False:
            table = self._table()
        if table is None or not self.persistent:
            pass  # closing (Twisted loses the connection next), or no table
        elif any(self._dataBuffer):
            # Bytes of a pipelined request (a body's end leaves b"" there).
            self._in_head = True
            table.head_started(self)
        else:
            table.went_idle(self)
        if table:
            table.body_done(self)
        self._delivered = None
        if self.persistent:
            self.resetTimeout()
        super().requestDone(request)

    _site_table: Any = False

    def _table(self) -> Any:
        """
        The site's :class:`~sandboxd.web.connections.ConnectionTable`, or
        None for a site that keeps its own count (the E2B door's); asked
        of the site once per connection.
        """
        if self._site_table is False:
            self._site_table = getattr(self.site, "table", None)  # type: ignore[attr-defined]
        return self._site_table

    def close_idle(self) -> None:
        """Reclaimed between requests (or lingering), to make room at a cap."""
        if self._lingering:
            self._close_lingering()
            return
        self.loseConnection()

    def close_slow(self) -> None:
        """The request head is overdue, or reclaimed at a cap."""
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def close_slow_body(self) -> None:
        """
        The request's body comes too slowly: 408 ``timeout`` framed for the
        door, then close; or only close when an answer has begun.
        """
        transport: Any = self.transport
        if self._answer_begun():
            # A lingering connection's own bounds end it.
            if transport is not None and not self._lingering:
                transport.abortConnection()
            return
        limits = self._site_table.limits
        error = timed_out(
            "the request body came too slowly: under "
            f"{limits.body_min_rate:g} bytes a second after "
            f"{limits.head_deadline:g} s"
        )
        request = self.requests[-1] if self.requests else None
        refuse = getattr(request, "refuse_slow_body", None)
        if refuse is not None:
            # The request's own door framing, slot and audit line.
            refuse(error)
            return
        head = self.head
        accept = head.fields.get(b"accept") if head is not None else None
        self._refuse(
            error,
            self._path.partition(b"?")[0].decode("latin-1"),
            accept[0] if accept else None,
        )

    _host: Any = None

    def getHost(self) -> Any:
        """
        The server's address of this connection, asked of the socket once:
        Twisted's request asks for it on every request, and each ask is a
        ``getsockname`` call (7 % of the reactor's samples at W1 c32).
        """
        if self._host is None and self.transport is not None:
            self._host = self.transport.getHost()
        return self._host

    def writeHeaders(
        self, version: bytes, code: bytes, reason: bytes, headers: Any
    ) -> None:
        """
        The response's status line and headers as one buffer: Twisted
        hands the transport a sequence of four pieces per header, each
        checked on its own (values were checked when they were set).
        """
        parts = [version, b" ", code, b" ", reason, b"\r\n"]
        for name, values in headers.getAllRawHeaders():
            for value in values:
                parts += (name, b": ", value, b"\r\n")
        parts.append(b"\r\n")
        self.transport.write(b"".join(parts))  # type: ignore[union-attr]

    def getPeer(self) -> Any:
        """The client's address, asked of the socket once per connection."""
        if self._peer is None and self.transport is not None:
            self._peer = self.transport.getPeer()
        return self._peer

    def _refuse_head(self, reason: str, head: bytes = b"") -> None:
        """
        The head parser refused the request: a 400 saying why, then close.
        The site frames it for its door (see :meth:`_refuse`), as far as
        the head was read: the path of the request line, the ``Accept``
        among the header lines.
        """
        error = malformed_request(f"malformed HTTP request: {reason}")
        self._refuse(error, target_path(head), header_value(head, b"accept"))

    def _respondToBadRequestAndDisconnect(self) -> None:
        """
        Twisted's body decoder refused the request (a bad chunk): a 400,
        then close; or only close, when an answer to the request has begun
        (a door's early refusal, or a response whose head has gone): a
        second status line behind it would be read as part of that answer.
        """
        if self._answer_begun():
            transport: Any = self.transport
            if (
                transport is not None
                and not transport.disconnecting
                and not self._lingering
            ):
                # The client sees a cut answer, the only honest ending now.
                transport.abortConnection()
            return
        head = self.head
        accept = head.fields.get(b"accept") if head is not None else None
        self._refuse(
            malformed_request("malformed HTTP request: a malformed chunked body"),
            self._path.partition(b"?")[0].decode("latin-1"),
            accept[0] if accept else None,
        )

    def _answer_begun(self) -> bool:
        """
        Whether bytes of an answer to the request being read have been
        written: its response head (``startedWriting``), or an answer a
        door wrote straight to the transport before closing it (a body
        over its cap), which leaves the connection lingering (or, with no
        socket under it, closing).
        """
        transport: Any = self.transport
        if transport is None or transport.disconnecting or self._lingering:
            return True
        request = self.requests[-1] if self.requests else None
        return bool(request is not None and request.startedWriting)

    def _refuse(self, error: ApiError, path: str, accept: bytes | None) -> None:
        """
        Answer ``error`` as the site's door frames it (SPEC §3's JSON by
        default; OpenAI's envelope under ``/v1/`` on the API port; envd's
        or Connect's error on the E2B port; a page for a browser on the
        preview port) and close: a client reads a refusal of the daemon's
        HTTP front the way it reads every other error of that door.
        """
        content_type, body, headers = self.site.refusal(  # type: ignore[attr-defined]
            error, path, accept
        )
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        if self.transport is not None:
            self.transport.write(
                b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n"
                % (
                    error.status,
                    reason_phrase(error.status).encode("latin-1"),
                    content_type,
                    len(body),
                )
                + extra.encode("latin-1")
                + b"\r\n"
                + body
            )
        self.close_after_answer()

    def close_after_answer(self) -> None:
        """
        Close the connection once an answer written before its request
        was read whole (a refusal at the head, a body over its cap, a head
        the parser refused) can reach the client.

        Closing a socket while bytes its client sent wait unread in it
        makes Linux send a reset rather than an end of stream, and the
        reset can reach the client before it has read the answer, or while
        it is still sending its body (most HTTP clients send the whole
        body before they read): it sees "connection reset" instead of the
        refusal.  So, as nginx's and Apache's ``lingering_close``: once the
        answer is out the daemon shuts its side for writing (the client
        reads the answer, then an end of stream), reads and drops what the
        client still sends, and closes when the client closes, or when it
        has sent nothing for :attr:`ConnectionLimits.linger_quiet` seconds;
        one that goes on sending is cut after
        :attr:`ConnectionLimits.linger_seconds` or
        :data:`~sandboxd.policy.defaults.LINGER_MAX_BYTES`.  Meanwhile the
        connection counts as idle: reclaimed first when a cap is reached.

        Over TLS the end of stream is TLS's own ``close_notify``, which
        follows the answer; the socket under it is not shut (TLS may still
        have to write while it reads, to answer a key update), and the
        client's bytes are read through TLS and dropped within the same
        bounds, until its ``close_notify`` or its close.  Left to itself,
        TLS's close would read on until the idle timeout, however much the
        client sent.
        """
        transport: Any = self.transport
        if transport is None or transport.disconnecting or self._lingering:
            return
        self.persistent = False
        under = _socket_transport(transport)
        if under is None:
            self.loseConnection()
            return
        self._lingering = True
        self._buffer = b""
        self._dataBuffer = []
        table = self._table()
        limits = table.limits if table is not None else ConnectionLimits()
        if table is not None:
            table.body_done(self)
            table.head_done(self)
            table.went_idle(self)
        self._linger_left = LINGER_MAX_BYTES
        self.setTimeout(limits.linger_quiet)
        self._linger_end = self.callLater(limits.linger_seconds, self.cut_lingering)
        # The channel is the transport's producer: unregistered, the
        # half-close (or TLS's close_notify) follows the answer out
        # whatever the producer's state.
        transport.unregisterProducer()
        if under is transport:
            # The answer into the socket now: a client that shut its side
            # after its request has its end of stream read on the next
            # turn, which closes the connection and would drop an answer
            # still waiting in the transport's buffer.
            send_now(transport)
            transport.loseWriteConnection()
        else:
            # TLS: the answer (held back to be joined with later writes)
            # and the close_notify into the TCP transport, then the socket.
            transport.loseConnection()
            send_now(under)
        # Read again, if a body's handler had paused the socket.
        under.resumeProducing()

    def _close_lingering(self) -> None:
        """
        Close a lingering connection in order (its client went quiet, or
        it makes room at a cap): its socket, under TLS too, where TLS's
        own close already happened and waits for the client's.
        """
        transport: Any = self.transport
        if transport is None:
            return
        under = _socket_transport(transport)
        (under if under is not None else transport).loseConnection()

    @property
    def lingering(self) -> bool:
        """Whether the connection only reads what a refused client still sends."""
        return self._lingering

    def cut_lingering(self) -> None:
        """
        Cut a lingering connection: its client sent on past the bounds, or
        the daemon stops listening.
        """
        end, self._linger_end = self._linger_end, None
        if end is not None and end.active():
            end.cancel()
        transport: Any = self.transport
        if transport is not None:
            transport.abortConnection()

    def take_over(self, protocol: IProtocol, replay: bytes = b"") -> None:
        """
        Hand this connection to ``protocol`` for good (a request upgraded
        to raw bytes: the preview door's WebSocket splice; the PTY
        WebSocket on the API port, which gets the request's head again as
        ``replay`` so that autobahn reads the handshake itself).

        Twisted's own WebSocket resource does this through a private
        method of ``HTTPChannel``; this is the same move, with what our
        channel adds undone: no idle timeout and no request-head deadline
        from now on (a WebSocket may be quiet for long), the channel no
        longer the transport's producer (the new protocol registers its
        own), bytes the client sent after the head handed on, and the
        connection still counted until it closes.
        """
        transport: Any = self.transport
        if transport is None:
            raise RuntimeError("the connection is already closed")
        self.setTimeout(None)
        self._in_head = False
        table = self._table()
        if table is not None:
            table.head_done(self)
        buffered = replay + b"".join(self._dataBuffer) + self._buffer
        self._dataBuffer = []
        self._buffer = b""
        self._taken = True
        lost = self.connectionLost

        def connection_lost(reason: Failure = connectionDone) -> None:
            try:
                protocol.connectionLost(reason)
            finally:
                lost(reason)

        self.dataReceived = protocol.dataReceived  # type: ignore[method-assign]
        self.connectionLost = connection_lost  # type: ignore[method-assign]
        transport.unregisterProducer()
        protocol.makeConnection(transport)
        transport.resumeProducing()
        if buffered:
            protocol.dataReceived(buffered)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """Uncount the connection."""
        end, self._linger_end = self._linger_end, None
        if end is not None and end.active():
            end.cancel()
        site: Any = self.site  # type: ignore[attr-defined]
        site.connection_closed(self)
        super().connectionLost(reason)


def _socket_transport(transport: Any) -> Any:
    """
    The transport that owns ``transport``'s socket: itself on TCP and unix
    sockets, the TCP transport under Twisted's TLS; None with no socket (a
    test's string transport) or under a TLS of another kind (whose own
    close is left to do).
    """
    if isinstance(transport, TLSMemoryBIOProtocol):
        under = transport.transport
    elif ISSLTransport.providedBy(transport):
        return None
    else:
        under = transport
    return under if isinstance(getattr(under, "socket", None), socket.socket) else None


def close_after_answer(channel: Any) -> None:
    """
    Close ``channel``'s connection after an answer written before its
    request was read whole: :meth:`SandboxChannel.close_after_answer`, or
    at once for a channel of another kind.
    """
    close = getattr(channel, "close_after_answer", None)
    if close is not None:
        close()
    elif channel.transport is not None:
        channel.transport.loseConnection()


def client_left(transport: Any) -> bool:
    """
    Whether the client has already closed its end of ``transport``: an end
    of stream (or a reset) waits in the socket behind the request just read.

    Twisted reads a request and its client's close in two turns, and would
    carry the request out in between for nobody: a client that gave up
    (an SDK's timeout, a load generator stopping) would still get its
    command run or its file written.  Only the socket is asked (one
    ``recv`` with ``MSG_PEEK``), so a pipelined next request stays unread.
    On TLS the socket under the protocol is asked: a client that sent its
    ``close_notify`` alert before closing still looks present there, and
    its request runs as it always did.  A transport with no socket at all
    (tests) says no.
    """
    sock = getattr(transport, "socket", None)
    if not isinstance(sock, socket.socket):
        return False
    if _POLL is not None:
        # One poll first: the usual answer (nothing waiting) without the
        # BlockingIOError a peek raises, and its message, for every request.
        fd = sock.fileno()
        _POLL.register(fd, _WAITING)
        try:
            ready = _POLL.poll(0)
        finally:
            _POLL.unregister(fd)
        if not ready:
            return False
        events = ready[0][1]
        if events & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
            return True
        if not events & select.POLLRDHUP:
            return False  # a pipelined request, the client still there
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


#: What :func:`client_left` asks of a socket: bytes or an end of stream
#: waiting (``POLLRDHUP``: the client shut its side; data may still wait
#: before it, which the peek then tells apart).
_WAITING = select.POLLIN | getattr(select, "POLLRDHUP", 0)
#: One poll set for :func:`client_left`, on the reactor thread alone, empty
#: between calls; None where ``POLLRDHUP`` is unknown (the peek alone).
_POLL = select.poll() if hasattr(select, "POLLRDHUP") else None
