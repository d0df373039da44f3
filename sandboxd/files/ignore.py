# -*- test-case-name: tests.files.test_ignore -*-
"""
Ignore files as ripgrep reads them: what a content or name search leaves
out by default.

A project keeps what it does not write itself (``node_modules``, a
virtualenv, build output) out of version control with ``.gitignore``; a
search that reads those trees finds vendored code long before the
project's own, and fills its cap with it.  ripgrep, and the coding
agents built on it, skip what the project's ignore files name (and hidden
entries); a search here does the same unless asked not to.

Read: ``.gitignore``, ``.ignore`` and ``.rgignore`` (in that order of
precedence, the last winning) in each directory walked, and in the search
root's parents up to the repository's root (the nearest directory holding
``.git``), or, outside a repository, up to the base directory.  The
patterns are gitignore's: ``#`` comments, ``!`` to re-include, a trailing
``/`` for directories only, a ``/`` elsewhere anchoring the pattern to
its file's directory (else it matches a name at any depth), ``*``, ``?``,
``[...]`` and ``**``.  A deeper file's decision wins over a shallower
one's; within one file the last matching pattern wins.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from sandboxd.access.guard import PathGuard
from sandboxd.policy.defaults import IGNORE_FILE_BYTES

#: The ignore files read in each directory, lowest precedence first.
IGNORE_FILES = (".gitignore", ".ignore", ".rgignore")

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@attrs.frozen
class Rule:
    """One pattern of an ignore file."""

    regex: re.Pattern[str]
    negated: bool
    dir_only: bool
    anchored: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        """Whether the pattern names ``rel`` (relative to its file's directory)."""
        if self.dir_only and not is_dir:
            return False
        subject = rel if self.anchored else posixpath.basename(rel)
        return self.regex.fullmatch(subject) is not None


def _glob(pattern: str) -> str:
    """A gitignore glob as a regular expression (``/`` never matched by ``*``)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i) and (i == 0 or pattern[i - 1] == "/"):
                if i + 2 == n:
                    out.append(".*")  # trailing /**: everything inside
                    i += 2
                    continue
                if pattern[i + 2] == "/":
                    out.append("(?:.*/)?")  # **/: any directories, or none
                    i += 3
                    continue
            while i < n and pattern[i] == "*":
                i += 1
            out.append("[^/]*")
            continue
        if c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in "!^" else i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_rule(line: str) -> Rule | None:
    """One line of an ignore file as a rule, or None (a blank or a comment)."""
    line = line.rstrip("\n").rstrip("\r")
    while line.endswith(" ") and not line.endswith("\\ "):
        line = line[:-1]
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    elif line.startswith("\\"):
        line = line[1:] if line[1:2] in ("#", "!") else line
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    try:
        regex = re.compile(_glob(line), re.DOTALL)
    except re.error:
        return None  # as git, a pattern it cannot read is no pattern
    return Rule(regex, negated, dir_only, anchored)


def parse_rules(lines: Iterable[str]) -> tuple[Rule, ...]:
    """The rules of an ignore file's lines."""
    return tuple(r for r in (parse_rule(line) for line in lines) if r is not None)


def decide(rules: Iterable[Rule], rel: str, is_dir: bool) -> bool | None:
    """The last matching rule's decision (True: ignored), or None when none matches."""
    decision = None
    for rule in rules:
        if rule.matches(rel, is_dir):
            decision = not rule.negated
    return decision


def _read_rules(open_file: Callable[[str], int | None]) -> tuple[Rule, ...]:
    """The rules of a directory's ignore files, ``open_file`` opening each."""
    rules: list[Rule] = []
    for name in IGNORE_FILES:
        fd = open_file(name)
        if fd is None:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            os.set_blocking(fd, True)
            data = os.read(fd, IGNORE_FILE_BYTES)
        except OSError:
            continue
        finally:
            os.close(fd)
        rules.extend(parse_rules(data.decode("utf-8", "replace").splitlines()))
    return tuple(rules)


def _open_at(dir_fd: int | None, base: str) -> Callable[[str], int | None]:
    def opener(name: str) -> int | None:
        try:
            if dir_fd is None:
                return os.open(posixpath.join(base, name), _FILE_FLAGS)
            return os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError:
            return None

    return opener


@attrs.define
class Ignores:
    """
    What a walk leaves out: ignored entries (by the ignore files, unless
    ``no_ignore``), hidden ones (unless ``hidden``), and what ``exclude``
    names (gitignore globs, relative to the search root).

    Called as a walk's ``skip`` (:func:`~sandboxd.files.walk.walk_at`) with
    each entry; the rules of the directories above the entry are held as a
    stack, the walk being depth first, so only one branch's are in memory.
    """

    root: str
    no_ignore: bool = False
    hidden: bool = False
    exclude: tuple[Rule, ...] = ()
    #: ``(directory, its rules)`` from the outermost down.
    stack: list[tuple[str, tuple[Rule, ...]]] = attrs.Factory(list)

    def start(self, parents: Iterable[tuple[str, Callable[[str], int | None]]]) -> None:
        """Read the ignore files of the search root's parents (outermost first)."""
        if self.no_ignore:
            return
        for directory, opener in parents:
            self.stack.append((directory, _read_rules(opener)))

    def __call__(self, dir_fd: int, parent: str, name: str, st: Any) -> bool:
        """Whether the walk leaves out ``name`` in ``parent`` (its fd ``dir_fd``)."""
        if not self.hidden and name.startswith("."):
            return True
        full = posixpath.join(parent, name)
        is_dir = stat.S_ISDIR(st.st_mode)
        if self.exclude:
            rel = posixpath.relpath(full, self.root)
            if decide(self.exclude, rel, is_dir):
                return True
        if self.no_ignore:
            return False
        self._enter(dir_fd, parent)
        for directory, rules in reversed(self.stack):
            if not rules:
                continue
            decision = decide(rules, posixpath.relpath(full, directory), is_dir)
            if decision is not None:
                return decision
        return False

    def _enter(self, dir_fd: int, parent: str) -> None:
        """The stack made that of ``parent``'s entries (read its files once)."""
        while self.stack and not _within(parent, self.stack[-1][0]):
            self.stack.pop()
        if self.stack and self.stack[-1][0] == parent:
            return
        self.stack.append((parent, _read_rules(_open_at(dir_fd, parent))))


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def parents_of(
    root: str, top: str | None, allowed: Callable[[str], bool]
) -> list[tuple[str, Callable[[str], int | None]]]:
    """
    The directories above ``root`` whose ignore files apply to it,
    outermost first: up to the nearest one holding ``.git`` or, when there
    is none, up to ``top`` (none when ``root`` is not below ``top``); only
    those ``allowed`` (the guard lets them be read).
    """
    chain: list[str] = []
    here = root
    while True:
        up = posixpath.dirname(here)
        if up == here:
            break
        here = up
        chain.append(here)
    for n, directory in enumerate(chain):
        if os.path.isdir(posixpath.join(directory, ".git")):
            chain = chain[: n + 1]
            break
    else:
        if top is None or not _within(root, top) or root == top:
            chain = []
        else:
            chain = [d for d in chain if _within(d, top)]
    if os.path.isdir(posixpath.join(root, ".git")):
        chain = []  # the root is the repository's
    return [(d, _open_at(None, d)) for d in reversed(chain) if allowed(d)]


def exclusions(globs: Iterable[str]) -> tuple[Rule, ...]:
    """``exclude``'s globs as rules (each ignores what it names)."""
    rules = []
    for glob in globs:
        rule = parse_rule(glob)
        if rule is not None and not rule.negated:
            rules.append(rule)
    return tuple(rules)


def search_filter(
    guard: PathGuard,
    root: str,
    *,
    no_ignore: bool,
    hidden: bool,
    exclude: Iterable[str] = (),
) -> Ignores | None:
    """
    The filter of a search of the directory ``root`` (None: it leaves out
    nothing): the ignore files of ``root``'s parents read now, through the
    guard (a directory it does not let be read lends no rules).
    """
    rules = exclusions(exclude)
    if no_ignore and hidden and not rules:
        return None
    ignores = Ignores(root, no_ignore=no_ignore, hidden=hidden, exclude=rules)
    if not no_ignore:
        ignores.start(
            parents_of(
                root, guard.default_dir, lambda d: guard.decide(d, "read").allowed
            )
        )
    return ignores
