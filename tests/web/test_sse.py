"""
``sandboxd.web.sse`` on real loopback sockets: a follower whose client
stops reading is paused, and catches up from its log once the client
reads again, with heartbeats and live events after it.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from sandboxd.eventlog import EventLog
from sandboxd.web.sse import Follower, SSEChannel

#: Enough events that the kernel's send queue (up to 4 MiB by default)
#: fills and the follower is paused.
EVENTS = 60_000


class _Stream(Resource):
    isLeaf = True

    def __init__(self, log: EventLog) -> None:
        super().__init__()
        self.log = log
        self.followers: list[Follower] = []
        self.started: Deferred[None] = Deferred()

    def render_GET(self, request: Any) -> Any:
        channel = SSEChannel(request, reactor, heartbeat=0.5)
        self.followers.append(Follower(self.log, channel, 0))
        self.started.callback(None)
        return NOT_DONE_YET


def _ids(data: bytes) -> list[int]:
    return [int(line[4:]) for line in data.split(b"\n") if line.startswith(b"id: ")]


def _read_until(s: socket.socket, data: bytes, needle: bytes, seconds: float) -> bytes:
    """Read ``s`` until ``needle`` is in what was read, or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    s.settimeout(0.2)
    chunks, tail = [data], data[-len(needle) :]
    while needle not in tail and time.monotonic() < deadline:
        try:
            chunk = s.recv(1 << 20)
        except TimeoutError:
            continue
        if not chunk:
            break
        chunks.append(chunk)
        tail = tail[-len(needle) :] + chunk
    return b"".join(chunks)


class SlowClientTests(TestCase):
    timeout = 30

    @inlineCallbacks
    def test_paused_follower_catches_up_and_stays_live(self) -> Any:
        """
        A client with a small receive buffer that reads nothing while tens
        of thousands of events are logged gets every one of them, in
        order, once it reads; then heartbeats while the log is quiet, and
        a new event at once.
        """
        log = EventLog(64 * 1024 * 1024)
        resource = _Stream(log)
        port = reactor.listenTCP(0, Site(resource), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        s = socket.socket()
        self.addCleanup(s.close)
        # Set before connecting, as a client sizes its buffer: shrunk on a
        # connection already open, the kernel itself stalls the transfer
        # (it keeps sending to the window first announced).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        s.connect(("127.0.0.1", port.getHost().port))
        s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        yield resource.started
        for i in range(EVENTS):
            log.append("created", {"path": f"/some/where/file-{i:06d}.txt"})
            if i % 5000 == 0:
                yield deferLater(reactor, 0, lambda: None)
        follower = resource.followers[0]
        self.assertTrue(follower.paused, "the client's buffers are full")
        data = yield deferToThread(_read_until, s, b"", f"id: {EVENTS}\n".encode(), 30)
        self.assertEqual(_ids(data), list(range(1, EVENTS + 1)))
        self.assertNotIn(b"event: gap", data)
        rest = yield deferToThread(_read_until, s, b"", b": keep-alive", 5)
        self.assertIn(b": keep-alive", rest)
        log.append("created", {"path": "/some/where/after.txt"})
        rest = yield deferToThread(_read_until, s, rest, b"after.txt", 5)
        self.assertEqual(_ids(rest), [EVENTS + 1])
