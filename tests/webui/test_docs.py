"""
The console's page of the docs lists every ``data-testid`` the console
draws: scripts and tests drive the console by them, so each one is a
promise the docs must name.
"""

from __future__ import annotations

import re
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.webui.assets import STATIC

DOCS = Path(__file__).resolve().parents[2] / "docs" / "console.md"

#: ``testid: "name"`` in the modules, ``data-testid="name"`` in the page.
_LITERAL = re.compile(r"""(?:testid:\s*|data-testid=)["']([a-z0-9-]+)["']""")


def drawn() -> set[str]:
    """Every literal ``data-testid`` in the console's page and modules (not in comments)."""
    found: set[str] = set()
    for path in STATIC.iterdir():
        if path.suffix in (".js", ".html"):
            code = [
                line
                for line in path.read_text().splitlines()
                if not line.lstrip().startswith(("//", "*", "/*"))
            ]
            found.update(_LITERAL.findall("\n".join(code)))
    return found


class TestidDocsTests(SynchronousTestCase):
    """docs/console.md against the console's own files."""

    def test_every_testid_documented(self) -> None:
        """Each ``data-testid`` the console draws appears in the docs' table."""
        if not DOCS.exists():
            self.skipTest("docs/ is not shipped with this copy (an installed wheel)")
        listed = set(re.findall(r"`([a-z0-9-]+)`", DOCS.read_text()))
        ids = drawn()
        self.assertIn("code-cell", ids)  # the pattern still finds them
        self.assertEqual(sorted(ids - listed), [])
