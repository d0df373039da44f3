# -*- test-case-name: tests.test_commands -*-
"""
Step 7 of the pipeline: run the handler and turn what it returns into a
response.

Handlers may return a value, a Deferred or a coroutine; raise or return an
:class:`~sandboxd.errors.ApiError`; or answer with an SSE stream or a
streamed body.  A client that disconnects cancels a pending handler, as
Klein does, and nothing is ever written after that.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable, Mapping
from types import CoroutineType
from typing import Any, Protocol, cast

from twisted.internet.defer import (
    CancelledError,
    Deferred,
    ensureDeferred,
    maybeDeferred,
    succeed,
)
from twisted.internet.task import cooperate
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http import RESPONSES
from twisted.web.server import Request

from sandboxd.daemon.context import as_clock
from sandboxd.errors import ApiError, exhausted, unexpected
from sandboxd.turns import after_next_poll
from sandboxd.web.jsonbody import json_bytes
from sandboxd.web.messages import (
    ServerRequest,
    ServerResponse,
    SSEEvent,
    SSEResponse,
    StreamResponse,
    UpgradeResponse,
)
from sandboxd.web.sse import SSEChannel

log = Logger(namespace="sandboxd.dispatch")

_JSON = b"application/json"


class SandboxRequest(Protocol):
    """
    What rendering needs of the HTTP request (:class:`~sandboxd.web.request.
    SandboxRequest` provides it; this module does not import it, so the
    request calls into rendering and never the other way round).
    """

    _disconnected: bool
    finished: int
    audit_code: str | None
    audit_rule: str | None
    #: What the pipeline decided (either may be None), for the door's framing.
    admission: Any
    refusal: Any
    channel: Any
    responseHeaders: Any

    def setResponseCode(self, code: int) -> None: ...
    def setHeader(self, name: bytes | str, value: bytes | str) -> None: ...
    def write(self, data: bytes) -> None: ...
    def finish(self) -> None: ...
    def notifyFinish(self) -> Deferred[None]: ...
    def respond_error(self, error: ApiError) -> None: ...
    def upgraded(self) -> None: ...


def _twisted(raw: SandboxRequest) -> Request:
    """The request as the Twisted ``Request`` it is (for writers that take one)."""
    return cast(Request, raw)


#: Reason phrases of statuses the daemon answers with that Twisted's
#: table lacks (RFC 9110, RFC 6585). Twisted writes a status line from that
#: table (``Request.setResponseCode``), and so do the daemon's own writers
#: (:func:`reason_phrase`): added to it once, at import, so that every
#: status line says what its code means rather than "Unknown Status"; a
#: phrase a later Twisted has is left as it is.
MISSING_REASONS = {
    421: b"Misdirected Request",
    422: b"Unprocessable Content",
    428: b"Precondition Required",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
}
for _status, _phrase in MISSING_REASONS.items():
    RESPONSES.setdefault(_status, _phrase)


def reason_phrase(status: int) -> str:
    """The reason phrase of an HTTP status (``Error`` for unknown ones)."""
    return RESPONSES.get(status, b"Error").decode("latin-1")


def respond_json(
    raw: SandboxRequest, status: int, body: Any, headers: dict[str, str] | None = None
) -> None:
    """Send a complete JSON response (no-op once the client has gone)."""
    if raw._disconnected or raw.finished:
        return
    try:
        data = json_bytes(body)
    except ApiError as error:
        # Nothing of the answer has gone: the error is answered instead.
        log.error("an answer is not JSON: {message}", message=error.message)
        raw.respond_error(error)
        return
    raw.setResponseCode(status)
    # Stored as Twisted's Headers would store them, without its per-value
    # checks: both values are ours.
    fields = raw.responseHeaders._rawHeaders
    fields[b"Content-Type"] = [_JSON]
    fields[b"Content-Length"] = [b"%d" % len(data)]
    if headers:
        set_headers(raw, headers)
    raw.write(data)
    raw.finish()


#: Header fields handlers commonly answer with, under the names Twisted's
#: ``Headers`` stores them by: set without its per-value encoding and
#: checks, which these constants passed once, here.
_CONSTANT_FIELDS: dict[tuple[str, str], tuple[bytes, list[bytes]]] = {
    (name, value): (canonical, [value.encode("latin-1")])
    for canonical, value in (
        (b"Content-Type", "application/json"),
        (b"Content-Type", "application/octet-stream"),
        (b"Cache-Control", "no-store"),
    )
    for name in (canonical.decode("latin-1"), canonical.decode("latin-1").lower())
}


def set_headers(raw: SandboxRequest, headers: Mapping[str, str]) -> None:
    """
    Set a handler's response headers: a known constant directly, any
    other through Twisted's ``setHeader`` and its checks.
    """
    fields = raw.responseHeaders._rawHeaders
    for name, value in headers.items():
        known = _CONSTANT_FIELDS.get((name, value))
        if known is not None:
            fields[known[0]] = known[1][:]
        else:
            raw.setHeader(name, value)


def error_framing(
    endpoint: Any, path: str, error: ApiError
) -> tuple[Any, dict[str, str]]:
    """
    The body and headers an error is answered with: SPEC §3's error body,
    or OpenAI's envelope on the ``/v1`` door's routes (and on an unknown
    path under ``/v1/``, whose client is an OpenAI SDK).
    """
    door = getattr(endpoint, "door", None) if endpoint is not None else None
    if door == "openai" or (endpoint is None and path.startswith("/v1/")):
        from sandboxd.openai_api.envelope import openai_error

        return openai_error(error)
    return error.body(), error.headers


def respond_error(raw: SandboxRequest, error: ApiError) -> None:
    """Send an :class:`ApiError` in its door's framing, noting it for audit."""
    raw.audit_code = error.code
    raw.audit_rule = error.rule
    known = raw.admission or raw.refusal
    body, headers = error_framing(
        known.endpoint if known is not None else None,
        known.path if known is not None else "",
        error,
    )
    respond_json(raw, error.status, body, headers)


