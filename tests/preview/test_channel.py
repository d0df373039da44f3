"""
The preview door's own HTTP/1.1 channel, byte for byte: what a client
sees on one connection (keep-alive, pipelining, framing, closing, the
hand-over to Twisted's parser for anything else), and the head parser.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.preview.channel import canonical, plain
from sandboxd.web.heads import parse_head
from tests.preview.test_door import POLICY, TOKEN, DoorCase
from tests.preview.test_rawpool import ScriptedApp


def talk(port: int, data: bytes, timeout: float = 10.0) -> tuple[bytes, float]:
    """
    Send ``data`` on one connection and read until the door closes it:
    everything read, and the seconds it took (run in a thread).
    """
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        if data:
            s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out, time.monotonic() - started


def responses(
    raw: bytes, heads: frozenset[int] = frozenset()
) -> list[tuple[int, dict[str, str], bytes]]:
    """
    ``(status, headers, body)`` of each response in ``raw``, framing
    checked; the ``heads``-th answer (from 0) is to a HEAD (no body).
    """
    out: list[tuple[int, dict[str, str], bytes]] = []
    while raw:
        head, sep, raw = raw.partition(b"\r\n\r\n")
        assert sep, f"no end of head in {head!r}"
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            key = name.lower()
            if key in headers:
                assert key not in ("content-length", "transfer-encoding"), key
                headers[key] += "\n" + value.strip()
            else:
                headers[key] = value.strip()
        if len(out) in heads:
            body = b""
        elif "content-length" in headers:
            n = int(headers["content-length"])
            body, raw = raw[:n], raw[n:]
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size, _, raw = raw.partition(b"\r\n")
                n = int(size, 16)
                body, raw = body + raw[:n], raw[n + 2 :]
                if n == 0:
                    break
        else:
            body, raw = raw, b""
        out.append((status, headers, body))
    return out


def get(path: str, host: str, *extra: str, method: str = "GET") -> bytes:
    """A request head, as a client writes it."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", *extra, "", ""]
    return "\r\n".join(lines).encode()


