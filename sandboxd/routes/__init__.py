"""
Handlers, one module per capability group.

Each module exposes ``HANDLERS`` (endpoint id -> handler), optionally
``SINKS`` (endpoint id -> raw-body sink factory) and ``setup(context)``,
which creates the group's long-lived service (process table, terminal
sessions ...), sets it on its typed attribute of the
:class:`~sandboxd.context.Context` and returns it (or None)
so the daemon can start and stop it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from twisted.application.service import IService

from sandboxd.endpoints import RouteTable, catalogue_table

#: Group modules, in the order their services start.
MODULES = (
    "sandboxd.routes.core",
    "sandboxd.routes.commands",
    "sandboxd.routes.files",
    "sandboxd.routes.uploads",
    "sandboxd.routes.process",
    "sandboxd.routes.terminal",
    "sandboxd.routes.system",
    "sandboxd.routes.devtools",
    "sandboxd.routes.browser",
    "sandboxd.routes.agents",
    "sandboxd.routes.mcp",
)


def modules() -> list[ModuleType]:
    """The imported group modules."""
    return [importlib.import_module(name) for name in MODULES]


def bind_all(table: RouteTable) -> None:
    """Attach every built-in handler to the declared endpoints."""
    for module in modules():
        sinks = getattr(module, "SINKS", {})
        for endpoint_id, handler in getattr(module, "HANDLERS", {}).items():
            table.bind(endpoint_id, handler, sinks.get(endpoint_id))


def setup_services(context: Any) -> list[IService]:
    """Create each group's service; returns those to start and stop."""
    services = []
    for module in modules():
        setup = getattr(module, "setup", None)
        if setup is not None:
            service = setup(context)
            if service is not None:
                services.append(service)
    return services


def builtin_table() -> RouteTable:
    """A new table with every built-in handler that exists bound to it."""
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
