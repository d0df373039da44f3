"""
``POST /files/edit`` against a real daemon: exact replacements in a text
file, all or none, atomic, and only over the version that was read.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from twisted.internet.defer import gatherResults, inlineCallbacks

from tests.routes.test_files import FilesCase

SOURCE = b"import os\n\nDEBUG = True\nLEVEL = 1\n\ndef main():\n    return LEVEL\n"


class EditTests(FilesCase):
    def edit(self, body: dict[str, Any], **kwargs: Any) -> Any:
        return self.request("POST", "/files/edit", body, **kwargs)

    @inlineCallbacks
    def test_one_edit(self) -> Any:
        """
        The file holds the new text, keeps its mode, and the answer gives the
        count, the line, the size and the new ETag (the one a read now gives).
        """
        path = self.put("app.py", SOURCE)
        os.chmod(path, 0o751)
        reply = yield self.edit(
            {"path": "app.py", "old_text": "DEBUG = True", "new_text": "DEBUG = False"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        expected = SOURCE.replace(b"DEBUG = True", b"DEBUG = False")
        self.assertEqual(self.read("app.py"), expected)
        self.assertEqual(
            (body["path"], body["replacements"], body["edits"], body["bytes"]),
            (path, 1, [{"replacements": 1, "line": 3}], len(expected)),
        )
        self.assertTrue(body["changed"])
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o751)
        read = yield self.get("/download", "app.py")
        self.assertEqual(read.json()["etag"], body["etag"])

    @inlineCallbacks
    def test_several_edits_all_or_none(self) -> Any:
        """
        Several edits apply in order; when one fails (here the third finds
        nothing) the file is untouched and the 400 names that edit.
        """
        self.put("app.py", SOURCE)
        edits = [
            {"old_text": "LEVEL = 1", "new_text": "LEVEL = 2"},
            {"old_text": "LEVEL", "new_text": "DEPTH", "replace_all": True},
            {"old_text": "no such text", "new_text": "x"},
        ]
        reply = yield self.edit({"path": "app.py", "edits": edits})
        self.assertEqual(
            (reply.status, reply.json()["kind"], reply.json()["edit"]),
            (400, "not_found", 2),
        )
        self.assertEqual(self.read("app.py"), SOURCE)
        reply = yield self.edit({"path": "app.py", "edits": edits[:2]})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            reply.json()["edits"],
            [{"replacements": 1, "line": 4}, {"replacements": 2, "line": 4}],
        )
        self.assertEqual(
            self.read("app.py"),
            SOURCE.replace(b"LEVEL = 1", b"DEPTH = 2").replace(
                b"return LEVEL", b"return DEPTH"
            ),
        )

    @inlineCallbacks
    def test_insert_and_replace_together(self) -> Any:
        """
        An insert and a replacement in one call: the replacement sees the
        inserted line; insert_line with old_text is 400.
        """
        self.put("app.py", SOURCE)
        reply = yield self.edit(
            {
                "path": "app.py",
                "edits": [
                    {"insert_line": 1, "new_text": "import sys"},
                    {"old_text": "import sys", "new_text": "import json"},
                ],
            }
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            self.read("app.py"),
            SOURCE.replace(b"import os\n", b"import os\nimport json\n"),
        )
        reply = yield self.edit(
            {"path": "app.py", "insert_line": 0, "old_text": "x", "new_text": "y"}
        )
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_param"))

    @inlineCallbacks
    def test_header_above_a_byte_order_mark(self) -> Any:
        """
        insert_line 0 in a file that starts with a UTF-8 BOM writes the new
        line after the BOM: the file still starts with it, and no U+FEFF
        lands mid-file.
        """
        self.put("bom.py", b"\xef\xbb\xbfimport os\r\nprint(1)\r\n")
        reply = yield self.edit(
            {"path": "bom.py", "insert_line": 0, "new_text": "# header\n"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            self.read("bom.py"),
            b"\xef\xbb\xbf# header\r\nimport os\r\nprint(1)\r\n",
        )

    @inlineCallbacks
    def test_ambiguous_edit(self) -> Any:
        """Text found more than once is 400 (kind not_unique) with the count; nothing written."""
        self.put("app.py", SOURCE)
        reply = yield self.edit(
            {"path": "app.py", "old_text": "LEVEL", "new_text": "X"}
        )
        body = reply.json()
        self.assertEqual(
            (reply.status, body["code"], body["kind"], body["occurrences"]),
            (400, "invalid_param", "not_unique", 2),
        )
        self.assertEqual(self.read("app.py"), SOURCE)

    @inlineCallbacks
    def test_dry_run_and_no_change(self) -> Any:
        """
        dry_run counts and writes nothing; an edit that leaves the text as it
        was does not write the file either (same inode, same ETag).
        """
        path = self.put("app.py", SOURCE)
        before = os.stat(path)
        reply = yield self.edit(
            {"path": "app.py", "old_text": "os", "new_text": "sys", "dry_run": True}
        )
        self.assertEqual((reply.status, reply.json()["changed"]), (200, True))
        self.assertEqual(self.read("app.py"), SOURCE)
        reply = yield self.edit(
            {"path": "app.py", "old_text": "import os", "new_text": "import os"}
        )
        self.assertEqual((reply.status, reply.json()["changed"]), (200, False))
        after = os.stat(path)
        self.assertEqual(
            (after.st_ino, after.st_mtime_ns), (before.st_ino, before.st_mtime_ns)
        )

    @inlineCallbacks
    def test_if_match(self) -> Any:
        """
        With if_match (body or If-Match header) naming an older version the
        edit is 412 and the file stays as the other writer left it.
        """
        self.put("app.py", SOURCE)
        read = yield self.get("/download", "app.py")
        old_etag = read.json()["etag"]
        self.put("app.py", SOURCE + b"# changed by someone else\n")
        edit = {"path": "app.py", "old_text": "DEBUG = True", "new_text": "DEBUG = 0"}
        reply = yield self.edit(dict(edit, if_match=old_etag))
        self.assertEqual(
            (reply.status, reply.json()["code"]), (412, "precondition_failed")
        )
        reply = yield self.edit(edit, headers={"If-Match": old_etag})
        self.assertEqual(reply.status, 412)
        self.assertEqual(self.read("app.py"), SOURCE + b"# changed by someone else\n")
        read = yield self.get("/download", "app.py")
        reply = yield self.edit(dict(edit, if_match=read.json()["etag"]))
        self.assertEqual(reply.status, 200, reply.body)

    @inlineCallbacks
    def test_concurrent_edits(self) -> Any:
        """
        Edits sent at once, none naming an ETag: each lands or is 412 (the
        file changed since it read it); none answered 200 is lost.
        """
        self.put("race.txt", b"")
        replies = yield gatherResults(
            [
                self.edit({"path": "race.txt", "insert_line": 0, "new_text": f"L{i}\n"})
                for i in range(30)
            ]
        )
        landed = {f"L{i}" for i, r in enumerate(replies) if r.status == 200}
        self.assertEqual(
            {r.status for r in replies} - {200, 412}, set(), [r.body for r in replies]
        )
        self.assertTrue(landed)
        self.assertEqual(set(self.read("race.txt").decode().splitlines()), landed)

    @inlineCallbacks
    def test_bad_input(self) -> Any:
        """
        Bad bodies are 400 invalid_param and a missing file 404, a binary one
        400 (kind not_text), a directory 400; nothing is written and no
        temporary file is left.
        """
        self.put("app.py", SOURCE)
        self.put("blob.bin", b"\x00\xff\xfe")
        os.mkdir(os.path.join(self.base_dir, "dir"))
        one = {"old_text": "os", "new_text": "sys"}
        cases = [
            ({"path": "app.py", "old_text": "", "new_text": "x"}, 400, "invalid_param"),
            ({"path": "app.py", "old_text": "os"}, 400, "invalid_param"),
            ({"path": "app.py", "edits": []}, 400, "invalid_param"),
            ({"path": "app.py", "edits": ["x"]}, 400, "invalid_param"),
            ({"path": "app.py", "edits": [one], **one}, 400, "invalid_param"),
            ({"path": "app.py", "edits": [one] * 101}, 400, "invalid_param"),
            ({"path": "app.py", **one, "replace_all": "yes"}, 400, "invalid_param"),
            ({"path": "missing.py", **one}, 404, "not_found"),
            ({"path": "blob.bin", **one}, 400, "invalid_param"),
            ({"path": "dir", **one}, 400, "invalid_param"),
            ({"path": "../outside.py", **one}, 403, "path_not_allowed"),
        ]
        for body, status, code in cases:
            reply = yield self.edit(body)
            self.assertEqual(
                (reply.status, reply.json().get("code")), (status, code), body
            )
        self.assertEqual(self.read("app.py"), SOURCE)
        self.assertEqual(
            sorted(os.listdir(self.base_dir)), ["app.py", "blob.bin", "dir"]
        )


class EditPolicyTests(FilesCase):
    """The path rules of both a read and a write hold, and the size cap."""

    policy = {
        "defaults": {"paths": {"read_only": ["ro"], "deny": ["**/secret*"]}},
        "endpoints": {"files_edit": {"limits": {"max_bytes": 100}}},
    }

    @inlineCallbacks
    def test_refusals(self) -> Any:
        """
        A read-only path is 403 read_only, a denied one 403 path_denied, a
        file over max_bytes 413 naming the key to raise; none is changed.
        """
        self.put("ro/a.txt", b"hello")
        self.put("secret.txt", b"hello")
        self.put("big.txt", b"hello" + b"." * 200)
        edit = {"old_text": "hello", "new_text": "bye"}
        for path, status, code in [
            ("ro/a.txt", 403, "read_only"),
            ("secret.txt", 403, "path_denied"),
            ("big.txt", 413, "payload_too_large"),
        ]:
            reply = yield self.request("POST", "/files/edit", dict(edit, path=path))
            self.assertEqual((reply.status, reply.json()["code"]), (status, code), path)
            self.assertTrue(self.read(path).startswith(b"hello"))
        reply = yield self.request("POST", "/files/edit", dict(edit, path="big.txt"))
        self.assertIn("files_edit", reply.json()["error"])


class EditScopeTests(FilesCase):
    """Editing reads the file: a token needs files:read as well as files:write."""

    token = None
    policy = {
        "auth": {
            "tokens": [
                {"id": "writer", "token_env": "SBX_W", "scopes": ["files:write"]},
                {
                    "id": "both",
                    "token_env": "SBX_B",
                    "scopes": ["files:read", "files:write"],
                },
            ]
        }
    }
    environ = {"SBX_W": "w-token", "SBX_B": "b-token"}

    @inlineCallbacks
    def test_needs_read_and_write(self) -> Any:
        """A write-only token is 403 missing_scope; with both scopes the edit is made."""
        self.put("a.txt", b"one")
        edit = {"path": "a.txt", "old_text": "one", "new_text": "two"}
        reply = yield self.request("POST", "/files/edit", edit, token="w-token")
        self.assertEqual((reply.status, reply.json()["code"]), (403, "missing_scope"))
        self.assertEqual(self.read("a.txt"), b"one")
        reply = yield self.request("POST", "/files/edit", edit, token="b-token")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(self.read("a.txt"), b"two")
