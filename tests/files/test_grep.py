"""
The content search of ``files_grep`` (:mod:`sandboxd.files.grep`) in a
temporary directory, without a daemon: what it finds, what it skips, its
bounds, and a pattern that backtracks without end.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access.guard import PathGuard
from sandboxd.errors import ApiError
from sandboxd.files.grep import Bounds, Query, grep
from tests.test_guard import _rmtree, make_rule

#: A pattern that backtracks exponentially on a long run of ``a`` not
#: followed by the end, and such a line.
CATASTROPHIC = r"(a+)+$"
LONG_LINE = "a" * 5000 + "b\n"


class GrepCase(SynchronousTestCase):
    """A base directory of files, searched through a guard."""

    def setUp(self) -> None:
        self.base = os.path.realpath(tempfile.mkdtemp())
        self.addCleanup(_rmtree, self.base)
        self.guard = PathGuard(make_rule(self.base))

    def put(self, rel: str, data: str | bytes) -> str:
        path = os.path.join(self.base, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        return path

    def grep(
        self,
        pattern: str,
        path: str = ".",
        max_results: int = 1000,
        timeout: float = 10.0,
        **options: Any,
    ) -> dict[str, Any]:
        depth = options.pop("depth", None)
        context = options.pop("context", 0)
        bounds = Bounds(
            max_results,
            timeout,
            **({"depth": depth} if depth else {}),
            context=context,
        )
        return grep(self.guard, path, Query(pattern, **options), bounds)

    def found(self, answer: dict[str, Any]) -> list[tuple[str, int, int, str]]:
        """(path relative to the base, line, column, text) of each match."""
        return [
            (
                os.path.relpath(m["path"], self.base),
                m["line"],
                m["column"],
                m["text"],
            )
            for m in answer["matches"]
        ]


class MatchTests(GrepCase):
    """What a match is: its file, line, column and text."""

    def test_lines_and_columns(self) -> None:
        """
        Lines and columns count from 1 (columns in characters, not bytes);
        files come in walk order (names sorted per directory, a directory's
        files where its name sorts), with the counts of files.
        """
        self.put("b.txt", "nothing\nsay héllo\n")
        self.put("a/z.txt", "hello\n")
        self.put("c.txt", "no match here\n")
        answer = self.grep("h.llo")
        self.assertEqual(
            self.found(answer),
            [("a/z.txt", 1, 1, "hello"), ("b.txt", 2, 5, "say héllo")],
        )
        self.assertEqual(
            {k: v for k, v in answer.items() if k != "matches"},
            {
                "files_searched": 3,
                "files_matched": 2,
                "files_skipped": 0,
                "truncated": False,
                "timed_out": False,
            },
        )
        self.assertNotIn("cut", answer["matches"][0])

    def test_several_matches_on_a_line(self) -> None:
        """Each match is one entry, the line's text repeated."""
        self.put("f.txt", "cat hat bat\n")
        self.assertEqual(
            self.found(self.grep("[ch]at")),
            [("f.txt", 1, 1, "cat hat bat"), ("f.txt", 1, 5, "cat hat bat")],
        )

    def test_fixed_strings(self) -> None:
        """With fixed_strings, regex metacharacters are the text itself."""
        self.put("f.txt", "a.b(c)*\naxb(c)\n")
        self.assertEqual(
            self.found(self.grep("a.b(c)*", fixed_strings=True)),
            [("f.txt", 1, 1, "a.b(c)*")],
        )
        # As a regex, the same pattern matches both lines.
        self.assertEqual(len(self.grep("a.b(c)*")["matches"]), 2)

    def test_ignore_case(self) -> None:
        """ignore_case matches any case, for regexes and fixed strings alike."""
        self.put("f.txt", "Hello\nHELLO\nhello\n")
        self.assertEqual(len(self.grep("hello")["matches"]), 1)
        self.assertEqual(len(self.grep("hello", ignore_case=True)["matches"]), 3)
        self.assertEqual(
            len(self.grep("HeLLo", ignore_case=True, fixed_strings=True)["matches"]),
            3,
        )

    def test_include(self) -> None:
        """include is an fnmatch pattern on file names: other files are not read."""
        self.put("a.py", "x = 1\n")
        self.put("sub/b.py", "x = 2\n")
        self.put("c.txt", "x = 3\n")
        answer = self.grep("x =", include="*.py")
        self.assertEqual([m[0] for m in self.found(answer)], ["a.py", "sub/b.py"])
        self.assertEqual(answer["files_searched"], 2)

    def test_one_file(self) -> None:
        """path may name one file: only it is searched."""
        self.put("a.txt", "one\n")
        self.put("b.txt", "one\n")
        answer = self.grep("one", "b.txt")
        self.assertEqual(self.found(answer), [("b.txt", 1, 1, "one")])

    def test_empty_matches(self) -> None:
        """An empty match counts once a line, and not on a line with another."""
        self.put("f.txt", "abc\n\nxx\n")
        self.assertEqual(
            [(m[1], m[2]) for m in self.found(self.grep("^"))],
            [(1, 1), (2, 1), (3, 1)],
        )
        self.assertEqual(
            [(m[1], m[2]) for m in self.found(self.grep("x*"))],
            [(1, 1), (2, 1), (3, 1)],
        )

    def test_lines_without_newlines(self) -> None:
        """
        The last line needs no newline; an empty file has no line; a CRLF
        line's text (and its context lines') ends before the CR.
        """
        self.put("f.txt", "first\r\nlast")
        self.put("g.txt", "")
        self.assertEqual(
            self.found(self.grep("t")),
            [("f.txt", 1, 5, "first"), ("f.txt", 2, 4, "last")],
        )
        [match] = self.grep("last", "f.txt", context=1)["matches"]
        self.assertEqual(match["before"], ["first"])
        self.assertEqual(self.grep("^", "g.txt")["matches"], [])

    def test_same_matches_line_by_line(self) -> None:
        """
        The file is searched whole, in one pass, and finds what matching
        each line alone finds (a pattern never matches across a newline,
        even one that says so).
        """
        text = "foo bar\n\n  baz foo\nfoo\nbar foo bar\n\tfoo\nend"
        self.put("f.txt", text + "\n")
        lines = text.split("\n")
        for pattern in (
            r"foo",
            r"\sfoo",
            r"foo\s",
            r"^foo",
            r"foo$",
            r"^$",
            r"o+",
            r"\bba.",
            r"[^a]+",
            r"o\s*",
        ):
            compiled = re.compile(pattern)
            expected = []
            for number, line in enumerate(lines, 1):
                spans = [m.span() for m in compiled.finditer(line)]
                starts = [s for s, e in spans if s < e] or [s for s, _ in spans][:1]
                expected += [("f.txt", number, s + 1, line) for s in starts]
            self.assertEqual(self.found(self.grep(pattern)), expected, pattern)

    def test_undecodable_bytes(self) -> None:
        """Bytes that are not UTF-8 are shown as U+FFFD in the text."""
        self.put("f.txt", b"caf\xe9 ok\n")
        self.assertEqual(self.found(self.grep("ok")), [("f.txt", 1, 6, "caf\ufffd ok")])

    def test_context(self) -> None:
        """
        context gives the lines before and after each match (fewer at a
        file's ends), nearest last before and first after.
        """
        self.put("f.txt", "a\nb\nneedle\nc\nd\ne\n")
        self.put("g.txt", "needle")
        answer = self.grep("needle", context=2)
        self.assertEqual(
            [(m["before"], m["after"]) for m in answer["matches"]],
            [(["a", "b"], ["c", "d"]), ([], [])],
        )
        self.put("h.txt", "x\nneedle\n")
        matches = self.grep("needle", "h.txt", context=5)["matches"]
        self.assertEqual((matches[0]["before"], matches[0]["after"]), (["x"], []))
        self.assertNotIn("before", self.grep("needle", "h.txt")["matches"][0])

    def test_long_line_cut(self) -> None:
        """A line over 1024 characters is cut there and marked cut."""
        self.put("f.txt", "x" * 2000 + "needle\nneedle\n")
        matches = self.grep("needle")["matches"]
        self.assertEqual(
            [(m["column"], len(m["text"]), m.get("cut")) for m in matches],
            [(2001, 1024, True), (1, 6, None)],
        )
        self.assertTrue(matches[0]["text"].endswith("needle"))

    def test_long_line_cut_around_the_match(self) -> None:
        """
        A match deep in a long line shows the part of the line around it,
        with text_column the column text starts at; one near the start
        shows the line's start (no text_column then is 1).
        """
        self.put("min.js", "var a=1;" * 100_000 + "NEEDLE" + ";x" * 10 + "\n")
        self.put("near.js", "NEEDLE" + "y" * 5000 + "\n")
        matches = self.grep("NEEDLE")["matches"]
        deep, near = matches
        self.assertEqual((deep["column"], deep["cut"]), (800_001, True))
        self.assertEqual(len(deep["text"]), 1024)
        at = deep["column"] - deep["text_column"]
        self.assertEqual(deep["text"][at : at + 6], "NEEDLE")
        self.assertEqual(
            (near["column"], near["text_column"], near["text"][:6]), (1, 1, "NEEDLE")
        )

    def test_include_with_braces(self) -> None:
        """
        include takes {a,b} alternatives as ripgrep's globs do (braces in
        [...] are literal); a brace left open or nested is 400.
        """
        for name in ("a.js", "b.ts", "c.txt", "d{.js"):
            self.put(name, "needle\n")
        answer = self.grep("needle", include="*.{js,ts}")
        self.assertEqual([m[0] for m in self.found(answer)], ["a.js", "b.ts", "d{.js"])
        answer = self.grep("needle", include="?[{]*")
        self.assertEqual([m[0] for m in self.found(answer)], ["d{.js"])
        for include in ("*.{js,ts", "*.{js,{ts,tsx}}", "{a,b}" * 9):
            with self.assertRaises(ApiError) as caught:
                self.grep("needle", include=include)
            self.assertEqual(caught.exception.code, "invalid_param", include)
            self.assertIn("'include'", caught.exception.message)

    def test_pattern_with_a_newline_refused(self) -> None:
        """
        A pattern holding a newline (as such, or as \\n in a regex) can
        never match, since no match spans a line end: 400, saying so; an
        escaped backslash before n is not one.
        """
        self.put("f.txt", "first\nsecond\n\\n\n")
        for pattern, fixed in (
            ("first\nsecond", False),
            ("first\nsecond", True),
            (r"first\nsecond", False),
            (r"[\n]", False),
        ):
            with self.assertRaises(ApiError) as caught:
                self.grep(pattern, fixed_strings=fixed)
            self.assertEqual(caught.exception.code, "invalid_param", pattern)
            self.assertIn("newline", caught.exception.message)
        self.assertEqual(len(self.grep(r"\\n")["matches"]), 1)
        self.assertEqual(len(self.grep(r"\n", fixed_strings=True)["matches"]), 1)

    def test_bad_regex(self) -> None:
        """
        A pattern that does not compile, or that RE2 does not take (a
        lookaround, a backreference), is 400 invalid_param, naming
        fixed_strings.
        """
        for pattern in ("(", "a**", "(?<=a)b", r"(a)\1"):
            with self.assertRaises(ApiError) as caught:
                self.grep(pattern)
            self.assertEqual(
                (caught.exception.status, caught.exception.code),
                (400, "invalid_param"),
            )
            self.assertIn("not a valid regular expression", caught.exception.message)
            self.assertIn("fixed_strings", caught.exception.message)

    def test_patterns_that_would_take_the_memory(self) -> None:
        """
        Repeats past RE2's bound, or whose program would pass the memory
        bound (hundreds of megabytes written out, in a backtracking engine),
        are 400 before anything is searched; ordinary repeats, nested ones
        included, are taken.
        """
        self.put("f.txt", "2024-01-31 abc\n")
        for pattern in (
            "a{1000000}",
            "(ab){100000}",
            "a{0,1000000}bc",
            "(a{1000}){1000}",
            "[[](a{1000}){1000}",
            "((a{100}){100}){100}",
        ):
            with self.assertRaises(ApiError) as caught:
                self.grep(pattern)
            self.assertEqual(caught.exception.code, "invalid_param", pattern)
        for pattern in (
            r"\d{4}-\d{2}-\d{2}",
            "[a-c]{3}",
            "(c+)+$",
            "(" * 20 + "a+" + ")+" * 20,
        ):
            self.assertEqual(len(self.grep(pattern)["matches"]), 1, pattern)
        answer = self.grep("a{1000000}", fixed_strings=True)
        self.assertEqual(answer["matches"], [])


