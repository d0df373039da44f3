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
from twisted.internet.task import deferLater
from twisted.trial.unittest import SkipTest
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from tests.agents.test_agents import AgentsTestCase, agents_policy

QWEN_BIN = os.path.join(sys.prefix, "node-qwen", "node_modules", ".bin")
CODEX_BIN = os.path.join(sys.prefix, "node-codex", "node_modules", ".bin")
CLAUDE_BIN = os.path.join(sys.prefix, "node-claude", "node_modules", ".bin")


def pieces(answer: str) -> list[str]:
    """``answer`` in the pieces a model streams: word by word, spaces kept."""
    return re.findall(r"\S+\s*", answer)


def sse(events: list[tuple[str | None, dict[str, Any]]]) -> bytes:
    """Server-sent events: each ``(event name or None, data object)``."""
    return b"".join(
        (f"event: {name}\n" if name else "").encode()
        + b"data: "
        + json.dumps(data).encode()
        + b"\n\n"
        for name, data in events
    )


class ModelAPI(Resource):
    """
    A stand-in for a model's streaming API: the answer is ``you said:``
    and the request's last user text (its last text part, stripped: Qwen
    Code adds its reminders ahead and line ends after), but for ``run:
    COMMAND`` a call of the CLI's shell tool, answered ``ran:`` and the
    tool's result once the CLI sends it, and for ``hang`` none at all.
    Every request is kept.  A subclass reads its API's messages and
    writes its stream.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []
        #: Requests left unanswered (``hang``).
        self.waiting: list[Any] = []

    def render_POST(self, request: Any) -> bytes:
        body = json.loads(request.content.read() or b"{}")
        self.requests.append(body)
        texts = self.user_texts(body)
        request.setHeader(b"content-type", b"text/event-stream")
        result = self.tool_result(body)
        if result is not None:
            return self.stream(body, "ran: " + result.strip())
        said = texts[-1].strip() if texts else ""
        if said == "hang":
            # Never answered: the CLI waits until it is ended.
            self.waiting.append(request)
            return NOT_DONE_YET
        if said.startswith("run: "):
            return self.tool_call(body, said[len("run: ") :])
        if said.startswith("task: "):
            return self.subagent_call(body, said[len("task: ") :])
        return self.stream(body, "you said: " + said)

    def subagent_call(self, body: dict[str, Any], prompt: str) -> bytes:
        """A stream asking the CLI to start a subagent with ``prompt``."""
        raise NotImplementedError

    def tool_result(self, body: dict[str, Any]) -> str | None:
        """The output of the tool call the last request answers, if it does."""
        return None

    def tool_call(self, body: dict[str, Any], command: str) -> bytes:
        """A stream asking the CLI to run ``command`` with its shell tool."""
        raise NotImplementedError

    def render_HEAD(self, request: Any) -> bytes:
        return b""

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return json.dumps({"object": "list", "data": []}).encode()

    @staticmethod
    def parts(content: Any, kind: str) -> list[str]:
        """The texts of a message's content: a string, or parts of ``kind``."""
        if isinstance(content, str):
            return [content]
        return [
            part.get("text", "")
            for part in content or []
            if isinstance(part, dict) and part.get("type") == kind
        ]

    def user_texts(self, body: dict[str, Any]) -> list[str]:
        """The user messages' texts (``messages``, as the chat and Messages APIs send them)."""
        return [
            text
            for m in body.get("messages", [])
            if m.get("role") == "user"
            for text in self.parts(m.get("content"), "text")
        ]

    def stream(self, body: dict[str, Any], answer: str) -> bytes:
        raise NotImplementedError


