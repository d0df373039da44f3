# -*- test-case-name: tests.preview.test_door -*-
"""
``Upgrade`` requests (WebSocket, and any other): raw TCP after the app's 101.

The Agent cannot carry a 101, so the door opens its own connection to the
app, writes the request head (the Host rule, ``Origin`` with it, and the
credential stripping of plain requests), and reads the app's response
head.  A 101 goes to the browser as the app wrote it (less a cookie the door would
refuse), the browser's connection is taken over from the HTTP channel
(:meth:`sandboxd.web.channel.SandboxChannel.take_over`), and from then on
bytes are copied both ways with each socket the other's producer (the
pattern of ``twisted.protocols.portforward``): no frame is parsed, so
subprotocols, compression and binary frames pass untouched, and a slow
reader on either side pauses the other.  Any other answer is relayed as an
ordinary response, and the app's connection closed after it.
"""

from __future__ import annotations

import time
from typing import Any

from twisted.internet.endpoints import (
    TCP4ClientEndpoint,
    TCP6ClientEndpoint,
    connectProtocol,
)
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.http import _ChunkedTransferDecoder, _IdentityTransferDecoder

from sandboxd.access import gate
from sandboxd.access import held as held_connections
from sandboxd.errors import (
    ApiError,
    limit_rule,
    upstream_timeout,
    upstream_unavailable,
)
from sandboxd.policy.defaults import PREVIEW_UPGRADE_HEAD_BYTES
from sandboxd.preview import headers as h
from sandboxd.web.sending import write_now

#: WebSocket close code of an endpoint going away (RFC 6455 §7.4.1): the
#: preview ended (unexposed, expired, the door closed), which is no
#: refusal of the caller (that is 1008, a reload's).
GOING_AWAY = 1001

#: The exchange being upgraded (:class:`sandboxd.preview.door.Exchange`;
#: named loosely, as the door imports this module).
Exchange = Any


def parse_head(raw: bytes) -> tuple[int, bytes, list[tuple[bytes, list[bytes]]]]:
    """``(status, reason, headers)`` of a response head (without its blank line)."""
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ValueError("not an HTTP/1.1 response")
    headers: dict[bytes, tuple[bytes, list[bytes]]] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise ValueError("a malformed header line")
        key = name.lower()
        headers.setdefault(key, (name, []))[1].append(value.strip())
    reason = parts[2] if len(parts) > 2 else b""
    return int(parts[1]), reason, list(headers.values())


class _AppSide(Protocol):
    """The connection to the app: its head first, then raw bytes."""

    def __init__(self, upgrade: Upgrade) -> None:
        self.upgrade = upgrade
        self.buffer = b""
        self.spliced = False

    def connectionMade(self) -> None:
        """Send the request head (and every frame after it) at once, no Nagle."""
        transport: Any = self.transport
        assert transport is not None
        if hasattr(transport, "setTcpNoDelay"):
            transport.setTcpNoDelay(True)
        transport.write(self.upgrade.request_head())

    def dataReceived(self, data: bytes) -> None:
        """The response head, then whatever follows it."""
        if self.spliced:
            self.upgrade.to_browser(data)
            return
        if self.upgrade.relaying is not None:
            self.upgrade.relaying(data)
            return
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > PREVIEW_UPGRADE_HEAD_BYTES:
                self.upgrade.failed("the app's response head is too long")
            return
        head, rest = self.buffer[:end], self.buffer[end + 4 :]
        self.buffer = b""
        self.upgrade.app_answered(head, rest)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """The app closed: so does the browser's side."""
        self.upgrade.app_closed()


