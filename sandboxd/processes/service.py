# -*- test-case-name: tests.processes.test_children -*-
"""
Background processes (SPEC §7.4): :class:`ProcessService` is the table of
managed processes, each a :class:`~sandboxd.processes.managed.Managed`;
stopping the service ends every child's tree.

The service exists from the start (the daemon becomes the subreaper of its
children then); the children's machinery (:mod:`~sandboxd.processes.child`,
:mod:`~sandboxd.processes.run`) is imported when the first process starts,
or at stop.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from sandboxd.errors import Code, limit_exceeded, limit_rule
from sandboxd.eventlog import forget_closed
from sandboxd.policy.confinement import Confinement
from sandboxd.policy.defaults import (
    KILL_GRACE_SECONDS,
    PROCESS_HISTORY,
    PROCESS_HISTORY_BYTES,
    identity_cap,
)
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes import reaping
from sandboxd.processes.command import RunAs
from sandboxd.processes.table import ChildTable
from sandboxd.processes.tree import (
    OrphanReaper,
    become_subreaper,
    reap_orphans,
)

if TYPE_CHECKING:
    from sandboxd.processes.managed import Managed

# --------------------------------------------------------------------------
# Background processes

log = Logger(namespace="sandboxd.processes")


class ProcessService(Service):
    """
    The daemon's table of background processes and the keeper of every
    child's tree.

    Running processes are capped by the caller (``max_processes``); exited
    ones stay listed, the :data:`PROCESS_HISTORY` most recent whose output
    logs hold :data:`PROCESS_HISTORY_BYTES` together.  Stopping
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
        self.starting: list[Managed] = []
        self.reaper = OrphanReaper(reactor)
        self.subreaper = False

    def startService(self) -> None:
        """
        Become the subreaper of every descendant and reap orphans; reap
        each child that exits without asking every other one
        (:mod:`~sandboxd.processes.reaping`).
        """
        super().startService()  # type: ignore[no-untyped-call]
        reaping.install()
        self.subreaper = become_subreaper()
        if self.subreaper or os.getpid() == 1:
            self.reaper.start()

    def stopService(self) -> Deferred[Any]:
        """End every child's tree and adopted orphan; bounded by the grace."""
        from sandboxd.processes.run import end_all

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
        return len(self.starting) + sum(1 for m in self.table.values() if m.running)

    def check_room(
        self, rule: EffectiveRule, owner: str | None = None, identities: int = 1
    ) -> None:
        """
        Refuse a new background process at ``rule``'s ``max_processes``
        running ones (SPEC §11.4), or at ``owner``'s share of them
        (``max_per_identity``, by default half when ``identities`` > 1), before
        anything is started: background processes have no idle timeout, so
        one identity holding them all would lock the others out until
        someone signals them.

        :param owner: who starts it (None: the daemon's own, e.g. an agent's
            install, bound by the cap alone).
        :raises ApiError: 429 ``too_many_processes``.
        """
        limit = rule.limits.max_processes
        if limit is None:
            return
        if self.running_count() >= limit:
            raise limit_exceeded(
                429,
                f"too many processes running (at most {limit})",
                Code.TOO_MANY_PROCESSES,
                rule=limit_rule(rule, "max_processes"),
                limit="max_processes",
            )
        if owner is None:
            return
        mine = identity_cap(limit, identities, rule.limits.max_per_identity)
        held = sum(1 for m in self.starting if m.owner == owner) + sum(
            1 for m in self.table.values() if m.running and m.owner == owner
        )
        if held >= mine:
            raise limit_exceeded(
                429,
                f"you have {held} processes running, your share of {limit} "
                "(max_per_identity); end one first",
                Code.TOO_MANY_PROCESSES,
                rule=limit_rule(rule, "max_per_identity"),
                limit="max_per_identity",
            )

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
        confine: Confinement | None = None,
        owner: str | None = None,
    ) -> Managed:
        """
        Start a background process and record it.

        :param owner: the identity whose share it counts against (None: the
            daemon's own).

        With ``may_wait`` (see :func:`spawn`) the spawn may still be on a
        worker thread on return: the process is recorded once it runs, and
        ``managed.child.when_spawned()`` says when (or why not).

        :raises FileNotFoundError: no such executable.
        """
        from sandboxd.processes.child import Child
        from sandboxd.processes.managed import Managed
        from sandboxd.processes.run import spawn

        holder: list[Managed] = []

        def on_output(fd: int, data: bytes) -> None:
            holder[0].on_output(fd, data)

        child = Child(
            self.reactor,
            on_output,
            timeout=timeout,
            idle_timeout=idle_timeout,
            claims_escapees=True,
        )
        managed = Managed(child, command, tag, retention)
        managed.owner = owner
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
            confine=confine,
        )
        if not child.pending:
            self._record(managed)
            return managed
        self.starting.append(managed)

        def spawned(_: object) -> None:
            self.starting.remove(managed)
            self._record(managed)

        def not_spawned(_: Failure) -> None:
            # Whoever started it hears why through its own when_spawned().
            self.starting.remove(managed)

        child.when_spawned().addCallbacks(spawned, not_spawned)
        return managed

    def _record(self, managed: Managed) -> None:
        child = managed.child
        self.table.pop(child.pid, None)  # a pid reused after an old entry exited
        self.table[child.pid] = managed
        child.ended.addCallback(managed.on_ended)
        # Once its log is closed: what it weighs is known.
        child.ended.addCallback(lambda _: self._prune())

    def _prune(self) -> None:
        exited = {pid: m for pid, m in self.table.items() if not m.running}
        forget_closed(
            exited,
            lambda m: m.log,
            self.table.pop,
            PROCESS_HISTORY,
            PROCESS_HISTORY_BYTES,
        )

    def get(self, pid: int) -> Managed | None:
        """A managed process by pid."""
        return self.table.get(pid)

    def list(self, tag: str | None = None) -> list[Managed]:
        """Managed processes, oldest first, optionally with one tag."""
        return [m for m in self.table.values() if tag is None or m.tag == tag]
