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
from twisted.internet.threads import deferToThreadPool
from twisted.protocols import portforward
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

    def setUp(self) -> Any:
        self.pool = ThreadPool(minthreads=1, maxthreads=4, name="client-tests")
        self.pool.start()
        self.addCleanup(self.pool.stop)
        return super().setUp()

    def in_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Deferred[Any]:
        """Run blocking client code off the reactor thread."""
        return deferToThreadPool(reactor, self.pool, fn, *args, **kwargs)

    def in_loop(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> Deferred[Any]:
        """Run an asyncio coroutine (the async client) in a thread of its own."""
        return self.in_thread(lambda: asyncio.run(make()))

    @property
    def pty_url(self) -> str:
        """The daemon's PTY WebSocket base."""
        return f"ws://127.0.0.1:{self.daemon.context.pty_port}"

    def sandbox(self, token: str | None | bool = True, **options: Any) -> Sandbox:
        """A blocking client of this case's daemon (closed at cleanup)."""
        sb = Sandbox(
            self.daemon.url,
            token=self.daemon.token if token is True else (token or None),
            pty_url=self.pty_url,
            **options,
        )
        sb.settings  # noqa: B018 - constructed
        self.addCleanup(sb.close)
        return sb

    def async_sandbox(self, **options: Any) -> AsyncSandbox:
        """An asyncio client (to be used, and closed, inside one loop)."""
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
        return self.in_thread(
            subprocess.run,
            [sys.executable, "-m", "sandboxd.client.cli", *args],
            env=environ,
            input=input,
            capture_output=True,
            timeout=40,
        )

    def path(self, *parts: str) -> str:
        """A path inside the daemon's base dir."""
        return os.path.join(self.base_dir, *parts)


class _CuttingClient(portforward.ProxyClient):
    """The daemon side of one proxied connection; cuts it when told to."""

    def dataReceived(self, data: bytes) -> None:
        proxy: CutProxy = self.peer.factory
        index = self.peer.index
        proxy.received[index] += data
        self.peer.transport.write(data)
        cut = proxy.cut_when(index, bytes(proxy.received[index]))
        if cut:
            proxy.cuts += 1
            self.peer.transport.abortConnection()
            self.transport.abortConnection()


class _CuttingClientFactory(portforward.ProxyClientFactory):
    protocol = _CuttingClient


class _CuttingServer(portforward.ProxyServer):
    """The client side of one proxied connection."""

    clientProtocolFactory = _CuttingClientFactory

    def connectionMade(self) -> None:
        proxy: CutProxy = self.factory
        self.index = len(proxy.requests)
        proxy.requests.append(bytearray())
        proxy.received.append(bytearray())
        super().connectionMade()

    def dataReceived(self, data: bytes) -> None:
        self.factory.requests[self.index] += data
        super().dataReceived(data)


class CutProxy(portforward.ProxyFactory):
    """
    A TCP proxy in front of the daemon that aborts a connection (both
    sides, as a dropped network would) once ``cut_when(index, bytes_so_far)``
    says so, to test what the client does when a stream is cut.

    :ivar requests: the bytes each connection sent to the daemon.
    """

    protocol = _CuttingServer

    def __init__(self, port: int, cut_when: Callable[[int, bytes], bool]) -> None:
        super().__init__("127.0.0.1", port)
        self.cut_when = cut_when
        self.requests: list[bytearray] = []
        self.received: list[bytearray] = []
        self.cuts = 0


def listen_proxy(case: DaemonTestCase, cut_when: Callable[[int, bytes], bool]) -> tuple[CutProxy, str]:
    """A :class:`CutProxy` on loopback (closed at cleanup) and its URL."""
    proxy = CutProxy(case.daemon.port, cut_when)
    port = reactor.listenTCP(0, proxy, interface="127.0.0.1")
    case.addCleanup(port.stopListening)
    return proxy, f"http://127.0.0.1:{port.getHost().port}"
