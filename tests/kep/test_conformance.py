"""
The runtime protocol of agent-sandbox (KEP-539.2) as its reference daemon
behaves and its specification states, one test per behaviour, driven the
way users drive it: the SDK's ``Filesystem`` and ``CommandExecutor`` where
they reach the behaviour, the SDK's generated ``ProcessServiceStub`` and
raw httpx where they do not.  ``docs/kep-conformance.md`` is the table of
these behaviours.

Where sandboxd differs on purpose, the test asserts sandboxd's behaviour
and its docstring says "Differs on purpose" and how.
"""

from __future__ import annotations

import datetime
import os
import signal
import stat
import time
from typing import Any

import grpc
from twisted.internet.defer import inlineCallbacks

from tests.helpers import alive
from tests.kep.case import KepCase
from tests.kep.test_process import ProcessCase, _eof, config, events, status_of, stubs

#: A process id nothing has (the reference's tests use the same).
NO_SUCH_ID = 424242


class ConformanceCase(KepCase):
    """Helpers shared by both halves."""

    def put_file(self, name: str, data: bytes = b"x", mode: int = 0o644) -> str:
        """A file below the root, made directly on disk."""
        path = os.path.join(self.base_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, mode)
        return path

    def assert_error(self, response: Any, status: int, code: str) -> None:
        """The protocol's error: the status, and a body of ``code`` and ``message``."""
        self.assertEqual(response.status_code, status, response.content)
        self.assertEqual(response.headers["content-type"], "application/json")
        body = response.json()
        self.assertEqual(set(body), {"code", "message"})
        self.assertEqual(body["code"], code)
        self.assertTrue(body["message"])


# -- the REST filesystem API ---------------------------------------------------------


