"""
Resumable uploads (``files_uploads_*``) against a real daemon in a
temporary base dir: the staging file, appends by offset, a cut connection
that keeps what arrived, the bounds.
"""

from __future__ import annotations

import hashlib
import os
import socket
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import Clock, deferLater
from twisted.internet.threads import deferToThread

from sandboxd.files.atomic import TEMPORARY_NAME
from tests.helpers import DaemonTestCase, unnamed_files


def _send_part(port: int, path: str, length: int, part: bytes, token: str) -> None:
    """
    POST ``path`` declaring ``length`` body bytes, send only ``part`` and
    end the stream: a connection cut mid-body.
    """
    with socket.socket() as s:
        s.settimeout(20)
        s.connect(("127.0.0.1", port))
        s.sendall(
            (
                f"POST {path} HTTP/1.1\r\nHost: localhost\r\n"
                f"X-Access-Token: {token}\r\n"
                f"Content-Type: application/octet-stream\r\n"
                f"Content-Length: {length}\r\n\r\n"
            ).encode()
            + part
        )
        # The end of the stream, then wait until the daemon closes its side
        # (it has seen the cut by then).
        s.shutdown(socket.SHUT_WR)
        try:
            while s.recv(65536):
                pass
        except ConnectionResetError:
            pass


def _open_part(
    port: int, path: str, length: int, part: bytes, token: str
) -> socket.socket:
    """As :func:`_send_part`, but the connection stays open (the append runs on)."""
    s = socket.socket()
    s.settimeout(20)
    s.connect(("127.0.0.1", port))
    s.sendall(
        (
            f"POST {path} HTTP/1.1\r\nHost: localhost\r\n"
            f"X-Access-Token: {token}\r\n"
            f"Content-Length: {length}\r\n\r\n"
        ).encode()
        + part
    )
    return s


class UploadCase(DaemonTestCase):
    token = "uploads-test-token"

    def staging(self, where: str = "") -> list[str]:
        """
        The daemon's temporary files in ``where`` (below the base dir): its
        hidden names, or, where they have none yet (``O_TMPFILE``), the
        ``/proc`` paths of the daemon's descriptors of them (this process's:
        the daemon runs in it).
        """
        directory = os.path.join(self.base_dir, where)
        names = os.listdir(directory)
        named = [n for n in names if TEMPORARY_NAME.match(n)]
        return named + [
            f
            for f in unnamed_files(directory)
            if os.path.dirname(os.readlink(f)) == os.path.realpath(directory)
        ]

    def read(self, rel: str) -> bytes:
        with open(os.path.join(self.base_dir, rel), "rb") as f:
            return f.read()

    def put(self, rel: str, data: bytes) -> None:
        with open(os.path.join(self.base_dir, rel), "wb") as f:
            f.write(data)

    def create(self, path: str, size: int, **fields: Any) -> Any:
        return self.request(
            "POST", "/files/uploads", {"path": path, "size": size, **fields}
        )

    def append(self, upload_id: str, offset: int, data: bytes, **kw: Any) -> Any:
        return self.request(
            "POST",
            f"/files/uploads/{upload_id}?offset={offset}",
            raw_body=data,
            headers={"Content-Type": "application/octet-stream"},
            **kw,
        )

    @inlineCallbacks
    def wait_offset(self, upload_id: str, above: int) -> Any:
        """GET the upload until its offset passes ``above`` (5 s at most)."""
        for _ in range(100):
            reply = yield self.request("GET", f"/files/uploads/{upload_id}")
            if reply.status != 200 or reply.json()["offset"] > above:
                return reply
            yield deferLater(reactor, 0.05, lambda: None)
        return reply


