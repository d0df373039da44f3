# -*- test-case-name: tests.test_commands -*-
"""The ``commands`` group (SPEC §7.2): list and run template commands."""

from __future__ import annotations

import _thread
import inspect
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.defer import Deferred, ensureDeferred, fail, succeed
from twisted.python.failure import Failure

from sandboxd.daemon.context import as_clock
from sandboxd.errors import (
    ApiError,
    Code,
    forbidden,
    limit_rule,
    no_thread,
    not_found,
    timed_out,
    unavailable,
    unexpected,
)
from sandboxd.web.messages import ServerRequest

#: Plain-function commands that may run at once, each on a thread of its own.
MAX_COMMAND_THREADS = 8


class CommandThreads:
    """
    Threads for template commands that are plain functions, apart from the
    reactor's pool.

    A thread cannot be stopped: a command that never returns keeps its
    thread for good, although its caller is answered at the command's
    timeout.  On threads of their own, at most :data:`MAX_COMMAND_THREADS` of
    them, such commands can never take the reactor's pool from the file
    walks and archives that need it, and once every thread is held a new
    one is refused (503) instead of waiting behind them.  The threads are
    not joined when the interpreter exits: a stuck command does not keep
    the daemon from stopping.
    """

    def __init__(self, size: int = MAX_COMMAND_THREADS) -> None:
        self.size = size
        self.running = 0

    def call(
        self, reactor: Any, func: Callable[..., Any], kwargs: dict[str, Any]
    ) -> Deferred[Any]:
        """
        ``func(**kwargs)`` on a new thread; its result (or failure) on the reactor.

        :raises ApiError: 503 ``unavailable`` when every command thread is
            held, or when no thread can be started at all.
        """
        if self.running >= self.size:
            raise unavailable(
                f"all {self.size} command threads are running commands that have "
                "not returned",
                type="ResourceError",
                retry_after=1,
            )
        d: Deferred[Any] = Deferred()

        def done(outcome: Any) -> None:
            self.running -= 1
            if isinstance(outcome, Failure):
                d.errback(outcome)
            else:
                d.callback(outcome)

        def work() -> None:
            try:
                outcome: Any = func(**kwargs)
            except BaseException:
                outcome = Failure()
            reactor.callFromThread(done, outcome)

        try:
            _thread.start_new_thread(work, ())
        except RuntimeError:
            # ``pthread_create`` failed: the process is at its thread or
            # pid limit (EAGAIN), like a fork refused for the same reason.
            raise no_thread("cannot start a thread for the command now") from None
        self.running += 1
        return d


#: The daemon's command threads.
THREADS = CommandThreads()


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


def list_commands(request: ServerRequest) -> dict[str, Any]:
    """
    ``GET /commands``: visible commands whose own scopes the caller holds
    (listing is ``commands:list``'s business, running ``commands:run``'s,
    as on the seed).
    """
    registry = request.context.registry
    return {
        "commands": [
            cmd.as_json()
            for cmd in sorted(registry, key=lambda c: c.name)
            if not cmd.hidden and request.identity.missing(cmd.scopes) is None
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
    timeout = request.rule.limits.timeout_seconds
    reactor = request.context.reactor
    try:
        pending = _start(reactor, cmd.func, kwargs)
        if timeout is not None:
            pending.addTimeout(timeout, as_clock(reactor))
        result = await pending
    except ApiError:
        raise
    except defer.TimeoutError:
        raise timed_out(
            f"command {name!r} did not finish within {timeout} seconds",
            status=500,
            rule=limit_rule(request.rule, "timeout_seconds"),
            limit="timeout_seconds",
        ) from None
    except Exception as e:
        raise unexpected(e) from e
    return {"result": result}


def _start(
    reactor: Any, func: Callable[..., Any], kwargs: dict[str, Any]
) -> Deferred[Any]:
    """
    The command's outcome as a Deferred: a plain function on a command
    thread (it may block), an asynchronous one on the reactor; cancelling
    it cancels a coroutine or Deferred command (a thread runs on).
    """
    if not runs_on_reactor(func):
        return THREADS.call(reactor, func, kwargs).addCallback(_awaited)
    try:
        return _awaited(func(**kwargs))
    except Exception:
        return fail(Failure())


def _awaited(result: Any) -> Deferred[Any]:
    """What a command returned, awaited when it is a coroutine or a Deferred."""
    if inspect.iscoroutine(result):
        return ensureDeferred(result)
    if isinstance(result, Deferred):
        return result
    return succeed(result)


HANDLERS = {"list_commands": list_commands, "run_command": run_command}
