"""
Seed-style policy files (presets, groups, endpoint rules, auth forms) have
the same effect on sandboxd as on the seed's own server: both load each
file, and ``/capabilities`` agrees endpoint by endpoint (``enabled``,
``scopes``, ``allowed``) for every identity the file defines.  The same
with ``ABX_SERVER_ENABLED_GROUPS`` set beside a policy, and a bad value of
it refused by both.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from tests.seed import policycompare
from tests.seed.policycompare import BAD_ENABLED_GROUPS, ENABLED_GROUPS_CASES


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


class EnabledGroupsTests(SynchronousTestCase):
    """
    ``ABX_SERVER_ENABLED_GROUPS`` beside a policy: one test per case of
    ``policycompare.ENABLED_GROUPS_CASES``, generated below, plus the
    refusals.
    """

    def setUp(self) -> None:
        if importlib.util.find_spec("agent_sandbox.server") is None:
            raise SkipTest("agent-sandbox-server (the seed's server) is not installed")

    def check(self, name: str, doc: dict[str, Any], value: str) -> dict[str, Any]:
        """Both servers start with the value and agree on every shared endpoint."""
        result = policycompare.compare_doc(name, doc, value)
        self.assertTrue(result["seed_loads"], result["seed_refusal"])
        self.assertTrue(result["sandboxd_loads"], result["refusal"])
        self.assertGreaterEqual(result["shared"], 46)
        self.assertEqual(
            {who: lines for who, lines in result["differences"].items() if lines}, {}
        )
        return result

    def test_precedence(self) -> None:
        """
        What the comparison shows, spelled out: the variable turns a group
        on over a policy's ``groups`` and over hardened's, not over an
        endpoint turned off by id or under ``"*"``.  (Its cases, compared
        here, have no test of their own.)
        """
        cases = {name: (doc, value) for name, doc, value in ENABLED_GROUPS_CASES}
        on = self.check("env-over-groups-off", *cases["env-over-groups-off"])
        self.assertIn("git_status", on["enabled"]["anonymous"])
        self.assertIn("shell", on["enabled"]["anonymous"])
        off = self.check("env-under-endpoint-off", *cases["env-under-endpoint-off"])
        self.assertNotIn("git_status", off["enabled"]["anonymous"])
        self.assertIn("git_diff", off["enabled"]["anonymous"])
        hardened = self.check("env-over-hardened", *cases["env-over-hardened"])
        self.assertIn("pty_create_session", hardened["enabled"]["anonymous"])
        self.assertNotIn("env_set", hardened["enabled"]["anonymous"])
        star = self.check("env-under-star-off", *cases["env-under-star-off"])
        self.assertNotIn("files_list", star["enabled"]["anonymous"])

    def test_bad_value_refused_by_both(self) -> None:
        """An unknown group name stops both servers, each naming the variable and the name."""
        for value in BAD_ENABLED_GROUPS:
            result = policycompare.compare_doc("bad", {}, value)
            self.assertEqual(
                (result["seed_loads"], result["sandboxd_loads"]), (False, False), value
            )
            bad = [n.strip() for n in value.split(",")][-1]
            for line in (result["seed_refusal"], result["refusal"]):
                self.assertIn("ABX_SERVER_ENABLED_GROUPS", line)
                self.assertIn(repr(bad), line)


def _add_enabled_groups(name: str, doc: dict[str, Any], value: str) -> None:
    def test(self: EnabledGroupsTests) -> None:
        self.check(name, doc, value)

    test.__doc__ = (
        f"ABX_SERVER_ENABLED_GROUPS={value.strip()!r} beside {json.dumps(doc)[:60]} "
        "has the same effect on both servers."
    )
    setattr(EnabledGroupsTests, "test_" + name.replace("-", "_"), test)


#: The cases ``test_precedence`` compares (and asserts more of).
PRECEDENCE_CASES = {
    "env-over-groups-off",
    "env-under-endpoint-off",
    "env-over-hardened",
    "env-under-star-off",
}

for _name, _doc, _value in ENABLED_GROUPS_CASES:
    if _name not in PRECEDENCE_CASES:
        _add_enabled_groups(_name, _doc, _value)


def _add(path: str) -> None:
    name = os.path.splitext(os.path.basename(path))[0].replace("-", "_")

    def test(self: SeedPolicyTests) -> None:
        self.check(path)

    test.__doc__ = f"{os.path.basename(path)} has the same effect on both servers."
    setattr(SeedPolicyTests, f"test_{name}", test)


for _path in policycompare.policy_files():
    _add(_path)
