"""
The preview door in headless Chromium (Playwright, Debian's Chromium): a
link opens the page, the link is gone from the address bar, the page's own
WebSocket and EventSource work on the door's cookie alone, and another
port's page cannot use that cookie; in path mode, a labelled exposure's
link opens it.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.threads import blockingCallFromThread, deferToThread
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from twisted.web.static import Data

from tests.chromium import SKIP_REASON, chromium_page
from tests.preview.test_door import DoorCase, free_port
from tests.preview.upstream import App


class BrowserTests(DoorCase):
    """A real browser through the door."""

    timeout = 120
    skip = SKIP_REASON

    @inlineCallbacks
    def test_link_page_websocket_eventsource(self) -> None:
        """Everything a person opening a preview link needs, and no cookie for another port."""
        other = App()
        other_port = other.listen()
        self.addCleanup(other.stop)
        yield self.expose()
        yield self.expose(port=other_port)
        minted = yield self.request("POST", f"/preview/ports/{self.app_port}/link", {})
        url = minted.json()["url"]
        home = f"http://{self.host()}/"
        other_home = f"http://{self.host(other_port)}/"

        def browse() -> dict[str, Any]:
            seen: dict[str, Any] = {}
            with chromium_page() as page:
                page.goto(url)
                seen["url"] = page.url
                page.wait_for_function(
                    "document.getElementById('ws').textContent.startsWith('ws:')"
                    " && document.getElementById('sse').textContent.startsWith('sse:')",
                    timeout=20000,
                )
                seen["ws"] = page.text_content("#ws")
                seen["sse"] = page.text_content("#sse")
                seen["document_cookie"] = page.evaluate("document.cookie")
                seen["cookies"] = page.context.cookies()
                response = page.goto(other_home)
                seen["other_status"] = response.status if response else None
            return seen

        seen = yield deferToThread(browse)
        self.assertEqual(seen["url"], home)
        self.assertEqual(seen["ws"], "ws:ping:echo.v1")
        self.assertEqual(seen["sse"], "sse:tick0")
        self.assertNotIn("sbx_p_", seen["document_cookie"])
        ours = [c for c in seen["cookies"] if c["name"] == f"sbx_p_{self.app_port}"]
        self.assertEqual(len(ours), 1)
        self.assertTrue(ours[0]["httpOnly"])
        self.assertEqual(ours[0]["domain"], f"{self.app_port}.localhost")
        self.assertEqual(seen["other_status"], 401)


class PathModeBrowserTests(DoorCase):
    """A real browser through the door in path mode (one host name for every preview)."""

    timeout = 120
    skip = SKIP_REASON
    autostart = False

    @inlineCallbacks
    def test_labelled_link_opens_the_app(self) -> None:
        """
        The link handed out for a labelled exposure behind a path-style
        public URL opens the app; the door's cookie is scoped to the
        label's prefix and carries the page's next requests.
        """
        port = free_port()
        public = f"http://127.0.0.1:{port}"
        yield self.start_on_a_fixed_port(port, preview_public_url=public)
        made = yield self.expose(label="web")
        self.assertEqual(made.status, 201, made.body)
        minted = yield self.request("POST", f"/preview/ports/{self.app_port}/link", {})
        url = minted.json()["url"]
        home = f"{public}/p/{self.app_port}-web/"

        def browse() -> dict[str, Any]:
            seen: dict[str, Any] = {}
            with chromium_page() as page:
                response = page.goto(url)
                seen["status"] = response.status if response else None
                seen["url"] = page.url
                seen["title"] = page.evaluate(
                    "document.getElementById('title')?.textContent ?? null"
                )
                seen["cookies"] = page.context.cookies()
                response = page.goto(home + "headers")
                seen["headers_status"] = response.status if response else None
                seen["headers"] = page.text_content("body")
            return seen

        seen = yield deferToThread(browse)
        self.assertEqual((seen["status"], seen["url"]), (200, home))
        self.assertEqual(seen["title"], "preview app")
        ours = [c for c in seen["cookies"] if c["name"] == f"sbx_p_{self.app_port}"]
        self.assertEqual([c["path"] for c in ours], [f"/p/{self.app_port}-web/"])
        self.assertEqual(seen["headers_status"], 200, seen["headers"])
        self.assertIn('"uri": "/headers"', seen["headers"])

    @inlineCallbacks
    def test_root_without_slash_and_no_console_errors(self) -> None:
        """
        After a link opened a preview in path mode, ``/p/PORT`` and
        ``/p/PORT?x=1`` (no trailing slash: typed, bookmarked, or the
        app's own link) land on the preview at ``/p/PORT/`` with the query
        kept, not on a 401; the browser's own request for the door's
        ``/favicon.ico`` is answered 204, no error in the page's console.
        """
        port = free_port()
        yield self.start_on_a_fixed_port(port)
        yield self.expose()
        minted = yield self.request("POST", f"/preview/ports/{self.app_port}/link", {})
        root = f"http://localhost:{port}/p/{self.app_port}"
        link = minted.json()["token"]

        def browse() -> dict[str, Any]:
            seen: dict[str, Any] = {"console": []}
            with chromium_page() as page:
                # (The test app's page also opens ``/sse`` and ``/ws`` from
                # the door's root, an app not written for path mode: those
                # errors are the app's.)
                page.on(
                    "console",
                    lambda m: (
                        seen["console"].append(f"{m.text} {m.location}")
                        if m.type == "error"
                        else None
                    ),
                )
                page.goto(f"{root}/?sbx_link={link}")
                for url in (root, f"{root}?x=1"):
                    answer = page.goto(url)
                    seen[url] = (
                        answer.status if answer else None,
                        page.url,
                        page.evaluate(
                            "document.getElementById('title')?.textContent ?? null"
                        ),
                    )
                for _ in range(40):  # the icon is asked for after the load
                    if blockingCallFromThread(reactor, self.icons):
                        break
                    page.wait_for_timeout(50)
            return seen

        seen = yield deferToThread(browse)
        self.assertEqual(seen[root], (200, f"{root}/", "preview app"))
        self.assertEqual(seen[f"{root}?x=1"], (200, f"{root}/?x=1", "preview app"))
        self.assertNotEqual(self.icons(), [])
        self.assertEqual(set(self.icons()), {204})
        self.assertEqual([m for m in seen["console"] if "favicon" in m], [])

    def icons(self) -> list[int]:
        """The statuses the door answered ``/favicon.ico`` with (its audit lines)."""
        return [
            r["status"]
            for r in self.audit_lines()
            if r.get("via") == "preview" and r.get("path") == "/favicon.ico"
        ]


class _Ticks(Resource):
    """``/ticks``: an event stream, an event every 200 ms, until the app goes down."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.open: list[Request] = []
        self.timers: dict[Request, Any] = {}

    def render_GET(self, request: Request) -> Any:
        request.setHeader(b"content-type", b"text/event-stream")
        self.open.append(request)
        count = [0]

        def send() -> None:
            if request.finished or request._disconnected:  # type: ignore[attr-defined]
                return
            request.write(b"data: %d\n\n" % count[0])
            count[0] += 1
            self.timers[request] = reactor.callLater(0.2, send)

        send()
        return NOT_DONE_YET


class RestartingApp:
    """An app on a fixed port that can go down (connections cut) and come back."""

    def __init__(self) -> None:
        root = Resource()
        root.putChild(b"", Data(b"<!doctype html><title>app</title>", "text/html"))
        self.ticks = _Ticks()
        root.putChild(b"ticks", self.ticks)
        self.site = Site(root)
        self.listening: Any = reactor.listenTCP(0, self.site, interface="127.0.0.1")
        self.port: int = self.listening.getHost().port

    def down(self) -> Any:
        """Stop listening and cut every open stream, as a killed dev server does."""
        for timer in self.ticks.timers.values():
            if timer.active():
                timer.cancel()
        self.ticks.timers.clear()
        for request in self.ticks.open:
            if request.transport is not None:
                request.transport.abortConnection()
        self.ticks.open.clear()
        listening, self.listening = self.listening, None
        return listening.stopListening() if listening is not None else None

    def up(self) -> None:
        """Listen again on the same port."""
        self.listening = reactor.listenTCP(self.port, self.site, interface="127.0.0.1")


class EventSourceRestartTests(DoorCase):
    """A page's EventSource through the door outlives its app restarting."""

    timeout = 120
    skip = SKIP_REASON

    @inlineCallbacks
    def test_eventsource_reconnects_after_a_restart(self) -> None:
        """
        While the app is down, the page's EventSource keeps trying
        (CONNECTING, not CLOSED, as it does talking to the app directly);
        once the app listens again, events flow with no reload.
        """
        app = RestartingApp()
        self.addCleanup(app.down)
        yield self.expose(port=app.port)
        minted = yield self.request("POST", f"/preview/ports/{app.port}/link", {})
        url = minted.json()["url"]

        def browse() -> dict[str, Any]:
            seen: dict[str, Any] = {}
            with chromium_page() as page:
                page.goto(url)
                page.evaluate(
                    "window.got = 0; window.es = new EventSource('/ticks');"
                    "window.es.onmessage = () => { window.got += 1; };"
                )
                page.wait_for_function("window.got >= 2", timeout=20000)
                blockingCallFromThread(reactor, app.down)
                # Chromium retries a dropped stream after 3 s: by 6 s it has
                # met the door's answer for an app that is down.
                page.wait_for_timeout(6000)
                seen["down"] = page.evaluate("window.es.readyState")
                before = page.evaluate("window.got")
                blockingCallFromThread(reactor, app.up)
                try:
                    page.wait_for_function(f"window.got > {before}", timeout=15000)
                except Exception as e:  # Playwright's TimeoutError
                    seen["error"] = str(e).splitlines()[0]
                seen["after"] = page.evaluate("window.es.readyState")
            return seen

        seen = yield deferToThread(browse)
        self.assertEqual(seen["down"], 0, "CONNECTING while the app is down")
        self.assertNotIn("error", seen)
        self.assertEqual(seen["after"], 1)
