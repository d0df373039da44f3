# -*- test-case-name: tests.test_commands -*-
"""The ``commands`` group (SPEC §7.2): list and run template commands."""

from __future__ import annotations

import _thread
import asyncio
import inspect
import re
import threading
import time
import traceback
import types
import typing
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from twisted.internet import defer
from twisted.internet.defer import Deferred, ensureDeferred, fail, succeed
from twisted.logger import Logger
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

log = Logger(namespace="sandboxd.commands")


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
        on_cancel: Callable[[], None] | None = None,
    ) -> Deferred[Any]:
        """
        ``func(**kwargs)`` on a new thread; its result (or failure) on the
        reactor.  Cancelling the Deferred (a timeout, a caller gone) answers
        at once, calls ``on_cancel`` (which may ask the function to stop)
        and leaves the call stuck until the function returns.

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
            if on_cancel is not None:
                on_cancel()

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


#: A return annotation left as text (``from __future__ import annotations``)
#: that names Twisted's Deferred itself: ``Deferred``, ``defer.Deferred``,
#: ``Deferred[str]``; not ``DeferredJob`` or ``"DeferredResult"``.
_DEFERRED_TEXT = re.compile(r"(?:[A-Za-z_][\w.]*\.)?Deferred(?:\[.*\])?")


def _is_deferred_type(hint: Any) -> bool:
    """Whether a resolved annotation is Deferred (or only Deferred and None)."""
    if hint is Deferred or typing.get_origin(hint) is Deferred:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        return bool(members) and all(_is_deferred_type(a) for a in members)
    return False


@lru_cache(maxsize=1024)
def returns_deferred(func: Any) -> bool:
    """
    Whether a plain function's return annotation is Twisted's ``Deferred``,
    read as a type: a template's own ``DeferredJob`` is not one, so such a
    function runs on a command thread like any function that may block.
    An annotation left as text that cannot be resolved is read by its
    spelling, ``Deferred`` or ``Deferred[...]`` exactly.
    """
    try:
        annotation = inspect.signature(func).return_annotation
    except (TypeError, ValueError):
        return False
    if annotation is inspect.Signature.empty:
        return False
    try:
        hint = typing.get_type_hints(func).get("return", annotation)
    except Exception:
        hint = annotation
    if isinstance(hint, str):
        text = hint.strip().strip("'\"")
        return _DEFERRED_TEXT.fullmatch(text) is not None
    return _is_deferred_type(hint)


def runs_on_reactor(func: Any) -> bool:
    """
    Whether a command runs on the reactor thread: only a plain function
    whose return annotation is ``Deferred``, which returns at once with
    Twisted work under way.  Everything else runs on a command thread,
    coroutine functions included (on an asyncio event loop of their own
    there): a blocking call inside ``async def`` is an easy slip, and on
    the reactor it would stall every request and the timer that should
    answer the command at its timeout.
    """
    if inspect.iscoroutinefunction(func):
        return False
    return returns_deferred(func)


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
    """The 404, naming only the commands ``GET /commands`` shows the caller."""
    registry = request.context.registry
    rule = request.context.policy.rules["run_command"]
    available = ", ".join(
        c.name
        for c in sorted(registry, key=lambda c: c.name)
        if not c.hidden and may_run_command(request.identity, rule, c.name, c.scopes)
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
    except (ApiError, defer.CancelledError):
        # A cancel is the caller gone, not the command's failure.
        raise
    except defer.TimeoutError:
        raise timed_out(
            f"command {name!r} did not finish within {timeout} seconds",
            status=500,
            rule=limit_rule(request.rule, "timeout_seconds"),
            limit="timeout_seconds",
        ) from None
    except Exception as e:
        if awaited_deferred(e):
            raise internal(
                f"command {name!r} awaited a Deferred ({e}): sandboxd runs a "
                "coroutine command on an asyncio event loop of its own, on a "
                "command thread, where Twisted's reactor is not to be "
                "called; to await Deferreds (deferLater, treq), make the "
                "command a plain function annotated '-> Deferred' that "
                "returns ensureDeferred(your_coroutine()), which runs on the "
                "reactor",
                type(e).__name__,
            ) from e
        _log_raised(name, e)
        raise unexpected(e) from e
    # A datetime, a set, a Path: sent as text, as agent-sandbox-server
    # sends them, rather than failing the call after the command ran.
    return {"result": with_text(result)}


def _log_raised(name: str, error: BaseException) -> None:
    """
    A command's exception, with its traceback, in the daemon's log at
    ``warn``: its caller is told only the message and type, and a template
    author debugging a failing command needs the file and line.
    """
    frames = traceback.extract_tb(error.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    log.warn(
        "command {command!r} raised {error_type} at {where}\n{traceback}",
        command=name,
        error_type=type(error).__name__,
        where=where,
        traceback="".join(traceback.format_exception(error)).rstrip(),
    )


def awaited_deferred(error: BaseException) -> bool:
    """
    Whether a coroutine command failed for awaiting a pending Deferred on
    its asyncio loop, which asyncio refuses as a "bad yield".  Told apart
    so that the answer says why and what to write instead.
    """
    text = str(error)
    return (
        isinstance(error, RuntimeError) and "bad yield" in text and "Deferred" in text
    )


class _OnItsLoop:
    """
    A coroutine command run on a command thread, on an asyncio event loop
    of its own (as ``asyncio.run`` would): asyncio code (``asyncio.sleep``,
    httpx) works, and a blocking call inside it holds that thread only.
    ``cancel`` (from the reactor, at the timeout or when the caller goes)
    cancels its task, so a command that awaits stops there; one busy in a
    blocking call stops at its next await.
    """

    def __init__(self, func: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        self._func = func
        self._kwargs = kwargs
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False

    def run(self) -> Any:
        """On the command thread: the command's result, or its exception."""
        with asyncio.Runner() as runner:
            return runner.run(self._main())

    async def _main(self) -> Any:
        task = asyncio.current_task()
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._task = task
            cancelled = self._cancelled
        if cancelled:
            raise asyncio.CancelledError
        result = self._func(**self._kwargs)
        return await result if inspect.isawaitable(result) else result

    def cancel(self) -> None:
        """On the reactor: ask the command's task to stop."""
        with self._lock:
            self._cancelled = True
            loop, task = self._loop, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:
                pass  # the loop has closed: the command has returned


