"""
The KEP door's REST filesystem API, driven by agent-sandbox's own SDK
(``k8s-agent-sandbox``'s ``Filesystem``) and by raw httpx for what the SDK
does not reach: every call governed as its sandboxd endpoint, the
protocol's error bodies with sandboxd's code and rule in headers.
"""

from __future__ import annotations

import errno
import io
import os
import socket
import stat
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.policy import PolicyError, load_policy
from sandboxd.routes import builtin_table
from tests.kep.case import KepCase


def _sdk_error(test: Any, failure_value: Any) -> Any:
    from k8s_agent_sandbox.exceptions import SandboxRequestError

    test.assertIsInstance(failure_value, SandboxRequestError)
    return failure_value


def expect_continue(port: int, length: int, token: bytes | None) -> list[bytes]:
    """
    Send a PUT's head with ``Expect: 100-continue`` and no body; the status
    lines that come back before the daemon closes (or 2 s of quiet).
    """
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(2)
        s.sendall(
            b"PUT /v1/files/e.bin HTTP/1.1\r\nHost: x\r\n"
            + (b"X-Access-Token: " + token + b"\r\n" if token else b"")
            + b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % length
        )
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return [line for line in out.split(b"\r\n") if line.startswith(b"HTTP/")]


class SdkTests(KepCase):
    """The SDK's Filesystem does what its users expect, through sandboxd."""

    extra_policy = {"endpoints": {"files_*": {"paths": {"deny": ["**/secret*"]}}}}

    @inlineCallbacks
    def test_round_trip(self) -> Any:
        """write, read, read_to, list, exists and delete, nested and odd names."""
        fs = self.filesystem()
        yield self.blocking(fs.write, "a/b/c.txt", b"hello")
        with open(os.path.join(self.base_dir, "a/b/c.txt"), "rb") as f:
            self.assertEqual(f.read(), b"hello")
        self.assertEqual((yield self.blocking(fs.read, "a/b/c.txt")), b"hello")
        odd = "a/b/sp ace 100%.txt"
        yield self.blocking(fs.write, odd, "text é")
        self.assertEqual((yield self.blocking(fs.read, odd)), "text é".encode())
        sink = io.BytesIO()
        count = yield self.blocking(fs.read_to, "a/b/c.txt", sink)
        self.assertEqual((count, sink.getvalue()), (5, b"hello"))
        entries = yield self.blocking(fs.list, "a/b")
        self.assertEqual(
            sorted((e.name, e.type, e.size) for e in entries),
            [("c.txt", "file", 5), ("sp ace 100%.txt", "file", 7)],
        )
        top = yield self.blocking(fs.list, ".")
        self.assertIn(("a", "directory"), [(e.name, e.type) for e in top])
        self.assertTrue((yield self.blocking(fs.exists, "a/b/c.txt")))
        self.assertTrue((yield self.blocking(fs.exists, "a/b")))
        self.assertFalse((yield self.blocking(fs.exists, "a/nope")))
        yield self.blocking(fs.delete, "a/b/c.txt")
        self.assertFalse((yield self.blocking(fs.exists, "a/b/c.txt")))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "a/b/c.txt")))

    @inlineCallbacks
    def test_dotdot_refused(self) -> Any:
        """A path that leaves the root is PERMISSION_DENIED (403), nothing read."""
        fs = self.filesystem()
        error = yield self.assertFailure(
            self.blocking(fs.read, "../etc/passwd", allow_unsafe_paths=True),
            Exception,
        )
        error = _sdk_error(self, error)
        self.assertEqual(error.status_code, 403)
        self.assertEqual(error.response.json()["code"], "PERMISSION_DENIED")
        self.assertEqual(error.response.headers["X-Sandboxd-Rule"], "kep:root")
        error = yield self.assertFailure(self.blocking(fs.list, ".."), Exception)
        self.assertEqual(_sdk_error(self, error).status_code, 403)

    @inlineCallbacks
    def test_denied_by_policy(self) -> Any:
        """A path the policy denies is the SDK's error carrying PERMISSION_DENIED."""
        with open(os.path.join(self.base_dir, "secret.txt"), "w") as f:
            f.write("s")
        fs = self.filesystem()
        for call in (
            lambda: fs.read("secret.txt"),
            lambda: fs.write("secret2.txt", b"x"),
        ):
            error = _sdk_error(
                self, (yield self.assertFailure(self.blocking(call), Exception))
            )
            self.assertEqual(error.status_code, 403)
            self.assertEqual(
                error.response.json(),
                {
                    "code": "PERMISSION_DENIED",
                    "message": error.response.json()["message"],
                },
            )
            self.assertEqual(error.response.headers["X-Sandboxd-Code"], "path_denied")
            self.assertEqual(
                error.response.headers["X-Sandboxd-Rule"], "policy:endpoints.files_*"
            )
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "secret2.txt")))
        names = [e.name for e in (yield self.blocking(fs.list, "."))]
        self.assertNotIn("secret.txt", names)

    @inlineCallbacks
    def test_conflict_on_a_full_directory(self) -> Any:
        """delete of a non-empty directory is 409 CONFLICT; recursive removes it."""
        fs = self.filesystem()
        yield self.blocking(fs.write, "d/e/f.txt", b"x")
        error = _sdk_error(
            self, (yield self.assertFailure(self.blocking(fs.delete, "d"), Exception))
        )
        self.assertEqual(error.status_code, 409)
        self.assertEqual(error.response.json()["code"], "CONFLICT")
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "d/e/f.txt")))
        yield self.blocking(fs.delete, "d", recursive=True)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "d")))

    @inlineCallbacks
    def test_a_tree_written_into_while_deleted(self) -> Any:
        """
        A recursive delete that meets a file created in the tree after it
        was walked (a PUT racing it) is 409 CONFLICT, which a client may
        retry, not 500; the retry removes the tree.
        """
        from sandboxd.files import walk

        rmtree = walk.shutil.rmtree
        raced: list[str] = []

        def racing_rmtree(name: str, dir_fd: int) -> None:
            if not raced:
                raced.append(name)
                raise OSError(errno.ENOTEMPTY, "Directory not empty", name)
            rmtree(name, dir_fd=dir_fd)

        self.patch(walk.shutil, "rmtree", racing_rmtree)
        fs = self.filesystem()
        yield self.blocking(fs.write, "race/x/y/f.txt", b"x")
        error = _sdk_error(
            self,
            (
                yield self.assertFailure(
                    self.blocking(fs.delete, "race/x", recursive=True), Exception
                )
            ),
        )
        self.assertEqual(error.status_code, 409)
        self.assertEqual(error.response.json()["code"], "CONFLICT")
        self.assertIn("delete it again", error.response.json()["message"])
        yield self.blocking(fs.delete, "race/x", recursive=True)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "race/x")))


