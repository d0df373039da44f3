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

from sandboxd.client import AsyncSandbox, Sandbox
from sandboxd.client._core import RESUMABLE_UPLOAD_BYTES
from sandboxd.client.errors import ConnectionFailed
from sandboxd.files.atomic import TEMPORARY_NAME
from tests.client.base import ClientCase, CutProxy, listen_proxy

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
