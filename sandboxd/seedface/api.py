# -*- test-case-name: tests.seedface.test_api -*-
"""
The seed's template API (``agent_sandbox.server``), spoken by sandboxd.

A template's ``commands.py`` written for the seed's server imports
``command``, ``CommandArg``, ``default_table`` and friends from
``agent_sandbox.server``.  Inside the daemon that import lands here (see
:mod:`sandboxd.seedface.finder`), and each name does what it does on the
seed, written onto sandboxd's own registry and route table:

- ``CommandArg`` takes the seed's fields (optional unless ``required``, a
  default given as text, ``string_array``);
- ``CommandRegistry`` and ``default_registry()`` take the seed's
  ``register(name, fn, ...)`` order;
- routes registered through ``default_table()`` need no scope unless they
  name one (authentication only, as on the seed), receive the request with
  the seed's shape (``query`` values are lists, ``body`` is None on a GET)
  and run in the thread pool, as the seed's threaded server runs them;
- ``ServerResponse.error`` takes ``error_type``; ``SSEResponse`` takes
  ``status`` and pulls a blocking iterator off the reactor thread;
- ``start`` and ``SandboxServer.serve`` do nothing: the daemon is the server.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from sandboxd import commands as ours
from sandboxd.endpoints import CapabilityGroup, Endpoint, param_name
from sandboxd.endpoints import RouteTable as OurTable
from sandboxd.errors import Code
from sandboxd.threads import in_pool
from sandboxd.web import jsonbody, messages

__all__ = [
    "CapabilityGroup",
    "CommandArg",
    "CommandRegistry",
    "PolicyDenied",
    "RegisteredCommand",
    "RouteInfo",
    "RouteTable",
    "SSEResponse",
    "SandboxServer",
    "ServerPolicy",
    "ServerRequest",
    "ServerResponse",
    "command",
    "default_registry",
    "default_table",
    "start",
]

log = logging.getLogger(__name__)

ServerRequest = messages.ServerRequest
RegisteredCommand = ours.Command
RouteInfo = Endpoint


# -- commands -----------------------------------------------------------------


def _typed_default(kind: str, default: str | None) -> Any:
    """
    A seed default (always text) as the value the function receives: a
    ``string_array`` default is a JSON array; a scalar that does not parse
    stays text, as the seed leaves it.
    """
    if default is None:
        return None
    if kind == "string_array":
        try:
            value = json.loads(default)
        except (TypeError, ValueError):
            value = None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError("a string_array default must be a JSON array of strings")
        return value
    try:
        return ours.CommandArg("_", kind).coerce(default)
    except ValueError:
        return default


def CommandArg(
    name: str,
    type: str = "string",
    required: bool = False,
    default: str | None = None,
    description: str = "",
) -> ours.CommandArg:
    """
    One argument as the seed declares it: optional unless ``required``,
    its default given as text.

    :raises ValueError: for a type the seed does not know, or a
        ``string_array`` default that is not a JSON array of strings.
    """
    return ours.CommandArg(
        name=name,
        type=type,
        required=required,
        default=_typed_default(type, default),
        description=description,
    )


def _as_ours(args: Iterable[Any] | None) -> tuple[ours.CommandArg, ...] | None:
    """Arguments from either face (or the seed SDK's own dataclass)."""
    if args is None:
        return None
    out = []
    for arg in args:
        if isinstance(arg, ours.CommandArg):
            out.append(arg)
        else:
            out.append(
                CommandArg(
                    arg.name,
                    getattr(arg, "type", "string"),
                    getattr(arg, "required", False),
                    getattr(arg, "default", None),
                    getattr(arg, "description", ""),
                )
            )
    return tuple(out)


class CommandRegistry:
    """
    The seed's registry interface over one of sandboxd's registries.

    ``CommandRegistry()`` makes a fresh one; :func:`default_registry` is
    the one the daemon serves.
    """

    def __init__(self, registry: ours.CommandRegistry | None = None) -> None:
        self.registry = registry if registry is not None else ours.CommandRegistry()

    def register(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        args: Iterable[Any] | None = None,
        description: str = "",
        hidden: bool = False,
        scopes: Iterable[str] = (),
    ) -> None:
        """Register ``fn`` as ``name`` (the seed's argument order)."""
        self.registry.register(
            fn, name, description, hidden, tuple(scopes), _as_ours(args)
        )

    def command(
        self, name: str | None = None, *, hidden: bool = False, **kwargs: Any
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: ``@registry.command("name", description=...)``."""

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register(name or fn.__name__, fn, hidden=hidden, **kwargs)
            return fn

        return decorate

    def freeze(self) -> None:
        """Close registration."""
        self.registry.freeze()

    def get(self, name: str) -> ours.Command | None:
        """The command called ``name``, if any."""
        return self.registry.get(name)

    def list_all(self) -> dict[str, ours.Command]:
        """Every command by name."""
        return {c.name: c for c in self.registry}

    def list_visible(self) -> dict[str, ours.Command]:
        """Every command not registered ``hidden``, by name."""
        return {c.name: c for c in self.registry if not c.hidden}

    def __contains__(self, name: object) -> bool:
        return name in self.registry

    def __len__(self) -> int:
        return len(self.registry.names())


_default_registry = CommandRegistry(ours.default_registry)


def default_registry() -> CommandRegistry:
    """The registry the daemon serves (a function, as on the seed)."""
    return _default_registry


def command(
    name: str | None = None, *, hidden: bool = False, **kwargs: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``@command("name", description=..., args=..., scopes=...)``, as on the seed."""
    return _default_registry.command(name, hidden=hidden, **kwargs)


# -- routes -------------------------------------------------------------------


class Headers(dict[str, str]):
    """
    Request headers that answer to any capitalisation: the seed's handlers
    read ``request.headers.get("X-Token")`` as sent, sandboxd's names are
    lower-cased.
    """

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())

    def get(self, name: str, default: Any = None) -> Any:
        """The header's value, or ``default``."""
        return super().get(name.lower(), default)


class SeedRequest:
    """
    A request in the seed's shape, for a handler written for the seed.

    ``query`` maps each name to a list of values (sandboxd refuses a
    repeated parameter before any handler runs, so each list holds one);
    ``body`` is None when the method carries none; anything else is read
    from sandboxd's request (``identity``, ``rule``).
    """

    def __init__(
        self, request: messages.ServerRequest, pattern: tuple[str, ...] = ()
    ) -> None:
        self._request = request
        self.method = request.method
        self.path = request.path
        self.query: dict[str, list[str]] = {k: [v] for k, v in request.query.items()}
        self.headers = Headers({k.lower(): v for k, v in request.headers.items()})
        self.body: dict[str, Any] | None = (
            request.body if request.method in ("POST", "PUT", "DELETE") else None
        )
        self.path_params = _raw_params(request, pattern)
        self.context: dict[str, Any] = {"registry": _default_registry}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)


