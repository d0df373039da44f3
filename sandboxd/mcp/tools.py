# -*- test-case-name: tests.mcp.test_tools -*-
"""
MCP tools generated from the endpoint table (SPEC §17).

Each endpoint is one tool named by its id; the input schema is the query,
path and body fields the endpoint's :class:`~sandboxd.api.schema.Schema`
declares (the same declarations ``/openapi.json`` is built from), the output
schema its response fields.  The few endpoints that cannot be one call are
left out, each with the reason ``docs/mcp.md`` repeats; the rest are
adapted where they must be (a follow stream runs until its process ends).

Arguments are checked here against the input schema, so a call that does
not match is a JSON-RPC error before any gate or handler sees it, and then
split back into the query, path and body the handler reads.
"""

from __future__ import annotations

import base64
import re
import shlex
import shutil
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from sandboxd.api.openapi import field_schema
from sandboxd.api.schema import PATH_PARAMS, Field, Schema, schema_for
from sandboxd.endpoints import DOOR_METHODS, CapabilityGroup, Endpoint, param_name

#: Endpoints that are not tools, and why (``docs/mcp.md`` has the same table).
NOT_TOOLS: dict[str, str] = {
    "mcp": "the MCP door itself",
    "e2b": "the E2B door itself, on a port of its own",
    "kep": "the KEP door itself (agent-sandbox's runtime protocol), on ports of its own",
    "pty_connect": "an interactive WebSocket byte stream, not one call; use "
    "shell, shell_stream or process_start with process_stdin",
    "lsp_connect": "an editor's WebSocket to its own language server, not one "
    "call; use lsp_diagnostics, lsp_definition and the other lsp tools",
    "files_read_raw": "raw binary response body; use download (base64) or "
    "the file:/// resource",
    "files_write_raw": "raw binary request body; use upload or "
    "files_upload_stream (base64)",
    "files_uploads_create": "a resumable upload is carried on by raw-body "
    "appends; use upload or files_upload_stream (base64)",
    "files_uploads_list": "part of a resumable raw upload (files_uploads_create)",
    "files_uploads_get": "part of a resumable raw upload (files_uploads_create)",
    "files_uploads_append": "raw binary request body; use upload or "
    "files_upload_stream (base64)",
    "files_uploads_delete": "part of a resumable raw upload (files_uploads_create)",
    "files_download_stream": "the same answer as download, streamed for "
    "HTTP clients; an MCP result is one message anyway",
    "files_watch": "a change stream that lasts minutes (or until the client "
    "leaves): nothing to answer at once",
}

#: Query fields dropped from a tool's input, because MCP cannot use them:
#: the follow mode of streams that never end on their own.
DROPPED_ARGUMENTS: dict[str, frozenset[str]] = {
    "agents_events": frozenset({"follow"}),
    "agents_terminal_output": frozenset({"follow"}),
    # The door streams every execution (output as progress) and interrupts
    # it when the call is cancelled: these are its own, not the caller's.
    # allow_stdin: input() would wait for code_execution_input, which a
    # model waiting for this call's result cannot send (it fails at once).
    "code_execute": frozenset({"stream", "on_disconnect", "wait", "allow_stdin"}),
}

#: Body fields for HTTP clients only: an MCP result is read whole, as text
#: (``output: bytes`` frames raw chunks for byte-exact clients;
#: ``access_token`` is for EventSource, which cannot set a header;
#: ``since``, ``capture_output`` and ``recursive`` are the agent-sandbox SDK's
#: alternate forms of what ``after``, ``follow`` and ``depth`` already say).
HTTP_ONLY_FIELDS = frozenset(
    {"output", "access_token", "since", "capture_output", "recursive"}
)

#: What a model reads about fields whose table wording is for operators.
MODEL_FIELD_DOCS: dict[str, str] = {
    "user": "a user name or uid (root daemons only)",
    # lsp_servers is not in the default list: the questions pick a server.
    "server": "a language server (pyright, pylsp, ...); default: the first "
    "installed for the file",
    "root": "the project directory (default: the nearest with a project file)",
}

#: The JSON types of fields the table leaves free (``any``): a model
#: (and a client's argument validation) needs one.
MODEL_FIELD_TYPES: dict[str, list[str]] = {
    "user": ["string", "integer"],
    "mode": ["string", "integer"],
    "signal": ["string", "integer"],
    "prompt": ["string", "array"],
}

