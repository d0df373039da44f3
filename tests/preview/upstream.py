"""
A small web app on a loopback port for the preview door's tests: pages,
a streamed download, an upload counter, an event stream, cookies,
redirects, a head that never comes, and a WebSocket echo with a
subprotocol (autobahn, mounted on the same port as a browser app's HMR is).
"""

from __future__ import annotations

import json
import time
from typing import Any

from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet import reactor
from twisted.internet.interfaces import IPushProducer
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from zope.interface import implementer

PAGE = b"""<!doctype html><html><head><title>app</title></head><body>
<h1 id=title>preview app</h1><div id=ws>-</div><div id=sse>-</div>
<script>
const out = (id, text) => { document.getElementById(id).textContent = text; };
const ws = new WebSocket(`ws://${location.host}/ws`, ["echo.v1"]);
ws.onopen = () => ws.send("ping");
ws.onmessage = (e) => out("ws", "ws:" + e.data + ":" + ws.protocol);
ws.onerror = () => out("ws", "ws:error");
const es = new EventSource("/sse");
es.onmessage = (e) => { out("sse", "sse:" + e.data); es.close(); };
es.onerror = () => out("sse", "sse:error");
</script></body></html>"""


class Page(Resource):
    """``/``: the app's page (its script opens a WebSocket and an EventSource)."""

    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        return PAGE


@implementer(IPushProducer)
class Stream:
    """Writes ``n`` bytes in 64 KiB chunks as fast as the socket takes them."""

    def __init__(self, request: Request, n: int) -> None:
        self.request = request
        self.left = n
        self.paused = False
        self.stopped = False
        request.registerProducer(self, True)
        reactor.callLater(0, self.resumeProducing)

    def resumeProducing(self) -> None:
        self.paused = False
        while not self.paused and not self.stopped and self.left > 0:
            chunk = min(self.left, 65536)
            self.left -= chunk
            self.request.write(b"x" * chunk)
        if self.left == 0 and not self.stopped:
            self.stopped = True
            self.request.unregisterProducer()
            self.request.finish()

    def pauseProducing(self) -> None:
        self.paused = True

    def stopProducing(self) -> None:
        self.stopped = True


class Big(Resource):
    """``/big?n=BYTES``: a download of that size, written with backpressure."""

    isLeaf = True

    def __init__(self, app: App) -> None:
        super().__init__()
        self.app = app

    def render_GET(self, request: Request) -> Any:
        n = int(request.args[b"n"][0])
        request.setHeader(b"content-type", b"application/octet-stream")
        request.setHeader(b"content-length", str(n).encode())
        self.app.streams.append(Stream(request, n))
        return NOT_DONE_YET


class Upload(Resource):
    """``/upload``: how many bytes came, and how they were framed."""

    isLeaf = True

    def render_POST(self, request: Request) -> bytes:
        assert request.content is not None
        data = request.content.read()
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(
            {
                "bytes": len(data),
                "chunked": request.requestHeaders.hasHeader(b"transfer-encoding"),
                "length": (
                    request.requestHeaders.getRawHeaders(b"content-length") or [None]
                )[0].decode()
                if request.requestHeaders.hasHeader(b"content-length")
                else None,
            }
        ).encode()


class Events(Resource):
    """``/sse``: an event at once, then one every 200 ms (written times kept)."""

    isLeaf = True

    def __init__(self, app: App) -> None:
        super().__init__()
        self.app = app

    def render_GET(self, request: Request) -> Any:
        request.setHeader(b"content-type", b"text/event-stream")
        request.setHeader(b"cache-control", b"no-cache")
        count = [0]

        def send() -> None:
            if request.finished or request._disconnected:
                return
            self.app.sse_written.append(time.monotonic())
            request.write(b"data: tick%d\n\n" % count[0])
            count[0] += 1
            if count[0] < 50:
                self.app.timers.append(reactor.callLater(0.2, send))
            else:
                request.finish()

        send()
        return NOT_DONE_YET


class Headers(Resource):
    """``/headers``: the request's headers and target as the app saw them."""

    isLeaf = True

    def render(self, request: Request) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(
            {
                "uri": request.uri.decode(),
                "headers": {
                    k.decode().lower(): [x.decode() for x in v]
                    for k, v in request.requestHeaders.getAllRawHeaders()
                },
            }
        ).encode()


class Cookies(Resource):
    """``/cookies``: two cookies of the app's, ours, and a wider domain's."""

    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        for value in (
            b"a=1; Path=/",
            b"b=2; HttpOnly",
            b"sbx_p_3000=stolen; Path=/",
            b"wide=3; Domain=.localhost",
        ):
            request.responseHeaders.addRawHeader(b"set-cookie", value)
        return b"cookies"


class Redirect(Resource):
    """
    ``/redirect``: to the app's own localhost:PORT, or to ``?to=`` with
    ``PORT`` in it replaced by the app's port (any method).
    """

    isLeaf = True

    def __init__(self, app: App) -> None:
        super().__init__()
        self.app = app

    def render(self, request: Request) -> bytes:
        if request.content is not None:
            request.content.read()
        to = request.args.get(b"to")
        location = (
            to[0].replace(b"PORT", str(self.app.port).encode())
            if to
            else f"http://localhost:{self.app.port}/landed?x=1".encode()
        )
        request.setResponseCode(302)
        request.setHeader(b"location", location)
        return b""


class Slow(Resource):
    """``/slow``: never answers."""

    isLeaf = True

    def render_GET(self, request: Request) -> Any:
        return NOT_DONE_YET


class Echo(WebSocketServerProtocol):
    """Echoes every message, text or binary; picks the ``echo.v1`` subprotocol."""

    def onConnect(self, request: Any) -> Any:
        self.factory.app.ws_headers.append(dict(request.headers))
        return "echo.v1" if "echo.v1" in request.protocols else None

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.sendMessage(payload, isBinary)


class App:
    """The app: one Site on one loopback port."""

    def __init__(self, timeout: float | None = None) -> None:
        self.sse_written: list[float] = []
        self.streams: list[Stream] = []
        self.ws_headers: list[dict[str, str]] = []
        self.timers: list[Any] = []
        root = Resource()
        root.putChild(b"", Page())
        root.putChild(b"big", Big(self))
        root.putChild(b"upload", Upload())
        root.putChild(b"sse", Events(self))
        root.putChild(b"headers", Headers())
        root.putChild(b"cookies", Cookies())
        root.putChild(b"redirect", Redirect(self))
        root.putChild(b"slow", Slow())
        factory = WebSocketServerFactory()
        factory.protocol = Echo
        factory.app = self  # type: ignore[attr-defined]
        factory.setProtocolOptions(
            maxFramePayloadSize=16 * 1024 * 1024,
            maxMessagePayloadSize=16 * 1024 * 1024,
            autoPingInterval=0,
        )
        root.putChild(b"ws", WebSocketResource(factory))
        # ``timeout``: idle connections closed after it (a pooled
        # connection the app drops).
        self.site = Site(root, timeout=timeout or 3600)
        self.port = 0
        self.listening: Any = None

    def listen(self) -> int:
        """Listen on a kernel-chosen loopback port."""
        self.listening = reactor.listenTCP(0, self.site, interface="127.0.0.1")
        self.port = self.listening.getHost().port
        return self.port

    def stop(self) -> Any:
        """Stop listening and drop the connections."""
        for stream in self.streams:
            stream.stopProducing()
        for timer in self.timers:
            if timer.active():
                timer.cancel()
        return self.listening.stopListening()
