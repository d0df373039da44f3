"""
What each endpoint takes and gives: query parameters, body fields,
response fields and the errors particular to it, keyed by endpoint id.

The endpoint table (:mod:`sandboxd.endpoints`) says who may call what; this
module says what a call looks like, so that ``/openapi.json``
(:mod:`sandboxd.openapi`) and the API reference (:mod:`sandboxd.apidoc`,
``docs/api.md``) describe the same request and response.  It is written
from SPEC §7, §8, §9 and §15 and checked against the handlers by
``tests/api/test_docs.py`` (every name a handler reads must be declared here).

Errors every endpoint can give (authentication, policy gate, header and
body checks of the request pipeline) are :data:`COMMON_ERRORS`; an
endpoint's own list holds only what its handler adds.
"""

from __future__ import annotations

from typing import Any

import attrs

# test-case-name: tests.api.test_docs


@attrs.frozen
class Field:
    """
    One named value: a query parameter, a body field or a response field.

    :ivar type: a JSON type (``string``, ``integer``, ``number``,
        ``boolean``, ``object``, ``array``) or ``any``.
    :ivar items: the element type of an ``array``.
    :ivar default: the value used when the field is absent (None: no
        default worth stating).
    :ivar example: a value for generated examples (curl); fields without
        one are left out of them.
    :ivar enum: the only accepted values, when there is a closed set.
    :ivar nullable: a response field that may be ``null``.
    :ivar min_length: the shortest string the handler accepts (1 for a
        name it refuses when empty); of each item, for an array.
    :ivar min_items: the fewest items an array may have.
    :ivar minimum: the smallest number accepted.
    :ivar maximum: the largest number accepted.
    """

    name: str
    type: str = "string"
    doc: str = ""
    required: bool = False
    default: Any = None
    example: Any = None
    items: str | None = None
    enum: tuple[Any, ...] = ()
    nullable: bool = False
    min_length: int | None = None
    min_items: int | None = None
    minimum: int | None = None
    maximum: int | None = None


@attrs.frozen
class ErrorCase:
    """An error an endpoint answers with: status, ``code``, and when."""

    status: int
    code: str
    when: str
    type: str = ""


@attrs.frozen
class Event:
    """One SSE event name and the JSON its ``data:`` line carries."""

    name: str
    data: str


@attrs.frozen
class Schema:
    """
    The request and response of one endpoint.

    :ivar produces: ``json``, ``sse`` (an event stream; ``events`` lists
        its event names), ``binary`` (raw bytes), ``prometheus`` (the
        Prometheus text format) or ``websocket``.
    :ivar status: the success status (201/202 for creating routes).
    :ivar raw_body: the request body is raw bytes, not JSON.
    :ivar open_body: the JSON body is free-form (a command's arguments):
        any name is accepted, so no field list can be complete.
    """

    summary: str = ""
    query: tuple[Field, ...] = ()
    body: tuple[Field, ...] = ()
    headers: tuple[Field, ...] = ()
    response: tuple[Field, ...] = ()
    errors: tuple[ErrorCase, ...] = ()
    events: tuple[Event, ...] = ()
    produces: str = "json"
    status: int = 200
    raw_body: bool = False
    open_body: bool = False
    notes: str = ""


F = Field
E = ErrorCase

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

_GUARD = (
    E(400, "invalid_param", "a missing path, or one holding NUL"),
    E(
        403,
        "path_not_allowed",
        "outside base_dir or paths.allow, or a link leading out",
    ),
    E(403, "path_denied", "matches paths.deny"),
    E(403, "symlink_denied", "a symlink under symlinks: deny"),
)
_WRITE_GUARD = (*_GUARD, E(403, "read_only", "below a paths.read_only entry"))
_WRITE = (
    E(403, "param_not_allowed", "extension or overwrite refused by params"),
    E(
        409,
        "file_exists",
        "the target exists and overwrite is false",
        "FileExistsError",
    ),
    E(412, "precondition_failed", "If-Match names a version the file no longer has"),
    E(413, "payload_too_large", "the file is over max_bytes"),
    E(
        507,
        "insufficient_storage",
        "the disk filled up; nothing was written",
        "OSError",
    ),
)
_ETAG = F("etag", doc="the file's version, for If-Match")
_IF_MATCH = F("if_match", doc="write only if the file still has this ETag")
_UPLOAD_RECORD = (
    F("upload_id", doc="names the upload in the routes below"),
    F("path", doc="the target, resolved"),
    F("requested_path", doc="the path as files_uploads_create was given it"),
    F("size", "integer"),
    F("offset", "integer", "bytes written so far: the next append starts here"),
    F("expires_at", doc="ISO 8601 UTC: dropped then unless a byte arrives"),
)
_NO_UPLOAD = E(
    404,
    "not_found",
    "no such upload: unknown, completed, expired, deleted, or another identity's",
    "NotFoundError",
)

