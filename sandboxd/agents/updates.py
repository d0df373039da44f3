# -*- test-case-name: tests.test_agents -*-
"""
``session/update`` folded into the session's state: messages (chunks
joined per message), tool calls (snapshots merged from their updates),
plan, commands, mode, config options, title and usage, each with its event.
"""

from __future__ import annotations

from typing import Any

from sandboxd.agents.filechanges import FileChanges, unified_diff
from sandboxd.agents.state import UNFINISHED, bounded_put
from sandboxd.policy import defaults


class UpdateFolding(FileChanges):
    """What the agent reports, folded as it is read."""

    def _update(self, update: dict[str, Any], raw: Any) -> None:
        kind = update.get("sessionUpdate")
        if kind in ("user_message_chunk", "agent_message_chunk", "agent_thought_chunk"):
            role = {
                "user_message_chunk": "user",
                "agent_message_chunk": "agent",
                "agent_thought_chunk": "thought",
            }[kind]
            content = update.get("content")
            message_id = update.get("messageId")
            key = (role, message_id, self.current.turn_id if self.current else None)
            if (
                message_id is None
                and self._chunk_key is not None
                and self._chunk_key[:1] == (role,)
                and self._chunk_key[2] == key[2]
            ):
                message_id = self._chunk_key[1]
            if message_id is None:
                message_id = f"{role}_{next(self._message_ids)}"
            seq = self.emit(
                "message.delta",
                raw=raw,
                role=role,
                message_id=message_id,
                content=content,
            )
            self._chunk_key = (role, message_id, key[2])
            self._fold_message(role, message_id, content, seq)
            if (
                role == "agent"
                and self.current is not None
                and isinstance(content, dict)
                and content.get("type") == "text"
            ):
                self.current.text.append(str(content.get("text", "")))
        elif kind == "tool_call":
            self._tool_call(update, raw, new=True)
        elif kind == "tool_call_update":
            self._tool_call(update, raw, new=False)
        elif kind == "plan":
            entries: list[dict[str, Any]] = [
                e for e in update.get("entries") or [] if isinstance(e, dict)
            ]
            self.plan = entries
            self.plan_seq = self.emit("plan", raw=raw, entries=entries)
        elif kind == "available_commands_update":
            commands = update.get("availableCommands")
            self.commands = commands if isinstance(commands, list) else []
            self.emit("commands", raw=raw, commands=self.commands)
        elif kind == "current_mode_update":
            mode = update.get("currentModeId")
            if self.modes is not None:
                self.modes = {**self.modes, "currentModeId": mode}
            else:
                self.modes = {"currentModeId": mode, "availableModes": []}
            self.emit("mode", raw=raw, current_mode_id=mode, by="agent")
        elif kind == "config_option_update":
            options = update.get("configOptions")
            if isinstance(options, list):
                self.config_options = options
            self.emit("config", raw=raw, config_options=self.config_options, by="agent")
        elif kind == "session_info_update":
            if "title" in update:
                self.agent_title = update.get("title")
            self.emit(
                "session.info",
                raw=raw,
                title=update.get("title"),
                updated_at=update.get("updatedAt"),
            )
        elif kind == "usage_update":
            self.usage = {
                k: update.get(k) for k in ("used", "size", "cost") if k in update
            }
            if self.current is not None:
                self.current.usage = self.usage
            self.emit("usage", raw=raw, **self.usage)
        else:
            self.emit("unknown", raw=raw, reason=f"session update {kind!r}")

    def _fold_message(self, role: str, message_id: str, content: Any, seq: int) -> None:
        turn_id = self.current.turn_id if self.current else None
        last = self.messages[-1] if self.messages else None
        target = None
        if (
            last is not None
            and last["message_id"] == message_id
            and last["role"] == role
        ):
            target = last
        else:
            for m in reversed(self.messages[-16:]):
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
            self.messages.append(target)
            if self.replaying:
                target["replay"] = True
            if len(self.messages) > defaults.AGENT_KEPT_ITEMS:
                del self.messages[0]
        target["seq_to"] = seq
        blocks = target["content"]
        if (
            isinstance(content, dict)
            and content.get("type") == "text"
            and blocks
            and blocks[-1].get("type") == "text"
        ):
            blocks[-1] = {
                **blocks[-1],
                "text": str(blocks[-1].get("text", "")) + str(content.get("text", "")),
            }
        elif isinstance(content, dict):
            blocks.append(dict(content))

    def _tool_call(self, update: dict[str, Any], raw: Any, new: bool) -> None:
        tool_call_id = update.get("toolCallId")
        if not isinstance(tool_call_id, str):
            self.emit("unknown", raw=raw, reason="tool call without toolCallId")
            return
        snapshot = self.tool_calls.get(tool_call_id)
        turn_id = self.current.turn_id if self.current else None
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
                "turn_id": self.current.turn_id if self.current else None,
                "permission": [],
                "first_seq": self.log.last_seq + 1,
                "last_seq": None,
            }
            bounded_put(self.tool_calls, tool_call_id, snapshot)
            if self.current is not None:
                self.current.tool_call_ids.append(tool_call_id)
                for m in reversed(self.messages):
                    if m["turn_id"] == self.current.turn_id and m["role"] == "agent":
                        m["tool_call_ids"].append(tool_call_id)
                        break
        delta = {k: v for k, v in update.items() if k != "sessionUpdate"}
        for key, value in delta.items():
            if key != "toolCallId" and value is not None:
                snapshot[key] = value
        if new or created:
            seq = self.emit(
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
            seq = self.emit(
                "tool_call.update",
                raw=raw,
                tool_call_id=tool_call_id,
                delta=delta,
                status=snapshot.get("status"),
            )
        snapshot["last_seq"] = seq
        self._note_changes(snapshot)

    def _active_tool_call(self, *paths: Any) -> str | None:
        """
        The tool call a write or a terminal belongs to: the current turn's
        latest call naming one of ``paths``, else its latest unfinished one.
        """
        turn_id = self.current.turn_id if self.current else None
        fallback = None
        for tc in reversed(self.tool_calls.values()):
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
                for t in self.terminals.values()
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
