"""
``POST /files/move`` to another file system (:mod:`sandboxd.files.crossing`),
against a real daemon: a directory bind-mounted into the base is a mount of
its own, so a rename cannot cross into it and the daemon copies.
"""

from __future__ import annotations

import ctypes
import os
import stat
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.errors import ApiError
from sandboxd.files import crossing
from tests.files.test_watch import StreamCase
from tests.test_guard import bind_mount, tmpfs

#: mount(2) flags: MS_REMOUNT | MS_BIND | MS_RDONLY.
_MS_REMOUNT_RO_BIND = 32 | 4096 | 1


class CrossingCase(StreamCase):
    def setUp(self) -> Any:
        d = super().setUp()
        self.volume = os.path.realpath(self.mktemp())
        os.makedirs(self.volume)
        os.makedirs(os.path.join(self.base_dir, "vol"))
        bind_mount(self, self.volume, os.path.join(self.base_dir, "vol"))
        return d

    def move(self, source: str, destination: str, overwrite: bool = False) -> Any:
        return self.request(
            "POST",
            "/files/move",
            {"source": source, "destination": destination, "overwrite": overwrite},
        )

    def names(self, top: str) -> list[str]:
        """Every entry below ``top``, relative, directories with a slash."""
        out = []
        for root, dirs, files in os.walk(top):
            rel = os.path.relpath(root, top)
            prefix = "" if rel == "." else rel + "/"
            out += [prefix + d + "/" for d in dirs] + [prefix + f for f in files]
        return sorted(out)


