"""
The one gate of SPEC §16: the same decision, code and audit line whichever
door a call comes through.  The pure decisions run in memory; the WebSocket
door is driven by websocket-client, the client most Python users run.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from twisted.internet import threads
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access import gate
from sandboxd.errors import Code
from sandboxd.testing import (
    MemoryAudit,
    feed,
    make_request,
    memory_context,
    memory_site,
)
from tests.helpers import DaemonTestCase

try:
    import websocket
except ImportError:  # pragma: no cover - the dev extra installs it
    websocket = None


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


TOKENS = {
    "auth": {
        "tokens": [
            {"id": "reader", "token_sha256": digest("r"), "scopes": ["files:read"]},
            {"id": "admin", "token_sha256": digest("a"), "scopes": ["*"]},
        ]
    }
}


def headers(**values: str) -> dict[bytes, list[bytes]]:
    return {
        k.replace("_", "-").lower().encode(): [v.encode()] for k, v in values.items()
    }


class SameOriginTests(SynchronousTestCase):
    """SPEC §5.2: an Origin equal to the request's own scheme, host and port."""

    def test_own_origin(self) -> None:
        """websocket-client's default Origin for ws://127.0.0.1:9001 is same-origin."""
        self.assertTrue(
            gate.same_origin("http://127.0.0.1:9001", "127.0.0.1:9001", False)
        )
        self.assertTrue(
            gate.same_origin("HTTP://LocalHost:9001", "localhost:9001", False)
        )
        self.assertTrue(gate.same_origin("https://[::1]", "[::1]:443", True))

    def test_default_ports(self) -> None:
        """A missing port is the scheme's default on both sides."""
        self.assertTrue(gate.same_origin("http://sandbox", "sandbox:80", False))
        self.assertFalse(gate.same_origin("http://sandbox", "sandbox:9000", False))

    def test_foreign_origins(self) -> None:
        """Another host, port or scheme, ``null`` and malformed values are foreign."""
        for origin, host, secure in [
            ("http://evil.test", "127.0.0.1:9001", False),
            ("http://127.0.0.1:9002", "127.0.0.1:9001", False),
            ("https://127.0.0.1:9001", "127.0.0.1:9001", False),
            ("http://127.0.0.1:9001", "127.0.0.1:9001", True),
            ("null", "127.0.0.1:9001", False),
            ("http://127.0.0.1:9001/x", "127.0.0.1:9001", False),
            ("http://127.0.0.1:9001", "", False),
        ]:
            self.assertFalse(gate.same_origin(origin, host, secure), origin)


class AdmitTests(SynchronousTestCase):
    """``gate.admit`` decides in memory, with the §6 code and rule."""

    def admit(self, endpoint_id: str, policy: Any = None, **values: str) -> Any:
        context = memory_context(policy)
        return gate.admit(
            context, context.table.get(endpoint_id), headers(host="localhost", **values)
        )

    def refusal(self, endpoint_id: str, policy: Any = None, **values: str) -> Any:
        return self.assertRaises(
            gate.Refused, self.admit, endpoint_id, policy, **values
        )

    def test_scopes(self) -> None:
        """A token's scopes decide; the refusal names the scope and the identity."""
        passed = self.admit("files_list", TOKENS, authorization="Bearer r")
        self.assertEqual(passed.identity.id, "reader")
        refused = self.refusal("shell", TOKENS, authorization="Bearer r")
        self.assertEqual(refused.error.code, Code.MISSING_SCOPE)
        self.assertEqual(refused.error.extra["scope"], "process:run")
        self.assertEqual(refused.identity.id, "reader")

    def test_credentials(self) -> None:
        """No token is 401; a header and a query token that differ are 400."""
        self.assertEqual(
            self.refusal("files_list", TOKENS).error.code, Code.UNAUTHORIZED
        )
        context = memory_context(TOKENS)
        refused = self.assertRaises(
            gate.Refused,
            gate.admit,
            context,
            context.table.get("files_list"),
            headers(host="h", authorization="Bearer r"),
            query_tokens=[b"a"],
        )
        self.assertEqual(refused.error.code, Code.AMBIGUOUS_CREDENTIALS)

    def test_disabled(self) -> None:
        """A disabled endpoint is 404 endpoint_disabled naming the rule."""
        refused = self.refusal("shell", {"endpoints": {"shell": {"enabled": False}}})
        self.assertEqual(
            (refused.error.status, refused.error.code, refused.error.rule),
            (404, Code.ENDPOINT_DISABLED, "policy:endpoints.shell"),
        )

    def test_origin_and_host(self) -> None:
        """A foreign Origin and, in local mode, a foreign Host are 403."""
        refused = self.refusal("files_list", origin="http://evil.test")
        self.assertEqual(refused.error.code, Code.ORIGIN_NOT_ALLOWED)
        context = memory_context()
        refused = self.assertRaises(
            gate.Refused,
            gate.admit,
            context,
            context.table.get("files_list"),
            headers(host="rebound.example"),
        )
        self.assertEqual(refused.error.code, Code.HOST_NOT_ALLOWED)
        self.admit("files_list", origin="http://localhost")

    def test_rate(self) -> None:
        """The rate limit refuses with 429 rate_limited and its rule."""
        context = memory_context(
            {"endpoints": {"files_list": {"limits": {"rate_per_minute": 1}}}}
        )
        endpoint = context.table.get("files_list")
        gate.admit(context, endpoint, headers(host="localhost"))
        refused = self.assertRaises(
            gate.Refused, gate.admit, context, endpoint, headers(host="localhost")
        )
        self.assertEqual(refused.error.code, Code.RATE_LIMITED)
        self.assertEqual(refused.error.rule, "policy:endpoints.files_list")

    def test_may_use(self) -> None:
        """``may_use`` is what a door lists: enabled, and every scope held."""
        context = memory_context(TOKENS)
        reader = context.policy.tokens.identify(b"r")
        assert reader is not None
        self.assertTrue(gate.may_use(context, reader, context.table.get("files_list")))
        self.assertFalse(gate.may_use(context, reader, context.table.get("shell")))


