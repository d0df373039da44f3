# -*- test-case-name: tests.test_commands -*-
"""The ``commands`` group (SPEC §7.2): list and run template commands."""

from __future__ import annotations

import _thread
import inspect
import time
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.defer import Deferred, ensureDeferred, fail, succeed
from twisted.python.failure import Failure

from sandboxd.access.gate import may_run_command
from sandboxd.daemon.context import as_clock
from sandboxd.errors import (
    RESOURCE_RETRY_SECONDS,
    ApiError,
    Code,
    forbidden,
    internal,
    limit_exceeded,
    limit_rule,
    no_thread,
    not_found,
    timed_out,
    unexpected,
)
from sandboxd.policy.defaults import COMMANDS_AT_ONCE
from sandboxd.web.jsonbody import with_text
from sandboxd.web.messages import ServerRequest


class CommandThreads:
    """
    Threads for template commands that are plain functions, apart from the
    reactor's pool.

    A thread cannot be stopped: a plain function that outlives its
    timeout (or its caller, gone) runs on, although its caller was
    answered.  Such a call is *stuck*: it gives its caller's slot back at
    once, so commands still run beside it, but its thread is counted apart
    until the function returns.  ``size`` is the commands that may run for
    their callers at once (``run_command``'s ``max_concurrency``); stuck
    threads may take as many threads again.  A call past either bound is
    refused 429 ``concurrency_limited`` (the seed SDK's ``RateLimitedError``),
    never queued: a queued call would spend its own timeout waiting.  A
    refusal made while stuck threads fill their share names them, since
    only their functions returning, or a restart, frees it; it says no
    ``Retry-After`` then, as no wait is known to help.  On threads of their
    own, such commands never take the reactor's pool from the file walks
    and archives that need it; the threads are not joined when the
    interpreter exits, so a stuck command does not keep the daemon from
    stopping.
    """

    def __init__(self) -> None:
        #: Calls whose callers are waiting: call id to command name.
        self.running: dict[int, str] = {}
        #: Calls answered (timed out or cancelled) whose functions have not
        #: returned: call id to (command name, when it started).
        self.stuck: dict[int, tuple[str, float]] = {}
        self._next = 0

    def _refuse(self, size: int) -> ApiError:
        """The 429 for a call past the bound, naming the stuck commands."""
        if len(self.running) >= size:
            return limit_exceeded(
                429,
                f"{len(self.running)} commands are already running for their "
                f"callers (at most {size} at once)",
                Code.CONCURRENCY_LIMITED,
                headers={"Retry-After": str(RESOURCE_RETRY_SECONDS)},
                retry_after=RESOURCE_RETRY_SECONDS,
                endpoint="run_command",
                limit=size,
                stuck=self.stuck_summary(),
            )
        stuck = self.stuck_summary()
        names = ", ".join(
            f"{s['command']!r} ({s['threads']}, the oldest started "
            f"{s['seconds']:.0f} s ago)"
            for s in stuck
        )
        return limit_exceeded(
            429,
            f"{len(self.stuck)} command threads are still running functions "
            f"whose callers were answered at their timeout or went away: "
            f"{names}; a thread cannot be stopped, so none is free until one "
            "of them returns (or the daemon restarts)",
            Code.CONCURRENCY_LIMITED,
            endpoint="run_command",
            limit=size,
            stuck=stuck,
        )

    def stuck_summary(self) -> list[dict[str, Any]]:
        """The stuck calls by command: name, threads held, oldest age."""
        now = time.monotonic()
        by_name: dict[str, list[float]] = {}
        for name, since in self.stuck.values():
            by_name.setdefault(name, []).append(since)
        return [
            {
                "command": name,
                "threads": len(starts),
                "seconds": round(max(0.0, now - min(starts)), 1),
            }
            for name, starts in sorted(by_name.items())
        ]

    def call(
        self,
        reactor: Any,
        name: str,
        func: Callable[..., Any],
        kwargs: dict[str, Any],
        size: int,
    ) -> Deferred[Any]:
        """
        ``func(**kwargs)`` on a new thread; its result (or failure) on the
        reactor.  Cancelling the Deferred (a timeout, a caller gone) answers
        at once and leaves the call stuck until the function returns.

        :raises ApiError: 429 ``concurrency_limited`` past ``size`` calls
            running or ``size`` stuck; 503 when no thread can be started.
        """
        if len(self.running) >= size or len(self.running) + len(self.stuck) >= (
            2 * size
        ):
            raise self._refuse(size)
        self._next += 1
        call_id = self._next
        started = time.monotonic()

        def abandon(d: Deferred[Any]) -> None:
            if self.running.pop(call_id, None) is not None:
                self.stuck[call_id] = (name, started)

        d: Deferred[Any] = Deferred(abandon)

        def done(outcome: Any) -> None:
            self.running.pop(call_id, None)
            self.stuck.pop(call_id, None)
            if d.called:
                return
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
        self.running[call_id] = name
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
    ``GET /commands``: the visible commands the caller may run (listing is
    ``commands:list``'s business; a command listed is one whose call the
    caller's ``commands:run`` or ``commands:run:NAME`` and the command's
    own scopes let through, so a list is never an offer the call refuses).
    """
    context = request.context
    rule = context.policy.rules["run_command"]
    return {
        "commands": [
            cmd.as_json()
            for cmd in sorted(context.registry, key=lambda c: c.name)
            if not cmd.hidden
            and may_run_command(request.identity, rule, cmd.name, cmd.scopes)
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
    size = request.rule.limits.max_concurrency or COMMANDS_AT_ONCE
    try:
        pending = _start(reactor, name, cmd.func, kwargs, size)
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
        if inspect.iscoroutinefunction(cmd.func) and awaited_asyncio(e):
            raise internal(
                f"command {name!r} awaited asyncio ({e}): sandboxd runs a "
                "coroutine command on its Twisted reactor, where no asyncio "
                "event loop runs; await Deferreds there "
                "(twisted.internet.task.deferLater, treq), or make the command "
                "a plain function that calls asyncio.run(...), which runs on "
                "a thread of its own",
                type(e).__name__,
            ) from e
        raise unexpected(e) from e
    # A datetime, a set, a Path: sent as text, as agent-sandbox-server
    # sends them, rather than failing the call after the command ran.
    return {"result": with_text(result)}


def awaited_asyncio(error: BaseException) -> bool:
    """
    Whether a coroutine command failed for awaiting asyncio: with no
    asyncio loop running (the daemon's reactor is not one), asyncio's
    awaitables raise these RuntimeErrors, and sniffio's (httpx, anyio)
    ``AsyncLibraryNotFoundError``.  Told apart so that the answer says
    why, not only ``no running event loop``.
    """
    if not isinstance(error, RuntimeError):
        return False
    text = str(error)
    return (
        "event loop" in text
        or "await wasn't used with future" in text
        or type(error).__name__ == "AsyncLibraryNotFoundError"
    )


def _start(
    reactor: Any,
    name: str,
    func: Callable[..., Any],
    kwargs: dict[str, Any],
    size: int,
) -> Deferred[Any]:
    """
    The command's outcome as a Deferred: a plain function on a command
    thread (it may block), an asynchronous one on the reactor; cancelling
    it cancels a coroutine or Deferred command (a thread runs on, stuck).
    """
    if not runs_on_reactor(func):
        return THREADS.call(reactor, name, func, kwargs, size).addCallback(_awaited)
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
