"""
The gRPC door's HTTP/2 edge cases, in memory: an ``h2`` client connection
against the server protocol over a StringTransport, time on a test clock.
"""

from __future__ import annotations

from typing import Any

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    ResponseReceived,
    StreamReset,
    TrailersReceived,
)
from h2.settings import SettingCodes
from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.kep.grpc import (
    Call,
    GrpcFactory,
    Method,
    Status,
    parse_timeout,
    percent_encode,
)
from sandboxd.policy.defaults import HEADER_DEADLINE_SECONDS
from sandboxd.proto3 import Kind, encode, field, message

ECHO = message("test.Echo", field(1, "text", Kind.STRING), field(2, "n", Kind.INT32))
ADDRESS = IPv4Address("TCP", "127.0.0.1", 40000)


def framed(value: dict[str, Any]) -> bytes:
    payload = encode(ECHO, value)
    return b"\0" + len(payload).to_bytes(4, "big") + payload


class Harness:
    """One client connection to a factory, pumped by hand."""

    def __init__(
        self, factory: GrpcFactory, window: int | None = None, validate: bool = True
    ) -> None:
        self.factory = factory
        protocol = factory.buildProtocol(ADDRESS)
        assert protocol is not None
        self.server = protocol
        self.transport = StringTransport(peerAddress=ADDRESS)
        self.client = H2Connection(
            H2Configuration(
                client_side=True,
                header_encoding=None,
                validate_outbound_headers=validate,
                normalize_outbound_headers=validate,
            )
        )
        self.client.initiate_connection()
        if window is not None:
            self.client.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.events: list[Event] = []
        protocol.makeConnection(self.transport)
        self.pump()

    def pump(self) -> list[Event]:
        for _ in range(10):
            out = self.client.data_to_send()
            if out:
                self.server.dataReceived(out)
            back = self.transport.value()
            self.transport.clear()
            if not out and not back:
                break
            if back:
                self.events.extend(self.client.receive_data(back))
        return self.events

    def request(
        self,
        path: str = "/t/Echo",
        body: bytes | None = None,
        end: bool = True,
        headers: list[tuple[bytes, bytes]] | None = None,
        content_type: bytes = b"application/grpc",
        verb: bytes = b"POST",
    ) -> int:
        stream_id = self.client.get_next_available_stream_id()
        self.client.send_headers(
            stream_id,
            [
                (b":method", verb),
                (b":scheme", b"http"),
                (b":path", path.encode()),
                (b":authority", b"localhost"),
                (b"content-type", content_type),
                (b"te", b"trailers"),
                *(headers or []),
            ],
            end_stream=body is None and end,
        )
        if body is not None:
            self.client.send_data(stream_id, body, end_stream=end)
        self.pump()
        return stream_id

    def response(self, stream_id: int) -> dict[bytes, bytes]:
        fields: dict[bytes, bytes] = {}
        for event in self.events:
            if isinstance(event, ResponseReceived | TrailersReceived):
                if event.stream_id == stream_id:
                    fields.update(dict(event.headers or []))
        return fields

    def data(self, stream_id: int) -> bytes:
        return b"".join(
            e.data or b""
            for e in self.events
            if isinstance(e, DataReceived) and e.stream_id == stream_id
        )


class Recorder:
    """Test handlers and what they saw."""

    def __init__(self) -> None:
        self.ended: list[str] = []
        self.calls: list[Call] = []
        self.pending: defer.Deferred[None] | None = None

    def methods(self) -> dict[str, Method]:
        table = [
            Method("/t/Echo", ECHO, ECHO, False, lambda call, request: request),
            Method("/t/Big", ECHO, ECHO, True, self.big),
            Method("/t/Hang", ECHO, ECHO, False, self.hang),
        ]
        return {m.path: m for m in table}

    def big(self, call: Call, request: dict[str, Any]) -> defer.Deferred[None]:
        self.calls.append(call)
        call.on_end(self.ended.append)
        call.send({"text": "x" * 1000})
        self.pending = defer.Deferred()
        return self.pending

    def hang(self, call: Call, request: dict[str, Any]) -> defer.Deferred[None]:
        self.calls.append(call)
        call.on_end(self.ended.append)
        return defer.Deferred()


