"""
The file_ops group (SPEC §7.3) against a real daemon in a temporary base dir.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import tarfile
import tempfile
import time
import zipfile
from typing import Any
from urllib.parse import quote

from twisted.internet.defer import inlineCallbacks
from twisted.internet.testing import StringTransport
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.api.schema import schema_for
from sandboxd.files import walk
from sandboxd.files.stream import FileShrank
from sandboxd.testing import memory_context, memory_site
from tests.helpers import DaemonTestCase


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _raw_get(port: int, url: str) -> tuple[dict[str, str], bytes]:
    """GET ``url`` over a plain socket: (headers by lower-case name, body)."""
    with socket.socket() as s:
        s.settimeout(20)
        s.connect(("127.0.0.1", port))
        s.sendall(
            f"GET {url} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers, body


def _read_head(s: socket.socket, data: bytes) -> tuple[bytes, bytes, int]:
    """Read a response's head from ``s`` (after ``data``): head, body so far, Content-Length."""
    while b"\r\n\r\n" not in data:
        data += s.recv(4096)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(
        next(
            line.split(b":", 1)[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
    )
    return head, body, length


def _two_gets(port: int, url: str, range_: str) -> tuple[bytes, bytes]:
    """
    Two GETs on one keep-alive connection, the second with a Range: the
    raw responses, each read to its Content-Length.
    """

    def one(s: socket.socket, extra: str, rest: bytes) -> tuple[bytes, bytes]:
        s.sendall(f"GET {url} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n".encode())
        head, body, length = _read_head(s, rest)
        while len(body) < length:
            body += s.recv(1 << 20)
        return head + b"\r\n\r\n" + body[:length], body[length:]

    with socket.socket() as s:
        s.settimeout(20)
        s.connect(("127.0.0.1", port))
        first, rest = one(s, "", b"")
        second, _ = one(s, f"Range: {range_}\r\n", rest)
    return first, second


def _read_while_truncating(port: int, url: str, path: str) -> tuple[int, int]:
    """
    GET ``url`` slowly, truncate ``path`` once the body has begun, and read
    until the server closes: (Content-Length, body bytes received).
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(20)
        s.connect(("127.0.0.1", port))
        s.sendall(f"GET {url} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        _, body, length = _read_head(s, b"")
        os.truncate(path, 0)
        received = len(body)
        try:
            while chunk := s.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            pass
        return length, received


def _write_while_moving(port: int, base: str) -> tuple[int, bytes]:
    """
    ``POST /files/raw?path=dd/sub/f.bin`` with half its body sent, then
    ``dd/sub`` renamed to ``dd/moved``, then the rest: the answer's status
    and body.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(
            b"POST /files/raw?path=dd/sub/f.bin HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/octet-stream\r\n"
            b"Content-Length: 200000\r\nConnection: close\r\n\r\n" + b"x" * 100000
        )
        time.sleep(0.5)  # the write has begun in dd/sub
        os.rename(os.path.join(base, "dd/sub"), os.path.join(base, "dd/moved"))
        s.sendall(b"x" * 100000)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


class FilesCase(DaemonTestCase):
    def put(self, rel: str, data: bytes = b"hello") -> str:
        path = os.path.join(self.base_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def read(self, rel: str) -> bytes:
        with open(os.path.join(self.base_dir, rel), "rb") as f:
            return f.read()

    def get(self, route: str, path: str, **kwargs: Any) -> Any:
        return self.request("GET", f"{route}?path={quote(path, safe='')}", **kwargs)


class OperatingSystemRefusalTests(FilesCase):
    """
    What the operating system refuses (here an immutable file, which even
    root may not replace or remove) is 403 ``permission_denied`` with no
    ``rule`` (no policy decided it), and nothing is changed or left behind.
    """

    def setUp(self) -> Any:
        d = super().setUp()
        self.path = self.put("locked.txt", b"old")
        if shutil.which("chattr") is None:
            raise SkipTest("chattr is not installed (e2fsprogs)")
        done = subprocess.run(
            ["chattr", "+i", self.path], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SkipTest(f"no immutable files here: {done.stderr.strip()}")
        self.addCleanup(subprocess.run, ["chattr", "-i", self.path])
        return d

    def assertRefused(self, reply: Any) -> None:
        self.assertEqual(reply.status, 403, reply.body)
        body = reply.json()
        self.assertEqual(
            (body["code"], body["type"]), ("permission_denied", "PermissionError")
        )
        self.assertNotIn("rule", body)
        self.assertEqual(self.read("locked.txt"), b"old")
        self.assertEqual(os.listdir(self.base_dir), ["locked.txt"])

    @inlineCallbacks
    def test_upload(self) -> Any:
        reply = yield self.request(
            "POST", "/upload", {"path": "locked.txt", "content_base64": b64(b"new")}
        )
        self.assertRefused(reply)

    @inlineCallbacks
    def test_delete(self) -> Any:
        reply = yield self.request("DELETE", f"/files?path={quote(self.path, safe='')}")
        self.assertRefused(reply)


class TransferTests(FilesCase):
    @inlineCallbacks
    def test_upload_then_download(self) -> Any:
        """/upload writes the bytes (creating parents); /download returns them with an etag."""
        reply = yield self.request(
            "POST",
            "/upload",
            {"path": "a/b/c.txt", "content_base64": b64(b"data\x00\xff")},
        )
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertEqual(body["path"], os.path.join(self.base_dir, "a/b/c.txt"))
        self.assertEqual(body["bytes"], 6)
        self.assertEqual(self.read("a/b/c.txt"), b"data\x00\xff")
        reply = yield self.get("/download", "a/b/c.txt")
        self.assertEqual(reply.status, 200)
        self.assertEqual(
            base64.b64decode(reply.json()["content_base64"]), b"data\x00\xff"
        )
        self.assertEqual(reply.json()["etag"], body["etag"])

    @inlineCallbacks
    def test_download_errors(self) -> Any:
        """Missing file 404 FileNotFoundError, a directory 400, no path 400."""
        os.mkdir(os.path.join(self.base_dir, "d"))
        reply = yield self.get("/download", "nope.txt")
        self.assertEqual(
            (reply.status, reply.json()["type"]), (404, "FileNotFoundError")
        )
        reply = yield self.get("/download", "d")
        self.assertEqual(reply.status, 400)
        reply = yield self.request("GET", "/download")
        self.assertEqual(reply.status, 400)

    @inlineCallbacks
    def test_bad_base64(self) -> Any:
        """Invalid base64 is 400 and nothing is written."""
        reply = yield self.request(
            "POST", "/upload", {"path": "x.txt", "content_base64": "!!!"}
        )
        self.assertEqual(reply.status, 400)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "x.txt")))

    @inlineCallbacks
    def test_big_download_and_stream(self) -> Any:
        """Files past the inline size go through a thread / the streamed JSON, byte-exact."""
        data = os.urandom(3 * 1024 * 1024 + 7)
        self.put("big.bin", data)
        reply = yield self.get("/download", "big.bin")
        self.assertEqual(base64.b64decode(reply.json()["content_base64"]), data)
        reply = yield self.get("/files/download-stream", "big.bin")
        self.assertEqual(reply.status, 200)
        body = reply.json()
        self.assertEqual(body["bytes"], len(data))
        self.assertEqual(base64.b64decode(body["content_base64"]), data)
        self.assertEqual(body["path"], os.path.join(self.base_dir, "big.bin"))

    @inlineCallbacks
    def test_download_stream_length_every_padding(self) -> Any:
        """The streamed JSON announces its exact length, whatever the base64 padding."""
        for size in (0, 1, 2, 3, 4, 5):
            data = os.urandom(size)
            self.put(f"s{size}.bin", data)
            url = f"/files/download-stream?path=s{size}.bin"
            headers, raw = yield deferToThread(_raw_get, self.daemon.port, url)
            self.assertEqual(headers["content-length"], str(len(raw)))
            self.assertNotIn("transfer-encoding", headers)
            body = json.loads(raw)
            self.assertEqual(
                (body["bytes"], base64.b64decode(body["content_base64"])), (size, data)
            )

    @inlineCallbacks
    def test_file_shrinking_mid_stream_cuts_the_connection(self) -> Any:
        """A file truncated while it streams is never passed off as complete: the connection is cut short of its Content-Length."""
        for route in ("/files/raw", "/files/download-stream"):
            self.put("shrink.bin", os.urandom(48 * 1024 * 1024))
            url = f"{route}?path=shrink.bin"
            port = self.daemon.port
            path = os.path.join(self.base_dir, "shrink.bin")
            announced, received = yield deferToThread(
                _read_while_truncating, port, url, path
            )
            self.assertLess(received, announced, route)
        self.assertEqual(len(self.flushLoggedErrors(FileShrank)), 0)

    @inlineCallbacks
    def test_upload_stream_big_and_overwrite_false(self) -> Any:
        """upload-stream writes big payloads; overwrite=false on an existing file is 409, old bytes kept."""
        data = os.urandom(2 * 1024 * 1024)
        reply = yield self.request(
            "POST",
            "/files/upload-stream",
            {"path": "u.bin", "content_base64": b64(data)},
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["bytes"], len(data))
        self.assertEqual(self.read("u.bin"), data)
        reply = yield self.request(
            "POST",
            "/files/upload-stream",
            {"path": "u.bin", "content_base64": b64(b"x"), "overwrite": False},
        )
        self.assertEqual(reply.status, 409)
        self.assertEqual(self.read("u.bin"), data)

    @inlineCallbacks
    def test_if_match(self) -> Any:
        """If-Match with a stale etag is 412 and nothing is written; the current one succeeds."""
        reply = yield self.request(
            "POST", "/upload", {"path": "m.txt", "content_base64": b64(b"one")}
        )
        etag = reply.json()["etag"]
        self.put("m.txt", b"changed by someone else")
        reply = yield self.request(
            "POST",
            "/files/upload-stream",
            {"path": "m.txt", "content_base64": b64(b"two")},
            headers={"If-Match": etag},
        )
        self.assertEqual(
            (reply.status, reply.json()["code"]), (412, "precondition_failed")
        )
        self.assertEqual(self.read("m.txt"), b"changed by someone else")
        reply = yield self.get("/files/stat", "m.txt")
        fresh = reply.json()["etag"]
        reply = yield self.request(
            "POST",
            "/files/upload-stream",
            {"path": "m.txt", "content_base64": b64(b"two"), "if_match": fresh},
        )
        self.assertEqual(reply.status, 200)
        self.assertEqual(self.read("m.txt"), b"two")

    @inlineCallbacks
    def test_no_temp_files_left(self) -> Any:
        """After uploads (good and refused) the directory holds only the real files."""
        yield self.request(
            "POST", "/upload", {"path": "t.txt", "content_base64": b64(b"1")}
        )
        yield self.request(
            "POST",
            "/files/upload-stream",
            {"path": "t.txt", "content_base64": b64(b"2"), "overwrite": False},
        )
        self.assertEqual(os.listdir(self.base_dir), ["t.txt"])


class SmallCapTests(FilesCase):
    policy = {
        "endpoints": {
            "files_*": {"limits": {"max_bytes": 1000}},
            "upload": {"limits": {"max_bytes": 1000}},
            "download": {"limits": {"max_bytes": 1000}},
        }
    }

    @inlineCallbacks
    def test_oversize_upload_keeps_old_file(self) -> Any:
        """A payload over max_bytes is 413 and the old file is intact."""
        self.put("k.txt", b"old")
        for route in ("/upload", "/files/upload-stream"):
            reply = yield self.request(
                "POST", route, {"path": "k.txt", "content_base64": b64(b"x" * 1001)}
            )
            self.assertEqual(
                (reply.status, reply.json()["code"]), (413, "payload_too_large"), route
            )
        self.assertEqual(self.read("k.txt"), b"old")
        reply = yield self.request(
            "POST", "/files/raw?path=k.txt", raw_body=b"y" * 1001
        )
        self.assertEqual(reply.status, 413)
        self.assertEqual(self.read("k.txt"), b"old")
        self.assertEqual(os.listdir(self.base_dir), ["k.txt"])

    @inlineCallbacks
    def test_oversize_download(self) -> Any:
        """
        A file over max_bytes is 413 on the base64 routes and the raw one,
        saying it is the file (its size given) that is too large, not the
        request.
        """
        self.put("big.txt", b"z" * 1001)
        for route in ("/download", "/files/download-stream", "/files/raw"):
            reply = yield self.get(route, "big.txt")
            self.assertEqual(reply.status, 413, route)
            body = reply.json()
            self.assertEqual(body["size"], 1001, route)
            self.assertTrue(
                body["error"].startswith(
                    "the file (1001 bytes) is over the limit of 1000 bytes"
                ),
                body,
            )


class TooLargeSaysWhatToRaiseTests(FilesCase):
    """A 413 names the policy key whose limit was passed."""

    policy = {
        "endpoints": {
            "files_*": {"limits": {"max_bytes": 1000}},
            "upload": {"limits": {"max_bytes": 1000}},
            "download": {"limits": {"max_bytes": 1000}},
            "files_mkdir": {"limits": {"max_request_bytes": 100}},
        }
    }

    @inlineCallbacks
    def test_setting_named(self) -> Any:
        """Uploads, downloads, raw writes and a big request body each name their key."""
        self.put("big.txt", b"z" * 1001)
        cases = [
            (
                self.request(
                    "POST", "/upload", {"path": "k", "content_base64": b64(b"x" * 1001)}
                ),
                "endpoints.upload.limits.max_bytes",
            ),
            (
                self.request("POST", "/files/raw?path=k", raw_body=b"y" * 1001),
                "endpoints.files_write_raw.limits.max_bytes",
            ),
            (self.get("/download", "big.txt"), "endpoints.download.limits.max_bytes"),
            (
                self.request("POST", "/files/uploads", {"path": "k", "size": 5000}),
                "endpoints.files_uploads_create.limits.max_bytes",
            ),
            (
                self.request("POST", "/files/mkdir", {"path": "a" * 200}),
                "endpoints.files_mkdir.limits.max_request_bytes",
            ),
        ]
        for pending, setting in cases:
            reply = yield pending
            self.assertEqual(reply.status, 413, setting)
            body = reply.json()
            self.assertEqual(body["setting"], setting)
            self.assertIn(setting, body["error"])


class PolicyOverwriteTests(FilesCase):
    """
    ``params.overwrite: false`` makes every write a create: one that meets
    an existing file is the 409 ``file_exists`` of any create without
    overwrite (the seed's answer, which its SDK raises as
    ``FilePolicyDeniedError``), naming the policy's rule; nothing changes.
    """

    policy = {
        "endpoints": {
            name: {"params": {"overwrite": False}}
            for name in (
                "upload",
                "files_upload_stream",
                "files_write_raw",
                "files_move",
            )
        }
    }

    @inlineCallbacks
    def test_existing_file_kept(self) -> Any:
        self.put("a.txt", b"alpha")
        self.put("b.txt", b"beta")
        cases = [
            (
                "upload",
                self.request(
                    "POST", "/upload", {"path": "a.txt", "content_base64": b64(b"new")}
                ),
            ),
            (
                "files_upload_stream",
                self.request(
                    "POST",
                    "/files/upload-stream",
                    {"path": "a.txt", "content_base64": b64(b"new"), "overwrite": True},
                ),
            ),
            (
                "files_write_raw",
                self.request("POST", "/files/raw?path=a.txt", raw_body=b"new"),
            ),
            (
                "files_move",
                self.request(
                    "POST",
                    "/files/move",
                    {"source": "b.txt", "destination": "a.txt", "overwrite": True},
                ),
            ),
        ]
        for endpoint, pending in cases:
            reply = yield pending
            body = reply.json()
            self.assertEqual(
                (reply.status, body["code"], body["type"]),
                (409, "file_exists", "FileExistsError"),
                endpoint,
            )
            self.assertEqual(body["rule"], f"policy:endpoints.{endpoint}")
        self.assertEqual((self.read("a.txt"), self.read("b.txt")), (b"alpha", b"beta"))
        reply = yield self.request(
            "POST", "/upload", {"path": "c.txt", "content_base64": b64(b"new")}
        )
        self.assertEqual(reply.status, 200, reply.body)


class RawTests(FilesCase):
    @inlineCallbacks
    def test_write_raw_and_read_raw(self) -> Any:
        """POST /files/raw stores the body (sha256 reported); GET streams it with ETag and Last-Modified."""
        data = os.urandom(1024 * 1024 + 3)
        reply = yield self.request(
            "POST", "/files/raw?path=r/raw.bin&mode=600", raw_body=data
        )
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertEqual(body["bytes"], len(data))
        self.assertEqual(body["sha256"], hashlib.sha256(data).hexdigest())
        self.assertEqual(
            os.stat(os.path.join(self.base_dir, "r/raw.bin")).st_mode & 0o777, 0o600
        )
        reply = yield self.get("/files/raw", "r/raw.bin")
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.body, data)
        self.assertEqual(reply.header("etag"), body["etag"])
        self.assertIsNotNone(reply.header("last-modified"))
        self.assertEqual(reply.header("content-type"), "application/octet-stream")

    @inlineCallbacks
    def test_range_and_conditional(self) -> Any:
        """A single Range is 206 with Content-Range; If-None-Match with the etag is 304; past the end 416."""
        self.put("f.txt", b"0123456789")
        reply = yield self.get("/files/raw", "f.txt", headers={"Range": "bytes=2-4"})
        self.assertEqual((reply.status, reply.body), (206, b"234"))
        self.assertEqual(reply.header("content-range"), "bytes 2-4/10")
        reply = yield self.get("/files/raw", "f.txt", headers={"Range": "bytes=-3"})
        self.assertEqual((reply.status, reply.body), (206, b"789"))
        reply = yield self.get("/files/raw", "f.txt", headers={"Range": "bytes=20-"})
        self.assertEqual(reply.status, 416)
        etag = reply = yield self.get("/files/raw", "f.txt")
        etag = reply.header("etag")
        reply = yield self.get("/files/raw", "f.txt", headers={"If-None-Match": etag})
        self.assertEqual((reply.status, reply.body), (304, b""))

    @inlineCallbacks
    def test_suffix_range_of_an_empty_file_is_416(self) -> Any:
        """
        A suffix Range on an empty file cannot be satisfied (RFC 9110): 416
        with ``bytes */0``, never a ``bytes 0--1/0`` Content-Range.
        """
        self.put("empty.bin", b"")
        reply = yield self.get("/files/raw", "empty.bin", headers={"Range": "bytes=-5"})
        self.assertEqual(reply.status, 416)
        self.assertEqual(reply.header("content-range"), "bytes */0")

    @inlineCallbacks
    def test_nul_in_a_path_is_invalid_path_as_documented(self) -> Any:
        """A NUL in a path is 400 invalid_path, the code the endpoint's errors list for it."""
        reply = yield self.request("GET", "/download?path=in.txt%00x")
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_path"))
        documented = {(e.status, e.code): e.when for e in schema_for("download").errors}
        self.assertIn("NUL", documented[(400, "invalid_path")])
        self.assertNotIn("NUL", documented[(400, "invalid_param")])

    @inlineCallbacks
    def test_directory_moved_during_a_raw_write(self) -> Any:
        """
        A raw write whose directory is renamed before its body ends is 404,
        as one whose directory is deleted, and writes nothing: never a 200
        naming a path where the file is not.
        """
        os.makedirs(os.path.join(self.base_dir, "dd", "sub"))
        status, body = yield deferToThread(
            _write_while_moving, self.daemon.port, self.base_dir
        )
        self.assertEqual((status, json.loads(body)["code"]), (404, "not_found"))
        self.assertEqual(os.listdir(os.path.join(self.base_dir, "dd", "moved")), [])

    @inlineCallbacks
    def test_write_raw_if_match_and_overwrite(self) -> Any:
        """Raw write with a stale If-Match is 412; overwrite=false on an existing file 409; old bytes kept."""
        self.put("w.txt", b"old")
        reply = yield self.request(
            "POST",
            "/files/raw?path=w.txt",
            raw_body=b"new",
            headers={"If-Match": '"nope"'},
        )
        self.assertEqual(reply.status, 412)
        reply = yield self.request(
            "POST", "/files/raw?path=w.txt&overwrite=false", raw_body=b"new"
        )
        self.assertEqual(reply.status, 409)
        self.assertEqual(self.read("w.txt"), b"old")
        reply = yield self.request("POST", "/files/raw?path=w.txt", raw_body=b"")
        self.assertEqual((reply.status, self.read("w.txt")), (200, b""))


