"""
One browser connection kept alive across changes: the door remembers the
last request's header lines and what it worked out from them, and what a
client sees must be as if it had not: an unexposed port, a new policy, a
new exposure or a changed header takes effect on the very next request
of the same connection.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.threads import deferToThread

from tests.preview.test_channel import get, responses
from tests.preview.test_door import POLICY, TOKEN, DoorCase
from tests.preview.test_rawpool import ScriptedApp


class Browser:
    """One kept-alive connection to the door, used from a thread."""

    def __init__(self, port: int) -> None:
        self.socket = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""

    def ask(self, head: bytes) -> tuple[int, dict[str, str], bytes]:
        """Send one request head; its answer (framed by its length)."""
        self.socket.sendall(head)
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end >= 0:
                lines = self.buffer[:end].decode("latin-1").split("\r\n")
                fields = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:])
                }
                size = end + 4 + int(fields.get("content-length", "0"))
                if len(self.buffer) >= size:
                    raw, self.buffer = self.buffer[:size], self.buffer[size:]
                    return responses(raw)[0]
            chunk = self.socket.recv(65536)
            if not chunk:
                raise ConnectionError("the door closed the connection")
            self.buffer += chunk

    def close(self) -> None:
        self.socket.close()


class KeptAliveTests(DoorCase):
    """What changes between two requests on one connection shows on the second."""

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        self.scripted = yield self.serve(ScriptedApp(), public=True)
        self.browser = yield deferToThread(Browser, self.door_port)
        self.addCleanup(self.browser.close)

    def ask(self, *extra: str) -> Any:
        """``GET /length`` on the kept-alive connection (in a thread)."""
        head = get("/length", self.host(self.scripted.port), *extra)
        return deferToThread(self.browser.ask, head)

    @inlineCallbacks
    def test_unexposed_between_requests(self) -> None:
        """
        The port is unexposed between two identical requests on one
        connection: the second is 404 ``port_not_exposed``, never the app.
        """
        status, _, body = yield self.ask()
        self.assertEqual((status, body), (200, b"hello"))
        gone = yield self.request("DELETE", f"/preview/ports/{self.scripted.port}")
        self.assertEqual(gone.status, 200, gone.body)
        # (Told to a caller who logs in: a stranger gets the 401 any port
        # not exposed to it does.)
        status, _, body = yield self.ask(f"X-Access-Token: {TOKEN}")
        self.assertEqual(status, 404)
        self.assertEqual(json.loads(body)["code"], "port_not_exposed")
        self.assertEqual(len(self.scripted.heads), 1)

    @inlineCallbacks
    def test_exposed_again_preserving_the_host(self) -> None:
        """
        The port is exposed again with ``host_header: preserve`` between
        two identical requests: the app gets the browser's Host on the
        second (the first one's request head is not reused).
        """
        status, _, _ = yield self.ask()
        self.assertEqual(status, 200)
        reply = yield self.expose(
            port=self.scripted.port, public=True, host_header="preserve"
        )
        self.assertEqual(reply.status, 201, reply.body)
        status, _, _ = yield self.ask()
        self.assertEqual(status, 200)
        hosts = [
            line
            for head in self.scripted.heads
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"host:")
        ]
        self.assertEqual(
            hosts,
            [
                b"Host: localhost:%d" % self.scripted.port,
                b"Host: " + self.host(self.scripted.port).encode(),
            ],
        )

    @inlineCallbacks
    def test_changed_header_reaches_the_app(self) -> None:
        """
        Three requests on one connection, the second with a header value
        changed and the third as the first: the app sees each as sent,
        and the door's cookie in none of them.
        """
        cookie = f"sbx_p_{self.scripted.port}=secret"
        for value in ("one", "two", "one"):
            status, _, body = yield self.ask(f"Cookie: app={value}; {cookie}")
            self.assertEqual((status, body), (200, b"hello"))
        cookies = [
            line
            for head in self.scripted.heads
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"cookie:")
        ]
        self.assertEqual(
            cookies, [b"Cookie: app=one", b"Cookie: app=two", b"Cookie: app=one"]
        )

    @inlineCallbacks
    def test_rules_on_every_answer(self) -> None:
        """
        The app gives the same head twice on one connection, with cookies
        and a ``Location``: both answers reach the browser with the app's
        own cookie only and the ``Location`` rewritten to the door; a
        plain answer repeated is relayed whole each time.
        """
        host = self.host(self.scripted.port)
        for path in ("/cookie", "/length", "/cookie", "/length", "/length"):
            head = get(path, host)
            status, fields, body = yield deferToThread(self.browser.ask, head)
            self.assertEqual(status, 200)
            if path == "/length":
                self.assertEqual(body, b"hello")
                continue
            self.assertEqual(fields["set-cookie"], "app=1; Path=/")
            self.assertEqual(fields["location"], f"http://{host}/next")
        self.assertEqual(len(self.scripted.connections), 1)

    @inlineCallbacks
    def test_repeated_lines_behind_a_bad_request_line(self) -> None:
        """
        The header lines of a good request repeated behind a request line
        the parser refuses (a space in the target) are refused as a JSON
        400, as on a fresh connection; the app sees only the good one.
        """
        host = self.host(self.scripted.port)
        status, _, _ = yield self.ask()
        self.assertEqual(status, 200)
        bad = get("/length x", host)
        raw, _ = yield deferToThread(self._send_and_read_to_close, bad)
        (status, _, body), *_ = responses(raw)
        self.assertEqual(status, 400)
        self.assertEqual(json.loads(body)["code"], "malformed_request")
        self.assertEqual(len(self.scripted.heads), 1)

    def _send_and_read_to_close(self, data: bytes) -> tuple[bytes, None]:
        """Send ``data`` on the kept-alive connection; read until the door closes it."""
        sock = self.browser.socket
        sock.sendall(data)
        out = self.browser.buffer
        while chunk := sock.recv(65536):
            out += chunk
        return out, None


class KeptAliveReloadTests(DoorCase):
    """A new policy between two requests on one connection."""

    autostart = False

    @inlineCallbacks
    def test_policy_change_between_requests(self) -> None:
        """
        A reload that denies the port between two identical requests on
        one kept-alive connection: the second is 403 ``port_not_allowed``
        naming the rule; a reload that allows it again lets the third
        through.
        """
        scripted = ScriptedApp()
        listening = reactor.listenTCP(0, scripted, interface="127.0.0.1")
        self.addCleanup(listening.stopListening)
        scripted.port = listening.getHost().port
        path = os.path.join(self.base_dir, "policy.json")

        def write(deny: list[int]) -> None:
            group = {"params": {"deny_ports": deny}}
            with open(path, "w") as f:
                json.dump(
                    {
                        **POLICY,
                        "endpoints": {**POLICY["endpoints"], "group:preview": group},
                    },
                    f,
                )

        write([])
        yield self.start_on_a_fixed_port(policy=None, policy_file=path)
        reply = yield self.expose(port=scripted.port, public=True)
        self.assertEqual(reply.status, 201, reply.body)
        browser = yield deferToThread(Browser, self.door_port)
        self.addCleanup(browser.close)
        head = get("/length", self.host(scripted.port))
        status, _, _ = yield deferToThread(browser.ask, head)
        self.assertEqual(status, 200)
        write([scripted.port])
        self.assertTrue(self.daemon.daemon.reload())
        status, _, body = yield deferToThread(browser.ask, head)
        self.assertEqual(status, 403)
        self.assertEqual(json.loads(body)["code"], "port_not_allowed")
        write([])
        self.assertTrue(self.daemon.daemon.reload())
        status, _, body = yield deferToThread(browser.ask, head)
        self.assertEqual((status, body), (200, b"hello"))
        self.assertEqual(len(scripted.heads), 2)
