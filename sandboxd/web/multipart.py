# -*- test-case-name: tests.e2b.test_connect,tests.kep.test_rest -*-
"""
A multipart/form-data body split into its parts where it lies: views into
the buffer Twisted kept the body in (bytes, or its mapped temporary file),
found with ``find`` rather than parsed line by line, so a file part of
hundreds of megabytes is never copied.  The E2B and KEP doors' uploads.
"""

from __future__ import annotations

import email.parser
import email.policy
import io
import mmap
import os
from collections.abc import Callable
from typing import Any

from sandboxd.errors import bad_request, payload_too_large


def boundary_of(content_type: str) -> bytes:
    """
    The boundary of a ``multipart/form-data`` Content-Type.

    :raises ApiError: 400 when it has none, or one over 200 bytes.
    """
    header = email.parser.HeaderParser(policy=email.policy.HTTP).parsestr(
        f"Content-Type: {content_type}\r\n\r\n"
    )
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str) or not boundary or len(boundary) > 200:
        raise bad_request("the multipart Content-Type has no usable boundary")
    return boundary.encode("latin-1")


def split_multipart(
    boundary: bytes, body: Any, max_parts: int
) -> list[tuple[str | None, str | None, memoryview]]:
    """
    The ``(form field name, file name, bytes)`` of each part of a multipart body, as views
    into ``body`` (a buffer: bytes, or the mapped temporary file Twisted
    kept the body in), found with ``find`` rather than parsed line by line.

    :raises ApiError: 400 for a body that is not multipart as announced;
        413 past ``max_parts`` parts.
    """
    view = memoryview(body)
    delimiter = b"--" + boundary
    find = body.find
    at = find(delimiter)
    if at < 0:
        raise bad_request("the multipart body has no part")
    at += len(delimiter)
    out: list[tuple[str | None, str | None, memoryview]] = []
    while True:
        if body[at : at + 2] == b"--":
            return out
        if body[at : at + 2] != b"\r\n":
            raise bad_request("a malformed multipart delimiter")
        at += 2
        head_end = find(b"\r\n\r\n", at, at + 16 * 1024)
        if head_end < 0:
            raise bad_request("a multipart part without the end of its headers")
        headers = email.parser.BytesHeaderParser(policy=email.policy.HTTP).parsebytes(
            bytes(view[at:head_end]) + b"\r\n\r\n"
        )
        start = head_end + 4
        end = start
        while True:
            # A delimiter is one followed by CRLF or "--" (RFC 2046 §5.1.1).
            end = find(b"\r\n" + delimiter, end)
            if end < 0:
                raise bad_request("a multipart part without its closing delimiter")
            after = body[end + 2 + len(delimiter) : end + 4 + len(delimiter)]
            if after in (b"\r\n", b"--"):
                break
            end += 2
        disposition = headers.get("content-disposition")
        field = disposition.params.get("name") if disposition is not None else None
        out.append((field, headers.get_filename(), view[start:end]))
        if len(out) > max_parts:
            raise payload_too_large(
                max_parts,
                message=f"at most {max_parts} files per upload",
            )
        at = end + 2 + len(delimiter)


def body_buffer(content: Any) -> tuple[Any, Callable[[], None]]:
    """The request body as a buffer, without copying it, and how to let go."""
    if isinstance(content, io.BytesIO):
        return content.getvalue(), lambda: None  # small: Twisted spools big ones
    content.seek(0, os.SEEK_END)
    size = content.tell()
    if size == 0:
        return b"", lambda: None
    mapped = mmap.mmap(content.fileno(), size, access=mmap.ACCESS_READ)

    def close() -> None:
        try:
            mapped.close()
        except BufferError:
            # Views of it live on (the parts beside the one used, or an
            # error's traceback holding the split's frames): the map goes
            # when the last of them does, and the call's answer stands.
            pass

    return mapped, close


__all__ = ["body_buffer", "boundary_of", "split_multipart"]
