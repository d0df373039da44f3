"""
The Python client of sandboxd (SPEC §19): :class:`Sandbox` (blocking) and
:class:`AsyncSandbox` (asyncio), on httpx and websockets.

It imports nothing from Twisted, so it runs wherever ``httpx`` and
``websockets`` are installed (``pip install ./client`` in a checkout)::

    from sandboxd.client import Sandbox

    with Sandbox("http://127.0.0.1:9000", token="...") as sb:
        sb.files.write_text("notes.txt", "hello")
        result = sb.commands.run("wc -c notes.txt")
        print(result.exit_code, result.stdout)
"""

from sandboxd.client._api import Process, Terminal
from sandboxd.client._async import AsyncSandbox
from sandboxd.client._sync import Sandbox
from sandboxd.client.errors import *  # noqa: F403
from sandboxd.client.errors import BY_CODE, SandboxError, UploadMismatch
from sandboxd.client.models import (
    CommandResult,
    PtyEvent,
    SSEEvent,
)

__all__ = [
    "AsyncSandbox",
    "CommandResult",
    "Process",
    "PtyEvent",
    "SSEEvent",
    "Sandbox",
    "SandboxError",
    "Terminal",
    *sorted(cls.__name__ for cls in {*BY_CODE.values(), UploadMismatch}),
]
