"""
Language servers through a real daemon and a real pylsp: diagnostics of
the file as it is on disk, definitions across files, references, hover,
symbols and completions with an agent's positions; the path guard over
what comes back; bounds, failures and the end of every server's tree.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.lsp.answers import uri_of
from sandboxd.lsp.session import message_head
from tests.helpers import DaemonTestCase, alive
from tests.routes.test_confinement import need_landlock

#: pylsp starts in about a second on a quiet machine; on two cores shared
#: with the rest of the suite, at the children's nice value, much slower.
START_SECONDS = 60


def need_pylsp() -> None:
    """Skip (saying why) where python-lsp-server is not installed."""
    if importlib.util.find_spec("pylsp") is None:
        raise SkipTest("python-lsp-server is not installed (pip install -e '.[dev]')")


def lsp_policy(**rule: Any) -> dict[str, Any]:
    """The lsp group on, pylsp the only server, starts given room."""
    limits = {"start_timeout_seconds": START_SECONDS, "timeout_seconds": 30}
    limits.update(rule.pop("limits", {}))
    params = {"lsp_servers": ["pylsp"], **rule.pop("params", {})}
    return {
        "groups": {"lsp": True},
        "endpoints": {"group:lsp": {"limits": limits, "params": params, **rule}},
    }


class LspTestCase(DaemonTestCase):
    """A daemon with the lsp group on and a small Python project."""

    timeout = 120
    policy = lsp_policy()

    def setUp(self) -> Any:
        need_pylsp()
        return super().setUp()

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.base_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def project(self) -> None:
        self.write("proj/pyproject.toml", "[project]\nname = 'proj'\n")
        self.write(
            "proj/lib.py",
            'def greet(name: str) -> str:\n    """Say hello."""\n    return "hi " + name\n',
        )
        self.write(
            "proj/app.py",
            "from lib import greet\n\nprint(greet('x'))\nprint(greet('y'))\n",
        )

    @inlineCallbacks
    def ask(self, endpoint: str, status: int = 200, **body: Any) -> Any:
        reply = yield self.request("POST", f"/lsp/{endpoint}", body)
        self.assertEqual(reply.status, status, reply.body)
        return reply.json()


class QuestionTests(LspTestCase):
    """What an agent asks, answered in its own coordinates."""

    @inlineCallbacks
    def test_diagnostics_follow_the_file_on_disk(self) -> Any:
        """An undefined name is reported at its line and column; once fixed on disk, it is gone."""
        path = self.write("proj/bad.py", "import os\n\nx = undefined_name + 1\n")
        self.write("proj/pyproject.toml", "")
        out = yield self.ask("diagnostics", path="proj/bad.py")
        self.assertTrue(out["settled"])
        self.assertEqual(out["server"], "pylsp")
        self.assertEqual(out["path"], path)
        by_line = {d["line"]: d for d in out["diagnostics"]}
        self.assertIn("undefined_name", by_line[3]["message"])
        self.assertEqual((by_line[3]["column"], by_line[3]["severity"]), (5, "error"))
        self.assertIn("os", by_line[1]["message"])  # imported but unused
        self.assertEqual(out["counts"]["error"], 1)
        self.write("proj/bad.py", "x = 1\n")
        out = yield self.ask("diagnostics", path="proj/bad.py")
        self.assertEqual((out["diagnostics"], out["settled"]), ([], True))

    @inlineCallbacks
    def test_definition_in_another_file(self) -> Any:
        """The call of a function imported from another file leads to its def line there."""
        self.project()
        out = yield self.ask("definition", path="proj/app.py", line=3, column=7)
        [location] = out["locations"]
        self.assertEqual(location["path"], os.path.join(self.base_dir, "proj/lib.py"))
        self.assertEqual((location["line"], location["column"]), (1, 5))
        self.assertEqual(location["text"], "def greet(name: str) -> str:")
        self.assertEqual(out["outside"], 0)

    @inlineCallbacks
    def test_references_and_hover(self) -> Any:
        """Every use of a name is found; hover gives its signature and docstring."""
        self.project()
        out = yield self.ask("references", path="proj/lib.py", line=1, column=5)
        places = sorted(
            (os.path.basename(r["path"]), r["line"]) for r in out["locations"]
        )
        self.assertEqual(
            places, [("app.py", 1), ("app.py", 3), ("app.py", 4), ("lib.py", 1)]
        )
        out = yield self.ask(
            "references",
            path="proj/lib.py",
            line=1,
            column=5,
            include_declaration=False,
        )
        self.assertNotIn(
            "lib.py", {os.path.basename(r["path"]) for r in out["locations"]}
        )
        out = yield self.ask("hover", path="proj/app.py", line=3, column=8)
        self.assertTrue(out["found"])
        self.assertIn("greet(name: str) -> str", out["contents"])
        self.assertIn("Say hello.", out["contents"])

    @inlineCallbacks
    def test_columns_are_characters(self) -> Any:
        """
        A line with a two-byte character, or two emoji, before the name still
        lands on the name, both ways: pylsp counts characters where LSP says
        UTF-16 units, and the daemon speaks to it in characters.
        """
        self.write("proj/pyproject.toml", "")
        self.write(
            "proj/u.py",
            "def f():\n    pass\n\ndef g(n):\n    pass\n\n"
            "s = 'é'; f()\nt = '\U0001f600\U0001f600'; g(f())\n",
        )
        out = yield self.ask("definition", path="proj/u.py", line=7, column=10)
        [location] = out["locations"]
        self.assertEqual((location["line"], location["column"]), (1, 5))
        out = yield self.ask("definition", path="proj/u.py", line=8, column=13)
        [location] = out["locations"]
        self.assertEqual((location["line"], location["column"]), (1, 5))
        out = yield self.ask("definition", path="proj/u.py", line=8, column=11)
        [location] = out["locations"]
        self.assertEqual((location["line"], location["column"]), (4, 5))
        out = yield self.ask("references", path="proj/u.py", line=1, column=5)
        found = {(r["line"], r["column"]) for r in out["locations"]}
        self.assertIn((7, 10), found)
        self.assertIn((8, 13), found)
        reply = yield self.request("GET", f"/lsp/sessions/{out['session_id']}")
        self.assertEqual(reply.json()["position_encoding"], "utf-32")

    @inlineCallbacks
    def test_pyflakes_columns_after_non_ascii(self) -> Any:
        """
        pyflakes (through pylsp) counts a diagnostic's column in UTF-8
        bytes: after two ``é`` the undefined name is still reported at its
        character column.
        """
        self.write("proj/pyproject.toml", "")
        self.write("proj/e.py", "s = 'éé'; print(undefined_name)\n")
        out = yield self.ask("diagnostics", path="proj/e.py")
        [found] = [d for d in out["diagnostics"] if d["source"] == "pyflakes"]
        self.assertEqual((found["line"], found["column"]), (1, 17))
        self.assertIn("undefined_name", found["message"])

    @inlineCallbacks
    def test_symbols_and_completions(self) -> Any:
        """A file's symbols by name, kind and line; completions after ``os.``."""
        self.project()
        out = yield self.ask("symbols", path="proj/lib.py")
        self.assertEqual(
            [(s["name"], s["kind"], s["line"]) for s in out["symbols"]],
            [("greet", "function", 1)],
        )
        # The whole definition's lines, to read it by lines.
        self.assertEqual(out["symbols"][0]["body"], {"line": 1, "end_line": 3})
        self.write("proj/c.py", "import os\nos.pa\n")
        out = yield self.ask("completions", path="proj/c.py", line=2, column=6)
        labels = {i["label"] for i in out["items"]}
        self.assertIn("path", labels)
        self.assertLessEqual(len(out["items"]), 50)

    @inlineCallbacks
    def test_rename_across_files(self) -> Any:
        """A dry run shows diffs and writes nothing; the rename changes both files on disk."""
        self.project()
        lib = os.path.join(self.base_dir, "proj/lib.py")
        app = os.path.join(self.base_dir, "proj/app.py")
        before = {p: open(p).read() for p in (lib, app)}
        out = yield self.ask(
            "rename",
            path="proj/app.py",
            line=3,
            column=7,
            new_name="welcome",
            dry_run=True,
        )
        self.assertFalse(out["applied"])
        self.assertEqual(sorted(f["path"] for f in out["files"]), [app, lib])
        self.assertIn(
            "+def welcome(name: str) -> str:", "".join(f["diff"] for f in out["files"])
        )
        self.assertEqual({p: open(p).read() for p in (lib, app)}, before)
        out = yield self.ask(
            "rename", path="proj/app.py", line=3, column=7, new_name="welcome"
        )
        self.assertTrue(out["applied"])
        with open(lib) as f:
            self.assertTrue(f.read().startswith("def welcome(name: str) -> str:"))
        with open(app) as f:
            self.assertEqual(
                f.read(),
                "from lib import welcome\n\nprint(welcome('x'))\nprint(welcome('y'))\n",
            )
        # The server is told of the new text: a definition finds the new name.
        out = yield self.ask("definition", path="proj/app.py", line=3, column=7)
        self.assertEqual(out["locations"][0]["text"], "def welcome(name: str) -> str:")

    @inlineCallbacks
    def test_renames_in_a_row(self) -> Any:
        """
        A rename after one that changed a file the server has open works:
        the server is sent the texts the daemon wrote (it was 412, for
        ever, naming an ETag nobody gave).  A file changed on disk by
        someone else before a rename is sent again too.
        """
        self.write("proj/pyproject.toml", "")
        self.write("proj/pkg/__init__.py", "")
        lib = self.write(
            "proj/pkg/lib.py",
            'def greet(name):\n    return "hi " + name\n\n\nclass Counter:\n    pass\n',
        )
        app = self.write(
            "proj/app.py",
            'from pkg.lib import greet, Counter\n\nprint(greet("w"))\nc = Counter()\n',
        )
        yield self.ask("diagnostics", path="proj/pkg/lib.py")  # lib.py is open
        yield self.ask(
            "rename", path="proj/app.py", line=3, column=7, new_name="welcome"
        )
        out = yield self.ask(
            "rename", path="proj/app.py", line=4, column=5, new_name="Tally"
        )
        self.assertEqual(sorted(f["path"] for f in out["files"]), [app, lib])
        with open(lib) as f:
            self.assertEqual(
                f.read(),
                'def welcome(name):\n    return "hi " + name\n\n\nclass Tally:\n    pass\n',
            )
        with open(lib, "a") as f:
            f.write("\n\nwelcome('again')\n")
        out = yield self.ask(
            "rename", path="proj/app.py", line=3, column=7, new_name="hello"
        )
        with open(lib) as f:
            self.assertTrue(f.read().endswith("\n\nhello('again')\n"))

    @inlineCallbacks
    def test_one_server_per_project(self) -> Any:
        """Questions about one project share a server; another project gets its own."""
        self.project()
        self.write("other/pyproject.toml", "")
        self.write("other/m.py", "y = 2\n")
        a = yield self.ask("symbols", path="proj/lib.py")
        b = yield self.ask("symbols", path="proj/app.py")
        c = yield self.ask("symbols", path="other/m.py")
        self.assertEqual(a["session_id"], b["session_id"])
        self.assertNotEqual(a["session_id"], c["session_id"])
        reply = yield self.request("GET", "/lsp/sessions")
        roots = sorted(s["root"] for s in reply.json()["sessions"])
        self.assertEqual(
            roots,
            [os.path.join(self.base_dir, "other"), os.path.join(self.base_dir, "proj")],
        )

    @inlineCallbacks
    def test_bad_questions(self) -> Any:
        """Each bad question is a clear 4xx with its code, and starts nothing it need not."""
        self.write("proj/pyproject.toml", "")
        self.write("proj/a.py", "x = 1\n")
        self.write("proj/notes.txt", "hello\n")
        with open(os.path.join(self.base_dir, "proj/bin.py"), "wb") as f:
            f.write(b"\xff\xfe\x00")
        out = yield self.ask("definition", 400, path="proj/a.py", line=9)
        self.assertEqual((out["code"], out["kind"]), ("invalid_param", "past_end"))
        out = yield self.ask("diagnostics", 400, path="proj/notes.txt")
        self.assertIn("no language", out["error"])
        out = yield self.ask("diagnostics", 400, path="proj/bin.py")
        self.assertEqual(out["kind"], "not_text")
        out = yield self.ask("diagnostics", 404, path="proj/missing.py")
        self.assertEqual(out["code"], "not_found")
        out = yield self.ask("diagnostics", 403, path="/etc/passwd", language="python")
        self.assertEqual(out["code"], "path_not_allowed")
        out = yield self.ask("diagnostics", 400, path="proj/a.py", server="pyright")
        self.assertEqual(out["allowed"], ["pylsp"])
        out = yield self.ask("definition", 400, path="proj/a.py")
        self.assertEqual(out["code"], "invalid_param")
        out = yield self.ask(
            "rename", 400, path="proj/a.py", line=1, column=40, new_name="y"
        )
        self.assertEqual(out["kind"], "past_end")
        self.assertIn("column 40 is past the end of line 1", out["error"])
        self.assertIn("has 5 characters", out["error"])


