# -*- test-case-name: tests.e2b.test_sdk -*-
"""
envd's ``filesystem.Filesystem`` service over sandboxd's file operations.

Every path goes through the :class:`~sandboxd.access.guard.PathGuard` of the
endpoint the procedure is governed as (``files_stat``, ``files_list``,
``files_mkdir``, ``files_move``, ``files_delete``, ``files_watch``), with
the same walk, move, delete and watch code as those endpoints; what differs
is only the answer's shape (envd's ``EntryInfo``) and envd's codes where it
has its own (``MakeDir`` of an existing directory is ``already_exists``,
``Stat`` of a missing path is ``not_found``).

Watches are the shared inotify watches of ``/files/watch``; a watcher made
with ``CreateWatcher`` keeps its place in the watch's event log between
``GetWatcherEvents`` polls, and is removed by ``RemoveWatcher``, by its
creator's absence for a while, or at shutdown.
"""

from __future__ import annotations

import posixpath
import re
import secrets
import stat
from typing import Any

import attrs
from twisted.internet.defer import Deferred, succeed

from sandboxd.access.guard import PathGuard
from sandboxd.daemon.firstuse import ServiceOnFirstUse
from sandboxd.e2b.connect import DataLoss, bool_field, string_field, uint_field
from sandboxd.e2b.door import SERVER_STREAM, UNARY, Call, Procedure, Stream
from sandboxd.e2b.entries import FILE_TYPE_DIRECTORY, describe, entry_json
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    file_exists,
    internal,
    limit_exceeded,
    limit_setting,
    not_found,
    payload_too_large,
    timed_out,
)
from sandboxd.eventlog import Event
from sandboxd.files import walk
from sandboxd.files.watch import (
    ATTRIBUTES,
    OVERFLOW,
    Watch,
    WatchService,
    seen_as,
    watch_dirs,
)
from sandboxd.policy.defaults import (
    E2B_MAX_WATCHERS,
    E2B_WATCHER_IDLE_SECONDS,
    ENDPOINT_LIMITS,
    MAX_LIST_DEPTH,
    MIB,
    identity_cap,
)
from sandboxd.routes import files as file_routes

#: The temporary names of atomic writes (``sandboxd.files.atomic``): their
#: create-and-rename is one write of the real name to whoever watches.
_ATOMIC_TEMP = re.compile(r"^\..+\.[0-9a-f]{12}\.upload$")

_EVENT_TYPES = {
    "created": "EVENT_TYPE_CREATE",
    "modified": "EVENT_TYPE_WRITE",
    "deleted": "EVENT_TYPE_REMOVE",
    "moved": "EVENT_TYPE_RENAME",
    ATTRIBUTES: "EVENT_TYPE_CHMOD",
}

#: The events that describe an entry still there (envd's ``opCarriesEntry``).
_CARRIES_ENTRY = ("EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE", "EVENT_TYPE_CHMOD")


def _path(message: dict[str, Any], name: str = "path") -> str:
    value = string_field(message, name)
    if not value:
        raise bad_request(f"'{name}' is required")
    return value


def _file(call: Call, message: dict[str, Any], name: str = "path") -> str:
    """A path field, its leading ``~`` the call's user's home, as envd takes it."""
    return call.expand(_path(message, name))


def _guard(call: Call) -> PathGuard:
    """
    The mapped endpoint's guard; on a root daemon what it creates belongs
    to the call's user (envd's, else ``params.default_user``; SPEC §20).
    """
    return PathGuard.for_request(call.server_request(body={"user": call.user()}))


def _thread(call: Call, fn: Any, *args: Any) -> Any:
    return call.context.in_thread(fn, *args)


# -- one-shot procedures ------------------------------------------------------------


def stat_(call: Call, message: dict[str, Any]) -> dict[str, Any]:
    """``Stat``: the entry (a link as a link, with its target)."""
    return {"entry": describe(_guard(call), _file(call, message))}


