"""``/openapi.json``: an OpenAPI 3.1 document generated from the endpoint table."""

from __future__ import annotations

from typing import Any

from sandboxd._version import __version__
from sandboxd.endpoints import param_name

_ERROR = {
    "type": "object",
    "required": ["error", "type"],
    "properties": {
        "error": {"type": "string"},
        "type": {"type": "string"},
        "code": {"type": "string"},
        "rule": {"type": "string"},
        "endpoint": {"type": "string"},
        "scope": {"type": "string"},
        "limit": {"type": "integer"},
        "retry_after": {"type": "integer"},
    },
}


def _operation(endpoint: Any, rule: Any) -> dict[str, Any]:
    params = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in (param_name(s) for s in endpoint.segments)
        if name
    ]
    ok: dict[str, Any] = {"description": "Success"}
    if endpoint.streaming:
        ok["content"] = {"text/event-stream": {"schema": {"type": "string"}}}
    elif endpoint.id == "files_read_raw":
        ok["content"] = {
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}
            }
        }
    else:
        ok["content"] = {"application/json": {"schema": {"type": "object"}}}
    op: dict[str, Any] = {
        "operationId": endpoint.id,
        "summary": endpoint.summary,
        "tags": [endpoint.group.value],
        "parameters": params,
        "responses": {
            "200": ok,
            "default": {
                "description": "Error",
                "content": {
                    "application/json": {
                        "schema": {"$ref": "#/components/schemas/Error"}
                    }
                },
            },
        },
        "x-sandboxd-enabled": rule.enabled,
        "x-sandboxd-scopes": list(rule.scopes),
        "x-sandboxd-streaming": endpoint.streaming,
    }
    if not rule.enabled:
        op["x-sandboxd-reason"] = rule.reason
    if endpoint.auth_required:
        op["security"] = [{"accessToken": []}, {"bearer": []}]
    else:
        op["security"] = []
    if endpoint.method in ("POST", "DELETE") and endpoint.body != "none":
        media = (
            "application/octet-stream" if endpoint.body == "raw" else "application/json"
        )
        op["requestBody"] = {
            "required": False,
            "content": {
                media: {
                    "schema": {"type": "object"}
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
        if endpoint.method == "WS":
            continue
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(
            endpoint, policy.rules[endpoint.id]
        )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sandboxd",
            "version": __version__,
            "description": "The in-sandbox control daemon. The PTY WebSocket lives on a second port: ws://HOST:PTY_PORT/pty?session_id=ID.",
        },
        "paths": paths,
        "components": {
            "schemas": {"Error": _ERROR},
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