class ChannelTests(DoorCase):
    """One connection to the door, as a client sees it."""

    @inlineCallbacks
    def test_keep_alive_and_pipelining(self) -> None:
        """
        Requests written back to back on one connection are answered in
        order, each framed: the app's length kept, a body without one
        chunked, a HEAD with none; ``Connection: close`` ends it.
        """
        yield self.expose(public=True)
        host = self.host()
        data = get("/", host) + get("/", host, method="HEAD") + get("/headers", host)
        data += get("/cookies", host, "Connection: close")
        raw, _ = yield deferToThread(talk, self.door_port, data)
        answers = responses(raw, heads=frozenset({1}))
        self.assertEqual([a[0] for a in answers], [200, 200, 200, 200])
        page, head, seen, cookies = answers
        self.assertIn(b"preview app", page[2])
        self.assertEqual(head[2], b"")
        self.assertEqual(head[1]["content-length"], page[1]["content-length"])
        self.assertEqual(json.loads(seen[2])["uri"], "/headers")
        self.assertEqual(cookies[1]["connection"], "close")
        self.assertEqual(cookies[2], b"cookies")
        self.assertEqual(cookies[1]["set-cookie"], "a=1; Path=/\nb=2; HttpOnly")
        lines = [r for r in self.audit_lines() if r.get("via") == "preview"]
        self.assertEqual(len(lines), 4)

    @inlineCallbacks
    def test_chunked_when_the_app_gives_no_length(self) -> None:
        """An event stream comes chunked, its first event at once."""
        yield self.expose(public=True)
        host = self.host()

        def first_event() -> bytes:
            with socket.create_connection(("127.0.0.1", self.door_port), 10) as s:
                s.sendall(get("/sse", host))
                out = b""
                while b"tick0" not in out:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    out += chunk
                return out

        raw = yield deferToThread(first_event)
        head, _, body = raw.partition(b"\r\n\r\n")
        self.assertIn(b"HTTP/1.1 200", head)
        self.assertIn(b"Transfer-Encoding: chunked", head)
        self.assertIn(b"data: tick0", body)

    @inlineCallbacks
    def test_refusals_keep_the_connection(self) -> None:
        """A 421 and a 404 are framed answers on a connection that stays usable."""
        yield self.expose(public=True)
        data = (
            get("/", "evil.example")
            + get("/", self.host(port=self.app_port + 1), f"X-Access-Token: {TOKEN}")
            + get("/", self.host(), "Connection: close")
        )
        raw, _ = yield deferToThread(talk, self.door_port, data)
        answers = responses(raw)
        self.assertEqual(next(a[0] for a in answers), 421)
        self.assertTrue(raw.startswith(b"HTTP/1.1 421 Misdirected Request\r\n"))
        self.assertEqual(json.loads(answers[0][2])["code"], "misdirected_request")
        self.assertIn(answers[1][0], (403, 404))
        self.assertEqual(answers[2][0], 200)

    @inlineCallbacks
    def test_hand_over(self) -> None:
        """
        After plain requests, a request with a body on the same connection
        still streams to the app (Twisted's channel takes over); a head
        Twisted refuses (an obs-folded line) is a JSON 400.
        """
        yield self.expose(public=True)
        host = self.host()
        upload = (
            f"POST /upload HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\n"
            "Connection: close\r\n\r\nhello"
        ).encode()
        raw, _ = yield deferToThread(
            talk, self.door_port, get("/", host) + get("/headers", host) + upload
        )
        answers = responses(raw)
        self.assertEqual([a[0] for a in answers], [200, 200, 200])
        self.assertEqual(json.loads(answers[2][2])["bytes"], 5)
        folded = f"GET / HTTP/1.1\r\nHost: {host}\r\nX-A: 1\r\n  folded\r\n\r\n"
        raw, _ = yield deferToThread(talk, self.door_port, folded.encode())
        (status, _, body), *_ = responses(raw)
        self.assertEqual(status, 400)
        self.assertEqual(json.loads(body)["code"], "malformed_request")

    @inlineCallbacks
    def test_refused_heads_answer_as_the_door(self) -> None:
        """
        A head the door's HTTP front refuses is answered 400 as the door's
        own errors are: a page naming ``malformed_request`` for a browser
        that asked for HTML (also when the refusal is for the head's size,
        its Accept read first), the JSON error for any other client;
        neither stored by a cache.
        """
        yield self.expose(public=True)
        host = self.host()
        browser = "Accept: text/html,application/xhtml+xml,*/*;q=0.8"
        many = [f"X-{n}: {n}" for n in range(120)]
        for what, data, page in (
            ("obs-fold", get("/", host, browser, "X-A: 1", " folded"), True),
            ("too many headers", get("/", host, browser, *many), True),
            (
                "a Transfer-Encoding other than chunked",
                get("/", host, "Accept: */*", "Transfer-Encoding: gzip"),
                False,
            ),
            ("no Accept", get("/", host, "Content-Length: x"), False),
        ):
            raw, _ = yield deferToThread(talk, self.door_port, data)
            ((status, fields, body),) = responses(raw)
            self.assertEqual(status, 400, what)
            self.assertEqual(fields["cache-control"], "no-store", what)
            if page:
                self.assertEqual(
                    fields["content-type"], "text/html; charset=utf-8", what
                )
                self.assertIn(b"<code>malformed_request</code>", body, what)
            else:
                self.assertEqual(fields["content-type"], "application/json", what)
                self.assertEqual(json.loads(body)["code"], "malformed_request", what)

    @inlineCallbacks
    def test_client_leaving_stops_the_app(self) -> None:
        """
        A client that leaves in the middle of a large download gets the
        app's side closed (the app sees its stream stopped), and the
        exchange still has its audit line.
        """
        yield self.expose(public=True)
        host = self.host()

        def read_some() -> int:
            with socket.create_connection(("127.0.0.1", self.door_port), 10) as s:
                s.sendall(get(f"/big?n={1 << 30}", host))
                got = 0
                while got < 1 << 20:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    got += len(chunk)
                return got

        got = yield deferToThread(read_some)
        self.assertGreaterEqual(got, 1 << 20)
        for _ in range(100):
            if self.app.streams and self.app.streams[-1].stopped:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertTrue(self.app.streams[-1].stopped)
        self.assertLess(self.app.streams[-1].left, 1 << 30)
        lines = [r for r in self.audit_lines() if r.get("via") == "preview"]
        self.assertEqual(lines[-1]["path"], "/big")


class IdleTests(DoorCase):
    """The door's idle bound on its own channel."""

    policy = {
        **POLICY,
        "endpoints": {
            "preview_proxy": {
                "audit": "all",
                "limits": {"timeout_seconds": 1, "idle_timeout_seconds": 1},
            }
        },
    }

    @inlineCallbacks
    def test_idle_connection_closed(self) -> None:
        """A kept-alive connection with no request is closed after the bound."""
        yield self.expose(public=True)
        raw, took = yield deferToThread(talk, self.door_port, get("/", self.host()))
        self.assertEqual([a[0] for a in responses(raw)], [200])
        self.assertGreater(took, 0.9)
        self.assertLess(took, 5)


class PlainTests(SynchronousTestCase):
    """Which requests the door's channel answers itself (the rest go to Twisted's)."""

    def test_plain(self) -> None:
        """Bodiless HTTP/1.1 requests, a ``Content-Length: 0`` included."""
        for raw in (
            b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nAccept: a\r\n\r\n",
            b"HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"DELETE /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        ):
            head = parse_head(raw)
            assert head is not None
            self.assertTrue(plain(head), raw)

    def test_not_plain(self) -> None:
        """A body, an upgrade, an expectation, HTTP/1.0."""
        for raw in (
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            b"Connection: upgrade\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
            b"GET / HTTP/1.0\r\nHost: x\r\n\r\n",
        ):
            head = parse_head(raw)
            assert head is not None
            self.assertFalse(plain(head), raw)

    def test_canonical_names(self) -> None:
        """The app is sent header names as Twisted's ``Headers`` sent them."""
        self.assertEqual(canonical(b"x-requested-with"), b"X-Requested-With")
        self.assertEqual(canonical(b"accept"), b"Accept")


