"""
Spans through every door to an OTLP collector, as a platform team sees
them: a real daemon on loopback, callers instrumented with OpenTelemetry's
own SDK (their ``traceparent`` injected by its propagator; the MCP SDK's
``_meta`` by the MCP SDK itself), and a stand-in collector that parses what
arrives with OpenTelemetry's own protobuf classes.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.logger import formatEvent, globalLogPublisher
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from sandboxd.access import otlp
from sandboxd.access.tracing import Span, TraceSettings
from sandboxd.daemon import server
from tests.helpers import DaemonTestCase, refusing_port
from tests.kep.case import KepCase

try:
    from google.protobuf import json_format
    from opentelemetry import trace
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )
except ImportError:  # pragma: no cover - the dev extra installs them
    trace_service_pb2 = None

SKIP = (
    "opentelemetry-sdk and opentelemetry-proto are not installed (pip install -e '.[dev]')"
    if trace_service_pb2 is None
    else None
)

#: The caller's spans (the MCP SDK makes its own through the global provider).
CALLER_SPANS = InMemorySpanExporter() if trace_service_pb2 is not None else None
if trace_service_pb2 is not None:
    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(CALLER_SPANS))
    trace.set_tracer_provider(_provider)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Collector(Resource):
    """
    A stand-in OTLP/HTTP collector: keeps each request; answers each with
    the next of ``answers`` (status, headers, body), then 200 and an empty
    response message; ``hold`` keeps requests unanswered.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.answers: list[tuple[int, dict[str, str], bytes]] = []
        self.hold = False
        #: How many requests are answered with a head and then nothing.
        self.stall = 0
        self.held: list[Any] = []

    def render_POST(self, request: Any) -> Any:
        headers = {
            k.decode().lower(): v[-1].decode("latin-1")
            for k, v in request.requestHeaders.getAllRawHeaders()
        }
        self.requests.append((headers, request.content.read()))
        if self.hold:
            self.held.append(request)
            return NOT_DONE_YET
        if self.stall:
            # The head and a byte of the body, then nothing.
            self.stall -= 1
            self.held.append(request)
            request.setHeader(b"content-length", b"100")
            request.write(b"x")
            return NOT_DONE_YET
        if self.answers:
            status, extra, body = self.answers.pop(0)
            request.setResponseCode(status)
            for name, value in extra.items():
                request.setHeader(name, value)
            return body
        request.setHeader(b"content-type", b"application/x-protobuf")
        return trace_service_pb2.ExportTraceServiceResponse().SerializeToString()

    def decoded(self) -> list[Any]:
        """Each request as an ``ExportTraceServiceRequest``."""
        out = []
        for headers, body in self.requests:
            if headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if headers.get("content-type") == "application/json":
                out.append(parse_json(body))
            else:
                out.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
        return out

    def spans(self) -> list[Any]:
        """Every span received, in order."""
        return [
            span
            for message in self.decoded()
            for resource in message.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]


