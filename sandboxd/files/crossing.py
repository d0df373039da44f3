# -*- test-case-name: tests.security.test_files -*-
"""
A move to another file system: copied beside the destination, put in place
by one rename, and then the source removed.

``rename(2)`` stops at a file system's edge (EXDEV): a volume mounted in the
sandbox, ``/tmp`` or ``/dev/shm`` on tmpfs, a directory bind-mounted in.
``mv`` copies then, and so does ``shutil.move``, so a client that moves a
download into its workspace expects the move to work.

The order keeps an error answer meaning that nothing moved: everything is
checked before the first byte is copied (the kinds of entry, mount points
inside the tree, the number of entries, the room on the destination), the
copy is made under a temporary name in the destination's directory, the
source is renamed aside within its own directory, and only then is the
copy renamed into place (the source renamed back if that fails).  What is
left afterwards, the source's tree under its temporary name, is removed;
if that fails the move has still happened, and the leftover is logged.

Owners (where the daemon may set them), permissions, times, symbolic links,
named pipes and hard links between the tree's own files are kept, as
``mv`` keeps them; extended attributes are not copied.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable
from typing import Any

import attrs
from twisted.logger import Logger

from sandboxd.access.guard import os_error, refuse_device
from sandboxd.errors import (
    bad_request,
    insufficient_storage,
    payload_too_large,
    timed_out,
    unavailable,
)
from sandboxd.files.atomic import (
    UNNAMED,
    free_bytes,
    name_file,
    open_temporary,
    temporary_name,
)
from sandboxd.files.mounts import mount_of, on_another_mount

log = Logger()

_SUBDIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 8 * 1024 * 1024


@attrs.frozen
class Bounds:
    """
    What a copy across file systems may take.

    :ivar max_entries: files, directories and links in the tree.
    :ivar timeout_seconds: the copy's wall time.
    :ivar entries_setting: the policy key of ``max_entries``, for the 413.
    :ivar timeout_setting: the policy key of ``timeout_seconds``.
    :ivar stopping: whether the daemon is stopping or the caller has left
        (asked from the copy's thread): the copy is given up and removed
        rather than finished, so a stop neither waits for a big tree nor is
        cut off halfway through by the supervisor's kill, which would leave
        the copy behind, and a caller that left holds no thread.
    """

    max_entries: int
    timeout_seconds: float
    entries_setting: str
    timeout_setting: str
    stopping: Callable[[], bool] = attrs.field(default=lambda: False)


@attrs.define
class _Survey:
    entries: int = 0
    bytes: int = 0


def survey(dir_fd: int, name: str, bounds: Bounds, source: Any) -> _Survey:
    """
    Check the tree at ``name`` before anything is copied: every entry a
    kind that can be copied, no other file system mounted inside it, no
    more than ``bounds.max_entries`` entries; their size in bytes.
    """
    found = _Survey()
    top = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    _count(found, top, source, bounds)
    if not stat.S_ISDIR(top.st_mode):
        return found
    mount = mount_of(dir_fd, name)
    for path, dirs, files, fd in os.fwalk(name, dir_fd=dir_fd, follow_symlinks=False):
        shown = f"{source}{path[len(name) :]}"
        for entry in dirs:
            if on_another_mount(fd, entry, mount):
                raise bad_request(
                    f"source: {shown}/{entry} is a mount point: "
                    "a tree holding one is not moved to another file system"
                )
        for entry in (*dirs, *files):
            try:
                st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            _count(found, st, f"{shown}/{entry}", bounds)
    return found


def _count(found: _Survey, st: os.stat_result, shown: str, bounds: Bounds) -> None:
    if stat.S_ISSOCK(st.st_mode):
        raise bad_request(
            f"source: {shown} is a socket: it cannot be moved to another file system"
        )
    refuse_device(st, shown)
    found.entries += 1
    if found.entries > bounds.max_entries:
        raise payload_too_large(
            bounds.max_entries,
            message=f"source: the tree has more than {bounds.max_entries} entries "
            "to copy to another file system",
            setting=bounds.entries_setting,
        )
    if stat.S_ISREG(st.st_mode):
        found.bytes += st.st_size


def room_for(dir_fd: int, size: int) -> None:
    """507 when the destination's file system has not ``size`` bytes free."""
    if size > free_bytes(dir_fd):
        raise insufficient_storage()


class Copier:
    """One tree's copy, with the deadline and the hard links seen so far."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.deadline = time.monotonic() + bounds.timeout_seconds
        #: ``(st_dev, st_ino)`` of a file with other names: its copy's path
        #: below the copy's top, so the other names become links to it
        self.linked: dict[tuple[int, int], str] = {}
        self.top_fd = -1

    def copy(self, src_fd: int, src_name: str, dst_fd: int, dst_name: str) -> None:
        """Copy ``src_name`` (any kind :func:`survey` passed) to ``dst_name``."""
        st = os.stat(src_name, dir_fd=src_fd, follow_symlinks=False)
        self._entry(src_fd, src_name, dst_fd, dst_name, st, "")

    def _check_going_on(self) -> None:
        if self.bounds.stopping():
            raise unavailable(
                "the copy to another file system was given up and nothing was "
                "moved: the daemon is stopping, or the caller has left"
            )
        if time.monotonic() > self.deadline:
            raise timed_out(
                "the copy to another file system took longer than "
                f"{self.bounds.timeout_seconds:g} s "
                f"(the policy's {self.bounds.timeout_setting})",
                status=504,
                setting=self.bounds.timeout_setting,
            )

    def _directory(
        self, src_fd: int, name: str, dst_fd: int, dst_name: str, rel: str
    ) -> None:
        os.mkdir(dst_name, 0o700, dir_fd=dst_fd)
        source = os.open(name, _SUBDIR_FLAGS, dir_fd=src_fd)
        try:
            target = os.open(dst_name, _SUBDIR_FLAGS, dir_fd=dst_fd)
            try:
                if self.top_fd < 0:
                    self.top_fd = target
                for inner in sorted(os.listdir(source)):
                    self._check_going_on()
                    try:
                        st = os.stat(inner, dir_fd=source, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    path = f"{rel}/{inner}" if rel else inner
                    self._entry(source, inner, target, inner, st, path)
                _keep_metadata(target, None, os.fstat(source))
            finally:
                if target != self.top_fd:
                    os.close(target)
        finally:
            os.close(source)

    def _entry(
        self,
        src_fd: int,
        src_name: str,
        dst_fd: int,
        dst_name: str,
        st: os.stat_result,
        rel: str,
    ) -> None:
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            self._directory(src_fd, src_name, dst_fd, dst_name, rel)
        elif stat.S_ISLNK(mode):
            os.symlink(os.readlink(src_name, dir_fd=src_fd), dst_name, dir_fd=dst_fd)
            _keep_metadata(dst_fd, dst_name, st)
        elif stat.S_ISFIFO(mode):
            os.mkfifo(dst_name, 0o600, dir_fd=dst_fd)
            _keep_metadata(dst_fd, dst_name, st)
        elif stat.S_ISREG(mode):
            key = (st.st_dev, st.st_ino)
            first = self.linked.get(key) if st.st_nlink > 1 else None
            if first is not None and self.top_fd >= 0:
                os.link(
                    first,
                    dst_name,
                    src_dir_fd=self.top_fd,
                    dst_dir_fd=dst_fd,
                    follow_symlinks=False,
                )
                return
            self._file(src_fd, src_name, dst_fd, dst_name, st, top=not rel)
            if st.st_nlink > 1 and rel:
                self.linked[key] = rel
        else:
            refuse_device(st, rel or src_name)

    def _file(
        self,
        src_fd: int,
        src_name: str,
        dst_fd: int,
        dst_name: str,
        st: os.stat_result,
        top: bool = False,
    ) -> None:
        """
        One file's copy.  A file moved on its own (``top``) is copied into
        an unnamed file, named ``dst_name`` once whole (as an upload is,
        :mod:`sandboxd.files.atomic`): a daemon killed meanwhile leaves no
        copy behind.  A tree's files go into its hidden top directory.
        """
        source = os.open(src_name, _READ_FLAGS, dir_fd=src_fd)
        try:
            if not stat.S_ISREG(os.fstat(source).st_mode):
                raise bad_request(f"source: {src_name} changed while it was copied")
            if top:
                target, inode = open_temporary(dst_fd, dst_name)
            else:
                target = os.open(dst_name, _NEW_FILE_FLAGS, 0o600, dir_fd=dst_fd)
                inode = 0
            try:
                while True:
                    self._check_going_on()
                    if os.sendfile(target, source, None, _CHUNK) == 0:
                        break
                _keep_metadata(target, None, st)
                if inode:
                    name_file(target, dst_fd, dst_name)
            finally:
                os.close(target)
                if inode:
                    UNNAMED.closed(inode)
        finally:
            os.close(source)

    def close(self) -> None:
        if self.top_fd >= 0:
            os.close(self.top_fd)
            self.top_fd = -1


def _keep_metadata(fd: int, name: str | None, st: os.stat_result) -> None:
    """
    The owner (where the daemon may give it), then the permissions (a
    change of owner clears set-id bits), then the times; ``name`` is None
    when ``fd`` is the entry itself, else the entry in directory ``fd``.
    """
    times = (st.st_atime_ns, st.st_mtime_ns)
    try:
        if name is None:
            os.fchown(fd, st.st_uid, st.st_gid)
        else:
            os.chown(name, st.st_uid, st.st_gid, dir_fd=fd, follow_symlinks=False)
    except PermissionError:
        pass
    if name is None:
        os.fchmod(fd, stat.S_IMODE(st.st_mode))
        os.utime(fd, ns=times)
        return
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(name, stat.S_IMODE(st.st_mode), dir_fd=fd)
    os.utime(name, ns=times, dir_fd=fd, follow_symlinks=False)


def remove(dir_fd: int, name: str) -> None:
    """Remove ``name`` (a whole tree when a directory), never following a link."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def move_across(
    src_fd: int,
    src_name: str,
    dst_fd: int,
    dst_name: str,
    exists: bool,
    place: Callable[[int, str, int, str], None],
    bounds: Bounds,
    source: Any,
) -> None:
    """
    Move ``src_name`` to ``dst_name`` on another file system.

    :param exists: something is there under ``dst_name`` already (the
        copy's temporary name says so, for a watch to report a change
        rather than a creation).
    :param place: ``(from_fd, from_name, to_fd, to_name)``: the rename the
        same-file-system move would have made of the source, made of the
        finished copy instead (raising OSError where it refuses).
    """
    found = survey(src_fd, src_name, bounds, source)
    room_for(dst_fd, found.bytes)
    copy = temporary_name(dst_name, new=not exists)
    copier = Copier(bounds)
    try:
        # What fails here is the copy's writing, as a rename's failure is
        # told: the caller answers an OSError as the destination's.
        copier.copy(src_fd, src_name, dst_fd, copy)
    except BaseException:
        copier.close()
        _discard(dst_fd, copy)
        raise
    copier.close()
    aside = temporary_name(src_name, new=False)
    try:
        os.rename(src_name, aside, src_dir_fd=src_fd, dst_dir_fd=src_fd)
    except BaseException as e:
        _discard(dst_fd, copy)
        if isinstance(e, OSError):
            # The source cannot leave its directory (a read-only volume).
            error = os_error(e, source)
            error.message = f"source: {error.message}"
            raise error from None
        raise
    try:
        place(dst_fd, copy, dst_fd, dst_name)
    except BaseException:
        _discard(dst_fd, copy)
        try:
            os.rename(aside, src_name, src_dir_fd=src_fd, dst_dir_fd=src_fd)
        except OSError as e:
            log.error(
                "a move to another file system failed and its source could not "
                "be put back: it is at {aside} beside {source} ({why})",
                aside=aside,
                source=source,
                why=e,
            )
        raise
    try:
        remove(src_fd, aside)
    except OSError as e:
        log.warn(
            "a move to another file system left its source's copy at {aside} "
            "beside {source}: {why}",
            aside=aside,
            source=source,
            why=e,
        )


def _discard(dir_fd: int, name: str) -> None:
    try:
        remove(dir_fd, name)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warn(
            "an unfinished copy could not be removed: {name}: {why}", name=name, why=e
        )
