"""
sandboxd: the daemon inside an AI-agent sandbox container.

The public API (SPEC §1, §10) is re-exported here; everything else is an
implementation module.  The names are imported on first use (PEP 562), so
``import sandboxd.cli`` for ``sandboxd healthcheck`` does not import the
daemon.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandboxd._version import __version__
from sandboxd.lazyexports import lazy_exports

if TYPE_CHECKING:
    from sandboxd.commands import CommandArg, CommandRegistry, command
    from sandboxd.daemon.server import SandboxServer, start
    from sandboxd.endpoints import CapabilityGroup, RouteTable
    from sandboxd.routes import default_table
    from sandboxd.web.messages import (
        ServerRequest,
        ServerResponse,
        SSEEvent,
        SSEResponse,
        StreamResponse,
    )

#: Public name -> the module that defines it.
_EXPORTS = {
    "CapabilityGroup": "sandboxd.endpoints",
    "CommandArg": "sandboxd.commands",
    "CommandRegistry": "sandboxd.commands",
    "RouteTable": "sandboxd.endpoints",
    "SSEEvent": "sandboxd.web.messages",
    "SSEResponse": "sandboxd.web.messages",
    "SandboxServer": "sandboxd.daemon.server",
    "ServerRequest": "sandboxd.web.messages",
    "ServerResponse": "sandboxd.web.messages",
    "StreamResponse": "sandboxd.web.messages",
    "command": "sandboxd.commands",
    "default_table": "sandboxd.routes",
    "start": "sandboxd.daemon.server",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = [
    "CapabilityGroup",
    "CommandArg",
    "CommandRegistry",
    "RouteTable",
    "SSEEvent",
    "SSEResponse",
    "SandboxServer",
    "ServerRequest",
    "ServerResponse",
    "StreamResponse",
    "__version__",
    "command",
    "default_table",
    "start",
]