#: What a model reads about one tool's fields the table does not describe.
MODEL_ARGUMENT_DOCS: dict[tuple[str, str], str] = {
    ("download", "path"): "the file to read",
    ("upload", "path"): "the file to write",
    ("upload", "content_base64"): "bytes, base64",
    ("capabilities_check", "endpoint"): "the tool (endpoint id) to decide",
    ("shell_stream", "stdin_base64"): "bytes for its stdin, then end of file",
    ("files_move", "source"): "the path to move",
    ("files_move", "destination"): "where it goes",
    ("files_edit", "new_text"): "what replaces old_text",
}

#: Titles whose table wording is HTTP's (a status, SSE): what the tool
#: does through MCP instead.
MODEL_TITLES: dict[str, str] = {
    "download": "Read a file",
    "upload": "Write a file",
    "shell_stream": "Run a command, output as progress",
    "code_execute": "Run code in a context",
    "code_execution_events": "An execution's events",
    "agents_events": "The session's event log",
    "git_job_events": "A git job's progress",
}

#: Phrases of the table's descriptions that speak HTTP, as they read through
#: MCP (where a call runs to its end and there are no statuses).
MCP_WORDING: tuple[tuple[str, str], ...] = (
    (
        "A job: 202 {job_id, state: running, events_url} unless it ends within "
        "`wait` seconds (then 200 with the result, or its error).",
        "A job: {job_id, state: running} unless it ends within `wait` seconds "
        "(then its result, or its error); git_job_get reads it later.",
    ),
    (
        "seconds to wait for the result before answering 202",
        "seconds to wait for the result before answering with the job's id",
    ),
    (
        "200 when the turn ended within wait, else 202 with events_url.",
        "The turn's result when it ends within wait, else its id: read on "
        "with agents_events.",
    ),
    (" (SSE or page)", ""),
    (" (else Last-Event-ID)", ""),
    (" is 200 with exists: false.", " answers exists: false."),
    (" (resumable SSE)", ""),
    (" as a resumable SSE stream", ""),
    ("SSE (false: one JSON page)", "wait for events until it ends (false: one page)"),
    (
        "stream as SSE instead of one page",
        "wait until it exits (output as progress)",
    ),
)


def mcp_wording(text: str) -> str:
    """``text`` with its HTTP phrases as they read through MCP (:data:`MCP_WORDING`)."""
    for http, mcp in MCP_WORDING:
        text = text.replace(http, mcp)
    return text


#: Endpoints that change or remove what exists (``destructiveHint``), besides
#: every endpoint that starts a child or writes content (see
#: :func:`_starts_children` and :func:`_writes_content`).
DESTRUCTIVE = frozenset(
    {
        "files_delete",
        "files_move",
        "files_edit",
        "process_signal",
        "env_set",
        "pty_delete_session",
        "agents_session_delete",
        "agents_terminal_kill",
        # A code context's state (its variables, imports) is lost.
        "code_context_delete",
        "code_context_restart",
        # Any script on the page, which can post anywhere the page may go.
        "browser_evaluate",
    }
)

#: Non-GET endpoints that can be repeated with no further effect.
IDEMPOTENT = frozenset(
    {
        "files_mkdir",
        "files_chmod",
        "files_delete",
        "env_set",
        "pty_resize",
        "pty_delete_session",
    }
)

#: POST endpoints that only read (their body is a question, not a change).
READ_ONLY_POSTS = frozenset(
    {"files_search", "files_grep", "files_archive", "capabilities_check"}
)

#: Endpoints that reach outside the sandbox (``openWorldHint``), besides every
#: endpoint that starts a child (a command can reach the network).
OPEN_WORLD = frozenset(
    {
        "browser_navigate",
        # A click or a key can submit a form, a script can fetch: to the web.
        "browser_click",
        "browser_type",
        "browser_evaluate",
    }
)

#: GET endpoints whose read takes what it reads: neither read-only nor
#: idempotent (a retry answers nothing).
TAKING_READS = frozenset({"browser_console"})

#: Endpoints that run arbitrary code without a ``command`` field.
RUNS_CODE = frozenset(
    {
        "code_run",
        "code_execute",
        # What it writes is read by code that may do anything with it.
        "code_execution_input",
        "agents_install",
        "agents_session_create",
        "agents_prompt",
    }
)

#: Capability groups left out of the default ``tools/list`` (by their
#: names, so a group this table lacks costs nothing), and why.
NOT_LISTED_GROUPS: dict[str, str] = {
    "terminal": "a terminal is typed into over its WebSocket, which MCP cannot "
    "reach: use shell, or process_start with process_stdin",
    "auth": "capability links are minted for people and browsers, not for the "
    "model's own calls",
}

