"""
Directory walks (:mod:`sandboxd.files.walk`) over big directories: the
order of names, a listing's cap, and entries that go while a walk runs.
"""

from __future__ import annotations

import os
import random
import tempfile

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access.guard import PathGuard
from sandboxd.files.walk import SORT_PIECE, by_name, list_dir, walk
from tests.test_guard import _rmtree, make_rule


class OrderTests(SynchronousTestCase):
    """Names come in order, sorted whole or in pieces."""

    def test_pieces_merged_in_order(self) -> None:
        """More names than a piece holds come out as one sort would give them."""
        for count in (0, 1, SORT_PIECE, SORT_PIECE + 1, 3 * SORT_PIECE + 5):
            names = [f"n{random.randrange(10**9):09d}.{i}" for i in range(count)]
            self.assertEqual(list(by_name(names)), sorted(names), count)


class BigDirectoryTests(SynchronousTestCase):
    """A directory of many entries, listed with a cap and walked as it changes."""

    count = SORT_PIECE + 100

    def setUp(self) -> None:
        top = os.path.realpath(tempfile.mkdtemp())
        self.addCleanup(_rmtree, top)
        self.base = top
        self.big = os.path.join(top, "big")
        os.makedirs(self.big)
        made = list(range(self.count))
        random.shuffle(made)
        for i in made:
            open(os.path.join(self.big, f"f{i:06d}.txt"), "w").close()
        self.guard = PathGuard(make_rule(self.base))

    def test_capped_listing_in_order(self) -> None:
        """
        A listing capped at 50 of the directory's entries (more than one
        sort's piece, made in no order) gives the 50 first names in order,
        truncated.
        """
        listed = list_dir(self.guard, self.big, 1, True, 50)
        self.assertTrue(listed["truncated"])
        names = [e["name"] for e in listed["entries"]]
        self.assertEqual(names, [f"f{i:06d}.txt" for i in range(50)])

    def test_entry_gone_during_the_walk(self) -> None:
        """An entry removed after the walk read the directory is left out, not an error."""
        with self.guard.open_dir(self.big) as (fd, root):
            walking = walk(fd, root, 1)
            first = next(walking)
            os.unlink(os.path.join(self.big, "f000001.txt"))
            rest = [name for _, name, _ in walking]
        self.assertEqual(first[1], "f000000.txt")
        self.assertNotIn("f000001.txt", rest)
        self.assertEqual(rest[0], "f000002.txt")
        self.assertEqual(len(rest), self.count - 2)
