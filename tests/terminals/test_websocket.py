"""
The PTY WebSocket protocol in memory (SPEC §8): autobahn server and client
over iosim transports, a fake terminal behind the session, a test clock,
and every autobahn timer off.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet.task import Clock
from twisted.test.iosim import FakeTransport, IOPump, connect
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access.metrics import Metrics
from sandboxd.access.tracing import Tracer, TraceSettings
from sandboxd.policy import load_policy
from sandboxd.routes import default_table
from sandboxd.terminals.session import PtySession
from sandboxd.terminals.table import TerminalTable
from sandboxd.terminals.websocket import SLOW_CLIENT, PtyServerFactory
from tests.terminals.test_session import FakePTY


class Recorder(WebSocketClientProtocol):
    """A client that keeps what it receives and how it was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[dict[str, Any]] = []
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.open = False

    def onOpen(self) -> None:
        self.open = True

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.received.append(json.loads(payload))

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.close_code, self.close_reason = code, reason

    def send_json(self, message: Any) -> None:
        self.sendMessage(json.dumps(message).encode(), isBinary=False)


class RecordingSession(PtySession):
    """A session whose signals are recorded, never sent (its pid is made up)."""

    sent: list[Any]

    def send_signal(self, name: str) -> bool:
        self.sent.append(name)
        return True


class ProtocolCase(SynchronousTestCase):
    """One session ``s1`` on a fake terminal, and a way to connect to it."""

    def setUp(self) -> None:
        self.clock = Clock()
        policy = load_policy(default_table(), explicit={}, base_dir="/tmp", environ={})
        context = SimpleNamespace(
            policy=policy,
            hostname="sandbox",
            reactor=self.clock,
            table=default_table(),
            metrics=Metrics(),
            tracer=Tracer(TraceSettings()),
        )
        self.table = TerminalTable(self.clock)
        self.session = RecordingSession(
            id="s1",
            owner="anonymous",
            clock=self.clock,
            cols=80,
            rows=24,
            slow_client_seconds=10,
        )
        self.session.sent = []
        self.pty = FakePTY()
        self.session.started(self.pty)
        self.session.pid = 4242
        self.table.sessions["s1"] = self.session
        self.factory = PtyServerFactory(
            context,
            self.table,
            reactor=self.clock,
            timers=False,
            max_message_bytes=1024 * 1024,
        )

    def open(self, query: str = "session_id=s1") -> tuple[Recorder, Any, IOPump]:
        """Connect a client through the handshake; returns it, the server and the pump."""
        client_factory = WebSocketClientFactory(f"ws://127.0.0.1:9001/pty?{query}")
        client_factory.protocol = Recorder
        client_factory.setProtocolOptions(
            openHandshakeTimeout=0,
            closeHandshakeTimeout=0,
            serverConnectionDropTimeout=0,
            autoPingInterval=0,
        )
        server = self.factory.buildProtocol(None)
        client = client_factory.buildProtocol(None)
        pump = connect(
            server,
            FakeTransport(server, isServer=True),
            client,
            FakeTransport(client, isServer=False),
            clock=self.clock,
        )
        pump.flush()
        return client, server, pump


