# -*- test-case-name: tests.files.test_edit,tests.routes.test_files_edit -*-
"""
Editing a text file in place by exact replacement (``files_edit``).

An agent changes a few lines of a file far more often than it writes one
whole: it names the text to replace and the text to put there, as its own
editing tools do (a ``str_replace``).  Done here rather than as a download
and an upload, the change is one call, the file's other bytes never cross
the wire, and nothing else can write the file between the read and the
write: the new content replaces the file only if the file still has the
version that was read (its ETag), or the edit is refused with 412.

Every edit of a call applies to the text the previous one left, and either
all of them apply or none: each must find its text, exactly once unless it
says ``replace_all``.  Matching is exact (no whitespace folding), with
one exception for line ends: in a file whose every line ends in CRLF, an
edit written with bare LF line ends (as models write text, whatever the
file) is read with CRLF ones, in the text it looks for and in the text it
puts there, so the file keeps one kind of line end.  A byte order mark
stays the file's first bytes whatever is inserted at line 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from sandboxd.access.guard import PathGuard
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    precondition_failed,
    unmet_precondition,
)
from sandboxd.files.atomic import AtomicWrite, etag_matches
from sandboxd.files.stream import read_all
from sandboxd.policy.defaults import EDIT_ATTEMPTS


@attrs.frozen
class Edit:
    """
    One replacement: ``old`` (not empty) becomes ``new``; or, with
    ``insert_line``, ``new`` put in as lines of their own after that line
    (0: before the first).
    """

    old: str
    new: str
    replace_all: bool = False
    insert_line: int | None = None


@attrs.frozen
class Outcome:
    """What the edits made of a text, and where each one landed."""

    text: str
    #: per edit: how many times its text was replaced
    counts: tuple[int, ...]
    #: per edit: the 1-based line of its first replacement, in the new text
    lines: tuple[int, ...]


def _which(index: int, total: int) -> str:
    """How a message names edit ``index``: by its place, when there are several."""
    return f"edits[{index}]: " if total > 1 else ""


def not_found(index: int, total: int) -> ApiError:
    """400, ``kind`` ``not_found``: edit ``index`` finds nothing to replace."""
    return bad_request(
        f"{_which(index, total)}old_text is not in the file (it must match exactly, "
        "whitespace and line ends included)",
        kind="not_found",
        edit=index,
    )


def not_unique(index: int, total: int, count: int) -> ApiError:
    """400, ``kind`` ``not_unique``: edit ``index`` would be ambiguous."""
    return bad_request(
        f"{_which(index, total)}old_text is in the file {count} times; give more of the "
        "surrounding text to pick one, or replace_all: true",
        kind="not_unique",
        edit=index,
        occurrences=count,
    )


def apply(text: str, edits: Sequence[Edit]) -> Outcome:
    """
    The text after ``edits``, each applied to what the one before left.

    :raises ApiError: 400 ``invalid_param`` when an edit's text is
        missing, or there more than once without ``replace_all``, or its
        ``insert_line`` is past the end (its ``kind`` says which); nothing
        is applied then.
    """
    counts: list[int] = []
    lines: list[int] = []
    for index, edit in enumerate(edits):
        edit = in_line_ends_of(text, edit)
        if edit.insert_line is not None:
            text = _insert(text, edit.insert_line, edit.new, index, len(edits))
            counts.append(1)
            lines.append(edit.insert_line + 1)
            continue
        count = text.count(edit.old)
        if count == 0:
            raise not_found(index, len(edits))
        if count > 1 and not edit.replace_all:
            raise not_unique(index, len(edits), count)
        at = text.find(edit.old)
        text = text.replace(edit.old, edit.new)
        counts.append(count)
        lines.append(text.count("\n", 0, at) + 1)
    return Outcome(text, tuple(counts), tuple(lines))


def crlf_only(text: str) -> bool:
    """Whether ``text`` has line ends and every one of them is CRLF."""
    newlines = text.count("\n")
    return newlines > 0 and text.count("\r\n") == newlines


def in_line_ends_of(text: str, edit: Edit) -> Edit:
    """
    ``edit`` as it applies to ``text``: unchanged when ``text`` is not all
    CRLF, or when its ``old`` has a CR in it (an edit that names CRs is
    taken as written); else with the bare LF line ends of ``old`` and
    ``new`` made CRLF.  A CR in ``new`` alone says nothing about how
    ``old`` was written, and leaving either as written would put a bare
    LF into the file.

    Translating ``old`` loses no match: in an all-CRLF file every LF
    follows a CR, so an ``old`` without CRs is found as written only
    when its one LF leads it, and each such place is one where the
    translated ``old`` is found one character earlier.  Replacing there
    the CR too keeps the file all CRLF.
    """
    if not crlf_only(text) or "\r" in edit.old:
        return edit
    return attrs.evolve(
        edit,
        old=edit.old.replace("\n", "\r\n"),
        new=edit.new.replace("\r\n", "\n").replace("\n", "\r\n"),
    )


def _insert(text: str, after: int, new: str, index: int, total: int) -> str:
    """
    ``new`` as lines of their own after line ``after``: a line end (CRLF
    in an all-CRLF file) is added after it where a line follows, and
    before it after a last line that had none.  A byte order mark at the
    start stays there: it marks the file, it is not part of line 1, and
    moved into the text it is a stray U+FEFF that compilers refuse.
    """
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    text = text[len(bom) :]
    lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    if after > lines:
        raise bad_request(
            f"{_which(index, total)}insert_line {after} is past the file's last line ({lines})",
            kind="past_end",
            edit=index,
        )
    # The line end added is the file's own kind.
    end = "\r\n" if crlf_only(text) else "\n"
    at = 0
    for _ in range(after):
        found = text.find("\n", at)
        at = len(text) if found < 0 else found + 1
    if at < len(text) and not new.endswith("\n"):
        new += end
    if at == len(text) and text and not text.endswith("\n"):
        new = end + new
    return bom + text[:at] + new + text[at:]


def decode(data: bytes, path: str) -> str:
    """The file's text, or 400 (``kind`` ``not_text``) when it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(
            f"{path} is not UTF-8 text (byte {e.start} is not); "
            "write binary files with upload",
            kind="not_text",
        ) from None