def _on_a_thread(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func``, with a coroutine it returns run on the thread's own loop."""

    def call(**kwargs: Any) -> Any:
        result = func(**kwargs)
        if inspect.iscoroutine(result):
            return _OnItsLoop(lambda: result, {}).run()
        return result

    return call


def _start(
    reactor: Any,
    name: str,
    func: Callable[..., Any],
    kwargs: dict[str, Any],
    size: int,
) -> Deferred[Any]:
    """
    The command's outcome as a Deferred.  A plain function, or a coroutine
    function on an asyncio loop of its own, runs on a command thread (it
    may block); a plain function returning a Deferred runs on the reactor.
    Cancelling it cancels a Deferred command or a coroutine's task (a
    thread busy in a blocking call runs on, stuck).
    """
    if inspect.iscoroutinefunction(func):
        runner = _OnItsLoop(func, kwargs)
        return THREADS.call(
            reactor, name, runner.run, {}, size, on_cancel=runner.cancel
        )
    if not runs_on_reactor(func):
        return THREADS.call(
            reactor, name, _on_a_thread(func), kwargs, size
        ).addCallback(_awaited)
    try:
        return _awaited(func(**kwargs))
    except Exception:
        return fail(Failure())


def _awaited(result: Any) -> Deferred[Any]:
    """
    What a command returned, awaited when it is a Deferred, or a coroutine
    returned on the reactor by a function annotated ``-> Deferred``.
    """
    if isinstance(result, Deferred):
        return result
    if inspect.iscoroutine(result):
        return ensureDeferred(result)
    return succeed(result)


HANDLERS = {"list_commands": list_commands, "run_command": run_command}
