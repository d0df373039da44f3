"""``sandboxd reload`` finds the daemon the documented invocations start."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from contextlib import redirect_stderr

from twisted.trial.unittest import SynchronousTestCase

from sandboxd import cli
from sandboxd.daemon import running


class RunningDaemonsTests(SynchronousTestCase):
    """Which processes count as a running sandboxd."""

    def fake_proc(self, commands: dict[int, list[str]]) -> str:
        proc = os.path.abspath(self.mktemp())
        for pid, argv in commands.items():
            os.makedirs(os.path.join(proc, str(pid)))
            with open(os.path.join(proc, str(pid), "cmdline"), "wb") as f:
                f.write(b"\0".join(a.encode() for a in argv) + b"\0")
        os.makedirs(os.path.join(proc, "self"))
        return proc

    def test_found(self) -> None:
        """twistd ... sandboxd and sandboxd serve count; other twistd apps and commands do not."""
        proc = self.fake_proc(
            {
                11: [
                    "/opt/venv/bin/python",
                    "/opt/venv/bin/twistd",
                    "--nodaemon",
                    "--pidfile=",
                    "sandboxd",
                    "--port",
                    "9000",
                ],
                12: ["/usr/bin/twistd", "-n", "web", "--path", "."],
                13: [
                    "/x/.venv/bin/python",
                    "/x/.venv/bin/sandboxd",
                    "serve",
                    "--port",
                    "9000",
                ],
                14: ["/x/.venv/bin/python", "/x/.venv/bin/sandboxd", "reload"],
                15: ["vim", "sandboxd"],
            }
        )
        self.assertEqual(running.running_daemons(proc), [11, 13])


class ReloadTests(SynchronousTestCase):
    """cli.reload without --pid and without a pidfile."""

    def test_signals_the_one_running(self) -> None:
        """With no pidfile, the one daemon found gets SIGHUP."""
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import signal, sys, time\n"
                "signal.signal(signal.SIGHUP, lambda *a: sys.exit(7))\n"
                "print('ready', flush=True)\n"
                "time.sleep(30)\n",
            ],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        self.addCleanup(lambda: child.poll() is None and child.kill())
        assert child.stdout is not None
        child.stdout.readline()
        self.patch(running, "running_daemons", lambda: [child.pid])
        options = cli.ReloadOptions()
        options.parseOptions(["--pidfile", os.path.abspath(self.mktemp())])
        self.assertEqual(cli.reload(options), 0)
        self.assertEqual(child.wait(timeout=10), 7)

    def test_none_or_several(self) -> None:
        """No daemon, or several, is exit 1 with a line saying which."""
        for found, text in (([], "no running sandboxd"), ([5, 6], "5, 6")):
            self.patch(running, "running_daemons", lambda found=found: found)
            options = cli.ReloadOptions()
            options.parseOptions(["--pidfile", os.path.abspath(self.mktemp())])
            err = io.StringIO()
            with redirect_stderr(err):
                self.assertEqual(cli.reload(options), 1)
            self.assertIn(text, err.getvalue())