#: Tools left out of the default ``tools/list`` (still callable by name, and
#: listed when the ``mcp`` endpoint's ``params.mcp_tools`` is ``all``), and
#: why a model does not need them.
NOT_LISTED: dict[str, str] = {
    "health": "a liveness probe for supervisors",
    "openapi": "the HTTP API's description, for HTTP clients",
    "metrics": "Prometheus text for monitoring",
    "files_upload_stream": "upload does the same",
    "files_chmod": "upload takes a mode, and shell runs chmod",
    "files_archive": "an archive comes back as base64, which a model cannot read; "
    "shell runs tar or zip on the files in place",
    "files_extract": "the archive would have to pass through the model as base64; "
    "shell unpacks one already in the sandbox",
    "lsp_servers": "the questions pick a server themselves",
    "lsp_sessions_list": "the questions start and reuse servers themselves",
    "lsp_session_create": "the questions start and reuse servers themselves",
    "lsp_session_get": "for people looking at a server's log",
    "lsp_session_delete": "an idle server stops by itself",
    "lsp_completions": "for editors completing what a person types; a model "
    "writes whole lines and checks them with lsp_diagnostics",
}

#: The shell a command tool runs through when the call names none.
DEFAULT_SHELL = "bash" if shutil.which("bash") else "sh"

#: What a model reads about the tools it uses most (the table's summary and
#: notes are written for HTTP clients).  Other tools keep those.
MODEL_DESCRIPTIONS: dict[str, str] = {
    # The arguments' coercion rules are the handler's to explain when it
    # refuses one; the commands themselves are listed per caller.
    "run_command": "Run one of the template's commands: command is its name, "
    "args its own arguments by name.",
    # command's and argv's own descriptions say bash or no shell, and the
    # timeout's default is in its schema.
    "shell": "Run a command in the sandbox and wait for it: stdout, stderr, "
    "exit_code (pipes, &&, cd work).",
    "code_execute": "Run code in a context (code_context_create) to its end: "
    "its output, value, traceback and images; output arrives as progress "
    "notifications while it runs.",
    "shell_stream": "As shell, for long commands: output arrives as progress "
    "notifications while it runs.",
    "process_start": "Start a command in the background; returns its pid. Then "
    "process_output reads its output, process_stdin writes to it (start with "
    "stdin: true), process_signal stops it.",
    "process_list": "List background processes, running and recently exited.",
    "process_output": "Output of a background process after seq `after`; "
    "follow: true waits until it exits.",
    "process_stdin": "Write text to a background process started with stdin: true; "
    "eof: true closes its stdin.",
    "upload": "Write a file: content (text) or content_base64 (bytes). Parent "
    "directories are created; the file lands whole or not at all.",
    "download": "Read a file, or some lines (offset, limit); text comes as text.",
    "files_list": "List a directory (depth 1..10).",
    "files_search": "Find files whose names match a glob pattern, recursively.",
    "files_edit": "Replace old_text with new_text in a text file (read it first).",
    "files_grep": "Search files' lines for a regex (or text: fixed_strings).",
    "files_extract": "Unpack a tar.gz or zip archive (base64) into a directory.",
    "files_archive": "Pack paths into a tar.gz or zip archive (base64).",
    "lsp_diagnostics": "A file's errors and warnings from its language server "
    "(type checker, linter), as the file is on disk now.",
    "lsp_definition": "Where the name at line/column (from 1) of a file is defined.",
    "lsp_references": "Every use of the name at line/column (from 1) of a file.",
    "lsp_hover": "The type and documentation of the name at line/column (from 1).",
    "lsp_symbols": "A file's classes, functions and variables, each with its "
    "body's lines; with query, the project's symbols by name.",
    "lsp_rename": "Rename the symbol at line/column (from 1) in every file that "
    "uses it (dry_run: show the diffs only).",
    "capabilities": "A summary of what this token may do: the tools allowed and "
    "why others are refused. Name one endpoint for its full entry.",
    "capabilities_check": "Say whether a call would be allowed (and which rule "
    "decides) without making it.",
}


#: Endpoints answering with images: the field holding the base64 data, and
#: the field naming the format.
IMAGES: dict[str, tuple[str, str]] = {"browser_screenshot": ("image_base64", "type")}

#: Endpoints running a command whose answer is shown as its output.
COMMAND_RESULTS = frozenset({"shell", "code_run"})

#: Endpoints reading a file whose text content is shown as text.
FILE_READS = frozenset({"download"})

#: Streams whose output events are lines without their newline (the others
#: carry chunks as printed).
LINE_STREAMS = frozenset({"shell_stream"})

