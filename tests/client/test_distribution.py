# -*- test-case-name: tests.client.test_distribution -*-
"""
The client installs alone, as the docs say: ``pip install ./client`` in a
fresh virtualenv (offline, from the machine's local wheels) gives a
``sandboxd`` command and ``sandboxd.client`` with httpx and websockets and
nothing of the daemon (no Twisted), and that command drives a real daemon.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.client.base import ROOT, ClientCase

#: Where this machine keeps wheels for offline installs.
WHEELS = "/opt/pypi/files"


def documented_commands() -> list[str]:
    """The shell lines of docs/client.md's "Installing the client alone"."""
    with open(os.path.join(ROOT, "docs", "client.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("**Installing the client alone.**") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    return [line.split("#")[0].strip() for line in block.group(1).splitlines()]


class ClientAloneTests(ClientCase):
    """The client distribution, installed by the documented command."""

    timeout = 300

    def setUp(self) -> Any:
        if not glob.glob(os.path.join(WHEELS, "httpx-*.whl")):
            raise self.skipTest(f"no local wheels in {WHEELS} for an offline install")
        return super().setUp()

    def install(self) -> tuple[str, dict[str, str]]:
        """A fresh venv with the docs' install run in a copy of the checkout."""
        work = os.path.realpath(self.mktemp())
        checkout = os.path.join(work, "checkout")
        os.makedirs(checkout)
        for part in ("client", "sandboxd"):
            shutil.copytree(
                os.path.join(ROOT, part),
                os.path.join(checkout, part),
                ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"),
            )
        venv = os.path.join(work, "venv")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
        env = {
            "PATH": os.path.join(venv, "bin") + os.pathsep + "/usr/bin:/bin",
            "HOME": work,
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": WHEELS,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_CONFIG_FILE": os.devnull,
        }
        install, version = documented_commands()[:2]
        self.assertEqual(install, "pip install ./client")
        done = subprocess.run(
            shlex.split(install),
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        shown = subprocess.run(
            shlex.split(version), env=env, capture_output=True, text=True, timeout=30
        )
        self.assertEqual(shown.returncode, 0, shown.stderr)
        self.assertEqual(shown.stdout.strip(), "sandboxd 0.1.0 (client)")
        return venv, env

    @inlineCallbacks
    def test_installs_alone_and_drives_a_daemon(self) -> Any:
        """Only httpx, websockets and their dependencies come in; exec works."""
        venv, env = yield self.in_thread(self.install)
        listed = subprocess.run(
            [os.path.join(venv, "bin", "pip"), "list", "--format=freeze"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        names = {line.split("==")[0].lower() for line in listed.stdout.split()}
        self.assertIn("sandboxd-client", names)
        self.assertIn("httpx", names)
        self.assertIn("websockets", names)
        self.assertNotIn("twisted", names)
        self.assertNotIn("sandboxd", names)
        run_env = {
            **env,
            "SANDBOXD_URL": self.daemon.url,
            "SANDBOXD_TOKEN": self.daemon.token or "",
        }
        done = yield self.in_thread(
            subprocess.run,
            ["sandboxd", "exec", "--", "echo", "from the client alone"],
            env=run_env,
            cwd=venv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, b"from the client alone\n")
        daemon = yield self.in_thread(
            subprocess.run,
            ["sandboxd", "serve"],
            env=run_env,
            cwd=venv,
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(daemon.returncode, 2)
        self.assertIn("not a client command", daemon.stderr)
