# -*- test-case-name: tests.mcp.test_door -*-
"""
The MCP door: Streamable HTTP at ``/mcp`` on the HTTP port (SPEC §17).

The site hands every request for ``/mcp`` to :meth:`McpDoor.exchange` when
its headers are in, before the JSON pipeline: this door has its own framing
(JSON-RPC messages, answered as JSON or SSE; a GET stream; DELETE).  It
passes the same gate as every door (SPEC §16) as the endpoint ``mcp``, once
per HTTP request, and each ``tools/call`` again as the endpoint it calls;
both are audited with ``via: mcp``.

- ``POST``: one JSON-RPC message (batches are refused: the revisions served,
  2025-06-18 and 2025-11-25, send one message per POST).  ``initialize``
  opens a session (``Mcp-Session-Id``, bounded by ``limits.max_sessions``);
  every other message names it.  A notification or response is answered
  202; a request with JSON, or with an SSE stream when it is a call of a
  streaming tool (progress notifications go on that stream) or a call
  still running after ``MCP_JSON_ANSWER_SECONDS`` (keep-alive comments
  then reach a client with a short read timeout).  A call whose stream is
  lost waits ``MCP_LOST_STREAM_SECONDS`` (at most the idle timeout) for a
  resume, then is cancelled, so a client that died frees its session.
- ``GET``: the session's standalone stream (``tools/list_changed`` after a
  policy reload), or, with ``Last-Event-ID``, the rest of a lost stream.
- ``DELETE``: ends the session, cancelling its calls.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from sandboxd import jsonrpc
from sandboxd.access import gate
from sandboxd.access.auth import Identity
from sandboxd.errors import (
    ApiError,
    Code,
    limit_exceeded,
    limit_rule,
    limit_setting,
    payload_too_large,
    unsupported,
)
from sandboxd.jsonrpc import error, notification
from sandboxd.mcp import protocol
from sandboxd.mcp.protocol import Caller, Methods
from sandboxd.mcp.sessions import (
    Session,
    SessionTable,
    Stream,
    event_frame,
    parse_event_id,
)
from sandboxd.mcp.tools import Toolbox
from sandboxd.policy.defaults import (
    DRAIN_LIMIT_BYTES,
    ENDPOINT_LIMITS,
    MCP_JSON_ANSWER_SECONDS,
    MCP_LOST_STREAM_SECONDS,
    MCP_SESSION_QUIET_SECONDS,
    MCP_SWEEP_SECONDS,
    identity_cap,
)
from sandboxd.web.channel import close_after_answer
from sandboxd.web.dispatch import reason_phrase
from sandboxd.web.jsonbody import parse_object
from sandboxd.web.pipeline import check_framing
from sandboxd.web.sse import SSEChannel

log = Logger(namespace="sandboxd.mcp")

Headers = Mapping[bytes, Sequence[bytes]]

_METHODS = ("GET", "POST", "DELETE")

#: The ``mcp`` endpoint's built-in limits (for a policy that unsets them).
_DEFAULTS = ENDPOINT_LIMITS["mcp"]

#: Revisions whose SSE streams start with a priming event (an id, no data)
#: so that a client can resume even a stream that has sent nothing yet.
_PRIMING = frozenset({"2025-11-25"})


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON (:func:`sandboxd.jsonrpc.encode`: never ``NaN``)."""
    return jsonrpc.encode(value)


def refusal_message(err: ApiError, request_id: Any = None) -> dict[str, Any]:
    """
    A refusal in this door's framing: a JSON-RPC error, the §6 body in
    ``data``; ``id`` null when the request's was never read (the SDK's
    client reads such an error at any status as its request's answer).
    """
    code = {
        400: jsonrpc.INVALID_REQUEST,
        404: protocol.SESSION_NOT_FOUND,
    }.get(err.status, protocol.REFUSED)
    if err.code in (Code.ENDPOINT_DISABLED, Code.MISSING_SCOPE):
        code = protocol.REFUSED
    return error(request_id, code, err.message, err.body())


def _message_too_large(cap: int) -> ApiError:
    """
    413 for a message over the door's bound, saying how a big file is
    written from MCP anyway: an MCP-only agent has no HTTP API to turn to.
    """
    setting = limit_setting("mcp", "max_request_bytes")
    error = payload_too_large(
        cap,
        message=f"the MCP message is over the limit of {cap} bytes (the policy's "
        f"{setting}); to write a bigger file, upload it in parts: the first "
        "with upload, each of the rest with upload and append: true",
    )
    error.extra["setting"] = setting
    return error


