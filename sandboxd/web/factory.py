# -*- test-case-name: tests.web.test_request -*-
"""The HTTP factory: a ``Site`` whose requests run the sandboxd pipeline."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import LoopingCall
from twisted.web.resource import Resource
from twisted.web.server import Site

from sandboxd.context import Context
from sandboxd.policy.defaults import (
    HEADER_DEADLINE_SECONDS,
    HTTP_IDLE_TIMEOUT_SECONDS,
    MAX_CONNECTIONS_PER_PEER,
    MAX_HTTP_CONNECTIONS,
)
from sandboxd.web.channel import SandboxChannel
from sandboxd.web.request import SandboxRequest


class SandboxSite(Site):
    """
    The site serving the route tree of one :class:`Context`.

    ``log`` is a no-op: the combined access log costs a large share of
    small-request throughput (docs/performance.md), and the audit trail
    (SPEC §11.5) records what matters.
    """

    requestFactory = SandboxRequest
    protocol = SandboxChannel  # type: ignore[assignment]
    displayTracebacks = False

    def __init__(self, context: Context, reactor: Any = None) -> None:
        # Form bodies never become request arguments (SPEC §3 step 5), and
        # parsing their Content-Type costs time on every POST
        # (docs/performance.md).
        super().__init__(
            # The pipeline routes (sandboxd.web.routing) before any body is
            # read; twisted.web's resource traversal is never reached.
            Resource(),
            timeout=HTTP_IDLE_TIMEOUT_SECONDS,
            reactor=reactor,
            parsePOSTFormSubmission=False,
        )
        self.context = context
        self.connections: set[SandboxChannel] = set()
        self.per_peer: dict[str, int] = {}
        self._sweeper = LoopingCall(self.enforce_header_deadline)
        self._sweeper.clock = self.reactor

    def startFactory(self) -> None:
        """Start watching for requests whose headers never complete."""
        super().startFactory()
        if not self._sweeper.running:
            self._sweeper.start(HEADER_DEADLINE_SECONDS / 3, now=False)

    def stopFactory(self) -> None:
        """Stop the watch."""
        if self._sweeper.running:
            self._sweeper.stop()
        super().stopFactory()

    def connection_opened(self, channel: SandboxChannel) -> bool:
        """Admit a new connection (False: over a cap, close it)."""
        peer = channel.peer_host
        if (
            len(self.connections) >= MAX_HTTP_CONNECTIONS
            or self.per_peer.get(peer, 0) >= MAX_CONNECTIONS_PER_PEER
        ):
            self.context.metrics.connection_refused("http")
            return False
        self.connections.add(channel)
        self.per_peer[peer] = self.per_peer.get(peer, 0) + 1
        return True

    def connection_closed(self, channel: SandboxChannel) -> None:
        """Forget a connection."""
        if channel in self.connections:
            self.connections.discard(channel)
            left = self.per_peer.get(channel.peer_host, 1) - 1
            if left > 0:
                self.per_peer[channel.peer_host] = left
            else:
                self.per_peer.pop(channel.peer_host, None)

    def enforce_header_deadline(self) -> None:
        """Close connections whose request headers are overdue (slowloris)."""
        limit = self.reactor.seconds() - HEADER_DEADLINE_SECONDS
        for channel in list(self.connections):
            started = channel.headers_started
            transport: Any = channel.transport
            if started is not None and started < limit and transport is not None:
                transport.abortConnection()

    def log(self, request: Any) -> None:
        """Skip the access log (see the class docstring)."""
