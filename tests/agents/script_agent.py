"""
A stdlib-only ACP agent that misbehaves on purpose (what the SDK cannot do).

``script_agent.py MODE``:

- ``silent``: never answers anything (``initialize`` times out);
- ``garbage``: garbage, non-UTF-8 bytes, an unknown update kind, a stray
  response and an unknown notification around an otherwise good turn;
- ``huge``: a prompt answered with one line longer than any sane cap;
- ``cancel_request``: holds a permission request, then withdraws it with
  ``$/cancel_request`` and reports what came back;
- ``reused_ids``: two requests with the same id;
- ``question``: asks a form question (``elicitation/create``);
- ``cancel_error``: answers a cancelled prompt with an error;
- ``grandchild``: starts a grandchild that ignores SIGTERM, ignores SIGTERM
  itself and never ends a turn;
- ``exit_at_init``: prints to stderr and exits during ``session/new``.
- ``odd_lines``: a chunk holding a lone UTF-16 surrogate (as a JavaScript
  agent that cut a string through an emoji writes it) with the prompt's
  answer in the same write, after requests whose id is an object and
  whose method is a number, and a write of text holding a lone surrogate;
  reports what came back for each.
- ``stuck_config``: starts a session with two modes and can list sessions,
  then never answers a mode, model or option change, nor ``session/list``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

MODE = sys.argv[1] if len(sys.argv) > 1 else "garbage"
out = sys.stdout.buffer
buffer = b""


def send(message: dict[str, Any]) -> None:
    out.write(json.dumps(message).encode() + b"\n")
    out.flush()


def raw(data: bytes) -> None:
    out.write(data)
    out.flush()


def read(timeout: float | None = None) -> dict[str, Any] | None:
    """The next message, or None at timeout; exits at EOF."""
    global buffer
    deadline = None if timeout is None else time.monotonic() + timeout
    while b"\n" not in buffer:
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
        ready, _, _ = select.select([sys.stdin.buffer], [], [], remaining)
        if not ready:
            return None
        chunk = os.read(sys.stdin.fileno(), 65536)
        if not chunk:
            sys.exit(0)
        buffer += chunk
    line, buffer = buffer.split(b"\n", 1)
    return json.loads(line)


def update(session_id: str, data: dict[str, Any]) -> None:
    send(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": session_id, "update": data},
        }
    )


def say(session_id: str, text: str) -> None:
    update(
        session_id,
        {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": text},
        },
    )


def answer(message: dict[str, Any], result: Any) -> None:
    send({"jsonrpc": "2.0", "id": message["id"], "result": result})


def wait_response(request_id: Any) -> dict[str, Any]:
    while True:
        message = read()
        if (
            message is not None
            and message.get("id") == request_id
            and "method" not in message
        ):
            return message


def prompt_turn(message: dict[str, Any]) -> None:
    sid = message["params"]["sessionId"]
    if MODE == "garbage":
        raw(b"this is not json\n")
        raw(b"\xff\xfe\xfd not utf-8\n")
        raw(b"[1, 2, 3]\n")
        update(sid, {"sessionUpdate": "brand_new_kind", "stuff": 1})
        send({"jsonrpc": "2.0", "id": 999, "result": {}})
        send({"jsonrpc": "2.0", "method": "_vendor/notice", "params": {"x": 1}})
        raw(b"\r\n")
        say(sid, "still here")
        answer(message, {"stopReason": "end_turn"})
    elif MODE == "huge":
        raw(
            b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"'
            + sid.encode()
            + b'","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"'
            + b"x" * 300000
        )
        time.sleep(30)
    elif MODE == "cancel_request":
        send(
            {
                "jsonrpc": "2.0",
                "id": 100,
                "method": "session/request_permission",
                "params": {
                    "sessionId": sid,
                    "toolCall": {
                        "toolCallId": "t1",
                        "title": "Run rm",
                        "kind": "execute",
                    },
                    "options": [{"optionId": "ok", "name": "OK", "kind": "allow_once"}],
                },
            }
        )
        time.sleep(1.0)
        send(
            {
                "jsonrpc": "2.0",
                "method": "$/cancel_request",
                "params": {"requestId": 100},
            }
        )
        reply = wait_response(100)
        say(
            sid,
            "permission answer: "
            + json.dumps(reply.get("error") or reply.get("result")),
        )
        answer(message, {"stopReason": "end_turn"})
    elif MODE == "reused_ids":
        params = {"sessionId": sid, "path": "/nonexistent-file"}
        send(
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "session/request_permission",
                "params": {
                    "sessionId": sid,
                    "toolCall": {"toolCallId": "t1", "title": "x", "kind": "execute"},
                    "options": [{"optionId": "ok", "name": "OK", "kind": "allow_once"}],
                },
            }
        )
        send(
            {"jsonrpc": "2.0", "id": 7, "method": "fs/read_text_file", "params": params}
        )
        first = wait_response(7)
        say(sid, "reused: " + json.dumps(first.get("error")))
        answer(message, {"stopReason": "end_turn"})
    elif MODE == "question":
        send(
            {
                "jsonrpc": "2.0",
                "id": "q1",
                "method": "elicitation/create",
                "params": {
                    "sessionId": sid,
                    "mode": "form",
                    "message": "Which branch?",
                    "requestedSchema": {
                        "type": "object",
                        "properties": {"branch": {"type": "string"}},
                    },
                },
            }
        )
        reply = wait_response("q1")
        say(sid, "answer: " + json.dumps(reply.get("result")))
        answer(message, {"stopReason": "end_turn"})
    elif MODE == "odd_lines":
        raw(
            b'{"jsonrpc":"2.0","id":{"obj":1},"method":"fs/read_text_file","params":{"sessionId":"'
            + sid.encode()
            + b'","path":"a.txt"}}\n'
        )
        object_id = wait_response(None)
        send({"jsonrpc": "2.0", "id": 8, "method": 42})
        number_method = wait_response(8)
        raw(
            b'{"jsonrpc":"2.0","id":9,"method":"fs/write_text_file","params":{"sessionId":"'
            + sid.encode()
            + b'","path":"lone.txt","content":"a\\ud800b"}}\n'
        )
        written = wait_response(9)
        say(
            sid,
            "replies: "
            + json.dumps(
                [
                    object_id.get("error"),
                    number_method.get("error"),
                    written.get("result"),
                ]
            ),
        )
        sid_json = json.dumps(sid)
        raw(
            b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":'
            + sid_json.encode()
            + b',"update":{"sessionUpdate":"agent_message_chunk","content":'
            + b'{"type":"text","text":" \\ud800 lone"}}}}\n'
            + json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "result": {"stopReason": "end_turn"},
                }
            ).encode()
            + b"\n"
        )
    elif MODE == "cancel_error":
        say(sid, "working")
        while True:
            incoming = read()
            if incoming and incoming.get("method") == "session/cancel":
                send(
                    {
                        "jsonrpc": "2.0",
                        "id": message["id"],
                        "error": {"code": -32603, "message": "aborted"},
                    }
                )
                return
    elif MODE == "grandchild":
        say(sid, "never ending")
        while True:
            read()


#: What ``stuck_config`` never answers.
STUCK_METHODS = (
    "session/set_mode",
    "session/set_model",
    "session/set_config_option",
    "session/list",
)


def main() -> None:
    if MODE == "grandchild":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        message = read()
        if message is None:
            continue
        method = message.get("method")
        if MODE == "silent":
            continue
        if MODE == "stuck_config" and method in STUCK_METHODS:
            continue
        if method == "initialize":
            if MODE == "garbage":
                raw(b"Debugger listening on ws://127.0.0.1:9229\n")
            caps: dict[str, Any] = {}
            if MODE == "stuck_config":
                caps = {"sessionCapabilities": {"list": {}}}
            answer(
                message,
                {"protocolVersion": 1, "agentCapabilities": caps, "authMethods": []},
            )
        elif method == "session/new":
            if MODE == "exit_at_init":
                sys.stderr.write("error: no API key configured\n")
                sys.stderr.flush()
                sys.exit(2)
            if MODE == "grandchild":
                child = subprocess.Popen(
                    [
                        "sh",
                        "-c",
                        "trap '' TERM; echo $$ > \"$PIDFILE\"; while true; do sleep 1; done",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                del child
            result: dict[str, Any] = {"sessionId": "script-1"}
            if MODE == "stuck_config":
                result["modes"] = {
                    "currentModeId": "ask",
                    "availableModes": [
                        {"id": "ask", "name": "Ask"},
                        {"id": "code", "name": "Code"},
                    ],
                }
            answer(message, result)
        elif method == "session/prompt":
            prompt_turn(message)
        elif "id" in message and method is not None:
            send(
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "error": {"code": -32601, "message": "Method not found"},
                }
            )


if __name__ == "__main__":
    main()
