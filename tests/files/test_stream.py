"""
``sandboxd.files.stream``: a file's bytes sent to a client, and a client
that goes away in the middle.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.logger import LogLevel, globalLogPublisher

from tests.helpers import DaemonTestCase


def _cut_download(port: int, path: str, reset: bool) -> bytes:
    """
    GET ``path``, read the first bytes and go away, with a reset (as a
    client killed) or a plain close (blocking: run it in a thread).
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(10)
        s.connect(("127.0.0.1", port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        got = s.recv(10)
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return got


class CutDownloadTests(DaemonTestCase):
    """A client that cuts a download short is routine, not a failure."""

    @inlineCallbacks
    def test_cut_download_logs_no_warning(self) -> Any:
        """
        Downloads cut after a few bytes, by a reset or a close (a browser
        cancelling, ``curl | head``), log no warning: the daemon's send
        meets the client's reset or broken pipe, which says only that the
        client left.  The next download is whole.
        """
        data = os.urandom(4 * 1024 * 1024)
        with open(os.path.join(self.base_dir, "big.bin"), "wb") as f:
            f.write(data)
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        for reset in (True, False, True, False):
            got = yield deferToThread(
                _cut_download, self.daemon.port, "/files/raw?path=big.bin", reset
            )
            self.assertTrue(got.startswith(b"HTTP/1.1 2"), got)
            yield deferLater(reactor, 0.3, lambda: None)
        warnings = [
            e
            for e in events
            if e.get("log_level", LogLevel.debug) >= LogLevel.warn
            and str(e.get("log_namespace", "")).startswith("sandboxd")
        ]
        self.assertEqual([e.get("log_format") for e in warnings], [])
        reply = yield self.request("GET", "/files/raw?path=big.bin")
        self.assertEqual((reply.status, reply.body == data), (200, True))
