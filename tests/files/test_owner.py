"""
SPEC §20: when the daemon runs as root, what the file API creates belongs
to the user the request's commands would run as (the request's ``user``,
else ``params.default_user``); without one, to the daemon's user.
"""

from __future__ import annotations

import base64
import io
import os
import pwd
import tarfile
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest

from tests.helpers import DaemonTestCase

USER = "nobody"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def tarball(
    members: dict[str, bytes | None], link: tuple[str, str] | None = None
) -> str:
    """A tar.gz, base64: ``None`` makes a directory; ``link`` a symlink."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo(link[0])
            info.type, info.linkname = tarfile.SYMTYPE, link[1]
            tar.addfile(info)
    return b64(out.getvalue())


class OwnerCase(DaemonTestCase):
    """A root daemon whose commands run as ``nobody``, as the container's policy does."""

    policy = {"defaults": {"params": {"default_user": USER, "users": [USER]}}}

    def setUp(self) -> Any:
        if os.geteuid() != 0:
            raise SkipTest("the daemon must run as root to give files away")
        try:
            self.user = pwd.getpwnam(USER)
        except KeyError:
            raise SkipTest(f"no {USER!r} user on this machine") from None
        return super().setUp()

    def owner(self, rel: str) -> tuple[int, int]:
        st = os.lstat(os.path.join(self.base_dir, rel))
        return st.st_uid, st.st_gid

    def assert_users(self, *rels: str) -> None:
        for rel in rels:
            self.assertEqual(self.owner(rel), (self.user.pw_uid, self.user.pw_gid), rel)


class DefaultUserTests(OwnerCase):
    """params.default_user owns what is created."""

    @inlineCallbacks
    def test_upload_and_parents(self) -> Any:
        """/upload's file and the parent directories it creates are the user's; the base dir is not."""
        reply = yield self.request(
            "POST", "/upload", {"path": "p/q/f.txt", "content_base64": b64(b"x")}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assert_users("p", "p/q", "p/q/f.txt")
        self.assertEqual(self.owner("."), (0, 0))

    @inlineCallbacks
    def test_mkdir_stream_raw_move(self) -> Any:
        """files_mkdir, files_upload_stream, files_write_raw and files_move's new parents."""
        replies = [
            (yield self.request("POST", "/files/mkdir", {"path": "m/n"})),
            (
                yield self.request(
                    "POST",
                    "/files/upload-stream",
                    {"path": "s/data.bin", "content_base64": b64(b"y")},
                )
            ),
            (
                yield self.request(
                    "POST", "/files/raw?path=r/raw.txt", raw_body=b"raw bytes"
                )
            ),
            (
                yield self.request(
                    "POST",
                    "/files/move",
                    {"source": "r/raw.txt", "destination": "mv/to/raw.txt"},
                )
            ),
        ]
        for reply in replies:
            self.assertEqual(reply.status, 200, reply.body)
        self.assert_users(
            "m", "m/n", "s", "s/data.bin", "r", "mv", "mv/to", "mv/to/raw.txt"
        )

    @inlineCallbacks
    def test_extract(self) -> Any:
        """An extracted tree (destination, directories, files, links) is the user's."""
        reply = yield self.request(
            "POST",
            "/files/extract",
            {
                "destination": "proj",
                "content_base64": tarball(
                    {"src/": None, "src/a.py": b"print(1)\n", "README": b"hi\n"},
                    link=("src/link", "a.py"),
                ),
            },
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assert_users(
            "proj", "proj/src", "proj/src/a.py", "proj/README", "proj/src/link"
        )

    @inlineCallbacks
    def test_user_can_then_write(self) -> Any:
        """The point of it: a command run as that user can add to an uploaded directory."""
        yield self.request(
            "POST", "/upload", {"path": "up/f.txt", "content_base64": b64(b"one\n")}
        )
        reply = yield self.request(
            "POST",
            "/shell",
            {
                "command": "echo two >> f.txt && echo new > g.txt",
                "shell": "sh",
                "cwd": "up",
            },
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["exit_code"], 0, reply.body)
        with open(os.path.join(self.base_dir, "up", "f.txt")) as f:
            self.assertEqual(f.read(), "one\ntwo\n")

    @inlineCallbacks
    def test_replace_keeps_owner(self) -> Any:
        """Replacing a file keeps the replaced file's owner (a new inode, the same owner)."""
        path = os.path.join(self.base_dir, "kept.txt")
        with open(path, "w") as f:
            f.write("old")
        os.chown(path, 12345, 12346)
        reply = yield self.request(
            "POST", "/upload", {"path": "kept.txt", "content_base64": b64(b"new")}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(self.owner("kept.txt"), (12345, 12346))

    @inlineCallbacks
    def test_request_user_checked(self) -> Any:
        """A request's ``user`` must be allowed by params.users (root is not)."""
        reply = yield self.request(
            "POST",
            "/upload",
            {"path": "no.txt", "content_base64": b64(b"x"), "user": "root"},
        )
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "param_not_allowed")
        )
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "no.txt")))


class RequestUserTests(OwnerCase):
    """Without a default user, the request's ``user`` decides; without either, the daemon."""

    policy = {"defaults": {"params": {"users": [USER]}}}

    @inlineCallbacks
    def test_request_user_and_none(self) -> Any:
        """``user`` in the body gives the file away; no user leaves it the daemon's."""
        reply = yield self.request(
            "POST",
            "/upload",
            {"path": "a/mine.txt", "content_base64": b64(b"x"), "user": USER},
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assert_users("a", "a/mine.txt")
        reply = yield self.request(
            "POST", "/upload", {"path": "b/root.txt", "content_base64": b64(b"x")}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(self.owner("b/root.txt"), (0, 0))
        reply = yield self.request(
            "POST", f"/files/raw?path=c/raw.txt&user={USER}", raw_body=b"z"
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assert_users("c", "c/raw.txt")
