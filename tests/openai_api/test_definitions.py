"""
Agent definitions (``client.beta.agents``) with the official ``openai`` SDK:
a stored agent that sessions and responses start from.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import inlineCallbacks

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
            unknown = caught(lambda: agents.create(model="no-such"))
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
