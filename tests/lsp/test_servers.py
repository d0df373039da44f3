"""
The lsp group with real servers other than pylsp, installed pinned from
npm by ``make test-tools``: pyright (which counts columns in UTF-16 units,
as LSP says, so a line with a character outside the BMP checks the
conversion both ways) and typescript-language-server over tsserver.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest

from tests.agents.test_real_cli import environment
from tests.lsp.test_lsp import LspTestCase, lsp_policy

PYRIGHT_BIN = os.path.join(sys.prefix, "node-pyright", "node_modules", ".bin")
TSLS_BIN = os.path.join(sys.prefix, "node-tsls", "node_modules", ".bin")


class NpmServerCase(LspTestCase):
    """
    A daemon whose children find one npm-installed server on their PATH;
    a subclass names its directory and program.
    """

    bin_dir = ""
    program = ""

    def setUp(self) -> Any:
        if not os.path.exists(os.path.join(self.bin_dir, self.program)):
            raise SkipTest(
                f"{self.program} is not in {self.bin_dir} (make test-tools installs it)"
            )
        environment(
            self, {"PATH": self.bin_dir + os.pathsep + os.environ.get("PATH", "")}
        )
        return super().setUp()

    @inlineCallbacks
    def session_of(self, answer: dict[str, Any]) -> Any:
        """The session document behind ``answer``."""
        reply = yield self.request("GET", f"/lsp/sessions/{answer['session_id']}")
        self.assertEqual(reply.status, 200, reply.body)
        return reply.json()


class PyrightTests(NpmServerCase):
    """pyright: diagnostics, definitions, references and hover, in UTF-16."""

    bin_dir = PYRIGHT_BIN
    program = "pyright-langserver"
    policy = lsp_policy(params={"lsp_servers": ["pyright"]})

    @inlineCallbacks
    def test_diagnostics_of_a_type_error(self) -> Any:
        """A str given to an int is an error at its line and column, from Pyright."""
        self.write("proj/pyproject.toml", "")
        self.write("proj/bad.py", 'import os\n\nx: int = "a"\n')
        out = yield self.ask("diagnostics", path="proj/bad.py")
        self.assertTrue(out["settled"])
        self.assertEqual(out["server"], "pyright")
        errors = [d for d in out["diagnostics"] if d["severity"] == "error"]
        [error] = errors
        self.assertEqual(
            (error["line"], error["column"], error["end_line"], error["end_column"]),
            (3, 10, 3, 13),
        )
        self.assertEqual(error["source"], "Pyright")
        self.assertIn("\"Literal['a']\"", error["message"])
        self.assertIn('"int"', error["message"])
        self.assertEqual(out["counts"]["error"], 1)

    @inlineCallbacks
    def test_definition_in_another_file(self) -> Any:
        """The call of a function imported from another file leads to its name there."""
        self.project()
        out = yield self.ask("definition", path="proj/app.py", line=3, column=7)
        [location] = out["locations"]
        self.assertEqual(location["path"], os.path.join(self.base_dir, "proj/lib.py"))
        self.assertEqual((location["line"], location["column"]), (1, 5))
        self.assertEqual(location["text"], "def greet(name: str) -> str:")
        session = yield self.session_of(out)
        self.assertEqual(session["position_encoding"], "utf-16")

    @inlineCallbacks
    def test_columns_past_the_bmp(self) -> Any:
        """
        Two emoji (two UTF-16 units each) before a call: the agent's column
        of ``f`` lands on ``f``, not on ``g`` two units earlier, and the
        references of ``f`` and ``g`` come back at their character columns.
        """
        self.write("proj/pyproject.toml", "")
        self.write(
            "proj/u.py",
            "def f() -> int:\n    return 1\n\n"
            "def g(n: int) -> int:\n    return n\n\n"
            "s = '\U0001f600\U0001f600'; g(f())\n",
        )
        out = yield self.ask("definition", path="proj/u.py", line=7, column=13)
        [location] = out["locations"]
        self.assertEqual((location["line"], location["column"]), (1, 5))
        out = yield self.ask("definition", path="proj/u.py", line=7, column=11)
        [location] = out["locations"]
        self.assertEqual((location["line"], location["column"]), (4, 5))
        out = yield self.ask("references", path="proj/u.py", line=1, column=5)
        self.assertEqual(
            sorted((r["line"], r["column"], r["end_column"]) for r in out["locations"]),
            [(1, 5, 6), (7, 13, 14)],
        )
        out = yield self.ask("references", path="proj/u.py", line=4, column=5)
        self.assertIn((7, 11), {(r["line"], r["column"]) for r in out["locations"]})

    @inlineCallbacks
    def test_project_symbols_and_rename(self) -> Any:
        """
        A query finds a function in another file of the project; a rename
        from its use changes both files (pyright's edits are ranges, not
        whole files).
        """
        self.project()
        out = yield self.ask("symbols", path="proj/app.py", query="greet")
        found = {
            (os.path.basename(s["path"]), s["name"], s["line"]) for s in out["symbols"]
        }
        self.assertIn(("lib.py", "greet", 1), found)
        out = yield self.ask(
            "rename", path="proj/app.py", line=3, column=7, new_name="hello"
        )
        self.assertEqual(len(out["files"]), 2)
        with open(os.path.join(self.base_dir, "proj/lib.py")) as f:
            self.assertTrue(f.read().startswith("def hello(name: str) -> str:"))
        with open(os.path.join(self.base_dir, "proj/app.py")) as f:
            self.assertIn("print(hello('x'))", f.read())

    @inlineCallbacks
    def test_hover(self) -> Any:
        """Hover over a call gives the function's signature and docstring."""
        self.project()
        out = yield self.ask("hover", path="proj/app.py", line=3, column=8)
        self.assertTrue(out["found"])
        self.assertIn("def greet(name: str) -> str", out["contents"])
        self.assertIn("Say hello.", out["contents"])
        self.assertEqual(
            (out["range"]["line"], out["range"]["column"], out["range"]["end_column"]),
            (3, 7, 12),
        )


