# -*- test-case-name: tests.lsp.test_lsp -*-
"""
A language server's edits (a rename's WorkspaceEdit) written to the
files, through the path guard, all or none.

Every file is read and its new text made before the first is written; a
file the server was sent must still be what it was sent (else 412: the
edit would be about another text; the route sends the server every open
file's text as it is on disk just before it asks, so this is a change
made while the rename was worked out, and asking again helps).  Each file is replaced by an atomic
rename, its old version kept aside until the last one is in place, and a
failure on the way puts every replaced file back: an error answer means
no file changed.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import attrs

from sandboxd.access.guard import PathGuard, refusal
from sandboxd.errors import (
    ApiError,
    Code,
    forbidden,
    server_unavailable,
    unmet_precondition,
)
from sandboxd.files.atomic import AtomicWrite, Undo
from sandboxd.files.edit import decode
from sandboxd.files.stream import read_all
from sandboxd.lsp.sources import digest_of
from sandboxd.lsp.text import Text

#: The longest diff shown for one file.
MAX_DIFF_CHARS = 20_000


@attrs.frozen
class Planned:
    """One file's change, worked out before anything is written."""

    path: str
    etag: str
    old: str
    new: str
    count: int


def plan(
    guard: PathGuard,
    edits: dict[str, list[tuple[Any, str]]],
    encoding: str,
    sent: dict[str, bytes],
    max_bytes: int,
    too_large: Callable[[int], ApiError],
) -> list[Planned]:
    """
    Each file's new text (blocking: in a thread).

    :param sent: the digest of the text the server was sent, by path.
    :raises ApiError: a refused path (403: named only when the caller may
        read it, as a question's answer shows no more than a read would),
        a file over ``max_bytes`` (413), not text (400), changed since the
        server was sent it (412), or edits that overlap (502: the server's
        error).
    """
    refused = [
        (path, decision)
        for path in sorted(edits)
        if not (decision := guard.decide(path, "write")).allowed
    ]
    hidden = [d for path, d in refused if not guard.decide(path, "read").allowed]
    if hidden:
        raise forbidden(
            f"the rename would also change {len(hidden)} "
            f"{'file' if len(hidden) == 1 else 'files'} you may not read "
            "(not named here); nothing was written",
            hidden[0].code or Code.PATH_NOT_ALLOWED,
            rule=hidden[0].rule,
            outside=len(hidden),
        )
    if refused:
        raise refusal(refused[0][1])
    out = []
    for path, items in sorted(edits.items()):
        with guard.open_file(path) as f:
            if f.stat.st_size > max_bytes:
                raise too_large(f.stat.st_size)
            etag = f.etag
            old = decode(read_all(f.fd, f.stat.st_size), path)
            resolved = f.path
        digest = sent.get(resolved)
        if digest is not None and digest != digest_of(old):
            raise changed(path)
        try:
            new = Text(old, encoding).edited(items)
        except ValueError as e:
            raise server_unavailable(
                f"the language server's edit of {path}: {e}"
            ) from None
        out.append(Planned(resolved, etag, old, new, len(items)))
    return out


def changed(path: str) -> ApiError:
    """412: ``path`` changed on disk while the rename was worked out."""
    return unmet_precondition(
        f"{path} changed on disk while the rename was worked out: nothing was "
        "written; ask again"
    )


def write(guard: PathGuard, planned: list[Planned]) -> None:
    """
    Write every changed file, or none: a failure puts back those already
    replaced (blocking: in a thread).
    """
    undo = Undo(guard)
    try:
        for change in planned:
            if change.new == change.old:
                continue
            location = guard.locate(change.path, "write", follow=True)
            writer = AtomicWrite(location, if_match=change.etag, display=change.path)
            try:
                writer.write(change.new.encode("utf-8"))
            except ApiError as e:
                writer.abort()
                if e.code == Code.PRECONDITION_FAILED:
                    raise changed(change.path) from None
                raise
            except BaseException:
                writer.abort()
                raise
            undo.commit(writer, change.path)
    except BaseException:
        undo.run()
        raise
    undo.forget()


def describe(change: Planned) -> dict[str, Any]:
    """One file's entry in the answer: its path, edits and a unified diff."""
    diff = "".join(
        difflib.unified_diff(
            change.old.splitlines(keepends=True),
            change.new.splitlines(keepends=True),
            fromfile=change.path,
            tofile=change.path,
            n=1,
        )
    )
    return {
        "path": change.path,
        "edits": change.count,
        "diff": diff[:MAX_DIFF_CHARS],
        "diff_truncated": len(diff) > MAX_DIFF_CHARS,
    }
