"""The headless CLIs' lines as ACP updates (:mod:`sandboxd.agents.cliparsers`), in memory."""

from __future__ import annotations

import json
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.agents.cliparsers import CodexEvents, Outcome, StreamJsonEvents, mcp_tool


def feed(reader: Any, *objs: Any) -> list[Any]:
    """Each object as a line; what each line said."""
    return [reader.feed(o if isinstance(o, str) else json.dumps(o)) for o in objs]


def updates(parsed: list[Any]) -> list[dict[str, Any]]:
    return [u for p in parsed for u in p.updates]


def texts(parsed: list[Any], kind: str = "agent_message_chunk") -> list[str]:
    return [u["content"]["text"] for u in updates(parsed) if u["sessionUpdate"] == kind]


class CodexTests(SynchronousTestCase):
    def test_turn(self) -> None:
        """Thread id, reasoning, a command from start to end, the answer, usage."""
        command = {
            "id": "c1",
            "type": "command_execution",
            "command": "ls",
            "status": "in_progress",
        }
        parsed = feed(
            CodexEvents(),
            {"type": "thread.started", "thread_id": "th_1"},
            {"type": "turn.started"},
            {
                "type": "item.completed",
                "item": {"id": "r", "type": "reasoning", "text": "hm"},
            },
            {"type": "item.started", "item": command},
            {"type": "item.updated", "item": command},
            {
                "type": "item.completed",
                "item": {
                    **command,
                    "status": "failed",
                    "exit_code": 2,
                    "aggregated_output": "no",
                },
            },
            {
                "type": "item.completed",
                "item": {"id": "m", "type": "agent_message", "text": "hi"},
            },
            {
                "type": "turn.completed",
                "usage": {
                    "input_tokens": 10,
                    "cached_input_tokens": 4,
                    "output_tokens": 5,
                },
            },
        )
        self.assertEqual(parsed[0].session_id, "th_1")
        self.assertEqual(texts(parsed, "agent_thought_chunk"), ["hm"])
        self.assertEqual(texts(parsed), ["hi"])
        tool = [
            u for u in updates(parsed) if u["sessionUpdate"].startswith("tool_call")
        ]
        self.assertEqual(
            [u["sessionUpdate"] for u in tool], ["tool_call", "tool_call_update"]
        )
        self.assertEqual(tool[0]["kind"], "execute")
        self.assertEqual(tool[1]["status"], "failed")
        self.assertEqual(tool[1]["content"][0]["content"]["text"], "no")
        self.assertEqual(parsed[-1].outcome, Outcome(True))
        self.assertEqual(
            parsed[-1].usage,
            {
                "inputTokens": 10,
                "outputTokens": 5,
                "cachedReadTokens": 4,
                "thoughtTokens": 0,
                "totalTokens": 15,
            },
        )

    def test_completed_alone_and_other_items(self) -> None:
        """An item seen only completed is announced then finished; a to-do list is a plan."""
        parsed = feed(
            CodexEvents(),
            {
                "type": "item.completed",
                "item": {
                    "id": "f",
                    "type": "file_change",
                    "status": "completed",
                    "changes": [{"path": "/w/a.py", "kind": "update"}],
                },
            },
            {
                "type": "item.completed",
                "item": {
                    "id": "t",
                    "type": "mcp_tool_call",
                    "server": "s",
                    "tool": "x",
                    "status": "failed",
                    "error": {"message": "boom"},
                },
            },
            {
                "type": "item.updated",
                "item": {
                    "id": "p",
                    "type": "todo_list",
                    "items": [
                        {"text": "a", "completed": True},
                        {"text": "b", "completed": False},
                    ],
                },
            },
        )
        edit, edited, mcp, mcp_done, plan = updates(parsed)
        self.assertEqual(edit["kind"], "edit")
        self.assertEqual(edit["locations"], [{"path": "/w/a.py"}])
        self.assertEqual(edited["status"], "completed")
        self.assertEqual(mcp["title"], "s/x")
        self.assertEqual(mcp_done["status"], "failed")
        self.assertEqual(
            [(e["content"], e["status"]) for e in plan["entries"]],
            [("a", "completed"), ("b", "pending")],
        )

    def test_collab_subagents(self) -> None:
        """A spawn_agent names its subagent with its prompt; close_agent closes it."""
        spawn = {
            "id": "k1",
            "type": "collab_tool_call",
            "tool": "spawn_agent",
            "receiver_thread_ids": ["th_a"],
            "prompt": "go",
            "agents_states": {"th_b": {"status": "shutdown"}},
        }
        close = {"id": "k2", "type": "collab_tool_call", "tool": "close_agent"}
        parsed = feed(
            CodexEvents(),
            {"type": "item.started", "item": spawn},
            {"type": "item.completed", "item": spawn},
            {
                "type": "item.completed",
                "item": {**close, "receiver_thread_ids": ["th_a"]},
            },
        )
        self.assertEqual(parsed[0].subagents, [])
        self.assertEqual(
            parsed[1].subagents,
            [
                {"op": "open", "id": "th_a", "name": None, "instructions": "go"},
                {"op": "open", "id": "th_b", "name": None, "instructions": "go"},
                {"op": "close", "id": "th_b"},
            ],
        )
        self.assertEqual(
            parsed[2].subagents,
            [
                {"op": "open", "id": "th_a", "name": None, "instructions": None},
                {"op": "close", "id": "th_a"},
            ],
        )

    def test_failure_and_noise(self) -> None:
        """turn.failed carries the message; stray lines, arrays and unknown events say nothing."""
        parsed = feed(
            CodexEvents(),
            "Reading prompt from stdin...",
            "[1, 2]",
            "{not json",
            {"type": "something.new"},
            {"type": "turn.failed", "error": {"message": "quota"}},
        )
        self.assertEqual(updates(parsed), [])
        self.assertEqual(parsed[-1].outcome, Outcome(False, message="quota"))

    def test_delete_only_change(self) -> None:
        """A file change that only deletes is a delete of those paths."""
        [parsed] = feed(
            CodexEvents(),
            {
                "type": "item.completed",
                "item": {
                    "id": "f",
                    "type": "file_change",
                    "changes": [{"path": "gone.txt", "kind": "delete"}],
                },
            },
        )
        started, finished = parsed.updates
        self.assertEqual(started["kind"], "delete")
        self.assertEqual(started["locations"], [{"path": "gone.txt"}])
        self.assertEqual(finished["status"], "completed")


