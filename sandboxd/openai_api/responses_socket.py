# -*- test-case-name: tests.openai_api.test_responses_ws -*-
"""
The Responses WebSocket of the ``/v1`` door: ``GET /v1/responses`` with
``Upgrade: websocket`` (the ``openai`` SDK's ``client.responses.connect()``).

The upgrade is an ordinary request of the pipeline, endpoint
``agents_responses_connect``: the gate admits it (a caller without a token
gets its 401 before any upgrade), the handler checks the handshake and the
caller's count of open sockets, and the pipeline audits it as 101 and
hands the connection to an autobahn protocol with the request's head
replayed (:meth:`~sandboxd.web.channel.SandboxChannel.take_over`), which
answers the handshake itself.  No thread, no second HTTP parser.

On the socket, each ``response.create`` event is governed and audited as
``agents_responses_create`` (``via: openai``) and runs its handler with
``stream`` on; its events are sent as they happen, one text frame per
event, the same JSON as the SSE stream's ``data``.  Creates run one after
another in the order they came.  A ``response.steer`` is accepted at once
and held by the socket (:class:`_Steer`): once the steered response's turn
has ended, its input becomes the next turn of the conversation, a
successor response that streams right after it.  A steered response that
ends asking for approvals leaves the steer pending
(``response.steer.pending``, naming the answers it waits for): the
approvals are answered as ever, with a create whose
``previous_response_id`` is the steered response, and the successor comes
after the turn they let go on.  (An ACP agent takes no input in the middle
of a prompt turn, so the running turn itself is not changed; the seed reads
a steer only once the turn before it has ended.)
"""

from __future__ import annotations

import json
import time
import weakref
from collections import deque
from typing import Any

import attrs
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import connectionDone
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.server import Request
from zope.interface import implementer

from sandboxd.access import gate
from sandboxd.access import held as held_connections
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    limit_exceeded,
    limit_rule,
    not_json,
    unexpected,
)
from sandboxd.openai_api.envelope import (
    LOCAL_HEADER,
    frame_error,
    openai_error,
    socket_event,
)
from sandboxd.openai_api.face import new_id
from sandboxd.openai_api.registry import door, manager, owner_of
from sandboxd.openai_api.responses import (
    WireResponse,
    agents_responses_create,
    check_input,
    wait_for_turn,
)
from sandboxd.policy.defaults import (
    OPENAI_WS_QUEUED_EVENTS,
    OPENAI_WS_UNREAD_BYTES,
    WS_CLOSE_SECONDS,
    WS_HANDSHAKE_SECONDS,
    WS_PING_SECONDS,
    WS_PING_TIMEOUT_SECONDS,
)
from sandboxd.web.messages import (
    ServerRequest,
    ServerResponse,
    SSEResponse,
    UpgradeResponse,
)
from sandboxd.web.sending import raw_json_response, send_now
from sandboxd.web.websocket_server import (
    WebSocketServerFactory,
    WebSocketServerProtocol,
    asks_upgrade,
    request_head,
    server_options,
    valid_handshake,
)

log = Logger(namespace="sandboxd.openai_api.responses_socket")

#: Close codes (RFC 6455 §7.4.1).
GOING_AWAY = 1001
UNSUPPORTED_DATA = 1003
#: Application code for a client dropped for leaving events unread.
SLOW_CLIENT = 4008

#: The seed's code for a client event that is not a JSON object.
BAD_FRAME = "bad_frame"


# -- the handshake (an ordinary handler) -----------------------------------------


