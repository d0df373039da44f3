# -*- test-case-name: tests.agents.test_agents -*-
"""
Which agents this sandbox knows (SPEC §15.2 ``agents_catalog``, §15.3).

The built-in entries pin their npm packages (names have moved twice; see
``notes/acp.md`` §3) and launch the binary the package installs; a policy
adds its own under the document's top-level ``agents.catalog``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import attrs

from sandboxd.errors import Code, bad_request, forbidden, internal, not_found
from sandboxd.policy import defaults
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import find_executable

#: The CLIs :mod:`sandboxd.agents.clibridge` runs once per turn.
HEADLESS_CLIS = ("codex", "qwen", "claude")


def _bridge_bounds() -> list[str]:
    """
    The bridge's bounds, from the policy defaults, for its command line (it
    imports none of sandboxd's policy machinery).
    """
    return [
        f"--max-line-bytes={defaults.AGENT_CLI_MAX_LINE_BYTES}",
        f"--kill-grace={defaults.KILL_GRACE_SECONDS}",
        f"--output-grace={defaults.AGENT_CLI_OUTPUT_GRACE_SECONDS}",
        f"--error-tail-bytes={defaults.AGENT_CLI_ERROR_TAIL_BYTES}",
        f"--kept-sessions={defaults.AGENT_CLI_KEPT_SESSIONS}",
    ]


@attrs.frozen
class Headless:
    """
    An agent's own CLI in its headless mode, run once per turn behind the
    ACP bridge (:mod:`sandboxd.agents.clibridge`): how the seed runs codex
    and qwen-code, and what runs when the agent's ACP adapter is not
    installed.
    """

    #: The bridge's ``--cli``: which line format and arguments.
    cli: str
    #: The binary looked up on PATH.
    program: str


@attrs.frozen
class CatalogEntry:
    """
    One agent: how to start it and what it needs.  ``command`` is its ACP
    adapter; ``headless``, where set, its CLI, run when the adapter is not
    installed (an entry may have only the one or the other).
    """

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
    headless: Headless | None = None

    def env_present(self, environ: Mapping[str, str]) -> dict[str, bool]:
        """Which of the keys it may need are set in the daemon's environment."""
        return {
            name: bool(environ.get(name)) for name in self.env_required or self.env_pass
        }

    def found(self, environ: Mapping[str, str]) -> tuple[str, str] | None:
        """
        What runs for it, resolved against PATH: ``("acp", path)`` for its
        adapter, else ``("headless", path)`` for its CLI; None for neither.
        """
        if self.command:
            path = find_executable(self.command[0], environ)
            if path is not None:
                return "acp", path
        if self.headless is not None:
            path = find_executable(self.headless.program, environ)
            if path is not None:
                return "headless", path
        return None

    def protocol(self, found: tuple[str, str] | None) -> str:
        """
        ``acp``, or ``headless:CLI`` for the CLI the bridge runs for it:
        what runs now (``found``, from :meth:`found`), or when nothing is
        installed, what would run first.
        """
        kind = found[0] if found else ("acp" if self.command else "headless")
        if kind == "headless" and self.headless is not None:
            return f"headless:{self.headless.cli}"
        return "acp"

    def launch(
        self, found: tuple[str, str] | None, access: str
    ) -> tuple[list[str], str] | None:
        """
        The argv and executable that start what ``found`` (from
        :meth:`found`) names, or None when neither its adapter nor its CLI
        is installed; a CLI runs behind the bridge with ``access`` (see
        :func:`sandboxd.agents.permissions.headless_access`).
        """
        if found is None:
            return None
        kind, path = found
        if kind == "acp":
            return list(self.command), path
        assert self.headless is not None
        # -I: the bridge runs in the session's directory, whose files must
        # not be imported in place of sandboxd's.
        argv = [sys.executable, "-I", "-m", "sandboxd.agents.clibridge"]
        argv += [
            "--cli",
            self.headless.cli,
            "--access",
            access,
            *_bridge_bounds(),
            path,
        ]
        return argv, sys.executable

    def programs(self) -> tuple[str, ...]:
        """The binaries looked for on PATH: its adapter's, then its CLI."""
        names = self.command[:1]
        if self.headless is not None:
            names += (self.headless.program,)
        return names


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
        headless=Headless("claude", "claude"),
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
        headless=Headless("codex", "codex"),
    ),
    CatalogEntry(
        id="qwen-code",
        name="Qwen Code (headless)",
        command=(),
        env_pass=("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL"),
        env_required=("OPENAI_API_KEY",),
        package="@qwen-code/qwen-code",
        version="0.24.4",
        headless=Headless("qwen", "qwen"),
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
    headless = None
    cli = raw.get("headless")
    if cli is not None:
        if cli not in HEADLESS_CLIS:
            raise internal(
                f"policy agents.catalog.{agent_id}.headless must be one of "
                + ", ".join(HEADLESS_CLIS)
            )
        # The command is the CLI itself, run behind the bridge.
        headless = Headless(cli, command[0])
        command = ()
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
        headless=headless,
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
    found = entry.found(env)
    executable = found[1] if found else None
    return {
        "id": entry.id,
        "name": entry.name,
        "source": entry.source,
        "enabled": True,
        "allowed": allowed(entry, rule),
        "installed": executable is not None,
        "path": executable,
        "protocol": entry.protocol(found),
        "version": entry.version,
        "command": list(entry.command)
        or ([entry.headless.program] if entry.headless else []),
        "env_required": list(entry.env_required),
        "env_present": entry.env_present(env),
        "auth_method": entry.auth_method,
        "install": {"package": entry.package, "version": entry.version}
        if entry.package
        else None,
    }
