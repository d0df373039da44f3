# -*- test-case-name: tests.agents.test_cliparsers -*-
"""
What a coding agent's CLI prints in its headless mode, read as ACP
``session/update`` payloads (the bridge in :mod:`sandboxd.agents.clibridge`
sends them on to the daemon).

Two line formats cover the CLIs agent-sandbox-server runs: ``codex exec
--json`` (one JSON event per line: ``thread.started``, ``item.*``,
``turn.completed``/``turn.failed``) and the ``--output-format stream-json``
of Claude Code and Qwen Code (Anthropic's message shapes, with partial
``stream_event`` deltas).  Each reader is a pure function of the lines it
is fed, so it is tested line by line; this module imports nothing beyond
the standard library, as it runs in the bridge's own process.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Outcome:
    """How the CLI said its turn ended (``message`` when it failed)."""

    ok: bool
    stop_reason: str = "end_turn"
    message: str | None = None


#: The notification (an ACP extension method) that carries what a CLI's
#: subagent did: its params are ``{"sessionId", "subagent": EVENT}``, an
#: event being ``{"op": "open"|"entry"|"close", "id", "name",
#: "instructions", "entry"}`` (:class:`StreamJsonEvents`).
SUBAGENT_NOTIFICATION = "_sandboxd/subagent"


@dataclass
class Parsed:
    """What one line says: updates to send, and facts about the turn."""

    updates: list[dict[str, Any]] = field(default_factory=list)
    #: What the CLI's subagents did (:data:`SUBAGENT_NOTIFICATION`'s events).
    subagents: list[dict[str, Any]] = field(default_factory=list)
    #: The CLI's own session id, to resume it on the next turn.
    session_id: str | None = None
    #: Token counts as ACP's ``PromptResponse.usage`` names them.
    usage: dict[str, int] | None = None
    outcome: Outcome | None = None


def message_chunk(text: str) -> dict[str, Any]:
    return {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": text},
    }


def thought_chunk(text: str) -> dict[str, Any]:
    return {
        "sessionUpdate": "agent_thought_chunk",
        "content": {"type": "text", "text": text},
    }


def tool_started(
    call_id: str,
    title: str,
    kind: str,
    raw_input: Any,
    paths: list[str] | None = None,
    mcp: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """
    A ``tool_call`` update; ``mcp``: the MCP server and tool it calls, put
    in its ``_meta`` (ACP's place for what its schema lacks).
    """
    update: dict[str, Any] = {
        "sessionUpdate": "tool_call",
        "toolCallId": call_id,
        "title": title,
        "kind": kind,
        "status": "in_progress",
        "rawInput": raw_input,
    }
    if paths:
        update["locations"] = [{"path": p} for p in paths]
    if mcp is not None:
        update["_meta"] = {"mcp": {"server": mcp[0], "tool": mcp[1]}}
    return update


def mcp_tool(name: str) -> tuple[str, str] | None:
    """The server and tool of a Claude Code or Qwen Code name ``mcp__SERVER__TOOL``."""
    server, _, tool = name.removeprefix("mcp__").partition("__")
    if not name.startswith("mcp__") or not server or not tool:
        return None
    return server, tool


def tool_finished(
    call_id: str, ok: bool, output: str | None, raw_output: Any = None
) -> dict[str, Any]:
    update: dict[str, Any] = {
        "sessionUpdate": "tool_call_update",
        "toolCallId": call_id,
        "status": "completed" if ok else "failed",
    }
    if raw_output is not None:
        update["rawOutput"] = raw_output
    if output:
        update["content"] = [
            {"type": "content", "content": {"type": "text", "text": output}}
        ]
    return update


def plan(entries: list[tuple[str, str]]) -> dict[str, Any]:
    """An ACP plan from ``(text, pending|in_progress|completed)`` pairs."""
    return {
        "sessionUpdate": "plan",
        "entries": [
            {"content": text, "priority": "medium", "status": status}
            for text, status in entries
        ],
    }


def _load(line: str) -> dict[str, Any] | None:
    """One line as a JSON object; None for anything else (a CLI's stray log line)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _count(mapping: dict[str, Any], *names: str) -> int:
    total = 0
    for name in names:
        value = mapping.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            total += value
    return total


def _text(value: Any) -> str:
    """A tool result's content (a string, text blocks, or anything as JSON)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) for b in value):
        return "".join(
            str(b.get("text") or "") for b in value if b.get("type") == "text"
        )
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


class _JsonLines:
    """A reader of one JSON object per line; any other line says nothing."""

    def feed(self, line: str) -> Parsed:
        out = Parsed()
        obj = _load(line)
        if obj is not None:
            self.take(obj, out)
        return out

    def take(self, obj: dict[str, Any], out: Parsed) -> None:
        raise NotImplementedError

    def finish(self) -> Parsed:
        """What the end of the CLI's output says (its run is over)."""
        return Parsed()


class CodexEvents(_JsonLines):
    """``codex exec --json``: each ``item.*`` event as ACP updates."""

    def __init__(self) -> None:
        #: Tool items already announced with a ``tool_call``.
        self._started: set[str] = set()

    def take(self, obj: dict[str, Any], out: Parsed) -> None:
        kind = obj.get("type")
        if kind == "thread.started" and isinstance(obj.get("thread_id"), str):
            out.session_id = obj["thread_id"]
        elif kind in ("item.started", "item.updated", "item.completed"):
            item = obj.get("item")
            if isinstance(item, dict):
                out.updates = self._item(item, done=kind == "item.completed")
                if kind == "item.completed" and item.get("type") == "collab_tool_call":
                    out.subagents = _collab(item)
        elif kind == "turn.completed":
            usage = obj.get("usage")
            if isinstance(usage, dict):
                inp = _count(usage, "input_tokens")
                outp = _count(usage, "output_tokens")
                out.usage = {
                    "inputTokens": inp,
                    "outputTokens": outp,
                    "cachedReadTokens": _count(usage, "cached_input_tokens"),
                    "thoughtTokens": _count(usage, "reasoning_output_tokens"),
                    "totalTokens": inp + outp,
                }
            out.outcome = Outcome(True)
        elif kind == "turn.failed":
            error = obj.get("error")
            message = error.get("message") if isinstance(error, dict) else error
            out.outcome = Outcome(False, message=str(message or "the turn failed"))
        elif kind == "error":
            # A retried stream error: codex goes on (turn.failed ends it).
            out.updates = [thought_chunk(f"[codex] {obj.get('message') or 'error'}")]

    def _item(self, item: dict[str, Any], done: bool) -> list[dict[str, Any]]:
        item_id = str(item.get("id") or "")
        itype = item.get("type")
        if itype == "agent_message":
            text = item.get("text")
            return [message_chunk(text)] if done and isinstance(text, str) else []
        if itype == "reasoning":
            text = item.get("text")
            return [thought_chunk(text)] if done and isinstance(text, str) else []
        if itype == "todo_list":
            todos = [t for t in item.get("items") or [] if isinstance(t, dict)]
            return [
                plan(
                    [
                        (
                            str(t.get("text") or ""),
                            "completed" if t.get("completed") else "pending",
                        )
                        for t in todos
                    ]
                )
            ]
        if itype == "error":
            text = item.get("message")
            return [thought_chunk(f"[codex] {text}")] if done and text else []
        tool = self._tool(item_id, itype, item)
        if tool is None:
            return []
        updates: list[dict[str, Any]] = []
        if item_id not in self._started:
            self._started.add(item_id)
            updates.append(tool)
        if done:
            updates.append(self._tool_result(item_id, itype, item))
        return updates

    @staticmethod
    def _tool(item_id: str, itype: Any, item: dict[str, Any]) -> dict[str, Any] | None:
        if itype == "command_execution":
            command = str(item.get("command") or "")
            return tool_started(item_id, command, "execute", {"command": command})
        if itype == "file_change":
            changes = [c for c in item.get("changes") or [] if isinstance(c, dict)]
            paths = [str(c["path"]) for c in changes if c.get("path")]
            title = ", ".join(paths) or "file change"
            # Its locations are the files still there to look at; an item
            # that only deletes is a delete.
            kept = [
                str(c["path"])
                for c in changes
                if c.get("path") and c.get("kind") != "delete"
            ]
            kind = "edit" if kept or not paths else "delete"
            return tool_started(
                item_id, title, kind, {"changes": changes}, kept or paths
            )
        if itype == "mcp_tool_call":
            server = str(item.get("server") or "mcp")
            tool = str(item.get("tool") or "tool")
            return tool_started(
                item_id,
                f"{server}/{tool}",
                "other",
                item.get("arguments"),
                mcp=(server, tool),
            )
        if itype == "web_search":
            query = str(item.get("query") or "")
            return tool_started(
                item_id, query or "web search", "fetch", {"query": query}
            )
        return None

    @staticmethod
    def _tool_result(item_id: str, itype: Any, item: dict[str, Any]) -> dict[str, Any]:
        status = item.get("status")
        ok = status not in ("failed", "declined")
        if itype == "command_execution":
            code = item.get("exit_code")
            ok = ok and code in (None, 0)
            output = _text(item.get("aggregated_output"))
            raw = {"exit_code": code} if isinstance(code, int) else None
            return tool_finished(item_id, ok, output, raw)
        if itype == "mcp_tool_call":
            error = item.get("error")
            if error:
                message = error.get("message") if isinstance(error, dict) else error
                return tool_finished(item_id, False, str(message))
            result = item.get("result")
            if isinstance(result, dict) and "content" in result:
                result = result["content"]
            return tool_finished(item_id, ok, _text(result))
        if itype == "file_change":
            changes = [c for c in item.get("changes") or [] if isinstance(c, dict)]
            summary = "\n".join(f"{c.get('kind')}: {c.get('path')}" for c in changes)
            return tool_finished(item_id, ok, summary)
        return tool_finished(item_id, ok, None)


def _collab(item: dict[str, Any]) -> list[dict[str, Any]]:
    """
    The subagents a codex ``collab_tool_call`` names (its
    ``receiver_thread_ids`` and ``agents_states``): opened, with the
    prompt of a ``spawn_agent``, and closed when ``close_agent`` or a state
    says so.  Their own turns are in codex's session files, not here.
    """
    tool = str(item.get("tool") or "")
    ids = [str(i) for i in item.get("receiver_thread_ids") or [] if i]
    states = item.get("agents_states")
    closed = []
    if isinstance(states, dict):
        for thread_id, state in states.items():
            if str(thread_id) not in ids:
                ids.append(str(thread_id))
            if isinstance(state, dict) and state.get("status") in (
                "shutdown",
                "closed",
            ):
                closed.append(str(thread_id))
    if tool == "close_agent":
        closed = list(dict.fromkeys([*closed, *ids]))
    prompt = item.get("prompt") if tool == "spawn_agent" else None
    events: list[dict[str, Any]] = [
        {"op": "open", "id": i, "name": None, "instructions": prompt or None}
        for i in ids
    ]
    return events + [{"op": "close", "id": i} for i in closed]


#: Tool names of Claude Code and Qwen Code, as ACP tool kinds.
TOOL_KINDS = {
    "Bash": "execute",
    "run_shell_command": "execute",
    "Read": "read",
    "read_file": "read",
    "read_many_files": "read",
    "NotebookRead": "read",
    "Edit": "edit",
    "MultiEdit": "edit",
    "Write": "edit",
    "NotebookEdit": "edit",
    "edit": "edit",
    "replace": "edit",
    "write_file": "edit",
    "Glob": "search",
    "Grep": "search",
    "LS": "search",
    "glob": "search",
    "grep": "search",
    "search_file_content": "search",
    "list_directory": "search",
    "WebFetch": "fetch",
    "WebSearch": "fetch",
    "web_fetch": "fetch",
    "web_search": "fetch",
    "google_web_search": "fetch",
    "TodoWrite": "think",
    "todo_write": "think",
}

_PATH_KEYS = ("file_path", "absolute_path", "notebook_path", "path")
_PLAN_STATUSES = ("pending", "in_progress", "completed")


def _tool_use(block: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``tool_use`` block as a ``tool_call`` (and a plan for a to-do list)."""
    name = str(block.get("name") or "tool")
    args = block.get("input")
    args = args if isinstance(args, dict) else {}
    kind = TOOL_KINDS.get(name, "other")
    paths = [str(args[k]) for k in _PATH_KEYS if isinstance(args.get(k), str)][:1]
    if kind == "execute" and isinstance(args.get("command"), str):
        title = args["command"]
    elif paths:
        title = f"{name} {paths[0]}"
    else:
        title = name
    updates = [
        tool_started(
            str(block.get("id") or ""), title, kind, args, paths, mcp=mcp_tool(name)
        )
    ]
    todos = args.get("todos")
    if kind == "think" and isinstance(todos, list):
        entries = [
            (
                str(t.get("content") or t.get("description") or ""),
                t["status"] if t.get("status") in _PLAN_STATUSES else "pending",
            )
            for t in todos
            if isinstance(t, dict)
        ]
        updates.append(plan(entries))
    return updates


#: The tools with which Claude Code and Qwen Code start a subagent.
SUBAGENT_TOOLS = frozenset({"agent", "task"})


class StreamJsonEvents(_JsonLines):
    """
    ``--output-format stream-json`` (Claude Code, Qwen Code), with or
    without partial messages: a text or thinking block already streamed
    as deltas is not sent again when its whole message arrives.

    A subagent's own messages carry the id of the tool call that started
    it (``parent_tool_use_id``): they are not the agent's answer, so they
    become the subagent's entries (``Parsed.subagents``), named after that
    call's description and prompt; the call's result closes it, or, for
    one the CLI runs in the background (a ``system`` ``task_started``), its
    ``task_notification``, or at the latest the end of the CLI's run.
    """

    def __init__(self) -> None:
        self._message_id = ""
        #: The streamed blocks' types by index, in the current message.
        self._blocks: dict[int, str] = {}
        #: Per message id, the streamed blocks of each type still to be matched.
        self._streamed: dict[tuple[str, str], deque[int]] = defaultdict(deque)
        self._tools: set[str] = set()
        #: The calls that start a subagent: their (name, instructions).
        self._spawners: dict[str, tuple[str | None, str | None]] = {}
        #: The subagents that said something, to close when their call ends.
        self._subagents: set[str] = set()
        #: The subagents running in the background: their call's result
        #: comes at once, their end in a ``task_notification``.
        self._background: set[str] = set()

    def take(self, obj: dict[str, Any], out: Parsed) -> None:
        kind = obj.get("type")
        parent = obj.get("parent_tool_use_id")
        if parent:
            # Partial messages of a subagent are left to its whole ones.
            if kind in ("assistant", "user"):
                out.subagents = self._subagent(str(parent), kind, obj.get("message"))
            return
        if kind == "system":
            subtype = obj.get("subtype")
            if subtype in ("init", "session_start") and isinstance(
                obj.get("session_id"), str
            ):
                out.session_id = obj["session_id"]
            elif subtype in ("task_started", "task_notification"):
                out.subagents = self._task(subtype, obj)
        elif kind == "stream_event":
            event = obj.get("event")
            if isinstance(event, dict):
                out.updates = self._stream_event(event)
        elif kind == "assistant":
            out.updates = self._assistant(obj.get("message"))
        elif kind == "user":
            out.updates = self._tool_results(obj.get("message"))
            out.subagents = self._closed(out.updates)
        elif kind == "result":
            self._result(obj, out)

    def _subagent(self, parent: str, kind: str, message: Any) -> list[dict[str, Any]]:
        """One message of the subagent ``parent`` started, as its events."""
        name, instructions = self._spawners.get(parent, (None, None))
        common = {"id": parent, "name": name, "instructions": instructions}
        role = "user" if kind == "user" else "assistant"
        content = message.get("content") if isinstance(message, dict) else None
        entries: list[dict[str, Any]] = []
        if isinstance(content, str) and content:
            entries.append({"kind": "message", "role": role, "text": content})
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict):
                entry = _subagent_entry(role, block)
                if entry is not None:
                    entries.append(entry)
        self._subagents.add(parent)
        if not entries:
            return [{"op": "open", **common}]
        return [{"op": "entry", **common, "entry": entry} for entry in entries]

    def _task(self, subtype: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
        """
        A CLI's word on a subagent it runs as a task: started (with its
        description, and Claude Code's its prompt; in the background, its
        call's result comes at once and does not end it), and done.
        """
        # Claude Code's fields are the event's own, Qwen Code's its data's.
        data = obj.get("data")
        fields = data if isinstance(data, dict) else obj
        call_id = fields.get("tool_use_id")
        if not isinstance(call_id, str) or not call_id:
            return []
        if subtype == "task_notification":
            self._background.discard(call_id)
            if call_id not in self._subagents:
                return []
            self._subagents.discard(call_id)
            return [{"op": "close", "id": call_id}]
        name, instructions = self._spawners.get(call_id, (None, None))
        self._spawners[call_id] = (
            str(fields.get("description") or "") or name,
            str(fields.get("prompt") or "") or instructions,
        )
        # Both run their agents in the background by default: the end is
        # the notification, unless the CLI says this one is not.
        if fields.get("is_backgrounded") is not False:
            self._background.add(call_id)
        return self._subagent(call_id, "assistant", None)

    def finish(self) -> Parsed:
        """The subagents still open end with the CLI's run."""
        out = Parsed(
            subagents=[{"op": "close", "id": i} for i in sorted(self._subagents)]
        )
        self._subagents.clear()
        self._background.clear()
        return out

    def _closed(self, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The subagents whose starting calls these results end."""
        closed = []
        for update in results:
            call_id = update.get("toolCallId")
            if call_id in self._subagents and call_id not in self._background:
                self._subagents.discard(call_id)
                closed.append({"op": "close", "id": call_id})
        return closed

    def _stream_event(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        etype = event.get("type")
        if etype == "message_start":
            message = event.get("message")
            mid = message.get("id") if isinstance(message, dict) else None
            self._message_id = str(mid or "")
            self._blocks.clear()
            return []
        index = event.get("index")
        index = index if isinstance(index, int) else 0
        if etype == "content_block_start":
            block = event.get("content_block")
            btype = str(block.get("type") or "") if isinstance(block, dict) else ""
            self._blocks[index] = btype
            if btype in ("text", "thinking"):
                self._streamed[self._message_id, btype].append(index)
            return []
        if etype == "content_block_delta":
            delta = event.get("delta")
            if not isinstance(delta, dict):
                return []
            if delta.get("type") == "text_delta" and delta.get("text"):
                return [message_chunk(str(delta["text"]))]
            if delta.get("type") == "thinking_delta" and delta.get("thinking"):
                return [thought_chunk(str(delta["thinking"]))]
        return []

    def _was_streamed(self, mid: str, btype: str) -> bool:
        queue = self._streamed.get((mid, btype))
        if queue:
            queue.popleft()
            return True
        return False

    def _assistant(self, message: Any) -> list[dict[str, Any]]:
        if not isinstance(message, dict):
            return []
        mid = str(message.get("id") or "")
        updates: list[dict[str, Any]] = []
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "text" and isinstance(block.get("text"), str):
                if not self._was_streamed(mid, "text"):
                    updates.append(message_chunk(block["text"]))
            elif btype == "thinking" and isinstance(block.get("thinking"), str):
                if not self._was_streamed(mid, "thinking"):
                    updates.append(thought_chunk(block["thinking"]))
            elif btype == "tool_use":
                call_id = str(block.get("id") or "")
                if call_id not in self._tools:
                    self._tools.add(call_id)
                    updates.extend(_tool_use(block))
                    self._note_spawner(call_id, block)
        return updates

    def _note_spawner(self, call_id: str, block: dict[str, Any]) -> None:
        """A call of a subagent tool: what to name the subagent it starts."""
        args = block.get("input")
        if str(block.get("name") or "").lower() in SUBAGENT_TOOLS and isinstance(
            args, dict
        ):
            name = args.get("description") or args.get("subagent_type")
            prompt = args.get("prompt")
            self._spawners[call_id] = (
                str(name) if name else None,
                str(prompt) if prompt else None,
            )

    @staticmethod
    def _tool_results(message: Any) -> list[dict[str, Any]]:
        content = message.get("content") if isinstance(message, dict) else None
        blocks = content if isinstance(content, list) else []
        return [
            tool_finished(
                str(block.get("tool_use_id") or ""),
                not block.get("is_error"),
                _text(block.get("content")),
            )
            for block in blocks
            if isinstance(block, dict) and block.get("type") == "tool_result"
        ]

    @staticmethod
    def _result(obj: dict[str, Any], out: Parsed) -> None:
        usage = obj.get("usage")
        if isinstance(usage, dict):
            cached = _count(usage, "cache_read_input_tokens")
            inp = _count(usage, "input_tokens", "cache_creation_input_tokens") + cached
            outp = _count(usage, "output_tokens")
            out.usage = {
                "inputTokens": inp,
                "outputTokens": outp,
                "cachedReadTokens": cached,
                "totalTokens": inp + outp,
            }
        if isinstance(obj.get("session_id"), str):
            out.session_id = obj["session_id"]
        subtype = obj.get("subtype")
        text = obj.get("result") if isinstance(obj.get("result"), str) else None
        error = obj.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]  # Qwen Code's failures say why here
        if subtype in ("error_max_turns", "error_max_session_turns"):
            out.outcome = Outcome(True, stop_reason="max_turn_requests")
        elif obj.get("is_error") or subtype not in (None, "success"):
            out.outcome = Outcome(
                False, message=text or str(subtype or "the turn failed")
            )
        else:
            out.outcome = Outcome(True)


def _subagent_entry(role: str, block: dict[str, Any]) -> dict[str, Any] | None:
    """One content block of a subagent's message as its entry, or None."""
    btype = block.get("type")
    if btype == "text" and block.get("text"):
        return {"kind": "message", "role": role, "text": str(block["text"])}
    if btype == "thinking" and block.get("thinking"):
        return {"kind": "reasoning", "text": str(block["thinking"])}
    if btype == "tool_use":
        return {
            "kind": "tool_call",
            "call_id": str(block.get("id") or ""),
            "name": str(block.get("name") or "tool"),
            "arguments": block.get("input"),
        }
    if btype == "tool_result":
        return {
            "kind": "tool_result",
            "call_id": str(block.get("tool_use_id") or ""),
            "output": _text(block.get("content")),
            "ok": not block.get("is_error"),
        }
    return None


class LineReader(Protocol):
    """What the bridge feeds a CLI's stdout to, line by line, then its end."""

    def feed(self, line: str) -> Parsed: ...

    def finish(self) -> Parsed: ...


#: Each headless protocol's reader.
READERS: dict[str, Callable[[], LineReader]] = {
    "codex": CodexEvents,
    "stream-json": StreamJsonEvents,
}
