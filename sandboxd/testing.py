# -*- test-case-name: tests.web.test_pipeline -*-
"""
Helpers for testing sandboxd and code built on it.

- In memory, for logic that needs no socket and no child (as Synapse ships
  ``make_request``): :func:`memory_context` builds the daemon's shared state
  on a ``MemoryReactorClock``, :func:`memory_site` the HTTP site over it,
  and :func:`make_request` sends one request through the whole pipeline
  (routing, the gate, body cap, handler, audit) and parses the answer.
- For real: :func:`start_daemon` runs a daemon on loopback ports chosen by
  the kernel, with a small HTTP client.

Shipped with the package (as txtorcon ships its fakes) so template authors
can test their commands and routes against a real pipeline.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

import attrs
from twisted.internet.defer import Deferred, gatherResults, inlineCallbacks
from twisted.internet.protocol import Protocol
from twisted.web.client import Agent, readBody
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IBodyProducer
from zope.interface import implementer

from sandboxd.access.audit import AuditLog
from sandboxd.commands import CommandRegistry
from sandboxd.daemon.context import Context, Reactor
from sandboxd.daemon.server import DaemonService, Settings, build
from sandboxd.endpoints import RouteTable
from sandboxd.policy import load_policy
from sandboxd.routes import builtin_table


@implementer(IBodyProducer)
class BodyProducer:
    """
    A request body a test writes whole in ``startProducing``: pausing,
    resuming and stopping have nothing to do.  ``length`` is unknown (the
    client sends the body chunked) unless a subclass knows it.
    """

    length: int | str = UNKNOWN_LENGTH

    def startProducing(self, consumer: Any) -> Deferred[None]:
        """Write the body to ``consumer``; fires when it is written."""
        raise NotImplementedError

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class BytesProducer(BodyProducer):
    """A request body from bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.length = len(data)

    def startProducing(self, consumer: Any) -> Deferred[None]:
        consumer.write(self.data)
        return Deferred.fromCoroutine(_done())


async def _done() -> None:
    return None


@attrs.frozen
class Reply:
    """A response as a test sees it."""

    status: int
    headers: Headers
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        """One response header's last value."""
        values = self.headers.getRawHeaders(name)
        return values[-1] if values else None


