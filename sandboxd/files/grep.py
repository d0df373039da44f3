# -*- test-case-name: tests.files.test_grep -*-
"""
``files_grep``: the lines of files that match a pattern, below a path.

Runs in a worker thread, over :func:`~sandboxd.files.walk.walk_at`: the
same walk, the same entries hidden (what the policy denies, links) as a
listing or a name search.  Each file is opened relative to its directory's
fd with ``O_NOFOLLOW``, never by a path string, so a directory swapped for
a link while the walk runs cannot lead out of the boundary; links are not
followed at all (as ripgrep without ``-L``).

Patterns are RE2's (Google's engine, as ripgrep's syntax: no
backreferences or lookarounds), through ``google-re2``, not ``re``:
``re`` holds the interpreter's lock for the whole of one match and
backtracks, so a pattern such as ``(a+)+$`` on a long line of ``a`` would
stop every other thread, the reactor's included, for as long as it liked.
RE2 matches in time linear in the text, lets go of the lock while it
matches, and refuses at compile time a pattern whose program would pass a
memory bound (``a{1000}{1000}``).  The file's bytes are searched whole,
once, with a pattern that never matches a newline, so each match lies on
one line: what a line-by-line search finds, in one pass.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import stat
import time
from collections.abc import Callable
from typing import Any

import attrs
import re2

from sandboxd.access.guard import PathGuard
from sandboxd.errors import bad_request
from sandboxd.files.ignore import search_filter
from sandboxd.files.walk import display_name, visible, walk_at
from sandboxd.policy.defaults import (
    ENDPOINT_LIMITS,
    GREP_BINARY_PROBE_BYTES,
    GREP_INCLUDE_CHOICES,
    GREP_LINE_CHARS,
    GREP_PROGRAM_BYTES,
    WALK_DEPTH,
)

#: Directories of version control, not descended into (as ripgrep skips
#: them): their objects are the files' history, not the files.
VCS_DIRS = frozenset({".git", ".hg", ".svn"})

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@attrs.frozen
class Query:
    """
    What is looked for.

    :ivar pattern: a regular expression (RE2's syntax), or the text itself
        with ``fixed_strings``.
    :ivar include: a glob on file names (``*.py``, ``*.{js,ts}``):
        :func:`include_matcher`; files found by the walk whose names do not
        match are not read.
    :ivar exclude: gitignore globs (relative to the directory searched)
        of files and directories left out.
    :ivar no_ignore: search what ignore files name too (ripgrep's
        ``--no-ignore``): :mod:`sandboxd.files.ignore`.
    :ivar hidden: search hidden files and directories too (ripgrep's
        ``--hidden``).
    """

    pattern: str
    fixed_strings: bool = False
    ignore_case: bool = False
    include: str | None = None
    exclude: tuple[str, ...] = ()
    no_ignore: bool = False
    hidden: bool = False


@attrs.frozen
class Bounds:
    """
    How much one search may take.

    :ivar max_results: matches answered; one more sets ``truncated``.
    :ivar timeout: seconds for the whole search (looked at before each
        file and after each match).
    :ivar depth: levels walked (1: the directory's own entries).
    :ivar max_file_bytes: a bigger file is skipped.
    :ivar context: lines shown before and after each matching line.
    :ivar stopping: whether the daemon is stopping or the caller has left:
        the search is given up then (looked at as the time is).
    """

    max_results: int
    timeout: float
    depth: int = WALK_DEPTH
    max_file_bytes: int = ENDPOINT_LIMITS["files_grep"]["max_bytes"]
    line_chars: int = GREP_LINE_CHARS
    context: int = 0
    stopping: Callable[[], bool] = attrs.field(default=lambda: False)


def compile_query(query: Query) -> Any:
    """
    The compiled pattern: over bytes (UTF-8), ``^`` and ``$`` at each line,
    never matching a newline.

    :raises ApiError: 400 ``invalid_param`` for a pattern RE2 does not take
        (bad syntax, a backreference or lookaround, a program too big).
    """
    if _names_a_newline(query.pattern, query.fixed_strings):
        raise bad_request(
            "'pattern' holds a newline, and a match never spans one (the search "
            "is line by line): search for one line's text, or each line apart"
        )
    options = re2.Options()
    options.log_errors = False  # a caller's bad pattern is the caller's 400
    options.never_nl = True
    options.case_sensitive = not query.ignore_case
    options.literal = query.fixed_strings
    options.max_mem = GREP_PROGRAM_BYTES
    source = query.pattern.encode("utf-8", "surrogatepass")
    if not query.fixed_strings:
        source = b"(?m)" + source
    try:
        return re2.compile(source, options)
    except re2.error as e:
        why = e.args[0] if e.args else ""
        if isinstance(why, bytes):
            why = why.decode("utf-8", "replace")
        raise bad_request(
            f"'pattern' is not a valid regular expression ({why}; RE2 syntax: no "
            "backreferences or lookarounds); to search for the text as written, "
            "pass fixed_strings: true"
        ) from None


def _names_a_newline(pattern: str, fixed: bool) -> bool:
    """
    Whether ``pattern`` holds a newline, as itself or (a regular
    expression) as ``\\n``: it could never match, since no match spans a
    line end; said as a 400, as ripgrep does, not answered with nothing.
    """
    if "\n" in pattern:
        return True
    if fixed:
        return False
    escaped = False
    for char in pattern:
        if escaped and char == "n":
            return True
        escaped = not escaped and char == "\\"
    return False


def include_matcher(include: str | None) -> Callable[[str], Any] | None:
    """
    The test of a file's name against ``include``: fnmatch's ``*``, ``?``
    and ``[...]``, and ``{a,b}`` alternatives as ripgrep's globs take them
    (``*.{js,ts}``), not nested; a literal brace is ``[{]``.

    :raises ApiError: 400 ``invalid_param`` for a brace left open, or one
        inside another.
    """
    if include is None:
        return None
    choices = [""]
    group: list[str] | None = None
    i = 0
    while i < len(include):
        char = include[i]
        if char == "[":
            # A bracket expression as fnmatch reads it, braces in it literal.
            j = i + 1
            if j < len(include) and include[j] == "!":
                j += 1
            if j < len(include) and include[j] == "]":
                j += 1
            close = include.find("]", j)
            piece = include[i : close + 1] if close >= 0 else char
        elif char == "{" and group is None:
            group = [""]
            i += 1
            continue
        elif char == "{":
            raise bad_request("'include': a {...} group cannot hold another")
        elif char == "," and group is not None:
            group.append("")
            i += 1
            continue
        elif char == "}" and group is not None:
            if len(choices) * len(group) > GREP_INCLUDE_CHOICES:
                raise bad_request(
                    f"'include' spells out more than {GREP_INCLUDE_CHOICES} "
                    "names with its {...} groups; use fewer"
                )
            choices = [c + g for c in choices for g in group]
            group = None
            i += 1
            continue
        else:
            piece = char
        if group is not None:
            group[-1] += piece
        else:
            choices = [c + piece for c in choices]
        i += len(piece)
    if group is not None:
        raise bad_request(
            "'include': a '{' is not closed; {a,b} is either of a and b, "
            "and [{] a literal brace"
        )
    return re.compile("|".join(fnmatch.translate(c) for c in choices)).match


class _Over(Exception):
    """The search ends here (its flags say why)."""


@attrs.define
class _Search:
    """One search's state: the matches so far and the counts."""

    pattern: Any
    bounds: Bounds
    deadline: float
    matches: list[dict[str, Any]] = attrs.Factory(list)
    searched: int = 0
    matched: int = 0
    skipped: int = 0
    truncated: bool = False
    timed_out: bool = False

    def left(self) -> float:
        """
        Seconds left, or :class:`_Over` when none are (timed out) or no one
        waits for the answer any more.
        """
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.timed_out = True
            raise _Over
        if self.bounds.stopping():
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
            self.text(data, shown)
        finally:
            if len(self.matches) > before:
                self.matched += 1

    def text(self, data: bytes, shown: str) -> None:
        """
        The matches in one file's bytes, line by line: every match on a
        line, one entry each; an empty match (``^``, ``x*``) counts once a
        line, and only on a line with no other.
        """
        if not data:
            return  # no line at all
        if b"\r\n" in data:
            # CRLF line ends are line ends (ripgrep's --crlf): $ matches
            # before them.  Only the CR at a line's end goes, which the line
            # shown leaves out anyway, so numbers and columns stay the same.
            data = data.replace(b"\r\n", b"\n")
        line_start = -1  # the line being gathered (its first byte)
        line_end = 0
        newlines = counted = 0  # the newlines before ``counted``
        number = 0  # the line's, from 1
        starts: list[int] = []
        empty: int | None = None
        for found in self.pattern.finditer(data):
            self.left()
            at, end = found.span()
            if at > line_end and line_start >= 0:
                self._line(data, line_start, line_end, number, starts, empty, shown)
                starts, empty = [], None
                line_start = -1
            if line_start < 0:
                if at == len(data) and data.endswith(b"\n"):
                    return  # past the last line's newline: no line there
                line_start = data.rfind(b"\n", 0, at) + 1
                line_end = data.find(b"\n", at)
                if line_end < 0:
                    line_end = len(data)
                newlines += data.count(b"\n", counted, line_start)
                counted = line_start
                number = newlines + 1
            if at < end:
                starts.append(at)
            elif empty is None:
                empty = at
        if line_start >= 0:
            self._line(data, line_start, line_end, number, starts, empty, shown)

    def _line(
        self,
        data: bytes,
        start: int,
        end: int,
        number: int,
        starts: list[int],
        empty: int | None,
        shown: str,
    ) -> None:
        """One line's matches (``starts``, byte offsets), or its empty one."""
        line = _text(data[start:end])
        around = self._around(data, start, end) if self.bounds.context else None
        column = 0
        prev = start
        for at in starts or ([] if empty is None else [empty]):
            # Columns in characters, counted on from the last match.
            column += len(data[prev:at].decode("utf-8", "replace"))
            prev = at
            self.add(line, number, column, shown, around)

    def _around(self, data: bytes, start: int, end: int) -> dict[str, list[str]]:
        """The ``context`` lines before and after the line at ``start:end``."""
        cap = self.bounds.line_chars
        before: list[str] = []
        pos = start
        while len(before) < self.bounds.context and pos > 0:
            begin = data.rfind(b"\n", 0, pos - 1) + 1
            before.append(_text(data[begin : pos - 1])[:cap])
            pos = begin
        after: list[str] = []
        pos = end
        while len(after) < self.bounds.context and pos + 1 < len(data):
            stop = data.find(b"\n", pos + 1)
            stop = len(data) if stop < 0 else stop
            after.append(_text(data[pos + 1 : stop])[:cap])
            pos = stop
        return {"before": before[::-1], "after": after}

    def add(
        self,
        line: str,
        number: int,
        start: int,
        shown: str,
        around: dict[str, list[str]] | None = None,
    ) -> None:
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
            # A match deep in a long (minified) line: the part of the line
            # around it, not the line's start, which would not hold it.
            begin = max(0, min(start - cap // 4, len(line) - cap))
            match["text"] = line[begin : begin + cap]
            match["text_column"] = begin + 1
            match["cut"] = True
        if around is not None:
            match.update(around)
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


def _text(line: bytes) -> str:
    """A line as text, without the CR of a CRLF line end (it ends the line)."""
    if line.endswith(b"\r"):
        line = line[:-1]
    return line.decode("utf-8", "replace")


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
    search = _Search(compile_query(query), bounds, deadline)
    include = include_matcher(query.include)
    with guard.locate(path, "read", follow=True, missing_ok=False) as loc:
        st = loc.seen()
        is_dir = loc.name == "" or (st is not None and stat.S_ISDIR(st.st_mode))
    try:
        if is_dir:
            _tree(guard, path, query, search, include)
        else:
            with guard.open_file(path) as f:
                search.file(f.fd, f.stat, display_name(f.path))
    except _Over:
        pass
    return search.answer()


def _tree(
    guard: PathGuard,
    path: str,
    query: Query,
    search: _Search,
    include: Callable[[str], Any] | None,
) -> None:
    """Search the regular files below the directory ``path``."""
    with guard.open_dir(path) as (fd, root):
        skip = search_filter(
            guard,
            root,
            no_ignore=query.no_ignore,
            hidden=query.hidden,
            exclude=query.exclude,
        )
        for dir_fd, parent, name, st in walk_at(
            fd, root, search.bounds.depth, prune=VCS_DIRS, skip=skip
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
