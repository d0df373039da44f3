"""
A coding agent under ``params.confine``: the agent process, what it runs
itself, and the terminals it asks the daemon for, all held by the kernel
to the directories its rule lets it write.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.agents.test_agents import CATALOG, FAKE, AgentsTestCase, agents_policy
from tests.routes.test_confinement import need_landlock


class ConfinedAgentTests(AgentsTestCase):
    """``group:agents`` confined to the base dir."""

    def setUp(self) -> Any:
        need_landlock()
        self.outside = os.path.realpath(self.mktemp())
        os.makedirs(self.outside)
        # The agent writes a file outside, then one inside, before it
        # becomes the fake ACP agent: what it does on its own account.
        first_acts = (
            f"echo a > {self.outside}/by-agent 2>/dev/null;"
            f" echo a > by-agent; exec {sys.executable} {FAKE}"
        )
        self.policy = agents_policy(
            params={"confine": True, "confine_write": ["."]},
        )
        self.policy["agents"] = {
            "catalog": {
                **CATALOG,
                "acting": {"name": "Acting", "command": ["/bin/sh", "-c", first_acts]},
            }
        }
        return super().setUp()

    @inlineCallbacks
    def test_agent_and_its_terminals(self) -> Any:
        """
        The agent still answers; its own write outside failed, inside
        landed; a terminal it asks for cannot write outside either.
        """
        sid = yield self.session("acting")
        reply = yield self.prompt(sid, "echo still working")
        self.assertEqual(reply.json()["text"], "still working", reply.body)
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "by-agent")))
        reply = yield self.prompt(sid, f"terminal touch {self.outside}/by-terminal")
        self.assertIn("exit=1", reply.json()["text"], reply.body)
        self.assertIn("Permission denied", reply.json()["text"])
        reply = yield self.prompt(sid, "terminal touch by-terminal")
        self.assertIn("exit=0", reply.json()["text"], reply.body)
        self.assertEqual(os.listdir(self.outside), [])
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "by-terminal")))