class GuardTests(LspTestCase):
    """What the server points at is shown only where the caller may read."""

    policy = lsp_policy(paths={"deny": ["**/secret/**"]})

    @inlineCallbacks
    def test_location_in_a_denied_file_is_left_out(self) -> Any:
        """A definition in a denied file is counted, not shown; a read of it is refused."""
        self.write("proj/pyproject.toml", "")
        self.write("proj/secret/keys.py", "TOKEN = 'hunter2'\n")
        self.write("proj/secret/__init__.py", "")
        self.write("proj/use.py", "from secret.keys import TOKEN\nprint(TOKEN)\n")
        out = yield self.ask("definition", path="proj/use.py", line=2, column=8)
        self.assertNotIn("hunter2", str(out))
        self.assertEqual(out["locations"], [])
        self.assertGreaterEqual(out["outside"], 1)
        out = yield self.ask("diagnostics", 403, path="proj/secret/keys.py")
        self.assertEqual(out["code"], "path_denied")

    @inlineCallbacks
    def test_rename_into_a_denied_file(self) -> Any:
        """
        A rename whose edits reach a denied file is 403, nothing written,
        and the file is not named (it was: the caller learnt its name and
        that it uses the symbol); it is counted, as a definition counts it.
        """
        self.write("proj/pyproject.toml", "")
        self.write("proj/secret/__init__.py", "")
        keys = self.write("proj/secret/keys.py", "from lib import greet\ngreet()\n")
        lib = self.write("proj/lib.py", "def greet():\n    pass\n")
        out = yield self.ask(
            "rename", 403, path="proj/lib.py", line=1, column=5, new_name="hello"
        )
        self.assertEqual((out["code"], out["outside"]), ("path_denied", 1))
        self.assertNotIn("keys", out["error"])
        self.assertNotIn("secret", out["error"])
        with open(lib) as f:
            self.assertEqual(f.read(), "def greet():\n    pass\n")
        with open(keys) as f:
            self.assertEqual(f.read(), "from lib import greet\ngreet()\n")


