"""
A coding agent's CLI in its headless mode, faked: ``codex exec --json``,
``qwen --output-format stream-json`` or ``claude -p --output-format
stream-json`` (each reads its prompt on stdin), chosen by the first argument (the
wrappers :func:`tests.agents.test_clibridge.fake_clis` puts on PATH pass
it), printing the lines the real ones print.

Each run appends its argv and prompt to ``.fake-cli-runs.jsonl`` in its
working directory, with the MCP settings it read through ``--mcp-config``
and the variables of its environment named ``SANDBOXD_MCP_*`` or
``MCP_TEST_*``, so a test sees how the bridge called it.  The prompt's
first word picks what it does: ``echo TEXT``, ``run COMMAND`` (a shell
tool call, then ``done``), ``fail`` (the turn fails), ``crash`` (exit 3
with a message on stderr), ``slow`` (until killed), ``linger TEXT`` (leaves a process holding its
stdout, then answers TEXT), ``limit`` (claude and
qwen: the turn limit reached), ``think TEXT`` (reasoning, then the text),
``write NAME TEXT`` (writes the file, relative to its directory, and
reports it: codex a ``file_change``, the others a ``write_file`` tool use),
``mcp SERVER TOOL`` (a call of an MCP server's tool: codex an
``mcp_tool_call``, the others a ``mcp__SERVER__TOOL`` tool use),
``subagent TEXT`` (claude and qwen: a ``Task`` call whose subagent thinks,
runs ``ls`` and answers, then TEXT; codex: a ``spawn_agent`` and a
``close_agent`` collab call, then TEXT).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def value_after(argv: list[str], flag: str) -> str | None:
    """An option's value, given as ``FLAG VALUE`` or ``FLAG=VALUE``."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1 :]
    return None


def codex(argv: list[str], prompt: str) -> int:
    thread = value_after(argv, "resume") or "th_fake_1"
    emit({"type": "thread.started", "thread_id": thread})
    emit({"type": "turn.started"})
    word, _, rest = prompt.partition(" ")
    if word == "fail":
        emit({"type": "turn.failed", "error": {"message": "model said no"}})
        return 1
    if word == "think":
        emit(
            {
                "type": "item.completed",
                "item": {"id": "r1", "type": "reasoning", "text": "pondering"},
            }
        )
    if word == "write":
        name, _, text = rest.partition(" ")
        with open(name, "w") as f:
            f.write(text)
        change = {"path": name, "kind": "add"}
        item = {
            "id": "f1",
            "type": "file_change",
            "status": "completed",
            "changes": [change],
        }
        emit({"type": "item.completed", "item": item})
        rest = "written"
    if word == "mcp":
        server, _, tool = rest.partition(" ")
        item = {"id": "t1", "type": "mcp_tool_call", "server": server, "tool": tool}
        emit({"type": "item.started", "item": {**item, "status": "in_progress"}})
        result = {"content": [{"type": "text", "text": "looked up"}]}
        emit(
            {
                "type": "item.completed",
                "item": {**item, "status": "completed", "result": result},
            }
        )
        rest = "done"
    if word == "subagent":
        # codex's collab tool calls: a spawn, then a close.
        spawn = {
            "id": "k1",
            "type": "collab_tool_call",
            "tool": "spawn_agent",
            "receiver_thread_ids": ["th_child_1"],
            "prompt": "List the files",
            "agents_states": {"th_child_1": {"status": "running"}},
            "status": "completed",
        }
        emit({"type": "item.completed", "item": spawn})
        close = {
            "id": "k2",
            "type": "collab_tool_call",
            "tool": "close_agent",
            "receiver_thread_ids": ["th_child_1"],
            "agents_states": {"th_child_1": {"status": "shutdown"}},
            "status": "completed",
        }
        emit({"type": "item.completed", "item": close})
    if word == "run":
        item = {
            "id": "c1",
            "type": "command_execution",
            "command": rest,
            "status": "in_progress",
        }
        emit({"type": "item.started", "item": item})
        done = subprocess.run(rest, shell=True, capture_output=True, text=True)
        item.update(
            aggregated_output=done.stdout, exit_code=done.returncode, status="completed"
        )
        emit({"type": "item.completed", "item": item})
        rest = "done"
    emit(
        {
            "type": "item.completed",
            "item": {"id": "m1", "type": "agent_message", "text": rest},
        }
    )
    emit(
        {
            "type": "turn.completed",
            "usage": {"input_tokens": 11, "cached_input_tokens": 3, "output_tokens": 7},
        }
    )
    return 0


def stream_text(mid: str, text: str) -> None:
    """A message streamed word by word, then whole."""
    emit(
        {
            "type": "stream_event",
            "event": {"type": "message_start", "message": {"id": mid}},
        }
    )
    emit(
        {
            "type": "stream_event",
            "event": {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text"},
            },
        }
    )
    words = text.split(" ")
    for i, word in enumerate(words):
        piece = word if i == len(words) - 1 else word + " "
        emit(
            {
                "type": "stream_event",
                "event": {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": piece},
                },
            }
        )
    emit({"type": "stream_event", "event": {"type": "content_block_stop", "index": 0}})
    emit(
        {
            "type": "assistant",
            "message": {"id": mid, "content": [{"type": "text", "text": text}]},
        }
    )


