# -*- test-case-name: tests.preview.test_door -*-
"""
Talking HTTP/1.1 to the app: Twisted's own ``Agent`` over a persistent pool.

``twisted.web.proxy`` is not used: it reads whole request bodies, speaks
HTTP/1.0 upstream (no chunked bodies, no pooling) and registers no
producer, so a slow browser would make the daemon hold a whole response.
Here the request body streams in as the browser sends it
(:class:`StreamBody`, whose pause pauses the browser's socket) and the
response streams out as the app sends it (:class:`BodyRelay`, whose
transport is the browser's response producer, so a slow browser pauses
the app's socket).  Each chunk is written as it arrives: an event stream
needs no special case and no flush interval.

The pool keeps idle connections for less time than Node's five-second
keep-alive, and the Agent retries an idempotent request without a body
once when a kept connection turns out to have been closed by the app (a
peer's well-known failure: a stale pooled connection answered as an error).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.interfaces import IConsumer, IPushProducer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import (
    Agent,
    HTTPConnectionPool,
    ResponseDone,
    _HTTP11ClientFactory,
)
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import UNKNOWN_LENGTH, IAgentEndpointFactory, IBodyProducer
from zope.interface import implementer

from sandboxd.policy.defaults import (
    LARGE_BODY_BYTES,
    LARGE_READ_BYTES,
    PREVIEW_EARLY_BODY_BYTES,
    PREVIEW_POOL_IDLE_SECONDS,
    PREVIEW_POOL_PER_PORT,
)


@implementer(IAgentEndpointFactory)
class LoopbackEndpoints:
    """
    Endpoints to the loopback addresses, made once per address and port.

    (The Agent's default factory resolves and IDNA-encodes the host of
    every request: a tenth of a proxied request's time, for a host that is
    always a loopback address.)
    """

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor
        self._made: dict[tuple[bytes, int], Any] = {}

    def endpointForURI(self, uri: Any) -> Any:
        """A TCP endpoint to ``uri``'s loopback address and port."""
        key = (uri.host, uri.port)
        endpoint = self._made.get(key)
        if endpoint is None:
            host = uri.host.decode("ascii").strip("[]")
            kind = TCP6ClientEndpoint if ":" in host else TCP4ClientEndpoint
            endpoint = self._made[key] = _NoDelay(kind(self._reactor, host, uri.port))
        return endpoint


class _NoDelay:
    """
    An endpoint whose connections send at once (``TCP_NODELAY``): a proxy
    relays small writes (a request head, an event) that Nagle's algorithm
    would hold back until the app acknowledges the last one.
    """

    def __init__(self, endpoint: Any) -> None:
        self._endpoint = endpoint

    def connect(self, factory: Any) -> Deferred[Any]:
        """Connect, then switch Nagle's algorithm off."""

        def connected(protocol: Any) -> Any:
            transport = getattr(protocol, "transport", None)
            if transport is not None and hasattr(transport, "setTcpNoDelay"):
                transport.setTcpNoDelay(True)
            return protocol

        d: Deferred[Any] = self._endpoint.connect(factory)
        return d.addCallback(connected)


class _QuietFactory(_HTTP11ClientFactory):
    """The pool's connection factory, without a log line per connection."""

    noisy = False


def make_agent(reactor: Any) -> tuple[Agent, HTTPConnectionPool]:
    """The door's Agent and its persistent pool."""
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool._factory = _QuietFactory
    pool.maxPersistentPerHost = PREVIEW_POOL_PER_PORT
    pool.cachedConnectionTimeout = PREVIEW_POOL_IDLE_SECONDS
    pool.retryAutomatically = True
    agent = Agent.usingEndpointFactory(reactor, LoopbackEndpoints(reactor), pool=pool)
    return agent, pool


@implementer(IBodyProducer)
class StreamBody:
    """
    A request body fed as the browser sends it.

    :param source: the browser's transport (paused when the app reads
        slower than the browser sends).
    """

    def __init__(self, length: int | None, source: IPushProducer | None) -> None:
        self.length: Any = length if length is not None else UNKNOWN_LENGTH
        self._source = source
        self._consumer: IConsumer | None = None
        self._early: list[bytes] = []
        self._early_bytes = 0
        self._done: Deferred[None] = Deferred()
        self._finished = False
        self._paused_by_us = False
        self.stopped = False

    @property
    def started(self) -> bool:
        """Whether the app's connection is up (bytes may have gone)."""
        return self._consumer is not None

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        """The app's connection is up: send what came early, then stream."""
        self._consumer = consumer
        early, self._early = self._early, []
        for chunk in early:
            consumer.write(chunk)
        if self._paused_by_us:
            self._paused_by_us = False
            self._resume_source()
        if self._finished and not self._done.called:
            self._done.callback(None)
        return self._done

    def feed(self, data: bytes) -> None:
        """A chunk of the browser's body."""
        if self.stopped:
            return
        if self._consumer is None:
            self._early.append(data)
            self._early_bytes += len(data)
            if self._early_bytes > PREVIEW_EARLY_BODY_BYTES and not self._paused_by_us:
                self._paused_by_us = True
                self._pause_source()
            return
        self._consumer.write(data)

    def finish(self) -> None:
        """The browser's body is complete."""
        self._finished = True
        if self._consumer is not None and not self._done.called:
            self._done.callback(None)

    def _pause_source(self) -> None:
        if self._source is not None:
            self._source.pauseProducing()

    def _resume_source(self) -> None:
        if self._source is not None:
            self._source.resumeProducing()

    def pauseProducing(self) -> None:
        """The app reads slower than the browser sends: pause the browser."""
        self._pause_source()

    def resumeProducing(self) -> None:
        """The app caught up."""
        self._resume_source()

    def stopProducing(self) -> None:
        """The app's connection is gone: drop the rest."""
        self.stopped = True
        self._resume_source()


class BodyRelay(Protocol):
    """
    Writes the app's response body to the browser as it arrives; the body's
    transport is registered as the browser's producer, so a full socket to
    the browser pauses the socket from the app.

    :param write: writes one chunk to the browser.
    :param done: called with None when the body is whole, or the failure.
    """

    def __init__(
        self, register: Any, write: Any, done: Any, length: int | None = None
    ) -> None:
        self._register = register
        self._write = write
        self._done = done
        self._length = length
        self._widened: Any = None
        self.received = 0

    def connectionMade(self) -> None:
        """Become the browser's producer; read a large body in large reads."""
        self._register(self.transport)
        if self._length is not None and self._length > LARGE_BODY_BYTES:
            # Twisted reads 64 KiB per recv: a large download is then many
            # reactor turns. The body's transport wraps the app's socket.
            socket_transport = getattr(self.transport, "_producer", None)
            if socket_transport is not None and hasattr(socket_transport, "bufferSize"):
                socket_transport.bufferSize = LARGE_READ_BYTES
                self._widened = socket_transport

    def dataReceived(self, data: bytes) -> None:
        """Relay a chunk at once."""
        self.received += len(data)
        self._write(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """The body ended: whole (or read to the close), or cut short."""
        if self._widened is not None and "bufferSize" in vars(self._widened):
            del self._widened.bufferSize  # the pooled connection reads small again
        if reason.check(ResponseDone, PotentialDataLoss):
            self._done(None)
        else:
            self._done(reason)

    def stop(self) -> None:
        """The browser left: close the app's connection."""
        transport: Any = self.transport
        if transport is not None:
            transport.stopProducing()