#: Output of a tool that runs a stream to completion.
STREAM_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "stdout": {"type": "string", "description": "the output lines, joined"},
        "stderr": {"type": "string"},
        "exit_code": {
            "type": ["integer", "null"],
            "description": "-N when killed by signal N",
        },
        "truncated": {
            "type": "boolean",
            "description": "output past the result cap was left out",
        },
        "error": {
            "type": "object",
            "description": "the stream's error event (a timeout): {error, type}",
        },
        "event_count": {"type": "integer", "description": "events the stream carried"},
    },
}


class ArgumentError(ValueError):
    """The arguments of a call do not match the tool's input schema."""


@attrs.frozen
class Tool:
    """One endpoint as an MCP tool."""

    endpoint: Endpoint
    schema: Schema
    query: tuple[Field, ...]
    body: tuple[Field, ...]
    path: tuple[Field, ...]
    descriptor: dict[str, Any]

    @property
    def name(self) -> str:
        """The tool name (the endpoint id)."""
        return self.endpoint.id

    @property
    def streams(self) -> bool:
        """Whether a call may answer with an event stream."""
        return self.endpoint.streaming

    def split(
        self, arguments: Mapping[str, Any]
    ) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
        """
        Check ``arguments`` and split them into the handler's path
        parameters, query (strings, as HTTP carries them) and body.

        :raises ArgumentError: an argument of the wrong type, a missing
            required one, or (unless the body is free-form) an unknown one.
        """
        if not isinstance(arguments, Mapping):
            raise ArgumentError("arguments must be an object")
        if self.name == "run_command":
            name, args = command_call(arguments)
            return {"name": name}, {}, args
        check(self.descriptor["inputSchema"], arguments)
        arguments = {
            k: byte_names(v) if k in PATH_ARGUMENTS else v for k, v in arguments.items()
        }
        path = {f.name: _query_text(arguments[f.name]) for f in self.path}
        query = {
            f.name: _query_text(arguments[f.name])
            for f in self.query
            if arguments.get(f.name) is not None
        }
        named = {f.name for f in (*self.path, *self.query)}
        body = {k: v for k, v in arguments.items() if k not in named}
        if _takes_command(self.body):
            body = _command_body(body)
        if _takes_text(self.body):
            body = _content_body(body)
        return path, query, body


#: ``run_command``'s arguments: the command's name and its own arguments
#: apart, so that a command's argument called ``name`` (the commonest there
#: is) can be given.
RUN_COMMAND_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {
            "type": "string",
            "description": "the command's name (list_commands lists them)",
        },
        "args": {
            "type": "object",
            "description": "the command's own arguments by name",
        },
    },
    "required": ["command"],
}

#: Where a caller may put a command's own arguments: never a command
#: argument's value, which is a string, number, boolean or list of strings.
_ARGS_KEYS = ("args", "arguments")


def command_call(arguments: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """
    ``run_command``'s arguments as the command's name and its own
    arguments: ``{"command", "args"}``; also the earlier shape, the name as
    ``name`` beside the command's arguments, where that is unambiguous.
    Values are passed as sent (a command's ``path`` is any text, not a
    file the ``\\xNN`` spelling applies to).

    :raises ArgumentError: no name, or a name and arguments that could be
        read two ways.
    """
    rest = dict(arguments)
    nested = [k for k in _ARGS_KEYS if isinstance(rest.get(k), Mapping)]
    if len(nested) > 1:
        raise ArgumentError("give the command's arguments once, in 'args'")
    if "command" in rest and "name" in rest and not nested:
        raise ArgumentError(
            "both 'command' and 'name' given: put the command's own arguments "
            'in \'args\', as {"command": NAME, "args": {...}}'
        )
    key = "command" if "command" in rest else "name"
    if key not in rest:
        raise ArgumentError(
            "'command' is required: the command's name, as list_commands lists it"
        )
    name = rest.pop(key)
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"'{key}' must be the command's name (a string)")
    if nested:
        args = dict(rest.pop(nested[0]))
        if rest:
            raise ArgumentError(
                f"unexpected argument {sorted(rest)[0]!r} beside "
                f"'{nested[0]}': put the command's own arguments in "
                f"'{nested[0]}'"
            )
        return name, args
    return name, rest


#: Arguments that name files: a name the file tools list with ``\xNN`` for
#: a byte that is not UTF-8 is named back the same way (a JSON string
#: cannot carry the byte; HTTP's query spells it ``%NN``).
PATH_ARGUMENTS = frozenset({"path", "paths", "source", "destination", "cwd"})

_SHOWN_BYTE = re.compile(r"\\x([89a-fA-F][0-9a-fA-F])")