def parse_json(body: bytes) -> Any:
    """
    OTLP/JSON into the protobuf message, as a collector reads it: its ids
    are hex where ProtoJSON would have base64.
    """
    data = json.loads(body)
    for resource in data["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return json_format.ParseDict(data, trace_service_pb2.ExportTraceServiceRequest())


def attributes(span: Any) -> dict[str, Any]:
    """A span's attributes as plain values."""
    out: dict[str, Any] = {}
    for item in span.attributes:
        kind = item.value.WhichOneof("value")
        if kind == "array_value":
            out[item.key] = [v.string_value for v in item.value.array_value.values]
        else:
            out[item.key] = getattr(item.value, kind)
    return out


class TracedDaemon(DaemonTestCase):
    """A daemon whose environment names the stand-in collector."""

    skip = SKIP
    autostart = False
    audit = True
    timeout = 60
    policy = {
        "defaults": {"audit": "all"},
        "auth": {
            "tokens": [
                {"id": "agent", "token_sha256": digest("a"), "scopes": ["*"]},
                {"id": "reader", "token_sha256": digest("r"), "scopes": ["files:read"]},
            ]
        },
    }
    #: Variables beside the collector's endpoint.
    otel: dict[str, str] = {}

    def setUp(self) -> Any:
        super().setUp()
        self.collector = Collector()
        port = reactor.listenTCP(0, Site(self.collector), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.endpoint = f"http://127.0.0.1:{port.getHost().port}"
        return self.start_traced()

    def start_traced(self, **otel: str) -> Any:
        environ = {
            **(self.environ or {}),
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "20",
            **self.otel,
            **otel,
        }
        return self.start(environ=environ)

    def caller_headers(self, name: str = "tool call") -> tuple[dict[str, str], Any]:
        """The headers an instrumented client sends inside its span, and the span."""
        tracer = trace.get_tracer("agent")
        with tracer.start_as_current_span(name) as span:
            carrier: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(carrier)
        return carrier, span.get_span_context()

    def mcp_call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """One tool call through the MCP SDK (in a thread), as ``agent``."""
        import httpx as httpx2
        from mcp.client.client import Client
        from mcp.client.streamable_http import streamable_http_client

        from tests.mcp.helpers import CLIENT_TIMEOUT, in_thread

        url = self.daemon.url + "/mcp"

        async def work() -> Any:
            async with httpx2.AsyncClient(
                headers={"Authorization": "Bearer a"}, timeout=CLIENT_TIMEOUT
            ) as http:
                transport = streamable_http_client(url, http_client=http)
                async with Client(transport) as client:
                    return await client.call_tool(tool, arguments)

        return in_thread(work, CLIENT_TIMEOUT)

    @inlineCallbacks
    def spans(
        self, count: int = 1, seconds: float = 10.0, name: str | None = None
    ) -> Any:
        """
        Wait for ``count`` spans at the collector (named ``name``, if
        given); all it has then.
        """

        def found() -> list[Any]:
            return [s for s in self.collector.spans() if name in (None, s.name)]

        for _ in range(int(seconds / 0.02)):
            if len(found()) >= count:
                break
            yield deferLater(reactor, 0.02, lambda: None)
        self.assertGreaterEqual(len(found()), count, self.collector.requests)
        return found()


class SpanTests(TracedDaemon):
    """One span per call, in the caller's trace, saying what the gate decided."""

    @inlineCallbacks
    def test_call_joins_the_callers_trace(self) -> Any:
        """
        The span is a child of the caller's span, a server span named for
        the endpoint, with the identity and decision; the audit line
        names the same trace and span; the resource says who sent it.
        """
        headers, caller = self.caller_headers()
        headers["X-Request-Id"] = "req-42"
        reply = yield self.request("GET", "/files/list", headers=headers, token="a")
        self.assertEqual(reply.status, 200, reply.body)
        [span] = yield self.spans()
        self.assertEqual(span.trace_id, caller.trace_id.to_bytes(16, "big"))
        self.assertEqual(span.parent_span_id, caller.span_id.to_bytes(8, "big"))
        self.assertEqual(span.name, "files_list")
        self.assertEqual(span.kind, trace_pb2.Span.SPAN_KIND_SERVER)
        self.assertLessEqual(span.start_time_unix_nano, span.end_time_unix_nano)
        found = attributes(span)
        self.assertEqual(found["sandboxd.identity"], "agent")
        self.assertEqual(found["sandboxd.decision"], "allow")
        self.assertEqual(found["sandboxd.door"], "http")
        self.assertEqual(found["sandboxd.request_id"], "req-42")
        self.assertEqual(found["http.request.method"], "GET")
        self.assertEqual(found["http.response.status_code"], 200)
        self.assertEqual(found["url.path"], "/files/list")
        [message] = self.collector.decoded()
        resource = {
            a.key: a.value for a in message.resource_spans[0].resource.attributes
        }
        self.assertEqual(resource["service.name"].string_value, "sandboxd")
        # An int, as the semantic conventions type it, not its text.
        self.assertEqual(resource["process.pid"].WhichOneof("value"), "int_value")
        self.assertEqual(resource["process.pid"].int_value, os.getpid())
        headers_sent = self.collector.requests[0][0]
        self.assertEqual(headers_sent["content-type"], "application/x-protobuf")
        line = [r for r in self.audit_lines() if r["endpoint"] == "files_list"][-1]
        self.assertEqual(line["trace_id"], span.trace_id.hex())
        self.assertEqual(line["span_id"], span.span_id.hex())
        self.assertEqual(line["request_id"], "req-42")

    @inlineCallbacks
    def test_refusal(self) -> Any:
        """
        A refused call's span says who was refused, by which rule, with
        which code; a refusal is not the daemon's error, so the span's
        status is unset.
        """
        reply = yield self.request("POST", "/shell", {"command": "true"}, token="r")
        self.assertEqual(reply.status, 403, reply.body)
        [span] = yield self.spans()
        found = attributes(span)
        self.assertEqual(found["sandboxd.decision"], "deny")
        self.assertEqual(found["sandboxd.code"], "missing_scope")
        self.assertEqual(found["sandboxd.identity"], "reader")
        self.assertIn("sandboxd.rule", found)
        self.assertEqual(span.status.code, 0)
        self.assertFalse(span.parent_span_id)

    @inlineCallbacks
    def test_command_and_its_argv(self) -> Any:
        """A command's span carries what ran, as the audit line has it."""
        reply = yield self.request(
            "POST", "/shell", {"command": "echo traced"}, token="a"
        )
        self.assertEqual(reply.status, 200, reply.body)
        [span] = yield self.spans()
        self.assertEqual(span.name, "shell")
        self.assertIn("echo traced", " ".join(attributes(span)["sandboxd.argv"]))

    @inlineCallbacks
    def test_link_in_argv_masked(self) -> Any:
        """
        A capability link a command passes on (in a URL's query, in a
        header) is masked in the span's argv and the audit line's alike.
        """
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["files:read"]},
            token="a",
        )
        self.assertEqual(minted.status, 201, minted.body)
        link = minted.json()["token"]
        command = f"true 'http://h/?sbx_link={link}' -H 'X-Access-Token: {link}'"
        reply = yield self.request("POST", "/shell", {"command": command}, token="a")
        self.assertEqual(reply.status, 200, reply.body)
        [span] = yield self.spans(name="shell")
        argv = " ".join(attributes(span)["sandboxd.argv"])
        self.assertIn("?sbx_link=***", argv)
        self.assertIn("X-Access-Token: ***", argv)
        self.assertNotIn("sbxl_", argv)
        line = [r for r in self.audit_lines() if r["endpoint"] == "shell"][-1]
        self.assertNotIn("sbxl_", json.dumps(line))

    @inlineCallbacks
    def test_unsampled_caller(self) -> Any:
        """
        A caller that does not sample its trace gets no span, but its ids
        are in the audit line.
        """
        headers, caller = self.caller_headers()
        headers["traceparent"] = headers["traceparent"][:-2] + "00"
        reply = yield self.request("GET", "/files/list", headers=headers, token="a")
        self.assertEqual(reply.status, 200)
        reply = yield self.request("GET", "/health")
        yield self.spans(1)
        self.assertEqual([s.name for s in self.collector.spans()], ["health"])
        line = [r for r in self.audit_lines() if r["endpoint"] == "files_list"][-1]
        self.assertEqual(line["trace_id"], f"{caller.trace_id:032x}")
        self.assertEqual(line["parent_span_id"], f"{caller.span_id:016x}")
        self.assertNotIn("span_id", line)

    @inlineCallbacks
    def test_metrics_count_exported_spans(self) -> Any:
        """``/metrics`` counts the spans the collector took."""
        yield self.request("GET", "/health")
        yield self.spans(1)
        for _ in range(100):
            reply = yield self.request("GET", "/metrics", token="a")
            if (
                'sandboxd_trace_spans_total{result="exported"} 1.0'
                in reply.body.decode()
            ):
                break
            yield deferLater(reactor, 0.02, lambda: None)
        self.assertIn(
            'sandboxd_trace_spans_total{result="exported"} 1.0', reply.body.decode()
        )

    @inlineCallbacks
    def test_stop_sends_the_last_spans(self) -> Any:
        """Spans still queued when the daemon stops reach the collector first."""
        yield self.daemon.stop()
        yield self.start_traced(OTEL_BSP_SCHEDULE_DELAY="600000")
        yield self.request("GET", "/health")
        self.assertEqual(self.collector.spans(), [])
        yield self.daemon.stop()
        self.assertEqual([s.name for s in self.collector.spans()], ["health"])