class RawTests(KepCase):
    """What the SDK does not reach, with a raw HTTP client."""

    audit = True
    extra_policy = {"defaults": {"audit": "all"}}

    def put_file(self, name: str, data: bytes) -> None:
        path = os.path.join(self.base_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    @inlineCallbacks
    def test_range_and_head(self) -> Any:
        """Range is 206, a range past the end 416, HEAD the head alone."""
        self.put_file("r.bin", b"0123456789")
        r = yield self.http("GET", "/v1/files/r.bin", headers={"Range": "bytes=2-4"})
        self.assertEqual((r.status_code, r.content), (206, b"234"))
        self.assertEqual(r.headers["content-range"], "bytes 2-4/10")
        r = yield self.http("GET", "/v1/files/r.bin")
        self.assertEqual((r.status_code, r.content), (200, b"0123456789"))
        self.assertEqual(r.headers["content-type"], "application/octet-stream")
        self.assertEqual(r.headers["accept-ranges"], "bytes")
        self.assertIn("last-modified", r.headers)
        r = yield self.http("GET", "/v1/files/r.bin", headers={"Range": "bytes=20-"})
        self.assertEqual(r.status_code, 416)
        self.assertEqual(r.json()["code"], "OUT_OF_RANGE")
        r = yield self.http("HEAD", "/v1/files/r.bin")
        self.assertEqual((r.status_code, r.content), (200, b""))
        self.assertEqual(r.headers["content-length"], "10")
        self.assertIn("last-modified", r.headers)
        r = yield self.http("HEAD", "/v1/files/nope")
        self.assertEqual((r.status_code, r.content), (404, b""))
        r = yield self.http("GET", "/v1/files/nope")
        self.assertEqual((r.status_code, r.json()["code"]), (404, "NOT_FOUND"))

    @inlineCallbacks
    def test_messages_name_the_callers_paths(self) -> Any:
        """
        An error names a path as the caller gave it, relative to the root,
        never the daemon's absolute path of it.
        """
        os.makedirs(os.path.join(self.base_dir, "conf"))
        for method in ("GET", "DELETE"):
            r = yield self.http(method, "/v1/files/conf%2Fnope")
            self.assertEqual(r.status_code, 404)
            self.assertEqual(
                r.json()["message"], "No such file or directory: conf/nope"
            )
            self.assertNotIn(self.base_dir, r.text)

    @inlineCallbacks
    def test_listing_shape(self) -> Any:
        """A directory is a DirectoryListing: RFC 3339 times, octal modes, links resolved."""
        self.put_file("l/x.txt", b"abc")
        os.chmod(os.path.join(self.base_dir, "l/x.txt"), 0o640)
        os.symlink("x.txt", os.path.join(self.base_dir, "l/link"))
        os.symlink("gone", os.path.join(self.base_dir, "l/broken"))
        r = yield self.http("GET", "/v1/files/l")
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.headers["content-type"], "application/json")
        listing = r.json()
        self.assertEqual(listing["path"], "/l")
        by_name = {e["name"]: e for e in listing["entries"]}
        self.assertEqual(sorted(by_name), ["link", "x.txt"])
        entry = by_name["x.txt"]
        self.assertEqual(
            (entry["size"], entry["type"], entry["mode"]), (3, "file", "0640")
        )
        self.assertRegex(entry["modified_at"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertEqual(by_name["link"]["size"], 3)

    @inlineCallbacks
    def test_mode(self) -> Any:
        """?mode= sets the bits; one not matching ^0[0-7]{3}$ is 400, nothing written."""
        r = yield self.http("PUT", "/v1/files/m%2Frun.sh?mode=0755", content=b"#!")
        self.assertEqual((r.status_code, r.content), (204, b""))
        path = os.path.join(self.base_dir, "m/run.sh")
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o755)
        r = yield self.http("PUT", "/v1/files/plain", content=b"x")
        self.assertEqual(r.status_code, 204)
        self.assertEqual(
            stat.S_IMODE(os.stat(os.path.join(self.base_dir, "plain")).st_mode), 0o644
        )
        for bad in ("755", "0855", "01755"):
            r = yield self.http("PUT", f"/v1/files/bad?mode={bad}", content=b"x")
            self.assertEqual(
                (r.status_code, r.json()["code"]), (400, "INVALID_ARGUMENT")
            )
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "bad")))

    @inlineCallbacks
    def test_multipart(self) -> Any:
        """A multipart body's ``file`` part is what is written; none is 400."""
        r = yield self.http(
            "PUT",
            "/v1/files/up.bin",
            files={"other": ("o", b"no"), "file": ("f", b"\x00data\r\n--")},
        )
        self.assertEqual(r.status_code, 204)
        with open(os.path.join(self.base_dir, "up.bin"), "rb") as f:
            self.assertEqual(f.read(), b"\x00data\r\n--")
        r = yield self.http("PUT", "/v1/files/none.bin", files={"other": ("o", b"x")})
        self.assertEqual((r.status_code, r.json()["code"]), (400, "INVALID_ARGUMENT"))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "none.bin")))

    @inlineCallbacks
    def test_nul_and_directory_target(self) -> Any:
        """A NUL in the path is 400; a PUT onto a directory is 400."""
        r = yield self.http("GET", "/v1/files/a%00b")
        self.assertEqual((r.status_code, r.json()["code"]), (400, "INVALID_ARGUMENT"))
        os.makedirs(os.path.join(self.base_dir, "dir"))
        r = yield self.http("PUT", "/v1/files/dir", content=b"x")
        self.assertEqual((r.status_code, r.json()["code"]), (400, "INVALID_ARGUMENT"))

    @inlineCallbacks
    def test_audit_line(self) -> Any:
        """Each call is one audit line, via kep, naming the endpoint governing it."""
        self.put_file("f.txt", b"x")
        yield self.http("GET", "/v1/files/f.txt")
        yield self.http("GET", "/v1/files/%2E")
        yield self.http("DELETE", "/v1/files/f.txt")
        lines = [line for line in self.audit_lines() if line.get("via") == "kep"]
        self.assertEqual(
            [(line["endpoint"], line["status"]) for line in lines],
            [("files_read_raw", 200), ("files_list", 200), ("files_delete", 204)],
        )

    @inlineCallbacks
    def test_a_download_the_client_drops(self) -> Any:
        """
        A client that goes away in the middle of a download (Ctrl-C, a
        port-forward dropping) is routine: no error is logged, and the
        audit line says the client left (499 ``client_closed``), not 200.
        """
        path = os.path.join(self.base_dir, "big.bin")
        with open(path, "wb") as f:
            f.truncate(64 * 1024 * 1024)

        def drop() -> int:
            with socket.create_connection(("127.0.0.1", self.rest_port)) as sock:
                sock.sendall(
                    b"GET /v1/files/big.bin HTTP/1.1\r\nHost: localhost\r\n\r\n"
                )
                got = 0
                while got < 1024 * 1024:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    got += len(chunk)
            return got

        for _ in range(3):
            got = yield self.blocking(drop)
            self.assertGreaterEqual(got, 1024 * 1024)
        lines: list[Any] = []
        for _ in range(100):
            lines = [
                (line["status"], line["code"])
                for line in self.audit_lines()
                if line.get("endpoint") == "files_read_raw"
            ]
            if len(lines) == 3:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual(lines, [(499, "client_closed")] * 3)
        self.assertEqual(self.flushLoggedErrors(), [])

    @inlineCallbacks
    def test_health_and_metadata(self) -> Any:
        """health is ok (503 while stopping); metadata is SANDBOX_ minus secrets."""
        r = yield self.http("GET", "/v1/health")
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.json()["status"], "ok")
        self.assertIsInstance(r.json()["uptime_seconds"], int)
        self.daemon.context.draining = True
        try:
            r = yield self.http("GET", "/v1/health")
        finally:
            self.daemon.context.draining = False
        self.assertEqual((r.status_code, r.json()["code"]), (503, "UNAVAILABLE"))
        wanted = {
            "SANDBOX_KEP_TEST_ID": "abc",
            "SANDBOX_KEP_TEST_API_KEY": "s1",
            "SANDBOX_KEP_TEST_AUTH_MODE": "s2",
            "SANDBOX_KEP_TEST_CERTS": "s3",
            "KEP_TEST_OTHER": "o",
        }
        saved = {k: os.environ.get(k) for k in wanted}
        os.environ.update(wanted)

        def restore() -> None:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

        self.addCleanup(restore)
        r = yield self.http("GET", "/v1/metadata")
        env = r.json()["env"]
        mine = {k: v for k, v in env.items() if "KEP_TEST" in k}
        self.assertEqual(mine, {"SANDBOX_KEP_TEST_ID": "abc"})
        self.assertTrue(all(k.startswith("SANDBOX_") for k in env))

    @inlineCallbacks
    def test_unknown_route(self) -> Any:
        """
        A path the protocol has not is 404 NOT_FOUND in its framing; a
        method a path does not take is 405 with the ones it does in Allow.
        """
        r = yield self.http("GET", "/v2/files/x")
        self.assertEqual((r.status_code, r.json()["code"]), (404, "NOT_FOUND"))
        r = yield self.http("POST", "/v1/files/x", content=b"")
        self.assertEqual((r.status_code, r.json()["code"]), (405, "UNIMPLEMENTED"))
        self.assertEqual(r.headers["allow"], "GET, HEAD, PUT, DELETE")
        r = yield self.http("DELETE", "/v1/health")
        self.assertEqual((r.status_code, r.headers["allow"]), (405, "GET, HEAD"))


