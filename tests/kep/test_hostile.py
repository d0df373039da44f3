"""
The KEP door seen by a hostile client, on a real daemon on loopback:
paths that try to leave the root, bodies that lie, ranges and modes out
of bounds, connections held open, HTTP/2 that is not what it claims,
streams never read or cancelled by the hundred, processes and terminals
of another identity.  Every bad input gets a clear refusal in the door's
own framing, nothing is left half-done, every resource is bounded, and
the daemon keeps answering other callers.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.kep.case import KepCase


def raw_http(port: int, data: bytes, seconds: float = 10.0) -> bytes:
    """Send ``data`` on one connection; everything read until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as s:
        try:
            s.sendall(data)
        except OSError:
            pass
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return out


def status(answer: bytes) -> int:
    """The status of a raw HTTP/1.1 answer (0 for none)."""
    if not answer.startswith(b"HTTP/1."):
        return 0
    return int(answer.split(b" ", 2)[1])


def body_json(answer: bytes) -> Any:
    return json.loads(answer.partition(b"\r\n\r\n")[2] or b"null")


def get(path: bytes) -> bytes:
    return b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


class RestPathTests(KepCase):
    """Paths that try to leave the root, or to reach it through a link."""

    audit = True

    def setUp(self) -> Any:
        self.outside = os.path.realpath(self.mktemp())
        os.makedirs(self.outside)
        with open(os.path.join(self.outside, "secret.txt"), "w") as f:
            f.write("SECRET-CONTENT")
        return super().setUp()

    def raw(self, data: bytes) -> Any:
        return self.blocking(raw_http, self.rest_port, data)

    @inlineCallbacks
    def test_encoded_dotdot(self) -> Any:
        """
        ``%2e%2e`` and ``..%2f`` leave the root once decoded: 403 with the
        root's rule; ``%252e%252e`` is the literal name ``%2e%2e`` (404), not
        decoded twice; ``..`` inside a path is normalised before the check.
        An absolute path is cleaned first, as the reference cleans it, so its
        ``..`` stops at the root: ``/../../etc/passwd`` is the root's
        ``etc/passwd``, not there (404), and never the system's.
        """
        rel = os.path.relpath(self.outside, self.base_dir).encode()
        for path in (
            b"/v1/files/%2e%2e/" + rel + b"/secret.txt",
            b"/v1/files/..%2f" + rel.replace(b"/", b"%2f") + b"%2fsecret.txt",
            b"/v1/files/a/../../" + rel + b"/secret.txt",
        ):
            answer = yield self.raw(get(path))
            self.assertEqual(status(answer), 403, (path, answer[:300]))
            self.assertNotIn(b"SECRET-CONTENT", answer)
            self.assertEqual(body_json(answer)["code"], "PERMISSION_DENIED")
            self.assertIn(b"kep:root", answer)
        answer = yield self.raw(get(b"/v1/files/%252e%252e/x"))
        self.assertEqual(status(answer), 404, answer[:300])
        answer = yield self.raw(get(b"/v1/files/%2F..%2F..%2F..%2Fetc%2Fpasswd"))
        self.assertEqual(status(answer), 404, answer[:300])
        self.assertNotIn(b"root:", answer)

    @inlineCallbacks
    def test_nul_and_overlong(self) -> Any:
        """A NUL byte is 400; a path longer than any file system's is refused, not a 500."""
        answer = yield self.raw(get(b"/v1/files/a%00b"))
        self.assertEqual(status(answer), 400, answer[:300])
        answer = yield self.raw(get(b"/v1/files/" + b"a" * 5000))
        self.assertIn(status(answer), (400, 404, 414, 431), answer[:300])
        answer = yield self.raw(get(b"/v1/files/" + b"a/" * 3000 + b"x"))
        self.assertIn(status(answer), (400, 404, 414, 431), answer[:300])
        health = yield self.http("GET", "/v1/health")
        self.assertEqual(health.status_code, 200)

    @inlineCallbacks
    def test_symlink_out_of_the_root(self) -> Any:
        """
        A link inside the root to a directory outside it: reading, listing,
        writing and deleting through it are refused, nothing outside is
        read, written or removed.
        """
        os.symlink(self.outside, os.path.join(self.base_dir, "out"))
        os.symlink(
            os.path.join(self.outside, "secret.txt"),
            os.path.join(self.base_dir, "file-link"),
        )
        for path in ("/v1/files/out/secret.txt", "/v1/files/file-link"):
            response = yield self.http("GET", path)
            self.assertEqual(response.status_code, 403, (path, response.text))
            self.assertNotIn("SECRET-CONTENT", response.text)
            response = yield self.http("HEAD", path)
            self.assertEqual(response.status_code, 403, path)
        response = yield self.http("GET", "/v1/files/out")
        self.assertEqual(response.status_code, 403, response.text)
        response = yield self.http("PUT", "/v1/files/out/new.txt", content=b"in")
        self.assertEqual(response.status_code, 403, response.text)
        self.assertFalse(os.path.exists(os.path.join(self.outside, "new.txt")))
        response = yield self.http("PUT", "/v1/files/file-link", content=b"over")
        self.assertIn(response.status_code, (403,), response.text)
        response = yield self.http("DELETE", "/v1/files/out/secret.txt")
        self.assertEqual(response.status_code, 403, response.text)
        with open(os.path.join(self.outside, "secret.txt")) as f:
            self.assertEqual(f.read(), "SECRET-CONTENT")
        self.assertEqual(sorted(os.listdir(self.outside)), ["secret.txt"])

    @inlineCallbacks
    def test_symlink_loop(self) -> Any:
        """A link loop is a clear 4xx for every method, never a 500."""
        os.symlink("loop-b", os.path.join(self.base_dir, "loop-a"))
        os.symlink("loop-a", os.path.join(self.base_dir, "loop-b"))
        for method, path in (
            ("GET", "/v1/files/loop-a"),
            ("HEAD", "/v1/files/loop-a"),
            ("GET", "/v1/files/loop-a/x"),
            ("PUT", "/v1/files/loop-a"),
            ("PUT", "/v1/files/loop-a/x"),
        ):
            response = yield self.http(method, path, content=b"x")
            self.assertTrue(
                400 <= response.status_code < 500,
                (method, path, response.status_code, response.text),
            )
        # Deleting the link itself is fine: it is inside the root.
        response = yield self.http("DELETE", "/v1/files/loop-a")
        self.assertEqual(response.status_code, 204, response.text)


