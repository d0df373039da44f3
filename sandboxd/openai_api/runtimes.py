# -*- test-case-name: tests.openai_api.test_environments -*-
"""
``GET /v1/agents/runtimes`` (the seed's own route): the agents a session
or a response may name as its model — the policy's agent catalogue — with
whether each is installed and allowed.

Nothing is run to answer: the version shown is the catalogue's pinned one
(the seed runs ``--version`` in the request), and ``installed`` is a PATH
lookup; ``allowed`` says whether the policy's ``params.agents`` lets the
caller run it.

Which agent a request runs (:func:`select`) is chosen as the seed
chooses its runtime: the ``X-ABX-Adapter`` header, else ``adapter`` or
``runtime`` in the body (or its inline ``agent``), else a ``model`` that
names an agent, else the default agent; a ``model`` that names no agent
is handed to the agent that runs (ACP ``session/set_model``).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from typing import Any

from sandboxd.agents import catalog
from sandboxd.errors import bad_request
from sandboxd.openai_api.registry import labelled, page
from sandboxd.web.messages import ServerRequest

#: agent-sandbox-server's runtime names and their aliases, as catalogue ids.
SEED_NAMES: dict[str, str] = {
    "codex": "codex",
    "openai-codex": "codex",
    "qwen-code": "qwen-code",
    "cursor": "cursor",
    "command": "command",
    "claude-code": "claude",
    "claude_code": "claude",
    "claudecode": "claude",
    "qwen": "qwen-code",
    "qwen_code": "qwen-code",
    "qwencode": "qwen-code",
    "cursor-agent": "cursor",
    "cursor_agent": "cursor",
    "custom": "command",
}
#: The agent a request that names none runs (agent-sandbox-server's default).
DEFAULT_AGENT = "codex"
#: The header that names the agent, over anything in the body.
ADAPTER_HEADER = "x-abx-adapter"


def canonical(request: ServerRequest, name: str) -> str | None:
    """
    The catalogue id ``name`` stands for (itself, or one of the seed's
    runtime names and aliases), or None: ``name`` is a model, not an agent.
    """
    ids = {entry.id for entry in catalog.entries(request.context)}
    if name in ids:
        return name
    return SEED_NAMES.get(name.lower())


def default_agent(environ: Mapping[str, str] | None = None) -> str:
    """
    The agent a request that names none runs: ``$ABX_AGENTS_DEFAULT``, else
    ``default`` (or ``agents.default``) of the JSON file
    ``$ABX_AGENTS_CONFIG`` names, else ``codex``, as agent-sandbox-server.
    """
    env = os.environ if environ is None else environ
    named = env.get("ABX_AGENTS_DEFAULT", "").strip()
    if named:
        return named
    path = env.get("ABX_AGENTS_CONFIG", "").strip()
    if not path:
        return DEFAULT_AGENT
    try:
        found = os.stat(path)
    except OSError:
        return DEFAULT_AGENT
    version = (found.st_ino, found.st_size, found.st_mtime_ns)
    return _configured(path, version) or DEFAULT_AGENT


@functools.lru_cache(maxsize=4)
def _configured(path: str, version: tuple[int, int, int]) -> str | None:
    """
    The default agent the JSON file ``path`` names, read again only when
    ``version`` (its inode, size and modification time) changes: the
    reactor reads no file per request, and an edit takes effect at once.
    """
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict):
        return None
    nested = found.get("agents")
    for value in (
        found.get("default"),
        nested.get("default") if isinstance(nested, dict) else None,
    ):
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _named(value: Any, param: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise bad_request(f"{param} must name an agent", param=param)
    return value.strip()


def select(
    request: ServerRequest,
    body: Mapping[str, Any],
    agent: Mapping[str, Any] | None = None,
    model: str | None = None,
    default: str | None = None,
) -> tuple[str, str | None]:
    """
    ``(catalogue id, model for the agent or None)`` of a request whose
    body is ``body`` (its inline agent ``agent``, its model ``model``);
    ``default`` runs when nothing names an agent (else :func:`default_agent`).

    The agent is not looked up in the catalogue here: the caller does it
    (404 when unknown, 403 when the policy's ``params.agents`` omits it).
    """
    agent = agent or {}
    named = _named(request.headers.get(ADAPTER_HEADER) or None, "X-ABX-Adapter")
    for source, where in ((body, ""), (agent, "agent.")):
        for key in ("adapter", "runtime"):
            if named is None:
                named = _named(source.get(key), where + key)
    passed = None
    if model is not None:
        as_agent = canonical(request, model)
        if named is None and as_agent is not None:
            return as_agent, None
        if as_agent is None:
            passed = model
    chosen = named or default or default_agent()
    return canonical(request, chosen) or chosen, passed


def describe(
    entry: catalog.CatalogEntry, request: ServerRequest, default: str | None = None
) -> dict[str, Any]:
    """
    One ``agent.runtime``: its ``name`` is what ``adapter`` takes (as
    agent-sandbox-server's), its ``aliases`` the other names that pick it,
    ``default`` whether it runs when a request names no agent.
    """
    shown = catalog.describe(entry, request.rule)
    install = shown["install"]
    return {
        "id": entry.id,
        "object": "agent.runtime",
        "name": entry.id,
        "display_name": entry.name,
        "aliases": sorted(
            alias
            for alias, target in SEED_NAMES.items()
            if target == entry.id and alias != entry.id
        ),
        "binary": os.path.basename(shown["path"])
        if shown["path"]
        else next(iter(entry.programs()), None),
        "installed": shown["installed"],
        "path": shown["path"],
        "version": entry.version,
        "experimental": False,
        "implemented": True,
        "allowed": shown["allowed"],
        "default": entry.id == default,
        "protocol": shown["protocol"],
        "source": entry.source,
        "capabilities": {
            "resume": True,
            "partial_deltas": True,
            "mcp": True,
            # A headless CLI asks nobody: the policy's permission_mode sets
            # its sandbox instead.
            "approvals": shown["protocol"] == "acp",
        },
        "auth_env_present": entry.env_present(os.environ),
        "install_steps": [f"npm install -g {install['package']}@{install['version']}"]
        if install
        else [],
    }


def agents_runtimes_list(request: ServerRequest) -> dict[str, Any]:
    """The catalogue's agents as runtimes (``allowed``: this caller may run it)."""
    chosen = default_agent()
    default = canonical(request, chosen) or chosen
    shown = [
        describe(entry, request, default) for entry in catalog.entries(request.context)
    ]
    return page(request, shown, default_order="asc")


HANDLERS: dict[str, Any] = labelled({"agents_runtimes_list": agents_runtimes_list})
