# -*- test-case-name: tests.openai_api.test_files -*-
"""
Where the ``/v1`` door keeps the files, vaults and templates its callers
store: one :class:`Stores` per door registry, made on first use.

Files are bytes on disk, under the daemon's state directory (they outlive
the daemon, with their owner).  Vaults, credentials and templates are the
registry's records: with a state dir they are written whole to one 0600
file (:mod:`.store`), a credential's secret with them, and read back at
the next start; nothing else ever holds a secret (no answer, no log line).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sandboxd.errors import bad_request
from sandboxd.openai_api.blobs import FileStore
from sandboxd.openai_api.registry import door

if TYPE_CHECKING:
    from sandboxd.openai_api.registry import Registry
    from sandboxd.web.messages import ServerRequest


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
    """The door's stored files, and its registry's vaults and templates."""

    def __init__(self, root: str, reg: Registry) -> None:
        self.files = FileStore(os.path.join(root, "openai", "files"))
        self.vaults = reg.vaults
        self.credentials = reg.credentials
        self.templates = reg.templates


def stores(request: ServerRequest) -> Stores:
    """The stores of the door ``request`` came through."""
    reg = door(request)
    found = reg.stores
    if found is None:
        found = reg.stores = Stores(state_dir(request.context), reg)
    assert isinstance(found, Stores)
    return found


def owned(records: Mapping[str, dict[str, Any]], owner: str) -> list[dict[str, Any]]:
    """The records of one owner, oldest first."""
    return [r for r in records.values() if r["owner"] == owner]


def room_for_one(held: int, most: int, what: str, **extra: Any) -> None:
    """
    Refuse a new record to an identity that holds ``held`` of at most
    ``most`` (``what``: the records' name, plural), as the seed bounds
    each identity's files, vaults, templates and definitions.

    :raises ApiError: 400 ``invalid_param`` (``extra`` in its body).
    """
    if held >= most:
        raise bad_request(
            f"at most {most} {what} per identity; delete one first", **extra
        )