class RawKeepAliveTests(FilesCase):
    """A raw read (sent by sendfile on a plain connection) leaves the connection usable."""

    policy = {"defaults": {"audit": "all"}}
    audit = True

    @inlineCallbacks
    def test_two_reads_on_one_connection(self) -> Any:
        """A whole file, then a range of it, on one keep-alive connection: both byte-exact, and the audit counts the bytes sent."""
        data = os.urandom(3 * 1024 * 1024 + 11)
        self.put("k.bin", data)
        first, second = yield deferToThread(
            _two_gets, self.daemon.port, "/files/raw?path=k.bin", "bytes=1000-2099999"
        )
        self.assertTrue(first.startswith(b"HTTP/1.1 200 "))
        self.assertEqual(first.split(b"\r\n\r\n", 1)[1], data)
        self.assertTrue(second.startswith(b"HTTP/1.1 206 "))
        self.assertEqual(second.split(b"\r\n\r\n", 1)[1], data[1000:2100000])
        reads = [
            line for line in self.audit_lines() if line["endpoint"] == "files_read_raw"
        ]
        self.assertEqual([line["status"] for line in reads], [200, 206])
        self.assertGreaterEqual(reads[0]["bytes_out"], len(data))
        self.assertLess(reads[0]["bytes_out"], len(data) + 1024)


