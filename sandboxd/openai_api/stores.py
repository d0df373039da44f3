# -*- test-case-name: tests.openai_api.test_files -*-
"""
Where the ``/v1`` door keeps the files, vaults and templates its callers
store: one :class:`Stores` per door registry, made on first use.

Files are bytes on disk, under the daemon's state directory (they outlive
the daemon, with their owner); vaults and templates are held in memory
(a credential's secret is never written anywhere).
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from sandboxd.openai_api.blobs import FileStore
from sandboxd.openai_api.registry import door

if TYPE_CHECKING:
    from sandboxd.openai_api.registry import Registry
    from sandboxd.web.messages import ServerRequest

_STORES: weakref.WeakKeyDictionary[Registry, Stores] = weakref.WeakKeyDictionary()


def state_dir(context: Any) -> str:
    """
    The daemon's state directory (``--state-dir`` and the variables it
    falls back to are read once, when the daemon is built), else
    ``$XDG_STATE_HOME/sandboxd`` (``~/.local/state/sandboxd``): stored
    files need a disk even when nothing else is kept.
    """
    if context.state_dir:
        return str(context.state_dir)
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(xdg, "sandboxd")


class Stores:
    """The door's stored files, vaults and templates."""

    def __init__(self, root: str) -> None:
        self.files = FileStore(os.path.join(root, "openai", "files"))
        self.vaults: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.credentials: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.templates: OrderedDict[str, dict[str, Any]] = OrderedDict()


def stores(request: ServerRequest) -> Stores:
    """The stores of the door ``request`` came through."""
    reg = door(request)
    found = _STORES.get(reg)
    if found is None:
        found = _STORES[reg] = Stores(state_dir(request.context))
    return found


def owned(
    records: OrderedDict[str, dict[str, Any]], owner: str
) -> list[dict[str, Any]]:
    """The records of one owner, oldest first."""
    return [r for r in records.values() if r["owner"] == owner]
