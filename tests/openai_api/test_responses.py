"""
The ``/v1`` door's Responses routes with the official ``openai`` SDK: one
response is one turn of the fake ACP agent, streamed live.
"""

from __future__ import annotations

import time
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.openai_api.sdk import OpenAICase, caught, openai_policy


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

        def run() -> Any:
            refused = [
                caught(
                    lambda: client.responses.create(
                        model="fake", input="echo x", **kwargs
                    )
                )
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

        def run() -> Any:
            refused = [
                caught(lambda: client.responses.create(model="fake", input=value))
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
        an unknown model and a second turn to cancel are refused clearly.
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
                    lambda: client.responses.create(
                        model="fake",
                        input="x",
                        tools=[{"type": "function", "name": "f", "parameters": {}}],
                    )
                ),
            )

        response, done, cancel, unknown, tools = yield self.sdk(run)
        self.assertIn(response.status, ("queued", "in_progress"))
        self.assertEqual(done.output_text, "later")
        self.assertEqual(
            (cancel.status_code, cancel.body["code"]), (400, "invalid_param")
        )
        self.assertEqual(
            (unknown.status_code, unknown.body["code"]), (404, "not_found")
        )
        self.assertEqual((tools.status_code, tools.body["param"]), (400, "tools"))


class EvictionTests(OpenAICase):
    """Stored responses do not hold agents past ``max_sessions``."""

    policy = openai_policy(limits={"max_sessions": 2})

    @inlineCallbacks
    def test_oldest_idle_conversation_gives_way(self) -> Any:
        """
        A third conversation under ``max_sessions: 2`` ends the oldest idle
        one's agent: its response still reads back, continuing it is 400.
        """
        client = self.client()

        def run() -> Any:
            first, second, third = (
                client.responses.create(model="fake", input=f"echo {n}") for n in "123"
            )
            return (
                first,
                third,
                client.responses.retrieve(first.id),
                caught(
                    lambda: client.responses.create(
                        model="fake", input="echo 4", previous_response_id=first.id
                    )
                ),
                client.responses.create(
                    model="fake", input="echo 5", previous_response_id=second.id
                ),
            )

        _, third, again, refused, continued = yield self.sdk(run)
        self.assertEqual((third.output_text, again.output_text), ("3", "1"))
        self.assertEqual(
            (refused.status_code, refused.body["param"]), (400, "previous_response_id")
        )
        self.assertEqual(continued.output_text, "5")
        self.assertEqual(len(self.daemon.context.agents.get().live()), 2)


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
