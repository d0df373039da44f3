# -*- test-case-name: tests.openai_api.test_subagents -*-
"""
What a headless CLI reported of its subagents, kept per session (the
routes are :mod:`sandboxd.openai_api.subagents`).

Claude Code and Qwen Code tag each message of a subagent they started
with the id of the tool call that started it; the bridge reports those
(:data:`~sandboxd.agents.cliparsers.SUBAGENT_NOTIFICATION`), and a
session's face keeps them here, bounded, its secrets masked, in its file
across a restart.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from sandboxd.eventlog import json_size

#: What the CLI may call a subagent (its starting tool call's id).
SUBAGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
#: Subagents kept per session.
MAX_SUBAGENTS = 64
#: Entries kept per subagent (agent-sandbox-server's bound).
MAX_ENTRIES = 2000
#: The JSON size of every subagent's entries of a session together: the
#: session's file keeps them across a restart, within its own bound.
MAX_BYTES = 256 * 1024
#: The longest text kept in one entry (a message, a tool's output).
MAX_TEXT = 16 * 1024
_MAX_NAME = 256
_MAX_INSTRUCTIONS = 8192
_ENTRY_KINDS = ("message", "reasoning", "tool_call", "tool_result")


def _capped(value: Any, limit: int) -> str | None:
    return str(value)[:limit] if value else None


def _shortened(value: Any, depth: int = 0) -> Any:
    """
    A JSON value whose strings are cut at :data:`MAX_TEXT` (a tool call's
    arguments too: a file written whole is one of them); nesting deeper
    than a tool's arguments go is dropped.
    """
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if depth > 8:
        return None
    if isinstance(value, dict):
        return {str(k): _shortened(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_shortened(v, depth + 1) for v in value]
    return value


class Subagents:
    """
    The subagents of one session, as the bridge reported them: each an id,
    a name and instructions (from the call that started it), open and
    close times, and its entries.

    :param redact: masks the session's secrets in a JSON value.
    """

    def __init__(self, redact: Callable[[Any], Any]) -> None:
        self.redact = redact
        self.records: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.size = 0

    def take(self, event: Any) -> tuple[dict[str, Any], list[str]]:
        """
        One event of the bridge's (open, entry, close); others are ignored.
        The subagent's record and what became of it (``created``,
        ``closed``), or ``({}, [])``.
        """
        if not isinstance(event, dict):
            return {}, []
        sid = event.get("id")
        if not isinstance(sid, str) or not SUBAGENT_ID.fullmatch(sid):
            return {}, []
        changes = []
        record = self.records.get(sid)
        if record is None:
            if len(self.records) >= MAX_SUBAGENTS:
                return {}, []
            changes.append("created")
            record = self.records[sid] = {
                "id": sid,
                "name": None,
                "instructions": None,
                "opened_at": int(time.time()),
                "closed_at": None,
                "entries": [],
            }
        for key, limit in (("name", _MAX_NAME), ("instructions", _MAX_INSTRUCTIONS)):
            if record[key] is None and event.get(key):
                record[key] = self.redact(_capped(event[key], limit))
        op = event.get("op")
        if op == "close" and record["closed_at"] is None:
            record["closed_at"] = int(time.time())
            changes.append("closed")
        elif op == "entry":
            self._add(record["entries"], event.get("entry"))
        return record, changes

    def _add(self, entries: list[dict[str, Any]], entry: Any) -> None:
        """An entry, checked and bounded; a tool's result folds into its call."""
        if not isinstance(entry, dict) or entry.get("kind") not in _ENTRY_KINDS:
            return
        clean = self.redact(_shortened(entry))
        if clean["kind"] == "tool_result":
            for existing in reversed(entries):
                if (
                    existing["kind"] == "tool_call"
                    and existing.get("call_id") == clean.get("call_id")
                    and existing.get("ok") is None
                ):
                    grown = json_size(clean.get("output"))
                    if self.size + grown > MAX_BYTES:
                        return
                    self.size += grown
                    existing["output"] = clean.get("output")
                    existing["ok"] = bool(clean.get("ok", True))
                    return
            return
        size = json_size(clean)
        if len(entries) >= MAX_ENTRIES or self.size + size > MAX_BYTES:
            return
        if clean["kind"] == "tool_call":
            clean.update(output=None, ok=None)
        self.size += size
        entries.append(clean)

    def restore(self, records: Any) -> None:
        """Records as a session's file kept them."""
        for record in records if isinstance(records, list) else []:
            if isinstance(record, dict) and isinstance(record.get("id"), str):
                self.records[record["id"]] = record
                self.size += json_size(record.get("entries") or [])

    def kept(self) -> list[dict[str, Any]]:
        """The records, for the session's file."""
        return list(self.records.values())


def describe(record: dict[str, Any], session_id: str, agent_id: str) -> dict[str, Any]:
    """A subagent as the ``agent.session.subagent`` object."""
    instructions = record["instructions"]
    return {
        "id": record["id"],
        "object": "agent.session.subagent",
        "session_id": session_id,
        "parent_agent_id": agent_id,
        "name": record["name"],
        "instructions": [{"type": "input_text", "text": instructions}]
        if instructions
        else None,
        "opened_at": record["opened_at"],
        "closed_at": record["closed_at"],
        "status": "closed" if record["closed_at"] is not None else "active",
    }
