"""
The cases of the hostile-input and fault catalogue (security note §3) that
no other module covers, each against a real daemon on a loopback port.

Every test's docstring names the catalogue item it pins down (``A1``,
``C10``...).  Cases already tested elsewhere are not repeated here.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import socket
import tarfile
import zipfile
from typing import Any
from urllib.parse import quote

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SkipTest
from twisted.web.resource import Resource
from twisted.web.server import Site
from twisted.web.static import Data

from sandboxd.access import guard as guard_module
from sandboxd.processes.tree import descendants
from tests.browser.test_browser import SKIP_REASON, browser_start_room
from tests.helpers import (
    DaemonTestCase,
    alive,
    kill_marked,
    listening_inodes,
    marked_pids,
    socket_inodes,
    tcp_rows,
)
from tests.routes.test_terminal import TerminalCase
from tests.security.test_files import OutsideCase, tar_of, zip_of
from tests.terminals.wsclient import connect

TOKEN = "catalogue-token"


def bare_zip(*members: tuple[str, bytes]) -> str:
    """A zip (base64) whose members carry no mode at all (``ZipInfo(name)``)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members:
            z.writestr(zipfile.ZipInfo(name), data)
    return base64.b64encode(buf.getvalue()).decode()


def sleep(seconds: float) -> Deferred[None]:
    """Let the reactor run (to wait for something outside it)."""
    return deferLater(reactor, seconds, lambda: None)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class RawCase(DaemonTestCase):
    """A daemon plus a client that writes raw bytes on a blocking socket in a thread."""

    def raw_blocking(self, data: bytes, wait: float = 3.0) -> bytes:
        sock = socket.create_connection(("127.0.0.1", self.daemon.port))
        sock.settimeout(wait)
        received = b""
        try:
            sock.sendall(data)
            while True:
                try:
                    chunk = sock.recv(65536)
                except (TimeoutError, ConnectionResetError):
                    break
                if not chunk:
                    break
                received += chunk
        finally:
            sock.close()
        return received

    def raw(self, data: bytes, **kwargs: Any) -> Deferred[bytes]:
        """Send ``data`` on a fresh connection; everything received until close (or a quiet 3 s)."""

        return deferToThread(self.raw_blocking, data, **kwargs)

    @staticmethod
    def statuses(received: bytes) -> list[int]:
        """The status codes of every response in ``received``, in order."""
        return [int(m) for m in re.findall(rb"HTTP/1\.[01] (\d{3}) ", received)]

    @inlineCallbacks
    def assert_healthy(self) -> Any:
        """The daemon still answers /health."""
        reply = yield self.request("GET", "/health")
        self.assertEqual(reply.status, 200)


class HttpFramingTests(RawCase):
    """Catalogue A: HTTP framing and the parser."""

    @inlineCallbacks
    def test_content_length_with_transfer_encoding(self) -> Any:
        """A1: CL and TE together (either order) are 400 and a smuggled request in the body never runs."""
        smuggled = (
            b"POST /files/mkdir HTTP/1.1\r\nHost: localhost\r\nContent-Length: 20\r\n\r\n"
            b'{"path": "smuggled"}'
        )
        chunk = b"0\r\n\r\n" + smuggled
        for first, second in (
            (b"Content-Length: %d" % len(chunk), b"Transfer-Encoding: chunked"),
            (b"Transfer-Encoding: chunked", b"Content-Length: %d" % len(chunk)),
        ):
            received = yield self.raw(
                b"POST /capabilities/check HTTP/1.1\r\nHost: localhost\r\n"
                + first
                + b"\r\n"
                + second
                + b"\r\n\r\n"
                + chunk
            )
            self.assertEqual(self.statuses(received), [400], received[:200])
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "smuggled")))
        yield self.assert_healthy()

    @inlineCallbacks
    def test_transfer_encoding_spellings(self) -> Any:
        """A2: every spelling of Transfer-Encoding is 400 and no body byte reaches the disk."""
        for index, te in enumerate(
            (
                b"Transfer-Encoding: chunked ",
                b"Transfer-Encoding: \tchunked",
                b"Transfer-Encoding: CHUNKED",
                b"Transfer-Encoding: identity",
                b"Transfer-Encoding: gzip, chunked",
                b"transfer-encoding: chunked",
                b"Transfer-Encoding: x\r\n chunked",
            )
        ):
            for version in (b"HTTP/1.1", b"HTTP/1.0"):
                name = f"te-{index}-{version[-1:].decode()}"
                received = yield self.raw(
                    b"POST /files/raw?path="
                    + name.encode()
                    + b" "
                    + version
                    + b"\r\nHost: localhost\r\nConnection: close\r\n"
                    + te
                    + b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                )
                self.assertEqual(self.statuses(received), [400], (te, version))
                self.assertIn(b'"code"', received, (te, version))
        self.assertEqual(sorted(os.listdir(self.base_dir)), [])
        yield self.assert_healthy()

    @inlineCallbacks
    def test_ambiguous_content_length(self) -> Any:
        """A3: duplicated, listed, signed, hex, underscored, non-ASCII or junk Content-Length is 400."""
        for cl in (
            b"Content-Length: 3\r\nContent-Length: 3",
            b"Content-Length: 3\r\nContent-Length: 4",
            b"Content-Length: 3, 3",
            b"Content-Length: +3",
            b"Content-Length: -3",
            b"Content-Length: 0x3",
            b"Content-Length: 1_0",
            "Content-Length: \u0663".encode(),
            b"Content-Length: 3x",
            b"Content-Length: 3 3",
        ):
            received = yield self.raw(
                b"POST /files/raw?path=cl HTTP/1.1\r\nHost: localhost\r\n"
                b"Connection: close\r\n" + cl + b"\r\n\r\nabc"
            )
            self.assertEqual(self.statuses(received), [400], cl)
            self.assertIn(b'"code":', received, cl)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "cl")))
        yield self.assert_healthy()

    @inlineCallbacks
    def test_absurd_content_length_without_expect(self) -> Any:
        """A4: Content-Length 10^23 without Expect is 413 at once and creates no file, temporary or not."""
        received = yield self.raw(
            b"POST /files/raw?path=huge HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Length: 100000000000000000000000\r\n\r\nabc"
        )
        self.assertEqual(self.statuses(received), [413], received[:200])
        self.assertIn(b"payload_too_large", received)
        self.assertEqual(os.listdir(self.base_dir), [])

    @inlineCallbacks
    def test_bare_lf_and_nul_in_header_values(self) -> Any:
        """A6: a bare CR or a NUL inside a header value is 400; a bare LF cannot inject a Content-Length."""
        for header in (
            b"Foo: x\rContent-Length: 44",
            b"Foo: x\x00y",
            b"X-Access-Token: a\x00b",
        ):
            received = yield self.raw(
                b"GET /capabilities HTTP/1.1\r\nHost: localhost\r\n"
                + header
                + b"\r\nConnection: close\r\n\r\n"
            )
            self.assertEqual(self.statuses(received), [400], header)
            self.assertIn(b'"code":', received, header)
        yield self.assert_healthy()

    @inlineCallbacks
    def test_obs_fold(self) -> Any:
        """A7: an obs-folded header (auth, Host, Content-Length or another) is 400."""
        for folded in (
            b"X-Access-Token: a\r\n b",
            b"Host: localhost\r\n evil.example",
            b"Content-Length: 1\r\n 0",
            b"X-Other: a\r\n\tb",
        ):
            host = b"" if folded.startswith(b"Host") else b"Host: localhost\r\n"
            received = yield self.raw(
                b"GET /capabilities HTTP/1.1\r\n"
                + host
                + folded
                + b"\r\nConnection: close\r\n\r\n"
            )
            self.assertEqual(self.statuses(received), [400], folded)
            self.assertIn(b'"code":"malformed_request"', received, folded)

    @inlineCallbacks
    def test_pipelined_slow_then_fast(self) -> Any:
        """A8: a slow request and a fast one in one packet are answered in order, bodies not mixed."""
        body = b'{"command": "sleep 0.3; echo slow", "shell": "sh"}'
        received = yield self.raw(
            b"POST /shell HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n"
            % len(body)
            + body
            + b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        self.assertEqual(self.statuses(received), [200, 200])
        self.assertLess(received.index(b"slow"), received.index(b'{"status":"ok"}'))

    @inlineCallbacks
    def test_other_request_target_forms(self) -> Any:
        """A10: ``OPTIONS *`` and ``CONNECT host:port`` are refused with a JSON code and never routed."""
        for line in (
            b"OPTIONS * HTTP/1.1",
            b"CONNECT localhost:22 HTTP/1.1",
            b"CONNECT 127.0.0.1:80 HTTP/1.1",
        ):
            received = yield self.raw(
                line + b"\r\nHost: localhost\r\nConnection: close\r\n\r\n"
            )
            status = self.statuses(received)
            self.assertEqual(len(status), 1, line)
            self.assertIn(status[0], (400, 405, 501), line)
            self.assertIn(b'"code"', received, line)
        yield self.assert_healthy()

    @inlineCallbacks
    def test_method_case_and_unknown_methods(self) -> Any:
        """A11: ``get``, ``Get``, ``GETS`` and ``PROPFIND`` are never served as GET."""
        for method in (b"get", b"Get", b"GETS", b"PROPFIND", b"post"):
            received = yield self.raw(
                method
                + b" /capabilities HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
            )
            status = self.statuses(received)
            self.assertEqual(len(status), 1, method)
            self.assertIn(status[0], (400, 404, 405, 501), method)
            self.assertIn(b'"code"', received, method)

    @inlineCallbacks
    def test_oversized_header_block_and_target(self) -> Any:
        """A12: 600 headers, one 20 KiB header or a 20 KiB target are refused (or cut), and the daemon keeps serving."""
        many = b"".join(b"X-H%d: v\r\n" % i for i in range(600))
        for request in (
            b"GET /capabilities HTTP/1.1\r\nHost: localhost\r\n" + many + b"\r\n",
            b"GET /capabilities HTTP/1.1\r\nHost: localhost\r\nX-Big: "
            + b"a" * 20480
            + b"\r\n\r\n",
            b"GET /capabilities?q="
            + b"a" * 20480
            + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
        ):
            received = yield self.raw(request)
            status = self.statuses(received)
            self.assertNotIn(200, status, request[:40])
            if status:
                self.assertIn(status[0], (400, 413, 414, 431), request[:40])
        yield self.assert_healthy()


class PipelinedAuthTests(RawCase):
    """Catalogue A5, with a token."""

    token = TOKEN

    @inlineCallbacks
    def test_pipelined_request_authenticated_on_its_own(self) -> Any:
        """A5: bytes past a request's Content-Length are a new request that must bring its own token."""
        body = b'{"path": "first"}'
        received = yield self.raw(
            b"POST /files/mkdir HTTP/1.1\r\nHost: localhost\r\nX-Access-Token: "
            + TOKEN.encode()
            + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body
            + b"POST /files/mkdir HTTP/1.1\r\nHost: localhost\r\nContent-Length: 18\r\n"
            b'Connection: close\r\n\r\n{"path": "second"}'
        )
        self.assertEqual(self.statuses(received), [200, 401])
        self.assertTrue(os.path.isdir(os.path.join(self.base_dir, "first")))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "second")))


