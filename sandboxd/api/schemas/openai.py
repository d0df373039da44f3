"""What the endpoints of the OpenAI-compatible /v1 door over the agents engine take and give."""

from __future__ import annotations

import attrs

from sandboxd.api.fields import E, Event, F, Schema
from sandboxd.api.fragments import GAP, WEBSOCKET_HANDSHAKE

# The /v1 door's shared pieces (SPEC §26).
_IDEMPOTENCY = F(
    "Idempotency-Key", doc="the same key and body answer the first result again"
)
_ADAPTER_HEADER = F(
    "X-ABX-Adapter", doc="the agent that runs, over adapter, runtime and model"
)
_ADAPTER = (
    F(
        "adapter",
        doc="the agent that runs (a catalogue id or an agent-sandbox-server runtime name)",
    ),
    F("runtime", doc="the same as adapter"),
)


_OA_PAGE = (
    F("limit", "integer", "1-100", default=20),
    F("order", enum=("asc", "desc"), default="desc"),
    F("after", doc="an object id to page after"),
)


_OA_LIST = (
    F("object"),
    F("data", "array", items="object"),
    F("first_id", nullable=True),
    F("last_id", nullable=True),
    F("has_more", "boolean"),
)


_OA_SESSION = (
    F("id"),
    F("object", doc="agent.session"),
    F("agent", "object"),
    F("environment", "object"),
    F("status", enum=("idle", "in_progress", "requires_action", "failed")),
    F(
        "required_actions",
        "array",
        "held permission requests (mcp_approval_request)",
        items="object",
    ),
    F("metadata", "object"),
    F("usage", "object", nullable=True),
)


_OA_RESPONSE = (
    F("id"),
    F("object", doc="response"),
    F("status", enum=("queued", "in_progress", "completed", "failed", "cancelled")),
    F("output", "array", items="object"),
    F("usage", "object", nullable=True),
)


_OA_ERRORS = (
    E(400, "invalid_param", "a malformed or unsupported field (param names it)"),
)


_OA_404 = E(404, "not_found", "no such session (or another identity's)")


_OA_RESPONSE_404 = E(404, "not_found", "no such response (or another identity's)")


_OA_ARTIFACT = (
    F("id"),
    F("object", doc="agent.session.artifact"),
    F("created_at", "integer"),
    F("environment_id"),
    F("path", doc="the file's absolute path in the workspace"),
    F("session_id"),
    F("size_bytes", "integer"),
    F("turn_id"),
)


_OA_ARTIFACT_404 = E(404, "not_found", "no such artifact")


_OA_SUBAGENT_404 = E(
    404, "not_found", "no such subagent or turn (an ACP agent reports none)"
)


_OA_DEFINITION = (
    F(
        "model",
        doc="a catalogue id, or a model for the agent that runs (required at create)",
        example="claude",
    ),
    F("adapter", doc="the agent that runs (at create only)"),
    F("runtime", doc="the same as adapter"),
    F("name"),
    F("instructions", doc="sent ahead of the first prompt of each session"),
    F("metadata", "object"),
    F("tools", "array", "must be empty", items="object"),
    F("reasoning", "object"),
    F("text", "object"),
    F("service_tier"),
    F("multi_agent", "object"),
)


_OA_AGENT = (
    F("id"),
    F("object", doc="agent"),
    F("model"),
    F("name", nullable=True),
    F("instructions", nullable=True),
    F("metadata", "object"),
)


_OA_AGENT_404 = E(404, "not_found", "no such agent definition (or another identity's)")


_OA_ENVIRONMENT = (
    F("id"),
    F("object", doc="agent.environment"),
    F("type", doc="self_hosted"),
    F("status", doc="ready"),
    F("workspace_directory"),
    F("created_at", "integer"),
)


_OA_FILE = (
    F("id"),
    F("object", doc="file"),
    F("bytes", "integer"),
    F("created_at", "integer"),
    F("filename"),
    F("purpose"),
    F("status", doc="processed"),
)


_OA_FILE_404 = E(404, "not_found", "no such file (or another identity's)")


_OA_VAULT = (
    F("id"),
    F("object", doc="vault"),
    F("name", nullable=True),
    F("metadata", "object"),
    F("created_at", "integer"),
)


_OA_VAULT_404 = E(404, "not_found", "no such vault (or another identity's)")


