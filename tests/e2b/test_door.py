"""
The E2B door's Connect framing, seen by a raw client: errors a Connect
client expects (with sandboxd's §6 code and rule in the message), chunked
bodies, keepalives, deadlines, and what an abandoned stream leaves.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import socket
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks, succeed
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import Agent, readBody
from twisted.web.http_headers import Headers
from twisted.web.test.requesthelper import DummyChannel

from sandboxd.e2b import process as process_module
from sandboxd.e2b.door import E2BRequest
from sandboxd.policy.defaults import MIB
from sandboxd.testing import BodyProducer
from tests.e2b.sdk import CALL_SECONDS, E2BCase, caught, envelope, envelopes
from tests.helpers import alive, exchange


class _Chunked(BodyProducer):
    """A body of unknown length, so the client sends it chunked."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    def startProducing(self, consumer: Any) -> Deferred[None]:
        for part in self.parts:
            consumer.write(part)
        return succeed(None)


def _start(script: str) -> dict[str, Any]:
    return {"process": {"cmd": "/bin/bash", "args": ["-c", script]}, "stdin": False}


class ErrorTests(E2BCase):
    """Bad input gets the Connect error a Connect client expects."""

    @inlineCallbacks
    def test_unknown_procedure(self) -> Any:
        """An unknown method is unimplemented (501), naming sandboxd's code."""
        status, _, body = yield self.rpc("process.Process/Fly", {})
        self.assertEqual(status, 501)
        self.assertEqual(body["code"], "unimplemented")
        self.assertIn("code: unsupported", body["message"])

    @inlineCallbacks
    def test_malformed_envelope(self) -> Any:
        """A truncated envelope ends the stream with invalid_argument, nothing run."""
        status, _, messages = yield self.rpc(
            "process.Process/Start", None, stream=True, raw=b"\x00\x00\x00\x01\x00{"
        )
        self.assertEqual(status, 200)
        ((flags, end),) = messages
        self.assertEqual(flags, 2)
        self.assertEqual(end["error"]["code"], "invalid_argument")
        self.assertIn("malformed_request", end["error"]["message"])

    @inlineCallbacks
    def test_not_json(self) -> Any:
        """A unary body that is not JSON is invalid_argument (invalid_json)."""
        status, _, body = yield self.rpc(
            "filesystem.Filesystem/Stat", None, raw=b"{nope"
        )
        self.assertEqual((status, body["code"]), (400, "invalid_argument"))
        self.assertIn("invalid_json", body["message"])

    @inlineCallbacks
    def test_control_plane_malformed_body(self) -> Any:
        """
        ``Sandbox.create()`` and ``connect()`` with a body that is no JSON
        object, or a field of the wrong type, are 400 in E2B's API framing
        (``{code, message}``), as E2B's own API answers them; a well-formed
        body is answered 201.
        """
        for path in ("v2/sandboxes", "sandboxes/sandboxd/connect"):
            for raw in (b"{nope", b"[]", b'"sweep"', b'{"timeout": "soon"}'):
                status, _, body = yield self.rpc(path, None, raw=raw)
                self.assertEqual((status, body["code"]), (400, 400), (path, raw))
                self.assertIsInstance(body["message"], str)
        status, _, body = yield self.rpc(
            "v2/sandboxes", {"templateID": 7}, raw=b'{"templateID": 7}'
        )
        self.assertEqual(status, 400)
        self.assertIn("templateID", body["message"])
        status, _, body = yield self.rpc(
            "v2/sandboxes", {"templateID": "base", "timeout": 300}
        )
        self.assertEqual(status, 201, body)
        self.assertEqual(body["sandboxID"], "sandboxd")

    @inlineCallbacks
    def test_message_over_the_cap(self) -> Any:
        """
        A message over the size cap is invalid_argument (a retry of it can
        never pass: not resource_exhausted, which the SDK raises as "try
        again later") and is not run.
        """
        from sandboxd.policy.defaults import E2B_MAX_MESSAGE_BYTES

        big = {"process": {"selector": "x" * (E2B_MAX_MESSAGE_BYTES + 10)}}
        status, _, body = yield self.rpc("process.Process/SendInput", big)
        self.assertEqual((status, body["code"]), (400, "invalid_argument"))
        self.assertIn("payload_too_large", body["message"])

    @inlineCallbacks
    def test_missing_file_is_not_found(self) -> Any:
        """Stat of a missing path is not_found (the SDK's exists() relies on it)."""
        status, _, body = yield self.rpc("filesystem.Filesystem/Stat", {"path": "nope"})
        self.assertEqual((status, body["code"]), (404, "not_found"))

    @inlineCallbacks
    def test_signal_outside_the_allowlist(self) -> Any:
        """A selector naming no process is not_found; a bad signal is invalid_argument."""
        status, _, body = yield self.rpc(
            "process.Process/SendSignal",
            {"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"},
        )
        self.assertEqual((status, body["code"]), (404, "not_found"))
        status, _, body = yield self.rpc(
            "process.Process/SendSignal", {"process": {"pid": 1}, "signal": "SIGHUP"}
        )
        self.assertEqual((status, body["code"]), (400, "invalid_argument"))


