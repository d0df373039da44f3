"""Rate and concurrency limits on an injected clock (SPEC §5.5)."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import ApiError
from sandboxd.policy.limits import ConcurrencyGate, RateLimiter


class RateLimiterTests(SynchronousTestCase):
    """Token buckets per identity and endpoint, refilled over a minute."""

    def test_burst_then_refill(self) -> None:
        """A full minute's budget at once, then one more per 60/rate seconds."""
        clock = Clock()
        limiter = RateLimiter(clock)
        for _ in range(6):
            limiter.take("ci", "shell", 6)
        with self.assertRaises(ApiError) as cm:
            limiter.take("ci", "shell", 6)
        self.assertEqual(cm.exception.code, "rate_limited")
        self.assertEqual(cm.exception.extra["retry_after"], 10)
        self.assertEqual(cm.exception.headers, {"Retry-After": "10"})
        clock.advance(9.9)
        with self.assertRaises(ApiError):
            limiter.take("ci", "shell", 6)
        clock.advance(0.2)
        limiter.take("ci", "shell", 6)

    def test_buckets_are_separate(self) -> None:
        """Another identity, or another endpoint, has its own bucket."""
        limiter = RateLimiter(Clock())
        limiter.take("ci", "shell", 1)
        limiter.take("admin", "shell", 1)
        limiter.take("ci", "download", 1)
        with self.assertRaises(ApiError):
            limiter.take("ci", "shell", 1)

    def test_never_more_than_a_minute_saved(self) -> None:
        """A long quiet spell does not bank more than one minute's budget."""
        clock = Clock()
        limiter = RateLimiter(clock)
        limiter.take("ci", "shell", 2)
        clock.advance(3600)
        limiter.take("ci", "shell", 2)
        limiter.take("ci", "shell", 2)
        with self.assertRaises(ApiError):
            limiter.take("ci", "shell", 2)

    def test_buckets_of_past_callers_dropped(self) -> None:
        """
        Callers come and go (every capability link is one): the buckets
        of those gone for a minute are dropped, and one that comes back
        starts full, as its bucket would have been; a recent caller's
        spent bucket is kept.
        """
        clock = Clock()
        limiter = RateLimiter(clock)
        for n in range(2000):
            limiter.take(f"link:{n}", "shell", 1)
            clock.advance(0.1)
            # Twice a minute's callers (600) at most, and a few.
            self.assertLessEqual(len(limiter), 1210)
        limiter.take("link:0", "shell", 1)
        with self.assertRaises(ApiError):
            limiter.take("link:1999", "shell", 1)


class ConcurrencyGateTests(SynchronousTestCase):
    """Slots per endpoint."""

    def test_slots(self) -> None:
        """The limit holds; a released slot is free again; no limit takes no slot."""
        gate = ConcurrencyGate()
        self.assertTrue(gate.acquire("shell_stream", 2))
        self.assertTrue(gate.acquire("shell_stream", 2))
        with self.assertRaises(ApiError) as cm:
            gate.acquire("shell_stream", 2)
        self.assertEqual(cm.exception.code, "concurrency_limited")
        gate.release("shell_stream")
        self.assertTrue(gate.acquire("shell_stream", 2))
        self.assertFalse(gate.acquire("download", None))
        self.assertEqual(gate.in_flight("download"), 0)
