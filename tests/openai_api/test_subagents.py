"""
A headless CLI's subagents through the ``/v1`` door, driven by the official
``openai`` SDK: what Claude Code and Qwen Code (faked on PATH) report of a
subagent a ``Task`` call started is the session's subagent, with its own
items and turns, and none of it is the agent's answer.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.eventlog import json_size
from sandboxd.openai_api.subagent_records import (
    MAX_BYTES,
    MAX_SUBAGENTS,
    MAX_TEXT,
    Subagents,
)
from tests.agents.test_clibridge import fake_clis
from tests.openai_api.sdk import caught
from tests.openai_api.test_headless import FakeCLICase
from tests.openai_api.test_restart import RestartCase


def subagent_turn(client: Any, model: str, body: dict[str, Any]) -> Any:
    """A session of ``model`` whose one turn starts a subagent; its id."""
    return streamed_subagent_turn(client, model, body)[0]


def streamed_subagent_turn(
    client: Any, model: str, body: dict[str, Any]
) -> tuple[str, list[Any]]:
    """The same, and the session's events during the turn."""
    sessions = client.beta.agents.sessions
    session = sessions.create(**body)
    with sessions.stream(session.id, input="subagent all done") as stream:
        events = list(stream)
    return session.id, events


class SubagentTests(FakeCLICase):
    @inlineCallbacks
    def test_subagent(self) -> Any:
        """
        The subagent is listed with the name and instructions of the call
        that started it, closed once that call ended (the session's stream
        says when it was created and closed); its items are its
        prompt, reasoning, tool call (with its result) and answer, in one
        turn; the session's own items hold the ``Task`` call and the
        agent's answer only.
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def run(model: str) -> Any:
            sid, events = streamed_subagent_turn(
                client, model, self.session_body(agent={"model": model})
            )
            [sub] = list(sessions.subagents.list(sid))
            one = sessions.subagents.retrieve(sub.id, session_id=sid)
            items = list(
                sessions.subagents.items.list(sub.id, session_id=sid, order="asc")
            )
            [turn] = list(sessions.subagents.turns.list(sub.id, session_id=sid))
            again = sessions.subagents.turns.retrieve(
                turn.id, session_id=sid, subagent_id=sub.id
            )
            turn_items = list(
                sessions.subagents.turns.items.list(
                    turn.id, session_id=sid, subagent_id=sub.id, order="asc"
                )
            )
            own = list(sessions.items.list(sid, order="asc"))
            return sid, events, sub, one, items, turn, again, turn_items, own

        for model in ("claude", "qwen"):
            sid, events, sub, one, items, turn, again, turn_items, own = yield self.sdk(
                run, model
            )
            # The session's stream says when it starts and ends, as
            # OpenAI's sessions do.
            told = [
                (e.type, e.subagent.id, e.subagent.status)
                for e in events
                if e.type.startswith("agent.session.subagent.")
            ]
            self.assertEqual(
                told,
                [
                    ("agent.session.subagent.created", "tu_task", "active"),
                    ("agent.session.subagent.closed", "tu_task", "closed"),
                ],
            )
            self.assertEqual(sub.to_dict(), one.to_dict())
            self.assertEqual(
                (sub.id, sub.object, sub.session_id, sub.name, sub.status),
                ("tu_task", "agent.session.subagent", sid, "Look around", "closed"),
            )
            self.assertEqual(
                sub.to_dict()["instructions"],
                [{"type": "input_text", "text": "List the files"}],
            )
            self.assertGreaterEqual(sub.closed_at, sub.opened_at)
            shown = [i.to_dict() for i in items]
            self.assertEqual(
                [i["type"] for i in shown],
                ["message", "reasoning", "tool_call", "message"],
            )
            self.assertEqual(shown[0]["role"], "user")
            self.assertEqual(shown[0]["content"][0]["text"], "List the files")
            self.assertEqual(shown[1]["summary"][0]["text"], "I should look")
            self.assertEqual(
                (
                    shown[2]["tool_name"],
                    shown[2]["arguments"],
                    shown[2]["output"],
                    shown[2]["status"],
                ),
                ("Bash", {"command": "ls"}, "a.txt\n", "completed"),
            )
            self.assertEqual(shown[3]["content"][0]["text"], "found a.txt")
            self.assertEqual(
                (turn.id, turn.status, turn.to_dict()["subagent_id"]),
                ("turn_1_tu_task", "completed", "tu_task"),
            )
            self.assertEqual(again.to_dict(), turn.to_dict())
            self.assertEqual([i.to_dict() for i in turn_items], shown)
            self.assertEqual([i.type for i in own], ["mcp_call", "message"])
            self.assertEqual(own[1].output_text, "all done")

    @inlineCallbacks
    def test_unknown(self) -> Any:
        """An unknown subagent or turn is 404, naming the parameter."""
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            sid = subagent_turn(
                client, "claude", self.session_body(agent={"model": "claude"})
            )
            return (
                caught(lambda: sessions.subagents.retrieve("nope_1", session_id=sid)),
                caught(
                    lambda: sessions.subagents.turns.retrieve(
                        "turn_9_tu_task", session_id=sid, subagent_id="tu_task"
                    )
                ),
            )

        subagent, turn = yield self.sdk(run)
        self.assertEqual(
            (subagent.status_code, subagent.body["param"]), (404, "subagent_id")
        )
        self.assertEqual((turn.status_code, turn.body["param"]), (404, "turn_id"))

    @inlineCallbacks
    def test_codex(self) -> Any:
        """
        codex's collab calls name its subagents: listed with the spawn's
        prompt, closed by ``close_agent``, with no items (codex keeps their
        turns in its own session files); a turn that starts none lists none.
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def run(prompt: str) -> Any:
            session = sessions.create(**self.session_body(agent={"model": "codex"}))
            with sessions.stream(session.id, input=prompt) as stream:
                list(stream)
            found = list(sessions.subagents.list(session.id))
            items = [
                list(sessions.subagents.items.list(s.id, session_id=session.id))
                for s in found
            ]
            return found, items

        none, _ = yield self.sdk(run, "echo hi")
        self.assertEqual(none, [])
        [sub], [items] = yield self.sdk(run, "subagent all done")
        self.assertEqual((sub.id, sub.status), ("th_child_1", "closed"))
        self.assertEqual(
            sub.to_dict()["instructions"],
            [{"type": "input_text", "text": "List the files"}],
        )
        self.assertEqual(items, [])


