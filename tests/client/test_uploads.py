# -*- test-case-name: tests.client.test_uploads -*-
"""
``files.upload`` of a large file as a resumable upload: a connection cut
mid-upload (a proxy in front of the daemon ends it after some bytes) is
carried on from the daemon's offset, not sent again whole; an upload id
carries it on in a later call.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.client import AsyncSandbox, Sandbox
from sandboxd.client._core import RESUMABLE_UPLOAD_BYTES
from sandboxd.client._shared import ResumableUpload
from sandboxd.client.errors import ConnectionFailed, InvalidParam, UploadMismatch
from sandboxd.files.atomic import TEMPORARY_NAME
from tests.client.base import ClientCase, CutProxy, listen_proxy
from tests.helpers import unnamed_files

#: A file just over the threshold, cut about a third of the way in.
SIZE = RESUMABLE_UPLOAD_BYTES + 1024 * 1024 + 7
CUT_AT = 3_000_000


def _offsets(proxy: CutProxy) -> list[int]:
    """The ``offset`` of every append the proxy carried, in order."""
    pattern = re.compile(rb"POST /files/uploads/\w+\?offset=(\d+) HTTP/1.1\r\n")
    return [int(m.group(1)) for sent in proxy.requests for m in pattern.finditer(sent)]


class UploadResumeTests(ClientCase):
    """Cut uploads, carried on."""

    def local_file(self) -> tuple[str, bytes]:
        data = os.urandom(SIZE)
        local = os.path.join(os.path.realpath(self.mktemp()))
        with open(local, "wb") as f:
            f.write(data)
        return local, data

    def cut_once(self) -> tuple[CutProxy, str]:
        def cut(index: int, sent: bytes) -> bool:
            return proxy.cuts == 0 and len(sent) > CUT_AT

        proxy, url = listen_proxy(self, lambda i, seen: False, cut)
        return proxy, url

    def check_resumed(self, proxy: CutProxy, data: bytes, written: Any) -> None:
        """One cut; the second append starts past 0; about one file's worth sent in all."""
        self.assertEqual(proxy.cuts, 1)
        offsets = _offsets(proxy)
        self.assertEqual(offsets[0], 0)
        self.assertEqual(len(offsets), 2, offsets)
        self.assertGreater(offsets[1], 0)
        sent = sum(len(r) for r in proxy.requests)
        self.assertLess(sent, len(data) + 100_000)
        self.assertTrue(written["complete"])
        self.assertEqual(written["sha256"], hashlib.sha256(data).hexdigest())
        with open(self.path("up.bin"), "rb") as f:
            self.assertEqual(f.read(), data)
        self.assertEqual(
            [n for n in os.listdir(self.base_dir) if TEMPORARY_NAME.match(n)], []
        )

    def test_sync_upload_resumes_after_cut(self) -> Any:
        """
        Sandbox.files.upload cut after ~3 MB asks the daemon for its offset
        and sends only the rest: the file is whole, progress reaches the
        total, and the bytes sent are about one file, not one and a third.
        """
        local, data = self.local_file()
        proxy, url = self.cut_once()
        seen: list[tuple[int, int | None]] = []

        def body() -> None:
            with Sandbox(url, token=self.daemon.token) as sb:
                written = sb.files.upload(
                    local, "up.bin", progress=lambda n, t: seen.append((n, t))
                )
            self.check_resumed(proxy, data, written)
            self.assertEqual(seen[-1], (len(data), len(data)))

        return self.in_thread(body)

    def test_async_upload_resumes_after_cut(self) -> Any:
        """AsyncSandbox.files.upload carries on after a cut as the blocking client does."""
        local, data = self.local_file()
        proxy, url = self.cut_once()

        async def body() -> None:
            async with AsyncSandbox(url, token=self.daemon.token) as sb:
                written = await sb.files.upload(local, "up.bin")
            self.check_resumed(proxy, data, written)

        return self.in_loop(body)

    def test_upload_id_resumes_in_a_later_call(self) -> Any:
        """
        When the daemon goes away mid-upload, ConnectionFailed carries the
        upload id; a later upload(upload_id=...) sends only the rest.
        """
        local, data = self.local_file()

        def cut(index: int, sent: bytes) -> bool:
            if proxy.cuts == 0 and len(sent) > CUT_AT:
                proxy.refuse = True  # and it does not come back
                return True
            return False

        proxy, url = listen_proxy(self, lambda i, seen: False, cut)
        ids: list[str] = []

        def body() -> None:
            with Sandbox(url, token=self.daemon.token, retries=1) as sb:
                with self.assertRaises(ConnectionFailed) as caught:
                    sb.files.upload(local, "up.bin", on_upload_id=ids.append)
                self.assertFalse(os.path.exists(self.path("up.bin")))
                upload_id = caught.exception.body["upload_id"]
                self.assertEqual(ids, [upload_id])
                proxy.refuse = False
                before = sum(len(r) for r in proxy.requests)
                written = sb.files.upload(local, "up.bin", upload_id=upload_id)
            after = sum(len(r) for r in proxy.requests)
            self.assertLess(after - before, len(data) - CUT_AT // 2)
            self.assertEqual(written["sha256"], hashlib.sha256(data).hexdigest())
            with open(self.path("up.bin"), "rb") as f:
                self.assertEqual(f.read(), data)

        return self.in_thread(body)

    def test_small_file_is_one_raw_write(self) -> Any:
        """A file under the threshold goes in one POST /files/raw, as before."""
        small = os.path.join(os.path.realpath(self.mktemp()))
        with open(small, "wb") as f:
            f.write(b"small")
        proxy, url = listen_proxy(self, lambda i, seen: False)

        def body() -> None:
            with Sandbox(url, token=self.daemon.token) as sb:
                written = sb.files.upload(small, "s.txt")
            self.assertEqual(written["bytes"], 5)
            self.assertNotIn("complete", written)
            self.assertEqual(len(proxy.requests), 1)
            self.assertTrue(bytes(proxy.requests[0]).startswith(b"POST /files/raw?"))

        return self.in_thread(body)


class UploadIdMismatchTests(ClientCase):
    """
    An ``upload_id=`` whose upload is for another target or size is refused
    by the client before a byte is sent; a matching one carries on.
    """

    #: What the other upload already holds when the call is made.
    HELD = 1000

    def local_file(self) -> tuple[str, bytes]:
        data = os.urandom(200_000)
        local = os.path.realpath(self.mktemp())
        with open(local, "wb") as f:
            f.write(data)
        return local, data

    @inlineCallbacks
    def other_upload(self, path: str, data: bytes, size: int | None = None) -> Any:
        """An open upload to ``path`` holding ``data``'s first HELD bytes: its id."""
        reply = yield self.request(
            "POST",
            "/files/uploads",
            {"path": path, "size": len(data) if size is None else size},
        )
        self.assertEqual(reply.status, 201, reply.body)
        upload_id = reply.json()["upload_id"]
        reply = yield self.request(
            "POST",
            f"/files/uploads/{upload_id}?offset=0",
            raw_body=data[: self.HELD],
            headers={"Content-Type": "application/octet-stream"},
        )
        self.assertEqual(reply.status, 200, reply.body)
        return upload_id

    def staging(self) -> list[str]:
        """The open upload's staging file: hidden, or unnamed (held by the daemon)."""
        named = [n for n in os.listdir(self.base_dir) if TEMPORARY_NAME.match(n)]
        return named + unnamed_files(self.base_dir)

    @inlineCallbacks
    def check_untouched(self, upload_id: str, *paths: str) -> Any:
        """No file at ``paths``; the other upload still open, at HELD bytes."""
        for path in paths:
            self.assertFalse(os.path.exists(self.path(path)), path)
        reply = yield self.request("GET", f"/files/uploads/{upload_id}")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["offset"], self.HELD)
        self.assertEqual(len(self.staging()), 1, self.staging())

    def check_mismatch(self, error: UploadMismatch, upload_id: str) -> None:
        """The error names the id, the upload's target and the call's."""
        self.assertIsInstance(error, InvalidParam)
        self.assertEqual(error.code, "invalid_param")
        self.assertIsNone(error.status)
        self.assertIn(upload_id, error.message)
        self.assertEqual(error.body["upload_id"], upload_id)

    @inlineCallbacks
    def test_sync_wrong_path_is_refused(self) -> Any:
        """
        Sandbox.files.upload(local, "up.bin", upload_id=...) of an upload to
        other.bin raises UploadMismatch naming both paths: nothing is
        written at either path and the other upload stays at its offset.
        """
        local, data = self.local_file()
        upload_id = yield self.other_upload("other.bin", data)

        def body() -> None:
            with self.assertRaises(UploadMismatch) as caught:
                self.sandbox().files.upload(local, "up.bin", upload_id=upload_id)
            error = caught.exception
            self.check_mismatch(error, upload_id)
            self.assertIn(self.path("other.bin"), error.message)
            self.assertIn("up.bin", error.message)
            self.assertEqual(error.body["path"], self.path("other.bin"))
            self.assertEqual(error.body["remote"], "up.bin")

        yield self.in_thread(body)
        yield self.check_untouched(upload_id, "up.bin", "other.bin")

    @inlineCallbacks
    def test_sync_wrong_size_is_refused(self) -> Any:
        """
        An upload_id whose upload to the same path is of another size raises
        UploadMismatch naming both sizes; nothing is written, no new upload
        is created, the other upload stays at its offset.
        """
        local, data = self.local_file()
        upload_id = yield self.other_upload("up.bin", data, size=len(data) + 1)

        def body() -> None:
            with self.assertRaises(UploadMismatch) as caught:
                self.sandbox().files.upload(local, "up.bin", upload_id=upload_id)
            error = caught.exception
            self.check_mismatch(error, upload_id)
            self.assertIn(str(len(data) + 1), error.message)
            self.assertIn(str(len(data)), error.message)
            self.assertEqual(
                (error.body["size"], error.body["local_size"]),
                (len(data) + 1, len(data)),
            )

        yield self.in_thread(body)
        yield self.check_untouched(upload_id, "up.bin")

    @inlineCallbacks
    def test_async_wrong_path_is_refused(self) -> Any:
        """AsyncSandbox.files.upload refuses an upload_id of another path the same way."""
        local, data = self.local_file()
        upload_id = yield self.other_upload("other.bin", data)

        async def body() -> None:
            async with self.async_sandbox() as sb:
                with self.assertRaises(UploadMismatch) as caught:
                    await sb.files.upload(local, "up.bin", upload_id=upload_id)
            self.check_mismatch(caught.exception, upload_id)
            self.assertEqual(caught.exception.body["path"], self.path("other.bin"))

        yield self.in_loop(body)
        yield self.check_untouched(upload_id, "up.bin", "other.bin")

    @inlineCallbacks
    def test_async_wrong_size_is_refused(self) -> Any:
        """AsyncSandbox.files.upload refuses an upload_id of another size the same way."""
        local, data = self.local_file()
        upload_id = yield self.other_upload("up.bin", data, size=len(data) - 1)

        async def body() -> None:
            async with self.async_sandbox() as sb:
                with self.assertRaises(UploadMismatch) as caught:
                    await sb.files.upload(local, "up.bin", upload_id=upload_id)
            self.check_mismatch(caught.exception, upload_id)

        yield self.in_loop(body)
        yield self.check_untouched(upload_id, "up.bin")

    @inlineCallbacks
    def check_resumed(self, upload_id: str, data: bytes, written: Any) -> Any:
        """The file whole at up.bin, through the given upload (now gone)."""
        self.assertEqual(written["sha256"], hashlib.sha256(data).hexdigest())
        with open(self.path("up.bin"), "rb") as f:
            self.assertEqual(f.read(), data)
        reply = yield self.request("GET", f"/files/uploads/{upload_id}")
        self.assertEqual(reply.status, 404, reply.body)
        self.assertEqual(self.staging(), [])

    @inlineCallbacks
    def test_sync_matching_id_resumes(self) -> Any:
        """
        An upload_id of this path and size carries on as before, whether the
        path is spelt as at the create ("./up.bin" then "up.bin" are the same
        request path) or as the daemon resolved it.
        """
        for created, remote in (("./up.bin", "up.bin"), ("up.bin", None)):
            local, data = self.local_file()
            upload_id = yield self.other_upload(created, data)
            target = remote or self.path("up.bin")
            written = yield self.in_thread(
                self.sandbox().files.upload, local, target, upload_id=upload_id
            )
            yield self.check_resumed(upload_id, data, written)

    @inlineCallbacks
    def test_async_matching_id_resumes(self) -> Any:
        """AsyncSandbox.files.upload carries a matching upload_id on as before."""
        local, data = self.local_file()
        upload_id = yield self.other_upload("up.bin", data)

        async def body() -> Any:
            async with self.async_sandbox() as sb:
                return await sb.files.upload(local, "up.bin", upload_id=upload_id)

        written = yield self.in_loop(body)
        yield self.check_resumed(upload_id, data, written)


