"""
Lines of a file by number (:mod:`sandboxd.files.lines`), in memory.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.files.lines import count_lines, line_slice, scan_lines

TEXT = b"one\ntwo\nthree\nfour\nfive"


def sliced(data: bytes, offset: int, limit: int | None) -> tuple[bytes, int, int, bool]:
    s = line_slice(data, offset, limit)
    return data[s.start : s.end], s.first, s.count, s.more


class LineSliceTests(SynchronousTestCase):
    def test_counting(self) -> None:
        """A last line without a newline counts; an empty file has none."""
        self.assertEqual(
            [count_lines(d) for d in (b"", b"a", b"a\n", b"a\nb", b"\n\n")],
            [0, 1, 1, 2, 2],
        )

    def test_from_the_start(self) -> None:
        """offset from 1 and limit: those lines, newlines kept, and whether more follow."""
        self.assertEqual(sliced(TEXT, 2, 2), (b"two\nthree\n", 2, 2, True))
        self.assertEqual(sliced(TEXT, 1, None), (TEXT, 1, 5, False))
        self.assertEqual(sliced(TEXT, 4, 10), (b"four\nfive", 4, 2, False))

    def test_from_the_end(self) -> None:
        """A negative offset counts from the end: -1 is the last line."""
        self.assertEqual(sliced(TEXT, -2, None), (b"four\nfive", 4, 2, False))
        self.assertEqual(sliced(TEXT, -1, 1), (b"five", 5, 1, False))
        self.assertEqual(sliced(TEXT, -9, 1), (b"one\n", 1, 1, True))
        self.assertEqual(sliced(b"a\nb\n", -1, None), (b"b\n", 2, 1, False))

    def test_past_the_end(self) -> None:
        """An offset past the last line gives nothing, and nothing more."""
        self.assertEqual(sliced(TEXT, 6, None), (b"", 6, 0, False))
        self.assertEqual(sliced(b"", 1, 5), (b"", 1, 0, False))

    def test_small_reads_agree(self) -> None:
        """Read a byte or a few at a time, every slice is the one the whole bytes give."""
        for data in (TEXT, b"", b"\n", b"a\n\nb\n", b"x" * 10, b"\n\nab\ncd"):
            reader = lambda pos, n, d=data: d[pos : pos + n]  # noqa: E731
            for offset in (1, 2, 3, 5, 9, -1, -2, -4, -9):
                for limit in (None, 1, 2, 7):
                    want = line_slice(data, offset, limit)
                    for chunk in (1, 2, 3, 64):
                        self.assertEqual(
                            scan_lines(reader, len(data), offset, limit, chunk),
                            want,
                            (data, offset, limit, chunk),
                        )

    def test_file_shorter_than_said(self) -> None:
        """A file cut short since its size was read: its lines are what is left."""
        data = b"a\nb\n"
        s = scan_lines(lambda pos, n: data[pos : pos + n], 100, -1, None, chunk=2)
        self.assertEqual((s.start, s.end, s.first, s.total), (2, 4, 2, 2))
