"""
Which of the seed SDK's ``ENDPOINT_METHODS`` the seed tests drive, through
which face (async, ``*_sync``) and against which server (sandboxd, the
seed's own).

Run as a script: it records every call the SDK's methods receive while
trial runs the seed tests in this process, then prints one row per
method (the agents group left out) and the entries no test drives through
a face the SDK has::

    python -m tests.seed.sdkcoverage [TEST ...]    # default: tests.seed
"""

from __future__ import annotations

import collections
import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

#: Calls seen: (method, face, server) -> count.
SEEN: collections.Counter[tuple[str, str, str]] = collections.Counter()

#: The ports the seed's own servers listen on (the rest are sandboxd's).
REFERENCE_PORTS: set[int] = set()


def _server(api: Any) -> str:
    client = getattr(api, "_c", api)
    port = urlsplit(str(getattr(client, "_endpoint_url", ""))).port
    return "seed" if port in REFERENCE_PORTS else "sandboxd"


def _record(name: str, api: Any, face: str) -> None:
    SEEN[(name, face, _server(api))] += 1


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` recording each call as ``name``."""
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def agen(self: Any, *args: Any, **kwargs: Any) -> Any:
            _record(name, self, "async")
            async for item in fn(self, *args, **kwargs):
                yield item

        return agen
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def coro(self: Any, *args: Any, **kwargs: Any) -> Any:
            _record(name, self, "async")
            return await fn(self, *args, **kwargs)

        return coro

    @functools.wraps(fn)
    def plain(self: Any, *args: Any, **kwargs: Any) -> Any:
        _record(name, self, "async")
        return fn(self, *args, **kwargs)

    return plain


def _wrap_sync(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """
    A ``*_sync`` twin recording each call.  The SDK's twins (``make_sync``)
    hold the original async function, so the wrapped async method does not
    see their calls: each face is counted once.
    """

    @functools.wraps(fn)
    def twin(self: Any, *args: Any, **kwargs: Any) -> Any:
        _record(name, self, "sync")
        return fn(self, *args, **kwargs)

    return twin


def methods() -> dict[str, tuple[str, ...]]:
    """``ENDPOINT_METHODS`` without the agents group."""
    from agent_sandbox.api.server_client import ServerClient

    return {
        endpoint: names
        for endpoint, names in ServerClient.ENDPOINT_METHODS.items()
        if not endpoint.startswith("agents")
    }


def _owner(dotted: str) -> tuple[type, str]:
    """The class that defines the method ``dotted`` names, and its name."""
    from agent_sandbox.api.server_client import ServerClient

    parts = dotted.split(".")
    cls: type = ServerClient
    if len(parts) == 2:
        cls = type(getattr(ServerClient("http://127.0.0.1:1"), parts[0]))
    return cls, parts[-1]


def has_sync(dotted: str) -> bool:
    """Whether the SDK has a ``*_sync`` twin for the method."""
    cls, name = _owner(dotted)
    return hasattr(cls, name + "_sync")


def install() -> None:
    """Wrap every method of :func:`methods` and note the seed's servers' ports."""
    from tests.seed import harness

    for names in methods().values():
        for dotted in names:
            cls, name = _owner(dotted)
            setattr(cls, name, _wrap(dotted, getattr(cls, name)))
            if hasattr(cls, name + "_sync"):
                setattr(
                    cls,
                    name + "_sync",
                    _wrap_sync(dotted, getattr(cls, name + "_sync")),
                )
    original = harness.Reference.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        REFERENCE_PORTS.add(self.port)

    harness.Reference.__init__ = init  # type: ignore[method-assign]


def table() -> tuple[list[str], list[str]]:
    """The rows (markdown) and the gaps: a face the SDK has that no test drove."""
    rows = [
        "| endpoint | method | async (sandboxd/seed) | sync (sandboxd/seed) |",
        "|---|---|---|---|",
    ]
    gaps = []
    for endpoint, names in methods().items():
        for dotted in names:
            cells = []
            for face in ("async", "sync"):
                if face == "sync" and not has_sync(dotted):
                    cells.append("no twin")
                    continue
                ours = SEEN[(dotted, face, "sandboxd")]
                seed = SEEN[(dotted, face, "seed")]
                cells.append(f"{ours}/{seed}")
                if not ours:
                    gaps.append(f"{endpoint} {dotted} ({face})")
            rows.append(f"| {endpoint} | {dotted} | {cells[0]} | {cells[1]} |")
    return rows, gaps


def main(argv: list[str]) -> int:
    """Run trial on ``argv`` (default ``tests.seed``), then print the table."""
    from twisted.scripts import trial

    install()
    sys.argv = ["trial", *(argv or ["tests.seed"])]
    try:
        trial.run()
    except SystemExit:
        pass
    rows, gaps = table()
    print("\n".join(rows))
    print(f"{len(gaps)} faces not driven on sandboxd" + (": " if gaps else ""))
    for gap in gaps:
        print("   ", gap)
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
