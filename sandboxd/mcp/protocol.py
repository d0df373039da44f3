# -*- test-case-name: tests.mcp.test_door -*-
"""
The MCP methods: lifecycle, tools and resources (SPEC §17), over JSON-RPC
2.0 messages already read from the transport.

:class:`Methods` answers one request of one session; what it answers is a
JSON-RPC result or error object, or a Deferred of one for calls that run.
It knows nothing of HTTP: the door (:mod:`sandboxd.mcp.door`) hands it the
caller's headers for the gate and a way to send notifications.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger

from sandboxd._version import __version__
from sandboxd.access import gate
from sandboxd.access.tracing import with_meta_context
from sandboxd.errors import Code, bad_request, limit_exceeded
from sandboxd.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    RESOURCE_NOT_FOUND,
    Message,
    error,
    notification,
    request_key,
    result,
)
from sandboxd.mcp.calls import ToolCall, decoded_text, error_result, image_type
from sandboxd.mcp.collecting import Progress
from sandboxd.mcp.tools import (
    NOT_TOOLS,
    ArgumentError,
    Toolbox,
    byte_names,
    listed_by_default,
)
from sandboxd.policy.confinement import CONFINED, confinement_note
from sandboxd.policy.defaults import (
    MCP_CALLS_PER_SESSION,
    MCP_COMMANDS_NOTE_CHARS,
    MCP_PROGRESS_MESSAGE_CHARS,
    MCP_PROGRESS_SECONDS,
)

if TYPE_CHECKING:
    from sandboxd.access.auth import Identity
    from sandboxd.daemon.context import Context
    from sandboxd.mcp.sessions import Session

log = Logger(namespace="sandboxd.mcp")

#: MCP's own codes beside JSON-RPC's (:mod:`sandboxd.jsonrpc`).
#: The session id is unknown, expired or another identity's.
SESSION_NOT_FOUND = -32001
#: A refusal of the door itself (its §6 code is in ``data``).
REFUSED = -32000

#: Revisions served, oldest first: the last is offered to clients asking
#: for one we do not serve.  Both batch-free (see the door).
VERSIONS = ("2025-06-18", "2025-11-25")
LATEST = VERSIONS[-1]

FILE_TEMPLATE = "file:///{+path}"


def negotiate(requested: Any) -> str:
    """The revision to answer ``initialize`` with (SPEC §17)."""
    return requested if requested in VERSIONS else LATEST


@attrs.frozen
class Caller:
    """Who sent a message, as the gate needs it for each call."""

    headers: Mapping[bytes, Any]
    secure: bool
    client: str
    #: Told when the message becomes a governed call (a tool's or a
    #: resource's), which is audited and counted as its own endpoint.
    on_call: Callable[[], None] | None = None
    #: The trace context of the calls it carries (the message's own span
    #: as their parent), when not ``headers``.
    trace_headers: Mapping[bytes, Any] | None = None


class Methods:
    """The MCP methods of one daemon."""

    def __init__(self, context: Context, toolbox: Toolbox) -> None:
        self.context = context
        self.toolbox = toolbox

    # -- lifecycle ---------------------------------------------------------

    def initialize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The ``initialize`` result (the session is made by the door)."""
        return {
            "protocolVersion": negotiate(params.get("protocolVersion")),
            "capabilities": {
                "tools": {"listChanged": True},
                "resources": {"listChanged": False, "subscribe": False},
            },
            "serverInfo": {
                "name": "sandboxd",
                "title": "sandboxd",
                "version": __version__,
            },
            "instructions": (
                "sandboxd runs inside this sandbox: files, commands, background "
                "processes, system facts (and, when enabled, dev tools and a "
                "browser). The tools listed are exactly those this token may "
                "call now; capabilities_check explains a refusal. Paths are "
                "relative to the base directory unless absolute."
            ),
        }

    def _descriptor(self, name: str, identity: Identity) -> dict[str, Any]:
        """
        A tool as listed: a tool whose commands the policy confines says
        so, so that a model reads where they may write before a refusal
        tells it; ``run_command`` listed to a token that may run only some
        commands (``commands:run:NAME``) names them, as a model cannot
        guess them.
        """
        descriptor = self.toolbox.tools[name].descriptor
        if name == "run_command":
            return self._run_command_descriptor(descriptor, identity)
        rule = self.context.policy.rules.get(name)
        if rule is None or name not in CONFINED:
            return descriptor  # it starts no command (a file tool, a read)
        note = confinement_note(rule)
        if note is None:
            return descriptor
        return {**descriptor, "description": f"{descriptor['description']} {note}"}

    def _run_command_descriptor(
        self, descriptor: dict[str, Any], identity: Identity
    ) -> dict[str, Any]:
        rule = self.context.policy.rules["run_command"]
        # Hidden commands stay unnamed here too, as in GET /commands.
        runnable = [
            cmd
            for cmd in sorted(self.context.registry, key=lambda c: c.name)
            if not cmd.hidden
            and gate.may_run_command(identity, rule, cmd.name, cmd.scopes)
        ]
        if runnable:
            listing = commands_note(runnable, MCP_COMMANDS_NOTE_CHARS)
            note = (
                f"This token may run only these commands: {listing}."
                if gate.lacking_scope(identity, rule, {}) is not None
                else f"Commands: {listing}."
            )
        elif gate.lacking_scope(identity, rule, {}) is not None:
            note = (
                "This token may run only the commands its scopes name "
                "(commands:run:NAME)."
            )
        else:
            return descriptor
        return {**descriptor, "description": f"{descriptor['description']} {note}"}

    def visible(self, identity: Identity) -> list[str]:
        """
        The tools ``identity`` may call now (enabled and allowed) and that
        are listed: by default those a model uses
        (:func:`~sandboxd.mcp.tools.listed_by_default`), every one with the
        ``mcp`` endpoint's ``params.mcp_tools: all``.
        """
        every = self.context.policy.rule("mcp").params.mcp_tools == "all"
        return [
            name
            for name, tool in self.toolbox.tools.items()
            if (every or listed_by_default(tool.endpoint))
            and gate.may_use(self.context, identity, tool.endpoint)
        ]

    # -- one request -------------------------------------------------------

    def handle(
        self,
        session: Session,
        message: Message,
        caller: Caller,
        notify: Callable[[Message], None] | None,
    ) -> Message | Deferred[Message]:
        """
        Answer one request of ``session``.

        :param notify: sends a notification tied to this request (progress),
            or None when the answer cannot carry any (a JSON response).
        """
        rid = message.get("id")
        method = message.get("method")
        params = message.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return error(rid, INVALID_PARAMS, "params must be an object")
        if method == "initialize":
            return error(rid, INVALID_REQUEST, "the session is already initialized")
        if method == "ping":
            return result(rid, {})
        if method == "tools/list":
            if params.get("cursor") is not None:
                # The list is one page (no nextCursor): a cursor is none of ours.
                return error(
                    rid, INVALID_PARAMS, "unknown cursor: the list is one page"
                )
            names = self.visible(session.identity)
            session.listed = frozenset(names)
            tools = [self._descriptor(n, session.identity) for n in names]
            return result(rid, {"tools": tools})
        if method == "tools/call":
            return self._call(session, rid, params, caller, notify)
        if method == "resources/templates/list":
            return result(
                rid,
                {
                    "resourceTemplates": [
                        {
                            "uriTemplate": FILE_TEMPLATE,
                            "name": "file",
                            "title": "A file in the sandbox",
                            "description": "Read through the path guard as the "
                            "download endpoint (files:read, max_bytes); text as "
                            "text, anything else as a base64 blob.",
                        }
                    ]
                },
            )
        if method == "resources/list":
            return self._list_resources(session, rid, caller)
        if method == "resources/read":
            return self._read_resource(session, rid, params, caller)
        return error(rid, METHOD_NOT_FOUND, f"method not found: {method}")

    # -- tools/call --------------------------------------------------------

    def _call(
        self,
        session: Session,
        rid: Any,
        params: Mapping[str, Any],
        caller: Caller,
        notify: Callable[[Message], None] | None,
    ) -> Message | Deferred[Message]:
        name = params.get("name")
        if not isinstance(name, str):
            return error(rid, INVALID_PARAMS, "tools/call needs a tool name")
        tool = self.toolbox.get(name)
        if tool is None:
            if name in NOT_TOOLS and name in self.context.table:
                why = f"{name} is not served as a tool: {NOT_TOOLS[name]}"
            else:
                why = f"unknown tool: {name}"
            return error(rid, INVALID_PARAMS, why)
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        try:
            split = tool.split(arguments)
        except ArgumentError as e:
            # A tool error the model can read and correct, not a protocol error.
            return result(rid, error_result(bad_request(f"{name}: {e}")))
        if len(session.calls) >= MCP_CALLS_PER_SESSION:
            return result(
                rid,
                error_result(
                    limit_exceeded(
                        429,
                        f"this session has {MCP_CALLS_PER_SESSION} calls in flight",
                        Code.CONCURRENCY_LIMITED,
                        limit=MCP_CALLS_PER_SESSION,
                    )
                ),
            )
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        progress = (
            self._progress(token, notify)
            if notify is not None and isinstance(token, str | int)
            else None
        )
        if caller.on_call is not None:
            caller.on_call()
        call = ToolCall(
            self.context,
            tool,
            split,
            caller.headers,
            secure=caller.secure,
            client=caller.client,
            session_id=session.id,
            progress=progress,
            trace_headers=with_meta_context(
                caller.headers
                if caller.trace_headers is None
                else caller.trace_headers,
                meta,
            ),
        )
        key = request_key(rid)
        session.calls[key] = call

        def done(value: dict[str, Any]) -> Message:
            session.calls.pop(key, None)
            return result(rid, value)

        def cancelled(failure: Any) -> Message:
            session.calls.pop(key, None)
            if failure.check(CancelledError):
                return error(rid, REFUSED, "the call was cancelled")
            # A bug, not a cancellation: said as one (and logged), never
            # passed off as the client's doing.
            log.failure("tool {tool} failed", failure, tool=name)
            return error(rid, INTERNAL_ERROR, "the call failed inside the server")

        return call.run().addCallbacks(done, cancelled)

    def _progress(
        self, token: str | int, notify: Callable[[Message], None]
    ) -> Progress:
        """
        Progress notifications for one call: new output in ``message`` and
        the bytes so far in ``progress``, gathered briefly so a chatty
        child costs a notification per interval, not per line.
        """
        pending: list[tuple[str, str]] = []
        state: dict[str, Any] = {
            "so_far": 0,
            "sent": 0,
            "timer": None,
            "last": "stdout",
        }
        clock = self.context.reactor

        def flush() -> None:
            timer, state["timer"] = state["timer"], None
            if timer is not None and timer.active():
                timer.cancel()
            if not pending or state["so_far"] <= state["sent"]:
                return
            text = _labelled(pending, state)
            pending.clear()
            if len(text) > MCP_PROGRESS_MESSAGE_CHARS:
                # The result carries the output; progress is for watching.
                cut = len(text) - MCP_PROGRESS_MESSAGE_CHARS
                text = f"[{cut} characters left out]\n" + text[cut:]
            state["sent"] = state["so_far"]
            notify(
                notification(
                    "notifications/progress",
                    {
                        "progressToken": token,
                        "progress": state["so_far"],
                        "message": text,
                    },
                )
            )

        def report(text: str, so_far: int, stream: str = "stdout") -> None:
            pending.append((stream, text))
            state["so_far"] = so_far
            if state["timer"] is None:
                state["timer"] = clock.callLater(MCP_PROGRESS_SECONDS, flush)

        report.flush = flush  # type: ignore[attr-defined]
        return report

    # -- resources ---------------------------------------------------------

    def _governed(
        self,
        session: Session,
        endpoint_id: str,
        arguments: dict[str, Any],
        caller: Caller,
    ) -> Deferred[dict[str, Any]] | None:
        tool = self.toolbox.get(endpoint_id)
        if tool is None:
            return None
        if caller.on_call is not None:
            caller.on_call()
        call = ToolCall(
            self.context,
            tool,
            tool.split(arguments),
            caller.headers,
            secure=caller.secure,
            client=caller.client,
            session_id=session.id,
            trace_headers=caller.trace_headers,
        )
        return call.run()

    def _list_resources(
        self, session: Session, rid: Any, caller: Caller
    ) -> Message | Deferred[Message]:
        d = self._governed(session, "files_list", {}, caller)
        if d is None:
            return result(rid, {"resources": []})

        def listed(value: dict[str, Any]) -> Message:
            if value.get("isError"):
                return _resource_error(rid, value)
            entries = value["structuredContent"].get("entries", [])
            resources = [
                {
                    "uri": file_uri(str(e.get("path", ""))),
                    "name": str(e.get("name", "")),
                    **({"size": e["size"]} if isinstance(e.get("size"), int) else {}),
                }
                for e in entries
                if e.get("type") == "file"
            ]
            return result(rid, {"resources": resources})

        return d.addCallback(listed)

    def _read_resource(
        self, session: Session, rid: Any, params: Mapping[str, Any], caller: Caller
    ) -> Message | Deferred[Message]:
        uri = params.get("uri")
        path = file_path(uri) if isinstance(uri, str) else None
        if path is None:
            return error(
                rid,
                INVALID_PARAMS,
                f"resources/read takes a {FILE_TEMPLATE} uri",
            )
        d = self._governed(session, "download", {"path": path}, caller)
        if d is None:
            return error(rid, RESOURCE_NOT_FOUND, "file reads are not served")

        def read(value: dict[str, Any]) -> Message:
            if value.get("isError"):
                return _resource_error(rid, value)
            structured = value["structuredContent"]
            # A picture's bytes come as the result's image content; text
            # as its text content (the first; a note on a cut follows it).
            images = [c for c in value["content"] if c.get("type") == "image"]
            texts = [c["text"] for c in value["content"] if c.get("type") == "text"]
            content: dict[str, Any] = {"uri": uri}
            contents = [content]
            if not images and "content_base64" not in structured and texts:
                content.update(mimeType="text/plain", text=texts[0])
            else:
                data = str(
                    images[0]["data"]
                    if images
                    else structured.get("content_base64", "")
                )
                text = decoded_text(data)
                if text is not None:
                    content.update(mimeType="text/plain", text=text)
                else:
                    kind = image_type(data) or "application/octet-stream"
                    content.update(mimeType=kind, blob=data)
            if structured.get("truncated"):
                # Only part of the file: said where a client looks (_meta)
                # and where a model does (a text note after the part).
                meta = {
                    k: structured[k]
                    for k in (
                        "truncated",
                        "offset",
                        "lines",
                        "total_lines",
                        "next_offset",
                    )
                    if k in structured
                }
                content["_meta"] = meta
                if "next_offset" in meta:
                    note = (
                        f"[truncated: this is lines {meta['offset']}-"
                        f"{meta['next_offset'] - 1} of {meta['total_lines']}; read "
                        f"on with the download tool, offset {meta['next_offset']}]"
                    )
                else:
                    note = (
                        "[truncated: only the start of the file fits one result; "
                        "the download tool reads the rest (offset, limit)]"
                    )
                contents.append(
                    {"uri": uri, "mimeType": "text/plain", "text": note, "_meta": meta}
                )
                return result(rid, {"contents": contents, "_meta": meta})
            return result(rid, {"contents": contents})

        return d.addCallback(read)


