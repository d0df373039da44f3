"""
The web console's files at ``/ui/``: off unless the ``console`` group is
on; a page with no inline script under the strict CSP; versioned assets
that are immutable, and another version's asset is 404.
"""

from __future__ import annotations

import re

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.testing import MemoryDaemon
from sandboxd.webui.assets import CSP, read

ON = {"groups": {"console": True}}


class AssetTests(SynchronousTestCase):
    """What a browser fetching the console gets."""

    def test_off_by_default(self) -> None:
        """Without the console group, /ui/ is the disabled endpoint's 404."""
        reply = MemoryDaemon().request("GET", "/ui/")
        self.assertEqual(reply.status, 404)
        self.assertEqual(reply.json()["code"], "endpoint_disabled")

    def test_page(self) -> None:
        """The page needs no token, carries the CSP exactly, is never cached, and has no inline script."""
        reply = MemoryDaemon(ON, token="t").request("GET", "/ui/", token=None)
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.header("content-security-policy"), CSP)
        self.assertIn("default-src 'none'", CSP)
        self.assertIn("script-src 'self';", CSP)
        self.assertIn("frame-ancestors 'none'", CSP)
        self.assertEqual(reply.header("cache-control"), "no-cache")
        self.assertEqual(reply.header("x-content-type-options"), "nosniff")
        self.assertTrue(reply.header("content-type").startswith("text/html"))
        page = reply.body.decode()
        scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, re.S)
        self.assertTrue(scripts)
        for attributes, body in scripts:
            self.assertIn("src=", attributes)
            self.assertEqual(body.strip(), "")
        self.assertNotRegex(page, r"\son[a-z]+=")  # no inline handlers
        self.assertIn(f"/ui/{read().version}/app.js", page)

    def test_versioned_immutable(self) -> None:
        """An asset under the current version is immutable with an ETag; 304 when it matches."""
        daemon = MemoryDaemon(ON)
        version = read().version
        reply = daemon.request("GET", f"/ui/{version}/xterm.mjs")
        self.assertEqual(reply.status, 200)
        self.assertIn("immutable", reply.header("cache-control"))
        self.assertTrue(reply.header("content-type").startswith("text/javascript"))
        self.assertEqual(reply.header("content-security-policy"), CSP)
        again = daemon.request(
            "GET",
            f"/ui/{version}/xterm.mjs",
            headers={"If-None-Match": reply.header("etag")},
        )
        self.assertEqual(again.status, 304)
        self.assertEqual(again.body, b"")

    def test_other_version(self) -> None:
        """Another version's asset, or an unknown name, is 404 (never a mix of versions)."""
        daemon = MemoryDaemon(ON)
        self.assertEqual(
            daemon.request("GET", "/ui/v0.0.0-00000000/app.js").status, 404
        )
        version = read().version
        self.assertEqual(daemon.request("GET", f"/ui/{version}/nope.js").status, 404)
        self.assertEqual(daemon.request("GET", f"/ui/{version}/index.html").status, 404)

    def test_size_budget(self) -> None:
        """Everything the console loads stays under 500 KB before compression."""
        assets = read()
        total = len(assets.page.body) + sum(
            len(a.body)
            for name, a in assets.files.items()
            if not name.endswith((".LICENSE", ".json"))
        )
        self.assertLess(total, 500_000)
