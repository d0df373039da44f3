"""
Trace context and span bookkeeping, in memory: what a caller's headers
are taken for, what the OpenTelemetry variables configure, which spans
are kept, and how the queue bounds what a slow collector costs.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access import gate
from sandboxd.access.auth import TokenStore
from sandboxd.access.tracing import (
    Finished,
    Parent,
    Tracer,
    TraceSettings,
    parent_of,
    parse_traceparent,
    request_id_of,
    sampled,
    with_meta_context,
)
from sandboxd.testing import memory_context

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
PARENT = f"00-{TRACE}-{SPAN}-01"


class ParseTests(SynchronousTestCase):
    """``traceparent`` as the W3C's Trace Context reads it."""

    def test_valid(self) -> None:
        """The ids and the sampled flag."""
        self.assertEqual(parse_traceparent(PARENT), Parent(TRACE, SPAN, True))
        self.assertFalse(parse_traceparent(f"00-{TRACE}-{SPAN}-00").sampled)  # type: ignore[union-attr]
        # Other flag bits do not make it sampled.
        self.assertFalse(parse_traceparent(f"00-{TRACE}-{SPAN}-02").sampled)  # type: ignore[union-attr]

    def test_ignored(self) -> None:
        """Each value the specification says to ignore is no parent."""
        for value in (
            "",
            "garbage",
            f"ff-{TRACE}-{SPAN}-01",
            f"00-{'0' * 32}-{SPAN}-01",
            f"00-{TRACE}-{'0' * 16}-01",
            f"00-{TRACE.upper()}-{SPAN}-01",
            f"00-{TRACE}-{SPAN}-01-extra",
            f"00-{TRACE[:-1]}-{SPAN}-01",
            f"00-{TRACE}-{SPAN}1-01",
            f"0-{TRACE}-{SPAN}-01",
        ):
            self.assertIsNone(parse_traceparent(value), value)

    def test_later_version(self) -> None:
        """A later version's extra fields are skipped, its first four read."""
        self.assertEqual(
            parse_traceparent(f"01-{TRACE}-{SPAN}-01-what-comes-next"),
            Parent(TRACE, SPAN, True),
        )

    def test_headers(self) -> None:
        """
        Two ``traceparent`` headers are none; ``tracestate`` headers are
        joined, and dropped when over 512 characters or not printable.
        """
        self.assertIsNone(parent_of({b"traceparent": [PARENT.encode()] * 2}))
        parent = parent_of(
            {b"traceparent": [PARENT.encode()], b"tracestate": [b"a=1", b"b=2"]}
        )
        self.assertEqual(parent, Parent(TRACE, SPAN, True, "a=1,b=2"))
        for state in (b"a=" + b"x" * 600, b"a=\x01"):
            parent = parent_of(
                {b"traceparent": [PARENT.encode()], b"tracestate": [state]}
            )
            self.assertEqual(parent, Parent(TRACE, SPAN, True, ""))

    def test_request_id(self) -> None:
        """One printable word of at most 128 characters; anything else is none."""
        self.assertEqual(request_id_of({b"x-request-id": [b" req-1 "]}), "req-1")
        for bad in ([b"two words"], [b"x" * 129], [b"a", b"b"], [b"caf\xe9"], [b""]):
            self.assertIsNone(request_id_of({b"x-request-id": bad}), bad)

    def test_meta_context(self) -> None:
        """An MCP request's ``_meta`` trace context wins over its HTTP request's."""
        other = f"00-{'1' * 32}-{'2' * 16}-01"
        headers = {b"traceparent": [PARENT.encode()], b"tracestate": [b"h=1"]}
        merged = with_meta_context(headers, {"traceparent": other})
        self.assertEqual(parent_of(merged), Parent("1" * 32, "2" * 16, True))
        self.assertIs(with_meta_context(headers, {"progressToken": 1}), headers)
        self.assertIs(with_meta_context(headers, None), headers)


