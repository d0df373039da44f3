"""
The ``/v1`` door's Responses routes with the official ``openai`` SDK: one
response is one turn of the fake ACP agent, streamed live.
"""

from __future__ import annotations

import os
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import DeferredList, inlineCallbacks
from twisted.internet.task import deferLater

from tests.openai_api.sdk import CALL_SECONDS, OpenAICase, caught, openai_policy


class ResponseTests(OpenAICase):
    """``client.responses`` over the ACP engine."""

    @inlineCallbacks
    def test_create_get_items_delete(self) -> Any:
        """
        A blocking create answers the finished response; it reads back by
        id with its input; delete forgets it and ends its agent.
        """
        client = self.client()

        def run() -> Any:
            response = client.responses.create(
                model="fake",
                input=[
                    {
                        "role": "user",
                        "content": [{"type": "input_text", "text": "echo hi there"}],
                    }
                ],
                metadata={"k": "v"},
            )
            again = client.responses.retrieve(response.id)
            items = list(client.responses.input_items.list(response.id))
            client.responses.delete(response.id)
            gone = caught(lambda: client.responses.retrieve(response.id))
            return response, again, items, gone

        response, again, items, gone = yield self.sdk(run)
        self.assertEqual(response.status, "completed")
        self.assertEqual(response.output_text, "hi there")
        self.assertEqual(response.model, "fake")
        self.assertEqual(response.metadata, {"k": "v"})
        self.assertEqual(again.output_text, "hi there")
        self.assertEqual([i.content[0].text for i in items], ["echo hi there"])
        self.assertEqual(gone.status_code, 404)
        self.assertEqual(gone.body["code"], "not_found")
        live = self.daemon.context.agents.get().live()
        for _ in range(50):
            if not live:
                break
            yield self.sdk(time.sleep, 0.1)
            live = self.daemon.context.agents.get().live()
        self.assertEqual(live, [])

    @inlineCallbacks
    def test_stream_is_live(self) -> Any:
        """
        ``stream=True`` sends the agent's first chunk while the turn still
        runs (the agent then waits to be cancelled); a cancel ends it with
        ``response.incomplete``, the message it cut short ``incomplete``.
        """
        client = self.client()

        def run() -> Any:
            seen = []
            with client.responses.create(
                model="fake", input="slow", stream=True
            ) as stream:
                for event in stream:
                    seen.append(event)
                    if event.type == "response.output_text.delta":
                        running = client.responses.retrieve(seen[0].response.id)
                        client.responses.cancel(seen[0].response.id)
            return seen, running

        seen, running = yield self.sdk(run)
        types = [e.type for e in seen]
        self.assertEqual(types[:2], ["response.created", "response.in_progress"])
        self.assertIn("response.output_item.added", types)
        self.assertEqual(types[-1], "response.incomplete")
        self.assertEqual(running.status, "in_progress")
        deltas = [e.delta for e in seen if e.type == "response.output_text.delta"]
        self.assertEqual(deltas, ["working"])
        self.assertEqual([e.sequence_number for e in seen], list(range(len(seen))))
        self.assertEqual(seen[-1].response.status, "cancelled")
        [message] = seen[-1].response.output
        self.assertEqual((message.type, message.status), ("message", "incomplete"))

    @inlineCallbacks
    def test_stream_helper_follows_a_running_response(self) -> Any:
        """
        The SDK's ``responses.stream(response_id=...)`` follows a background
        response that has output already: the stream begins with none and
        adds each item once, then ends as the cancel ends it.
        """
        client = self.client()

        def run() -> Any:
            started = client.responses.create(
                model="fake", input="slow", background=True
            )
            for _ in range(100):
                if client.responses.retrieve(started.id).output:
                    break
                time.sleep(0.1)
            seen = []
            with client.responses.stream(response_id=started.id) as stream:
                for event in stream:
                    seen.append(event)
                    if event.type == "response.output_text.delta":
                        client.responses.cancel(started.id)
            return seen

        seen = yield self.sdk(run)
        self.assertEqual(seen[0].response.output, [])
        added = [e.output_index for e in seen if e.type == "response.output_item.added"]
        self.assertEqual(added, [0])
        self.assertEqual(seen[-1].type, "response.incomplete")
        self.assertEqual(seen[-1].response.status, "cancelled")

    @inlineCallbacks
    def test_cancel_queued(self) -> Any:
        """
        A queued response's cancel answers at once, ``cancelled``; the
        one after it in the queue still runs once the running one ends.
        """
        client = self.client()

        def run() -> Any:
            running = client.responses.create(
                model="fake", input="slow", background=True
            )
            queued = client.responses.create(
                model="fake",
                input="echo never",
                previous_response_id=running.id,
                background=True,
            )
            after = client.responses.create(
                model="fake",
                input="echo after",
                previous_response_id=queued.id,
                background=True,
            )
            started = time.monotonic()
            cancelled = client.responses.cancel(queued.id)
            took = time.monotonic() - started
            client.responses.cancel(running.id)
            for _ in range(100):
                done = client.responses.retrieve(after.id)
                if done.status == "completed":
                    break
                time.sleep(0.05)
            return cancelled, took, done

        cancelled, took, done = yield self.sdk(run)
        self.assertEqual(cancelled.status, "cancelled")
        self.assertLess(took, 3.0)
        self.assertEqual(done.output_text, "after")

    @inlineCallbacks
    def test_latest_forgotten(self) -> Any:
        """
        Once a conversation's latest response is deleted, or was not
        stored, the newest one left is the one to continue from again.
        """
        client = self.client()

        def run() -> Any:
            first = client.responses.create(model="fake", input="echo one")
            second = client.responses.create(
                model="fake", input="echo two", previous_response_id=first.id
            )
            client.responses.delete(second.id)
            third = client.responses.create(
                model="fake", input="echo three", previous_response_id=first.id
            )
            unstored = client.responses.create(
                model="fake",
                input="echo four",
                previous_response_id=third.id,
                store=False,
            )
            for _ in range(100):
                fifth = caught(
                    lambda: client.responses.create(
                        model="fake", input="echo five", previous_response_id=third.id
                    )
                )
                if not isinstance(fifth, Exception):
                    break
                time.sleep(0.05)
            return third, unstored, fifth

        third, unstored, fifth = yield self.sdk(run)
        self.assertEqual(third.output_text, "three")
        self.assertEqual(unstored.output_text, "four")
        self.assertEqual(fifth.output_text, "five")
        self.assertEqual(len(self.daemon.context.agents.get().live()), 1)

    @inlineCallbacks
    def test_what_cannot_be_honoured(self) -> Any:
        """
        A structured output format is refused (an agent's answer follows no
        schema), as is a service tier there is none of and a sampling
        parameter of the wrong type; one of the right type, and a text
        verbosity, are answered and named as ignored.
        """
        client = self.client()
        schema = {
            "type": "json_schema",
            "name": "answer",
            "schema": {"type": "object"},
            "strict": True,
        }

        def create(kwargs: dict[str, Any]) -> Any:
            return caught(
                lambda: client.responses.create(model="fake", input="echo x", **kwargs)
            )

        def run() -> Any:
            refused = [
                create(kwargs)
                for kwargs in (
                    {"text": {"format": schema}},
                    {"text": {"format": {"type": "json_object"}}},
                    {"service_tier": "flex"},
                    {"temperature": "hot"},
                    {"max_output_tokens": "many"},
                    {"user": 5},
                )
            ]
            raw = client.responses.with_raw_response.create(
                model="fake",
                input="echo fine",
                temperature=0.2,
                text={"format": {"type": "text"}, "verbosity": "low"},
            )
            return refused, raw.headers, raw.parse()

        refused, headers, fine = yield self.sdk(run)
        self.assertEqual(
            [(e.status_code, e.body["param"]) for e in refused],
            [
                (400, "text.format"),
                (400, "text.format"),
                (400, "service_tier"),
                (400, "temperature"),
                (400, "max_output_tokens"),
                (400, "user"),
            ],
        )
        self.assertEqual(fine.output_text, "fine")
        self.assertEqual(
            headers["x-agent-sandbox-ignored-params"], "temperature,text.verbosity"
        )

    @inlineCallbacks
    def test_input_an_agent_cannot_take(self) -> Any:
        """
        An image, a file or a function call's output is refused by name; an
        input with no user message gives the agent no task and is refused;
        a bad list ``limit`` names its parameter. Nothing runs.
        """
        client = self.client()
        image = {"type": "input_image", "image_url": "data:image/png;base64,AA=="}

        def create(value: Any) -> Any:
            return caught(lambda: client.responses.create(model="fake", input=value))

        def run() -> Any:
            refused = [
                create(value)
                for value in (
                    [{"role": "user", "content": [image]}],
                    [{"type": "function_call_output", "call_id": "c", "output": "x"}],
                    [{"role": "developer", "content": "be terse"}],
                )
            ]
            done = client.responses.create(model="fake", input="echo ok")
            limit = caught(lambda: client.responses.input_items.list(done.id, limit=0))
            return refused, limit

        refused, limit = yield self.sdk(run)
        self.assertEqual(
            [(e.status_code, e.body["param"]) for e in refused],
            [(400, "input[0]"), (400, "input[0]"), (400, "input")],
        )
        self.assertIn("input_image is not supported", refused[0].body["message"])
        self.assertIn(
            "function_call_output is not supported", refused[1].body["message"]
        )
        self.assertIn("no user message", refused[2].body["message"])
        self.assertEqual((limit.status_code, limit.body["param"]), (400, "limit"))
        self.assertEqual(len(self.daemon.context.agents.get().live()), 1)

    @inlineCallbacks
    def test_continuation_shows_its_conversations_model(self) -> Any:
        """
        A response continuing a conversation is answered by its agent and
        says so, whatever model it names (as agent-sandbox-server's does).
        """
        client = self.client()

        def run() -> Any:
            first = client.responses.create(model="fake", input="echo one")
            return client.responses.create(
                model="claude", input="echo two", previous_response_id=first.id
            )

        second = yield self.sdk(run)
        self.assertEqual((second.model, second.output_text), ("fake", "two"))

    @inlineCallbacks
    def test_stream_helper_and_continuation(self) -> Any:
        """
        The SDK's ``responses.stream`` helper gets the final text; a
        ``previous_response_id`` continues the same agent session, and only
        the latest response of a conversation can be continued.
        """
        client = self.client()

        def run() -> Any:
            with client.responses.stream(model="fake", input="echo one") as stream:
                first = stream.get_final_response()
            second = client.responses.create(
                model="fake", input="echo two", previous_response_id=first.id
            )
            stale = caught(
                lambda: client.responses.create(
                    model="fake", input="echo three", previous_response_id=first.id
                )
            )
            return first, second, stale

        first, second, stale = yield self.sdk(run)
        self.assertEqual(first.output_text, "one")
        self.assertEqual(second.output_text, "two")
        self.assertEqual(stale.status_code, 400)
        self.assertEqual(stale.body["param"], "previous_response_id")
        self.assertEqual(len(self.daemon.context.agents.get().live()), 1)

    @inlineCallbacks
    def test_background_and_refusals(self) -> Any:
        """
        A background response answers at once and completes later; tools,
        an unknown model, a second turn to cancel and a negative
        ``starting_after`` are refused clearly.
        """
        client = self.client()

        def run() -> Any:
            response = client.responses.create(
                model="fake", input="echo later", background=True
            )
            for _ in range(100):
                done = client.responses.retrieve(response.id)
                if done.status == "completed":
                    break
                time.sleep(0.05)
            return (
                response,
                done,
                caught(lambda: client.responses.cancel(response.id)),
                caught(
                    lambda: client.responses.create(
                        model="no-such", input="x", extra_body={"adapter": "no-such"}
                    )
                ),
                caught(
                    lambda: client.responses.retrieve(
                        response.id, stream=True, starting_after=-5
                    )
                ),
                caught(
                    lambda: client.responses.create(
                        model="fake",
                        input="x",
                        tools=[{"type": "function", "name": "f", "parameters": {}}],
                    )
                ),
            )

        response, done, cancel, unknown, negative, tools = yield self.sdk(run)
        self.assertIn(response.status, ("queued", "in_progress"))
        self.assertEqual(done.output_text, "later")
        self.assertEqual(
            (cancel.status_code, cancel.body["code"]), (400, "invalid_param")
        )
        self.assertEqual(
            (unknown.status_code, unknown.body["code"]), (404, "not_found")
        )
        self.assertEqual((tools.status_code, tools.body["param"]), (400, "tools"))
        self.assertEqual(
            (negative.status_code, negative.body["param"]), (400, "starting_after")
        )
        self.assertIn("sequence number (0 or more)", negative.message)