def dispatch(raw: SandboxRequest, request: ServerRequest) -> None:
    """Run ``request``'s handler and respond on ``raw``."""
    handler = request.endpoint.handler
    assert handler is not None
    try:
        result = handler(request)
    except Exception:
        render_failure(raw, request, Failure())
        return
    if not isinstance(result, (Deferred, CoroutineType)):
        # The common case: a plain value answered without any Deferred.
        try:
            render(raw, request, result)
        except Exception:
            render_failure(raw, request, Failure())
        return
    d = ensureDeferred(result) if isinstance(result, CoroutineType) else result
    if not d.called:
        # A client that left: the handler is cancelled once the reactor has
        # read what else is ready (sandboxd.turns); its 499 is audited now.
        clock = request.context.reactor
        raw.notifyFinish().addErrback(lambda _: after_next_poll(clock, d.cancel))
    d.addCallback(lambda result: render(raw, request, result))
    d.addErrback(lambda failure: render_failure(raw, request, failure))


def render(raw: SandboxRequest, request: ServerRequest, result: Any) -> Any:
    """Write a handler's result as the response."""
    if raw._disconnected or raw.finished:
        return None
    if isinstance(result, ApiError):
        raw.respond_error(result)
    elif isinstance(result, ServerResponse):
        if result.raw is not None:
            _respond_raw(raw, result)
        else:
            if result.status >= 400 and isinstance(result.body, dict):
                raw.audit_code = result.body.get("code")
                raw.audit_rule = result.body.get("rule")
            respond_json(raw, result.status, result.body, result.headers)
    elif isinstance(result, SSEResponse):
        return _stream_events(raw, request, result)
    elif isinstance(result, StreamResponse):
        return _stream_body(raw, result)
    elif isinstance(result, UpgradeResponse):
        raw.upgraded()
        result.take_over(_twisted(raw))
    else:
        respond_json(raw, 200, result if result is not None else {})
    return None


def render_failure(
    raw: SandboxRequest, request: ServerRequest, failure: Failure
) -> None:
    """Turn a handler's exception into a JSON error (never a traceback)."""
    if failure.check(CancelledError) and (raw._disconnected or raw.finished):
        return
    if raw._disconnected or raw.finished:
        if not failure.check(CancelledError):
            log.failure("handler failed after the response", failure)
        return
    error = failure.value
    if isinstance(error, ApiError):
        raw.respond_error(error)
        return
    refused = exhausted(error)
    if refused is not None:
        raw.respond_error(refused)
        return
    log.failure("handler {endpoint} failed", failure, endpoint=request.endpoint.id)
    raw.respond_error(unexpected(error))


def _respond_raw(raw: SandboxRequest, result: ServerResponse) -> None:
    raw.setResponseCode(result.status)
    set_headers(raw, result.headers)
    assert result.raw is not None
    raw.responseHeaders._rawHeaders[b"Content-Length"] = [b"%d" % len(result.raw)]
    raw.write(result.raw)
    raw.finish()


