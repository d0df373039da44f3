"""
The browser worker's life as the daemon sees it, with a stand-in worker
(no Playwright, no Chromium): what a start that never finishes leaves.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater

from sandboxd.browser import supervisor
from sandboxd.policy import defaults
from tests.helpers import DaemonTestCase, alive

#: A worker that never says it is ready and ignores TERM (a Chromium busy
#: starting on a loaded machine answers TERM late, if at all).
DEAF_WORKER = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open({pid_file!r}, "w") as f:
    f.write(str(os.getpid()))
time.sleep(600)
"""


class StartTimeoutTests(DaemonTestCase):
    """A worker whose start ran past its time, then the daemon stopped."""

    timeout = 60
    policy = {"groups": {"browser": True}}

    def setUp(self) -> Any:
        script = os.path.abspath(self.mktemp())
        self.pid_file = script + ".pid"
        with open(script, "w") as f:
            f.write(DEAF_WORKER.format(pid_file=self.pid_file))
        self.patch(supervisor, "WORKER_SCRIPT", script)
        self.patch(supervisor, "playwright_installed", lambda: True)
        self.patch(defaults, "BROWSER_START_TIMEOUT_SECONDS", 0.5)
        return super().setUp()

    @inlineCallbacks
    def test_stop_ends_a_worker_that_never_started(self) -> Any:
        """
        The call fails 500 naming the start's time; the daemon's stop then
        ends the worker it had told to go (no process left, no KILL timer
        left for a reactor that is gone).
        """
        reply = yield self.request("POST", "/browser/evaluate", {"script": "1"})
        self.assertEqual(reply.status, 500, reply.body)
        self.assertIn("did not start within 0.5 s", reply.json()["error"])
        for _ in range(100):
            if os.path.exists(self.pid_file) and os.path.getsize(self.pid_file):
                break
            yield deferLater(reactor, 0.05, lambda: None)
        with open(self.pid_file) as f:
            pid = int(f.read())
        self.assertTrue(alive(pid), "the worker ignores TERM: it should still run")
        yield self.daemon.stop()
        self.assertFalse(alive(pid))
