"""
The framing of the kernel hub's pipe, as the daemon reads it: JSON lines,
and raw output bytes announced by the line before them, however the pipe
cuts them; anything over the bound stops the reader.
"""

from __future__ import annotations

import itertools
import json
import os

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.kernels.hub import utf8_chunks, utf8_pieces
from sandboxd.kernels.hubclient import LineSplitter


class Reader:
    """A splitter wired as the hub client wires it: ``bytes`` in a line announces a payload."""

    def __init__(self, max_bytes: int = 1000) -> None:
        self.got: list[object] = []
        self.overflows: list[int] = []
        self.splitter = LineSplitter(
            max_bytes, self.line, self.overflows.append, self.got.append
        )

    def line(self, data: bytes) -> None:
        event = json.loads(data)
        self.got.append(event)
        if "bytes" in event:
            self.splitter.expect(event["bytes"])


def framed(events: list[tuple[dict[str, object], bytes | None]]) -> bytes:
    """What the hub writes for ``events``."""
    out = b""
    for event, payload in events:
        if payload is not None:
            event = {**event, "bytes": len(payload)}
        out += json.dumps(event).encode() + b"\n" + (payload or b"")
    return out


class SplitterTests(SynchronousTestCase):
    """Lines and payloads come whole and in order, whatever the reads."""

    def test_every_cut(self) -> None:
        """Cut at every offset into two reads, the same events and payloads come out."""
        stream = framed(
            [
                ({"ev": "started"}, None),
                ({"ev": "stream"}, b"line one\nline two\n"),
                ({"ev": "stream"}, b""),
                ({"ev": "done"}, None),
            ]
        )
        expected = [
            {"ev": "started"},
            {"ev": "stream", "bytes": 18},
            b"line one\nline two\n",
            {"ev": "stream", "bytes": 0},
            b"",
            {"ev": "done"},
        ]
        for cut in range(len(stream) + 1):
            reader = Reader()
            reader.splitter.feed(stream[:cut])
            reader.splitter.feed(stream[cut:])
            self.assertEqual(reader.got, expected, f"cut at {cut}")

    def test_byte_by_byte(self) -> None:
        """One byte a read works as well."""
        stream = framed([({"ev": "stream"}, b"a\nb"), ({"ev": "done"}, None)])
        reader = Reader()
        for i in range(len(stream)):
            reader.splitter.feed(stream[i : i + 1])
        self.assertEqual(
            reader.got, [{"ev": "stream", "bytes": 3}, b"a\nb", {"ev": "done"}]
        )

    def test_long_line_stops(self) -> None:
        """A line over the bound stops the reader (nothing after it is taken)."""
        reader = Reader(max_bytes=50)
        reader.splitter.feed(b'{"ev": "' + b"x" * 100)
        reader.splitter.feed(b'"}\n{"ev": "done"}\n')
        self.assertEqual(reader.overflows, [108])
        self.assertEqual(reader.got, [])

    def test_payload_over_the_bound_stops(self) -> None:
        """A payload announced over the bound stops the reader before reading it."""
        reader = Reader(max_bytes=50)
        reader.splitter.feed(framed([({"ev": "stream"}, b"y" * 51)]))
        self.assertEqual(reader.overflows, [51])
        self.assertEqual(reader.got, [{"ev": "stream", "bytes": 51}])


class PipeReadTests(SynchronousTestCase):
    """
    Read from the pipe itself (:meth:`LineSplitter.read_from`), a payload
    straight into its place: the same lines and payloads, whatever the
    writer's cuts and the reader's buffer.
    """

    def read_all(self, stream: bytes, cuts: list[int], read_bytes: int) -> Reader:
        """Write ``stream`` cut at ``cuts``, reading after each write."""
        reader = Reader(max_bytes=1 << 20)
        reader.splitter.read_bytes = read_bytes
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        os.set_blocking(r, False)
        for a, b in itertools.pairwise([0, *cuts, len(stream)]):
            os.write(w, stream[a:b])
            while True:
                try:
                    if not reader.splitter.read_from(r):
                        break
                except BlockingIOError:
                    break
        os.close(w)
        self.assertEqual(reader.splitter.read_from(r), 0)
        return reader

    def test_payloads_whole(self) -> None:
        """Payloads over several reads, and several in one, come whole and in order."""
        big = bytes(range(256)) * 100 + b"\n"
        events = [
            ({"ev": "started"}, None),
            ({"ev": "stream", "n": 1}, big),
            ({"ev": "stream", "n": 2}, b"short\n"),
            ({"ev": "stream", "n": 3}, big),
            ({"ev": "stream", "n": 4}, b""),
            ({"ev": "done"}, None),
        ]
        stream = framed(events)
        expected = [
            {"ev": "started"},
            {"ev": "stream", "n": 1, "bytes": len(big)},
            big,
            {"ev": "stream", "n": 2, "bytes": 6},
            b"short\n",
            {"ev": "stream", "n": 3, "bytes": len(big)},
            big,
            {"ev": "stream", "n": 4, "bytes": 0},
            b"",
            {"ev": "done"},
        ]
        for read_bytes in (7, 4096, 1 << 20):
            for cuts in ([], [5], [30, 31, 9000, 25000], list(range(100, 50000, 997))):
                reader = self.read_all(stream, cuts, read_bytes)
                self.assertEqual(reader.got, expected, f"{read_bytes} {cuts[:4]}")
                payloads = [g for g in reader.got if isinstance(g, bytearray)]
                self.assertEqual(len(payloads), 3)


class ChunkTests(SynchronousTestCase):
    """The hub cuts big output between characters."""

    def test_characters_whole(self) -> None:
        """Every piece decodes alone and the pieces make the whole."""
        text = ("héllo €😀 " * 500).encode()
        for size in (4, 5, 7, 16, 1000, len(text)):
            pieces = utf8_chunks(text, size)
            self.assertEqual(b"".join(pieces), text)
            self.assertTrue(all(len(p) <= size for p in pieces))
            for p in pieces:
                p.decode()

    def test_pieces_regrouped(self) -> None:
        """
        Text in pieces (views between escapes, the escapes' characters) is
        regrouped into chunks of at most the size, each decoding alone,
        together the whole, as views of the pieces.
        """
        text = "héllo €😀 " * 300
        cuts = [0, 1, 7, 8, 100, 1001, 2000, len(text)]
        pieces: list[bytes | memoryview] = []
        for a, b in itertools.pairwise(cuts):
            pieces += [memoryview(text[a:b].encode()), b"\n"]
        whole = b"".join(pieces)
        for size in (4, 5, 7, 16, 1000, len(whole)):
            chunks = [b"".join(c) for c in utf8_pieces(pieces, size)]
            self.assertEqual(b"".join(chunks), whole)
            self.assertTrue(all(0 < len(c) <= size for c in chunks))
            for c in chunks:
                c.decode()

    def test_empty(self) -> None:
        """Empty output is one empty piece (the event still goes out)."""
        self.assertEqual(utf8_chunks(b"", 8), [b""])
