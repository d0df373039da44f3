"""
The web console in headless Chromium (Playwright, Debian's Chromium):
what a person opening ``sandboxd ui``'s URL sees and can do, against a real
daemon on loopback.  Each test saves screenshots under
``_trial_temp/console-screenshots/`` for a person to look at.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.threads import blockingCallFromThread, deferToThread

from tests.helpers import DaemonTestCase

CHROMIUM = os.environ.get("SANDBOXD_CHROMIUM", "/usr/bin/chromium")

SKIP_REASON: str | None = None
try:
    import playwright.sync_api  # noqa: F401
except ImportError:
    SKIP_REASON = "Playwright is not installed (pip install -e '.[browser]')"
else:
    if not os.access(CHROMIUM, os.X_OK):
        SKIP_REASON = (
            f"Chromium is not installed at {CHROMIUM} "
            "(scripts/install-test-tools.sh installs it)"
        )

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-proxy-server",
]

TOKEN = "console-admin-token-0123456789"
#: Where screenshots go: ``console-screenshots`` in trial's working
#: directory (``_trial_temp``), set when the first browser starts.
SHOTS = "console-screenshots"


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


POLICY: dict[str, Any] = {
    "groups": {"console": True},
    "auth": {"tokens": [{"id": "admin", "token_sha256": _sha(TOKEN), "scopes": ["*"]}]},
    # sh, not bash: an interactive bash would run the developer's ~/.bashrc.
    "endpoints": {"pty_create_session": {"params": {"shells": ["sh"]}}},
}

#: What the browser's console says about a refused load or script.
CSP_WORDS = ("Content Security Policy", "Refused to")


class ConsoleCase(DaemonTestCase):
    """A daemon with the console on, and a browser driven from a thread."""

    timeout = 180
    skip = SKIP_REASON
    policy = POLICY
    token = TOKEN

    @inlineCallbacks
    def link(self, **body: Any) -> Any:
        """Mint a console link; its URL."""
        reply = yield self.request("POST", "/auth/links", {"audience": "console", **body})
        self.assertEqual(reply.status, 201, reply.body)
        return f"{self.daemon.url}/ui/#link={reply.json()['token']}"

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        """A REST call from the browser's thread (through the reactor)."""
        return blockingCallFromThread(reactor, self.request, method, path, body, **kwargs)

    def on_reactor(self, f: Callable[[], Any]) -> Any:
        """Run ``f`` in the reactor thread and wait for it."""
        return blockingCallFromThread(reactor, f)

    def browse(self, steps: Callable[[Any, dict[str, Any]], None]) -> Any:
        """
        Run ``steps(page, seen)`` in Chromium in a thread; fires with
        ``seen``, which also collects the browser's console messages.
        """

        def run() -> dict[str, Any]:
            from playwright.sync_api import sync_playwright

            seen: dict[str, Any] = {"console": [], "errors": []}
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
                try:
                    page = browser.new_page(viewport={"width": 1200, "height": 760})
                    page.on("console", lambda m: seen["console"].append(f"{m.type}: {m.text}"))
                    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
                    seen["frames"] = []
                    page.on("websocket", lambda ws: ws.on("framereceived", lambda f: seen["frames"].append(f)))
                    try:
                        steps(page, seen)
                    except Exception as e:
                        page.screenshot(path=os.path.join(SHOTS, "failure.png"))
                        dom = page.evaluate("document.querySelector('[data-testid=terminal-area]').innerHTML.slice(0, 3000)")
                        raise AssertionError(f"{e}\nbrowser console: {seen}\n{dom}") from None
                finally:
                    browser.close()
            return seen

        global SHOTS
        SHOTS = os.path.abspath(SHOTS)
        os.makedirs(SHOTS, exist_ok=True)
        return deferToThread(run)

    def assertNoCspViolation(self, seen: dict[str, Any]) -> None:
        """Nothing the page did was refused by its CSP, and no script failed."""
        bad = [m for m in seen["console"] if any(w in m for w in CSP_WORDS)]
        self.assertEqual(bad, [])
        self.assertEqual(seen["errors"], [])


def screen_text(page: Any) -> str:
    """The visible terminal's text."""
    return str(page.evaluate(
        "[...document.querySelectorAll('[data-testid=terminal]')]"
        ".filter(e => !e.hidden).map(e => e.querySelector('.xterm-rows').innerText).join('\\n')"
    ))


