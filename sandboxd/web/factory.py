# -*- test-case-name: tests.web.test_request -*-
"""The HTTP factory: a ``Site`` whose requests run the sandboxd pipeline."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall
from twisted.web.resource import Resource
from twisted.web.server import Site

from sandboxd.daemon.context import Context
from sandboxd.errors import ApiError
from sandboxd.web.channel import SandboxChannel
from sandboxd.web.connections import ConnectionLimits, ConnectionTable
from sandboxd.web.delivery import descriptor
from sandboxd.web.request import SandboxRequest


def json_error(body: Any) -> bytes:
    """An error body as compact JSON, any text escaped to ASCII."""
    return json.dumps(body, separators=(",", ":")).encode()


class HardenedSite(Site):
    """
    A site over the hardened connection
    (:class:`~sandboxd.web.channel.SandboxChannel`): its connections are
    counted and capped, and request heads that never complete are cut, by
    one :class:`~sandboxd.web.connections.ConnectionTable` per site.  Every
    HTTP door (the API port, the E2B port) is one, so a flood on one port
    cannot fill another's table.

    ``log`` is a no-op: the combined access log costs a large share of
    small-request throughput (docs/performance.md), and the audit trail
    (SPEC §11.5) records what matters. The port's log lines name the door
    (``http starting on 9000``), and the factory's start and stop are not
    logged (the startup line says what listens).

    :ivar door: the name metrics count refused connections under.
    """

    protocol = SandboxChannel  # type: ignore[assignment]
    displayTracebacks = False
    noisy = False
    door = "http"
    #: Whether a request during which no byte moves either way for a whole
    #: idle period is cut (the preview door's ``idle_timeout_seconds``);
    #: on the API's doors a quiet request is a command still running.
    silence_ends_requests = False

    def logPrefix(self) -> str:
        """What the port's log lines call this site: its door."""
        return self.door

    def __init__(
        self,
        resource: Resource,
        context: Context,
        reactor: Any = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        # Form bodies never become request arguments (SPEC §3 step 5), and
        # parsing their Content-Type costs time on every POST
        # (docs/performance.md).
        limits = limits or ConnectionLimits()
        super().__init__(
            resource,
            timeout=limits.idle_timeout,
            reactor=reactor,
            parsePOSTFormSubmission=False,
        )
        self.context = context
        # The clock is asked when a connection comes, not now: a reactor
        # that is never run (a MemoryReactor building a daemon) has none.
        self.table = ConnectionTable(limits, lambda: float(self.reactor.seconds()))
        self._sweeper = LoopingCall(self.enforce_header_deadline)
        self._sweeper.clock = self.reactor

    @property
    def connections(self) -> set[Any]:
        """The open connections."""
        return self.table.open

    @property
    def per_peer(self) -> dict[str, int]:
        """Open connections per client address."""
        return self.table.per_peer

    def startFactory(self) -> None:
        """Start watching for request heads that never complete."""
        super().startFactory()
        # The reactor runs from now: the table reads its clock directly
        # (twice per request) rather than through the lambda above.
        seconds = getattr(self.reactor, "seconds", None)
        if seconds is not None:
            self.table.use_clock(seconds)
        if not self._sweeper.running:
            # The sweep costs only the overdue heads, so it can run often
            # enough that a head is cut within a second of its deadline.
            period = min(1.0, self.table.limits.head_deadline / 4)
            self._sweeper.start(period, now=False)
        # Counted by door in ``sandboxd_connections_active`` while it listens.
        self.context.metrics.sites.add(self)

    def stopFactory(self) -> None:
        """
        Stop the watch; cut the connections that only wait to read what
        a refused client still sends (their answers are out).
        """
        if self._sweeper.running:
            self._sweeper.stop()
        self.context.metrics.sites.discard(self)
        for channel in list(self.connections):
            if getattr(channel, "lingering", False):
                channel.cut_lingering()
        super().stopFactory()

    def connection_opened(self, channel: SandboxChannel) -> bool:
        """Admit a new connection (False: over a cap, close it)."""
        admitted = self.table.admit(channel)
        if not admitted:
            self.context.metrics.connection_refused(self.door)
        return admitted

    def connection_closed(self, channel: SandboxChannel) -> None:
        """Forget a connection."""
        self.table.forget(channel)

    def enforce_header_deadline(self) -> None:
        """
        Close connections whose request heads are overdue (slowloris), and
        refuse requests whose bodies come too slowly.
        """
        self.table.cut_overdue()
        if self.table.bodies:
            self.table.cut_slow_bodies(self._reading())

    def _reading(self) -> Callable[[Any], bool]:
        """
        Whether a connection is read from now: its descriptor is among the
        reactor's readers (a socket the daemon paused is not the client's
        slowness).  Asked once per sweep, and only while bodies come.
        """
        get_readers = getattr(self.reactor, "getReaders", None)
        if get_readers is None:
            return lambda channel: True
        readers = set(get_readers())

        def reading(channel: Any) -> bool:
            fd_object = descriptor(channel.transport)
            return fd_object is None or fd_object in readers

        return reading

    def close_all(self, within: float = 2.0) -> Deferred[None]:
        """
        Abort every open connection; fires once they are gone (bounded).

        A connection already closing in order (its last bytes, such as a
        WebSocket's close frame, queued before a FIN) is left ``within``
        seconds to finish: an abort resets it, and a reset throws away
        what the peer has not read yet.  It is aborted at the deadline.
        """
        for channel in list(self.connections):
            transport: Any = channel.transport
            if transport is not None and not transport.disconnecting:
                transport.abortConnection()
        done: Deferred[None] = Deferred()
        clock = self.reactor
        deadline = clock.seconds() + within

        def check() -> None:
            if not self.connections:
                done.callback(None)
            elif clock.seconds() >= deadline:
                for channel in list(self.connections):
                    if channel.transport is not None:
                        channel.transport.abortConnection()
                done.callback(None)
            else:
                clock.callLater(0.01, check)

        check()
        return done

    def log(self, request: Any) -> None:
        """Skip the access log (see the class docstring)."""

    def refusal(
        self, error: ApiError, path: str, accept: bytes | None
    ) -> tuple[bytes, bytes, dict[str, str]]:
        """
        How this door answers a request its HTTP front refused before
        routing (a head or a chunked body the parser cannot read): the
        Content-Type, body and extra headers of ``error``.  SPEC §3's JSON
        error here; a door whose clients read another framing says so.

        :param path: the request line's path, or ``""`` when none was read.
        :param accept: the request's ``Accept``, when it could be read.
        """
        return b"application/json", json_error(error.body()), dict(error.headers)


class SandboxSite(HardenedSite):
    """The site serving the route tree of one :class:`Context`."""

    requestFactory = SandboxRequest

    def __init__(
        self,
        context: Context,
        reactor: Any = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        # The pipeline routes (sandboxd.web.routing) before any body is
        # read; twisted.web's resource traversal is never reached.
        super().__init__(Resource(), context, reactor, limits)

    def refusal(
        self, error: ApiError, path: str, accept: bytes | None
    ) -> tuple[bytes, bytes, dict[str, str]]:
        """
        SPEC §3's JSON error; OpenAI's envelope when the path is under
        ``/v1/`` (an OpenAI SDK reads ``error.code``); a JSON-RPC error
        with ``id`` null on the MCP door's path (an MCP client reads that
        at any status as its request's error: no id was read).
        """
        from sandboxd.daemon.services import MCP_PATH

        if path.rstrip("/").encode("latin-1") == MCP_PATH:
            from sandboxd.mcp.door import refusal_message

            return (
                b"application/json",
                json_error(refusal_message(error)),
                dict(error.headers),
            )
        from sandboxd.web.dispatch import error_framing

        body, headers = error_framing(None, path, error)
        return b"application/json", json_error(body), headers
