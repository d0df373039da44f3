"""
``sandboxd/landlock.py``: the rights each Landlock ABI knows, and the
script a confined child runs, run as a child of the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Any

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd import landlock


def run(spec: Any, *argv: str) -> subprocess.CompletedProcess[str]:
    """The script as the daemon starts it, confining ``argv``."""
    return subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            landlock.__file__,
            *landlock.options(spec),
            "--",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


class RightsTests(SynchronousTestCase):
    """Each ABI handles the rights it knows, and no more."""

    def test_rights_by_version(self) -> None:
        """ABI 1 has 13 rights; 2 adds REFER, 3 TRUNCATE, 5 IOCTL_DEV."""
        self.assertEqual(landlock.fs_rights(1), (1 << 13) - 1)
        self.assertEqual(landlock.fs_rights(2), (1 << 14) - 1)
        self.assertEqual(landlock.fs_rights(3), (1 << 15) - 1)
        self.assertEqual(landlock.fs_rights(4), landlock.fs_rights(3))
        self.assertEqual(landlock.fs_rights(7), (1 << 16) - 1)


class OptionsTests(SynchronousTestCase):
    """A spec survives the trip through the child's command line."""

    def test_round_trip(self) -> None:
        """Paths with ``=`` and ``,``, no ports, some ports, and none at all."""
        spec = {
            "read": ["/", "/a=b,c"],
            "write": ["/w"],
            "signals": True,
            "connect": [443, 80],
            "bind": [],
        }
        options = landlock.options(spec)
        self.assertEqual(
            options,
            [
                "--read=/",
                "--read=/a=b,c",
                "--write=/w",
                "--signals",
                "--tcp-connect=443,80",
                "--tcp-bind=",
            ],
        )
        self.assertEqual(
            landlock.parse([*options, "--", "/bin/x", "x", "--read=/etc"]),
            (spec, ["/bin/x", "x", "--read=/etc"]),
        )
        self.assertEqual(
            landlock.parse(["--", "/bin/x", "x"]),
            ({"read": [], "write": [], "signals": False}, ["/bin/x", "x"]),
        )


class ScriptTests(SynchronousTestCase):
    """The child's side: confine, then exec; say why when it cannot."""

    def setUp(self) -> None:
        if landlock.abi_version() < 1:
            raise SkipTest("this kernel has no Landlock")
        self.dir = tempfile.mkdtemp(prefix="sandboxd-landlock-")
        self.addCleanup(subprocess.run, ["rm", "-rf", self.dir], check=False)

    def test_usage(self) -> None:
        """Too few arguments: exit 2 and a usage line."""
        done = subprocess.run(
            [sys.executable, "-I", "-S", landlock.__file__],
            capture_output=True,
            text=True,
        )
        self.assertEqual(done.returncode, 2)
        self.assertIn("usage:", done.stderr)

    def test_missing_program(self) -> None:
        """A program that does not exist: 127, as a shell says."""
        done = run({"read": ["/"]}, "/nonexistent/prog", "prog")
        self.assertEqual(done.returncode, 127)
        self.assertEqual(
            done.stderr,
            "sandboxd: cannot run /nonexistent/prog: No such file or directory\n",
        )

    def test_read_only_where_listed(self) -> None:
        """
        With ``read`` limited to the system's directories, a file elsewhere
        cannot be read, and a program elsewhere cannot be run (126).
        """
        secret = os.path.join(self.dir, "secret")
        with open(secret, "w") as f:
            f.write("s")
        os.chmod(secret, 0o755)
        system = ["/usr", "/bin", "/lib", "/lib64", "/etc"]
        done = run({"read": system}, "/bin/cat", "cat", secret)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("Permission denied", done.stderr)
        done = run({"read": system}, secret, "secret")
        self.assertEqual(done.returncode, 126, done.stderr)
        self.assertIn(f"cannot run {secret}: Permission denied", done.stderr)

    def test_missing_write_directory_skipped(self) -> None:
        """A listed directory that does not exist is skipped, not an error."""
        target = os.path.join(self.dir, "f")
        done = run(
            {"read": ["/"], "write": ["/nonexistent-dir", self.dir]},
            "/bin/sh",
            "sh",
            "-c",
            f"echo ok > {target}",
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(target) as f:
            self.assertEqual(f.read(), "ok\n")

    def test_setenv_and_unsetenv(self) -> None:
        """The command's environment gets back what was kept from the script's start."""
        done = subprocess.run(
            [
                sys.executable,
                "-I",
                "-S",
                landlock.__file__,
                "--read=/",
                "--setenv=LD_SANDBOXD_A=a=1",
                "--unsetenv=LD_SANDBOXD_B",
                "--",
                "/bin/sh",
                "sh",
                "-c",
                'echo "$LD_SANDBOXD_A/${LD_SANDBOXD_B-unset}"',
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "LD_SANDBOXD_B": "b"},
        )
        self.assertEqual(
            (done.returncode, done.stdout), (0, "a=1/unset\n"), done.stderr
        )

    def test_devices_open(self) -> None:
        """``/dev/null`` stays writable with no write directory at all."""
        done = run(
            {"read": ["/"]}, "/bin/sh", "sh", "-c", "echo x > /dev/null && echo ok"
        )
        self.assertEqual((done.returncode, done.stdout), (0, "ok\n"), done.stderr)
