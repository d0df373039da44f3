"""
The terminal group against a real daemon: REST sessions on real PTYs and
the WebSocket a user attaches with (SPEC §7.5, §8).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import deferLater

from tests.helpers import DaemonTestCase
from tests.test_terminal_wsclient import TestClient, connect, quiet_server

TOKEN = "pty-token"


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"


def sleep(seconds: float) -> Deferred[None]:
    """Let the reactor run (only to wait for something outside it)."""
    return deferLater(reactor, seconds, lambda: None)


class TerminalCase(DaemonTestCase):
    """A daemon with its WebSocket timers off, and session helpers."""

    environ = {"SHELL": "/bin/sh", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    @inlineCallbacks
    def start(self, **kwargs: Any) -> Any:
        daemon = yield super().start(**kwargs)
        quiet_server(daemon.context.services["terminals"])
        return daemon

    @property
    def pty_port(self) -> int:
        port: int = self.daemon.context.pty_port
        return port

    @inlineCallbacks
    def create(self, body: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """POST /pty/sessions; returns the JSON (fails the test unless 200)."""
        reply = yield self.request("POST", "/pty/sessions", body or {}, **kwargs)
        self.assertEqual(reply.status, 200, reply.body)
        return reply.json()

    @inlineCallbacks
    def attach(self, session_id: str | None, **kwargs: Any) -> Any:
        """A connected client whose connection is closed after the test."""
        client: TestClient = yield connect(self.pty_port, session_id, **kwargs)
        self.addCleanup(self.hang_up, client)
        return client

    def hang_up(self, client: TestClient) -> Deferred[Any]:
        if client.closed.called:
            return client.closed
        client.transport.loseConnection()
        return client.closed


class SessionTests(TerminalCase):
    """REST sessions and one client at a time."""

    @inlineCallbacks
    def test_create_answers_id_url_pid(self) -> Any:
        """POST /pty/sessions answers session_id, pid and a ws_url naming the
        request's host and the real PTY port."""
        created = yield self.create()
        self.assertEqual(set(created), {"session_id", "ws_url", "pid"})
        self.assertEqual(
            created["ws_url"],
            f"ws://127.0.0.1:{self.pty_port}/pty?session_id={created['session_id']}",
        )
        self.assertTrue(alive(created["pid"]))

    @inlineCallbacks
    def test_started_then_echo(self) -> Any:
        """A client gets ``started`` first, then the echo of what it types."""
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        first = yield client.wait_for(lambda m: True)
        self.assertEqual(
            first,
            {
                "type": "event",
                "event": "started",
                "session_id": created["session_id"],
                "pid": created["pid"],
            },
        )
        client.type("echo hel''lo-there\n")
        yield client.wait_output("hello-there")
