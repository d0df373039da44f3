# -*- test-case-name: tests.routes.test_files -*-
"""
``files_watch``: inotify events for a directory, served as a resumable SSE
stream (SPEC §7.3, §9).

One :class:`Watch` per (directory, recursive) is shared by every client and
outlives them by ``WATCH_IDLE_SECONDS``, so ``Last-Event-ID`` can resume
across reconnects.  Raw inotify events are debounced (a burst of writes to
one file is one ``modified``), paired into ``moved`` where a
``MOVED_FROM`` is followed by its ``MOVED_TO``, kept in an
:class:`~sandboxd.eventlog.EventLog`, and filtered per client through that
client's path guard (events for paths it may not see are dropped; a path
reached through a link that leaves the boundary resolves outside and is
dropped too).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import posixpath
import stat
import struct
from collections.abc import Callable
from types import ModuleType
from typing import Any

from twisted.application.service import Service
from twisted.logger import Logger
from twisted.python.filepath import FilePath

from sandboxd.access.guard import PathGuard
from sandboxd.errors import (
    RESOURCE_ERRNOS,
    RESOURCE_RETRY_SECONDS,
    ApiError,
    Code,
    limit_exceeded,
    unavailable,
)
from sandboxd.eventlog import EventLog
from sandboxd.files.atomic import TEMPORARY_NAME, UNNAMED
from sandboxd.files.walk import walk
from sandboxd.libc import libc
from sandboxd.policy.defaults import (
    MAX_WATCH_DIRS,
    MAX_WATCHES,
    WALK_DEPTH,
    WATCH_DEBOUNCE_SECONDS,
    WATCH_IDLE_SECONDS,
)

log = Logger(namespace="sandboxd.files.watch")

#: The event of an entry's attributes changed (``IN_ATTRIB``: permissions,
#: owner, times, links); kept in the log for the E2B door's ``CHMOD``, left
#: out of ``/files/watch``, whose events are created, modified, deleted and
#: moved.
ATTRIBUTES = "attributes"


def _inotify() -> ModuleType:
    """
    Twisted's inotify, imported on the first watch and not at start: its
    import looks up the C library with ``ctypes.util.find_library``, which
    runs ``ldconfig`` in a child process.
    """
    from twisted.internet import inotify

    return inotify


def _mask() -> int:
    inotify = _inotify()
    mask: int = (
        inotify.IN_CREATE
        | inotify.IN_MODIFY
        | inotify.IN_CLOSE_WRITE
        | inotify.IN_DELETE
        | inotify.IN_MOVED_FROM
        | inotify.IN_MOVED_TO
        | inotify.IN_DELETE_SELF
        | inotify.IN_MOVE_SELF
        | inotify.IN_ATTRIB
    )
    return mask


#: The event that says the kernel dropped changes it had no room to queue
#: (``IN_Q_OVERFLOW``): which ones, nobody can tell, so a client lists the
#: watched directory again.
OVERFLOW = "overflow"

#: An inotify event's fixed part: wd, mask, cookie, length of the name.
_EVENT_HEAD = struct.Struct("=iIII")


def queue_overflowed(data: bytes) -> bool:
    """Whether the kernel's overflow event is among these raw inotify events."""
    overflow = _inotify().IN_Q_OVERFLOW
    offset = 0
    while offset + _EVENT_HEAD.size <= len(data):
        wd, mask, _, size = _EVENT_HEAD.unpack_from(data, offset)
        if wd == -1 and mask & overflow:
            return True
        offset += _EVENT_HEAD.size + size
    return False


#: The kernel's inotify limits, per user, as ``sysctl`` names them.
_LIMITS = {
    "instances": "/proc/sys/fs/inotify/max_user_instances",
    "watches": "/proc/sys/fs/inotify/max_user_watches",
}


def _limit(which: str) -> str:
    """``fs.inotify.max_user_WHICH = N`` (its value when it can be read)."""
    path = _LIMITS[which]
    name = path[len("/proc/sys/") :].replace("/", ".")
    try:
        with open(path) as f:
            return f"{name} = {f.read().strip()}"
    except OSError:
        return name