class MemoryAudit(AuditLog):
    """An audit log that keeps its records in a list, for assertions."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        """Keep the record."""
        self.records += 1
        self.lines.append(record)


def memory_context(
    policy: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    table: RouteTable | None = None,
    base_dir: str = "/tmp",
) -> Context:
    """
    The daemon's shared state on a ``MemoryReactorClock``, with no group
    service started: enough for the gate, routing, discovery and any handler
    that touches neither the file system nor a child.
    """
    from twisted.internet.testing import MemoryReactorClock

    table = table if table is not None else builtin_table()
    # A memory reactor is a clock with no processes or threads: this
    # harness is for logic that needs neither.
    return Context(
        reactor=cast(Reactor, MemoryReactorClock()),
        table=table,
        policy=load_policy(
            table, explicit=dict(policy or {}), base_dir=base_dir, environ=environ or {}
        ),
        registry=CommandRegistry(),
        audit=MemoryAudit(),
    )


def memory_site(context: Context) -> Any:
    """The HTTP site over ``context``, on its memory reactor."""
    from sandboxd.web.factory import SandboxSite

    return SandboxSite(context, reactor=context.reactor)


@attrs.frozen
class MemoryReply:
    """An answer read off an in-memory connection."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        """One response header (lower-cased name), or None."""
        return self.headers.get(name.lower())


def make_request(
    site: Any,
    method: str,
    target: str,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
) -> MemoryReply:
    """
    Send one request through ``site`` on a string transport and read the
    answer; ``body`` is JSON-encoded unless it is bytes, headers are sent as
    UTF-8 (as Twisted's client sends text).  ``Host:
    localhost`` is sent unless ``headers`` names another.
    """
    data = body if isinstance(body, bytes) else b""
    if body is not None and not isinstance(body, bytes):
        data = json.dumps(body).encode()
    sent = {"Host": "localhost", **(headers or {})}
    if data or method in ("POST", "DELETE"):
        sent.setdefault("Content-Length", str(len(data)))
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in sent.items()
    )
    raw = feed(site, head.encode("utf-8") + b"\r\n" + data)
    head_bytes, _, payload = raw.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    answer: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        answer[name.strip().lower()] = value.strip()
    return MemoryReply(status, answer, payload)


def feed(site: Any, data: bytes) -> bytes:
    """
    Send raw bytes on a new in-memory connection to ``site``; everything it
    wrote back, once the bytes are handled (the connection is then lost).
    """
    from twisted.internet.testing import StringTransport

    protocol = site.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(data)
    written: bytes = transport.value()
    protocol.connectionLost(None)
    return written


class MemoryDaemon:
    """
    The whole HTTP pipeline of a daemon, in memory: what
    :class:`RunningDaemon` offers for logic that needs no socket, no child
    and no file (routing, the gate, framing, discovery, errors, audit).

    :param token: sets ``ABX_SERVER_TOKEN`` and is sent by default.
    """

    def __init__(
        self,
        policy: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        token: str | None = None,
        table: RouteTable | None = None,
    ) -> None:
        env = dict(environ or {})
        if token is not None:
            env.setdefault("ABX_SERVER_TOKEN", token)
        self.token = token
        self.context = memory_context(policy, env, table)
        self.site = memory_site(self.context)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        token: str | None = "default",
        raw_body: bytes | None = None,
    ) -> MemoryReply:
        """One request, as :meth:`RunningDaemon.request` sends it."""
        sent = dict(headers or {})
        use = self.token if token == "default" else token
        if use:
            sent.setdefault("X-Access-Token", use)
        if body is not None and raw_body is None:
            sent.setdefault("Content-Type", "application/json")
        return make_request(
            self.site, method, path, raw_body if raw_body is not None else body, sent
        )

    def raw(self, data: bytes) -> bytes:
        """Raw bytes in, raw bytes out."""
        return feed(self.site, data)


class RunningDaemon:
    """
    A daemon listening on loopback ports chosen by the kernel.

    :ivar port: the HTTP port (0 on a unix socket); :ivar pty_port: the
        WebSocket port (when the terminal group listens).
    """

    def __init__(self, daemon: DaemonService, reactor: Any) -> None:
        self.daemon = daemon
        self.context = daemon.context
        self.reactor = reactor
        self.port = 0
        self.token: str | None = None
        self.agent = Agent(reactor)

    @property
    def url(self) -> str:
        """The base URL, ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        token: str | None = "default",
        raw_body: bytes | None = None,
    ) -> Deferred[Reply]:
        """Send one request; JSON-encodes ``body`` unless ``raw_body`` is given."""
        hdrs = Headers()
        use = self.token if token == "default" else token
        if use:
            hdrs.addRawHeader("X-Access-Token", use)
        for k, v in (headers or {}).items():
            hdrs.addRawHeader(k, v)
        producer = None
        if raw_body is not None:
            producer = BytesProducer(raw_body)
        elif body is not None:
            producer = BytesProducer(json.dumps(body).encode())
            hdrs.addRawHeader("Content-Type", "application/json")
        d = self.agent.request(
            method.encode(), (self.url + path).encode(), hdrs, producer
        )

        def read(response: Any) -> Deferred[Reply]:
            return readBody(response).addCallback(
                lambda data: Reply(response.code, response.headers, data)
            )

        return d.addCallback(read)

    def stop(self) -> Deferred[Any]:
        """Stop the daemon (listeners, children, audit)."""
        return self.daemon.stopService()


def listening_port(service: Any) -> Deferred[Any]:
    """The IListeningPort of a started :class:`sandboxd.daemon.readiness.Listener`."""
    # The listener keeps the listen Deferred privately.
    waiting: Deferred[Any] = service._waitingForPort
    result: Deferred[Any] = Deferred()

    def got(port: Any) -> Any:
        result.callback(port)
        return port

    waiting.addCallback(got)
    return result


