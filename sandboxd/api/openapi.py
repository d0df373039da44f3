# -*- test-case-name: tests.api.test_docs -*-
"""``/openapi.json``: an OpenAPI 3.1 document generated from the endpoint table."""

from __future__ import annotations

from typing import Any

import attrs

from sandboxd._version import __version__
from sandboxd.access.gate import needs_credential
from sandboxd.api.schema import PATH_PARAMS, Field, Schema, schema_for
from sandboxd.endpoints import DOOR_METHODS, param_name
from sandboxd.errors import Code

#: Every error carries one of SPEC §6's codes.
_ERROR = {
    "type": "object",
    "required": ["error", "type", "code"],
    "properties": {
        "error": {"type": "string"},
        "type": {"type": "string"},
        "code": {"type": "string", "enum": sorted(str(c) for c in Code)},
        "rule": {"type": "string"},
        "endpoint": {"type": "string"},
        "scope": {"type": "string"},
        "limit": {"type": "integer"},
        "retry_after": {"type": "integer"},
    },
}

#: The ``/v1`` door's errors: OpenAI's envelope, the same codes inside.
_OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {
                    "type": ["string", "null"],
                    "enum": [*sorted(str(c) for c in Code), None],
                },
            },
        }
    },
}


def _error_ref(endpoint: Any) -> dict[str, Any]:
    """The error schema of an endpoint's door."""
    name = "OpenAIError" if endpoint.door == "openai" else "Error"
    return {"$ref": f"#/components/schemas/{name}"}


def _field_schema(field: Field) -> dict[str, Any]:
    """The JSON Schema of one declared field."""
    out: dict[str, Any] = {}
    if field.type != "any":
        out["type"] = [field.type, "null"] if field.nullable else field.type
    if field.type == "array" and field.items and field.items != "any":
        out["items"] = {"type": field.items}
        if field.min_length is not None and field.items == "string":
            out["items"]["minLength"] = field.min_length
    if field.doc:
        out["description"] = field.doc
    if field.enum:
        out["enum"] = [*field.enum, None] if field.nullable else list(field.enum)
    if field.default is not None:
        out["default"] = field.default
    if field.min_length is not None and field.type == "string":
        out["minLength"] = field.min_length
    if field.min_items is not None:
        out["minItems"] = field.min_items
    if field.minimum is not None:
        out["minimum"] = field.minimum
    if field.maximum is not None:
        out["maximum"] = field.maximum
    return out


def _object_schema(
    fields: tuple[Field, ...], open_body: bool = False, request: bool = False
) -> dict[str, Any]:
    """
    An object schema from declared fields (free-form when none are).

    In a request body an optional field may also be ``null``: handlers
    read it as not given (``body.get(name)``), and saying so keeps strict
    clients that send ``null`` for "unset" within the schema.
    """
    named = [f for f in fields if f.name != "*"]
    if not named:
        return {"type": "object"}
    out: dict[str, Any] = {
        "type": "object",
        "properties": {
            f.name: _field_schema(
                attrs.evolve(f, nullable=True) if request and not f.required else f
            )
            for f in named
        },
    }
    required = [f.name for f in named if f.required]
    if required:
        out["required"] = required
    if open_body:
        out["additionalProperties"] = True
    return out


#: The JSON Schema of one declared field (the MCP door's tools use it too).
field_schema = _field_schema


def _parameters(endpoint: Any, schema: Schema) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = []
    for name in (param_name(s) for s in endpoint.segments):
        if name:
            field = PATH_PARAMS.get(name, Field(name))
            params.append(
                {
                    "name": name,
                    "in": "path",
                    "required": True,
                    "description": field.doc,
                    # One segment: a string, or an integer (a pid) as declared.
                    "schema": _field_schema(attrs.evolve(field, doc="", example=None))
                    if field.type == "integer"
                    else {"type": "string", "minLength": 1},
                }
            )
    for field in schema.query:
        params.append(
            {
                "name": field.name,
                "in": "query",
                "required": field.required,
                "description": field.doc,
                "schema": _field_schema(field),
            }
        )
    for field in schema.headers:
        params.append(
            {
                "name": field.name,
                "in": "header",
                "required": False,
                "description": field.doc,
                "schema": _field_schema(attrs.evolve(field, doc="")),
            }
        )
    return params


