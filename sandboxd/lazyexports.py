"""
A package face whose names are imported on first use (PEP 562).

``sandboxd`` and ``sandboxd.processes`` re-export names from their
modules without importing them: a command that drives a daemon, or a
module that needs one submodule, must not pay for all of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """
    The ``__getattr__`` and ``__dir__`` of ``package``, whose ``exports``
    map each name to the module defining it; a name read once is kept in
    the package's ``namespace``.
    """

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted([*namespace, *exports])

    return getattr_, dir_
