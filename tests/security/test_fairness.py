# -*- test-case-name: tests.security.test_fairness -*-
"""
One identity cannot fill a daemon-wide cap and lock the others out: MCP
sessions, open resumable uploads and watches each have a per-identity
share below the daemon's cap (half of it when several identities can log
in, or the endpoint's ``limits.max_per_identity``).
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import inlineCallbacks

from sandboxd.policy import defaults
from tests.helpers import DaemonTestCase
from tests.openai_api.sdk import TOKENS, openai_policy

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


class TerminalAndProcessShareTests(DaemonTestCase):
    """Terminals and background processes keep a share for the others too."""

    environ = {"ALICE": "alice-token", "BOB": "bob-token"}
    policy = {
        "auth": {
            "tokens": [
                {"id": "alice", "token_env": "ALICE", "scopes": ["*"]},
                {"id": "bob", "token_env": "BOB", "scopes": ["*"]},
            ]
        },
        "endpoints": {
            "pty_create_session": {"limits": {"max_sessions": 4}},
            "process_start": {"limits": {"max_processes": 4}},
        },
    }

    @inlineCallbacks
    def test_terminals(self) -> Any:
        """
        Alice opens 2 of 4 terminals, the third is 429 naming
        max_per_identity; Bob still opens one.
        """
        codes = []
        for _ in range(3):
            reply = yield self.request(
                "POST", "/pty/sessions", {"shell": "sh"}, token="alice-token"
            )
            codes.append(reply.status)
        self.assertEqual(codes, [200, 200, 429])
        self.assertEqual(reply.json()["code"], "too_many_sessions")
        self.assertIn("max_per_identity", reply.json()["rule"])
        bob = yield self.request(
            "POST", "/pty/sessions", {"shell": "sh"}, token="bob-token"
        )
        self.assertEqual(bob.status, 200, bob.body)

    @inlineCallbacks
    def test_processes(self) -> Any:
        """
        Alice runs 2 of 4 background processes, the third is 429 naming
        max_per_identity; Bob still starts one.
        """
        start = {"command": "sleep 30", "shell": "sh"}
        codes = []
        for _ in range(3):
            reply = yield self.request(
                "POST", "/process/start", start, token="alice-token"
            )
            codes.append(reply.status)
        self.assertEqual(codes, [200, 200, 429])
        self.assertEqual(reply.json()["code"], "too_many_processes")
        self.assertIn("max_per_identity", reply.json()["rule"])
        bob = yield self.request("POST", "/process/start", start, token="bob-token")
        self.assertEqual(bob.status, 200, bob.body)


class LinkShareTests(DaemonTestCase):
    """
    A capability link counts against its minter's bounds: minting links
    gets a token no more calls and no bigger share than its own.
    """

    environ = {"ALICE": "alice-token", "BOB": "bob-token"}
    policy = {
        "auth": {
            "tokens": [
                {
                    "id": "alice",
                    "token_env": "ALICE",
                    "scopes": ["files:read", "files:write", "links:mint"],
                },
                {"id": "bob", "token_env": "BOB", "scopes": ["*"]},
            ]
        },
        "endpoints": {
            "files_stat": {"limits": {"rate_per_minute": 3}},
            "files_uploads_create": {"limits": {"max_sessions": 4}},
        },
    }

    @inlineCallbacks
    def link(self) -> Any:
        """A console link of Alice's with her file scopes."""
        reply = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["files:read", "files:write"]},
            token="alice-token",
        )
        self.assertEqual(reply.status, 201, reply.body)
        return reply.json()["token"]

    @inlineCallbacks
    def test_rate(self) -> Any:
        """
        Alice spends her 3 calls a minute; a link she mints then is 429
        too, and one minted before spends the same bucket.
        """
        early = yield self.link()
        with open(os.path.join(self.base_dir, "f"), "w") as f:
            f.write("x")
        codes = []
        for token in ("alice-token", early, "alice-token"):
            reply = yield self.request("GET", "/files/stat?path=f", token=token)
            codes.append(reply.status)
        self.assertEqual(codes, [200, 200, 200])
        late = yield self.link()
        for token in (late, early, "alice-token"):
            reply = yield self.request("GET", "/files/stat?path=f", token=token)
            self.assertEqual(reply.status, 429, reply.body)
            self.assertEqual(reply.json()["code"], "rate_limited")
        bob = yield self.request("GET", "/files/stat?path=f", token="bob-token")
        self.assertEqual(bob.status, 200, bob.body)

    @inlineCallbacks
    def test_uploads(self) -> Any:
        """
        Alice's links open uploads out of her share (2 of 4): the second
        link's is 429, Bob still opens one, and Alice may read and drop the
        upload her link opened.
        """
        first = yield self.link()
        second = yield self.link()
        codes = []
        ids = []
        for n, token in enumerate(("alice-token", first, second)):
            reply = yield self.request(
                "POST", "/files/uploads", {"path": f"a{n}.bin", "size": 10}, token=token
            )
            codes.append(reply.status)
            ids.append(reply.json().get("upload_id"))
        self.assertEqual(codes, [201, 201, 429])
        self.assertIn("max_per_identity", reply.json()["rule"])
        bob = yield self.request(
            "POST", "/files/uploads", {"path": "b.bin", "size": 10}, token="bob-token"
        )
        self.assertEqual(bob.status, 201, bob.body)
        seen = yield self.request(
            "GET", f"/files/uploads/{ids[1]}", token="alice-token"
        )
        self.assertEqual(seen.status, 200, seen.body)
        dropped = yield self.request(
            "DELETE", f"/files/uploads/{ids[1]}", token="alice-token"
        )
        self.assertEqual(dropped.status, 200, dropped.body)
        again = yield self.request(
            "POST", "/files/uploads", {"path": "a3.bin", "size": 10}, token=second
        )
        self.assertEqual(again.status, 201, again.body)

    @inlineCallbacks
    def test_mcp_sessions(self) -> Any:
        """Of 32 MCP sessions, Alice's share (16) holds her links' sessions too."""
        token = yield self.link()
        codes = []
        for n in range(17):
            reply = yield self.daemon.request(
                "POST",
                "/mcp",
                INIT,
                headers=MCP_HEADERS,
                token="alice-token" if n % 2 else token,
            )
            codes.append(reply.status)
        self.assertEqual(codes, [200] * 16 + [429])
        bob = yield self.daemon.request(
            "POST", "/mcp", INIT, headers=MCP_HEADERS, token="bob-token"
        )
        self.assertEqual(bob.status, 200)


