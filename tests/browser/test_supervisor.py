"""
The browser worker's life as the daemon sees it, with stand-ins (a worker
that never says ready; the real worker with a Chromium that never
answers): what a start that never finishes answers, and leaves.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater

from sandboxd.browser import supervisor
from sandboxd.policy import defaults
from sandboxd.processes.tree import descendants
from tests.helpers import DaemonTestCase, alive

#: A worker that never says it is ready and ignores TERM (a Chromium busy
#: starting on a loaded machine answers TERM late, if at all).
DEAF_WORKER = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open({pid_file!r}, "w") as f:
    f.write(str(os.getpid()) + " " + os.environ["TMPDIR"])
time.sleep(600)
"""


class StartTimeoutTests(DaemonTestCase):
    """A worker whose start ran past its time, then the daemon stopped."""

    timeout = 60
    policy = {
        "groups": {"browser": True},
        "endpoints": {"group:browser": {"limits": {"start_timeout_seconds": 0.5}}},
    }

    def setUp(self) -> Any:
        script = os.path.abspath(self.mktemp())
        self.pid_file = script + ".pid"
        with open(script, "w") as f:
            f.write(DEAF_WORKER.format(pid_file=self.pid_file))
        self.patch(supervisor, "WORKER_SCRIPT", script)
        self.patch(supervisor, "playwright_installed", lambda: True)
        return super().setUp()

    @inlineCallbacks
    def test_stop_ends_a_worker_that_never_started(self) -> Any:
        """
        The call fails 503 ``unavailable`` naming the policy's start time;
        the daemon's stop then ends the worker it had told to go (no
        process left, no KILL timer left for a reactor that is gone) and
        removes the directory it gave the worker.
        """
        reply = yield self.request("POST", "/browser/evaluate", {"script": "1"})
        self.assertEqual(reply.status, 503, reply.body)
        self.assertEqual(reply.json()["code"], "unavailable")
        self.assertIn("did not start within 0.5 s", reply.json()["error"])
        for _ in range(100):
            if os.path.exists(self.pid_file) and os.path.getsize(self.pid_file):
                break
            yield deferLater(reactor, 0.05, lambda: None)
        with open(self.pid_file) as f:
            pid_text, workdir = f.read().split(" ", 1)
        pid = int(pid_text)
        self.assertTrue(alive(pid), "the worker ignores TERM: it should still run")
        self.assertTrue(os.path.isdir(workdir), workdir)
        yield self.daemon.stop()
        self.assertFalse(alive(pid))
        self.assertFalse(os.path.exists(workdir), "the worker's directory is left")


#: A Chromium that starts and never answers Playwright (a machine too
#: loaded to start one in time looks the same to the daemon).
SLOW_CHROMIUM = """#!/bin/sh
exec sleep 600
"""

#: The start time the slow-Chromium cases give the browser: long enough
#: for the worker to start Playwright and reach Chromium on a busy machine,
#: so that it is Chromium the start waits for when it runs out (beside the
#: whole suite on two loaded cores Playwright alone has taken over 10 s:
#: then the time runs out first, which answers and leaves the same).
SLOW_START_SECONDS = 15

#: The start time the other doors' slow-Chromium cases give the browser.
#: They pin what their door answers for a start past its time, and that
#: nothing of the browser is left: the same whether the time runs out
#: while the worker starts Playwright or while it waits for Chromium (the
#: case of this module waits for Chromium), so they need not wait as long.
DOOR_START_SECONDS = 3


def slow_start_policy(seconds: float) -> dict[str, Any]:
    """The browser group on, a browser start given ``seconds``."""
    return {
        "groups": {"browser": True},
        "endpoints": {"group:browser": {"limits": {"start_timeout_seconds": seconds}}},
    }


class SlowChromium:
    """
    The real worker (Playwright) pointed at a Chromium that never answers,
    for a daemon test case ``case``; what it left running afterwards.
    """

    #: Why a case of this worker skips here (``None``: it runs).  Other
    #: modules read it from here, not from :class:`SlowChromiumTests`: a
    #: test case imported into a module is collected and run there again.
    skip = (
        None
        if supervisor.playwright_installed()
        else "Playwright is not installed (pip install 'sandboxd[browser]')"
    )

    #: The policy that turns the browser group on with the short start time.
    policy = slow_start_policy(SLOW_START_SECONDS)
    #: The same for the other doors' cases.
    door_policy = slow_start_policy(DOOR_START_SECONDS)

    def __init__(self, case: Any) -> None:
        path = os.path.abspath(case.mktemp())
        with open(path, "w") as f:
            f.write(SLOW_CHROMIUM)
        os.chmod(path, 0o755)
        case.patch(supervisor, "chromium_path", lambda: path)
        self.workers: list[supervisor.WorkerProtocol] = []
        spawn = supervisor.spawn_session

        def spawn_and_keep(
            reactor: Any, protocol: supervisor.WorkerProtocol, *args: Any
        ) -> Any:
            self.workers.append(protocol)
            return spawn(reactor, protocol, *args)

        case.patch(supervisor, "spawn_session", spawn_and_keep)

    @inlineCallbacks
    def left_running(self) -> Any:
        """
        The live processes of every worker's tree (Chromium's included),
        polled until none or the kill's grace and a margin have passed.
        """
        deadline = reactor.seconds() + defaults.KILL_GRACE_SECONDS + 5
        while True:
            left = [
                pid
                for worker in self.workers
                if worker.pid is not None
                for pid in [worker.pid, *descendants(worker.pid, worker.marker)]
                if alive(pid)
            ]
            if not left or reactor.seconds() > deadline:
                return left
            yield deferLater(reactor, 0.1, lambda: None)


