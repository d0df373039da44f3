"""
The client's exceptions: one class per SPEC §6 ``code``, grouped in
families by what went wrong, all under :class:`SandboxError`.

A caller catches one code (``except PathNotAllowed``), one family
(``except PermissionDenied`` for every 403 policy or guard refusal,
``except LimitExceeded`` for every 429) or everything
(``except SandboxError``).  Each error carries the daemon's answer:
``status``, ``code``, ``rule``, ``message``, ``type`` and the whole JSON
``body``.  Failures that never reached an answer (a refused connection, a
cut stream, a client-side timeout) are :class:`ConnectionFailed` and
:class:`RequestTimeout`, with ``status`` None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SandboxError(Exception):
    """
    Every error the client raises.

    :ivar status: the HTTP status, or None when no answer came.
    :ivar code: the SPEC §6 ``code`` (``path_not_allowed`` ...), or None.
    :ivar rule: the policy rule behind a refusal (``policy:endpoints.shell``).
    :ivar message: the daemon's ``error`` text.
    :ivar type: the daemon's ``type`` field (``PermissionError`` ...).
    :ivar body: the whole JSON error body.
    """

    #: The code a class stands for (families have none).
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        rule: str | None = None,
        type: str | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code if code is not None else self.default_code
        self.rule = rule
        self.type = type
        self.body: dict[str, Any] = dict(body or {})

    @property
    def endpoint(self) -> str | None:
        """The endpoint id a policy refusal names, when it does."""
        value = self.body.get("endpoint")
        return value if isinstance(value, str) else None

    @property
    def scope(self) -> str | None:
        """The missing scope (``missing_scope``)."""
        value = self.body.get("scope")
        return value if isinstance(value, str) else None

    def __str__(self) -> str:
        parts = [self.message]
        details = [
            f"{k} {v}"
            for k, v in (("code", self.code), ("rule", self.rule))
            if v is not None
        ]
        if self.status is not None:
            details.insert(0, f"HTTP {self.status}")
        if details:
            parts.append("(" + ", ".join(details) + ")")
        return " ".join(parts)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, status={self.status!r}, "
            f"code={self.code!r}, rule={self.rule!r})"
        )


# -- no answer -------------------------------------------------------------------


class ConnectionFailed(SandboxError):
    """The daemon could not be reached, or the connection dropped mid-answer."""

    default_code = "connection_failed"


class RequestTimeout(SandboxError):
    """No answer within the client's timeout (the call's ``timeout``)."""

    default_code = "client_timeout"


class ProtocolError(SandboxError):
    """The daemon answered something the client cannot read (not JSON ...)."""

    default_code = "protocol_error"


# -- families ------------------------------------------------------------------


class InvalidRequest(SandboxError):
    """400: the request was malformed; nothing happened."""


class AuthenticationError(SandboxError):
    """401: no token, or a wrong one."""


class PermissionDenied(SandboxError):
    """
    403: a refusal by the policy, the path guard or the operating system.

    ``rule`` says which rule refused; the operating system's own refusal
    (file permissions, a read-only mount) is this class itself, code
    ``permission_denied``, with no rule.
    """

    default_code = "permission_denied"


class NotFoundError(SandboxError):
    """404: no such thing, or the endpoint is switched off."""


class DeadlineExceeded(SandboxError):
    """408 (or a timed-out child): a limit on time ran out."""


class Conflict(SandboxError):
    """409: the state changed under the request."""


class LimitExceeded(SandboxError):
    """
    429: a rate, concurrency, process or session limit.

    :ivar retry_after: seconds the daemon asks to wait, or None.
    """

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        raw = self.body.get("retry_after")
        self.retry_after: float | None = (
            float(raw)
            if isinstance(raw, int | float) and not isinstance(raw, bool)
            else None
        )


class ServerError(SandboxError):
    """5xx: the daemon or one of its dependencies failed."""


# -- one class per code (SPEC §6) -----------------------------------------------


class InvalidJson(InvalidRequest):
    """The body is not a JSON object."""

    default_code = "invalid_json"


class InvalidParam(InvalidRequest):
    """A parameter is missing, of the wrong type or out of range."""

    default_code = "invalid_param"


class UploadMismatch(InvalidParam):
    """
    ``upload_id`` names an upload of another target path or size than the
    call's (found by the client before a byte was sent; that upload is
    left as it is).  ``status`` is None; ``body`` has the ``upload_id``, the
    upload's ``path``, ``requested_path`` and ``size``, and the call's
    ``remote`` and ``local_size``.
    """


class InvalidPath(InvalidRequest):
    """A request path the pipeline refuses to normalise."""

    default_code = "invalid_path"


class DuplicateParameter(InvalidRequest):
    """A query parameter given twice."""

    default_code = "duplicate_parameter"


class TransferEncodingNotAllowed(InvalidRequest):
    """A request with a ``Transfer-Encoding`` header."""

    default_code = "transfer_encoding_not_allowed"


class AmbiguousCredentials(InvalidRequest):
    """Two different tokens in one request."""

    default_code = "ambiguous_credentials"


class SignalNotAllowed(InvalidRequest):
    """A signal outside ``params.allowed_signals``."""

    default_code = "signal_not_allowed"


class MalformedRequest(InvalidRequest):
    """HTTP framing the daemon's parser refuses."""

    default_code = "malformed_request"


