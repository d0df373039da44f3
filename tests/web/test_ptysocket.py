"""
The PTY WebSocket on the API port (``/pty/sessions/{id}/ws``): the same
endpoint and gate as the PTY port, so a page served by the API port reaches
its terminals on its own origin.
"""

from __future__ import annotations

import hashlib
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater

from sandboxd.web.ptysocket import rewritten_head, session_of
from tests.routes.test_terminal import TerminalCase, is_output
from tests.terminals.wsclient import TestClient, connect

TOKEN = "api-pty-token"


class PathTests(TerminalCase):
    """Which paths are the terminal socket."""

    autostart = False

    def test_session_of(self) -> None:
        """Only ``/pty/sessions/ID/ws`` names a session; the query is not the path."""
        self.assertEqual(session_of(b"/pty/sessions/abc/ws"), "abc")
        self.assertEqual(session_of(b"/pty/sessions/abc/ws?offset=3"), "abc")
        self.assertIsNone(session_of(b"/pty/sessions/abc"))
        self.assertIsNone(session_of(b"/pty/sessions//ws"))
        self.assertIsNone(session_of(b"/pty/sessions/a/b/ws"))

    def test_head_rewritten(self) -> None:
        """The head autobahn reads names ``/pty`` with the session first and keeps the rest."""

        class Request:
            class requestHeaders:
                @staticmethod
                def getAllRawHeaders() -> list[tuple[bytes, list[bytes]]]:
                    return [(b"Host", [b"h:1"]), (b"Upgrade", [b"websocket"])]

        head = rewritten_head(
            Request(), b"/pty/sessions/s1/ws?offset=5&session_id=other", "s1"
        )
        self.assertEqual(
            head,
            b"GET /pty?session_id=s1&offset=5 HTTP/1.1\r\nHost: h:1\r\n"
            b"Upgrade: websocket\r\n\r\n",
        )


class ApiPortSocketTests(TerminalCase):
    """A terminal attached through the API port."""

    token = TOKEN
    audit = True
    policy = {"defaults": {"audit": "all"}}

    def socket(self, session_id: str, **params: Any) -> Any:
        client: Any = connect(
            self.daemon.port, None, path=f"/pty/sessions/{session_id}/ws", **params
        )
        return client

    @inlineCallbacks
    def test_echo_and_offset(self) -> Any:
        """Started, then the echo; a second client with ``offset`` gets only what followed it."""
        created = yield self.create(token=TOKEN)
        sid = created["session_id"]
        client: TestClient = yield self.socket(sid, access_token=TOKEN)
        self.addCleanup(self.hang_up, client)
        first = yield client.wait_for(lambda m: True)
        self.assertEqual(first["event"], "started")
        client.type("echo api-port-$((6*7))\n")
        yield client.wait_output("api-port-42")
        frames = [m for m in client.messages if is_output(m)]
        last = frames[-1]
        end = last["offset"] + len(last["data"].encode())
        client.type("echo after-$((2*3))\n")
        yield client.wait_output("after-6")
        again: TestClient = yield self.socket(sid, access_token=TOKEN, offset=end)
        self.addCleanup(self.hang_up, again)
        yield again.wait_output("after-6")
        self.assertNotIn("api-port-42", again.output())

    @inlineCallbacks
    def test_audited_as_asked(self) -> Any:
        """The handshake's audit line is the PTY door's, with the path the client asked for."""
        created = yield self.create()
        sid = created["session_id"]
        client: TestClient = yield self.socket(sid, access_token=TOKEN)
        self.addCleanup(self.hang_up, client)
        yield client.wait_for(lambda m: True)
        lines = [r for r in self.audit_lines() if r.get("endpoint") == "pty_connect"]
        self.assertEqual(len(lines), 1, lines)
        self.assertEqual(lines[0]["via"], "ws")
        self.assertEqual(lines[0]["path"], f"/pty/sessions/{sid}/ws")
        self.assertEqual(lines[0]["status"], 101)
        self.assertNotIn(TOKEN, str(lines[0]))

    @inlineCallbacks
    def test_refused_without_token(self) -> Any:
        """No credential: the handshake is refused (401), as on the PTY port."""
        created = yield self.create(token=TOKEN)
        reply = yield self.request(
            "GET",
            f"/pty/sessions/{created['session_id']}/ws",
            headers={
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Version": "13",
            },
            token=None,
        )
        self.assertEqual(reply.status, 401)
        self.assertEqual(reply.json()["code"], "unauthorized")

    @inlineCallbacks
    def test_unknown_session(self) -> Any:
        """An unknown id closes with 1008, the PTY port's reason."""
        client: TestClient = yield self.socket("nope", access_token=TOKEN)
        code, reason = yield client.closed
        self.assertEqual((code, reason), (1008, "Unknown session: nope"))


