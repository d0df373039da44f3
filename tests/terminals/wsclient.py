"""
A small WebSocket client for trial tests against the PTY port: autobahn's
client protocol over a real loopback TCP connection, with every autobahn
timer switched off (they would run on the global reactor and leak).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint


class TestClient(WebSocketClientProtocol):
    """Collects every message; tests wait for the one they expect."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[dict[str, Any]] = []
        self.raw: list[tuple[bytes, bool]] = []
        self.opened: Deferred[TestClient] = Deferred()
        self.closed: Deferred[tuple[int | None, str | None]] = Deferred()
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self._waiting: list[
            tuple[Callable[[dict[str, Any]], bool], Deferred[dict[str, Any]]]
        ] = []

    def onOpen(self) -> None:
        self.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.raw.append((payload, isBinary))
        message = json.loads(payload)
        self.messages.append(message)
        for item in list(self._waiting):
            test, d = item
            if test(message):
                self._waiting.remove(item)
                d.callback(message)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.close_code, self.close_reason = code, reason
        if not self.opened.called:
            self.opened.errback(ConnectionError(f"handshake failed: {code} {reason}"))
        for _, d in self._waiting:
            d.errback(ConnectionError(f"closed: {code} {reason}"))
        self._waiting = []
        self.closed.callback((code, reason))

    # -- helpers --------------------------------------------------------------

    def wait_for(
        self, test: Callable[[dict[str, Any]], bool]
    ) -> Deferred[dict[str, Any]]:
        """The first message (already received or not) that passes ``test``."""
        for message in self.messages:
            if test(message):
                return _fired(message)
        d: Deferred[dict[str, Any]] = Deferred()
        self._waiting.append((test, d))
        return d

    def output(self) -> str:
        """All output text so far."""
        return "".join(m["data"] for m in self.messages if m.get("type") == "output")

    def wait_output(self, needle: str) -> Deferred[str]:
        """Fires once the output so far contains ``needle``."""
        if needle in self.output():
            return _fired(self.output())
        d: Deferred[str] = Deferred()

        def test(message: dict[str, Any]) -> bool:
            return message.get("type") == "output" and needle in self.output()

        inner = self.wait_for(test)
        inner.addCallbacks(lambda _: d.callback(self.output()), d.errback)
        return d

    def send_json(self, message: Any) -> None:
        """One JSON text frame."""
        self.sendMessage(json.dumps(message).encode(), isBinary=False)

    def type(self, text: str) -> None:
        """An input message."""
        self.send_json({"type": "input", "data": text})


def _fired(value: Any) -> Deferred[Any]:
    d: Deferred[Any] = Deferred()
    d.callback(value)
    return d


def connect(
    port: int,
    session_id: str | None = None,
    headers: dict[str, str] | None = None,
    path: str = "/pty",
    **params: Any,
) -> Deferred[TestClient]:
    """
    Open ``ws://127.0.0.1:PORT/pty?session_id=...`` (or another ``path``:
    the API port's ``/pty/sessions/ID/ws``); fires with the client once
    open, or fails if the server refused the handshake.
    """
    query = dict(params)
    if session_id is not None:
        query["session_id"] = session_id
    url = f"ws://127.0.0.1:{port}{path}" + (f"?{urlencode(query)}" if query else "")
    factory = WebSocketClientFactory(url, headers=headers or {})
    factory.protocol = TestClient
    factory.setProtocolOptions(
        openHandshakeTimeout=0,
        closeHandshakeTimeout=0,
        serverConnectionDropTimeout=0,
        autoPingInterval=0,
        autoPingTimeout=0,
    )
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    d = endpoint.connect(factory)
    return d.addCallback(lambda proto: proto.opened)


def quiet_server(service: Any) -> None:
    """Switch the daemon's autobahn timers off (trial must not see them)."""
    service.factory.setProtocolOptions(
        autoPingInterval=0,
        autoPingTimeout=0,
        openHandshakeTimeout=0,
        closeHandshakeTimeout=0,
    )
