# -*- test-case-name: tests.client.test_parity -*-
"""
The blocking and the asyncio client show the same calls: the same public
methods, on the client, every namespace and every handle, with the same
signatures; each blocking call is a plain function, its asyncio twin a
coroutine function (a stream: a generator and an async generator).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.client import AsyncSandbox, Process, Sandbox, Terminal
from sandboxd.client._http import EventStream
from sandboxd.client._plan import api
from sandboxd.client.models import SSEEvent

NAMESPACES = (
    "files",
    "commands",
    "pty",
    "system",
    "env",
    "git",
    "code",
    "browser",
    "agents",
    "links",
    "preview",
    "lsp",
)

#: The protocol methods of a handle that only one face has by nature.
ONE_FACE = {"close", "aclose"}


def _public(obj: object) -> dict[str, Any]:
    """The public callables of ``obj``, by name."""
    out = {}
    for name in dir(obj):
        if name.startswith("_") or name in ONE_FACE:
            continue
        value = getattr(obj, name)
        if callable(value) and not isinstance(value, type):
            out[name] = value
    return out


async def _nothing() -> AsyncGenerator[SSEEvent | None, None]:
    if False:  # pragma: no cover
        yield None


class ParityTests(SynchronousTestCase):
    """Sandbox and AsyncSandbox, call by call."""

    def setUp(self) -> None:
        # No daemon: nothing here sends a request.
        self.sync = Sandbox("http://127.0.0.1:9")
        self.aio = AsyncSandbox("http://127.0.0.1:9")
        self.addCleanup(self.sync.close)
        self.addCleanup(lambda: asyncio.run(self.aio.close()))

    def pairs(self) -> Iterator[tuple[str, object, object]]:
        """The client, its namespaces and its handles, blocking and asyncio."""
        yield "sb", self.sync, self.aio
        for name in NAMESPACES:
            yield f"sb.{name}", getattr(self.sync, name), getattr(self.aio, name)
        info = {"pid": 1, "command": "true"}
        yield (
            "process",
            Process(self.sync._face, self.sync._http, info),
            Process(self.aio._face, self.aio._http, info),
        )
        yield (
            "terminal",
            Terminal(self.sync.pty, "s", "ws://127.0.0.1:9", None),
            Terminal(self.aio.pty, "s", "ws://127.0.0.1:9", None),
        )
        yield (
            "stream",
            EventStream(self.sync._face, _nothing()),
            EventStream(self.aio._face, _nothing()),
        )

    def test_same_methods(self) -> None:
        """Every object has the same public methods on both faces."""
        for where, sync, aio in self.pairs():
            self.assertEqual(sorted(_public(sync)), sorted(_public(aio)), where)

    def test_same_signatures(self) -> None:
        """Each method takes the same parameters and returns the same type."""
        for where, sync, aio in self.pairs():
            theirs = _public(aio)
            for name, method in _public(sync).items():
                one, other = inspect.signature(method), inspect.signature(theirs[name])
                if inspect.isgeneratorfunction(method) or "Generator[" in str(
                    one.return_annotation
                ):
                    other = other.replace(return_annotation=one.return_annotation)
                self.assertEqual(one, other, f"{where}.{name}")

    def test_blocking_and_coroutine(self) -> None:
        """
        A call is a plain function on the blocking client and a coroutine
        function on the asyncio one; a stream a function on both (of a
        generator, of an async generator); a helper the same function.
        """
        for where, sync, aio in self.pairs():
            theirs = _public(aio)
            for name, method in _public(sync).items():
                shared = inspect.getattr_static(type(sync), name)
                self.assertFalse(
                    inspect.iscoroutinefunction(method), f"{where}.{name} is async"
                )
                self.assertEqual(
                    inspect.iscoroutinefunction(theirs[name]),
                    isinstance(shared, api),
                    f"{where}.{name} on the asyncio client",
                )

    def test_stream_kinds(self) -> None:
        """A stream is a generator on one face and an async generator on the other."""
        sync = Process(self.sync._face, self.sync._http, {"pid": 1})
        aio = Process(self.aio._face, self.aio._http, {"pid": 1})
        events = sync.stream()
        self.assertTrue(inspect.isgenerator(events))
        events.close()
        self.assertTrue(inspect.isasyncgen(aio.stream()))

    def test_documented_on_both(self) -> None:
        """A method's docstring is the same on both faces (written once)."""
        for where, sync, aio in self.pairs():
            theirs = _public(aio)
            for name, method in _public(sync).items():
                self.assertEqual(
                    method.__doc__, theirs[name].__doc__, f"{where}.{name}"
                )

    def test_other_face_protocols_refused(self) -> None:
        """``with`` on an asyncio terminal, ``async for`` over a blocking stream: TypeError."""
        terminal = Terminal(self.aio.pty, "s", "ws://127.0.0.1:9", None)
        with self.assertRaises(TypeError) as caught:
            terminal.__enter__()  # type: ignore[misc]
        self.assertIn("async with", str(caught.exception))
        stream = EventStream(self.sync._face, _nothing())
        with self.assertRaises(TypeError) as caught:
            stream.__aiter__()  # type: ignore[misc]
        self.assertIn("with / for", str(caught.exception))
