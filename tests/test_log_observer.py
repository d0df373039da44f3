"""
The daemon's log observer (:mod:`sandboxd.daemon.log_observer`): a
listening port's lines about connections refused at the descriptor limit,
at most one per period with the count held back; everything else as is.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from twisted.application import app
from twisted.logger import LogLevel, formatEvent
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.scripts.twistd import ServerOptions
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.daemon import log_observer
from sandboxd.daemon.log_observer import RefusedConnectionFilter
from sandboxd.policy import defaults


def port_line(fmt: str, **fields: Any) -> dict[str, Any]:
    """An event as Twisted's TCP port logs it."""
    return {"log_format": fmt, "log_namespace": "twisted.internet.tcp.Port", **fields}


def refused() -> list[dict[str, Any]]:
    """The three lines Twisted logs for one connection closed at the limit."""
    return [
        port_line("EMFILE encountered; releasing reserved file descriptor."),
        port_line(
            "EMFILE recovery: Closed socket from {address}",
            address=("127.0.0.1", 5),
        ),
        port_line("Re-reserving EMFILE recovery file descriptor."),
    ]


class FilterTests(SynchronousTestCase):
    """:class:`RefusedConnectionFilter` on a clock of the test's."""

    def setUp(self) -> None:
        self.now = 0.0
        self.seen: list[dict[str, Any]] = []
        self.filter = RefusedConnectionFilter(
            self.seen.append, every=30, clock=lambda: self.now
        )

    def test_one_line_per_period_then_the_count(self) -> None:
        """
        500 refused connections in a period write one line; the first line
        of the next period comes after one saying how many were held back.
        """
        for _ in range(500):
            for event in refused():
                self.filter(event)
        self.assertEqual(
            [formatEvent(e) for e in self.seen], [formatEvent(refused()[0])]
        )
        self.now = 31
        for event in refused():
            self.filter(event)
        self.assertEqual(len(self.seen), 3)
        self.assertEqual(
            formatEvent(self.seen[1]),
            "HTTP: 1499 log line(s) about connections closed at once for want "
            "of a file descriptor were not written (at most one every 30 s)",
        )

    def test_other_lines_pass(self) -> None:
        """Every other event passes untouched, in a flood or not."""
        for event in refused():
            self.filter(event)
        other = [
            {"log_format": "sandboxd 0.1.0: http on ...", "log_namespace": "sandboxd"},
            {"log_format": "EMFILE recovery: Closed socket from {address}"},
            {"log_format": "(TCP Port 9000 Closed)", "log_namespace": "twisted"},
        ]
        for event in other:
            self.filter(event)
        self.assertEqual(self.seen[1:], other)


class TwistdTests(SynchronousTestCase):
    """The tap's options hand twistd the filtered observer, unless told otherwise."""

    def setUp(self) -> None:
        self.addCleanup(log_observer._TWISTD.clear)

    def parsed(self, *args: str) -> ServerOptions:
        config = ServerOptions()
        config.parseOptions([*args, "sandboxd", "--base-dir", "/tmp"])
        return config

    def test_logfile_behind_the_filter(self) -> None:
        """``--logfile`` is honoured, through the filter."""
        config = self.parsed("-n", "--logfile=-")
        self.assertIs(config["logger"], log_observer.twistd_observer)
        observer = app.AppLogger(config)._observerFactory()
        self.assertIsInstance(observer, RefusedConnectionFilter)

    def test_operator_logger_kept(self) -> None:
        """A ``--logger`` or ``--syslog`` of the operator's is left alone."""
        config = self.parsed("-n", "--logger=twisted.logger.jsonFileLogObserver")
        self.assertIsNot(config["logger"], log_observer.twistd_observer)
        config = self.parsed("-n", "--syslog")
        self.assertIsNone(config["logger"])