class ResumeCheckTests(SynchronousTestCase):
    """How ResumableUpload compares an upload's record with its call, no daemon."""

    def steps(self, remote: str) -> ResumableUpload:
        return ResumableUpload("/local", remote, 10, True, None, "u1", 3)

    def record(self, **fields: Any) -> dict[str, Any]:
        return {"upload_id": "u1", "size": 10, "offset": 4, **fields}

    def test_older_daemon_record(self) -> None:
        """
        A record without requested_path (an older daemon): an absolute
        remote is compared with the resolved path; a relative one cannot be
        compared, so the upload starts over (None) rather than guess.
        """
        old = self.record(path="/w/up.bin")
        self.assertEqual(self.steps("/w/up.bin").resumed(old), old)
        self.assertIsNone(self.steps("up.bin").resumed(old))
        with self.assertRaises(UploadMismatch):
            self.steps("/w/other.bin").resumed(old)

    def test_spellings(self) -> None:
        """The request path compares as the daemon reads it (normalised)."""
        record = self.record(path="/w/d/up.bin", requested_path="d//./up.bin")
        for remote in ("d/up.bin", "./d/up.bin", "d/x/../up.bin", "/w/d/up.bin"):
            self.assertEqual(self.steps(remote).resumed(record), record, remote)
        for remote in ("up.bin", "/w/up.bin", "e/up.bin"):
            with self.assertRaises(UploadMismatch):
                self.steps(remote).resumed(record)