def make_dir(call: Call, message: dict[str, Any]) -> dict[str, Any]:
    """``MakeDir``: with parents; an existing directory is ``already_exists``."""
    path = _file(call, message)
    guard = _guard(call)
    try:
        with guard.locate(path, "write", follow=True) as loc:
            st = loc.lstat()
    except ApiError as e:
        if e.status != 404:
            raise
        st = None  # a missing parent: made below, with the parents
    if st is not None:
        # Named as the caller named it, as every other refusal names it.
        named = _path(message)
        if stat.S_ISDIR(st.st_mode):
            raise file_exists(f"directory already exists: {named}")
        raise bad_request(f"path already exists but it is not a directory: {named}")
    made = walk.make_dir(guard, path)
    return {
        "entry": {
            "name": posixpath.basename(made) or made,
            "type": FILE_TYPE_DIRECTORY,
            "path": made,
        }
    }


def move(call: Call, message: dict[str, Any]) -> Deferred[dict[str, Any]]:
    """
    ``Move``: envd's ``os.Rename``, which replaces a file or an empty
    directory and refuses a directory that is not empty (never moves the
    source into a directory, as ``files_move`` does).

    The answer describes what was moved, so what cannot be described (a
    link whose target the path rules refuse) is refused before anything
    moves: an error after the move would leave the caller believing
    nothing happened.
    """
    source = _file(call, message, "source")
    body = {
        "source": source,
        "destination": _file(call, message, "destination"),
        "overwrite": True,
        "user": call.user(),
    }
    describe(_guard(call), source)
    moved: Deferred[dict[str, Any]] = file_routes.move(
        call.server_request(body=body), into=False
    )
    # A client that leaves gives up a copy to another file system, as on
    # the HTTP API: it would hold a worker thread for a move nobody hears of.
    call.on_close(moved.cancel)
    return moved.addCallback(
        lambda done: {"entry": describe(_guard(call), done["destination"], done=True)}
    )


def _listed(guard: PathGuard, full: str, st: Any) -> dict[str, Any]:
    """
    One listed entry, a link as ``Stat`` shows it (envd's ``ListDir`` and
    ``Stat`` share one description): its target's type and mode, and
    ``symlinkTarget``.  A link whose target the path rules refuse to
    describe is shown as envd shows a broken one (type unspecified, its
    own path as the target).
    """
    if not stat.S_ISLNK(st.st_mode):
        return entry_json(full, st)
    try:
        with guard.locate(full, "read", follow=True) as loc:
            return entry_json(full, st, loc.lstat(), loc.path)
    except ApiError:
        return entry_json(full, st)


def _list(guard: PathGuard, path: str, depth: int, max_entries: int) -> dict[str, Any]:
    """
    Every entry to ``depth``, or a refusal past ``max_entries``: envd's
    answer has no room to say it was cut, so a cut listing would look
    complete.
    """
    entries: list[dict[str, Any]] = []
    with guard.open_dir(path) as (fd, root):
        for parent, name, st in walk.walk(fd, root, depth):
            full = posixpath.join(parent, name)
            if not walk.visible(guard, full, st):
                continue
            if len(entries) >= max_entries:
                raise payload_too_large(
                    max_entries,
                    message=f"the listing has more than {max_entries} entries; "
                    "list with a smaller depth or a directory further down",
                    setting=limit_setting("files_list", "max_entries"),
                )
            entries.append(_listed(guard, full, st))
    return {"entries": entries}


def list_dir(call: Call, message: dict[str, Any]) -> Any:
    """``ListDir``: entries below the directory, to ``depth`` (0 means 1)."""
    guard = _guard(call)
    path = call.expand(string_field(message, "path") or guard.default_dir)
    depth = uint_field(message, "depth", 1) or 1
    if depth > MAX_LIST_DEPTH:
        raise bad_request(f"'depth' must be at most {MAX_LIST_DEPTH}")
    cap = call.rule.limits.max_entries or ENDPOINT_LIMITS["files_list"]["max_entries"]
    with guard.locate(path, "read", follow=True, missing_ok=False) as loc:
        st = loc.lstat()
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise bad_request(f"path is not a directory: {path}")
    return _thread(call, _list, guard, path, depth, int(cap))