class LogFileTests(SynchronousTestCase):
    """``--logfile FILE``: rotated by size, the newest rotations kept."""

    def test_old_rotations_removed(self) -> None:
        """However much is logged, the file and five rotations are all there is."""
        self.addCleanup(log_observer._TWISTD.clear)
        self.addCleanup(signal.signal, signal.SIGUSR1, signal.getsignal(signal.SIGUSR1))
        self.patch(defaults, "LOG_ROTATE_BYTES", 200)
        folder = self.mktemp()
        os.makedirs(folder)
        log_observer._TWISTD.update(logfile=f"{folder}/sandboxd.log", nodaemon=True)
        observer = log_observer.twistd_observer()
        for n in range(100):
            observer({"log_format": "line {n} " + "x" * 50, "n": n, "log_time": 0.0})
        self.assertEqual(
            sorted(os.listdir(folder)),
            ["sandboxd.log", *(f"sandboxd.log.{i}" for i in range(1, 6))],
        )
        with open(f"{folder}/sandboxd.log") as f:
            self.assertIn("line 99", f.read())


class JsonLinesTests(SynchronousTestCase):
    """``--log-format json``: one JSON object per line."""

    def test_event(self) -> None:
        """Time, level, logger and the formatted message."""
        line = log_observer.json_line(
            {
                "log_format": "sandboxd: policy reloaded (revision {revision})",
                "revision": "r-2",
                "log_level": LogLevel.warn,
                "log_namespace": "sandboxd.daemon.server",
                "log_time": 1764979200.25,
            }
        )
        self.assertTrue(line.endswith("\n"))
        self.assertEqual(line.count("\n"), 1)
        self.assertEqual(
            json.loads(line),
            {
                "time": "2025-12-06T00:00:00.250Z",
                "level": "warn",
                "logger": "sandboxd.daemon.server",
                "message": "sandboxd: policy reloaded (revision r-2)",
            },
        )

    def test_audit_record_is_an_object(self) -> None:
        """An audit line through the log is the record itself, not text."""
        record = {"endpoint": "shell", "status": 403, "path": "/a\nb"}
        line = log_observer.json_line(
            {
                "log_format": "{audit_line}",
                "audit_line": json.dumps(record),
                "log_level": LogLevel.info,
                "log_namespace": "sandboxd.audit",
                "log_time": 0.0,
            }
        )
        found = json.loads(line)
        self.assertEqual((found["message"], found["audit"]), ("audit", record))
        self.assertEqual(line.count("\n"), 1)

    def test_failure(self) -> None:
        """A logged failure's traceback is ``error``, on the same line."""
        failure = Failure(ZeroDivisionError("division by zero"))
        line = log_observer.json_line(
            {
                "log_format": "handler failed",
                "log_failure": failure,
                "log_level": LogLevel.critical,
                "log_namespace": "sandboxd",
                "log_time": 0.0,
            }
        )
        found = json.loads(line)
        self.assertIn("ZeroDivisionError", found["error"])
        self.assertEqual(found["level"], "critical")

    def test_option(self) -> None:
        """``--log-format``, else ``$ABX_SERVER_LOG_FORMAT``; anything else is refused."""
        self.assertEqual(log_observer.log_format_of("JSON"), "json")
        self.assertEqual(log_observer.log_format_of(None), "text")
        os.environ["ABX_SERVER_LOG_FORMAT"] = "json"
        self.addCleanup(os.environ.pop, "ABX_SERVER_LOG_FORMAT")
        self.assertEqual(log_observer.log_format_of(None), "json")
        with self.assertRaises(usage.UsageError):
            log_observer.log_format_of("xml")


class StdlibLoggingTests(SynchronousTestCase):
    """sandboxd's :mod:`logging` lines reach the daemon's log, not stderr."""

    def test_stdlib_warning_is_a_daemon_log_event(self) -> None:
        """
        Once the daemon's observer is made, a warning a sandboxd module
        logs through :mod:`logging` is a warn event of the daemon's log,
        in the module's namespace, with its text.
        """
        import io
        import logging

        from twisted.logger import globalLogPublisher

        log_observer.observer_for(io.StringIO(), "text")
        seen: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(seen.append)
        self.addCleanup(globalLogPublisher.removeObserver, seen.append)
        logging.getLogger("sandboxd.openai_api.store").warning(
            "session %s is too large to keep", "agsess_1"
        )
        [event] = [e for e in seen if e.get("log_namespace", "").startswith("sandboxd")]
        self.assertEqual(event["log_namespace"], "sandboxd.openai_api.store")
        self.assertEqual(event["log_level"], LogLevel.warn)
        self.assertEqual(formatEvent(event), "session agsess_1 is too large to keep")
