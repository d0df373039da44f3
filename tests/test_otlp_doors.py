"""
Spans through the doors :mod:`tests.test_otlp` does not drive: the
terminal WebSocket, the ``/v1/responses`` WebSocket, the E2B port (envd's
Connect-RPC and its REST ``/files``), the preview door and the KEP REST
port.  Each is driven by the client its users run, inside a span of an
instrumented caller; the stand-in collector must then hold a server span
in the caller's trace, its parent the caller's span, named for the
endpoint the call was governed as, with the door and the status the
caller saw.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.threads import deferToThread

from tests.e2b.sdk import E2BCase
from tests.kep.case import KepCase
from tests.openai_api.sdk import TOKENS as OPENAI_TOKENS
from tests.openai_api.sdk import OpenAICase, openai_policy
from tests.preview.upstream import App
from tests.terminals.wsclient import quiet_server
from tests.test_otlp import CALLER_SPANS, TracedDaemon, attributes

#: A client call (a handshake, a page) is over within this many seconds.
CALL_SECONDS = 20.0


def missing(module: str, package: str) -> str | None:
    """Why a test cannot run without ``module``, or None when it is installed."""
    if importlib.util.find_spec(module) is None:
        return f"{package} is not installed (pip install -e '.[dev]')"
    return None


def off_reactor(fn: Callable[[], Any]) -> Deferred[Any]:
    """A blocking client call in a thread, bounded; its result."""
    d = deferToThread(fn)
    d.addTimeout(CALL_SECONDS, reactor)
    return d


class DoorSpans(TracedDaemon):
    """A traced daemon, and what a door's span must say."""

    def assert_child(
        self,
        span: Any,
        caller: Any,
        *,
        endpoint: str,
        door: str,
        status: int,
        identity: str = "agent",
    ) -> dict[str, Any]:
        """
        ``span`` is the daemon's server span of a call made inside
        ``caller``: its child, named for ``endpoint``, saying ``door``,
        ``status`` and who called; its attributes.
        """
        from opentelemetry.proto.trace.v1 import trace_pb2

        self.assertEqual(span.name, endpoint)
        self.assertEqual(span.kind, trace_pb2.Span.SPAN_KIND_SERVER)
        self.assertEqual(span.trace_id.hex(), f"{caller.trace_id:032x}")
        self.assertEqual(span.parent_span_id.hex(), f"{caller.span_id:016x}")
        found = attributes(span)
        self.assertEqual(found["sandboxd.endpoint"], endpoint)
        self.assertEqual(found["sandboxd.door"], door)
        self.assertEqual(found["sandboxd.status"], status)
        self.assertEqual(found["sandboxd.decision"], "allow")
        self.assertEqual(found["sandboxd.identity"], identity)
        self.assertEqual(span.status.code, 0)
        return found

    @inlineCallbacks
    def span_of(self, caller: Any, endpoint: str) -> Any:
        """The one span named ``endpoint`` in ``caller``'s trace (waited for)."""
        spans = yield self.spans(name=endpoint)
        trace_id = caller.trace_id.to_bytes(16, "big")
        mine = [s for s in spans if s.trace_id == trace_id]
        self.assertEqual(len(mine), 1, [(s.name, s.trace_id.hex()) for s in spans])
        return mine[0]


class TerminalSocketTests(DoorSpans):
    """The terminal WebSocket (``/pty`` on the PTY port), attached with websocket-client."""

    skip = TracedDaemon.skip or missing("websocket", "websocket-client")

    @inlineCallbacks
    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        daemon = yield super().start(stop_at_end, **kwargs)
        quiet_server(daemon.context.terminals)
        return daemon

    @inlineCallbacks
    def test_attach_joins_the_callers_trace(self) -> Any:
        """
        The handshake's ``traceparent`` makes ``pty_connect``'s span (door
        ``ws``, status 101, the switch the client saw) a child of the
        caller's span.
        """
        import websocket

        reply = yield self.request("POST", "/pty/sessions", {"shell": "sh"}, token="a")
        self.assertEqual(reply.status, 200, reply.body)
        sid = reply.json()["session_id"]
        headers, caller = self.caller_headers("attach")
        url = f"ws://127.0.0.1:{self.daemon.context.pty_port}/pty?session_id={sid}"

        def attach() -> int:
            ws = websocket.create_connection(
                url,
                header=[
                    "Authorization: Bearer a",
                    *(f"{k}: {v}" for k, v in headers.items()),
                ],
                timeout=10,
            )
            try:
                return int(ws.getstatus())
            finally:
                ws.close()

        status = yield off_reactor(attach)
        self.assertEqual(status, 101)
        span = yield self.span_of(caller, "pty_connect")
        found = self.assert_child(
            span, caller, endpoint="pty_connect", door="ws", status=101
        )
        self.assertEqual(found["http.request.method"], "GET")
        self.assertEqual(found["url.path"], "/pty")


