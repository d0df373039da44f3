# -*- test-case-name: tests.routes.test_files -*-
"""
Atomic writes: a temporary file beside the target, renamed into place.

Every write of file content goes through :class:`AtomicWrite`, so a reader
sees the old file or the new one, never half of either: an aborted, oversize
or failed upload (ENOSPC included) removes its temporary file and leaves the
old content alone.  The temporary file is created in the directory the guard
resolved by fd, and the rename replaces the *name*: a link planted at the
target is replaced, never written through.

Where the file system has them, the temporary file has no name while it is
written (``O_TMPFILE``) and gets one only at the commit, just before the
rename: a daemon killed mid-upload (``SIGKILL``, the OOM killer) leaves
nothing behind, as the kernel frees a file nobody named.  Elsewhere it is
a hidden name (``O_EXCL | O_NOFOLLOW``) for the whole write.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import posixpath
import re
import secrets
import stat
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from sandboxd.access.guard import (
    Location,
    PathGuard,
    etag_of,
    os_error,
    refuse_device,
)
from sandboxd.errors import (
    ApiError,
    bad_request,
    file_exists,
    insufficient_storage,
    is_a_directory,
    mount_point,
    precondition_failed,
)
from sandboxd.libc import libc

_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_UNNAMED_FLAGS = os.O_WRONLY | getattr(os, "O_TMPFILE", 0) | os.O_CLOEXEC
#: Where an unnamed file's descriptor can be linked from without
#: ``CAP_DAC_READ_SEARCH`` (``linkat`` with ``AT_SYMLINK_FOLLOW``).
_FD_LINKS = "/proc/self/fd"
#: What ``open`` says when a file system (or kernel) has no ``O_TMPFILE``.
_NO_UNNAMED = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT})


def _unnamed_files() -> bool:
    """Whether this system can create unnamed files and name them later."""
    return hasattr(os, "O_TMPFILE") and os.path.isdir(_FD_LINKS)


#: Set to False where unnamed files must not be used.
UNNAMED_FILES = _unnamed_files()


def open_temporary(dir_fd: int, name: str) -> tuple[int, int]:
    """
    A new file for writing in ``dir_fd``, mode 0600: an unnamed one where
    the file system has them, else ``name`` (which must not exist); the
    descriptor, and the unnamed file's inode (0: ``name`` is on disk).
    """
    if UNNAMED_FILES:
        try:
            fd = os.open(".", _UNNAMED_FLAGS, 0o600, dir_fd=dir_fd)
        except OSError as e:
            if e.errno not in _NO_UNNAMED:
                raise
        else:
            inode = os.fstat(fd).st_ino
            UNNAMED.opened(inode)
            return fd, inode
    return os.open(name, _TMP_FLAGS, 0o600, dir_fd=dir_fd), 0


class UnnamedInodes:
    """
    The inodes of the daemon's unnamed files, while written and for
    :data:`UNNAMED_SEEN_SECONDS` after.

    A directory's inotify watch reports a write to an unnamed file in it
    under the name ``#INODE``; a watch of the daemon's hides those
    (:meth:`ours`), as it hides its named temporaries.  The events are
    read on the reactor after the write, so an inode stays known a while
    after its file was named or dropped.
    """

    def __init__(self, keep: int = 4096) -> None:
        self._lock = threading.Lock()
        #: inode -> None while written, else when to forget it
        self._inodes: dict[int, float | None] = {}
        self._keep = keep

    def opened(self, inode: int) -> None:
        with self._lock:
            if len(self._inodes) >= self._keep:
                self._prune()
            self._inodes[inode] = None

    def closed(self, inode: int) -> None:
        with self._lock:
            if inode in self._inodes:
                self._inodes[inode] = time.monotonic() + UNNAMED_SEEN_SECONDS

    def ours(self, name: str) -> bool:
        """Whether ``name`` is how inotify names one of these files."""
        if not (name.startswith("#") and name[1:].isdigit()):
            return False
        with self._lock:
            until = self._inodes.get(int(name[1:]), 0.0)
        return until is None or until > time.monotonic()

    def _prune(self) -> None:
        now = time.monotonic()
        for inode, until in list(self._inodes.items()):
            if until is not None and until <= now:
                del self._inodes[inode]


#: Seconds an unnamed file's inode is still known after its write ended.
UNNAMED_SEEN_SECONDS = 30.0
#: The daemon's unnamed files (one set per process).
UNNAMED = UnnamedInodes()


def name_file(fd: int, dir_fd: int, name: str) -> None:
    """
    Give the unnamed file ``fd`` the name ``name`` in ``dir_fd``
    (``FileExistsError`` when the name is taken: never replaced).
    """
    os.link(f"{_FD_LINKS}/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)


def parse_mode(raw: Any) -> int | None:
    """
    An octal permission string (``"644"``) or the number itself (``420``)
    -> int, or 400 (a boolean or a fraction is no mode).
    """
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise bad_request("'mode' must be octal, e.g. 644")
    try:
        mode = int(raw, 8) if isinstance(raw, str) else raw
    except ValueError:
        raise bad_request("'mode' must be octal, e.g. 644") from None
    if not 0 <= mode <= 0o777:
        raise bad_request("'mode' must be within 000..777")
    return mode


#: Held by a conditional write (``If-Match``; an edit, over what it read)
#: from its check of the target to its rename: writes commit on the pool's
#: threads, and two of them could otherwise both find the version they
#: expect and both replace it, the first one's change lost though answered.
_CHECK_AND_REPLACE = threading.Lock()

#: The daemon's own temporary names (see :func:`temporary_name`); a watch
#: never shows them (SPEC §9: an upload is one ``created`` or ``modified``).
TEMPORARY_NAME = re.compile(r"^\..*\.[0-9a-f]{12}(\.new)?\.upload\Z", re.DOTALL)


def temporary_name(name: str, new: bool) -> str:
    """
    A temporary name beside ``name``: ``.NAME.<hex>.upload``, with ``.new``
    before ``.upload`` when no file of that name exists yet (so a watch
    can tell a creation from a replacement once it is renamed into place).
    """
    return f".{name[:200]}.{secrets.token_hex(6)}{'.new' if new else ''}.upload"


#: Writes whose temporary file is on disk, neither renamed into place nor
#: removed yet: what :func:`abort_unfinished` removes when the daemon stops.
_UNFINISHED: set[AtomicWrite] = set()

#: The reactors whose shutdown ends with :func:`abort_unfinished`.
_ARMED: weakref.WeakSet[Any] = weakref.WeakSet()


def abort_unfinished() -> int:
    """
    Abort every write still unfinished (its temporary file and the parent
    directories made for it removed); how many there were.

    For the end of a daemon's life, once no thread can be writing (the
    reactor's thread pool has been joined): a body still arriving when the
    daemon was told to stop, or a write waiting for its last chunk to
    reach the disk, would otherwise leave its hidden temporary file in the
    user's directory for good.
    """
    unfinished = list(_UNFINISHED)
    for write in unfinished:
        write.abort()
    return len(unfinished)


def abort_unfinished_at_shutdown(reactor: Any) -> None:
    """
    Have ``reactor``'s shutdown end with :func:`abort_unfinished` (once a
    reactor, however many daemons it runs): after its ``during`` phase,
    in which it drops every connection and joins its thread pool.
    """
    if reactor not in _ARMED:
        _ARMED.add(reactor)
        reactor.addSystemEventTrigger("after", "shutdown", abort_unfinished)


class AtomicWrite:
    """
    One atomic replacement of ``location``'s file.

    Takes ownership of ``location`` (closes its fd at the end).  Preconditions
    are checked at construction, so a raw upload is refused before any body
    byte is written, and again just before the rename.

    :param overwrite: replace an existing file (else 409).
    :param if_match: an ETag the existing file must still have (else 412).
    :param mode: permissions of the new file (default: the old file's, or 644).
    """

    def __init__(
        self,
        location: Location,
        *,
        overwrite: bool = True,
        if_match: str | None = None,
        mode: int | None = None,
        display: str | None = None,
    ) -> None:
        self.location = location
        self.display = display or location.path
        self.overwrite = overwrite
        self.if_match = if_match
        self.bytes = 0
        self.fd = -1
        self.tmp_name = ""
        #: whether :attr:`tmp_name` is on disk (an unnamed file gets it
        #: only at the commit)
        self.named = False
        #: the unnamed file's inode (0: it was created with its name)
        self.inode = 0
        #: where :meth:`commit` with ``keep_old`` left the replaced file
        self.old_name = ""
        self.done = False
        if location.name == "" or self.display.endswith("/"):
            # A name ending in a slash names a directory, as it does to open().
            try:
                st = location.lstat()
            except OSError:
                st = None
            location.undo_made()
            location.close()
            if st is None or not stat.S_ISDIR(st.st_mode):
                # open() says "Is a directory" here too, of a directory
                # that is not there: say what is wrong instead.
                raise bad_request(
                    f"the path {self.display} ends in '/', which names a "
                    "directory, not a file: give the file's own name (without "
                    "the trailing '/', or a name after it)",
                    type="IsADirectoryError",
                )
            raise is_a_directory(self.display)
        try:
            existing = self._check_target()
            if mode is None:
                mode = stat.S_IMODE(existing.st_mode) if existing is not None else 0o644
            self.tmp_name = temporary_name(location.name, new=existing is None)
            self.fd, self.inode = open_temporary(location.dir_fd, self.tmp_name)
            self.named = not self.inode
            _UNFINISHED.add(self)
            self._give(existing)
            os.fchmod(self.fd, mode)
        except OSError as e:
            self.abort()
            raise os_error(e, self.display) from None
        except BaseException:
            self.abort()
            raise

    def _give(self, existing: os.stat_result | None) -> None:
        """
        The new file's owner (SPEC §20): a replaced file keeps its owner, a
        new one belongs to the request's user (when the daemon is root).
        """
        if existing is not None:
            if os.geteuid() == 0 and (existing.st_uid, existing.st_gid) != (0, 0):
                os.fchown(self.fd, existing.st_uid, existing.st_gid)
        elif self.location.owner is not None:
            os.fchown(self.fd, *self.location.owner)

    @property
    def path(self) -> str:
        """The resolved target path."""
        return self.location.path

    def _check_target(self) -> os.stat_result | None:
        st = self.location.lstat()
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise is_a_directory(self.display)
        self.location.refuse_shared(st, self.display)
        refuse_device(st, self.display)
        if st is not None and not self.overwrite:
            raise file_exists(f"File exists: {self.display}")
        if self.if_match is not None and self.if_match.strip() != "*":
            if st is None or not _etag_matches(self.if_match, etag_of(st)):
                raise precondition_failed(self.display)
        elif self.if_match is not None and st is None:
            raise precondition_failed(self.display)
        if st is not None and not stat.S_ISREG(st.st_mode):
            return None
        return st

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """
        Append ``data``; ENOSPC aborts the whole write with 507.

        The views of ``data`` taken here are released on every way out: an
        error's traceback keeps this frame alive, and a live view of a
        mapped body (the E2B door's) would stop its caller unmapping it.
        """
        try:
            with memoryview(data) as whole:
                view = whole
                try:
                    while view:
                        n = os.write(self.fd, view)
                        view = view[n:]
                        self.bytes += n
                finally:
                    view.release()
        except OSError as e:
            self.abort()
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise insufficient_storage() from None
            raise os_error(e, self.display) from None

    def commit(self, keep_old: bool = False) -> str:
        """
        Rename into place; returns the new file's ETag.

        :param keep_old: a replaced file is not dropped but kept under a
            temporary name beside it, :attr:`old_name` (the two names are
            swapped in one ``renameat2(RENAME_EXCHANGE)``), so that a caller
            whose larger change fails later can put it back.  Where the
            file system cannot swap, the old file is replaced as usual.
        """
        conditional = (
            _CHECK_AND_REPLACE
            if self.if_match is not None
            else contextlib.nullcontext()
        )
        try:
            with conditional:
                self._check_target()
                self._check_directory()
                st = os.fstat(self.fd)
                dfd = self.location.dir_fd
                if not self.overwrite:
                    # link() refuses an existing name: no window for a racing writer.
                    self._link_as(self.location.name)
                elif not self.named:
                    name_file(self.fd, dfd, self.tmp_name)
                    self.named = True
                self._close()
                if self.overwrite:
                    try:
                        self._replace(keep_old)
                    except OSError as e:
                        if e.errno != errno.EBUSY:
                            raise
                        st = self._in_place(keep_old)
            self.tmp_name = ""
            _UNFINISHED.discard(self)
        except FileExistsError:
            self.abort()
            raise file_exists(f"File exists: {self.display}") from None
        except OSError as e:
            self.abort()
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise insufficient_storage() from None
            raise os_error(e, self.display) from None
        except BaseException:
            self.abort()
            raise
        self.done = True
        self.location.close()
        return etag_of(st)

    def _check_directory(self) -> None:
        """
        The directory the write was begun in must still be where its path
        says: one moved meanwhile (a long upload, a rename of a parent)
        would take the file to a path the answer does not name.  A
        directory gone or moved is, to the caller, as one deleted: 404,
        and nothing is written.
        """
        parent = posixpath.dirname(self.location.path)
        here = os.fstat(self.location.dir_fd)
        try:
            there = os.stat(parent)
        except OSError:
            raise FileNotFoundError(errno.ENOENT, "moved", parent) from None
        if (there.st_dev, there.st_ino) != (here.st_dev, here.st_ino):
            raise FileNotFoundError(errno.ENOENT, "moved", parent)

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            if self.inode:
                UNNAMED.closed(self.inode)

    def _link_as(self, name: str) -> None:
        """The new file under ``name``, which must not exist; no temporary left."""
        dfd = self.location.dir_fd
        if not self.named:
            name_file(self.fd, dfd, name)
            return
        os.link(
            self.tmp_name,
            name,
            src_dir_fd=dfd,
            dst_dir_fd=dfd,
            follow_symlinks=False,
        )
        os.unlink(self.tmp_name, dir_fd=dfd)
        self.named = False

    def _replace(self, keep_old: bool) -> None:
        """The rename over the old file (kept aside with ``keep_old``)."""
        dfd, name = self.location.dir_fd, self.location.name
        if keep_old and _exchange(dfd, self.tmp_name, name):
            self.old_name = self.tmp_name
        else:
            os.rename(self.tmp_name, name, src_dir_fd=dfd, dst_dir_fd=dfd)

    def _in_place(self, keep_old: bool) -> os.stat_result:
        """
        Replace a mounted file's content (a bind mount such as a container's
        ``/etc/hosts``, whose name the kernel will not replace: EBUSY), as
        ``cp`` or a shell's ``>`` would; the temporary file is removed.

        Not atomic, so it is refused where the change must be undoable
        (``keep_old``).  The new bytes are known to fit before the first
        old byte is overwritten, and are written over the old ones before
        the file is cut to length, so a reader never finds it empty.
        """
        if keep_old:
            raise self._mounted(
                "it is a mount point (another file system is mounted there), "
                "written in place only on its own, not in a change of several files"
            )
        dfd = self.location.dir_fd
        src = os.open(
            self.tmp_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd
        )
        try:
            try:
                # Not blocking: a pipe mounted there would wait for a reader.
                dst = os.open(
                    self.location.name,
                    os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                    dir_fd=dfd,
                )
            except OSError as e:
                if e.errno == errno.ENXIO:
                    raise self._mounted(self._NOT_A_FILE) from None
                raise
            try:
                old = os.fstat(dst)
                if not stat.S_ISREG(old.st_mode):
                    raise self._mounted(self._NOT_A_FILE)
                size = os.fstat(src).st_size
                if size - old.st_size > free_bytes(dst):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                offset = 0
                while offset < size:
                    sent = os.sendfile(dst, src, offset, size - offset)
                    if sent == 0:
                        break
                    offset += sent
                os.ftruncate(dst, offset)
                os.fsync(dst)
                st = os.fstat(dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        os.unlink(self.tmp_name, dir_fd=dfd)
        return st

    _NOT_A_FILE = (
        "it is a mount point (another file system is mounted there) and not "
        "a regular file"
    )

    def _mounted(self, why: str) -> ApiError:
        return mount_point(f"refusing to replace {self.display}: {why}")

    def abort(self) -> None:
        """
        Remove the temporary file, and the parent directories made for it;
        the old file stays as it was.
        """
        self._close()
        if self.tmp_name and self.named:
            try:
                os.unlink(self.tmp_name, dir_fd=self.location.dir_fd)
            except OSError:
                pass
        self.tmp_name = ""
        self.named = False
        _UNFINISHED.discard(self)
        self.location.undo_made()
        self.location.close()


_RENAME_EXCHANGE = 2


def _exchange(dir_fd: int, a: str, b: str) -> bool:
    """
    Swap the names ``a`` and ``b`` in ``dir_fd`` atomically; False when
    ``b`` does not exist or the kernel or file system cannot swap.
    """
    fn = getattr(libc(), "renameat2", None)
    if fn is None:
        return False
    if fn(dir_fd, os.fsencode(a), dir_fd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOENT, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err))


def free_bytes(fd: int) -> int:
    """
    The bytes the daemon may still write on ``fd``'s file system (root
    may write into the blocks reserved for it, as the kernel lets it).
    """
    room = os.fstatvfs(fd)
    return (room.f_bfree if os.geteuid() == 0 else room.f_bavail) * room.f_frsize


def _etag_matches(header: str, etag: str) -> bool:
    """Whether an ``If-Match``/``If-None-Match`` value lists ``etag``."""
    wanted = [t.strip() for t in header.split(",")]
    bare = etag.strip('"')
    return any(t in (etag, bare, f"W/{etag}") or t == "*" for t in wanted)


etag_matches = _etag_matches


def write_private(path: str, data: bytes) -> None:
    """
    ``data`` at ``path`` (0600, the daemon's own), written to a temporary
    file beside it, synced and renamed into place, so a reader or a crash
    sees the old bytes or the new, never half (blocking: run it in a
    thread).  The daemon's own state, not a guarded path.
    """
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        remove_if_there(tmp)
        raise


def remove_if_there(path: str) -> None:
    """Remove ``path``; one already gone is no error (blocking)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Undo:
    """
    What a failed change of several files takes back (an extraction, an
    upload of several files): the entries it created, the files it
    replaced, so that an error answer leaves the tree as it was.
    """

    def __init__(self, guard: PathGuard) -> None:
        self.guard = guard
        #: created paths, parents before children
        self.created: list[str] = []
        #: ``(target, name the old file is kept under beside it)``
        self.replaced: list[tuple[str, str]] = []

    def take_made(self, location: Location) -> None:
        """
        The directories ``location``'s look-up made for it: the whole
        change's now, removed by :meth:`run`, not when ``location``'s own
        write fails.
        """
        self.created.extend(location.made_paths())
        made, location.made = location.made, None
        if made is not None:
            made.close()

    def commit(self, writer: AtomicWrite, target: str) -> str:
        """
        ``writer`` renamed into place at ``target``, its old file kept for
        :meth:`run` to put back; the new file's ETag.
        """
        etag = writer.commit(keep_old=True)
        if writer.old_name:
            self.replaced.append((target, writer.old_name))
        else:
            self.created.append(target)
        return etag

    def run(self) -> None:
        """Put the replaced files back, then remove what was created (newest first)."""
        for target, old in reversed(self.replaced):
            self._at(target, functools.partial(_put_back, old))
        for path in reversed(self.created):
            self._at(path, _remove)

    def forget(self) -> None:
        """It all worked: drop the old files that were kept."""
        for target, old in self.replaced:
            self._at(target, functools.partial(_drop, old))

    def _at(self, path: str, action: Callable[[int, str], None]) -> None:
        try:
            with self.guard.locate(path, "delete", follow=False) as loc:
                action(loc.dir_fd, loc.name)
        except (ApiError, OSError):
            pass


def _put_back(old: str, dir_fd: int, name: str) -> None:
    os.rename(old, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _drop(old: str, dir_fd: int, _name: str) -> None:
    os.unlink(old, dir_fd=dir_fd)


def _remove(dir_fd: int, name: str) -> None:
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        os.rmdir(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)
