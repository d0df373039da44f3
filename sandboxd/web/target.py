# -*- test-case-name: tests.web.test_pipeline -*-
"""
Step 1 and the query half of step 5 of the pipeline (SPEC §3): one normal
form of the request target.

The path is split on ``/`` first and each segment percent-decoded once, so
an encoded ``/`` or NUL can never join or split segments behind the router's
back; dot segments are refused; empty segments are dropped.  The normal form
is what routing, policy, rate buckets and audit all see.
"""

from __future__ import annotations

import os
from urllib.parse import unquote_to_bytes

from sandboxd.errors import Code, bad_request, invalid_path


def _decode(raw: bytes, what: str) -> str:
    decoded = unquote_to_bytes(raw)
    try:
        return decoded.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid_path(f"{what} is not valid UTF-8") from None


def parse_path(raw_path: bytes) -> tuple[str, tuple[str, ...]]:
    """Normalise the path part of a target into ``(path, segments)``."""
    if not raw_path.startswith(b"/"):
        raise invalid_path("the request target must be an absolute path")
    if b"%" not in raw_path:
        return _parse_plain(raw_path)
    segments: list[str] = []
    for raw in raw_path.split(b"/"):
        if not raw:
            continue
        segment = _decode(raw, "the path")
        if "/" in segment or "\x00" in segment:
            raise invalid_path("an encoded '/' or NUL is not allowed in a path segment")
        if segment in (".", ".."):
            raise invalid_path("dot segments are not allowed in the path")
        segments.append(segment)
    return "/" + "/".join(segments), tuple(segments)


def _parse_plain(raw_path: bytes) -> tuple[str, tuple[str, ...]]:
    """
    :func:`parse_path` for a path with no percent-escape (nearly every
    request's): nothing to decode per segment, so the path is decoded once
    and split, with the same checks and errors.
    """
    try:
        text = raw_path.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid_path("the path is not valid UTF-8") from None
    if "\x00" in text:
        raise invalid_path("an encoded '/' or NUL is not allowed in a path segment")
    segments = tuple(s for s in text.split("/") if s)
    if "." in segments or ".." in segments:
        raise invalid_path("dot segments are not allowed in the path")
    return "/" + "/".join(segments), segments


def parse_query(raw_query: bytes) -> dict[str, str]:
    """
    Query parameters, each name at most once.

    ``;`` separates pairs as ``&`` does and names are percent-decoded before
    comparing, so ``?a=1&%61=2`` and ``?a=1;a=2`` are duplicates too.
    """
    out: dict[str, str] = {}
    if not raw_query:
        return out
    for pair in raw_query.replace(b";", b"&").split(b"&"):
        if not pair:
            continue
        raw_name, _, raw_value = pair.partition(b"=")
        try:
            name = unquote_to_bytes(raw_name.replace(b"+", b" ")).decode("utf-8")
        except UnicodeDecodeError:
            raise bad_request("query parameter names must be UTF-8") from None
        # A value's bytes that are not UTF-8 are kept as the file system
        # keeps a name's (``os.fsdecode``): a path can then name a file
        # whose name is not UTF-8, by its percent-encoded bytes.
        value = os.fsdecode(unquote_to_bytes(raw_value.replace(b"+", b" ")))
        if name in out:
            raise bad_request(
                f"query parameter {name!r} is given more than once",
                Code.DUPLICATE_PARAMETER,
                param=name,
            )
        out[name] = value
    return out