class RootTests(KepCase):
    """The root is the base dir: emptied on request, never removed."""

    @inlineCallbacks
    def test_root_delete(self) -> Any:
        """The root is emptied with recursive=true, never removed; 409 without it."""
        os.makedirs(os.path.join(self.base_dir, "z"))
        with open(os.path.join(self.base_dir, "w.txt"), "w") as f:
            f.write("2")
        r = yield self.http("DELETE", "/v1/files/%2E")
        self.assertEqual((r.status_code, r.json()["code"]), (409, "CONFLICT"))
        r = yield self.http("DELETE", "/v1/files/%2E?recursive=true")
        self.assertEqual(r.status_code, 204, r.content)
        self.assertTrue(os.path.isdir(self.base_dir))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "z")))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "w.txt")))


class LimitTests(KepCase):
    """A body over ``max_bytes``, or one not received whole, writes nothing."""

    extra_policy = {"endpoints": {"files_write_raw": {"limits": {"max_bytes": 1000}}}}

    @inlineCallbacks
    def test_over_max_bytes(self) -> Any:
        """413 for a file over files_write_raw's max_bytes; no file left."""
        r = yield self.http("PUT", "/v1/files/big", content=b"x" * 5000)
        self.assertEqual(r.status_code, 413)
        self.assertEqual(r.headers["X-Sandboxd-Code"], "payload_too_large")
        r = yield self.http("PUT", "/v1/files/huge", content=b"x" * (3 * 1024 * 1024))
        self.assertEqual(r.status_code, 413)
        self.assertEqual(sorted(os.listdir(self.base_dir)), [])

    @inlineCallbacks
    def test_partial_body(self) -> Any:
        """A client that leaves before its body is whole writes nothing."""

        def send() -> None:
            s = socket.create_connection(("127.0.0.1", self.rest_port))
            s.sendall(
                b"PUT /v1/files/part HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/octet-stream\r\nContent-Length: 500\r\n\r\n"
                + b"y"
                * 100
            )
            s.close()

        yield self.blocking(send)
        r = yield self.http("GET", "/v1/health")  # the daemon went on serving
        self.assertEqual(r.status_code, 200)
        self.assertEqual(os.listdir(self.base_dir), [])


