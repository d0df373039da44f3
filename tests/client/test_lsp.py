# -*- test-case-name: tests.client.test_lsp -*-
"""
``sb.lsp`` in both faces of the client, and ``sandboxd diagnostics`` and
``sandboxd definition``, against a real daemon and a real pylsp: what an
agent sees of a file's problems and its names, and of a refusal.
"""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.internet.defer import inlineCallbacks

from sandboxd.client import Sandbox
from sandboxd.client.errors import (
    EndpointDisabled,
    InvalidParam,
    NotFound,
    PathNotAllowed,
)
from tests.client.base import ClientCase
from tests.lsp.test_lsp import START_SECONDS, lsp_policy, need_pylsp

#: A file with an unused import on line 1 and an undefined name at 3:5.
BAD = "import os\n\nx = undefined_name + 1\n"
LIB = 'def greet(name: str) -> str:\n    """Say hello."""\n    return "hi " + name\n'
APP = "from lib import greet\n\nprint(greet('x'))\n"


class LspClientCase(ClientCase):
    """A daemon with the lsp group on, and a small project in ``proj``."""

    timeout = 180
    policy = lsp_policy()
    call_seconds = START_SECONDS + 30

    def setUp(self) -> Any:
        need_pylsp()
        started = super().setUp()  # base_dir is made before the daemon starts
        os.makedirs(self.path("proj"))
        for name, text in (
            ("pyproject.toml", "[project]\nname = 'proj'\n"),
            ("bad.py", BAD),
            ("lib.py", LIB),
            ("app.py", APP),
        ):
            with open(self.path("proj", name), "w") as f:
                f.write(text)
        return started


