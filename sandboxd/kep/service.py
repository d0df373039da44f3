# -*- test-case-name: tests.kep.test_rest -*-
"""
The KEP door's listeners: the REST filesystem API, and the gRPC
ProcessService when ``--kep-grpc-port`` is given.  They listen when the
REST port is given *and* the ``kep`` endpoint is enabled, follow the policy
across reloads (:class:`~sandboxd.daemon.listener.PolicyListener`), and at
shutdown stop listening and close their connections; the processes started
through the door belong to the daemon's process service, which ends them.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import Deferred, gatherResults, maybeDeferred, succeed
from twisted.logger import Logger

from sandboxd.daemon.listener import OwnEndpoint, PolicyListener
from sandboxd.kep import access
from sandboxd.kep.rest import KepRestDoor
from sandboxd.policy.defaults import KEP_STOP_GRACE_SECONDS
from sandboxd.web.connections import ConnectionLimits

log = Logger(namespace="sandboxd.kep")


class KepService(PolicyListener):
    """
    The KEP ports.

    :ivar port: the REST port once it listens (None otherwise).
    :ivar grpc_port: the gRPC port once it listens (None otherwise).
    """

    name = "kep"
    endpoint = access.ENDPOINT
    port_name = "the KEP REST port"

    def __init__(
        self,
        context: Any,
        description: str,
        grpc_description: str | None = None,
        root: str | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        """
        :param grpc_description: the gRPC listener's endpoint string.
        :param root: what paths are relative to (default: the base dir).
        """
        super().__init__(context, description)
        self.grpc_description = grpc_description
        self.grpc_port: Any = None
        self.root = os.path.abspath(root or context.policy.base_dir)
        self.door = KepRestDoor(context, self.root, limits)
        self.limits = limits
        self._grpc_factory: Any = None

    def startService(self) -> None:
        """Listen (if enabled), saying first who a call without credentials is."""
        access.warn_if_unauthenticated(self.context)
        super().startService()

    def policy_reloaded(self) -> None:
        """Follow the new policy; say again who a call without credentials is."""
        if self.running:
            access.warn_if_unauthenticated(self.context)
        super().policy_reloaded()

    def _listen(self) -> Deferred[Any]:
        """Listen on the REST port, and the gRPC port when one is given."""
        site = self.door.site()
        rest = OwnEndpoint(self.context, self.description)
        factory = None
        if self.grpc_description is not None:
            # h2 is imported with it: only when the port is asked for.
            from sandboxd.kep.process import grpc_factory

            # A new factory each time: a stopped one refuses every connection.
            factory = self._grpc_factory = grpc_factory(self.context, self.limits)
            factory.check_head = access.grpc_head_check(self.context)
        if factory is None or self.grpc_description is None:
            listening: Deferred[Any] = rest.listen(site)
            return listening
        grpc = OwnEndpoint(self.context, self.grpc_description)

        def both(ports: list[Any]) -> Any:
            self.grpc_port = ports[1]
            return ports[0]

        return gatherResults(
            [rest.listen(site), grpc.listen(factory)], consumeErrors=True
        ).addCallback(both)

    def _close(self) -> Deferred[Any]:
        """Stop listening and close every connection of both listeners."""
        if self.port is None:
            return succeed(None)
        port, self.port = self.port, None
        grpc, self.grpc_port = self.grpc_port, None
        d = maybeDeferred(port.stopListening)
        if grpc is not None:
            factory = self._grpc_factory
            d.addCallback(lambda _: grpc.stopListening())
            d.addCallback(lambda _: factory.stop(KEP_STOP_GRACE_SECONDS))
        d.addCallback(lambda _: self.door.site().close_all())
        return d

    def stopService(self) -> Deferred[Any]:
        """Stop listening."""
        super().stopService()  # type: ignore[no-untyped-call]
        return self._close()


def setup(
    context: Any,
    description: str,
    grpc_description: str | None = None,
    root: str | None = None,
    limits: ConnectionLimits | None = None,
) -> KepService:
    """Create the KEP service (``context.kep``)."""
    service = KepService(context, description, grpc_description, root, limits)
    context.kep = service
    return service
