"""
The control plane above the sandbox's work: children started through the
daemon run at a lower CPU and I/O priority and a higher ``oom_score_adj``
than the daemon, as the policy's ``priority`` says.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import Clock, deferLater
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.policy.priorities import priorities_from
from sandboxd.processes import posix_spawn, priority, spawning
from tests.helpers import DaemonTestCase

#: What a child reports of itself: its nice value (field 19 of stat), its
#: oom_score_adj, and its autogroup's nice value.  The session group is
#: lowered once the child has run ``children_group_after_ms`` (100 ms by
#: default): the child reads it last, well after.
REPORT = shlex.join(
    [
        "sh",
        "-c",
        "cut -d' ' -f19 /proc/$$/stat; cat /proc/$$/oom_score_adj; sleep 0.6; "
        "cat /proc/$$/autogroup 2>/dev/null || echo none",
    ]
)


def _fields(stdout: str) -> tuple[int, int, str]:
    nice, oom, group = stdout.strip().splitlines()
    return int(nice), int(oom), group


def _autogroups_on() -> bool:
    """Whether the kernel groups tasks by session here."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def _may_lower_oom() -> bool:
    """Whether this process may lower an oom_score_adj (root outside a restricting container)."""
    probe = subprocess.run(
        ["sh", "-c", "echo -1 > /proc/self/oom_score_adj"], capture_output=True
    )
    return probe.returncode == 0