class AuthTests(KepCase):
    """Tokens: 401 without one; ``unauthenticated_as`` lets the SDK in as one."""

    environ = {"KEP_T": "agent-secret", "ADMIN_T": "admin-secret"}
    audit = True
    extra_policy = {
        "defaults": {"audit": "all"},
        "auth": {
            "tokens": [
                {"id": "agent", "token_env": "KEP_T", "scopes": ["files:read"]},
                {"id": "admin", "token_env": "ADMIN_T", "scopes": ["*"]},
            ]
        },
    }

    @inlineCallbacks
    def test_no_credential_is_401(self) -> Any:
        """Without the param a call without a token is UNAUTHENTICATED; health is not."""
        r = yield self.http("GET", "/v1/files/%2E")
        self.assertEqual((r.status_code, r.json()["code"]), (401, "UNAUTHENTICATED"))
        self.assertEqual(r.headers["X-Sandboxd-Code"], "unauthorized")
        r = yield self.http(
            "GET", "/v1/files/%2E", headers={"X-Access-Token": "admin-secret"}
        )
        self.assertEqual(r.status_code, 200)
        r = yield self.http("GET", "/v1/health")
        self.assertEqual(r.status_code, 200)

    @inlineCallbacks
    def test_wrong_token_with_expect(self) -> Any:
        """
        A wrong token on a small body announced with ``Expect:
        100-continue`` is 401 at once, before any body, and never preceded
        or followed by ``100 Continue``.
        """
        lines = yield self.blocking(expect_continue, self.rest_port, 1000, b"wrong")
        self.assertEqual([line.split()[1] for line in lines], [b"401"])
        lines = yield self.blocking(expect_continue, self.rest_port, 10**10, b"wrong")
        self.assertEqual(len(lines), 1, lines)
        self.assertNotIn(b"100", lines[0])

    @inlineCallbacks
    def test_unauthenticated_as(self) -> Any:
        """
        With ``unauthenticated_as``, a call without a credential is that
        token's identity (its scopes, its audit name); one with a credential
        is authenticated as always, a wrong one still 401.
        """
        yield self.daemon.stop()
        policy = dict(self.extra_policy)
        policy["endpoints"] = {"kep": {"params": {"unauthenticated_as": "agent"}}}
        self.extra_policy = policy
        yield self.start()
        with open(os.path.join(self.base_dir, "r.txt"), "w") as f:
            f.write("ok")
        r = yield self.http("GET", "/v1/files/r.txt")
        self.assertEqual((r.status_code, r.content), (200, b"ok"))
        r = yield self.http("PUT", "/v1/files/w.txt", content=b"x")
        self.assertEqual((r.status_code, r.json()["code"]), (403, "PERMISSION_DENIED"))
        self.assertEqual(r.headers["X-Sandboxd-Code"], "missing_scope")
        r = yield self.http(
            "PUT",
            "/v1/files/w.txt",
            content=b"x",
            headers={"X-Access-Token": "admin-secret"},
        )
        self.assertEqual(r.status_code, 204)
        r = yield self.http(
            "GET", "/v1/files/r.txt", headers={"X-Access-Token": "wrong"}
        )
        self.assertEqual(r.status_code, 401)
        kep = [line for line in self.audit_lines() if line.get("via") == "kep"]
        self.assertEqual(kep[0]["identity"], "agent")
        self.assertEqual(kep[2]["identity"], "admin")
        # The HTTP port is not the KEP door: no credential is 401 there.
        response = yield self.daemon.request("GET", "/files/list?path=.", token=None)
        self.assertEqual(response.status, 401)

    @inlineCallbacks
    def test_a_credential_the_door_cannot_read_is_401(self) -> Any:
        """
        With ``unauthenticated_as``, an ``Authorization`` header holding no
        token the daemon reads (``Basic``, an empty one) is 401
        UNAUTHENTICATED, not the stand-in's identity: its caller believes
        it is authenticated.  Without the header the stand-in still holds.
        """
        yield self.daemon.stop()
        policy = dict(self.extra_policy)
        policy["endpoints"] = {"kep": {"params": {"unauthenticated_as": "agent"}}}
        self.extra_policy = policy
        yield self.start()
        with open(os.path.join(self.base_dir, "r.txt"), "w") as f:
            f.write("ok")
        for value in ("Basic dXNlcjpwYXNz", ""):
            r = yield self.http(
                "GET", "/v1/files/r.txt", headers={"Authorization": value}
            )
            self.assertEqual(
                (r.status_code, r.json()["code"]), (401, "UNAUTHENTICATED"), value
            )
        r = yield self.http("GET", "/v1/files/r.txt")
        self.assertEqual((r.status_code, r.content), (200, b"ok"))

    @inlineCallbacks
    def test_counted_link_spends_one_use_per_call(self) -> Any:
        """
        A counted link on the KEP door: one use per call let in (not one
        for ``kep`` and one for the endpoint), none for a refused write;
        used up, the next call is UNAUTHENTICATED (``link_invalid``).
        """
        with open(os.path.join(self.base_dir, "r.txt"), "w") as f:
            f.write("ok")
        minted = yield self.daemon.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["files:read"], "uses": 2},
            token="admin-secret",
        )
        link = {"X-Access-Token": minted.json()["token"]}
        r = yield self.http("GET", "/v1/files/r.txt", headers=link)
        self.assertEqual((r.status_code, r.content), (200, b"ok"))
        r = yield self.http("PUT", "/v1/files/w.txt", content=b"x", headers=link)
        self.assertEqual(r.headers["X-Sandboxd-Code"], "missing_scope")
        r = yield self.http("GET", "/v1/files/r.txt", headers=link)
        self.assertEqual((r.status_code, r.content), (200, b"ok"))
        r = yield self.http("GET", "/v1/files/r.txt", headers=link)
        self.assertEqual(r.status_code, 401)
        self.assertEqual(r.headers["X-Sandboxd-Code"], "link_invalid")


