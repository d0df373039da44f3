# -*- test-case-name: tests.policy.test_limits -*-
"""
Rate and concurrency limits (SPEC §5.5).

Rates are token buckets per (identity, endpoint) that refill over a minute;
concurrency counts requests and streams in flight per endpoint.  A
capability link spends its minter's bucket (the gate keys by
``Identity.root``): counted as an identity of its own, every link a token
minted would be a fresh minute's worth of calls.  The endpoints are fixed
by the policy, and so are its tokens; still only the buckets of the
callers of the last minute are kept, no more (whatever names a door
passes in, the table cannot grow past them): a bucket unused for a minute
is full again, and a full bucket is what a new one is.
"""

from __future__ import annotations

import math

from twisted.internet.interfaces import IReactorTime

from sandboxd.errors import Code, limit_exceeded, rate_limited
from sandboxd.policy.defaults import RATE_BUCKETS_PRUNED_PAST


class RateLimiter:
    """
    Token buckets of ``rate_per_minute`` per identity and endpoint (a link's
    key is its minter's).
    """

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}
        self._prune_at = RATE_BUCKETS_PRUNED_PAST

    def take(self, identity: str, endpoint: str, per_minute: int) -> None:
        """
        Spend one request.

        :raises ApiError: 429 ``rate_limited`` with ``retry_after``.
        """
        now = self._clock.seconds()
        refill = per_minute / 60.0
        tokens, stamp = self._buckets.get(
            (identity, endpoint), (float(per_minute), now)
        )
        tokens = min(float(per_minute), tokens + (now - stamp) * refill)
        if tokens < 1.0:
            retry = max(1, math.ceil((1.0 - tokens) / refill)) if refill else 60
            self._buckets[(identity, endpoint)] = (tokens, now)
            raise rate_limited(
                f"rate limit of {per_minute} requests per minute reached",
                retry,
                endpoint=endpoint,
                limit=per_minute,
            )
        self._buckets[(identity, endpoint)] = (tokens - 1.0, now)
        if len(self._buckets) > self._prune_at:
            self._prune(now)

    def _prune(self, now: float) -> None:
        """Drop the buckets refilled to the full (unused for a minute)."""
        self._buckets = {
            key: (tokens, stamp)
            for key, (tokens, stamp) in self._buckets.items()
            if now - stamp < 60.0
        }
        # Scanned again only once the table has doubled: a minute's callers
        # are not looked at on each call.
        self._prune_at = max(RATE_BUCKETS_PRUNED_PAST, 2 * len(self._buckets))

    def __len__(self) -> int:
        """The buckets kept."""
        return len(self._buckets)

    def forget(self) -> None:
        """Drop every bucket (policy reload)."""
        self._buckets.clear()


class ConcurrencyGate:
    """In-flight counters per endpoint."""

    def __init__(self) -> None:
        self._in_flight: dict[str, int] = {}

    def acquire(self, endpoint: str, limit: int | None) -> bool:
        """
        Take a slot; returns whether one was taken (False when unlimited).

        :raises ApiError: 429 ``concurrency_limited``.
        """
        if limit is None:
            return False
        current = self._in_flight.get(endpoint, 0)
        if current >= limit:
            raise limit_exceeded(
                429,
                f"{endpoint} already has {current} requests in flight",
                Code.CONCURRENCY_LIMITED,
                endpoint=endpoint,
                limit=limit,
            )
        self._in_flight[endpoint] = current + 1
        return True

    def release(self, endpoint: str) -> None:
        """Give a slot back."""
        left = self._in_flight.get(endpoint, 0) - 1
        if left > 0:
            self._in_flight[endpoint] = left
        else:
            self._in_flight.pop(endpoint, None)

    def in_flight(self, endpoint: str) -> int:
        """How many requests hold a slot of ``endpoint``."""
        return self._in_flight.get(endpoint, 0)
