"""
Terminal sessions without a real PTY (SPEC §7.5, §8): scrollback and
offsets, UTF-8 split across reads, fan-out, flow control, idle reaping.
"""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.terminals.session import PtySession, Scrollback, SpawnRequest
from sandboxd.terminals.table import ShareTaken, TerminalTable, TooManySessions


class FakePTY:
    """What a session uses of Twisted's PTY process transport."""

    pid = 0  # never signal a real process

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.paused = False
        self.producer: Any = None
        self.lost = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def fileno(self) -> int:
        raise OSError("no descriptor")

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        self.producer = producer

    def loseConnection(self) -> None:
        self.lost = True


class FakeClient:
    """Records what the session sends a client."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.ended: dict[str, Any] | None = None
        self.input_paused = False
        self.dropped = False

    def send_frame(self, frame: bytes) -> None:
        self.frames.append(json.loads(frame))

    def session_ended(self, frame: bytes) -> None:
        self.ended = json.loads(frame)

    def pause_input(self) -> None:
        self.input_paused = True

    def resume_input(self) -> None:
        self.input_paused = False

    def drop_slow(self) -> None:
        self.dropped = True

    def output(self) -> str:
        return "".join(f["data"] for f in self.frames if f["type"] == "output")


def make_session(**kwargs: Any) -> tuple[PtySession, FakePTY, Clock]:
    clock = Clock()
    session = PtySession(id="s1", owner="me", clock=clock, cols=80, rows=24, **kwargs)
    pty = FakePTY()
    session.started(pty)
    return session, pty, clock


class ScrollbackTests(SynchronousTestCase):
    """The bounded ring addressed by absolute offsets."""

    def test_keeps_last_bytes(self) -> None:
        """Past its limit the ring forgets the oldest bytes, not the offsets."""
        ring = Scrollback(limit=8)
        ring.append(b"0123456789")
        ring.append(b"ab")
        self.assertEqual((ring.start, ring.end, bytes(ring.data)), (4, 12, b"456789ab"))

    def test_since_offset(self) -> None:
        """``since(N)`` is exactly what followed byte N while it is kept;
        everything kept when N was forgotten."""
        ring = Scrollback(limit=8)
        ring.append(b"0123456789")
        self.assertEqual(ring.since(7, ring.end), (7, b"789"))
        self.assertEqual(ring.since(1, ring.end), (2, b"23456789"))
        self.assertEqual(ring.since(None, ring.end), (2, b"23456789"))
        self.assertEqual(ring.since(99, ring.end), (10, b""))

    def test_since_skips_cut_character(self) -> None:
        """A multi-byte character cut by trimming is skipped, not garbled."""
        ring = Scrollback(limit=4)
        ring.append("xé€".encode())  # 78 c3a9 e282ac
        begin, data = ring.since(None, ring.end)
        self.assertEqual(data.decode(), "€")
        self.assertEqual(begin, 3)


class OutputTests(SynchronousTestCase):
    """Output decoding, framing and fan-out."""

    def test_utf8_split_across_reads(self) -> None:
        """A character split across reads is sent whole, once; offsets
        count bytes and stay on character boundaries."""
        session, _, _ = make_session()
        client = FakeClient()
        session.attach(client)
        euro = "€".encode()
        session.output(b"a" + euro[:1])
        session.output(euro[1:2])
        session.output(euro[2:] + b"b")
        outputs = [f for f in client.frames if f["type"] == "output"]
        self.assertEqual(
            [(f["data"], f["offset"]) for f in outputs], [("a", 0), ("€b", 1)]
        )
        self.assertEqual(session.emitted, 5)

    def test_invalid_utf8_is_replaced(self) -> None:
        """Bytes that are not UTF-8 become U+FFFD: frames stay valid text."""
        session, _, _ = make_session()
        client = FakeClient()
        session.attach(client)
        session.output(b"\xff\xfeok")
        self.assertEqual(client.output(), "\ufffd\ufffdok")

    def test_fan_out(self) -> None:
        """Every attached client gets the same output."""
        session, _, _ = make_session()
        one, two = FakeClient(), FakeClient()
        session.attach(one)
        session.attach(two)
        session.output(b"hello")
        self.assertEqual(one.output(), "hello")
        self.assertEqual(two.output(), "hello")

    def test_started_then_scrollback(self) -> None:
        """A late client gets ``started``, then the scrollback with its offset."""
        session, _, _ = make_session()
        session.pid = 42
        session.output(b"before ")
        client = FakeClient()
        session.attach(client)
        session.output(b"after")
        self.assertEqual(
            client.frames[0],
            {"type": "event", "event": "started", "session_id": "s1", "pid": 42},
        )
        self.assertEqual(
            client.frames[1],
            {"type": "output", "data": "before ", "offset": 0, "end": 7},
        )
        self.assertEqual(
            client.frames[2],
            {"type": "output", "data": "after", "offset": 7, "end": 12},
        )

    def test_reconnect_with_offset(self) -> None:
        """``offset=N`` replays exactly what followed byte N."""
        session, _, _ = make_session()
        session.output(b"one two three")
        client = FakeClient()
        session.attach(client, offset=4)
        self.assertEqual(
            client.frames[1],
            {"type": "output", "data": "two three", "offset": 4, "end": 13},
        )

    def test_resume_after_output_not_utf8(self) -> None:
        """
        A frame's ``end`` counts the bytes, not the text that stands for
        them: resumed from it after output that is not UTF-8 (two bytes, two
        U+FFFD, six bytes as text), nothing that followed is skipped.
        """
        session, _, _ = make_session()
        first = FakeClient()
        session.attach(first)
        session.output(b"bad\xff\xfe")
        session.output(b"\r\nnext")
        frame = first.frames[1]
        self.assertEqual((frame["data"], frame["end"]), ("bad\ufffd\ufffd", 5))
        again = FakeClient()
        session.attach(again, offset=frame["end"])
        self.assertEqual(again.frames[1]["data"], "\r\nnext")

    def test_scrollback_bounded(self) -> None:
        """Only the last 64 KiB is replayed, however much was printed."""
        session, _, _ = make_session()
        for _ in range(100):
            session.output(b"x" * 4000)
        client = FakeClient()
        session.attach(client)
        replay = client.frames[1]
        self.assertEqual(len(replay["data"]), 64 * 1024)
        self.assertEqual(replay["offset"], 400000 - 64 * 1024)
        self.assertEqual(len(session.scrollback.data), 64 * 1024)

    def test_client_cap(self) -> None:
        """A session refuses clients beyond its maximum."""
        session, _, _ = make_session(max_clients=2)
        self.assertTrue(session.attach(FakeClient()))
        self.assertTrue(session.attach(FakeClient()))
        self.assertFalse(session.attach(FakeClient()))


class FlowControlTests(SynchronousTestCase):
    """A slow client pauses the PTY, and is dropped if it stays slow."""

    def test_pause_until_every_client_drains(self) -> None:
        """The PTY is paused while any client is paused, resumed when none is."""
        session, pty, _ = make_session()
        one, two = FakeClient(), FakeClient()
        session.attach(one)
        session.attach(two)
        session.pause(one)
        session.pause(two)
        self.assertTrue(pty.paused)
        session.resume(one)
        self.assertTrue(pty.paused)
        session.resume(two)
        self.assertFalse(pty.paused)

    def test_slow_client_dropped(self) -> None:
        """A client paused past the limit is detached and dropped; the
        others carry on and the PTY resumes."""
        session, pty, clock = make_session(slow_client_seconds=10)
        slow, fine = FakeClient(), FakeClient()
        session.attach(slow)
        session.attach(fine)
        session.pause(slow)
        clock.advance(9)
        self.assertFalse(slow.dropped)
        clock.advance(1)
        self.assertTrue(slow.dropped)
        self.assertFalse(pty.paused)
        self.assertEqual(session.clients, [fine])

    def test_detach_while_paused_resumes(self) -> None:
        """A paused client that leaves no longer holds the PTY."""
        session, pty, clock = make_session()
        client = FakeClient()
        session.attach(client)
        session.pause(client)
        session.detach(client)
        self.assertFalse(pty.paused)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_input_throttle(self) -> None:
        """When the shell stops reading input, clients stop being read."""
        session, pty, _ = make_session()
        client = FakeClient()
        session.attach(client)
        pty.producer.pauseProducing()
        self.assertTrue(client.input_paused)
        late = FakeClient()
        session.attach(late)
        self.assertTrue(late.input_paused)
        pty.producer.resumeProducing()
        self.assertFalse(client.input_paused)
        self.assertFalse(late.input_paused)


class LifecycleTests(SynchronousTestCase):
    """Exit, close and idle reaping."""

    def test_exit_reported(self) -> None:
        """When the shell ends, every client gets ``exited`` with the code."""
        session, _, _ = make_session()
        client = FakeClient()
        session.attach(client)
        session.shell_exited(Failure(ProcessTerminated(3)))
        session.shell_ended(Failure(ProcessTerminated(3)))
        self.assertEqual(
            client.ended,
            {"type": "event", "event": "exited", "session_id": "s1", "exit_code": 3},
        )
        self.assertEqual(session.clients, [])
        self.assertFalse(session.describe()["alive"])

    def test_attach_after_exit(self) -> None:
        """A client attaching to an ended session gets the output and exit."""
        session, _, _ = make_session()
        session.output(b"bye")
        session.shell_ended(Failure(ProcessDone(0)))
        client = FakeClient()
        session.attach(client)
        self.assertEqual(client.output(), "bye")
        self.assertEqual(client.ended and client.ended["exit_code"], 0)

    def test_close_waits_for_end(self) -> None:
        """close() fires once the shell has ended; KILL follows the grace."""
        session, pty, clock = make_session(kill_grace=5)
        d = session.close()
        self.assertNoResult(d)
        clock.advance(5)
        self.assertTrue(pty.lost)
        session.shell_ended(Failure(ProcessTerminated(signal=9)))
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(session.exit_code, -9)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_idle_reaped(self) -> None:
        """With no client and no I/O for the idle timeout, the session ends."""
        session, _, clock = make_session(idle_timeout=1800, kill_grace=5)
        clock.advance(1000)
        session.output(b"activity")
        clock.advance(1000)
        self.assertFalse(session._closing)
        clock.advance(800)
        self.assertTrue(session._closing)

    def test_not_idle_while_attached(self) -> None:
        """An attached client keeps a quiet session alive."""
        session, _, clock = make_session(idle_timeout=100)
        client = FakeClient()
        session.attach(client)
        clock.advance(1000)
        self.assertFalse(session._closing)
        session.detach(client)
        clock.advance(99)
        self.assertFalse(session._closing)
        clock.advance(100)
        self.assertTrue(session._closing)
        session.shell_ended(Failure(ProcessTerminated(signal=1)))


class TableTests(SynchronousTestCase):
    """The session table and its cap."""

    def spawn(self, reactor: Any, session: PtySession, spec: SpawnRequest) -> None:
        session.started(FakePTY())

    def test_cap_counts_live_sessions(self) -> None:
        """At the cap creation fails; an ended session frees its slot."""
        table = TerminalTable(Clock())
        spec = SpawnRequest("/bin/sh", ["sh"], {}, "/", 80, 24)
        first = table.create("me", spec, 2, None, spawn=self.spawn)
        table.create("me", spec, 2, None, spawn=self.spawn)
        self.assertRaises(
            TooManySessions, table.create, "me", spec, 2, None, spawn=self.spawn
        )
        first.shell_ended(Failure(ProcessDone(0)))
        table.create("me", spec, 2, None, spawn=self.spawn)
        self.assertNotIn(first.id, table.sessions)

    def test_share_of_the_cap(self) -> None:
        """
        Past its share one owner's creation fails while another's still
        succeeds, and an ended session gives its owner the slot back.
        """
        table = TerminalTable(Clock())
        spec = SpawnRequest("/bin/sh", ["sh"], {}, "/", 80, 24)
        first = table.create("me", spec, 4, None, spawn=self.spawn, mine=2)
        table.create("me", spec, 4, None, spawn=self.spawn, mine=2)
        with self.assertRaises(ShareTaken):
            table.create("me", spec, 4, None, spawn=self.spawn, mine=2)
        table.create("you", spec, 4, None, spawn=self.spawn, mine=2)
        first.shell_ended(Failure(ProcessDone(0)))
        table.create("me", spec, 4, None, spawn=self.spawn, mine=2)

    def test_stop_waits_for_sessions_still_ending(self) -> None:
        """
        A session closed before the stop (a call's limit ended it), whose
        shell's jobs still have their hang-up's grace, is waited for by
        the stop as a listed one is: it fires once the shell has ended.
        """
        table = TerminalTable(Clock())
        spec = SpawnRequest("/bin/sh", ["sh"], {}, "/", 80, 24)
        first = table.create("me", spec, 2, None, spawn=self.spawn)
        table.close(first.id)
        self.assertNotIn(first.id, table.sessions)
        waits = table.close_all()
        self.assertEqual(len(waits), 1)
        fired: list[object] = []
        waits[0].addCallback(fired.append)
        self.assertEqual(fired, [])
        first.shell_ended(Failure(ProcessDone(0)))
        self.assertEqual(fired, [None])
        self.assertEqual(table.ending, set())


class KeystrokeTests(SynchronousTestCase):
    """Input reaches the terminal at once when it can, and always in order."""

    def test_immediate_when_nothing_queued(self) -> None:
        """A keystroke is written straight to the terminal's descriptor."""
        session, pty, _ = make_session()
        read_end, write_end = os.pipe()
        self.addCleanup(os.close, read_end)
        self.addCleanup(os.close, write_end)
        pty.dataBuffer, pty._tempDataBuffer = b"", []  # type: ignore[attr-defined]
        pty.fileno = lambda: write_end  # type: ignore[method-assign]
        session.write(b"l")
        self.assertEqual((os.read(read_end, 10), pty.written), (b"l", []))

    def test_queued_input_keeps_order(self) -> None:
        """With input already queued, new input queues behind it."""
        session, pty, _ = make_session()
        pty.dataBuffer, pty._tempDataBuffer = b"", [b"earlier"]  # type: ignore[attr-defined]
        session.write(b"l")
        self.assertEqual(pty.written, [b"l"])
