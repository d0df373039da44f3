# -*- test-case-name: tests.preview.test_door,tests.e2b.test_door -*-
"""
A door's port that listens exactly while its endpoint is enabled.

The E2B port and the preview port behave alike: nothing listens unless
both the command line (the port given) and the policy (the endpoint
enabled) say so; a port that cannot bind at start fails the start; a
policy reload that turns the endpoint off stops listening and closes what
the door holds open, and one that turns it back on listens again.  What
differs between doors (what listens, what closing ends) is each
subclass's.
"""

from __future__ import annotations

from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from sandboxd.daemon.readiness import Opening

log = Logger(namespace="sandboxd.daemon")


class OwnPorts:
    """
    The TCP ports the daemon listens on: every door's, whichever door.

    The preview door refuses each of them (the KEP and E2B-code ports
    included: exposing one would hand that door to whoever reaches the
    preview).  It is filled by :class:`OwnEndpoint`, the one way the
    daemon listens, rather than from a list of doors kept by hand, which
    forgot the doors added after it was written.
    """

    def __init__(self) -> None:
        #: Each listening port and its number.
        self._ports: dict[Any, int] = {}
        self._numbers: frozenset[int] = frozenset()

    def add(self, port: Any) -> None:
        """``port`` (an ``IListeningPort``) listens now."""
        number = getattr(port.getHost(), "port", None)
        if isinstance(number, int) and number:
            self._ports[port] = number
            self._numbers = frozenset(self._ports.values())

    def numbers(self) -> frozenset[int]:
        """
        The port numbers listened on now (a port that stopped listening is
        dropped here: Twisted's ``Port`` says so with ``connected``).
        """
        ended = [p for p in self._ports if not getattr(p, "connected", True)]
        if ended:
            for port in ended:
                del self._ports[port]
            self._numbers = frozenset(self._ports.values())
        return self._numbers


def parsed_endpoint(reactor: Any, description: str) -> Any:
    """
    Twisted's endpoint for ``description`` (parsed, not listening): the one
    place that calls ``serverFromString``, so every listener goes through
    :class:`OwnEndpoint`.
    """
    return serverFromString(reactor, description)


@implementer(IStreamServerEndpoint)
class OwnEndpoint:
    """
    An endpoint string the daemon listens on for itself: once it listens,
    its port joins ``context.own_ports`` (:class:`OwnPorts`).  Every door
    listens through this (a test checks that nothing else in the package
    calls ``serverFromString``).
    """

    def __init__(self, context: Any, description: str) -> None:
        self.context = context
        self.endpoint = parsed_endpoint(context.reactor, description)

    def listen(self, protocolFactory: Any) -> Deferred[Any]:
        """Listen, and count the port as the daemon's own."""
        listening: Deferred[Any] = self.endpoint.listen(protocolFactory)

        def listened(port: Any) -> Any:
            self.context.own_ports.add(port)
            return port

        return listening.addCallback(listened)


class PolicyListener(Service):
    """
    The listen, stop and relisten of one door's port, following the policy.

    Subclasses set :attr:`endpoint` and :attr:`port_name`, and give
    :meth:`_listen` and :meth:`_close`; they may extend :meth:`_listened`.

    :ivar port: the listening port once it listens (None otherwise).
    """

    #: The endpoint whose rule decides whether the port listens.
    endpoint = ""
    #: How the log names the port ("the E2B port").
    port_name = ""

    def __init__(self, context: Any, description: str) -> None:
        self.context = context
        self.description = description
        self.port: Any = None
        self._opening = Opening()
        self._relistening: Deferred[Any] | None = None

    def _listen(self) -> Deferred[Any]:
        """Listen on the door's port(s); fires with the port."""
        raise NotImplementedError

    def _close(self) -> Deferred[Any]:
        """Stop listening and end what the door holds open."""
        raise NotImplementedError

    def _enabled(self) -> bool:
        return bool(self.context.policy.rules[self.endpoint].enabled)

    def startService(self) -> None:
        """Listen, if the endpoint is enabled."""
        super().startService()  # type: ignore[no-untyped-call]
        rule = self.context.policy.rules[self.endpoint]
        if not rule.enabled:
            log.info(
                "sandboxd: the {endpoint} endpoint is disabled ({rule}): "
                "{name} {port} does not listen",
                endpoint=self.endpoint,
                rule=rule.enabled_by,
                name=self.port_name,
                port=self.description,
            )
            self._opening.skip()
            return
        # A port that cannot bind now fails the start, as the HTTP and PTY
        # ports' do.
        self._opening.start(self._listen(), self._listened, self._failed)

    def _listened(self, port: Any) -> None:
        # A wide-open port without a token was refused or warned about at
        # start, with the others (sandboxd.daemon.startup.check_exposure).
        self.port = port

    def _failed(self, failure: Failure) -> None:
        log.error(
            "sandboxd: cannot listen on {name} {port}: {error}",
            name=self.port_name,
            error=failure.getErrorMessage(),
            port=self.description,
        )

    def listening(self) -> Deferred[Any]:
        """
        Fires with the port once it listens (None when the endpoint is
        off); fails when it cannot listen.  The HTTP listener waits for
        it, so the first ``200 /health`` means this port serves too (see
        :mod:`sandboxd.daemon.readiness`).
        """
        return self._opening.listening()

    def policy_reloaded(self) -> None:
        """
        A new policy is in force: the port listens exactly while the
        endpoint is enabled.
        """
        if not self.running:
            return
        if not self._enabled():
            if self.port is not None:
                log.info(
                    "sandboxd: the {endpoint} endpoint is disabled by the new "
                    "policy: {name} {port} stops listening",
                    endpoint=self.endpoint,
                    name=self.port_name,
                    port=self.description,
                )
                self._close()
        elif self.port is None and self._relistening is None:
            self._listen_again()

    def _listen_again(self) -> None:
        self._relistening = self._listen()

        def listened(port: Any) -> None:
            self._relistening = None
            self._listened(port)
            if not self.running or not self._enabled():
                self._close()  # stopped or turned off while it was binding
            else:
                log.info(
                    "sandboxd: the {endpoint} endpoint is enabled by the new "
                    "policy: {name} {port} listens",
                    endpoint=self.endpoint,
                    name=self.port_name,
                    port=self.description,
                )

        def failed(failure: Failure) -> None:
            self._relistening = None
            self._failed(failure)

        self._relistening.addCallbacks(listened, failed)
