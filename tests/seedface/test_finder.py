"""
The face is ``agent_sandbox.server`` only while the daemon loads templates:
a plain Python keeps the real package (which ``agent-sandbox-client``
needs), and whatever was imported before is back afterwards.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.seedface import api
from sandboxd.seedface.finder import FACE, PARENT, FaceFinder, seed_face


def _seed_installed() -> bool:
    return importlib.util.find_spec(FACE) is not None


def _forget(prefix: str) -> dict[str, object]:
    """Remove and return every module under ``prefix``."""
    gone = {
        k: sys.modules.pop(k)
        for k in list(sys.modules)
        if k == prefix or k.startswith(prefix + ".")
    }
    return gone


class FinderTests(SynchronousTestCase):
    """``seed_face`` puts the face in place and takes it away."""

    def setUp(self) -> None:
        saved = _forget(PARENT)
        self.addCleanup(lambda: (_forget(PARENT), sys.modules.update(saved)))

    def test_face_inside(self) -> None:
        """Inside, the package and its submodules carry the face's names."""
        with seed_face():
            server = importlib.import_module(FACE)
            registry = importlib.import_module(FACE + ".registry")
            self.assertIs(server.command, api.command)
            self.assertIs(server.CommandArg, api.CommandArg)
            self.assertIs(registry.default_registry, api.default_registry)
            self.assertIs(server.default_table, api.default_table)

    def test_real_package_back_after(self) -> None:
        """The real package imported before is the one found after."""
        if not _seed_installed():
            raise SkipTest("agent-sandbox-server is not installed")
        real = importlib.import_module(FACE)
        with seed_face():
            self.assertIsNot(importlib.import_module(FACE), real)
        self.assertIs(importlib.import_module(FACE), real)
        self.assertIs(sys.modules[PARENT].server, real)  # type: ignore[attr-defined]

    def test_nothing_left_behind(self) -> None:
        """Without an earlier import, the face leaves no module behind."""
        with seed_face():
            importlib.import_module(FACE)
        self.assertNotIn(FACE, sys.modules)
        self.assertNotIn(FaceFinder, [type(f) for f in sys.meta_path])

    def test_stub_parent(self) -> None:
        """With no agent_sandbox installed, the finder supplies an empty parent."""
        finder = FaceFinder(stub_parent=True)
        sys.meta_path.insert(0, finder)
        self.addCleanup(sys.meta_path.remove, finder)
        server = importlib.import_module(FACE)
        self.assertIs(server.ServerResponse, api.ServerResponse)
        parent = sys.modules[PARENT]
        self.assertIs(parent.__spec__.loader, finder)  # type: ignore[union-attr]


class PlainPythonTests(SynchronousTestCase):
    """Installing sandboxd does not change what a plain Python imports."""

    def test_real_package_in_plain_python(self) -> None:
        """``import agent_sandbox.server`` (after sandboxd) is the real one."""
        if not _seed_installed():
            raise SkipTest("agent-sandbox-server is not installed")
        code = (
            "import sandboxd, sandboxd.daemon.server, sandboxd.seedface.api\n"
            "import agent_sandbox.server as s\n"
            "from agent_sandbox.server.registry import default_registry\n"
            "from agent_sandbox.api.server_client import ServerClient\n"
            "print(s.__file__, type(default_registry()).__module__)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        where, module = done.stdout.split()
        self.assertIn("site-packages", where)
        self.assertEqual(module, "agent_sandbox.server.registry")
