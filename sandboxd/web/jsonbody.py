# -*- test-case-name: tests.web.test_jsonbody,tests.web.test_pipeline -*-
"""
Parsing a request's JSON body strictly (SPEC §3 step 6).

Python's ``json`` accepts what JSON does not (``NaN``, ``Infinity``), turns
``1e999`` into infinity (which ``int()`` in a handler then refuses), and
lets a repeated key silently win, so ``{"path": "a", "path": "/etc/x"}``
would mean different things to different readers; a deeply nested body
raises RecursionError instead of a ValueError.  All of these are 400
``invalid_json`` here.

It also guesses the encoding of bytes (UTF-16 and UTF-32 are taken) and
keeps lone surrogates (a raw ``\\xed\\xa0\\x80`` is refused by the codec,
but the escape ``"\\ud800"`` is not): a body that a proxy or a log reads as
something else must not be executed, and a surrogate in a path or a command
fails later, when a file name or the answer is encoded, after the side
effect.  RFC 8259 §8.1 requires UTF-8 between systems; the body is decoded
as strict UTF-8 here and no string in it, key or value at any depth, may
hold a lone surrogate.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from sandboxd.errors import invalid_json, not_json

#: The encoders of the JSON the daemon sends (responses, SSE events):
#: compact, UTF-8 as is, and the ASCII-escaped fallback for a string a
#: lone surrogate makes unencodable.  Made once: ``json.dumps`` with any
#: option builds a new encoder on every call.  A non-finite float raises
#: ValueError rather than becoming ``NaN`` or ``Infinity``, which are not
#: JSON (:func:`sandboxd.errors.not_json` is answered instead).
COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def json_bytes(value: Any) -> bytes:
    """
    Compact UTF-8 JSON that cannot fail on a string.

    A lone surrogate (a file name that is not UTF-8 on disk, decoded with
    ``surrogateescape``) cannot be encoded as UTF-8; such a value is sent
    with ``\\uXXXX`` escapes instead (as ``ensure_ascii`` does), which a
    Python client decodes back to the same string.  An answer must not fail
    after its side effect is done.

    :raises ApiError: 500 ``internal`` when ``value`` holds what JSON cannot
        carry (a non-finite number), before a byte of it is sent.
    """
    try:
        text = COMPACT.encode(value)
    except ValueError:
        raise not_json(value) from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return COMPACT_ASCII.encode(value).encode("ascii")


def with_text(value: Any) -> Any:
    """
    ``value`` with every value JSON has no type for written as its
    ``str()`` (a ``datetime`` as ``2020-01-01 00:00:00``, a ``Path`` as
    its text, a set as ``{1, 2}``, bytes as ``b'...'``), tuples as lists:
    what agent-sandbox-server sends for a template's answer, which it
    encodes with ``json.dumps(body, default=str)``.  Keys and non-finite
    numbers are left as they are (its encoder refuses them too).

    :raises ApiError: 500 ``internal`` for a value that holds itself.
    """
    try:
        return _with_text(value)
    except RecursionError:
        raise not_json(value) from None


def _with_text(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float):
        return value
    if isinstance(value, dict):
        return {k: _with_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_with_text(v) for v in value]
    return str(value)


#: What JSON leaves unescaped but ``str.splitlines`` takes for a line end
#: (NEL, LINE SEPARATOR, PARAGRAPH SEPARATOR), as UTF-8, with its escape.
_LINE_BREAKS = (
    (b"\xc2\x85", b"\\u0085"),
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
)


def line_safe(data: bytes) -> bytes:
    """
    JSON bytes (UTF-8) fit for a line-framed stream (an SSE ``data:`` line,
    an NDJSON line): NEL, U+2028 and U+2029 written as ``\\u`` escapes.

    JSON allows them raw inside a string, and SSE and NDJSON end a line
    only at CR or LF, but many clients split a stream with
    ``str.splitlines`` (httpx's ``iter_lines``, which E2B's code
    interpreter SDK reads ``run_code`` with), which ends a line there too:
    the line arrives in two pieces neither of which is JSON.  An escape is
    the same string to every JSON parser.  In valid UTF-8 those byte
    sequences are those characters and nothing else, and in JSON they can
    only be inside a string, so replacing the bytes is exact.  Pure ASCII
    (nearly every line) is returned as it is after one check.
    """
    if data.isascii():
        return data
    for raw, escape in _LINE_BREAKS:
        if raw in data:
            data = data.replace(raw, escape)
    return data


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    # 1e999 is valid JSON but overflows to inf, which int() then refuses
    # deep inside a handler.
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is out of range")
    return value


#: The UTF-8 encoding of U+FEFF, which may open a body (RFC 8259 §8.1).
UTF8_BOM = b"\xef\xbb\xbf"

#: The decoder of request bodies, made once: ``json.loads`` with any
#: option builds a new decoder (and its scanner) on every call.
_STRICT = json.JSONDecoder(
    object_pairs_hook=_no_duplicates,
    parse_constant=_no_constants,
    parse_float=_finite_float,
)


#: A ``\\uD800``-``\\uDFFF`` escape (paired or not): only bodies holding one
#: need their strings walked.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string in ``value`` (keys included, at any depth) has one."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_object(raw: bytes) -> dict[str, Any]:
    """
    The body as a JSON object (``{}`` when empty).

    A UTF-8 byte order mark before it is skipped, as RFC 8259 §8.1 lets a
    parser do and agent-sandbox-server does: some tools write one
    (PowerShell 5's ``Out-File``, then ``curl -d @file``).

    :raises ApiError: 400 ``invalid_json`` for anything else.
    """
    raw = raw.removeprefix(UTF8_BOM)
    if not raw.strip():
        return {}
    try:
        # Strict UTF-8: no UTF-16/32 guess, no encoded surrogates, no BOM
        # but the one skipped above (json refuses a str starting with one).
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid_json("the body is not valid UTF-8") from None
    try:
        body = _STRICT.decode(text)
    except _Duplicate as e:
        raise invalid_json(f"the key {e.args[0]!r} appears twice in the body") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise invalid_json() from None
    if not isinstance(body, dict):
        raise invalid_json("the body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(body):
        raise invalid_json("the body holds a lone UTF-16 surrogate (\\uD800-\\uDFFF)")
    return body
