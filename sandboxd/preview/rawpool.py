# -*- test-case-name: tests.preview.test_rawpool -*-
"""
Requests without a body (the page loads, assets and event streams that
make up most of a preview's traffic) sent to the app over raw, pooled
HTTP/1.1 connections.

Twisted's ``Agent`` is general (request bodies, trailers, retries through
a chain of Deferreds, a header object per line): for a request with no
body that generality was most of the door's time per request, which put a
small GET at a twentieth of what nginx relays.  Here the request head is
one write of bytes the exchange has already decided
(:meth:`sandboxd.preview.door.Exchange.upstream_headers`), the response
head is split once when its blank line is in, and the body is passed on
as it comes, counted against its framing (``Content-Length``, chunked, or
to the close) only to know where it ends and whether the connection can
serve the next request.  Requests with a body still go through the Agent
(:mod:`sandboxd.preview.upstream`), which streams them.

Two ways to be answered.  :meth:`RawPool.request` gives a Deferred of an
answer shaped like the Agent's (``code``, ``phrase``, ``headers``,
``length``, ``deliverBody``).  The door's own channel, for which a small
GET's every step counts, uses :meth:`RawPool.take` or
:meth:`RawPool.connect_to` and :meth:`RawConnection.send_to` instead: the
connection tells its :class:`Sink` (the exchange) of the answer's head,
read once with the preview's rules (:mod:`sandboxd.preview.answer`), of
each piece of the body and of its end, directly; no Deferred, no response
or body object.  An answer that arrives whole in one read (most small
ones) is told in one call instead, its connection already back in the
pool (:meth:`Sink.upstream_whole`).  The deadline for an answer's head is kept by the pool's
one timer (:meth:`RawPool.expect`).

A pooled connection is kept at most :data:`PREVIEW_POOL_IDLE_SECONDS`
(shorter than Node's keep-alive), and a request that finds it closed by
the app before any byte of an answer is sent again once on a new
connection, as the Agent does for an idempotent request.
"""

from __future__ import annotations

from typing import Any
from typing import Protocol as Protocol_

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.protocol import ClientFactory, Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss, _ChunkedTransferDecoder
from twisted.web.iweb import UNKNOWN_LENGTH

from sandboxd.policy.defaults import (
    PREVIEW_POOL_IDLE_SECONDS,
    PREVIEW_POOL_PER_PORT,
    PREVIEW_UPGRADE_HEAD_BYTES,
)
from sandboxd.preview.answer import Answer, NotHttp, Rules, read_answer
from sandboxd.web.sending import write_now

#: Methods sent again on a fresh connection when a kept one was closed
#: under them before any answer (RFC 9110 §9.2.2, as the Agent does).
IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"DELETE", b"PUT"})


#: The end of every whole body: one failure made once (a ``Failure`` per
#: response was a visible share of a small request; a reader only checks
#: its type).
_DONE = Failure(ResponseDone())


class UpstreamBroken(Exception):
    """The app closed the connection or answered something that is not HTTP."""


class Sink(Protocol_):
    """
    Who a :class:`RawConnection` tells of an answer directly
    (:meth:`RawConnection.send_to`): the door's channel relaying it.
    """

    @property
    def rules(self) -> Rules:
        """How the answer's head is to be read for it."""

    def upstream_answer(self, answer: Answer) -> None:
        """The answer's head, read with :attr:`rules` (1xx skipped)."""

    def dataReceived(self, data: bytes) -> None:
        """Body bytes, as decoded from their framing."""

    def upstream_whole(self, answer: Answer, body: bytes) -> None:
        """The answer's head, read with :attr:`rules`, and its whole body, at once."""

    def upstream_done(self, reason: Failure | None) -> None:
        """The body is whole (None) or was cut short."""

    def upstream_failed(self, reason: Failure) -> None:
        """No answer: refused, closed, or not HTTP."""

    def upstream_retry(self, connection: RawConnection) -> None:
        """The request goes again on ``connection`` (a kept one was closed under it)."""


class RawHeaders:
    """The answer's headers, as ``Headers.getAllRawHeaders`` gives them."""

    def __init__(self, pairs: list[tuple[bytes, list[bytes]]]) -> None:
        self._pairs = pairs

    def getAllRawHeaders(self) -> list[tuple[bytes, list[bytes]]]:
        """``(name, values)`` in the app's order."""
        return self._pairs