# Fields of every request that starts a child (SPEC §7.4).
_CHILD = (
    F("cwd", doc="working directory (guarded; default base_dir)"),
    F("env", "object", "extra environment variables (strings)"),
    F("user", "any", "run as this user (name or uid) when the daemon is root"),
    F("idle_timeout", "number", "seconds without output before the group is killed"),
)
_COMMAND = (
    F(
        "command",
        doc="the command line (shlex-split, no shell)",
        required=True,
        min_length=1,
        example="ls -la",
    ),
    F("shell", doc="run as [shell, -c, command] (params.shells)", enum=("bash", "sh")),
)
_CHILD_ERRORS = (
    E(400, "invalid_param", "bad command, cwd, env, user or timeout"),
    E(403, "param_not_allowed", "command, shell or user refused by params"),
    *_GUARD[1:],
    E(503, "unavailable", "the daemon is shutting down"),
)
#: git (SPEC §24): the repository field and the errors every call can give.
_GIT_PATH = F("path", doc="the repository (guarded)", default=".", example="repo")
_GIT_USER = F(
    "user",
    "any",
    "run git as this user (name or uid) when the daemon is root"
    " (default params.default_user; must be allowed by params.users)",
)
_GIT_LOCAL_ERRORS = (
    *_GUARD,
    E(400, "invalid_path", ".. or NUL in a path"),
    E(400, "git_error", "git refused (its last lines)", "GitError"),
    E(404, "not_found", "the path is no repository"),
    E(408, "timeout", "git ran past its limit", "TimeoutError"),
    E(
        409,
        "git_conflict",
        "the repository's state refuses it (body: kind)",
        "GitError",
    ),
)
_GIT_URL_ERRORS = (
    E(400, "invalid_param", "not a URL, or credentials in it"),
    E(403, "url_not_allowed", "transport, url_allow/url_deny or a private address"),
)
_GIT_REMOTE_FIELDS = (
    F(
        "auth",
        "object",
        '{"credential": NAME} (policy git.credentials) or {"username", "password"} for this call',
    ),
    F(
        "wait",
        "number",
        "seconds to wait for the result before answering 202",
        default=0,
        minimum=0,
    ),
    F("timeout", "number", "seconds (cut to limits.timeout_seconds, 600)"),
)
_GIT_REMOTE_ERRORS = (
    *_GIT_LOCAL_ERRORS,
    *_GIT_URL_ERRORS,
    E(429, "too_many_jobs", "limits.max_jobs git jobs are running"),
    E(
        502,
        "remote_error",
        "the remote refused (body: kind auth|not_found|network|tls|rejected)",
        "GitError",
    ),
    E(503, "unavailable", "a named credential has no secret"),
)
_GIT_JOB_ANSWER = (
    F("job_id"),
    F("state", enum=("running", "done")),
    F("events_url", doc="with 202: the job's SSE stream"),
)
_GIT_JOB_NOTES = (
    "A job: 202 {job_id, state: running, events_url} unless it ends within "
    "`wait` seconds (then 200 with the result, or its error). Credentials reach "
    "git only through an askpass socket; they are never in argv, the "
    "environment, the URL, .git/config or the output."
)
_RESUME = (
    F(
        "after",
        "integer",
        "resume after this seq (else Last-Event-ID)",
        default=0,
        minimum=0,
    ),
)
_LAST_EVENT_ID = F("Last-Event-ID", "integer", "the standard SSE resume header")
#: SPEC §20: what the file API creates belongs to the request's user.
_OWNER = F(
    "user",
    doc="when the daemon runs as root, who owns the files and directories this "
    "creates (default params.default_user; must be allowed by params.users)",
)
#: SPEC §20: EventSource cannot set headers (see docs/security.md for the risk).
_QUERY_TOKEN = F(
    "access_token", doc="the token, for EventSource (it cannot set headers)"
)
_QUERY_TOKEN_FOLLOW = F(
    "access_token",
    doc="with follow=true only: the token, for EventSource (it cannot set headers)",
)
_GAP = Event("gap", '{"from", "to"}: events already dropped, sent first')
#: Code contexts (SPEC §22).
_CONTEXT = (
    F("id"),
    F("kernel"),
    F("language"),
    F("name", nullable=True),
    F("cwd"),
    F("user", nullable=True),
    F("state", enum=("starting", "idle", "busy", "restarting", "dead", "closed")),
    F("created_at", "number"),
    F("last_activity", "number"),
    F("execution_count", "integer"),
    F("pid", "integer", nullable=True),
    F("owner"),
    F("restarts", "integer"),
)
_RESULT = (
    F("execution_id"),
    F("context_id"),
    F(
        "state",
        enum=("queued", "running", "ok", "error", "interrupted", "timeout", "lost"),
    ),
    F("started", "boolean", "false: the kernel never took the code (safe to retry)"),
    F("execution_count", "integer", nullable=True),
    F("stdout"),
    F("stderr"),
    F(
        "results",
        "array",
        "[{data: {mime: value}, metadata, is_result, refs?}]",
        items="object",
    ),
    F("error", "object", "{ename, evalue, traceback}", nullable=True),
    F("duration_ms", "number", nullable=True),
    F("truncated", "boolean"),
    F("dropped_bytes", "integer"),
    F("events_url"),
)
_CODE_EVENTS = (
    Event("execution.queued", "{execution_id, position}"),
    Event("execution.started", "{execution_id, execution_count}"),
    Event("stdout", "{execution_id, text}"),
    Event("stderr", "{execution_id, text}"),
    Event(
        "display",
        "{execution_id, data: {mime: value}, metadata, is_result, display_id?, refs?}",
    ),
    Event("error", "{execution_id, ename, evalue, traceback, traceback_text}"),
    Event("input.requested", "{execution_id, prompt, password}"),
    Event(
        "context.restarted", "{execution_id, reason: user|timeout|died|hub, exit_code?}"
    ),
    Event(
        "execution.ended",
        "{execution_id, state: ok|error|interrupted|timeout|lost, started, "
        "execution_count, duration_ms, truncated, dropped_bytes}: always last",
    ),
)
_NO_CONTEXT = E(404, "not_found", "unknown context or execution, or another identity's")
_PROC_FIELDS = (
    F("pid", "integer"),
    F("command"),
    F("tag", doc="the label given at start, or null", nullable=True),
    F("state", enum=("running", "exited")),
    F("started_at", "number", "Unix time"),
    F(
        "exit_code",
        "integer",
        "null while running; -N when killed by signal N",
        nullable=True,
    ),
    F("stdin", "boolean", "whether a stdin pipe is open"),
)
_PTY_SESSION = (
    F("id"),
    F("pid", "integer"),
    F("created_at", "number", "Unix time"),
    F("cols", "integer"),
    F("rows", "integer"),
    F("alive", "boolean"),
    F("clients", "integer", "WebSockets attached now"),
    F("ws_url", doc="where to attach: ws://HOST:PTY_PORT/pty?session_id=ID"),
)
_SID_404 = E(404, "not_found", "no such agent session")
# The /v1 door's shared pieces (SPEC §26).
_IDEMPOTENCY = F(
    "Idempotency-Key", doc="the same key and body answer the first result again"
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
_OA_SUBAGENT_404 = E(404, "not_found", "no such subagent (an ACP agent reports none)")
_OA_DEFINITION = (
    F("model", doc="a catalogue id (required at create)", example="claude"),
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
_OA_REFUSED = E(
    404,
    "agents.not_implemented_locally",
    "a hosted-service route; final (x-should-retry: false)",
)
_BROWSER = (
    E(
        403,
        "param_not_allowed",
        "a URL refused by url_allow/url_deny/schemes/private networks",
    ),
    E(429, "rate_limited", "too many calls queued for the shared page"),
    E(503, "unavailable", "Playwright or Chromium is not installed", "RuntimeError"),
)
_TIMEOUT_MS = F("timeout", "integer", "milliseconds")


def _timeout(default: int) -> Field:
    return F("timeout", "integer", "milliseconds", default=default)


_LINK_TEXT = "{link_id, audience, scopes, created_at, expires_at, uses, used, revoked}"
_LINK_RECORD = (
    F("link_id"),
    F("audience"),
    F("scopes", "array", items="string"),
    F("created_at", doc="ISO 8601 UTC"),
    F("expires_at", doc="ISO 8601 UTC"),
    F("uses", "integer", "null: any number", nullable=True),
    F("used", "integer"),
    F("revoked", "boolean"),
)
_LINK_MINTED = (
    F("link_id"),
    F("token", doc="sbxl_...: shown once"),
    F("audience"),
    F("scopes", "array", items="string"),
    F("expires_at", doc="ISO 8601 UTC"),
    F("uses", "integer", nullable=True),
    F("url", doc="a preview link: the URL that opens it (when the door listens)"),
)
_EXPOSURE = (
    F("port", "integer"),
    F("label", nullable=True),
    F("public", "boolean"),
    F("host_header"),
    F("url", doc="where a browser opens it"),
    F("listening", "boolean", "something listens on the port now"),
    F("exposed_by", doc="the identity that exposed it"),
    F("created_at", doc="ISO 8601 UTC"),
    F("expires_at", doc="ISO 8601 UTC, or null", nullable=True),
    F("requests", "integer"),
    F("bytes_in", "integer"),
    F("bytes_out", "integer"),
    F("open_websockets", "integer"),
)


SCHEMAS: dict[str, Schema] = {
    # -- core ------------------------------------------------------------------
    "health": Schema(
        response=(F("status", doc='always "ok"'),),
        notes="Never needs a token; the probe behind `sandboxd healthcheck`.",
    ),
    "capabilities": Schema(
        response=(
            F("groups", "object", "{group: bool}: at least one endpoint enabled (v1)"),
            F("api_version", "integer", "2"),
            F("server_version"),
            F("identity", "object", "{id, scopes} of the caller"),
            F("policy", "object", "{preset, revision}"),
            F("group_summary", "object", "{group: {enabled, total}}"),
            F(
                "endpoints",
                "object",
                "{id: {method, path, group, summary, streaming, "
                "enabled, allowed, reason, rule, scopes, limits, paths, params}}; "
                "paths: {allow, deny, deny_count, read_only (true when every "
                "allowed place is read-only), read_only_paths, symlinks, hard_links}",
            ),
            F("warnings", "array", items="string"),
        ),
    ),
    "capabilities_check": Schema(
        body=(
            F(
                "endpoint",
                doc="the endpoint id to decide",
                required=True,
                min_length=1,
                example="shell",
            ),
            F("path", doc="one path to decide", example="notes.txt"),
            F("paths", "array", "more paths to decide", items="string"),
            F(
                "op",
                doc="the operation on the paths (default: the endpoint's)",
                enum=("read", "write", "delete"),
            ),
            F(
                "scopes",
                "array",
                "decide as if the caller held these scopes",
                items="string",
            ),
            F(
                "params",
                "object",
                "request params to decide: command, shell, language, signal",
            ),
            F("command", doc="for run_command: the command name (commands:run:NAME)"),
        ),
        response=(
            F("endpoint"),
            F("allowed", "boolean"),
            F("code", doc="why not, when not allowed"),
            F("rule", doc="the rule behind the refusal"),
            F("reason"),
            F("scope", doc="the missing scope"),
            F("param", doc="the refused param"),
            F("paths", "array", "[{path, allowed, code?, rule?}]", items="object"),
        ),
        errors=(
            E(400, "invalid_param", "unknown endpoint id, bad op, scopes or params"),
        ),
        notes="Policy only: never touches the file system, so the answer for a "
        "path is the same whether or not it exists.",
    ),
    "openapi": Schema(
        response=(
            F("openapi", doc='"3.1.0"'),
            F("info", "object"),
            F("paths", "object", "every endpoint, enabled or not (x-sandboxd-enabled)"),
            F("components", "object"),
        ),
    ),
    # -- commands --------------------------------------------------------------
    "list_commands": Schema(
        response=(
            F(
                "commands",
                "array",
                "[{name, description, args: [{name, type, required, "
                "default, description}]}]; hidden ones and those the caller may not "
                "run are left out",
                items="object",
            ),
        ),
    ),
    "run_command": Schema(
        body=(F("*", "any", "the command's arguments by name", example=None),),
        open_body=True,
        response=(F("result", "any", "what the command returned"),),
        errors=(
            E(
                400,
                "invalid_param",
                "a required argument is missing, undeclared or uncoercible",
            ),
            E(
                403,
                "missing_scope",
                "the command's own scopes (or commands:run:NAME) are lacking",
            ),
            E(
                404,
                "not_found",
                "unknown command; the message lists the available ones",
            ),
            E(500, "internal", "the command raised; type is its exception's name"),
        ),
        notes="Arguments are coerced to the declared types: string, integer, float, "
        "boolean (true/false/yes/no/1/0).",
    ),
    # -- file_ops --------------------------------------------------------------
    "upload": Schema(
        body=(
            _OWNER,
            F("path", required=True, min_length=1, example="hello.txt"),
            F("content_base64", required=True, example="aGVsbG8K"),
            F("overwrite", "boolean", default=True),
            F("mode", doc='octal permissions, e.g. "644"'),
            _IF_MATCH,
        ),
        response=(F("path", doc="absolute"), F("bytes", "integer"), _ETAG),
        errors=(*_WRITE_GUARD, *_WRITE),
        notes="Parent directories are created. The file is written to a temporary "
        "name and renamed, so it lands whole or not at all.",
    ),
    "download": Schema(
        query=(F("path", required=True, min_length=1, example="hello.txt"),),
        response=(F("path"), F("content_base64"), _ETAG),
        errors=(
            *_GUARD,
            E(400, "invalid_param", "the path is a directory"),
            E(404, "not_found", "no such file", "FileNotFoundError"),
            E(413, "payload_too_large", "the file is over max_bytes"),
        ),
    ),
    "files_list": Schema(
        query=(
            F("path", doc="default: base_dir", example="."),
            F("depth", "integer", "1..10", default=1, minimum=1, maximum=10),
            F(
                "recursive",
                "boolean",
                "without depth: list 3 levels deep (agent-sandbox-server's form)",
                default=False,
            ),
            F("max_entries", "integer", "at most the policy's max_entries", minimum=1),
            F("hidden", "boolean", "include dot files", default=True),
        ),
        response=(
            F("path", doc="the directory listed"),
            F(
                "entries",
                "array",
                "[{name, path, type: file|directory|symlink, size, "
                "modified (ISO 8601 UTC)}]",
                items="object",
            ),
            F("truncated", "boolean", "max_entries (10000) was reached"),
        ),
        errors=(*_GUARD, E(404, "not_found", "no such directory", "FileNotFoundError")),
        notes="Entries the guard refuses, and links leading out of the boundary, are skipped.",
    ),
    "files_stat": Schema(
        query=(F("path", required=True, min_length=1, example="hello.txt"),),
        response=(
            F("name"),
            F("path"),
            F("type", enum=("file", "directory", "symlink", "unknown")),
            F("size", "integer"),
            F("permissions", doc='octal, e.g. "644"'),
            F("modified", doc="ISO 8601 UTC"),
            F("accessed", doc="ISO 8601 UTC"),
            F(
                "created",
                doc="ISO 8601 UTC: the inode's change time, as agent-sandbox-server reports it",
            ),
            F("exists", "boolean"),
            F("etag", doc="regular files only"),
        ),
        errors=_GUARD,
        notes="A missing path inside the boundary is 200 with exists: false.",
    ),
    "files_mkdir": Schema(
        body=(F("path", required=True, min_length=1, example="project/src"), _OWNER),
        response=(F("path"), F("created", "boolean")),
        errors=_WRITE_GUARD,
        notes="Parents are created; an existing directory is fine.",
    ),
    "files_delete": Schema(
        query=(
            F(
                "path",
                min_length=1,
                doc="what to delete (or 'path' in the body)",
                example="project/build",
            ),
        ),
        body=(
            F(
                "path",
                min_length=1,
                doc="accepted here too, for clients that send a body "
                "(given in both places, the two must be the same)",
            ),
        ),
        response=(F("path"), F("deleted", "boolean")),
        errors=(
            E(
                400,
                "duplicate_parameter",
                "path in the query and in the body with different values",
            ),
            *_WRITE_GUARD,
            E(403, "path_not_allowed", "the base dir itself"),
            E(404, "not_found", "no such path", "FileNotFoundError"),
        ),
        notes="Directories are removed recursively; a link is removed, not its target.",
    ),
    "files_move": Schema(
        body=(
            F("source", required=True, min_length=1, example="a.txt"),
            F("destination", required=True, min_length=1, example="b.txt"),
            F("overwrite", "boolean", default=False),
            _OWNER,
        ),
        response=(F("source"), F("destination")),
        errors=(
            *_WRITE_GUARD,
            E(403, "param_not_allowed", "overwrite refused by params.overwrite"),
            E(404, "not_found", "no such source", "FileNotFoundError"),
            E(409, "file_exists", "the destination exists and overwrite is false"),
        ),
        notes='Messages are prefixed "source:" or "destination:". Into a directory '
        "when the destination is one.",
    ),
    "files_search": Schema(
        body=(
            F("path", doc="default: base_dir"),
            F(
                "pattern",
                doc="fnmatch on names, recursive",
                required=True,
                min_length=1,
                example="*.py",
            ),
            F("max_results", "integer", "at most max_entries", default=1000, minimum=1),
            F(
                "max_depth",
                "integer",
                "levels searched (1: path's own entries)",
                minimum=1,
            ),
        ),
        response=(
            F("results", "array", "[{name, path}]", items="object"),
            F("timed_out", "boolean", "the 10 s walk limit (timeout_seconds) ran out"),
            F("truncated", "boolean"),
        ),
        errors=(*_GUARD, E(400, "invalid_param", "a pattern over 1024 characters")),
    ),
    "files_upload_stream": Schema(
        body=(
            _OWNER,
            F("path", required=True, min_length=1, example="data.bin"),
            F("content_base64", required=True, example="aGVsbG8K"),
            F("overwrite", "boolean", default=True),
            F("mode", doc='octal permissions, e.g. "644"'),
            _IF_MATCH,
        ),
        response=(F("path"), F("bytes", "integer"), _ETAG),
        errors=(*_WRITE_GUARD, *_WRITE),
        notes="Decoded in chunks into a temporary file in the target directory and "
        "renamed into place: a failed or oversize upload leaves the old file intact. "
        "Cap: ABX_MAX_UPLOAD_SIZE or max_bytes (100 MB).",
    ),
    "files_download_stream": Schema(
        query=(F("path", required=True, min_length=1, example="data.bin"),),
        response=(F("path"), _ETAG, F("content_base64"), F("bytes", "integer")),
        errors=(
            *_GUARD,
            E(404, "not_found", "no such file", "FileNotFoundError"),
            E(413, "payload_too_large", "the file is over max_bytes"),
        ),
        notes="The JSON is written as the file is read; `bytes` comes last.",
    ),
    "files_archive": Schema(
        body=(
            F(
                "paths",
                "array",
                "files and directories to pack",
                required=True,
                items="string",
                min_items=1,
                min_length=1,
                example=["project"],
            ),
            F("format", enum=("tar.gz", "zip"), default="tar.gz", example="tar.gz"),
        ),
        response=(F("content_base64"), F("format"), F("bytes", "integer")),
        errors=(
            *_GUARD,
            E(400, "invalid_param", "empty paths or an unknown format"),
            E(
                413,
                "payload_too_large",
                "over max_entries (10000 files) or max_bytes (100 MB)",
            ),
        ),
        notes="Members are stored relative to base_dir; symlinks are stored as links, "
        "never followed out of the boundary.",
    ),
    "files_extract": Schema(
        body=(
            F("content_base64", required=True, example="$(base64 -w0 project.tar.gz)"),
            F("destination", required=True, min_length=1, example="project"),
            F("format", enum=("tar.gz", "zip"), default="tar.gz", example="tar.gz"),
            F("overwrite", "boolean", default=False),
            _OWNER,
        ),
        response=(F("destination"), F("files", "integer"), F("bytes", "integer")),
        errors=(
            *_WRITE_GUARD,
            E(400, "invalid_param", "bad base64, unknown format or a broken archive"),
            E(
                403,
                "path_not_allowed",
                "a member would land outside the destination "
                "(absolute, .., links out, devices); nothing is written",
            ),
            E(409, "file_exists", "a member exists and overwrite is false"),
            E(413, "payload_too_large", "over max_entries or max_bytes"),
            E(
                507,
                "insufficient_storage",
                "the disk filled up; what was written is removed",
            ),
        ),
    ),
    "files_read_raw": Schema(
        query=(F("path", required=True, min_length=1, example="data.bin"),),
        headers=(
            F("Range", doc="one byte range: bytes=START-END"),
            F("If-None-Match", doc="an ETag: 304 when unchanged"),
            F("If-Range", doc="an ETag: the Range applies only while it matches"),
        ),
        produces="binary",
        response=(
            F("ETag", doc="header"),
            F("Last-Modified", doc="header"),
            F("Content-Length", doc="header"),
            F("Content-Range", doc="header, on 206"),
        ),
        errors=(
            *_GUARD,
            E(404, "not_found", "no such file", "FileNotFoundError"),
            E(
                413,
                "payload_too_large",
                "the file is over max_bytes (when the policy sets one)",
            ),
            E(416, "invalid_param", "the range is not satisfiable"),
        ),
        notes="application/octet-stream, streamed by a producer, never held in memory; "
        "206 for a Range, 304 for a matching If-None-Match.",
    ),
    "files_write_raw": Schema(
        query=(
            F("path", required=True, min_length=1, example="data.bin"),
            F("overwrite", "boolean", default=True),
            F("mode", doc='octal permissions, e.g. "644"'),
            _OWNER,
        ),
        headers=(
            F(
                "Content-Length",
                "integer",
                "required: the upload is refused from it when over max_bytes",
            ),
            F("If-Match", doc="write only if the file still has this ETag"),
        ),
        raw_body=True,
        response=(F("path"), F("bytes", "integer"), F("sha256"), _ETAG),
        errors=(*_WRITE_GUARD, *_WRITE),
        notes="The raw body is written as it arrives and renamed into place: the fast "
        "path for large files (no base64, no JSON). A cut connection loses the whole "
        "body; to carry a large file on from where a cut left it, use a resumable "
        "upload: files_uploads_create with the size, then files_uploads_append from "
        "the offset files_uploads_get reports.",
    ),
    "files_uploads_create": Schema(
        body=(
            F("path", required=True, min_length=1, example="big.bin"),
            F(
                "size",
                "integer",
                "the file's whole size: refused (413) over max_bytes",
                required=True,
                example=1048576,
                minimum=0,
            ),
            F("overwrite", "boolean", default=True),
            F("mode", doc='octal permissions, e.g. "644"'),
            _IF_MATCH,
            _OWNER,
        ),
        headers=(F("If-Match", doc="write only if the file still has this ETag"),),
        status=201,
        response=_UPLOAD_RECORD,
        errors=(
            *_WRITE_GUARD,
            *_WRITE,
            E(
                429,
                "too_many_sessions",
                "max_sessions (16) uploads are open",
                "ResourceError",
            ),
        ),
        notes="Every refusal happens here, before a byte is sent. The bytes go to "
        "a hidden staging file beside the target (.NAME.<hex>.upload; left out "
        "of listings, searches and archives), renamed "
        "into place by the append that completes it; an upload idle for "
        "idle_timeout_seconds (3600) is dropped with its staging file, as on "
        "DELETE and when the daemon stops.",
    ),
    "files_uploads_get": Schema(
        response=_UPLOAD_RECORD,
        errors=(_NO_UPLOAD,),
        notes="offset counts the bytes written to the staging file: after a cut "
        "connection, the append to send next starts there.",
    ),
    "files_uploads_append": Schema(
        query=(
            F(
                "offset",
                "integer",
                "where this body starts: the upload's current offset",
                required=True,
                example=0,
                minimum=0,
            ),
        ),
        headers=(
            F(
                "Content-Length",
                "integer",
                "required: offset + Content-Length may not pass size",
            ),
        ),
        raw_body=True,
        response=(
            F("upload_id", doc="while incomplete"),
            F("offset", "integer", "while incomplete: bytes written so far"),
            F("size", "integer", "while incomplete"),
            F("path", doc="when complete: the file, renamed into place"),
            F("bytes", "integer", "when complete"),
            F("sha256", doc="when complete: of the whole file"),
            F("etag", doc="when complete: the file's version, for If-Match"),
            F("complete", "boolean", "whether the file is in place"),
        ),
        errors=(
            _NO_UPLOAD,
            E(
                400,
                "invalid_param",
                "offset is not the upload's offset (the current one is in the "
                "error's offset field); nothing is written",
            ),
            E(
                412,
                "precondition_failed",
                "at completion, the file no longer has the If-Match ETag "
                "(the upload is dropped)",
            ),
            E(
                409,
                "file_exists",
                "at completion, a file appeared and overwrite is false "
                "(the upload is dropped)",
                "FileExistsError",
            ),
            E(413, "payload_too_large", "offset + Content-Length is over size"),
            E(
                429,
                "concurrency_limited",
                "another append to this upload is running (retry_after 1)",
            ),
            E(
                507,
                "insufficient_storage",
                "the disk filled up; the upload is dropped",
            ),
        ),
        notes="The raw body is written as it arrives. A cut connection keeps the "
        "bytes that arrived: GET the upload and send the rest from its offset. "
        "The append that reaches size renames the file into place and answers "
        "as POST /files/raw does, with complete: true.",
    ),
    "files_uploads_delete": Schema(
        response=(F("upload_id"), F("deleted", "boolean")),
        errors=(_NO_UPLOAD,),
        notes="The staging file is removed; the target is untouched.",
    ),
    "files_watch": Schema(
        query=(
            F("path", doc="default: base_dir", example="."),
            F("recursive", "boolean", default=False),
            F(
                "timeout",
                "number",
                "seconds: agent-sandbox-server's form, a window ending with end "
                "(at most max_duration_seconds, default 300)",
            ),
            F(
                "interval",
                "number",
                "seconds: agent-sandbox-server's form (its polling period)",
            ),
            *_RESUME,
            _QUERY_TOKEN,
        ),
        headers=(_LAST_EVENT_ID,),
        produces="sse",
        events=(
            Event("created", '{"event", "path", "type"}'),
            Event("modified", '{"event", "path", "type"}'),
            Event("deleted", '{"event", "path", "type"}'),
            Event("moved", '{"event", "path", "type", "dest"}'),
            _GAP,
            Event("ready", '{"path"}: agent-sandbox-server\'s form, first'),
            Event(
                "change",
                '{"type": created|modified|deleted, "path", "is_dir"}: agent-sandbox-server\'s form',
            ),
            Event(
                "end",
                '{"reason": "timeout"|"closed"}: agent-sandbox-server\'s form, last',
            ),
        ),
        errors=(*_GUARD, E(404, "not_found", "no such directory")),
        notes="inotify, debounced; events for paths the caller may not see are dropped. "
        "Open-ended and resumable (see docs/protocols.md) unless timeout or interval "
        "is given: then agent-sandbox-server's events, for a window (a move is deleted + created).",
    ),
    # -- process ---------------------------------------------------------------
    "shell": Schema(
        body=(*_COMMAND, *_CHILD, F("timeout", "number", "seconds", default=300)),
        response=(
            F("stdout"),
            F("stderr"),
            F("exit_code", "integer", "-N when killed by signal N"),
            F(
                "truncated",
                "boolean",
                "output went over max_output_bytes (head and tail kept)",
            ),
            F("dropped_bytes", "integer"),
        ),
        errors=(
            *_CHILD_ERRORS,
            E(
                500,
                "timeout",
                "past timeout: the group was killed (output so far included); "
                "the command ran, so do not retry it",
                "TimeoutError",
            ),
            E(
                500,
                "idle_timeout",
                "no output for idle_timeout seconds (the command ran: do not retry)",
                "TimeoutError",
            ),
        ),
        notes="stdin is /dev/null. Output per stream is capped at max_output_bytes "
        "(10 MiB), keeping head and tail. A timeout is 500 (as the agent-sandbox "
        "server answers it), but "
        "the command did run: a client must not retry on it as on a server "
        "failure (check `code`).",
    ),
    "shell_stream": Schema(
        body=(
            *_COMMAND,
            *_CHILD,
            F("timeout", "number", "seconds", default=300),
            F(
                "output",
                doc="lines: one event per line, as text; bytes: one event per "
                "read, the raw bytes in data_base64 (byte-exact)",
                enum=("lines", "bytes"),
                default="lines",
            ),
            F(
                "stdin_base64",
                doc="bytes the command reads on its stdin, then end of file "
                "(default: stdin is /dev/null)",
            ),
        ),
        produces="sse",
        events=(
            Event(
                "stdout",
                '{"data": one line without its newline}, or with output=bytes '
                '{"data_base64": the bytes of one read}',
            ),
            Event("stderr", "as stdout"),
            Event(
                "truncated",
                '{"stream", "dropped_bytes"}: the output went over max_output_bytes',
            ),
            Event(
                "error",
                '{"error": "timeout", "type", "code", "message"}: TimeoutError '
                "with code timeout or idle_timeout, sent before exit",
            ),
            Event("exit", '{"exit_code"}: always last'),
        ),
        errors=_CHILD_ERRORS,
        notes="stdout and stderr are interleaved in the order produced. Not resumable: "
        "a client that disconnects kills the child's group. Invalid requests get a "
        "JSON error, not a stream.",
    ),
    "process_start": Schema(
        body=(
            *_COMMAND,
            *_CHILD,
            F("stdin", "boolean", "keep a stdin pipe for process_stdin", default=False),
            F(
                "capture_output",
                "boolean",
                "true: output may be read with since/wait (agent-sandbox-server's form); "
                "false: process_output refuses it (409); unset: the after form only",
            ),
            F("tag", doc="a free label; process_list filters on it"),
            F("timeout", "number", "seconds (default: none)"),
        ),
        response=(F("pid", "integer"), F("command"), F("tag", nullable=True)),
        errors=(
            *_CHILD_ERRORS,
            E(
                429,
                "too_many_processes",
                "max_processes (100) are running",
                "ResourceError",
            ),
        ),
    ),
    "process_list": Schema(
        query=(F("tag", doc="only processes with this tag"),),
        response=(
            F(
                "processes",
                "array",
                "[{" + ", ".join(f.name for f in _PROC_FIELDS) + "}]",
                items="object",
            ),
        ),
        notes="Exited processes stay listed (the 100 most recent).",
    ),
    "process_detail": Schema(
        response=_PROC_FIELDS,
        errors=(
            E(400, "invalid_param", "pid is not a positive integer"),
            E(404, "not_found", "not a process this daemon manages", "NotFoundError"),
        ),
    ),
    "process_signal": Schema(
        body=(
            F(
                "signal",
                "any",
                "a number or a name (TERM, SIGINT)",
                required=True,
                example=15,
            ),
        ),
        response=(F("pid", "integer"), F("signal", "integer")),
        errors=(
            E(400, "invalid_param", "pid or signal malformed"),
            E(
                400,
                "signal_not_allowed",
                "outside params.allowed_signals (2, 9, 15, 18, 20)",
            ),
            E(
                403,
                "param_not_allowed",
                "pid 1 or the daemon itself",
                "PermissionError",
            ),
            E(404, "not_found", "not managed, or already exited", "NotFoundError"),
        ),
        notes="Sent to the process group (and descendants that left it).",
    ),
    "process_output": Schema(
        query=(
            *_RESUME,
            F(
                "since",
                "integer",
                "agent-sandbox-server's cursor: events from this seq on; next is the seq "
                "to pass next time (needs capture_output: true)",
                minimum=0,
            ),
            F(
                "wait",
                "number",
                "hold the answer until there is output, it ends, or this many "
                "seconds pass (at most 30)",
                default=0,
                minimum=0,
            ),
            F(
                "follow",
                "boolean",
                "stream as SSE instead of one page",
                default=False,
                example="true",
            ),
            _QUERY_TOKEN_FOLLOW,
        ),
        headers=(_LAST_EVENT_ID,),
        response=(
            F("pid", "integer"),
            F("state"),
            F("exit_code", "integer", "null while running", nullable=True),
            F(
                "events",
                "array",
                "[{seq, stream: stdout|stderr, data}]",
                items="object",
            ),
            F(
                "next",
                "integer",
                "with after: the last seq returned (or after); with since: the "
                "since of the next read",
            ),
            F("dropped", "boolean", "some output is no longer kept"),
            F("dropped_bytes", "integer"),
        ),
        produces="json",
        events=(
            Event("stdout", '{"data": a chunk as read}'),
            Event("stderr", '{"data": a chunk as read}'),
            Event("exit", '{"exit_code"}'),
            _GAP,
        ),
        errors=(
            E(400, "invalid_param", "pid, after, since, wait or follow malformed"),
            E(404, "not_found", "not a process this daemon manages", "NotFoundError"),
            E(
                409,
                "output_not_captured",
                "started with capture_output false, or read with since when "
                "it was not started with capture_output true",
                "ConflictError",
            ),
        ),
        notes="follow=true answers SSE with the stream contract (id: SEQ, "
        "Last-Event-ID, gap, exit last); see docs/protocols.md.",
    ),
    "process_stdin": Schema(
        body=(
            F("data", doc="text to write", default="", example="hello\n"),
            F("data_base64", doc="bytes to write, base64 (instead of data)"),
            F("eof", "boolean", "close stdin after writing", default=False),
        ),
        response=(
            F("pid", "integer"),
            F("written", "integer", "bytes queued"),
            F("closed", "boolean", "stdin was closed after them (eof)"),
            F("bytes", "integer", "written, by its older name"),
        ),
        errors=(
            E(
                400,
                "invalid_param",
                "pid, data, data_base64 or eof malformed, or both data forms",
            ),
            E(
                409,
                "stdin_closed",
                'no stdin pipe (start with "stdin": true) or it was closed',
                "ConflictError",
            ),
            E(404, "not_found", "not managed, or exited", "NotFoundError"),
            E(429, "rate_limited", "the process is not reading (4 MiB queued)"),
        ),
    ),
    # -- terminal --------------------------------------------------------------
    "pty_create_session": Schema(
        body=(
            F("cols", "integer", default=80, example=120),
            F("rows", "integer", default=24, example=40),
            F("shell", doc="one of params.shells; default $SHELL, bash or sh"),
            F("cwd", doc="working directory (guarded; default base_dir)"),
            F("env", "object", "extra environment variables"),
            F("user", "any", "run as this user when the daemon is root"),
        ),
        response=(
            F("session_id"),
            F("ws_url", doc="ws://HOST:PTY_PORT/pty?session_id=ID"),
            F("pid", "integer"),
        ),
        errors=(
            E(400, "invalid_param", "cols/rows not integers in range, bad env or user"),
            E(403, "param_not_allowed", "shell or user refused by params"),
            *_GUARD[1:],
            E(429, "too_many_sessions", "max_sessions (10) are open", "RuntimeError"),
            E(500, "internal", "the PTY could not be created", "OSError"),
        ),
        notes="TERM=xterm-256color; the shell runs in its own session. Closed after "
        "idle_timeout_seconds (1800) with no client and no I/O.",
    ),
    "pty_list_sessions": Schema(
        response=(
            F(
                "sessions",
                "array",
                "[{id, pid, created_at, cols, rows, alive, clients, ws_url}]",
                items="object",
            ),
        ),
        notes="Only the caller's sessions (all of them for a * identity); dead ones "
        "are reaped first.",
    ),
    "pty_detail": Schema(
        response=_PTY_SESSION,
        errors=(E(404, "not_found", "no such session (or another identity's)"),),
    ),
    "pty_resize": Schema(
        body=(
            F("cols", "integer", required=True, example=132),
            F("rows", "integer", required=True, example=43),
        ),
        response=_PTY_SESSION,
        errors=(
            E(400, "invalid_param", "cols/rows missing or out of range"),
            E(404, "not_found", "no such session"),
        ),
    ),
    "pty_delete_session": Schema(
        response=(F("status", doc='"closed"'), F("session_id")),
        errors=(E(404, "not_found", "no such session"),),
        notes="Answers once the shell's whole process tree has ended.",
    ),
    "pty_connect": Schema(
        query=(
            F("session_id", required=True, example="$SESSION"),
            F("offset", "integer", "replay only output after this byte offset"),
            F("access_token", doc="the token, for browsers (they cannot set headers)"),
        ),
        produces="websocket",
        errors=(
            E(401, "unauthorized", "handshake refused: token missing or wrong"),
            E(403, "missing_scope", "handshake refused: scope, Origin or Host"),
            E(404, "endpoint_disabled", "handshake refused: pty_connect is off"),
        ),
        notes="On the PTY port (9001), not the HTTP port. Close 1008 for a missing or "
        "unknown session_id, 4008 for a client too slow to read. Messages: "
        "docs/protocols.md.",
    ),
    # -- e2b -------------------------------------------------------------------
    "e2b": Schema(
        produces="connect",
        errors=(
            E(401, "unauthorized", "Connect unauthenticated: token missing or wrong"),
            E(
                403,
                "missing_scope",
                "Connect permission_denied: the mapped endpoint's scope",
            ),
            E(404, "endpoint_disabled", "the e2b endpoint is off: nothing listens"),
        ),
        notes="On the E2B port (--e2b-port, envd's 49983), not the HTTP port: envd's "
        "Connect RPC services process.Process and filesystem.Filesystem and its REST "
        "routes, each call governed as the sandboxd endpoint it maps to. Table: "
        "docs/e2b.md.",
    ),
    # -- system ----------------------------------------------------------------
    "system_info": Schema(
        response=(
            F("os"),
            F("arch"),
            F("cpu_count", "integer"),
            F("memory_total_mb", "integer"),
            F("memory_available_mb", "integer"),
            F("disk_total_gb", "number"),
            F("disk_free_gb", "number"),
            F("python_version"),
            F("hostname"),
            F("memory_source", doc="cgroup or host: where memory figures came from"),
            F("cpu_source", doc="cgroup or host"),
            F("cpu_limit", "number", "a fractional CPU quota, or null", nullable=True),
        ),
        notes="Disk is the base dir's file system; memory and CPU are the container's "
        "limits when it has them.",
    ),
    "env_get": Schema(
        query=(F("filter", doc="comma-separated names", example="PATH,LANG"),),
        response=(F("variables", "object", "{name: value}"),),
        notes="Names holding TOKEN, SECRET, KEY, PASSWORD or CREDENTIAL (any case), "
        "ABX_SERVER_*, token_env names and params.env_deny are never returned.",
    ),
    "env_set": Schema(
        body=(
            F(
                "vars",
                "object",
                "{name: value}",
                required=True,
                example={"LANG": "C.UTF-8"},
            ),
        ),
        response=(F("updated", "array", "sorted names", items="string"),),
        errors=(
            E(
                400,
                "invalid_param",
                "not an object, an empty name, = or NUL in a name, NUL in a value",
            ),
            E(
                403,
                "protected_variable",
                "PATH, HOME, USER, SHELL, ABX_SERVER_*, token_env "
                "names, deny_vars or outside allow_vars (variable names it)",
            ),
        ),
        notes="All or nothing. Later children inherit the variables.",
    ),
    "ports": Schema(
        response=(
            F(
                "listening",
                "array",
                "[{port, protocol: tcp|tcp6, address, pid}]",
                items="object",
            ),
        ),
        notes="From /proc/net/tcp{,6}; pid is null where the owner's fds are unreadable.",
    ),
    "packages": Schema(
        query=(F("manager", enum=("pip", "npm"), default="pip", example="pip"),),
        response=(
            F("manager"),
            F("packages", "array", "[{name, version}] sorted by name", items="object"),
            F("interpreter", doc="the program that answered, or null", nullable=True),
        ),
        errors=(
            E(400, "invalid_param", "another manager"),
            E(500, "timeout", "the tool did not answer in time", "TimeoutError"),
            E(500, "internal", "the tool failed"),
        ),
        notes="A missing tool is an empty list.",
    ),
    "metrics": Schema(
        produces="prometheus",
        notes="Prometheus text format: `sandboxd_requests_total{endpoint,door,status,code}`, "
        "`sandboxd_request_duration_seconds` (histogram by endpoint and door), "
        "`sandboxd_streams_active`, `sandboxd_pty_sessions_active`, "
        "`sandboxd_background_processes_active`, `sandboxd_agent_sessions_active`, "
        "`sandboxd_connections_active{door}`, `sandboxd_connections_refused_total{door}`, "
        "`sandboxd_children_timed_out_total{reason}`, `sandboxd_policy_info{revision,preset}`, "
        "`sandboxd_policy_reloads_total{result}`. No label carries a path, a command or a token. "
        "Not the sandbox's load and memory: that is `GET /system/metrics`.",
    ),
    "system_metrics": Schema(
        response=(
            F("cpu_load_1m", "number"),
            F("cpu_load_5m", "number"),
            F("cpu_load_15m", "number"),
            F("memory_used_mb", "integer"),
            F("memory_total_mb", "integer"),
            F("memory_percent", "number"),
            F("disk_used_gb", "number"),
            F("disk_total_gb", "number"),
            F("disk_percent", "number"),
            F("uptime_seconds", "number", "since the daemon started"),
            F("memory_source"),
        ),
    ),
    # -- dev_tools -------------------------------------------------------------
    "code_run": Schema(
        body=(
            F(
                "language",
                enum=("python", "node", "bash"),
                required=True,
                example="python",
            ),
            F("code", required=True, example="print(6 * 7)"),
            F("timeout", "number", "seconds", default=30),
            *_CHILD,
        ),
        response=(
            F("stdout"),
            F("stderr"),
            F("exit_code", "integer"),
            F("language"),
            F("execution_time_ms", "number"),
        ),
        errors=(
            E(400, "invalid_param", "bad language, code, cwd, env or timeout"),
            E(403, "param_not_allowed", "language outside params.languages"),
            *_GUARD[1:],
            E(408, "timeout", "past timeout: the group was killed", "TimeoutError"),
            E(
                408,
                "idle_timeout",
                "no output for idle_timeout seconds: the group was killed",
                "TimeoutError",
            ),
            E(
                413,
                "payload_too_large",
                "code over 128 KiB (upload a file, use /shell)",
            ),
            E(500, "internal", "the runtime is missing", "FileNotFoundError"),
        ),
    ),
    "git_status": Schema(
        query=(F("path", doc="the repository", default=".", example="."),),
        response=(
            F("branch"),
            F("clean", "boolean"),
            F("ahead", "integer"),
            F("behind", "integer"),
            F(
                "files",
                "array",
                "[{path, status: modified|added|deleted|renamed|untracked|"
                "copied|unmerged}]",
                items="object",
            ),
        ),
        errors=(
            *_GUARD,
            E(400, "invalid_path", ".. or NUL in path or file"),
            E(400, "git_error", "git failed (not a repository ...)", "GitError"),
            E(408, "timeout", "git ran past its limit", "TimeoutError"),
            E(500, "internal", "git is not installed", "FileNotFoundError"),
        ),
        notes="git runs with repository-configured commands disabled (fsmonitor, "
        "external diff, textconv, hooks).",
    ),
    "git_diff": Schema(
        query=(
            F("path", doc="the repository", default=".", example="."),
            F("staged", "boolean", default=False),
            F("file", doc="limit the diff to one file"),
        ),
        response=(
            F("diff", doc='truncated at 1 MB with "... (truncated at 1MB)"'),
            F("stats", "object", "{files_changed, insertions, deletions}"),
        ),
        errors=(
            *_GUARD,
            E(400, "invalid_path", ".. or NUL in path or file"),
            E(400, "git_error", "git failed (not a repository ...)", "GitError"),
            E(408, "timeout", "git ran past its limit", "TimeoutError"),
            E(500, "internal", "git is not installed", "FileNotFoundError"),
        ),
    ),
    # -- git (SPEC §24) ----------------------------------------------------------
    "git_clone": Schema(
        body=(
            F(
                "url",
                required=True,
                doc="https (ssh when params.git_protocols lists it)",
                example="https://github.com/octocat/Hello-World.git",
            ),
            F(
                "path",
                required=True,
                doc="the new directory (guarded; absent or empty)",
                example="hello",
            ),
            F("branch", doc="the branch to check out"),
            F("commit", doc="check this commit out (detached) after the clone"),
            F("depth", "integer", "a shallow clone of this many commits", minimum=1),
            F("single_branch", "boolean", default=False),
            F("filter", doc="a partial clone", enum=("blob:none", "tree:0")),
            F(
                "recurse_submodules",
                "boolean",
                "refused when true: submodule URLs escape the remote policy",
                default=False,
            ),
            *_GIT_REMOTE_FIELDS,
            F(
                "user",
                "any",
                "run git as this user (name or uid) when the daemon is root",
            ),
        ),
        response=(*_GIT_JOB_ANSWER, F("path"), F("head", "object", "{branch, commit}")),
        errors=(
            *_GIT_REMOTE_ERRORS,
            E(409, "file_exists", "path exists and is not an empty directory"),
        ),
        status=202,
        notes=_GIT_JOB_NOTES,
    ),
    "git_fetch": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("remote", doc="the remote's name", default="origin"),
            F("refspec", doc="what to fetch (no leading '-' or '+')"),
            F("prune", "boolean", default=False),
            *_GIT_REMOTE_FIELDS,
        ),
        response=(*_GIT_JOB_ANSWER, F("remote")),
        errors=_GIT_REMOTE_ERRORS,
        status=202,
        notes=_GIT_JOB_NOTES,
    ),
    "git_pull": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("remote", default="origin"),
            F("branch", doc="the remote branch (default: the upstream)"),
            F(
                "ff_only",
                "boolean",
                "refuse anything but a fast-forward (409 non_fast_forward)",
                default=True,
            ),
            F("rebase", "boolean", default=False),
            *_GIT_REMOTE_FIELDS,
        ),
        response=(*_GIT_JOB_ANSWER, F("branch"), F("old"), F("new")),
        errors=(
            *_GIT_REMOTE_ERRORS,
            E(409, "git_conflict", "kind non_fast_forward or merge_conflict"),
        ),
        status=202,
        notes=_GIT_JOB_NOTES,
    ),
    "git_push": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("remote", default="origin"),
            F("branch", doc="the branch to push (default: the current one)"),
            F("set_upstream", "boolean", default=False),
            F(
                "force",
                "boolean",
                "--force-with-lease, only when params.allow_force_push",
                default=False,
            ),
            F(
                "tags",
                "boolean",
                "push annotated tags that point into the branch",
                default=False,
            ),
            *_GIT_REMOTE_FIELDS,
        ),
        response=(
            *_GIT_JOB_ANSWER,
            F(
                "updated",
                "array",
                "[{ref, old, new, status: ok|rejected|up_to_date, reason?}]",
                items="object",
            ),
            F(
                "remote_verified",
                "boolean",
                "the remote's ref was read back and is the pushed commit",
            ),
        ),
        errors=(
            *_GIT_REMOTE_ERRORS,
            E(403, "protected_branch", "the branch matches params.protected_branches"),
            E(403, "param_not_allowed", "force without params.allow_force_push"),
            E(409, "git_conflict", "kind non_fast_forward (with updated)"),
        ),
        status=202,
        notes=_GIT_JOB_NOTES,
    ),
    "git_jobs_list": Schema(
        response=(F("jobs", "array", "job objects, see git_job_get", items="object"),)
    ),
    "git_job_get": Schema(
        response=(
            F("job_id"),
            F("op", enum=("clone", "fetch", "pull", "push")),
            F("state", enum=("running", "done", "error", "cancelled")),
            F("path"),
            F("started_at", "number"),
            F("ended_at", "number", nullable=True),
            F("progress", "object", "{phase, percent, objects, bytes}"),
            F("events_url"),
            F("credential", doc="the named credential used, or inline"),
            F("process", "object", "{pid} of git"),
            F("result", "object", "the call's result once done"),
            F("error", "object", "{code, kind, message, status} once failed"),
        ),
        errors=(E(404, "not_found", "no such job (finished jobs are kept a while)"),),
    ),
    "git_job_cancel": Schema(
        response=(F("job_id"), F("state", enum=("cancelled", "done", "error"))),
        errors=(E(404, "not_found", "no such job"),),
        notes="Answers once git and its helpers (git-remote-https) are gone.",
    ),
    "git_job_events": Schema(
        query=(*_RESUME, _QUERY_TOKEN),
        headers=(_LAST_EVENT_ID,),
        produces="sse",
        events=(
            _GAP,
            Event(
                "progress",
                "{phase, percent, objects, total, bytes} parsed from --progress",
            ),
            Event("line", "{data}: another line of git's stderr (secrets redacted)"),
            Event("exit", "{state, result?|error?}: always last"),
        ),
        errors=(E(404, "not_found", "no such job"),),
    ),
    "git_init": Schema(
        body=(
            F(
                "path",
                required=True,
                doc="the repository directory (created)",
                example="repo",
            ),
            _GIT_USER,
            F("initial_branch", default="main"),
            F("bare", "boolean", default=False),
        ),
        response=(F("path"), F("initial_branch"), F("bare", "boolean")),
        errors=_GIT_LOCAL_ERRORS,
    ),
    "git_add": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F(
                "files",
                "array",
                "paths in the work tree (literal, guarded)",
                items="string",
            ),
            F("all", "boolean", "stage every change (git add -A)", default=False),
        ),
        response=(F("staged", "array", items="string"),),
        errors=_GIT_LOCAL_ERRORS,
    ),
    "git_commit": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("message", required=True, min_length=1, example="Fix the parser"),
            F(
                "author",
                "object",
                "{name, email} (default: policy git.author, then repo config)",
            ),
            F("allow_empty", "boolean", default=False),
            F("amend", "boolean", default=False),
            F("files", "array", "commit only these paths", items="string"),
            F("signoff", "boolean", default=False),
        ),
        response=(
            F("commit"),
            F("branch", nullable=True),
            F("summary", "object", "{files_changed, insertions, deletions}"),
        ),
        errors=(
            *_GIT_LOCAL_ERRORS,
            E(403, "protected_branch", "HEAD is on a protected branch"),
        ),
    ),
    "git_log": Schema(
        query=(
            _GIT_PATH,
            _GIT_USER,
            F("ref", default="HEAD"),
            F("max", "integer", default=50, minimum=1, maximum=1000),
            F("file", doc="only commits touching this path"),
        ),
        response=(
            F(
                "commits",
                "array",
                "[{commit, parents, author: {name, email, time}, committer, subject, body}]",
                items="object",
            ),
        ),
        errors=_GIT_LOCAL_ERRORS,
    ),
    "git_show": Schema(
        query=(_GIT_PATH, _GIT_USER, F("rev", default="HEAD")),
        response=(
            F("commit"),
            F("parents", "array", items="string"),
            F("author", "object"),
            F("committer", "object"),
            F("subject"),
            F("body"),
            F("diff", doc='truncated at 1 MB with "... (truncated at 1MB)"'),
            F("truncated", "boolean"),
        ),
        errors=_GIT_LOCAL_ERRORS,
    ),
    "git_branches": Schema(
        query=(_GIT_PATH, _GIT_USER),
        response=(
            F("current", nullable=True),
            F("detached", "boolean"),
            F(
                "branches",
                "array",
                "[{name, commit, upstream, ahead, behind, remote, current}]",
                items="object",
            ),
        ),
        errors=_GIT_LOCAL_ERRORS,
    ),
    "git_branch_create": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("name", required=True, min_length=1, example="feature"),
            F("start_point", doc="a commit or branch (default HEAD)"),
            F("checkout", "boolean", default=False),
        ),
        response=(F("name"), F("commit")),
        errors=(*_GIT_LOCAL_ERRORS, E(409, "git_conflict", "kind branch_exists")),
    ),
    "git_branch_delete": Schema(
        query=(
            _GIT_PATH,
            _GIT_USER,
            F("name", required=True, min_length=1, example="feature"),
            F("force", "boolean", "delete even if not merged", default=False),
        ),
        response=(F("name"), F("deleted", "boolean")),
        errors=(
            *_GIT_LOCAL_ERRORS,
            E(403, "protected_branch", "the branch matches params.protected_branches"),
            E(409, "git_conflict", "kind not_merged or current_branch"),
        ),
    ),
    "git_checkout": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("ref", required=True, min_length=1, example="main"),
            F(
                "create",
                "boolean",
                "create the branch ref (checkout -b)",
                default=False,
            ),
            F("force", "boolean", "throw away local changes", default=False),
        ),
        response=(F("branch", nullable=True), F("commit"), F("detached", "boolean")),
        errors=(
            *_GIT_LOCAL_ERRORS,
            E(409, "git_conflict", "kind dirty_tree or branch_exists"),
        ),
    ),
    "git_reset": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("mode", default="mixed", enum=("soft", "mixed", "hard", "merge", "keep")),
            F("target", default="HEAD"),
            F("files", "array", "unstage these paths only", items="string"),
        ),
        response=(F("mode"), F("branch", nullable=True), F("commit")),
        errors=(
            *_GIT_LOCAL_ERRORS,
            E(403, "param_not_allowed", "mode hard without params.allow_hard_reset"),
        ),
    ),
    "git_restore": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F(
                "files",
                "array",
                required=True,
                items="string",
                min_items=1,
                example=["a.txt"],
            ),
            F("staged", "boolean", default=False),
            F("worktree", "boolean", "default: true unless staged"),
            F("source", doc="restore from this commit"),
        ),
        response=(
            F("restored", "array", items="string"),
            F("staged", "boolean"),
            F("worktree", "boolean"),
        ),
        errors=_GIT_LOCAL_ERRORS,
    ),
    "git_stash": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("action", default="push", enum=("push", "pop", "list", "drop")),
            F("message", doc="for push"),
            F(
                "index",
                "integer",
                "for pop and drop: stash@{index}",
                default=0,
                minimum=0,
            ),
        ),
        response=(
            F("action"),
            F("stashes", "array", "[{ref, commit, message}]", items="object"),
        ),
        errors=(
            *_GIT_LOCAL_ERRORS,
            E(409, "git_conflict", "kind no_local_changes, merge_conflict"),
        ),
    ),
    "git_remotes": Schema(
        query=(_GIT_PATH, _GIT_USER),
        response=(
            F(
                "remotes",
                "array",
                "[{name, fetch_url, push_url}] (userinfo redacted)",
                items="object",
            ),
        ),
        errors=_GIT_LOCAL_ERRORS,
    ),
    "git_remote_add": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("name", required=True, min_length=1, example="origin"),
            F(
                "url",
                required=True,
                example="https://github.com/octocat/Hello-World.git",
            ),
        ),
        response=(F("name"), F("fetch_url")),
        errors=(*_GIT_LOCAL_ERRORS, *_GIT_URL_ERRORS),
    ),
    "git_config_get": Schema(
        query=(
            _GIT_PATH,
            _GIT_USER,
            F("key", doc="one of params.git_config_keys (default: all of them)"),
        ),
        response=(F("values", "object", "key: value or null"),),
        errors=(
            *_GIT_LOCAL_ERRORS,
            E(403, "param_not_allowed", "a key outside params.git_config_keys"),
        ),
    ),
    "git_config_set": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("key", required=True, min_length=1, example="user.name"),
            F("value", required=True, min_length=1, example="Ada"),
        ),
        response=(F("key"), F("value")),
        errors=(
            *_GIT_LOCAL_ERRORS,
            E(403, "param_not_allowed", "a key outside params.git_config_keys"),
        ),
        notes="Local scope only; keys that can run code (core.sshCommand, *.helper, alias.*) are never allowed.",
    ),
    # -- browser ---------------------------------------------------------------
    "browser_navigate": Schema(
        body=(
            F("url", required=True, example="https://example.com"),
            F(
                "wait_until",
                enum=("load", "domcontentloaded", "networkidle", "commit"),
                default="load",
            ),
            _timeout(30000),
        ),
        response=(F("url"), F("title"), F("status", "integer")),
        errors=(E(400, "invalid_param", "bad url, wait_until or timeout"), *_BROWSER),
        notes="Only http and https unless the policy allows another scheme. With "
        "block_private_networks, localhost, localhost. and *.localhost are refused by "
        "name, a name that does not resolve counts as private, and every connection the "
        "page opens (redirects, subresources, fetches, WebSockets) goes to the address "
        "the worker resolved and checked.",
    ),
    "browser_screenshot": Schema(
        body=(
            F("full_page", "boolean", default=False),
            F("selector", doc="an element to capture"),
            F("type", enum=("png", "jpeg"), default="png"),
            F(
                "format",
                enum=("png", "jpeg"),
                doc="agent-sandbox-server's name for type",
            ),
            F("quality", "integer", "jpeg only, 0..100"),
            _timeout(30000),
        ),
        response=(F("image_base64"), F("width", "integer"), F("height", "integer")),
        errors=(
            E(400, "invalid_param", "bad type or format, quality or timeout"),
            *_BROWSER,
        ),
    ),
    "browser_content": Schema(
        query=(
            F("type", enum=("html", "text"), default="html", example="text"),
            F("timeout", "integer", "milliseconds", default=30000),
        ),
        response=(F("content"), F("url"), F("title")),
        errors=(E(400, "invalid_param", "bad type"), *_BROWSER),
    ),
    "browser_click": Schema(
        body=(F("selector", required=True, example="button#submit"), _timeout(5000)),
        response=(F("clicked", "boolean"), F("selector")),
        errors=(E(400, "invalid_param", "missing selector"), *_BROWSER),
    ),
    "browser_type": Schema(
        body=(
            F("selector", required=True, example="input[name=q]"),
            F("text", required=True, example="sandboxd"),
            F("clear", "boolean", "empty the field first", default=False),
            F("delay", "number", "milliseconds between keys", default=0),
            _timeout(5000),
        ),
        response=(F("typed", "boolean"), F("selector"), F("text")),
        errors=(
            E(400, "invalid_param", "missing selector or text, or too slow to type"),
            *_BROWSER,
        ),
    ),
    "browser_evaluate": Schema(
        body=(F("script", required=True, example="document.title"), _timeout(10000)),
        response=(F("result", "any"),),
        errors=(E(400, "invalid_param", "missing script"), *_BROWSER),
    ),
    "browser_pdf": Schema(
        body=(
            F("format", doc="paper: Letter, Legal, A0..A6 ...", default="A4"),
            F("landscape", "boolean", default=False),
            _timeout(30000),
        ),
        response=(F("pdf_base64"), F("pages", "integer")),
        errors=(E(400, "invalid_param", "unknown format"), *_BROWSER),
    ),
    "browser_console": Schema(
        query=(F("timeout", "integer", "milliseconds", default=5000),),
        response=(F("logs", "array", "[{type, text, timestamp}]", items="object"),),
        errors=_BROWSER,
        notes="The buffer (1000 entries) is cleared by each read.",
    ),
    # -- code contexts ----------------------------------------------------------
    "code_kernels": Schema(
        response=(
            F(
                "kernels",
                "array",
                "[{name, display_name, language, argv0, interrupt_mode, source, allowed}]",
                items="object",
            ),
            F("default", doc="the kernel a context gets when none is named"),
        ),
    ),
    "code_contexts_list": Schema(
        response=(F("contexts", "array", "context documents", items="object"),),
    ),
    "code_context_create": Schema(
        body=(
            F(
                "kernel",
                doc="a kernelspec name allowed by params.kernels",
                default="python3",
            ),
            F("language", doc="pick the first allowed kernel of this language"),
            F("cwd", doc="guarded; default base_dir"),
            F("env", "object", "environment of the kernel (env_deny applies)"),
            F("user", "any", "who the kernel runs as (params.users)"),
            F("name", doc="a label"),
        ),
        status=201,
        response=_CONTEXT,
        errors=(
            E(400, "invalid_param", "unknown or disallowed kernel (body: allowed)"),
            E(403, "param_not_allowed", "a refused user"),
            E(
                429,
                "too_many_contexts",
                "max_contexts or max_contexts_per_identity",
                "ResourceError",
            ),
            E(
                504,
                "timeout",
                "the kernel did not answer within start_timeout_seconds",
                "TimeoutError",
            ),
        ),
        notes="Waits for the kernel's kernel_info reply. The kernel runs in its own "
        "process group, as the request's user, without the daemon's secrets.",
    ),
    "code_context_get": Schema(
        response=(
            *_CONTEXT,
            F("current_execution", nullable=True),
            F("queued", "array", items="string"),
            F("exit_code", "integer", nullable=True),
        ),
        errors=(_NO_CONTEXT,),
    ),
    "code_context_delete": Schema(
        response=(F("id"), F("state", enum=("closed",))),
        errors=(_NO_CONTEXT,),
    ),
    "code_context_restart": Schema(
        response=_CONTEXT,
        errors=(_NO_CONTEXT,),
        notes="The kernel's whole process tree is killed; a running execution "
        "ends lost after context.restarted.",
    ),
    "code_context_interrupt": Schema(
        response=(F("id"), F("execution_id", nullable=True), F("state")),
        errors=(_NO_CONTEXT,),
    ),
    "code_execute": Schema(
        body=(
            F("code", required=True, example="print(1 + 1)"),
            F(
                "timeout",
                "number",
                "seconds; then interrupt, then restart",
                default=300,
            ),
            F("wait", "number", "seconds to wait for the result before 202"),
            F("stream", "boolean", "answer the events as SSE", default=False),
            F(
                "queue",
                "boolean",
                "wait behind a running execution (false: 409)",
                default=True,
            ),
            F("on_disconnect", enum=("continue", "interrupt"), default="continue"),
            F("env", "object", "set for this execution only (python kernels)"),
            F(
                "allow_stdin",
                "boolean",
                "let input() ask (params.allow_stdin)",
                default=False,
            ),
            F("silent", "boolean", default=False),
            F("store_history", "boolean", default=True),
        ),
        response=_RESULT,
        events=_CODE_EVENTS,
        errors=(
            _NO_CONTEXT,
            E(403, "param_not_allowed", "allow_stdin or an env_deny name"),
            E(409, "context_busy", "busy and queue is false"),
            E(409, "context_dead", "the kernel died and was not restarted"),
            E(413, "payload_too_large", "code over max_request_bytes"),
            E(
                429,
                "too_many_executions",
                "max_queued executions wait",
                "ResourceError",
            ),
        ),
        notes="200 with the result when it ends within wait (default: its timeout), "
        "else 202 {execution_id, state, events_url}; with stream: true, SSE.",
    ),
    "code_executions_list": Schema(
        query=(F("state", doc="only executions in this state"),),
        response=(F("executions", "array", items="object"),),
        errors=(_NO_CONTEXT,),
    ),
    "code_execution_get": Schema(
        query=(F("wait", "number", "seconds to long-poll while it runs", default=0),),
        response=_RESULT,
        errors=(_NO_CONTEXT,),
    ),
    "code_execution_events": Schema(
        query=(
            *_RESUME,
            F("follow", "boolean", "SSE (false: one JSON page)", default=True),
            F("limit", "integer", "page size", default=1000),
            _QUERY_TOKEN,
        ),
        headers=(_LAST_EVENT_ID,),
        produces="sse",
        events=(*_CODE_EVENTS, _GAP),
        errors=(_NO_CONTEXT,),
    ),
    "code_execution_input": Schema(
        body=(F("value", required=True, example="42"),),
        response=(F("execution_id"),),
        errors=(
            _NO_CONTEXT,
            E(409, "already_resolved", "the execution is not waiting for input"),
        ),
    ),
    "code_output_get": Schema(
        produces="binary",
        errors=(_NO_CONTEXT,),
        notes="The bytes of a display item bigger than max_display_bytes, with its "
        "MIME type, X-Content-Type-Options: nosniff and Content-Security-Policy: sandbox.",
    ),
    # -- agents ----------------------------------------------------------------
    "agents_catalog": Schema(
        response=(
            F(
                "agents",
                "array",
                "[{id, name, source: builtin|policy, enabled, "
                "allowed, installed, version, command, env_required, env_present, "
                "auth_method, install: {package, version}}]",
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
            F("state"),
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
            E(429, "too_many_sessions", "max_sessions (4) are live", "ResourceError"),
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
        ),
        errors=(
            E(400, "invalid_param", "acp_session_id missing"),
            E(404, "not_found", "unknown agent id"),
            E(429, "too_many_sessions", "max_sessions are live"),
            E(502, "agent_error", "the agent refused the load"),
            E(503, "agent_unavailable", "the agent cannot start"),
        ),
    ),
    "agents_session_list": Schema(
        query=(F("agent"), F("state")),
        response=(
            F(
                "sessions",
                "array",
                "[{session_id, agent, state, title, cwd, "
                "created_at, last_seq, turn_id, pending_requests}]",
                items="object",
            ),
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
            F("process", "object", "{pid, exit_code}"),
            F("capabilities", "object"),
        ),
        errors=(_SID_404,),
    ),
    "agents_session_config": Schema(
        body=(
            F("mode"),
            F("model"),
            F("config", "object"),
            F("title", example="refactor"),
        ),
        response=(
            F("modes", "object"),
            F("config_options", "array", items="object"),
            F("title"),
        ),
        errors=(_SID_404, E(403, "param_not_allowed", "a forbidden mode (deny_modes)")),
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
            F("exit_code", "integer"),
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
                "tool_call_ids, seq_from, seq_to}]",
                items="object",
            ),
            F("next", "integer"),
        ),
        errors=(_SID_404,),
    ),
    "agents_events": Schema(
        query=(
            *_RESUME,
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
            _QUERY_TOKEN,
        ),
        headers=(_LAST_EVENT_ID,),
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
                "permission.requested, ... session.closed (always last)",
            ),
            _GAP,
        ),
        errors=(_SID_404,),
    ),
    "agents_requests": Schema(
        query=(
            F("session_id"),
            F("state", default="pending", doc="or all"),
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
            F("content", "object", "question: the answer"),
        ),
        response=(F("request_id"), F("state", doc='"resolved"'), F("outcome")),
        errors=(
            E(400, "invalid_param", "no usable answer"),
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
        query=(*_RESUME, F("follow", "boolean", default=False)),
        headers=(_LAST_EVENT_ID,),
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
            _GAP,
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
    # -- the /v1 door: the seed's agents API, OpenAI-shaped (SPEC §26) ---------
    "agents_sessions_create": Schema(
        headers=(_IDEMPOTENCY,),
        body=(
            F(
                "agent",
                "object",
                "{model: a catalogue id, name?, instructions?}",
                required=True,
                example={"model": "claude"},
            ),
            F("agent_id", doc="a stored definition (none exist yet: 404)"),
            F(
                "environment",
                "object",
                "{type: self_hosted, workspace_directory?} (guarded)",
                example={"type": "self_hosted"},
            ),
            F("input", "any", "a first message: text or messages"),
            F("metadata", "object", "at most 16 string pairs"),
            F("vault_ids", "array", items="string"),
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
            E(429, "too_many_sessions", "max_sessions are live", "ResourceError"),
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
            _GAP,
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
                "{type: self_hosted, workspace_directory? (guarded, must exist), env?}",
                required=True,
                example={"type": "self_hosted"},
            ),
            F("vault_ids", "array", items="string"),
        ),
        response=_OA_ENVIRONMENT,
        errors=(
            *_OA_ERRORS,
            E(403, "path_not_allowed", "workspace_directory outside the path rule"),
        ),
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
        headers=(_IDEMPOTENCY,),
        body=(
            F("model", required=True, doc="a catalogue id", example="claude"),
            F(
                "input",
                "any",
                "text or user/system/developer messages",
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
            F("text", "object"),
            F("service_tier"),
        ),
        response=_OA_RESPONSE,
        produces="json",
        errors=(
            *_OA_ERRORS,
            E(404, "not_found", "unknown model or previous response"),
            E(
                409,
                "idempotency.mismatch",
                "an Idempotency-Key reused with another body",
            ),
        ),
        notes="Sampling parameters are accepted and named in X-Agent-Sandbox-Ignored-Params. "
        "stream=true answers SSE (response.* events) as the agent speaks.",
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
                "[{id, object: model, created, owned_by}]",
                items="object",
            ),
        )
    ),
    "agents_models_get": Schema(
        response=(F("id"), F("object"), F("created", "integer"), F("owned_by")),
        errors=(E(404, "not_found", "no such model (catalogue agent)"),),
    ),
    "agents_cannot_models_delete": Schema(errors=(_OA_REFUSED,)),
    # -- mcp -------------------------------------------------------------------
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
            E(429, "too_many_sessions", "limits.max_sessions sessions are open"),
        ),
        notes="One JSON-RPC 2.0 message per POST, answered as JSON or as an SSE "
        "stream; GET opens the session's server stream, DELETE ends the session. "
        "Every tools/call is governed and audited as the endpoint it calls. "
        "See docs/mcp.md.",
    ),
    # -- capability links and the preview door --------------------------------
    "links_mint": Schema(
        body=(
            F(
                "audience",
                doc='"console", or "preview:PORT" for one preview',
                required=True,
                example="preview:3000",
            ),
            F(
                "scopes",
                "array",
                "at most the caller's, narrowed to the audience (a preview link: "
                "preview:use); default: all the audience allows",
                items="string",
            ),
            F(
                "ttl_seconds",
                "number",
                "cut to limits.max_link_ttl_seconds (3600)",
                default=900,
                example=900,
            ),
            F("uses", "integer", "how many times it may be presented", minimum=1),
        ),
        status=201,
        response=_LINK_MINTED,
        errors=(
            E(400, "invalid_param", "an audience, scope, ttl or uses it cannot take"),
            E(403, "missing_scope", "a scope the caller does not hold"),
            E(
                429,
                "too_many_sessions",
                "limits.max_sessions (1000) links are live",
                "ResourceError",
            ),
        ),
        notes="The token (sbxl_...) goes in X-Access-Token, Authorization: Bearer, or "
        "on the preview door as ?sbx_link=. The gate sees it as identity link:ID on "
        "behalf of the minter, in every audit line. Links die with the daemon unless "
        "auth.link_key_file names the key.",
    ),
    "links_list": Schema(
        response=(
            F(
                "links",
                "array",
                "the caller's live links: " + _LINK_TEXT,
                items="object",
            ),
        ),
    ),
    "links_revoke": Schema(
        response=_LINK_RECORD,
        errors=(
            E(
                404,
                "not_found",
                "no live link of the caller's with this id",
                "NotFoundError",
            ),
        ),
    ),
    "preview_ports_list": Schema(
        response=(
            F(
                "ports",
                "array",
                "[{port, label, public, url, listening, exposed_by, ...}]: every "
                "exposure, and every other listening port (exposed: false)",
                items="object",
            ),
        ),
    ),
    "preview_expose": Schema(
        body=(
            F(
                "port",
                "integer",
                "a port of an app in the sandbox",
                required=True,
                example=3000,
                minimum=1,
                maximum=65535,
            ),
            F("label", doc="a name in the URL: PORT-LABEL.DOMAIN"),
            F(
                "public",
                "boolean",
                "anyone who can reach the door may use it",
                default=False,
            ),
            F("ttl_seconds", "number", "the exposure ends then"),
            F(
                "host_header",
                doc="the Host the app sees",
                enum=("upstream", "preserve"),
                default="upstream",
            ),
        ),
        status=201,
        response=_EXPOSURE,
        errors=(
            E(400, "invalid_param", "a port, label or ttl it cannot take"),
            E(
                403,
                "port_not_allowed",
                "outside params.ports, or one of the daemon's own ports",
            ),
            E(403, "param_not_allowed", "public while params.allow_public is false"),
            E(
                429,
                "too_many_sessions",
                "limits.max_sessions (64) exposures",
                "ResourceError",
            ),
            E(
                503,
                "unavailable",
                "the preview door does not listen (--preview-port)",
                "RuntimeError",
            ),
        ),
        notes="Exposing an exposed port again replaces its exposure.",
    ),
    "preview_get": Schema(
        response=_EXPOSURE,
        errors=(
            E(400, "invalid_param", "port is not 1-65535"),
            E(404, "port_not_exposed", "nobody exposed this port", "NotFoundError"),
        ),
    ),
    "preview_unexpose": Schema(
        response=_EXPOSURE,
        errors=(
            E(400, "invalid_param", "port is not 1-65535"),
            E(404, "port_not_exposed", "nobody exposed this port", "NotFoundError"),
        ),
        notes="Requests and WebSockets in flight to the port are closed.",
    ),
    "preview_link": Schema(
        body=(
            F(
                "ttl_seconds",
                "number",
                "cut to limits.max_link_ttl_seconds (3600)",
                default=900,
                example=900,
            ),
            F("uses", "integer", "how many times it may be opened", minimum=1),
        ),
        status=201,
        response=(*_LINK_MINTED,),
        errors=(
            E(400, "invalid_param", "port, ttl or uses malformed"),
            E(
                403,
                "missing_scope",
                "the caller lacks preview:use, which the link carries",
            ),
            E(404, "port_not_exposed", "nobody exposed this port", "NotFoundError"),
        ),
        notes="url opens the preview in a browser: the door sets a cookie for the "
        "port's host and redirects to the same URL without the link.",
    ),
    "preview_proxy": Schema(
        produces="binary",
        errors=(
            E(
                401,
                "link_invalid",
                "no credential for a private preview, or a bad, revoked or used-up link",
                "AuthError",
            ),
            E(401, "link_expired", "the link expired", "AuthError"),
            E(403, "port_not_allowed", "the port may not be previewed"),
            E(
                403,
                "origin_not_allowed",
                "the door's cookie, from another page's Origin",
            ),
            E(404, "port_not_exposed", "nobody exposed this port", "NotFoundError"),
            E(421, "misdirected_request", "a Host that names no preview"),
            E(
                429,
                "too_many_sessions",
                "limits.max_sessions (64) WebSockets are open through the door",
                "ResourceError",
            ),
            E(
                502,
                "upstream_unavailable",
                "nothing answers on the port (browsers get a page that retries)",
                "ConnectionError",
            ),
            E(
                504,
                "upstream_timeout",
                "no response head within limits.timeout_seconds (60)",
                "TimeoutError",
            ),
        ),
        notes="On the preview port (--preview-port), not the HTTP port: any method "
        "and path at http://PORT.localhost:PREVIEW_PORT/ (or PORT-LABEL.DOMAIN, or "
        "/p/PORT/ in path mode) is proxied to 127.0.0.1:PORT, WebSocket upgrades "
        "included. See docs/preview.md.",
    ),
    # -- console ---------------------------------------------------------------
    "ui_assets": Schema(
        produces="binary",
        headers=(F("If-None-Match", doc="an asset's ETag: 304 when it still matches"),),
        errors=(
            E(404, "not_found", "no such asset, or another version's", "NotFoundError"),
        ),
        notes="`/ui/` is the page (never cached); `/ui/{release}/{asset}` its ES "
        "modules, styles and the vendored xterm.js (immutable: the version names "
        "their digest). Static code only: no token needed; the page logs in with "
        "a link (`sandboxd ui`). Every answer carries the console's strict "
        "Content-Security-Policy. See docs/console.md.",
    ),
}


def schema_for(endpoint_id: str) -> Schema:
    """The schema of an endpoint; an empty one for ids this module does not
    know (custom routes), so callers never need a special case."""
    return SCHEMAS.get(endpoint_id, Schema())


def declared_names(endpoint_id: str) -> set[str]:
    """Every query and body field name declared for an endpoint."""
    schema = schema_for(endpoint_id)
    return {f.name for f in schema.query} | {f.name for f in schema.body}