class TreeTests(FilesCase):
    @inlineCallbacks
    def test_list(self) -> Any:
        """Listing gives name/path/type/size/modified; depth and hidden work; missing dir 404."""
        self.put("d/a.txt", b"abc")
        self.put("d/.h", b"")
        self.put("d/sub/deep.txt", b"")
        reply = yield self.get("/files/list", "d")
        self.assertEqual(reply.status, 200)
        entries = reply.json()["entries"]
        self.assertEqual([e["name"] for e in entries], [".h", "a.txt", "sub"])
        a = entries[1]
        self.assertEqual(
            (a["type"], a["size"], a["path"]),
            ("file", 3, os.path.join(self.base_dir, "d/a.txt")),
        )
        self.assertTrue(a["modified"].endswith("+00:00"))
        self.assertFalse(reply.json()["truncated"])
        reply = yield self.request("GET", "/files/list?path=d&depth=2&hidden=false")
        self.assertEqual(
            [e["name"] for e in reply.json()["entries"]], ["a.txt", "sub", "deep.txt"]
        )
        reply = yield self.get("/files/list", "nope")
        self.assertEqual(reply.status, 404)
        reply = yield self.request("GET", "/files/list?depth=11")
        self.assertEqual(reply.status, 400)
        reply = yield self.request("GET", "/files/list")
        self.assertEqual(reply.json()["path"], self.base_dir)

    @inlineCallbacks
    def test_stat(self) -> Any:
        """stat reports an existing file, and exists=false (200) for a missing path inside."""
        path = self.put("s.txt", b"12")
        os.chmod(path, 0o640)
        reply = yield self.get("/files/stat", "s.txt")
        body = reply.json()
        self.assertEqual(
            (body["type"], body["size"], body["permissions"], body["exists"]),
            ("file", 2, "640", True),
        )
        # The seed's other times: access and inode change, ISO 8601 UTC.
        st = os.stat(path)
        self.assertEqual(
            (body["accessed"], body["created"]),
            (walk.iso_time(st.st_atime), walk.iso_time(st.st_ctime)),
        )
        # With microseconds, as the seed gives them: an edit in the same
        # second shows.
        os.utime(path, ns=(1_790_000_000_446_213_000, 1_790_000_000_446_213_000))
        for endpoint in ("/files/stat", "/files/list"):
            reply = yield self.get(endpoint, "s.txt" if "stat" in endpoint else ".")
            body = reply.json()
            if "entries" in body:
                body = next(e for e in body["entries"] if e["name"] == "s.txt")
            self.assertEqual(body["modified"], "2026-09-21T14:13:20.446213+00:00")
        reply = yield self.get("/files/stat", "missing")
        self.assertEqual(reply.status, 200)
        self.assertEqual(
            reply.json(),
            {
                "name": "missing",
                "path": os.path.join(self.base_dir, "missing"),
                "type": "unknown",
                "size": 0,
                "permissions": "",
                "modified": "",
                "accessed": "",
                "created": "",
                "exists": False,
            },
        )

    @inlineCallbacks
    def test_move_into_a_directory_names_the_entry_in_the_way(self) -> Any:
        """
        A move into a directory that already holds the name is 409, and the
        message names that entry, not the directory it was moved into.
        """
        self.put("app.py")
        self.put("dest/app.py", b"kept")
        reply = yield self.request(
            "POST",
            "/files/move",
            {"source": "app.py", "destination": "dest", "overwrite": False},
        )
        self.assertEqual((reply.status, reply.json()["code"]), (409, "file_exists"))
        self.assertEqual(reply.json()["error"], "destination: File exists: dest/app.py")
        self.assertEqual(self.read("dest/app.py"), b"kept")

    @inlineCallbacks
    def test_move_onto_a_link_to_a_directory_moves_into_it(self) -> Any:
        """
        A move onto a link to a directory (``cur -> real``) puts the file in
        that directory, with or without overwrite, as mv does; the link
        stays a link.  A link to a directory the path rules do not allow is
        403 and neither it nor the file changes, even with overwrite; a link
        to a file is still replaced only with overwrite.
        """
        os.makedirs(os.path.join(self.base_dir, "rel/real"))
        os.symlink("real", os.path.join(self.base_dir, "rel/cur"))
        self.put("a.txt", b"a")
        self.put("b.txt", b"b")
        for name, overwrite in (("a.txt", False), ("b.txt", True)):
            reply = yield self.request(
                "POST",
                "/files/move",
                {"source": name, "destination": "rel/cur", "overwrite": overwrite},
            )
            self.assertEqual(reply.status, 200, reply.body)
            self.assertEqual(
                reply.json()["destination"],
                os.path.join(self.base_dir, "rel/real", name),
            )
        self.assertEqual(os.readlink(os.path.join(self.base_dir, "rel/cur")), "real")
        self.assertEqual(self.read("rel/real/a.txt"), b"a")
        self.assertEqual(self.read("rel/real/b.txt"), b"b")
        outside = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, outside)
        os.symlink(outside, os.path.join(self.base_dir, "out"))
        self.put("c.txt", b"c")
        for overwrite in (False, True):
            reply = yield self.request(
                "POST",
                "/files/move",
                {"source": "c.txt", "destination": "out", "overwrite": overwrite},
            )
            self.assertEqual(
                (reply.status, reply.json()["code"]), (403, "path_not_allowed")
            )
            self.assertTrue(reply.json()["error"].startswith("destination:"))
        self.assertEqual(os.readlink(os.path.join(self.base_dir, "out")), outside)
        self.assertEqual((self.read("c.txt"), os.listdir(outside)), (b"c", []))
        os.symlink("c.txt", os.path.join(self.base_dir, "tofile"))
        self.put("d.txt", b"d")
        reply = yield self.request(
            "POST", "/files/move", {"source": "d.txt", "destination": "tofile"}
        )
        self.assertEqual((reply.status, reply.json()["code"]), (409, "file_exists"))

    @inlineCallbacks
    def test_mkdir_delete_move(self) -> Any:
        """
        mkdir with parents (twice is fine), delete recursively, move with
        prefixes and 404; the base dir itself is never deleted.
        """
        reply = yield self.request("POST", "/files/mkdir", {"path": "m/n/o"})
        self.assertEqual(
            reply.json(),
            {"path": os.path.join(self.base_dir, "m/n/o"), "created": True},
        )
        reply = yield self.request("POST", "/files/mkdir", {"path": "m/n/o"})
        self.assertEqual(reply.status, 200)
        self.put("m/n/o/f.txt")
        reply = yield self.request(
            "POST", "/files/move", {"source": "m/n/o/f.txt", "destination": "g.txt"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            reply.json()["destination"], os.path.join(self.base_dir, "g.txt")
        )
        self.assertEqual(self.read("g.txt"), b"hello")
        reply = yield self.request(
            "POST", "/files/move", {"source": "nope", "destination": "x"}
        )
        self.assertEqual(reply.status, 404)
        self.assertTrue(reply.json()["error"].startswith("source:"))
        reply = yield self.request(
            "POST", "/files/move", {"source": "g.txt", "destination": "/etc/passwd"}
        )
        self.assertEqual(reply.status, 403)
        self.assertTrue(reply.json()["error"].startswith("destination:"))
        self.put("h.txt")
        reply = yield self.request(
            "POST", "/files/move", {"source": "g.txt", "destination": "h.txt"}
        )
        self.assertEqual(reply.status, 409)
        reply = yield self.request(
            "POST",
            "/files/move",
            {"source": "g.txt", "destination": "h.txt", "overwrite": True},
        )
        self.assertEqual(reply.status, 200)
        reply = yield self.request(
            "POST", "/files/move", {"source": "h.txt", "destination": "m"}
        )
        self.assertEqual(
            reply.json()["destination"], os.path.join(self.base_dir, "m/h.txt")
        )
        reply = yield self.request("DELETE", "/files?path=m")
        self.assertEqual(
            reply.json(), {"path": os.path.join(self.base_dir, "m"), "deleted": True}
        )
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "m")))
        reply = yield self.request("DELETE", "/files?path=m")
        self.assertEqual(reply.status, 404)
        self.put("kept.txt")
        reply = yield self.request(
            "DELETE", "/files?path=" + quote(self.base_dir, safe="")
        )
        # The base dir is inside the boundary, not outside it: denied,
        # saying why, as the seed says it (was: path_not_allowed, "outside
        # the allowed area").
        self.assertEqual(
            (reply.status, reply.json()["code"], reply.json()["error"]),
            (
                403,
                "path_denied",
                f"the base dir itself cannot be removed: {self.base_dir}",
            ),
        )
        self.assertEqual(self.read("kept.txt"), b"hello")

    @inlineCallbacks
    def test_move_onto_itself(self) -> Any:
        """
        A file or a directory moved onto itself (by any spelling of its
        path) is a 200 that changes nothing, as on the seed (was: 409
        file_exists for a file, 400 for a directory); a file named with a
        trailing slash is still 400.
        """
        self.put("a.txt", b"same")
        self.put("d/in.txt", b"inside")
        for source, destination, where in (
            ("a.txt", "a.txt", "a.txt"),
            ("a.txt", "./a.txt", "a.txt"),
            (os.path.join(self.base_dir, "a.txt"), "a.txt", "a.txt"),
            ("d", "d", "d"),
            ("d", "d/", "d"),
        ):
            reply = yield self.request(
                "POST", "/files/move", {"source": source, "destination": destination}
            )
            self.assertEqual(reply.status, 200, (source, destination, reply.body))
            full = os.path.join(self.base_dir, where)
            self.assertEqual(reply.json(), {"source": full, "destination": full})
        self.assertEqual(sorted(os.listdir(self.base_dir)), ["a.txt", "d"])
        self.assertEqual(self.read("a.txt"), b"same")
        self.assertEqual(os.listdir(os.path.join(self.base_dir, "d")), ["in.txt"])
        reply = yield self.request(
            "POST", "/files/move", {"source": "a.txt", "destination": "a.txt/"}
        )
        self.assertEqual(reply.status, 400)

    @inlineCallbacks
    def test_move_onto_a_name_ending_in_a_slash(self) -> Any:
        """
        A destination ending in ``/`` names a directory, as it does to mv:
        into it when it is one, else 400 with nothing moved or made.
        """
        self.put("f.txt")
        self.put("kept.txt", b"kept")
        os.makedirs(os.path.join(self.base_dir, "d"))
        for destination in ("new/", "deep/er/", "kept.txt/"):
            reply = yield self.request(
                "POST", "/files/move", {"source": "f.txt", "destination": destination}
            )
            self.assertEqual(
                (reply.status, reply.json()["code"]),
                (400, "invalid_param"),
                destination,
            )
            self.assertTrue(
                reply.json()["error"].startswith("destination: Not a directory")
            )
        self.assertEqual(sorted(os.listdir(self.base_dir)), ["d", "f.txt", "kept.txt"])
        self.assertEqual(self.read("kept.txt"), b"kept")
        reply = yield self.request(
            "POST", "/files/move", {"source": "f.txt", "destination": "d/"}
        )
        self.assertEqual(
            reply.json()["destination"], os.path.join(self.base_dir, "d/f.txt")
        )

    @inlineCallbacks
    def test_delete_or_move_a_file_named_with_a_slash(self) -> Any:
        """
        ``f.txt/`` names a directory: deleting or moving it is 400 and the
        file stays, as rm and mv leave it; a link to a directory named so
        is not followed into either.
        """
        self.put("f.txt", b"f")
        os.makedirs(os.path.join(self.base_dir, "d"))
        self.put("d/inside.txt")
        os.symlink("d", os.path.join(self.base_dir, "link"))
        for path in ("f.txt/", "link/"):
            reply = yield self.request("DELETE", "/files?path=" + quote(path))
            self.assertEqual(
                (reply.status, reply.json()["code"]), (400, "invalid_param")
            )
            reply = yield self.request(
                "POST", "/files/move", {"source": path, "destination": "g.txt"}
            )
            self.assertEqual(
                (reply.status, reply.json()["code"]), (400, "invalid_param")
            )
        self.assertEqual(sorted(os.listdir(self.base_dir)), ["d", "f.txt", "link"])
        self.assertEqual(os.listdir(os.path.join(self.base_dir, "d")), ["inside.txt"])
        reply = yield self.request("DELETE", "/files?path=d/")
        self.assertEqual(reply.status, 200, reply.body)

    @inlineCallbacks
    def test_write_to_a_name_ending_in_a_slash(self) -> Any:
        """
        A file written to ``new/`` (or ``p/new/``) is refused as a directory,
        as open() refuses it, by every write route, saying what is wrong
        (the trailing slash; was "Is a directory" of a directory that is
        not there): no file ``new``, no parent made for it.  A slash after
        a directory that is there is "Is a directory" still.
        """
        for method, route, body, raw in (
            ("POST", "/files/raw?path=p/new1/", None, b"x"),
            ("POST", "/upload", {"path": "p/new2/", "content_base64": b64(b"x")}, None),
            (
                "POST",
                "/files/upload-stream",
                {"path": "p/new3/", "content_base64": b64(b"x")},
                None,
            ),
        ):
            reply = yield self.request(method, route, body, raw_body=raw)
            self.assertEqual(
                (reply.status, reply.json()["type"]), (400, "IsADirectoryError"), route
            )
            self.assertIn("ends in '/', which names a directory", reply.json()["error"])
        self.assertEqual(os.listdir(self.base_dir), [])
        os.mkdir(os.path.join(self.base_dir, "there"))
        reply = yield self.request(
            "POST",
            "/files/upload-stream",
            {"path": "there/", "content_base64": b64(b"x")},
        )
        self.assertEqual(
            (reply.status, reply.json()["error"]),
            (400, "Is a directory: there/"),
        )

    @inlineCallbacks
    def test_search(self) -> Any:
        """Search matches names recursively, caps results, and rejects over-long patterns."""
        for i in range(5):
            self.put(f"s/d{i}/f{i}.py")
        self.put("s/readme.md")
        reply = yield self.request(
            "POST", "/files/search", {"path": "s", "pattern": "*.py"}
        )
        body = reply.json()
        self.assertEqual(
            sorted(r["name"] for r in body["results"]), [f"f{i}.py" for i in range(5)]
        )
        self.assertEqual((body["timed_out"], body["truncated"]), (False, False))
        reply = yield self.request(
            "POST", "/files/search", {"path": "s", "pattern": "*.py", "max_results": 2}
        )
        self.assertEqual(
            (len(reply.json()["results"]), reply.json()["truncated"]), (2, True)
        )
        reply = yield self.request("POST", "/files/search", {"pattern": "[" * 5000})
        self.assertEqual(reply.status, 400)
        reply = yield self.request("POST", "/files/search", {})
        self.assertEqual(reply.status, 400)

    @inlineCallbacks
    def test_link_loops_are_listed(self) -> Any:
        """
        Links that lead to each other (a loop, inside the base) are listed
        and found as symlinks, as a dangling link is, so that an agent can
        see them and delete them.
        """
        os.makedirs(os.path.join(self.base_dir, "loop"))
        os.symlink("b", os.path.join(self.base_dir, "loop", "a"))
        os.symlink("a", os.path.join(self.base_dir, "loop", "b"))
        reply = yield self.request("GET", "/files/list?path=loop")
        self.assertEqual(
            [(e["name"], e["type"]) for e in reply.json()["entries"]],
            [("a", "symlink"), ("b", "symlink")],
        )
        reply = yield self.request(
            "POST", "/files/search", {"path": "loop", "pattern": "*"}
        )
        self.assertEqual([r["name"] for r in reply.json()["results"]], ["a", "b"])

    @inlineCallbacks
    def test_search_path_globs(self) -> Any:
        """
        A path glob's leading ``**/`` finds what the name pattern finds; a
        pattern still holding ``/`` (which no name can match) is 400 with a
        hint, not an empty result; grep's include is taken the same way.
        """
        for i in range(3):
            self.put(f"s/d{i}/f{i}.py", b"hit\n")
        reply = yield self.request(
            "POST", "/files/search", {"path": "s", "pattern": "**/*.py"}
        )
        self.assertEqual(len(reply.json()["results"]), 3)
        reply = yield self.request(
            "POST", "/files/search", {"path": "s", "pattern": "d1/*.py"}
        )
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_param"))
        self.assertIn("not paths", reply.json()["error"])
        reply = yield self.request(
            "POST", "/files/grep", {"path": "s", "pattern": "hit", "include": "**/*.py"}
        )
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.json()["files_matched"], 3)


