"""
Sessions that outlive the daemon: with a state dir, a session's turns,
items and events are read back after a restart, through the ``openai``
SDK, by their owner only; a turn that was running when the daemon stopped
ends ``failed``, never silently lost.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, fail, inlineCallbacks, succeed
from twisted.internet.task import Clock, deferLater
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.openai_api.store import SessionStore
from sandboxd.policy import defaults
from tests.openai_api.sdk import OpenAICase, caught, openai_policy


class RestartCase(OpenAICase):
    """A daemon with a state dir, that a test stops and starts again on it."""

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        self.state_dir = os.path.realpath(self.mktemp())
        return self.start(state_dir=self.state_dir)

    def restart(self) -> Any:
        """Stop the daemon, start another one on the same state dir."""
        d = self.daemon.stop()
        d.addCallback(lambda _: self.start(state_dir=self.state_dir))
        return d


class RestartTests(RestartCase):
    """A daemon stopped and started again on the same state dir."""

    @inlineCallbacks
    def test_session_survives_restart(self) -> Any:
        """
        A finished turn and a running one: after the restart the SDK lists
        and retrieves the session with its owner, its finished turn and
        items as they were, the running turn ``failed`` with a message
        saying why, the session ``idle``; its events replay with
        ``?after=`` and end with those ends.  Another identity still sees
        nothing.
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def before() -> Any:
            session = sessions.create(**self.session_body(metadata={"case": "restart"}))
            with sessions.stream(session.id, input="echo kept across") as stream:
                list(stream)
            with sessions.events.stream(session.id) as stream:
                sessions.events.create(
                    session.id,
                    events=[{"type": "agent.session.input.message", "input": "slow"}],
                )
                for event in stream:
                    if event.type == "agent.session.turn.output_text.delta":
                        break
            return session

        session = yield self.sdk(before)
        yield self.restart()
        again = self.client()
        other = self.client("o-token")
        s2 = again.beta.agents.sessions

        def after() -> Any:
            with s2.events.stream(session.id, extra_query={"after": "0"}) as stream:
                replayed = list(stream)
            return (
                list(s2.list()),
                s2.retrieve(session.id),
                list(s2.turns.list(session.id, order="asc")),
                list(s2.items.list(session.id, order="asc")),
                replayed,
                caught(lambda: other.beta.agents.sessions.retrieve(session.id)),
                list(other.beta.agents.sessions.list()),
            )

        listed, got, turns, items, replayed, hidden, others = yield self.sdk(after)
        self.assertEqual([s.id for s in listed], [session.id])
        self.assertEqual(got.metadata, {"case": "restart"})
        self.assertEqual(got.status, "idle")
        self.assertIsNone(got.error)
        self.assertEqual(got.environment.workspace_directory, self.base_dir)
        # (The replayed events say how the turns went, should this ever fail:
        # it did once in a full run on a busy machine, unexplained.)
        self.assertEqual(
            [t.status for t in turns],
            ["completed", "failed"],
            [(e.type, getattr(e, "turn_id", None)) for e in replayed],
        )
        self.assertEqual(turns[1].error.code, "sandbox_error")
        self.assertIn("daemon stopped", turns[1].error.message)
        self.assertEqual(items[0].type, "message")
        self.assertEqual(items[0].output_text, "kept across")
        self.assertEqual(items[0].status, "completed")
        self.assertEqual(items[-1].status, "incomplete")
        types = [e.type for e in replayed]
        self.assertEqual(types[0], "agent.session.in_progress")
        self.assertIn("agent.session.turn.completed", types)
        self.assertEqual(
            types[-2:], ["agent.session.turn.failed", "agent.session.idle"]
        )
        ids = [e.event_id for e in replayed]
        self.assertEqual(ids, sorted(ids))
        self.assertEqual(len(set(ids)), len(ids))
        self.assertEqual((hidden.status_code, hidden.body["code"]), (404, "not_found"))
        self.assertEqual(others, [])

    @inlineCallbacks
    def test_new_input_starts_the_agent_again(self) -> Any:
        """
        A message to a session read back after a restart starts its agent
        again in the same directory: the turn runs and streams, the session
        is idle after it, its log goes on from the kept events, and another
        restart keeps all three turns.
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def before() -> Any:
            session = sessions.create(**self.session_body())
            with sessions.stream(session.id, input="echo first") as stream:
                return session, [e.event_id for e in stream]

        session, seen = yield self.sdk(before)
        yield self.restart()
        again = self.client().beta.agents.sessions

        def after() -> Any:
            with again.stream(session.id, input="echo second") as stream:
                events = list(stream)
            return (
                events,
                again.retrieve(session.id),
                [i.output_text for i in again.items.list(session.id, order="asc")],
            )

        events, got, texts = yield self.sdk(after)
        deltas = [
            e.delta for e in events if e.type == "agent.session.turn.output_text.delta"
        ]
        self.assertEqual("".join(deltas), "second")
        self.assertEqual(events[-1].type, "agent.session.idle")
        self.assertGreater(events[0].event_id, seen[-1])
        self.assertEqual(got.status, "idle")
        self.assertIsNone(got.error)
        self.assertEqual(texts, ["first", "second"])
        self.assertEqual(got.environment.workspace_directory, self.base_dir)
        yield self.restart()
        turns = yield self.sdk(
            lambda: [
                t.status
                for t in self.client().beta.agents.sessions.turns.list(
                    session.id, order="asc"
                )
            ]
        )
        self.assertEqual(turns, ["completed", "completed"])

    @inlineCallbacks
    def test_conversation_with_one_long_answer_is_kept(self) -> Any:
        """
        A conversation holding an answer too long for its file is still
        kept: after a restart every response of it reads back (the long
        answer cut, saying so, its end kept) and the latest continues.
        """
        self.patch(defaults, "OPENAI_STATE_FILE_BYTES", 64 * 1024)
        client = self.client()
        long = "x" * 100_000 + "end"

        def before() -> Any:
            first = client.responses.create(model="fake", input="echo first")
            big = client.responses.create(
                model="fake", input=f"echo {long}", previous_response_id=first.id
            )
            last = client.responses.create(
                model="fake", input="echo last", previous_response_id=big.id
            )
            return first, big, last

        first, big, last = yield self.sdk(before)
        self.assertEqual(big.output_text, long)
        yield self.restart()
        again = self.client()

        def after() -> Any:
            got = [again.responses.retrieve(r.id) for r in (first, big, last)]
            more = again.responses.create(
                model="fake", input="echo more", previous_response_id=last.id
            )
            return got, more

        got, more = yield self.sdk(after)
        self.assertEqual([g.status for g in got], ["completed"] * 3)
        self.assertEqual(got[0].output_text, "first")
        self.assertTrue(got[1].output_text.startswith("["), got[1].output_text[:80])
        self.assertIn("characters not kept]", got[1].output_text[:80])
        self.assertTrue(got[1].output_text.endswith("xend"))
        self.assertEqual(got[2].output_text, "last")
        self.assertEqual(more.output_text, "more")

    @inlineCallbacks
    def test_resume_after_a_seq_from_before(self) -> Any:
        """
        A client that read part of the events before the restart resumes
        after its last event id and gets exactly the rest (the session was
        idle: the restart adds nothing).
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def before() -> Any:
            session = sessions.create(**self.session_body())
            with sessions.stream(session.id, input="echo one two three") as stream:
                return session, [e.event_id for e in stream]

        session, seen = yield self.sdk(before)
        yield self.restart()
        again = self.client()

        def after() -> Any:
            with again.beta.agents.sessions.events.stream(
                session.id, extra_query={"after": seen[2]}
            ) as stream:
                return [e.event_id for e in stream]

        rest = yield self.sdk(after)
        self.assertEqual(rest, seen[3:])

    @inlineCallbacks
    def test_files_private_and_deleted_with_the_session(self) -> Any:
        """
        The state is one 0600 file per session, with its owner, in a 0700
        directory, and one for the webhook endpoints, which come back with
        their owner; deleting the session deletes its file.
        """
        client = self.client()
        sessions = client.beta.agents.sessions
        session = yield self.sdk(lambda: sessions.create(**self.session_body()))
        hook = yield self.sdk(
            lambda: client.webhooks.create(
                url="https://hooks.example.com/sandbox",
                event_types=["agent.session.idle"],
                name="kept",
            )
        )
        yield self.restart()
        hooks = yield self.sdk(lambda: list(self.client().webhooks.list()))
        others = yield self.sdk(lambda: list(self.client("o-token").webhooks.list()))
        self.assertEqual([(h.id, h.name) for h in hooks], [(hook.id, "kept")])
        self.assertEqual(others, [])
        kept = os.path.join(self.state_dir, "openai", "webhooks.json")
        self.assertEqual(stat.S_IMODE(os.stat(kept).st_mode), 0o600)
        folder = os.path.join(self.state_dir, "openai", "sessions")
        path = os.path.join(folder, session.id + ".json")
        with open(path) as f:
            record = json.load(f)
        self.assertEqual(record["owner"], "user")
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(folder).st_mode), 0o700)
        again = self.client()
        deleted = yield self.sdk(lambda: again.beta.agents.sessions.delete(session.id))
        self.assertTrue(deleted.deleted)
        yield self.restart()
        self.assertFalse(os.path.exists(path))
        after = self.client()
        listed = yield self.sdk(lambda: list(after.beta.agents.sessions.list()))
        self.assertEqual(listed, [])


