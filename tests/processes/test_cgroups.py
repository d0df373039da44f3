"""
The daemon and its children in cgroups of their own where a cgroup v2
hierarchy is delegated: leaves created, the daemon moved before the
controllers are enabled, the policy's weights, reserve and limits
written, children placed; and nothing done, with the reason said, where
no hierarchy may be used.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.policy import PolicyError, load_policy
from sandboxd.policy.cgroup_limits import CgroupLimits, cgroup_limits_from
from sandboxd.processes import cgroups
from sandboxd.processes.cgroups import CgroupFiles, ChildCgroups
from sandboxd.routes import default_table
from tests.helpers import DaemonTestCase

MIB = 1024 * 1024
MOUNTINFO_V2 = "30 1 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
MOUNTINFO_V1 = (
    "31 1 0:31 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    "32 1 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
)


class FakeFiles(CgroupFiles):
    """
    A cgroupfs stand-in over a plain directory tree: every write recorded
    in order, and the writes named in ``refuse`` failing as the kernel's
    would.
    """

    def __init__(self, root: str, refuse: dict[str, int] | None = None) -> None:
        self.root = root
        self.refuse = refuse or {}
        self.writes: list[tuple[str, str]] = []
        self.not_writable: set[str] = set()

    def _name(self, path: str) -> str:
        return os.path.relpath(path, os.path.join(self.root, "sys/fs/cgroup"))

    def write(self, path: str, text: str) -> None:
        name = self._name(path)
        code = self.refuse.get(name)
        if code is not None:
            raise OSError(code, os.strerror(code), path)
        self.writes.append((name, text))
        super().write(path, text)

    def writable(self, path: str) -> bool:
        return self._name(path) not in self.not_writable

    def mkdir(self, path: str) -> None:
        # The kernel gives a new cgroup its interface files.
        super().mkdir(path)
        with open(os.path.join(path, "cgroup.procs"), "a"):
            pass

    def rmdir(self, path: str) -> None:
        # The kernel removes a cgroup with its interface files; here they
        # are real files.
        shutil.rmtree(path)


def fake_tree(
    case: SynchronousTestCase,
    controllers: str = "cpuset cpu io memory hugetlb pids",
    others: tuple[int, ...] = (),
    mountinfo: str = MOUNTINFO_V2,
    own: str = "0::/box\n",
) -> tuple[str, str]:
    """
    A fake root with ``/proc/self`` and a cgroup ``/box`` holding this
    process (and ``others``); returns the root and the cgroup's directory.
    """
    root = os.path.realpath(case.mktemp())
    box = os.path.join(root, "sys/fs/cgroup/box")
    os.makedirs(box)
    os.makedirs(os.path.join(root, "proc/self"))
    members = "".join(f"{pid}\n" for pid in (os.getpid(), *others))
    files = {
        "proc/self/cgroup": own,
        "proc/self/mountinfo": mountinfo,
        "sys/fs/cgroup/box/cgroup.controllers": controllers + "\n",
        "sys/fs/cgroup/box/cgroup.procs": members,
        "sys/fs/cgroup/box/cgroup.subtree_control": "",
    }
    for rel, text in files.items():
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    return root, box


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


class SetUpTests(SynchronousTestCase):
    """Set-up in a delegated hierarchy (a fake cgroupfs tree)."""

    def setUp(self) -> None:
        self.root, self.box = fake_tree(self)
        self.files = FakeFiles(self.root)
        self.cgroups = ChildCgroups(self.root, self.files)
        self.addCleanup(self.cgroups.restore)

    def test_leaves_and_defaults(self) -> None:
        """
        By default the daemon's leaf gets cpu.weight 1000 and a reserve of
        64 MiB (memory.min) and 128 MiB (memory.low); the children's leaf
        cpu.weight 100, no memory limit and pids.max 8192.
        """
        status = self.cgroups.configure(CgroupLimits())
        self.assertEqual(
            status.as_json(),
            {
                "state": "active",
                "daemon": "/box/sandboxd-daemon",
                "children": "/box/sandboxd-children",
                "controllers": ["cpu", "memory", "pids"],
                "errors": [],
            },
        )
        daemon = os.path.join(self.box, "sandboxd-daemon")
        children = os.path.join(self.box, "sandboxd-children")
        self.assertEqual(read(f"{daemon}/cgroup.procs"), str(os.getpid()))
        self.assertEqual(read(f"{daemon}/cpu.weight"), "1000")
        self.assertEqual(read(f"{daemon}/memory.min"), str(64 * MIB))
        self.assertEqual(read(f"{daemon}/memory.low"), str(128 * MIB))
        self.assertEqual(read(f"{children}/cpu.weight"), "100")
        self.assertEqual(read(f"{children}/memory.high"), "max")
        self.assertEqual(read(f"{children}/memory.max"), "max")
        self.assertEqual(read(f"{children}/pids.max"), "8192")
        self.assertEqual(
            read(f"{self.box}/cgroup.subtree_control"), "+cpu +memory +pids"
        )

    def test_daemon_moves_before_controllers_are_enabled(self) -> None:
        """
        No internal processes: the daemon leaves its cgroup for its leaf
        before that cgroup hands its controllers down.
        """
        self.cgroups.configure(CgroupLimits())
        names = [name for name, _ in self.files.writes]
        self.assertLess(
            names.index("box/sandboxd-daemon/cgroup.procs"),
            names.index("box/cgroup.subtree_control"),
        )

    def test_children_placed(self) -> None:
        """Each child's pid is written to the children's leaf, one write each."""
        self.cgroups.configure(CgroupLimits())
        self.cgroups.place(4242)
        self.cgroups.place(4243)
        self.assertTrue(self.cgroups.settle(5))
        procs = os.path.join(self.box, "sandboxd-children/cgroup.procs")
        self.assertEqual(read(procs), "4242\n4243\n")

    def test_what_the_child_started_is_placed(self) -> None:
        """
        What a child started before it was moved (read from
        ``/proc/PID/task/TID/children``) is moved after it, down the tree.
        """
        for pid, task, kids in [
            (4242, 4242, "4300 4301"),
            (4242, 4250, "4302"),
            (4301, 4301, "4400"),
        ]:
            directory = os.path.join(self.root, f"proc/{pid}/task/{task}")
            os.makedirs(directory)
            with open(os.path.join(directory, "children"), "w") as f:
                f.write(kids + " ")
        self.cgroups.configure(CgroupLimits())
        self.cgroups.place(4242)
        self.assertTrue(self.cgroups.settle(5))
        procs = os.path.join(self.box, "sandboxd-children/cgroup.procs")
        moved = read(procs).split()
        self.assertEqual(moved[0], "4242")
        self.assertEqual(sorted(moved), ["4242", "4300", "4301", "4302", "4400"])
        self.assertLess(moved.index("4301"), moved.index("4400"))

    def test_policy_values(self) -> None:
        """The policy's weights, reserve and limits are what the files hold."""
        limits = cgroup_limits_from(
            {
                "daemon_cpu_weight": 5000,
                "children_cpu_weight": 10,
                "daemon_memory_min": "32MiB",
                "daemon_memory_low": "256MiB",
                "children_memory_high": "1GiB",
                "children_memory_max": "2GiB",
                "children_pids_max": None,
            }
        )
        self.cgroups.configure(limits)
        daemon = os.path.join(self.box, "sandboxd-daemon")
        children = os.path.join(self.box, "sandboxd-children")
        self.assertEqual(read(f"{daemon}/cpu.weight"), "5000")
        self.assertEqual(read(f"{daemon}/memory.min"), str(32 * MIB))
        self.assertEqual(read(f"{daemon}/memory.low"), str(256 * MIB))
        self.assertEqual(read(f"{children}/cpu.weight"), "10")
        self.assertEqual(read(f"{children}/memory.high"), str(1024 * MIB))
        self.assertEqual(read(f"{children}/memory.max"), str(2048 * MIB))
        self.assertEqual(read(f"{children}/pids.max"), "max")

    def test_reload_rewrites_values_only(self) -> None:
        """A reload writes the new values; the leaves are set up once."""
        self.cgroups.configure(CgroupLimits())
        self.cgroups.configure(CgroupLimits(children_cpu_weight=20))
        moves = [n for n, _ in self.files.writes if n.endswith("daemon/cgroup.procs")]
        self.assertEqual(len(moves), 1)
        weight = os.path.join(self.box, "sandboxd-children/cpu.weight")
        self.assertEqual(read(weight), "20")

    def test_only_offered_controllers(self) -> None:
        """Where the hierarchy offers cpu alone, only cpu is enabled and set."""
        root, box = fake_tree(self, controllers="cpu io")
        status = ChildCgroups(root, FakeFiles(root)).configure(CgroupLimits())
        self.assertEqual(status.controllers, ("cpu",))
        self.assertEqual(read(f"{box}/cgroup.subtree_control"), "+cpu")
        self.assertEqual(
            sorted(os.listdir(f"{box}/sandboxd-children")),
            ["cgroup.procs", "cpu.weight"],
        )

    def test_refused_value_reported(self) -> None:
        """A value the kernel refuses is reported; the rest still applies."""
        self.files.refuse["box/sandboxd-daemon/memory.min"] = errno.EINVAL
        status = self.cgroups.configure(CgroupLimits())
        self.assertEqual(status.state, "active")
        self.assertEqual(
            status.errors, ("/box/sandboxd-daemon/memory.min: Invalid argument",)
        )
        low = os.path.join(self.box, "sandboxd-daemon/memory.low")
        self.assertEqual(read(low), str(128 * MIB))

    def test_disabled_by_policy(self) -> None:
        """``cgroups: false``: nothing created, no child placed, the state says so."""
        status = self.cgroups.configure(CgroupLimits(enabled=False))
        self.assertEqual(
            status.as_json(), {"state": "disabled", "reason": "policy cgroups: false"}
        )
        self.cgroups.place(4242)
        self.assertNotIn("sandboxd-children", os.listdir(self.box))

    def test_restore(self) -> None:
        """
        At stop the controllers the daemon enabled are disabled again, the
        daemon moves back and the leaves are removed.
        """
        self.cgroups.configure(CgroupLimits())
        self.cgroups.restore()
        self.assertEqual(
            self.files.writes[-2:],
            [
                ("box/cgroup.subtree_control", "-cpu -memory -pids"),
                ("box/cgroup.procs", str(os.getpid())),
            ],
        )
        self.assertNotIn("sandboxd-daemon", os.listdir(self.box))
        self.assertNotIn("sandboxd-children", os.listdir(self.box))
        self.cgroups.place(4242)  # no longer placing: nothing to write to


