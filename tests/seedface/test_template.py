"""
A template written for the seed's server (``tests/seed/templates/commands.py``,
importing ``agent_sandbox.server``) loads unchanged with ``--commands`` on
a real daemon: its commands are listed and run, its routes answer with the
seed's request shape, and check-config warns about its scope-less routes.
The seed's real package is installed in this environment, so this also
shows the face wins inside the daemon without breaking it outside.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from tests.helpers import alive
from tests.test_cli import BIN, ROOT, DaemonProcess, serve_argv

TEMPLATE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "seed",
    "templates",
    "commands.py",
)
TOKENS = {"T_ADMIN": "admin-token", "T_CI": "ci-token", "T_READER": "reader-token"}
POLICY = {
    "version": 1,
    "description": "release desk",
    "auth": {
        "tokens": [
            {"id": "admin", "token_env": "T_ADMIN", "scopes": ["*"]},
            {
                "id": "ci",
                "token_env": "T_CI",
                "scopes": ["commands:list", "commands:run"],
            },
            {"id": "reader", "token_env": "T_READER", "scopes": ["files:read"]},
        ]
    },
}


class TemplateTests(SynchronousTestCase):
    """The seed template, served by sandboxd."""

    def setUp(self) -> None:
        policy = os.path.abspath(self.mktemp())
        with open(policy, "w") as f:
            json.dump(POLICY, f)
        self.policy = policy
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        self.daemon = DaemonProcess(
            self,
            serve_argv(base, "--policy", policy, "--commands", TEMPLATE),
            env=TOKENS,
        )
        self.daemon.wait_healthy()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = "admin-token",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.daemon.port}{path}",
            data=data,
            method=method,
            headers=headers or {},
        )
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def json_call(self, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        status, raw = self.call(*args, **kwargs)
        return status, json.loads(raw)

    def test_commands_listed(self) -> None:
        """GET /commands lists the visible commands with the seed's arg types."""
        status, body = self.json_call("GET", "/commands", token="ci-token")
        self.assertEqual(status, 200)
        listed = {c["name"]: c for c in body["commands"]}
        # deploy needs myapp:deploy, which ci lacks; rotate_keys is hidden.
        self.assertEqual(sorted(listed), ["count_words", "greet", "tally"])
        words = listed["count_words"]["args"][0]
        self.assertEqual((words["name"], words["type"]), ("words", "string_array"))
        status, body = self.json_call("GET", "/commands")
        self.assertEqual(
            sorted(c["name"] for c in body["commands"]),
            ["count_words", "deploy", "greet", "tally"],
        )

    def test_commands_run(self) -> None:
        """Inferred and declared arguments arrive typed, defaults included."""
        self.assertEqual(
            self.json_call("POST", "/commands/greet", {"name": "Ada", "shout": "yes"}),
            (200, {"result": "HELLO, ADA!"}),
        )
        self.assertEqual(
            self.json_call(
                "POST",
                "/commands/count_words",
                {"words": ["a", "bb", "ccc"], "min_length": 2},
            ),
            (200, {"result": {"count": 2, "kept": ["bb", "ccc"]}}),
        )
        self.assertEqual(
            self.json_call("POST", "/commands/deploy", {"env": "prod"}),
            (
                200,
                {
                    "result": {
                        "env": "prod",
                        "tags": ["latest"],
                        "replicas": 2,
                        "dry_run": False,
                    }
                },
            ),
        )
        self.assertEqual(
            self.json_call("POST", "/commands/rotate_keys", {}),
            (200, {"result": "rotated"}),
        )
        # Registered with the client SDK's @sandbox.register.
        self.assertEqual(
            self.json_call("POST", "/commands/tally", {"items": ["a", "b", "c"]}),
            (200, {"result": 6}),
        )

    def test_string_array_refuses_a_string(self) -> None:
        """A string where a string_array is declared is a 400, as on the seed."""
        status, body = self.json_call("POST", "/commands/count_words", {"words": "a b"})
        self.assertEqual(status, 400)
        self.assertIn("words", body["error"])

    def test_command_scope(self) -> None:
        """A command's own scope (myapp:deploy) is required to run it."""
        status, body = self.json_call(
            "POST", "/commands/deploy", {"env": "prod"}, token="ci-token"
        )
        self.assertEqual((status, body["code"]), (403, "missing_scope"))

    def test_route_query_is_lists(self) -> None:
        """
        A custom route sees query values as lists, no body on a GET, and
        headers by the name it spells.
        """
        self.assertEqual(
            self.json_call(
                "GET", "/release/status?verbose=1", headers={"X-Release": "v2"}
            ),
            (
                200,
                {
                    "ready": True,
                    "query": {"verbose": ["1"]},
                    "has_body": False,
                    "release": "v2",
                    "detail": "all checks passed",
                },
            ),
        )

    def test_route_without_scopes_needs_authentication(self) -> None:
        """
        A route registered with no scopes needs a valid token and nothing
        more, as on the seed.
        """
        status, _ = self.json_call("GET", "/release/status", token="reader-token")
        self.assertEqual(status, 200)
        status, body = self.json_call("GET", "/release/status", token=None)
        self.assertEqual((status, body["code"]), (401, "unauthorized"))

    def test_route_with_custom_scope(self) -> None:
        """A route's custom scope is required; its error keeps the seed's type."""
        status, body = self.json_call(
            "POST", "/release/notes", {"text": "v2"}, token="ci-token"
        )
        self.assertEqual((status, body["code"]), (403, "missing_scope"))
        self.assertEqual(
            self.json_call("POST", "/release/notes", {"text": "v2"}),
            (200, {"saved": "v2", "by": "/release/notes"}),
        )
        self.assertEqual(
            self.json_call("POST", "/release/notes", {}),
            (400, {"error": "'text' is required", "type": "ValueError"}),
        )

    def test_stream_route(self) -> None:
        """A blocking generator of pre-formatted frames streams as written."""
        status, raw = self.call("GET", "/release/ticks?n=2")
        self.assertEqual(status, 200)
        self.assertEqual(
            raw.decode(),
            'data: {"tick": 0}\n\ndata: {"tick": 1}\n\nevent: end\ndata: {}\n\n',
        )

    def test_path_params_as_written(self) -> None:
        """
        A route's path parameter arrives as the request wrote it, escapes
        and all, as on the seed, whose templates unquote it themselves
        (was: decoded, so such a template decoded it twice).
        """
        for written in ("it%20em", "a%2520b", "plain"):
            self.assertEqual(
                self.json_call("GET", f"/release/items/{written}"),
                (200, {"item": written}),
            )

    def test_route_answer_not_json(self) -> None:
        """
        A route answering with a datetime and a Path sends their text, as
        the seed's server does (was: 500 TypeError).
        """
        self.assertEqual(
            self.json_call("GET", "/release/when"),
            (200, {"when": "2020-01-01 00:00:00", "where": "/tmp"}),
        )

    def test_stream_closed_when_client_goes(self) -> None:
        """
        When the client of a template's event stream hangs up, the
        template's generator is closed, so its ``finally`` ends the child it
        streams from, as on the seed (was: left open, the child alive until
        the garbage collector came by, minutes later on an idle daemon).
        """
        connection = http.client.HTTPConnection("127.0.0.1", self.daemon.port, 10)
        connection.request(
            "GET", "/release/follow", headers={"Authorization": "Bearer admin-token"}
        )
        response = connection.getresponse()
        self.assertEqual(response.status, 200)
        line = response.readline()
        pid = json.loads(line.decode().removeprefix("data: "))["pid"]
        self.assertTrue(alive(pid))
        response.close()
        connection.close()
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(alive(pid), "the route's child outlived its client")

    def test_check_config_warns(self) -> None:
        """check-config loads the template and names its scope-less routes."""
        done = subprocess.run(
            [
                os.path.join(BIN, "sandboxd"),
                "check-config",
                "--policy",
                self.policy,
                "--commands",
                TEMPLATE,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **TOKENS},
            timeout=60,
        )
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("'GET /release/status' requires no scope", done.stdout)
        self.assertNotIn("release_notes' requires no scope", done.stdout)


