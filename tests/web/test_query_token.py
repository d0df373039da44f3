"""
SPEC §20: ``access_token`` in the query is accepted on the GET streaming
routes a browser's EventSource follows, masked in the audit, and nowhere
else on the HTTP port.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import Agent, readBody
from twisted.web.http_headers import Headers

from sandboxd.routes import default_table
from sandboxd.web.query_token import query_token
from tests.helpers import DaemonTestCase

TOKEN = "qtok-123"


class QueryTokenTests(SynchronousTestCase):
    """Which requests may authenticate with the query."""

    def test_routes(self) -> None:
        """files_watch, agents_events, and process_output with follow=true; nothing else."""
        table = default_table()
        q = b"path=w&access_token=abc"
        self.assertEqual(query_token(table.get("files_watch"), "GET", q), b"abc")
        self.assertEqual(query_token(table.get("agents_events"), "GET", q), b"abc")
        output = table.get("process_output")
        self.assertIsNone(query_token(output, "GET", q))
        self.assertIsNone(query_token(output, "GET", q + b"&follow=false"))
        self.assertEqual(query_token(output, "GET", q + b"&follow=true"), b"abc")
        for other in (
            "files_list",
            "download",
            "capabilities",
            "pty_list_sessions",
            "shell",
        ):
            self.assertIsNone(query_token(table.get(other), "GET", q))
        self.assertIsNone(query_token(table.get("files_watch"), "POST", q))
        self.assertIsNone(
            query_token(table.get("files_watch"), "GET", b"access_token=")
        )


class QueryTokenHttpTests(DaemonTestCase):
    """Against a daemon with a token."""

    token = TOKEN
    audit = True
    policy = {"defaults": {"audit": "all"}}

    @inlineCallbacks
    def status(self, target: str) -> Any:
        """The status of a GET with no header token (a streaming answer is cut off)."""
        response = yield Agent(reactor).request(
            b"GET", f"{self.daemon.url}{target}".encode(), Headers({})
        )
        if response.code == 200:
            response._transport.loseConnection()
        else:
            yield readBody(response)
        return response.code

    @inlineCallbacks
    def test_watch_with_query_token(self) -> Any:
        """GET /files/watch?access_token=T opens the stream; a wrong token is 401."""
        os.makedirs(os.path.join(self.base_dir, "w"))
        self.assertEqual(
            (yield self.status(f"/files/watch?path=w&access_token={TOKEN}")), 200
        )
        self.assertEqual(
            (yield self.status("/files/watch?path=w&access_token=nope")), 401
        )
        self.assertEqual((yield self.status("/files/watch?path=w")), 401)

    @inlineCallbacks
    def test_process_output_follow_only(self) -> Any:
        """process_output takes the query token only while following."""
        reply = yield self.request("POST", "/process/start", {"command": "sleep 5"})
        self.assertEqual(reply.status, 200, reply.body)
        pid = reply.json()["pid"]
        self.addCleanup(self.request, "POST", f"/process/{pid}/kill", {})
        follow = f"/process/{pid}/output?follow=true&access_token={TOKEN}"
        self.assertEqual((yield self.status(follow)), 200)
        self.assertEqual(
            (yield self.status(f"/process/{pid}/output?access_token={TOKEN}")), 401
        )

    @inlineCallbacks
    def test_other_routes_refuse(self) -> Any:
        """Any other HTTP route ignores a query token: 401 without a header."""
        for target in (
            f"/files/list?path=.&access_token={TOKEN}",
            f"/capabilities?access_token={TOKEN}",
            f"/pty/sessions?access_token={TOKEN}",
        ):
            self.assertEqual((yield self.status(target)), 401, target)

    @inlineCallbacks
    def test_masked_in_audit(self) -> Any:
        """The audit record of a query-token request never holds the token."""
        os.makedirs(os.path.join(self.base_dir, "w"))
        yield self.status(f"/files/watch?path=w&access_token={TOKEN}")
        yield self.status(f"/files/list?path=.&access_token={TOKEN}")
        for _ in range(50):
            lines = self.audit_lines()
            if any(r["endpoint"] == "files_watch" for r in lines):
                break
            yield self.request("GET", "/health")
        self.assertTrue(any(r["endpoint"] == "files_watch" for r in lines))
        with open(self.audit_path) as f:
            self.assertNotIn(TOKEN, f.read())

    @inlineCallbacks
    def test_ambiguous(self) -> Any:
        """A query token and a different header token are 400 ambiguous_credentials."""
        os.makedirs(os.path.join(self.base_dir, "w"))
        reply = yield self.request(
            "GET", "/files/watch?path=w&access_token=other", token=TOKEN
        )
        self.assertEqual(
            (reply.status, reply.json()["code"]), (400, "ambiguous_credentials")
        )