class TokenErrorTests(E2BCase):
    """Tokens on the raw wire."""

    environ = {"T": "the-token"}
    policy = {"auth": {"tokens": [{"id": "t", "token_env": "T", "scopes": ["*"]}]}}

    @inlineCallbacks
    def test_missing_and_wrong_token(self) -> Any:
        """No or a wrong X-Access-Token is unauthenticated; the right one passes."""
        for headers in ({}, {"X-Access-Token": "wrong"}):
            status, _, body = yield self.rpc(
                "process.Process/List", {}, headers=headers
            )
            self.assertEqual((status, body["code"]), (401, "unauthenticated"))
            self.assertIn("code: unauthorized", body["message"])
        status, _, body = yield self.rpc(
            "process.Process/List", {}, headers={"X-Access-Token": "the-token"}
        )
        self.assertEqual((status, body), (200, {"processes": []}))

    @inlineCallbacks
    def test_stream_refusal_is_an_end_of_stream_error(self) -> Any:
        """A refused stream is 200 with one end-of-stream error, and runs nothing."""
        marker = os.path.join(self.base_dir, "ran")
        status, _, messages = yield self.rpc(
            "process.Process/Start", _start(f"touch {marker}"), stream=True
        )
        self.assertEqual(status, 200)
        self.assertEqual(
            [(f, m["error"]["code"]) for f, m in messages], [(2, "unauthenticated")]
        )
        self.assertFalse(os.path.exists(marker))


