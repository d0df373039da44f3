# -*- test-case-name: tests.preview.test_door -*-
"""
The preview door's service: its listener (``--preview-port``), the table
of exposures, the Agent's connection pool, and the ports never exposed.

The door listens when ``--preview-port`` is given and the ``preview_proxy``
endpoint is enabled; the ``preview`` group is opt-in.  At stop it stops
listening, closes every exposure's connections and the pool.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, DeferredList, maybeDeferred, succeed
from twisted.logger import Logger

from sandboxd.daemon.listener import OwnEndpoint, PolicyListener
from sandboxd.errors import ApiError, port_not_allowed, port_not_exposed
from sandboxd.policy.defaults import PREVIEW_HOST_CACHE
from sandboxd.policy.rules import EffectiveRule
from sandboxd.preview.door import PreviewSite
from sandboxd.preview.exposures import ExposureTable, allowed
from sandboxd.preview.rawpool import RawPool
from sandboxd.preview.routing import Routes
from sandboxd.preview.upstream import make_agent
from sandboxd.web.connections import ConnectionLimits

log = Logger(namespace="sandboxd.preview")

#: Chromium's DevTools port by convention: never previewable, whoever
#: started the browser listening there.
CDP_PORT = 9222


class PreviewService(PolicyListener):
    """
    The preview door.

    :ivar door_port: the port it listens on, once it does.
    :ivar secure: it is reached over TLS (the cookie gets ``Secure``).
    """

    name = "preview"

    endpoint = "preview_proxy"
    port_name = "the preview port"

    def __init__(
        self, context: Any, description: str, limits: ConnectionLimits | None = None
    ) -> None:
        super().__init__(context, description)
        self.limits = limits
        self.exposures = ExposureTable(
            context.reactor.seconds, context.reactor.callLater
        )
        self.agent, self.pool = make_agent(context.reactor)
        self.raw = RawPool(context.reactor)
        self.door_port: int | None = None
        self.secure = description.startswith(("ssl:", "tls:"))
        self.site: PreviewSite | None = None
        self._routes: Routes | None = None
        self._routes_of: Any = None
        #: The daemon's own listening ports, and what they were worked out from.
        self._own: frozenset[int] = frozenset({CDP_PORT})
        self._own_of: frozenset[int] | None = None
        #: Ports the policy allows, to the rule that allowed them.
        self._allowed: dict[int, EffectiveRule] = {}

    # -- what the door and the routes ask -------------------------------------

    @property
    def routes(self) -> Routes:
        """The Host patterns of the policy in force (made again after a reload)."""
        doc = self.context.policy.document
        if self._routes is None or self._routes_of is not doc:
            public = self.context.preview_public_url or doc.preview_public_url
            self._routes = Routes(doc.preview_domain, public)
            self._routes_of = doc
        return self._routes

    def url(self, port: int, label: str | None) -> str:
        """Where a browser opens ``port``'s preview."""
        return self.routes.url(port, label, self.door_port, self.secure)

    def link_url(self, port: int, token: str) -> str:
        """The URL that opens a private preview with a link."""
        exposure = self.exposures.by_port.get(port)
        return (
            f"{self.url(port, exposure.label if exposure else None)}?sbx_link={token}"
        )

    def own_ports(self) -> set[int]:
        """
        The daemon's listeners, the browser's debugging port, and the
        ports the code contexts' kernels listen on for themselves.
        """
        return set(self._listeners()) | self._kernel_ports()

    def _listeners(self) -> frozenset[int]:
        """
        Every port the daemon listens on, whatever the door (the HTTP, PTY,
        E2B and E2B code, KEP REST and gRPC ports, this door's own: see
        :class:`~sandboxd.daemon.listener.OwnPorts`), and the browser's
        debugging port.
        """
        own = self.context.own_ports.numbers()
        if own is not self._own_of:
            self._own = own | {CDP_PORT}
            self._own_of = own
        return self._own

    def _kernel_ports(self) -> set[int]:
        """The ports the live kernels listen on (asked each time: they come and go)."""
        code = self.context.code
        kernels = code.existing() if code is not None else None
        return kernels.kernel_ports() if kernels is not None else set()

    def check_port(self, port: int, rule: EffectiveRule) -> None:
        """
        :raises ApiError: 403 ``port_not_allowed`` (see
            :func:`~sandboxd.preview.exposures.allowed`).  The policy's part
            is worked out once per port and rule (a new policy has new
            rules); the daemon's own ports are checked every time.
        """
        if port in self._listeners() or port in self._kernel_ports():
            raise port_not_allowed(port, "daemon:own_ports")
        if self._allowed.get(port) is rule:
            return
        params = rule.params
        allowed(port, params.ports, params.deny_ports, (), rule.source)
        if len(self._allowed) >= PREVIEW_HOST_CACHE:
            self._allowed.clear()
        self._allowed[port] = rule

    def previewable(self, port: int, rule: EffectiveRule) -> bool:
        """
        Whether :meth:`check_port` would take ``port`` under ``rule`` (the
        rule ``POST /preview/ports`` runs under): what a listing tells a
        person before they ask for a preview that can only be refused.
        """
        try:
            self.check_port(port, rule)
        except ApiError:
            return False
        return True

    def not_exposed(self, port: int) -> ApiError:
        """404 ``port_not_exposed``."""
        return port_not_exposed(port)

    # -- the listener ---------------------------------------------------------

    def _listen(self) -> Deferred[Any]:
        """A new site (no exposure carries over), listening on the door's port."""
        self.site = PreviewSite(self, self.limits)
        endpoint = OwnEndpoint(self.context, self.description)
        listening: Deferred[Any] = endpoint.listen(self.site)
        return listening

    def _listened(self, port: Any) -> None:
        super()._listened(port)
        self.door_port = getattr(port.getHost(), "port", None)

    def _close(self) -> Deferred[Any]:
        """
        Stop listening; end every exposure and its connections.  The
        exposures are not kept for a door that listens again: switching
        the group off is how an operator stops every preview at once (a
        public one included), and an exposure coming back by itself when
        the group is switched on again would undo that.
        """
        ended = self.exposures.close()
        if ended and self.running:
            log.info(
                "preview: the door closed: the exposures of ports {ports} ended "
                "(expose them again once it listens)",
                ports=", ".join(map(str, ended)),
            )
        if self.port is None:
            return succeed(None)
        port, self.port = self.port, None
        stopped = maybeDeferred(port.stopListening)
        site = self.site
        if site is not None:
            stopped.addCallback(lambda _: site.close_all())
        return stopped

    def stopService(self) -> Deferred[Any]:
        """Stop listening, close every exposure's connections and the pool."""
        super().stopService()  # type: ignore[no-untyped-call]
        self.raw.close()
        steps = [self._close(), self.pool.closeCachedConnections()]
        return DeferredList(steps).addCallback(lambda _: None)


def setup(
    context: Any, description: str, limits: ConnectionLimits | None = None
) -> PreviewService:
    """Create the preview door's service (``context.preview``)."""
    service = PreviewService(context, description, limits)
    context.preview = service
    return service
