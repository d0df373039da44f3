# -*- test-case-name: tests.test_otlp -*-
"""
Spans to an OpenTelemetry collector over OTLP/HTTP (protobuf or JSON).

Imported only when the environment names a collector.  The request is the
one the OpenTelemetry specification describes for every SDK: a ``POST`` of
an ``ExportTraceServiceRequest`` to the traces URL, the configured headers
(a vendor's API key), gzip when asked for; retried, with backing off, when
the collector says it is busy (429, 502, 503, 504, honouring
``Retry-After``) or cannot be reached, until the export's deadline.

Each span is encoded as its call ends (a few microseconds, by hand: no
``protobuf`` in the daemon), so a batch is only joined when it goes; gzip,
when asked for, runs on a pool thread.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet import protocol
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.error import ConnectingCancelledError
from twisted.internet.error import TimeoutError as DeferredTimeout
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.web.client import (
    Agent,
    BrowserLikePolicyForHTTPS,
    FileBodyProducer,
    HTTPConnectionPool,
    _HTTP11ClientFactory,
)
from twisted.web.http_headers import Headers
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from sandboxd.access.tracing import (
    SERVER,
    STATUS_ERROR,
    AttributeValue,
    Span,
    TraceSettings,
)
from sandboxd.policy.defaults import (
    CAP_WARNING_INTERVAL_SECONDS,
    TRACE_KEYS_KEPT,
    TRACE_RESPONSE_BYTES,
    TRACE_RETRY_AFTER_MAX_SECONDS,
    TRACE_RETRY_FIRST_SECONDS,
)
from sandboxd.proto3 import Kind, decode, field, message, varint

log = Logger()

#: The statuses after which an export is tried again (OTLP/HTTP's list).
RETRYABLE = frozenset({429, 502, 503, 504})

# -- the messages (opentelemetry/proto/{common,resource,trace}/v1) -------------
#
# Written by hand rather than through sandboxd.proto3's schemas: a span is
# encoded on the reactor as its call ends, and the generic encoder's walk
# over a schema with its type checks cost ten times more.  Each piece is
# the field's tag byte(s), then its value; tests parse the result with
# OpenTelemetry's own generated classes.

#: The collector's answer, read with the generic decoder.
_PARTIAL = message(
    "ExportTracePartialSuccess",
    field(1, "rejected_spans", Kind.INT64),
    field(2, "error_message", Kind.STRING),
)
RESPONSE = message(
    "ExportTraceServiceResponse",
    field(1, "partial_success", Kind.MESSAGE, message=_PARTIAL),
)

#: The W3C flag bits OTLP keeps on a span: its parent is remote (bits 8
#: and 9: "has is-remote", "is remote") and sampled (bit 0).
_FLAGS_REMOTE_PARENT = 0x300
_FLAGS_LOCAL_ROOT = 0x100
_SAMPLED = 0x01


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    return tag + varint(len(payload)) + payload


@functools.lru_cache(maxsize=TRACE_KEYS_KEPT)
def _key(name: str) -> bytes:
    """``KeyValue.key`` (field 1) of an attribute name, made once per name."""
    return _field(b"\x0a", name.encode("utf-8", "replace"))


def _any(value: AttributeValue) -> bytes:
    """An ``AnyValue``: text (1), a flag (2), a number (3), a list of text (5)."""
    if value is True:
        return b"\x10\x01"
    if value is False:
        return b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + varint(value)
    if isinstance(value, tuple):
        items = b"".join(_field(b"\x0a", _any(v)) for v in value)
        return _field(b"\x2a", items)
    return _field(b"\x0a", value.encode("utf-8", "replace"))


def _key_values(tag: bytes, pairs: Sequence[tuple[str, AttributeValue]]) -> bytes:
    """Repeated ``KeyValue`` under ``tag``."""
    return b"".join(_field(tag, _key(k) + _field(b"\x12", _any(v))) for k, v in pairs)


def _flags(span: Span) -> int:
    return _SAMPLED | (
        _FLAGS_REMOTE_PARENT if span.parent_span_id else _FLAGS_LOCAL_ROOT
    )


def protobuf_span(span: Span) -> bytes:
    """One ``Span`` message (without the field that holds it)."""
    parts = [b"\x0a\x10", span.trace_id, b"\x12\x08", span.span_id]
    if span.trace_state:
        parts.append(_field(b"\x1a", span.trace_state.encode("latin-1")))
    if span.parent_span_id is not None:
        parts += (b"\x22\x08", span.parent_span_id)
    parts.append(_field(b"\x2a", span.name.encode("utf-8", "replace")))
    # kind (6) SERVER; start (7) and end (8) as fixed64.
    parts.append(b"\x30" + varint(SERVER))
    parts.append(struct.pack("<BQBQ", 0x39, span.start_ns, 0x41, span.end_ns))
    parts.append(_key_values(b"\x4a", span.attributes))
    if span.error is not None:
        status = _field(b"\x12", span.error.encode("utf-8", "replace"))
        parts.append(_field(b"\x7a", status + b"\x18" + varint(STATUS_ERROR)))
    # flags (16) as fixed32: tag 0x85 0x01.
    parts.append(b"\x85\x01" + struct.pack("<I", _flags(span)))
    return b"".join(parts)


def _scope() -> tuple[str, str]:
    from sandboxd._version import __version__

    return "sandboxd", __version__


def protobuf_request(
    spans: Sequence[bytes], resource: Sequence[tuple[str, AttributeValue]]
) -> bytes:
    """An ``ExportTraceServiceRequest`` of encoded spans, from one resource and scope."""
    name, version = _scope()
    scope = _field(b"\x0a", name.encode()) + _field(b"\x12", version.encode())
    scope_spans = _field(b"\x0a", scope) + b"".join(_field(b"\x12", s) for s in spans)
    resource_spans = _field(b"\x0a", _key_values(b"\x0a", resource)) + _field(
        b"\x12", scope_spans
    )
    return _field(b"\x0a", resource_spans)


def _json_value(value: AttributeValue) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        # ProtoJSON writes 64-bit integers as strings.
        return {"intValue": str(value)}
    if isinstance(value, tuple):
        return {"arrayValue": {"values": [_json_value(v) for v in value]}}
    return {"stringValue": value}


def json_span(span: Span) -> bytes:
    """One span as OTLP/JSON (its ids in hex, not base64, as OTLP/JSON says)."""
    out: dict[str, Any] = {
        "traceId": span.trace_id.hex(),
        "spanId": span.span_id.hex(),
        "name": span.name,
        "kind": SERVER,
        "startTimeUnixNano": str(span.start_ns),
        "endTimeUnixNano": str(span.end_ns),
        "attributes": [{"key": k, "value": _json_value(v)} for k, v in span.attributes],
        "flags": _flags(span),
    }
    if span.trace_state:
        out["traceState"] = span.trace_state
    if span.parent_span_id is not None:
        out["parentSpanId"] = span.parent_span_id.hex()
    if span.error is not None:
        out["status"] = {"code": STATUS_ERROR, "message": span.error}
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode()


def json_request(
    spans: Sequence[bytes], resource: Sequence[tuple[str, AttributeValue]]
) -> bytes:
    """The request as OTLP/JSON, around spans :func:`json_span` wrote."""
    name, version = _scope()
    attributes = [{"key": k, "value": _json_value(v)} for k, v in resource]
    head = (
        '{"resourceSpans":[{"resource":'
        + json.dumps({"attributes": attributes}, ensure_ascii=False)
        + ',"scopeSpans":[{"scope":'
        + json.dumps({"name": name, "version": version})
        + ',"spans":['
    )
    return head.encode() + b",".join(spans) + b"]}]}]}"


def encode_protobuf(
    spans: Sequence[Span], resource: Sequence[tuple[str, AttributeValue]]
) -> bytes:
    """``spans`` as one OTLP protobuf request."""
    return protobuf_request([protobuf_span(s) for s in spans], resource)


def encode_json(
    spans: Sequence[Span], resource: Sequence[tuple[str, AttributeValue]]
) -> bytes:
    """``spans`` as one OTLP/JSON request."""
    return json_request([json_span(s) for s in spans], resource)


def rejected(body: bytes, json_answer: bool) -> tuple[int, str]:
    """
    What a collector's successful answer says it rejected: (spans, why).
    An answer that is not the message (empty, or some proxy's page) is no
    rejection.
    """
    try:
        if json_answer:
            partial = json.loads(body or b"{}").get("partialSuccess") or {}
            return int(partial.get("rejectedSpans", 0)), str(
                partial.get("errorMessage", "")
            )
        partial = decode(RESPONSE, body).get("partial_success") or {}
        return int(partial.get("rejected_spans", 0)), str(
            partial.get("error_message", "")
        )
    except (ValueError, AttributeError, TypeError):
        return 0, ""


# -- sending ---------------------------------------------------------------------


class _Capped(protocol.Protocol):
    """
    Reads an answer's body up to a cap (the rest is not waited for);
    cancelled (the request's timeout), it cuts the connection.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.parts: list[bytes] = []
        self.size = 0
        self.done: Deferred[bytes] = Deferred(self._cut)

    def _cut(self, _: Deferred[bytes]) -> None:
        transport: Any = self.transport
        if transport is not None:
            transport.stopProducing()

    def dataReceived(self, data: bytes) -> None:
        if self.size >= self.cap:
            return
        self.parts.append(data[: self.cap - self.size])
        self.size += len(self.parts[-1])
        transport: Any = self.transport
        if self.size >= self.cap and transport is not None:
            transport.stopProducing()

    def connectionLost(self, reason: Any = None) -> None:
        if not self.done.called:
            self.done.callback(b"".join(self.parts))


class _QuietFactory(_HTTP11ClientFactory):
    """The pool's connection factory, without a log line at each start and stop."""

    noisy = False


class _Pool(HTTPConnectionPool):
    """
    The exporter's one connection: against a collector that closes each
    connection, Twisted's two lines per connection were most of the log.
    """

    _factory = _QuietFactory

    def __init__(self, reactor: Any) -> None:
        super().__init__(reactor, persistent=True)  # type: ignore[no-untyped-call]


#: One PEM certificate of a bundle.
_PEM_CERTIFICATE = re.compile(
    rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.DOTALL
)


@implementer(IPolicyForHTTPS)
class _Trust:
    """TLS to the collector with the configured trust roots and client certificate."""

    def __init__(self, settings: TraceSettings) -> None:
        from twisted.internet.ssl import (
            Certificate,
            PrivateCertificate,
            trustRootFromCertificates,
        )

        self.roots = None
        self.client = None
        try:
            if settings.certificate:
                with open(settings.certificate, "rb") as f:
                    bundle = f.read()
                # A bundle holds several CAs (a cluster's, a company's, the
                # system's): every one is trusted, not only the first.
                blocks = _PEM_CERTIFICATE.findall(bundle)
                if not blocks:
                    raise ValueError(f"no certificate in {settings.certificate}")
                self.roots = trustRootFromCertificates(
                    [Certificate.loadPEM(block) for block in blocks]
                )
            if settings.client_certificate and settings.client_key:
                with open(settings.client_certificate, "rb") as f:
                    pem = f.read()
                with open(settings.client_key, "rb") as f:
                    pem += b"\n" + f.read()
                self.client = PrivateCertificate.loadPEM(pem)
        except (OSError, ValueError) as e:
            raise ValueError(
                f"the OTLP certificate files cannot be read: {e}"
            ) from None
        except Exception as e:  # pyOpenSSL's errors: not PEM, no key
            raise ValueError(f"the OTLP certificate files are not PEM: {e}") from None

    def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
        from twisted.internet.ssl import optionsForClientTLS

        kwargs: dict[str, Any] = {}
        if self.roots is not None:
            kwargs["trustRoot"] = self.roots
        if self.client is not None:
            kwargs["clientCertificate"] = self.client
        return optionsForClientTLS(hostname.decode("ascii"), **kwargs)


def certificate_problem(settings: TraceSettings) -> str | None:
    """
    Why the CA bundle or client certificate the settings name cannot be
    used, as the start says it (no spans are then sent); None when they
    can or none is named.  ``check-config`` asks, so a build catches it.
    """
    if settings.endpoint is None or not (
        settings.certificate or settings.client_certificate
    ):
        return None
    try:
        _Trust(settings)
    except ValueError as e:
        return f"{e}; no spans are sent"
    return None


class Exporter:
    """
    Sends batches of spans to one collector, one request at a time.

    :param run: how a batch is encoded off the reactor (the thread pool;
        a test passes one that runs it at once).
    """

    def __init__(
        self,
        settings: TraceSettings,
        reactor: Any,
        run: Callable[..., Deferred[Any]] | None = None,
        agent: Any = None,
    ) -> None:
        from sandboxd._version import __version__
        from sandboxd.threads import in_pool

        assert settings.endpoint is not None
        self.settings = settings
        self.reactor = reactor
        self.url = settings.endpoint.encode("ascii")
        self._run = run or (lambda f, *a: in_pool(reactor, f, *a))
        if agent is None:
            pool = _Pool(reactor)
            pool.maxPersistentPerHost = 1
            policy = (
                _Trust(settings)
                if settings.certificate or settings.client_certificate
                else BrowserLikePolicyForHTTPS()
            )
            agent = Agent(reactor, contextFactory=policy, pool=pool)
            self.pool: Any = pool
        else:
            self.pool = None
        self.agent = agent
        self.json = settings.protocol == "http/json"
        headers = Headers()
        for name, value in settings.headers:
            headers.addRawHeader(name.encode("latin-1"), value.encode("latin-1"))
        headers.setRawHeaders(
            b"content-type",
            [b"application/json" if self.json else b"application/x-protobuf"],
        )
        headers.setRawHeaders(b"user-agent", [f"sandboxd/{__version__}".encode()])
        if settings.gzip:
            headers.setRawHeaders(b"content-encoding", [b"gzip"])
        self.headers = headers
        self._last_warning: float | None = None
        self._unreported = 0

    def encode(self, span: Span) -> bytes:
        """One span in the protocol's encoding (on the reactor, as its call ends)."""
        return json_span(span) if self.json else protobuf_span(span)

    def export(self, spans: Sequence[bytes], within: float) -> Deferred[bool]:
        """
        Send spans :meth:`encode` wrote, trying again while the collector
        asks to and ``within`` seconds last; True once the collector has
        taken them.  Never fails: a batch that could not be sent is False,
        and said so in the log (at most once every 30 seconds).
        """
        deadline = self.reactor.seconds() + within
        resource = self.settings.resource
        body = (
            json_request(spans, resource)
            if self.json
            else protobuf_request(spans, resource)
        )
        # zlib lets go of the interpreter's lock while it compresses: on a
        # pool thread, that work runs beside the reactor.
        d: Deferred[Any] = (
            self._run(gzip.compress, body, 5) if self.settings.gzip else succeed(body)
        )
        ended = _Ended()
        d.addCallback(
            self._post, len(spans), deadline, TRACE_RETRY_FIRST_SECONDS, ended
        )
        d.addErrback(self._unsent, len(spans))

        def cancel(sent: Deferred[bool]) -> None:
            # Only the daemon's stop cancels an export.  The cancellation
            # reaches the request under way in many shapes (Agent wraps it
            # as ResponseNeverReceived, RequestTransmissionFailed or
            # ConnectingCancelledError), so the flag, not the failure's
            # type, is what ends the retries; the answer is given now.
            ended.stopped = True
            self._warn(
                "the daemon stopped before the collector took them;"
                f" {len(spans)} span(s) dropped"
            )
            sent.callback(False)
            d.cancel()

        sent: Deferred[bool] = Deferred(cancel)
        d.addBoth(ended.relay, sent)
        return sent

    def _post(
        self, body: bytes, count: int, deadline: float, wait: float, ended: _Ended
    ) -> Deferred[bool]:
        timeout = min(
            self.settings.timeout, max(0.0, deadline - self.reactor.seconds())
        )
        d = self.agent.request(
            b"POST", self.url, self.headers, FileBodyProducer(io.BytesIO(body))
        )

        def answered(response: Any) -> Deferred[tuple[bytes, Any]]:
            reader = _Capped(TRACE_RESPONSE_BYTES)
            response.deliverBody(reader)
            return reader.done.addCallback(lambda answer: (answer, response))

        # The timeout bounds the answer's body too: a collector that sends
        # its head and then nothing would otherwise hold the one export
        # slot, and every later span would be dropped.
        d.addCallback(answered)
        d.addTimeout(timeout, self.reactor)

        def judge(got: tuple[bytes, Any]) -> Any:
            answer, response = got
            status = response.code
            if 200 <= status < 300:
                spans, why = rejected(answer, self.json)
                if spans:
                    self._warn(f"the collector rejected {spans} span(s): {why[:200]}")
                return True
            if status in RETRYABLE:
                after = _retry_after(response.headers)
                return again(after if after is not None else wait, f"HTTP {status}")
            self._warn(
                f"the collector answered HTTP {status}"
                f" {answer[:200].decode('utf-8', 'replace')!r}; {count} span(s) dropped"
            )
            return False

        def unreachable(failure: Any) -> Any:
            if ended.stopped or failure.check(CancelledError):
                # The daemon's stop (the request's own timeout is a
                # TimeoutError): trying again would hold the stop past its
                # bound.
                return False
            return again(wait, _reason(failure))

        def again(delay: float, why: str) -> Any:
            if ended.stopped:
                return False
            if delay > TRACE_RETRY_AFTER_MAX_SECONDS or (
                self.reactor.seconds() + delay >= deadline
            ):
                self._warn(f"{why}; {count} span(s) dropped")
                return False
            return deferLater(self.reactor, delay, lambda: None).addCallback(
                lambda _: self._post(body, count, deadline, wait * 2, ended)
            )

        d.addCallbacks(judge, unreachable)
        sent: Deferred[bool] = d
        return sent

    def _unsent(self, failure: Any, count: int) -> bool:
        if failure.check(CancelledError, DeferredTimeout):
            return False
        self._warn(f"{_reason(failure)}; {count} span(s) dropped")
        return False

    def _warn(self, why: str) -> None:
        """A failed export, in the log at most once per interval (the rest counted)."""
        self._unreported += 1
        now = self.reactor.seconds()
        if (
            self._last_warning is not None
            and now - self._last_warning < CAP_WARNING_INTERVAL_SECONDS
        ):
            return
        self._last_warning = now
        log.warn(
            "sandboxd: traces to {url}: {why} ({count} failed export(s) since the"
            " last warning)",
            url=self.settings.endpoint,
            why=why,
            count=self._unreported,
        )
        self._unreported = 0

    def close(self) -> Deferred[Any]:
        """Close the kept connection (the daemon's stop)."""
        if self.pool is None:
            return succeed(None)
        closed: Deferred[Any] = self.pool.closeCachedConnections()
        return closed


class _Ended:
    """One export's end: whether the stop cut it, and its answer given once."""

    def __init__(self) -> None:
        self.stopped = False

    def relay(self, result: Any, sent: Deferred[bool]) -> None:
        """Pass the export's own answer on, unless the stop gave one already."""
        if not sent.called:
            sent.callback(result is True)


def _reason(failure: Any) -> str:
    """
    Why a request failed, in words: Agent's wrappers
    (``ResponseNeverReceived``, ``RequestTransmissionFailed``) hold the
    real reasons in a list of failures, and print as that list.
    """
    inner = getattr(failure.value, "reasons", None)
    if inner:
        return "; ".join(_reason(f) for f in inner)
    if failure.check(CancelledError, ConnectingCancelledError, DeferredTimeout):
        # Only the request's own timeout cancels it (the stop is told apart
        # before this is asked).
        return "no answer within the timeout"
    message: str = failure.getErrorMessage()
    if not message or message.startswith(("HostnameAddress(", "IPv4Address(")):
        message = type(failure.value).__name__
    return message


def _retry_after(headers: Any) -> float | None:
    """A ``Retry-After`` in seconds (the date form is not waited on: None)."""
    values = headers.getRawHeaders(b"retry-after") or []
    try:
        return max(0.0, float(values[-1])) if values else None
    except ValueError:
        return None


__all__ = [
    "RESPONSE",
    "Exporter",
    "encode_json",
    "encode_protobuf",
    "json_request",
    "json_span",
    "protobuf_request",
    "protobuf_span",
    "rejected",
]
