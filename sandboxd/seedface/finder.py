# -*- test-case-name: tests.seedface.test_finder -*-
"""
Putting the face in place while the daemon loads ``--commands`` templates.

``agent_sandbox.server`` is a real distribution (``agent-sandbox-server``,
which ``agent-sandbox-client`` depends on), so sandboxd never installs a
package of that name: an environment that has the real one keeps it, and a
plain ``python -c "import agent_sandbox.server"`` gets it.  Only inside
:func:`seed_face`, which the daemon wraps around each template import, does
a finder at the head of ``sys.meta_path`` answer for
``agent_sandbox.server`` (and the submodules templates import names from)
with :mod:`sandboxd.seedface.api`.  Whatever ``agent_sandbox.server``
meant before is put back afterwards; the template keeps the face's objects
it imported.  With no ``agent_sandbox`` package installed at all, the
finder also supplies an empty parent package for as long as it is active.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator, Sequence

PARENT = "agent_sandbox"
FACE = "agent_sandbox.server"
#: The seed's modules a template imports names from.
SUBMODULES = ("registry", "types", "router", "endpoints", "app", "policy")


def _is_face(name: str) -> bool:
    return name == FACE or (
        name.startswith(FACE + ".") and name[len(FACE) + 1 :] in SUBMODULES
    )


class FaceFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """
    Finds ``agent_sandbox.server`` (and its submodules) as the face, and
    ``agent_sandbox`` itself when ``stub_parent`` (nothing real to find).
    """

    def __init__(self, stub_parent: bool) -> None:
        self.stub_parent = stub_parent

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """The face's spec for the names it answers for, else None."""
        if _is_face(fullname):
            return importlib.util.spec_from_loader(
                fullname, self, is_package=fullname == FACE
            )
        if fullname == PARENT and self.stub_parent:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        """The default module object."""
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        """Fill a face module with the face's names."""
        if module.__name__ == PARENT:
            return
        from sandboxd._version import __version__
        from sandboxd.seedface import api

        for name in api.__all__:
            setattr(module, name, getattr(api, name))
        module.__all__ = list(api.__all__)  # type: ignore[attr-defined]
        module.__version__ = __version__  # type: ignore[attr-defined]


def _face_entries() -> dict[str, types.ModuleType]:
    return {k: v for k, v in sys.modules.items() if _is_face(k)}


@contextlib.contextmanager
def seed_face() -> Iterator[FaceFinder]:
    """
    While active, ``import agent_sandbox.server`` gets the face; on exit
    ``sys.modules`` and ``agent_sandbox.server`` are as they were.
    """
    saved = _face_entries()
    for name in saved:
        del sys.modules[name]
    parent_before = sys.modules.get(PARENT)
    stub = parent_before is None and importlib.util.find_spec(PARENT) is None
    server_before = getattr(parent_before, "server", None)
    finder = FaceFinder(stub)
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)
        for name in _face_entries():
            del sys.modules[name]
        sys.modules.update(saved)
        parent = sys.modules.get(PARENT)
        if stub and parent is not None:
            del sys.modules[PARENT]
        elif parent is not None:
            real = saved.get(FACE, server_before)
            if real is not None:
                parent.server = real  # type: ignore[attr-defined]
            elif hasattr(parent, "server"):
                del parent.server
