"""
The JSON-RPC 2.0 messages the MCP door and the agents engine both send.
"""

from __future__ import annotations

import json

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
