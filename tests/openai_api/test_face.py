"""
The ``/v1`` door's session face, in memory: how long an ``Idempotency-Key``
answers its first result again, and a streamed answer folded into its item.
"""

from __future__ import annotations

import time
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import ApiError
from sandboxd.openai_api.face import IdempotencyBook, SessionFace, WireTurn
from sandboxd.policy import defaults
from sandboxd.policy.defaults import OPENAI_IDEMPOTENCY_SECONDS
from sandboxd.policy.rules import Limits
from tests.agents.test_heldrequests import running_session

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


class StreamedTextTests(SynchronousTestCase):
    """
    An agent's streamed answer and thoughts become a turn's message and
    reasoning items: whole whenever read, in time linear in their length.
    """

    def setUp(self) -> None:
        self.start()

    def start(self, limits: Limits | None = None) -> None:
        """A face on a running engine session, its turn started."""
        self.engine = running_session(self.mktemp(), Clock(), limits)
        agent = {"id": "agent_1", "runtime": "fake", "model": "fake-model"}
        self.face = SessionFace(self.engine, "owner", agent, {"id": "env_1"}, {})
        self.engine.emit("turn.started")
        [self.turn] = self.face.turns.values()

    def chunk(self, text: str, role: str = "agent", message_id: str = "m1") -> None:
        self.engine.emit(
            "message.delta",
            role=role,
            message_id=message_id,
            content={"type": "text", "text": text},
        )

    def texts(self, turn: WireTurn) -> list[tuple[str, str]]:
        def text(item: dict[str, Any]) -> str:
            parts = item["content"] if item["type"] == "message" else item["summary"]
            return str(parts[0]["text"])

        return [(item["type"], text(item)) for item in turn.items]

    def test_whole_when_read_midway(self) -> None:
        """
        Read while the answer streams, through the turn, the session and the
        ``item.done`` event, the text is everything streamed so far.
        """
        self.chunk("Let me ", role="thought", message_id="t1")
        self.chunk("think.", role="thought", message_id="t1")
        self.chunk("Hel")
        self.chunk("lo, ")
        self.assertEqual(
            self.texts(self.turn),
            [("reasoning", "Let me think."), ("message", "Hello, ")],
        )
        self.chunk("world")
        self.assertEqual(self.face.items()[1]["content"][0]["text"], "Hello, world")
        self.chunk("!")
        self.engine.emit("turn.ended", stop_reason="end_turn")
        self.assertEqual(
            self.texts(self.turn),
            [("reasoning", "Let me think."), ("message", "Hello, world!")],
        )
        _, events = self.face.log.since(0)
        done = [e.data["text"] for e in events if e.event.endswith("text.done")]
        self.assertEqual(done, ["Let me think.", "Hello, world!"])
        deltas = [
            e.data["delta"] for e in events if e.event.endswith("output_text.delta")
        ]
        self.assertEqual("".join(deltas), "Hello, world!")

    def test_long_answer_in_small_chunks(self) -> None:
        """
        A 1 MB answer in 4-byte chunks is folded in seconds, not the tens
        of seconds of the reactor's time a copy of the text per chunk took.
        Measured in this process's CPU time, which a loaded machine's other
        work does not add to.
        """
        started = time.process_time()
        for _ in range(250_000):
            self.chunk("abcd")
        took = time.process_time() - started
        self.assertEqual(self.texts(self.turn), [("message", "abcd" * 250_000)])
        self.assertLess(took, 12.0)

    def test_item_kept_to_max_message_bytes(self) -> None:
        """
        A message item keeps what one line from the agent may hold; past it
        no more deltas are sent and the item ends ``incomplete``, as an
        answer cut short does. The next message is whole again.
        """
        self.start(Limits(max_message_bytes=100))
        for _ in range(30):
            self.chunk("abcd")
        self.chunk("next", message_id="m2")
        self.engine.emit("turn.ended", stop_reason="end_turn")
        [cut, whole] = self.turn.items
        self.assertEqual(
            (cut["status"], cut["content"][0]["text"]), ("incomplete", "abcd" * 25)
        )
        self.assertEqual(
            (whole["status"], whole["content"][0]["text"]), ("completed", "next")
        )
        _, events = self.face.log.since(0)
        deltas = [
            e.data["delta"]
            for e in events
            if e.event.endswith("output_text.delta") and e.data["item_id"] == cut["id"]
        ]
        self.assertEqual("".join(deltas), "abcd" * 25)

    def test_tool_output_kept_to_its_end(self) -> None:
        """
        A tool call's output over the bound is kept by its end, after a line
        saying how much went; one within it is kept whole.
        """
        self.patch(defaults, "OPENAI_ITEM_OUTPUT_CHARS", 100)
        for call, text in (("t1", "a" * 50 + "b" * 100), ("t2", "short")):
            self.engine.emit("tool_call", tool_call_id=call, kind="read", title=call)
            self.engine.emit(
                "tool_call.update",
                tool_call_id=call,
                status="completed",
                delta={
                    "content": [
                        {"type": "content", "content": {"type": "text", "text": text}}
                    ]
                },
            )
        long, short = self.turn.items
        self.assertEqual(long["output"], "[50 characters not kept]\n" + "b" * 100)
        self.assertEqual(short["output"], "short")
