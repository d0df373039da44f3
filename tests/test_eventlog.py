"""
The stream contract of SPEC §9: ordered seqs, bounded retention, gap,
resume with no loss and no repeat, and a slow follower that never makes
memory grow.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import ApiError
from sandboxd.eventlog import EventLog, forget_closed
from sandboxd.web.sse import Follower, resume_point


class FakeChannel:
    """Just enough of SSEChannel to watch what a follower writes."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.open = True
        self.done: Deferred[None] = Deferred()
        self.producer: Any = None
        self.disconnect: list[Any] = []

    def send(self, event: str, data: Any, id: int | None = None) -> None:
        self.frames.append(f"{event}:{data}".encode())

    def write_raw(self, data: bytes) -> None:
        self.frames.append(data)

    def register_producer(self, producer: Any, on_stop: Any = None) -> None:
        self.producer = producer

    def on_disconnect(self, callback: Any) -> None:
        self.disconnect.append(callback)

    def close(self) -> None:
        self.open = False
        self.done.callback(None)

    def ids(self) -> list[int]:
        return [
            int(f.split(b"\n")[0][4:]) for f in self.frames if f.startswith(b"id: ")
        ]


class EventLogTests(SynchronousTestCase):
    """Retention and paging."""

    def test_seq_and_since(self) -> None:
        """seq starts at 1; since(N) returns seq > N in order."""
        log = EventLog(1000)
        for i in range(5):
            log.append("stdout", {"data": str(i)})
        gap, events = log.since(2)
        self.assertIsNone(gap)
        self.assertEqual([e.seq for e in events], [3, 4, 5])

    def test_bounded_with_gap(self) -> None:
        """Old events go first; asking for dropped ones reports the gap."""
        log = EventLog(100)
        for i in range(50):
            log.append("stdout", {"data": "x" * 10, "i": i})
        self.assertLessEqual(log.retained_bytes, 100)
        self.assertGreater(log.dropped_bytes, 0)
        gap, events = log.since(0)
        assert gap is not None
        self.assertEqual(gap, (1, events[0].seq - 1))
        self.assertEqual(events[-1].seq, 50)

    def test_since_every_point_of_a_trimmed_log(self) -> None:
        """since(N) is exactly the retained seqs above N, for N before, in and past the log."""
        log = EventLog(200)
        for i in range(50):
            log.append("stdout", {"i": i})
        kept = [e.seq for e in log.since(0)[1]]
        first = kept[0]
        self.assertGreater(first, 1)
        self.assertEqual(kept, list(range(first, 51)))
        for after in (1, first - 1, first, 30, 49, 50):
            gap, events = log.since(after)
            self.assertEqual([e.seq for e in events], [s for s in kept if s > after])
            self.assertEqual(gap, (after + 1, first - 1) if after + 1 < first else None)

    def test_since_reads_only_what_it_returns(self) -> None:
        """
        since(N) near the end of a long log looks at the events it returns,
        not the whole log: a live follower asks after every event, and a
        burst would cost its length times the log's on the reactor.
        """
        log = EventLog(10**9)
        for i in range(10_000):
            log.append("stdout", {"i": i})
        seen = [0]

        class Counting(deque):  # type: ignore[type-arg]
            def __iter__(self) -> Any:
                for e in super().__iter__():
                    seen[0] += 1
                    yield e

            def __reversed__(self) -> Any:
                for e in super().__reversed__():
                    seen[0] += 1
                    yield e

        log._events = Counting(log._events)
        self.assertEqual(
            [e.seq for e in log.since(9_995)[1]], list(range(9_996, 10_001))
        )
        self.assertLessEqual(seen[0], 6)

    def test_newest_always_kept(self) -> None:
        """A single event larger than the bound is still kept (the exit survives)."""
        log = EventLog(10)
        log.append("stdout", {"data": "y" * 100})
        log.append("exit", {"exit_code": 0})
        self.assertEqual([e.event for e in log.since(0)[1]], ["exit"])

    def test_resume_point(self) -> None:
        """after wins over Last-Event-ID; junk is a 400."""
        self.assertEqual(resume_point({"after": "7"}, {"last-event-id": "3"}), 7)
        self.assertEqual(resume_point({}, {"last-event-id": "3"}), 3)
        self.assertEqual(resume_point({}, {}), 0)
        with self.assertRaises(ApiError):
            resume_point({"after": "x"}, {})
        with self.assertRaises(ApiError):
            resume_point({"after": "-1"}, {})

    def test_resume_point_error_names_the_header(self) -> None:
        """A bad Last-Event-ID is reported as that header, not as a parameter the client never sent."""
        with self.assertRaises(ApiError) as caught:
            resume_point({}, {"last-event-id": "abc"})
        self.assertIn("'Last-Event-ID' must be an integer", str(caught.exception))
        with self.assertRaises(ApiError) as caught:
            resume_point({"after": "abc"}, {})
        self.assertIn("'after' must be an integer", str(caught.exception))