def agents_responses_connect(request: ServerRequest) -> UpgradeResponse:
    """
    Upgrade to the Responses WebSocket, or say why not: a plain GET (400
    ``agents.websocket_upgrade_required``), a malformed handshake (400
    ``agents.websocket_handshake_invalid``), or a caller at its bound of
    open sockets (429 ``concurrency_limited``).
    """
    headers = request.headers
    local = {LOCAL_HEADER: "1"}
    if not asks_upgrade(headers):
        raise bad_request(
            "GET /v1/responses is the Responses WebSocket: send the upgrade "
            "(Upgrade: websocket), or POST /v1/responses",
            Code.WEBSOCKET_UPGRADE_REQUIRED,
            headers=local,
        )
    if not valid_handshake(headers):
        raise bad_request(
            "invalid WebSocket handshake: Connection: Upgrade, a Sec-WebSocket-Key "
            "(16 bytes, base64) and Sec-WebSocket-Version: 13 are required",
            Code.WEBSOCKET_HANDSHAKE_INVALID,
            headers=local,
        )
    factory = factory_of(request)
    limit = request.rule.limits.max_sessions
    if limit and len(factory.sockets.get(request.identity.root, ())) >= limit:
        raise limit_exceeded(
            429,
            f"at most {limit} Responses WebSockets open per caller; close one first",
            Code.CONCURRENCY_LIMITED,
            rule=limit_rule(request.rule, "max_sessions"),
            headers=local,
        )
    return UpgradeResponse(take_over=lambda raw: _hand_over(factory, request, raw))


def _hand_over(
    factory: ResponsesSocketFactory, request: ServerRequest, raw: Request
) -> None:
    """Give the connection to a new socket protocol, the request's head replayed."""
    channel: Any = raw.channel
    transport = channel.transport if channel is not None else None
    if transport is None:
        return
    protocol: Any = factory.buildProtocol(transport.getPeer())
    protocol.admitted = request
    protocol.secure = raw.isSecure()
    protocol.gate_headers = {
        name.lower(): list(values)
        for name, values in raw.requestHeaders.getAllRawHeaders()
        if name.lower() != b"idempotency-key"
    }
    limit = request.rule.limits.max_message_bytes or 0
    protocol.maxMessagePayloadSize = limit
    protocol.maxFramePayloadSize = limit
    factory.opened(protocol)
    admission = getattr(raw, "admission", None)
    if admission is not None:
        # A reload that takes the caller's access away closes the socket.
        protocol.held_in = request.context
        protocol.held = held_connections.hold(
            request.context,
            admission.identity,
            admission.endpoint,
            lambda e: protocol.close_with(held_connections.POLICY_VIOLATION, e.message),
        )
    channel.take_over(protocol, replay=request_head(raw))


# -- the socket -------------------------------------------------------------------


@implementer(IPushProducer)
class _Flow:
    """
    The socket's producer on its transport: a client that reads slowly
    pauses the response being streamed (its follower stops reading the
    session's log, which keeps the events), and a drained one resumes it.
    """

    def __init__(self) -> None:
        self.target: Any = None
        self.paused = False
        #: Bytes written since the transport paused (the client is not
        #: reading them): bounded by :data:`OPENAI_WS_UNREAD_BYTES`.
        self.unread = 0

    def pauseProducing(self) -> None:
        self.paused = True
        if self.target is not None:
            self.target.pauseProducing()

    def resumeProducing(self) -> None:
        self.paused = False
        self.unread = 0
        if self.target is not None:
            self.target.resumeProducing()

    def stopProducing(self) -> None:
        """The connection is going; :meth:`ResponsesSocket.connectionLost` ends the rest."""


