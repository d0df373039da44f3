"""
``GET /metrics`` (SPEC §20): Prometheus text, what it counts, what its
labels never carry, and that start-up does not load prometheus_client.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase

from tests.helpers import DaemonTestCase
from tests.routes.test_terminal import TerminalCase

TOKEN = "metrics-token-77"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by name and sorted labels."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


class AuditDroppedTests(DaemonTestCase):
    """Audit records the file could not take are counted for an alert."""

    audit = True
    policy = {"defaults": {"audit": "all"}}

    @inlineCallbacks
    def test_dropped_records_counted(self) -> Any:
        """
        With the audit file refusing writes (a full disk), every call
        still answers and ``sandboxd_audit_dropped_total`` counts each
        record dropped; 0 before any was.
        """
        reply = yield self.request("GET", "/metrics")
        found = samples(reply.body.decode())
        self.assertEqual(found[("sandboxd_audit_dropped_total", ())], 0)
        audit = self.daemon.context.audit

        def full(_: str) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        self.patch(audit._file, "write", full)
        for _ in range(3):
            health = yield self.request("GET", "/health")
            self.assertEqual(health.status, 200)
        reply = yield self.request("GET", "/metrics")
        self.flushLoggedErrors()
        found = samples(reply.body.decode())
        # The three calls (this scrape is audited once answered).
        self.assertEqual(found[("sandboxd_audit_dropped_total", ())], 3)


class MetricsTests(TerminalCase):
    """Against a daemon with a token."""

    token = TOKEN
    policy = {"revision": "m-1"}

    @inlineCallbacks
    def scrape(self) -> Any:
        reply = yield self.request("GET", "/metrics")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertTrue(reply.header("content-type").startswith("text/plain"))
        text = reply.body.decode()
        return text, samples(text)

    @inlineCallbacks
    def test_requests_by_endpoint_status_code(self) -> Any:
        """Requests are counted by endpoint id, door, status and code, with latencies."""
        for _ in range(3):
            yield self.request("GET", "/health")
        yield self.request("GET", "/no/such/route")
        yield self.request("GET", "/capabilities", token="wrong")
        _, found = yield self.scrape()
        health = (
            "sandboxd_requests_total",
            (("code", ""), ("door", "http"), ("endpoint", "health"), ("status", "200")),
        )
        self.assertEqual(found[health], 3)
        missing = (
            "sandboxd_requests_total",
            (
                ("code", "not_found"),
                ("door", "http"),
                ("endpoint", "none"),
                ("status", "404"),
            ),
        )
        self.assertEqual(found[missing], 1)
        refused = (
            "sandboxd_requests_total",
            (
                ("code", "unauthorized"),
                ("door", "http"),
                ("endpoint", "capabilities"),
                ("status", "401"),
            ),
        )
        self.assertEqual(found[refused], 1)
        count = (
            "sandboxd_request_duration_seconds_count",
            (("door", "http"), ("endpoint", "health")),
        )
        self.assertEqual(found[count], 3)
        inf = (
            "sandboxd_request_duration_seconds_bucket",
            (("door", "http"), ("endpoint", "health"), ("le", "+Inf")),
        )
        self.assertEqual(found[inf], 3)

    @inlineCallbacks
    def test_gauges_policy_and_timeouts(self) -> Any:
        """Open terminals, policy revision, reloads and timed-out children are reported."""
        created = yield self.create()
        yield self.request("POST", "/shell", {"command": "sleep 5", "timeout": 0.2})
        self.daemon.daemon.reload()
        _, found = yield self.scrape()
        self.assertEqual(found[("sandboxd_pty_sessions_active", ())], 1)
        self.assertEqual(
            found[("sandboxd_policy_info", (("preset", ""), ("revision", "m-1")))], 1
        )
        self.assertGreaterEqual(
            found[("sandboxd_children_timed_out_total", (("reason", "timeout"),))], 1
        )
        self.assertEqual(
            found[("sandboxd_policy_reloads_total", (("result", "ok"),))], 1
        )
        self.assertIn(("sandboxd_connections_active", (("door", "http"),)), found)
        self.assertIn(("sandboxd_streams_active", ()), found)
        self.assertIn(("sandboxd_background_processes_active", ()), found)
        self.assertIn(("sandboxd_agent_sessions_active", ()), found)
        yield self.request("DELETE", f"/pty/sessions/{created['session_id']}")
        _, found = yield self.scrape()
        self.assertEqual(found[("sandboxd_pty_sessions_active", ())], 0)

    @inlineCallbacks
    def test_process_and_build_info(self) -> Any:
        """The daemon's own memory, CPU and descriptors, and its build, are reported."""
        from sandboxd._version import __version__

        _, found = yield self.scrape()
        names = {name for name, _ in found}
        for name in (
            "process_resident_memory_bytes",
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_max_fds",
        ):
            self.assertIn(name, names)
        self.assertGreater(found[("process_resident_memory_bytes", ())], 1_000_000)
        build = [labels for name, labels in found if name == "sandboxd_build_info"]
        self.assertEqual(dict(build[0])["version"], __version__)

    @inlineCallbacks
    def test_no_path_command_or_token_in_labels(self) -> Any:
        """Paths, commands and tokens a client sent never appear in the exposition."""
        os.makedirs(os.path.join(self.base_dir, "zebra-dir"))
        yield self.request("GET", "/files/list?path=zebra-dir")
        yield self.request("POST", "/shell", {"command": "echo okapi-command"})
        yield self.request("GET", "/files/list?path=x", token="giraffe-token")
        text, _ = yield self.scrape()
        for secret in ("zebra", "okapi", "giraffe", TOKEN, "/files"):
            self.assertNotIn(secret, text)


