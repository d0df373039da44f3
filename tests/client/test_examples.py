# -*- test-case-name: tests.client.test_examples -*-
"""The examples built on the client run against a real daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.agents.test_agents import CATALOG
from tests.client.base import ROOT, ClientCase

EXAMPLES = os.path.join(ROOT, "examples")


class AgentExampleTests(ClientCase):
    """``examples/agent_session.py`` against the SDK-built fake agent."""

    timeout = 90
    policy = {"groups": {"agents": True}, "agents": {"catalog": CATALOG}}

    @inlineCallbacks
    def test_agent_session(self) -> Any:
        """It starts a session, streams the agent's answer and the turn's end."""
        done = yield self.in_thread(
            subprocess.run,
            [
                sys.executable,
                os.path.join(EXAMPLES, "agent_session.py"),
                "--agent",
                "fake",
                "echo hello from the example",
            ],
            env={
                "PATH": os.environ.get("PATH", ""),
                "PYTHONPATH": ROOT,
                "SANDBOXD_URL": self.daemon.url,
                "SANDBOXD_TOKEN": self.daemon.token or "",
            },
            capture_output=True,
            timeout=60,
        )
        text = done.stdout.decode() + done.stderr.decode()
        self.assertEqual(done.returncode, 0, text)
        self.assertIn("hello from the example", text)
        self.assertIn("[turn ended: end_turn]", text)
