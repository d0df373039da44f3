"""
The seed's typed SDK (``agent-sandbox-client``'s ``ServerClient``) against
a real sandboxd daemon on loopback, and the seed's own server
(``agent-sandbox-server``) started beside it as the reference.

The SDK is asyncio code and its ``*_sync`` methods block, so every SDK call
runs on a small thread pool of its own (an async one inside ``asyncio.run``
there), as ``tests/e2b`` drives the e2b SDK; the reactor thread only serves
the daemon.  Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool
from twisted.trial.unittest import SkipTest

from tests.helpers import DaemonTestCase, free_port, port_was_taken, session_listens
from tests.seed.policycompare import seed_argv

T = TypeVar("T")

#: One SDK call (or a short scenario of them) must be over within this.
CALL_SECONDS = 60.0

#: The seed's server must answer /health within this after it is started.
REFERENCE_START_SECONDS = 30.0

#: The token both servers are started with.
TOKEN = "seed-sdk-token"


def seed_sdk() -> Any:
    """The seed SDK's ``ServerClient`` class, or SkipTest saying why not."""
    try:
        from agent_sandbox.api.server_client import ServerClient
    except ImportError as e:  # pragma: no cover - a test dependency
        raise SkipTest(f"agent-sandbox-client is not installed: {e}") from None
    return ServerClient


def caught(fn: Callable[[], T]) -> T | BaseException:
    """``fn()``'s result, or the exception it raised."""
    try:
        return fn()
    except Exception as e:
        return e