class HappyPathTests(UploadCase):
    @inlineCallbacks
    def test_create_append_complete(self) -> Any:
        """
        Create, two appends, done: 201 with offset 0, the partial answer in
        between, then the file in place with its sha256 and no staging file.
        """
        data = os.urandom(300_000)
        reply = yield self.create("sub/big.bin", len(data), mode="600")
        self.assertEqual(reply.status, 201, reply.body)
        record = reply.json()
        self.assertEqual((record["offset"], record["size"]), (0, len(data)))
        self.assertEqual(record["path"], os.path.join(self.base_dir, "sub/big.bin"))
        self.assertEqual(record["requested_path"], "sub/big.bin")
        self.assertIn("expires_at", record)
        uid = record["upload_id"]
        self.assertEqual(len(self.staging("sub")), 1)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "sub/big.bin")))

        reply = yield self.append(uid, 0, data[:100_000])
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            reply.json(),
            {"upload_id": uid, "offset": 100_000, "size": len(data), "complete": False},
        )
        reply = yield self.request("GET", f"/files/uploads/{uid}")
        self.assertEqual(reply.json()["offset"], 100_000)

        reply = yield self.append(uid, 100_000, data[100_000:])
        self.assertEqual(reply.status, 200, reply.body)
        done = reply.json()
        self.assertTrue(done["complete"])
        self.assertEqual(done["bytes"], len(data))
        self.assertEqual(done["sha256"], hashlib.sha256(data).hexdigest())
        self.assertIn("etag", done)
        self.assertEqual(self.read("sub/big.bin"), data)
        mode = os.stat(os.path.join(self.base_dir, "sub/big.bin")).st_mode & 0o777
        self.assertEqual(mode, 0o600)
        self.assertEqual(self.staging("sub"), [])
        reply = yield self.request("GET", f"/files/uploads/{uid}")
        self.assertEqual(reply.status, 404)

    @inlineCallbacks
    def test_delete_removes_staging(self) -> Any:
        """DELETE answers deleted: true, removes the staging file, leaves the target as it was."""
        self.put("keep.txt", b"old")
        reply = yield self.create("keep.txt", 10)
        self.assertEqual(reply.status, 201, reply.body)
        uid = reply.json()["upload_id"]
        yield self.append(uid, 0, b"12345")
        reply = yield self.request("DELETE", f"/files/uploads/{uid}")
        self.assertEqual(reply.json(), {"upload_id": uid, "deleted": True})
        self.assertEqual(self.staging(), [])
        self.assertEqual(self.read("keep.txt"), b"old")
        reply = yield self.append(uid, 5, b"67890")
        self.assertEqual(reply.status, 404)

    @inlineCallbacks
    def test_target_untouched_until_complete(self) -> Any:
        """An existing file keeps its old content until the last byte is in."""
        self.put("t.txt", b"old content")
        reply = yield self.create("t.txt", 6)
        uid = reply.json()["upload_id"]
        yield self.append(uid, 0, b"new")
        self.assertEqual(self.read("t.txt"), b"old content")
        reply = yield self.append(uid, 3, b"NEW")
        self.assertTrue(reply.json()["complete"])
        self.assertEqual(self.read("t.txt"), b"newNEW")


class StagingHiddenTests(UploadCase):
    """A cut upload's staging file is not in the listings of its directory."""

    @inlineCallbacks
    def test_not_listed_or_found(self) -> Any:
        """files_list (hidden files included), files_search and archives leave it out."""
        os.makedirs(os.path.join(self.base_dir, "d"))
        self.put("d/kept.txt", b"k")
        reply = yield self.create("d/big.bin", 10)
        uid = reply.json()["upload_id"]
        yield self.append(uid, 0, b"12345")
        self.assertEqual(len(self.staging("d")), 1)  # it is on disk
        listing = yield self.request("GET", "/files/list?path=d&hidden=true")
        names = [e["name"] for e in listing.json()["entries"]]
        self.assertEqual(names, ["kept.txt"])
        found = yield self.request(
            "POST", "/files/search", {"path": "d", "pattern": "*"}
        )
        self.assertEqual([r["name"] for r in found.json()["results"]], ["kept.txt"])


