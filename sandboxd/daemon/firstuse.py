# -*- test-case-name: tests.test_firstuse -*-
"""
A group's or door's service whose module is imported on first use.

A service whose machinery is heavy, or whose group is off unless a policy
turns it on, is put where the daemon looks for it as
``ServiceOnFirstUse(name, build)``, with the import inside ``build``:
nothing is imported at start, and the first attribute read (the group's or
door's first request) builds the real service, once, and starts it if the
daemon is running.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from twisted.application.service import Service

T = TypeVar("T", bound=Service)


class ServiceOnFirstUse(Service, Generic[T]):
    """
    Stands in for a service until its first use, then forwards to it.

    Stopping it stops the real service if it was ever built; a policy
    reload reaches only a service that exists.
    """

    def __init__(self, name: str, build: Callable[[], T]) -> None:
        self.name = name
        self._build: Callable[[], T] | None = build
        self._target: T | None = None

    @property
    def built(self) -> bool:
        """Whether the real service exists yet."""
        return self._build is None

    def get(self) -> T:
        """The real service, built (and started, if running) now if it is not yet."""
        if self._build is not None:
            build, self._build = self._build, None
            self._target = build()
            if self.running:
                self._target.startService()  # type: ignore[no-untyped-call]
        assert self._target is not None
        return self._target

    def existing(self) -> T | None:
        """The real service if it was built, without building it."""
        return self._target

    def startService(self) -> None:
        """Start the real service too, if it was built before the daemon started."""
        super().startService()  # type: ignore[no-untyped-call]
        if self._target is not None and not self._target.running:
            self._target.startService()  # type: ignore[no-untyped-call]

    def policy_reloaded(self) -> None:
        """A reload: only a service that exists has anything to update."""
        if self._target is not None and hasattr(self._target, "policy_reloaded"):
            self._target.policy_reloaded()

    def stopService(self) -> Any:
        """Stop the real service if it was ever built."""
        super().stopService()  # type: ignore[no-untyped-call]
        if self._target is not None:
            return self._target.stopService()  # type: ignore[no-untyped-call]
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.get(), name)
