"""
sandboxd: the daemon inside an AI-agent sandbox container.

The public API (SPEC §1, §10) is re-exported here; everything else is an
implementation module.
"""

from sandboxd._version import __version__
from sandboxd.commands import CommandArg, CommandRegistry, command
from sandboxd.endpoints import CapabilityGroup, RouteTable
from sandboxd.routes import default_table
from sandboxd.server import SandboxServer, start
from sandboxd.web.messages import (
    ServerRequest,
    ServerResponse,
    SSEEvent,
    SSEResponse,
    StreamResponse,
)

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
