"""
Reaping on SIGCHLD (:mod:`sandboxd.processes.reaping`): the child that
exited is reaped and its exit reported, without a ``waitpid`` for every
child still running; children Twisted does not know are left to their own
waiter and to the orphan sweep.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from typing import Any

from twisted.internet import process as twisted_process
from twisted.internet import reactor
from twisted.internet.defer import (
    Deferred,
    ensureDeferred,
    gatherResults,
    inlineCallbacks,
)
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import deferLater
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from sandboxd import processes
from sandboxd.processes import posix_spawn as spawn
from sandboxd.processes import reaping, spawning
from sandboxd.processes import tree as proctree
from sandboxd.processes.run import run_collect
from tests.helpers import DaemonTestCase, kill_marked, until_exited

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}

#: The table these tests' children belong to (a daemon has its own).
CHILDREN = processes.ChildTable()

#: How long a test waits for something its children do.
WAIT_SECONDS = 30.0


def _marker() -> str:
    """A sleep length no other process uses: it marks a test's processes."""
    return f"60.{secrets.randbelow(10**12):012d}"


class Ended(ProcessProtocol):
    """Records every ``processEnded`` a child gets."""

    def __init__(self) -> None:
        self.reasons: list[Failure] = []
        #: Fires with the first reason's exception (a value, not a failure).
        self.ended: Deferred[BaseException] = Deferred()

    def processEnded(self, reason: Failure) -> None:
        self.reasons.append(reason)
        if not self.ended.called:
            self.ended.callback(reason.value)


class Recorder:
    """
    ``os.waitid`` and ``os.waitpid`` wrapped: which children the kernel
    named as exited, and which pids were waited for.
    """

    def __init__(self, test: TestCase) -> None:
        self.named: list[int] = []
        self.waited: list[int] = []
        waitid, waitpid = os.waitid, os.waitpid

        def recording_waitid(*args: Any) -> Any:
            info = waitid(*args)
            if info is not None:
                self.named.append(info.si_pid)
            return info

        def recording_waitpid(pid: int, options: int) -> tuple[int, int]:
            self.waited.append(pid)
            return waitpid(pid, options)

        test.patch(os, "waitid", recording_waitid)
        test.patch(os, "waitpid", recording_waitpid)


#: What a short child runs first, so that it outlives its registration
#: (Twisted's registration reaps a child that has exited already).
LATER = "sleep 0.2; "


def spawn_plain(argv: list[str], protocol: ProcessProtocol | None = None) -> Any:
    """
    A child with no pipes (its descriptors on ``/dev/null``): only a
    SIGCHLD can get it reaped, nothing closing on its exit does.
    """
    null = os.open(os.devnull, os.O_RDWR)
    try:
        return reactor.spawnProcess(
            protocol or Ended(),
            argv[0],
            argv,
            env=ENV,
            childFDs={0: null, 1: null, 2: null},
        )
    finally:
        os.close(null)


class HookTestCase(TestCase):
    """A case with the hook installed, undone after the test."""

    timeout = 60

    def setUp(self) -> None:
        # What a daemon's start does (reaping.install), from a clean slate.
        self.patch(twisted_process, "reapAllProcesses", reaping.reap_exited)
        self.patch(reaping, "_owed", False)
        self.patch(reaping, "_waited_for", None)
        # The trial worker may be a subreaper (an earlier test's daemon made
        # it one): an earlier test's orphans that have exited since would
        # be the strangers these tests make on purpose, and counted.
        proctree.reap_orphans()
        self.marker = _marker()
        self.addCleanup(kill_marked, self.marker)

    def sleepers(self, count: int) -> list[int]:
        """
        ``count`` registered children that stay alive; killed at cleanup,
        which waits until each is reaped.
        """
        protocols = [Ended() for _ in range(count)]
        pids = [spawn_plain(["/bin/sleep", self.marker], p).pid for p in protocols]

        def end() -> Deferred[Any]:
            kill_marked(self.marker)
            return gatherResults([p.ended for p in protocols])

        self.addCleanup(end)
        return pids