class SessionTests(LspTestCase):
    """Sessions started, shared, bounded, failed and stopped."""

    policy = lsp_policy(limits={"max_sessions": 2})

    @inlineCallbacks
    def test_create_reuse_delete(self) -> Any:
        """Create answers 201, again 200 with the same id; delete ends the server's process."""
        self.write("proj/pyproject.toml", "")
        reply = yield self.request(
            "POST", "/lsp/sessions", {"language": "python", "root": "proj"}
        )
        self.assertEqual(reply.status, 201, reply.body)
        session = reply.json()
        self.assertEqual((session["state"], session["server"]), ("ready", "pylsp"))
        self.assertIn("definitionProvider", session["capabilities"])
        again = yield self.request(
            "POST", "/lsp/sessions", {"server": "pylsp", "root": "proj"}
        )
        self.assertEqual((again.status, again.json()["id"]), (200, session["id"]))
        reply = yield self.request("GET", f"/lsp/sessions/{session['id']}")
        self.assertEqual(reply.json()["pid"], session["pid"])
        self.assertTrue(alive(session["pid"]))
        reply = yield self.request("DELETE", f"/lsp/sessions/{session['id']}")
        self.assertEqual(reply.json()["state"], "closed")
        self.assertFalse(alive(session["pid"]))
        reply = yield self.request("GET", f"/lsp/sessions/{session['id']}")
        self.assertEqual(reply.status, 404)

    @inlineCallbacks
    def test_max_sessions(self) -> Any:
        """
        A third project's server, while two run idle, takes the place of
        the least recently used one (it was 429 until that one's idle
        timeout): that server is stopped, the other keeps running.
        """
        for name in ("a", "b", "c"):
            self.write(f"{name}/pyproject.toml", "")
            self.write(f"{name}/m.py", "x = 1\n")
        a = yield self.ask("symbols", path="a/m.py")
        b = yield self.ask("symbols", path="b/m.py")
        yield self.ask("symbols", path="a/m.py")  # b is now the least recently used
        reply = yield self.request("GET", f"/lsp/sessions/{b['session_id']}")
        b_pid = reply.json()["pid"]
        c = yield self.ask("symbols", path="c/m.py")
        reply = yield self.request("GET", "/lsp/sessions")
        self.assertEqual(
            sorted(s["id"] for s in reply.json()["sessions"]),
            sorted([a["session_id"], c["session_id"]]),
        )
        for _ in range(100):
            if not alive(b_pid):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(alive(b_pid))

    @inlineCallbacks
    def test_killed_server(self) -> Any:
        """A server killed under a session: 502 for that session; the next question starts a new one."""
        self.write("proj/pyproject.toml", "")
        self.write("proj/m.py", "x = 1\n")
        first = yield self.ask("symbols", path="proj/m.py")
        reply = yield self.request("GET", f"/lsp/sessions/{first['session_id']}")
        os.kill(reply.json()["pid"], signal.SIGKILL)
        yield deferLater(reactor, 0.5, lambda: None)
        out = yield self.ask(
            "symbols", 502, path="proj/m.py", session_id=first["session_id"]
        )
        self.assertEqual(out["code"], "upstream_unavailable")
        self.assertIn("(it was killed by SIGKILL)", out["error"])
        second = yield self.ask("symbols", path="proj/m.py")
        self.assertNotEqual(second["session_id"], first["session_id"])

    @inlineCallbacks
    def test_stop_ends_every_server(self) -> Any:
        """The daemon's stop leaves no language server behind."""
        self.write("proj/pyproject.toml", "")
        self.write("proj/m.py", "x = 1\n")
        out = yield self.ask("symbols", path="proj/m.py")
        reply = yield self.request("GET", f"/lsp/sessions/{out['session_id']}")
        pid = reply.json()["pid"]
        yield self.daemon.stop()
        self.assertFalse(alive(pid))