def byte_names(value: Any) -> Any:
    """
    ``value`` (a path or a list of them) with each ``\\xNN`` of a byte from
    0x80 (what :func:`~sandboxd.files.walk.display_name` shows for a byte
    that is not UTF-8) as that byte, the way the files API holds it (a
    ``surrogateescape`` character).
    """
    if isinstance(value, list):
        return [byte_names(v) for v in value]
    if not isinstance(value, str) or "\\x" not in value:
        return value
    return _SHOWN_BYTE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), value)


def _takes_command(body: Iterable[Field]) -> bool:
    """A tool that runs a ``command`` (through a shell by default, or argv)."""
    return any(f.name == "command" and f.required for f in body)


def _takes_text(body: Iterable[Field]) -> bool:
    """A tool that writes a file at ``path`` from ``content_base64``."""
    names = {f.name for f in body}
    return {"path", "content_base64"} <= names


def _command_body(body: dict[str, Any]) -> dict[str, Any]:
    """
    A model's command as the endpoint takes it: ``command`` runs through
    :data:`DEFAULT_SHELL` unless ``shell`` says otherwise; ``argv`` (a
    list) runs that program with no shell.

    :raises ArgumentError: neither or both of ``command`` and ``argv``.
    """
    argv = body.pop("argv", None)
    if argv is not None:
        if body.get("command") is not None:
            raise ArgumentError(
                "give command (a shell line) or argv (a list), not both"
            )
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ArgumentError("argv must be a non-empty list of strings")
        body["command"] = shlex.join(argv)
        body.pop("shell", None)
        return body
    if body.get("command") is None:
        raise ArgumentError("missing required argument 'command' (or 'argv')")
    if body.get("shell") is None:
        body["shell"] = DEFAULT_SHELL
    return body


def _content_body(body: dict[str, Any]) -> dict[str, Any]:
    """
    A file write with ``content`` (text, written as UTF-8) or
    ``content_base64`` (bytes).

    :raises ArgumentError: neither or both given.
    """
    text = body.pop("content", None)
    if text is not None:
        if body.get("content_base64") is not None:
            raise ArgumentError("give content (text) or content_base64, not both")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise ArgumentError("content must be valid Unicode text") from None
        body["content_base64"] = base64.b64encode(data).decode("ascii")
    elif body.get("content_base64") is None:
        raise ArgumentError(
            "missing required argument 'content' (text) or 'content_base64'"
        )
    return body


def _query_text(value: Any) -> str:
    """A JSON value as a query string carries it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _loose(field: Field) -> dict[str, Any]:
    """
    A response field's schema that also accepts null: the table documents
    the value's type, and several are null until known (``exit_code``
    while running), which a client's output validation must not reject.
    """
    out = field_schema(field)
    if isinstance(out.get("type"), str):  # a nullable field already says so
        out["type"] = [out["type"], "null"]
    out.pop("enum", None)
    return out


def _input_schema(
    name: str,
    path: Iterable[Field],
    query: Iterable[Field],
    body: Iterable[Field],
    schema: Schema,
) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    body = tuple(body)
    # One of two arguments, checked by the adaptation (a JSON Schema
    # ``oneOf`` would cost every model's context more than it says).
    either = {"command"} if _takes_command(body) else set()
    if _takes_text(body):
        either.add("content_base64")
    for field in (*path, *query, *body):
        if field.name == "*" or field.name in properties:
            continue
        # minLength is the handler's to enforce (with a message saying so).
        spec = field_schema(field)
        spec.pop("minLength", None)
        if field.name in MODEL_FIELD_DOCS:
            spec["description"] = MODEL_FIELD_DOCS[field.name]
        if "type" not in spec and field.name in MODEL_FIELD_TYPES:
            spec["type"] = MODEL_FIELD_TYPES[field.name]
        if (name, field.name) in MODEL_ARGUMENT_DOCS:
            spec["description"] = MODEL_ARGUMENT_DOCS[name, field.name]
        elif "description" in spec:
            spec["description"] = mcp_wording(spec["description"])
        properties[field.name] = spec
        if field.required and field.name not in either:
            required.append(field.name)
    if _takes_command(body):
        properties["command"]["description"] = (
            f"a shell command line (run by {DEFAULT_SHELL} unless shell is given)"
        )
        if "shell" in properties:
            properties["shell"]["description"] = "the shell that runs command"
        properties["argv"] = {
            "type": "array",
            "items": {"type": "string"},
            "description": "instead of command: a program and its arguments, no shell",
        }
    if _takes_text(body):
        properties["content"] = {
            "type": "string",
            "description": "the file's text (UTF-8); or content_base64 for bytes",
        }
    properties.update(SUMMARISED.get(name, {}))
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        out["required"] = required
    out["additionalProperties"] = schema.open_body or not (properties or schema.body)
    return out


def _undescribed(schema: dict[str, Any]) -> dict[str, Any]:
    """An object schema without its properties' descriptions."""
    properties = {
        name: {k: v for k, v in spec.items() if k != "description"}
        for name, spec in schema["properties"].items()
    }
    return {**schema, "properties": properties}


