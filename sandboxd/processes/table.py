# -*- test-case-name: tests.processes.test_children -*-
"""
The children of one daemon, for its shutdown to end.

The table exists from the start (the :class:`~sandboxd.daemon.context.Context`
holds it); the children's machinery (:mod:`sandboxd.processes.child`,
spawning, tree kills) is imported when the first child starts.
"""

from __future__ import annotations

from typing import Any


class ChildTable:
    """
    The children of one daemon (one per
    :class:`~sandboxd.daemon.context.Context`, so two daemons in one process never
    end each other's).

    :ivar live: spawned and not yet ended.
    :ivar pending: their spawn is on a worker thread (no process yet).
    :ivar scope: what the daemon serves, in its children's markers
        (:func:`~sandboxd.processes.tree.marker_scope`; set at its start).

    Both hold :class:`~sandboxd.processes.child.Child` objects, typed
    loosely: that module imports this one.
    """

    def __init__(self) -> None:
        self.live: set[Any] = set()
        self.pending: set[Any] = set()
        self.scope = ""
