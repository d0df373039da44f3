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

from twisted.application.service import Service
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger
from twisted.python.failure import Failure

from sandboxd.daemon.readiness import Opening
from sandboxd.e2b import codeinterp, controlplane, filesystem, process, rest
from sandboxd.e2b.door import Door, Procedure
from sandboxd.web.connections import ConnectionLimits

log = Logger(namespace="sandboxd.e2b")


def procedures() -> dict[str, Procedure]:
    """Everything the door serves, by ``package.Service/Method`` or ``METHOD /path``."""
    return {
        **process.PROCEDURES,
        **filesystem.PROCEDURES,
        **rest.PROCEDURES,
        **codeinterp.PROCEDURES,
        **controlplane.PROCEDURES,
    }


class E2BService(Service):
    """
    The envd-compatible listener.

    :ivar port: the listening port once it listens (None otherwise).
    """

    name = "e2b"

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
        self.context = context
        self.description = description
        self.code_description = code_description
        self.code_port: Any = None
        self.door = Door(context, procedures(), limits)
        self.processes = process.ProcessDoor()
        self.watchers = filesystem.Watchers(context.reactor)
        self.port: Any = None
        self._opening = Opening()
        self._relistening: Deferred[Any] | None = None

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
            self._opening.skip()
            return
        # A port that cannot bind now fails the start (SPEC §20), as the
        # HTTP and PTY ports' do.
        self._opening.start(self._listen_all(), self._listened, self._failed)

    def _listen_all(self) -> Deferred[Any]:
        """Listen on the door's port, and its code port when one is given."""
        site = self.door.site()
        endpoint = serverFromString(self.context.reactor, self.description)
        if self.code_description is None:
            listening: Deferred[Any] = endpoint.listen(site)
            return listening
        code = serverFromString(self.context.reactor, self.code_description)

        def both(ports: list[Any]) -> Any:
            self.code_port = ports[1]
            return ports[0]

        return gatherResults(
            [endpoint.listen(site), code.listen(site)], consumeErrors=True
        ).addCallback(both)

    def _listened(self, port: Any) -> None:
        # A wide-open port without a token was refused or warned about at
        # start, with the others (sandboxd.daemon.startup.check_exposure).
        self.port = port

    def _failed(self, failure: Failure) -> None:
        log.error(
            "sandboxd: cannot listen on the E2B port {port}: {error}",
            error=failure.getErrorMessage(),
            port=self.description,
        )

    def listening(self) -> Deferred[Any]:
        """
        Fires with the port once it listens (None when the ``e2b`` endpoint
        is off); fails when it cannot listen.  The HTTP listener waits for
        it, so the first ``200 /health`` means the E2B port serves too (see
        :mod:`sandboxd.daemon.readiness`).
        """
        return self._opening.listening()

    def policy_reloaded(self) -> None:
        """
        A new policy is in force.  The port listens exactly while the
        ``e2b`` endpoint is enabled (SPEC §18): a reload that turns it off
        stops listening and closes the open connections and watchers, and
        one that turns it back on listens again.  The processes and
        terminals started through the door are the sandbox's: they stay.
        """
        if not self.running:
            return
        enabled = self.context.policy.rules["e2b"].enabled
        if not enabled:
            if self.port is not None:
                log.info(
                    "sandboxd: the e2b endpoint is disabled by the new policy: "
                    "the E2B port {port} stops listening",
                    port=self.description,
                )
            self._close()
        elif self.port is None and self._relistening is None:
            self._listen_again()

    def _listen_again(self) -> None:
        self._relistening = self._listen_all()

        def listened(port: Any) -> None:
            self._relistening = None
            self.port = port
            if not self.running or not self.context.policy.rules["e2b"].enabled:
                self._close()  # stopped or turned off while it was binding
            else:
                log.info(
                    "sandboxd: the e2b endpoint is enabled by the new policy: "
                    "the E2B port {port} listens",
                    port=self.description,
                )

        def failed(failure: Failure) -> None:
            self._relistening = None
            log.error(
                "sandboxd: cannot listen on the E2B port {port}: {error}",
                error=failure.getErrorMessage(),
                port=self.description,
            )

        self._relistening.addCallbacks(listened, failed)

    def _close(self) -> Deferred[Any]:
        """Stop listening, close every connection, remove the watchers."""
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
