"""
A scripted ACP agent built on the official Python SDK (``agent-client-protocol``).

The SDK does the framing, dispatch and validation, so sandboxd is tested
against a real third-party ACP implementation.  The scenario is chosen by
the prompt's first word; capabilities by command-line flags:

``--no-load`` (no ``loadSession``), ``--no-list``, ``--embedded``
(``promptCapabilities.embeddedContext``), ``--auth`` (``session/new`` is
-32000 until ``authenticate``), ``--close`` (``sessionCapabilities.close``).

Prompts: ``echo TEXT``, ``edit PATH TEXT`` (plan, permission, fs write,
diff), ``read PATH [LINE LIMIT]``, ``write PATH TEXT`` (no permission asked),
``terminal CMD ARGS``, ``slow`` (until cancelled), ``stubborn`` (ignores
cancel), ``commands [NAME...]`` (offers /web, or the names), ``/compact``
(answers token counts as JSON), ``exit`` (dies mid-turn), ``think``, ``info``,
``mcp`` (reports, then leaks, the MCP servers' headers it was given).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import uuid
from typing import Any

import pydantic
from pydantic._internal import _fields


def build_models_when_used() -> None:
    """
    Let the SDK's schema module (some 270 models) import faster: each
    model's validator is built when first used instead of at class
    creation, and its fields' docstrings (descriptions for a JSON
    Schema this agent never emits, read by parsing each class's source)
    are not read.  What is validated, and how, is unchanged; the agent
    starts once or more in most agent tests, and the import was most of
    its start.
    """
    pydantic.BaseModel.model_config["defer_build"] = True
    if hasattr(_fields, "_update_fields_from_docstrings"):
        _fields._update_fields_from_docstrings = lambda *args, **kwargs: None  # type: ignore[attr-defined]


build_models_when_used()

from acp import (  # noqa: E402
    PROTOCOL_VERSION,
    Agent,
    RequestError,
    plan_entry,
    run_agent,
    start_edit_tool_call,
    start_tool_call,
    tool_diff_content,
    tool_terminal_ref,
    update_agent_message_text,
    update_agent_thought_text,
    update_plan,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import (  # noqa: E402
    AuthenticateResponse,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    SessionNotification,
    SetSessionConfigOptionResponse,
    SetSessionModeResponse,
    ToolCallUpdate,
)

FLAGS = set(sys.argv[1:])

CONFIG = [
    {
        "id": "model",
        "name": "Model",
        "category": "model",
        "type": "select",
        "currentValue": "small",
        "options": [
            {"value": "small", "name": "Small"},
            {"value": "large", "name": "Large"},
        ],
    }
]
MODES = {
    "currentModeId": "default",
    "availableModes": [
        {"id": "default", "name": "Default"},
        {"id": "plan", "name": "Plan"},
        {"id": "bypassPermissions", "name": "Bypass"},
    ],
}


def raw_update(data: dict[str, Any]) -> Any:
    """A session update from its wire form."""
    return SessionNotification.model_validate({"sessionId": "x", "update": data}).update


class FakeAgent(Agent):
    def __init__(self) -> None:
        self.conn: Any = None
        self.cancelled: dict[str, asyncio.Event] = {}
        self.authenticated = "--auth" not in FLAGS
        self.config = [dict(c) for c in CONFIG]
        self.mcp_servers: dict[str, list[dict[str, Any]]] = {}

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: Any = None,
        client_info: Any = None,
        **kw: Any,
    ) -> InitializeResponse:
        caps: dict[str, Any] = {
            "loadSession": "--no-load" not in FLAGS,
            "promptCapabilities": {
                "image": False,
                "audio": False,
                "embeddedContext": "--embedded" in FLAGS,
            },
            "sessionCapabilities": {},
        }
        if "--no-list" not in FLAGS:
            caps["sessionCapabilities"]["list"] = {}
        if "--close" in FLAGS:
            caps["sessionCapabilities"]["close"] = {}
        auth = [{"id": "fake-key", "name": "Fake key"}] if "--auth" in FLAGS else []
        # Echo what the client offered, for tests that check it.
        print(
            f"client capabilities: {client_capabilities.model_dump(by_alias=True, exclude_none=True) if client_capabilities else None}",
            file=sys.stderr,
            flush=True,
        )
        return InitializeResponse.model_validate(
            {
                "protocolVersion": PROTOCOL_VERSION,
                "agentCapabilities": caps,
                "authMethods": auth,
                "agentInfo": {"name": "fake-agent", "version": "1.0"},
            }
        )

    async def authenticate(self, method_id: str, **kw: Any) -> AuthenticateResponse:
        if method_id != "fake-key":
            raise RequestError.invalid_params({"method": method_id})
        self.authenticated = True
        return AuthenticateResponse()

    async def new_session(
        self, cwd: str, mcp_servers: Any = None, **kw: Any
    ) -> NewSessionResponse:
        if not self.authenticated:
            raise RequestError.auth_required()
        sid = "fake-" + uuid.uuid4().hex[:8]
        self.cancelled[sid] = asyncio.Event()
        self.mcp_servers[sid] = [
            m.model_dump(by_alias=True, exclude_none=True) for m in mcp_servers or []
        ]
        print(
            f"new session {sid} in {cwd}; FAKE_SECRET={os.environ.get('FAKE_SECRET')}",
            file=sys.stderr,
            flush=True,
        )
        return NewSessionResponse.model_validate(
            {"sessionId": sid, "modes": MODES, "configOptions": self.config}
        )

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: Any = None, **kw: Any
    ) -> LoadSessionResponse:
        if "--no-load" in FLAGS:
            raise RequestError.method_not_found("session/load")
        self.cancelled[session_id] = asyncio.Event()
        self.mcp_servers[session_id] = [
            m.model_dump(by_alias=True, exclude_none=True) for m in mcp_servers or []
        ]
        await self.conn.session_update(
            session_id, update_user_message_text("hello from before")
        )
        await self.conn.session_update(session_id, update_agent_message_text("hi, "))
        await self.conn.session_update(
            session_id, update_agent_message_text("I remember")
        )
        return LoadSessionResponse.model_validate({"modes": MODES})

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **kw: Any
    ) -> ListSessionsResponse:
        if "--no-list" in FLAGS:
            raise RequestError.method_not_found("session/list")
        return ListSessionsResponse.model_validate(
            {
                "sessions": [
                    {
                        "sessionId": "old-1",
                        "cwd": cwd or "/",
                        "title": "Earlier work",
                        "updatedAt": "2026-01-01T00:00:00Z",
                    }
                ],
                "nextCursor": None,
            }
        )

    async def close_session(self, session_id: str, **kw: Any) -> Any:
        if "--close" not in FLAGS:
            raise RequestError.method_not_found("session/close")
        print(f"closed {session_id}", file=sys.stderr, flush=True)
        return {}

    async def set_session_mode(
        self, session_id: str, mode_id: str, **kw: Any
    ) -> SetSessionModeResponse:
        return SetSessionModeResponse()

    async def set_config_option(
        self, config_id: str, session_id: str, value: Any, **kw: Any
    ) -> SetSessionConfigOptionResponse:
        for option in self.config:
            if option["id"] == config_id:
                option["currentValue"] = value
                return SetSessionConfigOptionResponse.model_validate(
                    {"configOptions": self.config}
                )
        raise RequestError.invalid_params({"configId": config_id})

    async def cancel(self, session_id: str, **kw: Any) -> None:
        if session_id in self.cancelled:
            self.cancelled[session_id].set()

    async def prompt(
        self, session_id: str, prompt: list[Any], **kw: Any
    ) -> PromptResponse:
        self.cancelled.setdefault(session_id, asyncio.Event()).clear()
        text = " ".join(
            getattr(b, "text", "") or ""
            for b in prompt
            if getattr(b, "type", "") == "text"
        )
        resources = [
            b for b in prompt if getattr(b, "type", "") in ("resource", "resource_link")
        ]
        if text.startswith("waitfor "):
            # ``waitfor FILE SCENARIO``: say so, wait (at most 30 s) until
            # FILE exists, then play SCENARIO; a test holds the turn
            # running for as long as it needs.
            _, gate, text = text.split(" ", 2)
            await self.conn.session_update(
                session_id, update_agent_message_text("waiting; ")
            )
            for _ in range(600):
                if os.path.exists(gate):
                    break
                await asyncio.sleep(0.05)
        words = text.split(" ", 2)
        verb = words[0]
        send = self.conn.session_update
        if verb == "echo":
            message = text[5:]
            for r in resources:
                message += f" [{r.type}:{getattr(r, 'uri', None) or r.resource.uri}]"
            await send(
                session_id, update_agent_message_text(message[: len(message) // 2])
            )
            await send(
                session_id, update_agent_message_text(message[len(message) // 2 :])
            )
            await send(
                session_id,
                raw_update({"sessionUpdate": "usage_update", "used": 42, "size": 1000}),
            )
            return PromptResponse(stop_reason="end_turn")
        if verb == "think":
            await send(session_id, update_agent_thought_text("pondering"))
            await send(session_id, update_agent_message_text("done"))
            return PromptResponse(stop_reason="end_turn")
        if verb == "info":
            await send(
                session_id,
                raw_update(
                    {"sessionUpdate": "session_info_update", "title": "Fake title"}
                ),
            )
            await send(
                session_id,
                raw_update(
                    {"sessionUpdate": "current_mode_update", "currentModeId": "plan"}
                ),
            )
            return PromptResponse(stop_reason="end_turn")
        if verb == "commands":
            # ``commands`` offers /web; ``commands A B`` offers /A and /B.
            names = text.split()[1:]
            offered: list[dict[str, Any]] = [
                {"name": name, "description": f"The {name} command"} for name in names
            ] or [
                {
                    "name": "web",
                    "description": "Search the web",
                    "input": {"hint": "query"},
                }
            ]
            await send(
                session_id,
                raw_update(
                    {
                        "sessionUpdate": "available_commands_update",
                        "availableCommands": offered,
                    }
                ),
            )
            return PromptResponse(stop_reason="end_turn")
        if verb == "/compact":
            await send(
                session_id,
                update_agent_message_text(
                    '{"originalTokenCount": 1200, "newTokenCount": 300}'
                ),
            )
            return PromptResponse(stop_reason="end_turn")
        if verb == "edit":
            return await self._edit(
                session_id, words[1], words[2] if len(words) > 2 else ""
            )
        if verb == "read":
            try:
                # ``read PATH [LINE LIMIT]``: a slice of the file by lines.
                span = [int(n) for n in words[2].split()] if len(words) > 2 else []
                result = await self.conn.read_text_file(
                    session_id=session_id,
                    path=words[1],
                    line=span[0] if span else None,
                    limit=span[1] if len(span) > 1 else None,
                )
                await send(
                    session_id, update_agent_message_text("content: " + result.content)
                )
            except RequestError as e:
                await send(
                    session_id, update_agent_message_text(f"error {e.code}: {e}")
                )
            return PromptResponse(stop_reason="end_turn")
        if verb == "write":
            try:
                await self.conn.write_text_file(
                    session_id=session_id, path=words[1], content=words[2]
                )
                await send(session_id, update_agent_message_text("written"))
            except RequestError as e:
                await send(
                    session_id, update_agent_message_text(f"error {e.code}: {e}")
                )
            return PromptResponse(stop_reason="end_turn")
        if verb == "terminal":
            parts = text.split()[1:]
            await send(
                session_id,
                start_tool_call(
                    "run1", "Run " + parts[0], kind="execute", status="in_progress"
                ),
            )
            try:
                term = await self.conn.create_terminal(
                    session_id=session_id,
                    command=parts[0],
                    args=parts[1:],
                    output_byte_limit=4096,
                )
            except RequestError as e:
                await send(
                    session_id, update_agent_message_text(f"error {e.code}: {e}")
                )
                return PromptResponse(stop_reason="end_turn")
            await send(
                session_id,
                update_tool_call("run1", content=[tool_terminal_ref(term.terminal_id)]),
            )
            exit_status = await self.conn.wait_for_terminal_exit(
                session_id=session_id, terminal_id=term.terminal_id
            )
            output = await self.conn.terminal_output(
                session_id=session_id, terminal_id=term.terminal_id
            )
            await self.conn.release_terminal(
                session_id=session_id, terminal_id=term.terminal_id
            )
            await send(session_id, update_tool_call("run1", status="completed"))
            await send(
                session_id,
                update_agent_message_text(
                    f"exit={exit_status.exit_code} signal={exit_status.signal} output={output.output!r}"
                ),
            )
            return PromptResponse(stop_reason="end_turn")
        if verb == "slow":
            await send(session_id, update_agent_message_text("working"))
            try:
                await asyncio.wait_for(self.cancelled[session_id].wait(), timeout=60)
            except TimeoutError:
                return PromptResponse(stop_reason="end_turn")
            return PromptResponse(stop_reason="cancelled")
        if verb == "stubborn":
            await send(session_id, update_agent_message_text("never stopping"))
            await asyncio.sleep(3600)
            return PromptResponse(stop_reason="end_turn")
        if verb == "exit":
            await send(session_id, update_agent_message_text("bye"))
            sys.stderr.write("fatal: the fake agent crashed on purpose\n")
            sys.stderr.flush()
            os._exit(3)
        if verb == "mcp":
            return await self._mcp(session_id)
        await send(session_id, update_agent_message_text(f"unknown scenario {verb!r}"))
        return PromptResponse(stop_reason="end_turn")

    async def _mcp(self, session_id: str) -> PromptResponse:
        """
        Report the MCP servers ``session/new`` gave: each one's name, URL,
        the SHA-256 of its Authorization header and whether that value is
        anywhere in this process's environment; then leak the header in
        three-character message chunks and on stderr (for redaction).
        """
        send = self.conn.session_update
        for server in self.mcp_servers.get(session_id, []):
            headers = {h["name"]: h["value"] for h in server.get("headers", [])}
            auth = headers.get("Authorization", "")
            digest = hashlib.sha256(auth.encode()).hexdigest()
            in_env = any(auth and auth.split()[-1] in v for v in os.environ.values())
            await send(
                session_id,
                update_agent_message_text(
                    f"server {server['name']} {server.get('url')} sha256={digest} "
                    f"in_env={in_env} leak="
                ),
            )
            for i in range(0, len(auth), 3):
                await send(session_id, update_agent_message_text(auth[i : i + 3]))
            await send(session_id, update_agent_message_text(" end\n"))
            print(f"mcp header {auth}", file=sys.stderr, flush=True)
        return PromptResponse(stop_reason="end_turn")

    async def _edit(self, session_id: str, path: str, new_text: str) -> PromptResponse:
        send = self.conn.session_update
        await send(
            session_id,
            update_plan(
                [
                    plan_entry("Read the file", priority="high", status="completed"),
                    plan_entry("Edit it", priority="medium", status="in_progress"),
                ]
            ),
        )
        try:
            old = (
                await self.conn.read_text_file(session_id=session_id, path=path)
            ).content
        except RequestError:
            old = None
        await send(
            session_id,
            start_edit_tool_call(
                "edit1", f"Edit {os.path.basename(path)}", path=path, content=new_text
            ),
        )
        permission = await self.conn.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(
                tool_call_id="edit1", content=[tool_diff_content(path, new_text, old)]
            ),
            options=[
                PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
                PermissionOption(
                    option_id="always", name="Always allow", kind="allow_always"
                ),
                PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
            ],
        )
        outcome = permission.outcome
        if outcome.outcome == "cancelled":
            await send(session_id, update_tool_call("edit1", status="failed"))
            return PromptResponse(stop_reason="cancelled")
        if outcome.option_id == "reject":
            await send(session_id, update_tool_call("edit1", status="failed"))
            await send(session_id, update_agent_message_text("permission refused"))
            return PromptResponse(stop_reason="end_turn")
        await self.conn.write_text_file(
            session_id=session_id, path=path, content=new_text
        )
        await send(
            session_id,
            update_tool_call(
                "edit1",
                status="completed",
                content=[tool_diff_content(path, new_text, old)],
            ),
        )
        await send(
            session_id,
            update_agent_message_text(
                f"edited {os.path.basename(path)} ({outcome.option_id})"
            ),
        )
        return PromptResponse(stop_reason="end_turn")


if __name__ == "__main__":
    asyncio.run(run_agent(FakeAgent(), use_unstable_protocol=True))