def settings(**environ: str) -> TraceSettings:
    return TraceSettings.from_environ(environ)


class SettingsTests(SynchronousTestCase):
    """What the OpenTelemetry variables configure."""

    def test_nothing_sent_unless_named(self) -> None:
        """
        No endpoint, no export: the specification's default (localhost:4318)
        is never used.
        """
        self.assertIsNone(settings().endpoint)
        self.assertIsNone(settings(OTEL_TRACES_EXPORTER="otlp").endpoint)

    def test_endpoints(self) -> None:
        """
        The general endpoint gets ``/v1/traces``; the traces endpoint is
        taken as it is, and wins.
        """
        self.assertEqual(
            settings(OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318/").endpoint,
            "http://collector:4318/v1/traces",
        )
        self.assertEqual(
            settings(
                OTEL_EXPORTER_OTLP_ENDPOINT="http://a:4318",
                OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="https://b/custom",
            ).endpoint,
            "https://b/custom",
        )

    def test_switched_off(self) -> None:
        """``OTEL_SDK_DISABLED`` and an exporter list without ``otlp``."""
        base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
        self.assertIsNone(settings(**base, OTEL_SDK_DISABLED="true").endpoint)
        self.assertIsNone(settings(**base, OTEL_TRACES_EXPORTER="none").endpoint)
        kept = settings(**base, OTEL_TRACES_EXPORTER="otlp,zipkin")
        self.assertEqual(kept.endpoint, "http://c:4318/v1/traces")
        self.assertIn("zipkin not supported", kept.problems[0])

    def test_grpc_refused(self) -> None:
        """OTLP over gRPC is not spoken: nothing is sent, and the problem says why."""
        found = settings(
            OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4317",
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        )
        self.assertIsNone(found.endpoint)
        self.assertIn("4318", found.problems[0])

    def test_bad_url(self) -> None:
        """A URL that is not http or https is a problem, and nothing is sent."""
        found = settings(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="collector:4318")
        self.assertIsNone(found.endpoint)
        self.assertIn("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", found.problems[0])

    def test_headers_and_numbers(self) -> None:
        """
        Headers are percent-decoded pairs (a bad item left out and named);
        times are milliseconds; a bad number keeps the default.
        """
        found = settings(
            OTEL_EXPORTER_OTLP_ENDPOINT="http://c",
            OTEL_EXPORTER_OTLP_HEADERS="api-key=a%20b%3D,broken, x=1",
            OTEL_EXPORTER_OTLP_TIMEOUT="2500",
            OTEL_BSP_SCHEDULE_DELAY="-3",
            OTEL_BSP_MAX_QUEUE_SIZE="10",
            OTEL_BSP_MAX_EXPORT_BATCH_SIZE="50",
        )
        self.assertEqual(found.headers, (("api-key", "a b="), ("x", "1")))
        self.assertEqual(found.timeout, 2.5)
        self.assertEqual(found.schedule_delay, 5.0)
        self.assertEqual((found.max_queue, found.max_batch), (10, 10))
        problems = " ".join(found.problems)
        self.assertIn("'broken'", problems)
        self.assertIn("OTEL_BSP_SCHEDULE_DELAY", problems)

    def test_values_past_their_bounds_named(self) -> None:
        """
        A queue over its bound is cut to it and said so; a header value
        with a % that is not percent-encoding is sent as written, and said so.
        """
        found = settings(
            OTEL_EXPORTER_OTLP_ENDPOINT="http://c",
            OTEL_EXPORTER_OTLP_HEADERS="a=%zz,b=ok%20",
            OTEL_BSP_MAX_QUEUE_SIZE="99999999",
        )
        self.assertEqual(found.max_queue, 16384)
        self.assertEqual(found.headers, (("a", "%zz"), ("b", "ok ")))
        problems = " ".join(found.problems)
        self.assertIn("OTEL_BSP_MAX_QUEUE_SIZE: 99999999 is over the bound", problems)
        self.assertIn("the value of 'a' has a %", problems)
        self.assertEqual(len(found.problems), 2)

    def test_header_that_cannot_be_sent(self) -> None:
        """A header name that is no token, or a value beyond Latin-1, is left out and named."""
        found = settings(
            OTEL_EXPORTER_OTLP_ENDPOINT="http://c",
            OTEL_EXPORTER_OTLP_TRACES_HEADERS="bad name=1,k=%E2%9C%93,ok=%C3%A9",
        )
        self.assertEqual(found.headers, (("ok", "é"),))
        self.assertEqual(len(found.problems), 2)
        self.assertIn("OTEL_EXPORTER_OTLP_TRACES_HEADERS", found.problems[0])

    def test_sampler(self) -> None:
        """The specification's samplers; an unknown one or a bad ratio is named."""
        self.assertEqual(settings().sampler, "parentbased_always_on")
        found = settings(
            OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.25"
        )
        self.assertEqual((found.sampler, found.ratio), ("traceidratio", 0.25))
        found = settings(OTEL_TRACES_SAMPLER="sometimes")
        self.assertEqual(found.sampler, "parentbased_always_on")
        self.assertIn("sometimes", found.problems[0])
        found = settings(
            OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="2"
        )
        self.assertEqual(found.ratio, 1.0)
        self.assertTrue(found.problems)

    def test_resource(self) -> None:
        """``OTEL_SERVICE_NAME`` over the attributes' ``service.name``; ``sandboxd`` else."""
        resource = dict(settings().resource)
        self.assertEqual(resource["service.name"], "sandboxd")
        self.assertIn("service.version", resource)
        resource = dict(
            settings(
                OTEL_RESOURCE_ATTRIBUTES="service.name=a,k8s.pod.name=p%2D1"
            ).resource
        )
        self.assertEqual(
            (resource["service.name"], resource["k8s.pod.name"]), ("a", "p-1")
        )
        resource = dict(
            settings(
                OTEL_RESOURCE_ATTRIBUTES="service.name=a", OTEL_SERVICE_NAME="sandbox-7"
            ).resource
        )
        self.assertEqual(resource["service.name"], "sandbox-7")

    def test_client_certificate_needs_both(self) -> None:
        """A client certificate without its key (or the reverse) is neither used."""
        found = settings(
            OTEL_EXPORTER_OTLP_ENDPOINT="https://c",
            OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE="/etc/cert.pem",
        )
        self.assertIsNone(found.client_certificate)
        self.assertIn("only one", found.problems[0])

    def test_collector_headers_are_secret(self) -> None:
        """
        The collector's headers, when the daemon has them, are one of its
        secrets (never a child's); absent, a child may set its own.
        """
        store = TokenStore.build([], {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=k"})
        self.assertIn("OTEL_EXPORTER_OTLP_HEADERS", store.secret_env)
        store = TokenStore.build([], {})
        self.assertNotIn("OTEL_EXPORTER_OTLP_HEADERS", store.secret_env)


class SamplerTests(SynchronousTestCase):
    """Which calls' spans are kept."""

    def test_parent_based(self) -> None:
        """A parent's flag decides; a call without one is kept."""
        found = settings()
        self.assertTrue(sampled(found, Parent(TRACE, SPAN, True), TRACE))
        self.assertFalse(sampled(found, Parent(TRACE, SPAN, False), TRACE))
        self.assertTrue(sampled(found, None, TRACE))
        self.assertFalse(
            sampled(settings(OTEL_TRACES_SAMPLER="parentbased_always_off"), None, TRACE)
        )

    def test_ratio(self) -> None:
        """The low 64 bits of the trace id under the ratio: the same at every hop."""
        half = settings(
            OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.5"
        )
        self.assertTrue(sampled(half, None, "f" * 16 + "7" + "f" * 15))
        self.assertFalse(sampled(half, None, "0" * 16 + "8" + "0" * 15))
        # Not parent-based: the parent's flag is not asked.
        self.assertFalse(sampled(half, Parent(TRACE, SPAN, True), "0" * 16 + "f" * 16))
        none = settings(OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0")
        self.assertFalse(sampled(none, None, "0" * 32))


class FakeExporter:
    """Takes batches; each export waits until the test fires it."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.pending: list[Deferred[bool]] = []

    def encode(self, span: Any) -> Any:
        # Kept as they are: the tests read the spans' fields.
        return span

    def export(self, spans: Any, within: float) -> Deferred[bool]:
        self.batches.append(list(spans))
        d: Deferred[bool] = Deferred()
        self.pending.append(d)
        return d

    def close(self) -> Deferred[None]:
        return succeed(None)


def call(path: str = "/files/list", status: int = 200, **kw: Any) -> Finished:
    fields: dict[str, Any] = {
        "door": "http",
        "endpoint": "files_list",
        "identity": "agent",
        "on_behalf_of": None,
        "method": "GET",
        "path": path,
        "status": status,
        "code": None,
        "rule": None,
        "started": 0.0,
        "client": "127.0.0.1",
    }
    fields.update(kw)
    return Finished(**fields)


def fake_tracer(**environ: str) -> tuple[Tracer, FakeExporter, Clock]:
    """A tracer sending to a :class:`FakeExporter` on a clock, its ids counted up."""
    environ.setdefault("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c")
    clock = Clock()
    exporter = FakeExporter()
    counter = iter(range(1, 1 << 20))
    tracer = Tracer(
        settings(**environ),
        clock,
        exporter,  # type: ignore[arg-type]
        ids=lambda n: next(counter).to_bytes(n, "big"),
    )
    return tracer, exporter, clock


class TracerTests(SynchronousTestCase):
    """The queue, the batches, and what the audit line gets."""

    def tracer(self, **environ: str) -> tuple[Tracer, FakeExporter, Clock]:
        return fake_tracer(**environ)

    def test_span_of_a_call(self) -> None:
        """
        A span in the caller's trace, a child of its span; the audit line
        gets the trace id and the daemon's span id.
        """
        tracer, exporter, clock = self.tracer()
        ids = tracer.finished(
            call(
                extra={"argv": ["ls", "-l"], "tool": "files_list", "nested": {"a": 1}}
            ),
            {b"traceparent": [PARENT.encode()], b"x-request-id": [b"r-9"]},
        )
        self.assertEqual(ids["trace_id"], TRACE)
        self.assertEqual(ids["request_id"], "r-9")
        clock.advance(5)
        [[span]] = exporter.batches
        self.assertEqual(span.trace_id.hex(), TRACE)
        self.assertEqual(span.parent_span_id.hex(), SPAN)
        self.assertEqual(span.span_id.hex(), ids["span_id"])
        self.assertEqual(span.name, "files_list")
        attributes = dict(span.attributes)
        self.assertEqual(attributes["sandboxd.decision"], "allow")
        self.assertEqual(attributes["sandboxd.identity"], "agent")
        self.assertEqual(attributes["sandboxd.request_id"], "r-9")
        self.assertEqual(attributes["http.response.status_code"], 200)
        self.assertEqual(attributes["sandboxd.argv"], ("ls", "-l"))
        self.assertNotIn("sandboxd.nested", attributes)
        self.assertIsNone(span.error)

    def test_server_error_is_an_error(self) -> None:
        """A 5xx is the span's error (its code); a refusal (4xx) is not."""
        tracer, exporter, clock = self.tracer()
        tracer.finished(call(status=503, code="no_thread"), None)
        tracer.finished(call(status=403, code="missing_scope"), None)
        clock.advance(5)
        [[failed, refused]] = exporter.batches
        self.assertEqual(failed.error, "no_thread")
        self.assertIsNone(refused.error)
        self.assertEqual(dict(refused.attributes)["sandboxd.decision"], "deny")

    def test_unsampled_parent(self) -> None:
        """
        A caller that did not sample its trace gets no span; its ids still
        reach the audit line.
        """
        tracer, exporter, clock = self.tracer()
        ids = tracer.finished(
            call(), {b"traceparent": [f"00-{TRACE}-{SPAN}-00".encode()]}
        )
        self.assertEqual(ids, {"trace_id": TRACE, "parent_span_id": SPAN})
        clock.advance(10)
        self.assertEqual(exporter.batches, [])

    def test_batches(self) -> None:
        """
        A full batch goes at once, a partial one after the delay; one
        export at a time, the next when it is done.
        """
        tracer, exporter, clock = self.tracer(
            OTEL_BSP_MAX_EXPORT_BATCH_SIZE="3", OTEL_BSP_SCHEDULE_DELAY="1000"
        )
        for _ in range(7):
            tracer.finished(call(), None)
        clock.advance(0)
        self.assertEqual([len(b) for b in exporter.batches], [3])
        exporter.pending[0].callback(True)
        clock.advance(0)
        self.assertEqual([len(b) for b in exporter.batches], [3, 3])
        exporter.pending[1].callback(True)
        clock.advance(0.5)
        self.assertEqual(len(exporter.batches), 2)
        clock.advance(0.5)
        self.assertEqual([len(b) for b in exporter.batches], [3, 3, 1])
        exporter.pending[2].callback(False)
        self.assertEqual(tracer.counts, {"exported": 6, "dropped": 0, "failed": 1})

    def test_queue_is_bounded(self) -> None:
        """A collector that never answers costs the queue's size, no more: the rest are dropped and counted."""
        tracer, exporter, clock = self.tracer(
            OTEL_BSP_MAX_QUEUE_SIZE="4", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="2"
        )
        for _ in range(20):
            tracer.finished(call(), None)
        self.assertEqual(len(tracer.queue), 4)
        self.assertEqual(tracer.counts["dropped"], 16)
        clock.advance(0)
        for _ in range(10):
            tracer.finished(call(), None)
        clock.advance(60)
        # One batch out (never answered), the queue full again behind it.
        self.assertEqual(len(exporter.batches), 1)
        self.assertEqual(len(tracer.queue), 4)
        self.assertEqual(tracer.counts["dropped"], 24)

    def test_stop_sends_what_is_queued(self) -> None:
        """At the stop every queued span goes, batch after batch; none is taken after."""
        tracer, exporter, clock = self.tracer(OTEL_BSP_MAX_EXPORT_BATCH_SIZE="2")
        for _ in range(3):
            tracer.finished(call(), None)
        clock.advance(0)
        stopped = tracer.stop()
        self.assertNoResult(stopped)
        exporter.pending[0].callback(True)
        exporter.pending[1].callback(True)
        self.successResultOf(stopped)
        self.assertEqual([len(b) for b in exporter.batches], [2, 1])
        ids = tracer.finished(call(), {b"traceparent": [PARENT.encode()]})
        self.assertNotIn("span_id", ids)
        self.assertEqual(tracer.queue, [])

    def test_excluded_paths(self) -> None:
        """``OTEL_PYTHON_EXCLUDED_URLS``: no span for a path a pattern finds."""
        tracer, exporter, clock = self.tracer(
            OTEL_PYTHON_EXCLUDED_URLS="^/health$,metrics"
        )
        tracer.finished(call("/health"), None)
        tracer.finished(call("/metrics"), None)
        tracer.finished(call("/healthy"), None)
        clock.advance(5)
        [[span]] = exporter.batches
        self.assertEqual(dict(span.attributes)["url.path"], "/healthy")

    def test_grpc_call(self) -> None:
        """A call of the KEP door's gRPC service has the RPC attributes, not HTTP's."""
        tracer, exporter, clock = self.tracer()
        tracer.finished(
            call("/process.v1.ProcessService/Execute", door="kep", method="POST"), None
        )
        clock.advance(5)
        attributes = dict(exporter.batches[0][0].attributes)
        self.assertEqual(attributes["rpc.method"], "process.v1.ProcessService/Execute")
        self.assertNotIn("http.request.method", attributes)


class GateTests(SynchronousTestCase):
    """The audit line of a call through the gate, with no collector."""

    def test_audit_line_ids(self) -> None:
        """The caller's trace id, its span id and its request id are in the line."""
        context = memory_context({"defaults": {"audit": "all"}})
        gate.audit(
            context,
            door=gate.Door.HTTP,
            endpoint=context.table.get("health"),
            identity=None,
            rule=context.policy.rules["health"],
            method="GET",
            path="/health",
            query="",
            status=200,
            code=None,
            decided_by=None,
            started=0.0,
            headers={b"traceparent": [PARENT.encode()], b"x-request-id": [b"abc"]},
        )
        [line] = context.audit.lines  # type: ignore[attr-defined]
        self.assertEqual(
            (line["trace_id"], line["parent_span_id"], line["request_id"]),
            (TRACE, SPAN, "abc"),
        )


class ChildContextTests(SynchronousTestCase):
    """``TRACEPARENT`` for a child, and the span that must match it."""

    def test_span_sent_is_the_childs_parent(self) -> None:
        """The ids chosen for the child are the span's, kept in the audit fields."""
        tracer, exporter, clock = fake_tracer()
        audit: dict[str, Any] = {}
        env = tracer.child_context(
            {"traceparent": PARENT, "tracestate": "k=v"}, audit, "/shell"
        )
        self.assertEqual(env["TRACESTATE"], "k=v")
        self.assertEqual(env["TRACEPARENT"], f"00-{TRACE}-{audit['span_id']}-01")
        # Asked again (a second child of the same call): the same span.
        self.assertEqual(
            tracer.child_context({"traceparent": PARENT}, audit, "/shell")[
                "TRACEPARENT"
            ],
            env["TRACEPARENT"],
        )
        ids = tracer.finished(
            call("/shell", extra=dict(audit)), {b"traceparent": [PARENT.encode()]}
        )
        self.assertEqual(ids["span_id"], audit["span_id"])
        clock.advance(5)
        [[span]] = exporter.batches
        self.assertEqual(span.span_id.hex(), audit["span_id"])
        self.assertNotIn("sandboxd.span_id", dict(span.attributes))

    def test_ids_of_another_trace_are_not_taken(self) -> None:
        """Ids in the audit fields from another trace than the caller's are ignored."""
        tracer = fake_tracer()[0]
        ids = tracer.finished(
            call(extra={"trace_id": "1" * 32, "span_id": "2" * 16}),
            {b"traceparent": [PARENT.encode()]},
        )
        self.assertEqual(ids["trace_id"], TRACE)
        self.assertNotEqual(ids["span_id"], "2" * 16)

    def test_without_export(self) -> None:
        """Nothing sent: the caller's context as it came, or nothing at all."""
        tracer = Tracer(TraceSettings())
        audit: dict[str, Any] = {}
        unsampled = f"00-{TRACE}-{SPAN}-00"
        self.assertEqual(
            tracer.child_context({"traceparent": unsampled}, audit),
            {"TRACEPARENT": unsampled},
        )
        self.assertEqual(tracer.child_context({}, audit), {})
        self.assertEqual(tracer.child_context({"traceparent": "junk"}, audit), {})
        self.assertEqual(audit, {})

    def test_unsampled_caller_with_export(self) -> None:
        """A caller that does not sample: its own context, unsampled; no ids kept."""
        tracer = fake_tracer()[0]
        audit: dict[str, Any] = {}
        unsampled = f"00-{TRACE}-{SPAN}-00"
        self.assertEqual(
            tracer.child_context({"traceparent": unsampled}, audit),
            {"TRACEPARENT": unsampled},
        )
        self.assertEqual(audit, {})
