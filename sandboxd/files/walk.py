# -*- test-case-name: tests.routes.test_files -*-
"""
Directory walks for listing, search, delete and move.

Everything here may block on the disk, so the handlers run it in a worker
thread.  Walks go by descriptor (``scandir`` of an fd, subdirectories opened
``O_NOFOLLOW`` relative to their parent), never follow a link into a
directory, and skip what the guard refuses: entries the policy denies and
links that lead out of the boundary.
"""

from __future__ import annotations

import ctypes
import errno
import fnmatch
import functools
import heapq
import os
import posixpath
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import attrs

from sandboxd.access.guard import (
    Location,
    PathGuard,
    etag_of,
    give,
    mounted_special,
    os_error,
    refusal,
    refuse_device,
)
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    file_exists,
    file_not_found,
    forbidden,
    is_a_directory,
    mount_point,
    not_a_directory,
)
from sandboxd.files import crossing
from sandboxd.files.atomic import TEMPORARY_NAME
from sandboxd.files.mounts import mount_of, on_another_mount
from sandboxd.libc import libc
from sandboxd.policy.defaults import WALK_DEPTH

_SUBDIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def iso_time(ts: float) -> str:
    """
    Seconds since the epoch as ISO 8601 UTC with its microseconds, as
    agent-sandbox-server writes file times (``2026-09-21T00:00:00.446213+00:00``;
    no fraction when there is none): a client that syncs by comparing
    ``modified`` sees an edit made in the same second.
    """
    return datetime.fromtimestamp(ts, tz=UTC).isoformat()


def type_of(st: os.stat_result) -> str:
    """``file``, ``directory``, ``symlink`` or ``other``."""
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "other"


