# -*- test-case-name: tests.agents.test_agents, tests.agents.test_process -*-
"""
The session's side of the agent's own commands (ACP ``terminal/*``, SPEC
§15.3): the ``client_terminal`` gate and ``max_terminals``, the command
checked like any other child's (allow/deny lists, guarded cwd, scrubbed
environment), and the session's table of its terminals.  Each command is
an :class:`~sandboxd.agents.terminals.AgentTerminal`.
"""

from __future__ import annotations

import itertools
from typing import Any

from twisted.internet.defer import Deferred

from sandboxd.access.guard import PathGuard
from sandboxd.agents.clientside import refusal_error
from sandboxd.agents.state import SessionState, bounded_put
from sandboxd.agents.terminals import AgentTerminal
from sandboxd.agents.updates import UpdateFolding
from sandboxd.errors import ApiError
from sandboxd.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, RpcError
from sandboxd.policy import defaults
from sandboxd.policy.confinement import confinement_of
from sandboxd.processes.command import check_command_allowed, find_executable
from sandboxd.processes.environment import child_environment


class TerminalRequests:
    """
    The session's ``terminal/*`` handlers, over its ``terminals``; a new
    terminal belongs to the tool call ``updates`` says is running.
    """

    def __init__(self, session: SessionState, updates: UpdateFolding) -> None:
        self.session = session
        self.updates = updates
        self._ids = itertools.count(1)

    def _find(self, params: dict[str, Any]) -> AgentTerminal:
        terminal_id = params.get("terminalId")
        terminal = (
            self.session.terminals.get(terminal_id)
            if isinstance(terminal_id, str)
            else None
        )
        if terminal is None or terminal.released:
            raise RpcError(INVALID_PARAMS, f"unknown terminal {terminal_id!r}")
        return terminal

    def create(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        """``terminal/create``: check, spawn and record a command."""
        s = self.session
        if not s.rule.params.client_terminal:
            raise RpcError(METHOD_NOT_FOUND, "Method not found: terminal/create")
        limit = s.rule.limits.max_terminals or 8
        live = [t for t in s.terminals.values() if not t.released]
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
            check_command_allowed(s.rule, [command, *args])
            cwd = PathGuard(s.rule).cwd(params.get("cwd") or s.cwd)
        except ApiError as e:
            raise refusal_error(e) from None
        extra: dict[str, str] = {}
        for item in params.get("env") or []:
            if (
                isinstance(item, dict)
                and isinstance(item.get("name"), str)
                and "=" not in item["name"]
            ):
                extra[item["name"]] = str(item.get("value", ""))
        env = child_environment(s.context, s.rule, extra, base=s.env)
        executable = find_executable(command, env)
        if executable is None:
            raise RpcError(INTERNAL_ERROR, f"command not found: {command}")
        policy_cap = s.rule.limits.max_output_bytes or defaults.MIB
        wanted = params.get("outputByteLimit")
        output_limit = (
            min(wanted, policy_cap)
            if isinstance(wanted, int) and wanted > 0
            else policy_cap
        )
        terminal = AgentTerminal(
            s.reactor,
            s.context.children,
            f"term_{next(self._ids)}",
            command,
            args,
            cwd,
            output_limit,
            policy_cap,
            self.updates.active_tool_call(),
            self._exited,
        )
        try:
            terminal.start(
                executable, env, s.run_as, confinement_of(s.rule, env.get("HOME"))
            )
        except OSError as e:
            raise RpcError(
                INTERNAL_ERROR, f"cannot start {command}: {e.strerror}"
            ) from None
        bounded_put(s.terminals, terminal.terminal_id, terminal)
        s.emit(
            "terminal.started",
            terminal_id=terminal.terminal_id,
            command=command,
            args=args,
            cwd=cwd,
            pid=terminal.pid,
            tool_call_id=terminal.tool_call_id,
        )
        return {"terminalId": terminal.terminal_id}

    def _exited(self, terminal: AgentTerminal) -> None:
        self.session.emit(
            "terminal.exited",
            terminal_id=terminal.terminal_id,
            exit_code=terminal.exit_code,
            signal=terminal.signal,
            truncated=terminal.truncated,
        )

    def output(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        """``terminal/output``."""
        return self._find(params).output()

    def wait_for_exit(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        """``terminal/wait_for_exit``: answered once the command has exited."""
        terminal = self._find(params)
        d: Deferred[Any] = Deferred()
        self.session.rpc_waiters[rpc_id] = d

        def exited(_: Any) -> None:
            self.session.rpc_waiters.pop(rpc_id, None)
            if not d.called:
                d.callback(terminal.exit_status() or {})

        terminal.wait().addCallback(exited)
        return d

    def kill(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        """``terminal/kill``."""
        self._find(params).kill()
        return {}

    def release(self, rpc_id: Any, params: dict[str, Any]) -> Any:
        """``terminal/release``: kill it and forget it for the agent."""
        terminal = self._find(params)
        terminal.kill()
        terminal.released = True
        self.session.emit("terminal.released", terminal_id=terminal.terminal_id)
        return {}
