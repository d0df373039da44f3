"""
:class:`Sandbox`, the blocking client: the calls of
:mod:`sandboxd.client._api` run by :class:`Blocking`, which performs each
op with httpx's ``Client``, websockets' sync client and ``time.sleep``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Iterator
from typing import Any, TypeVar, cast

import httpx
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from sandboxd.client._api import Client
from sandboxd.client._core import Settings, SSELines, open_client
from sandboxd.client._plan import (
    WS_OPTIONS,
    BlockingFace,
    Chunks,
    Opened,
    Outgoing,
    Steps,
    blocking_returns,
    dress,
    signature_of,
)

T = TypeVar("T")


def _chunks(body: Chunks) -> Iterator[bytes]:
    """A disk-backed body, read as it is sent."""
    while data := body.read():
        yield data
        if body.sent is not None:
            body.sent(len(data))


class Blocking(BlockingFace):
    """Runs the shared calls in the caller's thread, each op blocking."""

    def __init__(
        self, client: httpx.Client, settings: Settings | None = None, owned: bool = True
    ) -> None:
        self.client = client
        self.settings = settings
        #: Made by the sandbox (closed with it), not given by the caller.
        self.owned = owned

    def run(self, awaitable: Awaitable[T]) -> T:
        """Step the call, performing each op as it asks, until it returns."""
        steps = Steps(awaitable)
        while (op := steps.next()) is not None:
            try:
                steps.value = getattr(self, op.name)(*op.args)
            except BaseException as e:  # the call's own handlers decide
                steps.error = e
        return cast(T, steps.result)

    def iterate(self, source: AsyncGenerator[T, None]) -> Generator[T, None, None]:
        """Each value of ``source``; closing the generator closes it."""
        try:
            while True:
                try:
                    value = self.run(source.__anext__())
                except StopAsyncIteration:
                    return
                yield value
        finally:
            self.run(source.aclose())

    def method(self, fn: Callable[..., Any], obj: object) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.run(fn(obj, *args, **kwargs))

        dress(call, fn, signature_of(fn))
        return call

    def stream(self, fn: Callable[..., Any], obj: object) -> Callable[..., Any]:
        def values(*args: Any, **kwargs: Any) -> Any:
            return self.iterate(fn(obj, *args, **kwargs))

        dress(values, fn, signature_of(fn, blocking_returns(fn)))
        return values

    # -- the ops ------------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def request(self, outgoing: Outgoing) -> httpx.Response:
        open_client(self.client)
        content = outgoing.content
        body = _chunks(content) if isinstance(content, Chunks) else content
        return self.client.send(outgoing.build(self.client, body, self.settings))

    def open_stream(self, outgoing: Outgoing) -> Opened:
        open_client(self.client)
        sent = outgoing.build(self.client, None, self.settings)
        return Opened(self.client.send(sent, stream=True))

    def read_all(self, opened: Opened) -> None:
        opened.response.read()

    def line(self, opened: Opened) -> str | None:
        if opened.reader is None:
            opened.reader = _sse_lines(opened.response)
        return cast("str | None", next(opened.reader, None))

    def chunk(self, opened: Opened) -> bytes | None:
        if opened.reader is None:
            opened.reader = opened.response.iter_raw()
        return cast("bytes | None", next(opened.reader, None))

    def close(self, opened: Opened) -> None:
        opened.response.close()

    def tell(self, callback: Callable[[Any], Any], value: Any) -> None:
        callback(value)

    def ws_open(self, url: str, headers: Any, timeout: float) -> ClientConnection:
        options = {"additional_headers": headers, "open_timeout": timeout}
        # Entered as a context manager: the one form of connect() that no
        # websockets release from 13 on deprecates (a bare call warns from
        # 17.1, and is to return a reconnecting iterator later). Its exit
        # only closes the connection, which ws_close does.
        ws: ClientConnection = ws_connect(url, **options, **WS_OPTIONS).__enter__()
        return ws

    def ws_recv(self, ws: ClientConnection, timeout: float | None) -> str | bytes:
        return ws.recv(timeout=timeout)

    def ws_send(self, ws: ClientConnection, text: str) -> None:
        ws.send(text)

    def ws_close(self, ws: ClientConnection) -> None:
        ws.close()


def _sse_lines(response: httpx.Response) -> Iterator[str]:
    """An event stream's lines (:class:`~sandboxd.client._core.SSELines`)."""
    lines = SSELines()
    for text in response.iter_text():
        yield from lines.feed(text)
    yield from lines.end()


class Sandbox(Client[Blocking, httpx.Client]):
    """
    A blocking client of one sandboxd daemon.

    ::

        with Sandbox("http://127.0.0.1:9000", token="...") as sb:
            sb.files.write_text("hello.txt", "hi")
            print(sb.commands.run("cat hello.txt").stdout)

    :param url: the HTTP base URL (default ``SANDBOXD_URL``, else
        ``http://127.0.0.1:9000``).
    :param token: the access token (default ``SANDBOXD_TOKEN``).
    :param timeout: seconds for each call (connect, and each read).
    :param retries: retries of idempotent calls and resumable streams
        after a lost connection.
    :param wait_on_rate_limit: on a 429, wait ``retry_after`` and retry.
    :param pty_url: the PTY WebSocket base (``ws://host:9001``).
    :param http_client: an ``httpx.Client`` to use instead of a new one
        (its proxies, TLS settings, hooks): ``url``, ``token`` and
        ``timeout`` still decide where, as whom and how long; the caller
        closes it.
    """

    def _connect(
        self, settings: Settings, http_client: httpx.Client | None
    ) -> Blocking:
        if http_client is not None:
            return Blocking(http_client, settings, owned=False)
        return Blocking(httpx.Client(**settings.client_options()), settings)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool (not that of a given ``http_client``)."""
        if self._face.owned:
            self._face.client.close()
