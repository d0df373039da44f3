# -*- test-case-name: tests.test_agents -*-
"""
One agent session (SPEC §15.1): the child, its JSON-RPC connection, the
state folded from its updates, and the event log every reader follows.

:class:`AgentSession` is put together from one mixin per concern, each in
the module named for it: :mod:`.state` (the fields, the event log, the idle
timer), :mod:`.filechanges`, :mod:`.updates` (``session/update``),
:mod:`.heldrequests` (permission requests and questions), :mod:`.turns`,
:mod:`.clientside` (``fs/*``), :mod:`.terminals` (``terminal/*``),
:mod:`.handshake` and :mod:`.configuration`.  This module wires the child
to the connection, routes what the agent sends, and closes the session.

Everything the agent says is stamped with its ``seq`` and folded into the
session's state synchronously as the line is read, so the log is in wire
order and what ``GET`` routes show always matches the events before it.
Every way out of a session (the agent exits, breaks the protocol, ignores a
cancel, or is closed) ends the same way: pending requests fail, the turn
ends, the tree is killed, ``session.closed`` is the last event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, succeed

from sandboxd.agents.clientside import FileRequests
from sandboxd.agents.configuration import Configuration
from sandboxd.agents.handshake import Handshake
from sandboxd.agents.heldrequests import HeldRequests
from sandboxd.agents.jsonrpc import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    REQUEST_CANCELLED,
    Connection,
    ConnectionLost,
    RpcError,
)
from sandboxd.agents.permissions import iso
from sandboxd.agents.process import AgentProcess
from sandboxd.agents.terminals import TerminalRequests
from sandboxd.agents.turns import TurnControl
from sandboxd.policy import defaults


def within(clock: Any, d: Deferred[Any], seconds: float) -> Deferred[Any]:
    """
    A Deferred that fires with ``d``'s result, or with None after
    ``seconds`` (``d`` itself is left alone).  Errors become None too:
    used on the way out, where nothing may hold a caller.
    """
    out: Deferred[Any] = Deferred()

    def done(value: Any) -> None:
        if not out.called:
            out.callback(value)
        if call.active():
            call.cancel()

    call = clock.callLater(seconds, done, None)
    d.addCallbacks(done, lambda f: done(None))
    return out


class AgentSession(
    Handshake, Configuration, TurnControl, FileRequests, TerminalRequests
):
    """
    One session: created by :class:`~sandboxd.agents.manager.AgentManager`,
    driven by the route handlers.
    """

    def _wire(self) -> tuple[AgentProcess, Connection]:
        """The agent's process (its lines, overflow and exit come here) and connection."""
        process = AgentProcess(
            self.reactor,
            self.max_message_bytes,
            self.stderr,
            self._line,
            self._overflow,
            self._exited,
        )
        return process, Connection(process.write, self)

    # -- closing -----------------------------------------------------------

    async def close(
        self, forget: bool = False, reason: str = "client"
    ) -> dict[str, Any]:
        """
        Cancel → ``session/close`` → [``session/delete``] → close stdin →
        TERM/KILL the group; every step bounded.
        """
        if self.state not in ("closed", "failed", "closing"):
            self.set_state("closing")
            clock = self.reactor
            stop = defaults.AGENT_STOP_GRACE_SECONDS
            if self.current is not None:
                turn = self.cancel(reason)
                if turn is not None:
                    await within(clock, turn.wait(), stop)
            session_caps = self.capabilities.get("sessionCapabilities") or {}
            if not self.process.exited and isinstance(session_caps, dict):
                if session_caps.get("close") is not None:
                    await within(
                        clock,
                        self.conn.request(
                            "session/close", {"sessionId": self.acp_session_id}
                        ),
                        stop,
                    )
                if forget and session_caps.get("delete") is not None:
                    await within(
                        clock,
                        self.conn.request(
                            "session/delete", {"sessionId": self.acp_session_id}
                        ),
                        stop,
                    )
            self.process.close_stdin()
            await within(clock, self.process.wait_exit(), stop)
        if not self.process.exited and self.process.pid is not None:
            await within(
                self.reactor, self.process.terminate(), defaults.KILL_GRACE_SECONDS + 1
            )
        await self.wait_closed()
        return {
            "session_id": self.session_id,
            "state": self.state,
            "exit_code": self.process.exit_code,
        }

    def wait_closed(self) -> Deferred[None]:
        """Fires once the log is closed (the agent is gone)."""
        d = succeed(None) if self.log.closed else self._closed_waiters.wait()
        return within(self.reactor, d, defaults.KILL_GRACE_SECONDS + 2)

    def _exited(self, code: int | None, sig: str | None) -> None:
        self.exit_code = code
        self.conn.close(ConnectionLost("the agent exited"))
        for timer in (self._turn_timer, self._grace_timer, self._idle_timer):
            if timer is not None and timer.active():
                timer.cancel()
        for terminal in self.terminals.values():
            terminal.kill()
        for held in list(self.pending.values()):
            self._withdraw(held)
        for d in list(self._rpc_waiters.values()):
            if not d.called:
                d.errback(RpcError(REQUEST_CANCELLED, "the agent exited"))
        self._rpc_waiters.clear()
        self.emit(
            "agent.exited",
            exit_code=code,
            signal=sig,
            stderr_tail=self.stderr.tail_text(2000),
        )
        if self.current is not None:
            turn = self.current
            if turn.cancel_requested:
                turn.forced = True
                self._end_turn(turn, "ended", "cancelled")
            else:
                turn.error = self.error or {
                    "code": "agent_exited",
                    "message": f"the agent exited during the turn (exit code {code})",
                }
                self._end_turn(turn, "failed", None)
        if self.state == "closing":
            self.set_state("closed")
        else:
            if self.error is None:
                self.error = {
                    "code": "agent_exited",
                    "message": f"the agent exited (exit code {code}, signal {sig})",
                }
            self.set_state("failed")
        self.emit("session.closed", exit_code=code, signal=sig, state=self.state)
        self.log.close()
        self.manager.session_ended(self)
        self._closed_waiters.fire(None)

    # -- reading the agent ---------------------------------------------------

    def _line(self, line: bytes) -> None:
        self.conn.line_received(line)

    def _overflow(self, size: int) -> None:
        self.emit(
            "unknown",
            reason=f"a message longer than max_message_bytes ({self.max_message_bytes}) was cut off",
            bytes=size,
        )
        self.fail(
            {
                "code": "message_too_large",
                "message": f"the agent sent a line over max_message_bytes ({self.max_message_bytes} bytes)",
            }
        )

    def handle_garbage(self, line: bytes, reason: str, message: Any) -> None:
        """Record a line we cannot use, and go on."""
        text = line[:4096].decode("utf-8", "replace")
        self.emit(
            "unknown", raw=message if message is not None else text, reason=reason
        )

    def handle_notification(self, method: str, params: Any) -> None:
        """``session/update``, ``$/cancel_request``, extensions."""
        if (
            method == "session/update"
            and isinstance(params, dict)
            and isinstance(params.get("update"), dict)
        ):
            self._update(params["update"], params)
        elif method == "$/cancel_request" and isinstance(params, dict):
            self._cancel_request(params.get("requestId"))
        else:
            self.emit(
                "unknown",
                raw={"method": method, "params": params},
                reason="notification",
            )

    def handle_request(self, request_id: Any, method: str, params: Any) -> Any:
        """The agent asks sandboxd for something."""
        if not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "params must be an object")
        handler = self._REQUESTS.get(method)
        if handler is None:
            self.emit(
                "unknown", raw={"method": method, "params": params}, reason="request"
            )
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
        return handler(self, request_id, params)

    _REQUESTS: dict[str, Callable[[AgentSession, Any, dict[str, Any]], Any]] = {
        "session/request_permission": HeldRequests._permission,
        "elicitation/create": HeldRequests._question,
        "fs/read_text_file": FileRequests._fs_read,
        "fs/write_text_file": FileRequests._fs_write,
        "terminal/create": TerminalRequests._terminal_create,
        "terminal/output": TerminalRequests._terminal_output,
        "terminal/wait_for_exit": TerminalRequests._terminal_wait,
        "terminal/kill": TerminalRequests._terminal_kill,
        "terminal/release": TerminalRequests._terminal_release,
    }

    # -- views ---------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """The ``agents_session_list`` entry."""
        return {
            "session_id": self.session_id,
            "agent": self.entry.id,
            "acp_session_id": self.acp_session_id,
            "state": self.state,
            "title": self.title or self.agent_title,
            "cwd": self.cwd,
            "created_at": iso(self.created_at),
            "last_seq": self.log.last_seq,
            "turn_id": self.current.turn_id if self.current else None,
            "pending_requests": len(self.pending),
            "error": self.error,
        }

    def describe(self) -> dict[str, Any]:
        """The ``agents_session_get`` body."""
        last = next(reversed(self.turns.values()), None) if self.turns else None
        out = self.summary()
        out.update(
            {
                "modes": self.modes,
                "config_options": self.config_options,
                "models": self.models,
                "usage": self.usage,
                "current_turn": self.current.describe() if self.current else None,
                "stop_reason": last.stop_reason if last else None,
                "process": {
                    "pid": self.process.pid,
                    "exit_code": self.process.exit_code,
                    "signal": self.process.signal,
                },
                "capabilities": self.capabilities,
                "agent_info": self.agent_info,
                "protocol_version": self.protocol_version,
                "commands": self.command_list(),
                "events_url": self.events_url(),
            }
        )
        return out

    def events_url(self) -> str:
        """Where the session's events are followed."""
        return f"/agents/sessions/{self.session_id}/events?follow=true"

    def command_list(self) -> list[dict[str, Any]]:
        """Slash commands as the route shows them."""
        out = []
        for c in self.commands:
            if isinstance(c, dict):
                given = c.get("input")
                hint: dict[str, Any] = given if isinstance(given, dict) else {}
                out.append(
                    {
                        "name": c.get("name"),
                        "description": c.get("description"),
                        "input_hint": hint.get("hint"),
                    }
                )
        return out
