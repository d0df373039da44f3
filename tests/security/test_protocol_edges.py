"""
Protocol edges found by real clients (issue 22, item 5): field types,
heartbeats, timeout codes, HEAD, CORS preflights, watch names and the
WebSocket close code.
"""

from __future__ import annotations

import os
from itertools import pairwise
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.testing import RawClient
from tests.files import test_watch
from tests.helpers import DaemonTestCase
from tests.routes.test_files import FilesCase
from tests.routes.test_process import ProcessCase
from tests.terminals import test_websocket
from tests.web.test_request import connect, make_site


class UploadFieldTypeTests(DaemonTestCase):
    """A ``content_base64`` that is not a string is a 400, and nothing is written."""

    @inlineCallbacks
    def test_non_string_content_base64(self) -> Any:
        """/upload and /files/upload-stream answer 400 invalid_param for 1, [], {} and true."""
        for route in ("/upload", "/files/upload-stream"):
            for value in (1, [], {}, True, 1.5):
                reply = yield self.request(
                    "POST", route, {"path": "x.txt", "content_base64": value}
                )
                self.assertEqual(
                    (reply.status, reply.json()["code"]),
                    (400, "invalid_param"),
                    (route, value),
                )
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "x.txt")))


class HeartbeatTests(SynchronousTestCase):
    """An SSE stream is never silent for more than 4 s (httpx's read timeout is 5 s)."""

    def test_never_silent_for_more_than_four_seconds(self) -> None:
        """Whenever the last event was, the next bytes follow within 4 s."""
        site, clock, channels = make_site()
        protocol, transport = connect(site)
        protocol.dataReceived(b"GET /events HTTP/1.1\r\nHost: localhost\r\n\r\n")
        writes = [clock.seconds()]
        seen = len(transport.value())
        # Events at awkward moments: just before a heartbeat would be due.
        events_at = {39, 78, 118, 121, 160}
        for tenth in range(1, 400):
            clock.advance(0.1)
            if tenth in events_at:
                channels[0].send("tick", {"n": tenth})
            if len(transport.value()) != seen:
                seen = len(transport.value())
                writes.append(clock.seconds())
        gaps = [b - a for a, b in pairwise(writes)]
        self.assertLessEqual(max(gaps), 4.0 + 1e-6, gaps)
        self.assertLessEqual(clock.seconds() - writes[-1], 4.0 + 1e-6)
        self.assertIn(b": keep-alive\n\n", transport.value())
        channels[0].close()


class TimeoutCodeTests(ProcessCase):
    """``code`` ``timeout``/``idle_timeout`` and ``type`` TimeoutError, on every route."""

    policy = {"groups": {"dev_tools": True}}

    @inlineCallbacks
    def test_shell_and_code_run(self) -> Any:
        """/shell is 500 and /code/run 408, with the same code and type for each kind."""
        sleep = f"sleep {self.marker}"
        cases = [
            ("/shell", {"command": sleep, "timeout": 0.3}, 500, "timeout"),
            ("/shell", {"command": sleep, "idle_timeout": 0.3}, 500, "idle_timeout"),
            (
                "/code/run",
                {"language": "bash", "code": sleep, "timeout": 0.3},
                408,
                "timeout",
            ),
            (
                "/code/run",
                {"language": "bash", "code": sleep, "idle_timeout": 0.3},
                408,
                "idle_timeout",
            ),
        ]
        for path, body, status, code in cases:
            reply = yield self.request("POST", path, body)
            got = reply.json()
            self.assertEqual(
                (reply.status, got.get("code"), got.get("type")),
                (status, code, "TimeoutError"),
                (path, body, got),
            )

    @inlineCallbacks
    def test_shell_stream_error_event_has_code(self) -> Any:
        """The ``error`` event of /shell/stream carries the same ``code``."""
        _, reader = yield self.stream(
            "POST",
            "/shell/stream",
            {"command": f"sleep {self.marker}", "idle_timeout": 0.3},
        )
        events = yield reader.done
        errors = [e["data"] for e in events if e["event"] == "error"]
        self.assertEqual(len(errors), 1)
        self.assertEqual(
            (errors[0]["type"], errors[0]["code"]), ("TimeoutError", "idle_timeout")
        )