def _labelled(pending: list[tuple[str, str]], state: dict[str, Any]) -> str:
    """
    New output as printed, joined: where it passes from one stream to the
    other, a ``[stderr]`` or ``[stdout]`` line says so (on a line of its
    own; ``state["last"]`` remembers the stream across notifications).
    """
    out: list[str] = []
    for stream, text in pending:
        if stream != state["last"]:
            state["last"] = stream
            joined = "".join(out)
            out.append(
                ("\n" if joined and not joined.endswith("\n") else "") + f"[{stream}]\n"
            )
        out.append(text)
    return "".join(out)


def _resource_error(rid: Any, value: dict[str, Any]) -> Message:
    # A refusal (path_denied) of a valid request is the server's own code,
    # as the door's refusals are, not "Invalid Request".
    body = value.get("structuredContent") or {}
    code = RESOURCE_NOT_FOUND if body.get("code") == "not_found" else REFUSED
    return error(rid, code, str(body.get("error", "refused")), body)


def file_uri(path: str) -> str:
    """
    The ``file:///`` URI of an absolute path as the files API shows it: a
    byte that is not UTF-8 (shown ``\\xNN``) is percent-encoded as itself.
    """
    raw = byte_names(path).encode("utf-8", "surrogateescape")
    return "file://" + urllib.parse.quote(raw)