class SeedFormTests(FilesCase):
    """The seed's file options and answers, which its SDK depends on."""

    @inlineCallbacks
    def test_list_recursive(self) -> Any:
        """
        recursive=true lists three levels deep (each directory followed by
        its entries) unless depth says otherwise; max_entries cuts the list.
        """
        for rel in ("d/a.txt", "d/s1/b.txt", "d/s1/s2/c.txt", "d/s1/s2/s3/e.txt"):
            self.put(rel)
        reply = yield self.request("GET", "/files/list?path=d&recursive=true")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            [e["name"] for e in reply.json()["entries"]],
            ["a.txt", "s1", "b.txt", "s2", "c.txt", "s3"],
        )
        reply = yield self.request("GET", "/files/list?path=d&recursive=true&depth=2")
        self.assertEqual(
            [e["name"] for e in reply.json()["entries"]], ["a.txt", "s1", "b.txt", "s2"]
        )
        reply = yield self.request("GET", "/files/list?path=d&recursive=false")
        self.assertEqual([e["name"] for e in reply.json()["entries"]], ["a.txt", "s1"])
        reply = yield self.request(
            "GET", "/files/list?path=d&recursive=true&max_entries=3"
        )
        body = reply.json()
        self.assertEqual(
            ([e["name"] for e in body["entries"]], body["truncated"]),
            (["a.txt", "s1", "b.txt"], True),
        )
        for bad in ("recursive=maybe", "max_entries=0", "max_entries=x"):
            reply = yield self.request("GET", f"/files/list?path=d&{bad}")
            self.assertEqual(reply.status, 400, bad)

    @inlineCallbacks
    def test_search_max_depth(self) -> Any:
        """max_depth 1 matches the directory's own entries; 2 one level below."""
        for rel in ("s/a.py", "s/x/b.py", "s/x/y/c.py"):
            self.put(rel)
        found = []
        for depth in (1, 2, 1000):
            reply = yield self.request(
                "POST",
                "/files/search",
                {"path": "s", "pattern": "*.py", "max_depth": depth},
            )
            self.assertEqual(reply.status, 200, reply.body)
            found.append(sorted(r["name"] for r in reply.json()["results"]))
        self.assertEqual(found, [["a.py"], ["a.py", "b.py"], ["a.py", "b.py", "c.py"]])
        reply = yield self.request(
            "POST", "/files/search", {"path": "s", "pattern": "*", "max_depth": 0}
        )
        self.assertEqual(reply.status, 400)

    @inlineCallbacks
    def test_download_stream_of_a_directory(self) -> Any:
        """A directory is 404 FileNotFoundError, as a missing file is."""
        os.mkdir(os.path.join(self.base_dir, "d"))
        reply = yield self.get("/files/download-stream", "d")
        self.assertEqual(
            (reply.status, reply.json()["type"], reply.json()["code"]),
            (404, "FileNotFoundError", "not_found"),
        )

    @inlineCallbacks
    def test_archive_member_names(self) -> Any:
        """
        A file is named by its name, a directory's files below the
        directory's own name (however deep it was asked for); directories
        are not members of their own.
        """
        self.put("top/a.txt", b"A")
        self.put("top/deep/tree/b.txt", b"B")
        self.put("top/deep/tree/sub/c.txt", b"C")
        os.makedirs(os.path.join(self.base_dir, "top/deep/tree/empty"))
        for fmt in ("tar.gz", "zip"):
            reply = yield self.request(
                "POST",
                "/files/archive",
                {"paths": ["top/deep/tree", "top/a.txt"], "format": fmt},
            )
            self.assertEqual(reply.status, 200, reply.body)
            data = base64.b64decode(reply.json()["content_base64"])
            if fmt == "zip":
                names = zipfile.ZipFile(io.BytesIO(data)).namelist()
            else:
                names = tarfile.open(fileobj=io.BytesIO(data)).getnames()
            self.assertEqual(names, ["tree/b.txt", "tree/sub/c.txt", "a.txt"], fmt)

    @inlineCallbacks
    def test_archive_says_what_it_left_out(self) -> Any:
        """
        Named pipes and sockets have no content to pack: an archive of a
        directory holding only those is empty and says how many it left
        out; listing and stat call them type other.
        """
        os.makedirs(os.path.join(self.base_dir, "sp"))
        os.mkfifo(os.path.join(self.base_dir, "sp", "fifo"))
        os.mknod(os.path.join(self.base_dir, "sp", "sock"), stat.S_IFSOCK | 0o600)
        reply = yield self.request("POST", "/files/archive", {"paths": ["sp"]})
        self.assertEqual(reply.status, 200, reply.body)
        data = base64.b64decode(reply.json()["content_base64"])
        self.assertEqual(tarfile.open(fileobj=io.BytesIO(data)).getnames(), [])
        self.assertEqual(reply.json()["skipped"], 2)
        self.put("sp2/a.txt")
        reply = yield self.request("POST", "/files/archive", {"paths": ["sp2"]})
        self.assertEqual(reply.json()["skipped"], 0)
        reply = yield self.get("/files/stat", "sp/fifo")
        self.assertEqual(reply.json()["type"], "other")

    @inlineCallbacks
    def test_name_not_utf8_by_its_bytes(self) -> Any:
        """
        A name that is not UTF-8 is reached by its bytes percent-encoded in
        a query (stat, raw read, delete); the file whose name spells the
        same ``\\xNN`` escapes with backslashes is a different file.
        """
        base = os.fsencode(self.base_dir)
        latin = os.path.join(base, b"r\xe9sum\xe9.txt")
        spelled = os.path.join(base, b"r\\xe9sum\\xe9.txt")
        for path, data in ((latin, b"latin-1 name"), (spelled, b"backslashes")):
            with open(path, "wb") as f:
                f.write(data)
        query = "path=r%E9sum%E9.txt"
        reply = yield self.request("GET", f"/files/stat?{query}")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual((reply.json()["exists"], reply.json()["size"]), (True, 12))
        reply = yield self.request("GET", f"/files/raw?{query}")
        self.assertEqual((reply.status, reply.body), (200, b"latin-1 name"))
        reply = yield self.request("DELETE", f"/files?{query}")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertFalse(os.path.exists(latin))
        with open(spelled, "rb") as f:
            self.assertEqual(f.read(), b"backslashes")

    @inlineCallbacks
    def test_archive_names_not_utf8(self) -> Any:
        """
        A name that is not UTF-8 is stored: in a tar as its bytes, in a zip
        (whose names are UTF-8) as files_list shows it; a link's target too.
        """
        folder = os.path.join(self.base_dir, "odd")
        os.makedirs(folder)
        with open(os.path.join(os.fsencode(folder), b"bad\xffname"), "wb") as f:
            f.write(b"data")
        os.symlink(b"bad\xffname", os.path.join(os.fsencode(folder), b"link\xfe"))
        for fmt in ("tar.gz", "zip"):
            reply = yield self.request(
                "POST", "/files/archive", {"paths": ["odd"], "format": fmt}
            )
            self.assertEqual(reply.status, 200, reply.body)
            data = base64.b64decode(reply.json()["content_base64"])
            if fmt == "zip":
                archive = zipfile.ZipFile(io.BytesIO(data))
                self.assertEqual(
                    sorted(archive.namelist()), ["odd/bad\\xffname", "odd/link\\xfe"]
                )
                self.assertEqual(archive.read("odd/bad\\xffname"), b"data")
                self.assertEqual(archive.read("odd/link\\xfe"), b"bad\xffname")
            else:
                members = tarfile.open(fileobj=io.BytesIO(data)).getmembers()
                self.assertEqual(
                    sorted(os.fsencode(m.name) for m in members),
                    [b"odd/bad\xffname", b"odd/link\xfe"],
                )


