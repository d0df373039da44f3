"""
No test module imports another's test cases: trial collects every test
case class it finds in a module's namespace, so an imported one runs again
under the importing module (a slow one doubles its cost in every run).
Shared fixtures live in helper modules or on non-test classes.
"""

from __future__ import annotations

import ast
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

TESTS = Path(__file__).parent


def module_name(path: Path) -> str:
    """``tests.mcp.test_door`` for ``tests/mcp/test_door.py``."""
    return ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)


def test_cases(tree: ast.Module) -> set[str]:
    """
    The module-level classes of ``tree`` that trial would run: with a base
    class (a mixin of test methods without one is never collected) and a
    ``test_`` method of their own.
    """
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and node.bases
        and any(
            isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            and item.name.startswith("test")
            for item in node.body
        )
    }


def imported_cases(sources: dict[str, str]) -> list[tuple[str, str, str]]:
    """
    ``(importer, module, class)`` for each test case class of one module in
    ``sources`` (module name to source text) that another imports by name.
    """
    trees = {name: ast.parse(text) for name, text in sources.items()}
    cases = {name: test_cases(tree) for name, tree in trees.items()}
    found = []
    for importer, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in cases:
                for alias in node.names:
                    if alias.name in cases[node.module]:
                        found.append((importer, node.module, alias.name))
    return sorted(found)


class CollectionTests(SynchronousTestCase):
    """Each test runs once, under the module that defines it."""

    def test_no_test_case_imported(self) -> None:
        """No test module imports another test module's test case."""
        sources = {
            module_name(path): path.read_text(encoding="utf-8")
            for path in TESTS.rglob("test_*.py")
        }
        self.assertEqual(imported_cases(sources), [])

    def test_finds_an_imported_case(self) -> None:
        """An imported test case is found; a fixture class or a mixin is not."""
        sources = {
            "tests.a.test_x": (
                "class Fixture:\n    policy = {}\n"
                "class Scenarios:\n    def test_one(self): pass\n"
                "class SlowTests(TestCase):\n    def test_slow(self): pass\n"
            ),
            "tests.b.test_y": (
                "from tests.a.test_x import Fixture, Scenarios, SlowTests\n"
            ),
        }
        self.assertEqual(
            imported_cases(sources), [("tests.b.test_y", "tests.a.test_x", "SlowTests")]
        )