class Lane:
    """
    One streamed response on the socket, in the place of the
    :class:`~sandboxd.web.sse.SSEChannel` a streamed create writes to:
    every event is a line of JSON (:meth:`encode_event`), sent as one text
    frame.

    :ivar done: fires once the response's stream is over (it ended, or the
        client went away).
    """

    def __init__(self, socket: ResponsesSocket, stream_id: str | None = None) -> None:
        self.socket = socket
        #: The client's name for this lane (``stream_id``), put on every event.
        self.stream_id = stream_id
        self.open = True
        self.client_gone = False
        self.done: Deferred[None] = Deferred()
        self._on_disconnect: list[Any] = []
        #: What writes the response's events here (its stream).
        self.producer: Any = None

    def encode_event(self, type: str, data: dict[str, Any]) -> bytes:
        """One event's frame: its JSON (escaped: never a bare newline), a newline."""
        if self.stream_id is not None:
            data = {**data, "stream_id": self.stream_id}
        try:
            return _EVENT.encode(data).encode() + b"\n"
        except ValueError:
            # A number JSON cannot carry (inf, nan): an ``error`` event in
            # its place, never ``NaN`` in a frame a client's parser refuses.
            error = not_json(data, f"the {type} event")
            event = socket_event("error", openai_error(error)[0]["error"], status=500)
            if self.stream_id is not None:
                event["stream_id"] = self.stream_id
            return _EVENT.encode(event).encode() + b"\n"

    def write_raw(self, data: bytes) -> None:
        """Send each event of ``data`` as its own text frame."""
        if not self.open:
            return
        for line in data.split(b"\n"):
            if line:
                self.socket.send_text(line)

    def send(self, event: str, data: Any, id: int | None = None) -> None:
        """An event of the follower's own (a ``gap``)."""
        self.write_raw(self.encode_event(event, {"type": event, **data}))

    def comment(self, text: str = "keep-alive") -> None:
        """Nothing: the socket's pings keep it alive."""

    def on_disconnect(self, callback: Any) -> None:
        """Call ``callback`` if the client leaves before the stream ends."""
        self._on_disconnect.append(callback)

    def register_producer(self, producer: Any, on_stop: Any = None) -> None:
        """A slow client pauses ``producer``."""
        self.producer = producer
        self.socket.flow.target = producer
        if self.socket.flow.paused:
            producer.pauseProducing()

    def close(self) -> None:
        """The response's stream is over."""
        if self.open:
            self.open = False
            self.socket.flow.target = None
            self.done.callback(None)

    def lost(self) -> None:
        """The client went away mid-stream (the response runs on)."""
        if self.open:
            self.open = False
            self.client_gone = True
            self.socket.flow.target = None
            for callback in self._on_disconnect:
                callback()
            self.done.callback(None)


class _Call:
    """
    One ``response.create`` on the socket, as the gate sees a call: its
    concurrency slot held and its audit line owed until its stream ends.
    """

    def __init__(
        self,
        context: Any,
        endpoint: Any,
        identity: Any,
        client: str,
        headers: dict[bytes, list[bytes]] | None = None,
    ) -> None:
        self.context = context
        self.endpoint = endpoint
        self.identity = identity
        self.client = client
        #: The socket's handshake headers (its caller's trace context).
        self.headers = headers
        self.started = time.monotonic()
        self.passed: gate.Passed | None = None
        self.answer: SSEResponse | None = None
        self.lane: str | None = None
        self.ended = False

    def end(self, status: int, code: str | None, decided: str | None) -> None:
        """Give the slot back and write the audit line (once)."""
        if self.ended:
            return
        self.ended = True
        passed = self.passed
        if passed is not None:
            gate.release(self.context, passed)
        gate.audit(
            self.context,
            door=gate.Door.OPENAI,
            endpoint=self.endpoint,
            identity=passed.identity if passed is not None else self.identity,
            rule=passed.rule if passed is not None else None,
            method="WS",
            path="/v1/responses",
            query="",
            status=status,
            code=code,
            decided_by=decided,
            started=self.started,
            client=self.client,
            headers=self.headers,
        )


@attrs.define
class _Steer:
    """
    An accepted ``response.steer`` whose successor is not made yet: it is
    made once the steered response's turn has ended (an approval the
    response ends with is answered first, by the client).
    """

    #: ``id``, ``input`` and ``previous_response_id``, as the events name it.
    steer: dict[str, Any]
    target: WireResponse
    #: The ``stream_id`` the successor's events carry.
    lane: str | None
    #: ``response.steer.pending`` was sent (it is sent once).
    pending_sent: bool = False


