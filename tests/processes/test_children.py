"""
The process machinery (:mod:`sandboxd.processes`): head-and-tail caps, the
one ProcessProtocol, tree kills, and :func:`run_collect` with real children.
"""

from __future__ import annotations

import errno
import math
import os
import pwd
import secrets
import signal
import subprocess
import sys
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import (
    CancelledError,
    Deferred,
    DeferredList,
    ensureDeferred,
    inlineCallbacks,
)
from twisted.internet.task import Clock, deferLater
from twisted.trial.unittest import SynchronousTestCase, TestCase

from sandboxd import processes
from sandboxd.processes import posix_spawn as spawn
from sandboxd.processes import spawning
from sandboxd.processes import tree as proctree
from sandboxd.processes.child import HeadTail, share
from sandboxd.processes.command import RunAs
from sandboxd.processes.run import run_collect
from tests.helpers import ReadyPipe, kill_marked, marked_pids, until_exited

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}

#: The table these tests' children belong to (a daemon has its own).
CHILDREN = processes.ChildTable()


#: How long a test waits for the children it started to show up: they run
#: at the children's nice value (10), and beside the suite's other workers
#: a nice-10 process may wait seconds for a CPU before it execs.
START_SECONDS = 60.0


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


@inlineCallbacks
def wait_for_marked(marker: str, count: int, command: str | None = None) -> Any:
    """
    Until ``count`` processes carry ``marker`` (only those running
    ``command``, when given), at most :data:`START_SECONDS`.
    """
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        pids = marked_pids(marker)
        if command is not None:
            pids = [pid for pid in pids if _comm(pid) == command]
        if len(pids) == count:
            return
        yield deferLater(reactor, 0.02, lambda: None)


class HeadTailTests(SynchronousTestCase):
    """The cap keeps the head and the tail and counts what it drops."""

    def test_under_cap(self) -> None:
        """Output within the cap is kept whole and not marked truncated."""
        sink = HeadTail(10)
        sink.write(b"abc")
        sink.write(b"def")
        self.assertEqual(sink.value(), b"abcdef")
        self.assertFalse(sink.truncated)
        self.assertEqual(sink.dropped_bytes, 0)

    def test_head_and_tail(self) -> None:
        """Past the cap, the first and last halves survive and the middle is counted."""
        sink = HeadTail(10)
        for chunk in (b"01234", b"56789", b"abcdefghij", b"XYZ"):
            sink.write(chunk)
        self.assertTrue(sink.truncated)
        self.assertEqual(sink.dropped_bytes, 23 - 10)
        self.assertEqual(sink.value(marker=False), b"01234" + b"ijXYZ")
        # A cap smaller than the marker line: the cap still wins (issue 22).
        self.assertEqual(len(sink.value()), 10)
        sink = HeadTail(100)
        for chunk in (b"0" * 50, b"x" * 500, b"9" * 50):
            sink.write(chunk)
        value = sink.value()
        self.assertEqual(len(value), 100)
        self.assertIn(f"[... {sink.dropped_bytes} bytes dropped ...]".encode(), value)
        self.assertTrue(value.startswith(b"0") and value.endswith(b"9"))

    def test_share_fits_a_budget_together(self) -> None:
        """
        ``share`` cuts two outputs to one budget, markers included: a small
        one stays whole, the big one keeps its head and tail in the rest,
        and every byte is either kept or counted as dropped.
        """
        small, big = HeadTail(10_000), HeadTail(10_000)
        small.write(b"s" * 100)
        big.write(b"H" + b"x" * 5_000 + b"T")
        share([small, big], 1_000)
        self.assertEqual(small.value(), b"s" * 100)
        value = big.value()
        self.assertLessEqual(len(small.value()) + len(value), 1_000)
        self.assertTrue(value.startswith(b"Hx") and value.endswith(b"xT"))
        marker = f"\n[... {big.dropped_bytes} bytes dropped ...]\n".encode()
        self.assertIn(marker, value)
        self.assertEqual(len(value) - len(marker) + big.dropped_bytes, 5_002)
        # Within the budget already: untouched.
        fits = HeadTail(10_000)
        fits.write(b"abc")
        share([fits], 1_000)
        self.assertEqual((fits.value(), fits.dropped_bytes), (b"abc", 0))

    def test_many_small_writes_stay_bounded(self) -> None:
        """A million one-byte writes leave at most ``cap`` bytes held."""
        sink = HeadTail(100)
        for i in range(100_000):
            sink.write(bytes([48 + i % 10]))
        self.assertEqual(len(sink.value(marker=False)), 100)
        self.assertEqual(sink.dropped_bytes, 100_000 - 100)
        self.assertTrue(sink.value(marker=False).endswith(b"6789"))

    def test_small_writes_share_a_buffer(self) -> None:
        """
        One-byte writes are gathered into one buffer each side, not kept
        as an object a byte (which would hold many times the cap).
        """
        sink = HeadTail(10_000)
        for i in range(50_000):
            sink.write(bytes([48 + i % 10]))
        self.assertLessEqual(len(sink._head) + len(sink._tail), 2)
        self.assertEqual(len(sink.value(marker=False)), 10_000)
        self.assertEqual(sink.dropped_bytes, 40_000)

    def test_big_chunks_kept_uncopied(self) -> None:
        """A big chunk within the head is kept as it came, and comes back whole."""
        chunks = [bytes([65 + i]) * 64 * 1024 for i in range(4)]
        sink = HeadTail(1024 * 1024)
        for chunk in chunks:
            sink.write(chunk)
        self.assertTrue(all(a is b for a, b in zip(sink._head, chunks, strict=True)))
        self.assertEqual(sink.value(), b"".join(chunks))

    def test_a_callers_bytearray_left_alone(self) -> None:
        """
        A big chunk that came as a ``bytearray`` (the kernel hub's output)
        is kept, never grown by small writes after it nor trimmed in place
        when the tail moves on: it may be kept elsewhere too.
        """
        chunk = bytearray(b"a" * 8192)
        sink = HeadTail(40_000)
        sink.write(chunk)
        sink.write(b"b" * 10)
        sink.write(b"h" * 11_798)  # the head is full
        self.assertEqual(chunk, b"a" * 8192)
        tail_chunk = bytearray(b"c" * 16_000)
        sink.write(tail_chunk)
        sink.write(b"d" * 8000)  # 4000 bytes of it fall out of the tail
        self.assertEqual(tail_chunk, b"c" * 16_000)
        self.assertEqual(
            sink.value(marker=False),
            b"a" * 8192 + b"b" * 10 + b"h" * 11_798 + b"c" * 12_000 + b"d" * 8000,
        )

    def test_one_huge_write(self) -> None:
        """A single write larger than the cap keeps its own tail."""
        sink = HeadTail(8)
        sink.write(b"A" * 4 + b"B" * 100 + b"CDEF")
        self.assertEqual(sink.value(marker=False), b"AAAACDEF")
        self.assertEqual(sink.dropped_bytes, 100)


