# -*- test-case-name: tests.mcp.test_door -*-
"""
The ``mcp`` group's one handler (SPEC §17).

``/mcp`` is handed to :class:`~sandboxd.mcp.McpDoor` by the site before
the JSON pipeline (the door is set up by :mod:`sandboxd.daemon.services`); the
handler here only answers spellings of the path that reach the pipeline
instead (``/%6Dcp``), which the door does not serve.
"""

from __future__ import annotations

from sandboxd.errors import ApiError, invalid_path
from sandboxd.web.messages import ServerRequest


def mcp(request: ServerRequest) -> ApiError:
    """``POST /mcp`` spelled so that it reached the JSON pipeline."""
    return invalid_path("the MCP endpoint is served at exactly /mcp")


HANDLERS = {"mcp": mcp}