def subagent() -> None:
    """A ``Task`` call and its subagent's messages, as Claude Code prints them."""
    task = {
        "type": "tool_use",
        "id": "tu_task",
        "name": "Task",
        "input": {
            "description": "Look around",
            "prompt": "List the files",
            "subagent_type": "general-purpose",
        },
    }
    emit({"type": "assistant", "message": {"id": "msg_0", "content": [task]}})
    own = {"parent_tool_use_id": "tu_task", "session_id": "sess_fake_1"}
    prompt = [{"type": "text", "text": "List the files"}]
    emit({"type": "user", "message": {"role": "user", "content": prompt}, **own})
    emit(
        {
            "type": "stream_event",
            "event": {"type": "message_start", "message": {"id": "msg_s"}},
            **own,
        }
    )
    ls = {"type": "tool_use", "id": "tu_ls", "name": "Bash", "input": {"command": "ls"}}
    thinking = {"type": "thinking", "thinking": "I should look"}
    emit(
        {
            "type": "assistant",
            "message": {"id": "msg_s", "content": [thinking, ls]},
            **own,
        }
    )
    result = {"type": "tool_result", "tool_use_id": "tu_ls", "content": "a.txt\n"}
    emit({"type": "user", "message": {"content": [result]}, **own})
    found = {"type": "text", "text": "found a.txt"}
    emit({"type": "assistant", "message": {"id": "msg_s2", "content": [found]}, **own})
    done = {"type": "tool_result", "tool_use_id": "tu_task", "content": "found a.txt"}
    emit({"type": "user", "message": {"content": [done]}})


def stream_json(argv: list[str], prompt: str) -> int:
    session = value_after(argv, "--resume") or "sess_fake_1"
    emit({"type": "system", "subtype": "init", "session_id": session})
    word, _, rest = prompt.partition(" ")
    if word == "limit":
        emit(
            {
                "type": "result",
                "subtype": "error_max_turns",
                "is_error": True,
                "session_id": session,
            }
        )
        return 0
    if word == "fail":
        emit(
            {
                "type": "result",
                "subtype": "error_during_execution",
                "is_error": True,
                "result": "model said no",
            }
        )
        return 1
    if word == "write":
        name, _, text = rest.partition(" ")
        path = os.path.abspath(name)
        tool = {
            "type": "tool_use",
            "id": "tu_w",
            "name": "write_file",
            "input": {"file_path": path, "content": text},
        }
        emit({"type": "assistant", "message": {"id": "msg_0", "content": [tool]}})
        with open(path, "w") as f:
            f.write(text)
        result = {"type": "tool_result", "tool_use_id": "tu_w", "content": "ok"}
        emit({"type": "user", "message": {"content": [result]}})
        rest = "written"
    if word == "mcp":
        server, _, name = rest.partition(" ")
        tool = {
            "type": "tool_use",
            "id": "tu_m",
            "name": f"mcp__{server}__{name}",
            "input": {"id": 7},
        }
        emit({"type": "assistant", "message": {"id": "msg_0", "content": [tool]}})
        result = {"type": "tool_result", "tool_use_id": "tu_m", "content": "looked up"}
        emit({"type": "user", "message": {"content": [result]}})
        rest = "done"
    if word == "subagent":
        subagent()
    if word == "run":
        tool = {
            "type": "tool_use",
            "id": "tu_1",
            "name": "Bash",
            "input": {"command": rest},
        }
        emit({"type": "assistant", "message": {"id": "msg_0", "content": [tool]}})
        done = subprocess.run(rest, shell=True, capture_output=True, text=True)
        result = {
            "type": "tool_result",
            "tool_use_id": "tu_1",
            "content": done.stdout,
            "is_error": done.returncode != 0,
        }
        emit({"type": "user", "message": {"content": [result]}})
        rest = "done"
    stream_text("msg_1", rest)
    emit(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": rest,
            "session_id": session,
            "usage": {
                "input_tokens": 5,
                "cache_read_input_tokens": 2,
                "output_tokens": 4,
            },
        }
    )
    return 0


def main() -> int:
    cli, argv = sys.argv[1], sys.argv[2:]
    prompt = sys.stdin.read()
    run = {"cli": cli, "argv": argv, "prompt": prompt}
    config = value_after(argv, "--mcp-config")
    if config is not None:
        with open(config) as f:
            run["mcp_config"] = json.load(f)
    run["mcp_env"] = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("SANDBOXD_MCP_", "MCP_TEST_"))
    }
    with open(".fake-cli-runs.jsonl", "a") as f:
        f.write(json.dumps(run) + "\n")
    word = prompt.partition(" ")[0]
    if word == "crash":
        sys.stderr.write("fake cli: no credentials\n")
        return 3
    if word == "slow":
        with open(".fake-cli-pid", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(300)
        return 0
    if word == "linger":
        # Leaves a process holding its stdout, then answers: the turn must
        # not wait for that process.
        child = subprocess.Popen(["sleep", "60"], start_new_session=True)
        with open(".fake-cli-pid", "w") as f:
            f.write(str(child.pid))
        prompt = "echo " + prompt.partition(" ")[2]
    if cli == "codex":
        return codex(argv, prompt)
    return stream_json(argv, prompt)


if __name__ == "__main__":
    sys.exit(main())