class RefusalTests(UploadCase):
    policy = {
        "endpoints": {
            "files_uploads_create": {
                "limits": {"max_bytes": 1000},
                "paths": {"deny": ["**/secret*"]},
            }
        },
    }

    @inlineCallbacks
    def test_wrong_offset_is_400_and_writes_nothing(self) -> Any:
        """An append at another offset is 400 invalid_param carrying the current offset; the upload does not move."""
        reply = yield self.create("o.bin", 10)
        uid = reply.json()["upload_id"]
        yield self.append(uid, 0, b"abc")
        reply = yield self.append(uid, 1, b"XYZ")
        self.assertEqual(reply.status, 400, reply.body)
        self.assertEqual(
            (reply.json()["code"], reply.json()["offset"]), ("invalid_param", 3)
        )
        reply = yield self.append(uid, 5, b"XYZ")
        self.assertEqual((reply.status, reply.json()["offset"]), (400, 3))
        reply = yield self.request("GET", f"/files/uploads/{uid}")
        self.assertEqual(reply.json()["offset"], 3)
        reply = yield self.append(uid, 3, b"defghij")
        self.assertTrue(reply.json()["complete"])
        self.assertEqual(self.read("o.bin"), b"abcdefghij")

    @inlineCallbacks
    def test_bad_offset_and_unknown_id(self) -> Any:
        """A missing, negative or non-numeric offset is 400; an unknown id is 404 on every route."""
        reply = yield self.create("b.bin", 4)
        uid = reply.json()["upload_id"]
        for query in ("", "?offset=-1", "?offset=x", "?offset=1.5"):
            reply = yield self.request(
                "POST", f"/files/uploads/{uid}{query}", raw_body=b"ab"
            )
            self.assertEqual(
                (reply.status, reply.json()["code"]), (400, "invalid_param"), query
            )
        for method, path in (
            ("GET", "/files/uploads/nope"),
            ("POST", "/files/uploads/nope?offset=0"),
            ("DELETE", "/files/uploads/nope"),
        ):
            reply = yield self.request(
                method, path, raw_body=b"" if method == "POST" else None
            )
            self.assertEqual(
                (reply.status, reply.json()["code"]), (404, "not_found"), path
            )
        reply = yield self.request("GET", f"/files/uploads/{uid}")
        self.assertEqual(reply.json()["offset"], 0)

    @inlineCallbacks
    def test_append_past_size_is_413_and_writes_nothing(self) -> Any:
        """offset + Content-Length over size is 413 before a byte is written."""
        reply = yield self.create("s.bin", 4)
        uid = reply.json()["upload_id"]
        reply = yield self.append(uid, 0, b"12345")
        self.assertEqual(
            (reply.status, reply.json()["code"]), (413, "payload_too_large")
        )
        reply = yield self.request("GET", f"/files/uploads/{uid}")
        self.assertEqual(reply.json()["offset"], 0)
        [name] = self.staging()
        self.assertEqual(os.path.getsize(os.path.join(self.base_dir, name)), 0)

    @inlineCallbacks
    def test_create_refusals_create_nothing(self) -> Any:
        """
        size over max_bytes (413), a denied path (403), an existing file with
        overwrite false (409 file_exists), a bad mode (400): refused at
        create, and no staging file is left.
        """
        self.put("there.txt", b"x")
        reply = yield self.create("big.bin", 1001)
        self.assertEqual(
            (reply.status, reply.json()["code"]), (413, "payload_too_large")
        )
        reply = yield self.create("secret.txt", 3)
        self.assertEqual((reply.status, reply.json()["code"]), (403, "path_denied"))
        reply = yield self.create("../out.txt", 3)
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "path_not_allowed")
        )
        reply = yield self.create("there.txt", 3, overwrite=False)
        self.assertEqual((reply.status, reply.json()["code"]), (409, "file_exists"))
        reply = yield self.create("m.txt", 3, mode="999")
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_param"))
        reply = yield self.create("n.txt", -1)
        self.assertEqual(reply.status, 400)
        self.assertEqual(self.staging(), [])
        self.assertEqual(sorted(os.listdir(self.base_dir)), ["there.txt"])

    @inlineCallbacks
    def test_changed_file_at_completion_is_412(self) -> Any:
        """
        If-Match is checked again at the rename: a file changed meanwhile is
        412, keeps the other writer's bytes, and the upload is dropped.
        """
        self.put("e.txt", b"v1")
        reply = yield self.request("GET", "/files/stat?path=e.txt")
        reply = yield self.request("GET", "/files/raw?path=e.txt")
        etag = reply.header("etag")
        reply = yield self.create("e.txt", 4, if_match=etag)
        self.assertEqual(reply.status, 201, reply.body)
        uid = reply.json()["upload_id"]
        yield self.append(uid, 0, b"ab")
        os.utime(os.path.join(self.base_dir, "e.txt"), (1, 1))
        self.put("e.txt", b"v2 by another writer")
        reply = yield self.append(uid, 2, b"cd")
        self.assertEqual(
            (reply.status, reply.json()["code"]), (412, "precondition_failed")
        )
        self.assertEqual(self.read("e.txt"), b"v2 by another writer")
        self.assertEqual(self.staging(), [])
        reply = yield self.request("GET", f"/files/uploads/{uid}")
        self.assertEqual(reply.status, 404)


