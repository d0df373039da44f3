# -*- test-case-name: tests.test_agents -*-
"""
Turns (SPEC §15.1): one ``session/prompt`` each, from ``turn.started`` to
``turn.ended``.  A cancel answers held requests cancelled and marks
unfinished tool calls; an agent that does not end the turn within the grace
period has its tree killed (``forced``), as does one past
``max_turn_seconds``.
"""

from __future__ import annotations

import time
from typing import Any

import attrs
from twisted.internet.defer import Deferred, succeed

from sandboxd.agents.heldrequests import HeldRequests
from sandboxd.agents.jsonrpc import RpcError
from sandboxd.agents.permissions import iso
from sandboxd.agents.state import UNFINISHED, bounded_put
from sandboxd.errors import ApiError
from sandboxd.policy import defaults
from sandboxd.waiters import Waiters


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


class TurnControl(HeldRequests):
    """Starting, ending and cancelling turns."""

    def start_turn(self, blocks: list[dict[str, Any]]) -> Turn:
        """Send ``session/prompt``; 409 ``turn_in_progress`` during a turn."""
        self.require_live()
        if self.current is not None or self.state == "starting":
            raise ApiError(
                409,
                "a turn is already running",
                "RuntimeError",
                "turn_in_progress",
                turn_id=self.current.turn_id if self.current else None,
            )
        turn = Turn(f"turn_{next(self._turn_ids)}", time.time(), self.log.last_seq + 1)
        bounded_put(self.turns, turn.turn_id, turn)
        self.current = turn
        self._cancel_idle()
        self.emit("turn.started", prompt=blocks)
        message_id = f"user_{next(self._message_ids)}"
        for block in blocks:
            seq = self.emit(
                "message.delta", role="user", message_id=message_id, content=block
            )
            self._fold_message("user", message_id, block, seq)
        self.set_state("running")
        limit = self.rule.limits.max_turn_seconds
        if limit:
            self._turn_timer = self.reactor.callLater(limit, self._turn_too_long)
        d = self.conn.request(
            "session/prompt", {"sessionId": self.acp_session_id, "prompt": blocks}
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
        turn.error = self.error or {
            "code": "agent_exited",
            "message": "the agent exited during the turn",
        }
        self._end_turn(turn, "failed", None)

    def _end_turn(self, turn: Turn, state: str, stop_reason: str | None) -> None:
        if turn.state != "running":
            return
        turn.state = state
        turn.stop_reason = stop_reason
        turn.ended_at = time.time()
        for timer in (self._turn_timer, self._grace_timer):
            if timer is not None and timer.active():
                timer.cancel()
        self._turn_timer = self._grace_timer = None
        for held in list(self.pending.values()):
            if held.turn_id == turn.turn_id:
                self._resolve_cancelled(held, "cancel")
        fields: dict[str, Any] = {
            "stop_reason": stop_reason,
            "forced": turn.forced,
            "state": state,
        }
        if turn.error is not None:
            fields["error"] = turn.error
        turn.seq_to = self.emit("turn.ended", turn_id=turn.turn_id, **fields)
        if self.current is turn:
            self.current = None
        if self.state in ("running", "awaiting_input"):
            self.set_state("idle")
        self._touch()
        turn.waiters.fire(None)

    def cancel(self, forced_by: str | None = None) -> Turn | None:
        """
        ``session/cancel``: held requests are answered cancelled, unfinished
        tool calls marked cancelled, and if the agent has not ended the turn
        after the grace period its tree is killed (``forced``).
        """
        turn = self.current
        if turn is None or turn.state != "running":
            return turn
        if not turn.cancel_requested:
            turn.cancel_requested = True
            self.conn.notify("session/cancel", {"sessionId": self.acp_session_id})
            for held in list(self.pending.values()):
                self._resolve_cancelled(held, "cancel")
            for tc in self.tool_calls.values():
                if tc.get("turn_id") == turn.turn_id and tc.get("status") in UNFINISHED:
                    tc["status"] = "cancelled"
            self.emit("turn.cancelling", by=forced_by or "client")
            self._grace_timer = self.reactor.callLater(
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
        self.error = {
            "code": "agent_killed",
            "message": "the agent did not end the cancelled turn within the grace period",
        }
        self._end_turn(turn, "ended", "cancelled")
        self.process.kill()
