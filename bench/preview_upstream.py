#!/usr/bin/env python3
"""
The app behind the preview bench's SSE and WebSocket cases: ``/sse``
answers one event at once and then stays open; ``/ws`` echoes every
message (autobahn, as the daemon's own PTY door uses).

    .venv/bin/python bench/preview_upstream.py PORT
"""

from __future__ import annotations

import sys
from typing import Any

from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet import reactor
from twisted.internet.endpoints import serverFromString
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site


class Events(Resource):
    """One event at once, then nothing until the client leaves."""

    isLeaf = True

    def render_GET(self, request: Request) -> Any:
        request.setHeader(b"content-type", b"text/event-stream")
        request.setHeader(b"cache-control", b"no-cache")
        request.write(b"data: first\n\n")
        return NOT_DONE_YET


class Echo(WebSocketServerProtocol):
    """Echoes every message."""

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.sendMessage(payload, isBinary)  # type: ignore[no-untyped-call]


def main() -> None:
    root = Resource()
    root.putChild(b"sse", Events())  # type: ignore[no-untyped-call]
    factory = WebSocketServerFactory()
    factory.protocol = Echo
    factory.setProtocolOptions(autoPingInterval=0)
    root.putChild(b"ws", WebSocketResource(factory))
    endpoint = serverFromString(reactor, f"tcp:{int(sys.argv[1])}:interface=127.0.0.1")
    endpoint.listen(Site(root))
    reactor.run()


if __name__ == "__main__":
    main()