class CrossingTests(CrossingCase):
    @inlineCallbacks
    def test_a_tree_arrives_as_it_was(self) -> Any:
        """
        A tree moved into the volume keeps its files' bytes, permissions and
        times, its links (as links), its named pipe and the hard link between
        two of its files; the base no longer has it, and neither side has a
        temporary name left.
        """
        self.put("t/a.txt", b"alpha")
        self.put("t/sub/big.bin", os.urandom(3 * 1024 * 1024))
        os.chmod(os.path.join(self.base_dir, "t/a.txt"), 0o751)
        os.chmod(os.path.join(self.base_dir, "t/sub"), 0o700)
        os.utime(os.path.join(self.base_dir, "t/a.txt"), ns=(10**18, 10**18))
        os.symlink("a.txt", os.path.join(self.base_dir, "t/link"))
        os.symlink("/nowhere", os.path.join(self.base_dir, "t/dangling"))
        os.mkfifo(os.path.join(self.base_dir, "t/pipe"))
        os.link(
            os.path.join(self.base_dir, "t/a.txt"),
            os.path.join(self.base_dir, "t/sub/same.txt"),
        )
        with open(os.path.join(self.base_dir, "t/sub/big.bin"), "rb") as f:
            big = f.read()
        before = self.names(os.path.join(self.base_dir, "t"))

        reply = yield self.move("t", "vol/t")

        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            reply.json(),
            {
                "source": os.path.join(self.base_dir, "t"),
                "destination": os.path.join(self.base_dir, "vol/t"),
            },
        )
        moved = os.path.join(self.volume, "t")
        self.assertEqual(self.names(moved), before)
        self.assertEqual(sorted(os.listdir(self.base_dir)), ["vol"])
        self.assertEqual(os.listdir(self.volume), ["t"])
        a = os.stat(os.path.join(moved, "a.txt"))
        self.assertEqual((stat.S_IMODE(a.st_mode), a.st_mtime_ns), (0o751, 10**18))
        self.assertEqual(
            stat.S_IMODE(os.stat(os.path.join(moved, "sub")).st_mode), 0o700
        )
        self.assertEqual(a.st_ino, os.stat(os.path.join(moved, "sub/same.txt")).st_ino)
        self.assertEqual(os.readlink(os.path.join(moved, "link")), "a.txt")
        self.assertEqual(os.readlink(os.path.join(moved, "dangling")), "/nowhere")
        self.assertTrue(stat.S_ISFIFO(os.lstat(os.path.join(moved, "pipe")).st_mode))
        with open(os.path.join(moved, "sub/big.bin"), "rb") as f:
            self.assertEqual(f.read(), big)

    @inlineCallbacks
    def test_a_file_in_and_out(self) -> Any:
        """A file moves into the volume, into a directory there, and back out."""
        self.put("f.txt", b"f")
        os.makedirs(os.path.join(self.volume, "inbox"))
        reply = yield self.move("f.txt", "vol/inbox")
        self.assertEqual(
            (reply.status, reply.json()["destination"]),
            (200, os.path.join(self.base_dir, "vol/inbox/f.txt")),
        )
        reply = yield self.move("vol/inbox/f.txt", "back/f.txt")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(self.read("back/f.txt"), b"f")
        self.assertEqual(os.listdir(os.path.join(self.volume, "inbox")), [])

    @inlineCallbacks
    def test_overwrite_as_a_rename_would(self) -> Any:
        """
        Onto an existing file: 409 without ``overwrite`` (both files kept,
        nothing left over), replaced with it; onto a non-empty directory's
        name inside a directory, 409 either way.
        """
        self.put("f.txt", b"new")
        with open(os.path.join(self.volume, "f.txt"), "wb") as f:
            f.write(b"old")
        reply = yield self.move("f.txt", "vol/f.txt")
        self.assertEqual((reply.status, reply.json()["code"]), (409, "file_exists"))
        self.assertEqual(self.read("f.txt"), b"new")
        self.assertEqual(os.listdir(self.volume), ["f.txt"])
        self.assertEqual(sorted(os.listdir(self.base_dir)), ["f.txt", "vol"])
        reply = yield self.move("f.txt", "vol/f.txt", overwrite=True)
        self.assertEqual(reply.status, 200, reply.body)
        with open(os.path.join(self.volume, "f.txt"), "rb") as f:
            self.assertEqual(f.read(), b"new")

        self.put("d/x.txt", b"x")
        os.makedirs(os.path.join(self.volume, "d", "keep"))
        reply = yield self.move("d", "vol", overwrite=True)
        self.assertEqual((reply.status, reply.json()["code"]), (409, "file_exists"))
        self.assertEqual(self.read("d/x.txt"), b"x")
        self.assertEqual(self.names(self.volume), ["d/", "d/keep/", "f.txt"])

    @inlineCallbacks
    def test_refused_before_anything_is_copied(self) -> Any:
        """
        A socket in the tree (400) or a volume mounted inside it (400): the
        tree stays whole and nothing appears in the volume.
        """
        self.put("t/a.txt")
        os.mknod(os.path.join(self.base_dir, "t/sock"), stat.S_IFSOCK | 0o600)
        reply = yield self.move("t", "vol/t")
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_param"))
        self.assertIn("t/sock is a socket", reply.json()["error"])
        os.unlink(os.path.join(self.base_dir, "t/sock"))

        inner = os.path.realpath(self.mktemp())
        os.makedirs(inner)
        os.makedirs(os.path.join(self.base_dir, "t/m"))
        bind_mount(self, inner, os.path.join(self.base_dir, "t/m"))
        reply = yield self.move("t", "vol/t")
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_param"))
        self.assertIn("t/m is a mount point", reply.json()["error"])
        self.assertEqual(self.names(os.path.join(self.base_dir, "t")), ["a.txt", "m/"])
        self.assertEqual(os.listdir(self.volume), [])

    @inlineCallbacks
    def test_errors_say_which_side(self) -> Any:
        """
        A read-only side is named as the spec asks: the volume that cannot
        take the copy is the destination, the one the moved file cannot
        leave is the source; either way nothing moved and no copy is left.
        """
        self.put("f.txt", b"f")
        readonly = os.path.join(self.base_dir, "ro")
        os.makedirs(readonly)
        with open(os.path.join(self.volume, "kept.txt"), "wb") as f:
            f.write(b"kept")
        bind_mount(self, self.volume, readonly)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(None, readonly.encode(), None, _MS_REMOUNT_RO_BIND, None) != 0:
            raise SkipTest("cannot make a bind mount read-only here")
        reply = yield self.move("f.txt", "ro/f.txt")
        self.assertEqual(reply.status, 403, reply.body)
        self.assertTrue(reply.json()["error"].startswith("destination:"), reply.body)
        reply = yield self.move("ro/kept.txt", "kept.txt")
        self.assertEqual(reply.status, 403, reply.body)
        self.assertTrue(reply.json()["error"].startswith("source:"), reply.body)
        self.assertEqual(sorted(os.listdir(self.base_dir)), ["f.txt", "ro", "vol"])
        self.assertEqual(sorted(os.listdir(self.volume)), ["kept.txt"])

    @inlineCallbacks
    def test_a_full_volume(self) -> Any:
        """
        A tree bigger than the room left on the destination is 507 before a
        byte is copied; one whose copy runs out of room part way (the room
        was taken meanwhile) is 507 too, its part-copy removed; the tree
        stays in both cases.
        """
        small = os.path.join(self.base_dir, "small")
        os.makedirs(small)
        tmpfs(self, small, "1m")
        self.put("t/a.bin", b"a" * 700_000)
        self.put("t/b.bin", b"b" * 700_000)
        reply = yield self.move("t", "small/t")
        self.assertEqual(
            (reply.status, reply.json()["code"]), (507, "insufficient_storage")
        )
        self.assertEqual(os.listdir(small), [])
        self.assertEqual(self.read("t/b.bin"), b"b" * 700_000)

        # 200 files of 5,000 bytes fit the free bytes, not the pages they take.
        for i in range(200):
            self.put(f"many/{i:03}.txt", b"m" * 5000)
        reply = yield self.move("many", "small/many")
        self.assertEqual(
            (reply.status, reply.json()["code"]), (507, "insufficient_storage")
        )
        self.assertEqual(os.listdir(small), [])
        self.assertEqual(len(os.listdir(os.path.join(self.base_dir, "many"))), 200)


