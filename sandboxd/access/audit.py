# -*- test-case-name: tests.test_audit -*-
"""
The audit trail (SPEC §11.5): one JSON line per request the policy says to
record, without tokens or file contents.
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

from twisted.logger import Logger

from sandboxd.access.links import PREFIX as LINK_PREFIX
from sandboxd.policy.defaults import (
    AUDIT_ARG_MAX_CHARS,
    AUDIT_ARGV_MAX_CHARS,
    AUDIT_ARGV_MAX_ITEMS,
    AUDIT_KEEP_FILES,
    AUDIT_PATTERNS_KEPT,
    AUDIT_REOPEN_CHECK_SECONDS,
    AUDIT_ROTATE_BYTES,
    CAP_WARNING_INTERVAL_SECONDS,
    SECRET_MIN_CHARS,
)

if TYPE_CHECKING:
    from sandboxd.access.auditfile import AuditFile

#: ``sbx_link`` is the preview door's own parameter (a capability link).
_SECRET_PARAM = re.compile(
    r"token|secret|key|password|credential|auth|sbx_link", re.IGNORECASE
)

#: A capability link (``sbxl_`` + base64url claims + ``.`` + base64url MAC),
#: wherever it shows up: a link is a bearer credential whatever carries it
#: (a query parameter of any name, an argument, a header a command sends).
_LINK = re.compile(re.escape(LINK_PREFIX) + r"[A-Za-z0-9_.\-]*")

#: The audit file and its rotations: the daemon's alone (a record names
#: commands, paths and identities that other users of the sandbox must not read).
FILE_MODE = 0o600
MASK = "***"


@functools.lru_cache(maxsize=AUDIT_PATTERNS_KEPT)
def _assignments(hidden: frozenset[str]) -> re.Pattern[str] | None:
    """
    The pattern of ``NAME=value`` for each of ``hidden`` (None for none).
    Built once per set of names: a policy and the daemon's environment give
    every command the same set, and the pattern's text (each name escaped,
    longest first) cost more than masking an argument with it.
    """
    if not hidden:
        return None
    return re.compile(
        r"(?<![A-Za-z0-9_])("
        + "|".join(re.escape(n) for n in sorted(hidden, key=lambda n: (-len(n), n)))
        + r")=(\"[^\"]*\"|'[^']*'|\S*)"
    )


#: What :func:`_assignments`' match becomes: the name kept, the value masked.
_ASSIGNMENT_MASKED = rf"\1={MASK}"


def audit_argv(
    argv: Sequence[str], names: Iterable[str], environ: Mapping[str, str]
) -> list[str]:
    """
    What an audit record says ran: ``argv`` capped, with secrets masked.

    :param names: environment names whose values must not be recorded
        (``env_deny``, ``token_env`` and the daemon's own secrets).
    :param environ: where those values are (the daemon's environment plus
        the request's ``env``): each value that appears in an argument is
        replaced by ``***``, and so is the value of ``NAME=value`` for each
        of the names.
    """
    hidden = frozenset(names)
    values = sorted(
        {v for n in hidden if len(v := environ.get(n, "")) >= SECRET_MIN_CHARS},
        key=len,
        reverse=True,
    )
    assignment = _assignments(hidden)
    out: list[str] = []
    total = 0
    for arg in argv[:AUDIT_ARGV_MAX_ITEMS]:
        for value in values:
            arg = arg.replace(value, MASK)
        if assignment is not None:
            arg = assignment.sub(_ASSIGNMENT_MASKED, arg)
        room = min(AUDIT_ARG_MAX_CHARS, AUDIT_ARGV_MAX_CHARS - total)
        if room <= 0:
            out.append(f"... ({len(argv) - len(out)} more arguments)")
            return out
        if len(arg) > room:
            arg = arg[:room] + f"... ({len(arg) - room} more characters)"
        total += min(len(arg), room)
        out.append(arg)
    if len(argv) > AUDIT_ARGV_MAX_ITEMS:
        out.append(f"... ({len(argv) - AUDIT_ARGV_MAX_ITEMS} more arguments)")
    return out


#: ``scheme://userinfo@``: a password or token in a URL's authority.
_URL_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s'\"]+@")

#: What in a query parameter's name says its value is a secret
#: (``sbx_link``: the preview door's link parameter).
_SECRET_NAME = (
    r"token|secret|key|password|passwd|pwd|signature|sig|credential|auth|sbx_link"
)

#: ``name=value`` in a URL's query (or a command's argument) whose name
#: says it holds a secret: ``?access_token=…``, ``&api_key=…``.
_SECRET_QUERY_VALUE = re.compile(
    rf"([?&;][A-Za-z0-9_.-]*(?:{_SECRET_NAME})[A-Za-z0-9_.-]*=)"
    r"(?!%2A%2A%2A|\*\*\*)[^&\s#'\"]*",
    re.IGNORECASE,
)

_SECRET_NAME_IN = re.compile(_SECRET_NAME, re.IGNORECASE)


def secret_param(name: str) -> bool:
    """
    Whether a URL query parameter called ``name`` holds a secret, by the
    same words whose values :func:`redact_url_secrets` masks: what the
    audit would hide is what other code must not keep either.
    """
    return _SECRET_NAME_IN.search(name) is not None


def redact_links(text: str) -> str:
    """``text`` with every capability link (``sbxl_...``) in it masked."""
    if LINK_PREFIX in text:
        text = _LINK.sub(MASK, text)
    return text


def redact_url_secrets(text: str) -> str:
    """
    ``text`` with every URL's userinfo (``https://user:pass@``), every
    token-like query value and every capability link masked: what clients
    put in URLs that they then pass as command arguments (the E2B SDK's
    git module does).
    """
    text = redact_links(text)
    if "@" in text:
        text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    if "=" in text:
        text = _SECRET_QUERY_VALUE.sub(lambda m: f"{m.group(1)}{MASK}", text)
    return text


#: How :func:`audit_argv` ends an argument it cut.
_CUT = re.compile(r"\.\.\. \(\d+ more characters\)$")


def mask_secrets(text: str, secrets: Sequence[str]) -> str:
    """
    ``text`` with each of ``secrets`` (the daemon's tokens, longest first)
    masked wherever it appears; in an argument :func:`audit_argv` cut, a
    token's beginning left at the cut too.
    """
    for secret in secrets:
        if len(secret) >= SECRET_MIN_CHARS and secret in text:
            text = text.replace(secret, MASK)
    cut = _CUT.search(text)
    if cut is not None:
        head = text[: cut.start()]
        for secret in secrets:
            for size in range(len(secret) - 1, SECRET_MIN_CHARS - 1, -1):
                if head.endswith(secret[:size]):
                    head = head[:-size] + MASK
                    break
        text = head + cut.group()
    return text


def redact_query(query: str) -> str:
    """
    The query string with the values of token-like parameters removed, and
    any capability link masked whatever parameter carries it.
    """
    if not query:
        return ""
    pairs = parse_qsl(query, keep_blank_values=True)
    return urlencode(
        [
            (redact_links(k), MASK if _SECRET_PARAM.search(k) else redact_links(v))
            for k, v in pairs
        ]
    )


def should_record(mode: str, status: int, refused: bool | None = None) -> bool:
    """
    ``all`` records everything, ``deny`` refusals and failures only.

    :param refused: whether the call was refused or failed, when its status
        does not say (a proxied app's own 404 is neither); None: by status.
    """
    if mode == "all":
        return True
    if mode == "deny":
        return status >= 400 if refused is None else refused
    return False


class AuditLog:
    """
    Where audit lines go: a rotated file, or the twistd log.

    A line the file cannot take (a full disk) is dropped, never half
    written, and the request it records is answered all the same: the
    drops are counted (:attr:`dropped`) and logged as a warning at most
    once per ``warn_every`` seconds.

    :param path: ``ABX_SERVER_AUDIT_LOG``; None logs through twisted.logger.
    :param clock: seconds, for the warnings' pace.
    """

    def __init__(
        self,
        path: str | None = None,
        rotate_bytes: int = AUDIT_ROTATE_BYTES,
        clock: Callable[[], float] = time.monotonic,
        warn_every: float = CAP_WARNING_INTERVAL_SECONDS,
    ) -> None:
        # Made here, not as a class attribute: a Logger read through an
        # instance takes the class's name as its namespace, and log
        # collectors filter on the documented ``sandboxd.audit``.
        self.log = Logger(namespace="sandboxd.audit", source=self)
        self._file: AuditFile | None = None
        self.path = os.path.abspath(path) if path else None
        if path:
            # Imported here: a daemon auditing to its log needs no file.
            from sandboxd.access.auditfile import AuditFile

            directory, name = os.path.split(os.path.abspath(path))
            try:
                self._file = AuditFile(
                    name, directory, rotate_bytes, FILE_MODE, AUDIT_KEEP_FILES
                )
            except OSError as e:
                from sandboxd.policy.document import PolicyError

                raise PolicyError(
                    f"--audit-log: cannot open {path!r}: {e.strerror or e}"
                ) from None
        #: When the file's name was last checked (:meth:`_follow`).
        self._checked: float | None = None
        self.records = 0
        #: Records the file could not take, since the daemon started.
        self.dropped = 0
        self._clock = clock
        self._warn_every = warn_every
        self._unreported = 0
        self._last_warning: float | None = None

    def write(self, record: dict[str, Any]) -> None:
        """Record one request (dropped, and counted, if the file cannot take it)."""
        self.records += 1
        line = json.dumps(record, separators=(",", ":"), sort_keys=True)
        if self._file is None:
            self.log.info("{audit_line}", audit_line=line)
            return
        self._follow()
        try:
            self._file.write(line + "\n")
        except OSError as e:
            self.dropped += 1
            self._unreported += 1
            now = self._clock()
            if (
                self._last_warning is None
                or now - self._last_warning >= self._warn_every
            ):
                self._last_warning = now
                self._warn(_reason(e))
            return
        if self._unreported:
            self._warn("the file takes records again")

    def _warn(self, why: str) -> None:
        """Log the drops not reported yet."""
        self.log.warn(
            "audit file: {count} record(s) dropped since the last warning ({why})",
            count=self._unreported,
            why=why,
        )
        self._unreported = 0

    def _follow(self) -> None:
        """
        Reopen the file at its path when something else renamed or removed
        it (logrotate without ``copytruncate``, a clean-up job), asked at
        most once per :data:`AUDIT_REOPEN_CHECK_SECONDS`: records written
        to a file no one can find any longer are as good as dropped.
        """
        now = self._clock()
        if (
            self._checked is not None
            and now - self._checked < AUDIT_REOPEN_CHECK_SECONDS
        ):
            return
        self._checked = now
        if self._file is not None and self._file.moved():
            self.reopen("it was moved or removed")

    def reopen(self, why: str = "asked to") -> None:
        """
        Close the audit file and open it again at its path (a new file if
        it is gone): ``SIGHUP`` and ``SIGUSR1`` ask for this after an
        outside rotation.  A file that cannot be opened now is tried again
        at the next record.
        """
        if self._file is None:
            return
        try:
            self._file.reopen()
        except OSError as e:
            self.log.warn(
                "audit file: cannot reopen {path}: {error}; tried again at the"
                " next record",
                path=self.path,
                error=_reason(e),
            )
            return
        self.log.info("audit file: {path} reopened ({why})", path=self.path, why=why)

    def flush(self) -> None:
        """Push buffered lines to disk (shutdown)."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Flush and close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _reason(error: OSError) -> str:
    """An error's words for the log: ``No space left on device``."""
    if error.errno:
        return os.strerror(error.errno)
    return str(error) or type(error).__name__


def make_record(
    *,
    identity: str,
    endpoint: str | None,
    method: str,
    path: str,
    query: str,
    status: int,
    code: str | None,
    rule: str | None,
    started: float,
    bytes_in: int,
    bytes_out: int,
    client: str,
    refused: bool | None = None,
) -> dict[str, Any]:
    """
    The fields of one audit line.

    :param refused: see :func:`should_record` (None: by status).
    """
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "identity": identity,
        "endpoint": endpoint,
        "method": method,
        "path": path,
        "query": redact_query(query),
        "status": status,
        # The seed's field: whether the call was refused or failed.
        "decision": "deny"
        if (status >= 400 if refused is None else refused)
        else "allow",
        "code": code,
        "rule": rule,
        "duration_ms": round((time.monotonic() - started) * 1000, 2),
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "client": client,
    }
