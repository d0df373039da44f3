# -*- test-case-name: tests.agents.test_agents -*-
"""
The client half of ACP that touches the file system: ``fs/read_text_file``
and ``fs/write_text_file``, served through the path guard of the session's
rule (SPEC §15.3).  A refusal goes back as a JSON-RPC error that names the
guard's code and rule, short enough to reach the model without leaking
anything; a missing file is -32002 "Resource not found", which agents map
to ENOENT.  :class:`FileRequests` is the session's part: the
``client_fs`` gate, and the written file recorded as a change.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from sandboxd.access.guard import PathGuard
from sandboxd.agents.filechanges import FileChanges, Written, text_lines
from sandboxd.agents.state import SessionState
from sandboxd.agents.updates import UpdateFolding
from sandboxd.errors import ApiError
from sandboxd.files.atomic import AtomicWrite
from sandboxd.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    RESOURCE_NOT_FOUND,
    RpcError,
)
from sandboxd.policy.defaults import PRE_IMAGE_BYTES
from sandboxd.policy.rules import EffectiveRule


def refusal_error(error: ApiError) -> RpcError:
    """A guard or policy refusal as the agent sees it."""
    code = error.code or "forbidden"
    rule = error.extra.get("rule")
    message = f"permission denied: {code}" + (f" (rule {rule})" if rule else "")
    return RpcError(INTERNAL_ERROR, message, {"code": code, "rule": rule})


def _param_path(params: Any) -> str:
    path = params.get("path") if isinstance(params, dict) else None
    if not isinstance(path, str) or not path:
        raise RpcError(INVALID_PARAMS, "'path' must be a non-empty string")
    return path


def read_text_file(rule: EffectiveRule, params: Any, cap: int) -> dict[str, Any]:
    """
    ``fs/read_text_file``: the guarded file's text, sliced by ``line``
    (1-based) and ``limit`` (lines).

    The file is opened through the guard's descriptors, like every file
    route: an agent swapping a directory for a link meanwhile cannot make
    the daemon read outside the boundary.

    :param cap: the largest file read (the answer must fit a message).
    """
    path = _param_path(params)
    data = _read_guarded(PathGuard(rule), path, cap)
    if data is None:
        raise RpcError(
            RESOURCE_NOT_FOUND, f"Resource not found: {path}", {"path": path}
        )
    text = data.decode("utf-8", "replace")
    line = params.get("line")
    limit = params.get("limit")
    if isinstance(line, int) or isinstance(limit, int):
        lines = text_lines(text)
        start = max((line or 1) - 1, 0) if isinstance(line, int) else 0
        end = start + limit if isinstance(limit, int) and limit >= 0 else None
        text = "".join(lines[start:end])
    return {"content": text}


def _read_guarded(guard: PathGuard, path: str, cap: int) -> bytes | None:
    """
    A regular file's bytes (at most ``cap``, else an error), or None when
    it does not exist; refusals and errors as the agent sees them.
    """
    try:
        opened = guard.open_file(path, "read")
    except ApiError as e:
        if e.status == 404:
            return None
        if e.status == 400:
            raise RpcError(INVALID_PARAMS, f"not a file: {path}") from None
        raise refusal_error(e) from None
    with opened:
        if opened.stat.st_size > cap:
            raise RpcError(
                INTERNAL_ERROR,
                f"file too large to read through ACP: {path}",
                {"limit": cap},
            )
        chunks = []
        left = cap + 1
        while left > 0:
            chunk = os.read(opened.fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


def write_text_file(
    rule: EffectiveRule, params: Any, cap: int, owner: tuple[int, int] | None
) -> Written:
    """
    ``fs/write_text_file``: write atomically (temporary file, rename),
    creating the file and its parent directories; keep the old text (within
    :data:`~sandboxd.policy.defaults.PRE_IMAGE_BYTES`) for diffs.

    Written like ``POST /files/raw``, relative to the guard's directory
    descriptor (:class:`~sandboxd.files.atomic.AtomicWrite`), so the
    policy's ``read_only``, ``deny`` and ``hard_links`` hold here too and a
    link swapped in by the agent cannot redirect the write.
    """
    path = _param_path(params)
    content = params.get("content")
    if not isinstance(content, str):
        raise RpcError(INVALID_PARAMS, "'content' must be a string")
    data = content.encode("utf-8")
    if len(data) > cap:
        raise RpcError(
            INTERNAL_ERROR, f"content too large (limit {cap} bytes)", {"limit": cap}
        )
    guard = PathGuard(rule)
    try:
        old = _read_guarded(guard, path, PRE_IMAGE_BYTES)
        existed = old is not None
    except RpcError as e:
        if e.code == INVALID_PARAMS:
            raise
        old, existed = None, True  # too large for a pre-image, or unreadable
    try:
        loc = guard.locate(path, "write", follow=True, make_parents=True)
        writer = AtomicWrite(loc, overwrite=True, display=path)
    except ApiError as e:
        if e.status == 400:
            raise RpcError(INVALID_PARAMS, f"not a file: {path}") from None
        raise refusal_error(e) from None
    try:
        if owner is not None:
            os.fchown(writer.fd, owner[0], owner[1])
        writer.write(data)
        writer.commit()
    except ApiError as e:
        writer.abort()
        if e.status == 403:
            raise refusal_error(e) from None
        raise RpcError(INTERNAL_ERROR, f"cannot write {path}: {e.message}") from None
    except OSError as e:
        writer.abort()
        raise RpcError(INTERNAL_ERROR, f"cannot write {path}: {e.strerror}") from None
    old_text = None if old is None else old.decode("utf-8", "replace")
    return Written(
        writer.path, len(data), hashlib.sha256(data).hexdigest(), not existed, old_text
    )


class FileRequests:
    """
    The session's ``fs/*`` handlers: the ``client_fs`` gate, and each
    written file recorded in ``changes`` under the tool call ``updates``
    names for it.
    """

    def __init__(
        self, session: SessionState, updates: UpdateFolding, changes: FileChanges
    ) -> None:
        self.session = session
        self.updates = updates
        self.changes = changes

    def read(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        """``fs/read_text_file``."""
        s = self.session
        if s.rule.params.client_fs not in ("read", "read_write"):
            raise RpcError(METHOD_NOT_FOUND, "Method not found: fs/read_text_file")
        cap = s.rule.limits.max_bytes or s.max_message_bytes // 2
        return read_text_file(s.rule, params, cap)

    def write(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        """``fs/write_text_file``."""
        s = self.session
        if s.rule.params.client_fs != "read_write":
            raise RpcError(METHOD_NOT_FOUND, "Method not found: fs/write_text_file")
        cap = s.rule.limits.max_bytes or s.max_message_bytes
        owner = (s.run_as.uid, s.run_as.gid) if s.run_as else None
        written = write_text_file(s.rule, params, cap, owner)
        tool_call_id = self.updates.active_tool_call(written.path, params.get("path"))
        self.changes.record(
            written.path,
            "created" if written.created else "modified",
            "fs_write",
            tool_call_id,
            written=written,
        )
        s.emit(
            "file.written",
            path=written.path,
            bytes=written.bytes,
            sha256=written.sha256,
            created=written.created,
            tool_call_id=tool_call_id,
        )
        return {}