def parse_response_head(
    raw: bytes,
) -> tuple[bytes, int, bytes, list[tuple[bytes, list[bytes]]]]:
    """
    ``(version, status, reason, headers)`` of a response head (no blank line).

    :raises UpstreamBroken: for anything that is not an HTTP/1.x head.
    """
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise UpstreamBroken("not an HTTP/1.x response")
    headers: dict[bytes, tuple[bytes, list[bytes]]] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise UpstreamBroken("a malformed header line")
        key = name.lower()
        entry = headers.get(key)
        if entry is None:
            headers[key] = (name, [value.strip()])
        else:
            entry[1].append(value.strip())
    return (
        parts[0],
        int(parts[1]),
        parts[2] if len(parts) > 2 else b"",
        list(headers.values()),
    )


class BodyTransport:
    """
    What the body's protocol sees as its transport: the app's socket as a
    push producer (paused when the browser is slow), and stopping it
    closes the connection (the browser left).
    """

    def __init__(self, connection: RawConnection) -> None:
        self._connection = connection
        #: The socket's transport, for a reader that widens its reads.
        self._producer: Any = connection.transport

    def pauseProducing(self) -> None:
        """The browser is slow: stop reading from the app."""
        self._connection.paused = True
        if self._producer is not None:
            self._producer.pauseProducing()

    def resumeProducing(self) -> None:
        """The browser caught up."""
        self._connection.paused = False
        if self._producer is not None:
            self._producer.resumeProducing()

    def stopProducing(self) -> None:
        """The browser left: close the app's connection."""
        self._connection.abort()


class RawResponse:
    """An answer from the app, shaped like the Agent's ``IResponse``."""

    def __init__(
        self,
        connection: RawConnection,
        version: bytes,
        code: int,
        phrase: bytes,
        headers: list[tuple[bytes, list[bytes]]],
        length: int | None,
    ) -> None:
        self._connection = connection
        self.version = version
        self.code = code
        self.phrase = phrase
        self.headers = RawHeaders(headers)
        self.length: Any = UNKNOWN_LENGTH if length is None else length

    def deliverBody(self, protocol: Any) -> None:
        """Pass the body to ``protocol`` as it arrives (Agent's contract)."""
        self._connection.deliver(protocol)


