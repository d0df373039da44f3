# -*- test-case-name: tests.test_guard -*-
"""
The path guard (SPEC §11.1): one place that decides every path the daemon
touches (files, cwd of shell/process/PTY/code, git path).

A path is decided twice: lexically by the policy (:func:`sandboxd.policy.paths.decide`,
the same answer ``/capabilities/check`` gives, so refusals never depend on
what exists), then by descriptor.  Resolution never lets the kernel follow a
symbolic link: directories are opened from an anchor fd with
``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)``
where the kernel has it, and one ``O_PATH | O_NOFOLLOW`` component at a time
otherwise.  When a link is met, its target is spliced into the path as text
and the whole resolution starts again, so every location actually used has
passed the policy on its real name, and a link swapped in between check and
use meets ``O_NOFOLLOW`` instead of being followed.  Trailing slashes are
stripped before anything is opened (``open("link/", O_NOFOLLOW)`` follows).

/proc, /sys and /dev are refused by name, and also by what a location is
on: a kernel file system (procfs, sysfs, cgroup ...) mounted inside the
base is refused the same way, judged by ``fstatfs`` on the descriptors the
resolution holds, since a prefix check cannot see a bind mount.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import platform
import posixpath
import stat
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs

from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    file_not_found,
    forbidden,
    insufficient_storage,
    internal,
    invalid_path,
    is_a_directory,
    not_a_directory,
    out_of_resources,
    permission_denied,
)
from sandboxd.libc import libc
from sandboxd.policy.paths import (
    PathDecision,
    absolute,
    decide,
    in_system_root,
    request_target,
    under,
)
from sandboxd.policy.rules import Anchors, EffectiveRule
from sandboxd.processes.command import resolve_user

_MESSAGES = {
    Code.PATH_NOT_ALLOWED: "path is outside the allowed area",
    Code.PATH_DENIED: "path is denied by policy",
    Code.READ_ONLY: "path is read-only",
    Code.SYMLINK_DENIED: "symbolic links are not allowed here",
}

#: Links followed in one resolution before it is called a loop (Linux's MAXSYMLINKS).
MAX_LINKS = 40

#: The longest name one path component may have, in bytes (Linux's NAME_MAX).
NAME_MAX = 255

#: The longest path, with its NUL, the kernel takes by name (Linux's
#: ``PATH_MAX``): a longer one can be neither made nor named again.
PATH_MAX = 4096


def _path_too_long(path: str) -> bool:
    """Whether ``path`` (absolute) is longer than the kernel takes by name."""
    try:
        size = len(os.fsencode(path))
    except UnicodeError:  # a lone surrogate: the kernel never sees it
        size = len(path.encode("utf-8", "surrogatepass"))
    return size >= PATH_MAX


def name_too_long(path: str) -> bool:
    """Whether a component of ``path`` is longer than any file system takes."""
    for part in path.split("/"):
        if len(part) * 4 <= NAME_MAX:
            continue
        try:
            size = len(os.fsencode(part))
        except UnicodeError:  # a lone surrogate: the kernel never sees it
            size = len(part.encode("utf-8", "surrogatepass"))
        if size > NAME_MAX:
            return True
    return False


_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ENTRY_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def refusal(decision: PathDecision) -> ApiError:
    """The error for a refused decision (same whether the path exists or not)."""
    if decision.code == Code.INVALID_PATH:
        return invalid_path("NUL is not allowed in a path")
    code = decision.code or Code.PATH_NOT_ALLOWED
    message = _MESSAGES.get(code, "path refused")
    if code is Code.PATH_DENIED and decision.rule == "guard:base_dir":
        message = "the base dir itself cannot be removed"
    return forbidden(f"{message}: {decision.path}", code, rule=decision.rule)


# -- openat2 through ctypes ------------------------------------------------


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08


def _load_openat2() -> Any:
    syscall = getattr(libc(), "syscall", None)
    if syscall is None:
        return None
    syscall.restype = ctypes.c_long
    how = _OpenHow(_DIR_FLAGS, 0, _RESOLVE_BENEATH)
    probe = os.open("/", _DIR_FLAGS)
    try:
        fd = syscall(_SYS_OPENAT2, probe, b".", ctypes.byref(how), ctypes.sizeof(how))
    finally:
        os.close(probe)
    if fd < 0:
        return None
    os.close(fd)
    return syscall


_syscall = _load_openat2()

#: Whether the fast path is in use; tests switch it off to exercise the walk.
USE_OPENAT2 = _syscall is not None


def _openat2_dir(dir_fd: int, rel: str) -> int:
    """Open a directory below ``dir_fd`` with no link followed; OSError otherwise."""
    how = _OpenHow(
        _DIR_FLAGS, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
    )
    fd = _syscall(
        _SYS_OPENAT2, dir_fd, os.fsencode(rel), ctypes.byref(how), ctypes.sizeof(how)
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), rel)
    return int(fd)


# -- kernel file systems ---------------------------------------------------

#: statfs(2) ``f_type`` of the file systems that expose the kernel rather than
#: files.  devtmpfs is missing because it reports tmpfs's number: the /dev
#: prefix check and the regular-file check on content cover it.
SPECIAL_FILESYSTEMS = {
    0x9FA0: "proc",
    0x62656572: "sysfs",
    0x1CD1: "devpts",
    0x64626720: "debugfs",
    0x73636673: "securityfs",
    0x74726163: "tracefs",
    0x27E0EB: "cgroup",
    0x63677270: "cgroup2",
    0xCAFE4A11: "bpf",
    0xF97CFF8C: "selinuxfs",
    0xDE5E81E4: "efivarfs",
    0x62656570: "configfs",
    0x6165676C: "pstore",
    0x42494E4D: "binfmt_misc",
}

# f_type is the first field of struct statfs: a word everywhere except s390x.
_F_TYPE = ctypes.c_uint if platform.machine() == "s390x" else ctypes.c_long
_STATFS_SIZE = 256  # larger than struct statfs on every Linux ABI


def _load_fstatfs() -> Any:
    """libc's ``fstatfs``, if it works on an ``O_PATH`` fd (Linux 3.12+)."""
    fn = getattr(libc(), "fstatfs", None)
    if fn is None:
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_void_p)
    fn.restype = ctypes.c_int
    probe = os.open("/", os.O_PATH | os.O_CLOEXEC)
    try:
        works = fn(probe, ctypes.create_string_buffer(_STATFS_SIZE)) == 0
    finally:
        os.close(probe)
    return fn if works else None


