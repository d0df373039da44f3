# -*- test-case-name: tests.test_threads -*-
"""
Blocking work on the reactor's thread pool, refused cleanly when the
kernel will not start a thread for it.

Twisted's pool starts a thread when none is idle, and in a container at its
process limit (``pids.max`` counts threads) or its memory limit the kernel
refuses it: ``callInThreadWithCallback`` raises ``RuntimeError`` in the
caller.  Left alone, that reached the doors as an internal error with a
traceback in the log, for a call that would succeed a moment later.
:func:`in_pool` turns it into the 503 every other out-of-room refusal is,
as a failed Deferred, so callers keep one error path.

Twisted's pool also keeps the thread that never started in its list, and
its ``stop`` then raises at that thread's ``join`` (when the reactor shuts
down) before it has joined the threads after it; :func:`in_pool` takes
such a thread out of the list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, fail
from twisted.internet.threads import deferToThreadPool

from sandboxd import errors


def in_pool(
    reactor: Any, f: Callable[..., Any], *args: Any, **kw: Any
) -> Deferred[Any]:
    """
    ``f(*args, **kw)`` on ``reactor``'s thread pool; its result or failure
    on the reactor thread.  When no thread could be started for it, a
    Deferred failed with :func:`sandboxd.errors.no_thread`, ``f`` not run.
    """
    pool = reactor.getThreadPool()
    try:
        return deferToThreadPool(reactor, pool, f, *args, **kw)
    except RuntimeError:
        # The pool raises nothing else of its own: a stopped pool answers
        # AlreadyQuit, not a RuntimeError.  Threads are made on the
        # reactor thread, so none but the refused one is unstarted now.
        pool.threads[:] = [t for t in pool.threads if t.ident is not None]
        return fail(errors.no_thread())