class RestBodyTests(KepCase):
    """Bodies that lie, overflow or are malformed: nothing half-written."""

    audit = True
    extra_policy = {"endpoints": {"files_write_raw": {"limits": {"max_bytes": 1000}}}}

    def raw(self, data: bytes, seconds: float = 10.0) -> Any:
        return self.blocking(raw_http, self.rest_port, data, seconds)

    def leftovers(self) -> list[str]:
        return sorted(n for n in os.listdir(self.base_dir) if n != "audit.log")

    @inlineCallbacks
    def test_content_length_lies(self) -> Any:
        """
        A body shorter than its Content-Length, then the client closes its
        side: no file and no temporary file left; the daemon still answers.
        """
        head = (
            b"PUT /v1/files/short.txt HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: 500\r\n\r\n"
        )

        def lie() -> None:
            with socket.create_connection(("127.0.0.1", self.rest_port)) as s:
                s.sendall(head + b"x" * 10)
                s.shutdown(socket.SHUT_WR)
                s.settimeout(5)
                try:
                    s.recv(100)
                except OSError:
                    pass

        yield self.blocking(lie)
        self.assertEqual(self.leftovers(), [])
        health = yield self.http("GET", "/v1/health")
        self.assertEqual(health.status_code, 200)

    @inlineCallbacks
    def test_over_max_bytes_announced_and_chunked(self) -> Any:
        """
        Over ``max_bytes``, announced or chunked: 413 and nothing written.
        An announced one is answered at its head, as the HTTP port does,
        before the client sends any of the body, with its audit line.
        """
        answer = yield self.raw(
            b"PUT /v1/files/big HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: 2000000\r\nConnection: close\r\n\r\n" + b"z" * 2000000
        )
        self.assertEqual(status(answer), 413, answer[:300])
        chunk = b"%x\r\n%s\r\n" % (1500, b"y" * 1500)
        answer = yield self.raw(
            b"PUT /v1/files/big HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n" + chunk + b"0\r\n\r\n"
        )
        self.assertEqual(status(answer), 413, answer[:300])
        self.assertEqual(self.leftovers(), [])

        def head_only() -> tuple[bytes, float]:
            began = time.monotonic()
            with socket.create_connection(("127.0.0.1", self.rest_port)) as s:
                s.settimeout(5)
                s.sendall(
                    b"PUT /v1/files/huge HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Length: 50000000\r\n\r\n"
                )
                answer = s.recv(4096)
            return answer, time.monotonic() - began

        answer, took = yield self.blocking(head_only)
        self.assertEqual(status(answer), 413, answer[:300])
        self.assertEqual(body_json(answer)["code"], "INVALID_ARGUMENT")
        self.assertLess(took, 3.0)
        refused = [
            r
            for r in self.audit_lines()
            if r.get("via") == "kep" and r.get("path") == "/v1/files/huge"
        ]
        self.assertEqual(
            [(r["status"], r["code"]) for r in refused], [(413, "payload_too_large")]
        )

    @inlineCallbacks
    def test_multipart_two_files_or_none(self) -> Any:
        """
        A multipart body with no ``file`` part is 400 and writes nothing;
        with two, one whole file is written (the first), never a mix.
        """

        def multipart(*parts: tuple[str, bytes]) -> bytes:
            out = b""
            for name, data in parts:
                out += (
                    b'--B\r\nContent-Disposition: form-data; name="%s"; '
                    b'filename="f"\r\n\r\n%s\r\n' % (name.encode(), data)
                )
            return out + b"--B--\r\n"

        headers = {"content-type": "multipart/form-data; boundary=B"}
        response = yield self.http(
            "PUT", "/v1/files/none", content=multipart(("other", b"x")), headers=headers
        )
        self.assertEqual(response.status_code, 400, response.text)
        self.assertEqual(response.json()["code"], "INVALID_ARGUMENT")
        self.assertEqual(self.leftovers(), [])
        response = yield self.http(
            "PUT",
            "/v1/files/two",
            content=multipart(("file", b"first"), ("file", b"second")),
            headers=headers,
        )
        self.assertIn(response.status_code, (204, 400), response.text)
        if response.status_code == 204:
            with open(os.path.join(self.base_dir, "two"), "rb") as f:
                self.assertEqual(f.read(), b"first")
        else:
            self.assertEqual(self.leftovers(), [])
        response = yield self.http(
            "PUT", "/v1/files/broken", content=b"--B\r\nnot a part", headers=headers
        )
        self.assertEqual(response.status_code, 400, response.text)
        self.assertNotIn("broken", self.leftovers())

    @inlineCallbacks
    def test_modes(self) -> Any:
        """
        ``?mode=`` takes permission bits only: set-uid, too many digits and
        words are 400 with nothing written; ``0777`` is the mode asked for.
        """
        for mode in ("4755", "04755", "abc", "0888", "-1", "0o644", "0644 "):
            response = yield self.http(
                "PUT", "/v1/files/m", content=b"x", params={"mode": mode}
            )
            self.assertEqual(response.status_code, 400, (mode, response.text))
            self.assertEqual(response.json()["code"], "INVALID_ARGUMENT")
            self.assertEqual(self.leftovers(), [], mode)
        response = yield self.http(
            "PUT", "/v1/files/m", content=b"x", params={"mode": "0777"}
        )
        self.assertEqual(response.status_code, 204, response.text)
        mode = os.stat(os.path.join(self.base_dir, "m")).st_mode & 0o7777
        self.assertFalse(mode & 0o7000, oct(mode))

    @inlineCallbacks
    def test_ranges(self) -> Any:
        """Unsatisfiable and odd ranges: 416 or the whole file, never a 500."""
        with open(os.path.join(self.base_dir, "r.txt"), "wb") as f:
            f.write(b"0123456789")
        for value, allowed in (
            ("bytes=-0", (416, 200)),
            ("bytes=5-1", (416, 200)),
            ("bytes=20-", (416,)),
            ("bytes=abc", (416, 200)),
            ("bytes=" + ",".join(f"{i}-{i}" for i in range(500)), (416, 200, 206)),
            ("bytes=0-0,-1", (200, 206, 416)),
        ):
            response = yield self.http(
                "GET", "/v1/files/r.txt", headers={"range": value}
            )
            self.assertIn(response.status_code, allowed, (value, response.text[:200]))
            if response.status_code == 200:
                self.assertEqual(response.content, b"0123456789")
            if response.status_code == 206 and "multipart" not in response.headers.get(
                "content-type", ""
            ):
                self.assertLessEqual(len(response.content), 10)

    @inlineCallbacks
    def test_head_on_directory_and_unknown_methods(self) -> Any:
        """
        HEAD on a directory answers a head without a body; methods the door
        has not are 405 with Allow (on a file path) or 404, in the
        protocol's framing.
        """
        os.makedirs(os.path.join(self.base_dir, "d"))
        response = yield self.http("HEAD", "/v1/files/d")
        self.assertEqual(response.status_code, 200)
        self.assertEqual(response.content, b"")
        for method in ("PATCH", "POST", "OPTIONS", "TRACE", "PROPFIND"):
            response = yield self.http(method, "/v1/files/d")
            self.assertEqual(response.status_code, 405, (method, response.text))
            self.assertEqual(response.headers["allow"], "GET, HEAD, PUT, DELETE")
            self.assertEqual(
                set(response.json()), {"code", "message"}, (method, response.text)
            )
        answer = yield self.raw(get(b"/v2/whatever"))
        self.assertEqual(status(answer), 404, answer[:300])

    @inlineCallbacks
    def test_delete_protected(self) -> Any:
        """
        DELETE of the root without ``recursive`` is 409 and removes
        nothing; DELETE of the daemon's audit log inside the root is 403
        (the policy protects it), with or without ``recursive``, and a
        recursive DELETE of the root keeps it.
        """
        with open(os.path.join(self.base_dir, "keep"), "w") as f:
            f.write("k")
        response = yield self.http("DELETE", "/v1/files/")
        self.assertEqual(response.status_code, 409, response.text)
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "keep")))
        for params in ({}, {"recursive": "true"}):
            response = yield self.http("DELETE", "/v1/files/audit.log", params=params)
            self.assertEqual(response.status_code, 403, (params, response.text))
        self.assertTrue(os.path.exists(self.audit_path))
        response = yield self.http("DELETE", "/v1/files/", params={"recursive": "1"})
        self.assertIn(response.status_code, (204, 403), response.text)
        self.assertTrue(os.path.exists(self.audit_path))


