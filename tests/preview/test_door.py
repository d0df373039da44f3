"""
The preview door against a real daemon and a real app on loopback: what a
browser or an API client sees through ``--preview-port``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import resource
import socket
import subprocess
import sys
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.protocol import Protocol, ServerFactory
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.web.client import (
    Agent,
    FileBodyProducer,
    HTTPConnectionPool,
    ResponseDone,
    readBody,
)
from twisted.web.http_headers import Headers

from sandboxd.testing import BodyProducer
from tests.helpers import DaemonTestCase, trickle_body
from tests.kernels.test_contexts import (
    KERNEL_CASE_SECONDS,
    KERNEL_START,
    need_ipykernel,
)
from tests.preview.upstream import App

TOKEN = "preview-token-0123456789"
USER = "user-token-0123456789"


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


POLICY: dict[str, Any] = {
    "groups": {"preview": True},
    "auth": {
        "tokens": [
            {"id": "admin", "token_sha256": _sha(TOKEN), "scopes": ["*"]},
            {"id": "user", "token_sha256": _sha(USER), "scopes": ["preview:read"]},
        ]
    },
    "endpoints": {"preview_proxy": {"audit": "all", "limits": {"timeout_seconds": 1}}},
}


class Chunks(BodyProducer):
    """A request body of ``count`` chunks of ``size`` bytes, length unknown (chunked)."""

    def __init__(self, count: int, size: int) -> None:
        self.count = count
        self.size = size

    def startProducing(self, consumer: Any) -> Deferred[None]:
        for _ in range(self.count):
            consumer.write(b"u" * self.size)
        d: Deferred[None] = Deferred()
        reactor.callLater(0, d.callback, None)
        return d


class Collect(Protocol):
    """Keeps a response body, noting when each chunk came."""

    def __init__(self) -> None:
        self.received = 0
        self.times: list[tuple[float, bytes]] = []
        self.done: Deferred[Any] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.received += len(data)
        if len(self.times) < 100:
            self.times.append((time.monotonic(), data))

    def connectionLost(self, reason: Any) -> None:
        self.reason = reason
        self.done.callback(None)


def rss_kib() -> int:
    """This process's resident set (KiB) now."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class DoorCase(DaemonTestCase):
    """A daemon with its preview door, and an app on a loopback port."""

    policy = POLICY
    token = TOKEN
    audit = True
    timeout = 60
    app_timeout: float | None = None

    @inlineCallbacks
    def setUp(self) -> Any:
        self.app = App(self.app_timeout)
        self.app_port = self.app.listen()
        self.addCleanup(self.app.stop)
        yield super().setUp()
        if self.autostart:
            self.door = self.daemon.context.preview
            self.door_port = self.door.door_port
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.agent = Agent(reactor, pool=self.pool)

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        kwargs.setdefault("preview_port", "tcp:0:interface=127.0.0.1")
        return super().start(stop_at_end, **kwargs)

    @inlineCallbacks
    def start_on_a_fixed_port(self, port: int | None = None, **kwargs: Any) -> Any:
        """
        Start with the door on a port chosen now, not ``tcp:0``: a reload
        that turns the door off and on listens again on its description,
        and the test's hosts (or a public URL) must still name it.
        """
        if port is None:
            port = free_port()
        yield self.start(preview_port=f"tcp:{port}:interface=127.0.0.1", **kwargs)
        self.door = self.daemon.context.preview
        self.door_port = port

    def host(self, port: int | None = None, label: str | None = None) -> str:
        name = str(port or self.app_port) + (f"-{label}" if label else "")
        return f"{name}.localhost:{self.door_port}"

    def expose(self, **body: Any) -> Any:
        body.setdefault("port", self.app_port)
        return self.request("POST", "/preview/ports", body)

    @inlineCallbacks
    def serve(self, app: Any, **expose: Any) -> Any:
        """
        ``app`` (a protocol factory) listening on a loopback port of its
        own, which is set as its ``port`` and exposed with ``expose``'s
        fields; ``app``.
        """
        listening = reactor.listenTCP(0, app, interface="127.0.0.1")
        self.addCleanup(listening.stopListening)
        app.port = listening.getHost().port
        reply = yield self.expose(port=app.port, **expose)
        self.assertEqual(reply.status, 201, reply.body)
        return app

    def send(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        host: str | None = None,
        body: Any = None,
        token: str | None = TOKEN,
    ) -> Deferred[Any]:
        """One request to the door (the response, body unread)."""
        sent = Headers({b"host": [(host or self.host()).encode()]})
        if token:
            sent.addRawHeader(b"x-access-token", token.encode())
        for name, value in (headers or {}).items():
            sent.addRawHeader(name.encode(), value.encode())
        url = f"http://127.0.0.1:{self.door_port}{path}".encode()
        return self.agent.request(method.encode(), url, sent, body)

    @inlineCallbacks
    def fetch(self, method: str, path: str, **kw: Any) -> Any:
        """One request to the door: ``(response, body)``."""
        response = yield self.send(method, path, **kw)
        body = yield readBody(response)
        return response, body


