# -*- test-case-name: tests.preview.test_channel -*-
"""
The preview door's own server side of HTTP/1.1, for the common case.

A preview's traffic is mostly requests without a body (a page, its
assets, an event stream).  For those, Twisted's ``HTTPChannel`` and
``Request`` (a line receiver, a header object, a response object, a
Deferred chain per request) were nearly half of the door's time.  This
channel reads a head in one pass (:mod:`sandboxd.web.heads`), runs the
same :class:`~sandboxd.preview.door.Exchange` as before (Host, exposure,
the gate, the link redirect, the header rules both ways, the audit line)
on a light request object (:class:`DoorRequest`), and writes the response
head and body as bytes: the app's ``Content-Length`` kept, else chunked.
The app's answer comes to the exchange straight from its raw connection
(:meth:`sandboxd.preview.rawpool.RawConnection.send_to`), its head lines
passed on as the app wrote them where the rules leave them alone
(:meth:`DoorRequest.relay_answer`).

Anything else (a request with a body, an upgrade, an expectation,
HTTP/1.0, a head the parser refuses) hands the connection, with the bytes
read so far, to the Twisted channel the door used before
(:class:`~sandboxd.web.channel.SandboxChannel` with the door's
:class:`~sandboxd.preview.door.PreviewRequest`), which keeps it to the
end: bodies stream through the Agent, upgrades are spliced, bad heads are
refused as they always were.

The connection is counted in the door's
:class:`~sandboxd.web.connections.ConnectionTable` like any other (caps,
the head deadline, reclaiming idle ones), and closed after
``idle_timeout_seconds`` with no request in flight and no byte in; with
a request in flight, once the browser has sent nothing and taken nothing
for that long (the kernel's count of what it acknowledged, see
:mod:`sandboxd.web.delivery`): an app that sent its head and stalled its
body, or a browser that reads nothing, would otherwise hold the request,
its slot and the app's connection for good.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from typing import Protocol as Contract

from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.tcp import Server
from twisted.python.failure import Failure
from twisted.web.http import RESPONSES

from sandboxd.policy.defaults import (
    HEAD_MEMO_BYTES,
    HEADER_NAME_CACHE,
    PREVIEW_UPGRADE_HEAD_BYTES,
)
from sandboxd.preview.answer import Answer
from sandboxd.web.delivery import Delivery, delivery, untouched
from sandboxd.web.heads import LIMITS, Head, HeadError, parse_head
from sandboxd.web.sending import write_now

#: Statuses whose response never has a body (RFC 9110 §6.4.1).
_BODILESS = frozenset({204, 304})

#: Headers that mean a request is not the plain kind (see the module).
_NOT_PLAIN = frozenset({b"upgrade", b"expect"})

#: A request line the memo of a head accepts without the parser, read in
#: one match: a method of these (any other goes through
#: :func:`parse_head`), a target the parser accepts
#: (:mod:`sandboxd.web.heads`: no controls, no space), HTTP/1.1, and the
#: line's end.
_MEMO_LINE = re.compile(rb"(GET|HEAD|OPTIONS|DELETE) ([\x21-\xb0]+) HTTP/1\.1(?=\r\n)")

#: Lower-cased header names to the form the app is sent (bounded).
_CANONICAL: dict[bytes, bytes] = {}


def drained(transport: Any) -> bool:
    """
    Whether everything written to ``transport`` has left for the socket
    (a plain TCP connection; any other, a TLS one, is taken as not, so a
    body to it always runs with flow control).
    """
    return (
        type(transport) is Server
        and not transport._tempDataLen
        and len(transport.dataBuffer) == transport.offset
    )


def plain(head: Head) -> bool:
    """Whether this channel answers ``head`` itself: HTTP/1.1, no body, no upgrade."""
    return (
        head.version == b"HTTP/1.1"
        and head.length == 0
        and _NOT_PLAIN.isdisjoint(head.fields)
    )


def canonical(lower: bytes) -> bytes:
    """``x-requested-with`` as ``X-Requested-With`` (as Twisted's ``Headers`` sends it)."""
    name = _CANONICAL.get(lower)
    if name is None:
        name = b"-".join(part.capitalize() for part in lower.split(b"-"))
        if len(_CANONICAL) < HEADER_NAME_CACHE:
            _CANONICAL[lower] = name
    return name


class HeadMemo:
    """
    A connection's last plain request head: its header lines as bytes
    (from the CRLF ending the request line to the one before the blank
    line) and the fields the parser read from them (never changed on
    the plain path, so shared by the requests that repeat them).
    """

    __slots__ = ("block", "derived", "fields")

    def __init__(self, block: bytes, fields: dict[bytes, list[bytes]]) -> None:
        self.block = block
        self.fields = fields
        #: What the door worked out from these fields, by what else it
        #: depended on (:meth:`sandboxd.preview.door.Exchange.app_head`).
        self.derived: dict[Any, Any] = {}


class RequestFields:
    """
    A request's headers as the exchange asks for them (the part of
    Twisted's ``Headers`` it uses), over the parser's table.
    """

    __slots__ = ("fields",)

    def __init__(self, fields: dict[bytes, list[bytes]]) -> None:
        #: Lower-cased names to their values, in the client's order.
        self.fields = fields

    def getRawHeaders(
        self, name: bytes, default: list[bytes] | None = None
    ) -> list[bytes] | None:
        """The values of ``name`` (any case), as sent."""
        return self.fields.get(name.lower(), default)

    def getAllRawHeaders(self) -> list[tuple[bytes, list[bytes]]]:
        """``(name, values)`` in the client's order."""
        return [(canonical(lower), values) for lower, values in self.fields.items()]

    def removeHeader(self, name: bytes) -> None:
        """Forget ``name``."""
        self.fields.pop(name.lower(), None)


class ResponseFields:
    """The response's headers, in the order they are set."""

    __slots__ = ("pairs",)

    def __init__(self) -> None:
        self.pairs: dict[bytes, tuple[bytes, list[bytes]]] = {}

    def setRawHeaders(self, name: bytes, values: list[bytes]) -> None:
        """Set ``name`` to ``values`` (replacing what it had)."""
        self.pairs[name.lower()] = (name, list(values))

    def removeHeader(self, name: bytes) -> None:
        """Forget ``name``."""
        self.pairs.pop(name.lower(), None)


class DoorRequest:
    """
    One plain request on a :class:`DoorChannel`: what an exchange calls on
    Twisted's ``Request`` (status, headers, write, finish, producers,
    :meth:`notifyFinish`), writing the response as bytes.

    The head goes out with the first body bytes (one write for a small
    answer); a body with no ``Content-Length`` is chunked.
    """

    # What a request starts with, as class attributes (set per request
    # only when changed).
    defaultContentType: bytes | None = None
    code = 200
    phrase: bytes | None = None
    started = False
    finished = False
    chunked = False
    #: Told when the response is whole (None) or the client left
    #: (the exchange's own end, without a Deferred).
    on_end: Callable[[Failure | None], object] | None = None
    #: The app's head, relayed as its lines (:meth:`relay_answer`).
    answer: Answer | None = None
    _response_fields: ResponseFields | None = None
    _waiting: list[Deferred[None]] | None = None

    def __init__(
        self,
        channel: DoorChannel,
        method: bytes,
        fields: dict[bytes, list[bytes]],
        keep_alive: bool,
    ) -> None:
        self.channel = channel
        self.method = method
        self.requestHeaders = RequestFields(fields)
        self.persistent = keep_alive
        self.bodiless = method == b"HEAD"

    @property
    def responseHeaders(self) -> ResponseFields:
        """The response's own headers (made when first set)."""
        fields = self._response_fields
        if fields is None:
            fields = self._response_fields = ResponseFields()
        return fields

    # -- what the exchange sets ------------------------------------------------

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        """The status (and its reason phrase, when not the usual one)."""
        self.code = code
        self.phrase = message

    def setHeader(self, name: bytes, value: bytes) -> None:
        """One response header."""
        self.responseHeaders.setRawHeaders(name, [value])

    def relay_head(
        self, code: int, phrase: bytes, pairs: list[tuple[bytes, list[bytes]]]
    ) -> None:
        """The app's status and (already filtered) headers, as the response's."""
        self.code = code
        self.phrase = phrase
        fields = self.responseHeaders.pairs = {}
        for name, values in pairs:
            fields[name.lower()] = (name, values)

    def relay_answer(self, answer: Answer) -> None:
        """
        The app's head as the response's, its lines as they are (the rules
        applied, :mod:`sandboxd.preview.answer`): the head is written with
        the first body bytes.
        """
        self.code = answer.code
        self.phrase = answer.phrase
        self.answer = answer

    def notifyFinish(self) -> Deferred[None]:
        """Fires once the response is written whole; fails if the client left first."""
        d: Deferred[None] = Deferred()
        if self._waiting is None:
            self._waiting = []
        self._waiting.append(d)
        return d

    # -- the response -----------------------------------------------------------

    def _head(self) -> bytes:
        """The response head, and how its body is framed."""
        self.started = True
        code = self.code
        answer = self.answer
        if answer is not None:
            return self._answer_head(answer)
        phrase = self.phrase or RESPONSES.get(code, b"Unknown")
        lines = [b"HTTP/1.1 %d %s" % (code, phrase)]
        fields = self.responseHeaders.pairs
        if code in _BODILESS or code < 200:
            self.bodiless = True
        elif b"content-length" not in fields and not self.bodiless:
            self.chunked = True
            lines.append(b"Transfer-Encoding: chunked")
        for name, values in fields.values():
            for value in values:
                if b"\n" in value or b"\r" in value:
                    value = value.replace(b"\r", b" ").replace(b"\n", b" ")
                lines.append(name + b": " + value)
        if not self.persistent:
            lines.append(b"Connection: close")
        lines.append(b"\r\n")
        return b"\r\n".join(lines)

    def _answer_head(self, answer: Answer) -> bytes:
        """The app's head (see :meth:`relay_answer`), framed for this connection."""
        code = answer.code
        head = b"HTTP/1.1 %d %s\r\n" % (
            code,
            answer.phrase or RESPONSES.get(code, b"Unknown"),
        )
        if answer.block:
            head += answer.block + b"\r\n"
        if code in _BODILESS or code < 200:
            self.bodiless = True
        elif answer.length is None and not self.bodiless:
            self.chunked = True
            head += b"Transfer-Encoding: chunked\r\n"
        if not self.persistent:
            head += b"Connection: close\r\n"
        return head + b"\r\n"

    def write(self, data: bytes) -> None:
        """Body bytes (the head goes first, with them)."""
        if self.finished:
            return
        transport = self.channel.transport
        if transport is None:
            return
        if not self.started:
            head = self._head()
            if self.bodiless or not data:
                out = head
            elif self.chunked:
                out = b"%s%x\r\n%s\r\n" % (head, len(data), data)
            else:
                out = head + data
        elif self.bodiless or not data:
            return
        elif self.chunked:
            out = b"%x\r\n%s\r\n" % (len(data), data)
        else:
            out = data
        write_now(transport, out)

    def finish(self) -> None:
        """The response is whole: end it, and free the connection for the next."""
        if self.finished:
            return
        transport = self.channel.transport
        out = self._head() if not self.started else b""
        if self.chunked:
            out += b"0\r\n\r\n"
        if out and transport is not None:
            write_now(transport, out)
        self._done()

    def answer_whole(self, answer: Answer, body: bytes) -> None:
        """
        The app's whole answer at once (:meth:`relay_answer`, :meth:`write`
        and :meth:`finish` in one step): a small answer read in one piece
        leaves in one write.
        """
        if self.finished:
            return
        self.code = answer.code
        self.phrase = answer.phrase
        self.answer = answer
        transport = self.channel.transport
        if transport is not None:
            self.started = True
            out = self._answer_head(answer)
            if self.bodiless:
                pass
            elif self.chunked:
                if body:
                    out += b"%x\r\n%s\r\n" % (len(body), body)
                out += b"0\r\n\r\n"
            else:
                out += body
            write_now(transport, out)
        self._done()

    def _done(self) -> None:
        """Whole: tell the exchange and the channel."""
        self.finished = True
        if self.on_end is not None:
            self.on_end(None)
        waiting, self._waiting = self._waiting, None
        for d in waiting or ():
            d.callback(None)
        self.channel.request_done(self)

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        """The app's socket pauses while the client's is full."""
        transport = self.channel.transport
        if transport is not None:
            transport.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        """The app's body is over."""
        transport = self.channel.transport
        if transport is not None:
            transport.unregisterProducer()

    def lost(self, reason: Failure) -> None:
        """The client left before the response was whole."""
        if self.finished:
            return
        self.finished = True
        if self.on_end is not None:
            self.on_end(reason)
        waiting, self._waiting = self._waiting, None
        for d in waiting or ():
            d.errback(reason)


class DoorSite(Contract):
    """
    What the channel asks of the door's site
    (:class:`~sandboxd.preview.door.PreviewSite`, which imports this
    module): its connection table, clock and idle bound, the Twisted
    channel to hand over to, and the exchange that answers a request.
    """

    table: Any
    reactor: Any
    timeOut: Any

    def connection_opened(self, channel: Any) -> bool:
        """Admit a new connection (False: over a cap)."""

    def connection_closed(self, channel: Any) -> None:
        """Forget a connection."""

    def twisted_channel(self, addr: Any) -> Any:
        """A Twisted channel of the door's, for a connection handed over."""

    def exchange(self, request: DoorRequest) -> None:
        """Decide and forward one plain request (it answers on ``request``)."""


#: The start of HTTP/2's connection preface (RFC 9113 §3.4), which a
#: client with prior knowledge sends instead of an HTTP/1.1 request.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n"

#: The door's answer to it: an empty SETTINGS frame (the server's
#: preface), then GOAWAY with HTTP_1_1_REQUIRED (0xd) and why in words,
#: which a client reports (curl retries over HTTP/1.1) where a closed
#: connection would be an empty reply with no reason.
_H2_REFUSAL_TEXT = b"the preview door speaks HTTP/1.1 only"
_H2_REFUSAL = (
    b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    + (8 + len(_H2_REFUSAL_TEXT)).to_bytes(3, "big")
    + b"\x07\x00\x00\x00\x00\x00"
    + b"\x00\x00\x00\x00\x00\x00\x00\x0d"
    + _H2_REFUSAL_TEXT
)


class DoorChannel(Protocol):
    """
    One client connection to the door (see the module).

    :ivar peer_host: the client's address (the connection table and the
        audit line ask for it).
    :ivar delegate: the Twisted channel the connection was handed to.
    """

    peer_host = ""
    _command = b""
    _path = b""

    def __init__(self, site: DoorSite, addr: Any) -> None:
        self.site = site
        self.addr = addr
        self.transport: Any = None
        self.buffer = b""
        #: The last plain head's header lines and fields (:meth:`_same_head`).
        self.memo: HeadMemo | None = None
        self.request: DoorRequest | None = None
        self.delegate: Any = None
        self.closing = False
        self._reading = True
        self._handling = False
        self._quiet_since = 0.0
        self._idle: Any = None
        #: What the browser had taken at the last idle check of a request.
        self._delivered: Delivery | None = None

    # -- the connection -----------------------------------------------------------

    def connectionMade(self) -> None:
        """Count it (closed at once over a cap); no Nagle; the idle watch."""
        transport = self.transport
        set_no_delay: Callable[[bool], None] | None = getattr(
            transport, "setTcpNoDelay", None
        )
        if set_no_delay is not None:
            try:
                set_no_delay(True)
            except OSError:
                pass
        peer = transport.getPeer()
        self.peer_host = getattr(peer, "host", "") or ""
        if not self.site.connection_opened(self):
            self.closing = True
            transport.abortConnection()
            return
        self._watch_idle()

    def dataReceived(self, data: bytes) -> None:
        """Bytes of the next request head(s)."""
        if self.delegate is not None:
            self.delegate.dataReceived(data)
            return
        if self.closing:
            return
        starts = not self.buffer
        self.buffer += data
        self._quiet_since = self.site.reactor.seconds()
        if self.request is not None:
            # Pipelined: kept until the response in flight is done, bounded.
            if len(self.buffer) > PREVIEW_UPGRADE_HEAD_BYTES and self._reading:
                self._reading = False
                self.transport.pauseProducing()
            return
        self._next()
        if (
            starts
            and self.buffer
            and self.request is None
            and self.delegate is None
            and not self.closing
        ):
            # Part of a head, the rest to come: its deadline runs from now.
            # (A head read whole in this call is never counted as started:
            # :meth:`_start` marks the connection busy at once.)
            self.site.table.head_started(self)

    def _next(self) -> None:
        """Handle every whole head in the buffer, one request at a time."""
        if self._handling:
            return
        self._handling = True
        try:
            while self.request is None and self.delegate is None and not self.closing:
                if self._same_head():
                    continue
                if self.buffer.startswith(_H2_PREFACE):
                    self.closing = True
                    self.transport.write(_H2_REFUSAL)
                    self.transport.loseConnection()
                    return
                try:
                    head = parse_head(self.buffer)
                except HeadError:
                    # Twisted's channel refuses it, as the door always did.
                    self._hand_over()
                    return
                if head is None:
                    return  # more to come
                if not plain(head):
                    self._hand_over()
                    return
                self._remember(head)
                self.buffer = self.buffer[head.size :]
                self._start(head.method, head.target, head.fields, head.keep_alive)
        finally:
            self._handling = False

    def _remember(self, head: Head) -> None:
        """
        Keep a plain head's header lines and what was read from them, for
        the next request on this connection (see :meth:`_same_head`).
        """
        buffer = self.buffer
        begin = 2 if buffer.startswith(b"\r\n") else 0
        line_end = buffer.find(b"\r\n", begin)
        block = buffer[line_end : head.size - 4]
        if head.keep_alive and begin == 0 and len(block) <= HEAD_MEMO_BYTES:
            self.memo = HeadMemo(block, head.fields)
        else:
            self.memo = None

    def _same_head(self) -> bool:
        """
        Start the next request when its header lines are byte for byte
        those of the last plain one (a browser's assets, a client's
        keep-alive loop): only its request line is read, the fields
        parsed last time serve again.  False for anything else, which the
        parser reads whole.
        """
        memo = self.memo
        if memo is None:
            return False
        buffer = self.buffer
        line = _MEMO_LINE.match(buffer)
        if line is None:
            return False
        line_end = line.end()
        size = line_end + len(memo.block) + 4
        if (
            len(buffer) < size
            or size > LIMITS.max_bytes
            or not buffer.startswith(memo.block, line_end)
            or not buffer.startswith(b"\r\n\r\n", size - 4)
        ):
            return False
        self.buffer = buffer[size:]
        self._start(line[1], line[2], memo.fields, True)
        return True

    def _start(
        self,
        method: bytes,
        target: bytes,
        fields: dict[bytes, list[bytes]],
        keep_alive: bool,
    ) -> None:
        """Decide and forward one plain request."""
        self.site.table.head_done(self)
        self._command = method
        self._path = target
        request = DoorRequest(self, method, fields, keep_alive)
        self.request = request
        self._delivered = None
        self.site.exchange(request)

    def request_done(self, request: DoorRequest) -> None:
        """A response is written whole: close, or read the next head."""
        if request is not self.request:
            return
        self.request = None
        if not request.persistent:
            self.closing = True
            self.transport.loseConnection()
            return
        if not self._reading:
            self._reading = True
            self.transport.resumeProducing()
        self._quiet_since = self.site.reactor.seconds()
        if self.buffer:
            self.site.table.head_started(self)
            self._next()
        else:
            self.site.table.went_idle(self)

    def _hand_over(self) -> None:
        """
        Give the connection to the Twisted channel for good, with the bytes
        read so far (see the module).
        """
        self._stop_idle()
        self.site.connection_closed(self)
        channel = self.site.twisted_channel(self.addr)
        self.delegate = channel
        buffered, self.buffer = self.buffer, b""
        channel.makeConnection(self.transport)
        if buffered and channel.transport is not None:
            channel.dataReceived(buffered)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """Uncount it; a response in flight learns the client left."""
        if self.delegate is not None:
            self.delegate.connectionLost(reason)
            return
        self.closing = True
        self._stop_idle()
        self.site.connection_closed(self)
        request, self.request = self.request, None
        if request is not None:
            request.lost(reason)

    # -- what the connection table asks ---------------------------------------------

    def close_idle(self) -> None:
        """Reclaimed between requests, to make room at a cap."""
        self.closing = True
        if self.transport is not None:
            self.transport.loseConnection()

    def close_slow(self) -> None:
        """The request head is overdue, or reclaimed at a cap."""
        self.closing = True
        if self.transport is not None:
            self.transport.abortConnection()

    # -- the idle bound ---------------------------------------------------------------

    def _watch_idle(self) -> None:
        """
        One timer per connection, checked when the bound could be reached
        (a timer reset per request would cost every request).
        """
        limit = self.site.timeOut
        if not limit:
            return
        self._quiet_since = self.site.reactor.seconds()
        self._idle = self.site.reactor.callLater(limit, self._check_idle)

    def _check_idle(self) -> None:
        self._idle = None
        limit = self.site.timeOut
        if self.closing or self.delegate is not None or not limit:
            return
        quiet = self.site.reactor.seconds() - self._quiet_since
        if self.request is not None:
            before, self._delivered = self._delivered, delivery(self.transport)
            if quiet >= limit and untouched(before, self._delivered):
                self.closing = True
                self.transport.abortConnection()
                return
            self._idle = self.site.reactor.callLater(limit, self._check_idle)
            return
        self._delivered = None
        if quiet < limit:
            self._idle = self.site.reactor.callLater(limit - quiet, self._check_idle)
            return
        self.closing = True
        self.transport.loseConnection()

    def _stop_idle(self) -> None:
        if self._idle is not None and self._idle.active():
            self._idle.cancel()
        self._idle = None
