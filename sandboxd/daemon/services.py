# -*- test-case-name: tests.test_services -*-
"""
The groups' long-lived services, created when the daemon is built.

A group's handlers (:mod:`sandboxd.routes`) are imported on its first
request. Its service is set on its attribute of the
:class:`~sandboxd.daemon.context.Context` now, so that the daemon starts and
stops it in order, but only two are built at start: the processes' (the
daemon becomes the subreaper of every child it starts, of any group, and
ends them all at stop) and the terminals' (its PTY port listens before the
first ``/health``, :mod:`sandboxd.daemon.readiness`). Every other one (watches,
uploads, the browser, the agents, code contexts, language servers, the MCP
door) is a
:class:`~sandboxd.daemon.firstuse.ServiceOnFirstUse` until first used, and its
module is not imported before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.application.service import IService

from sandboxd.daemon.context import Context
from sandboxd.daemon.firstuse import ServiceOnFirstUse
from sandboxd.processes.service import ProcessService
from sandboxd.terminals.service import TerminalService

if TYPE_CHECKING:
    from sandboxd.agents.manager import AgentManager
    from sandboxd.browser.supervisor import BrowserSupervisor
    from sandboxd.files.uploads import UploadTable
    from sandboxd.files.watch import WatchService
    from sandboxd.kernels.service import CodeService
    from sandboxd.lsp.service import LspService
    from sandboxd.mcp import McpDoor

#: Where the site finds the MCP door.
MCP_PATH = b"/mcp"


def setup_services(context: Context) -> list[IService]:
    """Create every group's service, in the order they start."""
    watches = context.watches = ServiceOnFirstUse("watches", lambda: _watches(context))
    uploads = context.uploads = ServiceOnFirstUse("uploads", lambda: _uploads(context))
    processes = context.processes = ProcessService(context.reactor, context.children)
    terminals = context.terminals = TerminalService(context)
    browser = context.browser = ServiceOnFirstUse("browser", lambda: _browser(context))
    agents = context.agents = ServiceOnFirstUse("agents", lambda: _agents(context))
    code = context.code = ServiceOnFirstUse("code", lambda: _code(context))
    lsp = context.lsp = ServiceOnFirstUse("lsp", lambda: _lsp(context))
    door = context.doors[MCP_PATH] = ServiceOnFirstUse(
        "mcp", lambda: _mcp_door(context)
    )
    return [watches, uploads, processes, terminals, browser, agents, code, lsp, door]


def _watches(context: Context) -> WatchService:
    """The shared inotify watches behind ``files_watch``."""
    from sandboxd.files.watch import WatchService

    return WatchService(context.reactor)


def _uploads(context: Context) -> UploadTable:
    """The table of open uploads (staging files removed at stop)."""
    from sandboxd.files.uploads import UploadTable

    return UploadTable(context.reactor)


def _browser(context: Context) -> BrowserSupervisor:
    """The browser supervisor (its worker starts on the first browser call)."""
    from sandboxd.browser.supervisor import BrowserSupervisor

    return BrowserSupervisor(context.reactor, context)


def _agents(context: Context) -> AgentManager:
    """The agent session manager."""
    from sandboxd.agents.manager import AgentManager

    return AgentManager(context)


def _code(context: Context) -> CodeService:
    """The code contexts and their kernel hub (started with the first context)."""
    from sandboxd.kernels.service import CodeService

    return CodeService(context)


def _lsp(context: Context) -> LspService:
    """The language server sessions (each server starts with its first question)."""
    from sandboxd.lsp.service import LspService

    return LspService(context)


def _mcp_door(context: Context) -> McpDoor:
    """
    The MCP door: :mod:`sandboxd.mcp` (its tools, generated from the table
    and the API schemas, and its sessions) is imported on its first request.
    """
    from sandboxd.mcp import McpDoor

    return McpDoor(context)
