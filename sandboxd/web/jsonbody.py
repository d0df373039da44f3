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

from sandboxd.errors import invalid_json

#: The encoders of the JSON the daemon sends (responses, SSE events):
#: compact, UTF-8 as is, and the ASCII-escaped fallback for a string a
#: lone surrogate makes unencodable.  Made once: ``json.dumps`` with any
#: option builds a new encoder on every call.  A non-finite float raises
#: ValueError rather than becoming ``NaN`` or ``Infinity``, which are not
#: JSON (:func:`sandboxd.errors.not_json` is answered instead).
COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


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

    :raises ApiError: 400 ``invalid_json`` for anything else.
    """
    if not raw.strip():
        return {}
    try:
        # Strict UTF-8: no UTF-16/32 guess, no encoded surrogates, no BOM
        # (json refuses a str starting with one).
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