FILE_TOKEN = "file-token-s43-0123456789"
HASHED_TOKEN = "hashed-token-s43-0123456789"


class TokensMaskedTests(TracedDaemon):
    """
    No span and no audit line holds a token, whatever its source: a file,
    a hash (known from the moment it is presented), the environment.
    """

    def setUp(self) -> Any:
        folder = os.path.realpath(self.mktemp())
        os.makedirs(folder)
        self.token_file = os.path.join(folder, "token")
        with open(self.token_file, "w") as f:
            f.write(FILE_TOKEN + "\n")
        self.policy = {
            "defaults": {"audit": "all"},
            "auth": {
                "tokens": [
                    {"id": "agent", "token_file": self.token_file, "scopes": ["*"]},
                    {
                        "id": "hashed",
                        "token_sha256": digest(HASHED_TOKEN),
                        "scopes": ["*"],
                    },
                ]
            },
        }
        return super().setUp()

    @inlineCallbacks
    def test_file_and_hashed_tokens_masked(self) -> Any:
        """
        A command that prints a file's token and the caller's own hashed
        token: the span's argv and the audit line have neither, the output
        (the caller's own) is untouched.
        """
        command = f"echo {FILE_TOKEN} Bearer={HASHED_TOKEN}"
        reply = yield self.request(
            "POST", "/shell", {"command": command}, token=HASHED_TOKEN
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertIn(FILE_TOKEN, reply.json()["stdout"])
        [span] = yield self.spans(name="shell")
        argv = " ".join(attributes(span)["sandboxd.argv"])
        self.assertIn("echo *** Bearer=***", argv)
        line = [r for r in self.audit_lines() if r["endpoint"] == "shell"][-1]
        self.assertIn("echo *** Bearer=***", " ".join(line["argv"]))
        for token in (FILE_TOKEN, HASHED_TOKEN):
            self.assertNotIn(token, json.dumps(line))
            self.assertNotIn(token.encode(), self.collector.requests[-1][1])


class QuietConnectionTests(TracedDaemon):
    """The exporter's connections to the collector are not in the daemon's log."""

    @inlineCallbacks
    def test_no_factory_lines(self) -> Any:
        """Spans sent (a connection opened and closed): no factory start or stop line."""
        events: list[str] = []
        observer = lambda event: events.append(formatEvent(event))  # noqa: E731
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        yield self.request("GET", "/health")
        yield self.spans(1)
        yield self.daemon.stop()
        # The test's own client logs its connections: only the collector's count.
        collector = self.endpoint.rsplit(":", 1)[1]
        self.assertEqual(
            [e for e in events if "factory" in e.lower() and f":{collector}>" in e], []
        )


class ExcludedTests(TracedDaemon):
    """``OTEL_PYTHON_EXCLUDED_URLS``: probes that should not fill the traces."""

    otel = {"OTEL_PYTHON_EXCLUDED_URLS": "^/health$"}

    @inlineCallbacks
    def test_probe_excluded(self) -> Any:
        """A path matching ``OTEL_PYTHON_EXCLUDED_URLS`` (the probe) sends no span; the next call does."""
        yield self.request("GET", "/health")
        yield self.request("GET", "/files/list", token="a")
        spans = yield self.spans(1)
        self.assertEqual([s.name for s in spans], ["files_list"])


class JsonTests(TracedDaemon):
    """OTLP/JSON, gzip and the configured headers."""

    otel = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=s3cret%20key,x-team=blue",
        "OTEL_SERVICE_NAME": "sandbox-17",
    }

    @inlineCallbacks
    def test_json_gzip_headers(self) -> Any:
        """OTLP/JSON, gzipped, with the configured headers (percent-decoded) and the service name."""
        headers, caller = self.caller_headers()
        yield self.request("GET", "/files/list", headers=headers, token="a")
        [span] = yield self.spans()
        sent, _ = self.collector.requests[0]
        self.assertEqual(sent["content-type"], "application/json")
        self.assertEqual(sent["content-encoding"], "gzip")
        self.assertEqual(sent["x-api-key"], "s3cret key")
        self.assertEqual(sent["x-team"], "blue")
        self.assertEqual(span.trace_id, caller.trace_id.to_bytes(16, "big"))
        self.assertEqual(attributes(span)["http.response.status_code"], 200)
        resource = {
            a.key: a.value.string_value
            for a in self.collector.decoded()[0].resource_spans[0].resource.attributes
        }
        self.assertEqual(resource["service.name"], "sandbox-17")

    @inlineCallbacks
    def test_collector_headers_reach_no_child(self) -> Any:
        """
        The collector's credentials are the daemon's secret: a command
        does not see them, and may not set them.
        """
        os.environ["OTEL_EXPORTER_OTLP_HEADERS"] = "x-api-key=leak"
        self.addCleanup(os.environ.pop, "OTEL_EXPORTER_OTLP_HEADERS")
        reply = yield self.request("POST", "/shell", {"command": "env"}, token="a")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertNotIn("leak", reply.body.decode())
        reply = yield self.request(
            "POST",
            "/shell",
            {"command": "true", "env": {"OTEL_EXPORTER_OTLP_HEADERS": "x=1"}},
            token="a",
        )
        self.assertEqual(reply.status, 403, reply.body)
        self.assertEqual(reply.json()["code"], "protected_variable")


