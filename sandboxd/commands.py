# -*- test-case-name: tests.test_commands -*-
"""
Template commands (SPEC §7.2): named functions a template author registers
and callers run with ``POST /commands/{name}``.
"""

from __future__ import annotations

import copy
import inspect
import math
import typing
from collections.abc import Callable, Iterable
from typing import Any

import attrs
from twisted.logger import Logger

from sandboxd.errors import bad_request

log = Logger(namespace="sandboxd")

ARG_TYPES = ("string", "integer", "float", "boolean", "string_array")
_TRUE = ("true", "yes", "1")
_FALSE = ("false", "no", "0")
_PY_TYPES = {int: "integer", float: "float", bool: "boolean", str: "string"}
_NAME_TYPES = {"int": "integer", "float": "float", "bool": "boolean", "str": "string"}


def _check_type(instance: Any, attribute: Any, value: str) -> None:
    if value not in ARG_TYPES:
        raise ValueError(
            f"CommandArg type must be one of {', '.join(ARG_TYPES)}, not {value!r}"
        )


@attrs.frozen
class CommandArg:
    """One declared argument of a command."""

    name: str
    type: str = attrs.field(default="string", validator=_check_type)
    required: bool = True
    default: Any = None
    description: str = ""

    def as_json(self) -> dict[str, Any]:
        """The listing form of ``GET /commands``."""
        return {
            "name": self.name,
            "type": self.type,
            "required": self.required,
            "default": self.default,
            "description": self.description,
        }

    def coerce(self, value: Any) -> Any:
        """Convert a JSON value to this argument's type, or raise ValueError."""
        if self.type == "string_array":
            # A JSON array of strings, and nothing looser: a lone string is
            # not a one-item list (the seed's rule too).
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return list(value)
            raise ValueError("expected a JSON array of strings")
        if self.type == "string":
            if isinstance(value, str):
                return value
            if isinstance(value, bool | int | float):
                return str(value).lower() if isinstance(value, bool) else str(value)
            raise ValueError("expected a string")
        if self.type == "boolean":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError("expected a boolean (true/false/yes/no/1/0)")
        if isinstance(value, bool):
            raise ValueError(
                f"expected {'an integer' if self.type == 'integer' else 'a number'}"
            )
        if self.type == "integer":
            if isinstance(value, int):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, str):
                try:
                    return int(value.strip())
                except ValueError:
                    pass
            raise ValueError("expected an integer")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError("expected a number") from None
        if not math.isfinite(number):
            # "1e309", "inf" and "nan" read as floats the JSON body itself
            # refuses, and an answer carrying one would not be JSON.
            raise ValueError("expected a finite number")
        return number


def _annotation_type(annotation: Any) -> str:
    if annotation in _PY_TYPES:
        return _PY_TYPES[annotation]
    if typing.get_origin(annotation) is list and typing.get_args(annotation) == (str,):
        return "string_array"
    if isinstance(annotation, str):
        text = annotation.replace(" ", "")
        if text in ("list[str]", "List[str]", "typing.List[str]"):
            return "string_array"
        return _NAME_TYPES.get(text, "string")
    return "string"


def infer_args(func: Callable[..., Any]) -> tuple[CommandArg, ...]:
    """Arguments from a signature: int/float/bool/else string, no default = required."""
    out = []
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        required = param.default is inspect.Parameter.empty
        out.append(
            CommandArg(
                name=param.name,
                type=_annotation_type(param.annotation),
                required=required,
                default=None if required else param.default,
            )
        )
    return tuple(out)


def signature_mismatch(
    name: str, func: Callable[..., Any], args: Iterable[CommandArg]
) -> str | None:
    """
    Why declared ``args`` cannot call ``func``, or None: an argument the
    function does not take by keyword, or a parameter it needs that no
    argument declares.  Either would fail every call that reaches it with
    a TypeError, so registration refuses it instead.
    """
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return None  # a builtin without a signature: nothing to compare
    declared = [a.name for a in args]
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in params.values())
    by_keyword = (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )
    for arg in declared:
        param = params.get(arg)
        if param is not None and param.kind in by_keyword:
            continue
        if param is None and any_keyword:
            continue
        takes = ", ".join(p.name for p in params.values() if p.kind in by_keyword)
        return (
            f"command {name!r} declares the argument {arg!r}, which "
            f"{func.__name__}() does not take by keyword (it takes: "
            f"{takes or 'no arguments'})"
        )
    for param in params.values():
        needed = param.default is inspect.Parameter.empty and param.kind not in (
            param.VAR_POSITIONAL,
            param.VAR_KEYWORD,
        )
        if needed and param.name not in declared:
            return (
                f"command {name!r}: {func.__name__}() needs the argument "
                f"{param.name!r}, which its args= do not declare (declared: "
                f"{', '.join(declared) or 'none'})"
            )
    return None


