"""
The real Qwen Code, Codex and Claude Code CLIs (``make test-tools``
installs them from npm) behind the bridge, each against a stand-in for its
model's API on loopback (chat completions, the Responses API, the Messages
API): no key, no network beyond this machine.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest
from twisted.web.resource import Resource
from twisted.web.server import Site

from tests.agents.test_agents import AgentsTestCase

QWEN_BIN = os.path.join(sys.prefix, "node-qwen", "node_modules", ".bin")
CODEX_BIN = os.path.join(sys.prefix, "node-codex", "node_modules", ".bin")
CLAUDE_BIN = os.path.join(sys.prefix, "node-claude", "node_modules", ".bin")


class ChatCompletions(Resource):
    """
    ``POST /v1/chat/completions``, streamed: the answer is ``you said:``
    and the last user message's last text; every request is kept.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []

    def render_POST(self, request: Any) -> bytes:
        body = json.loads(request.content.read() or b"{}")
        self.requests.append(body)
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        content = users[-1].get("content") if users else ""
        if isinstance(content, list):
            # Qwen Code puts reminders of its own ahead of what was typed.
            texts = [p.get("text", "") for p in content if isinstance(p, dict)]
            content = texts[-1] if texts else ""
        answer = f"you said: {content}"
        base = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
        }
        request.setHeader(b"content-type", b"text/event-stream")
        chunks = [
            {
                **base,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": word}}
                ],
            }
            for word in answer.split(" ")
            for word in [word + " "]
        ]
        chunks[-1]["choices"][0]["delta"]["content"] = chunks[-1]["choices"][0][
            "delta"
        ]["content"].rstrip()
        chunks.append(
            {
                **base,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "usage": {
                    "prompt_tokens": 5,
                    "completion_tokens": 3,
                    "total_tokens": 8,
                },
            }
        )
        for chunk in chunks:
            request.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        return b"data: [DONE]\n\n"

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(
            {"object": "list", "data": [{"id": "m", "object": "model"}]}
        ).encode()


