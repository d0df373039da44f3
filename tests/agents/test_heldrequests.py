# -*- test-case-name: tests.agents.test_heldrequests -*-
"""
:class:`sandboxd.agents.heldrequests.HeldRequests` driven alone: a bare
:class:`~sandboxd.agents.state.SessionState`, a JSON-RPC connection that
writes to a list, a fake :class:`~sandboxd.agents.heldrequests.HeldHost`
and a test clock; no daemon and no agent process.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.agents.catalog import CatalogEntry
from sandboxd.agents.filechanges import FileChanges
from sandboxd.agents.heldrequests import HeldRequests
from sandboxd.agents.permissions import HeldRequest
from sandboxd.agents.state import SessionState, Turn
from sandboxd.agents.updates import UpdateFolding
from sandboxd.errors import ApiError
from sandboxd.jsonrpc import REQUEST_CANCELLED, Connection
from sandboxd.policy.rules import EffectiveRule, Limits, Params, PathRule

OPTIONS = [
    {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
    {"optionId": "always", "name": "Always", "kind": "allow_always"},
    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
]


class Host:
    """Records what held requests call back."""

    def __init__(self) -> None:
        self.registered: list[HeldRequest] = []
        self.cancelled: list[str] = []

    def register_request(self, held: HeldRequest) -> None:
        self.registered.append(held)

    def cancel_turn(self, forced_by: str) -> None:
        self.cancelled.append(forced_by)


class Peer:
    """The session's side of the connection: requests go to ``held``."""

    def __init__(self, held: HeldRequests) -> None:
        self.held = held

    def handle_request(self, request_id: Any, method: str, params: Any) -> Any:
        if method == "session/request_permission":
            return self.held.permission(request_id, params)
        return self.held.question(request_id, params)

    def handle_notification(self, method: str, params: Any) -> None:
        self.held.cancel_request(params.get("requestId"))

    def handle_garbage(self, line: bytes, reason: str, message: Any) -> None:
        raise AssertionError(reason)


def running_session(
    base: str, clock: Clock, limits: Limits | None = None, params: Params | None = None
) -> SessionState:
    """An agent session's state in memory, a turn running, under a rule of its own."""
    rule = EffectiveRule(
        endpoint_id="agents_session_create",
        enabled=True,
        enabled_by="test",
        scopes=(),
        audit="off",
        limits=limits or Limits(),
        paths=PathRule(),
        params=params or Params(),
        base_dir=base,
    )
    entry = CatalogEntry("fake", "Fake", ("fake-agent",))
    session = SessionState(clock, None, "as_test", entry, rule, base, {}, None, [])
    session.state = "running"
    session.current = Turn("turn_1", 0.0, 1)
    return session