def _error_responses(schema: Schema, endpoint: Any) -> dict[str, Any]:
    """One response per status the endpoint's own errors use, codes listed."""
    by_status: dict[int, list[str]] = {}
    for error in schema.errors:
        by_status.setdefault(error.status, []).append(f"{error.code}: {error.when}")
    return {
        str(status): {
            "description": "; ".join(lines),
            "content": {"application/json": {"schema": _error_ref(endpoint)}},
        }
        for status, lines in sorted(by_status.items())
    }


def _operation(endpoint: Any, rule: Any) -> dict[str, Any]:
    schema = schema_for(endpoint.id)
    params = _parameters(endpoint, schema)
    ok: dict[str, Any] = {"description": "Success"}
    json_body = {"application/json": {"schema": _object_schema(schema.response)}}
    if schema.produces == "binary" or endpoint.id == "files_read_raw":
        ok["content"] = {
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}
            }
        }
    elif schema.produces == "prometheus":
        ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
    elif schema.produces == "sse" or (endpoint.streaming and not schema.response):
        ok["content"] = {"text/event-stream": {"schema": {"type": "string"}}}
    elif endpoint.streaming:
        ok["content"] = {
            **json_body,
            "text/event-stream": {"schema": {"type": "string"}},
        }
    else:
        ok["content"] = json_body
    if schema.events:
        ok["x-sandboxd-events"] = {e.name: e.data for e in schema.events}
    op: dict[str, Any] = {
        "operationId": endpoint.id,
        "summary": endpoint.summary,
        "tags": [endpoint.group.value],
        "parameters": params,
        "responses": {
            str(schema.status): ok,
            **_error_responses(schema, endpoint),
            "default": {
                "description": "Error",
                "content": {"application/json": {"schema": _error_ref(endpoint)}},
            },
        },
        "x-sandboxd-enabled": rule.enabled,
        "x-sandboxd-scopes": list(rule.scopes),
        "x-sandboxd-streaming": endpoint.streaming,
    }
    if schema.notes:
        op["description"] = schema.notes
    if not rule.enabled:
        op["x-sandboxd-reason"] = rule.reason
    # As the gate decides it: a route registered without auth that the
    # policy gives scopes asks for a credential too.
    if needs_credential(endpoint, rule):
        op["security"] = [{"accessToken": []}, {"bearer": []}]
    else:
        op["security"] = []
    if endpoint.method in ("POST", "DELETE") and endpoint.body != "none":
        media = (
            "application/octet-stream" if endpoint.body == "raw" else "application/json"
        )
        op["requestBody"] = {
            # An empty body is {}: it is required only when a field is.
            "required": any(f.required for f in schema.body),
            "content": {
                media: {
                    "schema": _object_schema(schema.body, schema.open_body, True)
                    if endpoint.body == "json"
                    else {"type": "string", "format": "binary"}
                }
            },
        }
    return op


def document(table: Any, policy: Any) -> dict[str, Any]:
    """The OpenAPI document for every endpoint, enabled or not."""
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in table:
        if endpoint.method in DOOR_METHODS:
            continue
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(
            endpoint, policy.rules[endpoint.id]
        )
    check = paths.get("/capabilities/check", {}).get("post")
    if check is not None:
        # The endpoint ids are the table's, known only here.  Examples, not
        # an enum: any other id is a valid question too, answered allowed:
        # false with code unknown_endpoint (as agent-sandbox-server does).
        body = check["requestBody"]["content"]["application/json"]["schema"]
        body["properties"]["endpoint"]["examples"] = [e.id for e in table]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sandboxd",
            "version": __version__,
            "description": "The in-sandbox control daemon. The PTY WebSocket lives on a second port: ws://HOST:PTY_PORT/pty?session_id=ID.",
        },
        "paths": paths,
        "components": {
            "schemas": {"Error": _ERROR, "OpenAIError": _OPENAI_ERROR},
            "securitySchemes": {
                "accessToken": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-Access-Token",
                },
                "bearer": {"type": "http", "scheme": "bearer"},
            },
        },
    }
