# -*- test-case-name: tests.lsp.test_watched -*-
"""
The project's files as an editor watches them for its server
(``workspace/didChangeWatchedFiles``).

A server such as pyright reads the project's files once and then relies
on its editor to say which changed on disk; the files the daemon has open
it sends itself, but the others (the module an agent just rewrote, the
files a rename wrote) would stay at their first version for the
session's life, and its answers (diagnostics, hover, references) would
be about code that is gone.  The daemon therefore does what an editor
does: it offers the capability, keeps the watchers the server registers
(:class:`Watchers`), and before each question compares the project's
files (:func:`scan`, a bounded walk run in a thread) with what it saw
the time before (:func:`changes`), telling the server of those its
watchers match.
"""

from __future__ import annotations

import os
import re
from typing import Any

from sandboxd.lsp.answers import path_of

#: ``FileChangeType`` of LSP.
CREATED = 1
CHANGED = 2
DELETED = 3

#: What a file is compared by: an atomic replace changes the inode, an
#: edit the time or the size.
Seen = tuple[int, int, int]

#: Directories never walked: a version control's own, a package manager's
#: downloads, caches.  Servers leave them out of a project too.
_SKIPPED_DIRS = frozenset({"node_modules", "__pycache__", "site-packages"})


def scan(root: str, max_files: int) -> dict[str, Seen] | None:
    """
    Every regular file below ``root`` (links not followed, hidden and
    :data:`_SKIPPED_DIRS` directories left out) with what tells its
    versions apart; None when there are more than ``max_files`` (a
    project too large to watch this way).  Blocking: run it in a thread.
    """
    found: dict[str, Seen] = {}
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if not entry.name.startswith(".") and (
                        entry.name not in _SKIPPED_DIRS
                    ):
                        stack.append(entry.path)
                    continue
                if not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            found[entry.path] = (st.st_ino, st.st_mtime_ns, st.st_size)
            if len(found) > max_files:
                return None
    return found


def changes(before: dict[str, Seen], now: dict[str, Seen]) -> list[tuple[str, int]]:
    """``(path, FileChangeType)`` of each file created, changed or deleted."""
    out = [
        (path, CREATED if path not in before else CHANGED)
        for path, seen in now.items()
        if before.get(path) != seen
    ]
    out.extend((path, DELETED) for path in before if path not in now)
    return sorted(out)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """
    An LSP glob (``*``, ``**``, ``?``, ``{a,b}``, ``[...]``) as a regular
    expression over a whole absolute path.  A glob with no ``/`` in it
    names files in any directory, as editors take it.
    """
    if "/" not in pattern:
        pattern = "**/" + pattern
    out: list[str] = []
    i = 0
    depth = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "{":
            out.append("(?:")
            depth += 1
        elif c == "}" and depth:
            out.append(")")
            depth -= 1
        elif c == "," and depth:
            out.append("|")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    out.append(")" * depth)
    if not pattern.startswith(("/", "**")):
        out.insert(0, "(?:.*/)?")
    return re.compile("".join(out), re.DOTALL)


class Watchers:
    """The file watchers a server registered, by registration id."""

    def __init__(self) -> None:
        self._by_id: dict[str, list[re.Pattern[str]]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def register(self, registration_id: str, options: Any) -> None:
        """
        Keep the watchers of one registration (``DidChangeWatchedFiles
        RegistrationOptions``); a glob that cannot be read watches every
        file, so that no change is kept from the server.
        """
        patterns: list[re.Pattern[str]] = []
        watchers = options.get("watchers") if isinstance(options, dict) else None
        for watcher in watchers if isinstance(watchers, list) else []:
            glob = watcher.get("globPattern") if isinstance(watcher, dict) else None
            if isinstance(glob, dict):
                # A RelativePattern: the glob under its base folder.
                base = glob.get("baseUri")
                if isinstance(base, dict):
                    base = base.get("uri")
                base_path = path_of(base)
                inner = glob.get("pattern")
                if base_path is None or not isinstance(inner, str):
                    glob = "**"
                else:
                    glob = base_path.rstrip("/") + "/" + inner
            if not isinstance(glob, str):
                glob = "**"
            try:
                patterns.append(glob_regex(glob))
            except re.error:
                patterns.append(glob_regex("**"))
        self._by_id[registration_id] = patterns

    def unregister(self, registration_id: str) -> None:
        """Forget one registration."""
        self._by_id.pop(registration_id, None)

    def match(self, path: str) -> bool:
        """Whether a change to ``path`` is one the server asked to hear of."""
        return any(
            p.fullmatch(path) for patterns in self._by_id.values() for p in patterns
        )
