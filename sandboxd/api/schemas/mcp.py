"""What the endpoints of the MCP door take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, F, Schema

SCHEMAS: dict[str, Schema] = {
    "mcp": Schema(
        summary="MCP Streamable HTTP",
        headers=(
            F("Mcp-Session-Id", doc="the session, from the initialize answer"),
            F("MCP-Protocol-Version", doc="2025-06-18 or 2025-11-25"),
            F("Last-Event-ID", doc="GET: resume a lost stream after this event"),
        ),
        body=(
            F("jsonrpc", required=True, example="2.0"),
            F("id", "any", "a request's id (none for a notification)", example=1),
            F("method", required=True, example="initialize"),
            F(
                "params",
                "object",
                "the method's parameters",
                example={
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "curl", "version": "1"},
                },
            ),
        ),
        response=(
            F("jsonrpc"),
            F("id", "any"),
            F("result", "object", "or error: {code, message, data}"),
        ),
        produces="json",
        errors=(
            E(400, "invalid_param", "not one JSON-RPC message, or no session id"),
            E(404, "not_found", "unknown or expired session (JSON-RPC -32001)"),
            E(413, "payload_too_large", "a message over max_request_bytes"),
            E(
                429,
                "too_many_sessions",
                "limits.max_sessions sessions are open (or the identity's "
                "share); Retry-After when one without a call or connection "
                "will make room",
            ),
        ),
        notes="One JSON-RPC 2.0 message per POST, answered as JSON or as an SSE "
        "stream; GET opens the session's server stream, DELETE ends the session. "
        "Every tools/call is governed and audited as the endpoint it calls. "
        "See docs/mcp.md.",
    ),
}
