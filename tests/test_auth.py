"""
Where tokens come from (SPEC §4) and the fail-closed rule of SPEC §20: a
token source that is configured but yields nothing stops the start.
"""

from __future__ import annotations

import os
import subprocess

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access.auth import Identity, TokenStore
from sandboxd.policy import PolicyError, load_policy
from sandboxd.policy.document import TokenSpec
from sandboxd.routes import default_table
from tests.test_cli import ROOT, on_ports, twistd_argv


class FailClosedTests(SynchronousTestCase):
    """A configured token source that yields no token never means local mode."""

    def token_file(self, text: str) -> str:
        path = os.path.abspath(self.mktemp())
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_empty_legacy_file_refused(self) -> None:
        """An empty or whitespace-only ABX_SERVER_TOKEN_FILE is an error naming the file."""
        for text in ("", "  \n\t\n"):
            path = self.token_file(text)
            with self.assertRaises(PolicyError) as cm:
                TokenStore.build([], {"ABX_SERVER_TOKEN_FILE": path})
            self.assertIn("ABX_SERVER_TOKEN_FILE", str(cm.exception))
            self.assertIn(path, str(cm.exception))

    def test_legacy_file_with_token(self) -> None:
        """A token file with a token gives the legacy identity (surrounding blanks ignored)."""
        store = TokenStore.build(
            [], {"ABX_SERVER_TOKEN_FILE": self.token_file("s3cret\n")}
        )
        self.assertFalse(store.local_mode)
        identity = store.identify(b"s3cret")
        assert identity is not None
        self.assertEqual(identity.id, "legacy")

    def test_legacy_beside_policy_tokens(self) -> None:
        """
        With policy tokens, ABX_SERVER_TOKEN logs in only as the entry that
        names it; unnamed, it logs nobody in and the start warns.
        """
        named = TokenSpec(id="ci", scopes=("files:read",), token_env="ABX_SERVER_TOKEN")
        store = TokenStore.build([named], {"ABX_SERVER_TOKEN": "s3cret"})
        identity = store.identify(b"s3cret")
        assert identity is not None
        self.assertEqual(
            (identity.id, identity.scopes), ("ci", frozenset({"files:read"}))
        )
        self.assertEqual(store.warnings, [])
        other = TokenSpec(id="ops", scopes=("*",), token_sha256="00" * 32)
        store = TokenStore.build([other], {"ABX_SERVER_TOKEN": "s3cret"})
        self.assertIsNone(store.identify(b"s3cret"))
        self.assertIn("ABX_SERVER_TOKEN", store.warnings[0])

    def test_unnamed_legacy_file_advice(self) -> None:
        """
        An unnamed token from ABX_SERVER_TOKEN_FILE is warned about by that
        variable, and the advice is the entry that would name it (its
        ``token_file``), not a ``token_env`` that is unset and would stop
        the start.
        """
        path = self.token_file("s3cret\n")
        other = TokenSpec(id="ops", scopes=("*",), token_sha256="00" * 32)
        store = TokenStore.build([other], {"ABX_SERVER_TOKEN_FILE": path})
        self.assertIsNone(store.identify(b"s3cret"))
        [warning] = store.warnings
        self.assertTrue(warning.startswith("ABX_SERVER_TOKEN_FILE is set"), warning)
        self.assertIn(f'"token_file": "{path}"', warning)
        self.assertNotIn("token_env", warning)
        advised = TokenSpec(id="operator", scopes=("*",), token_file=path)
        store = TokenStore.build([other, advised], {"ABX_SERVER_TOKEN_FILE": path})
        self.assertEqual(store.warnings, [])
        identity = store.identify(b"s3cret")
        assert identity is not None
        self.assertEqual(identity.id, "operator")

    def test_unset_token_env_refused(self) -> None:
        """A policy token whose token_env is unset or blank stops the start, naming it."""
        spec = TokenSpec(id="ci", scopes=("*",), token_env="CI_LOGIN_T")
        for environ in ({}, {"CI_LOGIN_T": ""}, {"CI_LOGIN_T": "  "}):
            with self.assertRaises(PolicyError) as cm:
                TokenStore.build([spec], environ)
            self.assertIn("CI_LOGIN_T", str(cm.exception))
            self.assertIn("'ci'", str(cm.exception))

    def test_empty_policy_token_file_refused(self) -> None:
        """A policy token whose token_file is empty stops the start, naming the file."""
        path = self.token_file("\n")
        spec = TokenSpec(id="ops", scopes=("*",), token_file=path)
        with self.assertRaises(PolicyError) as cm:
            TokenStore.build([spec], {})
        self.assertIn(path, str(cm.exception))

    def test_check_config_warns_instead(self) -> None:
        """check-config (fail_closed=False) reports an unset token_env as a warning, closed."""
        policy = load_policy(
            default_table(),
            explicit={
                "auth": {
                    "tokens": [{"id": "ci", "token_env": "NOPE_T", "scopes": ["*"]}]
                }
            },
            base_dir="/tmp",
            environ={},
            fail_closed=False,
        )
        self.assertFalse(policy.tokens.local_mode)
        self.assertTrue(any("NOPE_T" in w for w in policy.warnings))

    def test_daemon_refuses_to_start(self) -> None:
        """twistd sandboxd with an empty token file exits non-zero naming the file."""
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        path = self.token_file("")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABX_")}
        env["ABX_SERVER_TOKEN_FILE"] = path
        result = subprocess.run(
            on_ports(twistd_argv(base)),
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(path, result.stdout + result.stderr)


class ActsForTests(SynchronousTestCase):
    """Who may see and drive what another identity made (terminals, contexts, jobs, servers)."""

    def test_owner_link_and_star(self) -> None:
        """Its maker, a link its maker minted, and ``*``; no one else, not a link of another."""
        self.assertTrue(
            Identity("agent", frozenset({"terminal:use"})).acts_for("agent")
        )
        link = Identity("link:x", frozenset({"files:read"}), on_behalf_of="agent")
        self.assertTrue(link.acts_for("agent"))
        self.assertFalse(link.acts_for("other"))
        self.assertTrue(Identity("admin", frozenset({"*"})).acts_for("agent"))
        self.assertFalse(Identity("other", frozenset({"terminal:*"})).acts_for("agent"))