class RoutingAndAuthTests(DoorCase):
    """Host rules, exposure, credentials and errors."""

    @inlineCallbacks
    def test_exposed_page_with_token(self) -> None:
        """An exposed port's page, with our token taken out and X-Forwarded-* added."""
        exposed = yield self.expose()
        self.assertEqual(exposed.status, 201, exposed.body)
        self.assertEqual(exposed.json()["url"], f"http://{self.host()}/")
        response, body = yield self.fetch("GET", "/")
        self.assertEqual(response.code, 200)
        self.assertIn(b"preview app", body)
        response, body = yield self.fetch(
            "GET", "/headers?q=1", headers={"cookie": "app=1; sbx_p_9=x"}
        )
        seen = json.loads(body)
        self.assertEqual(seen["uri"], "/headers?q=1")
        headers = seen["headers"]
        self.assertNotIn("x-access-token", headers)
        self.assertEqual(headers["host"], [f"localhost:{self.app_port}"])
        self.assertEqual(headers["cookie"], ["app=1"])
        self.assertEqual(headers["x-forwarded-host"], [self.host()])
        self.assertEqual(headers["x-forwarded-for"], ["127.0.0.1"])
        self.assertEqual(headers["x-forwarded-proto"], ["http"])
        lines = [r for r in self.audit_lines() if r.get("via") == "preview"]
        self.assertEqual(lines[-1]["endpoint"], "preview_proxy")
        self.assertEqual(lines[-1]["identity"], "admin")

    @inlineCallbacks
    def test_refusals(self) -> None:
        """421 for a foreign Host, 404 unexposed, 403 own ports, 401 without a credential."""
        response, body = yield self.fetch("GET", "/", host="evil.example")
        self.assertEqual(
            (response.code, json.loads(body)["code"]), (421, "misdirected_request")
        )
        response, body = yield self.fetch("GET", "/")
        self.assertEqual(
            (response.code, json.loads(body)["code"]), (404, "port_not_exposed")
        )
        for port in (self.daemon.port, self.door_port, 9222):
            reply = yield self.expose(port=port)
            self.assertEqual(
                (reply.status, reply.json()["code"]), (403, "port_not_allowed")
            )
        yield self.expose()
        response, body = yield self.fetch("GET", "/", token=None)
        self.assertEqual(
            (response.code, json.loads(body)["code"]), (401, "link_invalid")
        )
        response, body = yield self.fetch(
            "GET", "/", token=None, headers={"accept": "text/html"}
        )
        self.assertEqual(response.code, 401)
        self.assertIn(b"<html>", body)
        # A token without preview:use.
        response, body = yield self.fetch("GET", "/", token=USER)
        self.assertEqual(
            (response.code, json.loads(body)["code"]), (403, "missing_scope")
        )
        # A labelled exposure answers to its label only.
        yield self.expose(label="web")
        response, _ = yield self.fetch("GET", "/", host=self.host(label="web"))
        self.assertEqual(response.code, 200)
        response, _ = yield self.fetch("GET", "/", host=self.host(label="api"))
        self.assertEqual(response.code, 404)

    @inlineCallbacks
    def test_no_exposure_oracle_without_a_credential(self) -> None:
        """
        Without a credential that logs in (none, or an unknown token), an
        unexposed port, a labelled exposure asked for without its label
        and a private exposure all answer the same 401, so the door does
        not tell a stranger which ports are exposed; a caller who logs in
        still hears 404 ``port_not_exposed``.
        """
        unexposed = free_port()
        yield self.expose(label="web")
        for token in (None, "not-a-token-0123456789"):
            for host in (
                self.host(),
                self.host(unexposed),
                self.host(label="web"),
            ):
                response, body = yield self.fetch("GET", "/", host=host, token=token)
                self.assertEqual(
                    (response.code, json.loads(body)["code"]),
                    (401, "link_invalid"),
                    (token, host),
                )
        response, body = yield self.fetch("GET", "/", host=self.host(unexposed))
        self.assertEqual(
            (response.code, json.loads(body)["code"]), (404, "port_not_exposed")
        )

    @inlineCallbacks
    def test_no_daemon_port_oracle_without_a_credential(self) -> None:
        """
        The daemon's own ports and the browser's debugging port answer a
        stranger the same 401 as any port it may not open (a 403 would
        map them); a caller who logs in still hears 403 ``port_not_allowed``.
        """
        for port in (self.daemon.port, self.door_port, 9222):
            response, body = yield self.fetch(
                "GET", "/", host=self.host(port), token=None
            )
            self.assertEqual(
                (response.code, json.loads(body)["code"]), (401, "link_invalid"), port
            )
            response, body = yield self.fetch("GET", "/", host=self.host(port))
            self.assertEqual(
                (response.code, json.loads(body)["code"]), (403, "port_not_allowed")
            )

    @inlineCallbacks
    def test_path_mode_bad_path_blames_the_path(self) -> None:
        """
        On a door's own name, a path that names no port is a 421 that says
        so (the Host is right: ``/p/PORT/`` works on it).
        """
        for path in ("/p/abc/", "/p/", "/elsewhere"):
            response, body = yield self.fetch(
                "GET", path, host=f"127.0.0.1:{self.door_port}"
            )
            error = json.loads(body)
            self.assertEqual(
                (response.code, error["code"]), (421, "misdirected_request")
            )
            self.assertIn("the path names no preview", error["error"])
            self.assertIn("/p/PORT/", error["error"])

    @inlineCallbacks
    def test_client_address_headers_are_the_doors(self) -> None:
        """
        A client's ``X-Real-IP`` never reaches the app: the app gets the
        address the door saw, as with ``X-Forwarded-For``, on a request
        with a body or without.
        """
        yield self.expose()
        sent = {"x-real-ip": "6.6.6.6", "x-forwarded-for": "6.6.6.6"}
        _, body = yield self.fetch("GET", "/headers", headers=sent)
        seen = json.loads(body)["headers"]
        self.assertEqual(seen["x-real-ip"], ["127.0.0.1"])
        self.assertEqual(seen["x-forwarded-for"], ["6.6.6.6, 127.0.0.1"])
        _, body = yield self.fetch(
            "POST", "/headers", headers=sent, body=FileBodyProducer(io.BytesIO(b"x"))
        )
        seen = json.loads(body)["headers"]
        self.assertEqual(seen["x-real-ip"], ["127.0.0.1"])

    @inlineCallbacks
    def test_the_apps_own_errors_are_allowed(self) -> None:
        """
        The app's own 404 (for a GET, and a POST that streams its body)
        is audited ``decision: allow`` with no code: nothing refused it.
        """
        yield self.expose()
        response, _ = yield self.fetch("GET", "/nothing")
        self.assertEqual(response.code, 404)
        response, _ = yield self.fetch(
            "POST", "/nothing", body=FileBodyProducer(io.BytesIO(b"x"))
        )
        self.assertEqual(response.code, 404)
        lines = [
            r
            for r in self.audit_lines()
            if r.get("via") == "preview" and r["path"] == "/nothing"
        ]
        self.assertEqual(
            [(r["status"], r["decision"], r["code"]) for r in lines],
            [(404, "allow", None)] * 2,
        )

    @inlineCallbacks
    def test_two_identities_are_ambiguous(self) -> None:
        """
        ``X-Access-Token`` and ``Authorization: Bearer`` logging in as two
        identities: 400 ``ambiguous_credentials``, as on every other door.
        """
        yield self.expose()
        response, body = yield self.fetch(
            "GET",
            "/",
            token=USER,
            headers={"authorization": f"Bearer {TOKEN}"},
        )
        self.assertEqual(
            (response.code, json.loads(body)["code"]), (400, "ambiguous_credentials")
        )
        response, _ = yield self.fetch(
            "GET", "/", token=None, headers={"authorization": f"Bearer {TOKEN}"}
        )
        self.assertEqual(response.code, 200)

    @inlineCallbacks
    def test_link_becomes_a_cookie(self) -> None:
        """
        ``?sbx_link=`` on a GET: 303 to the same URL without it, with a
        host-only HttpOnly cookie that then opens the page; the app never
        sees the link; another port's host refuses the link.
        """
        yield self.expose()
        minted = yield self.request("POST", f"/preview/ports/{self.app_port}/link", {})
        self.assertEqual(minted.status, 201, minted.body)
        link = minted.json()["token"]
        self.assertEqual(minted.json()["url"], f"http://{self.host()}/?sbx_link={link}")
        response, _ = yield self.fetch(
            "GET", f"/headers?a=1&sbx_link={link}&b=2", token=None
        )
        self.assertEqual(response.code, 303)
        self.assertEqual(
            response.headers.getRawHeaders(b"location"), [b"/headers?a=1&b=2"]
        )
        cookie = response.headers.getRawHeaders(b"set-cookie")[0].decode()
        self.assertTrue(cookie.startswith(f"sbx_p_{self.app_port}=sbxl_"), cookie)
        self.assertIn("HttpOnly", cookie)
        self.assertIn("SameSite=Lax", cookie)
        self.assertNotIn("Domain", cookie)
        value = cookie.split(";")[0]
        response, body = yield self.fetch(
            "GET", "/headers?a=1&b=2", token=None, headers={"cookie": value}
        )
        self.assertEqual(response.code, 200)
        self.assertNotIn("sbxl_", body.decode())
        # Another page (another preview's, on the same site) cannot use it.
        response, body = yield self.fetch(
            "POST",
            "/upload",
            token=None,
            headers={"cookie": value, "origin": f"http://{self.host(4000)}"},
        )
        self.assertEqual(
            (response.code, json.loads(body)["code"]), (403, "origin_not_allowed")
        )
        response, _ = yield self.fetch(
            "GET",
            "/headers",
            token=None,
            headers={"cookie": value, "origin": f"http://{self.host()}"},
        )
        self.assertEqual(response.code, 200)
        # The link is this port's only.
        other = App()
        other_port = other.listen()
        self.addCleanup(other.stop)
        yield self.expose(port=other_port)
        response, body = yield self.fetch(
            "GET",
            "/",
            token=None,
            host=self.host(other_port),
            headers={"cookie": value.replace(str(self.app_port), str(other_port))},
        )
        self.assertEqual(
            (response.code, json.loads(body)["code"]), (401, "link_invalid")
        )
        lines = [r for r in self.audit_lines() if r.get("via") == "preview"]
        self.assertTrue(
            any(r.get("on_behalf_of") == "admin" and r["status"] == 200 for r in lines)
        )

    @inlineCallbacks
    def test_link_never_in_the_audit(self) -> None:
        """
        A live link presented as ``?sbx_link=`` (on a refused POST, on a
        GET traded for the cookie) or under another parameter's name is
        masked in every audit line: the audit file never holds a link that
        would open the app.
        """
        yield self.expose()
        minted = yield self.request("POST", f"/preview/ports/{self.app_port}/link", {})
        link = minted.json()["token"]
        response, _ = yield self.fetch(
            "POST",
            f"/?sbx_link={link}",
            token=None,
            headers={"origin": "http://evil.example"},
        )
        self.assertIn(response.code, (401, 403))
        response, _ = yield self.fetch("GET", f"/nope?sbx_link={link}", token=None)
        self.assertEqual(response.code, 303)
        response, _ = yield self.fetch("GET", f"/headers?next={link}", token=None)
        self.assertEqual(response.code, 401)
        lines = [r for r in self.audit_lines() if r.get("via") == "preview"]
        self.assertEqual(
            [r["query"] for r in lines[-3:]],
            ["sbx_link=%2A%2A%2A", "sbx_link=%2A%2A%2A", "next=%2A%2A%2A"],
        )
        with open(self.audit_path) as f:
            written = f.read()
        self.assertNotIn("sbxl_", written)
        # The link is live: it is what the audit must not have held.
        response, _ = yield self.fetch("GET", "/", token=link)
        self.assertEqual(response.code, 200)

    @inlineCallbacks
    def test_public_and_path_mode(self) -> None:
        """A public exposure needs nothing; /p/PORT/ reaches it on the door's own host."""
        yield self.expose(public=True)
        response, _ = yield self.fetch("GET", "/", token=None)
        self.assertEqual(response.code, 200)
        response, body = yield self.fetch(
            "GET",
            f"/p/{self.app_port}/headers",
            token=None,
            host=f"127.0.0.1:{self.door_port}",
        )
        self.assertEqual(response.code, 200)
        seen = json.loads(body)
        self.assertEqual(seen["uri"], "/headers")
        self.assertEqual(seen["headers"]["x-forwarded-prefix"], [f"/p/{self.app_port}"])
        response, _ = yield self.fetch(
            "GET",
            f"/p/{self.app_port}/redirect",
            token=None,
            host=f"127.0.0.1:{self.door_port}",
        )
        self.assertEqual(
            response.headers.getRawHeaders(b"location"),
            [
                f"http://127.0.0.1:{self.door_port}/p/{self.app_port}/landed?x=1".encode()
            ],
        )

    @inlineCallbacks
    def test_link_in_path_mode(self) -> None:
        """In path mode the cookie is the prefix's only, and the redirect keeps the prefix."""
        yield self.expose()
        minted = yield self.request("POST", f"/preview/ports/{self.app_port}/link", {})
        link = minted.json()["token"]
        door = f"127.0.0.1:{self.door_port}"
        response, _ = yield self.fetch(
            "GET", f"/p/{self.app_port}/page?sbx_link={link}", token=None, host=door
        )
        self.assertEqual(response.code, 303)
        self.assertEqual(
            response.headers.getRawHeaders(b"location"),
            [f"/p/{self.app_port}/page".encode()],
        )
        cookie = response.headers.getRawHeaders(b"set-cookie")[0].decode()
        self.assertIn(f"Path=/p/{self.app_port}/", cookie)
        response, _ = yield self.fetch(
            "GET",
            f"/p/{self.app_port}/",
            token=None,
            host=door,
            headers={"cookie": cookie.split(";")[0]},
        )
        self.assertEqual(response.code, 200)

    @inlineCallbacks
    def test_path_mode_root_without_slash(self) -> None:
        """
        ``GET /p/PORT`` (and with a query) is 301 to ``/p/PORT/`` with the
        query kept, before any credential is asked for; a POST there is
        not redirected; ``/favicon.ico`` on the door's own host is 204, on
        a host the door does not serve still 421.
        """
        yield self.expose()
        door = f"127.0.0.1:{self.door_port}"
        for target, location in (
            (f"/p/{self.app_port}", f"/p/{self.app_port}/"),
            (f"/p/{self.app_port}?a=1&b=%2F", f"/p/{self.app_port}/?a=1&b=%2F"),
        ):
            response, body = yield self.fetch("GET", target, token=None, host=door)
            self.assertEqual(response.code, 301, body)
            self.assertEqual(
                response.headers.getRawHeaders(b"location"), [location.encode()]
            )
        response, _ = yield self.fetch(
            "POST", f"/p/{self.app_port}", token=None, host=door
        )
        self.assertEqual(response.code, 401)
        response, body = yield self.fetch("GET", "/favicon.ico", token=None, host=door)
        self.assertEqual((response.code, body), (204, b""))
        response, _ = yield self.fetch(
            "GET", "/favicon.ico", token=None, host="elsewhere.example"
        )
        self.assertEqual(response.code, 421)

    @inlineCallbacks
    def test_labelled_in_path_mode(self) -> None:
        """
        A labelled exposure opens at ``/p/PORT-LABEL/`` on the door's own
        names, with the label's prefix taken off upstream and put back on
        redirects and the cookie's path; ``/p/PORT/`` names no label, so it
        is refused as another label's host is, its 404 naming the label.
        """
        yield self.expose(label="web")
        door = f"127.0.0.1:{self.door_port}"
        prefix = f"/p/{self.app_port}-web"
        response, body = yield self.fetch("GET", f"{prefix}/headers?q=1", host=door)
        self.assertEqual(response.code, 200, body)
        seen = json.loads(body)
        self.assertEqual(seen["uri"], "/headers?q=1")
        self.assertEqual(seen["headers"]["x-forwarded-prefix"], [prefix])
        response, _ = yield self.fetch("GET", f"{prefix}/redirect", host=door)
        self.assertEqual(
            response.headers.getRawHeaders(b"location"),
            [f"http://{door}{prefix}/landed?x=1".encode()],
        )
        response, body = yield self.fetch("GET", f"/p/{self.app_port}/", host=door)
        self.assertEqual(
            (response.code, json.loads(body)["code"]), (404, "port_not_exposed")
        )
        # To a caller who may see the exposures, the 404 names the label.
        self.assertIn(
            f"port {self.app_port} is exposed as {self.app_port}-web",
            json.loads(body)["error"],
        )
        minted = yield self.request("POST", f"/preview/ports/{self.app_port}/link", {})
        link = minted.json()["token"]
        response, _ = yield self.fetch(
            "GET", f"{prefix}/page?sbx_link={link}", token=None, host=door
        )
        self.assertEqual(response.code, 303)
        self.assertEqual(
            response.headers.getRawHeaders(b"location"), [f"{prefix}/page".encode()]
        )
        cookie = response.headers.getRawHeaders(b"set-cookie")[0].decode()
        self.assertIn(f"Path={prefix}/", cookie)
        response, _ = yield self.fetch(
            "GET",
            f"{prefix}/",
            token=None,
            host=door,
            headers={"cookie": cookie.split(";")[0]},
        )
        self.assertEqual(response.code, 200)

    @inlineCallbacks
    def test_upstream_errors(self) -> None:
        """Nothing listening: 502 (a retrying page for browsers); no head in time: 504."""
        free = App()
        port = free.listen()
        yield free.stop()
        yield self.expose(port=port)
        response, body = yield self.fetch("GET", "/", host=self.host(port))
        self.assertEqual(
            (response.code, json.loads(body)["code"]), (502, "upstream_unavailable")
        )
        self.assertEqual(
            json.loads(body)["error"], f"nothing is answering on port {port}"
        )
        response, body = yield self.fetch(
            "GET", "/", host=self.host(port), headers={"accept": "text/html"}
        )
        self.assertEqual(response.code, 502)
        self.assertIn(b'http-equiv="refresh"', body)
        self.assertEqual(response.headers.getRawHeaders(b"retry-after"), [b"2"])
        yield self.expose()
        response, body = yield self.fetch("GET", "/slow")
        self.assertEqual(
            (response.code, json.loads(body)["code"]), (504, "upstream_timeout")
        )


