# -*- test-case-name: tests.test_audit -*-
"""
The audit trail (SPEC §11.5): one JSON line per request the policy says to
record, without tokens or file contents.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode

from twisted.logger import Logger
from twisted.python.logfile import LogFile

from sandboxd.policy.defaults import AUDIT_KEEP_FILES, AUDIT_ROTATE_BYTES

_SECRET_PARAM = re.compile(r"token|secret|key|password|credential|auth", re.IGNORECASE)


def redact_query(query: str) -> str:
    """The query string with the values of token-like parameters removed."""
    if not query:
        return ""
    pairs = parse_qsl(query, keep_blank_values=True)
    return urlencode([(k, "***" if _SECRET_PARAM.search(k) else v) for k, v in pairs])


def should_record(mode: str, status: int) -> bool:
    """``all`` records everything, ``deny`` refusals and failures only."""
    if mode == "all":
        return True
    if mode == "deny":
        return status >= 400
    return False


class AuditLog:
    """
    Where audit lines go: a rotated file, or the twistd log.

    :param path: ``ABX_SERVER_AUDIT_LOG``; None logs through twisted.logger.
    """

    log = Logger(namespace="sandboxd.audit")

    def __init__(
        self, path: str | None = None, rotate_bytes: int = AUDIT_ROTATE_BYTES
    ) -> None:
        self._file: LogFile | None = None
        if path:
            directory, name = os.path.split(os.path.abspath(path))
            self._file = LogFile(
                name,
                directory,
                rotateLength=rotate_bytes,
                maxRotatedFiles=AUDIT_KEEP_FILES,
            )
        self.records = 0

    def write(self, record: dict[str, Any]) -> None:
        """Record one request."""
        self.records += 1
        line = json.dumps(record, separators=(",", ":"), sort_keys=True)
        if self._file is not None:
            self._file.write(line + "\n")
        else:
            self.log.info("{audit_line}", audit_line=line)

    def flush(self) -> None:
        """Push buffered lines to disk (shutdown)."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Flush and close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None


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
) -> dict[str, Any]:
    """The fields of one audit line."""
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "identity": identity,
        "endpoint": endpoint,
        "method": method,
        "path": path,
        "query": redact_query(query),
        "status": status,
        "code": code,
        "rule": rule,
        "duration_ms": round((time.monotonic() - started) * 1000, 2),
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "client": client,
    }