def _header(headers: Headers, name: bytes) -> str | None:
    values = headers.get(name)
    return values[-1].decode("latin-1").strip() if values else None


def _accepts(headers: Headers, kind: str) -> bool:
    accept = (_header(headers, b"accept") or "*/*").lower()
    return kind in accept or "*/*" in accept


class McpDoor(Service):
    """The MCP door of one daemon: its sessions and the HTTP exchanges."""

    name = "mcp"

    def __init__(self, context: Any) -> None:
        self.context = context
        self.endpoint = context.table.get("mcp")
        self.toolbox = Toolbox(context.table)
        self.methods = Methods(context, self.toolbox)
        self.sessions = SessionTable(context.reactor.seconds)
        self._sweep: Any = None

    # -- service -----------------------------------------------------------

    def stopService(self) -> None:
        """End every session (their calls are cancelled, streams closed)."""
        super().stopService()  # type: ignore[no-untyped-call]
        if self._sweep is not None and self._sweep.active():
            self._sweep.cancel()
        self._sweep = None
        for session in self.sessions:
            self.sessions.remove(session)

    # -- limits ------------------------------------------------------------

    def _limits(self) -> Any:
        return self.context.policy.rules["mcp"].limits

    def _idle(self) -> float:
        idle = self._limits().idle_timeout_seconds
        return float(idle or _DEFAULTS["idle_timeout_seconds"])

    def _grace(self) -> float:
        """How long a call whose stream was lost waits for its client."""
        return min(self._idle(), MCP_LOST_STREAM_SECONDS)

    def _schedule_sweep(self) -> None:
        if self._sweep is not None and self._sweep.active():
            return
        delay = min(MCP_SWEEP_SECONDS, max(0.05, self._idle() / 4))
        self._sweep = self.context.reactor.callLater(delay, self.sweep)

    def sweep(self) -> None:
        """Close the sessions idle past ``limits.idle_timeout_seconds``."""
        self._sweep = None
        now = self.context.reactor.seconds()
        self.sessions.let_go(now, self._grace())
        for session in self.sessions.expire(now, self._idle()):
            log.info("sandboxd: MCP session {id} expired", id=session.id[:8])
        if len(self.sessions):
            self._schedule_sweep()

    def open_session(self, identity: Identity, version: str) -> Session | ApiError:
        """A new session, or the ``too_many_sessions`` refusal."""
        now = self.context.reactor.seconds()
        limit = self._limits().max_sessions or _DEFAULTS["max_sessions"]
        self.sessions.let_go(now, self._grace())
        if len(self.sessions) >= limit:
            self.sessions.expire(now, self._idle())
        if len(self.sessions) >= limit:
            self._make_room(now, None)
        if len(self.sessions) >= limit:
            return limit_exceeded(
                429,
                f"too many MCP sessions ({limit} open); end one with DELETE",
                Code.TOO_MANY_SESSIONS,
                rule=limit_rule(self.context.policy.rules["mcp"], "max_sessions"),
                limit=limit,
                **self._retry(now, None),
            )
        rule = self.context.policy.rules["mcp"]
        mine = identity_cap(
            limit, len(self.context.policy.tokens.ids()), rule.limits.max_per_identity
        )
        if self.sessions.held_by(identity) >= mine:
            self._make_room(now, identity.root)
        if self.sessions.held_by(identity) >= mine:
            return limit_exceeded(
                429,
                f"this identity has {mine} MCP sessions open, its share of "
                f"{limit}; end one with DELETE",
                Code.TOO_MANY_SESSIONS,
                rule=limit_rule(rule, "max_per_identity"),
                limit=mine,
                **self._retry(now, identity.root),
            )
        session = self.sessions.create(identity, version, now)
        self._schedule_sweep()
        return session

    def _retry(self, now: float, root: str | None) -> dict[str, Any]:
        """
        ``Retry-After`` (header and field) of a refusal at the bound: when
        the first session whose client is likely gone can make room
        (:meth:`_make_room`); nothing when every session is in use.
        """
        wait = self.sessions.next_quiet(now, MCP_SESSION_QUIET_SECONDS, root)
        if wait is None:
            return {}
        seconds = max(1, math.ceil(wait))
        return {"headers": {"Retry-After": str(seconds)}, "retry_after": seconds}

    def _make_room(self, now: float, root: str | None) -> None:
        """
        Close the quietest session whose client is likely gone (of
        ``root``'s share when given): its client, if it comes back, is told
        the session is unknown and initializes anew, as MCP clients do.
        """
        victim = self.sessions.quietest(now, MCP_SESSION_QUIET_SECONDS, root)
        if victim is not None:
            self.sessions.remove(victim)
            log.info(
                "sandboxd: MCP session {id} closed, quiet for {seconds:.0f} s, "
                "to make room for a new one",
                id=victim.id[:8],
                seconds=now - victim.last_seen,
            )

    # -- reload ------------------------------------------------------------

    def policy_reloaded(self) -> None:
        """
        A new policy is in force: tell every session whose tool list it
        changed (``notifications/tools/list_changed`` on its GET stream).
        """
        if not self.context.policy.rules["mcp"].enabled:
            # The door is switched off: no session outlives it.
            for session in self.sessions:
                self.sessions.remove(session)
            return
        for session in self.end_disallowed():
            now = frozenset(self.methods.visible(session.identity))
            if session.listed is None or now != session.listed:
                session.listed = now
                session.emit(
                    session.standalone,
                    notification("notifications/tools/list_changed"),
                )

    def end_disallowed(self) -> list[Session]:
        """
        Close the sessions whose caller the policy no longer lets in, or
        whose link was revoked or expired (asked at a reload and whenever a
        link ends: the client of a revoked link cannot end its session
        itself); the others, their identity as the policy defines it now.
        """
        kept: list[Session] = []
        for session in self.sessions:
            # Asked as every connection that outlives a reload is: a link's
            # session stays while its minter does (narrowed to the minter's
            # scopes now), where looking its id up among the tokens ended
            # it at every reload.
            identity, _ = gate.still_allowed(
                self.context, session.identity, self.endpoint
            )
            if identity is None:
                self.sessions.remove(session)
                continue
            session.identity = identity
            kept.append(session)
        return kept

    # -- HTTP --------------------------------------------------------------

    def exchange(
        self, request: Any, method: str, headers: Headers, length: int | None
    ) -> Exchange:
        """Take over one HTTP request for ``/mcp`` at header time."""
        return Exchange(self, request, method, headers, length)