class SkipTests(GrepCase):
    """What is not searched."""

    def test_binary_skipped(self) -> None:
        """A NUL in the first 8 KiB makes a file binary: skipped and counted."""
        self.put("bin.dat", b"needle\0needle\n")
        self.put("late.dat", b"x" * 9000 + b"\0needle\n")
        answer = self.grep("needle")
        self.assertEqual(
            self.found(answer), [("late.dat", 1, 9002, "x" * 1017 + "\0needle")]
        )
        self.assertEqual((answer["files_skipped"], answer["files_searched"]), (1, 1))

    def test_oversize_skipped(self) -> None:
        """A file over the per-file bound is skipped and counted."""
        self.put("big.txt", "needle\n" * 100)
        self.put("small.txt", "needle\n")
        bounds = Bounds(1000, 10.0, max_file_bytes=100)
        answer = grep(self.guard, ".", Query("needle"), bounds)
        self.assertEqual(self.found(answer), [("small.txt", 1, 1, "needle")])
        self.assertEqual(answer["files_skipped"], 1)

    def test_vcs_directories_not_descended(self) -> None:
        """
        .git, .hg and .svn are not searched, with hidden either; other dot
        directories are with hidden, and are not without it.
        """
        for vcs in (".git", ".hg", ".svn"):
            self.put(f"{vcs}/config", "needle\n")
        self.put(".github/workflow.yml", "needle\n")
        answer = self.grep("needle", hidden=True)
        self.assertEqual([m[0] for m in self.found(answer)], [".github/workflow.yml"])
        self.assertEqual(self.grep("needle")["matches"], [])

    def test_links_not_followed(self) -> None:
        """A link to a file or a directory is not followed, inside or out."""
        outside = os.path.realpath(tempfile.mkdtemp())
        self.addCleanup(_rmtree, outside)
        with open(os.path.join(outside, "secret.txt"), "w") as f:
            f.write("needle\n")
        self.put("real.txt", "needle\n")
        os.symlink(outside, os.path.join(self.base, "out"))
        os.symlink(os.path.join(outside, "secret.txt"), os.path.join(self.base, "o"))
        os.symlink("real.txt", os.path.join(self.base, "alias.txt"))
        answer = self.grep("needle")
        self.assertEqual(self.found(answer), [("real.txt", 1, 1, "needle")])

    def test_denied_files_hidden(self) -> None:
        """Files the policy denies are not read; their matches are not shown."""
        self.guard = PathGuard(make_rule(self.base, deny=["**/.env", "secrets/**"]))
        self.put(".env", "TOKEN=needle\n")
        self.put("secrets/key", "needle\n")
        self.put("app.py", "needle\n")
        answer = self.grep("needle")
        self.assertEqual([m[0] for m in self.found(answer)], ["app.py"])
        self.assertEqual(answer["files_searched"], 1)