class ProcChildrenTests(SynchronousTestCase):
    """The walk down a child's tree reads the kernel's lists of children."""

    def test_real_children_listed(self) -> None:
        """A process this one started is among its children in ``/proc``."""
        if not os.path.exists(f"/proc/self/task/{os.getpid()}/children"):
            raise SkipTest("this kernel does not list children (CONFIG_PROC_CHILDREN)")
        child = subprocess.Popen(["sleep", "30"])
        self.addCleanup(child.wait)
        self.addCleanup(child.kill)
        self.assertIn(child.pid, ChildCgroups("/")._children_of(os.getpid()))


class RefusalTests(SynchronousTestCase):
    """Where no hierarchy may be used: nothing done, the reason said."""

    def assert_unavailable(self, cgroups_: ChildCgroups, box: str, reason: str) -> None:
        status = cgroups_.configure(CgroupLimits())
        self.assertEqual(status.state, "unavailable")
        self.assertIn(reason, status.reason or "")
        self.assertNotIn("sandboxd-daemon", os.listdir(box))
        self.assertNotIn("sandboxd-children", os.listdir(box))
        cgroups_.place(4242)

    def test_cgroup_v1_only(self) -> None:
        """cgroup v1 hierarchies alone: unavailable, naming them."""
        root, box = fake_tree(
            self, mountinfo=MOUNTINFO_V1, own="4:memory:/box\n1:cpu:/box\n"
        )
        self.assert_unavailable(
            ChildCgroups(root, FakeFiles(root)),
            box,
            "no cgroup v2 hierarchy for this process (cgroup v1 only: cpu, memory)",
        )

    def test_no_controllers(self) -> None:
        """A v2 hierarchy without cpu, memory or pids (bound to v1): unavailable."""
        root, box = fake_tree(self, controllers="hugetlb")
        self.assert_unavailable(
            ChildCgroups(root, FakeFiles(root)),
            box,
            "offers none of cpu, memory, pids (it offers: hugetlb)",
        )

    def test_not_delegated(self) -> None:
        """A cgroup whose subtree_control the daemon may not write: unavailable."""
        root, box = fake_tree(self)
        files = FakeFiles(root)
        files.not_writable.add("box/cgroup.subtree_control")
        self.assert_unavailable(
            ChildCgroups(root, files), box, "not delegated to the daemon"
        )

    def test_not_in_that_cgroup(self) -> None:
        """A cgroup that does not list the daemon is not taken for its own."""
        root, box = fake_tree(self)
        with open(os.path.join(box, "cgroup.procs"), "w") as f:
            f.write("1\n")
        self.assert_unavailable(
            ChildCgroups(root, FakeFiles(root)),
            box,
            "the daemon's own cgroup was not found",
        )

    def test_other_processes_in_the_cgroup(self) -> None:
        """
        The cgroup holds other processes, so the kernel will not hand its
        controllers down (EBUSY): the daemon moves back, the leaves go,
        and the reason names a process in the way.
        """
        root, box = fake_tree(self, others=(77,))
        files = FakeFiles(root, refuse={"box/cgroup.subtree_control": errno.EBUSY})
        self.assert_unavailable(
            ChildCgroups(root, files), box, "holds other processes (77)"
        )
        self.assertEqual(files.writes[-1], ("box/cgroup.procs", str(os.getpid())))

    def test_reason_logged_once(self) -> None:
        """A reload that finds the same reason does not log it again."""
        root, _ = fake_tree(self, controllers="hugetlb")
        events: list[dict[str, Any]] = []
        from twisted.logger import globalLogPublisher

        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        subject = ChildCgroups(root, FakeFiles(root))
        subject.configure(CgroupLimits())
        subject.configure(CgroupLimits())
        lines = [e for e in events if "cgroups unavailable" in str(e.get("line", ""))]
        self.assertEqual(len(lines), 1)