def wait_true(page: Any, expression: str, timeout: float = 10.0) -> None:
    """
    Poll ``expression`` in the page until it is true.  (Playwright's
    ``wait_for_function`` compiles its predicate with ``eval``, which the
    console's CSP refuses, as it should.)
    """
    deadline = time.monotonic() + timeout
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"never true: {expression}")
        page.wait_for_timeout(25)


def wait_screen(page: Any, needle: str, timeout: float = 10.0) -> None:
    """Wait until the visible terminal shows ``needle``."""
    deadline = time.monotonic() + timeout
    while needle not in screen_text(page):
        if time.monotonic() > deadline:
            raise AssertionError(f"{needle!r} never shown; screen: {screen_text(page)!r}")
        page.wait_for_timeout(25)


class TerminalTests(ConsoleCase):
    """Terminals in tabs over the same-origin PTY WebSocket."""

    @inlineCallbacks
    def test_type_resize_reload_reconnect(self) -> Any:
        """
        The link leaves the address bar for sessionStorage; a new terminal is
        usable within a second; typing echoes; a smaller window resizes the
        PTY; a reload shows the scrollback once; a cut socket reconnects by
        offset with no line twice; no CSP violation.
        """
        url = yield self.link()
        terminals = self.daemon.context.terminals

        def steps(page: Any, seen: dict[str, Any]) -> None:
            page.goto(url)
            page.wait_for_selector("body[data-ready=true]")
            seen["url"] = page.url
            seen["session_link"] = page.evaluate("sessionStorage.getItem('sandboxd.console.link')")
            seen["local"] = page.evaluate("localStorage.length")
            seen["cookies"] = page.context.cookies()
            started = time.monotonic()
            page.click("[data-testid=terminal-new]")
            page.wait_for_selector("[data-testid=terminal][data-status=connected]")
            seen["first_usable"] = time.monotonic() - started
            page.click("[data-testid=terminal] .xterm")
            page.keyboard.type("echo mark-$((6*7))\n")
            wait_screen(page, "mark-42")
            sid = page.get_attribute("[data-testid=terminal]", "data-session")
            seen["sid"] = sid
            before = self.call("GET", f"/pty/sessions/{sid}").json()
            page.set_viewport_size({"width": 700, "height": 420})
            page.wait_for_timeout(600)
            seen["size_before"] = (before["cols"], before["rows"])
            after = self.call("GET", f"/pty/sessions/{sid}").json()
            seen["size_after"] = (after["cols"], after["rows"])
            seen["xterm_size"] = page.evaluate(
                "(() => { const r = document.querySelector('[data-testid=terminal] .xterm-rows');"
                " return r.children.length; })()"
            )
            page.screenshot(path=os.path.join(SHOTS, "terminal.png"))
            page.set_viewport_size({"width": 1200, "height": 760})
            page.reload()
            page.wait_for_selector("[data-testid=terminal][data-status=connected]")
            wait_screen(page, "mark-42")
            page.wait_for_timeout(300)
            seen["after_reload"] = screen_text(page)
            # Cut every socket from the daemon's side, as a network drop would.
            self.on_reactor(
                lambda: [c.transport.abortConnection() for c in list(terminals.factory.clients)]
            )
            page.wait_for_selector("[data-testid=terminal][data-status=reconnecting]", timeout=5000)
            page.wait_for_selector("[data-testid=terminal][data-status=connected]", timeout=10000)
            page.click("[data-testid=terminal] .xterm")
            page.keyboard.type("echo again-$((2*3))\n")
            wait_screen(page, "again-6")
            page.wait_for_timeout(300)
            seen["after_cut"] = screen_text(page)
            page.screenshot(path=os.path.join(SHOTS, "terminal-reconnected.png"))

        seen = yield self.browse(steps)
        self.assertEqual(seen["url"], f"{self.daemon.url}/ui/")
        self.assertTrue(seen["session_link"].startswith("sbxl_"))
        self.assertEqual(seen["local"], 0)
        self.assertEqual(seen["cookies"], [])
        self.assertLess(seen["first_usable"], 1.0)
        self.assertNotEqual(seen["size_after"], seen["size_before"])
        self.assertLess(seen["size_after"][0], seen["size_before"][0])
        self.assertEqual(seen["after_reload"].count("mark-42"), 1)
        self.assertEqual(seen["after_cut"].count("mark-42"), 1)
        self.assertEqual(seen["after_cut"].count("again-6"), 1)
        self.assertNoCspViolation(seen)
        self.first_usable = seen["first_usable"]
