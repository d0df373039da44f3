# -*- test-case-name: tests.agents.test_agents -*-
"""
Starting an agent session: spawn the child, then ``initialize`` →
[``authenticate``] → ``session/new`` (or ``session/load``/``session/resume``)
within ``init_timeout_seconds``; what the agent answers becomes the
session's capabilities, modes, config options and models.
"""

from __future__ import annotations

from typing import Any

from sandboxd.agents.state import IdleTimer, SessionState
from sandboxd.errors import ApiError, agent_error, agent_timeout, unsupported
from sandboxd.jsonrpc import INTERNAL_ERROR, ConnectionLost, RpcError
from sandboxd.policy.confinement import confinement_of

CLIENT_INFO = {"name": "sandboxd", "title": "sandboxd", "version": "1"}
PROTOCOL_VERSION = 1


def agent_refused(what: str, error: RpcError, **extra: Any) -> ApiError:
    """502 ``agent_error``: the agent answered ``what`` with a JSON-RPC error."""
    return agent_error(
        f"the agent refused {what}: {error.message}", rpc_error=error.as_json(), **extra
    )


class Handshake:
    """
    The agent child's start and the ACP handshake: what it answers becomes
    the session's capabilities, modes and models; the ``idle`` timer starts
    once it is done.
    """

    def __init__(self, session: SessionState, idle: IdleTimer) -> None:
        self.session = session
        self.idle = idle
        self._timed_out = False

    def spawn(self, argv: list[str], executable: str) -> None:
        """Start the agent child."""
        s = self.session
        s.process.spawn(
            executable,
            argv,
            s.env,
            s.cwd,
            s.run_as,
            confinement_of(s.rule, s.env.get("HOME")),
        )
        s.emit("session.state", state="starting", agent=s.entry.id, pid=s.process.pid)

    def client_capabilities(self) -> dict[str, Any]:
        """What sandboxd offers the agent, from ``client_fs``/``client_terminal``."""
        fs_mode = self.session.rule.params.client_fs
        return {
            "fs": {
                "readTextFile": fs_mode in ("read", "read_write"),
                "writeTextFile": fs_mode == "read_write",
            },
            "terminal": bool(self.session.rule.params.client_terminal),
            "elicitation": {"form": {}},
        }

    def _agent_failure(self, failure_value: Exception, step: str) -> ApiError:
        s = self.session
        tail = s.stderr.tail_text(2000)
        if self._timed_out:
            return agent_timeout(
                f"the agent did not answer {step} within {s.rule.limits.init_timeout_seconds} s",
                stderr_tail=tail,
            )
        if isinstance(failure_value, RpcError):
            return agent_refused(step, failure_value, stderr_tail=tail)
        return agent_error(
            f"the agent exited during {step}"
            + (
                f": {s.error['message']}"
                if s.error
                else f" (exit code {s.process.exit_code})"
            ),
            stderr_tail=tail,
        )

    async def run(
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
        s = self.session
        timeout = s.rule.limits.init_timeout_seconds or 30
        timer = s.reactor.callLater(timeout, self._init_timeout)
        step = "initialize"
        try:
            init = await s.conn.request(
                "initialize",
                {
                    "protocolVersion": PROTOCOL_VERSION,
                    "clientCapabilities": self.client_capabilities(),
                    "clientInfo": CLIENT_INFO,
                },
            )
            init = init if isinstance(init, dict) else {}
            s.protocol_version = init.get("protocolVersion")
            s.agent_info = init.get("agentInfo")
            caps = init.get("agentCapabilities")
            s.capabilities = caps if isinstance(caps, dict) else {}
            methods = init.get("authMethods")
            s.auth_methods = methods if isinstance(methods, list) else []
            if probe:
                return
            if (
                load is not None
                and load["replay"]
                and not s.capabilities.get("loadSession")
            ):
                refused = unsupported(
                    f"the agent {s.entry.id!r} cannot load a stored session "
                    "(its initialize says loadSession: false); "
                    "try replay: false if it can resume one",
                    "RuntimeError",
                )
                # Failed as any refused handshake is: listed with the reason.
                s.fail({"code": refused.code, "message": refused.message})
                raise refused
            if s.entry.auth_method and any(
                isinstance(m, dict) and m.get("id") == s.entry.auth_method
                for m in s.auth_methods
            ):
                step = "authenticate"
                await s.conn.request("authenticate", {"methodId": s.entry.auth_method})
            params: dict[str, Any] = {
                "cwd": s.cwd,
                "mcpServers": body.get("mcp_servers") or [],
            }
            if body.get("additional_directories"):
                params["additionalDirectories"] = body["additional_directories"]
            if load is None:
                step = "session/new"
                result = await s.conn.request("session/new", params)
                result = result if isinstance(result, dict) else {}
                s.acp_session_id = str(result.get("sessionId") or "")
                if not s.acp_session_id:
                    raise RpcError(INTERNAL_ERROR, "session/new returned no sessionId")
            else:
                s.acp_session_id = load["acp_session_id"]
                params["sessionId"] = s.acp_session_id
                if load["replay"]:
                    step = "session/load"
                    s.replaying = True
                    try:
                        result = await s.conn.request("session/load", params)
                    finally:
                        s.replaying = False
                        s.chunk_key = None
                else:
                    step = "session/resume"
                    result = await s.conn.request("session/resume", params)
                result = result if isinstance(result, dict) else {}
            self._take_session_result(result)
        except (RpcError, ConnectionLost) as e:
            error = self._agent_failure(e, step)
            s.fail({"code": error.code, "message": error.message})
            raise error from None
        finally:
            if timer.active():
                timer.cancel()
        s.set_state("idle")
        self.idle.touch()

    def _take_session_result(self, result: dict[str, Any]) -> None:
        s = self.session
        if isinstance(result.get("modes"), dict):
            s.modes = result["modes"]
        if isinstance(result.get("configOptions"), list):
            s.config_options = result["configOptions"]
        if isinstance(result.get("models"), dict):
            s.models = result["models"]

    def _init_timeout(self) -> None:
        self._timed_out = True
        self.session.error = {
            "code": "agent_timeout",
            "message": "the agent did not start in time",
        }
        self.session.process.kill()