class BoundTests(GrepCase):
    """max_results, max_depth and the time limit."""

    def test_max_results(self) -> None:
        """More matches than max_results: that many, marked truncated."""
        self.put("f.txt", "x x x\nx\n")
        answer = self.grep("x", max_results=3)
        self.assertEqual(
            ([(m[1], m[2]) for m in self.found(answer)], answer["truncated"]),
            ([(1, 1), (1, 3), (1, 5)], True),
        )
        answer = self.grep("x", max_results=4)
        self.assertEqual((len(answer["matches"]), answer["truncated"]), (4, False))

    def test_max_depth(self) -> None:
        """max_depth 1 searches the directory's own files; 2 one level below."""
        for rel in ("a.txt", "x/b.txt", "x/y/c.txt"):
            self.put(rel, "needle\n")
        found = [
            [m[0] for m in self.found(self.grep("needle", depth=depth))]
            for depth in (1, 2, 3)
        ]
        self.assertEqual(
            found,
            [["a.txt"], ["a.txt", "x/b.txt"], ["a.txt", "x/b.txt", "x/y/c.txt"]],
        )

    def test_backtracking_pattern_is_linear(self) -> None:
        """
        A pattern that a backtracking engine takes without end on a long
        line (``re`` would run for ages) is answered at once.
        """
        self.put("b.txt", LONG_LINE)
        began = time.monotonic()
        answer = self.grep(CATASTROPHIC, timeout=5.0)
        self.assertLess(time.monotonic() - began, 1.0)
        self.assertEqual((answer["matches"], answer["timed_out"]), ([], False))

    def test_given_up_when_no_one_waits(self) -> None:
        """
        Once ``stopping`` says the caller left (or the daemon stops), the
        search ends at the next file or match instead of running on.
        """
        for n in range(20):
            self.put(f"f{n:02}.txt", "needle\n")
        looked: list[int] = []

        def stopping() -> bool:
            looked.append(1)
            return len(looked) > 3

        answer = grep(
            self.guard,
            ".",
            Query("needle"),
            Bounds(1000, 10.0, stopping=stopping),
        )
        self.assertLess(len(answer["matches"]), 5)

    def test_time_limit(self) -> None:
        """
        Past its time limit the search ends with what it found so far and
        says timed_out.
        """
        for n in range(50):
            self.put(f"f{n:02}.txt", "needle\n")
        answer = self.grep("needle", timeout=0.0)
        self.assertTrue(answer["timed_out"])
        self.assertLess(len(answer["matches"]), 50)

    def test_lock_let_go_while_matching(self) -> None:
        """
        While RE2 searches a big file, another thread runs too: the engine
        does not hold the interpreter's lock.
        """
        self.put("big.txt", "x" * (8 << 20) + "\n")
        counted = [0]
        stop = threading.Event()

        def count() -> None:
            while not stop.is_set():
                counted[0] += 1

        counter = threading.Thread(target=count)
        counter.start()
        try:
            began = time.monotonic()
            rounds = 0
            while time.monotonic() - began < 0.5:
                self.grep(r"(x|y)*z\w{5}")
                rounds += 1
        finally:
            stop.set()
            counter.join()
        # Held through each search, the lock would leave the counter a
        # switch interval (5 ms) per round at most.
        self.assertGreater(counted[0], 100_000 * rounds)


