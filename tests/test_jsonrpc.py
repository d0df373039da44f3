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