@inlineCallbacks
def start_daemon(
    reactor: Any,
    base_dir: str,
    policy: Any = None,
    environ: Mapping[str, str] | None = None,
    table: RouteTable | None = None,
    registry: CommandRegistry | None = None,
    preset: str | None = None,
    token: str | None = None,
    **settings: Any,
) -> Any:
    """
    Build and start a daemon on ``127.0.0.1`` with kernel-chosen ports
    (or its HTTP listener on ``port``, an endpoint string: a unix socket,
    TLS).

    The caller must ``addCleanup(daemon.stop)``.  ``environ`` replaces the
    process environment for policy and token lookup (default: empty, so
    tests never pick up a developer's tokens).
    """
    env = dict(environ or {})
    if token is not None:
        env.setdefault("ABX_SERVER_TOKEN", token)
    s = Settings(
        port=settings.pop("port", "tcp:0:interface=127.0.0.1"),
        pty_port=settings.pop("pty_port", "tcp:0:interface=127.0.0.1"),
        # An explicit policy wins over a file (SPEC §5.1): none when a file
        # is given.
        policy=policy if policy is not None or "policy_file" in settings else {},
        preset=preset,
        base_dir=base_dir,
        environ=env,
        **settings,
    )
    daemon = build(
        s,
        reactor,
        table if table is not None else builtin_table(),
        registry if registry is not None else CommandRegistry(),
    )
    daemon.startService()
    running = RunningDaemon(daemon, reactor)
    running.token = env.get("ABX_SERVER_TOKEN")
    ports = yield gatherResults([listening_port(s) for s in daemon.listeners])
    # A unix socket's address has no port: 0, and the request helper
    # cannot reach it.
    running.port = getattr(ports[0].getHost(), "port", 0)
    if running.port:
        daemon.context.http_port = running.port
    return running


class SSEReader(Protocol):
    """
    Receives a ``text/event-stream`` body as it arrives and parses it.

    Give it to ``response.deliverBody``.  ``events`` holds each frame as
    ``{"id"?, "event", "data"}`` (``data`` JSON-decoded); ``writes`` counts
    the reads, which shows how well a server coalesces.
    """

    def __init__(self) -> None:
        self.buffer = b""
        self.raw = b""
        self.events: list[dict[str, Any]] = []
        self.writes = 0
        self.done: Deferred[list[dict[str, Any]]] = Deferred()
        self.waiters: list[tuple[Any, Deferred[None]]] = []

    def dataReceived(self, data: bytes) -> None:
        self.writes += 1
        self.raw += data
        self.buffer += data
        while b"\n\n" in self.buffer:
            block, self.buffer = self.buffer.split(b"\n\n", 1)
            event: dict[str, Any] = {}
            for line in block.decode().split("\n"):
                if line.startswith(":"):
                    event.setdefault("comment", line)
                elif line.startswith("id: "):
                    event["id"] = int(line[4:])
                elif line.startswith("event: "):
                    event["event"] = line[7:]
                elif line.startswith("data: "):
                    event["data"] = json.loads(line[6:])
            if "event" in event:
                self.events.append(event)
        for test, d in list(self.waiters):
            if test(self):
                self.waiters.remove((test, d))
                d.callback(None)

    def wait_for(self, test: Any) -> Deferred[None]:
        """Fires once ``test(reader)`` holds."""
        d: Deferred[None] = Deferred()
        if test(self):
            d.callback(None)
        else:
            self.waiters.append((test, d))
        return d

    def wait_for_event(self, predicate: Any) -> Deferred[None]:
        """Fires once some event satisfies ``predicate(event)``."""
        return self.wait_for(lambda reader: any(predicate(e) for e in reader.events))

    def connectionLost(self, reason: Any = None) -> None:
        if not self.done.called:
            self.done.callback(self.events)

    def disconnect(self) -> None:
        """Drop the connection from the client side."""
        assert self.transport is not None
        self.transport.stopProducing()  # type: ignore[attr-defined]


class RawClient(Protocol):
    """Send raw bytes over TCP and collect whatever comes back."""

    def __init__(self) -> None:
        self.received = b""
        self.closed: Deferred[bytes] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Any = None) -> None:
        self.closed.callback(self.received)
