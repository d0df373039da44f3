"""
A code execution's result document read from its JSON, its big output
strings without the JSON parser.

Told to ``wait``, ``sb.code.execute`` gets the execution's result as one
JSON document once it has ended, and a big print is nearly all one string
in it (``stdout``). ``json.loads`` reads such a string a character at a
time after decoding the whole body; the string is found instead with a
few searches and taken as it is (UTF-8), its few escapes (a print's last
newline, some quotes) put back one by one, and the JSON parser reads the
rest of the document, a few hundred bytes. The value is the one
``json.loads`` gives; anything the short way cannot vouch for (a ``\\u``
escape, many escapes, a key not at the document's top level) goes to
``json.loads`` whole. (Raw control characters, which JSON allows only
escaped and the daemon never sends, are not looked for: the short way
takes them as they are where the parser would refuse the document.)
"""

from __future__ import annotations

import json
from typing import Any

#: A body under this many bytes is read by the JSON parser alone.
BIG_RESULT_BYTES = 64 * 1024

#: The output strings read the short way.
OUTPUT_FIELDS = ("stdout", "stderr")

#: The most escapes a string read the short way may hold (more: the parser).
FEW_ESCAPES = 256

#: What each JSON escape but ``\\u`` stands for.
_ESCAPED = {
    ord('"'): b'"',
    ord("\\"): b"\\",
    ord("/"): b"/",
    ord("b"): b"\b",
    ord("f"): b"\f",
    ord("n"): b"\n",
    ord("r"): b"\r",
    ord("t"): b"\t",
}


def loads_result(body: bytes) -> Any:
    """
    ``json.loads(body)``, for a result document: its big output strings
    read without the parser when they can be.

    :raises ValueError: ``body`` is not JSON.
    """
    if len(body) < BIG_RESULT_BYTES:
        return json.loads(body)
    rest = body
    taken: dict[str, str] = {}
    for name in OUTPUT_FIELDS:
        cut = _take_string(rest, name)
        if cut is None:
            return json.loads(body)
        rest, taken[name] = cut
    document = json.loads(rest)
    if not isinstance(document, dict) or any(document.get(k) != "" for k in taken):
        return json.loads(body)  # (a key given twice: the parser says which wins)
    document.update(taken)
    return document


def _take_string(body: bytes, name: str) -> tuple[bytes, str] | None:
    """
    The document's top-level string ``name``: ``body`` with it emptied,
    and its value; None when it is not there or not read the short way.
    """
    key = b',"' + name.encode() + b'":"'
    at = body.find(key)
    if at < 0:
        return None
    try:
        # What comes before is a whole object once closed: the key is at
        # its top level, not in a nested value or inside a string.
        json.loads(body[:at] + b"}")
    except ValueError:
        return None
    start = at + len(key)
    end = _closing_quote(body, start)
    if end is None:
        return None
    value = _unescaped(body, start, end)
    if value is None:
        return None
    return body[:start] + body[end:], value


def _closing_quote(body: bytes, start: int) -> int | None:
    """Where the string opened before ``start`` ends (None: too many quotes in it)."""
    pos = start
    for _ in range(FEW_ESCAPES + 1):
        quote = body.find(b'"', pos)
        if quote < 0:
            return None
        slashes = quote
        while slashes > start and body[slashes - 1] == 0x5C:
            slashes -= 1
            if quote - slashes > 2 * FEW_ESCAPES:
                return None
        if (quote - slashes) % 2 == 0:
            return quote
        pos = quote + 1
    return None


def _unescaped(body: bytes, start: int, end: int) -> str | None:
    """
    The text of the JSON string inside ``body[start:end]`` (UTF-8), its
    escapes put back; None for a ``\\u`` escape, bad UTF-8 or more than
    :data:`FEW_ESCAPES` escapes.
    """
    view = memoryview(body)
    pieces: list[bytes | memoryview] = []
    pos = start
    for _ in range(FEW_ESCAPES + 1):
        slash = body.find(b"\\", pos, end)
        if slash < 0:
            break
        replacement = _ESCAPED.get(body[slash + 1])
        if replacement is None:
            return None
        pieces += (view[pos:slash], replacement)
        pos = slash + 2
    else:
        return None
    pieces.append(view[pos:end])
    try:
        return b"".join(pieces).decode("utf-8")
    except UnicodeDecodeError:
        return None