def stream_event(event: dict[str, Any]) -> dict[str, Any]:
    return {"type": "stream_event", "event": event}


class StreamJsonTests(SynchronousTestCase):
    def test_partial_then_whole_sent_once(self) -> None:
        """Deltas are the message; the whole message after them is not sent again, a block not streamed is."""
        parsed = feed(
            StreamJsonEvents(),
            {"type": "system", "subtype": "init", "session_id": "s1"},
            stream_event({"type": "message_start", "message": {"id": "m1"}}),
            stream_event(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "thinking"},
                }
            ),
            stream_event(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "thinking_delta", "thinking": "mm"},
                }
            ),
            stream_event(
                {
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {"type": "text"},
                }
            ),
            stream_event(
                {
                    "type": "content_block_delta",
                    "index": 1,
                    "delta": {"type": "text_delta", "text": "he"},
                }
            ),
            stream_event(
                {
                    "type": "content_block_delta",
                    "index": 1,
                    "delta": {"type": "text_delta", "text": "llo"},
                }
            ),
            {
                "type": "assistant",
                "message": {
                    "id": "m1",
                    "content": [
                        {"type": "thinking", "thinking": "mm"},
                        {"type": "text", "text": "hello"},
                        {"type": "text", "text": " and more"},
                    ],
                },
            },
        )
        self.assertEqual(parsed[0].session_id, "s1")
        self.assertEqual(texts(parsed, "agent_thought_chunk"), ["mm"])
        self.assertEqual(texts(parsed), ["he", "llo", " and more"])

    def test_tools_plan_and_subagents(self) -> None:
        """A tool use and its result; a to-do list as a plan; a subagent's own lines kept out."""
        parsed = feed(
            StreamJsonEvents(),
            {
                "type": "assistant",
                "message": {
                    "id": "m1",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "t1",
                            "name": "Read",
                            "input": {"file_path": "/w/x"},
                        },
                        {
                            "type": "tool_use",
                            "id": "t2",
                            "name": "TodoWrite",
                            "input": {
                                "todos": [{"content": "a", "status": "in_progress"}]
                            },
                        },
                    ],
                },
            },
            {
                "type": "assistant",
                "parent_tool_use_id": "t9",
                "message": {"id": "m2", "content": [{"type": "text", "text": "sub"}]},
            },
            {
                "type": "user",
                "message": {
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "body"}],
                            "is_error": True,
                        }
                    ]
                },
            },
        )
        read, todo, plan, result = updates(parsed)
        self.assertEqual((read["kind"], read["title"]), ("read", "Read /w/x"))
        self.assertEqual(read["locations"], [{"path": "/w/x"}])
        self.assertEqual(todo["kind"], "think")
        self.assertEqual(plan["entries"][0]["status"], "in_progress")
        self.assertEqual(result["status"], "failed")
        self.assertEqual(result["content"][0]["content"]["text"], "body")

    def test_subagent(self) -> None:
        """
        A ``Task`` call's subagent: its messages (partial ones left to the
        whole) are its entries, named after the call's description and
        prompt, never the agent's updates; the call's result closes it.
        """
        own = {"parent_tool_use_id": "tu_task"}
        task = {
            "type": "tool_use",
            "id": "tu_task",
            "name": "Task",
            "input": {"description": "Look around", "prompt": "List the files"},
        }
        ls = {
            "type": "tool_use",
            "id": "l1",
            "name": "Bash",
            "input": {"command": "ls"},
        }
        parsed = feed(
            StreamJsonEvents(),
            {"type": "assistant", "message": {"id": "m0", "content": [task]}},
            {"type": "user", "message": {"content": "List the files"}, **own},
            {
                "type": "stream_event",
                "event": {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "partial"},
                },
                **own,
            },
            {
                "type": "assistant",
                "message": {
                    "id": "m1",
                    "content": [{"type": "thinking", "thinking": "hm"}, ls],
                },
                **own,
            },
            {
                "type": "user",
                "message": {
                    "content": [
                        {"type": "tool_result", "tool_use_id": "l1", "content": "a\n"}
                    ]
                },
                **own,
            },
            {"type": "assistant", "message": {"id": "m2", "content": []}, **own},
            {
                "type": "user",
                "message": {
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "tu_task",
                            "content": "a",
                        }
                    ]
                },
            },
        )
        started, finished = updates(parsed)
        self.assertEqual((started["toolCallId"], started["kind"]), ("tu_task", "other"))
        self.assertEqual(finished["status"], "completed")
        events = [e for p in parsed for e in p.subagents]
        self.assertEqual(
            [e["op"] for e in events],
            ["entry", "entry", "entry", "entry", "open", "close"],
        )
        self.assertEqual(
            {(e["id"], e["name"], e["instructions"]) for e in events[:-1]},
            {("tu_task", "Look around", "List the files")},
        )
        self.assertEqual(
            [e["entry"] for e in events[:4]],
            [
                {"kind": "message", "role": "user", "text": "List the files"},
                {"kind": "reasoning", "text": "hm"},
                {
                    "kind": "tool_call",
                    "call_id": "l1",
                    "name": "Bash",
                    "arguments": {"command": "ls"},
                },
                {"kind": "tool_result", "call_id": "l1", "output": "a\n", "ok": True},
            ],
        )
        self.assertEqual(events[-1], {"op": "close", "id": "tu_task"})

    def test_subagent_in_the_background(self) -> None:
        """
        Claude Code's ``Agent`` run in the background, as 2.1 prints it: the
        task's start names it, the call's result (at once) does not end it,
        its ``task_notification`` does.
        """
        agent = {
            "type": "tool_use",
            "id": "tu_a",
            "name": "Agent",
            "input": {"description": "d", "prompt": "p"},
        }
        result = {"type": "tool_result", "tool_use_id": "tu_a", "content": "launched"}
        parsed = feed(
            StreamJsonEvents(),
            {"type": "assistant", "message": {"id": "m0", "content": [agent]}},
            {
                "type": "system",
                "subtype": "task_started",
                "tool_use_id": "tu_a",
                "description": "Look around",
                "prompt": "List the files",
                "is_backgrounded": True,
            },
            {"type": "user", "message": {"content": [result]}},
            {
                "type": "assistant",
                "parent_tool_use_id": "tu_a",
                "message": {"id": "m1", "content": [{"type": "text", "text": "a"}]},
            },
            {"type": "system", "subtype": "task_notification", "tool_use_id": "tu_a"},
        )
        events = [e for p in parsed for e in p.subagents]
        self.assertEqual([e["op"] for e in events], ["open", "entry", "close"])
        self.assertEqual(
            (events[0]["name"], events[0]["instructions"]),
            ("Look around", "List the files"),
        )
        self.assertEqual(
            events[1]["entry"], {"kind": "message", "role": "assistant", "text": "a"}
        )

    def test_subagent_as_qwen_reports_it(self) -> None:
        """
        Qwen Code's task events carry their fields in ``data``; a subagent
        still open when the CLI's output ends is closed then.
        """
        agent = {
            "type": "tool_use",
            "id": "c1",
            "name": "agent",
            "input": {"description": "d", "prompt": "p"},
        }
        started = {"task_id": "t", "tool_use_id": "c1", "description": "Look"}
        result = {"type": "tool_result", "tool_use_id": "c1", "content": "launched"}
        reader = StreamJsonEvents()
        parsed = feed(
            reader,
            {"type": "assistant", "message": {"id": "m0", "content": [agent]}},
            {
                "type": "user",
                "parent_tool_use_id": "c1",
                "message": {"content": [{"type": "text", "text": "p"}]},
            },
            {"type": "system", "subtype": "task_started", "data": started},
            {"type": "user", "message": {"content": [result]}},
        )
        events = [e for p in parsed for e in p.subagents]
        self.assertEqual([e["op"] for e in events], ["entry", "open"])
        self.assertEqual((events[1]["name"], events[1]["instructions"]), ("Look", "p"))
        self.assertEqual(reader.finish().subagents, [{"op": "close", "id": "c1"}])
        self.assertEqual(reader.finish().subagents, [])

    def test_results(self) -> None:
        """Success with usage, the turn limit, and an error."""
        ok, limit, error = feed(
            StreamJsonEvents(),
            {
                "type": "result",
                "subtype": "success",
                "session_id": "s2",
                "usage": {
                    "input_tokens": 3,
                    "cache_read_input_tokens": 2,
                    "output_tokens": 1,
                },
            },
            {"type": "result", "subtype": "error_max_turns", "is_error": True},
            {
                "type": "result",
                "subtype": "error_during_execution",
                "is_error": True,
                "error": {"message": "No auth type is selected."},
            },
        )
        self.assertEqual(ok.outcome, Outcome(True))
        self.assertEqual(ok.session_id, "s2")
        self.assertEqual(ok.usage["inputTokens"], 5)
        self.assertEqual(limit.outcome, Outcome(True, stop_reason="max_turn_requests"))
        self.assertEqual(
            error.outcome, Outcome(False, message="No auth type is selected.")
        )


class McpToolTests(SynchronousTestCase):
    """An MCP tool call names its server and tool in the update's ``_meta``."""

    def test_names(self) -> None:
        self.assertEqual(
            mcp_tool("mcp__issues__lookup_issue"), ("issues", "lookup_issue")
        )
        self.assertEqual(mcp_tool("mcp__a__b__c"), ("a", "b__c"))
        for name in ("Bash", "mcp__issues", "mcp____x", "mcp__x__"):
            self.assertIsNone(mcp_tool(name), name)

    def test_stream_json_tool_use(self) -> None:
        block = {
            "type": "tool_use",
            "id": "t",
            "name": "mcp__docs__search",
            "input": {},
        }
        line = {"type": "assistant", "message": {"id": "m", "content": [block]}}
        [update] = updates(feed(StreamJsonEvents(), line))
        self.assertEqual(update["_meta"], {"mcp": {"server": "docs", "tool": "search"}})
        block = {**block, "name": "Bash", "input": {"command": "ls"}}
        line = {"type": "assistant", "message": {"id": "m", "content": [block]}}
        [update] = updates(feed(StreamJsonEvents(), line))
        self.assertNotIn("_meta", update)
