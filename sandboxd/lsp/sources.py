# -*- test-case-name: tests.lsp.test_lsp -*-
"""
The files a question is about and the files its answer points to, read
through the path guard (blocking: each function runs in a thread).

The file asked about must be UTF-8 text within a size bound; it is sent to
the server as read here, its digest and lines worked out here too, off the
reactor.  A file an answer points to is read only to turn
the server's positions into lines and columns and to show the line: one
the caller may not read is left out and counted, never shown.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable
from typing import Any

import attrs

from sandboxd.access.guard import PathGuard
from sandboxd.errors import ApiError, bad_request
from sandboxd.files.stream import read_all
from sandboxd.lsp.catalog import find_root
from sandboxd.lsp.text import Text


@attrs.frozen
class Source:
    """
    The file a question is about, as read through the guard, with what the
    reactor would otherwise work out from a text of up to ``max_bytes``:
    its digest (whether the server has it already) and its lines.
    """

    path: str
    text: str
    root: str
    digest: bytes
    lines: Text


def digest_of(text: str) -> bytes:
    """What tells one text from another (a file as sent to a server, as read back)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def read_source(
    guard: PathGuard, path: str, cap: int, too_large: Callable[[int], ApiError]
) -> Source:
    """
    Read ``path`` (a regular file, UTF-8, at most ``cap`` bytes) and find
    its project root.

    :raises ApiError: the guard's refusals, 404, 413 (``too_large``), 400
        ``not_text``.
    """
    with guard.open_file(path, "read") as f:
        if f.stat.st_size > cap:
            raise too_large(f.stat.st_size)
        data = read_all(f.fd, cap + 1)
        resolved = f.path
    if len(data) > cap:
        raise too_large(len(data))  # grew since its size was read
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(
            f"{path} is not UTF-8 text (byte {e.start} is not): no language "
            "server reads it",
            kind="not_text",
        ) from None

    def readable(directory: str) -> bool:
        return guard.decide(directory, "read").allowed

    root = find_root(posixpath.dirname(resolved), readable, guard.default_dir)
    return Source(resolved, text, root, digest_of(text), Text(text))


def texts_now(guard: PathGuard, paths: list[str], cap: int) -> dict[str, str | None]:
    """
    The text on disk now of each of ``paths`` (files a server has open),
    None for one gone, refused, over ``cap`` or not UTF-8 text.
    """
    out: dict[str, str | None] = {}
    for path in paths:
        try:
            with guard.open_file(path, "read") as f:
                data = read_all(f.fd, cap + 1) if f.stat.st_size <= cap else b""
                fits = 0 < len(data) <= cap or f.stat.st_size == 0
            out[path] = data.decode("utf-8") if fits else None
        except (ApiError, OSError, UnicodeDecodeError):
            out[path] = None
    return out


def placed(
    guard: PathGuard,
    found: list[tuple[dict[str, Any], str, Any]],
    known: dict[str, Text],
    cap: int,
    encoding: str,
) -> tuple[list[dict[str, Any]], int]:
    """
    Each ``(fields, path, range)`` with its lines and columns counted in
    its file's text and that line's ``text``; those whose file the caller
    may not read are left out and counted (``(placed, outside)``).  A file
    over ``cap``, or gone, keeps the server's numbers and shows no line.
    """
    out: list[dict[str, Any]] = []
    outside = 0
    for fields, path, span in found:
        text = known.get(path)
        if text is None:
            try:
                with guard.open_file(path, "read") as f:
                    size = f.stat.st_size
                    data = read_all(f.fd, size) if size <= cap else b""
                text = Text(data.decode("utf-8", "replace"), encoding)
            except ApiError as e:
                if e.status == 403:
                    outside += 1
                    continue
                text = Text("", encoding)
            known[path] = text
        where = text.span(span)
        out.append(
            {**fields, "path": path, **where, "text": text.line_text(where["line"])}
        )
    return out, outside
