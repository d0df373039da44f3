# -*- test-case-name: tests.openai_api.test_sessions -*-
"""
What the ``/v1`` door keeps beside the engine: the session faces, the
responses, and the per-owner ``Idempotency-Key`` books of the creates.

One :class:`Registry` per agent manager (the group's service), held in a
weak map so the engine knows nothing of the door.  With a state dir,
the sessions outlive the daemon (:mod:`.store`); their agents do not.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from sandboxd.errors import bad_request, not_found
from sandboxd.openai_api.face import IdempotencyBook, SessionFace
from sandboxd.policy import defaults
from sandboxd.web.params import integer

if TYPE_CHECKING:
    from sandboxd.agents.manager import AgentManager
    from sandboxd.daemon.context import Context
    from sandboxd.openai_api.store import SessionStore
    from sandboxd.web.messages import ServerRequest

_REGISTRIES: weakref.WeakKeyDictionary[Any, Registry] = weakref.WeakKeyDictionary()


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
        self.definitions: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.environments: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._books: dict[tuple[str, str], IdempotencyBook] = {}

    def book(self, owner: str, route: str) -> IdempotencyBook:
        """The ``Idempotency-Key`` book of one owner's creates on one route."""
        key = (owner, route)
        book = self._books.get(key)
        if book is None:
            book = self._books[key] = IdempotencyBook()
        return book

    def add(self, face: SessionFace) -> None:
        """Keep a face; closed ones beyond the bound are forgotten, oldest first."""
        from sandboxd.openai_api.webhooks import follow_session

        self.faces[face.id] = face
        if self.store is not None:
            self.store.watch(face)
        if not face.hidden:
            follow_session(self.deliveries, face)
        closed = [fid for fid, f in self.faces.items() if f.log.closed]
        while len(self.faces) > defaults.AGENT_KEPT_ITEMS and closed:
            self.forget(closed.pop(0))

    def forget(self, face_id: str) -> None:
        """A session is gone for good (deleted, or beyond the bound)."""
        self.faces.pop(face_id, None)
        if self.store is not None:
            self.store.forget(face_id)

    def changed(self, face: SessionFace) -> None:
        """A session changed without an event (its metadata): keep the change."""
        if self.store is not None:
            self.store.changed(face)

    def revived(self, face: SessionFace) -> None:
        """A restored session's agent runs again: announce what follows."""
        from sandboxd.openai_api.webhooks import follow_session

        follow_session(self.deliveries, face, created=False)

    def webhooks_changed(self) -> None:
        """The webhook endpoints changed: keep them."""
        if self.store is not None:
            self.store.save_webhooks(list(self.webhooks.values()))

    def face(self, request: ServerRequest, face_id: str) -> SessionFace:
        """The caller's session ``face_id``; another owner's is unknown (404)."""
        face = self.faces.get(face_id)
        if face is None or face.owner != request.identity.id or face.hidden:
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
        for face in store.load():
            made.faces[face.id] = face
            store.watch(face)
        for record in store.load_webhooks():
            made.webhooks[record["id"]] = record
        # Written before the agents are ended, so their ends are not the sessions'.
        manager.before_stop.append(store.freeze)
    manager.before_stop.append(made.deliveries.stop)
    return made


def manager(request: ServerRequest) -> AgentManager:
    """The agents group's session manager (the engine)."""
    service = request.context.agents
    assert service is not None
    found: AgentManager = service.get()
    return found


def door(request: ServerRequest) -> Registry:
    """The door's records."""
    return registry(manager(request))


def face_of(request: ServerRequest) -> SessionFace:
    """The ``{session_id}`` session of the caller, or 404."""
    return door(request).face(request, request.path_params["session_id"])


def page(
    request: ServerRequest, objects: list[dict[str, Any]], default_order: str = "desc"
) -> dict[str, Any]:
    """
    OpenAI's cursor pagination over ``objects`` (oldest first): ``limit``
    1-100 (20), ``order`` ``asc``/``desc``, ``after`` an object id.
    """
    q = request.query
    limit = integer(q.get("limit"), "limit", 20, low=1, high=100)
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
