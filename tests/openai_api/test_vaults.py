"""
Vaults and credentials (``client.beta.agents.vaults``) with the official
``openai`` SDK: secrets that are never shown again, reach only their
session's agent (through ACP's ``mcpServers``, not its environment), and
are masked in everything the session shows, even split across chunks.
"""

from __future__ import annotations

import hashlib
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater

from tests.openai_api.sdk import OpenAICase, caught, openai_policy
from tests.openai_api.vaults import SERVER, TOKEN, bearer_vault, mcp_agent


class VaultTests(OpenAICase):
    """Vault and credential records: owned, listed, write-only."""

    @inlineCallbacks
    def test_crud_never_shows_the_secret(self) -> Any:
        """
        A credential's token is in no answer (create, get, list, update);
        another identity sees no vault; a vault's delete takes its
        credentials with it.
        """
        client = self.client()
        vaults = client.beta.agents.vaults

        def run() -> Any:
            vault = vaults.create(name="  team  ", metadata={"team": "a"})
            raw = vaults.credentials.with_raw_response.create(
                vault.id,
                name="docs",
                auth={
                    "type": "static_bearer",
                    "mcp_server_url": SERVER,
                    "token": TOKEN,
                },
            )
            cred = raw.parse()
            texts = [raw.text]
            for call in (
                lambda: vaults.credentials.with_raw_response.retrieve(
                    cred.id, vault_id=vault.id
                ),
                lambda: vaults.credentials.with_raw_response.list(vault.id),
                lambda: vaults.credentials.with_raw_response.update(
                    cred.id,
                    vault_id=vault.id,
                    auth={"type": "static_bearer", "token": TOKEN + "2"},
                ),
            ):
                texts.append(call().text)
            listed = [v.id for v in vaults.list()]
            filtered = [v.id for v in vaults.list(extra_query={"metadata[team]": "b"})]
            theirs = caught(
                lambda: self.client("o-token").beta.agents.vaults.retrieve(vault.id)
            )
            renamed = vaults.update(vault.id, name="renamed")
            deleted = vaults.delete(vault.id)
            gone = caught(
                lambda: vaults.credentials.retrieve(cred.id, vault_id=vault.id)
            )
            return vault, cred, texts, listed, filtered, theirs, renamed, deleted, gone

        (
            vault,
            cred,
            texts,
            listed,
            filtered,
            theirs,
            renamed,
            deleted,
            gone,
        ) = yield self.sdk(run)
        self.assertTrue(vault.id.startswith("vlt_"))
        self.assertEqual((vault.name, vault.metadata), ("team", {"team": "a"}))
        self.assertEqual(cred.auth.type, "static_bearer")
        self.assertEqual(cred.auth.mcp_server_url, SERVER)
        for text in texts:
            self.assertNotIn("tok-", text)
        self.assertEqual(listed, [vault.id])
        self.assertEqual(filtered, [])
        self.assertEqual(theirs.status_code, 404)
        self.assertEqual(renamed.name, "renamed")
        self.assertEqual((deleted.id, deleted.deleted), (vault.id, True))
        self.assertEqual(gone.status_code, 404)

    @inlineCallbacks
    def test_refusals(self) -> Any:
        """
        Credentials the daemon cannot keep safe are refused with the
        envelope's ``invalid_param``: an environment variable, a private or
        plain-http server, a refresh broker; nothing is stored.
        """
        vaults = self.client().beta.agents.vaults

        def run() -> Any:
            vault = vaults.create(name="v")
            refused = [
                caught(
                    lambda auth=auth: vaults.credentials.create(
                        vault.id, name="x", auth=auth
                    )
                )
                for auth in (
                    {
                        "type": "environment_variable",
                        "secret_name": "KEY",
                        "secret_value": TOKEN,
                        "networking": {"type": "unrestricted"},
                    },
                    {
                        "type": "static_bearer",
                        "mcp_server_url": "https://127.0.0.1/m",
                        "token": TOKEN,
                    },
                    {
                        "type": "static_bearer",
                        "mcp_server_url": "http://mcp.example.com/",
                        "token": TOKEN,
                    },
                    {
                        "type": "static_bearer",
                        "mcp_server_url": "https://x.internal/",
                        "token": TOKEN,
                    },
                    {
                        "type": "mcp_oauth",
                        "mcp_server_url": SERVER,
                        "access_token": TOKEN,
                        "refresh": {
                            "client_id": "c",
                            "refresh_token": "r",
                            "token_endpoint": SERVER,
                            "token_endpoint_auth": {"type": "none"},
                        },
                    },
                )
            ]
            return refused, list(vaults.credentials.list(vault.id))

        refused, left = yield self.sdk(run)
        for error in refused:
            self.assertEqual(error.status_code, 400, error)
            self.assertEqual(error.body["code"], "invalid_param")
        self.assertEqual(left, [])