class CollectorTroubleTests(TracedDaemon):
    """A collector that is busy, refuses, or is not there costs the calls nothing."""

    otel = {"OTEL_BSP_EXPORT_TIMEOUT": "5000"}

    @inlineCallbacks
    def test_busy_collector_is_retried(self) -> Any:
        """503 with ``Retry-After``, then 429: the batch is sent again, and arrives."""
        self.collector.answers = [
            (503, {"retry-after": "0"}, b"busy"),
            (429, {"retry-after": "0.1"}, b"slow down"),
        ]
        yield self.request("GET", "/health")
        spans = yield self.spans(3)
        self.assertEqual({s.name for s in spans}, {"health"})
        # The collector has the third request before the daemon reads its answer.
        tracer = self.daemon.context.tracer
        for _ in range(100):
            if tracer.counts["exported"]:
                break
            yield deferLater(reactor, 0.02, lambda: None)
        self.assertEqual(len(self.collector.requests), 3)
        self.assertEqual(tracer.counts["exported"], 1)

    @inlineCallbacks
    def test_refusing_collector_drops_the_batch(self) -> Any:
        """A 400 is not retried: the batch is dropped and counted as failed."""
        self.collector.answers = [(400, {}, b"bad")]
        yield self.request("GET", "/health")
        yield self.spans(1)
        for _ in range(100):
            if self.daemon.context.tracer.counts["failed"]:
                break
            yield deferLater(reactor, 0.02, lambda: None)
        self.assertEqual(self.daemon.context.tracer.counts["failed"], 1)
        self.assertEqual(len(self.collector.requests), 1)


