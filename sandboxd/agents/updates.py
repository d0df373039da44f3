# -*- test-case-name: tests.agents.test_agents -*-
"""
``session/update`` folded into the session's state: messages (chunks
joined per message), tool calls (snapshots merged from their updates),
plan, commands, mode, config options, title and usage, each with its event.
"""

from __future__ import annotations

from typing import Any

from sandboxd.agents.filechanges import FileChanges, unified_diff
from sandboxd.agents.permissions import TOOL_KINDS
from sandboxd.agents.state import UNFINISHED, SessionState, bounded_put
from sandboxd.eventlog import json_size
from sandboxd.policy import defaults

#: A message's key for the chunks of its last text block not yet joined.
PIECES = "_pieces"

#: A message's key for the bytes of its content kept so far.
KEPT_BYTES = "_bytes"

#: ACP's tool call statuses (its kinds are TOOL_KINDS): a value outside
#: them is not kept.
TOOL_STATUSES = ("pending", "in_progress", "completed", "failed")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _optional_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


#: What each field of a tool call holds when the agent sends it; a field
#: whose value is not that is left out of the snapshot (and named in an
#: ``unknown`` event), so a typed client reading the routes never meets a
#: status of 7 or a title that is a list.
_TOOL_FIELDS: dict[str, Any] = {
    "title": lambda v: isinstance(v, str),
    "kind": lambda v: v in TOOL_KINDS,
    "status": lambda v: v in TOOL_STATUSES,
    "locations": lambda v: (
        isinstance(v, list)
        and all(isinstance(x, dict) and isinstance(x.get("path"), str) for x in v)
    ),
    "content": lambda v: (
        isinstance(v, list)
        and all(
            isinstance(x, dict)
            and (x.get("type") != "diff" or isinstance(x.get("path"), str))
            for x in v
        )
    ),
}


