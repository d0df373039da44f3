# -*- test-case-name: tests.openai_api.test_environments -*-
"""
Files staged into an environment's workspace (``environment.files``, a
template's files, ``environments.files.create``).

A staged file's ``path`` is absolute inside ``/workspace``, the
environment's ``workspace_directory``; each write passes the path rule,
creates the file without replacing anything (an existing file with the same
bytes is accepted, a different one is 409 ``file_exists``), and never
touches what changes how the agent runs (its instruction and configuration
files: 403 ``path_denied``).  A request stages all its files or none: on
any refusal, the files (and directories) it made are removed.
"""

from __future__ import annotations

import binascii
import hashlib
import os
import posixpath
from collections.abc import Callable
from typing import Any

import pybase64

from sandboxd.access.guard import PathGuard
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    file_exists,
    forbidden,
    payload_too_large,
)
from sandboxd.files.atomic import AtomicWrite

#: Where staged paths are rooted, as OpenAI's API names it.
WORKSPACE = "/workspace"
#: Top-level directories of a workspace an agent reads its setup from.
_REFUSED_DIRS = frozenset(
    {".git", ".codex", ".claude", ".cursor", ".qwen", ".qoder", ".gemini", ".ssh"}
)
#: File names (any directory, any case) that instruct or configure an agent,
#: or a shell it starts.
_REFUSED_NAMES = frozenset(
    {
        ".mcp.json",
        "agents.md",
        "claude.md",
        "gemini.md",
        "qwen.md",
        ".envrc",
        ".bashrc",
        ".bash_profile",
        ".bash_login",
        ".bash_logout",
        ".profile",
        ".zshrc",
        ".zshenv",
        ".zprofile",
        ".zlogin",
    }
)
#: The rule a refusal of those names reports.
_RULE = "openai:agent_configuration"


def relative(path: Any, param: str) -> str:
    """
    A staged file's path relative to the workspace: absolute, a leading
    ``/workspace`` dropped, no ``..``, at most 1024 characters.

    :raises ApiError: 400 for a malformed path, 403 ``path_denied`` for a
        file that configures the agent.
    """
    if not isinstance(path, str) or not path.startswith("/") or len(path) > 1024:
        raise bad_request(
            f"{param} must be an absolute path inside {WORKSPACE}", param=param
        )
    if "\x00" in path:
        raise bad_request(f"{param} contains a NUL byte", param=param)
    rel = path
    if rel == WORKSPACE or rel.startswith(WORKSPACE + "/"):
        rel = rel[len(WORKSPACE) :]
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or any(len(p) > 255 for p in parts):
        raise bad_request(f"{param} must name a file inside {WORKSPACE}", param=param)
    if parts[0] in _REFUSED_DIRS or parts[-1].lower() in _REFUSED_NAMES:
        raise forbidden(
            f"{param}: {path} would change what the agent runs; it is not staged",
            Code.PATH_DENIED,
            rule=_RULE,
        )
    return "/".join(parts)


def shown_prefix(path: str | None) -> str | None:
    """
    A listing's ``path`` prefix as answers show paths (under
    ``/workspace``): ``/src/a.py`` and ``src/a.py`` name what
    ``/workspace/src/a.py`` does, as when staging; None (or empty) for
    every file.
    """
    if not path:
        return None
    if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
        return path
    return WORKSPACE + ("" if path.startswith("/") else "/") + path


def shown_path(rel: str) -> str:
    """A workspace file's path as answers show it (under ``/workspace``)."""
    return f"{WORKSPACE}/{rel}"


def file_id(rel: str) -> str:
    """A staged file's id: stable for its path (as the seed's)."""
    return "envfile_" + hashlib.sha1(rel.encode()).hexdigest()[:24]


def decode(data: Any, param: str) -> bytes:
    """An inline file's base64 ``data``."""
    if not isinstance(data, str):
        raise bad_request(f"{param} must be a base64 string", param=param)
    try:
        return pybase64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{param} is not valid base64", param=param) from None


#: One file to stage: its workspace-relative path and how to get its bytes.
Staged = tuple[str, Callable[[], bytes]]


def stage(
    guard: PathGuard, root: str, files: list[Staged], limit: int
) -> list[dict[str, Any]]:
    """
    Write ``files`` into ``root`` (blocking: run on a worker thread), all
    or none; answers ``[{path, size_bytes}]`` (``path`` relative).

    :param limit: the most bytes one file may have (413 beyond).
    """
    made_files: list[str] = []
    made_dirs: list[str] = []
    out = []
    try:
        for rel, read in files:
            data = read()
            if len(data) > limit:
                raise payload_too_large(limit, f"{shown_path(rel)}: the file")
            target = os.path.join(root, rel)
            if _write_new(guard, target, data, made_dirs):
                made_files.append(target)
            out.append({"path": rel, "size_bytes": len(data)})
    except BaseException:
        for target in reversed(made_files):
            try:
                os.unlink(target)
            except OSError:
                pass
        for directory in reversed(made_dirs):
            try:
                os.rmdir(directory)
            except OSError:
                pass
        raise
    return out


def _write_new(
    guard: PathGuard, target: str, data: bytes, made_dirs: list[str]
) -> bool:
    """
    Create ``target`` with ``data``; False when it already holds exactly
    ``data``; 409 when it holds anything else.
    """
    location = guard.locate(target, "write", follow=False, make_parents=True)
    made_dirs.extend(location.made_paths())
    try:
        writer = AtomicWrite(location, overwrite=False, mode=0o644)
    except ApiError as e:
        if e.status != 409 or not _same(guard, target, data):
            raise file_exists(
                f"{target} exists with other content; staged files never replace one"
            ) from None
        return False
    try:
        writer.write(data)
    except BaseException:
        writer.abort()
        raise
    writer.commit()
    return True


def _same(guard: PathGuard, target: str, data: bytes) -> bool:
    """Whether the regular file at ``target`` holds exactly ``data``."""
    try:
        with guard.open_file(target) as opened:
            fd = opened.fd
            if os.fstat(fd).st_size != len(data):
                return False
            with os.fdopen(os.dup(fd), "rb") as f:
                return f.read(len(data) + 1) == data
    except (ApiError, OSError):
        return False


def listing(
    root: str, prefix: str | None, max_entries: int, max_depth: int
) -> list[str]:
    """
    The regular files of a workspace, relative and sorted (blocking):
    symlinks and the agent's setup directories skipped, at most
    ``max_entries`` files, ``max_depth`` levels, and at most ten times
    ``max_entries`` entries looked at (a prefix that matches little in a
    big tree ends the walk early rather than late).
    """
    prefix = shown_prefix(prefix)
    found: list[str] = []
    budget = max_entries * 10
    for top, dirs, names in os.walk(root, followlinks=False):
        budget -= len(dirs) + len(names)
        if budget < 0:
            break
        rel_top = os.path.relpath(top, root)
        depth = 0 if rel_top == "." else rel_top.count(os.sep) + 1
        if rel_top == ".":
            dirs[:] = [d for d in dirs if d not in _REFUSED_DIRS]
        if depth >= max_depth:
            dirs[:] = []
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(top, name)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            rel = posixpath.normpath(os.path.join(rel_top, name))
            if prefix is None or shown_path(rel).startswith(prefix):
                found.append(rel)
                if len(found) >= max_entries:
                    return sorted(found)
    return sorted(found)