@functools.cache
def _calls() -> Any:
    """
    Twisted's three inotify calls (``twisted.python._inotify``), raising
    its ``INotifyError`` with the kernel's errno: Twisted's own say only
    that a call failed, and a watch refused for the user's limit of
    inotify watches (held by every dev server and editor of the sandbox)
    read as "Failed to add watch ... (-1)".
    """
    inotify = _inotify()
    lib = libc()

    class Failed(inotify.INotifyError):  # type: ignore[misc,name-defined]
        def __init__(self, errno_: int, what: str) -> None:
            super().__init__(f"{what}: {os.strerror(errno_)}")
            self.errno = errno_
            #: ``inotify_init``, or the path a watch was refused for.
            self.what = what

    class Calls:
        @staticmethod
        def init() -> int:
            fd = int(lib.inotify_init())
            if fd < 0:
                raise Failed(ctypes.get_errno(), "inotify_init")
            return fd

        @staticmethod
        def add(fd: int, path: FilePath[Any], mask: int) -> int:
            name = path.asBytesMode().path
            wd = int(lib.inotify_add_watch(fd, name, ctypes.c_uint32(mask)))
            if wd < 0:
                raise Failed(ctypes.get_errno(), os.fsdecode(name))
            return wd

        @staticmethod
        def remove(fd: int, wd: int) -> None:
            lib.inotify_rm_watch(fd, wd)

    return Calls


@functools.cache
def _notifier_class() -> type[Any]:
    inotify = _inotify()

    class _Notifier(inotify.INotify):  # type: ignore[misc,name-defined]
        """
        Twisted's INotify closes itself when *any* watched directory is
        deleted (``IN_DELETE_SELF``); a recursive watch must survive its
        subdirectories.
        """

        _inotify = _calls()
        closing = False
        #: Whether a directory created in the tree could not be watched
        #: for want of inotify watches (logged once).
        blind = False
        #: Called after a read that held the kernel's overflow event, which
        #: Twisted drops without a word (it names no watch).
        on_overflow: Callable[[], None] | None = None

        def loseConnection(self, *args: Any) -> None:
            if self.closing:
                super().loseConnection(*args)

        def close(self) -> None:
            self.closing = True
            self.loseConnection()

        # Twisted's table of watched paths is its own (``_watchpoints``,
        # ``_watchpaths``), and it has no call for a rename: the kernel's
        # watches follow a renamed directory, while Twisted goes on naming
        # what happens in it by the old path.

        def _below(self, top: bytes) -> list[tuple[int, Any]]:
            return [
                (wd, point)
                for wd, point in self._watchpoints.items()
                if point.path.path == top or point.path.path.startswith(top + b"/")
            ]

        def renamed(self, old: bytes, new: bytes) -> None:
            """The watched directory ``old`` (and those below it) is now ``new``."""
            for wd, point in self._below(old):
                self._watchpaths.pop(point.path, None)
                point.path = FilePath(new + point.path.path[len(old) :])
                self._watchpaths[point.path] = wd

        def _addChildren(self, iwp: Any) -> None:
            # Twisted's catch-up on a new directory's subdirectories, a turn
            # later: one gone or renamed by then is not to be watched.
            try:
                super()._addChildren(iwp)
            except inotify.INotifyError:
                pass

        def _doRead(self, in_: bytes) -> None:
            overflowed = queue_overflowed(self._buffer + in_)
            self._read_events(in_)
            if overflowed and self.on_overflow is not None:
                self.on_overflow()

        def _read_events(self, in_: bytes) -> None:
            # Twisted adds a watch to each directory created in a watched one
            # as it reads the event.  One already removed or renamed (a mkdir
            # followed at once by a mv or rmdir) makes that fail, and the
            # error would end the whole watch, losing the events read with
            # it; the failed event is consumed by then, so go on with the rest.
            while True:
                try:
                    super()._doRead(in_)
                except inotify.INotifyError as e:
                    in_ = b""
                    if getattr(e, "errno", None) == errno.ENOSPC and not self.blind:
                        # Said once: later directories go unwatched.
                        self.blind = True
                        log.warn(
                            "sandboxd: a recursive watch cannot watch the new "
                            "directory {what} ({limit} reached); changes below "
                            "it are not reported",
                            what=getattr(e, "what", "?"),
                            limit=_limit("watches"),
                        )
                else:
                    return

        def left(self, old: bytes) -> None:
            """``old`` moved out of the tree: it and those below it are not watched."""
            for wd, _ in self._below(old):
                self._rmWatch(wd)

        def watched(self) -> int:
            """How many directories are watched."""
            return len(self._watchpoints)

    return _Notifier


