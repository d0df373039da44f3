"""
The project's files as the daemon watches them for a server
(:mod:`sandboxd.lsp.watched`), in memory and on a temporary tree: the
watchers' globs, what changed between two looks, the bounded walk.
"""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.lsp.answers import uri_of
from sandboxd.lsp.watched import (
    CHANGED,
    CREATED,
    DELETED,
    Watchers,
    changes,
    glob_regex,
    scan,
)


class GlobTests(SynchronousTestCase):
    """LSP globs match absolute paths as editors match them."""

    def test_globs(self) -> None:
        """``**``, ``*``, ``?``, braces and classes; a bare glob matches in any directory."""
        cases = [
            ("**/*.py", "/p/a/b.py", True),
            ("**/*.py", "/p/a/b.pyc", False),
            ("**/*.{py,pyi}", "/p/b.pyi", True),
            ("*.py", "/p/deep/er/x.py", True),
            ("/p/**", "/p/a/b/c", True),
            ("/p/*", "/p/a/b", False),
            ("**/pyrightconfig.json", "/p/pyrightconfig.json", True),
            ("**/a?.py", "/p/ab.py", True),
            ("**/[!x]b.py", "/p/xb.py", False),
            ("**/[!x]b.py", "/p/ab.py", True),
        ]
        for glob, path, expected in cases:
            self.assertEqual(
                bool(glob_regex(glob).fullmatch(path)), expected, (glob, path)
            )

    def test_watchers(self) -> None:
        """
        A registration's globs (plain and relative to a folder) decide;
        an unreadable glob watches everything; unregistering forgets.
        """
        w = Watchers()
        self.assertFalse(w)
        w.register(
            "1",
            {
                "watchers": [
                    {"globPattern": "**/*.py"},
                    {"globPattern": {"baseUri": uri_of("/lib"), "pattern": "**"}},
                ]
            },
        )
        self.assertTrue(w.match("/p/a.py"))
        self.assertTrue(w.match("/lib/x/y.txt"))
        self.assertFalse(w.match("/p/a.txt"))
        w.register("2", {"watchers": [{"globPattern": 7}]})
        self.assertTrue(w.match("/p/a.txt"))
        w.unregister("2")
        w.unregister("1")
        self.assertFalse(w)
        self.assertFalse(w.match("/p/a.py"))


class ScanTests(SynchronousTestCase):
    """The walk and the changes between two walks."""

    def test_changes(self) -> None:
        """Created, changed (time, size or inode) and deleted files, by path."""
        before = {"/a": (1, 1, 1), "/b": (2, 2, 2), "/c": (3, 3, 3)}
        now = {"/a": (1, 1, 1), "/b": (9, 2, 2), "/d": (4, 4, 4)}
        self.assertEqual(
            changes(before, now), [("/b", CHANGED), ("/c", DELETED), ("/d", CREATED)]
        )

    def test_scan(self) -> None:
        """
        Regular files below the root; hidden directories, node_modules and
        links left out; None past the bound.
        """
        root = os.path.realpath(self.mktemp())
        for name in ("a.py", "pkg/b.py", ".git/c", "node_modules/m/d.js"):
            path = os.path.join(root, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write("x")
        os.symlink("/etc", os.path.join(root, "etc"))
        os.symlink(os.path.join(root, "a.py"), os.path.join(root, "l.py"))
        found = scan(root, 10)
        assert found is not None
        self.assertEqual(
            sorted(os.path.relpath(p, root) for p in found), ["a.py", "pkg/b.py"]
        )
        self.assertIsNone(scan(root, 1))
