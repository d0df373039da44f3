"""
Errors as values: every refusal the daemon makes is one of these.

Handlers raise them; the pipeline turns them into the JSON body of SPEC §3
(``error``, ``type``, and for policy or guard decisions ``code`` plus
``endpoint``/``rule``/``scope``/``limit``/``retry_after``) in one place.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """
    An error a client is meant to see.

    :param status: the HTTP status.
    :param message: the human-readable ``error`` field.
    :param type: the seed's ``type`` field (an exception-like name).
    :param code: the machine-readable ``code`` of SPEC §6, or None.
    :param extra: further fields (``rule``, ``scope``, ``retry_after`` ...).
    :param headers: extra response headers (``Retry-After``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "ValueError",
        code: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.headers = headers or {}
        self.extra = {k: v for k, v in extra.items() if v is not None}

    def body(self) -> dict[str, Any]:
        """The JSON object sent to the client."""
        out: dict[str, Any] = {"error": self.message, "type": self.type}
        if self.code is not None:
            out["code"] = self.code
        out.update(self.extra)
        return out

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r}, code={self.code!r})"


def bad_request(message: str, code: str = "invalid_param", **extra: Any) -> ApiError:
    """A 400 for a malformed request."""
    return ApiError(400, message, "ValueError", code, **extra)


def not_found(message: str, type: str = "NotFoundError", **extra: Any) -> ApiError:
    """A 404 for a thing that does not exist."""
    return ApiError(404, message, type, "not_found", **extra)


def file_not_found(path: str) -> ApiError:
    """The seed's 404 for a path that does not exist."""
    return ApiError(
        404, f"No such file or directory: {path}", "FileNotFoundError", "not_found"
    )


def forbidden(
    message: str, code: str, type: str = "PermissionError", **extra: Any
) -> ApiError:
    """A 403 for a policy or guard refusal."""
    return ApiError(403, message, type, code, **extra)


def internal(message: str, type: str = "RuntimeError") -> ApiError:
    """A 500 whose message is safe to show (never a traceback)."""
    return ApiError(500, message, type, "internal")


def unavailable(message: str, type: str = "RuntimeError") -> ApiError:
    """A 503 for an optional dependency that is missing."""
    return ApiError(503, message, type, "unavailable")
