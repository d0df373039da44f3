"""
The real Qwen Code CLI (``make test-tools`` installs it from npm) behind the
bridge, against a stand-in for an OpenAI-compatible model on loopback: no
key, no network beyond this machine.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest
from twisted.web.resource import Resource
from twisted.web.server import Site

from tests.agents.test_agents import AgentsTestCase

QWEN_BIN = os.path.join(sys.prefix, "node-qwen", "node_modules", ".bin")


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


class RealQwenTests(AgentsTestCase):
    timeout = 120

    def setUp(self) -> Any:
        if not os.path.exists(os.path.join(QWEN_BIN, "qwen")):
            raise SkipTest(
                f"Qwen Code's CLI is not in {QWEN_BIN} (make test-tools installs it)"
            )
        self.model = ChatCompletions()
        port = reactor.listenTCP(0, Site(self.model), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        home = os.path.realpath(self.mktemp())
        os.makedirs(os.path.join(home, ".qwen"))
        with open(os.path.join(home, ".qwen", "settings.json"), "w") as f:
            json.dump({"security": {"auth": {"selectedType": "openai"}}}, f)
        env = {
            "PATH": QWEN_BIN + os.pathsep + os.environ.get("PATH", ""),
            "HOME": home,
            "OPENAI_API_KEY": "not-a-key",
            "OPENAI_BASE_URL": f"http://127.0.0.1:{port.getHost().port}/v1",
            "OPENAI_MODEL": "m",
        }
        for name, value in env.items():
            old = os.environ.get(name)
            os.environ[name] = value
            self.addCleanup(
                os.environ.pop if old is None else os.environ.__setitem__,
                *((name,) if old is None else (name, old)),
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
