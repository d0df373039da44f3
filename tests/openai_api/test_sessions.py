"""
The ``/v1`` door's sessions, events, turns, items and models, driven by the
official ``openai`` SDK against a real daemon running the fake ACP agent.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import httpx
from twisted.internet import reactor
from twisted.internet.defer import gatherResults, inlineCallbacks
from twisted.internet.task import deferLater
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.openai_api.registry import registry
from tests.openai_api.sdk import OpenAICase, caught, openai_policy


def _types(events: list[Any]) -> list[str]:
    return [e.type for e in events]


class SessionTests(OpenAICase):
    """Sessions over the ACP engine, as ``client.beta.agents.sessions`` sees them."""

    def create(self, client: Any, **extra: Any) -> Any:
        return client.beta.agents.sessions.create(**self.session_body(**extra))

    @inlineCallbacks
    def test_stream_one_turn(self) -> Any:
        """
        ``sessions.stream`` subscribes, sends the input and ends with the
        turn: the agent's chunks arrive as output_text deltas of one message
        item; the turn, its items and the session read back the same.
        """
        client = self.client()

        def run() -> Any:
            session = self.create(client, metadata={"case": "one"})
            with client.beta.agents.sessions.stream(
                session.id, input="echo hello world"
            ) as stream:
                events = list(stream)
            sessions = client.beta.agents.sessions
            return (
                session,
                events,
                sessions.retrieve(session.id),
                list(sessions.turns.list(session.id)),
                list(sessions.items.list(session.id, order="asc")),
                list(sessions.list()),
            )

        session, events, again, turns, items, listed = yield self.sdk(run)
        self.assertEqual(session.status, "idle")
        self.assertEqual(session.agent.model, "fake")
        self.assertEqual(session.environment.workspace_directory, self.base_dir)
        self.assertEqual(session.metadata, {"case": "one"})
        types = _types(events)
        self.assertEqual(types[0], "agent.session.in_progress")
        self.assertEqual(
            types[1:3], ["agent.session.turn.created", "agent.session.turn.in_progress"]
        )
        self.assertIn("agent.session.turn.item.added", types)
        self.assertEqual(
            types[-2:], ["agent.session.turn.completed", "agent.session.idle"]
        )
        deltas = [
            e.delta for e in events if e.type == "agent.session.turn.output_text.delta"
        ]
        self.assertEqual("".join(deltas), "hello world")
        self.assertGreater(len(deltas), 1)  # streamed as the agent sent it
        ids = [e.event_id for e in events]
        self.assertEqual(len(set(ids)), len(ids))
        self.assertEqual(again.status, "idle")
        self.assertEqual([t.status for t in turns], ["completed"])
        self.assertEqual(turns[0].session_id, session.id)
        [message] = items
        self.assertEqual(message.type, "message")
        self.assertEqual(message.phase, "final_answer")
        self.assertEqual(message.output_text, "hello world")
        self.assertEqual(message.turn_id, turns[0].id)
        self.assertEqual([s.id for s in listed], [session.id])

    @inlineCallbacks
    def test_create_with_stream(self) -> Any:
        """
        ``create(stream=True)`` with input answers the new session's events
        from its start (the seed answers JSON and no events).
        """
        client = self.client()

        def run() -> Any:
            stream = client.beta.agents.sessions.create(
                **self.session_body(input="echo streamed"), stream=True
            )
            with stream:
                return list(stream)

        events = yield self.sdk(run)
        types = [e.type for e in events]
        self.assertEqual(types[0], "agent.session.in_progress")
        self.assertEqual(types[-1], "agent.session.idle")
        deltas = [
            e.delta for e in events if e.type == "agent.session.turn.output_text.delta"
        ]
        self.assertEqual("".join(deltas), "streamed")

    @inlineCallbacks
    def test_turns_and_items_by_id(self) -> Any:
        """A turn and its items are found by id; an unknown turn is 404 not_found."""
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            session = self.create(client, input="echo first")
            with sessions.events.stream(session.id, extra_query={"after": "0"}) as s:
                list(s)
            turn = next(iter(sessions.turns.list(session.id)))
            return (
                sessions.turns.retrieve(turn.id, session_id=session.id),
                list(sessions.turns.items.list(turn.id, session_id=session.id)),
                caught(
                    lambda: sessions.turns.retrieve("turn_x", session_id=session.id)
                ),
            )

        turn, items, missing = yield self.sdk(run)
        self.assertEqual(turn.status, "completed")
        self.assertEqual(items[0].output_text, "first")
        self.assertEqual(missing.status_code, 404)
        self.assertEqual(missing.body["code"], "not_found")

    @inlineCallbacks
    def test_resume_after(self) -> Any:
        """
        Every frame has its own ``id:``; ``after`` (a seq or an event_id)
        replays exactly what followed, and the stream ends at the idle.
        """
        client = self.client()
        base = self.daemon.url + "/v1/agents/sessions/"
        headers = {"Authorization": "Bearer u-token"}

        def run() -> Any:
            session = self.create(client, input="echo resume me")
            frames = []
            with httpx.stream(
                "GET",
                base + session.id + "/events?after=0",
                headers=headers,
                timeout=30,
            ) as r:
                for line in r.iter_lines():
                    if line.startswith("id: "):
                        frames.append(int(line[4:]))
                    elif line.startswith("data: "):
                        frames.append(json.loads(line[6:]))
            ids = frames[0::2]
            datas = frames[1::2]
            middle = datas[3]["event_id"]
            with client.beta.agents.sessions.events.stream(
                session.id, extra_query={"after": middle}
            ) as s:
                rest = [e.event_id for e in s]
            return ids, datas, rest

        ids, datas, rest = yield self.sdk(run)
        self.assertEqual(ids, list(range(1, len(ids) + 1)))
        self.assertEqual(datas[-1]["type"], "agent.session.idle")
        self.assertEqual(rest, [d["event_id"] for d in datas[4:]])

    @inlineCallbacks
    def test_queue_and_cancel(self) -> Any:
        """
        A message sent during a turn queues the next turn; a cancel ends
        the running one (cancelled) and the queued one then runs.
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            session = self.create(client)
            with sessions.events.stream(session.id) as stream:
                sessions.events.create(
                    session.id,
                    events=[
                        {
                            "type": "agent.session.input.message",
                            "input": [
                                {
                                    "role": "user",
                                    "content": [{"type": "input_text", "text": "slow"}],
                                }
                            ],
                        }
                    ],
                )
                seen = []
                for event in stream:
                    seen.append(event)
                    if (
                        event.type == "agent.session.turn.output_text.delta"
                        and len(seen) < 12
                    ):
                        sessions.events.create(
                            session.id,
                            events=[
                                {
                                    "type": "agent.session.input.message",
                                    "input": "echo next",
                                }
                            ],
                        )
                        busy = sessions.retrieve(session.id)
                        sessions.events.create(
                            session.id, events=[{"type": "agent.session.input.cancel"}]
                        )
            return busy, seen, list(sessions.turns.list(session.id, order="asc"))

        busy, seen, turns = yield self.sdk(run)
        self.assertEqual(busy.status, "in_progress")
        self.assertEqual([t.status for t in turns], ["cancelled", "completed"])
        types = _types(seen)
        self.assertIn("agent.session.turn.cancelled", types)
        self.assertEqual(types.count("agent.session.turn.completed"), 1)
        self.assertEqual(types[-1], "agent.session.idle")

    @inlineCallbacks
    def test_restart_forgets_sessions(self) -> Any:
        """
        Without a state dir, sessions live with their agents, in memory:
        after a daemon restart an old session is 404 not_found, never
        half-restored (the seed's come back without their owner or agent).
        """
        client = self.client()
        session = yield self.sdk(
            lambda: client.beta.agents.sessions.create(**self.session_body())
        )
        yield self.daemon.stop()
        yield self.start()
        again = self.client()
        gone = yield self.sdk(
            lambda: caught(lambda: again.beta.agents.sessions.retrieve(session.id))
        )
        listed = yield self.sdk(lambda: list(again.beta.agents.sessions.list()))
        self.assertEqual((gone.status_code, gone.body["code"]), (404, "not_found"))
        self.assertEqual(listed, [])

    @inlineCallbacks
    def test_list_by_metadata(self) -> Any:
        """
        ``sessions.list(metadata={...})`` lists only the sessions whose
        metadata holds every pair (after an update too); a filter past
        OpenAI's bounds is a 400 naming ``metadata``.
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            red = self.create(client, metadata={"team": "red", "tier": "1"})
            blue = self.create(client, metadata={"team": "blue"})
            alone = [s.id for s in sessions.list(metadata={"team": "red"})]
            sessions.update(blue.id, metadata={"team": "red", "tier": "2"})
            return (
                red,
                blue,
                alone,
                [s.id for s in sessions.list(metadata={"team": "red"})],
                [s.id for s in sessions.list(metadata={"team": "red", "tier": "1"})],
                [s.id for s in sessions.list(metadata={"team": "green"})],
                caught(lambda: sessions.list(metadata={"k" * 65: "v"})),
            )

        red, blue, alone, both, one, none, bad = yield self.sdk(run)
        self.assertEqual(alone, [red.id])
        self.assertEqual(sorted(both), sorted([red.id, blue.id]))
        self.assertEqual(one, [red.id])
        self.assertEqual(none, [])
        self.assertEqual((bad.status_code, bad.body["param"]), (400, "metadata"))

    @inlineCallbacks
    def test_update_and_delete(self) -> Any:
        """Metadata changes; the agent cannot; a deleted session is gone."""
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            session = self.create(client)
            updated = sessions.update(session.id, metadata={"k": "v"})
            refused = caught(
                lambda: sessions.update(
                    session.id, extra_body={"agent": {"model": "x"}}
                )
            )
            deleted = sessions.delete(session.id)
            gone = caught(lambda: sessions.retrieve(session.id))
            return updated, refused, deleted, gone

        updated, refused, deleted, gone = yield self.sdk(run)
        self.assertEqual(updated.metadata, {"k": "v"})
        self.assertEqual(refused.status_code, 400)
        self.assertEqual(refused.body["param"], "agent")
        self.assertTrue(deleted.deleted)
        self.assertEqual(gone.status_code, 404)
        self.assertEqual(self.daemon.context.agents.get().live(), [])


class RedactionTests(OpenAICase):
    """An agent's keys never reach a client through its output."""

    SECRET = "sup3r-s3cret-value"

    def setUp(self) -> Any:
        os.environ["FAKE_SECRET"] = self.SECRET
        self.addCleanup(os.environ.pop, "FAKE_SECRET", None)
        return super().setUp()

    @inlineCallbacks
    def test_secret_split_across_chunks(self) -> Any:
        """
        The agent says its ``env_pass`` key in two chunks split inside it,
        and runs a command printing it: no delta, item or output holds any
        of it, the rest of the text is intact.
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            session = sessions.create(
                **self.session_body(agent={"model": "fake-secret"})
            )
            events = []
            for prompt in (
                f"echo before-{self.SECRET}-after",
                f"terminal printf {self.SECRET}",
            ):
                with sessions.stream(session.id, input=prompt) as stream:
                    events += list(stream)
            return events, list(sessions.items.list(session.id, order="asc"))

        events, items = yield self.sdk(run)
        deltas = [
            e.delta for e in events if e.type == "agent.session.turn.output_text.delta"
        ]
        # The first turn's two chunks, then the second turn's report.
        self.assertEqual(deltas[:2], ["before-", "[redacted]-after"])
        self.assertEqual(deltas[2], "exit=0 signal=None output='[redacted]'")
        output = [
            e.delta
            for e in events
            if e.type == "agent.output.command_execution_output.delta"
        ]
        self.assertEqual("".join(output), "[redacted]")
        shown = json.dumps([e.model_dump() for e in events]) + json.dumps(
            [i.model_dump() for i in items]
        )
        for piece in ("sup3r", "s3cret", "t-value"):
            self.assertNotIn(piece, shown)
        command = next(i for i in items if i.type == "command_execution")
        self.assertEqual(
            (command.command, command.output), ("printf [redacted]", "[redacted]")
        )


class ToolTableTests(OpenAICase):
    """What a session keeps to follow its tool calls."""

    @inlineCallbacks
    def test_done_tool_calls_let_go(self) -> Any:
        """
        A tool call done is no longer followed (its item stays listed): a
        session that runs for days does not keep every call it ever made.
        """
        sessions = self.client().beta.agents.sessions

        def run() -> Any:
            session = sessions.create(**self.session_body())
            for prompt in ("terminal printf one", "terminal printf two"):
                with sessions.stream(session.id, input=prompt) as stream:
                    list(stream)
            return session.id, list(sessions.items.list(session.id, order="asc"))

        sid, items = yield self.sdk(run)
        commands = [i.output for i in items if i.type == "command_execution"]
        self.assertEqual(commands, ["one", "two"])
        face = registry(self.daemon.context.agents.get()).faces[sid]
        self.assertEqual(face._tools, {})


def _message(text: str) -> dict[str, Any]:
    """An ``agent.session.input.message`` event of ``text``."""
    return {
        "type": "agent.session.input.message",
        "content": [{"type": "input_text", "text": text}],
    }


class RemovedIdentityTests(OpenAICase):
    """An identity a reload takes out of the policy keeps no agent working for it."""

    @inlineCallbacks
    def test_turns_of_a_removed_identity_never_run(self) -> Any:
        """
        ``other`` holds a turn open, queues a turn that writes a file and
        starts a background response; a reload takes ``other`` out of
        ``auth.tokens``.  Its agents are stopped at once (the running turn
        and the response cancelled, the queued turn dropped), so nothing is
        written once the held turn's gate opens; ``user``'s session, still
        in the policy, runs on.  With the token given back, the session
        shows what happened.
        """
        from sandboxd.agents.process import is_alive

        yield self.start_on_policy_file(openai_policy())
        other = self.client("o-token")
        mine = self.client()
        gate = os.path.join(self.base_dir, "gate")
        target = os.path.join(self.base_dir, "after-removal.txt")
        sessions = other.beta.agents.sessions

        def run() -> Any:
            kept = mine.beta.agents.sessions.create(**self.session_body())
            session = sessions.create(**self.session_body())
            sessions.events.create(
                session.id, events=[_message(f"waitfor {gate} echo first")]
            )
            sessions.events.create(
                session.id, events=[_message(f"write {target} late")]
            )
            response = other.responses.create(
                model="fake", input=f"waitfor {gate} echo resp", background=True
            )
            return kept, session, response

        kept, session, response = yield self.sdk(run)
        door = registry(self.daemon.context.agents.get())
        engines = [f.engine for f in door.faces.values() if f.owner == "other"]
        self.assertEqual(len(engines), 2)
        policy = openai_policy()
        policy["auth"]["tokens"] = [
            t for t in policy["auth"]["tokens"] if t["id"] != "other"
        ]
        self.reload_policy(policy)
        for engine in engines:
            yield engine.wait_closed()
            self.assertFalse(is_alive(engine.process.pid))
            self.assertEqual(engine.error["code"], "identity_removed")
        with open(gate, "w"):
            pass
        yield deferLater(reactor, 0.5, lambda: None)
        self.assertFalse(os.path.exists(target))
        self.reload_policy(openai_policy())

        def after() -> Any:
            return (
                [t.status for t in sessions.turns.list(session.id, order="asc")],
                other.responses.retrieve(response.id).status,
                mine.beta.agents.sessions.retrieve(kept.id).status,
            )

        turns, answered, still = yield self.sdk(after)
        self.assertEqual(turns, ["cancelled", "cancelled"])
        self.assertEqual(answered, "cancelled")
        self.assertEqual(still, "idle")


class RotatedTokenTests(OpenAICase):
    """A token rotated by a reload is not an identity removed."""

    @inlineCallbacks
    def test_sessions_stay_for_the_new_token(self) -> Any:
        """
        A reload that gives ``other`` a new token leaves its agent session
        open for the holder of the new one (the old one answers 401): a
        session belongs to its owner, not to the token that made it.
        """
        import hashlib

        from sandboxd.agents.process import is_alive

        yield self.start_on_policy_file(openai_policy())
        other = self.client("o-token")
        sessions = other.beta.agents.sessions

        def run() -> Any:
            session = sessions.create(**self.session_body())
            with sessions.stream(session.id, input="echo first") as stream:
                list(stream)
            return session

        session = yield self.sdk(run)
        door = registry(self.daemon.context.agents.get())
        [engine] = [f.engine for f in door.faces.values() if f.owner == "other"]
        policy = openai_policy()
        for token in policy["auth"]["tokens"]:
            if token["id"] == "other":
                del token["token_env"]
                token["token_sha256"] = hashlib.sha256(b"o-rotated").hexdigest()
        self.reload_policy(policy)
        yield deferLater(reactor, 0.5, lambda: None)
        self.assertIsNone(engine.error)
        self.assertTrue(is_alive(engine.process.pid))
        rotated = self.client("o-rotated")
        status = yield self.sdk(
            lambda: rotated.beta.agents.sessions.retrieve(session.id).status
        )
        self.assertEqual(status, "idle")
        old = yield self.request("GET", "/capabilities", token="o-token")
        self.assertEqual(old.status, 401)


def _minting_policy() -> dict[str, Any]:
    """:func:`openai_policy`, ``user`` also minting capability links."""
    policy = openai_policy()
    policy["auth"]["tokens"][0]["scopes"] = ["agents:use", "links:mint"]
    return policy


class StreamEndTests(OpenAICase):
    """A ``/v1`` stream the daemon ends itself ends as the SDK reads an error."""

    policy = _minting_policy()

    @inlineCallbacks
    def test_revoked_link_ends_streams_with_openai_error(self) -> Any:
        """
        A capability link used as ``api_key`` is revoked while a streamed
        response and a session's stream run: each ends with OpenAI's
        ``error`` event, which the SDK raises as an ``APIError`` carrying
        the code ``link_invalid`` and the message (not "An error occurred
        during streaming").
        """
        from openai import APIError

        url = self.daemon.url + "/auth/links"
        mine = {"Authorization": "Bearer u-token"}

        def mint() -> Any:
            reply = httpx.post(
                url, headers=mine, json={"audience": "console", "ttl_seconds": 600}
            )
            assert reply.status_code == 201, reply.text
            return reply.json()

        def revoked_while(events: Any, link: dict[str, Any]) -> Any:
            seen = []
            try:
                for event in events:
                    seen.append(event.type)
                    if len(seen) == 4:
                        httpx.delete(f"{url}/{link['link_id']}", headers=mine)
            except APIError as e:
                return seen, e
            return seen, None

        def run() -> Any:
            link = mint()
            linked = self.client(link["token"])
            streamed = revoked_while(
                linked.responses.create(model="fake", input="slow", stream=True), link
            )
            link = mint()
            linked = self.client(link["token"])
            session = linked.beta.agents.sessions.create(**self.session_body())
            with linked.beta.agents.sessions.stream(session.id, input="slow") as stream:
                followed = revoked_while(stream, link)
            return streamed, followed

        for seen, error in (yield self.sdk(run)):
            self.assertIsInstance(error, APIError, seen)
            self.assertEqual(error.code, "link_invalid")
            self.assertIn("revoked", error.message)
            self.assertEqual(error.type, "authentication_error")


class DoorTests(OpenAICase):
    """The door's framing: errors, owners, scopes, idempotency, audit."""

    policy = openai_policy(audit="all")

    @inlineCallbacks
    def test_errors_in_openai_envelope(self) -> Any:
        """
        Handler errors and gate refusals alike answer OpenAI's envelope with
        the SPEC code in ``code`` and ``x-should-retry: false``.
        """
        client = self.client()
        reader = self.client("r-token")
        sessions = client.beta.agents.sessions

        def run() -> Any:
            return (
                caught(lambda: sessions.retrieve("agsess_nope")),
                caught(
                    lambda: sessions.create(
                        **self.session_body(
                            agent={"model": "no-such", "adapter": "no-such"}
                        )
                    )
                ),
                caught(
                    lambda: sessions.create(
                        **self.session_body(environment={"type": "openai_hosted"})
                    )
                ),
                caught(lambda: reader.beta.agents.sessions.list()),
                caught(lambda: self.client("wrong").models.list()),
                httpx.get(
                    self.daemon.url + "/v1/nowhere",
                    headers={"Authorization": "Bearer u-token"},
                ),
            )

        missing, unknown, hosted, scope, token, nowhere = yield self.sdk(run)
        self.assertEqual(missing.status_code, 404)
        self.assertEqual(
            missing.body,
            {
                "message": "No session found with id 'agsess_nope'",
                "type": "not_found_error",
                "param": "session_id",
                "code": "not_found",
            },
        )
        self.assertEqual(missing.response.headers["x-should-retry"], "false")
        self.assertEqual(
            (unknown.status_code, unknown.body["code"]), (404, "not_found")
        )
        self.assertEqual(
            (hosted.status_code, hosted.body["param"]), (400, "environment.type")
        )
        self.assertEqual(scope.status_code, 403)
        self.assertEqual(scope.body["code"], "missing_scope")
        self.assertEqual(scope.body["type"], "permission_error")
        self.assertEqual((token.status_code, token.body["code"]), (401, "unauthorized"))
        self.assertEqual(nowhere.status_code, 404)
        self.assertEqual(nowhere.json()["error"]["code"], "not_found")

    @inlineCallbacks
    def test_answers_marked_local(self) -> Any:
        """
        What the door's handlers answer, errors included, carries
        ``X-Agent-Sandbox-Local: 1`` as agent-sandbox-server's does; the
        gate's refusals (a wrong token) do not.
        """
        client = self.client()

        def run() -> Any:
            return (
                client.models.with_raw_response.list(),
                caught(lambda: client.beta.agents.sessions.retrieve("agsess_nope")),
                caught(lambda: self.client("wrong").models.list()),
            )

        listed, missing, refused = yield self.sdk(run)
        self.assertEqual(listed.headers.get("X-Agent-Sandbox-Local"), "1")
        self.assertEqual(missing.status_code, 404)
        self.assertEqual(missing.response.headers.get("X-Agent-Sandbox-Local"), "1")
        self.assertEqual(refused.status_code, 401)
        self.assertIsNone(refused.response.headers.get("X-Agent-Sandbox-Local"))

    @inlineCallbacks
    def test_another_owner_sees_nothing(self) -> Any:
        """A session is its creator's: another identity gets 404 and an empty list."""
        mine = self.client()
        theirs = self.client("o-token")

        def run() -> Any:
            session = mine.beta.agents.sessions.create(**self.session_body())
            return (
                caught(lambda: theirs.beta.agents.sessions.retrieve(session.id)),
                list(theirs.beta.agents.sessions.list()),
            )

        refused, listed = yield self.sdk(run)
        self.assertEqual(refused.status_code, 404)
        self.assertEqual(listed, [])

    @inlineCallbacks
    def test_idempotency(self) -> Any:
        """
        The same Idempotency-Key and body answer the first result again
        (one session, one turn); another body is 409 idempotency.mismatch.
        """
        client = self.client()
        sessions = client.beta.agents.sessions
        key = {"Idempotency-Key": "k-1"}

        def run() -> Any:
            first = sessions.create(**self.session_body(), extra_headers=key)
            second = sessions.create(**self.session_body(), extra_headers=key)
            other = caught(
                lambda: sessions.create(
                    **self.session_body(metadata={"a": "b"}), extra_headers=key
                )
            )
            with sessions.events.stream(first.id) as stream:
                for _ in range(2):
                    sessions.events.create(
                        first.id,
                        events=[
                            {
                                "type": "agent.session.input.message",
                                "input": "echo once",
                            }
                        ],
                        idempotency_key="e-1",
                    )
                list(stream)
            return first, second, other, list(sessions.turns.list(first.id))

        first, second, other, turns = yield self.sdk(run)
        self.assertEqual(first.id, second.id)
        self.assertEqual(other.status_code, 409)
        self.assertEqual(other.body["code"], "idempotency.mismatch")
        self.assertEqual(other.response.headers["x-should-retry"], "false")
        self.assertEqual(len(turns), 1)
        self.assertEqual(len(self.daemon.context.agents.get().live()), 1)

    @inlineCallbacks
    def test_idempotency_of_concurrent_creates(self) -> Any:
        """
        Creates sent at once with one Idempotency-Key and body (a proxy
        retrying a call that looked lost) start one agent: the duplicates
        wait for the first and are answered its response or session; a
        concurrent one with another body is 409 idempotency.mismatch.
        """
        client = self.client()
        key = {"Idempotency-Key": "race-1"}
        responses = [
            self.sdk(
                client.responses.create,
                model="fake",
                input="echo race",
                extra_headers=key,
            )
            for _ in range(4)
        ]
        answered = yield gatherResults(responses)
        self.assertEqual(len({r.id for r in answered}), 1)
        self.assertEqual([r.output_text for r in answered], ["race"] * 4)
        key = {"Idempotency-Key": "race-2"}
        sessions = [
            self.sdk(
                client.beta.agents.sessions.create,
                **self.session_body(),
                extra_headers=key,
            )
            for _ in range(4)
        ]
        sessions.append(
            self.sdk(
                caught,
                lambda: client.beta.agents.sessions.create(
                    **self.session_body(metadata={"a": "b"}), extra_headers=key
                ),
            )
        )
        *made, other = yield gatherResults(sessions)
        self.assertEqual(len({s.id for s in made}), 1)
        self.assertEqual(other.status_code, 409)
        self.assertEqual(other.body["code"], "idempotency.mismatch")
        # One conversation's agent and one session's.
        self.assertEqual(len(self.daemon.context.agents.get().sessions), 2)

    @inlineCallbacks
    def test_audited_via_openai(self) -> Any:
        """Each call is one audit line naming its endpoint id, ``via: openai``."""
        client = self.client()

        def run() -> Any:
            client.beta.agents.sessions.create(**self.session_body())
            caught(lambda: client.beta.agents.sessions.retrieve("agsess_x"))

        yield self.sdk(run)
        lines = [
            x for x in self.audit_lines() if x.get("endpoint", "").startswith("agents_")
        ]
        self.assertEqual(
            [(x["endpoint"], x["via"], x["status"], x["identity"]) for x in lines],
            [
                ("agents_sessions_create", "openai", 200, "user"),
                ("agents_sessions_get", "openai", 404, "user"),
            ],
        )


def _with_an_absent_agent() -> dict[str, Any]:
    policy = openai_policy()
    catalog = dict(policy["agents"]["catalog"])
    catalog["absent"] = {"name": "Absent", "command": ["no-such-agent-cli"]}
    policy["agents"] = {**policy["agents"], "catalog": catalog}
    return policy


class ModelTests(OpenAICase):
    """``client.models`` lists the agents the caller may run; deletion is refused."""

    policy = _with_an_absent_agent()

    @inlineCallbacks
    def test_installed(self) -> Any:
        """
        Each model says whether its agent is installed (as agent-sandbox-
        server's do): a response naming one that is not cannot start.
        """
        client = self.client()

        def run() -> Any:
            listed = {m.id: m for m in client.models.list()}
            absent = caught(lambda: client.responses.create(model="absent", input="x"))
            return listed, client.models.retrieve("absent"), absent

        listed, retrieved, absent = yield self.sdk(run)
        self.assertEqual(
            listed["fake"].model_extra["x_agent_sandbox"],
            {
                "local": True,
                "compute": "none",
                "differences": [],
                "kind": "adapter",
                "installed": True,
            },
        )
        self.assertIs(
            listed["absent"].model_extra["x_agent_sandbox"]["installed"], False
        )
        self.assertIs(retrieved.model_extra["x_agent_sandbox"]["installed"], False)
        self.assertEqual(absent.status_code, 503)

    @inlineCallbacks
    def test_models(self) -> Any:
        """The policy's agents are models; an unknown one is 404; delete is refused for good."""
        client = self.client()

        def run() -> Any:
            return (
                [m.id for m in client.models.list()],
                client.models.retrieve("fake"),
                caught(lambda: client.models.retrieve("gpt-nope")),
                caught(lambda: client.models.delete("fake")),
                caught(
                    lambda: client.responses.input_tokens.count(model="fake", input="x")
                ),
            )

        ids, fake, unknown, delete, count = yield self.sdk(run)
        self.assertIn("fake", ids)
        self.assertEqual((fake.id, fake.object), ("fake", "model"))
        self.assertEqual(unknown.status_code, 404)
        for refused in (delete, count):
            self.assertEqual(refused.status_code, 404)
            self.assertEqual(refused.body["code"], "agents.not_implemented_locally")
            self.assertEqual(
                refused.body["x_agent_sandbox"]["runtimes"], "/v1/agents/runtimes"
            )
            self.assertEqual(refused.response.headers["x-should-retry"], "false")


class ShapeTests(OpenAICase):
    """What the door sends validates against the SDK's own models, strictly."""

    @inlineCallbacks
    def test_objects_and_events_validate(self) -> Any:
        """
        Sessions, turns, items, every streamed event and a response parse
        with the SDK's pydantic models (``model_validate``, which refuses a
        missing field or an unknown ``type``, unlike the SDK's lenient read).
        """
        from openai.types.beta.agent_session import AgentSession
        from openai.types.beta.agent_session_event import AgentSessionEvent
        from openai.types.beta.agent_session_item import AgentSessionItem
        from openai.types.beta.agents.sessions.turn import Turn
        from openai.types.responses import Response
        from pydantic import TypeAdapter

        client = self.client()
        sessions = client.beta.agents.sessions
        base = self.daemon.url + "/v1/agents/sessions/"
        headers = {"Authorization": "Bearer u-token"}

        def get(session_id: str, url: str) -> Any:
            return httpx.get(base + session_id + url, headers=headers).json()

        def run() -> Any:
            session = sessions.create(**self.session_body(input="think"))
            with sessions.events.stream(session.id, extra_query={"after": "0"}) as s:
                list(s)
            with sessions.stream(session.id, input="terminal printf hi") as s:
                list(s)
            events = []
            with httpx.stream(
                "GET",
                base + session.id + "/events?after=0",
                headers=headers,
                timeout=30,
            ) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
            response = client.responses.with_raw_response.create(
                model="fake", input="echo x"
            )
            return (
                get(session.id, ""),
                events,
                get(session.id, "/turns")["data"],
                get(session.id, "/items")["data"],
                response.http_response.json(),
            )

        session, events, turns, items, response = yield self.sdk(run)
        AgentSession.model_validate(session)
        adapter = TypeAdapter(AgentSessionEvent)
        for event in events:
            adapter.validate_python(event)
        # (The events say how the turns went, should this ever fail: it did
        # once in a full run on a busy machine, unexplained.)
        self.assertEqual(len(turns), 2, [(e["type"], e.get("turn_id")) for e in events])
        for turn in turns:
            Turn.model_validate(turn)
        kinds = set()
        for item in items:
            TypeAdapter(AgentSessionItem).validate_python(item)
            kinds.add(item["type"])
        self.assertEqual(kinds, {"reasoning", "message", "command_execution"})
        [command] = [i for i in items if i["type"] == "command_execution"]
        self.assertEqual(
            (command["command"], command["output"], command["exit_code"]),
            ("printf hi", "hi", 0),
        )
        Response.model_validate(response)
        streamed = [
            e["delta"]
            for e in events
            if e["type"] == "agent.output.command_execution_output.delta"
        ]
        self.assertEqual(streamed, ["hi"])


class NotToolsTests(SynchronousTestCase):
    """The door's routes stay out of the MCP door's tools."""

    def test_door_routes_are_not_mcp_tools(self) -> None:
        """No ``/v1`` endpoint is an MCP tool; the native agents routes are."""
        from sandboxd.mcp.tools import is_tool
        from sandboxd.routes import builtin_table, load_all

        table = builtin_table()
        load_all(table)
        tools = {e.id for e in table if is_tool(e)}
        self.assertIn("agents_prompt", tools)
        self.assertEqual({e.id for e in table if e.door == "openai"} & tools, set())


class UnansweringAgentTests(OpenAICase):
    """An agent that never answers, as the ``openai`` SDK sees it."""

    policy = openai_policy(
        limits={"init_timeout_seconds": 2, "max_turn_seconds": 2, "max_sessions": 1}
    )

    @inlineCallbacks
    def test_silent_initialize(self) -> Any:
        """
        ``sessions.create`` for an agent that never answers ``initialize``:
        504 ``agent_timeout`` within the bound, and the session slot is free
        again for a working agent.
        """
        from openai import APIStatusError

        client = self.client()
        started = reactor.seconds()
        error = yield self.sdk(
            caught,
            lambda: client.beta.agents.sessions.create(
                **self.session_body(agent={"model": "script-silent"})
            ),
        )
        self.assertIsInstance(error, APIStatusError)
        self.assertEqual(error.status_code, 504)
        self.assertEqual(error.body["code"], "agent_timeout")
        self.assertLess(reactor.seconds() - started, 15)

    @inlineCallbacks
    def test_turn_never_ended(self) -> Any:
        """
        A turn the agent never ends (and whose cancel it ignores): the
        SDK's stream lives through the quiet (a heartbeat every 4 s) and
        ends by itself with the turn cancelled after ``max_turn_seconds``
        and the cancel's grace (5 s here, not the 10 s default: still longer
        than a heartbeat's period, so the quiet holds one).
        """
        from sandboxd.policy import defaults

        self.patch(defaults, "AGENT_CANCEL_GRACE_SECONDS", 5.0)
        client = self.client()

        def run() -> Any:
            session = client.beta.agents.sessions.create(
                **self.session_body(agent={"model": "script-grandchild"})
            )
            with client.beta.agents.sessions.stream(session.id, input="go") as stream:
                return [event.type for event in stream]

        started = reactor.seconds()
        types = yield self.sdk(run)
        self.assertLess(reactor.seconds() - started, 30)
        self.assertIn("agent.session.turn.cancelled", types)
        self.assertEqual(types[-1], "agent.session.idle")


class AgentSelectionTests(OpenAICase):
    """
    Which agent runs is chosen as agent-sandbox-server chooses its runtime:
    ``X-ABX-Adapter``, ``adapter``/``runtime``, a model that names an
    agent, else the default agent, which is handed a model naming no agent.
    """

    def post(self, path: str, body: dict[str, Any], **headers: str) -> Any:
        """A raw JSON call of the door, as the user's own."""
        return httpx.post(
            self.daemon.url + path,
            json=body,
            headers={"Authorization": "Bearer u-token", **headers},
            timeout=30,
        )

    def model_of(self, session_id: str) -> Any:
        """The model the agent of ``session_id`` was set to."""
        from sandboxd.openai_api.registry import registry

        engine = registry(self.daemon.context.agents.get()).faces[session_id].engine
        (option,) = [o for o in engine.config_options if o["category"] == "model"]
        return option["currentValue"]

    def environment(self) -> dict[str, Any]:
        return {"type": "self_hosted", "workspace_directory": self.base_dir}

    @inlineCallbacks
    def test_adapter_names_the_agent(self) -> Any:
        """
        ``adapter`` (top level), the header, or a seed name of an agent pick
        it; the ``model`` beside it goes to the agent; an unknown agent is 404.
        """

        def run() -> Any:
            plain = self.post(
                "/v1/agents/sessions",
                {"adapter": "fake", "environment": self.environment()},
            )
            plain_id = plain.json()["id"]
            httpx.delete(
                self.daemon.url + f"/v1/agents/sessions/{plain_id}",
                headers={"Authorization": "Bearer u-token"},
            )
            headed = self.post(
                "/v1/agents/sessions",
                {"agent": {"model": "large"}, "environment": self.environment()},
                **{"X-ABX-Adapter": "fake"},
            )
            headed_model = self.model_of(headed.json()["id"])
            return (
                plain,
                headed,
                headed_model,
                self.post(
                    "/v1/agents/sessions",
                    {"adapter": "claude-code", "environment": self.environment()},
                ),
                self.post(
                    "/v1/agents/sessions",
                    {"runtime": "no-such", "environment": self.environment()},
                ),
                self.post(
                    "/v1/agents/sessions",
                    {
                        "agent": {"model": "qwen-code"},
                        "environment": self.environment(),
                    },
                ),
            )

        plain, headed, headed_model, claude, unknown, qwen = yield self.sdk(run)
        self.assertEqual(plain.status_code, 200, plain.text)
        self.assertEqual(plain.headers["x-agent-sandbox-local"], "1")
        self.assertEqual(
            (plain.json()["agent"]["id"], plain.json()["agent"]["model"]),
            ("fake", "fake"),
        )
        self.assertEqual(headed.status_code, 200, headed.text)
        self.assertEqual(
            (headed.json()["agent"]["id"], headed.json()["agent"]["model"]),
            ("fake", "large"),
        )
        self.assertEqual(headed_model, "large")
        # agent-sandbox-server's claude-code is the catalogue's claude.
        self.assertEqual(claude.json()["error"]["code"], "agent_unavailable")
        self.assertIn("'claude'", claude.json()["error"]["message"])
        self.assertEqual(unknown.status_code, 404)
        self.assertEqual(unknown.json()["error"]["code"], "not_found")
        # An agent-sandbox-server runtime name is an agent, not a model for
        # the default one: qwen-code's CLI is not installed here.
        self.assertEqual(qwen.status_code, 503)
        self.assertEqual(qwen.json()["error"]["code"], "agent_unavailable")
        self.assertIn("'qwen-code'", qwen.json()["error"]["message"])

    @inlineCallbacks
    def test_default_agent_gets_the_model(self) -> Any:
        """
        A model naming no agent runs on the default agent
        (``$ABX_AGENTS_DEFAULT``), which is set to that model.
        """
        old = os.environ.get("ABX_AGENTS_DEFAULT")
        os.environ["ABX_AGENTS_DEFAULT"] = "fake"
        self.addCleanup(
            lambda: (
                os.environ.pop("ABX_AGENTS_DEFAULT", None)
                if old is None
                else os.environ.__setitem__("ABX_AGENTS_DEFAULT", old)
            )
        )

        def run() -> Any:
            made = self.post(
                "/v1/agents/sessions",
                {"agent": {"model": "large"}, "environment": self.environment()},
            )
            return made, self.model_of(made.json()["id"])

        made, model = yield self.sdk(run)
        self.assertEqual(made.status_code, 200, made.text)
        self.assertEqual(made.json()["agent"]["id"], "fake")
        self.assertEqual(model, "large")

    @inlineCallbacks
    def test_definition_and_response_take_adapter(self) -> Any:
        """
        A definition and a response take ``adapter`` with the model it is
        given; a definition's agent cannot change afterwards.
        """

        def run() -> Any:
            made = self.post("/v1/agents", {"model": "large", "adapter": "fake"})
            agent_id = made.json()["id"]
            changed = self.post(f"/v1/agents/{agent_id}", {"adapter": "claude"})
            session = self.post(
                "/v1/agents/sessions",
                {"agent_id": agent_id, "environment": self.environment()},
            )
            session_model = self.model_of(session.json()["id"])
            response = self.post(
                "/v1/responses",
                {"model": "large", "adapter": "fake", "input": "echo over there"},
            )
            return made, changed, session, session_model, response

        made, changed, session, session_model, response = yield self.sdk(run)
        self.assertEqual(made.status_code, 200, made.text)
        self.assertEqual(made.json()["model"], "large")
        self.assertEqual(made.headers["x-agent-sandbox-local"], "1")
        self.assertEqual(changed.status_code, 400)
        self.assertEqual(changed.json()["error"]["param"], "adapter")
        self.assertEqual(session.status_code, 200, session.text)
        self.assertEqual(session_model, "large")
        self.assertEqual(response.status_code, 200, response.text)
        self.assertEqual(response.json()["model"], "large")
        self.assertEqual(
            response.json()["output"][-1]["content"][0]["text"], "over there"
        )


class DefaultAgentTests(SynchronousTestCase):
    """The default agent, found as agent-sandbox-server finds its default runtime."""

    def test_environment_then_file_then_codex(self) -> None:
        """``$ABX_AGENTS_DEFAULT``, else the file's ``default`` or ``agents.default``."""
        from sandboxd.openai_api.runtimes import default_agent

        flat = self.mktemp()
        with open(flat, "w") as f:
            json.dump({"default": "claude"}, f)
        nested = self.mktemp()
        with open(nested, "w") as f:
            json.dump({"agents": {"default": "gemini"}}, f)
        self.assertEqual(default_agent({}), "codex")
        self.assertEqual(default_agent({"ABX_AGENTS_CONFIG": flat}), "claude")
        self.assertEqual(default_agent({"ABX_AGENTS_CONFIG": nested}), "gemini")
        self.assertEqual(
            default_agent({"ABX_AGENTS_CONFIG": nested, "ABX_AGENTS_DEFAULT": "x"}), "x"
        )
        self.assertEqual(default_agent({"ABX_AGENTS_CONFIG": flat + ".gone"}), "codex")

    def test_file_read_again_when_it_changes(self) -> None:
        """An edit of the file takes effect at the next request; no edit, no read."""
        from sandboxd.openai_api import runtimes

        path = self.mktemp()
        with open(path, "w") as f:
            json.dump({"default": "claude"}, f)
        env = {"ABX_AGENTS_CONFIG": path}
        self.assertEqual(runtimes.default_agent(env), "claude")
        reads = runtimes._configured.cache_info().misses
        self.assertEqual(runtimes.default_agent(env), "claude")
        self.assertEqual(runtimes._configured.cache_info().misses, reads)
        with open(path, "w") as f:
            json.dump({"default": "gemini", "note": "longer"}, f)
        self.assertEqual(runtimes.default_agent(env), "gemini")
        self.assertEqual(runtimes._configured.cache_info().misses, reads + 1)


class GapTests(OpenAICase):
    """A session's events resumed from before what its log still holds."""

    policy = openai_policy(limits={"max_event_bytes": 8192})

    @inlineCallbacks
    def test_gap_has_a_type(self) -> Any:
        """
        Resumed from before what the log kept, the stream starts with a
        ``gap`` that the SDK yields with ``type == "gap"`` and the range
        dropped, then the events kept.
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            session = sessions.create(**self.session_body())
            with sessions.stream(session.id, input="echo " + "z" * 6000) as stream:
                list(stream)
            with sessions.events.stream(session.id, extra_query={"after": "0"}) as s:
                return list(s)

        events = yield self.sdk(run)
        self.assertEqual(events[0].type, "gap")
        self.assertEqual(events[0].to_dict()["from"], 1)
        self.assertNotIn(None, [e.type for e in events])


class AgentGoneTests(OpenAICase):
    """A session whose agent died mid-turn takes the next message."""

    @inlineCallbacks
    def test_next_message_after_the_agent_exited(self) -> Any:
        """
        The agent exits mid-turn: the turn is ``failed``, the session is
        ``idle`` again (not failed for good), and the next message starts
        its agent again and completes, as after a restart.
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            session = sessions.create(**self.session_body())
            with sessions.stream(session.id, input="exit") as stream:
                list(stream)
            for _ in range(100):
                after_crash = sessions.retrieve(session.id)
                if after_crash.status != "in_progress":
                    break
                time.sleep(0.05)
            with sessions.stream(session.id, input="echo again") as stream:
                list(stream)
            turns = list(sessions.turns.list(session.id, order="asc"))
            texts = [i.output_text for i in sessions.items.list(session.id)]
            return after_crash, sessions.retrieve(session.id), turns, texts

        after_crash, last, turns, texts = yield self.sdk(run)
        self.assertEqual(after_crash.status, "idle")
        self.assertEqual([t.status for t in turns], ["failed", "completed"])
        self.assertEqual(last.status, "idle")
        self.assertIn("again", texts)
