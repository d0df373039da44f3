"""
Atomic writes in memory (:mod:`sandboxd.files.atomic`): a file being written
has no name in the user's directory where the file system allows it, and a
hidden one where it does not; either way the target changes only at the
commit and an abort leaves nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.access.guard import PathGuard
from sandboxd.errors import ApiError
from sandboxd.files import atomic
from sandboxd.files.atomic import TEMPORARY_NAME, UNNAMED, AtomicWrite
from tests.helpers import unnamed_files
from tests.test_guard import make_rule


class AtomicCase(SynchronousTestCase):
    #: Whether the case uses unnamed files (else the named temporaries).
    unnamed = True

    def setUp(self) -> None:
        if self.unnamed and not atomic.UNNAMED_FILES:
            raise SkipTest("this system has no O_TMPFILE or no /proc/self/fd")
        self.patch(atomic, "UNNAMED_FILES", self.unnamed)
        self.base = os.path.realpath(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.base)
        self.guard = PathGuard(make_rule(self.base))

    def writer(self, name: str, **options: Any) -> AtomicWrite:
        return AtomicWrite(self.guard.locate(name, "write", follow=False), **options)

    def on_disk(self) -> list[str]:
        return sorted(os.listdir(self.base))

    def put(self, name: str, data: bytes) -> None:
        with open(os.path.join(self.base, name), "wb") as f:
            f.write(data)

    def read(self, name: str) -> bytes:
        with open(os.path.join(self.base, name), "rb") as f:
            return f.read()


class UnnamedTests(AtomicCase):
    def test_replace(self) -> None:
        """
        While written the new file is nowhere in the directory (only the
        daemon's descriptor reads it); the commit puts it in place, and
        the old file's bytes stay until then.
        """
        self.put("f.txt", b"old")
        writer = self.writer("f.txt")
        writer.write(b"new bytes")
        self.assertEqual(self.on_disk(), ["f.txt"])
        [held] = unnamed_files(self.base)
        with open(held, "rb") as f:
            self.assertEqual(f.read(), b"new bytes")
        self.assertEqual(self.read("f.txt"), b"old")
        writer.commit()
        self.assertEqual(self.on_disk(), ["f.txt"])
        self.assertEqual(self.read("f.txt"), b"new bytes")
        self.assertEqual(unnamed_files(self.base), [])

    def test_create_without_overwrite(self) -> None:
        """A new file without overwrite is linked to its name at once: no temporary name."""
        writer = self.writer("new.txt", overwrite=False)
        writer.write(b"x")
        self.put("other.txt", b"")
        writer.commit()
        self.assertEqual(self.on_disk(), ["new.txt", "other.txt"])
        self.assertEqual(self.read("new.txt"), b"x")
        self.assertEqual(
            oct(os.stat(os.path.join(self.base, "new.txt")).st_mode & 0o777), "0o644"
        )

    def test_create_raced(self) -> None:
        """A name taken meanwhile is 409 file_exists, and the other file stays."""
        writer = self.writer("new.txt", overwrite=False)
        writer.write(b"mine")
        self.put("new.txt", b"theirs")
        with self.assertRaises(ApiError) as caught:
            writer.commit()
        self.assertEqual(caught.exception.code, "file_exists")
        self.assertEqual(self.on_disk(), ["new.txt"])
        self.assertEqual(self.read("new.txt"), b"theirs")

    def test_abort(self) -> None:
        """An abort leaves nothing, the old file as it was."""
        self.put("f.txt", b"old")
        writer = self.writer("f.txt")
        writer.write(b"new")
        writer.abort()
        self.assertEqual(self.on_disk(), ["f.txt"])
        self.assertEqual(self.read("f.txt"), b"old")
        self.assertEqual(unnamed_files(self.base), [])

    def test_keep_old(self) -> None:
        """keep_old still keeps the replaced file under a temporary name beside it."""
        self.put("f.txt", b"old")
        writer = self.writer("f.txt")
        writer.write(b"new")
        writer.commit(keep_old=True)
        self.assertTrue(TEMPORARY_NAME.match(writer.old_name))
        self.assertEqual(self.read(writer.old_name), b"old")
        self.assertEqual(self.read("f.txt"), b"new")

    def test_watch_names(self) -> None:
        """inotify's name for the file while written (#INODE) is known as the daemon's."""
        writer = self.writer("f.txt")
        name = f"#{writer.inode}"
        self.assertTrue(UNNAMED.ours(name))
        writer.commit()
        self.assertTrue(UNNAMED.ours(name))  # its events are read later
        self.assertFalse(UNNAMED.ours("#1"))
        self.assertFalse(UNNAMED.ours("notes.txt"))


class NamedTests(AtomicCase):
    """Where unnamed files cannot be made, a hidden name does as before."""

    unnamed = False

    def test_replace_and_abort(self) -> None:
        self.put("f.txt", b"old")
        writer = self.writer("f.txt")
        writer.write(b"new")
        [hidden] = [n for n in self.on_disk() if n != "f.txt"]
        self.assertTrue(TEMPORARY_NAME.match(hidden))
        writer.commit()
        self.assertEqual(self.on_disk(), ["f.txt"])
        self.assertEqual(self.read("f.txt"), b"new")
        writer = self.writer("g.txt", overwrite=False)
        writer.write(b"g")
        writer.commit()
        self.assertEqual(self.on_disk(), ["f.txt", "g.txt"])
        writer = self.writer("f.txt")
        writer.abort()
        self.assertEqual(self.on_disk(), ["f.txt", "g.txt"])
