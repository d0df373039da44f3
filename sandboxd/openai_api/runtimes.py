# -*- test-case-name: tests.openai_api.test_environments -*-
"""
``GET /v1/agents/runtimes`` (the seed's own route): the agents a session
or a response may name as its model — the policy's agent catalogue — with
whether each is installed and allowed.

Nothing is run to answer: the version shown is the catalogue's pinned one
(the seed runs ``--version`` in the request), and ``installed`` is a PATH
lookup; ``allowed`` says whether the policy's ``params.agents`` lets the
caller run it.
"""

from __future__ import annotations

import os
from typing import Any

from sandboxd.agents import catalog
from sandboxd.openai_api.registry import labelled, page
from sandboxd.web.messages import ServerRequest


def describe(entry: catalog.CatalogEntry, request: ServerRequest) -> dict[str, Any]:
    """One ``agent.runtime``."""
    shown = catalog.describe(entry, request.rule)
    install = shown["install"]
    return {
        "id": entry.id,
        "object": "agent.runtime",
        "name": entry.name,
        "aliases": [],
        "binary": entry.command[0] if entry.command else None,
        "installed": shown["installed"],
        "path": shown["path"],
        "version": entry.version,
        "experimental": False,
        "implemented": True,
        "allowed": shown["allowed"],
        "default": False,
        "protocol": "acp",
        "source": entry.source,
        "capabilities": {
            "resume": True,
            "partial_deltas": True,
            "mcp": True,
            "approvals": True,
        },
        "auth_env_present": entry.env_present(os.environ),
        "install_steps": [f"npm install -g {install['package']}@{install['version']}"]
        if install
        else [],
    }


def agents_runtimes_list(request: ServerRequest) -> dict[str, Any]:
    """The catalogue's agents as runtimes (``allowed``: this caller may run it)."""
    shown = [describe(entry, request) for entry in catalog.entries(request.context)]
    return page(request, shown, default_order="asc")


HANDLERS: dict[str, Any] = labelled({"agents_runtimes_list": agents_runtimes_list})
