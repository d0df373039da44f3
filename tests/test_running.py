"""``sandboxd reload`` finds the daemon the documented invocations start."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout

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

    def test_wrapper_is_not_a_daemon(self) -> None:
        """
        The container's PID 1, ``tini -- sandboxd serve ...``, is the
        daemon's parent, not a second daemon: the daemon alone is found.
        An unrelated second daemon still counts.
        """
        serve = ["sandboxd", "serve", "--port", "tcp:9000:interface=0.0.0.0"]
        proc = self.fake_proc(
            {
                1: ["/usr/bin/tini", "--", *serve],
                7: ["/usr/local/bin/python", "/usr/local/bin/sandboxd", *serve[1:]],
                9: ["/usr/local/bin/python", "/usr/local/bin/sandboxd", *serve[1:]],
            }
        )
        for pid, parent, name in ((1, 0, "tini"), (7, 1, "sandboxd"), (9, 0, "x y)")):
            with open(os.path.join(proc, str(pid), "stat"), "w") as f:
                f.write(f"{pid} ({name}) S {parent} {pid} {pid} 0 -1\n")
        self.assertEqual(running.running_daemons(proc), [7, 9])
        os.remove(os.path.join(proc, "9", "cmdline"))
        self.assertEqual(running.running_daemons(proc), [7])


class ReloadTests(SynchronousTestCase):
    """cli.reload: which pid it signals, and which it refuses."""

    def fake_daemon(self) -> subprocess.Popen[bytes]:
        """A process that looks like ``sandboxd serve`` and exits 7 on SIGHUP."""
        where = os.path.abspath(self.mktemp())
        os.makedirs(where)
        script = os.path.join(where, "sandboxd")
        with open(script, "w") as f:
            f.write(
                "import signal, sys, time\n"
                "signal.signal(signal.SIGHUP, lambda *a: sys.exit(7))\n"
                "print('ready', flush=True)\n"
                "time.sleep(30)\n"
            )
        child = subprocess.Popen(
            [sys.executable, script, "serve"],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        self.addCleanup(lambda: child.poll() is None and child.kill())
        assert child.stdout is not None
        child.stdout.readline()
        return child

    def other_process(self) -> subprocess.Popen[bytes]:
        """A process that is not sandboxd, with SIGHUP's default action (death)."""
        child = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
        self.addCleanup(lambda: child.poll() is None and child.kill())
        # Until it has exec'd, its command line reads empty (a busy machine).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{child.pid}/cmdline", "rb") as f:
                if f.read().startswith(b"sleep"):
                    break
            time.sleep(0.01)
        return child

    def reload(self, *argv: str) -> tuple[int, str, str]:
        """``sandboxd reload ARGV``: its status, stdout and stderr."""
        options = cli.ReloadOptions()
        options.parseOptions(list(argv))
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            status = cli.reload(options)
        return status, out.getvalue(), err.getvalue()

    def test_signals_the_one_running(self) -> None:
        """With neither --pid nor --pidfile, the one daemon found gets SIGHUP, and says so."""
        child = self.fake_daemon()
        self.patch(running, "running_daemons", lambda: [child.pid])
        status, out, _ = self.reload()
        self.assertEqual(status, 0)
        self.assertEqual(out, f"sandboxd reload: sent SIGHUP to sandboxd {child.pid}\n")
        self.assertEqual(child.wait(timeout=10), 7)

    def test_stale_pidfile_here_is_not_read(self) -> None:
        """
        A ``twistd.pid`` left in the current directory, naming a pid
        reused since, is not read: the running daemon is signalled.
        """
        child = self.fake_daemon()
        other = self.other_process()
        here = os.path.abspath(self.mktemp())
        os.makedirs(here)
        with open(os.path.join(here, "twistd.pid"), "w") as f:
            f.write(str(other.pid))
        self.patch(running, "running_daemons", lambda: [child.pid])
        cwd = os.getcwd()
        os.chdir(here)
        self.addCleanup(os.chdir, cwd)
        self.assertEqual(self.reload()[0], 0)
        self.assertEqual(child.wait(timeout=10), 7)
        self.assertIsNone(other.poll())

    def test_refuses_what_is_not_sandboxd(self) -> None:
        """
        A pid (given, or read from a pidfile) that is not a running sandboxd
        is refused with exit 1 and a line saying so; nothing is signalled.
        """
        other = self.other_process()
        pidfile = os.path.abspath(self.mktemp())
        with open(pidfile, "w") as f:
            f.write(f"{other.pid}\n")
        for argv in (["--pid", str(other.pid)], ["--pidfile", pidfile]):
            status, out, err = self.reload(*argv)
            self.assertEqual(status, 1)
            self.assertEqual(out, "")
            self.assertIn(f"process {other.pid} is not sandboxd (sleep 30)", err)
            self.assertIn("nothing was signalled", err)
        time.sleep(0.2)
        self.assertIsNone(other.poll())
        for pid, text in (("0", "process 0 does not run"), ("x", "'x' is not a pid")):
            status, _, err = self.reload("--pid", pid)
            self.assertEqual(status, 1)
            self.assertIn(text, err)

    def test_pidfile_of_a_daemon(self) -> None:
        """A pidfile naming a running sandboxd is honoured."""
        child = self.fake_daemon()
        pidfile = os.path.abspath(self.mktemp())
        with open(pidfile, "w") as f:
            f.write(str(child.pid))
        self.patch(running, "running_daemons", lambda: [])
        self.assertEqual(self.reload("--pidfile", pidfile)[0], 0)
        self.assertEqual(child.wait(timeout=10), 7)

    def test_none_or_several(self) -> None:
        """No daemon, or several, is exit 1 with a line saying which."""
        for found, text in (([], "no running sandboxd"), ([5, 6], "5, 6")):
            self.patch(running, "running_daemons", lambda found=found: found)
            status, _, err = self.reload()
            self.assertEqual(status, 1)
            self.assertIn(text, err)
