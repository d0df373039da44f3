"""
Agent definitions (``client.beta.agents``) and environments
(``client.beta.agents.environments``) with the official ``openai`` SDK: what
sessions and responses start from.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import inlineCallbacks

from sandboxd.policy import defaults
from tests.openai_api.sdk import OpenAICase, caught


class DefinitionTests(OpenAICase):
    """Create, read, update and delete definitions, and run them."""

    @inlineCallbacks
    def test_crud(self) -> Any:
        """A definition is stored, listed, changed and deleted; its model must be an agent."""
        client = self.client()
        agents = client.beta.agents

        def run() -> Any:
            made = agents.create(model="fake", name="Helper", metadata={"team": "a"})
            updated = agents.update(made.id, instructions="Be brief.")
            listed = [a.id for a in agents.list()]
            models = [m.id for m in client.models.list()]
            theirs = caught(
                lambda: self.client("o-token").beta.agents.retrieve(made.id)
            )
            unknown = caught(
                lambda: agents.create(model="m", extra_body={"adapter": "no-such"})
            )
            deleted = agents.delete(made.id)
            gone = caught(lambda: agents.retrieve(made.id))
            return made, updated, listed, models, theirs, unknown, deleted, gone

        made, updated, listed, models, theirs, unknown, deleted, gone = yield self.sdk(
            run
        )
        self.assertTrue(made.id.startswith("agent_"))
        self.assertEqual(
            (made.model, made.name, made.metadata), ("fake", "Helper", {"team": "a"})
        )
        self.assertEqual(updated.instructions, "Be brief.")
        self.assertEqual(listed, [made.id])
        self.assertIn(made.id, models)
        self.assertEqual(theirs.status_code, 404)
        self.assertEqual(
            (unknown.status_code, unknown.body["code"]), (404, "not_found")
        )
        self.assertTrue(deleted.deleted)
        self.assertEqual(gone.status_code, 404)

    @inlineCallbacks
    def test_per_identity_bound(self) -> Any:
        """
        A definition past an identity's bound is 400 naming the bound;
        another identity still has room.
        """
        self.patch(defaults, "AGENT_KEPT_ITEMS", 1)

        def make(token: str) -> Any:
            return self.request(
                "POST",
                "/v1/agents",
                {"model": "fake"},
                headers={"Authorization": f"Bearer {token}"},
            )

        first = yield make("u-token")
        self.assertEqual(first.status, 200, first.body)
        second = yield make("u-token")
        self.assertEqual(second.status, 400, second.body)
        self.assertEqual(
            second.json()["error"]["message"],
            "at most 1 agents per identity; delete one first",
        )
        other = yield make("o-token")
        self.assertEqual(other.status, 200, other.body)

    @inlineCallbacks
    def test_session_and_response_from_definition(self) -> Any:
        """
        A session made with ``agent_id`` shows the definition and sends its
        instructions ahead of the first prompt; a response names it as model.
        """
        client = self.client()
        sessions = client.beta.agents.sessions

        def run() -> Any:
            made = client.beta.agents.create(
                model="fake", name="Echoer", instructions="echo "
            )
            session = sessions.create(
                agent_id=made.id,
                environment={
                    "type": "self_hosted",
                    "workspace_directory": self.base_dir,
                },
            )
            with sessions.stream(session.id, input="from the session") as s:
                list(s)
            items = list(sessions.items.list(session.id))
            response = client.responses.create(model=made.id, input="from a response")
            return made, session, items, response

        made, session, items, response = yield self.sdk(run)
        self.assertEqual((session.agent.id, session.agent.name), (made.id, "Echoer"))
        self.assertEqual(session.agent.model, "fake")
        # The fake agent echoes what follows "echo": the separator and the input.
        self.assertEqual(items[0].output_text, "\n\n---\n\nfrom the session")
        self.assertEqual(response.output_text, "\n\n---\n\nfrom a response")


class EnvironmentTests(OpenAICase):
    """``client.beta.agents.environments``: a guarded directory and variables."""

    @inlineCallbacks
    def test_environment_for_a_session(self) -> Any:
        """
        An environment names a directory inside the path rule and variables
        the session's agent (and its commands) get; one outside is refused.
        """
        client = self.client()
        envs = client.beta.agents.environments
        sessions = client.beta.agents.sessions
        work = self.base_dir + "/work"
        os.makedirs(work)

        def run() -> Any:
            made = envs.create(
                environment={
                    "type": "self_hosted",
                    "workspace_directory": work,
                    "env": {"GREETING": "bonjour"},
                }
            )
            listed = [e.id for e in envs.list()]
            outside = caught(
                lambda: envs.create(
                    environment={"type": "self_hosted", "workspace_directory": "/etc"}
                )
            )
            session = sessions.create(
                agent={"model": "fake"},
                environment={"type": "self_hosted", "id": made.id},
            )
            with sessions.stream(session.id, input="terminal printenv GREETING") as s:
                list(s)
            items = list(sessions.items.list(session.id, order="asc"))
            return made, envs.retrieve(made.id), listed, outside, session, items

        made, again, listed, outside, session, items = yield self.sdk(run)
        self.assertEqual((made.workspace_directory, made.status), (work, "ready"))
        self.assertEqual(again.id, made.id)
        self.assertEqual(listed, [made.id])
        self.assertEqual(outside.status_code, 403)
        self.assertEqual(outside.body["code"], "path_not_allowed")
        self.assertEqual(session.environment.id, made.id)
        self.assertEqual(session.environment.workspace_directory, work)
        command = next(i for i in items if i.type == "command_execution")
        self.assertEqual(command.output, "bonjour\n")
