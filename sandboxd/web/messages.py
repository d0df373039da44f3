# -*- test-case-name: tests.test_commands -*-
"""
What handlers receive and return.

A handler takes a :class:`ServerRequest` and returns a
:class:`ServerResponse`, an :class:`SSEResponse`, a :class:`StreamResponse`,
a plain JSON-able value (sent as 200), or a Deferred or coroutine of one.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from sandboxd.errors import ApiError

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred
    from twisted.web.server import Request

    from sandboxd.access.auth import Identity
    from sandboxd.daemon.context import Context
    from sandboxd.endpoints import Endpoint
    from sandboxd.policy.rules import EffectiveRule
    from sandboxd.web.sse import SSEChannel


@attrs.define(eq=False)
class ServerRequest:
    """
    One request as a handler sees it: parsed, authenticated and admitted.

    :ivar query: query parameters (each name at most once: duplicates are
        refused before the handler runs).
    :ivar headers: request headers, lower-cased names, last value.
    :ivar body: the JSON object of a POST/DELETE (``{}`` when empty).
    :ivar path_params: values of the ``{param}`` segments, percent-decoded.
    :ivar identity: who is calling (``anonymous`` in local mode).
    :ivar rule: the endpoint's merged policy rule (limits, paths, params).
    :ivar context: the daemon's shared services (:class:`sandboxd.daemon.server.Context`).
    :ivar raw: the underlying twisted.web request, for routes that stream.
    """

    method: str
    path: str
    query: dict[str, str]
    headers: Mapping[str, str]
    body: dict[str, Any]
    path_params: dict[str, str]
    identity: Identity
    endpoint: Endpoint
    rule: EffectiveRule
    context: Context = attrs.field(default=None)
    raw: Request | None = None
    client: str = ""
    sink_result: Any = None
    #: Upload routes: ``content_base64`` already decoded as the body arrived
    #: (None when the body was parsed whole; read ``body`` then).
    payload: bytearray | None = None
    #: Fields the handler adds to this request's audit record (``argv``).
    audit: dict[str, Any] = attrs.Factory(dict)
    #: A door whose answer is bounded (MCP): what a command's output may
    #: keep, both streams together; None for the endpoint's own cap.
    output_bytes: int | None = None

    def arg(self, name: str, default: str | None = None) -> str | None:
        """A query parameter, or ``default``."""
        return self.query.get(name, default)


@attrs.define
class ServerResponse:
    """
    A JSON response (or raw bytes when ``raw`` is set).  With both, ``raw``
    is what is sent and ``body`` the value it encodes, for a door that
    answers with the value rather than the bytes (an MCP tool's result).
    """

    status: int = 200
    body: Any = None
    headers: dict[str, str] = attrs.Factory(dict)
    raw: bytes | None = None

    @classmethod
    def ok(cls, data: Any = None, status: int = 200) -> ServerResponse:
        """A success carrying ``data`` as JSON."""
        return cls(status=status, body=data if data is not None else {})

    @classmethod
    def error(
        cls, status: int, message: str, type: str = "ValueError", **extra: Any
    ) -> ServerResponse:
        """
        An error body of SPEC §3 (``error``, ``type`` and any extra fields;
        a ``code`` must be one of SPEC §6's).
        """
        error = ApiError(status, message, type, **extra)
        return cls(status=status, body=error.body(), headers=error.headers)


@attrs.define
class SSEEvent:
    """One Server-Sent Event."""

    event: str
    data: Any
    id: int | None = None


@attrs.define
class SSEResponse:
    """
    A ``text/event-stream`` response.

    Give either ``event_iterator`` (an iterable or async iterable of
    :class:`SSEEvent`, ``(event, data)`` pairs or ``{"event", "data"}``
    dicts) or ``start``, called with an
    :class:`~sandboxd.web.sse.SSEChannel` to push events; ``start`` may
    return a Deferred that fires when the stream is over.
    """

    event_iterator: Iterable[Any] | AsyncIterable[Any] | None = None
    start: Callable[[SSEChannel], Deferred[Any] | None] | None = None
    headers: dict[str, str] = attrs.Factory(dict)


@attrs.define
class StreamResponse:
    """
    A response whose body the handler writes itself (raw file bytes).

    ``write_to`` gets the twisted.web request after the status and headers
    are set, and returns a Deferred that fires once the body is written; the
    pipeline then finishes the request (unless the client went away).
    """

    write_to: Callable[[Request], Deferred[Any]]
    status: int = 200
    headers: Mapping[str, str] = attrs.Factory(dict)


@attrs.define
class UpgradeResponse:
    """
    The request becomes another protocol on its connection (a WebSocket):
    the pipeline audits it as 101 and frees its concurrency slot, then
    ``take_over`` gets the twisted.web request to hand its channel on
    (:meth:`~sandboxd.web.channel.SandboxChannel.take_over`).  Nothing is
    written for it; the new protocol answers the upgrade itself.
    """

    take_over: Callable[[Request], None]


class BodySink(Protocol):
    """Where a raw request body goes as it arrives (``body="raw"`` routes)."""

    def write(self, data: bytes) -> None:
        """Take the next chunk of the body."""

    def finish(self) -> Any:
        """The body is complete; the value is the handler's ``sink_result``."""

    def abort(self) -> None:
        """The request failed or the client left: undo everything."""