@attrs.frozen
class Command:
    """A registered command."""

    name: str
    func: Callable[..., Any]
    description: str
    hidden: bool
    scopes: tuple[str, ...]
    args: tuple[CommandArg, ...]
    #: The function's parameters without a default: an argument declared
    #: optional (the seed's default) with no default of its own must still
    #: be given for these.
    needs: frozenset[str] = attrs.field(init=False)

    @needs.default
    def _needs(self) -> frozenset[str]:
        try:
            params = inspect.signature(self.func).parameters.values()
        except (TypeError, ValueError):
            return frozenset()
        return frozenset(
            p.name
            for p in params
            if p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        )

    def as_json(self) -> dict[str, Any]:
        """The listing form of ``GET /commands``."""
        return {
            "name": self.name,
            "description": self.description,
            "args": [a.as_json() for a in self.args],
        }

    def bind(self, body: dict[str, Any]) -> dict[str, Any]:
        """
        The keyword arguments for a call, coerced.

        :raises ApiError: 400 for a missing, undeclared or uncoercible argument.
        """
        declared = {a.name: a for a in self.args}
        for key in body:
            if key not in declared:
                raise bad_request(
                    f"unexpected argument {key!r} for command {self.name!r}"
                )
        kwargs: dict[str, Any] = {}
        for arg in self.args:
            if arg.name in body:
                try:
                    kwargs[arg.name] = arg.coerce(body[arg.name])
                except ValueError as e:
                    raise bad_request(f"argument {arg.name!r}: {e}") from None
            elif arg.required:
                raise bad_request(f"missing required argument {arg.name!r}")
            elif arg.default is None and arg.name in self.needs:
                raise bad_request(
                    f"missing argument {arg.name!r}: command {self.name!r} "
                    "declares it optional with no default, and its function "
                    "needs it"
                )
            elif arg.default is not None:
                # A copy per call: a handler that changes a list default
                # must not change the next call's (as on the seed).
                kwargs[arg.name] = copy.deepcopy(arg.default)
        return kwargs


def source_of(func: Callable[..., Any]) -> str:
    """Where ``func`` is defined (``file:line``), for a line an operator reads."""
    code = getattr(inspect.unwrap(func), "__code__", None)
    if code is None:
        return repr(func)
    return f"{code.co_filename}:{code.co_firstlineno}"


class CommandRegistry:
    """The commands a server offers; frozen when the server starts."""

    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}
        self._frozen = False

    def __contains__(self, name: object) -> bool:
        return name in self._commands

    def __iter__(self) -> Any:
        return iter(self._commands.values())

    def names(self) -> list[str]:
        """Every command name (hidden ones included), sorted."""
        return sorted(self._commands)

    def get(self, name: str) -> Command | None:
        """The command called ``name``, if any."""
        return self._commands.get(name)

    @property
    def frozen(self) -> bool:
        """Whether registration is closed."""
        return self._frozen

    def freeze(self) -> None:
        """Close registration (the server is starting)."""
        self._frozen = True

    def register(
        self,
        func: Callable[..., Any],
        name: str | None = None,
        description: str = "",
        hidden: bool = False,
        scopes: Iterable[str] = (),
        args: Iterable[CommandArg] | None = None,
    ) -> Command:
        """
        Add a command.

        A name already registered is replaced, with a log line naming both
        functions' sources.

        :raises RuntimeError: once frozen.
        :raises ValueError: on declared ``args`` the function cannot be
            called with (:func:`signature_mismatch`).
        """
        if self._frozen:
            raise RuntimeError(
                "the command registry is frozen: register commands at import time"
            )
        name = name or func.__name__
        if args is not None:
            args = tuple(args)
            mismatch = signature_mismatch(name, func, args)
            if mismatch is not None:
                raise ValueError(mismatch)
        cmd = Command(
            name=name,
            func=func,
            description=description or (inspect.getdoc(func) or "").split("\n")[0],
            hidden=hidden,
            scopes=tuple(scopes),
            args=tuple(args) if args is not None else infer_args(func),
        )
        earlier = self._commands.get(name)
        if earlier is not None:
            # The last registration wins, as on the seed: a derived
            # template's file given after its base's customises one command.
            log.info(
                "sandboxd: command {name!r} from {new} replaces the one from {old}",
                name=name,
                new=source_of(func),
                old=source_of(earlier.func),
            )
        self._commands[name] = cmd
        return cmd

    def command(
        self,
        name: str | Callable[..., Any] | None = None,
        description: str = "",
        hidden: bool = False,
        scopes: Iterable[str] = (),
        args: Iterable[CommandArg] | None = None,
    ) -> Any:
        """Decorator: ``@registry.command("name", description=...)`` or bare."""
        if callable(name):
            self.register(name)
            return name

        def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
            self.register(func, name, description, hidden, scopes, args)
            return func

        return decorate


#: The registry ``@command`` writes to and servers use unless given another.
default_registry = CommandRegistry()


def command(
    name: str | Callable[..., Any] | None = None,
    description: str = "",
    hidden: bool = False,
    scopes: Iterable[str] = (),
    args: Iterable[CommandArg] | None = None,
) -> Any:
    """Register a function in the default registry (SPEC §7.2)."""
    return default_registry.command(name, description, hidden, scopes, args)
