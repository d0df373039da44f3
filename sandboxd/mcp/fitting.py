# -*- test-case-name: tests.mcp.test_fitting -*-
"""
Tool results cut to fit one MCP message.

The official SDK refuses a message over 1 MiB, and a model's client keeps
far less of a result than that; a result carries its output twice (as
text and as ``structuredContent``).  :func:`fitted` cuts the biggest
pieces of a result in proportion to how far it is over
:data:`~sandboxd.policy.defaults.MCP_RESULT_JSON_BYTES` (a text keeps its
head and tail around a mark saying how much was left out, a list its first
items, base64 data its first bytes), so the cut lands near the bound
rather than halving past it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from sandboxd.errors import payload_too_large
from sandboxd.policy.defaults import MCP_RESULT_JSON_BYTES

#: Builds a result from its (possibly cut) pieces; ``cut`` says some were.
Build = Callable[[dict[str, Any], bool], dict[str, Any]]

#: Rounds of cutting before a result is refused as too big.
_ROUNDS = 12

#: How far under the bound a proportional cut aims (the marks and the
#: escapes of what is kept are not exactly proportional).
_MARGIN = 0.97


def result_size(result: Any) -> int:
    """The bytes of ``result`` as the door sends it (compact UTF-8 JSON)."""
    text = json.dumps(result, ensure_ascii=False, separators=(",", ":"))
    return len(text.encode("utf-8", "surrogatepass"))


def head_and_tail(text: str, keep: int) -> str:
    """``text`` cut to about ``keep`` characters: its head and its tail, a mark between."""
    if keep >= len(text):
        return text
    keep = max(0, keep)
    head = keep // 2
    tail = keep - head
    mark = f"\n[... {len(text) - keep} characters left out ...]\n"
    return text[:head] + mark + (text[len(text) - tail :] if tail else "")


def _base64_head(data: str, ratio: float) -> str:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return data[: int(len(data) * ratio) // 4 * 4]
    return base64.b64encode(raw[: int(len(raw) * ratio)]).decode("ascii")


def _weight(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return result_size(value) if len(value) > 1 else 0
    return 0


def _shrink(name: str, value: Any, ratio: float) -> Any:
    if isinstance(value, list):
        keep = min(int(len(value) * ratio), len(value) - 1)
        return value[: max(0, keep)]
    if name.endswith("_base64"):
        return _base64_head(value, ratio)
    return head_and_tail(value, min(int(len(value) * ratio), len(value) - 1))


def fitted(
    build: Build, pieces: dict[str, Any], bound: int = MCP_RESULT_JSON_BYTES
) -> dict[str, Any]:
    """
    ``build(pieces, cut)``, its biggest text or list pieces cut until the
    result is at most ``bound`` bytes as JSON.

    :raises ApiError: 413 ``payload_too_large`` when cutting every text and
        list piece is not enough (the bulk is elsewhere).
    """
    cut = False
    for name, value in pieces.items():
        # A piece far past the bound (a big file's base64) is cut before
        # the result is built and measured even once.
        if isinstance(value, str) and len(value) > bound:
            pieces = {**pieces, name: _shrink(name, value, bound / len(value))}
            cut = True
    result = build(pieces, cut)
    size = result_size(result)
    for _ in range(_ROUNDS):
        if size <= bound:
            return result
        biggest = max(pieces, key=lambda k: _weight(pieces[k]), default=None)
        if biggest is None or not _weight(pieces[biggest]):
            break
        name = biggest
        ratio = bound / size * _MARGIN
        pieces = {**pieces, name: _shrink(name, pieces[name], ratio)}
        cut = True
        result = build(pieces, cut)
        size = result_size(result)
    if size <= bound:
        return result
    raise payload_too_large(
        bound,
        message=f"the answer does not fit one MCP tool result ({bound} bytes "
        "as JSON): ask for less of it",
    )
