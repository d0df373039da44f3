"""
The gRPC door against grpcio's real client (and the agent-sandbox SDK's
stubs), on a loopback port in trial's reactor.  grpcio's client blocks, so
each call runs in a thread (deferToThread) while the reactor serves it.
"""

from __future__ import annotations

import time
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.interfaces import IPushProducer
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase, TestCase
from zope.interface import implementer

from sandboxd.kep import schema
from sandboxd.kep.grpc import (
    Call,
    GrpcError,
    GrpcFactory,
    Method,
    Status,
    status_message,
)
from sandboxd.proto3 import Kind, decode, encode, field, message

try:
    import grpc

    # The SDK's own import of its generated stubs (they import each other
    # as ``process.v1``).
    from k8s_agent_sandbox.commands._process_stubs import process_pb2 as pb
    from k8s_agent_sandbox.commands._process_stubs import process_pb2_grpc as pb_grpc
except ImportError:  # pragma: no cover - the dev extra installs them
    grpc = None

ECHO = message(
    "test.Echo",
    field(1, "text", Kind.STRING),
    field(2, "data", Kind.BYTES),
    field(3, "n", Kind.INT32),
)

CHUNK = 64 * 1024
FLOOD_BYTES = 20 * 1000 * 1000
HIGH_WATER = 128 * 1024


