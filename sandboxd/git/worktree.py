# -*- test-case-name: tests.git.test_worktree -*-
"""
The files of a work tree that a git call is about to write, kept in memory
so that a call that fails half-way can put them back.

Git writes a work tree file by file and stops at the first it cannot write:
a restore or a stash pop that meets a full disk leaves some files as the
source has them, others cut short, and a stash pop that git refuses after
it restored the stash's untracked files leaves those behind.  For a call
that overwrites the user's own versions (which git does not hold), only a
copy taken before can undo that; so the handler lists the paths the call
may write, :func:`keep` reads them (each file's bytes, mode and owner, or
that it is absent), and after a failure :func:`put_back` makes the paths
that differ what they were.

Every path is reached through descriptors opened without following a link
(:func:`~sandboxd.access.guard.open_real_dir`), since the tree is the
caller's and may hold links anywhere.  What is kept is bounded
(:data:`~sandboxd.policy.defaults.GIT_KEEP_BYTES` a call, and
:class:`KeepBudget` for all of them); a file past the bound,
or that is neither a regular file nor a link, is not kept, and a put-back
that meets one that changed says so.  Both run in a thread: they read and
write whole files.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

import attrs

from sandboxd.access.guard import open_real_dir

#: How a kept file is opened for reading, and made again.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAKE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@attrs.frozen
class Kept:
    """One path as it was: a file's bytes, a link's target, or absent."""

    path: str
    data: bytes | None = None
    link: str | None = None
    mode: int = 0
    uid: int = -1
    gid: int = -1

    @property
    def absent(self) -> bool:
        return self.data is None and self.link is None


@attrs.define
class KeptTree:
    """
    What :func:`keep` read under ``top``.

    :ivar missing: directories that did not exist, below which an absent
        path lies (a put-back removes them again when they are empty).
    :ivar unkept: paths that could not be kept (past the bound, a
        directory, a device, or reached through a link).
    """

    top: str
    kept: list[Kept] = attrs.Factory(list)
    missing: set[str] = attrs.Factory(set)
    unkept: list[str] = attrs.Factory(list)

    @property
    def size(self) -> int:
        """The bytes of the files kept."""
        return sum(len(k.data) for k in self.kept if k.data is not None)


class KeepBudget:
    """
    The bytes the calls in flight may keep together, so that many at once
    cannot hold more than that in memory; taken and given back on the
    reactor's thread.
    """

    def __init__(self, total: int) -> None:
        self.left = total

    def take(self, want: int) -> int:
        """Up to ``want`` bytes of what is left; how many."""
        granted = min(want, self.left)
        self.left -= granted
        return granted

    def give(self, count: int) -> None:
        """Give back ``count`` bytes taken."""
        self.left += count


def _split(path: str) -> tuple[str, str]:
    parent, _, name = path.rpartition("/")
    return parent, name


def keep(top: str, paths: list[str], limit: int) -> KeptTree:
    """
    Read ``paths`` (relative to the work tree's top ``top``, as git lists
    them) as they are now, at most ``limit`` bytes of files in all.
    """
    tree = KeptTree(top)
    budget = limit
    for path in dict.fromkeys(paths):
        parent, name = _split(path)
        if not name:
            continue
        try:
            dir_fd = open_real_dir(os.path.join(top, parent))
        except FileNotFoundError:
            tree.kept.append(Kept(path))
            _note_missing(tree, parent)
            continue
        except OSError:  # a link, or a file, on the way
            tree.unkept.append(path)
            continue
        try:
            kept = _read(dir_fd, path, name, budget)
        finally:
            os.close(dir_fd)
        if kept is None:
            tree.unkept.append(path)
            continue
        tree.kept.append(kept)
        if kept.data is not None:
            budget -= len(kept.data)
    return tree


def _note_missing(tree: KeptTree, parent: str) -> None:
    """Note ``parent`` and those of its ancestors that do not exist."""
    while parent:
        try:
            os.close(open_real_dir(os.path.join(tree.top, parent)))
            return
        except FileNotFoundError:
            tree.missing.add(parent)
        except OSError:
            return
        parent = _split(parent)[0]


def _read(dir_fd: int, path: str, name: str, budget: int) -> Kept | None:
    """``name`` in ``dir_fd`` as it is, or None when it cannot be kept."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return Kept(path)
    mode, uid, gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(name, dir_fd=dir_fd)
        return Kept(path, link=target, mode=mode, uid=uid, gid=gid)
    if not stat.S_ISREG(st.st_mode) or st.st_size > budget:
        return None
    data = _content(dir_fd, name, budget)
    if data is None:
        return None
    return Kept(path, data=data, mode=mode, uid=uid, gid=gid)


