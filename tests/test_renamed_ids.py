"""
The seven endpoint ids sandboxd used before it took the seed's: a policy
written with them keeps its effect, ``--explain`` and ``/capabilities/check``
still understand them, and ``check-config`` says what to write instead.
"""

from __future__ import annotations

import io
import json
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd import cli
from sandboxd.endpoints import RENAMED_IDS, current_id
from sandboxd.policy import PolicyError, load_policy
from sandboxd.routes import builtin_table
from sandboxd.testing import MemoryDaemon

#: The seed's own server's ids, as its endpoint table declares them.
SEED_IDS = {
    "list_commands",
    "run_command",
    "process_detail",
    "pty_create_session",
    "pty_list_sessions",
    "pty_detail",
    "pty_delete_session",
}


def compiled(policy: dict[str, Any]) -> Any:
    """The compiled policy for a document over the built-in table."""
    return load_policy(builtin_table(), explicit=policy, base_dir="/tmp", environ={})


class TableTests(SynchronousTestCase):
    """The table names the seed's ids and none of the old ones."""

    def test_seed_ids_served(self) -> None:
        """Every new id is in the table; no old id is."""
        ids = set(builtin_table().ids())
        self.assertEqual(set(RENAMED_IDS.values()), SEED_IDS)
        self.assertLessEqual(SEED_IDS, ids)
        self.assertFalse(set(RENAMED_IDS) & ids)

    def test_current_id(self) -> None:
        """An old id maps to its new one; any other id is itself."""
        self.assertEqual(current_id("pty_get"), "pty_detail")
        self.assertEqual(current_id("pty_detail"), "pty_detail")
        self.assertEqual(current_id("shell"), "shell")


class PolicyTests(SynchronousTestCase):
    """A rule keyed by an old id governs the endpoint's new id."""

    def test_old_id_rule_applies(self) -> None:
        """endpoints.pty_create disables pty_create_session, with a warning."""
        policy = compiled({"endpoints": {"pty_create": {"enabled": False}}})
        self.assertFalse(policy.rules["pty_create_session"].enabled)
        self.assertTrue(policy.rules["pty_list_sessions"].enabled)
        self.assertTrue(
            any("'pty_create_session'" in w for w in policy.warnings), policy.warnings
        )

    def test_old_id_limits(self) -> None:
        """Limits set under commands_run land on run_command."""
        policy = compiled(
            {"endpoints": {"commands_run": {"limits": {"rate_per_minute": 7}}}}
        )
        self.assertEqual(policy.rules["run_command"].limits.rate_per_minute, 7)

    def test_old_glob_applies(self) -> None:
        """A pattern written for the old ids selects their new ids, with a warning."""
        policy = compiled({"endpoints": {"commands_*": {"enabled": False}}})
        self.assertFalse(policy.rules["list_commands"].enabled)
        self.assertFalse(policy.rules["run_command"].enabled)
        self.assertTrue(policy.rules["shell"].enabled)
        self.assertTrue(
            any("'list_commands', 'run_command'" in w for w in policy.warnings),
            policy.warnings,
        )

    def test_both_names_refused(self) -> None:
        """A document naming one endpoint twice (old and new id) is refused."""
        with self.assertRaises(PolicyError) as caught:
            compiled(
                {
                    "endpoints": {
                        "process_get": {"enabled": False},
                        "process_detail": {"enabled": True},
                    }
                }
            )
        self.assertIn("process_detail", str(caught.exception))


class CheckConfigTests(SynchronousTestCase):
    """check-config names the new id."""

    def run_check(self, policy: Any, *args: str) -> tuple[int, str]:
        path = self.mktemp() + ".json"
        with open(path, "w") as f:
            json.dump(policy, f)
        options = cli.CheckConfigOptions()
        options.parseOptions(["--policy", path, "--base-dir", "/tmp", *args])
        out = io.StringIO()
        return cli.check_config(options, out), out.getvalue()

    def test_warning_names_new_id(self) -> None:
        """An old id in a policy warns, naming the id to write instead."""
        code, out = self.run_check({"endpoints": {"pty_delete": {"enabled": False}}})
        self.assertEqual(code, 0)
        self.assertIn("warning: endpoints.pty_delete:", out)
        self.assertIn("'pty_delete_session'", out)

    def test_strict_refuses_old_id(self) -> None:
        """--strict turns the old-id warning into an error."""
        code, out = self.run_check(
            {"endpoints": {"pty_delete": {"enabled": False}}}, "--strict"
        )
        self.assertEqual(code, 1)
        self.assertIn("pty_delete_session", out)

    def test_explain_old_id(self) -> None:
        """--explain with an old id decides the new one and says so (a refusal exits 1)."""
        code, out = self.run_check(
            {}, "--explain", "commands_list", "--scopes", "files:read", "--json"
        )
        self.assertEqual(code, 1)
        decision = json.loads(out)
        self.assertEqual(decision["endpoint"], "list_commands")
        self.assertFalse(decision["allowed"])
        self.assertIn("'list_commands'", decision["warnings"][0])

    def test_explain_old_id_text(self) -> None:
        """The text form of --explain prints the warning and the new id."""
        code, out = self.run_check({}, "--explain", "pty_get")
        self.assertEqual(code, 0)
        self.assertIn("warning: --explain: 'pty_get'", out)
        self.assertIn("pty_detail: ALLOWED", out)


class HttpTests(SynchronousTestCase):
    """The wire speaks the new ids; /capabilities/check accepts the old."""

    def test_capabilities_lists_new_ids(self) -> None:
        """/capabilities lists the seed's ids and none of the old ones."""
        daemon = MemoryDaemon(token="t")
        endpoints = daemon.request("GET", "/capabilities").json()["endpoints"]
        self.assertLessEqual(SEED_IDS, set(endpoints))
        self.assertFalse(set(RENAMED_IDS) & set(endpoints))

    def test_check_old_id(self) -> None:
        """/capabilities/check with an old id answers for the new id."""
        daemon = MemoryDaemon(
            policy={"endpoints": {"pty_list": {"enabled": False}}}, token="t"
        )
        reply = daemon.request("POST", "/capabilities/check", {"endpoint": "pty_list"})
        self.assertEqual(reply.status, 200)
        body = reply.json()
        self.assertEqual(
            (body["endpoint"], body["allowed"], body["code"]),
            ("pty_list_sessions", False, "endpoint_disabled"),
        )

    def test_refusal_names_new_id(self) -> None:
        """A refusal's ``endpoint`` is the new id."""
        daemon = MemoryDaemon(
            policy={"endpoints": {"process_get": {"enabled": False}}}, token="t"
        )
        reply = daemon.request("GET", "/process/1")
        self.assertEqual(reply.json()["endpoint"], "process_detail")
