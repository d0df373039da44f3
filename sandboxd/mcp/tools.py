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

import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from sandboxd.api.openapi import field_schema
from sandboxd.api.schema import PATH_PARAMS, Field, Schema, schema_for
from sandboxd.endpoints import DOOR_METHODS, Endpoint, param_name

#: Endpoints that are not tools, and why (``docs/mcp.md`` has the same table).
NOT_TOOLS: dict[str, str] = {
    "mcp": "the MCP door itself",
    "e2b": "the E2B door itself, on a port of its own",
    "pty_connect": "an interactive WebSocket byte stream, not one call; use "
    "shell, shell_stream or process_start with process_stdin",
    "files_read_raw": "raw binary response body; use download (base64) or "
    "the file:/// resource",
    "files_write_raw": "raw binary request body; use upload or "
    "files_upload_stream (base64)",
    "files_uploads_create": "a resumable upload is carried on by raw-body "
    "appends; use upload or files_upload_stream (base64)",
    "files_uploads_get": "part of a resumable raw upload (files_uploads_create)",
    "files_uploads_append": "raw binary request body; use upload or "
    "files_upload_stream (base64)",
    "files_uploads_delete": "part of a resumable raw upload (files_uploads_create)",
    "files_download_stream": "the same answer as download, streamed for "
    "HTTP clients; an MCP result is one message anyway",
    "files_watch": "an endless change stream with no end to run to",
}

#: Query fields dropped from a tool's input, because MCP cannot use them:
#: the follow mode of streams that never end on their own.
DROPPED_ARGUMENTS: dict[str, frozenset[str]] = {
    "agents_events": frozenset({"follow"}),
    "agents_terminal_output": frozenset({"follow"}),
}

#: Endpoints that change or remove what exists (``destructiveHint``).
DESTRUCTIVE = frozenset(
    {
        "files_delete",
        "files_move",
        "process_signal",
        "env_set",
        "pty_delete_session",
        "agents_session_delete",
        "agents_terminal_kill",
    }
)

#: Non-GET endpoints that can be repeated with no further effect.
IDEMPOTENT = frozenset(
    {"files_mkdir", "files_delete", "env_set", "pty_resize", "pty_delete_session"}
)

#: Endpoints that reach outside the sandbox (``openWorldHint``).
OPEN_WORLD = frozenset({"browser_navigate"})

#: Endpoints answering with images: the field holding the base64 data, and
#: the field naming the format.
IMAGES: dict[str, tuple[str, str]] = {"browser_screenshot": ("image_base64", "type")}

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
        check(self.descriptor["inputSchema"], arguments)
        path = {f.name: _query_text(arguments[f.name]) for f in self.path}
        query = {
            f.name: _query_text(arguments[f.name])
            for f in self.query
            if arguments.get(f.name) is not None
        }
        named = {f.name for f in (*self.path, *self.query)}
        body = {k: v for k, v in arguments.items() if k not in named}
        return path, query, body


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
    path: Iterable[Field], query: Iterable[Field], body: Iterable[Field], schema: Schema
) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in (*path, *query, *body):
        if field.name == "*" or field.name in properties:
            continue
        properties[field.name] = field_schema(field)
        if field.required:
            required.append(field.name)
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        out["required"] = required
    out["additionalProperties"] = schema.open_body or not (properties or schema.body)
    return out


def _output_schema(endpoint: Endpoint, schema: Schema) -> dict[str, Any] | None:
    if endpoint.streaming and not schema.response:
        return STREAM_OUTPUT
    if not schema.response:
        return None
    properties = {f.name: _loose(f) for f in schema.response if f.name != "*"}
    if endpoint.streaming:
        properties.update(
            {
                k: v
                for k, v in STREAM_OUTPUT["properties"].items()
                if k not in properties
            }
        )
    return {"type": "object", "properties": properties}


def _description(endpoint: Endpoint, schema: Schema) -> str:
    parts = [endpoint.summary or schema.summary or endpoint.id]
    if schema.notes:
        parts.append(schema.notes)
    if endpoint.id == "process_output":
        parts.append(
            "With follow=true the call runs until the process exits, its new "
            "output sent as progress notifications."
        )
    elif endpoint.streaming and endpoint.id not in DROPPED_ARGUMENTS:
        parts.append(
            "Runs to completion; new output is sent as progress notifications "
            "when the call carries a progressToken."
        )
    scopes = ", ".join(endpoint.scopes) or "none"
    parts.append(
        f"(sandboxd endpoint {endpoint.method} {endpoint.path}; scopes: {scopes})"
    )
    return " ".join(parts)


def _annotations(endpoint: Endpoint) -> dict[str, Any]:
    reads = endpoint.method == "GET"
    out: dict[str, Any] = {
        "title": _title(endpoint),
        "readOnlyHint": reads,
        "openWorldHint": endpoint.id in OPEN_WORLD,
    }
    if not reads:
        out["destructiveHint"] = endpoint.id in DESTRUCTIVE
        out["idempotentHint"] = endpoint.method == "DELETE" or endpoint.id in IDEMPOTENT
    else:
        out["idempotentHint"] = True
    return out


def _title(endpoint: Endpoint) -> str:
    return (endpoint.summary or endpoint.id).rstrip(".")


def make_tool(endpoint: Endpoint) -> Tool:
    """The tool of one endpoint (whether or not it is one: see :func:`is_tool`)."""
    schema = schema_for(endpoint.id)
    path = tuple(
        attrs.evolve(PATH_PARAMS.get(name, Field(name)), required=True)
        for name in (param_name(s) for s in endpoint.segments)
        if name is not None
    )
    dropped = DROPPED_ARGUMENTS.get(endpoint.id, frozenset())
    query = tuple(f for f in schema.query if f.name not in dropped)
    body = schema.body if endpoint.method in ("POST", "DELETE") else ()
    descriptor: dict[str, Any] = {
        "name": endpoint.id,
        "title": _title(endpoint),
        "description": _description(endpoint, schema),
        "inputSchema": _input_schema(path, query, body, schema),
        "annotations": _annotations(endpoint),
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


def _type_ok(value: Any, name: str) -> bool:
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
            raise ArgumentError(f"argument {name!r} must be of type {wanted}")
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
