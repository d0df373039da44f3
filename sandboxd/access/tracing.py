# -*- test-case-name: tests.test_tracing -*-
"""
Traces: every call through every door as one OpenTelemetry span, in the
caller's trace.

A platform team already follows an agent's tool call from the agent to the
sandbox's API; what the daemon did with it was, until now, an audit line
with nothing to join it on.  So:

- a call that carries W3C Trace Context (``traceparent``, ``tracestate``:
  what any OpenTelemetry-instrumented HTTP or gRPC client sends) or an
  ``X-Request-Id`` (what proxies such as Envoy add) has those ids in its
  audit line;
- when the environment names an OTLP collector (the OpenTelemetry
  variables every SDK reads, ``OTEL_EXPORTER_OTLP_ENDPOINT`` and the rest),
  the daemon sends one span per call, a child of the caller's span, whose
  attributes are what the gate decided: the endpoint id, the identity, the
  decision, the rule and the error code.

Nothing is sent anywhere unless an endpoint is named: the specification's
default (``localhost:4318``) would hand the daemon's spans to whatever a
sandbox's own process listens there.  The spans come from :func:`gate.audit
<sandboxd.access.gate.audit>`, the one place every door reports a call's
end, so no door can forget them; the exporter (:mod:`sandboxd.access.otlp`)
is imported only when there is somewhere to send to.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from sandboxd.policy.defaults import (
    CAP_WARNING_INTERVAL_SECONDS,
    TRACE_ATTRIBUTE_ITEMS,
    TRACE_ATTRIBUTE_VALUE_CHARS,
    TRACE_BATCH_SPANS,
    TRACE_EXPORT_TIMEOUT_SECONDS,
    TRACE_QUEUE_SPANS,
    TRACE_REQUEST_TIMEOUT_SECONDS,
    TRACE_SCHEDULE_DELAY_SECONDS,
    TRACE_STATE_CHARS,
)

log = Logger()

Headers = Mapping[bytes, Sequence[bytes]]

#: The collector's credentials, when the environment gives the daemon
#: some: never a child's (see :meth:`TokenStore.load
#: <sandboxd.access.auth.TokenStore>`).
SECRET_VARIABLES = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")

_TRACEPARENT = re.compile(
    r"(?P<version>[0-9a-f]{2})-(?P<trace>[0-9a-f]{32})-(?P<span>[0-9a-f]{16})"
    r"-(?P<flags>[0-9a-f]{2})(?P<rest>-.*)?"
)
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
#: What an ``X-Request-Id`` is kept as: printable ASCII, no spaces.
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")
_TRACESTATE = re.compile(r"[\x20-\x7e]*")
#: What a collector's header may be: an HTTP token, and Latin-1 text.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")

#: The samplers of ``OTEL_TRACES_SAMPLER`` (the specification's names).
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
#: ``OTEL_EXPORTER_OTLP_PROTOCOL`` values the exporter speaks.
PROTOCOLS = ("http/protobuf", "http/json")


@attrs.frozen
class Parent:
    """The caller's span, from its ``traceparent`` (lower-case hex ids)."""

    trace_id: str
    span_id: str
    sampled: bool
    state: str = ""


def parse_traceparent(value: str) -> Parent | None:
    """
    The W3C ``traceparent`` header's parent, or None for a value the
    specification says to ignore: version ``ff``, all-zero ids, upper-case
    hex, or version ``00`` with anything after its four fields (a later
    version may add fields, which are skipped).
    """
    match = _TRACEPARENT.fullmatch(value.strip())
    if match is None:
        return None
    version = match["version"]
    if version == "ff" or (version == "00" and match["rest"] is not None):
        return None
    trace_id, span_id = match["trace"], match["span"]
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return Parent(trace_id, span_id, bool(int(match["flags"], 16) & 1))


def _one(headers: Headers, name: bytes) -> str | None:
    """A header sent exactly once, as text; None when absent or repeated."""
    values = headers.get(name)
    if not values or len(values) != 1:
        return None
    return values[0].decode("latin-1")


def parent_of(headers: Headers) -> Parent | None:
    """
    The caller's span from a call's headers, with its ``tracestate``
    (dropped when longer than the specification asks to keep, or not
    printable).  Two ``traceparent`` headers are no parent at all.
    """
    value = _one(headers, b"traceparent")
    if value is None:
        return None
    states = headers.get(b"tracestate")
    return _with_state(
        parse_traceparent(value),
        ",".join(v.decode("latin-1").strip() for v in states) if states else "",
    )


