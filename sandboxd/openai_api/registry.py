# -*- test-case-name: tests.openai_api.test_sessions -*-
"""
What the ``/v1`` door keeps beside the engine: the session faces, the
responses, the vaults, credentials, templates, definitions, environments
and webhook endpoints, and the per-owner ``Idempotency-Key`` books of the
creates.

One :class:`Registry` per agent manager (the group's service), held in a
weak map so the engine knows nothing of the door.  With a state dir,
all of it but the books outlives the daemon (:mod:`.store`); the agents
do not.  What a previous daemon kept is read in the reactor's thread pool
when the door is first used; every ``/v1`` handler waits for it
(:func:`restored_first`), so the first answer already sees it while the
rest of the daemon (``/health``) answers meanwhile.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, TimeoutError
from twisted.python.failure import Failure

from sandboxd.daemon.context import as_clock
from sandboxd.errors import ApiError, bad_request, not_found, unavailable
from sandboxd.eventlog import forget_closed
from sandboxd.openai_api.envelope import LOCAL_HEADER
from sandboxd.openai_api.face import IdempotencyBook, SessionFace
from sandboxd.policy import defaults
from sandboxd.waiters import Waiters
from sandboxd.web.params import integer

if TYPE_CHECKING:
    from sandboxd.agents.manager import AgentManager
    from sandboxd.daemon.context import Context
    from sandboxd.openai_api.store import Restored, SessionStore
    from sandboxd.web.messages import ServerRequest

log = logging.getLogger(__name__)

_REGISTRIES: weakref.WeakKeyDictionary[Any, Registry] = weakref.WeakKeyDictionary()

#: Methods that change nothing (after any other, the records are written).
_READS = frozenset({"GET", "HEAD", "OPTIONS"})


class Registry:
    """The door's records for one agent manager."""

    def __init__(self, context: Context, store: SessionStore | None = None) -> None:
        from sandboxd.openai_api.webhooks import Deliveries

        #: Where sessions are kept across restarts (None: memory only).
        self.store = store
        #: The webhook endpoints by id, with their owner and secret.
        self.webhooks: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.deliveries = Deliveries(context, self.webhooks)
        self.faces: OrderedDict[str, SessionFace] = OrderedDict()
        self.responses: OrderedDict[str, Any] = OrderedDict()
        #: Responses read back after a restart, as records with their
        #: conversation, until :mod:`.responses` makes objects of them.
        self.kept_responses: OrderedDict[str, tuple[dict[str, Any], SessionFace]] = (
            OrderedDict()
        )
        self.definitions: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.environments: OrderedDict[str, dict[str, Any]] = OrderedDict()
        #: Vaults, their credentials (with their secrets) and templates.
        self.vaults: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.credentials: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.templates: OrderedDict[str, dict[str, Any]] = OrderedDict()
        #: Stored files and the like (:mod:`.stores`), made on first use.
        self.stores: Any = None
        #: What a previous daemon kept is still being read.
        self.loading = False
        self._loaded: Waiters[None] = Waiters()
        self._records_due: Any = None
        #: What was last written (or read) of each kind of record.
        self._records_written: dict[str, bytes] = {}
        self._context = context
        self._books: dict[tuple[str, str], IdempotencyBook] = {}

    def book(self, owner: str, route: str) -> IdempotencyBook:
        """The ``Idempotency-Key`` book of one owner's creates on one route."""
        key = (owner, route)
        book = self._books.get(key)
        if book is None:
            book = self._books[key] = IdempotencyBook(on_change=self.records_changed)
        return book

    @property
    def idempotency(self) -> OrderedDict[str, dict[str, Any]]:
        """
        The ``Idempotency-Key`` books as records, so that a create retried
        after a restart answers what the first one made.
        """
        return OrderedDict(
            (record["id"], record)
            for (owner, route), book in self._books.items()
            for key, digest, result, stored_at in book.entries()
            for record in [
                {
                    "id": json.dumps([owner, route, key]),
                    "owner": owner,
                    "route": route,
                    "key": key,
                    "digest": digest,
                    "result": result,
                    "stored_at": stored_at,
                }
            ]
        )

    def _restore_books(self, records: list[dict[str, Any]]) -> None:
        """Put back the books' entries (each book still bounded)."""
        for record in records:
            try:
                owner, route, key = record["owner"], record["route"], record["key"]
                self.book(owner, route).restore(
                    key, record["digest"], record["result"], record.get("stored_at")
                )
            except (KeyError, TypeError) as e:
                log.warning("an Idempotency-Key record cannot be restored (%s)", e)

    def add(self, face: SessionFace) -> None:
        """Keep a face; closed ones beyond the bound are forgotten, oldest first."""
        from sandboxd.openai_api.webhooks import follow_session

        self.faces[face.id] = face
        if self.store is not None:
            self.store.watch(face)
        if not face.hidden:
            follow_session(self.deliveries, face)
        forget_closed(
            self.faces,
            lambda f: f.log,
            self.forget,
            defaults.AGENT_KEPT_ITEMS,
            defaults.AGENT_KEPT_CLOSED_BYTES,
        )

    def forget(self, face_id: str) -> None:
        """A session is gone for good (deleted, or beyond the bound)."""
        self.faces.pop(face_id, None)
        if self.store is not None:
            self.store.forget(face_id)

    def make_room(self, owner: str | None = None) -> Deferred[Any] | None:
        """
        An agent slot is wanted at ``max_sessions``: the least recently
        active idle conversation behind responses, of any identity, gives
        its agent up (it goes to sleep, :meth:`.SessionFace.sleep`, and is
        continued as after a restart); None when none can.  Idle agents of
        conversations are a cache, not a reservation; the caller's own
        sessions (``beta.agents.sessions``) are never taken.  With
        ``owner``, the slot is one of that identity's share
        (``max_per_identity``), and only its own conversations give way.

        The conversation goes to sleep at once, so a concurrent caller
        picks another; the slot is free once the Deferred fires.
        """
        idle = [
            f
            for f in self.faces.values()
            if f.hidden and f.can_sleep and owner in (None, f.owner)
        ]
        if not idle:
            return None
        oldest = min(idle, key=lambda f: f.last_active_at)
        return Deferred.fromCoroutine(oldest.sleep().close(reason="evicted"))

    def serving_turns(self, owner: str | None = None) -> int:
        """
        How many conversations behind responses (``owner``'s, or anyone's)
        hold an agent only for the turn they run: once idle, each gives its
        slot to whoever needs it (:meth:`make_room`).
        """
        return sum(
            1
            for f in self.faces.values()
            if f.hidden
            and owner in (None, f.owner)
            and not f.dormant
            and not f.log.closed
            and not f.can_sleep
        )

    def awaiting_approval(self, owner: str | None = None) -> int:
        """
        How many of :meth:`serving_turns` (``owner``'s, or anyone's) wait
        for an approval their caller has not answered: they keep their
        agent until it is answered, cancelled or deleted, or until the
        policy's ``permission_timeout_seconds``.
        """
        return sum(
            1
            for f in self.faces.values()
            if f.hidden
            and owner in (None, f.owner)
            and not f.dormant
            and not f.log.closed
            and bool(f.required)
        )

    def changed(self, face: SessionFace) -> None:
        """A session changed without an event (its metadata): keep the change."""
        if self.store is not None:
            self.store.changed(face)

    def revived(self, face: SessionFace) -> None:
        """A restored session's agent runs again: announce what follows."""
        from sandboxd.openai_api.webhooks import follow_session

        if not face.hidden:
            follow_session(self.deliveries, face, created=False)

    def responses_of(self, face: SessionFace) -> list[dict[str, Any]]:
        """The stored responses of a conversation, as the records kept with it."""
        made = [
            r.record() for r in self.responses.values() if r.face is face and r.store
        ]
        kept = [record for record, f in self.kept_responses.values() if f is face]
        return kept + made

    # -- what a previous daemon kept ------------------------------------------------

    def load(self, store: SessionStore) -> Deferred[None]:
        """
        Read what ``store`` kept, in a thread; calls wait for it
        (:meth:`loaded`) until it is in.
        """
        self.loading = True
        d: Deferred[Restored] = self._context.in_thread(store.read)
        return d.addCallback(self._restored).addErrback(self._not_restored)

    def loaded(self) -> Deferred[None]:
        """
        Fires once the kept state is in (at once when it is), or fails
        with 503 after :data:`~sandboxd.policy.defaults.OPENAI_STATE_LOAD_SECONDS`.
        """
        if not self.loading:
            d: Deferred[None] = Deferred()
            d.callback(None)
            return d
        waited = self._loaded.wait()
        waited.addTimeout(
            defaults.OPENAI_STATE_LOAD_SECONDS, as_clock(self._context.reactor)
        )

        def late(failure: Failure) -> Failure:
            if failure.check(TimeoutError):
                return Failure(
                    unavailable(
                        "the /v1 state kept across restarts is still being read; retry",
                        retry_after=1,
                    )
                )
            return failure

        return waited.addErrback(late)

    def _restored(self, restored: Restored) -> None:
        """Put what was read in place (on the reactor), then let calls through."""
        assert self.store is not None
        for face, responses in restored.sessions:
            self.faces[face.id] = face
            for record in responses:
                self.kept_responses[record["id"]] = (record, face)
            self.store.watch(face, now=face.id in restored.changed)
        for record in restored.webhooks:
            self.webhooks[record["id"]] = record
        for kind, records in restored.records.items():
            if kind == "idempotency":
                self._restore_books(records)
                continue
            held: OrderedDict[str, dict[str, Any]] = getattr(self, kind)
            for record in records:
                held[record["id"]] = record
        self._records_written = self._records_bytes()
        self._done_loading()

    def _not_restored(self, failure: Failure) -> None:
        """
        Reading failed as a whole (the state dir is unreadable) or a record
        could not be put in place: go on with what is in.
        """
        log.error(
            "the /v1 state could not be read whole: %s; going on without the rest",
            failure.getErrorMessage(),
        )
        self._done_loading()

    def _done_loading(self) -> None:
        self.loading = False
        self._loaded.fire(None)

    # -- the small records, written after the calls that may change them -------------

    def records_changed(self) -> None:
        """
        A call that may have changed a vault, credential, template,
        definition or environment ended: write them a moment later (once for
        every change until then), if they changed.
        """
        if (
            self.store is None
            or self.store.frozen
            or self.loading
            or self._records_due is not None
        ):
            return
        self._records_due = self._context.reactor.callLater(
            defaults.OPENAI_STATE_SAVE_DELAY_SECONDS, self._write_records
        )

    def _records_bytes(self) -> dict[str, bytes]:
        """Each kind of record as its file would hold it now."""
        from sandboxd.openai_api.store import RECORD_KINDS, records_json

        return {
            kind: records_json(list(getattr(self, kind).values()))
            for kind in RECORD_KINDS
        }

    def _write_records(self) -> None:
        """Write each kind of record that changed since it was last written."""
        self._records_due = None
        if self.store is None:
            return
        for kind, now in self._records_bytes().items():
            if now != self._records_written.get(kind):
                self._records_written[kind] = now
                self.store.save_records(
                    kind,
                    list(getattr(self, kind).values()),
                    data=now,
                    retry=functools.partial(self._rewrite_records, kind),
                )

    def _rewrite_records(self, kind: str) -> None:
        """One kind's last write failed: write it again, as it is now."""
        self._records_written.pop(kind, None)
        self.records_changed()

    def flush_records(self) -> None:
        """The daemon stops: write the records now if a write was due."""
        due, self._records_due = self._records_due, None
        if due is not None and due.active():
            due.cancel()
            self._write_records()

    def webhooks_changed(self) -> None:
        """The webhook endpoints changed: keep them."""
        if self.store is not None:
            self.store.save_webhooks(
                list(self.webhooks.values()), retry=self.webhooks_changed
            )

    def face(self, request: ServerRequest, face_id: str) -> SessionFace:
        """The caller's session ``face_id``; another owner's is unknown (404)."""
        face = self.faces.get(face_id)
        if face is None or face.owner != owner_of(request) or face.hidden:
            raise not_found(f"No session found with id {face_id!r}", param="session_id")
        return face