class ChatCompletions(ModelAPI):
    """``POST /v1/chat/completions`` (OpenAI's chat API), as Qwen Code calls it."""

    def tool_result(self, body: dict[str, Any]) -> str | None:
        last = (body.get("messages") or [{}])[-1]
        if last.get("role") != "tool":
            return None
        return " ".join(self.parts(last.get("content"), "text"))

    def tool_call(self, body: dict[str, Any], command: str) -> bytes:
        return self.function_call("run_shell_command", {"command": command})

    def subagent_call(self, body: dict[str, Any], prompt: str) -> bytes:
        names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        [tool] = [n for n in names if n in ("agent", "task")]
        arguments = {
            "description": "Look around",
            "prompt": prompt,
            "subagent_type": "general-purpose",
        }
        return self.function_call(tool, arguments, "call_task")

    def function_call(
        self, name: str, arguments: dict[str, Any], call_id: str = "call_1"
    ) -> bytes:
        """A stream asking the CLI to call its tool ``name``."""
        call = {
            "index": 0,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        base = {
            "id": "c2",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
        }
        chunks = [
            {
                **base,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}}
                ],
            },
            {
                **base,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
            },
        ]
        return sse([(None, chunk) for chunk in chunks]) + b"data: [DONE]\n\n"

    def stream(self, body: dict[str, Any], answer: str) -> bytes:
        base = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
        }
        chunks = [
            {
                **base,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": p}}],
            }
            for p in pieces(answer)
        ]
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        chunks.append(
            {
                **base,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "usage": usage,
            }
        )
        return sse([(None, chunk) for chunk in chunks]) + b"data: [DONE]\n\n"


class Responses(ModelAPI):
    """``POST /v1/responses`` (OpenAI's Responses API), as Codex calls it."""

    #: Every response's token counts.
    usage = {
        "input_tokens": 7,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 10,
    }

    def tool_result(self, body: dict[str, Any]) -> str | None:
        last = (body.get("input") or [{}])[-1]
        if not isinstance(last, dict) or last.get("type") != "custom_tool_call_output":
            return None
        return "".join(self.parts(last.get("output"), "input_text"))

    def tool_call(self, body: dict[str, Any], command: str) -> bytes:
        """
        Codex 0.169 offers its tools to a script its ``exec`` tool runs
        (in a JavaScript host of its own): the call is such a script.
        """
        script = f"const r = await tools.exec_command({{cmd: {json.dumps(command)}}});"
        script += " text(r.output);"
        item = {
            "type": "custom_tool_call",
            "id": "ctc_1",
            "call_id": "call_1",
            "name": "exec",
            "input": script,
            "status": "completed",
        }
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": {"id": "resp_2"}}),
            ("response.output_item.added", {"item": {**item, "input": ""}}),
            (
                "response.custom_tool_call_input.delta",
                {"item_id": "ctc_1", "delta": script},
            ),
            ("response.output_item.done", {"item": item}),
            ("response.completed", {"response": {"id": "resp_2", "usage": self.usage}}),
        ]
        return sse([(name, {"type": name, **data}) for name, data in events])

    def user_texts(self, body: dict[str, Any]) -> list[str]:
        return [
            text
            for item in body.get("input", [])
            if isinstance(item, dict) and item.get("role") == "user"
            for text in self.parts(item.get("content"), "input_text")
        ]

    def stream(self, body: dict[str, Any], answer: str) -> bytes:
        message = {"type": "message", "role": "assistant", "id": "msg_1"}
        text = {"type": "output_text", "text": answer, "annotations": []}
        usage = self.usage
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": {"id": "resp_1"}}),
            ("response.output_item.added", {"item": {**message, "content": []}}),
            *(
                ("response.output_text.delta", {"item_id": "msg_1", "delta": p})
                for p in pieces(answer)
            ),
            ("response.output_item.done", {"item": {**message, "content": [text]}}),
            ("response.completed", {"response": {"id": "resp_1", "usage": usage}}),
        ]
        return sse([(name, {"type": name, **data}) for name, data in events])


