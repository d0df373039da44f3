"""
:class:`AsyncSandbox`, the asyncio client: the calls of
:mod:`sandboxd.client._api` run by :class:`Async`, which awaits each op
on the running loop (httpx's ``AsyncClient``, websockets' asyncio client,
``asyncio.sleep``).  Every method is the coroutine twin of
:class:`~sandboxd.client.Sandbox`'s.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

import httpx
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from sandboxd.client._api import Client
from sandboxd.client._core import Settings, SSELines, open_client
from sandboxd.client._plan import (
    WS_OPTIONS,
    AsyncFace,
    Chunks,
    Opened,
    Outgoing,
    Steps,
    dress,
    signature_of,
)

T = TypeVar("T")


async def _chunks(body: Chunks) -> AsyncIterator[bytes]:
    """A disk-backed body, each read in a thread so a slow disk never stalls the loop."""
    while data := await asyncio.to_thread(body.read):
        yield data
        if body.sent is not None:
            body.sent(len(data))


async def _sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """An event stream's lines (:class:`~sandboxd.client._core.SSELines`)."""
    lines = SSELines()
    async for text in response.aiter_text():
        for line in lines.feed(text):
            yield line
    for line in lines.end():
        yield line


class Async(AsyncFace):
    """Runs the shared calls on the running loop, each op awaited."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        settings: Settings | None = None,
        owned: bool = True,
    ) -> None:
        self.client = client
        self.settings = settings
        #: Made by the sandbox (closed with it), not given by the caller.
        self.owned = owned

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Step the call, awaiting each op as it asks, until it returns."""
        steps = Steps(awaitable)
        while (op := steps.next()) is not None:
            try:
                steps.value = await getattr(self, op.name)(*op.args)
            except BaseException as e:  # cancellation too: the call cleans up
                steps.error = e
        return cast(T, steps.result)

    async def iterate(self, source: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
        """Each value of ``source``; closing this generator closes it."""
        try:
            while True:
                try:
                    value = await self.run(source.__anext__())
                except StopAsyncIteration:
                    return
                yield value
        finally:
            await self.run(source.aclose())

    def method(self, fn: Callable[..., Any], obj: object) -> Callable[..., Any]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self.run(fn(obj, *args, **kwargs))

        dress(call, fn, signature_of(fn))
        return call

    def stream(self, fn: Callable[..., Any], obj: object) -> Callable[..., Any]:
        def values(*args: Any, **kwargs: Any) -> Any:
            return self.iterate(fn(obj, *args, **kwargs))

        dress(values, fn, signature_of(fn))
        return values

    # -- the ops ------------------------------------------------------------

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def request(self, outgoing: Outgoing) -> httpx.Response:
        open_client(self.client)
        content = outgoing.content
        body = _chunks(content) if isinstance(content, Chunks) else content
        return await self.client.send(outgoing.build(self.client, body, self.settings))

    async def open_stream(self, outgoing: Outgoing) -> Opened:
        open_client(self.client)
        sent = outgoing.build(self.client, None, self.settings)
        return Opened(await self.client.send(sent, stream=True))

    async def read_all(self, opened: Opened) -> None:
        await opened.response.aread()

    async def line(self, opened: Opened) -> str | None:
        if opened.reader is None:
            opened.reader = _sse_lines(opened.response)
        return cast("str | None", await anext(opened.reader, None))

    async def chunk(self, opened: Opened) -> bytes | None:
        if opened.reader is None:
            opened.reader = opened.response.aiter_raw()
        return cast("bytes | None", await anext(opened.reader, None))

    async def close(self, opened: Opened) -> None:
        await opened.response.aclose()

    async def tell(self, callback: Callable[[Any], Any], value: Any) -> None:
        outcome = callback(value)
        if inspect.isawaitable(outcome):
            await outcome

    async def ws_open(self, url: str, headers: Any, timeout: float) -> ClientConnection:
        options = {"additional_headers": headers, "open_timeout": timeout}
        return await ws_connect(url, **options, **WS_OPTIONS)

    async def ws_recv(self, ws: ClientConnection, timeout: float | None) -> str | bytes:
        return await asyncio.wait_for(ws.recv(), timeout)

    async def ws_send(self, ws: ClientConnection, text: str) -> None:
        await ws.send(text)

    async def ws_close(self, ws: ClientConnection) -> None:
        await ws.close()


class AsyncSandbox(Client[Async, httpx.AsyncClient]):
    """
    An asyncio client of one sandboxd daemon: :class:`~sandboxd.client.Sandbox`'s
    arguments (``http_client`` an ``httpx.AsyncClient``), namespaces and
    methods, every call a coroutine::

        async with AsyncSandbox("http://127.0.0.1:9000", token="...") as sb:
            await sb.files.write_text("hello.txt", "hi")
            print((await sb.commands.run("cat hello.txt")).stdout)
    """

    def _connect(
        self, settings: Settings, http_client: httpx.AsyncClient | None
    ) -> Async:
        if http_client is not None:
            return Async(http_client, settings, owned=False)
        return Async(httpx.AsyncClient(**settings.client_options()), settings)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool (not that of a given ``http_client``)."""
        if self._face.owned:
            await self._face.client.aclose()
