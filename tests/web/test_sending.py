"""
How a response leaves: at once, on a connection that sends small writes
without waiting (``TCP_NODELAY``), not on the reactor's next turn.
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.protocol import Factory, Protocol
from twisted.trial.unittest import TestCase
from twisted.web.http import toChunk

from sandboxd.web.sending import (
    BIG_SEND_BYTES,
    send_now,
    write_chunk_now,
    write_head_and_body_now,
    write_now,
)
from tests.helpers import DaemonTestCase, unix_socket_path


class _Accepted(Protocol):
    def connectionMade(self) -> None:
        self.factory.accepted.callback(self.transport)  # type: ignore[attr-defined]


class SendNowTests(TestCase):
    """:func:`send_now` against a real loopback connection."""

    @inlineCallbacks
    def setUp(self) -> Any:
        factory = Factory.forProtocol(_Accepted)
        factory.accepted = Deferred()  # type: ignore[attr-defined]
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")  # type: ignore[attr-defined]
        self.addCleanup(port.stopListening)
        self.client = socket.create_connection(("127.0.0.1", port.getHost().port))
        self.addCleanup(self.client.close)
        self.client.settimeout(2)
        self.transport = yield factory.accepted
        self.addCleanup(self.transport.abortConnection)

    def test_written_before_the_next_turn(self) -> None:
        """Bytes written then sent now reach the client without the reactor running."""
        self.transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        send_now(self.transport)
        self.assertEqual(self.client.recv(100), b"HTTP/1.1 200 OK\r\n\r\n")
        self.assertEqual(self.transport.dataBuffer, b"")

    def test_closing_connection_left_to_twisted(self) -> None:
        """A connection being closed keeps its bytes for Twisted's own turn (which closes it)."""
        self.transport.write(b"bye")
        self.transport.loseConnection()
        send_now(self.transport)
        self.assertEqual(self.transport._tempDataLen, 3)

    def test_write_now_sends_without_watching(self) -> None:
        """Nothing queued: the bytes reach the client and the reactor is not asked to watch the socket."""
        write_now(self.transport, b"HTTP/1.1 200 OK\r\n\r\n")
        self.assertEqual(self.client.recv(100), b"HTTP/1.1 200 OK\r\n\r\n")
        self.assertNotIn(self.transport, reactor.getWriters())  # type: ignore[attr-defined]
        self.assertEqual(self.transport._tempDataLen, 0)

    def test_write_now_keeps_order(self) -> None:
        """Bytes already queued go first; the new ones queue behind them."""
        self.transport.write(b"first ")
        write_now(self.transport, b"second")
        self.assertEqual(self.transport._tempDataLen, 12)
        send_now(self.transport)
        self.assertEqual(self.client.recv(100), b"first second")

    def test_write_now_on_a_closing_connection(self) -> None:
        """A connection being closed is left to Twisted: the bytes are queued for its own turn."""
        self.transport.loseConnection()
        write_now(self.transport, b"late")
        self.assertEqual(self.transport._tempDataLen, 4)

    def test_head_and_body_sent_together(self) -> None:
        """A head and a body reach the client in order, the reactor not asked to watch."""
        write_head_and_body_now(self.transport, b"HEAD|", b"body")
        self.assertEqual(self.client.recv(100), b"HEAD|body")
        self.assertNotIn(self.transport, reactor.getWriters())  # type: ignore[attr-defined]

    @inlineCallbacks
    def test_head_and_big_body_the_socket_cannot_take(self) -> Any:
        """What the socket does not take is queued after what it took: every byte arrives, in order."""
        body = bytes(range(256)) * (16 * 1024)  # 4 MiB, more than a socket buffer
        write_head_and_body_now(self.transport, b"HEAD|", body)
        self.assertGreater(len(self.transport.dataBuffer) - self.transport.offset, 0)
        # The rest is the body itself (not a copy), sent megabytes a turn.
        self.assertIs(self.transport.dataBuffer, body)
        self.assertEqual(self.transport.SEND_LIMIT, BIG_SEND_BYTES)
        self.client.setblocking(False)
        got = bytearray()
        for _ in range(500):
            try:
                chunk = self.client.recv(1 << 20)
            except BlockingIOError:
                yield _turn()
                continue
            got += chunk
            if len(got) == len(body) + 5:
                break
        self.assertEqual(bytes(got), b"HEAD|" + body)

    def test_head_and_body_behind_queued_bytes(self) -> None:
        """Bytes already queued go first; head and body queue behind them."""
        self.transport.write(b"first ")
        write_head_and_body_now(self.transport, b"head ", b"body")
        self.assertEqual(self.transport._tempDataLen, 15)
        send_now(self.transport)
        self.assertEqual(self.client.recv(100), b"first head body")


