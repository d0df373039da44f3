# -*- test-case-name: tests.client.test_plan -*-
"""
How a call written once runs on both faces, with no daemon: the blocking
face steps it with no event loop, an op's error is raised inside the call
at its ``await`` (so the call's own handlers see it), and a cancelled
asyncio call still runs its clean-up ops.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import httpx
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.client._async import Async
from sandboxd.client._plan import Op
from sandboxd.client._sync import Blocking


async def _fetch(log: list[str]) -> str:
    """A call: ask for a value, fall back when the op fails, always clean up."""
    try:
        return str(await Op("value", ("x",)))
    except LookupError:
        log.append("handled")
        return "fallback"
    finally:
        await Op("cleanup", (log,))


async def _values(log: list[str]) -> AsyncGenerator[int, None]:
    try:
        for n in range(3):
            yield int(await Op("value", (n,)))
    finally:
        await Op("cleanup", (log,))


class _Ops:
    """The two ops the calls above await, on any face."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def value(self, key: Any) -> Any:
        if self.fail:
            raise LookupError(key)
        return key

    def cleanup(self, log: list[str]) -> None:
        log.append("cleaned")


class BlockingFaceTests(SynchronousTestCase):
    """The blocking face: no event loop, the call's own control flow."""

    def face(self, fail: bool = False) -> Blocking:
        face = Blocking(httpx.Client())
        self.addCleanup(face.client.close)
        ops = _Ops(fail)
        face.value = ops.value  # type: ignore[attr-defined]
        face.cleanup = ops.cleanup  # type: ignore[attr-defined]
        return face

    def test_result(self) -> None:
        """A call returns its value, after its clean-up ran."""
        log: list[str] = []
        self.assertEqual(self.face().run(_fetch(log)), "x")
        self.assertEqual(log, ["cleaned"])

    def test_error_inside_the_call(self) -> None:
        """An op's exception is raised at the call's await, where it is handled."""
        log: list[str] = []
        self.assertEqual(self.face(fail=True).run(_fetch(log)), "fallback")
        self.assertEqual(log, ["handled", "cleaned"])

    def test_stream_closed_early(self) -> None:
        """Leaving a stream early runs the stream's clean-up."""
        log: list[str] = []
        values = self.face().iterate(_values(log))
        self.assertEqual(next(values), 0)
        values.close()
        self.assertEqual(log, ["cleaned"])

    def test_foreign_await_refused(self) -> None:
        """A call that awaits something else than an op is a bug, said clearly."""

        async def wrong() -> None:
            await asyncio.sleep(0)

        with self.assertRaises(TypeError):
            self.face().run(wrong())


class AsyncFaceTests(SynchronousTestCase):
    """The asyncio face: ops awaited on the loop, cancellation cleans up."""

    def test_cancelled_call_cleans_up(self) -> None:
        """A call cancelled while an op waits still runs its clean-up op."""
        log: list[str] = []

        async def main() -> None:
            face = Async(httpx.AsyncClient())
            started = asyncio.Event()

            async def value(key: Any) -> Any:
                started.set()
                await asyncio.sleep(60)

            async def cleanup(log: list[str]) -> None:
                log.append("cleaned")

            face.value = value  # type: ignore[attr-defined]
            face.cleanup = cleanup  # type: ignore[attr-defined]
            task = asyncio.ensure_future(face.run(_fetch(log)))
            await asyncio.wait_for(started.wait(), 10)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            await face.client.aclose()

        asyncio.run(main())
        self.assertEqual(log, ["cleaned"])
