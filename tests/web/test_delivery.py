"""
``sandboxd.web.delivery``: what a client has taken of what was sent, read
from the kernel on real loopback sockets.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.web.delivery import Delivery, delivery, stalled


class _Plain:
    """A transport-shaped holder of a socket with nothing buffered."""

    def __init__(self, sock: socket.socket) -> None:
        self.socket = sock
        self.dataBuffer = b""
        self.offset = 0
        self._tempDataLen = 0


def _pair(case: SynchronousTestCase) -> tuple[socket.socket, socket.socket]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    server.setblocking(False)
    for s in (client, server):
        case.addCleanup(s.close)
    return server, client


def _fill(server: socket.socket) -> int:
    sent = 0
    try:
        while True:
            sent += server.send(b"x" * 65536)
    except BlockingIOError:
        return sent


def _settle() -> None:
    time.sleep(0.1)


class DeliveryTests(SynchronousTestCase):
    """The kernel's counts, as a channel reads them."""

    def test_reader_and_non_reader(self) -> None:
        """
        Bytes wait for a client that reads nothing and its count stands
        still; once it reads, the count moves.
        """
        server, client = _pair(self)
        transport: Any = _Plain(server)
        _fill(server)
        _settle()
        first = delivery(transport)
        assert first is not None
        self.assertGreater(first.waiting, 0)
        self.assertIsNotNone(first.taken)
        _settle()
        second = delivery(transport)
        self.assertTrue(stalled(first, second))
        client.recv(4096)
        _settle()
        third = delivery(transport)
        self.assertFalse(stalled(second, third))

    def test_nothing_waiting_is_never_stalled(self) -> None:
        """A connection with nothing unsent is idle, not stalled."""
        server, _ = _pair(self)
        transport: Any = _Plain(server)
        first = delivery(transport)
        second = delivery(transport)
        assert first is not None
        self.assertEqual(first.waiting, 0)
        self.assertFalse(stalled(first, second))

    def test_unknown_counts(self) -> None:
        """Without the kernel's count, what waits must not shrink to be a stall."""
        self.assertTrue(stalled(Delivery(None, 10), Delivery(None, 10)))
        self.assertFalse(stalled(Delivery(None, 10), Delivery(None, 5)))
        self.assertFalse(stalled(None, Delivery(None, 5)))

    def test_no_socket(self) -> None:
        """A transport with no socket under it says nothing."""
        self.assertIsNone(delivery(object()))
