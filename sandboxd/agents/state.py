# -*- test-case-name: tests.agents.test_agents -*-
"""
What one agent session knows (SPEC §15.1), and the event log that says so.

:class:`SessionState` is the record every part of a session shares: the
fields the collaborators of :class:`~sandboxd.agents.session.AgentSession`
read and fold into, with :meth:`SessionState.emit`, which stamps each
event with its ``seq`` as the line is read, so the log is in wire order and
what ``GET`` routes show always matches the events before it.  Each
collaborator (handshake, configuration, turns, held requests, updates,
file changes, ``fs/*`` and ``terminal/*`` requests) is given this record
and knows nothing of the others but what it is handed.  The turn record
(:class:`Turn`) and the idle timer (:class:`IdleTimer`) are here too:
several collaborators read the one and restart the other.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet import defer
from twisted.internet.defer import Deferred, succeed

from sandboxd.agents.catalog import CatalogEntry
from sandboxd.agents.permissions import HeldRequest, iso
from sandboxd.agents.process import AgentProcess, HeadTailLog
from sandboxd.agents.terminals import AgentTerminal
from sandboxd.errors import agent_timeout, agent_unavailable
from sandboxd.eventlog import EventLog, json_size
from sandboxd.jsonrpc import Connection
from sandboxd.policy import defaults
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import RunAs
from sandboxd.waiters import Waiters

#: Every state a session can be in (SPEC §15.1), in the order it goes
#: through them: what a session list may be filtered by.
SESSION_STATES = (
    "starting",
    "idle",
    "running",
    "awaiting_input",
    "closing",
    "closed",
    "failed",
)

#: The statuses of a tool call still running.
UNFINISHED = ("pending", "in_progress")


def bounded_put(table: OrderedDict[str, Any], key: str, value: Any) -> None:
    """Insert into a kept-items table, dropping its oldest past the bound."""
    table[key] = value
    while len(table) > defaults.AGENT_KEPT_ITEMS:
        table.popitem(last=False)


@attrs.define(eq=False)
class Turn:
    """One ``session/prompt`` (SPEC §15.1)."""

    turn_id: str
    started_at: float
    seq_from: int
    state: str = "running"
    stop_reason: str | None = None
    ended_at: float | None = None
    seq_to: int | None = None
    error: dict[str, Any] | None = None
    forced: bool = False
    cancel_requested: bool = False
    text: list[str] = attrs.Factory(list)
    tool_call_ids: list[str] = attrs.Factory(list)
    usage: dict[str, Any] | None = None
    waiters: Waiters[None] = attrs.Factory(Waiters)

    def describe(self) -> dict[str, Any]:
        """The turn record."""
        out: dict[str, Any] = {
            "turn_id": self.turn_id,
            "state": self.state,
            "stop_reason": self.stop_reason,
            "forced": self.forced,
            "started_at": iso(self.started_at),
            "ended_at": iso(self.ended_at) if self.ended_at else None,
            "seq_from": self.seq_from,
            "seq_to": self.seq_to,
        }
        if self.error is not None:
            out["error"] = self.error
        return out

    def result(self) -> dict[str, Any]:
        """``agents_prompt``'s 200 body."""
        out = {
            "turn_id": self.turn_id,
            "state": self.state,
            "stop_reason": self.stop_reason,
            "forced": self.forced,
            "text": "".join(self.text),
            "tool_call_ids": list(self.tool_call_ids),
            "usage": self.usage,
            "seq": {"from": self.seq_from, "to": self.seq_to},
        }
        if self.error is not None:
            out["error"] = self.error
        return out

    def wait(self) -> Deferred[None]:
        """Fires when the turn has ended."""
        if self.state != "running":
            return succeed(None)
        return self.waiters.wait()


