"""Tests for :mod:`sandboxd.threads`."""

from __future__ import annotations

import threading
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.python.threadpool import ThreadPool
from twisted.trial.unittest import TestCase

from sandboxd.errors import ApiError
from sandboxd.threads import in_pool


class RefusedThread(threading.Thread):
    """A thread the kernel would not start (a process at its pid limit)."""

    def start(self) -> None:
        raise RuntimeError("can't start new thread")


class InPoolTests(TestCase):
    """Work on the reactor's pool, and a refusal when no thread starts."""

    @inlineCallbacks
    def test_the_work_runs_off_the_reactor(self) -> Any:
        """The result comes back; the work ran on another thread."""
        ran_on = yield in_pool(reactor, threading.get_ident)
        self.assertNotEqual(ran_on, threading.get_ident())

    def test_no_thread_is_a_503_and_nothing_runs(self) -> None:
        """
        A pool that cannot start a thread fails the Deferred with a 503
        ``unavailable`` ResourceError that says why and when to retry; the
        work is not run, and the pool works again once threads start.
        """
        pool = ThreadPool(0, 2, "test-refused")
        pool.threadFactory = RefusedThread  # type: ignore[assignment,misc]
        pool.start()
        self.addCleanup(pool.stop)
        ran: list[int] = []

        class Reactor:
            def getThreadPool(self) -> ThreadPool:
                return pool

            def callFromThread(self, f: Any, *args: Any) -> None:
                reactor.callFromThread(f, *args)  # type: ignore[attr-defined]

        error = self.failureResultOf(in_pool(Reactor(), ran.append, 1), ApiError).value
        self.assertEqual(
            (error.status, error.code, error.type),
            (503, "unavailable", "ResourceError"),
        )
        self.assertEqual(error.headers, {"Retry-After": "1"})
        self.assertEqual(
            error.message,
            "cannot start a thread for this call now: Resource temporarily unavailable",
        )
        self.assertEqual(ran, [])
        # The thread that never started is not left for the pool's stop to
        # join (which raises for it, and joins none after it).
        self.assertEqual(pool.threads, [])
        pool.threadFactory = threading.Thread
        return in_pool(Reactor(), ran.append, 2).addCallback(
            lambda _: self.assertEqual(ran, [2])
        )
