"""
An archive's bounds counted before anything is packed
(:func:`sandboxd.files.archive.count_members`).
"""

from __future__ import annotations

import os
import tempfile

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access.guard import PathGuard
from sandboxd.errors import ApiError
from sandboxd.files.archive import count_members, create
from tests.test_guard import _rmtree, make_rule


class CountTests(SynchronousTestCase):
    """Members are counted as packing counts them: files and links, not directories."""

    def setUp(self) -> None:
        self.base = os.path.realpath(tempfile.mkdtemp())
        self.addCleanup(_rmtree, self.base)
        os.makedirs(os.path.join(self.base, "d", "sub"))
        for name in ("a", "b", "sub/c"):
            with open(os.path.join(self.base, "d", name), "wb") as f:
                f.write(b"x" * 100)
        os.symlink("a", os.path.join(self.base, "d", "link"))
        self.guard = PathGuard(make_rule(self.base))

    def refused(self, max_files: int, max_bytes: int) -> ApiError:
        with self.assertRaises(ApiError) as caught:
            count_members(self.guard, ["d"], max_files, max_bytes)
        self.assertEqual(caught.exception.status, 413)
        return caught.exception

    def test_bounds(self) -> None:
        """
        Four members (three files and a link, the directories not counted)
        of 300 bytes: within 4 files and 300 bytes; over 3 files or 299
        bytes refused, as packing would refuse them.
        """
        count_members(self.guard, ["d"], 4, 300)
        self.assertIn("more than 3 files", self.refused(3, 10_000).message)
        self.assertEqual(
            self.refused(10, 299).message,
            "the size of the files to pack is over the limit of 299 bytes",
        )
        for max_files, max_bytes in ((3, 10_000), (10, 299)):
            with self.assertRaises(ApiError) as caught:
                create(self.guard, ["d"], "tar.gz", max_files, max_bytes)
            self.assertEqual(caught.exception.status, 413)
            self.assertNotIn("request", caught.exception.message)
        packed = create(self.guard, ["d"], "tar.gz", 4, 300)
        self.assertGreater(packed["bytes"], 0)

    def test_single_file(self) -> None:
        """A file asked for by itself is one member."""
        count_members(self.guard, ["d/a"], 1, 100)
        with self.assertRaises(ApiError):
            count_members(self.guard, ["d/a", "d/b"], 1, 10_000)
