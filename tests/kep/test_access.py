"""Who a KEP call is: ``params.unauthenticated_as``, decided in one place."""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access import gate
from sandboxd.kep import access
from sandboxd.testing import memory_context

POLICY = {
    "auth": {
        "tokens": [
            {"id": "agent", "token_env": "T_AGENT", "scopes": ["files:read"]},
            {"id": "admin", "token_env": "T_ADMIN", "scopes": ["*"]},
        ]
    },
    "groups": {"kep": True},
}
ENV = {"T_AGENT": "agent-secret", "T_ADMIN": "admin-secret"}


class AdmitTests(SynchronousTestCase):
    """The KEP door's admission, for both listeners."""

    def context(self, unauthenticated_as: str | None) -> Any:
        policy = dict(POLICY)
        if unauthenticated_as is not None:
            policy["endpoints"] = {
                "kep": {"params": {"unauthenticated_as": unauthenticated_as}}
            }
        return memory_context(policy=policy, environ=ENV)

    def test_stands_for_the_token(self) -> None:
        """No credential at all: the named token's identity and scopes."""
        context = self.context("agent")
        endpoint = context.table.get("files_read_raw")
        passed = access.admit(context, endpoint, {})
        self.assertEqual(passed.identity.id, "agent")
        write = context.table.get("files_write_raw")
        refused = self.assertRaises(gate.Refused, access.admit, context, write, {})
        self.assertEqual(str(refused.error.code), "missing_scope")

    def test_credential_wins(self) -> None:
        """A credential is authenticated as always; a wrong one is 401."""
        context = self.context("agent")
        endpoint = context.table.get("files_write_raw")
        passed = access.admit(context, endpoint, {b"x-access-token": [b"admin-secret"]})
        self.assertEqual(passed.identity.id, "admin")
        refused = self.assertRaises(
            gate.Refused, access.admit, context, endpoint, {b"x-access-token": [b"no"]}
        )
        self.assertEqual(refused.error.status, 401)

    def test_without_the_param(self) -> None:
        """No param: no credential is 401, as on every door."""
        context = self.context(None)
        endpoint = context.table.get("files_read_raw")
        refused = self.assertRaises(gate.Refused, access.admit, context, endpoint, {})
        self.assertEqual(refused.error.status, 401)

    def test_other_doors_unaffected(self) -> None:
        """The gate without the keyword (every other door) still says 401."""
        context = self.context("agent")
        endpoint = context.table.get("files_read_raw")
        refused = self.assertRaises(gate.Refused, gate.admit, context, endpoint, {})
        self.assertEqual(refused.error.status, 401)


class WarningTests(SynchronousTestCase):
    """The start and reload warning about ``unauthenticated_as``."""

    def test_warning_is_whole(self) -> None:
        """It names the token and ends with what to do, as a whole sentence."""
        from twisted.logger import formatEvent, globalLogPublisher

        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        policy = {
            **POLICY,
            "endpoints": {"kep": {"params": {"unauthenticated_as": "agent"}}},
        }
        access.warn_if_unauthenticated(memory_context(policy=policy, environ=ENV))
        said = [
            formatEvent(e) for e in events if e.get("log_namespace") == "sandboxd.kep"
        ]
        self.assertEqual(len(said), 1, said)
        self.assertIn("acts as the token 'agent'", said[0])
        self.assertTrue(
            said[0].endswith(
                "whoever can reach those ports can act as it, so keep that token "
                "narrow and the ports reachable only by whom you mean"
            ),
            said[0],
        )
