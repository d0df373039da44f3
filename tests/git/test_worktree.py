"""
A work tree's files kept before a git call and put back after it failed
(:mod:`sandboxd.git.worktree`), on a real directory: bytes, modes, links,
absent paths and the directories made for them, the bound, and what cannot
be put back.
"""

from __future__ import annotations

import os
import stat

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.git.worktree import KeepBudget, keep, put_back


class KeepPutBackTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.top = os.path.realpath(self.mktemp())
        os.makedirs(os.path.join(self.top, "src"))
        self.write("a.txt", b"the user's own\n", 0o640)
        self.write("src/b.sh", b"#!/bin/sh\n", 0o755)
        os.symlink("a.txt", os.path.join(self.top, "link"))

    def write(self, path: str, data: bytes, mode: int = 0o644) -> None:
        full = os.path.join(self.top, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
        os.chmod(full, mode)

    def state(self) -> dict[str, tuple[str, object]]:
        found: dict[str, tuple[str, object]] = {}
        for folder, dirs, names in os.walk(self.top):
            for name in dirs + names:
                full = os.path.join(folder, name)
                rel = os.path.relpath(full, self.top)
                st = os.lstat(full)
                if stat.S_ISLNK(st.st_mode):
                    found[rel] = ("link", os.readlink(full))
                elif stat.S_ISDIR(st.st_mode):
                    found[rel] = ("dir", stat.S_IMODE(st.st_mode))
                else:
                    with open(full, "rb") as f:
                        found[rel] = ("file", (f.read(), stat.S_IMODE(st.st_mode)))
        return found

    def test_changed_paths_put_back(self) -> None:
        """
        Files overwritten, cut short, removed or with another mode, a link
        pointed elsewhere, and files made where there were none (in new
        directories) are all as they were; an untouched file is not
        rewritten.
        """
        before = self.state()
        kept = keep(
            self.top,
            ["a.txt", "src/b.sh", "link", "new/deep/c.txt", "d.txt", "src/b.sh"],
            1 << 20,
        )
        self.assertEqual(kept.unkept, [])
        untouched = os.stat(os.path.join(self.top, "src/b.sh")).st_ino
        self.write("a.txt", b"the sou")  # cut short, another mode
        os.unlink(os.path.join(self.top, "link"))
        os.symlink("/etc/passwd", os.path.join(self.top, "link"))
        self.write("new/deep/c.txt", b"git's\n")
        self.write("d.txt", b"git's too\n")
        self.assertEqual(put_back(kept), [])
        self.assertEqual(self.state(), before)
        self.assertEqual(os.stat(os.path.join(self.top, "src/b.sh")).st_ino, untouched)

    def test_a_removed_directory_made_again(self) -> None:
        """A file whose directory git removed with it comes back in it."""
        before = self.state()
        kept = keep(self.top, ["src/b.sh"], 1 << 20)
        os.unlink(os.path.join(self.top, "src/b.sh"))
        os.rmdir(os.path.join(self.top, "src"))
        self.assertEqual(put_back(kept), [])
        self.assertEqual(self.state(), before)

    def test_directory_in_the_way(self) -> None:
        """A directory where a kept file was is not removed: the path is listed."""
        kept = keep(self.top, ["a.txt"], 1 << 20)
        os.unlink(os.path.join(self.top, "a.txt"))
        os.makedirs(os.path.join(self.top, "a.txt", "inside"))
        self.assertEqual(put_back(kept), ["a.txt"])
        self.assertTrue(os.path.isdir(os.path.join(self.top, "a.txt", "inside")))

    def test_bound(self) -> None:
        """Past the bound a file is not kept (and not touched by a put-back)."""
        kept = keep(self.top, ["a.txt", "src/b.sh"], 12)
        self.assertEqual(kept.unkept, ["a.txt"])
        self.write("a.txt", b"changed\n")
        self.write("src/b.sh", b"changed\n")
        self.assertEqual(put_back(kept), [])
        with open(os.path.join(self.top, "a.txt"), "rb") as f:
            self.assertEqual(f.read(), b"changed\n")
        with open(os.path.join(self.top, "src/b.sh"), "rb") as f:
            self.assertEqual(f.read(), b"#!/bin/sh\n")

    def test_no_link_followed(self) -> None:
        """
        A path through a link is not kept, and a put-back writes nothing
        through a directory swapped for a link since.
        """
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        os.symlink(outside, os.path.join(self.top, "out"))
        kept = keep(self.top, ["out/x.txt", "src/b.sh"], 1 << 20)
        self.assertEqual(kept.unkept, ["out/x.txt"])
        os.unlink(os.path.join(self.top, "src/b.sh"))
        os.rmdir(os.path.join(self.top, "src"))
        os.symlink(outside, os.path.join(self.top, "src"))
        self.assertEqual(put_back(kept), ["src/b.sh"])
        self.assertEqual(os.listdir(outside), [])

    def test_owner_and_mode_kept(self) -> None:
        """
        A file made again (and a directory made for it) belongs to whom
        the file belonged, with its mode, though the daemon (root) writes it.
        """
        if os.geteuid() != 0:
            self.skipTest("only root can give a file to another user")
        nobody = 65534
        os.chown(os.path.join(self.top, "src"), nobody, nobody)
        os.chown(os.path.join(self.top, "src/b.sh"), nobody, nobody)
        os.chmod(os.path.join(self.top, "src/b.sh"), 0o4750)
        kept = keep(self.top, ["src/b.sh"], 1 << 20)
        os.unlink(os.path.join(self.top, "src/b.sh"))
        os.rmdir(os.path.join(self.top, "src"))
        self.assertEqual(put_back(kept), [])
        for path, mode in (("src", 0o755), ("src/b.sh", 0o4750)):
            st = os.lstat(os.path.join(self.top, path))
            self.assertEqual((st.st_uid, st.st_gid), (nobody, nobody), path)
            self.assertEqual(stat.S_IMODE(st.st_mode), mode, path)

    def test_budget(self) -> None:
        """
        Calls in flight share one budget: each takes what is left, up to
        what it asks for, and what is given back is there for the next.
        """
        budget = KeepBudget(100)
        self.assertEqual(
            [budget.take(60), budget.take(60), budget.take(60)], [60, 40, 0]
        )
        budget.give(40)
        self.assertEqual(budget.take(60), 40)
        # A call that got nothing keeps no file (absent paths cost nothing).
        kept = keep(self.top, ["a.txt", "gone.txt"], 0)
        self.assertEqual(kept.unkept, ["a.txt"])
        self.assertEqual(kept.size, 0)