class CutTests(UploadCase):
    @inlineCallbacks
    def test_cut_mid_append_keeps_bytes(self) -> Any:
        """
        A connection closed after part of an append's body: the bytes that
        arrived are kept (GET shows an offset above 0, the target is still
        absent), and an append from there completes the file byte-exact.
        """
        data = os.urandom(2_000_000)
        reply = yield self.create("cut.bin", len(data))
        uid = reply.json()["upload_id"]
        yield deferToThread(
            _send_part,
            self.daemon.port,
            f"/files/uploads/{uid}?offset=0",
            len(data),
            data[:700_000],
            self.token,
        )
        reply = yield self.wait_offset(uid, 0)
        offset = reply.json()["offset"]
        self.assertGreater(offset, 0)
        self.assertLessEqual(offset, 700_000)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "cut.bin")))
        reply = yield self.append(uid, offset, data[offset:])
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["sha256"], hashlib.sha256(data).hexdigest())
        self.assertEqual(self.read("cut.bin"), data)
        self.assertEqual(self.staging(), [])

    @inlineCallbacks
    def test_raw_write_cut_mid_body_leaves_no_temp_file(self) -> Any:
        """POST /files/raw cut mid-body removes its temporary file and leaves the old file."""
        self.put("r.bin", b"old")
        yield deferToThread(
            _send_part,
            self.daemon.port,
            "/files/raw?path=r.bin",
            1_000_000,
            b"x" * 300_000,
            self.token,
        )
        for _ in range(100):
            if not self.staging():
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual(self.staging(), [])
        self.assertEqual(self.read("r.bin"), b"old")


class BusyTests(UploadCase):
    @inlineCallbacks
    def busy(self, uid: str, offset: int) -> Any:
        """Start an append that stays open; returns its socket once the daemon holds it."""
        sock = yield deferToThread(
            _open_part,
            self.daemon.port,
            f"/files/uploads/{uid}?offset={offset}",
            10_000,
            b"x" * 1000,
            self.token,
        )
        self.addCleanup(sock.close)
        for _ in range(100):
            reply = yield self.append(uid, offset, b"")
            if reply.status == 429:
                return sock, reply
            yield deferLater(reactor, 0.05, lambda: None)
        self.fail("the first append was never held")

    @inlineCallbacks
    def test_second_concurrent_append_is_refused(self) -> Any:
        """
        While one append runs, another is 429 concurrency_limited (with
        retry_after); once the first one's connection goes, its bytes count.
        """
        reply = yield self.create("c.bin", 20_000)
        uid = reply.json()["upload_id"]
        sock, refused = yield self.busy(uid, 0)
        self.assertEqual(refused.json()["code"], "concurrency_limited")
        self.assertEqual(refused.json()["retry_after"], 1)
        yield deferToThread(sock.close)
        reply = yield self.wait_offset(uid, 0)
        self.assertEqual(reply.json()["offset"], 1000)

    @inlineCallbacks
    def test_delete_while_appending(self) -> Any:
        """DELETE of an upload with an append running removes the staging file once the write stops."""
        reply = yield self.create("d.bin", 20_000)
        uid = reply.json()["upload_id"]
        sock, _ = yield self.busy(uid, 0)
        reply = yield self.request("DELETE", f"/files/uploads/{uid}")
        self.assertEqual(reply.json()["deleted"], True)
        for _ in range(100):
            if not self.staging():
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual(self.staging(), [])
        yield deferToThread(sock.close)
        reply = yield self.request("GET", f"/files/uploads/{uid}")
        self.assertEqual(reply.status, 404)


class IdentityTests(UploadCase):
    token = None
    policy = {
        "auth": {
            "tokens": [
                {"id": "alice", "token_env": "SBX_ALICE", "scopes": ["*"]},
                {"id": "bob", "token_env": "SBX_BOB", "scopes": ["*"]},
            ]
        }
    }
    environ = {"SBX_ALICE": "alice-token", "SBX_BOB": "bob-token"}

    @inlineCallbacks
    def test_other_identity_gets_404(self) -> Any:
        """An upload is its creator's: another token gets 404 on GET, append and DELETE."""
        reply = yield self.request(
            "POST", "/files/uploads", {"path": "a.txt", "size": 2}, token="alice-token"
        )
        self.assertEqual(reply.status, 201, reply.body)
        uid = reply.json()["upload_id"]
        reply = yield self.request("GET", f"/files/uploads/{uid}", token="bob-token")
        self.assertEqual((reply.status, reply.json()["code"]), (404, "not_found"))
        reply = yield self.append(uid, 0, b"hi", token="bob-token")
        self.assertEqual(reply.status, 404)
        reply = yield self.request("DELETE", f"/files/uploads/{uid}", token="bob-token")
        self.assertEqual(reply.status, 404)
        reply = yield self.append(uid, 0, b"hi", token="alice-token")
        self.assertTrue(reply.json()["complete"])

    @inlineCallbacks
    def test_listing_is_the_callers_own(self) -> Any:
        """GET /files/uploads lists the caller's uploads only."""
        reply = yield self.request(
            "POST", "/files/uploads", {"path": "a.txt", "size": 2}, token="alice-token"
        )
        uid = reply.json()["upload_id"]
        alice = yield self.request("GET", "/files/uploads", token="alice-token")
        bob = yield self.request("GET", "/files/uploads", token="bob-token")
        self.assertEqual([u["upload_id"] for u in alice.json()["uploads"]], [uid])
        self.assertEqual(bob.json(), {"uploads": []})