class _CountingTransport(StringTransport):
    """A connection that counts the writes it is handed."""

    writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        super().write(data)


class SmallStreamedDownloadTests(SynchronousTestCase):
    """``/files/download-stream`` of a small file is answered in one write."""

    def setUp(self) -> None:
        self.base = os.path.realpath(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.base)
        self.site = memory_site(memory_context(base_dir=self.base))

    def fetch(self, name: str) -> tuple[int, bytes]:
        protocol = self.site.buildProtocol(None)
        transport = _CountingTransport()
        protocol.makeConnection(transport)
        protocol.dataReceived(
            f"GET /files/download-stream?path={name} HTTP/1.1\r\n"
            "Host: localhost\r\n\r\n".encode()
        )
        written = transport.value()
        protocol.connectionLost(None)
        return transport.writes, written

    def test_small_file_one_write(self) -> None:
        """Head, JSON and base64 of a 1 KiB file leave in one write, with the length they fill exactly."""
        data = os.urandom(1024)
        with open(os.path.join(self.base, "k.bin"), "wb") as f:
            f.write(data)
        writes, raw = self.fetch("k.bin")
        self.assertEqual(writes, 1)
        head, _, body = raw.partition(b"\r\n\r\n")
        self.assertIn(b"\r\nContent-Length: %d" % len(body), head)
        answer = json.loads(body)
        self.assertEqual(
            (answer["bytes"], base64.b64decode(answer["content_base64"])),
            (1024, data),
        )
        self.assertEqual(list(answer), ["path", "etag", "content_base64", "bytes"])


