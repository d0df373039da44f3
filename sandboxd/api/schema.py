"""
What each endpoint takes and gives: query parameters, body fields,
response fields and the errors particular to it, keyed by endpoint id.

The endpoint table (:mod:`sandboxd.endpoints`) says who may call what; this
module says what a call looks like, so that ``/openapi.json``
(:mod:`sandboxd.api.openapi`) and the API reference (:mod:`sandboxd.api.apidoc`,
``docs/api.md``) describe the same request and response.  It is written
from SPEC §7, §8, §9 and §15 and checked against the handlers by
``tests/api/test_docs.py`` (every name a handler reads must be declared here).

Each group's schemas live in :mod:`sandboxd.api.schemas`; this module
joins them.

Errors every endpoint can give (authentication, policy gate, header and
body checks of the request pipeline) are :data:`COMMON_ERRORS`; an
endpoint's own list holds only what its handler adds.
"""

from __future__ import annotations

from sandboxd.api.fields import E, ErrorCase, Event, F, Field, Schema
from sandboxd.api.schemas import (
    agents,
    browser,
    code_contexts,
    commands,
    console,
    core,
    devtools,
    e2b,
    files,
    git,
    kep,
    links,
    lsp,
    mcp,
    openai,
    preview,
    processes,
    system,
    terminals,
)

__all__ = [
    "BODY_ERRORS",
    "COMMON_ERRORS",
    "PATH_PARAMS",
    "SCHEMAS",
    "ErrorCase",
    "Event",
    "Field",
    "Schema",
    "declared_names",
    "schema_for",
]

#: Path parameters by name (they are always required and one segment).
PATH_PARAMS: dict[str, Field] = {
    "name": F("name", doc="the command's name", example="hello"),
    "pid": F("pid", "integer", "a managed process's pid", example="$PID", minimum=1),
    "id": F("id", doc="a terminal session id", example="$SESSION"),
    "upload_id": F("upload_id", doc="a resumable upload's id", example="$UPLOAD"),
    "agent": F("agent", doc="a catalogue id (claude, codex, ...)", example="claude"),
    "sid": F("sid", doc="an agent session id", example="$SID"),
    "turn_id": F("turn_id", doc="a turn id", example="$TURN"),
    "request_id": F("request_id", doc="a held request id", example="$REQUEST"),
    "tool_call_id": F("tool_call_id", doc="a tool call id", example="$TOOL_CALL"),
    "terminal_id": F("terminal_id", doc="an agent terminal id", example="$TERMINAL"),
    "link_id": F("link_id", doc="a capability link's id", example="$LINK"),
    "port": F("port", "integer", "an exposed port", example=3000, minimum=1),
    "job_id": F("job_id", doc="a git job id", example="$JOB"),
    "cid": F("cid", doc="a code context id", example="$CONTEXT"),
    "xid": F("xid", doc="an execution id", example="$EXECUTION"),
    "oid": F("oid", doc="a spilled output id", example="$OUTPUT"),
    "lid": F("lid", doc="a language server session id", example="$LSP_SESSION"),
    # The /v1 door (SPEC §26).
    "session_id": F(
        "session_id", doc="an agent session id (agsess_...)", example="$AGSESS"
    ),
    "response_id": F("response_id", doc="a response id (resp_...)", example="$RESP"),
    "model": F("model", doc="a catalogue id as a model", example="claude"),
    "environment_id": F("environment_id", doc="an environment id", example="env_x"),
    "agent_id": F(
        "agent_id", doc="an agent definition id (agent_...)", example="$AGENT"
    ),
    "file_id": F("file_id", doc="a stored file id (file-...)", example="$FILE"),
    "vault_id": F("vault_id", doc="a vault id (vlt_...)", example="$VAULT"),
    "credential_id": F(
        "credential_id", doc="a credential id (cred_...)", example="$CREDENTIAL"
    ),
    "template_id": F(
        "template_id", doc="an environment template id (envtmpl_...)", example="$TMPL"
    ),
    "release": F("release", doc="the console's assets version (the page names it)"),
    "asset": F("asset", doc="a console asset's file name", example="app.js"),
}

#: Errors any endpoint can give, decided before its handler runs (SPEC §3-§6).
COMMON_ERRORS: tuple[ErrorCase, ...] = (
    E(400, "malformed_request", "HTTP framing refused (Content-Length, obs-fold, ...)"),
    E(400, "invalid_path", "the request path holds %2F, %00, empty or dot segments"),
    E(400, "duplicate_parameter", "a query parameter is given twice"),
    E(400, "transfer_encoding_not_allowed", "any Transfer-Encoding request header"),
    E(400, "ambiguous_credentials", "two different tokens are presented"),
    E(401, "unauthorized", "a token is required and is missing or wrong", "AuthError"),
    E(403, "missing_scope", "the token lacks a scope the endpoint needs"),
    E(403, "origin_not_allowed", "an Origin header not in allowed_origins"),
    E(403, "host_not_allowed", "local mode and a Host that is not loopback"),
    E(404, "endpoint_disabled", "the policy switched the endpoint off (see rule)"),
    E(429, "rate_limited", "over rate_per_minute (retry_after, Retry-After)"),
    E(429, "concurrency_limited", "over max_concurrency requests in flight"),
    E(500, "internal", "the handler failed (a message, never a traceback)"),
)

#: Further errors of every endpoint with a JSON body (POST, DELETE).
BODY_ERRORS: tuple[ErrorCase, ...] = (
    E(
        400,
        "invalid_json",
        "the body is not UTF-8 JSON, not an object, or holds a lone surrogate",
    ),
    E(413, "payload_too_large", "the body is over max_request_bytes"),
)


SCHEMAS: dict[str, Schema] = {
    **core.SCHEMAS,
    **commands.SCHEMAS,
    **files.SCHEMAS,
    **processes.SCHEMAS,
    **terminals.SCHEMAS,
    **e2b.SCHEMAS,
    **kep.SCHEMAS,
    **system.SCHEMAS,
    **devtools.SCHEMAS,
    **git.SCHEMAS,
    **browser.SCHEMAS,
    **code_contexts.SCHEMAS,
    **lsp.SCHEMAS,
    **agents.SCHEMAS,
    **openai.SCHEMAS,
    **mcp.SCHEMAS,
    **links.SCHEMAS,
    **preview.SCHEMAS,
    **console.SCHEMAS,
}


def schema_for(endpoint_id: str) -> Schema:
    """The schema of an endpoint; an empty one for ids this module does not
    know (custom routes), so callers never need a special case."""
    return SCHEMAS.get(endpoint_id, Schema())


def declared_names(endpoint_id: str) -> set[str]:
    """Every query and body field name declared for an endpoint."""
    schema = schema_for(endpoint_id)
    return {f.name for f in schema.query} | {f.name for f in schema.body}
