"""
:class:`sandboxd.waiters.Waiters`: everyone waiting for one event.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.waiters import Waiters


class WaitersTests(SynchronousTestCase):
    def test_fire_reaches_every_waiter(self) -> None:
        """Each waiter gets the result; a wait after the fire waits for the next one."""
        waiters: Waiters[int] = Waiters()
        first, second = waiters.wait(), waiters.wait()
        waiters.fire(7)
        self.assertEqual(
            (self.successResultOf(first), self.successResultOf(second)), (7, 7)
        )
        later = waiters.wait()
        self.assertNoResult(later)

    def test_fail_reaches_every_waiter(self) -> None:
        """Each waiter gets the error."""
        waiters: Waiters[None] = Waiters()
        first, second = waiters.wait(), waiters.wait()
        waiters.fail(ValueError("no"))
        self.failureResultOf(first, ValueError)
        self.failureResultOf(second, ValueError)

    def test_cancelled_waiter_is_forgotten(self) -> None:
        """A waiter cancelled before the fire stays cancelled; the others still fire."""
        waiters: Waiters[None] = Waiters()
        cancelled, kept = waiters.wait(), waiters.wait()
        cancelled.cancel()
        waiters.fire(None)
        self.failureResultOf(cancelled, CancelledError)
        self.assertIsNone(self.successResultOf(kept))

    def test_waiter_cancelled_by_another_waiters_callback(self) -> None:
        """One waiter's callback cancelling another does not make the fire fail."""
        waiters: Waiters[None] = Waiters()
        first, second = waiters.wait(), waiters.wait()
        first.addCallback(lambda _: second.cancel())
        waiters.fire(None)
        self.failureResultOf(second, CancelledError)
