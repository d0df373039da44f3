"""
Parser-level tests of the pipeline: raw bytes fed to the real HTTPChannel of
a :class:`SandboxSite` over a StringTransport, on a memory reactor.
"""

from __future__ import annotations

import json
import os
import socket
import time
from types import SimpleNamespace
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import deferLater
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.http import toChunk

from sandboxd.access.audit import AuditLog
from sandboxd.commands import CommandRegistry
from sandboxd.daemon.context import Context
from sandboxd.endpoints import CapabilityGroup
from sandboxd.policy import load_policy
from sandboxd.policy.defaults import LARGE_BODY_BYTES, LARGE_READ_BYTES
from sandboxd.routes import builtin_table
from sandboxd.web.factory import SandboxSite
from sandboxd.web.messages import SSEResponse
from sandboxd.web.request import HeaderView
from sandboxd.web.sse import SSEChannel, _send_now
from tests.helpers import DaemonTestCase


def make_site(
    policy: Any = None, environ: dict[str, str] | None = None
) -> tuple[SandboxSite, MemoryReactorClock, list[Any]]:
    """A site on a memory reactor with one extra streaming route."""
    reactor = MemoryReactorClock()
    table = builtin_table()
    channels: list[Any] = []

    @table.route(
        "GET", "/events", group=CapabilityGroup.COMMANDS, streaming=True, name="events"
    )
    def events(request: Any) -> SSEResponse:
        def start(channel: Any) -> None:
            channels.append(channel)
            channel.send("hello", {"n": 1}, id=1)

        return SSEResponse(start=start)

    context = Context(
        reactor=reactor,
        table=table,
        policy=load_policy(
            table, explicit=policy or {}, base_dir="/tmp", environ=environ or {}
        ),
        registry=CommandRegistry(),
        audit=AuditLog(),
    )
    return SandboxSite(context, reactor=reactor), reactor, channels


def connect(site: SandboxSite) -> tuple[Any, StringTransport]:
    protocol = site.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    return protocol, transport


