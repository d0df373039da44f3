"""
POST /code/run (SPEC §7.7) against a real daemon: real python, bash and
node children, their limits and the process rules of §7.4.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater

from tests.helpers import DaemonTestCase, alive

DEV_TOOLS = {"groups": {"dev_tools": True}}


class CodeRunTests(DaemonTestCase):
    """Snippets run as children with the caller's cwd, env and timeout."""

    policy = {
        **DEV_TOOLS,
        "endpoints": {"code_run": {"params": {"env_deny": ["HIDDEN_VAR"]}}},
    }

    @inlineCallbacks
    def test_python(self) -> Any:
        """Python's stdout, stderr and exit code come back with the timing."""
        code = "import sys\nprint('out', 6 * 7)\nprint('err', file=sys.stderr)\nsys.exit(3)\n"
        reply = yield self.request(
            "POST", "/code/run", {"language": "python", "code": code}
        )
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertEqual(body["stdout"], "out 42\n")
        self.assertEqual(body["stderr"], "err\n")
        self.assertEqual(body["exit_code"], 3)
        self.assertEqual(body["language"], "python")
        self.assertIsInstance(body["execution_time_ms"], float)

    @inlineCallbacks
    def test_language_defaults_to_python(self) -> Any:
        """Without ``language`` the code runs as Python; a language is read in any case."""
        reply = yield self.request("POST", "/code/run", {"code": "print(6 * 7)"})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            (reply.json()["stdout"], reply.json()["language"]), ("42\n", "python")
        )
        reply = yield self.request(
            "POST", "/code/run", {"language": "ruby", "code": "p 1"}
        )
        self.assertIn("Unsupported language 'ruby'", reply.json()["error"])
        reply = yield self.request(
            "POST", "/code/run", {"language": "Bash", "code": "echo hi"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            (reply.json()["stdout"], reply.json()["language"]), ("hi\n", "bash")
        )

    @inlineCallbacks
    def test_bash_cwd_and_env(self) -> Any:
        """bash runs in the guarded cwd with the request's env; secrets and env_deny are gone."""
        os.mkdir(os.path.join(self.base_dir, "work"))
        code = 'pwd; echo "$GREETING"; echo "[$ABX_SERVER_TOKEN][$HIDDEN_VAR]"'
        reply = yield self.request(
            "POST",
            "/code/run",
            {
                "language": "bash",
                "code": code,
                "cwd": "work",
                "env": {
                    "GREETING": "hello",
                    "ABX_SERVER_TOKEN": "t",
                    "HIDDEN_VAR": "h",
                },
            },
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            reply.json()["stdout"],
            f"{os.path.join(self.base_dir, 'work')}\nhello\n[][]\n",
        )

    @inlineCallbacks
    def test_python_imports_from_cwd(self) -> Any:
        """As with ``python -c``, modules beside the cwd import."""
        with open(os.path.join(self.base_dir, "helper.py"), "w") as f:
            f.write("VALUE = 'from helper'\n")
        reply = yield self.request(
            "POST",
            "/code/run",
            {"language": "python", "code": "import helper; print(helper.VALUE)"},
        )
        self.assertEqual(reply.json()["stdout"], "from helper\n")

    @inlineCallbacks
    def test_node(self) -> Any:
        """node runs JavaScript."""
        if shutil.which("node") is None:
            raise self.skipTest("node is not installed")
        reply = yield self.request(
            "POST",
            "/code/run",
            {
                "language": "node",
                "code": "console.log([1, 2].map(x => x * 2).join(','))",
            },
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stdout"], "2,4\n")
        self.assertEqual(reply.json()["exit_code"], 0)

    @inlineCallbacks
    def test_timeout_kills_the_tree(self) -> Any:
        """Past its timeout the run is 408 TimeoutError and its background grandchild is gone too."""
        pidfile = os.path.join(self.base_dir, "bg.pid")
        code = f"sleep 60 & echo $! > {pidfile}; sleep 60"
        reply = yield self.request(
            "POST", "/code/run", {"language": "bash", "code": code, "timeout": 0.5}
        )
        self.assertEqual(reply.status, 408, reply.body)
        self.assertEqual(reply.json()["type"], "TimeoutError")
        self.assertEqual(reply.json()["code"], "timeout")
        with open(pidfile) as f:
            pid = int(f.read())
        for _ in range(50):
            if not alive(pid):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(alive(pid))

    @inlineCallbacks
    def test_timeout_keeps_what_was_printed(self) -> Any:
        """
        A run stopped at its timeout answers 408 with what it printed on
        stdout and stderr before it hung, as /shell does.
        """
        code = (
            "import sys, time\n"
            "print('step 1 done', flush=True)\n"
            "print('waiting on the lock', file=sys.stderr, flush=True)\n"
            "time.sleep(60)\n"
        )
        reply = yield self.request("POST", "/code/run", {"code": code, "timeout": 2})
        self.assertEqual(reply.status, 408, reply.body)
        body = reply.json()
        self.assertEqual(body["code"], "timeout")
        self.assertEqual(body["stdout"], "step 1 done\n")
        self.assertEqual(body["stderr"], "waiting on the lock\n")

    @inlineCallbacks
    def test_idle_timeout_is_idle_timeout(self) -> Any:
        """A run silent for ``idle_timeout`` is 408 TimeoutError with code idle_timeout (SPEC §6)."""
        reply = yield self.request(
            "POST",
            "/code/run",
            {"language": "bash", "code": "sleep 30", "idle_timeout": 0.3},
        )
        self.assertEqual(reply.status, 408, reply.body)
        self.assertEqual(
            (reply.json()["type"], reply.json()["code"]),
            ("TimeoutError", "idle_timeout"),
        )

    @inlineCallbacks
    def test_missing_runtime(self) -> Any:
        """A runtime not on the child's PATH is 500 FileNotFoundError."""
        reply = yield self.request(
            "POST",
            "/code/run",
            {"language": "python", "code": "print(1)", "env": {"PATH": "/nonexistent"}},
        )
        self.assertEqual(reply.status, 500, reply.body)
        self.assertEqual(reply.json()["type"], "FileNotFoundError")

    @inlineCallbacks
    def test_bad_requests(self) -> Any:
        """Unknown language, missing code, bad timeout and a cwd outside the boundary are refused."""
        cases = [
            ({"language": "ruby", "code": "p 1"}, 400, "invalid_param"),
            ({"language": "", "code": "p 1"}, 400, "invalid_param"),
            ({"language": 3, "code": "p 1"}, 400, "invalid_param"),
            ({"language": "python"}, 400, "invalid_param"),
            (
                {"language": "python", "code": "1", "timeout": "soon"},
                400,
                "invalid_param",
            ),
            (
                {"language": "python", "code": "1", "cwd": "/etc"},
                403,
                "path_not_allowed",
            ),
            (
                {"language": "python", "code": "1", "env": {"A=B": "x"}},
                400,
                "invalid_param",
            ),
        ]
        for body, status, code in cases:
            reply = yield self.request("POST", "/code/run", body)
            self.assertEqual(reply.status, status, (body, reply.body))
            self.assertEqual(reply.json()["code"], code, body)


class LanguagePolicyTests(DaemonTestCase):
    """``params.languages`` limits which runtimes a caller may use."""

    policy = {
        **DEV_TOOLS,
        "endpoints": {"code_run": {"params": {"languages": ["python"]}}},
    }

    @inlineCallbacks
    def test_language_not_allowed(self) -> Any:
        """bash outside the list is 403 language_not_allowed naming the rule; python runs."""
        reply = yield self.request(
            "POST", "/code/run", {"language": "bash", "code": "echo hi"}
        )
        self.assertEqual(reply.status, 403)
        body = reply.json()
        self.assertEqual(body["code"], "language_not_allowed")
        self.assertEqual(body["rule"], "policy:endpoints.code_run")
        reply = yield self.request(
            "POST", "/code/run", {"language": "python", "code": "print('ok')"}
        )
        self.assertEqual(reply.json()["stdout"], "ok\n")


class DisabledTests(DaemonTestCase):
    """dev_tools is opt-in."""

    @inlineCallbacks
    def test_off_by_default(self) -> Any:
        """Without the group, /code/run is 404 endpoint_disabled."""
        reply = yield self.request(
            "POST", "/code/run", {"language": "python", "code": "1"}
        )
        self.assertEqual(reply.status, 404)
        self.assertEqual(reply.json()["code"], "endpoint_disabled")