class CrossingWatchTests(CrossingCase):
    @inlineCallbacks
    def test_a_watch_sees_a_move_not_its_copy(self) -> Any:
        """
        A watch over both sides sees the tree deleted from the base and
        created in the volume, never the copy in progress nor the source set
        aside, and goes on with what happens in the moved tree.
        """
        self.put("t/sub/b.txt", b"b")
        c, response = yield self.open_stream("path=.&recursive=true&follow=true")
        reply = yield self.move("t", "vol/t")
        self.assertEqual(reply.status, 200, reply.body)
        yield deferLater(reactor, 0.3, lambda: None)
        self.put("vol/t/sub/c.txt", b"c")
        yield c.wait_for(b"c.txt")
        self.assertEqual(
            [
                (name, os.path.relpath(data["path"], self.base_dir))
                for _, name, data in c.events()
            ],
            [("deleted", "t"), ("created", "vol/t"), ("created", "vol/t/sub/c.txt")],
        )
        self.close(response)


class CrossingBoundsTests(CrossingCase):
    policy = {"endpoints": {"files_move": {"limits": {"max_entries": 3}}}}

    @inlineCallbacks
    def test_too_many_entries(self) -> Any:
        """
        A tree over ``max_entries`` is 413 naming the setting; a rename on
        the same file system has no such bound.
        """
        for name in "abc":
            self.put(f"t/{name}.txt")
        reply = yield self.move("t", "vol/t")
        self.assertEqual(
            (reply.status, reply.json()["code"], reply.json()["setting"]),
            (413, "payload_too_large", "endpoints.files_move.limits.max_entries"),
        )
        self.assertEqual(os.listdir(self.volume), [])
        self.assertEqual(
            self.names(os.path.join(self.base_dir, "t")), ["a.txt", "b.txt", "c.txt"]
        )
        reply = yield self.move("t", "t2")
        self.assertEqual(reply.status, 200, reply.body)

    @inlineCallbacks
    def test_an_existing_destination_is_refused_before_the_copy(self) -> Any:
        """
        Without ``overwrite``, a destination that exists is 409 at once:
        the tree is not surveyed (this one is over ``max_entries``), let
        alone copied.
        """
        for name in "abcd":
            self.put(f"t/{name}.txt")
        with open(os.path.join(self.volume, "t"), "wb") as f:
            f.write(b"kept")
        reply = yield self.move("t", "vol/t")
        self.assertEqual((reply.status, reply.json()["code"]), (409, "file_exists"))
        self.assertEqual(os.listdir(self.volume), ["t"])


class DeadlineTests(SynchronousTestCase):
    """:func:`crossing.move_across` past its time, in memory."""

    def test_a_copy_past_its_time_leaves_nothing(self) -> None:
        """
        A copy that runs out of time is 504 naming the setting; the part
        copied is removed and the source stays where it was.
        """
        top = os.path.realpath(self.mktemp())
        os.makedirs(os.path.join(top, "from", "t"))
        os.makedirs(os.path.join(top, "to"))
        with open(os.path.join(top, "from", "t", "a.txt"), "wb") as f:
            f.write(b"a")
        bounds = crossing.Bounds(
            max_entries=10,
            timeout_seconds=0,
            entries_setting="endpoints.files_move.limits.max_entries",
            timeout_setting="endpoints.files_move.limits.timeout_seconds",
        )
        src = os.open(os.path.join(top, "from"), os.O_RDONLY | os.O_DIRECTORY)
        self.addCleanup(os.close, src)
        dst = os.open(os.path.join(top, "to"), os.O_RDONLY | os.O_DIRECTORY)
        self.addCleanup(os.close, dst)

        def place(a: int, b: str, c: int, d: str) -> None:
            os.rename(b, d, src_dir_fd=a, dst_dir_fd=c)

        with self.assertRaises(ApiError) as caught:
            crossing.move_across(src, "t", dst, "t", False, place, bounds, "from/t")
        self.assertEqual(
            (caught.exception.status, caught.exception.code.value),
            (504, "timeout"),
        )
        self.assertIn("timeout_seconds", caught.exception.message)
        self.assertEqual(os.listdir(os.path.join(top, "to")), [])
        self.assertEqual(os.listdir(os.path.join(top, "from")), ["t"])
        self.assertEqual(os.listdir(os.path.join(top, "from", "t")), ["a.txt"])
