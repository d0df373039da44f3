"""
The HTTP connection bounds (issue 22, item 2): a deadline on the whole
request head, idle and slow connections reclaimed at a cap, a rate-limited
warning when a cap refuses connections, and the bounds overridable.
"""

from __future__ import annotations

import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.internet.task import LoopingCall, deferLater
from twisted.internet.testing import StringTransport
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.daemon.server import PolicyError, Settings, connection_limits
from sandboxd.web.connections import ConnectionLimits, ConnectionTable
from sandboxd.web.factory import SandboxSite
from tests.helpers import DaemonTestCase
from tests.web.test_request import make_site

HEALTH = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"


class _Transport(StringTransport):
    """A StringTransport with a peer address and an abort that is noticed."""

    def __init__(self, host: str = "10.0.0.1") -> None:
        super().__init__(peerAddress=IPv4Address("TCP", host, 4321))
        self.aborted = False

    def abortConnection(self) -> None:
        self.aborted = True
        self.loseConnection()


class _Logged:
    """Collects log events of one namespace for a test."""

    def __init__(self, test: SynchronousTestCase, namespace: str) -> None:
        self.events: list[dict[str, Any]] = []
        self.namespace = namespace
        globalLogPublisher.addObserver(self)
        test.addCleanup(globalLogPublisher.removeObserver, self)

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("log_namespace") == self.namespace:
            self.events.append(event)

    def warnings(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["log_level"].name == "warn"]


class _Case(SynchronousTestCase):
    def site(self, **limits: Any) -> tuple[SandboxSite, Any]:
        site, clock, _ = make_site()
        site.table = ConnectionTable(ConnectionLimits(**limits), clock.seconds)
        site.startFactory()
        self.addCleanup(site.stopFactory)
        return site, clock

    def connect(
        self, site: SandboxSite, host: str = "10.0.0.1"
    ) -> tuple[Any, _Transport]:
        protocol = site.buildProtocol(None)
        transport = _Transport(host)
        protocol.makeConnection(transport)
        return protocol, transport