def _remove(guard: PathGuard, path: str) -> None:
    try:
        walk.delete(guard, path)
    except ApiError as e:
        # envd's Remove is os.RemoveAll: what is not there is removed
        # already (E2B code cleans up with it before a run, untried).
        if e.status != 404 or e.code != Code.NOT_FOUND:
            raise


def remove(call: Call, message: dict[str, Any]) -> Any:
    """``Remove``: a file, a link or a whole tree; a missing path is no error."""
    guard = _guard(call)
    path = _file(call, message)
    return _thread(call, _remove, guard, path).addCallback(lambda _: {})


# -- watching ---------------------------------------------------------------------


def _watch_service(call: Call) -> WatchService:
    service: ServiceOnFirstUse[WatchService] | None = call.context.watches
    assert service is not None
    return service.get()


def _event_json(
    guard: PathGuard, root: str, event: Event, include_entry: bool
) -> list[dict[str, Any]]:
    """envd's ``FilesystemEvent`` messages of one watch event (guard-checked)."""
    data = event.data
    kind = _EVENT_TYPES.get(event.event)
    if kind is None:
        return []
    out = []
    pairs = [(data["path"], kind)]
    if "dest" in data:
        pairs.append((data["dest"], "EVENT_TYPE_CREATE"))
    for path, what in pairs:
        if _ATOMIC_TEMP.match(posixpath.basename(path)):
            continue
        try:
            seen_as(guard, path)
        except ApiError:
            continue
        name = posixpath.relpath(path, root) if path != root else ""
        # As ListDir shows it: a name that is not UTF-8 with its bad bytes
        # as ``\xNN`` (a lone surrogate would make the SDK refuse the
        # whole message, every event of the poll with it).
        message: dict[str, Any] = {"name": walk.display_name(name), "type": what}
        if include_entry and what in _CARRIES_ENTRY:
            try:
                message["entry"] = describe(guard, path)
            except ApiError:
                pass
        out.append(message)
    return out


def _lost(message: str, limit: int, setting: str) -> DataLoss:
    """
    A watch's events that cannot be delivered (``message`` says which):
    ``data_loss`` for an E2B client, 413 ``payload_too_large`` naming the
    limit that was passed.
    """
    return DataLoss(
        413,
        message,
        "ValueError",
        Code.PAYLOAD_TOO_LARGE,
        limit=limit,
        setting=setting,
    )


#: The kernel's bound on changes queued for one inotify instance.
_KERNEL_QUEUE = "fs.inotify.max_queued_events"


def _overflowed(root: str) -> DataLoss:
    """The kernel dropped changes under ``root`` (an ``overflow`` event)."""
    return _lost(
        "the kernel dropped changes under the watched directory: more came at "
        f"once than it queues ({_KERNEL_QUEUE}); list the directory again to "
        "catch up",
        0,
        _KERNEL_QUEUE,
    )


def _open_watch(call: Call, message: dict[str, Any]) -> Any:
    """A Deferred ``(root, Watch)`` for the message's directory."""
    guard = _guard(call)
    path = _file(call, message)
    recursive = bool_field(message, "recursive")
    retention = call.rule.limits.max_output_bytes or MIB
    service = _watch_service(call)
    with guard.locate(path, "read", follow=True, missing_ok=False) as loc:
        st = loc.lstat()
    if st is None or not stat.S_ISDIR(st.st_mode):
        raise bad_request(f"path is not a directory: {path}")

    def ready(found: tuple[str, list[str]]) -> tuple[str, Watch]:
        root, dirs = found
        return root, service.get(
            root, recursive, int(retention), dirs if recursive else []
        )

    if recursive:
        return _thread(call, watch_dirs, guard, path).addCallback(ready)
    with guard.open_dir(path) as (_fd, root):
        pass
    return succeed((root, [])).addCallback(ready)


