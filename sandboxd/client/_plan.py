"""
How one source serves both clients.  Every call of the API is written
once, in :mod:`sandboxd.client._api`, as a coroutine that never touches a
socket, a clock or an event loop: it awaits :class:`Op` values naming the
I/O it needs.  A face runs it: the blocking face
(:class:`~sandboxd.client._sync.Blocking`) steps the coroutine with
``send``/``throw`` and performs each op blocking, with no event loop; the
asyncio face (:class:`~sandboxd.client._async.Async`) awaits each op on
the running loop.  So a change to a call is made once, and both faces
show the same methods with the same signatures.

The :class:`api` and :class:`api_stream` descriptors turn such a
coroutine (or async generator) into a method of each face: a plain one on
an object of the blocking face, a coroutine function on the asyncio one.
"""

from __future__ import annotations

import functools
import inspect
import re
import socket
import sys
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Mapping,
)
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    TypeVar,
    cast,
    overload,
)

import httpx

if TYPE_CHECKING:
    from sandboxd.client._core import Settings

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class Op:
    """
    One piece of I/O a call awaits: the face method ``name`` called with
    ``args``; the coroutine is resumed with its result (or its exception).
    """

    name: str
    args: tuple[Any, ...] = ()

    def __await__(self) -> Generator[Op, Any, Any]:
        return (yield self)


class Steps:
    """
    A coroutine (or any awaitable whose only awaits are :class:`Op`),
    stepped by hand: :meth:`next` gives the op to perform, None once it
    returned (:attr:`result`).  Set :attr:`value` or :attr:`error` to the
    op's outcome before the next step.
    """

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self._gen = awaitable.__await__()
        self.value: Any = None
        self.error: BaseException | None = None
        self.result: Any = None

    def next(self) -> Op | None:
        """The next op, after passing on the last one's outcome."""
        error, self.error = self.error, None
        value, self.value = self.value, None
        try:
            op = self._gen.send(value) if error is None else self._gen.throw(error)
        except StopIteration as stop:
            self.result = stop.value
            return None
        if not isinstance(op, Op):
            self._gen.close()
            raise TypeError(f"a client call awaited {op!r}, not an Op")
        return op


class Face:
    """
    What runs the calls: performs each :class:`Op` (a method per op name)
    and makes the methods of a face from the shared coroutines.
    """

    def method(self, fn: Callable[..., Any], obj: object) -> Callable[..., Any]:
        """``fn`` bound to ``obj``, as this face shows a call."""
        raise NotImplementedError

    def stream(self, fn: Callable[..., Any], obj: object) -> Callable[..., Any]:
        """``fn`` (an async generator) bound to ``obj``, as this face iterates."""
        raise NotImplementedError