_OA_CREDENTIAL = (
    F("id"),
    F("object", doc="vault.credential"),
    F("vault_id"),
    F("name"),
    F("auth", "object", "{type, mcp_server_url, expires_at?}: never the secret"),
    F("metadata", "object"),
    F("created_at", "integer"),
    F("updated_at", "integer"),
)


_OA_CREDENTIAL_404 = E(404, "not_found", "no such credential in this vault")


_OA_STAGING = (
    E(
        403,
        "path_denied",
        "a file that configures the agent (AGENTS.md, .mcp.json, ...)",
    ),
    E(403, "path_not_allowed", "the workspace is outside the path rule"),
    E(409, "file_exists", "a different file is there already (never replaced)"),
    E(413, "payload_too_large", "a file over limits.max_bytes"),
)


_OA_TEMPLATE_BODY = (
    F("name"),
    F("env", "object", "variables (checked as any child's)"),
    F(
        "files",
        "array",
        "[{type: inline, path, data} | {type: file_id, path, file_id}]",
        items="object",
    ),
)


_OA_TEMPLATE = (
    F("id"),
    F("object", doc="agent.environment.template"),
    F("name", nullable=True),
    F("files", "array", items="object"),
    F("created_at", "integer"),
    F("updated_at", "integer"),
)


_OA_TEMPLATE_404 = E(404, "not_found", "no such template (or another identity's)")


_OA_WEBHOOK = (
    F(
        "url",
        required=True,
        doc="http(s), no credentials, query or fragment; private hosts as the policy says",
        example="https://hooks.example.com/sandbox",
    ),
    F(
        "event_types",
        "array",
        "a non-empty subset of /v1/webhook_event_types",
        required=True,
        items="string",
        example=["agent.session.idle"],
    ),
    F("name", required=True, example="ci"),
)


_OA_WEBHOOK_OBJECT = (
    F("id"),
    F("object", doc="webhook_endpoint"),
    F("url"),
    F("event_types", "array", items="string"),
    F("name"),
    F("created_at", "integer"),
    F("updated_at", "integer", nullable=True),
    F("signing_secret_hint", nullable=True),
)


_OA_WEBHOOK_404 = E(
    404, "not_found", "no such webhook endpoint (or another identity's)"
)


_OA_REFUSED = E(
    404,
    "agents.not_implemented_locally",
    "a hosted-service route; final (x-should-retry: false)",
)


