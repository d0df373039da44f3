# -*- test-case-name: tests.security.test_fairness -*-
"""
One identity cannot fill a daemon-wide cap and lock the others out: MCP
sessions, open resumable uploads and watches each have a per-identity
share below the daemon's cap (half of it when several identities can log
in, or the endpoint's ``limits.max_per_identity``).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.helpers import DaemonTestCase

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


class FairShareTests(DaemonTestCase):
    """Two identities, small caps: the first cannot take them all."""

    environ = {"ALICE": "alice-token", "BOB": "bob-token"}
    policy = {
        "auth": {
            "tokens": [
                {"id": "alice", "token_env": "ALICE", "scopes": ["*"]},
                {"id": "bob", "token_env": "BOB", "scopes": ["*"]},
            ]
        },
        "endpoints": {
            "mcp": {"limits": {"max_sessions": 4}},
            "files_uploads_create": {"limits": {"max_sessions": 4}},
            "files_watch": {"limits": {"max_per_identity": 1}},
        },
    }

    @inlineCallbacks
    def test_mcp_sessions(self) -> Any:
        """Alice opens 2 of 4 sessions, the third is 429; Bob still opens one."""
        codes = []
        for _ in range(3):
            reply = yield self.daemon.request(
                "POST", "/mcp", INIT, headers=MCP_HEADERS, token="alice-token"
            )
            codes.append(reply.status)
        self.assertEqual(codes, [200, 200, 429])
        bob = yield self.daemon.request(
            "POST", "/mcp", INIT, headers=MCP_HEADERS, token="bob-token"
        )
        self.assertEqual(bob.status, 200)

    @inlineCallbacks
    def test_uploads(self) -> Any:
        """Alice opens 2 of 4 uploads, the third is 429 naming the rule; Bob opens one."""
        codes = []
        for n in range(3):
            reply = yield self.daemon.request(
                "POST",
                "/files/uploads",
                {"path": f"a{n}.bin", "size": 10},
                token="alice-token",
            )
            codes.append(reply.status)
        self.assertEqual(codes, [201, 201, 429])
        self.assertIn("max_per_identity", reply.json()["rule"])
        bob = yield self.daemon.request(
            "POST", "/files/uploads", {"path": "b.bin", "size": 10}, token="bob-token"
        )
        self.assertEqual(bob.status, 201)

    @inlineCallbacks
    def open_watch(self, token: str, path: str) -> Any:
        """Open a watch stream on ``path``; its status (the stream is closed at cleanup)."""
        import os

        from twisted.internet import reactor
        from twisted.web.client import Agent
        from twisted.web.http_headers import Headers

        from sandboxd.testing import SSEReader

        os.makedirs(os.path.join(self.base_dir, path), exist_ok=True)
        hdrs = Headers({"X-Access-Token": [token]})
        url = f"{self.daemon.url}/files/watch?path={path}"
        response = yield Agent(reactor).request(b"GET", url.encode(), hdrs)
        reader = SSEReader()
        response.deliverBody(reader)
        self.addCleanup(lambda: reader.done.called or reader.disconnect())
        return response.code

    @inlineCallbacks
    def test_watches(self) -> Any:
        """With max_per_identity 1, Alice's second watch is 429; Bob starts his own."""
        first = yield self.open_watch("alice-token", "w1")
        second = yield self.open_watch("alice-token", "w2")
        bobs = yield self.open_watch("bob-token", "w3")
        self.assertEqual((first, second, bobs), (200, 429, 200))
        # Following a watch someone else started costs nothing.
        shared = yield self.open_watch("bob-token", "w1")
        self.assertEqual(shared, 200)