class FollowerTests(SynchronousTestCase):
    """A follower serves replay then live events, exactly once each."""

    def test_replay_then_live_then_close(self) -> None:
        """Events after the resume point, then live ones, then the stream ends at close."""
        log = EventLog(10_000)
        for i in range(3):
            log.append("stdout", {"i": i})
        channel = FakeChannel()
        Follower(log, channel, after=1)  # type: ignore[arg-type]
        log.append("stdout", {"i": 3})
        log.append("exit", {"exit_code": 0})
        log.close()
        self.assertEqual(channel.ids(), [2, 3, 4, 5])
        self.assertFalse(channel.open)

    def test_finished_log_replays_and_ends(self) -> None:
        """Following a closed log sends what is kept and ends at once."""
        log = EventLog(10_000)
        log.append("exit", {"exit_code": 3})
        log.close()
        channel = FakeChannel()
        Follower(log, channel, after=0)  # type: ignore[arg-type]
        self.assertEqual(channel.ids(), [1])
        self.assertFalse(channel.open)

    def test_paused_follower_catches_up_without_repeats(self) -> None:
        """While paused nothing is written; on resume it catches up from the log, in order."""
        log = EventLog(10_000)
        channel = FakeChannel()
        follower = Follower(log, channel, after=0)  # type: ignore[arg-type]
        log.append("stdout", {"i": 1})
        follower.pauseProducing()
        for i in range(2, 6):
            log.append("stdout", {"i": i})
        self.assertEqual(channel.ids(), [1])
        follower.resumeProducing()
        self.assertEqual(channel.ids(), [1, 2, 3, 4, 5])

    def test_paused_by_a_write_stops_the_catch_up(self) -> None:
        """
        A backlog is written only until a write pauses the follower (the
        connection is full): the rest stays in the log, then follows on
        resume, in order, and the stream ends only after it.
        """
        log = EventLog(10_000)
        channel = FakeChannel()
        follower = Follower(log, channel, after=0)  # type: ignore[arg-type]
        follower.pauseProducing()
        for i in range(6):
            log.append("stdout", {"i": i})
        log.close()
        written = channel.write_raw

        def full_after_two(data: bytes) -> None:
            written(data)
            if len(channel.frames) == 2:
                follower.pauseProducing()

        channel.write_raw = full_after_two  # type: ignore[method-assign]
        follower.resumeProducing()
        self.assertEqual(channel.ids(), [1, 2])
        self.assertTrue(channel.open)
        follower.resumeProducing()
        self.assertEqual(channel.ids(), [1, 2, 3, 4, 5, 6])
        self.assertFalse(channel.open)

    def test_paused_past_retention_gets_gap(self) -> None:
        """A follower paused while events were dropped resumes with a gap event."""
        log = EventLog(60)
        channel = FakeChannel()
        follower = Follower(log, channel, after=0)  # type: ignore[arg-type]
        follower.pauseProducing()
        for i in range(20):
            log.append("stdout", {"i": i})
        follower.resumeProducing()
        self.assertTrue(any(f.startswith(b"gap:") for f in channel.frames))
        self.assertEqual(channel.ids()[-1], 20)

    def test_resume_id_of_another_log_starts_over(self) -> None:
        """
        An id past the log's end (from a log before a restart) gets the
        log's events from its start, not the ones after that id only.
        """
        log = EventLog(10_000)
        log.append("created", {"i": 0})
        self.assertEqual([e.seq for e in log.since(30)[1]], [1])
        channel = FakeChannel()
        Follower(log, channel, after=30)  # type: ignore[arg-type]
        for i in range(1, 5):
            log.append("created", {"i": i})
        self.assertEqual(channel.ids(), [1, 2, 3, 4, 5])

    def test_resume_id_before_the_start_gets_one_gap(self) -> None:
        """
        A log numbered from a later start answers an id of an earlier log
        with one gap, then its own events; no resume point is no gap.
        """
        log = EventLog(10_000, start=1000)
        self.assertEqual(log.since(0), (None, []))
        self.assertEqual(log.since(10), ((11, 1000), []))
        channel = FakeChannel()
        Follower(log, channel, after=10)  # type: ignore[arg-type]
        log.append("created", {"i": 1})
        log.append("created", {"i": 2})
        gaps = [f for f in channel.frames if f.startswith(b"gap:")]
        self.assertEqual(gaps, [b"gap:{'from': 11, 'to': 1000}"])
        self.assertEqual(channel.ids(), [1001, 1002])
        fresh = FakeChannel()
        Follower(log, fresh, after=0)  # type: ignore[arg-type]
        self.assertEqual(fresh.ids(), [1001, 1002])
        self.assertFalse(any(f.startswith(b"gap:") for f in fresh.frames))

    def test_disconnect_unsubscribes(self) -> None:
        """After the client goes, new events are not written anywhere."""
        log = EventLog(10_000)
        channel = FakeChannel()
        Follower(log, channel, after=0)  # type: ignore[arg-type]
        for callback in channel.disconnect:
            callback()
        log.append("stdout", {"i": 1})
        self.assertEqual(channel.frames, [])


