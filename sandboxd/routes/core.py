# -*- test-case-name: tests.policy.test_http -*-
"""The ``core`` group (SPEC §7.1): health, discovery, OpenAPI."""

from __future__ import annotations

from typing import Any

from sandboxd.errors import unavailable
from sandboxd.policy import discovery
from sandboxd.web.jsonbody import json_bytes
from sandboxd.web.messages import ServerRequest, ServerResponse

_HEALTH = ServerResponse(
    200, raw=b'{"status":"ok"}', headers={"content-type": "application/json"}
)


def health(request: ServerRequest) -> ServerResponse:
    """
    ``GET /health``: 200 ``{"status": "ok"}``; 503 once the daemon is
    stopping, for a prober on a connection it opened before the stop (new
    connections are refused then), so it takes the daemon out of rotation.
    """
    if request.context.draining:
        raise unavailable("the daemon is shutting down")
    return _HEALTH


def capabilities(request: ServerRequest) -> dict[str, Any]:
    """``GET /capabilities`` for the calling identity."""
    return discovery.capabilities(request.context, request.identity)


def capabilities_check(request: ServerRequest) -> dict[str, Any]:
    """``POST /capabilities/check``: decide without doing."""
    return discovery.check(request.context, request.identity, request.body)


#: The last OpenAPI document answered, with the endpoint table and the
#: policy it was made for: a policy reload puts a new policy in force, and
#: the next call makes the document again.
_OPENAPI: list[tuple[Any, Any, ServerResponse]] = []


def openapi_json(request: ServerRequest) -> ServerResponse:
    """``GET /openapi.json``: made once per policy in force, then sent as it is."""
    table, policy = request.context.table, request.context.policy
    for made_for_table, made_for_policy, answer in _OPENAPI:
        if made_for_table is table and made_for_policy is policy:
            return answer
    # Imported on first use: the field schemas behind it are a large table
    # that an idle daemon need not hold.
    from sandboxd.api import openapi

    document = openapi.document(table, policy)
    answer = ServerResponse(
        200,
        body=document,
        raw=json_bytes(document),
        headers={"content-type": "application/json"},
    )
    _OPENAPI[:] = [(table, policy, answer)]
    return answer


HANDLERS = {
    "health": health,
    "capabilities": capabilities,
    "capabilities_check": capabilities_check,
    "openapi": openapi_json,
}