def watch_dir(call: Call, message: dict[str, Any]) -> None:
    """``WatchDir``: a stream of events (start, then events and keepalives)."""
    guard = _guard(call)
    include = bool_field(message, "include_entry")

    def ready(opened: tuple[str, Watch]) -> None:
        root, watch = opened
        stream = Stream(call, lambda: {"keepalive": {}})
        watch.acquire()

        def deliver(event: Event | None) -> None:
            if stream.ended:
                return
            if event is None:
                stream.end()
                return
            if event.event == OVERFLOW:
                # Which changes were dropped nobody can tell: the stream
                # ends saying so rather than go on with a hole in it.
                stream.end(_overflowed(root))
                return
            for item in _event_json(guard, root, event, include):
                stream.send({"filesystem": item})

        unsubscribe = watch.log.subscribe(deliver)
        stopped: list[bool] = []

        def stop() -> None:
            if not stopped:
                stopped.append(True)
                unsubscribe()
                watch.release()

        stream.on_end(stop)
        seconds = call.timeout_seconds()
        if seconds is not None:
            # As envd's WatchDir returns the context's error at its deadline:
            # the SDK hands on_exit a TimeoutException, telling a watch that
            # timed out from one that was stopped.
            expired = timed_out(
                f"the watch's deadline passed after {seconds:g} seconds",
                limit="Connect-Timeout-Ms",
            )
            stream.deadline(seconds, lambda: stream.end(expired))
        stream.send({"start": {}})

    def failed(failure: Any) -> None:
        error = failure.value
        if not isinstance(error, ApiError):
            error = internal("cannot watch the directory", "OSError")
        call.door.fail(call, error)

    _open_watch(call, message).addCallbacks(ready, failed)


def _now_seq(watch: Watch) -> int:
    """The sequence number of the watch's newest event (0 when none)."""
    _, events = watch.log.since(0)
    return events[-1].seq if events else 0


@attrs.define(eq=False)
class Watcher:
    """A polled watcher: its watch and how far its creator has read."""

    id: str
    owner: str
    root: str
    watch: Watch
    guard: PathGuard
    include_entry: bool
    seq: int
    timer: Any = None


@attrs.define
class Watchers:
    """The watchers made with ``CreateWatcher``, bounded."""

    clock: Any
    table: dict[str, Watcher] = attrs.Factory(dict)

    def add(self, watcher: Watcher, share: int = E2B_MAX_WATCHERS) -> None:
        """
        Keep a new watcher: 429 past :data:`E2B_MAX_WATCHERS`, or past
        ``share`` of them held by its owner (so one identity cannot take
        every watcher and lock the others out).
        """
        if len(self.table) >= E2B_MAX_WATCHERS:
            raise limit_exceeded(
                429,
                f"too many watchers (at most {E2B_MAX_WATCHERS})",
                Code.CONCURRENCY_LIMITED,
                limit=E2B_MAX_WATCHERS,
            )
        held = sum(1 for w in self.table.values() if w.owner == watcher.owner)
        if held >= share:
            raise limit_exceeded(
                429,
                f"too many watchers for one identity (at most {share}; "
                "raise endpoints.files_watch.limits.max_per_identity)",
                Code.CONCURRENCY_LIMITED,
                limit=share,
            )
        watcher.watch.acquire()
        self.table[watcher.id] = watcher
        self.touch(watcher)

    def touch(self, watcher: Watcher) -> None:
        """Its creator polled: push its idle removal back."""
        if watcher.timer is not None and watcher.timer.active():
            watcher.timer.reset(E2B_WATCHER_IDLE_SECONDS)
        else:
            watcher.timer = self.clock.callLater(
                E2B_WATCHER_IDLE_SECONDS, self.remove, watcher.id
            )

    def get(self, watcher_id: str, owner: str) -> Watcher:
        """The caller's own watcher, or 404."""
        watcher = self.table.get(watcher_id)
        if watcher is None or watcher.owner != owner:
            raise not_found(f"watcher {watcher_id!r} not found")
        return watcher

    def remove(self, watcher_id: str) -> None:
        """Forget a watcher and let go of its watch (idempotent)."""
        watcher = self.table.pop(watcher_id, None)
        if watcher is None:
            return
        if watcher.timer is not None and watcher.timer.active():
            watcher.timer.cancel()
        watcher.watch.release()

    def remove_all(self) -> None:
        """Shutdown: every watcher."""
        for watcher_id in list(self.table):
            self.remove(watcher_id)


