# -*- test-case-name: tests.test_waiters -*-
"""
Everyone waiting for one event, each with a Deferred of their own.

A Deferred has one chain of callbacks, so code that lets several callers
wait for the same thing (a worker ready, a turn over, a process gone)
hands each of them a fresh Deferred and settles them all at once.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

T = TypeVar("T")


class Waiters(Generic[T]):
    """
    The Deferreds handed out by :meth:`wait`, settled together by
    :meth:`fire` or :meth:`fail`.  A waiter cancelled before that is
    forgotten, so it is never fired a second time.
    """

    def __init__(self) -> None:
        self._waiting: list[Deferred[T]] = []

    def wait(self) -> Deferred[T]:
        """A Deferred that fires with the next :meth:`fire` or :meth:`fail`."""
        d: Deferred[T] = Deferred(self._forget)
        self._waiting.append(d)
        return d

    def fire(self, result: T) -> None:
        """Fire every waiter with ``result``."""
        for d in self._take():
            if not d.called:
                d.callback(result)

    def fail(self, error: BaseException | Failure) -> None:
        """Fail every waiter with ``error``."""
        for d in self._take():
            if not d.called:
                d.errback(error)

    def _take(self) -> list[Deferred[T]]:
        waiting, self._waiting = self._waiting, []
        return waiting

    def _forget(self, d: Deferred[T]) -> None:
        if d in self._waiting:
            self._waiting.remove(d)