class GitError(InvalidRequest):
    """git itself refused."""

    default_code = "git_error"


class Unauthorized(AuthenticationError):
    """Missing or wrong token."""

    default_code = "unauthorized"


class MissingScope(PermissionDenied):
    """The token lacks a scope the endpoint needs (``scope`` names it)."""

    default_code = "missing_scope"


class PathNotAllowed(PermissionDenied):
    """The path is outside the boundary or the ``paths.allow`` rule."""

    default_code = "path_not_allowed"


class PathDenied(PermissionDenied):
    """The path matches a ``paths.deny`` glob."""

    default_code = "path_denied"


class ReadOnly(PermissionDenied):
    """A write under a ``read_only`` path."""

    default_code = "read_only"


class SymlinkDenied(PermissionDenied):
    """A symlink under ``symlinks: deny``."""

    default_code = "symlink_denied"


class ParamNotAllowed(PermissionDenied):
    """A parameter value the policy forbids (command, shell, user, overwrite ...)."""

    default_code = "param_not_allowed"


class CommandNotAllowed(ParamNotAllowed):
    """A command that ``allow_commands`` or ``deny_commands`` refuses."""

    default_code = "command_not_allowed"


class LanguageNotAllowed(ParamNotAllowed):
    """A ``/code/run`` language outside ``params.languages``."""

    default_code = "language_not_allowed"


class ExtensionNotAllowed(ParamNotAllowed):
    """A file name that ``allow_extensions`` or ``deny_extensions`` refuses."""

    default_code = "extension_not_allowed"


class OriginNotAllowed(PermissionDenied):
    """A browser ``Origin`` the policy does not allow."""

    default_code = "origin_not_allowed"


class HostNotAllowed(PermissionDenied):
    """A ``Host`` refused in local mode."""

    default_code = "host_not_allowed"


class ProtectedVariable(PermissionDenied):
    """An environment variable that may not be set."""

    default_code = "protected_variable"


class NotFound(NotFoundError):
    """No such file, process, session or route."""

    default_code = "not_found"


class EndpointDisabled(NotFoundError):
    """The endpoint is switched off by the policy (``rule`` says where)."""

    default_code = "endpoint_disabled"


class PortNotExposed(NotFoundError):
    """Nobody exposed this port on the preview door."""

    default_code = "port_not_exposed"


class Timeout(DeadlineExceeded):
    """
    A command, code run or git call ran past its time limit, or a
    language server did not start or answer in time.
    """

    default_code = "timeout"


class IdleTimeout(DeadlineExceeded):
    """A child printed nothing for its ``idle_timeout``."""

    default_code = "idle_timeout"


class TurnInProgress(Conflict):
    """An agent session is already running a turn."""

    default_code = "turn_in_progress"


class AlreadyResolved(Conflict):
    """A permission request was already answered."""

    default_code = "already_resolved"


class Withdrawn(Conflict):
    """The agent withdrew the request."""

    default_code = "withdrawn"


class FileExists(Conflict):
    """A create without ``overwrite`` met an existing file."""

    default_code = "file_exists"


class StdinClosed(Conflict):
    """The process has no open stdin (start it with ``stdin=True``)."""

    default_code = "stdin_closed"


class OutputNotCaptured(Conflict):
    """Output read in the seed's form of a process started without ``capture_output``."""

    default_code = "output_not_captured"


class PreconditionFailed(SandboxError):
    """412: ``If-Match`` names a version the file no longer has."""

    default_code = "precondition_failed"


class PayloadTooLarge(SandboxError):
    """413: a body or payload over its limit."""

    default_code = "payload_too_large"


class RateLimited(LimitExceeded):
    """Over ``rate_per_minute``; ``retry_after`` says when to come back."""

    default_code = "rate_limited"


class ConcurrencyLimited(LimitExceeded):
    """Over ``max_concurrency``."""

    default_code = "concurrency_limited"


