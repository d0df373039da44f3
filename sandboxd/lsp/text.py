# -*- test-case-name: tests.lsp.test_text -*-
"""
A file's text as LSP counts it, and as an agent does.

LSP positions count lines from 0 and characters in UTF-16 code units
unless the server chose another of the encodings the daemon offers
(``utf-32``: characters; ``utf-8``: bytes); an agent counts lines and
columns from 1, in characters, as ``files_grep`` gives them.  A line ends
at ``\\n``, ``\\r\\n`` or ``\\r`` (LSP's three), nothing else.
"""

from __future__ import annotations

import copy
import re
from typing import Any

_LINE_BREAK = re.compile(r"\r\n|\r|\n")

#: The longest line text an answer carries.
MAX_LINE_CHARS = 1024


#: The position encodings the daemon offers a server, preferred first.
ENCODINGS = ("utf-16", "utf-32", "utf-8")


def _width(ch: str, encoding: str) -> int:
    """The code units one character takes in ``encoding``."""
    if encoding == "utf-32":
        return 1
    if encoding == "utf-8":
        return len(ch.encode("utf-8", "surrogatepass"))
    return 2 if ord(ch) > 0xFFFF else 1


def units(text: str, encoding: str = "utf-16") -> int:
    """How many code units of ``encoding`` ``text`` takes."""
    if text.isascii() or encoding == "utf-32":
        return len(text)
    return sum(_width(ch, encoding) for ch in text)


class Text:
    """The lines of one file's text, positions counted in ``encoding``."""

    def __init__(self, text: str, encoding: str = "utf-16") -> None:
        self.source = text
        self.lines = _LINE_BREAK.split(text)
        self.encoding = encoding if encoding in ENCODINGS else "utf-16"
        #: Where each line starts in ``source``.
        self.starts = [0] + [m.end() for m in _LINE_BREAK.finditer(text)]

    def in_encoding(self, encoding: str) -> Text:
        """The same lines, positions counted in ``encoding`` (nothing split again)."""
        other = copy.copy(self)
        other.encoding = encoding if encoding in ENCODINGS else "utf-16"
        return other

    def position(self, line: int, column: int) -> dict[str, int]:
        """
        The LSP position of 1-based ``line`` and ``column`` (characters); a
        column past the line's end is its end.

        :raises ValueError: a line that is not in the file.
        """
        if not 1 <= line <= len(self.lines):
            raise ValueError(f"line {line} is past the end ({len(self.lines)} lines)")
        text = self.lines[line - 1]
        index = min(max(column, 1) - 1, len(text))
        return {"line": line - 1, "character": units(text[:index], self.encoding)}

    def point(self, position: Any) -> tuple[int, int]:
        """An LSP position as 1-based ``(line, column)`` in characters."""
        line = _number(position, "line")
        offset = _number(position, "character")
        text = self.lines[line] if line < len(self.lines) else ""
        if text.isascii() or self.encoding == "utf-32":
            return line + 1, min(offset, len(text)) + 1
        count = 0
        for index, ch in enumerate(text):
            if count >= offset:
                return line + 1, index + 1
            count += _width(ch, self.encoding)
        return line + 1, len(text) + 1

    def index(self, position: Any) -> int:
        """Where an LSP position falls in ``source`` (past the end: the end)."""
        line, column = self.point(position)
        if line > len(self.lines):
            return len(self.source)
        return self.starts[line - 1] + column - 1

    def edited(self, edits: list[tuple[Any, str]]) -> str:
        """
        ``source`` with each ``(range, new_text)`` applied, as LSP means a
        list of text edits: every range is of the original text, none
        overlap, and edits at one position go in the order given.

        :raises ValueError: two edits overlap.
        """
        spans = sorted(
            (
                (self.index(r.get("start")), self.index(r.get("end")), order, new)
                for order, (r, new) in enumerate(edits)
            ),
            key=lambda e: (e[0], e[2]),
        )
        out: list[str] = []
        done = 0
        for start, end, _, new in spans:
            if start < done:
                raise ValueError("the server's edits overlap")
            out += [self.source[done:start], new]
            done = max(start, end)
        out.append(self.source[done:])
        return "".join(out)

    def line_text(self, line: int) -> str:
        """The text of 1-based ``line`` ("" past the end), cut at :data:`MAX_LINE_CHARS`."""
        if not 1 <= line <= len(self.lines):
            return ""
        return self.lines[line - 1][:MAX_LINE_CHARS]

    def span(self, lsp_range: Any) -> dict[str, int]:
        """An LSP range as ``line``, ``column``, ``end_line``, ``end_column``."""
        start = lsp_range.get("start") if isinstance(lsp_range, dict) else None
        end = lsp_range.get("end") if isinstance(lsp_range, dict) else None
        line, column = self.point(start)
        end_line, end_column = self.point(end if end is not None else start)
        return {
            "line": line,
            "column": column,
            "end_line": end_line,
            "end_column": end_column,
        }


def _number(position: Any, key: str) -> int:
    value = position.get(key) if isinstance(position, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return 0
