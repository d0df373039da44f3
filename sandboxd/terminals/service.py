# -*- test-case-name: tests.routes.test_terminal -*-
"""
The terminal group's service: the session table and the WebSocket listener
on the PTY port (SPEC §7.5, §8), and which shell a new session runs.

Stopping it stops listening, closes every WebSocket (1001) and ends every
session's whole process tree, within a bound.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred
from twisted.internet.protocol import Factory
from twisted.logger import Logger

from sandboxd.daemon.listener import OwnEndpoint
from sandboxd.daemon.readiness import Opening
from sandboxd.errors import (
    bad_request,
    internal,
)
from sandboxd.policy.defaults import KILL_GRACE_SECONDS
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import check_shell, find_executable, shell_allowed
from sandboxd.terminals.table import TerminalTable

if TYPE_CHECKING:
    from sandboxd.terminals.websocket import PtyServerFactory

log = Logger(namespace="sandboxd.terminal")

TERM = "xterm-256color"


class TerminalService(Service):
    """
    The terminal sessions and the PTY WebSocket port.

    Stopping it stops listening, closes every WebSocket (1001) and ends
    every session's whole process tree, within a bound.
    """

    name = "terminals"

    def __init__(self, context: Any, timers: bool = True) -> None:
        self.context = context
        self.table = TerminalTable(context.reactor, context.children)
        self.timers = timers
        self._factory: PtyServerFactory | None = None
        self.port: Any = None
        self._opening: Opening | None = None

    @property
    def factory(self) -> PtyServerFactory:
        """
        The WebSocket factory, built on the first connection: autobahn (and
        the WAMP and CBOR modules it drags in) is imported then, not at start.
        """
        if self._factory is None:
            from sandboxd.terminals.websocket import PtyServerFactory

            rule = self.context.policy.rules["pty_connect"]
            # The HTTP port's bounds (--head-deadline, the per-address cap).
            site = getattr(self.context.metrics, "site", None)
            table = getattr(site, "table", None)
            self._factory = PtyServerFactory(
                self.context,
                self.table,
                reactor=self.context.reactor,
                timers=self.timers,
                max_message_bytes=rule.limits.max_message_bytes,
                limits=getattr(table, "limits", None),
            )
        return self._factory

    def privilegedStartService(self) -> None:
        """Listen on the PTY port (twistd calls this before ``startService``)."""
        super().privilegedStartService()  # type: ignore[no-untyped-call]
        self._listen()

    def startService(self) -> None:
        """Listen on the PTY port when ``pty_connect`` is enabled."""
        super().startService()  # type: ignore[no-untyped-call]
        self._listen()

    def _listen(self) -> None:
        if self._opening is not None:
            return
        self._opening = Opening()
        context = self.context
        if not context.policy.rules["pty_connect"].enabled or not context.pty_listen:
            self._opening.skip()
            return
        endpoint = OwnEndpoint(context, context.pty_listen)
        self._opening.start(
            endpoint.listen(_OnFirstConnection(self)), self._listened, self._failed
        )

    def listening(self) -> Deferred[Any]:
        """
        Fires once the PTY port listens (or is off); fails when it cannot
        listen. The HTTP listener waits for it (see :mod:`sandboxd.daemon.readiness`).
        """
        self._listen()
        assert self._opening is not None
        return self._opening.listening()

    def _listened(self, port: Any) -> None:
        self.port = port
        address = port.getHost()
        if hasattr(address, "port"):
            self.context.pty_port = address.port

    def _failed(self, failure: Any) -> None:
        log.error(
            "sandboxd: cannot listen on the PTY port {port}: {error}",
            error=failure.getErrorMessage(),
            port=self.context.pty_listen,
        )

    def stopService(self) -> Deferred[Any]:
        """Stop listening, close every client, end every session."""
        super().stopService()  # type: ignore[no-untyped-call]
        stopping = []
        if self.port is not None:
            stopping.append(maybeDeferred(self.port.stopListening))
            self.port = None
        self._opening = None
        if self._factory is not None:
            self._factory.close_all()
        stopping.extend(self.table.close_all())
        d: Deferred[Any] = DeferredList(stopping, consumeErrors=True)
        d.addTimeout(KILL_GRACE_SECONDS + 2, self.context.reactor)
        d.addErrback(
            lambda f: log.warn(
                "sandboxd: terminals did not all end: {f}", f=f.getErrorMessage()
            )
        )
        return d


class _OnFirstConnection(Factory):
    """The PTY port's factory until the first connection builds the real one."""

    noisy = False

    def logPrefix(self) -> str:
        """What the port's log lines call it (``pty starting on 9001``)."""
        return "pty"

    def __init__(self, service: TerminalService) -> None:
        self.service = service

    def buildProtocol(self, addr: Any) -> Any:
        """The WebSocket protocol of :attr:`TerminalService.factory`."""
        return self.service.factory.buildProtocol(addr)


def choose_shell(
    requested: Any, env: dict[str, str], rule: EffectiveRule
) -> tuple[str, str]:
    """The shell's name and absolute path: the requested one, else ``$SHELL``,
    bash or sh, whichever the policy allows and the child's PATH has."""
    allowed = rule.params.shells
    if requested is not None:
        requested = check_shell(requested, rule)
        name = os.path.basename(requested)
        path = find_executable(requested, env)
        if path is None:
            raise bad_request(f"shell not found: {requested}")
        return name, path
    candidates = [env.get("SHELL", ""), "bash", "sh", *allowed]
    for candidate in candidates:
        if candidate and shell_allowed(candidate, allowed):
            path = find_executable(candidate, env)
            if path is not None:
                return os.path.basename(candidate), path
    raise internal("no allowed shell was found on PATH", "OSError")