class UploadWatchTests(FilesCase):
    """A watch never shows the daemon's temporary upload names."""

    open_stream = test_watch.WatchTests.open_stream

    @inlineCallbacks
    def test_upload_is_one_event_of_the_real_name(self) -> Any:
        """An upload is one ``created`` (new file) or ``modified`` (replaced) of its name."""
        os.mkdir(os.path.join(self.base_dir, "w"))
        c, response = yield self.open_stream("path=w&follow=true")
        self.addCleanup(response._transport.loseConnection)
        target = os.path.join(self.base_dir, "w", "new.txt")
        for content in ("eA==", "eXk="):
            reply = yield self.request(
                "POST", "/upload", {"path": "w/new.txt", "content_base64": content}
            )
            self.assertEqual(reply.status, 200, reply.body)
        with open(os.path.join(self.base_dir, "w", "end"), "w"):
            pass
        yield c.wait_for(b"/end")
        shown = [(e[1], e[2]["path"]) for e in c.events()]
        self.assertEqual(
            shown,
            [
                ("created", target),
                ("modified", target),
                ("created", os.path.join(self.base_dir, "w", "end")),
            ],
        )
        self.assertNotIn(b".upload", c.data)


def _split(received: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


class HeadTests(DaemonTestCase):
    """HEAD on every GET route is GET without the body; other methods stay 501."""

    @inlineCallbacks
    def raw(self, data: bytes) -> Any:
        """Send raw bytes on a real socket; everything until the server closes."""
        client = RawClient()
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.daemon.port)
        protocol = yield connectProtocol(endpoint, client)
        protocol.transport.write(data)
        timer = reactor.callLater(2, protocol.transport.loseConnection)
        received = yield client.closed
        if timer.active():
            timer.cancel()
        return received

    @inlineCallbacks
    def head(self, target: str) -> Any:
        received = yield self.raw(
            f"HEAD {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
        )
        return _split(received)

    @inlineCallbacks
    def test_health(self) -> Any:
        """HEAD /health: 200, the GET's Content-Type and Content-Length, no body."""
        status, headers, body = yield self.head("/health")
        self.assertEqual((status, body), (200, b""))
        self.assertEqual(headers["content-length"], str(len(b'{"status":"ok"}')))
        self.assertEqual(headers["content-type"], "application/json")

    @inlineCallbacks
    def test_files_raw(self) -> Any:
        """HEAD /files/raw gives the size and ETag of a download without sending it."""
        with open(os.path.join(self.base_dir, "big.bin"), "wb") as f:
            f.write(b"z" * 300_000)
        status, headers, body = yield self.head("/files/raw?path=big.bin")
        self.assertEqual((status, body), (200, b""))
        self.assertEqual(headers["content-length"], "300000")
        get = yield self.request("GET", "/files/raw?path=big.bin")
        self.assertEqual(headers["etag"], get.header("etag"))
        self.assertEqual(len(get.body), 300_000)

    @inlineCallbacks
    def test_refusals_and_streams(self) -> Any:
        """A refused HEAD has the GET's status and no body; HEAD on a stream ends at once."""
        status, _, body = yield self.head("/files/raw?path=missing")
        self.assertEqual((status, body), (404, b""))
        os.mkdir(os.path.join(self.base_dir, "w"))
        status, headers, body = yield self.head("/files/watch?path=w")
        self.assertEqual((status, body), (200, b""))
        self.assertEqual(headers["content-type"], "text/event-stream")

    @inlineCallbacks
    def test_other_methods_still_501(self) -> Any:
        """PUT and PATCH stay 501; HEAD of a POST-only path is the GET's 404."""
        for method in ("PUT", "PATCH"):
            reply = yield self.request(method, "/health")
            self.assertEqual(reply.status, 501, method)
        status, _, _ = yield self.head("/shell")
        self.assertEqual(status, 404)


class PreflightTests(DaemonTestCase):
    """A CORS preflight from an origin the policy does not allow is 403 origin_not_allowed."""

    policy = {"allowed_origins": ["https://console.example"]}

    @inlineCallbacks
    def test_other_origin_preflight(self) -> Any:
        """403 origin_not_allowed (not 501), with no CORS headers; with no origins allowed too."""
        for _ in range(2):
            reply = yield self.request(
                "OPTIONS",
                "/capabilities",
                headers={
                    "Origin": "https://evil.example",
                    "Access-Control-Request-Method": "POST",
                },
            )
            self.assertEqual(
                (reply.status, reply.json()["code"]), (403, "origin_not_allowed")
            )
            self.assertIsNone(reply.header("access-control-allow-origin"))
            yield self.daemon.stop()
            yield self.start(policy={})
        reply = yield self.request("OPTIONS", "/capabilities")
        self.assertEqual(reply.status, 501)  # not a preflight: still unsupported


class WebSocketCloseTests(test_websocket.ProtocolCase):
    """The PTY WebSocket echoes the close code a client sends (RFC 6455 §5.5.1)."""

    def test_client_close_code_echoed(self) -> None:
        """A client closing with 4000 gets 4000 back, not 1000; the session lives on."""
        client, _, pump = self.open()
        self.assertTrue(client.open)
        client.sendClose(code=4000, reason="switching tabs")
        pump.flush()
        self.assertEqual(
            (client.close_code, client.close_reason), (4000, "switching tabs")
        )
        self.assertIn("s1", self.table.sessions)