def display_name(name: str) -> str:
    """A name safe for JSON: undecodable bytes shown as ``\\xNN``."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode(
            "utf-8", "backslashreplace"
        )


#: A byte :func:`display_name` shows as ``\\xNN``: one not UTF-8, so 80-ff.
_SHOWN_BYTE = re.compile(r"\\x([89a-f][0-9a-f])")


def shown_as(path: str) -> str | None:
    """
    The name that :func:`display_name` shows as ``path`` (its ``\\xNN``
    turned back into those bytes), or None when ``path`` is not such a
    showing: it has no ``\\xNN``, or the bytes they make would be shown
    otherwise (valid UTF-8 is shown as itself).
    """
    if "\\x" not in path:
        return None
    raw = _SHOWN_BYTE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), path)
    if raw == path or display_name(raw) != path:
        return None
    return raw


def visible(guard: PathGuard, path: str, st: os.stat_result) -> bool:
    """
    Whether a walked entry may be shown: policy allows it, links stay
    inside.  A loop of links leads nowhere rather than out: it is shown
    (as a dangling link is), so that it can be seen and removed.
    """
    if not guard.decide(path).allowed:
        return False
    if stat.S_ISLNK(st.st_mode):
        try:
            with guard.locate(path, "read", follow=True):
                pass
        except ApiError as e:
            # The guard's answer to a loop (a name from a listing holds
            # no NUL, the other cause of this code).
            return e.code == Code.INVALID_PATH
    return True


#: Names sorted in one go; a bigger directory is sorted in pieces of this
#: many, then merged.
SORT_PIECE = 8192


def by_name(names: list[str]) -> Iterator[str]:
    """
    ``names`` in order.  A walk runs in a worker thread, and one sort of a
    directory of a few hundred thousand names holds the interpreter's lock
    from start to end, while the reactor answers nobody; pieces of
    :data:`SORT_PIECE` names hold it briefly each, and their merge lets go
    of it as it goes.
    """
    if len(names) <= SORT_PIECE:
        return iter(sorted(names))
    pieces = [
        sorted(names[i : i + SORT_PIECE]) for i in range(0, len(names), SORT_PIECE)
    ]
    return heapq.merge(*pieces)


def walk(
    fd: int, root: str, max_depth: int, hidden: bool = True
) -> Iterator[tuple[str, str, os.stat_result]]:
    """
    Yield ``(parent path, name, lstat)`` below the open directory ``fd``,
    sorted by name per directory, descending into real directories only.
    The daemon's own temporary files (an atomic write in progress, a
    resumable upload's staging file) are not listed: they are not the
    user's files until renamed into place.
    """
    for _dir_fd, parent, name, st in walk_at(fd, root, max_depth, hidden):
        yield parent, name, st


#: A walk's filter: ``(dir fd, parent path, name, lstat)``, true to leave out.
Skip = Callable[[int, str, str, os.stat_result], bool]


def walk_at(
    fd: int,
    root: str,
    max_depth: int,
    hidden: bool = True,
    prune: frozenset[str] = frozenset(),
    skip: Skip | None = None,
) -> Iterator[tuple[int, str, str, os.stat_result]]:
    """
    :func:`walk`, each entry with the open directory it is in: ``(dir fd,
    parent path, name, lstat)``, for a caller that opens the entry relative
    to that fd (never by a path string a swapped directory could redirect).
    The fd is the walk's: valid until the walk moves on, and not closed by
    the caller.

    :param prune: names of directories yielded but not descended into
        (``.git`` for a content search).
    :param skip: called with ``(dir fd, parent path, name, lstat)``: an
        entry it answers true for is neither yielded nor descended into
        (what ignore files name: :class:`~sandboxd.files.ignore.Ignores`).
    """
    try:
        with os.scandir(fd) as it:
            names = [
                e.name
                for e in it
                if (hidden or not e.name.startswith("."))
                and TEMPORARY_NAME.match(e.name) is None
            ]
        dev = os.fstat(fd).st_dev
    except OSError:
        return
    for name in by_name(names):
        # Each entry's status as it is reached, not all of them first: a
        # walk stopped early (a listing's cap) asks for no more, and a
        # directory of a few hundred thousand entries is not held as
        # that many objects (whose collection and freeing hold the
        # interpreter's lock in one piece, as the sort did).
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue  # gone since the scan
        if mounted_special(fd, name, st, dev):
            continue  # /proc mounted here is as out of reach as /proc
        if skip is not None and skip(fd, root, name, st):
            continue
        yield fd, root, name, st
        if max_depth > 1 and stat.S_ISDIR(st.st_mode) and name not in prune:
            try:
                sub = os.open(name, _SUBDIR_FLAGS, dir_fd=fd)
            except OSError:
                continue
            try:
                if os.fstat(sub).st_ino != st.st_ino:
                    continue  # swapped since scandir: skip rather than guess
                yield from walk_at(
                    sub, posixpath.join(root, name), max_depth - 1, hidden, prune, skip
                )
            finally:
                os.close(sub)


def list_dir(
    guard: PathGuard, path: str, depth: int, hidden: bool, max_entries: int
) -> dict[str, Any]:
    """``files_list``: entries of a directory (and below, up to ``depth``)."""
    entries: list[dict[str, Any]] = []
    truncated = False
    with guard.open_dir(path) as (fd, root):
        for parent, name, st in walk(fd, root, depth, hidden):
            full = posixpath.join(parent, name)
            if not visible(guard, full, st):
                continue
            if len(entries) >= max_entries:
                truncated = True
                break
            entries.append(
                {
                    "name": display_name(name),
                    "path": display_name(full),
                    "type": type_of(st),
                    "size": st.st_size,
                    "modified": iso_time(st.st_mtime),
                }
            )
    return {"path": root, "entries": entries, "truncated": truncated}


def search(
    guard: PathGuard,
    path: str,
    pattern: str,
    max_results: int,
    timeout: float,
    depth: int = WALK_DEPTH,
    stopping: Callable[[], bool] = lambda: False,
    skipping: Callable[[str], Skip | None] = lambda root: None,
) -> dict[str, Any]:
    """
    ``files_search``: names matching ``pattern`` below ``path``, within
    ``timeout`` s, at most ``depth`` levels down (1: ``path``'s own entries);
    given up (the answer unread) once ``stopping()`` says so.

    :param skipping: the walk's filter for the directory searched (given
        its path): what ignore files, ``hidden`` and ``exclude`` leave out.
    """
    deadline = time.monotonic() + timeout
    regex = re.compile(fnmatch.translate(pattern))
    results: list[dict[str, str]] = []
    timed_out = truncated = False
    with guard.open_dir(path) as (fd, root):
        entries = walk_at(fd, root, depth, skip=skipping(root))
        for n, (_dir_fd, parent, name, st) in enumerate(entries):
            if n % 256 == 0 and (time.monotonic() > deadline or stopping()):
                timed_out = True
                break
            if regex.match(name) is None:
                continue
            full = posixpath.join(parent, name)
            if not visible(guard, full, st):
                continue
            if len(results) >= max_results:
                truncated = True
                break
            results.append({"name": display_name(name), "path": display_name(full)})
    return {"results": results, "timed_out": timed_out, "truncated": truncated}


def stat_path(guard: PathGuard, path: str) -> dict[str, Any]:
    """
    ``files_stat``: the entry itself (a link is reported as a link); a
    missing path inside the boundary is ``exists: false``, also when a
    parent is missing or is a file (as ``os.path.exists`` answers), so that
    "does the build's output exist yet" needs no "does its folder" first.
    """
    try:
        with guard.locate(path, "read", follow=False) as loc:
            st = loc.lstat()
            resolved = loc.path
    except ApiError as e:
        if e.type not in ("FileNotFoundError", "NotADirectoryError"):
            raise
        st, resolved = None, guard.decide(path).target
    name = posixpath.basename(resolved) or resolved
    if st is None:
        return {
            "name": name,
            "path": resolved,
            "type": "unknown",
            "size": 0,
            "permissions": "",
            "modified": "",
            "accessed": "",
            "created": "",
            "exists": False,
        }
    if stat.S_ISLNK(st.st_mode):
        # A link is described only when it stays inside the boundary.
        with guard.locate(path, "read", follow=True):
            pass
    out = {
        "name": name,
        "path": resolved,
        "type": type_of(st),
        "size": st.st_size,
        "permissions": format(stat.S_IMODE(st.st_mode), "o")[-3:].zfill(3),
        "modified": iso_time(st.st_mtime),
        "accessed": iso_time(st.st_atime),
        # The seed's name for the inode's change time (Linux keeps no
        # creation time that stat reports).
        "created": iso_time(st.st_ctime),
        "exists": True,
    }
    if stat.S_ISREG(st.st_mode):
        out["etag"] = etag_of(st)
    return out


def refuse_root(loc: Location, doing: str, path: Any) -> None:
    """403 when ``loc`` is a root of the boundary, which the daemon works in."""
    if loc.name == "":
        raise forbidden(
            f"refusing to {doing} a root directory: {path}",
            Code.PATH_NOT_ALLOWED,
            rule="guard:base_dir",
        )


def delete(guard: PathGuard, path: str) -> str:
    """``files_delete``: a file, a link (not its target) or a whole tree."""
    with guard.locate(path, "delete", follow=False, missing_ok=False) as loc:
        refuse_root(loc, "delete", path)
        st = loc.lstat()
        if st is None:
            raise file_not_found(path)
        refuse_slash(path, st)
        try:
            refuse_mounted(loc, "delete", path)
            if stat.S_ISDIR(st.st_mode):
                _check_tree(guard, loc, mounts=True)
                # fd-based rmtree: a directory swapped for a link is not followed.
                shutil.rmtree(loc.name, dir_fd=loc.dir_fd)
            else:
                loc.refuse_shared(st, path)
                refuse_device(st, path)
                os.unlink(loc.name, dir_fd=loc.dir_fd)
        except OSError as e:
            if e.errno == errno.ENOTEMPTY:
                # Something made an entry in the tree while it was removed
                # (a build, a dev server): what was listed is gone, the new
                # entry stays; a retry deletes it, checked again.
                raise file_exists(
                    f"Directory not empty: {path}: an entry was made in it while "
                    "it was deleted; delete it again"
                ) from None
            raise os_error(e, path) from None
        return loc.path


def refuse_slash(path: Any, st: os.stat_result) -> None:
    """
    400 for a path ending in a slash whose entry is not a directory (a
    link to one included): the caller named a directory, as ``rm`` and
    ``mv`` take it.
    """
    if isinstance(path, str) and path.endswith("/") and not stat.S_ISDIR(st.st_mode):
        raise not_a_directory(path)


def _check_tree(guard: PathGuard, loc: Any, mounts: bool = False) -> None:
    """
    Refuse a recursive delete that would remove something the policy
    protects inside the tree (``deny`` or ``read_only`` globs such as
    ``**/.git/**``, or under ``hard_links: deny_writes`` a file with other
    names), or that would reach into another file system mounted inside
    it (``shutil.rmtree`` does not stop at mount points, so a bind mount
    would be emptied; checked when ``mounts``), before anything is
    removed.
    """
    paths = guard.rule.paths
    shared = paths.hard_links == "deny_writes"
    protected = bool(paths.deny or paths.read_only)
    if not protected and not shared and not mounts:
        return
    mount = _tree_mount(loc) if mounts else None
    for top, dirs, files, top_fd in os.fwalk(
        loc.name, dir_fd=loc.dir_fd, follow_symlinks=False
    ):
        base = loc.path if top == loc.name else loc.path + top[len(loc.name) :]
        if mount is not None:
            for name in dirs:
                member = f"{base}/{name}"
                _refuse_mount_point(top_fd, name, mount, member, loc.path)
        for name in (*dirs, *files) if protected else ():
            decision = guard.decide(f"{base}/{name}", "delete")
            if not decision.allowed:
                raise _protected_inside(decision, loc.path)
        for name in files if shared else ():
            try:
                st = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            guard.refuse_shared(st, loc.path)


#: What a tree holds that the policy protects, by the refusal's code.
_PROTECTED_INSIDE = {
    Code.PATH_DENIED: "a path the policy denies",
    Code.READ_ONLY: "a read-only path",
}


def _protected_inside(decision: Any, tree: str) -> ApiError:
    """
    The refusal of a tree for what it holds: it names the tree and says
    that something inside is protected (with the code and rule of that
    decision), since the tree itself may well be readable and writable;
    the member is not named, as the caller may not see it.
    """
    what = _PROTECTED_INSIDE.get(decision.code, "a path the policy protects")
    if decision.code == Code.INVALID_PATH:
        return refusal(attrs.evolve(decision, path=tree))
    return forbidden(
        f"{tree} holds {what}, so the tree is left as it is",
        decision.code or Code.PATH_NOT_ALLOWED,
        rule=decision.rule,
    )


def _tree_mount(loc: Any) -> tuple[int, int | None]:
    """The device and mount id of the tree's top directory."""
    return mount_of(loc.dir_fd, loc.name)


def _refuse_mount_point(
    dir_fd: int, name: str, mount: tuple[int, int | None], member: str, tree: str
) -> None:
    """403 when ``name`` (a directory in the tree) is on another mount."""
    if on_another_mount(dir_fd, name, mount):
        raise mount_point(
            f"refusing to delete {tree}: {member} is a mount point "
            "(another file system is mounted inside the tree)"
        )


def refuse_mounted(loc: Location, doing: str, path: Any) -> None:
    """
    403 when the entry itself is a mount point (a volume, or a file or
    directory bind-mounted there).  The kernel refuses to remove or rename
    one (EBUSY), but only at the end: a recursive delete would first have
    emptied the mounted file system.
    """
    if on_another_mount(loc.dir_fd, loc.name, mount_of(loc.dir_fd, ".")):
        raise _mounted(f"refusing to {doing} {path}")


def _mounted(refusing: str) -> ApiError:
    return mount_point(
        f"{refusing}: it is a mount point (another file system is mounted there)"
    )


def _renameat2() -> Any:
    return getattr(libc(), "renameat2", None)


_RENAME_NOREPLACE = 1


def rename_noreplace(src_fd: int, src_name: str, dst_fd: int, dst_name: str) -> None:
    """Rename without replacing: ``renameat2(RENAME_NOREPLACE)`` or link+unlink."""
    fn = _renameat2()
    if fn is not None:
        r = fn(
            src_fd,
            os.fsencode(src_name),
            dst_fd,
            os.fsencode(dst_name),
            _RENAME_NOREPLACE,
        )
        if r == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(err, os.strerror(err))
    try:
        os.stat(dst_name, dir_fd=dst_fd, follow_symlinks=False)
    except FileNotFoundError:
        os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        return
    raise OSError(errno.EEXIST, "File exists")


def _rename(
    overwrite: bool, src_fd: int, src_name: str, dst_fd: int, dst_name: str
) -> None:
    """One rename of a move: replacing what is there only with ``overwrite``."""
    if overwrite:
        os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
    else:
        rename_noreplace(src_fd, src_name, dst_fd, dst_name)


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """An entry's own status in an open directory, or None when missing."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _prefixed(e: ApiError, prefix: str) -> ApiError:
    e.message = f"{prefix}: {e.message}"
    return e


def move(
    guard: PathGuard,
    source: Any,
    destination: Any,
    overwrite: bool,
    across: crossing.Bounds,
    into: bool = True,
    name_check: Callable[[str], None] | None = None,
) -> tuple[str, str]:
    """
    ``files_move``: errors say which side (``source:`` / ``destination:``).

    :param across: the bounds of a copy, when the destination is on another
        file system.
    :param into: a destination that is a directory takes the source into
        it, as ``mv`` does; otherwise the move is ``rename(2)``'s (envd's
        ``os.Rename``): an empty directory is replaced, a non-empty one
        refused.
    :param name_check: asked of the path a file (not a directory) is
        moved to (the policy's extension rules), raising to refuse.
    """
    try:
        src = guard.locate(source, "delete", follow=False, missing_ok=False)
    except ApiError as e:
        raise _prefixed(e, "source") from None
    with src:
        if src.name == "":
            raise forbidden(
                f"source: refusing to move a root directory: {source}",
                Code.PATH_NOT_ALLOWED,
                rule="guard:base_dir",
            )
        src_st = src.lstat()
        try:
            if src_st is not None:
                refuse_slash(source, src_st)
            refuse_mounted(src, "move", source)
            if src_st is not None and stat.S_ISDIR(src_st.st_mode):
                # What the policy protects inside must not leave with the tree.
                _check_tree(guard, src)
            else:
                src.refuse_shared(src_st, source)
                refuse_device(src_st, source)
        except ApiError as e:
            raise _prefixed(e, "source") from None
        try:
            dst = guard.locate(destination, "write", follow=False, make_parents=True)
            if into:
                dst = _through_link_to_dir(guard, dst, destination)
        except ApiError as e:
            raise _prefixed(e, "destination") from None
        with dst:
            try:
                check = (
                    None
                    if src_st is not None and stat.S_ISDIR(src_st.st_mode)
                    else name_check
                )
                return _move_to(
                    guard, src, dst, source, destination, overwrite, across, into, check
                )
            except BaseException:
                dst.undo_made()  # refused: the directories made for it go too
                raise


def _through_link_to_dir(guard: PathGuard, dst: Location, destination: Any) -> Location:
    """
    ``dst``, or the directory it links to: a move onto a link to a
    directory goes into that directory, as ``mv`` and ``shutil.move`` do
    (the ``current -> releases/v2`` layout), rather than being refused or,
    with ``overwrite``, replacing the link with the file.

    The link is followed through the guard, so its target must be where
    the path rules let this call write; a link to a directory they do not
    allow is refused (403), never replaced.  A link to anything else (a
    file, nothing) is the entry itself, as before.

    :raises ApiError: the guard's refusal of the link's target; ``dst``
        is closed then.
    """
    st = dst.lstat()
    if st is None or not stat.S_ISLNK(st.st_mode):
        return dst
    try:
        followed = guard.locate(destination, "write", follow=True)
    except ApiError:
        try:
            to_dir = stat.S_ISDIR(os.stat(dst.name, dir_fd=dst.dir_fd).st_mode)
        except OSError:
            to_dir = False
        if to_dir:
            dst.close()
            raise
        return dst
    target = followed.lstat()
    if target is None or not stat.S_ISDIR(target.st_mode):
        followed.close()
        return dst
    dst.close()
    return followed


def _move_to(
    guard: PathGuard,
    src: Location,
    dst: Location,
    source: Any,
    destination: Any,
    overwrite: bool,
    across: crossing.Bounds,
    into: bool = True,
    name_check: Callable[[str], None] | None = None,
) -> tuple[str, str]:
    """The rename of :func:`move`, once both sides are located."""
    dst_st = dst.lstat()
    src_st = src.lstat()
    if (
        src_st is not None
        and dst_st is not None
        and dst.path == src.path
        and (src_st.st_dev, src_st.st_ino) == (dst_st.st_dev, dst_st.st_ino)
        and (stat.S_ISDIR(src_st.st_mode) or not str(destination).endswith("/"))
    ):
        # Onto itself: nothing to do, as rename(2) and the seed's
        # shutil.move do nothing (not a 409 for a file in its own way,
        # nor a directory moved into itself).
        return src.path, dst.path
    dst_fd, dst_name, dst_path = dst.dir_fd, dst.name, dst.path
    # What a message names: the entry in the way, inside the destination
    # directory when the move goes into one.
    shown = destination
    inner_fd = -1
    try:
        if into and dst_st is not None and stat.S_ISDIR(dst_st.st_mode):
            # Moving onto a directory moves into it, as mv and shutil.move do.
            inner_fd = os.open(dst_name or ".", _SUBDIR_FLAGS, dir_fd=dst_fd)
            dst_fd, dst_name = inner_fd, src.name
            dst_path = posixpath.join(dst_path, src.name)
            shown = posixpath.join(str(destination), display_name(src.name))
            decision = guard.decide(dst_path, "write")
            if not decision.allowed:
                raise _prefixed(refusal(decision), "destination")
        elif dst_name == "":
            raise bad_request("destination: is a root directory")
        elif dst_st is not None and stat.S_ISDIR(dst_st.st_mode):
            # rename(2) onto a directory: refused before any copy to
            # another file system, as the kernel would refuse the rename.
            _refuse_replacing_dir(dst, src, destination)
        elif isinstance(destination, str) and destination.endswith("/"):
            # A name ending in a slash names a directory, as it does to mv.
            raise _prefixed(not_a_directory(destination), "destination")
        if name_check is not None:
            try:
                name_check(dst_path)
            except ApiError as e:
                raise _prefixed(e, "destination") from None
        if overwrite:
            # Replacing a file that has other names is a write to it;
            # a device file is never replaced.
            replaced = dst_st if inner_fd < 0 else _lstat_at(dst_fd, dst_name)
            try:
                dst.refuse_shared(replaced, shown)
                refuse_device(replaced, shown)
                if replaced is not None and on_another_mount(
                    dst_fd, dst_name, mount_of(dst_fd, ".")
                ):
                    raise _mounted(f"refusing to replace {shown}")
            except ApiError as e:
                raise _prefixed(e, "destination") from None
        try:
            _rename(overwrite, src.dir_fd, src.name, dst_fd, dst_name)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            exists = _lstat_at(dst_fd, dst_name) is not None
            if exists and not overwrite:
                # The kernel says EXDEV before it looks: refuse before a copy.
                raise FileExistsError(errno.EEXIST, "File exists") from None
            crossing.move_across(
                src.dir_fd,
                src.name,
                dst_fd,
                dst_name,
                exists,
                functools.partial(_rename, overwrite),
                across,
                source,
            )
    except OSError as e:
        if e.errno == errno.ENOTEMPTY and not into:
            raise file_exists(f"destination: Directory not empty: {shown}") from None
        if e.errno == errno.EEXIST or e.errno == errno.ENOTEMPTY:
            raise file_exists(f"destination: File exists: {shown}") from None
        if e.errno == errno.EINVAL:
            raise bad_request(
                "destination: cannot move a directory into itself"
            ) from None
        raise _prefixed(os_error(e, destination), "destination") from None
    finally:
        if inner_fd >= 0:
            os.close(inner_fd)
    return src.path, dst_path


def _refuse_replacing_dir(dst: Location, src: Location, destination: Any) -> None:
    """
    What ``rename(2)`` refuses of a directory it would replace: one that
    is not empty, or one a file (not a directory) would replace.
    """
    src_st, dst_st = src.lstat(), dst.lstat()
    if src_st is not None and not stat.S_ISDIR(src_st.st_mode):
        raise _prefixed(is_a_directory(destination), "destination")
    if src_st is not None and dst_st is not None and src_st.st_ino == dst_st.st_ino:
        if src_st.st_dev == dst_st.st_dev:
            return  # a rename onto itself does nothing
    fd = os.open(dst.name, _SUBDIR_FLAGS, dir_fd=dst.dir_fd)
    try:
        with os.scandir(fd) as entries:
            if next(entries, None) is not None:
                raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY))
    finally:
        os.close(fd)


def change_mode(guard: PathGuard, path: Any, mode: int) -> dict[str, Any]:
    """
    ``files_chmod``: the permissions of the file or directory at ``path``
    (a link is followed inside the boundary; the entry changed is the one
    the guard resolved, reached through a descriptor, never by its name
    again).  Only the permission bits: no set-user-ID, set-group-ID or
    sticky bit, which a root daemon could hand to a program the sandbox's
    users run.  Not a root of the boundary, which the daemon itself works
    in; not a file with other names when ``hard_links: deny_writes``.
    """
    with guard.locate(path, "write", follow=True, missing_ok=False) as loc:
        refuse_root(loc, "change the permissions of", path)
        st = loc.seen()
        if st is None:
            raise file_not_found(path)
        refuse_device(st, path)
        loc.refuse_shared(st, path)
        try:
            fd = os.open(loc.name, _PATH_FLAGS | os.O_NOFOLLOW, dir_fd=loc.dir_fd)
        except OSError as e:
            raise os_error(e, path) from None
        try:
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                raise file_not_found(path)  # replaced since it was resolved
            # An O_PATH descriptor takes no fchmod; its /proc name does.
            os.chmod(f"/proc/self/fd/{fd}", mode)
        except OSError as e:
            raise os_error(e, path) from None
        finally:
            os.close(fd)
        return {"path": loc.path, "mode": f"{mode:03o}"}


#: A descriptor that names an entry without opening it for reading.
_PATH_FLAGS = os.O_PATH | os.O_CLOEXEC


def make_dir(guard: PathGuard, path: Any) -> str:
    """``files_mkdir``: the directory and its parents (exist_ok)."""
    with guard.locate(path, "write", follow=True, make_parents=True) as loc:
        if loc.name == "":
            return loc.path
        try:
            os.mkdir(loc.name, 0o755, dir_fd=loc.dir_fd)
            give(loc.dir_fd, loc.name, loc.owner)
        except FileExistsError:
            st = loc.lstat()
            if st is None or not stat.S_ISDIR(st.st_mode):
                loc.undo_made()
                raise file_exists(
                    f"File exists and is not a directory: {path}"
                ) from None
        except OSError as e:
            loc.undo_made()
            raise os_error(e, path) from None
        return loc.path