AGENT = "agent-token-0123456789"
OTHER = "other-token-0123456789"


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class LinkAttachTests(TerminalCase):
    """A console link attaches to its minter's terminals, and only to those."""

    policy = {
        "auth": {
            "tokens": [
                {
                    "id": "agent",
                    "token_sha256": _sha(AGENT),
                    "scopes": ["terminal:use", "links:mint", "core:read"],
                },
                {
                    "id": "other",
                    "token_sha256": _sha(OTHER),
                    "scopes": ["terminal:use"],
                },
            ]
        }
    }

    @inlineCallbacks
    def test_minters_terminal(self) -> Any:
        """The agent's link types into the agent's shell; another identity's shell is unknown to it."""
        mine = yield self.create(token=AGENT)
        theirs = yield self.create(token=OTHER)
        minted = yield self.request(
            "POST", "/auth/links", {"audience": "console"}, token=AGENT
        )
        link = minted.json()["token"]
        client: TestClient = yield connect(
            self.daemon.port,
            None,
            path=f"/pty/sessions/{mine['session_id']}/ws",
            access_token=link,
        )
        self.addCleanup(self.hang_up, client)
        client.type("echo taken-over-$((3*3))\n")
        yield client.wait_output("taken-over-9")
        other: TestClient = yield connect(
            self.daemon.port,
            None,
            path=f"/pty/sessions/{theirs['session_id']}/ws",
            access_token=link,
        )
        code, reason = yield other.closed
        self.assertEqual(
            (code, reason), (1008, f"Unknown session: {theirs['session_id']}")
        )

    @inlineCallbacks
    def linked(self, ttl: int = 600) -> Any:
        """The agent's terminal, a console link of the agent's, and its socket."""
        mine = yield self.create(token=AGENT)
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "ttl_seconds": ttl},
            token=AGENT,
        )
        client: TestClient = yield connect(
            self.daemon.port,
            None,
            path=f"/pty/sessions/{mine['session_id']}/ws",
            access_token=minted.json()["token"],
        )
        self.addCleanup(self.hang_up, client)
        client.type("echo linked-$((2*3))\n")
        yield client.wait_output("linked-6")
        return mine["session_id"], minted.json()["link_id"], client

    @inlineCallbacks
    def test_revoking_the_link_closes_its_socket(self) -> Any:
        """
        Revoking a link closes the terminal socket it opened, 1008 saying
        why (the link is no credential from then on, and must not keep a
        shell it had open); the terminal itself, its minter's, lives on.
        """
        sid, link_id, client = yield self.linked()
        gone = yield self.request("DELETE", f"/auth/links/{link_id}", token=AGENT)
        self.assertEqual(gone.status, 200, gone.body)
        code, reason = yield client.closed
        self.assertEqual((code, reason), (1008, "the link was revoked"))
        listed = yield self.request("GET", "/pty/sessions", token=AGENT)
        self.assertIn(sid, listed.body.decode())

    @inlineCallbacks
    def test_an_expired_link_closes_its_socket(self) -> Any:
        """A link's socket is closed when the link expires, saying so."""
        started = reactor.seconds()
        _, _, client = yield self.linked(ttl=2)
        code, reason = yield client.closed
        self.assertEqual((code, reason), (1008, "the link has expired"))
        self.assertGreaterEqual(reactor.seconds() - started, 1.9)