def _logs(*sizes: int | None) -> dict[str, EventLog]:
    """Logs named a, b, c ... holding one event of each size; None: still open."""
    table = {}
    for name, size in zip("abcdefgh", sizes, strict=False):
        log = EventLog(1000)
        log.append("x", None, size=size or 1)
        if size is not None:
            log.close()
        table[name] = log
    return table


class ForgetClosedTests(SynchronousTestCase):
    """What is kept of closed logs is bounded by count and by bytes."""

    def forget(self, table: dict[str, EventLog], items: int, size: int) -> list[str]:
        forget_closed(table, lambda log: log, lambda k: table.pop(k), items, size)
        return sorted(table)

    def test_within_both_bounds(self) -> None:
        """Nothing is forgotten within both bounds."""
        self.assertEqual(self.forget(_logs(10, 10, 10), 3, 30), ["a", "b", "c"])

    def test_past_the_count(self) -> None:
        """Past the count, the oldest closed go first; open ones stay."""
        self.assertEqual(
            self.forget(_logs(None, 10, 10, None), 3, 100), ["a", "c", "d"]
        )

    def test_past_the_bytes(self) -> None:
        """Past the bytes, the oldest closed go until the rest fit."""
        self.assertEqual(self.forget(_logs(50, 30, 20, None), 100, 60), ["b", "c", "d"])
        self.assertEqual(self.forget(_logs(50, 30, 20), 100, 20), ["c"])

    def test_newest_closed_stays(self) -> None:
        """The newest closed log stays, whatever it weighs."""
        self.assertEqual(self.forget(_logs(10, 500, None), 1, 100), ["b", "c"])
