# -*- test-case-name: tests.agents.test_agents -*-
"""
A session's mode, model, config options and title (``agents_session_config``,
and the ``mode`` given at creation), checked against the policy's
``allow_modes``/``deny_modes`` before the agent is asked.
"""

from __future__ import annotations

from typing import Any

from sandboxd.agents.handshake import agent_refused
from sandboxd.agents.state import SessionState
from sandboxd.errors import (
    Code,
    agent_unavailable,
    bad_request,
    forbidden,
    policy_rule,
)
from sandboxd.jsonrpc import METHOD_NOT_FOUND, ConnectionLost, RpcError
from sandboxd.policy.rules import EffectiveRule


def check_mode(mode: Any, rule: EffectiveRule) -> None:
    """403 ``param_not_allowed`` for a mode the policy forbids."""
    if mode is None:
        return
    if not isinstance(mode, str):
        raise bad_request("'mode' must be a string")
    params = rule.params
    if mode in params.deny_modes:
        raise forbidden(
            f"the mode {mode!r} skips permission requests and is not allowed",
            Code.PARAM_NOT_ALLOWED,
            rule=policy_rule(rule, "params.deny_modes"),
        )
    if params.allow_modes is not None and mode not in params.allow_modes:
        raise forbidden(
            f"the mode {mode!r} is not in the allowed list",
            Code.PARAM_NOT_ALLOWED,
            rule=rule.source("params.allow_modes"),
        )


class Configuration:
    """Changing what the agent runs with: the session's modes, models, options, title."""

    def __init__(self, session: SessionState) -> None:
        self.session = session

    async def configure(
        self, body: dict[str, Any], rule: EffectiveRule
    ) -> dict[str, Any]:
        """
        ``mode``, ``model``, ``config``, ``thought_level`` (the value of the
        agent's option of that category: a reasoning effort) and ``title``,
        in that order.
        """
        s = self.session
        mode = body.get("mode")
        model = body.get("model")
        config = body.get("config")
        title = body.get("title")
        thought_level = body.get("thought_level")
        if thought_level is not None and not isinstance(thought_level, str):
            raise bad_request("'thought_level' must be a string")
        check_mode(mode, rule)
        if config is not None and not isinstance(config, dict):
            raise bad_request("'config' must be an object of option id: value")
        for value in (config or {}).values():
            if isinstance(value, str):
                check_mode(value, rule)
        if title is not None and not isinstance(title, str):
            raise bad_request("'title' must be a string")
        s.require_live()
        try:
            if mode is not None:
                available = [
                    m.get("id")
                    for m in (s.modes or {}).get("availableModes", [])
                    if isinstance(m, dict)
                ]
                if s.modes is not None and mode not in available:
                    raise bad_request(
                        f"unknown mode {mode!r}; available: {', '.join(map(str, available))}"
                    )
                await s.ask(
                    "session/set_mode",
                    {"sessionId": s.acp_session_id, "modeId": mode},
                )
                if s.modes is not None:
                    s.modes = {**s.modes, "currentModeId": mode}
                s.emit("mode", current_mode_id=mode, by="client")
            if model is not None:
                if not isinstance(model, str):
                    raise bad_request("'model' must be a string")
                option = next(
                    (
                        o
                        for o in s.config_options or []
                        if isinstance(o, dict) and o.get("category") == "model"
                    ),
                    None,
                )
                if option is not None:
                    await self._set_option(option["id"], model)
                else:
                    try:
                        await s.ask(
                            "session/set_model",
                            {
                                "sessionId": s.acp_session_id,
                                "modelId": model,
                            },
                        )
                    except RpcError as e:
                        if e.code == METHOD_NOT_FOUND:
                            raise bad_request(
                                "this agent's model is not switchable"
                            ) from None
                        raise
                    if s.models is not None:
                        s.models = {
                            **s.models,
                            "currentModelId": model,
                        }
            for config_id, value in (config or {}).items():
                await self._set_option(config_id, value)
            if thought_level is not None:
                await self._set_option(self._thought_level_option(), thought_level)
        except RpcError as e:
            raise agent_refused("the change", e) from None
        except ConnectionLost:
            raise agent_unavailable("the agent has exited") from None
        if title is not None:
            s.title = title
            s.emit("session.info", title=title, by="client")
        return {
            "modes": s.modes,
            "config_options": s.config_options,
            "models": s.models,
            "title": s.title,
        }

    def _thought_level_option(self) -> Any:
        """The id of the agent's thought-level option (its reasoning effort)."""
        for option in self.session.config_options or []:
            if isinstance(option, dict) and option.get("category") == "thought_level":
                return option.get("id")
        raise bad_request(
            f"the agent {self.session.entry.id!r} has no reasoning effort setting",
            param="reasoning.effort",
        )

    async def _set_option(self, config_id: Any, value: Any) -> None:
        s = self.session
        option = next(
            (
                o
                for o in s.config_options or []
                if isinstance(o, dict) and o.get("id") == config_id
            ),
            None,
        )
        if s.config_options is not None and option is None:
            raise bad_request(f"unknown config option {config_id!r}")
        params: dict[str, Any] = {
            "sessionId": s.acp_session_id,
            "configId": config_id,
            "value": value,
        }
        if isinstance(value, bool):
            params["type"] = "boolean"
        result = await s.ask("session/set_config_option", params)
        if isinstance(result, dict) and isinstance(result.get("configOptions"), list):
            s.config_options = result["configOptions"]
        s.emit("config", config_options=s.config_options, by="client")
