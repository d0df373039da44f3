# -*- test-case-name: tests.files.test_lines -*-
"""
Lines of a file's bytes, by number: a read of part of a file
(``download`` with ``offset`` and ``limit``).

A model reads a file into its context; a log or a generated file of tens
of thousands of lines would not fit, and after a content search it wants
the lines around a match, not the file.  Lines are counted as grep and an
editor count them: each ends at ``\\n`` (kept in the slice), the last one
may have none.
"""

from __future__ import annotations

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


def count_lines(data: bytes) -> int:
    """Lines in ``data``: its newlines, and one more for a last line without one."""
    newlines = data.count(b"\n")
    return newlines + (1 if data and not data.endswith(b"\n") else 0)


def _start_of(data: bytes, line: int, pos: int = 0) -> int:
    """
    The byte where line ``line`` (from 1, counted from the one starting at
    ``pos``) starts; ``len(data)`` past the end.
    """
    for _ in range(line - 1):
        found = data.find(b"\n", pos)
        if found < 0:
            return len(data)
        pos = found + 1
    return pos


def line_slice(data: bytes, offset: int, limit: int | None) -> LineSlice:
    """
    The lines from ``offset`` (from 1; a negative one counts from the end,
    ``-1`` being the last line), at most ``limit`` of them (None: to the end).
    """
    total = count_lines(data)
    first = offset if offset > 0 else max(1, total + offset + 1)
    if first > total:
        return LineSlice(len(data), len(data), first, 0, total)
    count = total - first + 1 if limit is None else min(limit, total - first + 1)
    start = _start_of(data, first)
    end = _start_of(data, count + 1, start)
    return LineSlice(start, end, first, count, total)
