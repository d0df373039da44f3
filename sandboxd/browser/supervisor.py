# -*- test-case-name: tests.browser.test_browser -*-
"""
The daemon's side of the browser: it spawns the worker (``worker.py``) as a
child in its own session, speaks JSON lines with it, serialises calls on the
one shared page, watches every call with a timer, and ends the worker's
whole tree (Playwright's driver and Chromium included) when it stops, when
a call overruns, or when the worker misbehaves.  The next call starts a
fresh worker, so a browser crash costs one failed call, never the daemon.

No threads and no asyncio in the daemon: the worker owns both.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sys
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import (
    CancelledError,
    Deferred,
    DeferredLock,
    gatherResults,
)
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger

from sandboxd.errors import (
    ApiError,
    Code,
    exhausted,
    internal,
    limit_exceeded,
    timed_out,
    unavailable,
)
from sandboxd.policy import defaults
from sandboxd.processes.command import RunAs, exit_code
from sandboxd.processes.environment import BOOT_ENVIRON, child_environment
from sandboxd.processes.spawning import spawn_session
from sandboxd.processes.tree import TREE_MARKER, new_marker, signal_tree
from sandboxd.waiters import Waiters

log = Logger(namespace="sandboxd.browser")

#: The seed's message when the optional extra is missing.
PLAYWRIGHT_MISSING = (
    "Playwright is not installed. Install the browser extra (pip install 'sandboxd[browser]') "
    "and Debian's chromium package."
)

#: Where the worker script lives (run by path, so it never imports sandboxd).
WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")

#: The setting naming the Chromium binary, and its default.
CHROMIUM_ENV = "SANDBOXD_CHROMIUM"
DEFAULT_CHROMIUM = "/usr/bin/chromium"


def playwright_installed() -> bool:
    """Whether the worker's interpreter (ours) can import Playwright."""
    return importlib.util.find_spec("playwright") is not None


def chromium_path() -> str:
    """The Chromium binary: ``SANDBOXD_CHROMIUM`` as the daemon started, else Debian's."""
    return BOOT_ENVIRON.get(CHROMIUM_ENV) or DEFAULT_CHROMIUM


class WorkerProtocol(ProcessProtocol):
    """Frames the worker's stdout into JSON lines; keeps its stderr's tail."""

    def __init__(self, supervisor: BrowserSupervisor) -> None:
        self.supervisor = supervisor
        self.buffer = bytearray()
        self.stderr_tail = bytearray()
        self.pid: int | None = None
        #: In the worker's environment (``TREE_MARKER``): Chromium helpers
        #: that left its session are still found and ended with it.
        self.marker = new_marker()
        self.exited = False
        self.ended: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        self.pid = self.transport.pid  # type: ignore[union-attr]

    def outReceived(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 1]
            self.supervisor.line_received(self, line)
        if len(self.buffer) > defaults.BROWSER_MAX_MESSAGE_BYTES:
            self.buffer.clear()
            self.supervisor.protocol_error(
                self, "the browser worker sent a message over the size limit"
            )

    def errReceived(self, data: bytes) -> None:
        self.stderr_tail += data
        excess = len(self.stderr_tail) - defaults.BROWSER_STDERR_TAIL_BYTES
        if excess > 0:
            del self.stderr_tail[:excess]

    def processExited(self, reason: Any) -> None:
        self.exited = True
        self.supervisor.worker_exited(self, exit_code(reason))

    def processEnded(self, reason: Any) -> None:
        self.exited = True
        if self.pid is not None:
            # Chromium's helpers may outlive the worker: sweep its session.
            signal_tree(self.pid, signal.SIGKILL, self.marker)
        if not self.ended.called:
            self.ended.callback(None)

    def tail(self) -> str:
        """The last lines the worker wrote to stderr."""
        return self.stderr_tail.decode("utf-8", "replace").strip()[-1000:]