def _v1_policy() -> dict[str, Any]:
    """The ``/v1`` test policy, Alice (``user``) allowed to mint links, 2 files each."""
    policy = openai_policy()
    policy["auth"]["tokens"][0]["scopes"] = ["agents:use", "links:mint"]
    policy["endpoints"] = {"agents_files_create": {"limits": {"max_files": 2}}}
    return policy


class OpenAILinkShareTests(DaemonTestCase):
    """
    On the ``/v1`` door too, what a link makes is its minter's and counts
    against the minter's bounds: links get a token no more vaults or files.
    """

    environ = TOKENS
    policy = _v1_policy()

    def setUp(self) -> Any:
        # Two vaults per identity: the bound is a default, not a policy limit.
        self.patch(defaults, "OPENAI_MAX_VAULTS", 2)
        return super().setUp()

    @inlineCallbacks
    def link(self) -> Any:
        """A console link of the user's for the agents API."""
        reply = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["agents:use"]},
            token="u-token",
        )
        self.assertEqual(reply.status, 201, reply.body)
        return reply.json()["token"]

    @inlineCallbacks
    def ids(self, path: str, token: str) -> Any:
        """The ids ``GET path`` lists for ``token``."""
        reply = yield self.request("GET", path, token=token)
        self.assertEqual(reply.status, 200, reply.body)
        return sorted(o["id"] for o in reply.json()["data"])

    @inlineCallbacks
    def test_vaults(self) -> Any:
        """
        The user's vault and its first link's fill the user's 2: the second
        link's is 400, another identity still makes one; the user lists
        and deletes the link's vault, and the second link then makes one.
        """
        first = yield self.link()
        second = yield self.link()
        made = []
        for token in ("u-token", first, second):
            reply = yield self.request("POST", "/v1/vaults", {"name": "v"}, token=token)
            made.append(reply)
        self.assertEqual([r.status for r in made], [200, 200, 400])
        self.assertIn("at most 2 vaults", made[2].json()["error"]["message"])
        ids = sorted(r.json()["id"] for r in made[:2])
        listed = yield self.ids("/v1/vaults", "u-token")
        self.assertEqual(listed, ids)
        by_link = yield self.ids("/v1/vaults", second)
        self.assertEqual(by_link, ids)
        other = yield self.request("POST", "/v1/vaults", {"name": "o"}, token="o-token")
        self.assertEqual(other.status, 200, other.body)
        theirs = yield self.ids("/v1/vaults", "o-token")
        self.assertEqual(theirs, [other.json()["id"]])
        gone = yield self.request(
            "DELETE", f"/v1/vaults/{made[1].json()['id']}", token="u-token"
        )
        self.assertEqual(gone.status, 200, gone.body)
        again = yield self.request("POST", "/v1/vaults", {"name": "v"}, token=second)
        self.assertEqual(again.status, 200, again.body)

    @inlineCallbacks
    def test_files(self) -> Any:
        """
        Of ``max_files`` 2, the user's file and a link's hold both: a second
        link's is 400 naming ``max_files``, and stores nothing; the user
        reads the link's file.
        """
        self.daemon.context.state_dir = os.path.join(self.base_dir, "state")
        first = yield self.link()
        second = yield self.link()
        made = []
        for n, token in enumerate(("u-token", first, second)):
            body = {"purpose": "user_data", "filename": f"f{n}", "data": "eHl6"}
            reply = yield self.request("POST", "/v1/files", body, token=token)
            made.append(reply)
        self.assertEqual([r.status for r in made], [200, 200, 400], made[2].body)
        self.assertIn("max_files", made[2].json()["error"]["setting"])
        listed = yield self.ids("/v1/files", "u-token")
        self.assertEqual(listed, sorted(r.json()["id"] for r in made[:2]))
        content = yield self.request(
            "GET", f"/v1/files/{made[1].json()['id']}/content", token="u-token"
        )
        self.assertEqual((content.status, content.body), (200, b"xyz"))


