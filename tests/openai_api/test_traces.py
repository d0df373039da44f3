"""
A session's traces and subagents through the ``/v1`` door, driven by the
``openai`` SDK against a real daemon running the fake ACP agent.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from twisted.internet.defer import gatherResults, inlineCallbacks

from sandboxd.openai_api import artifacts
from tests.openai_api.sdk import CALL_SECONDS, OpenAICase, caught
from tests.openai_api.test_artifacts import run_turn

#: How long a test holds a turn's file copy while it watches for an early end.
HELD_SECONDS = 1.0


class TraceTests(OpenAICase):
    """``client.beta.agents.sessions.traces``."""

    @inlineCallbacks
    def test_one_trace_per_ended_turn(self) -> Any:
        """
        Each ended turn is one trace: an OTLP/JSON export with one
        ``agent.turn`` span timed from the turn's start to its end, its
        status and item count as attributes and none of its text; ids are
        stable from call to call, newest first by default.
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            session = sessions.create(**self.session_body())
            seen = [
                [e.type for e in run_turn(client, session.id, "echo secret-words-one")],
                [e.type for e in run_turn(client, session.id, "echo secret-words-two")],
            ]
            return (
                list(sessions.traces.list(session.id)),
                list(sessions.traces.list(session.id, order="asc")),
                list(sessions.turns.list(session.id, order="asc")),
                [
                    list(sessions.turns.items.list(t.id, session_id=session.id))
                    for t in sessions.turns.list(session.id, order="asc")
                ],
                session,
                seen,
            )

        traces, ascending, turns, items, session, seen = yield self.sdk(run)
        # Rare in full runs: one trace after two turns.  Say what the
        # turns were and what each stream saw, should it happen again.
        told = {
            "turns": [(t.id, t.status, t.started_at, t.completed_at) for t in turns],
            "streams": seen,
        }
        self.assertEqual(len(traces), 2, told)
        self.assertEqual([t.id for t in reversed(traces)], [t.id for t in ascending])
        for trace, turn, turn_items in zip(ascending, turns, items, strict=True):
            self.assertEqual(trace.object, "agent.session.trace")
            self.assertEqual(trace.session_id, session.id)
            self.assertRegex(trace.id, r"^trace_[0-9a-f]{24}$")
            (resource,) = trace.otlp["resourceSpans"]
            (scope,) = resource["scopeSpans"]
            (span,) = scope["spans"]
            self.assertEqual(span["name"], "agent.turn")
            self.assertRegex(span["traceId"], r"^[0-9a-f]{32}$")
            self.assertRegex(span["spanId"], r"^[0-9a-f]{16}$")
            start, end = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
            self.assertLessEqual(start, end)
            self.assertLessEqual(turn.started_at, end // 10**9 + 1)
            attrs = {a["key"]: a["value"] for a in span["attributes"]}
            self.assertEqual(attrs["turn.id"], {"stringValue": turn.id})
            self.assertEqual(attrs["turn.status"], {"stringValue": "completed"})
            self.assertEqual(attrs["turn.items"], {"intValue": str(len(turn_items))})
            self.assertEqual(span["status"], {"code": 1})
            self.assertNotIn("secret-words", json.dumps(trace.otlp))

    @inlineCallbacks
    def test_turn_seen_over_is_traced(self) -> Any:
        """
        A client that has read a turn's end (its ``turn.completed`` and the
        session's ``idle``) and then lists traces finds that turn's trace,
        however long the daemon takes to copy the files the turn wrote: the
        end is not announced while the copy runs.  The copy is held here
        until the client has listed the traces after the turn's end, or for
        a second when the end does not come meanwhile.
        """
        client = self.client()
        sessions = client.beta.agents.sessions
        target = os.path.join(self.base_dir, "out.txt")
        copying, release, looked = (
            threading.Event(),
            threading.Event(),
            threading.Event(),
        )
        copy_files = artifacts.copy_files

        def held_copy(*args: Any) -> Any:
            copying.set()
            release.wait(CALL_SECONDS)
            return copy_files(*args)

        self.patch(artifacts, "copy_files", held_copy)

        def turn() -> Any:
            session = sessions.create(**self.session_body())
            try:
                events = run_turn(client, session.id, f"write {target} traced")
                held = not release.is_set()
                traces = list(sessions.traces.list(session.id))
            finally:
                looked.set()
            return [e.type for e in events], traces, held, session.id

        def hold() -> None:
            if copying.wait(CALL_SECONDS):
                looked.wait(HELD_SECONDS)
            release.set()

        (types, traces, held, session_id), _ = yield gatherResults(
            [self.sdk(turn), self.sdk(hold)]
        )
        listed = yield self.sdk(lambda: list(sessions.artifacts.list(session_id)))
        self.assertTrue(copying.is_set())
        self.assertFalse(held, "the turn's end was announced while its copy was held")
        self.assertEqual(
            types[-2:], ["agent.session.turn.completed", "agent.session.idle"]
        )
        self.assertEqual(len(traces), 1)
        (span,) = traces[0].otlp["resourceSpans"][0]["scopeSpans"][0]["spans"]
        attrs = {a["key"]: a["value"] for a in span["attributes"]}
        self.assertEqual(attrs["turn.status"], {"stringValue": "completed"})
        self.assertEqual([a.path for a in listed], [target])

    @inlineCallbacks
    def test_other_owner_and_no_turns(self) -> Any:
        """A session without turns has no traces; another identity gets 404."""
        client = self.client()
        theirs = self.client("o-token")

        def run() -> Any:
            session = client.beta.agents.sessions.create(**self.session_body())
            return (
                list(client.beta.agents.sessions.traces.list(session.id)),
                caught(
                    lambda: list(theirs.beta.agents.sessions.traces.list(session.id))
                ),
            )

        empty, foreign = yield self.sdk(run)
        self.assertEqual(empty, [])
        self.assertEqual(foreign.status_code, 404)


class SubagentTests(OpenAICase):
    """``client.beta.agents.sessions.subagents``: an ACP agent reports none."""

    @inlineCallbacks
    def test_none_listed_none_found(self) -> Any:
        """
        The list is empty, even after a turn; any subagent id, its turns
        and items are 404 ``not_found`` (final, ``x-should-retry: false``).
        """
        client = self.client()
        subagents = client.beta.agents.sessions.subagents

        def run() -> Any:
            session = client.beta.agents.sessions.create(**self.session_body())
            run_turn(client, session.id, "echo hi")
            sid = session.id
            return (
                list(subagents.list(sid)),
                [
                    caught(call)
                    for call in (
                        lambda: subagents.retrieve("sub_x", session_id=sid),
                        lambda: list(subagents.items.list("sub_x", session_id=sid)),
                        lambda: list(subagents.turns.list("sub_x", session_id=sid)),
                        lambda: subagents.turns.retrieve(
                            "turn_x", session_id=sid, subagent_id="sub_x"
                        ),
                        lambda: list(
                            subagents.turns.items.list(
                                "turn_x", session_id=sid, subagent_id="sub_x"
                            )
                        ),
                    )
                ],
                caught(lambda: list(subagents.list("agsess_unknown"))),
            )

        listed, refused, unknown_session = yield self.sdk(run)
        self.assertEqual(listed, [])
        for error in refused:
            self.assertEqual(error.status_code, 404)
            self.assertEqual(error.body["code"], "not_found")
            self.assertEqual(error.body["param"], "subagent_id")
            self.assertEqual(error.response.headers["x-should-retry"], "false")
        self.assertEqual(unknown_session.status_code, 404)
        self.assertEqual(unknown_session.body["param"], "session_id")
