"""
Parameters every route reads the same way.

A boolean may come from a query string (``?follow=yes``) or a JSON body
(``"overwrite": false``); every route accepts the same words for it.
"""

from __future__ import annotations

from typing import Any

from sandboxd.errors import bad_request

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def flag(value: Any, name: str, default: bool = False) -> bool:
    """
    ``value`` as a boolean: JSON true/false, or true/false, yes/no, on/off,
    1/0 in any case; missing or empty is ``default``.

    :raises ApiError: 400 ``invalid_param`` for anything else.
    """
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise bad_request(f"'{name}' must be true or false")
