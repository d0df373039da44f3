# -*- test-case-name: tests.routes.test_files -*-
"""
Archives: creating tar.gz/zip from guarded paths, and extracting them with
every member checked before anything is written.

The stdlib's own safety nets are not relied on (``zipfile`` writes through
links already in the destination; ``tarfile`` filters on 3.11.7 predate the
2025 bypass fixes): members are validated here, as names, and then each is
written through the path guard, file by file, atomically.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import posixpath
import stat
import tarfile
import time
import zipfile
from collections.abc import Callable, Generator
from typing import Any

import attrs

from sandboxd.access.guard import PathGuard, give, os_error, refusal
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    file_exists,
    forbidden,
    payload_too_large,
    unmet_precondition,
)
from sandboxd.files.atomic import AtomicWrite, Undo
from sandboxd.files.walk import display_name, visible, walk
from sandboxd.policy.defaults import (
    ARCHIVE_ATTEMPTS,
    ARCHIVE_MAX_NAME_BYTES,
    WALK_DEPTH,
)

FORMATS = ("tar.gz", "zip")


def too_many(limit: int) -> ApiError:
    """413 for an archive over the file-count cap."""
    return payload_too_large(
        limit, message=f"the archive holds more than {limit} files"
    )


def too_big_to_pack(limit: int, what: str = "the archive") -> ApiError:
    """413 for an archive, or the files to pack in one, over the byte cap."""
    return payload_too_large(limit, what)


def too_big_unpacked(limit: int) -> ApiError:
    """413 for an archive whose members unpack to more than the byte cap."""
    return payload_too_large(limit, "the archive's unpacked size")


def refused_member(name: str, why: str) -> ApiError:
    """403 for a member that would land outside the destination."""
    return forbidden(f"archive member refused ({why}): {name!r}", Code.PATH_NOT_ALLOWED)


# -- create -------------------------------------------------------------------


def arcname(top: str, full: str) -> str:
    """
    A member's name, as the seed names it: the last component of the path
    asked for (``top``), then the member's path below it.
    """
    base = posixpath.basename(top.rstrip("/"))
    if full == top:
        return base
    below = full[len(top.rstrip("/")) + 1 :]
    return posixpath.join(base, below) if base else below


class _Budget:
    def __init__(self, max_files: int, max_bytes: int) -> None:
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.files = 0
        self.bytes = 0

    def add(self, size: int, buffer: io.BytesIO) -> None:
        self.files += 1
        self.bytes += size
        if self.files > self.max_files:
            raise too_many(self.max_files)
        if self.bytes > self.max_bytes or buffer.tell() > self.max_bytes:
            raise too_big_to_pack(self.max_bytes)


class _Shrank(Exception):
    """A file ended before the size its tar header gave (rewritten meanwhile)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def create(
    guard: PathGuard, paths: list[str], fmt: str, max_files: int, max_bytes: int
) -> dict[str, Any]:
    """
    Pack ``paths``; links are stored as links, never followed.  Members are
    named as on the seed: a file by its name, a directory's files below the
    directory's name (directories themselves are not members).

    A tar member's size is written before its bytes, so a file that shrinks
    while it is packed (a log or a build output rewritten) cannot be packed
    as it was: the archive is made again, and after
    :data:`~sandboxd.policy.defaults.ARCHIVE_ATTEMPTS` such tries the call
    is refused (412, the same answer as a file that changed while it was
    edited) rather than answered with a broken member.

    :raises ApiError: 412 ``precondition_failed`` for a file that kept
        changing while it was packed.
    """
    changed = ""
    for _ in range(ARCHIVE_ATTEMPTS):
        try:
            return _create(guard, paths, fmt, max_files, max_bytes)
        except _Shrank as e:
            changed = e.path
    base = guard.base_dir.rstrip("/") + "/"
    shown = changed[len(base) :] if changed.startswith(base) else changed
    raise unmet_precondition(
        f"a file changed while it was packed, {ARCHIVE_ATTEMPTS} times: "
        f"{display_name(shown)}; try again once it is written"
    )