class MessageTests(ProtocolCase):
    """What a client sends and receives."""

    def test_started_then_output(self) -> None:
        """``started`` comes first, then output frames with offsets."""
        client, _, pump = self.open()
        self.session.output(b"hello")
        pump.flush()
        self.assertEqual(
            client.received,
            [
                {"type": "event", "event": "started", "session_id": "s1", "pid": 4242},
                {"type": "output", "data": "hello", "offset": 0, "end": 5},
            ],
        )

    def test_input_reaches_terminal(self) -> None:
        """An input message is written to the terminal as UTF-8."""
        client, _, pump = self.open()
        client.send_json({"type": "input", "data": "ls ✓\n"})
        pump.flush()
        self.assertEqual(self.pty.written, ["ls ✓\n".encode()])

    def test_dropped_frames(self) -> None:
        """Binary frames, invalid JSON, non-objects and malformed messages are
        dropped silently; the connection stays open."""
        client, _, pump = self.open()
        client.sendMessage(b"\x00binary", isBinary=True)
        client.sendMessage(b"{nope", isBinary=False)
        client.sendMessage(b'"just a string"', isBinary=False)
        client.send_json({"type": "input", "data": ["x"]})
        client.send_json({"type": "resize", "cols": 0, "rows": 10})
        client.send_json({"type": "signal", "signal": "SIGUSR1"})
        client.send_json({"type": "nonsense"})
        pump.flush()
        self.assertEqual(self.pty.written, [])
        self.assertIsNone(client.close_code)
        self.assertEqual((self.session.cols, self.session.rows), (80, 24))

    def test_signal_allowlist(self) -> None:
        """Only the five listed signals reach the terminal's foreground group."""
        client, _, pump = self.open()
        for name in ("SIGINT", "SIGUSR1", 9, "SIGQUIT"):
            client.send_json({"type": "signal", "signal": name})
        pump.flush()
        self.assertEqual(self.session.sent, ["SIGINT", "SIGUSR1", "SIGQUIT"])
        self.assertFalse(PtySession.send_signal(self.session, "SIGUSR1"))

    def test_oversize_message(self) -> None:
        """A message over the policy's cap (1 MiB) closes the socket with 1009."""
        client, _, pump = self.open()
        client.send_json({"type": "input", "data": "x" * (1024 * 1024)})
        pump.flush()
        self.assertEqual(client.close_code, 1009)
        self.assertEqual(self.session.clients, [])

    def test_fragmented_message(self) -> None:
        """A message split into many frames is reassembled."""
        client, _, pump = self.open()
        payload = json.dumps({"type": "input", "data": "abc" * 50}).encode()
        client.sendMessage(payload, isBinary=False, fragmentSize=7)
        pump.flush()
        self.assertEqual(self.pty.written, [b"abc" * 50])


class CloseTests(ProtocolCase):
    """Closes with the seed's codes and reasons."""

    def test_missing_session_id(self) -> None:
        """No session_id: 1008 "Missing session_id parameter"."""
        client, _, _ = self.open("other=1")
        self.assertEqual(
            (client.close_code, client.close_reason),
            (1008, "Missing session_id parameter"),
        )

    def test_unknown_session(self) -> None:
        """An unknown id: 1008 "Unknown session: ID"."""
        client, _, _ = self.open("session_id=zzz")
        self.assertEqual(
            (client.close_code, client.close_reason), (1008, "Unknown session: zzz")
        )

    def test_exit_closes_normally(self) -> None:
        """When the shell ends the client gets ``exited`` then a 1000 close."""
        from twisted.internet.error import ProcessTerminated
        from twisted.python.failure import Failure

        client, _, pump = self.open()
        self.session.shell_ended(Failure(ProcessTerminated(2)))
        pump.flush()
        self.assertEqual(client.received[-1]["event"], "exited")
        self.assertEqual(client.received[-1]["exit_code"], 2)
        self.assertEqual(client.close_code, 1000)

    def test_shutdown_going_away(self) -> None:
        """Daemon shutdown closes every client with 1001."""
        client, _, pump = self.open()
        self.factory.close_all()
        pump.flush()
        self.assertEqual(client.close_code, 1001)
        self.assertEqual(self.session.clients, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])


class SlowClientTests(ProtocolCase):
    """A client that never reads pauses the terminal, then is dropped."""

    def test_never_reading_client(self) -> None:
        """A full socket pauses the PTY for everyone; after the limit the
        client is dropped with its own close code and the PTY resumes."""
        slow, server, pump = self.open()
        fine, _, fine_pump = self.open()
        server.transport.producer.pauseProducing()  # its socket buffer is full
        self.assertTrue(self.pty.paused)
        self.clock.advance(10)
        pump.flush()
        fine_pump.flush()
        self.assertFalse(self.pty.paused)
        self.assertEqual(slow.close_code, SLOW_CLIENT)
        self.assertEqual(len(self.session.clients), 1)
        self.session.output(b"still flowing")
        fine_pump.flush()
        self.assertEqual(fine.received[-1]["data"], "still flowing")
        self.assertEqual(self.clock.getDelayedCalls(), [])