class SendNowUnixTests(TestCase):
    """:func:`send_now` on a connection accepted on a unix socket."""

    @inlineCallbacks
    def test_written_before_the_next_turn(self) -> Any:
        """
        Bytes written then sent now reach a unix-socket client without the
        reactor running, as on TCP (a refusal then leaves before its
        client's end of stream is read and the connection closed).
        """
        path = unix_socket_path(self, "s.sock")
        factory = Factory.forProtocol(_Accepted)
        factory.accepted = Deferred()  # type: ignore[attr-defined]
        port = reactor.listenUNIX(path, factory)  # type: ignore[attr-defined]
        self.addCleanup(port.stopListening)
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(client.close)
        client.settimeout(2)
        client.connect(path)
        transport = yield factory.accepted
        self.addCleanup(transport.abortConnection)
        transport.write(b"HTTP/1.1 413 Request Entity Too Large\r\n\r\n")
        send_now(transport)
        self.assertEqual(
            client.recv(100), b"HTTP/1.1 413 Request Entity Too Large\r\n\r\n"
        )
        self.assertEqual(transport.dataBuffer, b"")


class _Channel:
    def __init__(self, transport: Any) -> None:
        self.transport = transport


class _StreamingRequest:
    """What :func:`write_chunk_now` reads of a Twisted request, on a real transport."""

    def __init__(self, transport: Any, chunked: bool = True) -> None:
        self.channel = _Channel(transport)
        self.chunked = chunked
        self.startedWriting = True
        self.finished = False
        self._disconnected = False
        self.sentLength = 0
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        self.sentLength += len(data)
        if self.chunked:
            self.channel.transport.writeSequence(toChunk(data))
        else:
            self.channel.transport.write(data)


class WriteChunkNowTests(TestCase):
    """:func:`write_chunk_now`: a streamed body's piece in parts, never joined when it can be sent."""

    setUp = SendNowTests.setUp

    def _read(self, size: int) -> Deferred[bytes]:
        got = bytearray()

        @inlineCallbacks
        def read() -> Any:
            self.client.setblocking(False)
            for _ in range(2000):
                try:
                    chunk = self.client.recv(1 << 20)
                except BlockingIOError:
                    yield _turn()
                    continue
                got.extend(chunk)
                if len(got) >= size:
                    break
            return bytes(got)

        return read()

    def test_parts_sent_as_one_chunk(self) -> None:
        """The parts reach the client as one chunk of the HTTP stream, the reactor not asked to watch."""
        request = _StreamingRequest(self.transport)
        write_chunk_now(request, [b"event: a\ndata: ", b'"text"', b"\n\n"])
        self.assertEqual(self.client.recv(100), b'17\r\nevent: a\ndata: "text"\n\n\r\n')
        self.assertEqual(request.writes, [])
        self.assertEqual(request.sentLength, 23)
        self.assertNotIn(self.transport, reactor.getWriters())  # type: ignore[attr-defined]

    @inlineCallbacks
    def test_big_parts_the_socket_cannot_take(self) -> Any:
        """What the socket does not take is queued after what it took: every byte arrives, in order."""
        text = bytes(range(256)) * (16 * 1024)  # 4 MiB, more than a socket buffer
        parts = [b"data: ", text[:1000], text[1000:], b"\n\n"]
        request = _StreamingRequest(self.transport)
        write_chunk_now(request, parts)
        self.assertGreater(self.transport._tempDataLen, 0)
        whole = b"".join(toChunk(b"".join(parts)))
        got = yield self._read(len(whole))
        self.assertEqual(got, whole)

    def test_behind_queued_bytes(self) -> None:
        """Bytes already queued go first: the chunk goes through the request's write, behind them."""
        self.transport.write(b"first ")
        request = _StreamingRequest(self.transport)
        write_chunk_now(request, [b"a", b"b"])
        self.assertEqual(request.writes, [b"ab"])
        send_now(self.transport)
        self.assertEqual(self.client.recv(100), b"first 2\r\nab\r\n")

    def test_not_chunked(self) -> None:
        """A body that is not chunked (HTTP/1.0) is written by the request, joined."""
        request = _StreamingRequest(self.transport, chunked=False)
        write_chunk_now(request, [b"a", b"b"])
        self.assertEqual(request.writes, [b"ab"])


class NoDelayTests(DaemonTestCase):
    """The HTTP port's connections send small writes at once."""

    @inlineCallbacks
    def test_accepted_connection_has_nodelay(self) -> Any:
        """A connection the daemon accepted has TCP_NODELAY set."""
        reply = yield self.request("GET", "/health")
        self.assertEqual(reply.status, 200)
        client = socket.create_connection(("127.0.0.1", self.daemon.port))
        self.addCleanup(client.close)
        site = self.daemon.context.metrics.site
        for _ in range(100):
            if site.connections:
                break
            yield _turn()
        flags = {
            channel.transport.getHandle().getsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY
            )
            for channel in site.connections
        }
        self.assertEqual(flags, {1})


def _turn() -> Deferred[None]:
    d: Deferred[None] = Deferred()
    reactor.callLater(0.01, d.callback, None)  # type: ignore[attr-defined]
    return d
