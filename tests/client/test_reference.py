# -*- test-case-name: tests.client.test_reference -*-
"""``docs/client.md`` is what the client's docstrings and parser say."""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.client import reference
from tests.client.base import ROOT


class ReferenceTests(SynchronousTestCase):
    """The generated client documentation."""

    def test_docs_client_md_is_generated(self) -> None:
        """docs/client.md is byte for byte what the generator prints."""
        with open(os.path.join(ROOT, "docs", "client.md"), encoding="utf-8") as f:
            text = f.read()
        self.assertEqual(
            text,
            reference.render(),
            "docs/client.md is stale: run `python -m sandboxd.client.reference > docs/client.md`",
        )

    def test_every_namespace_documented(self) -> None:
        """Each namespace of a Sandbox has a section, and every error code a row."""
        text = reference.render()
        for name in (
            "files",
            "commands",
            "pty",
            "system",
            "env",
            "git",
            "code",
            "browser",
            "agents",
        ):
            self.assertIn(f"### sb.{name}\n", text)
        self.assertIn(
            "| `path_not_allowed` | `PathNotAllowed` | `PermissionDenied` |", text
        )
        self.assertIn("### `sandboxd term`", text)