class HandshakeBoundsTests(ProtocolCase):
    """
    What a connection may hold before its handshake is read: a head
    bounded as the HTTP port's requests are, and a place that a silent
    socket gives up to a new client at a cap.
    """

    def silent(self, host: str) -> tuple[Any, FakeTransport]:
        """A connection from ``host`` that has sent nothing yet."""
        from twisted.internet.address import IPv4Address

        server = self.factory.buildProtocol(None)
        transport = FakeTransport(
            server, isServer=True, peerAddress=IPv4Address("TCP", host, 40000)
        )
        server.makeConnection(transport)
        return server, transport

    def answer(self, transport: FakeTransport) -> tuple[bytes, dict[str, Any]]:
        """The status line and JSON body the server wrote."""
        written = b"".join(transport.stream)
        head, _, body = written.partition(b"\r\n\r\n")
        return head, json.loads(body)

    def test_head_without_end_is_refused(self) -> None:
        """
        A handshake whose head never ends (one header growing without
        bound) is answered 400 ``malformed_request`` and closed once it is
        larger than the HTTP port's head may be, not buffered on.
        """
        server, transport = self.silent("10.0.0.1")
        server.dataReceived(b"GET /pty HTTP/1.1\r\nHost: sandbox\r\nX-Pad: ")
        for _ in range(4):
            server.dataReceived(b"a" * 8192)
        head, body = self.answer(transport)
        self.assertTrue(head.startswith(b"HTTP/1.1 400 "), head)
        self.assertEqual(body["code"], "malformed_request")
        self.assertIn("too large", body["error"])
        self.assertTrue(transport.disconnecting)
        server.dataReceived(b"a" * 8192)
        self.assertLess(len(server.data), 64 * 1024)

    def test_too_many_headers_are_refused(self) -> None:
        """More headers than the HTTP port takes: 400 ``malformed_request``."""
        server, transport = self.silent("10.0.0.1")
        lines = b"".join(b"X-%d: 1\r\n" % i for i in range(300))
        server.dataReceived(b"GET /pty HTTP/1.1\r\nHost: sandbox\r\n" + lines + b"\r\n")
        head, body = self.answer(transport)
        self.assertTrue(head.startswith(b"HTTP/1.1 400 "), head)
        self.assertEqual(body["code"], "malformed_request")

    def test_silent_sockets_make_room(self) -> None:
        """
        With the port's every place held by sockets that never sent a
        handshake, a client that comes later still attaches: the silent
        socket waiting longest is closed to make room.
        """
        from sandboxd.policy.defaults import PTY_MAX_CONNECTIONS

        held = [
            self.silent(f"10.0.{i // 200}.{i % 200}")
            for i in range(PTY_MAX_CONNECTIONS)
        ]
        self.clock.advance(2)
        client, _, _ = self.open()
        self.assertEqual(client.received[0]["event"], "started")
        self.assertTrue(held[0][1].disconnecting)
        self.assertFalse(held[1][1].disconnecting)

    def test_one_address_gets_a_share(self) -> None:
        """
        One address holds at most its share of the port; past it, a new
        connection from there is refused with 503 ``unavailable`` and a
        ``Retry-After`` (not ``malformed_request``), while another address
        is still let in.
        """
        from sandboxd.policy.defaults import PTY_MAX_CONNECTIONS_PER_ADDRESS

        for _ in range(PTY_MAX_CONNECTIONS_PER_ADDRESS):
            self.silent("10.0.0.1")
        _, refused = self.silent("10.0.0.1")
        head, body = self.answer(refused)
        self.assertTrue(head.startswith(b"HTTP/1.1 503 "), head)
        self.assertIn(b"Retry-After: 1", head)
        self.assertEqual(body["code"], "unavailable")
        _, other = self.silent("10.0.0.2")
        self.assertEqual(other.stream, [])
        self.assertFalse(other.disconnecting)