def _create(
    guard: PathGuard, paths: list[str], fmt: str, max_files: int, max_bytes: int
) -> dict[str, Any]:
    """:func:`create`, one try."""
    count_members(guard, paths, max_files, max_bytes)
    buffer = io.BytesIO()
    budget = _Budget(max_files, max_bytes)
    if fmt == "zip":
        writer: Any = zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED)
    else:
        writer = tarfile.open(fileobj=buffer, mode="w:gz")
    # Named pipes, sockets and devices have no content to pack: counted,
    # so that an archive of nothing else says why it is empty.
    skipped = 0
    with writer:
        for path in paths:
            with contextlib.closing(_entries(guard, path)) as entries:
                for top, full, st, fd in entries:
                    member = arcname(top, full)
                    if fd is None and not (_is_member(st) or stat.S_ISDIR(st.st_mode)):
                        skipped += 1
                    elif fd is not None:
                        _add(writer, fmt, fd, full, member, st, budget, buffer)
                    else:
                        _add_entry(writer, fmt, full, member, st, guard, budget, buffer)
    data = buffer.getvalue()
    if len(data) > max_bytes:
        raise too_big_to_pack(max_bytes)
    return {
        "content_base64": base64.b64encode(data).decode("ascii"),
        "format": fmt,
        "bytes": len(data),
        "skipped": skipped,
    }


def _entries(
    guard: PathGuard, path: str
) -> Generator[tuple[str, str, os.stat_result, int | None], None, None]:
    """
    What one path asked for brings into an archive, as
    ``(resolved path asked for, entry's path, its status, descriptor)``: a
    file asked for by itself, read through the descriptor given with it;
    else the visible entries below the directory, each opened when packed
    (descriptor None).  The path's descriptor is closed when the walk ends.
    """
    with guard.locate(path, "read", follow=True, missing_ok=False) as loc:
        # The entry may be removed, or swapped for a link, once resolved:
        # it is judged by what was opened (fstat), and a swap is answered
        # as files_list and files_search answer it (404 gone, 403 a link
        # out), never as a failure of the daemon's.
        try:
            if loc.name == "":
                fd = os.open(
                    ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=loc.dir_fd
                )
            else:
                fd = os.open(
                    loc.name,
                    os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                    dir_fd=loc.dir_fd,
                )
        except OSError as e:
            raise os_error(e, path) from None
        top = loc.path
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            yield top, top, st, fd
            return
        for parent, name, sub in walk(fd, top, WALK_DEPTH):
            full = posixpath.join(parent, name)
            if visible(guard, full, sub):
                yield top, full, sub, None
    finally:
        os.close(fd)


def _is_member(st: os.stat_result) -> bool:
    """Whether a walked entry is stored: files and links (directories name their files)."""
    return stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)


def count_members(
    guard: PathGuard, paths: list[str], max_files: int, max_bytes: int
) -> None:
    """
    Refuse (413) an archive of more than ``max_files`` members, or of
    files over ``max_bytes`` together, before a byte is read: members are
    counted as packing counts them, from the walk's names and statuses
    alone, and the count stops at the first member past a bound.  Packing
    still checks both (a file may grow in between).
    """
    files = size = 0
    for path in paths:
        with contextlib.closing(_entries(guard, path)) as entries:
            for _, _, st, fd in entries:
                if fd is None and not _is_member(st):
                    continue
                files += 1
                if stat.S_ISREG(st.st_mode):
                    size += st.st_size
                if files > max_files:
                    raise too_many(max_files)
                if size > max_bytes:
                    raise too_big_to_pack(max_bytes, "the size of the files to pack")


def _add_entry(
    writer: Any,
    fmt: str,
    full: str,
    name: str,
    st: os.stat_result,
    guard: PathGuard,
    budget: _Budget,
    buffer: io.BytesIO,
) -> None:
    """
    One walked entry: files and links are stored; directories are not
    members of their own (as on the seed: their files name them).
    """
    if stat.S_ISREG(st.st_mode):
        try:
            f = guard.open_file(full)
        except ApiError:
            return
        with f:
            _add(writer, fmt, f.fd, full, name, f.stat, budget, buffer)
    elif stat.S_ISLNK(st.st_mode):
        _add(writer, fmt, -1, full, name, st, budget, buffer)
    # Directories, FIFOs, sockets and devices are skipped.