class Messages(ModelAPI):
    """``POST /v1/messages`` (Anthropic's Messages API), as Claude Code calls it."""

    def tool_result(self, body: dict[str, Any]) -> str | None:
        last = (body.get("messages") or [{}])[-1]
        content = last.get("content")
        if last.get("role") != "user" or not isinstance(content, list):
            return None
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                return " ".join(self.parts(inner, "text"))
        return None

    def tool_call(self, body: dict[str, Any], command: str) -> bytes:
        use = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}
        arguments = json.dumps({"command": command, "description": "Run it"})
        delta = {"type": "input_json_delta", "partial_json": arguments}
        return self.message(body, use, [delta], "tool_use")

    def subagent_call(self, body: dict[str, Any], prompt: str) -> bytes:
        names = [t.get("name") for t in body.get("tools") or []]
        [tool] = [n for n in names if n in ("Task", "Agent")]
        use = {"type": "tool_use", "id": "toolu_task", "name": tool, "input": {}}
        arguments = json.dumps(
            {
                "description": "Look around",
                "prompt": prompt,
                "subagent_type": "general-purpose",
            }
        )
        delta = {"type": "input_json_delta", "partial_json": arguments}
        return self.message(body, use, [delta], "tool_use")

    def stream(self, body: dict[str, Any], answer: str) -> bytes:
        deltas = [{"type": "text_delta", "text": p} for p in pieces(answer)]
        return self.message(body, {"type": "text", "text": ""}, deltas, "end_turn")

    def message(
        self,
        body: dict[str, Any],
        block: dict[str, Any],
        deltas: list[dict[str, Any]],
        stop_reason: str,
    ) -> bytes:
        """One assistant message: ``block``, the ``deltas`` to it, then ``stop_reason``."""
        start = {
            "id": f"msg_{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 5, "output_tokens": 1},
        }
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"message": start}),
            ("content_block_start", {"index": 0, "content_block": block}),
            *(("content_block_delta", {"index": 0, "delta": d}) for d in deltas),
            ("content_block_stop", {"index": 0}),
            (
                "message_delta",
                {"delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": 3}},
            ),
            ("message_stop", {}),
        ]
        return sse([(name, {"type": name, **data}) for name, data in events])