class ReapedBySignalTests(HookTestCase):
    """Children reaped by the SIGCHLD hook, on the real reactor."""

    @inlineCallbacks
    def test_twisted_calls_the_hook(self) -> Any:
        """
        Twisted's SIGCHLD handling calls the function installed on
        ``twisted.internet.process``: a child with no pipes, which only a
        SIGCHLD gets reaped, ends with its exit code, and the kernel was
        asked which child exited.
        """
        recorder = Recorder(self)
        protocol = Ended()
        pid = spawn_plain(["/bin/sh", "-c", LATER + "exit 5"], protocol).pid
        reason = yield protocol.ended.addTimeout(WAIT_SECONDS, reactor)
        self.assertIsInstance(reason, ProcessTerminated)
        self.assertEqual(reason.exitCode, 5)
        self.assertIn(pid, recorder.named)

    @inlineCallbacks
    def test_exits_reported_exactly(self) -> Any:
        """
        Exit codes and signals come through as Twisted reports them, and
        ``processEnded`` once for each child; the children still running
        are never waited for.
        """
        alive = self.sleepers(20)
        recorder = Recorder(self)
        scripts = [
            LATER + end
            for end in ("exit 0", "exit 3", "kill -TERM $$", "kill -KILL $$")
        ]
        protocols = [Ended() for _ in scripts]
        pids = [
            spawn_plain(["/bin/sh", "-c", script], protocol).pid
            for script, protocol in zip(scripts, protocols, strict=True)
        ]
        for protocol in protocols:
            yield protocol.ended.addTimeout(WAIT_SECONDS, reactor)
        # A few more turns: a second processEnded would come in them.
        yield deferLater(reactor, 0.2, lambda: None)
        values = [p.reasons[0].value for p in protocols]
        self.assertEqual([len(p.reasons) for p in protocols], [1, 1, 1, 1])
        self.assertIsInstance(values[0], ProcessDone)
        self.assertEqual(
            [(v.exitCode, v.signal) for v in values[1:]],
            [(3, None), (None, 15), (None, 9)],
        )
        self.assertEqual(set(recorder.named), set(pids))
        self.assertEqual(set(recorder.waited) & set(alive), set())
        self.assertEqual(
            [pid for pid in alive if pid in twisted_process.reapProcessHandlers],
            alive,
        )

    @inlineCallbacks
    def test_unregistered_zombie_does_not_stall(self) -> Any:
        """
        A zombie child Twisted does not know (forked behind its back), first
        in the kernel's list, is left alone: the registered children that
        exit after it are still reaped and reported, and the orphan sweep
        reaps it.
        """
        self.sleepers(5)
        stranger = _zombie()
        protocols = [Ended() for _ in range(3)]
        for protocol in protocols:
            spawn_plain(["/bin/sh", "-c", LATER + "exit 4"], protocol)
        for protocol in protocols:
            reason = yield protocol.ended.addTimeout(WAIT_SECONDS, reactor)
            self.assertEqual(reason.exitCode, 4)
        info = proctree.proc_info(stranger)
        self.assertIsNotNone(info)
        assert info is not None
        self.assertEqual(info.state, "Z")
        self.assertGreaterEqual(proctree.reap_orphans(), 1)
        self.assertIsNone(proctree.proc_info(stranger))


def _zombie() -> int:
    """A child of this process Twisted does not know, exited (as an adopted orphan looks)."""
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", "exit 0"], ENV)
    until_exited(pid)
    return pid


def _next_tick() -> None:
    """Sleep into the next clock tick of ``/proc/PID/stat``'s start times."""
    time.sleep(2 / os.sysconf("SC_CLK_TCK"))


class OrphanSweepTests(TestCase):
    """
    The orphan sweep beside spawns in flight: a zombie a spawn may have
    started is left, any other is reaped.
    """

    def setUp(self) -> None:
        self.patch(reaping, "_BEGAN", [])
        self.patch(reaping, "_ADOPTING", set())

    def test_older_than_every_spawn_in_flight(self) -> None:
        """
        A zombie that started before the oldest spawn in flight began
        cannot be that spawn's child: the sweep reaps it at once, where it
        used to wait for a moment with no spawn in flight at all.
        """
        orphan = _zombie()
        _next_tick()
        token = reaping.adopting()
        self.addCleanup(reaping.adopted, None, token)
        self.assertGreaterEqual(proctree.reap_orphans(), 1)
        self.assertIsNone(proctree.proc_info(orphan))

    def test_started_while_a_spawn_is_in_flight(self) -> None:
        """
        A zombie that started after a spawn in flight began may be its
        child, not registered with Twisted yet: left until that spawn is
        adopted, then reaped.
        """
        token = reaping.adopting()
        young = _zombie()
        proctree.reap_orphans()
        self.assertEqual(proctree.proc_info(young).state, "Z")  # type: ignore[union-attr]
        reaping.adopted(None, token)
        self.assertGreaterEqual(proctree.reap_orphans(), 1)
        self.assertIsNone(proctree.proc_info(young))

    def test_returned_and_not_adopted(self) -> None:
        """
        A pid a worker has returned is left however old it is, until the
        reactor adopts it.
        """
        pid = _zombie()
        _next_tick()
        token = reaping.adopting()
        reaping.spawned(pid)
        proctree.reap_orphans()
        self.assertEqual(proctree.proc_info(pid).state, "Z")  # type: ignore[union-attr]
        reaping.adopted(pid, token)
        self.assertGreaterEqual(proctree.reap_orphans(), 1)
        self.assertIsNone(proctree.proc_info(pid))


