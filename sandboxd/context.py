# -*- test-case-name: tests.test_pipeline -*-
"""
The daemon's shared state, handed to every handler as ``request.context``.

One object holds what the pipeline and the group modules share: the route
table and router, the compiled policy (swapped whole on reload), limiters,
the audit log, the command registry, and each group's service by name.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import attrs
from twisted.internet.interfaces import IReactorTime

from sandboxd.audit import AuditLog
from sandboxd.commands import CommandRegistry
from sandboxd.endpoints import RouteTable
from sandboxd.policy import Policy
from sandboxd.policy.limits import ConcurrencyGate, RateLimiter
from sandboxd.web.routing import Router


@attrs.define(eq=False)
class Context:
    """Everything a request may need beyond itself."""

    reactor: Any
    table: RouteTable
    policy: Policy
    registry: CommandRegistry
    audit: AuditLog
    router: Router = attrs.field(init=False)
    rates: RateLimiter = attrs.field(init=False)
    gate: ConcurrencyGate = attrs.field(factory=ConcurrencyGate, init=False)
    services: dict[str, Any] = attrs.field(factory=dict, init=False)
    hostname: str = attrs.field(factory=socket.gethostname, init=False)
    started_at: float = attrs.field(factory=time.time, init=False)
    pty_port: int | None = None
    pty_listen: str | None = None
    http_port: int | None = None
    draining: bool = False

    def __attrs_post_init__(self) -> None:
        self.router = Router(self.table)
        clock: IReactorTime = self.reactor
        self.rates = RateLimiter(clock)

    @property
    def base_dir(self) -> str:
        """The path boundary of the policy in force."""
        return self.policy.base_dir

    def service(self, name: str) -> Any:
        """A group's service (``processes``, ``terminals`` ...)."""
        return self.services[name]

    def replace_policy(self, policy: Policy) -> None:
        """Swap in a new compiled policy (reload); buckets start afresh."""
        self.policy = policy
        self.rates.forget()
