"""The face's names behave as the seed's do, written onto sandboxd's registry."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from sandboxd import commands
from sandboxd.seedface import api


class CommandArgTests(SynchronousTestCase):
    """``CommandArg`` with the seed's fields."""

    def test_optional_by_default(self) -> None:
        """An argument is optional unless required=True; defaults are text."""
        arg = api.CommandArg("n", "integer", default="3")
        self.assertEqual((arg.required, arg.default), (False, 3))
        self.assertEqual(api.CommandArg("on", "boolean", default="no").default, False)
        # A default that does not parse stays text, as on the seed.
        self.assertEqual(api.CommandArg("n", "integer", default="N/A").default, "N/A")

    def test_string_array(self) -> None:
        """string_array defaults are JSON arrays of strings; anything else is refused."""
        self.assertEqual(
            api.CommandArg("t", "string_array", default='["a", "b"]').default,
            ["a", "b"],
        )
        with self.assertRaises(ValueError):
            api.CommandArg("t", "string_array", default='"a"')
        with self.assertRaises(ValueError):
            api.CommandArg("t", "list")


class RegistryTests(SynchronousTestCase):
    """``CommandRegistry`` with the seed's argument order."""

    def test_register_and_infer(self) -> None:
        """register(name, fn) and @command() both land in sandboxd's registry."""
        registry = api.CommandRegistry()
        registry.register(
            "add",
            lambda a, b: a + b,
            args=[api.CommandArg("a", "integer"), api.CommandArg("b", "integer")],
        )

        @registry.command()
        def tags(names: list[str], limit: int = 2) -> list[str]:
            return names[:limit]

        self.assertIn("add", registry)
        self.assertEqual(len(registry), 2)
        inferred = registry.get("tags")
        assert inferred is not None
        self.assertEqual(
            [(a.name, a.type, a.required) for a in inferred.args],
            [("names", "string_array", True), ("limit", "integer", False)],
        )
        self.assertEqual(
            inferred.bind({"names": ["x", "y", "z"]}),
            {"names": ["x", "y", "z"], "limit": 2},
        )

    def test_default_registry_is_the_daemons(self) -> None:
        """default_registry() writes to the registry the daemon serves."""
        self.assertIs(api.default_registry().registry, commands.default_registry)


class ResponseTests(SynchronousTestCase):
    """The seed's response constructors."""

    def test_error_type(self) -> None:
        """ServerResponse.error takes error_type, as on the seed."""
        reply = api.ServerResponse.error(409, "busy", error_type="ConflictError")
        self.assertEqual(
            (reply.status, reply.body),
            (409, {"error": "busy", "type": "ConflictError"}),
        )

    def test_policy_denied(self) -> None:
        """
        A handler's PolicyDenied answers with its status and code; a code
        sandboxd does not have travels as ``reason``.
        """
        from twisted.python.failure import Failure

        def refusal(exc: Exception) -> api.ServerResponse:
            try:
                raise exc
            except Exception:
                return api._refusal(Failure())

        reply = refusal(api.PolicyDenied("missing_scope", "no", scope="myapp:deploy"))
        self.assertEqual(
            (reply.status, reply.body),
            (
                403,
                {
                    "error": "no",
                    "type": "PolicyDenied",
                    "code": "missing_scope",
                    "scope": "myapp:deploy",
                },
            ),
        )
        reply = refusal(api.PolicyDenied("quota", "over", status=429))
        self.assertEqual((reply.status, reply.body["reason"]), (429, "quota"))


class PolicyTests(SynchronousTestCase):
    """``ServerPolicy`` builds the documents a template hands its own server."""

    def test_only_and_preset(self) -> None:
        """only() switches everything off but the ids named; preset() names one."""
        only = api.ServerPolicy.only("transfer", "files_list").to_dict()["endpoints"]
        self.assertEqual(only["*"], {"enabled": False})
        self.assertEqual(only["files_upload_stream"], {"enabled": True})
        self.assertEqual(only["files_list"], {"enabled": True})
        hardened = api.ServerPolicy.preset("hardened").with_endpoint(
            "shell", enabled=True
        )
        self.assertEqual(
            hardened.to_dict(),
            {"preset": "hardened", "endpoints": {"shell": {"enabled": True}}},
        )
        self.assertEqual(hardened.preset_name, "hardened")
