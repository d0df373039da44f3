"""What the endpoints of terminal sessions take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, F, Schema
from sandboxd.api.fragments import GUARD

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


SCHEMAS: dict[str, Schema] = {
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
            E(
                400,
                "invalid_param",
                "cols/rows not integers in range, bad env or user, or a Host header "
                "that is not a host name or address (the ws_url is built from it)",
            ),
            E(
                400,
                "param_not_allowed",
                "the shell is outside the default params.shells (bash, sh; type "
                "ValueError, as agent-sandbox-server answers a shell outside its "
                "built-in list)",
            ),
            E(
                403,
                "shell_not_allowed",
                "the policy's params.shells leave the shell out (type PolicyDenied, "
                "as agent-sandbox-server answers it)",
                "PolicyDenied",
            ),
            E(403, "param_not_allowed", "user refused by params"),
            *GUARD[1:],
            E(
                429,
                "too_many_sessions",
                "max_sessions (10) are open, or the caller's share of them "
                "(max_per_identity); Retry-After when one has no client "
                "attached: the time until its idle timeout closes it",
                "RuntimeError",
            ),
            E(500, "internal", "the PTY could not be created", "OSError"),
        ),
        notes="TERM=xterm-256color; the shell runs in its own session. Closed after "
        "idle_timeout_seconds (1800) with no client and no I/O, ending what runs "
        "in it (a job that prints nothing included: detaching does not keep a "
        "quiet job alive).",
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
        notes="Answers once the shell's whole process tree has ended. The terminal "
        "hangs up as a closing terminal window does (HUP), so that its jobs' traps "
        "run (a lock file removed, a file saved); what is left gets TERM after 2 s "
        "and KILL after 5 s, or KILL after 2 s once the shell has gone.",
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
}