def parent_of_text(headers: Mapping[str, str]) -> Parent | None:
    """:func:`parent_of` of a handler's headers (lower-cased names, last values)."""
    value = headers.get("traceparent")
    if value is None:
        return None
    return _with_state(parse_traceparent(value), headers.get("tracestate", "").strip())


def _with_state(parent: Parent | None, state: str) -> Parent | None:
    if parent is not None and state:
        if len(state) <= TRACE_STATE_CHARS and _TRACESTATE.fullmatch(state):
            return attrs.evolve(parent, state=state)
    return parent


def trace_headers(headers: Headers) -> dict[str, str]:
    """
    A call's trace context as a handler's headers: what a door that
    gives its handlers no headers of their own passes them, so that a
    child the call starts joins the trace (:meth:`Tracer.child_context`).
    """
    out = {}
    for name in ("traceparent", "tracestate"):
        values = headers.get(name.encode())
        if values:
            out[name] = values[-1].decode("latin-1")
    return out


def with_meta_context(headers: Headers, meta: object) -> Headers:
    """
    A call's headers with the trace context an MCP request carries in its
    ``params._meta`` (``traceparent``, ``tracestate``: where MCP clients
    instrumented with OpenTelemetry put it), which wins over the HTTP
    request's: one HTTP request may carry calls of several traces.
    """
    if not isinstance(meta, Mapping):
        return headers
    parent = meta.get("traceparent")
    if not isinstance(parent, str):
        return headers
    out = dict(headers)
    out[b"traceparent"] = [parent.encode("latin-1", "replace")]
    state = meta.get("tracestate")
    if isinstance(state, str):
        out[b"tracestate"] = [state.encode("latin-1", "replace")]
    else:
        out.pop(b"tracestate", None)
    return out


def request_id_of(headers: Headers) -> str | None:
    """A call's ``X-Request-Id``, when it is one printable word of at most 128."""
    value = _one(headers, b"x-request-id")
    if value is None:
        return None
    value = value.strip()
    return value if _REQUEST_ID.fullmatch(value) else None


# -- settings -------------------------------------------------------------------


#: A ``%`` that does not start percent-encoding (``%zz``, a lone ``%``).
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _pairs(text: str, what: str, problems: list[str]) -> list[tuple[str, str]]:
    """``k=v,k2=v2`` (the specification's list, values percent-decoded)."""
    out = []
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            problems.append(f"{what}: {item.strip()!r} is not NAME=VALUE; left out")
            continue
        if _BAD_PERCENT.search(value):
            # Kept as written, as OpenTelemetry's SDKs do; a literal % is %25.
            problems.append(
                f"{what}: the value of {unquote(name.strip())!r} has a % that is"
                " not percent-encoding (a % is written %25); sent as written"
            )
        out.append((unquote(name.strip()), unquote(value.strip())))
    return out


def _number(
    environ: Mapping[str, str],
    names: Sequence[str],
    default: float,
    problems: list[str],
) -> float:
    """The first of ``names`` set, as a positive number, else ``default``."""
    for name in names:
        raw = environ.get(name, "").strip()
        if not raw:
            continue
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if value <= 0:
            problems.append(
                f"{name}: {raw!r} is not a positive number; {default:g} used"
            )
            return default
        return value
    return default


