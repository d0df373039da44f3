"""
The seed's server is started as a terminal would start it, however the
suite was, and a comparison only reads from the servers it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from twisted.trial.unittest import SynchronousTestCase

from tests.helpers import free_port, session_listens
from tests.seed.policycompare import BIN, python_module_argv, sandboxd_server

#: A module that reports which signals a process it starts ignores.
PROBE = """
import subprocess
status = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True)
print([l for l in status.stdout.splitlines() if l.startswith("SigIgn:")][0].split()[1])
"""


def ignoring_interrupts() -> None:
    """In the child before exec: ignore SIGINT and SIGQUIT, as ``cmd &`` in a script does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


class DefaultSignalsTests(SynchronousTestCase):
    """A module run through :func:`python_module_argv` starts children that take SIGINT."""

    def test_children_take_interrupts(self) -> None:
        """
        Started with SIGINT and SIGQUIT ignored, the module's own children
        ignore neither, and the module got its arguments.
        """
        work = self.mktemp()
        os.makedirs(work)
        with open(os.path.join(work, "sigprobe.py"), "w") as f:
            f.write(PROBE + "import sys\nprint(sys.argv[1:])\n")
        run = subprocess.run(
            python_module_argv("sigprobe", "a", "b"),
            cwd=work,
            env={**os.environ, "PYTHONPATH": work},
            preexec_fn=ignoring_interrupts,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        mask, argv = run.stdout.splitlines()
        ignored = int(mask, 16)
        self.assertFalse(ignored & (1 << (signal.SIGINT - 1)), mask)
        self.assertFalse(ignored & (1 << (signal.SIGQUIT - 1)), mask)
        self.assertEqual(argv, "['a', 'b']")

    def test_probe_sees_the_ignoring(self) -> None:
        """Without the prelude the same start does pass the ignoring on (the probe works)."""
        work = self.mktemp()
        os.makedirs(work)
        with open(os.path.join(work, "sigprobe.py"), "w") as f:
            f.write(PROBE)
        run = subprocess.run(
            [sys.executable, "-m", "sigprobe"],
            cwd=work,
            env={**os.environ, "PYTHONPATH": work},
            preexec_fn=ignoring_interrupts,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        self.assertTrue(int(run.stdout, 16) & (1 << (signal.SIGINT - 1)), run.stdout)


class TakenPortTests(SynchronousTestCase):
    """A server whose port another process took first is not mistaken for that process."""

    def impostor(self, port: int) -> subprocess.Popen[bytes]:
        """An HTTP server of another session on ``port`` (``/health`` answers 404)."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=tempfile.gettempdir(),
            start_new_session=True,
        )

        def end() -> None:
            proc.kill()
            proc.wait()

        self.addCleanup(end)
        deadline = time.monotonic() + 30
        while not session_listens(proc.pid, port):
            self.assertLess(time.monotonic(), deadline, "the impostor did not listen")
            time.sleep(0.05)
        return proc

    def test_taken_port_is_not_up(self) -> None:
        """
        sandboxd started on a port an HTTP server holds ends, and the
        comparison says it did not come up and why, instead of reading
        the other server's answers as its own.
        """
        port = free_port()
        impostor = self.impostor(port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/") as r:
            self.assertEqual(r.status, 200)
        base = self.mktemp()
        os.makedirs(base)
        policy = os.path.join(base, "policy.json")
        with open(policy, "w") as f:
            f.write("{}")
        server = sandboxd_server(policy, {}, base, os.path.join(BIN, "sandboxd"), port)
        self.addCleanup(server.stop)
        self.assertFalse(server.wait(timeout=60))
        self.assertTrue(server.lost_its_port(), server.output())
        self.assertTrue(session_listens(impostor.pid, port))
