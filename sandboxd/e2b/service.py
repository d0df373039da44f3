# -*- test-case-name: tests.e2b.test_door -*-
"""
The E2B port's service: listens when ``--e2b-port`` is given *and* the
``e2b`` endpoint is enabled (SPEC §18: nothing listens unless both say so),
and follows the policy across reloads; at shutdown it stops listening and
removes its watchers.  The processes
and terminals it started belong to the daemon's process and terminal
services, which end them.
"""

from __future__ import annotations

from typing import Any

import attrs
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred, succeed
from twisted.logger import Logger

from sandboxd.daemon.listener import OwnEndpoint, PolicyListener
from sandboxd.e2b import codeinterp, controlplane, filesystem, process, rest
from sandboxd.e2b.door import Door, Procedure
from sandboxd.web.connections import ConnectionLimits

log = Logger(namespace="sandboxd.e2b")


#: Routes served as another: agent-sandbox-client's fork of the E2B SDK
#: creates a sandbox with E2B's first create route, ``POST /sandboxes``,
#: which takes what ``POST /v2/sandboxes`` takes (E2B's ``NewSandbox``).
ALIASES = {"POST /sandboxes": "POST /v2/sandboxes"}


def procedures() -> dict[str, Procedure]:
    """Everything the door serves, by ``package.Service/Method`` or ``METHOD /path``."""
    table = {
        **process.PROCEDURES,
        **filesystem.PROCEDURES,
        **rest.PROCEDURES,
        **codeinterp.PROCEDURES,
        **controlplane.PROCEDURES,
    }
    for alias, served in ALIASES.items():
        table.setdefault(alias, attrs.evolve(table[served], name=alias))
    return table


class E2BService(PolicyListener):
    """
    The envd-compatible listener.

    :ivar port: the listening port once it listens (None otherwise).
    """

    name = "e2b"
    endpoint = "e2b"
    port_name = "the E2B port"

    def __init__(
        self,
        context: Any,
        description: str,
        limits: ConnectionLimits | None = None,
        code_description: str | None = None,
    ) -> None:
        """
        :param code_description: a second listener of the same door, for
            platforms that route E2B's code interpreter by its port.
        """
        super().__init__(context, description)
        self.code_description = code_description
        self.code_port: Any = None
        self.door = Door(context, procedures(), limits)
        self.door.fallback = controlplane.unserved_procedure
        self.processes = process.ProcessDoor()
        self.watchers = filesystem.Watchers(context.reactor)

    def _listen(self) -> Deferred[Any]:
        """Listen on the door's port, and its code port when one is given."""
        site = self.door.site()
        endpoint = OwnEndpoint(self.context, self.description)
        if self.code_description is None:
            listening: Deferred[Any] = endpoint.listen(site)
            return listening
        code = OwnEndpoint(self.context, self.code_description)

        def both(ports: list[Any]) -> Any:
            self.code_port = ports[1]
            return ports[0]

        return gatherResults(
            [endpoint.listen(site), code.listen(site)], consumeErrors=True
        ).addCallback(both)

    def _close(self) -> Deferred[Any]:
        """
        Stop listening, close every connection, remove the watchers.  The
        processes and terminals started through the door are the sandbox's:
        they stay.
        """
        self.watchers.remove_all()
        if self.port is None:
            return succeed(None)
        port, self.port = self.port, None
        code, self.code_port = self.code_port, None
        d = maybeDeferred(port.stopListening)
        if code is not None:
            d.addCallback(lambda _: code.stopListening())
        d.addCallback(lambda _: self.door.site().close_all())
        return d

    def stopService(self) -> Deferred[Any]:
        """Stop listening; remove the watchers."""
        super().stopService()  # type: ignore[no-untyped-call]
        self.processes.stop()
        return self._close()


def setup(
    context: Any,
    description: str,
    limits: ConnectionLimits | None = None,
    code_description: str | None = None,
) -> E2BService:
    """Create the E2B service (``context.e2b``)."""
    service = E2BService(context, description, limits, code_description)
    context.e2b = service
    return service