class PolicyTests(SynchronousTestCase):
    """The policy's ``cgroups`` value: defaults, forms and clear refusals."""

    def test_forms(self) -> None:
        """``true``, ``false`` and an object with sizes in bytes or units."""
        self.assertEqual(cgroup_limits_from(True), CgroupLimits())
        self.assertFalse(cgroup_limits_from(False).enabled)
        limits = cgroup_limits_from(
            {"daemon_memory_min": 0, "children_memory_max": "512MiB"}
        )
        self.assertEqual(
            (limits.daemon_memory_min, limits.children_memory_max), (0, 512 * MIB)
        )

    def test_refusals(self) -> None:
        """Every bad value is refused with a message naming the key."""
        cases = {
            "cgroups: expected true, false or an object": [],
            "cgroups: unknown key 'cpu_weight'": {"cpu_weight": 1},
            "cgroups.enabled: expected true or false": {"enabled": "yes"},
            "cgroups.daemon_cpu_weight: 0 is outside 1..10000": {
                "daemon_cpu_weight": 0
            },
            "cgroups.children_cpu_weight: expected an integer": {
                "children_cpu_weight": "100"
            },
            "cgroups.children_pids_max: 0 is outside 1..4194304": {
                "children_pids_max": 0
            },
            "cgroups.daemon_memory_min: not a size": {"daemon_memory_min": "lots"},
            "cgroups.daemon_memory_min: not a size: None": {"daemon_memory_min": None},
            "cgroups.children_memory_max: 64 bytes is below": {
                "children_memory_max": 64
            },
            "cgroups.daemon_memory_low: below daemon_memory_min": {
                "daemon_memory_min": "1GiB"
            },
            "cgroups.children_memory_high: above children_memory_max": {
                "children_memory_high": "2GiB",
                "children_memory_max": "1GiB",
            },
        }
        for message, value in cases.items():
            with self.assertRaises(ValueError) as caught:
                cgroup_limits_from(value)
            self.assertIn(message, str(caught.exception), value)

    def test_document_refuses(self) -> None:
        """A policy document with a bad ``cgroups`` is refused as a whole."""
        with self.assertRaises(PolicyError) as caught:
            load_policy(
                default_table(),
                explicit={"cgroups": {"children_pids_max": -1}},
                base_dir="/tmp",
                environ={},
            )
        self.assertIn("cgroups.children_pids_max", str(caught.exception))