def settled(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with its last text block whole (its chunks joined)."""
    pieces = message.pop(PIECES, None)
    if pieces is not None:
        blocks = message["content"]
        blocks[-1] = {**blocks[-1], "text": "".join(pieces)}
    return message


class UpdateFolding:
    """
    What the agent reports, folded as it is read into the session's
    messages, tool calls, plan, commands, modes and usage; the paths its
    tool calls touch go to ``changes``.
    """

    def __init__(self, session: SessionState, changes: FileChanges) -> None:
        self.session = session
        self.changes = changes

    def update(self, update: dict[str, Any], raw: Any) -> None:
        """One ``session/update`` notification's ``update``."""
        s = self.session
        kind = update.get("sessionUpdate")
        if kind in ("user_message_chunk", "agent_message_chunk", "agent_thought_chunk"):
            role = {
                "user_message_chunk": "user",
                "agent_message_chunk": "agent",
                "agent_thought_chunk": "thought",
            }[kind]
            content = update.get("content")
            if not isinstance(content, dict) or (
                content.get("type") == "text"
                and not isinstance(content.get("text"), str)
            ):
                s.emit(
                    "unknown", raw=raw, reason="message chunk without a content block"
                )
                return
            message_id = update.get("messageId")
            if not isinstance(message_id, str):
                message_id = None
            key = (role, message_id, s.current.turn_id if s.current else None)
            if (
                message_id is None
                and s.chunk_key is not None
                and s.chunk_key[:1] == (role,)
                and s.chunk_key[2] == key[2]
            ):
                message_id = s.chunk_key[1]
            if message_id is None:
                message_id = f"{role}_{next(s.message_ids)}"
            seq = s.emit(
                "message.delta",
                raw=raw,
                role=role,
                message_id=message_id,
                content=content,
            )
            s.chunk_key = (role, message_id, key[2])
            self.fold_message(role, message_id, content, seq)
            if (
                role == "agent"
                and s.current is not None
                and content.get("type") == "text"
            ):
                s.current.text.append(content["text"])
        elif kind == "tool_call":
            self.tool_call(update, raw, new=True)
        elif kind == "tool_call_update":
            self.tool_call(update, raw, new=False)
        elif kind == "plan":
            given = update.get("entries")
            if not isinstance(given, list):
                s.emit("unknown", raw=raw, reason="plan without a list of entries")
                return
            entries: list[dict[str, Any]] = [
                e
                for e in given
                if isinstance(e, dict) and isinstance(e.get("content"), str)
            ]
            s.plan = entries
            s.plan_seq = s.emit("plan", raw=raw, entries=entries)
        elif kind == "available_commands_update":
            commands = update.get("availableCommands")
            if not isinstance(commands, list):
                s.emit("unknown", raw=raw, reason="commands without a list")
                return
            s.commands = [
                c
                for c in commands
                if isinstance(c, dict) and isinstance(c.get("name"), str)
            ]
            s.emit("commands", raw=raw, commands=s.commands)
        elif kind == "current_mode_update":
            mode = update.get("currentModeId")
            if not isinstance(mode, str):
                s.emit("unknown", raw=raw, reason="mode update without a mode id")
                return
            if s.modes is not None:
                s.modes = {**s.modes, "currentModeId": mode}
            else:
                s.modes = {"currentModeId": mode, "availableModes": []}
            s.emit("mode", raw=raw, current_mode_id=mode, by="agent")
        elif kind == "config_option_update":
            options = update.get("configOptions")
            if not isinstance(options, list):
                s.emit("unknown", raw=raw, reason="config options without a list")
                return
            s.config_options = [o for o in options if isinstance(o, dict)]
            s.emit("config", raw=raw, config_options=s.config_options, by="agent")
        elif kind == "session_info_update":
            title, updated = update.get("title"), update.get("updatedAt")
            if not (_optional_str(title) and _optional_str(updated)):
                s.emit("unknown", raw=raw, reason="session info of the wrong type")
                return
            if "title" in update:
                s.agent_title = title
            s.emit("session.info", raw=raw, title=title, updated_at=updated)
        elif kind == "usage_update":
            if not _number(update.get("used")) or not all(
                k not in update or check(update[k])
                for k, check in (
                    ("size", _number),
                    ("cost", lambda v: v is None or isinstance(v, dict)),
                )
            ):
                s.emit("unknown", raw=raw, reason="usage of the wrong type")
                return
            s.usage = {
                k: update.get(k) for k in ("used", "size", "cost") if k in update
            }
            if s.current is not None:
                s.current.usage = s.usage
            s.emit("usage", raw=raw, **s.usage)
        else:
            s.emit("unknown", raw=raw, reason=f"session update {kind!r}")

    def fold_message(self, role: str, message_id: str, content: Any, seq: int) -> None:
        """A message chunk (event ``seq``) joined to its message."""
        s = self.session
        turn_id = s.current_turn_id
        last = s.messages[-1] if s.messages else None
        target = None
        if (
            last is not None
            and last["message_id"] == message_id
            and last["role"] == role
        ):
            target = last
        else:
            for m in reversed(s.messages[-16:]):
                if (
                    m["message_id"] == message_id
                    and m["role"] == role
                    and m["turn_id"] == turn_id
                ):
                    target = m
                    break
        if target is None:
            target = {
                "message_id": message_id,
                "turn_id": turn_id,
                "role": role,
                "content": [],
                "tool_call_ids": [],
                "seq_from": seq,
                "seq_to": seq,
            }
            s.messages.append(target)
            if s.replaying:
                target["replay"] = True
            if len(s.messages) > defaults.AGENT_KEPT_ITEMS:
                del s.messages[0]
        target["seq_to"] = seq
        if not isinstance(content, dict):
            return
        is_text = content.get("type") == "text" and isinstance(content.get("text"), str)
        size = len(content["text"].encode()) if is_text else json_size(content)
        kept = target.get(KEPT_BYTES, 0) + size
        if kept > s.max_message_bytes:
            # The events still carry every chunk; the folded message keeps
            # what one line from the agent may hold, and says it was cut.
            target["truncated"] = True
            return
        target[KEPT_BYTES] = kept
        blocks = target["content"]
        if is_text and blocks and blocks[-1].get("type") == "text":
            # The chunks of a streamed text are joined when it is read
            # (:func:`settled`), not once per chunk: a long answer in small
            # chunks would copy its whole text each time.
            pieces = target.get(PIECES)
            if pieces is None:
                pieces = target[PIECES] = [str(blocks[-1].get("text", ""))]
            pieces.append(str(content.get("text", "")))
        else:
            settled(target)
            blocks.append(dict(content))

    def tool_call(self, update: dict[str, Any], raw: Any, new: bool) -> None:
        """A ``tool_call`` (``new``) or ``tool_call_update``, merged into its snapshot."""
        s = self.session
        tool_call_id = update.get("toolCallId")
        if not isinstance(tool_call_id, str):
            s.emit("unknown", raw=raw, reason="tool call without toolCallId")
            return
        snapshot = s.tool_calls.get(tool_call_id)
        turn_id = s.current_turn_id
        if new and snapshot is not None and snapshot.get("turn_id") != turn_id:
            # Agents number tool calls per turn; a new start is a new call.
            snapshot = None
        created = snapshot is None
        if snapshot is None:
            snapshot = {
                "toolCallId": tool_call_id,
                "title": None,
                "kind": "other",
                "status": "pending",
                "content": [],
                "locations": [],
                "rawInput": None,
                "rawOutput": None,
                "turn_id": s.current_turn_id,
                "permission": [],
                "first_seq": s.log.last_seq + 1,
                "last_seq": None,
            }
            bounded_put(s.tool_calls, tool_call_id, snapshot)
            if s.current is not None:
                s.current.tool_call_ids.append(tool_call_id)
                for m in reversed(s.messages):
                    if m["turn_id"] == s.current.turn_id and m["role"] == "agent":
                        m["tool_call_ids"].append(tool_call_id)
                        break
        delta = {k: v for k, v in update.items() if k != "sessionUpdate"}
        wrong = sorted(
            k
            for k, v in delta.items()
            if v is not None and k in _TOOL_FIELDS and not _TOOL_FIELDS[k](v)
        )
        if wrong:
            s.emit(
                "unknown",
                raw=raw,
                reason=f"tool call fields of the wrong type left out: {', '.join(wrong)}",
            )
            for key in wrong:
                del delta[key]
        for key, value in delta.items():
            if key != "toolCallId" and value is not None:
                snapshot[key] = value
        if new or created:
            seq = s.emit(
                "tool_call",
                raw=raw,
                tool_call_id=tool_call_id,
                title=snapshot.get("title"),
                kind=snapshot.get("kind"),
                status=snapshot.get("status"),
                locations=snapshot.get("locations"),
                content=snapshot.get("content"),
            )
        else:
            seq = s.emit(
                "tool_call.update",
                raw=raw,
                tool_call_id=tool_call_id,
                delta=delta,
                status=snapshot.get("status"),
            )
        snapshot["last_seq"] = seq
        self.changes.note_changes(snapshot)

    def active_tool_call(self, *paths: Any) -> str | None:
        """
        The tool call a write or a terminal belongs to: the current turn's
        latest call naming one of ``paths``, else its latest unfinished one.
        """
        turn_id = self.session.current_turn_id
        fallback = None
        for tc in reversed(self.session.tool_calls.values()):
            if tc.get("turn_id") != turn_id:
                continue
            named = {
                loc.get("path")
                for loc in tc.get("locations") or []
                if isinstance(loc, dict)
            }
            named.update(
                c.get("path") for c in tc.get("content") or [] if isinstance(c, dict)
            )
            if any(p in named for p in paths if p):
                return str(tc["toolCallId"])
            if fallback is None and tc.get("status") in UNFINISHED:
                fallback = str(tc["toolCallId"])
        return fallback

    def tool_call_view(
        self, tc: dict[str, Any], full: bool = False, unified: bool = False
    ) -> dict[str, Any]:
        """One tool call, summarised or whole."""
        content = tc.get("content") or []
        diffs = [c for c in content if isinstance(c, dict) and c.get("type") == "diff"]
        out: dict[str, Any] = {
            "tool_call_id": tc["toolCallId"],
            "turn_id": tc.get("turn_id"),
            "title": tc.get("title"),
            "kind": tc.get("kind"),
            "status": tc.get("status"),
            "locations": tc.get("locations") or [],
            "has_diff": bool(diffs),
            "terminal_ids": [
                c.get("terminalId")
                for c in content
                if isinstance(c, dict) and c.get("type") == "terminal"
            ]
            + [
                t.terminal_id
                for t in self.session.terminals.values()
                if t.tool_call_id == tc["toolCallId"]
            ],
            "permission": (tc.get("permission") or [None])[-1],
            "first_seq": tc.get("first_seq"),
            "last_seq": tc.get("last_seq"),
        }
        if full:
            out["content"] = content
            out["raw_input"] = tc.get("rawInput")
            out["raw_output"] = tc.get("rawOutput")
            out["permission_history"] = tc.get("permission") or []
            out["diffs"] = []
            for d in diffs:
                item = {
                    "path": d.get("path"),
                    "old_text": d.get("oldText"),
                    "new_text": d.get("newText"),
                }
                if unified:
                    item["unified"] = unified_diff(
                        d.get("path"), d.get("oldText"), d.get("newText")
                    )
                out["diffs"].append(item)
        return out
