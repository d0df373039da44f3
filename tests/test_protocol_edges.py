"""
Protocol edges found by real clients (issue 22, item 5): field types,
heartbeats, timeout codes, HEAD, CORS preflights, watch names and the
WebSocket close code.
"""

from __future__ import annotations

import os
from itertools import pairwise
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase

from tests.helpers import DaemonTestCase
from tests.test_process_routes import ProcessCase
from tests.test_request import connect, make_site


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
