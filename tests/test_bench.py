"""``make bench`` from a checkout without the shared harness still runs what it can."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import time
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FreshCloneTests(SynchronousTestCase):
    """bench/run.sh where ../shared/bench is absent."""

    def test_without_harness(self) -> None:
        """
        It says where the W0-W7 harness comes from, then runs RAW, MCP,
        PTY-CEILING, E2B, FIRST-REQUEST, CLIENT, GIT-CLONE, CODE and W9-DAEMON, exit 0.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABX_")}
        env.update(
            SHARED_BENCH=os.path.abspath(self.mktemp()),
            RAW_MIB="4",
            MCP_CALLS="80",
            MCP_SHELL_CALLS="16",
            MCP_ROUNDS="1",
            E2B_COMMANDS="16",
            E2B_MIB="4",
            CLIENT_RUNS="20",
            CLIENT_ROUNDS="1",
            FIRST_DAEMONS="2",
            PREVIEW_SECONDS="1",
            PREVIEW_MESSAGES="50",
            PREVIEW_ROUNDS="1",
            GIT_MIB="2",
            GIT_ROUNDS="1",
            CODE_CALLS="10",
            CODE_MIB="1",
            CODE_ROUNDS="1",
            BUSY_SECONDS="1",
            BUSY_SHELLS="5",
        )
        result = subprocess.run(
            [os.path.join(ROOT, "bench", "run.sh")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            stdin=subprocess.DEVNULL,
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("SHARED_BENCH", result.stderr)
        self.assertIn("Skipping W0-W7", result.stderr)
        workloads = {
            json.loads(line)["workload"]
            for line in result.stdout.splitlines()
            if line.startswith("{")
        }
        expected = {
            "RAW",
            "MCP",
            "PTY-CEILING",
            "E2B",
            "FIRST-REQUEST",
            "CLIENT",
            "GIT-CLONE",
            "CODE",
            "W9-DAEMON",
        }
        if shutil.which("nginx") and shutil.which("wrk"):
            expected.add("PREVIEW")
        else:
            self.assertIn("nginx", result.stderr)
        self.assertEqual(workloads, expected)


class TakenPortTests(SynchronousTestCase):
    """bench/daemon.py's daemons beside other servers (the suite's, in parallel)."""

    def test_a_taken_port_is_tried_again(self) -> None:
        """
        When the port picked for a daemon is taken by another daemon before
        it binds, the other one answers ``/health`` but refuses the token:
        a new port is tried, and the daemon returned is the one started.
        """
        daemon = self.bench_daemon()
        other, taken = daemon.start_daemon(self.mktemp_dir(), "other-token")
        self.addCleanup(daemon.stop, other)
        picks = iter([taken])
        free_port = daemon.free_port
        self.patch(daemon, "free_port", lambda: next(picks, None) or free_port())
        ours, port = daemon.start_daemon(self.mktemp_dir(), "our-token")
        self.addCleanup(daemon.stop, ours)
        self.assertNotEqual(port, taken)
        self.assertTrue(daemon._answers_with(port, "our-token"))
        self.assertFalse(daemon._answers_with(taken, "our-token"))

    def test_a_taken_terminal_port_is_tried_again(self) -> None:
        """
        When the terminal port picked for a daemon is taken, the daemon
        exits at once; other ports are tried without waiting out the
        start's deadline.
        """
        daemon = self.bench_daemon()
        holder = socket.socket()
        self.addCleanup(holder.close)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        free_port = daemon.free_port
        picks = iter([free_port(), taken])
        self.patch(daemon, "free_port", lambda: next(picks, None) or free_port())
        began = time.monotonic()
        ours, port = daemon.start_daemon(
            self.mktemp_dir(), "our-token", wait_seconds=30
        )
        self.addCleanup(daemon.stop, ours)
        self.assertTrue(daemon._answers_with(port, "our-token"))
        self.assertLess(time.monotonic() - began, 30)

    def bench_daemon(self) -> Any:
        """bench/daemon.py, imported as the harness imports it."""
        path = os.path.join(ROOT, "bench", "daemon.py")
        spec = importlib.util.spec_from_file_location("bench_daemon", path)
        assert spec is not None and spec.loader is not None
        daemon = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(daemon)
        return daemon

    def mktemp_dir(self) -> str:
        path = os.path.realpath(self.mktemp())
        os.makedirs(path)
        return path
