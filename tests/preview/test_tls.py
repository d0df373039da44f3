"""
The preview door over TLS (``--preview-port ssl:…``): a page, an event
stream and a WebSocket work through the door's own channel as they do in
the clear, with the door's cookie marked ``Secure``.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import time
import urllib.parse
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.internet.threads import deferToThread

from tests.git.remote import make_ca
from tests.preview.test_door import TOKEN, DoorCase


class TlsDoorTests(DoorCase):
    """The door listening with TLS."""

    autostart = False
    timeout = 120

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        directory = os.path.realpath(self.mktemp())
        os.makedirs(directory)
        self.ca, cert, key = make_ca(directory)
        yield self.start(
            preview_port=(f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}")
        )
        self.door = self.daemon.context.preview
        self.door_port = self.door.door_port
        self.context = ssl.create_default_context(cafile=self.ca)
        reply = yield self.expose()
        self.assertEqual(reply.status, 201, reply.body)

    def https(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "localhost", self.door_port, timeout=30, context=self.context
        )

    @inlineCallbacks
    def test_urls_handed_out_are_https(self) -> None:
        """
        The exposure's URL and a link's URL are ``https``, as the door
        listens: opened as given, the link sets the door's cookie (the
        link's 303) rather than meeting a TLS door spoken to in the clear.
        """
        exposed = yield self.request("GET", f"/preview/ports/{self.app_port}")
        url = exposed.json()["url"]
        self.assertEqual(url, f"https://{self.app_port}.localhost:{self.door_port}/")
        minted = yield self.request("POST", f"/preview/ports/{self.app_port}/link", {})
        link_url = minted.json()["url"]
        self.assertTrue(link_url.startswith(url + "?sbx_link="), link_url)

        def open_as_given() -> tuple[int, str]:
            parts = urllib.parse.urlsplit(link_url)
            assert parts.scheme == "https", link_url
            c = self.https()
            c.request(
                "GET", f"{parts.path}?{parts.query}", headers={"Host": parts.netloc}
            )
            r = c.getresponse()
            r.read()
            c.close()
            return r.status, r.getheader("set-cookie") or ""

        status, cookie = yield deferToThread(open_as_given)
        self.assertEqual(status, 303)
        self.assertIn("Secure", cookie)

    @inlineCallbacks
    def test_pages_on_one_connection(self) -> None:
        """Three GETs on one kept-alive TLS connection, each answered whole."""

        def browse() -> list[tuple[int, bytes]]:
            c = self.https()
            out = []
            for path in ("/", "/headers", "/"):
                c.request(
                    "GET", path, headers={"Host": self.host(), "X-Access-Token": TOKEN}
                )
                r = c.getresponse()
                out.append((r.status, r.read()))
            c.close()
            return out

        got = yield deferToThread(browse)
        self.assertEqual([status for status, _ in got], [200, 200, 200])
        self.assertIn(b"preview app", got[0][1])
        self.assertEqual(got[0], got[2])
        seen = json.loads(got[1][1])["headers"]
        self.assertNotIn("x-access-token", seen)
        self.assertEqual(seen["x-forwarded-proto"], ["https"])

    @inlineCallbacks
    def test_event_stream(self) -> None:
        """An event stream's first event arrives at once, chunked, over TLS."""

        def first_event() -> tuple[int, str, float]:
            c = self.https()
            started = time.monotonic()
            c.request(
                "GET",
                "/sse",
                headers={"Host": self.host(), "X-Access-Token": TOKEN},
            )
            r = c.getresponse()
            line = r.fp.readline()
            while line and not line.startswith(b"data:"):
                line = r.fp.readline()
            took = time.monotonic() - started
            c.close()
            return r.status, line.decode(), took

        status, line, took = yield deferToThread(first_event)
        self.assertEqual(status, 200)
        self.assertTrue(line.startswith("data:"), line)
        self.assertLess(took, 5.0)
        self.assertLess(time.monotonic() - self.app.sse_written[0], 5.0)

    @inlineCallbacks
    def test_websocket(self) -> None:
        """A WebSocket over TLS echoes, its subprotocol the app's choice."""

        def talk() -> tuple[str | None, str]:
            import websocket

            ws = websocket.create_connection(
                f"wss://localhost:{self.door_port}/ws",
                host=self.host(),
                header=[f"X-Access-Token: {TOKEN}"],
                subprotocols=["echo.v1"],
                sslopt={"ca_certs": self.ca},
                timeout=30,
            )
            try:
                ws.send("hello over tls")
                return ws.subprotocol, ws.recv()
            finally:
                ws.close()

        subprotocol, text = yield deferToThread(talk)
        self.assertEqual((subprotocol, text), ("echo.v1", "hello over tls"))


try:
    import cryptography  # noqa: F401
except ImportError:  # pragma: no cover (a dependency missing)
    TlsDoorTests.skip = "the cryptography package is not installed (to make a test CA)"
