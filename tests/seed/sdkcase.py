"""
The seed's typed SDK (``ServerClient``) against a real daemon and against
the seed's own server, for comparing them method by method.

``face(client, sync)`` lets one scenario drive either face of the SDK: its
async methods awaited in one event loop, or their ``*_sync`` twins, each
blocking on a worker thread.  ``outcome`` keeps what a call gave, result or
exception, and ``shape`` reduces it to what the two servers must agree on.
"""

from __future__ import annotations

import asyncio
import functools
import gc
from collections.abc import Awaitable, Callable
from typing import Any

import os
import socket
import subprocess
import sys
import time
from typing import TypeVar

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool
from twisted.trial.unittest import SkipTest

from tests.helpers import DaemonTestCase

T = TypeVar("T")

#: One SDK scenario must be over within this.
CALL_SECONDS = 60.0

#: The token both servers are started with.
TOKEN = "seed-wire-token"

#: Fields whose values depend on the clock or the machine, compared only
#: for being there (or both empty).
VOLATILE = frozenset({"modified", "accessed", "created", "execution_time_ms"})


class Face:
    """
    Calls an SDK method through its async face, or through its ``*_sync``
    twin on a worker thread (which runs its own event loop there).
    """

    def __init__(self, sync: bool) -> None:
        self.sync = sync

    async def __call__(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self.sync:
            return await method(*args, **kwargs)
        twin = getattr(method.__self__, method.__name__ + "_sync")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(twin, *args, **kwargs))


async def outcome(call: Awaitable[Any]) -> Any:
    """What the call gave: its result, or the exception it raised."""
    try:
        return await call
    except Exception as e:
        # Kept without its traceback: the frames would keep the call's
        # HTTP client, and its connection, alive past the scenario.
        e.__traceback__ = e.__context__ = e.__cause__ = None
        return e


def shape(value: Any, base: str) -> Any:
    """
    What a seed user's code sees of ``value``, made comparable across
    servers: an exception is its class; a model its class and the fields
    the SDK declares (the base dir written ``BASE``, clock fields as
    present or not); lists element by element.
    """
    from pydantic import BaseModel

    if isinstance(value, BaseException):
        return ("raises", type(value).__name__)
    if isinstance(value, BaseModel):
        fields = {}
        for name in type(value).model_fields:
            item = getattr(value, name)
            fields[name] = bool(item) if name in VOLATILE else shape(item, base)
        return (type(value).__name__, fields)
    if isinstance(value, list | tuple):
        return [shape(v, base) for v in value]
    if isinstance(value, dict):
        return {k: shape(v, base) for k, v in value.items()}
    if isinstance(value, str):
        return value.replace(base, "BASE")
    if hasattr(value, "value") and hasattr(value, "name"):  # an enum
        return value.value
    return value


def seed_sdk() -> Any:
    """The seed SDK's ``ServerClient`` class, or SkipTest saying why not."""
    try:
        from agent_sandbox.api.server_client import ServerClient
    except ImportError as e:  # pragma: no cover - a test dependency
        raise SkipTest(f"agent-sandbox-client is not installed: {e}") from None
    return ServerClient


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Reference:
    """The seed's own server on loopback, with a token and a base dir."""

    def __init__(self, base_dir: str) -> None:
        self.base_dir = base_dir
        self.port = _free_port()
        self.child: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Its HTTP base URL."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, *extra: str) -> None:
        """Start it, and wait (bounded) for /health; blocks: off the reactor."""
        import httpx

        env = {k: v for k, v in os.environ.items() if not k.startswith("ABX_")}
        env.update(ABX_SERVER_TOKEN=TOKEN)
        argv = [sys.executable, "-m", "agent_sandbox.server", "serve", "--host"]
        argv += ["127.0.0.1", "--port", str(self.port), "--pty-port", str(_free_port())]
        argv += ["--base-dir", self.base_dir, *extra]
        self.child = subprocess.Popen(
            argv,
            cwd=self.base_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.child.poll() is None:
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("the seed's server did not start")

    def stop(self) -> None:
        """End it and reap it (bounded)."""
        child, self.child = self.child, None
        if child is None or child.poll() is not None:
            return
        os.killpg(child.pid, 15)
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, 9)
            child.wait(timeout=10)


class SeedCase(DaemonTestCase):
    """A daemon with a token, and the seed's SDK pointed at it (or at the seed)."""

    timeout = 120
    token = TOKEN

    def setUp(self) -> Any:
        seed_sdk()
        self.pool = ThreadPool(minthreads=1, maxthreads=4, name="seed-wire")
        self.pool.start()
        self.addCleanup(self.pool.stop)
        self._reference: Reference | None = None
        return super().setUp()

    def client(self, token: str | None = TOKEN, reference: bool = False) -> Any:
        """A ``ServerClient`` for the daemon (or the seed's server)."""
        url = self.daemon.url
        if reference:
            assert self._reference is not None, "call self.reference() first"
            url = self._reference.url
        return seed_sdk()(url, token=token, timeout=CALL_SECONDS / 2)

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

        def in_thread() -> T:
            try:
                return asyncio.run(main())
            finally:
                # Each *_sync call runs in an event loop of its own, and the
                # SDK leaves that loop's HTTP client to the collector: closed
                # here, so their connections end with the scenario.
                gc.collect()

        d = self.call(in_thread)
        # Long enough for the daemon to see those connections close.
        return d.addBoth(lambda r: deferLater(reactor, 0.2, lambda: r))


class CompareCase(SeedCase):
    """
    Runs one scenario against the daemon and the seed's server, through the
    async face and the sync face.
    """

    #: Arguments for the seed's server (a ``--policy`` file, say).
    reference_args: tuple[str, ...] = ()

    @inlineCallbacks
    def both(
        self,
        scenario: Callable[[Any, str, Face], Awaitable[dict[str, Any]]],
        sync: bool,
        prepare: Callable[[str], None] | None = None,
    ) -> Any:
        """
        ``(ours, seed)``: the scenario's outcomes on the daemon and on the
        seed's server, each run in its own base dir (prepared by
        ``prepare`` first).
        """
        reference = yield self.reference(*self.reference_args)
        face = Face(sync)
        if prepare is not None:
            yield self.call(prepare, self.base_dir)
            yield self.call(prepare, reference.base_dir)
        ours = yield self.drive(lambda c: scenario(c, self.base_dir, face))
        seed = yield self.drive(
            lambda c: scenario(c, reference.base_dir, face), reference=True
        )
        return ours, seed

    def assertSameShapes(
        self,
        ours: dict[str, Any],
        seed: dict[str, Any],
        bases: tuple[str, str],
        only_class: frozenset[str] = frozenset(),
    ) -> None:
        """
        Method by method, the same typed result (or exception class); for
        the names in ``only_class``, the same class only.
        """
        self.assertEqual(sorted(ours), sorted(seed))
        for name in ours:
            a, b = shape(ours[name], bases[0]), shape(seed[name], bases[1])
            if name in only_class:
                a, b = type(ours[name]).__name__, type(seed[name]).__name__
            self.assertEqual(a, b, f"{name}: sandboxd {ours[name]!r}, seed {seed[name]!r}")