class Responses(Resource):
    """
    ``POST /v1/responses``, streamed as the Responses API streams: the
    answer is ``you said:`` and the last user message's last text; every
    request is kept.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []

    def render_POST(self, request: Any) -> bytes:
        body = json.loads(request.content.read() or b"{}")
        self.requests.append(body)
        texts = [
            part.get("text", "")
            for item in body.get("input", [])
            if isinstance(item, dict) and item.get("role") == "user"
            for part in item.get("content") or []
            if isinstance(part, dict) and part.get("type") == "input_text"
        ]
        answer = "you said: " + (texts[-1] if texts else "")
        message = {"type": "message", "role": "assistant", "id": "msg_1"}
        text = {"type": "output_text", "text": answer, "annotations": []}
        usage = {
            "input_tokens": 7,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 3,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 10,
        }
        deltas = [
            {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": word}
            for word in re.findall(r"\S+\s*", answer)
        ]
        events = [
            ("response.created", {"response": {"id": "resp_1"}}),
            ("response.output_item.added", {"item": {**message, "content": []}}),
            *(("response.output_text.delta", delta) for delta in deltas),
            ("response.output_item.done", {"item": {**message, "content": [text]}}),
            ("response.completed", {"response": {"id": "resp_1", "usage": usage}}),
        ]
        request.setHeader(b"content-type", b"text/event-stream")
        return b"".join(
            f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()
            for kind, data in events
        )


class Messages(Resource):
    """
    ``POST /v1/messages``, streamed as Anthropic's Messages API streams: the
    answer is ``you said:`` and the last user message's last text; every
    request is kept.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []

    def render_POST(self, request: Any) -> bytes:
        body = json.loads(request.content.read() or b"{}")
        self.requests.append(body)
        texts: list[str] = []
        for message in body.get("messages", []):
            content = message.get("content")
            if message.get("role") != "user":
                continue
            if isinstance(content, str):
                texts.append(content)
            else:
                texts += [
                    p.get("text", "")
                    for p in content or []
                    if isinstance(p, dict) and p.get("type") == "text"
                ]
        answer = "you said: " + (texts[-1] if texts else "")
        start = {
            "id": f"msg_{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 5, "output_tokens": 1},
        }
        events = [
            ("message_start", {"message": start}),
            (
                "content_block_start",
                {"index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            *(
                (
                    "content_block_delta",
                    {"index": 0, "delta": {"type": "text_delta", "text": w}},
                )
                for w in re.findall(r"\S+\s*", answer)
            ),
            ("content_block_stop", {"index": 0}),
            (
                "message_delta",
                {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
            ),
            ("message_stop", {}),
        ]
        request.setHeader(b"content-type", b"text/event-stream")
        return b"".join(
            f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()
            for kind, data in events
        )

    def render_HEAD(self, request: Any) -> bytes:
        return b""


def environment(test: Any, values: dict[str, str]) -> None:
    """``values`` in the daemon's environment for ``test``."""
    for name, value in values.items():
        old = os.environ.get(name)
        os.environ[name] = value
        test.addCleanup(
            os.environ.pop if old is None else os.environ.__setitem__,
            *((name,) if old is None else (name, old)),
        )


def serve(test: Any, resource: Resource) -> int:
    """``resource`` on a loopback port for ``test``; the port."""
    port = reactor.listenTCP(0, Site(resource), interface="127.0.0.1")
    test.addCleanup(port.stopListening)
    return int(port.getHost().port)


class RealQwenTests(AgentsTestCase):
    timeout = 120

    def setUp(self) -> Any:
        if not os.path.exists(os.path.join(QWEN_BIN, "qwen")):
            raise SkipTest(
                f"Qwen Code's CLI is not in {QWEN_BIN} (make test-tools installs it)"
            )
        self.model = ChatCompletions()
        port = serve(self, self.model)
        home = os.path.realpath(self.mktemp())
        os.makedirs(os.path.join(home, ".qwen"))
        with open(os.path.join(home, ".qwen", "settings.json"), "w") as f:
            json.dump({"security": {"auth": {"selectedType": "openai"}}}, f)
        environment(
            self,
            {
                "PATH": QWEN_BIN + os.pathsep + os.environ.get("PATH", ""),
                "HOME": home,
                "OPENAI_API_KEY": "not-a-key",
                "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
                "OPENAI_MODEL": "m",
            },
        )
        return super().setUp()

    @inlineCallbacks
    def test_turns_through_the_real_cli(self) -> Any:
        """
        Two turns of a qwen-code session: the prompt reaches the model as
        typed (one that looks like an option too), the streamed answer is the
        agent's message, and the second turn resumes the first's conversation.
        """
        sid = yield self.session("qwen-code")
        reply = yield self.prompt(sid, "--yolo say hi", wait=90)
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stop_reason"], "end_turn", reply.body)
        self.assertEqual(reply.json()["text"], "you said: --yolo say hi")
        reply = yield self.prompt(sid, "and again", wait=90)
        self.assertEqual(reply.json()["text"], "you said: and again", reply.body)
        last = self.model.requests[-1]["messages"]
        said = json.dumps(last)
        # The first exchange is in the second turn's history: resumed.
        self.assertIn("--yolo say hi", said)
        self.assertIn("you said: --yolo say hi", said)


class RealCodexTests(AgentsTestCase):
    timeout = 120

    def setUp(self) -> Any:
        if not os.path.exists(os.path.join(CODEX_BIN, "codex")):
            raise SkipTest(
                f"Codex's CLI is not in {CODEX_BIN} (make test-tools installs it)"
            )
        self.model = Responses()
        port = serve(self, self.model)
        home = os.path.realpath(self.mktemp())
        os.makedirs(os.path.join(home, ".codex"))
        with open(os.path.join(home, ".codex", "config.toml"), "w") as f:
            f.write(
                'model_provider = "local"\n\n[model_providers.local]\nname = "local"\n'
                f'base_url = "http://127.0.0.1:{port}/v1"\nwire_api = "responses"\n'
                'env_key = "CODEX_API_KEY"\n'
            )
        environment(
            self,
            {
                "PATH": CODEX_BIN + os.pathsep + os.environ.get("PATH", ""),
                "HOME": home,
                "CODEX_API_KEY": "not-a-key",
            },
        )
        return super().setUp()

    @inlineCallbacks
    def test_turns_through_the_real_cli(self) -> Any:
        """
        Two turns of a codex session without codex-acp: the prompt reaches
        the model as typed, with the session's reasoning effort and model,
        the answer is the agent's message, and the second turn resumes the
        first's thread.
        """
        sid = yield self.session("codex", thought_level="high", model="m")
        reply = yield self.prompt(sid, "--yolo say hi", wait=90)
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stop_reason"], "end_turn", reply.body)
        self.assertEqual(reply.json()["text"], "you said: --yolo say hi")
        first = self.model.requests[-1]
        self.assertEqual((first["model"], first["reasoning"]["effort"]), ("m", "high"))
        reply = yield self.prompt(sid, "and again", wait=90)
        self.assertEqual(reply.json()["text"], "you said: and again", reply.body)
        said = json.dumps(self.model.requests[-1]["input"])
        self.assertIn("--yolo say hi", said)
        self.assertIn("you said: --yolo say hi", said)


class RealClaudeTests(AgentsTestCase):
    timeout = 120

    def setUp(self) -> Any:
        if not os.path.exists(os.path.join(CLAUDE_BIN, "claude")):
            raise SkipTest(
                f"Claude Code's CLI is not in {CLAUDE_BIN} (make test-tools installs it)"
            )
        self.model = Messages()
        port = serve(self, self.model)
        home = os.path.realpath(self.mktemp())
        os.makedirs(home)
        environment(
            self,
            {
                "PATH": CLAUDE_BIN + os.pathsep + os.environ.get("PATH", ""),
                "HOME": home,
                "ANTHROPIC_API_KEY": "not-a-key",
                "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
            },
        )
        return super().setUp()

    @inlineCallbacks
    def test_turns_through_the_real_cli(self) -> Any:
        """
        Two turns of a claude session without claude-agent-acp: the streamed
        answer is the agent's message, once; the second turn resumes the
        first's conversation.
        """
        sid = yield self.session("claude", model="m")
        reply = yield self.prompt(sid, "--yolo say hi", wait=90)
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stop_reason"], "end_turn", reply.body)
        self.assertEqual(reply.json()["text"], "you said: --yolo say hi")
        self.assertEqual(self.model.requests[-1]["model"], "m")
        reply = yield self.prompt(sid, "and again", wait=90)
        self.assertEqual(reply.json()["text"], "you said: and again", reply.body)
        said = json.dumps(self.model.requests[-1]["messages"])
        self.assertIn("--yolo say hi", said)
        self.assertIn("you said: --yolo say hi", said)
