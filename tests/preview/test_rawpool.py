"""
Requests without a body go to the app over raw pooled connections: what a
browser sees through the door when the app answers with each framing HTTP/1.1
allows, and when the app's connection can or cannot serve the next request.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.policy.defaults import PREVIEW_POOL_IDLE_SECONDS
from sandboxd.preview.rawpool import RawConnection, RawPool
from tests.preview.test_door import DoorCase

#: What the scripted app answers, by request path.
ANSWERS = {
    b"/length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"/chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    ),
    b"/both": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n"
    ),
    b"/hints": (
        b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    ),
    b"/close": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the close",
    b"/extra": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokSURPLUS",
    b"/garbage": b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
    b"/cookie": (
        b"HTTP/1.1 200 OK\r\nSet-Cookie: app=1; Path=/\r\n"
        b"Set-Cookie: sbx_p_1=stolen\r\nSet-Cookie: wide=1; Domain=localhost\r\n"
        b"Location: http://localhost:{port}/next\r\nContent-Length: 0\r\n\r\n"
    ),
}


class ScriptedConnection(Protocol):
    """Answers each request head from :data:`ANSWERS`; closes after ``/close``."""

    def connectionMade(self) -> None:
        self.factory.connections.append([])  # type: ignore[attr-defined]
        self.buffer = b""

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            method, path, _ = head.split(b"\r\n", 1)[0].split(b" ", 2)
            self.factory.connections[-1].append(path)  # type: ignore[attr-defined]
            self.factory.heads.append(head)  # type: ignore[attr-defined]
            answer = ANSWERS[path].replace(
                b"{port}",
                str(self.factory.port).encode(),  # type: ignore[attr-defined]
            )
            if method == b"HEAD":
                answer = answer.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
            assert self.transport is not None
            self.transport.write(answer)
            if path in (b"/close", b"/garbage"):
                self.transport.loseConnection()


class ScriptedApp(Factory):
    """The app: every connection it got, with the paths asked on each."""

    protocol = ScriptedConnection

    def __init__(self) -> None:
        self.connections: list[list[bytes]] = []
        self.heads: list[bytes] = []
        self.port = 0


class RawPoolTests(DoorCase):
    """Framings, interim answers, reuse and refusal of reuse."""

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        self.scripted = yield self.serve(ScriptedApp())

    def get(self, path: str, method: str = "GET") -> Any:
        return self.fetch(method, path, host=self.host(self.scripted.port))

    @inlineCallbacks
    def test_one_connection_serves_many_requests(self) -> None:
        """Sequential GETs reuse one connection to the app; each answer is whole."""
        for path in ("/length", "/chunked", "/hints", "/length"):
            response, body = yield self.get(path)
            self.assertEqual(response.code, 200, body)
        self.assertEqual(
            self.scripted.connections,
            [[b"/length", b"/chunked", b"/hints", b"/length"]],
        )

    @inlineCallbacks
    def test_framings(self) -> None:
        """
        Length, chunked, interim 103 then 200, read to the close, both
        framings at once (chunked wins, the length is dropped), and HEAD.
        """
        expected = {
            "/length": b"hello",
            "/chunked": b"hello world",
            "/hints": b"ok",
            "/close": b"until the close",
        }
        for path, want in expected.items():
            response, body = yield self.get(path)
            self.assertEqual((response.code, body), (200, want), path)
        response, body = yield self.get("/both")
        self.assertEqual((response.code, body), (200, b"hello"))
        self.assertIsNone(response.headers.getRawHeaders(b"content-length"))
        response, body = yield self.get("/length", method="HEAD")
        self.assertEqual((response.code, body), (200, b""))
        self.assertEqual(response.headers.getRawHeaders(b"content-length"), [b"5"])

    @inlineCallbacks
    def test_no_reuse_after_close_or_surplus(self) -> None:
        """A connection the app closes, or that carried bytes past its answer, is not reused."""
        for path in ("/close", "/length", "/extra", "/length"):
            response, body = yield self.get(path)
            self.assertEqual(response.code, 200, body)
        self.assertEqual(
            self.scripted.connections,
            [[b"/close"], [b"/length", b"/extra"], [b"/length"]],
        )

    @inlineCallbacks
    def test_not_http_is_502(self) -> None:
        """An app that answers something other than HTTP: 502 ``upstream_unavailable``."""
        response, body = yield self.get("/garbage")
        self.assertEqual(
            (response.code, json.loads(body)["code"]), (502, "upstream_unavailable")
        )

    @inlineCallbacks
    def test_header_rules_hold(self) -> None:
        """Our token never reaches the app; our cookie and wider cookies are dropped; Location is rewritten."""
        response, _ = yield self.get("/cookie")
        self.assertEqual(response.code, 200)
        self.assertEqual(
            response.headers.getRawHeaders(b"set-cookie"), [b"app=1; Path=/"]
        )
        self.assertEqual(
            response.headers.getRawHeaders(b"location"),
            [f"http://{self.host(self.scripted.port)}/next".encode()],
        )
        head = self.scripted.heads[-1].lower()
        self.assertNotIn(b"x-access-token", head)
        self.assertIn(f"host: localhost:{self.scripted.port}".encode(), head)


class PoolIdleTests(SynchronousTestCase):
    """How long the pool keeps a connection nobody uses."""

    def test_idle_connections_closed_in_order(self) -> None:
        """
        Each idle connection is closed once it has been idle for the bound
        (shorter than Node's keep-alive), not before, with one timer for the
        pool; a connection taken again in between is not closed.
        """
        clock = MemoryReactorClock()
        pool = RawPool(clock)
        key = ("127.0.0.1", 3000)
        made = []
        for _ in range(3):
            connection = RawConnection(pool, key)
            connection.transport = StringTransport()  # connected, answered
            made.append(connection)
        first, second, third = made
        pool.release(first)
        self.assertFalse(first.transport.disconnecting)  # type: ignore[union-attr]
        clock.advance(1)
        pool.release(second)
        pool.release(third)
        self.assertEqual(len(clock.getDelayedCalls()), 1)
        clock.advance(PREVIEW_POOL_IDLE_SECONDS - 1)
        transports: list[Any] = [c.transport for c in made]
        self.assertTrue(transports[0].disconnecting)
        self.assertFalse(transports[1].disconnecting)
        # Taken for a request (the newest first), then back much later.
        pool.request("127.0.0.1", 3000, b"GET", b"GET / HTTP/1.1\r\n\r\n")
        self.assertEqual(pool.idle[key], [second])
        clock.advance(1)
        self.assertTrue(transports[1].disconnecting)
        self.assertFalse(transports[2].disconnecting)
        self.assertEqual(pool.idle[key], [])


class _Sink:
    """Notes when its request was given up on (the only call a cancel makes)."""

    def __init__(
        self, name: str, clock: MemoryReactorClock, failed: dict[str, float]
    ) -> None:
        self.name = name
        self.clock = clock
        self.failed = failed

    def upstream_failed(self, reason: Any) -> None:
        self.failed[self.name] = self.clock.seconds()


class PoolLateTests(SynchronousTestCase):
    """The one timer that gives up on answers' heads that do not come."""

    def waiting(
        self, pool: RawPool, clock: MemoryReactorClock, failed: dict[str, float]
    ) -> Any:
        def make(name: str) -> RawConnection:
            connection = RawConnection(pool, ("127.0.0.1", 3000))
            connection.transport = StringTransport()
            connection.sink = _Sink(name, clock, failed)  # type: ignore[assignment]
            return connection

        return make

    def test_a_shorter_timeout_brings_the_timer_forward(self) -> None:
        """
        A request given a shorter timeout than one already waiting (a
        reload lowered ``timeout_seconds``) is given up on at its own
        deadline, not at the other's later one; the other still at its own.
        """
        clock = MemoryReactorClock()
        pool = RawPool(clock)
        failed: dict[str, float] = {}
        make = self.waiting(pool, clock, failed)
        pool.expect(make("old"), 60)
        clock.advance(1)
        pool.expect(make("new"), 3)
        clock.advance(3)
        self.assertEqual(failed, {"new": 4.0})
        clock.advance(56)
        self.assertEqual(failed, {"new": 4.0, "old": 60.0})
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_an_earlier_deadline_brings_the_timer_forward(self) -> None:
        """
        The same for a request sent again by its deadline (a retry on a
        fresh connection): an earlier deadline than the timer's is kept.
        """
        clock = MemoryReactorClock()
        pool = RawPool(clock)
        failed: dict[str, float] = {}
        make = self.waiting(pool, clock, failed)
        pool.expect(make("old"), 60)
        pool.expect_by(make("retried"), 5.0)
        clock.advance(5)
        self.assertEqual(failed, {"retried": 5.0})
        clock.advance(55)
        self.assertEqual(failed, {"retried": 5.0, "old": 60.0})