class OffTests(DaemonTestCase):
    """The group is off unless the policy turns it on."""

    @inlineCallbacks
    def test_off_by_default(self) -> Any:
        """Without the group, every lsp route is 404 endpoint_disabled."""
        reply = yield self.request("POST", "/lsp/diagnostics", {"path": "a.py"})
        self.assertEqual(
            (reply.status, reply.json()["code"]), (404, "endpoint_disabled")
        )


class BrokenServerTests(LspTestCase):
    """A server that dies or never answers fails the question clearly and leaves nothing."""

    policy = lsp_policy(limits={"start_timeout_seconds": 2})

    def setUp(self) -> Any:
        self.bin = os.path.realpath(self.mktemp())
        os.makedirs(self.bin)
        path = os.environ.get("PATH", "")
        os.environ["PATH"] = self.bin + os.pathsep + path
        self.addCleanup(os.environ.__setitem__, "PATH", path)
        return super().setUp()

    def fake_server(self, script: str) -> None:
        exe = os.path.join(self.bin, "pylsp")
        with open(exe, "w") as f:
            f.write("#!/bin/sh\n" + script)
        os.chmod(exe, 0o755)

    @inlineCallbacks
    def test_server_that_exits(self) -> Any:
        """A server exiting at start is 502 upstream_unavailable naming its status and stderr."""
        self.fake_server("echo 'no module named foo' >&2\nexit 3\n")
        self.write("m.py", "x = 1\n")
        out = yield self.ask("diagnostics", 502, path="m.py")
        self.assertEqual(out["code"], "upstream_unavailable")
        self.assertIn("status 3", out["error"])
        self.assertIn("no module named foo", out["stderr"])

    @inlineCallbacks
    def test_server_that_never_answers(self) -> Any:
        """No answer to initialize within start_timeout_seconds: 504 timeout, its process gone."""
        self.fake_server("exec sleep 60\n")
        self.write("m.py", "x = 1\n")
        out = yield self.ask("diagnostics", 504, path="m.py")
        self.assertEqual(out["code"], "timeout")
        reply = yield self.request("GET", "/lsp/sessions")
        [session] = reply.json()["sessions"]
        self.assertEqual(session["state"], "failed")
        for _ in range(200):
            if not alive(session["pid"]):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(alive(session["pid"]))