class ResponsesSocketTests(DoorSpans, OpenAICase):
    """The ``/v1/responses`` WebSocket, through the ``openai`` SDK's ``responses.connect()``."""

    skip = TracedDaemon.skip or missing("openai", "openai")
    policy = {**openai_policy(), "defaults": {"audit": "all"}}
    environ = OPENAI_TOKENS

    @inlineCallbacks
    def test_socket_and_create_join_the_callers_trace(self) -> Any:
        """
        The SDK's extra handshake headers carry the caller's context: the
        upgrade (``agents_responses_connect``, 101) and the
        ``response.create`` sent on the socket (``agents_responses_create``,
        200) are both children of the caller's span, door ``openai``.
        """
        from tests.openai_api.test_responses_ws import until_end

        client = self.client()
        headers, caller = self.caller_headers("agent turn")

        def run() -> Any:
            with client.responses.connect(extra_headers=headers) as connection:
                connection.send(
                    {"type": "response.create", "model": "fake", "input": "echo one"}
                )
                return until_end(connection)

        events = yield self.sdk(run)
        self.assertEqual(events[-1].type, "response.completed", events[-1])
        span = yield self.span_of(caller, "agents_responses_connect")
        self.assert_child(
            span,
            caller,
            endpoint="agents_responses_connect",
            door="openai",
            status=101,
            identity="user",
        )
        span = yield self.span_of(caller, "agents_responses_create")
        self.assert_child(
            span,
            caller,
            endpoint="agents_responses_create",
            door="openai",
            status=200,
            identity="user",
        )


class E2BTests(DoorSpans, E2BCase):
    """
    The E2B port, through the ``e2b`` SDK in a program that uses
    OpenTelemetry: the SDK's HTTP transport (pyqwest) makes a client span
    for each envd request, Connect-RPC and REST alike, a child of the
    program's current span, and sends its context.  (A ``traceparent``
    set by hand in ``extra_sandbox_headers`` would go beside that one:
    two, which W3C Trace Context says to ignore.)
    """

    skip = TracedDaemon.skip or missing("e2b", "e2b")

    @inlineCallbacks
    def in_step(self, name: str, work: Callable[[Any], Any]) -> Any:
        """
        ``work(sandbox)`` inside a new span of the program (in the SDK's
        thread, where the transport reads the current span): its result,
        the span, and the client spans the SDK made meanwhile by id.
        """
        from opentelemetry import trace

        sbx = self.sandbox(token="a")
        CALLER_SPANS.clear()

        def job() -> Any:
            with trace.get_tracer("agent").start_as_current_span(name) as step:
                result = work(sbx)
            return result, step.get_span_context()

        result, step = yield self.sdk(job)
        clients = {
            s.context.span_id: s
            for s in CALLER_SPANS.get_finished_spans()
            if s.kind == trace.SpanKind.CLIENT
        }
        return result, step, clients

    def sent_by_the_sdk(self, span: Any, step: Any, clients: dict[int, Any]) -> Any:
        """
        The SDK's client span that ``span``'s request came with (its
        parent), a child of the program's ``step``; its context.
        """
        client = clients.get(int.from_bytes(span.parent_span_id, "big"))
        self.assertIsNotNone(client, (span.name, span.parent_span_id.hex()))
        self.assertEqual(client.parent.span_id, step.span_id)
        self.assertEqual(client.context.trace_id, step.trace_id)
        return client.context

    @inlineCallbacks
    def test_filesystem_calls_join_the_callers_trace(self) -> Any:
        """
        ``files.list`` (Connect ``ListDir``, governed as ``files_list``)
        and ``files.read`` (REST ``GET /files``, as ``files_read_raw``)
        are each the child of the SDK's client span of its request, in
        the program's trace, door ``e2b``, status 200.
        """
        with open(os.path.join(self.base_dir, "note.txt"), "w") as f:
            f.write("traced\n")
        (names, text), step, clients = yield self.in_step(
            "read files",
            lambda sbx: (
                [e.name for e in sbx.files.list(".")],
                sbx.files.read("note.txt"),
            ),
        )
        self.assertIn("note.txt", names)
        self.assertEqual(text, "traced\n")
        span = yield self.span_of(step, "files_list")
        found = self.assert_child(
            span,
            self.sent_by_the_sdk(span, step, clients),
            endpoint="files_list",
            door="e2b",
            status=200,
        )
        self.assertEqual(found["sandboxd.procedure"], "filesystem.Filesystem/ListDir")
        span = yield self.span_of(step, "files_read_raw")
        found = self.assert_child(
            span,
            self.sent_by_the_sdk(span, step, clients),
            endpoint="files_read_raw",
            door="e2b",
            status=200,
        )
        self.assertEqual(found["http.request.method"], "GET")
        self.assertEqual(found["url.path"], "/files")

    @inlineCallbacks
    def test_process_start_passes_the_span_to_the_child(self) -> Any:
        """
        ``commands.run`` (Connect ``Process/Start``, governed as
        ``process_start``) is the child of the SDK's client span, and the
        command finds the daemon's span in ``TRACEPARENT``, as through
        HTTP ``/shell``.
        """
        result, step, clients = yield self.in_step(
            "run tests", lambda sbx: sbx.commands.run("printenv TRACEPARENT")
        )
        self.assertEqual(result.exit_code, 0, result.stderr)
        span = yield self.span_of(step, "process_start")
        found = self.assert_child(
            span,
            self.sent_by_the_sdk(span, step, clients),
            endpoint="process_start",
            door="e2b",
            status=200,
        )
        self.assertEqual(found["sandboxd.procedure"], "process.Process/Start")
        self.assertEqual(
            result.stdout.strip(),
            f"00-{span.trace_id.hex()}-{span.span_id.hex()}-01",
        )