class SlowChromiumTests(DaemonTestCase):
    """A Chromium that does not start within the policy's start time."""

    timeout = 60
    skip = SlowChromium.skip
    policy = SlowChromium.policy

    def setUp(self) -> Any:
        self.chromium = SlowChromium(self)
        return super().setUp()

    @inlineCallbacks
    def test_start_past_its_time_is_unavailable(self) -> Any:
        """
        The call answers 503 ``unavailable`` naming the time and the
        policy's key, and nothing of the browser (worker, driver, Chromium)
        is left running.
        """
        reply = yield self.request("POST", "/browser/evaluate", {"script": "1"})
        self.assertEqual(reply.status, 503, reply.body)
        body = reply.json()
        self.assertEqual(body["code"], "unavailable")
        self.assertEqual(body["type"], "RuntimeError")
        self.assertIn(f"did not start within {SLOW_START_SECONDS} s", body["error"])
        self.assertIn("start_timeout_seconds", body["error"])
        left = yield self.chromium.left_running()
        self.assertEqual(left, [])


class QueueTests(DaemonTestCase):
    """Calls past the queue for the one shared page."""

    policy = {"groups": {"browser": True}}

    @inlineCallbacks
    def test_full_queue_code_is_documented(self) -> Any:
        """
        A call with the queue full is 429 ``concurrency_limited`` at once
        (no worker starts), the code every browser endpoint documents.
        """
        from sandboxd.api.schema import schema_for

        self.patch(supervisor, "playwright_installed", lambda: True)
        self.patch(defaults, "BROWSER_QUEUE_MAX", 0)
        reply = yield self.request("GET", "/browser/content")
        self.assertEqual(reply.status, 429, reply.body)
        self.assertEqual(reply.json()["code"], "concurrency_limited")
        self.assertEqual(self.daemon.context.browser.starts, 0)
        for endpoint in ("browser_navigate", "browser_content", "browser_console"):
            codes = {e.code for e in schema_for(endpoint).errors if e.status == 429}
            self.assertEqual(codes, {"concurrency_limited"}, endpoint)


#: A worker that starts at once, answers every call, and ends when its
#: stdin closes (as the real one closes Chromium then).
QUICK_WORKER = """
import json, os, sys
with open({pid_file!r}, "a") as f:
    f.write(str(os.getpid()) + "\\n")
print(json.dumps({{"event": "ready"}}), flush=True)
for line in sys.stdin:
    message = json.loads(line)
    if "id" in message:
        answer = {{"id": message["id"], "ok": True, "result": {{"result": 2}}}}
        print(json.dumps(answer), flush=True)
"""


class IdleTests(DaemonTestCase):
    """The browser closes once no call came for its idle timeout."""

    timeout = 60
    policy = {
        "groups": {"browser": True},
        "endpoints": {"group:browser": {"limits": {"idle_timeout_seconds": 0.5}}},
    }

    def setUp(self) -> Any:
        script = os.path.abspath(self.mktemp())
        self.pid_file = script + ".pid"
        with open(script, "w") as f:
            f.write(QUICK_WORKER.format(pid_file=self.pid_file))
        self.patch(supervisor, "WORKER_SCRIPT", script)
        self.patch(supervisor, "playwright_installed", lambda: True)
        return super().setUp()

    def pids(self) -> list[int]:
        with open(self.pid_file) as f:
            return [int(line) for line in f.read().split()]

    @inlineCallbacks
    def test_idle_browser_closes_and_starts_again(self) -> Any:
        """
        Past idle_timeout_seconds without a call the worker's tree is gone;
        the next call starts a new one and answers as before.
        """
        reply = yield self.request("POST", "/browser/evaluate", {"script": "1+1"})
        self.assertEqual(reply.status, 200, reply.body)
        [first] = self.pids()
        self.assertTrue(alive(first))
        for _ in range(100):
            if not alive(first):
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertFalse(alive(first), "the idle browser is still running")
        reply = yield self.request("POST", "/browser/evaluate", {"script": "1+1"})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(len(self.pids()), 2)