#: A base template, and a derived one given after it that customises one
#: of its commands (the seed's registry keeps the last registration).
BASE_TEMPLATE = """
from agent_sandbox.server import command


@command("build", description="base build")
def build() -> str:
    return "base build"


@command("test")
def test() -> str:
    return "base test"
"""
OVERRIDE_TEMPLATE = """
from agent_sandbox.server import command


@command("build", description="custom build")
def build() -> str:
    return "custom build"
"""
BROKEN_TEMPLATE = """
from agent_sandbox.server import command

SETTINGS = {}
LEVEL = SETTINGS["level"]
"""


class LayeredTemplateTests(SynchronousTestCase):
    """Templates layered with repeated ``--commands``, and one that fails."""

    def write(self, name: str, text: str) -> str:
        """A template file ``name`` in a directory of this test's own."""
        folder = os.path.abspath(self.mktemp())
        os.makedirs(folder)
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_last_registration_wins(self) -> None:
        """
        A command registered again by a later template replaces the
        earlier one, as on the seed (the start no longer fails), and the
        log says so in one line naming both files; the other commands of
        the base template stay.
        """
        base_dir = os.path.abspath(self.mktemp())
        os.makedirs(base_dir)
        base = self.write("layer_base.py", BASE_TEMPLATE)
        override = self.write("layer_override.py", OVERRIDE_TEMPLATE)
        daemon = DaemonProcess(
            self, serve_argv(base_dir, "--commands", base, "--commands", override)
        )
        daemon.wait_healthy()
        results = {}
        for name in ("build", "test"):
            request = urllib.request.Request(
                f"http://127.0.0.1:{daemon.port}/commands/{name}",
                data=b"{}",
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                results[name] = json.loads(response.read())
        self.assertEqual(
            results,
            {"build": {"result": "custom build"}, "test": {"result": "base test"}},
        )
        lines = [line for line in daemon.output().splitlines() if "replaces" in line]
        self.assertEqual(len(lines), 1, daemon.output())
        self.assertIn(f"command 'build' from {override}:5", lines[0])
        self.assertIn(f"replaces the one from {base}:5", lines[0])

    def test_import_error_is_one_line(self) -> None:
        """
        A template that fails to import stops ``serve`` and ``check-config``
        (non-zero) with one line naming the template, the error and its
        line, not a traceback through the daemon's start-up.
        """
        base_dir = os.path.abspath(self.mktemp())
        os.makedirs(base_dir)
        broken = self.write("layer_broken.py", BROKEN_TEMPLATE)
        expected = f"--commands {broken}: KeyError: 'level' (at {broken}:5)"
        for argv in (
            serve_argv(base_dir, "--commands", broken),
            [os.path.join(BIN, "sandboxd"), "check-config", "--commands", broken],
        ):
            done = subprocess.run(
                [a.format(port=0, pty=0) for a in argv],
                capture_output=True,
                text=True,
                cwd=ROOT,
                timeout=60,
            )
            output = (done.stdout + done.stderr).strip()
            self.assertNotEqual(done.returncode, 0, output)
            self.assertNotIn("Traceback", output)
            self.assertEqual(len(output.splitlines()), 1, output)
            self.assertIn(expected, output)