class DownloadLinesTests(FilesCase):
    """``GET /download`` with ``offset`` and ``limit``: some lines of a file."""

    policy = {"endpoints": {"download": {"limits": {"max_bytes": 65536}}}}

    @inlineCallbacks
    def test_lines(self) -> Any:
        """
        Those lines (newlines kept), where they lie, and whether more
        follow; a negative offset counts from the end.
        """
        self.put("log.txt", b"".join(b"line %d\n" % n for n in range(1, 101)))
        reply = yield self.request("GET", "/download?path=log.txt&offset=10&limit=3")
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertEqual(
            base64.b64decode(body["content_base64"]), b"line 10\nline 11\nline 12\n"
        )
        self.assertEqual(
            (body["offset"], body["lines"], body["total_lines"], body["more"]),
            (10, 3, 100, True),
        )
        reply = yield self.request("GET", "/download?path=log.txt&offset=-2")
        body = reply.json()
        self.assertEqual(
            base64.b64decode(body["content_base64"]), b"line 99\nline 100\n"
        )
        self.assertEqual((body["offset"], body["more"]), (99, False))
        whole = yield self.get("/download", "log.txt")
        self.assertNotIn("offset", whole.json())
        self.assertEqual(whole.json()["etag"], body["etag"])

    @inlineCallbacks
    def test_tail_of_a_file_over_max_bytes(self) -> Any:
        """
        A file over max_bytes still gives its lines: the bound is on the lines
        sent (413 for too many of them, a whole download still 413).
        """
        self.put("big.log", b"".join(b"entry %05d\n" % n for n in range(1, 20001)))
        reply = yield self.request("GET", "/download?path=big.log&offset=-3")
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertEqual(
            base64.b64decode(body["content_base64"]),
            b"entry 19998\nentry 19999\nentry 20000\n",
        )
        self.assertEqual((body["offset"], body["total_lines"]), (19998, 20000))
        reply = yield self.request("GET", "/download?path=big.log&offset=5000&limit=1")
        self.assertEqual(
            base64.b64decode(reply.json()["content_base64"]), b"entry 05000\n"
        )
        reply = yield self.request("GET", "/download?path=big.log&offset=1&limit=10000")
        self.assertEqual(
            (reply.status, reply.json()["code"]), (413, "payload_too_large")
        )
        self.assertIn("limit", reply.json()["error"])
        whole = yield self.get("/download", "big.log")
        self.assertEqual(whole.status, 413)

    @inlineCallbacks
    def test_bad_lines(self) -> Any:
        """An offset of 0, a limit below 1 or not a number is 400 invalid_param."""
        self.put("a.txt", b"a\n")
        for query in ("offset=0", "limit=0", "offset=x", "limit=-3"):
            reply = yield self.request("GET", f"/download?path=a.txt&{query}")
            self.assertEqual(
                (reply.status, reply.json()["code"]), (400, "invalid_param"), query
            )


