"""The seed's server is started as a terminal would start it, however the suite was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from tests.seed.policycompare import python_module_argv

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