class McpServer(Resource):
    """
    A stand-in MCP server (streamable HTTP, answers as JSON) offering one
    tool, ``lookup_issue``; every request's method and ``Authorization``
    header are kept.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str | None]] = []

    def render_POST(self, request: Any) -> bytes:
        message = json.loads(request.content.read() or b"{}")
        token = request.getHeader("authorization")
        self.calls.append((message.get("method", ""), token))
        if "id" not in message:
            request.setResponseCode(202)
            return b""
        method = message.get("method")
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "stand-in", "version": "1"},
            }
        elif method == "tools/list":
            tool = {
                "name": "lookup_issue",
                "description": "Look an issue up.",
                "inputSchema": {"type": "object", "properties": {}},
            }
            result = {"tools": [tool]}
        else:
            result = {}
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(
            {"jsonrpc": "2.0", "id": message["id"], "result": result}
        ).encode()

    def render_GET(self, request: Any) -> bytes:
        request.setResponseCode(405)
        return b""

    def render_DELETE(self, request: Any) -> bytes:
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


def codex_home(home: str, port: int) -> dict[str, str]:
    """
    codex's settings under ``home`` for a Responses API on ``port``; its
    environment. codex takes another endpoint from its config, not from
    ``OPENAI_BASE_URL``.
    """
    os.makedirs(os.path.join(home, ".codex"))
    with open(os.path.join(home, ".codex", "config.toml"), "w") as f:
        f.write(
            'model_provider = "local"\n\n[model_providers.local]\nname = "local"\n'
            f'base_url = "http://127.0.0.1:{port}/v1"\nwire_api = "responses"\n'
            'env_key = "CODEX_API_KEY"\n'
        )
    return {"CODEX_API_KEY": "not-a-key"}


class RealCLICase(AgentsTestCase):
    """
    A daemon whose agent's CLI is the real one, its model API a stand-in:
    a subclass names the CLI and prepares its home and environment.
    """

    timeout = 120
    #: How long a turn may take to reach the model, in seconds.
    model_wait = 110
    policy = agents_policy(params={"mcp_servers": "http"})
    #: The CLI's directory, its binary, and the catalogue agent it runs for.
    bin_dir = ""
    program = ""
    agent = ""
    #: Where a request of its API carries the conversation.
    history = ""
    #: What of an MCP server's tools its model's request shows.
    offered_tool = "lookup_issue"

    def model_api(self) -> Any:
        raise NotImplementedError

    def prepare(self, home: str, port: int) -> dict[str, str]:
        """Write the CLI's own settings under ``home``; its environment."""
        raise NotImplementedError

    def setUp(self) -> Any:
        if not os.path.exists(os.path.join(self.bin_dir, self.program)):
            raise SkipTest(
                f"{self.program} is not in {self.bin_dir} (make test-tools installs it)"
            )
        self.model = self.model_api()
        port = serve(self, self.model)
        home = self.home = os.path.realpath(self.mktemp())
        os.makedirs(home)
        values = self.prepare(home, port)
        values.update(
            PATH=self.bin_dir + os.pathsep + os.environ.get("PATH", ""), HOME=home
        )
        environment(self, values)
        return super().setUp()

    @inlineCallbacks
    def two_turns(self, **create: Any) -> Any:
        """
        Two turns of a session on the real CLI: the prompt reaches the model
        as typed (one that looks like an option too), the streamed answer is
        the agent's message, once, and the second turn resumes the first's
        conversation (its request carries the first exchange).
        """
        sid = yield self.session(self.agent, **create)
        reply = yield self.prompt(sid, "--yolo say hi", wait=90)
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stop_reason"], "end_turn", reply.body)
        self.assertEqual(reply.json()["text"], "you said: --yolo say hi")
        first = self.model.requests[-1]
        reply = yield self.prompt(sid, "and again", wait=90)
        self.assertEqual(reply.json()["text"], "you said: and again", reply.body)
        said = json.dumps(self.model.requests[-1][self.history])
        self.assertIn("--yolo say hi", said)
        self.assertIn("you said: --yolo say hi", said)
        return first

    def cli_processes(self) -> list[int]:
        """
        The processes of this test's CLI: those with its ``HOME``, but the
        bridge (which lives as long as the session).
        """
        mark = f"HOME={self.home}".encode()
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    bridge = b"sandboxd.agents.clibridge" in f.read()
            except OSError:
                continue
            if mark in environ and not bridge:
                found.append(int(name))
        return found

    @inlineCallbacks
    def cancelled_while_waiting(self) -> Any:
        """
        A turn cancelled while the real CLI waits for its model ends
        ``cancelled``, and no process of the CLI's is left (qwen, for one,
        runs in a second node process it starts itself).
        """
        sid = yield self.session(self.agent)
        reply = yield self.prompt(sid, "hang", wait=0)
        self.assertEqual(reply.status, 202, reply.body)
        # A CLI starting beside two other test workers on two cores may take
        # a minute to ask; one whose turn ended without asking says why.
        deadline = reactor.seconds() + self.model_wait
        while not self.model.waiting and reactor.seconds() < deadline:
            yield deferLater(reactor, 0.2, lambda: None)
            session = yield self.request("GET", f"/agents/sessions/{sid}")
            if session.json().get("state") == "idle" and not self.model.waiting:
                self.fail(
                    f"the turn ended before the CLI asked its model: {session.body!r}"
                    f" (the model was asked {len(self.model.requests)} time(s))"
                )
        self.assertTrue(
            self.model.waiting,
            f"the CLI never asked its model in {self.model_wait} s"
            f" ({len(self.model.requests)} other request(s))",
        )
        self.assertTrue(self.cli_processes())
        reply = yield self.request("POST", f"/agents/sessions/{sid}/cancel", {})
        self.assertEqual(reply.status, 200, reply.body)
        state = yield self.wait_state(sid, ("idle",))
        self.assertEqual(state["stop_reason"], "cancelled")
        for _ in range(100):
            if not self.cli_processes():
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertEqual(self.cli_processes(), [])

    @inlineCallbacks
    def with_mcp_server(self) -> Any:
        """
        A session with an MCP server behind a bearer token: the real CLI
        connects with the token and offers the server's tool to the model.
        """
        server = McpServer()
        port = serve(self, server)
        mcp = {
            "type": "http",
            "name": "issues",
            "url": f"http://127.0.0.1:{port}/mcp",
            "headers": [{"name": "Authorization", "value": "Bearer tok-123"}],
        }
        sid = yield self.session(self.agent, mcp_servers=[mcp])
        reply = yield self.prompt(sid, "look", wait=90)
        self.assertEqual(reply.json().get("text"), "you said: look", reply.body)
        methods = [method for method, _ in server.calls]
        self.assertIn("tools/list", methods)
        self.assertEqual({token for _, token in server.calls}, {"Bearer tok-123"})
        self.assertIn(self.offered_tool, json.dumps(self.model.requests[-1]))