def put_back(tree: KeptTree) -> list[str]:
    """
    Make every kept path that differs from what :func:`keep` read what it
    was: first remove what is there instead (freeing the room it holds),
    then write the kept files and links again with their mode and owner,
    then remove the directories that had not existed once empty.

    :return: the kept paths that are not as they were (none: all put
        back); the unkept ones (``tree.unkept``) are not looked at.
    """
    wrong: list[str] = []
    due: list[Kept] = []
    for kept in tree.kept:
        state = _differs(tree.top, kept)
        if state is None:
            continue
        if state == "blocked" or not _remove(tree.top, kept.path):
            wrong.append(kept.path)
            continue
        if not kept.absent:
            due.append(kept)
    for kept in due:
        if not _write(tree.top, kept):
            wrong.append(kept.path)
    remove_empty_dirs(tree.top, tree.missing)
    return wrong


def remove_empty_dirs(top: str, folders: Iterable[str]) -> None:
    """
    Remove those of ``folders`` (paths under ``top``) that are empty,
    deepest first.  Each is reached through descriptors opened without
    following a link, and ``rmdir`` removes only an empty directory, so
    nothing outside the work tree and nothing with content in it can go.
    """
    for folder in sorted(set(folders), key=lambda f: f.count("/"), reverse=True):
        parent, name = _split(folder)
        try:
            dir_fd = open_real_dir(os.path.join(top, parent))
        except OSError:
            continue
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except OSError:
            pass  # not empty (the user's own), not a directory, or gone
        finally:
            os.close(dir_fd)


def _differs(top: str, kept: Kept) -> str | None:
    """
    None when ``kept.path`` is as kept; ``"changed"`` when it is not;
    ``"blocked"`` when something that cannot be removed here (a
    directory, a path through a link) stands in the way.
    """
    parent, name = _split(kept.path)
    try:
        dir_fd = open_real_dir(os.path.join(top, parent))
    except FileNotFoundError:
        return None if kept.absent else "changed"
    except OSError:  # a link, or a file, on the way: git wrote nothing there
        return None if kept.absent else "blocked"
    try:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None if kept.absent else "changed"
        if stat.S_ISDIR(st.st_mode):
            return "blocked"
        if kept.absent:
            return "changed"
        if kept.link is not None:
            same = (
                stat.S_ISLNK(st.st_mode)
                and os.readlink(name, dir_fd=dir_fd) == kept.link
            )
            return None if same else "changed"
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(kept.data or b""):
            return "changed"
        if stat.S_IMODE(st.st_mode) != kept.mode:
            return "changed"
        same = _content(dir_fd, name, st.st_size) == kept.data
        return None if same else "changed"
    finally:
        os.close(dir_fd)


def _content(dir_fd: int, name: str, limit: int) -> bytes | None:
    """The bytes of the file ``name``; None past ``limit`` or unreadable."""
    try:
        fd = os.open(name, _READ, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        chunks = []
        total = 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > limit:
                return None
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _remove(top: str, path: str) -> bool:
    """Remove what is at ``path`` now (not a directory); whether it is gone."""
    parent, name = _split(path)
    try:
        dir_fd = open_real_dir(os.path.join(top, parent))
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    finally:
        os.close(dir_fd)
    return True


def _write(top: str, kept: Kept) -> bool:
    """Make ``kept`` again where it was; whether it is all there."""
    parent, name = _split(kept.path)
    try:
        dir_fd = _make_dirs(top, parent, kept)
    except OSError:
        return False
    try:
        if kept.link is not None:
            os.symlink(kept.link, name, dir_fd=dir_fd)
            if _owned(kept):
                os.chown(name, kept.uid, kept.gid, dir_fd=dir_fd, follow_symlinks=False)
            return True
        fd = os.open(name, _MAKE, 0o600, dir_fd=dir_fd)
        try:
            view = memoryview(kept.data or b"")
            while view:
                view = view[os.write(fd, view) :]
            if _owned(kept):
                os.fchown(fd, kept.uid, kept.gid)
            os.fchmod(fd, kept.mode)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(dir_fd)


def _owned(kept: Kept) -> bool:
    """Whether a file made again must be given back to its owner (as root)."""
    return os.geteuid() == 0 and kept.uid >= 0


def _make_dirs(top: str, parent: str, kept: Kept) -> int:
    """
    An fd of ``parent`` under ``top``, made again (as the file's owner's)
    where git removed it with the files in it.
    """
    try:
        return open_real_dir(os.path.join(top, parent))
    except FileNotFoundError:
        pass
    done = ""
    for part in parent.split("/"):
        dir_fd = open_real_dir(os.path.join(top, done))
        try:
            os.mkdir(part, 0o755, dir_fd=dir_fd)
            if _owned(kept):
                os.chown(part, kept.uid, kept.gid, dir_fd=dir_fd, follow_symlinks=False)
        except FileExistsError:
            pass
        finally:
            os.close(dir_fd)
        done = os.path.join(done, part)
    return open_real_dir(os.path.join(top, parent))
