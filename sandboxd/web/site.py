"""The HTTP factory: a ``Site`` whose requests run the sandboxd pipeline."""

from __future__ import annotations

from typing import Any

from twisted.web.server import Site

from sandboxd.context import Context
from sandboxd.web.request import SandboxRequest

#: Close keep-alive connections idle for this long.
IDLE_TIMEOUT_SECONDS = 60


class SandboxSite(Site):
    """
    The site serving the route tree of one :class:`Context`.

    ``log`` is a no-op: the combined access log costs a third of small
    request throughput, and the audit trail (SPEC §11.5) records what
    matters.
    """

    requestFactory = SandboxRequest
    displayTracebacks = False

    def __init__(self, context: Context, reactor: Any = None) -> None:
        super().__init__(
            context.router.root, timeout=IDLE_TIMEOUT_SECONDS, reactor=reactor
        )
        self.context = context

    def log(self, request: Any) -> None:
        """Skip the access log (see the class docstring)."""