class SyncTests(LspClientCase):
    """The blocking face, call by call."""

    @inlineCallbacks
    def test_diagnostics(self) -> Any:
        """The undefined name at its line and column, an error; the unused import a warning."""
        out = yield self.in_thread(
            lambda: self.sandbox().lsp.diagnostics("proj/bad.py")
        )
        self.assertEqual(out["path"], self.path("proj", "bad.py"))
        self.assertTrue(out["settled"])
        by_line = {d["line"]: d for d in out["diagnostics"]}
        self.assertIn("undefined_name", by_line[3]["message"])
        self.assertEqual((by_line[3]["column"], by_line[3]["severity"]), (5, "error"))
        self.assertEqual(by_line[1]["severity"], "warning")
        self.assertEqual(out["counts"]["error"], 1)

    @inlineCallbacks
    def test_definition_hover_references_symbols(self) -> Any:
        """
        A call leads to the def line in the other file; hover gives the
        signature and docstring; references find the call (the def left
        out when asked); symbols list
        the file's function; a session is listed, then stopped.
        """

        def body(sb: Sandbox) -> Any:
            found = sb.lsp.definition("proj/app.py", 3, 7)
            hover = sb.lsp.hover("proj/app.py", 3, column=8)
            uses = sb.lsp.references(
                "proj/lib.py", 1, 5, include_declaration=False, max_results=10
            )
            symbols = sb.lsp.symbols("proj/lib.py")
            sessions = sb.lsp.sessions()
            stopped = sb.lsp.stop(found["session_id"])
            return found, hover, uses, symbols, sessions, stopped, sb.lsp.sessions()

        found, hover, uses, symbols, sessions, stopped, after = yield self.in_thread(
            lambda: body(self.sandbox())
        )
        [place] = found["locations"]
        self.assertEqual(place["path"], self.path("proj", "lib.py"))
        self.assertEqual((place["line"], place["column"]), (1, 5))
        self.assertEqual(place["text"], "def greet(name: str) -> str:")
        self.assertTrue(hover["found"])
        self.assertIn("greet(name: str) -> str", hover["contents"])
        self.assertIn("Say hello.", hover["contents"])
        places = {(os.path.basename(u["path"]), u["line"]) for u in uses["locations"]}
        self.assertIn(("app.py", 3), places)
        self.assertNotIn(("lib.py", 1), places)  # the declaration, left out
        self.assertEqual(
            [(s["name"], s["kind"]) for s in symbols["symbols"]],
            [("greet", "function")],
        )
        self.assertEqual([s["id"] for s in sessions], [found["session_id"]])
        self.assertEqual(sessions[0]["root"], self.path("proj"))
        self.assertEqual(stopped["state"], "closed")
        self.assertEqual(after, [])

    @inlineCallbacks
    def test_start_and_session(self) -> Any:
        """
        ``start`` answers a ready session (the same one asked twice);
        questions with its id use it; an unknown id is NotFound.
        """

        def body(sb: Sandbox) -> Any:
            started = sb.lsp.start("python", root="proj")
            again = sb.lsp.start(server="pylsp", root="proj")
            asked = sb.lsp.diagnostics("proj/lib.py", session_id=started["id"])
            detail = sb.lsp.session(started["id"])
            servers = sb.lsp.servers()
            with self.assertRaises(NotFound):
                sb.lsp.session("no-such-session")
            return started, again, asked, detail, servers

        started, again, asked, detail, servers = yield self.in_thread(
            lambda: body(self.sandbox())
        )
        self.assertEqual((started["state"], started["server"]), ("ready", "pylsp"))
        self.assertEqual(again["id"], started["id"])
        self.assertEqual(asked["session_id"], started["id"])
        self.assertEqual(asked["diagnostics"], [])
        self.assertIn("stderr", detail)
        pylsp = next(s for s in servers if s["id"] == "pylsp")
        self.assertEqual((pylsp["installed"], pylsp["allowed"]), (True, True))

    @inlineCallbacks
    def test_refusals(self) -> Any:
        """
        A file outside the boundary is PathNotAllowed (no server started for
        it); a line past the end is InvalidParam with its kind.
        """

        def body(sb: Sandbox) -> Any:
            with self.assertRaises(PathNotAllowed) as outside:
                sb.lsp.diagnostics("/etc/passwd", language="python")
            with self.assertRaises(InvalidParam) as past:
                sb.lsp.definition("proj/lib.py", 99)
            return outside.exception, past.exception

        outside, past = yield self.in_thread(lambda: body(self.sandbox()))
        self.assertEqual((outside.status, outside.code), (403, "path_not_allowed"))
        self.assertEqual(past.body["kind"], "past_end")

    @inlineCallbacks
    def test_rename(self) -> Any:
        """A dry run changes nothing; the rename changes both files, as its diffs said."""

        def body(sb: Sandbox) -> Any:
            dry = sb.lsp.rename("proj/app.py", 3, "welcome", column=7, dry_run=True)
            untouched = open(self.path("proj", "lib.py")).read()
            done = sb.lsp.rename("proj/app.py", 3, "welcome", column=7)
            return dry, untouched, done

        dry, untouched, done = yield self.in_thread(lambda: body(self.sandbox()))
        self.assertFalse(dry["applied"])
        self.assertEqual(untouched, LIB)
        self.assertTrue(done["applied"])
        self.assertEqual(
            sorted(os.path.basename(f["path"]) for f in done["files"]),
            ["app.py", "lib.py"],
        )
        with open(self.path("proj", "app.py")) as f:
            self.assertEqual(f.read(), APP.replace("greet", "welcome"))


class AsyncTests(LspClientCase):
    """The asyncio face."""

    @inlineCallbacks
    def test_diagnostics_and_definition(self) -> Any:
        """The same answers, awaited."""

        async def body() -> Any:
            async with self.async_sandbox() as sb:
                problems = await sb.lsp.diagnostics("proj/bad.py", timeout=20)
                found = await sb.lsp.definition("proj/app.py", 3, 7)
                return problems, found

        problems, found = yield self.in_loop(body)
        self.assertEqual(
            [
                (d["line"], d["column"])
                for d in problems["diagnostics"]
                if d["severity"] == "error"
            ],
            [(3, 5)],
        )
        self.assertEqual(
            [(p["path"], p["line"]) for p in found["locations"]],
            [(self.path("proj", "lib.py"), 1)],
        )