class AuthenticationTests(RawCase):
    """Catalogue B: authentication, identity, policy and rate limits."""

    token = TOKEN
    policy = {"endpoints": {"system_info": {"limits": {"rate_per_minute": 3}}}}

    def request_line(self, headers: bytes, target: bytes = b"/capabilities") -> bytes:
        return (
            b"GET "
            + target
            + b" HTTP/1.1\r\nHost: localhost\r\n"
            + headers
            + b"Connection: close\r\n\r\n"
        )

    @inlineCallbacks
    def test_two_token_headers(self) -> Any:
        """B1: two different X-Access-Token headers (any name case) are 400; two identical ones are accepted."""
        for headers in (
            b"X-Access-Token: " + TOKEN.encode() + b"\r\nX-Access-Token: other\r\n",
            b"x-access-token: other\r\nX-ACCESS-TOKEN: " + TOKEN.encode() + b"\r\n",
        ):
            received = yield self.raw(self.request_line(headers))
            self.assertEqual(self.statuses(received), [400], headers)
            self.assertIn(b"ambiguous_credentials", received)
        same = b"X-Access-Token: " + TOKEN.encode() + b"\r\n"
        received = yield self.raw(self.request_line(same + same))
        self.assertEqual(self.statuses(received), [200])

    @inlineCallbacks
    def test_undocumented_credential_forms(self) -> Any:
        """B2: lists, empty tokens, a bare Bearer, Basic and a token in the query are a plain 401."""
        for headers, target in (
            (b"X-Access-Token: " + TOKEN.encode() + b", other\r\n", b"/capabilities"),
            (b"X-Access-Token: \r\n", b"/capabilities"),
            (b"Authorization: Bearer\r\n", b"/capabilities"),
            (b"Authorization: Bearer \r\n", b"/capabilities"),
            (
                b"Authorization: Basic "
                + base64.b64encode(b"user:" + TOKEN.encode())
                + b"\r\n",
                b"/capabilities",
            ),
            (b"", b"/capabilities?token=" + TOKEN.encode()),
            (b"", b"/capabilities?access_token=" + TOKEN.encode()),
        ):
            received = yield self.raw(self.request_line(headers, target))
            self.assertEqual(self.statuses(received), [401], (headers, target))
            self.assertIn(b'"code":"unauthorized"', received)

    @inlineCallbacks
    def test_obs_text_token(self) -> Any:
        """B3: a token header with raw obs-text bytes (\\xff, Latin-1 é) is 401, never 500."""
        for value in (b"\xff\xfe", b"caf\xe9", TOKEN.encode() + b"\xff"):
            received = yield self.raw(
                self.request_line(b"X-Access-Token: " + value + b"\r\n")
            )
            self.assertEqual(self.statuses(received), [401], value)

    @inlineCallbacks
    def test_one_rate_bucket_whatever_the_spelling(self) -> Any:
        """B8: header, Bearer, lower-case bearer and X-Forwarded-For all draw on one rate bucket."""
        spellings = [
            b"X-Access-Token: " + TOKEN.encode() + b"\r\n",
            b"Authorization: Bearer " + TOKEN.encode() + b"\r\n",
            b"authorization: bearer " + TOKEN.encode() + b"\r\n",
            b"X-Access-Token: "
            + TOKEN.encode()
            + b"\r\nX-Forwarded-For: 203.0.113.9\r\n",
        ]
        seen = []
        for headers in spellings:
            received = yield self.raw(self.request_line(headers, b"/system/info"))
            seen.extend(self.statuses(received))
        self.assertEqual(seen, [200, 200, 200, 429])
        received = yield self.raw(self.request_line(spellings[0], b"//system/info/"))
        self.assertEqual(self.statuses(received), [429])

    @inlineCallbacks
    def test_route_aliases_never_bypass_a_disabled_endpoint(self) -> Any:
        """B6: case, encoded letters, parameters, encoded blanks and NUL never reach a switched-off route."""
        yield self.daemon.stop()
        yield self.start(
            stop_at_end=False,
            policy={"endpoints": {"files_list": {"enabled": False}}},
        )
        for target in (
            "/files/list",
            "/%66iles/list",
            "/files/%6cist",
            "/FILES/list",
            "/files/LIST",
            "/files/list;x=1",
            "/files;x=1/list",
            "/files/list%20",
            "/files/list%09",
            "/files/list%00",
            "/files/list/.",
        ):
            reply = yield self.request("GET", target)
            self.assertIn(reply.status, (400, 404), target)
            self.assertIn(
                reply.json().get("code"),
                ("endpoint_disabled", "not_found", "invalid_path"),
                target,
            )

    @inlineCallbacks
    def test_huge_json_numbers(self) -> Any:
        """B11: a 5000-digit number, or one that overflows to infinity (1e999), is 400 invalid_json, never a 500."""
        for route, raw in (
            (
                "/capabilities/check",
                b'{"endpoint": "health", "n": ' + b"9" * 5000 + b"}",
            ),
            ("/capabilities/check", b'{"endpoint": "health", "n": 1e999}'),
            ("/files/search", b'{"pattern": "*", "max_results": 1e999}'),
            ("/files/search", b'{"pattern": "*", "max_results": -1e999}'),
        ):
            reply = yield self.request("POST", route, raw_body=raw)
            self.assertEqual(reply.status, 400, raw[:60])
            self.assertEqual(reply.json()["code"], "invalid_json")


