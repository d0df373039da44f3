# -*- test-case-name: tests.test_commands -*-
"""The ``commands`` group (SPEC §7.2): list and run template commands."""

from __future__ import annotations

import inspect
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred

from sandboxd.errors import ApiError, Code, forbidden, not_found, unexpected
from sandboxd.web.messages import ServerRequest


def runs_on_reactor(func: Any) -> bool:
    """
    Whether a command is asynchronous and so must run on the reactor thread.

    Coroutine functions are; so are functions whose return annotation names
    ``Deferred``.  Everything else is a plain function that may block, and
    goes to the thread pool.
    """
    if inspect.iscoroutinefunction(func):
        return True
    annotation = inspect.signature(func).return_annotation
    text = (
        annotation
        if isinstance(annotation, str)
        else getattr(annotation, "__name__", "")
    )
    return "Deferred" in str(text) or "Deferred" in repr(annotation)


def _may_run(request: ServerRequest, name: str, scopes: tuple[str, ...]) -> bool:
    identity = request.identity
    if not (
        identity.has_scope("commands:run") or identity.has_scope(f"commands:run:{name}")
    ):
        return False
    return identity.missing(scopes) is None


def list_commands(request: ServerRequest) -> dict[str, Any]:
    """``GET /commands``: visible commands the caller may run."""
    registry = request.context.registry
    return {
        "commands": [
            cmd.as_json()
            for cmd in sorted(registry, key=lambda c: c.name)
            if not cmd.hidden and _may_run(request, cmd.name, cmd.scopes)
        ]
    }


def _unknown(request: ServerRequest, name: str) -> ApiError:
    registry = request.context.registry
    available = ", ".join(
        c.name for c in sorted(registry, key=lambda c: c.name) if not c.hidden
    )
    return not_found(f"Unknown command '{name}'; available: {available}", "ValueError")


async def run_command(request: ServerRequest) -> dict[str, Any]:
    """``POST /commands/{name}``: coerce the body to kwargs and call it."""
    name = request.path_params["name"]
    cmd = request.context.registry.get(name)
    if cmd is None:
        raise _unknown(request, name)
    lacking = request.identity.missing(cmd.scopes)
    if lacking is not None:
        raise forbidden(
            f"this identity lacks the scope {lacking!r}",
            Code.MISSING_SCOPE,
            endpoint="run_command",
            scope=lacking,
            rule=f"command:{name}",
        )
    kwargs = cmd.bind(request.body)
    func = cmd.func
    try:
        if runs_on_reactor(func):
            result = func(**kwargs)
        else:
            # A plain function may block: run it in the thread pool.
            result = await request.context.in_thread(func, **kwargs)
        if inspect.iscoroutine(result):
            result = await ensureDeferred(result)
        elif isinstance(result, Deferred):
            result = await result
    except ApiError:
        raise
    except Exception as e:
        raise unexpected(e) from e
    return {"result": result}


HANDLERS = {"list_commands": list_commands, "run_command": run_command}