class EachCLI:
    """Mixed into each real CLI's case: what every CLI is put through."""

    def test_mcp_server(self: Any) -> Any:
        """See :meth:`RealCLICase.with_mcp_server`."""
        return self.with_mcp_server()

    def test_cancel(self: Any) -> Any:
        """See :meth:`RealCLICase.cancelled_while_waiting`."""
        return self.cancelled_while_waiting()

    # The wait for the model, then the cancel and the processes' end.
    test_cancel.timeout = 150  # type: ignore[attr-defined]


class RealQwenTests(EachCLI, RealCLICase):
    bin_dir, program, agent, history = QWEN_BIN, "qwen", "qwen-code", "messages"

    def model_api(self) -> Any:
        return ChatCompletions()

    def prepare(self, home: str, port: int) -> dict[str, str]:
        os.makedirs(os.path.join(home, ".qwen"))
        with open(os.path.join(home, ".qwen", "settings.json"), "w") as f:
            # Nothing beyond the stand-in model: no update check, no statistics.
            settings = {
                "security": {"auth": {"selectedType": "openai"}},
                "general": {"enableAutoUpdate": False},
                "privacy": {"usageStatisticsEnabled": False},
            }
            json.dump(settings, f)
        return {
            "OPENAI_API_KEY": "not-a-key",
            "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
            "OPENAI_MODEL": "m",
        }

    def test_turns_through_the_real_cli(self) -> Any:
        """Qwen Code 0.24.4: see :meth:`RealCLICase.two_turns`."""
        return self.two_turns()


class RealCodexTests(EachCLI, RealCLICase):
    bin_dir, program, agent, history = CODEX_BIN, "codex", "codex", "input"
    # codex names a server's tools as a namespace its model loads when needed.
    offered_tool = "mcp__issues"

    def model_api(self) -> Any:
        return Responses()

    def prepare(self, home: str, port: int) -> dict[str, str]:
        return codex_home(home, port)

    @inlineCallbacks
    def test_turns_through_the_real_cli(self) -> Any:
        """Codex 0.169.0, its model and reasoning effort the session's."""
        first = yield self.two_turns(thought_level="high", model="m")
        self.assertEqual((first["model"], first["reasoning"]["effort"]), ("m", "high"))


class RealClaudeTests(EachCLI, RealCLICase):
    bin_dir, program, agent, history = CLAUDE_BIN, "claude", "claude", "messages"

    def model_api(self) -> Any:
        return Messages()

    def prepare(self, home: str, port: int) -> dict[str, str]:
        return {
            "ANTHROPIC_API_KEY": "not-a-key",
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
        }

    @inlineCallbacks
    def test_turns_through_the_real_cli(self) -> Any:
        """Claude Code 2.1.328 (its partial messages, then the whole one), its model the session's."""
        first = yield self.two_turns(model="m")
        self.assertEqual(first["model"], "m")


#: Every kind of action automatic, the full-access modes allowed.
FULL_ACCESS = agents_policy(
    params={"permission_mode": {"*": "auto"}, "deny_modes": [], "mcp_servers": "http"}
)