def registry(manager: AgentManager) -> Registry:
    """The registry of ``manager``, made on first use."""
    found = _REGISTRIES.get(manager)
    if found is None:
        found = _REGISTRIES[manager] = _made(manager)
    return found


def _made(manager: AgentManager) -> Registry:
    """
    A registry, with the sessions a previous daemon kept when there is a
    state dir (read now, once: the door's first answer must see them).
    """
    context = manager.context
    state_dir = context.state_dir
    if state_dir is None:
        made = Registry(context)
    else:
        from sandboxd.openai_api.store import SessionStore

        store = SessionStore(context, os.path.join(state_dir, "openai"))
        made = Registry(context, store)
        store.responses_of = made.responses_of
        made.load(store)
        # Written before the agents are ended, so their ends are not the sessions'.
        manager.before_stop.append(made.flush_records)
        manager.before_stop.append(store.freeze)
    manager.before_stop.append(made.deliveries.stop)
    manager.room_makers.append(made.make_room)
    manager.slots_in_use.append(made.serving_turns)
    manager.slots_waiting.append(made.awaiting_approval)
    return made


def restored_first(handlers: dict[str, Any]) -> dict[str, Any]:
    """
    ``handlers``, each answering with ``X-Agent-Sandbox-Local: 1`` and run
    once what a previous daemon kept is read (at once when it is), and followed, for a call that may change something,
    by :meth:`Registry.records_changed`.
    """
    return {endpoint_id: _after_load(h) for endpoint_id, h in handlers.items()}


