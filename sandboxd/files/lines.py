# -*- test-case-name: tests.files.test_lines -*-
"""
Lines of a file's bytes, by number: a read of part of a file
(``download`` with ``offset`` and ``limit``).

A model reads a file into its context; a log or a generated file of tens
of thousands of lines would not fit, and after a content search it wants
the lines around a match, not the file, or a long log's last lines.
Lines are counted as grep and an editor count them: each ends at ``\\n``
(kept in the slice), the last one may have none.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import attrs


@attrs.frozen
class LineSlice:
    """
    Where lines ``first`` .. ``first + count - 1`` (from 1) lie in the
    bytes, and how many the bytes hold.
    """

    start: int
    end: int
    first: int
    count: int
    total: int

    @property
    def more(self) -> bool:
        """Whether lines follow the slice."""
        return self.first + self.count - 1 < self.total


#: How much of a file one read takes while lines are counted.
CHUNK_BYTES = 1 << 20

#: Reads ``size`` bytes at a position (``os.pread`` on a file, a slice in memory).
ReadAt = Callable[[int, int], bytes]


def count_lines(data: bytes) -> int:
    """Lines in ``data``: its newlines, and one more for a last line without one."""
    newlines = data.count(b"\n")
    return newlines + (1 if data and not data.endswith(b"\n") else 0)


def _after_newlines(read_at: ReadAt, size: int, pos: int, n: int, chunk: int) -> int:
    """
    The position just after the ``n``-th newline from ``pos``; ``size``
    when there are fewer.
    """
    while n > 0 and pos < size:
        block = read_at(pos, min(chunk, size - pos))
        if not block:
            return pos
        found = block.count(b"\n")
        if found < n:
            n -= found
            pos += len(block)
            continue
        index = -1
        for _ in range(n):
            index = block.find(b"\n", index + 1)
        return pos + index + 1
    return pos if n == 0 else size


def _total_lines(read_at: ReadAt, size: int, chunk: int) -> tuple[int, int]:
    """``(lines, size)``: the lines of the bytes, and how many bytes there were."""
    newlines = 0
    pos = 0
    last = b""
    while pos < size:
        block = read_at(pos, min(chunk, size - pos))
        if not block:
            break  # shorter than it was: what is there counts
        newlines += block.count(b"\n")
        last = block[-1:]
        pos += len(block)
    return newlines + (1 if pos and last != b"\n" else 0), pos


def scan_lines(
    read_at: ReadAt,
    size: int,
    offset: int,
    limit: int | None,
    chunk: int = CHUNK_BYTES,
) -> LineSlice:
    """
    The lines from ``offset`` (from 1; a negative one counts from the end,
    ``-1`` being the last line), at most ``limit`` of them (None: to the
    end), found by reading ``chunk`` bytes at a time: memory stays at one
    chunk whatever the file's size, and the caller reads only the slice.
    """
    total, size = _total_lines(read_at, size, chunk)
    first = offset if offset > 0 else max(1, total + offset + 1)
    if first > total:
        return LineSlice(size, size, first, 0, total)
    count = total - first + 1 if limit is None else min(limit, total - first + 1)
    start = _after_newlines(read_at, size, 0, first - 1, chunk)
    end = _after_newlines(read_at, size, start, count, chunk)
    return LineSlice(start, end, first, count, total)


def file_lines(fd: int, size: int, offset: int, limit: int | None) -> LineSlice:
    """:func:`scan_lines` over an open file (blocking: in a thread)."""
    return scan_lines(lambda pos, n: os.pread(fd, n, pos), size, offset, limit)


def read_slice(fd: int, part: LineSlice) -> bytes:
    """The bytes of ``part`` in the file (blocking: in a thread)."""
    return os.pread(fd, part.end - part.start, part.start)


def line_slice(data: bytes, offset: int, limit: int | None) -> LineSlice:
    """:func:`scan_lines` over bytes in memory."""
    return scan_lines(lambda pos, n: data[pos : pos + n], len(data), offset, limit)