class H2Tests(SynchronousTestCase):
    """What a client sees on the wire in the corner cases."""

    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        self.recorder = Recorder()
        self.factory = GrpcFactory(
            self.clock, self.recorder.methods(), max_connections=2, idle_timeout=30.0
        )

    def test_echo(self) -> None:
        """The plain path: headers, one message, trailers with grpc-status 0."""
        h = Harness(self.factory)
        stream = h.request(body=framed({"text": "hi", "n": 2}))
        self.assertEqual(h.response(stream)[b":status"], b"200")
        self.assertEqual(h.response(stream)[b"grpc-status"], b"0")
        self.assertEqual(h.data(stream), framed({"text": "hi", "n": 2}))

    def test_not_grpc(self) -> None:
        """Content-type, method and grpc-timeout errors are answered as grpc-go does."""
        h = Harness(self.factory)
        cases = [
            ({"content_type": b"application/json"}, b"415", Status.INVALID_ARGUMENT),
            ({"verb": b"GET"}, b"405", Status.INTERNAL),
            ({"headers": [(b"grpc-timeout", b"123456789S")]}, b"400", Status.INTERNAL),
            ({"headers": [(b"grpc-timeout", b"1x")]}, b"400", Status.INTERNAL),
            ({"path": "/t/Nope"}, b"200", Status.UNIMPLEMENTED),
        ]
        for kwargs, http, status in cases:
            stream = h.request(body=framed({}), **kwargs)
            fields = h.response(stream)
            self.assertEqual(fields[b":status"], http, kwargs)
            self.assertEqual(fields[b"grpc-status"], b"%d" % status, kwargs)
        self.assertFalse(h.transport.disconnecting)

    def test_a_malformed_head_fails_its_call_only(self) -> None:
        """
        A request head HTTP/2 calls malformed (a NUL in a value, an
        upper-case name, a connection header) is INVALID_ARGUMENT on its
        own stream, without the value in the message; a value's
        surrounding spaces are dropped rather than refused.  The
        connection and a call running on it go on.
        """
        h = Harness(self.factory, validate=False)
        running = h.request("/t/Hang", body=framed({}))
        for bad in (
            [(b"x-tag", b"secret\x00")],
            [(b"X-Tag", b"a")],
            [(b"connection", b"close")],
        ):
            stream = h.request(body=framed({"text": "hi"}), headers=bad)
            fields = h.response(stream)
            self.assertEqual(
                fields[b"grpc-status"], b"%d" % Status.INVALID_ARGUMENT, bad
            )
            self.assertIn(b"malformed request headers", fields[b"grpc-message"])
            self.assertNotIn(b"secret", fields[b"grpc-message"])
        spaced = h.request(body=framed({"text": "hi"}), headers=[(b"x-tag", b" abc ")])
        self.assertEqual(h.response(spaced)[b"grpc-status"], b"0")
        self.assertEqual(h.data(spaced), framed({"text": "hi"}))
        self.assertFalse(h.transport.disconnecting)
        self.assertFalse(
            any(isinstance(e, ConnectionTerminated) for e in h.events), h.events
        )
        self.assertEqual(self.recorder.ended, [])
        self.assertNotIn(b"grpc-status", h.response(running))

    def test_more_than_one_message(self) -> None:
        """Two request messages on a unary call: INVALID_ARGUMENT, handler not run."""
        h = Harness(self.factory)
        stream = h.request(body=framed({"n": 1}) + framed({"n": 2}))
        self.assertEqual(h.response(stream)[b"grpc-status"], b"3")
        self.assertIn(b"more than one", h.response(stream)[b"grpc-message"])

    def test_no_message(self) -> None:
        """A request with no message at all is INVALID_ARGUMENT."""
        h = Harness(self.factory)
        stream = h.request()
        self.assertEqual(h.response(stream)[b"grpc-status"], b"3")

    def test_oversize_refused_from_the_prefix(self) -> None:
        """The prefix alone announcing too much: refused, the stream reset."""
        h = Harness(self.factory)
        prefix = b"\0" + (5 * 1024 * 1024).to_bytes(4, "big")
        stream = h.request(body=prefix, end=False)
        self.assertEqual(h.response(stream)[b"grpc-status"], b"8")
        self.assertTrue(any(isinstance(e, StreamReset) for e in h.events))

    def test_window_exhaustion_and_reset(self) -> None:
        """A 100-byte window: 100 bytes sent, the rest queued; a reset drops it."""
        h = Harness(self.factory, window=100)
        stream = h.request("/t/Big", body=framed({}))
        self.assertEqual(len(h.data(stream)), 100)
        (call,) = self.recorder.calls
        self.assertEqual(call._pending_bytes, 1008 - 100)
        h.client.increment_flow_control_window(200, stream_id=stream)
        h.pump()
        self.assertEqual(len(h.data(stream)), 300)
        h.client.reset_stream(stream)
        h.pump()
        self.assertEqual(self.recorder.ended, ["cancelled"])
        self.assertTrue(call.cancelled)
        self.assertEqual(call._pending_bytes, 0)
        call.send({"text": "after"})
        assert self.recorder.pending is not None
        self.recorder.pending.callback(None)
        h.pump()
        self.assertEqual(len(h.data(stream)), 300)

    def test_trailers_wait_for_data(self) -> None:
        """finish() with data queued: the trailers follow once the window opens."""
        h = Harness(self.factory, window=100)
        stream = h.request("/t/Big", body=framed({}))
        assert self.recorder.pending is not None
        self.recorder.pending.callback(None)
        h.pump()
        self.assertNotIn(b"grpc-status", h.response(stream))
        h.client.increment_flow_control_window(2000, stream_id=stream)
        h.pump()
        self.assertEqual(len(h.data(stream)), 1008)
        self.assertEqual(h.response(stream)[b"grpc-status"], b"0")

    def test_deadline(self) -> None:
        """grpc-timeout on the clock: DEADLINE_EXCEEDED and on_end('deadline')."""
        h = Harness(self.factory)
        stream = h.request(
            "/t/Hang", body=framed({}), headers=[(b"grpc-timeout", b"2S")]
        )
        self.clock.advance(1.9)
        self.assertEqual(self.recorder.ended, [])
        self.clock.advance(0.2)
        h.pump()
        self.assertEqual(self.recorder.ended, ["deadline"])
        self.assertEqual(h.response(stream)[b"grpc-status"], b"4")

    def test_connection_lost(self) -> None:
        """A lost connection cancels its calls."""
        h = Harness(self.factory)
        h.request("/t/Hang", body=framed({}))
        h.server.connectionLost()
        self.assertEqual(self.recorder.ended, ["cancelled"])
        self.assertEqual(self.factory.connections, set())

    def test_http11_client(self) -> None:
        """An HTTP/1.1 request: the connection is closed, nothing logged as an error."""
        protocol = self.factory.buildProtocol(ADDRESS)
        assert protocol is not None
        transport = StringTransport(peerAddress=ADDRESS)
        protocol.makeConnection(transport)
        protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_connection_cap(self) -> None:
        """
        At max_connections a new connection closes the one idle the longest;
        when every connection has a call open, buildProtocol gives None
        (Twisted closes it).
        """
        first = Harness(self.factory)
        self.clock.advance(1)
        second = Harness(self.factory)
        third = Harness(self.factory)
        self.assertTrue(first.transport.disconnecting)
        self.assertFalse(second.transport.disconnecting)
        second.request("/t/Hang", body=framed({}))
        third.request("/t/Hang", body=framed({}))
        self.assertIsNone(self.factory.buildProtocol(ADDRESS))
        self.assertFalse(second.transport.disconnecting)

    def test_preface_deadline(self) -> None:
        """A client that connects and says nothing is closed at the head deadline."""
        self.factory = GrpcFactory(
            self.clock,
            self.recorder.methods(),
            idle_timeout=HEADER_DEADLINE_SECONDS * 10,
        )
        protocol = self.factory.buildProtocol(ADDRESS)
        assert protocol is not None
        transport = StringTransport(peerAddress=ADDRESS)
        protocol.makeConnection(transport)
        self.clock.advance(HEADER_DEADLINE_SECONDS + 1)
        self.assertTrue(transport.disconnecting)
        spoken = Harness(self.factory)
        spoken.request("/t/Hang", body=framed({}))
        self.clock.advance(HEADER_DEADLINE_SECONDS + 1)
        self.assertFalse(spoken.transport.disconnecting)

    def test_idle_timeout(self) -> None:
        """No stream for idle_timeout: GOAWAY and close; a running call keeps it open."""
        h = Harness(self.factory)
        h.request("/t/Hang", body=framed({}))
        self.clock.advance(31)
        self.assertFalse(h.transport.disconnecting)
        h.client.reset_stream(1)
        h.pump()
        self.clock.advance(29)
        self.assertFalse(h.transport.disconnecting)
        self.clock.advance(2)
        h.pump()
        self.assertTrue(h.transport.disconnecting)
        self.assertTrue(any(isinstance(e, ConnectionTerminated) for e in h.events))

    def test_stop(self) -> None:
        """stop(): GOAWAY at once naming the last stream; running calls cancelled after the grace."""
        h = Harness(self.factory)
        h.request("/t/Hang", body=framed({}))
        stopped = self.factory.stop(5.0)
        h.pump()
        (goaway,) = [e for e in h.events if isinstance(e, ConnectionTerminated)]
        self.assertEqual(goaway.last_stream_id, 1)
        self.assertNoResult(stopped)
        self.clock.advance(5)
        self.assertTrue(h.transport.disconnecting)
        h.server.connectionLost()
        self.assertEqual(self.recorder.ended, ["cancelled"])
        self.successResultOf(stopped)
        self.assertIsNone(self.factory.buildProtocol(ADDRESS))


class HelpersTests(SynchronousTestCase):
    """grpc-timeout and grpc-message, per the gRPC HTTP/2 spec."""

    def test_parse_timeout(self) -> None:
        """Every unit; at most eight digits."""
        self.assertEqual(parse_timeout(b"2H"), 7200.0)
        self.assertEqual(parse_timeout(b"3M"), 180.0)
        self.assertEqual(parse_timeout(b"99999999S"), 99999999.0)
        self.assertAlmostEqual(parse_timeout(b"300m"), 0.3)
        self.assertAlmostEqual(parse_timeout(b"5u"), 5e-6)
        self.assertAlmostEqual(parse_timeout(b"7n"), 7e-9)
        for bad in (b"123456789S", b"1", b"S", b"-1S", b"1.5S", b"1s"):
            self.assertRaises(ValueError, parse_timeout, bad)

    def test_percent_encode(self) -> None:
        """Printable ASCII but % kept; the rest as %XX of the UTF-8 bytes."""
        self.assertEqual(percent_encode("a b%c\né"), "a b%25c%0A%C3%A9")
