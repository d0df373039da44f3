"""
A session's messages folded from the agent's chunks, in memory: a streamed
text is whole when read, and a long one costs time in proportion to its
length, not to its square.
"""

from __future__ import annotations

import time
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.agents.filechanges import FileChanges
from sandboxd.agents.updates import UpdateFolding, settled
from sandboxd.policy.rules import Limits
from tests.agents.test_heldrequests import running_session


class FoldMessageTests(SynchronousTestCase):
    """``UpdateFolding.fold_message`` and :func:`settled`."""

    def setUp(self) -> None:
        self.session = running_session(self.mktemp(), Clock())
        self.updates = UpdateFolding(self.session, FileChanges(self.session))

    def chunk(self, text: str, seq: int, message_id: str = "m1") -> None:
        self.updates.fold_message(
            "agent", message_id, {"type": "text", "text": text}, seq
        )

    def test_chunks_joined_when_read(self) -> None:
        """Chunks make one text block; read in the middle and at the end, it is whole."""
        self.chunk("Hel", 1)
        self.chunk("lo, ", 2)
        [message] = self.session.messages
        self.assertEqual(
            settled(message)["content"], [{"type": "text", "text": "Hello, "}]
        )
        self.chunk("world", 3)
        self.updates.fold_message("agent", "m1", {"type": "image", "data": "x"}, 4)
        self.chunk("!", 5)
        self.assertEqual(
            settled(message)["content"],
            [
                {"type": "text", "text": "Hello, world"},
                {"type": "image", "data": "x"},
                {"type": "text", "text": "!"},
            ],
        )
        self.assertEqual(message["seq_to"], 5)
        self.assertNotIn("_pieces", message)

    def test_long_answer_in_small_chunks(self) -> None:
        """
        A 1 MB answer in 4-byte chunks folds in well under a second (joined
        once per chunk, it took tens of seconds of the reactor's time).
        """
        started = time.perf_counter()
        for seq in range(1, 250_001):
            self.chunk("abcd", seq)
        took = time.perf_counter() - started
        [message] = self.session.messages
        self.assertEqual(len(settled(message)["content"][0]["text"]), 1_000_000)
        self.assertLess(took, 5.0)

    def test_message_kept_to_max_message_bytes(self) -> None:
        """
        A message's content keeps what one line from the agent may hold
        (``max_message_bytes``): past it the chunks are not kept (their
        events still carry them) and the message says it was cut.
        """
        self.session = running_session(
            self.mktemp(), Clock(), Limits(max_message_bytes=100)
        )
        self.updates = UpdateFolding(self.session, FileChanges(self.session))
        for seq in range(1, 31):
            self.chunk("abcd", seq)
        [message] = self.session.messages
        self.assertEqual(settled(message)["content"][0]["text"], "abcd" * 25)
        self.assertIs(message["truncated"], True)
        self.assertEqual(message["seq_to"], 30)
        self.chunk("more", 31, message_id="m2")
        self.assertNotIn("truncated", self.session.messages[1])


class TypedUpdatesTests(SynchronousTestCase):
    """
    What an agent reports is kept only with the JSON types the routes
    document; a value of another type is recorded as ``unknown`` instead of
    reaching a typed client.
    """

    def setUp(self) -> None:
        self.session = running_session(self.mktemp(), Clock())
        self.updates = UpdateFolding(self.session, FileChanges(self.session))

    def update(self, **fields: Any) -> None:
        self.updates.update(fields, {"update": fields})

    def unknown(self) -> list[str]:
        return [
            e.data["reason"]
            for e in self.session.log.since(0)[1]
            if e.data["type"] == "unknown"
        ]

    def test_wrongly_typed_updates_are_unknown(self) -> None:
        """A non-string title, mode id or chunk text, a plan or commands that are not lists, usage that is not a number."""
        s = self.session
        for fields in (
            {"sessionUpdate": "session_info_update", "title": ["a"]},
            {"sessionUpdate": "current_mode_update", "currentModeId": {"x": 1}},
            {"sessionUpdate": "usage_update", "used": "lots", "size": None},
            {"sessionUpdate": "plan", "entries": "x"},
            {"sessionUpdate": "available_commands_update", "availableCommands": 3},
            {"sessionUpdate": "config_option_update", "configOptions": "x"},
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": 123},
            },
            {"sessionUpdate": "agent_message_chunk", "content": "plain"},
        ):
            self.update(**fields)
        self.assertEqual(len(self.unknown()), 8)
        self.assertEqual(
            (s.agent_title, s.modes, s.usage, s.plan, s.commands, s.config_options),
            (None, None, None, [], [], None),
        )
        self.assertEqual((s.messages, s.current.text), ([], []))

    def test_wrongly_typed_items_and_fields_are_left_out(self) -> None:
        """Plan entries, commands and tool call fields of the wrong type are dropped; the rest is kept."""
        s = self.session
        self.update(
            sessionUpdate="plan",
            entries=[1, None, {"content": 3}, {"content": "ok", "status": "pending"}],
        )
        self.update(
            sessionUpdate="available_commands_update",
            availableCommands=[None, 1, {"name": 2}, {"name": "web"}],
        )
        self.update(
            sessionUpdate="tool_call", toolCallId="t1", title="Edit", kind="edit"
        )
        self.update(
            sessionUpdate="tool_call_update",
            toolCallId="t1",
            status=7,
            title=5,
            content=[{"type": "diff", "path": 1, "newText": "x"}],
        )
        self.assertEqual(s.plan, [{"content": "ok", "status": "pending"}])
        self.assertEqual(s.commands, [{"name": "web"}])
        view = self.updates.tool_call_view(s.tool_calls["t1"])
        self.assertEqual(
            (view["title"], view["status"], view["has_diff"]),
            ("Edit", "pending", False),
        )
        self.assertEqual(
            self.unknown(),
            ["tool call fields of the wrong type left out: content, status, title"],
        )
