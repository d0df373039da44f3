# -*- test-case-name: tests.client.test_sse -*-
"""
How the client reads an event stream, with no daemon: lines end at CRLF,
LF or CR only (as the SSE format says), wherever the reads cut them, so a
``data:`` line whose JSON holds NEL, U+2028 or U+2029 unescaped (which
JSON allows, and which ``str.splitlines`` would end a line at) is one event.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator

import httpx
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.client._async import Async
from sandboxd.client._core import SSELines, SSEParser
from sandboxd.client._plan import Opened
from sandboxd.client._sync import Blocking

#: A stream another server could send: every line end the format allows,
#: and the characters ``str.splitlines`` also splits at inside the data.
STREAM = (
    'id: 1\r\nevent: stdout\r\ndata: {"data":"a\u0085b\u2028c\u2029d"}\r\n\r\n'
    ": keep-alive\r\rid: 2\revent: exit\rdata: 0\r\r"
    'event: stderr\ndata: {"data":"\u00e9"}\n\n'
)
LINES = [
    "id: 1",
    "event: stdout",
    'data: {"data":"a\u0085b\u2028c\u2029d"}',
    "",
    ": keep-alive",
    "",
    "id: 2",
    "event: exit",
    "data: 0",
    "",
    "event: stderr",
    'data: {"data":"\u00e9"}',
    "",
]


def _cut(text: str, rng: random.Random) -> list[str]:
    """``text`` in pieces cut at random places (none, one, or many)."""
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, 12)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _events(lines: list[str]) -> list[tuple[str, object, int | None]]:
    return [(e.event, e.data, e.id) for e in SSEParser().feed_lines(lines)]


class SSELinesTests(SynchronousTestCase):
    """:class:`SSELines` alone."""

    def test_any_cut(self) -> None:
        """The same lines wherever the text is cut, a CR LF pair split included."""
        rng = random.Random(7)
        for _ in range(500):
            lines = SSELines()
            got = [line for piece in _cut(STREAM, rng) for line in lines.feed(piece)]
            self.assertEqual(got + lines.end(), LINES)

    def test_events(self) -> None:
        """The lines make the events the server sent, the data's JSON whole."""
        self.assertEqual(
            _events(LINES),
            [
                ("stdout", {"data": "a\u0085b\u2028c\u2029d"}, 1),
                ("exit", 0, 2),
                ("stderr", {"data": "\u00e9"}, None),
            ],
        )

    def test_unended_last_line(self) -> None:
        """A stream that stops inside a line gives that line at its end."""
        lines = SSELines()
        self.assertEqual(lines.feed("data: 1\nda"), ["data: 1"])
        self.assertEqual(lines.feed("ta: 2"), [])
        self.assertEqual(lines.end(), ["data: 2"])
        self.assertEqual(lines.end(), [])


def _response(pieces: list[bytes]) -> httpx.Response:
    return httpx.Response(200, content=iter(pieces))


async def _aiter(pieces: list[bytes]) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


class FaceLinesTests(SynchronousTestCase):
    """Both faces read a streamed answer's lines through :class:`SSELines`."""

    def pieces(self) -> list[bytes]:
        # Cut inside the UTF-8 of U+2028 too: the text decoder joins it.
        raw = STREAM.encode()
        at = raw.index("\u2028".encode()) + 1
        return [raw[:at], raw[at : at + 5], raw[at + 5 :]]

    def test_blocking(self) -> None:
        face = Blocking(httpx.Client())
        opened = Opened(_response(self.pieces()))
        got: Iterator[str | None] = iter(lambda: face.line(opened), None)
        self.assertEqual(list(got), LINES)

    def test_async(self) -> None:
        async def read() -> list[str]:
            face = Async(httpx.AsyncClient())
            opened = Opened(httpx.Response(200, content=_aiter(self.pieces())))
            out = []
            while (line := await face.line(opened)) is not None:
                out.append(line)
            return out

        self.assertEqual(asyncio.run(read()), LINES)
