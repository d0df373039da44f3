"""
What else of the ``/v1`` door outlives a restart with a state dir: stored
responses (read, listed, continued by their owner only), vaults and their
write-only credentials, templates, definitions and environments, the
``Idempotency-Key`` books of creates; the
secrets of a session's vaults still masked in what its agent says after
the restart; and the kept state read off the reactor, every ``/v1`` call
waiting for it while ``/health`` answers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import threading
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater

from sandboxd.openai_api import store
from sandboxd.policy import defaults
from tests.openai_api.sdk import caught, openai_policy
from tests.openai_api.test_restart import RestartCase
from tests.openai_api.vaults import TOKEN, bearer_vault, mcp_agent


class KeptResponsesTests(RestartCase):
    """Responses read back after a restart."""

    @inlineCallbacks
    def test_response_survives_restart(self) -> Any:
        """
        A finished response reads back after the restart with its output
        and input items, by its owner only (another identity gets 404); a
        background response whose turn the restart cut is ``failed``; the
        finished one is continued with ``previous_response_id`` (its agent
        starts again) and the continuation is kept in turn.
        """
        client = self.client()

        def before() -> Any:
            done = client.responses.create(model="fake", input="echo kept across")
            cut = client.responses.create(model="fake", input="slow", background=True)
            for _ in range(100):
                if client.responses.retrieve(cut.id).output:
                    break
                time.sleep(0.1)
            return done, cut

        done, cut = yield self.sdk(before)
        self.assertEqual(done.output_text, "kept across")
        yield self.restart()
        again = self.client()
        other = self.client("o-token")

        def after() -> Any:
            got = again.responses.retrieve(done.id)
            items = list(again.responses.input_items.list(done.id))
            lost = again.responses.retrieve(cut.id)
            replayed = [e.type for e in again.responses.retrieve(cut.id, stream=True)]
            hidden = caught(lambda: other.responses.retrieve(done.id))
            hidden_items = caught(lambda: other.responses.input_items.list(done.id))
            refused = caught(
                lambda: other.responses.create(
                    model="fake", input="echo no", previous_response_id=done.id
                )
            )
            follow = again.responses.create(
                model="fake", input="echo and on", previous_response_id=done.id
            )
            return got, items, lost, replayed, hidden, hidden_items, refused, follow

        (
            got,
            items,
            lost,
            replayed,
            hidden,
            hidden_items,
            refused,
            follow,
        ) = yield self.sdk(after)
        self.assertEqual((got.status, got.output_text), ("completed", "kept across"))
        self.assertEqual([i.content[0].text for i in items], ["echo kept across"])
        self.assertEqual(lost.status, "failed")
        self.assertIn("daemon stopped", lost.error.message)
        self.assertEqual([o.status for o in lost.output], ["incomplete"])
        # Followed again, the cut turn's message is closed before it fails.
        self.assertEqual(
            replayed[replayed.index("response.output_text.delta") + 1 :],
            [
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.failed",
            ],
        )
        for refusal in (hidden, hidden_items, refused):
            self.assertEqual(refusal.status_code, 404)
        self.assertEqual(follow.status, "completed")
        self.assertEqual(follow.output_text, "and on")
        self.assertEqual(follow.previous_response_id, done.id)
        # The conversation's file holds its responses (and no other session's).
        path = os.path.join(
            self.state_dir, "openai", "sessions", self._conversation(done.id) + ".json"
        )
        for _ in range(50):
            with open(path) as f:
                kept = json.load(f)
            if len(kept["responses"]) == 2:
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertEqual([r["id"] for r in kept["responses"]], [done.id, follow.id])
        self.assertTrue(kept["hidden"])
        yield self.restart()
        last = yield self.sdk(lambda: self.client().responses.retrieve(follow.id))
        self.assertEqual(last.output_text, "and on")
        listed = yield self.sdk(lambda: list(self.client().beta.agents.sessions.list()))
        self.assertEqual(listed, [])

    def _conversation(self, response_id: str) -> str:
        """The id of the hidden session behind a response."""
        from sandboxd.openai_api.registry import registry

        reg = registry(self.daemon.context.agents.get())
        found = reg.responses.get(response_id)
        if found is None:
            _record, face = reg.kept_responses[response_id]
            return face.id
        return str(found.face.id)

    @inlineCallbacks
    def test_bound_per_identity(self) -> Any:
        """
        Past the per-identity bound the caller's oldest response is
        forgotten, before and after a restart; another identity's stay.
        """
        self.patch(defaults, "OPENAI_RESPONSES_PER_IDENTITY", 2)
        client = self.client()
        other = self.client("o-token")

        def before() -> Any:
            theirs = other.responses.create(model="fake", input="echo theirs")
            mine = [
                client.responses.create(model="fake", input=f"echo {word}")
                for word in ("one", "two", "three")
            ]
            return theirs, mine

        theirs, mine = yield self.sdk(before)

        def read() -> Any:
            again, them = self.client(), self.client("o-token")
            return (
                [caught(lambda r=r: again.responses.retrieve(r.id)) for r in mine],
                them.responses.retrieve(theirs.id),
            )

        for restarted in (False, True):
            if restarted:
                yield self.restart()
            seen, kept = yield self.sdk(read)
            self.assertEqual(seen[0].status_code, 404)
            self.assertEqual([r.output_text for r in seen[1:]], ["two", "three"])
            self.assertEqual(kept.output_text, "theirs")

    @inlineCallbacks
    def test_deleted_response_stays_deleted(self) -> Any:
        """A response deleted before the restart is gone after it, file and all."""
        client = self.client()
        made = yield self.sdk(
            lambda: client.responses.create(model="fake", input="echo bye")
        )
        conversation = self._conversation(made.id)
        yield self.sdk(lambda: client.responses.delete(made.id))
        yield self.restart()
        gone = yield self.sdk(
            lambda: caught(lambda: self.client().responses.retrieve(made.id))
        )
        self.assertEqual(gone.status_code, 404)
        path = os.path.join(
            self.state_dir, "openai", "sessions", conversation + ".json"
        )
        self.assertFalse(os.path.exists(path))


class KeptRecordsTests(RestartCase):
    """Vaults, credentials, templates, definitions and environments."""

    policy = openai_policy(params={"mcp_servers": "http"})

    @inlineCallbacks
    def test_records_survive_restart(self) -> Any:
        """
        Each kind reads back after the restart with its owner (another
        identity lists none), a change made before it included; a
        template's inline file stages the same bytes; a credential still
        shows no secret; the file holding them is 0600 and
        written whole.
        """
        client = self.client()
        agents = client.beta.agents
        workspace = os.path.join(self.base_dir, "ws")
        os.makedirs(workspace)

        def before() -> Any:
            vault, credential = bearer_vault(agents)
            agents.vaults.update(vault.id, name="renamed")
            template = agents.environments.templates.create(
                name="t",
                env={"A": "1"},
                files=[
                    {
                        "type": "inline",
                        "path": "/workspace/a.txt",
                        "data": base64.b64encode(b"\x00AAA").decode(),
                    }
                ],
            )
            definition = agents.create(
                model="fake", name="helper", instructions="be kind"
            )
            environment = agents.environments.create(
                environment={
                    "type": "self_hosted",
                    "workspace_directory": workspace,
                    "env": {"B": "2"},
                }
            )
            return vault, credential, template, definition, environment

        vault, credential, template, definition, environment = yield self.sdk(before)
        yield self.restart()
        again = self.client().beta.agents
        other = self.client("o-token").beta.agents

        later = os.path.join(self.base_dir, "later")
        os.makedirs(later)

        def after() -> Any:
            again.environments.create(
                environment={
                    "type": "self_hosted",
                    "workspace_directory": later,
                    "environment_template_id": template.id,
                }
            )
            return (
                list(again.vaults.list()),
                list(again.vaults.credentials.list(vault.id)),
                list(again.environments.templates.list()),
                list(again.list()),
                list(again.environments.list()),
                (
                    list(other.vaults.list()),
                    list(other.environments.templates.list()),
                    list(other.list()),
                    list(other.environments.list()),
                ),
            )

        (
            vaults,
            credentials,
            templates,
            definitions,
            environments,
            others,
        ) = yield self.sdk(after)
        self.assertEqual([(v.id, v.name) for v in vaults], [(vault.id, "renamed")])
        self.assertEqual([c.id for c in credentials], [credential.id])
        self.assertNotIn(TOKEN, credentials[0].model_dump_json())
        self.assertEqual([t.id for t in templates], [template.id])
        self.assertEqual(
            [(d.id, d.instructions) for d in definitions], [(definition.id, "be kind")]
        )
        self.assertIn(environment.id, [e.id for e in environments])
        self.assertEqual(len(environments), 2)
        # The template's inline file came back as the bytes it was.
        with open(os.path.join(later, "a.txt"), "rb") as f:
            self.assertEqual(f.read(), b"\x00AAA")
        self.assertEqual(others, ([], [], [], []))
        folder = os.path.join(self.state_dir, "openai")
        # No Idempotency-Key was sent: that kind has nothing to write.
        for kind in set(store.RECORD_KINDS) - {"idempotency"}:
            path = os.path.join(folder, kind + ".json")
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(folder).st_mode), 0o700)
        # Written whole: no temporary file is left beside them.
        left = {f for f in os.listdir(folder) if not f.endswith(".json")}
        self.assertLessEqual(left, {"files", "sessions"})

    @inlineCallbacks
    def test_environment_variables_after_restart(self) -> Any:
        """
        A session on a stored environment gets the environment's variables
        again when its agent starts again after a restart.
        """
        agents = self.client().beta.agents
        work = os.path.join(self.base_dir, "work")
        os.makedirs(work)

        def before() -> Any:
            env = agents.environments.create(
                environment={
                    "type": "self_hosted",
                    "workspace_directory": work,
                    "env": {"GREETING": "kept"},
                }
            )
            return agents.sessions.create(
                agent={"model": "fake"},
                environment={"type": "self_hosted", "id": env.id},
            )

        session = yield self.sdk(before)
        yield self.restart()
        sessions = self.client().beta.agents.sessions

        def after() -> Any:
            with sessions.stream(session.id, input="terminal printenv GREETING") as s:
                list(s)
            return list(sessions.items.list(session.id))

        items = yield self.sdk(after)
        command = next(i for i in items if i.type == "command_execution")
        self.assertEqual(command.output, "kept\n")

    @inlineCallbacks
    def test_unreadable_file_set_aside(self) -> Any:
        """
        A kind's file that does not parse is set aside as ``.bad`` and that
        kind starts empty; the other kinds are read back.
        """
        agents = self.client().beta.agents

        def before() -> Any:
            return agents.vaults.create(name="v"), agents.create(model="fake")

        _, definition = yield self.sdk(before)
        folder = os.path.join(self.state_dir, "openai")
        path = os.path.join(folder, "vaults.json")
        for _ in range(50):
            if os.path.exists(path):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        yield self.daemon.stop()
        with open(path, "w") as f:
            f.write('{"version": 1, "records": [')
        yield self.start(state_dir=self.state_dir)
        again = self.client().beta.agents
        vaults, definitions = yield self.sdk(
            lambda: (list(again.vaults.list()), list(again.list()))
        )
        self.assertEqual(vaults, [])
        self.assertEqual([d.id for d in definitions], [definition.id])
        self.assertTrue(os.path.exists(path + ".bad"))

    @inlineCallbacks
    def test_secret_masked_after_restart(self) -> Any:
        """
        A session given a vault before the restart gets its credential again
        when its agent starts again after it (the header's SHA-256
        matches), and the token the agent echoes is masked in the items,
        the deltas and its stderr log.
        """
        client = self.client()
        agents = client.beta.agents

        def before() -> Any:
            vault, _ = bearer_vault(agents)
            return agents.sessions.create(
                **self.session_body(agent=mcp_agent(), vault_ids=[vault.id])
            )

        session = yield self.sdk(before)
        yield self.restart()
        sessions = self.client().beta.agents.sessions

        def after() -> Any:
            with sessions.stream(session.id, input="mcp") as s:
                events = list(s)
            return events, list(sessions.items.list(session.id))

        events, items = yield self.sdk(after)
        text = items[0].output_text
        digest = hashlib.sha256(f"Bearer {TOKEN}".encode()).hexdigest()
        self.assertIn(f"sha256={digest} in_env=False", text)
        self.assertNotIn(TOKEN, text)
        self.assertIn("[redacted]", text)
        deltas = "".join(
            e.delta for e in events if e.type == "agent.session.turn.output_text.delta"
        )
        self.assertNotIn("tok-0123", deltas)
        engine = self.daemon.context.agents.get().sessions
        for _ in range(50):
            joined = "".join(
                c["data"] for s in engine.values() for c in s.stderr.chunks()
            )
            if "mcp header" in joined:
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertIn("mcp header [redacted]", joined)
        self.assertNotIn(TOKEN, joined)


class KeptIdempotencyTests(RestartCase):
    """The ``Idempotency-Key`` books of creates outlive a restart."""

    @inlineCallbacks
    def test_create_retried_after_restart(self) -> Any:
        """
        A session, a response and a session's input sent with an
        ``Idempotency-Key``, then the same calls retried after a restart:
        the same objects come back (one session listed, the response as it
        ended, still one turn: the input was not run again), the same key
        with another body is 409 ``idempotency.mismatch``, and another
        identity's same key is its own (a new session).
        """
        client = self.client()
        key = {"Idempotency-Key": "kept-1"}
        message = {"type": "agent.session.input.message", "input": "echo once"}

        def before() -> Any:
            session = client.beta.agents.sessions.create(
                **self.session_body(), extra_headers=key
            )
            response = client.responses.create(
                model="fake", input="echo once", extra_headers=key
            )
            with client.beta.agents.sessions.events.stream(session.id) as stream:
                client.beta.agents.sessions.events.create(
                    session.id, events=[message], idempotency_key="e-1"
                )
                for event in stream:
                    if event.type == "agent.session.turn.completed":
                        break
            return session, response

        session, response = yield self.sdk(before)
        yield self.restart()
        again = self.client()
        other = self.client("o-token")

        def after() -> Any:
            sessions = again.beta.agents.sessions
            sessions.events.create(session.id, events=[message], idempotency_key="e-1")
            return (
                sessions.create(**self.session_body(), extra_headers=key),
                again.responses.create(
                    model="fake", input="echo once", extra_headers=key
                ),
                caught(
                    lambda: again.responses.create(
                        model="fake", input="echo twice", extra_headers=key
                    )
                ),
                list(sessions.list()),
                other.beta.agents.sessions.create(
                    **self.session_body(), extra_headers=key
                ),
            )

        session2, response2, mismatch, listed, theirs = yield self.sdk(after)
        turns = yield self.sdk(
            lambda: list(again.beta.agents.sessions.turns.list(session.id))
        )
        self.assertEqual(len(turns), 1)
        self.assertEqual(session2.id, session.id)
        self.assertEqual([s.id for s in listed], [session.id])
        self.assertEqual(response2.id, response.id)
        self.assertEqual(response2.output_text, "once")
        self.assertEqual(mismatch.status_code, 409)
        self.assertEqual(mismatch.body["code"], "idempotency.mismatch")
        self.assertNotEqual(theirs.id, session.id)
        path = os.path.join(self.state_dir, "openai", "idempotency.json")
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)


class LoadingTests(RestartCase):
    """The kept state is read in a thread; calls wait for it."""

    @inlineCallbacks
    def test_health_answers_while_state_loads(self) -> Any:
        """
        While the kept state is still being read (the read held back by the
        test), ``/health`` answers 200 and a ``/v1`` call waits; once the
        read ends, that call sees every kept session.
        """
        sessions = self.client().beta.agents.sessions
        made = []
        for _ in range(2):
            # One call each: an agent's start may be slow on a busy machine.
            made.append(
                (yield self.sdk(lambda: sessions.create(**self.session_body()))).id
            )
        gate = threading.Event()
        reading = threading.Event()
        original = store.SessionStore.read

        def held_read(self: store.SessionStore) -> Any:
            reading.set()
            gate.wait(30)
            return original(self)

        self.patch(store.SessionStore, "read", held_read)
        yield self.restart()
        listing = self.sdk(lambda: list(self.client().beta.agents.sessions.list()))
        for _ in range(100):
            if reading.is_set():
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertTrue(reading.is_set())
        health = yield self.request("GET", "/health")
        self.assertEqual(health.status, 200)
        self.assertFalse(listing.called)
        gate.set()
        listed = yield listing
        self.assertEqual(sorted(s.id for s in listed), sorted(made))
