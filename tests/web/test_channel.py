"""
``SandboxChannel.take_over``: a connection handed from HTTP to another
protocol (the preview door's WebSocket splice), in memory.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from tests.web.test_request import connect, make_site


class Recorder(Protocol):
    """Keeps what it is given."""

    def __init__(self) -> None:
        self.data = b""
        self.lost: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Any = None) -> None:
        self.lost = reason


class TakeOverTests(SynchronousTestCase):
    """After take_over, every byte is the new protocol's; the connection stays counted."""

    def test_bytes_timeouts_and_count(self) -> None:
        """
        Bytes the client sent after the head are handed on, later bytes go
        straight to the new protocol, the idle timeout no longer cuts it,
        the channel stops being the transport's producer, and the site
        forgets the connection only when it closes.
        """
        site, reactor, _ = make_site()
        channel, transport = connect(site)
        channel._dataBuffer.append(b"early ")
        recorder = Recorder()
        channel.take_over(recorder)
        self.assertIs(recorder.transport, transport)
        self.assertIsNone(transport.producer)
        channel.dataReceived(b"late")
        self.assertEqual(recorder.data, b"early late")
        reactor.advance(3600 * 24)
        self.assertFalse(transport.disconnecting)
        self.assertIn(channel, site.connections)
        channel.connectionLost(Failure(ConnectionError("gone")))
        self.assertIsNotNone(recorder.lost)
        self.assertNotIn(channel, site.connections)

    def test_closed_connection(self) -> None:
        """A connection already gone cannot be taken over."""
        site, _, _ = make_site()
        channel, _ = connect(site)
        channel.transport = None
        self.assertRaises(RuntimeError, channel.take_over, Recorder())
