"""
The seed SDK's discovery against a sandboxd daemon: ``ServerClient.discover()``
validates the document with the SDK's own models, lists every endpoint of
the seed's table under the seed's ids, and ``check()`` answers.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.seed.harness import TOKEN, SeedCase


async def _discover(client: Any) -> Any:
    return await client.discover()


class DiscoveryTests(SeedCase):
    """``discover()`` and ``check()`` through the seed's SDK."""

    @inlineCallbacks
    def test_discover_validates(self) -> Any:
        """discover() succeeds and knows every endpoint the SDK drives (not agents)."""
        from agent_sandbox.api.server_client import ServerClient
        from agent_sandbox.models.server import EndpointPaths

        caps = yield self.drive(_discover)
        self.assertEqual(caps.api_version, 2)
        for endpoint in ServerClient.ENDPOINT_METHODS:
            self.assertIsNotNone(caps.info(endpoint), endpoint)
        paths = caps.paths("files_list")
        self.assertIsInstance(paths, EndpointPaths)
        self.assertIs(paths.read_only, False)
        for endpoint in (
            "list_commands",
            "run_command",
            "process_detail",
            "pty_create_session",
            "pty_list_sessions",
            "pty_detail",
            "pty_delete_session",
        ):
            self.assertTrue(caps.can(endpoint), endpoint)

    @inlineCallbacks
    def test_discover_sync(self) -> Any:
        """discover_sync() gives the same snapshot from blocking code."""
        client = self.client()
        caps = yield self.call(client.discover_sync)
        self.assertTrue(caps.can("process_detail"))
        self.assertIs(client.capabilities, caps)

    @inlineCallbacks
    def test_read_only_is_a_boolean(self) -> Any:
        """A read-only policy shows as the seed's ``read_only: true``; our list beside it."""
        yield self.daemon.stop()
        yield self.start(
            stop_at_end=False,
            policy={"endpoints": {"files_*": {"paths": {"read_only": ["/"]}}}},
        )
        self.addCleanup(self.daemon.stop)
        caps = yield self.drive(_discover)
        paths = caps.paths("files_mkdir")
        self.assertIs(paths.read_only, True)
        self.assertEqual(caps.info("files_mkdir").paths.read_only_paths, ["/"])
        self.assertIs(caps.paths("shell").read_only, False)

    @inlineCallbacks
    def test_check(self) -> Any:
        """check() (capabilities_check) answers a PathDecision, sync and async."""
        from agent_sandbox.models.server import PathDecision

        decision = yield self.drive(lambda c: c.check("files_list", path="/etc/passwd"))
        self.assertIsInstance(decision, PathDecision)
        self.assertEqual((decision.allowed, decision.code), (False, "path_not_allowed"))
        client = self.client()
        decision = yield self.call(client.check_sync, "files_list", path="notes.txt")
        self.assertTrue(decision.allowed)

    @inlineCallbacks
    def test_denied_after_discovery(self) -> Any:
        """An identity without a scope gets the SDK's PolicyDeniedError before any call."""
        from agent_sandbox.models.errors import PolicyDeniedError

        yield self.daemon.stop()
        yield self.start(
            stop_at_end=False,
            policy={
                "auth": {
                    "tokens": [
                        {
                            "id": "reader",
                            "token_env": "READER_TOKEN",
                            "scopes": ["core:read", "files:read"],
                        }
                    ]
                }
            },
            environ={"READER_TOKEN": "reader-token"},
            token=None,
        )
        self.addCleanup(self.daemon.stop)

        async def scenario(client: Any) -> Any:
            await client.discover()
            return await client.pty.list()

        error = yield self.outcome(scenario, token="reader-token")
        self.assertIsInstance(error, PolicyDeniedError)
        self.assertEqual(error.endpoint, "pty_list_sessions")
        self.assertNotEqual(TOKEN, "reader-token")