class CaBundleTests(TracedDaemon):
    """
    ``OTEL_EXPORTER_OTLP_CERTIFICATE`` names a bundle of CAs, as cluster,
    company and system bundles are: the collector's CA is trusted wherever
    it is in the file, not only first.
    """

    def setUp(self) -> Any:
        from twisted.internet import ssl

        from tests.git.remote import make_ca

        DaemonTestCase.setUp(self)
        self.collector = Collector()
        pems = []
        for name in ("other CA", "collector CA"):
            directory = os.path.realpath(self.mktemp())
            os.makedirs(directory)
            ca, cert, key = make_ca(directory, name)
            with open(ca, "rb") as f:
                pems.append(f.read())
        with open(cert, "rb") as f, open(key, "rb") as k:
            server = ssl.PrivateCertificate.loadPEM(f.read() + k.read())
        port = reactor.listenSSL(
            0, Site(self.collector), server.options(), interface="127.0.0.1"
        )
        self.addCleanup(port.stopListening)
        self.endpoint = f"https://127.0.0.1:{port.getHost().port}"
        self.bundle = os.path.abspath(self.mktemp())
        with open(self.bundle, "wb") as f:
            f.write(b"".join(pems))
        return self.start_traced(OTEL_EXPORTER_OTLP_CERTIFICATE=self.bundle)

    @inlineCallbacks
    def test_second_ca_of_the_bundle_trusted(self) -> Any:
        """The collector's CA, second in the bundle, is trusted: the span arrives over TLS."""
        yield self.request("GET", "/health")
        spans = yield self.spans(1)
        self.assertEqual(spans[0].name, "health")
        self.assertEqual(self.daemon.context.tracer.counts["failed"], 0)

    def test_file_without_certificate(self) -> None:
        """A file with no certificate in it is named as unusable, as the start warns."""
        empty = self.mktemp()
        with open(empty, "w") as f:
            f.write("not a bundle\n")
        settings = TraceSettings.from_environ(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
                "OTEL_EXPORTER_OTLP_CERTIFICATE": empty,
            }
        )
        problem = otlp.certificate_problem(settings)
        assert problem is not None
        self.assertIn(empty, problem)


class StalledCollectorTests(TracedDaemon):
    """A collector that sends its answer's head and then stalls is timed out and tried again."""

    otel = {"OTEL_EXPORTER_OTLP_TIMEOUT": "300", "OTEL_BSP_EXPORT_TIMEOUT": "10000"}

    def tearDown(self) -> None:
        for request in self.collector.held:
            if request.channel is not None:
                request.channel.transport.abortConnection()

    @inlineCallbacks
    def test_stalled_answer(self) -> Any:
        """A collector that sends a head and stalls is cut at the timeout and the batch retried."""
        self.collector.stall = 1
        yield self.request("GET", "/health")
        spans = yield self.spans(2)
        self.assertEqual([s.name for s in spans], ["health", "health"])
        for _ in range(100):
            if self.daemon.context.tracer.counts["exported"]:
                break
            yield deferLater(reactor, 0.02, lambda: None)
        self.assertEqual(self.daemon.context.tracer.counts["exported"], 1)


class UnreachableTests(TracedDaemon):
    """No collector at the address: calls are answered as always."""

    def setUp(self) -> Any:
        self.unreachable = f"http://127.0.0.1:{refusing_port(self)}"
        return super().setUp()

    def start_traced(self, **otel: str) -> Any:
        return super().start_traced(
            OTEL_EXPORTER_OTLP_ENDPOINT=self.unreachable,
            OTEL_BSP_EXPORT_TIMEOUT="300",
            **otel,
        )

    @inlineCallbacks
    def test_calls_go_on(self) -> Any:
        """Calls are answered while every export fails; the failures are counted."""
        for _ in range(3):
            reply = yield self.request("GET", "/health")
            self.assertEqual(reply.status, 200)
        tracer = self.daemon.context.tracer
        for _ in range(200):
            if tracer.counts["failed"] == 3:
                break
            yield deferLater(reactor, 0.02, lambda: None)
        self.assertEqual(tracer.counts["failed"], 3)


class UnreachableAtStopTests(TracedDaemon):
    """A collector that cannot be reached holds the daemon's stop no longer than its bound."""

    def setUp(self) -> Any:
        self.unreachable = f"http://127.0.0.1:{refusing_port(self)}"
        self.patch(server, "TRACE_STOP_SECONDS", 1.0)
        return super().setUp()

    def start_traced(self, **otel: str) -> Any:
        # An export being retried when the stop begins, with a long deadline of its own.
        return super().start_traced(
            OTEL_EXPORTER_OTLP_ENDPOINT=self.unreachable,
            OTEL_BSP_EXPORT_TIMEOUT="20000",
            **otel,
        )

    @inlineCallbacks
    def test_stop_is_bounded(self) -> Any:
        """
        The stop gives up on the export under way at its bound, with no
        retry after it, and the log says why the spans were dropped.
        """
        events: list[str] = []
        observer = lambda event: events.append(formatEvent(event))  # noqa: E731
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        yield self.request("GET", "/health")
        tracer = self.daemon.context.tracer
        for _ in range(100):
            if tracer._sending is not None:
                break
            yield deferLater(reactor, 0.02, lambda: None)
        # A second batch waits behind the one being retried.
        yield self.request("GET", "/health")
        self.assertEqual(len(tracer.queue), 1)
        started = reactor.seconds()
        yield self.daemon.stop()
        self.assertLess(reactor.seconds() - started, 3.0)
        self.assertEqual(tracer.counts["failed"], 2)
        dropped = [e for e in events if "dropped" in e]
        self.assertIn(
            ": the daemon stopped before the collector took them; 1 span(s) dropped",
            dropped[0],
        )
        self.assertIn(
            "the daemon stopped before 1 queued span(s) could be sent; dropped",
            dropped[1],
        )


