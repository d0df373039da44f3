"""
The ``Idempotency-Key`` book of the ``/v1`` door, in memory: how long a key
answers its first result again.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import ApiError
from sandboxd.openai_api.face import IdempotencyBook
from sandboxd.policy.defaults import OPENAI_IDEMPOTENCY_SECONDS

BODY = {"input": "hi"}


class IdempotencyWindowTests(SynchronousTestCase):
    """A key is remembered for OpenAI's window, then it is new again."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_800_000_000)
        self.book = IdempotencyBook(clock=self.clock.seconds)

    def test_window_is_a_day(self) -> None:
        """The bound is OpenAI's documented 24 hours."""
        self.assertEqual(OPENAI_IDEMPOTENCY_SECONDS, 24 * 60 * 60)
        self.assertEqual(self.book.window, OPENAI_IDEMPOTENCY_SECONDS)

    def test_key_answers_within_the_window(self) -> None:
        """
        Just inside the window the key answers its result, and another body
        is still 409 ``idempotency.mismatch``.
        """
        self.book.store("k", BODY, "first")
        self.clock.advance(OPENAI_IDEMPOTENCY_SECONDS - 1)
        self.assertEqual(self.book.lookup("k", BODY), "first")
        error = self.assertRaises(ApiError, self.book.lookup, "k", {"input": "no"})
        self.assertEqual((error.status, error.code), (409, "idempotency.mismatch"))

    def test_key_is_new_after_the_window(self) -> None:
        """
        Once the window has passed the key is new: another body is no
        longer refused, and the key is no longer among the kept entries.
        """
        self.book.store("old", BODY, "first")
        self.clock.advance(60)
        self.book.store("newer", BODY, "second")
        self.clock.advance(OPENAI_IDEMPOTENCY_SECONDS - 30)
        self.assertIsNone(self.book.lookup("old", {"input": "other"}))
        self.assertEqual(self.book.lookup("newer", BODY), "second")
        self.assertEqual([e[0] for e in self.book.entries()], ["newer"])

    def test_restored_entries_keep_their_time(self) -> None:
        """
        An entry kept by a previous daemon expires from when it was first
        stored; one kept without a time (an older daemon's) counts from its
        restore; one already past the window is not put back.
        """
        now = self.clock.seconds()
        self.book.restore("stale", "d", "r", now - OPENAI_IDEMPOTENCY_SECONDS - 1)
        self.book.restore("kept", "d", "r", now - OPENAI_IDEMPOTENCY_SECONDS + 10)
        self.book.restore("untimed", "d", "r")
        self.assertEqual(
            [(e[0], e[3]) for e in self.book.entries()],
            [("kept", now - OPENAI_IDEMPOTENCY_SECONDS + 10), ("untimed", now)],
        )
        self.clock.advance(11)
        self.assertEqual([e[0] for e in self.book.entries()], ["untimed"])

    def test_count_bound_still_holds(self) -> None:
        """Within the window, the oldest key goes beyond the book's size."""
        book = IdempotencyBook(size=2, clock=self.clock.seconds)
        for key in ("a", "b", "c"):
            book.store(key, BODY, key)
        self.assertEqual([e[0] for e in book.entries()], ["b", "c"])