class SlotTests(OpenAICase):
    """
    Idle conversations behind responses keep their agents only until a new
    agent needs the slot, whoever asks: then the least recently active one
    goes to sleep, and continuing it starts its agent again.
    """

    # The slots themselves, whoever holds them: each identity may hold both.
    policy = openai_policy(limits={"max_sessions": 2, "max_per_identity": 2})

    def live(self) -> list[Any]:
        """The agents running now."""
        return list(self.daemon.context.agents.get().live())

    def acp_session_of(self, response_id: str) -> Any:
        """The agent's own session id behind a response's conversation."""
        from sandboxd.openai_api.registry import registry

        reg = registry(self.daemon.context.agents.get())
        return reg.responses[response_id].face.engine.acp_session_id

    @inlineCallbacks
    def test_another_identity_takes_an_idle_slot(self) -> Any:
        """
        With ``user``'s two idle conversations at ``max_sessions: 2``,
        ``other``'s response runs: ``user``'s least recently active
        conversation gives its agent up.  ``user`` then continues it,
        streamed: its agent starts again, resuming its own session, and
        answers; the conversation's first response still reads back.
        """
        client, other = self.client(), self.client("o-token")

        def fill() -> Any:
            return [
                client.responses.create(model="fake", input=f"echo {n}") for n in "12"
            ]

        first, _ = yield self.sdk(fill)
        before = self.acp_session_of(first.id)
        theirs = yield self.sdk(
            lambda: other.responses.create(model="fake", input="echo theirs")
        )
        self.assertEqual(theirs.output_text, "theirs")
        self.assertEqual(len(self.live()), 2)

        def go_on() -> Any:
            with client.responses.stream(
                model="fake", input="echo again", previous_response_id=first.id
            ) as stream:
                continued = stream.get_final_response()
            return continued, client.responses.retrieve(first.id)

        continued, again = yield self.sdk(go_on)
        self.assertEqual(continued.status, "completed")
        self.assertEqual(continued.output_text, "again")
        self.assertEqual(again.output_text, "1")
        self.assertEqual(self.acp_session_of(continued.id), before)
        self.assertEqual(len(self.live()), 2)

    @inlineCallbacks
    def test_sessions_create_makes_room_after_checking_its_body(self) -> Any:
        """
        ``sessions.create`` at the limit takes an idle conversation's slot
        too; a bad body there is its own error (400 for a missing
        directory, not 429), and puts no conversation to sleep.
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            for n in "12":
                client.responses.create(model="fake", input=f"echo {n}")
            missing = os.path.join(self.base_dir, "no-such-dir")
            bad = caught(
                lambda: sessions.create(
                    **self.session_body(
                        environment={
                            "type": "self_hosted",
                            "workspace_directory": missing,
                        }
                    )
                )
            )
            running = [s.session_id for s in self.live()]
            return bad, running, sessions.create(**self.session_body())

        bad, running, session = yield self.sdk(run)
        self.assertEqual((bad.status_code, bad.body["code"]), (400, "invalid_param"))
        self.assertEqual(len(running), 2)
        self.assertEqual(session.status, "idle")
        self.assertEqual(len(self.live()), 2)

    @inlineCallbacks
    def test_concurrent_creates_take_different_slots(self) -> Any:
        """
        Two new conversations at once, with two idle ones at the limit: each
        puts a different one to sleep, and both run.
        """
        client = self.client()
        yield self.sdk(
            lambda: [
                client.responses.create(model="fake", input=f"echo {n}") for n in "12"
            ]
        )
        both = yield DeferredList(
            [
                self.sdk(
                    caught,
                    lambda n=n: client.responses.create(
                        model="fake", input=f"echo new{n}"
                    ),
                )
                for n in "34"
            ]
        )
        answers = sorted(getattr(r, "output_text", None) or repr(r) for _, r in both)
        self.assertEqual(answers, ["new3", "new4"])
        self.assertEqual(len(self.live()), 2)

    @inlineCallbacks
    def test_busy_and_explicit_sessions_keep_their_agents(self) -> Any:
        """
        Only idle conversations behind responses give their agents up: a
        running response and the caller's own idle session hold theirs, so
        with nothing else the limit is a 429 ``too_many_sessions``.
        """
        client, other = self.client(), self.client("o-token")

        def run() -> Any:
            session = client.beta.agents.sessions.create(**self.session_body())
            client.responses.create(model="fake", input="echo idle")
            running = other.responses.create(
                model="fake", input="slow", background=True
            )
            refused = caught(
                lambda: client.responses.create(model="fake", input="echo more")
            )
            kept = client.beta.agents.sessions.retrieve(session.id)
            other.responses.cancel(running.id)
            return running, refused, kept

        running, refused, kept = yield self.sdk(run)
        self.assertIn(running.status, ("queued", "in_progress"))
        self.assertEqual(
            (refused.status_code, refused.body["code"]), (429, "too_many_sessions")
        )
        self.assertEqual((kept.status, kept.error), ("idle", None))


class ShareTests(OpenAICase):
    """A share held by responses in progress is a wait, not a refusal to act on."""

    policy = openai_policy(limits={"max_sessions": 4, "max_per_identity": 2})

    @inlineCallbacks
    def test_running_responses_ask_for_a_retry(self) -> Any:
        """
        With the caller's share held by two responses in progress (and no
        session of its own), a new response is a 429 ``too_many_sessions``
        that says so and asks for a retry (``Retry-After``,
        ``x-should-retry: true``); a client that retries as the SDK does by
        default gets its response once one of them completes.
        """
        from openai import OpenAI

        client = self.client()
        gate = os.path.join(self.base_dir, "gate")
        yield self.sdk(
            lambda: [
                client.responses.create(
                    model="fake", input=f"waitfor {gate} echo {n}", background=True
                )
                for n in "12"
            ]
        )
        refused = yield self.sdk(
            caught, lambda: client.responses.create(model="fake", input="echo more")
        )
        self.assertEqual(
            (refused.status_code, refused.body["code"]), (429, "too_many_sessions")
        )
        self.assertEqual(refused.response.headers["x-should-retry"], "true")
        self.assertEqual(refused.response.headers["retry-after"], "2")
        self.assertIn("2 of your responses in progress", refused.message)
        self.assertNotIn("close one", refused.message)
        patient = OpenAI(
            base_url=self.daemon.url + "/v1",
            api_key="u-token",
            max_retries=2,
            timeout=CALL_SECONDS,
        )
        self.addCleanup(self._close, patient)
        later = self.sdk(patient.responses.create, model="fake", input="echo later")
        yield deferLater(reactor, 0.5, lambda: None)
        with open(gate, "w"):
            pass
        answered = yield later
        self.assertEqual(answered.output_text, "later")

    @inlineCallbacks
    def test_burst_of_creates_asks_for_a_retry(self) -> Any:
        """
        A burst of creates past the caller's share, sent while the first
        ones' agents still start (no response holds them yet): each one
        refused is a 429 that asks for a retry, never one telling a caller
        with no sessions to close one.
        """
        client = self.client()
        gate = os.path.join(self.base_dir, "gate")
        self.addCleanup(lambda: open(gate, "w").close())
        burst = [
            self.sdk(
                caught,
                lambda n=n: client.responses.create(
                    model="fake", input=f"waitfor {gate} echo {n}", background=True
                ),
            )
            for n in range(4)
        ]
        results = yield DeferredList(burst)
        refused = [r for _, r in results if isinstance(r, Exception)]
        self.assertEqual(len(refused), 2, refused)
        for error in refused:
            self.assertEqual(
                (error.status_code, error.body["code"]), (429, "too_many_sessions")
            )
            self.assertEqual(error.response.headers["x-should-retry"], "true")
            self.assertNotIn("close one", error.message)

    @inlineCallbacks
    def test_unanswered_approvals_say_so(self) -> Any:
        """
        With the caller's share held by responses that wait for approvals
        it has not answered, a new response is a 429 that says so and what
        frees them, and does not ask for a retry (retrying frees nothing).
        """
        client = self.client()
        path = os.path.join(self.base_dir, "notes.txt")
        with open(path, "w") as f:
            f.write("old\n")

        def run() -> Any:
            asked = [
                client.responses.create(model="fake", input=f"edit {path} {n}")
                for n in "12"
            ]
            refused = caught(
                lambda: client.responses.create(model="fake", input="echo more")
            )
            return asked, refused

        asked, refused = yield self.sdk(run)
        self.assertEqual(
            [[i.type for i in a.output] for a in asked],
            [["mcp_approval_request"]] * 2,
        )
        self.assertEqual(
            (refused.status_code, refused.body["code"]), (429, "too_many_sessions")
        )
        self.assertIn("2 of your responses wait for an approval", refused.message)
        self.assertNotIn("in progress", refused.message)
        self.assertEqual(refused.response.headers["x-should-retry"], "false")


class QueueBoundTests(OpenAICase):
    """A policy's ``limits.max_queued`` bounds the turns waiting in a conversation."""

    policy = openai_policy(limits={"max_queued": 1})

    @inlineCallbacks
    def test_lower_max_queued_is_enforced(self) -> Any:
        """
        Under ``max_queued: 1``, a response continuing a running one waits
        as its turn's successor; one more is refused (400 ``invalid_param``,
        naming the bound) and the queued one still runs once the first ends.
        """
        client = self.client()

        def run() -> Any:
            running = client.responses.create(
                model="fake", input="slow", background=True
            )
            queued = client.responses.create(
                model="fake",
                input="echo queued",
                previous_response_id=running.id,
                background=True,
            )
            refused = caught(
                lambda: client.responses.create(
                    model="fake",
                    input="echo one too many",
                    previous_response_id=queued.id,
                    background=True,
                )
            )
            client.responses.cancel(running.id)
            for _ in range(200):
                done = client.responses.retrieve(queued.id)
                if done.status == "completed":
                    break
                time.sleep(0.05)
            return queued, refused, done

        queued, refused, done = yield self.sdk(run)
        self.assertEqual(queued.status, "queued")
        self.assertEqual(
            (refused.status_code, refused.body["code"]), (400, "invalid_param")
        )
        self.assertIn("(max_queued 1)", refused.body["message"])
        self.assertEqual(done.output_text, "queued")


