# -*- test-case-name: tests.openai_api.test_sessions -*-
"""
Secrets kept out of what the ``/v1`` door shows of an agent's output.

An agent's keys (its catalogue entry's ``env_pass`` values) must not reach
a client through the agent's own words, however it splits them: a stream
holds back the tail of its text that could be the start of a secret until
the next chunk shows it is not (or the item ends).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable

from sandboxd.policy.defaults import SECRET_MIN_CHARS

#: What a secret is replaced with.
MARK = "[redacted]"


class Redactor:
    """The secret values of one session."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = sorted(
            {s for s in secrets if len(s) >= SECRET_MIN_CHARS}, key=len, reverse=True
        )

    def add(self, values: Iterable[str]) -> None:
        """
        Treat ``values`` as secrets too, as written and as they appear
        URL-encoded or inside a JSON string (a vault token echoed in a URL
        or a tool's JSON arguments); streams already open see them at once.
        """
        more = set(self.secrets)
        for value in values:
            more.update(
                (value, urllib.parse.quote(value, safe=""), json.dumps(value)[1:-1])
            )
        self.secrets = sorted(
            {s for s in more if len(s) >= SECRET_MIN_CHARS}, key=len, reverse=True
        )

    def redact(self, text: str) -> str:
        """``text`` with every whole secret replaced."""
        for secret in self.secrets:
            text = text.replace(secret, MARK)
        return text

    def held(self, text: str) -> int:
        """How many characters at the end of ``text`` could begin a secret."""
        longest = 0
        for secret in self.secrets:
            for size in range(min(len(secret) - 1, len(text)), longest, -1):
                if text.endswith(secret[:size]):
                    longest = size
                    break
        return longest

    def stream(self) -> StreamRedactor:
        """A redactor for one stream of chunks."""
        return StreamRedactor(self)


class StreamRedactor:
    """One stream's chunks, redacted even when a secret is split across them."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self.pending = ""

    def feed(self, chunk: str) -> str:
        """What can be shown of ``chunk`` now."""
        if not self.redactor.secrets:
            return chunk
        text = self.redactor.redact(self.pending + chunk)
        keep = self.redactor.held(text)
        cut = len(text) - keep
        self.pending = text[cut:]
        return text[:cut]

    def flush(self) -> str:
        """The rest, at the end of the stream (no secret can complete now)."""
        rest, self.pending = self.pending, ""
        return rest
