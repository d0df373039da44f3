"""
The table of exposed ports: an exposure past its ``ttl_seconds`` never
answers and ends what is in flight to it, and the table stays bounded
however many exposures come and go.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import task
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import ApiError
from sandboxd.preview.exposures import Exposure, ExposureTable


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Closed:
    """Something in flight to a port; says whether it was closed."""

    def __init__(self) -> None:
        self.closed = False
        self.why: str | None = None

    def close(self, why: str | None = None) -> None:
        self.closed = True
        self.why = why


class WatchedPorts(dict[int, Exposure]):
    """The table's ports, counting the walks over every exposure."""

    walks = 0

    def items(self) -> Any:
        self.walks += 1
        return super().items()


def expose(
    table: ExposureTable, port: int, ttl: float | None, cap: int | None = None
) -> Exposure:
    """Expose ``port`` for ``ttl`` seconds (None: until unexposed)."""
    return table.expose(port, None, False, "rewrite", "test", ttl, cap)


class ExpiryTests(SynchronousTestCase):
    """An exposure ends at its ttl, whatever is looked up."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.table = ExposureTable(self.clock)

    def assert_not_exposed(self, port: int) -> None:
        error = self.assertRaises(ApiError, self.table.get, port)
        self.assertEqual((error.status, error.code), (404, "port_not_exposed"))

    def test_expired_exposure_does_not_answer(self) -> None:
        """Before its ttl it answers; at its ttl it is 404 and its requests end, told why."""
        exposure = expose(self.table, 3000, 60)
        in_flight = Closed()
        exposure.open.add(in_flight)
        self.clock.now += 59.9
        self.assertIs(self.table.get(3000), exposure)
        self.clock.now += 0.1
        self.assert_not_exposed(3000)
        self.assertTrue(in_flight.closed)
        self.assertEqual(in_flight.why, "the preview of port 3000 expired")

    def test_looking_up_another_port_ends_it(self) -> None:
        """A look-up of any port ends every exposure past its ttl."""
        short = expose(self.table, 3000, 10)
        in_flight = Closed()
        short.open.add(in_flight)
        expose(self.table, 3001, 100)
        expose(self.table, 3002, None)
        self.clock.now += 10
        self.table.get(3002)
        self.assertTrue(in_flight.closed)
        self.assertEqual(sorted(self.table.by_port), [3001, 3002])
        self.clock.now += 90
        self.assert_not_exposed(3001)
        self.assertEqual(sorted(self.table.by_port), [3002])

    def test_replaced_exposure_keeps_its_new_ttl(self) -> None:
        """Exposed again with a longer ttl, a port outlives its first one."""
        expose(self.table, 3000, 10)
        again = expose(self.table, 3000, 100)
        self.clock.now += 50
        self.assertIs(self.table.get(3000), again)
        self.clock.now += 50
        self.assert_not_exposed(3000)

    def test_shorter_ttl_after_longer(self) -> None:
        """An exposure with a shorter ttl than those before it ends at its own."""
        expose(self.table, 3000, 100)
        expose(self.table, 3001, 5)
        self.clock.now += 5
        self.assert_not_exposed(3001)
        self.assertIsNotNone(self.table.get(3000))

    def test_lookup_walks_only_when_one_is_due(self) -> None:
        """
        A look-up before any exposure's ttl (or with none set) finds its
        port without walking the other exposures; one at a ttl walks once.
        """
        ports = WatchedPorts()
        self.table.by_port = ports
        for port in range(3000, 3064):
            expose(self.table, port, 60 if port % 2 else None)
        walks = ports.walks
        for _ in range(100):
            self.table.get(3001)
        self.assertEqual(ports.walks, walks)
        self.clock.now += 60
        self.assert_not_exposed(3001)
        self.assertEqual(ports.walks, walks + 1)
        for _ in range(100):
            self.table.get(3000)
        self.assertEqual(ports.walks, walks + 1)


class TimerTests(SynchronousTestCase):
    """With the reactor's timer, an exposure ends at its ttl with nothing looked up."""

    def test_ends_on_time_unasked(self) -> None:
        """
        Each exposure ends at its own ttl, what is open through it told
        why, though the table is never read; one exposed again with a
        longer ttl outlives its first.
        """
        clock = task.Clock()
        table = ExposureTable(clock.seconds, clock.callLater)
        first, second = expose(table, 3000, 10), expose(table, 3001, 5)
        expose(table, 3002, 10)
        expose(table, 3002, 30)
        open_first, open_second = Closed(), Closed()
        first.open.add(open_first)
        second.open.add(open_second)
        clock.advance(5)
        self.assertEqual(open_second.why, "the preview of port 3001 expired")
        self.assertFalse(open_first.closed)
        clock.advance(5)
        self.assertEqual(open_first.why, "the preview of port 3000 expired")
        self.assertEqual(sorted(table.by_port), [3002])
        clock.advance(20)
        self.assertEqual(table.by_port, {})
        self.assertEqual(clock.getDelayedCalls(), [])


class BoundTests(SynchronousTestCase):
    """The table never holds more than its cap, exposures coming and going."""

    def test_bounded_under_churn(self) -> None:
        """
        Exposures with short ttls, made and left to expire over and over,
        never hold more than the cap; the expired make room for new ones.
        """
        clock = Clock()
        table = ExposureTable(clock)
        cap = 8
        for round_ in range(200):
            for i in range(cap):
                expose(table, 3000 + (round_ * cap + i) % 1000, 1 + i % 3, cap)
                self.assertLessEqual(len(table.by_port), cap)
            error = self.assertRaises(ApiError, expose, table, 5000, 1, cap)
            self.assertEqual(error.status, 429)
            clock.now += 3
            self.assertRaises(ApiError, table.get, 5000)
        self.assertEqual(table.by_port, {})
