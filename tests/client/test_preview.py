# -*- test-case-name: tests.client.test_preview -*-
"""
``sb.links`` and ``sb.preview`` against a real daemon with its preview
door and a real app on loopback, through both clients: a link minted,
listed and revoked; a port exposed, listed, opened in a "browser" with a
link, and unexposed.
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlsplit

import httpx
from twisted.internet.defer import inlineCallbacks

from sandboxd.client import NotFound, PortNotExposed
from tests.client.base import ClientCase
from tests.preview.upstream import App

TOKEN = "client-preview-token-0123456789"

POLICY: dict[str, Any] = {
    "groups": {"preview": True},
    "auth": {
        "tokens": [
            {
                "id": "admin",
                "token_sha256": hashlib.sha256(TOKEN.encode()).hexdigest(),
                "scopes": ["*"],
            }
        ]
    },
}


def _through_door(door_port: int, url: str, token: str | None) -> httpx.Response:
    """GET ``url`` the way a browser would, sent to the door on loopback."""
    parts = urlsplit(url)
    headers = {"Host": parts.netloc}
    if token is not None:
        headers["X-Access-Token"] = token
    with httpx.Client(trust_env=False, timeout=10) as client:
        return client.get(
            f"http://127.0.0.1:{door_port}{parts.path or '/'}", headers=headers
        )


class LinksAndPreviewTests(ClientCase):
    """Capability links and previews, blocking and asyncio."""

    policy = POLICY
    token = TOKEN

    @inlineCallbacks
    def setUp(self) -> Any:
        self.app = App(None)
        self.app_port = self.app.listen()
        self.addCleanup(self.app.stop)
        yield super().setUp()
        self.door_port = self.daemon.context.preview.door_port

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        kwargs.setdefault("preview_port", "tcp:0:interface=127.0.0.1")
        return super().start(stop_at_end, **kwargs)

    def test_links_sync(self) -> Any:
        """A minted link is listed, then listed as revoked; an unknown id is NotFound."""
        sb = self.sandbox()

        def body() -> None:
            link = sb.links.mint("console", ttl_seconds=60, uses=3)
            self.assertTrue(link["token"].startswith("sbxl_"))
            self.assertEqual(link["audience"], "console")
            listed = {each["link_id"]: each for each in sb.links.list()}
            self.assertEqual(listed[link["link_id"]]["uses"], 3)
            revoked = sb.links.revoke(link["link_id"])
            self.assertTrue(revoked["revoked"])
            listed = {each["link_id"]: each for each in sb.links.list()}
            self.assertTrue(listed.get(link["link_id"], {"revoked": True})["revoked"])
            with self.assertRaises(NotFound):
                sb.links.revoke("no-such-link")

        return self.in_thread(body)

    def test_preview_sync(self) -> Any:
        """
        An exposed port is listed with its URL; that URL, opened with the
        preview link's token, serves the app; without one it does not;
        once unexposed, the port is PortNotExposed.
        """
        sb = self.sandbox()

        def body() -> None:
            exposed = sb.preview.expose(self.app_port, label="web")
            self.assertEqual(exposed["port"], self.app_port)
            self.assertIn(f"{self.app_port}-web", exposed["url"])
            self.assertEqual(sb.preview.url(self.app_port), exposed["url"])
            ports = {each["port"]: each for each in sb.preview.list()}
            self.assertTrue(ports[self.app_port]["listening"])
            link = sb.preview.link(self.app_port, ttl_seconds=60)
            self.assertEqual(link["audience"], f"preview:{self.app_port}")
            page = _through_door(self.door_port, exposed["url"], link["token"])
            self.assertEqual(page.status_code, 200)
            self.assertIn(b"preview app", page.content)
            refused = _through_door(self.door_port, exposed["url"], None)
            self.assertNotEqual(refused.status_code, 200)
            gone = sb.preview.unexpose(self.app_port)
            self.assertEqual(gone["port"], self.app_port)
            with self.assertRaises(PortNotExposed):
                sb.preview.get(self.app_port)

        return self.in_thread(body)

    def test_links_and_preview_async(self) -> Any:
        """The same calls as coroutines, with the same answers."""

        async def body() -> None:
            async with self.async_sandbox() as sb:
                exposed = await sb.preview.expose(self.app_port, public=False)
                self.assertEqual(await sb.preview.url(self.app_port), exposed["url"])
                link = await sb.links.mint(f"preview:{self.app_port}", ttl_seconds=60)
                self.assertIn(
                    link["link_id"], [x["link_id"] for x in await sb.links.list()]
                )
                self.assertEqual(
                    (await sb.links.revoke(link["link_id"]))["revoked"], True
                )
                self.assertIn(
                    self.app_port, [x["port"] for x in await sb.preview.list()]
                )
                await sb.preview.unexpose(self.app_port)
                with self.assertRaises(PortNotExposed):
                    await sb.preview.get(self.app_port)

        return self.in_loop(body)
