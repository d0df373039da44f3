"""
BackgroundWriter: chunks written in order off the reactor thread, the client
paused while too much waits, errors surfacing, and no write after an abort.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import ApiError
from sandboxd.files.background import BackgroundWriter, PauseGate


class ManualPool:
    """A thread pool whose jobs run when the test says so."""

    def __init__(self) -> None:
        self.jobs: list[Any] = []

    def callInThreadWithCallback(self, on_result: Any, f: Any, *args: Any) -> None:
        self.jobs.append((on_result, f, args))

    def run_one(self) -> None:
        on_result, f, args = self.jobs.pop(0)
        try:
            result = f(*args)
        except Exception as e:
            from twisted.python.failure import Failure

            on_result(False, Failure(e))
        else:
            on_result(True, result)


class FakeReactor:
    """callFromThread runs at once; the pool is manual."""

    def __init__(self) -> None:
        self.pool = ManualPool()

    def getThreadPool(self) -> ManualPool:
        return self.pool

    def callFromThread(self, f: Any, *args: Any, **kw: Any) -> None:
        f(*args, **kw)


class BackgroundWriterTests(SynchronousTestCase):
    """What reaches the file, and when the client is paused."""

    def setUp(self) -> None:
        self.reactor = FakeReactor()
        self.written: list[bytes] = []
        self.events: list[str] = []
        self.writer = BackgroundWriter(
            self.reactor,
            self.written.append,
            lambda: self.events.append("pause"),
            lambda: self.events.append("resume"),
            high_water=10,
        )

    def test_order_and_flush(self) -> None:
        """Chunks arrive in order; flush fires once all are written."""
        for chunk in (b"a", b"b", b"c"):
            self.writer.write(chunk)
        done = self.writer.flush()
        self.assertNoResult(done)
        while self.reactor.pool.jobs:
            self.reactor.pool.run_one()
        self.assertEqual(b"".join(self.written), b"abc")
        self.successResultOf(done)

    def test_backpressure(self) -> None:
        """Over the high-water mark the client is paused, and resumed when a batch starts."""
        self.writer.write(b"x" * 4)
        for _ in range(3):
            self.writer.write(b"y" * 4)
        self.assertEqual(self.events, ["pause"])
        self.reactor.pool.run_one()
        self.assertEqual(self.events, ["pause", "resume"])

    def test_error_surfaces(self) -> None:
        """A failed write is raised to the next write and to flush."""

        def boom(chunk: bytes) -> None:
            raise ApiError(507, "full", "OSError", "insufficient_storage")

        writer = BackgroundWriter(self.reactor, boom, lambda: None, lambda: None)
        writer.write(b"a")
        self.reactor.pool.run_one()
        with self.assertRaises(ApiError):
            writer.write(b"b")
        self.failureResultOf(writer.flush(), ApiError)

    def test_abort_waits_for_the_write_in_flight(self) -> None:
        """when_idle runs only once no chunk is being written, and drops the queue."""
        self.writer.write(b"a")
        self.writer.write(b"b")
        aborted: list[bool] = []
        self.writer.when_idle(lambda: aborted.append(True))
        self.assertEqual(aborted, [])
        self.reactor.pool.run_one()
        self.assertEqual(aborted, [True])
        self.assertEqual(self.written, [b"a"])
        self.assertEqual(self.reactor.pool.jobs, [])


class Transport:
    """Counts what the gate does to the socket."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pauseProducing(self) -> None:
        self.calls.append("pause")

    def resumeProducing(self) -> None:
        self.calls.append("resume")


class PauseGateTests(SynchronousTestCase):
    """Two writers share one socket: it reads again only when both have room."""

    def test_resumes_after_the_last_release(self) -> None:
        """Paused once by the first writer, resumed once by the last."""
        transport = Transport()
        gate = PauseGate(transport)
        gate.pause()
        gate.pause()
        gate.resume()
        self.assertEqual(transport.calls, ["pause"])
        gate.resume()
        self.assertEqual(transport.calls, ["pause", "resume"])
