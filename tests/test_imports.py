"""
The import graph of ``sandboxd/`` has no cycle (STYLE: dependencies point
one way), counting imports under ``if TYPE_CHECKING:`` and inside functions:
a back-import hidden in either is still a circle a reader has to untangle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

import sandboxd

PACKAGE = Path(sandboxd.__file__).parent


def module_name(path: Path) -> str:
    """``sandboxd.web.factory`` for ``sandboxd/web/site.py``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported(path: Path, modules: set[str]) -> set[str]:
    """The ``sandboxd`` modules that the file at ``path`` imports anywhere."""
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` depends on the module pkg.mod where there
            # is one, and on pkg itself only for the names pkg defines.
            submodules = [f"{base}.{alias.name}" for alias in node.names]
            names = [m for m in submodules if m in modules]
            if len(names) < len(submodules):
                names.append(base)
        else:
            continue
        for name in names:
            if name in modules and name != this:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module name -> the ``sandboxd`` modules it imports."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imported(p, modules) for p in paths}
    # Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first, but
    # those edges are the package's face, not a dependency of the module.
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


class ImportGraphTests(SynchronousTestCase):
    """The package's modules import one another in one direction only."""

    def test_no_cycle(self) -> None:
        """No module of ``sandboxd`` reaches itself through its imports."""
        cycle = find_cycle(import_graph())
        self.assertIsNone(cycle, "import cycle: " + " -> ".join(cycle or []))

    def test_no_stdlib_names(self) -> None:
        """No module of ours is named like a standard library module (``pty``)."""
        clashes = sorted(
            str(path.relative_to(PACKAGE.parent))
            for path in PACKAGE.rglob("*.py")
            if (path.parent.name if path.stem == "__init__" else path.stem)
            in sys.stdlib_module_names
        )
        self.assertEqual(clashes, [])

    def test_finds_a_cycle(self) -> None:
        """The check itself sees a cycle when there is one."""
        self.assertEqual(
            find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}), ["a", "b", "c", "a"]
        )
        self.assertIsNone(find_cycle({"a": {"b"}, "b": set()}))

    def test_sees_hidden_imports(self) -> None:
        """
        Imports under ``if TYPE_CHECKING:`` and inside functions count as
        edges (the context names the agents manager only for typing; the
        testing harness imports the site factory only when asked for one).
        """
        graph = import_graph()
        self.assertIn("sandboxd.agents.manager", graph["sandboxd.daemon.context"])
        self.assertIn("sandboxd.web.factory", graph["sandboxd.testing"])