class HeadDeadlineTests(DoorCase):
    """The door's own channel keeps the daemon's deadline on request heads."""

    autostart = False

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        yield self.start(head_deadline=1.0)
        self.door = self.daemon.context.preview
        self.door_port = self.door.door_port
        self.scripted = yield self.serve(ScriptedApp(), public=True)

    @inlineCallbacks
    def test_head_in_parts_is_cut_whole_heads_never(self) -> None:
        """
        On a kept-alive connection, heads that arrive whole are answered
        however long the connection idles between them (longer than the
        deadline); a later head that comes in parts is timed from its
        first byte and the connection is cut at the deadline.
        """
        host = self.host(self.scripted.port)

        def drive() -> tuple[list[bytes], float | None]:
            with socket.create_connection(
                ("127.0.0.1", self.door_port), timeout=10
            ) as s:
                bodies = []
                for _ in range(2):
                    s.sendall(get("/length", host))
                    answer = b""
                    while not answer.endswith(b"hello"):
                        chunk = s.recv(65536)
                        if not chunk:
                            break
                        answer += chunk
                    bodies.append(answer.partition(b"\r\n\r\n")[2])
                    time.sleep(1.5)
                s.sendall(get("/length", host)[:20])
                started = time.monotonic()
                try:
                    closed = s.recv(65536) == b""
                except ConnectionResetError:
                    closed = True  # cut by an abort
                except TimeoutError:
                    closed = False
                return bodies, (time.monotonic() - started) if closed else None

        bodies, cut_after = yield deferToThread(drive)
        self.assertEqual(bodies, [b"hello", b"hello"])
        self.assertIsNotNone(cut_after, "a head in parts was never cut")
        assert cut_after is not None
        self.assertGreaterEqual(cut_after, 0.9)


class EarlyAnswer(Protocol):
    """Answers as soon as a request's head is in, without reading its body."""

    def dataReceived(self, data: bytes) -> None:
        if b"\r\n\r\n" in data and self.transport is not None:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                b"Content-Length: 10\r\n\r\nhello"
            )


class EarlyApp(Factory):
    """An app answering before the body (and never finishing its answer)."""

    protocol = EarlyAnswer
    port = 0


class BadChunkTests(DoorCase):
    """A chunked body that turns bad once an answer has begun."""

    policy = {
        **POLICY,
        "endpoints": {
            "preview_proxy": {
                "audit": "all",
                "limits": {"timeout_seconds": 1, "max_request_bytes": 64},
            }
        },
    }

    @inlineCallbacks
    def test_bad_chunk_after_an_answer_is_not_answered(self) -> None:
        """
        A malformed chunk read after the door has answered (a body over
        ``max_request_bytes``: 413, then close) gets no answer of its own:
        the client reads one whole response and the close (was a second
        status line, a 400, behind the 413).  Before any answer, the same
        chunk is still a 400 ``malformed_request``.
        """
        app = yield self.serve(EarlyApp(), public=True)
        head = get(
            "/upload", self.host(app.port), "Transfer-Encoding: chunked", method="POST"
        )
        over = b"5\r\nhello\r\n100\r\n" + b"x" * 256 + b"\r\n"
        raw, _ = yield deferToThread(talk, self.door_port, head + over + b"zz\r\n")
        ((status, _fields, body),) = responses(raw)
        self.assertEqual(status, 413)
        self.assertEqual(json.loads(body)["code"], "payload_too_large")
        raw, _ = yield deferToThread(talk, self.door_port, head + b"zz\r\n")
        ((status, _fields, body),) = responses(raw)
        self.assertEqual(status, 400)
        self.assertEqual(json.loads(body)["code"], "malformed_request")


class PriorKnowledgeTests(DoorCase):
    """HTTP/2 with prior knowledge gets a refusal it can report, not an empty reply."""

    @inlineCallbacks
    def test_h2_preface_gets_goaway(self) -> None:
        """
        The HTTP/2 connection preface is answered with the server's
        SETTINGS and a GOAWAY of ``HTTP_1_1_REQUIRED`` (0xd) saying why,
        then the connection is closed; HTTP/1.1 on the next connection works.
        """
        yield self.expose(public=True)
        settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # empty, stream 0
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings
        raw, _ = yield deferToThread(talk, self.door_port, preface)
        self.assertEqual(raw[:9], settings)
        length = int.from_bytes(raw[9:12], "big")
        self.assertEqual(raw[12], 0x7)  # GOAWAY
        payload = raw[18 : 18 + length]
        self.assertEqual(int.from_bytes(payload[4:8], "big"), 0xD)
        self.assertIn(b"HTTP/1.1 only", payload[8:])
        raw, _ = yield deferToThread(
            talk, self.door_port, get("/", self.host(), "Connection: close")
        )
        self.assertEqual(responses(raw)[0][0], 200)
