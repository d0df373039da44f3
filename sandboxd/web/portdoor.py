# -*- test-case-name: tests.e2b.test_door,tests.kep.test_rest -*-
"""
A front door on a port of its own, over HTTP/1.1 (SPEC §16): the E2B port
and the KEP REST port share it.

A :class:`Call` is one request through such a door: it is admitted by
:func:`sandboxd.access.gate.admit` first as the door's own endpoint (so a
policy can switch the door off), then as the sandboxd endpoint doing the
job (the procedure's ``endpoint`` decides which, sometimes from the
message or the request), runs, and writes exactly one audit line (``via``
the door) when it is over, whatever the outcome.  Handlers raise
:class:`~sandboxd.errors.ApiError`; the door's subclass of
:class:`PortDoor` alone turns them into its clients' framing.

What differs between doors (how a request finds its procedure, the body
caps, the error framing, how a message is read, how the gate is asked) is
a handful of methods of :class:`PortDoor`; the rest (body caps as bytes
arrive, a full spool's 507, admission in two steps, the slot and the audit
line, a client that leaves) is written once here.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
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
from sandboxd.access import held as held_connections
from sandboxd.access.tracing import trace_headers
from sandboxd.api.fields import Field
from sandboxd.errors import (
    ApiError,
    endpoint_disabled,
    exhausted,
    insufficient_storage,
    internal,
    not_json,
    payload_too_large,
)
from sandboxd.policy.defaults import DRAIN_LIMIT_BYTES
from sandboxd.web.connections import ConnectionLimits
from sandboxd.web.factory import HardenedSite
from sandboxd.web.messages import ServerRequest, ServerResponse, StreamResponse

if TYPE_CHECKING:
    from sandboxd.access.auth import Identity
    from sandboxd.policy.rules import EffectiveRule

log = Logger(namespace="sandboxd.web.portdoor")


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
    endpoint: str | Callable[[Any, dict[str, Any]], str]
    run: Callable[..., Any]
    api_key: bool = False
    fields: tuple[Field, ...] | None = None
    #: A client stream served as its messages arrive: ``run(call, first)``
    #: returns what takes the rest (:class:`sandboxd.e2b.door.Feeder`).
    live: bool = False


# -- the request ----------------------------------------------------------------


@attrs.define(eq=False)
class LiveBody:
    """
    The body of a request served from its head, as it arrives (a client
    stream whose messages are applied one by one, as envd applies them):
    its chunks go to ``feed``, and ``end`` is called once it is whole;
    neither is kept in a spool, nor held to the body cap (the door bounds
    each message).

    :ivar complete: the whole body has arrived.
    """

    feed: Callable[[bytes], None] | None = None
    end: Callable[[], None] | None = None
    complete: bool = False


class DoorRequest(Request):
    """
    A request of a port door: its body is capped as it arrives (Synapse's
    way), so an oversized upload or message is refused without being kept.
    """

    too_big: int | None = None
    #: Refused at its head (a body announced over the cap): answered then,
    #: the rest of the request read and dropped, no handler run.
    answered_early = False
    #: The body's spool (a temporary file past Twisted's in-memory size)
    #: ran out of disk: the rest is dropped, and the call answers 507.
    no_space = False
    #: Whether the response waits for its client on purpose for now (its
    #: source paused until the client reads, within a bound of its own):
    #: then the connection is not cut as stalled (:mod:`sandboxd.web.channel`).
    patient: Callable[[], bool] | None = None
    #: A body served as it arrives (see :class:`LiveBody`), or None.
    live: LiveBody | None = None
    #: A streamed body held to the idle bound on each read, not to the
    #: body's minimum rate (:meth:`PortDoor.paced_by_its_source`).
    paced_by_its_source = False
    _received = 0
    _cap = 0

    def gotLength(self, length: int | None) -> None:
        """
        The body's announced length: refused at once when over the cap; a
        live body's request is served now, from its head.
        """
        channel: Any = self.channel
        site: DoorSite = channel.site
        path = getattr(channel, "_path", b"") or b""
        self._cap = site.body_cap(path)
        super().gotLength(length)
        door = site.port_door
        if length != 0 and door.live(path.split(b"?", 1)[0]):
            self.live = LiveBody()
            self.method, self.uri = channel._command, path
            self.path = path.split(b"?", 1)[0]
            self.clientproto = channel._version
            super().process()
            if self.answered_early:
                # Refused already (its codec, the door's admission): no
                # 100 Continue behind the answer.
                self.requestHeaders.removeHeader(b"expect")
            return
        if length is not None and length > self._cap:
            self.too_big = self._cap
            self.answered_early = True
            door.refuse_early(self, payload_too_large(self._cap))
            return
        head = getattr(self.channel, "head", None)
        expects = bool(getattr(head, "expect_continue", False))
        if length is not None and length <= DRAIN_LIMIT_BYTES and not expects:
            # Small enough to read: refused in full once it is in, as the
            # HTTP door drains such a body.  (A client waiting for ``100
            # Continue`` has sent none of it yet: it is told at once.)
            return
        command = getattr(self.channel, "_command", b"") or b""
        error = door.check_head(command, path.split(b"?", 1)[0], raw_headers(self))
        if error is not None:
            self.answered_early = True
            door.refuse_early(self, error)
        elif length is None:
            self.paced_by_its_source = door.paced_by_its_source(
                command, path.split(b"?", 1)[0]
            )

    def process(self) -> None:
        """
        Run the door, unless the request was answered at its head or is
        served as its body comes.
        """
        if not self.answered_early and self.live is None:
            super().process()

    def handleContentChunk(self, data: bytes) -> None:
        """
        One chunk of the body; past the cap, or once the disk has no room
        for it, the rest is dropped, not kept.
        """
        if self.live is not None:
            if self.live.feed is not None:
                self.live.feed(data)
            return
        if self.too_big is not None or self.no_space or self.answered_early:
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
        live = self.live
        if live is not None:
            live.complete = True
            if live.end is not None:
                live.end()

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


class DoorSite(HardenedSite):
    """
    A port door's site: one resource that serves every path, over the HTTP
    door's hardened connection (connection caps and the request-head
    deadline in a table of its own, no obs-fold), HTTP/1.1 only.
    """

    requestFactory = DoorRequest

    def __init__(self, door: PortDoor, limits: ConnectionLimits | None = None) -> None:
        super().__init__(_Root(door), door.context, door.context.reactor, limits)
        self.port_door = door
        # The name metrics count refused connections under, and the log's.
        self.door = door.name

    def body_cap(self, path: bytes) -> int:
        """How many body bytes a request to ``path`` may send."""
        return self.port_door.body_cap(path.split(b"?", 1)[0])

    def refusal(
        self, error: ApiError, path: str, accept: bytes | None
    ) -> tuple[bytes, bytes, dict[str, str]]:
        """A request the HTTP front refused, in the door's framing."""
        return self.port_door.refusal(error, path, accept)


