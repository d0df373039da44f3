# -*- test-case-name: tests.e2b.test_connect -*-
"""
envd's ``EntryInfo`` from a guarded path (``filesystem.proto``).

envd fills ``mode`` with the permission bits, ``permissions`` with Go's
``FileMode.String()`` (``-rw-r--r--``, ``drwxr-xr-x``, ``Lrwxrwxrwx``),
``owner``/``group`` with names (the number when unknown), and for a link
the type and mode of its target plus ``symlink_target``.  Every path here
has passed the :class:`~sandboxd.access.guard.PathGuard` first; a link is only
described when it stays inside the boundary.
"""

from __future__ import annotations

import grp
import os
import posixpath
import pwd
import stat
from datetime import UTC, datetime
from typing import Any

from sandboxd.access.guard import PathGuard
from sandboxd.errors import ApiError, file_not_found
from sandboxd.files.walk import display_name

FILE_TYPE_UNSPECIFIED = "FILE_TYPE_UNSPECIFIED"
FILE_TYPE_FILE = "FILE_TYPE_FILE"
FILE_TYPE_DIRECTORY = "FILE_TYPE_DIRECTORY"
FILE_TYPE_SYMLINK = "FILE_TYPE_SYMLINK"

#: Go's ``FileMode`` type letters, in the order ``String()`` prints them.
_GO_LETTERS = (
    (stat.S_ISDIR, "d"),
    (stat.S_ISLNK, "L"),
    (lambda m: stat.S_ISBLK(m) or stat.S_ISCHR(m), "D"),
    (stat.S_ISFIFO, "p"),
    (stat.S_ISSOCK, "S"),
    (lambda m: bool(m & stat.S_ISUID), "u"),
    (lambda m: bool(m & stat.S_ISGID), "g"),
    (stat.S_ISCHR, "c"),
    (lambda m: bool(m & stat.S_ISVTX), "t"),
)


def go_mode_string(mode: int) -> str:
    """Go's ``os.FileMode.String()`` of a ``st_mode``."""
    letters = "".join(c for test, c in _GO_LETTERS if test(mode)) or "-"
    perms = "".join(
        ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx")
    )
    return letters + perms


def file_type(mode: int) -> str:
    """The ``FileType`` enum name of a (target's) ``st_mode``."""
    if stat.S_ISREG(mode):
        return FILE_TYPE_FILE
    if stat.S_ISDIR(mode):
        return FILE_TYPE_DIRECTORY
    if stat.S_ISLNK(mode):
        return FILE_TYPE_SYMLINK
    return FILE_TYPE_UNSPECIFIED


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def timestamp(ts: float) -> str:
    """A ``google.protobuf.Timestamp`` in its JSON form (RFC 3339, UTC, ``Z``)."""
    moment = datetime.fromtimestamp(ts, tz=UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def entry_json(
    path: str,
    st: os.stat_result,
    target: os.stat_result | None = None,
    target_path: str | None = None,
) -> dict[str, Any]:
    """An ``EntryInfo`` in protobuf's JSON mapping (``int64`` as a string)."""
    shown = target if target is not None else st
    out: dict[str, Any] = {
        "name": display_name(posixpath.basename(path) or path),
        "type": file_type(shown.st_mode),
        "path": display_name(path),
        "size": str(st.st_size),
        "mode": stat.S_IMODE(shown.st_mode) & 0o777,
        "permissions": go_mode_string(st.st_mode),
        "owner": _owner(st.st_uid),
        "group": _group(st.st_gid),
        "modifiedTime": timestamp(st.st_mtime),
    }
    if stat.S_ISLNK(st.st_mode):
        out["symlinkTarget"] = display_name(target_path or path)
        if target is None:
            out["type"] = FILE_TYPE_UNSPECIFIED
            out["mode"] = 0
    return out


def describe(
    guard: PathGuard, path: str, missing_ok: bool = False, done: bool = False
) -> dict[str, Any]:
    """
    The ``EntryInfo`` of one guarded path (a link as a link, with its target).

    :param done: the path is the outcome of a change already made (a
        move's destination): a link whose target the guard refuses is
        then described as a link whose target is not shown, since an
        error would tell the caller nothing happened.
    :raises ApiError: the guard's refusals; 404 when it does not exist.
    """
    with guard.locate(path, "read", follow=False, missing_ok=False) as loc:
        st = loc.lstat()
        resolved = loc.path
    if st is None:
        raise file_not_found(path)
    target = target_path = None
    if stat.S_ISLNK(st.st_mode):
        # Described only when the link stays inside the boundary.
        try:
            with guard.locate(path, "read", follow=True) as loc:
                target = loc.lstat()
                target_path = loc.path
        except ApiError:
            if not done:
                raise
    return entry_json(resolved, st, target, target_path)
