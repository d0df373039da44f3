"""
``client.responses.compact`` against a real daemon: the conversation's
agent runs its own compaction command, or the call is refused.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.openai_api.sdk import OpenAICase, caught


class CompactTests(OpenAICase):
    """``POST /v1/responses/compact``."""

    @inlineCallbacks
    def test_agent_compacts_its_conversation(self) -> Any:
        """
        An agent that offers ``/compact`` runs it as one more turn of the
        conversation: the answer is a ``response.compaction`` with the
        agent's reply as a message item and its token counts, and the
        conversation continues from the same latest response.
        """
        client = self.client()

        def run() -> Any:
            first = client.responses.create(model="fake", input="commands compact")
            compacted = client.responses.compact(
                model="fake", previous_response_id=first.id
            )
            after = client.responses.create(
                model="fake", input="echo still here", previous_response_id=first.id
            )
            return compacted, after

        compacted, after = yield self.sdk(run)
        self.assertEqual(compacted.object, "response.compaction")
        self.assertRegex(compacted.id, r"^resp_cmp_[0-9a-f]{20}$")
        (message,) = compacted.output
        self.assertEqual(message.type, "message")
        self.assertIn("originalTokenCount", message.content[0].text)
        self.assertEqual(
            compacted.x_agent_sandbox,  # type: ignore[attr-defined]
            {"original_token_count": 1200, "new_token_count": 300},
        )
        self.assertEqual(compacted.usage.total_tokens, 0)
        self.assertEqual(after.output_text, "still here")

    @inlineCallbacks
    def test_refusals(self) -> Any:
        """
        Refused before anything runs, 400 with ``x-should-retry: false``: an
        agent without a compaction command (``param: model``), a response
        that is not its conversation's latest, no ``previous_response_id``,
        a key compaction does not take; an unknown response is 404.
        """
        client = self.client()

        def run() -> Any:
            plain = client.responses.create(model="fake", input="echo plain")
            first = client.responses.create(model="fake", input="commands compact")
            client.responses.create(
                model="fake", input="echo next", previous_response_id=first.id
            )
            compact = client.responses.compact
            return [
                caught(lambda: compact(model="fake", previous_response_id=plain.id)),
                caught(lambda: compact(model="fake", previous_response_id=first.id)),
                caught(lambda: compact(model="fake")),
                caught(
                    lambda: compact(
                        model="fake", previous_response_id=plain.id, input="x"
                    )
                ),
                caught(lambda: compact(model="fake", previous_response_id="resp_x")),
            ]

        errors = yield self.sdk(run)
        self.assertEqual(
            [(e.status_code, e.body["code"], e.body["param"]) for e in errors],
            [
                (400, "invalid_param", "model"),
                (400, "invalid_param", "previous_response_id"),
                (400, "invalid_param", "previous_response_id"),
                (400, "invalid_param", "input"),
                (404, "not_found", "previous_response_id"),
            ],
        )
        self.assertIn("no /compact or /compress", errors[0].body["message"])
        for e in errors:
            self.assertEqual(e.response.headers["x-should-retry"], "false")