class _Root(Resource):
    isLeaf = True

    def __init__(self, door: PortDoor) -> None:
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


def governed_request(
    context: Any,
    passed: gate.Passed,
    client: str,
    audit: dict[str, Any],
    *,
    body: dict[str, Any] | None = None,
    query: dict[str, str] | None = None,
    path_params: dict[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> ServerRequest:
    """
    A door's call as the handler of the endpoint it was admitted as sees a
    request, so that handler's rules (paths, limits, users, caps) apply as
    they are, not as a copy; what the handler notes lands in ``audit``.

    :param headers: what the handler may read of the call's headers (its
        trace context, :func:`~sandboxd.access.tracing.trace_headers`).
    """
    endpoint = passed.endpoint
    return ServerRequest(
        method=endpoint.method,
        path=endpoint.path,
        query=query or {},
        headers=headers or {},
        body=body or {},
        path_params=path_params or {},
        identity=passed.identity,
        endpoint=endpoint,
        rule=passed.rule,
        context=context,
        raw=None,
        client=client,
        audit=audit,
    )


#: The request headers a file read honours (a range, a cached version).
CONDITIONAL_HEADERS = (b"range", b"if-none-match", b"if-range")


def conditional_headers(call: Call) -> dict[str, str]:
    """The call's :data:`CONDITIONAL_HEADERS`, as a handler reads headers."""
    return {
        name.decode("latin-1"): values[-1].decode("latin-1")
        for name, values in call.headers.items()
        if name in CONDITIONAL_HEADERS
    }


def send_response(
    call: Call,
    response: ServerResponse | StreamResponse,
    extra_headers: dict[bytes, bytes] | None = None,
) -> object:
    """
    Write a handler's response (a file's bytes, or a 304's head) as the
    call's answer, and finish the call once it is sent; a stream that fails
    after its length was announced cuts the connection, so the client sees
    it was cut.

    :returns: ``NOT_DONE_YET``, for the procedure to return.
    """
    raw = call.request
    raw.setResponseCode(response.status)
    call.status = response.status
    for name, value in response.headers.items():
        raw.setHeader(name.encode(), value.encode())
    if not isinstance(response, StreamResponse):
        raw.finish()
        call.done()
        return NOT_DONE_YET
    for header, header_value in (extra_headers or {}).items():
        raw.setHeader(header, header_value)

    def sent(count: int) -> None:
        call.bytes_out = count
        transport = raw.channel.transport if raw.channel is not None else None
        if getattr(transport, "disconnected", False):
            # The client left mid-body: the transport stopped the producer
            # on its way to connectionLost, which has not reached the
            # request yet.  Finishing now would find the producer still
            # registered (Twisted logs that as critical); as the HTTP
            # door, the call is audited as the client's leaving.
            call._gone()
            return
        if not call.closed:
            raw.finish()
        call.done()

    def failed(failure: Failure) -> None:
        if not call.closed:
            raw.channel.transport.abortConnection()
        if failure.check(BrokenPipeError, ConnectionResetError):
            # sendfile() met the client's close before the transport did.
            call._gone()
            return
        call.done()

    response.write_to(raw).addCallbacks(sent, failed)
    return NOT_DONE_YET


def raw_headers(request: Any) -> dict[bytes, list[bytes]]:
    """Lower-cased header names to their raw values, as the gate reads them."""
    out: dict[bytes, list[bytes]] = {}
    for name, values in request.requestHeaders.getAllRawHeaders():
        out.setdefault(name.lower(), []).extend(values)
    return out


@attrs.define(eq=False)
class Call:
    """
    One request through a port door, from admission to its audit line.

    :ivar passed: what the gate let through (None until admitted).
    """

    door: PortDoor
    request: Any
    procedure: Procedure
    started: float
    headers: dict[bytes, list[bytes]]
    passed: gate.Passed | None = None
    #: What the gate let through as the door's own endpoint (``e2b``, ``kep``).
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
    #: While the call streams: its entry among the connections a policy
    #: reload asks again (:meth:`hold`).
    _held: held_connections.Held | None = None

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
        return governed_request(
            self.context,
            self.passed,
            self.client,
            self.audit_fields,
            body=body,
            query=query,
            path_params=path_params,
            headers=trace_headers(self.headers),
        )

    @property
    def client(self) -> str:
        """The peer's address."""
        peer = self.request.getClientAddress()
        return str(getattr(peer, "host", "") or "")

    def hold(self, end: Callable[[ApiError], None]) -> bool:
        """
        Note that the call has become a stream that lasts as long as its
        client keeps it (a process's output, a watch, live input), so that
        a policy reload asks it again and ends it (``end``, told why) when the
        identity, its scopes or the endpoint are gone; until the call is
        done.  A reload that came between the call's admission and now is
        asked at once: False, and ``end`` called, when it refuses.
        """
        assert self.passed is not None
        passed = self.passed
        _, error = gate.still_allowed(self.context, passed.identity, passed.endpoint)
        if error is not None:
            end(error)
            return False
        self._held = held_connections.hold(
            self.context, passed.identity, passed.endpoint, end, stream=True
        )
        return True

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
        run_each(callbacks, f"sandboxd: {self.door.name} close callback failed")
        self.done()

    def done(self) -> None:
        """The call is over: release the slot, write the audit line (once)."""
        if self.finished:
            return
        self.finished = True
        context = self.context
        held_connections.release(context, self._held)
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
            else context.policy.rules.get(self.endpoint_id or self.door.endpoint_id)
        )
        uri = self.request.uri.decode("latin-1")
        path, _, query = uri.partition("?")
        gate.audit(
            context,
            door=self.door.via,
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
            headers=self.headers,
        )


# -- the door -------------------------------------------------------------------


class PortDoor:
    """
    Dispatches a port door's requests to procedures, through the gate.

    A door's subclass names itself (:attr:`name`, :attr:`via`,
    :attr:`endpoint_id`) and gives what differs: :meth:`find`,
    :meth:`unknown`, :meth:`body_cap`, :meth:`refusal`,
    :meth:`error_response`, and where it needs them :meth:`prepare`,
    :meth:`read_message`, :meth:`admit` and :meth:`encode`.

    :param procedures: the door's key (``"METHOD /path"``, an RPC name) to
        its :class:`Procedure`.
    """

    #: How log lines and the connection metrics name the door.
    name = ""
    #: The audit's ``via``.
    via: gate.Door
    #: The door's own endpoint id: switched off, nothing passes.
    endpoint_id = ""
    #: The class of this door's calls.
    call_class: type[Call] = Call

    def __init__(
        self,
        context: Any,
        procedures: dict[str, Procedure],
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.context = context
        self.procedures = procedures
        self.limits = limits
        self._site: DoorSite | None = None

    # -- what a door gives ---------------------------------------------------

    def body_cap(self, path: bytes) -> int:
        """How many body bytes a request to ``path`` may send."""
        raise NotImplementedError

    def find(self, request: Any) -> Procedure | None:
        """The procedure a request asks for, or None."""
        raise NotImplementedError

    def unknown(self, request: Any) -> Procedure:
        """What serves a request no procedure serves (it refuses it)."""
        raise NotImplementedError

    def refusal(
        self, error: ApiError, path: str, accept: bytes | None
    ) -> tuple[bytes, bytes, dict[str, str]]:
        """A request the HTTP front refused: Content-Type, body, headers."""
        raise NotImplementedError

    def error_response(
        self, call: Call, error: ApiError
    ) -> tuple[int, bytes, bytes, dict[str, str]]:
        """
        An error in the call's framing: status, Content-Type, body and
        headers besides ``error.headers``.
        """
        raise NotImplementedError

    def check_head(
        self, method: bytes, path: bytes, headers: dict[bytes, list[bytes]]
    ) -> ApiError | None:
        """
        The refusal a request would get from its head alone (a credential
        the gate refuses), asked before a body bigger than the HTTP door
        drains is read: such a request is answered at once and its body
        dropped.  None: read it (the default).
        """
        return None

    def prepare(self, call: Call) -> None:
        """Checks of the request before anything is admitted or read."""

    def live(self, path: bytes) -> bool:
        """
        Whether a request to ``path`` is served from its head, its body
        handed over as it arrives (:class:`LiveBody`); none by default.
        """
        return False

    def paced_by_its_source(self, method: bytes, path: bytes) -> bool:
        """
        Whether a streamed body (chunked, admitted at its head) sent to
        ``path`` comes as fast as its client's own source gives it (a log
        being tailed, a slow network source), so that it is held to the
        idle bound on each read rather than to ``--body-min-rate``'s
        average, as the door's reference daemon holds it; none by default.
        """
        return False

    def begin_live(self, call: Call) -> None:
        """
        Serve a live call (admitted as the door's endpoint): set its
        request's :class:`LiveBody` to take the body, then
        :meth:`admit_endpoint` with its first message.
        """
        raise NotImplementedError

    def read_message(self, call: Call) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The call's first message and all of them (after the door's admission)."""
        return {}, []

    def admit(self, call: Call, endpoint: Any, spend: bool = True) -> gate.Passed:
        """
        Ask the gate to let ``call`` through as ``endpoint``.

        :param spend: spend a use of a counted link (the second of the
            call's two admissions only: one request, one use).
        :raises gate.Refused: the gate's refusal.
        """
        return gate.admit(self.context, endpoint, call.headers, spend=spend)

    def encode(self, call: Call, value: Any) -> tuple[bytes, bytes]:
        """
        A successful answer's Content-Type and body.

        :raises ValueError: for a value with no JSON form.
        """
        return b"application/json", _STRICT.encode(value).encode()

    # -- the machinery -------------------------------------------------------

    def site(self) -> DoorSite:
        """The twisted.web site serving this door (one per door)."""
        if self._site is None:
            self._site = DoorSite(self, self.limits)
        return self._site

    def refuse_early(self, request: Any, error: ApiError) -> None:
        """
        Answer ``error`` at the request's head, in this door's framing, and
        close once the client can read it (what it still sends is read and
        dropped), with the one audit line a late refusal would write: a
        client that announces a body over the cap is told at once, not
        after it sent the body.
        """
        channel = request.channel
        raw = (getattr(channel, "_path", b"") or b"").decode("latin-1")
        path, _, query = raw.partition("?")
        # Answered: no ``100 Continue`` may follow (a 1xx after the final
        # answer breaks a client that honours Expect).
        request.requestHeaders.removeHeader(b"expect")
        channel._refuse(error, path, request.getHeader(b"accept"))
        peer = request.getClientAddress()
        gate.audit(
            self.context,
            door=self.via,
            endpoint=None,
            identity=None,
            rule=self.context.policy.rules.get(self.endpoint_id),
            method=(channel._command or b"").decode("latin-1"),
            path=path,
            query=query,
            status=error.status,
            code=str(error.code) if error.code else None,
            decided_by=error.rule,
            started=time.monotonic(),
            client=str(getattr(peer, "host", "") or ""),
            headers=raw_headers(request),
        )

    def serve(self, request: Any) -> None:
        """Answer one request (the response is always finished)."""
        started = time.monotonic()
        procedure = self.find(request) or self.unknown(request)
        headers = raw_headers(request)
        call = self.call_class(self, request, procedure, started, headers)
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
            log.failure(
                "sandboxd: {door} call {name} failed",
                door=self.name,
                name=procedure.name,
            )
            self._fail(call, internal("the call failed"))

    def _begin(self, call: Call) -> None:
        context = self.context
        rule = context.policy.rules[self.endpoint_id]
        if not rule.enabled:
            call.endpoint_id = self.endpoint_id
            raise endpoint_disabled(self.endpoint_id, rule.enabled_by, "is disabled")
        request = call.request
        procedure = call.procedure
        self.prepare(call)
        if request.too_big is not None:
            raise payload_too_large(request.too_big)
        if request.no_space:
            # Twisted spools a body past its in-memory size to a temporary
            # file: the temporary directory, not the target's disk, is full.
            raise insufficient_storage(
                "no space left for the request's body in the daemon's temporary "
                f"directory ({tempfile.gettempdir()}, TMPDIR), where it is held "
                "until the call runs"
            )
        if request.live is not None:
            self._admit_door(call)
            self.begin_live(call)
            return
        if request.content is not None:
            request.content.seek(0, 2)
            call.bytes_in = request.content.tell()
            request.content.seek(0)
        self._admit_door(call)
        message, messages = self.read_message(call)
        self.admit_endpoint(call, message)
        if procedure.kind == SERVER_STREAM:
            procedure.run(call, message)
            return
        arg: Any = messages if procedure.kind == CLIENT_STREAM else message
        d = maybeDeferred(procedure.run, call, arg)
        d.addCallbacks(
            lambda value: self._succeed(call, value), lambda f: self._failed(call, f)
        )

    def admit_endpoint(self, call: Call, message: dict[str, Any]) -> None:
        """
        Admit the call as the endpoint doing its job (which may depend on
        its first ``message``), after the door's own admission.

        :raises ApiError: the gate's refusal.
        """
        context = self.context
        procedure = call.procedure
        endpoint_id = (
            procedure.endpoint
            if isinstance(procedure.endpoint, str)
            else procedure.endpoint(call, message)
        )
        call.endpoint_id = endpoint_id
        endpoint = context.table.get(endpoint_id)
        try:
            if endpoint_id == self.endpoint_id and call.door_passed is not None:
                call.passed = call.door_passed  # admitted once is enough
                gate.spend_use(context, call.passed)
            else:
                call.passed = self.admit(call, endpoint)
        except gate.Refused as refused:
            call.refused_identity = refused.identity
            raise refused.error from None

    def _admit_door(self, call: Call) -> None:
        """
        Admit the call as the door's own endpoint (its scopes, rate and
        concurrency), as the MCP door admits ``mcp``, before anything of
        the call is read; the mapped endpoint is admitted after it.  A
        route that needs no token (``GET /health``) needs none here either.

        :raises ApiError: the gate's refusal, audited as the door's endpoint.
        """
        procedure = call.procedure
        if isinstance(procedure.endpoint, str):
            mapped = self.context.table.get(procedure.endpoint)
            if mapped is not None and not mapped.auth_required:
                return
        try:
            # A link's use is spent by the second admission, once the call
            # is let in as what it does: a call refused there costs none.
            call.door_passed = self.admit(
                call, self.context.table.get(self.endpoint_id), spend=False
            )
        except gate.Refused as refused:
            call.endpoint_id = self.endpoint_id
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
            "sandboxd: {door} call {name} failed",
            failure,
            door=self.name,
            name=call.procedure.name,
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
                content_type, data = self.encode(call, value)
            except ValueError:
                # Nothing is sent yet: the call fails in its framing instead
                # of answering ``NaN``, which no client's parser takes.
                self._fail(call, not_json(value))
                return
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
        live = request.live
        if live is not None and not live.complete:
            # Its body still comes: answered as a refusal at the head is
            # (the rest read and dropped, then the connection closed), as
            # the response cannot end before the request does.
            live.feed = live.end = None
            request.answered_early = True
            path = request.path.decode("latin-1")
            request.channel._refuse(error, path, request.getHeader(b"accept"))
            call.done()
            return
        status, content_type, body, headers = self.error_response(call, error)
        for name, value in {**error.headers, **headers}.items():
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


#: A call's answer: a non-finite number raises ValueError (it has no JSON form).
_STRICT = json.JSONEncoder(allow_nan=False)


@implementer(IPushProducer)
class Pauser:
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


__all__ = [
    "CLIENT_STREAM",
    "REST",
    "SERVER_STREAM",
    "UNARY",
    "Call",
    "DoorRequest",
    "DoorSite",
    "LiveBody",
    "Pauser",
    "PortDoor",
    "Procedure",
    "conditional_headers",
    "governed_request",
    "raw_headers",
    "run_each",
    "send_response",
]