class HeadDeadlineTests(_Case):
    """The whole request head has a deadline, whatever the client drips."""

    def test_dripped_request_line_is_cut(self) -> None:
        """A request line sent one byte a second is cut within a second of the deadline."""
        site, clock = self.site(head_deadline=10)
        protocol, transport = self.connect(site)
        protocol.dataReceived(b"GET /health?")
        cut_at = None
        for second in range(1, 15):
            clock.advance(1)
            if transport.aborted:
                cut_at = second
                break
            protocol.dataReceived(b"a")
        self.assertIn(cut_at, (10, 11))
        self.assertEqual(site.connections, set())

    def test_silent_connection_is_cut(self) -> None:
        """A connection that never sends a byte is cut at the deadline too."""
        site, clock = self.site(head_deadline=10)
        _, transport = self.connect(site)
        clock.advance(9)
        self.assertFalse(transport.aborted)
        clock.advance(2)
        self.assertTrue(transport.aborted)

    def test_dripped_headers_are_cut(self) -> None:
        """Headers dripped after a quick request line are cut at the same deadline."""
        site, clock = self.site(head_deadline=10)
        protocol, transport = self.connect(site)
        protocol.dataReceived(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: a")
        for _ in range(11):
            clock.advance(1)
            protocol.dataReceived(b"a")
        self.assertTrue(transport.aborted)

    def test_later_request_deadline_starts_at_its_first_byte(self) -> None:
        """On a kept-alive connection the next head is timed from its first byte, not from idle."""
        site, clock = self.site(head_deadline=10)
        protocol, transport = self.connect(site)
        protocol.dataReceived(HEALTH)
        self.assertIn(b"200 OK", transport.value())
        clock.advance(40)  # idle (Twisted's idle timeout is 60 s)
        self.assertFalse(transport.aborted)
        protocol.dataReceived(b"GET /hea")
        clock.advance(9)
        self.assertFalse(transport.aborted)
        protocol.dataReceived(b"l")
        clock.advance(2)
        self.assertTrue(transport.aborted)

    def test_complete_requests_keep_the_connection(self) -> None:
        """Requests that arrive whole are never cut, however many follow."""
        site, clock = self.site(head_deadline=10)
        protocol, transport = self.connect(site)
        for _ in range(5):
            protocol.dataReceived(HEALTH)
            clock.advance(8)
        self.assertFalse(transport.aborted)
        self.assertEqual(transport.value().count(b"200 OK"), 5)


class AfterABodyTests(_Case):
    """A request with a body, answered: the connection waits for the next one as any does."""

    def test_answered_post_is_idle_not_reading_a_head(self) -> None:
        """
        Once a POST with a body is answered, its connection is idle: a
        client still taking a large answer slowly, or thinking about its
        next request, is not cut at the head deadline (it was, a body's end
        leaving an empty piece in the channel's buffer that read as a head
        under way).
        """
        site, clock = self.site(head_deadline=10)
        protocol, transport = self.connect(site)
        body = b'{"endpoint": "shell"}'
        protocol.dataReceived(
            b"POST /capabilities/check HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        self.assertIn(b"200 OK", transport.value())
        clock.advance(30)
        self.assertFalse(transport.aborted)
        protocol.dataReceived(HEALTH)
        self.assertEqual(transport.value().count(b"200 OK"), 2)


class CapTests(_Case):
    """At a cap, idle then slow connections make room; refusals are logged."""

    def test_idle_keep_alive_reclaimed_first(self) -> None:
        """At the cap, the connection idle the longest is closed for a new one, not a slow head."""
        site, clock = self.site(max_connections=3)
        slow, slow_t = self.connect(site, "10.0.0.2")
        slow.dataReceived(b"GET /hea")
        clock.advance(5)
        idle = []
        for _ in range(2):
            protocol, transport = self.connect(site)
            protocol.dataReceived(HEALTH)
            idle.append(transport)
            clock.advance(1)
        _, new = self.connect(site, "10.0.0.3")
        self.assertFalse(new.disconnecting)
        self.assertTrue(idle[0].disconnecting)
        self.assertFalse(idle[0].aborted)  # a graceful close between requests
        self.assertFalse(idle[1].disconnecting)
        self.assertFalse(slow_t.disconnecting)
        self.assertEqual(len(site.connections), 3)

    def test_slow_head_reclaimed_for_a_fresh_client(self) -> None:
        """With no idle connection, the oldest head over a second old makes room."""
        site, clock = self.site(max_connections=4, max_per_address=3)
        slow = []
        for host in ("10.0.0.2", "10.0.0.2", "10.0.0.3", "10.0.0.3"):
            protocol, transport = self.connect(site, host)
            protocol.dataReceived(b"GET /health?")
            slow.append(transport)
            clock.advance(0.5)
        clock.advance(1)
        protocol, fresh = self.connect(site, "10.0.0.9")
        self.assertFalse(fresh.disconnecting)
        self.assertTrue(slow[0].aborted)
        self.assertFalse(any(t.disconnecting for t in slow[1:]))
        protocol.dataReceived(HEALTH)
        self.assertIn(b"200 OK", fresh.value())

    def test_per_address_cap_reclaims_that_address(self) -> None:
        """Behind one address (NAT), a new connection replaces that address's slowest head."""
        site, clock = self.site(max_per_address=3)
        mine = []
        _, other = self.connect(site, "10.0.0.8")
        clock.advance(0.5)
        for _ in range(3):
            protocol, transport = self.connect(site, "10.0.0.2")
            protocol.dataReceived(b"GET /h")
            mine.append(transport)
        clock.advance(2)
        _, new = self.connect(site, "10.0.0.2")
        self.assertFalse(new.disconnecting)
        self.assertTrue(mine[0].aborted)
        self.assertFalse(other.disconnecting)
        self.assertEqual(site.per_peer["10.0.0.2"], 3)

    def test_refusal_is_a_rate_limited_warning(self) -> None:
        """When nothing can make room the connection is refused, with one warning per interval."""
        logged = _Logged(self, "sandboxd.connections")
        site, clock = self.site(max_connections=2)
        for _ in range(2):
            protocol, _ = self.connect(site)
            protocol.dataReceived(b"GET /h")  # young heads: not reclaimable
        refused = [self.connect(site)[1] for _ in range(5)]
        self.assertTrue(all(t.aborted for t in refused))
        self.assertEqual(len(logged.warnings()), 1)
        self.assertIn("refused", logged.warnings()[0]["log_format"])
        clock.advance(0.5)
        self.connect(site)
        self.assertEqual(len(logged.warnings()), 1)
        # The refusals held back are reported once the interval is over.
        clock.advance(30)
        self.assertEqual(len(logged.warnings()), 2)
        self.assertEqual(logged.warnings()[1]["refused"], 5)

    def test_idle_timeouts_paced(self) -> None:
        """
        Connections closed at the idle timeout are counted in the paced
        information line, not one line each: a client opening idle sockets
        does not set the log's pace.
        """
        every: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(every.append)
        self.addCleanup(globalLogPublisher.removeObserver, every.append)
        logged = _Logged(self, "sandboxd.connections")
        site, clock = self.site()
        transports = []
        for _ in range(20):
            protocol, transport = self.connect(site)
            protocol.dataReceived(HEALTH)
            transports.append(transport)
        clock.advance(61)  # the site's idle timeout
        self.assertTrue(all(t.disconnecting for t in transports))
        clock.advance(31)
        self.assertEqual(
            [e for e in every if "Timing out" in str(e.get("log_format"))], []
        )
        infos = [e for e in logged.events if "timed_out" in e]
        self.assertLessEqual(len(infos), 2)
        self.assertEqual(sum(e["timed_out"] for e in infos), 20)

    def test_limits_overridable(self) -> None:
        """Settings, then the environment, then the defaults; nonsense is a configuration error."""
        limits = connection_limits(
            Settings(max_connections=10, environ={"ABX_HEAD_DEADLINE_SECONDS": "2.5"})
        )
        self.assertEqual(
            (limits.max_connections, limits.max_per_address, limits.head_deadline),
            (10, 256, 2.5),
        )
        self.assertEqual(connection_limits(Settings(environ={})), ConnectionLimits())
        for bad in (
            {"ABX_MAX_CONNECTIONS": "lots"},
            {"ABX_HEAD_DEADLINE_SECONDS": "0"},
        ):
            with self.assertRaises(PolicyError):
                connection_limits(Settings(environ=bad))

    def test_lingering_bounds_follow_the_head_deadline(self) -> None:
        """
        A refused request's connection lingers at most the head deadline,
        and 5 s without a byte from its client (never more than the whole).
        """
        self.assertEqual(
            (ConnectionLimits().linger_seconds, ConnectionLimits().linger_quiet),
            (30.0, 5.0),
        )
        short = ConnectionLimits(head_deadline=2.0)
        self.assertEqual((short.linger_seconds, short.linger_quiet), (2.0, 2.0))


class _Dripper(Protocol):
    """Sends ``GET /health?`` and then one byte every ``period`` seconds."""

    def __init__(self) -> None:
        self.closed: Deferred[None] = Deferred()
        self.closed_at: float | None = None

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(b"GET /health?")

    def drip(self) -> None:
        if self.transport is not None and self.closed_at is None:
            self.transport.write(b"a")

    def connectionLost(self, reason: Any = None) -> None:
        self.closed_at = time.monotonic()
        self.closed.callback(None)


class _DripFactory(ClientFactory):
    def __init__(self, made: list[_Dripper]) -> None:
        self.made = made

    def buildProtocol(self, addr: Any) -> _Dripper:
        p = _Dripper()
        self.made.append(p)
        return p


class SlowRequestLineFloodTests(DaemonTestCase):
    """A real daemon under a few hundred request-line drippers (shortened bounds)."""

    timeout = 60
    autostart = False
    connections = 300
    deadline = 4.0

    @inlineCallbacks
    def wait_until(self, test: Any, seconds: float) -> Any:
        end = time.monotonic() + seconds
        while not test() and time.monotonic() < end:
            yield deferLater(reactor, 0.05, lambda: None)
        return test()

    @inlineCallbacks
    def test_fresh_client_served_and_drippers_cut(self) -> Any:
        """
        300 drippers from three addresses against a cap of 200: /health from a
        fourth address is answered (a slow head makes room for it), and
        every dripper is closed soon after the deadline.

        (The latency bound here is loose, for a loaded test machine; the
        figure the issue asks for, under 200 ms with 1,100 drippers and the
        real caps, is measured outside the suite.)
        """
        yield self.start(
            max_connections=200,
            max_connections_per_address=100,
            head_deadline=self.deadline,
        )
        made: list[_Dripper] = []
        factory = _DripFactory(made)
        self.addCleanup(self.hang_up, made)
        drip = LoopingCall(lambda: [p.drip() for p in made])
        drip.start(0.2)
        self.addCleanup(lambda: drip.running and drip.stop())
        for i in range(self.connections):
            if i % 25 == 0:
                # In batches: the listen backlog (50) would drop the rest,
                # and their SYNs come back a second later.
                yield deferLater(reactor, 0.02, lambda: None)
            reactor.connectTCP(
                "127.0.0.1",
                self.daemon.port,
                factory,
                bindAddress=(f"127.0.0.{2 + i % 3}", 0),
            )
        site = self.daemon.daemon.listeners[0].factory
        full = yield self.wait_until(lambda: len(site.connections) >= 200, 3)
        self.assertTrue(full, len(site.connections))
        # Let the heads grow older than a second: reclaimable.
        yield deferLater(reactor, 1.1, lambda: None)
        self.assertEqual(len(site.connections), 200)
        for _ in range(3):
            began = time.monotonic()
            reply = yield self.request(
                "GET", "/health", headers={"Connection": "close"}
            )
            self.assertEqual(reply.status, 200)
            self.assertLess(time.monotonic() - began, 1.0)
        # Every dripper is closed: refused, reclaimed, or cut at the deadline.
        closed = yield self.wait_until(
            lambda: all(p.closed_at is not None for p in made), self.deadline + 3
        )
        self.assertTrue(closed, sum(p.closed_at is None for p in made))
        self.assertEqual(len(made), self.connections)

    @inlineCallbacks
    def hang_up(self, made: list[_Dripper]) -> Any:
        for p in made:
            if p.closed_at is None and p.transport is not None:
                p.transport.abortConnection()
        for p in made:
            yield p.closed


class _Conn:
    """A connection as the table sees it, counting refusals."""

    peer_host = "10.0.0.7"

    def __init__(self) -> None:
        self.refused = 0

    def close_idle(self) -> None:
        pass

    def close_slow(self) -> None:
        pass

    def close_slow_body(self) -> None:
        self.refused += 1


class BodyRateTests(_Case):
    """A request body must keep coming once the head deadline's grace is over."""

    HEAD = (
        b"POST /env HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nContent-Length: 50000\r\n\r\n"
    )

    def test_dripped_body_is_408(self) -> None:
        """
        A body dripped a byte a second (each byte resets the idle timeout):
        408 ``timeout`` in the door's framing within a second or two of the
        grace, and the connection closed.
        """
        site, clock = self.site(head_deadline=10, body_min_rate=1024)
        protocol, transport = self.connect(site)
        protocol.dataReceived(self.HEAD)
        for _ in range(9):
            protocol.dataReceived(b" ")
            clock.advance(1)
        self.assertFalse(transport.disconnecting)
        for _ in range(3):
            protocol.dataReceived(b" ")
            clock.advance(1)
        self.assertTrue(transport.disconnecting)
        answer = transport.value()
        self.assertTrue(answer.startswith(b"HTTP/1.1 408 "), answer[:80])
        self.assertIn(b'"code":"timeout"', answer)
        self.assertEqual(site.table.bodies, {})

    def test_steady_body_is_kept(self) -> None:
        """A body coming at 2 KiB a second is read on, past the grace."""
        site, clock = self.site(head_deadline=10, body_min_rate=1024)
        protocol, transport = self.connect(site)
        protocol.dataReceived(self.HEAD)
        for _ in range(20):
            protocol.dataReceived(b" " * 2048)
            clock.advance(1)
        self.assertFalse(transport.disconnecting)
        self.assertEqual(transport.value(), b"")

    def test_paused_time_is_not_counted(self) -> None:
        """
        Time the daemon was not reading the body (paused for the disk or
        an app) is not the client's: only reading time uses up the grace.
        """
        now = [0.0]
        table = ConnectionTable(ConnectionLimits(head_deadline=10), lambda: now[0])
        conn = _Conn()
        table.admit(conn)
        table.head_done(conn)
        table.body_started(conn)
        for _ in range(30):
            now[0] += 1
            table.cut_slow_bodies(lambda c: False)
        self.assertEqual(conn.refused, 0)
        for _ in range(9):
            now[0] += 1
            table.cut_slow_bodies(lambda c: True)
        self.assertEqual(conn.refused, 0)
        for _ in range(2):
            now[0] += 1
            table.cut_slow_bodies(lambda c: True)
        self.assertEqual(conn.refused, 1)
        self.assertEqual(table.bodies, {})

    def test_bounds_from_settings(self) -> None:
        """The idle timeout and the body rate come from the options, else the environment."""
        limits = connection_limits(Settings(idle_timeout=5, environ={}))
        self.assertEqual(limits.idle_timeout, 5)
        limits = connection_limits(Settings(environ={"ABX_BODY_MIN_RATE": "100"}))
        self.assertEqual(limits.body_min_rate, 100)
        with self.assertRaises(PolicyError):
            connection_limits(Settings(body_min_rate=0, environ={}))