class KeptFilesTests(RestartCase):
    """No more session files are written than a start reads back."""

    # Three agents at once, all the caller's.
    policy = openai_policy(limits={"max_per_identity": 4})

    @inlineCallbacks
    def test_files_of_the_last_changed(self) -> Any:
        """
        Past the files kept, the oldest are removed as the newer are
        written, and a session that changes again is written again.
        """
        self.patch(defaults, "OPENAI_STATE_SESSIONS", 2)
        sessions = self.client().beta.agents.sessions
        folder = os.path.join(self.state_dir, "openai", "sessions")

        def files() -> set[str]:
            return {name.removesuffix(".json") for name in os.listdir(folder)}

        made = []
        for _ in range(3):
            session = yield self.sdk(lambda: sessions.create(**self.session_body()))
            made.append(session.id)
            for _ in range(100):
                if session.id in files():
                    break
                yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual(files(), set(made[1:]))
        yield self.sdk(lambda: sessions.update(made[0], metadata={"again": "yes"}))
        for _ in range(100):
            if made[0] in files():
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual(files(), {made[0], made[2]})


class WriteOrderTests(SynchronousTestCase):
    """A session's files are written one after another, in the order asked."""

    def test_one_write_at_a_time(self) -> None:
        """
        However writes are asked for while others run, a session's next
        write starts only once the one before it is done: an older snapshot
        can never be renamed into place after a newer one.
        """
        started: list[str] = []
        pending: list[Deferred[None]] = []

        class Threads:
            def in_thread(self, work: Any, *args: Any) -> Deferred[None]:
                started.append(args[0])
                d: Deferred[None] = Deferred()
                pending.append(d)
                return d

        store = SessionStore(Threads(), self.mktemp())  # type: ignore[arg-type]
        work = lambda name: None  # noqa: E731
        first = store._after_writes("s", work, "1")
        store._after_writes("s", work, "2")
        self.assertEqual(started, ["1"])
        pending[0].callback(None)
        self.assertEqual(started, ["1", "2"])
        self.successResultOf(first)
        third = store._after_writes("s", work, "3")
        self.assertEqual(started, ["1", "2"])
        pending[1].callback(None)
        self.assertEqual(started, ["1", "2", "3"])
        pending[2].callback(None)
        self.successResultOf(third)
        self.assertEqual(store._writing, {})