class HungServerTests(LspTestCase):
    """A server that stops answering is replaced, not waited on for ever."""

    policy = lsp_policy(limits={"timeout_seconds": 2})

    @inlineCallbacks
    def test_hung_server_is_restarted(self) -> Any:
        """
        A stopped server: the first question is 504 saying it will be
        restarted and how to do it now; the second 504 says it was
        stopped, and its process is gone; the third is answered by a new
        server.
        """
        self.write("proj/pyproject.toml", "")
        self.write("proj/m.py", "def f():\n    pass\n")
        first = yield self.ask("symbols", path="proj/m.py")
        sid = first["session_id"]
        reply = yield self.request("GET", f"/lsp/sessions/{sid}")
        pid = reply.json()["pid"]
        os.kill(pid, signal.SIGSTOP)
        self.addCleanup(lambda: alive(pid) and os.kill(pid, signal.SIGKILL))
        out = yield self.ask("symbols", 504, path="proj/m.py")
        self.assertEqual(out["code"], "timeout")
        self.assertIn(f"DELETE /lsp/sessions/{sid}", out["error"])
        out = yield self.ask("symbols", 504, path="proj/m.py")
        self.assertIn("next question starts a new one", out["error"])
        for _ in range(100):
            if not alive(pid):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(alive(pid))
        again = yield self.ask("symbols", path="proj/m.py")
        self.assertNotEqual(again["session_id"], sid)
        self.assertEqual([s["name"] for s in again["symbols"]], ["f"])


