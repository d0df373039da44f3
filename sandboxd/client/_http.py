"""
The HTTP rules both clients follow, written once over the ops of
:mod:`sandboxd.client._plan`: retries after a lost connection, waiting
out a 429, SSE streams resumed with ``Last-Event-ID``, raw downloads
resumed with ``Range``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, cast

import httpx

from sandboxd.client import _plan as io
from sandboxd.client._core import (
    HEARTBEAT_SECONDS,
    RETRYABLE,
    RUN_MARGIN,
    STREAM_READ_TIMEOUT,
    Req,
    Settings,
    SSEParser,
    backoff,
    decode,
    decode_result,
    error_from,
    rate_wait,
    stream_timeout,
    timeout_of,
    transport_error,
)
from sandboxd.client._plan import AsyncFace, BlockingFace, F, Part, on_face
from sandboxd.client._shared import RangeState
from sandboxd.client.errors import ConnectionFailed, RequestTimeout, SandboxError
from sandboxd.client.models import Progress, SSEEvent

#: Makes a request's raw body (called again for each retry).
Content = Callable[[], "bytes | io.Chunks"]


class _Cut(Exception):
    """A stream that ended before its final event: resumed as a lost connection."""


class Http:
    """One daemon's settings plus the retry, rate-limit and resume rules."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        #: Each endpoint's time limit for a child, from ``/capabilities``
        #: (None until read).
        self._run_limits: dict[str, float | None] | None = None

    async def run_limit(self, endpoint: str) -> float | None:
        """
        The daemon's time limit for a child run by ``endpoint`` (its policy's
        ``timeout_seconds``, or ``max_duration_seconds`` when lower), read
        from ``/capabilities`` once per client; None when the daemon names
        none or cannot be asked.
        """
        if self._run_limits is None:
            try:
                caps = await self.object(Req("GET", "/capabilities"))
            except SandboxError:
                caps = {}
            endpoints = caps.get("endpoints")
            self._run_limits = {
                name: _run_limit(info.get("limits"))
                for name, info in (
                    endpoints if isinstance(endpoints, dict) else {}
                ).items()
                if isinstance(info, dict)
            }
        return self._run_limits.get(endpoint)

    async def run_timeouts(self, endpoint: str, timeout: float | None) -> httpx.Timeout:
        """
        How long a call answered when its child ends waits for the answer:
        the child's limit (the call's ``timeout``, else the daemon's, see
        :meth:`run_limit`) plus :data:`RUN_MARGIN`, so that the daemon's
        own 408, with the output so far, comes first; with no limit known,
        as long as it takes.  Connecting still takes the client's
        ``timeout``.
        """
        limit = timeout if timeout is not None else await self.run_limit(endpoint)
        read = None if limit is None else limit + RUN_MARGIN
        return httpx.Timeout(self.settings.timeout, read=read)

    def wait_timeouts(self, seconds: float) -> httpx.Timeout:
        """Wait ``seconds`` for the answer; connecting takes the client's ``timeout``."""
        return httpx.Timeout(self.settings.timeout, read=seconds)

    async def send(self, req: Req, content: Content | None = None) -> httpx.Response:
        """
        Send one request and read the whole answer.

        :param content: makes the raw body (called again for a retry).
        :raises SandboxError: an error answer, or no answer.
        """
        s = self.settings
        what = f"{req.method} {req.path}"
        attempt = waits = 0
        while True:
            try:
                outgoing = io.Outgoing(
                    req.method,
                    req.path,
                    req.params,
                    req.json,
                    req.headers,
                    req.timeouts or timeout_of(req.timeout, s.timeout),
                    content() if content is not None else None,
                )
                response = await io.request(outgoing)
            except httpx.TimeoutException as e:
                raise transport_error(e, what) from None
            except RETRYABLE as e:
                # Nothing reached the daemon, or the call may be repeated.
                fresh = isinstance(e, httpx.ConnectError)
                if (fresh or req.retry_safe) and attempt < s.retries:
                    attempt += 1
                    await io.sleep(backoff(attempt))
                    continue
                raise transport_error(e, what) from None
            except httpx.HTTPError as e:
                raise transport_error(e, what) from None
            if response.status_code == 429:
                error = error_from(response)
                wait = rate_wait(s, response, error, waits)
                if wait is not None:
                    waits += 1
                    await io.sleep(wait)
                    continue
                raise error
            if response.status_code >= 400:
                raise error_from(response)
            return response

    async def call(self, req: Req) -> Any:
        """Send one JSON call; its decoded answer."""
        return decode(await self.send(req))

    async def object(self, req: Req) -> dict[str, Any]:
        """Send one JSON call whose answer is an object."""
        return cast(dict[str, Any], await self.call(req))

    async def result(self, req: Req) -> dict[str, Any]:
        """Send one call whose answer is a code execution's result document."""
        return cast(dict[str, Any], decode_result(await self.send(req)))

    async def stream(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        after: int | None = None,
        resumable: bool = True,
        read_timeout: float | None = STREAM_READ_TIMEOUT,
        announce: bool = False,
        final: str | None = None,
        deadline: float | None = None,
        control: StreamControl | None = None,
    ) -> AsyncGenerator[SSEEvent | None, None]:
        """
        An SSE stream's events; a resumable stream cut mid-way reconnects
        with ``Last-Event-ID`` (and ``after``) and carries on after the
        last event seen, so nothing is lost or repeated.  With
        ``announce``, None first, once the daemon accepted the stream.

        :param final: the event that ends the stream for good (a follow
            watch's ``end``): a stream that ends without it was cut (the
            daemon stopped or restarted) and is resumed as after a lost
            connection; :class:`ConnectionFailed` once the retries run out.
        :param deadline: a :func:`time.monotonic` time after which the
            caller stops waiting (:class:`RequestTimeout`), kept even while
            nothing but heartbeats arrive: no read waits past it (near it,
            the stream is opened again, resumed, with a read timeout of
            what is left, since a heartbeat every few seconds would
            otherwise keep a longer one from ever running out).
        :param control: where the stream's owner sees the answer being
            read, and says it closed the stream (the stream then ends
            quietly, whatever its read met).
        """
        s = self.settings
        control = control or StreamControl()
        last = after
        failures = 0
        what = f"{method} {path}"
        while not control.closed:
            ended = final is None
            answered = False
            read = read_timeout
            if deadline is not None:
                left = _left(deadline, what)
                read = left if read is None else min(read, left)
            headers = {"Accept": "text/event-stream"}
            query = dict(params or {})
            if resumable and last is not None:
                headers["Last-Event-ID"] = str(last)
                query["after"] = last
            try:
                opened = await io.open_stream(
                    io.Outgoing(
                        method,
                        path,
                        query,
                        json,
                        headers,
                        stream_timeout(s.timeout, read),
                    )
                )
                control.opened = opened
                again = False
                try:
                    if control.closed:
                        return
                    if opened.response.status_code >= 400:
                        await io.read_all(opened)
                        raise error_from(opened.response)
                    answered = True
                    if announce:
                        announce = False
                        yield None  # connected: the caller may go on
                    parser = SSEParser()
                    while (text := await io.line(opened)) is not None:
                        if control.closed:
                            return
                        if deadline is not None and text.startswith(":"):
                            # A heartbeat, between two events.
                            left = _left(deadline, what)
                            if left < HEARTBEAT_SECONDS and (
                                read is None or read > left
                            ):
                                again = True
                                break
                        event = parser.feed(text)
                        if event is None:
                            continue
                        failures = 0
                        if event.id is not None:
                            last = event.id
                        ended = ended or event.event == final
                        yield event
                finally:
                    await io.close(opened)
                if again:
                    continue
                if ended:
                    return
                cut: Exception = _Cut(
                    f"the stream ended without its {final!r} event "
                    "(the daemon stopped or restarted)"
                )
            except (*RETRYABLE, httpx.ReadTimeout) as e:
                if control.closed:
                    return  # the owner cut it
                cut = e
            except httpx.HTTPError as e:
                if control.closed:
                    return
                raise transport_error(e, what) from None
            if deadline is not None:
                _left(deadline, what)
            if not resumable or failures >= s.retries:
                error = transport_error(cut, what)
                if answered:
                    # The daemon was reached and began to answer: the
                    # answer is incomplete (a caller says so, not "cannot
                    # reach the daemon").
                    error.body["cut"] = True
                raise error from None
            failures += 1
            await io.sleep(backoff(failures))

    async def events(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        after: int | None = None,
        resumable: bool = True,
        deadline: float | None = None,
        final: str | None = None,
    ) -> AsyncGenerator[SSEEvent, None]:
        """An SSE stream's events (as :meth:`stream`, without the announcement)."""
        source = self.stream(
            method, path, params, json, after, resumable, final=final, deadline=deadline
        )
        try:
            async for event in source:
                if event is not None:
                    yield event
        finally:
            await source.aclose()

    async def chunks(
        self, method: str, path: str, json: Any = None
    ) -> AsyncGenerator[bytes, None]:
        """
        A stream's body as it arrives, undecoded and unsplit (a caller
        that reads big events splits them itself, at a fraction of the
        cost of text lines). Sent again only when it cannot have reached
        the daemon (no connection) or was refused for the rate (a 429
        waited out as :meth:`send` does); never resumed once it answered.

        :raises SandboxError: the daemon's refusal, or no answer.
        """
        s = self.settings
        what = f"{method} {path}"
        attempt = waits = 0
        while True:
            try:
                opened = await io.open_stream(
                    io.Outgoing(
                        method,
                        path,
                        None,
                        json,
                        {"Accept": "text/event-stream", "Accept-Encoding": "identity"},
                        stream_timeout(s.timeout, STREAM_READ_TIMEOUT),
                    )
                )
            except httpx.ConnectError as e:
                if attempt < s.retries:
                    attempt += 1
                    await io.sleep(backoff(attempt))
                    continue
                raise transport_error(e, what) from None
            except httpx.HTTPError as e:
                raise transport_error(e, what) from None
            try:
                response = opened.response
                if response.status_code >= 400:
                    await io.read_all(opened)
                    error = error_from(response)
                    wait = rate_wait(s, response, error, waits)
                    if wait is not None:
                        waits += 1
                        await io.sleep(wait)
                        continue
                    raise error
                while (data := await io.chunk(opened)) is not None:
                    yield data
                return
            except httpx.HTTPError as e:
                raise transport_error(e, what) from None
            finally:
                await io.close(opened)

    async def fetch_raw(
        self,
        path: str,
        sink: Callable[[bytes], None],
        state: RangeState,
        progress: Progress | None,
    ) -> None:
        """``GET /files/raw`` into ``sink``, resuming by ``Range`` after a cut."""
        s = self.settings
        failures = 0
        while True:
            try:
                opened = await io.open_stream(
                    io.Outgoing(
                        "GET",
                        "/files/raw",
                        {"path": path},
                        None,
                        state.request_headers(),
                        timeout_of(None, s.timeout),
                    )
                )
                try:
                    if not await self._accept(opened, state, progress):
                        return
                    while (data := await io.chunk(opened)) is not None:
                        sink(data)
                        state.offset += len(data)
                        failures = 0
                        if progress is not None:
                            progress(state.offset, state.total)
                finally:
                    await io.close(opened)
                state.check_complete()
                return
            except (*RETRYABLE, httpx.ReadTimeout, ConnectionFailed) as e:
                if failures >= s.retries:
                    raise state.failed(e) from None
                failures += 1
                await io.sleep(backoff(failures))
            except httpx.HTTPError as e:
                raise state.failed(e) from None

    async def _accept(
        self, opened: io.Opened, state: RangeState, progress: Progress | None
    ) -> bool:
        """A download's answer taken: False when nothing is left to read."""
        response = opened.response
        if response.status_code >= 400 and response.status_code != 416:
            await io.read_all(opened)
            raise error_from(response)
        if not state.accept(response.status_code, response.headers):
            return False
        if progress is not None:
            progress(state.offset, state.total)
        return True