def _add(
    writer: Any,
    fmt: str,
    fd: int,
    path: str,
    name: str,
    st: os.stat_result,
    budget: _Budget,
    buffer: io.BytesIO,
) -> None:
    mode = stat.S_IMODE(st.st_mode)
    if fmt == "zip":
        # A zip names its members in UTF-8 (or CP437), never in raw bytes:
        # a name that is not UTF-8 is stored as files_list shows it.
        name = display_name(name)
    if stat.S_ISLNK(st.st_mode):
        try:
            link = os.readlink(path)
        except OSError:
            return
        budget.add(0, buffer)
        if fmt == "zip":
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            writer.writestr(info, os.fsencode(link))
        else:
            ti = tarfile.TarInfo(name)
            ti.type = tarfile.SYMTYPE
            ti.linkname = link
            ti.mtime = int(st.st_mtime)
            writer.addfile(ti)
        return
    if not stat.S_ISREG(st.st_mode):
        return
    budget.add(st.st_size, buffer)
    with os.fdopen(os.dup(fd), "rb") as fobj:
        if fmt == "zip":
            info = zipfile.ZipInfo.from_file("/dev/null", name)
            info.file_size = st.st_size
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            info.date_time = time.gmtime(max(st.st_mtime, 315532800))[:6]
            with writer.open(info, "w") as out:
                while chunk := fobj.read(1 << 20):
                    out.write(chunk)
                    if buffer.tell() > budget.max_bytes:
                        raise too_big_to_pack(budget.max_bytes)
        else:
            ti = tarfile.TarInfo(name)
            ti.size = st.st_size
            ti.mode = mode
            ti.mtime = int(st.st_mtime)
            try:
                writer.addfile(ti, fobj)
            except OSError as e:
                # tarfile's "unexpected end of data" (no errno): fewer bytes
                # than the header's size; a read error has an errno.
                if e.errno is not None:
                    raise
                raise _Shrank(path) from None
    if buffer.tell() > budget.max_bytes:
        raise too_big_to_pack(budget.max_bytes)


# -- extract ----------------------------------------------------------------------


@attrs.define
class Member:
    """One archive member, validated."""

    name: str
    kind: str  # "file" | "dir" | "link"
    size: int
    mode: int
    link: str = ""
    source: Any = None


def _clean_name(raw: str, windows: bool = False) -> str:
    """
    A member name as a safe relative path, or a 403.

    A backslash is a character of a name on Linux (``files_archive`` packs
    ``win\\style.txt`` and systemd's ``dev-disk-by\\x2duuid.mount`` as they
    are), so it is kept, except in an archive made on Windows (``windows``:
    a zip whose maker says so), where it may be meant as a separator;
    and a name whose backslash-separated parts hold ``..`` is refused
    everywhere, whatever it was meant as.
    """
    if "\x00" in raw or len(raw) > ARCHIVE_MAX_NAME_BYTES:
        raise refused_member(raw[:200], "bad name")
    if "\\" in raw:
        if windows:
            raise refused_member(raw, "backslash in a name made on Windows")
        if ".." in raw.replace("\\", "/").split("/"):
            raise refused_member(raw, "'..' between backslashes in name")
    if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":"):
        raise refused_member(raw, "absolute name")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise refused_member(raw, "'..' in name")
    if not parts:
        raise refused_member(raw, "empty name")
    return "/".join(parts)