class RawConnection(Protocol):
    """
    One connection to the app: idle in the pool, or carrying one request.

    Body framing: ``remaining`` bytes (``Content-Length``), a chunked
    decoder, or to the close (``remaining`` is None, no decoder).
    """

    def __init__(self, pool: RawPool, key: tuple[str, int]) -> None:
        self.pool = pool
        self.key = key
        self.waiting: Deferred[RawResponse] | None = None
        self.head = b""
        self.method = b""
        self.request_head = b""
        self.reused = False
        self.body: Any = None
        self.pending_body: list[bytes] = []
        self.remaining: int | None = None
        self.decoder: Any = None
        self.reusable = False
        self.in_body = False
        self.body_done = False
        self.lost = False
        #: Its socket was paused for a slow browser (:class:`BodyTransport`).
        self.paused = False
        #: When it went back to the pool (reactor seconds).
        self.idle_since = 0.0
        #: The first request, sent once connected.
        self.first: tuple[bytes, bytes, Deferred[RawResponse]] | None = None
        self.connector: Any = None
        #: The connections a request has used (a cancel closes the last).
        self.holder: list[RawConnection] = [self]
        #: Who is told of the answer directly (:class:`Sink`), instead of
        #: a Deferred and a body protocol.
        self.sink: Sink | None = None
        #: When the answer's head is overdue (reactor seconds), while
        #: waited for (:meth:`RawPool.expect`).
        self.deadline: float | None = None
        #: The last answer's head on this connection and how it was read,
        #: when no rule of the preview's was asked for (:attr:`Answer.plain`).
        self.last_raw = b""
        self.last_answer: Answer | None = None

    def connectionMade(self) -> None:
        """Send the first request at once (no Nagle: a head is one small write)."""
        transport: Any = self.transport
        if hasattr(transport, "setTcpNoDelay"):
            transport.setTcpNoDelay(True)
        sink, self.sink = self.sink, None
        if sink is not None:
            self.send_to(self.method, self.request_head, sink)
            return
        first, self.first = self.first, None
        if first is None or first[2].called:
            self.abort()  # cancelled while connecting
            return
        self.send(*first)

    # -- one request ------------------------------------------------------------

    def send(self, method: bytes, head: bytes, waiting: Deferred[RawResponse]) -> None:
        """Write a request head; ``waiting`` fires with the answer's head."""
        self.waiting = waiting
        self._start(method, head)

    def send_to(self, method: bytes, head: bytes, sink: Sink) -> None:
        """
        Write a request head; ``sink`` is told of the answer's head, its
        body and its end as they come (no Deferred, no body protocol).
        """
        self.sink = sink
        self.waiting = None
        self._start(method, head)

    def _start(self, method: bytes, head: bytes) -> None:
        """A new exchange on this connection: its state reset, its head written."""
        self.method = method
        self.request_head = head
        self.head = b""
        self.in_body = False
        self.body_done = False
        self.body = None
        self.pending_body = []
        self.decoder = None
        self.remaining = None
        transport: Any = self.transport
        write_now(transport, head)

    def dataReceived(self, data: bytes) -> None:
        """The answer's head, then its body."""
        if self.in_body:
            self._body_bytes(data)
            return
        if self.waiting is None and self.sink is None:
            # Bytes nobody asked for: this connection cannot be trusted.
            self.abort()
            return
        self.head += data
        while True:
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > PREVIEW_UPGRADE_HEAD_BYTES:
                    self._fail(UpstreamBroken("the app's response head is too long"))
                return
            raw, rest = self.head[:end], self.head[end + 4 :]
            if self.sink is not None:
                if not self._read_answer(self.sink, raw, rest):
                    continue  # an interim answer: the next head
                return
            try:
                version, code, phrase, headers = parse_response_head(raw)
            except UpstreamBroken as e:
                self._fail(e)
                return
            if 100 <= code < 200:
                if code == 101:
                    self._fail(UpstreamBroken("a 101 to a request without Upgrade"))
                    return
                self.head = rest  # an interim answer (100, 103): the next head
                continue
            self.head = b""
            self._answered(version, code, phrase, headers, rest)
            return

    def _read_answer(self, sink: Sink, raw: bytes, rest: bytes) -> bool:
        """
        The answer's head for a sink, read once with its rules
        (:mod:`sandboxd.preview.answer`); False for an interim answer.
        """
        if self.deadline is not None:
            self.pool.answered(self)
        if raw == self.last_raw and self.last_answer is not None:
            # The same head as the last answer on this connection, byte for
            # byte (an asset asked again within the second of its Date).
            answer = self.last_answer
        else:
            try:
                answer = read_answer(raw, sink)
            except NotHttp as e:
                self._fail(UpstreamBroken(str(e)))
                return True
            if answer.plain:
                self.last_raw = raw
                self.last_answer = answer
            else:
                self.last_answer = None
        code = answer.code
        if 100 <= code < 200:
            if code == 101:
                self._fail(UpstreamBroken("a 101 to a request without Upgrade"))
                return True
            self.head = rest
            return False
        self.head = b""
        length = answer.length
        close = answer.close
        if self.method == b"HEAD" or code in (204, 304):
            length = 0
        elif answer.chunked:
            length = None
            self.decoder = _ChunkedTransferDecoder(self._chunk, self._chunks_done)
        elif length is None:
            close = True  # to the close
        self.reusable = not close
        if length is not None and len(rest) >= length:
            # The whole answer is in (a small one, read at once): back to
            # the pool, then the sink has it in one call.
            if len(rest) > length:
                self.reusable = False  # bytes past the answer: not ours to keep
                rest = rest[:length]
            self.sink = None
            self._let_out()
            sink.upstream_whole(answer, rest)
            return True
        self.remaining = length
        self.in_body = True
        self.body = sink
        sink.upstream_answer(answer)
        if self.body is not sink:
            return True  # the sink let go (the browser left)
        if length == 0:
            self._finished(None)
        if rest:
            self._body_bytes(rest)
        return True

    def _answered(
        self,
        version: bytes,
        code: int,
        phrase: bytes,
        headers: list[tuple[bytes, list[bytes]]],
        rest: bytes,
    ) -> None:
        length: int | None = None
        chunked = False
        close = version == b"HTTP/1.0"
        for name, values in headers:
            lower = name.lower()
            if lower == b"content-length":
                if len(set(values)) != 1 or not values[0].isdigit():
                    self._fail(UpstreamBroken("a bad Content-Length"))
                    return
                length = int(values[0])
            elif lower == b"transfer-encoding":
                chunked = values[-1].split(b",")[-1].strip().lower() == b"chunked"
                if not chunked:
                    close = True  # framed by the close (RFC 9112 §6.3)
            elif lower == b"connection":
                tokens = {t.strip().lower() for v in values for t in v.split(b",")}
                if b"close" in tokens:
                    close = True
                elif b"keep-alive" in tokens and version == b"HTTP/1.0":
                    close = False
        if self.method == b"HEAD" or code in (204, 304):
            length, chunked = 0, False
        if chunked:
            if length is not None:
                # Both framings: chunked wins, and the length must not reach
                # the browser (RFC 9112 §6.3, a response-splitting attempt).
                headers = [(n, v) for n, v in headers if n.lower() != b"content-length"]
            length = None
            self.decoder = _ChunkedTransferDecoder(self._chunk, self._chunks_done)
        elif length is None:
            close = True  # to the close
        self.remaining = length
        self.reusable = not close
        self.in_body = True
        waiting, self.waiting = self.waiting, None
        assert waiting is not None
        waiting.callback(RawResponse(self, version, code, phrase, headers, length))
        if length == 0:
            self._finished(None)
        if rest:
            self._body_bytes(rest)

    # -- the body ---------------------------------------------------------------

    def deliver(self, protocol: Any) -> None:
        """Start passing the body to ``protocol``."""
        self.body = protocol
        protocol.makeConnection(BodyTransport(self))
        early, self.pending_body = self.pending_body, []
        for chunk in early:
            if self.body is not protocol:
                return
            protocol.dataReceived(chunk)
        if self.body_done and self.body is protocol:
            self._end_body(None)

    def _body_bytes(self, data: bytes) -> None:
        if self.body_done:
            if data:
                self.reusable = False  # bytes past the answer: not ours to keep
            return
        if self.decoder is not None:
            try:
                self.decoder.dataReceived(data)
            except Exception:
                self.reusable = False
                self._finished(Failure(UpstreamBroken("a malformed chunked body")))
                self.abort()
            return
        if self.remaining is None:
            self._chunk(data)
            return
        if len(data) >= self.remaining:
            extra = len(data) > self.remaining
            chunk = data[: self.remaining] if extra else data
            self.remaining = 0
            if chunk:
                self._chunk(chunk)
            if extra:
                self.reusable = False
            self._finished(None)
            return
        self.remaining -= len(data)
        self._chunk(data)

    def _chunk(self, data: bytes) -> None:
        if self.body is None:
            self.pending_body.append(data)
        else:
            self.body.dataReceived(data)

    def _chunks_done(self, extra: bytes) -> None:
        if extra:
            self.reusable = False
        self._finished(None)

    def _finished(self, reason: Failure | None) -> None:
        """The body is whole (None) or broken: tell its reader, then pool or close."""
        if self.body_done:
            return
        self.body_done = True
        if self.body is not None:
            self._end_body(reason)

    def _end_body(self, reason: Failure | None) -> None:
        body, self.body = self.body, None
        self.in_body = False
        sink, self.sink = self.sink, None
        if reason is None:
            self._let_out()
        elif not self.lost:
            self.abort()
        if sink is not None:
            sink.upstream_done(reason)
        elif body is not None:
            body.connectionLost(reason or _DONE)

    def _let_out(self) -> None:
        """An answer is whole: back to the pool when it can serve another, else closed."""
        if self.reusable and not self.lost:
            if self.paused:
                # A paused socket must not idle paused (nor pay for a resume
                # when it never was).
                self.paused = False
                transport: Any = self.transport
                transport.resumeProducing()
            self.pool.release(self)
        elif not self.lost:
            self.abort()

    # -- the end ----------------------------------------------------------------

    def _fail(self, error: Exception) -> None:
        if self.deadline is not None:
            self.pool.answered(self)
        waiting, self.waiting = self.waiting, None
        sink, self.sink = self.sink, None
        self.abort()
        if waiting is not None:
            waiting.errback(Failure(error))
        if sink is not None:
            sink.upstream_failed(Failure(error))

    def cancel(self) -> None:
        """Give up on the answer (a timeout, the browser left): close, and say so."""
        sink = self.sink
        self.let_go()
        if sink is not None:
            sink.upstream_failed(Failure(CancelledError()))

    def let_go(self) -> None:
        """The sink is done with this connection before its end: close it."""
        if self.deadline is not None:
            self.pool.answered(self)
        self.sink = None
        self.body = None
        self.abort()

    def abort(self) -> None:
        """Close now (never back to the pool)."""
        self.reusable = False
        self.pool.forget(self)
        if self.lost:
            return
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]
        elif self.connector is not None:
            self.connector.stopConnecting()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """Closed: by the app while idle, mid-answer, or by us."""
        self.lost = True
        self.pool.forget(self)
        sink = self.sink
        deadline = self.deadline
        if deadline is not None:
            self.pool.answered(self)
        if sink is not None and not self.in_body:
            self.sink = None
            if self.reused and not self.head and self.method in IDEMPOTENT:
                # Closed by the app between requests: once more, afresh.
                again = self.pool.connect_to(
                    self.key, self.method, self.request_head, sink
                )
                if deadline is not None:
                    self.pool.expect_by(again, deadline)
                sink.upstream_retry(again)
                return
            sink.upstream_failed(
                Failure(UpstreamBroken("the app closed the connection"))
            )
            return
        if self.waiting is not None:
            waiting, self.waiting = self.waiting, None
            if self.reused and not self.head and self.method in IDEMPOTENT:
                again = self.pool.connect(
                    self.key, self.method, self.request_head, waiting
                )
                again.holder = self.holder
                self.holder.append(again)
                return
            waiting.errback(Failure(UpstreamBroken("the app closed the connection")))
            return
        if self.in_body and not self.body_done:
            if self.remaining is None and self.decoder is None:
                self._finished(Failure(PotentialDataLoss()))  # read to the close
            else:
                self._finished(reason)


