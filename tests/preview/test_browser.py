"""
The preview door in headless Chromium (Playwright, Debian's Chromium): a
link opens the page, the link is gone from the address bar, the page's own
WebSocket and EventSource work on the door's cookie alone, and another
port's page cannot use that cookie.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.internet.threads import deferToThread

from tests.chromium import SKIP_REASON, chromium_page
from tests.preview.test_door import DoorCase
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
