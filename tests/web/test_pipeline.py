"""
The request pipeline of SPEC §3 against a real daemon on a loopback port.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

from sandboxd.endpoints import catalogue_table
from sandboxd.testing import RawClient
from tests.helpers import DaemonTestCase

TOKEN = "s3cret-token"


class RawMixin:
    daemon: Any

    @inlineCallbacks
    def raw(self, data: bytes) -> Any:
        """Send raw bytes, return everything until the server closes."""
        client = RawClient()
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.daemon.port)
        protocol = yield connectProtocol(endpoint, client)
        protocol.transport.write(data)
        timer = reactor.callLater(2, protocol.transport.loseConnection)
        received = yield client.closed
        if timer.active():
            timer.cancel()
        return received


class LocalModeTests(DaemonTestCase, RawMixin):
    """No token: anonymous with every scope, Host checks on."""

    @inlineCallbacks
    def test_health(self) -> Any:
        """GET /health answers 200 {"status": "ok"} with a JSON content type."""
        reply = yield self.request("GET", "/health")
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.json(), {"status": "ok"})
        self.assertEqual(reply.header("content-type"), "application/json")

    @inlineCallbacks
    def test_trailing_slash_and_empty_segments(self) -> Any:
        """/health/ and //health reach the same route: one normal form."""
        for path in ("/health/", "//health", "/health//"):
            reply = yield self.request("GET", path)
            self.assertEqual(reply.status, 200, path)

    @inlineCallbacks
    def test_unknown_path(self) -> Any:
        """An unrouted path is 404 with the seed's message and type."""
        reply = yield self.request("GET", "/nope/here")
        self.assertEqual(reply.status, 404)
        self.assertEqual(
            reply.json(),
            {
                "error": "Not found: /nope/here",
                "type": "ValueError",
                "code": "not_found",
            },
        )

    @inlineCallbacks
    def test_wrong_method_is_not_found(self) -> Any:
        """A known path with an unserved method is a 404, as the seed routes."""
        reply = yield self.request("POST", "/health")
        self.assertEqual(reply.status, 404)

    @inlineCallbacks
    def test_unsupported_method(self) -> Any:
        """PUT is 501 with a JSON body."""
        reply = yield self.request("PUT", "/health")
        self.assertEqual(reply.status, 501)
        self.assertEqual(reply.json()["type"], "ValueError")

    @inlineCallbacks
    def test_encoded_slash_and_nul_and_dots(self) -> Any:
        """%2F, %00 and dot segments are 400 invalid_path, never a detour."""
        for path in (
            "/files%2Flist",
            "/health%00",
            "/x/../health",
            "/./health",
            "/%2e%2e/health",
        ):
            reply = yield self.request("GET", path)
            self.assertEqual(reply.status, 400, path)
            self.assertEqual(reply.json()["code"], "invalid_path", path)

    @inlineCallbacks
    def test_duplicate_parameters(self) -> Any:
        """Repeated query names, also via %61 or ';', are 400 duplicate_parameter."""
        for query in ("a=1&a=2", "a=1&%61=2", "a=1;a=2"):
            reply = yield self.request("GET", "/capabilities?" + query)
            self.assertEqual(reply.status, 400, query)
            self.assertEqual(reply.json()["code"], "duplicate_parameter")

    @inlineCallbacks
    def test_origin_refused(self) -> Any:
        """A browser Origin the policy does not allow is 403 origin_not_allowed."""
        reply = yield self.request(
            "GET", "/capabilities", headers={"Origin": "http://evil.example"}
        )
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "origin_not_allowed")

    @inlineCallbacks
    def test_foreign_host_refused_in_local_mode(self) -> Any:
        """DNS rebinding: a non-local Host without a token is 403 host_not_allowed."""
        received = yield self.raw(
            b"GET /capabilities HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
        )
        self.assertIn(b"403", received.split(b"\r\n")[0])
        self.assertIn(b"host_not_allowed", received)

    @inlineCallbacks
    def test_absolute_form_target(self) -> Any:
        """GET http://host/x (absolute-form) is 400 invalid_path, never a proxy request."""
        received = yield self.raw(
            b"GET http://localhost/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        self.assertIn(b" 400 ", received.split(b"\r\n")[0])
        self.assertIn(b"invalid_path", received)

    @inlineCallbacks
    def test_duplicated_host(self) -> Any:
        """Two Host headers are 400."""
        received = yield self.raw(
            b"GET /capabilities HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n"
            b"Connection: close\r\n\r\n"
        )
        self.assertIn(b" 400 ", received.split(b"\r\n")[0])

    @inlineCallbacks
    def test_missing_host(self) -> Any:
        """A request without Host is 400."""
        received = yield self.raw(
            b"GET /capabilities HTTP/1.1\r\nConnection: close\r\n\r\n"
        )
        self.assertIn(b" 400 ", received.split(b"\r\n")[0])

    @inlineCallbacks
    def test_transfer_encoding_refused(self) -> Any:
        """A chunked body is 400 transfer_encoding_not_allowed."""
        received = yield self.raw(
            b"POST /capabilities/check HTTP/1.1\r\nHost: localhost\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )
        self.assertIn(b" 400 ", received.split(b"\r\n")[0])
        self.assertIn(b"transfer_encoding_not_allowed", received)

    @inlineCallbacks
    def test_oversized_body_refused_from_content_length(self) -> Any:
        """A 300 MB body announced to a 1 MiB route is 413 before any body byte."""
        received = yield self.raw(
            b"POST /capabilities/check HTTP/1.1\r\nHost: localhost\r\n"
            b"Expect: 100-continue\r\nContent-Length: 300000000\r\n\r\n"
        )
        self.assertTrue(received.startswith(b"HTTP/1.1 413 "), received[:80])
        self.assertNotIn(b"100 Continue", received)
        self.assertIn(b"payload_too_large", received)

    @inlineCallbacks
    def test_invalid_json(self) -> Any:
        """A body that is not JSON, or not an object, is 400 invalid_json."""
        for raw in (
            b"{nope",
            b"[1, 2]",
            b"\xff\xfe",
            b'{"endpoint": "health", "endpoint": "shell"}',
            b'{"endpoint": NaN}',
            b"[" * 100000 + b"]" * 100000,
        ):
            reply = yield self.request("POST", "/capabilities/check", raw_body=raw)
            self.assertEqual(reply.status, 400)
            self.assertEqual(reply.json()["code"], "invalid_json")

    @inlineCallbacks
    def test_keep_alive_after_small_refusal(self) -> Any:
        """Two requests on one connection: a refusal does not close it."""
        received = yield self.raw(
            b"GET /nope HTTP/1.1\r\nHost: localhost\r\n\r\n"
            b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        self.assertEqual(received.count(b"HTTP/1.1 "), 2)
        self.assertIn(b'{"status":"ok"}', received)


class TokenTests(DaemonTestCase):
    """With ABX_SERVER_TOKEN: everything but /health needs it (SPEC §4)."""

    token = TOKEN

    @inlineCallbacks
    def test_health_open(self) -> Any:
        """/health needs no token."""
        reply = yield self.request("GET", "/health", token=None)
        self.assertEqual(reply.status, 200)

    @inlineCallbacks
    def test_missing_and_wrong_token(self) -> Any:
        """No token, or a wrong one, is the 401 of SPEC §4."""
        for token in (None, "wrong"):
            reply = yield self.request("GET", "/capabilities", token=token)
            self.assertEqual(reply.status, 401)
            self.assertEqual(
                reply.json(),
                {"error": "unauthorized", "type": "AuthError", "code": "unauthorized"},
            )

    @inlineCallbacks
    def test_bearer_accepted(self) -> Any:
        """Authorization: Bearer works as X-Access-Token does."""
        reply = yield self.request(
            "GET",
            "/capabilities",
            token=None,
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.json()["identity"], {"id": "legacy", "scopes": ["*"]})

    @inlineCallbacks
    def test_ambiguous_credentials(self) -> Any:
        """A header token and a different Bearer token are 400 ambiguous_credentials."""
        reply = yield self.request(
            "GET", "/capabilities", headers={"Authorization": "Bearer other"}
        )
        self.assertEqual(reply.status, 400)
        self.assertEqual(reply.json()["code"], "ambiguous_credentials")

    @inlineCallbacks
    def test_non_ascii_token(self) -> Any:
        """A token with non-ASCII bytes is a plain 401, not a 500."""
        reply = yield self.request(
            "GET",
            "/capabilities",
            token=None,
            headers={"X-Access-Token": "t\u00f6ken\u2603"},
        )
        self.assertEqual(reply.status, 401)

    @inlineCallbacks
    def test_any_host_with_token(self) -> Any:
        """With a token, the Host check of local mode does not apply."""
        reply = yield self.request(
            "GET", "/capabilities", headers={"Host": "sandbox.example"}
        )
        self.assertEqual(reply.status, 200)

    @inlineCallbacks
    def test_auth_before_not_found_route_gate(self) -> Any:
        """An unauthenticated request to a disabled route is 401, not a hint that it exists."""
        reply = yield self.request("GET", "/browser/console", token=None)
        self.assertEqual(reply.status, 401)


class NotImplementedTests(DaemonTestCase):
    """An endpoint whose handler is not built is honest about it."""

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        return self.start(table=catalogue_table())

    @inlineCallbacks
    def test_not_implemented_endpoint(self) -> Any:
        """404 endpoint_disabled with rule code:not-implemented, and discovery says why."""
        reply = yield self.request("GET", "/browser/console")
        self.assertEqual(reply.status, 404)
        body = reply.json()
        self.assertEqual(body["code"], "endpoint_disabled")
        self.assertEqual(body["endpoint"], "browser_console")
        self.assertEqual(body["rule"], "code:not-implemented")
        rule = self.daemon.context.policy.rules["files_list"]
        self.assertEqual((rule.enabled, rule.reason), (False, "not_implemented"))


class CorsTests(DaemonTestCase):
    """A page on an allowed origin can call the REST routes (CORS)."""

    token = TOKEN
    policy = {"allowed_origins": ["https://console.example"]}

    @inlineCallbacks
    def test_preflight(self) -> Any:
        """An allowed origin's preflight is 204 with the methods and headers it may use."""
        reply = yield self.request(
            "OPTIONS",
            "/capabilities",
            token=None,
            headers={
                "Origin": "https://console.example",
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "x-access-token",
            },
        )
        self.assertEqual(reply.status, 204)
        self.assertEqual(
            reply.header("access-control-allow-origin"), "https://console.example"
        )
        self.assertIn(
            "X-Access-Token", reply.header("access-control-allow-headers") or ""
        )
        self.assertIn("DELETE", reply.header("access-control-allow-methods") or "")

    @inlineCallbacks
    def test_allowed_origin_reads_responses(self) -> Any:
        """Responses to an allowed origin carry Access-Control-Allow-Origin; errors too."""
        reply = yield self.request(
            "GET", "/capabilities", headers={"Origin": "https://console.example"}
        )
        self.assertEqual(reply.status, 200)
        self.assertEqual(
            reply.header("access-control-allow-origin"), "https://console.example"
        )
        self.assertEqual(reply.header("vary"), "Origin")
        reply = yield self.request(
            "GET",
            "/capabilities",
            token="wrong",
            headers={"Origin": "https://console.example"},
        )
        self.assertEqual(reply.status, 401)
        self.assertEqual(
            reply.header("access-control-allow-origin"), "https://console.example"
        )

    @inlineCallbacks
    def test_other_origin(self) -> Any:
        """Another origin gets no preflight and a 403 origin_not_allowed."""
        reply = yield self.request(
            "OPTIONS",
            "/capabilities",
            token=None,
            headers={
                "Origin": "https://evil.example",
                "Access-Control-Request-Method": "GET",
            },
        )
        self.assertEqual(reply.status, 501)
        self.assertIsNone(reply.header("access-control-allow-origin"))
        reply = yield self.request(
            "GET", "/capabilities", headers={"Origin": "https://evil.example"}
        )
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "origin_not_allowed")
        )
