"""
``POST /files/grep`` against a real daemon on loopback: the answer, the
path rules (deny globs, links out of the boundary, scopes), its refusals,
and a reactor that keeps answering while a pattern backtracks without end.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.files.test_grep import CATASTROPHIC, LONG_LINE
from tests.routes.test_files import FilesCase
from tests.test_guard import _rmtree


class GrepCase(FilesCase):
    def put(self, rel: str, data: bytes = b"needle\n") -> str:
        return super().put(rel, data)

    def grep(self, **body: Any) -> Any:
        return self.request("POST", "/files/grep", body)


class GrepTests(GrepCase):
    """The answer, and the refusals of a request."""

    @inlineCallbacks
    def test_answer(self) -> Any:
        """200: every match with its path, line, column and text, and the counts."""
        self.put("src/a.py", b"import os\nx = os.path  # os\n")
        self.put("src/b.txt", b"os\n")
        self.put("src/c.bin", b"os\0")
        reply = yield self.grep(pattern=r"\bos\b", path="src", include="*.py")
        self.assertEqual(reply.status, 200, reply.body)
        a = os.path.join(self.base_dir, "src/a.py")
        self.assertEqual(
            reply.json(),
            {
                "matches": [
                    {"path": a, "line": 1, "column": 8, "text": "import os"},
                    {"path": a, "line": 2, "column": 5, "text": "x = os.path  # os"},
                    {"path": a, "line": 2, "column": 16, "text": "x = os.path  # os"},
                ],
                "files_searched": 1,
                "files_matched": 1,
                "files_skipped": 0,
                "truncated": False,
                "timed_out": False,
            },
        )
        reply = yield self.grep(pattern="OS", ignore_case=True, fixed_strings=True)
        body = reply.json()
        self.assertEqual(
            (
                len(body["matches"]),
                body["files_searched"],
                body["files_skipped"],
                body["truncated"],
            ),
            (4, 2, 1, False),
        )
        reply = yield self.grep(pattern="os", path="src", max_results=2)
        self.assertEqual(
            (len(reply.json()["matches"]), reply.json()["truncated"]), (2, True)
        )

    @inlineCallbacks
    def test_refusals(self) -> Any:
        """
        400 invalid_param for a regex that does not compile (the message
        points at fixed_strings), a pattern over 1024 characters, fields of
        the wrong type; 404 for a missing path.
        """
        self.put("a.txt")
        reply = yield self.grep(pattern="a(b")
        self.assertEqual(
            (reply.status, reply.json()["code"]), (400, "invalid_param"), reply.body
        )
        self.assertIn("not a valid regular expression", reply.json()["error"])
        self.assertIn("fixed_strings", reply.json()["error"])
        reply = yield self.grep(pattern="a(b", fixed_strings=True)
        self.assertEqual(reply.status, 200)
        for body in (
            {"pattern": "x" * 1025},
            {},
            {"pattern": ""},
            {"pattern": 7},
            {"pattern": "x", "fixed_strings": "yes"},
            {"pattern": "x", "ignore_case": 1},
            {"pattern": "x", "include": ["*.py"]},
            {"pattern": "x", "path": 3},
            {"pattern": "x", "max_results": 0},
            {"pattern": "x", "max_depth": 0},
            {"pattern": "x", "context": 6},
            {"pattern": "x", "context": -1},
        ):
            reply = yield self.grep(**body)
            self.assertEqual(
                (reply.status, reply.json()["code"]), (400, "invalid_param"), body
            )
        reply = yield self.grep(pattern="x", path="missing")
        self.assertEqual((reply.status, reply.json()["code"]), (404, "not_found"))


class WhatAnAgentTypesTests(GrepCase):
    """Searches as agents write them, over HTTP."""

    @inlineCallbacks
    def test_minified_line_braces_and_newlines(self) -> Any:
        """
        A match deep in a minified line comes back with the text around it
        (text_column saying where that text starts); include takes
        ``*.{js,ts}``; a pattern with a newline, which could never match,
        is 400 saying why rather than an empty answer.
        """
        self.put("app.min.js", b"var a=1;" * 10_000 + b"NEEDLE;\n")
        self.put("b.ts", b"NEEDLE\n")
        self.put("c.txt", b"NEEDLE\n")
        reply = yield self.grep(pattern="NEEDLE", include="*.{js,ts}")
        self.assertEqual(reply.status, 200, reply.body)
        deep, short = reply.json()["matches"]
        self.assertEqual(
            [os.path.basename(m["path"]) for m in (deep, short)], ["app.min.js", "b.ts"]
        )
        self.assertIn("NEEDLE", deep["text"])
        self.assertEqual(
            deep["column"] - deep["text_column"], deep["text"].index("NEEDLE")
        )
        reply = yield self.grep(pattern="var\nNEEDLE")
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_param"))
        self.assertIn("newline", reply.json()["error"])
        reply = yield self.grep(pattern="NEEDLE", include="*.{js")
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_param"))


class IgnoreTests(GrepCase):
    """What a project ignores is not searched unless asked, over HTTP."""

    @inlineCallbacks
    def test_project_files_found(self) -> Any:
        """
        files_grep leaves out what .gitignore names and hidden directories
        (no_ignore and hidden search them; exclude leaves out more);
        files_search finds every name as the seed's does, and leaves out
        the same when asked; a bad exclude is a 400.
        """
        self.put("proj/.gitignore", b"web/node_modules/\n")
        self.put("proj/web/src/app.js")
        for n in range(50):
            self.put(f"proj/web/node_modules/p{n:02}/index.js")
        self.put("proj/calc/.venv/lib/site.py")
        reply = yield self.grep(pattern="needle", path="proj/web")
        self.assertEqual(reply.status, 200, reply.body)
        app = os.path.join(self.base_dir, "proj/web/src/app.js")
        self.assertEqual([m["path"] for m in reply.json()["matches"]], [app])
        reply = yield self.grep(pattern="needle", path="proj", no_ignore=True)
        self.assertEqual(len(reply.json()["matches"]), 51)
        reply = yield self.grep(
            pattern="needle",
            path="proj",
            no_ignore=True,
            hidden=True,
            exclude=["node_modules"],
        )
        self.assertEqual(len(reply.json()["matches"]), 2)
        search = yield self.request(
            "POST", "/files/search", {"pattern": "*.js", "path": "proj"}
        )
        self.assertEqual(len(search.json()["results"]), 51)
        search = yield self.request(
            "POST",
            "/files/search",
            {"pattern": "*.py", "path": "proj", "no_ignore": False, "hidden": False},
        )
        self.assertEqual(search.json()["results"], [])
        search = yield self.request(
            "POST",
            "/files/search",
            {"pattern": "*.js", "path": "proj", "exclude": ["node_modules"]},
        )
        self.assertEqual([r["path"] for r in search.json()["results"]], [app])
        for body in (
            {"exclude": [3]},
            {"exclude": "x"},
            {"exclude": [""]},
            {"hidden": "yes"},
        ):
            reply = yield self.grep(pattern="x", **body)
            self.assertEqual(
                (reply.status, reply.json()["code"]), (400, "invalid_param"), body
            )


class PolicyTests(GrepCase):
    """The path rules hold as they do for listing and reading."""

    policy = {"endpoints": {"files_*": {"paths": {"deny": ["**/secret*", ".env"]}}}}

    @inlineCallbacks
    def test_denied_files_hidden(self) -> Any:
        """
        Denied files' matches are not shown (nor their names in a name
        search); searching a denied path itself is refused 403, as a name
        search refuses it.
        """
        self.put("app/main.py")
        self.put("app/secret.key")
        self.put("app/secrets/inner.txt")
        self.put(".env")
        reply = yield self.grep(pattern="needle")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            [m["path"] for m in reply.json()["matches"]],
            [os.path.join(self.base_dir, "app/main.py")],
        )
        self.assertEqual(reply.json()["files_searched"], 1)
        for path in ("app/secret.key", "app/secrets", ".env"):
            searched = yield self.request(
                "POST", "/files/search", {"pattern": "*", "path": path}
            )
            grepped = yield self.grep(pattern="needle", path=path)
            self.assertEqual(
                (grepped.status, grepped.json()["code"]), (403, "path_denied"), path
            )
            self.assertEqual(
                (searched.status, searched.json()["code"]), (403, "path_denied")
            )

    @inlineCallbacks
    def test_link_out_not_followed(self) -> Any:
        """
        A link in the tree to a directory or a file outside the base dir
        is not followed; named as the path, it is refused.
        """
        outside = os.path.realpath(tempfile.mkdtemp())
        self.addCleanup(_rmtree, outside)
        with open(os.path.join(outside, "passwords.txt"), "w") as f:
            f.write("needle\n")
        self.put("inside.txt")
        os.symlink(outside, os.path.join(self.base_dir, "out"))
        os.symlink(
            os.path.join(outside, "passwords.txt"), os.path.join(self.base_dir, "pw")
        )
        reply = yield self.grep(pattern="needle")
        self.assertEqual(
            [m["path"] for m in reply.json()["matches"]],
            [os.path.join(self.base_dir, "inside.txt")],
        )
        for path in ("out", "pw", "out/passwords.txt"):
            reply = yield self.grep(pattern="needle", path=path)
            self.assertEqual(
                (reply.status, reply.json()["code"]), (403, "path_not_allowed"), path
            )


class ScopeTests(GrepCase):
    """files_grep needs files:read."""

    token = "admin-token"
    policy = {
        "auth": {
            "tokens": [
                {"id": "admin", "token_env": "ABX_SERVER_TOKEN", "scopes": ["*"]},
                {
                    "id": "runner",
                    "token_sha256": hashlib.sha256(b"runner-token").hexdigest(),
                    "scopes": ["process:run"],
                },
                {
                    "id": "reader",
                    "token_sha256": hashlib.sha256(b"reader-token").hexdigest(),
                    "scopes": ["files:read"],
                },
            ]
        }
    }

    @inlineCallbacks
    def test_missing_scope(self) -> Any:
        """A token without files:read is 403 missing_scope; one with it greps."""
        self.put("a.txt")
        body = {"pattern": "needle"}
        reply = yield self.request("POST", "/files/grep", body, token="runner-token")
        self.assertEqual((reply.status, reply.json()["code"]), (403, "missing_scope"))
        reply = yield self.request("POST", "/files/grep", body, token="reader-token")
        self.assertEqual((reply.status, len(reply.json()["matches"])), (200, 1))


class ResponsiveTests(GrepCase):
    """A pattern a backtracking engine would run without end costs nothing here."""

    @inlineCallbacks
    def test_backtracking_pattern_answers_at_once(self) -> Any:
        """
        ``(a+)+$`` on a long line of ``a`` (which ``re`` would take for
        ages, holding every thread) is answered at once, not timed out, and
        GET /health answers alongside it.
        """
        self.put("a.txt", (LONG_LINE * 200).encode())
        began = time.monotonic()
        grepping = self.grep(pattern=CATASTROPHIC)
        health = yield self.request("GET", "/health")
        self.assertEqual(health.status, 200)
        reply = yield grepping
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            (reply.json()["timed_out"], reply.json()["matches"]), (False, [])
        )
        self.assertLess(time.monotonic() - began, 2.0)
