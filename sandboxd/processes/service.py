# -*- test-case-name: tests.processes.test_children -*-
"""
Background processes (SPEC §7.4): :class:`ProcessService` is the table of
managed processes, each a :class:`Managed` with an
:class:`~sandboxd.eventlog.EventLog` of its output; stopping the service
ends every child's tree.
"""

from __future__ import annotations

import codecs
import os
import time
from collections import OrderedDict
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from sandboxd.eventlog import EventLog
from sandboxd.policy.defaults import (
    EVENT_OVERHEAD_BYTES,
    KILL_GRACE_SECONDS,
    PROCESS_HISTORY,
)
from sandboxd.processes.child import STREAM_NAMES, Child, timeout_error
from sandboxd.processes.command import RunAs
from sandboxd.processes.run import end_all, spawn
from sandboxd.processes.table import ChildTable
from sandboxd.processes.tree import (
    OrphanReaper,
    become_subreaper,
    reap_orphans,
)

# --------------------------------------------------------------------------
# Background processes

log = Logger(namespace="sandboxd.processes")


class Managed:
    """
    One background process: its child, its label, and its output log.

    Output is recorded as it is read, one event per read (``stdout`` or
    ``stderr``, ``{"data": text}``), then ``error`` (timeouts) and ``exit``.
    """

    def __init__(
        self, child: Child, command: str, tag: str | None, retention: int
    ) -> None:
        self.child = child
        self.command = command
        self.tag = tag
        self.log = EventLog(retention)
        self.output_bytes = 0
        self.ended_at: float | None = None
        self._decoders = {
            fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in STREAM_NAMES
        }

    @property
    def pid(self) -> int:
        """The leader's pid."""
        return self.child.pid

    @property
    def running(self) -> bool:
        """Whether the command has not exited yet."""
        return not self.child.has_exited

    def on_output(self, fd: int, data: bytes) -> None:
        """Record one read."""
        decoder = self._decoders.get(fd)
        if decoder is None:
            return
        self.output_bytes += len(data)
        text = decoder.decode(data)
        if text:
            self.log.append(
                STREAM_NAMES[fd], {"data": text}, len(data) + EVENT_OVERHEAD_BYTES
            )

    def on_ended(self, code: int | None) -> None:
        """Pipes closed: flush decoders, then ``error`` and ``exit``; close the log."""
        self.ended_at = time.time()
        for fd, decoder in self._decoders.items():
            text = decoder.decode(b"", final=True)
            if text:
                self.log.append(
                    STREAM_NAMES[fd], {"data": text}, len(text) + EVENT_OVERHEAD_BYTES
                )
        error = timeout_error(self.child)
        if error is not None:
            self.log.append("error", error.body())
        self.log.append("exit", {"exit_code": code})
        self.log.close()

    def dropped_bytes(self) -> int:
        """Output bytes no longer kept."""
        _, events = self.log.since(0)
        kept = sum(
            e.size - EVENT_OVERHEAD_BYTES
            for e in events
            if e.event in ("stdout", "stderr")
        )
        return max(0, self.output_bytes - kept)

    def describe(self) -> dict[str, Any]:
        """The fields of process_list / process_get."""
        return {
            "pid": self.pid,
            "command": self.command,
            "tag": self.tag,
            "state": "running" if self.running else "exited",
            "started_at": self.child.started_at,
            "exit_code": None if self.running else self.child.exit_code,
            "stdin": self.child.stdin_open,
        }


class ProcessService(Service):
    """
    The daemon's table of background processes and the keeper of every
    child's tree.

    Running processes are capped by the caller (``max_processes``); exited
    ones stay listed, the :data:`PROCESS_HISTORY` most recent.  Stopping
    the service ends every live child's tree (background, shell, code runs)
    and every adopted orphan, within the kill grace.
    """

    name = "processes"

    def __init__(
        self,
        reactor: Any,
        children: ChildTable,
        grace: float = KILL_GRACE_SECONDS,
    ) -> None:
        self.reactor = reactor
        self.children = children
        self.grace = grace
        self.table: OrderedDict[int, Managed] = OrderedDict()
        #: Started, with the spawn still on a worker thread (not in the table yet).
        self.starting = 0
        self.reaper = OrphanReaper(reactor)
        self.subreaper = False

    def startService(self) -> None:
        """Become the subreaper of every descendant and reap orphans."""
        super().startService()  # type: ignore[no-untyped-call]
        self.subreaper = become_subreaper()
        if self.subreaper or os.getpid() == 1:
            self.reaper.start()

    def stopService(self) -> Deferred[Any]:
        """End every child's tree and adopted orphan; bounded by the grace."""
        super().stopService()  # type: ignore[no-untyped-call]
        self.reaper.stop()
        d = end_all(self.reactor, self.children, self.grace)
        d.addTimeout(self.grace + 2.0, self.reactor)
        d.addErrback(
            lambda f: log.warn("sandboxd: children still ending at shutdown: {f}", f=f)
        )
        d.addBoth(lambda _: reap_orphans() and None)
        return d

    def running_count(self) -> int:
        """Background processes not yet exited (or still being spawned)."""
        return self.starting + sum(1 for m in self.table.values() if m.running)

    def start(
        self,
        argv: list[str],
        *,
        command: str,
        env: dict[str, str],
        cwd: str,
        run_as: RunAs | None,
        stdin_pipe: bool,
        tag: str | None,
        retention: int,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        may_wait: bool = False,
    ) -> Managed:
        """
        Start a background process and record it.

        With ``may_wait`` (see :func:`spawn`) the spawn may still be on a
        worker thread on return: the process is recorded once it runs, and
        ``managed.child.when_spawned()`` says when (or why not).

        :raises FileNotFoundError: no such executable.
        """
        holder: list[Managed] = []

        def on_output(fd: int, data: bytes) -> None:
            holder[0].on_output(fd, data)

        child = Child(
            self.reactor, on_output, timeout=timeout, idle_timeout=idle_timeout
        )
        managed = Managed(child, command, tag, retention)
        holder.append(managed)
        spawn(
            self.reactor,
            child,
            argv,
            children=self.children,
            env=env,
            cwd=cwd,
            run_as=run_as,
            stdin_pipe=stdin_pipe,
            may_wait=may_wait,
        )
        if not child.pending:
            self._record(managed)
            return managed
        self.starting += 1

        def spawned(_: object) -> None:
            self.starting -= 1
            self._record(managed)

        def not_spawned(_: Failure) -> None:
            # Whoever started it hears why through its own when_spawned().
            self.starting -= 1

        child.when_spawned().addCallbacks(spawned, not_spawned)
        return managed

    def _record(self, managed: Managed) -> None:
        child = managed.child
        self.table.pop(child.pid, None)  # a pid reused after an old entry exited
        self.table[child.pid] = managed
        child.ended.addCallback(managed.on_ended)
        child.exited.addCallback(lambda _: self._prune())

    def _prune(self) -> None:
        exited = [pid for pid, m in self.table.items() if not m.running]
        for pid in exited[: max(0, len(exited) - PROCESS_HISTORY)]:
            del self.table[pid]

    def get(self, pid: int) -> Managed | None:
        """A managed process by pid."""
        return self.table.get(pid)

    def list(self, tag: str | None = None) -> list[Managed]:
        """Managed processes, oldest first, optionally with one tag."""
        return [m for m in self.table.values() if tag is None or m.tag == tag]