class ReferenceTests(SeedCase):
    """sandboxd's discovery beside the seed's own server's."""

    @inlineCallbacks
    def test_every_seed_endpoint_listed(self) -> Any:
        """Every endpoint the seed's server lists (agents aside) is listed by sandboxd under its id."""
        yield self.reference()
        theirs = yield self.drive(_discover, reference=True)
        ours = yield self.drive(_discover)
        seed_ids = {
            name for name, info in theirs.endpoints.items() if info.group != "agents"
        }
        self.assertEqual(seed_ids - set(ours.endpoints), set())
        for name in sorted(seed_ids):
            self.assertEqual(
                (ours.info(name).method, ours.info(name).path),
                (theirs.info(name).method, theirs.info(name).path),
                name,
            )

    @inlineCallbacks
    def test_check_unknown_endpoint(self) -> Any:
        """
        check() of an id no endpoint has answers allowed=False with code
        unknown_endpoint on both servers (async and sync), not an exception;
        sandboxd's reason names the nearest id.
        """
        from agent_sandbox.models.server import PathDecision

        yield self.reference()
        answers = []
        for reference in (False, True):
            decision = yield self.drive(
                lambda c: c.check("files_lst", path="a.txt"), reference=reference
            )
            client = self.client(reference=reference)
            blocking = yield self.call(client.check_sync, "no-such-endpoint")
            answers.append((decision, blocking))
        (ours, ours_sync), (seed, seed_sync) = answers
        for decision in (ours, ours_sync, seed, seed_sync):
            self.assertIsInstance(decision, PathDecision)
            self.assertEqual(
                (decision.allowed, decision.code), (False, "unknown_endpoint")
            )
        self.assertEqual(
            (ours.endpoint, ours_sync.endpoint), ("files_lst", "no-such-endpoint")
        )
        self.assertEqual(
            ours.reason, "unknown endpoint 'files_lst'; did you mean 'files_list'?"
        )
        self.assertEqual(ours_sync.reason, "unknown endpoint 'no-such-endpoint'")


class AfterDiscoveryTests(SeedCase):
    """A discovery snapshot lets every renamed endpoint through."""

    @inlineCallbacks
    def test_calls_after_discover(self) -> Any:
        """After discover(), commands.*, process.get/wait and pty.* reach the daemon."""

        async def scenario(client: Any) -> Any:
            await client.discover()
            listed = await client.commands.list()
            started = await client.process.start("true")
            got = await client.process.get(started.pid)
            code = await client.process.wait(started.pid, timeout=10, poll=0.1)
            created = await client.pty.create()
            sessions = await client.pty.list()
            detail = await client.pty.get(created.session_id)
            await client.pty.delete(created.session_id)
            return (
                listed,
                got.pid == started.pid,
                code,
                [s.id for s in sessions] == [created.session_id],
                detail.id == created.session_id,
            )

        result = yield self.drive(scenario)
        self.assertEqual(result, ([], True, 0, True, True))


class OldIdPolicyTests(SeedCase):
    """A policy written with sandboxd's earlier ids, seen through the SDK."""

    policy = {"endpoints": {"pty_create": {"enabled": False}}}

    @inlineCallbacks
    def test_old_id_rule_governs_new_id(self) -> Any:
        """A rule keyed pty_create turns pty_create_session off; discovery warns with the new id."""
        from agent_sandbox.models.errors import EndpointNotAvailableError

        async def scenario(client: Any) -> Any:
            caps = await client.discover()
            try:
                await client.pty.create()
            except EndpointNotAvailableError as e:
                return caps.warnings, caps.denial("pty_create_session"), e.endpoint
            return caps.warnings, None, None

        warnings, denial, endpoint = yield self.drive(scenario)
        self.assertEqual(
            (denial, endpoint), ("endpoint_disabled", "pty_create_session")
        )
        self.assertTrue(any("'pty_create_session'" in w for w in warnings), warnings)


class OneCommandTests(SeedCase):
    """An identity that may run one command, seen through the SDK."""

    policy = {
        "auth": {
            "tokens": [
                {
                    "id": "greeter",
                    "token_env": "GREETER_TOKEN",
                    "scopes": ["commands:list", "commands:run:greet", "files:read"],
                }
            ]
        }
    }
    environ = {"GREETER_TOKEN": "greeter-token"}
    token = None

    @inlineCallbacks
    def test_discovery_and_check_agree(self) -> Any:
        """
        ``discover()`` and ``check("run_command")`` give one answer for an
        identity holding only ``commands:run:greet``: allowed (was: allowed
        in discovery, refused by check). A refusal's ``reason`` is a
        sentence, as the seed's is, its ``code`` the code.
        """

        async def scenario(client: Any) -> Any:
            caps = await client.discover()
            checked = await client.check("run_command")
            shell = await client.check("shell")
            outside = await client.check("files_list", path="/etc")
            return caps.can("run_command"), checked, shell, outside

        can, checked, shell, outside = yield self.drive(scenario, token="greeter-token")
        self.assertEqual((can, checked.allowed), (True, True))
        self.assertEqual((shell.allowed, shell.code), (False, "missing_scope"))
        self.assertEqual(
            shell.reason,
            "identity 'greeter' lacks the scope 'process:run' that endpoint "
            "'shell' requires",
        )
        self.assertEqual(outside.code, "path_not_allowed")
        self.assertIn("'/etc'", outside.reason)
