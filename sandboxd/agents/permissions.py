# -*- test-case-name: tests.agents.test_agents -*-
"""
Permission requests and questions the agent holds open (SPEC §15.3).

``params.permission_mode`` answers what it can (``auto`` takes the first
``allow_once``, ``deny`` the first ``reject_once``; the daemon never picks
an "always" option by itself), a tool call touching a path outside the
endpoint's ``paths`` rule is rejected whatever the mode, and everything
else waits for a human with ``agents:approve`` — up to
``permission_timeout_seconds``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import attrs

from sandboxd.access.guard import PathGuard
from sandboxd.errors import ApiError, policy_rule
from sandboxd.policy.defaults import AGENT_FULL_ACCESS_MODES, AGENT_PERMISSION_MODE
from sandboxd.policy.rules import EffectiveRule

TOOL_KINDS = (
    "read",
    "edit",
    "delete",
    "move",
    "search",
    "execute",
    "think",
    "fetch",
    "switch_mode",
    "other",
)
DECISIONS = ("allow_once", "allow_always", "reject_once", "reject_always")
_WRITE_KINDS = ("edit", "delete", "move")

_counter = itertools.count(1)


def new_request_id() -> str:
    """A request id unique within the daemon."""
    return f"req_{next(_counter)}_{int(time.time() * 1000) % 100000:05d}"


def mode_for(rule: EffectiveRule, kind: str | None) -> tuple[str, str]:
    """``(auto|ask|deny, rule)`` for a tool kind."""
    table = rule.params.permission_mode
    source = policy_rule(rule, "params.permission_mode")
    if table is None:
        table = AGENT_PERMISSION_MODE
    key = kind if kind in TOOL_KINDS else "other"
    mode = table.get(key, table.get("*", "ask"))
    if mode not in ("auto", "ask", "deny"):
        mode = "ask"
    return mode, source


def tool_call_paths(tool_call: dict[str, Any]) -> list[str]:
    """Every path a tool call names: its locations and its diffs."""
    paths: list[str] = []
    for location in tool_call.get("locations") or []:
        if isinstance(location, dict) and isinstance(location.get("path"), str):
            paths.append(location["path"])
    for item in tool_call.get("content") or []:
        if (
            isinstance(item, dict)
            and item.get("type") == "diff"
            and isinstance(item.get("path"), str)
        ):
            paths.append(item["path"])
    return paths


def path_refusal(rule: EffectiveRule, tool_call: dict[str, Any]) -> ApiError | None:
    """The guard's refusal for the first path outside the rule, if any."""
    guard = PathGuard(rule)
    op = (
        "write"
        if tool_call.get("kind") in _WRITE_KINDS or tool_call.get("kind") is None
        else "read"
    )
    for path in tool_call_paths(tool_call):
        try:
            guard.check(path, op)
        except ApiError as e:
            return e
    return None


def first_option(options: list[dict[str, Any]], *kinds: str) -> dict[str, Any] | None:
    """The first option whose ``kind`` is one of ``kinds`` (in that preference)."""
    for kind in kinds:
        for option in options:
            if option.get("kind") == kind:
                return option
    return None


#: Every state a held request can be in: waiting for an answer, answered,
#: or withdrawn (its turn ended first).
REQUEST_STATES = ("pending", "resolved", "withdrawn")


@attrs.define(eq=False)
class HeldRequest:
    """
    One open ``session/request_permission`` or ``elicitation/create``.

    :ivar answer: sends the JSON-RPC result to the agent (set by the session).
    """

    request_id: str
    kind: str
    session_id: str
    rpc_id: Any
    turn_id: str | None
    created_at: float
    deadline: float | None
    answer: Callable[[dict[str, Any]], None]
    tool_call: dict[str, Any] | None = None
    options: list[dict[str, Any]] = attrs.Factory(list)
    message: str | None = None
    requested_schema: Any = None
    policy: dict[str, Any] = attrs.Factory(dict)
    state: str = "pending"
    outcome: Any = None
    by: str | None = None
    timer: Any = None

    def describe(self) -> dict[str, Any]:
        """The ``agents_requests`` entry."""
        out: dict[str, Any] = {
            "request_id": self.request_id,
            "kind": self.kind,
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "state": self.state,
            "created_at": _iso(self.created_at),
            "deadline": _iso(self.deadline) if self.deadline else None,
            "policy": self.policy,
        }
        if self.kind == "permission":
            tc = self.tool_call or {}
            out["tool_call"] = {
                "id": tc.get("toolCallId"),
                "title": tc.get("title"),
                "kind": tc.get("kind"),
                "raw_input": tc.get("rawInput"),
                "locations": tc.get("locations") or [],
                "diffs": [
                    {
                        "path": c.get("path"),
                        "old_text": c.get("oldText"),
                        "new_text": c.get("newText"),
                    }
                    for c in tc.get("content") or []
                    if isinstance(c, dict) and c.get("type") == "diff"
                ],
            }
            out["options"] = [
                {
                    "option_id": o.get("optionId"),
                    "name": o.get("name"),
                    "kind": o.get("kind"),
                }
                for o in self.options
            ]
        else:
            out["message"] = self.message
            out["requested_schema"] = self.requested_schema
        if self.state != "pending":
            out["outcome"] = self.outcome
            out["by"] = self.by
        return out


def _iso(ts: float) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
        + f".{int(ts * 1000) % 1000:03d}Z"
    )


def iso(ts: float) -> str:
    """ISO 8601 UTC with milliseconds."""
    return _iso(ts)


def headless_access(rule: EffectiveRule) -> str:
    """
    How much a headless CLI may do (:mod:`sandboxd.agents.clibridge`): it
    asks nobody, so it gets what ``params.permission_mode`` answers
    ``auto`` without a person.  ``full_access`` when every tool kind is
    ``auto``, the modes that skip permission requests are allowed and the
    rule names no paths (the CLI's own file access is not checked against
    them); ``workspace_write`` when edits, deletes and moves are ``auto``;
    otherwise ``read_only``.  The CLI's own sandbox or approval mode holds
    it there.
    """
    auto = {kind for kind in TOOL_KINDS if mode_for(rule, kind)[0] == "auto"}
    params = rule.params
    modes_allowed = all(
        mode not in params.deny_modes
        and (params.allow_modes is None or mode in params.allow_modes)
        for mode in AGENT_FULL_ACCESS_MODES
    )
    paths = rule.paths
    if (
        auto == set(TOOL_KINDS)
        and modes_allowed
        and not (paths.allow or paths.deny or paths.read_only)
    ):
        return "full_access"
    if auto.issuperset(_WRITE_KINDS):
        return "workspace_write"
    return "read_only"
