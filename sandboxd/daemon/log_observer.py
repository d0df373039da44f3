# -*- test-case-name: tests.test_log_observer,tests.security.test_full_sandbox -*-
"""
The daemon's log observer: the stream or file its log is written to,
behind a filter that keeps a connection flood at the descriptor limit
from filling the log's disk.

At its ``RLIMIT_NOFILE`` the daemon has no descriptor for a new
connection.  Twisted's listening port then accepts it on a descriptor it
keeps in reserve and closes it at once (the client sees its connection
closed, the listener does not spin), and logs three lines for each such
connection: a client retrying in a loop writes them as fast as it can
connect.  :class:`RefusedConnectionFilter` lets those lines through at
most once per :data:`~sandboxd.policy.defaults.CAP_WARNING_INTERVAL_SECONDS`;
the first one let through after that is preceded by the count of those
held back.

Twisted has no public hook on what its port logs (its logger is a private
attribute of ``tcp.Port``), so the filter stands in front of the log's
observer: ``sandboxd serve`` builds it, and under twistd the tap's options
name :func:`twistd_observer` as twistd's ``--logger`` (see
:func:`use_for_twistd`), which writes where ``--logfile`` says, as twistd
itself would.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from twisted.logger import (
    FileLogObserver,
    ILogObserver,
    LogEvent,
    Logger,
    LogLevel,
    formatEvent,
    textFileLogObserver,
)
from twisted.python import usage
from twisted.python.logfile import LogFile
from zope.interface import implementer

from sandboxd.policy import defaults
from sandboxd.policy.defaults import CAP_WARNING_INTERVAL_SECONDS

#: What a Twisted listening port logs for a connection it closes at once at
#: the descriptor limit, and for an accept that failed for want of
#: descriptors or memory system-wide (``twisted.internet.tcp._accept``).
REFUSED_CONNECTION_FORMATS = frozenset(
    {
        "EMFILE encountered; releasing reserved file descriptor.",
        "EMFILE recovery: Closed socket from {address}",
        "Re-reserving EMFILE recovery file descriptor.",
        "Could not accept new connection ({acceptError})",
    }
)


def about_a_refused_connection(event: LogEvent) -> bool:
    """Whether ``event`` is a listening port's line about a refused connection."""
    return event.get("log_format") in REFUSED_CONNECTION_FORMATS and str(
        event.get("log_namespace", "")
    ).startswith("twisted.internet.")


@implementer(ILogObserver)
class RefusedConnectionFilter:
    """
    An observer passing every event on to ``observer``, except that lines
    about refused connections pass at most once per ``every`` seconds
    (see the module docstring).
    """

    def __init__(
        self,
        observer: ILogObserver,
        every: float = CAP_WARNING_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._observer = observer
        self._every = every
        self._clock = clock
        # Observers are called from any thread.
        self._lock = threading.Lock()
        self._last: float | None = None
        self._held = 0

    def __call__(self, event: LogEvent) -> None:
        """Pass ``event`` on, unless it is a refused connection's line held back."""
        if not about_a_refused_connection(event):
            self._observer(event)
            return
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last < self._every:
                self._held += 1
                return
            held, self._held = self._held, 0
            self._last = now
        if held:
            self._observer(
                {
                    "log_format": "HTTP: {held} log line(s) about connections "
                    "closed at once for want of a file descriptor were not "
                    "written (at most one every {every:g} s)",
                    "log_level": LogLevel.warn,
                    "log_namespace": "sandboxd.connections",
                    "log_source": None,
                    "log_time": time.time(),
                    "held": held,
                    "every": self._every,
                }
            )
        self._observer(event)


#: The formats ``--log-format`` takes.
LOG_FORMATS = ("text", "json")


def json_line(event: LogEvent) -> str:
    """
    One event as one line of JSON, as log collectors read a container's
    output: ``time`` (UTC, RFC 3339, milliseconds), ``level``, ``logger``
    (the namespace), ``message``; a failure's traceback as ``error``; an
    audit record (the daemon's log standing in for the audit file) as
    the object ``audit``, not as text.
    """
    when = event.get("log_time") or time.time()
    record: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when))
        + f".{int(when * 1000) % 1000:03d}Z",
        "level": getattr(event.get("log_level"), "name", "info"),
        "logger": event.get("log_namespace") or "",
    }
    audit = event.get("audit_line")
    if isinstance(audit, str):
        record["message"] = "audit"
        try:
            record["audit"] = json.loads(audit)
        except ValueError:
            record["message"] = audit
    else:
        record["message"] = formatEvent(event)
    failure = event.get("log_failure")
    if failure is not None:
        try:
            record["error"] = failure.getTraceback()
        except Exception:
            record["error"] = repr(failure)
    return json.dumps(record, ensure_ascii=False, default=str) + "\n"


