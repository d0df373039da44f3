"""
The lsp group through the MCP door with the official ``mcp`` client: the
six calls a model makes are listed, the editor's are not, and a
diagnostics call answers in the model's coordinates.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.lsp.test_lsp import START_SECONDS, lsp_policy, need_pylsp
from tests.mcp.helpers import McpTestCase


class LspToolTests(McpTestCase):
    """A model finds an error and its definition with a real pylsp."""

    timeout = 120
    policy = lsp_policy()
    client_seconds = START_SECONDS + 30

    def setUp(self) -> Any:
        need_pylsp()
        return super().setUp()

    @inlineCallbacks
    def test_listed_tools_and_a_diagnostics_call(self) -> Any:
        """Six lsp tools are listed; diagnostics and definition answer with lines from 1."""
        os.makedirs(os.path.join(self.base_dir, "proj"))
        for name, text in (
            ("pyproject.toml", ""),
            ("lib.py", "def greet():\n    return 1\n"),
            ("app.py", "from lib import greet\n\ngreet()\nprint(nope)\n"),
        ):
            with open(os.path.join(self.base_dir, "proj", name), "w") as f:
                f.write(text)

        async def body(client: Any) -> Any:
            listed = await client.list_tools()
            diag = await client.call_tool("lsp_diagnostics", {"path": "proj/app.py"})
            where = await client.call_tool(
                "lsp_definition", {"path": "proj/app.py", "line": 3, "column": 1}
            )
            return listed, diag, where

        listed, diag, where = yield self.with_client(body)
        names = {t.name for t in listed.tools if t.name.startswith("lsp_")}
        self.assertEqual(
            names,
            {
                "lsp_diagnostics",
                "lsp_definition",
                "lsp_references",
                "lsp_hover",
                "lsp_symbols",
                "lsp_rename",
            },
        )
        self.assertFalse(diag.is_error, diag)
        [problem] = diag.structured_content["diagnostics"]
        self.assertEqual((problem["line"], problem["column"]), (4, 7))
        self.assertIn("nope", problem["message"])
        self.assertFalse(where.is_error, where)
        [location] = where.structured_content["locations"]
        self.assertEqual(
            (os.path.basename(location["path"]), location["line"]), ("lib.py", 1)
        )
