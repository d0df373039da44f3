# -*- test-case-name: tests.test_readiness -*-
"""
What "ready" means: the first ``200 /health`` a client sees promises that the
policy is loaded and every listener the daemon opens is listening.

The policy is compiled in :func:`sandboxd.daemon.server.build`, before any service
starts.  The HTTP listener is the one that answers ``/health``, so it opens
last: its endpoint is wrapped in :class:`ListenAfter`, which listens only once
every group service's ``listening()`` Deferred has fired (the PTY port of
:class:`~sandboxd.terminals.service.TerminalService`).  A group that cannot
listen fails the HTTP listener's start too, so a daemon that cannot serve a
terminal never claims to be healthy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred, gatherResults, succeed
from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

log = Logger(namespace="sandboxd")


@implementer(IStreamServerEndpoint)
class ListenAfter:
    """An endpoint that listens once ``first()`` has fired (and not if it fails)."""

    def __init__(
        self, endpoint: IStreamServerEndpoint, first: Callable[[], Deferred[Any]]
    ) -> None:
        self.endpoint = endpoint
        self.first = first

    def listen(self, protocolFactory: Any) -> Deferred[Any]:
        """Listen on the wrapped endpoint after ``first()``; fails as it does."""
        d = self.first()
        d.addCallback(lambda _: self.endpoint.listen(protocolFactory))
        return d


class Opening:
    """
    The listen of a port a group service opens itself (the PTY port, the
    E2B port), shared by the way each must behave:

    - a listen that fails at once raises from :meth:`start`, so the start
      fails (SPEC §20), with the one line the start-up prints;
    - one that fails later is handed to ``late_failure`` (to log it);
    - :meth:`listening` gives every waiter the port (None when the port is
      off), or the failure, whenever it asks.
    """

    def __init__(self) -> None:
        self._done: Deferred[Any] = Deferred()
        self.failure: Failure | None = None

    def skip(self) -> None:
        """The port is off: nothing listens, and waiters go on."""
        self._done.callback(None)

    def start(
        self,
        listen: Deferred[Any],
        listened: Callable[[Any], None],
        late_failure: Callable[[Failure], None],
    ) -> None:
        """
        Follow ``listen`` (an endpoint's); ``listened(port)`` once it
        listens.

        :raises Exception: the listen's failure, when it failed at once.
        """
        now = True

        def got(port: Any) -> None:
            listened(port)
            self._done.callback(port)

        def failed(failure: Failure) -> None:
            self.failure = failure
            if not now:
                late_failure(failure)
            self._done.callback(None)

        listen.addCallbacks(got, failed)
        now = False
        if self.failure is not None:
            self.failure.raiseException()

    def listening(self) -> Deferred[Any]:
        """Fires with the port (or None when off); fails when it cannot listen."""
        d: Deferred[Any] = Deferred()

        def fire(result: Any) -> Any:
            if self.failure is not None:
                d.errback(self.failure)
            else:
                d.callback(result)
            return result

        self._done.addBoth(fire)
        return d


def all_listening(services: Iterable[Any]) -> Deferred[Any]:
    """
    Fires once every service with a ``listening()`` method listens; fails
    with the first failure (a listener that cannot bind).
    """
    # Looked up on the class: a stand-in that builds its object on first
    # attribute read (a door on first use) must not be built by asking.
    waiting = [s.listening() for s in services if hasattr(type(s), "listening")]
    d: Deferred[Any] = gatherResults(waiting, consumeErrors=True)

    def first_error(failure: Failure) -> Failure:
        inner = getattr(failure.value, "subFailure", None)
        return inner if isinstance(inner, Failure) else failure

    d.addErrback(first_error)
    return d


class Listener(Service):
    """
    A listening port as a service: Twisted's ``StreamServerEndpointService``
    without importing :mod:`twisted.application.internet`, whose client
    services pull in automat's state machines (a quarter of the daemon's
    own start-up CPU).  Same attributes (``endpoint``, ``factory``,
    ``_waitingForPort``, ``_raiseSynchronously``) and behaviour: listen in
    the privileged phase (or at start), stop listening or cancel on stop.
    """

    _raiseSynchronously = False

    def __init__(self, endpoint: IStreamServerEndpoint, factory: Any) -> None:
        self.endpoint = endpoint
        self.factory = factory
        self._waitingForPort: Deferred[Any] | None = None

    def privilegedStartService(self) -> None:
        """Listen; raise at once if told to and the listen fails at once."""
        super().privilegedStartService()  # type: ignore[no-untyped-call]
        self._waitingForPort = self.endpoint.listen(self.factory)
        raised_now: list[Failure] = []

        def handle(failure: Failure) -> None:
            if self._raiseSynchronously:
                raised_now.append(failure)
            elif not failure.check(CancelledError):
                log.failure("sandboxd: cannot listen", failure)

        self._waitingForPort.addErrback(handle)
        if raised_now:
            raised_now[0].raiseException()
        self._raiseSynchronously = False

    def startService(self) -> None:
        """Listen, unless :meth:`privilegedStartService` already did."""
        super().startService()  # type: ignore[no-untyped-call]
        if self._waitingForPort is None:
            self.privilegedStartService()

    def stopService(self) -> Deferred[None]:
        """Stop listening, or cancel a listen still under way."""
        super().stopService()  # type: ignore[no-untyped-call]
        waiting = self._waitingForPort
        if waiting is None:
            return succeed(None)
        waiting.cancel()

        def stop(port: Any) -> Any:
            if port is not None:
                return port.stopListening()
            return None

        d: Deferred[None] = waiting.addCallback(stop)
        d.addErrback(lambda f: f.trap(CancelledError) and None)
        return d
