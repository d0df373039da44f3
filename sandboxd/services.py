# -*- test-case-name: tests.test_services -*-
"""
The groups' long-lived services, created when the daemon is built.

A group's handlers (:mod:`sandboxd.routes`) are imported on its first
request; its service exists from the start, because the daemon needs it
before any request: the PTY port listens at start, and stopping the daemon
ends the children, watches, uploads and sessions the services hold. Each
is published on its attribute of the :class:`~sandboxd.context.Context`.
The services of the groups that are off unless a policy turns them on (the
browser, the agents) and the MCP door, whose machinery is heavy, are each a
:class:`~sandboxd.firstuse.ServiceOnFirstUse` until first used: their
modules are not imported at start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.application.service import IService

from sandboxd.context import Context
from sandboxd.files.uploads import UploadTable
from sandboxd.files.watch import WatchService
from sandboxd.firstuse import ServiceOnFirstUse
from sandboxd.processes.service import ProcessService
from sandboxd.terminals.service import TerminalService

if TYPE_CHECKING:
    from sandboxd.agents.manager import AgentManager
    from sandboxd.browser.supervisor import BrowserSupervisor
    from sandboxd.mcp import McpDoor

#: Where the site finds the MCP door.
MCP_PATH = b"/mcp"


def setup_services(context: Context) -> list[IService]:
    """Create every group's service, in the order they start."""
    watches = context.watches = WatchService(context.reactor)
    uploads = context.uploads = UploadTable(context.reactor)
    processes = context.processes = ProcessService(context.reactor, context.children)
    terminals = context.terminals = TerminalService(context)
    browser = context.browser = ServiceOnFirstUse("browser", lambda: _browser(context))
    agents = context.agents = ServiceOnFirstUse("agents", lambda: _agents(context))
    door = context.doors[MCP_PATH] = ServiceOnFirstUse(
        "mcp", lambda: _mcp_door(context)
    )
    return [watches, uploads, processes, terminals, browser, agents, door]


def _browser(context: Context) -> BrowserSupervisor:
    """The browser supervisor (its worker starts on the first browser call)."""
    from sandboxd.browser.supervisor import BrowserSupervisor

    return BrowserSupervisor(context.reactor, context)


def _agents(context: Context) -> AgentManager:
    """The agent session manager."""
    from sandboxd.agents.manager import AgentManager

    return AgentManager(context)


def _mcp_door(context: Context) -> McpDoor:
    """
    The MCP door: :mod:`sandboxd.mcp` (its tools, generated from the table
    and the API schemas, and its sessions) is imported on its first request.
    """
    from sandboxd.mcp import McpDoor

    return McpDoor(context)
