# -*- test-case-name: tests.web.test_pipeline -*-
"""
Parsing a request's JSON body strictly (SPEC §3 step 6).

Python's ``json`` accepts what JSON does not (``NaN``, ``Infinity``), turns
``1e999`` into infinity (which ``int()`` in a handler then refuses), and
lets a repeated key silently win, so ``{"path": "a", "path": "/etc/x"}``
would mean different things to different readers; a deeply nested body
raises RecursionError instead of a ValueError.  All of these are 400
``invalid_json`` here.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sandboxd.errors import invalid_json


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


def parse_object(raw: bytes) -> dict[str, Any]:
    """
    The body as a JSON object (``{}`` when empty).

    :raises ApiError: 400 ``invalid_json`` for anything else.
    """
    if not raw.strip():
        return {}
    try:
        body = json.loads(
            raw,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constants,
            parse_float=_finite_float,
        )
    except _Duplicate as e:
        raise invalid_json(f"the key {e.args[0]!r} appears twice in the body") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise invalid_json() from None
    if not isinstance(body, dict):
        raise invalid_json("the body must be a JSON object")
    return body
