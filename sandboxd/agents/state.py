# -*- test-case-name: tests.test_agents -*-
"""
What one agent session knows (SPEC §15.1), and the event log that says so.

:class:`~sandboxd.agents.session.AgentSession` is assembled from one mixin
per concern, each a subclass of :class:`SessionState`: the fields every
part reads and folds into live here, with :meth:`SessionState.emit`, which
stamps each event with its ``seq`` as the line is read, so the log is in
wire order and what ``GET`` routes show always matches the events before
it.  The idle timer is here too: handshakes and turns restart it.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from sandboxd.agents.catalog import CatalogEntry
from sandboxd.agents.jsonrpc import Connection
from sandboxd.agents.permissions import HeldRequest, iso
from sandboxd.agents.process import AgentProcess, HeadTailLog
from sandboxd.errors import ApiError
from sandboxd.eventlog import EventLog, json_size
from sandboxd.policy import defaults
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import RunAs
from sandboxd.waiters import Waiters

if TYPE_CHECKING:
    from sandboxd.agents.manager import AgentManager
    from sandboxd.agents.terminals import AgentTerminal
    from sandboxd.agents.turns import Turn

#: The statuses of a tool call still running.
UNFINISHED = ("pending", "in_progress")


def bounded_put(table: OrderedDict[str, Any], key: str, value: Any) -> None:
    """Insert into a kept-items table, dropping its oldest past the bound."""
    table[key] = value
    while len(table) > defaults.AGENT_KEPT_ITEMS:
        table.popitem(last=False)


class SessionState:
    """
    One session's fields and its event log.

    :ivar process: the agent child.
    :ivar conn: its JSON-RPC connection.  Both come from :meth:`_wire`,
        which :class:`~sandboxd.agents.session.AgentSession` provides: they
        call back its methods.
    """

    process: AgentProcess
    conn: Connection

    def __init__(
        self,
        manager: AgentManager,
        session_id: str,
        entry: CatalogEntry,
        rule: EffectiveRule,
        cwd: str,
        env: dict[str, str],
        run_as: RunAs | None,
        secrets: list[str],
        title: str | None = None,
        identity: str = "anonymous",
    ) -> None:
        self.manager = manager
        self.reactor = manager.reactor
        self.context = manager.context
        self.session_id = session_id
        self.entry = entry
        self.rule = rule
        self.cwd = cwd
        self.env = env
        self.run_as = run_as
        self.title = title
        self.identity = identity
        limits = rule.limits
        self.max_message_bytes = (
            limits.max_message_bytes or defaults.AGENT_LIMITS["max_message_bytes"]
        )
        self.log = EventLog(
            limits.max_event_bytes or defaults.AGENT_LIMITS["max_event_bytes"]
        )
        self.stderr = HeadTailLog(defaults.AGENT_STDERR_BYTES, secrets)
        self.state = "starting"
        self.error: dict[str, Any] | None = None
        self.created_at = time.time()
        self.acp_session_id: str | None = None
        self.protocol_version: Any = None
        self.agent_info: Any = None
        self.capabilities: dict[str, Any] = {}
        self.auth_methods: list[Any] = []
        self.modes: dict[str, Any] | None = None
        self.config_options: list[Any] | None = None
        self.models: dict[str, Any] | None = None
        self.commands: list[dict[str, Any]] = []
        self.plan: list[dict[str, Any]] = []
        self.plan_seq: int | None = None
        self.usage: dict[str, Any] | None = None
        self.agent_title: str | None = None
        self.turns: OrderedDict[str, Turn] = OrderedDict()
        self.current: Turn | None = None
        self.messages: list[dict[str, Any]] = []
        self._chunk_key: tuple[Any, ...] | None = None
        self.tool_calls: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.files: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.terminals: OrderedDict[str, AgentTerminal] = OrderedDict()
        self.pending: dict[str, HeldRequest] = {}
        self._held_by_rpc: dict[Any, HeldRequest] = {}
        self._rpc_waiters: dict[Any, Deferred[Any]] = {}
        self._turn_ids = itertools.count(1)
        self._terminal_ids = itertools.count(1)
        self._message_ids = itertools.count(1)
        self.replaying = False
        self.exit_code: int | None = None
        self._turn_timer: Any = None
        self._grace_timer: Any = None
        self._idle_timer: Any = None
        self._init_timed_out = False
        self._closed_waiters: Waiters[None] = Waiters()
        self.process, self.conn = self._wire()

    def _wire(self) -> tuple[AgentProcess, Connection]:
        """The agent's process and JSON-RPC connection, wired to the session."""
        raise NotImplementedError

    # -- events ------------------------------------------------------------

    def emit(
        self, type: str, raw: Any = None, turn_id: Any = "current", **fields: Any
    ) -> int:
        """Append one event to the log; returns its seq."""
        if self.log.closed:
            return self.log.last_seq
        if turn_id == "current":
            turn_id = self.current.turn_id if self.current is not None else None
        data: dict[str, Any] = {
            "seq": self.log.last_seq + 1,
            "time": iso(time.time()),
            "session_id": self.session_id,
            "type": type,
        }
        if turn_id is not None:
            data["turn_id"] = turn_id
        if self.replaying:
            data["replay"] = True
        data.update(fields)
        if raw is not None:
            data["raw"] = raw
        if type not in ("message.delta",):
            self._chunk_key = None
        return self.log.append(type, data, json_size(data)).seq

    def set_state(self, state: str) -> None:
        """Change the state and say so in the log."""
        if state == self.state:
            return
        self.state = state
        fields: dict[str, Any] = {"state": state}
        if self.error is not None and state == "failed":
            fields["error"] = self.error
        self.emit("session.state", **fields)

    # -- liveness ----------------------------------------------------------

    def require_live(self) -> None:
        """503 ``agent_unavailable`` once the agent is gone."""
        if self.state in ("failed", "closed", "closing") or self.process.exited:
            raise ApiError(
                503,
                f"the session is {self.state}",
                "RuntimeError",
                "agent_unavailable",
                state=self.state,
                reason=self.error,
            )

    def fail(self, error: dict[str, Any]) -> None:
        """The session cannot go on: record why and end the agent's tree."""
        if self.error is None:
            self.error = error
        if not self.process.exited:
            self.process.kill()

    # -- idle timeout ------------------------------------------------------

    def _touch(self) -> None:
        self._cancel_idle()
        limit = self.rule.limits.idle_timeout_seconds
        if limit and self.state == "idle":
            self._idle_timer = self.reactor.callLater(limit, self._idle)

    def _cancel_idle(self) -> None:
        if self._idle_timer is not None and self._idle_timer.active():
            self._idle_timer.cancel()
        self._idle_timer = None

    def _idle(self) -> None:
        self._idle_timer = None
        if self.state == "idle" and not self.pending:
            self.emit(
                "session.idle_timeout", seconds=self.rule.limits.idle_timeout_seconds
            )
            Deferred.fromCoroutine(self.close(reason="idle_timeout"))

    if TYPE_CHECKING:
        # AgentSession's: the idle timer closes the session.
        async def close(
            self, forget: bool = False, reason: str = "client"
        ) -> dict[str, Any]: ...
