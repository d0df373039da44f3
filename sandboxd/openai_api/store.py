# -*- test-case-name: tests.openai_api.test_restart -*-
"""
What the ``/v1`` door keeps under the state dir, so that sessions, their
turns, items and events, stored responses, vaults and credentials,
templates, definitions, environments, webhook endpoints and the
``Idempotency-Key`` books of creates outlive the daemon.

One file per session (``openai/sessions/<id>.json``, 0600 in a 0700
directory; a conversation of responses is a hidden session, its responses'
records in its file), one per kind of record (``openai/vaults.json``…,
:data:`RECORD_KINDS`, each at most
:data:`~sandboxd.policy.defaults.OPENAI_STATE_RECORDS_BYTES`) and one for
the webhook endpoints (``openai/webhooks.json``), written whole and renamed
into place (a reader, or the next start, sees the old file or the new one),
in the reactor's thread pool, a moment after the session changes (changes
in that moment are written once).  Secrets (credentials', webhook signing
secrets, MCP header values, environment variables) are in these files as
they are: the 0600 mode, the daemon's user and the 0700 directory are what
protect them; they are never logged.  Each file is bounded: the event log's newest
:data:`~sandboxd.policy.defaults.OPENAI_STATE_EVENT_BYTES`, the whole file
:data:`~sandboxd.policy.defaults.OPENAI_STATE_FILE_BYTES`; at most
:data:`~sandboxd.policy.defaults.OPENAI_STATE_SESSIONS` files are kept,
those of the sessions that changed last.

When the daemon stops, the state is written as it stands before the
agents are ended, and nothing after: the agents' ends are the daemon's
doing, not the sessions'.  A session read back has no agent until new
input starts one: it is ``idle``, a turn that was running or queued is
``failed`` ("the daemon stopped while this turn was running"), and its
log gets those events, so a client resuming with ``?after=`` learns it.
Its owner is kept: another identity still gets a 404.

The files are read when the door is first used, in the reactor's thread
pool (:meth:`SessionStore.read`; the door's calls wait for it, see
:mod:`.registry`), bounded by the caps above; a file that does not parse is
set aside (``.bad``), never half-restored.  A session read back with
nothing cut is not written again until it changes.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.python.failure import Failure

from sandboxd.eventlog import Event, EventLog, json_size
from sandboxd.files.atomic import remove_if_there, write_private
from sandboxd.openai_api.face import SessionFace, WireTurn
from sandboxd.policy import defaults

if TYPE_CHECKING:
    from sandboxd.daemon.context import Context

log = logging.getLogger(__name__)

#: The layout's version, in every file (a newer one is not read).
VERSION = 1

#: What a turn that was running (or queued) when the daemon stopped says.
INTERRUPTED = "the daemon stopped while this turn was running"


# -- a session as a record, and back -------------------------------------------


def _turn_record(turn: WireTurn) -> dict[str, Any]:
    shown = turn.describe()
    return {
        "id": turn.id,
        "status": turn.status,
        "created_at": turn.created_at,
        "started_at": turn.started_at,
        "completed_at": turn.completed_at,
        "error": turn.error,
        "usage": shown["usage"],
        "items": [
            {k: v for k, v in item.items() if not k.startswith("_")}
            for item in turn.items
        ],
    }


def _event_tail(events: list[Event]) -> list[list[Any]]:
    """The newest events within :data:`OPENAI_STATE_EVENT_BYTES`."""
    kept: list[list[Any]] = []
    total = 0
    for event in reversed(events):
        total += event.size
        if total > defaults.OPENAI_STATE_EVENT_BYTES and kept:
            break
        kept.append([event.seq, event.event, event.data])
    kept.reverse()
    return kept


def snapshot(
    face: SessionFace, responses: list[dict[str, Any]] | None = None
) -> bytes | None:
    """
    The session as the bytes of its file, at most
    :data:`OPENAI_STATE_FILE_BYTES`: its oldest events go first, then its
    longest texts are cut (saying so); None when even that is not enough
    (then the last file written stays).

    :param responses: the stored responses of a conversation (a hidden
        session's), kept in its file with it.
    """
    _, events = face.log.since(0)
    record: dict[str, Any] = {
        "version": VERSION,
        "id": face.id,
        "owner": face.owner,
        "hidden": face.hidden,
        "agent": face.agent,
        "environment": face.environment,
        "metadata": face.metadata,
        "created_at": face.created_at,
        "last_active_at": face.last_active_at,
        "cwd": face.engine.cwd,
        "acp_session_id": face.engine.acp_session_id,
        "vault_ids": face.vault_ids,
        "credential_ids": face.credential_ids,
        "tools": face.tools,
        "instructions": face.instructions,
        "last_response_id": face.last_response_id,
        "idempotency": face.idempotency.entries(),
        "responses": responses or [],
        "turns": [_turn_record(t) for t in face.turns.values()],
        "subagents": face.subagents.kept(),
        "last_seq": face.log.last_seq,
        "events": _event_tail(events),
    }
    data = json.dumps(record, separators=(",", ":")).encode()
    while len(data) > defaults.OPENAI_STATE_FILE_BYTES and record["events"]:
        record["events"] = record["events"][len(record["events"]) // 2 + 1 :]
        data = json.dumps(record, separators=(",", ":")).encode()
    # Still too large: one long text (an answer, a command's output, a
    # prompt) outweighs the rest.  The conversation is kept with its
    # longest texts cut, each saying so, rather than not kept at all (its
    # responses would be unknown after a restart).
    whole = record["turns"], record["responses"]
    cap = defaults.OPENAI_STATE_FILE_BYTES // 2
    while len(data) > defaults.OPENAI_STATE_FILE_BYTES and cap >= _SHORTEST_CUT:
        record["turns"], record["responses"] = _cut(whole, cap)
        data = json.dumps(record, separators=(",", ":")).encode()
        cap //= 2
    return data if len(data) <= defaults.OPENAI_STATE_FILE_BYTES else None


#: The shortest a kept text is cut to (below that a file that is still too
#: large has too many items, not too long ones).
_SHORTEST_CUT = 1024


def _cut(value: Any, cap: int) -> Any:
    """
    A copy of ``value`` (JSON) whose strings longer than ``cap`` characters
    keep their end, after a line that says how much went (as a tool's
    output is kept, :func:`~sandboxd.openai_api.face._kept`).
    """
    if isinstance(value, str):
        if len(value) <= cap:
            return value
        return f"[{len(value) - cap} characters not kept]\n" + value[-cap:]
    if isinstance(value, dict):
        return {k: _cut(v, cap) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cut(v, cap) for v in value]
    return value


def restore(record: dict[str, Any]) -> SessionFace:
    """
    A session from its record: ``failed``, its unfinished turns failed, and
    those ends added to its log (then closed).
    """
    log = EventLog(defaults.AGENT_LIMITS["max_event_bytes"])
    events = record["events"]
    log.last_seq = events[0][0] - 1 if events else int(record["last_seq"])
    for seq, type_, data in events:
        if seq != log.last_seq + 1:
            raise ValueError("the events are not in order")
        log.append(type_, data, json_size(data))
    face = SessionFace.restored(
        record["id"],
        record["owner"],
        record["agent"],
        record["environment"],
        record["metadata"],
        log,
        record.get("cwd") or "",
        record.get("acp_session_id"),
        hidden=bool(record.get("hidden")),
    )
    face.created_at = record["created_at"]
    face.last_active_at = record["last_active_at"]
    face.kept_seq = int(record["last_seq"])
    face.vault_ids = list(record.get("vault_ids") or [])
    face.credential_ids = list(record.get("credential_ids") or [])
    face.tools = list(record.get("tools") or [])
    face.instructions = record.get("instructions", face.instructions)
    face.last_response_id = record.get("last_response_id")
    face.subagents.restore(record.get("subagents"))
    for entry in record.get("idempotency") or []:
        # [key, digest, result, stored at]; without the time if kept by an
        # older daemon.
        face.idempotency.restore(*entry[:4])
    for saved in record["turns"]:
        turn = WireTurn(face, "", [])
        turn.id = saved["id"]
        turn.status = saved["status"]
        turn.created_at = saved["created_at"]
        turn.started_at = saved["started_at"]
        turn.completed_at = saved["completed_at"]
        turn.error = saved["error"]
        turn.usage = saved["usage"]
        turn.items.extend(saved["items"])
        turn.announced = True
        face.turns[turn.id] = turn
    face.end_restored(INTERRUPTED)
    return face


# -- the store -------------------------------------------------------------------

#: The door's other records, one file each (``<kind>.json``).
RECORD_KINDS = (
    "vaults",
    "credentials",
    "templates",
    "definitions",
    "environments",
    "idempotency",
)


@attrs.frozen
class Restored:
    """What a previous daemon kept, read back."""

    #: Each session (oldest first) with its stored responses' records.
    sessions: list[tuple[SessionFace, list[dict[str, Any]]]]
    #: The ids of those whose restoring added events (their files are stale).
    changed: set[str]
    webhooks: list[dict[str, Any]]
    #: :data:`RECORD_KINDS` to their records (missing kinds: none kept).
    records: dict[str, list[dict[str, Any]]]


#: How bytes (a template's inline files) are written in a records file.
_BYTES_KEY = "$bytes_b64"


def _bytes_out(value: Any) -> Any:
    """``json.dumps``'s ``default``: bytes as ``{"$bytes_b64": ...}``."""
    if isinstance(value, bytes):
        return {_BYTES_KEY: base64.b64encode(value).decode("ascii")}
    raise TypeError(f"{type(value).__name__} cannot be kept")


def _bytes_in(value: dict[str, Any]) -> Any:
    """``json.loads``'s ``object_hook``: the bytes :func:`_bytes_out` wrote."""
    if len(value) == 1 and _BYTES_KEY in value:
        return base64.b64decode(value[_BYTES_KEY])
    return value


def records_json(records: list[dict[str, Any]]) -> bytes:
    """One kind of record as its file holds it (bytes included)."""
    return json.dumps(
        {"version": VERSION, "records": records},
        sort_keys=True,
        separators=(",", ":"),
        default=_bytes_out,
    ).encode()


def _read_file(path: str, limit: int) -> dict[str, Any] | None:
    """
    One whole-file record of this layout, or None when there is none; one
    that does not parse (or is over ``limit``) is set aside as ``.bad``.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise ValueError(f"over {limit} bytes")
        record = json.loads(data, object_hook=_bytes_in)
        if not isinstance(record, dict) or record.get("version") != VERSION:
            raise ValueError(f"version {record.get('version')!r}")
        return record
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("set aside %s: it cannot be restored (%s)", path, e)
        remove_if_there(path + ".bad")
        os.replace(path, path + ".bad")
        return None


class SessionStore:
    """
    The sessions' files under ``<state dir>/openai/sessions``.

    :ivar frozen: the daemon is stopping; nothing more is written.
    """

    def __init__(self, context: Context, root: str) -> None:
        self.context = context
        self.root = root
        self.directory = os.path.join(root, "sessions")
        self.frozen = False
        self._due: dict[str, Any] = {}
        self._faces: dict[str, SessionFace] = {}
        self._writing: dict[str, Deferred[None]] = {}
        self._watching: dict[str, Callable[[], None]] = {}
        #: The files whose last write failed (a full disk), by key.
        self._failing: set[str] = set()
        #: What writes each of them again, as it is then, at the next retry.
        self._retries: dict[str, Callable[[], None]] = {}
        self._retry_due: Any = None
        #: The stored responses of a conversation, as records (the registry's).
        self.responses_of: Callable[[SessionFace], list[dict[str, Any]]] = lambda face: []

    def path(self, face_id: str) -> str:
        """The file of one session."""
        return os.path.join(self.directory, face_id + ".json")

    # -- reading (once, at the door's first use, in a thread) ---------------------

    def read(self) -> Restored:
        """
        Everything a previous daemon kept, read and parsed (blocking: the
        registry runs this in the reactor's thread pool).
        """
        sessions = self.load()
        # A session restored again with nothing cut says nothing new: its
        # file is as it was, and is not written again.
        changed = {
            face.id for face, _ in sessions if face.log.last_seq != face.kept_seq
        }
        return Restored(sessions, changed, self.load_webhooks(), self.load_records())

    def load(self) -> list[tuple[SessionFace, list[dict[str, Any]]]]:
        """
        The kept sessions, oldest first (the newest
        :data:`OPENAI_STATE_SESSIONS`; older files are removed), each with
        the records of its stored responses.
        """
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        names = self._newest_files()
        faces = []
        for path, _ in names:
            try:
                with open(path, "rb") as f:
                    record = json.loads(f.read(defaults.OPENAI_STATE_FILE_BYTES + 1))
                if record.get("version") != VERSION:
                    raise ValueError(f"version {record.get('version')!r}")
                faces.append((restore(record), list(record.get("responses") or [])))
            except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
                log.warning("set aside %s: it cannot be restored (%s)", path, e)
                os.replace(path, path + ".bad")
        self._forget_set_aside()
        return faces

    def _forget_set_aside(self) -> None:
        """
        Keep the newest :data:`OPENAI_STATE_SET_ASIDE` files set aside:
        each start may set aside new ones, and a state dir restored again
        and again must not fill the disk with them (blocking).
        """
        with os.scandir(self.directory) as entries:
            kept = [
                (entry.stat(follow_symlinks=False).st_mtime, entry.path)
                for entry in entries
                if entry.name.endswith(".json.bad")
                and entry.is_file(follow_symlinks=False)
            ]
        kept.sort()
        for _, stale in kept[: -defaults.OPENAI_STATE_SET_ASIDE or None]:
            remove_if_there(stale)

    def load_webhooks(self) -> list[dict[str, Any]]:
        """The webhook endpoints kept (an unreadable file is set aside)."""
        path = os.path.join(self.root, "webhooks.json")
        record = _read_file(path, defaults.OPENAI_STATE_FILE_BYTES)
        return list(record["endpoints"]) if record else []

    def records_path(self, kind: str) -> str:
        """The file of one kind of record (``vaults.json``…)."""
        return os.path.join(self.root, kind + ".json")

    def load_records(self) -> dict[str, list[dict[str, Any]]]:
        """
        The vaults, credentials, templates, definitions and environments
        kept, by kind (an unreadable file is set aside, the others read).
        """
        found = {}
        for kind in RECORD_KINDS:
            record = _read_file(
                self.records_path(kind), defaults.OPENAI_STATE_RECORDS_BYTES
            )
            if record is not None:
                found[kind] = list(record["records"])
        return found

    def save_records(
        self,
        kind: str,
        records: list[dict[str, Any]],
        data: bytes | None = None,
        retry: Callable[[], None] | None = None,
    ) -> None:
        """
        Keep one kind of the door's records, credentials' secrets included
        (the file is 0600, written whole); over
        :data:`~sandboxd.policy.defaults.OPENAI_STATE_RECORDS_BYTES` the
        last file written stays (and a warning says so).

        :param data: ``records`` as :func:`records_json` makes them, when
            the caller has them already.
        :param retry: asks for the records to be written again, as they
            are then, should this write fail.
        """
        if self.frozen:
            return
        data = records_json(records) if data is None else data
        if len(data) > defaults.OPENAI_STATE_RECORDS_BYTES:
            log.warning("the /v1 %s are too large to keep; the last file stays", kind)
            return
        self._after_writes(
            kind, write_private, self.records_path(kind), data, retry=retry
        )

    def save_webhooks(
        self, endpoints: list[dict[str, Any]], retry: Callable[[], None] | None = None
    ) -> None:
        """
        Keep the webhook endpoints (with their secrets: the file is 0600).

        :param retry: as :meth:`save_records`'.
        """
        if self.frozen:
            return
        data = json.dumps({"version": VERSION, "endpoints": endpoints}).encode()
        path = os.path.join(self.root, "webhooks.json")
        self._after_writes("webhooks", write_private, path, data, retry=retry)

    def _newest_files(self) -> list[tuple[str, float]]:
        """
        The newest :data:`OPENAI_STATE_SESSIONS` session files, oldest
        first; older ones are removed (blocking).
        """
        names = sorted(self._files(), key=lambda entry: entry[1])
        for stale, _ in names[: -defaults.OPENAI_STATE_SESSIONS or None]:
            remove_if_there(stale)
        return names[-defaults.OPENAI_STATE_SESSIONS :]

    def _write_session(self, path: str, data: bytes) -> None:
        """
        One session's file, and no more files than a start reads back: a
        daemon that keeps many sessions in memory keeps the files of the
        most recently changed (a session that changes again is written
        again).  Only a new file can take the count past it, so only then
        is the directory looked at.  Blocking.
        """
        new = not os.path.exists(path)
        write_private(path, data)
        if new:
            self._newest_files()

    def _files(self) -> Iterator[tuple[str, float]]:
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.name.endswith(".json") and entry.is_file(
                    follow_symlinks=False
                ):
                    yield entry.path, entry.stat(follow_symlinks=False).st_mtime

    # -- writing ------------------------------------------------------------------

    def watch(self, face: SessionFace, now: bool = True) -> None:
        """
        Write ``face`` a moment after each of its changes.

        :param now: write it soon even before it changes (a new session;
            a restored one whose file is as it is needs no write).
        """
        if face.id in self._watching:
            return
        self._faces[face.id] = face
        self._watching[face.id] = face.log.subscribe(lambda _: self.changed(face))
        if now:
            self.changed(face)

    def changed(self, face: SessionFace) -> None:
        """``face`` changed: write it soon (once for every change until then)."""
        if self.frozen or face.id not in self._faces or face.id in self._due:
            return
        self._due[face.id] = self.context.reactor.callLater(
            defaults.OPENAI_STATE_SAVE_DELAY_SECONDS, self._save, face
        )

    def forget(self, face_id: str) -> Deferred[None]:
        """The session is deleted: so is its file."""
        self._faces.pop(face_id, None)
        unwatch = self._watching.pop(face_id, None)
        if unwatch is not None:
            unwatch()
        due = self._due.pop(face_id, None)
        if due is not None and due.active():
            due.cancel()
        self._retries.pop(face_id, None)
        return self._after_writes(face_id, remove_if_there, self.path(face_id))

    def _save(self, face: SessionFace) -> Deferred[None]:
        self._due.pop(face.id, None)
        data = snapshot(face, self.responses_of(face))
        if data is None:
            log.warning("session %s is too large to keep; its last file stays", face.id)
            return succeed(None)
        return self._after_writes(
            face.id,
            self._write_session,
            self.path(face.id),
            data,
            retry=lambda: self.changed(face),
        )

    def _after_writes(
        self,
        key: str,
        work: Callable[..., None],
        *args: Any,
        retry: Callable[[], None] | None = None,
    ) -> Deferred[None]:
        """
        Run ``work`` in a thread once the earlier writes of the same file
        (``key``: a session's id, a kind of record) are done: each file is
        written whole, so an older snapshot renamed into place after a newer
        one would put it back in time.

        :param retry: called a while after the write failed (a full disk),
            to write the file again as it is then; until a write of it
            succeeds, the file keeps what it held before.
        """
        before = self._writing.get(key)
        d: Deferred[None] = Deferred()

        def run(_: Any = None) -> None:
            self.context.in_thread(work, *args).addBoth(done)

        def done(result: Any) -> None:
            if self._writing.get(key) is d:
                del self._writing[key]
            if isinstance(result, Failure):
                if key not in self._failing:
                    self._failing.add(key)
                    log.warning(
                        "could not keep the /v1 door's %s: %s (tried again every "
                        "%g s until it is kept)",
                        key,
                        result.getErrorMessage(),
                        defaults.OPENAI_STATE_RETRY_SECONDS,
                    )
                if retry is not None:
                    self._retry_later(key, retry)
            elif key in self._failing:
                self._failing.discard(key)
                log.warning("the /v1 door's %s is kept again", key)
            d.callback(None)

        self._writing[key] = d
        if before is None:
            run()
        else:
            before.addCallback(run)
        return d

    def _retry_later(self, key: str, retry: Callable[[], None]) -> None:
        """Call ``retry`` with the others due, a while from now (one timer for all)."""
        if self.frozen:
            return
        self._retries[key] = retry
        if self._retry_due is None:
            self._retry_due = self.context.reactor.callLater(
                defaults.OPENAI_STATE_RETRY_SECONDS, self._retry_now
            )

    def _retry_now(self) -> None:
        self._retry_due = None
        retries, self._retries = self._retries, {}
        for retry in retries.values():
            retry()

    def freeze(self) -> Deferred[Any]:
        """
        The daemon is stopping: write every session as it stands now (its
        running turns still running) and nothing after.
        """
        if self._retry_due is not None and self._retry_due.active():
            self._retry_due.cancel()
        self._retry_due = None
        due = list(self._due.items())
        self._due.clear()
        for _, call in due:
            if call.active():
                call.cancel()
        writes = [self._save(face) for face in self._faces.values()]
        self.frozen = True
        return DeferredList(writes)