def _output_schema(endpoint: Endpoint, schema: Schema) -> dict[str, Any] | None:
    if endpoint.streaming and not schema.response:
        return _undescribed(STREAM_OUTPUT)
    if not schema.response:
        return None
    properties = {f.name: _loose(f) for f in schema.response if f.name != "*"}
    for spec in properties.values():
        # What the fields mean is in the description and the answer itself;
        # the types are what a client validates.
        spec.pop("description", None)
    if endpoint.streaming:
        properties.update(
            {
                k: v
                for k, v in _undescribed(STREAM_OUTPUT)["properties"].items()
                if k not in properties
            }
        )
    return {"type": "object", "properties": properties}


def _description(endpoint: Endpoint, schema: Schema) -> str:
    """What a model reads before calling: what the tool does and how to use it."""
    model = MODEL_DESCRIPTIONS.get(endpoint.id)
    parts = [model or endpoint.summary or schema.summary or endpoint.id]
    if model is None and schema.notes:
        parts.append(schema.notes)
    if endpoint.id == "process_output" and model is None:
        parts.append(
            "With follow=true the call runs until the process exits, its new "
            "output sent as progress notifications."
        )
    elif (
        endpoint.streaming
        and "follow" not in DROPPED_ARGUMENTS.get(endpoint.id, frozenset())
        and model is None
    ):
        parts.append(
            "Runs to completion; new output is sent as progress notifications "
            "when the call carries a progressToken."
        )
    return mcp_wording(" ".join(parts))


def _starts_children(endpoint: Endpoint, schema: Schema) -> bool:
    """A tool that runs a command or code: it can change anything and reach out."""
    if endpoint.method == "GET":
        return False
    return (
        _takes_command(schema.body)
        or endpoint.id in RUNS_CODE
        or endpoint.group is CapabilityGroup.COMMANDS
    )


def _writes_content(endpoint: Endpoint, schema: Schema) -> bool:
    """A tool that writes files from content it is given (and may replace some)."""
    return endpoint.method != "GET" and any(
        f.name == "content_base64" for f in schema.body
    )


def _annotations(endpoint: Endpoint, schema: Schema) -> dict[str, Any]:
    """
    The tool's hints.  A hint at MCP's default (``readOnlyHint`` and
    ``idempotentHint`` false) is left out, as every byte of the list is a
    model's context; ``openWorldHint`` and ``destructiveHint``, whose
    defaults are true, are always said.  The title is the tool's own.
    """
    reads = (
        endpoint.method == "GET" or endpoint.id in READ_ONLY_POSTS
    ) and endpoint.id not in TAKING_READS
    runs = _starts_children(endpoint, schema)
    out: dict[str, Any] = {"openWorldHint": runs or endpoint.id in OPEN_WORLD}
    if reads:
        out["readOnlyHint"] = True
        out["idempotentHint"] = True
        return out
    out["destructiveHint"] = (
        runs or _writes_content(endpoint, schema) or endpoint.id in DESTRUCTIVE
    )
    if endpoint.method == "DELETE" or endpoint.id in IDEMPOTENT:
        out["idempotentHint"] = True
    return out


def listed_by_default(endpoint: Endpoint) -> bool:
    """
    Whether a tool is in the default ``tools/list`` (a model's context is
    small: tools it cannot use well are left to ``params.mcp_tools: all``).
    """
    return (
        endpoint.group.value not in NOT_LISTED_GROUPS and endpoint.id not in NOT_LISTED
    )


def _title(endpoint: Endpoint) -> str:
    if endpoint.id in MODEL_TITLES:
        return MODEL_TITLES[endpoint.id]
    return (endpoint.summary or endpoint.id).rstrip(".")


def _path_field(endpoint: Endpoint, name: str) -> Field:
    """
    A path parameter's field: the table's for the built-in routes; a
    template's route names its own, which mean what it says, not what the
    built-in ones of that name do (``{id}`` is no terminal session there).
    """
    if endpoint.custom:
        return Field(name, doc=f"the {{{name}}} part of {endpoint.path}")
    return PATH_PARAMS.get(name, Field(name))


