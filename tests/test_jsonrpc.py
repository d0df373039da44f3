"""
The JSON-RPC 2.0 messages the MCP door, the agents engine and the language
servers share, and LSP's framing.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd import jsonrpc


class MessageTests(SynchronousTestCase):
    """Each shape is what JSON-RPC 2.0 names, and nothing more."""

    def test_request_and_notification(self) -> None:
        """A request carries its id; a notification has none, nor params when there are none."""
        self.assertEqual(
            jsonrpc.request(7, "session/new", {"cwd": "/w"}),
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "session/new",
                "params": {"cwd": "/w"},
            },
        )
        self.assertEqual(
            jsonrpc.notification("notifications/initialized"),
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
        )
        self.assertNotIn("id", jsonrpc.notification("x", {"a": 1}))

    def test_result_and_error(self) -> None:
        """An error's ``data`` appears only when given, and the message is JSON."""
        self.assertEqual(
            jsonrpc.result("a", {"ok": True}),
            {"jsonrpc": "2.0", "id": "a", "result": {"ok": True}},
        )
        bare = jsonrpc.error(1, jsonrpc.METHOD_NOT_FOUND, "Method not found: x")
        self.assertEqual(
            bare["error"], {"code": -32601, "message": "Method not found: x"}
        )
        full = jsonrpc.error(
            None, jsonrpc.INVALID_PARAMS, "bad", {"code": "invalid_param"}
        )
        self.assertEqual(
            json.loads(json.dumps(full))["error"]["data"], {"code": "invalid_param"}
        )

    def test_rpc_error_round_trip(self) -> None:
        """An :class:`RpcError` read back from its ``error`` member is the same error."""
        e = jsonrpc.RpcError(jsonrpc.REQUEST_CANCELLED, "request cancelled")
        self.assertEqual(e.as_json(), {"code": -32800, "message": "request cancelled"})
        self.assertEqual(str(e), "request cancelled")

    def test_request_key_tells_types_apart(self) -> None:
        """``1`` and ``"1"`` are different requests."""
        self.assertNotEqual(jsonrpc.request_key(1), jsonrpc.request_key("1"))
        self.assertEqual(jsonrpc.request_key(1), jsonrpc.request_key(1))


class ContentLengthFramerTests(SynchronousTestCase):
    """LSP's frames, split wherever the pipe splits them, and bounded."""

    def framer(self, max_bytes: int = 1000) -> tuple[Any, list[bytes], list[str]]:
        messages: list[bytes] = []
        broken: list[str] = []
        framer = jsonrpc.ContentLengthFramer(max_bytes, messages.append, broken.append)
        return framer, messages, broken

    def test_frames_split_anywhere(self) -> None:
        """Two frames fed a byte at a time come out whole, in order."""
        framer, messages, broken = self.framer()
        one = json.dumps({"id": 1, "result": "é"}).encode()
        data = (
            jsonrpc.content_length_frame(one)
            + b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n"
            + jsonrpc.content_length_frame(b"{}")
        )
        for i in range(len(data)):
            framer.feed(data[i : i + 1])
        self.assertEqual((messages, broken), ([one, b"{}"], []))

    def test_several_frames_in_one_read(self) -> None:
        """One read holding three frames gives three messages."""
        framer, messages, _ = self.framer()
        framer.feed(
            b"".join(jsonrpc.content_length_frame(b"[%d]" % i) for i in range(3))
        )
        self.assertEqual(messages, [b"[0]", b"[1]", b"[2]"])

    def test_length_over_the_cap(self) -> None:
        """A frame announcing more than max_bytes breaks the stream before its body is read."""
        framer, messages, broken = self.framer(max_bytes=10)
        framer.feed(b"Content-Length: 11\r\n\r\n")
        framer.feed(jsonrpc.content_length_frame(b"{}"))
        self.assertEqual(messages, [])
        self.assertEqual(len(broken), 1)
        self.assertIn("11 bytes", broken[0])

    def test_oversized_frames_are_read_past(self) -> None:
        """
        With on_oversized, a frame over max_bytes is read past, fed in
        pieces, its head and length handed on, and the frames after it
        come out whole; the stream is not broken.
        """
        messages: list[bytes] = []
        broken: list[str] = []
        skipped: list[tuple[bytes, int]] = []
        framer = jsonrpc.ContentLengthFramer(
            100,
            messages.append,
            broken.append,
            lambda head, length: skipped.append((head, length)),
        )
        big = b'{"id": 7, "result": [' + b"1," * 100_000 + b"1]}"
        data = (
            jsonrpc.content_length_frame(b"[0]")
            + jsonrpc.content_length_frame(big)
            + jsonrpc.content_length_frame(b"[1]")
        )
        for i in range(0, len(data), 4096):
            framer.feed(data[i : i + 4096])
        self.assertEqual((messages, broken), ([b"[0]", b"[1]"], []))
        [(head, length)] = skipped
        self.assertEqual(length, len(big))
        self.assertEqual(head, big[: jsonrpc.OVERSIZED_HEAD_BYTES])

    def test_no_length(self) -> None:
        """Headers without a number, or with none at all, break the stream."""
        for head in (b"Content-Length: ten\r\n\r\n", b"X: 1\r\n\r\n"):
            framer, messages, broken = self.framer()
            framer.feed(head + b"{}")
            self.assertEqual((messages, len(broken)), ([], 1))

    def test_endless_header(self) -> None:
        """A header block that never ends is refused once it passes its bound."""
        framer, _, broken = self.framer()
        framer.feed(b"X" * (jsonrpc.MAX_HEADER_BYTES + 10))
        self.assertEqual(len(broken), 1)
        framer.feed(jsonrpc.content_length_frame(b"{}"))
        self.assertEqual(len(broken), 1)