_fstatfs = _load_fstatfs()


def special_filesystem(fd: int) -> str | None:
    """
    The kernel file system ``fd`` is on (``"proc"``, ``"sysfs"`` ...), or None.

    One ``fstatfs`` on a descriptor already held, so it costs no lookup.  A
    failure answers ``"unknown"``: refusing is safer than guessing.
    """
    if _fstatfs is None:
        return None
    buf = ctypes.create_string_buffer(_STATFS_SIZE)
    if _fstatfs(fd, buf) != 0:
        return "unknown"
    return SPECIAL_FILESYSTEMS.get(_F_TYPE.from_buffer(buf).value & 0xFFFFFFFF)


def mounted_special(
    dir_fd: int, name: str, st: os.stat_result, dir_dev: int
) -> str | None:
    """
    Whether the entry ``name`` (status ``st``) is the root of a kernel file
    system mounted on its directory (device ``dir_dev``).

    Only an entry on another device than its directory can be a mount
    point, so the common case costs nothing beyond the ``lstat`` in hand.
    """
    if st.st_dev == dir_dev:
        return None
    try:
        fd = os.open(name, _ENTRY_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError:
        return "unknown"
    try:
        return special_filesystem(fd)
    finally:
        os.close(fd)


def dangling_link(path: str) -> ApiError:
    """
    403 ``path_not_allowed``: ``path`` leads through a link whose target is
    missing, so a write would create the link's target, not a path decided.
    """
    return refusal(
        PathDecision(path, False, Code.PATH_NOT_ALLOWED, "guard:dangling-link")
    )


def system_refusal(path: Any) -> ApiError:
    """The refusal for /proc, /sys, /dev, and kernel file systems mounted elsewhere."""
    return refusal(
        PathDecision(str(path), False, Code.PATH_NOT_ALLOWED, "guard:system-paths")
    )


def shared_refusal(path: Any, rule: str) -> ApiError:
    """A change to a multiply-linked regular file under ``hard_links: deny_writes``."""
    return forbidden(
        f"the file has other hard links and may not be changed: {path}",
        Code.PATH_DENIED,
        rule=rule,
    )


def is_shared(st: os.stat_result | None) -> bool:
    """A regular file with more than one name (``st_nlink > 1``)."""
    return st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1


# -- resolution results ----------------------------------------------------


class _Restart(Exception):
    """A link was met: resolve ``target`` (an absolute lexical path) instead."""

    def __init__(self, target: str, point: str) -> None:
        super().__init__(target)
        self.target = target
        #: where the link itself points (``target`` minus the rest of the path)
        self.point = point


def give(dir_fd: int, name: str, owner: tuple[int, int] | None) -> None:
    """Hand an entry the daemon just created to ``owner`` (the link itself, for a link)."""
    if owner is not None:
        os.chown(name, owner[0], owner[1], dir_fd=dir_fd, follow_symlinks=False)


class MadeDirs:
    """
    The directories one resolution created on its way (``make_parents``),
    so that a request refused afterwards can take them back: an error
    answer means nothing happened (SPEC §6).

    Holds one descriptor, the directory the first one was made in; the
    rest are names below it, opened ``O_NOFOLLOW`` again to undo.  Only
    empty directories are removed, so nothing another writer put there
    meanwhile is lost.
    """

    def __init__(self) -> None:
        self.parent_fd = -1
        #: ``(name, absolute path, made by us)`` from the top down.
        self.chain: list[tuple[str, str, bool]] = []

    def note(self, fd: int, name: str, path: str, made: bool) -> None:
        """Step ``name`` (at ``path``) below ``fd``; ``made`` when we created it."""
        if self.parent_fd < 0:
            if not made:
                return
            self.parent_fd = os.dup(fd)
        self.chain.append((name, path, made))

    def paths(self) -> list[str]:
        """The directories created, from the top down."""
        return [path for _, path, made in self.chain if made]

    def undo(self) -> None:
        """Remove the directories created (deepest first, while empty), then close."""
        if self.parent_fd < 0:
            return
        fds = [self.parent_fd]
        try:
            for name, _, _ in self.chain[:-1]:
                fds.append(os.open(name, _DIR_FLAGS, dir_fd=fds[-1]))
        except OSError:
            pass
        try:
            for (name, _, made), fd in reversed(
                list(zip(self.chain, fds, strict=False))
            ):
                if made:
                    os.rmdir(name, dir_fd=fd)
        except OSError:
            pass  # not empty, or gone: what is left is not ours alone
        finally:
            for fd in fds[1:]:
                os.close(fd)
            self.close()

    def close(self) -> None:
        """Keep what was made; release the descriptor."""
        if self.parent_fd >= 0:
            os.close(self.parent_fd)
            self.parent_fd = -1
        self.chain = []


@attrs.define
class Location:
    """
    Where a path lands: an open directory and a name in it.

    The last component is not followed (``lstat`` semantics) unless the
    caller asked for it.  ``name`` is ``""`` when the path is the anchor
    directory itself (the base dir or an allowed root); then ``dir_fd`` is
    that directory.

    :ivar path: the absolute location, every link already resolved.
    :ivar via_link: a link was followed on the way (so a missing last
        component means a dangling link, which is never created through).
    :ivar deny_shared: the rule behind ``paths.hard_links: deny_writes`` when
        the location was resolved for a write or delete; None otherwise.
    """

    dir_fd: int
    name: str
    path: str
    via_link: bool = False
    deny_shared: str | None = None
    #: ``(uid, gid)`` that what is created here belongs to (SPEC §20), or
    #: None to leave it the daemon's.
    owner: tuple[int, int] | None = None
    #: the parent directories this resolution created (``make_parents``)
    made: MadeDirs | None = None
    #: the device of ``dir_fd``, where the resolution already knows it
    dir_dev: int | None = None
    _closed: bool = False
    _seen: os.stat_result | bool | None = attrs.field(default=False, init=False)

    def lstat(self) -> os.stat_result | None:
        """The entry's own status, or None when it does not exist."""
        try:
            if self.name == "":
                return os.stat(self.dir_fd)
            return os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def seen(self) -> os.stat_result | None:
        """
        The entry's status as its resolution saw it: :meth:`lstat` taken
        once, for the checks that follow one another with nothing done in
        between (a link to follow, a mount point, a missing entry, a file
        to open).

        Asking again could only see a change made between two of them,
        which could as well have come after the last: the open file's own
        ``fstat`` is what a read finally goes by.  Anything that changes
        the entry asks :meth:`lstat` afresh.
        """
        if self._seen is False:
            self._seen = self.lstat()
        return self._seen  # type: ignore[return-value]

    def refuse_shared(self, st: os.stat_result | None, path: Any) -> None:
        """
        Refuse replacing, removing or moving the entry (status ``st``, taken
        through this location's directory fd) when it is a regular file with
        other names and the policy says ``hard_links: deny_writes``.
        """
        if self.deny_shared is not None and is_shared(st):
            raise shared_refusal(path, self.deny_shared)

    def undo_made(self) -> None:
        """
        The request is refused after all: remove the parent directories
        this resolution created (call before :meth:`close`).
        """
        if self.made is not None:
            self.made.undo()
            self.made = None

    def made_paths(self) -> list[str]:
        """The parent directories this resolution created, from the top down."""
        return self.made.paths() if self.made is not None else []

    def close(self) -> None:
        """Release the directory fd (what was made stays)."""
        if not self._closed:
            self._closed = True
            os.close(self.dir_fd)
            if self.made is not None:
                self.made.close()

    def __enter__(self) -> Location:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def etag_of(st: os.stat_result) -> str:
    """A strong-enough validator: inode, size and nanosecond mtime."""
    return f'"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"'


class PathGuard:
    """Decides and resolves paths for one endpoint's merged rule."""

    def __init__(self, rule: EffectiveRule, request: Any = None) -> None:
        self.rule = rule
        self._request = request
        self._owner: tuple[int, int] | None = None
        self._owner_known = False

    @classmethod
    def for_request(cls, request: Any) -> PathGuard:
        """The guard of a request's endpoint (what it creates is the request user's)."""
        return cls(request.rule, request)

    def new_owner(self) -> tuple[int, int] | None:
        """
        ``(uid, gid)`` that files and directories created through this guard
        belong to: the user the request's commands would run as (its
        ``user``, else ``params.default_user``) when the daemon is root;
        None (the daemon's own) otherwise.

        :raises ApiError: 400 unknown user, 403 a user the policy refuses.
        """
        if not self._owner_known:
            self._owner_known = True
            if self._request is not None and os.geteuid() == 0:
                body = getattr(self._request, "body", None)
                wanted = body.get("user") if isinstance(body, dict) else None
                if wanted is None:
                    wanted = self._request.query.get("user")
                run_as = resolve_user(wanted, self.rule)
                if run_as is not None:
                    self._owner = (run_as.uid, run_as.gid)
        return self._owner

    @property
    def base_dir(self) -> str:
        """The boundary."""
        return self.rule.base_dir

    @property
    def default_dir(self) -> str:
        """
        Where a call that names no directory works (and relative paths are
        taken from): the base dir, or the first allowed directory when
        ``paths.allow`` leaves the base dir out.
        """
        return request_target(self.rule, ".")

    # -- public API used by every group ------------------------------------

    def check(self, path: Any, op: str = "read") -> str:
        """
        The absolute, resolved path for ``op`` on ``path``, or a refusal.

        Links are resolved (the result names no link) and the result passed
        the policy; a missing path is fine (the caller reports it).

        :raises ApiError: 400 for a non-string or NUL path; 403 with the
            guard's code otherwise.
        """
        try:
            with self.locate(path, op, follow=True, missing_ok=True) as loc:
                return loc.path
        except ApiError as e:
            if e.status != 404:
                raise
        # A missing parent: nothing on the way to follow, the lexical path stands.
        return request_target(self.rule, path)

    def cwd(self, path: Any = None) -> str:
        """A guarded working directory (default: :attr:`default_dir`)."""
        target = self.default_dir if path is None or path == "" else path
        anchor = self._pinned_anchor(target)
        if anchor is not None:
            return anchor
        try:
            with self.locate(target, "read", follow=True) as loc:
                st = loc.lstat()
                resolved = loc.path
        except ApiError as e:
            if e.status == 404:
                raise bad_request(f"cwd does not exist: {path}") from None
            raise
        if st is None:
            raise bad_request(f"cwd does not exist: {path}")
        if not stat.S_ISDIR(st.st_mode):
            raise bad_request(f"cwd is not a directory: {path}")
        return resolved

    def _pinned_anchor(self, target: Any) -> str | None:
        """
        ``target`` as a working directory when it names a pinned anchor (the
        base directory, usually) and is that very directory now, on the
        base's file system; None for anything else, which
        :meth:`locate` then decides in full.

        Most commands run in the base directory itself, where
        :meth:`locate` opens the anchor, ``fstat``\\ s it against the pinned
        identity, ``fstat``\\ s it again for its file system and for its
        type, and closes it: five system calls (and the walk's machinery)
        to learn what one ``stat`` of the same path, compared with the same
        pinned identity, proves at the same instant.  (The child changes
        into the path afterwards in either case.)
        """
        if not isinstance(target, str):
            return None
        decision = decide(self.rule, target)
        if not decision.allowed:
            return None
        if len(target) * 4 > NAME_MAX and name_too_long(target):
            return None  # refused by the walk, even where ".." cancels the name
        absolute_target = decision.target
        anchor = self._anchor_or_none(absolute_target)
        if anchor is None or absolute_target != anchor:
            return None
        anchors = self.rule.anchors
        pinned = anchors.pinned.get(anchor)
        if pinned is None:
            return None
        try:
            st = os.stat(anchor)
        except OSError:
            return None
        if (st.st_dev, st.st_ino) != pinned or not stat.S_ISDIR(st.st_mode):
            return None
        if st.st_dev != base_device(anchors, self.base_dir):
            return None  # another file system: fstatfs decides, by descriptor
        return anchor

    def _anchor_or_none(self, target: str) -> str | None:
        try:
            return self._anchor(target, target)
        except ApiError:
            return None

    def decide(self, path: str, op: str = "read") -> PathDecision:
        """The policy's lexical decision alone (used to filter listings)."""
        return decide(self.rule, path, op)

    def refuse_shared(self, st: os.stat_result | None, path: Any) -> None:
        """
        ``hard_links: deny_writes`` for callers that stat entries themselves
        (tree deletes and moves, archive checks); see :meth:`Location.refuse_shared`.
        """
        if self.rule.paths.hard_links == "deny_writes" and is_shared(st):
            raise shared_refusal(path, self._hard_links_rule)

    @property
    def _hard_links_rule(self) -> str:
        return self.rule.source("paths.hard_links") or "paths.hard_links"

    # -- resolution -----------------------------------------------------------

    def locate(
        self,
        path: Any,
        op: str = "read",
        *,
        follow: bool = False,
        missing_ok: bool = True,
        make_parents: bool = False,
    ) -> Location:
        """
        Resolve ``path`` to an open parent directory and a name.

        :param follow: follow a link in the last component (reads and
            writes of content); without it the link itself is the entry
            (stat, delete, move).
        :param missing_ok: a missing last component is fine; a missing
            parent directory is 404 unless ``make_parents``.
        :param make_parents: create missing parent directories (by fd,
            never through a link).
        :raises ApiError: 400/403 refusals, 404 ``FileNotFoundError``.
        """
        if not isinstance(path, str) or path == "":
            raise bad_request("'path' must be a non-empty string")
        if len(path) * 4 > NAME_MAX and name_too_long(path):
            raise invalid_path(f"File name too long: {path[:200]}")
        original = path
        first = decide(self.rule, path, op)
        if not first.allowed:
            raise refusal(first)
        owner = self.new_owner() if op == "write" else None
        target = first.target
        if len(target) * 4 >= PATH_MAX and _path_too_long(target):
            raise invalid_path(f"File name too long: {path[:200]}")
        link_targets: list[str] = []
        for _ in range(MAX_LINKS + 1):
            made = MadeDirs() if make_parents else None
            try:
                loc = self._locate_once(
                    target, op, follow, made, link_targets, original, owner
                )
            except _Restart as r:
                if made is not None:
                    made.undo()
                if self.rule.paths.symlinks == "deny":
                    raise refusal(
                        PathDecision(
                            original,
                            False,
                            Code.SYMLINK_DENIED,
                            self.rule.source("paths.symlinks"),
                        )
                    ) from None
                target = r.target
                link_targets.append(r.point)
                again = decide(self.rule, target, op)
                if not again.allowed:
                    raise refusal(
                        PathDecision(original, False, again.code, again.rule)
                    ) from None
                continue
            except BaseException:
                if made is not None:
                    made.undo()
                raise
            loc.via_link = bool(link_targets)
            loc.owner = owner
            if made is not None and made.chain:
                loc.made = made
            elif made is not None:
                made.close()
            # Before existence is looked at: a kernel file system refuses alike.
            try:
                _refuse_special(
                    loc, original, base_device(self.rule.anchors, self.base_dir)
                )
            except BaseException:
                if loc.made is not None:
                    loc.made.undo()
                raise
            if op != "read" and self.rule.paths.hard_links == "deny_writes":
                loc.deny_shared = self._hard_links_rule
            dangling_risk = loc.path in link_targets and op != "read"
            if not missing_ok or dangling_risk:
                if loc.seen() is None:
                    loc.undo_made()
                    loc.close()
                    if missing_ok:
                        # The name came from a link whose target is missing.
                        raise dangling_link(original)
                    raise file_not_found(original)
            return loc
        raise invalid_path(f"too many levels of symbolic links: {original}")

    def _anchor(self, target: str, original: str, above: str | None = None) -> str:
        """
        The directory a resolution starts from: the base, or an allowed root.

        :param above: only a root that holds this one (a missing allowed
            root is made from the root above it).
        """
        base = posixpath.normpath(self.base_dir)

        def fits(root: str) -> bool:
            return under(target, root) and (
                above is None or (root != above and under(above, root))
            )

        best = base if fits(base) else ""
        for entry in self.rule.paths.allow:
            root = allow_root(entry, base)
            if root is not None and fits(root) and len(root) > len(best):
                best = root
        if not best or best == "/" or in_system_root(best):
            raise refusal(
                PathDecision(original, False, Code.PATH_NOT_ALLOWED, "guard:base_dir")
            )
        return best

    def _locate_once(
        self,
        target: str,
        op: str,
        follow: bool,
        made: MadeDirs | None,
        link_targets: list[str],
        original: str,
        owner: tuple[int, int] | None = None,
    ) -> Location:
        anchor = self._anchor(target, original)
        try:
            anchor_fd, anchor_dev = open_anchor(self.rule.anchors, anchor, original)
        except ApiError as e:
            if e.status != 404 or made is None:
                raise
            # An allowed root that does not exist yet, on a write that makes
            # its parents: made like any other missing parent, from the root
            # above it (the base), each directory decided before it is made.
            try:
                anchor = self._anchor(target, original, above=anchor)
            except ApiError:
                raise e from None
            anchor_fd, anchor_dev = open_anchor(self.rule.anchors, anchor, original)
        rel = target[len(anchor) :].strip("/")
        if rel == "":
            return Location(anchor_fd, "", anchor, dir_dev=anchor_dev)
        parts = rel.split("/")
        try:
            dir_fd = self._open_dirs(
                anchor_fd, anchor, parts, made, link_targets, original, owner
            )
        except BaseException:
            os.close(anchor_fd)
            raise
        if dir_fd != anchor_fd:
            os.close(anchor_fd)
        name = parts[-1]
        loc = Location(
            dir_fd, name, target, dir_dev=anchor_dev if dir_fd == anchor_fd else None
        )
        if follow:
            st = loc.seen()
            if st is not None and stat.S_ISLNK(st.st_mode):
                try:
                    link = os.readlink(name, dir_fd=dir_fd)
                except OSError as e:
                    raise _raced(e, original) from None
                finally:
                    loc.close()
                point = absolute(posixpath.join(posixpath.dirname(target), link), "/")
                raise _Restart(point, point)
        return loc

    def _open_dirs(
        self,
        anchor_fd: int,
        anchor: str,
        parts: list[str],
        made: MadeDirs | None,
        link_targets: list[str],
        original: str,
        owner: tuple[int, int] | None = None,
    ) -> int:
        """
        The fd of the directory holding ``parts[-1]``, every component on
        the way a real directory (a link restarts the resolution).

        :param made: create missing components (``make_parents``), noting
            each in it so that the caller can take them back.
        """
        last = parts[-1]
        parts = parts[:-1]
        if not parts:
            return anchor_fd
        if USE_OPENAT2:
            try:
                return _openat2_dir(anchor_fd, "/".join(parts))
            except OSError:
                pass  # a link, a missing or odd component: the walk says which
        fd = os.dup(anchor_fd)
        dev = -1  # no device yet: the first component is always asked about
        here = anchor
        for i, part in enumerate(parts):
            here = posixpath.join(here, part)
            try:
                nxt = os.open(part, _ENTRY_FLAGS, dir_fd=fd)
                if made is not None:
                    made.note(fd, part, here, False)
            except FileNotFoundError:
                _refuse_special_dir(fd, original)
                if made is None:
                    os.close(fd)
                    raise file_not_found(original) from None
                if any(t == here or under(t, here) for t in link_targets):
                    os.close(fd)
                    raise dangling_link(original) from None
                if made.parent_fd < 0:
                    # The first directory to create: every one still to make
                    # is decided before any is (a denied one is never made).
                    try:
                        self._refuse_denied_dirs(here, parts[i + 1 :], original, last)
                    except BaseException:
                        os.close(fd)
                        raise
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    made.note(fd, part, here, True)
                    give(fd, part, owner)
                except FileExistsError:
                    made.note(fd, part, here, False)
                except OSError as e:
                    os.close(fd)
                    raise os_error(e, original) from None
                try:
                    nxt = os.open(part, _ENTRY_FLAGS, dir_fd=fd)
                except OSError as e:
                    os.close(fd)
                    raise os_error(e, original) from None
            except OSError as e:
                _refuse_special_dir(fd, original)
                os.close(fd)
                raise os_error(e, original) from None
            try:
                st = os.fstat(nxt)
                # A mount point: refused here, so what lies below (missing or
                # not) answers the same as the mount itself.
                if st.st_dev != dev and special_filesystem(nxt) is not None:
                    raise system_refusal(original)
                dev = st.st_dev
                if stat.S_ISLNK(st.st_mode):
                    try:
                        link = os.readlink(part, dir_fd=fd)
                    except OSError as e:
                        raise _raced(e, original) from None
                    rest = [*parts[i + 1 :], last]
                    point = absolute(posixpath.join(posixpath.dirname(here), link), "/")
                    raise _Restart(absolute(posixpath.join(point, *rest), "/"), point)
                if not stat.S_ISDIR(st.st_mode):
                    if special_filesystem(fd) is not None:
                        raise system_refusal(original)
                    raise invalid_path(
                        f"Not a directory: {original}", "NotADirectoryError"
                    )
            except BaseException:
                os.close(nxt)
                os.close(fd)
                raise
            os.close(fd)
            fd = nxt
        return fd

    def _refuse_denied_dirs(
        self, first: str, rest: list[str], original: str, last: str | None = None
    ) -> None:
        """
        Refuse the directories ``make_parents`` would create (``first``,
        then each of ``rest`` below it) if the policy denies writing one:
        ``paths.deny`` or ``paths.read_only`` (and the daemon's own files),
        with the code and rule the final path would get.  ``paths.allow``
        is left to the final path: an allow list of file globs
        (``**/*.py``) names no directory.

        :param last: the name the directories are made for: when writing
            it is allowed, so is every directory above it (an entry of
            ``deny`` or ``read_only`` covers what is below what it names),
            and none is decided on its own: deciding each of a deep chain
            walked the whole path again for every level.
        """
        if last is not None:
            final = posixpath.join(first, *rest, last)
            if decide(self.rule, final, "write").allowed:
                return
        here = first
        for i in range(len(rest) + 1):
            if i:
                here = posixpath.join(here, rest[i - 1])
            d = decide(self.rule, here, "write")
            if not d.allowed and d.code in (Code.PATH_DENIED, Code.READ_ONLY):
                raise refusal(PathDecision(original, False, d.code, d.rule))

    # -- opening content ---------------------------------------------------

    def open_file(self, path: Any, op: str = "read") -> OpenFile:
        """
        Open an existing regular file for reading; the caller closes it.

        FIFOs, devices and sockets are refused without blocking (``O_NONBLOCK``
        then ``fstat``); a directory is 400; missing is 404.
        """
        with self.locate(path, op, follow=True, missing_ok=False) as loc:
            if loc.name == "":
                raise is_a_directory(path)
            st = loc.seen()
            if st is None:
                raise file_not_found(path)
            check_regular(st, path)
            try:
                fd = os.open(
                    loc.name,
                    os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                    dir_fd=loc.dir_fd,
                )
            except OSError as e:
                raise os_error(e, path) from None
            resolved = loc.path
        try:
            st = os.fstat(fd)
            if special_unless_base(
                fd, st.st_dev, base_device(self.rule.anchors, self.base_dir)
            ):
                raise system_refusal(path)  # mounted since the check
            check_regular(st, path)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return OpenFile(fd, st, resolved)

    @contextlib.contextmanager
    def open_dir(self, path: Any, op: str = "read") -> Iterator[tuple[int, str]]:
        """Open an existing directory (following links inside): ``(fd, resolved path)``."""
        with self.locate(path, op, follow=True, missing_ok=False) as loc:
            if loc.name == "":
                fd = os.open(
                    ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=loc.dir_fd
                )
            else:
                try:
                    fd = os.open(
                        loc.name,
                        os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                        dir_fd=loc.dir_fd,
                    )
                except NotADirectoryError:
                    raise not_a_directory(path) from None
                except OSError as e:
                    raise os_error(e, path) from None
            resolved = loc.path
        try:
            device = os.fstat(fd).st_dev
            if special_unless_base(
                fd, device, base_device(self.rule.anchors, self.base_dir)
            ):
                raise system_refusal(path)  # mounted since the check
            yield fd, resolved
        finally:
            os.close(fd)


@attrs.define
class OpenFile:
    """A regular file opened through the guard; ``close()`` when done."""

    fd: int
    stat: os.stat_result
    path: str

    @property
    def etag(self) -> str:
        """The file's validator at open time."""
        return etag_of(self.stat)

    def close(self) -> None:
        """Release the fd (idempotent)."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> OpenFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_regular(st: os.stat_result, path: Any) -> None:
    """Refuse anything but a regular file for content operations."""
    if stat.S_ISDIR(st.st_mode):
        raise is_a_directory(path)
    if not stat.S_ISREG(st.st_mode):
        raise bad_request(f"Not a regular file: {path}")


def refuse_device(st: os.stat_result | None, path: Any) -> None:
    """
    403 for a character or block device: removing or replacing one would
    change the device directory it may belong to (a /dev mounted inside the
    base), whatever the file system reports itself as.
    """
    if st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise forbidden(
            f"refusing to change a device file: {path}",
            Code.PATH_NOT_ALLOWED,
            rule="guard:device-files",
        )


#: Opening a pinned anchor: links followed, the identity checked after.
_ANCHOR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


def allow_root(entry: str, base: str) -> str | None:
    """
    The directory a ``paths.allow`` entry starts from (its literal part
    before any glob character), or None when it has none or is ``/``.
    """
    literal = entry.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]
    if literal != entry:
        literal = literal.rsplit("/", 1)[0] if "/" in literal else ""
    if not literal:
        return None
    root = absolute(literal, base)
    return None if root == "/" else root


def allowed_roots(rules: Iterable[EffectiveRule]) -> set[str]:
    """Every allowed root outside the base named by ``rules``."""
    roots: set[str] = set()
    for rule in rules:
        base = posixpath.normpath(rule.base_dir)
        for entry in rule.paths.allow:
            root = allow_root(entry, base)
            if root is not None and not under(root, base):
                roots.add(root)
    return roots


def pin_anchors(anchors: Anchors, base_dir: str, roots: Iterable[str] = ()) -> None:
    """
    Remember which directories the base dir and the allowed ``roots`` are
    now (the daemon calls this at start and on reload), so that one renamed
    away, or replaced by a link or another directory, is refused rather than
    served (catalogue C13).  The base is opened with no link on its path;
    a root as it resolves now.  One that cannot be opened now is not pinned
    (and is then only reached through a path with no link on it).
    """
    base = posixpath.normpath(base_dir)
    _pin(anchors, base, lambda: open_real_dir(base))
    for root in roots:
        _pin(anchors, root, functools.partial(os.open, root, _ANCHOR_FLAGS))


def _pin(anchors: Anchors, path: str, opener: Callable[[], int]) -> None:
    try:
        fd = opener()
    except OSError:
        anchors.pinned.pop(path, None)
        return
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    anchors.pinned[path] = (st.st_dev, st.st_ino)


def open_real_dir(path: str) -> int:
    """
    An ``O_PATH`` fd of the directory at absolute ``path``, no link followed
    on any component (the base dir is a real path when the policy loads).
    """
    fd = os.open("/", _DIR_FLAGS)
    rel = path.strip("/")
    if not rel:
        return fd
    if USE_OPENAT2:
        try:
            return _openat2_dir(fd, rel)
        finally:
            os.close(fd)
    for part in rel.split("/"):
        try:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def open_anchor(anchors: Anchors, anchor: str, original: str) -> tuple[int, int | None]:
    """
    Open the directory a resolution starts from (the base, or an allowed
    root), refusing one that is no longer the directory the daemon pinned:
    a base swapped for a link to / must not turn ``etc/passwd`` into
    ``/etc/passwd`` (catalogue C13).

    The pinned identity is the whole check: a component swapped anywhere on
    the way lands on another directory, and a link that still leads to the
    same one is harmless.  That is one open and one ``fstat``, where the
    link-free walk from / that an unpinned anchor gets costs four calls.

    :return: the descriptor, and its device when it was checked (pinned).
    """
    pinned = anchors.pinned.get(anchor)
    try:
        if pinned is None:
            fd = open_real_dir(anchor)
        else:
            fd = os.open(anchor, _ANCHOR_FLAGS)
    except FileNotFoundError:
        raise file_not_found(original) from None
    except OSError as e:
        if e.errno in _OUT_OF_RESOURCES:
            # No descriptor left: the path may well be allowed.
            raise os_error(e, original) from None
        raise refusal(
            PathDecision(original, False, Code.PATH_NOT_ALLOWED, "guard:base_dir")
        ) from None
    if pinned is not None:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != pinned:
            os.close(fd)
            raise refusal(
                PathDecision(original, False, Code.PATH_NOT_ALLOWED, "guard:base_dir")
            )
        return fd, st.st_dev
    return fd, None


def base_device(anchors: Anchors, base_dir: str) -> int | None:
    """
    The device of the base directory (remembered), or None when it cannot
    be read.

    Everything on that device is on the base's own file system, which is
    not a kernel one, so only descriptors on another device need the
    ``fstatfs``.  A base replaced later only makes more descriptors differ,
    never fewer: the check can only run more often than needed.
    """
    device = anchors.devices.get(base_dir)
    if device is None:
        try:
            device = anchors.devices[base_dir] = os.stat(base_dir).st_dev
        except OSError:
            return None
    return device


def special_unless_base(fd: int, device: int, base_dev: int | None) -> str | None:
    """:func:`special_filesystem` for ``fd`` (on ``device``), skipped on the base's device."""
    if base_dev is not None and device == base_dev:
        return None
    return special_filesystem(fd)


def _refuse_special(loc: Location, original: str, base_dev: int | None) -> None:
    """
    Close ``loc`` and refuse it when its directory, or the entry itself (a
    mount point), is on a kernel file system: a bind mount of /proc inside
    the base is /proc.
    """
    try:
        dev = loc.dir_dev
        if dev is None:
            dev = os.fstat(loc.dir_fd).st_dev
        found = special_unless_base(loc.dir_fd, dev, base_dev)
        if found is None and loc.name:
            try:
                st = loc.seen()
            except OSError:
                st = None  # unreachable: its directory decided
            if st is not None:  # (missing: its directory decided)
                found = mounted_special(loc.dir_fd, loc.name, st, dev)
    except BaseException:
        loc.close()
        raise
    if found is not None:
        loc.close()
        raise system_refusal(original)


def _refuse_special_dir(fd: int, original: str) -> None:
    """
    On a failed step of the walk: close ``fd`` and refuse when it is on a
    kernel file system, so a missing name there answers like an existing one.
    """
    if special_filesystem(fd) is not None:
        os.close(fd)
        raise system_refusal(original)


#: What opening a path answers while the daemon is out of descriptors or
#: memory: never a refusal of the path (see :func:`os_error`).  Not
#: ``EAGAIN``, which from an open means a lease or a FIFO, not a want of
#: resources.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def _raced(e: OSError, path: Any) -> ApiError:
    """A link that changed between fstat and readlink: refused, never guessed."""
    if e.errno == errno.ENOENT or e.errno in _OUT_OF_RESOURCES:
        return os_error(e, path)
    return refusal(
        PathDecision(str(path), False, Code.PATH_NOT_ALLOWED, "guard:resolve")
    )


def os_error(e: OSError, path: Any) -> ApiError:
    """An OSError met while resolving or operating, as a client sees it."""
    if e.errno == errno.ENOENT:
        return file_not_found(path)
    if e.errno in (errno.ELOOP, errno.EXDEV):
        # A link swapped in under us: refuse as an outside path would be.
        return refusal(
            PathDecision(str(path), False, Code.PATH_NOT_ALLOWED, "guard:resolve")
        )
    if e.errno == errno.ENOTDIR:
        return not_a_directory(path)
    if e.errno == errno.EISDIR:
        return is_a_directory(path)
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return permission_denied(path)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return insufficient_storage()
    if e.errno in _OUT_OF_RESOURCES:
        return out_of_resources(e, f"cannot open {path} now")
    if e.errno == errno.ENAMETOOLONG:
        return invalid_path(f"File name too long: {path}")
    return internal(f"{e.strerror or type(e).__name__}: {path}", "OSError")