class PathGuardTests(OutsideCase):
    """Catalogue C: the path guard, seen through the file routes."""

    @inlineCallbacks
    def test_traversal_corpus_on_every_read_route(self) -> Any:
        """C1: double-encoded, overlong-UTF-8, backslash and NUL-split traversal never reads outside, on any read route."""
        corpus = (
            "%252e%252e%252f" * 8 + "etc/passwd",
            "%c0%ae%c0%ae/" * 8 + "etc/passwd",
            "..%5c" * 8 + "etc%5cpasswd",
            "/./././etc/passwd",
            "....//....//....//etc/passwd",
            "~root/.profile",
            "///etc/passwd",
            ".." + "/.." * 20 + quote(self.outside) + "/secret",
        )
        for route in (
            "/download",
            "/files/raw",
            "/files/stat",
            "/files/download-stream",
        ):
            for raw in corpus:
                reply = yield self.request("GET", f"{route}?path={raw}")
                self.assertNotIn(b"OUTSIDE", reply.body, (route, raw))
                self.assertNotIn(b"root:", reply.body, (route, raw))
                if reply.status != 200:
                    self.assertIn("code", reply.json(), (route, raw))
                else:
                    self.assertEqual(route, "/files/stat", raw)
                    self.assertFalse(reply.json()["exists"], raw)

    @inlineCallbacks
    def test_stat_and_list_are_deny_uniform(self) -> Any:
        """C1: stat, list, delete and move refuse an existing outside target exactly as a missing one."""
        for method, route, body in (
            ("GET", "/files/stat?path={}", None),
            ("GET", "/files/list?path={}", None),
            ("DELETE", "/files?path={}", None),
            ("POST", "/files/move", {"source": "{}", "destination": "x"}),
            ("POST", "/files/mkdir", {"path": "{}/d"}),
        ):
            replies = []
            for target in ("/etc/passwd", "/etc/nope-" + os.urandom(4).hex()):
                if body is None:
                    path = route.format(quote(target, safe=""))
                    reply = yield self.request(method, path)
                else:
                    filled = {k: v.format(target) for k, v in body.items()}
                    reply = yield self.request(method, route, filled)
                replies.append(reply)
            a, b = (r.json() for r in replies)
            self.assertEqual(replies[0].status, 403, route)
            self.assertEqual(
                (replies[0].status, a["code"], a.get("rule")),
                (replies[1].status, b["code"], b.get("rule")),
                route,
            )
            self.assertNotIn("passwd", a["error"].replace("/etc/passwd", ""), route)
        self.assertTrue(os.path.exists("/etc/passwd"))

    @inlineCallbacks
    def test_long_link_chains_and_links_into_proc(self) -> Any:
        """C3: a chain of 45 links is refused with a code (never a 500); links to /proc/self/root and /proc/1/cwd are refused."""
        for i in range(45):
            os.symlink(f"l{i + 1}", os.path.join(self.base_dir, f"l{i}"))
        self.put("l45")
        os.symlink("/proc/self/root", os.path.join(self.base_dir, "pr"))
        os.symlink("/proc/1/cwd", os.path.join(self.base_dir, "pc"))
        os.symlink("/proc/self/fd/0", os.path.join(self.base_dir, "pf"))
        for path in ("l0", "pr/etc/passwd", "pc", "pf"):
            for route in ("/download", "/files/raw"):
                reply = yield self.request(
                    "GET", f"{route}?path={quote(path, safe='')}"
                )
                self.assertIn(reply.status, (400, 403, 404), (route, path))
                self.assertIn("code", reply.json(), (route, path))
            reply = yield self.request(
                "POST", "/upload", {"path": path + "/x", "content_base64": b64(b"x")}
            )
            self.assertIn(reply.status, (400, 403), path)

    @inlineCallbacks
    def test_non_utf8_and_control_character_names(self) -> Any:
        """C10: names that are not UTF-8 or hold newlines and escapes are listed, stat-ed, searched and archived without a 500."""
        base = os.fsencode(self.base_dir)
        for name in (
            b"\xff\xfe.txt",
            b"line\nbreak",
            b"esc\x1b[31mred",
            b"-rf",
            b"cr\r.txt",
        ):
            with open(os.path.join(base, name), "wb") as f:
                f.write(b"x")
        reply = yield self.request("GET", "/files/list")
        self.assertEqual(reply.status, 200, reply.body[:200])
        names = {e["name"] for e in reply.json()["entries"]}
        self.assertEqual(len(names), 5)
        self.assertIn("line\nbreak", names)
        reply = yield self.request("POST", "/files/search", {"pattern": "*"})
        self.assertEqual(reply.status, 200, reply.body[:200])
        self.assertEqual(len(reply.json()["results"]), 5)
        reply = yield self.request(
            "POST", "/files/archive", {"paths": ["."], "format": "tar.gz"}
        )
        self.assertIn(reply.status, (200, 400), reply.body[:200])
        for entry in names:
            reply = yield self.request(
                "GET",
                "/files/stat?path=" + quote(entry, safe="", errors="surrogateescape"),
            )
            self.assertIn(reply.status, (200, 400), (entry, reply.body[:200]))

    @inlineCallbacks
    def test_delete_and_move_edge_cases(self) -> Any:
        """C14: deleting "", "." or "./" never touches the base; a directory cannot move into itself."""
        self.put("keep.txt")
        self.put("d/sub/f.txt")
        for path in ("", ".", "./", "d/..", "/"):
            reply = yield self.request("DELETE", "/files?path=" + quote(path, safe=""))
            self.assertIn(reply.status, (400, 403), path)
            self.assertIn("code", reply.json(), path)
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "keep.txt")))
        reply = yield self.request(
            "POST", "/files/move", {"source": "d", "destination": "d/sub/d2"}
        )
        self.assertIn(reply.status, (400, 403, 409), reply.body)
        self.assertIn("code", reply.json())
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "d/sub/f.txt")))
        reply = yield self.request(
            "POST", "/files/move", {"source": ".", "destination": "elsewhere"}
        )
        self.assertIn(reply.status, (400, 403), reply.body)
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "keep.txt")))

    @inlineCallbacks
    def test_search_stays_inside(self) -> Any:
        """C15: a search rooted at '..', at /etc, or through a link out finds nothing outside."""
        os.symlink(self.outside, os.path.join(self.base_dir, "out"))
        for body in (
            {"path": "..", "pattern": "*"},
            {"path": "/etc", "pattern": "passwd"},
            {"path": "out", "pattern": "*"},
            {"pattern": "../*"},
            {"pattern": "/etc/*"},
            {"pattern": "**/secret"},
        ):
            reply = yield self.request("POST", "/files/search", body)
            if reply.status == 200:
                for result in reply.json()["results"]:
                    self.assertTrue(
                        result["path"].startswith(self.base_dir + "/"), (body, result)
                    )
                    self.assertNotEqual(result["name"], "secret", body)
            else:
                self.assertIn(reply.status, (400, 403, 404), body)
                self.assertIn("code", reply.json(), body)


