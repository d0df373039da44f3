"""
The daemon's secrets stay out of ``/proc/<daemon pid>`` (security catalogue
E11): its startup environment block is scrubbed and it is not dumpable.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
import urllib.request

from twisted.trial.unittest import SynchronousTestCase

from tests.test_cli import DaemonProcess, twistd_argv

_PROBE = textwrap.dedent(
    """
    import os, sys
    from sandboxd.daemon import hardening
    secret = os.environ["PROBE_SECRET"]
    print(hardening.scrub_startup_environ(["PROBE_SECRET", "NOT_SET"]))
    print(hardening.is_dumpable(), hardening.forbid_tracing(), hardening.is_dumpable())
    print(os.environ["PROBE_SECRET"] == secret)
    print(open("/proc/self/environ", "rb").read().count(secret.encode()))
    print(os.environ["PROBE_OTHER"] == "kept", flush=True)
    sys.stdin.readline()
    """
)


class ScrubTests(SynchronousTestCase):
    """The functions, in a process of their own."""

    def test_scrub_and_forbid_tracing(self) -> None:
        """The value leaves /proc/<pid>/environ (seen from outside too), Python's copy stays, tracing is off."""
        secret = "s3cret-" + secrets.token_hex(8)
        env = {**os.environ, "PROBE_SECRET": secret, "PROBE_OTHER": "kept"}
        proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None and proc.stdin is not None
            lines = [proc.stdout.readline().strip() for _ in range(5)]
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                outside = f.read()
            proc.stdin.write("\n")
            proc.stdin.flush()
        finally:
            proc.communicate(timeout=10)
        self.assertEqual(
            lines, ["['PROBE_SECRET']", "True True False", "True", "0", "True"]
        )
        self.assertNotIn(secret.encode(), outside)
        self.assertIn(b"PROBE_OTHER=kept", outside)


class DaemonTests(SynchronousTestCase):
    """twistd -n sandboxd started with its token in the environment."""

    def test_token_not_readable_by_children(self) -> None:
        """A command reading /proc/<daemon pid>/environ does not find the token, which still authenticates."""
        token = "tok-" + secrets.token_hex(12)
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        d = DaemonProcess(self, twistd_argv(base), env={"ABX_SERVER_TOKEN": token})
        d.wait_healthy()
        body = json.dumps({"command": f"cat /proc/{d.proc.pid}/environ"}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{d.port}/shell",
            data=body,
            headers={"X-Access-Token": token, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            result = json.loads(response.read())
        self.assertEqual(result["exit_code"], 0, result)
        self.assertIn("ABX_SERVER_TOKEN=", result["stdout"])
        self.assertNotIn(token, result["stdout"])
        with open(f"/proc/{d.proc.pid}/environ", "rb") as f:
            self.assertNotIn(token.encode(), f.read())