class Reference:
    """
    The seed's own server (``python -m agent_sandbox.server serve``) on
    loopback ports, with a token and a base dir: the control that sandboxd's
    answers are compared with.
    """

    def __init__(self, base_dir: str, token: str = TOKEN) -> None:
        self.base_dir = base_dir
        self.token = token
        self.port = free_port()
        self.pty_port = free_port()
        self.child: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(base_dir, "reference-server.log")

    @property
    def url(self) -> str:
        """Its HTTP base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pty_url(self) -> str:
        """Its PTY WebSocket base URL."""
        return f"ws://127.0.0.1:{self.pty_port}"

    def start(self, *extra: str) -> None:
        """
        Start it and wait (bounded) until /health answers from it; blocks:
        run off the reactor.  A start that lost its port to another test's
        server before it could bind is tried again on fresh ports.
        """
        for _ in range(3):
            if self._start(*extra):
                return
            with open(self.log_path, errors="replace") as f:
                output = f.read()
            if not port_was_taken(output):
                break
            self.port, self.pty_port = free_port(), free_port()
        raise RuntimeError(f"the seed's server did not start:\n{output[-2000:]}")

    def _start(self, *extra: str) -> bool:
        """One try at :meth:`start`: whether it came up (else it is stopped)."""
        import httpx

        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ABX_", "SANDBOX_"))
        }
        env.update(ABX_SERVER_TOKEN=self.token, ABX_SERVER_BASE_DIR=self.base_dir)
        argv = seed_argv(self.port, self.pty_port, "--base-dir", self.base_dir, *extra)
        with open(self.log_path, "wb") as log:
            self.child = subprocess.Popen(
                argv,
                cwd=self.base_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + REFERENCE_START_SECONDS
        while time.monotonic() < deadline:
            if self.child.poll() is not None:
                break
            try:
                up = httpx.get(self.url + "/health", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                up = False
            # Another test's server may hold the port and answer in its stead.
            if up and session_listens(self.child.pid, self.port):
                return True
            time.sleep(0.1)
        self.stop()
        return False

    def stop(self) -> None:
        """End it (its whole session) and reap it; bounded."""
        child, self.child = self.child, None
        if child is None or child.poll() is not None:
            return
        try:
            os.killpg(child.pid, 15)
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, 9)
            child.wait(timeout=10)
        except ProcessLookupError:
            pass


class SeedCase(DaemonTestCase):
    """
    A daemon with a token, and the seed's SDK pointed at it.

    ``self.client()`` is a ``ServerClient`` for the daemon (``reference=True``:
    for the seed's own server, started on first use).  ``self.drive(fn)`` runs
    ``await fn(client)`` in a fresh event loop off the reactor;
    ``self.call(fn, ...)`` runs a blocking call (an SDK ``*_sync`` method)
    off the reactor.  Both are bounded by :data:`CALL_SECONDS`.
    """

    timeout = 120
    token = TOKEN

    def setUp(self) -> Any:
        seed_sdk()
        self.pool = ThreadPool(minthreads=1, maxthreads=4, name="seed-sdk")
        self.pool.start()
        self.addCleanup(self.pool.stop)
        self._reference: Reference | None = None
        # A shell reads ~/.bashrc: a HOME of the test's own keeps whatever
        # the machine's root profile does (pyenv init, slow on a busy
        # machine) out of the terminals' way, on both servers.
        home = os.path.realpath(self.mktemp())
        os.makedirs(home)
        saved = os.environ.get("HOME")

        def restore() -> None:
            if saved is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = saved

        self.addCleanup(restore)
        os.environ["HOME"] = home
        return super().setUp()

    @inlineCallbacks
    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        """Start the daemon; at cleanup, drop what the SDK left connected first."""
        daemon = yield super().start(stop_at_end, **kwargs)
        self.addCleanup(self._drop_connections, daemon)
        return daemon

    def _drop_connections(self, daemon: Any) -> Deferred[None]:
        """
        Abort the daemon's open HTTP connections: the SDK's ``*_sync``
        methods run each call in an event loop of its own and leave its
        keep-alive connection behind when that loop ends.
        """
        for channel in list(daemon.context.metrics.site.connections):
            channel.transport.abortConnection()
        return deferLater(reactor, 0.05, lambda: None)

    @property
    def pty_url(self) -> str:
        """The daemon's PTY WebSocket base URL."""
        return f"ws://127.0.0.1:{self.daemon.context.pty_port}"

    def client(self, token: str | None = TOKEN, reference: bool = False) -> Any:
        """A ``ServerClient`` for the daemon (or the seed's server)."""
        cls = seed_sdk()
        if reference:
            assert self._reference is not None, "call self.reference() first"
            return cls(
                self._reference.url,
                token=token,
                pty_url=self._reference.pty_url,
                timeout=CALL_SECONDS / 2,
            )
        return cls(
            self.daemon.url, token=token, pty_url=self.pty_url, timeout=CALL_SECONDS / 2
        )

    @inlineCallbacks
    def reference(self, *extra: str) -> Any:
        """Start the seed's own server (once per test) and return it."""
        if self._reference is None:
            base = os.path.realpath(self.mktemp())
            os.makedirs(base)
            ref = Reference(base)
            self.addCleanup(lambda: self.call(ref.stop))
            yield self.call(ref.start, *extra)
            self._reference = ref
        return self._reference

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Deferred[T]:
        """Run a blocking call off the reactor, bounded by :data:`CALL_SECONDS`."""
        d: Deferred[T] = deferToThreadPool(reactor, self.pool, fn, *args, **kwargs)
        d.addTimeout(CALL_SECONDS, reactor)
        return d

    def drive(
        self,
        scenario: Callable[[Any], Awaitable[T]],
        token: str | None = TOKEN,
        reference: bool = False,
    ) -> Deferred[T]:
        """``await scenario(client)`` in its own event loop off the reactor."""
        client = self.client(token, reference)

        async def main() -> T:
            async with client:
                return await asyncio.wait_for(scenario(client), CALL_SECONDS - 5)

        return self.call(asyncio.run, main())

    def outcome(
        self,
        scenario: Callable[[Any], Awaitable[T]],
        token: str | None = TOKEN,
        reference: bool = False,
    ) -> Deferred[T | BaseException]:
        """Like :meth:`drive`, but an exception the scenario raised is the result."""
        d = self.drive(scenario, token, reference)
        return d.addErrback(lambda f: f.value)
