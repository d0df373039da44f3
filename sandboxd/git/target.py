# -*- test-case-name: tests.git.test_remote_jobs -*-
"""
Where git works: directories held open from the moment the guard checked
them (:func:`hold_dir`), and where a clone or an init lands: a directory
the daemon makes (or finds) below a parent it holds, so that git works in
what was checked and a failed call takes back only what it made.

A target named by its path would be looked up again by git, and a link
put there in between would lead it anywhere; and a target whose absence
was only observed may have been made by another call by the time a
failure cleans up.  So an absent target is cloned into a fresh directory
of the daemon's own next to it (``mkdir`` fails when the name is taken),
held by descriptor, and renamed into place only once the clone is whole,
without replacing anything that appeared there meanwhile (an empty
directory is replaced only while it is empty).  An init of an existing
directory works in it, held.  Removal goes by descriptor and never
through a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterable

from sandboxd.access.guard import PathGuard, os_error
from sandboxd.errors import ApiError, bad_request, file_exists
from sandboxd.files.walk import rename_noreplace

#: How the directory git works in is held: by identity, not for reading.
HELD = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

#: How a directory is opened to list or empty it.
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class CloneTarget:
    """
    The directory one clone writes: made fresh beside ``name``, or ``name``
    itself when it is an empty directory.

    :ivar fd: the directory git works in, held (valid after :meth:`make`).
    :ivar made: the daemon made it (so the whole of it is the clone's).
    """

    def __init__(
        self, parent_fd: int, parent: str, name: str, what: str = "the clone target"
    ) -> None:
        #: The held parent (the caller's; not closed here).
        self.parent_fd = parent_fd
        self.parent = parent
        self.name = name
        self.what = what
        self.fd = -1
        self.made = False
        #: The name the directory has in the parent now.
        self.current = name
        self.placed = False
        #: ``name`` was an empty directory, which :meth:`place` replaces.
        self.replace_empty = False

    @property
    def path(self) -> str:
        """Where the directory git works in is now."""
        return os.path.join(self.parent, self.current)

    def make(self, owner: tuple[int, int] | None, reuse_full: bool = False) -> None:
        """
        Hold the directory to write: with ``reuse_full``, ``name`` when it
        is a directory; else a new one beside it, given to ``owner``,
        which replaces ``name`` when that is an empty directory still
        (:meth:`place`).

        :raises ApiError: 409 ``file_exists`` when ``name`` is anything
            but such a directory (a link included).
        """
        try:
            st = os.stat(self.name, dir_fd=self.parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if not stat.S_ISDIR(st.st_mode):
                raise self.taken()
            fd = os.open(self.name, HELD, dir_fd=self.parent_fd)
            if reuse_full:
                self.fd = fd
                return
            try:
                if _entries(fd):
                    raise self.taken()
            finally:
                os.close(fd)
            # Written beside and moved over it: a file another call puts
            # there meanwhile makes the move fail, and stays.
            self.replace_empty = True
        stem = self.name[:200]
        for _ in range(8):
            candidate = f".{stem}.clone-{secrets.token_hex(6)}"
            try:
                os.mkdir(candidate, 0o777, dir_fd=self.parent_fd)
            except FileExistsError:
                continue
            break
        else:  # pragma: no cover - 8 collisions of 48 random bits
            raise OSError(errno.EEXIST, "no free name for the clone")
        self.made = True
        self.current = candidate
        self.fd = os.open(candidate, _LIST, dir_fd=self.parent_fd)
        st = os.fstat(self.fd)
        if st.st_uid != os.geteuid() or _entries(self.fd):
            # Not the directory just made: another took its name at once.
            self.made = False
            self.close()
            raise OSError(errno.EEXIST, "the clone's directory was replaced")
        if owner is not None:
            os.fchown(self.fd, owner[0], owner[1])

    def taken(self) -> ApiError:
        """409: the target holds something already."""
        where = os.path.join(self.parent, self.name)
        return file_exists(f"{self.what} exists and is not empty: {where}")

    def place(self) -> None:
        """
        Give the whole clone its name, unless something took the name
        meanwhile (then 409 ``file_exists``, and :meth:`undo` removes the
        clone).
        """
        if not self.made or self.placed:
            return
        try:
            if self.replace_empty:
                # rename(2) replaces a directory only while it is empty.
                os.rename(
                    self.current,
                    self.name,
                    src_dir_fd=self.parent_fd,
                    dst_dir_fd=self.parent_fd,
                )
            else:
                rename_noreplace(
                    self.parent_fd, self.current, self.parent_fd, self.name
                )
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                raise self.taken() from None
            if e.errno == errno.EBUSY:
                raise file_exists(
                    f"{self.what} is a mount point, which a clone cannot take the "
                    f"place of: {os.path.join(self.parent, self.name)}; clone into "
                    "a directory below it"
                ) from None
            raise
        self.current = self.name
        self.placed = True

    def undo(self, keep: Iterable[str] | None = None) -> None:
        """
        Take back what the clone wrote: the directory the daemon made
        (while its name still leads to it), or the entries of the one it
        was given, but those in ``keep`` (everything there before).
        Blocking: call in a thread.
        """
        if self.fd < 0:
            return
        if not self.made:
            _empty(self.fd, frozenset(keep or ()))
            return
        with contextlib.suppress(OSError):
            now = os.stat(self.current, dir_fd=self.parent_fd, follow_symlinks=False)
            mine = os.fstat(self.fd)
            if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                shutil.rmtree(self.current, ignore_errors=True, dir_fd=self.parent_fd)
                if self.placed and self.replace_empty:
                    # The empty directory it took the place of.
                    os.mkdir(self.name, 0o777, dir_fd=self.parent_fd)

    def entries(self) -> list[str]:
        """The names in the directory held."""
        return _entries(self.fd)

    def close(self) -> None:
        """Release the held directory."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _entries(held: int) -> list[str]:
    """The names in the directory held at ``held``."""
    fd = os.open(".", _LIST, dir_fd=held)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def _empty(held: int, keep: frozenset[str] = frozenset()) -> None:
    """Remove everything but ``keep`` in the directory held at ``held``, by descriptor."""
    try:
        fd = os.open(".", _LIST, dir_fd=held)
    except OSError:
        return
    try:
        for name in os.listdir(fd):
            if name in keep:
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(name, ignore_errors=True, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)


def hold_dir(guard: PathGuard, text: str, op: str = "read") -> tuple[str, int]:
    """
    ``(resolved path, descriptor)`` of the existing directory ``text``,
    opened by the guard's own resolution (links met on the way decided on
    their real names, the last component never followed), so that what git
    later starts in is what was checked.

    :raises ApiError: the guard's refusals; 404 when it is missing, 400
        when it is no directory.
    """
    with guard.locate(text, op, follow=True, missing_ok=False) as loc:
        try:
            fd = os.open(loc.name or ".", HELD, dir_fd=loc.dir_fd)
        except NotADirectoryError:
            raise bad_request(f"not a directory: {text}") from None
        except OSError as e:
            raise os_error(e, text) from None
        return loc.path, fd