class PublicPathModeTests(DoorCase):
    """Behind an ingress with one host name: the public URL holds no ``{port}``."""

    autostart = False

    @inlineCallbacks
    def test_urls_handed_out_open_the_app(self) -> None:
        """
        The URL of a labelled exposure, and its link, are path-mode URLs
        that carry the label and open the app through the public host; an
        unlabelled exposure's carry none.
        """
        yield self.start(preview_public_url="http://sbx42.example.test")
        self.door_port = self.daemon.context.preview.door_port
        made = yield self.expose(label="web")
        self.assertEqual(made.status, 201, made.body)
        base = "http://sbx42.example.test"
        url = made.json()["url"]
        self.assertEqual(url, f"{base}/p/{self.app_port}-web/")
        listed = yield self.request("GET", f"/preview/ports/{self.app_port}")
        self.assertEqual(listed.json()["url"], url)
        host = "sbx42.example.test"
        response, body = yield self.fetch("GET", url.removeprefix(base), host=host)
        self.assertEqual(response.code, 200, body)
        self.assertIn(b"preview app", body)
        minted = yield self.request("POST", f"/preview/ports/{self.app_port}/link", {})
        link_url = minted.json()["url"]
        self.assertTrue(link_url.startswith(url + "?sbx_link="), link_url)
        response, _ = yield self.fetch(
            "GET", link_url.removeprefix(base), token=None, host=host
        )
        self.assertEqual(response.code, 303)
        location = response.headers.getRawHeaders(b"location")[0].decode()
        self.assertEqual(location, f"/p/{self.app_port}-web/")
        cookie = response.headers.getRawHeaders(b"set-cookie")[0].split(b";")[0]
        response, body = yield self.fetch(
            "GET",
            location,
            token=None,
            host=host,
            headers={"cookie": cookie.decode()},
        )
        self.assertEqual(response.code, 200, body)
        self.assertIn(b"preview app", body)
        other = App()
        other_port = other.listen()
        self.addCleanup(other.stop)
        made = yield self.expose(port=other_port)
        self.assertEqual(made.json()["url"], f"{base}/p/{other_port}/")
        response, body = yield self.fetch("GET", f"/p/{other_port}/", host=host)
        self.assertEqual(response.code, 200, body)