class NoResumableUploadsTests(ClientCase):
    """A daemon whose policy switches the resumable uploads off."""

    policy = {"endpoints": {"files_uploads_create": {"enabled": False}}}

    def test_large_file_falls_back_to_one_raw_write(self) -> Any:
        """A large file still arrives, in one POST /files/raw, when /files/uploads is disabled."""
        data = os.urandom(SIZE)
        local = os.path.join(os.path.realpath(self.mktemp()))
        with open(local, "wb") as f:
            f.write(data)

        def body() -> None:
            written = self.sandbox().files.upload(local, "up.bin")
            self.assertNotIn("complete", written)
            self.assertEqual(written["sha256"], hashlib.sha256(data).hexdigest())
            with open(self.path("up.bin"), "rb") as f:
                self.assertEqual(f.read(), data)

        return self.in_thread(body)


class FullUploadTableTests(ClientCase):
    """A daemon whose every upload slot is held (by clients that died)."""

    policy = {"endpoints": {"files_uploads_create": {"limits": {"max_sessions": 1}}}}

    def test_large_file_falls_back_to_one_raw_write(self) -> Any:
        """With no upload slot left (429 too_many_sessions), a large file arrives in one raw write."""
        data = os.urandom(SIZE)
        local = os.path.join(os.path.realpath(self.mktemp()))
        with open(local, "wb") as f:
            f.write(data)

        def body() -> None:
            written = self.sandbox().files.upload(local, "up.bin")
            self.assertNotIn("complete", written)
            with open(self.path("up.bin"), "rb") as f:
                self.assertEqual(f.read(), data)

        # The one slot, held by an upload nobody finishes.
        d = self.request("POST", "/files/uploads", {"path": "held.bin", "size": 5})
        d.addCallback(lambda reply: self.assertEqual(reply.status, 201))
        d.addCallback(lambda _: self.in_thread(body))
        return d


