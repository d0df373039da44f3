# -*- test-case-name: tests.e2b.test_door -*-
"""
The E2B door (SPEC §16, §18): envd's API on a port of its own, each call
passed through the one gate as the sandboxd endpoint doing the same job.

A :class:`Call` is one request through this door: it is admitted by
:func:`sandboxd.access.gate.admit` as its mapped endpoint (the procedure's
``endpoint`` decides which, sometimes from the message: ``Start`` with a
``pty`` is ``pty_create_session``), runs, and writes exactly one audit line
(``via: e2b``) when it is over, whatever the outcome.  Handlers raise
:class:`~sandboxd.errors.ApiError`; this module alone turns them into
Connect errors (unary: a JSON error with the code's HTTP status; streams:
the end-of-stream message) or envd's REST errors (``{"code", "message"}``).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import io
import json
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import CancelledError, maybeDeferred
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request
from zope.interface import implementer

from sandboxd.access import gate
from sandboxd.api.fields import Field
from sandboxd.e2b import connect
from sandboxd.errors import (
    ApiError,
    bad_request,
    endpoint_disabled,
    exhausted,
    insufficient_storage,
    internal,
    malformed_request,
    not_json,
    payload_too_large,
    unsupported,
)
from sandboxd.policy.defaults import (
    E2B_KEEPALIVE_MAX_SECONDS,
    E2B_KEEPALIVE_MIN_SECONDS,
    E2B_MAX_MESSAGE_BYTES,
    MIB,
)
from sandboxd.web.connections import ConnectionLimits
from sandboxd.web.factory import HardenedSite
from sandboxd.web.messages import ServerRequest
from sandboxd.web.params import declared_types

if TYPE_CHECKING:
    from sandboxd.access.auth import Identity
    from sandboxd.policy.rules import EffectiveRule

log = Logger(namespace="sandboxd.e2b")


# -- procedures -----------------------------------------------------------------

UNARY = "unary"
SERVER_STREAM = "server_stream"
CLIENT_STREAM = "client_stream"
REST = "rest"


@attrs.frozen
class Procedure:
    """
    One thing the door serves.

    :ivar endpoint: the sandboxd endpoint id it is governed as, or a
        function of the call and its first message that picks one.
    :ivar run: ``(call, message) -> value`` (unary, client stream: the
        response message; REST: the handler writes the response itself and
        returns a Deferred, or returns bytes/JSON), or for a server stream
        ``(call, message, stream) -> None``.
    :ivar api_key: the SDK's ``X-API-Key`` presents the token on this route
        (E2B's control plane), when the call carries no other credential.
    :ivar fields: a REST route that takes a JSON object: the fields it
        reads, with their JSON types.  The door refuses a body that is no
        object, or a field of another type, before the route runs, and
        gives the route the object (a Connect procedure's fields are envd's
        protobuf messages').
    """

    name: str
    kind: str
    endpoint: str | Callable[[Call, dict[str, Any]], str]
    run: Callable[..., Any]
    api_key: bool = False
    fields: tuple[Field, ...] | None = None


# -- the request ----------------------------------------------------------------


class E2BRequest(Request):
    """
    A request of this door: its body is capped as it arrives (Synapse's
    way), so an oversized upload or message is refused without being kept.
    """

    too_big: int | None = None
    #: The body's spool (a temporary file past Twisted's in-memory size)
    #: ran out of disk: the rest is dropped, and the call answers 507.
    no_space = False
    _received = 0
    _cap = 0

    def gotLength(self, length: int | None) -> None:
        """The body's announced length: refused at once when over the cap."""
        site: E2BSite = self.channel.site  # type: ignore[attr-defined]
        path = getattr(self.channel, "_path", b"") or b""
        self._cap = site.body_cap(path)
        if length is not None and length > self._cap:
            self.too_big = self._cap
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        """
        One chunk of the body; past the cap, or once the disk has no room
        for it, the rest is dropped, not kept.
        """
        if self.too_big is not None or self.no_space:
            return
        self._received += len(data)
        if self._received > self._cap:
            self.too_big = self._cap
            self._drop_content()
            return
        try:
            super().handleContentChunk(data)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self.no_space = True
            self._drop_content()

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        """
        The whole body is in: what the spool still buffers in memory is
        written first, so that a disk with no room for it is the same 507
        as one that filled during the body (Twisted's own ``seek`` would
        raise it and drop the connection unanswered).
        """
        if self.content is not None and self.too_big is None and not self.no_space:
            try:
                self.content.flush()
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                self.no_space = True
                self._drop_content()
        super().requestReceived(command, path, version)

    def _drop_content(self) -> None:
        """What was kept of the body, let go (its disk space too)."""
        if self.content is None:
            return
        try:
            self.content.seek(0)
            self.content.truncate()
        except OSError:
            # Bytes the disk refused are still buffered, and every seek
            # tries them again: the spool goes (its file with it).
            with contextlib.suppress(OSError):
                self.content.close()
            self.content = io.BytesIO()


class E2BSite(HardenedSite):
    """
    The door's site: one resource that serves every path, over the HTTP
    door's hardened connection (connection caps and the request-head
    deadline in a table of its own, no obs-fold), HTTP/1.1 only.
    """

    requestFactory = E2BRequest
    door = "e2b"

    def __init__(self, door: Door, limits: ConnectionLimits | None = None) -> None:
        super().__init__(_Root(door), door.context, door.context.reactor, limits)
        self.e2b = door

    def body_cap(self, path: bytes) -> int:
        """How many body bytes a request to ``path`` may send."""
        return self.e2b.body_cap(path.split(b"?", 1)[0])

    def refusal(
        self, error: ApiError, path: str, accept: bytes | None
    ) -> tuple[bytes, bytes, dict[str, str]]:
        """
        A request the HTTP front refused, in the framing its client reads
        (the status unchanged): a Connect error on a procedure's path (the
        SDK's Connect client reads ``code`` as a Connect code, and takes
        any other string for an unreachable sandbox), envd's REST error
        elsewhere and when no path was read (the SDK reads ``message``).
        """
        if procedure_path(path):
            body: dict[str, Any] = connect.error_json(error)
        else:
            body = rest_error(error)
        return b"application/json", json.dumps(body).encode(), dict(error.headers)


class _Root(Resource):
    isLeaf = True

    def __init__(self, door: Door) -> None:
        super().__init__()
        self.door = door

    def render(self, request: Any) -> Any:
        """Every request goes to the door, which always finishes it."""
        self.door.serve(request)
        return NOT_DONE_YET


# -- one call -------------------------------------------------------------------


def run_each(callbacks: Iterable[Callable[[], object]], failed: str) -> None:
    """
    Call each of ``callbacks``; one that raises is logged (``failed``)
    and the rest still run, so one bad hook cannot leak the others.
    """
    for callback in callbacks:
        try:
            callback()
        except Exception:
            log.failure(failed)


def raw_headers(request: Any) -> dict[bytes, list[bytes]]:
    """Lower-cased header names to their raw values, as the gate reads them."""
    out: dict[bytes, list[bytes]] = {}
    for name, values in request.requestHeaders.getAllRawHeaders():
        out.setdefault(name.lower(), []).extend(values)
    return out


def basic_user(headers: dict[bytes, list[bytes]]) -> str | None:
    """
    The user envd reads from ``Authorization: Basic base64(user:)``.

    :raises ApiError: 400 for a Basic credential that does not decode.
    """
    for value in headers.get(b"authorization", []):
        scheme, _, rest = value.strip().partition(b" ")
        if scheme.lower() != b"basic":
            continue
        try:
            decoded = base64.b64decode(rest.strip(), validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise bad_request("the Basic credential does not decode") from None
        name = decoded.partition(":")[0]
        return name or None
    return None


@attrs.define(eq=False)
class Call:
    """
    One request through the door, from admission to its audit line.

    :ivar passed: what the gate let through (None until admitted).
    """

    door: Door
    request: Any
    procedure: Procedure
    started: float
    headers: dict[bytes, list[bytes]]
    passed: gate.Passed | None = None
    #: What the gate let through as the door's own endpoint ``e2b``.
    door_passed: gate.Passed | None = None
    endpoint_id: str | None = None
    status: int = 200
    #: The audit code of an outcome that is not an error (``client_closed``).
    code: str | None = None
    error: ApiError | None = None
    finished: bool = False
    closed: bool = False
    bytes_in: int = 0
    bytes_out: int = 0
    #: Who a refused caller turned out to be, for the audit line.
    refused_identity: Identity | None = None
    #: What the handlers noted for the audit line (``argv``), shared by
    #: every :meth:`server_request` of the call.
    audit_fields: dict[str, Any] = attrs.Factory(dict)
    _on_close: list[Callable[[], None]] = attrs.Factory(list)

    @property
    def context(self) -> Any:
        """The daemon's shared services (:class:`sandboxd.daemon.context.Context`)."""
        return self.door.context

    @property
    def rule(self) -> EffectiveRule:
        """The mapped endpoint's rule (after admission)."""
        assert self.passed is not None
        return self.passed.rule

    @property
    def identity(self) -> Identity:
        """Who is calling (once the door, or the mapped endpoint, admitted it)."""
        passed = self.passed or self.door_passed
        assert passed is not None
        return passed.identity

    def header(self, name: str) -> str | None:
        """One request header's last value."""
        values = self.headers.get(name.lower().encode())
        return values[-1].decode("latin-1").strip() if values else None

    def user(self) -> str | None:
        """The envd user (``Authorization: Basic``), §7.4's ``user``."""
        return basic_user(self.headers)

    def timeout_seconds(self) -> float | None:
        """
        ``Connect-Timeout-Ms`` in seconds (None when absent).

        :raises ApiError: 400 for a value that is not a positive integer.
        """
        raw = self.header("connect-timeout-ms")
        if raw is None or raw == "":
            return None
        digits = raw.isascii() and raw.isdigit()
        if not digits or len(raw) > 10 or int(raw) <= 0:
            raise bad_request(
                f"Connect-Timeout-Ms must be a positive integer, not {raw[:20]!r}"
            )
        return int(raw) / 1000.0

    def keepalive_seconds(self) -> float | None:
        """The ``Keepalive-Ping-Interval`` the client asked for, bounded."""
        raw = self.header("keepalive-ping-interval")
        if not raw:
            return None
        try:
            value = float(raw)
        except ValueError:
            return None
        if value != value or value <= 0:
            return None
        return min(max(value, E2B_KEEPALIVE_MIN_SECONDS), E2B_KEEPALIVE_MAX_SECONDS)

    def server_request(
        self,
        body: dict[str, Any] | None = None,
        query: dict[str, str] | None = None,
        path_params: dict[str, str] | None = None,
    ) -> ServerRequest:
        """
        The call as the sandboxd handler of its endpoint sees a request,
        so the handler's rules (paths, limits, users, caps) apply as they
        are, not as a copy.
        """
        assert self.passed is not None
        endpoint = self.passed.endpoint
        return ServerRequest(
            method=endpoint.method,
            path=endpoint.path,
            query=query or {},
            headers={},
            body=body or {},
            path_params=path_params or {},
            identity=self.passed.identity,
            endpoint=endpoint,
            rule=self.passed.rule,
            context=self.context,
            raw=None,
            client=self.client,
            audit=self.audit_fields,
        )

    @property
    def client(self) -> str:
        """The peer's address."""
        peer = self.request.getClientAddress()
        return str(getattr(peer, "host", "") or "")

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once when the client goes away before the end."""
        if self.closed:
            callback()
        else:
            self._on_close.append(callback)

    def _gone(self, _: object = None) -> None:
        if self.finished or self.closed:
            return
        self.closed = True
        # As the HTTP door audits a client that left: 499 client_closed.
        self.status, self.code = 499, "client_closed"
        callbacks, self._on_close = self._on_close, []
        run_each(callbacks, "sandboxd: e2b close callback failed")
        self.done()

    def done(self) -> None:
        """The call is over: release the slot, write the audit line (once)."""
        if self.finished:
            return
        self.finished = True
        context = self.context
        passed = self.passed
        for held in (self.door_passed, passed):
            if held is not None:
                gate.release(context, held)
        error = self.error
        endpoint = passed.endpoint if passed is not None else None
        if endpoint is None and self.endpoint_id is not None:
            endpoint = context.table.get(self.endpoint_id)
        rule = (
            passed.rule
            if passed is not None
            else context.policy.rules.get(self.endpoint_id or "e2b")
        )
        uri = self.request.uri.decode("latin-1")
        path, _, query = uri.partition("?")
        gate.audit(
            context,
            door=gate.Door.E2B,
            endpoint=endpoint,
            identity=passed.identity if passed is not None else self.refused_identity,
            rule=rule,
            method=self.request.method.decode("latin-1"),
            path=path,
            query=query,
            status=error.status if error is not None else self.status,
            code=str(error.code) if error is not None and error.code else self.code,
            decided_by=error.rule if error is not None else None,
            started=self.started,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            client=self.client,
            extra={"procedure": self.procedure.name, **self.audit_fields},
        )


# -- server streams -------------------------------------------------------------


@implementer(IPushProducer)
class _Pauser:
    """What a slow client pauses (a child's pipes, a terminal)."""

    def __init__(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        self.pause = pause
        self.resume = resume

    def pauseProducing(self) -> None:
        """The client's socket is full: pause the source."""
        self.pause()

    def resumeProducing(self) -> None:
        """The client's socket drained: resume the source."""
        self.resume()

    def stopProducing(self) -> None:
        """The client left: the stream's close handling lets go."""


class Stream:
    """
    The response of a server stream: enveloped messages, keepalives at the
    client's interval while nothing else is sent, and one end-of-stream
    message (with the error, if any) at the end.
    """

    def __init__(self, call: Call, keepalive: Callable[[], dict[str, Any]] | None):
        self.call = call
        self.request = call.request
        self.clock = call.context.reactor
        self.ended = False
        self._keepalive_message = keepalive
        self._interval = call.keepalive_seconds() if keepalive is not None else None
        self._timer: Any = None
        self._deadline: Any = None
        self._end_hooks: list[Callable[[], None]] = []
        self._producer: _Pauser | None = None
        self.request.setResponseCode(200)
        self.request.setHeader(b"content-type", connect.STREAM_CONTENT_TYPE.encode())
        call.on_close(self._client_gone)
        self._arm()

    def _client_gone(self) -> None:
        """The client left: stop the timers and let go of what was followed."""
        if not self.ended:
            self.ended = True
            self._stop()

    def _arm(self) -> None:
        if self._interval is None or self.ended:
            return
        if self._timer is not None and self._timer.active():
            self._timer.reset(self._interval)
        else:
            self._timer = self.clock.callLater(self._interval, self._ping)

    def _ping(self) -> None:
        self._timer = None
        if self.ended or self.call.closed or self._keepalive_message is None:
            return
        self._write(connect.envelope(self._keepalive_message()))
        self._arm()

    def deadline(self, seconds: float | None, on_expiry: Callable[[], None]) -> None:
        """End the stream with ``deadline_exceeded`` after ``seconds``."""
        if seconds is None:
            return

        def expire() -> None:
            self._deadline = None
            if not self.ended:
                on_expiry()

        self._deadline = self.clock.callLater(seconds, expire)

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the stream is over (ended, or the client left)."""
        self._end_hooks.append(callback)

    def _write(self, data: bytes) -> None:
        if self.call.closed or self.ended:
            return
        self.call.bytes_out += len(data)
        self.request.write(data)

    def register_producer(
        self, pause: Callable[[], None], resume: Callable[[], None]
    ) -> None:
        """Let a client that reads slowly pause what feeds the stream."""
        self._producer = _Pauser(pause, resume)
        self.request.registerProducer(self._producer, True)

    def _stop(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            if self.request.channel is not None:
                self.request.unregisterProducer()
            producer.resume()
        for timer in (self._timer, self._deadline):
            if timer is not None and timer.active():
                timer.cancel()
        self._timer = self._deadline = None
        hooks, self._end_hooks = self._end_hooks, []
        run_each(hooks, "sandboxd: e2b stream cleanup failed")

    def send(self, message: dict[str, Any]) -> None:
        """One response message."""
        self._write(connect.envelope(message))
        self._arm()

    def end(self, error: ApiError | None = None) -> None:
        """The end-of-stream message, then the response is over (idempotent)."""
        if self.ended:
            return
        if error is not None and self.call.error is None:
            self.call.error = error
        if not self.call.closed:
            self._write(connect.end_stream(error))
        self.ended = True
        self._stop()
        if not self.call.closed:
            self.request.finish()
        self.call.done()


# -- the door -------------------------------------------------------------------


class Door:
    """
    Dispatches the door's requests to procedures, through the gate.

    :param procedures: ``"package.Service/Method"`` (RPC) or
        ``"METHOD /path"`` (REST) to its :class:`Procedure`.
    """

    def __init__(
        self,
        context: Any,
        procedures: dict[str, Procedure],
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.context = context
        self.procedures = procedures
        self.limits = limits
        self._site: E2BSite | None = None

    def body_cap(self, path: bytes) -> int:
        """The body cap of a request to ``path`` (uploads: ``max_bytes``)."""
        if path.rstrip(b"/") == b"/files":
            limit = self.context.policy.rules["files_write_raw"].limits.max_bytes
            # Multipart framing adds a little to the file bytes.
            return int(limit or 100 * MIB) + MIB
        return E2B_MAX_MESSAGE_BYTES * 4 + 64 * 1024

    def site(self) -> E2BSite:
        """The twisted.web site serving this door (one per door)."""
        if self._site is None:
            self._site = E2BSite(self, self.limits)
        return self._site

    def _find(self, request: Any) -> Procedure | None:
        path = request.path.decode("latin-1")
        method = request.method.decode("latin-1")
        if method == "POST" and procedure_path(path):
            return self.procedures.get(path.lstrip("/"))
        key = f"{method} {path.rstrip('/') or '/'}"
        return self.procedures.get(key) or self.procedures.get(_templated(key))

    def serve(self, request: Any) -> None:
        """Answer one request (the response is always finished)."""
        started = time.monotonic()
        procedure = self._find(request)
        headers = raw_headers(request)
        content_type = request.getHeader(b"content-type") or b""
        streaming = content_type.startswith(b"application/connect+")
        if procedure is None:
            procedure = Procedure(
                request.path.decode("latin-1", "replace")[:200],
                SERVER_STREAM if streaming else UNARY,
                "e2b",
                _unknown,
            )
        call = Call(self, request, procedure, started, headers)
        request.notifyFinish().addErrback(call._gone)
        try:
            self._begin(call)
        except ApiError as e:
            self._fail(call, e)
        except Exception as e:
            refused = exhausted(e)
            if refused is not None:
                self._fail(call, refused)
                return
            log.failure("sandboxd: e2b call {name} failed", name=procedure.name)
            self._fail(call, internal("the call failed"))

    def _begin(self, call: Call) -> None:
        context = self.context
        if not context.policy.rules["e2b"].enabled:
            rule = context.policy.rules["e2b"]
            call.endpoint_id = "e2b"
            raise endpoint_disabled("e2b", rule.enabled_by, "is disabled")
        request = call.request
        procedure = call.procedure
        if procedure.run is not _unknown:
            check_content_type(procedure.kind, request.getHeader(b"content-type"))
        if call.request.too_big is not None:
            raise payload_too_large(request.too_big)
        if call.request.no_space:
            # Twisted spools a body past its in-memory size to a temporary
            # file: the temporary directory, not the target's disk, is full.
            raise insufficient_storage(
                "no space left for the request's body in the daemon's temporary "
                f"directory ({tempfile.gettempdir()}, TMPDIR), where it is held "
                "until the call runs"
            )
        if request.content is not None:
            request.content.seek(0, 2)
            call.bytes_in = request.content.tell()
            request.content.seek(0)
        if procedure.api_key:
            present_api_key(call.headers)
        self._admit_door(call)
        message: dict[str, Any] = {}
        messages: list[dict[str, Any]] = []
        if procedure.kind in (UNARY, SERVER_STREAM, CLIENT_STREAM):
            body = request.content.read() if request.content is not None else b""
            if procedure.kind == UNARY:
                if len(body) > E2B_MAX_MESSAGE_BYTES:
                    raise payload_too_large(
                        E2B_MAX_MESSAGE_BYTES, f"a Connect message of {len(body)} bytes"
                    )
                message = connect.decode_json(body)
            else:
                messages = connect.split_envelopes(body, E2B_MAX_MESSAGE_BYTES)
                message = messages[0] if messages else {}
        elif procedure.fields is not None:
            message = rest_body(request.content, procedure.fields)
        endpoint_id = (
            procedure.endpoint
            if isinstance(procedure.endpoint, str)
            else procedure.endpoint(call, message)
        )
        call.endpoint_id = endpoint_id
        endpoint = context.table.get(endpoint_id)
        try:
            if endpoint_id == "e2b" and call.door_passed is not None:
                call.passed = call.door_passed  # admitted once is enough
            else:
                call.passed = gate.admit(
                    context,
                    endpoint,
                    call.headers,
                    query_tokens=traffic_tokens(call.headers),
                )
        except gate.Refused as refused:
            call.refused_identity = refused.identity
            raise refused.error from None
        if procedure.kind == SERVER_STREAM:
            procedure.run(call, message)
            return
        arg: Any = messages if procedure.kind == CLIENT_STREAM else message
        d = maybeDeferred(procedure.run, call, arg)
        d.addCallbacks(
            lambda value: self._succeed(call, value), lambda f: self._failed(call, f)
        )

    def _admit_door(self, call: Call) -> None:
        """
        Admit the call as the door's own endpoint ``e2b`` (its scopes, rate
        and concurrency), as the MCP door admits ``mcp``, before anything
        of the call is read; the mapped endpoint is admitted after it.  A
        route that needs no token (``GET /health``) needs none here either.

        :raises ApiError: the gate's refusal, audited as ``e2b``.
        """
        procedure = call.procedure
        if isinstance(procedure.endpoint, str):
            mapped = self.context.table.get(procedure.endpoint)
            if mapped is not None and not mapped.auth_required:
                return
        try:
            call.door_passed = gate.admit(
                self.context,
                self.context.table.get("e2b"),
                call.headers,
                query_tokens=traffic_tokens(call.headers),
            )
        except gate.Refused as refused:
            call.endpoint_id = "e2b"
            call.refused_identity = refused.identity
            raise refused.error from None

    def _failed(self, call: Call, failure: Failure) -> None:
        if call.closed and failure.check(CancelledError):
            # Cancelled because the client left (Call.on_close): audited
            # as client_closed already, and nobody to answer.
            call.done()
            return
        if isinstance(failure.value, ApiError):
            self._fail(call, failure.value)
            return
        refused = exhausted(failure.value)
        if refused is not None:
            self._fail(call, refused)
            return
        log.failure(
            "sandboxd: e2b call {name} failed", failure, name=call.procedure.name
        )
        self._fail(call, internal("the call failed"))

    def _succeed(self, call: Call, value: Any) -> None:
        if call.closed:
            call.done()
            return
        request = call.request
        kind = call.procedure.kind
        if kind == REST and value is NOT_DONE_YET:
            return  # the handler answers and calls done() itself
        if kind == REST and isinstance(value, int):
            call.status = value
            request.setResponseCode(value)
            data = b""
        else:
            try:
                data = _encoded(kind, value)
            except ValueError:
                # Nothing is sent yet: the call fails in its framing instead
                # of answering ``NaN``, which no client's parser takes.
                self._fail(call, not_json(value))
                return
            content_type = {
                REST: b"application/json",
                CLIENT_STREAM: connect.STREAM_CONTENT_TYPE.encode(),
            }.get(kind, connect.UNARY_CONTENT_TYPE.encode())
            request.setHeader(b"content-type", content_type)
        call.bytes_out += len(data)
        if data:
            request.setHeader(b"content-length", str(len(data)).encode())
            request.write(data)
        request.finish()
        call.done()

    def _fail(self, call: Call, error: ApiError) -> None:
        """Answer an error in the call's framing."""
        if call.error is None:
            call.error = error
        if call.closed:
            call.done()
            return
        request = call.request
        kind = call.procedure.kind
        if kind == REST:
            status = error.status
            body = json.dumps(rest_error(error)).encode()
            content_type = b"application/json"
        elif kind in (SERVER_STREAM, CLIENT_STREAM):
            status = 200
            body = connect.end_stream(error)
            content_type = connect.STREAM_CONTENT_TYPE.encode()
        else:
            code = connect.connect_code(error)
            status = connect.HTTP_STATUS[code]
            body = json.dumps(connect.error_json(error)).encode()
            content_type = b"application/json"
        if error.status == UNSUPPORTED_MEDIA_TYPE:
            # Before any message is read, whatever the call's kind: the
            # Connect protocol answers a codec it does not take with 415.
            status = UNSUPPORTED_MEDIA_TYPE
            body = json.dumps(connect.error_json(error)).encode()
            content_type = b"application/json"
        for name, value in error.headers.items():
            request.setHeader(name.encode(), value.encode())
        request.setResponseCode(status)
        request.setHeader(b"content-type", content_type)
        request.setHeader(b"content-length", str(len(body)).encode())
        call.bytes_out += len(body)
        request.write(body)
        request.finish()
        call.done()

    def fail(self, call: Call, error: ApiError) -> None:
        """Public form of :meth:`_fail`, for handlers that answer late."""
        self._fail(call, error)


UNSUPPORTED_MEDIA_TYPE = 415

#: The Content-Type of a Connect call's body, by kind (the JSON codec only).
CONTENT_TYPES = {
    UNARY: connect.UNARY_CONTENT_TYPE,
    SERVER_STREAM: connect.STREAM_CONTENT_TYPE,
    CLIENT_STREAM: connect.STREAM_CONTENT_TYPE,
}


#: A call's answer: a non-finite number raises ValueError (it has no JSON form).
_STRICT = json.JSONEncoder(allow_nan=False)
_STRICT_COMPACT = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _encoded(kind: str, value: Any) -> bytes:
    """The body of a call's successful answer, by the procedure's kind."""
    if kind == REST:
        return _STRICT.encode(value).encode()
    if kind == CLIENT_STREAM:
        return connect.envelope(value) + connect.end_stream()
    return _STRICT_COMPACT.encode(value).encode()


def procedure_path(path: str) -> bool:
    """Whether ``path`` names a Connect procedure (``/package.Service/Method``)."""
    return path.count("/") == 2 and "." in path


def rest_error(error: ApiError) -> dict[str, Any]:
    """
    envd's REST error (its OpenAPI ``Error``): the HTTP status as ``code``,
    the message with sandboxd's code and rule.
    """
    return {"code": error.status, "message": connect.error_message(error)}


def traffic_tokens(headers: dict[bytes, list[bytes]]) -> list[bytes]:
    """
    The tokens E2B's SDKs send as ``E2B-Traffic-Access-Token`` (alone on
    ``/contexts*``): on this door it presents a token as X-Access-Token does.
    """
    return headers.get(b"e2b-traffic-access-token", [])


def present_api_key(headers: dict[bytes, list[bytes]]) -> None:
    """
    Take E2B's ``X-API-Key`` as the access token when no other credential
    is given: what the SDK sends its control plane, where sandboxd is the
    control plane too.
    """
    if b"x-access-token" not in headers and b"authorization" not in headers:
        key = headers.get(b"x-api-key")
        if key:
            headers[b"x-access-token"] = list(key)


def rest_body(content: Any, fields: tuple[Field, ...]) -> dict[str, Any]:
    """
    A JSON route's body, read as strictly as every other door reads one
    and checked against the fields it reads.

    :raises ApiError: 400 ``invalid_json`` for a body that is no JSON
        object, ``invalid_param`` for a field of another type.
    """
    raw = content.read() if content is not None else b""
    message = connect.decode_json(raw)
    declared_types(message, fields)
    return message


def check_content_type(kind: str, value: bytes | None) -> None:
    """
    Refuse a Connect call whose body is not in the codec its kind takes
    (a unary call's ``application/json``, a stream's
    ``application/connect+json``; a ``charset`` parameter only as UTF-8).

    A form, multipart or ``text/plain`` body is what a web page may send
    to a local port without asking first; it is never executed.

    :raises ApiError: 415 ``malformed_request`` naming the type wanted.
    """
    wanted = CONTENT_TYPES.get(kind)
    if wanted is None:
        return  # a REST route: its handler reads the Content-Type
    text = (value or b"").decode("latin-1")
    media, _, parameters = text.partition(";")
    ok = media.strip().lower() == wanted
    for parameter in parameters.split(";") if parameters.strip() else ():
        name, _, given = parameter.partition("=")
        if name.strip().lower() != "charset":
            ok = False
        elif given.strip().strip('"').lower() not in ("utf-8", "utf8"):
            ok = False
    if not ok:
        error = malformed_request(
            f"this call takes Content-Type {wanted}, not {text[:100]!r}",
            UNSUPPORTED_MEDIA_TYPE,
        )
        error.headers["Accept-Post"] = wanted
        raise error


def _templated(key: str) -> str:
    """``POST /contexts/ID/restart`` as its route, ``POST /contexts/{id}/restart``."""
    method, _, path = key.partition(" ")
    parts = path.split("/")
    if len(parts) >= 3 and parts[1] == "contexts" and parts[2]:
        parts[2] = "{id}"
    return f"{method} {'/'.join(parts)}"


def _unknown(call: Call, message: dict[str, Any], *rest: Any) -> Any:
    raise unsupported(f"no such procedure: {call.procedure.name}")


__all__ = [
    "CLIENT_STREAM",
    "REST",
    "SERVER_STREAM",
    "UNARY",
    "Call",
    "Door",
    "E2BSite",
    "Procedure",
    "Stream",
    "basic_user",
    "raw_headers",
]
