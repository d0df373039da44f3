"""
Comparing the seed's typed SDK on a daemon and on the seed's own server,
method by method.

``Face(sync)`` lets one scenario drive either face of the SDK: its
async methods awaited in one event loop, or their ``*_sync`` twins, each
blocking on a worker thread.  ``outcome`` keeps what a call gave, result or
exception, and ``shape`` reduces it to what the two servers must agree on.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.seed.harness import SeedCase

#: Fields whose values depend on the clock or the machine, compared only
#: for being there (or both empty).
VOLATILE = frozenset({"modified", "accessed", "created", "execution_time_ms"})


class Face:
    """
    Calls an SDK method through its async face, or through its ``*_sync``
    twin on a worker thread (which runs its own event loop there).
    """

    def __init__(self, sync: bool) -> None:
        self.sync = sync

    async def __call__(
        self, method: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        if not self.sync:
            return await method(*args, **kwargs)
        twin = getattr(method.__self__, method.__name__ + "_sync")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None, functools.partial(twin, *args, **kwargs)
        )


async def outcome(call: Awaitable[Any]) -> Any:
    """What the call gave: its result, or the exception it raised."""
    try:
        return await call
    except Exception as e:
        # Kept without its traceback: the frames would keep the call's
        # HTTP client, and its connection, alive past the scenario.
        e.__traceback__ = e.__context__ = e.__cause__ = None
        return e


def shape(value: Any, base: str) -> Any:
    """
    What a seed user's code sees of ``value``, made comparable across
    servers: an exception is its class; a model its class and the fields
    the SDK declares (the base dir written ``BASE``, clock fields as
    present or not); lists element by element.
    """
    from pydantic import BaseModel

    if isinstance(value, BaseException):
        return ("raises", type(value).__name__)
    if isinstance(value, BaseModel):
        fields = {}
        for name in type(value).model_fields:
            item = getattr(value, name)
            fields[name] = bool(item) if name in VOLATILE else shape(item, base)
        return (type(value).__name__, fields)
    if isinstance(value, list | tuple):
        return [shape(v, base) for v in value]
    if isinstance(value, dict):
        return {k: shape(v, base) for k, v in value.items()}
    if isinstance(value, str):
        return value.replace(base, "BASE")
    if hasattr(value, "value") and hasattr(value, "name"):  # an enum
        return value.value
    return value


class CompareCase(SeedCase):
    """
    Runs one scenario against the daemon and the seed's server, through the
    async face and the sync face.
    """

    #: Arguments for the seed's server (a ``--policy`` file, say).
    reference_args: tuple[str, ...] = ()

    @inlineCallbacks
    def both(
        self,
        scenario: Callable[[Any, str, Face], Awaitable[dict[str, Any]]],
        sync: bool,
        prepare: Callable[[str], None] | None = None,
    ) -> Any:
        """
        ``(ours, seed, dirs)``: the scenario's outcomes on the daemon and
        on the seed's server, each run in a fresh directory of its server's
        base dir (``dirs``), prepared by ``prepare`` first.
        """
        reference = yield self.reference(*self.reference_args)
        face = Face(sync)
        dirs = []
        for base in (self.base_dir, reference.base_dir):
            work = os.path.join(base, "work-sync" if sync else "work-async")
            os.mkdir(work)
            if prepare is not None:
                yield self.call(prepare, work)
            dirs.append(work)
        ours = yield self.drive(lambda c: scenario(c, dirs[0], face))
        seed = yield self.drive(lambda c: scenario(c, dirs[1], face), reference=True)
        return ours, seed, tuple(dirs)

    def assertSameShapes(
        self,
        ours: dict[str, Any],
        seed: dict[str, Any],
        bases: tuple[str, str],
        only_class: frozenset[str] = frozenset(),
    ) -> None:
        """
        Method by method, the same typed result (or exception class); for
        the names in ``only_class``, the same class only.
        """
        self.assertEqual(sorted(ours), sorted(seed))
        for name in ours:
            a, b = shape(ours[name], bases[0]), shape(seed[name], bases[1])
            if name in only_class:
                a, b = type(ours[name]).__name__, type(seed[name]).__name__
            self.assertEqual(
                a, b, f"{name}: sandboxd {ours[name]!r}, seed {seed[name]!r}"
            )
