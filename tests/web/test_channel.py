"""
``SandboxChannel.take_over``: a connection handed from HTTP to another
protocol (the preview door's WebSocket splice), in memory; ``client_left``
on real sockets; slow clients (a trickled body, a download nobody reads)
against a real daemon on loopback; and the lingering close of a refused
request's connection, on a TCP port, a unix socket and TLS.
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.protocol import Protocol
from twisted.internet.task import deferLater
from twisted.internet.testing import StringTransport
from twisted.internet.threads import deferToThread
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.web.channel import client_left
from tests.git.remote import make_ca
from tests.helpers import DaemonTestCase, trickle_body, unix_socket_path
from tests.web.test_request import connect, make_site


class Recorder(Protocol):
    """Keeps what it is given."""

    def __init__(self) -> None:
        self.data = b""
        self.lost: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Any = None) -> None:
        self.lost = reason


class TakeOverTests(SynchronousTestCase):
    """After take_over, every byte is the new protocol's; the connection stays counted."""

    def test_bytes_timeouts_and_count(self) -> None:
        """
        Bytes the client sent after the head are handed on, later bytes go
        straight to the new protocol, the idle timeout no longer cuts it,
        the channel stops being the transport's producer, and the site
        forgets the connection only when it closes.
        """
        site, reactor, _ = make_site()
        channel, transport = connect(site)
        channel._dataBuffer.append(b"early ")
        recorder = Recorder()
        channel.take_over(recorder)
        self.assertIs(recorder.transport, transport)
        self.assertIsNone(transport.producer)
        channel.dataReceived(b"late")
        self.assertEqual(recorder.data, b"early late")
        reactor.advance(3600 * 24)
        self.assertFalse(transport.disconnecting)
        self.assertIn(channel, site.connections)
        channel.connectionLost(Failure(ConnectionError("gone")))
        self.assertIsNotNone(recorder.lost)
        self.assertNotIn(channel, site.connections)

    def test_closed_connection(self) -> None:
        """A connection already gone cannot be taken over."""
        site, _, _ = make_site()
        channel, _ = connect(site)
        channel.transport = None
        self.assertRaises(RuntimeError, channel.take_over, Recorder())


HEALTH = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"


def statuses(written: bytes) -> list[bytes]:
    """The status lines in ``written``, in order."""
    return re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", written)