def labelled(handlers: dict[str, Any]) -> dict[str, Any]:
    """
    ``handlers``, each answering with ``X-Agent-Sandbox-Local: 1`` (those
    that need none of the state :func:`restored_first` waits for).
    """
    return {endpoint_id: _labelled(h) for endpoint_id, h in handlers.items()}


def _labelled(handler: Callable[[ServerRequest], Any]) -> Callable[..., Any]:
    @functools.wraps(handler)
    def call(request: ServerRequest) -> Any:
        if request.raw is not None:
            request.raw.setHeader(LOCAL_HEADER, "1")
        return handler(request)

    return call


def _after_load(handler: Callable[[ServerRequest], Any]) -> Callable[..., Any]:
    @functools.wraps(handler)
    def call(request: ServerRequest) -> Any:
        if request.raw is not None:
            request.raw.setHeader(LOCAL_HEADER, "1")
        reg = door(request)
        if not reg.loading:
            return _noted(reg, request, handler(request))
        d = reg.loaded()
        d.addCallback(lambda _: _noted(reg, request, handler(request)))
        return d

    return call


def _noted(reg: Registry, request: ServerRequest, result: Any) -> Any:
    """``result``, with the records written after it when the call may change them."""
    if inspect.iscoroutine(result):
        # Run now (as the dispatcher would), so it can follow a Deferred.
        result = Deferred.fromCoroutine(result)
    if request.method in _READS:
        return result
    if isinstance(result, Deferred):

        def then(value: Any) -> Any:
            reg.records_changed()
            return value

        return result.addBoth(then)
    reg.records_changed()
    return result