def _first(environ: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first of ``names`` that is set and not empty, with its value."""
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return name, value
    return None


@attrs.frozen
class TraceSettings:
    """
    Where spans go and which are kept, read from the OpenTelemetry
    variables (:meth:`from_environ`).

    :ivar endpoint: the collector's traces URL; None sends nothing.
    :ivar problems: what in the environment was not taken, and why (logged
        as warnings at start).
    """

    endpoint: str | None = None
    protocol: str = "http/protobuf"
    headers: tuple[tuple[str, str], ...] = ()
    timeout: float = TRACE_REQUEST_TIMEOUT_SECONDS
    gzip: bool = False
    certificate: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None
    sampler: str = "parentbased_always_on"
    ratio: float = 1.0
    resource: tuple[tuple[str, AttributeValue], ...] = ()
    excluded: tuple[re.Pattern[str], ...] = ()
    schedule_delay: float = TRACE_SCHEDULE_DELAY_SECONDS
    export_timeout: float = TRACE_EXPORT_TIMEOUT_SECONDS
    max_queue: int = TRACE_QUEUE_SPANS
    max_batch: int = TRACE_BATCH_SPANS
    value_chars: int = TRACE_ATTRIBUTE_VALUE_CHARS
    problems: tuple[str, ...] = ()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> TraceSettings:
        """The settings the OpenTelemetry variables in ``environ`` ask for."""
        problems: list[str] = []
        endpoint = _endpoint(environ, problems)
        protocol = (_otlp(environ, "PROTOCOL") or ("", "http/protobuf"))[1]
        if protocol not in PROTOCOLS:
            if endpoint is not None:
                problems.append(
                    f"OTLP protocol {protocol!r}: sandboxd sends spans over OTLP/HTTP"
                    " (http/protobuf or http/json, the collector's port 4318);"
                    " no spans are sent"
                )
            endpoint, protocol = None, "http/protobuf"
        compression = (_otlp(environ, "COMPRESSION") or ("", "none"))[1].lower()
        if compression not in ("gzip", "none"):
            problems.append(
                f"OTLP compression {compression!r} is not gzip or none; none used"
            )
        certificate, client_certificate, client_key = (
            (_otlp(environ, key) or ("", None))[1]
            for key in ("CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY")
        )
        if bool(client_certificate) != bool(client_key):
            problems.append(
                "OTLP client certificate and key: only one is set; neither is used"
            )
            client_certificate = client_key = None
        sampler, ratio = _sampler(environ, problems)

        def number(names: Sequence[str], default: float) -> float:
            return _number(environ, names, default, problems)

        max_queue = int(number(["OTEL_BSP_MAX_QUEUE_SIZE"], TRACE_QUEUE_SPANS))
        if max_queue > TRACE_QUEUE_SPANS * 8:
            problems.append(
                f"OTEL_BSP_MAX_QUEUE_SIZE: {max_queue} is over the bound of"
                f" {TRACE_QUEUE_SPANS * 8} spans; {TRACE_QUEUE_SPANS * 8} used"
            )
            max_queue = TRACE_QUEUE_SPANS * 8
        max_batch = int(number(["OTEL_BSP_MAX_EXPORT_BATCH_SIZE"], TRACE_BATCH_SPANS))
        return cls(
            endpoint=endpoint,
            protocol=protocol,
            headers=_header_pairs(_otlp(environ, "HEADERS"), problems),
            timeout=number(
                ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"],
                TRACE_REQUEST_TIMEOUT_SECONDS * 1000,
            )
            / 1000,
            gzip=compression == "gzip",
            certificate=certificate,
            client_certificate=client_certificate,
            client_key=client_key,
            sampler=sampler,
            ratio=ratio,
            resource=_resource(environ, problems),
            excluded=_excluded_paths(environ, problems),
            schedule_delay=number(
                ["OTEL_BSP_SCHEDULE_DELAY"], TRACE_SCHEDULE_DELAY_SECONDS * 1000
            )
            / 1000,
            export_timeout=number(
                ["OTEL_BSP_EXPORT_TIMEOUT"], TRACE_EXPORT_TIMEOUT_SECONDS * 1000
            )
            / 1000,
            max_queue=max_queue,
            max_batch=min(max_batch, max_queue),
            value_chars=int(
                number(
                    [
                        "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
                        "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
                    ],
                    TRACE_ATTRIBUTE_VALUE_CHARS,
                )
            ),
            problems=tuple(problems),
        )


def _otlp(environ: Mapping[str, str], key: str) -> tuple[str, str] | None:
    """``OTEL_EXPORTER_OTLP_TRACES_<key>``, else ``OTEL_EXPORTER_OTLP_<key>``."""
    return _first(
        environ, f"OTEL_EXPORTER_OTLP_TRACES_{key}", f"OTEL_EXPORTER_OTLP_{key}"
    )


def _sampler(environ: Mapping[str, str], problems: list[str]) -> tuple[str, float]:
    """``OTEL_TRACES_SAMPLER`` and its ratio (``OTEL_TRACES_SAMPLER_ARG``)."""
    sampler = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if sampler and sampler not in SAMPLERS:
        problems.append(
            f"OTEL_TRACES_SAMPLER: {sampler!r} is not one of"
            f" {', '.join(SAMPLERS)}; parentbased_always_on used"
        )
        sampler = ""
    sampler = sampler or "parentbased_always_on"
    raw = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if not raw or not sampler.endswith("traceidratio"):
        return sampler, 1.0
    try:
        ratio = float(raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        problems.append(
            f"OTEL_TRACES_SAMPLER_ARG: {raw!r} is not a ratio from 0 to 1; 1 used"
        )
        ratio = 1.0
    return sampler, ratio


def _excluded_paths(
    environ: Mapping[str, str], problems: list[str]
) -> tuple[re.Pattern[str], ...]:
    """``OTEL_PYTHON_EXCLUDED_URLS``: the patterns of paths that get no span."""
    out = []
    for pattern in environ.get("OTEL_PYTHON_EXCLUDED_URLS", "").split(","):
        if not pattern.strip():
            continue
        try:
            out.append(re.compile(pattern.strip()))
        except re.error as e:
            problems.append(
                f"OTEL_PYTHON_EXCLUDED_URLS: {pattern.strip()!r} is no pattern ({e})"
            )
    return tuple(out)


def _header_pairs(
    named: tuple[str, str] | None, problems: list[str]
) -> tuple[tuple[str, str], ...]:
    """The collector's headers: pairs a header can carry (ASCII names, Latin-1 values)."""
    if named is None:
        return ()
    out = []
    for name, value in _pairs(named[1], named[0], problems):
        if not _HEADER_NAME.fullmatch(name):
            problems.append(f"{named[0]}: {name!r} is no header name; left out")
        elif not _HEADER_VALUE.fullmatch(value):
            problems.append(
                f"{named[0]}: the value of {name!r} is not Latin-1 text; left out"
            )
        else:
            out.append((name, value))
    return tuple(out)


def _endpoint(environ: Mapping[str, str], problems: list[str]) -> str | None:
    """
    The collector's traces URL, or None: the traces variable as it is, or
    the general one with ``/v1/traces`` added; nothing when the SDK is
    switched off or the exporters named leave OTLP out.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporters = [
        e.strip().lower()
        for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",")
        if e.strip()
    ]
    if exporters and "otlp" not in exporters:
        return None
    others = sorted(set(exporters) - {"otlp", "none"})
    if others:
        problems.append(
            f"OTEL_TRACES_EXPORTER: {', '.join(others)} not supported; only otlp is"
        )
    named = _first(environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if named is not None:
        name, url = named
    else:
        general = _first(environ, "OTEL_EXPORTER_OTLP_ENDPOINT")
        if general is None:
            return None
        name, base = general
        url = base.rstrip("/") + "/v1/traces"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        problems.append(
            f"{name}: {url!r} is not an http or https URL; no spans are sent"
        )
        return None
    return url


def _resource(
    environ: Mapping[str, str], problems: list[str]
) -> tuple[tuple[str, AttributeValue], ...]:
    """
    The resource's attributes: ``OTEL_RESOURCE_ATTRIBUTES``, then
    ``service.name`` (``OTEL_SERVICE_NAME`` over both; ``sandboxd``
    when neither names one) and the daemon's own.
    """
    from sandboxd._version import __version__

    given: dict[str, AttributeValue] = dict(
        _pairs(
            environ.get("OTEL_RESOURCE_ATTRIBUTES", ""),
            "OTEL_RESOURCE_ATTRIBUTES",
            problems,
        )
    )
    service = environ.get("OTEL_SERVICE_NAME", "").strip()
    if service:
        given["service.name"] = service
    given.setdefault("service.name", "sandboxd")
    given.setdefault("service.version", __version__)
    given.setdefault("telemetry.sdk.name", "sandboxd")
    given.setdefault("telemetry.sdk.language", "python")
    given.setdefault("telemetry.sdk.version", __version__)
    given.setdefault("host.name", os.uname().nodename)
    # An int, as the semantic conventions type it (a collector's queries
    # compare it as one).
    given.setdefault("process.pid", os.getpid())
    return tuple(sorted(given.items()))


# -- sampling -------------------------------------------------------------------


def sampled(settings: TraceSettings, parent: Parent | None, trace_id: str) -> bool:
    """
    Whether a call's span is kept, as the specification's samplers decide:
    a parent-based one follows the caller's ``sampled`` flag; the ratio
    one keeps a trace when the low 64 bits of its id fall under the ratio
    (the same traces at every hop that uses it).
    """
    kind = settings.sampler
    if kind.startswith("parentbased_") and parent is not None:
        return parent.sampled
    root = kind.removeprefix("parentbased_")
    if root == "always_on":
        return True
    if root == "always_off":
        return False
    bound = round(settings.ratio * (1 << 64))
    return int(trace_id[16:], 16) < bound


# -- spans ------------------------------------------------------------------------

#: Span kind ``SERVER`` and status ``ERROR``, as OTLP numbers them.
SERVER = 2
STATUS_ERROR = 2

#: What the HTTP attributes are given for (a gRPC call gets the RPC ones).
_HTTP_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"}
)

AttributeValue = str | int | bool | tuple[str, ...]

#: Audit fields that are the span's own ids, not attributes.
_IDS = frozenset({"trace_id", "span_id"})


@attrs.frozen
class Span:
    """One finished call, as it is sent (ids as raw bytes)."""

    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes | None
    trace_state: str
    name: str
    start_ns: int
    end_ns: int
    attributes: tuple[tuple[str, AttributeValue], ...]
    error: str | None = None


@attrs.frozen
class Finished:
    """What the gate knows of a call when it ends (:meth:`Tracer.finished`)."""

    door: str
    endpoint: str | None
    identity: str | None
    on_behalf_of: str | None
    method: str
    path: str
    status: int
    code: str | None
    rule: str | None
    started: float
    client: str
    extra: Mapping[str, object] | None = None


class Exporter(Protocol):
    """What sends batches (:class:`sandboxd.access.otlp.Exporter`)."""

    def encode(self, span: Span) -> bytes:
        """``span`` as it will be sent."""

    def export(self, spans: Sequence[bytes], within: float) -> Deferred[bool]:
        """Send encoded spans within ``within`` seconds; whether the collector took them."""

    def close(self) -> Deferred[Any]:
        """Let go of the collector's connection."""


class Tracer:
    """
    Turns each finished call into a span and hands batches to the exporter.

    Spans wait in a bounded queue: a batch goes when it is full or every
    ``schedule_delay``; one export at a time; a span that finds the queue
    full is dropped and counted (:attr:`counts`), so a collector that is
    down or slow costs the daemon a fixed amount of memory and nothing
    else.

    :param exporter: sends a batch; None when there is nowhere to send to
        (ids are still read from the callers' headers for the audit line).
    """

    def __init__(
        self,
        settings: TraceSettings,
        reactor: Any = None,
        exporter: Exporter | None = None,
        ids: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.settings = settings
        self.reactor = reactor
        self.exporter = exporter
        self._ids = ids
        #: Spans waiting to be sent, encoded (:meth:`Exporter.encode`).
        self.queue: list[bytes] = []
        #: Spans by what became of them, since the start (``GET /metrics``).
        self.counts = {"exported": 0, "dropped": 0, "failed": 0}
        self._timer: Any = None
        self._sending: Any = None
        self._stopping = False
        #: When the stop's exports must be over (:meth:`stop`).
        self._stop_deadline: float | None = None
        self._drop_warned: float | None = None
        self._dropped_since = 0
        #: Whether spans are being sent anywhere (read on every call: an
        #: attribute, not a property).
        self.exporting = exporter is not None
        #: What in the environment was not taken, and why.
        self.problems: tuple[str, ...] = settings.problems

    @property
    def destination(self) -> str | None:
        """Where spans go, for the start's line: the URL and the protocol."""
        if self.exporter is None or self.settings.endpoint is None:
            return None
        return f"{self.settings.endpoint} ({self.settings.protocol})"

    def ids(self, headers: Headers) -> dict[str, str]:
        """
        The ids a call's audit line carries when no span is sent for it:
        the caller's ``trace_id`` and ``parent_span_id``, ``request_id``.
        """
        ids: dict[str, str] = {}
        parent = parent_of(headers)
        if parent is not None:
            ids["trace_id"] = parent.trace_id
            ids["parent_span_id"] = parent.span_id
        request_id = request_id_of(headers)
        if request_id is not None:
            ids["request_id"] = request_id
        return ids

    def finished(self, call: Finished, headers: Headers | None) -> dict[str, str]:
        """
        One call has ended: its span, if it is kept; the ids its audit
        line carries (``trace_id`` and ``span_id`` of the span sent, or
        :meth:`ids`).
        """
        ids: dict[str, str] = {}
        parent = None
        if headers is not None:
            parent = parent_of(headers)
            request_id = request_id_of(headers)
            if request_id is not None:
                ids["request_id"] = request_id
        if self.exporting and not self._excluded(call.path):
            trace_id, span_id = self._chosen(call, parent)
            if sampled(self.settings, parent, trace_id):
                self._keep(self._span(call, parent, trace_id, span_id, ids))
                ids["trace_id"] = trace_id
                ids["span_id"] = span_id
                return ids
        if parent is not None:
            ids["trace_id"] = parent.trace_id
            ids["parent_span_id"] = parent.span_id
        return ids

    def _chosen(self, call: Finished, parent: Parent | None) -> tuple[str, str]:
        """
        The call's trace and span ids: those :meth:`child_context` chose
        for a child it started, when they belong to this call's trace;
        else new ones (the trace the caller's, when it sent one).
        """
        extra = call.extra or {}
        trace_id, span_id = extra.get("trace_id"), extra.get("span_id")
        if isinstance(trace_id, str) and isinstance(span_id, str):
            if parent is None or parent.trace_id == trace_id:
                return trace_id, span_id
        raw = self._ids(24)
        return (parent.trace_id if parent is not None else raw[:16].hex()), raw[
            16:
        ].hex()

    def child_context(
        self, headers: Mapping[str, str], audit: dict[str, Any], path: str = ""
    ) -> dict[str, str]:
        """
        ``TRACEPARENT`` (and ``TRACESTATE``) for a child this call starts,
        as OpenTelemetry's environment carriers name them: the daemon's span
        of the call, when one is sent (its ids chosen now and kept in
        ``audit`` for :meth:`finished`); else the caller's context as it
        came; nothing when there is neither.
        """
        parent = parent_of_text(headers)
        out: dict[str, str] = {}
        if self.exporting and not self._excluded(path):
            trace_id, span_id = audit.get("trace_id"), audit.get("span_id")
            if not (isinstance(trace_id, str) and isinstance(span_id, str)):
                raw = self._ids(24)
                trace_id = parent.trace_id if parent is not None else raw[:16].hex()
                span_id = raw[16:].hex()
            if sampled(self.settings, parent, trace_id):
                # The span the call will send: the child's parent.
                audit["trace_id"], audit["span_id"] = trace_id, span_id
                out["TRACEPARENT"] = f"00-{trace_id}-{span_id}-01"
            elif parent is not None:
                out["TRACEPARENT"] = f"00-{parent.trace_id}-{parent.span_id}-00"
        elif parent is not None:
            flags = "01" if parent.sampled else "00"
            out["TRACEPARENT"] = f"00-{parent.trace_id}-{parent.span_id}-{flags}"
        if out and parent is not None and parent.state:
            out["TRACESTATE"] = parent.state
        return out

    def _excluded(self, path: str) -> bool:
        return any(p.search(path) for p in self.settings.excluded)

    def _span(
        self,
        call: Finished,
        parent: Parent | None,
        trace_id: str,
        span_id: str,
        ids: Mapping[str, str],
    ) -> Span:
        end = time.time_ns()
        took = (
            max(0, int((time.monotonic() - call.started) * 1e9)) if call.started else 0
        )
        return Span(
            trace_id=bytes.fromhex(trace_id),
            span_id=bytes.fromhex(span_id),
            parent_span_id=bytes.fromhex(parent.span_id)
            if parent is not None
            else None,
            trace_state=parent.state if parent is not None else "",
            name=call.endpoint or call.method,
            start_ns=end - took,
            end_ns=end,
            attributes=self._attributes(call, ids),
            error=(call.code or "internal") if call.status >= 500 else None,
        )

    def _attributes(
        self, call: Finished, ids: Mapping[str, str]
    ) -> tuple[tuple[str, AttributeValue], ...]:
        """The span's attributes: the gate's decision, and the transport's."""
        chars = self.settings.value_chars
        out: list[tuple[str, AttributeValue]] = [
            ("sandboxd.door", call.door),
            ("sandboxd.status", call.status),
            ("sandboxd.decision", "deny" if call.status >= 400 else "allow"),
        ]
        for name, value in (
            ("sandboxd.endpoint", call.endpoint),
            ("sandboxd.identity", call.identity),
            ("sandboxd.on_behalf_of", call.on_behalf_of),
            ("sandboxd.code", call.code),
            ("sandboxd.rule", call.rule),
            ("sandboxd.request_id", ids.get("request_id")),
            ("client.address", call.client),
        ):
            if value:
                out.append((name, value[:chars]))
        if call.path:
            out.append(("url.path", call.path[:chars]))
        if call.door == "kep" and call.path.startswith("/process."):
            out.append(("rpc.system", "grpc"))
            out.append(("rpc.method", call.path[1:][:chars]))
        else:
            method = "GET" if call.method == "WS" else call.method
            if method in _HTTP_METHODS:
                out.append(("http.request.method", method))
                out.append(("http.response.status_code", call.status))
        for key, extra in (call.extra or {}).items():
            if key in _IDS:
                continue
            item = _attribute(extra, chars)
            if item is not None:
                out.append((f"sandboxd.{key}", item))
        return tuple(out)

    def _keep(self, span: Span) -> None:
        """Queue ``span`` (or drop it, the queue full); send a full batch now."""
        if len(self.queue) >= self.settings.max_queue:
            self.counts["dropped"] += 1
            self._dropped_since += 1
            now = self.reactor.seconds() if self.reactor is not None else 0.0
            if (
                self._drop_warned is None
                or now - self._drop_warned >= CAP_WARNING_INTERVAL_SECONDS
            ):
                self._drop_warned = now
                log.warn(
                    "sandboxd: traces: {count} span(s) dropped, the queue of"
                    " {size} full (the collector is slow or away)",
                    count=self._dropped_since,
                    size=self.settings.max_queue,
                )
                self._dropped_since = 0
            return
        assert self.exporter is not None
        self.queue.append(self.exporter.encode(span))
        if len(self.queue) >= self.settings.max_batch:
            self._send_soon(0)
        else:
            self._send_soon(self.settings.schedule_delay)

    def _send_soon(self, delay: float) -> None:
        if self._sending is not None or self.reactor is None:
            return
        timer = self._timer
        if timer is not None and timer.active():
            if delay:
                return
            timer.cancel()
        self._timer = self.reactor.callLater(delay, self._send)

    def _send(self) -> Any:
        """Hand the next batch to the exporter; the next one when it is done."""
        self._timer = None
        if not self.queue or self.exporter is None or self._sending is not None:
            return None
        batch = self.queue[: self.settings.max_batch]
        del self.queue[: len(batch)]
        within = self.settings.export_timeout
        if self._stop_deadline is not None:
            within = min(within, max(0.0, self._stop_deadline - self.reactor.seconds()))
        d = self._sending = self.exporter.export(batch, within)

        def done(sent: bool) -> None:
            self._sending = None
            self.counts["exported" if sent else "failed"] += len(batch)
            if self.queue and not self._stopping:
                full = len(self.queue) >= self.settings.max_batch
                self._send_soon(0 if full else self.settings.schedule_delay)

        d.addCallback(done)
        return d

    def stop(self, within: float | None = None) -> Any:
        """
        At the daemon's stop: what is queued goes now, each batch within
        the export timeout and all of them within ``within`` seconds (the
        stop is bounded; an export under way may be cut sooner); no span
        is taken after.  What is left at the bound is dropped and counted.
        """
        self._stopping = True
        self.exporting = False
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self.exporter is None:
            return succeed(None)
        if within is not None and self.reactor is not None:
            self._stop_deadline = self.reactor.seconds() + within

        def drain(_: Any = None) -> Any:
            if self._sending is not None:
                return self._sending.addCallback(drain)
            if not self.queue:
                return None
            deadline = self._stop_deadline
            if deadline is not None and self.reactor.seconds() >= deadline:
                log.warn(
                    "sandboxd: traces: the daemon stopped before {count} queued"
                    " span(s) could be sent; dropped",
                    count=len(self.queue),
                )
                self.counts["failed"] += len(self.queue)
                self.queue.clear()
                return None
            return self._send().addCallback(drain)

        return drain()

    def close(self) -> Any:
        """Let go of the collector's connection (after :meth:`stop`)."""
        return self.exporter.close() if self.exporter is not None else succeed(None)


def _attribute(value: object, chars: int) -> AttributeValue | None:
    """An audit field as an attribute value: text, number, flag, list of text."""
    if isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return value[:chars]
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(v[:chars] for v in value[:TRACE_ATTRIBUTE_ITEMS])
    return None


__all__ = [
    "SECRET_VARIABLES",
    "Finished",
    "Parent",
    "Span",
    "TraceSettings",
    "Tracer",
    "parent_of",
    "parent_of_text",
    "parse_traceparent",
    "request_id_of",
    "sampled",
    "trace_headers",
    "with_meta_context",
]