class PreviewTests(DoorSpans):
    """The preview door, an exposed port's proxy, asked with httpx."""

    skip = TracedDaemon.skip or missing("httpx", "httpx")
    policy = {**TracedDaemon.policy, "groups": {"preview": True}}

    @inlineCallbacks
    def setUp(self) -> Any:
        self.app = App()
        self.app_port = self.app.listen()
        self.addCleanup(self.app.stop)
        yield super().setUp()

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        kwargs.setdefault("preview_port", "tcp:0:interface=127.0.0.1")
        return super().start(stop_at_end, **kwargs)

    @inlineCallbacks
    def fetch_page(self, name: str) -> Any:
        """Expose the app and ask the door for its page inside a new caller span."""
        import httpx

        reply = yield self.request(
            "POST", "/preview/ports", {"port": self.app_port}, token="a"
        )
        self.assertEqual(reply.status, 201, reply.body)
        headers, caller = self.caller_headers(name)
        door_port = self.daemon.context.preview.door_port
        headers.update(
            {"Host": f"{self.app_port}.localhost:{door_port}", "X-Access-Token": "a"}
        )

        def get() -> httpx.Response:
            return httpx.get(
                f"http://127.0.0.1:{door_port}/", headers=headers, timeout=10
            )

        response = yield off_reactor(get)
        self.assertEqual(response.status_code, 200, response.text)
        self.assertIn("preview app", response.text)
        return caller

    @inlineCallbacks
    def test_page_joins_the_callers_trace(self) -> Any:
        """
        A page through the door is ``preview_proxy``'s span (door
        ``preview``, the app's 200), a child of the caller's span.
        """
        caller = yield self.fetch_page("open preview")
        span = yield self.span_of(caller, "preview_proxy")
        found = self.assert_child(
            span, caller, endpoint="preview_proxy", door="preview", status=200
        )
        self.assertEqual(found["http.request.method"], "GET")
        self.assertEqual(found["sandboxd.port"], self.app_port)


class PreviewWithoutAuditLineTests(PreviewTests):
    """
    The preview door under the built-in audit mode (``deny``: no line for
    a call that succeeds): a span is the call's whatever the audit line
    does, as through every other door.
    """

    policy = {
        **TracedDaemon.policy,
        "defaults": {"audit": "deny"},
        "groups": {"preview": True},
    }

    @inlineCallbacks
    def test_page_joins_the_callers_trace(self) -> Any:
        """
        A page that leaves no audit line still has its span: the call's
        ``preview_proxy`` span is sent before a later ``/health`` call's.
        """
        caller = yield self.fetch_page("open preview quietly")
        yield self.request("GET", "/health")
        yield self.spans(name="health")
        sent = self.collector.spans()
        before = sent[: [s.name for s in sent].index("health")]
        found = [s for s in before if s.name == "preview_proxy"]
        self.assertEqual(len(found), 1, [s.name for s in sent])
        self.assert_child(
            found[0], caller, endpoint="preview_proxy", door="preview", status=200
        )


class KepRestTests(DoorSpans, KepCase):
    """The KEP REST port (``/v1/files/...``), asked with httpx."""

    skip = TracedDaemon.skip or missing("httpx", "httpx")

    @inlineCallbacks
    def test_read_joins_the_callers_trace(self) -> Any:
        """
        ``GET /v1/files/<file>`` is ``files_read_raw``'s span (door
        ``kep``, status 200, the HTTP attributes, not gRPC's), a child of
        the caller's span.
        """
        with open(os.path.join(self.base_dir, "r.txt"), "wb") as f:
            f.write(b"kep")
        headers, caller = self.caller_headers("read over kep")
        reply = yield self.http(
            "GET", "/v1/files/r.txt", headers={"Authorization": "Bearer a", **headers}
        )
        self.assertEqual((reply.status_code, reply.content), (200, b"kep"))
        span = yield self.span_of(caller, "files_read_raw")
        found = self.assert_child(
            span, caller, endpoint="files_read_raw", door="kep", status=200
        )
        self.assertEqual(found["http.request.method"], "GET")
        self.assertEqual(found["http.response.status_code"], 200)
        self.assertNotIn("rpc.system", found)
