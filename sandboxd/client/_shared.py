"""
Pieces both clients use around transfers and commands: the Range-resume
state of a download, the ``.part`` file behind it, the steps of a
resumable upload, and the mapping of answers to results and errors.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import re
from collections.abc import Callable, Mapping
from typing import Any, cast

from sandboxd.client import _calls as calls
from sandboxd.client._core import CHUNK_BYTES, Req, backoff, transport_error
from sandboxd.client._plan import Chunks
from sandboxd.client.errors import (
    ConnectionFailed,
    SandboxError,
    UploadMismatch,
    error_for,
)
from sandboxd.client.models import CommandResult, Progress, Written

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
        #: The daemon answered at least once (a failure is then a cut).
        self.answered = False

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
        self.answered = True
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
        if not self.answered and not self.offset:
            # Never reached: said as any other call says it, not as a cut.
            return transport_error(error, "GET /files/raw")
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
        """
        Failed: keep the partial file for a later resume, unless it holds
        nothing (a refused download leaves no empty ``.part`` behind).
        """
        self.file.close()
        if os.path.getsize(self.part) == 0:
            for path in (self.part, self.meta):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def commit(self) -> int:
        """Whole: rename into place; the size."""
        self.file.close()
        os.replace(self.part, self.local)
        try:
            os.unlink(self.meta)
        except FileNotFoundError:
            pass
        return self.state.offset


class ResumableUpload:
    """
    Where a resumable upload (``/files/uploads``) stands, and what to send
    next: both clients drive the same steps and differ only in I/O.

    1. :meth:`start`: ``GET`` the given ``upload_id`` (to carry on an upload
       begun earlier, perhaps by another process) or create a new one;
       :meth:`resumed` checks the given upload is this call's (target path
       and size) and :meth:`on_record` takes the answer.  An upload that is
       gone is started again.
    2. :meth:`append`: the rest of the file from ``offset``;
       :meth:`on_answer` returns the written file once complete.
    3. After a cut connection (:meth:`on_cut`) or a refusal that names the
       daemon's offset (:meth:`on_refusal`), ``GET`` again and go on from
       the offset the daemon has on disk.

    :param on_upload_id: told the id of a new upload as soon as it exists
        (to keep it for a later resume).
    """

    def __init__(
        self,
        local: str,
        remote: str,
        size: int,
        overwrite: bool,
        mode: str | int | None,
        upload_id: str | None,
        retries: int,
        on_upload_id: Callable[[str], None] | None = None,
    ) -> None:
        self.local = local
        self.remote = remote
        self.size = size
        self.overwrite = overwrite
        self.mode = mode
        self.upload_id = upload_id
        self.retries = retries
        self.on_upload_id = on_upload_id
        self.offset = 0
        self.failures = 0
        self.waits = 0
        #: Bytes sent in appends (counted by the reader of :meth:`read_from`).
        self.sent = 0

    def start(self) -> Req:
        """The first call: the known upload's state, or a new upload."""
        if self.upload_id is not None:
            return calls.files_uploads_get(self.upload_id)
        return self.create()

    def create(self) -> Req:
        """A new upload of this file."""
        self.upload_id = None
        return calls.files_uploads_create(
            self.remote, self.size, self.overwrite, self.mode, None
        )

    def resumed(self, record: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """
        The record of the given ``upload_id``, checked against this call
        before a byte is sent: its size must be the local file's and its
        target ``remote``.  Paths compare as the daemon reads them
        (normalised, relative ones against its base dir): ``remote`` is
        the record's ``requested_path`` or its resolved ``path``.  A record
        without ``requested_path`` (an older daemon) and a relative
        ``remote`` cannot be compared: None, start over (the other upload
        is left alone either way).

        :raises UploadMismatch: the upload is another target's or size's.
        """
        path = record.get("path")
        requested = record.get("requested_path")
        want = posixpath.normpath(self.remote)
        same = want == path or (
            isinstance(requested, str) and want == posixpath.normpath(requested)
        )
        if not same and requested is None and not want.startswith("/"):
            return None
        size = record.get("size")
        if same and size == self.size:
            return record
        upload_id = record.get("upload_id", self.upload_id)
        raise UploadMismatch(
            f"upload {upload_id} is for {path} ({size} bytes), not for "
            f"{self.remote} ({self.size} bytes): nothing was sent",
            body={
                "upload_id": upload_id,
                "path": path,
                "requested_path": requested,
                "size": size,
                "offset": record.get("offset"),
                "remote": self.remote,
                "local_size": self.size,
            },
        )

    def on_record(self, record: Mapping[str, Any]) -> bool:
        """
        Take an upload's record; False when it is not this file's (another
        size), so a new one must be created.
        """
        if int(record.get("size", -1)) != self.size:
            return False
        new = record["upload_id"] != self.upload_id
        self.upload_id = str(record["upload_id"])
        self.offset = int(record["offset"])
        if new and self.on_upload_id is not None:
            self.on_upload_id(self.upload_id)
        return True

    def status(self) -> Req:
        """Where the daemon stands."""
        assert self.upload_id is not None
        return calls.files_uploads_get(self.upload_id)

    def append(self) -> Req:
        """The rest of the file, from ``offset``."""
        assert self.upload_id is not None
        return calls.files_uploads_append(
            self.upload_id, self.offset, self.size - self.offset
        )

    def read_from(self, f: Any) -> Callable[[], bytes]:
        """Seek ``f`` to ``offset``; a reader of the next chunk (b"" at the end)."""
        f.seek(self.offset)
        left = [self.size - self.offset]

        def read() -> bytes:
            if left[0] <= 0:
                return b""
            chunk: bytes = f.read(min(CHUNK_BYTES, left[0]))
            left[0] -= len(chunk)
            self.sent += len(chunk)
            return chunk

        return read

    def on_answer(self, answer: Mapping[str, Any]) -> Written | None:
        """An append's answer: the file once complete, else None (go on)."""
        if answer.get("complete"):
            written = dict(answer)
            return cast(Written, written)
        self.offset = int(answer.get("offset", self.offset))
        self.failures += 1  # a short append: bounded like a cut
        self._check()
        return None

    def _check(self, error: SandboxError | None = None) -> None:
        if self.failures > self.retries:
            raise self.failed(error)

    def on_cut(self, error: SandboxError) -> float:
        """
        The connection dropped mid-append: seconds to wait before asking
        where the daemon stands.

        :raises SandboxError: retries are used up (``body`` holds
            ``upload_id`` and ``offset`` for a later resume).
        """
        self.failures += 1
        self._check(error)
        return backoff(self.failures)

    def on_refusal(self, error: SandboxError) -> float | None:
        """
        An error answer to an append: seconds to wait before asking where
        the daemon stands (another append still running, or another
        offset), or None when it is final (raise it).
        """
        if error.code == "invalid_param" and isinstance(error.body.get("offset"), int):
            self.failures += 1
            self._check(error)
            return 0.0
        if error.code == "concurrency_limited" and self.waits < 20:
            # The daemon has not yet seen the cut connection end.
            self.waits += 1
            wait = error.body.get("retry_after")
            return min(float(wait), 1.0) if isinstance(wait, int | float) else 0.5
        return None

    def failed(self, error: SandboxError | None) -> SandboxError:
        """The error to raise once retries ran out."""
        message = (
            f"upload cut at {self.offset} of {self.size} bytes "
            f"(upload_id {self.upload_id}; pass it to upload() to carry on)"
        )
        if error is not None:
            message = f"{error.message}: {message}"
        return ConnectionFailed(
            message, body={"upload_id": self.upload_id, "offset": self.offset}
        )


def progress_chunks(
    read: Callable[[], bytes], start: int, total: int, progress: Progress | None
) -> Chunks:
    """
    A request body from ``read``, telling ``progress(sent, total)`` first
    with ``start`` (bytes the daemon has already), then after each chunk.
    """
    if progress is None:
        return Chunks(read)
    done = start
    progress(done, total)

    def sent(size: int) -> None:
        nonlocal done
        done += size
        progress(done, total)

    return Chunks(read, sent)


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


def stream_error(error: Mapping[str, Any], result: CommandResult) -> SandboxError:
    """
    A ``/shell/stream`` ``error`` event as an exception carrying the output
    so far.  The daemon names the limit in ``code`` and says it in
    ``message`` (its ``error`` is the seed's one word, ``timeout``); an
    older daemon put the words in ``error`` and no ``code``.
    """
    message = str(error.get("message") or error.get("error") or "the command failed")
    code = error.get("code")
    if not isinstance(code, str) or not code:
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
            "error": message,
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


class ByteRun:
    """
    What a byte-exact ``/shell/stream`` said, event by event: the chunks
    for the caller, then the exit code, the bytes the cap dropped and any
    error (the sync and async clients both read events through this).
    """

    def __init__(self) -> None:
        self.exit_code: int | None = None
        self.dropped = 0
        self.error: dict[str, Any] | None = None

    def take(self, name: str, data: Any) -> tuple[str, bytes] | None:
        """``(stream, bytes)`` for an output event; None for the others."""
        data = data if isinstance(data, dict) else {}
        if name in ("stdout", "stderr"):
            return name, base64.b64decode(str(data.get("data_base64", "")))
        if name == "truncated":
            self.dropped += int(data.get("dropped_bytes", 0))
        elif name == "error":
            self.error = data
        elif name == "exit":
            self.exit_code = data.get("exit_code")
        return None

    def result(self) -> CommandResult:
        """
        The run's end (its output went to the callbacks).

        :raises Timeout: when the stream ended with an ``error`` event.
        """
        result = CommandResult("", "", self.exit_code, bool(self.dropped), self.dropped)
        if self.error is not None:
            raise stream_error(self.error, result)
        return result


def session_info(info: Any) -> Any:
    """A terminal session's record with ``session_id`` beside the daemon's ``id``."""
    if isinstance(info, dict) and "id" in info:
        info.setdefault("session_id", info["id"])
    return info
