"""
The keystroke's frames read and written without autobahn's state machine
(:mod:`sandboxd.terminals.frames`), and the socket's behaviour when a read
is, or is not, that plain case: the same messages, the same closes.
"""

from __future__ import annotations

import json
import os

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.terminals.frames import client_text_payload, server_text_frame
from tests.terminals.test_websocket import ProtocolCase


def masked(
    payload: bytes, first: int = 0x81, mask: bytes = b"\x37\xfa\x21\x3d"
) -> bytes:
    """A client frame (RFC 6455 §5.2) carrying ``payload`` under ``mask``."""
    n = len(payload)
    if n < 126:
        head = bytes((first, 0x80 | n))
    elif n <= 0xFFFF:
        head = bytes((first, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((first, 0x80 | 127)) + n.to_bytes(8, "big")
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + body


def keystroke(data: str) -> bytes:
    """The JSON of one input message."""
    return json.dumps({"type": "input", "data": data}).encode()


class ClientPayloadTests(SynchronousTestCase):
    """Which client frames are the plain case, and their payloads."""

    def test_unmasks(self) -> None:
        """A whole masked text frame gives its payload, for lengths on
        both sides of each mask period and of the 16-bit length form."""
        for n in (0, 1, 3, 4, 5, 30, 125, 126, 127, 1000, 65535):
            payload = (b"x\xc3\xa9" * n)[:n]
            while True:  # keep it valid UTF-8 after the cut
                try:
                    payload.decode("utf-8")
                    break
                except UnicodeDecodeError:
                    payload = payload[:-1]
            self.assertEqual(client_text_payload(masked(payload)), payload, n)

    def test_not_plain(self) -> None:
        """Anything but one whole final masked text frame is left to autobahn."""
        frame = masked(keystroke("a"))
        self.assertIsNone(client_text_payload(frame[:-1]), "split")
        self.assertIsNone(client_text_payload(frame + frame), "two frames")
        self.assertIsNone(client_text_payload(masked(b"a", first=0x01)), "fragment")
        self.assertIsNone(client_text_payload(masked(b"a", first=0x82)), "binary")
        self.assertIsNone(client_text_payload(masked(b"a", first=0xC1)), "RSV1")
        self.assertIsNone(client_text_payload(masked(b"", first=0x89)), "ping")
        self.assertIsNone(client_text_payload(bytes((0x81, 1)) + b"a"), "unmasked")
        self.assertIsNone(client_text_payload(masked(b"\xff\xfe")), "not UTF-8")
        self.assertIsNone(client_text_payload(masked(b"\xe2\x9c")), "cut character")
        self.assertIsNone(client_text_payload(masked(b"a" * 70000)), "64-bit length")
        not_minimal = bytes((0x81, 0x80 | 126, 0, 5)) + b"\0\0\0\0" + b"hello"
        self.assertIsNone(client_text_payload(not_minimal), "16-bit length under 126")

    def test_limit(self) -> None:
        """A payload over ``limit`` is left to autobahn, which refuses it."""
        self.assertEqual(client_text_payload(masked(b"abcd"), limit=4), b"abcd")
        self.assertIsNone(client_text_payload(masked(b"abcde"), limit=4))


class ServerFrameTests(SynchronousTestCase):
    """The frame an echo leaves in."""

    def test_lengths(self) -> None:
        """Final unmasked text frames, in each length form."""
        self.assertEqual(server_text_frame(b"hi"), b"\x81\x02hi")
        self.assertEqual(server_text_frame(b"x" * 126)[:4], b"\x81\x7e\x00\x7e")
        big = server_text_frame(b"x" * 70000)
        self.assertEqual(big[:10], b"\x81\x7f" + (70000).to_bytes(8, "big"))
        self.assertEqual(len(big), 10 + 70000)


class SocketTests(ProtocolCase):
    """The socket, whichever way a read is framed."""

    def test_keystrokes_and_echo(self) -> None:
        """Keystrokes reach the terminal in order and the echo reaches the
        client as a message autobahn's own client decodes; autobahn's
        traffic counts add up as on its own path."""
        client, server, pump = self.open()
        reads = server.trafficStats.incomingWebSocketMessages
        for ch in "héllo":
            server.dataReceived(masked(keystroke(ch), mask=os.urandom(4)))
        self.assertEqual(self.pty.written, [c.encode() for c in "héllo"])
        self.assertEqual(server.trafficStats.incomingWebSocketMessages, reads + 5)
        self.session.output("é".encode())
        pump.flush()
        self.assertEqual(
            client.received[-1],
            {"type": "output", "data": "é", "offset": 0, "end": 2},
        )
        self.assertIsNone(client.close_code)

    def test_coalesced_and_split_reads(self) -> None:
        """Two frames in one read, and one frame over two reads, arrive
        whole and in order (through autobahn)."""
        _, server, _ = self.open()
        server.dataReceived(masked(keystroke("a")) + masked(keystroke("b")))
        frame = masked(keystroke("c"))
        server.dataReceived(frame[:3])
        server.dataReceived(frame[3:])
        server.dataReceived(masked(keystroke("d")))
        self.assertEqual(self.pty.written, [b"a", b"b", b"c", b"d"])

    def test_invalid_utf8_closes(self) -> None:
        """A text message that is not UTF-8 closes the socket with 1007."""
        client, server, pump = self.open()
        server.dataReceived(masked(b'{"type": "input", "data": "\xff"}'))
        pump.flush()
        self.assertEqual(client.close_code, 1007)
        self.assertEqual(self.pty.written, [])

    def test_unmasked_closes(self) -> None:
        """An unmasked client frame is a protocol error: 1002."""
        client, server, pump = self.open()
        payload = keystroke("a")
        server.dataReceived(bytes((0x81, len(payload))) + payload)
        pump.flush()
        self.assertEqual(client.close_code, 1002)
        self.assertEqual(self.pty.written, [])

    def test_over_the_cap_closes(self) -> None:
        """A small frame over the policy's message cap closes with 1009."""
        client, server, pump = self.open()
        server.maxMessagePayloadSize = server.maxFramePayloadSize = 16
        server.dataReceived(masked(keystroke("abcdefgh")))
        pump.flush()
        self.assertEqual(client.close_code, 1009)
        self.assertEqual(self.pty.written, [])
