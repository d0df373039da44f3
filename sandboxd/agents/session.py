# -*- test-case-name: tests.test_agents -*-
"""
One agent session (SPEC §15.1): the child, its JSON-RPC connection, the
state folded from its updates, and the event log every reader follows.

Everything the agent says is stamped with its ``seq`` and folded into the
session's state synchronously as the line is read, so the log is in wire
order and what ``GET`` routes show always matches the events before it.
Every way out of a session (the agent exits, breaks the protocol, ignores a
cancel, or is closed) ends the same way: pending requests fail, the turn
ends, the tree is killed, ``session.closed`` is the last event.
"""

from __future__ import annotations

import difflib
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import Deferred

from sandboxd.agents import clientside
from sandboxd.agents.catalog import CatalogEntry
from sandboxd.agents.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    REQUEST_CANCELLED,
    Connection,
    ConnectionLost,
    RpcError,
)
from sandboxd.agents.permissions import (
    DECISIONS,
    HeldRequest,
    first_option,
    iso,
    mode_for,
    new_request_id,
    path_refusal,
)
from sandboxd.agents.process import AgentProcess, HeadTailLog
from sandboxd.agents.terminals import AgentTerminal
from sandboxd.children import (
    RunAs,
    check_command_allowed,
    child_environment,
    find_executable,
)
from sandboxd.errors import ApiError, forbidden
from sandboxd.eventlog import EventLog, json_size
from sandboxd.guard import PathGuard
from sandboxd.policy import defaults
from sandboxd.policy.rules import EffectiveRule

if TYPE_CHECKING:
    from sandboxd.agents.manager import AgentManager

CLIENT_INFO = {"name": "sandboxd", "title": "sandboxd", "version": "1"}
PROTOCOL_VERSION = 1
_UNFINISHED = ("pending", "in_progress")


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
    waiters: list[Deferred[None]] = attrs.Factory(list)

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
        d: Deferred[None] = Deferred()
        if self.state != "running":
            d.callback(None)
        else:
            self.waiters.append(d)
        return d


def _bounded_put(table: OrderedDict[str, Any], key: str, value: Any) -> None:
    table[key] = value
    while len(table) > defaults.AGENT_KEPT_ITEMS:
        table.popitem(last=False)


def agent_refused(what: str, error: RpcError, **extra: Any) -> ApiError:
    """502 ``agent_error``: the agent answered ``what`` with a JSON-RPC error."""
    return ApiError(
        502,
        f"the agent refused {what}: {error.message}",
        "RuntimeError",
        "agent_error",
        rpc_error=error.as_json(),
        **extra,
    )