class CredentialDeliveryTests(OpenAICase):
    """A credential reaches its session's agent through ACP, and only there."""

    policy = openai_policy(params={"mcp_servers": "http"})

    @inlineCallbacks
    def test_token_reaches_the_agent_masked_everywhere(self) -> Any:
        """
        The agent gets ``Authorization: Bearer TOKEN`` for the tool's server
        in ``session/new`` (its SHA-256 matches), not in its environment;
        the token it echoes in three-character chunks is masked in the
        items, the streamed deltas and its stderr log; the session object
        shows the tool with its header masked; a session of the same agent
        without the vault gets no token.
        """
        client = self.client()
        agents = client.beta.agents

        def run() -> Any:
            vault, _ = bearer_vault(agents)
            session = agents.sessions.create(
                **self.session_body(agent=mcp_agent(), vault_ids=[vault.id])
            )
            with agents.sessions.stream(session.id, input="mcp") as s:
                events = list(s)
            items = list(agents.sessions.items.list(session.id))
            bare = agents.sessions.create(**self.session_body(agent=mcp_agent()))
            with agents.sessions.stream(bare.id, input="mcp") as s:
                list(s)
            others = list(agents.sessions.items.list(bare.id))
            return session, events, items, others

        session, events, items, others = yield self.sdk(run)
        # A session without the vault gets the server, not the token.
        nothing = hashlib.sha256(b"").hexdigest()
        self.assertIn(f"sha256={nothing} in_env=False", others[0].output_text)
        self.assertEqual(session.vault_ids and len(session.vault_ids), 1)
        tool = session.agent.tools[0]
        self.assertEqual(tool.transport.server_url, SERVER)
        self.assertEqual(tool.transport.headers, {})
        text = items[0].output_text
        digest = hashlib.sha256(f"Bearer {TOKEN}".encode()).hexdigest()
        self.assertIn(f"server docs {SERVER} sha256={digest} in_env=False", text)
        self.assertNotIn(TOKEN, text)
        self.assertIn("[redacted]", text)
        deltas = "".join(
            e.delta for e in events if e.type == "agent.session.turn.output_text.delta"
        )
        self.assertNotIn(TOKEN, deltas)
        self.assertNotIn("tok-0123", deltas)
        joined = yield self.stderr_with("mcp header")
        self.assertIn("mcp header [redacted]", joined)
        self.assertNotIn(TOKEN, joined)

    @inlineCallbacks
    def stderr_with(self, text: str) -> Any:
        """The agents' stderr logs once ``text`` is in them (stderr lags stdout)."""
        engine = self.daemon.context.agents.get().sessions
        for _ in range(50):
            joined = "".join(
                c["data"] for s in engine.values() for c in s.stderr.chunks()
            )
            if text in joined:
                return joined
            yield deferLater(reactor, 0.1, lambda: None)
        self.fail(f"{text!r} never reached the agents' stderr logs")

    @inlineCallbacks
    def test_deleted_or_expired_credential_stops_turns(self) -> Any:
        """
        Once a session's credential is deleted its next turn is refused
        (404), and an expired OAuth token is refused at session create.
        """
        agents = self.client().beta.agents

        def run() -> Any:
            vault, cred = bearer_vault(agents)
            session = agents.sessions.create(
                **self.session_body(agent=mcp_agent(), vault_ids=[vault.id])
            )
            agents.vaults.credentials.delete(cred.id, vault_id=vault.id)
            refused = caught(
                lambda: agents.sessions.events.create(
                    session.id,
                    events=[
                        {"type": "agent.session.input.message", "input": "echo hi"}
                    ],
                )
            )
            old = agents.vaults.credentials.create(
                vault.id,
                name="old",
                auth={
                    "type": "mcp_oauth",
                    "mcp_server_url": SERVER,
                    "access_token": TOKEN,
                    "expires_at": "2001-01-01T00:00:00Z",
                },
            )
            expired = caught(
                lambda: agents.sessions.create(
                    **self.session_body(
                        agent=mcp_agent(credential_id=old.id), vault_ids=[vault.id]
                    )
                )
            )
            return refused, expired, list(agents.sessions.list())

        refused, expired, listed = yield self.sdk(run)
        self.assertEqual(refused.status_code, 404)
        self.assertEqual(refused.body["param"], "credential_id")
        self.assertEqual(expired.status_code, 400)
        self.assertIn("expired", expired.body["message"])
        self.assertEqual(len(listed), 1)


class DefinitionToolTests(OpenAICase):
    """A definition's MCP tools, in a response."""

    policy = openai_policy(params={"mcp_servers": "http"})

    @inlineCallbacks
    def test_definition_tools_in_a_response(self) -> Any:
        """
        A definition shows its tool's header masked; a response run from it
        hands the server and its header to the agent, and masks the header.
        """
        client = self.client()

        def run() -> Any:
            made = client.beta.agents.create(
                model="fake",
                tools=[
                    {
                        "type": "mcp",
                        "server_label": "docs",
                        "transport": {
                            "type": "http",
                            "server_url": SERVER,
                            "authorization": f"Bearer {TOKEN}",
                        },
                    }
                ],
            )
            return made, client.responses.create(model=made.id, input="mcp")

        made, response = yield self.sdk(run)
        self.assertEqual(made.tools[0].transport.headers, {"Authorization": "***"})
        digest = hashlib.sha256(f"Bearer {TOKEN}".encode()).hexdigest()
        self.assertIn(f"server docs {SERVER} sha256={digest}", response.output_text)
        self.assertNotIn(TOKEN, response.output_text)


class McpPolicyTests(OpenAICase):
    """The policy's ``params.mcp_servers`` governs a session's MCP tools."""

    @inlineCallbacks
    def test_tools_refused_by_default(self) -> Any:
        """
        With no ``params.mcp_servers`` a session with an MCP tool is 403
        ``param_not_allowed`` and no agent is left running.
        """
        agents = self.client().beta.agents

        def run() -> Any:
            refused = caught(
                lambda: agents.sessions.create(**self.session_body(agent=mcp_agent()))
            )
            return refused, list(agents.sessions.list())

        refused, listed = yield self.sdk(run)
        self.assertEqual(refused.status_code, 403)
        self.assertEqual(refused.body["code"], "param_not_allowed")
        self.assertEqual(listed, [])
        self.assertEqual(self.daemon.context.agents.get().live(), [])
