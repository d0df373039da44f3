"""
Field and error blocks that several groups' schemas share (a change here
changes every endpoint that uses it).
"""

from __future__ import annotations

from sandboxd.api.fields import E, Event, F

GUARD = (
    E(400, "invalid_param", "a missing path"),
    E(400, "invalid_path", "a path holding NUL"),
    E(
        403,
        "path_not_allowed",
        "outside base_dir or paths.allow, or a link leading out",
    ),
    E(403, "path_denied", "matches paths.deny"),
    E(403, "symlink_denied", "a symlink under symlinks: deny"),
    E(
        403,
        "permission_denied",
        "the operating system refused (file permissions, a read-only mount)",
    ),
    E(
        503,
        "unavailable",
        "no file descriptor left for now (Retry-After)",
        "ResourceError",
    ),
)


# Fields of every request that starts a child (SPEC §7.4).
CHILD = (
    F("cwd", doc="working directory (guarded; default base_dir)"),
    F("env", "object", "extra environment variables (strings)"),
    F("user", "any", "run as this user (name or uid) when the daemon is root"),
    F("idle_timeout", "number", "seconds without output before the group is killed"),
)


GIT_LOCAL_ERRORS = (
    *GUARD,
    E(400, "invalid_path", ".. or NUL in a path"),
    E(400, "git_error", "git refused (its last lines)", "GitError"),
    E(404, "not_found", "the path is no repository"),
    E(408, "timeout", "git ran past its limit", "TimeoutError"),
    E(
        409,
        "git_conflict",
        "the repository's state refuses it (body: kind; locked: another git "
        "holds the repository, try again)",
        "GitError",
    ),
    E(507, "insufficient_storage", "the disk filled up; git wrote nothing", "OSError"),
)


GIT_URL_ERRORS = (
    E(
        400,
        "invalid_param",
        "not a URL, or credentials in it (user:pass@, a token-like query parameter)",
    ),
    E(403, "url_not_allowed", "transport, url_allow/url_deny or a private address"),
)


RESUME = (
    F(
        "after",
        "integer",
        "resume after this seq (else Last-Event-ID)",
        default=0,
        minimum=0,
    ),
)


LAST_EVENT_ID = F("Last-Event-ID", "integer", "the standard SSE resume header")


#: SPEC §20: EventSource cannot set headers (see docs/security.md for the risk).
QUERY_TOKEN = F(
    "access_token", doc="the token, for EventSource (it cannot set headers)"
)


GAP = Event("gap", '{"from", "to"}: events already dropped, sent first')


LINK_MINTED = (
    F("link_id"),
    F("token", doc="sbxl_...: shown once"),
    F("audience"),
    F("scopes", "array", items="string"),
    F("expires_at", doc="ISO 8601 UTC"),
    F("uses", "integer", nullable=True),
    F("url", doc="a preview link: the URL that opens it (when the door listens)"),
)


#: What a WebSocket upgrade sends (RFC 6455): the routes that upgrade.
WEBSOCKET_HANDSHAKE = (
    F("Upgrade", required=True, doc="websocket"),
    F("Connection", required=True, doc="Upgrade"),
    F("Sec-WebSocket-Key", required=True),
    F("Sec-WebSocket-Version", required=True, doc="13"),
)