class StreamControl:
    """
    What the owner of a stream (:class:`EventStream`) shares with the
    generator reading it: the answer being read, so that another thread or
    task can cut it under a blocked read, and whether the owner closed it.
    """

    def __init__(self) -> None:
        self.opened: io.Opened | None = None
        self.closed = False


def _run_limit(limits: Any) -> float | None:
    """The lower of ``timeout_seconds`` and ``max_duration_seconds`` in ``limits``."""
    if not isinstance(limits, dict):
        return None
    bounds = [
        float(v)
        for v in (limits.get("timeout_seconds"), limits.get("max_duration_seconds"))
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0
    ]
    return min(bounds) if bounds else None


def _left(deadline: float, what: str) -> float:
    """
    Seconds left before ``deadline``.

    :raises RequestTimeout: none.
    """
    left = deadline - time.monotonic()
    if left <= 0:
        raise RequestTimeout(f"{what}: still waiting at the deadline")
    return left


class EventStream(Part[F]):
    """
    An open SSE stream (``files.watch``, ``agents.events``): iterate for
    its events (``async for`` on the asyncio client); it resumes after a
    cut; ``close()`` (``aclose()``) ends it, from any thread (task) while
    another reads it, as does leaving its ``with`` or dropping it (a
    ``break`` out of its ``for``).
    """

    def __init__(
        self,
        face: F,
        source: AsyncGenerator[SSEEvent | None, None],
        control: StreamControl | None = None,
    ) -> None:
        self._face = face
        self._source = source
        self._control = control or StreamControl()
        #: A reader is inside the source (another thread or task may close).
        self._reading = False
        self._lock = threading.Lock()

    def _begin(self) -> bool:
        """A read starts: False when the stream was closed."""
        with self._lock:
            if self._control.closed:
                return False
            self._reading = True
            return True

    def _shut(self) -> bool:
        """
        Mark the stream closed; when a reader is inside the source (an
        async generator cannot be closed while it runs), cut the answer it
        is blocked on, so that its read ends and the source ends itself.
        Whether a reader was inside.
        """
        with self._lock:
            self._control.closed = True
            reading = self._reading
        if reading and self._control.opened is not None:
            io.abort(self._control.opened)
        return reading

    async def _connect(self) -> None:
        """Wait for the daemon to accept the stream (its refusal raised here)."""
        await self._source.__anext__()

    async def _next(self) -> SSEEvent:
        while True:
            event = await self._source.__anext__()
            if event is not None:
                return event

    def __iter__(self: EventStream[BlockingFace]) -> EventStream[BlockingFace]:
        on_face(self._face, BlockingFace)
        return self

    def __next__(self: EventStream[BlockingFace]) -> SSEEvent:
        if not self._begin():
            raise StopIteration
        try:
            return self._face.run(self._next())
        except StopAsyncIteration:
            raise StopIteration from None
        finally:
            self._reading = False

    def close(self: EventStream[BlockingFace]) -> None:
        """
        Stop reading (the connection is closed), from any thread: a thread
        blocked reading the stream sees its end.
        """
        if not isinstance(self._face, BlockingFace):
            raise TypeError("on an asyncio client's stream, use: await stream.aclose()")
        if not self._shut():
            self._face.run(self._source.aclose())

    def __del__(self) -> None:
        """
        A blocking stream dropped open (a ``break`` out of its ``for``, no
        ``with``): its source is closed here, by the face that ran it.
        Left to the garbage collector, the source's cleanup, which asks
        the face to close the response, is refused ("async generator
        ignored GeneratorExit", printed) and the response is left open.
        An asyncio stream is closed by the event loop's own hooks.
        """
        if isinstance(self._face, BlockingFace):
            try:
                # A source closed or run to its end already: nothing done.
                self._face.run(self._source.aclose())
            except Exception:
                # Nothing to tell a collector: the connection goes with the
                # client's pool.
                pass

    def __enter__(self: EventStream[BlockingFace]) -> EventStream[BlockingFace]:
        on_face(self._face, BlockingFace)
        return self

    def __exit__(self: EventStream[BlockingFace], *exc: object) -> None:
        self.close()

    def __aiter__(self: EventStream[AsyncFace]) -> EventStream[AsyncFace]:
        on_face(self._face, AsyncFace)
        return self

    async def __anext__(self: EventStream[AsyncFace]) -> SSEEvent:
        if not self._begin():
            raise StopAsyncIteration
        try:
            return await self._face.run(self._next())
        finally:
            self._reading = False

    async def aclose(self: EventStream[AsyncFace]) -> None:
        """
        Stop reading (the connection is closed), from any task: a task
        awaiting the stream's next event sees its end.
        """
        if not isinstance(self._face, AsyncFace):
            raise TypeError("on a blocking client's stream, use: stream.close()")
        if not self._shut():
            await self._face.run(self._source.aclose())

    async def __aenter__(self: EventStream[AsyncFace]) -> EventStream[AsyncFace]:
        on_face(self._face, AsyncFace)
        return self

    async def __aexit__(self: EventStream[AsyncFace], *exc: object) -> None:
        await self.aclose()
