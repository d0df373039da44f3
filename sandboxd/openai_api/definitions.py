# -*- test-case-name: tests.openai_api.test_definitions -*-
"""
Agent definitions (``client.beta.agents``): a named, reusable agent — which
catalogue agent runs (``model``, or ``adapter`` with the model it is given),
its name and instructions — that a
session (``agent_id``) or a response (``model: agent_…``) starts from.

Definitions belong to the identity that made them and, with a state dir,
outlive the daemon like the sessions they configure (:mod:`.store`).  Their MCP tools (:mod:`.tools`) are shown
with every header value masked.
"""

from __future__ import annotations

import time
from typing import Any

from sandboxd.agents import catalog
from sandboxd.api.schema import schema_for
from sandboxd.errors import bad_request, not_found
from sandboxd.openai_api import runtimes
from sandboxd.openai_api.face import new_id
from sandboxd.openai_api.inputs import metadata, reasoning_effort, refuse_multi_agent
from sandboxd.openai_api.registry import door, owner_of, page, restored_first
from sandboxd.openai_api.stores import owned, room_for_one
from sandboxd.openai_api.tools import describe_tools, parse_tools
from sandboxd.policy import defaults
from sandboxd.web.messages import ServerRequest
from sandboxd.web.params import declared_types

#: What a definition takes; OpenAI's other fields are refused, not ignored.
_KEYS = (
    "model",
    "name",
    "instructions",
    "metadata",
    "tools",
    "reasoning",
    "text",
    "service_tier",
    "multi_agent",
    "adapter",
    "runtime",
)


def _string(body: dict[str, Any], key: str, limit: int) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise bad_request(
            f"{key} must be a string of at most {limit} characters", param=key
        )
    return value


def _checked(
    request: ServerRequest,
    body: dict[str, Any],
    partial: bool,
    runtime: str | None = None,
) -> dict[str, Any]:
    """
    The fields of a create (or of an update, ``partial``, of a definition
    whose agent is ``runtime``), checked.
    """
    for key in body:
        if key not in _KEYS:
            raise bad_request(f"{key}: unknown or unsupported parameter", param=key)
        if partial and key in ("adapter", "runtime"):
            raise bad_request(
                f"{key}: the agent of a definition cannot change", param=key
            )
    # text and service_tier are taken and not used: a wrong type is
    # refused all the same, as OpenAI refuses it.
    declared_types(body, schema_for("agents_definitions_create").body, name_param=True)
    refuse_multi_agent(body.get("multi_agent"), "multi_agent")
    out: dict[str, Any] = {}
    if "model" in body or not partial:
        model = _string(body, "model", defaults.OPENAI_MAX_NAME_CHARS)
        if not model:
            raise bad_request(
                "model is required: an agent of the catalogue", param="model"
            )
        chosen, passed = runtimes.select(request, body, model=model, default=runtime)
        catalog.find(request.context, request.rule, chosen)
        out.update(model=model, runtime=chosen, pass_model=passed)
    for key, limit in (
        ("name", defaults.OPENAI_MAX_NAME_CHARS),
        ("instructions", defaults.OPENAI_MAX_INSTRUCTIONS_CHARS),
    ):
        if key in body:
            out[key] = _string(body, key, limit)
    if "metadata" in body:
        out["metadata"] = metadata(body["metadata"])
    if "tools" in body:
        out["tools"] = parse_tools(body["tools"])
    if "reasoning" in body:
        out["reasoning_effort"] = reasoning_effort(body["reasoning"], "reasoning")
    return out


def describe(record: dict[str, Any]) -> dict[str, Any]:
    """The ``agent`` object."""
    return {
        "id": record["id"],
        "object": "agent",
        "created_at": record["created_at"],
        "updated_at": record["updated_at"],
        "name": record.get("name"),
        "model": record["model"],
        "instructions": record.get("instructions"),
        "metadata": record.get("metadata") or {},
        "multi_agent": {"enabled": False},
        "reasoning": {"effort": record.get("reasoning_effort"), "summary": None},
        "service_tier": "default",
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tools": describe_tools(record.get("tools") or []),
    }


def find(
    request: ServerRequest, agent_id: str, param: str = "agent_id"
) -> dict[str, Any]:
    """The caller's definition ``agent_id``, or 404."""
    record: dict[str, Any] | None = door(request).definitions.get(agent_id)
    if record is None or record["owner"] != owner_of(request):
        raise not_found(f"No agent found with id {agent_id!r}", param=param)
    return record


def session_agent(record: dict[str, Any]) -> dict[str, Any]:
    """
    A stored definition as the agent of a session or a response: its model
    names the runtime, and its MCP tools reach the agent (header values,
    no vault).
    """
    return {
        "id": record["id"],
        "runtime": record.get("runtime") or record["model"],
        "model": record["model"],
        "pass_model": record.get("pass_model"),
        "name": record.get("name"),
        "instructions": record.get("instructions"),
        "tools": list(record.get("tools") or []),
        "reasoning_effort": record.get("reasoning_effort"),
    }


def agents_definitions_create(request: ServerRequest) -> dict[str, Any]:
    """Store a definition."""
    fields = _checked(request, request.body, partial=False)
    reg = door(request)
    mine = owned(reg.definitions, owner_of(request))
    room_for_one(len(mine), defaults.AGENT_KEPT_ITEMS, "agents")
    now = int(time.time())
    record = {
        "id": new_id("agent_"),
        "owner": owner_of(request),
        "created_at": now,
        "updated_at": now,
        "metadata": {},
        **fields,
    }
    reg.definitions[record["id"]] = record
    return describe(record)


def agents_definitions_list(request: ServerRequest) -> dict[str, Any]:
    """The caller's definitions."""
    mine = [
        describe(r)
        for r in door(request).definitions.values()
        if r["owner"] == owner_of(request)
    ]
    return page(request, mine)


def agents_definitions_get(request: ServerRequest) -> dict[str, Any]:
    """One definition."""
    return describe(find(request, request.path_params["agent_id"]))


def agents_definitions_update(request: ServerRequest) -> dict[str, Any]:
    """Change a definition (sessions already started keep what they had)."""
    record = find(request, request.path_params["agent_id"])
    record.update(
        _checked(
            request,
            request.body,
            partial=True,
            runtime=record.get("runtime") or record["model"],
        )
    )
    record["updated_at"] = int(time.time())
    return describe(record)


def agents_definitions_delete(request: ServerRequest) -> dict[str, Any]:
    """Forget a definition."""
    record = find(request, request.path_params["agent_id"])
    door(request).definitions.pop(record["id"], None)
    return {"id": record["id"], "object": "agent.deleted", "deleted": True}


HANDLERS: dict[str, Any] = {
    "agents_definitions_create": agents_definitions_create,
    "agents_definitions_list": agents_definitions_list,
    "agents_definitions_get": agents_definitions_get,
    "agents_definitions_update": agents_definitions_update,
    "agents_definitions_delete": agents_definitions_delete,
}
HANDLERS = restored_first(HANDLERS)
