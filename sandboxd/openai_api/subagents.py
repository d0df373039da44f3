# -*- test-case-name: tests.openai_api.test_subagents -*-
"""
A session's subagents through the ``/v1`` door, as agent-sandbox-server
shows them.

ACP has no notion of a subagent: an ACP agent's helpers run inside its
process and reach the daemon as its tool calls, which the session's items
already show.  A headless CLI (Claude Code, Qwen Code) tags each message of
a subagent it started with the id of the tool call that started it; the
bridge reports those and the session keeps them apart from its turns
(:mod:`sandboxd.openai_api.subagent_records`): a subagent's words are not
the agent's answer.  Only ids the CLI emitted are shown, and a
subagent's "turns" are its entries split after each of its assistant
messages, as the seed groups them.
"""

from __future__ import annotations

from typing import Any

from sandboxd.errors import not_found
from sandboxd.openai_api.registry import face_of, page, restored_first
from sandboxd.openai_api.subagent_records import describe
from sandboxd.web.messages import ServerRequest


def _describe(face: Any, record: dict[str, Any]) -> dict[str, Any]:
    return describe(record, face.id, face.agent["id"])


def _turns(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries split after each assistant message: ``{id, entries, complete}``."""
    turns: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for entry in record["entries"]:
        if current is None:
            current = {
                "id": f"turn_{len(turns) + 1}_{record['id']}",
                "entries": [],
                "complete": False,
            }
            turns.append(current)
        current["entries"].append(entry)
        if entry["kind"] == "message" and entry.get("role") == "assistant":
            current["complete"] = True
            current = None
    return turns


def _turn(face: Any, record: dict[str, Any], turn: dict[str, Any]) -> dict[str, Any]:
    done = turn["complete"] or record["closed_at"] is not None or not face.busy
    return {
        "id": turn["id"],
        "object": "agent.session.turn",
        "agent_id": record["id"],
        "session_id": face.id,
        "status": "completed" if done else "in_progress",
        "created_at": record["opened_at"],
        "started_at": record["opened_at"],
        "completed_at": (record["closed_at"] or record["opened_at"]) if done else None,
        "error": None,
        "subagent_id": record["id"],
        "usage": None,
    }


def _item(turn_id: str, position: int, entry: dict[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {"id": f"item_{position}_{turn_id}", "turn_id": turn_id}
    kind = entry["kind"]
    if kind == "message":
        role = "user" if entry.get("role") == "user" else "assistant"
        part = "output_text" if role == "assistant" else "input_text"
        item.update(
            type="message",
            role=role,
            status="completed",
            content=[{"type": part, "text": entry.get("text") or ""}],
        )
    elif kind == "reasoning":
        item.update(
            type="reasoning",
            status="completed",
            summary=[{"type": "summary_text", "text": entry.get("text") or ""}],
        )
    else:
        ok = entry.get("ok")
        item.update(
            type="tool_call",
            status="in_progress" if ok is None else ("completed" if ok else "failed"),
            tool_name=entry.get("name"),
            arguments=entry.get("arguments"),
            output=entry.get("output"),
        )
    return item


def _items(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        _item(turn["id"], position, entry)
        for turn in turns
        for position, entry in enumerate(turn["entries"], start=1)
    ]


def _record(request: ServerRequest) -> tuple[Any, dict[str, Any]]:
    face = face_of(request)
    subagent_id = request.path_params["subagent_id"]
    record = face.subagents.records.get(subagent_id)
    if record is None:
        raise not_found(
            f"No subagent found with id {subagent_id!r}", param="subagent_id"
        )
    return face, record


def _one_turn(request: ServerRequest) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    face, record = _record(request)
    turn_id = request.path_params["turn_id"]
    for turn in _turns(record):
        if turn["id"] == turn_id:
            return face, record, turn
    raise not_found(f"No turn found with id {turn_id!r}", param="turn_id")


def agents_subagents_list(request: ServerRequest) -> dict[str, Any]:
    """The subagents the session's CLI reported (paged newest first)."""
    face = face_of(request)
    records = sorted(
        face.subagents.records.values(), key=lambda r: (r["opened_at"], r["id"])
    )
    return page(request, [_describe(face, r) for r in records])


def agents_subagents_get(request: ServerRequest) -> dict[str, Any]:
    """One subagent."""
    face, record = _record(request)
    return _describe(face, record)


def agents_subagents_items_list(request: ServerRequest) -> dict[str, Any]:
    """A subagent's items: messages, reasoning and tool calls, results folded in."""
    _, record = _record(request)
    return page(request, _items(_turns(record)))


def agents_subagents_turns_list(request: ServerRequest) -> dict[str, Any]:
    """A subagent's turns."""
    face, record = _record(request)
    turns = [_turn(face, record, t) for t in _turns(record)]
    return page(request, turns)


def agents_subagents_turns_get(request: ServerRequest) -> dict[str, Any]:
    """One turn of a subagent."""
    face, record, turn = _one_turn(request)
    return _turn(face, record, turn)


def agents_subagents_turns_items_list(request: ServerRequest) -> dict[str, Any]:
    """One turn's items."""
    _, _, turn = _one_turn(request)
    return page(request, _items([turn]))


HANDLERS: dict[str, Any] = {
    "agents_subagents_list": agents_subagents_list,
    "agents_subagents_get": agents_subagents_get,
    "agents_subagents_items_list": agents_subagents_items_list,
    "agents_subagents_turns_list": agents_subagents_turns_list,
    "agents_subagents_turns_get": agents_subagents_turns_get,
    "agents_subagents_turns_items_list": agents_subagents_turns_items_list,
}
HANDLERS = restored_first(HANDLERS)