def first_seq(now: float) -> int:
    """
    The seq before a new watch's first event: its start in milliseconds,
    times 1000.  One URL is served by a new watch after a restart or an
    idle close, and a client resuming with an id of the old one must learn
    it missed events (a ``gap``), not have the new watch's first ones
    taken for those it saw.  Numbered from its start, a watch's ids lie
    past every id of one started before it, unless that one made over a
    thousand events per millisecond between the two starts; and they stay
    below 2**53, exact in every JSON reader.
    """
    return int(now * 1000) * 1000


class Watch:
    """One inotify watch and its event log."""

    def __init__(
        self, service: WatchService, root: str, recursive: bool, retention: int
    ) -> None:
        self.service = service
        self.root = root
        self.recursive = recursive
        #: The identity that started it (its share is counted against it).
        self.owner = ""
        self.log = EventLog(retention, start=first_seq(service.reactor.seconds()))
        #: Whether it ended because its directory went away (its streams
        #: end for good) rather than with the daemon (they are cut).
        self.deleted = False
        self.clients = 0
        #: Whether a client has held it yet (its first stream has begun).
        self.held = False
        #: Since when no client has held it (the clock's seconds).
        self.unheld_since = service.reactor.seconds()
        self.pending: list[dict[str, Any]] = []
        self._flush_call: Any = None
        self._idle_call: Any = None
        self.notifier = _notifier_class()(service.reactor)
        self.notifier.on_overflow = self._overflowed

    def start(self, dirs: list[str]) -> None:
        """Watch ``root`` (and ``dirs`` below it, for a recursive watch)."""
        inotify, mask = _inotify(), _mask()
        self.notifier.watch(
            FilePath(self.root),
            mask=mask,
            autoAdd=self.recursive,
            callbacks=[self._raw],
        )
        for d in dirs:
            try:
                self.notifier.watch(
                    FilePath(d), mask=mask, autoAdd=True, callbacks=[self._raw]
                )
            except inotify.INotifyError as e:
                if getattr(e, "errno", None) == errno.ENOSPC:
                    # Out of the user's inotify watches: a watch that left
                    # part of the tree unwatched would miss its changes
                    # without a word.
                    raise
                continue  # gone since the walk, or not readable
        self.notifier.startReading()
        # Closed after the idle period unless a client joins (one whose
        # request was a HEAD, or that left before its stream began, never does).
        self._idle_call = self.service.reactor.callLater(WATCH_IDLE_SECONDS, self.close)

    def _raw(self, _: Any, filepath: FilePath[Any], mask: int) -> None:
        inotify = _inotify()
        path = os.fsdecode(filepath.path)
        kind = "directory" if mask & inotify.IN_ISDIR else "file"
        if self._inside_temporary(path):
            return
        name = posixpath.basename(path)
        if UNNAMED.ours(name):
            return  # an upload's file before it has its name
        temporary = TEMPORARY_NAME.match(name)
        if temporary is not None:
            self._temporary(path, kind, mask, temporary.group(1) is not None)
            return
        if mask & (inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF):
            if path == self.root:
                self._add({"event": "deleted", "path": path, "type": "directory"})
                self._flush()
                self.close(deleted=True)
            return
        if mask & inotify.IN_CREATE:
            self._add({"event": "created", "path": path, "type": kind})
        elif mask & (inotify.IN_MODIFY | inotify.IN_CLOSE_WRITE):
            self._add({"event": "modified", "path": path, "type": kind})
        elif mask & inotify.IN_DELETE:
            self._add({"event": "deleted", "path": path, "type": kind})
        elif mask & inotify.IN_MOVED_FROM:
            self._add({"event": "moved", "path": path, "type": kind, "_open": True})
        elif mask & inotify.IN_MOVED_TO:
            last = self.pending[-1] if self.pending else None
            if last is not None and last.get("_open"):
                last.pop("_open")
                old = os.fsencode(last["path"])
                if last["event"] == "_upload":
                    last["event"] = "created" if last.pop("_new") else "modified"
                    last["path"] = path
                else:
                    last["dest"] = path
                if kind == "directory" and self.recursive:
                    self.notifier.renamed(old, filepath.path)
                    # Directories made in it just before (a copy renamed
                    # into place) may not be watched yet, nor the directory
                    # itself when it was renamed before its watch existed.
                    self._watch_tree(filepath.path)
            else:
                self._add({"event": "created", "path": path, "type": kind})
                if kind == "directory" and self.recursive:
                    self._watch_tree(filepath.path)
        elif mask & inotify.IN_ATTRIB:
            # Permissions, owner, times or links changed: shown by the E2B
            # door only (envd's CHMOD), not in the HTTP API's four events.
            self._add({"event": ATTRIBUTES, "path": path, "type": kind})

    def _overflowed(self) -> None:
        """
        The kernel dropped events for want of room in its queue (a burst of
        changes while the daemon was busy): the clients are told to list the
        directory again, and a recursive watch looks for directories made
        meanwhile, whose creation it never heard and which nobody watches.
        """
        self._add({"event": OVERFLOW, "path": self.root, "type": "directory"})
        if self.recursive:
            self._watch_tree(os.fsencode(self.root))

    def _inside_temporary(self, path: str) -> bool:
        """
        Whether ``path`` is below a temporary name of the daemon's (a tree
        being copied from another file system, or a moved tree's source
        being removed): nothing there is shown.
        """
        below = path[len(self.root) :].strip("/").split("/")[:-1]
        return any(TEMPORARY_NAME.match(name) for name in below)

    def _temporary(self, path: str, kind: str, mask: int, new: bool) -> None:
        """
        The daemon's own work in progress (an upload's file, a tree copied
        from another file system, a moved tree's source set aside), never
        shown.  Renamed into place, a temporary name becomes one created (or
        modified) of the real name; a name renamed to one is deleted, since
        the daemon removes what it sets aside; anything else done to it is
        nobody's business.
        """
        inotify = _inotify()
        if mask & inotify.IN_MOVED_FROM:
            self._add(
                {
                    "event": "_upload",
                    "path": path,
                    "type": kind,
                    "_open": True,
                    "_new": new,
                }
            )
        elif mask & inotify.IN_MOVED_TO:
            last = self.pending[-1] if self.pending else None
            if last is not None and last.get("_open") and last["event"] == "moved":
                del last["_open"]
                last["event"] = "deleted"
                if kind == "directory":
                    self.notifier.left(os.fsencode(last["path"]))

    def _watch_tree(self, top: bytes) -> None:
        """
        Watch a directory moved in from outside the tree, and those below
        it (real directories only, one level a turn, within
        :data:`MAX_WATCH_DIRS`): Twisted adds a watch only for a directory
        created in place.
        """
        if self.log.closed or self.notifier.watched() >= MAX_WATCH_DIRS:
            return
        inotify = _inotify()
        try:
            self.notifier.watch(
                FilePath(top), mask=_mask(), autoAdd=True, callbacks=[self._raw]
            )
            with os.scandir(top) as entries:
                below = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        except (OSError, inotify.INotifyError):
            return  # gone again, or not a directory any more
        for path in below:
            self.service.reactor.callLater(0, self._watch_tree, path)

    def _add(self, item: dict[str, Any]) -> None:
        """
        Debounce: a modify after a create or modify of the same path is
        dropped, and so is an attribute change after another (a recursive
        watch hears a directory's from its parent and from itself).
        """
        if item["event"] == OVERFLOW and self.pending:
            if self.pending[-1]["event"] == OVERFLOW:
                return  # said once for a run of full reads
        if item["event"] == ATTRIBUTES:
            for old in reversed(self.pending):
                if old["path"] == item["path"]:
                    if old["event"] == ATTRIBUTES:
                        return
                    break
        if item["event"] == "modified":
            for old in reversed(self.pending):
                if old["path"] == item["path"]:
                    if old["event"] in ("created", "modified"):
                        return
                    break
        self.pending.append(item)
        if self._flush_call is None:
            self._flush_call = self.service.reactor.callLater(
                WATCH_DEBOUNCE_SECONDS, self._flush
            )

    def _flush(self) -> None:
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        pending, self.pending = self.pending, []
        for item in pending:
            if item.pop("_open", None) and item["type"] == "directory":
                # Moved out of the tree (no MOVED_TO came): what happens to
                # it now is not under the watched directory.
                self.notifier.left(os.fsencode(item["path"]))
            if item["event"] == "_upload":
                continue  # a temporary file moved out of sight: not shown
            if not self.log.closed:
                self.log.append(item["event"], item)

    def now(self) -> int:
        """
        The id a client without a resume point starts after: every change
        heard before it came is behind it, the ones still held back for
        the debounce included (logged now, or a change made just before a
        watch opened would be told to it as new).  A move whose other half
        may still come stays held: it is paired as it completes.
        """
        if self.pending:
            last = self.pending[-1]
            held = self.pending.pop() if last.get("_open") else None
            self._flush()
            if held is not None:
                self.pending.append(held)
                self._flush_call = self.service.reactor.callLater(
                    WATCH_DEBOUNCE_SECONDS, self._flush
                )
        return self.log.last_seq

    def acquire(self) -> None:
        """A client joined."""
        self.clients += 1
        self.held = True
        if self._idle_call is not None and self._idle_call.active():
            self._idle_call.cancel()
        self._idle_call = None

    def release(self) -> None:
        """A client left; close after an idle period so resumes still work."""
        self.clients -= 1
        if self.clients <= 0 and not self.log.closed:
            self.unheld_since = self.service.reactor.seconds()
            self._idle_call = self.service.reactor.callLater(
                WATCH_IDLE_SECONDS, self.close
            )

    def close(self, deleted: bool = False) -> None:
        """
        Stop watching; streams still attached end.

        :param deleted: the watched directory went away (else the daemon
            is stopping, or no client is left).
        """
        self.deleted = self.deleted or deleted
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        if self._idle_call is not None and self._idle_call.active():
            self._idle_call.cancel()
        self._idle_call = None
        self.notifier.close()
        self.log.close()
        self.service.forget(self)