class HeadReadingTests(SynchronousTestCase):
    """Heads read whole from the buffer, however the bytes arrive."""

    def test_every_split(self) -> None:
        """A request cut at any byte gets the same answer as one sent whole."""
        site, _, _ = make_site()
        channel, transport = connect(site)
        channel.dataReceived(HEALTH)
        whole = transport.value()
        self.assertEqual(statuses(whole), [b"HTTP/1.1 200 OK"])
        body = whole.partition(b"\r\n\r\n")[2]
        for cut in range(1, len(HEALTH)):
            channel, transport = connect(site)
            channel.dataReceived(HEALTH[:cut])
            self.assertEqual(transport.value(), b"", cut)
            channel.dataReceived(HEALTH[cut:])
            self.assertEqual(transport.value().partition(b"\r\n\r\n")[2], body, cut)

    def test_pipelined_in_one_read(self) -> None:
        """Three requests in one read are answered in order on the kept-alive connection."""
        site, _, _ = make_site()
        channel, transport = connect(site)
        channel.dataReceived(
            HEALTH
            + b"GET /nowhere HTTP/1.1\r\nHost: localhost\r\n\r\n"
            + b"\r\n"  # one stray empty line between requests is skipped
            + HEALTH
        )
        self.assertEqual(
            statuses(transport.value()),
            [b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found", b"HTTP/1.1 200 OK"],
        )
        self.assertFalse(transport.disconnecting)

    def test_close_and_bytes_after(self) -> None:
        """``Connection: close`` is answered with close; requests sent after it are never read."""
        site, _, _ = make_site()
        channel, transport = connect(site)
        channel.dataReceived(
            b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
            + HEALTH
        )
        channel.dataReceived(b"not a request\r\n\r\n")
        written = transport.value()
        self.assertEqual(statuses(written), [b"HTTP/1.1 200 OK"])
        self.assertIn(b"\r\nConnection: close\r\n", written)
        self.assertTrue(transport.disconnecting)

    def test_refused_head(self) -> None:
        """A head the parser refuses is a JSON 400 saying why, and the connection closes."""
        site, _, _ = make_site()
        channel, transport = connect(site)
        channel.dataReceived(
            b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-A: 1\r\n folded\r\n\r\n"
        )
        written = transport.value()
        self.assertEqual(statuses(written), [b"HTTP/1.1 400 Bad Request"])
        error = json.loads(written.partition(b"\r\n\r\n")[2])
        self.assertEqual(error["code"], "malformed_request")
        self.assertIn("obs-folded", error["error"])
        self.assertTrue(transport.disconnecting)

    def test_body_in_pieces_then_next_request(self) -> None:
        """A Content-Length body arriving in pieces, the next request's head in the same read as its end."""
        site, _, _ = make_site()
        channel, transport = connect(site)
        body = b'{"path": "/tmp"}'
        channel.dataReceived(
            b"POST /nowhere HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body[:5]
        )
        self.assertEqual(transport.value(), b"")
        channel.dataReceived(body[5:] + HEALTH)
        self.assertEqual(
            statuses(transport.value()),
            [b"HTTP/1.1 404 Not Found", b"HTTP/1.1 200 OK"],
        )

    def test_expect_continue(self) -> None:
        """``Expect: 100-continue`` gets its interim answer before the body is sent."""
        site, _, _ = make_site()
        channel, transport = connect(site)
        channel.dataReceived(
            b"POST /nowhere HTTP/1.1\r\nHost: localhost\r\n"
            b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n"
        )
        self.assertEqual(transport.value(), b"HTTP/1.1 100 Continue\r\n\r\n")

    def test_take_over_gets_bytes_after_the_head(self) -> None:
        """Bytes that came in the same read as an upgrading head reach the new protocol."""
        site, _, _ = make_site()
        channel, _ = connect(site)
        recorder = Recorder()
        request: Any = None

        def upgrade() -> None:
            channel.take_over(recorder)

        original = channel.allContentReceived

        def all_content() -> None:
            nonlocal request
            request = channel.requests[-1]
            request.process = upgrade
            original()

        channel.allContentReceived = all_content
        channel.dataReceived(HEALTH + b"frame bytes")
        self.assertIsNotNone(request)
        self.assertEqual(recorder.data, b"frame bytes")


class IdleTimeoutTests(SynchronousTestCase):
    """The idle timeout closes quiet connections, never one whose request is handled."""

    def test_idle_after_response(self) -> None:
        """A kept-alive connection is closed once idle for the timeout after its answer."""
        from sandboxd.policy.defaults import HTTP_IDLE_TIMEOUT_SECONDS

        site, clock, _ = make_site()
        channel, transport = connect(site)
        clock.advance(HTTP_IDLE_TIMEOUT_SECONDS - 1)
        channel.dataReceived(HEALTH)
        clock.advance(HTTP_IDLE_TIMEOUT_SECONDS - 1)
        self.assertFalse(transport.disconnecting)
        clock.advance(2)
        self.assertTrue(transport.disconnecting)

    def test_long_request_not_cut(self) -> None:
        """A request handled for many idle timeouts keeps its connection; idleness counts from its end."""
        from sandboxd.policy.defaults import HTTP_IDLE_TIMEOUT_SECONDS

        site, clock, channels = make_site()
        channel, transport = connect(site)
        channel.dataReceived(b"GET /events HTTP/1.1\r\nHost: localhost\r\n\r\n")
        for _ in range(5):
            clock.advance(HTTP_IDLE_TIMEOUT_SECONDS)
        self.assertFalse(transport.disconnecting)
        self.assertTrue(channels[0].open)
        channels[0].close()
        clock.advance(HTTP_IDLE_TIMEOUT_SECONDS - 1)
        self.assertFalse(transport.disconnecting)
        clock.advance(2)
        self.assertTrue(transport.disconnecting)


class CountingTransport(StringTransport):
    """A StringTransport that counts the writes it is given."""

    writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        super().write(data)


class ResponseWriteTests(SynchronousTestCase):
    """How a complete response reaches the transport."""

    def exchange(self, head: bytes) -> CountingTransport:
        site, _, _ = make_site()
        channel = site.buildProtocol(None)
        transport = CountingTransport()
        channel.makeConnection(transport)
        channel.dataReceived(head)
        return transport

    def test_one_write(self) -> None:
        """A JSON answer with its length is one write: status line, headers and body."""
        transport = self.exchange(HEALTH)
        self.assertEqual(transport.writes, 1)
        head, _, body = transport.value().partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200 OK\r\n"))
        self.assertIn(b"\r\nContent-Length: %d" % len(body), head)
        self.assertIn(b"\r\nContent-Security-Policy: sandbox", head)
        self.assertEqual(json.loads(body), {"status": "ok"})

    def test_head_has_no_body(self) -> None:
        """HEAD gets GET's headers, its Content-Length included, and no body."""
        transport = self.exchange(b"HEAD /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        head, _, body = transport.value().partition(b"\r\n\r\n")
        self.assertIn(b"\r\nContent-Length: 15", head)
        self.assertEqual(body, b"")

    def test_http_1_0(self) -> None:
        """An HTTP/1.0 request is answered in full and the connection closed."""
        transport = self.exchange(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")
        self.assertTrue(transport.value().startswith(b"HTTP/1.0 200 OK\r\n"))
        self.assertTrue(transport.value().endswith(b'{"status":"ok"}'))
        self.assertTrue(transport.disconnecting)


class _OnSocket:
    """A transport with the socket ``client_left`` asks."""

    def __init__(self, sock: socket.socket) -> None:
        self.socket = sock


class ClientLeftTests(SynchronousTestCase):
    """Whether a request's client has gone, asked of a real socket."""

    def setUp(self) -> None:
        self.server, self.client = socket.socketpair()
        self.addCleanup(self.server.close)
        self.addCleanup(self.client.close)

    def test_connected_nothing_waiting(self) -> None:
        """A client still connected, with nothing more sent, is there."""
        self.assertFalse(client_left(_OnSocket(self.server)))

    def test_pipelined_request_waiting(self) -> None:
        """A next request waiting unread is a client still there; it stays unread."""
        self.client.sendall(b"GET / HTTP/1.1\r\n\r\n")
        self.assertFalse(client_left(_OnSocket(self.server)))
        self.assertEqual(self.server.recv(64), b"GET / HTTP/1.1\r\n\r\n")

    def test_closed(self) -> None:
        """A client that closed its end has left."""
        self.client.close()
        self.assertTrue(client_left(_OnSocket(self.server)))

    def test_shut_for_writing(self) -> None:
        """A client that shut its sending side with nothing waiting has left."""
        self.client.shutdown(socket.SHUT_WR)
        self.assertTrue(client_left(_OnSocket(self.server)))

    def test_request_then_close(self) -> None:
        """A pipelined request before the close is still read first: not gone yet."""
        self.client.sendall(b"GET / HTTP/1.1\r\n\r\n")
        self.client.shutdown(socket.SHUT_WR)
        self.assertFalse(client_left(_OnSocket(self.server)))

    def test_asked_again(self) -> None:
        """Each answer is about the socket asked, not the one asked before."""
        other, peer = socket.socketpair()
        self.addCleanup(other.close)
        peer.close()
        self.assertTrue(client_left(_OnSocket(other)))
        self.assertFalse(client_left(_OnSocket(self.server)))

    def test_no_socket(self) -> None:
        """A transport without a socket (tests, memory) never says gone."""
        self.assertFalse(client_left(object()))


def _trickle_body(port: int, seconds: float) -> tuple[bytes, float]:
    """A raw upload's body sent a byte every 0.2 s (:func:`trickle_body`)."""
    head = (
        b"POST /files/raw?path=trickled.bin HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Length: 100000\r\n\r\n"
    )
    return trickle_body(port, head, seconds)


def _read_nothing(port: int, path: str, seconds: float) -> tuple[int, bool, float]:
    """
    GET ``path`` with a small receive buffer and read nothing for
    ``seconds``, then read to the end: the bytes received, whether the
    daemon cut the connection before the whole answer came, and the time.
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(10)
        s.connect(("127.0.0.1", port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        began = time.monotonic()
        time.sleep(seconds)
        received, cut = 0, False
        try:
            while chunk := s.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            cut = True
        except TimeoutError:
            pass
        return received, cut, time.monotonic() - began


def _read_slowly(port: int, path: str, seconds: float) -> tuple[int, bool]:
    """
    GET ``path`` reading 4 KiB every 0.2 s for ``seconds``: the bytes
    received, and whether the daemon cut the connection meanwhile.
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(10)
        s.connect(("127.0.0.1", port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        began = time.monotonic()
        received = 0
        try:
            while time.monotonic() - began < seconds:
                chunk = s.recv(4096)
                if not chunk:
                    return received, True
                received += len(chunk)
                time.sleep(0.2)
        except ConnectionResetError:
            return received, True
        return received, False


class SlowClientTests(DaemonTestCase):
    """
    A client that sends its body too slowly, or takes none of its answer,
    does not hold its request, its slot and its connection for good.
    """

    timeout = 40
    autostart = False
    policy = {
        "endpoints": {
            "files_write_raw": {"limits": {"max_concurrency": 1}},
            "files_read_raw": {"limits": {"max_concurrency": 1}},
        }
    }

    def setUp(self) -> Any:
        super().setUp()
        return self.start(head_deadline=1.0, idle_timeout=1.0)

    @inlineCallbacks
    def test_trickled_body_is_408(self) -> Any:
        """
        A body sent a byte every 0.2 s: 408 ``timeout`` soon after the head
        deadline's grace, nothing written, and the endpoint's one slot
        free again for the next upload.
        """
        out, elapsed = yield deferToThread(_trickle_body, self.daemon.port, 15)
        head, _, body = out.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 408 "), out[:200])
        self.assertEqual(json.loads(body)["code"], "timeout")
        self.assertLess(elapsed, 6)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "trickled.bin")))
        reply = yield self.request(
            "POST", "/files/raw?path=next.bin", raw_body=b"whole"
        )
        self.assertEqual(reply.status, 200, reply.body)

    @inlineCallbacks
    def test_body_paused_by_the_daemon_is_not_counted(self) -> Any:
        """A body that comes at once is never refused, however slow the handler."""
        data = b"y" * 3_000_000
        reply = yield self.request("POST", "/files/raw?path=big.bin", raw_body=data)
        self.assertEqual(reply.status, 200, reply.body)
        with open(os.path.join(self.base_dir, "big.bin"), "rb") as f:
            self.assertEqual(f.read(), data)

    @inlineCallbacks
    def test_download_read_by_nobody_is_cut(self) -> Any:
        """
        A download whose client reads nothing is cut within two idle
        periods, and the endpoint's one slot is free again.
        """
        with open(os.path.join(self.base_dir, "big.bin"), "wb") as f:
            f.write(b"z" * 20_000_000)
        received, cut, elapsed = yield deferToThread(
            _read_nothing, self.daemon.port, "/files/raw?path=big.bin", 4.0
        )
        self.assertTrue(cut or received < 20_000_000, (received, elapsed))
        reply = yield self.request("GET", "/files/raw?path=big.bin")
        self.assertEqual(reply.status, 200, reply.body[:200])
        self.assertEqual(len(reply.body), 20_000_000)

    @inlineCallbacks
    def test_slow_reader_is_not_cut(self) -> Any:
        """A client that reads slowly but steadily keeps its download."""
        with open(os.path.join(self.base_dir, "big.bin"), "wb") as f:
            f.write(b"z" * 20_000_000)
        received, cut = yield deferToThread(
            _read_slowly, self.daemon.port, "/files/raw?path=big.bin", 4.0
        )
        self.assertFalse(cut, received)
        self.assertGreater(received, 0)

    @inlineCallbacks
    def test_stream_read_by_nobody_is_cut(self) -> Any:
        """
        A followed process output (SSE) whose client reads nothing while
        the process prints on: the stream is cut within a few idle periods
        of the client's window filling (the process itself runs on).
        """
        marker = f"hangs-unread-{os.getpid()}"
        reply = yield self.request(
            "POST",
            "/process/start",
            {"command": f"while :; do echo {marker}; sleep 0.01; done", "shell": "sh"},
        )
        self.assertEqual(reply.status, 200, reply.body)
        pid = reply.json()["pid"]
        self.addCleanup(self.request, "POST", f"/process/{pid}/signal", {"signal": 9})

        def follow_and_read_nothing() -> str:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.settimeout(10)
                s.connect(("127.0.0.1", self.daemon.port))
                s.sendall(
                    f"GET /process/{pid}/output?follow=true HTTP/1.1\r\n"
                    "Host: localhost\r\n\r\n".encode()
                )
                time.sleep(8)
                began = time.monotonic()
                try:
                    while s.recv(1 << 20):
                        if time.monotonic() - began > 5:
                            return "still streaming"
                except ConnectionResetError:
                    return "cut"
                return "ended"

        how = yield deferToThread(follow_and_read_nothing)
        self.assertEqual(how, "cut")


class AbandonedBodyTests(DaemonTestCase):
    """A request whose client leaves before its body is whole leaves nothing held."""

    timeout = 30
    policy = {"endpoints": {"files_write_raw": {"limits": {"max_concurrency": 1}}}}

    @inlineCallbacks
    def test_client_gone_mid_body_frees_the_slot(self) -> Any:
        """
        A client that sends half its body and closes: the endpoint's one
        concurrency slot is free again, nothing is written.
        """

        def half() -> None:
            with socket.create_connection(("127.0.0.1", self.daemon.port), 10) as s:
                s.sendall(
                    b"POST /files/raw?path=half.bin HTTP/1.1\r\nHost: localhost\r\n"
                    b"Content-Length: 1000\r\n\r\n" + b"x" * 500
                )
                time.sleep(0.3)

        yield deferToThread(half)
        for _ in range(20):
            reply = yield self.request(
                "POST", "/files/raw?path=next.bin", raw_body=b"whole"
            )
            if reply.status != 429:
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertEqual(reply.status, 200, reply.body)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "half.bin")))


