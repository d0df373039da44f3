"""
Processes a daemon killed outright left running are ended by the next
start (sandboxd.processes.strays).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any
from unittest import SkipTest

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.processes.strays import end_strays
from sandboxd.processes.tree import TREE_MARKER, marker_scope, new_marker, proc_info
from tests.test_cli import DaemonProcess, serve_argv

#: Starts a tree as a daemon would (marked with its own instance and the
#: scope ARGV[1]), prints the pids of its two processes and exits at once,
#: as a daemon killed outright does: the marked shell (become ``sleep``)
#: and, below it, a ``sleep`` that cleared its environment.  ARGV[2]: what
#: the shell runs first (a ``trap`` or nothing).
_KILLED_DAEMON = """
import os, subprocess, sys
with open("/proc/self/stat") as f:
    start = f.read().rsplit(")", 1)[1].split()[19]
marker = f"{os.getpid()}-{start}-{sys.argv[1]}.0123456789abcdef"
child = subprocess.Popen(
    ["sh", "-c", sys.argv[2] + " env -i sleep 300 & echo $!; exec sleep 300"],
    env={**os.environ, "SANDBOXD_PROCESS_TREE": marker},
    stdout=subprocess.PIPE,
    stdin=subprocess.DEVNULL,
    start_new_session=True,
)
print(child.pid, child.stdout.readline().decode().strip(), flush=True)
os._exit(0)
"""


def running(pid: int) -> bool:
    info = proc_info(pid)
    return info is not None and info.state != "Z"


def until_gone(pids: list[int]) -> None:
    """Until none of ``pids`` runs (a SIGKILL takes effect soon, not at once)."""
    deadline = time.monotonic() + 10
    while any(running(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"still running: {pids}")
        time.sleep(0.01)


class EndStraysTests(SynchronousTestCase):
    """
    end_strays: what it ends, what it leaves, how long it waits.  Each test
    has a scope of its own: the daemons other tests start at the same time
    end their own scope's strays only.
    """

    def setUp(self) -> None:
        self.scope = marker_scope(os.path.abspath(self.mktemp()))

    def killed_daemon_tree(self, first: str = "", scope: str = "") -> list[int]:
        """The pids a "daemon" that just died left running (ended at the test's end)."""
        out = subprocess.run(
            [sys.executable, "-c", _KILLED_DAEMON, scope or self.scope, first],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=30,
            check=True,
        ).stdout
        pids = [int(p) for p in out.split()]
        for pid in pids:
            self.addCleanup(_kill, pid)
        deadline = time.monotonic() + 10
        # Until both have exec'd sleep (a busy machine).
        while time.monotonic() < deadline:
            if all(_argv0(pid) == b"sleep" for pid in pids):
                break
            time.sleep(0.01)
        return pids

    def live_daemons_child(self) -> subprocess.Popen[bytes]:
        """A process marked by this process, which runs: not a stray."""
        child = subprocess.Popen(
            ["sleep", "300"],
            env={**os.environ, TREE_MARKER: new_marker(self.scope)},
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.addCleanup(lambda: (child.kill(), child.wait()))
        return child

    def test_a_dead_daemons_tree_ended(self) -> None:
        """
        The marked process of a daemon that is gone and the one below it
        that cleared its environment are ended and named; a process of a
        daemon that runs, and one of a dead daemon that served another base
        dir, are left alone.
        """
        pids = self.killed_daemon_tree()
        other = self.killed_daemon_tree(scope=self.scope + "0")
        kept = self.live_daemons_child()
        self.assertTrue(all(running(pid) for pid in pids))
        ended = end_strays(self.scope, grace=5)
        self.assertEqual(sorted(p for p, _ in ended), sorted(pids))
        self.assertEqual({name for _, name in ended}, {"sleep"})
        until_gone(pids)
        self.assertIsNone(kept.poll())
        self.assertTrue(all(running(pid) for pid in other))

    def test_sigkill_after_the_grace(self) -> None:
        """A stray that ignores SIGTERM gets SIGKILL once the grace is over."""
        pids = self.killed_daemon_tree("trap '' TERM;")
        started = time.monotonic()
        end_strays(self.scope, grace=0.5)
        self.assertGreaterEqual(time.monotonic() - started, 0.5)
        until_gone(pids)

    def test_another_pid_namespace_left_alone(self) -> None:
        """
        A marked process in another pid namespace names its daemon by that
        namespace's pid, which means somebody else here: left alone.
        """
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            raise SkipTest("needs root and unshare(1) to make a pid namespace")
        marker = f"{TREE_MARKER}=999999999-1-{self.scope}.0123"
        child = subprocess.Popen(
            ["unshare", "--pid", "--fork", "env", marker, "sleep", "300"],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.addCleanup(lambda: (os.killpg(child.pid, signal.SIGKILL), child.wait()))
        deadline = time.monotonic() + 10
        inner: list[int] = []
        while not inner and time.monotonic() < deadline:
            inner = [p for p in _children(child.pid) if _argv0(p) == b"sleep"]
            time.sleep(0.01)
        if not inner:
            raise SkipTest("unshare could not make a pid namespace here")
        ended = [p for p, _ in end_strays(self.scope, grace=1)]
        self.assertNotIn(inner[0], ended)
        self.assertTrue(running(inner[0]))


class RestartTests(SynchronousTestCase):
    """A daemon started after one killed outright ends what that one left."""

    def test_background_process_of_a_killed_daemon(self) -> None:
        """
        A background process outlives its daemon's SIGKILL; the next start
        ends it and logs which it ended.
        """
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        first = DaemonProcess(self, serve_argv(base))
        first.wait_healthy()
        started = _post(first.port, "/process/start", {"command": "sleep 300"})
        pid: int = started["pid"]
        self.addCleanup(_kill, pid)
        first.kill_tree()
        time.sleep(0.2)
        self.assertTrue(running(pid), "the child died with its daemon")
        second = DaemonProcess(self, serve_argv(base))
        second.wait_healthy()
        deadline = time.monotonic() + 20
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(running(pid))
        while not re.search(rf"\b{pid} \([^)]*sleep\)", second.output()):
            self.assertLess(time.monotonic(), deadline, second.output())
            time.sleep(0.05)
        self.assertIn("left running", second.output())


def _post(port: int, path: str, body: object) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def _argv0(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return os.path.basename(f.read().split(b"\0")[0])
    except OSError:
        return b""


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


class WithoutPtraceTests(SynchronousTestCase):
    """
    A root daemon without ``CAP_SYS_PTRACE`` (Docker's default set, the
    shipped Kubernetes manifests) still reads the marker of a child that
    runs as another user: the kernel lets a reader whose file-system ids
    are the child's read its environment.
    """

    def test_marker_of_another_users_child(self) -> None:
        """Its marker is read, and it is found a stray when its daemon is gone."""
        if os.geteuid() != 0 or shutil.which("setpriv") is None:
            raise SkipTest("needs root and setpriv(1) to drop CAP_SYS_PTRACE")
        scope = marker_scope(os.path.abspath(self.mktemp()))
        # A daemon that no longer runs: the child is a stray of ``scope``.
        marker = f"999999999-1-{scope}.0123456789abcdef"
        child = subprocess.Popen(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sleep",
                "300",
            ],
            env={**os.environ, TREE_MARKER: marker},
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.addCleanup(lambda: (child.kill(), child.wait()))
        deadline = time.monotonic() + 10
        while _argv0(child.pid) != b"sleep" and time.monotonic() < deadline:
            time.sleep(0.01)
        read = subprocess.run(
            [
                "setpriv",
                # What the shipped Kubernetes manifests give (no SYS_PTRACE).
                "--bounding-set=-all,+setuid,+setgid,+kill,+chown,+dac_override,+fowner",
                sys.executable,
                "-c",
                "from sandboxd.processes.tree import environ_block, marked_by;"
                "from sandboxd.processes.strays import strays;"
                f" print(marked_by(environ_block({child.pid}) or b''));"
                f" print({child.pid} in strays({scope!r}))",
            ],
            capture_output=True,
            timeout=30,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        )
        self.assertEqual(read.returncode, 0, read.stderr)
        marked, stray = read.stdout.decode().splitlines()
        self.assertIn(f"scope='{scope}'", marked, read.stderr)
        self.assertEqual(stray, "True", read.stderr)