def _watchers(call: Call) -> Watchers:
    watchers: Watchers = call.context.e2b.watchers
    return watchers


def _watcher_share(call: Call) -> int:
    """How many of the door's watchers one identity may hold."""
    rule = call.context.policy.rules["files_watch"]
    identities = len(call.context.policy.tokens.ids())
    return identity_cap(E2B_MAX_WATCHERS, identities, rule.limits.max_per_identity)


def create_watcher(call: Call, message: dict[str, Any]) -> Any:
    """``CreateWatcher``: a watcher to poll with ``GetWatcherEvents``."""
    guard = _guard(call)
    include = bool_field(message, "include_entry")
    owner = call.identity.root

    def ready(opened: tuple[str, Watch]) -> dict[str, Any]:
        root, watch = opened
        watcher = Watcher(
            secrets.token_hex(8), owner, root, watch, guard, include, _now_seq(watch)
        )
        _watchers(call).add(watcher, _watcher_share(call))
        return {"watcherId": watcher.id}

    return _open_watch(call, message).addCallback(ready)


def get_watcher_events(call: Call, message: dict[str, Any]) -> dict[str, Any]:
    """``GetWatcherEvents``: what happened since the last poll."""
    watchers = _watchers(call)
    watcher = watchers.get(_path(message, "watcher_id"), call.identity.root)
    watchers.touch(watcher)
    # The debounce holds the newest events back for a moment: take them now.
    watcher.watch._flush()
    log = watcher.watch.log
    gap, events = log.since(watcher.seq)
    overflowed = any(event.event == OVERFLOW for event in events)
    if gap is not None or overflowed:
        # Never a poll that looks complete with events missing: the poll
        # fails saying so, and the watcher moves on to what comes next.
        watcher.seq = log.last_seq
        if overflowed or gap is None:
            raise _overflowed(watcher.root)
        retention = log.max_bytes
        setting = "endpoints.files_watch.limits.max_output_bytes"
        raise _lost(
            f"{gap[1] - gap[0] + 1} events since the last poll were not kept (a "
            f"watch keeps the newest {retention} bytes of events: {setting}); "
            "list the directory again to catch up, and poll more often: the "
            "next poll reports the changes from now on",
            retention,
            setting,
        )
    out: list[dict[str, Any]] = []
    for event in events:
        watcher.seq = event.seq
        out.extend(
            _event_json(watcher.guard, watcher.root, event, watcher.include_entry)
        )
    return {"events": out}


def remove_watcher(call: Call, message: dict[str, Any]) -> dict[str, Any]:
    """``RemoveWatcher``."""
    watchers = _watchers(call)
    watcher = watchers.get(_path(message, "watcher_id"), call.identity.root)
    watchers.remove(watcher.id)
    return {}


_F = "filesystem.Filesystem/"

PROCEDURES = {
    _F + "Stat": Procedure(_F + "Stat", UNARY, "files_stat", stat_),
    _F + "MakeDir": Procedure(_F + "MakeDir", UNARY, "files_mkdir", make_dir),
    _F + "Move": Procedure(_F + "Move", UNARY, "files_move", move),
    _F + "ListDir": Procedure(_F + "ListDir", UNARY, "files_list", list_dir),
    _F + "Remove": Procedure(_F + "Remove", UNARY, "files_delete", remove),
    _F + "WatchDir": Procedure(
        _F + "WatchDir", SERVER_STREAM, "files_watch", watch_dir
    ),
    _F + "CreateWatcher": Procedure(
        _F + "CreateWatcher", UNARY, "files_watch", create_watcher
    ),
    _F + "GetWatcherEvents": Procedure(
        _F + "GetWatcherEvents", UNARY, "files_watch", get_watcher_events
    ),
    _F + "RemoveWatcher": Procedure(
        _F + "RemoveWatcher", UNARY, "files_watch", remove_watcher
    ),
}
