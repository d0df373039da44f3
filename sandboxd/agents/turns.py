# -*- test-case-name: tests.agents.test_agents -*-
"""
Turns (SPEC §15.1): one ``session/prompt`` each, from ``turn.started`` to
``turn.ended``.  A cancel answers held requests cancelled and marks
unfinished tool calls; an agent that does not end the turn within the grace
period has its tree killed (``forced``), as does one past
``max_turn_seconds``.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from sandboxd.agents.heldrequests import HeldRequests
from sandboxd.agents.state import (
    UNFINISHED,
    IdleTimer,
    SessionState,
    Turn,
    bounded_put,
)
from sandboxd.agents.updates import UpdateFolding
from sandboxd.errors import Code, conflict
from sandboxd.jsonrpc import RpcError
from sandboxd.policy import defaults

__all__ = ["Turn", "TurnControl"]


class TurnControl:
    """
    Starting, ending and cancelling turns: the session's ``turns`` and
    ``current``, with the ``max_turn_seconds`` and cancel-grace timers.
    The prompt is folded as a user message through ``updates``; the held
    requests of an ended turn are answered through ``held``.
    """

    def __init__(
        self,
        session: SessionState,
        updates: UpdateFolding,
        held: HeldRequests,
        idle: IdleTimer,
    ) -> None:
        self.session = session
        self.updates = updates
        self.held = held
        self.idle = idle
        self._turn_ids = itertools.count(1)
        self._turn_timer: Any = None
        self._grace_timer: Any = None

    def start(self, blocks: list[dict[str, Any]]) -> Turn:
        """Send ``session/prompt``; 409 ``turn_in_progress`` during a turn."""
        s = self.session
        s.require_live()
        if s.current is not None or s.state == "starting":
            raise conflict(
                "a turn is already running",
                Code.TURN_IN_PROGRESS,
                turn_id=s.current_turn_id,
            )
        turn = Turn(f"turn_{next(self._turn_ids)}", time.time(), s.log.last_seq + 1)
        bounded_put(s.turns, turn.turn_id, turn)
        s.current = turn
        self.idle.cancel()
        s.emit("turn.started", prompt=blocks)
        message_id = f"user_{next(s.message_ids)}"
        for block in blocks:
            seq = s.emit(
                "message.delta", role="user", message_id=message_id, content=block
            )
            self.updates.fold_message("user", message_id, s.masked(block), seq)
        s.set_state("running")
        limit = s.rule.limits.max_turn_seconds
        if limit:
            self._turn_timer = s.reactor.callLater(limit, self._turn_too_long)
        d = s.conn.request(
            "session/prompt", {"sessionId": s.acp_session_id, "prompt": blocks}
        )
        d.addCallbacks(
            lambda result: self._turn_answered(turn, result),
            lambda f: self._turn_failed(turn, f.value),
        )
        return turn

    def _turn_answered(self, turn: Turn, result: Any) -> None:
        result = result if isinstance(result, dict) else {}
        reason = result.get("stopReason")
        if turn.cancel_requested and reason is None:
            reason = "cancelled"
        if isinstance(result.get("usage"), dict):
            turn.usage = result["usage"]
        self._end_turn(turn, "ended", str(reason) if reason is not None else "end_turn")

    def _turn_failed(self, turn: Turn, error: Any) -> None:
        if turn.state != "running":
            return
        if turn.cancel_requested and isinstance(error, RpcError):
            # Agents are told to answer a cancel with stopReason cancelled;
            # some throw instead.  Either way the turn was cancelled.
            self._end_turn(turn, "ended", "cancelled")
            return
        if isinstance(error, RpcError):
            turn.error = {
                "code": "agent_error",
                "message": error.message,
                "rpc_error": error.as_json(),
            }
            self._end_turn(turn, "failed", None)
            return
        if turn.cancel_requested:
            self._end_turn(turn, "ended", "cancelled")
            return
        turn.error = self.session.error or {
            "code": "agent_exited",
            "message": "the agent exited during the turn",
        }
        self._end_turn(turn, "failed", None)

    def stop_timers(self) -> None:
        """Stop the ``max_turn_seconds`` and cancel-grace timers."""
        for timer in (self._turn_timer, self._grace_timer):
            if timer is not None and timer.active():
                timer.cancel()
        self._turn_timer = self._grace_timer = None

    def agent_exited(self, code: int | None) -> None:
        """The agent is gone: the running turn ends, cancelled or failed."""
        turn = self.session.current
        if turn is None:
            return
        if turn.cancel_requested:
            turn.forced = True
            self._end_turn(turn, "ended", "cancelled")
        else:
            turn.error = self.session.error or {
                "code": "agent_exited",
                "message": "the agent exited during the turn"
                + (f" (exit code {code})" if code is not None else ""),
            }
            self._end_turn(turn, "failed", None)

    def _end_turn(self, turn: Turn, state: str, stop_reason: str | None) -> None:
        if turn.state != "running":
            return
        s = self.session
        turn.state = state
        turn.stop_reason = stop_reason
        turn.ended_at = time.time()
        self.stop_timers()
        for held in list(s.pending.values()):
            if held.turn_id == turn.turn_id:
                self.held.resolve_cancelled(held, "cancel")
        fields: dict[str, Any] = {
            "stop_reason": stop_reason,
            "forced": turn.forced,
            "state": state,
        }
        if turn.error is not None:
            fields["error"] = turn.error
        turn.seq_to = s.emit("turn.ended", turn_id=turn.turn_id, **fields)
        if s.current is turn:
            s.current = None
        if (
            s.state in ("running", "awaiting_input")
            and s.conn.closed is None
            and s.error is None
        ):
            # Not once the agent is gone or being ended: the session goes
            # on to failed, and a client must not take it as free for the
            # next prompt.
            s.set_state("idle")
            self.idle.touch()
        turn.waiters.fire(None)

    def cancel(self, forced_by: str | None = None) -> Turn | None:
        """
        ``session/cancel``: held requests are answered cancelled, unfinished
        tool calls marked cancelled, and if the agent has not ended the turn
        after the grace period its tree is killed (``forced``).
        """
        s = self.session
        turn = s.current
        if turn is None or turn.state != "running":
            return turn
        if not turn.cancel_requested:
            turn.cancel_requested = True
            s.conn.notify("session/cancel", {"sessionId": s.acp_session_id})
            for held in list(s.pending.values()):
                self.held.resolve_cancelled(held, "cancel")
            for tc in s.tool_calls.values():
                if tc.get("turn_id") == turn.turn_id and tc.get("status") in UNFINISHED:
                    tc["status"] = "cancelled"
            s.emit("turn.cancelling", by=forced_by or "client")
            self._grace_timer = s.reactor.callLater(
                defaults.AGENT_CANCEL_GRACE_SECONDS, self._force_cancel, turn
            )
        return turn

    def _turn_too_long(self) -> None:
        self._turn_timer = None
        self.cancel("max_turn_seconds")

    def _force_cancel(self, turn: Turn) -> None:
        self._grace_timer = None
        if turn.state != "running":
            return
        turn.forced = True
        self.session.error = {
            "code": "agent_killed",
            "message": "the agent did not end the cancelled turn within the grace period",
        }
        self._end_turn(turn, "ended", "cancelled")
        self.session.process.kill()
