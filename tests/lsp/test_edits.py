"""A server's edits written to files: all or none, and only over the text it saw."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access.guard import PathGuard
from sandboxd.errors import ApiError, payload_too_large
from sandboxd.files import atomic
from sandboxd.lsp import edits
from sandboxd.lsp.text import Text
from tests.test_guard import make_rule


def span(line: int, start: int, end: int) -> dict[str, Any]:
    return {
        "start": {"line": line, "character": start},
        "end": {"line": line, "character": end},
    }


class EditedTextTests(SynchronousTestCase):
    """LSP text edits against the original text."""

    def test_edits_apply_to_the_original(self) -> None:
        """Ranges are of the original text, whatever order the edits come in."""
        text = Text("a = 1\nb = a\r\nprint(a)")
        new = text.edited(
            [(span(2, 6, 7), "x"), (span(0, 0, 1), "x"), (span(1, 4, 5), "x")]
        )
        self.assertEqual(new, "x = 1\nb = x\r\nprint(x)")

    def test_inserts_in_order_and_overlaps_refused(self) -> None:
        """Two inserts at one place keep their order; overlapping edits are refused."""
        text = Text("ab")
        self.assertEqual(
            text.edited([(span(0, 1, 1), "1"), (span(0, 1, 1), "2")]), "a12b"
        )
        self.assertRaises(
            ValueError, text.edited, [(span(0, 0, 2), "x"), (span(0, 1, 2), "y")]
        )

    def test_astral_columns(self) -> None:
        """A UTF-16 position after an emoji lands after it."""
        self.assertEqual(Text("'😀'; f").edited([(span(0, 6, 7), "g")]), "'😀'; g")


class PlanAndWriteTests(SynchronousTestCase):
    """Files read, checked and planned before any is written."""

    def setUp(self) -> None:
        self.base = os.path.realpath(self.mktemp())
        os.makedirs(os.path.join(self.base, "ro"))

    def put(self, name: str, text: str) -> str:
        path = os.path.join(self.base, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def read(self, path: str) -> str:
        with open(path) as f:
            return f.read()

    def run_plan(self, guard: PathGuard, changes: Any, sent: Any = None) -> Any:
        return edits.plan(
            guard,
            changes,
            "utf-16",
            sent or {},
            1000,
            lambda n: payload_too_large(1000),
        )

    def test_all_files_written(self) -> None:
        """Both files change; the diff names the change."""
        a = self.put("a.py", "def f(): pass\n")
        b = self.put("b.py", "f()\n")
        guard = PathGuard(make_rule(self.base))
        planned = self.run_plan(
            guard, {a: [(span(0, 4, 5), "g")], b: [(span(0, 0, 1), "g")]}
        )
        edits.write(guard, planned)
        self.assertEqual((self.read(a), self.read(b)), ("def g(): pass\n", "g()\n"))
        self.assertIn(
            "-def f(): pass\n+def g(): pass\n", edits.describe(planned[0])["diff"]
        )

    def test_read_only_file_refused_before_any_write(self) -> None:
        """A file below read_only stops the plan: no file is written."""
        a = self.put("a.py", "f\n")
        b = self.put("ro/b.py", "f\n")
        guard = PathGuard(
            make_rule(self.base, read_only=[os.path.join(self.base, "ro")])
        )
        with self.assertRaises(ApiError) as caught:
            self.run_plan(guard, {a: [(span(0, 0, 1), "g")], b: [(span(0, 0, 1), "g")]})
        self.assertEqual(caught.exception.code, "read_only")
        self.assertEqual((self.read(a), self.read(b)), ("f\n", "f\n"))

    def test_denied_file_counted_not_named(self) -> None:
        """
        A file the caller may not read stops the plan with a 403 that
        counts it and does not name it; one it may read but not write
        (read_only) is named, as the caller can see it anyway.
        """
        os.makedirs(os.path.join(self.base, "secret"))
        a = self.put("a.py", "f\n")
        hidden = self.put("secret/keys.py", "f\n")
        guard = PathGuard(make_rule(self.base, deny=["**/secret/**"]))
        with self.assertRaises(ApiError) as caught:
            self.run_plan(
                guard, {a: [(span(0, 0, 1), "g")], hidden: [(span(0, 0, 1), "g")]}
            )
        error = caught.exception
        self.assertEqual((error.status, error.code), (403, "path_denied"))
        self.assertNotIn("keys", error.message)
        self.assertEqual(error.body()["outside"], 1)
        self.assertEqual(self.read(a), "f\n")

    def test_changed_since_sent(self) -> None:
        """
        A file that is no longer the text the server was sent is 412, said
        as a change during the rename (the caller gave no ETag).
        """
        a = self.put("a.py", "f\n")
        sent = {a: hashlib.sha256(b"other\n").digest()}
        guard = PathGuard(make_rule(self.base))
        with self.assertRaises(ApiError) as caught:
            self.run_plan(guard, {a: [(span(0, 0, 1), "g")]}, sent)
        self.assertEqual(caught.exception.status, 412)
        self.assertNotIn("ETag", caught.exception.message)
        self.assertIn("ask again", caught.exception.message)

    def test_failure_puts_every_file_back(self) -> None:
        """The second file's write fails: the first file is put back as it was."""
        a = self.put("a.py", "f\n")
        b = self.put("b.py", "f\n")
        guard = PathGuard(make_rule(self.base))
        planned = self.run_plan(
            guard, {a: [(span(0, 0, 1), "g")], b: [(span(0, 0, 1), "g")]}
        )
        real = atomic.AtomicWrite.write
        calls = []

        def failing(writer: Any, data: Any) -> None:
            calls.append(writer)
            if len(calls) == 2:
                raise OSError(28, "No space left on device")
            real(writer, data)

        self.patch(atomic.AtomicWrite, "write", failing)
        self.assertRaises(OSError, edits.write, guard, planned)
        self.assertEqual((self.read(a), self.read(b)), ("f\n", "f\n"))
        self.assertEqual(sorted(os.listdir(self.base)), ["a.py", "b.py", "ro"])