class ChildPriorityTests(DaemonTestCase):
    """A real daemon's children, as ``/proc`` shows them."""

    @inlineCallbacks
    def test_children_run_below_the_daemon(self) -> Any:
        """
        By default a ``/shell`` child runs at nice 10, oom_score_adj 500 and
        (with autogroups) in a session group of nice 10 once it has run a
        moment; the daemon keeps its
        own nice value and oom_score_adj below the child's.
        """
        reply = yield self.request("POST", "/shell", {"command": REPORT})
        self.assertEqual(reply.status, 200, reply.body)
        nice, oom, group = _fields(reply.json()["stdout"])
        self.assertEqual(nice, 10)
        self.assertEqual(oom, 500)
        if group != "none":
            self.assertTrue(group.endswith(" nice 10"), group)
        self.assertLess(os.getpriority(os.PRIO_PROCESS, 0), nice)
        with open("/proc/self/oom_score_adj") as f:
            self.assertLess(int(f.read()), oom)

    @inlineCallbacks
    def test_background_process_is_reniced(self) -> Any:
        """A background process (``/process/start``) gets the same priorities, read from its pid."""
        reply = yield self.request("POST", "/process/start", {"command": "sleep 30"})
        self.assertEqual(reply.status, 200, reply.body)
        pid = reply.json()["pid"]
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read().rsplit(")", 1)[1].split()
        self.assertEqual(int(stat[19 - 3]), 10)
        with open(f"/proc/{pid}/oom_score_adj") as f:
            self.assertEqual(int(f.read()), 500)
        io = priority.ioprio_of(pid)
        if io >= 0:
            self.assertEqual(io, priority.best_effort(7))

    @inlineCallbacks
    def test_reaped_child_leaves_the_count(self) -> Any:
        """
        A running child's group is counted among the live ones; once the
        child is killed and reaped its pid is not (never written again).
        """
        reply = yield self.request("POST", "/process/start", {"command": "sleep 30"})
        self.assertEqual(reply.status, 200, reply.body)
        pid = reply.json()["pid"]
        if _autogroups_on():
            self.assertIn(pid, priority.CHILD_PRIORITY.tracked())
        reply = yield self.request(
            "POST", f"/process/{pid}/signal", {"signal": "SIGKILL"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        for _ in range(250):
            if pid not in priority.CHILD_PRIORITY.tracked():
                break
            yield deferLater(reactor, 0.02, lambda: None)
        self.assertNotIn(pid, priority.CHILD_PRIORITY.tracked())

    @inlineCallbacks
    def test_daemon_thread_gets_its_priority_back(self) -> Any:
        """After a spawn the daemon's thread runs at its own nice value and I/O priority again."""
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        io = priority.ioprio_of(os.getpid())
        reply = yield self.request("POST", "/shell", {"command": "true"})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(os.getpriority(os.PRIO_PROCESS, 0), nice)
        self.assertEqual(priority.ioprio_of(os.getpid()), io)


class WorkerThreadTests(DaemonTestCase):
    """Children spawned on a worker thread (spawns are slow: a busy machine)."""

    def setUp(self) -> Any:
        if not posix_spawn.AVAILABLE:
            raise self.skipTest("no posix_spawn through ctypes here")
        always = spawning.SpawnTimes(threshold=-1.0)
        always.slow = True
        self.patch(spawning, "SPAWN_TIMES", always)
        return super().setUp()

    @inlineCallbacks
    def test_every_child_gets_the_childrens_priorities(self) -> Any:
        """
        Each ``/shell`` child started by a spawn worker runs at nice 10,
        oom_score_adj 500 and the children's I/O priority, the second as
        the first (the worker keeps the I/O priority between spawns); the
        worker itself is back at the nice value it had (the daemon's, for a
        worker started by this daemon).
        """
        command = shlex.join(
            ["sh", "-c", "cut -d' ' -f19 /proc/$$/stat; cat /proc/$$/oom_score_adj"]
        )
        # Workers outlive a daemon in this test process: one started for an
        # earlier case keeps the nice value it was made with.
        before = {
            t.native_id: os.getpriority(os.PRIO_PROCESS, t.native_id)
            for t in threading.enumerate()
            if t.name == "sandboxd-spawn" and t.native_id is not None
        }
        for _ in range(2):
            reply = yield self.request("POST", "/shell", {"command": command})
            self.assertEqual(reply.status, 200, reply.body)
            nice, oom = (int(v) for v in reply.json()["stdout"].split())
            self.assertEqual((nice, oom), (10, 500))
        reply = yield self.request("POST", "/process/start", {"command": "sleep 30"})
        self.assertEqual(reply.status, 200, reply.body)
        io = priority.ioprio_of(reply.json()["pid"])
        if io >= 0:
            self.assertEqual(io, priority.best_effort(7))
        workers = [t for t in threading.enumerate() if t.name == "sandboxd-spawn"]
        self.assertNotEqual(workers, [])
        for worker in workers:
            assert worker.native_id is not None
            self.assertEqual(
                os.getpriority(os.PRIO_PROCESS, worker.native_id),
                before.get(worker.native_id, os.getpriority(os.PRIO_PROCESS, 0)),
            )


class DedicatedSpawningThreadTests(SynchronousTestCase):
    """A thread that only spawns keeps the children's I/O priority between spawns."""

    def in_thread(self, work: Any) -> Any:
        """``work()`` on a fresh thread; its result."""
        results: list[Any] = []
        thread = threading.Thread(target=lambda: results.append(work()))
        thread.start()
        thread.join()
        return results[0]

    def test_kept_until_priority_is_off(self) -> None:
        """
        Lowered for the first spawn and still lowered after it; with the
        policy's priority off, the thread's own I/O priority again.
        """
        own = priority.ioprio_of(threading.get_native_id())
        if own < 0:
            raise self.skipTest("no ioprio system calls on this machine")
        children = priority.ChildPriority()
        children.priorities = priorities_from(True)
        level = children.priorities.children_io_level
        assert level is not None

        def spawns() -> list[int]:
            tid = threading.get_native_id()
            seen = []
            with children.spawning(dedicated=True):
                seen.append(priority.ioprio_of(tid))
            seen.append(priority.ioprio_of(tid))
            children.priorities = priorities_from(False)
            with children.spawning(dedicated=True):
                seen.append(priority.ioprio_of(tid))
            return seen

        lowered = priority.best_effort(level)
        self.assertEqual(self.in_thread(spawns), [lowered, lowered, own])
        self.assertEqual(priority.ioprio_of(threading.get_native_id()), own)


class PriorityOffTests(DaemonTestCase):
    """``priority: false`` leaves children at the daemon's own priorities."""

    policy = {"priority": False}

    @inlineCallbacks
    def test_policy_turns_it_off(self) -> Any:
        """With the policy off, a child is not reniced and has the daemon's oom_score_adj."""
        reply = yield self.request("POST", "/shell", {"command": REPORT})
        self.assertEqual(reply.status, 200, reply.body)
        nice, oom, group = _fields(reply.json()["stdout"])
        self.assertLessEqual(nice, 0)
        self.assertFalse(group.endswith(" nice 10"), group)
        with open("/proc/self/oom_score_adj") as f:
            self.assertEqual(oom, int(f.read()))


class PriorityTunedTests(DaemonTestCase):
    """The policy's numbers are the children's."""

    policy = {
        "priority": {
            "children_nice": 3,
            "children_group_nice": 7,
            "children_oom_score_adj": 800,
        }
    }

    @inlineCallbacks
    def test_policy_values(self) -> Any:
        """
        children_nice, children_group_nice (where the kernel groups tasks
        by session) and children_oom_score_adj are what a child reports.
        """
        reply = yield self.request("POST", "/shell", {"command": REPORT})
        self.assertEqual(reply.status, 200, reply.body)
        nice, oom, group = _fields(reply.json()["stdout"])
        self.assertEqual((nice, oom), (3, 800))
        if group != "none":
            self.assertTrue(group.endswith(" nice 7"), group)


class ChildrenAtDefaultPriorityTests(DaemonTestCase):
    """``children_nice: 0`` is the default priority, not the root daemon's raised one."""

    policy = {"priority": {"children_nice": 0}}

    def setUp(self) -> Any:
        if os.geteuid() != 0:
            raise self.skipTest("the daemon raises its own priority only as root")
        return super().setUp()

    @inlineCallbacks
    def test_child_at_nice_zero(self) -> Any:
        """The daemon runs at nice -5 or below; its child reports 0."""
        self.assertLessEqual(os.getpriority(os.PRIO_PROCESS, 0), -5)
        reply = yield self.request("POST", "/shell", {"command": REPORT})
        self.assertEqual(reply.status, 200, reply.body)
        nice, _, _ = _fields(reply.json()["stdout"])
        self.assertEqual(nice, 0)


class DaemonOwnPriorityTests(DaemonTestCase):
    """As root, the daemon lowers its own oom_score_adj and nice value, and gives them back at stop."""

    def setUp(self) -> Any:
        if os.geteuid() != 0:
            raise self.skipTest("the daemon changes its own priorities only as root")
        with open("/proc/self/oom_score_adj") as f:
            self.before_oom = int(f.read())
        self.before_nice = os.getpriority(os.PRIO_PROCESS, 0)
        return super().setUp()

    @inlineCallbacks
    def test_daemon_priorities_while_running(self) -> Any:
        """While it runs the daemon is at oom_score_adj -500 and nice -5 at most; after stop, as before."""
        if _may_lower_oom():
            with open("/proc/self/oom_score_adj") as f:
                self.assertLessEqual(int(f.read()), -500)
        self.assertLessEqual(os.getpriority(os.PRIO_PROCESS, 0), -5)
        yield self.daemon.stop()
        with open("/proc/self/oom_score_adj") as f:
            self.assertEqual(int(f.read()), self.before_oom)
        self.assertEqual(os.getpriority(os.PRIO_PROCESS, 0), self.before_nice)


class PolicyValueTests(SynchronousTestCase):
    """The ``priority`` value is checked like the rest of the policy."""

    def test_forms(self) -> None:
        """true, false and an object are accepted; the object overrides defaults."""
        self.assertTrue(priorities_from(True).enabled)
        self.assertFalse(priorities_from(False).enabled)
        tuned = priorities_from({"children_nice": 19, "children_io_level": None})
        self.assertEqual((tuned.children_nice, tuned.children_io_level), (19, None))
        self.assertIsNone(tuned.children_group_nice)
        self.assertEqual(
            priorities_from({"children_group_nice": 19}).children_group_nice, 19
        )
        self.assertEqual(priorities_from(True).agents_nice, 0)
        self.assertEqual(priorities_from({"agents_nice": 10}).agents_nice, 10)

    def test_bad_values(self) -> None:
        """Unknown keys, values out of range and wrong types are refused by name."""
        for value, words in [
            ({"childrens_nice": 1}, "unknown key"),
            ({"children_nice": 20}, "outside 0..19"),
            ({"children_group_nice": -1}, "outside 0..19"),
            ({"agents_nice": -5}, "outside 0..19"),
            ({"daemon_oom_score_adj": 5}, "outside -1000..0"),
            ({"children_group_after_ms": 60_000}, "outside 0..10000"),
            ({"children_nice": "10"}, "expected an integer"),
            ("yes", "expected true, false or an object"),
        ]:
            with self.assertRaises(ValueError) as caught:
                priorities_from(value)
            self.assertIn(words, str(caught.exception))


class GroupWeightTests(SynchronousTestCase):
    """Many children's session groups together weigh no more than the daemon's group."""

    def setUp(self) -> None:
        # The calls come from the reactor's thread, as in the daemon (the
        # reactor may not have run yet when this class runs alone).
        self.patch(priority, "isInIOThread", lambda: True)
        # The pids here are made up: never renice whoever has them.
        self.reniced: list[tuple[int, int]] = []
        self.patch(priority, "_lower_group", lambda *a: self.reniced.append(a))

    def groups_written(self) -> list[tuple[str, int]]:
        """
        Where the writes of autogroup nice values go instead of ``/proc``
        (as ``(path, value)``), every child leading its own session.
        """
        written: list[tuple[str, int]] = []
        self.patch(priority, "_write_value", lambda path, v: written.append((path, v)))
        self.patch(priority, "_autogroups", lambda: True)
        self.patch(priority, "_leads_session", lambda pid: True)
        return written

    def test_levels(self) -> None:
        """
        A few children keep the base nice value; more make each lighter,
        down to the lightest (19) once even that cannot keep within the
        daemon's weight.
        """
        budget = priority.weight(-5)
        self.assertEqual(priority.group_nice_for(10, budget, 1), 10)
        self.assertEqual(priority.group_nice_for(10, budget, 28), 10)
        self.assertEqual(priority.group_nice_for(10, budget, 29), 11)
        self.assertEqual(priority.group_nice_for(10, budget, 200), 19)
        self.assertEqual(priority.group_nice_for(10, budget, 1000), 19)
        self.assertEqual(priority.group_nice_for(15, budget, 1), 15)
        for alive in (1, 29, 100, 200):
            nice = priority.group_nice_for(10, budget, alive)
            self.assertLessEqual(alive * priority.weight(nice), budget)

    def test_live_groups_follow(self) -> None:
        """
        When a new child's level is lighter, the live children's groups are
        rewritten to it; a reaped child's is never written again.
        """
        written = self.groups_written()
        prio = priority.ChildPriority()
        # Its timers on a clock of its own, not the reactor a later test
        # in the same process checks for leftovers.
        prio.clock = Clock()
        prio.priorities = priorities_from({"children_group_after_ms": 0})
        prio._budget = priority.weight(-5)
        for pid in range(1000, 1028):
            prio.spawned(pid)
        self.assertEqual({v for _, v in written}, {10})
        prio.ended(1000)
        written.clear()
        prio.spawned(2000)
        prio.spawned(2001)
        self.assertEqual(
            written,
            [("/proc/2000/autogroup", 10)]
            + [
                (f"/proc/{pid}/autogroup", 11)
                for pid in [*range(1001, 1028), 2000, 2001]
            ],
        )
        written.clear()
        prio.spawned(3000, tracked=False)
        self.assertEqual(written, [("/proc/3000/autogroup", 11)])

    def test_young_groups_are_lowered_later(self) -> None:
        """
        A child's group is only as light as the daemon's share requires
        (a new group is at nice 0: nothing written) until it has run
        ``children_group_after_ms``; then, if it still runs, it is lowered
        to the base.  One that ended before is never written.
        """
        written = self.groups_written()
        prio = priority.ChildPriority()
        prio.clock = clock = Clock()
        prio.priorities = priorities_from(True)
        prio._budget = priority.weight(-5) * 2
        prio.spawned(1000)
        clock.advance(0.05)
        prio.spawned(1001)
        self.assertEqual(written, [])
        prio.ended(1001)
        clock.advance(0.05)
        self.assertEqual(written, [("/proc/1000/autogroup", 10)])
        clock.advance(1)
        self.assertEqual(written, [("/proc/1000/autogroup", 10)])
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_young_child_waiting_for_a_cpu_is_not_lowered_yet(self) -> None:
        """
        A child still waiting for its first CPU time when its group is due
        (a short command on a busy machine) keeps its level; it is looked
        at again a period later and lowered once it has run.
        """
        written = self.groups_written()
        prio = priority.ChildPriority()
        prio.clock = clock = Clock()
        prio.priorities = priorities_from(True)
        prio._budget = priority.weight(-5) * 2
        waiting = {1001}
        prio.waiting_for_cpu = lambda pid: pid in waiting
        prio.spawned(1000)
        prio.spawned(1001)
        clock.advance(0.1)
        self.assertEqual(written, [("/proc/1000/autogroup", 10)])
        clock.advance(0.1)
        self.assertEqual(written, [("/proc/1000/autogroup", 10)])
        waiting.clear()
        clock.advance(0.1)
        self.assertEqual(
            written, [("/proc/1000/autogroup", 10), ("/proc/1001/autogroup", 10)]
        )
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_young_child_waits_for_a_cpu_a_second_at_most(self) -> None:
        """
        A child that never gets a CPU is lowered all the same within
        ``CHILD_STARTING_SECONDS`` of its spawn; one reaped meanwhile is
        never written.
        """
        written = self.groups_written()
        prio = priority.ChildPriority()
        prio.clock = clock = Clock()
        prio.priorities = priorities_from(True)
        prio._budget = priority.weight(-5) * 2
        prio.waiting_for_cpu = lambda pid: True
        prio.spawned(1000)
        prio.spawned(1001)
        clock.pump([0.1] * 5)
        prio.ended(1001)
        clock.pump([0.1] * 4)
        self.assertEqual(written, [])
        clock.advance(0.1)
        self.assertEqual(written, [("/proc/1000/autogroup", 10)])
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_waiting_for_cpu(self) -> None:
        """
        Runnable with under ``CHILD_UNSTARTED_CPU_MS`` run: a task that
        sleeps, one that has run longer, and one that is gone are not.
        """
        sleeper = subprocess.Popen(["sleep", "5"])
        self.addCleanup(sleeper.wait)
        self.addCleanup(sleeper.kill)
        # Until it has started and gone to sleep it is runnable, with next
        # to nothing run: the very case.
        for _ in range(500):
            with open(f"/proc/{sleeper.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "S":
                    break
            time.sleep(0.01)
        self.assertFalse(priority.waiting_for_cpu(sleeper.pid))
        # This process reads its own state while running, and has run
        # longer than the bound.
        self.assertFalse(priority.waiting_for_cpu(os.getpid()))
        self.patch(priority, "CHILD_UNSTARTED_CPU_MS", 10**9)
        self.assertTrue(priority.waiting_for_cpu(os.getpid()))
        self.assertFalse(priority.waiting_for_cpu(sleeper.pid))
        self.assertFalse(priority.waiting_for_cpu(2**22 + 1))

    def test_attended_while_young_is_not_lowered(self) -> None:
        """
        A group attended within its first moment (a client that attaches
        to a new terminal, a kernel that has just started) stays at the
        agents' level: the young group's lowering to the base never comes.
        """
        written = self.groups_written()
        prio = priority.ChildPriority()
        prio.clock = clock = Clock()
        prio.priorities = priorities_from(True)
        prio._budget = priority.weight(-5) * 2
        prio.spawned(1000)
        clock.advance(0.01)
        prio.attended(1000)
        clock.advance(1)
        self.assertEqual(written, [("/proc/1000/autogroup", 0)])
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_young_groups_share_the_daemons_weight(self) -> None:
        """
        Young groups together still weigh no more than the daemon's:
        with more children alive each starts lighter, and the ones
        running follow.  A terminal's group (untracked) starts at the base;
        the young ones go only as far as the share requires.
        """
        written = self.groups_written()
        prio = priority.ChildPriority()
        prio.clock = clock = Clock()
        prio.priorities = priorities_from(True)
        prio._budget = budget = priority.weight(-5)
        for pid in range(1000, 1003):
            prio.spawned(pid)
        self.assertEqual(written, [])
        prio.spawned(1003)
        nice = priority.group_nice_for(0, budget, 4)
        self.assertGreater(nice, 0)
        self.assertLessEqual(4 * priority.weight(nice), budget)
        self.assertEqual(
            sorted(written),
            [(f"/proc/{pid}/autogroup", nice) for pid in range(1000, 1004)],
        )
        written.clear()
        prio.spawned(3000, tracked=False)
        level = priority.group_nice_for(0, budget, 5)
        self.assertLess(level, 10)
        self.assertEqual(
            sorted(written),
            [(f"/proc/{pid}/autogroup", level) for pid in range(1000, 1004)]
            + [("/proc/3000/autogroup", 10)],
        )
        prio.restore()
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_agent_group_keeps_its_level(self) -> None:
        """
        An agent's group starts at ``agents_nice`` (0) and a command's
        spawn beside it does not drag it to the command's 10; it is made
        lighter only when all the live groups together must be.
        """
        written = self.groups_written()
        prio = priority.ChildPriority()
        prio.clock = Clock()
        prio.priorities = priorities_from(True)
        prio._budget = priority.weight(-5)
        with prio.awaited():
            prio.spawned(500)
        prio.spawned(501)
        self.assertEqual(prio._groups[500], 0)
        self.assertNotIn(500, [int(path.split("/")[2]) for path, _ in written])
        for pid in range(1000, 1027):
            prio.spawned(pid)
        self.assertEqual(prio._groups[500], 11)
        self.assertIn(("/proc/500/autogroup", 11), written)


class ByPidTests(SynchronousTestCase):
    """
    Where the spawning thread cannot carry the children's nice value (no
    CAP_SYS_NICE): the daemon gives it to the child's whole process group
    just after the spawn, and once more a moment later.
    """

    def test_the_whole_group_is_lowered(self) -> None:
        """
        Every process of the child's group (what a shell has forked, and
        every thread) gets the value; a child that leads no group gets it
        alone.
        """
        child = subprocess.Popen(
            ["sh", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True
        )
        self.addCleanup(child.wait)
        self.addCleanup(os.killpg, child.pid, 9)
        deadline = time.monotonic() + 10
        members: list[int] = []
        while len(members) < 3 and time.monotonic() < deadline:
            members = [
                int(pid)
                for pid in os.listdir("/proc")
                if pid.isdigit() and _pgid(int(pid)) == child.pid
            ]
            time.sleep(0.01)
        self.assertEqual(len(members), 3)
        priority._lower_group(child.pid, 7)
        self.assertEqual({os.getpriority(os.PRIO_PROCESS, m) for m in members}, {7})

        # In this process's group, which must keep its value.
        own = os.getpriority(os.PRIO_PROCESS, 0)
        alone = subprocess.Popen(["sleep", "30"])
        self.addCleanup(alone.wait)
        self.addCleanup(alone.kill)
        priority._lower_group(alone.pid, own + 6)
        self.assertEqual(os.getpriority(os.PRIO_PROCESS, alone.pid), own + 6)
        self.assertEqual(os.getpriority(os.PRIO_PROCESS, 0), own)

    def test_once_more_a_moment_later(self) -> None:
        """
        A fork under way at the first giving joins the group after it: the
        group gets the value again ``GROUP_AGAIN_SECONDS`` later, not for a
        child that lowers itself, and not after the daemon stops.
        """
        self.patch(priority, "isInIOThread", lambda: True)
        reniced: list[tuple[int, int]] = []
        self.patch(priority, "_lower_group", lambda *a: reniced.append(a))
        self.patch(priority, "_autogroups", lambda: False)
        prio = priority.ChildPriority()
        prio.clock = clock = Clock()
        prio.priorities = priorities_from(True)
        prio.spawned(1000)
        prio.spawned(1001, lowers_itself=True)
        self.assertEqual(reniced, [(1000, 10)])
        clock.advance(priority.GROUP_AGAIN_SECONDS)
        self.assertEqual(reniced, [(1000, 10), (1000, 10)])
        prio.spawned(1002)
        prio.restore()
        self.assertEqual(clock.getDelayedCalls(), [])


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


class FirstOutputTests(SynchronousTestCase):
    """
    With many streams started at once, a child that has printed its first
    line waits at the lightest group weight while others are still
    starting, and gets its level back once none is.
    """

    def setUp(self) -> None:
        self.patch(priority, "isInIOThread", lambda: True)
        # The pids here are made up: never renice whoever has them.
        self.patch(priority, "_lower_group", lambda *a: None)
        self.written: list[tuple[str, int]] = []
        self.patch(
            priority, "_write_value", lambda path, v: self.written.append((path, v))
        )
        self.patch(priority, "_autogroups", lambda: True)
        self.patch(priority, "_leads_session", lambda pid: True)
        self.prio = priority.ChildPriority()
        self.prio.clock = self.clock = Clock()
        self.prio.priorities = priorities_from(True)
        self.prio._budget = priority.weight(-5) * 2

    def test_printed_child_waits_while_another_starts(self) -> None:
        """
        The first child to print goes to nice 19 while the second has
        printed nothing; when the second prints, the first is back at its
        level ``CHILD_STARTING_GRACE_SECONDS`` later, and the second is
        never made to wait (nobody is left starting).
        """
        self.prio.priorities = priorities_from({"children_group_after_ms": 10_000})
        self.prio.spawned(1000)
        self.prio.starting(1000)
        self.prio.spawned(1001)
        self.prio.starting(1001)
        self.prio.first_output(1000)
        self.assertEqual(self.written, [("/proc/1000/autogroup", 19)])
        self.written.clear()
        self.prio.first_output(1001)
        self.assertEqual(self.written, [])
        self.clock.advance(priority.CHILD_STARTING_GRACE_SECONDS)
        self.assertEqual(self.written, [("/proc/1000/autogroup", 0)])
        self.prio.first_output(1000)
        self.assertEqual(self.written, [("/proc/1000/autogroup", 0)])

    def test_wait_goes_on_when_another_starts(self) -> None:
        """
        The last starting child prints, but another stream's child starts
        within ``CHILD_STARTING_GRACE_SECONDS``: the printed ones keep
        waiting (the daemon adopts many children one after another).
        """
        self.prio.priorities = priorities_from({"children_group_after_ms": 10_000})
        for pid in (1000, 1001):
            self.prio.spawned(pid)
            self.prio.starting(pid)
        self.prio.first_output(1000)
        self.prio.first_output(1001)
        self.clock.advance(priority.CHILD_STARTING_GRACE_SECONDS / 2)
        self.prio.spawned(1002)
        self.prio.starting(1002)
        self.clock.advance(priority.CHILD_STARTING_GRACE_SECONDS)
        self.assertEqual(self.written, [("/proc/1000/autogroup", 19)])
        self.prio.first_output(1002)
        self.clock.advance(priority.CHILD_STARTING_GRACE_SECONDS)
        self.assertEqual(
            self.written,
            [("/proc/1000/autogroup", 19), ("/proc/1000/autogroup", 0)],
        )

    def test_level_kept_while_waiting(self) -> None:
        """
        A waiting group is not written when the young groups are lowered
        to the base (100 ms); when the wait ends it goes to that base.
        """
        self.prio.spawned(1000)
        self.prio.starting(1000)
        self.prio.spawned(1001)
        self.prio.starting(1001)
        self.prio.first_output(1000)
        self.clock.advance(0.1)
        self.assertEqual(
            self.written,
            [("/proc/1000/autogroup", 19), ("/proc/1001/autogroup", 10)],
        )
        self.written.clear()
        self.prio.first_output(1001)
        self.clock.advance(priority.CHILD_STARTING_GRACE_SECONDS)
        self.assertEqual(self.written, [("/proc/1000/autogroup", 10)])

    def test_wait_is_bounded(self) -> None:
        """
        A child that prints nothing counts as starting for
        ``CHILD_STARTING_SECONDS`` only: then the waiting group is back at
        its level, and no timer is left behind.
        """
        self.prio.spawned(1000)
        self.prio.starting(1000)
        self.prio.spawned(1001)
        self.prio.starting(1001)
        self.prio.first_output(1000)
        self.clock.advance(priority.CHILD_STARTING_SECONDS - 0.01)
        self.assertEqual(self.written[-1], ("/proc/1001/autogroup", 10))
        self.clock.advance(0.01)
        self.assertEqual(self.written[-1], ("/proc/1000/autogroup", 10))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_reaped_starter_ends_the_wait(self) -> None:
        """The last child still starting is reaped: the waiting group is back."""
        self.prio.priorities = priorities_from({"children_group_after_ms": 10_000})
        self.prio.spawned(1000)
        self.prio.starting(1000)
        self.prio.spawned(1001)
        self.prio.starting(1001)
        self.prio.first_output(1000)
        self.written.clear()
        self.prio.ended(1001)
        self.clock.advance(priority.CHILD_STARTING_GRACE_SECONDS)
        self.assertEqual(self.written, [("/proc/1000/autogroup", 0)])
        # Only the young group's lowering is left to come.
        self.assertEqual(
            [call.func.__name__ for call in self.clock.getDelayedCalls()],
            ["_lower_due"],
        )

    def test_only_streams_count(self) -> None:
        """
        A child that is not a stream's (a ``/shell`` command, never said
        to be starting) makes nobody wait; an agent's or an untracked
        child is never counted as starting; a reaped one prints too late to
        matter; with priorities off nothing is written.
        """
        with self.prio.awaited():
            self.prio.spawned(500)
        self.prio.spawned(501, tracked=False)
        self.prio.spawned(1000)
        self.prio.spawned(1001)
        self.prio.starting(1001)
        self.written.clear()
        self.prio.starting(501)
        self.prio.first_output(1001)
        self.prio.first_output(501)
        self.prio.ended(1001)
        self.prio.first_output(1001)
        self.assertEqual(self.written, [])
        self.prio.spawned(1002)
        self.prio.starting(1002)
        self.prio.spawned(1003)
        self.prio.starting(1003)
        self.prio.priorities = priorities_from(False)
        self.prio.first_output(1002)
        self.assertEqual(self.written, [])

    def test_restore_ends_the_wait(self) -> None:
        """At stop a waiting group is given back its level, and no timer is left."""
        self.prio.spawned(1000)
        self.prio.starting(1000)
        self.prio.spawned(1001)
        self.prio.starting(1001)
        self.prio.first_output(1000)
        self.written.clear()
        self.prio.restore()
        self.assertEqual(self.written, [("/proc/1000/autogroup", 0)])
        self.assertEqual(self.clock.getDelayedCalls(), [])