class RestConnectionTests(KepCase):
    """Connections held open or opened by the hundred from one address."""

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        kwargs.setdefault("max_connections_per_address", 8)
        kwargs.setdefault("head_deadline", 1.0)
        return super().start(stop_at_end, **kwargs)

    @inlineCallbacks
    def test_slowloris_head_is_cut(self) -> Any:
        """A request head that never ends is cut at the head deadline."""

        def slow() -> float:
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", self.rest_port)) as s:
                s.settimeout(10)
                s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                try:
                    for _ in range(20):
                        s.sendall(b"X-A: b\r\n")
                        time.sleep(0.2)
                        if not s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                            break
                except (BlockingIOError, OSError):
                    pass
                try:
                    while s.recv(4096):
                        pass
                except OSError:
                    pass
            return time.monotonic() - started

        took = yield self.blocking(slow)
        self.assertLess(took, 6)

    @inlineCallbacks
    def test_per_address_cap(self) -> Any:
        """
        Past the per-address cap a new connection from that address is
        closed; once the held ones go, the door answers again.
        """

        def flood() -> tuple[int, int]:
            held = []
            try:
                for _ in range(8):
                    s = socket.create_connection(("127.0.0.1", self.rest_port))
                    held.append(s)
                time.sleep(0.2)
                extra = socket.create_connection(("127.0.0.1", self.rest_port))
                extra.settimeout(5)
                try:
                    extra.sendall(get(b"/v1/health"))
                    answer = extra.recv(4096)
                except OSError:
                    answer = b""
                extra.close()
                return status(answer), len(held)
            finally:
                for s in held:
                    s.close()

        refused, _ = yield self.blocking(flood)
        self.assertIn(refused, (0, 429, 503))
        response = yield self.http("GET", "/v1/health")
        self.assertEqual(response.status_code, 200)


# -- gRPC -----------------------------------------------------------------------

START = "/process.v1.ProcessService/Start"
EXECUTE = "/process.v1.ProcessService/Execute"
SIGNAL = "/process.v1.ProcessService/SendSignal"


def pb() -> Any:
    from k8s_agent_sandbox.commands._process_stubs import process_pb2

    return process_pb2


def framed(payload: bytes) -> bytes:
    return b"\0" + len(payload).to_bytes(4, "big") + payload


class H2Client:
    """A blocking HTTP/2 client on a raw socket: frames as a hostile client sends them."""

    def __init__(self, port: int, seconds: float = 10.0) -> None:
        from h2.config import H2Configuration
        from h2.connection import H2Connection

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=seconds)
        self.h2 = H2Connection(H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.events: list[Any] = []
        self.closed = False
        self.flush()

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    def request(
        self,
        path: str,
        message: bytes | None,
        headers: list[tuple[bytes, bytes]] | None = None,
        te: bool = True,
        end: bool = True,
    ) -> int:
        stream_id: int = self.h2.get_next_available_stream_id()
        fields = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.encode()),
            (b":authority", b"127.0.0.1"),
            (b"content-type", b"application/grpc"),
        ]
        if te:
            fields.append((b"te", b"trailers"))
        self.h2.send_headers(stream_id, fields + (headers or []), end_stream=False)
        if message is not None:
            self.h2.send_data(stream_id, message, end_stream=end)
        elif end:
            self.h2.end_stream(stream_id)
        self.flush()
        return stream_id

    def read(self, until: Any, seconds: float = 10.0) -> bool:
        """Read events until ``until(self)`` holds or the connection ends."""
        from h2.exceptions import ProtocolError

        deadline = time.monotonic() + seconds
        while not until(self):
            if self.closed or time.monotonic() > deadline:
                return bool(until(self))
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                self.closed = True
                continue
            try:
                self.events.extend(self.h2.receive_data(data))
            except ProtocolError:
                self.closed = True
            try:
                self.flush()
            except OSError:
                self.closed = True
        return True

    def fields(self, stream_id: int) -> dict[bytes, bytes]:
        from h2.events import ResponseReceived, TrailersReceived

        out: dict[bytes, bytes] = {}
        for e in self.events:
            if isinstance(e, ResponseReceived | TrailersReceived):
                if e.stream_id == stream_id:
                    out.update(dict(e.headers))
        return out

    def ended(self, stream_id: int) -> bool:
        from h2.events import StreamEnded, StreamReset

        return any(
            isinstance(e, StreamEnded | StreamReset) and e.stream_id == stream_id
            for e in self.events
        )

    def close(self) -> None:
        self.sock.close()


