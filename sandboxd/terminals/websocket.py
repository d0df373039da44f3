# -*- test-case-name: tests.terminals.test_websocket -*-
"""
The PTY WebSocket (SPEC §8): ``ws://HOST:PTY_PORT/pty?session_id=ID``
(``/`` in place of ``/pty`` as well, as on the seed).

Autobahn does the framing; this module decides who may connect (the same
tokens, scope, Origin and Host rules as the HTTP port, checked during the
handshake so a refusal is a plain HTTP status), and bridges one socket to
one :class:`~sandboxd.terminals.session.PtySession` with flow control both ways.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlencode

from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

from sandboxd.access import gate
from sandboxd.access.auth import Identity
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    forbidden,
    malformed_request,
    no_route,
    unavailable,
)
from sandboxd.policy.defaults import (
    PTY_MAX_CONNECTIONS,
    PTY_MAX_CONNECTIONS_PER_ADDRESS,
    WS_CLOSE_SECONDS,
    WS_PING_SECONDS,
    WS_PING_TIMEOUT_SECONDS,
)
from sandboxd.policy.rules import EffectiveRule
from sandboxd.terminals.frames import client_text_payload, server_text_frame
from sandboxd.terminals.session import PtySession
from sandboxd.terminals.table import TerminalTable
from sandboxd.web.connections import ConnectionLimits, ConnectionTable
from sandboxd.web.heads import HeadError, parse_head
from sandboxd.web.params import dimension
from sandboxd.web.sending import raw_json_response, send_now, write_now
from sandboxd.web.websocket_server import (
    ConnectionDeny,
    WebSocketServerFactory,
    WebSocketServerProtocol,
)

log = Logger(namespace="sandboxd.terminals.websocket")

#: Close codes (RFC 6455 §7.4.1) and the seed's reasons.
POLICY_VIOLATION = 1008
GOING_AWAY = 1001
NORMAL = 1000
#: Application code for a client dropped for leaving output unread.
SLOW_CLIENT = 4008

WS_PATH = "/pty"
#: The paths the PTY port answers: ``/pty``, and ``/``, which the seed's
#: server takes too (it reads only the query).
WS_PATHS = frozenset({WS_PATH, ""})
#: Query parameters a token may come in: ours (SPEC §4), and the seed's
#: ``token``, which its ``ws_url`` carries.
QUERY_TOKEN_PARAMS = ("access_token", "token")


def _raw_headers(request: Any) -> dict[bytes, list[bytes]]:
    """The handshake's headers as the gate reads them (lower-cased names)."""
    return {
        k.encode("latin-1"): [v.encode("latin-1", "replace")]
        for k, v in request.headers.items()
    }


@implementer(IPushProducer)
class _OutputLink:
    """
    Registered with the socket's transport in place of the PTY: a full
    socket pauses the session (for everyone), a drained one resumes it, and
    a lost one only detaches (the PTY itself is never handed to a socket).
    """

    def __init__(self, protocol: PtyServerProtocol) -> None:
        self.protocol = protocol

    def pauseProducing(self) -> None:
        if self.protocol.session is not None:
            self.protocol.session.pause(self.protocol)

    def resumeProducing(self) -> None:
        if self.protocol.session is not None:
            self.protocol.session.resume(self.protocol)

    def stopProducing(self) -> None:
        self.protocol.detach()


