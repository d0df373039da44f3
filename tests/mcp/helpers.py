"""
Driving the MCP door with real clients from a trial test.

The official ``mcp`` SDK (and fastmcp's client) run on asyncio, the daemon
under test on trial's reactor: each client runs in a thread of its own
with its own event loop, every wait bounded, and hands its result back to
the reactor as a Deferred.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import deferLater
from twisted.python.failure import Failure

from tests.helpers import DaemonTestCase

#: Every client conversation ends within this many seconds, or fails.
CLIENT_TIMEOUT = 20.0


def in_thread(
    work: Callable[[], Awaitable[Any]], timeout: float = CLIENT_TIMEOUT
) -> Deferred[Any]:
    """Run ``work`` on an asyncio loop in a new thread; its result as a Deferred."""
    d: Deferred[Any] = Deferred()

    async def bounded() -> Any:
        with anyio.fail_after(timeout):
            return await work()

    def run() -> None:
        try:
            value = anyio.run(bounded)
        except BaseException as e:
            failure = Failure(e)
            reactor.callFromThread(d.errback, failure)  # type: ignore[attr-defined]
        else:
            reactor.callFromThread(d.callback, value)  # type: ignore[attr-defined]

    threading.Thread(target=run, daemon=True, name="mcp-client").start()
    return d


def on_reactor(fn: Callable[[], Any]) -> Any:
    """From a client thread: run ``fn`` on the reactor and wait for its result."""
    done = threading.Event()
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e
        done.set()

    reactor.callFromThread(call)  # type: ignore[attr-defined]
    if not done.wait(CLIENT_TIMEOUT):
        raise TimeoutError("the reactor did not answer")
    if "error" in box:
        raise box["error"]
    return box["value"]


class McpTestCase(DaemonTestCase):
    """A daemon per test, and the SDK client pointed at its ``/mcp``."""

    timeout = 60
    #: A client conversation of this case ends within this many seconds.
    client_seconds = CLIENT_TIMEOUT

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        """
        Start the daemon (with its own copy of the class's policy, which a
        reload test changes); at the end, let the clients' connections close.
        """
        kwargs.setdefault("policy", copy.deepcopy(self.policy))
        d = super().start(stop_at_end, **kwargs)
        self.addCleanup(self._drain)
        return d

    @inlineCallbacks
    def _drain(self) -> Any:
        """
        Wait (bounded) for the connections the client threads closed to be
        closed on the daemon's side too, then cut any left.
        """
        site = self.daemon.daemon.listeners[0].factory
        deadline = time.monotonic() + 3
        while site.connections and time.monotonic() < deadline:
            yield deferLater(reactor, 0.05, lambda: None)
        for channel in list(site.connections):
            if channel.transport is not None:
                channel.transport.abortConnection()
        yield deferLater(reactor, 0.05, lambda: None)

    @property
    def mcp_url(self) -> str:
        """The door's URL."""
        return self.daemon.url + "/mcp"

    def http_client(self, token: str | None = None) -> httpx2.AsyncClient:
        """The HTTP client an SDK client speaks through (to enter in a client thread)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(self.client_seconds)
        )

    def with_client(
        self,
        body: Callable[[Client], Awaitable[Any]],
        token: str | None = None,
        seconds: float | None = None,
        **kwargs: Any,
    ) -> Deferred[Any]:
        """
        Open a session, run ``body`` with it, close it; in a thread, within
        ``seconds`` (the case's ``client_seconds`` unless given).

        The HTTP client is closed with the session, as an application that
        is done with it does: the SDK leaves a client it was handed open,
        and its pooled connections (a cancelled call's or a notification
        stream's) would otherwise stay open until the garbage collector
        found them, which the cleanup's drain waited out.
        """

        async def work() -> Any:
            async with self.http_client(token) as http:
                transport = streamable_http_client(self.mcp_url, http_client=http)
                async with Client(transport, **kwargs) as client:
                    return await body(client)

        return in_thread(work, seconds or self.client_seconds)

    def http(
        self,
        method: str,
        message: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Deferred[httpx2.Response]:
        """One plain HTTP request to ``/mcp`` (in a thread)."""
        sent = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            **(headers or {}),
        }
        content = (
            raw
            if raw is not None
            else (json.dumps(message).encode() if message is not None else None)
        )

        async def work() -> httpx2.Response:
            async with httpx2.AsyncClient(timeout=CLIENT_TIMEOUT) as client:
                response = await client.request(
                    method, self.mcp_url, headers=sent, content=content
                )
                await response.aread()
                return response

        return in_thread(work)

    def initialize(
        self, version: str = "2025-11-25", headers: dict[str, str] | None = None
    ) -> Deferred[httpx2.Response]:
        """A bare ``initialize`` POST."""
        return self.http(
            "POST",
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": version,
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"},
                },
            },
            headers,
        )
