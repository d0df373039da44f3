"""
Awkward but legitimate text through the ``/v1`` door, as the official
``openai`` SDK reads it: an agent's message holding NEL, U+2028 and U+2029
(which JSON leaves raw and ``str.splitlines`` ends a line at) arrives whole
in the streamed deltas and in the final response.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.openai_api.sdk import OpenAICase

#: What the fake agent is asked to say back: each line separator JSON
#: allows raw, a NUL, a lone CR and characters of 2, 3 and 4 bytes.
TEXT = "a\u0085b\u2028c\u2029d\x00e\rf é€😀"


class ContentTests(OpenAICase):
    """The agent's text, byte for byte, through ``responses``."""

    @inlineCallbacks
    def test_line_separators_in_streamed_text(self) -> Any:
        """
        ``stream=True`` deltas join to the agent's text and the final
        response's ``output_text`` is that text: no event is cut or lost
        where a line reader would split.
        """
        client = self.client()

        def run() -> Any:
            with client.responses.create(
                model="fake", input="echo " + TEXT, stream=True
            ) as stream:
                events = list(stream)
            blocking = client.responses.create(model="fake", input="echo " + TEXT)
            return events, blocking

        events, blocking = yield self.sdk(run)
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        self.assertEqual("".join(deltas), TEXT)
        self.assertEqual(events[-1].type, "response.completed")
        self.assertEqual(events[-1].response.output_text, TEXT)
        self.assertEqual(blocking.output_text, TEXT)
