# -*- test-case-name: tests.agents.test_agents -*-
"""
One agent session (SPEC §15.1): the child, its JSON-RPC connection, the
state folded from its updates, and the event log every reader follows.

:class:`AgentSession` is its :class:`~sandboxd.agents.state.SessionState`
(the fields and the event log) and owns one collaborator per concern, each
given that state and only the other collaborators it calls:

- :attr:`~AgentSession.handshake` (:mod:`.handshake`): spawn, ``initialize``
  → ``session/new``/``load``/``resume``;
- :attr:`~AgentSession.configuration` (:mod:`.configuration`): mode, model,
  config options, title;
- :attr:`~AgentSession.turn_control` (:mod:`.turns`): ``session/prompt`` and
  cancel, with their timers;
- :attr:`~AgentSession.held` (:mod:`.heldrequests`): permission requests and
  questions, calling back :class:`~sandboxd.agents.heldrequests.HeldHost`;
- :attr:`~AgentSession.updates` (:mod:`.updates`): ``session/update`` folded,
  with :attr:`~AgentSession.changes` (:mod:`.filechanges`) for the files;
- :attr:`~AgentSession.file_requests` (:mod:`.clientside`) and
  :attr:`~AgentSession.terminal_requests` (:mod:`.terminalrequests`): the
  agent's ``fs/*`` and ``terminal/*`` requests;
- :attr:`~AgentSession.idle` (:class:`~sandboxd.agents.state.IdleTimer`).

This module wires the child to the connection, routes what the agent sends
to the collaborator it is for, and closes the session.

Everything the agent says is stamped with its ``seq`` and folded into the
session's state synchronously as the line is read, so the log is in wire
order and what ``GET`` routes show always matches the events before it.
Every way out of a session (the agent exits, breaks the protocol, ignores a
cancel, or is closed) ends the same way: pending requests fail, the turn
ends, the tree is killed, ``session.closed`` is the last event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet.defer import Deferred, succeed

from sandboxd.agents.catalog import CatalogEntry
from sandboxd.agents.clientside import FileRequests
from sandboxd.agents.cliparsers import SUBAGENT_NOTIFICATION
from sandboxd.agents.configuration import Configuration
from sandboxd.agents.filechanges import FileChanges
from sandboxd.agents.handshake import Handshake
from sandboxd.agents.heldrequests import HeldRequests
from sandboxd.agents.permissions import HeldRequest, iso
from sandboxd.agents.process import AgentProcess
from sandboxd.agents.state import IdleTimer, SessionState
from sandboxd.agents.terminalrequests import TerminalRequests
from sandboxd.agents.turns import TurnControl
from sandboxd.agents.updates import UpdateFolding
from sandboxd.jsonrpc import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    REQUEST_CANCELLED,
    Connection,
    ConnectionLost,
    LineFramer,
    RpcError,
    valid_id,
)
from sandboxd.policy import defaults
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import RunAs
from sandboxd.waiters import Waiters


class SessionOwner(Protocol):
    """
    What a session calls back in the service that owns it
    (:class:`~sandboxd.agents.manager.AgentManager`).
    """

    reactor: Any
    context: Any

    def register_request(self, held: HeldRequest) -> None:
        """Index a held request across sessions."""

    def session_ended(self, session: AgentSession) -> None:
        """The session's agent is gone."""


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


