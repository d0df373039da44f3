# -*- test-case-name: tests.agents.test_agents -*-
"""
The session's side of held requests (SPEC §15.3): the agent's
``session/request_permission`` and ``elicitation/create`` are held until
the policy, a human (``agents_request_reply``) or the clock answers, or the
agent withdraws them.  The record and the policy that decides are in
:mod:`sandboxd.agents.permissions`.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from twisted.internet.defer import Deferred

from sandboxd.agents.permissions import (
    DECISIONS,
    HeldRequest,
    first_option,
    mode_for,
    new_request_id,
    path_refusal,
)
from sandboxd.agents.state import SessionState
from sandboxd.agents.updates import UpdateFolding
from sandboxd.errors import Code, bad_request, conflict, forbidden
from sandboxd.jsonrpc import REQUEST_CANCELLED, RpcError
from sandboxd.policy.rules import EffectiveRule


class HeldHost(Protocol):
    """What held requests call back in the session that holds them."""

    def register_request(self, held: HeldRequest) -> None:
        """Index a new held request (``/agents/requests`` lists it)."""

    def cancel_turn(self, forced_by: str) -> None:
        """Cancel the running turn (a permission timeout may)."""


def _value_problem(name: str, spec: dict[str, Any], value: Any) -> str | None:
    """Why ``value`` does not fit one property's primitive schema, or None."""
    kind = spec.get("type")
    where = f"content.{name}"
    if kind == "string":
        if not isinstance(value, str):
            return f"{where} must be a string"
        choices = spec.get("enum")
        if not isinstance(choices, list) and isinstance(spec.get("oneOf"), list):
            choices = [c.get("const") for c in spec["oneOf"] if isinstance(c, dict)]
        if isinstance(choices, list) and value not in choices:
            return f"{where} must be one of {', '.join(map(str, choices))}"
        low, high = spec.get("minLength"), spec.get("maxLength")
        if isinstance(low, int) and len(value) < low:
            return f"{where} must be at least {low} characters"
        if isinstance(high, int) and len(value) > high:
            return f"{where} must be at most {high} characters"
    elif kind in ("number", "integer"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return (
                f"{where} must be {'an integer' if kind == 'integer' else 'a number'}"
            )
        if kind == "integer" and not (isinstance(value, int) or value.is_integer()):
            return f"{where} must be an integer"
        low, high = spec.get("minimum"), spec.get("maximum")
        if isinstance(low, (int, float)) and value < low:
            return f"{where} must be at least {low}"
        if isinstance(high, (int, float)) and value > high:
            return f"{where} must be at most {high}"
    elif kind == "boolean":
        if not isinstance(value, bool):
            return f"{where} must be true or false"
    elif kind == "array":
        if not isinstance(value, list):
            return f"{where} must be a list"
        given = spec.get("items")
        items: dict[str, Any] = given if isinstance(given, dict) else {}
        choices = items.get("enum")
        if not isinstance(choices, list) and isinstance(items.get("anyOf"), list):
            choices = [c.get("const") for c in items["anyOf"] if isinstance(c, dict)]
        if isinstance(choices, list) and any(v not in choices for v in value):
            return f"{where} must hold only {', '.join(map(str, choices))}"
        low, high = spec.get("minItems"), spec.get("maxItems")
        if isinstance(low, int) and len(value) < low:
            return f"{where} must hold at least {low} items"
        if isinstance(high, int) and len(value) > high:
            return f"{where} must hold at most {high} items"
    return None


def answer_problem(schema: Any, content: dict[str, Any]) -> str | None:
    """
    Why an accepted question's ``content`` does not fit the question's
    ``requested_schema``, or None.  The schema is MCP's form (a flat object
    of strings, numbers, booleans and lists of choices, with ``required``),
    which the client, here the daemon, checks before answering: an agent
    given a number for a branch name would go on with it.  What the schema
    does not say is not checked; a schema that is not an object checks
    nothing.
    """
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return None
    properties: dict[str, Any] = schema["properties"]
    required = schema.get("required")
    for name in required if isinstance(required, list) else []:
        if name not in content:
            return f"content.{name} is required"
    for name, value in content.items():
        spec = properties.get(name)
        if spec is None:
            return f"content.{name} was not asked for (asked: {', '.join(properties)})"
        if isinstance(spec, dict):
            problem = _value_problem(name, spec, value)
            if problem is not None:
                return problem
    return None


class HeldRequests:
    """
    Permission requests and questions, from held to answered: the
    session's ``pending`` requests.  The agent's tool call named in a
    permission request is merged through ``updates``.
    """

    def __init__(
        self, session: SessionState, updates: UpdateFolding, host: HeldHost
    ) -> None:
        self.session = session
        self.updates = updates
        self.host = host
        self._by_rpc: dict[Any, HeldRequest] = {}

    def _hold(self, held: HeldRequest) -> Deferred[Any]:
        s = self.session
        d: Deferred[Any] = Deferred()

        def answer(result: dict[str, Any]) -> None:
            if not d.called:
                d.callback(result)

        held.answer = answer
        s.pending[held.request_id] = held
        self._by_rpc[held.rpc_id] = held
        self.host.register_request(held)
        if s.state == "running":
            s.set_state("awaiting_input")
        return d

    def _resolve(
        self,
        held: HeldRequest,
        outcome: dict[str, Any],
        by: str,
        identity: str | None = None,
        send: bool = True,
        state: str = "resolved",
        result: dict[str, Any] | None = None,
    ) -> None:
        if held.state != "pending":
            return
        held.state = state
        held.outcome = outcome
        held.by = by
        if held.timer is not None and held.timer.active():
            held.timer.cancel()
        s = self.session
        s.pending.pop(held.request_id, None)
        self._by_rpc.pop(held.rpc_id, None)
        if send:
            held.answer(result if result is not None else {"outcome": outcome})
        fields: dict[str, Any] = {"request_id": held.request_id, "by": by}
        if identity is not None:
            fields["identity"] = identity
        if held.kind == "permission":
            fields["outcome"] = outcome.get("outcome")
            fields["option_id"] = outcome.get("optionId")
            if held.policy:
                fields["rule"] = held.policy.get("rule")
            tc = s.tool_calls.get((held.tool_call or {}).get("toolCallId", ""))
            if tc is not None:
                tc["permission"].append({"request_id": held.request_id, **fields})
            s.emit("permission.resolved", turn_id=held.turn_id, **fields)
        else:
            fields["action"] = outcome.get("action")
            s.emit("question.resolved", turn_id=held.turn_id, **fields)
        if not s.pending and s.state == "awaiting_input":
            s.set_state("running")

    def withdraw(self, held: HeldRequest) -> None:
        """The agent took the request back (or exited): no answer is sent."""
        self._resolve(
            held, {"outcome": "cancelled"}, "withdrawn", send=False, state="withdrawn"
        )

    def resolve_cancelled(self, held: HeldRequest, by: str) -> None:
        """Answer a held request cancelled (the turn it belongs to ended)."""
        if held.kind == "permission":
            self._resolve(held, {"outcome": "cancelled"}, by)
        else:
            self._resolve(held, {"action": "cancel"}, by, result={"action": "cancel"})

    def reply(
        self,
        held: HeldRequest,
        body: dict[str, Any],
        identity: str,
        rule: EffectiveRule,
    ) -> dict[str, Any]:
        """A human's answer to a held request (``agents_request_reply``)."""
        if held.state == "withdrawn":
            raise conflict(
                "the agent withdrew this request",
                Code.WITHDRAWN,
                request_id=held.request_id,
            )
        if held.state != "pending":
            raise conflict(
                "the request is already resolved",
                Code.ALREADY_RESOLVED,
                request_id=held.request_id,
                outcome=held.outcome,
                by=held.by,
            )
        if held.kind == "question":
            action = body.get("action")
            if action not in ("accept", "decline", "cancel"):
                raise bad_request("'action' must be accept, decline or cancel")
            result: dict[str, Any] = {"action": action}
            if action == "accept":
                content = body.get("content")
                if content is not None and not isinstance(content, dict):
                    raise bad_request("'content' must be an object")
                problem = answer_problem(held.requested_schema, content or {})
                if problem is not None:
                    raise bad_request(
                        f"the answer does not fit the question's requested_schema: {problem}",
                        param="content",
                    )
                if content is not None:
                    result["content"] = content
            self._resolve(held, dict(result), "identity", identity, result=result)
            return {
                "request_id": held.request_id,
                "state": held.state,
                "outcome": result,
            }
        if body.get("cancel") is True:
            self._resolve(held, {"outcome": "cancelled"}, "identity", identity)
            return {
                "request_id": held.request_id,
                "state": held.state,
                "outcome": held.outcome,
            }
        option = None
        if "option_id" in body:
            option = next(
                (o for o in held.options if o.get("optionId") == body["option_id"]),
                None,
            )
            if option is None:
                raise bad_request(
                    f"unknown option {body['option_id']!r}; options: {', '.join(str(o.get('optionId')) for o in held.options)}"
                )
        elif "decision" in body:
            decision = body["decision"]
            if decision not in DECISIONS:
                raise bad_request(f"'decision' must be one of {', '.join(DECISIONS)}")
            option = first_option(held.options, decision)
            if option is None:
                raise bad_request(f"the agent offered no {decision} option")
        else:
            raise bad_request("give 'option_id', 'decision' or 'cancel'")
        if (
            option.get("kind") in ("allow_always", "reject_always")
            and not rule.params.allow_always
        ):
            raise forbidden(
                "'always' answers are not allowed",
                Code.PARAM_NOT_ALLOWED,
                rule=rule.source("params.allow_always") or "policy:params.allow_always",
            )
        outcome = {"outcome": "selected", "optionId": option.get("optionId")}
        self._resolve(held, outcome, "identity", identity)
        return {"request_id": held.request_id, "state": held.state, "outcome": outcome}

    def permission(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        """``session/request_permission``: decided by the policy, or held."""
        s = self.session
        raw_update = params.get("toolCall")
        update: dict[str, Any] = raw_update if isinstance(raw_update, dict) else {}
        options = [o for o in params.get("options") or [] if isinstance(o, dict)]
        tool_call_id = update.get("toolCallId")
        if isinstance(tool_call_id, str):
            merged = {**update, "sessionUpdate": "tool_call_update"}
            self.updates.tool_call(merged, None, new=False)
            tool_call = dict(s.tool_calls.get(tool_call_id) or update)
        else:
            tool_call = dict(update)
        held = self._new_held(
            "permission", rpc_id, tool_call=tool_call, options=options
        )
        allow = first_option(options, "allow_once")
        refusal = path_refusal(s.rule, tool_call)
        if refusal is not None:
            decision, source = "deny", refusal.extra.get("rule") or "guard"
            held.policy = {"decision": "deny", "rule": source, "code": refusal.code}
        else:
            decision, source = mode_for(s.rule, tool_call.get("kind"))
            if decision == "auto" and allow is None:
                # Nothing the daemon may pick by itself: a human decides.
                decision = "ask"
            held.policy = {"decision": decision, "rule": source}
        d = self._hold(held)
        s.emit(
            "permission.requested",
            raw=params,
            request_id=held.request_id,
            tool_call_id=tool_call_id,
            title=tool_call.get("title"),
            kind=tool_call.get("kind"),
            options=held.describe()["options"],
            policy=held.policy,
        )
        if decision == "auto" and allow is not None:
            self._resolve(
                held,
                {"outcome": "selected", "optionId": allow.get("optionId")},
                "policy",
            )
            return d
        if decision == "deny":
            self._reject(held, "policy")
            return d
        self._arm_timeout(held)
        return d

    def _new_held(self, kind: str, rpc_id: Any, **fields: Any) -> HeldRequest:
        """A held permission request or question, with its deadline."""
        s = self.session
        now = time.time()
        timeout = s.rule.limits.permission_timeout_seconds
        return HeldRequest(
            request_id=new_request_id(),
            kind=kind,
            session_id=s.session_id,
            rpc_id=rpc_id,
            turn_id=s.current_turn_id,
            created_at=now,
            deadline=now + timeout if timeout else None,
            answer=lambda result: None,
            **fields,
        )

    def _arm_timeout(self, held: HeldRequest) -> None:
        """Answer for the human once ``permission_timeout_seconds`` passes."""
        timeout = self.session.rule.limits.permission_timeout_seconds
        if timeout:
            held.timer = self.session.reactor.callLater(
                timeout, self._permission_timeout, held
            )

    def _permission_timeout(self, held: HeldRequest) -> None:
        held.timer = None
        if held.state != "pending":
            return
        action = self.session.rule.params.permission_timeout_action
        if held.kind == "question":
            self._resolve(
                held, {"action": "cancel"}, "timeout", result={"action": "cancel"}
            )
            return
        if action == "cancel_turn":
            self._resolve(held, {"outcome": "cancelled"}, "timeout")
            self.host.cancel_turn("permission_timeout")
            return
        self._reject(held, "timeout")

    def _reject(self, held: HeldRequest, by: str) -> None:
        """Answer with the agent's first reject option, or cancel when it offers none."""
        option = first_option(held.options, "reject_once", "reject_always")
        if option is not None:
            self._resolve(
                held, {"outcome": "selected", "optionId": option.get("optionId")}, by
            )
        else:
            self._resolve(held, {"outcome": "cancelled"}, by)

    def question(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        """``elicitation/create``: a question held for a human."""
        held = self._new_held(
            "question",
            rpc_id,
            message=str(params.get("message") or ""),
            requested_schema=params.get("requestedSchema")
            if params.get("mode", "form") == "form"
            else {"url": params.get("url")},
            policy={"decision": "ask", "rule": None},
        )
        d = self._hold(held)
        self.session.emit(
            "question.requested",
            raw=params,
            request_id=held.request_id,
            message=held.message,
            requested_schema=held.requested_schema,
            mode=params.get("mode", "form"),
        )
        self._arm_timeout(held)
        return d

    def cancel_request(self, rpc_id: Any) -> None:
        """``$/cancel_request``: the agent takes back one of its requests."""
        held = self._by_rpc.get(rpc_id)
        if held is not None:
            self.withdraw(held)
            self.session.conn.respond_error(
                rpc_id, RpcError(REQUEST_CANCELLED, "request cancelled")
            )
            return
        waiter = self.session.rpc_waiters.pop(rpc_id, None)
        if waiter is not None and not waiter.called:
            waiter.errback(RpcError(REQUEST_CANCELLED, "request cancelled"))