class TypeScriptTests(NpmServerCase):
    """typescript-language-server: a small project's definitions, errors, completions."""

    bin_dir = TSLS_BIN
    program = "typescript-language-server"
    policy = lsp_policy(params={"lsp_servers": ["typescript-language-server"]})

    def ts_project(self) -> None:
        self.write(
            "web/tsconfig.json",
            '{"compilerOptions": {"strict": true, "target": "es2020",'
            ' "module": "commonjs"}}\n',
        )
        self.write(
            "web/lib.ts",
            "export function greet(name: string): string {\n"
            '  return "hi " + name;\n}\n\n'
            'export const obj = { size: 1, label: "a" };\n',
        )
        self.write(
            "web/app.ts",
            'import { greet } from "./lib";\n\nconst n: number = greet("x");\n'
            "console.log(n);\n",
        )

    @inlineCallbacks
    def test_definition_in_another_file(self) -> Any:
        """An imported function's call leads to its name in the other file."""
        self.ts_project()
        out = yield self.ask("definition", path="web/app.ts", line=3, column=20)
        self.assertEqual(out["server"], "typescript-language-server")
        [location] = out["locations"]
        self.assertEqual(location["path"], os.path.join(self.base_dir, "web/lib.ts"))
        self.assertEqual((location["line"], location["column"]), (1, 17))
        self.assertTrue(location["text"].startswith("export function greet("))

    @inlineCallbacks
    def test_diagnostics_of_a_type_error(self) -> Any:
        """A string given to a number is TS2322 at the name it is given to."""
        self.ts_project()
        out = yield self.ask("diagnostics", path="web/app.ts")
        self.assertTrue(out["settled"])
        [error] = out["diagnostics"]
        self.assertEqual(
            (error["line"], error["column"], error["severity"], error["code"]),
            (3, 7, "error", 2322),
        )
        self.assertEqual(error["source"], "typescript")
        self.assertIn("not assignable to type 'number'", error["message"])

    @inlineCallbacks
    def test_completions_of_a_property(self) -> Any:
        """After ``obj.`` the object's properties are offered."""
        self.ts_project()
        self.write("web/c.ts", 'import { obj } from "./lib";\nobj.\n')
        out = yield self.ask("completions", path="web/c.ts", line=2, column=5)
        labels = {i["label"]: i for i in out["items"]}
        self.assertIn("size", labels)
        self.assertIn("label", labels)
        self.assertEqual(labels["size"]["kind"], "field")
