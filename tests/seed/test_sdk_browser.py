"""
The seed SDK's ``server.browser`` against a real daemon, its Playwright
worker and Debian's Chromium, through the async and the sync face.

No control run here: the seed's server refuses loopback URLs with no
switch, and its browser does not survive its first call.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.browser.test_browser import (
    SKIP_REASON,
    browser_start_room,
    png_size,
    serve_pages,
)
from tests.browser.test_supervisor import SlowChromium
from tests.seed.harness import SeedCase
from tests.seed.sdkcase import Face, outcome


async def browser_scenario(c: Any, site: str, call: Face) -> dict[str, Any]:
    """Every ``server.browser`` method, and its usual failures."""
    b = c.browser
    out: dict[str, Any] = {}
    out["navigate"] = await outcome(call(b.navigate, site + "/page"))
    out["content"] = await outcome(call(b.content, "text"))
    out["type"] = await outcome(call(b.type, "#name", "Ada"))
    out["type_more"] = await outcome(call(b.type, "#name", "Lovelace"))
    out["value_added"] = await call(b.evaluate, "document.getElementById('name').value")
    out["type_clear"] = await outcome(call(b.type, "#name", "Bob", clear=True))
    out["value_cleared"] = await call(
        b.evaluate, "document.getElementById('name').value"
    )
    out["click"] = await outcome(call(b.click, "#go"))
    out["evaluate"] = await outcome(
        call(b.evaluate, "document.getElementById('title').textContent")
    )
    out["png"] = await outcome(call(b.screenshot))
    out["jpeg"] = await outcome(call(b.screenshot, format="jpeg", full_page=False))
    out["element"] = await outcome(call(b.screenshot, selector="#go"))
    out["pdf"] = await outcome(call(b.pdf))
    out["console"] = await outcome(call(b.console))
    out["missing"] = await outcome(call(b.click, "#nope", timeout=300))
    out["throws"] = await outcome(call(b.evaluate, "() => { throw new Error('no') }"))
    return out


class BrowserTests(SeedCase):
    """``server.browser`` gives the SDK's typed results and exceptions."""

    skip = SKIP_REASON
    policy = {"groups": {"browser": True}}

    def setUp(self) -> Any:
        browser_start_room(self)
        return super().setUp()

    @inlineCallbacks
    def check_face(self, sync: bool) -> Any:
        from agent_sandbox.models.errors import CommandTimeoutError, ServerAPIError
        from agent_sandbox.models.server import BrowserContent, BrowserPage

        site = serve_pages(self)
        out = yield self.drive(lambda c: browser_scenario(c, site, Face(sync)))
        self.assertIsInstance(out["navigate"], BrowserPage)
        self.assertEqual(
            (out["navigate"].url, out["navigate"].title, out["navigate"].status),
            (site + "/page", "Test page", 200),
        )
        self.assertIsInstance(out["content"], BrowserContent)
        self.assertIn("Hello", out["content"].content)
        self.assertEqual(
            out["type"], {"typed": True, "selector": "#name", "text": "Ada"}
        )
        self.assertEqual(out["value_added"], "AdaLovelace")
        self.assertEqual(out["value_cleared"], "Bob")
        self.assertEqual(out["click"], {"clicked": True, "selector": "#go"})
        self.assertEqual(out["evaluate"], "Hi Bob")
        # The SDK asks for the full page by default: taller than the viewport.
        self.assertGreater(png_size(out["png"])[1], 720)
        self.assertEqual(out["jpeg"][:3], b"\xff\xd8\xff")
        self.assertEqual(png_size(out["element"])[0], 120)
        self.assertTrue(out["pdf"].startswith(b"%PDF-"))
        self.assertIn(
            ("log", "clicked Bob"), [(e["type"], e["text"]) for e in out["console"]]
        )
        self.assertIsInstance(out["missing"], CommandTimeoutError)
        self.assertIsInstance(out["throws"], ServerAPIError)

    def test_async(self) -> Any:
        """Every browser method through the async face."""
        return self.check_face(sync=False)

    def test_sync(self) -> Any:
        """The same through the ``*_sync`` face."""
        return self.check_face(sync=True)


class SlowStartTests(SeedCase):
    """``server.browser`` when Chromium does not start within the policy's time."""

    skip = SlowChromium.skip
    policy = SlowChromium.door_policy

    def setUp(self) -> Any:
        self.chromium = SlowChromium(self)
        return super().setUp()

    @inlineCallbacks
    def test_start_past_its_time(self) -> Any:
        """
        The SDK raises its ``ServerAPIError`` with status 503 and code
        ``unavailable`` (not a command timeout: the call never ran), and
        nothing of the browser is left running.
        """
        from agent_sandbox.models.errors import CommandTimeoutError, ServerAPIError

        error = yield self.drive(lambda c: outcome(c.browser.evaluate("1")))
        self.assertIsInstance(error, ServerAPIError)
        self.assertNotIsInstance(error, CommandTimeoutError)
        self.assertEqual((error.status_code, error.error_code), (503, "unavailable"))
        left = yield self.chromium.left_running()
        self.assertEqual(left, [])