def _raw_params(
    request: messages.ServerRequest, pattern: tuple[str, ...]
) -> dict[str, str]:
    """
    The ``{param}`` segments as the request wrote them, percent-escapes
    and all, as agent-sandbox-server hands them to a handler (which then
    unquotes them itself: a decoded value would be decoded twice);
    sandboxd's decoded ones when the path cannot be lined up with
    ``pattern``.
    """
    raw = getattr(request.raw, "path", None)
    if not isinstance(raw, bytes) or not request.path_params:
        return dict(request.path_params)
    written = [s for s in raw.split(b"?", 1)[0].split(b"/") if s]
    if len(written) != len(pattern):
        return dict(request.path_params)
    out = dict(request.path_params)
    for segment, value in zip(pattern, written, strict=True):
        name = param_name(segment)
        if name is not None and name in out:
            out[name] = value.decode("latin-1")
    return out


def _seed_handler(
    handler: Callable[..., Any], pattern: tuple[str, ...] = ()
) -> Callable[[Any], Any]:
    """``handler`` called with a :class:`SeedRequest`, in the thread pool."""

    def answer(request: messages.ServerRequest) -> Any:
        return _with_text(handler(SeedRequest(request, pattern)))

    def call(request: messages.ServerRequest) -> Any:
        d = request.context.in_thread(answer, request)
        return d.addErrback(_refusal)

    call.__doc__ = handler.__doc__
    call.__name__ = getattr(handler, "__name__", "handler")
    return call


def _with_text(answer: Any) -> Any:
    """
    A handler's answer with what JSON has no type for (a ``datetime``, a
    ``Path``) as text, as agent-sandbox-server encodes it.
    """
    if isinstance(answer, messages.ServerResponse) and answer.raw is None:
        answer.body = jsonbody.with_text(answer.body)
        return answer
    if isinstance(answer, dict | list):
        return jsonbody.with_text(answer)
    return answer


