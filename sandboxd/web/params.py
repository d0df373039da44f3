# -*- test-case-name: tests.web.test_params -*-
"""
The one family of request parsers (as Synapse's ``parse_*``): every route
reads its query parameters and body fields through these.

Each takes the raw value (``request.query.get("depth")``,
``body.get("cols", 80)``) and the field's name, and answers the value in its
kind or raises 400 ``invalid_param`` with a message naming the field.

- A value from a query string is text; a value from a JSON body is JSON.
  :func:`flag`, :func:`integer` and :func:`number` read both forms (``?depth=2``
  and ``"max_results": 2``); :func:`seconds` and :func:`dimension` are body
  fields and take JSON numbers only.
- ``None`` (absent, or JSON null) is ``default`` when the caller gives one,
  else "missing": a field whose absence the caller settles with ``.get(name,
  default)`` therefore still refuses an explicit null.
- A boolean is spelled the same way everywhere: JSON true/false, or
  true/false, yes/no, on/off, 1/0 in any case.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeVar, overload

from sandboxd.api.fields import Field
from sandboxd.errors import bad_request, invalid_path
from sandboxd.policy.defaults import MAX_DIMENSION

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})

_T = TypeVar("_T")


class _Required:
    """The ``default`` of a field that has none: absent is a 400."""

    def __repr__(self) -> str:
        return "REQUIRED"


#: Pass as ``default`` (or leave it out) for a field that must be given.
REQUIRED: Final = _Required()


def _absent(value: Any, name: str, default: _T | _Required) -> _T:
    if isinstance(default, _Required):
        raise bad_request(f"missing '{name}'")
    return default


def flag(value: Any, name: str, default: bool = False, words: bool = True) -> bool:
    """
    ``value`` as a boolean: JSON true/false, or true/false, yes/no, on/off,
    1/0 in any case; missing is ``default`` (an empty ``?hidden=`` is 400).

    :param words: False for a JSON body field that takes only true or
        false (its absence settled by the caller's ``.get`` default).
    :raises ApiError: 400 ``invalid_param`` for anything else.
    """
    if isinstance(value, bool):
        return value
    if words:
        # An empty value (``?hidden=``) says neither: 400, not the default.
        if value is None:
            return default
        text = str(value).strip().lower()
        if text in TRUE_WORDS:
            return True
        if text in FALSE_WORDS:
            return False
    raise bad_request(f"'{name}' must be true or false")


def _bounded(
    number: _T, name: str, low: float | None, high: float | None, clamp: bool
) -> _T:
    if low is not None and number < low:  # type: ignore[operator]
        if high is not None and not clamp:
            raise bad_request(f"'{name}' must be within {low}..{high}")
        raise bad_request(f"'{name}' must be at least {low}")
    if high is not None and number > high:  # type: ignore[operator]
        if clamp:
            return high  # type: ignore[return-value]
        if low is not None:
            raise bad_request(f"'{name}' must be within {low}..{high}")
        raise bad_request(f"'{name}' must be at most {high}")
    return number


@overload
def integer(
    value: Any,
    name: str,
    default: int | _Required = ...,
    low: int | None = ...,
    high: int | None = ...,
) -> int: ...


@overload
def integer(
    value: Any,
    name: str,
    default: None,
    low: int | None = ...,
    high: int | None = ...,
) -> int | None: ...


def integer(
    value: Any,
    name: str,
    default: int | _Required | None = REQUIRED,
    low: int | None = None,
    high: int | None = None,
) -> int | None:
    """
    ``value`` as an integer within ``low..high``: a JSON integer (or a float
    with no fraction) or its decimal text; missing or empty is ``default``.

    :raises ApiError: 400 ``invalid_param`` naming ``name``.
    """
    if value is None or value == "":
        return _absent(value, name, default)
    number: int
    if isinstance(value, bool):
        raise bad_request(f"'{name}' must be an integer")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            raise bad_request(f"'{name}' must be an integer") from None
    else:
        raise bad_request(f"'{name}' must be an integer")
    return _bounded(number, name, low, high, clamp=False)


def dimension(value: Any, name: str, default: int | _Required = REQUIRED) -> int:
    """
    A terminal's ``cols`` or ``rows``: a JSON integer a ``winsize`` holds
    (1..:data:`MAX_DIMENSION`).

    :raises ApiError: 400 ``invalid_param`` naming ``name``.
    """
    if value is None:
        return _absent(value, name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer")
    return _bounded(value, name, 1, MAX_DIMENSION, clamp=False)


@overload
def number(
    value: Any,
    name: str,
    default: float | _Required = ...,
    low: float | None = ...,
    high: float | None = ...,
    clamp: bool = ...,
) -> float: ...


@overload
def number(
    value: Any,
    name: str,
    default: None,
    low: float | None = ...,
    high: float | None = ...,
    clamp: bool = ...,
) -> float | None: ...


def number(
    value: Any,
    name: str,
    default: float | _Required | None = REQUIRED,
    low: float | None = None,
    high: float | None = None,
    clamp: bool = False,
) -> float | None:
    """
    ``value`` as a finite number at least ``low`` and at most ``high`` (or
    cut to ``high`` when ``clamp``): a JSON number or its decimal text;
    missing or empty is ``default``.

    :raises ApiError: 400 ``invalid_param`` naming ``name``.
    """
    if value is None or value == "":
        return _absent(value, name, default)
    if isinstance(value, bool):
        raise bad_request(f"'{name}' must be a number")
    try:
        result = float(value) if isinstance(value, int | float | str) else math.nan
    except ValueError:
        result = math.nan
    if not math.isfinite(result):
        raise bad_request(f"'{name}' must be a number")
    return _bounded(result, name, low, high, clamp)


@overload
def seconds(
    value: Any,
    name: str,
    default: float | _Required = ...,
    ceiling: float | None = ...,
) -> float: ...


@overload
def seconds(
    value: Any,
    name: str,
    default: None,
    ceiling: float | None = ...,
) -> float | None: ...


def seconds(
    value: Any,
    name: str,
    default: float | _Required | None = REQUIRED,
    ceiling: float | None = None,
) -> float | None:
    """
    A body field's duration: a positive JSON number of seconds, cut to
    ``ceiling`` (the endpoint's limit) when one is given; missing is
    ``default``.

    :raises ApiError: 400 ``invalid_param`` naming ``name``.
    """
    if value is None:
        return _absent(value, name, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
    ):
        raise bad_request(f"'{name}' must be a number of seconds")
    if value <= 0:
        raise bad_request(f"'{name}' must be positive")
    return min(float(value), ceiling) if ceiling is not None else float(value)


@overload
def string(
    value: Any,
    name: str,
    default: str | _Required = ...,
    min_length: int = ...,
) -> str: ...


@overload
def string(
    value: Any,
    name: str,
    default: None,
    min_length: int = ...,
) -> str | None: ...


def string(
    value: Any,
    name: str,
    default: str | _Required | None = REQUIRED,
    min_length: int = 0,
) -> str | None:
    """
    ``value`` as a string of at least ``min_length`` characters; missing is
    ``default``, and an empty string where one character is needed is
    missing too.

    :raises ApiError: 400 ``invalid_param`` naming ``name``.
    """
    if value is None:
        return _absent(value, name, default)
    if not isinstance(value, str):
        raise bad_request(f"'{name}' must be a string")
    if len(value) < min_length:
        if not value:
            return _absent(value, name, default)
        raise bad_request(f"'{name}' must be at least {min_length} characters")
    return value


def required(value: Any, name: str) -> str:
    """A string that must be given and not be empty (a path, a pattern)."""
    return string(value, name, REQUIRED, min_length=1)


@overload
def path(
    value: Any, name: str, default: str | _Required = ..., parents: bool = ...
) -> str: ...


@overload
def path(value: Any, name: str, default: None, parents: bool = ...) -> str | None: ...


def path(
    value: Any,
    name: str,
    default: str | _Required | None = REQUIRED,
    parents: bool = True,
) -> str | None:
    """
    A path as a client gives it (the guard decides where it leads): a
    string with no NUL, and with no ``..`` segment unless ``parents``;
    missing or empty is ``default``.

    :raises ApiError: 400 ``invalid_param``, or ``invalid_path`` for NUL or
        a refused ``..``.
    """
    if value is None or value == "":
        return _absent(value, name, default)
    if not isinstance(value, str):
        raise bad_request(f"'{name}' must be a string")
    if "\x00" in value:
        raise invalid_path("NUL is not allowed in a path")
    if not parents and ".." in value:
        from sandboxd.git import has_parent_segment  # git's rules: not at start

        if has_parent_segment(value):
            raise invalid_path(f"'..' is not allowed in {name}")
    return value


@overload
def strings(
    value: Any,
    name: str,
    default: list[str] | _Required = ...,
    min_items: int = ...,
) -> list[str]: ...


@overload
def strings(
    value: Any,
    name: str,
    default: None,
    min_items: int = ...,
) -> list[str] | None: ...


def strings(
    value: Any,
    name: str,
    default: list[str] | _Required | None = REQUIRED,
    min_items: int = 0,
) -> list[str] | None:
    """
    ``value`` as a list of strings with at least ``min_items`` of them;
    missing is ``default``.

    :raises ApiError: 400 ``invalid_param`` naming ``name``.
    """
    if value is None:
        return _absent(value, name, default)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request(f"'{name}' must be a list of strings")
    if len(value) < min_items:
        raise bad_request(f"'{name}' must hold at least {min_items} item(s)")
    return value


@overload
def string_map(
    value: Any,
    name: str,
    default: dict[str, str] | _Required = ...,
) -> dict[str, str]: ...


@overload
def string_map(
    value: Any,
    name: str,
    default: None,
) -> dict[str, str] | None: ...


def string_map(
    value: Any,
    name: str,
    default: dict[str, str] | _Required | None = REQUIRED,
) -> dict[str, str] | None:
    """
    ``value`` as an object of string names to string values; missing is
    ``default``.

    :raises ApiError: 400 ``invalid_param`` naming ``name``.
    """
    if value is None:
        return _absent(value, name, default)
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise bad_request(f"'{name}' must be an object of string values")
    return dict(value)


def one_of(value: Any, name: str, choices: Mapping[str, _T] | tuple[str, ...]) -> Any:
    """
    ``value`` if it is one of ``choices`` (a tuple of words, or a mapping
    from word to what it stands for, whose value is answered).

    :raises ApiError: 400 ``invalid_param`` listing the choices.
    """
    if isinstance(value, str) and value in choices:
        return choices[value] if isinstance(choices, Mapping) else value
    raise bad_request(f"'{name}' must be one of {', '.join(choices)}")


#: The Python types a declared JSON type takes (a number takes an integer;
#: neither takes a boolean).
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "integer": (int,),
    "number": (int, float),
}


def declared_types(
    body: Mapping[str, Any], fields: Iterable[Field], name_param: bool = False
) -> None:
    """
    Refuse a body field whose JSON type is not the one its schema declares
    (null is "not given"; ``any`` takes everything), before the handler
    does anything: for a handler that passes some fields on unread, or
    reads them only after it has started something.

    :param name_param: name the field as ``param`` (the ``/v1`` door's
        envelope carries it).
    :raises ApiError: 400 ``invalid_param`` naming the field.
    """
    for field in fields:
        value = body.get(field.name)
        kinds = _JSON_TYPES.get(field.type)
        if value is None or kinds is None:
            continue
        if not isinstance(value, kinds) or (
            isinstance(value, bool) and bool not in kinds
        ):
            raise bad_request(
                f"'{field.name}' must be of type {field.type}",
                param=field.name if name_param else None,
            )


def name_glob(pattern: str, name: str) -> str:
    """
    ``pattern`` as a pattern over names: the leading ``**/`` of a path glob
    (as agents' own glob tools take them) dropped, since the walk is
    recursive already; a ``/`` left could never match a name, and is
    refused with a hint rather than answered with no results.

    :raises ApiError: 400 ``invalid_param``.
    """
    while pattern.startswith("**/"):
        pattern = pattern[3:]
    if "/" in pattern or not pattern:
        raise bad_request(
            f"'{name}' is matched against file names, not paths, so it cannot "
            "hold '/'; the search is recursive: give the name's pattern "
            "('*.py') and the directory as 'path'"
        )
    return pattern