def make_tool(endpoint: Endpoint) -> Tool:
    """The tool of one endpoint (whether or not it is one: see :func:`is_tool`)."""
    schema = schema_for(endpoint.id)
    path = tuple(
        attrs.evolve(_path_field(endpoint, name), required=True)
        for name in (param_name(s) for s in endpoint.segments)
        if name is not None
    )
    dropped = DROPPED_ARGUMENTS.get(endpoint.id, frozenset())
    query = tuple(
        f
        for f in schema.query
        if f.name not in dropped and f.name not in HTTP_ONLY_FIELDS
    )
    body = tuple(
        f
        for f in (schema.body if endpoint.method in ("POST", "DELETE") else ())
        if f.name not in dropped and f.name not in HTTP_ONLY_FIELDS
    )
    descriptor: dict[str, Any] = {
        "name": endpoint.id,
        "title": _title(endpoint),
        "description": _description(endpoint, schema),
        "inputSchema": (
            RUN_COMMAND_INPUT
            if endpoint.id == "run_command"
            else _input_schema(endpoint.id, path, query, body, schema)
        ),
        "annotations": _annotations(endpoint, schema),
    }
    output = _output_schema(endpoint, schema)
    if output is not None:
        descriptor["outputSchema"] = output
    return Tool(endpoint, schema, query, body, path, descriptor)


#: What MCP allows in a tool name (2025-11-25): a custom route registered
#: without ``name=`` has the id ``"GET /path"``, which is not one.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def is_tool(endpoint: Endpoint) -> bool:
    """
    Whether an endpoint is served as a tool (not the ``/v1`` door's: they
    are the agents group's routes again, in OpenAI's shapes).
    """
    return (
        _TOOL_NAME.match(endpoint.id) is not None
        and endpoint.id not in NOT_TOOLS
        and endpoint.door == "http"
        and endpoint.method not in DOOR_METHODS
        and endpoint.body != "raw"
        and endpoint.handler is not None
    )


class Toolbox:
    """The tools of one route table, built once (the table is frozen)."""

    def __init__(self, endpoints: Iterable[Endpoint]) -> None:
        self.tools: dict[str, Tool] = {
            e.id: make_tool(e) for e in endpoints if is_tool(e)
        }

    def get(self, name: str) -> Tool | None:
        """The tool of this name, or None."""
        return self.tools.get(name)


# -- the argument check ---------------------------------------------------------

_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def _type_ok(value: Any, name: str | list[str]) -> bool:
    if isinstance(name, list):
        return any(_type_ok(value, one) for one in name)
    if name == "null":
        return value is None
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _PYTHON_TYPES.get(name, (object,)))