class Exchange:
    """One HTTP request to ``/mcp``, from its headers to its answer."""

    def __init__(
        self,
        door: McpDoor,
        request: Any,
        method: str,
        headers: Headers,
        length: int | None,
    ) -> None:
        self.door = door
        self.request = request
        self.method = method
        self.headers = headers
        self.started = time.monotonic()
        self.body = bytearray()
        self.refusal: ApiError | None = None
        self.passed: gate.Passed | None = None
        self.identity: Identity | None = None
        self.rule: Any = door.context.policy.rules["mcp"]
        self.answered = False
        #: This POST's span's ids, when chosen before its end (:meth:`_own_span`).
        self.span_ids: dict[str, Any] = {}
        #: A GET stream was opened (its end by the client is the normal one).
        self.server_stream = False
        self.rpc: str | None = None
        #: The message became a tool's (or resource's) call, counted as such.
        self.counted_as_call = False
        self.code: str | None = None
        self.decided_by: str | None = None
        self.status = 200
        self.bytes_in = 0
        self.cap = 0
        if method not in _METHODS:
            self._refuse(
                unsupported(f"/mcp takes GET, POST or DELETE, not {method}"), length
            )
            return
        try:
            self.passed = gate.admit(
                door.context,
                door.endpoint,
                headers,
                secure=request.isSecure(),
                framing=lambda: check_framing(headers),
                take_slot=False,
                # A counted link's uses are spent by what does something: a
                # tools/call's or a resource read's own admission (a call
                # refused there costs none). The session's own traffic (the
                # handshake, tools/list, notifications, the GET stream,
                # DELETE) costs none, so uses: N gives N calls whatever the
                # client's handshake; and a used-up link may still end its
                # session with DELETE.
                consume=method != "DELETE",
                spend=False,
            )
        except gate.Refused as e:
            self.identity = e.identity
            self._refuse(e.error, length)
            return
        self.identity = self.passed.identity
        self.rule = self.passed.rule
        self.cap = self.rule.limits.max_request_bytes or 0
        if length is not None and self.cap and length > self.cap:
            self.refusal = _message_too_large(self.cap)
            self._answer_now(self.refusal)

    # -- header time and body ----------------------------------------------

    def _refuse(self, err: ApiError, length: int | None) -> None:
        self.refusal = err
        if length is None and not self.headers.get(b"transfer-encoding"):
            length = 0  # no body at all (a GET): answer it and keep the connection
        if length is None or length > DRAIN_LIMIT_BYTES:
            self._answer_now(err)

    def _answer_now(self, err: ApiError) -> None:
        """Answer before the body (write straight to the transport) and close."""
        self.answered = True
        self.request.answered_early = True
        self.request.requestHeaders.removeHeader(b"expect")
        body = json_bytes(self._error_body(err))
        head = [
            f"HTTP/1.1 {err.status} {reason_phrase(err.status)}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *(f"{k}: {v}" for k, v in err.headers.items()),
        ]
        transport = self.request.channel.transport
        transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        self.status, self.code = err.status, str(err.code) if err.code else None
        self.decided_by = err.rule
        self._audit()
        close_after_answer(self.request.channel)

    def write(self, data: bytes) -> None:
        """One chunk of the body."""
        if self.answered:
            return
        self.bytes_in += len(data)
        if self.refusal is not None:
            return
        if self.cap and self.bytes_in > self.cap:
            self._answer_now(_message_too_large(self.cap))
            return
        self.body += data

    # -- answers -----------------------------------------------------------

    def _error_body(self, err: ApiError, request_id: Any = None) -> dict[str, Any]:
        """A refusal in this door's framing (:func:`refusal_message`)."""
        return refusal_message(err, request_id)

    def _send(
        self,
        status: int,
        body: Any,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        request = self.request
        if request._disconnected or request.finished:
            return
        self.status = status
        request.setResponseCode(status)
        for k, v in (headers or {}).items():
            request.setHeader(k, v)
        if body is None:
            request.setHeader(b"content-length", b"0")
        else:
            data = json_bytes(body)
            request.setHeader(b"content-type", b"application/json")
            request.setHeader(b"content-length", str(len(data)).encode())
            request.write(data)
        request.finish()

    def _fail(self, err: ApiError, request_id: Any = None) -> None:
        self.code = str(err.code) if err.code else None
        self.decided_by = err.rule
        self._send(err.status, self._error_body(err, request_id), err.headers)

    def _rpc_fail(
        self, status: int, rpc_code: int, message: str, rid: Any = None
    ) -> None:
        self._send(status, error(rid, rpc_code, message))

    def _audit(self) -> None:
        gate.audit(
            self.door.context,
            door=gate.Door.MCP,
            endpoint=self.door.endpoint,
            identity=self.identity,
            rule=self.rule,
            method=self.method,
            path="/mcp",
            query="",
            status=self.status,
            code=self.code,
            decided_by=self.decided_by,
            started=self.started,
            bytes_in=self.bytes_in,
            bytes_out=getattr(self.request, "sentLength", 0),
            client=getattr(self.request, "client_host", ""),
            extra={"rpc": self.rpc, **self.span_ids} if self.rpc else None,
            headers=self.headers,
            count=not self.counted_as_call,
        )

    # -- after the body ----------------------------------------------------

    def process(self) -> None:
        """Answer the request (its body is in)."""
        if self.answered:
            return
        self.answered = True
        self.request.notifyFinish().addBoth(self._finished)
        if self.refusal is not None:
            self._fail(self.refusal)
            return
        if self.method == "POST":
            self._post()
        elif self.method == "GET":
            self._get()
        else:
            self._delete()

    def _finished(self, reason: Any) -> None:
        # A session's server stream (GET) ends when its client goes: that is
        # how it always ends, not a failure to audit as one.
        if not self.request.finished and not self.server_stream:
            self.status, self.code = 499, "client_closed"
        self._audit()

    def _session(self) -> Session | None:
        """The session the request names, or None once refused."""
        assert self.identity is not None
        sid = _header(self.headers, b"mcp-session-id")
        if not sid:
            self._rpc_fail(
                400,
                jsonrpc.INVALID_REQUEST,
                "an Mcp-Session-Id header is required (send initialize first)",
            )
            return None
        session = self.door.sessions.get(sid, self.identity)
        if session is None:
            self._rpc_fail(
                404,
                protocol.SESSION_NOT_FOUND,
                "unknown or expired MCP session; initialize a new one",
            )
            return None
        version = _header(self.headers, b"mcp-protocol-version")
        if version is not None and version not in protocol.VERSIONS:
            self._rpc_fail(
                400,
                jsonrpc.INVALID_REQUEST,
                f"unsupported MCP-Protocol-Version {version!r}; this server "
                f"speaks {', '.join(protocol.VERSIONS)}",
            )
            return None
        session.identity = self.identity
        session.last_seen = self.door.context.reactor.seconds()
        return session

    def _caller(self) -> Caller:
        return Caller(
            self.headers,
            self.request.isSecure(),
            getattr(self.request, "client_host", ""),
            on_call=self._carries_call,
            trace_headers=self._own_span(),
        )

    def _own_span(self) -> Headers | None:
        """
        This POST's span, chosen now, as the trace context of the calls it
        carries: a tool's span is then its child, in one trace, rather than
        a root of its own (a ``traceparent`` in the message's ``_meta``
        still wins).  None when no span is sent.
        """
        tracer = self.door.context.tracer
        if not tracer.exporting:
            return None
        text = {
            name.decode(): values[0].decode("latin-1")
            for name in (b"traceparent", b"tracestate")
            # Two traceparents are read as none (the span's own rule).
            if len(values := self.headers.get(name) or []) == 1
        }
        carrier = tracer.child_context(text, self.span_ids, "/mcp")
        parent = carrier.get("TRACEPARENT")
        if parent is None:
            return None
        headers = dict(self.headers)
        headers[b"traceparent"] = [parent.encode("latin-1")]
        state = carrier.get("TRACESTATE")
        if state is not None:
            headers[b"tracestate"] = [state.encode("latin-1")]
        return headers

    def _carries_call(self) -> None:
        # The call is counted as its tool's endpoint (``door="mcp"``);
        # this POST is audited, not counted a second time.
        self.counted_as_call = True

    # -- POST --------------------------------------------------------------

    def _post(self) -> None:
        ctype = (_header(self.headers, b"content-type") or "").lower()
        if not ctype.startswith("application/json"):
            self._rpc_fail(
                415, jsonrpc.INVALID_REQUEST, "the body must be application/json"
            )
            return
        raw = bytes(self.body)
        if raw.lstrip().startswith(b"["):
            self._rpc_fail(
                400,
                jsonrpc.INVALID_REQUEST,
                "JSON-RPC batches are not accepted: MCP 2025-06-18 and later "
                "send one message per POST",
            )
            return
        try:
            # The HTTP door's strict parser: no repeated keys, NaN or
            # overflowing numbers, and deep nesting is an error, not a crash.
            message = parse_object(raw)
        except ApiError as e:
            self._rpc_fail(400, jsonrpc.PARSE_ERROR, e.message)
            return
        if not message or message.get("jsonrpc") != "2.0":
            self._rpc_fail(
                400,
                jsonrpc.INVALID_REQUEST,
                "the body must be one JSON-RPC 2.0 message",
            )
            return
        method = message.get("method")
        is_request = "id" in message and method is not None
        if method is not None and not isinstance(method, str):
            self._rpc_fail(400, jsonrpc.INVALID_REQUEST, "method must be a string")
            return
        rid = message.get("id")
        if is_request and (isinstance(rid, bool) or not isinstance(rid, str | int)):
            self._rpc_fail(
                400, jsonrpc.INVALID_REQUEST, "a request id is a string or an integer"
            )
            return
        self.rpc = method
        if method == "initialize" and is_request:
            self._initialize(message)
            return
        if method == "server/discover" and is_request:
            # The stateless 2026-07-28 probe: "not served" sends a client
            # that also speaks the handshake to initialize.
            self._send(
                200,
                error(
                    message.get("id"),
                    jsonrpc.METHOD_NOT_FOUND,
                    "server/discover is not served; initialize with "
                    + " or ".join(protocol.VERSIONS),
                ),
            )
            return
        session = self._session()
        if session is None:
            return
        if not is_request:
            self._notified(session, message)
            self._send(202, None)
            return
        if (
            method == "tools/call"
            and self._streams(message)
            and _accepts(self.headers, "text/event-stream")
        ):
            self._answer_stream(session, message)
            return
        self._answer_json(session, message)

    def _initialize(self, message: dict[str, Any]) -> None:
        params = message.get("params")
        rid = message.get("id")
        if not isinstance(params, dict) or not isinstance(
            params.get("protocolVersion"), str
        ):
            self._send(
                400,
                error(
                    rid, jsonrpc.INVALID_PARAMS, "initialize needs a protocolVersion"
                ),
            )
            return
        assert self.identity is not None
        answer = self.door.methods.initialize(params)
        opened = self.door.open_session(self.identity, answer["protocolVersion"])
        if isinstance(opened, ApiError):
            self._fail(opened, rid)
            return
        info = params.get("clientInfo")
        if isinstance(info, dict):
            opened.client_info = {k: str(v)[:200] for k, v in info.items()}
        self._send(
            200,
            jsonrpc.result(rid, answer),
            {"mcp-session-id": opened.id},
        )

    def _notified(self, session: Session, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = message.get("params") or {}
        if method == "notifications/initialized":
            session.initialized = True
        elif method == "notifications/cancelled" and isinstance(params, dict):
            call = session.calls.get(jsonrpc.request_key(params.get("requestId")))
            if call is not None:
                call.cancel()

    def _streams(self, message: dict[str, Any]) -> bool:
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        tool = self.door.toolbox.get(name) if isinstance(name, str) else None
        return tool is not None and tool.streams

    def _answer_json(self, session: Session, message: dict[str, Any]) -> None:
        answer = self.door.methods.handle(session, message, self._caller(), None)
        if not isinstance(answer, Deferred):
            self._send(200, answer)
            return
        key = jsonrpc.request_key(message.get("id"))
        streamed: list[Stream] = []

        def gone(reason: Any) -> None:
            # A JSON answer cannot be resumed: a client that left cancels.
            # (Once the answer is a stream, a lost one waits for a resume.)
            call = session.calls.get(key)
            if call is not None and not streamed:
                call.cancel()

        def to_stream() -> None:
            # Still running: an SSE answer, whose keep-alive comments a
            # client with a short read timeout sees while it waits.
            request = self.request
            if request._disconnected or request.finished:
                return
            stream = self._open_stream(session, key)
            streamed.append(stream)

        timer = None
        if message.get("method") == "tools/call" and "text/event-stream" in (
            _header(self.headers, b"accept") or ""
        ):
            timer = self.door.context.reactor.callLater(
                MCP_JSON_ANSWER_SECONDS, to_stream
            )
        self.request.notifyFinish().addErrback(gone)

        def answered(value: dict[str, Any]) -> None:
            if timer is not None and timer.active():
                timer.cancel()
            if not streamed:
                self._send(200, value)
                return
            session.emit(streamed[0], value)
            session.finish(streamed[0])

        answer.addCallback(answered)

    def _open_stream(self, session: Session, key: str | None) -> Stream:
        """This request's answer as a new SSE stream of ``session``."""
        stream = session.open_stream(key)
        channel = SSEChannel(
            self.request,
            self.door.context.reactor,
            headers={"mcp-session-id": session.id},
            streams=self.door.context.streams,
        )
        session.attach(stream, channel, 0)
        if session.version in _PRIMING:
            channel.write_raw(event_frame(stream.number, 0, None))
        return stream

    def _answer_stream(self, session: Session, message: dict[str, Any]) -> None:
        stream = self._open_stream(session, jsonrpc.request_key(message.get("id")))

        def notify(note: dict[str, Any]) -> None:
            session.emit(stream, note, droppable=True)

        answer = self.door.methods.handle(session, message, self._caller(), notify)

        def answered(value: dict[str, Any]) -> None:
            session.emit(stream, value)
            session.finish(stream)

        if isinstance(answer, Deferred):
            answer.addCallback(answered)
        else:
            answered(answer)

    # -- GET ---------------------------------------------------------------

    def _get(self) -> None:
        if not _accepts(self.headers, "text/event-stream"):
            self._rpc_fail(
                406, jsonrpc.INVALID_REQUEST, "GET /mcp serves text/event-stream only"
            )
            return
        session = self._session()
        if session is None:
            return
        last = _header(self.headers, b"last-event-id")
        point = parse_event_id(last) if last else (0, session.standalone.seq)
        if point is None or point[0] >= session.next_stream:
            self._rpc_fail(
                400,
                jsonrpc.INVALID_REQUEST,
                f"Last-Event-ID {last!r} is not one of ours",
            )
            return
        number, after = point
        channel = SSEChannel(
            self.request,
            self.door.context.reactor,
            headers={"mcp-session-id": session.id},
            streams=self.door.context.streams,
        )
        stream = session.streams.get(number)
        if stream is None:
            # That stream is over: what is kept of its end, then close.
            for frame in session.since(number, after):
                channel.write_raw(frame)
            channel.close()
            return
        self.server_stream = True
        if session.version in _PRIMING:
            channel.write_raw(event_frame(number, after, None))
        session.attach(stream, channel, after)

    # -- DELETE ------------------------------------------------------------

    def _delete(self) -> None:
        session = self._session()
        if session is None:
            return
        self.door.sessions.remove(session)
        self._send(204, None)