def _members(
    data: bytes | bytearray, fmt: str, max_files: int, max_bytes: int
) -> tuple[Any, list[Member]]:
    members: list[Member] = []
    total = 0
    try:
        if fmt == "zip":
            archive: Any = zipfile.ZipFile(io.BytesIO(data))
            infos = archive.infolist()
            if len(infos) > max_files:
                raise too_many(max_files)
            for info in infos:
                mode = info.external_attr >> 16
                # create_system 0: MS-DOS and Windows (FAT, NTFS) makers.
                name = _clean_name(info.filename, info.create_system == 0)
                if stat.S_ISLNK(mode):
                    if info.file_size > ARCHIVE_MAX_NAME_BYTES:
                        raise refused_member(info.filename, "link target too long")
                    link = archive.read(info).decode("utf-8", "surrogateescape")
                    members.append(Member(name, "link", 0, 0o777, link))
                elif info.is_dir():
                    members.append(Member(name, "dir", 0, stat.S_IMODE(mode) or 0o755))
                elif stat.S_IFMT(mode) and not stat.S_ISREG(mode):
                    # Permission bits with no file type (Python's writestr
                    # writes those) are a plain file, like no mode at all.
                    raise refused_member(info.filename, "special file")
                else:
                    total += info.file_size
                    members.append(
                        Member(
                            name,
                            "file",
                            info.file_size,
                            stat.S_IMODE(mode) or 0o644,
                            source=info,
                        )
                    )
                if total > max_bytes:
                    raise too_big_unpacked(max_bytes)
        else:
            archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
            count = 0
            files: dict[str, Member] = {}
            for ti in archive:
                count += 1
                if count > max_files:
                    raise too_many(max_files)
                name = _clean_name(ti.name)
                if ti.issym():
                    members.append(Member(name, "link", 0, 0o777, ti.linkname))
                elif ti.islnk():
                    # What tar writes for a second name of a file it packed:
                    # written as a copy of that member, counted again.
                    copied = _hard_link_target(ti, files)
                    total += copied.size
                    copy = Member(
                        name, "file", copied.size, copied.mode, source=copied.source
                    )
                    members.append(copy)
                    files[name] = copy
                elif ti.isdir():
                    members.append(Member(name, "dir", 0, ti.mode & 0o777 or 0o755))
                elif ti.isreg():
                    total += ti.size
                    member = Member(
                        name, "file", ti.size, ti.mode & 0o777 or 0o644, source=ti
                    )
                    members.append(member)
                    files[name] = member
                else:
                    raise refused_member(ti.name, "special file")
                if total > max_bytes:
                    raise too_big_unpacked(max_bytes)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as e:
        raise bad_request(f"not a valid {fmt} archive: {e}") from None
    return archive, members


def _hard_link_target(ti: tarfile.TarInfo, files: dict[str, Member]) -> Member:
    """
    The earlier file member a hard link member names, or a 403: a hard
    link to anything but a file already in the archive (a name outside
    it, a directory, a link, one that comes later) would reach past what
    the archive itself holds.
    """
    try:
        target = _clean_name(ti.linkname)
    except ApiError:
        raise refused_member(ti.name, "hard link points out") from None
    found = files.get(target)
    if found is None:
        raise refused_member(
            ti.name, "hard link to what is not a file earlier in the archive"
        )
    return found


def _check(members: list[Member], guard: PathGuard, dest: str, overwrite: bool) -> None:
    """Every member, before any byte is written."""
    seen: dict[str, str] = {}
    links = set()
    for m in members:
        if m.name in seen and (seen[m.name] != m.kind or m.kind != "dir"):
            raise refused_member(m.name, "duplicate member")
        seen[m.name] = m.kind
        parts = m.name.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in links:
                raise refused_member(m.name, "path goes through a link member")
            if seen.get(prefix) == "file":
                raise refused_member(m.name, "path goes through a file member")
        if m.kind == "link":
            if m.link.startswith("/") or "\x00" in m.link:
                raise refused_member(m.name, "link points out")
            landing = posixpath.normpath(
                posixpath.join(posixpath.dirname(m.name), m.link)
            )
            if landing == ".." or landing.startswith("../"):
                raise refused_member(m.name, "link points out")
            links.add(m.name)
    for m in members:
        target = posixpath.join(dest, m.name)
        decision = guard.decide(target, "write")
        if not decision.allowed:
            raise refusal(decision)
        # What already exists on the way: links are refused, not written through.
        here = dest
        for part in m.name.split("/"):
            here = posixpath.join(here, part)
            try:
                st = os.lstat(here)
            except FileNotFoundError:
                break
            except OSError as e:
                raise os_error(e, target) from None
            if stat.S_ISLNK(st.st_mode):
                raise refused_member(m.name, "a link already in the destination")
            if here != target and not stat.S_ISDIR(st.st_mode):
                raise refused_member(m.name, "a file already in the destination")
            if here == target and m.kind != "dir":
                if stat.S_ISDIR(st.st_mode):
                    raise refused_member(
                        m.name, "a directory already in the destination"
                    )
                if not overwrite:
                    raise file_exists(f"File exists: {target}")
                # Before anything is written, so a refusal leaves no half.
                guard.refuse_shared(st, target)