class IdleTests(LspTestCase):
    """A server nobody asks is stopped."""

    policy = lsp_policy(limits={"idle_timeout_seconds": 1})

    @inlineCallbacks
    def test_idle_server_stopped(self) -> Any:
        """After idle_timeout_seconds without a question the session is gone and so is its process."""
        self.write("proj/pyproject.toml", "")
        self.write("proj/m.py", "x = 1\n")
        out = yield self.ask("symbols", path="proj/m.py")
        reply = yield self.request("GET", f"/lsp/sessions/{out['session_id']}")
        pid = reply.json()["pid"]
        # The sweep runs every half second; a stop is shutdown and exit,
        # then TERM after a second and KILL after the grace: room for all
        # of it on a loaded machine.
        for _ in range(200):
            reply = yield self.request("GET", "/lsp/sessions")
            if not reply.json()["sessions"] and not alive(pid):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertEqual(reply.json()["sessions"], [])
        self.assertFalse(alive(pid))


class IdentityTests(LspTestCase):
    """Two identities: each sees only its own servers and holds at most its share."""

    policy = {
        **lsp_policy(limits={"max_sessions": 2}),
        "auth": {
            "tokens": [
                {"id": "alice", "token_env": "ALICE", "scopes": ["lsp:use"]},
                {"id": "bob", "token_env": "BOB", "scopes": ["lsp:use"]},
            ]
        },
    }
    environ = {"ALICE": "alice-token", "BOB": "bob-token"}

    @inlineCallbacks
    def test_share_and_privacy(self) -> Any:
        """
        Alice's second server takes the place of her first, idle one (her
        share is one), and Bob still starts his; neither sees the other's.
        """
        for name in ("a", "b", "c"):
            self.write(f"{name}/pyproject.toml", "")
            self.write(f"{name}/m.py", "x = 1\n")

        def ask(token: str, path: str) -> Any:
            return self.request("POST", "/lsp/symbols", {"path": path}, token=token)

        first = yield ask("alice-token", "c/m.py")
        self.assertEqual(first.status, 200, first.body)
        second = yield ask("alice-token", "a/m.py")
        self.assertEqual(second.status, 200, second.body)
        bobs = yield ask("bob-token", "b/m.py")
        self.assertEqual(bobs.status, 200, bobs.body)
        listed = yield self.request("GET", "/lsp/sessions", token="alice-token")
        self.assertEqual(
            [s["id"] for s in listed.json()["sessions"]],
            [second.json()["session_id"]],
        )
        sid = second.json()["session_id"]
        seen = yield self.request("GET", f"/lsp/sessions/{sid}", token="bob-token")
        self.assertEqual(seen.status, 404)
        listed = yield self.request("GET", "/lsp/sessions", token="bob-token")
        self.assertEqual([s["owner"] for s in listed.json()["sessions"]], ["bob"])
        used = yield self.request(
            "POST",
            "/lsp/symbols",
            {"path": "a/m.py", "session_id": sid},
            token="bob-token",
        )
        self.assertEqual(used.status, 404)


class ManyDiagnosticsTests(LspTestCase):
    """A file with more problems than are kept."""

    @inlineCallbacks
    def test_kept_and_said(self) -> Any:
        """
        1,200 undefined names: 1,000 are given, truncated says so, and
        counts counts all 1,200.
        """
        self.write("proj/pyproject.toml", "")
        self.write("proj/many.py", "".join(f"print(name_{n})\n" for n in range(1200)))
        out = yield self.ask("diagnostics", path="proj/many.py")
        self.assertEqual((len(out["diagnostics"]), out["truncated"]), (1000, True))
        self.assertEqual(out["counts"]["error"], 1200)


class ConfinedServerTests(LspTestCase):
    """A language server under ``params.confine`` (it may run a project's code)."""

    policy = lsp_policy(params={"confine": True, "confine_write": ["."]})

    def setUp(self) -> Any:
        need_landlock()
        self.outside = os.path.realpath(self.mktemp())
        os.makedirs(self.outside)
        # A pylsp that writes on its own account first, then is pylsp.
        self.bin = os.path.realpath(self.mktemp())
        os.makedirs(self.bin)
        with open(os.path.join(self.bin, "pylsp"), "w") as f:
            f.write(
                "#!/bin/sh\n"
                f"echo x > {self.outside}/by-server 2>/dev/null\n"
                "echo i > by-server\n"
                f'exec {sys.executable} -m pylsp "$@"\n'
            )
        os.chmod(os.path.join(self.bin, "pylsp"), 0o755)
        path = os.environ.get("PATH", "")
        os.environ["PATH"] = self.bin + os.pathsep + path
        self.addCleanup(os.environ.__setitem__, "PATH", path)
        return super().setUp()

    @inlineCallbacks
    def test_server_confined(self) -> Any:
        """It still answers; what it wrote outside the base dir was refused."""
        self.write("m.py", "import os\nx = undefined_name\n")
        out = yield self.ask("diagnostics", path="m.py")
        self.assertIn("undefined_name", json.dumps(out))
        self.assertEqual(os.listdir(self.outside), [])
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "by-server")))