class SilentAtStopTests(TracedDaemon):
    """
    A collector that takes the request and never answers holds the stop no
    longer than its bound, and is sent nothing after it.
    """

    otel = {"OTEL_EXPORTER_OTLP_TIMEOUT": "15000", "OTEL_BSP_EXPORT_TIMEOUT": "20000"}

    def setUp(self) -> Any:
        self.patch(server, "TRACE_STOP_SECONDS", 1.0)
        return super().setUp()

    def tearDown(self) -> None:
        for request in self.collector.held:
            if request.channel is not None:
                request.channel.transport.abortConnection()

    @inlineCallbacks
    def test_stop_is_bounded(self) -> Any:
        """
        The request in flight is cut at the stop's bound and no new attempt
        follows: the stop is over within the bound and the collector gets
        the one request.
        """
        self.collector.hold = True
        yield self.request("GET", "/health")
        yield self.spans(1)
        started = reactor.seconds()
        yield self.daemon.stop()
        self.assertLess(reactor.seconds() - started, 3.0)
        self.assertEqual(self.daemon.context.tracer.counts["failed"], 1)
        # A retry would come a second after the cut.
        yield deferLater(reactor, 1.5, lambda: None)
        self.assertEqual(len(self.collector.requests), 1)


class McpTests(TracedDaemon):
    """
    The MCP SDK puts its span's context in each request's ``_meta``: a
    tool's span is the child of the SDK's ``tools/call`` span.
    """

    @inlineCallbacks
    def test_tool_call_joins_the_sdks_trace(self) -> Any:
        """A tool's span is the child of the MCP SDK's own ``tools/call`` span."""
        CALLER_SPANS.clear()
        yield self.mcp_call("files_list", {})
        calls = [s for s in CALLER_SPANS.get_finished_spans() if "tools/call" in s.name]
        self.assertEqual(
            len(calls), 1, [s.name for s in CALLER_SPANS.get_finished_spans()]
        )
        caller = calls[0].get_span_context()
        [tool] = yield self.spans(name="files_list")
        self.assertEqual(tool.trace_id, caller.trace_id.to_bytes(16, "big"))
        self.assertEqual(tool.parent_span_id, caller.span_id.to_bytes(8, "big"))
        found = attributes(tool)
        self.assertEqual(found["sandboxd.door"], "mcp")
        self.assertEqual(found["sandboxd.tool"], "files_list")
        self.assertEqual(found["sandboxd.identity"], "agent")


class McpWithoutContextTests(TracedDaemon):
    """
    A tool call from a client that sends no trace context is one trace:
    the tool's span is the child of the POST's that carried it.
    """

    @inlineCallbacks
    def test_tool_span_is_the_posts_child(self) -> Any:
        """The ``files_list`` span's parent is the ``mcp`` span of its POST, in its trace."""
        headers = {
            "Accept": "application/json, text/event-stream",
            "Authorization": "Bearer a",
        }

        def post(message: dict[str, Any], session: str | None = None) -> Any:
            sent = dict(headers, **({"Mcp-Session-Id": session} if session else {}))
            return self.request(
                "POST", "/mcp", {"jsonrpc": "2.0", **message}, headers=sent, token=None
            )

        opened = yield post(
            {
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"},
                },
            }
        )
        session = opened.header("mcp-session-id")
        yield post({"method": "notifications/initialized"}, session)
        called = yield post(
            {
                "id": 2,
                "method": "tools/call",
                "params": {"name": "files_list", "arguments": {}},
            },
            session,
        )
        self.assertEqual(called.status, 200, called.body)
        [tool] = yield self.spans(name="files_list")
        posts = yield self.spans(3, name="mcp")
        [carrier] = [s for s in posts if s.span_id == tool.parent_span_id]
        self.assertEqual(carrier.trace_id, tool.trace_id)
        self.assertFalse(carrier.parent_span_id)


