"""
Smaller defects of issue 22 (item 4): the output cap includes its marker,
uptime is not rounded, and a download cut by its client logs no error.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.processes import HeadTail
from tests.helpers import DaemonTestCase


class OutputCapTests(SynchronousTestCase):
    """Everything returned fits in ``max_output_bytes``, the marker line included."""

    def test_marker_inside_the_cap(self) -> None:
        """Head, marker and tail together are at most the cap; the marker names every byte left out."""
        for cap in (64, 1000, 10 * 1024 * 1024):
            sink = HeadTail(cap)
            total = 0
            sink.write(b"FIRST\n")
            for _ in range(3):
                chunk = b"z" * (cap + 12345)
                sink.write(chunk)
            sink.write(b"LAST\n")
            total = 6 + 3 * (cap + 12345) + 5
            value = sink.value()
            self.assertLessEqual(len(value), cap, cap)
            self.assertTrue(value.startswith(b"FIRST\n"), cap)
            self.assertTrue(value.endswith(b"LAST\n"), cap)
            line = f"\n[... {sink.dropped_bytes} bytes dropped ...]\n".encode()
            self.assertIn(line, value)
            self.assertEqual(len(value) - len(line) + sink.dropped_bytes, total)
            self.assertEqual(sink.value(), value)  # asking again changes nothing

    def test_under_the_cap_untouched(self) -> None:
        """Output within the cap comes back whole, with no marker."""
        sink = HeadTail(100)
        sink.write(b"x" * 100)
        self.assertEqual((sink.value(), sink.dropped_bytes), (b"x" * 100, 0))

    def test_tiny_cap(self) -> None:
        """A cap smaller than the marker line still bounds what is returned."""
        sink = HeadTail(10)
        sink.write(b"y" * 1000)
        self.assertLessEqual(len(sink.value()), 10)


class UptimeTests(DaemonTestCase):
    """``uptime_seconds`` is not rounded to a tenth."""

    @inlineCallbacks
    def test_uptime_is_fine_grained(self) -> Any:
        """Right after start it is above zero and has more than one decimal."""
        self.daemon.context.started_at = time.time() - 0.0123
        reply = yield self.request("GET", "/system/metrics")
        uptime = reply.json()["uptime_seconds"]
        self.assertGreater(uptime, 0.012)
        self.assertLess(uptime, 5)
        self.assertNotEqual(round(uptime, 1), uptime)


class CutDownloadTests(DaemonTestCase):
    """A download the client cuts off is an ordinary disconnect, not an error."""

    @inlineCallbacks
    def test_cut_raw_download_logs_no_error(self) -> Any:
        """No ``Producer was not unregistered`` (nor any failure) is logged."""
        with open(os.path.join(self.base_dir, "big.bin"), "wb") as f:
            f.write(os.urandom(1 << 20) * 16)
        errors: list[dict[str, Any]] = []

        def observe(event: dict[str, Any]) -> None:
            if event.get("isError") or event.get("log_failure") is not None:
                errors.append(event)

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", self.daemon.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(
                b"GET /files/raw?path=big.bin HTTP/1.1\r\nHost: localhost\r\n\r\n"
            )
            s.setblocking(False)  # never block the reactor the daemon runs on
            for _ in range(100):
                yield deferLater(reactor, 0.03, lambda: None)
                try:
                    if s.recv(1024):
                        break
                except BlockingIOError:
                    continue
            s.close()
            yield deferLater(reactor, 0.2, lambda: None)
        self.assertEqual(
            [e.get("log_format") or str(e.get("log_failure")) for e in errors], []
        )