class ReadOnlyCatalogueTests(DaemonTestCase):
    """Catalogue C8 under the read-only preset, beyond upload, mkdir and delete."""

    preset = "read-only"

    @inlineCallbacks
    def test_every_write_path_refused(self) -> Any:
        """C8: move, raw write, stream upload, extract, exec and terminals are refused and the disk is unchanged."""
        path = os.path.join(self.base_dir, "r.txt")
        with open(path, "wb") as f:
            f.write(b"keep")
        for method, route, body, raw in (
            ("POST", "/files/move", {"source": "r.txt", "destination": "m.txt"}, None),
            ("POST", "/files/raw?path=r.txt&overwrite=true", None, b"changed"),
            ("POST", "/files/raw?path=n.txt", None, b"new"),
            (
                "POST",
                "/files/upload-stream",
                {"path": "r.txt", "content_base64": b64(b"changed")},
                None,
            ),
            (
                "POST",
                "/files/extract",
                {
                    "content_base64": zip_of(("new.txt", b"x")),
                    "format": "zip",
                    "destination": ".",
                },
                None,
            ),
            ("POST", "/shell", {"command": "touch made-by-shell"}, None),
            ("POST", "/process/start", {"command": "touch made-by-process"}, None),
            ("POST", "/pty/sessions", {}, None),
            ("POST", "/env", {"FOO": "bar"}, None),
        ):
            reply = yield self.request(method, route, body, raw_body=raw)
            self.assertIn(reply.status, (403, 404), (route, reply.body))
            self.assertIn("code", reply.json(), route)
        yield sleep(0.2)
        self.assertEqual(os.listdir(self.base_dir), ["r.txt"])
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"keep")


class ArchiveCatalogueTests(DaemonTestCase):
    """Catalogue D: archive names and contents not covered elsewhere."""

    @inlineCallbacks
    def extract(self, members: list[tuple[str, bytes]]) -> Any:
        reply = yield self.request(
            "POST",
            "/files/extract",
            {
                "content_base64": bare_zip(*members),
                "format": "zip",
                "destination": "dst",
            },
        )
        return reply

    @inlineCallbacks
    def test_hostile_member_names(self) -> Any:
        """D1: over-long, duplicated and file-then-directory member names are refused with a code, nothing written; a NUL never reaches a name on disk."""
        # zipfile cuts a member name at its first NUL, on writing and on
        # reading alike: the daemon sees "a", which lands inside dst.
        reply = yield self.extract([("good", b"g"), ("a\x00b", b"x")])
        dst = os.path.join(self.base_dir, "dst")
        if reply.status == 200:
            self.assertEqual(sorted(os.listdir(dst)), ["a", "good"])
            shutil.rmtree(dst)
        else:
            self.assertIn("code", reply.json())
        for members in (
            [("good", b"g"), ("n" * 5000, b"x")],
            [("good", b"g"), ("dup", b"1"), ("dup", b"2")],
            [("good", b"g"), ("x", b"file"), ("x/y", b"under a file")],
        ):
            reply = yield self.extract(members)
            self.assertIn(reply.status, (400, 403, 409, 413), reply.body)
            self.assertIn("code", reply.json())
            dst = os.path.join(self.base_dir, "dst")
            self.assertEqual(os.listdir(dst) if os.path.isdir(dst) else [], [])

    @inlineCallbacks
    def test_archive_of_links_out_and_fifo(self) -> Any:
        """D5: archiving a tree with a link out and a FIFO stores the link as a link, skips the FIFO and never reads outside."""
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        with open(os.path.join(outside, "secret"), "wb") as f:
            f.write(b"OUTSIDE-CONTENT")
        tree = os.path.join(self.base_dir, "t")
        os.makedirs(tree)
        with open(os.path.join(tree, "f.txt"), "wb") as f:
            f.write(b"in")
        os.symlink(os.path.join(outside, "secret"), os.path.join(tree, "out"))
        os.symlink(outside, os.path.join(tree, "outdir"))
        os.mkfifo(os.path.join(tree, "fifo"))
        for fmt in ("tar.gz", "zip"):
            reply = yield self.request(
                "POST", "/files/archive", {"paths": ["t"], "format": fmt}
            )
            self.assertEqual(reply.status, 200, reply.body[:300])
            data = base64.b64decode(reply.json()["content_base64"])
            if fmt == "zip":
                with zipfile.ZipFile(io.BytesIO(data)) as z:
                    names = z.namelist()
                    content = b"".join(z.read(n) for n in names if not n.endswith("/"))
            else:
                with tarfile.open(fileobj=io.BytesIO(data)) as t:
                    names = t.getnames()
                    content = b"".join(
                        t.extractfile(m).read()  # type: ignore[union-attr]
                        for m in t.getmembers()
                        if m.isfile()
                    )
            self.assertNotIn(b"OUTSIDE-CONTENT", content, fmt)
            self.assertNotIn("t/fifo", names, fmt)
            self.assertNotIn("t/outdir/secret", names, fmt)
            self.assertIn("t/f.txt", names, fmt)

    @inlineCallbacks
    def test_zip_member_with_permission_bits_only(self) -> Any:
        """D1 (found with C9): a zip member whose mode holds permission bits but no file type (what Python's ``ZipFile.writestr(name, data)`` writes) is a regular file, not a refused "special file"."""
        reply = yield self.request(
            "POST",
            "/files/extract",
            {
                "content_base64": zip_of(("plain.txt", b"plain")),
                "format": "zip",
                "destination": "dst",
            },
        )
        self.assertEqual(reply.status, 200, reply.body)
        with open(os.path.join(self.base_dir, "dst", "plain.txt"), "rb") as f:
            self.assertEqual(f.read(), b"plain")

    @inlineCallbacks
    def test_tar_hard_links_refused_before_writing(self) -> Any:
        """D3: a tar with a hard link to a symlink member, or a hard link out of the destination (absolute, '..' or to /etc/passwd), is 403 with a code before anything is written."""

        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)

        first = ("first.txt", "file", b"first")
        cases = (
            [first, ("sym", "sym", "first.txt"), ("hard-to-sym", "hard", "sym")],
            [
                first,
                ("sym-out", "sym", "first.txt"),
                ("hard", "hard", "sym-out"),
                ("hard", "file", b"through the link"),
            ],
            [first, ("passwd", "hard", "/etc/passwd")],
            [first, ("up", "hard", "../../" + os.path.basename(outside))],
            [first, ("secret", "hard", os.path.join(outside, "secret"))],
        )
        with open(os.path.join(outside, "secret"), "wb") as f:
            f.write(b"OUTSIDE")
        for index, members in enumerate(cases):
            reply = yield self.request(
                "POST",
                "/files/extract",
                {
                    "content_base64": tar_of(*members),
                    "format": "tar.gz",
                    "destination": "dst",
                },
            )
            self.assertEqual(reply.status, 403, (index, reply.body))
            self.assertIn("code", reply.json(), index)
            self.assertEqual(os.listdir(self.base_dir), [], index)
        self.assertEqual(os.listdir(outside), ["secret"])
        with open(os.path.join(outside, "secret"), "rb") as f:
            self.assertEqual(f.read(), b"OUTSIDE")
        self.assertEqual(os.stat("/etc/passwd").st_nlink, 1)


