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
from typing import Any


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
    # 401
    UNAUTHORIZED = "unauthorized"
    # 403
    MISSING_SCOPE = "missing_scope"
    PATH_NOT_ALLOWED = "path_not_allowed"
    PATH_DENIED = "path_denied"
    READ_ONLY = "read_only"
    SYMLINK_DENIED = "symlink_denied"
    PARAM_NOT_ALLOWED = "param_not_allowed"
    ORIGIN_NOT_ALLOWED = "origin_not_allowed"
    HOST_NOT_ALLOWED = "host_not_allowed"
    PROTECTED_VARIABLE = "protected_variable"
    # 404
    NOT_FOUND = "not_found"
    ENDPOINT_DISABLED = "endpoint_disabled"
    # 409
    TURN_IN_PROGRESS = "turn_in_progress"
    ALREADY_RESOLVED = "already_resolved"
    WITHDRAWN = "withdrawn"
    FILE_EXISTS = "file_exists"
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
    # 500
    INTERNAL = "internal"
    # 502, 504, 503
    AGENT_ERROR = "agent_error"
    AGENT_TIMEOUT = "agent_timeout"
    UNAVAILABLE = "unavailable"
    AGENT_UNAVAILABLE = "agent_unavailable"
    # 507
    INSUFFICIENT_STORAGE = "insufficient_storage"


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

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r}, code={self.code!r})"


def bad_request(
    message: str, code: Code | str = Code.INVALID_PARAM, **extra: Any
) -> ApiError:
    """A 400 for a malformed request (``invalid_param`` unless told)."""
    return ApiError(400, message, "ValueError", code, **extra)


def invalid_path(message: str) -> ApiError:
    """400 ``invalid_path``: a path the pipeline or guard cannot accept."""
    return ApiError(400, message, "ValueError", Code.INVALID_PATH)


def unauthorized() -> ApiError:
    """The one 401 every failed authentication gets."""
    return ApiError(401, "unauthorized", "AuthError", Code.UNAUTHORIZED)


def ambiguous_credentials(message: str = "ambiguous credentials") -> ApiError:
    """400 ``ambiguous_credentials``: two different tokens were presented."""
    return ApiError(400, message, "AuthError", Code.AMBIGUOUS_CREDENTIALS)


def not_found(message: str, type: str = "NotFoundError", **extra: Any) -> ApiError:
    """A 404 for a thing that does not exist."""
    return ApiError(404, message, type, Code.NOT_FOUND, **extra)


def no_route(path: str) -> ApiError:
    """The seed's 404 for a path nothing serves."""
    return ApiError(404, f"Not found: {path}", "ValueError", Code.NOT_FOUND)


def file_not_found(path: str) -> ApiError:
    """The seed's 404 for a path that does not exist."""
    return ApiError(
        404, f"No such file or directory: {path}", "FileNotFoundError", Code.NOT_FOUND
    )


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


def forbidden(
    message: str, code: Code | str, type: str = "PermissionError", **extra: Any
) -> ApiError:
    """A 403 for a policy or guard refusal."""
    return ApiError(403, message, type, code, **extra)


def missing_scope(endpoint_id: str, scope: str, rule: str) -> ApiError:
    """403 ``missing_scope``: the caller's identity lacks ``scope``."""
    return forbidden(
        f"this identity lacks the scope {scope!r}",
        Code.MISSING_SCOPE,
        endpoint=endpoint_id,
        scope=scope,
        rule=rule,
    )


def payload_too_large(limit: int, what: str = "the request body") -> ApiError:
    """413 ``payload_too_large``."""
    return ApiError(
        413,
        f"{what} is over the limit of {limit} bytes",
        "ValueError",
        Code.PAYLOAD_TOO_LARGE,
        limit=limit,
    )


def limit_rule(source: str | None, key: str) -> str:
    """
    The rule string of a limit refusal: where the policy set ``limits.KEY``,
    else the built-in default's name.
    """
    return source or f"default:limits.{key}"


def limit_exceeded(
    status: int,
    message: str,
    code: Code | str,
    rule: str,
    type: str = "ResourceError",
    **extra: Any,
) -> ApiError:
    """A refusal at a limit (429s, 413s), naming the rule that set it."""
    return ApiError(status, message, type, code, rule=rule, **extra)


def timed_out(message: str, idle: bool = False, status: int = 408) -> ApiError:
    """
    A command ended on its hard (``timeout``) or idle (``idle_timeout``)
    limit; ``/shell`` answers these as 500 as the seed does, ``/code/run`` as
    408.
    """
    return ApiError(
        status, message, "TimeoutError", Code.IDLE_TIMEOUT if idle else Code.TIMEOUT
    )


def unsupported(message: str) -> ApiError:
    """501 ``unsupported``: a method or capability that is not implemented."""
    return ApiError(501, message, "ValueError", Code.UNSUPPORTED)


def internal(message: str, type: str = "RuntimeError") -> ApiError:
    """A 500 whose message is safe to show (never a traceback)."""
    return ApiError(500, message, type, Code.INTERNAL)


def unavailable(message: str, type: str = "RuntimeError") -> ApiError:
    """A 503 for an optional dependency that is missing."""
    return ApiError(503, message, type, Code.UNAVAILABLE)
