# -*- test-case-name: tests.test_errors -*-
"""
Errors as values: every refusal the daemon makes is one of these.

Handlers raise them; each front door turns them into its own framing in
one place (the HTTP door into the JSON body of SPEC §3: ``error``, ``type``,
and for policy or guard decisions ``code`` plus
``endpoint``/``rule``/``scope``/``limit``/``retry_after``).  :class:`Code`
holds exactly the codes of SPEC §6, so a code a client may meet is one the
spec documents; the constructors below are the shapes used more than once.
"""

from __future__ import annotations

import enum
import errno
import math
import os
from typing import Any, Protocol


class Code(enum.StrEnum):
    """The machine-readable ``code`` values of SPEC §6."""

    # 400
    INVALID_JSON = "invalid_json"
    INVALID_PARAM = "invalid_param"
    INVALID_PATH = "invalid_path"
    DUPLICATE_PARAMETER = "duplicate_parameter"
    TRANSFER_ENCODING_NOT_ALLOWED = "transfer_encoding_not_allowed"
    AMBIGUOUS_CREDENTIALS = "ambiguous_credentials"
    SIGNAL_NOT_ALLOWED = "signal_not_allowed"
    MALFORMED_REQUEST = "malformed_request"
    GIT_ERROR = "git_error"
    #: The seed's own codes for ``GET /v1/responses`` that is not a
    #: WebSocket upgrade, or a malformed one (§26).
    WEBSOCKET_UPGRADE_REQUIRED = "agents.websocket_upgrade_required"
    WEBSOCKET_HANDSHAKE_INVALID = "agents.websocket_handshake_invalid"
    # 401
    UNAUTHORIZED = "unauthorized"
    # 403
    MISSING_SCOPE = "missing_scope"
    PATH_NOT_ALLOWED = "path_not_allowed"
    PATH_DENIED = "path_denied"
    READ_ONLY = "read_only"
    SYMLINK_DENIED = "symlink_denied"
    #: The operating system, not the policy, refused (EACCES, EPERM, EROFS).
    PERMISSION_DENIED = "permission_denied"
    PARAM_NOT_ALLOWED = "param_not_allowed"
    #: The seed's own codes for a refusal by ``allow_commands``/
    #: ``deny_commands``, ``languages`` and the extension lists (§21: its
    #: SDK reads ``extension_not_allowed`` as a file refusal).
    COMMAND_NOT_ALLOWED = "command_not_allowed"
    SHELL_NOT_ALLOWED = "shell_not_allowed"
    LANGUAGE_NOT_ALLOWED = "language_not_allowed"
    EXTENSION_NOT_ALLOWED = "extension_not_allowed"
    ORIGIN_NOT_ALLOWED = "origin_not_allowed"
    HOST_NOT_ALLOWED = "host_not_allowed"
    PROTECTED_VARIABLE = "protected_variable"
    URL_NOT_ALLOWED = "url_not_allowed"
    PROTECTED_BRANCH = "protected_branch"
    # 404
    NOT_FOUND = "not_found"
    ENDPOINT_DISABLED = "endpoint_disabled"
    #: The seed's own code for a route its local server cannot serve (§26).
    NOT_IMPLEMENTED_LOCALLY = "agents.not_implemented_locally"
    # 409
    TURN_IN_PROGRESS = "turn_in_progress"
    ALREADY_RESOLVED = "already_resolved"
    WITHDRAWN = "withdrawn"
    FILE_EXISTS = "file_exists"
    STDIN_CLOSED = "stdin_closed"
    OUTPUT_NOT_CAPTURED = "output_not_captured"
    GIT_CONFLICT = "git_conflict"
    CONTEXT_BUSY = "context_busy"
    CONTEXT_DEAD = "context_dead"
    #: The seed's own code: an Idempotency-Key reused with another body (§26).
    IDEMPOTENCY_MISMATCH = "idempotency.mismatch"
    # 408
    TIMEOUT = "timeout"
    IDLE_TIMEOUT = "idle_timeout"
    # 501
    UNSUPPORTED = "unsupported"
    # 412
    PRECONDITION_FAILED = "precondition_failed"
    # 413
    PAYLOAD_TOO_LARGE = "payload_too_large"
    # 429
    RATE_LIMITED = "rate_limited"
    CONCURRENCY_LIMITED = "concurrency_limited"
    TOO_MANY_PROCESSES = "too_many_processes"
    TOO_MANY_SESSIONS = "too_many_sessions"
    TOO_MANY_JOBS = "too_many_jobs"
    TOO_MANY_CONTEXTS = "too_many_contexts"
    TOO_MANY_EXECUTIONS = "too_many_executions"
    # 500
    INTERNAL = "internal"
    # 502, 504, 503
    AGENT_ERROR = "agent_error"
    REMOTE_ERROR = "remote_error"
    AGENT_TIMEOUT = "agent_timeout"
    UNAVAILABLE = "unavailable"
    AGENT_UNAVAILABLE = "agent_unavailable"
    # 507
    INSUFFICIENT_STORAGE = "insufficient_storage"
    # capability links and the preview door
    LINK_INVALID = "link_invalid"
    LINK_EXPIRED = "link_expired"
    PORT_NOT_ALLOWED = "port_not_allowed"
    PORT_NOT_EXPOSED = "port_not_exposed"
    MISDIRECTED_REQUEST = "misdirected_request"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    UPSTREAM_TIMEOUT = "upstream_timeout"