class ProcessCatalogueTests(DaemonTestCase):
    """Catalogue E: signals, cwd, env and an aborted synchronous exec."""

    audit = True
    policy = {"defaults": {"audit": "all"}}

    def setUp(self) -> Any:
        # A sleep length no other process uses: it marks this test's children.
        self.marker = f"61.{int.from_bytes(os.urandom(5), 'big'):013d}"

        self.addCleanup(kill_marked, self.marker)
        return super().setUp()

    @inlineCallbacks
    def test_signal_targets_and_values(self) -> Any:
        """E8: odd pids and signal spellings are 400/403/404 with a code, and the managed child survives them."""

        reply = yield self.request(
            "POST", "/process/start", {"command": f"sleep {self.marker}"}
        )
        pid = reply.json()["pid"]
        for target in ("0", "-1", f"-{pid}", str(os.getppid()), "4294967297"):
            reply = yield self.request(
                "POST", f"/process/{target}/signal", {"signal": 15}
            )
            self.assertIn(reply.status, (400, 403, 404), target)
            self.assertIn("code", reply.json(), target)
        for sig in (0, "SIGRTMIN+3", "nope", 65, -9, 1.5, True, None, [9]):
            reply = yield self.request(
                "POST", f"/process/{pid}/signal", {"signal": sig}
            )
            self.assertEqual(reply.status, 400, sig)
            self.assertIn("code", reply.json(), sig)
        self.assertTrue(alive(pid))

    @inlineCallbacks
    def test_signal_after_exit_is_not_sent(self) -> Any:
        """E8: a managed process that has exited cannot be signalled (its pid may be reused)."""
        reply = yield self.request("POST", "/process/start", {"command": "true"})
        pid = reply.json()["pid"]
        for _ in range(100):
            got = yield self.request("GET", f"/process/{pid}")
            if got.json()["state"] == "exited":
                break
            yield sleep(0.05)
        reply = yield self.request("POST", f"/process/{pid}/signal", {"signal": 9})
        self.assertIn(reply.status, (404, 409), reply.body)
        self.assertIn("code", reply.json())

    @inlineCallbacks
    def test_hostile_cwd(self) -> Any:
        """E9: a cwd through /proc, a link out, a file or a missing dir is refused with a code before anything runs."""
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        os.symlink(outside, os.path.join(self.base_dir, "out"))
        with open(os.path.join(self.base_dir, "file"), "wb") as f:
            f.write(b"x")
        for cwd in (
            "/proc/self/fd/3",
            "/proc/1/cwd",
            "/proc/self/cwd",
            "out",
            "file",
            "missing",
        ):
            reply = yield self.request(
                "POST", "/shell", {"command": "touch made", "cwd": cwd}
            )
            self.assertIn(reply.status, (400, 403, 404), cwd)
            self.assertIn("code", reply.json(), cwd)
        self.assertEqual(os.listdir(outside), [])
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "made")))

    @inlineCallbacks
    def test_child_sees_only_standard_descriptors(self) -> Any:
        """E9: a child's open descriptors are 0, 1 and 2 only: no listening socket or log of the daemon leaks in."""
        reply = yield self.request(
            "POST",
            "/shell",
            {"command": "ls /proc/$$/fd", "shell": "sh"},
        )
        self.assertEqual(reply.status, 200, reply.body)
        fds = sorted(int(n) for n in reply.json()["stdout"].split())
        self.assertEqual([fd for fd in fds if fd > 2], [])

    @inlineCallbacks
    def test_hostile_env_in_exec(self) -> Any:
        """E10: env names with '=', NUL, blanks or nothing, values with NUL or not strings: 400 with a code, nothing runs."""
        for env in (
            {"A=B": "x"},
            {"": "x"},
            {"A\x00B": "x"},
            {"A": "x\x00y"},
            {"A": ["list"]},
            ["A=B"],
        ):
            reply = yield self.request(
                "POST", "/shell", {"command": "touch made", "env": env}
            )
            self.assertEqual(reply.status, 400, str(env)[:40])
            self.assertIn("code", reply.json())
            reply = yield self.request(
                "POST", "/process/start", {"command": "touch made", "env": env}
            )
            self.assertEqual(reply.status, 400, str(env)[:40])
        yield sleep(0.2)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "made")))
        self.assertNotIn("A", os.environ)

    @inlineCallbacks
    def test_client_gone_mid_exec(self) -> Any:
        """E15: a client that disconnects during a synchronous /shell leaves no child behind."""

        body = f'{{"command": "sleep {self.marker}", "timeout": 60}}'.encode()
        sock = socket.create_connection(("127.0.0.1", self.daemon.port))
        sock.sendall(
            b"POST /shell HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n"
            % len(body)
            + body
        )
        for _ in range(100):
            if marked_pids(self.marker):
                break
            yield sleep(0.05)
        self.assertNotEqual(marked_pids(self.marker), [])
        sock.close()
        for _ in range(100):
            if not marked_pids(self.marker):
                break
            yield sleep(0.05)
        self.assertEqual(marked_pids(self.marker), [])


