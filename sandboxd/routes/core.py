# -*- test-case-name: tests.policy.test_http -*-
"""The ``core`` group (SPEC §7.1): health, discovery, OpenAPI."""

from __future__ import annotations

from typing import Any

from sandboxd.policy import discovery
from sandboxd.web.messages import ServerRequest, ServerResponse

_HEALTH = ServerResponse(
    200, raw=b'{"status":"ok"}', headers={"content-type": "application/json"}
)


def health(request: ServerRequest) -> ServerResponse:
    """``GET /health``: always 200 ``{"status": "ok"}``."""
    return _HEALTH


def capabilities(request: ServerRequest) -> dict[str, Any]:
    """``GET /capabilities`` for the calling identity."""
    return discovery.capabilities(request.context, request.identity)


def capabilities_check(request: ServerRequest) -> dict[str, Any]:
    """``POST /capabilities/check``: decide without doing."""
    return discovery.check(request.context, request.identity, request.body)


def openapi_json(request: ServerRequest) -> dict[str, Any]:
    """``GET /openapi.json``."""
    # Imported on first use: the field schemas behind it are a large table
    # that an idle daemon need not hold.
    from sandboxd.api import openapi

    return openapi.document(request.context.table, request.context.policy)


HANDLERS = {
    "health": health,
    "capabilities": capabilities,
    "capabilities_check": capabilities_check,
    "openapi": openapi_json,
}