class SwitchTests(KepCase):
    """The door follows the policy: off, nothing passes."""

    @inlineCallbacks
    def test_disabled_door_refuses_every_call(self) -> Any:
        """A connection still open when the door is turned off gets 403 endpoint_disabled."""
        context = self.daemon.context
        off = load_policy(
            context.table,
            explicit={"groups": {"kep": False}},
            base_dir=self.base_dir,
            environ={},
        )
        old = context.policy
        context.replace_policy(off)
        try:
            for method, path in (
                ("GET", "/v1/files/%2E"),
                ("PUT", "/v1/files/x"),
                ("DELETE", "/v1/files/x"),
                ("GET", "/v1/metadata"),
                ("GET", "/v1/health"),
            ):
                r = yield self.http(
                    method, path, content=b"" if method == "PUT" else None
                )
                self.assertEqual(r.status_code, 403, (method, path))
                self.assertEqual(r.json()["code"], "PERMISSION_DENIED")
                self.assertEqual(r.headers["X-Sandboxd-Code"], "endpoint_disabled")
        finally:
            context.replace_policy(old)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "x")))

    @inlineCallbacks
    def test_off_by_default(self) -> Any:
        """Without the kep group on, the REST port does not listen."""
        yield self.daemon.stop()
        self.enable_kep = False
        yield self.start()
        self.assertIsNone(self.rest_port)


class PolicyTests(SynchronousTestCase):
    """``unauthenticated_as`` must name one of the policy's tokens."""

    def test_unknown_token_refused(self) -> None:
        """A policy naming an unknown token id is refused at load, naming it."""
        error = self.assertRaises(
            PolicyError,
            load_policy,
            builtin_table(),
            explicit={
                "auth": {
                    "tokens": [{"id": "agent", "token_env": "T", "scopes": ["*"]}]
                },
                "endpoints": {"kep": {"params": {"unauthenticated_as": "ghost"}}},
            },
            base_dir="/tmp",
            environ={"T": "x"},
        )
        self.assertIn("'ghost'", str(error))
        self.assertIn("'agent'", str(error))

    def test_known_token_accepted(self) -> None:
        """Naming a configured token loads."""
        policy = load_policy(
            builtin_table(),
            explicit={
                "auth": {
                    "tokens": [{"id": "agent", "token_env": "T", "scopes": ["*"]}]
                },
                "endpoints": {"kep": {"params": {"unauthenticated_as": "agent"}}},
            },
            base_dir="/tmp",
            environ={"T": "x"},
        )
        self.assertEqual(policy.rules["kep"].params.unauthenticated_as, "agent")