class GrpcCase(KepCase):
    """A daemon with both KEP ports."""

    grpc = True

    def h2(self) -> H2Client:
        client = H2Client(self.grpc_port)  # type: ignore[arg-type]
        self.addCleanup(client.close)
        return client

    def factory(self) -> Any:
        return self.daemon.context.kep._grpc_factory

    def sleep(self, seconds: float) -> Any:
        from twisted.internet import reactor
        from twisted.internet.task import deferLater

        return deferLater(reactor, seconds, lambda: None)

    def answered(self) -> Any:
        """A fresh client's Execute answers: the port still serves others."""

        def call() -> dict[bytes, bytes]:
            client = H2Client(self.grpc_port)  # type: ignore[arg-type]
            try:
                message = pb().ExecuteRequest(
                    config=pb().ProcessConfig(command=["/bin/echo", "still"])
                )
                sid = client.request(EXECUTE, framed(message.SerializeToString()))
                client.read(lambda c: c.ended(sid))
                return client.fields(sid)
            finally:
                client.close()

        return self.blocking(call)

    def buffered(self) -> int:
        """Bytes the daemon holds for the gRPC connections' transports."""
        total = 0
        for connection in self.factory().connections:
            transport = connection.transport
            total += len(getattr(transport, "dataBuffer", b""))
            total += getattr(transport, "_tempDataLen", 0)
        return total


class GrpcWireTests(GrpcCase):
    """What is not gRPC over HTTP/2, and HTTP/2 used as a weapon."""

    @inlineCallbacks
    def test_garbage_and_http11(self) -> Any:
        """Garbage or HTTP/1.1 instead of the preface: closed at once; others still served."""
        for data in (
            b"\x00" * 100 + b"garbage" * 100,
            b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 64,
        ):
            started = time.monotonic()
            yield self.blocking(raw_http, self.grpc_port, data, 10.0)
            self.assertLess(time.monotonic() - started, 5, data[:20])
        fields = yield self.answered()
        self.assertEqual(fields.get(b"grpc-status"), b"0", fields)

    @inlineCallbacks
    def test_two_gib_prefix(self) -> Any:
        """A prefix announcing 2 GiB is RESOURCE_EXHAUSTED at once, nothing buffered."""

        def call() -> dict[bytes, bytes]:
            client = self.h2()
            sid = client.request(
                EXECUTE, b"\0" + (2**31).to_bytes(4, "big") + b"x" * 100, end=False
            )
            client.read(lambda c: c.ended(sid))
            return client.fields(sid)

        fields = yield self.blocking(call)
        self.assertEqual(fields.get(b"grpc-status"), b"8", fields)

    @inlineCallbacks
    def test_huge_header_block(self) -> Any:
        """A header block over the advertised bound ends that connection, not the daemon."""

        def call() -> bool:
            client = self.h2()
            client.h2.max_outbound_frame_size = 16384
            # h2 as a client would refuse to send it: the frames by hand.
            from hpack import Encoder
            from hyperframe.frame import ContinuationFrame, HeadersFrame

            block = Encoder().encode(
                [
                    (b":method", b"POST"),
                    (b":scheme", b"http"),
                    (b":path", EXECUTE.encode()),
                    (b":authority", b"x"),
                    (b"content-type", b"application/grpc"),
                ]
                + [(b"x-big-%d" % i, b"v" * 4000) for i in range(300)]
            )
            chunks = [block[i : i + 16000] for i in range(0, len(block), 16000)]
            first = HeadersFrame(1, chunks[0])
            frames = [first.serialize()]
            for i, chunk in enumerate(chunks[1:], 1):
                frame = ContinuationFrame(1, chunk)
                if i == len(chunks) - 1:
                    frame.flags.add("END_HEADERS")
                frames.append(frame.serialize())
            try:
                client.sock.sendall(b"".join(frames))
            except OSError:
                return True
            client.read(lambda c: False, 5)
            return client.closed

        closed = yield self.blocking(call)
        self.assertTrue(closed, "a 1 MB header block was taken")
        fields = yield self.answered()
        self.assertEqual(fields.get(b"grpc-status"), b"0", fields)

    @inlineCallbacks
    def test_too_many_streams(self) -> Any:
        """
        More streams than ``max_concurrent_streams`` on one connection:
        the extra stream is refused, the connection (or the daemon) does
        not take it.
        """
        from sandboxd.policy.defaults import KEP_MAX_CONCURRENT_STREAMS

        def call() -> tuple[int, bool]:
            client = self.h2()
            client.read(lambda c: bool(c.events), 5)  # the server's SETTINGS
            from h2.settings import SettingCodes, Settings

            # A client that ignores the server's bound (h2 would not send).
            client.h2.remote_settings = Settings(
                client=False,
                initial_values={SettingCodes.MAX_CONCURRENT_STREAMS: 10**6},
            )
            sleep = pb().StartRequest(
                config=pb().ProcessConfig(command=["/bin/sleep", "30"])
            )
            for _ in range(KEP_MAX_CONCURRENT_STREAMS + 5):
                client.request(START, framed(sleep.SerializeToString()))
            client.read(lambda c: False, 3)
            return len(self.factory().connections), client.closed

        yield self.blocking(call)
        # Whatever the connection's fate, no more processes than streams run.
        self.assertLessEqual(
            len(self.daemon.context.processes.list(None)), KEP_MAX_CONCURRENT_STREAMS
        )
        fields = yield self.answered()
        self.assertEqual(fields.get(b"grpc-status"), b"0", fields)

    @inlineCallbacks
    def test_ping_flood_unread(self) -> Any:
        """
        PINGs by the hundred thousand from a client that reads nothing:
        the daemon does not queue their acknowledgements without bound.
        """
        from hyperframe.frame import PingFrame

        ping = PingFrame(0, b"12345678").serialize()

        def flood() -> None:
            client = self.h2()
            client.sock.settimeout(3)
            try:
                for _ in range(200):
                    client.sock.sendall(ping * 5000)
            except OSError:
                pass

        yield self.blocking(flood)
        yield self.sleep(0.5)
        self.assertLess(self.buffered(), 4 * 1024 * 1024)

    @inlineCallbacks
    def test_settings_flood_unread(self) -> Any:
        """SETTINGS frames by the hundred thousand, nothing read: bounded too."""
        from hyperframe.frame import SettingsFrame

        settings = SettingsFrame(0, {0x4: 65535}).serialize()

        def flood() -> None:
            client = self.h2()
            client.sock.settimeout(3)
            try:
                for _ in range(100):
                    client.sock.sendall(settings * 5000)
            except OSError:
                pass

        yield self.blocking(flood)
        yield self.sleep(0.5)
        self.assertLess(self.buffered(), 4 * 1024 * 1024)


