"""
The replacements of ``files_edit`` (:mod:`sandboxd.files.edit`), in memory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access.guard import PathGuard
from sandboxd.errors import ApiError
from sandboxd.files import edit
from sandboxd.files.edit import Edit, apply, decode
from tests.test_guard import make_rule


class ApplyTests(SynchronousTestCase):
    def test_one_exact_replacement(self) -> None:
        """An edit replaces its text where it is, and says on which line."""
        out = apply("a = 1\nb = 2\nc = 3\n", [Edit("b = 2", "b = 20")])
        self.assertEqual(out.text, "a = 1\nb = 20\nc = 3\n")
        self.assertEqual((out.counts, out.lines), ((1,), (2,)))

    def test_each_edit_sees_the_one_before(self) -> None:
        """Edits apply in order, each to the text the previous one left."""
        out = apply("x\n", [Edit("x", "y\nz"), Edit("z", "w")])
        self.assertEqual(out.text, "y\nw\n")
        self.assertEqual(out.lines, (1, 2))

    def test_missing_text_refused(self) -> None:
        """Text not in the file is 400 (kind not_found) naming the edit."""
        with self.assertRaises(ApiError) as caught:
            apply("abc\n", [Edit("a", "A"), Edit("q", "Q")])
        error = caught.exception
        self.assertEqual(
            (error.status, error.code, error.extra["kind"]),
            (400, "invalid_param", "not_found"),
        )
        self.assertEqual(error.extra["edit"], 1)
        self.assertTrue(error.message.startswith("edits[1]: "), error.message)

    def test_ambiguous_text_refused_unless_replace_all(self) -> None:
        """
        Text found twice is 400 (kind not_unique) with the count; with
        replace_all every occurrence is replaced and counted.
        """
        with self.assertRaises(ApiError) as caught:
            apply("x x x", [Edit("x", "y")])
        error = caught.exception
        self.assertEqual(
            (error.extra["kind"], error.extra["occurrences"]), ("not_unique", 3)
        )
        self.assertIn("3 times", error.message)
        out = apply("x x x", [Edit("x", "y", replace_all=True)])
        self.assertEqual((out.text, out.counts), ("y y y", (3,)))

    def test_insert_lines(self) -> None:
        """
        insert_line puts the text in as lines of their own after that line
        (0: first), adding the newlines it needs; past the end is 400
        (kind past_end).
        """
        cases = [
            ("a\nb\n", 0, "x", "x\na\nb\n"),
            ("a\nb\n", 1, "x\ny\n", "a\nx\ny\nb\n"),
            ("a\nb\n", 2, "x", "a\nb\nx"),
            ("a\nb", 2, "x\n", "a\nb\nx\n"),
            ("", 0, "x\n", "x\n"),
        ]
        for text, after, new, expected in cases:
            out = apply(text, [Edit("", new, insert_line=after)])
            self.assertEqual(out.text, expected, (text, after, new))
            self.assertEqual(out.lines, (after + 1,))
        with self.assertRaises(ApiError) as caught:
            apply("a\nb\n", [Edit("", "x", insert_line=3)])
        self.assertEqual(caught.exception.extra["kind"], "past_end")

    def test_matching_is_exact(self) -> None:
        """No folding of whitespace; CRLF in an edit matches only CRLF."""
        with self.assertRaises(ApiError):
            apply("a  b\n", [Edit("a b", "c")])
        with self.assertRaises(ApiError):
            apply("a\nb\n", [Edit("a\r\nb", "c")])
        self.assertEqual(apply("a\r\nb\r\n", [Edit("a\r\nb", "c")]).text, "c\r\n")

    def test_lf_edit_of_a_crlf_file(self) -> None:
        """
        In a file whose lines all end in CRLF, an edit written with LF finds
        its text and puts CRLF line ends in, so the file keeps one kind.
        """
        out = apply("a\r\nb\r\nc\r\n", [Edit("a\nb", "x\ny\nz")])
        self.assertEqual(out.text, "x\r\ny\r\nz\r\nc\r\n")
        self.assertEqual(out.lines, (1,))
        out = apply("a\r\nb\r\n", [Edit("", "x\ny\n", insert_line=1)])
        self.assertEqual(out.text, "a\r\nx\r\ny\r\nb\r\n")

    def test_crlf_file_keeps_crlf_when_old_is_found_as_written(self) -> None:
        """
        In an all-CRLF file, a one-line old_text (found as written) replaced
        by several lines, and an insert_line without a line end of its own,
        put CRLF in, never a bare LF.
        """
        out = apply("a\r\nb\r\n", [Edit("a", "A\nA2")])
        self.assertEqual(out.text, "A\r\nA2\r\nb\r\n")
        out = apply("a\r\nb\r\n", [Edit("", "first", insert_line=1)])
        self.assertEqual(out.text, "a\r\nfirst\r\nb\r\n")
        out = apply("a\r\nb", [Edit("", "last", insert_line=2)])
        self.assertEqual(out.text, "a\r\nb\r\nlast")
        # An LF-only file is untouched by any of this.
        self.assertEqual(apply("a\nb\n", [Edit("a", "A\nA2")]).text, "A\nA2\nb\n")

    def test_crlf_file_stays_crlf_when_old_starts_with_a_line_end(self) -> None:
        """
        In an all-CRLF file, an old_text that starts with (or is) a bare LF
        replaces the whole CRLF, and what it is replaced with gets CRLF line
        ends: the file never gets a bare LF.
        """
        out = apply("one\r\ntwo\r\nthree\r\n", [Edit("\ntwo", "\nTWO\nmore")])
        self.assertEqual(out.text, "one\r\nTWO\r\nmore\r\nthree\r\n")
        self.assertEqual(out.lines, (1,))
        out = apply("one\r\ntwo\r\n", [Edit("\n", "\n\n", replace_all=True)])
        self.assertEqual(out.text, "one\r\n\r\ntwo\r\n\r\n")
        self.assertEqual(out.counts, (2,))

    def test_crlf_in_new_text_alone_still_matches(self) -> None:
        """
        A CRLF in new_text does not stop an LF old_text from matching the
        CRLF file; bare LFs beside it in new_text are made CRLF too.
        """
        out = apply("one\r\ntwo\r\nthree\r\n", [Edit("two\nthree", "X\r\nY\nZ")])
        self.assertEqual(out.text, "one\r\nX\r\nY\r\nZ\r\n")

    def test_insert_at_top_keeps_the_byte_order_mark_first(self) -> None:
        """
        insert_line 0 in a file that starts with a BOM puts the new line
        after the BOM, which stays the file's first character (LF and CRLF
        files, and a file of only a BOM); line numbers ignore the BOM.
        """
        cases = [
            ("\ufeffimport os\n", 0, "# h\n", "\ufeff# h\nimport os\n"),
            ("\ufeffa\r\nb\r\n", 0, "# h", "\ufeff# h\r\na\r\nb\r\n"),
            ("\ufeffa\nb\n", 1, "x", "\ufeffa\nx\nb\n"),
            ("\ufeff", 0, "x\n", "\ufeffx\n"),
        ]
        for text, after, new, expected in cases:
            out = apply(text, [Edit("", new, insert_line=after)])
            self.assertEqual(out.text, expected, (text, after, new))
        with self.assertRaises(ApiError) as caught:
            apply("\ufeff", [Edit("", "x", insert_line=1)])
        self.assertEqual(caught.exception.extra["kind"], "past_end")

    def test_mixed_line_ends_stay_exact(self) -> None:
        """A file with both kinds of line end is matched as written."""
        with self.assertRaises(ApiError):
            apply("a\r\nb\nc\r\n", [Edit("a\nb", "x")])

    def test_non_utf8_is_not_text(self) -> None:
        """Bytes that are not UTF-8 are 400 (kind not_text), saying where."""
        with self.assertRaises(ApiError) as caught:
            decode(b"ok\xff", "f.bin")
        self.assertEqual(caught.exception.extra["kind"], "not_text")
        self.assertIn("byte 2", caught.exception.message)


class RaceTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.base = os.path.realpath(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.base)
        self.path = os.path.join(self.base, "f.txt")
        with open(self.path, "w") as f:
            f.write("one\n")

    def edit(self, if_match: str | None = None) -> dict[str, Any]:
        return edit.edit_file(
            PathGuard(make_rule(self.base)),
            "f.txt",
            [Edit("one", "two")],
            if_match=if_match,
            max_bytes=1000,
            too_large=lambda size: ApiError(413, "big"),
        )

    def writer(self, times: int) -> list[str]:
        """Another writer replacing the file during the next ``times`` edits."""
        real = edit.apply
        seen: list[str] = []

        def meanwhile(text: str, edits: Any) -> Any:
            seen.append(text)
            if len(seen) <= times:
                with open(self.path + ".new", "w") as f:
                    f.write(f"one\ntheirs {len(seen)}\n")
                os.rename(self.path + ".new", self.path)
            return real(text, edits)

        self.patch(edit, "apply", meanwhile)
        return seen

    def test_changed_while_edited(self) -> None:
        """
        A file another writer keeps replacing between the edit's read and
        its rename is not overwritten: 412 saying another writer changed it
        and nothing was written, the other writer's bytes stay, and no
        temporary file is left.
        """
        seen = self.writer(times=10)
        with self.assertRaises(ApiError) as caught:
            self.edit()
        self.assertEqual(caught.exception.code, "precondition_failed")
        self.assertIn("another writer changed f.txt", caught.exception.message)
        self.assertIn("nothing was written", caught.exception.message)
        self.assertEqual(len(seen), 3)
        with open(self.path) as f:
            self.assertEqual(f.read(), "one\ntheirs 3\n")
        self.assertEqual(os.listdir(self.base), ["f.txt"])

    def test_applied_again_to_the_new_text(self) -> None:
        """
        Without if_match, an edit that met another writer's change is
        applied to the new text: both changes are in the file.  With
        if_match it is the 412 of a stale ETag.
        """
        self.writer(times=1)
        answer = self.edit()
        self.assertTrue(answer["changed"])
        with open(self.path) as f:
            self.assertEqual(f.read(), "two\ntheirs 1\n")
        with open(self.path, "w") as f:
            f.write("one\n")
        etag = edit.edit_file(
            PathGuard(make_rule(self.base)),
            "f.txt",
            [Edit("one", "two")],
            if_match=None,
            max_bytes=1000,
            too_large=lambda size: ApiError(413, "big"),
            dry_run=True,
        )["etag"]
        self.writer(times=1)
        with self.assertRaises(ApiError) as caught:
            self.edit(if_match=etag)
        self.assertIn("since the given ETag", caught.exception.message)
