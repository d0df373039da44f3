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
- Fewer headers than Twisted allows (500).
- Obs-folded header lines (a line starting with a space or tab, RFC 9112
  §5.2) are refused: Twisted joins them, so a token, Host or length could
  read differently to a proxy in front of us.
- Whatever Twisted's parser refuses gets a JSON body with a ``code``
  (``malformed_request``) like every other error, not a bare status line.

HTTP/2 is not offered (HTTP/1.1 only; see docs/operations.md), so the
channel is used directly rather than through Twisted's protocol switcher.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from twisted.internet.interfaces import IProtocol
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.web.http import HTTPChannel

from sandboxd.errors import malformed_request
from sandboxd.policy.defaults import MAX_HEADERS

#: The body of a request Twisted's parser refuses (framing, obs-fold, ...).
MALFORMED = malformed_request("malformed HTTP request").body()


class SandboxChannel(HTTPChannel):
    """One client connection."""

    maxHeaders = MAX_HEADERS
    peer_host = ""
    #: Whether a request head is on its way (see :meth:`dataReceived`).
    _in_head = False
    _secure: bool | None = None

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
        peer = self.transport.getPeer() if self.transport is not None else None
        self.peer_host = getattr(peer, "host", "") or ""
        site: Any = self.site  # type: ignore[attr-defined]
        # The first request's head is due from now, before any byte.
        self._in_head = True
        if not site.connection_opened(self):
            self.transport.abortConnection()  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        """The first byte of a request on a kept-alive connection starts its head."""
        if not self._in_head and not self.requests and not self._handlingRequest:
            self._in_head = True
            table = self._table()
            if table is not None:
                table.head_started(self)
        super().dataReceived(data)

    def allHeadersReceived(self) -> None:
        """The head is complete: no deadline while the request is handled."""
        self._in_head = False
        table = self._table()
        if table is not None:
            table.head_done(self)
        super().allHeadersReceived()

    def requestDone(self, request: Any) -> None:
        """
        A response is done: the connection is idle, or a pipelined request
        already waiting in the buffer has its head read now.
        """
        table = self._table()
        if table is None or not self.persistent:
            pass  # closing (Twisted loses the connection next), or no table
        elif self._dataBuffer:
            self._in_head = True
            table.head_started(self)
        else:
            table.went_idle(self)
        super().requestDone(request)

    def _table(self) -> Any:
        """
        The site's :class:`~sandboxd.web.connections.ConnectionTable`, or
        None for a site that keeps its own count (the E2B door's).
        """
        return getattr(self.site, "table", None)  # type: ignore[attr-defined]

    def close_idle(self) -> None:
        """Reclaimed between requests, to make room at a cap."""
        self.loseConnection()

    def close_slow(self) -> None:
        """The request head is overdue, or reclaimed at a cap."""
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

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

    def lineReceived(self, line: bytes) -> None:
        """Refuse obs-fold continuation lines among the headers."""
        if line[:1] in (b" ", b"\t") and not self._HTTPChannel__first_line:  # type: ignore[attr-defined]
            self._respondToBadRequestAndDisconnect()
            return
        super().lineReceived(line)

    def _respondToBadRequestAndDisconnect(self) -> None:
        """Twisted's parser refused the request: a JSON 400, then close."""
        body = json.dumps(MALFORMED, separators=(",", ":")).encode()
        if self.transport is not None:
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
            )
        self.loseConnection()

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
        buffered = replay + b"".join(self._dataBuffer)
        self._dataBuffer = []
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
        site: Any = self.site  # type: ignore[attr-defined]
        site.connection_closed(self)
        super().connectionLost(reason)


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
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