class GrpcSlowRequestTests(GrpcCase):
    """A request message that never ends holds nothing past the body bounds."""

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        kwargs.setdefault("head_deadline", 1.0)
        return super().start(stop_at_end, **kwargs)

    def message(self) -> bytes:
        return framed(
            pb()
            .ExecuteRequest(config=pb().ProcessConfig(command=["/bin/echo", "hi"]))
            .SerializeToString()
        )

    @inlineCallbacks
    def test_part_of_a_message_then_nothing(self) -> Any:
        """
        Part of a message and nothing more (nor a whole one and no end):
        DEADLINE_EXCEEDED once the grace is over and the bytes fall below
        the minimum rate, saying so; other clients are served meanwhile.
        """
        whole = self.message()

        def call(data: bytes) -> tuple[dict[bytes, bytes], float]:
            client = self.h2()
            started = time.monotonic()
            sid = client.request(EXECUTE, data, end=False)
            client.read(lambda c: c.ended(sid), seconds=15)
            return client.fields(sid), time.monotonic() - started

        for data in (whole[:-3], whole):
            fields, took = yield self.blocking(call, data)
            self.assertEqual(fields.get(b"grpc-status"), b"4", fields)
            self.assertIn(b"came too slowly", fields.get(b"grpc-message", b""))
            self.assertLess(took, 5)
        fields = yield self.answered()
        self.assertEqual(fields.get(b"grpc-status"), b"0", fields)

    @inlineCallbacks
    def test_a_message_sent_in_parts_within_the_grace(self) -> Any:
        """A message whose parts come within the grace runs."""
        whole = self.message()

        def call() -> dict[bytes, bytes]:
            client = self.h2()
            sid = client.request(EXECUTE, whole[:4], end=False)
            time.sleep(0.5)
            client.h2.send_data(sid, whole[4:], end_stream=True)
            client.flush()
            client.read(lambda c: c.ended(sid))
            return client.fields(sid)

        fields = yield self.blocking(call)
        self.assertEqual(fields.get(b"grpc-status"), b"0", fields)


class GrpcEchoTests(GrpcCase):
    """
    Refusals that quote what the caller sent: a long ``cwd`` or variable
    name is refused at once with a short ``grpc-message``, and the daemon
    keeps answering meanwhile (an unbounded message was Huffman-coded on
    the reactor for seconds to minutes, freezing every port).
    """

    timeout = 240

    def execute(self, **config: Any) -> Any:
        """Execute ``pwd`` with ``config``; /v1/health asked while it runs."""
        import grpc
        from k8s_agent_sandbox.commands._process_stubs import process_pb2_grpc

        def run() -> tuple[str, str, float, int, float]:
            with grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
                stub = process_pb2_grpc.ProcessServiceStub(channel)
                message = pb().ExecuteRequest(
                    config=pb().ProcessConfig(command=["pwd"], **config)
                )
                began = time.monotonic()
                future = stub.Execute.future(message, timeout=120)
                time.sleep(0.3)
                asked = time.monotonic()
                health = raw_http(self.rest_port, get(b"/v1/health"), 120.0)
                health_took = time.monotonic() - asked
                error = future.exception()
                took = time.monotonic() - began
                assert error is not None
                return (
                    error.code().name,
                    error.details() or "",
                    took,
                    status(health),
                    health_took,
                )

        return self.blocking(run)

    @inlineCallbacks
    def test_long_values_are_cut(self) -> Any:
        """
        ``cwd`` of 60 000 characters: INVALID_ARGUMENT (a name no file
        system takes); a missing ``cwd`` of 150 000 characters: refused;
        a variable name of 60 000 characters with ``=``: INVALID_ARGUMENT.
        Each ``grpc-message`` is at most 1 KiB, an ellipsis where it was
        cut; ``/v1/health`` answers while the call is refused.
        """
        from sandboxd.policy.defaults import KEP_MAX_STATUS_MESSAGE_BYTES

        cases = [
            ({"cwd": "\u00e9" * 60000}, {"INVALID_ARGUMENT"}),
            ({"cwd": "nope/" * 30000}, {"INVALID_ARGUMENT", "NOT_FOUND"}),
            ({"env_vars": {"BAD=" + "\u00e9" * 60000: "x"}}, {"INVALID_ARGUMENT"}),
        ]
        for config, wanted in cases:
            code, message, took, health, health_took = yield self.execute(**config)
            what = list(config)
            self.assertIn(code, wanted, (what, message[:300]))
            self.assertLessEqual(
                len(message.encode()), KEP_MAX_STATUS_MESSAGE_BYTES, what
            )
            self.assertIn("\u2026", message, what)  # cut, and says so
            self.assertEqual(health, 200, what)
            self.assertLess(health_took, 2.0, what)
            self.assertLess(took, 5.0, what)


