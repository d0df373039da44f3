# -*- test-case-name: tests.files.test_grep -*-
"""
``files_grep``: the lines of files that match a pattern, below a path.

Runs in a worker thread, over :func:`~sandboxd.files.walk.walk_at`: the
same walk, the same entries hidden (what the policy denies, links) as a
listing or a name search.  Each file is opened relative to its directory's
fd with ``O_NOFOLLOW``, never by a path string, so a directory swapped for
a link while the walk runs cannot lead out of the boundary; links are not
followed at all (as ripgrep without ``-L``).

Patterns are compiled by the third-party ``regex`` module rather than
``re``: ``re`` holds the interpreter's lock for the whole of one match, so
a pattern that backtracks without end (``(a+)+$`` on a long line of ``a``)
would stop every other thread, the reactor's included, until it ended.
``regex`` lets go of the lock while it matches (``concurrent=True``) and
gives up at a deadline (``timeout=``): one match cannot outlast the
endpoint's ``timeout_seconds``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import posixpath
import re
import stat
import time
from collections.abc import Iterator
from typing import Any

import attrs
import regex

from sandboxd.access.guard import PathGuard
from sandboxd.errors import bad_request
from sandboxd.files.walk import display_name, visible, walk_at
from sandboxd.policy.defaults import (
    ENDPOINT_LIMITS,
    GREP_BINARY_PROBE_BYTES,
    GREP_LINE_CHARS,
    GREP_PATTERN_NODES,
    WALK_DEPTH,
)

#: Directories of version control, not descended into (as ripgrep skips
#: them): their objects are the files' history, not the files.
VCS_DIRS = frozenset({".git", ".hg", ".svn"})

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

#: What makes a match on one line depend on the text around that line:
#: extensions ``(?...`` other than ``(?:`` (lookarounds, inline flags,
#: atomic groups, conditionals), the anchors of the whole text, graphemes
#: (``\r\n`` is one) and possessive repeats.  A pattern with none of them
#: matches a line alone wherever it matches that line within the file, so
#: the file is searched whole for the next candidate line (in the engine,
#: not line by line in Python).  A pattern with one is tried on every line.
_NEEDS_LINES = re.compile(r"\(\?(?!:)|\\[AZzGX]|[*+?}]\+")

#: A counted repeat: ``{3}``, ``{2,}``, ``{1,5}``, ``{,5}``.
_COUNTED = re.compile(r"\{(\d*)(,?)(\d*)\}")

#: Verbose mode switched on inline (``(?x)``, ``(?ix:``): its comments make
#: the text of a pattern say less than it seems about its size.
_VERBOSE = re.compile(r"\(\?[a-zA-Z]*x[a-zA-Z-]*[):]")


def pattern_size(pattern: str) -> int:
    """
    An upper bound of what the regex module writes out when it compiles
    ``pattern``: each atom counts one, a group what is inside it, and a
    repeat multiplies by its minimum count and one (``+`` by two).

    The pattern's text is read twice, with ``[...]`` as a character set
    and with its brackets as plain characters, and the greater answer
    kept: a set misread (a ``[`` that is a literal, a nested set) can then
    only make the answer bigger.
    """
    return max(_size(pattern, sets=True), _size(pattern, sets=False))


def _size(pattern: str, sets: bool) -> int:
    stack: list[list[int]] = [[]]
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        items = stack[-1]
        if c == "\\":
            items.append(1)
            i += 2
        elif c == "[" and sets:
            j = i + 1
            j += pattern.startswith("^", j)
            j += pattern.startswith("]", j)
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            items.append(1)
            i = j + 1 if j < n else i + 1
        elif pattern.startswith("(?#", i):
            end = pattern.find(")", i)
            i = n if end < 0 else end + 1
        elif c == "(":
            stack.append([])
            i += 1
        elif c == ")" and len(stack) > 1:
            inner = stack.pop()
            stack[-1].append(sum(inner) or 1)
            i += 1
        elif c == "+" and items and pattern[i - 1] not in "*+?}":
            items[-1] *= 2
            i += 1
        elif (m := _COUNTED.match(pattern, i)) and items and (m[1] or m[3]):
            items[-1] *= int(m[1] or 0) + 1
            i = m.end()
        elif c in "*?|":
            i += 1
        else:
            items.append(1)
            i += 1
    while len(stack) > 1:
        inner = stack.pop()
        stack[-1].append(sum(inner))
    return sum(stack[0])


@attrs.frozen
class Query:
    """
    What is looked for.

    :ivar pattern: a regular expression (the ``regex`` module's, which
        takes what ``re`` takes), or the text itself with ``fixed_strings``.
    :ivar include: an fnmatch pattern on file names (``*.py``); files found
        by the walk whose names do not match are not read.
    """

    pattern: str
    fixed_strings: bool = False
    ignore_case: bool = False
    include: str | None = None


@attrs.frozen
class Bounds:
    """
    How much one search may take.

    :ivar max_results: matches answered; one more sets ``truncated``.
    :ivar timeout: seconds for the whole search, a match in progress
        included.
    :ivar depth: levels walked (1: the directory's own entries).
    :ivar max_file_bytes: a bigger file is skipped.
    """

    max_results: int
    timeout: float
    depth: int = WALK_DEPTH
    max_file_bytes: int = ENDPOINT_LIMITS["files_grep"]["max_bytes"]
    line_chars: int = GREP_LINE_CHARS


def compile_query(query: Query) -> tuple[regex.Pattern[str], regex.Pattern[str] | None]:
    """
    The pattern a line is matched with, and the one the whole text is
    searched with for candidate lines (None when lines must each be tried).

    :raises ApiError: 400 ``invalid_param`` for a pattern that does not
        compile.
    """
    source = regex.escape(query.pattern) if query.fixed_strings else query.pattern
    flags = regex.IGNORECASE if query.ignore_case else 0
    if not query.fixed_strings:
        if _VERBOSE.search(source) is not None:
            raise bad_request(
                "'pattern' switches on verbose mode ((?x)), which is not taken here"
            )
        if pattern_size(source) > GREP_PATTERN_NODES:
            raise bad_request(
                "'pattern' repeats too much: its counted repeats ({n}) and nested "
                f"+ multiply out past {GREP_PATTERN_NODES}"
            )
    try:
        line = regex.compile(source, flags)
        whole = None
        if query.fixed_strings or _NEEDS_LINES.search(source) is None:
            whole = regex.compile(source, flags | regex.MULTILINE)
    except (regex.error, RecursionError, OverflowError, ValueError) as e:
        raise bad_request(
            f"'pattern' is not a valid regular expression ({e}); to search "
            "for the text as written, pass fixed_strings: true"
        ) from None
    return line, whole


class _Over(Exception):
    """The search ends here (its flags say why)."""


@attrs.define
class _Search:
    """One search's state: the matches so far and the counts."""

    line: regex.Pattern[str]
    whole: regex.Pattern[str] | None
    bounds: Bounds
    deadline: float
    matches: list[dict[str, Any]] = attrs.Factory(list)
    searched: int = 0
    matched: int = 0
    skipped: int = 0
    truncated: bool = False
    timed_out: bool = False

    def left(self) -> float:
        """Seconds left, or :class:`_Over` (timed out) when none are."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.timed_out = True
            raise _Over
        return left

    def file(self, fd: int, st: os.stat_result, shown: str) -> None:
        """Search the open regular file ``fd`` (status ``st``)."""
        if st.st_size > self.bounds.max_file_bytes:
            self.skipped += 1
            return
        try:
            data = _read(fd, self.bounds.max_file_bytes + 1)
        except OSError:
            self.skipped += 1
            return
        if (
            len(data) > self.bounds.max_file_bytes
            or b"\0" in data[:GREP_BINARY_PROBE_BYTES]
        ):
            self.skipped += 1  # grown past the bound since; or binary
            return
        self.searched += 1
        before = len(self.matches)
        try:
            self.text(data.decode("utf-8", "replace"), shown)
        finally:
            if len(self.matches) > before:
                self.matched += 1

    def text(self, text: str, shown: str) -> None:
        """The lines of one file's ``text`` that match."""
        size = len(text)
        pos = 0
        number = 1
        counted = 0
        while pos < size:
            start = pos
            if self.whole is not None:
                with self.engine() as left:
                    found = self.whole.search(text, pos, concurrent=True, timeout=left)
                if found is None:
                    return
                at = found.start()
                if at >= size and text.endswith("\n"):
                    return  # past the last line's newline: no line there
                newline = text.rfind("\n", pos, at)
                start = pos if newline < 0 else newline + 1
            end = text.find("\n", start)
            if end < 0:
                end = size
            number += text.count("\n", counted, start)
            counted = start
            self.line_matches(text[start:end], number, shown)
            pos = end + 1

    def line_matches(self, line: str, number: int, shown: str) -> None:
        """
        Every match on ``line``, one entry each; an empty match (``^``,
        ``x*``) counts once a line, and only on a line with no other.
        """
        empty: int | None = None
        found_one = False
        with self.engine() as left:
            # The timeout covers the whole iteration, not each step.
            for m in self.line.finditer(line, concurrent=True, timeout=left):
                start, end = m.span()
                if start < end:
                    found_one = True
                    self.add(line, number, start, shown)
                elif empty is None:
                    empty = start
        if not found_one and empty is not None:
            self.add(line, number, empty, shown)

    @contextlib.contextmanager
    def engine(self) -> Iterator[float]:
        """
        Around one call of the regular expression engine: the seconds left
        for it; a timeout inside it ends the search.
        """
        left = self.left()
        try:
            yield left
        except TimeoutError:
            self.timed_out = True
            raise _Over from None

    def add(self, line: str, number: int, start: int, shown: str) -> None:
        """One match, or :class:`_Over` (truncated) past ``max_results``."""
        if len(self.matches) >= self.bounds.max_results:
            self.truncated = True
            raise _Over
        cap = self.bounds.line_chars
        match: dict[str, Any] = {
            "path": shown,
            "line": number,
            "column": start + 1,
            "text": line[:cap],
        }
        if len(line) > cap:
            match["cut"] = True
        self.matches.append(match)

    def answer(self) -> dict[str, Any]:
        """The endpoint's answer."""
        return {
            "matches": self.matches,
            "files_searched": self.searched,
            "files_matched": self.matched,
            "files_skipped": self.skipped,
            "truncated": self.truncated,
            "timed_out": self.timed_out,
        }


def _read(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes of ``fd`` from where it stands."""
    chunks = []
    left = limit
    while left > 0:
        data = os.read(fd, min(left, 1 << 20))
        if not data:
            break
        chunks.append(data)
        left -= len(data)
    return b"".join(chunks)


def grep(guard: PathGuard, path: str, query: Query, bounds: Bounds) -> dict[str, Any]:
    """
    ``files_grep``: the matches of ``query`` in the file ``path``, or in the
    files below the directory ``path``, in walk order (names sorted per
    directory), within ``bounds``.

    :raises ApiError: 400 for a pattern that does not compile; the guard's
        refusals of ``path`` itself; 404 when it does not exist.
    """
    deadline = time.monotonic() + bounds.timeout
    line, whole = compile_query(query)
    search = _Search(line, whole, bounds, deadline)
    with guard.locate(path, "read", follow=True, missing_ok=False) as loc:
        st = loc.seen()
        is_dir = loc.name == "" or (st is not None and stat.S_ISDIR(st.st_mode))
    try:
        if is_dir:
            _tree(guard, path, query, search)
        else:
            with guard.open_file(path) as f:
                search.file(f.fd, f.stat, display_name(f.path))
    except _Over:
        pass
    return search.answer()


def _tree(guard: PathGuard, path: str, query: Query, search: _Search) -> None:
    """Search the regular files below the directory ``path``."""
    include = (
        re.compile(fnmatch.translate(query.include)).match
        if query.include is not None
        else None
    )
    with guard.open_dir(path) as (fd, root):
        for dir_fd, parent, name, st in walk_at(
            fd, root, search.bounds.depth, prune=VCS_DIRS
        ):
            search.left()
            if not stat.S_ISREG(st.st_mode):
                continue  # directories are walked; links are not followed
            if include is not None and include(name) is None:
                continue
            full = posixpath.join(parent, name)
            if not visible(guard, full, st):
                continue
            try:
                file_fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
            except OSError:
                search.skipped += 1  # unreadable, or swapped for a link
                continue
            try:
                opened = os.fstat(file_fd)
                if not stat.S_ISREG(opened.st_mode) or (
                    (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino)
                ):
                    continue  # swapped since the walk saw it: not the file shown
                os.set_blocking(file_fd, True)
                search.file(file_fd, opened, display_name(full))
            finally:
                os.close(file_fd)