class HttpDoorTests(SynchronousTestCase):
    """The HTTP door answers through the gate and audits with ``via: http``."""

    def test_status_line_names_the_status(self) -> None:
        """
        A refusal's status line carries its reason phrase, including codes
        Twisted's table lacks (a 429 read "429 Unknown Status").
        """
        context = memory_context(
            {"endpoints": {"files_list": {"limits": {"rate_per_minute": 1}}}}
        )
        site = memory_site(context)
        get = b"GET /files/list?path=/ HTTP/1.1\r\nHost: localhost\r\n\r\n"
        feed(site, get)
        answer = feed(site, get)
        self.assertTrue(
            answer.startswith(b"HTTP/1.1 429 Too Many Requests\r\n"), answer[:40]
        )

    def test_same_origin_allowed_foreign_refused(self) -> None:
        """The daemon's own origin passes; another origin is 403 with its rule."""
        context = memory_context({"defaults": {"audit": "all"}})
        site = memory_site(context)
        ok = make_request(
            site, "GET", "/capabilities", headers={"Origin": "http://localhost"}
        )
        self.assertEqual(ok.status, 200)
        refused = make_request(
            site, "GET", "/capabilities", headers={"Origin": "http://evil.test"}
        )
        self.assertEqual(refused.status, 403)
        self.assertEqual(refused.json()["code"], "origin_not_allowed")
        self.assertEqual(refused.json()["rule"], "policy:allowed_origins")
        audit = context.audit
        assert isinstance(audit, MemoryAudit)
        self.assertEqual([line["via"] for line in audit.lines], ["http", "http"])
        self.assertEqual(audit.lines[-1]["code"], "origin_not_allowed")

    def test_answers_never_run_script(self) -> None:
        """Every answer carries nosniff and a sandboxing CSP (SPEC §5.2)."""
        reply = make_request(memory_site(memory_context()), "GET", "/health")
        self.assertEqual(reply.headers["x-content-type-options"], "nosniff")
        self.assertEqual(reply.headers["content-security-policy"], "sandbox")

    def test_unknown_method_is_unsupported(self) -> None:
        """A method outside GET/POST/DELETE is 501 ``unsupported`` (SPEC §6)."""
        reply = make_request(memory_site(memory_context()), "PUT", "/health")
        self.assertEqual((reply.status, reply.json()["code"]), (501, "unsupported"))


