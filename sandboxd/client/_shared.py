"""
Pieces both clients use around transfers and commands: the Range-resume
state of a download, the ``.part`` file behind it, and the mapping of
answers to results and errors.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from sandboxd.client._core import transport_error
from sandboxd.client.errors import ConnectionFailed, SandboxError, error_for
from sandboxd.client.models import CommandResult

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED = re.compile(r"bytes\s+\*/(\d+)")


class RangeState:
    """
    Where a raw download stands: ``offset`` bytes received of ``total``,
    from the version named by ``etag``.

    :param restart: forget what was received (the file changed).
    :param on_etag: told each new ``etag`` (to keep it with a partial file).
    """

    def __init__(
        self,
        restart: Callable[[], None],
        offset: int = 0,
        etag: str | None = None,
        on_etag: Callable[[str], None] | None = None,
    ) -> None:
        self.restart = restart
        self.offset = offset
        self.etag = etag
        self.total: int | None = None
        self.on_etag = on_etag

    def request_headers(self) -> dict[str, str]:
        """``Range`` from the offset, with ``If-Range`` so a changed file starts over."""
        if self.offset <= 0:
            return {}
        headers = {"Range": f"bytes={self.offset}-"}
        if self.etag:
            headers["If-Range"] = self.etag
        return headers

    def _reset(self) -> None:
        self.restart()
        self.offset = 0

    def accept(self, status: int, headers: Mapping[str, str]) -> bool:
        """
        Take an answer's status and headers; False when there is nothing
        left to read (a resumed file that was already complete).

        :raises ConnectionFailed: the file shrank under a resume (asked again
            from the start).
        """
        if status == 416:
            found = _UNSATISFIED.match(headers.get("content-range", ""))
            size = int(found.group(1)) if found else -1
            if size == self.offset:
                self.total = size
                return False
            self._reset()
            self.etag = None
            raise ConnectionFailed("the file changed since the partial download")
        if status == 206:
            found = _CONTENT_RANGE.match(headers.get("content-range", ""))
            if found is None or int(found.group(1)) != self.offset:
                self._reset()
                raise ConnectionFailed("the daemon answered another range")
            self.total = int(found.group(3)) if found.group(3) != "*" else None
        else:
            if self.offset:
                self._reset()  # If-Range failed: the whole (new) file follows
            length = headers.get("content-length")
            self.total = int(length) if length and length.isdigit() else None
        etag = headers.get("etag")
        if etag and etag != self.etag:
            self.etag = etag
            if self.on_etag is not None:
                self.on_etag(etag)
        return True

    def check_complete(self) -> None:
        """
        :raises ConnectionFailed: the answer ended before ``total`` bytes.
        """
        if self.total is not None and self.offset < self.total:
            raise ConnectionFailed(
                f"the download stopped at {self.offset} of {self.total} bytes"
            )

    def failed(self, error: Exception) -> SandboxError:
        """The error to raise once retries ran out."""
        if isinstance(error, SandboxError):
            return error
        return transport_error(
            error, f"download cut at {self.offset} of {self.total or '?'} bytes"
        )


class PartialFile:
    """
    ``LOCAL.part`` (and ``LOCAL.part.etag``) while a download runs:
    renamed into place when whole, kept for resume otherwise.
    """

    def __init__(self, local: str, resume: bool) -> None:
        self.local = local
        self.part = local + ".part"
        self.meta = self.part + ".etag"
        offset, etag = 0, None
        if resume and os.path.isfile(self.part) and os.path.isfile(self.meta):
            with open(self.meta) as f:
                etag = f.read().strip() or None
            if etag is not None:
                offset = os.path.getsize(self.part)
        self.file = open(self.part, "r+b" if offset else "wb")
        self.file.seek(offset)
        self.state = RangeState(self._restart, offset, etag, self._save_etag)

    @property
    def resumed_from(self) -> int:
        """Bytes already on disk when it started."""
        return self.state.offset

    def write(self, chunk: bytes) -> None:
        """Append received bytes."""
        self.file.write(chunk)

    def _restart(self) -> None:
        self.file.seek(0)
        self.file.truncate()

    def _save_etag(self, etag: str) -> None:
        with open(self.meta, "w") as f:
            f.write(etag)

    def keep(self) -> None:
        """Failed: keep the partial file for a later resume."""
        self.file.close()

    def commit(self) -> int:
        """Whole: rename into place; the size."""
        self.file.close()
        os.replace(self.part, self.local)
        try:
            os.unlink(self.meta)
        except FileNotFoundError:
            pass
        return self.state.offset


def command_result(answer: Mapping[str, Any]) -> CommandResult:
    """``/shell``'s answer as a :class:`CommandResult`."""
    known = ("stdout", "stderr", "exit_code", "truncated", "dropped_bytes")
    return CommandResult(
        str(answer.get("stdout", "")),
        str(answer.get("stderr", "")),
        answer.get("exit_code"),
        bool(answer.get("truncated", False)),
        int(answer.get("dropped_bytes", 0) or 0),
        {k: v for k, v in answer.items() if k not in known},
    )


def shell_timeout(timeout: float | None, default: float) -> float:
    """How long the client waits for ``/shell``: the child's limit plus a margin."""
    if timeout is not None:
        return timeout + 15.0
    return max(default, 315.0)


def stream_error(error: Mapping[str, Any], result: CommandResult) -> SandboxError:
    """A ``/shell/stream`` ``error`` event as an exception carrying the output so far."""
    message = str(error.get("error", "the command failed"))
    if message.startswith("IdleTimeout"):
        code = "idle_timeout"
    elif error.get("type") == "TimeoutError":
        code = "timeout"
    else:
        code = "internal"
    return error_for(
        None,
        {
            **error,
            "code": code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "exit_code": result.exit_code,
        },
    )


def handshake_error(status: int, raw: bytes | None) -> SandboxError:
    """A refused WebSocket handshake (the daemon sends its usual JSON body)."""
    data: Any = None
    if raw:
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
    if not isinstance(data, dict):
        data = {"error": f"the terminal port refused the connection (HTTP {status})"}
    if data.get("code") == "forbidden":
        data["code"] = "missing_scope" if "scope" in str(data.get("error")) else None
    return error_for(status, data)