class StreamingTests(DoorCase):
    """Bodies both ways, events, cookies, redirects."""

    @inlineCallbacks
    def test_download_and_upload(self) -> None:
        """A 16 MiB download arrives whole; a chunked 4 MiB upload reaches the app chunked."""
        yield self.expose()
        response, body = yield self.fetch("GET", f"/big?n={16 * 1024 * 1024}")
        self.assertEqual(response.code, 200)
        self.assertEqual(len(body), 16 * 1024 * 1024)
        response, body = yield self.fetch("POST", "/upload", body=Chunks(64, 65536))
        self.assertEqual(response.code, 200, body)
        seen = json.loads(body)
        self.assertEqual(seen["bytes"], 64 * 65536)
        self.assertTrue(seen["chunked"])

    @inlineCallbacks
    def test_answer_to_an_upload_keeps_its_length(self) -> None:
        """
        The app's ``Content-Length`` reaches the browser for a request with
        a body too (not re-sent chunked), as it does without one.
        """
        yield self.expose()
        for method, path, body in (
            ("POST", "/upload", FileBodyProducer(io.BytesIO(b"x" * 1000))),
            ("GET", "/", None),
        ):
            response, answer = yield self.fetch(method, path, body=body)
            self.assertEqual(response.code, 200, answer)
            # (Twisted's client reads the length into ``length``, and
            # leaves it unknown for a chunked answer.)
            self.assertEqual(response.length, len(answer), method)

    @inlineCallbacks
    def test_sse_is_not_buffered(self) -> None:
        """The first event reaches the client within 100 ms of the app writing it."""
        yield self.expose()
        response = yield self.send(
            "GET", "/sse", headers={"accept": "text/event-stream"}
        )
        self.assertEqual(
            response.headers.getRawHeaders(b"content-type"), [b"text/event-stream"]
        )
        collect = Collect()
        response.deliverBody(collect)
        while len(collect.times) < 2:
            yield deferLater(reactor, 0.05, lambda: None)
        first = collect.times[0][0] - self.app.sse_written[0]
        second = collect.times[1][0] - self.app.sse_written[1]
        self.assertLess(first, 0.1)
        self.assertLess(second, 0.1)
        collect.transport.stopProducing()
        yield collect.done

    @inlineCallbacks
    def test_cookies_and_redirects(self) -> None:
        """The app's two cookies pass; ours and a wider domain's are dropped; Location rewritten."""
        yield self.expose()
        response, _ = yield self.fetch("GET", "/cookies")
        cookies = response.headers.getRawHeaders(b"set-cookie")
        self.assertEqual(cookies, [b"a=1; Path=/", b"b=2; HttpOnly"])
        response, _ = yield self.fetch("GET", "/redirect")
        self.assertEqual(response.code, 302)
        self.assertEqual(
            response.headers.getRawHeaders(b"location"),
            [f"http://{self.host()}/landed?x=1".encode()],
        )

    @inlineCallbacks
    def test_protocol_relative_redirect(self) -> None:
        """
        A ``Location`` of ``//localhost:PORT/x`` (the app's own address,
        no scheme) reaches the browser as the preview's URL, for a request
        without a body and one with, in host mode and path mode; one to
        another host is left alone.
        """
        yield self.expose()
        to = "?to=%2F%2Flocalhost%3APORT%2Fx%3Fy%3D1"
        door = f"127.0.0.1:{self.door_port}"
        prefix = f"/p/{self.app_port}"
        for method, path, host, want in (
            ("GET", "/redirect" + to, None, f"http://{self.host()}/x?y=1"),
            ("GET", f"{prefix}/redirect" + to, door, f"http://{door}{prefix}/x?y=1"),
            ("GET", "/redirect?to=%2F%2Fcdn.example%2Fx", None, "//cdn.example/x"),
        ):
            response, _ = yield self.fetch(method, path, host=host)
            self.assertEqual(response.code, 302, path)
            self.assertEqual(
                response.headers.getRawHeaders(b"location"), [want.encode()], path
            )
        response, _ = yield self.fetch(
            "POST",
            "/redirect" + to,
            body=FileBodyProducer(io.BytesIO(b"form=1")),
        )
        self.assertEqual(
            response.headers.getRawHeaders(b"location"),
            [f"http://{self.host()}/x?y=1".encode()],
        )

    @inlineCallbacks
    def test_backpressure(self) -> None:
        """
        A client that stops reading a large response pauses the app (the
        app has written only what the sockets hold) and the daemon's
        memory stays flat; reading again finishes it whole.
        """
        yield self.expose()
        size = 128 * 1024 * 1024
        response = yield self.send("GET", f"/big?n={size}")
        collect = Collect()
        response.deliverBody(collect)
        collect.transport.pauseProducing()
        yield deferLater(reactor, 1.0, lambda: None)
        before = rss_kib()
        yield deferLater(reactor, 1.0, lambda: None)
        written = size - self.app.streams[-1].left
        self.assertLess(written, 32 * 1024 * 1024, "the app was not paused")
        self.assertLess(rss_kib() - before, 8 * 1024, "memory grew while paused")
        collect.transport.resumeProducing()
        yield collect.done
        self.assertEqual(collect.received, size)
        self.assertLess(rss_kib() - before, 64 * 1024)


class PoolTests(DoorCase):
    """The app closes idle connections after half a second."""

    app_timeout = 0.5

    @inlineCallbacks
    def test_closed_pooled_connection_is_not_a_502(self) -> None:
        """A request after the app dropped the pooled connection still gets a 200."""
        yield self.expose()
        for _ in range(3):
            response, _ = yield self.fetch("GET", "/headers")
            self.assertEqual(response.code, 200)
            yield deferLater(reactor, 1.0, lambda: None)


