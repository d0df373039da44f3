"""
Hostile messages on the PTY WebSocket (SPEC §8): binary garbage, frames
that are not the documented JSON, resizes with absurd sizes and unknown
signals are dropped, and the terminal lives on; a frame over
``max_message_bytes`` closes that connection with 1009 (message too big),
a text frame that is not UTF-8 with 1007, and the session outlives it, as
it outlives any WebSocket.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.routes.test_terminal import TerminalCase, is_output
from tests.terminals.wsclient import TestClient

#: A small message cap, so the oversized frame is cheap to send.
CAP = 64 * 1024


class HostileMessageTests(TerminalCase):
    """The PTY port drops what it does not understand; the session survives."""

    policy = {"endpoints": {"pty_connect": {"limits": {"max_message_bytes": CAP}}}}

    @inlineCallbacks
    def session_state(self, session_id: str) -> Any:
        reply = yield self.request("GET", f"/pty/sessions/{session_id}")
        self.assertEqual(reply.status, 200, reply.body)
        return reply.json()

    @inlineCallbacks
    def still_answers(self, client: TestClient, word: str) -> Any:
        """The shell still runs a command typed on ``client``."""
        client.type(f"echo {word}-$((20+3))\n")
        yield client.wait_output(f"{word}-23")

    @inlineCallbacks
    def test_garbage_dropped(self) -> Any:
        """
        Binary frames, invalid JSON, JSON that is not an object, unknown
        types, input that is not a string, resizes out of range or of the
        wrong type and unknown signals change nothing: the connection stays
        open, the size stays 80x24, and the shell still answers.
        """
        created = yield self.create()
        sid = created["session_id"]
        client = yield self.attach(sid)
        yield client.wait_for(is_output)
        client.sendMessage(b"\x00\xff\xfe garbage \x80", isBinary=True)
        for raw in (b"{not json", b"[1, 2]", b"42", b"null", b'"input"', b""):
            client.sendMessage(raw, isBinary=False)
        junk: list[Any] = [
            {"type": "nonsense"},
            {"type": "input", "data": 12},
            {"type": "input", "data": ["ls"]},
            {"type": "resize", "cols": 10**9, "rows": 10**9},
            {"type": "resize", "cols": -1, "rows": 24},
            {"type": "resize", "cols": 0, "rows": 0},
            {"type": "resize", "cols": "wide", "rows": None},
            {"type": "resize", "cols": 1e300, "rows": 2.5},
            {"type": "resize", "cols": True, "rows": False},
            {"type": "resize"},
            {"type": "signal", "signal": "SIGSTOP"},
            {"type": "signal", "signal": 9},
            {"type": "signal", "signal": "NOT_A_SIGNAL"},
        ]
        for message in junk:
            client.send_json(message)
        yield self.still_answers(client, "alive")
        self.assertFalse(client.closed.called)
        state = yield self.session_state(sid)
        self.assertEqual((state["cols"], state["rows"], state["alive"]), (80, 24, True))

    @inlineCallbacks
    def test_protocol_violations_close_only_the_connection(self) -> Any:
        """
        A text frame over ``max_message_bytes`` closes the connection with
        1009, one that is not UTF-8 with 1007 (RFC 6455 §8.1: a text frame
        is UTF-8, so this is not a frame to drop but a broken connection);
        each time the session is still listed alive and a new client
        attaches and types into the same shell.
        """
        created = yield self.create()
        sid = created["session_id"]
        oversized = json.dumps({"type": "input", "data": "x" * (CAP + 1)}).encode()
        for payload, expected in ((oversized, 1009), (b"\xff\xfe{}", 1007)):
            client = yield self.attach(sid)
            yield client.wait_for(is_output)
            client.sendMessage(payload, isBinary=False)
            code, _reason = yield client.closed
            self.assertEqual(code, expected)
            state = yield self.session_state(sid)
            self.assertTrue(state["alive"])
        again = yield self.attach(sid)
        yield self.still_answers(again, "back")
