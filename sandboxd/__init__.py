"""
sandboxd: the daemon inside an AI-agent sandbox container.

The public API (SPEC §1, §10) is re-exported here; everything else is an
implementation module.  The names are imported on first use (PEP 562), so
``import sandboxd.cli`` for ``sandboxd healthcheck`` does not import the
daemon.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sandboxd._version import __version__

if TYPE_CHECKING:
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

#: Public name -> the module that defines it.
_EXPORTS = {
    "CapabilityGroup": "sandboxd.endpoints",
    "CommandArg": "sandboxd.commands",
    "CommandRegistry": "sandboxd.commands",
    "RouteTable": "sandboxd.endpoints",
    "SSEEvent": "sandboxd.web.messages",
    "SSEResponse": "sandboxd.web.messages",
    "SandboxServer": "sandboxd.server",
    "ServerRequest": "sandboxd.web.messages",
    "ServerResponse": "sandboxd.web.messages",
    "StreamResponse": "sandboxd.web.messages",
    "command": "sandboxd.commands",
    "default_table": "sandboxd.routes",
    "start": "sandboxd.server",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sandboxd' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


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