class TooManyProcesses(LimitExceeded):
    """Over ``max_processes`` running."""

    default_code = "too_many_processes"


class TooManySessions(LimitExceeded):
    """Over the PTY, agent or language server session limit."""

    default_code = "too_many_sessions"


class Internal(ServerError):
    """The handler failed (the message, never a traceback)."""

    default_code = "internal"


class Unsupported(ServerError):
    """501: not implemented (a method, an agent capability)."""

    default_code = "unsupported"


class AgentError(ServerError):
    """502: a coding agent answered with an error."""

    default_code = "agent_error"


class Unavailable(ServerError):
    """503: an optional dependency is missing, or the daemon is shutting down."""

    default_code = "unavailable"


class UpstreamUnavailable(ServerError):
    """
    502: a server the daemon speaks to for the caller is gone or refused
    the request (a language server that exited, an app behind a preview
    that does not answer); the ``body`` may hold its ``stderr``.
    """

    default_code = "upstream_unavailable"


class AgentUnavailable(ServerError):
    """503: the coding agent is not installed or not usable."""

    default_code = "agent_unavailable"


class AgentTimeout(ServerError):
    """504: a coding agent did not start within its limit."""

    default_code = "agent_timeout"


class InsufficientStorage(ServerError):
    """507: the disk filled up; nothing was left half-written."""

    default_code = "insufficient_storage"


# -- git (SPEC §24) --------------------------------------------------------------------


class UrlNotAllowed(ParamNotAllowed):
    """
    A URL outside the policy: a page for the browser, a git remote
    (transport, url_allow/url_deny, private address).
    """

    default_code = "url_not_allowed"


class ProtectedBranch(PermissionDenied):
    """A commit, push or delete on a branch the policy protects."""

    default_code = "protected_branch"


class GitConflict(Conflict):
    """The repository's state refuses the call; :attr:`kind` says how."""

    default_code = "git_conflict"

    @property
    def kind(self) -> str | None:
        """``non_fast_forward``, ``dirty_tree``, ``branch_exists``, ``merge_conflict`` ..."""
        value = self.body.get("kind")
        return value if isinstance(value, str) else None


class TooManyJobs(LimitExceeded):
    """``limits.max_jobs`` git jobs are running."""

    default_code = "too_many_jobs"


class RemoteError(ServerError):
    """
    The git remote refused or could not be reached (502); :attr:`kind` is
    ``auth``, ``not_found``, ``network``, ``tls`` or ``rejected``.
    """

    default_code = "remote_error"

    @property
    def kind(self) -> str | None:
        """What went wrong with the remote."""
        value = self.body.get("kind")
        return value if isinstance(value, str) else None


def _codes() -> dict[str, type[SandboxError]]:
    found: dict[str, type[SandboxError]] = {}
    pending: list[type[SandboxError]] = [SandboxError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        # A class names its own code (UploadMismatch inherits invalid_param).
        code = cls.__dict__.get("default_code")
        if code is not None and cls.__module__ == __name__:
            found[code] = cls
    return found


#: ``code`` → exception class.
BY_CODE: dict[str, type[SandboxError]] = _codes()

#: HTTP status → family, for codes this client does not know.
BY_STATUS: dict[int, type[SandboxError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: PermissionDenied,
    404: NotFoundError,
    408: DeadlineExceeded,
    409: Conflict,
    412: PreconditionFailed,
    413: PayloadTooLarge,
    429: LimitExceeded,
    501: Unsupported,
}


def error_for(
    status: int | None, body: Mapping[str, Any] | None, fallback: str = ""
) -> SandboxError:
    """
    The exception for one error answer.

    The ``code`` picks the class; an unknown code falls back to the
    status's family (any other 5xx is :class:`ServerError`).

    :param status: the HTTP status (None for an in-stream ``error`` event).
    :param body: the JSON error body (``error``, ``type``, ``code``, ``rule`` ...).
    :param fallback: the message when the body has none.
    """
    body = dict(body or {})
    code = body.get("code") if isinstance(body.get("code"), str) else None
    message = str(body.get("error") or fallback or f"HTTP {status}")
    cls: type[SandboxError] | None = BY_CODE.get(code) if code else None
    if cls is None and body.get("type") == "TimeoutError":
        cls = Timeout
    if cls is None and status is not None:
        cls = BY_STATUS.get(status) or (ServerError if status >= 500 else None)
    if cls is None:
        cls = SandboxError
    rule = body.get("rule")
    kind = body.get("type")
    return cls(
        message,
        status=status,
        code=code,
        rule=rule if isinstance(rule, str) else None,
        type=kind if isinstance(kind, str) else None,
        body=body,
    )