class RawOnlyLimitTests(ClientCase):
    """A policy that raised files_write_raw's max_bytes but not the uploads'."""

    policy = {
        "endpoints": {
            "files_uploads_create": {"limits": {"max_bytes": 1024 * 1024}},
            "files_write_raw": {"limits": {"max_bytes": 64 * 1024 * 1024}},
        }
    }

    def test_large_file_goes_as_one_raw_write(self) -> Any:
        """
        A file over the resumable path's limit but within the raw write's
        arrives whole in one POST /files/raw, instead of failing with 413.
        """
        data = os.urandom(SIZE)
        local = os.path.join(os.path.realpath(self.mktemp()))
        with open(local, "wb") as f:
            f.write(data)

        def body() -> None:
            written = self.sandbox().files.upload(local, "raw.bin")
            self.assertNotIn("complete", written)
            self.assertEqual(written["sha256"], hashlib.sha256(data).hexdigest())
            with open(self.path("raw.bin"), "rb") as f:
                self.assertEqual(f.read(), data)

        return self.in_thread(body)

    def test_async_large_file_goes_as_one_raw_write(self) -> Any:
        """The asyncio client falls back the same way."""
        data = os.urandom(SIZE)
        local = os.path.join(os.path.realpath(self.mktemp()))
        with open(local, "wb") as f:
            f.write(data)

        async def body() -> None:
            async with self.async_sandbox() as sb:
                written = await sb.files.upload(local, "araw.bin")
            self.assertEqual(written["sha256"], hashlib.sha256(data).hexdigest())

        return self.in_loop(body)
