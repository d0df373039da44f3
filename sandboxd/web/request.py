# -*- test-case-name: tests.web.test_request -*-
"""
The request class of the site: the pipeline's header-time steps, the body
cap, and the hand-off to the handler.

Twisted calls :meth:`SandboxRequest.gotLength` once every header is in and
before any body byte is read (and before it would send ``100 Continue``);
that is where steps 1–5 of SPEC §3 run, so a refused or oversized request
never has its body buffered.  The request line is read from the channel's
``_command``/``_path`` because ``method`` and ``uri`` are only set once the
whole body has arrived; Synapse relies on the same hooks.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from twisted.logger import Logger
from twisted.web.http import NO_BODY_CODES, datetimeToString, parse_qs
from twisted.web.http_headers import Headers
from twisted.web.server import Request

from sandboxd.access import gate
from sandboxd.daemon.context import Context
from sandboxd.errors import (
    ApiError,
    Code,
    limit_setting,
    payload_too_large,
    unexpected,
)
from sandboxd.policy.defaults import (
    DRAIN_LIMIT_BYTES,
    LARGE_BODY_BYTES,
    LARGE_READ_BYTES,
)
from sandboxd.web.channel import client_left, close_after_answer
from sandboxd.web.cors import (
    allowed_origin,
    is_preflight,
    preflight_headers,
    response_headers,
)
from sandboxd.web.dispatch import (
    dispatch,
    error_framing,
    reason_phrase,
    respond_error,
)
from sandboxd.web.jsonbody import json_bytes, parse_object
from sandboxd.web.messages import BodySink, ServerRequest
from sandboxd.web.pipeline import Admission, PipelineRefusal, Refusal, admit
from sandboxd.web.ptysocket import PtySocketExchange, session_of
from sandboxd.web.sending import send_now, write_head_and_body_now, write_now
from sandboxd.web.upload import UploadBody


class HeaderView(Mapping[str, str]):
    """
    A request's headers as handlers read them (lower-cased names, the last
    value of each), decoded only when asked for.

    Most handlers read one or two headers, or none, while a request brings
    a dozen: decoding them all for every call was work thrown away.  Names
    and values are Latin-1, as HTTP/1.1 carries them.
    """

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[bytes, Sequence[bytes]]) -> None:
        """
        :param fields: the raw header values by lower-cased name, as the
            request's head was parsed (kept, not copied).
        """
        self._fields = fields

    def __getitem__(self, name: str) -> str:
        try:
            raw = name.encode("latin-1")
        except UnicodeEncodeError:
            raise KeyError(name) from None
        values = self._fields.get(raw)
        if not values:
            raise KeyError(name)
        return values[-1].decode("latin-1")

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            return bool(self._fields.get(name.encode("latin-1")))
        except UnicodeEncodeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return (k.decode("latin-1") for k, v in self._fields.items() if v)

    def __len__(self) -> int:
        return sum(1 for v in self._fields.values() if v)

    def __repr__(self) -> str:
        return f"HeaderView({dict(self)!r})"


#: A body at least this big is sent beside its head (one ``sendmsg``)
#: rather than copied once more to be joined to it.
BIG_BODY = 64 * 1024

#: Methods that change nothing.  A request with any other method is not
#: carried out once its client has closed the connection (see
#: :func:`~sandboxd.web.channel.client_left`); these are not worth the
#: system call the check costs.
_SAFE_METHODS = frozenset({b"GET", b"HEAD"})


def _read_size(transport: Any, size: int | None) -> None:
    """
    How much one ``recv`` on ``transport`` asks for: ``size``, or Twisted's
    own default again with None (the connection may carry small requests
    next).
    """
    if transport is None or not hasattr(transport, "bufferSize"):
        return
    if size is not None:
        transport.bufferSize = size
    elif "bufferSize" in vars(transport):
        del transport.bufferSize


class SandboxRequest(Request):
    """One HTTP request travelling through the pipeline."""

    log = Logger()
    admission: Admission | None = None
    refusal: Refusal | None = None
    sink: BodySink | None = None
    body_error: ApiError | None = None
    answered_early = False
    #: Audited (and counted) already: a request is audited once.
    audited = False
    bytes_in = 0
    cap = 0
    started = 0.0
    audit_code: str | None = None
    audit_rule: str | None = None
    audit_fields: Mapping[str, Any] = {}
    method_text = ""
    upload_body: UploadBody | None = None
    watching_finish = False
    cors_origin: str | None = None
    preflight = False
    widened = False
    payload: bytearray | None = None
    #: The door this request was handed to (``/mcp``), if any.
    door_exchange: Any = None
    _headers_lc: Mapping[bytes, Sequence[bytes]] = {}
    body_buffer: io.BytesIO

    client_host = ""
    _context: Context | None = None

    def __init__(
        self,
        channel: Any,
        *args: Any,
        parsePOSTFormSubmission: bool | None = None,
        **kw: Any,
    ) -> None:
        """
        Set what Twisted's two constructors set (``twisted.web.server``'s
        and ``twisted.web.http``'s), in one call rather than three: a new
        request per call makes this part of every call's fixed cost.  The
        addresses are the channel's, asked of the socket once per
        connection.
        """
        self.notifications = []
        self.channel = channel
        self.client = channel.getPeer()
        self.host = channel.getHost()
        self.requestHeaders = Headers()
        self.received_cookies = {}
        self.responseHeaders = Headers()
        self.cookies = []
        self.transport = channel.transport
        # Twisted's deprecated ``queued``, positional or named.
        self.queued = args[0] if args else kw.get("queued", False)
        self._parsePOSTFormSubmission = (
            channel.site._parsePOSTFormSubmission
            if parsePOSTFormSubmission is None
            else parsePOSTFormSubmission
        )
        # components.Componentized's own state.
        self._adapterCache = {}

    @property
    def context(self) -> Context:
        """The daemon's shared state (kept: the channel goes once finished)."""
        if self._context is None:
            self._context = _site(self).context
        return self._context

    # -- header time ------------------------------------------------------

    def gotLength(self, length: int | None) -> None:
        """Run SPEC §3 steps 1–5 before reading the body."""
        self.started = time.monotonic()
        self.body_buffer = self.content = io.BytesIO()
        channel = self.channel
        context = self._context = _site(self).context
        # Request.__init__ already asked the transport for the peer.
        self.client_host = getattr(self.client, "host", "") or ""
        method = self.method_text = channel._command.decode("latin-1")
        head = getattr(channel, "head", None)
        # The channel's parsed head already holds them by lower-cased name.
        headers = (
            head.fields
            if head is not None
            else {k.lower(): v for k, v in self.requestHeaders.getAllRawHeaders()}
        )
        self._headers_lc = headers
        allowed = context.policy.document.allowed_origins
        self.cors_origin = allowed_origin(headers, allowed) if allowed else None
        if self.cors_origin is not None and is_preflight(method, headers):
            self.preflight = True
            return
        if method == "GET":
            session_id = session_of(channel._path)
            if session_id is not None:
                # The PTY WebSocket: its own gate call, at the handshake.
                self.door_exchange = PtySocketExchange(self, channel._path, session_id)
                return
        doors = context.doors
        if doors:
            door = doors.get(channel._path.partition(b"?")[0].rstrip(b"/"))
            if door is not None:
                self.door_exchange = door.exchange(self, method, headers, length)
                return
        try:
            admission = admit(context, method, channel._path, headers, self.isSecure())
        except PipelineRefusal as e:
            self.refusal = e.refusal
            if length is None or length > DRAIN_LIMIT_BYTES:
                self._answer_early(e.refusal.error)
            return
        self.admission = admission
        self.cap = admission.rule.limits.max_request_bytes or 0
        if length is not None and self.cap and length > self.cap:
            self._fail_at_header(self._too_large())
            return
        if length is not None and length > LARGE_BODY_BYTES:
            # A gigabyte upload is then a thousand reactor turns, not
            # sixteen thousand.
            self.widened = True
            _read_size(channel.transport, LARGE_READ_BYTES)
        endpoint = admission.endpoint
        if endpoint.upload and endpoint.body == "json":
            limit = admission.rule.limits.max_bytes or self.cap
            self.upload_body = UploadBody(
                limit, limit_setting(admission.endpoint.id, "max_bytes")
            )
        if admission.endpoint.body == "raw" and admission.endpoint.sink is not None:
            try:
                self.sink = admission.endpoint.sink(self.server_request({}))
            except ApiError as e:
                self._fail_at_header(e)

    def _too_large(self) -> ApiError:
        """
        The body is over ``max_request_bytes``: a 413 naming the key to
        raise (an upload's cap follows its ``max_bytes`` unless the policy
        set ``max_request_bytes`` itself).
        """
        assert self.admission is not None
        endpoint, rule = self.admission.endpoint, self.admission.rule
        derived = endpoint.upload and rule.source("limits.max_request_bytes") is None
        key = "max_bytes" if derived else "max_request_bytes"
        return payload_too_large(self.cap, setting=limit_setting(endpoint.id, key))

    def _fail_at_header(self, error: ApiError) -> None:
        """Refuse an admitted request before its body: answer now and close."""
        assert self.admission is not None
        a = self.admission
        self.refusal = Refusal(
            error, a.path, a.raw_query, a.endpoint, a.identity, a.rule
        )
        self._release()
        self.admission = None
        self._answer_early(self.refusal.error)

    def _answer_early(self, error: ApiError) -> None:
        """
        Write a complete error response straight to the transport and close
        once its client can have read it (whatever of the body it still
        sends is read and dropped meanwhile, within bounds).

        ``setResponseCode``/``write`` cannot be used before
        ``requestReceived``; this mirrors Twisted's own
        ``_respondToBadRequestAndDisconnect``.  ``Expect`` is removed so no
        stray ``100 Continue`` follows the response.
        """
        self.answered_early = True
        self.requestHeaders.removeHeader(b"expect")
        known = self.admission or self.refusal
        framed, headers = error_framing(
            known.endpoint if known is not None else None,
            known.path if known is not None else "",
            error,
        )
        body = json_bytes(framed)
        head = [
            f"HTTP/1.1 {error.status} {reason_phrase(error.status)}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        transport = self.channel.transport
        assert transport is not None
        if self.channel._command == b"HEAD":
            body = b""  # the Content-Length above is what a GET would get
        transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        self._audit(error.status, error.code, error.extra.get("rule"), len(body))
        close_after_answer(self.channel)

    def handleContentChunk(self, data: bytes) -> None:
        """Count, cap and store (or stream) one chunk of the body."""
        if self.answered_early:
            return
        if self.door_exchange is not None:
            self.door_exchange.write(data)
            return
        self.bytes_in += len(data)
        if self.refusal is not None or self.body_error is not None:
            return
        if self.cap and self.bytes_in > self.cap:
            self._abort_sink()
            self._fail_at_header(self._too_large())
            return
        if self.sink is not None:
            try:
                self.sink.write(data)
            except ApiError as e:
                self.body_error = e
                self._abort_sink()
            return
        if self.upload_body is not None:
            self.upload_body.write(data)
            return
        self.body_buffer.write(data)

    def _abort_sink(self) -> None:
        if self.sink is not None:
            sink, self.sink = self.sink, None
            sink.abort()

    # -- after the body ---------------------------------------------------

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        """
        Set the request line, then :meth:`process`: Twisted's own, less
        its look-up of the body's type for a form, which this site never
        parses (``parsePOSTFormSubmission`` is off; with it on, Twisted's
        runs).
        """
        if self._parsePOSTFormSubmission:
            super().requestReceived(command, path, version)
            return
        self.body_buffer.seek(0, 0)  # the same buffer as ``content``
        self.method, self.uri, self.clientproto = command, path, version
        self.path, query, argstring = path.partition(b"?")
        self.args = parse_qs(argstring, 1) if query else {}
        self.process()

    def process(self) -> None:
        """Answer a refusal, or parse the body and run the handler (steps 6–8)."""
        if self.answered_early:
            return
        if self.widened:
            _read_size(self.channel.transport, None)
        self.site = _site(self)
        # The daemon's own origin is trusted (SPEC §5.2's same-origin rule),
        # so nothing it serves may run script in it: a downloaded HTML file
        # or SVG is never sniffed into a page and is sandboxed if opened.
        # Constants (and a date): stored under the names Twisted's Headers
        # would give them, without its per-value checks.
        raw = self.responseHeaders._rawHeaders
        raw[b"Date"] = [http_date()]
        raw[b"X-Content-Type-Options"] = [b"nosniff"]
        raw[b"Content-Security-Policy"] = [b"sandbox"]
        if self.cors_origin is not None:
            cors = preflight_headers if self.preflight else response_headers
            for name, value in cors(self.cors_origin).items():
                self.setHeader(name, value)
            if self.preflight:
                self.setResponseCode(204)
                self.finish()
                return
        if self.door_exchange is not None:
            self.door_exchange.process()
            return
        if self.admission is None:
            refusal = self.refusal
            assert refusal is not None
            self.respond_error(refusal.error)
            return
        if self.body_error is not None:
            self.respond_error(self.body_error)
            return
        self.watching_finish = True
        transport = self.channel.transport
        if (
            self.method not in _SAFE_METHODS
            and transport is not None
            and client_left(transport)
        ):
            # Audited as client_closed once Twisted sees the close.
            transport.loseConnection()
            return
        try:
            body = self._parse_body()
            sink_result = self.sink.finish() if self.sink is not None else None
        except ApiError as e:
            self._abort_sink()
            self.respond_error(e)
            return
        except Exception as e:
            self.log.failure("reading the request body failed")
            self._abort_sink()
            self.respond_error(unexpected(e))
            return
        request = self.server_request(body)
        request.sink_result = sink_result
        request.payload = self.payload
        dispatch(self, request)

    def _parse_body(self) -> dict[str, Any]:
        """Step 6: the JSON object of a POST/DELETE (``{}`` when empty)."""
        assert self.admission is not None
        if (
            self.method not in (b"POST", b"DELETE")
            or self.admission.endpoint.body != "json"
        ):
            return {}
        try:
            if self.upload_body is not None:
                body, self.payload = self.upload_body.result()
                self.upload_body = None
                return body
            raw = self.body_buffer.getvalue()
            self.body_buffer = self.content = io.BytesIO()
            return parse_object(raw)
        except ApiError as e:
            if e.code == Code.INVALID_JSON:
                e.message += _not_json(self.getHeader(b"content-type"))
            raise

    def server_request(self, body: dict[str, Any]) -> ServerRequest:
        """The handler's view of this request."""
        a = self.admission
        assert a is not None
        served = ServerRequest(
            method=self.method_text,
            path=a.path,
            query=a.query,
            headers=HeaderView(self._headers_lc),
            body=body,
            path_params=a.path_params,
            identity=a.identity,
            endpoint=a.endpoint,
            rule=a.rule,
            context=self.context,
            raw=self,
            client=self.client_host,
        )
        # What the handler notes for the audit lands in this request's record.
        self.audit_fields = served.audit
        return served

    # -- responses --------------------------------------------------------

    def respond_error(self, error: ApiError) -> None:
        """
        Answer with an :class:`ApiError`; a request the pipeline refused is
        audited here, an admitted one when it finishes.
        """
        respond_error(self, error)
        if self.admission is None:
            self._audit(error.status, error.code, self.audit_rule, self.sentLength)

    def _release(self) -> None:
        a = self.admission
        if a is not None and a.slot:
            a.slot = False
            self.context.concurrency.release(a.endpoint.id)

    def write(self, data: bytes) -> None:
        """
        Write a response's body; a first write whose length is declared
        goes out with the status line and headers as one buffer.

        Twisted's first write asks the headers for the type and length
        again, decides on chunking, and hands the channel the head and the
        body separately.  A complete response (the common case: a JSON
        answer, ``Content-Length`` set) needs none of that; anything else
        (no length, HEAD, a body-less status, HTTP/1.0, cookies, an
        encoder, no ``Content-Type``) is left to Twisted.
        """
        headers = self.responseHeaders._rawHeaders
        if (
            self.startedWriting
            or self.finished
            or self._disconnected
            or self.clientproto != b"HTTP/1.1"
            or self.method == b"HEAD"
            or self.code in NO_BODY_CODES
            or self.cookies
            or self.lastModified is not None
            or self.etag is not None
            or self._encoder is not None
            or self._inFakeHead
            or b"Content-Length" not in headers
            or b"Content-Type" not in headers
        ):
            super().write(data)
            return
        self.startedWriting = 1
        parts = [b"HTTP/1.1 %d %s\r\n" % (self.code, self.code_message)]
        for name, values in headers.items():
            for value in values:
                parts += (name, b": ", value, b"\r\n")
        self.sentLength += len(data)
        if len(data) >= BIG_BODY:
            parts.append(b"\r\n")
            write_head_and_body_now(self.channel.transport, b"".join(parts), data)
            return
        parts += (b"\r\n", data)
        write_now(self.channel.transport, b"".join(parts))

    def finish(self) -> None:
        """Finish the response, then free the slot and audit (step 8)."""
        transport = self.channel.transport if self.channel is not None else None
        super().finish()
        if self.watching_finish:
            self.watching_finish = False
            self._finished(None)
        if transport is not None:
            send_now(transport)

    def upgraded(self) -> None:
        """
        The connection becomes another protocol (a WebSocket after its
        101): for the pipeline the request is over now, its slot freed and
        its line audited as 101, although Twisted never sees it finish.
        """
        if self.watching_finish:
            self.watching_finish = False
            self._release()
            self._audit(101, None, None, 0)

    def connectionLost(self, reason: Any) -> None:
        """The client left: free the slot and audit it as such."""
        super().connectionLost(reason)
        if self.watching_finish:
            self.watching_finish = False
            self._finished(reason)
        else:
            # Cut mid-body: the handler never ran, so the raw sink is told
            # here (a raw write removes its temporary file, a resumable
            # upload keeps what arrived), and the slot taken at the head is
            # given back (else every upload its client abandoned held one
            # of the endpoint's concurrency slots until the daemon stopped).
            # Audited whether or not the endpoint counts its concurrency:
            # an abandoned upload is a request like any other (``audit:
            # all`` and ``sandboxd_requests_total`` see every one).  A
            # refusal still draining its body is audited as the refusal
            # it was, so ``audit: denied`` keeps it.
            self._abort_sink()
            if self.audited or self.answered_early:
                return
            if self.admission is not None:
                self._release()
                self._audit(499, "client_closed", self.audit_rule, 0)
            elif self.refusal is not None:
                error = self.refusal.error
                self._audit(error.status, error.code, error.extra.get("rule"), 0)

    def refuse_slow_body(self, error: ApiError) -> None:
        """
        The body comes too slowly (the channel's minimum rate): answer
        ``error`` in this door's framing, free the slot, audit it, close.
        """
        self._abort_sink()
        if self.admission is None:
            # Refused already, its answer written: only close.
            transport: Any = self.channel.transport
            if transport is not None:
                transport.abortConnection()
            return
        self._fail_at_header(error)

    def _finished(self, result: object) -> None:
        """
        The response is over (or the client left): free the slot, audit.

        A client that leaves after its answer began (its status sent, and
        maybe most of the body) ended a call that was carried out: closing
        is the only way to end a followed stream, and a download cut short
        was served all the same.  Its line keeps the status it was sent,
        with ``client_left``, so that ``audit: deny`` records refusals and
        failures, not every watch a client closed.  Only a client gone
        before any answer is ``499 client_closed``.
        """
        self._release()
        self._abort_sink()
        if self.finished:
            self._audit(self.code, self.audit_code, self.audit_rule, self.sentLength)
        elif self.startedWriting:
            self.audit_fields = {**self.audit_fields, "client_left": True}
            self._audit(self.code, self.audit_code, self.audit_rule, self.sentLength)
        else:
            self._audit(499, "client_closed", self.audit_rule, self.sentLength)

    def _audit(
        self, status: int, code: str | None, rule: str | None, bytes_out: int
    ) -> None:
        """Step 8: one audit line, if the endpoint's ``audit`` mode wants it."""
        self.audited = True
        known = self.admission or self.refusal
        endpoint = known.endpoint if known is not None else None
        door = (
            gate.Door.OPENAI
            if endpoint is not None and endpoint.door == "openai"
            else gate.Door.HTTP
        )
        gate.audit(
            self.context,
            door=door,
            endpoint=known.endpoint if known is not None else None,
            identity=known.identity if known is not None else None,
            rule=known.rule if known is not None else None,
            method=self.method_text,
            path=known.path if known is not None else "",
            query=known.raw_query if known is not None else "",
            status=status,
            code=code,
            decided_by=rule,
            started=self.started,
            bytes_in=self.bytes_in,
            bytes_out=bytes_out,
            client=self.client_host,
            extra=self.audit_fields,
            headers=getattr(self, "_headers_lc", None),
        )


_DATE: tuple[int, bytes] = (0, b"")


def http_date() -> bytes:
    """
    The ``Date`` header's value, formatted once per second rather than
    once per response.
    """
    global _DATE
    now = int(time.time())
    if _DATE[0] != now:
        _DATE = (now, datetimeToString(now))
    return _DATE[1]


def _site(request: Request) -> Any:
    """The channel's site (set by ``Site.buildProtocol``, untyped in Twisted)."""
    return request.channel.site  # type: ignore[attr-defined]


def _not_json(content_type: bytes | None) -> str:
    """
    What to add to a JSON refusal of a body sent as another type (a form,
    a file's bytes): the endpoint takes JSON, which its client did not
    send.
    """
    if content_type is None:
        return ""
    kind = content_type.decode("latin-1").partition(";")[0].strip().lower()
    if not kind or kind == "application/json" or kind.endswith("+json"):
        return ""
    return f"; this endpoint takes a JSON body (Content-Type: application/json), not {kind[:80]}"