class PtyServerProtocol(WebSocketServerProtocol):
    """One client of one terminal session."""

    factory: PtyServerFactory
    session: PtySession | None = None
    identity: Identity | None = None
    session_id: str | None = None
    offset: int | None = None
    _input_paused = False
    _abort_timer: Any = None
    _refusal: ApiError | None = None
    #: Whether the connection came over TLS, when the factory's own port
    #: does not say (the API port hands connections to the PTY factory).
    secure: bool | None = None
    #: The path the client asked for, when it differs from the handshake
    #: autobahn reads (``/pty/sessions/ID/ws`` on the API port), for the audit.
    asked_path: str | None = None
    #: The client's address, for the factory's per-address share.
    peer_host = ""
    #: The handshake's head is read whole (or was refused): it is no
    #: longer checked as it comes.
    _head_read = False
    #: Refused at a connection cap: what the client still sends is dropped.
    _shut = False

    # -- connections ----------------------------------------------------------

    def connectionMade(self) -> None:
        """
        Count the connection in the factory's table, which makes room at a
        cap by closing the connection whose handshake has been on its way
        the longest (see :class:`~sandboxd.web.connections.ConnectionTable`),
        or refuses it with 503 ``unavailable``: silent sockets that never
        send a handshake cannot keep every client from its terminal.
        """
        peer = self.transport.getPeer() if self.transport is not None else None
        self.peer_host = str(getattr(peer, "host", "") or "")
        super().connectionMade()
        if not self.factory.table.admit(self):
            self._shut = True
            error = unavailable(
                "the terminal port holds as many connections as it may; "
                "try again shortly",
                "ConnectionLimit",
                retry_after=1,
            )
            headers = list(error.headers.items())
            self.sendData(raw_json_response(error.status, error.body(), headers))
            self._hang_up()

    def connectionLost(self, reason: Any = None) -> None:
        """Uncount the connection."""
        self.factory.table.forget(self)
        super().connectionLost(reason)

    def close_idle(self) -> None:
        """(Never idle: a WebSocket is busy once its handshake is read.)"""
        self._abort()

    def close_slow(self) -> None:
        """Reclaimed at a cap while its handshake was still on its way."""
        self._shut = True
        self._abort()

    def close_slow_body(self) -> None:
        """(A handshake has no body.)"""
        self._abort()

    def _check_head(self, data: bytes) -> bool:
        """
        Bound the handshake's head as the HTTP port bounds a request's
        (:mod:`sandboxd.web.heads`: its size, its header count, its
        framing): autobahn buffers the head until it ends, however long,
        before anything is checked.  Whether ``data`` may go on to autobahn.
        """
        try:
            head = parse_head(bytes(getattr(self, "data", b"") or b"") + data)
        except HeadError as e:
            self._head_read = self._shut = True
            self.factory.table.head_done(self)
            error = malformed_request(
                f"malformed HTTP request: {e.reason}", e.status, "HeadError"
            )
            self.sendData(raw_json_response(error.status, error.body()))
            self._hang_up()
            return False
        if head is not None:
            self._head_read = True
            self.factory.table.head_done(self)
        return True

    @property
    def _tcp(self) -> Any:
        """The TCP transport (a producer and consumer, not just ITransport)."""
        return self.transport

    # -- handshake ------------------------------------------------------------

    def onConnect(self, request: Any) -> None:
        """
        Admit or refuse the upgrade through the gate (SPEC §16), so a refusal
        carries the same §6 code as on the HTTP port, as a plain HTTP status
        with a JSON body; every handshake is one audit line (``via: ws``).

        :raises ConnectionDeny: with the refusal's status.
        """
        started = time.monotonic()
        endpoint = self.factory.context.table.get("pty_connect")
        try:
            passed = self._admit(request, endpoint)
        except gate.Refused as e:
            self._refusal = e.error
            self.identity = e.identity
            self._audit(request, started, e.error, e.rule)
            raise ConnectionDeny(e.error.status, e.error.message) from None
        self._audit(request, started, None, passed.rule)

    def _admit(self, request: Any, endpoint: Any) -> gate.Passed:
        context = self.factory.context
        if request.path.rstrip("/") not in WS_PATHS:
            raise gate.Refused(no_route(request.path))
        headers = _raw_headers(request)
        params = request.params
        passed = gate.admit(
            context,
            endpoint,
            headers,
            secure=self.factory.isSecure if self.secure is None else self.secure,
            query_tokens=[
                v.encode("utf-8")
                for name in QUERY_TOKEN_PARAMS
                for v in params.get(name, [])
            ],
            take_slot=False,
        )
        self.identity = passed.identity
        ids = [v for v in params.get("session_id", []) if v]
        if len(set(ids)) > 1:
            raise gate.Refused(
                bad_request("duplicate parameter session_id", Code.DUPLICATE_PARAMETER),
                endpoint,
                passed.identity,
                passed.rule,
            )
        self.session_id = ids[0] if ids else None
        offsets = params.get("offset", [])
        if len(offsets) == 1 and offsets[0].isdigit():
            self.offset = int(offsets[0])
        limit = passed.rule.limits.max_message_bytes
        if limit:
            self.maxMessagePayloadSize = limit
            self.maxFramePayloadSize = limit
        return passed

    def sendHttpErrorResponse(
        self,
        code: int,
        reason: str,
        responseHeaders: list[tuple[str, str]] | None = None,
    ) -> None:
        """
        A refused handshake as every other error of the daemon: a JSON body
        with the refusal's SPEC §6 code (autobahn's own refusals of a
        malformed handshake are ``malformed_request``; a bare status line
        would carry only a reason phrase).
        """
        error = self._refusal or malformed_request(reason, code, "WebSocketError")
        headers = [*(responseHeaders or ()), *error.headers.items()]
        self.sendData(raw_json_response(code, error.body(), headers))

    def _audit(
        self,
        request: Any,
        started: float,
        error: ApiError | None,
        rule: EffectiveRule | None,
    ) -> None:
        context = self.factory.context
        peer = self.transport.getPeer() if self.transport else None
        gate.audit(
            context,
            door=gate.Door.WS,
            endpoint=context.table.get("pty_connect"),
            identity=self.identity,
            rule=rule,
            method="WS",
            path=self.asked_path or request.path,
            query=urlencode([(k, v) for k, vs in request.params.items() for v in vs]),
            status=error.status if error is not None else 101,
            code=error.code if error is not None else None,
            decided_by=error.rule if error is not None else None,
            started=started,
            client=getattr(peer, "host", ""),
            headers=_raw_headers(request),
        )

    # -- frames ---------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        """
        A read from the socket: a whole small text message in it (a
        keystroke) is handed on at once; anything else goes through
        autobahn's framing, which checks it as before.  Until the
        handshake's head is whole, it is checked as it comes.
        """
        if self._shut:
            return
        if not self._head_read and not self._check_head(data):
            return
        if self._reads_plain():
            payload = client_text_payload(data, self._inbound_limit())
            if payload is not None:
                self._count_inbound(len(data), len(payload))
                self.onMessage(payload, False)
                return
        super().dataReceived(data)

    @property
    def _options(self) -> Any:
        """
        This protocol's autobahn options, which autobahn copies from the
        factory when the connection is made (its type hints leave them out).
        """
        return self

    def _reads_plain(self) -> bool:
        """Whether autobahn holds no state a frame read here would skip."""
        options = self._options
        return (
            self.state == self.STATE_OPEN
            and not self.data
            and self.current_frame is None
            and not self.inside_message
            and self._perMessageCompress is None
            and options.requireMaskedClientFrames
            and options.utf8validateIncoming
            and not (options.logOctets or options.logFrames or self.trackedTimings)
        )

    def _inbound_limit(self) -> int:
        """The smaller of the frame and message caps that are set (0: none)."""
        caps = [c for c in (self.maxFramePayloadSize, self.maxMessagePayloadSize) if c]
        return min(caps) if caps else 0

    def _count_inbound(self, wire: int, payload: int) -> None:
        """What autobahn's path counts and does for one whole data frame."""
        stats = self.trafficStats
        stats.incomingOctetsWireLevel += wire
        stats.incomingOctetsWebSocketLevel += payload
        stats.incomingOctetsAppLevel += payload
        stats.incomingWebSocketFrames += 1
        stats.incomingWebSocketMessages += 1
        if self.autoPingTimeoutCall and self.autoPingRestartOnAnyTraffic:
            self._cancelAutoPingTimeoutCall()

    def _writes_plain(self, size: int) -> bool:
        """Whether a text message of ``size`` bytes is one plain frame."""
        options = self._options
        return (
            self._perMessageCompress is None
            and not options.maskServerFrames
            and not self.send_queue
            and not (options.logOctets or options.logFrames or self.trackedTimings)
            and not (0 < options.autoFragmentSize < size)
            and not (0 < self.maxMessagePayloadSize < size)
        )

    def _send_text(self, payload: bytes) -> None:
        """
        One text message: one frame, one write, sent on the socket at once
        when nothing is queued ahead of it (no ``epoll_ctl`` around it).
        """
        if not self._writes_plain(len(payload)):
            self.sendMessage(payload, isBinary=False)  # type: ignore[no-untyped-call]
            return
        frame = server_text_frame(payload)
        stats = self.trafficStats
        stats.outgoingWebSocketMessages += 1
        stats.outgoingOctetsAppLevel += len(payload)
        stats.outgoingOctetsWebSocketLevel += len(payload)
        stats.outgoingWebSocketFrames += 1
        stats.outgoingOctetsWireLevel += len(frame)
        write_now(self.transport, frame)

    # -- session --------------------------------------------------------------

    def onOpen(self) -> None:
        """Attach, or close 1008 with the seed's reasons."""
        if not self.session_id:
            self.close_with(POLICY_VIOLATION, "Missing session_id parameter")
            return
        session = self.factory.terminals.get(self.session_id)
        identity = self.identity
        if session is None or identity is None or not _may_attach(identity, session):
            # The same answer whether it does not exist or is someone else's.
            self.close_with(POLICY_VIOLATION, f"Unknown session: {self.session_id}")
            return
        self.session = session
        self.factory.clients.add(self)
        self._tcp.registerProducer(_OutputLink(self), True)
        if not session.attach(self, self.offset):
            self.session = None
            self.close_with(POLICY_VIOLATION, "Too many clients on this session")

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        """Input, resize and signal messages; anything else is dropped."""
        session = self.session
        if isBinary or session is None:
            return
        try:
            message = json.loads(payload)
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        kind = message.get("type")
        if kind == "input":
            data = message.get("data")
            if isinstance(data, str):
                session.write(data.encode("utf-8", "surrogatepass"))
        elif kind == "resize":
            try:
                cols = dimension(message.get("cols"), "cols")
                rows = dimension(message.get("rows"), "rows")
            except ApiError:
                return  # dropped, as any malformed message
            try:
                session.resize(cols, rows)
            except OSError:
                pass  # the terminal is going away
        elif kind == "signal":
            name = message.get("signal")
            if isinstance(name, str):
                session.send_signal(name)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        """The socket is gone; the session lives on."""
        self.factory.clients.discard(self)
        if self._abort_timer is not None and self._abort_timer.active():
            self._abort_timer.cancel()
        self._abort_timer = None
        self.detach()

    def detach(self) -> None:
        """Leave the session (idempotent)."""
        session, self.session = self.session, None
        if session is not None:
            session.detach(self)

    # -- what the session calls -----------------------------------------------

    def send_frame(self, frame: bytes) -> None:
        """One JSON text frame."""
        if self.state == self.STATE_OPEN:
            self._send_text(frame)
            # A keystroke's echo leaves now, not after another epoll turn
            # (autobahn's path only buffers it).
            send_now(self.transport)

    def session_ended(self, frame: bytes) -> None:
        """The shell ended: ``exited``, then a normal close."""
        self.session = None
        self.send_frame(frame)
        self.close_with(NORMAL, "Session ended")

    def pause_input(self) -> None:
        """The shell is not reading: stop reading this socket."""
        if not self._input_paused and self.transport is not None:
            self._input_paused = True
            self._tcp.pauseProducing()

    def resume_input(self) -> None:
        """The shell reads again."""
        if self._input_paused and self.transport is not None:
            self._input_paused = False
            self._tcp.resumeProducing()

    def drop_slow(self) -> None:
        """Output went unread too long: close with :data:`SLOW_CLIENT`."""
        self.session = None
        self.close_with(SLOW_CLIENT, "Client too slow: reconnect with offset to resume")
        self._hang_up()

    def _hang_up(self) -> None:
        # Flush what is buffered (the close frame) and close; a client that
        # does not read would keep that pending forever, so abort after a
        # grace period.
        if self.transport is None:
            return
        self.transport.loseConnection()
        if self._abort_timer is None:
            self._abort_timer = self.factory.reactor.callLater(
                WS_CLOSE_SECONDS, self._abort
            )

    def close_with(self, code: int, reason: str) -> None:
        """
        Close with any code: ``sendClose`` refuses 1001/1008, which the
        protocol needs, so send the frame directly.
        """
        if self.state == self.STATE_OPEN:
            self.sendCloseFrame(code=code, reasonUtf8=reason.encode("utf-8")[:123])

    def _abort(self) -> None:
        self._abort_timer = None
        if self.transport is not None:
            self._tcp.abortConnection()