class WebSocketTests(DoorCase):
    """Upgrades spliced as raw TCP after the 101."""

    timeout = 120

    def connect(self, **kw: Any) -> Any:
        import websocket

        headers = [f"X-Access-Token: {TOKEN}"]
        return websocket.create_connection(
            f"ws://127.0.0.1:{self.door_port}/ws",
            host=self.host(),
            header=headers,
            subprotocols=["echo.v1"],
            # The 5 MB frame is masked and unmasked in Python at both ends:
            # seconds on a busy machine.
            timeout=60,
            **kw,
        )

    @inlineCallbacks
    def test_echo_subprotocol_and_big_binary(self) -> None:
        """Text and a 5 MB binary frame echo back; the subprotocol is the app's choice."""
        yield self.expose()

        def talk() -> tuple[str | None, str, bytes]:
            import websocket

            ws = self.connect()
            try:
                ws.send("hello")
                text = ws.recv()
                blob = bytes(range(256)) * (5 * 1024 * 1024 // 256)
                ws.send(blob, opcode=websocket.ABNF.OPCODE_BINARY)
                back = ws.recv()
                return ws.subprotocol, text, back if back == blob else b"differs"
            finally:
                ws.close()

        subprotocol, text, back = yield deferToThread(talk)
        self.assertEqual(subprotocol, "echo.v1")
        self.assertEqual(text, "hello")
        self.assertEqual(len(back), 5 * 1024 * 1024)
        seen = self.app.ws_headers[-1]
        self.assertEqual(seen["host"], f"localhost:{self.app_port}")
        self.assertNotIn("x-access-token", seen)

    @inlineCallbacks
    def test_link_in_the_handshake_url(self) -> None:
        """A WebSocket opened with ``?sbx_link=`` (no token, no cookie) is let through."""
        yield self.expose()
        minted = yield self.request("POST", f"/preview/ports/{self.app_port}/link", {})
        link = minted.json()["token"]

        def talk() -> str:
            import websocket

            ws = websocket.create_connection(
                f"ws://127.0.0.1:{self.door_port}/ws?sbx_link={link}",
                host=self.host(),
                subprotocols=["echo.v1"],
                timeout=10,
            )
            try:
                ws.send("via link")
                return str(ws.recv())
            finally:
                ws.close()

        self.assertEqual((yield deferToThread(talk)), "via link")

    @inlineCallbacks
    def test_unexpose_closes_open_sockets(self) -> None:
        """Unexposing closes the port's open WebSocket and event stream."""
        yield self.expose()
        response = yield self.send("GET", "/sse")
        collect = Collect()
        response.deliverBody(collect)
        ws = yield deferToThread(self.connect)
        self.addCleanup(ws.close)
        listed = yield self.request("GET", f"/preview/ports/{self.app_port}")
        self.assertEqual(listed.json()["open_websockets"], 1)
        gone = yield self.request("DELETE", f"/preview/ports/{self.app_port}")
        self.assertEqual(gone.status, 200)
        yield collect.done
        code, _ = yield deferToThread(close_frame_of, ws)
        self.assertEqual(code, 1001)

    @inlineCallbacks
    def test_unexpose_sends_a_close_frame(self) -> None:
        """
        An open WebSocket to a port being unexposed gets a close frame,
        1001 (going away) and the reason, not a dropped connection (which
        a browser reports as 1006 and a dev server's client retries).
        """
        yield self.expose()
        ws = yield deferToThread(self.connect)
        self.addCleanup(ws.close)
        gone = yield self.request("DELETE", f"/preview/ports/{self.app_port}")
        self.assertEqual(gone.status, 200)
        code, reason = yield deferToThread(close_frame_of, ws)
        self.assertEqual(code, 1001)
        self.assertEqual(reason, f"port {self.app_port} is no longer exposed")

    @inlineCallbacks
    def test_expiry_closes_open_sockets_on_time(self) -> None:
        """
        An exposure's ``ttl_seconds`` ends its open WebSocket (1001, the
        reason) and its event stream when it passes, with no other
        request to the door or the API to notice it.
        """
        reply = yield self.expose(ttl_seconds=2)
        self.assertEqual(reply.status, 201, reply.body)
        exposed = time.monotonic()
        response = yield self.send("GET", "/sse")
        collect = Collect()
        response.deliverBody(collect)
        ws = yield deferToThread(self.connect)
        self.addCleanup(ws.close)
        ws.settimeout(8)
        code, reason = yield deferToThread(close_frame_of, ws)
        yield collect.done
        self.assertEqual(code, 1001)
        self.assertEqual(reason, f"the preview of port {self.app_port} expired")
        self.assertFalse(collect.reason.check(ResponseDone), collect.reason)
        self.assertLess(time.monotonic() - exposed, 10)


def close_frame_of(ws: Any) -> tuple[int | None, str]:
    """The code and reason of the close frame ``ws`` gets next (None: closed without one)."""
    import websocket

    while True:
        try:
            frame = ws.recv_data_frame(True)[1]
        except (websocket.WebSocketConnectionClosedException, OSError):
            return None, ""
        if frame.opcode == websocket.ABNF.OPCODE_CLOSE:
            return (
                int.from_bytes(frame.data[:2], "big"),
                frame.data[2:].decode("utf-8"),
            )


TORNADO_APP = """
import sys, tornado.ioloop, tornado.web, tornado.websocket

class Echo(tornado.websocket.WebSocketHandler):
    def on_message(self, message):
        self.write_message(message)

app = tornado.web.Application([(r"/ws", Echo)])
app.listen(int(sys.argv[1]), address="127.0.0.1")
tornado.ioloop.IOLoop.current().start()
"""


class OriginCheckingAppTests(DoorCase):
    """An app that checks a WebSocket's Origin against its Host (tornado's default)."""

    timeout = 60

    @inlineCallbacks
    def test_tornado_websocket_through_the_door(self) -> None:
        """
        A page's WebSocket (its ``Origin`` the preview's own) reaches a
        tornado app through a default exposure, whose Host the door
        rewrites: the Origin goes with it.  Another site's Origin is
        passed as it came, and tornado refuses it (403) as it would
        directly.
        """
        try:
            import tornado  # noqa: F401
        except ImportError:
            self.skipTest("tornado is not installed")
        port = free_port()
        app = subprocess.Popen(
            [sys.executable, "-c", TORNADO_APP, str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

        def stop() -> None:
            app.kill()
            app.wait(timeout=10)

        self.addCleanup(stop)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.fail("the tornado app did not listen within 30 s")
                yield deferLater(reactor, 0.1, lambda: None)
        reply = yield self.expose(port=port)
        self.assertEqual(reply.status, 201, reply.body)

        def talk(origin: str) -> str:
            import websocket

            try:
                ws = websocket.create_connection(
                    f"ws://127.0.0.1:{self.door_port}/ws",
                    host=self.host(port),
                    origin=origin,
                    header=[f"X-Access-Token: {TOKEN}"],
                    timeout=10,
                )
            except websocket.WebSocketBadStatusException as e:
                return f"refused {e.status_code}"
            try:
                ws.send("hi")
                return str(ws.recv())
            finally:
                ws.close()

        own = yield deferToThread(talk, f"http://{self.host(port)}")
        self.assertEqual(own, "hi")
        foreign = yield deferToThread(talk, "http://elsewhere.example")
        self.assertEqual(foreign, "refused 403")


class WebSocketReloadTests(DoorCase):
    """A policy reload closes the spliced WebSockets it no longer lets in."""

    @inlineCallbacks
    def test_scope_taken_away_closes_1008(self) -> None:
        """
        A reload that takes ``preview:use`` from the socket's identity
        closes it with 1008 and the reason; the app's side is closed too.
        """
        yield self.expose()
        ws = yield deferToThread(WebSocketTests.connect, self)
        self.addCleanup(ws.close)

        def echo() -> str:
            ws.send("before")
            return str(ws.recv())

        self.assertEqual((yield deferToThread(echo)), "before")
        narrowed = [dict(t) for t in POLICY["auth"]["tokens"]]
        narrowed[0]["scopes"] = ["preview:read"]
        self.daemon.daemon.settings.policy = {
            **POLICY,
            "auth": {"tokens": narrowed},
        }
        self.assertTrue(self.daemon.daemon.reload())

        def close_frame() -> tuple[int, str]:
            import websocket

            while True:
                frame = ws.recv_data_frame(True)[1]
                if frame.opcode == websocket.ABNF.OPCODE_CLOSE:
                    return (
                        int.from_bytes(frame.data[:2], "big"),
                        frame.data[2:].decode("utf-8"),
                    )

        code, reason = yield deferToThread(close_frame)
        self.assertEqual(code, 1008)
        self.assertIn("no longer holds scope 'preview:use'", reason)


class StreamReloadTests(DoorCase):
    """A policy reload ends the plain answers it no longer lets through, not only WebSockets."""

    policy = {
        **POLICY,
        "endpoints": {
            "preview_proxy": {"audit": "all", "limits": {"timeout_seconds": 30}}
        },
    }

    @inlineCallbacks
    def test_identity_removed_ends_streams_and_long_polls(self) -> None:
        """
        A reload that takes the caller's identity out of the policy cuts
        its event stream through the door (no more events, and the body
        is broken, not complete) and answers its long poll still waiting
        on the app with the refusal (401) at once; asking again is 401.
        """
        yield self.expose()
        response = yield self.send(
            "GET", "/sse", headers={"accept": "text/event-stream"}
        )
        self.assertEqual(response.code, 200)
        events = Collect()
        response.deliverBody(events)
        polling = self.send("GET", "/slow")
        while len(events.times) < 2:
            yield deferLater(reactor, 0.05, lambda: None)
        self.daemon.daemon.settings.policy = {
            **self.policy,
            "auth": {"tokens": [POLICY["auth"]["tokens"][1]]},
        }
        self.assertTrue(self.daemon.daemon.reload())
        reloaded = time.monotonic()
        yield events.done
        self.assertLess(time.monotonic() - reloaded, 5)
        self.assertFalse(events.reason.check(ResponseDone), events.reason)
        poll = yield polling
        body = yield readBody(poll)
        self.assertEqual(poll.code, 401, body)
        self.assertLess(time.monotonic() - reloaded, 5)
        self.assertEqual(json.loads(body)["code"], "unauthorized")
        again, _ = yield self.fetch("GET", "/")
        self.assertEqual(again.code, 401)

    @inlineCallbacks
    def test_revoked_link_ends_its_stream_and_says_so(self) -> None:
        """
        Revoking a link cuts the event stream it opened, and the daemon's
        log says it was the link's revocation (no reload happened).
        """
        from twisted.logger import formatEvent, globalLogPublisher

        said: list[str] = []

        def observe(event: Any) -> None:
            if event.get("log_namespace") == "sandboxd.preview":
                said.append(formatEvent(event))

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)
        yield self.expose()
        minted = yield self.request("POST", f"/preview/ports/{self.app_port}/link", {})
        link = minted.json()
        cookie = f"sbx_p_{self.app_port}={link['token']}"
        response = yield self.send(
            "GET", "/sse", token=None, headers={"cookie": cookie}
        )
        self.assertEqual(response.code, 200)
        events = Collect()
        response.deliverBody(events)
        while not events.times:
            yield deferLater(reactor, 0.05, lambda: None)
        gone = yield self.request("DELETE", f"/auth/links/{link['link_id']}")
        self.assertEqual(gone.status, 200, gone.body)
        yield events.done
        self.assertFalse(events.reason.check(ResponseDone), events.reason)
        ended = [line for line in said if "GET /sse" in line]
        self.assertEqual(len(ended), 1, said)
        self.assertIn("revoked", ended[0])
        self.assertNotIn("reload", ended[0])


class WebSocketLimitTests(DoorCase):
    """``limits.max_sessions`` of ``preview_proxy`` bounds the open WebSockets."""

    policy = {
        **POLICY,
        "endpoints": {"preview_proxy": {"limits": {"max_sessions": 1}}},
    }

    @inlineCallbacks
    def test_one_too_many(self) -> None:
        """The second WebSocket while one is open: 429 too_many_sessions."""
        yield self.expose()
        first = yield deferToThread(WebSocketTests.connect, self)
        self.addCleanup(first.close)

        def second() -> str:
            import websocket

            try:
                WebSocketTests.connect(self).close()
            except websocket.WebSocketBadStatusException as e:
                return f"{e.status_code} {e.resp_body!r}"
            return "connected"

        refused = yield deferToThread(second)
        self.assertIn("429", refused)
        self.assertIn("too_many_sessions", refused)


class WebSocketShareTests(DoorCase):
    """
    One holder (an identity, or every visitor of a public preview
    together) holds at most its share of the door's WebSockets.
    """

    policy = {
        **POLICY,
        "endpoints": {"preview_proxy": {"limits": {"max_sessions": 4}}},
    }

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        self.private = App()
        self.private_port = self.private.listen()
        self.addCleanup(self.private.stop)
        yield self.expose(public=True)
        yield self.expose(port=self.private_port)

    def open_ws(self, port: int, token: str | None) -> Any:
        """A WebSocket to ``port``'s preview (run in a thread); its refusal as text."""
        import websocket

        try:
            return websocket.create_connection(
                f"ws://127.0.0.1:{self.door_port}/ws",
                host=self.host(port),
                header=[f"X-Access-Token: {token}"] if token else [],
                subprotocols=["echo.v1"],
                timeout=10,
            )
        except websocket.WebSocketBadStatusException as e:
            return f"{e.status_code} {e.resp_body!r}"

    @inlineCallbacks
    def test_strangers_cannot_lock_the_owner_out(self) -> None:
        """
        Visitors of a public preview get their share of the door's 4
        WebSockets (2: two tokens and the visitors), then 429 naming
        ``max_per_identity``; the owner's WebSockets to a private preview
        still open, up to the door's bound.
        """
        anonymous = []
        for _ in range(2):
            ws = yield deferToThread(self.open_ws, self.app_port, None)
            self.assertNotIsInstance(ws, str)
            self.addCleanup(ws.shutdown)
            anonymous.append(ws)
        refused = yield deferToThread(self.open_ws, self.app_port, None)
        self.assertIsInstance(refused, str)
        self.assertIn("429", refused)
        self.assertIn("max_per_identity", refused)
        for _ in range(2):
            ws = yield deferToThread(self.open_ws, self.private_port, TOKEN)
            self.assertNotIsInstance(ws, str)
            self.addCleanup(ws.shutdown)

            def echo(ws: Any = ws) -> str:
                ws.send("owner")
                return str(ws.recv())

            self.assertEqual((yield deferToThread(echo)), "owner")

    @inlineCallbacks
    def test_an_idle_socket_gives_its_place(self) -> None:
        """
        With the visitors' share full of sockets that passed no byte for
        the reclaim time, a new visitor's WebSocket opens, and the idlest
        one is closed with 1001 saying why.
        """
        from sandboxd.preview import door

        self.patch(door, "PREVIEW_WS_RECLAIM_IDLE_SECONDS", 0.5)
        idle = yield deferToThread(self.open_ws, self.app_port, None)
        self.addCleanup(idle.shutdown)
        yield deferLater(reactor, 0.2, lambda: None)
        busy = yield deferToThread(self.open_ws, self.app_port, None)
        self.addCleanup(busy.shutdown)
        yield deferLater(reactor, 0.4, lambda: None)

        def talk() -> str:
            busy.send("still here")
            return str(busy.recv())

        self.assertEqual((yield deferToThread(talk)), "still here")
        yield deferLater(reactor, 0.3, lambda: None)
        new = yield deferToThread(self.open_ws, self.app_port, None)
        self.assertNotIsInstance(new, str)
        self.addCleanup(new.shutdown)
        code, reason = yield deferToThread(close_frame_of, idle)
        self.assertEqual(code, 1001)
        self.assertIn("idle", reason)
        self.assertEqual((yield deferToThread(talk)), "still here")


class WebSocketIdleTests(DoorCase):
    """``limits.ws_idle_timeout_seconds`` closes a spliced WebSocket nobody uses."""

    policy = {
        **POLICY,
        "endpoints": {
            "preview_proxy": {
                "audit": "all",
                "limits": {"ws_idle_timeout_seconds": 2},
            }
        },
    }

    @inlineCallbacks
    def test_idle_closed_active_kept(self) -> None:
        """
        A socket silent for the bound (2 s) is closed (and its audit line
        names the rule); one that talks every 0.3 s through more than twice
        the bound stays open and echoes every message.
        """
        yield self.expose()
        quiet = yield deferToThread(WebSocketTests.connect, self)
        self.addCleanup(quiet.close)
        busy = yield deferToThread(WebSocketTests.connect, self)
        self.addCleanup(busy.close)

        def talk() -> list[str]:
            echoes = []
            for i in range(16):
                busy.send(f"m{i}")
                echoes.append(busy.recv())
                time.sleep(0.3)
            return echoes

        echoes = yield deferToThread(talk)
        self.assertEqual(echoes, [f"m{i}" for i in range(16)])

        def closed() -> bool:
            import websocket

            try:
                quiet.send("late")
                return quiet.recv() == ""
            except (websocket.WebSocketConnectionClosedException, OSError):
                return True

        self.assertTrue((yield deferToThread(closed)))
        listed = yield self.request("GET", f"/preview/ports/{self.app_port}")
        self.assertEqual(listed.json()["open_websockets"], 1)
        lines = [
            r
            for r in self.audit_lines()
            if r.get("via") == "preview" and r.get("status") == 101
        ]
        self.assertEqual(len(lines), 1)
        self.assertEqual(lines[0]["rule"], "policy:endpoints.preview_proxy")


class KernelPortTests(DoorCase):
    """A code context's kernel's own ports join the ports never previewed."""

    policy = {
        **POLICY,
        "groups": {"preview": True, "code": True},
        "endpoints": {**POLICY.get("endpoints", {}), **KERNEL_START["endpoints"]},
    }
    timeout = KERNEL_CASE_SECONDS

    def setUp(self) -> Any:
        need_ipykernel()
        return super().setUp()

    @inlineCallbacks
    def test_kernel_ports_are_not_allowed(self) -> None:
        """
        Exposing a port the kernel listens on for itself (ipykernel binds a
        ZMQ socket on loopback TCP) is 403 ``port_not_allowed``; a port the
        user's code opens in the kernel later can be exposed; once the
        context is gone its kernel's ports are no longer held back.
        """
        from sandboxd.sysinfo import listening

        created = yield self.request("POST", "/code/contexts", {})
        self.assertEqual(created.status, 201, created.body)
        cid = created.json()["id"]
        pid = created.json()["pid"]
        own = yield deferToThread(
            lambda: sorted({e.port for e in listening() if e.pid == pid})
        )
        self.assertTrue(own, "the kernel listens on no TCP port")
        for port in own:
            reply = yield self.expose(port=port)
            self.assertEqual(
                (reply.status, reply.json()["code"], reply.json()["rule"]),
                (403, "port_not_allowed", "daemon:own_ports"),
            )
        ran = yield self.request(
            "POST",
            f"/code/contexts/{cid}/execute",
            {
                "code": "import socket\n"
                "app = socket.socket()\n"
                "app.bind(('127.0.0.1', 0))\n"
                "app.listen()\n"
                "print(app.getsockname()[1])"
            },
        )
        self.assertEqual(ran.status, 200, ran.body)
        app_port = int(ran.json()["stdout"].strip())
        reply = yield self.expose(port=app_port)
        self.assertEqual(reply.status, 201, reply.body)
        gone = yield self.request("DELETE", f"/code/contexts/{cid}")
        self.assertEqual(gone.status, 200, gone.body)
        self.assertEqual(self.door.own_ports() & set(own), set())


class ReloadTests(DoorCase):
    """The door follows the policy across reloads."""

    autostart = False

    @inlineCallbacks
    def test_reload_switches_the_door(self) -> None:
        """
        A reload that turns the preview group off stops the door listening
        and ends the exposures; one that turns it back on listens again.
        """
        path = os.path.join(self.base_dir, "policy.json")

        def write(on: bool) -> None:
            with open(path, "w") as f:
                json.dump({**POLICY, "groups": {"preview": on}}, f)

        write(True)
        yield self.start_on_a_fixed_port(policy=None, policy_file=path)
        yield self.expose()
        response, _ = yield self.fetch("GET", "/")
        self.assertEqual(response.code, 200)
        write(False)
        self.assertTrue(self.daemon.daemon.reload())
        yield deferLater(reactor, 0.2, lambda: None)
        self.assertEqual(self.door.exposures.by_port, {})
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", self.door_port), timeout=2).close()
        write(True)
        self.assertTrue(self.daemon.daemon.reload())
        for _ in range(100):
            if self.door.port is not None:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        yield self.expose()
        response, _ = yield self.fetch("GET", "/")
        self.assertEqual(response.code, 200)

    @inlineCallbacks
    def test_switched_off_closes_websockets_with_a_frame(self) -> None:
        """
        A reload that switches the preview group off closes an open
        WebSocket through the door with 1001 and the reason; the group
        switched on again lists no exposure (they were ended, and the
        door says so in its log).
        """
        path = os.path.join(self.base_dir, "policy.json")

        def write(on: bool) -> None:
            with open(path, "w") as f:
                json.dump({**POLICY, "groups": {"preview": on}}, f)

        write(True)
        yield self.start_on_a_fixed_port(policy=None, policy_file=path)
        yield self.expose()
        ws = yield deferToThread(WebSocketTests.connect, self)
        self.addCleanup(ws.close)
        site = self.door.site
        write(False)
        self.assertTrue(self.daemon.daemon.reload())
        # A browser busy elsewhere reads the frame late: it must still be
        # there (a reset of the connection would have thrown it away).
        yield deferLater(reactor, 0.3, lambda: None)
        code, reason = yield deferToThread(close_frame_of, ws)
        self.assertEqual((code, reason), (1001, "the preview door closed"))
        for _ in range(100):  # the door lets go of the connection too
            if not site.connections:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual(list(site.connections), [])
        write(True)
        self.assertTrue(self.daemon.daemon.reload())
        for _ in range(100):
            if self.door.port is not None:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        listed = yield self.request("GET", "/preview/ports")
        self.assertEqual(listed.status, 200, listed.body)
        self.assertEqual([p for p in listed.json()["ports"] if p["exposed"]], [])
        # The switched-off door's close_all looks for its connections every
        # 10 ms: let its last look run before the reactor is checked.
        yield deferLater(reactor, 0.05, lambda: None)


class ExposureApiTests(DoorCase):
    """The preview group's own endpoints."""

    policy = {
        **POLICY,
        "endpoints": {
            **POLICY["endpoints"],
            "group:preview": {
                "params": {"allow_public": False, "ports": ["1024-65535"]}
            },
        },
    }

    @inlineCallbacks
    def test_list_get_expire_preserve(self) -> None:
        """
        The list shows exposures and other listening ports; an exposure
        ends at its ttl; ``host_header: preserve`` gives the app the
        browser's Host for plain requests and upgrades alike; public is
        refused when the policy says so.
        """
        refused = yield self.expose(public=True)
        self.assertEqual(
            (refused.status, refused.json()["code"]), (403, "param_not_allowed")
        )
        made = yield self.expose(label="web", host_header="preserve", ttl_seconds=60)
        self.assertEqual(made.status, 201, made.body)
        listed = yield self.request("GET", "/preview/ports")
        ports = {p["port"]: p for p in listed.json()["ports"]}
        self.assertTrue(ports[self.app_port]["exposed"])
        self.assertTrue(ports[self.app_port]["listening"])
        self.assertEqual(ports[self.app_port]["label"], "web")
        self.assertFalse(ports[self.daemon.port]["exposed"])
        host = self.host(label="web")
        response, body = yield self.fetch("GET", "/headers", host=host)
        self.assertEqual(json.loads(body)["headers"]["host"], [host])

        def upgrade_host() -> None:
            import websocket

            websocket.create_connection(
                f"ws://127.0.0.1:{self.door_port}/ws",
                host=host,
                header=[f"X-Access-Token: {TOKEN}"],
                timeout=10,
            ).close()

        yield deferToThread(upgrade_host)
        self.assertEqual(self.app.ws_headers[-1]["host"], host)
        got = yield self.request("GET", f"/preview/ports/{self.app_port}")
        self.assertGreaterEqual(got.json()["requests"], 2)
        # The exposure ends at its ttl: the table's clock is 61 s on.
        later = self.daemon.reactor.seconds() + 61
        self.patch(self.door.exposures, "_clock", lambda: later)
        gone = yield self.request("GET", f"/preview/ports/{self.app_port}")
        self.assertEqual((gone.status, gone.json()["code"]), (404, "port_not_exposed"))
        response, _ = yield self.fetch("GET", "/", host=host)
        self.assertEqual(response.code, 404)

    @inlineCallbacks
    def test_unexpose_says_whether_the_app_listens(self) -> None:
        """
        ``DELETE`` answers whether the app still listens, as the list right
        after it does: unexposing closes the door, not the app.
        """
        yield self.expose()
        gone = yield self.request("DELETE", f"/preview/ports/{self.app_port}")
        self.assertEqual(gone.status, 200, gone.body)
        self.assertEqual(gone.json()["port"], self.app_port)
        self.assertTrue(gone.json()["listening"])
        listed = yield self.request("GET", "/preview/ports")
        ports = {p["port"]: p for p in listed.json()["ports"]}
        self.assertEqual(
            (ports[self.app_port]["listening"], ports[self.app_port]["exposed"]),
            (True, False),
        )
        free = free_port()
        yield self.expose(port=free)
        gone = yield self.request("DELETE", f"/preview/ports/{free}")
        self.assertFalse(gone.json()["listening"])


PM = "pm-token-0123456789"
PM2 = "pm2-token-0123456789"


class ExposureOwnerTests(DoorCase):
    """Each identity's exposures are its own, and it holds a share of the table."""

    policy = {
        **POLICY,
        "auth": {
            "tokens": [
                *POLICY["auth"]["tokens"],
                *(
                    {
                        "id": name,
                        "token_sha256": _sha(token),
                        "scopes": ["preview:manage", "preview:read"],
                    }
                    for name, token in (("pm", PM), ("pm2", PM2))
                ),
            ]
        },
        "endpoints": {
            **POLICY["endpoints"],
            "preview_expose": {"limits": {"max_sessions": 4}},
        },
    }

    @inlineCallbacks
    def test_no_takeover_and_a_share(self) -> None:
        """
        Another identity exposing or unexposing a port is 403
        ``permission_denied`` and the exposure is unchanged (label, owner);
        one identity exposes at most half the table (429 naming
        ``max_per_identity``) while another still can; ``*`` may unexpose
        anyone's.
        """
        made = yield self.expose(label="bee")
        self.assertEqual(made.status, 201, made.body)
        taken = yield self.request(
            "POST", "/preview/ports", {"port": self.app_port, "public": True}, token=PM2
        )
        self.assertEqual(
            (taken.status, taken.json()["code"]), (403, "permission_denied"), taken.body
        )
        gone = yield self.request(
            "DELETE", f"/preview/ports/{self.app_port}", token=PM2
        )
        self.assertEqual((gone.status, gone.json()["code"]), (403, "permission_denied"))
        kept = yield self.request("GET", f"/preview/ports/{self.app_port}")
        self.assertEqual(
            (kept.json()["label"], kept.json()["exposed_by"], kept.json()["public"]),
            ("bee", "admin", False),
        )
        ports = [free_port() for _ in range(3)]
        for port in ports[:2]:
            mine = yield self.request(
                "POST", "/preview/ports", {"port": port}, token=PM
            )
            self.assertEqual(mine.status, 201, mine.body)
        over = yield self.request(
            "POST", "/preview/ports", {"port": ports[2]}, token=PM
        )
        self.assertEqual(
            (over.status, over.json()["code"], over.json()["rule"]),
            (429, "too_many_sessions", "default:limits.max_per_identity"),
        )
        other = yield self.request(
            "POST", "/preview/ports", {"port": ports[2]}, token=PM2
        )
        self.assertEqual(other.status, 201, other.body)
        ended = yield self.request("DELETE", f"/preview/ports/{ports[0]}")
        self.assertEqual(ended.status, 200, ended.body)


class PreviewableTests(DoorCase):
    """The listing says which ports a preview can open for, as exposing would decide."""

    @inlineCallbacks
    def setUp(self) -> Any:
        # A second app, on a port the policy denies: it must be known
        # before the daemon starts with that policy.
        self.denied = App()
        self.denied_port = self.denied.listen()
        self.addCleanup(self.denied.stop)
        self.policy = {
            **POLICY,
            "endpoints": {
                **POLICY["endpoints"],
                "preview_expose": {"params": {"deny_ports": [self.denied_port]}},
            },
        }
        yield super().setUp()

    @inlineCallbacks
    def test_previewable(self) -> None:
        """
        ``previewable`` is true for an app's port, exposed or not, and
        false for the daemon's own ports and a denied one, each of which
        ``POST /preview/ports`` refuses.
        """
        listed = yield self.request("GET", "/preview/ports")
        ports = {p["port"]: p for p in listed.json()["ports"]}
        self.assertTrue(ports[self.app_port]["previewable"])
        for port in (self.daemon.port, self.door_port, self.denied_port):
            self.assertFalse(ports[port]["previewable"], port)
            refused = yield self.expose(port=port)
            self.assertEqual(
                (refused.status, refused.json()["code"]), (403, "port_not_allowed")
            )
        made = yield self.expose()
        self.assertEqual(made.status, 201, made.body)
        listed = yield self.request("GET", "/preview/ports")
        ports = {p["port"]: p for p in listed.json()["ports"]}
        self.assertTrue(ports[self.app_port]["exposed"])
        self.assertTrue(ports[self.app_port]["previewable"])


class ElsewhereTests(DoorCase):
    """An app listening only where the door does not connect (not 127.0.0.1, not ::1)."""

    @inlineCallbacks
    def test_listed_unpreviewable_and_told_how_to_bind(self) -> None:
        """
        An app bound to 127.0.0.2 alone (as one bound to the sandbox's own
        address) is listed listening but not previewable; exposed, the
        door's 502 says where it listens and how to bind it, in the JSON
        error and the browser's page, rather than that nothing listens.
        """
        try:
            listening = reactor.listenTCP(0, self.app.site, interface="127.0.0.2")
        except Exception as e:  # no 127.0.0.0/8 route beyond .1 here
            self.skipTest(f"cannot listen on 127.0.0.2: {e}")
        self.addCleanup(listening.stopListening)
        port = listening.getHost().port
        listed = yield self.request("GET", "/preview/ports")
        ports = {p["port"]: p for p in listed.json()["ports"]}
        self.assertTrue(ports[port]["listening"])
        self.assertFalse(ports[port]["previewable"])
        made = yield self.expose(port=port)
        self.assertEqual(made.status, 201, made.body)
        response, body = yield self.fetch("GET", "/", host=self.host(port))
        error = json.loads(body)
        self.assertEqual((response.code, error["code"]), (502, "upstream_unavailable"))
        self.assertIn(f"port {port} listens on 127.0.0.2 only", error["error"])
        self.assertIn("bind the app to 0.0.0.0 or 127.0.0.1", error["error"])
        self.assertEqual(error["listens_on"], ["127.0.0.2"])
        response, page = yield self.fetch(
            "GET", "/", host=self.host(port), headers={"accept": "text/html"}
        )
        self.assertEqual(response.code, 502)
        self.assertIn(b"listens on 127.0.0.2 only", page)
        self.assertNotIn(b"Nothing is listening", page)


class NoDoorPreviewableTests(DaemonTestCase):
    """Without the door nothing can be previewed, and the listing says so."""

    policy = POLICY
    token = TOKEN

    @inlineCallbacks
    def setUp(self) -> Any:
        self.app = App()
        self.app_port = self.app.listen()
        self.addCleanup(self.app.stop)
        yield super().setUp()

    @inlineCallbacks
    def test_nothing_previewable(self) -> None:
        """Every listed port is ``previewable: false`` when the daemon has no preview door."""
        listed = yield self.request("GET", "/preview/ports")
        ports = {p["port"]: p for p in listed.json()["ports"]}
        self.assertIn(self.app_port, ports)
        self.assertEqual({p["previewable"] for p in ports.values()}, {False})


class _UnusableAnswer(Protocol):
    """An app whose answer no browser could use: the factory's bytes, then a close."""

    def dataReceived(self, data: bytes) -> None:
        if b"\r\n\r\n" in data and self.transport is not None:
            self.transport.write(self.factory.answer)  # type: ignore[attr-defined]
            self.transport.loseConnection()


class UnusableAnswerTests(DoorCase):
    """An app that answers what the door cannot pass on: a 502 that says why."""

    @inlineCallbacks
    def test_the_502_says_why(self) -> Any:
        """
        A head that is not HTTP, two lengths, a close before any answer:
        502 ``upstream_unavailable`` naming what the app did (not "nothing
        is answering", which sends one looking for a server that runs),
        for a plain request and one with a body alike.
        """
        cases = [
            (
                b"NOT HTTP\r\n\r\n",
                ("not an HTTP/1.x response", "a malformed response head"),
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde",
                ("a bad Content-Length", "a malformed response head"),
            ),
            (b"", ("the app closed the connection",) * 2),
        ]
        for answer, (plain, with_body) in cases:
            app = ServerFactory()
            app.protocol = _UnusableAnswer
            app.answer = answer  # type: ignore[attr-defined]
            app = yield self.serve(app)
            for method, body, why in (
                ("GET", None, plain),
                ("POST", FileBodyProducer(io.BytesIO(b"{}")), with_body),
            ):
                response, text = yield self.fetch(
                    method, "/", host=self.host(app.port), body=body
                )
                self.assertEqual(response.code, 502, (answer, method, text))
                error = json.loads(text)
                self.assertEqual(error["code"], "upstream_unavailable")
                self.assertEqual(
                    error["error"],
                    f"no usable answer from the app on port {app.port}: {why}",
                    (answer, method),
                )


class _StalledBody(Protocol):
    """An app that sends a head and the start of a body, then nothing."""

    def dataReceived(self, data: bytes) -> None:
        if b"\r\n\r\n" in data and self.transport is not None:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nfirst bytes"
            )

    def connectionLost(self, reason: Any = None) -> None:
        self.factory.lost.append(time.monotonic())  # type: ignore[attr-defined]


class _StalledApp(ServerFactory):
    protocol = _StalledBody

    def __init__(self) -> None:
        self.lost: list[float] = []
        self.port = 0


class UpstreamStallTests(DoorCase):
    """``limits.idle_timeout_seconds`` ends a request during which nothing moves."""

    policy = {
        **POLICY,
        "endpoints": {
            "preview_proxy": {"audit": "all", "limits": {"idle_timeout_seconds": 1}}
        },
    }

    @inlineCallbacks
    def test_stalled_body_is_cut(self) -> Any:
        """
        An app that sends its head and then stalls its body: the browser's
        connection is closed within a few idle periods (the answer cut
        short), and so is the door's connection to the app.
        """
        app = yield self.serve(_StalledApp())
        host = f"{app.port}.localhost:{self.door_port}"

        def get() -> tuple[bytes, float]:
            with socket.create_connection(("127.0.0.1", self.door_port), 15) as s:
                s.sendall(
                    f"GET / HTTP/1.1\r\nHost: {host}\r\n"
                    f"X-Access-Token: {TOKEN}\r\n\r\n".encode()
                )
                began = time.monotonic()
                out = b""
                try:
                    while chunk := s.recv(65536):
                        out += chunk
                except OSError:
                    pass
                return out, time.monotonic() - began

        out, elapsed = yield deferToThread(get)
        self.assertIn(b"first bytes", out)
        self.assertLess(elapsed, 8)
        for _ in range(50):
            if app.lost:
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertTrue(app.lost)

    @inlineCallbacks
    def test_stalled_answer_to_an_upload_is_cut(self) -> Any:
        """
        The same for a request with a body (which the door reads through
        its other channel): the app answers the upload with a head and
        stalls; the browser's connection is closed within a few periods.
        """
        app = yield self.serve(_StalledApp())
        host = f"{app.port}.localhost:{self.door_port}"

        def post() -> tuple[bytes, float]:
            with socket.create_connection(("127.0.0.1", self.door_port), 15) as s:
                s.sendall(
                    f"POST /upload HTTP/1.1\r\nHost: {host}\r\n"
                    f"X-Access-Token: {TOKEN}\r\nContent-Length: 5\r\n\r\n"
                    "hello".encode()
                )
                began = time.monotonic()
                out = b""
                try:
                    while chunk := s.recv(65536):
                        out += chunk
                except OSError:
                    pass
                return out, time.monotonic() - began

        out, elapsed = yield deferToThread(post)
        self.assertIn(b"first bytes", out)
        self.assertLess(elapsed, 8)


class TrickledBodyTests(DoorCase):
    """A browser that trickles a request body to the door is refused, not waited on."""

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        kwargs.setdefault("head_deadline", 1.0)
        return super().start(stop_at_end, **kwargs)

    @inlineCallbacks
    def test_trickled_upload_is_408(self) -> Any:
        """
        An upload sent a byte every 0.2 s: 408 ``timeout`` from the door
        soon after the grace, and the connection closed.
        """
        yield self.expose()
        host = self.host()
        head = (
            f"POST /upload HTTP/1.1\r\nHost: {host}\r\n"
            f"X-Access-Token: {TOKEN}\r\nAccept: application/json\r\n"
            "Content-Length: 100000\r\n\r\n"
        ).encode()
        out, elapsed = yield deferToThread(trickle_body, self.door_port, head, 15)
        self.assertTrue(out.startswith(b"HTTP/1.1 408 "), out[:200])
        self.assertIn(b'"timeout"', out)
        self.assertLess(elapsed, 8)


class EveryListenerTests(DaemonTestCase):
    """No port the daemon listens on can be previewed, whichever door it is."""

    policy = {**POLICY, "groups": {"preview": True, "e2b": True, "kep": True}}
    token = TOKEN
    audit = True

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        loopback = "tcp:0:interface=127.0.0.1"
        for door in (
            "preview_port",
            "e2b_port",
            "e2b_code_port",
            "kep_rest_port",
            "kep_grpc_port",
        ):
            kwargs.setdefault(door, loopback)
        return super().start(stop_at_end, **kwargs)

    @inlineCallbacks
    def test_every_listener_is_refused(self) -> None:
        """
        Every TCP port the reactor listens on while the daemon runs with
        all its doors (HTTP, PTY, E2B and its code port, KEP REST and
        gRPC, the preview door) is 403 ``port_not_allowed`` by
        ``daemon:own_ports`` and listed as not previewable: exposing the
        KEP port would hand the KEP door to whoever reaches the preview.
        """
        from twisted.internet import tcp

        context = self.daemon.context
        for door in (context.e2b, context.kep, context.preview):
            yield door.listening()
        own = sorted(
            r.getHost().port for r in reactor.getReaders() if isinstance(r, tcp.Port)
        )
        self.assertGreaterEqual(len(own), 7, own)
        listed = yield self.request("GET", "/preview/ports")
        previewable = {p["port"]: p["previewable"] for p in listed.json()["ports"]}
        for port in own:
            refused = yield self.request("POST", "/preview/ports", {"port": port})
            self.assertEqual(
                (refused.status, refused.json().get("rule")),
                (403, "daemon:own_ports"),
                port,
            )
            self.assertFalse(previewable.get(port, False), port)

    def test_every_listen_goes_through_own_endpoint(self) -> None:
        """
        Nothing in the package listens but through
        :class:`~sandboxd.daemon.listener.OwnEndpoint`, so that a door added
        later joins the ports never previewed without anyone listing it.
        """
        import sandboxd

        root = os.path.dirname(sandboxd.__file__)
        found = []
        for folder, _, names in os.walk(root):
            for name in names:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                if path == os.path.join(root, "daemon", "listener.py"):
                    continue
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                for call in ("serverFromString(", "listenTCP(", "listenSSL("):
                    if call in text:
                        found.append(f"{os.path.relpath(path, root)}: {call}")
        self.assertEqual(found, [])