class FakeTransport:
    """Enough of a process transport for the protocol's logic."""

    def __init__(self, pid: int = 424242) -> None:
        self.pid = pid
        self.paused = 0
        self.resumed = 0
        self.lost = 0
        self.written: list[bytes] = []
        self.stdin_closed = False

    def pauseProducing(self) -> None:
        self.paused += 1

    def resumeProducing(self) -> None:
        self.resumed += 1

    def loseConnection(self) -> None:
        self.lost += 1

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def closeStdin(self) -> None:
        self.stdin_closed = True


class Exited:
    """A stand-in for ProcessDone/ProcessTerminated."""

    def __init__(self, code: int | None = 0, sig: int | None = None) -> None:
        self.value = self
        self.exitCode = code
        self.signal = sig


class ChildProtocolTests(SynchronousTestCase):
    """The protocol logic, driven by a fake transport and a fake clock."""

    def make(
        self, **kwargs: Any
    ) -> tuple[processes.Child, Clock, list[tuple[int, bytes]], list[str]]:
        clock = Clock()
        got: list[tuple[int, bytes]] = []
        child = processes.Child(
            clock, lambda fd, data: got.append((fd, data)), **kwargs
        )
        kills: list[str] = []
        child.kill = lambda reason="killed": kills.append(reason) or Deferred()  # type: ignore[method-assign]
        child.makeConnection(FakeTransport())  # type: ignore[arg-type]
        child.started()
        self.addCleanup(child.table.live.discard, child)
        return child, clock, got, kills

    def test_exit_then_pipes_closed_shortly_after(self) -> None:
        """processExited is the result; the pipes close after a quiet grace, not never."""
        child, clock, got, _ = self.make()
        child.childDataReceived(1, b"hello\n")
        child.processExited(Exited(0))  # type: ignore[arg-type]
        self.assertEqual(self.successResultOf(child.exited), 0)
        self.assertEqual(child.transport.lost, 0)
        clock.advance(processes.child.EXIT_DRAIN_SECONDS / 2)
        child.childDataReceived(1, b"late\n")  # resets the quiet grace
        clock.advance(processes.child.EXIT_DRAIN_SECONDS * 0.75)
        self.assertEqual(child.transport.lost, 0)
        clock.advance(processes.child.EXIT_DRAIN_SECONDS)
        self.assertEqual(child.transport.lost, 1)
        self.assertEqual(got, [(1, b"hello\n"), (1, b"late\n")])

    def test_leftovers_looked_for_while_one_execs(self) -> None:
        """
        Signalling an exited command's leftovers looks again while one of
        them is mid-exec (a slow exec on a busy machine outlasts one look),
        signals each found once, and stops at its bound.
        """
        child, clock, _, _ = self.make()
        child.pid = 4242
        # Looks: nothing readable yet, still exec'ing twice, then found.
        script = [(set(), True), (set(), True), (set(), True), ({77}, False)]
        calls: list[frozenset[int]] = []

        def look(
            pid: int,
            marker: str | None,
            sig: int,
            done: frozenset[int] = frozenset(),
            window: object = None,
        ) -> tuple[set[int], bool]:
            calls.append(done)
            return script.pop(0) if script else (set(), True)

        self.patch(processes.child, "signal_leftovers", look)
        self.assertEqual(processes.signal_exited_tree(child, signal.SIGTERM), 0)
        for _ in range(10):
            clock.advance(processes.child.LEFTOVER_SETTLE_SECONDS)
        self.assertEqual(len(calls), 4)
        self.assertEqual(clock.getDelayedCalls(), [])
        # Mid-exec for ever: it gives up at its bound.
        calls.clear()
        processes.signal_exited_tree(child, signal.SIGTERM)
        clock.advance(processes.child.LEFTOVER_SETTLE_LIMIT * 2)
        while clock.getDelayedCalls():
            clock.advance(processes.child.LEFTOVER_SETTLE_SECONDS)
        looks = (
            processes.child.LEFTOVER_SETTLE_LIMIT
            / processes.child.LEFTOVER_SETTLE_SECONDS
        )
        self.assertLessEqual(len(calls), looks + 2)

    def test_exit_after_pipes_closed_leaves_no_timer(self) -> None:
        """A child whose pipes had all closed when it was reaped arms no drain timer."""
        child, clock, _, _ = self.make()
        child.transport.pipes = {}
        child.processExited(Exited(0))  # type: ignore[arg-type]
        self.assertEqual(self.successResultOf(child.exited), 0)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_chatty_grandchild_cannot_hold_pipes_forever(self) -> None:
        """Output that never stops after exit still ends at the drain limit."""
        child, clock, _, _ = self.make()
        child.processExited(Exited(0))  # type: ignore[arg-type]
        for _ in range(int(processes.child.EXIT_DRAIN_MAX_SECONDS / 0.05) + 5):
            child.childDataReceived(1, b"x")
            clock.advance(0.05)
        self.assertGreaterEqual(child.transport.lost, 1)

    def test_signal_exit_code_is_negative(self) -> None:
        """A child killed by SIGTERM reports -15."""
        child, _, _, _ = self.make()
        child.processExited(Exited(None, 15))  # type: ignore[arg-type]
        self.assertEqual(self.successResultOf(child.exited), -15)

    def test_timeout_kills(self) -> None:
        """The hard timeout ends the tree with reason ``timeout``."""
        _, clock, _, kills = self.make(timeout=3)
        clock.advance(2.9)
        self.assertEqual(kills, [])
        clock.advance(0.2)
        self.assertEqual(kills, ["timeout"])

    def test_idle_timeout_reset_by_output(self) -> None:
        """Output resets the idle timer; silence past it ends the tree."""
        child, clock, _, kills = self.make(idle_timeout=1)
        clock.advance(0.8)
        child.childDataReceived(2, b"tick")
        clock.advance(0.8)
        self.assertEqual(kills, [])
        clock.advance(0.3)
        self.assertEqual(kills, ["idle_timeout"])

    def test_pause_suspends_idle_timer(self) -> None:
        """While a slow client holds the child paused, silence is not idleness."""
        child, clock, _, kills = self.make(idle_timeout=1)
        child.pause_reading()
        self.assertEqual(child.transport.paused, 1)
        clock.advance(10)
        self.assertEqual(kills, [])
        child.resume_reading()
        self.assertEqual(child.transport.resumed, 1)
        clock.advance(1.1)
        self.assertEqual(kills, ["idle_timeout"])

    def test_paused_exit_keeps_pipes_until_resumed(self) -> None:
        """A paused child that exits keeps its unread output until the client drains."""
        child, clock, _, _ = self.make()
        child.pause_reading()
        child.processExited(Exited(0))  # type: ignore[arg-type]
        clock.advance(60)
        self.assertEqual(child.transport.lost, 0)
        child.resume_reading()
        clock.advance(processes.child.EXIT_DRAIN_SECONDS + 0.01)
        self.assertEqual(child.transport.lost, 1)

    def test_exit_cancels_timers(self) -> None:
        """A finished child is never killed by its timers afterwards."""
        child, clock, _, kills = self.make(timeout=1, idle_timeout=1)
        child.processExited(Exited(0))  # type: ignore[arg-type]
        clock.advance(5)
        self.assertEqual(kills, [])