class BodyCapTests(SynchronousTestCase):
    """The body cap acts as bytes arrive, never after buffering them."""

    def test_declared_length_refused_before_body(self) -> None:
        """Content-Length over max_request_bytes: 413 and close, with no body byte read."""
        site, _, _ = make_site()
        protocol, transport = connect(site)
        protocol.dataReceived(
            b"POST /capabilities/check HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Length: 300000000\r\n\r\n"
        )
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 413 "))
        self.assertTrue(transport.disconnecting)
        body = transport.value().split(b"\r\n\r\n", 1)[1]
        self.assertEqual(json.loads(body)["code"], "payload_too_large")

    def test_policy_cap(self) -> None:
        """A policy's max_request_bytes is the cap."""
        site, _, _ = make_site(
            {"endpoints": {"capabilities_check": {"limits": {"max_request_bytes": 10}}}}
        )
        protocol, transport = connect(site)
        protocol.dataReceived(
            b"POST /capabilities/check HTTP/1.1\r\nHost: localhost\r\nContent-Length: 11\r\n\r\n"
        )
        self.assertIn(b" 413 ", transport.value())

    def test_small_body_parsed(self) -> None:
        """A body under the cap reaches the handler as JSON, in pieces or whole."""
        site, _, _ = make_site()
        protocol, transport = connect(site)
        body = json.dumps({"endpoint": "health"}).encode()
        protocol.dataReceived(
            b"POST /capabilities/check HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        for i in range(len(body)):
            protocol.dataReceived(body[i : i + 1])
        self.assertIn(b"HTTP/1.1 200 OK", transport.value())
        self.assertIn(b'"allowed":true', transport.value())

    def test_refused_before_body_when_unauthenticated(self) -> None:
        """With a token, an unauthenticated 1 MB upload is answered at the headers."""
        site, _, _ = make_site(environ={"ABX_SERVER_TOKEN": "t"})
        protocol, transport = connect(site)
        protocol.dataReceived(
            b"POST /capabilities/check HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
        )
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 401 "))
        self.assertTrue(transport.disconnecting)


class TCPLikeTransport(StringTransport):
    """A StringTransport with ``tcp.Connection``'s read size."""

    bufferSize = 65536


class ReadSizeTests(SynchronousTestCase):
    """A large body is read in large pieces; the connection then reads as before."""

    def test_large_body_widens_reads_until_answered(self) -> None:
        site, _, _ = make_site(
            {
                "endpoints": {
                    "capabilities_check": {"limits": {"max_request_bytes": "8MiB"}}
                }
            }
        )
        protocol = site.buildProtocol(None)
        transport = TCPLikeTransport()
        protocol.makeConnection(transport)
        doc = json.dumps({"endpoint": "health"}).encode()
        body = doc + b" " * (LARGE_BODY_BYTES + 1 - len(doc))
        protocol.dataReceived(
            b"POST /capabilities/check HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        self.assertEqual(transport.bufferSize, LARGE_READ_BYTES)
        protocol.dataReceived(body)
        self.assertIn(b"HTTP/1.1 200 OK", transport.value())
        self.assertEqual(transport.bufferSize, 65536)
        self.assertNotIn("bufferSize", vars(transport))

    def test_small_body_keeps_reads(self) -> None:
        site, _, _ = make_site()
        protocol = site.buildProtocol(None)
        transport = TCPLikeTransport()
        protocol.makeConnection(transport)
        body = json.dumps({"endpoint": "health"}).encode()
        protocol.dataReceived(
            b"POST /capabilities/check HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        self.assertNotIn("bufferSize", vars(transport))
        protocol.dataReceived(body)
        self.assertIn(b"HTTP/1.1 200 OK", transport.value())


class SSETests(SynchronousTestCase):
    """SSE framing, heartbeats and disconnects on a memory reactor."""

    def test_frames_and_heartbeat(self) -> None:
        """Events are written as they happen; 4 s of silence sends a keep-alive comment."""
        site, clock, channels = make_site()
        protocol, transport = connect(site)
        protocol.dataReceived(b"GET /events HTTP/1.1\r\nHost: localhost\r\n\r\n")
        out = transport.value()
        self.assertIn(b"text/event-stream", out)
        self.assertIn(b'id: 1\nevent: hello\ndata: {"n":1}\n\n', out)
        transport.clear()
        clock.advance(15)
        self.assertIn(b": keep-alive\n\n", transport.value())
        channels[0].close()
        self.assertTrue(channels[0].done.called)

    def test_disconnect_runs_callbacks_and_frees_slot(self) -> None:
        """A client that leaves fires on_disconnect and frees its concurrency slot."""
        site, clock, channels = make_site(
            {"endpoints": {"events": {"limits": {"max_concurrency": 1}}}}
        )
        protocol, _ = connect(site)
        protocol.dataReceived(b"GET /events HTTP/1.1\r\nHost: localhost\r\n\r\n")
        gone: list[bool] = []
        channels[0].on_disconnect(lambda: gone.append(True))
        self.assertEqual(site.context.concurrency.in_flight("events"), 1)
        from twisted.internet.error import ConnectionLost
        from twisted.python.failure import Failure

        protocol.connectionLost(Failure(ConnectionLost()))
        self.assertEqual(gone, [True])
        self.assertEqual(site.context.concurrency.in_flight("events"), 0)
        clock.advance(30)
        self.assertFalse(channels[0].open)


class ConnectionBoundTests(SynchronousTestCase):
    """Caps on connections and on slow headers, on a memory reactor."""

    def test_header_deadline(self) -> None:
        """A request line whose headers never finish is cut off after the deadline."""
        from sandboxd.policy.defaults import HEADER_DEADLINE_SECONDS

        site, clock, _ = make_site()
        site.startFactory()
        self.addCleanup(site.stopFactory)
        protocol, transport = connect(site)
        protocol.dataReceived(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: a")
        for _ in range(int(HEADER_DEADLINE_SECONDS) + 12):
            protocol.dataReceived(
                b"a"
            )  # a byte now and then keeps the idle timer quiet
            clock.advance(1)
        self.assertTrue(transport.disconnecting or transport.disconnected)

    def test_complete_requests_are_not_cut(self) -> None:
        """A kept-alive connection between requests is left to the idle timeout."""
        site, clock, _ = make_site()
        site.startFactory()
        self.addCleanup(site.stopFactory)
        protocol, transport = connect(site)
        protocol.dataReceived(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        clock.advance(40)
        self.assertFalse(transport.disconnecting)

    def test_per_peer_cap(self) -> None:
        """Past the per-address cap new connections are closed at once."""
        from twisted.internet.address import IPv4Address

        from sandboxd.policy.defaults import MAX_CONNECTIONS_PER_PEER

        site, _, _ = make_site()
        transports = []
        for _ in range(MAX_CONNECTIONS_PER_PEER + 1):
            protocol = site.buildProtocol(None)
            transport = StringTransport(
                peerAddress=IPv4Address("TCP", "10.0.0.9", 1234)
            )
            transport.abortConnection = transport.loseConnection  # type: ignore[method-assign]
            protocol.makeConnection(transport)
            transports.append(transport)
        self.assertFalse(transports[0].disconnecting)
        self.assertTrue(transports[-1].disconnecting)
        self.assertEqual(site.per_peer["10.0.0.9"], MAX_CONNECTIONS_PER_PEER)


@inlineCallbacks
def _loopback_pair(case: TestCase) -> Any:
    """A server transport and the plain socket of its client, closed at the end of ``case``."""
    connected: Deferred[Any] = Deferred()

    class Server(Protocol):
        def connectionMade(self) -> None:
            connected.callback(self.transport)

    port = reactor.listenTCP(0, Factory.forProtocol(Server), interface="127.0.0.1")
    case.addCleanup(port.stopListening)
    client = socket.create_connection(("127.0.0.1", port.getHost().port))
    case.addCleanup(client.close)
    transport = yield connected
    case.addCleanup(transport.loseConnection)
    return transport, client


class FirstEventTests(TestCase):
    """The first bytes of a stream leave at once, not on the reactor's next turn."""

    @inlineCallbacks
    def test_send_now_puts_bytes_on_the_socket(self) -> Any:
        """After _send_now, a client reading without letting the reactor run already has the bytes."""
        transport, client = yield _loopback_pair(self)
        request = SimpleNamespace(channel=SimpleNamespace(transport=transport))
        transport.write(b"event: stdout\ndata: {}\n\n")
        client.setblocking(False)
        with self.assertRaises(BlockingIOError):
            client.recv(100)  # Twisted alone sends on its next turn
        _send_now(request)  # type: ignore[arg-type]
        client.settimeout(1)
        self.assertEqual(client.recv(100), b"event: stdout\ndata: {}\n\n")


class _FakeStreamRequest:
    """Just what an SSEChannel uses of a request, writing to a real transport."""

    def __init__(self, transport: Any) -> None:
        self.channel = SimpleNamespace(transport=transport)

    def setResponseCode(self, code: int) -> None:
        pass

    def setHeader(self, name: Any, value: Any) -> None:
        pass

    def notifyFinish(self) -> Deferred[None]:
        return Deferred()

    def write(self, data: bytes) -> None:
        if data:
            self.channel.transport.write(data)


class EveryEventTests(TestCase):
    """Every event of a stream leaves at once, not only the first."""

    @inlineCallbacks
    def test_later_events_on_the_socket_at_once(self) -> Any:
        """
        A client reading without letting the reactor run has each event as
        soon as the stream wrote it: the second and third too.
        """
        transport, client = yield _loopback_pair(self)
        channel = SSEChannel(
            _FakeStreamRequest(transport),  # type: ignore[arg-type]
            MemoryReactorClock(),
        )
        client.settimeout(1)
        for n in (1, 2, 3):
            channel.send("stdout", {"data": str(n)})
            expected = f'event: stdout\ndata: {{"data":"{n}"}}\n\n'.encode()
            self.assertEqual(client.recv(100), expected)


class _ChunkedStreamRequest(_FakeStreamRequest):
    """A started chunked response (HTTP/1.1, no length), as Twisted's is after its head."""

    chunked = True
    startedWriting = True
    finished = False
    _disconnected = False
    sentLength = 0

    def write(self, data: bytes) -> None:
        self.sentLength += len(data)
        if data:
            self.channel.transport.writeSequence(toChunk(data))


class DirectEventTests(TestCase):
    """A chunked stream's events go to the socket in the call that wrote them."""

    @inlineCallbacks
    def test_events_sent_without_the_reactor_watching(self) -> Any:
        """
        Each event reaches the client as one chunk of the response, in the
        call that wrote it, and the reactor is never asked to watch the
        socket for it (then to stop again): two ``epoll_ctl`` calls per
        event, hundreds of times a second with many streams.
        """
        transport, client = yield _loopback_pair(self)
        watched: list[bool] = []
        start_writing = transport.startWriting

        def watching() -> None:
            watched.append(True)
            start_writing()

        self.patch(transport, "startWriting", watching)
        request = _ChunkedStreamRequest(transport)
        channel = SSEChannel(
            request,  # type: ignore[arg-type]
            MemoryReactorClock(),
        )
        client.settimeout(1)
        sent = 0
        for n in (1, 2):
            channel.send("stdout", {"data": str(n)})
            frame = f'event: stdout\ndata: {{"data":"{n}"}}\n\n'.encode()
            self.assertEqual(client.recv(100), b"".join(toChunk(frame)))
            sent += len(frame)
        channel.write_raw(b": keep-alive\n\n")
        self.assertEqual(client.recv(100), b"".join(toChunk(b": keep-alive\n\n")))
        self.assertEqual(watched, [])
        self.assertEqual(request.sentLength, sent + len(b": keep-alive\n\n"))


class ResponseHeaderTests(SynchronousTestCase):
    """A handler's response headers, constant or not, as the client gets them."""

    def test_constant_and_other_headers(self) -> None:
        """
        A constant header is stored as Twisted would store it, each request
        with its own list; any other still goes through Twisted's checks (a
        line break in a value never starts a header of its own).
        """
        from twisted.web.test.requesthelper import DummyRequest

        from sandboxd.web.dispatch import set_headers

        first, second = DummyRequest([b""]), DummyRequest([b""])
        for request in (first, second):
            set_headers(
                request,  # type: ignore[arg-type]
                {"content-type": "application/json", "X-Other": "one"},
            )
        first.responseHeaders.addRawHeader(b"content-type", b"text/plain")
        self.assertEqual(
            second.responseHeaders.getRawHeaders(b"content-type"),
            [b"application/json"],
        )
        self.assertEqual(second.responseHeaders.getRawHeaders(b"x-other"), [b"one"])
        set_headers(second, {"X-Bad": "a\r\nInjected: yes"})  # type: ignore[arg-type]
        self.assertEqual(
            second.responseHeaders.getRawHeaders(b"x-bad"), [b"a Injected: yes"]
        )


class HeaderViewTests(SynchronousTestCase):
    """What a handler reads from ``ServerRequest.headers``."""

    FIELDS = {
        b"host": [b"127.0.0.1:8080"],
        b"x-twice": [b"first", b"second"],
        b"x-latin": [b"caf\xe9"],
    }

    def test_reads_like_the_decoded_dict(self) -> None:
        """
        Lower-cased names, the last value of a repeated header, Latin-1
        decoded: the same mapping handlers were given as a decoded dict.
        """
        view = HeaderView(self.FIELDS)
        self.assertEqual(
            dict(view),
            {"host": "127.0.0.1:8080", "x-twice": "second", "x-latin": "café"},
        )
        self.assertEqual(view["x-twice"], "second")
        self.assertEqual(view.get("x-latin"), "café")
        self.assertEqual(len(view), 3)
        self.assertIn("host", view)

    def test_missing_names(self) -> None:
        """
        A name not sent, a name in another case, a name Latin-1 cannot
        carry and a name that is not a string are all absent, not errors.
        """
        view = HeaderView(self.FIELDS)
        self.assertIsNone(view.get("idempotency-key"))
        self.assertIsNone(view.get("Host"))
        self.assertEqual(view.get("x-\u2603", "none"), "none")
        self.assertNotIn("Host", view)
        self.assertNotIn(b"host", view)
        self.assertRaises(KeyError, lambda: view["x-\u2603"])

    def test_decodes_only_what_is_read(self) -> None:
        """A value nobody reads is never decoded (the view keeps the raw bytes)."""
        decoded: list[bytes] = []

        class Counting(bytes):
            def decode(self, *args: Any, **kw: Any) -> str:
                decoded.append(bytes(self))
                return super().decode(*args, **kw)

        view = HeaderView({b"a": [Counting(b"1")], b"b": [Counting(b"2")]})
        self.assertEqual(view.get("b"), "2")
        self.assertEqual(decoded, [b"2"])


def _follow_then_leave(port: int, path: str, until: bytes, then: Any = None) -> bytes:
    """
    GET the stream at ``path``, read until ``until`` has come (calling
    ``then`` once its head is in), and close: a client ending a followed
    stream the only way there is (blocking: run it in a thread).
    """
    with socket.create_connection(("127.0.0.1", port), 10) as s:
        s.settimeout(10)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        got = s.recv(65536)
        if then is not None:
            then()
        while until not in got:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


class StreamLeftAuditTests(DaemonTestCase):
    """
    A followed stream its client closes after its answer and data came is
    audited as the call it was, allowed and answered 200, not as a refusal.
    """

    audit = True
    policy = {"defaults": {"audit": "all"}}

    @inlineCallbacks
    def leave_a_watch_and_an_output(self) -> Any:
        """Close a files watch after one change, and a followed output after data."""
        os.mkdir(os.path.join(self.base_dir, "w"))

        def touch() -> None:
            time.sleep(0.2)
            with open(os.path.join(self.base_dir, "w", "a.txt"), "w"):
                pass

        got = yield deferToThread(
            _follow_then_leave,
            self.daemon.port,
            "/files/watch?path=w&follow=true",
            b"event: created",
            touch,
        )
        self.assertIn(b"200 OK", got)
        self.assertIn(b"event: created", got)
        started = yield self.request(
            "POST", "/process/start", {"command": "sh -c 'echo one; sleep 30'"}
        )
        pid = started.json()["pid"]
        got = yield deferToThread(
            _follow_then_leave,
            self.daemon.port,
            f"/process/{pid}/output?follow=true",
            b"one",
        )
        self.assertIn(b"event: stdout", got)
        # The daemon hears the close a moment later: the command is ended
        # after, or its stream would have ended with it.
        yield deferLater(reactor, 0.5, lambda: None)
        yield self.request("POST", f"/process/{pid}/kill", {})

    @inlineCallbacks
    def test_audited_as_allowed_with_the_status_sent(self) -> Any:
        """
        With ``audit: all``, each line keeps the 200 sent, decision
        ``allow``, its bytes out, and ``client_left``: not 499.
        """
        yield self.leave_a_watch_and_an_output()
        lines = [
            r
            for r in self.audit_lines()
            if r["endpoint"] in ("files_watch", "process_output")
        ]
        self.assertEqual(
            [
                (r["endpoint"], r["status"], r["decision"], r["code"], r["client_left"])
                for r in lines
            ],
            [
                ("files_watch", 200, "allow", None, True),
                ("process_output", 200, "allow", None, True),
            ],
        )
        self.assertTrue(all(r["bytes_out"] > 0 for r in lines), lines)


class StreamLeftDenyAuditTests(StreamLeftAuditTests):
    """With the default ``audit: deny``, a stream its client closed is no line."""

    policy = None

    @inlineCallbacks
    def test_audited_as_allowed_with_the_status_sent(self) -> Any:
        """No refusal happened: the deny-only audit has nothing to say."""
        yield self.leave_a_watch_and_an_output()
        self.assertEqual(
            [
                r
                for r in self.audit_lines()
                if r["endpoint"] in ("files_watch", "process_output")
            ],
            [],
        )
