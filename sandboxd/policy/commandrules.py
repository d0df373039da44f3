# -*- test-case-name: tests.policy.test_seed_rules -*-
"""
What ``params.allow_commands`` and ``params.deny_commands`` match, in the
seed's pattern language (SPEC §21: its policy files load with the same
effect).

A pattern of one word names the executable: a glob (``rm``, ``mk*``,
``/usr/bin/*``) matched against argv[0] and against its basename.  A pattern
of several words (split as a shell would) matches the whole argv, one word
per argument: a literal, a glob (which never matches an argument holding a
``/`` or ``..`` or starting with ``-`` unless the glob itself does),
``...`` for any number of arguments, ``{int}``, ``{word}`` and ``{path}``
(an argument that is not an option; in an allow pattern the caller puts it
through the path guard).  Grouped short options are split before matching
(``-rf`` is ``-r -f``), so ``rm -f ...`` denies ``rm -rf x`` too.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import shlex
from collections.abc import Iterable, Sequence

#: At most this many ``...`` per pattern (each one multiplies the matching work).
MAX_ELLIPSES = 3

_SHORT_OPTIONS = re.compile(r"^-[A-Za-z]{2,}$")
_INT = re.compile(r"^[0-9]{1,9}$")
_WORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@:+=,-]*$")
_GLOB = "*?["
PATH = "{path}"


@functools.lru_cache(maxsize=1024)
def pattern_words(pattern: str) -> tuple[str, ...]:
    """
    The words of one pattern, split once (every command a policy's lists
    judge asks again; a policy's patterns are few).

    :raises ValueError: for a pattern that is empty, cannot be split, or
        has more than :data:`MAX_ELLIPSES` ``...``.
    """
    try:
        words = tuple(shlex.split(pattern))
    except ValueError as e:
        raise ValueError(f"cannot split the command pattern {pattern!r}: {e}") from None
    if not words:
        raise ValueError("a command pattern must not be empty")
    if words.count("...") > MAX_ELLIPSES:
        raise ValueError(
            f"the command pattern {pattern!r} has more than {MAX_ELLIPSES} '...'"
        )
    return words


def split_short_options(argv: Sequence[str]) -> list[str]:
    """``["ls", "-lR"]`` → ``["ls", "-l", "-R"]`` (for matching only)."""
    out = list(argv[:1])
    for arg in argv[1:]:
        if _SHORT_OPTIONS.match(arg):
            out.extend(f"-{c}" for c in arg[1:])
        else:
            out.append(arg)
    return out


def executable_matches(argv0: str, word: str) -> bool:
    """Whether argv[0], or its basename, matches ``word``."""
    return any(
        fnmatch.fnmatchcase(name, word) for name in (argv0, os.path.basename(argv0))
    )


def _argument_matches(arg: str, word: str) -> bool:
    if not any(c in word for c in _GLOB):
        return arg == word
    if "/" in arg and "/" not in word:
        return False
    if ".." in arg and ".." not in word:
        return False
    if arg.startswith("-") and not word.startswith("-"):
        return False
    return fnmatch.fnmatchcase(arg, word)


def _word_matches(word: str, arg: str, first: bool) -> bool:
    if first:
        return executable_matches(arg, word)
    if word == PATH:
        return bool(arg) and not arg.startswith("-")
    if word == "{int}":
        return _INT.match(arg) is not None
    if word == "{word}":
        return _WORD.match(arg) is not None
    return _argument_matches(arg, word)


def match(pattern: str, argv: Sequence[str]) -> list[int] | None:
    """
    The indexes of the arguments bound to ``{path}`` when ``pattern``
    matches ``argv`` (already split with :func:`split_short_options`), or
    None when it does not.
    """
    words = pattern_words(pattern)
    if not argv:
        return None
    if len(words) == 1 and words[0] != "..." and not words[0].startswith("{"):
        return [] if executable_matches(argv[0], words[0]) else None
    memo: dict[tuple[int, int], list[int] | None] = {}

    def go(i: int, j: int) -> list[int] | None:
        if (i, j) in memo:
            return memo[(i, j)]
        found: list[int] | None = None
        if i == len(words):
            found = [] if j == len(argv) else None
        elif words[i] == "...":
            for k in range(j, len(argv) + 1):
                found = go(i + 1, k)
                if found is not None:
                    break
        elif j < len(argv) and _word_matches(words[i], argv[j], j == 0):
            rest = go(i + 1, j + 1)
            if rest is not None:
                found = [j, *rest] if words[i] == PATH else rest
        memo[(i, j)] = found
        return found

    return go(0, 0)


def first_match(
    patterns: Iterable[str], argv: Sequence[str]
) -> tuple[str, list[int]] | None:
    """The first pattern that matches ``argv``, with its ``{path}`` indexes."""
    for pattern in patterns:
        paths = match(pattern, argv)
        if paths is not None:
            return pattern, paths
    return None