class BoundTests(UploadCase):
    policy = {"endpoints": {"files_uploads_create": {"limits": {"max_sessions": 2}}}}

    @inlineCallbacks
    def test_open_upload_limit(self) -> Any:
        """A third open upload over max_sessions 2 is 429 too_many_sessions; finishing one makes room."""
        a = yield self.create("a.bin", 1)
        yield self.create("b.bin", 1)
        reply = yield self.create("c.bin", 1)
        self.assertEqual(
            (reply.status, reply.json()["code"]), (429, "too_many_sessions")
        )
        self.assertEqual(len(self.staging()), 2)
        yield self.append(a.json()["upload_id"], 0, b"a")
        reply = yield self.create("c.bin", 1)
        self.assertEqual(reply.status, 201)

    @inlineCallbacks
    def test_abandoned_upload_makes_room(self) -> Any:
        """
        At max_sessions, the upload that took no byte the longest, for five
        minutes at least (its client died), is dropped with its staging
        file to make room; a younger one is not.
        """
        clock = Clock()
        self.daemon.context.uploads.get().clock = clock
        a = (yield self.create("a.bin", 10)).json()["upload_id"]
        clock.advance(10)
        b = (yield self.create("b.bin", 10)).json()["upload_id"]
        clock.advance(289)
        reply = yield self.create("c.bin", 10)
        self.assertEqual(
            (reply.status, reply.json()["code"]), (429, "too_many_sessions")
        )
        clock.advance(2)
        reply = yield self.create("c.bin", 10)
        self.assertEqual(reply.status, 201)
        gone = yield self.request("GET", f"/files/uploads/{a}")
        kept = yield self.request("GET", f"/files/uploads/{b}")
        self.assertEqual((gone.status, kept.status), (404, 200))
        self.assertEqual(len(self.staging()), 2)

    @inlineCallbacks
    def test_full_table_says_when_and_where_to_look(self) -> Any:
        """
        At max_sessions, the 429 says when the first upload in the way can
        be reclaimed (``Retry-After``, header and field) and names
        ``GET /files/uploads``, which lists the caller's own uploads: a
        client that lost their ids (it crashed) deletes one and starts its
        new upload.
        """
        clock = Clock()
        self.daemon.context.uploads.get().clock = clock
        first = (yield self.create("a.bin", 10)).json()
        clock.advance(100)
        second = (yield self.create("b.bin", 10)).json()
        clock.advance(20)
        reply = yield self.create("c.bin", 10)
        self.assertEqual(
            (reply.status, reply.json()["code"]), (429, "too_many_sessions")
        )
        self.assertEqual(reply.header("retry-after"), "180")
        self.assertEqual(reply.json()["retry_after"], 180)
        self.assertIn("GET /files/uploads", reply.json()["error"])
        listed = yield self.request("GET", "/files/uploads")
        self.assertEqual(listed.status, 200)
        self.assertEqual(listed.json(), {"uploads": [first, second]})
        gone = yield self.request(
            "DELETE", f"/files/uploads/{listed.json()['uploads'][0]['upload_id']}"
        )
        self.assertEqual(gone.status, 200)
        reply = yield self.create("c.bin", 10)
        self.assertEqual(reply.status, 201)

    @inlineCallbacks
    def test_idle_expiry_removes_staging(self) -> Any:
        """An upload with no byte for idle_timeout_seconds is dropped with its staging file; bytes put the expiry off."""
        clock = Clock()
        self.daemon.context.uploads.get().clock = clock
        reply = yield self.create("x.bin", 10)
        uid = reply.json()["upload_id"]
        clock.advance(3000)
        yield self.append(uid, 0, b"12345")
        clock.advance(3000)
        reply = yield self.request("GET", f"/files/uploads/{uid}")
        self.assertEqual(reply.status, 200)
        clock.advance(601)
        reply = yield self.request("GET", f"/files/uploads/{uid}")
        self.assertEqual(reply.status, 404)
        self.assertEqual(self.staging(), [])

    @inlineCallbacks
    def test_daemon_stop_removes_staging(self) -> Any:
        """Stopping the daemon removes every staging file."""
        reply = yield self.create("y.bin", 10)
        yield self.append(reply.json()["upload_id"], 0, b"123")
        self.assertEqual(len(self.staging()), 1)
        yield self.daemon.stop()
        self.assertEqual(self.staging(), [])
        self.assertEqual(os.listdir(self.base_dir), [])
