# -*- test-case-name: tests.agents.test_agents -*-
"""
Which agents this sandbox knows (SPEC §15.2 ``agents_catalog``, §15.3).

The built-in entries pin their npm packages (names have moved twice; see
``notes/acp.md`` §3) and launch the binary the package installs; a policy
adds its own under the document's top-level ``agents.catalog``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs

from sandboxd.errors import Code, bad_request, forbidden, internal, not_found
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import find_executable


@attrs.frozen
class CatalogEntry:
    """One agent: how to start it and what it needs."""

    id: str
    name: str
    command: tuple[str, ...]
    source: str = "builtin"
    env: Mapping[str, str] = attrs.field(factory=dict)
    env_pass: tuple[str, ...] = ()
    env_required: tuple[str, ...] = ()
    auth_method: str | None = None
    package: str | None = None
    version: str | None = None

    def env_present(self, environ: Mapping[str, str]) -> dict[str, bool]:
        """Which of the keys it may need are set in the daemon's environment."""
        return {
            name: bool(environ.get(name)) for name in self.env_required or self.env_pass
        }

    def executable(self, environ: Mapping[str, str]) -> str | None:
        """``command[0]`` resolved against PATH, or None."""
        return find_executable(self.command[0], environ) if self.command else None


BUILTIN: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        id="claude",
        name="Claude Code (claude-agent-acp)",
        command=("claude-agent-acp",),
        env={"CLAUDE_AGENT_ACP_PROTOCOL": "v1"},
        env_pass=(
            "ANTHROPIC_API_KEY",
            "CLAUDE_CODE_OAUTH_TOKEN",
            "ANTHROPIC_BASE_URL",
            "ANTHROPIC_MODEL",
        ),
        env_required=("ANTHROPIC_API_KEY",),
        package="@agentclientprotocol/claude-agent-acp",
        version="0.101.0",
    ),
    CatalogEntry(
        id="codex",
        name="Codex (codex-acp)",
        command=("codex-acp",),
        env={"NO_BROWSER": "1"},
        env_pass=("OPENAI_API_KEY", "CODEX_API_KEY", "OPENAI_BASE_URL"),
        env_required=("OPENAI_API_KEY",),
        auth_method="api-key",
        package="@agentclientprotocol/codex-acp",
        version="2.6.0",
    ),
    CatalogEntry(
        id="gemini",
        name="Gemini CLI",
        command=("gemini", "--acp"),
        env_pass=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
        env_required=("GEMINI_API_KEY",),
        auth_method="gemini-api-key",
        package="@google/gemini-cli",
        version="0.61.0",
    ),
    CatalogEntry(
        id="opencode",
        name="opencode",
        command=("opencode", "acp"),
        env_pass=("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"),
        package="opencode-ai",
        version="1.18.33",
    ),
)


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise internal(f"policy agents.catalog: {where} must be a list of strings")
    return tuple(value)


def policy_entry(agent_id: str, raw: Any) -> CatalogEntry:
    """An entry from the policy's ``agents.catalog``."""
    if not isinstance(raw, dict):
        raise internal(f"policy agents.catalog.{agent_id} must be an object")
    command = _strings(raw.get("command"), f"{agent_id}.command")
    if not command:
        raise internal(f"policy agents.catalog.{agent_id}.command is empty")
    env = raw.get("env") or {}
    if not isinstance(env, dict):
        raise internal(f"policy agents.catalog.{agent_id}.env must be an object")
    install = raw.get("install") or {}
    return CatalogEntry(
        id=agent_id,
        name=str(raw.get("name") or agent_id),
        command=command,
        source="policy",
        env={str(k): str(v) for k, v in env.items()},
        env_pass=_strings(raw.get("env_pass"), f"{agent_id}.env_pass"),
        env_required=_strings(raw.get("env_required"), f"{agent_id}.env_required"),
        auth_method=raw.get("auth_method"),
        package=install.get("package") if isinstance(install, dict) else None,
        version=install.get("version") if isinstance(install, dict) else None,
    )


def entries(context: Any) -> list[CatalogEntry]:
    """Built-in entries, then the policy's (a policy entry replaces a built-in one)."""
    doc_agents = getattr(context.policy.document, "agents", None) or {}
    custom = doc_agents.get("catalog") or {}
    out = {e.id: e for e in BUILTIN}
    for agent_id, raw in custom.items():
        out[agent_id] = policy_entry(agent_id, raw)
    return list(out.values())


def allowed(entry: CatalogEntry, rule: EffectiveRule) -> bool:
    """Whether ``params.agents`` lets callers use it."""
    return rule.params.agents is None or entry.id in rule.params.agents


def find(
    context: Any, rule: EffectiveRule, agent_id: Any, require_allowed: bool = True
) -> CatalogEntry:
    """
    The entry for ``agent_id``.

    :raises ApiError: 404 ``not_found`` for an unknown id; 403
        ``param_not_allowed`` when the policy's ``params.agents`` omits it.
    """
    if not isinstance(agent_id, str) or not agent_id:
        raise bad_request("'agent' must be a catalogue id")
    for entry in entries(context):
        if entry.id == agent_id:
            if require_allowed and not allowed(entry, rule):
                raise forbidden(
                    f"the agent {agent_id!r} is not allowed",
                    Code.PARAM_NOT_ALLOWED,
                    rule=rule.source("params.agents") or "policy:params.agents",
                )
            return entry
    raise not_found(f"unknown agent {agent_id!r}")


def describe(
    entry: CatalogEntry, rule: EffectiveRule, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The catalogue entry as ``agents_catalog`` shows it."""
    env = os.environ if environ is None else environ
    executable = entry.executable(env)
    return {
        "id": entry.id,
        "name": entry.name,
        "source": entry.source,
        "enabled": True,
        "allowed": allowed(entry, rule),
        "installed": executable is not None,
        "path": executable,
        "version": entry.version,
        "command": list(entry.command),
        "env_required": list(entry.env_required),
        "env_present": entry.env_present(env),
        "auth_method": entry.auth_method,
        "install": {"package": entry.package, "version": entry.version}
        if entry.package
        else None,
    }
