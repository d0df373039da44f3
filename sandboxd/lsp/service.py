# -*- test-case-name: tests.lsp.test_lsp -*-
"""
The ``lsp`` group's service: every language server session, found by who
asks, which server, which project root and which user; the editors' own
servers (``lsp_connect``); the daemon-wide and per-identity bounds, which
count both; the idle sweep (of sessions: an editor's socket has its own
pings); the orderly stop.

A session is a cache of a server's index, not a reservation: at a bound,
the least recently used idle session (ready, no question being answered)
is stopped to make room, the caller's own first, then, at the daemon's
bound, anyone's (as idle agents of ``/v1`` conversations give theirs up).
Each identity still holds at most its share, so nobody can take every
slot; an editor's server, whose socket is open, is never stopped.
"""

from __future__ import annotations

import time
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

from sandboxd.errors import ApiError, Code, limit_exceeded, not_found
from sandboxd.lsp.catalog import ServerSpec
from sandboxd.lsp.relay import GOING_AWAY, EditorRelay
from sandboxd.lsp.session import LspSession
from sandboxd.policy.confinement import Confinement
from sandboxd.policy.defaults import identity_cap
from sandboxd.processes.command import RunAs

log = Logger(namespace="sandboxd.lsp")


class LspService(Service):
    """Every language server session of the daemon."""

    def __init__(self, context: Any) -> None:
        """:param context: the daemon's :class:`~sandboxd.daemon.context.Context`."""
        self.context = context
        self.reactor = context.reactor
        self.sessions: dict[str, LspSession] = {}
        #: The servers of editors' sockets, each ended with its socket.
        self.editors: set[EditorRelay] = set()
        self._sweep: IDelayedCall | None = None

    def find(
        self,
        owner: str,
        spec: ServerSpec,
        root: str,
        run_as: RunAs | None,
        confine: Confinement | None = None,
    ) -> LspSession | None:
        """
        The live session of this owner, server, root, user and confinement,
        if one runs.
        """
        user = run_as.uid if run_as is not None else None
        for session in self.sessions.values():
            same_user = (session.run_as.uid if session.run_as else None) == user
            if (
                session.owner == owner
                and session.spec.id == spec.id
                and session.root == root
                and same_user
                and session.confine == confine
                and session.state in ("starting", "ready")
            ):
                return session
        return None

    def open(
        self,
        identity: Any,
        spec: ServerSpec,
        argv: list[str],
        env: dict[str, str],
        root: str,
        run_as: RunAs | None,
        limits: dict[str, Any],
        confine: Confinement | None = None,
    ) -> LspSession:
        """
        A new session, started now (wait on its ``ready()``), under
        ``confine``.

        :raises ApiError: 429 ``too_many_sessions`` at ``max_sessions`` or
            the identity's share of it.
        """
        self._forget_failed()
        self.check_room(identity, limits)
        session = LspSession(
            self.reactor,
            self.context.children,
            spec,
            identity.root,
            root,
            run_as,
            limits,
        )
        self.sessions[session.id] = session
        session.start(argv, env, confine).addErrback(lambda _: None)
        self._arm_sweep()
        return session

    def add_editor(self, relay: EditorRelay) -> None:
        """
        Count an editor's server from now on; its handler has checked the
        room (:meth:`check_room`) in the same reactor turn.
        """
        self.editors.add(relay)

    def remove_editor(self, relay: EditorRelay) -> Deferred[Any]:
        """Its socket is gone: end its server and stop counting it."""
        self.editors.discard(relay)
        return relay.close()

    def check_room(self, identity: Any, limits: dict[str, Any]) -> None:
        """
        Room for one more server of ``identity``'s, made by stopping the
        least recently used idle session if need be (see the module's
        docstring); the slot is free at once, its server ends within the
        stop's grace.

        :raises ApiError: 429 at the daemon's or the identity's bound, which
            count the sessions and the editors' servers together, when no
            session that could give its place is idle.
        """
        total = limits["max_sessions"]
        mine = identity_cap(
            total,
            len(self.context.policy.tokens.ids()),
            limits.get("max_per_identity"),
        )
        while True:
            live: list[LspSession | EditorRelay] = [
                s for s in self.sessions.values() if s.state in ("starting", "ready")
            ]
            live += self.editors
            own = sum(1 for s in live if s.owner == identity.root)
            if own >= mine:
                victim = self._least_used(identity.root)
                if victim is None:
                    raise _too_many(
                        f"you have {own} language servers running "
                        f"(max_per_identity {mine}) and none is idle",
                        mine,
                    )
            elif len(live) >= total:
                victim = self._least_used(identity.root) or self._least_used(None)
                if victim is None:
                    raise _too_many(
                        f"{len(live)} language servers are running "
                        f"(max_sessions {total}) and none is idle",
                        total,
                    )
            else:
                return
            log.info(
                "language server {id} ({owner}, {root}) stopped to make room",
                id=victim.id,
                owner=victim.owner,
                root=victim.root,
            )
            self.remove(victim).addErrback(
                lambda f: log.failure("stopping a language server", f)
            )

    def _least_used(self, owner: str | None) -> LspSession | None:
        """The idle session of ``owner`` (None: anyone's) least recently used."""
        idle = [
            s
            for s in self.sessions.values()
            if s.idle and (owner is None or s.owner == owner)
        ]
        return min(idle, key=lambda s: s.last_activity, default=None)

    def get(self, sid: str, identity: Any) -> LspSession:
        """
        The session ``sid`` if ``identity`` may see it.

        :raises ApiError: 404 for an unknown id and another identity's alike.
        """
        session = self.sessions.get(sid)
        if session is None or not identity.acts_for(session.owner):
            raise not_found(f"no language server session {sid!r}")
        return session

    def visible(self, identity: Any) -> list[LspSession]:
        """The sessions ``identity`` may see."""
        return [s for s in self.sessions.values() if identity.acts_for(s.owner)]

    def remove(self, session: LspSession) -> Deferred[Any]:
        """Stop ``session`` and forget it."""
        self.sessions.pop(session.id, None)
        return session.close()

    def _forget_failed(self) -> None:
        for session in list(self.sessions.values()):
            if session.state == "failed":
                self.remove(session)

    def _arm_sweep(self) -> None:
        if self._sweep is not None and self._sweep.active():
            return
        if not self.sessions:
            return
        every = max(
            0.5,
            min(s.limits["idle_timeout_seconds"] for s in self.sessions.values()) / 2,
        )
        self._sweep = self.reactor.callLater(every, self._sweep_idle)

    def _sweep_idle(self) -> None:
        self._sweep = None
        now = time.monotonic()
        for session in list(self.sessions.values()):
            # A server still starting, or answering a question, is not idle
            # however long that takes (a first question on a busy machine).
            busy = session.state == "starting" or (
                session.state == "ready" and not session.idle
            )
            quiet = now - session.last_activity > session.limits["idle_timeout_seconds"]
            if quiet and not busy:
                log.info("language server {id} idle: stopped", id=session.id)
                self.remove(session)
        self._arm_sweep()

    def stopService(self) -> Deferred[None]:
        """Close every editor's socket and stop every server; bounded by the kill grace."""
        super().stopService()  # type: ignore[no-untyped-call]
        if self._sweep is not None and self._sweep.active():
            self._sweep.cancel()
        waits = [self.remove(s) for s in list(self.sessions.values())]
        for relay in list(self.editors):
            relay.hang_up(GOING_AWAY, "the daemon is stopping")
            waits.append(self.remove_editor(relay))
        done: Deferred[Any] = DeferredList(waits, consumeErrors=True)
        return done.addCallback(lambda _: None)


def _too_many(message: str, limit: int) -> ApiError:
    return limit_exceeded(429, message, Code.TOO_MANY_SESSIONS, limit=limit)
