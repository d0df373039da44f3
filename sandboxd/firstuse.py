# -*- test-case-name: tests.test_firstuse -*-
"""
A stand-in for an object whose module is imported on first use.

A door or group whose machinery is heavy registers ``FirstUse(build)`` where
the daemon looks for it (``context.doors[b"/mcp"] = FirstUse(lambda:
McpDoor(context))``, with ``from sandboxd.mcp import McpDoor`` inside the
lambda's function): nothing is imported at start, and the first attribute
read (the door's first request) builds the real object, once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class FirstUse:
    """Builds the real object on the first attribute read, then forwards."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build: Callable[[], Any] | None = build
        self._target: Any = None

    @property
    def built(self) -> bool:
        """Whether the real object exists yet."""
        return self._build is None

    def get(self) -> Any:
        """The real object, built now if it is not yet."""
        if self._build is not None:
            self._target = self._build()
            self._build = None
        return self._target

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.get(), name)