class BlockingFace(Face):
    """A face whose calls block and return their result."""

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run one shared coroutine to its end."""
        raise NotImplementedError

    def iterate(self, source: AsyncGenerator[T, None]) -> Generator[T, None, None]:
        """A shared async generator as a plain generator."""
        raise NotImplementedError


class AsyncFace(Face):
    """A face whose calls are coroutines on the running loop."""

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Run one shared coroutine to its end, its ops awaited on the loop."""
        raise NotImplementedError

    def iterate(self, source: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
        """A shared async generator as one the loop can iterate."""
        raise NotImplementedError


#: The face an object's calls run on (covariant: a ``Part[Blocking]`` is a
#: ``Part[BlockingFace]``).
F = TypeVar("F", bound=Face, covariant=True)


def on_face(face: Face, kind: type[Face]) -> None:
    """
    Refuse a protocol of the other face (``with`` on an asyncio client's
    terminal, ``async for`` over a blocking client's stream): mypy says so
    too, this says it to code that is not type-checked.

    :raises TypeError: ``face`` is not a ``kind``.
    """
    if not isinstance(face, kind):
        right = "with / for" if kind is AsyncFace else "async with / async for"
        raise TypeError(f"use {right} on an object of this client")


class Part(Generic[F]):
    """Anything with calls: a namespace, a process or terminal handle."""

    _face: F


@functools.cache
def signature_of(
    fn: Callable[..., Any], returns: str | None = None
) -> inspect.Signature:
    """``fn``'s signature without ``self`` (and with another return annotation)."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())[1:]
    if returns is None:
        return sig.replace(parameters=params)
    return sig.replace(parameters=params, return_annotation=returns)


def dress(
    face_fn: Callable[..., Any], fn: Callable[..., Any], sig: inspect.Signature
) -> None:
    """Give a face's function the shared one's name, docstring and signature."""
    face_fn.__name__ = fn.__name__
    face_fn.__qualname__ = fn.__qualname__
    face_fn.__doc__ = fn.__doc__
    face_fn.__module__ = fn.__module__
    face_fn.__signature__ = sig  # type: ignore[attr-defined]


_ASYNC_GENERATOR = re.compile(r"^AsyncGenerator\[(.*), None\]$")


def blocking_returns(fn: Callable[..., Any]) -> str:
    """The blocking face's return annotation of an async generator ``fn``."""
    annotation = str(inspect.signature(fn).return_annotation)
    return _ASYNC_GENERATOR.sub(r"Generator[\1, None, None]", annotation)


class api(Generic[P, T]):
    """
    A call written once as a coroutine method; a method of both faces
    (``sb.files.stat(path)`` blocks, ``await asb.files.stat(path)``).
    Shared code calls another shared call through :attr:`fn`.
    """

    def __init__(
        self, fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]
    ) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> api[P, T]: ...

    @overload
    def __get__(self, obj: Part[BlockingFace], owner: type[Any]) -> Callable[P, T]: ...

    @overload
    def __get__(
        self, obj: Part[AsyncFace], owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, obj: Part[Any] | None, owner: type[Any]) -> Any:
        if obj is None:
            return self
        return obj._face.method(self.fn, obj)


class api_stream(Generic[P, T]):
    """
    A stream of values written once as an async generator method: a
    generator on the blocking face, an async generator on the asyncio one.
    """

    def __init__(
        self, fn: Callable[Concatenate[Any, P], AsyncGenerator[T, None]]
    ) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> api_stream[P, T]: ...

    @overload
    def __get__(
        self, obj: Part[BlockingFace], owner: type[Any]
    ) -> Callable[P, Generator[T, None, None]]: ...

    @overload
    def __get__(
        self, obj: Part[AsyncFace], owner: type[Any]
    ) -> Callable[P, AsyncGenerator[T, None]]: ...

    def __get__(self, obj: Part[Any] | None, owner: type[Any]) -> Any:
        if obj is None:
            return self
        return obj._face.stream(self.fn, obj)


# -- the ops: what a shared call may await ----------------------------------------


@dataclass
class Opened:
    """
    A streamed answer whose headers are in (``response``); its body is
    read by :func:`line` or :func:`chunk`, through the face's own reader.
    """

    response: httpx.Response
    reader: Any = None


@dataclass(frozen=True)
class Chunks:
    """
    A request body read from disk: ``read()`` gives the next chunk (b""
    at the end), ``sent(n)`` is told after each chunk went out.  The
    asyncio face reads in a worker thread so a slow disk never stalls the loop.
    """

    read: Callable[[], bytes]
    sent: Callable[[int], None] | None = None


def abort(opened: Opened) -> None:
    """
    Cut a streamed answer's connection under a read blocked on it in
    another thread or task (not an op: it never waits).  Its socket is
    shut down, which ends a blocked read at once; closing the response
    from another thread would not wake a read in progress.
    """
    network = opened.response.extensions.get("network_stream")
    sock = network.get_extra_info("socket") if network is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # closed already


async def sleep(seconds: float) -> None:
    """Wait ``seconds``."""
    await Op("sleep", (seconds,))