class EncodingTests(DaemonTestCase):
    """What the exporter writes, against OpenTelemetry's own classes."""

    skip = SKIP
    autostart = False

    def span(self) -> Span:
        return Span(
            trace_id=bytes(range(16)),
            span_id=bytes(range(1, 9)),
            parent_span_id=bytes(range(2, 10)),
            trace_state="vendor=x",
            name="files_read",
            start_ns=1_700_000_000_000_000_000,
            end_ns=1_700_000_000_250_000_000,
            attributes=(
                ("sandboxd.identity", "agent"),
                ("http.response.status_code", 500),
                ("sandboxd.flag", True),
                ("sandboxd.argv", ("ls", "-l", "é")),
            ),
            error="internal",
        )

    def test_protobuf_and_json_say_the_same(self) -> None:
        """The hand-written encoders give what opentelemetry-proto parses, alike in both forms."""
        resource = (
            ("service.name", "sandboxd"),
            ("k8s.pod.name", "pod-ü"),
            ("process.pid", 4242),
        )
        root = Span(
            trace_id=bytes(range(16)),
            span_id=bytes(range(3, 11)),
            parent_span_id=None,
            trace_state="",
            name="health",
            start_ns=1,
            end_ns=2,
            attributes=(("sandboxd.status", -1),),
        )
        spans = [self.span(), root]
        binary = trace_service_pb2.ExportTraceServiceRequest.FromString(
            otlp.encode_protobuf(spans, resource)
        )
        self.assertEqual(binary, parse_json(otlp.encode_json(spans, resource)))
        [span, second] = binary.resource_spans[0].scope_spans[0].spans
        self.assertEqual(second.flags, 0x101)
        self.assertFalse(second.parent_span_id)
        self.assertFalse(second.HasField("status"))
        self.assertEqual(attributes(second)["sandboxd.status"], -1)
        self.assertEqual(
            binary.resource_spans[0].resource.attributes[1].value.string_value, "pod-ü"
        )
        self.assertEqual(
            binary.resource_spans[0].resource.attributes[2].value.int_value, 4242
        )
        self.assertEqual(binary.resource_spans[0].scope_spans[0].scope.name, "sandboxd")
        self.assertEqual(span.start_time_unix_nano, 1_700_000_000_000_000_000)
        self.assertEqual(span.status.code, span.status.STATUS_CODE_ERROR)
        self.assertEqual(span.status.message, "internal")
        self.assertEqual(span.flags, 0x301)
        self.assertEqual(attributes(span)["sandboxd.argv"], ["ls", "-l", "é"])
        self.assertEqual(attributes(span)["http.response.status_code"], 500)

    def test_partial_success(self) -> None:
        """A collector's partial success is read in either encoding."""
        answer = trace_service_pb2.ExportTraceServiceResponse()
        answer.partial_success.rejected_spans = 3
        answer.partial_success.error_message = "too old"
        self.assertEqual(
            otlp.rejected(answer.SerializeToString(), False), (3, "too old")
        )
        self.assertEqual(
            otlp.rejected(json_format.MessageToJson(answer).encode(), True),
            (3, "too old"),
        )
        self.assertEqual(otlp.rejected(b"<html>", True), (0, ""))
        self.assertEqual(otlp.rejected(b"\xff\xff", False), (0, ""))

    def test_settings_without_endpoint_make_no_exporter(self) -> None:
        """No endpoint, or an unreadable CA file: no exporter, and the problem said."""
        from sandboxd.daemon.server import build_tracer

        self.assertIsNone(build_tracer({}, reactor).exporter)
        tracer = build_tracer(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318",
                "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent.pem",
            },
            reactor,
        )
        self.assertIsNone(tracer.exporter)
        self.assertIn("cannot be read", tracer.problems[-1])
        self.assertIsInstance(TraceSettings.from_environ({}), TraceSettings)


class KepGrpcTests(TracedDaemon, KepCase):
    """A gRPC call carries its trace context in metadata, as gRPC's instrumentation sends it."""

    grpc = True

    @inlineCallbacks
    def test_execute_joins_the_callers_trace(self) -> Any:
        """A gRPC ``Execute`` with the caller's context in its metadata joins its trace."""
        import grpc

        from tests.kep.test_process import stubs

        pb, pb_grpc = stubs()
        channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.addCleanup(channel.close)
        headers, caller = self.caller_headers()
        metadata = [("authorization", "Bearer a"), *headers.items()]
        reply = yield self.blocking(
            pb_grpc.ProcessServiceStub(channel).Execute,
            pb.ExecuteRequest(
                config=pb.ProcessConfig(command=["printenv", "TRACEPARENT"])
            ),
            metadata=metadata,
            timeout=20,
        )
        self.assertEqual(reply.exit_code, 0)
        [span] = yield self.spans(name="shell")
        self.assertEqual(span.trace_id, caller.trace_id.to_bytes(16, "big"))
        self.assertEqual(span.parent_span_id, caller.span_id.to_bytes(8, "big"))
        values = attributes(span)
        self.assertEqual(values["rpc.system"], "grpc")
        self.assertEqual(values["rpc.method"], "process.v1.ProcessService/Execute")
        self.assertEqual(values["sandboxd.door"], "kep")
        self.assertNotIn("http.request.method", values)
        # The command's environment names the same span.
        self.assertEqual(
            reply.stdout.decode().strip(),
            f"00-{span.trace_id.hex()}-{span.span_id.hex()}-01",
        )