class IdledOutTests(OpenAICase):
    """A conversation whose agent idled out is continued later."""

    policy = openai_policy(limits={"idle_timeout_seconds": 1})

    @inlineCallbacks
    def test_continued_after_its_agent_idled_out(self) -> Any:
        """
        Past ``idle_timeout_seconds`` the conversation's agent ends (its
        slot is free); the next response starts it again and is answered.
        """
        client = self.client()
        first = yield self.sdk(
            lambda: client.responses.create(model="fake", input="echo one")
        )
        manager = self.daemon.context.agents.get()
        for _ in range(100):
            if not manager.live():
                break
            yield self.sdk(time.sleep, 0.05)
        self.assertEqual(manager.live(), [])
        second = yield self.sdk(
            lambda: client.responses.create(
                model="fake", input="echo two", previous_response_id=first.id
            )
        )
        self.assertEqual((second.status, second.output_text), ("completed", "two"))


class KeptBoundTests(OpenAICase):
    """The per-identity bound on kept responses never cuts a running one."""

    policy = openai_policy(limits={"max_sessions": 8, "max_per_identity": 6})

    @inlineCallbacks
    def test_running_background_response_outlives_newer_ones(self) -> Any:
        """
        Past the bound, the oldest responses that have ended are forgotten,
        never a background one still running: it is still retrievable and
        cancellable, its agent still works.  When responses still running
        alone fill the bound, a new create is a 429 ``concurrency_limited``
        that asks for a retry, and nothing was started for it.
        """
        from sandboxd.policy import defaults

        self.patch(defaults, "OPENAI_RESPONSES_PER_IDENTITY", 3)
        client = self.client()
        gate = os.path.join(self.base_dir, "gate")

        def run() -> Any:
            slow = client.responses.create(
                model="fake", input=f"waitfor {gate} echo late", background=True
            )
            quick = [
                client.responses.create(model="fake", input=f"echo {n}")
                for n in range(4)
            ]
            still = client.responses.retrieve(slow.id)
            oldest = caught(lambda: client.responses.retrieve(quick[0].id))
            newest = client.responses.retrieve(quick[-1].id)
            more = [
                client.responses.create(
                    model="fake", input=f"waitfor {gate} echo {n}", background=True
                )
                for n in "ab"
            ]
            refused = caught(
                lambda: client.responses.create(model="fake", input="echo refused")
            )
            with open(gate, "w"):
                pass
            for _ in range(200):
                done = client.responses.retrieve(slow.id)
                if done.status == "completed":
                    break
                time.sleep(0.05)
            return still, oldest, newest, more, refused, done

        still, oldest, newest, more, refused, done = yield self.sdk(run)
        self.assertEqual(still.status, "in_progress")
        self.assertEqual(oldest.status_code, 404)
        self.assertEqual(newest.output_text, "3")
        self.assertEqual([m.status for m in more], ["in_progress", "in_progress"])
        self.assertEqual(
            (refused.status_code, refused.body["code"]), (429, "concurrency_limited")
        )
        self.assertIn("3 of your responses are queued or running", refused.message)
        self.assertEqual(refused.response.headers["x-should-retry"], "true")
        self.assertEqual(done.status, "completed")
        self.assertTrue(done.output_text.endswith("late"))


