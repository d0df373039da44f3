"""
OpenAI's error envelope: what the ``openai`` SDK is told to retry.

The SDK retries every 5xx unless the answer says ``x-should-retry:
false``; these check the headers the door sends beside each envelope.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import rate_limited, unavailable
from sandboxd.openai_api.envelope import openai_error


class RetryTests(SynchronousTestCase):
    """Which refusals the SDK may repeat."""

    def test_missing_dependency_not_retried(self) -> None:
        """A 503 a retry cannot change tells the SDK not to retry."""
        body, headers = openai_error(unavailable("no kernel here"))
        self.assertEqual(headers["x-should-retry"], "false")
        self.assertEqual(body["error"]["code"], "unavailable")
        self.assertNotIn("Retry-After", headers)

    def test_not_ready_yet_retried(self) -> None:
        """A 503 that names a Retry-After (state still loading) may be retried."""
        body, headers = openai_error(unavailable("still reading", retry_after=1))
        self.assertEqual(headers["x-should-retry"], "true")
        self.assertEqual(headers["Retry-After"], "1")
        self.assertEqual(body["error"]["type"], "server_error")

    def test_rate_limited_retried(self) -> None:
        """A 429 is the caller being early: retried."""
        _, headers = openai_error(rate_limited("slow down", 2))
        self.assertEqual(headers["x-should-retry"], "true")