class GrpcProcessTests(GrpcCase):
    """Processes through the door: never read, cancelled by the hundred, refused."""

    audit = True
    extra_policy = {
        "defaults": {"audit": "all"},
        "endpoints": {
            "process_start": {
                "params": {"deny_commands": ["forbidden-*"]},
                "limits": {"max_processes": 120},
            }
        },
    }

    def children(self) -> list[Any]:
        import psutil

        return [
            p
            for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE
        ]

    def call(self, path: str, message: Any, **headers: str) -> Any:
        def run() -> dict[bytes, bytes]:
            client = H2Client(self.grpc_port)  # type: ignore[arg-type]
            try:
                payload = (
                    message
                    if isinstance(message, bytes)
                    else message.SerializeToString()
                )
                sid = client.request(
                    path,
                    framed(payload),
                    [(k.encode(), v.encode()) for k, v in headers.items()],
                )
                client.read(lambda c: c.ended(sid))
                return client.fields(sid)
            finally:
                client.close()

        return self.blocking(run)

    @inlineCallbacks
    def test_unread_output_is_bounded(self) -> Any:
        """
        ``yes`` on a stream the client never reads: the daemon's buffers
        stay bounded (the child is paused, not buffered), and the process
        goes when the client does.
        """
        client = self.h2()
        start = pb().StartRequest(config=pb().ProcessConfig(command=["/usr/bin/yes"]))
        client.request(START, framed(start.SerializeToString()))
        yield self.sleep(2.0)
        [connection] = self.factory().connections
        queued = sum(call._pending_bytes for call in connection._calls.values())
        from sandboxd.policy.defaults import KEP_STREAM_MAX_QUEUED_BYTES

        self.assertLess(queued + self.buffered(), KEP_STREAM_MAX_QUEUED_BYTES)
        [child] = self.children()
        retained = self.daemon.context.processes.get(child.pid)
        self.assertIsNotNone(retained)
        client.close()
        for _ in range(50):
            if not self.children():
                break
            yield self.sleep(0.1)
        self.assertEqual(self.children(), [])

    @inlineCallbacks
    def test_hundred_cancelled_starts(self) -> Any:
        """A hundred Start streams reset at once: no child of the daemon is left."""
        from h2.errors import ErrorCodes

        def run() -> None:
            client = self.h2()
            start = pb().StartRequest(
                config=pb().ProcessConfig(command=["/bin/sleep", "300"])
            )
            ids = [
                client.request(START, framed(start.SerializeToString()))
                for _ in range(100)
            ]
            time.sleep(1.0)
            for sid in ids:
                client.h2.reset_stream(sid, ErrorCodes.CANCEL)
            client.flush()
            client.read(lambda c: False, 1)

        yield self.blocking(run)
        for _ in range(100):
            if not self.children():
                break
            yield self.sleep(0.1)
        self.assertEqual(self.children(), [])

    @inlineCallbacks
    def test_refusals(self) -> Any:
        """
        A command the deny list names is PERMISSION_DENIED with
        ``command_not_allowed``; an unsupported signal INVALID_ARGUMENT;
        ids no process has NOT_FOUND; a wrong wire type INVALID_ARGUMENT,
        an unknown field ignored (proto3); no ``te: trailers`` still
        answered.  Each refusal is one audit line ``via: kep`` naming what
        refused it.
        """
        fields = yield self.call(
            START,
            pb().StartRequest(config=pb().ProcessConfig(command=["forbidden-x"])),
        )
        self.assertEqual(fields.get(b"grpc-status"), b"7", fields)
        self.assertEqual(fields.get(b"x-sandboxd-code"), b"command_not_allowed")
        # The id is looked up before the signal is read, as the reference
        # does: no such process is NOT_FOUND whatever the signal (a live
        # one's bad signal is in test_process).
        fields = yield self.call(
            SIGNAL, pb().SendSignalRequest(process_id=os.getpid(), signal=9999)
        )
        self.assertEqual(fields.get(b"grpc-status"), b"5", fields)
        for pid in (-1, 2**31 - 1, 1, os.getpid()):
            fields = yield self.call(
                SIGNAL, pb().SendSignalRequest(process_id=pid, signal=9)
            )
            self.assertEqual(fields.get(b"grpc-status"), b"5", (pid, fields))
        # Field 1 (config, a message) sent as a varint.
        fields = yield self.call(EXECUTE, b"\x08\x01")
        self.assertEqual(fields.get(b"grpc-status"), b"3", fields)
        echo = (
            pb()
            .ExecuteRequest(config=pb().ProcessConfig(command=["/bin/echo", "x"]))
            .SerializeToString()
        )
        fields = yield self.call(EXECUTE, echo + b"\xf8\x3f\x05")  # field 1023
        self.assertEqual(fields.get(b"grpc-status"), b"0", fields)

        def no_te() -> dict[bytes, bytes]:
            client = self.h2()
            sid = client.request(EXECUTE, framed(echo), te=False)
            client.read(lambda c: c.ended(sid))
            return client.fields(sid)

        fields = yield self.blocking(no_te)
        self.assertEqual(fields.get(b"grpc-status"), b"0", fields)
        lines = [
            r
            for r in self.audit_lines()
            if r.get("via") == "kep" and r.get("status", 200) >= 400
        ]
        # A request the transport refuses before any handler runs (the
        # wrong wire type) is audited as the door itself.
        self.assertEqual(
            [(r["endpoint"], r["status"], r["code"]) for r in lines],
            [
                ("process_start", 403, "command_not_allowed"),
                *[("process_signal", 404, "not_found")] * 5,
                ("kep", 400, "malformed_request"),
            ],
        )
        self.assertEqual(lines[0]["rule"], "policy:endpoints.process_start")


class GrpcOtherIdentityTests(GrpcCase):
    """Another identity's terminal is not there, for every RPC that names a pid."""

    extra_policy = {
        "auth": {
            "tokens": [
                {"id": "alice", "token_env": "T_ALICE", "scopes": ["*"]},
                {
                    "id": "bob",
                    "token_env": "T_BOB",
                    "scopes": ["terminal:use", "process:manage", "process:run"],
                },
                {
                    "id": "carol",
                    "token_env": "T_CAROL",
                    "scopes": ["process:manage", "process:run"],
                },
            ]
        }
    }
    environ = {"T_ALICE": "alice-secret", "T_BOB": "bob-secret", "T_CAROL": "carol"}

    @inlineCallbacks
    def test_foreign_terminal_is_not_found(self) -> Any:
        """
        Bob's WriteStdin, SendSignal and ResizeTTY naming the pid of
        Alice's terminal are NOT_FOUND, and her terminal runs on untouched;
        so are Carol's, who holds no terminal scope (a refusal of that scope
        would tell her a terminal has that pid).
        """
        alice = self.h2()
        start = pb().StartRequest(
            config=pb().ProcessConfig(command=["/bin/sleep", "30"]),
            pty=pb().PTY(cols=80, rows=24),
        )
        sid = alice.request(
            START,
            framed(start.SerializeToString()),
            [(b"authorization", b"Bearer alice-secret")],
        )
        from h2.events import DataReceived

        yield self.blocking(
            alice.read,
            lambda c: any(isinstance(e, DataReceived) for e in c.events),
        )
        data = b"".join(e.data for e in alice.events if isinstance(e, DataReceived))
        init = pb().StartResponse.FromString(data[5 : 5 + int.from_bytes(data[1:5])])
        pid = init.init.process_id
        self.assertGreater(pid, 0)
        others = (
            [(b"authorization", b"Bearer bob-secret")],
            [(b"authorization", b"Bearer carol")],
        )
        for bob, (path, message) in itertools.product(
            others,
            (
                (
                    "/process.v1.ProcessService/WriteStdin",
                    pb().WriteStdinRequest(process_id=pid, input=b"x"),
                ),
                (SIGNAL, pb().SendSignalRequest(process_id=pid, signal=9)),
                (
                    "/process.v1.ProcessService/ResizeTTY",
                    pb().ResizeTTYRequest(process_id=pid, cols=10, rows=10),
                ),
            ),
        ):

            def call(path: str = path, message: Any = message, bob: Any = bob) -> Any:
                client = H2Client(self.grpc_port)  # type: ignore[arg-type]
                try:
                    s = client.request(path, framed(message.SerializeToString()), bob)
                    client.read(lambda c: c.ended(s))
                    return client.fields(s)
                finally:
                    client.close()

            fields = yield self.blocking(call)
            expected = b"5"
            if bob is others[1] and path.endswith("ResizeTTY"):
                # ResizeTTY is pty_resize for any pid: without the scope it
                # is refused whatever the pid names (nothing told).
                expected = b"7"
            self.assertEqual(fields.get(b"grpc-status"), expected, (path, fields))
        self.assertFalse(alice.ended(sid))
        os.kill(pid, 0)