class AbandonedBodyAuditTests(DaemonTestCase):
    """
    An upload its client abandons mid-body is audited and counted once,
    whether or not its endpoint has a concurrency limit.
    """

    timeout = 30
    audit = True
    policy = {"defaults": {"audit": "all"}}

    @inlineCallbacks
    def test_cut_upload_is_audited_and_counted(self) -> Any:
        """
        Half a ``POST /files/raw`` body and a close, on an endpoint with
        no ``max_concurrency``: one audit line 499 ``client_closed`` and
        one ``sandboxd_requests_total`` sample for it.
        """

        def half() -> None:
            with socket.create_connection(("127.0.0.1", self.daemon.port), 10) as s:
                s.sendall(
                    b"POST /files/raw?path=half.bin HTTP/1.1\r\nHost: localhost\r\n"
                    b"Content-Length: 1000\r\n\r\n" + b"x" * 500
                )
                time.sleep(0.3)

        yield deferToThread(half)
        for _ in range(20):
            lines = [
                r for r in self.audit_lines() if r["endpoint"] == "files_write_raw"
            ]
            if lines:
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertEqual(
            [(r["status"], r["code"], r["bytes_in"]) for r in lines],
            [(499, "client_closed", 500)],
        )
        reply = yield self.request("GET", "/metrics")
        samples = [
            line
            for line in reply.body.decode().splitlines()
            if line.startswith("sandboxd_requests_total{")
            and 'endpoint="files_write_raw"' in line
        ]
        self.assertEqual(len(samples), 1, samples)
        self.assertIn('status="499"', samples[0])
        self.assertEqual(float(samples[0].rsplit(" ", 1)[1]), 1.0, samples[0])
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "half.bin")))


