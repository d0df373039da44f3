# -*- test-case-name: tests.test_readiness -*-
"""
What "ready" means: the first ``200 /health`` a client sees promises that the
policy is loaded and every listener the daemon opens is listening.

The policy is compiled in :func:`sandboxd.server.build`, before any service
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

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.python.failure import Failure
from zope.interface import implementer


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


def all_listening(services: Iterable[Any]) -> Deferred[Any]:
    """
    Fires once every service with a ``listening()`` method listens; fails
    with the first failure (a listener that cannot bind).
    """
    waiting = [s.listening() for s in services if hasattr(s, "listening")]
    d: Deferred[Any] = gatherResults(waiting, consumeErrors=True)

    def first_error(failure: Failure) -> Failure:
        inner = getattr(failure.value, "subFailure", None)
        return inner if isinstance(inner, Failure) else failure

    d.addErrback(first_error)
    return d