SCHEMAS: dict[str, Schema] = {
    "agents_sessions_create": Schema(
        headers=(_IDEMPOTENCY, _ADAPTER_HEADER),
        body=(
            F(
                "agent",
                "object",
                "{model: a catalogue id (or a model for the agent that runs), "
                "adapter?, name?, instructions?, tools?: MCP servers over http}",
                example={"model": "claude"},
            ),
            *_ADAPTER,
            F("agent_id", doc="a stored definition"),
            F(
                "environment",
                "object",
                "{type: self_hosted, workspace_directory?} (guarded)",
                example={"type": "self_hosted"},
            ),
            F("input", "any", "a first message: text or messages"),
            F("metadata", "object", "at most 16 string pairs"),
            F(
                "vault_ids",
                "array",
                "vaults whose credentials the agent's MCP tools get (in session/new)",
                items="string",
            ),
            F("stream", "boolean", "answer the session's events as SSE", default=False),
            F("stream_options", "object"),
            F("review", enum=("none",)),
            F("spend_control", "object", nullable=True),
            F("prompt_cache_options", "object", nullable=True),
        ),
        response=_OA_SESSION,
        errors=(
            *_OA_ERRORS,
            E(404, "not_found", "unknown agent (model), definition or environment"),
            E(
                409,
                "idempotency.mismatch",
                "an Idempotency-Key reused with another body",
            ),
            E(
                429,
                "too_many_sessions",
                "max_sessions are live, or the caller's share of them "
                "(max_per_identity), none an idle conversation that can give its "
                "agent up; with Retry-After (retried by the SDK) when responses "
                "in progress hold them",
                "ResourceError",
            ),
            E(503, "agent_unavailable", "the agent is not installed or cannot start"),
        ),
        notes="OpenAI's agent.session; the agent is an ACP agent of the catalogue. See docs/openai.md.",
    ),
    "agents_sessions_list": Schema(query=(*_OA_PAGE, F("agent_id")), response=_OA_LIST),
    "agents_sessions_get": Schema(response=_OA_SESSION, errors=(_OA_404,)),
    "agents_sessions_update": Schema(
        body=(
            F("metadata", "object", "at most 16 string pairs"),
            F("agent", "object", "refused: fixed at create"),
            F("vault_ids", "array", "refused: fixed at create", items="string"),
            F("environment", "object", "refused: fixed at create"),
        ),
        response=_OA_SESSION,
        errors=(*_OA_ERRORS, _OA_404),
    ),
    "agents_sessions_delete": Schema(
        response=(F("id"), F("object"), F("deleted", "boolean")),
        errors=(_OA_404,),
    ),
    "agents_sessions_events_create": Schema(
        headers=(_IDEMPOTENCY,),
        body=(
            F(
                "events",
                "array",
                "agent.session.input.message | .cancel | .mcp_approval_request_result",
                items="object",
                example=[{"type": "agent.session.input.message", "input": "hello"}],
            ),
            F("input", "any", "shortcut for one message"),
        ),
        status=202,
        errors=(
            *_OA_ERRORS,
            _OA_404,
            E(404, "not_found", "an unknown approval request_id"),
            E(409, "already_resolved", "the permission request was answered"),
            E(
                409,
                "idempotency.mismatch",
                "an Idempotency-Key reused with another body",
            ),
            E(503, "agent_unavailable", "the session's agent is gone"),
        ),
        notes="Messages become one turn (queued behind a running one); a cancel ends the running turn; "
        "an approval result answers the agent's held permission request.",
    ),
    "agents_sessions_events_stream": Schema(
        query=(
            F(
                "after",
                doc="resume after this seq or event_id (else Last-Event-ID, else now)",
            ),
            F("include_obfuscation", "boolean", "accepted, ignored"),
        ),
        headers=(F("Last-Event-ID", doc="the standard SSE resume header"),),
        produces="sse",
        events=(
            Event("agent.session.*", "OpenAI's session events: {type, event_id, ...}"),
            GAP,
        ),
        errors=(_OA_404,),
        notes="Ends after agent.session.idle once caught up with a session that has nothing to run.",
    ),
    "agents_sessions_items_list": Schema(
        query=_OA_PAGE, response=_OA_LIST, errors=(_OA_404,)
    ),
    "agents_sessions_turns_list": Schema(
        query=_OA_PAGE, response=_OA_LIST, errors=(_OA_404,)
    ),
    "agents_sessions_turns_get": Schema(
        response=(
            F("id"),
            F("object"),
            F("status"),
            F("session_id"),
            F("error", "object", nullable=True),
            F("usage", "object", nullable=True),
        ),
        errors=(_OA_404, E(404, "not_found", "unknown turn")),
    ),
    "agents_sessions_turns_items_list": Schema(
        query=_OA_PAGE, response=_OA_LIST, errors=(_OA_404,)
    ),
    "agents_artifacts_list": Schema(
        query=(*_OA_PAGE, F("environment_id", doc="only this environment's")),
        response=_OA_LIST,
        errors=(_OA_404,),
    ),
    "agents_artifacts_get": Schema(
        response=_OA_ARTIFACT, errors=(_OA_404, _OA_ARTIFACT_404)
    ),
    "agents_artifacts_delete": Schema(
        response=(F("id"), F("object"), F("deleted", "boolean")),
        errors=(_OA_404, _OA_ARTIFACT_404),
    ),
    "agents_artifacts_content": Schema(
        produces="binary", errors=(_OA_404, _OA_ARTIFACT_404)
    ),
    "agents_traces_list": Schema(query=_OA_PAGE, response=_OA_LIST, errors=(_OA_404,)),
    "agents_subagents_list": Schema(
        query=_OA_PAGE, response=_OA_LIST, errors=(_OA_404,)
    ),
    "agents_subagents_get": Schema(errors=(_OA_404, _OA_SUBAGENT_404)),
    "agents_subagents_items_list": Schema(
        query=_OA_PAGE, errors=(_OA_404, _OA_SUBAGENT_404)
    ),
    "agents_subagents_turns_list": Schema(
        query=_OA_PAGE, errors=(_OA_404, _OA_SUBAGENT_404)
    ),
    "agents_subagents_turns_get": Schema(errors=(_OA_404, _OA_SUBAGENT_404)),
    "agents_subagents_turns_items_list": Schema(
        query=_OA_PAGE, errors=(_OA_404, _OA_SUBAGENT_404)
    ),
    "agents_responses_compact": Schema(
        body=(
            F(
                "previous_response_id",
                doc="the conversation's latest response (required)",
                example="resp_0123456789abcdef01234567",
            ),
            F("model", doc="accepted; the conversation's agent runs the command"),
            F("adapter"),
            F("runtime"),
        ),
        response=(
            F("id", doc="resp_cmp_..."),
            F("object", doc="response.compaction"),
            F("created_at", "integer"),
            F("output", "array", "the agent's reply, as message items", items="object"),
            F("usage", "object"),
        ),
        errors=(
            *_OA_ERRORS,
            _OA_RESPONSE_404,
            E(502, "agent_error", "the agent's compaction turn failed"),
            E(503, "agent_unavailable", "the conversation's agent is gone"),
            E(
                504,
                "agent_timeout",
                "the compaction did not end within max_turn_seconds",
            ),
        ),
        notes="400 invalid_param (param model) when the agent offers no /compact or /compress.",
    ),
    "agents_definitions_create": Schema(
        body=_OA_DEFINITION,
        response=_OA_AGENT,
        errors=(
            *_OA_ERRORS,
            E(404, "not_found", "model is not an agent of the catalogue"),
        ),
    ),
    "agents_definitions_list": Schema(query=_OA_PAGE, response=_OA_LIST),
    "agents_definitions_get": Schema(response=_OA_AGENT, errors=(_OA_AGENT_404,)),
    "agents_definitions_update": Schema(
        body=_OA_DEFINITION, response=_OA_AGENT, errors=(*_OA_ERRORS, _OA_AGENT_404)
    ),
    "agents_definitions_delete": Schema(
        response=(F("id"), F("object"), F("deleted", "boolean")),
        errors=(_OA_AGENT_404,),
    ),
    "agents_environments_create": Schema(
        body=(
            F(
                "environment",
                "object",
                "{type: self_hosted, workspace_directory? (guarded, must exist), env?, "
                "files?: [{type: inline|file_id, path, data|file_id}], "
                "environment_template_id?}",
                required=True,
                example={"type": "self_hosted"},
            ),
            F("vault_ids", "array", items="string"),
        ),
        response=_OA_ENVIRONMENT,
        errors=(
            *_OA_ERRORS,
            E(403, "path_not_allowed", "workspace_directory outside the path rule"),
            *_OA_STAGING[:1],
            *_OA_STAGING[2:],
            E(404, "not_found", "an unknown vault, template or file"),
        ),
        notes="Files are staged all or none; a refused create stores nothing.",
    ),
    "agents_environments_list": Schema(
        query=(*_OA_PAGE, F("type", doc="self_hosted (any other: an empty list)")),
        response=_OA_LIST,
    ),
    "agents_environments_get": Schema(
        response=_OA_ENVIRONMENT,
        errors=(E(404, "not_found", "no such environment (or another identity's)"),),
    ),
    "agents_cannot_executor_registration": Schema(errors=(_OA_REFUSED,)),
    "agents_cannot_executor_channel": Schema(errors=(_OA_REFUSED,)),
    "agents_responses_create": Schema(
        headers=(_IDEMPOTENCY, _ADAPTER_HEADER),
        body=(
            F(
                "model",
                required=True,
                doc="a catalogue id, a definition, or a model for the agent that runs",
                example="claude",
            ),
            *_ADAPTER,
            F(
                "input",
                "any",
                "text or user/system/developer messages; or mcp_approval_response "
                "items answering the previous response's mcp_approval_request items",
                example="hello",
            ),
            F("instructions"),
            F("metadata", "object"),
            F(
                "previous_response_id",
                doc="continue that conversation (its latest response)",
            ),
            F("store", "boolean", default=True),
            F("background", "boolean", default=False),
            F("stream", "boolean", "SSE, live as the turn runs", default=False),
            F("tool_choice", enum=("auto",)),
            F("tools", "array", "must be empty", items="object"),
            F("include", "array", "must be empty", items="string"),
            F("conversation", "any", "must be null"),
            F("prompt", "any", "must be null"),
            F("reasoning", "object"),
            F("text", "object", "format: text only; verbosity is ignored"),
            F("service_tier", enum=("auto", "default")),
            F("temperature", "number", "ignored"),
            F("top_p", "number", "ignored"),
            F("max_output_tokens", "integer", "ignored"),
            F("top_logprobs", "integer", "ignored"),
            F("truncation", enum=("auto", "disabled"), doc="ignored"),
            F("parallel_tool_calls", "boolean", "ignored"),
            F("user", doc="ignored"),
            F("safety_identifier", doc="ignored"),
            F("prompt_cache_key", doc="ignored"),
            F("prompt_cache_retention", doc="ignored"),
            F("stream_options", "object", "ignored"),
        ),
        response=_OA_RESPONSE,
        produces="json",
        errors=(
            *_OA_ERRORS,
            E(404, "not_found", "unknown model or previous response"),
            E(404, "not_found", "an mcp_approval_response for no pending request"),
            E(
                409,
                "idempotency.mismatch",
                "an Idempotency-Key reused with another body",
            ),
            E(
                429,
                "too_many_sessions",
                "max_sessions are live, or the caller's share of them "
                "(max_per_identity), none an idle conversation that can give its "
                "agent up; with Retry-After (retried by the SDK) when responses "
                "in progress hold them",
                "ResourceError",
            ),
        ),
        notes="Sampling parameters are accepted and named in X-Agent-Sandbox-Ignored-Params. "
        "stream=true answers SSE (response.* events) as the agent speaks. A permission "
        "request of the agent ends the response with an mcp_approval_request item; "
        "answer it with previous_response_id and mcp_approval_response.",
    ),
    "agents_responses_connect": Schema(
        headers=WEBSOCKET_HANDSHAKE,
        produces="websocket",
        errors=(
            E(
                400,
                "agents.websocket_upgrade_required",
                "a plain GET: this route is a WebSocket",
            ),
            E(
                400,
                "agents.websocket_handshake_invalid",
                "Connection, Sec-WebSocket-Key or Sec-WebSocket-Version missing or wrong",
            ),
            E(
                429,
                "concurrency_limited",
                "the caller holds max_sessions sockets already",
            ),
        ),
        notes="Client events (JSON text frames): response.create (the body of "
        "POST /v1/responses; stream is implied) and response.steer "
        "{previous_response_id, input}. Server events: the response.* events of a "
        "streamed create, live, one per frame; response.steer.accepted / .pending / .failed; "
        "error {status, error}. Binary frames close 1003, messages over "
        "max_message_bytes 1009; idle_timeout_seconds without a frame or a running "
        "response closes 1001, as does the daemon stopping; a client leaving over "
        "4 MiB of events unread is dropped with 4008. Each create is governed and "
        "audited as agents_responses_create.",
    ),
    "agents_cannot_responses_input_tokens": Schema(errors=(_OA_REFUSED,)),
    "agents_responses_get": Schema(
        query=(
            F("stream", "boolean", "stream it (live while it runs)", default=False),
            F("starting_after", "integer", "skip events up to this sequence_number"),
        ),
        response=_OA_RESPONSE,
        errors=(_OA_RESPONSE_404,),
    ),
    "agents_responses_delete": Schema(
        response=(F("id"), F("object"), F("deleted", "boolean")),
        errors=(_OA_RESPONSE_404,),
    ),
    "agents_responses_cancel": Schema(
        response=_OA_RESPONSE,
        errors=(
            _OA_RESPONSE_404,
            E(400, "invalid_param", "the response has already ended"),
        ),
    ),
    "agents_responses_input_items": Schema(
        query=_OA_PAGE, response=_OA_LIST, errors=(_OA_RESPONSE_404,)
    ),
    "agents_models_list": Schema(
        response=(
            F("object"),
            F(
                "data",
                "array",
                "[{id, object: model, created, owned_by, x_agent_sandbox: {local, "
                "compute, differences, kind: adapter|agent_definition, installed}}]; "
                "installed: whether the agent's program is on its PATH (a "
                "response naming one that is not is 503 agent_unavailable)",
                items="object",
            ),
        )
    ),
    "agents_models_get": Schema(
        response=(
            F("id"),
            F("object"),
            F("created", "integer"),
            F("owned_by"),
            F(
                "x_agent_sandbox",
                "object",
                "{local, compute, differences, kind, installed}",
            ),
        ),
        errors=(E(404, "not_found", "no such model (catalogue agent)"),),
    ),
    "agents_cannot_models_delete": Schema(errors=(_OA_REFUSED,)),
    # /v1: stored files, vaults and credentials, environment files and templates.
    "agents_files_create": Schema(
        body=(
            F("file", "string", "multipart: the file part (its file name kept)"),
            F("purpose", enum=("user_data",), required=True, example="user_data"),
            F("filename", doc="the file's name (multipart: over the file part's)"),
            F("data", doc="JSON form: the bytes, base64"),
        ),
        raw_body=True,
        response=_OA_FILE,
        errors=(
            *_OA_ERRORS,
            E(400, "invalid_param", "limits.max_files files are stored already"),
            E(
                413,
                "payload_too_large",
                "over limits.max_bytes, or the identity's total",
            ),
            E(507, "insufficient_storage", "the disk is full; nothing was kept"),
        ),
        notes="multipart/form-data (OpenAI's SDK) or JSON {purpose, filename?, data}. "
        "Stored under the state directory, for environments and templates to stage.",
    ),
    "agents_files_list": Schema(query=(*_OA_PAGE, F("purpose")), response=_OA_LIST),
    "agents_files_get": Schema(response=_OA_FILE, errors=(_OA_FILE_404,)),
    "agents_files_content": Schema(produces="binary", errors=(_OA_FILE_404,)),
    "agents_files_delete": Schema(
        response=(F("id"), F("object"), F("deleted", "boolean")),
        errors=(_OA_FILE_404,),
    ),
    "agents_vaults_create": Schema(
        body=(F("name", doc="1-256 bytes after trimming"), F("metadata", "object")),
        response=_OA_VAULT,
        errors=(*_OA_ERRORS,),
    ),
    "agents_vaults_list": Schema(
        query=(*_OA_PAGE, F("status", enum=("active", "archived"))),
        response=_OA_LIST,
    ),
    "agents_vaults_get": Schema(response=_OA_VAULT, errors=(_OA_VAULT_404,)),
    "agents_vaults_update": Schema(
        body=(F("name", nullable=True), F("metadata", "object")),
        response=_OA_VAULT,
        errors=(*_OA_ERRORS, _OA_VAULT_404),
    ),
    "agents_vaults_delete": Schema(
        response=(F("id"), F("object"), F("deleted", "boolean")),
        errors=(_OA_VAULT_404,),
    ),
    "agents_vault_credentials_create": Schema(
        body=(
            F("name", required=True, example="github"),
            F(
                "auth",
                "object",
                "{type: static_bearer, mcp_server_url (https, public), token} | "
                "{type: mcp_oauth, mcp_server_url, access_token, expires_at?}",
                required=True,
                example={
                    "type": "static_bearer",
                    "mcp_server_url": "https://mcp.example.com/mcp",
                    "token": "secret",
                },
            ),
            F("metadata", "object"),
        ),
        response=_OA_CREDENTIAL,
        errors=(*_OA_ERRORS, _OA_VAULT_404),
        notes="The secret is write-only: no answer ever carries it.",
    ),
    "agents_vault_credentials_list": Schema(
        query=(*_OA_PAGE, F("status", enum=("active", "archived"))),
        response=_OA_LIST,
        errors=(_OA_VAULT_404,),
    ),
    "agents_vault_credentials_get": Schema(
        response=_OA_CREDENTIAL, errors=(_OA_VAULT_404, _OA_CREDENTIAL_404)
    ),
    "agents_vault_credentials_update": Schema(
        body=(
            F("auth", "object", "same type: a new token, access_token or expires_at"),
            F("metadata", "object"),
        ),
        response=_OA_CREDENTIAL,
        errors=(*_OA_ERRORS, _OA_VAULT_404, _OA_CREDENTIAL_404),
    ),
    "agents_vault_credentials_delete": Schema(
        response=(F("id"), F("object"), F("deleted", "boolean")),
        errors=(_OA_VAULT_404, _OA_CREDENTIAL_404),
    ),
    "agents_environment_files_create": Schema(
        body=(
            F("type", enum=("inline", "file_id"), required=True, example="inline"),
            F(
                "path",
                required=True,
                doc="absolute, inside /workspace",
                example="/workspace/a.txt",
            ),
            F("data", doc="inline: the bytes, base64"),
            F("file_id", doc="file_id: a stored file"),
        ),
        response=(
            F("object"),
            F("environment_id"),
            F("path"),
            F("size_bytes", "integer"),
        ),
        errors=(*_OA_ERRORS, *_OA_STAGING),
    ),
    "agents_environment_files_list": Schema(
        query=(
            F("limit", "integer", "1-100", default=20),
            F("order", enum=("asc", "desc"), default="asc"),
            F("page", doc="the previous answer's next"),
            F("path", doc="a path prefix (/workspace/...)"),
        ),
        response=(
            F("object"),
            F("data", "array", items="object"),
            F("has_more", "boolean"),
            F("next", nullable=True),
        ),
        errors=(E(404, "not_found", "no such environment (or another identity's)"),),
    ),
    "agents_environment_templates_create": Schema(
        body=_OA_TEMPLATE_BODY,
        response=_OA_TEMPLATE,
        errors=(*_OA_ERRORS, *_OA_STAGING[:1]),
    ),
    "agents_environment_templates_list": Schema(query=_OA_PAGE, response=_OA_LIST),
    "agents_environment_templates_get": Schema(
        response=_OA_TEMPLATE, errors=(_OA_TEMPLATE_404,)
    ),
    "agents_environment_templates_update": Schema(
        body=_OA_TEMPLATE_BODY,
        response=_OA_TEMPLATE,
        errors=(*_OA_ERRORS, _OA_TEMPLATE_404),
    ),
    "agents_environment_templates_delete": Schema(
        response=(F("id"), F("object"), F("deleted", "boolean")),
        errors=(_OA_TEMPLATE_404,),
    ),
    "agents_runtimes_list": Schema(
        query=(
            *_OA_PAGE[:1],
            F("order", enum=("asc", "desc"), default="asc"),
            _OA_PAGE[2],
        ),
        response=_OA_LIST,
        notes="Each {id, object: agent.runtime, name (what adapter takes), display_name, "
        "aliases, default, binary, installed, path, version, "
        "allowed, protocol (acp or headless:CLI), capabilities, install_steps}; "
        "nothing is run to answer.",
    ),
    "agents_webhooks_create": Schema(
        body=_OA_WEBHOOK,
        response=(*_OA_WEBHOOK_OBJECT, F("signing_secret", doc="whsec_…, shown once")),
        errors=(
            *_OA_ERRORS,
            E(
                403,
                "url_not_allowed",
                "url_schemes, url_allow/url_deny or a private host",
            ),
        ),
        notes="Deliveries are signed (Standard Webhooks: webhook-id, webhook-timestamp, "
        "webhook-signature) and retried with backoff. See docs/openai.md.",
    ),
    "agents_webhooks_list": Schema(
        query=(F("after"), F("limit", "integer", default=20)), response=_OA_LIST
    ),
    "agents_webhooks_get": Schema(
        response=_OA_WEBHOOK_OBJECT, errors=(_OA_WEBHOOK_404,)
    ),
    "agents_webhooks_update": Schema(
        body=tuple(attrs.evolve(f, required=False) for f in _OA_WEBHOOK),
        response=_OA_WEBHOOK_OBJECT,
        errors=(
            *_OA_ERRORS,
            _OA_WEBHOOK_404,
            E(
                403,
                "url_not_allowed",
                "url_schemes, url_allow/url_deny or a private host",
            ),
        ),
    ),
    "agents_webhooks_delete": Schema(
        response=(F("id"), F("object"), F("deleted", "boolean")),
        errors=(_OA_WEBHOOK_404,),
    ),
    "agents_webhooks_rotate_secret": Schema(
        body=(
            F(
                "keep_old_secret_active_for_24_hours",
                "boolean",
                "true is refused: one secret at a time",
                default=False,
            ),
        ),
        response=(*_OA_WEBHOOK_OBJECT, F("signing_secret", doc="the new secret")),
        errors=(*_OA_ERRORS, _OA_WEBHOOK_404),
    ),
    "agents_webhooks_test": Schema(
        body=(F("event_type", required=True, example="agent.session.idle"),),
        response=(
            F("object"),
            F("event_type"),
            F("status_code", "integer", "the receiver's"),
            F("success", "boolean"),
            F("webhook_endpoint_id"),
        ),
        errors=(
            *_OA_ERRORS,
            _OA_WEBHOOK_404,
            E(502, "remote_error", "the receiver could not be reached in time"),
        ),
        notes="One signed attempt, now, not retried.",
    ),
    "agents_webhook_event_types": Schema(
        response=(F("object"), F("data", "array", items="string"))
    ),
}