class FilesConformance(ConformanceCase):
    """``/v1/files``, ``/v1/health`` and ``/v1/metadata``."""

    @inlineCallbacks
    def test_put_is_204_and_get_reads_it_back(self) -> Any:
        """PUT answers 204 with no body; GET answers the bytes as octet-stream."""
        r = yield self.http("PUT", "/v1/files/hello.txt", content=b"payload")
        self.assertEqual((r.status_code, r.content), (204, b""))
        with open(os.path.join(self.base_dir, "hello.txt"), "rb") as f:
            self.assertEqual(f.read(), b"payload")
        r = yield self.http("GET", "/v1/files/hello.txt")
        self.assertEqual((r.status_code, r.content), (200, b"payload"))
        self.assertEqual(r.headers["content-type"], "application/octet-stream")

    @inlineCallbacks
    def test_sdk_write_and_read(self) -> Any:
        """The SDK's ``files.write`` and ``files.read`` round-trip the bytes."""
        fs = self.filesystem()
        yield self.blocking(fs.write, "notes/hello.txt", b"hello from REST")
        data = yield self.blocking(fs.read, "notes/hello.txt")
        self.assertEqual(data, b"hello from REST")

    @inlineCallbacks
    def test_put_creates_parents(self) -> Any:
        """PUT makes the missing parent directories."""
        fs = self.filesystem()
        yield self.blocking(fs.write, "a/b/c/deep.txt", b"x")
        self.assertTrue(os.path.isfile(os.path.join(self.base_dir, "a/b/c/deep.txt")))

    @inlineCallbacks
    def test_put_encoded_slashes_nest(self) -> Any:
        """One segment with ``%2F`` separators is a nested path."""
        r = yield self.http("PUT", "/v1/files/dir%2Fsub%2Ffile.txt", content=b"x")
        self.assertEqual(r.status_code, 204)
        self.assertTrue(os.path.isfile(os.path.join(self.base_dir, "dir/sub/file.txt")))

    @inlineCallbacks
    def test_put_applies_mode(self) -> Any:
        """``?mode=0755`` is the written file's permission bits."""
        r = yield self.http("PUT", "/v1/files/run.sh?mode=0755", content=b"#!/bin/sh")
        self.assertEqual(r.status_code, 204)
        st = os.stat(os.path.join(self.base_dir, "run.sh"))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o755)

    @inlineCallbacks
    def test_put_default_mode(self) -> Any:
        """Without ``mode`` a written file is 0644."""
        r = yield self.http("PUT", "/v1/files/plain.txt", content=b"x")
        self.assertEqual(r.status_code, 204)
        st = os.stat(os.path.join(self.base_dir, "plain.txt"))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o644)

    @inlineCallbacks
    def test_put_invalid_mode(self) -> Any:
        """A mode not matching ``^0[0-7]{3}$`` is 400 INVALID_ARGUMENT, nothing written."""
        for mode in ("0999", "777", "abcd", "01777"):
            r = yield self.http("PUT", f"/v1/files/f.txt?mode={mode}", content=b"x")
            self.assert_error(r, 400, "INVALID_ARGUMENT")
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "f.txt")))

    @inlineCallbacks
    def test_put_overwrites_atomically(self) -> Any:
        """A second PUT replaces the file whole and leaves no temporary file."""
        os.makedirs(os.path.join(self.base_dir, "w"))
        for data in (b"old", b"new"):
            r = yield self.http("PUT", "/v1/files/w%2Ff.txt", content=data)
            self.assertEqual(r.status_code, 204)
        with open(os.path.join(self.base_dir, "w/f.txt"), "rb") as f:
            self.assertEqual(f.read(), b"new")
        self.assertEqual(os.listdir(os.path.join(self.base_dir, "w")), ["f.txt"])

    @inlineCallbacks
    def test_put_multipart(self) -> Any:
        """A multipart body's ``file`` part is what is written."""
        r = yield self.http(
            "PUT",
            "/v1/files/upload.bin",
            files={"file": ("upload.bin", b"multipart-payload")},
        )
        self.assertEqual(r.status_code, 204)
        with open(os.path.join(self.base_dir, "upload.bin"), "rb") as f:
            self.assertEqual(f.read(), b"multipart-payload")

    @inlineCallbacks
    def test_put_multipart_without_file_part(self) -> Any:
        """A multipart body without a ``file`` part is 400 INVALID_ARGUMENT."""
        r = yield self.http("PUT", "/v1/files/f.txt", files={"notfile": ("n", b"x")})
        self.assert_error(r, 400, "INVALID_ARGUMENT")
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "f.txt")))

    @inlineCallbacks
    def test_name_that_is_not_utf8(self) -> Any:
        """
        A name whose bytes are not UTF-8 is reached by its percent-encoded
        bytes, as the reference daemon reaches it: read, replaced and
        deleted, the file beside it whose name spells the same escapes
        with backslashes left alone.
        """
        base = os.fsencode(self.base_dir)
        latin = os.path.join(base, b"r\xe9sum\xe9.txt")
        spelled = os.path.join(base, b"r\\xe9sum\\xe9.txt")
        for path, data in ((latin, b"latin-1 name"), (spelled, b"backslashes")):
            with open(path, "wb") as f:
                f.write(data)
        r = yield self.http("GET", "/v1/files/r%E9sum%E9.txt")
        self.assertEqual((r.status_code, r.content), (200, b"latin-1 name"))
        r = yield self.http("PUT", "/v1/files/r%E9sum%E9.txt", content=b"new")
        self.assertEqual(r.status_code, 204, r.text)
        with open(latin, "rb") as f:
            self.assertEqual(f.read(), b"new")
        r = yield self.http("DELETE", "/v1/files/r%E9sum%E9.txt")
        self.assertEqual(r.status_code, 204, r.text)
        self.assertFalse(os.path.exists(latin))
        with open(spelled, "rb") as f:
            self.assertEqual(f.read(), b"backslashes")

    @inlineCallbacks
    def test_listed_names_lead_to_their_own_files(self) -> Any:
        """
        Names the SDK lists lead back to their own files when the SDK reads
        them, none listed like another: a name whose bytes are not UTF-8
        (shown with ``\\xNN``), one spelling those escapes with
        backslashes (shown with them doubled), and one with a plain
        backslash (shown as it is).
        """
        folder = os.path.join(os.fsencode(self.base_dir), b"d")
        os.mkdir(folder)
        files = {
            b"r\xe9sum\xe9.txt": b"latin-1 name",
            b"r\\xe9sum\\xe9.txt": b"backslashes",
            b"a\\b.txt": b"plain backslash",
        }
        for name, data in files.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        fs = self.filesystem()
        listed = yield self.blocking(fs.list, "d")
        names = sorted(entry.name for entry in listed)
        self.assertEqual(
            names, ["a\\b.txt", "r\\\\xe9sum\\\\xe9.txt", "r\\xe9sum\\xe9.txt"]
        )
        read = {}
        for name in names:
            read[name] = yield self.blocking(fs.read, "d/" + name)
        self.assertEqual(sorted(read.values()), sorted(files.values()))
        self.assertEqual(read["r\\xe9sum\\xe9.txt"], b"latin-1 name")

    @inlineCallbacks
    def test_put_multipart_spooled_to_disk(self) -> Any:
        """
        A multipart body big enough to be kept on disk is written (a form
        field beside the file too), or refused with its own 400: never a
        500 from letting go of the body while parts of it are still held.
        """
        payload = bytes(range(256)) * 1024
        r = yield self.http(
            "PUT",
            "/v1/files/big.bin",
            data={"note": "a field beside the file"},
            files={"file": ("big.bin", payload)},
        )
        self.assertEqual(r.status_code, 204, r.text)
        with open(os.path.join(self.base_dir, "big.bin"), "rb") as f:
            self.assertEqual(f.read(), payload)
        r = yield self.http(
            "PUT", "/v1/files/none.bin", files={"notfile": ("n", payload)}
        )
        self.assert_error(r, 400, "INVALID_ARGUMENT")
        r = yield self.http(
            "PUT",
            "/v1/files/bad.bin",
            content=b"--B\r\n" + b"x" * 300_000,
            headers={"content-type": "multipart/form-data; boundary=B"},
        )
        self.assert_error(r, 400, "INVALID_ARGUMENT")
        for name in ("none.bin", "bad.bin"):
            self.assertFalse(os.path.exists(os.path.join(self.base_dir, name)))

    @inlineCallbacks
    def test_put_onto_directory(self) -> Any:
        """A PUT whose target is a directory is 400 INVALID_ARGUMENT."""
        os.makedirs(os.path.join(self.base_dir, "d"))
        r = yield self.http("PUT", "/v1/files/d", content=b"x")
        self.assert_error(r, 400, "INVALID_ARGUMENT")
        self.assertTrue(os.path.isdir(os.path.join(self.base_dir, "d")))

    @inlineCallbacks
    def test_directory_listing(self) -> Any:
        """
        A directory is a JSON ``DirectoryListing``: ``path`` with a leading
        slash, entries sorted by name, ``type`` file or directory, ``size``,
        ``mode`` as four octal digits, ``modified_at`` RFC 3339 in UTC.
        """
        self.put_file("l/b.txt", b"bb", 0o600)
        os.makedirs(os.path.join(self.base_dir, "l/adir"))
        r = yield self.http("GET", "/v1/files/l")
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.headers["content-type"], "application/json")
        listing = r.json()
        self.assertEqual(set(listing), {"path", "entries"})
        self.assertEqual(listing["path"], "/l")
        self.assertEqual([e["name"] for e in listing["entries"]], ["adir", "b.txt"])
        adir, b = listing["entries"]
        self.assertEqual(adir["type"], "directory")
        self.assertEqual(
            {k: b[k] for k in ("type", "size", "mode")},
            {"type": "file", "size": 2, "mode": "0600"},
        )
        self.assertEqual(set(b), {"name", "size", "type", "modified_at", "mode"})
        self.assertRegex(b["modified_at"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        when = datetime.datetime.fromisoformat(b["modified_at"])
        mtime = os.stat(os.path.join(self.base_dir, "l/b.txt")).st_mtime
        self.assertEqual(int(when.timestamp()), int(mtime))

    @inlineCallbacks
    def test_root_listing(self) -> Any:
        """``GET /v1/files/`` lists the root, its ``path`` ``/``."""
        self.put_file("top.txt")
        r = yield self.http("GET", "/v1/files/")
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.json()["path"], "/")
        self.assertIn("top.txt", [e["name"] for e in r.json()["entries"]])

    @inlineCallbacks
    def test_sdk_list(self) -> Any:
        """The SDK's ``files.list`` reads the listing: mode, type, aware time."""
        self.put_file("s/a.txt", b"12345", 0o644)
        os.makedirs(os.path.join(self.base_dir, "s/sub"))
        entries = yield self.blocking(self.filesystem().list, "s")
        self.assertEqual(
            [(e.name, e.type, e.mode) for e in entries],
            [("a.txt", "file", "0644"), ("sub", "directory", "0755")],
        )
        self.assertEqual(entries[0].size, 5)
        self.assertEqual(entries[0].modified.tzinfo, datetime.UTC)

    @inlineCallbacks
    def test_empty_directory_entries_is_a_list(self) -> Any:
        """An empty directory's ``entries`` is ``[]``, not null."""
        os.makedirs(os.path.join(self.base_dir, "empty"))
        r = yield self.http("GET", "/v1/files/empty")
        self.assertEqual(r.json()["entries"], [])

    @inlineCallbacks
    def test_listing_omits_escaping_and_broken_links(self) -> Any:
        """A link leading out of the root, or nowhere, is left out of a listing."""
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        self.put_file("k/normal.txt")
        os.symlink(outside, os.path.join(self.base_dir, "k/escaping"))
        os.symlink("gone", os.path.join(self.base_dir, "k/broken"))
        os.symlink("normal.txt", os.path.join(self.base_dir, "k/inside"))
        r = yield self.http("GET", "/v1/files/k")
        names = [e["name"] for e in r.json()["entries"]]
        self.assertEqual(names, ["inside", "normal.txt"])

    @inlineCallbacks
    def test_get_missing(self) -> Any:
        """A path that is not there is 404 NOT_FOUND."""
        r = yield self.http("GET", "/v1/files/nope.txt")
        self.assert_error(r, 404, "NOT_FOUND")

    @inlineCallbacks
    def test_head_probe(self) -> Any:
        """HEAD is 200 with the length and no body, 404 for a missing path."""
        self.put_file("f.txt", b"12345")
        r = yield self.http("HEAD", "/v1/files/f.txt")
        self.assertEqual((r.status_code, r.content), (200, b""))
        self.assertEqual(r.headers["content-length"], "5")
        self.assertIn("last-modified", r.headers)
        r = yield self.http("HEAD", "/v1/files/absent.txt")
        self.assertEqual((r.status_code, r.content), (404, b""))

    @inlineCallbacks
    def test_head_directory(self) -> Any:
        """HEAD on a directory is 200, as its GET is."""
        os.makedirs(os.path.join(self.base_dir, "hd"))
        r = yield self.http("HEAD", "/v1/files/hd")
        self.assertEqual((r.status_code, r.content), (200, b""))

    @inlineCallbacks
    def test_sdk_exists(self) -> Any:
        """The SDK's ``files.exists`` is HEAD: true for a file and a directory."""
        self.put_file("e/f.txt")
        fs = self.filesystem()
        self.assertTrue((yield self.blocking(fs.exists, "e/f.txt")))
        self.assertTrue((yield self.blocking(fs.exists, "e")))
        self.assertFalse((yield self.blocking(fs.exists, "e/absent.txt")))

    @inlineCallbacks
    def test_range(self) -> Any:
        """A byte range is 206 with its Content-Range; the whole file says Accept-Ranges."""
        self.put_file("r.bin", b"0123456789")
        r = yield self.http("GET", "/v1/files/r.bin", headers={"Range": "bytes=2-4"})
        self.assertEqual((r.status_code, r.content), (206, b"234"))
        self.assertEqual(r.headers["content-range"], "bytes 2-4/10")
        r = yield self.http("GET", "/v1/files/r.bin", headers={"Range": "bytes=-3"})
        self.assertEqual((r.status_code, r.content), (206, b"789"))
        r = yield self.http("GET", "/v1/files/r.bin")
        self.assertEqual(r.headers["accept-ranges"], "bytes")

    @inlineCallbacks
    def test_range_not_satisfiable(self) -> Any:
        """
        A range past the end is 416 with ``Content-Range: bytes */SIZE``.
        Differs on purpose: the body is the protocol's error
        (``OUT_OF_RANGE``), where the reference answers Go's plain text.
        """
        self.put_file("r.bin", b"0123456789")
        r = yield self.http("GET", "/v1/files/r.bin", headers={"Range": "bytes=20-"})
        self.assert_error(r, 416, "OUT_OF_RANGE")
        self.assertEqual(r.headers["content-range"], "bytes */10")

    @inlineCallbacks
    def test_if_modified_since(self) -> Any:
        """
        A file not modified since ``If-Modified-Since`` is 304 with no
        body, for GET and HEAD; an older date reads the file.
        """
        self.put_file("c.txt", b"cached")
        r = yield self.http("GET", "/v1/files/c.txt")
        stamp = r.headers["last-modified"]
        r = yield self.http(
            "GET", "/v1/files/c.txt", headers={"If-Modified-Since": stamp}
        )
        self.assertEqual((r.status_code, r.content), (304, b""))
        self.assertEqual(r.headers["last-modified"], stamp)
        r = yield self.http(
            "HEAD", "/v1/files/c.txt", headers={"If-Modified-Since": stamp}
        )
        self.assertEqual(r.status_code, 304)
        r = yield self.http(
            "GET",
            "/v1/files/c.txt",
            headers={"If-Modified-Since": "Mon, 01 Jan 2001 00:00:00 GMT"},
        )
        self.assertEqual((r.status_code, r.content), (200, b"cached"))

    @inlineCallbacks
    def test_if_unmodified_since(self) -> Any:
        """
        A file modified after ``If-Unmodified-Since`` is 412
        ``FAILED_PRECONDITION``; its own time reads it.
        """
        self.put_file("u.txt", b"fresh")
        r = yield self.http("GET", "/v1/files/u.txt")
        stamp = r.headers["last-modified"]
        r = yield self.http(
            "GET",
            "/v1/files/u.txt",
            headers={"If-Unmodified-Since": "Mon, 01 Jan 2001 00:00:00 GMT"},
        )
        self.assertEqual(r.status_code, 412)
        self.assertEqual(r.json()["code"], "FAILED_PRECONDITION")
        r = yield self.http(
            "GET", "/v1/files/u.txt", headers={"If-Unmodified-Since": stamp}
        )
        self.assertEqual((r.status_code, r.content), (200, b"fresh"))

    @inlineCallbacks
    def test_traversal(self) -> Any:
        """``..`` out of the root is 403 PERMISSION_DENIED for GET, PUT and DELETE."""
        for method in ("GET", "PUT", "DELETE"):
            r = yield self.http(
                method, "/v1/files/%2E%2E/%2E%2E/etc/passwd", content=b"x"
            )
            self.assert_error(r, 403, "PERMISSION_DENIED")

    @inlineCallbacks
    def test_symlink_escape(self) -> Any:
        """A path through a link that leads out of the root is 403."""
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        with open(os.path.join(outside, "secret"), "w") as f:
            f.write("s")
        os.symlink(outside, os.path.join(self.base_dir, "link"))
        r = yield self.http("GET", "/v1/files/link/secret")
        self.assert_error(r, 403, "PERMISSION_DENIED")

    @inlineCallbacks
    def test_absolute_paths_are_below_the_root(self) -> Any:
        """
        A path starting with ``/`` is below the root, and ``..`` stops at
        it, as the reference cleans an absolute path; the root's own
        absolute path names the root.
        """
        self.put_file("sub/f.txt", b"abs")
        r = yield self.http("GET", "/v1/files/%2Fsub%2Ff.txt")
        self.assertEqual((r.status_code, r.content), (200, b"abs"))
        r = yield self.http("GET", "/v1/files/%2F..%2Fsub%2Ff.txt")
        self.assertEqual((r.status_code, r.content), (200, b"abs"))
        full = (self.base_dir + "/sub/f.txt").replace("/", "%2F")
        r = yield self.http("GET", f"/v1/files/{full}")
        self.assertEqual((r.status_code, r.content), (200, b"abs"))

    @inlineCallbacks
    def test_delete_file(self) -> Any:
        """DELETE of a file is 204; again, 404 NOT_FOUND."""
        self.put_file("f.txt")
        yield self.blocking(self.filesystem().delete, "f.txt")
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "f.txt")))
        r = yield self.http("DELETE", "/v1/files/f.txt")
        self.assert_error(r, 404, "NOT_FOUND")

    @inlineCallbacks
    def test_delete_non_empty_directory(self) -> Any:
        """A directory with contents is 409 CONFLICT, removed with ``recursive=true``."""
        self.put_file("d/f.txt")
        r = yield self.http("DELETE", "/v1/files/d")
        self.assert_error(r, 409, "CONFLICT")
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "d/f.txt")))
        r = yield self.http("DELETE", "/v1/files/d?recursive=true")
        self.assertEqual((r.status_code, r.content), (204, b""))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "d")))

    @inlineCallbacks
    def test_delete_empty_directory(self) -> Any:
        """An empty directory is removed without ``recursive``."""
        os.makedirs(os.path.join(self.base_dir, "e"))
        r = yield self.http("DELETE", "/v1/files/e")
        self.assertEqual(r.status_code, 204)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "e")))

    @inlineCallbacks
    def test_sdk_recursive_delete(self) -> Any:
        """The SDK's ``files.delete(recursive=True)`` removes a tree."""
        self.put_file("t/u/v.txt")
        yield self.blocking(self.filesystem().delete, "t", recursive=True)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "t")))

    @inlineCallbacks
    def test_delete_root(self) -> Any:
        """The root is 409 without ``recursive``; with it, emptied and kept."""
        self.put_file("f.txt")
        r = yield self.http("DELETE", "/v1/files/")
        self.assert_error(r, 409, "CONFLICT")
        r = yield self.http("DELETE", "/v1/files/?recursive=true")
        self.assertEqual(r.status_code, 204)
        self.assertTrue(os.path.isdir(self.base_dir))
        self.assertEqual(os.listdir(self.base_dir), [])

    @inlineCallbacks
    def test_delete_invalid_recursive(self) -> Any:
        """``recursive`` that is not a boolean is 400, nothing removed."""
        self.put_file("f.txt")
        r = yield self.http("DELETE", "/v1/files/f.txt?recursive=banana")
        self.assert_error(r, 400, "INVALID_ARGUMENT")
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "f.txt")))

    @inlineCallbacks
    def test_delete_missing_before_recursive(self) -> Any:
        """
        A missing path is 404, one out of the root 403, whatever
        ``recursive`` says: the reference reads it last.
        """
        r = yield self.http("DELETE", "/v1/files/absent?recursive=banana")
        self.assert_error(r, 404, "NOT_FOUND")
        r = yield self.http("DELETE", "/v1/files/no%2Fparent?recursive=banana")
        self.assert_error(r, 404, "NOT_FOUND")
        r = yield self.http("DELETE", "/v1/files/%2E%2E%2Fx?recursive=banana")
        self.assert_error(r, 403, "PERMISSION_DENIED")

    @inlineCallbacks
    def test_health(self) -> Any:
        """Health is 200 ``{"status": "ok", "uptime_seconds": N}``."""
        r = yield self.http("GET", "/v1/health")
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.headers["content-type"], "application/json")
        body = r.json()
        self.assertEqual(body["status"], "ok")
        self.assertIsInstance(body["uptime_seconds"], int)
        self.assertGreaterEqual(body["uptime_seconds"], 0)

    @inlineCallbacks
    def test_health_while_shutting_down(self) -> Any:
        """
        Once the daemon is stopping, health is 503 UNAVAILABLE (the flag
        the daemon's stop sets first; the port closes right after).
        """
        self.daemon.context.draining = True
        try:
            r = yield self.http("GET", "/v1/health")
        finally:
            self.daemon.context.draining = False
        self.assert_error(r, 503, "UNAVAILABLE")

    @inlineCallbacks
    def test_metadata_filter(self) -> Any:
        """
        Metadata is the ``SANDBOX_`` variables, without any whose name
        carries a credential's marker (the reference's own list of cases).
        """
        given = {
            "SANDBOX_ID": "sbx-123",
            "SANDBOX_WORKSPACE": "/workspace",
            "SANDBOX_API_TOKEN": "super-secret",
            "SANDBOX_SSH_KEY": "super-secret",
            "SANDBOX_AUTH_HEADER": "super-secret",
            "SANDBOX_BEARER": "super-secret",
            "SANDBOX_CRED": "super-secret",
            "SANDBOX_PASSWD": "super-secret",
            "SANDBOX_TLS_CERT": "super-secret",
            "SANDBOX_PRIVATE_URL": "super-secret",
            "KUBERNETES_SERVICE_HOST": "1.2.3.4",
        }
        saved = {k: os.environ.get(k) for k in given}
        os.environ.update(given)

        def restore() -> None:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

        self.addCleanup(restore)
        r = yield self.http("GET", "/v1/metadata")
        self.assertEqual(r.status_code, 200)
        env = r.json()["env"]
        mine = {k: v for k, v in env.items() if k in given}
        self.assertEqual(
            mine, {"SANDBOX_ID": "sbx-123", "SANDBOX_WORKSPACE": "/workspace"}
        )
        self.assertTrue(all(k.startswith("SANDBOX_") for k in env))


