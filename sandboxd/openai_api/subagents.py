# -*- test-case-name: tests.openai_api.test_traces -*-
"""
A session's subagents through the ``/v1`` door.

ACP has no notion of a subagent: an agent's own helpers run inside its
process and reach the daemon as its tool calls, which the session's items
already show.  So no session has a subagent: the list is empty and every
subagent id is unknown (404), which is what the SDK's callers handle for a
session whose agent spawned none.
"""

from __future__ import annotations

from typing import Any

from sandboxd.errors import not_found
from sandboxd.openai_api.registry import face_of, page, restored_first
from sandboxd.web.messages import ServerRequest


def agents_subagents_list(request: ServerRequest) -> dict[str, Any]:
    """The session's subagents: none (an ACP agent reports none)."""
    face_of(request)
    return page(request, [])


def _no_subagent(request: ServerRequest) -> Any:
    face_of(request)
    subagent_id = request.path_params["subagent_id"]
    raise not_found(f"No subagent found with id {subagent_id!r}", param="subagent_id")


def agents_subagents_get(request: ServerRequest) -> Any:
    """One subagent: never found (see the module's docstring)."""
    return _no_subagent(request)


def agents_subagents_items_list(request: ServerRequest) -> Any:
    """A subagent's items: its subagent is never found."""
    return _no_subagent(request)


def agents_subagents_turns_list(request: ServerRequest) -> Any:
    """A subagent's turns: its subagent is never found."""
    return _no_subagent(request)


def agents_subagents_turns_get(request: ServerRequest) -> Any:
    """A subagent's turn: its subagent is never found."""
    return _no_subagent(request)


def agents_subagents_turns_items_list(request: ServerRequest) -> Any:
    """A subagent turn's items: its subagent is never found."""
    return _no_subagent(request)


HANDLERS: dict[str, Any] = {
    "agents_subagents_list": agents_subagents_list,
    "agents_subagents_get": agents_subagents_get,
    "agents_subagents_items_list": agents_subagents_items_list,
    "agents_subagents_turns_list": agents_subagents_turns_list,
    "agents_subagents_turns_get": agents_subagents_turns_get,
    "agents_subagents_turns_items_list": agents_subagents_turns_items_list,
}
HANDLERS = restored_first(HANDLERS)