class WebSocketDoorTests(DaemonTestCase):
    """
    The PTY handshake refuses with the same codes as HTTP, as a JSON body,
    and accepts websocket-client's default same-origin Origin.
    """

    policy = {**TOKENS, "defaults": {"audit": "all"}}
    audit = True

    def setUp(self) -> Any:
        if websocket is None:
            raise self.skipTest("websocket-client is not installed (make installs it)")
        return super().setUp()

    def url(self, query: str) -> str:
        return f"ws://127.0.0.1:{self.daemon.context.pty_port}/pty?{query}"

    def handshake(self, query: str, **options: Any) -> Any:
        """Connect in a thread; the refusal's status and JSON body, or the socket."""

        def run() -> Any:
            try:
                ws = websocket.create_connection(self.url(query), timeout=10, **options)
            except websocket.WebSocketBadStatusException as e:
                return e.status_code, json.loads(e.resp_body or b"{}")
            ws.close()
            return 101, {}

        return threads.deferToThread(run)

    @inlineCallbacks
    def session(self) -> Any:
        reply = yield self.request(
            "POST", "/pty/sessions", {}, headers={"Authorization": "Bearer a"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        return reply.json()["session_id"]

    @inlineCallbacks
    def test_default_client_is_admitted(self) -> Any:
        """websocket-client with its default Origin attaches (same-origin)."""
        sid = yield self.session()
        status, _ = yield self.handshake(f"session_id={sid}&access_token=a")
        self.assertEqual(status, 101)
        line = [r for r in self.audit_lines() if r["endpoint"] == "pty_connect"][-1]
        self.assertEqual((line["via"], line["status"]), ("ws", 101))
        self.assertEqual(line["query"], f"session_id={sid}&access_token=%2A%2A%2A")

    @inlineCallbacks
    def test_refusal_codes(self) -> Any:
        """401, 403 missing_scope, 403 origin_not_allowed (null too), as JSON."""
        sid = yield self.session()
        status, body = yield self.handshake(f"session_id={sid}")
        self.assertEqual((status, body["code"]), (401, "unauthorized"))
        status, body = yield self.handshake(f"session_id={sid}&access_token=r")
        self.assertEqual((status, body["code"]), (403, "missing_scope"))
        self.assertEqual(body["scope"], "terminal:use")
        for origin in ("http://evil.test", "null"):
            status, body = yield self.handshake(
                f"session_id={sid}&access_token=a", origin=origin
            )
            self.assertEqual((status, body["code"]), (403, "origin_not_allowed"))
            self.assertEqual(body["rule"], "policy:allowed_origins")
        codes = [
            (r["via"], r["status"], r["code"])
            for r in self.audit_lines()
            if r["endpoint"] == "pty_connect"
        ]
        self.assertEqual(
            codes,
            [
                ("ws", 401, "unauthorized"),
                ("ws", 403, "missing_scope"),
                ("ws", 403, "origin_not_allowed"),
                ("ws", 403, "origin_not_allowed"),
            ],
        )

    @inlineCallbacks
    def test_disabled_endpoint(self) -> Any:
        """
        A reload that switches pty_connect off: the next handshake is 404
        endpoint_disabled naming the rule (the port itself stays open until
        a restart).
        """
        yield self.start_on_policy_file(self.policy)
        self.reload_policy(
            {**self.policy, "endpoints": {"pty_connect": {"enabled": False}}}
        )
        status, body = yield self.handshake("session_id=x&access_token=a")
        self.assertEqual(
            (status, body["code"], body["rule"]),
            (404, "endpoint_disabled", "policy:endpoints.pty_connect"),
        )


class RedactRecordTests(SynchronousTestCase):
    """Every audit line, through any door, masks secrets clients put in URLs."""

    def test_userinfo_and_token_queries(self) -> None:
        """userinfo in URLs and token-like query values are *** in every string, list and dict of a record."""
        record = {
            "argv": [
                "git",
                "clone",
                "https://x-access-token:ghp_abc@github.com/o/r.git",
            ],
            "path": "/download",
            "remote": "https://u:p@h/r?access_token=zzz&page=2",
            "nested": {"cmd": "curl 'https://h/x?api_key=k1'"},
            "status": 200,
        }
        out = gate.redact_record(record)
        self.assertEqual(out["argv"][2], "https://***@github.com/o/r.git")
        self.assertEqual(out["remote"], "https://***@h/r?access_token=***&page=2")
        self.assertEqual(out["nested"]["cmd"], "curl 'https://h/x?api_key=***'")
        self.assertEqual((out["path"], out["status"]), ("/download", 200))
        self.assertNotIn("ghp_abc", json.dumps(out))