@dataclass(frozen=True)
class Outgoing:
    """One HTTP request, as both faces' httpx clients take it."""

    method: str
    path: str
    params: Mapping[str, Any] | None
    json: Any
    headers: Mapping[str, str]
    timeout: httpx.Timeout
    content: bytes | Chunks | None = None

    def build(
        self,
        client: httpx.Client | httpx.AsyncClient,
        body: Any,
        settings: Settings | None = None,
    ) -> httpx.Request:
        """
        The request for ``client``, with ``body`` (the face's reading of
        :attr:`content`).  With ``settings``, the daemon's URL and token go
        on the request itself, so a caller's own httpx client (made with no
        ``base_url`` or ``Authorization``, for its proxies, TLS or hooks)
        reaches the daemon as the given identity.
        """
        url = self.path
        headers = with_trace_context(self.headers)
        if settings is not None:
            url = settings.url + self.path
            headers = {**settings.headers(), **headers}
        return client.build_request(
            self.method,
            url,
            params=self.params,
            json=self.json,
            content=body,
            headers=headers,
            timeout=self.timeout,
        )


def with_trace_context(headers: Mapping[str, str]) -> Mapping[str, str]:
    """
    ``headers`` with the program's OpenTelemetry context in them
    (``traceparent``, ``tracestate``, ``baggage``: whatever its propagator
    writes) when the program uses OpenTelemetry, so that the daemon's span
    of the call joins the program's trace; ``headers`` as they are
    otherwise.  The client never imports OpenTelemetry itself: a program
    that has not loaded it pays nothing.
    """
    if "opentelemetry" not in sys.modules:
        return headers
    from opentelemetry.propagate import inject

    carrier = dict(headers)
    inject(carrier)
    return carrier


#: How both faces open a terminal's WebSocket (besides URL, headers and timeout).
WS_OPTIONS: dict[str, Any] = {
    "compression": None,
    "proxy": None,
    "max_size": None,
    "user_agent_header": "sandboxd-client",
}


async def request(outgoing: Outgoing) -> httpx.Response:
    """One HTTP request, its whole answer read (no retry here)."""
    return cast(httpx.Response, await Op("request", (outgoing,)))


async def open_stream(outgoing: Outgoing) -> Opened:
    """One HTTP request whose answer is read as it comes."""
    return cast(Opened, await Op("open_stream", (outgoing,)))


async def read_all(opened: Opened) -> None:
    """Read the rest of a streamed answer (an error's body)."""
    await Op("read_all", (opened,))


async def line(opened: Opened) -> str | None:
    """The next line of a streamed answer; None at its end."""
    return cast("str | None", await Op("line", (opened,)))


async def chunk(opened: Opened) -> bytes | None:
    """The next bytes of a streamed answer, as they came; None at its end."""
    return cast("bytes | None", await Op("chunk", (opened,)))


async def close(opened: Opened) -> None:
    """Let a streamed answer go (its connection closed or pooled)."""
    await Op("close", (opened,))


async def tell(callback: Callable[[Any], Any] | None, value: Any) -> None:
    """Pass ``value`` to a caller's callback (awaited on the asyncio face)."""
    if callback is not None:
        await Op("tell", (callback, value))


async def ws_open(url: str, headers: Mapping[str, str], timeout: float) -> Any:
    """
    A WebSocket connection (the face's own kind).

    :raises InvalidStatus: the handshake was refused.
    """
    return await Op("ws_open", (url, with_trace_context(headers), timeout))


async def ws_recv(ws: Any, timeout: float | None) -> str | bytes:
    """
    The next message.

    :raises TimeoutError: none within ``timeout`` seconds.
    :raises ConnectionClosed: the connection is closed.
    """
    return cast("str | bytes", await Op("ws_recv", (ws, timeout)))


async def ws_send(ws: Any, text: str) -> None:
    """Send a text message."""
    await Op("ws_send", (ws, text))


async def ws_close(ws: Any) -> None:
    """Close the connection."""
    await Op("ws_close", (ws,))