class RunCollectTests(TestCase):
    """run_collect with real children."""

    timeout = 30

    def setUp(self) -> None:
        # A sleep length no other process uses: it marks the test's processes.
        self.marker = f"60.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, self.marker)
        self.cwd = os.path.realpath(self.mktemp())
        os.makedirs(self.cwd)

    def run_(self, argv: list[str], **kwargs: Any) -> Deferred[processes.RunResult]:
        options: dict[str, Any] = {
            "env": ENV,
            "cwd": self.cwd,
            "timeout": 20,
            "max_output_bytes": 1 << 20,
        }
        options.update(kwargs)
        return ensureDeferred(run_collect(reactor, argv, children=CHILDREN, **options))

    @inlineCallbacks
    def test_collects_output_and_exit_code(self) -> Any:
        """stdout, stderr and the exit status come back separately, in the cwd given."""
        result = yield self.run_(["sh", "-c", "pwd; echo err >&2; exit 3"])
        self.assertEqual(result.stdout, self.cwd.encode() + b"\n")
        self.assertEqual(result.stderr, b"err\n")
        self.assertEqual(result.exit_code, 3)
        self.assertFalse(result.timed_out)
        self.assertFalse(result.truncated)

    @inlineCallbacks
    def test_cwd_on_every_spawn_path(self) -> Any:
        """
        The child runs in the cwd through sandboxd.processes.posix_spawn, and through
        Twisted's spawn alone, with other threads about, or forked.
        """
        result = yield self.run_(["pwd"])
        self.assertEqual(result.stdout, self.cwd.encode() + b"\n")
        self.patch(spawn, "AVAILABLE", False)
        result = yield self.run_(["pwd"])
        self.assertEqual(result.stdout, self.cwd.encode() + b"\n")
        self.patch(processes.run.threading, "active_count", lambda: 2)
        result = yield self.run_(["pwd"])
        self.assertEqual(result.stdout, self.cwd.encode() + b"\n")
        self.patch(processes.run, "_ENV_CHDIR", False)
        result = yield self.run_(["pwd"])
        self.assertEqual(result.stdout, self.cwd.encode() + b"\n")
        self.assertNotEqual(os.getcwd(), self.cwd)

    @inlineCallbacks
    def test_held_directory_on_every_spawn_path(self) -> Any:
        """
        A child given a held directory starts in that very directory, on
        every spawn path and as another user too, even after the path it
        was opened by names a link to somewhere else.
        """
        held = os.path.join(self.cwd, "held")
        elsewhere = os.path.join(self.cwd, "elsewhere")
        os.mkdir(held)
        os.mkdir(elsewhere)
        os.chmod(self.cwd, 0o755)
        fd = os.open(held, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.addCleanup(os.close, fd)
        os.rename(held, held + ".moved")
        os.symlink(elsewhere, held)
        cwd = processes.held_directory(fd)
        expected = (held + ".moved").encode() + b"\n"
        run_as = [None]
        if os.geteuid() == 0:
            entry = pwd.getpwnam("nobody")
            run_as.append(RunAs("nobody", entry.pw_uid, entry.pw_gid, "/"))
        for user in run_as:
            result = yield self.run_(["sh", "-c", "pwd -P"], cwd=cwd, run_as=user)
            self.assertEqual(result.stdout, expected, (user, result.stderr))
        self.patch(spawn, "AVAILABLE", False)
        for user in run_as:
            result = yield self.run_(["sh", "-c", "pwd -P"], cwd=cwd, run_as=user)
            self.assertEqual(result.stdout, expected, (user, result.stderr))
        self.patch(processes.run.threading, "active_count", lambda: 2)
        result = yield self.run_(["sh", "-c", "pwd -P"], cwd=cwd)
        self.assertEqual(result.stdout, expected)
        self.patch(processes.run, "_ENV_CHDIR", False)
        result = yield self.run_(["sh", "-c", "pwd -P"], cwd=cwd)
        self.assertEqual(result.stdout, expected)

    @inlineCallbacks
    def test_unsupported_spawn_falls_back(self) -> Any:
        """
        A system that refuses posix_spawn's file actions (ENOSYS, as under
        some seccomp filters) gets Twisted's spawn from then on: the command
        still runs, in its directory.
        """

        def refuse(*args: Any) -> int:
            raise OSError(errno.ENOSYS, "close_range: not implemented")

        for slow in (False, True):
            times = spawning.SpawnTimes()
            times.slow = slow  # slow: the spawn is on a worker thread
            self.patch(spawning, "SPAWN_TIMES", times)
            self.patch(spawn, "posix_spawn", refuse)
            self.patch(spawn, "posix_spawn_alone", refuse)
            self.patch(spawn, "AVAILABLE", True)
            result = yield self.run_(["pwd"])
            self.assertEqual(result.stdout, self.cwd.encode() + b"\n", slow)
            self.assertFalse(spawn.AVAILABLE)

    @inlineCallbacks
    def test_missing_executable(self) -> Any:
        """An executable missing from the child's PATH is FileNotFoundError."""
        with self.assertRaises(FileNotFoundError):
            yield self.run_(["no-such-command-" + secrets.token_hex(4)])
        with self.assertRaises(FileNotFoundError):
            yield self.run_(["true"], env={"PATH": "/nonexistent"})

    @inlineCallbacks
    def test_stdin_is_closed(self) -> Any:
        """stdin is /dev/null: a command reading it ends at once."""
        result = yield self.run_(["cat"])
        self.assertEqual((result.stdout, result.exit_code), (b"", 0))

    @inlineCallbacks
    def test_stdin_bytes(self) -> Any:
        """Given stdin bytes are fed and closed."""
        result = yield self.run_(["cat"], stdin=b"fed\n")
        self.assertEqual(result.stdout, b"fed\n")

    @inlineCallbacks
    def test_own_session(self) -> Any:
        """The child leads its own session and process group."""
        result = yield self.run_(["sh", "-c", "cut -d' ' -f1,5,6 /proc/$$/stat"])
        pid, pgid, sid = result.stdout.split()
        self.assertEqual(pid, pgid)
        self.assertEqual(pid, sid)

    @inlineCallbacks
    def test_grandchild_holding_pipe_does_not_hang(self) -> Any:
        """A background grandchild keeping stdout open does not delay the result."""
        result = yield self.run_(
            ["sh", "-c", f"sleep {self.marker} & echo started"], timeout=None
        )
        self.assertEqual(result.stdout, b"started\n")
        self.assertEqual(result.exit_code, 0)
        self.assertLess(result.duration_ms, 10_000)

    @inlineCallbacks
    def test_timeout_kills_tree(self) -> Any:
        """Past the timeout the whole group is ended and the result says so."""
        script = f"sleep {self.marker} & sleep {self.marker}; echo never"
        result = yield self.run_(["sh", "-c", script], timeout=0.5)
        self.assertTrue(result.timed_out)
        self.assertEqual(result.exit_code, -15)
        self.assertNotIn(b"never", result.stdout)
        yield deferLater(reactor, 0.3, lambda: None)
        self.assertEqual(marked_pids(self.marker), [])

    @inlineCallbacks
    def test_idle_timeout(self) -> Any:
        """No output for idle_timeout seconds ends the tree, reported as idle."""
        result = yield self.run_(
            ["sh", "-c", f"echo hi; sleep {self.marker}"], idle_timeout=0.5
        )
        self.assertTrue(result.idle_timed_out)
        self.assertFalse(result.timed_out)
        self.assertEqual(result.stdout, b"hi\n")

    @inlineCallbacks
    def test_cap_keeps_head_and_tail(self) -> Any:
        """Output past the cap keeps its beginning and end and counts the rest."""
        script = "echo BEGIN; head -c 3000000 /dev/zero | tr '\\0' x; echo; echo END"
        result = yield self.run_(["sh", "-c", script], max_output_bytes=1000)
        self.assertTrue(result.truncated)
        self.assertTrue(result.stdout.startswith(b"BEGIN\n"))
        self.assertTrue(result.stdout.endswith(b"END\n"))
        # The cap includes the marker line, and the count what it displaced.
        self.assertLessEqual(len(result.stdout), 1000)
        line = f"\n[... {result.dropped_bytes} bytes dropped ...]\n".encode()
        self.assertIn(line, result.stdout)
        kept = len(result.stdout) - len(line)
        self.assertEqual(result.dropped_bytes, 3000000 + 6 + 1 + 4 - kept)

    @inlineCallbacks
    def test_cancel_kills_tree(self) -> Any:
        """Cancelling the Deferred ends the child's tree."""
        d = self.run_(["sh", "-c", f"sleep {self.marker}; true"])
        yield deferLater(reactor, 0.3, lambda: None)
        self.assertNotEqual(marked_pids(self.marker), [])
        d.cancel()
        with self.assertRaises(CancelledError):
            yield d
        for _ in range(100):
            if not marked_pids(self.marker) and not CHILDREN.live:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual(marked_pids(self.marker), [])
        # Ended too (its pipes closed, its kill's last check done): the
        # test leaves no timer or reader behind, however loaded the machine.
        self.assertEqual(CHILDREN.live, set())


def _no_scan() -> Any:
    raise AssertionError("a walkable tree was found by scanning every process")


class TreeTests(TestCase):
    """
    Escaped descendants and orphans, with the daemon as subreaper: trees
    are walked down from their leaders, never found by scanning /proc.
    """

    timeout = 30
    walk = True

    def setUp(self) -> None:
        self.marker = f"60.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, self.marker)
        if not proctree.become_subreaper():
            raise self.skipTest("no PR_SET_CHILD_SUBREAPER here")
        if not self.walk:
            self.patch(proctree, "walkable", lambda: False)
        elif proctree.walkable():
            self.patch(proctree, "proc_table", _no_scan)
        else:
            raise self.skipTest(
                "this kernel lists no children in /proc (CONFIG_PROC_CHILDREN)"
            )

    def run_(self, script: str, **kwargs: Any) -> Deferred[processes.RunResult]:
        options: dict[str, Any] = {
            "env": ENV,
            "cwd": "/",
            "timeout": 20,
            "max_output_bytes": 1 << 20,
        }
        options.update(kwargs)
        return ensureDeferred(
            run_collect(reactor, ["sh", "-c", script], children=CHILDREN, **options)
        )

    @inlineCallbacks
    def wait_gone(self) -> Any:
        for _ in range(200):
            if not marked_pids(self.marker):
                break
            yield deferLater(reactor, 0.05, lambda: None)
        return marked_pids(self.marker)

    @inlineCallbacks
    def test_escapee_caught_mid_exec_is_killed(self) -> Any:
        """
        A grandchild that leaves the session and execs just as the tree is
        killed (its environment reads empty for a moment) is still found by
        its marker and killed, every time.
        """
        script = f"setsid sh -c 'exec sleep {self.marker}' & exit 0"
        for attempt in range(30):
            child = processes.Child(reactor, lambda fd, data: None, grace=0.5)
            processes.spawn(
                reactor,
                child,
                ["sh", "-c", script],
                children=CHILDREN,
                env=ENV,
                cwd="/",
            )
            yield child.exited
            yield child.kill("killed")
            yield deferLater(reactor, 0.02, lambda: None)
            self.assertEqual(marked_pids(self.marker), [], f"attempt {attempt}")

    @inlineCallbacks
    def test_double_forked_daemon_is_killed(self) -> Any:
        """A double-forked, setsid'd process adopted by the daemon still dies with its tree."""
        script = f"(setsid sh -c 'trap \"\" TERM; sleep {self.marker}' &); sleep {self.marker}"
        result = yield self.run_(script, timeout=1)
        self.assertTrue(result.timed_out)
        left = yield self.wait_gone()
        self.assertEqual(left, [])
        yield gather_killers()

    @inlineCallbacks
    def test_orphans_are_reaped(self) -> Any:
        """An orphan adopted by the daemon is reaped by pid once it exits: no zombie stays."""
        result = yield self.run_("sleep 0.2 & echo $!", timeout=5)
        orphan = int(result.stdout)
        for _ in range(100):
            info = proctree.proc_info(orphan)
            if info is None or info.state == "Z":
                break
            yield deferLater(reactor, 0.05, lambda: None)
        info = proctree.proc_info(orphan)
        if info is not None:
            self.assertEqual(info.ppid, os.getpid())
            proctree.reap_orphans()
        self.assertIsNone(proctree.proc_info(orphan))


class ScannedTreeTests(TreeTests):
    """
    The same trees found by scanning every process, as a daemon does when
    it is not a subreaper or the kernel lists no children.
    """

    walk = False


class ReusedPidTests(TestCase):
    """
    A tree kill whose leader was reaped, and whose pid the kernel has
    given to a new process, leaves that stranger and its own tree alone.
    """

    timeout = 30

    def setUp(self) -> None:
        self.marker = f"60.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, self.marker)

    @inlineCallbacks
    def test_stranger_at_the_leaders_pid_is_left_alone(self) -> Any:
        """
        The stranger leads a session and group with children, as a reused
        pid of a daemon child would: a kill that was told its leader is
        reaped signals none of them.
        """
        stranger = subprocess.Popen(
            ["sh", "-c", f"sleep {self.marker} & sleep {self.marker}"],
            start_new_session=True,
        )
        self.addCleanup(stranger.wait)
        self.addCleanup(lambda: stranger.poll() is None and stranger.kill())
        yield wait_for_marked(self.marker, 3)  # the shell and its sleeps
        before = sorted(marked_pids(self.marker))
        self.assertEqual(len(before), 3)
        yield proctree.kill_tree(reactor, stranger.pid, None, 0.2, leader_reaped=True)
        yield deferLater(reactor, 0.3, lambda: None)
        self.assertIsNone(stranger.poll())
        self.assertEqual(sorted(marked_pids(self.marker)), before)

    @inlineCallbacks
    def test_group_still_held_is_killed(self) -> Any:
        """
        With the leader reaped but its group still populated, the number
        cannot have been reused: the group is the tree's and is killed.
        """
        child = processes.Child(reactor, lambda fd, data: None, grace=0.5)
        script = f"sleep {self.marker} & sleep {self.marker} & exit 0"
        processes.spawn(
            reactor, child, ["sh", "-c", script], children=CHILDREN, env=ENV, cwd="/"
        )
        yield child.exited
        # Both past their exec: a process in the middle of one may not
        # show its command line, and at nice 10 beside load that can last.
        yield wait_for_marked(self.marker, 2, command="sleep")
        self.assertEqual(len(marked_pids(self.marker)), 2)
        yield proctree.kill_tree(reactor, child.pid, None, 0.5, leader_reaped=True)
        self.assertEqual(marked_pids(self.marker), [])
        yield child.kill("killed")
        yield child.ended


class NeverSignalledTests(TestCase):
    """
    No signal ever goes to init, to the daemon, or to the daemon's own
    group, whatever pid a caller hands over: a CI runner or container
    entrypoint that never called ``setsid`` leaves the daemon in group 0,
    where ``killpg(0)`` would end the runner and everything it started.
    """

    timeout = 30

    def setUp(self) -> None:
        self.sent: list[tuple[str, int, int]] = []

        def record(name: str) -> Any:
            return lambda target, sig: self.sent.append((name, target, sig))

        self.patch(os, "kill", record("kill"))
        self.patch(os, "killpg", record("killpg"))

    def forbidden(self) -> list[int]:
        return [0, 1, -1, os.getpid(), os.getpgrp()]

    def test_primitives_refuse(self) -> None:
        """signal_member, signal_group and signal_tree send nothing to those targets."""
        for target in self.forbidden():
            proctree.signal_member(target, None, signal.SIGKILL)
            proctree.signal_group(target, signal.SIGKILL)
            proctree.signal_tree(target, signal.SIGKILL)
        self.assertEqual(self.sent, [])

    @inlineCallbacks
    def test_kill_tree_refuses(self) -> Any:
        """kill_tree is over at once for those leaders, having sent nothing."""
        for target in self.forbidden():
            yield proctree.kill_tree(reactor, target, None, grace=0.1)
        self.assertEqual(self.sent, [])

    def test_an_ordinary_target_is_still_signalled(self) -> None:
        """The guard is not everything: another pid and its group are signalled."""
        proctree.signal_tree(999_999_999, signal.SIGTERM)
        self.assertIn(("killpg", 999_999_999, signal.SIGTERM), self.sent)
        self.assertIn(("kill", 999_999_999, signal.SIGTERM), self.sent)


class TreeTableTests(TestCase):
    """What a walk of one tree reads."""

    timeout = 30

    def setUp(self) -> None:
        self.marker = f"60.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, self.marker)
        if not proctree.become_subreaper() or not proctree.walkable():
            raise self.skipTest("no subreaper or no children files here")

    @inlineCallbacks
    def test_walk_holds_the_tree_and_nothing_else(self) -> Any:
        """A walk finds a grandchild, and none of the processes outside the tree."""
        child = processes.Child(reactor, lambda fd, data: None, grace=0.5)
        script = f"sleep {self.marker} & sleep {self.marker}"
        processes.spawn(
            reactor, child, ["sh", "-c", script], children=CHILDREN, env=ENV, cwd="/"
        )
        # Both sleeps (the shell, whose command line carries the marker
        # too, may or may not have made way for the second).
        yield wait_for_marked(self.marker, 2, "sleep")
        table = proctree.tree_table(child.pid)
        members = proctree.tree_members(child.pid, None, table)
        self.assertEqual(
            sorted(members), sorted(set(marked_pids(self.marker)) - {child.pid})
        )
        self.assertNotIn(os.getppid(), table)
        self.assertNotIn(1, table)
        yield child.kill("killed")
        self.assertEqual(marked_pids(self.marker), [])

    @inlineCallbacks
    def test_orphans_of_a_subreaper_member_are_killed(self) -> Any:
        """
        A member that is itself a subreaper adopts the tree's orphans, so
        a walk finds them under it (a service manager run as a command).
        """
        script = (
            "import ctypes, subprocess, time\n"
            "ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\n"
            f"subprocess.run(['sh', '-c', '(setsid sleep {self.marker} &)'])\n"
            f"time.sleep(float('{self.marker}'))\n"
        )
        child = processes.Child(reactor, lambda fd, data: None, grace=0.5)
        processes.spawn(
            reactor,
            child,
            [sys.executable, "-c", script],
            children=CHILDREN,
            env=ENV,
            cwd="/",
        )
        sleeping: list[int] = []
        for _ in range(200):
            sleeping = [p for p in marked_pids(self.marker) if _comm(p) == "sleep"]
            if sleeping:
                break
            yield deferLater(reactor, 0.02, lambda: None)
        info = proctree.proc_info(sleeping[0])
        assert info is not None
        self.assertEqual(info.ppid, child.pid)
        self.patch(proctree, "proc_table", _no_scan)
        yield child.kill("killed")
        self.assertEqual(marked_pids(self.marker), [])


class SharedScanTests(TestCase):
    """Tree kills that scan /proc share their scans."""

    timeout = 30

    @inlineCallbacks
    def test_kills_in_one_turn_share_scans(self) -> Any:
        """Eight trees killed at once all die, for a handful of scans rather than two or more each."""
        self.patch(proctree, "walkable", lambda: False)
        # What is shared is what this test is about, not how fast a scan is:
        # on a loaded machine (or under strace) one scan can outlast the
        # daemon's 2 ms window, and the count would measure the machine.
        self.patch(proctree._RECENT_SCAN, "max_age", 0.25)
        marker = f"60.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, marker)
        children = []
        for _ in range(8):
            child = processes.Child(reactor, lambda fd, data: None, grace=1.0)
            processes.spawn(
                reactor, child, ["sleep", marker], children=CHILDREN, env=ENV, cwd="/"
            )
            children.append(child)
        yield deferLater(reactor, 0.1, lambda: None)
        scans = []
        real = proctree.proc_table

        def counting() -> Any:
            scans.append(1)
            return real()

        self.patch(proctree, "proc_table", counting)
        yield DeferredList([child.kill("disconnected") for child in children])
        for child in children:
            yield child.ended
        self.assertEqual(marked_pids(marker), [])
        self.assertLessEqual(len(scans), 6, len(scans))


class FirstLookTests(TestCase):
    """
    A tree kill asked for while the reactor reads (a client that left)
    looks for survivors only after the input ready meanwhile is read: the
    clients of a burst leave together, and a new request should not wait
    for every kill's look.
    """

    timeout = 30

    @inlineCallbacks
    def test_ready_input_is_read_before_the_first_look(self) -> Any:
        """
        A kill started in one read, with another input made ready in that
        same read: the input is read before the kill's first look for
        survivors, and the tree still dies.
        """
        marker = f"60.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, marker)
        child = processes.Child(reactor, lambda fd, data: None, grace=1.0)
        processes.spawn(
            reactor, child, ["sleep", marker], children=CHILDREN, env=ENV, cwd="/"
        )
        yield deferLater(reactor, 0.1, lambda: None)
        order: list[str] = []
        real_look = proctree._look

        def look(leader: int) -> Any:
            order.append("look")
            return real_look(leader)

        self.patch(proctree, "_look", look)
        killed: list[Deferred[None]] = []
        later = ReadyPipe(lambda: order.append("read"))
        self.addCleanup(later.close)

        def leave() -> None:
            killed.append(child.kill("disconnected"))
            os.write(later.write_fd, b"x")
            reactor.addReader(later)  # type: ignore[attr-defined]

        first = ReadyPipe(leave)
        self.addCleanup(first.close)
        os.write(first.write_fd, b"x")
        reactor.addReader(first)  # type: ignore[attr-defined]
        yield deferLater(reactor, 0.05, lambda: None)
        yield killed[0]
        yield child.ended
        self.assertEqual(order[:3], ["look", "read", "look"])
        self.assertEqual(marked_pids(marker), [])


def gather_killers() -> Deferred[Any]:
    """Wait for tree kills still polling, so the reactor is clean."""
    from twisted.internet.defer import DeferredList

    return DeferredList(list(proctree.KILLING), consumeErrors=True)


class SpawnTimesTests(SynchronousTestCase):
    """When spawns count as slow."""

    def test_switches_both_ways(self) -> None:
        """One spawn over the threshold makes spawns slow; one under it makes them quick again."""
        times = spawning.SpawnTimes(threshold=0.002)
        self.assertFalse(times.slow)
        times.record(0.0002)
        self.assertFalse(times.slow)
        times.record(0.015)
        self.assertTrue(times.slow)
        times.record(0.0009)
        self.assertFalse(times.slow)


class PendingSpawnTests(TestCase):
    """A child whose spawn waits on a worker thread."""

    timeout = 30

    def setUp(self) -> None:
        if not spawn.AVAILABLE:
            raise self.skipTest("no posix_spawn through ctypes here")
        self.marker = f"60.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, self.marker)
        always = spawning.SpawnTimes(threshold=-1.0)
        always.slow = True
        self.patch(spawning, "SPAWN_TIMES", always)
        real = spawn.posix_spawn_alone

        def slow(plan: Any, attributes: Any) -> int:
            time.sleep(0.3)
            return real(plan, attributes)

        self.patch(spawn, "posix_spawn_alone", slow)

    def start(self, argv: list[str]) -> processes.Child:
        child = processes.Child(reactor, lambda fd, data: None, grace=0.5)
        processes.spawn(
            reactor, child, argv, children=CHILDREN, env=ENV, cwd="/", may_wait=True
        )
        return child

    @inlineCallbacks
    def test_kill_asked_before_the_process_exists(self) -> Any:
        """A kill asked while the spawn waits ends the child once it runs."""
        child = self.start(["sleep", self.marker])
        self.assertTrue(child.pending)
        self.assertEqual(child.pid, 0)
        yield child.kill("killed")
        yield child.ended
        self.assertNotEqual(child.pid, 0)
        self.assertEqual(child.reason, "killed")
        self.assertEqual(marked_pids(self.marker), [])
        self.assertEqual(CHILDREN.pending, set())

    @inlineCallbacks
    def test_failed_spawn_reaches_whoever_waits(self) -> Any:
        """A spawn that fails on its thread fails when_spawned with the OSError, and the child is over."""
        path = self.mktemp()
        with open(path, "wb") as f:
            f.write(b"\x00\x01 not a program\n")
        os.chmod(path, 0o755)
        child = self.start([os.path.abspath(path)])
        with self.assertRaises(OSError) as caught:
            yield child.when_spawned()
        self.assertEqual(caught.exception.errno, errno.ENOEXEC)
        code = yield child.ended
        self.assertIsNone(code)
        self.assertEqual(CHILDREN.pending, set())

    @inlineCallbacks
    def test_shutdown_ends_a_child_still_spawning(self) -> Any:
        """end_all takes children whose spawn has not finished."""
        child = self.start(["sleep", self.marker])
        self.assertTrue(child.pending)
        yield processes.end_all(reactor, CHILDREN, grace=0.5)
        self.assertTrue(child.has_ended)
        self.assertEqual(marked_pids(self.marker), [])


class ExitedAtAdoptionTests(TestCase):
    """
    A child that has exited by the time its spawn returns (a short command
    on a busy machine): its output pipes are read to their end without
    joining the reactor, and the exit is answered once they are.
    """

    timeout = 30

    def setUp(self) -> None:
        if not spawn.AVAILABLE:
            raise self.skipTest("no posix_spawn through ctypes here")
        self.marker = f"60.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, self.marker)
        real, real_alone = spawn.posix_spawn, spawn.posix_spawn_alone

        def exited(plan: Any) -> int:
            pid = real(plan)
            until_exited(pid)
            return pid

        def exited_alone(plan: Any, prepared: Any) -> int:
            pid = real_alone(plan, prepared)
            until_exited(pid)
            return pid

        self.patch(spawn, "posix_spawn", exited)
        self.patch(spawn, "posix_spawn_alone", exited_alone)
        self.readers: list[Any] = []
        add = reactor.addReader

        def counted(selectable: Any) -> None:
            if isinstance(selectable, spawning._OutputReader):
                self.readers.append(selectable)
            add(selectable)

        self.patch(reactor, "addReader", counted)

    def run_(self, argv: list[str]) -> Deferred[processes.RunResult]:
        return ensureDeferred(
            run_collect(
                reactor,
                argv,
                children=CHILDREN,
                env=ENV,
                cwd="/",
                timeout=20,
                max_output_bytes=1 << 20,
            )
        )

    @inlineCallbacks
    def test_output_read_without_the_reactor(self) -> Any:
        """
        A full pipe's worth of stdout, stderr and the exit status all come
        back, on both spawn paths, and neither pipe ever joined the reactor.
        """
        argv = ["sh", "-c", "head -c 65536 /dev/zero; echo err >&2; exit 3"]
        for slow in (False, True):
            times = spawning.SpawnTimes(threshold=-1.0 if slow else 60.0)
            times.slow = slow
            self.patch(spawning, "SPAWN_TIMES", times)
            result = yield self.run_(argv)
            self.assertEqual(result.stdout, bytes(65536))
            self.assertEqual(result.stderr, b"err\n")
            self.assertEqual(result.exit_code, 3)
        self.assertEqual(self.readers, [])

    @inlineCallbacks
    def test_pipe_held_by_a_grandchild_joins_the_reactor(self) -> Any:
        """
        A grandchild still holding the pipes after the leader exited: they
        are read by the reactor, and the answer does not wait for it.
        """
        result = yield self.run_(["sh", "-c", f"echo started; sleep {self.marker} &"])
        self.assertEqual(result.stdout, b"started\n")
        self.assertEqual(result.exit_code, 0)
        self.assertLess(result.duration_ms, 10_000)
        self.assertEqual(len(self.readers), 2)

    @inlineCallbacks
    def test_paused_child_is_read_once_resumed(self) -> Any:
        """Paused before its output was read: nothing comes until it resumes, then all of it."""
        got: list[bytes] = []
        child = processes.Child(reactor, lambda fd, data: got.append(data))
        processes.spawn(
            reactor, child, ["echo", "hello"], children=CHILDREN, env=ENV, cwd="/"
        )
        child.pause_reading()
        yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual(got, [])
        self.assertFalse(child.has_ended)
        child.resume_reading()
        code = yield child.ended
        self.assertEqual((b"".join(got), code), (b"hello\n", 0))


class PipeCopiesTests(SynchronousTestCase):
    """Whether a spawn still waiting for its child's exec may hold copies of another child's pipes."""

    def test_only_spawns_begun_before_the_close(self) -> None:
        """A spawn begun before the pipes were closed may hold them; one begun after cannot."""
        self.patch(spawning, "_EXEC_WAITS", {})
        self.assertFalse(spawning._copies_may_remain(10.0))
        spawning._EXEC_WAITS[1] = 12.0
        self.assertFalse(spawning._copies_may_remain(10.0))
        spawning._EXEC_WAITS[2] = 9.0
        self.assertTrue(spawning._copies_may_remain(10.0))


def _pipe_write_ends() -> set[int]:
    """This process's descriptors open for writing on a pipe."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("pipe:"):
                continue
            with open(f"/proc/self/fdinfo/{name}") as info:
                flags = int(info.read().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError):
            continue
        if flags & os.O_ACCMODE == os.O_WRONLY:
            found.add(int(name))
    return found


class OutputPipeEndsTests(TestCase):
    """A child opens its own output pipes' write ends: the daemon never holds them."""

    timeout = 30

    def setUp(self) -> None:
        if not spawn.AVAILABLE or not spawn.REOPEN_PIPES:
            raise self.skipTest("no posix_spawn through ctypes, or no /proc, here")
        always = spawning.SpawnTimes(threshold=-1.0)
        always.slow = True
        self.patch(spawning, "SPAWN_TIMES", always)
        real = spawn.posix_spawn_alone

        def slow(plan: Any, attributes: Any) -> int:
            time.sleep(0.3)
            return real(plan, attributes)

        self.patch(spawn, "posix_spawn_alone", slow)

    @inlineCallbacks
    def test_no_write_end_while_the_spawn_waits(self) -> Any:
        """
        While a spawn waits on its worker, the daemon holds no write end of
        the child's stdout or stderr (another child spawned meanwhile would
        get a copy, and the pipes would not end with the command); the
        output still comes back whole.
        """
        before = _pipe_write_ends()
        got: list[bytes] = []
        child = processes.Child(reactor, lambda fd, data: got.append(data))
        processes.spawn(
            reactor,
            child,
            ["sh", "-c", "echo out; echo err >&2"],
            children=CHILDREN,
            env=ENV,
            cwd="/",
            may_wait=True,
        )
        self.assertTrue(child.pending)
        self.assertEqual(_pipe_write_ends() - before, set())
        code = yield child.ended
        self.assertEqual((sorted(got), code), ([b"err\n", b"out\n"], 0))


class BoundsTests(SynchronousTestCase):
    """A child's timeouts are checked before anything is spawned."""

    def test_non_finite_timeouts_refused(self) -> None:
        """
        NaN, infinity or a negative timeout is a ValueError at construction:
        the timer would refuse it only once the child ran, leaving a process
        that nothing times, lists or kills behind an error answer.
        """
        from sandboxd.processes.child import Child

        for bad in (math.nan, math.inf, -1.0):
            for name in ("timeout", "idle_timeout"):
                with self.assertRaises(ValueError) as cm:
                    Child(Clock(), lambda fd, data: None, **{name: bad})
                self.assertIn(name, str(cm.exception))
        child = Child(Clock(), lambda fd, data: None, timeout=0.0, idle_timeout=5)
        self.assertEqual((child.timeout, child.idle_timeout), (0.0, 5))
