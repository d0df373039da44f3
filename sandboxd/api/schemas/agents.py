"""What the endpoints of coding agents over ACP take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, Event, F, Schema
from sandboxd.api.fragments import GAP, LAST_EVENT_ID, QUERY_TOKEN, RESUME

_SID_404 = E(404, "not_found", "no such agent session")


SCHEMAS: dict[str, Schema] = {
    "agents_catalog": Schema(
        response=(
            F(
                "agents",
                "array",
                "[{id, name, source: builtin|policy, enabled, "
                "allowed, installed, path, protocol: acp|headless:CLI, version, "
                "command, env_required, env_present, auth_method, "
                "install: {package, version}}]",
                items="object",
            ),
        ),
    ),
    "agents_catalog_get": Schema(
        query=(
            F(
                "probe",
                "boolean",
                "run initialize on a short-lived agent",
                default=False,
            ),
        ),
        response=(
            F("id"),
            F("name"),
            F("installed", "boolean"),
            F("protocol_version", "integer", "with probe"),
            F("agent_info", "object", "with probe"),
            F("agent_capabilities", "object", "with probe"),
            F("auth_methods", "array", "with probe", items="object"),
        ),
        errors=(
            E(404, "not_found", "unknown agent id"),
            E(503, "agent_unavailable", "probe: the agent cannot start"),
        ),
    ),
    "agents_install": Schema(
        body=(F("version", doc="default: the catalogue's pinned version"),),
        status=202,
        response=(
            F("agent"),
            F("state", doc='"installing"'),
            F("pid", "integer"),
            F("command", "array", items="string"),
            F("already_installed", "boolean", "200 instead when installed"),
        ),
        errors=(
            E(400, "invalid_param", "no package to install, or a bad version"),
            E(404, "not_found", "unknown agent id"),
            E(503, "unavailable", "managed processes are unavailable"),
        ),
        notes="A managed process: follow it with process_output.",
    ),
    "agents_catalog_sessions": Schema(
        query=(F("cwd", doc="only sessions of this directory"), F("cursor")),
        response=(
            F(
                "sessions",
                "array",
                "[{acp_session_id, cwd, title, updated_at}]",
                items="object",
            ),
            F("next_cursor"),
        ),
        errors=(
            E(404, "not_found", "unknown agent id"),
            E(501, "unsupported", "the agent cannot list its sessions"),
            E(
                504,
                "agent_timeout",
                "no answer within init_timeout_seconds (30); the agent is ended",
            ),
        ),
    ),
    "agents_session_create": Schema(
        body=(
            F("agent", required=True, example="claude"),
            F("cwd", doc="guarded; default base_dir"),
            F("additional_directories", "array", items="string"),
            F(
                "mcp_servers",
                "array",
                "refused unless params.mcp_servers allows",
                items="object",
            ),
            F("mode"),
            F("model"),
            F("config", "object"),
            F("thought_level", doc="its thought_level option's value"),
            F("title"),
            F("env", "object"),
            F("user", "any"),
            F("permissions", "object", "per-session permission_mode (see notes)"),
            F("prompt", "any", "a first prompt: text or ContentBlock[]"),
        ),
        status=201,
        response=(
            F("session_id"),
            F("agent"),
            F("acp_session_id"),
            F("state", doc='"idle", or "running" when a first prompt was given'),
            F("modes", "object"),
            F("config_options", "array", items="object"),
            F("models", "object"),
            F("agent_info", "object"),
            F("capabilities", "object"),
            F("commands", "array", items="object"),
            F("title"),
            F("events_url"),
            F("turn_id", doc="when a prompt was given"),
        ),
        errors=(
            E(400, "invalid_param", "a malformed field"),
            E(403, "param_not_allowed", "a refused mode, user or MCP server"),
            E(404, "not_found", "unknown agent id"),
            E(
                429,
                "too_many_sessions",
                "max_sessions (4) are live, or the caller's share of them "
                "(max_per_identity), none an idle /v1 conversation that can give "
                "its agent up",
                "ResourceError",
            ),
            E(
                502,
                "agent_error",
                "the agent answered initialize or session/new with an error",
            ),
            E(503, "agent_unavailable", "the agent is not installed or cannot start"),
            E(504, "agent_timeout", "no answer within init_timeout_seconds (30)"),
        ),
    ),
    "agents_session_load": Schema(
        body=(
            F("agent", required=True, example="claude"),
            F("acp_session_id", required=True, example="$ACP_SESSION"),
            F("cwd"),
            F("additional_directories", "array", items="string"),
            F("mcp_servers", "array", items="object"),
            F(
                "replay",
                "boolean",
                "replay history as events (session/load), else session/resume",
                default=True,
            ),
            F("title"),
        ),
        status=201,
        response=(
            F("session_id"),
            F("agent"),
            F("acp_session_id"),
            F("state"),
            F("events_url"),
            F(
                "already_loaded",
                "boolean",
                "present (true) when the stored session was already loaded: "
                "the answer is 200 with that live session",
            ),
        ),
        errors=(
            E(400, "invalid_param", "acp_session_id missing"),
            E(404, "not_found", "unknown agent id"),
            E(
                429,
                "too_many_sessions",
                "max_sessions are live, or the caller's share of them "
                "(max_per_identity), none an idle /v1 conversation that can give "
                "its agent up",
            ),
            E(
                501,
                "unsupported",
                "replay: true for an agent whose initialize says loadSession: false",
            ),
            E(502, "agent_error", "the agent refused the load"),
            E(503, "agent_unavailable", "the agent cannot start"),
        ),
        notes="A stored session is loaded once: while a session of the same agent "
        "bound to that acp_session_id is live, loading it again starts no second "
        "agent process on the conversation and answers 200 with the live "
        "session (already_loaded: true).",
    ),
    "agents_session_list": Schema(
        query=(
            F("agent", doc="a catalogue id"),
            F(
                "state",
                enum=(
                    "starting",
                    "idle",
                    "running",
                    "awaiting_input",
                    "closing",
                    "closed",
                    "failed",
                ),
            ),
        ),
        response=(
            F(
                "sessions",
                "array",
                "[{session_id, agent, state, title, cwd, "
                "created_at, last_seq, turn_id, pending_requests}]",
                items="object",
            ),
        ),
        notes=(
            "Closed sessions stay listed until the oldest must go: past 1000"
            " sessions in all, or past 64 MiB in the closed ones' event logs"
            " together (the most recently closed one always stays)."
        ),
    ),
    "agents_session_get": Schema(
        response=(
            F("session_id"),
            F("agent"),
            F("state"),
            F("modes", "object"),
            F("config_options", "array", items="object"),
            F("usage", "object"),
            F("current_turn", "object"),
            F("stop_reason"),
            F(
                "process",
                "object",
                "{pid, exit_code, signal}: exit_code null while running or when a "
                "signal ended the agent (signal names it)",
            ),
            F("capabilities", "object"),
        ),
        errors=(_SID_404,),
    ),
    "agents_session_config": Schema(
        body=(
            F("mode"),
            F("model"),
            F("config", "object"),
            F("thought_level", doc="its thought_level option's value"),
            F("title", example="refactor"),
        ),
        response=(
            F("modes", "object"),
            F("config_options", "array", items="object"),
            F("title"),
        ),
        errors=(
            _SID_404,
            E(403, "param_not_allowed", "a forbidden mode (deny_modes)"),
            E(
                504,
                "agent_timeout",
                "no answer within init_timeout_seconds (30): the session fails "
                "and its agent is ended",
            ),
        ),
    ),
    "agents_session_cancel": Schema(
        body=(F("wait", "number", "seconds to wait for the turn to end", default=15),),
        response=(F("turn_id"), F("state"), F("stop_reason"), F("forced", "boolean")),
        errors=(_SID_404,),
        notes="Held requests are answered cancelled; after a 10 s grace the agent is killed.",
    ),
    "agents_session_delete": Schema(
        query=(
            F("forget", "boolean", "also session/delete in the agent", default=False),
        ),
        response=(
            F("session_id"),
            F("state", doc='"closed"'),
            F(
                "exit_code",
                "integer",
                "null when a signal ended the agent",
                nullable=True,
            ),
            F(
                "signal",
                doc="the signal that ended the agent, if one did",
                nullable=True,
            ),
        ),
        errors=(_SID_404,),
    ),
    "agents_prompt": Schema(
        body=(
            F(
                "prompt",
                "any",
                "text or ContentBlock[]; /cmd args runs a slash command",
                required=True,
                example="Run the tests and fix what fails",
            ),
            F("files", "array", "paths (guarded) sent as resources", items="string"),
            F("wait", "number", "seconds to wait for the turn (max 600)", default=30),
        ),
        response=(
            F("turn_id"),
            F("stop_reason"),
            F("text"),
            F("tool_call_ids", "array", items="string"),
            F("usage", "object"),
            F("seq", "object", "{from, to}"),
            F("state", doc='202: "running"'),
            F("events_url", doc="202: follow here"),
        ),
        errors=(
            _SID_404,
            E(
                400,
                "invalid_param",
                "an empty prompt, or blocks beyond promptCapabilities",
            ),
            E(409, "turn_in_progress", "a turn is already running"),
            E(413, "payload_too_large", "over max_prompt_bytes"),
        ),
        notes="200 when the turn ended within wait, else 202 with events_url.",
    ),
    "agents_turns": Schema(
        response=(
            F(
                "turns",
                "array",
                "[{turn_id, state, stop_reason, started_at, "
                "ended_at, seq_from, seq_to, error?}]",
                items="object",
            ),
        ),
        errors=(_SID_404,),
    ),
    "agents_turn_get": Schema(
        query=(F("wait", "number", "long-poll seconds while it runs", default=0),),
        response=(
            F("turn_id"),
            F("state", enum=("running", "ended", "failed")),
            F("stop_reason"),
            F("text"),
            F("tool_call_ids", "array", items="string"),
            F("usage", "object"),
        ),
        errors=(_SID_404, E(404, "not_found", "unknown turn")),
    ),
    "agents_messages": Schema(
        query=(
            F("turn_id"),
            F("after", "integer", default=0),
            F("limit", "integer", default=100),
        ),
        response=(
            F(
                "messages",
                "array",
                "[{message_id, turn_id, role, content, "
                "tool_call_ids, seq_from, seq_to}]; a message whose content "
                "passed max_message_bytes keeps what fit and has truncated: "
                "true (its events carry every chunk)",
                items="object",
            ),
            F("next", "integer"),
        ),
        errors=(_SID_404,),
    ),
    "agents_events": Schema(
        query=(
            *RESUME,
            F(
                "follow",
                "boolean",
                "SSE instead of one page",
                default=False,
                example="true",
            ),
            F("types", doc="comma-separated event types"),
            F("include_raw", "boolean", "include the ACP params as raw", default=False),
            F("limit", "integer", "page size", default=1000),
            QUERY_TOKEN,
        ),
        headers=(LAST_EVENT_ID,),
        response=(
            F("events", "array", items="object"),
            F("next", "integer"),
            F("dropped", "object", "{from, to} or null", nullable=True),
            F("closed", "boolean"),
        ),
        events=(
            Event(
                "<type>",
                "{seq, time, session_id, turn_id?, type, ...}: session.state, "
                "turn.started, turn.ended, message.delta, tool_call, plan, "
                "permission.requested, subagent, ... session.closed (always last)",
            ),
            GAP,
        ),
        errors=(_SID_404,),
        notes="What the agent reports is kept with these types: message text, a "
        "title, a mode id, a plan entry's content and a command's name are strings, "
        "usage's used and size numbers, a tool call's status one of pending, "
        "in_progress, completed, failed and its kind one of ACP's kinds. An update "
        "of another type is an unknown event (with include_raw, what was sent), "
        "and a tool call field of another type is left out, named in an unknown "
        "event.",
    ),
    "agents_requests": Schema(
        query=(
            F("session_id"),
            F(
                "state",
                default="pending",
                enum=("pending", "resolved", "withdrawn", "all"),
            ),
            F("kind", enum=("permission", "question")),
        ),
        response=(
            F(
                "requests",
                "array",
                "[{request_id, kind, session_id, turn_id, "
                "tool_call, options | {message, requested_schema}, policy, "
                "created_at, deadline}]",
                items="object",
            ),
        ),
    ),
    "agents_request_reply": Schema(
        body=(
            F("option_id", doc="permission: the option picked", example="allow"),
            F(
                "decision",
                enum=("allow_once", "allow_always", "reject_once", "reject_always"),
            ),
            F("cancel", "boolean", "permission: cancel it"),
            F("action", enum=("accept", "decline", "cancel"), doc="question"),
            F(
                "content",
                "object",
                "question: the answer, checked against its requested_schema "
                "(required fields, types, enum, lengths, bounds)",
            ),
        ),
        response=(F("request_id"), F("state", doc='"resolved"'), F("outcome")),
        errors=(
            E(
                400,
                "invalid_param",
                "no usable answer, or content that does not fit the question's "
                "requested_schema (param: content; the error names the field)",
            ),
            E(403, "param_not_allowed", "allow_always with allow_always: false"),
            E(404, "not_found", "unknown request"),
            E(409, "already_resolved", "answered already"),
            E(409, "withdrawn", "the agent withdrew it"),
        ),
    ),
    "agents_plan": Schema(
        response=(
            F("entries", "array", "[{content, priority, status}]", items="object"),
            F("updated_seq", "integer"),
        ),
        errors=(_SID_404,),
    ),
    "agents_tool_calls": Schema(
        query=(F("turn_id"), F("status"), F("kind")),
        response=(
            F(
                "tool_calls",
                "array",
                "[{tool_call_id, turn_id, title, kind, status, "
                "locations, has_diff, terminal_ids, permission, first_seq, last_seq}]",
                items="object",
            ),
        ),
        errors=(_SID_404,),
    ),
    "agents_tool_call_get": Schema(
        query=(F("format", enum=("unified",), doc="add unified diffs"),),
        response=(
            F("tool_call_id"),
            F("content", "array", items="object"),
            F(
                "diffs",
                "array",
                "[{path, old_text, new_text, unified?}]",
                items="object",
            ),
            F("raw_input", "any"),
            F("raw_output", "any"),
            F("permission", "any"),
        ),
        errors=(_SID_404, E(404, "not_found", "unknown tool call")),
    ),
    "agents_files": Schema(
        query=(F("turn_id"), F("diff", "boolean", default=False)),
        response=(
            F(
                "files",
                "array",
                "[{path, change, sources, tool_call_ids, sha256, bytes, diff?}]",
                items="object",
            ),
        ),
        errors=(_SID_404,),
    ),
    "agents_terminals": Schema(
        response=(
            F(
                "terminals",
                "array",
                "[{terminal_id, command, args, cwd, pid, state, "
                "exit_code, signal, truncated, released, tool_call_id}]",
                items="object",
            ),
        ),
        errors=(_SID_404,),
    ),
    "agents_terminal_output": Schema(
        query=(*RESUME, F("follow", "boolean", default=False)),
        headers=(LAST_EVENT_ID,),
        response=(
            F("terminal_id"),
            F("pid", "integer"),
            F("state"),
            F("exit_code", "integer", "null while running", nullable=True),
            F("events", "array", "[{seq, stream, data}]", items="object"),
            F("next", "integer"),
            F("dropped_bytes", "integer"),
            F("gap", "object", "{from, to} or null", nullable=True),
        ),
        events=(
            Event("stdout", '{"data"}'),
            Event("stderr", '{"data"}'),
            Event("exit", '{"exit_code"}'),
            GAP,
        ),
        errors=(_SID_404, E(404, "not_found", "unknown terminal")),
        notes="The process_output contract.",
    ),
    "agents_terminal_kill": Schema(
        body=(F("signal", "integer", default=15, example=15),),
        response=(F("terminal_id"), F("signal", "integer")),
        errors=(
            _SID_404,
            E(400, "signal_not_allowed", "outside params.allowed_signals"),
        ),
    ),
    "agents_commands": Schema(
        response=(
            F("commands", "array", "[{name, description, input_hint}]", items="object"),
        ),
        errors=(_SID_404,),
    ),
    "agents_logs": Schema(
        query=(F("after", "integer", default=0),),
        response=(
            F("chunks", "array", "[{seq, data}]", items="object"),
            F("dropped_bytes", "integer"),
        ),
        errors=(_SID_404,),
        notes="The agent's stderr, head and tail, secrets redacted.",
    ),
}
