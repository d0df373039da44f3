"""
Permission requests through the ``/v1`` door: the agent's held ACP request
is the session's ``requires_action``, answered with an
``mcp_approval_request_result`` event (the seed runs agents with approvals
off and has no such thing).
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.openai_api.sdk import OpenAICase, approval_response, caught, openai_policy


class ApprovalTests(OpenAICase):
    """An edit the policy says to ask about waits for the caller's decision."""

    def edit(self, decision: str) -> Any:
        client = self.client()
        sessions = client.beta.agents.sessions
        path = os.path.join(self.base_dir, "notes.txt")
        with open(path, "w") as f:
            f.write("old\n")

        def run() -> Any:
            session = sessions.create(**self.session_body())
            asked = waiting = None
            with sessions.stream(session.id, input=f"edit {path} new text") as stream:
                events = []
                for event in stream:
                    events.append(event)
                    if event.type == "agent.session.requires_action":
                        asked = event.session
                        waiting = sessions.retrieve(session.id)
                        action = asked.required_actions[0]
                        sessions.events.create(
                            session.id,
                            events=[
                                {
                                    "type": "agent.session.input.mcp_approval_request_result",
                                    "request_id": action.request_id,
                                    "response": {
                                        "type": "mcp_tool_call",
                                        "decision": decision,
                                    },
                                }
                            ],
                        )
            return (
                asked,
                waiting,
                events,
                list(sessions.items.list(session.id, order="asc")),
            )

        d = self.sdk(run)
        d.addCallback(lambda result: (*result, open(path).read()))
        return d

    @inlineCallbacks
    def test_approve(self) -> Any:
        """
        The session requires action (the request names the tool call); an
        approval lets the agent write the file and finish the turn.
        """
        asked, waiting, events, items, content = yield self.edit("approve")
        self.assertEqual(asked.status, "requires_action")
        [action] = asked.required_actions
        self.assertEqual(action.type, "mcp_approval_request")
        self.assertEqual(action.request.name, "Edit notes.txt")
        # The agent's own tool: labelled with its runtime, as the seed labels it.
        self.assertEqual(action.request.server_label, "fake")
        self.assertEqual(waiting.status, "requires_action")
        types = [e.type for e in events]
        after = types[types.index("agent.session.requires_action") + 1 :]
        self.assertEqual(after[0], "agent.session.in_progress")
        self.assertIn("agent.session.turn.completed", after)
        self.assertEqual(content, "new text")
        self.assertEqual([i.type for i in items], ["mcp_call", "message"])
        self.assertEqual(items[0].status, "completed")
        self.assertEqual(items[0].server_label, "fake")
        self.assertEqual(items[1].output_text, "edited notes.txt (allow)")

    @inlineCallbacks
    def test_deny(self) -> Any:
        """A denial reaches the agent: nothing is written, the tool call failed."""
        _, _, _, items, content = yield self.edit("deny")
        self.assertEqual(content, "old\n")
        self.assertEqual(items[0].status, "failed")
        self.assertEqual(items[-1].output_text, "permission refused")

    @inlineCallbacks
    def test_unknown_request(self) -> Any:
        """An approval for a request the session does not hold is 404 not_found."""
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            session = sessions.create(**self.session_body())
            try:
                sessions.events.create(
                    session.id,
                    events=[
                        {
                            "type": "agent.session.input.mcp_approval_request_result",
                            "request_id": "req_nope",
                            "response": {
                                "type": "mcp_tool_call",
                                "decision": "approve",
                            },
                        }
                    ],
                )
            except Exception as e:
                return e

        error = yield self.sdk(run)
        self.assertEqual((error.status_code, error.body["code"]), (404, "not_found"))
        self.assertEqual(error.body["param"], "request_id")