def pump(client: H2Client, stream_id: int, data: bytes) -> bool:
    """Send ``data`` on a stream as its windows allow; False once it ended."""
    from h2.exceptions import StreamClosedError

    view = memoryview(data)
    while view:
        if client.ended(stream_id) or client.closed:
            return False
        try:
            window = client.h2.local_flow_control_window(stream_id)
        except StreamClosedError:
            return False
        if window <= 0:
            client.read(
                lambda c: (
                    c.ended(stream_id) or c.h2.local_flow_control_window(stream_id) > 0
                ),
                5,
            )
            continue
        size = min(window, client.h2.max_outbound_frame_size, len(view))
        client.h2.send_data(stream_id, bytes(view[:size]))
        client.flush()
        view = view[size:]
    return True


class PreAuthTests(GrpcCase):
    """
    A caller the door would refuse is answered on its request's head, on
    both ports, as the HTTP port answers 401 before a body: the daemon
    neither reads, holds nor spools its body; and what a connection's
    unfinished messages make the daemon hold is bounded.
    """

    audit = True
    extra_policy = {
        "auth": {
            "tokens": [
                {"id": "ops", "token_env": "T_OPS", "scopes": ["*"]},
                {"id": "reader", "token_env": "T_READER", "scopes": ["files:read"]},
            ]
        }
    }
    environ = {"T_OPS": "ops-secret", "T_READER": "reader-secret"}

    def head_only(self, head: bytes, seconds: float = 5.0) -> Any:
        """Send a request's head alone; what comes back before ``seconds``."""

        def call() -> bytes:
            with socket.create_connection(("127.0.0.1", self.rest_port)) as s:
                s.settimeout(seconds)
                s.sendall(head)
                try:
                    return s.recv(4096)
                except TimeoutError:
                    return b""

        return self.blocking(call)

    @inlineCallbacks
    def test_rest_refused_on_its_head(self) -> Any:
        """
        A PUT announcing 50 MB, or a chunked one, with a wrong token, none,
        or a token without ``files:write``: 401 or 403 before any of its
        body is sent, audited, nothing written; with the right token the
        daemon waits for the body.
        """
        put = (
            b"PUT /v1/files/big HTTP/1.1\r\nHost: 127.0.0.1\r\n%s"
            b"Content-Length: 50000000\r\n\r\n"
        )
        cases = [
            (put % b"Authorization: Bearer wrong\r\n", 401, "UNAUTHENTICATED"),
            (put % b"", 401, "UNAUTHENTICATED"),
            (put % b"X-Access-Token: reader-secret\r\n", 403, "PERMISSION_DENIED"),
            (
                b"PUT /v1/files/big HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer wrong\r\nTransfer-Encoding: chunked\r\n\r\n",
                401,
                "UNAUTHENTICATED",
            ),
        ]
        for head, wanted, code in cases:
            answer = yield self.head_only(head)
            self.assertEqual(status(answer), wanted, (head, answer[:300]))
            self.assertEqual(body_json(answer)["code"], code, answer)
        answer = yield self.head_only(
            put % b"Authorization: Bearer ops-secret\r\n", seconds=1.0
        )
        self.assertEqual(answer, b"")
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "big")))
        refused = [
            (r["status"], r["code"])
            for r in self.audit_lines()
            if r.get("via") == "kep" and r.get("path") == "/v1/files/big"
        ]
        unauthorized = (401, "unauthorized")
        self.assertEqual(
            refused,
            [unauthorized, unauthorized, (403, "missing_scope"), unauthorized],
        )

    @inlineCallbacks
    def test_grpc_refused_on_its_headers(self) -> Any:
        """
        A stream whose headers carry a wrong token (or none) is answered
        UNAUTHENTICATED before it sends its message, and audited.
        """

        def call(token: bytes | None) -> dict[bytes, bytes]:
            client = self.h2()
            headers = [(b"authorization", b"Bearer " + token)] if token else []
            sid = client.request(EXECUTE, None, headers, end=False)
            client.read(lambda c: c.ended(sid), 5)
            return client.fields(sid)

        for token in (b"wrong", None):
            fields = yield self.blocking(call, token)
            self.assertEqual(fields.get(b"grpc-status"), b"16", (token, fields))
        refused = [
            (r["status"], r["code"])
            for r in self.audit_lines()
            if r.get("via") == "kep" and r.get("path") == EXECUTE
        ]
        self.assertEqual(refused, [(401, "unauthorized")] * 2)

    @inlineCallbacks
    def test_unfinished_messages_are_bounded(self) -> Any:
        """
        Streams that announce 4 MiB messages and never end them: once a
        connection's unfinished messages pass the bound, the next stream
        is refused RESOURCE_EXHAUSTED, the daemon holds no more than the
        bound, and nothing once the client has gone.
        """
        from sandboxd.policy.defaults import (
            KEP_MAX_BUFFERED_REQUEST_BYTES,
            KEP_MAX_MESSAGE_BYTES,
        )

        auth = [(b"authorization", b"Bearer ops-secret")]
        part = KEP_MAX_MESSAGE_BYTES - 1024
        streams = KEP_MAX_BUFFERED_REQUEST_BYTES // part + 1

        def call() -> tuple[list[bytes | None], int]:
            client = self.h2()
            sids = []
            for _ in range(streams):
                sid = client.request(EXECUTE, None, auth, end=False)
                prefix = b"\0" + KEP_MAX_MESSAGE_BYTES.to_bytes(4, "big")
                pump(client, sid, prefix + b"x" * part)
                sids.append(sid)
            client.read(lambda c: c.ended(sids[-1]), 5)
            held = self.factory().buffered
            client.close()
            return [client.fields(sid).get(b"grpc-status") for sid in sids], held

        answers, held = yield self.blocking(call)
        self.assertEqual(answers[:-1], [None] * (streams - 1))
        self.assertEqual(answers[-1], b"8")
        self.assertLessEqual(held, KEP_MAX_BUFFERED_REQUEST_BYTES)
        yield self.sleep(0.3)
        self.assertEqual(self.factory().buffered, 0)
        fields = yield self.answered()
        self.assertEqual(fields.get(b"grpc-status"), b"16", fields)