class _BrowserSide(Protocol):
    """The browser's connection once taken over from the HTTP channel."""

    def __init__(self, upgrade: Upgrade) -> None:
        self.upgrade = upgrade

    def dataReceived(self, data: bytes) -> None:
        """Bytes from the browser, to the app."""
        self.upgrade.to_app(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """The browser closed."""
        self.upgrade.browser_closed()


class Upgrade:
    """One upgraded exchange: the app's connection, then the splice."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.context = exchange.context
        self.app: _AppSide | None = None
        self.browser: _BrowserSide | None = None
        self.relaying: Any = None
        self.closed = False
        self.bytes_up = 0
        self.bytes_down = 0
        self.status = 0
        self.started = time.monotonic()
        self._timer: Any = None
        #: Its entry among the connections a reload asks again.
        self.held: held_connections.Held | None = None
        self._addresses = list(exchange.addresses)
        self._connecting: Any = None
        #: When a byte last passed (reactor seconds), and the idle check.
        self.last_active = 0.0
        self._idle: Any = None
        self.idle_closed = False
        #: Whose place it holds among the door's WebSockets once spliced
        #: (an identity's root, or ``anonymous``), None before and after.
        self.holder: str | None = None

    def start(self) -> None:
        """Connect to the app (IPv4 loopback, then IPv6)."""
        timeout = self.context.policy.rules["preview_proxy"].limits.timeout_seconds
        if timeout:
            self._timer = self.context.reactor.callLater(timeout, self._late)
        assert self.exchange.exposure is not None
        self.exchange.exposure.open.add(self)
        self._connect()

    def _connect(self) -> None:
        assert self.exchange.target is not None
        address = self._addresses.pop(0)
        kind = TCP6ClientEndpoint if ":" in address else TCP4ClientEndpoint
        endpoint = kind(self.context.reactor, address, self.exchange.target.port)
        self.app = _AppSide(self)
        self._connecting = connectProtocol(endpoint, self.app)
        self._connecting.addErrback(self._not_connected)

    def _not_connected(self, failure: Failure) -> None:
        self._connecting = None
        if self.closed:
            return
        if self._addresses:
            self._connect()
            return
        assert self.exchange.target is not None
        self._answer(upstream_unavailable(self.exchange.target.port))

    def _late(self) -> None:
        self._timer = None
        if self.status or self.closed:
            return
        assert self.exchange.target is not None
        timeout = self.context.policy.rules["preview_proxy"].limits.timeout_seconds
        self._answer(upstream_timeout(self.exchange.target.port, timeout or 0))

    def _answer(self, error: Any) -> None:
        """An error instead of the app's answer."""
        self._stop_timer()
        self._drop_app()
        self.closed = True
        if self.exchange.exposure is not None:
            self.exchange.exposure.open.discard(self)
        self.exchange.upgrade = False
        self.exchange._respond_error(error)

    def request_head(self) -> bytes:
        """The request head the app gets."""
        exchange = self.exchange
        return h.request_head(
            exchange.method,
            exchange.upstream_target(),
            exchange.upstream_headers(keep_upgrade=True),
        )

    def failed(self, why: str) -> None:
        """The app answered with something that is not HTTP."""
        assert self.exchange.target is not None
        self._answer(upstream_unavailable(self.exchange.target.port))

    def app_answered(self, head: bytes, rest: bytes) -> None:
        """The app's response head: splice on 101, else relay it."""
        self._stop_timer()
        try:
            status, reason, headers = parse_head(head)
        except ValueError as e:
            self.failed(str(e))
            return
        self.status = status
        exchange = self.exchange
        host = gate.host_name(exchange.host)
        kept = []
        for name, values in headers:
            if name.lower() == b"set-cookie":
                values = [v for v in values if h.cookie_allowed(v, host)]
                if not values:
                    continue
            kept.append((name, values))
        if status == 101:
            self._splice(status, reason, kept, rest)
        else:
            self._relay(status, reason, kept, rest)

    def _splice(
        self,
        status: int,
        reason: bytes,
        headers: list[tuple[bytes, list[bytes]]],
        rest: bytes,
    ) -> None:
        exchange = self.exchange
        exchange.status = 101
        lines = [b"HTTP/1.1 101 " + (reason or b"Switching Protocols")]
        lines += [name + b": " + v for name, values in headers for v in values]
        channel: Any = exchange.request.channel
        self.browser = _BrowserSide(self)
        channel.take_over(self.browser)
        browser: Any = self.browser.transport
        assert browser is not None and self.app is not None and self.app.transport
        browser.write(b"\r\n".join(lines) + b"\r\n\r\n")
        self.app.spliced = True
        app: Any = self.app.transport
        # Each socket is the other's producer: a full one pauses the other.
        browser.registerProducer(app, True)
        app.registerProducer(browser, True)
        if exchange.exposure is not None:
            exchange.exposure.websockets += 1
        identity = exchange.identity
        self.holder = identity.root if identity is not None else "anonymous"
        self.last_active = self.context.reactor.seconds()
        if exchange.identity is not None:
            self.held = held_connections.hold(
                self.context,
                exchange.identity,
                self.context.table.get("preview_proxy"),
                self._revoked,
                public=exchange.exposure is not None and exchange.exposure.public,
            )
        self._watch_idle()
        if rest:
            self.to_browser(rest)

    def _relay(
        self,
        status: int,
        reason: bytes,
        headers: list[tuple[bytes, list[bytes]]],
        rest: bytes,
    ) -> None:
        """A refusal of the upgrade (401, 404...) as an ordinary response."""
        exchange = self.exchange
        exchange.upgrade = False
        exchange.from_app = True
        request = exchange.request
        request.setResponseCode(status, reason)
        request.defaultContentType = None
        request.responseHeaders.removeHeader(b"content-type")
        length: int | None = None
        chunked = False
        for name, values in h.end_to_end(headers):
            request.responseHeaders.setRawHeaders(name, values)
        for name, values in headers:
            if name.lower() == b"content-length" and values[0].isdigit():
                length = int(values[0])
            if name.lower() == b"transfer-encoding":
                chunked = b"chunked" in values[-1].lower()
        exchange.status = status
        if status in (204, 304) or 100 <= status < 200 or exchange.method == b"HEAD":
            length = 0
        if length == 0 and not chunked:
            self._relay_done()
            return
        if chunked:
            decoder: Any = _ChunkedTransferDecoder(self._relay_data, self._relay_end)
        elif length is not None:
            decoder = _IdentityTransferDecoder(
                length, self._relay_data, self._relay_end
            )
        else:
            decoder = None  # to the close
        self.relaying = (
            decoder.dataReceived if decoder is not None else self._relay_data
        )
        if rest:
            self.relaying(rest)

    def _relay_data(self, data: bytes) -> None:
        if not self.closed:
            self.exchange.bytes_out += len(data)
            self.exchange.request.write(data)

    def _relay_end(self, extra: bytes) -> None:
        self._relay_done()

    def _relay_done(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._drop_app()
        if self.exchange.exposure is not None:
            self.exchange.exposure.open.discard(self)
        self.exchange.finished = True
        self.exchange.request.finish()

    # -- the splice -----------------------------------------------------------

    # -- the idle bound --------------------------------------------------------

    def _idle_limit(self) -> float | None:
        limits = self.context.policy.rules["preview_proxy"].limits
        value = limits.ws_idle_timeout_seconds
        return float(value) if value else None

    def _watch_idle(self) -> None:
        """
        Close the splice once no byte passed either way for
        ``limits.ws_idle_timeout_seconds``.  Each chunk only notes the
        time (a timer per chunk would cost every frame); one timer checks
        at the earliest moment the bound can be reached, and again from
        the last byte when there was traffic.
        """
        limit = self._idle_limit()
        if limit is None:
            return
        self.last_active = self.context.reactor.seconds()
        self._idle = self.context.reactor.callLater(limit, self._check_idle)

    def _check_idle(self) -> None:
        self._idle = None
        if self.closed:
            return
        limit = self._idle_limit()
        if limit is None:
            return  # a reload lifted the bound
        quiet = self.context.reactor.seconds() - self.last_active
        if quiet < limit:
            self._idle = self.context.reactor.callLater(limit - quiet, self._check_idle)
            return
        self.idle_closed = True
        if self.app is not None and self.app.transport is not None:
            self.app.transport.loseConnection()
        if self.browser is not None and self.browser.transport is not None:
            self.browser.transport.loseConnection()

    # -- the splice -----------------------------------------------------------

    def to_app(self, data: bytes) -> None:
        """Browser → app."""
        self.last_active = self.context.reactor.seconds()
        self.bytes_up += len(data)
        if self.app is not None and self.app.transport is not None:
            write_now(self.app.transport, data)

    def to_browser(self, data: bytes) -> None:
        """App → browser."""
        self.last_active = self.context.reactor.seconds()
        self.bytes_down += len(data)
        if self.browser is not None and self.browser.transport is not None:
            write_now(self.browser.transport, data)

    def app_closed(self) -> None:
        """The app's side is gone."""
        if self.relaying is not None and not self.closed:
            self._relay_done()  # a response read to the close
            return
        if self.status == 0 and not self.closed:
            assert self.exchange.target is not None
            self._answer(upstream_unavailable(self.exchange.target.port))
            return
        if self.browser is not None and self.browser.transport is not None:
            self.browser.transport.loseConnection()
        self._over()

    def browser_closed(self) -> None:
        """The browser's side is gone."""
        if self.app is not None and self.app.transport is not None:
            self.app.transport.loseConnection()
        self._over()

    def close(self, why: str | None = None) -> None:
        """
        End it now (the port was unexposed, its exposure expired, or the
        door stops): a spliced WebSocket gets a close frame first, 1001
        and ``why``, so that the page (a dev server's reloading client)
        learns the preview ended rather than seeing a dropped connection
        it would retry for ever.  As with :meth:`_revoked`, the frame may
        land inside one of the app's, and the browser then fails the
        socket, which ends it all the same.
        """
        self._drop_app(abort=True)
        if self.browser is not None and self.browser.transport is not None:
            browser = self.browser.transport
            frame = held_connections.close_frame(GOING_AWAY, why or "the preview ended")
            write_now(browser, frame)  # out before a close of the door aborts it
            browser.loseConnection()
        elif not self.closed:
            transport: Any = self.exchange.request.channel
            if transport is not None and transport.transport is not None:
                transport.transport.abortConnection()
        self._over()

    def _revoked(self, error: ApiError) -> None:
        """
        A reload no longer lets the caller in: a close frame (1008, the
        reason) to the browser, then both sides closed.  The splice does
        not parse frames, so the close may land inside one of the app's;
        the browser then fails the socket, which ends it all the same.
        """
        frame = held_connections.close_frame(
            held_connections.POLICY_VIOLATION, error.message
        )
        if self.browser is not None and self.browser.transport is not None:
            self.browser.transport.write(frame)
            self.browser.transport.loseConnection()
        self._drop_app()

    def _drop_app(self, abort: bool = False) -> None:
        if self._connecting is not None and not self._connecting.called:
            self._connecting.cancel()
        if self.app is not None and self.app.transport is not None:
            if abort:
                self.app.transport.abortConnection()  # type: ignore[attr-defined]
            else:
                self.app.transport.loseConnection()

    def _stop_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._idle is not None and self._idle.active():
            self._idle.cancel()
        self._idle = None

    def _over(self) -> None:
        """Once, when both sides are done: count, and write the audit line."""
        if getattr(self, "_done", False):
            return
        self._done = True
        self.closed = True
        self.holder = None
        self._stop_timer()
        held_connections.release(self.context, self.held)
        exchange = self.exchange
        exposure = exchange.exposure
        if exposure is not None:
            exposure.open.discard(self)
            if self.browser is not None:
                exposure.websockets = max(0, exposure.websockets - 1)
        if self.browser is not None:
            exchange.bytes_in += self.bytes_up
            exchange.bytes_out += self.bytes_down
            rule = None
            if self.idle_closed:  # the bound closed it: the audit line says which
                rule = limit_rule(
                    self.context.policy.rules["preview_proxy"],
                    "ws_idle_timeout_seconds",
                )
            exchange._audit(101, None, rule)
