"""
The ``lsp`` group's bounds (:class:`sandboxd.lsp.service.LspService`), in
memory: at a bound, the least recently used idle session gives its place,
the caller's own first, anyone's at the daemon's bound; a busy session and
an editor's server never do, and then the answer is 429.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from twisted.internet.defer import succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import ApiError
from sandboxd.lsp.service import LspService


class FakeSession:
    """What the service looks at of a session."""

    def __init__(self, sid: str, owner: str, last: float, idle: bool = True) -> None:
        self.id = sid
        self.owner = owner
        self.root = "/p/" + sid
        self.state = "ready"
        self.last_activity = last
        self.idle = idle
        self.closed = False
        self.limits = {"idle_timeout_seconds": 1}

    def close(self) -> Any:
        self.closed = True
        self.state = "closed"
        return succeed(None)


class FakeEditor:
    """An editor's server: its owner is all the bound looks at."""

    def __init__(self, owner: str) -> None:
        self.owner = owner


class RoomTests(SynchronousTestCase):
    """Room is made by stopping idle sessions, fairly."""

    def setUp(self) -> None:
        policy = SimpleNamespace(tokens=SimpleNamespace(ids=lambda: ["alice", "bob"]))
        self.service = LspService(
            SimpleNamespace(reactor=Clock(), children=None, policy=policy)
        )
        self.limits = {"max_sessions": 4}

    def add(self, *sessions: FakeSession) -> None:
        for s in sessions:
            self.service.sessions[s.id] = s  # type: ignore[assignment]

    def room(self, who: str) -> None:
        self.service.check_room(SimpleNamespace(id=who, root=who), self.limits)

    def test_own_share_takes_own_least_used(self) -> None:
        """At her share (2 of 4), Alice's least recently used session goes, not Bob's older one."""
        bob = FakeSession("b1", "bob", last=1)
        old, new = (
            FakeSession("a1", "alice", last=5),
            FakeSession("a2", "alice", last=9),
        )
        self.add(bob, old, new)
        self.room("alice")
        self.assertEqual((old.closed, new.closed, bob.closed), (True, False, False))
        self.assertNotIn("a1", self.service.sessions)

    def test_daemon_bound_takes_anyones_least_used(self) -> None:
        """At max_sessions with no idle session of her own, the least used of anyone's goes."""
        self.limits["max_per_identity"] = 4
        sessions = [FakeSession(f"b{n}", "bob", last=n) for n in (3, 1, 2, 4)]
        self.add(*sessions)
        self.room("alice")
        self.assertEqual([s.closed for s in sessions], [False, True, False, False])

    def test_busy_sessions_and_editors_stay(self) -> None:
        """Sessions answering a question and editors' servers give no place: 429 says none is idle."""
        self.add(FakeSession("a1", "alice", last=1, idle=False))
        self.service.editors.add(FakeEditor("alice"))  # type: ignore[arg-type]
        with self.assertRaises(ApiError) as caught:
            self.room("alice")
        self.assertEqual(
            (caught.exception.status, caught.exception.code),
            (429, "too_many_sessions"),
        )
        self.assertIn("none is idle", caught.exception.message)
        self.assertIn("a1", self.service.sessions)


class SweepTests(SynchronousTestCase):
    """The idle sweep stops only what is idle."""

    def test_busy_and_starting_sessions_stay(self) -> None:
        """
        A session quiet past its idle timeout is stopped, but not one still
        starting or answering a question that is taking long.
        """
        service = LspService(SimpleNamespace(reactor=Clock(), children=None))
        quiet = FakeSession("q", "alice", last=0)
        asking = FakeSession("a", "alice", last=0, idle=False)
        starting = FakeSession("s", "alice", last=0)
        starting.state = "starting"
        for s in (quiet, asking, starting):
            service.sessions[s.id] = s  # type: ignore[assignment]
        service._sweep_idle()
        self.assertEqual(
            (quiet.closed, asking.closed, starting.closed), (True, False, False)
        )
        self.assertEqual(sorted(service.sessions), ["a", "s"])