class ResponseApprovalTests(OpenAICase):
    """
    A permission request inside ``responses.create`` ends the response as
    OpenAI's does when a tool needs approval (an ``mcp_approval_request``
    output item); a response with ``previous_response_id`` and an
    ``mcp_approval_response`` answers it and carries the rest of the turn.
    """

    def notes(self) -> str:
        path = os.path.join(self.base_dir, "notes.txt")
        with open(path, "w") as f:
            f.write("old\n")
        return path

    @inlineCallbacks
    def test_approve(self) -> Any:
        """
        The first response is completed with the request (the tool call's
        name and arguments); the approval's response shows the tool call
        run and the agent's answer, and the file is written.
        """
        path = self.notes()
        client = self.client()

        def run() -> Any:
            asked = client.responses.create(model="fake", input=f"edit {path} new text")
            [request] = [i for i in asked.output if i.type == "mcp_approval_request"]
            done = client.responses.create(
                model="fake",
                previous_response_id=asked.id,
                input=[approval_response(request.id, True)],
            )
            return asked, request, done, client.responses.retrieve(asked.id)

        asked, request, done, again = yield self.sdk(run)
        self.assertEqual(asked.status, "completed")
        self.assertEqual(request.server_label, "fake")
        self.assertEqual(request.name, "Edit notes.txt")
        self.assertIsInstance(request.arguments, str)
        self.assertEqual([i.type for i in again.output], [i.type for i in asked.output])
        self.assertEqual(done.status, "completed")
        self.assertEqual(done.previous_response_id, asked.id)
        # The call it became: the agent's own tool, a tool_call item.
        self.assertEqual([i.type for i in done.output], ["tool_call", "message"])
        self.assertEqual(done.output[0].status, "completed")
        self.assertEqual(done.output[0].tool_name, "Edit notes.txt")
        self.assertEqual(done.output_text, "edited notes.txt (allow)")
        with open(path) as f:
            self.assertEqual(f.read(), "new text")

    @inlineCallbacks
    def test_deny_streamed(self) -> Any:
        """
        Streamed: the request arrives as an output item, then
        ``response.completed``; the denial's stream shows the refused call
        and the agent's answer, and nothing is written.
        """
        path = self.notes()
        client = self.client()

        def run() -> Any:
            with client.responses.create(
                model="fake", input=f"edit {path} new text", stream=True
            ) as stream:
                first = list(stream)
            request = first[-1].response.output[-1]
            with client.responses.create(
                model="fake",
                previous_response_id=first[-1].response.id,
                input=[approval_response(request.id, False)],
                stream=True,
            ) as stream:
                second = list(stream)
            return first, request, second

        first, request, second = yield self.sdk(run)
        types = [e.type for e in first]
        self.assertEqual(types[-1], "response.completed")
        added = [e.item for e in first if e.type == "response.output_item.added"]
        self.assertEqual(added[-1].type, "mcp_approval_request")
        self.assertEqual(request.type, "mcp_approval_request")
        self.assertEqual(second[-1].type, "response.completed")
        final = second[-1].response
        self.assertEqual([i.type for i in final.output], ["tool_call", "message"])
        self.assertEqual(final.output[0].status, "failed")
        self.assertEqual(final.output_text, "permission refused")
        done = [e for e in second if e.type == "response.output_item.done"]
        self.assertEqual([e.output_index for e in done], [0, 1])
        with open(path) as f:
            self.assertEqual(f.read(), "old\n")

    @inlineCallbacks
    def test_approve_with_the_stream_helper(self) -> Any:
        """
        The SDK's ``responses.stream`` helper answers the approval: the call
        it lets run was begun before this response, and is added once.
        """
        path = self.notes()
        client = self.client()

        def run() -> Any:
            asked = client.responses.create(model="fake", input=f"edit {path} new text")
            [request] = [i for i in asked.output if i.type == "mcp_approval_request"]
            with client.responses.stream(
                model="fake",
                previous_response_id=asked.id,
                input=[approval_response(request.id, True)],
            ) as stream:
                events = list(stream)
                return events, stream.get_final_response()

        events, final = yield self.sdk(run)
        added = [
            e.output_index for e in events if e.type == "response.output_item.added"
        ]
        self.assertEqual(added, [0, 1])
        self.assertEqual([i.type for i in final.output], ["tool_call", "message"])
        self.assertEqual(final.output_text, "edited notes.txt (allow)")

    @inlineCallbacks
    def test_asked_with_the_stream_helper(self) -> Any:
        """
        The SDK's ``responses.stream`` helper receives a response that ends
        asking for an approval: every output index is added once and done
        once, and its final response holds the request, which the helper
        then answers.
        """
        path = self.notes()
        client = self.client()

        def run() -> Any:
            with client.responses.stream(
                model="fake", input=f"edit {path} new text"
            ) as stream:
                asked = list(stream)
                final = stream.get_final_response()
            [request] = [i for i in final.output if i.type == "mcp_approval_request"]
            with client.responses.stream(
                model="fake",
                previous_response_id=final.id,
                input=[approval_response(request.id, True)],
            ) as stream:
                list(stream)
                answered = stream.get_final_response()
            return asked, final, answered

        asked, final, answered = yield self.sdk(run)
        added = [
            e.output_index for e in asked if e.type == "response.output_item.added"
        ]
        done = [e.output_index for e in asked if e.type == "response.output_item.done"]
        self.assertEqual(len(added), len(set(added)))
        self.assertEqual(sorted(added), sorted(done))
        self.assertEqual(asked[-1].type, "response.completed")
        self.assertEqual([i.type for i in final.output], ["mcp_approval_request"])
        self.assertEqual(answered.output_text, "edited notes.txt (allow)")

    @inlineCallbacks
    def test_refusals(self) -> Any:
        """
        While a response waits for approval, a plain message to its
        conversation is 400 (answer first); an unknown request id is 404;
        an approval without previous_response_id is 400.
        """
        path = self.notes()
        client = self.client()

        def run() -> Any:
            asked = client.responses.create(model="fake", input=f"edit {path} x")

            def answer(request_id: str, **extra: Any) -> Any:
                return caught(
                    lambda: client.responses.create(
                        model="fake",
                        input=[approval_response(request_id, True)],
                        **extra,
                    )
                )

            return (
                caught(
                    lambda: client.responses.create(
                        model="fake", input="echo hi", previous_response_id=asked.id
                    )
                ),
                answer("req_nope", previous_response_id=asked.id),
                answer("req_nope"),
            )

        message, unknown, orphan = yield self.sdk(run)
        self.assertEqual((message.status_code, message.body["param"]), (400, "input"))
        self.assertEqual(
            (unknown.status_code, unknown.body["param"]), (404, "approval_request_id")
        )
        self.assertEqual(
            (orphan.status_code, orphan.body["param"]), (400, "previous_response_id")
        )