def file_path(uri: str) -> str | None:
    """
    The absolute path a ``file:///`` URI names, or None; a ``%NN`` that is
    not part of UTF-8 text names that byte (as the HTTP API's query does).
    """
    if not uri.startswith("file:///"):
        return None
    path = urllib.parse.unquote(uri[len("file://") :], errors="surrogateescape")
    return path if path and "\x00" not in path else None


def _signature(cmd: Any) -> str:
    """``name(arg: type = default, ...): first sentence`` for one command."""
    args = ", ".join(
        f"{a.name}: {a.type}"
        + ("" if a.required or a.default is None else f" = {json.dumps(a.default)}")
        for a in cmd.args
    )
    text = f"{cmd.name}({args})"
    summary = (cmd.description or "").strip().split(". ")[0].rstrip(".")
    if summary:
        text += f": {summary[:80]}"
    return text


def commands_note(commands: list[Any], budget: int) -> str:
    """
    The commands a caller may run, with their arguments, for
    ``run_command``'s description: a model calls one without first asking
    ``list_commands``.  Past ``budget`` characters, the rest are counted.
    """
    lines: list[str] = []
    used = 0
    for i, cmd in enumerate(commands):
        line = _signature(cmd)
        if used + len(line) > budget:
            lines.append(f"and {len(commands) - i} more (list_commands lists them all)")
            break
        lines.append(line)
        used += len(line) + 2
    return "; ".join(lines)
