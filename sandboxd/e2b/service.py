# -*- test-case-name: tests.e2b.test_door -*-
"""
The E2B port's service: listens when ``--e2b-port`` is given *and* the
``e2b`` endpoint is enabled (SPEC §18: nothing listens unless both say so),
and at shutdown stops listening and removes its watchers.  The processes
and terminals it started belong to the daemon's process and terminal
services, which end them.
"""

from __future__ import annotations

from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger

from sandboxd.e2b import filesystem, process, rest
from sandboxd.e2b.door import Door, Procedure

log = Logger(namespace="sandboxd.e2b")


def procedures() -> dict[str, Procedure]:
    """Everything the door serves, by ``package.Service/Method`` or ``METHOD /path``."""
    return {**process.PROCEDURES, **filesystem.PROCEDURES, **rest.PROCEDURES}


class E2BService(Service):
    """
    The envd-compatible listener.

    :ivar port: the listening port once it listens (None otherwise).
    :ivar listening: fires with the port (or None when it does not listen).
    """

    name = "e2b"

    def __init__(self, context: Any, description: str) -> None:
        self.context = context
        self.description = description
        self.door = Door(context, procedures())
        self.processes = process.ProcessDoor()
        self.watchers = filesystem.Watchers(context.reactor)
        self.port: Any = None
        self.listening: Deferred[Any] = Deferred()

    def startService(self) -> None:
        """Listen, if the ``e2b`` endpoint is enabled."""
        super().startService()  # type: ignore[no-untyped-call]
        rule = self.context.policy.rules["e2b"]
        if not rule.enabled:
            log.info(
                "sandboxd: the e2b endpoint is disabled ({rule}): the E2B port "
                "{port} does not listen",
                rule=rule.enabled_by,
                port=self.description,
            )
            self.listening.callback(None)
            return
        endpoint = serverFromString(self.context.reactor, self.description)
        d = endpoint.listen(self.door.site())
        failed: list[Any] = []
        d.addCallbacks(self._listened, failed.append)
        if failed:
            # The port cannot bind now: the start fails (SPEC §20), as the
            # HTTP and PTY ports' do.
            self.listening.callback(None)
            failed[0].raiseException()
        d.addErrback(self._failed)

    def _listened(self, port: Any) -> None:
        # A wide-open port without a token was refused or warned about at
        # start, with the others (sandboxd.startup.check_exposure).
        self.port = port
        self.listening.callback(port)

    def _failed(self, failure: Any) -> None:
        log.error(
            "sandboxd: cannot listen on the E2B port {port}: {error}",
            error=failure.getErrorMessage(),
            port=self.description,
        )
        if not self.listening.called:
            self.listening.callback(None)

    def stopService(self) -> Deferred[Any]:
        """Stop listening; remove the watchers."""
        super().stopService()  # type: ignore[no-untyped-call]
        self.watchers.remove_all()
        self.processes.stop()
        if self.port is None:
            return succeed(None)
        port, self.port = self.port, None
        d = maybeDeferred(port.stopListening)
        d.addCallback(lambda _: self.door.site().close_all())
        return d


def setup(context: Any, description: str) -> E2BService:
    """Create the E2B service (``context.e2b``)."""
    service = E2BService(context, description)
    context.e2b = service
    return service