class SubagentRestartTests(RestartCase):
    def setUp(self) -> Any:
        fake_clis(self)
        return super().setUp()

    @inlineCallbacks
    def test_kept(self) -> Any:
        """A session's subagents are in its file: listed after a restart."""
        client = self.client()
        body = self.session_body(agent={"model": "claude"})
        sid = yield self.sdk(subagent_turn, client, "claude", body)
        yield self.restart()
        sessions = self.client().beta.agents.sessions

        def after() -> Any:
            [sub] = list(sessions.subagents.list(sid))
            return sub, list(sessions.subagents.items.list(sub.id, session_id=sid))

        sub, items = yield self.sdk(after)
        self.assertEqual((sub.id, sub.status), ("tu_task", "closed"))
        self.assertEqual(len(items), 4)


class RecordTests(SynchronousTestCase):
    """The records' checks and bounds, in memory."""

    def records(self) -> Subagents:
        return Subagents(
            lambda value: json.loads(json.dumps(value).replace("s3cr3t", "***"))
        )

    def test_checked(self) -> None:
        """Bad ids and entry kinds are ignored; secrets masked; a result folds once."""
        subs = self.records()
        subs.take({"op": "entry", "id": "../x", "entry": {"kind": "message"}})
        subs.take({"op": "entry", "id": "a1", "entry": {"kind": "shell"}})
        subs.take("nonsense")
        call = {"kind": "tool_call", "call_id": "c", "name": "Bash", "arguments": {}}
        result = {
            "kind": "tool_result",
            "call_id": "c",
            "output": "s3cr3t",
            "ok": False,
        }
        subs.take({"op": "entry", "id": "a1", "name": "s3cr3t job", "entry": call})
        subs.take({"op": "entry", "id": "a1", "entry": result})
        subs.take({"op": "entry", "id": "a1", "entry": {**result, "output": "later"}})
        self.assertEqual(list(subs.records), ["a1"])
        record = subs.records["a1"]
        self.assertEqual(record["name"], "*** job")
        self.assertEqual(
            record["entries"],
            [{**call, "output": "***", "ok": False}],
        )

    def test_bounds(self) -> None:
        """Subagents, entries' bytes and a text's length are bounded."""
        subs = self.records()
        for n in range(MAX_SUBAGENTS + 5):
            subs.take({"op": "open", "id": f"s{n}"})
        self.assertEqual(len(subs.records), MAX_SUBAGENTS)
        text = {"kind": "message", "role": "assistant", "text": "x" * (MAX_TEXT * 2)}
        for _ in range(MAX_BYTES // MAX_TEXT + 5):
            subs.take({"op": "entry", "id": "s0", "entry": text})
        entries = subs.records["s0"]["entries"]
        self.assertEqual({len(e["text"]) for e in entries}, {MAX_TEXT})
        self.assertLessEqual(subs.size, MAX_BYTES)
        # As many as the bytes allow, the rest dropped.
        self.assertEqual(len(entries), MAX_BYTES // json_size(entries[0]))

    def test_arguments_cut(self) -> None:
        """A tool call's long arguments (a file written whole) are cut, not dropped."""
        subs = self.records()
        call = {
            "kind": "tool_call",
            "call_id": "w",
            "name": "Write",
            "arguments": {"file_path": "a", "content": "y" * (MAX_TEXT * 3)},
        }
        subs.take({"op": "entry", "id": "s1", "entry": call})
        [kept] = subs.records["s1"]["entries"]
        self.assertEqual(len(kept["arguments"]["content"]), MAX_TEXT)
        self.assertEqual(kept["arguments"]["file_path"], "a")