class OutgrownLogTests(OpenAICase):
    """A response whose events outgrew its conversation's log, streamed again."""

    policy = openai_policy(limits={"max_event_bytes": 8192})

    @inlineCallbacks
    def test_streamed_again_whole(self) -> Any:
        """
        Streamed again, a finished response whose first events the log
        dropped is rebuilt: every frame typed, its items added before their
        text, the whole text in its deltas, numbers increasing and the end
        numbered as it was live, so ``starting_after`` the live end's
        predecessor still gives the end; the SDK's stream helper follows it.
        """
        client = self.client()
        text = "y" * 6000

        def run() -> Any:
            with client.responses.create(
                model="fake", input=f"echo {text}", stream=True
            ) as stream:
                live = list(stream)
            rid = live[-1].response.id
            with client.responses.retrieve(rid, stream=True) as stream:
                again = list(stream)
            last = live[-1].sequence_number
            with client.responses.retrieve(
                rid, stream=True, starting_after=last - 1
            ) as stream:
                tail = list(stream)
            with client.responses.stream(response_id=rid) as stream:
                list(stream)
                final = stream.get_final_response()
            return live, again, tail, final

        live, again, tail, final = yield self.sdk(run)
        self.assertEqual(live[-1].type, "response.completed")
        types = [e.type for e in again]
        self.assertNotIn(None, types)
        self.assertEqual(types[:2], ["response.created", "response.in_progress"])
        self.assertLess(
            types.index("response.output_item.added"),
            types.index("response.output_text.delta"),
        )
        deltas = [e.delta for e in again if e.type == "response.output_text.delta"]
        self.assertEqual("".join(deltas), text)
        numbers = [e.sequence_number for e in again]
        self.assertEqual(numbers, sorted(set(numbers)))
        self.assertEqual(
            (again[-1].type, numbers[-1]),
            ("response.completed", live[-1].sequence_number),
        )
        self.assertEqual(
            [(e.type, e.sequence_number) for e in tail],
            [("response.completed", live[-1].sequence_number)],
        )
        self.assertEqual(final.output_text, text)