class IgnoreTests(GrepCase):
    """ripgrep's defaults: ignore files and hidden entries, unless asked."""

    def setUp(self) -> None:
        super().setUp()
        self.put(".gitignore", "web/node_modules/\n*.log\n!keep.log\n")
        self.put("web/src/app.js", "useState\n")
        self.put("web/node_modules/react/index.js", "useState\n")
        self.put("web/.venv/lib/x.py", "useState\n")
        self.put("web/debug.log", "useState\n")
        self.put("web/keep.log", "useState\n")
        self.put("web/dist/.ignore", "*.map\n")
        self.put("web/dist/out.js", "useState\n")
        self.put("web/dist/out.js.map", "useState\n")

    def paths(self, path: str = ".", **options: Any) -> list[str]:
        return sorted(m[0] for m in self.found(self.grep("useState", path, **options)))

    def test_ignored_and_hidden_left_out(self) -> None:
        """
        What the ignore files name (a parent's, below the path searched too;
        a '!' re-including) and hidden directories are not searched, so the
        project's own files are what is found.
        """
        expected = ["web/dist/out.js", "web/keep.log", "web/src/app.js"]
        self.assertEqual(self.paths(), expected)
        # Searching below the .gitignore's directory, its rules still hold.
        self.assertEqual(self.paths(os.path.join(self.base, "web")), expected)

    def test_everything_and_excluded(self) -> None:
        """no_ignore and hidden search everything; exclude leaves out its globs."""
        self.assertEqual(len(self.paths(no_ignore=True, hidden=True)), 7)
        self.assertEqual(self.paths(exclude=("dist", "*.log")), ["web/src/app.js"])
        self.assertEqual(
            self.paths(no_ignore=True, exclude=("web/node_modules/**",)),
            [
                "web/debug.log",
                "web/dist/out.js",
                "web/dist/out.js.map",
                "web/keep.log",
                "web/src/app.js",
            ],
        )

    def test_crlf_line_ends(self) -> None:
        """In a CRLF file, $ matches at each line's end, as in an LF one."""
        self.put("crlf.txt", b"one-a\r\ntwo-b\r\n")
        answer = self.grep("two-.$", os.path.join(self.base, "crlf.txt"))
        self.assertEqual(self.found(answer), [("crlf.txt", 2, 1, "two-b")])
