"""
gitignore's patterns as :mod:`sandboxd.files.ignore` reads them: what a
search leaves out by default.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.files.ignore import decide, parse_rules


class PatternTests(SynchronousTestCase):
    """Each kind of pattern names what git's would."""

    def ignored(self, text: str, rel: str, is_dir: bool = False) -> bool | None:
        return decide(parse_rules(text.splitlines()), rel, is_dir)

    def test_names_anchors_and_directories(self) -> None:
        """
        A pattern without a slash names an entry at any depth; one with a
        slash is anchored to its file's directory; a trailing slash names
        directories only.
        """
        self.assertTrue(self.ignored("node_modules/", "web/node_modules", True))
        self.assertIsNone(self.ignored("node_modules/", "web/node_modules"))
        self.assertTrue(self.ignored("*.log", "a/b/debug.log"))
        self.assertTrue(self.ignored("/build", "build", True))
        self.assertIsNone(self.ignored("/build", "src/build", True))
        self.assertTrue(self.ignored("web/dist", "web/dist", True))
        self.assertIsNone(self.ignored("web/dist", "x/web/dist", True))

    def test_stars_classes_negation_comments(self) -> None:
        """
        ``*`` stays within a name, ``**`` crosses directories, ``[...]`` is
        a class, ``!`` re-includes (the last match wins), ``#`` is a
        comment unless escaped.
        """
        self.assertIsNone(self.ignored("a/*.js", "a/b/c.js"))
        self.assertTrue(self.ignored("a/**/c.js", "a/b/d/c.js"))
        self.assertTrue(self.ignored("a/**/c.js", "a/c.js"))
        self.assertTrue(self.ignored("**/tmp", "x/y/tmp", True))
        self.assertTrue(self.ignored("out/**", "out/a/b.txt"))
        self.assertTrue(self.ignored("file[0-9].txt", "file3.txt"))
        self.assertIsNone(self.ignored("file[!0-9].txt", "file3.txt"))
        self.assertFalse(self.ignored("*.log\n!keep.log", "keep.log"))
        self.assertIsNone(self.ignored("# note\n\n", "note"))
        self.assertTrue(self.ignored("\\#note", "#note"))
        self.assertTrue(self.ignored("\\!bang", "!bang"))