class AgentGoneTests(OpenAICase):
    """A conversation whose agent died mid-turn goes on."""

    policy = openai_policy(limits={"max_turn_seconds": 2})

    @inlineCallbacks
    def test_continued_after_its_agent_exited_or_was_killed(self) -> Any:
        """
        A response whose agent exits mid-turn is ``failed``; the next one
        continuing it starts the agent again and is answered, as after a
        restart.  The same once a turn's agent is killed at
        ``max_turn_seconds``.
        """
        from sandboxd.policy import defaults

        self.patch(defaults, "AGENT_CANCEL_GRACE_SECONDS", 0.5)
        client = self.client()

        def run() -> Any:
            first = client.responses.create(model="fake", input="echo one")
            crashed = client.responses.create(
                model="fake", input="exit", previous_response_id=first.id
            )
            after_crash = client.responses.create(
                model="fake", input="echo two", previous_response_id=crashed.id
            )
            killed = client.responses.create(
                model="fake", input="stubborn", previous_response_id=after_crash.id
            )
            after_kill = client.responses.create(
                model="fake", input="echo three", previous_response_id=killed.id
            )
            return crashed, after_crash, killed, after_kill

        crashed, after_crash, killed, after_kill = yield self.sdk(run)
        self.assertEqual(crashed.status, "failed")
        self.assertEqual(
            (after_crash.status, after_crash.output_text), ("completed", "two")
        )
        self.assertNotEqual(killed.status, "completed")
        self.assertIn("max_turn_seconds", killed.error.message)
        self.assertEqual(
            (after_kill.status, after_kill.output_text), ("completed", "three")
        )


class TurnItemsBoundTests(OpenAICase):
    """A turn's items are bounded."""

    @inlineCallbacks
    def test_turn_past_its_items_is_stopped(self) -> Any:
        """
        An agent that makes more items in one turn than
        ``OPENAI_TURN_ITEMS`` is stopped: its response is ``failed`` with
        an error saying why, holding the items up to the bound; the
        conversation goes on.
        """
        from sandboxd.policy import defaults

        self.patch(defaults, "OPENAI_TURN_ITEMS", 1)
        client = self.client()

        def run() -> Any:
            stopped = client.responses.create(model="fake", input="think")
            after = client.responses.create(
                model="fake", input="echo after", previous_response_id=stopped.id
            )
            return stopped, after

        stopped, after = yield self.sdk(run)
        self.assertEqual(stopped.status, "failed")
        self.assertIn("as many as a turn may", stopped.error.message)
        self.assertEqual([i.type for i in stopped.output], ["reasoning"])
        self.assertEqual((after.status, after.output_text), ("completed", "after"))