class NativeToolOutputTests(OpenAICase):
    """
    A tool call that is the agent's own (an edit, not an MCP server's tool)
    is agent-sandbox-server's ``tool_call`` item in a response's output:
    ``tool_name``, the arguments as an object, the output and error, as a
    seed user's code reads it.  A session's items show it as an
    ``mcp_call`` labelled with the runtime, as the seed does.
    """

    policy = openai_policy(params={"permission_mode": {"*": "auto"}})

    @inlineCallbacks
    def test_response_output(self) -> Any:
        path = os.path.join(self.base_dir, "notes.txt")
        with open(path, "w") as f:
            f.write("old\n")
        client = self.client()

        def run() -> Any:
            with client.responses.create(
                model="fake", input=f"edit {path} new text", stream=True
            ) as stream:
                events = list(stream)
            done = events[-1].response
            return events, done, client.responses.retrieve(done.id)

        events, done, again = yield self.sdk(run)
        self.assertEqual(done.status, "completed")
        for response in (done, again):
            self.assertEqual(
                [i.type for i in response.output], ["tool_call", "message"]
            )
            call = response.output[0]
            self.assertEqual(call.status, "completed")
            self.assertEqual(call.tool_name, "Edit notes.txt")
            self.assertIsInstance(call.arguments, dict)
            self.assertEqual(call.error, None)
            self.assertTrue(call.id.startswith("tc_"))
        added = [e.item for e in events if e.type == "response.output_item.added"]
        finished = [e.item for e in events if e.type == "response.output_item.done"]
        self.assertEqual(added[0].type, "tool_call")
        self.assertEqual(added[0].status, "in_progress")
        self.assertEqual(finished[0].type, "tool_call")
        self.assertEqual(finished[0].id, added[0].id)
        self.assertEqual(done.output_text, "edited notes.txt (allow)")
        with open(path) as f:
            self.assertEqual(f.read(), "new text")

    @inlineCallbacks
    def test_session_not_waiting(self) -> Any:
        """
        What the policy answers by itself is never the caller's to answer:
        the session does not stop in ``requires_action`` on the way.
        """
        path = os.path.join(self.base_dir, "notes.txt")
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            session = sessions.create(**self.session_body())
            with sessions.stream(session.id, input=f"edit {path} new text") as stream:
                events = list(stream)
            return events, list(sessions.items.list(session.id, order="asc"))

        events, items = yield self.sdk(run)
        types = [e.type for e in events]
        self.assertNotIn("agent.session.requires_action", types)
        self.assertIn("agent.session.turn.completed", types)
        self.assertEqual([i.type for i in items], ["mcp_call", "message"])
        self.assertEqual(items[0].server_label, "fake")

    @inlineCallbacks
    def test_refused_by_policy(self) -> Any:
        """
        An edit outside the policy's paths is refused by the policy, whatever
        the mode: the response shows the failed call and the agent's
        answer, no approval request.
        """
        client = self.client()

        def run() -> Any:
            return client.responses.create(
                model="fake", input="edit /etc/sandboxd-test-file nope"
            )

        done = yield self.sdk(run)
        self.assertEqual([i.type for i in done.output], ["tool_call", "message"])
        self.assertEqual(done.output[0].status, "failed")
        self.assertEqual(done.output_text, "permission refused")
        self.assertFalse(os.path.exists("/etc/sandboxd-test-file"))
