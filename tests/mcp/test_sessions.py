"""MCP sessions: ownership, expiry, and the replay that resuming relies on."""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access.auth import Identity
from sandboxd.mcp.sessions import SessionTable, event_frame, parse_event_id
from sandboxd.policy.defaults import MCP_REPLAY_BYTES

ALICE = Identity("alice", frozenset({"*"}))
BOB = Identity("bob", frozenset({"*"}))


class FakeChannel:
    """What a session writes to (an SSEChannel's surface)."""

    def __init__(self) -> None:
        self.open = True
        self.frames: list[bytes] = []
        self.callbacks: list[Any] = []

    def write_raw(self, data: bytes) -> None:
        self.frames.append(data)

    def on_disconnect(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def register_producer(self, producer: Any) -> None:
        self.producer = producer

    def close(self) -> None:
        self.open = False

    def lose(self) -> None:
        self.open = False
        for callback in self.callbacks:
            callback()


class SessionTableTests(SynchronousTestCase):
    """The table of sessions."""

    def test_owned_by_its_identity(self) -> None:
        """Another identity's session id is as unknown as a made-up one."""
        table = SessionTable()
        session = table.create(ALICE, "2025-11-25", 0.0)
        self.assertIs(table.get(session.id, ALICE), session)
        self.assertIsNone(table.get(session.id, BOB))
        self.assertIsNone(table.get("made-up", ALICE))
        self.assertGreaterEqual(len(session.id), 32)

    def test_expiry_spares_busy_sessions(self) -> None:
        """Idle sessions expire; one with a call in flight does not."""
        table = SessionTable()
        idle = table.create(ALICE, "2025-11-25", 0.0)
        busy = table.create(ALICE, "2025-11-25", 0.0)
        busy.calls["x"] = object()  # type: ignore[assignment]
        fresh = table.create(ALICE, "2025-11-25", 9.0)
        gone = table.expire(10.0, 5.0)
        self.assertEqual(gone, [idle])
        self.assertTrue(idle.closed)
        self.assertEqual({s.id for s in table}, {busy.id, fresh.id})

    def test_quietest_is_one_whose_client_is_likely_gone(self) -> None:
        """
        Only a session with no call running and no connection open, quiet
        long enough, may be closed for a new one: the least recently used,
        of one identity's share when asked.
        """
        table = SessionTable()
        older = table.create(ALICE, "2025-11-25", 0.0)
        old = table.create(ALICE, "2025-11-25", 1.0)
        watched = table.create(ALICE, "2025-11-25", 0.0)
        watched.attach(watched.standalone, FakeChannel(), 0)  # type: ignore[arg-type]
        busy = table.create(BOB, "2025-11-25", 0.0)
        busy.calls["x"] = object()  # type: ignore[assignment]
        bobs = table.create(BOB, "2025-11-25", 2.0)
        self.assertIs(table.quietest(10.0, 5.0), older)
        self.assertIs(table.quietest(10.0, 5.0, "bob"), bobs)
        self.assertIsNone(table.quietest(6.0, 5.0, "bob"))
        self.assertIs(table.quietest(5.5, 5.0), older)
        table.remove(older)
        self.assertIs(table.quietest(10.0, 5.0, "alice"), old)


class StreamTests(SynchronousTestCase):
    """Events, their ids, and resuming after a lost connection."""

    def test_event_ids(self) -> None:
        """Ids name the stream and the seq; others are not ours."""
        self.assertEqual(parse_event_id("3-17"), (3, 17))
        for bad in ("17", "a-1", "1-", "-1", "1-2-3"):
            self.assertIsNone(parse_event_id(bad))
        self.assertEqual(event_frame(2, 0, None), b"id: 2-0\ndata:\n\n")

    def test_resume_gets_the_rest_then_live(self) -> None:
        """
        A stream whose connection was lost is shown on a new one from the
        last id the client saw: the kept events after it, then live ones.
        """
        session = SessionTable().create(ALICE, "2025-11-25", 0.0)
        stream = session.open_stream()
        first = FakeChannel()
        session.attach(stream, first, 0)
        session.emit(stream, {"n": 1})
        first.lose()
        session.emit(stream, {"n": 2})
        session.emit(stream, {"n": 3})
        second = FakeChannel()
        session.attach(stream, second, 1)
        session.emit(stream, {"n": 4})
        self.assertEqual(len(first.frames), 1)
        self.assertEqual(
            [f.split(b"\n")[0] for f in second.frames],
            [b"id: 1-2", b"id: 1-3", b"id: 1-4"],
        )
        session.finish(stream)
        self.assertFalse(second.open)
        self.assertEqual(len(list(session.since(1, 3))), 1)

    def test_stalled_client_skips_progress(self) -> None:
        """While the transport has paused the stream, droppable messages are skipped."""
        session = SessionTable().create(ALICE, "2025-11-25", 0.0)
        stream = session.open_stream()
        channel = FakeChannel()
        session.attach(stream, channel, 0)
        channel.producer.pauseProducing()
        session.emit(stream, {"progress": 1}, droppable=True)
        session.emit(stream, {"result": 1})
        channel.producer.resumeProducing()
        session.emit(stream, {"progress": 2}, droppable=True)
        self.assertEqual(
            [f.split(b"\n")[0] for f in channel.frames], [b"id: 1-1", b"id: 1-2"]
        )
        self.assertIn(b'"result"', channel.frames[0])

    def test_replay_is_bounded(self) -> None:
        """The kept events stay under MCP_REPLAY_BYTES."""
        session = SessionTable().create(ALICE, "2025-11-25", 0.0)
        stream = session.standalone
        for _ in range(100):
            session.emit(stream, {"pad": "x" * (MCP_REPLAY_BYTES // 50)})
        self.assertLessEqual(session.replay_bytes, MCP_REPLAY_BYTES)
        self.assertEqual(session.replay[-1][1], 100)


class LostStreamTests(SynchronousTestCase):
    """A call whose stream was lost is let go after a grace, unless resumed."""

    def test_let_go_after_the_grace(self) -> None:
        """
        Only a call whose stream has shown on no connection for the grace
        is cancelled; a resume in time restarts the count.
        """
        now = [0.0]
        session = SessionTable(lambda: now[0]).create(ALICE, "2025-11-25", 0.0)
        cancelled: list[str] = []

        class Call:
            def __init__(self, key: str) -> None:
                self.key = key

            def cancel(self) -> None:
                cancelled.append(self.key)

        for key in ("lost", "resumed", "watched"):
            session.calls[key] = Call(key)  # type: ignore[assignment]
        channels = {}
        for key in ("lost", "resumed", "watched"):
            stream = session.open_stream(key)
            channels[key] = FakeChannel()
            session.attach(stream, channels[key], 0)  # type: ignore[arg-type]
        channels["lost"].lose()
        channels["resumed"].lose()
        now[0] = 5.0
        session.attach(session.streams[2], FakeChannel(), 0)  # type: ignore[arg-type]
        self.assertEqual(session.let_go(9.0, 5.0), ["lost"])
        self.assertEqual(cancelled, ["lost"])