def edit_file(
    guard: PathGuard,
    path: str,
    edits: Sequence[Edit],
    *,
    if_match: str | None,
    max_bytes: int,
    too_large: Callable[[int], ApiError],
    dry_run: bool = False,
) -> dict[str, Any]:
    """
    ``files_edit``: apply ``edits`` to the file at ``path``, atomically.

    The file keeps its mode and owner.  A file changed by someone else
    between this read and the rename is not overwritten (412).  The path
    is read and written through the guard, so it needs both decisions.

    :param if_match: an ETag the file must have now (412 otherwise).
    :param too_large: makes the 413 for a file over ``max_bytes``, given
        its size.
    :param dry_run: check and count, write nothing.

    Without ``if_match``, an edit that meets another writer's change
    between its read and its rename is applied again to the new text
    (its ``old_text`` is looked for again there), up to
    :data:`EDIT_ATTEMPTS` times: two agents, or a formatter on save,
    writing one file is a normal case, and the caller gave no version
    for the edit to be refused over.  Past that it is a 412 saying
    another writer changed the file and nothing was written.
    """
    if if_match is not None:
        return _edit_once(guard, path, edits, if_match, max_bytes, too_large, dry_run)
    for _ in range(EDIT_ATTEMPTS - 1):
        try:
            return _edit_once(guard, path, edits, None, max_bytes, too_large, dry_run)
        except ApiError as e:
            if e.code != Code.PRECONDITION_FAILED:
                raise
    try:
        return _edit_once(guard, path, edits, None, max_bytes, too_large, dry_run)
    except ApiError as e:
        if e.code != Code.PRECONDITION_FAILED:
            raise
        raise unmet_precondition(
            f"another writer changed {path} while this edit was applied, "
            f"{EDIT_ATTEMPTS} times: nothing was written; read the file again "
            "and retry the edit"
        ) from None


def _edit_once(
    guard: PathGuard,
    path: str,
    edits: Sequence[Edit],
    if_match: str | None,
    max_bytes: int,
    too_large: Callable[[int], ApiError],
    dry_run: bool,
) -> dict[str, Any]:
    """One read, apply and conditional write of :func:`edit_file`."""
    with guard.open_file(path) as f:
        size = f.stat.st_size
        if size > max_bytes:
            raise too_large(size)
        if if_match is not None and not etag_matches(if_match, f.etag):
            raise precondition_failed(path)
        read_as = f.etag
        original = read_all(f.fd, size)
    outcome = apply(decode(original, path), edits)
    data = outcome.text.encode("utf-8")
    answer: dict[str, Any] = {
        "path": f.path,
        "replacements": sum(outcome.counts),
        "edits": [
            {"replacements": count, "line": line}
            for count, line in zip(outcome.counts, outcome.lines, strict=True)
        ],
        "bytes": len(data),
        "changed": data != original,
        "etag": read_as,
    }
    if dry_run or data == original:
        return answer
    loc = guard.locate(path, "write", follow=True)
    writer = AtomicWrite(loc, if_match=read_as, display=path)
    try:
        writer.write(data)
    except BaseException:
        writer.abort()
        raise
    answer["etag"] = writer.commit()
    return answer