class HeldRequestsTests(SynchronousTestCase):
    """Permission requests held, answered by a human, the clock or withdrawn."""

    def held_requests(self, **params: Any) -> HeldRequests:
        """A running turn's session with ``params`` and a 5 s permission timeout."""
        self.clock = Clock()
        self.session = running_session(
            self.mktemp(),
            self.clock,
            Limits(permission_timeout_seconds=5),
            Params(**params),
        )
        self.host = Host()
        updates = UpdateFolding(self.session, FileChanges(self.session))
        held = HeldRequests(self.session, updates, self.host)
        self.sent: list[dict[str, Any]] = []
        self.session.conn = Connection(
            lambda data: self.sent.append(json.loads(data)), Peer(held)
        )
        return held

    def ask(self, rpc_id: int = 7, kind: str = "edit") -> None:
        """The agent asks permission for a tool call of ``kind``."""
        params = {
            "sessionId": "acp_1",
            "toolCall": {"toolCallId": "tc_1", "title": "Edit", "kind": kind},
            "options": OPTIONS,
        }
        message = {
            "jsonrpc": "2.0",
            "id": rpc_id,
            "method": "session/request_permission",
            "params": params,
        }
        self.session.conn.message_received(json.dumps(message).encode())

    def events(self) -> list[str]:
        """The event types logged so far."""
        return [e.event for e in self.session.log.since(0)[1]]

    def test_held_until_a_human_answers(self) -> None:
        """
        An edit the default policy leaves to a human is held (the host
        indexes it, the session awaits input, nothing is sent); the human's
        allow_once goes to the agent as the selected option.
        """
        held = self.held_requests()
        self.ask()
        self.assertEqual(self.sent, [])
        self.assertEqual(self.session.state, "awaiting_input")
        [request] = self.host.registered
        self.assertEqual(list(self.session.pending.values()), [request])
        answer = held.reply(
            request, {"decision": "allow_once"}, "alice", self.session.rule
        )
        self.assertEqual(answer["outcome"], {"outcome": "selected", "optionId": "yes"})
        self.assertEqual(
            self.sent,
            [
                {
                    "jsonrpc": "2.0",
                    "id": 7,
                    "result": {"outcome": {"outcome": "selected", "optionId": "yes"}},
                }
            ],
        )
        self.assertEqual(self.session.state, "running")
        self.assertEqual(self.session.pending, {})
        self.assertEqual(
            self.events(),
            [
                "tool_call",
                "session.state",
                "permission.requested",
                "permission.resolved",
                "session.state",
            ],
        )

    def test_auto_mode_answers_at_once(self) -> None:
        """``permission_mode`` auto picks the first allow_once, never an always option."""
        self.held_requests(permission_mode={"*": "auto"})
        self.ask()
        self.assertEqual(
            self.sent[0]["result"],
            {"outcome": {"outcome": "selected", "optionId": "yes"}},
        )
        self.assertEqual(self.session.state, "running")

    def test_timeout_can_cancel_the_turn(self) -> None:
        """
        Past ``permission_timeout_seconds`` with ``permission_timeout_action``
        cancel_turn, the request is answered cancelled and the host is asked
        to cancel the turn.
        """
        self.held_requests(permission_timeout_action="cancel_turn")
        self.ask()
        self.clock.advance(4.9)
        self.assertEqual(self.sent, [])
        self.clock.advance(0.1)
        self.assertEqual(self.sent[0]["result"], {"outcome": {"outcome": "cancelled"}})
        self.assertEqual(self.host.cancelled, ["permission_timeout"])

    def test_timeout_rejects_by_default(self) -> None:
        """By default a timed-out request gets the agent's first reject option."""
        self.held_requests()
        self.ask()
        self.clock.advance(5)
        self.assertEqual(
            self.sent[0]["result"],
            {"outcome": {"outcome": "selected", "optionId": "no"}},
        )
        self.assertEqual(self.host.cancelled, [])

    def test_withdrawn_by_the_agent(self) -> None:
        """
        ``$/cancel_request`` withdraws the request: the agent gets a
        request-cancelled error, no answer, and a human's late reply is a
        409 ``withdrawn``.
        """
        held = self.held_requests()
        self.ask(rpc_id=3)
        [request] = self.host.registered
        cancel = {
            "jsonrpc": "2.0",
            "method": "$/cancel_request",
            "params": {"requestId": 3},
        }
        self.session.conn.message_received(json.dumps(cancel).encode())
        self.assertEqual(self.sent[0]["id"], 3)
        self.assertEqual(self.sent[0]["error"]["code"], REQUEST_CANCELLED)
        self.assertEqual(request.state, "withdrawn")
        self.assertEqual(self.clock.getDelayedCalls(), [])
        error = self.assertRaises(
            ApiError,
            held.reply,
            request,
            {"decision": "allow_once"},
            "alice",
            self.session.rule,
        )
        self.assertEqual((error.status, error.code), (409, "withdrawn"))
        self.assertEqual(len(self.sent), 1)


class AnswerSchemaTests(SynchronousTestCase):
    """An accepted question's content is checked against its requested_schema, as MCP's client does."""

    SCHEMA = {
        "type": "object",
        "properties": {
            "branch": {"type": "string", "minLength": 1, "maxLength": 5},
            "color": {"type": "string", "enum": ["red", "blue"]},
            "count": {"type": "integer", "minimum": 1, "maximum": 3},
            "ratio": {"type": "number"},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        },
        "required": ["branch"],
    }

    def test_fitting_answers(self) -> None:
        """Answers within the schema (and any answer to a question without one) pass."""
        from sandboxd.agents.heldrequests import answer_problem

        for content in (
            {"branch": "main"},
            {"branch": "dev", "color": "red", "count": 2, "ratio": 0.5},
            {"branch": "x", "ok": False, "tags": ["a", "b"], "count": 3.0},
        ):
            self.assertIsNone(answer_problem(self.SCHEMA, content), content)
        self.assertIsNone(answer_problem(None, {"anything": 1}))

    def test_misfits_name_the_field(self) -> None:
        """Each misfit is refused with the field and the reason."""
        from sandboxd.agents.heldrequests import answer_problem

        for content, problem in (
            ({}, "content.branch is required"),
            ({"branch": 5}, "content.branch must be a string"),
            ({"branch": ""}, "content.branch must be at least 1 characters"),
            ({"branch": "toolong"}, "content.branch must be at most 5 characters"),
            (
                {"branch": "a", "color": "green"},
                "content.color must be one of red, blue",
            ),
            ({"branch": "a", "count": True}, "content.count must be an integer"),
            ({"branch": "a", "count": 1.5}, "content.count must be an integer"),
            ({"branch": "a", "count": 9}, "content.count must be at most 3"),
            ({"branch": "a", "ok": "yes"}, "content.ok must be true or false"),
            ({"branch": "a", "tags": ["c"]}, "content.tags must hold only a, b"),
            (
                {"branch": "a", "tags": ["a"] * 3},
                "content.tags must hold at most 2 items",
            ),
            ({"branch": "a", "extra": 1}, "content.extra was not asked for"),
        ):
            self.assertEqual(
                (answer_problem(self.SCHEMA, content) or "")[: len(problem)],
                problem,
                content,
            )
