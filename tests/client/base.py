"""The fixture of the client tests: a real daemon, the client in a thread."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from sandboxd.client import AsyncSandbox, Sandbox
from tests.helpers import DaemonTestCase

#: The repository's root (where ``sandboxd`` is importable from).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ClientCase(DaemonTestCase):
    """
    A daemon on loopback, and the blocking client run in a thread of our
    own (a blocking call on the reactor thread would wait for a daemon
    that cannot answer; the reactor's pool is the daemon's).
    """

    timeout = 60
    token: str | None = "client-test-token"
    #: Seconds each client call may wait for its answer, when a case's calls
    #: may wait longer than the client's default (a kernel's start).
    call_seconds: float | None = None

    def setUp(self) -> Any:
        self.pool = ThreadPool(minthreads=1, maxthreads=4, name="client-tests")
        self.pool.start()
        self.addCleanup(self.pool.stop)
        return super().setUp()

    def in_thread(
        self, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Deferred[Any]:
        """Run blocking client code off the reactor thread."""
        return deferToThreadPool(reactor, self.pool, fn, *args, **kwargs)

    def in_loop(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> Deferred[Any]:
        """Run an asyncio coroutine (the async client) in a thread of its own."""
        return self.in_thread(lambda: asyncio.run(make()))

    @property
    def pty_url(self) -> str:
        """The daemon's PTY WebSocket base."""
        return f"ws://127.0.0.1:{self.daemon.context.pty_port}"

    def sandbox(self, token: str | bool | None = True, **options: Any) -> Sandbox:
        """A blocking client of this case's daemon (closed at cleanup)."""
        if self.call_seconds is not None:
            options.setdefault("timeout", self.call_seconds)
        options.setdefault("pty_url", self.pty_url)
        sb = Sandbox(
            self.daemon.url,
            token=self.daemon.token if token is True else (token or None),
            **options,
        )
        self.addCleanup(sb.close)
        return sb

    def async_sandbox(self, **options: Any) -> AsyncSandbox:
        """An asyncio client (to be used, and closed, inside one loop)."""
        if self.call_seconds is not None:
            options.setdefault("timeout", self.call_seconds)
        return AsyncSandbox(
            self.daemon.url, token=self.daemon.token, pty_url=self.pty_url, **options
        )

    def cli(
        self, *args: str, env: dict[str, str] | None = None, input: bytes | None = None
    ) -> Deferred[subprocess.CompletedProcess[bytes]]:
        """Run ``sandboxd ARGS`` (the client CLI) against this daemon, in a thread."""
        environ = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": ROOT,
            "SANDBOXD_URL": self.daemon.url,
            "SANDBOXD_PTY_URL": self.pty_url,
            **({"SANDBOXD_TOKEN": self.daemon.token} if self.daemon.token else {}),
            **(env or {}),
        }
        if self.call_seconds is not None:
            args = (args[0], "--request-timeout", str(self.call_seconds), *args[1:])
        return self.in_thread(
            subprocess.run,
            [sys.executable, "-m", "sandboxd.client.cli", *args],
            env=environ,
            input=input,
            # No input: nothing (never the test runner's own stdin).
            stdin=subprocess.DEVNULL if input is None else None,
            capture_output=True,
            timeout=40 + (self.call_seconds or 0),
        )

    def path(self, *parts: str) -> str:
        """A path inside the daemon's base dir."""
        return os.path.join(self.base_dir, *parts)


class _Back(Protocol):
    """The daemon side of one proxied connection; cuts it when told to."""

    def __init__(self, front: _Front) -> None:
        self.front = front

    def dataReceived(self, data: bytes) -> None:
        proxy = self.front.proxy
        index = self.front.index
        proxy.received[index] += data
        self.front.transport.write(data)
        if not self.front.cut and proxy.cut_when(index, bytes(proxy.received[index])):
            # What was forwarded reaches the client, then its stream ends
            # short; the daemon's side is aborted as a lost network would.
            self.front.cut = True
            proxy.cuts += 1
            self.front.transport.loseConnection()
            self.transport.abortConnection()

    def connectionLost(self, reason: Any = None) -> None:
        self.front.transport.loseConnection()


class _Front(Protocol):
    """The client side of one proxied connection."""

    proxy: CutProxy
    back: _Back | None

    def connectionMade(self) -> None:
        self.cut = False
        self.back = None
        if self.proxy.refuse:
            self.transport.abortConnection()
            return
        self.index = len(self.proxy.requests)
        self.proxy.requests.append(bytearray())
        self.proxy.received.append(bytearray())
        self.pending: list[bytes] = []
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.proxy.port)
        connectProtocol(endpoint, _Back(self)).addCallbacks(
            self._connected, lambda _: self.transport.loseConnection()
        )

    def _connected(self, back: _Back) -> None:
        self.back = back
        for data in self.pending:
            back.transport.write(data)
        self.pending = []

    def dataReceived(self, data: bytes) -> None:
        proxy = self.proxy
        if self.cut:
            return
        proxy.requests[self.index] += data
        if self.back is not None:
            self.back.transport.write(data)
        else:
            self.pending.append(data)
        when = proxy.cut_request_when
        if when is not None and when(self.index, bytes(proxy.requests[self.index])):
            # Mid-request: what was forwarded reaches the daemon, then its
            # stream ends; the client's side is aborted.
            self.cut = True
            proxy.cuts += 1
            if self.back is not None:
                self.back.transport.loseConnection()
            self.transport.abortConnection()

    def connectionLost(self, reason: Any = None) -> None:
        if self.back is not None:
            self.back.transport.loseConnection()


class CutProxy(Factory):
    """
    A TCP proxy in front of the daemon that cuts a connection mid-answer
    once ``cut_when(index, bytes_received_so_far)`` says so, to test what
    the client does when a stream is cut.  (Tests move a few MB through
    it: it buffers rather than flow-controls.)

    :ivar cut_request_when: ``(index, bytes_sent_so_far)`` -> cut the
        connection mid-request (an upload), or None.
    :ivar requests: the bytes each connection sent to the daemon.
    :ivar cuts: how many connections were cut.
    :ivar refuse: close new connections at once (the daemon is gone).
    """

    def __init__(
        self,
        port: int,
        cut_when: Callable[[int, bytes], bool],
        cut_request_when: Callable[[int, bytes], bool] | None = None,
    ) -> None:
        self.port = port
        self.cut_when = cut_when
        self.cut_request_when = cut_request_when
        self.requests: list[bytearray] = []
        self.received: list[bytearray] = []
        self.cuts = 0
        self.refuse = False

    def buildProtocol(self, addr: Any) -> _Front:
        front = _Front()
        front.proxy = self
        return front


def listen_proxy(
    case: DaemonTestCase,
    cut_when: Callable[[int, bytes], bool],
    cut_request_when: Callable[[int, bytes], bool] | None = None,
) -> tuple[CutProxy, str]:
    """A :class:`CutProxy` on loopback (closed at cleanup) and its URL."""
    proxy = CutProxy(case.daemon.port, cut_when, cut_request_when)
    port = reactor.listenTCP(0, proxy, interface="127.0.0.1")
    case.addCleanup(port.stopListening)
    return proxy, f"http://127.0.0.1:{port.getHost().port}"