class SessionState:
    """
    One session's fields and its event log.

    :ivar process: the agent child.
    :ivar conn: its JSON-RPC connection.  Both are set by the session that
        owns this state, right after it is made: they call back its
        methods.
    :ivar pending: the held requests still open, by request id.
    :ivar rpc_waiters: the agent's requests answered later (its
        ``terminal/wait_for_exit``), by JSON-RPC id, failed if it exits.
    :ivar chunk_key: ``(role, message_id, turn_id)`` of the last message
        chunk, so a chunk without ``messageId`` joins the message before it;
        any other event ends the message.
    """

    process: AgentProcess
    conn: Connection

    def __init__(
        self,
        reactor: Any,
        context: Any,
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
        self.reactor = reactor
        self.context = context
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
        self.message_ids = itertools.count(1)
        self.chunk_key: tuple[Any, ...] | None = None
        self.tool_calls: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.files: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.terminals: OrderedDict[str, AgentTerminal] = OrderedDict()
        self.pending: dict[str, HeldRequest] = {}
        self.rpc_waiters: dict[Any, Deferred[Any]] = {}
        self.replaying = False
        self.exit_code: int | None = None

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
        if self.stderr.secrets:
            data = self.masked(data)
        if type not in ("message.delta",):
            self.chunk_key = None
        return self.log.append(type, data, json_size(data)).seq

    def masked(self, value: Any) -> Any:
        """``value`` with every secret of the session masked in its strings."""
        if isinstance(value, str):
            return self.stderr.redact(value)
        if isinstance(value, dict):
            return {k: self.masked(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.masked(v) for v in value]
        return value

    def set_state(self, state: str) -> None:
        """Change the state and say so in the log."""
        if state == self.state:
            return
        self.state = state
        fields: dict[str, Any] = {"state": state}
        if self.error is not None and state == "failed":
            fields["error"] = self.error
        self.emit("session.state", **fields)

    @property
    def current_turn_id(self) -> str | None:
        """The running turn's id, if a turn is running."""
        return self.current.turn_id if self.current is not None else None

    # -- liveness ----------------------------------------------------------

    def require_live(self) -> None:
        """503 ``agent_unavailable`` once the agent is gone."""
        if self.state in ("failed", "closed", "closing") or self.process.exited:
            raise agent_unavailable(
                f"the session is {self.state}", state=self.state, reason=self.error
            )

    def fail(self, error: dict[str, Any]) -> None:
        """The session cannot go on: record why and end the agent's tree."""
        if self.error is None:
            self.error = error
        if not self.process.exited:
            self.process.kill()

    async def ask(self, method: str, params: Any) -> Any:
        """
        One request to the agent outside a turn (a mode, a model, an
        option, a probe's ``session/list``), answered within
        ``init_timeout_seconds`` like the handshake's: these are quick
        bookkeeping calls, so an agent that lets one go unanswered that
        long is stuck, and waiting longer would only hold the caller.  Past
        the bound the session fails and the agent's tree is ended: a late
        answer could no longer be told apart, and a session whose mode is
        unknown cannot be driven honestly.

        :raises ApiError: 504 ``agent_timeout`` past the bound.
        """
        limit = (
            self.rule.limits.init_timeout_seconds
            or (defaults.AGENT_LIMITS["init_timeout_seconds"])
        )
        d = self.conn.request(method, params)
        d.addTimeout(limit, self.reactor)
        try:
            return await d
        except defer.TimeoutError:
            message = f"the agent did not answer {method} within {limit:g} s"
            self.fail({"code": "agent_timeout", "message": message})
            raise agent_timeout(
                message, stderr_tail=self.stderr.tail_text(2000)
            ) from None


class IdleTimer:
    """
    ``idle_timeout_seconds``: restarted by every handshake and turn end,
    stopped by a turn start; once an idle session with nothing held has
    waited that long, ``session.idle_timeout`` and ``on_idle`` (the close).
    """

    def __init__(self, session: SessionState, on_idle: Callable[[], None]) -> None:
        self._session = session
        self._on_idle = on_idle
        self._timer: Any = None

    def touch(self) -> None:
        """(Re)start the countdown if the session is idle."""
        self.cancel()
        limit = self._session.rule.limits.idle_timeout_seconds
        if limit and self._session.state == "idle":
            self._timer = self._session.reactor.callLater(limit, self._idle)

    def cancel(self) -> None:
        """Stop the countdown."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _idle(self) -> None:
        self._timer = None
        session = self._session
        if session.state == "idle" and not session.pending:
            session.emit(
                "session.idle_timeout", seconds=session.rule.limits.idle_timeout_seconds
            )
            self._on_idle()
