# -*- test-case-name: tests.terminals.test_session -*-
"""
The daemon's table of terminal sessions.

The table exists from the start (the terminal service holds it); the
sessions' machinery (:mod:`sandboxd.terminals.session`: the PTY, the
scrollback, the clients) is imported when the first shell starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from sandboxd.processes.tree import new_marker

if TYPE_CHECKING:
    from sandboxd.access.auth import Identity
    from sandboxd.processes.table import ChildTable
    from sandboxd.terminals.session import PtySession, SpawnRequest

Spawn = Callable[[Any, "PtySession", "SpawnRequest"], None]


class TooManySessions(Exception):
    """The session table is full."""


class ShareTaken(TooManySessions):
    """The owner holds its share of the table (``max_per_identity``)."""


class TerminalTable:
    """
    Every terminal session of the daemon, by id.

    Dead sessions stay (so a late client still learns the exit code) until
    the next listing or creation reaps them; the cap counts live ones.
    """

    def __init__(self, reactor: Any, children: ChildTable | None = None) -> None:
        """:param children: the daemon's, whose scope the shells' markers carry."""
        self.reactor = reactor
        self.children = children
        self.sessions: dict[str, PtySession] = {}
        #: Sessions forgotten while what their shell left may still be
        #: ending (a hang-up's grace, then KILL): the daemon's stop waits
        #: for them too, so that nothing it started outlives it.
        self.ending: set[PtySession] = set()

    def reap(self) -> None:
        """Forget sessions whose shell has ended."""
        for sid in [sid for sid, s in self.sessions.items() if s.ended]:
            self._forget(sid)

    def _forget(self, session_id: str) -> PtySession | None:
        """Take a session out of the table, kept in :attr:`ending` until it has ended."""
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self.ending.add(session)
            session.when_ended().addBoth(lambda _: self.ending.discard(session))
        return session

    def get(self, session_id: str) -> PtySession | None:
        """The session, or None."""
        return self.sessions.get(session_id)

    def running(self, pid: int, identity: Identity) -> PtySession | None:
        """
        The running terminal whose shell is ``pid`` that ``identity`` may
        drive; another identity's is not there for it (the doors that name
        processes by pid answer it as a pid nobody has).
        """
        for session in self.sessions.values():
            if session.pid == pid and not session.ended and session.usable_by(identity):
                return session
        return None

    def create(
        self,
        owner: str,
        spec: SpawnRequest,
        max_sessions: int,
        idle_timeout: float | None,
        spawn: Spawn | None = None,
        mine: int | None = None,
    ) -> PtySession:
        """
        Start a shell (by ``spawn``, default a real PTY) and keep its session.

        :param mine: how many of the table's live sessions ``owner`` may
            hold (None: all), so that one identity cannot hold every
            terminal while the idle timeout keeps them for half an hour.
        :raises TooManySessions: ``max_sessions`` shells already run.
        :raises ShareTaken: ``owner`` already runs ``mine`` of them.
        :raises OSError: the PTY or the fork failed.
        """
        from sandboxd.terminals.session import PtySession, new_session_id, spawn_shell

        self.reap()
        if len(self.sessions) >= max_sessions:
            raise TooManySessions(max_sessions)
        if mine is not None:
            held = sum(1 for s in self.sessions.values() if s.owner == owner)
            if held >= mine:
                raise ShareTaken(mine)
        session = PtySession(
            id=new_session_id(),
            owner=owner,
            clock=self.reactor,
            cols=spec.cols,
            rows=spec.rows,
            idle_timeout=idle_timeout,
            marker=new_marker(self.children.scope if self.children else ""),
        )
        (spawn or spawn_shell)(self.reactor, session, spec)
        self.sessions[session.id] = session
        return session

    def next_lapse(self, owner: str | None = None) -> float | None:
        """
        Seconds until the first session (of ``owner``, or of anyone) with
        no client attached closes for its idle timeout, if nobody uses it
        meanwhile: when a refused create may succeed.  None when every
        session is attended or has no idle timeout.
        """
        now = self.reactor.seconds()
        waits = [
            s.idle_timeout - (now - s.last_activity)
            for s in self.sessions.values()
            if not s.ended
            and not s.clients
            and s.idle_timeout
            and (owner is None or s.owner == owner)
        ]
        return max(0.0, min(waits)) if waits else None

    def close(self, session_id: str) -> Deferred[None] | None:
        """End a session and forget it; None when unknown."""
        session = self._forget(session_id)
        return session.close() if session is not None else None

    def close_all(self) -> list[Deferred[None]]:
        """End every session, those still ending too (daemon shutdown)."""
        sessions = [*self.sessions.values(), *self.ending]
        self.sessions = {}
        return [s.close() for s in sessions]