def fake_pylsp(case: Any, env: dict[str, str]) -> None:
    """
    Make the ``pylsp`` the daemon of ``case`` starts :mod:`tests.lsp.fake_server`
    with ``env`` (first on the PATH, for the rest of the test).
    """
    bin_dir = os.path.realpath(case.mktemp())
    os.makedirs(bin_dir)
    exe = os.path.join(bin_dir, "pylsp")
    server = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_server.py")
    settings = "".join(f"export {k}={v}\n" for k, v in env.items())
    with open(exe, "w") as f:
        f.write(f"#!/bin/sh\n{settings}exec {sys.executable} {server}\n")
    os.chmod(exe, 0o755)
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = bin_dir + os.pathsep + path
    case.addCleanup(os.environ.__setitem__, "PATH", path)


class FakeServerCase(LspTestCase):
    """
    A daemon whose ``pylsp`` is :mod:`tests.lsp.fake_server`, a server that
    behaves one exact way (set by environment variables the test gives).
    """

    fake_env: dict[str, str] = {}

    def setUp(self) -> Any:
        fake_pylsp(self, self.fake_env)
        return super().setUp()

    @inlineCallbacks
    def heard(self, path: str) -> Any:
        """What the fake server heard, as its hover on ``path`` says."""
        out = yield self.ask("hover", path=path, line=1, column=1)
        return json.loads(out["contents"])


class WatchedFilesTests(FakeServerCase):
    """The files a server reads but the daemon has not open change on disk too."""

    @inlineCallbacks
    def test_changes_on_disk_are_sent_as_watched_files(self) -> Any:
        """
        After a question, a file changed, one created and one deleted on
        disk (none of them open) reach the server that registered a
        ``**/*.py`` watcher as ``workspace/didChangeWatchedFiles``, a file
        its watcher does not match does not; the file asked about is sent
        again, so that its diagnostics are worked out anew.
        """
        self.write("proj/pyproject.toml", "")
        app = self.write("proj/app.py", "from lib import greet\n")
        lib = self.write("proj/lib.py", "def greet(): pass\n")
        old = self.write("proj/old.py", "x = 1\n")
        first = yield self.heard("proj/app.py")
        self.assertEqual(first["changes"], [])
        self.write("proj/lib.py", "def bye(): pass\n")
        new = self.write("proj/new.py", "y = 2\n")
        os.remove(old)
        self.write("proj/notes.txt", "not watched\n")
        second = yield self.heard("proj/app.py")
        self.assertEqual(
            sorted((c["uri"], c["type"]) for c in second["changes"]),
            sorted([(uri_of(lib), 2), (uri_of(new), 1), (uri_of(old), 3)]),
        )
        self.assertEqual(second["texts"][uri_of(app)], [1, 2])
        third = yield self.heard("proj/app.py")
        self.assertEqual(len(third["changes"]), 3)
        self.assertEqual(third["texts"][uri_of(app)], [1, 2])


class TruncatedDiagnosticsTests(FakeServerCase):
    """A file with more diagnostics than are kept, its errors after its warnings."""

    fake_env = {"FAKE_DIAGNOSTICS": "1200", "FAKE_WARNINGS_FIRST": "1100"}

    @inlineCallbacks
    def test_counts_are_of_every_diagnostic_and_errors_are_kept(self) -> Any:
        """
        1,100 warnings then 100 errors: ``counts`` says 100 errors and
        1,100 warnings, the 1,000 kept hold every error, ``truncated``.
        """
        self.write("proj/pyproject.toml", "")
        self.write("proj/w.py", "x = 1\n")
        out = yield self.ask("diagnostics", path="proj/w.py")
        self.assertEqual(
            out["counts"], {"error": 100, "warning": 1100, "information": 0, "hint": 0}
        )
        self.assertTrue(out["truncated"])
        severities = [d["severity"] for d in out["diagnostics"]]
        self.assertEqual((len(severities), severities.count("error")), (1000, 100))