def _refusal(root: str, error: Exception) -> ApiError:
    """
    503 for a watch the kernel refused: the user's inotify limits (which
    the sandbox's other watchers share) or the descriptors said by name,
    to retry once some are let go; anything else said as the kernel said it.
    """
    number = getattr(error, "errno", None)
    if number == errno.ENOSPC:
        why = f"the limit of inotify watches is reached ({_limit('watches')})"
    elif number == errno.EMFILE and getattr(error, "what", None) == "inotify_init":
        why = f"the limit of inotify instances is reached ({_limit('instances')})"
    elif number in RESOURCE_ERRNOS:
        why = os.strerror(number) if number is not None else str(error)
    else:
        return unavailable(f"cannot watch {root}: {error}", "OSError")
    return unavailable(
        f"cannot watch {root} now: {why}; other watchers of this user (dev "
        "servers, editors) hold them too",
        "ResourceError",
        retry_after=RESOURCE_RETRY_SECONDS,
    )


class WatchService(Service):
    """The shared watches, by (directory, recursive)."""

    name = "files_watch"

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self.watches: dict[tuple[str, bool], Watch] = {}

    def get(
        self,
        root: str,
        recursive: bool,
        retention: int,
        dirs: list[str],
        owner: str = "",
        mine: int = MAX_WATCHES,
    ) -> Watch:
        """
        The watch for ``root``, started if new: by ``owner``, who may have
        started at most ``mine`` of the open ones (its share of
        :data:`MAX_WATCHES`); following a watch someone started is free.
        """
        key = (root, recursive)
        watch = self.watches.get(key)
        if watch is not None and not watch.log.closed:
            return watch
        if len(self.watches) >= MAX_WATCHES and not self._reclaim(None):
            raise limit_exceeded(
                429,
                f"too many directories are watched (limit {MAX_WATCHES}), each "
                "by a client still connected; retry once one has ended",
                Code.CONCURRENCY_LIMITED,
                headers={"Retry-After": str(RESOURCE_RETRY_SECONDS)},
                limit=MAX_WATCHES,
                retry_after=RESOURCE_RETRY_SECONDS,
            )
        started = sum(1 for w in self.watches.values() if w.owner == owner)
        if started >= mine and not self._reclaim(owner):
            raise limit_exceeded(
                429,
                f"this identity has {mine} watches open, its share of "
                f"{MAX_WATCHES}; end one first",
                Code.CONCURRENCY_LIMITED,
                headers={"Retry-After": str(RESOURCE_RETRY_SECONDS)},
                limit=mine,
                retry_after=RESOURCE_RETRY_SECONDS,
            )
        try:
            watch = Watch(self, root, recursive, retention)
        except _inotify().INotifyError as e:
            raise _refusal(root, e) from None
        watch.owner = owner
        try:
            watch.start(dirs)
        except _inotify().INotifyError as e:
            watch.notifier.close()
            raise _refusal(root, e) from None
        self.watches[key] = watch
        return watch

    def _reclaim(self, owner: str | None) -> bool:
        """
        Close the watch no client holds that has waited longest (of
        ``owner``'s, or of anyone's for None), to make room: it is only
        kept for a resume, and a client that comes back to it gets a
        ``gap``.  One just started whose stream has not begun yet is not
        taken from under its client.  Whether one was closed.
        """
        now = self.reactor.seconds()
        unheld = [
            w
            for w in self.watches.values()
            if w.clients <= 0
            and (owner is None or w.owner == owner)
            and (w.held or now - w.unheld_since >= RESOURCE_RETRY_SECONDS)
        ]
        if not unheld:
            return False
        min(unheld, key=lambda w: w.unheld_since).close()
        return True

    def forget(self, watch: Watch) -> None:
        """Drop a closed watch."""
        key = (watch.root, watch.recursive)
        if self.watches.get(key) is watch:
            del self.watches[key]

    def stopService(self) -> Any:
        """Close every watch (streams end)."""
        for watch in list(self.watches.values()):
            watch.close()
        return super().stopService()