@implementer(IPushProducer)
class Flood:
    """Sends FLOOD_BYTES in CHUNK messages, as fast as the call lets it."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.sent = 0
        self.paused = False
        self.pauses = 0
        self.resumes = 0
        self.most_queued = 0
        self.done: defer.Deferred[None] = defer.Deferred()

    def pauseProducing(self) -> None:
        self.paused = True
        self.pauses += 1

    def resumeProducing(self) -> None:
        self.paused = False
        self.resumes += 1
        self.pump()

    def stopProducing(self) -> None:
        self.paused = True

    def pump(self) -> None:
        while not self.paused and self.sent < FLOOD_BYTES and not self.call.finished:
            self.call.send({"data": b"x" * CHUNK})
            self.sent += CHUNK
            self.most_queued = max(self.most_queued, self.call._pending_bytes)
        if self.sent >= FLOOD_BYTES and not self.done.called:
            self.done.callback(None)


class Server:
    """The test-only methods and what they saw."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.ended: defer.Deferred[str] = defer.Deferred()
        self.entered: defer.Deferred[Call] = defer.Deferred()
        self.flood: Flood | None = None

    def methods(self) -> dict[str, Method]:
        table = [
            Method("/test.Echo/Echo", ECHO, ECHO, False, self.echo),
            Method("/test.Echo/Count", ECHO, ECHO, True, self.count),
            Method("/test.Echo/Flood", ECHO, ECHO, True, self.flood_),
            Method("/test.Echo/Hang", ECHO, ECHO, False, self.hang),
            Method("/test.Echo/HangStream", ECHO, ECHO, True, self.hang),
            Method("/test.Echo/Fail", ECHO, ECHO, False, self.fail),
            Method("/test.Echo/Crash", ECHO, ECHO, False, self.crash),
            Method(
                schema.EXECUTE.path,
                schema.EXECUTE_REQUEST,
                schema.EXECUTE_RESPONSE,
                False,
                self.execute,
            ),
        ]
        return {m.path: m for m in table}

    def echo(self, call: Call, request: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(call)
        return request

    def count(self, call: Call, request: dict[str, Any]) -> None:
        for i in range(request["n"]):
            call.send({"n": i})

    def flood_(self, call: Call, request: dict[str, Any]) -> defer.Deferred[None]:
        self.flood = Flood(call)
        call.register_producer(self.flood)
        self.flood.pump()
        return self.flood.done

    def hang(self, call: Call, request: dict[str, Any]) -> defer.Deferred[None]:
        call.on_end(self.ended.callback)
        self.entered.callback(call)
        return defer.Deferred()

    def fail(self, call: Call, request: dict[str, Any]) -> None:
        raise GrpcError(
            Status.PERMISSION_DENIED,
            request["text"],
            {"sandboxd-code": "forbidden", "sandboxd-rule": "rule-7"},
        )

    def crash(self, call: Call, request: dict[str, Any]) -> None:
        raise ZeroDivisionError("boom")

    def execute(self, call: Call, request: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(call)
        config = request["config"]
        return {
            "exit_code": -3,
            "stdout": "\0".join(config["command"]).encode(),
            "stderr": repr(sorted(config["env_vars"].items())).encode()
            + config.get("cwd", "<unset>").encode(),
        }


def _ser(value: dict[str, Any]) -> bytes:
    return encode(ECHO, value)


def _de(data: bytes) -> dict[str, Any]:
    return decode(ECHO, data)


class GrpcioTests(TestCase):
    """What grpcio's client sees of the door."""

    timeout = 60

    def setUp(self) -> None:
        if grpc is None:
            raise self.skipTest("grpcio is not installed")
        self.server = Server()
        self.factory = GrpcFactory(
            reactor,
            self.server.methods(),
            max_message_bytes=1024 * 1024,
            high_water_bytes=HIGH_WATER,
        )
        self.port = reactor.listenTCP(0, self.factory, interface="127.0.0.1")
        self.addCleanup(self.port.stopListening)
        self.addCleanup(self.factory.stop, 1.0)
        target = f"127.0.0.1:{self.port.getHost().port}"
        self.channel = grpc.insecure_channel(target)
        self.addCleanup(deferToThread, self.channel.close)

    def unary(self, path: str) -> Any:
        return self.channel.unary_unary(
            path, request_serializer=_ser, response_deserializer=_de
        )

    def stream(self, path: str) -> Any:
        return self.channel.unary_stream(
            path, request_serializer=_ser, response_deserializer=_de
        )

    def rpc_error(self, f: Any, *args: Any, **kwargs: Any) -> defer.Deferred[Any]:
        def run() -> Any:
            try:
                f(*args, **kwargs)
            except grpc.RpcError as e:
                return e
            raise AssertionError("no RpcError")

        return deferToThread(run)

    @defer.inlineCallbacks
    def test_echo_and_metadata(self) -> Any:
        """A unary call round-trips; its metadata is in call.headers."""
        answer = yield deferToThread(
            self.unary("/test.Echo/Echo"),
            {"text": "héllo", "data": b"\0\1", "n": -5},
            metadata=[("authorization", "Bearer s3cret"), ("x-access-token", "t")],
        )
        self.assertEqual(answer, {"text": "héllo", "data": b"\0\1", "n": -5})
        (call,) = self.server.calls
        self.assertEqual(call.headers[b"authorization"], [b"Bearer s3cret"])
        self.assertEqual(call.headers[b"x-access-token"], [b"t"])
        self.assertNotIn(b":path", call.headers)
        self.assertEqual(call.peer, "127.0.0.1")
        self.assertTrue(call.finished)
        self.assertFalse(call.cancelled)
        self.assertGreater(call.bytes_in, 5)

    @defer.inlineCallbacks
    def test_server_streaming(self) -> Any:
        """N messages arrive in order, then OK."""
        answers = yield deferToThread(
            lambda: list(self.stream("/test.Echo/Count")({"n": 50}))
        )
        self.assertEqual([a["n"] for a in answers], list(range(50)))

    @defer.inlineCallbacks
    def test_slow_reader_pauses_the_producer(self) -> Any:
        """20 MB to a slow reader: the producer is paused and resumed, the queue bounded."""

        def read() -> int:
            total = 0
            for answer in self.stream("/test.Echo/Flood")({}, timeout=50):
                total += len(answer["data"])
                if total < 4 * 1000 * 1000:
                    time.sleep(0.002)
            return total

        total = yield deferToThread(read)
        self.assertEqual(total, FLOOD_BYTES + (-FLOOD_BYTES) % CHUNK)
        flood = self.server.flood
        assert flood is not None
        self.assertGreater(flood.pauses, 0)
        self.assertGreater(flood.resumes, 0)
        self.assertLessEqual(flood.most_queued, HIGH_WATER + CHUNK + 5)

    @defer.inlineCallbacks
    def test_deadline(self) -> Any:
        """A handler that never answers: the client's 0.3 s deadline ends it on both sides."""
        error = yield self.rpc_error(self.unary("/test.Echo/Hang"), {}, timeout=0.3)
        self.assertEqual(error.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        reason = yield self.server.ended
        self.assertEqual(reason, "deadline")
        call = yield self.server.entered
        assert call.deadline is not None
        # grpcio rounds the remaining time to its timeout units.
        self.assertTrue(0.2 < call.deadline < 0.31, call.deadline)
        self.assertTrue(call.cancelled)

    @defer.inlineCallbacks
    def test_client_cancel(self) -> Any:
        """A call the client cancels ends with on_end('cancelled')."""
        responses = self.stream("/test.Echo/HangStream")({})
        yield self.server.entered
        yield deferToThread(responses.cancel)
        reason = yield self.server.ended
        self.assertEqual(reason, "cancelled")

    @defer.inlineCallbacks
    def test_error_status_message_and_trailers(self) -> Any:
        """GrpcError: its status, its message (non-ASCII and %) and extra trailers."""
        text = "refusé à 100% : /etc/shadow\n"
        error = yield self.rpc_error(self.unary("/test.Echo/Fail"), {"text": text})
        self.assertEqual(error.code(), grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(error.details(), text)
        trailers = dict(error.trailing_metadata())
        self.assertEqual(trailers["sandboxd-code"], "forbidden")
        self.assertEqual(trailers["sandboxd-rule"], "rule-7")

    @defer.inlineCallbacks
    def test_crash_is_internal(self) -> Any:
        """Any other exception is INTERNAL, logged, and says nothing of itself."""
        error = yield self.rpc_error(self.unary("/test.Echo/Crash"), {})
        self.assertEqual(error.code(), grpc.StatusCode.INTERNAL)
        self.assertNotIn("boom", error.details())
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)

    @defer.inlineCallbacks
    def test_unknown_method(self) -> Any:
        """A path with no method is UNIMPLEMENTED."""
        error = yield self.rpc_error(self.unary("/test.Echo/Nope"), {})
        self.assertEqual(error.code(), grpc.StatusCode.UNIMPLEMENTED)
        self.assertIn("/test.Echo/Nope", error.details())

    @defer.inlineCallbacks
    def test_oversize_request(self) -> Any:
        """A request over max_message_bytes is RESOURCE_EXHAUSTED, and the channel still works."""
        error = yield self.rpc_error(
            self.unary("/test.Echo/Echo"), {"data": b"x" * (3 * 1024 * 1024)}
        )
        self.assertEqual(error.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertEqual(self.server.calls, [])
        answer = yield deferToThread(self.unary("/test.Echo/Echo"), {"text": "after"})
        self.assertEqual(answer["text"], "after")

    @defer.inlineCallbacks
    def test_undecodable_request(self) -> Any:
        """Bytes that are no valid message are INVALID_ARGUMENT."""
        raw = self.channel.unary_unary(
            "/test.Echo/Echo", request_serializer=lambda b: b, response_deserializer=_de
        )
        error = yield self.rpc_error(raw, b"\x0a\x05ab")
        self.assertEqual(error.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("test.Echo.text", error.details())

    @defer.inlineCallbacks
    def test_gzip_is_unimplemented(self) -> Any:
        """A client compressing its messages is told compression is not done here."""
        error = yield self.rpc_error(
            self.unary("/test.Echo/Echo"),
            {"text": "x"},
            compression=grpc.Compression.Gzip,
        )
        self.assertEqual(error.code(), grpc.StatusCode.UNIMPLEMENTED)
        self.assertIn("compress", error.details())

    @defer.inlineCallbacks
    def test_sdk_stub_execute(self) -> Any:
        """The agent-sandbox SDK's own stub: its ExecuteRequest decodes, our answer parses."""
        stub = pb_grpc.ProcessServiceStub(self.channel)
        request = pb.ExecuteRequest(
            config=pb.ProcessConfig(
                command=["/bin/sh", "-c", "echo hi"], env_vars={"A": "1"}, cwd="/w"
            )
        )
        answer = yield deferToThread(stub.Execute, request, timeout=10)
        self.assertEqual(answer.exit_code, -3)
        self.assertEqual(answer.stdout, b"/bin/sh\0-c\0echo hi")
        self.assertEqual(answer.stderr, b"[('A', '1')]/w")
        (call,) = self.server.calls
        self.assertEqual(call.method.path, "/process.v1.ProcessService/Execute")

    @defer.inlineCallbacks
    def test_stop_lets_calls_finish(self) -> Any:
        """stop(): GOAWAY, the running call still answered, the factory then empty."""
        answer = yield deferToThread(self.unary("/test.Echo/Echo"), {"text": "a"})
        self.assertEqual(answer["text"], "a")
        self.assertEqual(len(self.factory.connections), 1)
        yield self.factory.stop(5.0)
        self.assertEqual(self.factory.connections, set())


class StatusMessageTests(SynchronousTestCase):
    """``grpc-message`` is bounded, cut between characters, as clients decode it."""

    def test_short_message_whole(self) -> None:
        """A short message is percent-encoded whole."""
        self.assertEqual(status_message("100% \u00e9"), b"100%25 %C3%A9")

    def test_long_message_cut(self) -> None:
        """
        A long one is at most the bound, ends with an encoded ellipsis, and
        decodes as UTF-8 (no character split by the cut).
        """
        from urllib.parse import unquote_to_bytes

        for text in ("\u00e9" * 100000, "a" * 5000, "\u20ac" * 2000):
            encoded = status_message(text, 1024)
            self.assertLessEqual(len(encoded), 1024)
            self.assertTrue(encoded.endswith(b"%E2%80%A6"))
            decoded = unquote_to_bytes(encoded).decode("utf-8")
            self.assertTrue(text.startswith(decoded[:-1]))
            self.assertGreater(len(encoded), 1000)
