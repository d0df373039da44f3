"""
A request without a body on a kept-alive connection to the door is relayed
by the door's own channel and the app's raw connection directly: what a
client sees at its edges (the app closing a kept connection between
requests, every framing and bodiless answer on one connection, in order,
a slow reader of a big answer).
"""

from __future__ import annotations

import http.client
import socket
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from tests.preview.test_channel import get, responses, talk
from tests.preview.test_door import DoorCase, rss_kib
from tests.preview.test_rawpool import ANSWERS, ScriptedApp

#: Answers the scripted app gives besides :data:`ANSWERS` (kept-alive,
#: then closed by the app a moment later; not modified).
ANSWERS.setdefault(b"/bye", b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbye")
ANSWERS.setdefault(b"/notmod", b'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\n\r\n')


class ClosingApp(ScriptedApp):
    """The scripted app, closing a connection on its next turn after answering ``/bye``."""

    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        answer = protocol.dataReceived

        def received(data: bytes) -> None:
            answer(data)
            if b"GET /bye " in data and protocol.transport is not None:
                reactor.callLater(0, protocol.transport.loseConnection)

        protocol.dataReceived = received  # type: ignore[method-assign]
        return protocol


class FastPathTests(DoorCase):
    """The door's direct relay, at its edges."""

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        self.scripted = yield self.serve(ClosingApp(), public=True)

    @inlineCallbacks
    def test_app_closes_between_requests(self) -> None:
        """
        The app closes a kept-alive connection after answering: the next
        request on the same browser connection, at once or a moment
        later, is answered (never a 502), on a fresh connection to the app.
        """
        host = self.host(self.scripted.port)

        def browse() -> list[tuple[int, bytes]]:
            c = http.client.HTTPConnection("127.0.0.1", self.door_port, timeout=10)
            out = []
            for path, pause in (
                ("/bye", 0.3),
                ("/length", 0),
                ("/bye", 0),
                ("/length", 0),
            ):
                c.request("GET", path, headers={"Host": host})
                r = c.getresponse()
                out.append((r.status, r.read()))
                time.sleep(pause)
            c.close()
            return out

        got = yield deferToThread(browse)
        yield deferLater(reactor, 0.1, lambda: None)  # the app's last close
        self.assertEqual(
            got, [(200, b"bye"), (200, b"hello"), (200, b"bye"), (200, b"hello")]
        )
        paths = [p for conn in self.scripted.connections for p in conn]
        self.assertEqual(paths, [b"/bye", b"/length", b"/bye", b"/length"])
        self.assertGreaterEqual(len(self.scripted.connections), 2)

    @inlineCallbacks
    def test_pipelined_framings_in_order(self) -> None:
        """
        Pipelined on one connection: a length, a chunked answer, a HEAD, a
        304 and a read-to-the-close answer come back in order, each framed
        (the HEAD and the 304 with no body and no chunking).
        """
        host = self.host(self.scripted.port)
        data = (
            get("/length", host)
            + get("/chunked", host)
            + get("/length", host, method="HEAD")
            + get("/notmod", host, 'If-None-Match: "v1"')
            + get("/close", host)
            + get("/length", host, "Connection: close")
        )
        raw, _ = yield deferToThread(talk, self.door_port, data)
        answers = responses(raw, heads=frozenset({2, 3}))
        self.assertEqual(
            [(status, body) for status, _, body in answers],
            [
                (200, b"hello"),
                (200, b"hello world"),
                (200, b""),
                (304, b""),
                (200, b"until the close"),
                (200, b"hello"),
            ],
        )
        chunked, head, notmod = answers[1][1], answers[2][1], answers[3][1]
        self.assertEqual(chunked.get("transfer-encoding"), "chunked")
        self.assertEqual(head.get("content-length"), "5")
        self.assertNotIn("transfer-encoding", notmod)
        self.assertNotIn("content-length", notmod)
        self.assertEqual(notmod.get("etag"), '"v1"')
        self.assertEqual(answers[4][1].get("transfer-encoding"), "chunked")

    @inlineCallbacks
    def test_small_answers_read_whole(self) -> None:
        """
        Answers that reach the door whole in one piece go to the client
        exactly as framed: the bytes an app wrote past its
        ``Content-Length`` never reach the client (nor does its connection
        serve another request), a HEAD and an empty answer keep their
        headers and have no body, and the next request is answered.
        """
        host = self.host(self.scripted.port)
        data = (
            get("/extra", host)
            + get("/length", host)
            + get("/length", host, method="HEAD")
            + get("/extra", host)
            + get("/length", host, "Connection: close")
        )
        raw, _ = yield deferToThread(talk, self.door_port, data)
        self.assertNotIn(b"SURPLUS", raw)
        answers = responses(raw, heads=frozenset({2}))
        self.assertEqual(
            [(status, body) for status, _, body in answers],
            [(200, b"ok"), (200, b"hello"), (200, b""), (200, b"ok"), (200, b"hello")],
        )
        self.assertEqual(answers[2][1].get("content-length"), "5")
        self.assertEqual(
            self.scripted.connections,
            [[b"/extra"], [b"/length", b"/length", b"/extra"], [b"/length"]],
        )


class SlowReaderTests(DoorCase):
    """A browser reading a big answer slowly."""

    @inlineCallbacks
    def test_slow_reader_keeps_memory_flat(self) -> None:
        """
        A client on a raw socket that reads a 256 MiB answer slowly: the app
        is paused while the client's socket is full and the daemon's memory
        stays flat; the answer arrives whole.
        """
        yield self.expose(public=True)
        size = 256 * 1024 * 1024
        port, host = self.door_port, self.host()
        state: dict[str, Any] = {}

        def read() -> int:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
                s.sendall(get(f"/big?n={size}", host, "Connection: close"))
                received = 0
                # Slowly at first (64 KiB per 0.1 s for 2 s), then at full speed.
                deadline = time.monotonic() + 2
                while time.monotonic() < deadline:
                    received += len(s.recv(65536))
                    time.sleep(0.1)
                state["slow_done"] = True
                while chunk := s.recv(1 << 20):
                    received += len(chunk)
                return received

        reading = deferToThread(read)
        yield deferLater(reactor, 0.8, lambda: None)
        before = rss_kib()
        yield deferLater(reactor, 1.0, lambda: None)
        written = size - self.app.streams[-1].left
        self.assertLess(written, 32 * 1024 * 1024, "the app was not paused")
        self.assertLess(rss_kib() - before, 8 * 1024, "memory grew while slow")
        received = yield reading
        head = 200  # the head is part of what was read
        self.assertGreater(received, size)
        self.assertLess(received - size, head + 4096)

    @inlineCallbacks
    def test_next_request_after_a_slow_read(self) -> None:
        """
        After a big answer read slowly to its end on a kept-alive
        connection, the next request on it (on the app's same pooled
        connection, paused while the reader was slow) is answered at once.
        """
        yield self.expose(public=True)
        size = 16 * 1024 * 1024
        port, host = self.door_port, self.host()

        def read() -> tuple[int, bytes, float]:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
                s.sendall(get(f"/big?n={size}", host))
                data = b""
                while b"\r\n\r\n" not in data:
                    data += s.recv(65536)
                _, _, body = data.partition(b"\r\n\r\n")
                received = len(body)
                time.sleep(0.5)  # let every buffer on the way fill
                while received < size:
                    chunk = s.recv(min(1 << 20, size - received))
                    assert chunk, "closed early"
                    received += len(chunk)
                started = time.monotonic()
                s.sendall(get("/headers", host, "Connection: close"))
                rest = b""
                while chunk := s.recv(65536):
                    rest += chunk
                return received, rest, time.monotonic() - started

        received, rest, took = yield deferToThread(read)
        self.assertEqual(received, size)
        self.assertTrue(rest.startswith(b"HTTP/1.1 200 "), rest[:80])
        self.assertLess(took, 10.0)