class RouteTable:
    """The seed's route-table interface over sandboxd's table."""

    def __init__(self, table: OurTable | None = None) -> None:
        self.table = table if table is not None else OurTable()

    def register(
        self,
        method: str,
        path_pattern: str,
        handler: Callable[..., Any],
        *,
        group: CapabilityGroup = CapabilityGroup.COMMANDS,
        auth_required: bool = True,
        streaming: bool = False,
        name: str = "",
        scopes: Iterable[str] = (),
        spec: Any = None,
        summary: str = "",
    ) -> Endpoint:
        """
        Register a custom route; with no ``scopes`` it needs only
        authentication, as on the seed (``check-config`` warns about it).
        """
        if spec is not None and getattr(spec, "scopes", None):
            scopes = spec.scopes
        return self.table.register(
            method,
            path_pattern,
            _seed_handler(handler, tuple(s for s in path_pattern.split("/") if s)),
            CapabilityGroup(getattr(group, "value", group)),
            auth_required,
            streaming,
            name or None,
            tuple(scopes),
            summary or (handler.__doc__ or "").strip().split("\n")[0],
        )

    def route(
        self, method: str, path_pattern: str, **kwargs: Any
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`register`."""

        def decorate(handler: Callable[..., Any]) -> Callable[..., Any]:
            self.register(method, path_pattern, handler, **kwargs)
            return handler

        return decorate

    def enable_group(self, group: CapabilityGroup) -> None:
        """Turn a group on in the code layer (the core group: nothing to do)."""
        group = CapabilityGroup(getattr(group, "value", group))
        if group is not CapabilityGroup.CORE:
            self.table.enable_group(group)

    def disable_group(self, group: CapabilityGroup) -> None:
        """Turn a group off in the code layer; the core group cannot be."""
        self.table.disable_group(CapabilityGroup(getattr(group, "value", group)))


def default_table() -> RouteTable:
    """The table the daemon serves, with the seed's interface."""
    from sandboxd import routes

    return RouteTable(routes.default_table())


# -- responses ----------------------------------------------------------------


class ServerResponse(messages.ServerResponse):
    """sandboxd's response, with the seed's ``error(..., error_type=)``."""

    @classmethod
    def error(  # type: ignore[override]
        cls,
        status: int,
        message: str,
        error_type: str = "ValueError",
        **extra: Any,
    ) -> ServerResponse:
        """``{"error": message, "type": error_type}`` with ``status``."""
        response = super().error(status, message, error_type, **extra)
        assert isinstance(response, ServerResponse)
        return response


async def _off_the_reactor(
    source: Iterator[Any], in_thread: Callable[..., Deferred[Any]]
) -> AsyncIterator[Any]:
    """
    Each item of a blocking iterator, fetched in the thread pool; the
    iterator closed (in the pool) when the stream ends for any reason.

    A generator's ``finally`` and ``with`` blocks are where a template ends
    what it streams from (``tail -f``, a file, a lock): the seed closes the
    generator when its client hangs up, so does this.  A client gone while
    an item is being fetched cancels the wait for it, not the fetch (a
    thread cannot be stopped, and a generator running in one cannot be
    closed): the close waits for that fetch to return.
    """
    done = object()
    fetching: Deferred[Any] | None = None
    try:
        while True:
            fetching = in_thread(next, source, done)
            item = await _apart(fetching)
            fetching = None
            if item is done:
                return
            yield item
    finally:
        _close_later(source, fetching, in_thread)


def _apart(d: Deferred[Any]) -> Deferred[Any]:
    """
    A Deferred with ``d``'s result whose cancellation leaves ``d`` running,
    so that what follows ``d`` (the close) still waits for it.
    """
    out: Deferred[Any] = Deferred()

    def passed(result: Any) -> None:
        if out.called:
            return
        if isinstance(result, Failure):
            out.errback(result)
        else:
            out.callback(result)

    d.addBoth(passed)
    return out


def _close_later(
    source: Any, fetching: Deferred[Any] | None, in_thread: Callable[..., Any]
) -> None:
    """``source.close()`` in the pool, once the fetch under way (if any) is over."""
    close = getattr(source, "close", None)
    if close is None:
        return

    def closing(_: object) -> None:
        in_thread(close).addErrback(
            lambda f: log.warning(
                "closing a template's event stream raised %s: %s",
                f.type.__name__,
                f.value,
            )
        )

    if fetching is None:
        closing(None)
    else:
        fetching.addBoth(closing)


class SSEResponse(messages.SSEResponse):
    """
    sandboxd's event stream, built as the seed builds one.

    ``event_iterator`` yields pre-formatted frames (``"data: ...\\n\\n"``)
    and may block between them: it is read in the thread pool.
    """

    def __init__(
        self,
        status: int = 200,
        headers: dict[str, str] | None = None,
        event_iterator: Iterable[Any] | None = None,
    ) -> None:
        from twisted.internet import reactor

        source: Any = event_iterator
        if source is not None and not hasattr(source, "__aiter__"):
            iterator = iter(source)
            source = _off_the_reactor(iterator, lambda f, *a: in_pool(reactor, f, *a))
        extra = {
            k: v for k, v in (headers or {}).items() if k.lower() != "content-type"
        }
        super().__init__(event_iterator=source, headers=extra)
        self.status = status


class PolicyDenied(Exception):
    """
    Raised by a handler to refuse a call, as on the seed; the daemon
    answers with ``status`` and a body carrying ``code``.
    """

    def __init__(
        self, code: str, message: str, *, status: int = 403, **extra: Any
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.extra = extra


def _refusal(failure: Any) -> ServerResponse:
    """
    A handler's :class:`PolicyDenied` as the answer the seed gives; a code
    that is not one of sandboxd's is carried as ``reason`` instead.
    """
    failure.trap(PolicyDenied)
    denied: PolicyDenied = failure.value
    extra = dict(denied.extra)
    code: Code | None = None
    try:
        code = Code(denied.code)
    except ValueError:
        extra["reason"] = denied.code
    return ServerResponse.error(
        denied.status, denied.message, "PolicyDenied", code=code, **extra
    )


class ServerPolicy:
    """
    A policy document as a template builds one for its own ``SandboxServer``.

    Inside sandboxd the daemon's policy comes from ``--policy`` (or the
    environment), so this only holds the document: the constructors a
    template may call at import all work, and nothing is enforced from it.
    """

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config: dict[str, Any] = json.loads(json.dumps(config or {}))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerPolicy:
        """The document ``data``."""
        return cls(data)

    @classmethod
    def from_json(cls, text: str) -> ServerPolicy:
        """The document in ``text``."""
        return cls(json.loads(text))

    @classmethod
    def from_file(cls, path: str) -> ServerPolicy:
        """The document in a JSON or YAML file."""
        from sandboxd.policy.document import read_file

        return cls(read_file(path))

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ServerPolicy:
        """A preset, with top-level keys on top."""
        return cls({"preset": name, **overrides})

    @classmethod
    def only(cls, *endpoint_ids: str, **rule: Any) -> ServerPolicy:
        """Every endpoint off but core and ``endpoint_ids`` (``transfer``: uploads and downloads)."""
        from sandboxd.policy.presets import TRANSFER

        ids: list[str] = []
        for item in endpoint_ids:
            ids.extend(TRANSFER if item == "transfer" else (item,))
        endpoints: dict[str, Any] = {"*": {"enabled": False}}
        endpoints.update({i: {"enabled": True, **rule} for i in ids})
        return cls({"endpoints": endpoints})

    @classmethod
    def from_environment(cls) -> ServerPolicy | None:
        """The ambient policy the daemon would read, or None."""
        from sandboxd.policy.document import find_policy

        data, source, _ = find_policy()
        return None if source == "none" else cls(data)

    def with_endpoint(self, selector: str, **rule: Any) -> ServerPolicy:
        """This document with ``rule`` set on ``selector``."""
        data = self.to_dict()
        data.setdefault("endpoints", {}).setdefault(selector, {}).update(rule)
        return ServerPolicy(data)

    def with_options(self, **top: Any) -> ServerPolicy:
        """This document with top-level keys replaced."""
        return ServerPolicy({**self.to_dict(), **top})

    def to_dict(self) -> dict[str, Any]:
        """A copy of the document."""
        return dict(json.loads(json.dumps(self.config)))

    @property
    def preset_name(self) -> str:
        """The preset named, ``default`` when none."""
        return str(self.config.get("preset", "default"))


# -- the server itself --------------------------------------------------------


def start(*args: Any, **kwargs: Any) -> None:
    """Nothing to do: inside sandboxd the daemon already serves the template."""
    log.info("agent_sandbox.server.start() ignored: sandboxd serves this template")


class SandboxServer:
    """Accepted for templates that build one; the daemon is the server."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs

    def serve(self, port: int = 9000) -> None:
        """Nothing to do: the daemon already listens."""
        log.info("SandboxServer.serve(%s) ignored: sandboxd serves this template", port)
