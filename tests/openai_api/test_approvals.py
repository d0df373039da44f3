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

from tests.openai_api.sdk import OpenAICase


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
        self.assertEqual(action.request.server_label, "agent")
        self.assertEqual(waiting.status, "requires_action")
        types = [e.type for e in events]
        after = types[types.index("agent.session.requires_action") + 1 :]
        self.assertEqual(after[0], "agent.session.in_progress")
        self.assertIn("agent.session.turn.completed", after)
        self.assertEqual(content, "new text")
        self.assertEqual([i.type for i in items], ["mcp_call", "message"])
        self.assertEqual(items[0].status, "completed")
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
