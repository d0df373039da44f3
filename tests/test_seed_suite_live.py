"""The seed suite's live-server helper and ports other tests take."""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from types import ModuleType

from twisted.trial.unittest import SynchronousTestCase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_live() -> ModuleType:
    """``scripts/seed_suite/live.py`` as the seed's suite imports it."""
    path = os.path.join(ROOT, "scripts", "seed_suite", "live.py")
    spec = importlib.util.spec_from_file_location("seed_suite_live", path)
    assert spec is not None and spec.loader is not None
    live = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(live)
    return live


def restore_env(name: str, value: str | None) -> None:
    """Put an environment variable back as it was."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


class TakenPortTests(SynchronousTestCase):
    """A port a test chose can be taken by another worker before the daemon binds it."""

    def setUp(self) -> None:
        self.live = load_live()
        # trial -j runs these tests side by side in workers whose
        # directories are _trial_temp/N, each loading the helper afresh: a
        # run of ports each, or two workers' daemons take the same one.
        worker = os.path.basename(os.getcwd())
        if worker.isdigit():
            self.patch(self.live, "_next_port", [int(worker) * 100])
        self.patch(self.live, "COMMAND", [sys.executable, "-m", "sandboxd"])
        base = os.path.realpath(self.mktemp())
        os.makedirs(base)
        previous = os.environ.get("ABX_SERVER_BASE_DIR")
        os.environ["ABX_SERVER_BASE_DIR"] = base
        self.addCleanup(restore_env, "ABX_SERVER_BASE_DIR", previous)
        self.patch(self.live, "START_SECONDS", 10.0)
        self.addCleanup(self.live.stop_all)

    def test_a_stranger_on_the_port_is_not_the_daemon(self) -> None:
        """
        Something else listening on the port accepts connections, but the
        daemon cannot bind it: ``start`` says the daemon exited instead of
        handing the test a server that is not sandboxd.
        """
        stranger = socket.socket()
        self.addCleanup(stranger.close)
        stranger.bind(("127.0.0.1", 0))
        stranger.listen(8)
        port = stranger.getsockname()[1]
        with self.assertRaises(RuntimeError) as raised:
            self.live.start(port, self.live.free_port(), None)
        self.assertIn("sandboxd exited", str(raised.exception))
        self.assertIn(str(port), str(raised.exception))

    def test_the_daemon_started_is_returned(self) -> None:
        """On a free port the child returned is the one listening there."""
        port = self.live.free_port()
        child = self.live.start(port, self.live._other_port(port), None)
        self.assertIn(port, self.live.ports_of(child.pid))
        self.live.stop(child)
        self.assertIsNotNone(child.returncode)

    def test_own_ports_stay_out_of_the_ephemeral_range(self) -> None:
        """
        The helper's own picks never land where the seed's tests pick theirs
        (binding port 0), and each xdist worker has a block of its own.
        """
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
        self.patch(os, "environ", {**os.environ, "PYTEST_XDIST_WORKER": "gw1"})
        ours = {self.live.free_port() for _ in range(20)}
        self.assertLess(max(ours), low)
        self.patch(os, "environ", {**os.environ, "PYTEST_XDIST_WORKER": "gw2"})
        theirs = {self.live.free_port() for _ in range(20)}
        self.assertEqual(ours & theirs, set())