def manager(request: ServerRequest) -> AgentManager:
    """The agents group's session manager (the engine)."""
    service = request.context.agents
    assert service is not None
    found: AgentManager = service.get()
    return found


def door(request: ServerRequest) -> Registry:
    """The door's records."""
    return registry(manager(request))


def owner_of(request: ServerRequest) -> str:
    """
    Who owns what the caller makes through the door, and whose
    per-identity bounds it counts against: a capability link's minter,
    else the caller (:attr:`~sandboxd.access.auth.Identity.root`).  Owned
    by a link, each link a token minted would hold a set of vaults,
    files, templates, endpoints and ``Idempotency-Key`` books of its own;
    owned by the minter, the minter and its other links see and manage
    what a link made, as with terminals and uploads.  Every ``/v1`` call
    needs the same scope (``agents:use``), so no record gives a link more
    than it holds.
    """
    return request.identity.root


def face_of(request: ServerRequest) -> SessionFace:
    """The ``{session_id}`` session of the caller, or 404."""
    return door(request).face(request, request.path_params["session_id"])


def page_limit(request: ServerRequest) -> int:
    """A list's ``limit``, 1-100 (20); a bad one is a 400 naming it."""
    try:
        return integer(request.query.get("limit"), "limit", 20, low=1, high=100)
    except ApiError as e:
        raise bad_request(e.message, param="limit") from None


def metadata_filter(request: ServerRequest) -> dict[str, str]:
    """
    A list's ``metadata[KEY]=VALUE`` filter (what the SDK sends for
    ``metadata={...}``): every pair must match exactly.  At most 16 pairs,
    keys 1-64 characters, values up to 512, as OpenAI documents; past that
    a 400 naming ``metadata``.
    """
    wanted = {
        key[len("metadata[") : -1]: value
        for key, value in request.query.items()
        if key.startswith("metadata[") and key.endswith("]")
    }
    if len(wanted) > 16 or any(
        not 0 < len(k) <= 64 or len(v) > 512 for k, v in wanted.items()
    ):
        raise bad_request(
            "metadata: at most 16 pairs, keys of 1-64 characters, values of at "
            "most 512",
            param="metadata",
        )
    return wanted


def matches(metadata: dict[str, str], wanted: dict[str, str]) -> bool:
    """Whether ``metadata`` holds every pair of ``wanted`` (:func:`metadata_filter`)."""
    return all(metadata.get(k) == v for k, v in wanted.items())


def page(
    request: ServerRequest, objects: list[dict[str, Any]], default_order: str = "desc"
) -> dict[str, Any]:
    """
    OpenAI's cursor pagination over ``objects`` (oldest first): ``limit``
    1-100 (20), ``order`` ``asc``/``desc``, ``after`` an object id.
    """
    q = request.query
    limit = page_limit(request)
    order = q.get("order", default_order)
    if order not in ("asc", "desc"):
        raise bad_request("'order' must be asc or desc", param="order")
    ordered = objects if order == "asc" else list(reversed(objects))
    after = q.get("after")
    if after:
        ids = [o.get("id") for o in ordered]
        if after not in ids:
            raise not_found(f"no object {after!r} to page after", param="after")
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }
