"""
``/shell/stream``'s line framing in memory: the bytes each read of a
child's output becomes, and how many writes carry them.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.web.linestream import LineStream
from sandboxd.web.sse import frame

#: Lines a JSON encoder must escape, or that a client's line reader may
#: split at: quotes and backslashes, control characters, CR, DEL, NEL,
#: U+2028 and U+2029, invalid UTF-8 (a lone surrogate's bytes among it),
#: and non-ASCII text.
AWKWARD = [
    b'say "hi" \\ there',
    b"tab\there",
    b"nul\x00 bell\x07 esc\x1b[0m del\x7f",
    b"nel\xc2\x85 ls\xe2\x80\xa8 ps\xe2\x80\xa9",
    b"bad \xff\xfe and a surrogate \xed\xa0\x80",
    b"caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80",
    b"cut \xe2\x80",
    b"ends in CR\r",
]


def stream_of(cap: int = 1 << 20) -> tuple[LineStream, Clock, list[bytes]]:
    """A line stream on a test clock, and the list of its writes."""
    clock = Clock()
    clock.advance(100)
    writes: list[bytes] = []
    return LineStream(clock, writes.append, cap), clock, writes


def _data(frames: bytes) -> list[dict[str, Any]]:
    """The data of each event in ``frames``."""
    return [
        json.loads(line[len(b"data: ") :])
        for line in frames.split(b"\n")
        if line.startswith(b"data: ")
    ]


def events(name: str, lines: list[bytes]) -> bytes:
    """What each line is as an event of its own, through the JSON encoder."""
    return b"".join(
        frame(name, {"data": line.removesuffix(b"\r").decode("utf-8", "replace")})
        for line in lines
    )


class LineStreamTests(SynchronousTestCase):
    """Every line is the event the JSON encoder makes of it, in as few writes as before."""

    def test_plain_lines_of_one_read(self) -> None:
        """Several plain lines read at once leave as one write, each its own event."""
        stream, _, writes = stream_of()
        stream.feed(1, b"1\n2\n3\n")
        self.assertEqual(
            writes,
            [
                b'event: stdout\ndata: {"data":"1"}\n\n'
                b'event: stdout\ndata: {"data":"2"}\n\n'
                b'event: stdout\ndata: {"data":"3"}\n\n'
            ],
        )

    def test_awkward_lines_as_the_encoder_makes_them(self) -> None:
        """Lines that need escaping, read with plain ones, give the encoder's bytes."""
        lines = [b"plain", *AWKWARD, b"plain again"]
        for fd, name in ((1, "stdout"), (2, "stderr")):
            stream, _, writes = stream_of()
            stream.feed(fd, b"\n".join(lines) + b"\n")
            self.assertEqual(writes, [events(name, lines)])

    def test_each_awkward_line_alone(self) -> None:
        """Each awkward line read alone is the encoder's event."""
        for line in AWKWARD:
            stream, clock, writes = stream_of()
            stream.feed(1, line + b"\n")
            clock.advance(1)
            self.assertEqual(b"".join(writes), events("stdout", [line]))

    def test_a_line_over_two_reads(self) -> None:
        """A line whose end comes in the next read is one event, sent with that read."""
        stream, clock, writes = stream_of()
        stream.feed(1, b"first\nsec")
        clock.advance(1)
        stream.feed(1, b"ond\n")
        self.assertEqual(
            writes,
            [
                b'event: stdout\ndata: {"data":"first"}\n\n',
                b'event: stdout\ndata: {"data":"second"}\n\n',
            ],
        )

    def test_long_line_pieces_within_the_bound(self) -> None:
        """
        A line over the bound comes in pieces none longer than it, whatever
        its reads: many small ones, or one bigger than the bound; together
        they are the line, only the last piece followed by a newline.
        """
        bound = 1000
        line = b"x" * 3100
        for reads in ([line[i : i + 300] for i in range(0, len(line), 300)], [line]):
            writes: list[bytes] = []
            stream = LineStream(Clock(), writes.append, 1 << 20, max_line=bound)
            for read in [*reads[:-1], reads[-1] + b"\nnext\n"]:
                stream.feed(1, read)
            stream.flush()
            pieces = [
                (p["data"].encode(), p.get("newline", True))
                for p in _data(b"".join(writes))
            ]
            self.assertLessEqual(max(len(p) for p, _ in pieces), bound)
            self.assertEqual(b"".join(p for p, _ in pieces[:-1]), line)
            self.assertEqual([n for _, n in pieces], [False] * 3 + [True, True])

    def test_reads_within_the_window_coalesced(self) -> None:
        """A read soon after a write waits for the window's end, then leaves with the next one."""
        stream, clock, writes = stream_of()
        stream.feed(1, b"a\n")
        stream.feed(1, b"b\n")
        stream.feed(2, b"c\n")
        self.assertEqual(len(writes), 1)
        clock.advance(stream.flush_seconds)
        self.assertEqual(
            writes,
            [
                b'event: stdout\ndata: {"data":"a"}\n\n',
                b'event: stdout\ndata: {"data":"b"}\n\n'
                b'event: stderr\ndata: {"data":"c"}\n\n',
            ],
        )
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_over_the_cap_kept_for_the_end(self) -> None:
        """Past half the cap, lines are kept for the end and what is dropped is announced."""
        stream, clock, writes = stream_of(cap=8)
        stream.feed(1, b"ab\n")
        clock.advance(1)
        stream.feed(1, b"cdef\nxy\nz\n")
        stream.finish()
        stream.close()
        self.assertEqual(
            b"".join(writes),
            b'event: stdout\ndata: {"data":"ab"}\n\n'
            b'event: truncated\ndata: {"stream":"stdout","dropped_bytes":8}\n\n'
            b'event: stdout\ndata: {"data":"z"}\n\n',
        )