def seed_changes(data: dict[str, Any]) -> list[dict[str, Any]]:
    """
    One event of the log as the seed's ``change`` events, ``{"type",
    "path", "is_dir"}`` with ``type`` created, modified or deleted: a move
    is the deletion of its source and the creation of its destination,
    which is what the seed's polling sees of it.
    """
    is_dir = data.get("type") == "directory"
    if data["event"] != "moved":
        return [{"type": data["event"], "path": data["path"], "is_dir": is_dir}]
    changes = [{"type": "deleted", "path": data["path"], "is_dir": is_dir}]
    if "dest" in data:
        changes.append({"type": "created", "path": data["dest"], "is_dir": is_dir})
    return changes


def seen_as(guard: PathGuard, name: str) -> str:
    """
    A changed path as ``guard`` resolves it for a client, or its lexical
    path where a parent is gone (a file deleted with its directory, as
    ``rm -rf`` does, is reported once the directory has gone too): a
    directory that is not there holds no link to follow, and the policy's
    lexical decision is taken before the lookup.

    :raises ApiError: the client may not see ``name``.
    """
    try:
        with guard.locate(name, "read", follow=False) as loc:
            return loc.path
    except ApiError as e:
        if e.status != 404:
            raise
        return name


def watch_dirs(guard: PathGuard, path: str) -> tuple[str, list[str]]:
    """The resolved root and the real directories below it (no link followed)."""
    dirs: list[str] = []
    with guard.open_dir(path) as (fd, root):
        for parent, name, st in walk(fd, root, WALK_DEPTH):
            if stat.S_ISDIR(st.st_mode):
                full = posixpath.join(parent, name)
                if guard.decide(full).allowed:
                    dirs.append(full)
                    if len(dirs) >= MAX_WATCH_DIRS:
                        break
    return root, dirs