class AuditCatalogueTests(DaemonTestCase):
    """Catalogue F: what reaches the audit file."""

    token = TOKEN
    audit = True
    policy = {"defaults": {"audit": "all"}}

    def raw_audit(self) -> bytes:
        self.daemon.context.audit.flush()
        with open(self.audit_path, "rb") as f:
            return f.read()

    @inlineCallbacks
    def test_control_characters_stay_in_one_line(self) -> Any:
        """F1: CRLF, ANSI escapes and quotes in a path make one escaped JSON line per request."""
        before = len(self.audit_lines())
        hostile = quote('a\r\nb\x1b[31m"},{"forged": 1}\n', safe="")
        yield self.request("GET", "/files/stat?path=" + hostile)
        yield self.request("GET", "/nope" + hostile)
        lines = self.audit_lines()
        self.assertEqual(len(lines), before + 2)
        self.assertNotIn("forged", lines[-1])
        self.assertNotIn(b"\x1b", self.raw_audit())

    @inlineCallbacks
    def test_tokens_never_written(self) -> Any:
        """F2: the token, whether sent as a header, a Bearer or a query parameter, never reaches the audit file."""
        yield self.request("GET", "/capabilities")
        yield self.request(
            "GET",
            "/capabilities",
            token=None,
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        yield self.request("GET", f"/capabilities?token={TOKEN}", token=None)
        yield self.request("GET", f"/files/stat?path=x&access_token={TOKEN}")
        yield self.request("GET", "/capabilities", token=TOKEN + "-wrong")
        raw = self.raw_audit()
        self.assertGreaterEqual(raw.count(b"\n"), 5)
        self.assertNotIn(TOKEN.encode(), raw)


class BaseDirSwapTests(OutsideCase):
    """Catalogue C13: the base dir renamed or replaced while the daemon runs."""

    def setUp(self) -> Any:
        d = super().setUp()
        self.put("inside.txt", b"INSIDE")
        self.original = self.base_dir + ".original"
        return d

    def swap(self, replacement: str | None) -> None:
        """
        Move the base aside and put ``replacement`` (a link target) or, for
        None, a fresh directory holding a planted file in its place.
        """
        os.rename(self.base_dir, self.original)
        self.addCleanup(self.restore)
        if replacement is None:
            os.mkdir(self.base_dir)
            with open(os.path.join(self.base_dir, "secret"), "wb") as f:
                f.write(b"OUTSIDE")
        else:
            os.symlink(replacement, self.base_dir)

    def restore(self) -> None:
        if not os.path.isdir(self.original):
            return
        if os.path.islink(self.base_dir):
            os.unlink(self.base_dir)
        elif os.path.isdir(self.base_dir):
            shutil.rmtree(self.base_dir)
        os.rename(self.original, self.base_dir)

    @inlineCallbacks
    def assert_confined(self, reads: tuple[str, ...]) -> Any:
        """Every read and write answers a JSON code (or nothing from outside); nothing is written outside."""
        for route in (
            "/download?path=",
            "/files/raw?path=",
            "/files/stat?path=",
            "/files/download-stream?path=",
        ):
            for path in reads:
                reply = yield self.request("GET", route + quote(path, safe=""))
                self.assertNotIn(b"OUTSIDE", reply.body, (route, path))
                self.assertNotIn(b"root:", reply.body, (route, path))
                self.assertNotIn(b"T1VUU0lERQ", reply.body, (route, path))
                self.assertIn(reply.status, (400, 403, 404), (route, path))
                self.assertIn("code", reply.json(), (route, path))
        for route in ("/files/list", "/files/list?path=.", "/files/list?path=etc"):
            reply = yield self.request("GET", route)
            self.assertIn(reply.status, (400, 403, 404), (route, reply.body[:200]))
            self.assertIn("code", reply.json(), route)
        reply = yield self.request("POST", "/files/search", {"pattern": "*"})
        self.assertIn(reply.status, (400, 403, 404), reply.body[:200])
        self.assertIn("code", reply.json())
        for method, route, body in (
            ("POST", "/upload", {"path": "new", "content_base64": b64(b"x")}),
            ("POST", "/files/mkdir", {"path": "newdir"}),
            ("DELETE", "/files?path=secret", None),
            ("POST", "/shell", {"command": "touch made-by-shell"}),
        ):
            reply = yield self.request(method, route, body)
            self.assertIn(reply.status, (400, 403, 404), (route, reply.body))
            self.assertIn("code", reply.json(), route)
        self.assertEqual(sorted(os.listdir(self.outside)), ["secret"])
        reply = yield self.request("GET", "/health")
        self.assertEqual(reply.status, 200)

    @inlineCallbacks
    def test_base_replaced_by_link_out(self) -> Any:
        """C13: a base dir replaced by a link to another directory never serves, lists or writes that directory."""
        self.swap(self.outside)
        yield self.assert_confined(("secret", self.base_dir + "/secret"))

    @inlineCallbacks
    def test_base_replaced_by_link_to_root(self) -> Any:
        """C13: a base dir replaced by a link to / never serves /etc/passwd as base/etc/passwd."""
        self.swap("/")
        yield self.assert_confined(("etc/passwd", "etc/hostname"))
        self.assertTrue(os.path.exists("/etc/passwd"))

    @inlineCallbacks
    def test_base_renamed_and_replaced(self) -> Any:
        """C13: a base dir renamed away and replaced by another directory is refused (the boundary is the directory the daemon started with)."""
        self.swap(None)
        yield self.assert_confined(("secret",))
        self.assertEqual(os.listdir(self.base_dir), ["secret"])
        self.assertEqual(sorted(os.listdir(self.original)), ["inside.txt"])

    @inlineCallbacks
    def test_base_back_in_place_serves_again(self) -> Any:
        """C13: once the original base dir is back, the file routes serve it as before (the refusals were not sticky)."""
        self.swap(self.outside)
        reply = yield self.request("GET", "/download?path=secret")
        self.assertNotEqual(reply.status, 200)
        self.restore()
        reply = yield self.request("GET", "/files/raw?path=inside.txt")
        self.assertEqual((reply.status, reply.body), (200, b"INSIDE"))

    @inlineCallbacks
    def test_parent_swapped_for_a_link(self) -> Any:
        """C13: a component above the base swapped for a link that leads to another directory of the same name is refused; one that leads back to the base itself still serves it."""
        parent = os.path.dirname(self.base_dir)
        name = os.path.basename(self.base_dir)
        aside = parent + ".aside"
        elsewhere = os.path.realpath(self.mktemp())
        os.makedirs(os.path.join(elsewhere, name))
        with open(os.path.join(elsewhere, name, "secret"), "wb") as f:
            f.write(b"OUTSIDE")
        os.rename(parent, aside)
        try:
            os.symlink(elsewhere, parent)
            reply = yield self.request("GET", "/download?path=secret")
            self.assertEqual(reply.status, 403, reply.body)
            self.assertNotIn(b"T1VUU0lERQ", reply.body)
            os.unlink(parent)
            os.symlink(aside, parent)
            reply = yield self.request("GET", "/files/raw?path=inside.txt")
            self.assertEqual((reply.status, reply.body), (200, b"INSIDE"))
        finally:
            if os.path.islink(parent):
                os.unlink(parent)
            os.rename(aside, parent)

    @inlineCallbacks
    def test_base_replaced_by_link_without_openat2(self) -> Any:
        """C13: the component-by-component walk (kernels without openat2) refuses a base swapped for a link to / too."""

        self.patch(guard_module, "USE_OPENAT2", False)
        self.swap("/")
        yield self.assert_confined(("etc/passwd",))


class AllowedRootSwapTests(DaemonTestCase):
    """Catalogue C13 for a ``paths.allow`` root outside the base: pinned like the base."""

    autostart = False

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        self.root = os.path.realpath(self.mktemp())
        os.makedirs(self.root)
        with open(os.path.join(self.root, "data.txt"), "wb") as f:
            f.write(b"ROOTDATA")
        self.outside = os.path.realpath(self.mktemp())
        os.makedirs(self.outside)
        with open(os.path.join(self.outside, "data.txt"), "wb") as f:
            f.write(b"OUTSIDE")
        yield self.start(
            policy={
                "defaults": {
                    "paths": {"allow": [self.base_dir + "/**", self.root + "/**"]}
                }
            }
        )

    @inlineCallbacks
    def test_root_swapped_for_a_link_is_refused(self) -> Any:
        """C13: an allowed root replaced by a link to another directory is refused; put back, it serves again."""
        url = "/files/raw?path=" + quote(self.root + "/data.txt", safe="")
        reply = yield self.request("GET", url)
        self.assertEqual((reply.status, reply.body), (200, b"ROOTDATA"))
        aside = self.root + ".aside"
        os.rename(self.root, aside)
        os.symlink(self.outside, self.root)
        try:
            reply = yield self.request("GET", url)
            self.assertEqual(reply.status, 403, reply.body)
            self.assertEqual(reply.json()["code"], "path_not_allowed")
        finally:
            os.unlink(self.root)
            os.rename(aside, self.root)
        reply = yield self.request("GET", url)
        self.assertEqual((reply.status, reply.body), (200, b"ROOTDATA"))


NFC_NAME = "caf\u00e9.txt"
NFD_NAME = "cafe\u0301.txt"
FULLWIDTH_DOT = "\uff0e"
FULLWIDTH_SLASH = "\uff0f"


class UnicodeNameTests(DaemonTestCase):
    """
    Catalogue C9 with Unicode spellings.  The daemon never normalises a
    name (no NFC, NFD or NFKC folding): the file system is byte-exact, so
    two spellings are two files, each decided by the policy on its own
    bytes.  A deny glob denies the spelling it names, and never lets another
    spelling reach the denied file's bytes.
    """

    policy = {
        "defaults": {"paths": {"deny": [NFC_NAME, "**/.env", "keys/**"]}},
    }

    def write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.base_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return path

    @inlineCallbacks
    def test_fullwidth_dots_and_solidus_do_not_traverse(self) -> Any:
        """C9: U+FF0E and U+FF0F (and U+2024, U+2215) spelling '../' are plain name characters: they never leave the base, and a write lands as one oddly named file inside it."""
        dots = FULLWIDTH_DOT * 2
        for path in (
            (dots + FULLWIDTH_SLASH) * 8 + "etc" + FULLWIDTH_SLASH + "passwd",
            (dots + "/") * 8 + "etc/passwd",
            ("../" + dots + "/") * 4 + "etc/passwd",
            ("\u2024\u2024\u2215") * 8 + "etc\u2215passwd",
            "/etc" + FULLWIDTH_SLASH + "passwd",
        ):
            for route in ("/download", "/files/raw", "/files/download-stream"):
                reply = yield self.request("GET", f"{route}?path={quote(path)}")
                self.assertNotIn(b"root:", reply.body, (route, path))
                self.assertIn(reply.status, (403, 404), (route, path))
                self.assertIn("code", reply.json(), (route, path))
        name = (dots + FULLWIDTH_SLASH) * 3 + "escape"
        reply = yield self.request(
            "POST", "/upload", {"path": name, "content_base64": b64(b"x")}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(os.listdir(self.base_dir), [name])
        self.assertEqual(reply.json()["path"], os.path.join(self.base_dir, name))

    @inlineCallbacks
    def test_nfc_and_nfd_are_two_files(self) -> Any:
        """C9: NFC and NFD spellings of 'café.txt' name two files; each request reads the bytes of its own spelling, never the other's."""
        self.write(NFD_NAME, b"decomposed")
        self.write("d/" + NFC_NAME.upper(), b"upper")
        reply = yield self.request("GET", "/files/raw?path=" + quote(NFD_NAME))
        self.assertEqual((reply.status, reply.body), (200, b"decomposed"))
        reply = yield self.request("GET", "/files/raw?path=" + quote(NFC_NAME))
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "path_denied")
        self.assertEqual(sorted(os.listdir(self.base_dir)), sorted([NFD_NAME, "d"]))

    @inlineCallbacks
    def test_deny_glob_holds_against_other_spellings(self) -> Any:
        """C9: a file denied by its NFC name stays unreadable, unlisted, unsearchable and unmovable through NFD, fullwidth, case or dot-segment spellings; those spellings reach other files or nothing."""
        self.write(NFC_NAME, b"DENIED-NFC")
        self.write(".env", b"DENIED-ENV")
        self.write("keys/id", b"DENIED-KEY")
        self.write(NFD_NAME, b"other-file")
        spellings = (
            NFC_NAME,
            "./" + NFC_NAME,
            "x/../" + NFC_NAME,
            NFD_NAME + "/../" + NFC_NAME,
            ".env",
            "sub/../.env",
            FULLWIDTH_DOT + "env",
            "keys/id",
            "keys//id",
            "./keys/./id",
            "KEYS/id",
            "keys" + FULLWIDTH_SLASH + "id",
            NFD_NAME,
        )
        for path in spellings:
            for route in ("/files/raw", "/download", "/files/stat"):
                reply = yield self.request("GET", f"{route}?path={quote(path)}")
                self.assertNotIn(b"DENIED", reply.body, (route, path))
                self.assertNotIn(b64(b"DENIED").encode()[:6], reply.body, (route, path))
                if reply.status != 200:
                    self.assertIn(reply.status, (400, 403, 404), (route, path))
                    self.assertIn("code", reply.json(), (route, path))
                elif route == "/files/stat":
                    stat_json = reply.json()
                    if stat_json["exists"]:
                        self.assertEqual(stat_json["size"], len(b"other-file"))
        reply = yield self.request("GET", "/files/list?depth=3")
        self.assertEqual(reply.status, 200, reply.body[:200])
        listed = {e["name"] for e in reply.json()["entries"]}
        self.assertNotIn(NFC_NAME, listed)
        self.assertNotIn(".env", listed)
        self.assertNotIn("id", listed)
        self.assertIn(NFD_NAME, listed)
        reply = yield self.request("POST", "/files/search", {"pattern": "*"})
        self.assertEqual(reply.status, 200, reply.body[:200])
        found = {r["name"] for r in reply.json()["results"]}
        self.assertEqual(found & {NFC_NAME, ".env", "id"}, set())
        self.assertIn(NFD_NAME, found)
        # Moving onto a denied spelling, or the denied file away, is refused.
        for source, destination in (
            (NFD_NAME, NFC_NAME),
            (NFC_NAME, "moved.txt"),
            (NFD_NAME, "sub/../.env"),
        ):
            reply = yield self.request(
                "POST",
                "/files/move",
                {"source": source, "destination": destination, "overwrite": True},
            )
            self.assertEqual(reply.status, 403, (source, destination))
            self.assertEqual(reply.json()["code"], "path_denied")
        with open(os.path.join(self.base_dir, NFC_NAME), "rb") as f:
            self.assertEqual(f.read(), b"DENIED-NFC")
        with open(os.path.join(self.base_dir, ".env"), "rb") as f:
            self.assertEqual(f.read(), b"DENIED-ENV")
        with open(os.path.join(self.base_dir, NFD_NAME), "rb") as f:
            self.assertEqual(f.read(), b"other-file")

    @inlineCallbacks
    def test_archive_members_with_denied_spelling(self) -> Any:
        """C9: an archive member named with the denied NFC spelling is refused before anything is written; the NFD spelling of it extracts as its own file."""
        for members, refused in (
            ([("ok.txt", b"ok"), (NFC_NAME, b"planted")], True),
            ([("ok.txt", b"ok"), (NFD_NAME, b"decomposed")], False),
        ):
            reply = yield self.request(
                "POST",
                "/files/extract",
                {
                    "content_base64": bare_zip(*members),
                    "format": "zip",
                    "destination": ".",
                    "overwrite": True,
                },
            )
            if refused:
                self.assertEqual(
                    (reply.status, reply.json()["code"]),
                    (403, "path_denied"),
                    reply.body,
                )
                self.assertEqual(os.listdir(self.base_dir), [])
            else:
                self.assertEqual(reply.status, 200, reply.body)
                self.assertEqual(
                    sorted(os.listdir(self.base_dir)), sorted(["ok.txt", NFD_NAME])
                )


def _exchange(port: int, data: bytes, wait: float = 3.0) -> tuple[bytes, bool]:
    """Send ``data``; what came back, and whether the server closed the connection."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(wait)
    received = b""
    closed = False
    try:
        sock.sendall(data)
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    finally:
        sock.close()
    return received, closed


class TerminalHandshakeTests(TerminalCase):
    """Catalogue E7: handshakes on the PTY port that are not RFC 6455 upgrades."""

    @inlineCallbacks
    def session(self) -> Any:
        created = yield self.create()
        return created["session_id"]

    def send(self, data: bytes) -> Deferred[tuple[bytes, bool]]:
        return deferToThread(_exchange, self.pty_port, data)

    def assert_refused(self, received: bytes, closed: bool, what: Any) -> Any:
        """A 4xx status line, a JSON body with a code, and the connection closed."""
        head, _, body = received.partition(b"\r\n\r\n")
        match = re.match(rb"HTTP/1\.1 (\d{3}) ", head)
        self.assertIsNotNone(match, (what, received[:200]))
        assert match is not None
        status = int(match.group(1))
        self.assertTrue(400 <= status < 500, (what, received[:200]))
        self.assertTrue(closed, what)
        self.assertNotIn(b"Autobahn", received, what)
        self.assertNotIn(b"\r\nlocation:", head.lower(), what)

        self.assertIn("code", json.loads(body), what)
        return status

    @inlineCallbacks
    def assert_no_client_and_still_serving(self, session_id: str) -> Any:
        """The session has no client attached, and a proper client still attaches."""

        reply = yield self.request("GET", f"/pty/sessions/{session_id}")
        self.assertEqual(reply.json()["clients"], 0)
        client = yield connect(self.pty_port, session_id)
        try:
            started = yield client.wait_for(lambda m: m.get("event") == "started")
            self.assertEqual(started["session_id"], session_id)
        finally:
            client.transport.loseConnection()
            yield client.closed

    @inlineCallbacks
    def test_bad_websocket_versions(self) -> Any:
        """E7: Sec-WebSocket-Version 8 (hybi draft), 12, 99, a list, junk, empty or missing is refused with a 4xx and a JSON code, the connection closed, no session attached."""
        session_id = yield self.session()
        for version in (b"8", b"12", b"99", b"0", b"13, 8", b"abc", b"", None):
            request = (
                b"GET /pty?session_id=" + session_id.encode() + b" HTTP/1.1\r\n"
                b"Host: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            )
            if version is not None:
                request += b"Sec-WebSocket-Version: " + version + b"\r\n"
            received, closed = yield self.send(request + b"\r\n")
            self.assertNotIn(b" 101 ", received[:20], version)
            self.assert_refused(received, closed, version)
        yield self.assert_no_client_and_still_serving(session_id)

    @inlineCallbacks
    def test_draft_origin_header_not_a_way_around(self) -> Any:
        """E7: a hybi-8 handshake carrying its Origin as Sec-WebSocket-Origin (which the Origin check does not read) is refused."""
        session_id = yield self.session()
        received, closed = yield self.send(
            b"GET /pty?session_id=" + session_id.encode() + b" HTTP/1.1\r\n"
            b"Host: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 8\r\nSec-WebSocket-Origin: http://evil.test\r\n\r\n"
        )
        self.assert_refused(received, closed, "hybi-8")
        yield self.assert_no_client_and_still_serving(session_id)

    @inlineCallbacks
    def test_plain_get_refused(self) -> Any:
        """E7: a GET with no upgrade (on /pty, on /, or asking autobahn's status page to redirect) is a 4xx with a JSON code, never a status page or a redirect."""
        session_id = yield self.session()
        for target in (
            b"/pty?session_id=" + session_id.encode(),
            b"/",
            b"/?redirect=http%3A%2F%2Fevil.example%2F",
            b"/?redirect=http%3A%2F%2Fevil.example%2F&after=0",
        ):
            received, closed = yield self.send(
                b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            )
            status = self.assert_refused(received, closed, target)
            self.assertNotEqual(status, 303, target)
            self.assertNotIn(b"evil.example", received, target)
        yield self.assert_no_client_and_still_serving(session_id)


def _local_addresses(inodes: set[str]) -> set[str]:
    """The hex local addresses (no port) of TCP sockets with these inodes."""
    return {fields[1].rsplit(":", 1)[0] for fields in tcp_rows() if fields[9] in inodes}


class BrowserCatalogueTests(DaemonTestCase):
    """Catalogue E13: what another sandbox process can reach of the browser."""

    timeout = 120
    policy = {"groups": {"browser": True}}

    def setUp(self) -> Any:

        if SKIP_REASON is not None:
            raise SkipTest(SKIP_REASON)
        browser_start_room(self)

        root = Resource()
        page = Data(
            b'<!doctype html><a id="dl" href="/file" download="got.bin">x</a>',
            "text/html",
        )
        root.putChild(b"", page)
        attachment = Data(b"DOWNLOADED-BYTES", "application/octet-stream")
        root.putChild(b"file", attachment)
        port = reactor.listenTCP(0, Site(root), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.site = f"http://127.0.0.1:{port.getHost().port}"
        return super().setUp()

    def browser_tree(self) -> list[int]:

        service = self.daemon.context.browser
        self.assertIsNotNone(service.worker)
        pids: list[int] = descendants(service.worker.pid)
        return [service.worker.pid, *pids]

    @inlineCallbacks
    def test_devtools_over_a_pipe_not_a_port(self) -> Any:
        """E13: Chromium speaks DevTools over a pipe (--remote-debugging-pipe), never a TCP port another process could connect to; no process of the browser's tree listens on TCP but the worker's own network gate, on loopback, which admits only its own user's sockets (tests/browser/test_socksgate.py)."""
        reply = yield self.request("POST", "/browser/navigate", {"url": self.site})
        self.assertEqual(reply.status, 200, reply.body)
        tree = self.browser_tree()
        cmdlines = []
        for pid in tree:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdlines.append(f.read().split(b"\0"))
            except OSError:
                continue
        browsers = [c for c in cmdlines if any(b"chrom" in a for a in c[:1])]
        self.assertNotEqual(browsers, [], cmdlines)
        flags = {a.split(b"=", 1)[0] for c in cmdlines for a in c}
        self.assertIn(b"--remote-debugging-pipe", flags)
        self.assertNotIn(b"--remote-debugging-port", flags)
        listening = listening_inodes()
        worker = tree[0]
        for pid in tree[1:]:
            self.assertEqual(socket_inodes(pid) & listening, set(), pid)
        gates = socket_inodes(worker) & listening
        self.assertEqual(len(gates), 1, gates)
        self.assertEqual(_local_addresses(gates), {"0100007F"})

    @inlineCallbacks
    def test_download_writes_nothing(self) -> Any:
        """E13: a page that downloads a file (a download link clicked, an attachment navigated to) leaves no file in the base dir or the worker's directory."""
        reply = yield self.request("POST", "/browser/navigate", {"url": self.site})
        self.assertEqual(reply.status, 200, reply.body)
        yield self.request("POST", "/browser/click", {"selector": "#dl"})
        yield self.request("POST", "/browser/navigate", {"url": self.site + "/file"})
        yield sleep(1.0)
        service = self.daemon.context.browser
        for root in (self.base_dir, service.workdir):
            for folder, _, files in os.walk(root):
                for name in files:
                    try:
                        with open(os.path.join(folder, name), "rb") as f:
                            data = f.read()
                    except OSError:
                        continue
                    self.assertNotIn(b"DOWNLOADED-BYTES", data, (folder, name))
        self.assertEqual(os.listdir(self.base_dir), [])