class _Connector(ClientFactory):
    """Connects one :class:`RawConnection`; a failure fails its first request."""

    noisy = False

    def __init__(self, connection: RawConnection) -> None:
        self.connection = connection

    def buildProtocol(self, addr: Any) -> RawConnection:
        return self.connection

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        connection = self.connection
        connection.pool.forget(connection)
        if connection.deadline is not None:
            connection.pool.answered(connection)
        sink, connection.sink = connection.sink, None
        if sink is not None:
            sink.upstream_failed(reason)
            return
        first, connection.first = connection.first, None
        if first is not None and not first[2].called:
            first[2].errback(reason)


class RawPool:
    """
    Idle connections to the app, per loopback address and port (oldest
    first in each list; the newest is used first).

    :param reactor: connects and times idle connections out.
    """

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self.idle: dict[tuple[str, int], list[RawConnection]] = {}
        self.busy: set[RawConnection] = set()
        self._sweep: Any = None
        #: Connections waiting for an answer's head by a deadline, and the
        #: one timer that checks them.
        self.waiting: dict[RawConnection, None] = {}
        self._late: Any = None
        #: When that timer fires (reactor seconds), while it is armed.
        self._late_at = 0.0

    def request(
        self, address: str, port: int, method: bytes, head: bytes
    ) -> Deferred[RawResponse]:
        """
        Send ``head`` (a whole request head, no body) to ``address:port``.

        :returns: fires with the answer (its body still to come), or fails
            with ``ConnectionRefusedError`` (nothing listens),
            :class:`UpstreamBroken`, or ``CancelledError`` when cancelled.
        """
        key = (address, port)
        connection: RawConnection | None = None
        idle = self.idle.get(key)
        while idle:
            candidate = idle.pop()
            if not candidate.lost:
                connection = candidate
                break
        holder: list[RawConnection] = []

        def cancel(_: Deferred[RawResponse]) -> None:
            last = holder[0].holder[-1]
            last.waiting = None
            last.first = None
            last.abort()

        waiting: Deferred[RawResponse] = Deferred(cancel)
        if connection is not None:
            connection.reused = True
            connection.holder = [connection]
            self.busy.add(connection)
            connection.send(method, head, waiting)
        else:
            connection = self.connect(key, method, head, waiting)
        holder.append(connection)
        return waiting

    def take(self, address: str, port: int) -> RawConnection | None:
        """An idle connection to ``address:port`` (now busy), if one is kept."""
        idle = self.idle.get((address, port))
        while idle:
            connection = idle.pop()
            if not connection.lost:
                connection.reused = True
                self.busy.add(connection)
                return connection
        return None

    def expect(self, connection: RawConnection, timeout: float) -> None:
        """
        Cancel ``connection``'s request when no answer's head has come in
        ``timeout`` seconds.  One timer for the pool, not one set and
        cancelled per request.
        """
        # :meth:`expect_by`'s steps, written out (once per request).
        deadline = self.reactor.seconds() + timeout
        connection.deadline = deadline
        self.waiting[connection] = None
        if self._late is None:
            self._late = self.reactor.callLater(timeout, self._check_late)
            self._late_at = deadline
        elif deadline < self._late_at:
            # A shorter timeout than the one the timer was set for (a
            # reload lowered it): the timer comes forward, or this request
            # would wait for the old, later deadline.
            self._arm(deadline)

    def expect_by(self, connection: RawConnection, deadline: float) -> None:
        """:meth:`expect`, by a deadline in reactor seconds."""
        connection.deadline = deadline
        self.waiting[connection] = None
        if self._late is None or deadline < self._late_at:
            self._arm(deadline)

    def _arm(self, deadline: float) -> None:
        """The pool's timer set for ``deadline`` (reactor seconds)."""
        wait = max(deadline - self.reactor.seconds(), 0.0)
        if self._late is None:
            self._late = self.reactor.callLater(wait, self._check_late)
        else:
            self._late.reset(wait)
        self._late_at = deadline

    def answered(self, connection: RawConnection) -> None:
        """``connection`` has its answer's head (or gave up): no deadline."""
        connection.deadline = None
        self.waiting.pop(connection, None)

    def _check_late(self) -> None:
        """Cancel the overdue requests; come back for the next deadline."""
        self._late = None
        now = self.reactor.seconds()
        late = []
        soonest: float | None = None
        for connection in self.waiting:
            deadline = connection.deadline
            if deadline is None:
                continue
            if deadline <= now:
                late.append(connection)
            elif soonest is None or deadline < soonest:
                soonest = deadline
        for connection in late:
            self.answered(connection)
            connection.cancel()
        if soonest is not None and self._late is None:
            self._arm(soonest)

    def connect_to(
        self, key: tuple[str, int], method: bytes, head: bytes, sink: Sink
    ) -> RawConnection:
        """A new connection to ``key``, sending ``head`` once it is up, answering ``sink``."""
        connection = RawConnection(self, key)
        connection.method = method
        connection.request_head = head
        connection.sink = sink
        self.busy.add(connection)
        connection.connector = self.reactor.connectTCP(
            key[0], key[1], _Connector(connection)
        )
        return connection

    def connect(
        self,
        key: tuple[str, int],
        method: bytes,
        head: bytes,
        waiting: Deferred[RawResponse],
    ) -> RawConnection:
        """A new connection to ``key``, sending ``head`` once it is up."""
        connection = RawConnection(self, key)
        connection.first = (method, head, waiting)
        self.busy.add(connection)
        connection.connector = self.reactor.connectTCP(
            key[0], key[1], _Connector(connection)
        )
        return connection

    def release(self, connection: RawConnection) -> None:
        """A connection is free again: keep it (bounded, for a while) or close it."""
        self.busy.discard(connection)
        idle = self.idle.setdefault(connection.key, [])
        if len(idle) >= PREVIEW_POOL_PER_PORT:
            connection.abort()
            return
        connection.waiting = None
        connection.idle_since = self.reactor.seconds()
        idle.append(connection)
        if self._sweep is None:
            self._sweep = self.reactor.callLater(PREVIEW_POOL_IDLE_SECONDS, self.sweep)

    def sweep(self) -> None:
        """
        Close the connections idle for :data:`PREVIEW_POOL_IDLE_SECONDS`,
        and come back when the next one will have been.  One timer for
        the pool (a timer per connection was set and cancelled on every
        request); each list is oldest first, so a sweep stops at the
        first young one.
        """
        self._sweep = None
        now = self.reactor.seconds()
        oldest: float | None = None
        for idle in list(self.idle.values()):
            while idle and now - idle[0].idle_since >= PREVIEW_POOL_IDLE_SECONDS:
                idle[0].abort()  # forget() takes it out of the list
            if idle and (oldest is None or idle[0].idle_since < oldest):
                oldest = idle[0].idle_since
        if oldest is not None:
            wait = oldest + PREVIEW_POOL_IDLE_SECONDS - now
            self._sweep = self.reactor.callLater(max(wait, 0.0), self.sweep)

    def forget(self, connection: RawConnection) -> None:
        """A connection is closing: out of the pool."""
        self.busy.discard(connection)
        idle = self.idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)

    def close(self) -> None:
        """Close every connection (the door stops)."""
        for idle in list(self.idle.values()):
            for connection in list(idle):
                connection.abort()
        for connection in list(self.busy):
            connection.abort()
        self.idle.clear()
        if self._sweep is not None and self._sweep.active():
            self._sweep.cancel()
        self._sweep = None
        self.waiting.clear()
        if self._late is not None and self._late.active():
            self._late.cancel()
        self._late = None


__all__ = ["CancelledError", "RawPool", "RawResponse", "UpstreamBroken"]
