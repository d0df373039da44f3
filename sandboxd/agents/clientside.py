# -*- test-case-name: tests.test_agents -*-
"""
The client half of ACP that touches the file system: ``fs/read_text_file``
and ``fs/write_text_file``, served through the path guard of the session's
rule (SPEC §15.3).  A refusal goes back as a JSON-RPC error that names the
guard's code and rule, short enough to reach the model without leaking
anything; a missing file is -32002 "Resource not found", which agents map
to ENOENT.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

import attrs

from sandboxd.agents.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    RESOURCE_NOT_FOUND,
    RpcError,
)
from sandboxd.errors import ApiError
from sandboxd.guard import PathGuard
from sandboxd.policy.rules import EffectiveRule

#: Pre-images kept for diffs are capped like ``git_diff`` output (SPEC §13).
PRE_IMAGE_BYTES = 10**6


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

    :param cap: the largest file read (the answer must fit a message).
    """
    path = _param_path(params)
    try:
        real = PathGuard(rule).check(path, "read")
    except ApiError as e:
        raise refusal_error(e) from None
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise RpcError(
            RESOURCE_NOT_FOUND, f"Resource not found: {path}", {"path": path}
        ) from None
    except OSError as e:
        raise RpcError(INTERNAL_ERROR, f"cannot read {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size > cap:
            raise RpcError(
                INTERNAL_ERROR,
                f"file too large to read through ACP: {path}",
                {"limit": cap},
            )
        try:
            data = f.read(cap + 1)
        except IsADirectoryError:
            raise RpcError(INVALID_PARAMS, f"not a file: {path}") from None
    text = data.decode("utf-8", "replace")
    line = params.get("line")
    limit = params.get("limit")
    if isinstance(line, int) or isinstance(limit, int):
        lines = text.splitlines(keepends=True)
        start = max((line or 1) - 1, 0) if isinstance(line, int) else 0
        end = start + limit if isinstance(limit, int) and limit >= 0 else None
        text = "".join(lines[start:end])
    return {"content": text}


@attrs.frozen
class Written:
    """What a served ``fs/write_text_file`` did."""

    path: str
    bytes: int
    sha256: str
    created: bool
    old_text: str | None


def write_text_file(
    rule: EffectiveRule, params: Any, cap: int, owner: tuple[int, int] | None
) -> Written:
    """
    ``fs/write_text_file``: write atomically (temporary file, rename),
    creating the file and its parent directories; keep the old text (within
    :data:`PRE_IMAGE_BYTES`) for diffs.
    """
    path = _param_path(params)
    content = params.get("content")
    if not isinstance(content, str):
        raise RpcError(INVALID_PARAMS, "'content' must be a string")
    try:
        real = PathGuard(rule).check(path, "write")
    except ApiError as e:
        raise refusal_error(e) from None
    data = content.encode("utf-8")
    if len(data) > cap:
        raise RpcError(
            INTERNAL_ERROR, f"content too large (limit {cap} bytes)", {"limit": cap}
        )
    old_text: str | None = None
    created = True
    try:
        with open(real, "rb") as f:
            created = False
            if os.fstat(f.fileno()).st_size <= PRE_IMAGE_BYTES:
                old_text = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise RpcError(INVALID_PARAMS, f"not a file: {path}") from None
    except OSError:
        created = False
    directory = os.path.dirname(real)
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".sandboxd-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if not created:
                try:
                    os.chmod(tmp, os.stat(real).st_mode & 0o7777)
                except OSError:
                    pass
            else:
                os.chmod(tmp, 0o644)
            if owner is not None:
                os.chown(tmp, owner[0], owner[1])
            os.replace(tmp, real)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        raise RpcError(INTERNAL_ERROR, f"cannot write {path}: {e.strerror}") from None
    return Written(real, len(data), hashlib.sha256(data).hexdigest(), created, old_text)