class ResponsesSocket(WebSocketServerProtocol):
    """One client of the Responses WebSocket."""

    factory: ResponsesSocketFactory
    #: The admitted upgrade request: who, under which rule, from where.
    admitted: ServerRequest
    #: Its headers as the gate reads them (each create passes it again).
    gate_headers: dict[bytes, list[bytes]]
    secure = False
    lane: Lane | None = None
    #: The connection is lost (nothing is started or timed any more).
    gone = False
    _idle_call: Any = None
    _abort_call: Any = None
    #: Its entry among the connections a reload asks again, and where.
    held: held_connections.Held | None = None
    held_in: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.flow = _Flow()
        #: Client events waiting for the response before them to end:
        #: a create's body, a steer's successor already governed, or a
        #: steer whose successor is made once its target's turn is over.
        self.waiting: deque[dict[str, Any] | _Call | _Steer] = deque()
        #: The accepted steers not yet made successors, by steered turn.
        self.steers: dict[str, _Steer] = {}
        self.running = False
        self.number = 0
        #: Fires once the connection is gone (the daemon's stop waits on it).
        self.ended: Deferred[None] = Deferred()

    # -- opening and closing --------------------------------------------------

    def onConnect(self, request: Any) -> tuple[None, dict[str, str]]:
        """The gate already admitted the upgrade: accept it, labelled local."""
        return None, {LOCAL_HEADER: "1"}

    def sendHttpErrorResponse(
        self,
        code: int,
        reason: str,
        responseHeaders: list[tuple[str, str]] | None = None,
    ) -> None:
        """
        autobahn refused the handshake the handler let through (rare: the
        handler checks the same): 400 ``agents.websocket_handshake_invalid``
        in the door's envelope, never a bare status line.
        """
        error = bad_request(
            f"invalid WebSocket handshake: {reason}",
            Code.WEBSOCKET_HANDSHAKE_INVALID,
        )
        envelope, headers = openai_error(error)
        fields = [*headers.items(), (LOCAL_HEADER, "1")]
        self.sendData(raw_json_response(400, envelope, fields))

    def onOpen(self) -> None:
        """Register the flow control and start the idle clock."""
        transport: Any = self.transport
        transport.registerProducer(self.flow, True)
        self._touch()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """Uncount the socket; a response being streamed runs on."""
        self.gone = True
        self.factory.closed(self)
        if self.held is not None:
            held_connections.release(self.held_in, self.held)
        for call in (self._idle_call, self._abort_call):
            if call is not None and call.active():
                call.cancel()
        for item in self.waiting:
            if isinstance(item, _Call):
                item.end(499, "client_closed", None)
        self.waiting.clear()
        self.steers.clear()
        if self.lane is not None:
            self.lane.lost()
        super().connectionLost(reason)
        if not self.ended.called:
            self.ended.callback(None)

    def close_with(self, code: int, reason: str) -> None:
        """Close with any code (``sendClose`` refuses 1001 and 1003), then hang up."""
        if self.state == self.STATE_OPEN:
            self.sendCloseFrame(code=code, reasonUtf8=reason.encode("utf-8")[:123])
        if self.transport is not None and self._abort_call is None:
            # A client that never answers the close is cut after a grace.
            self._abort_call = self.factory.reactor.callLater(
                WS_CLOSE_SECONDS, self._abort
            )

    def _abort(self) -> None:
        self._abort_call = None
        transport: Any = self.transport
        if transport is not None:
            transport.abortConnection()

    def _touch(self) -> None:
        """Something happened: the idle bound counts from now."""
        seconds = self.admitted.rule.limits.idle_timeout_seconds
        if not seconds or self.gone:
            return
        if self._idle_call is not None and self._idle_call.active():
            self._idle_call.reset(seconds)
        else:
            self._idle_call = self.factory.reactor.callLater(seconds, self._idle)

    def _idle(self) -> None:
        if self.running or self.waiting:
            self._touch()
            return
        seconds = self.admitted.rule.limits.idle_timeout_seconds
        self.close_with(GOING_AWAY, f"idle for {seconds:g} s")

    # -- what the client sends ------------------------------------------------

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        """One client event (autobahn has closed 1009 on one over the bound)."""
        if isBinary:
            self.close_with(
                UNSUPPORTED_DATA, "text frames only: JSON response.create events"
            )
            return
        self._touch()
        try:
            event = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            self._bad_frame(f"a client event is a JSON object: {e}")
            return
        if not isinstance(event, dict):
            self._bad_frame("a client event is a JSON object")
            return
        kind = event.get("type")
        if kind == "response.create":
            if len(self.waiting) >= OPENAI_WS_QUEUED_EVENTS:
                self.send_error(
                    limit_exceeded(
                        429,
                        f"at most {OPENAI_WS_QUEUED_EVENTS} response.create events "
                        "may wait on one socket",
                        Code.CONCURRENCY_LIMITED,
                    )
                )
                return
            self.waiting.append(event)
            self._next()
        elif kind == "response.steer":
            Deferred.fromCoroutine(self._steer(event)).addErrback(self._failed)
        else:
            self.send_error(
                bad_request(
                    f"type: unsupported client event {kind!r} (response.create "
                    "or response.steer)",
                    param="type",
                )
            )

    def _bad_frame(self, message: str) -> None:
        self.send_event(
            socket_event("error", frame_error(message, BAD_FRAME), status=400)
        )

    # -- running responses, one after another ---------------------------------

    def _next(self) -> None:
        """Start the next waiting response if none is being streamed."""
        if self.running or not self.waiting or self.state != self.STATE_OPEN:
            return
        self.running = True
        item = self.waiting.popleft()
        if isinstance(item, _Call):
            d = maybeDeferred(self._stream, item)
        elif isinstance(item, _Steer):
            d = Deferred.fromCoroutine(self._follow(item))
        else:
            d = Deferred.fromCoroutine(self._create(item))
        d.addErrback(self._failed)
        d.addBoth(self._ran)

    def _ran(self, _: Any) -> None:
        self.running = False
        self._touch()
        self._next()

    def _failed(self, failure: Failure) -> None:
        log.failure("responses socket: a response failed", failure)
        self.send_error(unexpected(failure.value))

    async def _create(self, event: dict[str, Any]) -> None:
        """One ``response.create``: through the gate, then streamed live."""
        body = {
            k: v for k, v in event.items() if k not in ("type", "stream", "stream_id")
        }
        body["stream"] = True
        stream_id = event.get("stream_id")
        lane = stream_id if isinstance(stream_id, str) else None
        try:
            call = await self._governed(body, lane)
        except ApiError as e:
            self.send_error(e, lane)
            return
        await self._stream(call)

    async def _governed(self, body: dict[str, Any], lane: str | None) -> _Call:
        """
        Run ``agents_responses_create`` for ``body`` as the HTTP route
        would: admitted by the gate (as its own endpoint, with the
        upgrade's credentials), its concurrency slot held and its audit
        line (``via: openai``) written when its stream ends.

        :raises ApiError: the refusal, already audited.
        """
        admitted = self.admitted
        context = admitted.context
        endpoint = context.table.get("agents_responses_create")
        peer = self.transport.getPeer() if self.transport is not None else None
        call = _Call(
            context,
            endpoint,
            admitted.identity,
            getattr(peer, "host", ""),
            self.gate_headers,
        )
        call.lane = lane
        try:
            try:
                call.passed = gate.admit(
                    context,
                    endpoint,
                    self.gate_headers,
                    secure=self.secure,
                    consume=False,
                )
            except gate.Refused as e:
                raise e.error from None
            request = attrs.evolve(
                admitted,
                method="POST",
                path="/v1/responses",
                query={},
                body=body,
                endpoint=endpoint,
                rule=call.passed.rule,
                identity=call.passed.identity,
                raw=None,
                audit={},
            )
            result = await agents_responses_create(request)
            if isinstance(result, ServerResponse):
                # Not expected with stream on; an answer is still an answer.
                raise ApiError.from_body(result.status, result.body)
            if not isinstance(result, SSEResponse):
                raise unexpected(TypeError("a streamed create answered no stream"))
        except ApiError as e:
            call.end(e.status, e.code, e.rule)
            raise
        except BaseException:
            call.end(500, Code.INTERNAL, None)
            raise
        call.answer = result
        return call

    def _stream(self, call: _Call) -> Deferred[None]:
        """
        Send a created response's events as they happen; fires at its end,
        when its call is over (audited 499 if the client left first).
        """
        lane = self.lane = Lane(self, call.lane)
        assert call.answer is not None and call.answer.start is not None
        try:
            call.answer.start(lane)  # type: ignore[arg-type]
        except Exception:
            call.end(500, Code.INTERNAL, None)
            self.lane = None
            lane.close()
            raise

        def over(_: Any) -> None:
            if self.lane is lane:
                self.lane = None
            if lane.client_gone:
                call.end(499, "client_closed", None)
            else:
                call.end(200, None, None)

        lane.done.addCallback(over)
        return lane.done

    # -- steering ---------------------------------------------------------------

    async def _steer(self, event: dict[str, Any]) -> None:
        """
        ``response.steer``: accepted at once if the response still runs;
        its successor is made once the response's turn has ended
        (:meth:`_follow`).
        """
        previous = event.get("previous_response_id")
        given = event.get("input")
        steer: dict[str, Any] = {"input": given, "previous_response_id": previous}
        if not isinstance(previous, str) or not previous or not given:
            self._steer_failed(
                steer, "invalid_input", "previous_response_id and input are required"
            )
            return
        try:
            check_input(given)
        except ApiError as e:
            self._steer_failed(steer, "invalid_input", e.message)
            return
        target: WireResponse | None = door(self.admitted).responses.get(previous)
        if target is None or target.owner != owner_of(self.admitted):
            self._steer_failed(
                steer, "response_not_found", f"No response found with id {previous!r}"
            )
            return
        if target.done:
            self._steer_failed(
                steer,
                "response_already_completed",
                "the response has ended; send response.create with "
                "previous_response_id instead",
            )
            return
        if target.turn.id in self.steers or target.face.last_response_id != target.id:
            self._steer_failed(
                steer,
                "too_many_pending_steers",
                "the response already has a successor queued; steer that one "
                "once it starts",
            )
            return
        steer["id"] = new_id("steer_")
        lane = self.lane.stream_id if self.lane is not None else None
        held = self.steers[target.turn.id] = _Steer(steer, target, lane)
        self.send_event({"type": "response.steer.accepted", "steer": steer_of(steer)})
        # Right after the steered response, before creates sent since.
        self.waiting.appendleft(held)
        self._next()

    async def _follow(self, held: _Steer) -> None:
        """
        The steered response has been streamed (or another is, on another
        connection): once its turn is over, its successor streams; if it
        ends asking for approvals instead, the client is told the steer
        waits for their answers, and the successor comes after the turn.
        """
        target = held.target
        if not target.done:
            await wait_for_turn(self.admitted, target.settled.wait())
        if self.steers.get(target.turn.id) is not held:
            return  # the connection went, or the steer was failed
        if target.turn.ended:
            await self._successor(held)
        elif not target.done:
            self._drop_steer(held, "the steered response did not end in time")
        else:
            self._send_pending(held)
            ended = wait_for_turn(self.admitted, target.turn.waiters.wait())
            Deferred.fromCoroutine(ended).addCallback(
                lambda _: self._turn_over(held)
            ).addErrback(self._failed)

    def _turn_over(self, held: _Steer) -> None:
        """The turn a pending steer waited for is over (or it took too long)."""
        if self.gone or self.steers.get(held.target.turn.id) is not held:
            return
        if not held.target.turn.ended:
            self._drop_steer(held, "the steered turn waited too long for its approvals")
            return
        # After the response streaming now (the approvals' answer, if on
        # this socket), before creates sent since.
        self.waiting.appendleft(held)
        self._next()

    def _send_pending(self, held: _Steer) -> None:
        """``response.steer.pending``: the approvals the steer waits for."""
        if held.pending_sent:
            return
        held.pending_sent = True
        event: dict[str, Any] = {
            "type": "response.steer.pending",
            "reason": "waiting_for_required_input",
            "required_input": [
                {
                    "type": "mcp_approval_response",
                    "approval_request_id": a["request_id"],
                }
                for a in held.target.approvals
            ],
            "steer": steer_of(held.steer),
        }
        if held.lane is not None:
            event["stream_id"] = held.lane
        self.send_event(event)

    async def _successor(self, held: _Steer) -> None:
        """
        The steer's input as the next turn: a response continuing the
        latest of the steered turn (the steered one, or the one that
        answered its approvals), with its settings, as OpenAI's automatic
        successor has; streamed now.
        """
        target = held.target
        del self.steers[target.turn.id]
        # The turn's end reached us inside the agent's own ending of it;
        # its session takes the next prompt once that has unwound.
        await deferLater(self.factory.reactor, 0, lambda: None)
        if self.state != self.STATE_OPEN:
            return
        latest: WireResponse | None = door(self.admitted).responses.get(
            target.face.last_response_id or ""
        )
        if latest is None or latest.turn is not target.turn:
            self._drop_steer(
                held,
                "the conversation went on before the steer could: send its "
                "input with response.create",
                forget=False,
            )
            return
        body = {
            "model": latest.model,
            "input": held.steer["input"],
            "previous_response_id": latest.id,
            "instructions": latest.instructions,
            "metadata": latest.metadata,
            "store": latest.store,
            "background": latest.background,
            "stream": True,
        }
        try:
            successor = await self._governed(body, held.lane)
        except ApiError as e:
            self._steer_failed(held.steer, "successor_creation_failed", e.message)
            return
        if self.state != self.STATE_OPEN:
            successor.end(499, "client_closed", None)
            return
        await self._stream(successor)

    def _drop_steer(self, held: _Steer, message: str, forget: bool = True) -> None:
        """A steer that will have no successor: ``response.steer.failed``."""
        if forget:
            self.steers.pop(held.target.turn.id, None)
        self._steer_failed(held.steer, "successor_creation_failed", message)

    def _steer_failed(self, steer: dict[str, Any], code: str, message: str) -> None:
        self.send_event(
            socket_event(
                "response.steer.failed", frame_error(message, code), steer=steer
            )
        )

    # -- what the socket sends --------------------------------------------------

    def send_text(self, data: bytes) -> None:
        """
        One text frame, sent now; a client that leaves more than
        :data:`OPENAI_WS_UNREAD_BYTES` unread is dropped instead (the
        paused feed holds most events back, but a burst still piles up).
        """
        if self.state != self.STATE_OPEN:
            return
        if self.flow.paused:
            self.flow.unread += len(data)
            if self.flow.unread > OPENAI_WS_UNREAD_BYTES:
                self.drop_slow()
                return
        self.sendMessage(data, isBinary=False)  # type: ignore[no-untyped-call]
        send_now(self.transport)

    def drop_slow(self) -> None:
        """The client left too much unread: close with :data:`SLOW_CLIENT`."""
        log.info(
            "responses socket: a client left over {bound} bytes unread; dropped",
            bound=OPENAI_WS_UNREAD_BYTES,
        )
        self.close_with(
            SLOW_CLIENT,
            "Client too slow: events left unread; read responses back over HTTP",
        )

    def send_event(self, event: dict[str, Any]) -> None:
        """A server event of the socket's own, numbered on the socket."""
        event.setdefault("sequence_number", self.number)
        self.number += 1
        self.send_text(_EVENT.encode(event).encode())

    def send_error(self, error: ApiError, lane: str | None = None) -> None:
        """
        An ``error`` event: the HTTP route's envelope, with its status (and
        the ``stream_id`` of the create it answers, if it named one).
        """
        envelope, _ = openai_error(error)
        event = socket_event("error", envelope["error"], status=error.status)
        if lane is not None:
            event["stream_id"] = lane
        self.send_event(event)