def check(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> None:
    """
    Check arguments against the subset of JSON Schema the generated input
    schemas use (types, ``items``, ``enum``, ``required``,
    ``additionalProperties``).

    :raises ArgumentError: naming the first argument that does not match.
    """
    properties: Mapping[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if arguments.get(name) is None:
            raise ArgumentError(f"missing required argument {name!r}")
    if not schema.get("additionalProperties", True):
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            known = ", ".join(sorted(properties)) or "none"
            raise ArgumentError(
                f"unknown argument {unknown[0]!r} (this tool takes: {known})"
            )
    for name, value in arguments.items():
        spec = properties.get(name)
        if spec is None or value is None:
            continue
        wanted = spec.get("type")
        if wanted is not None and not _type_ok(value, wanted):
            kind = " or ".join(wanted) if isinstance(wanted, list) else wanted
            raise ArgumentError(f"argument {name!r} must be of type {kind}")
        if "enum" in spec and value not in spec["enum"]:
            choices = ", ".join(map(repr, spec["enum"]))
            raise ArgumentError(f"argument {name!r} must be one of {choices}")
        items = spec.get("items", {}).get("type")
        if wanted == "array" and items is not None:
            for item in value:
                if not _type_ok(item, items):
                    raise ArgumentError(
                        f"argument {name!r} must hold items of type {items}"
                    )


# -- answers too big for a model's context --------------------------------------

#: Tools whose answer is summarised for a model, and the argument that asks
#: for one endpoint's full entry instead.
SUMMARISED: dict[str, dict[str, Any]] = {
    "capabilities": {
        "endpoint": {
            "type": "string",
            "description": "an endpoint id: its full entry instead of the summary",
        }
    },
    "openapi": {
        "endpoint": {
            "type": "string",
            "description": "an endpoint id: its operation instead of the list",
        }
    },
}


#: A ``files_grep`` line longer than this is shown through MCP as this
#: many characters around its first match (a minified bundle's line would
#: cost a model thousands of tokens per call).
GREP_LINE_CHARS = 240


def grep_lines(value: dict[str, Any]) -> dict[str, Any]:
    """
    ``files_grep``'s matches (one per match, the HTTP answer) as one entry
    per matching line, with the ``columns`` of its matches; a long line
    is cut to :data:`GREP_LINE_CHARS` around its first match, ``text_column``
    saying where the text starts.
    """
    lines: list[dict[str, Any]] = []
    for match in value.get("matches") or []:
        if not isinstance(match, dict):
            continue
        last = lines[-1] if lines else None
        if (
            last is not None
            and last.get("path") == match.get("path")
            and last.get("line") == match.get("line")
        ):
            last["columns"].append(match.get("column"))
            continue
        entry = {k: v for k, v in match.items() if k != "column"}
        entry["columns"] = [match.get("column")]
        lines.append(entry)
    for entry in lines:
        text = entry.get("text")
        first = entry["columns"][0]
        if isinstance(text, str) and len(text) > GREP_LINE_CHARS:
            # The HTTP answer's text may itself be a window of the line,
            # starting at its own text_column.
            offset = entry.get("text_column", 1)
            offset = offset if isinstance(offset, int) else 1
            at = (first if isinstance(first, int) else 1) - offset
            start = max(0, at - GREP_LINE_CHARS // 4)
            entry["text"] = text[start : start + GREP_LINE_CHARS]
            entry["text_column"] = offset + start
            entry["cut"] = True
    return {**value, "matches": lines}


def summarise(name: str, value: Any, arguments: Mapping[str, Any]) -> Any:
    """
    A tool's answer cut to what a model can use: ``capabilities`` (tens of
    kB) as the allowed tools and the reasons for the others, ``openapi``
    (over 100 kB) as its list of operations; either with ``endpoint`` as
    that endpoint's entry alone.

    :raises ArgumentError: ``endpoint`` names no endpoint.
    """
    if name == "files_grep" and isinstance(value, dict):
        return grep_lines(value)
    if name not in SUMMARISED or not isinstance(value, dict):
        return value
    wanted = arguments.get("endpoint")
    if name == "capabilities":
        return _capabilities_summary(value, wanted)
    return _openapi_summary(value, wanted)


def _capabilities_summary(value: dict[str, Any], wanted: str | None) -> dict[str, Any]:
    endpoints: dict[str, Any] = value.get("endpoints") or {}
    if wanted is not None:
        if wanted not in endpoints:
            raise ArgumentError(f"no endpoint {wanted!r}")
        return {"endpoint": wanted, **endpoints[wanted]}
    allowed: list[str] = []
    refused: dict[str, str] = {}
    groups_off: dict[str, int] = {}
    enabled_groups = {
        str(info.get("group")) for info in endpoints.values() if info.get("enabled")
    }
    for endpoint_id, info in endpoints.items():
        group = str(info.get("group"))
        if info.get("allowed"):
            allowed.append(endpoint_id)
        elif group not in enabled_groups:
            groups_off[group] = groups_off.get(group, 0) + 1
        else:
            refused[endpoint_id] = str(
                info.get("reason") or info.get("rule") or "refused"
            )
    return {
        "identity": value.get("identity"),
        "policy": value.get("policy"),
        "allowed": allowed,
        "refused": refused,
        "groups_off": groups_off,
        "more": "name an endpoint for its full entry (limits, paths, params)",
    }


def _openapi_summary(value: dict[str, Any], wanted: str | None) -> dict[str, Any]:
    """
    The operations this caller's policy has on (the others only counted:
    a model cannot call them, and every opt-in group would cost it tokens).
    """
    operations: list[dict[str, Any]] = []
    off = 0
    for path, item in (value.get("paths") or {}).items():
        for method, op in item.items():
            if not isinstance(op, dict) or "operationId" not in op:
                continue
            if wanted is not None and op["operationId"] == wanted:
                return {"path": path, "method": method.upper(), "operation": op}
            if op.get("x-sandboxd-enabled") is False:
                off += 1
                continue
            operations.append(
                {
                    "id": op["operationId"],
                    "method": method.upper(),
                    "path": path,
                    "summary": op.get("summary", ""),
                }
            )
    if wanted is not None:
        raise ArgumentError(f"no endpoint {wanted!r}")
    return {
        "openapi": value.get("openapi"),
        "operations": operations,
        "disabled": off,
        "more": "name an endpoint for its operation (parameters, body, responses);"
        " capabilities says why the disabled ones are off",
    }