SECOND = "second-pty-token"


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _reload_policy(tokens: list[str], terminal: bool = True) -> dict[str, Any]:
    ids = {TOKEN: "admin", SECOND: "other"}
    return {
        "groups": {"terminal": terminal},
        "auth": {
            "tokens": [
                {"id": ids[t], "token_sha256": _sha(t), "scopes": ["*"]} for t in tokens
            ]
        },
    }


class ReloadTests(TerminalCase):
    """
    A policy reload closes the terminal sockets it no longer lets in: a
    socket lasts as long as its client keeps it, so a leaked identity
    revoked by a reload must not keep the shell it had open.
    """

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        return self.start_on_policy_file(_reload_policy([TOKEN, SECOND]))

    @inlineCallbacks
    def attached(self) -> Any:
        created = yield self.create(token=TOKEN)
        sid = created["session_id"]
        client: TestClient = yield connect(
            self.daemon.port, None, path=f"/pty/sessions/{sid}/ws", access_token=TOKEN
        )
        self.addCleanup(self.hang_up, client)
        first = yield client.wait_for(lambda m: True)
        self.assertEqual(first["event"], "started")
        return sid, client

    @inlineCallbacks
    def test_removed_identity_loses_its_terminal(self) -> Any:
        """
        A reload that takes the identity out: its open socket is closed
        1008 at once, saying why, and its terminal is ended; another
        identity's call still works.
        """
        sid, client = yield self.attached()
        self.reload_policy(_reload_policy([SECOND]))
        code, reason = yield client.closed
        self.assertEqual(code, 1008)
        self.assertIn("no longer in the policy", reason)
        for _ in range(50):
            listed = yield self.request("GET", "/pty/sessions", token=SECOND)
            self.assertEqual(listed.status, 200, listed.body)
            if sid not in listed.body.decode():
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertNotIn(sid, listed.body.decode())

    @inlineCallbacks
    def test_rotated_token_loses_its_socket(self) -> Any:
        """
        A reload that gives the identity a new token (a leaked one
        rotated): the socket the old token opened is closed 1008 saying
        why; the terminal, the identity's, lives on for the new token.
        """
        sid, client = yield self.attached()
        rotated = _reload_policy([TOKEN, SECOND])
        rotated["auth"]["tokens"][0]["token_sha256"] = _sha("rotated-pty-token")
        self.reload_policy(rotated)
        code, reason = yield client.closed
        self.assertEqual(code, 1008)
        self.assertIn("was changed", reason)
        old = yield self.request("GET", "/pty/sessions", token=TOKEN)
        self.assertEqual(old.status, 401)
        listed = yield self.request("GET", "/pty/sessions", token="rotated-pty-token")
        self.assertIn(sid, listed.body.decode())

    @inlineCallbacks
    def test_terminals_switched_off(self) -> Any:
        """A reload that turns the terminal group off closes its sockets 1008."""
        _, client = yield self.attached()
        self.reload_policy(_reload_policy([TOKEN, SECOND], terminal=False))
        code, reason = yield client.closed
        self.assertEqual(code, 1008)
        self.assertIn("pty_connect", reason)

    @inlineCallbacks
    def test_kept_identity_keeps_its_terminal(self) -> Any:
        """A reload that still lets the identity in leaves its socket open."""
        _, client = yield self.attached()
        self.reload_policy(_reload_policy([TOKEN]))
        client.type("echo still-$((6*7))\n")
        yield client.wait_output("still-42")
        self.assertFalse(client.closed.called)
