"""
Seed-style policy files (presets, groups, endpoint rules, auth forms) have
the same effect on sandboxd as on the seed's own server: both load each
file, and ``/capabilities`` agrees endpoint by endpoint (``enabled``,
``scopes``, ``allowed``) for every identity the file defines.
"""

from __future__ import annotations

import importlib.util
import os

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from tests.seed import policycompare


class SeedPolicyTests(SynchronousTestCase):
    """One test per file in ``tests/seed/policies/``, generated below."""

    def setUp(self) -> None:
        if importlib.util.find_spec("agent_sandbox.server") is None:
            raise SkipTest("agent-sandbox-server (the seed's server) is not installed")

    def check(self, path: str) -> None:
        """Both servers load ``path`` and agree on every shared endpoint."""
        result = policycompare.compare(path)
        self.assertTrue(result["seed_loads"], f"the seed refuses {path}")
        self.assertTrue(result["sandboxd_loads"], result["refusal"])
        self.assertGreaterEqual(result["shared"], 46)
        self.assertEqual(
            {name: lines for name, lines in result["differences"].items() if lines}, {}
        )


def _add(path: str) -> None:
    name = os.path.splitext(os.path.basename(path))[0].replace("-", "_")

    def test(self: SeedPolicyTests) -> None:
        self.check(path)

    test.__doc__ = f"{os.path.basename(path)} has the same effect on both servers."
    setattr(SeedPolicyTests, f"test_{name}", test)


for _path in policycompare.policy_files():
    _add(_path)
