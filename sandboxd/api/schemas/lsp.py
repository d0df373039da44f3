"""What the endpoints of language servers take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, F, Schema
from sandboxd.api.fragments import GUARD, WEBSOCKET_HANDSHAKE

_SESSION = (
    F("id"),
    F("server", doc="the catalogue id (pylsp, pyright, ...)"),
    F("languages", "array", items="string"),
    F("root", doc="the project directory the server was started for"),
    F("state", enum=("starting", "ready", "failed", "closed")),
    F("pid", "integer", nullable=True),
    F("user", nullable=True),
    F("owner"),
    F("created_at", "number"),
    F("idle_seconds", "number"),
    F("open_documents", "integer"),
    F(
        "server_info",
        "object",
        "{name, version} as the server gave them",
        nullable=True,
    ),
    F(
        "position_encoding",
        enum=("utf-16", "utf-32", "utf-8"),
        doc="how the server counts a line's characters (converted both ways)",
    ),
    F(
        "capabilities",
        "array",
        "the server's providers (hoverProvider, ...)",
        items="string",
    ),
    F("failure", doc="why it is not running", nullable=True),
)

#: Which session answers: named, or found (and started) by server or
#: language, project root and user.
_WHICH = (
    F("session_id", doc="a session to ask (default: found or started for the file)"),
    F(
        "server",
        doc="which language server (pyright, pylsp, ...; see lsp_servers); "
        "default: the first installed for the file's language",
    ),
    F("language", doc="an LSP language id (default: from the file's extension)"),
    F(
        "root",
        doc="the project directory (default: the nearest one holding a project file)",
    ),
    F("user", "any", "who the server runs as (params.users)"),
)

_FILE = (
    F(
        "path",
        doc="the file asked about",
        required=True,
        min_length=1,
        example="app.py",
    ),
    *_WHICH,
)

_POSITION = (
    F("line", "integer", "from 1", required=True, minimum=1, example=1),
    F("column", "integer", "from 1, in characters", default=1, minimum=1),
)

_ANSWER = (
    F("session_id"),
    F("server"),
)

_LOCATION = (
    "[{path, line, column, end_line, end_column, text}]: lines and columns "
    "from 1 in characters; text is the line, cut at 1024 characters"
)

#: What a definition or references question answers.
_LOCATIONS = (
    *_ANSWER,
    F("locations", "array", _LOCATION, items="object"),
    F("outside", "integer", "locations left out: files the caller may not read"),
    F("truncated", "boolean"),
)

_MAX_RESULTS = F(
    "max_results", "integer", "at most the policy's max_results (200)", minimum=1
)

_ERRORS = (
    *GUARD,
    E(
        400,
        "invalid_param",
        "no language known for the file, an unknown or disallowed server (body: allowed), "
        "a file that is not UTF-8 (kind: not_text), a line past the end (kind: past_end), "
        "a server named for a language it does not handle (kind: wrong_language)",
    ),
    E(403, "param_not_allowed", "a refused user"),
    E(404, "not_found", "no such file, or no such session", "FileNotFoundError"),
    E(
        413,
        "payload_too_large",
        "the file is over max_bytes (4 MiB), or the server's answer or the "
        "file's diagnostics over max_message_bytes (16 MiB); the server lives on",
    ),
    E(
        429,
        "too_many_sessions",
        "max_sessions language servers run and none is idle (an idle one gives its place)",
        "ResourceError",
    ),
    E(
        501,
        "unsupported",
        "the server does not answer this question",
    ),
    E(
        502,
        "upstream_unavailable",
        "the server exited, broke its framing, or refused the request (body: lsp_error, stderr)",
        "ConnectionError",
    ),
    E(
        503,
        "unavailable",
        "no server for the language is installed (the message says how to install one)",
    ),
    E(
        504,
        "timeout",
        "the server did not start within start_timeout_seconds, or did not answer within "
        "timeout_seconds",
        "TimeoutError",
    ),
)

_NO_SESSION = E(404, "not_found", "unknown session, or another identity's")


_RENAME_ERRORS = (
    *_ERRORS,
    E(403, "read_only", "a file to change is below a paths.read_only entry"),
    E(
        412,
        "precondition_failed",
        "a file changed on disk after the server was sent it: ask again",
    ),
    E(
        507,
        "insufficient_storage",
        "the disk filled up; no file was changed",
        "OSError",
    ),
)

SCHEMAS: dict[str, Schema] = {
    "lsp_servers": Schema(
        response=(
            F(
                "servers",
                "array",
                "[{id, languages, command, installed, allowed, install}] in order of "
                "preference: for a language, the first installed and allowed one is used",
                items="object",
            ),
        ),
    ),
    "lsp_sessions_list": Schema(
        response=(F("sessions", "array", "session documents", items="object"),),
    ),
    "lsp_session_create": Schema(
        body=(
            F("server", doc="a catalogue id allowed by params.lsp_servers"),
            F("language", doc="start the first installed server of this language"),
            F("root", doc="the project directory (guarded); default base_dir"),
            F("user", "any", "who the server runs as (params.users)"),
        ),
        status=201,
        response=_SESSION,
        errors=_ERRORS,
        notes="Answers 200 with the session already running for the same server, root and "
        "user. The questions below start one themselves; this is for starting it ahead of "
        "them (a big project's index takes time).",
    ),
    "lsp_session_get": Schema(
        response=(
            *_SESSION,
            F(
                "messages",
                "array",
                "the server's last log messages: [{type, message}]",
                items="object",
            ),
            F("stderr", doc="the end of the server's standard error"),
        ),
        errors=(_NO_SESSION,),
    ),
    "lsp_session_delete": Schema(
        response=(F("id"), F("state", enum=("closed",))),
        errors=(_NO_SESSION,),
    ),
    "lsp_connect": Schema(
        query=(
            F("server", doc="a catalogue id allowed by params.lsp_servers"),
            F("language", doc="start the first installed server of this language"),
            F("root", doc="the project directory (guarded); default base_dir"),
            F("user", doc="who the server runs as (params.users)"),
            F(
                "access_token",
                doc="the token, for a browser's WebSocket (it cannot set headers)",
            ),
        ),
        headers=WEBSOCKET_HANDSHAKE,
        produces="websocket",
        errors=(
            *GUARD,
            E(
                400,
                "invalid_param",
                "a plain GET (send the upgrade), a broken handshake, no server or "
                "language named, an unknown or disallowed server",
            ),
            E(403, "param_not_allowed", "a refused user"),
            E(
                429,
                "too_many_sessions",
                "max_sessions language servers run (sessions and editors' sockets "
                "together) and no session is idle (an idle one gives its place)",
                "ResourceError",
            ),
            E(
                503,
                "unavailable",
                "no server for the language is installed (the message says how to install one)",
            ),
        ),
        notes="Each text frame is one JSON-RPC message; the server's messages come back "
        "unchanged. Every URI an editor's message names (uri, rootUri, any ...Uri, "
        "rootPath, workspaceFolders) must be a file:// path the caller may read, and the "
        "workspace must lie within root: a refused request is answered with error "
        "-32803 (data: {code, rule}) and not passed on, a refused notification is "
        "dropped and a window/logMessage says so. workspace/executeCommand runs only "
        "the commands in params.lsp_commands. The editor's settings (initializationOptions, "
        "workspace/didChangeConfiguration, answers to workspace/configuration) are "
        "removed unless params.lsp_settings is true. A frame that is not a JSON object is "
        "answered with -32700 or -32600. Binary frames close 1003, messages over "
        "max_message_bytes 1009; the server exiting or breaking its framing closes "
        "1011; closing the socket ends the server's whole tree.",
    ),
    "lsp_diagnostics": Schema(
        body=(
            *_FILE,
            F(
                "timeout",
                "number",
                "seconds to wait for the server's first report on the file's current text",
                default=10,
            ),
        ),
        response=(
            *_ANSWER,
            F("path", doc="the file, resolved"),
            F(
                "diagnostics",
                "array",
                "[{line, column, end_line, end_column, severity: error|warning|information|hint, "
                "code, source, message}] in file order",
                items="object",
            ),
            F(
                "counts",
                "object",
                "{error, warning, information, hint}: of every diagnostic the "
                "server reported for the file, those left out by the cut too",
            ),
            F(
                "truncated",
                "boolean",
                "the server reported more than the 1000 kept per file (the most "
                "severe are kept: errors first)",
            ),
            F(
                "settled",
                "boolean",
                "false: the server said nothing about the current text within timeout "
                "(the diagnostics are its earlier ones, if any)",
            ),
        ),
        errors=_ERRORS,
        notes="The file is read as it is on disk now and sent to the server when it changed; "
        "the answer comes once the server has reported on that text and then said nothing "
        "new for 0.3 s.",
    ),
    "lsp_definition": Schema(
        body=(*_FILE, *_POSITION, _MAX_RESULTS),
        response=_LOCATIONS,
        errors=_ERRORS,
    ),
    "lsp_references": Schema(
        body=(
            *_FILE,
            *_POSITION,
            F("include_declaration", "boolean", default=True),
            _MAX_RESULTS,
        ),
        response=_LOCATIONS,
        errors=_ERRORS,
    ),
    "lsp_hover": Schema(
        body=(*_FILE, *_POSITION),
        response=(
            *_ANSWER,
            F("found", "boolean", "false: nothing to say there"),
            F("contents", doc="Markdown or plain text, as the server wrote it"),
            F("range", "object", "{line, column, end_line, end_column}", nullable=True),
        ),
        errors=_ERRORS,
    ),
    "lsp_symbols": Schema(
        body=(
            *_FILE,
            F(
                "query",
                doc="search the project's symbols by name instead of listing the file's",
            ),
            _MAX_RESULTS,
        ),
        response=(
            *_ANSWER,
            F(
                "symbols",
                "array",
                "[{name, kind, container, path, line, column, end_line, end_column, text, "
                "body?}]: where each name is; for a file's symbols, body: {line, end_line}, "
                "the lines of the whole definition",
                items="object",
            ),
            F("outside", "integer", "symbols left out: files the caller may not read"),
            F("truncated", "boolean"),
        ),
        errors=_ERRORS,
    ),
    "lsp_rename": Schema(
        body=(
            *_FILE,
            *_POSITION,
            F(
                "new_name",
                doc="the new name",
                required=True,
                min_length=1,
                example="new_name",
            ),
            F(
                "dry_run",
                "boolean",
                "say what would change, write nothing",
                default=False,
            ),
        ),
        response=(
            *_ANSWER,
            F(
                "files",
                "array",
                "[{path, edits, diff, diff_truncated}]: each file the rename changes, "
                "with a unified diff (cut at 20,000 characters)",
                items="object",
            ),
            F("applied", "boolean", "false with dry_run"),
        ),
        errors=_RENAME_ERRORS,
        notes="Every file is read, checked against the path rules for writing and "
        "its new text made before the first is written; each is then replaced "
        "atomically, and a failure puts back those already replaced. A rename "
        "that would also create, move or delete files is refused (501).",
    ),
    "lsp_completions": Schema(
        body=(*_FILE, *_POSITION, _MAX_RESULTS),
        response=(
            *_ANSWER,
            F(
                "items",
                "array",
                "[{label, kind, detail, documentation, insert_text}]: those starting "
                "with the name being typed first, in the server's order within each",
                items="object",
            ),
            F(
                "is_incomplete",
                "boolean",
                "the server would give more as more is typed",
            ),
            F("truncated", "boolean"),
        ),
        errors=_ERRORS,
    ),
}