class BrowserSupervisor(Service):
    """
    The browser service (``context.browser``).

    :param reactor: provides spawnProcess and callLater.
    :param policy_rule: returns an endpoint's merged rule by id (the
        console buffer's size and the user the worker runs as).
    """

    name = "browser"

    def __init__(self, reactor: Any, context: Any = None) -> None:
        self.reactor = reactor
        self.context = context
        self.lock = DeferredLock()
        self.waiting = 0
        self.worker: WorkerProtocol | None = None
        #: Workers told to end (a start that timed out, a stuck call) whose
        #: tree has not ended yet: a stop waits for them too.
        self.dying: set[WorkerProtocol] = set()
        #: Whether the current worker said ready; its waiters until it does.
        self.is_ready = False
        self.ready_waiters: Waiters[None] = Waiters()
        self.pending: dict[int, Deferred[dict[str, Any]]] = {}
        self.next_id = 0
        self.workdir: str | None = None
        self.starts = 0
        #: Closes the worker once no call came for the idle timeout.
        self.idle_timer: Any = None
        #: How many workers were closed for being idle.
        self.idle_closes = 0

    # -- the public call -----------------------------------------------------

    async def call(
        self,
        op: str,
        args: dict[str, Any],
        timeout_ms: int,
        run_as: RunAs | None = None,
        start_timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> dict[str, Any]:
        """
        Run one operation on the shared page; the worker's result.

        :param start_timeout: seconds the worker may take to start, when
            this call starts it (the endpoint's ``start_timeout_seconds``;
            None for the built-in default).
        :param idle_timeout: seconds without a call after this one before
            the browser is closed (the endpoint's ``idle_timeout_seconds``;
            None for the built-in default, 0 never).
        :raises ApiError: 503 when Playwright or Chromium is missing or did
            not start within ``start_timeout``, 429 when too many calls
            wait, 408 when the call overruns, the worker's own error
            otherwise.
        """
        if not playwright_installed():
            raise unavailable(PLAYWRIGHT_MISSING)
        if not self.running:
            raise unavailable("the browser is not running (the daemon is stopping)")
        if self.waiting >= defaults.BROWSER_QUEUE_MAX:
            raise limit_exceeded(
                429,
                "too many browser calls are waiting for the page",
                Code.CONCURRENCY_LIMITED,
                limit=defaults.BROWSER_QUEUE_MAX,
            )
        self._cancel_idle()
        self.waiting += 1
        try:
            await self.lock.acquire()
        finally:
            self.waiting -= 1
        abandoned: Deferred[None] | None = None
        try:
            if start_timeout is None:
                start_timeout = defaults.BROWSER_LIMITS["start_timeout_seconds"]
            worker = await self._ensure_worker(run_as, start_timeout)
            return await self._send(worker, op, args, timeout_ms)
        except Abandoned as e:
            abandoned = e.answered
            raise CancelledError() from None
        finally:
            self._arm_idle(idle_timeout)
            if abandoned is None:
                self.lock.release()
            else:
                # The page is the worker's until it answers the abandoned
                # call: the next call waits for that, its own clock not
                # yet running, rather than time out behind it.
                abandoned.addBoth(lambda _: self.lock.release())

    # -- the worker's life ---------------------------------------------------

    def _cancel_idle(self) -> None:
        if self.idle_timer is not None and self.idle_timer.active():
            self.idle_timer.cancel()
        self.idle_timer = None

    def _arm_idle(self, idle_timeout: float | None) -> None:
        """
        Close the browser once ``idle_timeout`` seconds pass without a
        call: Chromium holds about a gigabyte for a page nobody looks at
        any more (a dev server's page polling a server long gone).
        """
        self._cancel_idle()
        if idle_timeout is None:
            idle_timeout = defaults.BROWSER_LIMITS.get("idle_timeout_seconds")
        if idle_timeout and self.running:
            self.idle_timer = self.reactor.callLater(idle_timeout, self._idle_close)

    def _idle_close(self) -> None:
        """Close an idle worker as a stop would: stdin closed, then TERM, KILL."""
        self.idle_timer = None
        worker = self.worker
        if worker is None or self.waiting or self.lock.locked or self.pending:
            return  # a call came meanwhile: it arms the timer again when done
        self.worker = None
        self.is_ready = False
        self.idle_closes += 1
        log.info(
            "browser: closed after its idle timeout; the next call starts it again"
        )
        try:
            worker.transport.closeStdin()  # type: ignore[union-attr]
        except (ProcessExitedAlready, AttributeError):
            pass
        self.dying.add(worker)
        term = self.reactor.callLater(1.0, lambda: self._kill_idle(worker))
        worker.ended.addBoth(lambda _: term.cancel() if term.active() else None)
        worker.ended.addBoth(lambda _: self.dying.discard(worker))

    def _kill_idle(self, worker: WorkerProtocol) -> None:
        """TERM (then KILL) an idle worker that did not end on its stdin closing."""
        if worker.pid is None or worker.ended.called:
            return
        signal_tree(worker.pid, signal.SIGTERM, worker.marker)

        def kill() -> None:
            if not worker.ended.called and worker.pid is not None:
                signal_tree(worker.pid, signal.SIGKILL, worker.marker)

        timer = self.reactor.callLater(defaults.KILL_GRACE_SECONDS, kill)
        worker.ended.addBoth(lambda _: timer.cancel() if timer.active() else None)

    async def _ensure_worker(
        self, run_as: RunAs | None, start_timeout: float
    ) -> WorkerProtocol:
        if self.worker is None or self.worker.exited:
            self._spawn(run_as)
        worker = self.worker
        assert worker is not None
        if self.is_ready:
            return worker
        waiter = self.ready_waiters.wait()
        timer = self.reactor.callLater(
            start_timeout, self._start_timed_out, worker, start_timeout
        )
        try:
            await waiter
        finally:
            if timer.active():
                timer.cancel()
        return worker

    def _settle_start(self, error: ApiError | None) -> None:
        """The worker is ready (``error`` None) or will never be."""
        self.is_ready = error is None
        if error is None:
            self.ready_waiters.fire(None)
        else:
            self.ready_waiters.fail(error)

    def _start_timed_out(self, worker: WorkerProtocol, seconds: float) -> None:
        # Unavailable, not a failure of the call: the worker is ended and
        # the next call starts a fresh one, which may well be in time.
        if worker is self.worker and not self.is_ready:
            self._settle_start(
                unavailable(
                    f"the browser did not start within {seconds:g} s (the policy's"
                    " limits.start_timeout_seconds); it was stopped, and the next"
                    " call starts it again"
                )
            )
            self._kill(worker)

    def _spawn(self, run_as: RunAs | None) -> None:
        chromium = chromium_path()
        console_max = defaults.ENDPOINT_LIMITS["browser_console"]["max_entries"]
        if self.context is not None:
            console_max = (
                self.context.policy.rule("browser_console").limits.max_entries
                or console_max
            )
        config = {
            "chromium": chromium,
            "console_max": console_max,
            "console_entry_bytes": defaults.BROWSER_CONSOLE_ENTRY_BYTES,
            "console_buffer_bytes": defaults.BROWSER_CONSOLE_BUFFER_BYTES,
            "max_line": defaults.BROWSER_MAX_REQUEST_BYTES,
            # Room for the reply's own fields around its largest value.
            "max_reply": defaults.BROWSER_MAX_MESSAGE_BYTES - 64 * 1024,
            "message_chars": defaults.BROWSER_ERROR_MESSAGE_CHARS,
            "max_values": defaults.BROWSER_RESULT_MAX_VALUES,
            "probe_seconds": defaults.BROWSER_PROBE_SECONDS,
            "close_seconds": defaults.BROWSER_CLOSE_SECONDS,
        }
        if self.workdir is None or not os.path.isdir(self.workdir):
            self.workdir = self.context.scratch.mkdtemp("sandboxd-browser-")
        env = child_environment(self.context, None, base=BOOT_ENVIRON)
        # Playwright's driver and Chromium write caches under HOME and TMPDIR.
        env["TMPDIR"] = self.workdir
        uid = gid = None
        if run_as is not None:
            run_as.apply(env)
            os.chown(self.workdir, run_as.uid, run_as.gid)
            uid, gid = run_as.uid, run_as.gid
        argv = [sys.executable, "-I", "-u", WORKER_SCRIPT, json.dumps(config)]
        worker = WorkerProtocol(self)
        self.worker = worker
        self.is_ready = False
        self.starts += 1
        worker.marker = new_marker(self.context.children.scope)
        env[TREE_MARKER] = worker.marker
        try:
            spawn_session(
                self.reactor, worker, argv[0], argv, env, self.workdir, uid, gid
            )
        except OSError as e:
            self.worker = None
            raise (
                exhausted(e) or internal(f"cannot start the browser worker: {e}")
            ) from None

    def line_received(self, worker: WorkerProtocol, line: bytes) -> None:
        """One JSON line from the worker: an event or a reply."""
        if worker is not self.worker:
            return
        try:
            message = json.loads(line)
        except ValueError:
            log.warn("browser worker: ignoring a line that is not JSON")
            return
        if not isinstance(message, dict):
            return
        event = message.get("event")
        if event == "ready":
            self._settle_start(None)
            return
        if event == "fatal":
            # Playwright or Chromium is missing or broken: say so now; the
            # next call tries again (someone may have installed it since).
            self._settle_start(_api_error(message.get("error") or {}))
            self._kill(worker)
            return
        if message.get("ending"):
            # Chromium is gone, or a stuck page could not be closed: the
            # worker ends after this answer, so the next call must not be
            # sent to it but start a fresh one.
            self._kill(worker)
        rid = message.get("id")
        waiter = self.pending.pop(rid, None) if isinstance(rid, int) else None
        if waiter is None or waiter.called:
            return
        if message.get("ok"):
            result = message.get("result")
            waiter.callback(result if isinstance(result, dict) else {})
        else:
            waiter.errback(_api_error(message.get("error") or {}))

    def protocol_error(self, worker: WorkerProtocol, message: str) -> None:
        """The worker broke the protocol: fail its calls and end it."""
        if worker is self.worker:
            self._fail_pending(internal(message))
            self._kill(worker)

    def worker_exited(self, worker: WorkerProtocol, code: int | None) -> None:
        """The worker ended: fail what waited on it; the next call restarts it."""
        if worker is not self.worker:
            return
        tail = worker.tail()
        detail = f" (exit code {code})" if code is not None else ""
        # Its last line ended by LF: the text may quote a page's URL or
        # title, which can hold U+2028 or NEL.
        last = tail.rsplit("\n", 1)[-1]
        message = f"the browser worker exited{detail}" + (f": {last}" if tail else "")
        self.worker = None
        if not self.is_ready:
            self._settle_start(internal(message))
        self.is_ready = False
        self._fail_pending(internal(message))

    def _fail_pending(self, error: ApiError) -> None:
        pending, self.pending = self.pending, {}
        for waiter in pending.values():
            if not waiter.called:
                waiter.errback(error)

    async def _send(
        self, worker: WorkerProtocol, op: str, args: dict[str, Any], timeout_ms: int
    ) -> dict[str, Any]:
        self.next_id += 1
        rid = self.next_id
        waiter: Deferred[dict[str, Any]] = Deferred()
        self.pending[rid] = waiter
        line = (
            json.dumps(
                {
                    "id": rid,
                    "op": op,
                    "timeout": timeout_ms,
                    **args,
                    "budget": timeout_ms,
                }
            ).encode()
            + b"\n"
        )
        worker.transport.write(line)  # type: ignore[union-attr]
        limit = timeout_ms / 1000.0 + defaults.BROWSER_WATCHDOG_SLACK_SECONDS

        def overrun() -> None:
            # The caller's waiter, or the one of a call its caller left.
            current = self.pending.pop(rid, None)
            if current is None or current.called:
                return
            current.errback(
                timed_out(
                    f"browser {op} did not finish within {limit:g} s; the browser was restarted"
                )
            )
            # A page stuck in a script blocks every later call: start afresh.
            self._kill(worker)

        timer = self.reactor.callLater(limit, overrun)
        try:
            return await waiter
        except CancelledError:
            if worker is not self.worker or worker.exited:
                self.pending.pop(rid, None)
                raise
            # The caller left (a client that disconnected, an MCP cancel):
            # tell the worker to stop, and keep the page until it answers,
            # within the same watchdog, which restarts a worker that does not.
            answered: Deferred[dict[str, Any]] = Deferred()
            self.pending[rid] = answered
            answered.addErrback(lambda _: None)
            answered.addBoth(lambda _: timer.cancel() if timer.active() else None)
            try:
                worker.transport.write(  # type: ignore[union-attr]
                    json.dumps({"op": "cancel", "target": rid}).encode() + b"\n"
                )
            except Exception:
                pass
            raise Abandoned(answered) from None
        finally:
            if timer.active() and rid not in self.pending:
                timer.cancel()

    def _kill(
        self, worker: WorkerProtocol, grace: float = defaults.KILL_GRACE_SECONDS
    ) -> None:
        """TERM the worker's tree, KILL it after ``grace`` if it lingers."""
        if worker is self.worker:
            self.worker = None
            self.is_ready = False
        if worker.pid is None or worker.ended.called:
            return
        signal_tree(worker.pid, signal.SIGTERM, worker.marker)
        self.dying.add(worker)

        def kill() -> None:
            if not worker.ended.called and worker.pid is not None:
                signal_tree(worker.pid, signal.SIGKILL, worker.marker)

        timer = self.reactor.callLater(grace, kill)

        def ended(result: Any) -> Any:
            self.dying.discard(worker)
            if timer.active():
                timer.cancel()
            return result

        worker.ended.addBoth(ended)

    # -- service -------------------------------------------------------------

    def stopService(self) -> Deferred[None]:
        """End the worker's whole tree; fires when it is gone (bounded)."""
        super().stopService()  # type: ignore[no-untyped-call]
        self._cancel_idle()
        worker, self.worker = self.worker, None
        self._settle_start(unavailable("the browser is stopping"))
        self.is_ready = False
        self._fail_pending(unavailable("the browser is stopping"))
        # Workers already told to end have had their TERM: the daemon must
        # not stop while their trees live on (their KILL would never come).
        dying = [w for w in self.dying if not w.ended.called]
        for w in dying:
            self._kill_now(w)
        if worker is None or worker.ended.called:
            gone = self._bounded(gatherResults([w.ended for w in dying]))
            return gone.addCallback(self._remove_workdir)
        done: Deferred[None] = Deferred()
        # Closing stdin lets the worker close Chromium itself; TERM and then
        # KILL follow in case it does not.
        try:
            worker.transport.closeStdin()  # type: ignore[union-attr]
        except (ProcessExitedAlready, AttributeError):
            pass
        term = self.reactor.callLater(1.0, lambda: self._kill(worker, grace=2.0))
        worker.ended.addBoth(lambda _: term.cancel() if term.active() else None)
        worker.ended.addBoth(lambda _: done.callback(None) if not done.called else None)
        gone = self._bounded(gatherResults([done, *(w.ended for w in dying)]))
        return gone.addCallback(self._remove_workdir)

    def _remove_workdir(self, _: None) -> None:
        """
        The directory the workers had for their caches and Chromium's
        profiles, removed once they are gone or the stop's bound has passed:
        every daemon that ever started the browser left one behind in the
        system's temporary directory.
        """
        workdir, self.workdir = self.workdir, None
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    def _kill_now(self, worker: WorkerProtocol) -> None:
        """KILL the tree of a worker that was already TERMed."""
        if worker.pid is not None:
            signal_tree(worker.pid, signal.SIGKILL, worker.marker)

    def _bounded(self, waiting: Deferred[Any]) -> Deferred[None]:
        """``waiting``, but fired after :data:`KILL_GRACE_SECONDS` at the latest."""
        done: Deferred[None] = Deferred()
        waiting.addBoth(lambda _: done.callback(None) if not done.called else None)
        timeout = self.reactor.callLater(
            defaults.KILL_GRACE_SECONDS,
            lambda: done.callback(None) if not done.called else None,
        )
        done.addBoth(lambda r: (timeout.cancel() if timeout.active() else None, r)[1])
        return done


class Abandoned(Exception):
    """
    A call whose caller left while the worker ran it: ``answered`` fires
    once the worker answers it (or ends), when the page is free again.
    """

    def __init__(self, answered: Deferred[Any]) -> None:
        super().__init__()
        self.answered = answered


def _api_error(fields: dict[str, Any]) -> ApiError:
    """An ApiError from the worker's error fields."""
    return ApiError.from_body(fields.get("status"), fields, "browser error")