class AgentSession(SessionState):
    """
    One session: created by :class:`~sandboxd.agents.manager.AgentManager`,
    driven by the route handlers through its collaborators.
    """

    def __init__(
        self,
        owner: SessionOwner,
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
        super().__init__(
            owner.reactor,
            owner.context,
            session_id,
            entry,
            rule,
            cwd,
            env,
            run_as,
            secrets,
            title,
            identity,
        )
        self.owner = owner
        self._closed_waiters: Waiters[None] = Waiters()
        # The agent's lines, overflow and exit come here; what it says on
        # the connection comes to handle_request/handle_notification.
        self.process = AgentProcess(
            self.reactor,
            self.context.children,
            self.stderr,
            LineFramer(self.max_message_bytes, self._line, self._overflow),
            self._exited,
        )
        self.conn = Connection(self.process.write, self)
        self.idle = IdleTimer(self, self._idle)
        self.handshake = Handshake(self, self.idle)
        self.configuration = Configuration(self)
        self.changes = FileChanges(self)
        self.updates = UpdateFolding(self, self.changes)
        self.held = HeldRequests(self, self.updates, self)
        self.turn_control = TurnControl(self, self.updates, self.held, self.idle)
        self.file_requests = FileRequests(self, self.updates, self.changes)
        self.terminal_requests = TerminalRequests(self, self.updates)
        self._requests: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
            "session/request_permission": self.held.permission,
            "elicitation/create": self.held.question,
            "fs/read_text_file": self.file_requests.read,
            "fs/write_text_file": self.file_requests.write,
            "terminal/create": self.terminal_requests.create,
            "terminal/output": self.terminal_requests.output,
            "terminal/wait_for_exit": self.terminal_requests.wait_for_exit,
            "terminal/kill": self.terminal_requests.kill,
            "terminal/release": self.terminal_requests.release,
        }

    # -- what the collaborators call back (HeldHost) -------------------------

    def register_request(self, held: HeldRequest) -> None:
        """Index a held request in the owner's table."""
        self.owner.register_request(held)

    def cancel_turn(self, forced_by: str) -> None:
        """Cancel the running turn."""
        self.turn_control.cancel(forced_by)

    def _idle(self) -> None:
        Deferred.fromCoroutine(self.close(reason="idle_timeout"))

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
                turn = self.turn_control.cancel(reason)
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
            "signal": self.process.signal,
        }

    def wait_closed(self) -> Deferred[None]:
        """Fires once the log is closed (the agent is gone)."""
        d = succeed(None) if self.log.closed else self._closed_waiters.wait()
        return within(self.reactor, d, defaults.KILL_GRACE_SECONDS + 2)

    def _exited(self, code: int | None, sig: str | None) -> None:
        self.exit_code = code
        # Withdrawn first: nobody cancelled them, the agent is gone (the
        # connection's end below also ends the turn, which would answer
        # them cancelled).
        for held in list(self.pending.values()):
            self.held.withdraw(held)
        self.conn.close(ConnectionLost("the agent exited"))
        self.turn_control.stop_timers()
        self.idle.cancel()
        for terminal in self.terminals.values():
            terminal.kill()
        for d in list(self.rpc_waiters.values()):
            if not d.called:
                d.errback(RpcError(REQUEST_CANCELLED, "the agent exited"))
        self.rpc_waiters.clear()
        self.emit(
            "agent.exited",
            exit_code=code,
            signal=sig,
            stderr_tail=self.stderr.tail_text(2000),
        )
        self.turn_control.agent_exited(code)
        if self.state == "closing":
            self.set_state("closed")
        else:
            if self.error is None:
                self.error = {
                    "code": "agent_exited",
                    "message": f"the agent was killed by {sig}"
                    if sig
                    else f"the agent exited (exit code {code})",
                }
            self.set_state("failed")
        self.emit("session.closed", exit_code=code, signal=sig, state=self.state)
        self.log.close()
        self.owner.session_ended(self)
        self._closed_waiters.fire(None)

    # -- reading the agent ---------------------------------------------------

    def _line(self, line: bytes) -> None:
        self.conn.message_received(line)

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
            if self.stderr.secrets:
                # Masked before folding: the messages, turns and tool calls
                # read from it show what its events show.
                params = self.masked(params)
            self.updates.update(params["update"], params)
        elif (
            method == "$/cancel_request"
            and isinstance(params, dict)
            and valid_id(params.get("requestId"))
        ):
            self.held.cancel_request(params.get("requestId"))
        elif (
            method == SUBAGENT_NOTIFICATION
            and isinstance(params, dict)
            and isinstance(params.get("subagent"), dict)
        ):
            # What a headless CLI's subagent did (its bridge reports it).
            self.emit("subagent", subagent=params["subagent"])
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
        handler = self._requests.get(method)
        if handler is None:
            self.emit(
                "unknown", raw={"method": method, "params": params}, reason="request"
            )
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
        return handler(request_id, params)

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
            "turn_id": self.current_turn_id,
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