class ColdRenameTests(FakeServerCase):
    """A rename asked of a server still reading its project."""

    fake_env = {"FAKE_COLD_RENAMES": "1"}

    @inlineCallbacks
    def test_first_rename_waits_for_a_young_server(self) -> Any:
        """
        A server that answers its first rename null, as pyright does while
        it indexes, is asked again: the first rename of a new session
        gives the edits, not 400 "found nothing to rename".
        """
        self.write("proj/pyproject.toml", "")
        self.write("proj/app.py", "greet = 1\n")
        out = yield self.ask(
            "rename", path="proj/app.py", line=1, column=1, new_name="hi", dry_run=True
        )
        [changed] = out["files"]
        self.assertIn("+higreet = 1", changed["diff"])
        self.assertFalse(out["applied"])


class OversizedDiagnosticsTests(FakeServerCase):
    """Diagnostics too large for one message, from a server that lives on."""

    policy = lsp_policy(limits={"max_message_bytes": 200_000})
    fake_env = {"FAKE_DIAGNOSTICS": "5000"}

    @inlineCallbacks
    def test_too_many_diagnostics_is_413_and_the_server_lives(self) -> Any:
        """
        A publish of over a MB (max_message_bytes 200 000) is 413 naming
        the file, twice, from the same session; a hover after it is
        answered by that session: the server was not killed.
        """
        self.write("proj/pyproject.toml", "")
        self.write("proj/many.py", "x = 1\n")
        first = yield self.ask("diagnostics", 413, path="proj/many.py")
        self.assertEqual(first["code"], "payload_too_large")
        self.assertIn("proj/many.py", first["error"])
        self.assertIn("max_message_bytes", first["setting"])
        again = yield self.ask("diagnostics", 413, path="proj/many.py")
        self.assertEqual(again["code"], "payload_too_large")
        heard = yield self.ask("hover", path="proj/many.py", line=1, column=1)
        reply = yield self.request("GET", "/lsp/sessions")
        [session] = reply.json()["sessions"]
        self.assertEqual(
            (session["state"], session["id"]), ("ready", heard["session_id"])
        )


class MessageHeadTests(SynchronousTestCase):
    """What the start of a message too large to read tells of it."""

    def test_heads(self) -> None:
        """
        An answer's id, a publish's method, uri and version, as far as the
        head goes; nothing from what does not start as an object.
        """
        cases = [
            (
                b'{"jsonrpc": "2.0", "id": 5, "result": [1, 2',
                {"jsonrpc": "2.0", "id": 5},
            ),
            (
                b'{"jsonrpc":"2.0","method":"textDocument/publishDiagnostics",'
                b'"params":{"uri":"file:///p/a.py","version":3,"diagnostics":[{"ra',
                {
                    "jsonrpc": "2.0",
                    "method": "textDocument/publishDiagnostics",
                    "params": {"uri": "file:///p/a.py", "version": 3},
                },
            ),
            (
                b'{"id": "a", "method": "workspace/applyEdit", "params": {"edit": {',
                {"id": "a", "method": "workspace/applyEdit", "params": {}},
            ),
            (b"[1, 2", {}),
            (b'{"id": 1\xff\xfe', {"id": 1}),
            (b'\xff{"id": 1', {}),
        ]
        for head, expected in cases:
            self.assertEqual(message_head(head), expected, head)


class WrongLanguageTests(LspTestCase):
    """A server named for a file of a language it does not handle."""

    @inlineCallbacks
    def test_named_server_of_another_language_is_400(self) -> Any:
        """
        pylsp named for a TypeScript file is 400 kind wrong_language before
        any server starts (it would say nothing, which reads as no errors).
        """
        self.write("proj/app.ts", "let x: number = 'a';\n")
        out = yield self.ask("diagnostics", 400, path="proj/app.ts", server="pylsp")
        self.assertEqual(
            (out["code"], out["kind"]), ("invalid_param", "wrong_language")
        )
        self.assertIn("typescript", out["error"])
        reply = yield self.request("GET", "/lsp/sessions")
        self.assertEqual(reply.json()["sessions"], [])


class CompletionOrderTests(FakeServerCase):
    """Completions as an editor shows them, ranked by what was typed."""

    @inlineCallbacks
    def test_what_was_typed_ranks_first(self) -> Any:
        """
        After ``os.wal`` the server's list, where ``walk`` comes last (after
        ``fwalk`` and ``waitid_result``), comes back with ``walk`` first and
        nothing left out.
        """
        self.write("proj/pyproject.toml", "")
        self.write("proj/c.py", "import os\nos.wal\n")
        out = yield self.ask("completions", path="proj/c.py", line=2, column=7)
        labels = [i["label"] for i in out["items"]]
        self.assertEqual(labels[0], "walk")
        self.assertEqual(len(labels), 6)