class _Peer:
    """A peer recording what reaches it; its notification handler fails on ``boom``."""

    def __init__(self) -> None:
        self.notes: list[tuple[str, Any]] = []
        self.garbage: list[str] = []

    def handle_request(self, request_id: Any, method: str, params: Any) -> Any:
        return {"ok": method}

    def handle_notification(self, method: str, params: Any) -> None:
        if method == "boom":
            raise TypeError("unhashable")
        self.notes.append((method, params))

    def handle_garbage(self, line: bytes, reason: str, message: Any) -> None:
        self.garbage.append(reason)


class ConnectionRobustnessTests(SynchronousTestCase):
    """No single message, however odd, stops the reading of the next ones."""

    def connect(self) -> tuple[Any, _Peer, list[dict[str, Any]], Any]:
        sent: list[dict[str, Any]] = []
        peer = _Peer()
        conn = jsonrpc.Connection(lambda data: sent.append(json.loads(data)), peer)
        framer = jsonrpc.LineFramer(1 << 20, conn.message_received, lambda n: None)
        return conn, peer, sent, framer

    def test_lone_surrogate_is_replaced(self) -> None:
        """A ``\\ud800`` escape decodes to U+FFFD, a pair stays the character it spells."""
        _, peer, _, framer = self.connect()
        framer.feed(
            b'{"jsonrpc":"2.0","method":"n","params":{"t":"\\ud800 x \\ud83d\\ude00"}}\n'
        )
        self.assertEqual(peer.notes, [("n", {"t": "\ufffd x \U0001f600"})])

    def test_bad_ids_are_invalid_requests(self) -> None:
        """An object, array or boolean id, or a method that is not a string: -32600, and the next line is read."""
        _, peer, sent, framer = self.connect()
        framer.feed(
            b'{"jsonrpc":"2.0","id":{"a":1},"method":"m"}\n'
            b'{"jsonrpc":"2.0","id":[1],"method":"m"}\n'
            b'{"jsonrpc":"2.0","id":true,"method":"m"}\n'
            b'{"jsonrpc":"2.0","id":4,"method":42}\n'
            b'{"jsonrpc":"2.0","id":5,"method":"m"}\n'
        )
        self.assertEqual(
            [(m["id"], m.get("error", {}).get("code")) for m in sent],
            [(None, -32600), (None, -32600), (None, -32600), (4, -32600), (5, None)],
        )
        self.assertEqual(sent[-1]["result"], {"ok": "m"})
        self.assertEqual(len(peer.garbage), 4)

    def test_failing_handler_is_recorded_and_reading_goes_on(self) -> None:
        """A handler that raises: the message is recorded, the rest of the same read is handled."""
        _, peer, _, framer = self.connect()
        framer.feed(
            b'{"jsonrpc":"2.0","method":"boom"}\n{"jsonrpc":"2.0","method":"after"}\n'
        )
        self.assertEqual(peer.notes, [("after", None)])
        self.assertEqual(peer.garbage, ["could not be handled (TypeError)"])
        self.assertEqual(len(self.flushLoggedErrors(TypeError)), 1)

    def test_deep_nesting_is_garbage(self) -> None:
        """A message nested past the decoder's depth is not JSON to us, not a crash."""
        _, peer, _, framer = self.connect()
        framer.feed(b"[" * 100000 + b"]" * 100000 + b"\n")
        self.assertEqual(peer.garbage, ["not JSON"])