class AgentSession:
    """
    One session: created by :class:`~sandboxd.agents.manager.AgentManager`,
    driven by the route handlers.
    """

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
        self._closed_waiters: list[Deferred[None]] = []
        self.process = AgentProcess(
            self.reactor,
            self.max_message_bytes,
            self.stderr,
            self._line,
            self._overflow,
            self._exited,
        )
        self.conn = Connection(self.process.write, self)

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

    # -- start and handshake -----------------------------------------------

    def spawn(self, argv: list[str], executable: str) -> None:
        """Start the agent child."""
        self.process.spawn(executable, argv, self.env, self.cwd, self.run_as)
        self.emit(
            "session.state", state="starting", agent=self.entry.id, pid=self.process.pid
        )

    def client_capabilities(self) -> dict[str, Any]:
        """What sandboxd offers the agent, from ``client_fs``/``client_terminal``."""
        fs_mode = self.rule.params.client_fs
        return {
            "fs": {
                "readTextFile": fs_mode in ("read", "read_write"),
                "writeTextFile": fs_mode == "read_write",
            },
            "terminal": bool(self.rule.params.client_terminal),
            "elicitation": {"form": {}},
        }

    def _agent_failure(self, failure_value: Exception, step: str) -> ApiError:
        tail = self.stderr.tail_text(2000)
        if self._init_timed_out:
            return ApiError(
                504,
                f"the agent did not answer {step} within {self.rule.limits.init_timeout_seconds} s",
                "TimeoutError",
                "agent_timeout",
                stderr_tail=tail,
            )
        if isinstance(failure_value, RpcError):
            return agent_refused(step, failure_value, stderr_tail=tail)
        return ApiError(
            502,
            f"the agent exited during {step}"
            + (
                f": {self.error['message']}"
                if self.error
                else f" (exit code {self.process.exit_code})"
            ),
            "RuntimeError",
            "agent_error",
            stderr_tail=tail,
        )

    async def handshake(
        self,
        body: dict[str, Any],
        load: dict[str, Any] | None = None,
        probe: bool = False,
    ) -> None:
        """
        ``initialize`` → [``authenticate``] → ``session/new`` (or
        ``session/load``/``session/resume``), all within
        ``init_timeout_seconds``; past it the tree is killed (504).
        """
        timeout = self.rule.limits.init_timeout_seconds or 30
        timer = self.reactor.callLater(timeout, self._init_timeout)
        step = "initialize"
        try:
            init = await self.conn.request(
                "initialize",
                {
                    "protocolVersion": PROTOCOL_VERSION,
                    "clientCapabilities": self.client_capabilities(),
                    "clientInfo": CLIENT_INFO,
                },
            )
            init = init if isinstance(init, dict) else {}
            self.protocol_version = init.get("protocolVersion")
            self.agent_info = init.get("agentInfo")
            caps = init.get("agentCapabilities")
            self.capabilities = caps if isinstance(caps, dict) else {}
            methods = init.get("authMethods")
            self.auth_methods = methods if isinstance(methods, list) else []
            if probe:
                return
            if self.entry.auth_method and any(
                isinstance(m, dict) and m.get("id") == self.entry.auth_method
                for m in self.auth_methods
            ):
                step = "authenticate"
                await self.conn.request(
                    "authenticate", {"methodId": self.entry.auth_method}
                )
            params: dict[str, Any] = {
                "cwd": self.cwd,
                "mcpServers": body.get("mcp_servers") or [],
            }
            if body.get("additional_directories"):
                params["additionalDirectories"] = body["additional_directories"]
            if load is None:
                step = "session/new"
                result = await self.conn.request("session/new", params)
                result = result if isinstance(result, dict) else {}
                self.acp_session_id = str(result.get("sessionId") or "")
                if not self.acp_session_id:
                    raise RpcError(INTERNAL_ERROR, "session/new returned no sessionId")
            else:
                self.acp_session_id = load["acp_session_id"]
                params["sessionId"] = self.acp_session_id
                if load["replay"]:
                    step = "session/load"
                    self.replaying = True
                    try:
                        result = await self.conn.request("session/load", params)
                    finally:
                        self.replaying = False
                        self._chunk_key = None
                else:
                    step = "session/resume"
                    result = await self.conn.request("session/resume", params)
                result = result if isinstance(result, dict) else {}
            self._take_session_result(result)
        except (RpcError, ConnectionLost) as e:
            error = self._agent_failure(e, step)
            self.fail({"code": error.code, "message": error.message})
            raise error from None
        finally:
            if timer.active():
                timer.cancel()
        self.set_state("idle")
        self._touch()

    def _take_session_result(self, result: dict[str, Any]) -> None:
        if isinstance(result.get("modes"), dict):
            self.modes = result["modes"]
        if isinstance(result.get("configOptions"), list):
            self.config_options = result["configOptions"]
        if isinstance(result.get("models"), dict):
            self.models = result["models"]

    def _init_timeout(self) -> None:
        self._init_timed_out = True
        self.error = {
            "code": "agent_timeout",
            "message": "the agent did not start in time",
        }
        self.process.kill()

    # -- configuration -------------------------------------------------------

    @staticmethod
    def check_mode(mode: Any, rule: EffectiveRule) -> None:
        """403 ``param_not_allowed`` for a mode the policy forbids."""
        if mode is None:
            return
        if not isinstance(mode, str):
            raise ApiError(
                400, "'mode' must be a string", "ValueError", "invalid_param"
            )
        params = rule.params
        if mode in params.deny_modes:
            raise forbidden(
                f"the mode {mode!r} skips permission requests and is not allowed",
                "param_not_allowed",
                rule=rule.source("params.deny_modes") or "default:params.deny_modes",
            )
        if params.allow_modes is not None and mode not in params.allow_modes:
            raise forbidden(
                f"the mode {mode!r} is not in the allowed list",
                "param_not_allowed",
                rule=rule.source("params.allow_modes"),
            )

    async def configure(
        self, body: dict[str, Any], rule: EffectiveRule
    ) -> dict[str, Any]:
        """``mode``, ``model``, ``config`` and ``title``, in that order."""
        mode = body.get("mode")
        model = body.get("model")
        config = body.get("config")
        title = body.get("title")
        self.check_mode(mode, rule)
        if config is not None and not isinstance(config, dict):
            raise ApiError(
                400,
                "'config' must be an object of option id: value",
                "ValueError",
                "invalid_param",
            )
        for value in (config or {}).values():
            if isinstance(value, str):
                self.check_mode(value, rule)
        if title is not None and not isinstance(title, str):
            raise ApiError(
                400, "'title' must be a string", "ValueError", "invalid_param"
            )
        self.require_live()
        try:
            if mode is not None:
                available = [
                    m.get("id")
                    for m in (self.modes or {}).get("availableModes", [])
                    if isinstance(m, dict)
                ]
                if self.modes is not None and mode not in available:
                    raise ApiError(
                        400,
                        f"unknown mode {mode!r}; available: {', '.join(map(str, available))}",
                        "ValueError",
                        "invalid_param",
                    )
                await self.conn.request(
                    "session/set_mode",
                    {"sessionId": self.acp_session_id, "modeId": mode},
                )
                if self.modes is not None:
                    self.modes = {**self.modes, "currentModeId": mode}
                self.emit("mode", current_mode_id=mode, by="client")
            if model is not None:
                if not isinstance(model, str):
                    raise ApiError(
                        400, "'model' must be a string", "ValueError", "invalid_param"
                    )
                option = next(
                    (
                        o
                        for o in self.config_options or []
                        if isinstance(o, dict) and o.get("category") == "model"
                    ),
                    None,
                )
                if option is not None:
                    await self._set_option(option["id"], model)
                else:
                    try:
                        await self.conn.request(
                            "session/set_model",
                            {"sessionId": self.acp_session_id, "modelId": model},
                        )
                    except RpcError as e:
                        if e.code == METHOD_NOT_FOUND:
                            raise ApiError(
                                400,
                                "this agent's model is not switchable",
                                "ValueError",
                                "invalid_param",
                            ) from None
                        raise
                    if self.models is not None:
                        self.models = {**self.models, "currentModelId": model}
            for config_id, value in (config or {}).items():
                await self._set_option(config_id, value)
        except RpcError as e:
            raise agent_refused("the change", e) from None
        except ConnectionLost:
            raise ApiError(
                503, "the agent has exited", "RuntimeError", "agent_unavailable"
            ) from None
        if title is not None:
            self.title = title
            self.emit("session.info", title=title, by="client")
        return {
            "modes": self.modes,
            "config_options": self.config_options,
            "models": self.models,
            "title": self.title,
        }

    async def _set_option(self, config_id: Any, value: Any) -> None:
        option = next(
            (
                o
                for o in self.config_options or []
                if isinstance(o, dict) and o.get("id") == config_id
            ),
            None,
        )
        if self.config_options is not None and option is None:
            raise ApiError(
                400,
                f"unknown config option {config_id!r}",
                "ValueError",
                "invalid_param",
            )
        params: dict[str, Any] = {
            "sessionId": self.acp_session_id,
            "configId": config_id,
            "value": value,
        }
        if isinstance(value, bool):
            params["type"] = "boolean"
        result = await self.conn.request("session/set_config_option", params)
        if isinstance(result, dict) and isinstance(result.get("configOptions"), list):
            self.config_options = result["configOptions"]
        self.emit("config", config_options=self.config_options, by="client")

    # -- prompts -----------------------------------------------------------

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
        _bounded_put(self.turns, turn.turn_id, turn)
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
        waiters, turn.waiters = turn.waiters, []
        for d in waiters:
            d.callback(None)

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
                if (
                    tc.get("turn_id") == turn.turn_id
                    and tc.get("status") in _UNFINISHED
                ):
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
        d: Deferred[None] = Deferred()
        if self.log.closed:
            d.callback(None)
        else:
            self._closed_waiters.append(d)
        return within(self.reactor, d, defaults.KILL_GRACE_SECONDS + 2)

    def fail(self, error: dict[str, Any]) -> None:
        """The session cannot go on: record why and end the agent's tree."""
        if self.error is None:
            self.error = error
        if not self.process.exited:
            self.process.kill()

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
        waiters, self._closed_waiters = self._closed_waiters, []
        for d in waiters:
            d.callback(None)

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

    # -- session/update --------------------------------------------------------

    def _update(self, update: dict[str, Any], raw: Any) -> None:
        kind = update.get("sessionUpdate")
        if kind in ("user_message_chunk", "agent_message_chunk", "agent_thought_chunk"):
            role = {
                "user_message_chunk": "user",
                "agent_message_chunk": "agent",
                "agent_thought_chunk": "thought",
            }[kind]
            content = update.get("content")
            message_id = update.get("messageId")
            key = (role, message_id, self.current.turn_id if self.current else None)
            if (
                message_id is None
                and self._chunk_key is not None
                and self._chunk_key[:1] == (role,)
                and self._chunk_key[2] == key[2]
            ):
                message_id = self._chunk_key[1]
            if message_id is None:
                message_id = f"{role}_{next(self._message_ids)}"
            seq = self.emit(
                "message.delta",
                raw=raw,
                role=role,
                message_id=message_id,
                content=content,
            )
            self._chunk_key = (role, message_id, key[2])
            self._fold_message(role, message_id, content, seq)
            if (
                role == "agent"
                and self.current is not None
                and isinstance(content, dict)
                and content.get("type") == "text"
            ):
                self.current.text.append(str(content.get("text", "")))
        elif kind == "tool_call":
            self._tool_call(update, raw, new=True)
        elif kind == "tool_call_update":
            self._tool_call(update, raw, new=False)
        elif kind == "plan":
            entries: list[dict[str, Any]] = [
                e for e in update.get("entries") or [] if isinstance(e, dict)
            ]
            self.plan = entries
            self.plan_seq = self.emit("plan", raw=raw, entries=entries)
        elif kind == "available_commands_update":
            commands = update.get("availableCommands")
            self.commands = commands if isinstance(commands, list) else []
            self.emit("commands", raw=raw, commands=self.commands)
        elif kind == "current_mode_update":
            mode = update.get("currentModeId")
            if self.modes is not None:
                self.modes = {**self.modes, "currentModeId": mode}
            else:
                self.modes = {"currentModeId": mode, "availableModes": []}
            self.emit("mode", raw=raw, current_mode_id=mode, by="agent")
        elif kind == "config_option_update":
            options = update.get("configOptions")
            if isinstance(options, list):
                self.config_options = options
            self.emit("config", raw=raw, config_options=self.config_options, by="agent")
        elif kind == "session_info_update":
            if "title" in update:
                self.agent_title = update.get("title")
            self.emit(
                "session.info",
                raw=raw,
                title=update.get("title"),
                updated_at=update.get("updatedAt"),
            )
        elif kind == "usage_update":
            self.usage = {
                k: update.get(k) for k in ("used", "size", "cost") if k in update
            }
            if self.current is not None:
                self.current.usage = self.usage
            self.emit("usage", raw=raw, **self.usage)
        else:
            self.emit("unknown", raw=raw, reason=f"session update {kind!r}")

    def _fold_message(self, role: str, message_id: str, content: Any, seq: int) -> None:
        turn_id = self.current.turn_id if self.current else None
        last = self.messages[-1] if self.messages else None
        target = None
        if (
            last is not None
            and last["message_id"] == message_id
            and last["role"] == role
        ):
            target = last
        else:
            for m in reversed(self.messages[-16:]):
                if (
                    m["message_id"] == message_id
                    and m["role"] == role
                    and m["turn_id"] == turn_id
                ):
                    target = m
                    break
        if target is None:
            target = {
                "message_id": message_id,
                "turn_id": turn_id,
                "role": role,
                "content": [],
                "tool_call_ids": [],
                "seq_from": seq,
                "seq_to": seq,
            }
            self.messages.append(target)
            if self.replaying:
                target["replay"] = True
            if len(self.messages) > defaults.AGENT_KEPT_ITEMS:
                del self.messages[0]
        target["seq_to"] = seq
        blocks = target["content"]
        if (
            isinstance(content, dict)
            and content.get("type") == "text"
            and blocks
            and blocks[-1].get("type") == "text"
        ):
            blocks[-1] = {
                **blocks[-1],
                "text": str(blocks[-1].get("text", "")) + str(content.get("text", "")),
            }
        elif isinstance(content, dict):
            blocks.append(dict(content))

    def _tool_call(self, update: dict[str, Any], raw: Any, new: bool) -> None:
        tool_call_id = update.get("toolCallId")
        if not isinstance(tool_call_id, str):
            self.emit("unknown", raw=raw, reason="tool call without toolCallId")
            return
        snapshot = self.tool_calls.get(tool_call_id)
        turn_id = self.current.turn_id if self.current else None
        if new and snapshot is not None and snapshot.get("turn_id") != turn_id:
            # Agents number tool calls per turn; a new start is a new call.
            snapshot = None
        created = snapshot is None
        if snapshot is None:
            snapshot = {
                "toolCallId": tool_call_id,
                "title": None,
                "kind": "other",
                "status": "pending",
                "content": [],
                "locations": [],
                "rawInput": None,
                "rawOutput": None,
                "turn_id": self.current.turn_id if self.current else None,
                "permission": [],
                "first_seq": self.log.last_seq + 1,
                "last_seq": None,
            }
            _bounded_put(self.tool_calls, tool_call_id, snapshot)
            if self.current is not None:
                self.current.tool_call_ids.append(tool_call_id)
                for m in reversed(self.messages):
                    if m["turn_id"] == self.current.turn_id and m["role"] == "agent":
                        m["tool_call_ids"].append(tool_call_id)
                        break
        delta = {k: v for k, v in update.items() if k != "sessionUpdate"}
        for key, value in delta.items():
            if key != "toolCallId" and value is not None:
                snapshot[key] = value
        if new or created:
            seq = self.emit(
                "tool_call",
                raw=raw,
                tool_call_id=tool_call_id,
                title=snapshot.get("title"),
                kind=snapshot.get("kind"),
                status=snapshot.get("status"),
                locations=snapshot.get("locations"),
                content=snapshot.get("content"),
            )
        else:
            seq = self.emit(
                "tool_call.update",
                raw=raw,
                tool_call_id=tool_call_id,
                delta=delta,
                status=snapshot.get("status"),
            )
        snapshot["last_seq"] = seq
        self._note_changes(snapshot)

    def _note_changes(self, snapshot: dict[str, Any]) -> None:
        for item in snapshot.get("content") or []:
            if (
                isinstance(item, dict)
                and item.get("type") == "diff"
                and isinstance(item.get("path"), str)
            ):
                change = "created" if item.get("oldText") is None else "modified"
                self._file(
                    item["path"],
                    change,
                    "diff",
                    snapshot["toolCallId"],
                    diff=(item.get("oldText"), item.get("newText")),
                )
        kind = snapshot.get("kind")
        if kind in ("edit", "delete", "move"):
            change = {"edit": "modified", "delete": "deleted", "move": "moved"}[kind]
            for location in snapshot.get("locations") or []:
                if isinstance(location, dict) and isinstance(location.get("path"), str):
                    self._file(
                        location["path"], change, "location", snapshot["toolCallId"]
                    )

    def _file(
        self,
        path: str,
        change: str,
        source: str,
        tool_call_id: str | None,
        diff: tuple[Any, Any] | None = None,
        written: clientside.Written | None = None,
    ) -> None:
        record = self.files.get(path)
        if record is None:
            record = {
                "path": path,
                "change": change,
                "sources": [],
                "tool_call_ids": [],
                "turn_ids": [],
                "sha256": None,
                "bytes": None,
                "old_text": None,
                "new_text": None,
                "had_pre_image": False,
            }
            _bounded_put(self.files, path, record)
        elif source != "location" or record["change"] not in ("created",):
            if not (record["change"] == "created" and change == "modified"):
                record["change"] = change
        if source not in record["sources"]:
            record["sources"].append(source)
        if tool_call_id and tool_call_id not in record["tool_call_ids"]:
            record["tool_call_ids"].append(tool_call_id)
        turn_id = self.current.turn_id if self.current else None
        if turn_id and turn_id not in record["turn_ids"]:
            record["turn_ids"].append(turn_id)
        if diff is not None and not record["had_pre_image"]:
            if record["old_text"] is None:
                record["old_text"] = diff[0]
            record["new_text"] = diff[1]
        if written is not None:
            record["sha256"] = written.sha256
            record["bytes"] = written.bytes
            if not record["had_pre_image"]:
                record["old_text"] = written.old_text
                record["had_pre_image"] = True
            record["new_text"] = None

    # -- held requests -----------------------------------------------------------

    def _hold(self, held: HeldRequest) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()

        def answer(result: dict[str, Any]) -> None:
            if not d.called:
                d.callback(result)

        held.answer = answer
        self.pending[held.request_id] = held
        self._held_by_rpc[held.rpc_id] = held
        self.manager.register_request(held)
        if self.state == "running":
            self.set_state("awaiting_input")
        return d

    def _resolve(
        self,
        held: HeldRequest,
        outcome: dict[str, Any],
        by: str,
        identity: str | None = None,
        send: bool = True,
        state: str = "resolved",
        result: dict[str, Any] | None = None,
    ) -> None:
        if held.state != "pending":
            return
        held.state = state
        held.outcome = outcome
        held.by = by
        if held.timer is not None and held.timer.active():
            held.timer.cancel()
        self.pending.pop(held.request_id, None)
        self._held_by_rpc.pop(held.rpc_id, None)
        if send:
            held.answer(result if result is not None else {"outcome": outcome})
        fields: dict[str, Any] = {"request_id": held.request_id, "by": by}
        if identity is not None:
            fields["identity"] = identity
        if held.kind == "permission":
            fields["outcome"] = outcome.get("outcome")
            fields["option_id"] = outcome.get("optionId")
            if held.policy:
                fields["rule"] = held.policy.get("rule")
            tc = self.tool_calls.get((held.tool_call or {}).get("toolCallId", ""))
            if tc is not None:
                tc["permission"].append({"request_id": held.request_id, **fields})
            self.emit("permission.resolved", turn_id=held.turn_id, **fields)
        else:
            fields["action"] = outcome.get("action")
            self.emit("question.resolved", turn_id=held.turn_id, **fields)
        if not self.pending and self.state == "awaiting_input":
            self.set_state("running")

    def _withdraw(self, held: HeldRequest) -> None:
        """The agent took the request back (or exited): no answer is sent."""
        self._resolve(
            held, {"outcome": "cancelled"}, "withdrawn", send=False, state="withdrawn"
        )

    def _resolve_cancelled(self, held: HeldRequest, by: str) -> None:
        if held.kind == "permission":
            self._resolve(held, {"outcome": "cancelled"}, by)
        else:
            self._resolve(held, {"action": "cancel"}, by, result={"action": "cancel"})

    def reply(
        self,
        held: HeldRequest,
        body: dict[str, Any],
        identity: str,
        rule: EffectiveRule,
    ) -> dict[str, Any]:
        """A human's answer to a held request (``agents_request_reply``)."""
        if held.state == "withdrawn":
            raise ApiError(
                409,
                "the agent withdrew this request",
                "RuntimeError",
                "withdrawn",
                request_id=held.request_id,
            )
        if held.state != "pending":
            raise ApiError(
                409,
                "the request is already resolved",
                "RuntimeError",
                "already_resolved",
                request_id=held.request_id,
                outcome=held.outcome,
                by=held.by,
            )
        if held.kind == "question":
            action = body.get("action")
            if action not in ("accept", "decline", "cancel"):
                raise ApiError(
                    400,
                    "'action' must be accept, decline or cancel",
                    "ValueError",
                    "invalid_param",
                )
            result: dict[str, Any] = {"action": action}
            if action == "accept" and body.get("content") is not None:
                if not isinstance(body["content"], dict):
                    raise ApiError(
                        400,
                        "'content' must be an object",
                        "ValueError",
                        "invalid_param",
                    )
                result["content"] = body["content"]
            self._resolve(held, dict(result), "identity", identity, result=result)
            return {
                "request_id": held.request_id,
                "state": held.state,
                "outcome": result,
            }
        if body.get("cancel") is True:
            self._resolve(held, {"outcome": "cancelled"}, "identity", identity)
            return {
                "request_id": held.request_id,
                "state": held.state,
                "outcome": held.outcome,
            }
        option = None
        if "option_id" in body:
            option = next(
                (o for o in held.options if o.get("optionId") == body["option_id"]),
                None,
            )
            if option is None:
                raise ApiError(
                    400,
                    f"unknown option {body['option_id']!r}; options: {', '.join(str(o.get('optionId')) for o in held.options)}",
                    "ValueError",
                    "invalid_param",
                )
        elif "decision" in body:
            decision = body["decision"]
            if decision not in DECISIONS:
                raise ApiError(
                    400,
                    f"'decision' must be one of {', '.join(DECISIONS)}",
                    "ValueError",
                    "invalid_param",
                )
            option = first_option(held.options, decision)
            if option is None:
                raise ApiError(
                    400,
                    f"the agent offered no {decision} option",
                    "ValueError",
                    "invalid_param",
                )
        else:
            raise ApiError(
                400,
                "give 'option_id', 'decision' or 'cancel'",
                "ValueError",
                "invalid_param",
            )
        if (
            option.get("kind") in ("allow_always", "reject_always")
            and not rule.params.allow_always
        ):
            raise forbidden(
                "'always' answers are not allowed",
                "param_not_allowed",
                rule=rule.source("params.allow_always") or "policy:params.allow_always",
            )
        outcome = {"outcome": "selected", "optionId": option.get("optionId")}
        self._resolve(held, outcome, "identity", identity)
        return {"request_id": held.request_id, "state": held.state, "outcome": outcome}

    def _permission(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        raw_update = params.get("toolCall")
        update: dict[str, Any] = raw_update if isinstance(raw_update, dict) else {}
        options = [o for o in params.get("options") or [] if isinstance(o, dict)]
        tool_call_id = update.get("toolCallId")
        if isinstance(tool_call_id, str):
            merged = {**update, "sessionUpdate": "tool_call_update"}
            self._tool_call(merged, None, new=False)
            tool_call = dict(self.tool_calls.get(tool_call_id) or update)
        else:
            tool_call = dict(update)
        held = self._new_held(
            "permission", rpc_id, tool_call=tool_call, options=options
        )
        refusal = path_refusal(self.rule, tool_call)
        if refusal is not None:
            decision, source = "deny", refusal.extra.get("rule") or "guard"
            held.policy = {"decision": "deny", "rule": source, "code": refusal.code}
        else:
            decision, source = mode_for(self.rule, tool_call.get("kind"))
            held.policy = {"decision": decision, "rule": source}
        d = self._hold(held)
        self.emit(
            "permission.requested",
            raw=params,
            request_id=held.request_id,
            tool_call_id=tool_call_id,
            title=tool_call.get("title"),
            kind=tool_call.get("kind"),
            options=held.describe()["options"],
            policy=held.policy,
        )
        if decision == "auto":
            option = first_option(options, "allow_once")
            if option is not None:
                self._resolve(
                    held,
                    {"outcome": "selected", "optionId": option.get("optionId")},
                    "policy",
                )
                return d
            decision = "ask"
        if decision == "deny":
            self._reject(held, "policy")
            return d
        self._arm_timeout(held)
        return d

    def _new_held(self, kind: str, rpc_id: Any, **fields: Any) -> HeldRequest:
        """A held permission request or question, with its deadline."""
        now = time.time()
        timeout = self.rule.limits.permission_timeout_seconds
        return HeldRequest(
            request_id=new_request_id(),
            kind=kind,
            session_id=self.session_id,
            rpc_id=rpc_id,
            turn_id=self.current.turn_id if self.current else None,
            created_at=now,
            deadline=now + timeout if timeout else None,
            answer=lambda result: None,
            **fields,
        )

    def _arm_timeout(self, held: HeldRequest) -> None:
        """Answer for the human once ``permission_timeout_seconds`` passes."""
        timeout = self.rule.limits.permission_timeout_seconds
        if timeout:
            held.timer = self.reactor.callLater(timeout, self._permission_timeout, held)

    def _permission_timeout(self, held: HeldRequest) -> None:
        held.timer = None
        if held.state != "pending":
            return
        action = self.rule.params.permission_timeout_action
        if held.kind == "question":
            self._resolve(
                held, {"action": "cancel"}, "timeout", result={"action": "cancel"}
            )
            return
        if action == "cancel_turn":
            self._resolve(held, {"outcome": "cancelled"}, "timeout")
            self.cancel("permission_timeout")
            return
        self._reject(held, "timeout")

    def _reject(self, held: HeldRequest, by: str) -> None:
        """Answer with the agent's first reject option, or cancel when it offers none."""
        option = first_option(held.options, "reject_once", "reject_always")
        if option is not None:
            self._resolve(
                held, {"outcome": "selected", "optionId": option.get("optionId")}, by
            )
        else:
            self._resolve(held, {"outcome": "cancelled"}, by)

    def _question(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        held = self._new_held(
            "question",
            rpc_id,
            message=str(params.get("message") or ""),
            requested_schema=params.get("requestedSchema")
            if params.get("mode", "form") == "form"
            else {"url": params.get("url")},
            policy={"decision": "ask", "rule": None},
        )
        d = self._hold(held)
        self.emit(
            "question.requested",
            raw=params,
            request_id=held.request_id,
            message=held.message,
            requested_schema=held.requested_schema,
            mode=params.get("mode", "form"),
        )
        self._arm_timeout(held)
        return d

    def _cancel_request(self, rpc_id: Any) -> None:
        held = self._held_by_rpc.get(rpc_id)
        if held is not None:
            self._withdraw(held)
            self.conn.respond_error(
                rpc_id, RpcError(REQUEST_CANCELLED, "request cancelled")
            )
            return
        waiter = self._rpc_waiters.pop(rpc_id, None)
        if waiter is not None and not waiter.called:
            waiter.errback(RpcError(REQUEST_CANCELLED, "request cancelled"))

    # -- fs/* ------------------------------------------------------------------

    def _fs_read(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        if self.rule.params.client_fs not in ("read", "read_write"):
            raise RpcError(METHOD_NOT_FOUND, "Method not found: fs/read_text_file")
        cap = self.rule.limits.max_bytes or self.max_message_bytes // 2
        return clientside.read_text_file(self.rule, params, cap)

    def _fs_write(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        if self.rule.params.client_fs != "read_write":
            raise RpcError(METHOD_NOT_FOUND, "Method not found: fs/write_text_file")
        cap = self.rule.limits.max_bytes or self.max_message_bytes
        owner = (self.run_as.uid, self.run_as.gid) if self.run_as else None
        written = clientside.write_text_file(self.rule, params, cap, owner)
        tool_call_id = self._active_tool_call(written.path, params.get("path"))
        self._file(
            written.path,
            "created" if written.created else "modified",
            "fs_write",
            tool_call_id,
            written=written,
        )
        self.emit(
            "file.written",
            path=written.path,
            bytes=written.bytes,
            sha256=written.sha256,
            created=written.created,
            tool_call_id=tool_call_id,
        )
        return {}

    def _active_tool_call(self, *paths: Any) -> str | None:
        turn_id = self.current.turn_id if self.current else None
        fallback = None
        for tc in reversed(self.tool_calls.values()):
            if tc.get("turn_id") != turn_id:
                continue
            named = {
                loc.get("path")
                for loc in tc.get("locations") or []
                if isinstance(loc, dict)
            }
            named.update(
                c.get("path") for c in tc.get("content") or [] if isinstance(c, dict)
            )
            if any(p in named for p in paths if p):
                return str(tc["toolCallId"])
            if fallback is None and tc.get("status") in _UNFINISHED:
                fallback = str(tc["toolCallId"])
        return fallback

    # -- terminal/* ------------------------------------------------------------

    def _terminal(self, params: dict[str, Any]) -> AgentTerminal:
        terminal_id = params.get("terminalId")
        terminal = (
            self.terminals.get(terminal_id) if isinstance(terminal_id, str) else None
        )
        if terminal is None or terminal.released:
            raise RpcError(INVALID_PARAMS, f"unknown terminal {terminal_id!r}")
        return terminal

    def _terminal_create(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        if not self.rule.params.client_terminal:
            raise RpcError(METHOD_NOT_FOUND, "Method not found: terminal/create")
        limit = self.rule.limits.max_terminals or 8
        live = [t for t in self.terminals.values() if not t.released]
        if len(live) >= limit:
            raise RpcError(
                INTERNAL_ERROR,
                f"too many terminals (limit max_terminals={limit}); release one first",
                {"code": "too_many_terminals", "limit": limit},
            )
        command = params.get("command")
        args = params.get("args") or []
        if not isinstance(command, str) or not command or not isinstance(args, list):
            raise RpcError(
                INVALID_PARAMS,
                "'command' must be a string and 'args' a list of strings",
            )
        args = [str(a) for a in args]
        try:
            check_command_allowed(self.rule, [command])
            cwd = PathGuard(self.rule).cwd(params.get("cwd") or self.cwd)
        except ApiError as e:
            raise clientside.refusal_error(e) from None
        extra: dict[str, str] = {}
        for item in params.get("env") or []:
            if (
                isinstance(item, dict)
                and isinstance(item.get("name"), str)
                and "=" not in item["name"]
            ):
                extra[item["name"]] = str(item.get("value", ""))
        env = child_environment(self.context, self.rule, extra, base=self.env)
        executable = find_executable(command, env)
        if executable is None:
            raise RpcError(INTERNAL_ERROR, f"command not found: {command}")
        policy_cap = self.rule.limits.max_output_bytes or defaults.MIB
        wanted = params.get("outputByteLimit")
        output_limit = (
            min(wanted, policy_cap)
            if isinstance(wanted, int) and wanted > 0
            else policy_cap
        )
        terminal = AgentTerminal(
            self.reactor,
            f"term_{next(self._terminal_ids)}",
            command,
            args,
            cwd,
            output_limit,
            policy_cap,
            self._active_tool_call(),
            self._terminal_exited,
        )
        try:
            terminal.start(executable, env, self.run_as)
        except OSError as e:
            raise RpcError(
                INTERNAL_ERROR, f"cannot start {command}: {e.strerror}"
            ) from None
        _bounded_put(self.terminals, terminal.terminal_id, terminal)
        self.emit(
            "terminal.started",
            terminal_id=terminal.terminal_id,
            command=command,
            args=args,
            cwd=cwd,
            pid=terminal.pid,
            tool_call_id=terminal.tool_call_id,
        )
        return {"terminalId": terminal.terminal_id}

    def _terminal_exited(self, terminal: AgentTerminal) -> None:
        self.emit(
            "terminal.exited",
            terminal_id=terminal.terminal_id,
            exit_code=terminal.exit_code,
            signal=terminal.signal,
            truncated=terminal.truncated,
        )

    def _terminal_output(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        return self._terminal(params).output()

    def _terminal_wait(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        terminal = self._terminal(params)
        d: Deferred[Any] = Deferred()
        self._rpc_waiters[rpc_id] = d

        def exited(_: Any) -> None:
            self._rpc_waiters.pop(rpc_id, None)
            if not d.called:
                d.callback(terminal.exit_status() or {})

        terminal.wait().addCallback(exited)
        return d

    def _terminal_kill(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        self._terminal(params).kill()
        return {}

    def _terminal_release(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        terminal = self._terminal(params)
        terminal.kill()
        terminal.released = True
        self.emit("terminal.released", terminal_id=terminal.terminal_id)
        return {}

    _REQUESTS: dict[str, Callable[[AgentSession, Any, dict[str, Any]], Any]] = {
        "session/request_permission": _permission,
        "elicitation/create": _question,
        "fs/read_text_file": _fs_read,
        "fs/write_text_file": _fs_write,
        "terminal/create": _terminal_create,
        "terminal/output": _terminal_output,
        "terminal/wait_for_exit": _terminal_wait,
        "terminal/kill": _terminal_kill,
        "terminal/release": _terminal_release,
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

    def tool_call_view(
        self, tc: dict[str, Any], full: bool = False, unified: bool = False
    ) -> dict[str, Any]:
        """One tool call, summarised or whole."""
        content = tc.get("content") or []
        diffs = [c for c in content if isinstance(c, dict) and c.get("type") == "diff"]
        out: dict[str, Any] = {
            "tool_call_id": tc["toolCallId"],
            "turn_id": tc.get("turn_id"),
            "title": tc.get("title"),
            "kind": tc.get("kind"),
            "status": tc.get("status"),
            "locations": tc.get("locations") or [],
            "has_diff": bool(diffs),
            "terminal_ids": [
                c.get("terminalId")
                for c in content
                if isinstance(c, dict) and c.get("type") == "terminal"
            ]
            + [
                t.terminal_id
                for t in self.terminals.values()
                if t.tool_call_id == tc["toolCallId"]
            ],
            "permission": (tc.get("permission") or [None])[-1],
            "first_seq": tc.get("first_seq"),
            "last_seq": tc.get("last_seq"),
        }
        if full:
            out["content"] = content
            out["raw_input"] = tc.get("rawInput")
            out["raw_output"] = tc.get("rawOutput")
            out["permission_history"] = tc.get("permission") or []
            out["diffs"] = []
            for d in diffs:
                item = {
                    "path": d.get("path"),
                    "old_text": d.get("oldText"),
                    "new_text": d.get("newText"),
                }
                if unified:
                    item["unified"] = unified_diff(
                        d.get("path"), d.get("oldText"), d.get("newText")
                    )
                out["diffs"].append(item)
        return out

    def file_view(self, record: dict[str, Any], with_diff: bool) -> dict[str, Any]:
        """One changed file."""
        out = {
            k: record[k]
            for k in ("path", "change", "sources", "tool_call_ids", "sha256", "bytes")
        }
        if with_diff:
            new_text = record["new_text"]
            if new_text is None and "fs_write" in record["sources"]:
                try:
                    with open(record["path"], "rb") as f:
                        new_text = f.read(clientside.PRE_IMAGE_BYTES).decode(
                            "utf-8", "replace"
                        )
                except OSError:
                    new_text = ""
            out["diff"] = (
                unified_diff(record["path"], record["old_text"], new_text)
                if new_text is not None
                else None
            )
        return out


def unified_diff(path: Any, old: Any, new: Any) -> str:
    """A unified diff of two texts (``None`` old text is a new file)."""
    old_lines = str(old).splitlines(keepends=True) if old is not None else []
    new_lines = str(new).splitlines(keepends=True) if new is not None else []
    name = str(path)
    text = "".join(
        difflib.unified_diff(
            old_lines, new_lines, "/dev/null" if old is None else f"a{name}", f"b{name}"
        )
    )
    return text[: clientside.PRE_IMAGE_BYTES]
