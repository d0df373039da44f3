"""
Awkward but legitimate file contents as an ACP agent (the fake agent, on
the official ACP SDK) reads them through ``fs/read_text_file``.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import SkipTest

from tests.agents.test_agents import AgentsTestCase

#: Four lines (ended by LF, CRLF, a lone CR, nothing), the first holding
#: every character ``str.splitlines`` ends a line at but a text editor
#: does not (form feed, NEL, U+2028, ...).
TEXT = "a\x0bb\x0cc\x1cd\x1de\x1ef\x85g\u2028h\u2029i\none\r\ntwo\rthree"


class ReadSliceTests(AgentsTestCase):
    """``line``/``limit`` count lines the way the agent's editor does."""

    @inlineCallbacks
    def test_lines_end_at_newline_only(self) -> Any:
        """
        ``line`` and ``limit`` count lines ended by LF, CRLF or CR, so a
        file holding a form feed, NEL or U+2028 gives the agent the lines
        it asked for, each as written.
        """
        path = os.path.join(self.base_dir, "odd.txt")
        with open(path, "w", newline="") as f:
            f.write(TEXT)
        sid = yield self.session()
        whole = yield self.prompt(sid, f"read {path}")
        second = yield self.prompt(sid, f"read {path} 2 2")
        first = yield self.prompt(sid, f"read {path} 1 1")
        last = yield self.prompt(sid, f"read {path} 4 5")
        self.assertEqual(whole.json()["text"], "content: " + TEXT)
        self.assertEqual(second.json()["text"], "content: one\r\ntwo\r")
        self.assertEqual(first.json()["text"], "content: " + TEXT.split("\n")[0] + "\n")
        self.assertEqual(last.json()["text"], "content: three")

    @inlineCallbacks
    def test_diff_keeps_lines_whole(self) -> Any:
        """
        The diff of a file the agent wrote shows each line whole: a line
        holding U+2028, NEL or a form feed is one context line, not cut in
        two with a stray prefix in its middle.
        """
        path = os.path.join(self.base_dir, "d.txt")
        with open(path, "w") as f:
            f.write("keep\u2028this\x85and\x0cthat\nold\n")
        sid = yield self.session()
        reply = yield self.prompt(
            sid, f"write {path} keep\u2028this\x85and\x0cthat\nnew\n"
        )
        self.assertEqual(reply.json()["text"], "written")
        reply = yield self.request("GET", f"/agents/sessions/{sid}/files?diff=true")
        diff = reply.json()["files"][0]["diff"]
        self.assertEqual(
            diff.split("\n")[3:],
            [" keep\u2028this\x85and\x0cthat", "-old", "+new", ""],
        )

    @inlineCallbacks
    def test_diff_applies_without_final_newline(self) -> Any:
        """
        A file whose last line has no newline, before or after the agent's
        write, gets a diff that ``patch`` applies: each such line is followed
        by the ``\\ No newline at end of file`` marker (without it the
        removed and added lines ran together on one line), and a lone CR
        inside a line stays part of it, as in git's diffs.
        """
        patch = shutil.which("patch")
        if patch is None:
            raise SkipTest("GNU patch is not installed: the diff cannot be applied")
        path = os.path.join(self.base_dir, "n.txt")
        old, new = "keep\rthis\nold", "keep\rthis\nnew"
        with open(path, "w", newline="") as f:
            f.write(old)
        sid = yield self.session()
        reply = yield self.prompt(sid, f"write {path} {new}")
        self.assertEqual(reply.json()["text"], "written")
        reply = yield self.request("GET", f"/agents/sessions/{sid}/files?diff=true")
        diff = reply.json()["files"][0]["diff"]
        self.assertEqual(
            diff.split("\n")[3:],
            [
                " keep\rthis",
                "-old",
                "\\ No newline at end of file",
                "+new",
                "\\ No newline at end of file",
                "",
            ],
        )
        target = os.path.join(self.base_dir, "applied.txt")
        with open(target, "w", newline="") as f:
            f.write(old)
        out, err, code = yield getProcessOutputAndValue(
            patch, ["--quiet", target], stdinBytes=diff.encode()
        )
        self.assertEqual(code, 0, (out, err))
        with open(target, newline="") as f:
            self.assertEqual(f.read(), new)
