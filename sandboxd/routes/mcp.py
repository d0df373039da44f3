# -*- test-case-name: tests.mcp.test_door -*-
"""
The ``mcp`` group: the MCP door's service (SPEC §17).

``/mcp`` is handed to :class:`~sandboxd.mcp.McpDoor` by the site before
the JSON pipeline; the handler here only answers spellings of the path
that reach the pipeline instead (``/%6Dcp``), which the door does not
serve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.application.service import Service

from sandboxd.errors import ApiError, invalid_path
from sandboxd.web.messages import ServerRequest

if TYPE_CHECKING:
    from sandboxd.mcp import McpDoor

#: Where the site finds the door.
PATH = b"/mcp"


def mcp(request: ServerRequest) -> ApiError:
    """``POST /mcp`` spelled so that it reached the JSON pipeline."""
    return invalid_path("the MCP endpoint is served at exactly /mcp")


HANDLERS = {"mcp": mcp}


class DoorOnFirstUse(Service):
    """
    The door's place until its first request: :mod:`sandboxd.mcp` (its
    tools, generated from the table and the API schemas, and its sessions)
    is imported then, not at start (docs/architecture.md, "Start-up").
    Any other attribute read also builds the door and is forwarded to it.
    """

    name = "mcp"

    def __init__(self, context: Any) -> None:
        self.context = context
        self.door: McpDoor | None = None

    def get(self) -> McpDoor:
        """The door, built (and started, if the daemon runs) on first use."""
        if self.door is None:
            from sandboxd.mcp import McpDoor

            self.door = McpDoor(self.context)
            if self.running:
                self.door.startService()  # type: ignore[no-untyped-call]
        return self.door

    def exchange(self, *args: Any, **kwargs: Any) -> Any:
        """A request to ``/mcp``: the door's."""
        return self.get().exchange(*args, **kwargs)

    def policy_reloaded(self) -> None:
        """A reload: only a door that exists has sessions to update."""
        if self.door is not None:
            self.door.policy_reloaded()

    def stopService(self) -> None:
        """Stop the door if it was ever built."""
        super().stopService()  # type: ignore[no-untyped-call]
        if self.door is not None:
            self.door.stopService()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.get(), name)


def setup(context: Any) -> DoorOnFirstUse:
    """Hand ``/mcp`` to the door, built on its first request."""
    door = DoorOnFirstUse(context)
    context.doors[PATH] = door
    return door