class ApiError(Exception):
    """
    An error a client is meant to see.

    :param status: the HTTP status.
    :param message: the human-readable ``error`` field.
    :param type: the seed's ``type`` field (an exception-like name).
    :param code: the machine-readable ``code`` of SPEC §6, or None; a string
        that is not a :class:`Code` is a bug and raises ``ValueError``.
    :param extra: further fields (``rule``, ``scope``, ``retry_after`` ...).
    :param headers: extra response headers (``Retry-After``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "ValueError",
        code: Code | str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = Code(code) if code is not None else None
        self.headers = headers or {}
        self.extra = {k: v for k, v in extra.items() if v is not None}

    def reworded(self, message: str) -> ApiError:
        """The same error (status, type, code, fields, headers) saying ``message``."""
        return ApiError(
            self.status,
            message,
            self.type,
            self.code,
            dict(self.headers),
            **self.extra,
        )

    @property
    def rule(self) -> str | None:
        """The policy rule that decided this refusal, if one did."""
        rule = self.extra.get("rule")
        return rule if isinstance(rule, str) else None

    def body(self) -> dict[str, Any]:
        """The JSON object sent to the client (SPEC §3), built only here."""
        out: dict[str, Any] = {"error": self.message, "type": self.type}
        if self.code is not None:
            out["code"] = str(self.code)
        out.update(self.extra)
        return out

    def event(self) -> dict[str, Any]:
        """
        The data of an SSE ``error`` event (SPEC §9): the body's ``error`` and
        ``type`` only, as the seed's streams send them.
        """
        body = self.body()
        return {key: body[key] for key in ("error", "type")}

    @classmethod
    def from_body(
        cls, status: Any, body: dict[str, Any], default: str = "error"
    ) -> ApiError:
        """
        The inverse of :meth:`body`, for an error that crossed a process
        boundary as JSON (the browser worker's replies): a missing status is
        500, a missing message ``default``, a missing or unknown code
        ``internal``.
        """
        code = body.get("code")
        extra = {
            k: v
            for k, v in body.items()
            if k not in ("status", "error", "type", "code")
        }
        return cls(
            status if isinstance(status, int) else 500,
            str(body.get("error") or default),
            str(body.get("type") or "RuntimeError"),
            code if code in {c.value for c in Code} else Code.INTERNAL,
            **extra,
        )

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r}, code={self.code!r})"


class RuleSource(Protocol):
    """What a refusal asks of an effective rule: where a leaf key was set."""

    def source(self, leaf: str) -> str | None:
        """The rule string behind ``leaf``, if a policy layer set it."""


def policy_rule(rule: RuleSource, leaf: str) -> str:
    """
    The ``rule`` of a refusal decided by the policy leaf ``leaf``
    (``params.shells``): where the policy set it, else ``default:LEAF``.
    """
    return rule.source(leaf) or f"default:{leaf}"


def limit_rule(rule: RuleSource, key: str) -> str:
    """The ``rule`` of a refusal at ``limits.KEY`` (see :func:`policy_rule`)."""
    return policy_rule(rule, f"limits.{key}")


def quoted(value: object, limit: int | None = None) -> str:
    """
    A caller's value as a message quotes it: its ``repr``, cut after
    ``limit`` characters (default ``QUOTED_VALUE_CHARS``) with an ellipsis
    and the value's length, so that a refusal's size does not follow its
    input's (a message travels in headers on some doors: gRPC's
    ``grpc-message``).
    """
    if limit is None:
        # Here, not at the top: the policy package imports this module.
        from sandboxd.policy.defaults import QUOTED_VALUE_CHARS

        limit = QUOTED_VALUE_CHARS
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}\u2026 ({len(text)} characters)"


# -- 400 ---------------------------------------------------------------------


def bad_request(
    message: str,
    code: Code = Code.INVALID_PARAM,
    type: str = "ValueError",
    **extra: Any,
) -> ApiError:
    """A 400 for a malformed request (``invalid_param`` unless told)."""
    return ApiError(400, message, type, code, **extra)


def invalid_json(message: str = "the body is not valid JSON") -> ApiError:
    """400 ``invalid_json``: a body that is not a JSON object."""
    return bad_request(message, Code.INVALID_JSON)


def invalid_path(message: str, type: str = "ValueError") -> ApiError:
    """400 ``invalid_path``: a path the pipeline or guard cannot accept."""
    return bad_request(message, Code.INVALID_PATH, type)


def malformed_request(
    message: str, status: int = 400, type: str = "ValueError"
) -> ApiError:
    """``malformed_request``: framing the HTTP or WebSocket parser refused."""
    return ApiError(status, message, type, Code.MALFORMED_REQUEST)


def is_a_directory(path: Any) -> ApiError:
    """400: a file operation named a directory."""
    return bad_request(f"Is a directory: {path}", type="IsADirectoryError")


def not_a_directory(path: Any, code: Code = Code.INVALID_PARAM) -> ApiError:
    """400: a directory operation (or a path's parent) is not a directory."""
    return bad_request(f"Not a directory: {path}", code, "NotADirectoryError")


def signal_not_allowed(message: str, rule: str, narrowed: bool = False) -> ApiError:
    """
    ``signal_not_allowed``: a signal outside ``params.allowed_signals``.

    400 for a signal no policy allows (outside the built-in set), as the
    seed answers; 403 for one the built-in set has and the policy took
    away, which the seed answers as a policy refusal (its SDK raises
    ``PolicyDeniedError`` for it).
    """
    if narrowed:
        return forbidden(message, Code.SIGNAL_NOT_ALLOWED, rule=rule)
    return bad_request(message, Code.SIGNAL_NOT_ALLOWED, rule=rule)


def git_error(message: str) -> ApiError:
    """400 ``git_error``: git itself refused."""
    return bad_request(message, Code.GIT_ERROR, "GitError")


def git_conflict(message: str, kind: str, **extra: Any) -> ApiError:
    """409 ``git_conflict``: the repository's state refuses the call (``kind`` says how)."""
    return ApiError(409, message, "GitError", Code.GIT_CONFLICT, kind=kind, **extra)


def remote_error(message: str, kind: str) -> ApiError:
    """
    502 ``remote_error``: the git remote refused or could not be reached;
    never 401, which means the caller's token for this daemon is wrong.
    """
    return ApiError(502, message, "GitError", Code.REMOTE_ERROR, kind=kind)


#: What a 401 asks for (RFC 6750; MCP clients read it before anything else
#: to tell a bearer token server from one that wants OAuth discovery).
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="sandboxd"'}


def unauthorized() -> ApiError:
    """The one 401 every failed authentication gets."""
    return ApiError(
        401, "unauthorized", "AuthError", Code.UNAUTHORIZED, headers=dict(_CHALLENGE)
    )


def identity_removed(who: str) -> ApiError:
    """401 for a connection whose identity a reload took out of the policy."""
    return ApiError(
        401,
        f"the identity {who!r} is no longer in the policy",
        "AuthError",
        Code.UNAUTHORIZED,
        headers=dict(_CHALLENGE),
    )


def credential_changed(who: str) -> ApiError:
    """401 for a connection opened with a token a reload replaced or removed."""
    return ApiError(
        401,
        f"the token {who!r} connected with was changed in the policy; "
        "connect again with the new one",
        "AuthError",
        Code.UNAUTHORIZED,
        headers=dict(_CHALLENGE),
    )


def ambiguous_credentials(message: str = "ambiguous credentials") -> ApiError:
    """400 ``ambiguous_credentials``: two different tokens were presented."""
    return ApiError(400, message, "AuthError", Code.AMBIGUOUS_CREDENTIALS)


# -- 403 ---------------------------------------------------------------------


def forbidden(
    message: str, code: Code, type: str = "PermissionError", **extra: Any
) -> ApiError:
    """A 403 for a policy or guard refusal."""
    return ApiError(403, message, type, code, **extra)


def mount_point(message: str) -> ApiError:
    """
    403 ``path_not_allowed`` (rule ``guard:mount-point``): a mount point, or
    a tree holding one, that a delete, a move or a write would reach.
    """
    return forbidden(message, Code.PATH_NOT_ALLOWED, rule="guard:mount-point")


def permission_denied(path: Any) -> ApiError:
    """
    403 ``permission_denied``: the operating system (not the policy or the
    guard) said EACCES, EPERM or EROFS.  No ``rule``: no policy decided it.
    """
    return ApiError(
        403, f"Permission denied: {path}", "PermissionError", Code.PERMISSION_DENIED
    )


def missing_scope(
    endpoint_id: str, scope: str, rule: str, type: str = "PermissionError"
) -> ApiError:
    """403 ``missing_scope``: the caller's identity lacks ``scope``."""
    return forbidden(
        f"this identity lacks the scope {scope!r}",
        Code.MISSING_SCOPE,
        type,
        endpoint=endpoint_id,
        scope=scope,
        rule=rule,
    )


# -- 404 ---------------------------------------------------------------------


def not_found(message: str, type: str = "NotFoundError", **extra: Any) -> ApiError:
    """A 404 for a thing that does not exist."""
    return ApiError(404, message, type, Code.NOT_FOUND, **extra)


def no_route(path: str) -> ApiError:
    """The seed's 404 for a path nothing serves."""
    return not_found(f"Not found: {path}", "ValueError")


def file_not_found(path: str) -> ApiError:
    """The seed's 404 for a path that does not exist."""
    return not_found(f"No such file or directory: {path}", "FileNotFoundError")


def endpoint_disabled(endpoint_id: str, rule: str | None, why: str) -> ApiError:
    """404 ``endpoint_disabled`` naming the rule that switched it off."""
    return ApiError(
        404,
        f"endpoint {endpoint_id!r} {why}",
        "ValueError",
        Code.ENDPOINT_DISABLED,
        endpoint=endpoint_id,
        rule=rule,
    )


# -- 408, 409, 412, 413, 416 ------------------------------------------------


def timed_out(
    message: str, idle: bool = False, status: int = 408, **extra: Any
) -> ApiError:
    """
    A command ended on its hard (``timeout``) or idle (``idle_timeout``)
    limit; ``/shell`` answers these as 500 as the seed does, ``/code/run`` as
    408.
    """
    code = Code.IDLE_TIMEOUT if idle else Code.TIMEOUT
    return ApiError(status, message, "TimeoutError", code, **extra)


def conflict(
    message: str, code: Code, type: str = "RuntimeError", **extra: Any
) -> ApiError:
    """409: the state changed under the request."""
    return ApiError(409, message, type, code, **extra)


def idempotency_mismatch() -> ApiError:
    """409: an ``Idempotency-Key`` seen before, with another body (SPEC §26)."""
    return ApiError(
        409,
        "this Idempotency-Key was used with another request body",
        "ValueError",
        Code.IDEMPOTENCY_MISMATCH,
        param="Idempotency-Key",
    )


def not_implemented_locally(message: str) -> ApiError:
    """
    404 for a route of OpenAI's hosted service that a local daemon cannot
    serve: final (the OpenAI SDK would retry a 501), as the seed answers.
    """
    return ApiError(404, message, "NotFoundError", Code.NOT_IMPLEMENTED_LOCALLY)


def file_exists(message: str) -> ApiError:
    """409 ``file_exists``: a create without overwrite met an existing file."""
    return conflict(message, Code.FILE_EXISTS, "FileExistsError")


def precondition_failed(path: Any) -> ApiError:
    """412 ``precondition_failed``: ``If-Match`` names an older version."""
    return ApiError(
        412,
        f"the file changed since the given ETag: {path}",
        "ValueError",
        Code.PRECONDITION_FAILED,
    )


def unmet_precondition(message: str) -> ApiError:
    """
    412 ``precondition_failed`` for a condition other than an ETag: a date
    the file is newer than, a terminal a process does not have.
    """
    return ApiError(412, message, "ValueError", Code.PRECONDITION_FAILED)


def method_not_allowed(method: str, allowed: list[str]) -> ApiError:
    """405 ``unsupported``: a path that takes other methods, named in ``Allow``."""
    return ApiError(
        405,
        f"{method} is not served here (allowed: {', '.join(allowed)})",
        "ValueError",
        Code.UNSUPPORTED,
        headers={"Allow": ", ".join(allowed)},
    )


def directory_not_empty(message: str) -> ApiError:
    """409 for a directory deleted without ``recursive`` that has entries."""
    return ApiError(409, message, "OSError")


def payload_too_large(
    limit: int,
    what: str = "the request body",
    message: str | None = None,
    setting: str | None = None,
    **extra: Any,
) -> ApiError:
    """
    413 ``payload_too_large`` (``message`` replaces the default wording).

    :param setting: the policy key that sets ``limit``
        (:func:`limit_setting`), named in the message and the body so an
        operator knows what to raise.
    """
    text = message or f"{what} is over the limit of {limit} bytes"
    if setting is not None:
        text += f" (the policy's {setting})"
        extra["setting"] = setting
    return ApiError(
        413,
        text,
        "ValueError",
        Code.PAYLOAD_TOO_LARGE,
        limit=limit,
        **extra,
    )


def limit_setting(endpoint_id: str, key: str) -> str:
    """The policy key of one endpoint's limit: ``endpoints.ID.limits.KEY``."""
    return f"endpoints.{endpoint_id}.limits.{key}"


def range_not_satisfiable(size: int) -> ApiError:
    """416 for a ``Range`` past the end of a file of ``size`` bytes."""
    return ApiError(
        416,
        "the range is not satisfiable",
        "ValueError",
        Code.INVALID_PARAM,
        headers={"Content-Range": f"bytes */{size}"},
    )


# -- 429 and other limits ----------------------------------------------------


def limit_exceeded(
    status: int,
    message: str,
    code: Code,
    rule: str | None = None,
    type: str = "ResourceError",
    **extra: Any,
) -> ApiError:
    """
    A refusal at a limit (429s, and the 500s of a listing cut short),
    naming the rule that set it (:func:`limit_rule`) where a policy key did.
    """
    return ApiError(status, message, type, code, **extra, rule=rule)


def rate_limited(message: str, retry_after: int, **extra: Any) -> ApiError:
    """429 ``rate_limited`` with ``Retry-After`` (header and field)."""
    return ApiError(
        429,
        message,
        "ResourceError",
        Code.RATE_LIMITED,
        headers={"Retry-After": str(retry_after)},
        **extra,
        retry_after=retry_after,
    )


# -- 5xx ---------------------------------------------------------------------


def internal(message: str, type: str = "RuntimeError") -> ApiError:
    """A 500 whose message is safe to show (never a traceback)."""
    return ApiError(500, message, type, Code.INTERNAL)


def nonfinite_at(value: Any, where: str = "$") -> str | None:
    """
    Where in ``value`` a float with no JSON form (``inf``, ``-inf``,
    ``nan``) is, as a JSONPath (``$.result[2]``), or None.  Walked only
    once an encoder has refused a document, to say where.
    """
    if isinstance(value, float):
        return None if math.isfinite(value) else where
    if isinstance(value, dict):
        items: Any = ((f"{where}.{k}", v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for path, item in items:
        found = nonfinite_at(item, path)
        if found is not None:
            return found
    return None


def not_json(value: Any, what: str = "the answer") -> ApiError:
    """
    The 500 for an answer a handler built that JSON cannot carry (a
    non-finite number: Python's encoder would write ``NaN`` or
    ``Infinity``, which no strict JSON reader accepts): sent instead of
    it, before anything of the answer is.
    """
    try:
        where = nonfinite_at(value)
    except RecursionError:  # a cycle, or nesting deeper than the encoder took
        where = None
    if where is None:
        return internal(f"{what} is not JSON", "ValueError")
    return internal(
        f"{what} is not JSON: {where} is a non-finite number"
        " (inf or nan), which JSON cannot represent",
        "ValueError",
    )


def unexpected(error: object) -> ApiError:
    """
    The 500 for an exception no handler expected: its name and message;
    but the 503 or 507 of :func:`exhausted` for an ``OSError`` that says
    the sandbox is out of processes, descriptors, memory or disk.
    """
    refused = exhausted(error)
    if refused is not None:
        return refused
    name = type(error).__name__
    return internal(str(error) or name, name)


def unsupported(message: str, type: str = "ValueError") -> ApiError:
    """501 ``unsupported``: a method or capability that is not implemented."""
    return ApiError(501, message, type, Code.UNSUPPORTED)


def agent_error(message: str, **extra: Any) -> ApiError:
    """502 ``agent_error``: a coding agent answered with an error."""
    return ApiError(502, message, "RuntimeError", Code.AGENT_ERROR, **extra)


def unavailable(
    message: str, type: str = "RuntimeError", retry_after: int | None = None
) -> ApiError:
    """
    A 503 for an optional dependency that is missing (or not ready yet).

    :param retry_after: seconds after which a retry may succeed (sent as
        ``Retry-After``), for what is only not ready yet; ``None`` for
        what a retry will not change.
    """
    headers = None if retry_after is None else {"Retry-After": str(retry_after)}
    return ApiError(503, message, type, Code.UNAVAILABLE, headers=headers)


#: What the kernel answers while the daemon (or the whole sandbox) is out of
#: processes, file descriptors or memory: a retry once some are let go may
#: succeed.
RESOURCE_ERRNOS = frozenset({errno.EAGAIN, errno.EMFILE, errno.ENFILE, errno.ENOMEM})

#: The ``Retry-After`` of a call refused for want of those.
RESOURCE_RETRY_SECONDS = 1

#: What the kernel answers when the disk (or the user's quota) is full.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def out_of_resources(error: OSError, doing: str) -> ApiError:
    """
    503 ``unavailable`` (type ``ResourceError``, with ``Retry-After``) for
    ``error``, one of :data:`RESOURCE_ERRNOS`: nothing was done, and the
    same call may succeed once the sandbox has let some go.

    :param doing: what could not be done, e.g. ``"cannot start a process now"``.
    """
    reason = os.strerror(error.errno) if error.errno else str(error)
    return unavailable(
        f"{doing}: {reason}", "ResourceError", retry_after=RESOURCE_RETRY_SECONDS
    )


def no_thread(doing: str = "cannot start a thread for this call now") -> ApiError:
    """
    :func:`out_of_resources` for work that needs a thread the kernel would
    not start (Python raises ``RuntimeError`` for the ``EAGAIN`` of
    ``pthread_create``): the process is at its limit of processes or of
    memory, as a fork refused for the same reason, and nothing was done.
    """
    return out_of_resources(OSError(errno.EAGAIN, os.strerror(errno.EAGAIN)), doing)


def exhausted(error: object) -> ApiError | None:
    """
    :func:`out_of_resources` for an ``OSError`` of :data:`RESOURCE_ERRNOS`
    that reached a door unhandled (a start deep in a group's code that
    the sandbox had no room for), :func:`insufficient_storage` for one of
    :data:`NO_SPACE_ERRNOS` (a file the daemon writes for its own use, on a
    disk the sandbox's work filled), else None: a door answers it, and need
    not log it as a bug.
    """
    if not isinstance(error, OSError):
        return None
    if error.errno in RESOURCE_ERRNOS:
        return out_of_resources(error, "the sandbox has no room for this call now")
    if error.errno in NO_SPACE_ERRNOS:
        return insufficient_storage(
            f"the disk is full ({os.strerror(error.errno)}); nothing was done"
        )
    return None


def agent_unavailable(message: str, **extra: Any) -> ApiError:
    """503 ``agent_unavailable``: the agent is missing or no longer running."""
    return ApiError(503, message, "RuntimeError", Code.AGENT_UNAVAILABLE, **extra)


def agent_timeout(message: str, **extra: Any) -> ApiError:
    """504 ``agent_timeout``: a coding agent did not answer within its limit."""
    return ApiError(504, message, "TimeoutError", Code.AGENT_TIMEOUT, **extra)


def noted(error: ApiError, note: str) -> ApiError:
    """The same refusal, its message followed by ``note`` (what was done about it)."""
    return ApiError(
        error.status,
        f"{error.message} ({note})",
        error.type,
        error.code,
        headers=error.headers,
        **error.extra,
    )


def insufficient_storage(message: str = "no space left on the device") -> ApiError:
    """507 ``insufficient_storage``: the disk filled; nothing was half-written."""
    return ApiError(507, message, "OSError", Code.INSUFFICIENT_STORAGE)


# -- capability links and the preview door ------------------------------------


def link_refused(message: str, expired: bool = False) -> ApiError:
    """401 ``link_invalid`` (bad, revoked, used up, another audience) or
    ``link_expired``."""
    code = Code.LINK_EXPIRED if expired else Code.LINK_INVALID
    return ApiError(401, message, "AuthError", code)


def port_not_allowed(port: int, rule: str) -> ApiError:
    """403 ``port_not_allowed``: a preview port outside ``params.ports`` or denied."""
    return forbidden(
        f"port {port} may not be previewed", Code.PORT_NOT_ALLOWED, rule=rule
    )


def port_not_exposed(port: int) -> ApiError:
    """404 ``port_not_exposed``: nobody exposed this port for preview."""
    return ApiError(
        404, f"port {port} is not exposed", "NotFoundError", Code.PORT_NOT_EXPOSED
    )


def misdirected(host: str, path_mode: bool = False) -> ApiError:
    """
    421 ``misdirected_request``: a Host the preview door does not serve,
    or (``path_mode``) one of the door's own names with a path that names
    no port.
    """
    message = (
        f"the path names no preview: on {host!r} a preview is at /p/PORT/"
        if path_mode
        else f"the Host {host!r} matches no preview"
    )
    return ApiError(421, message, "ValueError", Code.MISDIRECTED_REQUEST)


def upstream_unavailable(port: int, why: str | None = None) -> ApiError:
    """
    502 ``upstream_unavailable``: nothing answers on the previewed port,
    or the app there gave an answer the door cannot pass on (``why``: a
    head that is not HTTP, two lengths, a close before any answer), which
    is the app's bug to fix rather than a server to start.
    """
    return ApiError(
        502,
        f"nothing is answering on port {port}"
        if why is None
        else f"no usable answer from the app on port {port}: {why}",
        "ConnectionError",
        Code.UPSTREAM_UNAVAILABLE,
        port=port,
    )


def listens_elsewhere(port: int, addresses: list[str]) -> ApiError:
    """
    502 ``upstream_unavailable``: the app listens, but only on addresses
    the preview door does not reach (it connects to 127.0.0.1, then ::1).
    """
    where = ", ".join(addresses)
    return ApiError(
        502,
        f"port {port} listens on {where} only; the preview door reaches 127.0.0.1 "
        "and ::1: bind the app to 0.0.0.0 or 127.0.0.1",
        "ConnectionError",
        Code.UPSTREAM_UNAVAILABLE,
        port=port,
        listens_on=addresses,
    )


def server_unavailable(message: str, **extra: Any) -> ApiError:
    """
    502 ``upstream_unavailable`` for a server the daemon speaks to on a
    caller's behalf (a language server) that is gone, or refused a request.
    """
    return ApiError(502, message, "ConnectionError", Code.UPSTREAM_UNAVAILABLE, **extra)


def upstream_timeout(port: int, seconds: float) -> ApiError:
    """504 ``upstream_timeout``: the app sent no response head in time."""
    return ApiError(
        504,
        f"the app on port {port} sent no response within {seconds:g} s",
        "TimeoutError",
        Code.UPSTREAM_TIMEOUT,
        port=port,
    )