class FailedWriteTests(SynchronousTestCase):
    """A file whose write failed (a full disk) is written again later, as it is then."""

    def test_retried_until_kept(self) -> None:
        """
        A failed write asks for its retry once, after the retry's delay
        (one timer for all the files due); the file is tried again until a
        write succeeds, and the failure and the recovery are logged once.
        """
        clock = Clock()
        outcomes: list[BaseException | None] = []

        class Context:
            reactor = clock

            def in_thread(self, work: Any, *args: Any) -> Deferred[None]:
                error = outcomes.pop(0)
                return fail(error) if error is not None else succeed(None)

        store = SessionStore(Context(), self.mktemp())  # type: ignore[arg-type]
        asked: list[str] = []
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        outcomes += [full, full]
        with self.assertLogs("sandboxd.openai_api.store", "WARNING") as logged:
            store.save_webhooks([], retry=lambda: asked.append("webhooks"))
            store.save_records("vaults", [], retry=lambda: asked.append("vaults"))
            clock.advance(defaults.OPENAI_STATE_RETRY_SECONDS - 0.1)
            self.assertEqual(asked, [])
            clock.advance(0.1)
            self.assertEqual(asked, ["webhooks", "vaults"])
            clock.advance(defaults.OPENAI_STATE_RETRY_SECONDS)
            self.assertEqual(asked, ["webhooks", "vaults"])
            outcomes += [full, None]
            store.save_webhooks([], retry=lambda: asked.append("webhooks"))
            store.save_records("vaults", [], retry=lambda: asked.append("vaults"))
            clock.advance(defaults.OPENAI_STATE_RETRY_SECONDS)
            self.assertEqual(asked, ["webhooks", "vaults", "webhooks"])
            outcomes.append(None)
            store.save_webhooks([])
        messages = [r.getMessage() for r in logged.records]
        self.assertEqual(len(messages), 4, messages)
        self.assertIn("could not keep the /v1 door's webhooks", messages[0])
        self.assertIn("could not keep the /v1 door's vaults", messages[1])
        self.assertIn("vaults is kept again", messages[2])
        self.assertIn("webhooks is kept again", messages[3])
        self.assertEqual(store._failing, set())
        self.assertEqual(clock.getDelayedCalls(), [])


class SetAsideTests(SynchronousTestCase):
    """Session files that cannot be read back are set aside, and not without end."""

    def test_newest_set_aside_kept(self) -> None:
        """
        A session file that does not parse is set aside as ``.bad`` at the
        start and the others are read; of the files set aside over many
        starts, the newest :data:`OPENAI_STATE_SET_ASIDE` stay.
        """
        self.patch(defaults, "OPENAI_STATE_SET_ASIDE", 3)
        store = SessionStore(None, self.mktemp())  # type: ignore[arg-type]
        store.load()

        def unreadable(name: str, mtime: int) -> None:
            path = store.path(name)
            with open(path, "w") as f:
                f.write('{"version": 1, "turns": [')
            os.utime(path, (mtime, mtime))

        for n in range(4):
            unreadable(f"agsess_old{n}", 1_000 + n)
        self.assertEqual(store.load(), [])
        unreadable("agsess_new", 2_000)
        store.load()
        self.assertEqual(
            sorted(os.listdir(store.directory)),
            ["agsess_new.json.bad", "agsess_old2.json.bad", "agsess_old3.json.bad"],
        )