class CliTests(LspClientCase):
    """``sandboxd diagnostics`` and ``sandboxd definition``."""

    @inlineCallbacks
    def test_diagnostics(self) -> Any:
        """
        A line per diagnostic as compilers print it, exit 1 for an error;
        a clean file prints nothing and exits 0; a refusal exits 2.
        """
        bad = self.path("proj", "bad.py")
        done = yield self.cli("diagnostics", "proj/bad.py", "proj/lib.py")
        self.assertEqual(done.returncode, 1, done.stderr)
        lines = done.stdout.decode().splitlines()
        self.assertIn(
            f"{bad}:3:5: error: undefined name 'undefined_name' [pyflakes]", lines
        )
        self.assertTrue(
            any(
                line.startswith(f"{bad}:1:1: warning: ") and "'os'" in line
                for line in lines
            ),
            lines,
        )
        self.assertTrue(all(line.startswith(bad + ":") for line in lines), lines)
        clean = yield self.cli("diagnostics", "--timeout", "20", "proj/lib.py")
        self.assertEqual((clean.returncode, clean.stdout), (0, b""), clean.stderr)
        as_json = yield self.cli("diagnostics", "--json", "proj/lib.py")
        self.assertEqual(json.loads(as_json.stdout)[0]["counts"]["error"], 0)
        refused = yield self.cli("diagnostics", "/etc/passwd")
        self.assertEqual(refused.returncode, 2)
        self.assertIn(b"path_not_allowed", refused.stderr)
        missing = yield self.cli("diagnostics", "proj/missing.py")
        self.assertEqual(missing.returncode, 2)
        self.assertIn(b"not_found", missing.stderr)

    @inlineCallbacks
    def test_an_error_past_the_kept_diagnostics_still_exits_1(self) -> Any:
        """
        1,200 unused imports before an undefined name: more than the 1,000
        kept, yet the error is printed, the command exits 1, and stderr
        says how many were not shown.
        """
        with open(self.path("proj", "w.py"), "w") as f:
            f.write("".join(f"import os as m{n}\n" for n in range(1200)))
            f.write("print(really_undefined)\n")
        done = yield self.cli("diagnostics", "--timeout", "60", "proj/w.py")
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertIn(b"really_undefined", done.stdout)
        self.assertIn(b"201 more not shown", done.stderr)

    @inlineCallbacks
    def test_definition(self) -> Any:
        """
        ``PATH:LINE:COLUMN: TEXT`` of the def, exit 0; nothing there exits 1;
        a position that is not one is a usage error (2).
        """
        lib = self.path("proj", "lib.py")
        done = yield self.cli("definition", "proj/app.py:3:7")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(
            done.stdout.decode(), f"{lib}:1:5: def greet(name: str) -> str:\n"
        )
        none = yield self.cli("definition", "proj/app.py:2")
        self.assertEqual((none.returncode, none.stdout), (1, b""), none.stderr)
        usage = yield self.cli("definition", "proj/app.py")
        self.assertEqual(usage.returncode, 2)
        self.assertIn(b"PATH:LINE[:COLUMN]", usage.stderr)


class OffTests(ClientCase):
    """The group is off unless the policy turns it on."""

    @inlineCallbacks
    def test_endpoint_disabled(self) -> Any:
        """Without the group a question raises EndpointDisabled; the CLI exits 2."""

        def body(sb: Sandbox) -> Any:
            with self.assertRaises(EndpointDisabled) as off:
                sb.lsp.diagnostics("a.py")
            return off.exception

        off = yield self.in_thread(lambda: body(self.sandbox()))
        self.assertEqual((off.status, off.code), (404, "endpoint_disabled"))
        done = yield self.cli("diagnostics", "a.py")
        self.assertEqual(done.returncode, 2)
        self.assertIn(b"endpoint_disabled", done.stderr)
