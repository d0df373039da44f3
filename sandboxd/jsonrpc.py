# -*- test-case-name: tests.test_jsonrpc -*-
"""
JSON-RPC 2.0 messages: the error codes and the four message shapes.

Two parts of the daemon speak it with the same message semantics over
different transports: the MCP door answers requests read from HTTP bodies
(:mod:`sandboxd.mcp.protocol`), and the agents engine is a peer of a
coding agent over its stdio (:mod:`sandboxd.agents.connection`).  Each
keeps its transport and its protocol's own codes; what a message is lives
here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandboxd.errors import ApiError, not_json
from sandboxd.web.jsonbody import json_bytes

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
#: MCP and ACP alike: the resource (a file, a URI) does not exist.
RESOURCE_NOT_FOUND = -32002
#: LSP's code, which ACP uses for a request the caller cancelled.
REQUEST_CANCELLED = -32800

Message = dict[str, Any]


class RpcError(Exception):
    """A JSON-RPC error, received from a peer or to be sent to one."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def as_json(self) -> dict[str, Any]:
        """The ``error`` member of a response."""
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            out["data"] = self.data
        return out


def request(request_id: Any, method: str, params: Any) -> Message:
    """A JSON-RPC request."""
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def notification(method: str, params: Mapping[str, Any] | None = None) -> Message:
    """A JSON-RPC notification (``params`` left out when None)."""
    out: Message = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        out["params"] = dict(params)
    return out


def result(request_id: Any, value: Any) -> Message:
    """A JSON-RPC result response."""
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def error(request_id: Any, code: int, message: str, data: Any = None) -> Message:
    """A JSON-RPC error response."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": RpcError(code, message, data).as_json(),
    }


def encode(message: Any) -> bytes:
    """
    ``message`` as compact JSON, UTF-8 (:func:`~sandboxd.web.jsonbody.json_bytes`:
    a lone surrogate, from a file name that is not UTF-8, as a ``\\u``
    escape).  A message JSON cannot carry (a non-finite number in a result)
    is replaced by an internal error for the same id, so whatever is sent is
    JSON and answers the request.
    """
    try:
        return json_bytes(message)
    except ApiError:
        rid = message.get("id") if isinstance(message, dict) else None
        failure = not_json(message, "the message")
        return json_bytes(error(rid, INTERNAL_ERROR, failure.message, failure.body()))


def request_key(request_id: Any) -> str:
    """A dict key telling ``1`` and ``"1"`` apart, as JSON-RPC does."""
    return f"{type(request_id).__name__}:{request_id}"
