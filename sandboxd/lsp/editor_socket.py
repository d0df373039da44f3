# -*- test-case-name: tests.lsp.test_connect -*-
"""
The editors' WebSocket (``lsp_connect``): ``GET /lsp/connect`` with
``Upgrade: websocket`` gives an editor (Monaco with monaco-languageclient,
an IDE in a browser) a language server of its own.

The upgrade is an ordinary request of the pipeline: the gate admits it (a
caller without a token or the scope gets its 401 or 403 before any
upgrade), the handler picks the server, checks the root and the bound,
and the pipeline audits it as 101; then :func:`connect_editor` starts the
server and hands the connection to an :class:`EditorSocket` with the
request's head replayed (:meth:`~sandboxd.web.channel.SandboxChannel.take_over`),
which answers the handshake itself.  The frames are relayed by
:class:`~sandboxd.lsp.relay.EditorRelay`; nothing per message is audited.
"""

from __future__ import annotations

import weakref
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from sandboxd.access import held as held_connections
from sandboxd.lsp.relay import INTERNAL_ERROR, EditorRelay
from sandboxd.lsp.service import LspService
from sandboxd.policy.defaults import (
    WS_CLOSE_SECONDS,
    WS_HANDSHAKE_SECONDS,
    WS_PING_SECONDS,
    WS_PING_TIMEOUT_SECONDS,
)
from sandboxd.web.sending import send_now
from sandboxd.web.websocket_server import (
    WebSocketServerFactory,
    WebSocketServerProtocol,
    request_head,
    server_options,
)

log = Logger(namespace="sandboxd.lsp")

#: Close code for a binary frame (RFC 6455 §7.4.1).
UNSUPPORTED_DATA = 1003

#: The longest close reason a frame carries, in bytes (RFC 6455 §5.5).
MAX_REASON_BYTES = 123


@implementer(IPushProducer)
class _Flow:
    """
    The socket's producer on its transport: an editor that reads slowly
    stops the server's output being read (the server then waits in its
    own write), and one that drained lets it flow again.
    """

    def __init__(self, relay: EditorRelay) -> None:
        self.relay = relay

    def pauseProducing(self) -> None:
        self.relay.hold("editor not reading")

    def resumeProducing(self) -> None:
        self.relay.release("editor not reading")

    def stopProducing(self) -> None:
        """The connection is going; :meth:`EditorSocket.connectionLost` ends the server."""


class EditorSocket(WebSocketServerProtocol):
    """One editor's socket: its frames to and from its own language server."""

    factory: EditorSocketFactory
    relay: EditorRelay
    service: LspService
    #: Why the server could not be started, said once the socket is open.
    failure: str | None = None
    #: Its entry among the connections a reload asks again, and where.
    held: held_connections.Held | None = None
    held_in: Any = None

    def __init__(self) -> None:
        super().__init__()
        #: Fires once the connection is gone.
        self.ended: Deferred[None] = Deferred()

    def onConnect(self, request: Any) -> None:
        """The gate and the handler have admitted the upgrade: accept it."""
        return None

    def onOpen(self) -> None:
        """The handshake is done: the server's output flows to the editor."""
        if self.failure is not None:
            self.hang_up(INTERNAL_ERROR, self.failure)
            return
        transport: Any = self.transport
        transport.registerProducer(_Flow(self.relay), True)
        self.relay.editor_opened()

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        """One message of the editor's (autobahn has closed 1009 on one over the bound)."""
        if isBinary:
            self.hang_up(
                UNSUPPORTED_DATA, "text frames only: one JSON-RPC message per frame"
            )
            return
        self.relay.from_editor(payload)

    def send(self, body: bytes) -> None:
        """One message to the editor, as a text frame, sent now."""
        if self.state != self.STATE_OPEN:
            return
        self.sendMessage(body, isBinary=False)  # type: ignore[no-untyped-call]
        send_now(self.transport)

    def hang_up(self, code: int, reason: str) -> None:
        """
        Close with ``code`` (``sendClose`` takes only 1000 and 3000-4999);
        autobahn drops a client that does not answer the close in time.
        """
        if self.state == self.STATE_OPEN:
            self.sendCloseFrame(code=code, reasonUtf8=_reason(reason))
        elif self.state == self.STATE_CONNECTING and self.transport is not None:
            self.transport.loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """The socket is gone: so is its server, whole tree."""
        if self.held is not None:
            held_connections.release(self.held_in, self.held)
        self.service.remove_editor(self.relay).addErrback(
            lambda f: log.failure("ending an editor's language server", f)
        )
        super().connectionLost(reason)
        if not self.ended.called:
            self.ended.callback(None)


def _reason(text: str) -> bytes:
    """``text`` cut to fit a close frame, never inside a character."""
    cut = text.encode("utf-8")[:MAX_REASON_BYTES]
    return cut.decode("utf-8", "ignore").encode("utf-8")


class EditorSocketFactory(WebSocketServerFactory):
    """The editors' sockets of one daemon: autobahn's options, set once."""

    protocol = EditorSocket  # type: ignore[assignment]

    def __init__(self, reactor: Any) -> None:
        # No Server header: the daemon does not name its libraries.
        super().__init__(reactor=reactor, server=None)  # type: ignore[no-untyped-call]
        self.setProtocolOptions(  # type: ignore[no-untyped-call]
            **server_options(
                WS_PING_SECONDS,
                WS_PING_TIMEOUT_SECONDS,
                WS_HANDSHAKE_SECONDS,
                WS_CLOSE_SECONDS,
            )
        )


_FACTORIES: weakref.WeakKeyDictionary[LspService, EditorSocketFactory] = (
    weakref.WeakKeyDictionary()
)


def factory_of(service: LspService) -> EditorSocketFactory:
    """The daemon's factory of editors' sockets, made on the first upgrade."""
    factory = _FACTORIES.get(service)
    if factory is None:
        factory = _FACTORIES[service] = EditorSocketFactory(service.reactor)
    return factory


def connect_editor(
    service: LspService,
    relay: EditorRelay,
    argv: list[str],
    env: dict[str, str],
    raw: Any,
) -> None:
    """
    The upgrade was admitted and audited: count the editor's server, start
    it, and give the connection to a new :class:`EditorSocket`, the
    request's head replayed.  A server that cannot start closes the socket
    with 1011 once it is open, saying why.
    """
    channel: Any = raw.channel
    transport = channel.transport if channel is not None else None
    if transport is None:
        return
    protocol: Any = factory_of(service).buildProtocol(transport.getPeer())
    protocol.relay = relay
    protocol.service = service
    limit = relay.limits["max_message_bytes"]
    protocol.maxMessagePayloadSize = limit
    protocol.maxFramePayloadSize = limit
    service.add_editor(relay)
    admission = getattr(raw, "admission", None)
    if admission is not None:
        # A reload that takes the editor's access away closes the socket
        # (and so ends its server).
        protocol.held_in = raw.context
        protocol.held = held_connections.hold(
            raw.context,
            admission.identity,
            admission.endpoint,
            lambda e: protocol.hang_up(held_connections.POLICY_VIOLATION, e.message),
        )
    try:
        relay.start(argv, env)
    except OSError as e:
        protocol.failure = f"could not start {argv[0]}: {e.strerror or e}"
    else:
        relay.attach(protocol, transport)
    channel.take_over(protocol, replay=request_head(raw))