def _may_attach(identity: Identity, session: PtySession) -> bool:
    return session.usable_by(identity)


class PtyServerFactory(WebSocketServerFactory):
    """
    The factory behind the PTY port, with autobahn's unsafe defaults
    replaced: bounded frames and messages, keep-alive pings, no compression
    (terminal output is small and latency-bound; deflating it costs more
    than it saves), caps on connections, the HTTP port's bounds on a
    handshake's head.
    """

    protocol = PtyServerProtocol  # type: ignore[assignment]

    def __init__(
        self,
        context: Any,
        terminals: TerminalTable,
        reactor: Any = None,
        timers: bool = True,
        max_message_bytes: int | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        """
        :param limits: the HTTP port's connection bounds: a handshake's
            head gets the same deadline as a request's, and one address
            no more than the HTTP port's share (within this port's own,
            smaller, caps).
        """
        super().__init__(reactor=reactor)  # type: ignore[no-untyped-call]
        self.context = context
        self.terminals = terminals
        self.clients: set[PtyServerProtocol] = set()
        limits = limits or ConnectionLimits()
        #: Every connection of the port (and the API port's WebSocket
        #: route), counted from its first byte: the caps, and who makes
        #: room at one.
        self.table = ConnectionTable(
            ConnectionLimits(
                max_connections=PTY_MAX_CONNECTIONS,
                max_per_address=min(
                    limits.max_per_address, PTY_MAX_CONNECTIONS_PER_ADDRESS
                ),
                head_deadline=limits.head_deadline,
            ),
            lambda: float(self.reactor.seconds()),
            name="PTY WebSocket",
        )
        limit = max_message_bytes or 0
        self.setProtocolOptions(  # type: ignore[no-untyped-call]
            maxFramePayloadSize=limit,
            maxMessagePayloadSize=limit,
            # A ``null`` Origin reaches the gate, which refuses it as any
            # other foreign origin (403 origin_not_allowed, not a bare 400).
            allowNullOrigin=True,
            autoPingInterval=WS_PING_SECONDS if timers else 0,
            autoPingTimeout=WS_PING_TIMEOUT_SECONDS if timers else 0,
            openHandshakeTimeout=limits.head_deadline if timers else 0,
            closeHandshakeTimeout=WS_CLOSE_SECONDS if timers else 0,
            failByDrop=False,
            # A client's close code and reason are echoed (RFC 6455
            # §5.5.1), not answered with 1000: a browser client reads 1000
            # as "the shell ended".
            echoCloseCodeReason=True,
            # RFC 6455 only: a hybi draft (8) would carry its Origin in
            # Sec-WebSocket-Origin, which the Origin check does not read.
            versions=[13],
            # No HTML status page (nor its ?redirect=) for a plain GET: 426.
            webStatus=False,
            # Off: with Nagle on, a keystroke's echo can wait for an ACK.
            # (One call: any call that leaves allowNullOrigin out resets it
            # to False.)
            tcpNoDelay=True,
        )

    def policy_reloaded(self, before: Any = None) -> None:
        """
        A new policy is in force: close (1008, the reason in the close
        frame) every socket whose identity is gone, no longer holds
        ``pty_connect``'s scopes or may no longer use its terminal, or
        whose terminals are switched off; and end the terminals of every
        identity the reload took out of the policy.  A socket lasts as long
        as its client keeps it, so otherwise a leaked identity revoked by a
        reload kept the shell it had open.

        :param before: the identities of the policy replaced
            (:class:`~sandboxd.access.auth.TokenStore`): a terminal is ended
            only when its owner was one of them and is no longer, never one
            owned by something other than a policy identity.
        """
        endpoint = self.context.table.get("pty_connect")
        for client in list(self.clients):
            identity = client.identity
            if identity is None:
                continue
            current, error = gate.still_allowed(self.context, identity, endpoint)
            session = client.session
            if error is None and current is not None:
                if session is None or _may_attach(current, session):
                    client.identity = current
                    continue
                error = forbidden(
                    f"the identity {current.id!r} may no longer use this terminal",
                    Code.MISSING_SCOPE,
                )
            assert error is not None
            log.info(
                "sandboxd: terminal socket of {identity} closed: {why}",
                identity=identity.id,
                why=error.message,
            )
            client.detach()
            client.close_with(POLICY_VIOLATION, error.message)
            client._hang_up()
        if before is None:
            return
        tokens = self.context.policy.tokens
        for session in list(self.terminals.sessions.values()):
            owner = session.owner
            if before.current(owner) is not None and tokens.current(owner) is None:
                log.info(
                    "sandboxd: terminal {id} ended: its owner {owner} is no "
                    "longer in the policy",
                    id=session.id,
                    owner=owner,
                )
                # Left in the table until its shell has ended, so that a
                # stop meanwhile still waits for it.
                session.close()

    def close_all(self, reason: str = "Server shutting down") -> None:
        """Detach and close every client with 1001 (daemon shutdown)."""
        for client in list(self.clients):
            client.detach()
            client.close_with(GOING_AWAY, reason)
            client._hang_up()
