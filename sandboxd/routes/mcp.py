# -*- test-case-name: tests.mcp.test_door -*-
"""
The ``mcp`` group: the MCP door's service (SPEC §17).

``/mcp`` is handed to :class:`~sandboxd.mcp.McpDoor` by the site before
the JSON pipeline; the handler here only answers spellings of the path
that reach the pipeline instead (``/%6Dcp``), which the door does not
serve.
"""

from __future__ import annotations

from typing import Any

from sandboxd.errors import ApiError, invalid_path
from sandboxd.mcp import McpDoor
from sandboxd.web.messages import ServerRequest

#: Where the site finds the door.
PATH = b"/mcp"


def mcp(request: ServerRequest) -> ApiError:
    """``POST /mcp`` spelled so that it reached the JSON pipeline."""
    return invalid_path("the MCP endpoint is served at exactly /mcp")


HANDLERS = {"mcp": mcp}


def setup(context: Any) -> McpDoor:
    """Create the door and hand ``/mcp`` to it."""
    door = McpDoor(context)
    context.doors[PATH] = door
    return door
