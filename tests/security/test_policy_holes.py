"""
Policy rules that some path did not enforce (SPEC §5, §11): each case
sends the request to a real daemon and checks the SPEC §6 code, the
``rule`` and that nothing was made on the way.
"""

from __future__ import annotations

import base64
import io
import os
import tarfile
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.helpers import DaemonTestCase

DENY_SECRET = {"endpoints": {"group:file_ops": {"paths": {"deny": ["**/*.secret"]}}}}


#: The rule a path refused by DENY_SECRET names (as for `x.secret` itself).
RULE = "policy:endpoints.group:file_ops"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def tree(root: str) -> list[str]:
    """Every path below ``root``, relative, sorted."""
    found = []
    for top, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            found.append(os.path.relpath(os.path.join(top, name), root))
    return sorted(found)


def tar_gz(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


class ImplicitParentTests(DaemonTestCase):
    """
    A directory the policy denies is not created as the parent of a write:
    every route that makes parents refuses with the code and rule the
    denied directory gets, before anything is made.
    """

    policy = DENY_SECRET

    def assert_denied(self, reply: Any, before: list[str]) -> None:
        self.assertEqual(reply.status, 403, reply.body)
        body = reply.json()
        self.assertEqual(body["code"], "path_denied", body)
        self.assertEqual(body.get("rule"), RULE, body)
        self.assertEqual(tree(self.base_dir), before)

    @inlineCallbacks
    def test_upload(self) -> Any:
        """``POST /upload`` to ``a/x.secret/f`` makes neither ``a`` nor ``a/x.secret``."""
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST", "/upload", {"path": "a/x.secret/f", "content_base64": b64(b"x")}
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_upload_stream(self) -> Any:
        """``POST /files/upload-stream`` likewise."""
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST",
            "/files/upload-stream",
            {"path": "x.secret/deep/f", "content_base64": b64(b"x")},
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_raw_write(self) -> Any:
        """``POST /files/raw`` likewise."""
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST",
            "/files/raw?path=x.secret/f",
            raw_body=b"abc",
            headers={"Content-Type": "application/octet-stream"},
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_mkdir(self) -> Any:
        """``POST /files/mkdir`` of ``x.secret/sub`` makes no ``x.secret``."""
        before = tree(self.base_dir)
        reply = yield self.request("POST", "/files/mkdir", {"path": "x.secret/sub"})
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_move_destination(self) -> Any:
        """A move into ``x.secret/f`` leaves the source and makes no directory."""
        with open(os.path.join(self.base_dir, "src.txt"), "wb") as f:
            f.write(b"src")
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST", "/files/move", {"source": "src.txt", "destination": "x.secret/f"}
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_extract_destination(self) -> Any:
        """An extract to ``out/x.secret/d`` makes no destination directories."""
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST",
            "/files/extract",
            {
                "content_base64": b64(tar_gz([("f.txt", b"x")])),
                "format": "tar.gz",
                "destination": "out/x.secret/d",
            },
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_extract_member(self) -> Any:
        """A member ``m.secret/f.txt`` is refused before any member is written."""
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST",
            "/files/extract",
            {
                "content_base64": b64(
                    tar_gz([("ok.txt", b"x"), ("m.secret/f.txt", b"y")])
                ),
                "format": "tar.gz",
                "destination": "out",
            },
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_resumable_upload_create(self) -> Any:
        """``POST /files/uploads`` to ``x.secret/f`` makes no directory and no upload."""
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST", "/files/uploads", {"path": "x.secret/f", "size": 3}
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_existing_parent_still_writable(self) -> Any:
        """
        Only creating a denied directory is refused: the final path's own
        decision stands for a directory that already exists, and a write
        whose new parents are all allowed makes them.
        """
        reply = yield self.request(
            "POST", "/upload", {"path": "ok/deep/f", "content_base64": b64(b"x")}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertTrue(os.path.isfile(os.path.join(self.base_dir, "ok/deep/f")))
