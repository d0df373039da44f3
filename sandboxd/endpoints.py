# -*- test-case-name: tests.test_endpoints -*-
"""
The endpoint table: every route the daemon serves, declared once.

Routing (:mod:`sandboxd.web.routing`), the policy engine, discovery
(``/capabilities``), ``/openapi.json`` and the generated API reference all
read this table; nothing else lists endpoints.  The table imports no
handler: :mod:`sandboxd.routes` attaches the group modules' handlers to the
ids declared here (``builtin_table``); an id with no handler yet is
reported as not implemented rather than hidden.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterator
from typing import Any

import attrs


class CapabilityGroup(enum.StrEnum):
    """The groups endpoints belong to; the unit of ``enable_group``."""

    CORE = "core"
    COMMANDS = "commands"
    FILE_OPS = "file_ops"
    PROCESS = "process"
    TERMINAL = "terminal"
    SYSTEM = "system"
    DEV_TOOLS = "dev_tools"
    BROWSER = "browser"
    AGENTS = "agents"
    GIT = "git"
    MCP = "mcp"
    E2B = "e2b"
    KEP = "kep"
    AUTH = "auth"
    PREVIEW = "preview"
    CODE = "code"
    CONSOLE = "console"
    LSP = "lsp"


#: Groups that are on unless something turns them off.
DEFAULT_ON = frozenset(
    {
        CapabilityGroup.CORE,
        CapabilityGroup.COMMANDS,
        CapabilityGroup.FILE_OPS,
        CapabilityGroup.PROCESS,
        CapabilityGroup.TERMINAL,
        CapabilityGroup.SYSTEM,
        CapabilityGroup.MCP,
        CapabilityGroup.AUTH,
    }
)

#: Methods the HTTP pipeline knows; anything else is 501.
HTTP_METHODS = ("GET", "POST", "DELETE")

#: Endpoints served on a port of their own (a front door), not by the HTTP
#: router: the PTY WebSocket, the E2B-compatible port, the preview door and
#: the KEP ports (kubernetes-sigs/agent-sandbox's runtime protocol).
DOOR_METHODS = ("WS", "E2B", "PREVIEW", "KEP")

Handler = Callable[[Any], Any]


@attrs.define(eq=False)
class Endpoint:
    """
    One route: its identity, where it lives, who may call it.

    :ivar scopes: every scope listed is required (``files_move`` needs two).
    :ivar body: ``"json"`` (the pipeline parses an object), ``"raw"`` (the
        handler consumes the bytes through ``sink``), or ``"none"``.
    :ivar upload: the body carries a file payload, so its request cap derives
        from ``max_bytes`` (×4/3 for base64 + 64 KiB) instead of 1 MiB.
    :ivar sink: for ``body="raw"``, called at header time with the
        :class:`~sandboxd.web.messages.ServerRequest` to get a
        :class:`~sandboxd.web.messages.BodySink` the body streams into.
    """

    id: str
    method: str
    path: str
    group: CapabilityGroup
    scopes: tuple[str, ...]
    summary: str = ""
    streaming: bool = False
    auth_required: bool = True
    body: str = "json"
    upload: bool = False
    custom: bool = False
    handler: Handler | None = None
    sink: Callable[[Any], Any] | None = None
    #: The front door whose framing the route answers in: ``http`` (SPEC
    #: §3's error body) or ``openai`` (OpenAI's error envelope, audited as
    #: ``via: openai``).
    door: str = "http"
    #: More path templates the router sends to this endpoint (the console's
    #: page at ``/ui`` beside its assets at ``/ui/{release}/{asset}``).
    also: tuple[str, ...] = ()

    @property
    def implemented(self) -> bool:
        """Whether a handler is attached (WebSocket ids count as served)."""
        return self.handler is not None or self.method in DOOR_METHODS

    @property
    def segments(self) -> tuple[str, ...]:
        """The path template split into segments (``{x}`` marks a parameter)."""
        return tuple(s for s in self.path.split("/") if s)


_PARAM = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def param_name(segment: str) -> str | None:
    """The parameter name of a ``{name}`` segment, else None."""
    m = _PARAM.match(segment)
    return m.group(1) if m else None


G = CapabilityGroup
_S = "/agents/sessions/{sid}"
_C = "/code/contexts/{cid}"
_L = "/lsp/sessions/{lid}"
_V = "/v1/agents/sessions/{session_id}"
_OA: dict[str, Any] = {"door": "openai"}
_OA_STREAM: dict[str, Any] = {"door": "openai", "streaming": True}

# (id, method, path, group, scopes, summary, flags)
# fmt: off
_CATALOGUE: list[tuple[str, str, str, CapabilityGroup, tuple[str, ...], str, dict[str, Any]]] = [
    ("health", "GET", "/health", G.CORE, (), "Liveness and readiness: 200 {status: ok}; 503 unavailable while the daemon stops.", {"auth_required": False, "body": "none"}),
    ("capabilities", "GET", "/capabilities", G.CORE, ("core:read",), "What this caller may do, endpoint by endpoint.", {}),
    ("capabilities_check", "POST", "/capabilities/check", G.CORE, ("core:read",), "Decide a hypothetical call without making it.", {}),
    ("openapi", "GET", "/openapi.json", G.CORE, ("core:read",), "OpenAPI 3.1 document generated from this table.", {}),
    ("list_commands", "GET", "/commands", G.COMMANDS, ("commands:list",), "List the template's commands.", {}),
    ("run_command", "POST", "/commands/{name}", G.COMMANDS, ("commands:run",), "Run a registered command.", {}),
    ("upload", "POST", "/upload", G.FILE_OPS, ("files:write",), "Write a file from base64.", {"upload": True}),
    ("download", "GET", "/download", G.FILE_OPS, ("files:read",), "Read a file as base64.", {}),
    ("files_list", "GET", "/files/list", G.FILE_OPS, ("files:read",), "List a directory.", {}),
    ("files_stat", "GET", "/files/stat", G.FILE_OPS, ("files:read",), "Describe one path.", {}),
    ("files_mkdir", "POST", "/files/mkdir", G.FILE_OPS, ("files:write",), "Create a directory and its parents.", {}),
    ("files_chmod", "POST", "/files/chmod", G.FILE_OPS, ("files:write",), "Set a file's or directory's permissions.", {}),
    ("files_delete", "DELETE", "/files", G.FILE_OPS, ("files:delete",), "Delete a file or directory tree.", {}),
    ("files_move", "POST", "/files/move", G.FILE_OPS, ("files:write", "files:delete"), "Move or rename.", {}),
    ("files_search", "POST", "/files/search", G.FILE_OPS, ("files:read",), "Find names matching a pattern.", {}),
    ("files_edit", "POST", "/files/edit", G.FILE_OPS, ("files:read", "files:write"), "Replace exact text in a file, atomically.", {}),
    ("files_grep", "POST", "/files/grep", G.FILE_OPS, ("files:read",), "Find lines matching a pattern in files.", {}),
    ("files_upload_stream", "POST", "/files/upload-stream", G.FILE_OPS, ("files:write",), "Write a file atomically from base64.", {"upload": True}),
    ("files_download_stream", "GET", "/files/download-stream", G.FILE_OPS, ("files:read",), "Read a file as base64, streamed.", {}),
    ("files_archive", "POST", "/files/archive", G.FILE_OPS, ("files:read",), "Pack paths into tar.gz or zip.", {}),
    ("files_extract", "POST", "/files/extract", G.FILE_OPS, ("files:write",), "Unpack an archive, every member checked first.", {"upload": True}),
    ("files_read_raw", "GET", "/files/raw", G.FILE_OPS, ("files:read",), "Stream a file's bytes (Range, ETag).", {}),
    ("files_write_raw", "POST", "/files/raw", G.FILE_OPS, ("files:write",), "Write the raw body to a file atomically.", {"body": "raw", "upload": True}),
    ("files_uploads_create", "POST", "/files/uploads", G.FILE_OPS, ("files:write",), "Start a resumable upload: every refusal before a byte is sent.", {}),
    ("files_uploads_list", "GET", "/files/uploads", G.FILE_OPS, ("files:write",), "The caller's open resumable uploads, to carry one on or drop it.", {}),
    ("files_uploads_get", "GET", "/files/uploads/{upload_id}", G.FILE_OPS, ("files:write",), "Where a resumable upload stands (its offset).", {}),
    ("files_uploads_append", "POST", "/files/uploads/{upload_id}", G.FILE_OPS, ("files:write",), "Append the raw body at offset; renamed into place when whole.", {"body": "raw", "upload": True}),
    ("files_uploads_delete", "DELETE", "/files/uploads/{upload_id}", G.FILE_OPS, ("files:write",), "Drop a resumable upload and its staging file.", {}),
    ("files_watch", "GET", "/files/watch", G.FILE_OPS, ("files:read",), "SSE of changes under a directory.", {"streaming": True}),
    ("shell", "POST", "/shell", G.PROCESS, ("process:run",), "Run a command and wait for it.", {}),
    ("shell_stream", "POST", "/shell/stream", G.PROCESS, ("process:run",), "Run a command, output as SSE.", {"streaming": True}),
    ("process_start", "POST", "/process/start", G.PROCESS, ("process:run",), "Start a background process.", {}),
    ("process_list", "GET", "/process/list", G.PROCESS, ("process:read",), "List managed processes.", {}),
    ("process_detail", "GET", "/process/{pid}", G.PROCESS, ("process:read",), "Describe one managed process.", {}),
    ("process_signal", "POST", "/process/{pid}/signal", G.PROCESS, ("process:manage",), "Signal a process group.", {}),
    ("process_output", "GET", "/process/{pid}/output", G.PROCESS, ("process:read",), "Page or follow a process's output log.", {"streaming": True}),
    ("process_stdin", "POST", "/process/{pid}/stdin", G.PROCESS, ("process:manage",), "Write to a process's stdin.", {}),
    ("pty_create_session", "POST", "/pty/sessions", G.TERMINAL, ("terminal:use",), "Open a terminal session.", {}),
    ("pty_list_sessions", "GET", "/pty/sessions", G.TERMINAL, ("terminal:use",), "List terminal sessions.", {}),
    ("pty_detail", "GET", "/pty/sessions/{id}", G.TERMINAL, ("terminal:use",), "Describe one terminal session.", {}),
    ("pty_resize", "POST", "/pty/sessions/{id}/resize", G.TERMINAL, ("terminal:use",), "Resize a terminal.", {}),
    ("pty_delete_session", "DELETE", "/pty/sessions/{id}", G.TERMINAL, ("terminal:use",), "Close a terminal session.", {}),
    ("pty_connect", "WS", "/pty", G.TERMINAL, ("terminal:use",), "Attach to a terminal over WebSocket (PTY port).", {"body": "none", "streaming": True}),
    ("system_info", "GET", "/system/info", G.SYSTEM, ("system:read",), "OS, CPU, memory and disk facts.", {}),
    ("env_get", "GET", "/env", G.SYSTEM, ("system:read",), "Environment variables (secrets redacted).", {}),
    ("env_set", "POST", "/env", G.SYSTEM, ("system:write",), "Set variables later children inherit.", {}),
    ("ports", "GET", "/ports", G.SYSTEM, ("system:read",), "Listening TCP sockets.", {}),
    ("packages", "GET", "/packages", G.SYSTEM, ("system:read",), "Installed pip or npm packages.", {}),
    ("system_metrics", "GET", "/system/metrics", G.SYSTEM, ("system:read",), "Load, memory and disk usage.", {}),
    ("metrics", "GET", "/metrics", G.SYSTEM, ("system:read",), "The daemon's own metrics, Prometheus text format.", {}),
    ("code_run", "POST", "/code/run", G.DEV_TOOLS, ("devtools:run",), "Run a snippet of python, node or bash.", {}),
    ("git_status", "GET", "/git/status", G.DEV_TOOLS, ("devtools:read",), "git status, parsed.", {}),
    ("git_diff", "GET", "/git/diff", G.DEV_TOOLS, ("devtools:read",), "git diff with stats.", {}),
    ("git_clone", "POST", "/git/clone", G.GIT, ("git:remote",), "Clone a remote into a new directory (a job).", {}),
    ("git_fetch", "POST", "/git/fetch", G.GIT, ("git:remote",), "Fetch from a remote (a job).", {}),
    ("git_pull", "POST", "/git/pull", G.GIT, ("git:remote",), "Pull from a remote, fast-forward only by default (a job).", {}),
    ("git_push", "POST", "/git/push", G.GIT, ("git:remote",), "Push a branch, per-ref results (a job).", {}),
    ("git_jobs_list", "GET", "/git/jobs", G.GIT, ("git:read",), "List git remote jobs.", {}),
    ("git_job_get", "GET", "/git/jobs/{job_id}", G.GIT, ("git:read",), "Describe one git job and its progress.", {}),
    ("git_job_cancel", "DELETE", "/git/jobs/{job_id}", G.GIT, ("git:remote",), "Cancel a git job (its whole process tree).", {}),
    ("git_job_events", "GET", "/git/jobs/{job_id}/events", G.GIT, ("git:read",), "A git job's progress as a resumable SSE stream.", {"streaming": True}),
    ("git_init", "POST", "/git/init", G.GIT, ("git:write",), "Create a repository.", {}),
    ("git_add", "POST", "/git/add", G.GIT, ("git:write",), "Stage files.", {}),
    ("git_commit", "POST", "/git/commit", G.GIT, ("git:write",), "Commit the index.", {}),
    ("git_log", "GET", "/git/log", G.GIT, ("git:read",), "Commit history, parsed.", {}),
    ("git_show", "GET", "/git/show", G.GIT, ("git:read",), "One commit with its diff.", {}),
    ("git_branches", "GET", "/git/branches", G.GIT, ("git:read",), "Branches with upstream, ahead and behind.", {}),
    ("git_branch_create", "POST", "/git/branches", G.GIT, ("git:write",), "Create a branch.", {}),
    ("git_branch_delete", "DELETE", "/git/branches", G.GIT, ("git:write",), "Delete a branch.", {}),
    ("git_checkout", "POST", "/git/checkout", G.GIT, ("git:write",), "Switch to a branch or commit.", {}),
    ("git_reset", "POST", "/git/reset", G.GIT, ("git:write",), "Reset HEAD, the index or files.", {}),
    ("git_restore", "POST", "/git/restore", G.GIT, ("git:write",), "Restore files in the work tree or index.", {}),
    ("git_stash", "POST", "/git/stash", G.GIT, ("git:write",), "Push, pop, list or drop stashes.", {}),
    ("git_remotes", "GET", "/git/remotes", G.GIT, ("git:read",), "The repository's remotes (userinfo redacted).", {}),
    ("git_remote_add", "POST", "/git/remotes", G.GIT, ("git:write",), "Add a remote within the URL policy.", {}),
    ("git_config_get", "GET", "/git/config", G.GIT, ("git:read",), "Read allowed local config keys.", {}),
    ("git_config_set", "POST", "/git/config", G.GIT, ("git:write",), "Set an allowed local config key.", {}),
    ("browser_navigate", "POST", "/browser/navigate", G.BROWSER, ("browser:use",), "Open a URL in the shared page.", {}),
    ("browser_screenshot", "POST", "/browser/screenshot", G.BROWSER, ("browser:use",), "Screenshot the page or an element.", {}),
    ("browser_content", "GET", "/browser/content", G.BROWSER, ("browser:use",), "The page's HTML or text.", {}),
    ("browser_click", "POST", "/browser/click", G.BROWSER, ("browser:use",), "Click an element.", {}),
    ("browser_type", "POST", "/browser/type", G.BROWSER, ("browser:use",), "Type into an element.", {}),
    ("browser_evaluate", "POST", "/browser/evaluate", G.BROWSER, ("browser:evaluate",), "Evaluate JavaScript in the page.", {}),
    ("browser_pdf", "POST", "/browser/pdf", G.BROWSER, ("browser:use",), "Print the page to PDF.", {}),
    ("browser_console", "GET", "/browser/console", G.BROWSER, ("browser:use",), "Console messages since the last read.", {}),
    ("agents_catalog", "GET", "/agents/catalog", G.AGENTS, ("agents:read",), "Coding agents this sandbox knows.", {}),
    ("agents_catalog_get", "GET", "/agents/catalog/{agent}", G.AGENTS, ("agents:read",), "One catalogue entry, optionally probed.", {}),
    ("agents_install", "POST", "/agents/catalog/{agent}/install", G.AGENTS, ("agents:install",), "Install an agent as a managed process.", {}),
    ("agents_catalog_sessions", "GET", "/agents/catalog/{agent}/sessions", G.AGENTS, ("agents:read",), "The agent's own stored sessions.", {}),
    ("agents_session_create", "POST", "/agents/sessions", G.AGENTS, ("agents:run",), "Start an agent session.", {}),
    ("agents_session_load", "POST", "/agents/sessions/load", G.AGENTS, ("agents:run",), "Load a stored agent session.", {}),
    ("agents_session_list", "GET", "/agents/sessions", G.AGENTS, ("agents:read",), "List agent sessions.", {}),
    ("agents_session_get", "GET", _S, G.AGENTS, ("agents:read",), "Describe one agent session.", {}),
    ("agents_session_config", "POST", _S + "/config", G.AGENTS, ("agents:run",), "Change mode, model, config or title.", {}),
    ("agents_session_cancel", "POST", _S + "/cancel", G.AGENTS, ("agents:run",), "Cancel the running turn.", {}),
    ("agents_session_delete", "DELETE", _S, G.AGENTS, ("agents:run",), "Close an agent session.", {}),
    ("agents_prompt", "POST", _S + "/prompt", G.AGENTS, ("agents:run",), "Send a prompt (one turn).", {}),
    ("agents_turns", "GET", _S + "/turns", G.AGENTS, ("agents:read",), "List turns.", {}),
    ("agents_turn_get", "GET", _S + "/turns/{turn_id}", G.AGENTS, ("agents:read",), "One turn, long-polled.", {}),
    ("agents_messages", "GET", _S + "/messages", G.AGENTS, ("agents:read",), "Coalesced messages.", {}),
    ("agents_events", "GET", _S + "/events", G.AGENTS, ("agents:read",), "The session's event log (SSE or page).", {"streaming": True}),
    ("agents_requests", "GET", "/agents/requests", G.AGENTS, ("agents:read",), "Pending permission requests and questions.", {}),
    ("agents_request_reply", "POST", "/agents/requests/{request_id}", G.AGENTS, ("agents:approve",), "Answer a permission request or question.", {}),
    ("agents_plan", "GET", _S + "/plan", G.AGENTS, ("agents:read",), "The agent's current plan.", {}),
    ("agents_tool_calls", "GET", _S + "/tool-calls", G.AGENTS, ("agents:read",), "Tool calls of the session.", {}),
    ("agents_tool_call_get", "GET", _S + "/tool-calls/{tool_call_id}", G.AGENTS, ("agents:read",), "One tool call with diffs.", {}),
    ("agents_files", "GET", _S + "/files", G.AGENTS, ("agents:read",), "Files the agent changed.", {}),
    ("agents_terminals", "GET", _S + "/terminals", G.AGENTS, ("agents:read",), "The agent's terminals.", {}),
    ("agents_terminal_output", "GET", _S + "/terminals/{terminal_id}/output", G.AGENTS, ("agents:read",), "A terminal's output log.", {"streaming": True}),
    ("agents_terminal_kill", "POST", _S + "/terminals/{terminal_id}/kill", G.AGENTS, ("agents:run",), "Signal an agent's terminal.", {}),
    ("agents_commands", "GET", _S + "/commands", G.AGENTS, ("agents:read",), "The agent's slash commands.", {}),
    ("agents_logs", "GET", _S + "/logs", G.AGENTS, ("agents:read",), "The agent's stderr, head and tail.", {}),
    ("code_kernels", "GET", "/code/kernels", G.CODE, ("code:read",), "Kernels a code context may run.", {}),
    ("code_contexts_list", "GET", "/code/contexts", G.CODE, ("code:read",), "List your code contexts.", {}),
    ("code_context_create", "POST", "/code/contexts", G.CODE, ("code:manage",), "Start a code context (a kernel that keeps state).", {}),
    ("code_context_get", "GET", _C, G.CODE, ("code:read",), "Describe one code context.", {}),
    ("code_context_delete", "DELETE", _C, G.CODE, ("code:manage",), "Close a code context and kill its kernel.", {}),
    ("code_context_restart", "POST", _C + "/restart", G.CODE, ("code:manage",), "Restart a context's kernel (its state is lost).", {}),
    ("code_context_interrupt", "POST", _C + "/interrupt", G.CODE, ("code:run",), "Interrupt the running execution.", {}),
    ("code_execute", "POST", _C + "/execute", G.CODE, ("code:run",), "Run code in a context: a result, 202 and an id, or SSE.", {"streaming": True}),
    ("code_executions_list", "GET", _C + "/executions", G.CODE, ("code:read",), "List a context's executions.", {}),
    ("code_execution_get", "GET", _C + "/executions/{xid}", G.CODE, ("code:read",), "One execution's result, long-polled.", {}),
    ("code_execution_events", "GET", _C + "/executions/{xid}/events", G.CODE, ("code:read",), "An execution's events (resumable SSE).", {"streaming": True}),
    ("code_execution_input", "POST", _C + "/executions/{xid}/input", G.CODE, ("code:run",), "Answer an execution's input().", {}),
    ("code_output_get", "GET", _C + "/outputs/{oid}", G.CODE, ("code:read",), "A spilled display item, raw.", {}),
    # Language servers: what an editor asks of one, asked by an agent.
    ("lsp_servers", "GET", "/lsp/servers", G.LSP, ("lsp:use",), "Language servers, and which are installed.", {}),
    ("lsp_sessions_list", "GET", "/lsp/sessions", G.LSP, ("lsp:use",), "List your language server sessions.", {}),
    ("lsp_session_create", "POST", "/lsp/sessions", G.LSP, ("lsp:use",), "Start a language server for a project.", {}),
    ("lsp_session_get", "GET", _L, G.LSP, ("lsp:use",), "Describe one language server session.", {}),
    ("lsp_session_delete", "DELETE", _L, G.LSP, ("lsp:use",), "Stop a language server.", {}),
    ("lsp_connect", "GET", "/lsp/connect", G.LSP, ("lsp:use",), "A language server of an editor's own, over a WebSocket (JSON-RPC, one message per text frame).", {"streaming": True}),
    ("lsp_diagnostics", "POST", "/lsp/diagnostics", G.LSP, ("lsp:use",), "A file's errors and warnings, from its language server.", {}),
    ("lsp_definition", "POST", "/lsp/definition", G.LSP, ("lsp:use",), "Where the name at a position is defined.", {}),
    ("lsp_references", "POST", "/lsp/references", G.LSP, ("lsp:use",), "Where the name at a position is used.", {}),
    ("lsp_hover", "POST", "/lsp/hover", G.LSP, ("lsp:use",), "The type and documentation of the name at a position.", {}),
    ("lsp_symbols", "POST", "/lsp/symbols", G.LSP, ("lsp:use",), "A file's symbols, or the project's matching a query.", {}),
    ("lsp_completions", "POST", "/lsp/completions", G.LSP, ("lsp:use",), "Completions at a position.", {}),
    ("lsp_rename", "POST", "/lsp/rename", G.LSP, ("lsp:use", "files:write"), "Rename a symbol across the project's files, all or none.", {}),
    # The seed's agents API, OpenAI-shaped, over the ACP engine above (SPEC §26).
    ("agents_sessions_create", "POST", "/v1/agents/sessions", G.AGENTS, ("agents:use",), "Create an agent session (OpenAI-shaped).", _OA),
    ("agents_sessions_list", "GET", "/v1/agents/sessions", G.AGENTS, ("agents:use",), "List agent sessions (OpenAI-shaped).", _OA),
    ("agents_sessions_get", "GET", _V, G.AGENTS, ("agents:use",), "Get an agent session.", _OA),
    ("agents_sessions_update", "POST", _V, G.AGENTS, ("agents:use",), "Update a session's metadata.", _OA),
    ("agents_sessions_delete", "DELETE", _V, G.AGENTS, ("agents:use",), "Delete an agent session.", _OA),
    ("agents_sessions_events_create", "POST", _V + "/events", G.AGENTS, ("agents:use",), "Send input, a cancel or an approval to a session.", _OA),
    ("agents_sessions_events_stream", "GET", _V + "/events", G.AGENTS, ("agents:use",), "Stream session events (SSE, resumable).", _OA_STREAM),
    ("agents_sessions_items_list", "GET", _V + "/items", G.AGENTS, ("agents:use",), "List session items.", _OA),
    ("agents_sessions_turns_list", "GET", _V + "/turns", G.AGENTS, ("agents:use",), "List session turns.", _OA),
    ("agents_sessions_turns_get", "GET", _V + "/turns/{turn_id}", G.AGENTS, ("agents:use",), "Get one turn.", _OA),
    ("agents_sessions_turns_items_list", "GET", _V + "/turns/{turn_id}/items", G.AGENTS, ("agents:use",), "List the items of a turn.", _OA),
    ("agents_artifacts_list", "GET", _V + "/artifacts", G.AGENTS, ("agents:use",), "List the files a session's completed turns wrote (copies).", _OA),
    ("agents_artifacts_get", "GET", _V + "/artifacts/{artifact_id}", G.AGENTS, ("agents:use",), "Get one artifact.", _OA),
    ("agents_artifacts_delete", "DELETE", _V + "/artifacts/{artifact_id}", G.AGENTS, ("agents:use",), "Delete an artifact's copy (the workspace file stays).", _OA),
    ("agents_artifacts_content", "GET", _V + "/artifacts/{artifact_id}/content", G.AGENTS, ("agents:use",), "Download an artifact's bytes (streamed).", _OA_STREAM),
    ("agents_traces_list", "GET", _V + "/traces", G.AGENTS, ("agents:use",), "List a session's traces (OTLP/JSON, one span per ended turn).", _OA),
    ("agents_subagents_list", "GET", _V + "/subagents", G.AGENTS, ("agents:use",), "List the subagents a session's CLI started (ACP agents report none).", _OA),
    ("agents_subagents_get", "GET", _V + "/subagents/{subagent_id}", G.AGENTS, ("agents:use",), "Get a subagent.", _OA),
    ("agents_subagents_items_list", "GET", _V + "/subagents/{subagent_id}" + "/items", G.AGENTS, ("agents:use",), "List a subagent's items.", _OA),
    ("agents_subagents_turns_list", "GET", _V + "/subagents/{subagent_id}" + "/turns", G.AGENTS, ("agents:use",), "List a subagent's turns.", _OA),
    ("agents_subagents_turns_get", "GET", _V + "/subagents/{subagent_id}" + "/turns/{turn_id}", G.AGENTS, ("agents:use",), "Get a subagent's turn.", _OA),
    ("agents_subagents_turns_items_list", "GET", _V + "/subagents/{subagent_id}" + "/turns/{turn_id}/items", G.AGENTS, ("agents:use",), "List the items of a subagent's turn.", _OA),
    ("agents_responses_compact", "POST", "/v1/responses/compact", G.AGENTS, ("agents:use",), "Compact a conversation with the agent's own /compact (or /compress) command.", _OA),
    ("agents_definitions_create", "POST", "/v1/agents", G.AGENTS, ("agents:use",), "Store an agent definition.", _OA),
    ("agents_definitions_list", "GET", "/v1/agents", G.AGENTS, ("agents:use",), "List agent definitions.", _OA),
    ("agents_definitions_get", "GET", "/v1/agents/{agent_id}", G.AGENTS, ("agents:use",), "Get an agent definition.", _OA),
    ("agents_definitions_update", "POST", "/v1/agents/{agent_id}", G.AGENTS, ("agents:use",), "Update an agent definition.", _OA),
    ("agents_definitions_delete", "DELETE", "/v1/agents/{agent_id}", G.AGENTS, ("agents:use",), "Delete an agent definition.", _OA),
    ("agents_environments_create", "POST", "/v1/agents/environments", G.AGENTS, ("agents:use",), "Create a self-hosted environment (a guarded directory and variables).", _OA),
    ("agents_environments_list", "GET", "/v1/agents/environments", G.AGENTS, ("agents:use",), "List environments.", _OA),
    ("agents_environments_get", "GET", "/v1/agents/environments/{environment_id}", G.AGENTS, ("agents:use",), "Get an environment.", _OA),
    ("agents_cannot_executor_registration", "POST", "/v1/agents/environments/{environment_id}/register", G.AGENTS, ("agents:use",), "Refused: executor registration is a hosted service.", _OA),
    ("agents_cannot_executor_channel", "GET", "/v1/agents/environments/{environment_id}/connect", G.AGENTS, ("agents:use",), "Refused: the executor channel is a hosted service.", _OA),
    ("agents_responses_connect", "GET", "/v1/responses", G.AGENTS, ("agents:use",), "The Responses WebSocket: response.create and response.steer events, response events streamed live.", _OA_STREAM),
    ("agents_responses_create", "POST", "/v1/responses", G.AGENTS, ("agents:use",), "Run one agent turn as a response (streamed live on request).", _OA_STREAM),
    ("agents_cannot_responses_input_tokens", "POST", "/v1/responses/input_tokens", G.AGENTS, ("agents:use",), "Refused: input token counting.", _OA),
    ("agents_responses_get", "GET", "/v1/responses/{response_id}", G.AGENTS, ("agents:use",), "Get a stored response.", _OA),
    ("agents_responses_delete", "DELETE", "/v1/responses/{response_id}", G.AGENTS, ("agents:use",), "Delete a stored response.", _OA),
    ("agents_responses_cancel", "POST", "/v1/responses/{response_id}/cancel", G.AGENTS, ("agents:use",), "Cancel a running response.", _OA),
    ("agents_responses_input_items", "GET", "/v1/responses/{response_id}/input_items", G.AGENTS, ("agents:use",), "List the input items of a response.", _OA),
    ("agents_models_list", "GET", "/v1/models", G.AGENTS, ("agents:use",), "The agents this caller may run, as models.", _OA),
    ("agents_models_get", "GET", "/v1/models/{model}", G.AGENTS, ("agents:use",), "One model object.", _OA),
    ("agents_cannot_models_delete", "DELETE", "/v1/models/{model}", G.AGENTS, ("agents:use",), "Refused: model deletion.", _OA),
    # /v1: stored files, vaults and credentials, environment files and templates, runtimes.
    ("agents_files_create", "POST", "/v1/files", G.AGENTS, ("agents:use",), "Store a file (multipart or base64 JSON) for environments to stage.", {"door": "openai", "body": "raw"}),
    ("agents_files_list", "GET", "/v1/files", G.AGENTS, ("agents:use",), "List your stored files.", _OA),
    ("agents_files_get", "GET", "/v1/files/{file_id}", G.AGENTS, ("agents:use",), "Get a stored file's object.", _OA),
    ("agents_files_content", "GET", "/v1/files/{file_id}/content", G.AGENTS, ("agents:use",), "A stored file's bytes.", _OA),
    ("agents_files_delete", "DELETE", "/v1/files/{file_id}", G.AGENTS, ("agents:use",), "Delete a stored file.", _OA),
    ("agents_vaults_create", "POST", "/v1/vaults", G.AGENTS, ("agents:use",), "Make a vault for MCP credentials.", _OA),
    ("agents_vaults_list", "GET", "/v1/vaults", G.AGENTS, ("agents:use",), "List your vaults.", _OA),
    ("agents_vaults_get", "GET", "/v1/vaults/{vault_id}", G.AGENTS, ("agents:use",), "Get a vault.", _OA),
    ("agents_vaults_update", "POST", "/v1/vaults/{vault_id}", G.AGENTS, ("agents:use",), "Rename a vault or replace its metadata.", _OA),
    ("agents_vaults_delete", "DELETE", "/v1/vaults/{vault_id}", G.AGENTS, ("agents:use",), "Delete a vault and its credentials.", _OA),
    ("agents_vault_credentials_create", "POST", "/v1/vaults/{vault_id}/credentials", G.AGENTS, ("agents:use",), "Store a write-only MCP credential.", _OA),
    ("agents_vault_credentials_list", "GET", "/v1/vaults/{vault_id}/credentials", G.AGENTS, ("agents:use",), "List a vault's credentials (never their secrets).", _OA),
    ("agents_vault_credentials_get", "GET", "/v1/vaults/{vault_id}/credentials/{credential_id}", G.AGENTS, ("agents:use",), "Get a credential (never its secret).", _OA),
    ("agents_vault_credentials_update", "POST", "/v1/vaults/{vault_id}/credentials/{credential_id}", G.AGENTS, ("agents:use",), "Rotate a credential's secret or expiry, or its metadata.", _OA),
    ("agents_vault_credentials_delete", "DELETE", "/v1/vaults/{vault_id}/credentials/{credential_id}", G.AGENTS, ("agents:use",), "Delete a credential.", _OA),
    ("agents_environment_files_create", "POST", "/v1/agents/environments/{environment_id}/files", G.AGENTS, ("agents:use",), "Stage a file into an environment's workspace (never replacing one).", _OA),
    ("agents_environment_files_list", "GET", "/v1/agents/environments/{environment_id}/files", G.AGENTS, ("agents:use",), "List an environment's workspace files.", _OA),
    ("agents_environment_templates_create", "POST", "/v1/agents/environments/templates", G.AGENTS, ("agents:use",), "Store an environment template (variables and files).", _OA),
    ("agents_environment_templates_list", "GET", "/v1/agents/environments/templates", G.AGENTS, ("agents:use",), "List environment templates.", _OA),
    ("agents_environment_templates_get", "GET", "/v1/agents/environments/templates/{template_id}", G.AGENTS, ("agents:use",), "Get an environment template.", _OA),
    ("agents_environment_templates_update", "POST", "/v1/agents/environments/templates/{template_id}", G.AGENTS, ("agents:use",), "Update an environment template.", _OA),
    ("agents_environment_templates_delete", "DELETE", "/v1/agents/environments/templates/{template_id}", G.AGENTS, ("agents:use",), "Delete an environment template.", _OA),
    ("agents_runtimes_list", "GET", "/v1/agents/runtimes", G.AGENTS, ("agents:use",), "The agents of the catalogue, as runtimes.", _OA),
    # Webhook endpoints of the /v1 door: signed deliveries, retried with backoff.
    ("agents_webhooks_create", "POST", "/v1/webhook_endpoints", G.AGENTS, ("agents:use",), "Register a webhook endpoint (its signing secret is shown once).", _OA),
    ("agents_webhooks_list", "GET", "/v1/webhook_endpoints", G.AGENTS, ("agents:use",), "List webhook endpoints.", _OA),
    ("agents_webhooks_get", "GET", "/v1/webhook_endpoints/{webhook_endpoint_id}", G.AGENTS, ("agents:use",), "Get a webhook endpoint.", _OA),
    ("agents_webhooks_update", "POST", "/v1/webhook_endpoints/{webhook_endpoint_id}", G.AGENTS, ("agents:use",), "Update a webhook endpoint's URL, event types or name.", _OA),
    ("agents_webhooks_delete", "DELETE", "/v1/webhook_endpoints/{webhook_endpoint_id}", G.AGENTS, ("agents:use",), "Delete a webhook endpoint.", _OA),
    ("agents_webhooks_rotate_secret", "POST", "/v1/webhook_endpoints/{webhook_endpoint_id}/rotate_secret", G.AGENTS, ("agents:use",), "Replace a webhook endpoint's signing secret.", _OA),
    ("agents_webhooks_test", "POST", "/v1/webhook_endpoints/{webhook_endpoint_id}/test", G.AGENTS, ("agents:use",), "Send one signed sample event now.", _OA),
    ("agents_webhook_event_types", "GET", "/v1/webhook_event_types", G.AGENTS, ("agents:use",), "The webhook event types sent.", _OA),
    ("mcp", "POST", "/mcp", G.MCP, ("core:read",), "MCP Streamable HTTP: every endpoint as a tool (GET, POST, DELETE).", {}),
    ("e2b", "E2B", "/", G.E2B, ("core:read",), "The E2B-compatible envd API (E2B port); each call is governed as its sandboxd endpoint.", {"body": "none"}),
    ("kep", "KEP", "/", G.KEP, ("core:read",), "The agent-sandbox runtime protocol (KEP ports: REST files, gRPC processes); each call is governed as its sandboxd endpoint.", {"body": "none"}),
    ("links_mint", "POST", "/auth/links", G.AUTH, ("links:mint",), "Mint a short-lived capability link, narrowed to an audience.", {}),
    ("links_list", "GET", "/auth/links", G.AUTH, ("links:mint",), "The caller's live links.", {}),
    ("links_revoke", "DELETE", "/auth/links/{link_id}", G.AUTH, ("links:mint",), "Revoke a link.", {}),
    ("preview_ports_list", "GET", "/preview/ports", G.PREVIEW, ("preview:read",), "Exposed and listening ports.", {}),
    ("preview_expose", "POST", "/preview/ports", G.PREVIEW, ("preview:manage",), "Expose a port on the preview door; answers its URL.", {}),
    ("preview_get", "GET", "/preview/ports/{port}", G.PREVIEW, ("preview:read",), "One exposure.", {}),
    ("preview_unexpose", "DELETE", "/preview/ports/{port}", G.PREVIEW, ("preview:manage",), "Stop exposing a port; its open connections close.", {}),
    ("preview_link", "POST", "/preview/ports/{port}/link", G.PREVIEW, ("preview:manage",), "A link that opens a private preview in a browser.", {}),
    ("preview_proxy", "PREVIEW", "/", G.PREVIEW, ("preview:use",), "Traffic through the preview door (its own port), to an exposed port.", {"body": "none"}),
    ("ui_assets", "GET", "/ui/{release}/{asset}", G.CONSOLE, (), "The web console: its page at /ui/ and its versioned, immutable assets (no data, no token needed).", {"auth_required": False, "body": "none", "also": ("/ui",)}),
]
# fmt: on

#: Endpoint ids sandboxd used before it took the seed's own server's: the
#: old id -> the id that replaced it.  The one place the old names live:
#: policy documents, ``check-config --explain`` and ``/capabilities/check``
#: still accept them (and ``check-config`` warns, naming the new id).
RENAMED_IDS: dict[str, str] = {
    "commands_list": "list_commands",
    "commands_run": "run_command",
    "process_get": "process_detail",
    "pty_create": "pty_create_session",
    "pty_list": "pty_list_sessions",
    "pty_get": "pty_detail",
    "pty_delete": "pty_delete_session",
}


#: The other way round: an endpoint id -> the old id it replaced.
FORMER_IDS: dict[str, str] = {new: old for old, new in RENAMED_IDS.items()}


def current_id(endpoint_id: str) -> str:
    """The id an endpoint goes by now (an old id maps to its new one)."""
    return RENAMED_IDS.get(endpoint_id, endpoint_id)


def renamed_warning(where: str, old_id: str) -> str:
    """The ``check-config`` warning for an old endpoint id found at ``where``."""
    return (
        f"{where}: {old_id!r} is an old endpoint id; it now means "
        f"{RENAMED_IDS[old_id]!r}: write that instead"
    )


#: Every scope the built-in table names, plus the wildcard.
KNOWN_SCOPES = frozenset({"*"} | {s for row in _CATALOGUE for s in row[4]})


def default_scopes(group: CapabilityGroup, method: str) -> tuple[str, ...]:
    """The scope a custom route in ``group`` needs when it names none."""
    writes = method != "GET"
    table = {
        G.CORE: "core:read",
        G.COMMANDS: "commands:run",
        G.FILE_OPS: "files:write" if writes else "files:read",
        G.PROCESS: "process:run",
        G.TERMINAL: "terminal:use",
        G.SYSTEM: "system:write" if writes else "system:read",
        G.DEV_TOOLS: "devtools:run",
        G.BROWSER: "browser:use",
        G.AGENTS: "agents:run" if writes else "agents:read",
        G.GIT: "git:write" if writes else "git:read",
        G.MCP: "core:read",
        G.E2B: "core:read",
        G.KEP: "core:read",
        G.AUTH: "links:mint",
        G.PREVIEW: "preview:manage" if writes else "preview:read",
        G.CODE: "code:run" if writes else "code:read",
        G.CONSOLE: "console:use",
        G.LSP: "lsp:use",
    }
    return (table[group],)


class RouteTable:
    """
    The ordered table of endpoints, plus the ``code`` policy layer.

    Built-in endpoints come from the catalogue; template authors add their own
    with :meth:`route` or :meth:`register`.  Once a server starts serving the
    table it is frozen.
    """

    def __init__(self) -> None:
        self._endpoints: dict[str, Endpoint] = {}
        #: (method, path) -> the id serving it: a new endpoint's clash is one
        #: look-up, not a pass over the table (the catalogue is built on
        #: every start).
        self._served: dict[tuple[str, str], str] = {}
        self._frozen = False
        #: group -> (enabled, rule string); the ``code`` layer of SPEC §5.3.
        self.code_layer: dict[CapabilityGroup, tuple[bool, str]] = {}

    def __iter__(self) -> Iterator[Endpoint]:
        return iter(self._endpoints.values())

    def __len__(self) -> int:
        return len(self._endpoints)

    def __contains__(self, endpoint_id: object) -> bool:
        return endpoint_id in self._endpoints

    def get(self, endpoint_id: str) -> Endpoint:
        """The endpoint with this id (KeyError when unknown)."""
        return self._endpoints[endpoint_id]

    def ids(self) -> list[str]:
        """Every endpoint id, in registration order."""
        return list(self._endpoints)

    def freeze(self) -> None:
        """Refuse further registrations (the server is serving)."""
        self._frozen = True

    def _check_open(self) -> None:
        if self._frozen:
            raise RuntimeError("the route table is frozen: the server has started")

    def add(self, endpoint: Endpoint) -> Endpoint:
        """Add a fully formed endpoint; its id and (method, path) must be new."""
        self._check_open()
        if endpoint.id in self._endpoints:
            raise ValueError(f"endpoint id {endpoint.id!r} is already registered")
        route = (endpoint.method, endpoint.path)
        if route in self._served:
            raise ValueError(
                f"{endpoint.method} {endpoint.path} is already served by "
                f"{self._served[route]!r}"
            )
        if endpoint.method not in (*HTTP_METHODS, *DOOR_METHODS):
            raise ValueError(f"unsupported method {endpoint.method!r}")
        if not endpoint.path.startswith("/"):
            raise ValueError(f"path must start with '/': {endpoint.path!r}")
        self._endpoints[endpoint.id] = endpoint
        self._served[route] = endpoint.id
        return endpoint

    def register(
        self,
        method: str,
        path: str,
        handler: Handler,
        group: CapabilityGroup = CapabilityGroup.COMMANDS,
        auth_required: bool = True,
        streaming: bool = False,
        name: str | None = None,
        scopes: tuple[str, ...] | None = None,
        summary: str = "",
    ) -> Endpoint:
        """
        Register a custom route.

        :param path: a template; ``{param}`` matches one segment.
        :param name: the endpoint id (default ``"<METHOD> <path>"``), which
            policies use to address it.
        :param auth_required: False lets anyone who reaches the port call
            the route, until a policy (or ``scopes``) names scopes for it:
            then it asks for a credential holding them, as any route does.
        """
        method = method.upper()
        group = CapabilityGroup(group)
        endpoint_id = name or f"{method} {path}"
        return self.add(
            Endpoint(
                id=endpoint_id,
                method=method,
                path=path,
                group=group,
                scopes=tuple(scopes)
                if scopes is not None
                # A route that asks for no credential claims no scope: its
                # group's default would be shown by discovery and never
                # checked.  A policy that names scopes for it gates it.
                else (default_scopes(group, method) if auth_required else ()),
                summary=summary or (handler.__doc__ or "").strip().split("\n")[0],
                streaming=streaming,
                auth_required=auth_required,
                custom=True,
                handler=handler,
            )
        )

    def route(
        self,
        method: str,
        path: str,
        group: CapabilityGroup = CapabilityGroup.COMMANDS,
        auth_required: bool = True,
        streaming: bool = False,
        name: str | None = None,
        scopes: tuple[str, ...] | None = None,
    ) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`register`."""

        def decorate(handler: Handler) -> Handler:
            self.register(
                method, path, handler, group, auth_required, streaming, name, scopes
            )
            return handler

        return decorate

    def bind(
        self,
        endpoint_id: str,
        handler: Handler,
        sink: Callable[[Any], Any] | None = None,
    ) -> None:
        """Attach the handler (and raw-body sink) of a declared endpoint."""
        self._check_open()
        endpoint = self._endpoints[endpoint_id]
        endpoint.handler = handler
        if sink is not None:
            endpoint.sink = sink

    def enable_group(self, group: CapabilityGroup | str) -> None:
        """Turn a group on in the ``code`` layer."""
        group = CapabilityGroup(group)
        self.code_layer[group] = (True, f"code:enable_group:{group.value}")

    def disable_group(self, group: CapabilityGroup | str) -> None:
        """Turn a group off in the ``code`` layer; CORE cannot be turned off."""
        group = CapabilityGroup(group)
        if group is CapabilityGroup.CORE:
            raise ValueError("the core group cannot be disabled")
        self.code_layer[group] = (False, f"code:disable_group:{group.value}")


def catalogue_table() -> RouteTable:
    """A table holding the declared endpoints, with no handlers bound."""
    table = RouteTable()
    for endpoint_id, method, path, group, scopes, summary, flags in _CATALOGUE:
        table.add(Endpoint(endpoint_id, method, path, group, scopes, summary, **flags))
    return table