class KepRootLinkTests(GrpcCase):
    """
    With ``--kep-root`` below the base directory, the KEP root is a
    boundary for links as it is for ``..``: reads, writes, listings and
    ``cwd`` through a link leading out of it are refused, as the path guard
    refuses a link out of the base directory.
    """

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        self.root = os.path.join(self.base_dir, "work")
        os.makedirs(os.path.join(self.root, "sub"), exist_ok=True)
        private = os.path.join(self.base_dir, "private")
        os.makedirs(private, exist_ok=True)
        with open(os.path.join(private, "notes.txt"), "w") as f:
            f.write("PRIVATE DATA")
        with open(os.path.join(self.root, "sub", "in.txt"), "w") as f:
            f.write("inside")
        for name, target in (
            ("link-out", "../private"),
            ("file-out", "../private/notes.txt"),
            ("link-in", "sub"),
        ):
            if not os.path.lexists(os.path.join(self.root, name)):
                os.symlink(target, os.path.join(self.root, name))
        kwargs.setdefault("kep_root", self.root)
        return super().start(stop_at_end, **kwargs)

    @inlineCallbacks
    def test_links_out_of_the_kep_root(self) -> Any:
        """
        GET, PUT and ``cwd`` through a link out of the KEP root are 403
        ``PERMISSION_DENIED`` (``kep:root``) and nothing lands outside; the
        listing leaves those links out; links inside still work, and
        DELETE of a link out removes the link, not what it leads to.
        """
        for method, path in (
            ("GET", "/v1/files/file-out"),
            ("GET", "/v1/files/link-out%2Fnotes.txt"),
            ("GET", "/v1/files/link-out"),
            ("PUT", "/v1/files/link-out%2Fplanted.txt"),
            ("PUT", "/v1/files/file-out"),
        ):
            response = yield self.http(method, path, content=b"x")
            self.assertEqual(response.status_code, 403, (method, path, response.text))
            self.assertEqual(response.json()["code"], "PERMISSION_DENIED")
            self.assertEqual(response.headers.get("x-sandboxd-rule"), "kep:root")
        private = os.path.join(self.base_dir, "private")
        self.assertEqual(os.listdir(private), ["notes.txt"])
        with open(os.path.join(private, "notes.txt")) as f:
            self.assertEqual(f.read(), "PRIVATE DATA")
        listing = yield self.http("GET", "/v1/files/")
        names = [e["name"] for e in listing.json()["entries"]]
        self.assertEqual(names, ["link-in", "sub"])
        inside = yield self.http("GET", "/v1/files/link-in%2Fin.txt")
        self.assertEqual((inside.status_code, inside.content), (200, b"inside"))
        error = yield self.blocking(
            lambda: self.caught_execute(["pwd"], cwd="link-out")
        )
        self.assertEqual(error, "PERMISSION_DENIED")
        ran = yield self.blocking(lambda: self.caught_execute(["pwd"], cwd="link-in"))
        self.assertEqual(ran, os.path.join(self.root, "sub") + "\n")
        response = yield self.http("DELETE", "/v1/files/file-out")
        self.assertEqual(response.status_code, 204, response.text)
        self.assertFalse(os.path.lexists(os.path.join(self.root, "file-out")))
        self.assertTrue(os.path.exists(os.path.join(private, "notes.txt")))

    def caught_execute(self, command: list[str], cwd: str) -> str:
        """Execute's stdout, or the name of its refusal's status."""
        import grpc
        from k8s_agent_sandbox.commands._process_stubs import process_pb2_grpc

        with grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
            stub = process_pb2_grpc.ProcessServiceStub(channel)
            request = pb().ExecuteRequest(
                config=pb().ProcessConfig(command=command, cwd=cwd)
            )
            try:
                answer = stub.Execute(request, timeout=20)
            except grpc.RpcError as e:
                return str(e.code().name)
            return str(answer.stdout.decode())


class RestProtectedInsideTests(KepCase):
    """A recursive DELETE refused for what a tree holds says so."""

    extra_policy = {
        "endpoints": {"files_*": {"paths": {"deny": ["**/.ssh/**", "**/secret/**"]}}}
    }

    @inlineCallbacks
    def test_delete_tree_holding_protected_paths(self) -> Any:
        """
        ``proj`` holds ``.ssh/id_rsa``: its recursive DELETE is 403 and
        says ``proj`` holds a protected path (not that ``proj`` is denied,
        which reading and writing in it show it is not), without naming
        what; nothing is removed.
        """
        proj = os.path.join(self.base_dir, "proj")
        os.makedirs(os.path.join(proj, ".ssh"))
        with open(os.path.join(proj, ".ssh", "id_rsa"), "w") as f:
            f.write("key")
        response = yield self.http("PUT", "/v1/files/proj%2Fmain.py", content=b"x")
        self.assertEqual(response.status_code, 204, response.text)
        response = yield self.http(
            "DELETE", "/v1/files/proj", params={"recursive": "true"}
        )
        self.assertEqual(response.status_code, 403, response.text)
        message = response.json()["message"]
        self.assertIn("proj holds a path the policy denies", message)
        self.assertNotIn("is denied", message)
        self.assertNotIn(".ssh", message)
        self.assertTrue(os.path.exists(os.path.join(proj, "main.py")))
        self.assertTrue(os.path.exists(os.path.join(proj, ".ssh", "id_rsa")))