#: The socket's events: compact; a non-finite number raises ValueError.
_EVENT = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def steer_of(steer: dict[str, Any]) -> dict[str, Any]:
    """The accepted steer as ``response.steer.accepted`` names it."""
    return {"id": steer["id"], "previous_response_id": steer["previous_response_id"]}


class ResponsesSocketFactory(WebSocketServerFactory):
    """
    The sockets of one daemon: autobahn's options (keep-alive pings,
    handshake and close timeouts, no compression, RFC 6455 only) and the
    open sockets by owner, for the per-caller bound.
    """

    protocol = ResponsesSocket  # type: ignore[assignment]

    def __init__(self, reactor: Any) -> None:
        # No Server header: the daemon does not name its libraries.
        super().__init__(reactor=reactor, server=None)  # type: ignore[no-untyped-call]
        self.sockets: dict[str, set[ResponsesSocket]] = {}
        self.setProtocolOptions(  # type: ignore[no-untyped-call]
            **server_options(
                WS_PING_SECONDS,
                WS_PING_TIMEOUT_SECONDS,
                WS_HANDSHAKE_SECONDS,
                WS_CLOSE_SECONDS,
            )
        )

    def opened(self, socket: ResponsesSocket) -> None:
        """Count a socket against its owner's bound (a link's: its minter's)."""
        self.sockets.setdefault(socket.admitted.identity.root, set()).add(socket)

    def closed(self, socket: ResponsesSocket) -> None:
        """Uncount it."""
        owner = socket.admitted.identity.root
        held = self.sockets.get(owner)
        if held is not None:
            held.discard(socket)
            if not held:
                del self.sockets[owner]

    def close_all(self) -> Deferred[Any] | None:
        """
        The daemon stops: close every open socket with 1001 (going away)
        before the connections are cut; fires once they are gone, at most
        :data:`~sandboxd.policy.defaults.WS_CLOSE_SECONDS` and a second
        later (a client that never answers the close is cut by then).
        """
        open_now = [socket for held in self.sockets.values() for socket in held]
        if not open_now:
            return None
        for socket in open_now:
            lane = socket.lane
            interrupt = getattr(lane.producer, "interrupt", None) if lane else None
            if interrupt is not None:
                # Its turn is cut by the stop: the client is told so, as an
                # HTTP stream is, not left with a socket that just ends.
                interrupt("the daemon stopped while this response was running")
            socket.close_with(GOING_AWAY, "the daemon is stopping")
        done: Deferred[Any] = DeferredList(
            [socket.ended for socket in open_now], consumeErrors=True
        )
        done.addTimeout(WS_CLOSE_SECONDS + 1, self.reactor)
        done.addErrback(
            lambda f: log.warn("responses sockets did not all close: {f}", f=f)
        )
        return done


_FACTORIES: weakref.WeakKeyDictionary[Any, ResponsesSocketFactory] = (
    weakref.WeakKeyDictionary()
)


def factory_of(request: ServerRequest) -> ResponsesSocketFactory:
    """The daemon's socket factory, made on the first upgrade."""
    context = request.context
    factory = _FACTORIES.get(context)
    if factory is None:
        factory = _FACTORIES[context] = ResponsesSocketFactory(context.reactor)
        # Closed first when the daemon stops, before the agents are ended.
        manager(request).before_stop.insert(0, factory.close_all)
    return factory


HANDLERS: dict[str, Any] = {"agents_responses_connect": agents_responses_connect}