class ClientTests(TracedDaemon):
    """
    sandboxd's own client, in a program that uses OpenTelemetry, sends the
    program's trace context with each call (blocking and asyncio).
    """

    @inlineCallbacks
    def test_both_faces_send_the_context(self) -> Any:
        """Both faces of the client send the program's current span with each call."""
        from sandboxd.client import AsyncSandbox, Sandbox
        from tests.mcp.helpers import CLIENT_TIMEOUT, in_thread

        tracer = trace.get_tracer("agent")
        url = self.daemon.url

        def blocking() -> Any:
            with tracer.start_as_current_span("blocking step") as span:
                with Sandbox(url, token="a") as sb:
                    sb.files.list(".")
            return span.get_span_context()

        async def in_loop() -> Any:
            with tracer.start_as_current_span("async step") as span:
                async with AsyncSandbox(url, token="a") as sb:
                    await sb.files.list(".")
            return span.get_span_context()

        async def blocking_in_thread() -> Any:
            return blocking()

        # Each in a thread of its own (the reactor's pool is the daemon's).
        first = yield in_thread(blocking_in_thread, CLIENT_TIMEOUT)
        second = yield in_thread(in_loop, CLIENT_TIMEOUT)
        spans = yield self.spans(2)
        parents = {(s.trace_id, s.parent_span_id) for s in spans}
        for caller in (first, second):
            self.assertIn(
                (
                    caller.trace_id.to_bytes(16, "big"),
                    caller.span_id.to_bytes(8, "big"),
                ),
                parents,
            )


class ChildContextTests(TracedDaemon):
    """
    A command started by a traced call gets ``TRACEPARENT`` (OpenTelemetry's
    environment carrier): the daemon's span of the call, so a test runner
    instrumented with OpenTelemetry nests its spans under it.
    """

    @inlineCallbacks
    def test_child_parent_is_the_calls_span(self) -> Any:
        """A child's ``TRACEPARENT`` names the span sent for its call; ``TRACESTATE`` is the caller's."""
        headers, caller = self.caller_headers()
        headers["tracestate"] = "vendor=v1"
        reply = yield self.request(
            "POST",
            "/shell",
            {"command": "printenv TRACEPARENT TRACESTATE"},
            headers=headers,
            token="a",
        )
        self.assertEqual(reply.status, 200, reply.body)
        traceparent, state = reply.json()["stdout"].split()
        [span] = yield self.spans()
        self.assertEqual(
            traceparent, f"00-{span.trace_id.hex()}-{span.span_id.hex()}-01"
        )
        self.assertEqual(span.trace_id, caller.trace_id.to_bytes(16, "big"))
        self.assertEqual(span.parent_span_id, caller.span_id.to_bytes(8, "big"))
        self.assertEqual(state, "vendor=v1")
        line = [r for r in self.audit_lines() if r["endpoint"] == "shell"][-1]
        self.assertEqual(line["span_id"], span.span_id.hex())
        self.assertNotIn("sandboxd.span_id", attributes(span))

    @inlineCallbacks
    def test_root_call_and_callers_own_value(self) -> Any:
        """
        A call with no context starts the trace its child joins; a value
        the caller sets in the command's ``env`` is kept.
        """
        reply = yield self.request(
            "POST", "/shell", {"command": "printenv TRACEPARENT"}, token="a"
        )
        [span] = yield self.spans()
        self.assertEqual(
            reply.json()["stdout"].strip(),
            f"00-{span.trace_id.hex()}-{span.span_id.hex()}-01",
        )
        own = f"00-{'a' * 32}-{'b' * 16}-01"
        reply = yield self.request(
            "POST",
            "/shell",
            {"command": "printenv TRACEPARENT", "env": {"TRACEPARENT": own}},
            token="a",
        )
        self.assertEqual(reply.json()["stdout"].strip(), own)

    @inlineCallbacks
    def test_unsampled_caller(self) -> Any:
        """A caller that does not sample passes its context on as it came."""
        headers, _ = self.caller_headers()
        headers["traceparent"] = headers["traceparent"][:-2] + "00"
        reply = yield self.request(
            "POST",
            "/shell",
            {"command": "printenv TRACEPARENT"},
            headers=headers,
            token="a",
        )
        self.assertEqual(reply.json()["stdout"].strip(), headers["traceparent"])
        line = [r for r in self.audit_lines() if r["endpoint"] == "shell"][-1]
        self.assertNotIn("span_id", line)

    @inlineCallbacks
    def test_through_mcp(self) -> Any:
        """Through the MCP door too: the tool's child is in the SDK's trace."""
        result = yield self.mcp_call("shell", {"command": "printenv TRACEPARENT"})
        text = json.dumps(result.model_dump(mode="json"))
        [span] = yield self.spans(name="shell")
        self.assertIn(f"00-{span.trace_id.hex()}-{span.span_id.hex()}-01", text)


class ChildContextWithoutCollectorTests(DaemonTestCase):
    """With no collector, a child gets the caller's context as it came."""

    skip = SKIP
    token = "t"

    @inlineCallbacks
    def test_passed_on(self) -> Any:
        """With no collector, a caller's context reaches its child as it came; a call without one passes none."""
        value = f"00-{'c' * 32}-{'d' * 16}-01"
        reply = yield self.request(
            "POST",
            "/shell",
            {"command": "printenv TRACEPARENT"},
            headers={"traceparent": value},
        )
        self.assertEqual(reply.json()["stdout"].strip(), value)
        reply = yield self.request("POST", "/shell", {"command": "env"})
        self.assertNotIn("TRACEPARENT", reply.json()["stdout"])