class ToDaemonLog(logging.Handler):
    """
    What sandboxd's modules log through :mod:`logging` (the ``/v1`` door's
    kept state, its webhooks), as events of the daemon's own log: without
    it those lines reach stderr through :mod:`logging`'s last resort, and
    a daemon's log shows them as ``[stderr#error]``, with no namespace,
    level or JSON shape.
    """

    _LEVELS = (
        (logging.CRITICAL, LogLevel.critical),
        (logging.ERROR, LogLevel.error),
        (logging.WARNING, LogLevel.warn),
        (logging.INFO, LogLevel.info),
    )

    def emit(self, record: logging.LogRecord) -> None:
        """Pass ``record`` on as a :class:`~twisted.logger.Logger` event."""
        level = next(
            (ours for at, ours in self._LEVELS if record.levelno >= at),
            LogLevel.debug,
        )
        Logger(namespace=record.name).emit(level, "{text}", text=self.format(record))


def to_daemon_log() -> None:
    """Send sandboxd's :mod:`logging` lines to the daemon's log (once)."""
    logger = logging.getLogger("sandboxd")
    if not any(isinstance(h, ToDaemonLog) for h in logger.handlers):
        logger.addHandler(ToDaemonLog())


def observer_for(stream: IO[str], log_format: str) -> ILogObserver:
    """
    The daemon's observer writing to ``stream``: text or JSON lines,
    filtered; sandboxd's :mod:`logging` lines go there too.
    """
    to_daemon_log()
    if log_format == "json":
        return RefusedConnectionFilter(FileLogObserver(stream, json_line))
    return RefusedConnectionFilter(textFileLogObserver(stream))


def log_format_of(value: str | None) -> str:
    """
    ``--log-format``, else ``$ABX_SERVER_LOG_FORMAT``, else ``text``.

    :raises usage.UsageError: for a format that is neither.
    """
    chosen = (value or os.environ.get("ABX_SERVER_LOG_FORMAT") or "text").lower()
    if chosen not in LOG_FORMATS:
        raise usage.UsageError(
            f"--log-format: {chosen!r} is not one of {', '.join(LOG_FORMATS)}"
        )
    return chosen


#: How twistd was asked to log (``--logfile``, ``--nodaemon``), for
#: :func:`twistd_observer`, which twistd calls without arguments.
_TWISTD: dict[str, Any] = {}


def use_for_twistd(options: usage.Options) -> None:
    """
    Have twistd write the log through :func:`twistd_observer`, unless its
    own options chose a logger or syslog.

    Called from the tap's ``postOptions``: twistd's options are parsed by
    then, and resolve ``--logger`` only after the subcommand's.
    """
    parent: Any = getattr(options, "parent", None)
    if parent is None or parent.get("logger") or parent.get("syslog"):
        return
    _TWISTD["logfile"] = parent.get("logfile") or ""
    _TWISTD["nodaemon"] = bool(parent.get("nodaemon"))
    _TWISTD["format"] = options.get("log-format") or "text"
    parent["logger"] = f"{__name__}.twistd_observer"


def twistd_log_file(options: usage.Options) -> str | None:
    """
    The file twistd will log to, absolute (twistd may chdir later), as
    :func:`twistd_observer` chooses it; None for stdout, syslog or a
    logger of the operator's.  Call it before :func:`use_for_twistd`.
    """
    parent: Any = getattr(options, "parent", None)
    if parent is None or parent.get("logger") or parent.get("syslog"):
        return None
    name = parent.get("logfile") or ""
    if name == "-" or (parent.get("nodaemon") and not name):
        return None
    return os.path.abspath(name or "twistd.log")


def twistd_observer() -> ILogObserver:
    """
    The observer twistd would make from ``--logfile`` (stdout for ``-``
    or in the foreground without one, else the file, rotated by size and
    on ``SIGUSR1``, the newest rotations kept), behind
    :class:`RefusedConnectionFilter`.
    """
    name = _TWISTD.get("logfile", "")
    nodaemon = _TWISTD.get("nodaemon", False)
    log_format = _TWISTD.get("format", "text")
    if name == "-" and not nodaemon:
        sys.exit("Daemons cannot log to stdout, exiting!")
    if name == "-" or (nodaemon and not name):
        return observer_for(sys.stdout, log_format)
    # twistd's own default keeps every rotated file: a daemon that runs for
    # weeks would fill its disk with them.
    log_file = LogFile.fromFullPath(
        name or "twistd.log",
        rotateLength=defaults.LOG_ROTATE_BYTES,
        maxRotatedFiles=defaults.LOG_KEEP_FILES,
    )
    if not signal.getsignal(signal.SIGUSR1):

        def rotate(signum: int, frame: Any) -> None:
            from twisted.internet import reactor

            reactor.callFromThread(log_file.rotate)  # type: ignore[attr-defined]

        signal.signal(signal.SIGUSR1, rotate)
    return observer_for(log_file, log_format)