def _stream_body(raw: SandboxRequest, result: StreamResponse) -> Deferred[Any]:
    raw.setResponseCode(result.status)
    set_headers(raw, result.headers)
    if _twisted(raw).method == b"HEAD":
        # The headers (size, ETag) without the body: the producer is
        # stopped at once, before it reads or sendfile()s a byte.
        result.write_to(_NoBody())  # type: ignore[arg-type]
        raw.write(b"")
        raw.finish()
        return succeed(None)
    d = result.write_to(_twisted(raw))

    def done(_: Any) -> None:
        if raw._disconnected or raw.finished:
            return
        transport = raw.channel.transport
        if transport is not None and getattr(transport, "disconnected", False):
            # The client left mid-body: the transport stopped the producer
            # on its way to connectionLost, which has not reached the
            # request yet.  Finishing now would find the producer still
            # registered (Twisted logs that as an error); the request is
            # audited as client_closed instead.
            return
        raw.finish()

    def failed(failure: Failure) -> None:
        if not raw._disconnected and not raw.finished:
            if not failure.check(OSError):
                # (An OSError, such as a file that shrank, is the file's
                # doing and its producer has said so.)
                log.failure("streamed body failed", failure)
            transport: Any = raw.channel.transport
            transport.abortConnection()

    return d.addCallbacks(done, failed)


class _NoBody:
    """A consumer for a HEAD request's streamed body: stops its producer at once."""

    sentLength = 0
    chunked = False

    def write(self, data: bytes) -> None:
        """Drop it."""

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        """Stop the producer (it closes its file)."""
        producer.stopProducing()

    def unregisterProducer(self) -> None:
        """Nothing is registered."""


def _as_frame(channel: SSEChannel, item: Any) -> None:
    if isinstance(item, bytes | str):
        channel.write_raw(item.encode() if isinstance(item, str) else item)
    elif isinstance(item, SSEEvent):
        channel.send(item.event, item.data, item.id)
    elif isinstance(item, tuple):
        channel.send(item[0], item[1])
    elif isinstance(item, dict):
        channel.send(
            str(item.get("event", "message")), item.get("data"), item.get("id")
        )
    else:
        channel.send("message", item)


def _stream_events(
    raw: SandboxRequest, request: ServerRequest, result: SSEResponse
) -> Any:
    """Serve an SSE response; the concurrency slot is held until it ends."""
    if _twisted(raw).method == b"HEAD":
        # What a GET would get, without starting the stream.
        raw.setResponseCode(200)
        raw.setHeader(b"content-type", b"text/event-stream")
        raw.setHeader(b"cache-control", b"no-cache")
        set_headers(raw, result.headers)
        raw.write(b"")
        raw.finish()
        return None
    channel = SSEChannel(
        _twisted(raw),
        as_clock(request.context.reactor),
        headers=result.headers,
        streams=request.context.streams,
    )
    if getattr(request.endpoint, "door", None) == "openai":
        from sandboxd.openai_api.envelope import stream_error_frame

        channel.error_frame = stream_error_frame
    if result.start is not None:
        started = maybeDeferred(result.start, channel)
        started.addErrback(lambda f: _stream_failed(channel, f))
        return channel.done
    d = pump_events(channel, result.event_iterator)
    d.addCallbacks(lambda _: channel.close(), lambda f: _stream_failed(channel, f))
    return channel.done


def pump_events(channel: Any, source: Any) -> Deferred[None]:
    """
    Feed ``channel`` (an SSE channel, or MCP's collecting one) from a
    handler's ``event_iterator``, an iterable or async iterable, one item
    per reactor turn; it stops when the channel's client leaves, and an
    async generator left at a ``yield`` is closed, so its ``finally`` runs.
    The Deferred fires when the source is spent (it does not close the
    channel), or fails with what the source raised.
    """
    if isinstance(source, AsyncIterable):

        async def pump() -> None:
            try:
                async for item in source:
                    if not channel.open:
                        break
                    _as_frame(channel, item)
            finally:
                # An async generator left at a ``yield`` (the client went
                # between items) runs its ``finally`` only when closed.
                close = getattr(source, "aclose", None)
                if close is not None:
                    await close()

        d = ensureDeferred(pump())
        channel.on_disconnect(d.cancel)
        return d
    assert isinstance(source, Iterable)

    def steps() -> Any:
        for item in source:
            if not channel.open:
                return
            _as_frame(channel, item)
            yield None

    task = cooperate(steps())
    channel.on_disconnect(task.stop)
    return task.whenDone().addCallback(lambda _: None)


def _stream_failed(channel: SSEChannel, failure: Failure) -> None:
    if failure.check(CancelledError) or not channel.open:
        return
    log.failure("event stream failed", failure)
    channel.end_with(unexpected(failure.value))