def extract(
    guard: PathGuard,
    data: bytes | bytearray,
    fmt: str,
    destination: str,
    overwrite: bool,
    max_files: int,
    max_bytes: int,
    name_check: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """
    Unpack into ``destination``: all or nothing.  Every member is checked
    before anything (the destination included) is created; a failure
    while writing (a member that fails its CRC, a full disk) removes what
    was created and puts every replaced file back.

    :param name_check: asked of each file and link member's path (the
        policy's extension rules), raising to refuse the whole archive.
    """
    archive, members = _members(data, fmt, max_files, max_bytes)
    with archive:
        # Resolved without creating anything: a refusal leaves no directory.
        dest = guard.check(destination, "write")
        _check(members, guard, dest, overwrite)
        if name_check is not None:
            for m in members:
                if m.kind != "dir":
                    name_check(posixpath.join(dest, m.name))
        undo = Undo(guard)
        try:
            result = _write(
                archive,
                fmt,
                members,
                guard,
                destination,
                dest,
                overwrite,
                max_bytes,
                undo,
            )
        except (tarfile.TarError, zipfile.BadZipFile, EOFError) as e:
            undo.run()
            raise bad_request(f"not a valid {fmt} archive: {e}") from None
        except BaseException:
            undo.run()
            raise
        undo.forget()
    return result


def _write(
    archive: Any,
    fmt: str,
    members: list[Member],
    guard: PathGuard,
    destination: str,
    dest: str,
    overwrite: bool,
    max_bytes: int,
    undo: Undo,
) -> dict[str, Any]:
    """Create the destination and the members, noting each step in ``undo``."""
    with guard.locate(destination, "write", follow=True, make_parents=True) as loc:
        undo.created.extend(loc.made_paths())
        if loc.path != dest:  # a link changed under us since the check
            dest = loc.path
            _check(members, guard, dest, overwrite)
        if loc.name:
            try:
                os.mkdir(loc.name, 0o755, dir_fd=loc.dir_fd)
                undo.created.append(dest)
                give(loc.dir_fd, loc.name, loc.owner)
            except FileExistsError:
                pass
            except OSError as e:
                raise os_error(e, destination) from None
    written = 0
    files = 0
    for m in members:
        target = posixpath.join(dest, m.name)
        if m.kind in ("dir", "link"):
            with guard.locate(target, "write", follow=False, make_parents=True) as d:
                undo.created.extend(d.made_paths())
                try:
                    if m.kind == "dir":
                        os.mkdir(d.name, m.mode | 0o700, dir_fd=d.dir_fd)
                    else:
                        os.symlink(m.link, d.name, dir_fd=d.dir_fd)
                except FileExistsError:
                    if m.kind == "link":
                        raise
                    continue
                undo.created.append(target)
                give(d.dir_fd, d.name, d.owner)
            continue
        loc = guard.locate(target, "write", follow=False, make_parents=True)
        undo.take_made(loc)
        writer = AtomicWrite(loc, overwrite=overwrite, mode=m.mode, display=target)
        try:
            source = (
                archive.open(m.source)
                if fmt == "zip"
                else archive.extractfile(m.source)
            )
            got = 0
            with source:
                while chunk := source.read(1 << 20):
                    got += len(chunk)
                    written += len(chunk)
                    if got > m.size or written > max_bytes:
                        raise too_big_unpacked(max_bytes)
                    writer.write(chunk)
        except BaseException:
            writer.abort()
            raise
        undo.commit(writer, target)
        files += 1
    return {"destination": dest, "files": files, "bytes": written}
