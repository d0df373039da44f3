"""
Handlers, one module per capability group.

Each module exposes ``HANDLERS`` (endpoint id -> handler) and optionally
``SINKS`` (endpoint id -> raw-body sink factory). A group's modules are
imported on the group's first request, not at start: the table holds a
:class:`FirstCall` stand-in for each built-in endpoint until then. What a
group needs before any request (the PTY port, the tables the daemon empties
when it stops) is its service, created at start by :mod:`sandboxd.daemon.services`.
"""

from __future__ import annotations

import importlib
from typing import Any

from sandboxd.endpoints import (
    DOOR_METHODS,
    CapabilityGroup,
    Endpoint,
    RouteTable,
    catalogue_table,
)

G = CapabilityGroup

#: The modules holding each group's handlers.
GROUP_MODULES: dict[CapabilityGroup, tuple[str, ...]] = {
    G.CORE: ("sandboxd.routes.core",),
    G.COMMANDS: ("sandboxd.routes.commands",),
    G.FILE_OPS: ("sandboxd.routes.files", "sandboxd.routes.uploads"),
    G.PROCESS: ("sandboxd.routes.process",),
    G.TERMINAL: ("sandboxd.routes.terminal",),
    G.SYSTEM: ("sandboxd.routes.system",),
    G.DEV_TOOLS: ("sandboxd.routes.devtools",),
    G.BROWSER: ("sandboxd.routes.browser",),
    G.AGENTS: (
        "sandboxd.routes.agents",
        "sandboxd.openai_api.routes",
        "sandboxd.openai_api.responses",
        "sandboxd.openai_api.responses_socket",
        "sandboxd.openai_api.definitions",
        "sandboxd.openai_api.environments",
        "sandboxd.openai_api.files",
        "sandboxd.openai_api.vaults",
        "sandboxd.openai_api.templates",
        "sandboxd.openai_api.runtimes",
        "sandboxd.openai_api.webhook_endpoints",
        "sandboxd.openai_api.artifacts",
        "sandboxd.openai_api.traces",
        "sandboxd.openai_api.subagents",
        "sandboxd.openai_api.compact",
    ),
    G.GIT: ("sandboxd.routes.git",),
    G.MCP: ("sandboxd.routes.mcp",),
    G.AUTH: ("sandboxd.routes.links",),
    G.PREVIEW: ("sandboxd.routes.preview",),
    G.CODE: ("sandboxd.routes.kernels",),
    G.CONSOLE: ("sandboxd.routes.console",),
    G.LSP: ("sandboxd.routes.lsp",),
}


class FirstCall:
    """
    A built-in endpoint's handler until its group's first request.

    Calling it (or its :meth:`sink`) imports the group's modules, puts
    their handlers and sinks in the table in place of every stand-in of the
    group, and forwards to the real one.
    """

    def __init__(self, table: RouteTable, endpoint_id: str) -> None:
        self.table = table
        self.endpoint_id = endpoint_id

    def __call__(self, request: Any) -> Any:
        """The endpoint's handler, imported now if it is not yet."""
        handler = self.load().handler
        assert handler is not None
        return handler(request)

    def sink(self, request: Any) -> Any:
        """The endpoint's raw-body sink, imported now if it is not yet."""
        sink = self.load().sink
        assert sink is not None
        return sink(request)

    def load(self) -> Endpoint:
        """The endpoint, once its group's handlers are attached."""
        endpoint = self.table.get(self.endpoint_id)
        load_group(self.table, endpoint.group)
        if isinstance(endpoint.handler, FirstCall):
            raise RuntimeError(
                f"no module of the {endpoint.group.value} group handles "
                f"{self.endpoint_id!r}"
            )
        return endpoint


def bind_all(table: RouteTable) -> None:
    """Put a :class:`FirstCall` stand-in on every built-in endpoint."""
    for endpoint in table:
        if endpoint.custom or endpoint.method in DOOR_METHODS:
            continue
        if endpoint.group not in GROUP_MODULES or endpoint.handler is not None:
            continue
        stand_in = FirstCall(table, endpoint.id)
        table.bind(
            endpoint.id, stand_in, stand_in.sink if endpoint.body == "raw" else None
        )


def load_group(table: RouteTable, group: CapabilityGroup) -> None:
    """
    Import a group's modules and attach their handlers where stand-ins are.

    The table may be frozen by then: freezing fixes which endpoints exist,
    and this only replaces a stand-in with the handler it stood for.
    """
    for name in GROUP_MODULES.get(group, ()):
        module = importlib.import_module(name)
        sinks = getattr(module, "SINKS", {})
        for endpoint_id, handler in getattr(module, "HANDLERS", {}).items():
            endpoint = table.get(endpoint_id)
            if isinstance(endpoint.handler, FirstCall):
                endpoint.handler = handler
                endpoint.sink = sinks.get(endpoint_id)


def load_all(table: RouteTable) -> None:
    """Attach every group's handlers now (tests and tools that read them)."""
    for group in GROUP_MODULES:
        load_group(table, group)


def builtin_table() -> RouteTable:
    """A new table with a handler (or its stand-in) on every built-in endpoint."""
    table = catalogue_table()
    bind_all(table)
    return table


_default: RouteTable | None = None


def default_table() -> RouteTable:
    """
    The process-wide table servers use unless given another.

    A template's ``commands.py`` calls ``default_table()`` and decorates
    routes onto it, so every call returns the same table.
    """
    global _default
    if _default is None:
        _default = builtin_table()
    return _default