class DaemonTests(DaemonTestCase):
    """A real daemon: its report, and its children placed at spawn."""

    autostart = False

    @inlineCallbacks
    def test_children_placed_at_spawn(self) -> Any:
        """
        With a delegated hierarchy (a fake tree), a background process and
        a terminal started through the daemon are in the children's leaf, and
        ``/system/info`` says where the daemon and its children are.
        """
        root, box = fake_tree(self)
        self.patch(cgroups.CHILD_CGROUPS, "root", root)
        self.patch(cgroups.CHILD_CGROUPS, "files", FakeFiles(root))
        yield self.start()
        reply = yield self.request("POST", "/process/start", {"command": "sleep 30"})
        self.assertEqual(reply.status, 200, reply.body)
        pid = reply.json()["pid"]
        self.assertTrue(cgroups.CHILD_CGROUPS.settle(5))
        procs = read(os.path.join(box, "sandboxd-children/cgroup.procs"))
        self.assertIn(f"{pid}\n", procs)
        terminal = yield self.request("POST", "/pty/sessions", {"shell": "sh"})
        self.assertEqual(terminal.status, 200, terminal.body)
        self.assertTrue(cgroups.CHILD_CGROUPS.settle(5))
        procs = read(os.path.join(box, "sandboxd-children/cgroup.procs"))
        self.assertIn(f"{terminal.json()['pid']}\n", procs)
        info = (yield self.request("GET", "/system/info")).json()
        self.assertEqual(info["cgroups"]["state"], "active")
        self.assertEqual(info["cgroups"]["children"], "/box/sandboxd-children")

    @inlineCallbacks
    def test_placed_with_priority_off(self) -> Any:
        """With ``priority: false`` children are still placed: the two are apart."""
        root, box = fake_tree(self)
        self.patch(cgroups.CHILD_CGROUPS, "root", root)
        self.patch(cgroups.CHILD_CGROUPS, "files", FakeFiles(root))
        yield self.start(policy={"priority": False})
        reply = yield self.request("POST", "/process/start", {"command": "sleep 30"})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertTrue(cgroups.CHILD_CGROUPS.settle(5))
        procs = read(os.path.join(box, "sandboxd-children/cgroup.procs"))
        self.assertIn(f"{reply.json()['pid']}\n", procs)

    @inlineCallbacks
    def test_disabled_by_policy(self) -> Any:
        """With ``cgroups: false`` ``/system/info`` says ``disabled``."""
        yield self.start(policy={"cgroups": False})
        info = (yield self.request("GET", "/system/info")).json()
        self.assertEqual(info["cgroups"]["state"], "disabled")

    @inlineCallbacks
    def test_real_hierarchy(self) -> Any:
        """
        On this machine's own hierarchy: where it is delegated, a ``/shell``
        child reads its cgroup as the children's leaf; where it is not,
        ``/system/info`` gives the reason (and the test is skipped with it).
        """
        yield self.start()
        info = (yield self.request("GET", "/system/info")).json()
        status = info["cgroups"]
        if status["state"] != "active":
            self.assertTrue(status.get("reason"))
            raise SkipTest(f"no writable cgroup v2 hierarchy here: {status['reason']}")
        # cat starts after its shell was placed (a child is moved just
        # after it execs).
        command = "sleep 0.2; cat /proc/self/cgroup"
        reply = yield self.request(
            "POST", "/shell", {"command": command, "shell": "sh"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertIn(f"0::{status['children']}\n", reply.json()["stdout"])
        with open("/proc/self/cgroup") as f:
            self.assertIn(f"0::{status['daemon']}\n", f.read())