def _agents_policy() -> dict[str, Any]:
    """
    Two agent slots for the ``/v1`` test identities, ``user`` and ``other``
    also on the native routes, ``user`` allowed to mint links.
    """
    policy = openai_policy(limits={"max_sessions": 2})
    tokens = policy["auth"]["tokens"]
    tokens[0]["scopes"] = ["agents:use", "agents:run", "links:mint"]
    tokens[1]["scopes"] = ["agents:use", "agents:run"]
    return policy


class AgentShareTests(DaemonTestCase):
    """
    Agent sessions, native and ``/v1`` alike, have a per-identity share of
    ``max_sessions`` (half of 2 here, several identities logging in), which
    a link's sessions count against as its minter's.
    """

    timeout = 60
    environ = TOKENS
    policy = _agents_policy()

    def live(self) -> int:
        """How many agents run now."""
        return len(self.daemon.context.agents.get().live())

    @inlineCallbacks
    def native(self, token: str) -> Any:
        """A native session for ``token`` (closed at the end when made)."""
        reply = yield self.request(
            "POST",
            "/agents/sessions",
            {"agent": "fake", "cwd": self.base_dir},
            token=token,
        )
        if reply.status == 201:
            sid = reply.json()["session_id"]
            self.addCleanup(
                self.request, "DELETE", f"/agents/sessions/{sid}", token=token
            )
        return reply

    @inlineCallbacks
    def test_second_identity_still_gets_one(self) -> Any:
        """
        ``user`` holds its one agent: another through its link, natively
        or on ``/v1``, is 429 naming ``max_per_identity``; ``other`` still
        starts one.
        """
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["agents:use", "agents:run"]},
            token="u-token",
        )
        link = minted.json()["token"]
        first = yield self.native("u-token")
        self.assertEqual(first.status, 201, first.body)
        refused = yield self.native(link)
        self.assertEqual(refused.status, 429, refused.body)
        self.assertEqual(refused.json()["code"], "too_many_sessions")
        self.assertIn("max_per_identity", refused.json()["rule"])
        body = {
            "agent": {"model": "fake"},
            "environment": {
                "type": "self_hosted",
                "workspace_directory": self.base_dir,
            },
        }
        door = yield self.request("POST", "/v1/agents/sessions", body, token=link)
        self.assertEqual(door.status, 429, door.body)
        theirs = yield self.native("o-token")
        self.assertEqual(theirs.status, 201, theirs.body)
        self.assertEqual(self.live(), 2)

    @inlineCallbacks
    def test_own_idle_conversation_gives_way(self) -> Any:
        """
        At its share, the caller's own idle conversation behind a response
        gives its agent up for the caller's new session, leaving the other
        slot free.
        """
        answered = yield self.request(
            "POST",
            "/v1/responses",
            {"model": "fake", "input": "echo 1"},
            token="u-token",
        )
        self.assertEqual(answered.status, 200, answered.body)
        mine = yield self.native("u-token")
        self.assertEqual(mine.status, 201, mine.body)
        self.assertEqual(self.live(), 1)
        theirs = yield self.native("o-token")
        self.assertEqual(theirs.status, 201, theirs.body)