class FramingTests(E2BCase):
    """Chunked bodies, keepalives, deadlines."""

    @inlineCallbacks
    def test_chunked_stream_request(self) -> Any:
        """A Start whose body arrives chunked (as the SDK may send it) runs."""
        body = envelope(_start("echo chunked"))
        agent = Agent(reactor)
        d = agent.request(
            b"POST",
            f"{self.e2b_url}/process.Process/Start".encode(),
            Headers({"Content-Type": ["application/connect+json"]}),
            _Chunked([body[:3], body[3:]]),
        )
        d.addTimeout(CALL_SECONDS, reactor)
        response = yield d
        messages = envelopes((yield readBody(response)))
        kinds = [next(iter(m.get("event", {"eos": 1}))) for _, m in messages]
        self.assertEqual(kinds[0], "start")
        self.assertIn("data", kinds)
        self.assertEqual(messages[-1], (2, {}))
        data = [
            m["event"]["data"]["stdout"]
            for _, m in messages
            if "data" in m.get("event", {})
        ]
        self.assertEqual(b"".join(base64.b64decode(x) for x in data), b"chunked\n")

    @inlineCallbacks
    def test_client_streaming_input(self) -> Any:
        """StreamInput (a chunked client stream) feeds stdin in order."""

        def begin() -> Any:
            sbx = self.sandbox()
            return sbx.commands.run("head -c 6", background=True, stdin=True)

        handle = yield self.sdk(begin)
        parts = [
            envelope({"start": {"process": {"pid": handle.pid}}}),
            envelope({"data": {"input": {"stdin": base64.b64encode(b"abc").decode()}}}),
            envelope({"data": {"input": {"stdin": base64.b64encode(b"def").decode()}}}),
        ]
        agent = Agent(reactor)
        d = agent.request(
            b"POST",
            f"{self.e2b_url}/process.Process/StreamInput".encode(),
            Headers({"Content-Type": ["application/connect+json"]}),
            _Chunked(parts),
        )
        d.addTimeout(CALL_SECONDS, reactor)
        response = yield d
        messages = envelopes((yield readBody(response)))
        self.assertEqual(messages, [(0, {}), (2, {})])
        result = yield self.sdk(handle.wait)
        self.assertEqual(result.stdout, "abcdef")

    @inlineCallbacks
    def test_keepalive_at_the_asked_interval(self) -> Any:
        """A quiet command's stream carries keepalives at Keepalive-Ping-Interval."""
        status, _, messages = yield self.rpc(
            "process.Process/Start",
            _start("sleep 2.6"),
            stream=True,
            headers={"Keepalive-Ping-Interval": "1"},
        )
        kinds = [next(iter(m.get("event", {"eos": 1}))) for _, m in messages]
        self.assertEqual(status, 200)
        self.assertEqual(kinds[0], "start")
        self.assertGreaterEqual(kinds.count("keepalive"), 2)
        self.assertEqual(kinds[-2:], ["end", "eos"])

    @inlineCallbacks
    def test_deadline_kills_the_group(self) -> Any:
        """Connect-Timeout-Ms ends the command's group: end event, then deadline_exceeded."""
        marker = os.path.join(self.base_dir, "pid")
        status, _, messages = yield self.rpc(
            "process.Process/Start",
            _start(f"sleep 300 & echo $! > {marker}; wait"),
            stream=True,
            headers={"Connect-Timeout-Ms": "800"},
        )
        self.assertEqual(status, 200)
        flags, end = messages[-1]
        self.assertEqual((flags, end["error"]["code"]), (2, "deadline_exceeded"))
        self.assertIn("end", messages[-2][1]["event"])
        with open(marker) as f:
            grandchild = int(f.read())
        deadline = time.monotonic() + 10
        while alive(grandchild) and time.monotonic() < deadline:
            yield self.sdk(time.sleep, 0.1)
        self.assertFalse(alive(grandchild))

    @inlineCallbacks
    def test_connect_deadline_says_the_process_runs_on(self) -> Any:
        """
        A ``Connect`` whose Connect-Timeout-Ms passes ends that stream with
        ``deadline_exceeded`` saying the process still runs, and it does.
        """
        marker = os.path.join(self.base_dir, "pid")
        self.rpc(
            "process.Process/Start",
            _start(f"echo $$ > {marker}; sleep 6"),
            stream=True,
            headers={"Connect-Timeout-Ms": "8000"},
        )
        deadline = time.monotonic() + 10
        while not os.path.exists(marker) and time.monotonic() < deadline:
            yield self.sdk(time.sleep, 0.05)
        with open(marker) as f:
            pid = int(f.read())
        _, _, messages = yield self.rpc(
            "process.Process/Connect",
            {"process": {"pid": pid}},
            stream=True,
            headers={"Connect-Timeout-Ms": "700"},
        )
        flags, end = messages[-1]
        self.assertEqual((flags, end["error"]["code"]), (2, "deadline_exceeded"))
        self.assertIn("the process still runs", end["error"]["message"])
        self.assertNotIn("killed", end["error"]["message"])
        self.assertTrue(alive(pid), "the process outlives its watcher's deadline")
        yield self.rpc(
            "process.Process/SendSignal",
            {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"},
        )

    @inlineCallbacks
    def test_abandoned_stream_leaves_the_process_to_its_deadline(self) -> Any:
        """
        As in envd (and as the SDK's disconnect() relies on), a client that
        leaves a Start stream leaves the process running; its deadline still
        ends it.
        """
        marker = os.path.join(self.base_dir, "pid")
        body = envelope(_start(f"echo $$ > {marker}; sleep 300"))

        def leave() -> None:
            s = socket.create_connection(("127.0.0.1", self.e2b_port), timeout=5)
            s.sendall(
                b"POST /process.Process/Start HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/connect+json\r\nConnect-Timeout-Ms: 2500\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            s.recv(1000)  # the start event
            s.close()

        yield self.sdk(leave)
        deadline = time.monotonic() + 5
        while not os.path.exists(marker) and time.monotonic() < deadline:
            yield self.sdk(time.sleep, 0.05)
        with open(marker) as f:
            pid = int(f.read())
        yield self.sdk(time.sleep, 0.5)
        self.assertTrue(alive(pid), "still running after the client left")
        listed = yield self.rpc("process.Process/List", {})
        self.assertIn(pid, [p["pid"] for p in listed[2]["processes"]])
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            yield self.sdk(time.sleep, 0.1)
        self.assertFalse(alive(pid), "ended by its deadline")

    @inlineCallbacks
    def test_health_and_envs(self) -> Any:
        """GET /health is 204; GET /envs is the environment without secrets."""
        os.environ["ABX_SERVER_SHOWN"] = "no"
        self.addCleanup(os.environ.pop, "ABX_SERVER_SHOWN", None)
        agent = Agent(reactor)
        response = yield agent.request(b"GET", f"{self.e2b_url}/health".encode())
        yield readBody(response)
        self.assertEqual(response.code, 204)
        response = yield agent.request(b"GET", f"{self.e2b_url}/envs".encode())
        variables = json.loads((yield readBody(response)))
        self.assertIn("HOME", variables)
        self.assertNotIn("ABX_SERVER_SHOWN", variables)


#: Heads the door's HTTP front refuses before any procedure is found, on a
#: Connect procedure's path: (what, the request).
REFUSED_CONNECT_HEADS = (
    (
        "an obs-folded line",
        b"POST /process.Process/List HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"X-A: 1\r\n folded\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\n\r\n{}",
    ),
    (
        "a Transfer-Encoding other than chunked",
        b"POST /process.Process/List HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: gzip\r\n\r\n",
    ),
    (
        "a malformed chunk",
        b"POST /process.Process/List HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\n{}\r\n0\r\n\r\n",
    ),
)

#: The same, on envd's REST routes or with no path read.
REFUSED_REST_HEADS = (
    ("a 1 MiB query", b"GET /files?path=" + b"x" * MIB + b" HTTP/1.1\r\n\r\n"),
    (
        "two Content-Lengths",
        b"POST /files?path=a HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    ),
    ("no request line", b"NOT A REQUEST\r\n\r\n"),
)


class GaugeTests(E2BCase):
    """What the E2B port holds open is in ``/metrics`` beside the HTTP door's."""

    @inlineCallbacks
    def test_streams_and_connections_counted(self) -> Any:
        """
        A command's output stream on the E2B port counts as an open stream
        and an open connection of door ``e2b``, and stops counting once
        it ends.
        """
        marker = os.path.join(self.base_dir, "started")
        stream = self.rpc(
            "process.Process/Start", _start(f"touch {marker}; sleep 2"), stream=True
        )
        deadline = time.monotonic() + 10
        while not os.path.exists(marker) and time.monotonic() < deadline:
            yield self.sdk(time.sleep, 0.05)

        def gauges(page: str) -> tuple[float, float]:
            found = dict(
                line.rsplit(" ", 1) for line in page.splitlines() if line[:1] != "#"
            )
            return (
                float(found["sandboxd_streams_active"]),
                float(found['sandboxd_connections_active{door="e2b"}']),
            )

        during = yield self.request("GET", "/metrics")
        self.assertEqual(gauges(during.body.decode()), (1.0, 1.0))
        yield stream
        for _ in range(50):
            after = yield self.request("GET", "/metrics")
            if gauges(after.body.decode())[0] == 0.0:
                break
            yield self.sdk(time.sleep, 0.05)
        self.assertEqual(gauges(after.body.decode())[0], 0.0)


class RefusedHeadTests(E2BCase):
    """
    A request the door's HTTP front refuses (its head, or a chunked body
    it cannot read) is answered 400 in the framing the client reads on
    that path, not in the API port's.
    """

    @inlineCallbacks
    def test_connect_paths(self) -> Any:
        """On a procedure's path: a Connect error, invalid_argument, sandboxd's code in the message."""
        for what, data in REFUSED_CONNECT_HEADS:
            status, kind, body = yield self.sdk(exchange, self.e2b_port, data)
            self.assertEqual((status, kind), (400, "application/json"), what)
            self.assertEqual(body["code"], "invalid_argument", what)
            self.assertIn("(code: malformed_request)", body["message"], what)
        self.assertFalse(os.listdir(self.base_dir))

    @inlineCallbacks
    def test_rest_paths(self) -> Any:
        """Elsewhere: envd's REST error, the status as ``code``, nothing written."""
        for what, data in REFUSED_REST_HEADS:
            status, kind, body = yield self.sdk(exchange, self.e2b_port, data)
            self.assertEqual((status, kind), (400, "application/json"), what)
            self.assertEqual(body["code"], 400, what)
            self.assertIn("(code: malformed_request)", body["message"], what)
        self.assertFalse(os.listdir(self.base_dir))

    @inlineCallbacks
    def test_sdk_reads_the_message(self) -> Any:
        """
        The E2B SDK's calls whose heads are too large (a path in the
        query, a user in the Basic credential) raise its invalid-argument
        error with the door's message, not the response's raw text.
        """
        from e2b.exceptions import InvalidArgumentException

        sandbox = yield self.sdk(self.sandbox)
        long = "x" * (20 * 1024)
        for call in (
            lambda: sandbox.files.read(long),
            lambda: sandbox.files.write(long, "hi"),
            lambda: sandbox.commands.run("true", user=long),
            lambda: sandbox.files.list("/", user=long),
        ):
            error = yield self.sdk(caught, call)
            self.assertIsInstance(error, InvalidArgumentException)
            self.assertTrue(
                str(error).startswith("malformed HTTP request: the request head"),
                str(error),
            )
        self.assertFalse(os.listdir(self.base_dir))


class BackpressureTests(E2BCase):
    """A client that reads slowly pauses the child instead of filling memory."""

    @inlineCallbacks
    def test_unread_stream_pauses_the_child(self) -> Any:
        """Output nobody reads pauses the child's pipes (as a slow SSE client does)."""
        body = envelope(_start("head -c 200000000 /dev/zero"))
        sock = socket.create_connection(("127.0.0.1", self.e2b_port), timeout=5)
        self.addCleanup(sock.close)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(
            b"POST /process.Process/Start HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/connect+json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        service = self.daemon.context.processes
        deadline = time.monotonic() + 10
        paused = False
        while time.monotonic() < deadline and not paused:
            yield self.sdk(time.sleep, 0.1)
            paused = any(m.child.paused for m in service.list() if m.running)
        self.assertTrue(paused)
        for managed in service.list():
            if managed.running:
                managed.child.kill()


class WatchStreamTests(E2BCase):
    """WatchDir, the streaming watch (the async SDK's ``watch_dir``)."""

    @inlineCallbacks
    def test_watch_dir_stream(self) -> Any:
        """
        start, then filesystem events as they happen, until the deadline,
        which ends the stream with deadline_exceeded as envd's does.
        """
        os.makedirs(os.path.join(self.base_dir, "w"))

        def touch() -> None:
            time.sleep(0.5)
            with open(os.path.join(self.base_dir, "w", "seen.txt"), "w") as f:
                f.write("x")

        writer = self.sdk(touch)
        status, _, messages = yield self.rpc(
            "filesystem.Filesystem/WatchDir",
            {"path": "w"},
            stream=True,
            headers={"Connect-Timeout-Ms": "1500", "Keepalive-Ping-Interval": "1"},
        )
        yield writer
        self.assertEqual(status, 200)
        self.assertEqual(messages[0], (0, {"start": {}}))
        events = [m["filesystem"] for _, m in messages if "filesystem" in m]
        self.assertIn({"name": "seen.txt", "type": "EVENT_TYPE_CREATE"}, events)
        flags, end = messages[-1]
        self.assertEqual((flags, end["error"]["code"]), (2, "deadline_exceeded"))


class DisabledEndpointTests(E2BCase):
    """An endpoint the policy switched off is off through this door too."""

    policy = {"endpoints": {"process_start": {"enabled": False}}}

    @inlineCallbacks
    def test_disabled_start(self) -> Any:
        """With process_start off, commands.run is refused (endpoint_disabled)."""
        from e2b import SandboxException

        error = yield self.sdk(caught, lambda: self.sandbox().commands.run("true"))
        self.assertIsInstance(error, SandboxException)
        self.assertIn("UNIMPLEMENTED", str(error))
        self.assertIn("endpoint_disabled", str(error))


class SlowHeadTests(E2BCase):
    """The E2B port cuts request heads that never complete, as the API port does."""

    autostart = False

    @inlineCallbacks
    def test_dripped_head_is_cut(self) -> Any:
        """
        A client that sends part of a request line and stops is closed
        once the head deadline passes; a whole request on a new
        connection is answered meanwhile.
        """
        yield self.start(head_deadline=0.5)
        slow = socket.create_connection(("127.0.0.1", self.e2b_port), timeout=5)
        self.addCleanup(slow.close)
        slow.sendall(b"GET /hea")
        started = time.monotonic()

        def closed() -> bool:
            try:
                return slow.recv(4096) == b""
            except ConnectionResetError:
                return True

        was_closed = yield self.sdk(closed)
        self.assertTrue(was_closed)
        self.assertLess(time.monotonic() - started, 4.5)
        agent = Agent(reactor)
        response = yield agent.request(b"GET", f"{self.e2b_url}/health".encode())
        yield readBody(response)
        self.assertEqual(response.code, 204)


class _FullSpool:
    """
    A buffered spool whose disk filled: the bytes it holds fail every
    flush, and every seek tries them again (as ``BufferedRandom`` does).
    """

    def __init__(self, writes: bool) -> None:
        self.writes = writes
        self.closed = False

    def _refused(self, *args: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    def write(self, data: bytes) -> int:
        if not self.writes:
            self._refused()
        return len(data)

    flush = seek = truncate = _refused

    def close(self) -> None:
        self.closed = True
        self._refused()


class FullSpoolTests(SynchronousTestCase):
    """
    A body whose spool finds no room, whether at a chunk or only when the
    last buffered bytes are written at its end: the request is marked for
    the 507, the spool let go, and nothing raises (a raise here dropped the
    connection unanswered).
    """

    def request(self, spool: _FullSpool) -> E2BRequest:
        request = E2BRequest(DummyChannel())
        request._cap = MIB
        request.content = spool  # type: ignore[assignment]
        return request

    def test_at_a_chunk(self) -> None:
        spool = _FullSpool(writes=False)
        request = self.request(spool)
        request.handleContentChunk(b"x" * 4096)
        request.handleContentChunk(b"more")
        self.assertTrue(request.no_space)
        self.assertTrue(spool.closed)
        self.assertEqual(request.content.read(), b"")

    def test_at_the_end(self) -> None:
        spool = _FullSpool(writes=True)
        request = self.request(spool)
        request.handleContentChunk(b"x" * 4096)
        self.assertFalse(request.no_space)
        processed = []
        request.process = lambda: processed.append(True)  # type: ignore[method-assign]
        request.requestReceived(b"POST", b"/files", b"HTTP/1.1")
        self.assertTrue(request.no_space)
        self.assertTrue(spool.closed)
        self.assertEqual(processed, [True])


class ConfigsKeptTests(SynchronousTestCase):
    """What the door keeps of the commands it started, for ``List``."""

    def test_bounded_by_count_and_bytes(self) -> None:
        """
        Past the count or the bytes kept, the oldest configs go first; the
        newest stays whatever it weighs; the tally follows what is kept.
        """
        from sandboxd.e2b.process import Config, ProcessDoor

        door = ProcessDoor()
        self.patch(process_module, "E2B_CONFIGS_KEPT", 3)
        self.patch(process_module, "E2B_CONFIGS_BYTES", 100)
        for pid in range(1, 6):
            door.remember(pid, Config("sh", ["-c", "true"], {}, "/w"))
        self.assertEqual(list(door.configs), [3, 4, 5])
        door.remember(6, Config("sh", ["x" * 80], {}, None))
        self.assertEqual(list(door.configs), [5, 6])
        door.remember(7, Config("sh", [], {"BIG": "y" * 500}, None))
        self.assertEqual(list(door.configs), [7])
        self.assertEqual(door.config_bytes, door.configs[7].weight())
