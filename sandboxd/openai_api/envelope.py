# -*- test-case-name: tests.openai_api.test_sessions -*-
"""
OpenAI's error envelope for the ``/v1`` door.

The OpenAI SDK reads ``{"error": {"message", "type", "param", "code"}}`` and
retries 408, 409, 429 and every 5xx unless the answer says
``x-should-retry: false``; a refusal that will not change on a retry says
so, or the SDK would repeat (and for a create, redo) the call.
"""

from __future__ import annotations

from typing import Any

from sandboxd.errors import ApiError, Code

#: The header every answer of the door's handlers carries, their errors,
#: streams and the WebSocket's 101 included (not the gate's refusals), as
#: agent-sandbox-server's do: a client can tell the local door from OpenAI.
LOCAL_HEADER = "X-Agent-Sandbox-Local"

#: OpenAI's ``type`` for each status (anything else is ``server_error``).
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}

#: Codes worth retrying: the caller was only early (so is any answer that
#: names a ``Retry-After``).
_RETRYABLE = frozenset({Code.RATE_LIMITED, Code.CONCURRENCY_LIMITED})


def error_type(status: int) -> str:
    """OpenAI's ``error.type`` for an HTTP status."""
    return _TYPES.get(status, "server_error")


def openai_error(error: ApiError) -> tuple[dict[str, Any], dict[str, str]]:
    """
    The envelope and headers of ``error``: the SPEC §6 code in ``code``,
    the field at fault (if the handler named one) in ``param``, the rule
    that decided a refusal kept beside them.
    """
    inner: dict[str, Any] = {
        "message": error.message,
        "type": error_type(error.status),
        "param": error.extra.get("param"),
        "code": str(error.code) if error.code is not None else None,
    }
    for key, value in error.extra.items():
        if key != "param":
            inner.setdefault(key, value)
    headers = dict(error.headers)
    retryable = error.code in _RETRYABLE or "Retry-After" in headers
    headers["x-should-retry"] = "true" if retryable else "false"
    return {"error": inner}, headers


def frame_error(message: str, code: str) -> dict[str, Any]:
    """
    The ``error`` of a Responses WebSocket event whose code is the seed's
    or OpenAI's own for the socket, not a §6 one (``bad_frame``, a steer's
    ``response_not_found``): a 400, as OpenAI types it.
    """
    return {"message": message, "type": error_type(400), "param": None, "code": code}


def socket_event(type: str, error: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """
    A Responses WebSocket event that carries an error: ``error`` (with
    the ``status`` the HTTP route would have answered) or
    ``response.steer.failed`` (with the steer it refuses).
    """
    return {"type": type, **fields, "error": error}


def stream_error(error: ApiError) -> dict[str, Any]:
    """
    The data of the ``error`` event that ends a ``/v1`` stream from the
    server side (a revoked link, a reload that took the caller's access
    away): OpenAI's error event (``type``, ``code``, ``message``,
    ``param``), with the envelope's ``error`` object, which the SDK raises
    as an ``APIError`` carrying the code, so a client can tell a credential
    that is gone for good from a transient failure.
    """
    inner = openai_error(error)[0]["error"]
    return {
        "type": "error",
        "code": inner["code"],
        "message": inner["message"],
        "param": inner["param"],
        "error": inner,
    }


def stream_error_frame(error: ApiError) -> bytes:
    """:func:`stream_error` as an SSE ``error`` frame."""
    from sandboxd.web.sse import frame

    return frame("error", stream_error(error))
