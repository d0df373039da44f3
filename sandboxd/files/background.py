# -*- test-case-name: tests.files.test_background -*-
"""
Writing a streamed upload off the reactor thread, in order, with
backpressure.

A raw upload arrives in 64 KiB pieces; hashing (SHA-256) and writing each
on the reactor thread caps the route at well under a gigabyte a second and
stalls every other request meanwhile.  :class:`BackgroundWriter` hands the
pieces to the thread pool in batches, one batch in flight at a time (so the
file is written in order), and pauses the client's socket while more than
:data:`~sandboxd.policy.defaults.UPLOAD_QUEUE_BYTES` wait.  Both hashlib and
``os.write`` release the GIL on large buffers, so the work overlaps with
reading the socket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, FirstError, fail, gatherResults, succeed
from twisted.python.failure import Failure

from sandboxd.policy.defaults import UPLOAD_QUEUE_BYTES
from sandboxd.threads import in_pool


class BackgroundWriter:
    """
    Feeds chunks to ``work(chunk)`` in a worker thread, in order.

    :param work: called in a pool thread for each chunk, in arrival order.
    :param pause: stop reading from the client (called on the reactor).
    :param resume: start again.
    """

    def __init__(
        self,
        reactor: Any,
        work: Callable[[bytes], None],
        pause: Callable[[], None],
        resume: Callable[[], None],
        high_water: int = UPLOAD_QUEUE_BYTES,
    ) -> None:
        self._reactor = reactor
        self._work = work
        self._pause = pause
        self._resume = resume
        self._high = high_water
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._busy = False
        self._paused = False
        self._error: Failure | None = None
        self._waiters: list[Deferred[None]] = []
        self._on_idle: Callable[[], None] | None = None

    def write(self, data: bytes) -> None:
        """Queue one chunk; raises the error of an earlier failed write."""
        if self._error is not None:
            self._error.raiseException()
        self._pending.append(data)
        self._pending_bytes += len(data)
        if not self._busy:
            self._next()
        elif self._pending_bytes > self._high and not self._paused:
            self._paused = True
            self._pause()

    def _next(self) -> None:
        batch, self._pending, self._pending_bytes = self._pending, [], 0
        self._busy = True
        if self._paused:
            self._paused = False
            self._resume()
        d = in_pool(self._reactor, self._run, batch)
        d.addCallbacks(self._done, self._failed)

    def _run(self, batch: list[bytes]) -> None:
        for chunk in batch:
            self._work(chunk)

    def _done(self, _: object) -> None:
        self._busy = False
        if self._pending and self._error is None:
            self._next()
        else:
            self._settle()

    def _failed(self, failure: Failure) -> None:
        self._busy = False
        self._error = failure
        self._pending, self._pending_bytes = [], 0
        if self._paused:
            self._paused = False
            self._resume()
        self._settle()

    def _settle(self) -> None:
        if self._busy:
            return
        if self._on_idle is not None:
            on_idle, self._on_idle = self._on_idle, None
            on_idle()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if self._error is not None:
                waiter.errback(self._error)
            else:
                waiter.callback(None)

    def flush(self) -> Deferred[None]:
        """Fires once every queued chunk is written (or with the first error)."""
        if self._error is not None:
            return fail(self._error)
        if not self._busy and not self._pending:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiters.append(d)
        return d

    def when_idle(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the reactor once no chunk is being written."""
        self._pending, self._pending_bytes = [], 0
        if self._busy:
            self._on_idle = callback
        else:
            callback()


class PauseGate:
    """
    One socket paused by several :class:`BackgroundWriter` s: it reads
    again only once none of them is over its high water.
    """

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._holds = 0

    def pause(self) -> None:
        """One writer is full."""
        self._holds += 1
        if self._holds == 1 and self._transport is not None:
            self._transport.pauseProducing()

    def resume(self) -> None:
        """That writer has room again."""
        self._holds -= 1
        if self._holds == 0 and self._transport is not None:
            self._transport.resumeProducing()


class HashedWrite:
    """
    A streamed body hashed and written on two pool threads (hashlib and
    ``os.write`` both release the GIL, so the two overlap instead of
    adding up), sharing one :class:`PauseGate` on the client's socket.

    :param write: writes one chunk (``AtomicWrite.write``).
    :param hash: the running hash fed the same chunks, in the same order.
    """

    def __init__(
        self, reactor: Any, transport: Any, write: Callable[[bytes], None], hash: Any
    ) -> None:
        gate = PauseGate(transport)
        self.hash = hash
        self.hashing = BackgroundWriter(reactor, hash.update, gate.pause, gate.resume)
        self.writing = BackgroundWriter(reactor, write, gate.pause, gate.resume)

    def write(self, data: bytes) -> None:
        """Queue one chunk for both threads."""
        self.hashing.write(data)
        self.writing.write(data)

    def flush(self) -> Deferred[None]:
        """Fires once both have caught up (or with the first error)."""
        done = gatherResults(
            [self.hashing.flush(), self.writing.flush()], consumeErrors=True
        )

        def first(failure: Failure) -> Failure:
            error = failure.value
            if isinstance(error, FirstError):
                sub: Failure = error.subFailure
                return sub
            return failure

        return done.addCallbacks(lambda _: None, first)

    def when_idle(self, callback: Callable[[], None]) -> None:
        """Drop what is queued; ``callback`` once no chunk is being written."""
        self.hashing.when_idle(lambda: None)
        self.writing.when_idle(callback)