class FullAccess:
    """
    Mixed into a real CLI's case: the CLI in its full-access mode
    (``--yolo``, ``danger-full-access``, ``bypassPermissions``).
    """

    policy = FULL_ACCESS

    @inlineCallbacks
    def test_turns_through_the_real_cli(self: Any) -> Any:
        """
        A turn answers in full access, as root too: Claude Code refuses that
        mode to root outside a sandbox it recognises, and the daemon's
        policy, which granted it, is that sandbox.
        """
        sid = yield self.session(self.agent)
        reply = yield self.prompt(sid, "hello", wait=90)
        self.assertEqual(reply.json().get("text"), "you said: hello", reply.body)
        self.assertEqual(reply.json()["stop_reason"], "end_turn")


class ToolCall:
    """
    Mixed into a real CLI's full-access case: the model asks the CLI to run
    a command with its shell tool (codex: through a script of its ``exec``
    tool); the session reports the tool call as the CLI ran it, and the
    model's answer after it.
    """

    @inlineCallbacks
    def test_a_command_the_model_asks_for(self: Any) -> Any:
        sid = yield self.session(self.agent)
        reply = yield self.prompt(sid, "run: echo tool-ran-$((6*7))", wait=90)
        # The model's answer quotes the tool's result (qwen's adds the exit
        # code and more around the output).
        text = reply.json().get("text") or ""
        self.assertTrue(text.startswith("ran: "), reply.body)
        self.assertIn("tool-ran-42", text)
        reply = yield self.request("GET", f"/agents/sessions/{sid}/tool-calls")
        [call] = reply.json()["tool_calls"]
        self.assertEqual(call["kind"], "execute", call)
        self.assertEqual(call["status"], "completed", call)
        self.assertIn("echo tool-ran-$((6*7))", call["title"], call)


class Subagent:
    """
    Mixed into a real CLI's full-access case: the model starts a subagent
    (the CLI's ``Agent`` or ``agent`` tool); ``subagent_call`` is the id of
    the stand-in model's call.
    """

    subagent_call = ""
    #: What the CLI reports its subagent said: ``(role, text)``.
    subagent_said = ("assistant", "you said: sub-hello")

    @inlineCallbacks
    def test_subagent(self: Any) -> Any:
        """
        The real CLI tags the subagent's messages, which the session reports
        as the subagent's, named after the call that started it, and closes
        it once, when the CLI says it is done (both run it in the
        background: the call's result comes at once, the end later).
        """
        sid = yield self.session(self.agent)
        reply = yield self.prompt(sid, "task: sub-hello", wait=90)
        self.assertEqual(reply.json()["stop_reason"], "end_turn", reply.body)
        page = yield self.events(sid, "&types=subagent")
        events = [e["subagent"] for e in page["events"]]
        self.assertEqual({e["id"] for e in events}, {self.subagent_call}, events)
        said = [
            (e["entry"].get("role"), e["entry"].get("text"))
            for e in events
            if e["op"] == "entry" and e["entry"]["kind"] == "message"
        ]
        self.assertIn(self.subagent_said, said, events)
        ops = [e["op"] for e in events]
        self.assertEqual((ops[-1], ops.count("close")), ("close", 1), events)
        # Not at the call's result, which says the subagent was launched:
        # after the agent's answer to that result ("ran: ...").
        page = yield self.events(sid, "&types=subagent,message.delta")
        order = [
            "close"
            if e["type"] == "subagent" and e["subagent"]["op"] == "close"
            else e.get("content", {}).get("text", "")[:4]
            for e in page["events"]
        ]
        self.assertGreater(order.index("close"), order.index("ran:"), order)
        self.assertEqual(
            {(e["name"], e["instructions"]) for e in events if "name" in e},
            {("Look around", "sub-hello")},
        )


class RealQwenFullAccessTests(Subagent, ToolCall, FullAccess, RealQwenTests):
    subagent_call = "call_task"
    #: Qwen Code 0.24 prints its subagent's prompt, not what it answers (that
    #: reaches only the agent, in the task's notification).
    subagent_said = ("user", "sub-hello")


class RealCodexFullAccessTests(ToolCall, FullAccess, RealCodexTests):
    pass


class RealClaudeFullAccessTests(Subagent, ToolCall, FullAccess, RealClaudeTests):
    #: Claude Code runs the subagent in the background (the call's
    #: result at once, the subagent's end in a notification).
    subagent_call = "toolu_task"