class MetricsScopeTests(DaemonTestCase):
    """/metrics is system:read under the policy."""

    policy = {
        "auth": {
            "tokens": [
                {"id": "reader", "token_env": "M_READER", "scopes": ["files:read"]},
                {"id": "ops", "token_env": "M_OPS", "scopes": ["system:read"]},
            ]
        }
    }
    environ = {"M_READER": "reader-t", "M_OPS": "ops-t"}

    @inlineCallbacks
    def test_scope(self) -> Any:
        """Without system:read it is 403 missing_scope; with it, 200."""
        reply = yield self.request("GET", "/metrics", token="reader-t")
        self.assertEqual((reply.status, reply.json()["code"]), (403, "missing_scope"))
        reply = yield self.request("GET", "/metrics", token="ops-t")
        self.assertEqual(reply.status, 200)


class LazyImportTests(SynchronousTestCase):
    """Start-up does not pay for prometheus_client."""

    def test_not_imported_at_start(self) -> None:
        """Building and starting a daemon leaves prometheus_client unimported."""
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        code = (
            "import sys\n"
            "from twisted.internet.testing import MemoryReactorClock\n"
            "from sandboxd.daemon.server import Settings, build\n"
            f"d = build(Settings(base_dir={base!r}, policy={{}}, environ={{}}),"
            " MemoryReactorClock())\n"
            "d.startService()\n"
            "print('prometheus_client' in sys.modules)\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        self.assertEqual(result.stdout.strip().splitlines()[-1], "False", result.stderr)


class StreamGaugeTests(SynchronousTestCase):
    """The open-streams gauge counts one daemon's streams, and only while open."""

    def test_per_daemon(self) -> None:
        """A stream of one daemon is not counted by another in the same process."""
        from twisted.internet.task import Clock
        from twisted.web.test.requesthelper import DummyRequest

        from sandboxd.access.metrics import _gauges
        from sandboxd.testing import memory_context
        from sandboxd.web.sse import SSEChannel

        def active(context: Any) -> float:
            return next(
                value
                for name, _, value, _ in _gauges(context, 0)
                if name == "sandboxd_streams_active"
            )

        first, second = memory_context(), memory_context()
        channel = SSEChannel(DummyRequest([b""]), Clock(), streams=first.streams)
        self.assertEqual((active(first), active(second)), (1, 0))
        channel.close()
        self.assertEqual(active(first), 0)