# -- process.v1.ProcessService ---------------------------------------------------------


class ProcessConformance(ConformanceCase, ProcessCase):
    """``Execute``, ``Start`` and the calls on a started process."""

    def start_call(self, argv: list[str], **kwargs: Any) -> tuple[Any, Any, int]:
        """(stub, stream, process id) of a ``Start`` whose init was read."""
        pb, _ = stubs()
        stub = self.stub()
        stream = stub.Start(
            pb.StartRequest(config=config(pb, argv), **kwargs), timeout=20
        )
        first = next(stream)
        assert first.WhichOneof("event") == "init", first
        return stub, stream, first.init.process_id

    # -- Execute

    @inlineCallbacks
    def test_execute_output(self) -> Any:
        """Execute answers the exit code and both outputs, apart."""
        pb, _ = stubs()
        answer = yield self.blocking(
            self.stub().Execute,
            pb.ExecuteRequest(config=config(pb, ["echo", "hello"])),
            timeout=10,
        )
        self.assertEqual(
            (answer.exit_code, answer.stdout, answer.stderr), (0, b"hello\n", b"")
        )

    @inlineCallbacks
    def test_sdk_run_output(self) -> Any:
        """The SDK's ``commands.run`` reads stdout, stderr and the exit code."""
        result = yield self.blocking(self.commands().run, "echo out; echo err >&2")
        self.assertEqual(
            (result.stdout, result.stderr, result.exit_code), ("out\n", "err\n", 0)
        )

    @inlineCallbacks
    def test_execute_exit_code(self) -> Any:
        """A failing command's exit code is answered, not an error."""
        result = yield self.blocking(self.commands().run, "exit 3")
        self.assertEqual(result.exit_code, 3)

    @inlineCallbacks
    def test_execute_env_and_cwd(self) -> Any:
        """``env_vars`` reach the command; ``cwd`` is relative to the root."""
        os.makedirs(os.path.join(self.base_dir, "sub"))
        result = yield self.blocking(
            self.commands().run,
            "echo $SANDBOX_TEST_VAR; pwd",
            env={"SANDBOX_TEST_VAR": "sentinel"},
            cwd="sub",
        )
        self.assertEqual(result.exit_code, 0)
        self.assertEqual(
            result.stdout.splitlines(), ["sentinel", os.path.join(self.base_dir, "sub")]
        )

    @inlineCallbacks
    def test_execute_runs_in_the_root(self) -> Any:
        """Without ``cwd`` a command runs in the root: a file PUT there is at hand."""
        r = yield self.http("PUT", "/v1/files/notes%2Fhello.txt", content=b"from REST")
        self.assertEqual(r.status_code, 204)
        pb, _ = stubs()
        answer = yield self.blocking(
            self.stub().Execute,
            pb.ExecuteRequest(config=config(pb, ["cat", "notes/hello.txt"])),
            timeout=10,
        )
        self.assertEqual((answer.exit_code, answer.stdout), (0, b"from REST"))

    @inlineCallbacks
    def test_execute_signalled_exit_code(self) -> Any:
        """A command a signal ended has exit code -1 (Go's for a signal)."""
        result = yield self.blocking(self.commands().run, "kill -KILL $$")
        self.assertEqual(result.exit_code, -1)

    @inlineCallbacks
    def test_execute_deadline(self) -> Any:
        """
        A call past its deadline is DEADLINE_EXCEEDED, which the SDK reports
        as exit 124 and ``timed_out``.
        """
        result = yield self.blocking(self.commands().run, "sleep 30", command_timeout=1)
        self.assertEqual((result.exit_code, result.timed_out), (124, True))

    @inlineCallbacks
    def test_empty_command(self) -> Any:
        """A config without a command is INVALID_ARGUMENT, for Execute and Start."""
        pb, _ = stubs()
        stub = self.stub()
        error = yield self.blocking(
            self.caught, stub.Execute, pb.ExecuteRequest(), timeout=10
        )
        self.assertEqual(status_of(error)[0], "INVALID_ARGUMENT")
        error = yield self.blocking(
            self.caught, lambda: list(stub.Start(pb.StartRequest(), timeout=10))
        )
        self.assertEqual(status_of(error)[0], "INVALID_ARGUMENT")

    @inlineCallbacks
    def test_empty_program_name(self) -> Any:
        """
        A command whose program is ``""`` is INVALID_ARGUMENT.  Differs on
        purpose: the reference answers INTERNAL (Go's "exec: no command"),
        a server error for what is the caller's.
        """
        pb, _ = stubs()
        error = yield self.blocking(
            self.caught,
            self.stub().Execute,
            pb.ExecuteRequest(config=config(pb, ["", "x"])),
            timeout=10,
        )
        self.assertEqual(status_of(error)[0], "INVALID_ARGUMENT")

    @inlineCallbacks
    def test_cwd_escape(self) -> Any:
        """A ``cwd`` out of the root is PERMISSION_DENIED, for Execute and Start."""
        pb, _ = stubs()
        stub = self.stub()
        request = config(pb, ["pwd"], cwd="../..")
        error = yield self.blocking(
            self.caught, stub.Execute, pb.ExecuteRequest(config=request), timeout=10
        )
        self.assertEqual(status_of(error)[0], "PERMISSION_DENIED")
        error = yield self.blocking(
            self.caught,
            lambda: list(stub.Start(pb.StartRequest(config=request), timeout=10)),
        )
        self.assertEqual(status_of(error)[0], "PERMISSION_DENIED")

    @inlineCallbacks
    def test_cwd_symlink_escape(self) -> Any:
        """A ``cwd`` through a link leading out of the root is PERMISSION_DENIED."""
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        os.symlink(outside, os.path.join(self.base_dir, "out"))
        error = yield self.blocking(
            self.caught_any, self.commands().run, "pwd", cwd="out"
        )
        self.assertIn("PERMISSION_DENIED", str(error))

    @inlineCallbacks
    def test_cwd_missing(self) -> Any:
        """A ``cwd`` that is not there is NOT_FOUND."""
        error = yield self.blocking(
            self.caught_any, self.commands().run, "pwd", cwd="no/such/dir"
        )
        self.assertIn("NOT_FOUND", str(error))

    @inlineCallbacks
    def test_nonexistent_program(self) -> Any:
        """A program that is not there is NOT_FOUND, for Execute and Start."""
        pb, _ = stubs()
        stub = self.stub()
        request = config(pb, ["no-such-program-kep-conformance"])
        error = yield self.blocking(
            self.caught, stub.Execute, pb.ExecuteRequest(config=request), timeout=10
        )
        self.assertEqual(status_of(error)[0], "NOT_FOUND")
        error = yield self.blocking(
            self.caught,
            lambda: list(stub.Start(pb.StartRequest(config=request), timeout=10)),
        )
        self.assertEqual(status_of(error)[0], "NOT_FOUND")

    # -- Start

    @inlineCallbacks
    def test_start_event_order(self) -> Any:
        """
        Start streams one init (a positive id) first, the output as it
        comes, one exit last with the exit code, then ends OK.
        """
        pb, _ = stubs()
        request = pb.StartRequest(
            config=config(pb, ["sh", "-c", "echo out; echo err 1>&2; exit 7"])
        )
        got = yield self.blocking(
            lambda: events(self.stub().Start(request, timeout=10))
        )
        kinds = [kind for kind, _ in got]
        self.assertEqual(kinds[0], "init")
        self.assertGreater(got[0][1], 0)
        self.assertEqual(got[-1], ("exit", 7))
        self.assertEqual((kinds.count("init"), kinds.count("exit")), (1, 1))
        self.assertEqual(
            sorted(item for item in got[1:-1]),
            [("stderr", b"err\n"), ("stdout", b"out\n")],
        )

    @inlineCallbacks
    def test_reflection_not_served(self) -> Any:
        """
        gRPC server reflection is not served (``UNIMPLEMENTED``, in both of
        its versions), where the reference serves it; the descriptor set
        the door's page writes for ``grpcurl -protoset`` describes the
        service the port serves, method by method.
        """
        import grpc
        from google.protobuf import descriptor_pb2

        from sandboxd.kep import schema

        def reflect(path: str) -> str:
            with grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
                call = channel.unary_unary(path)
                try:
                    call(b"", timeout=10)
                except grpc.RpcError as e:
                    return str(e.code().name)
            return "OK"

        for version in ("v1", "v1alpha"):
            path = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
            code = yield self.blocking(reflect, path)
            self.assertEqual(code, "UNIMPLEMENTED", path)
        here = os.path.dirname(os.path.abspath(__file__))
        with open(os.path.join(here, "..", "..", "docs", "kep.md")) as f:
            page = f.read()
        section = page.split("\n## With grpcurl\n", 1)[1]
        recipe = section.split("```python\n", 1)[1].split("```", 1)[0]
        written = os.path.abspath(self.mktemp())
        exec(recipe.replace('"process.protoset"', repr(written)), {})
        with open(written, "rb") as f:
            files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
        services = [
            (f"{f.package}.{service.name}", service)
            for f in files.file
            for service in f.service
        ]
        self.assertEqual([name for name, _ in services], [schema.SERVICE])
        described = [
            (m.name, m.server_streaming, m.input_type, m.output_type)
            for m in services[0][1].method
        ]
        served = [
            (
                rpc.name,
                rpc.server_streaming,
                "." + rpc.request.name,
                "." + rpc.response.name,
            )
            for rpc in schema.RPCS
        ]
        self.assertEqual(described, served)

    @inlineCallbacks
    def test_ids_are_pids(self) -> Any:
        """
        The init's id is the process's own pid.  Differs on purpose: the
        reference hands out ids of its own counting, 1, 2, ...
        """

        def job() -> Any:
            stub, stream, pid = self.start_call(["sh", "-c", "echo $$; read x"])
            line = b""
            while not line.endswith(b"\n"):
                line += next(stream).stdout
            pb, _ = stubs()
            stub.WriteStdin(_eof(pb, pid), timeout=5)
            events(stream)
            return pid, int(line)

        pid, printed = yield self.blocking(job)
        self.assertEqual(pid, printed)

    @inlineCallbacks
    def test_stdin_and_eof(self) -> Any:
        """WriteStdin reaches the process; ``eof`` closes its stdin and it ends."""
        pb, _ = stubs()

        def job() -> Any:
            stub, stream, pid = self.start_call(["cat"])
            stub.WriteStdin(
                pb.WriteStdinRequest(process_id=pid, input=b"piped-through"), timeout=5
            )
            stub.WriteStdin(_eof(pb, pid), timeout=5)
            return events(stream)

        got = yield self.blocking(job)
        self.assertEqual(got, [("stdout", b"piped-through"), ("exit", 0)])

    @inlineCallbacks
    def test_unknown_id(self) -> Any:
        """An id no process has is NOT_FOUND for WriteStdin, SendSignal, ResizeTTY."""
        pb, _ = stubs()
        stub = self.stub()
        calls = [
            (stub.WriteStdin, pb.WriteStdinRequest(process_id=NO_SUCH_ID, input=b"x")),
            (
                stub.SendSignal,
                pb.SendSignalRequest(process_id=NO_SUCH_ID, signal=pb.SIGNAL_SIGTERM),
            ),
            (
                stub.ResizeTTY,
                pb.ResizeTTYRequest(process_id=NO_SUCH_ID, cols=1, rows=1),
            ),
        ]
        for method, request in calls:
            error = yield self.blocking(self.caught, method, request, timeout=5)
            self.assertEqual(status_of(error)[0], "NOT_FOUND", method)

    @inlineCallbacks
    def test_unknown_id_with_unspecified_signal(self) -> Any:
        """An unknown id is NOT_FOUND even with no signal, as the reference looks it up first."""
        pb, _ = stubs()
        error = yield self.blocking(
            self.caught,
            self.stub().SendSignal,
            pb.SendSignalRequest(process_id=NO_SUCH_ID),
            timeout=5,
        )
        self.assertEqual(status_of(error)[0], "NOT_FOUND")

    @inlineCallbacks
    def test_id_gone_after_start_returned(self) -> Any:
        """Once Start's stream has ended, its id is NOT_FOUND."""
        pb, _ = stubs()

        def job() -> Any:
            stub, stream, pid = self.start_call(["true"])
            self.assertEqual(events(stream)[-1], ("exit", 0))
            return [
                self.caught(
                    stub.WriteStdin,
                    pb.WriteStdinRequest(process_id=pid, input=b"x"),
                    timeout=5,
                ),
                self.caught(
                    stub.SendSignal,
                    pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGKILL),
                    timeout=5,
                ),
                self.caught(
                    stub.ResizeTTY,
                    pb.ResizeTTYRequest(process_id=pid, cols=1, rows=1),
                    timeout=5,
                ),
            ]

        errors = yield self.blocking(job)
        self.assertEqual([status_of(e)[0] for e in errors], ["NOT_FOUND"] * 3)

    @inlineCallbacks
    def test_unspecified_signal(self) -> Any:
        """No signal is INVALID_ARGUMENT; SIGKILL then ends the process, non-zero."""
        pb, _ = stubs()

        def job() -> Any:
            stub, stream, pid = self.start_call(["sleep", "30"])
            refused = self.caught(
                stub.SendSignal, pb.SendSignalRequest(process_id=pid), timeout=5
            )
            stub.SendSignal(
                pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGKILL),
                timeout=5,
            )
            return refused, events(stream)

        refused, got = yield self.blocking(job)
        self.assertEqual(status_of(refused)[0], "INVALID_ARGUMENT")
        self.assertEqual(got, [("exit", -1)])

    @inlineCallbacks
    def test_sigterm(self) -> Any:
        """SIGTERM ends the process; its exit code is -1 (a signal's), not 0."""
        pb, _ = stubs()

        def job() -> Any:
            stub, stream, pid = self.start_call(["sleep", "30"])
            stub.SendSignal(
                pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGTERM),
                timeout=5,
            )
            return events(stream)

        got = yield self.blocking(job)
        self.assertEqual(got, [("exit", -1)])

    @inlineCallbacks
    def test_sigint(self) -> Any:
        """SIGINT is delivered: a shell that traps it says so and exits 130."""
        pb, _ = stubs()
        script = (
            "trap 'echo got-int; exit 130' INT; echo ready; while :; do sleep 0.1; done"
        )

        def job() -> Any:
            stub, stream, pid = self.start_call(["sh", "-c", script])
            seen = b""
            while b"ready" not in seen:
                seen += next(stream).stdout
            stub.SendSignal(
                pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGINT),
                timeout=5,
            )
            return events(stream)

        got = yield self.blocking(job)
        self.assertIn(b"got-int", b"".join(v for k, v in got if k == "stdout"))
        self.assertEqual(got[-1], ("exit", 130))

    @inlineCallbacks
    def test_signal_reaches_the_group(self) -> Any:
        """A signal goes to the process's group: a background child ends too."""
        pb, _ = stubs()

        def job() -> Any:
            stub, stream, pid = self.start_call(
                ["sh", "-c", "sleep 300 & echo $!; wait"]
            )
            line = b""
            while not line.endswith(b"\n"):
                line += next(stream).stdout
            stub.SendSignal(
                pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGTERM),
                timeout=5,
            )
            return int(line), events(stream)

        child, got = yield self.blocking(job)
        self.assertEqual(got[-1], ("exit", -1))
        for _ in range(50):
            if not alive(child):
                break
            yield self.sleep(0.1)
        self.assertFalse(alive(child), "the group's other process outlived SIGTERM")

    @inlineCallbacks
    def test_start_signalled_exit_code(self) -> Any:
        """A command that a signal ends reports exit code -1 in its exit event."""
        pb, _ = stubs()
        request = pb.StartRequest(config=config(pb, ["sh", "-c", "kill -TERM $$"]))
        got = yield self.blocking(
            lambda: events(self.stub().Start(request, timeout=10))
        )
        self.assertEqual(got[-1], ("exit", -1))

    @inlineCallbacks
    def test_resize_without_pty(self) -> Any:
        """ResizeTTY on a process without a terminal is FAILED_PRECONDITION."""
        pb, _ = stubs()

        def job() -> Any:
            stub, stream, pid = self.start_call(["sleep", "30"])
            error = self.caught(
                stub.ResizeTTY,
                pb.ResizeTTYRequest(process_id=pid, cols=80, rows=24),
                timeout=5,
            )
            stub.SendSignal(
                pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGKILL),
                timeout=5,
            )
            events(stream)
            return error

        error = yield self.blocking(job)
        self.assertEqual(status_of(error)[0], "FAILED_PRECONDITION")

    @inlineCallbacks
    def test_pty_size(self) -> Any:
        """A Start with a ``pty`` runs on a terminal of that size (``stty size``)."""
        pb, _ = stubs()
        request = pb.StartRequest(
            config=config(pb, ["sh", "-c", "stty size"]), pty=pb.PTY(cols=80, rows=24)
        )
        got = yield self.blocking(
            lambda: events(self.stub().Start(request, timeout=10))
        )
        self.assertEqual(got[-1], ("exit", 0))
        self.assertIn(b"24 80", b"".join(v for k, v in got if k == "stdout"))

    @inlineCallbacks
    def test_pty_output_is_stdout(self) -> Any:
        """On a terminal both outputs come as ``stdout`` chunks, none as ``stderr``."""
        pb, _ = stubs()
        request = pb.StartRequest(
            config=config(pb, ["sh", "-c", "echo out; echo err >&2"]),
            pty=pb.PTY(cols=80, rows=24),
        )
        got = yield self.blocking(
            lambda: events(self.stub().Start(request, timeout=10))
        )
        self.assertEqual([k for k, _ in got], ["init", "stdout", "exit"])
        self.assertEqual(got[1][1].replace(b"\r\n", b"\n"), b"out\nerr\n")

    @inlineCallbacks
    def test_pty_resize(self) -> Any:
        """ResizeTTY on a terminal's process answers OK; SIGKILL then ends it."""
        pb, _ = stubs()

        def job() -> Any:
            stub, stream, pid = self.start_call(["cat"], pty=pb.PTY(cols=80, rows=24))
            stub.ResizeTTY(
                pb.ResizeTTYRequest(process_id=pid, cols=120, rows=40), timeout=5
            )
            stub.SendSignal(
                pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGKILL),
                timeout=5,
            )
            return events(stream)

        got = yield self.blocking(job)
        self.assertEqual(got[-1][0], "exit")

    @inlineCallbacks
    def test_cancel_ends_the_group(self) -> Any:
        """
        A Start the client cancels ends the process.  Differs on purpose:
        the whole group ends, where the reference ends only the direct
        child and a background child outlives it.
        """

        def job() -> Any:
            _, stream, _ = self.start_call(["sh", "-c", "sleep 300 & echo $!; wait"])
            line = b""
            while not line.endswith(b"\n"):
                line += next(stream).stdout
            stream.cancel()
            return int(line)

        child = yield self.blocking(job)
        for _ in range(50):
            if not alive(child):
                break
            yield self.sleep(0.1)
        self.assertFalse(alive(child))

    @inlineCallbacks
    def test_shutdown_ends_start_with_exit(self) -> Any:
        """
        When the daemon stops, a running Start's process is ended and its
        stream closes with an exit event whose code is not 0.
        """

        def begin() -> Any:
            return self.start_call(["sleep", "300"])

        _, stream, pid = yield self.blocking(begin)
        stopping = self.daemon.stop()
        got = yield self.blocking(self.caught, events, stream)
        yield stopping
        self.assertIsInstance(got, list, got)
        self.assertEqual(got[-1][0], "exit")
        self.assertNotEqual(got[-1][1], 0)
        self.assertFalse(alive(pid))

    @inlineCallbacks
    def test_stdin_after_eof(self) -> Any:
        """
        A second eof changes nothing and is answered OK, as the reference
        answers it; input after an eof is FAILED_PRECONDITION saying the
        stdin was closed by that eof (a Start has no "stdin" option).
        """
        pb, _ = stubs()
        stub = self.stub()

        def job() -> Any:
            stream = stub.Start(
                pb.StartRequest(config=config(pb, ["/bin/sh", "-c", "cat; sleep 30"])),
                timeout=20,
            )
            pid = next(stream).init.process_id
            stub.WriteStdin(_eof(pb, pid), timeout=5)
            again = self.caught(stub.WriteStdin, _eof(pb, pid), timeout=5)
            late = self.caught(
                stub.WriteStdin,
                pb.WriteStdinRequest(process_id=pid, input=b"x"),
                timeout=5,
            )
            stream.cancel()
            return pid, again, late

        pid, again, late = yield self.blocking(job)
        self.assertNotIsInstance(again, grpc.RpcError)
        name, message, trailers = status_of(late)
        self.assertEqual(
            (name, message, trailers["x-sandboxd-code"]),
            (
                "FAILED_PRECONDITION",
                f"process {pid}'s stdin is closed (an eof was sent)",
                "stdin_closed",
            ),
        )

    @inlineCallbacks
    def test_programs_that_cannot_run(self) -> Any:
        """
        A program that is there but cannot run (a file without the execute
        bit, a directory) is PERMISSION_DENIED, as the reference answers
        EACCES; one that is not there is NOT_FOUND naming the program (not
        the script a shell was handed), quoted once.
        """
        plain = os.path.join(self.base_dir, "plain.txt")
        with open(plain, "w") as f:
            f.write("not a program")
        pb, _ = stubs()
        stub = self.stub()
        cases = [
            (
                ["./plain.txt"],
                {},
                "PERMISSION_DENIED",
                "'./plain.txt': permission denied",
            ),
            ([plain], {}, "PERMISSION_DENIED", "permission denied"),
            (["/tmp"], {}, "PERMISSION_DENIED", "'/tmp': permission denied"),
            (
                ["sh", "-c", "echo $PATH"],
                {"PATH": "/nowhere"},
                "NOT_FOUND",
                "cannot run 'sh': command or path not found",
            ),
            (
                ["ñandú-missing"],
                {},
                "NOT_FOUND",
                "cannot run 'ñandú-missing': command or path not found",
            ),
        ]
        for argv, env, want, text in cases:
            for start in (False, True):
                request = config(pb, argv, env_vars=env)

                def job(request: Any = request, start: bool = start) -> Any:
                    if start:
                        return self.caught(
                            list,
                            stub.Start(pb.StartRequest(config=request), timeout=10),
                        )
                    return self.caught(
                        stub.Execute, pb.ExecuteRequest(config=request), timeout=10
                    )

                error = yield self.blocking(job)
                self.assertIsInstance(error, grpc.RpcError, f"{argv} {start}")
                name, message, _ = status_of(error)
                self.assertEqual(name, want, f"{argv} {start}: {message}")
                self.assertIn(text, message)

    @inlineCallbacks
    def test_background_job_output_is_waited_for(self) -> Any:
        """
        A job the command leaves in the background (``cmd &``) writing to
        the inherited output is waited for, as the reference waits, rather
        than cut off when the shell exits: its output arrives and it runs
        on (it is not killed by SIGPIPE), through the SDK's ``run``,
        ``Execute`` and ``Start``.
        """
        marker = os.path.join(self.base_dir, "after")
        script = f"(sleep 1; echo late; touch {marker}) & echo early"
        result = yield self.blocking(self.commands().run, script)
        self.assertEqual((result.stdout, result.exit_code), ("early\nlate\n", 0))
        self.assertTrue(os.path.exists(marker))
        os.unlink(marker)
        pb, _ = stubs()
        answer = yield self.blocking(
            self.stub().Execute,
            pb.ExecuteRequest(config=config(pb, ["/bin/sh", "-c", script])),
            timeout=10,
        )
        self.assertEqual((answer.stdout, answer.exit_code), (b"early\nlate\n", 0))
        os.unlink(marker)
        _, stream, _ = yield self.blocking(self.start_call, ["/bin/sh", "-c", script])
        got = yield self.blocking(events, stream)
        self.assertEqual(got, [("stdout", b"early\nlate\n"), ("exit", 0)])
        self.assertTrue(os.path.exists(marker))

    @inlineCallbacks
    def test_background_job_wait_is_bounded(self) -> Any:
        """
        A background job that keeps the output open is waited for a
        bounded time only (``Start``: 5 seconds, as the reference's
        ``pipeDrainGrace``), then the stream ends with the command's exit.
        """
        started = time.monotonic()
        _, stream, _ = yield self.blocking(
            self.start_call, ["/bin/sh", "-c", "sleep 30 & echo $!"]
        )
        got = yield self.blocking(events, stream)
        took = time.monotonic() - started
        self.assertEqual(got[-1], ("exit", 0))
        self.assertTrue(4 <= took < 15, took)
        os.kill(int(got[0][1]), signal.SIGKILL)

    def caught_any(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            return e


class PolicyConformance(ConformanceCase, ProcessCase):
    """What sandboxd keeps that the reference has not: its policy and its bounds."""

    extra_policy = {
        "endpoints": {
            "shell": {"limits": {"max_output_bytes": 64}},
            "files_*": {"paths": {"deny": ["**/secret*"]}},
        }
    }

    @inlineCallbacks
    def test_output_cap(self) -> Any:
        """
        Differs on purpose: Execute's output is capped by the policy
        (``max_output_bytes``), where the reference buffers all of it.
        """
        result = yield self.blocking(self.commands().run, "head -c 1000 /dev/zero")
        self.assertEqual(result.exit_code, 0)
        self.assertLessEqual(len(result.stdout), 64)

    @inlineCallbacks
    def test_policy_denies_a_path(self) -> Any:
        """
        Differs on purpose: a path the policy denies is 403
        PERMISSION_DENIED, though inside the root.
        """
        self.put_file("secret.txt")
        r = yield self.http("GET", "/v1/files/secret.txt")
        self.assert_error(r, 403, "PERMISSION_DENIED")