class ChmodTests(FilesCase):
    """``POST /files/chmod``: permission bits, and nothing else."""

    def chmod(self, path: str, mode: Any) -> Any:
        return self.request("POST", "/files/chmod", {"path": path, "mode": mode})

    def mode_of(self, rel: str) -> int:
        return stat.S_IMODE(os.stat(os.path.join(self.base_dir, rel)).st_mode)

    @inlineCallbacks
    def test_file_directory_and_link(self) -> Any:
        """
        Text or number; a directory too; a link inside the boundary changes
        its target (the answer names it).
        """
        path = self.put("run.sh", b"#!/bin/sh\necho hi\n")
        os.chmod(path, 0o644)
        reply = yield self.chmod("run.sh", "755")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json(), {"path": path, "mode": "755"})
        self.assertEqual(self.mode_of("run.sh"), 0o755)
        os.mkdir(os.path.join(self.base_dir, "d"))
        reply = yield self.chmod("d", 0o700)
        self.assertEqual((reply.status, self.mode_of("d")), (200, 0o700))
        os.symlink("run.sh", os.path.join(self.base_dir, "link"))
        reply = yield self.chmod("link", "600")
        self.assertEqual(reply.json()["path"], path)
        self.assertEqual(self.mode_of("run.sh"), 0o600)

    @inlineCallbacks
    def test_refusals(self) -> Any:
        """
        Set-user-ID and other bits past 777, a bad mode, a missing file,
        the base dir itself, and a link leading out are refused; nothing
        changes.
        """
        path = self.put("a.txt")
        os.chmod(path, 0o644)
        outside = tempfile.NamedTemporaryFile(delete=False)
        self.addCleanup(os.unlink, outside.name)
        os.chmod(outside.name, 0o644)
        os.symlink(outside.name, os.path.join(self.base_dir, "out"))
        for rel, mode, status, code in [
            ("a.txt", "4755", 400, "invalid_param"),
            ("a.txt", 0o2755, 400, "invalid_param"),
            ("a.txt", "rwx", 400, "invalid_param"),
            ("a.txt", None, 400, "invalid_param"),
            ("a.txt", True, 400, "invalid_param"),
            ("missing.txt", "755", 404, "not_found"),
            (".", "700", 403, "path_not_allowed"),
            ("out", "777", 403, "path_not_allowed"),
        ]:
            reply = yield self.chmod(rel, mode)
            self.assertEqual(
                (reply.status, reply.json()["code"]), (status, code), (rel, mode)
            )
        self.assertEqual(self.mode_of("a.txt"), 0o644)
        self.assertEqual(stat.S_IMODE(os.stat(outside.name).st_mode), 0o644)
        self.assertNotEqual(stat.S_IMODE(os.stat(self.base_dir).st_mode), 0o700)
