"""Positions between an agent's lines and columns and LSP's, in each encoding."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.lsp.text import Text, units


class TextTests(SynchronousTestCase):
    """Columns are characters for the agent, code units for the server."""

    def test_astral_characters_count_two_in_utf16(self) -> None:
        """After an emoji a column is one more UTF-16 unit than characters, and back."""
        text = Text("def f():\n    pass\ns = '😀'; f()\n")
        self.assertEqual(text.position(3, 10), {"line": 2, "character": 10})
        self.assertEqual(text.point({"line": 2, "character": 10}), (3, 10))
        self.assertEqual(text.position(1, 5), {"line": 0, "character": 4})

    def test_utf8_and_utf32(self) -> None:
        """A server that chose utf-8 counts bytes; utf-32, characters."""
        line = "é😀x"
        self.assertEqual(units(line, "utf-8"), 2 + 4 + 1)
        self.assertEqual(units(line, "utf-16"), 1 + 2 + 1)
        self.assertEqual(units(line, "utf-32"), 3)
        for encoding in ("utf-8", "utf-16", "utf-32"):
            text = Text(line, encoding)
            position = text.position(1, 3)
            self.assertEqual(text.point(position), (1, 3), encoding)

    def test_line_breaks(self) -> None:
        """LSP's three line breaks, and no other (a form feed is inside a line)."""
        text = Text("a\r\nb\rc\nd\x0ce")
        self.assertEqual(text.lines, ["a", "b", "c", "d\x0ce"])
        self.assertEqual(text.line_text(4), "d\x0ce")
        self.assertEqual(text.line_text(9), "")

    def test_past_the_end(self) -> None:
        """A line past the end is refused; a column past a line's end is its end."""
        text = Text("abc\n")
        self.assertRaises(ValueError, text.position, 3, 1)
        self.assertRaises(ValueError, text.position, 0, 1)
        self.assertEqual(text.position(1, 99), {"line": 0, "character": 3})
        self.assertEqual(text.point({"line": 7, "character": 3}), (8, 1))

    def test_span_of_a_garbled_range(self) -> None:
        """A range missing parts, or with nonsense, still gives numbers from 1."""
        text = Text("abc")
        self.assertEqual(
            text.span({"start": {"line": -1, "character": "x"}}),
            {"line": 1, "column": 1, "end_line": 1, "end_column": 1},
        )
        self.assertEqual(text.span(None)["line"], 1)
