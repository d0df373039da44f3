"""
The request pipeline of SPEC §3, through the whole HTTP door in memory
(:class:`sandboxd.testing.MemoryDaemon`): these decisions need no socket.
"""

from __future__ import annotations

import hashlib
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.endpoints import catalogue_table
from sandboxd.testing import MemoryDaemon
from sandboxd.web.target import parse_path

TOKEN = "s3cret-token"


class MemoryCase(SynchronousTestCase):
    """A daemon's HTTP door in memory per test, with this case's settings."""

    policy: Any = None
    token: str | None = None
    table: Any = None

    def setUp(self) -> None:
        self.daemon = MemoryDaemon(self.policy, token=self.token, table=self.table)

    def request(self, *args: Any, **kwargs: Any) -> Any:
        return self.daemon.request(*args, **kwargs)

    def raw(self, data: bytes) -> bytes:
        return self.daemon.raw(data)


class LocalModeTests(MemoryCase):
    """No token: anonymous with every scope, Host checks on."""

    def test_health(self) -> None:
        """GET /health answers 200 {"status": "ok"} with a JSON content type."""
        reply = self.request("GET", "/health")
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.json(), {"status": "ok"})
        self.assertEqual(reply.header("content-type"), "application/json")

    def test_trailing_slash_and_empty_segments(self) -> None:
        """/health/ and //health reach the same route: one normal form."""
        for path in ("/health/", "//health", "/health//"):
            reply = self.request("GET", path)
            self.assertEqual(reply.status, 200, path)

    def test_unknown_path(self) -> None:
        """An unrouted path is 404 with the seed's message and type."""
        reply = self.request("GET", "/nope/here")
        self.assertEqual(reply.status, 404)
        self.assertEqual(
            reply.json(),
            {
                "error": "Not found: /nope/here",
                "type": "ValueError",
                "code": "not_found",
            },
        )

    def test_wrong_method_is_not_found(self) -> None:
        """A known path with an unserved method is a 404, as the seed routes."""
        reply = self.request("POST", "/health")
        self.assertEqual(reply.status, 404)

    def test_unsupported_method(self) -> None:
        """PUT is 501 with a JSON body."""
        reply = self.request("PUT", "/health")
        self.assertEqual(reply.status, 501)
        self.assertEqual(reply.json()["type"], "ValueError")

    def test_encoded_slash_and_nul_and_dots(self) -> None:
        """%2F, %00 and dot segments are 400 invalid_path, never a detour."""
        for path in (
            "/files%2Flist",
            "/health%00",
            "/x/../health",
            "/./health",
            "/%2e%2e/health",
        ):
            reply = self.request("GET", path)
            self.assertEqual(reply.status, 400, path)
            self.assertEqual(reply.json()["code"], "invalid_path", path)

    def test_plain_and_escaped_paths_alike(self) -> None:
        """
        A path without percent-escapes is read as its escaped spelling is:
        the same normal form, and the same refusals of dot segments and of
        bytes that are not UTF-8.
        """
        self.assertEqual(parse_path(b"/process//list/"), parse_path(b"/%70rocess/list"))
        self.assertEqual(parse_path(b"/"), ("/", ()))
        for raw in (b"/x/../health", b"/./health", b"/health/.."):
            reply = self.raw(b"GET " + raw + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
            self.assertIn(b" 400 ", reply.split(b"\r\n")[0], raw)
            self.assertIn(b"dot segments", reply, raw)
        for raw in (b"/health\xa0", b"/health%a0"):
            reply = self.raw(b"GET " + raw + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
            self.assertIn(b" 400 ", reply.split(b"\r\n")[0], raw)
            self.assertIn(b"not valid UTF-8", reply, raw)

    def test_duplicate_parameters(self) -> None:
        """Repeated query names, also via %61 or ';', are 400 duplicate_parameter."""
        for query in ("a=1&a=2", "a=1&%61=2", "a=1;a=2"):
            reply = self.request("GET", "/capabilities?" + query)
            self.assertEqual(reply.status, 400, query)
            self.assertEqual(reply.json()["code"], "duplicate_parameter")

    def test_origin_refused(self) -> None:
        """A browser Origin the policy does not allow is 403 origin_not_allowed."""
        reply = self.request(
            "GET", "/capabilities", headers={"Origin": "http://evil.example"}
        )
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "origin_not_allowed")

    def test_foreign_host_refused_in_local_mode(self) -> None:
        """DNS rebinding: a non-local Host without a token is 403 host_not_allowed."""
        received = self.raw(
            b"GET /capabilities HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
        )
        self.assertIn(b"403", received.split(b"\r\n")[0])
        self.assertIn(b"host_not_allowed", received)

    def test_absolute_form_target(self) -> None:
        """GET http://host/x (absolute-form) is 400 invalid_path, never a proxy request."""
        received = self.raw(
            b"GET http://localhost/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        self.assertIn(b" 400 ", received.split(b"\r\n")[0])
        self.assertIn(b"invalid_path", received)

    def test_duplicated_host(self) -> None:
        """Two Host headers are 400."""
        received = self.raw(
            b"GET /capabilities HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n"
            b"Connection: close\r\n\r\n"
        )
        self.assertIn(b" 400 ", received.split(b"\r\n")[0])

    def test_missing_host(self) -> None:
        """A request without Host is 400."""
        received = self.raw(b"GET /capabilities HTTP/1.1\r\nConnection: close\r\n\r\n")
        self.assertIn(b" 400 ", received.split(b"\r\n")[0])

    def test_transfer_encoding_refused(self) -> None:
        """A chunked body is 400 transfer_encoding_not_allowed."""
        received = self.raw(
            b"POST /capabilities/check HTTP/1.1\r\nHost: localhost\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )
        self.assertIn(b" 400 ", received.split(b"\r\n")[0])
        self.assertIn(b"transfer_encoding_not_allowed", received)

    def test_oversized_body_refused_from_content_length(self) -> None:
        """A 300 MB body announced to a 1 MiB route is 413 before any body byte."""
        received = self.raw(
            b"POST /capabilities/check HTTP/1.1\r\nHost: localhost\r\n"
            b"Expect: 100-continue\r\nContent-Length: 300000000\r\n\r\n"
        )
        self.assertTrue(received.startswith(b"HTTP/1.1 413 "), received[:80])
        self.assertNotIn(b"100 Continue", received)
        self.assertIn(b"payload_too_large", received)

    def test_invalid_json(self) -> None:
        """A body that is not JSON, or not an object, is 400 invalid_json."""
        for raw in (
            b"{nope",
            b"[1, 2]",
            b"\xff\xfe",
            b'{"endpoint": "health", "endpoint": "shell"}',
            b'{"endpoint": NaN}',
            b"[" * 100000 + b"]" * 100000,
        ):
            reply = self.request("POST", "/capabilities/check", raw_body=raw)
            self.assertEqual(reply.status, 400)
            self.assertEqual(reply.json()["code"], "invalid_json")

    def test_a_body_of_another_type_is_told_to_send_json(self) -> None:
        """
        A form or a file's bytes sent to an endpoint that takes JSON (a
        client posting multipart to ``/upload``) is 400 ``invalid_json``
        saying the endpoint takes JSON and what was sent instead; a body
        that claims to be JSON and is not gets no such hint.
        """
        sent = {
            "multipart/form-data; boundary=x": b"--x\r\nContent-Disposition: "
            b'form-data; name="file"; filename="a"\r\n\r\n\xff\xfe\r\n--x--\r\n',
            "application/x-www-form-urlencoded": b"path=a.txt&content=hi",
        }
        for kind, raw in sent.items():
            for path in ("/upload", "/capabilities/check"):
                reply = self.request(
                    "POST", path, raw_body=raw, headers={"Content-Type": kind}
                )
                self.assertEqual(reply.status, 400, (path, kind))
                self.assertEqual(reply.json()["code"], "invalid_json")
                self.assertIn(
                    "this endpoint takes a JSON body (Content-Type: application/json), "
                    f"not {kind.partition(';')[0]}",
                    reply.json()["error"],
                )
        reply = self.request(
            "POST",
            "/capabilities/check",
            raw_body=b"{nope",
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
        self.assertEqual(reply.json()["error"], "the body is not valid JSON")

    def test_keep_alive_after_small_refusal(self) -> None:
        """Two requests on one connection: a refusal does not close it."""
        received = self.raw(
            b"GET /nope HTTP/1.1\r\nHost: localhost\r\n\r\n"
            b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        self.assertEqual(received.count(b"HTTP/1.1 "), 2)
        self.assertIn(b'{"status":"ok"}', received)


class TokenTests(MemoryCase):
    """With ABX_SERVER_TOKEN: everything but /health needs it (SPEC §4)."""

    token = TOKEN

    def test_health_open(self) -> None:
        """/health needs no token."""
        reply = self.request("GET", "/health", token=None)
        self.assertEqual(reply.status, 200)

    def test_missing_and_wrong_token(self) -> None:
        """No token, or a wrong one, is the 401 of SPEC §4."""
        for token in (None, "wrong"):
            reply = self.request("GET", "/capabilities", token=token)
            self.assertEqual(reply.status, 401)
            self.assertEqual(
                reply.json(),
                {"error": "unauthorized", "type": "AuthError", "code": "unauthorized"},
            )

    def test_bearer_accepted(self) -> None:
        """Authorization: Bearer works as X-Access-Token does."""
        reply = self.request(
            "GET",
            "/capabilities",
            token=None,
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.json()["identity"], {"id": "legacy", "scopes": ["*"]})

    def test_foreign_header_beside_the_token(self) -> None:
        """
        A header token that logs in beside a different Bearer token that
        does not (a gateway's own), or the other way round, is the valid
        one's identity, as on the seed; neither valid is 401.
        """
        for headers in (
            {"Authorization": "Bearer gateway-own"},
            {"X-Access-Token": "gateway-own", "Authorization": f"Bearer {TOKEN}"},
        ):
            token = TOKEN if "X-Access-Token" not in headers else None
            reply = self.request("GET", "/capabilities", token=token, headers=headers)
            self.assertEqual(reply.status, 200, headers)
            self.assertEqual(reply.json()["identity"]["id"], "legacy")
        reply = self.request(
            "GET",
            "/capabilities",
            token=None,
            headers={"X-Access-Token": "one", "Authorization": "Bearer two"},
        )
        self.assertEqual(reply.status, 401)

    def test_ambiguous_credentials(self) -> None:
        """Two different X-Access-Token values are 400 ambiguous_credentials."""
        data = self.raw(
            b"GET /capabilities HTTP/1.1\r\nHost: localhost\r\n"
            b"X-Access-Token: " + TOKEN.encode() + b"\r\n"
            b"X-Access-Token: other\r\n\r\n"
        )
        self.assertTrue(data.startswith(b"HTTP/1.1 400"), data)
        self.assertIn(b"ambiguous_credentials", data)

    def test_non_ascii_token(self) -> None:
        """A token with non-ASCII bytes is a plain 401, not a 500."""
        reply = self.request(
            "GET",
            "/capabilities",
            token=None,
            headers={"X-Access-Token": "t\u00f6ken\u2603"},
        )
        self.assertEqual(reply.status, 401)

    def test_any_host_with_token(self) -> None:
        """With a token, the Host check of local mode does not apply."""
        reply = self.request(
            "GET", "/capabilities", headers={"Host": "sandbox.example"}
        )
        self.assertEqual(reply.status, 200)

    def test_auth_before_not_found_route_gate(self) -> None:
        """An unauthenticated request to a disabled route is 401, not a hint that it exists."""
        reply = self.request("GET", "/browser/console", token=None)
        self.assertEqual(reply.status, 401)


class TwoIdentitiesTests(MemoryCase):
    """Policy tokens, two of them presented in one request."""

    policy = {
        "auth": {
            "tokens": [
                {
                    "id": name,
                    "token_sha256": hashlib.sha256(name.encode()).hexdigest(),
                    "scopes": ["*"],
                }
                for name in ("reader-t", "admin-t")
            ]
        }
    }

    def test_two_identities_are_ambiguous(self) -> None:
        """An X-Access-Token and a Bearer token of two identities: 400, no choice."""
        reply = self.request(
            "GET",
            "/capabilities",
            token=None,
            headers={"X-Access-Token": "reader-t", "Authorization": "Bearer admin-t"},
        )
        self.assertEqual(reply.status, 400)
        self.assertEqual(reply.json()["code"], "ambiguous_credentials")

    def test_same_identity_twice(self) -> None:
        """The same token in both headers is that identity."""
        reply = self.request(
            "GET",
            "/capabilities",
            token=None,
            headers={"X-Access-Token": "admin-t", "Authorization": "Bearer admin-t"},
        )
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.json()["identity"]["id"], "admin-t")


class NotImplementedTests(MemoryCase):
    """An endpoint whose handler is not built is honest about it."""

    def setUp(self) -> None:
        self.table = catalogue_table()
        super().setUp()

    def test_not_implemented_endpoint(self) -> None:
        """404 endpoint_disabled with rule code:not-implemented, and discovery says why."""
        reply = self.request("GET", "/browser/console")
        self.assertEqual(reply.status, 404)
        body = reply.json()
        self.assertEqual(body["code"], "endpoint_disabled")
        self.assertEqual(body["endpoint"], "browser_console")
        self.assertEqual(body["rule"], "code:not-implemented")
        rule = self.daemon.context.policy.rules["files_list"]
        self.assertEqual((rule.enabled, rule.reason), (False, "not_implemented"))


class CorsTests(MemoryCase):
    """A page on an allowed origin can call the REST routes (CORS)."""

    token = TOKEN
    policy = {"allowed_origins": ["https://console.example"]}

    def test_preflight(self) -> None:
        """An allowed origin's preflight is 204 with the methods and headers it may use."""
        reply = self.request(
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

    def test_allowed_origin_reads_responses(self) -> None:
        """Responses to an allowed origin carry Access-Control-Allow-Origin; errors too."""
        reply = self.request(
            "GET", "/capabilities", headers={"Origin": "https://console.example"}
        )
        self.assertEqual(reply.status, 200)
        self.assertEqual(
            reply.header("access-control-allow-origin"), "https://console.example"
        )
        self.assertEqual(reply.header("vary"), "Origin")
        reply = self.request(
            "GET",
            "/capabilities",
            token="wrong",
            headers={"Origin": "https://console.example"},
        )
        self.assertEqual(reply.status, 401)
        self.assertEqual(
            reply.header("access-control-allow-origin"), "https://console.example"
        )

    def test_other_origin(self) -> None:
        """Another origin's preflight and requests are 403 origin_not_allowed."""
        reply = self.request(
            "OPTIONS",
            "/capabilities",
            token=None,
            headers={
                "Origin": "https://evil.example",
                "Access-Control-Request-Method": "GET",
            },
        )
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "origin_not_allowed")
        )
        self.assertIsNone(reply.header("access-control-allow-origin"))
        reply = self.request(
            "GET", "/capabilities", headers={"Origin": "https://evil.example"}
        )
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "origin_not_allowed")
        )