class OrphansUnderLoadTests(DaemonTestCase):
    """The real daemon with commands arriving without a pause."""

    timeout = 120

    @inlineCallbacks
    def test_orphans_reaped_while_commands_run(self) -> Any:
        """
        A process that leaves an orphan every 50 ms (a double fork, as a
        shell's ``(cmd &)`` does) beside eight callers running ``/shell
        true`` back to back on the spawn threads: the orphans' zombies are
        reaped as they go (before, none was until the commands stopped,
        and they piled up by about ten a second).
        """
        if not proctree._subreaper:
            raise self.skipTest("the daemon could not become the subreaper here")
        always = spawning.SpawnTimes(threshold=-1.0)
        always.slow = True
        self.patch(spawning, "SPAWN_TIMES", always)
        maker = "while :; do (sleep 0.05 &); sleep 0.05; done"
        reply = yield self.request(
            "POST", "/process/start", {"command": f"sh -c {maker!r}"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        me = os.getpid()

        def zombies() -> int:
            return sum(
                1
                for info in proctree.proc_table().values()
                if info.ppid == me and info.state == "Z"
            )

        counts = []
        deadline = time.monotonic() + 6

        @inlineCallbacks
        def caller() -> Any:
            while time.monotonic() < deadline:
                answer = yield self.request("POST", "/shell", {"command": "true"})
                self.assertEqual(answer.status, 200, answer.body)

        @inlineCallbacks
        def watch() -> Any:
            while time.monotonic() < deadline:
                yield deferLater(reactor, 0.5, lambda: None)
                counts.append(zombies())

        yield gatherResults([caller() for _ in range(8)] + [watch()])
        # Orphans were there to reap; the sweep runs every two seconds: at
        # most that long's (about 20) wait for it, never all six seconds'
        # (60 and more when none was reaped).
        self.assertGreater(max(counts), 0, counts)
        self.assertLess(max(counts[4:]), 40, counts)


class ExitBeforeRegistrationTests(HookTestCase):
    """A child that exits while its spawn is still on a worker thread."""

    def setUp(self) -> None:
        if not spawn.AVAILABLE:
            raise self.skipTest("no posix_spawn through ctypes here")
        super().setUp()
        self.alive = self.sleepers(10)
        self.recorder = Recorder(self)
        always = spawning.SpawnTimes(threshold=-1.0)
        always.slow = True
        self.patch(spawning, "SPAWN_TIMES", always)
        real = reaping.spawned
        named = self.recorder.named

        def exited_unregistered(pid: int) -> None:
            # The child exits, and the reactor's SIGCHLD hook sees it,
            # before the reactor adopts (registers) it: after the worker
            # has returned its pid, or before (``self.returned_late``).
            self.spawned.append(pid)
            if not self.returned_late:
                real(pid)
            until_exited(pid)
            deadline = time.monotonic() + 5
            while pid not in named and time.monotonic() < deadline:
                time.sleep(0.002)
            if self.returned_late:
                real(pid)

        self.returned_late = False
        self.spawned: list[int] = []
        self.patch(reaping, "spawned", exited_unregistered)

    @inlineCallbacks
    def check_exit_reported(self) -> Any:
        """The exit code and output come back; no running child waited for."""
        result = yield ensureDeferred(
            run_collect(
                reactor,
                ["sh", "-c", "echo out; exit 3"],
                children=CHILDREN,
                env=ENV,
                cwd="/",
                timeout=20,
                max_output_bytes=1 << 20,
            )
        )
        self.assertEqual(result.exit_code, 3)
        self.assertEqual(result.stdout, b"out\n")
        # The child's pid, not the first the kernel named: another test's
        # orphan, handed to this process as the subreaper, may exit first.
        [child] = self.spawned
        self.assertIn(child, self.recorder.named)
        self.assertIsNone(proctree.proc_info(child))
        self.assertEqual(set(self.recorder.waited) & set(self.alive), set())

    def test_exit_reported(self) -> Any:
        """
        The exit code and output come back, the pid reaped, and the
        children still running were never waited for: the adoption reaps
        the child, no sweep of every child does.
        """
        return self.check_exit_reported()

    def test_exit_seen_before_the_pid_returned(self) -> Any:
        """
        The same when the exit is seen before the worker has returned the
        child's pid (the reactor cannot tell it from an orphan yet).
        """
        self.returned_late = True
        return self.check_exit_reported()


class HeldSpawnTests(HookTestCase):
    """A spawn held on its worker thread, its pid not returned yet."""

    def setUp(self) -> None:
        if not spawn.AVAILABLE:
            raise self.skipTest("no posix_spawn through ctypes here")
        super().setUp()
        always = spawning.SpawnTimes(threshold=-1.0)
        always.slow = True
        self.patch(spawning, "SPAWN_TIMES", always)
        self.release = threading.Event()
        real = spawn.posix_spawn_alone

        def held(plan: Any, prepared: Any) -> int:
            self.release.wait(WAIT_SECONDS)
            return real(plan, prepared)

        self.patch(spawn, "posix_spawn_alone", held)

    @inlineCallbacks
    def test_an_unknown_zombie_holds_up_one_look_only(self) -> Any:
        """
        A zombie Twisted does not know, met while a spawn's pid is on its
        way, may be that spawn's child: the look waits for the adoption
        once, but the next exit's look sweeps past it, so registered
        children are reported while the spawn is still held.
        """
        pending = ensureDeferred(
            run_collect(
                reactor,
                ["true"],
                children=CHILDREN,
                env=ENV,
                cwd="/",
                timeout=WAIT_SECONDS,
                max_output_bytes=1024,
            )
        )

        @inlineCallbacks
        def finish() -> Any:
            self.release.set()
            yield pending
            proctree.reap_orphans()

        self.addCleanup(finish)
        stranger = _zombie()
        recorder = Recorder(self)
        first, second = Ended(), Ended()
        spawn_plain(["/bin/sh", "-c", LATER + "exit 4"], first)
        deadline = time.monotonic() + WAIT_SECONDS
        while stranger not in recorder.named and time.monotonic() < deadline:
            yield deferLater(reactor, 0.01, lambda: None)
        spawn_plain(["/bin/sh", "-c", LATER + "exit 5"], second)
        codes = []
        for protocol in (first, second):
            reason = yield protocol.ended.addTimeout(10, reactor)
            codes.append(reason.exitCode)
        self.assertEqual(codes, [4, 5])
        self.assertFalse(self.release.is_set())
        self.assertFalse(pending.called)


#: The spread of a command's own ``waitpid`` calls from one exit to the
#: next: one at its adoption, one more when its exit or its pipes' end
#: comes first, and so on.  Asking every child would add one per child.
OWN_WAITS = 3.0


class DaemonReapingTests(DaemonTestCase):
    """A real daemon with many children alive."""

    timeout = 240

    def setUp(self) -> Any:
        self.marker = _marker()
        self.addCleanup(kill_marked, self.marker)
        return super().setUp()

    @inlineCallbacks
    def shells(self, count: int, slow: bool) -> Any:
        """
        ``count`` ``/shell true`` calls in turn, spawned on a worker thread
        or not (``slow``); waitpid calls per exit.
        """
        times = spawning.SpawnTimes(threshold=-1.0 if slow else 60.0)
        times.slow = slow
        self.patch(spawning, "SPAWN_TIMES", times)
        # An orphan of an earlier test in this trial worker (a subreaper
        # since some daemon ran in it) that has exited makes every exit
        # sweep until the daemon's orphan reaper comes round: not what is
        # measured here.
        proctree.reap_orphans()
        waited: list[int] = []
        waitpid = os.waitpid

        def counting(pid: int, options: int) -> tuple[int, int]:
            waited.append(pid)
            return waitpid(pid, options)

        os.waitpid = counting
        try:
            for _ in range(count):
                reply = yield self.request("POST", "/shell", {"command": "true"})
                self.assertEqual(reply.status, 200, reply.body)
                self.assertEqual(reply.json()["exit_code"], 0)
        finally:
            os.waitpid = waitpid
        return len(waited) / count

    @inlineCallbacks
    def test_an_exit_costs_the_same_with_many_children_alive(self) -> Any:
        """
        Starting the daemon installs the hook, and with 100 background
        processes alive a short command's exit costs no more ``waitpid``
        calls than with none, whether it was spawned on the reactor or on
        a worker thread: it no longer asks every child.
        """
        self.assertIs(twisted_process.reapAllProcesses, reaping.reap_exited)
        idle = []
        for slow in (False, True):
            idle.append((yield self.shells(30, slow)))
        for _ in range(100):
            reply = yield self.request(
                "POST", "/process/start", {"command": f"sleep {self.marker}"}
            )
            self.assertEqual(reply.status, 200, reply.body)
        busy = []
        for slow in (False, True):
            busy.append((yield self.shells(30, slow)))
        for before, after in zip(idle, busy, strict=True):
            self.assertLessEqual(after, before + OWN_WAITS, (idle, busy))