#: A refused request's head (413 from its Content-Length, or 401 where the
#: daemon has a token, before any body byte is read) and one too large to
#: read at all (400): each followed by the body its client goes on sending.
_BIG_BODY_HEAD = (
    b"POST /shell HTTP/1.1\r\nHost: localhost\r\n"
    b"Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n"
)
_HUGE_HEAD = (
    b"POST /shell HTTP/1.1\r\nHost: localhost\r\nX-Pad: "
    + b"p" * (20 * 1024)
    + b"\r\nContent-Length: 10\r\n\r\n"
)


def _read_to_end(s: socket.socket) -> bytes:
    """Everything ``s`` receives until its end of stream (blocking)."""
    out = b""
    while data := s.recv(65536):
        out += data
    return out


def _send_then_read(
    connect: Callable[[], socket.socket], head: bytes, more: int, pause: float
) -> bytes:
    """
    Send ``head`` and 64 KiB on a connection from ``connect``, wait
    ``pause`` s (the refusal is written and the daemon has closed or not by
    then), send ``more`` bytes, then read to the end: what came back
    (blocking: run it in a thread).

    :raises OSError: when the daemon reset the connection under the
        client, in a send or in the read.
    """
    with connect() as s:
        s.sendall(head + b"x" * 65536)
        time.sleep(pause)
        chunk = b"x" * 65536
        for _ in range(more // len(chunk)):
            s.sendall(chunk)
        return _read_to_end(s)


def _metric(text: str, name: str) -> float:
    """The value of ``name`` (with its labels) in a Prometheus text page."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} is not in the page")


class LingeringCloseTests(DaemonTestCase):
    """
    A request answered before it was read whole (a refusal at its head, a
    head too large to read) has its answer reach the client, however much
    of its body the client still sends after it: the daemon reads and drops
    that, within bounds, instead of closing on unread bytes (which Linux
    answers with a reset that destroys the answer).  On a TCP listener
    here; the subclasses run the same cases over a unix socket and TLS.
    """

    timeout = 60
    autostart = False
    policy = {"endpoints": {"shell": {"limits": {"max_concurrency": 1}}}}
    #: What the daemon answers to ``_BIG_BODY_HEAD``.
    refused = (b"413", "payload_too_large")

    def setUp(self) -> Any:
        super().setUp()
        return self.start(head_deadline=2.0, **self.listener())

    def listener(self) -> dict[str, Any]:
        """The daemon's settings for its HTTP listener (a loopback port)."""
        return {}

    def connect(self) -> socket.socket:
        """A client connection to the daemon's HTTP listener."""
        return socket.create_connection(("127.0.0.1", self.daemon.port), 10)

    def ask(self, method: str, path: str, body: Any = None) -> Any:
        """
        One HTTP/1.0 request (with the case's token) on a connection of
        its own, in a thread: fires with its status and body.
        """

        def exchange() -> tuple[int, bytes]:
            data = json.dumps(body).encode() if body is not None else b""
            token = f"X-Access-Token: {self.token}\r\n" if self.token else ""
            with self.connect() as s:
                s.sendall(
                    f"{method} {path} HTTP/1.0\r\nHost: localhost\r\n{token}"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                out = _read_to_end(s)
            head, _, rest = out.partition(b"\r\n\r\n")
            return int(head.split()[1]), rest

        return deferToThread(exchange)

    @inlineCallbacks
    def active_connections(self) -> Any:
        """The connection gauge of the HTTP door (counting the asking one)."""
        status, page = yield self.ask("GET", "/metrics")
        self.assertEqual(status, 200, page[:300])
        return _metric(page.decode(), 'sandboxd_connections_active{door="http"}')

    def assertRefusal(self, out: bytes, status: bytes, code: str) -> None:
        """``out`` is one whole JSON refusal with ``status`` and ``code``."""
        head, _, body = out.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 " + status + b" "), out[:300])
        length = re.search(rb"(?i)\r\ncontent-length: (\d+)", head)
        assert length is not None, head
        self.assertEqual(len(body), int(length.group(1)), out[:300])
        self.assertEqual(json.loads(body)["code"], code)

    @inlineCallbacks
    def test_refusal_reaches_a_client_still_sending(self) -> Any:
        """
        50 times over: a refusal at the head (413 from its Content-Length,
        or 401), the client sending 1 MiB more of its body after it, then
        reading: the whole refusal, never a reset.
        """
        for attempt in range(50):
            try:
                out = yield deferToThread(
                    _send_then_read, self.connect, _BIG_BODY_HEAD, 1 << 20, 0.02
                )
            except OSError as e:
                self.fail(f"attempt {attempt}: {e!r}")
            self.assertRefusal(out, *self.refused)

    @inlineCallbacks
    def test_head_too_large_reaches_a_client_still_sending(self) -> Any:
        """
        50 times over: a head over the daemon's bound, the client sending
        on (the E2B SDK's long path in a query): the whole 400, never a
        reset.
        """
        for attempt in range(50):
            try:
                out = yield deferToThread(
                    _send_then_read, self.connect, _HUGE_HEAD, 256 * 1024, 0.02
                )
            except OSError as e:
                self.fail(f"attempt {attempt}: {e!r}")
            self.assertRefusal(out, b"400", "malformed_request")

    @inlineCallbacks
    def test_refusal_reaches_a_client_that_shut_its_side(self) -> Any:
        """
        50 times over: a client that sends its head and some body and
        shuts its side at once (its end of stream read with the body):
        the whole refusal still reaches it.
        """

        def send_shut_read() -> bytes:
            with self.connect() as s:
                s.sendall(_BIG_BODY_HEAD + b"x" * 1000)
                # The socket's own shutdown, also under TLS (whose
                # ``shutdown`` would drop the TLS layer): the end of the
                # stream without a close_notify, as a client that exits
                # does.
                socket.socket.shutdown(s, socket.SHUT_WR)
                return _read_to_end(s)

        for attempt in range(50):
            try:
                out = yield deferToThread(send_shut_read)
            except OSError as e:
                self.fail(f"attempt {attempt}: {e!r}")
            self.assertRefusal(out, *self.refused)

    @inlineCallbacks
    def test_slot_and_connection_freed(self) -> Any:
        """
        While a refused client lingers (quiet, its socket open), the
        endpoint's one concurrency slot is free; once it has been quiet
        for the bound, its connection is closed and no longer counted.
        """

        def refused_then_quiet() -> tuple[bytes, bytes]:
            with self.connect() as s:
                s.sendall(_BIG_BODY_HEAD + b"x" * 65536)
                out = _read_to_end(s)
                # The daemon's end of stream came with the answer; our
                # side stays open (and sends nothing) until it is let go.
                s.settimeout(8)
                try:
                    rest = s.recv(1)
                except ConnectionResetError:
                    rest = b"reset"
                return out, rest

        waiting = deferToThread(refused_then_quiet)
        yield deferLater(reactor, 0.5, lambda: None)
        status, body = yield self.ask("POST", "/shell", {"command": "echo free"})
        self.assertEqual(status, 200, body)
        out, _ = yield waiting
        self.assertRefusal(out, *self.refused)
        began = time.monotonic()
        while True:
            active = yield self.active_connections()
            if active == 1 or time.monotonic() - began > 10:
                break
            yield deferLater(reactor, 0.2, lambda: None)
        self.assertEqual(active, 1)  # this request's own

    @inlineCallbacks
    def test_quiet_client_is_closed(self) -> Any:
        """
        A refused client that has read its answer and then sends nothing,
        its socket left open, has its connection closed once it has been
        quiet for the bound (0.3 s here), well before the time bound (the
        head deadline, 2 s), and no longer counted.
        """
        from sandboxd.web import connections

        self.patch(connections, "LINGER_QUIET_SECONDS", 0.3)
        answered: list[float] = []

        def refused_then_silent() -> bytes:
            with self.connect() as s:
                s.sendall(_BIG_BODY_HEAD + b"x" * 65536)
                out = _read_to_end(s)
                answered.append(time.monotonic())
                time.sleep(6)  # open and silent
                return out

        waiting = deferToThread(refused_then_silent)
        while not answered:
            yield deferLater(reactor, 0.05, lambda: None)
        while True:
            active = yield self.active_connections()
            closed_after = time.monotonic() - answered[0]
            if active == 1 or closed_after > 5:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual(active, 1)  # this request's own
        self.assertLess(closed_after, 1.5)
        out = yield waiting
        self.assertRefusal(out, *self.refused)

    @inlineCallbacks
    def test_client_that_never_stops_is_cut(self) -> Any:
        """
        A refused client that sends on without end is cut at the bound
        (the head deadline, 2 s here), not read for ever.
        """

        def send_for_ever() -> float:
            with self.connect() as s:
                s.sendall(_BIG_BODY_HEAD)
                began = time.monotonic()
                chunk = b"x" * 65536
                try:
                    while time.monotonic() - began < 20:
                        s.sendall(chunk)
                        time.sleep(0.005)
                except OSError:
                    pass
                return time.monotonic() - began

        elapsed = yield deferToThread(send_for_ever)
        self.assertLess(elapsed, 8)
        self.assertGreater(elapsed, 1.5)

    @inlineCallbacks
    def test_client_sending_too_much_is_cut(self) -> Any:
        """
        A refused client that sends more than the lingering close reads
        (256 KiB here) is cut then, before the time bound.
        """
        from sandboxd.web import channel

        self.patch(channel, "LINGER_MAX_BYTES", 256 * 1024)

        def send_a_lot() -> tuple[int, float]:
            with self.connect() as s:
                s.sendall(_BIG_BODY_HEAD)
                began = time.monotonic()
                sent = 0
                try:
                    while sent < 64 << 20:
                        s.sendall(b"x" * 65536)
                        sent += 65536
                except OSError:
                    pass
                return sent, time.monotonic() - began

        sent, elapsed = yield deferToThread(send_a_lot)
        self.assertLess(sent, 16 << 20)
        self.assertLess(elapsed, 1.5)


class UnixLingeringCloseTests(LingeringCloseTests):
    """
    The lingering close on a unix-socket listener, whose daemon has a
    token (a unix listener without one is refused at start): the refusal
    at the head is a 401 there.
    """

    token = "unix-token"
    refused = (b"401", "unauthorized")

    def listener(self) -> dict[str, Any]:
        """A unix socket."""
        self.socket_path = unix_socket_path(self, "http.sock")
        return {"port": f"unix:{self.socket_path}"}

    def connect(self) -> socket.socket:
        """A client connection to the daemon's unix socket."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(self.socket_path)
        return s


class TlsLingeringCloseTests(LingeringCloseTests):
    """The lingering close on a TLS listener (``ssl:``)."""

    def listener(self) -> dict[str, Any]:
        """A loopback port with TLS, its certificate from a test CA."""
        directory = os.path.realpath(self.mktemp())
        os.makedirs(directory)
        ca, cert, key = make_ca(directory)
        self.tls = ssl.create_default_context(cafile=ca)
        return {"port": f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}"}

    def connect(self) -> socket.socket:
        """A TLS client connection to the daemon's port."""
        raw = socket.create_connection(("127.0.0.1", self.daemon.port), 10)
        try:
            return self.tls.wrap_socket(raw, server_hostname="localhost")
        except BaseException:
            raw.close()
            raise

    @inlineCallbacks
    def test_lingering_connection_makes_room_at_the_cap(self) -> Any:
        """
        A refused client that has read its answer and waits, silent, is
        the connection that makes room when the cap (one connection here)
        is reached: the next client is served, and the lingering one's
        connection is closed then (its client sees the end of the TCP
        stream under TLS), not at the quiet bound (5 s here).
        """
        table = self.daemon.daemon.listeners[0].factory.table
        self.patch(
            table,
            "limits",
            attrs.evolve(table.limits, max_connections=1, head_deadline=30.0),
        )
        answered: list[float] = []

        def refused_then_wait() -> tuple[bytes, float]:
            with self.connect() as s:
                s.sendall(_BIG_BODY_HEAD + b"x" * 65536)
                out = _read_to_end(s)  # to TLS's close_notify
                answered.append(time.monotonic())
                poll = select.poll()
                poll.register(s.fileno(), select.POLLRDHUP)
                poll.poll(10_000)
                return out, time.monotonic() - answered[0]

        waiting = deferToThread(refused_then_wait)
        while not answered:
            yield deferLater(reactor, 0.05, lambda: None)
        yield deferLater(reactor, 0.3, lambda: None)
        active = yield self.active_connections()
        self.assertEqual(active, 1)  # this request's own
        out, closed_after = yield waiting
        self.assertRefusal(out, *self.refused)
        self.assertLess(closed_after, 2.5)


def _one_answer(sock: socket.socket, buffered: bytes = b"") -> tuple[bytes, bytes]:
    """One HTTP answer read from ``sock`` (head, body); blocking."""
    data = buffered
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed mid-answer: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed mid-body: {head + body!r}")
        body += chunk
    return head, body


class StoppingKeepAliveTests(DaemonTestCase):
    """A client on a connection opened before the daemon's stop."""

    timeout = 30

    @inlineCallbacks
    def test_health_says_stopping_and_closes(self) -> Any:
        """
        While the daemon stops (a child that ignores SIGTERM holds the stop
        5 s), ``/health`` on an already open keep-alive connection answers
        503 ``unavailable`` with ``Connection: close``, and the connection
        is then closed: a keep-alive prober learns of the stop.
        """
        started = yield self.request(
            "POST",
            "/process/start",
            {"shell": "bash", "command": "trap '' TERM; exec sleep 101"},
        )
        self.assertEqual(started.status, 200, started.body)
        yield deferLater(reactor, 0.3, lambda: None)
        sock = socket.create_connection(("127.0.0.1", self.daemon.port), timeout=10)
        self.addCleanup(sock.close)
        ask = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
        sock.sendall(ask)
        head, body = yield deferToThread(_one_answer, sock)
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head)
        self.assertNotIn(b"close", head.lower())
        stopping = self.daemon.stop()
        self.assertFalse(stopping.called)

        def ask_again() -> tuple[bytes, bytes, bytes]:
            sock.sendall(ask)
            head, body = _one_answer(sock)
            return head, body, sock.recv(65536)

        head, body, after = yield deferToThread(ask_again)
        self.assertTrue(head.startswith(b"HTTP/1.1 503"), head)
        self.assertIn(b"connection: close", head.lower())
        self.assertEqual(json.loads(body)["code"], "unavailable")
        self.assertEqual(after, b"")
        yield stopping
