# -*- test-case-name: tests.client.test_optional -*-
"""
The namespaces of the opt-in groups (``git``, ``code``, ``browser``,
``agents``) through the blocking client; each test skips, saying why,
when the tool behind it is missing.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import httpx

from sandboxd.client.errors import InvalidRequest, NotFound, Timeout
from tests.agents.test_agents import CATALOG
from tests.browser.test_browser import SKIP_REASON as BROWSER_SKIP
from tests.browser.test_browser import browser_start_room, serve_pages
from tests.client.base import ClientCase


class DevToolsTests(ClientCase):
    """``sandbox.git`` and ``sandbox.code`` with ``dev_tools`` on."""

    policy = {"groups": {"dev_tools": True}}

    def test_code_python_and_bash(self) -> Any:
        """``code.run`` runs python and bash snippets."""

        def body() -> None:
            sb = self.sandbox()
            result = sb.code.run("print(6 * 7)")
            self.assertEqual((result["stdout"], result["exit_code"]), ("42\n", 0))
            self.assertEqual(sb.code.run("echo $((1+1))", "bash")["stdout"], "2\n")

        return self.in_thread(body)

    def test_code_node(self) -> Any:
        """``code.run`` runs a node snippet."""
        if shutil.which("node") is None:
            self.skipTest("node is not installed")

        def body() -> None:
            result = self.sandbox().code.run("console.log(6 * 7)", "node")
            self.assertEqual(result["stdout"], "42\n")

        return self.in_thread(body)

    def test_git(self) -> Any:
        """``git.status`` and ``git.diff`` of a repository made in the base dir."""
        if shutil.which("git") is None:
            self.skipTest("git is not installed")

        def body() -> None:
            sb = self.sandbox()
            env = {
                "GIT_AUTHOR_NAME": "t",
                "GIT_AUTHOR_EMAIL": "t@example.invalid",
                "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@example.invalid",
            }
            sb.files.write_text("repo/a.txt", "one\n")
            script = "git init -q -b main && git add a.txt && git commit -qm init"
            done = sb.commands.run(script, cwd="repo", shell="sh", env=env)
            self.assertEqual(done.exit_code, 0, done.stderr)
            sb.files.write_text("repo/a.txt", "two\n")
            status = sb.git.status("repo")
            self.assertEqual(status["branch"], "main")
            self.assertEqual(
                [(f["path"], f["status"]) for f in status["files"]],
                [("a.txt", "modified")],
            )
            diff = sb.git.diff("repo")
            self.assertIn("+two", diff["diff"])
            self.assertEqual(diff["stats"]["files_changed"], 1)
            os.makedirs(self.path("not-a-repo"))
            with self.assertRaises(InvalidRequest):
                sb.git.status("not-a-repo")

        return self.in_thread(body)


class RunTimeoutTests(ClientCase):
    """
    How long ``code.run`` and ``commands.run`` wait: the daemon's limit for
    the child (the call's ``timeout``, else the policy's) plus a margin,
    whatever the client's own ``timeout``.
    """

    policy = {
        "groups": {"dev_tools": True},
        "endpoints": {
            "code_run": {"limits": {"timeout_seconds": 6}},
            "shell": {"limits": {"timeout_seconds": 1800}},
        },
    }

    def test_code_run_waits_for_the_daemon(self) -> Any:
        """
        With a client ``timeout`` of 1 s, a 2 s snippet succeeds, and one
        past the policy's 6 s raises the daemon's ``Timeout`` (not a
        client-side ``RequestTimeout`` with nothing) at about 6 s.
        """

        def body() -> None:
            sb = self.sandbox(timeout=1)
            done = sb.code.run("import time; time.sleep(2); print('slept')")
            self.assertEqual(done["stdout"], "slept\n")
            started = time.monotonic()
            with self.assertRaises(Timeout) as raised:
                sb.code.run("print('partial', flush=True)\nimport time; time.sleep(30)")
            self.assertEqual(raised.exception.status, 408)
            self.assertLess(time.monotonic() - started, 15)
            with self.assertRaises(Timeout):
                sb.code.run("import time; time.sleep(30)", timeout=2)

        return self.in_thread(body)

    def test_commands_run_waits_the_policy_limit(self) -> Any:
        """
        ``commands.run`` without ``timeout`` waits the policy's 1800 s
        (plus a margin) for the answer, read from ``capabilities`` once (was
        315 s, after which the daemon killed a longer command); with
        ``timeout`` it waits that, plus the margin; a timed-out command's
        error carries the output so far.
        """

        def body() -> None:
            reads: list[Any] = []
            urls: list[str] = []

            def seen(request: httpx.Request) -> None:
                urls.append(request.url.path)
                reads.append(request.extensions["timeout"]["read"])

            own = httpx.Client(event_hooks={"request": [seen]})
            self.addCleanup(own.close)
            sb = self.sandbox(timeout=2, http_client=own)
            self.assertEqual(sb.commands.run("sleep 3").exit_code, 0)
            self.assertEqual(sb.commands.run("true").exit_code, 0)
            with self.assertRaises(Timeout) as raised:
                sb.commands.run("sh -c 'echo partial; sleep 30'", timeout=1)
            self.assertEqual(raised.exception.body["stdout"], "partial\n")
            self.assertEqual(urls, ["/capabilities", "/shell", "/shell", "/shell"])
            self.assertEqual(reads[1:], [1815.0, 1815.0, 16.0])

        return self.in_thread(body)


class BrowserTests(ClientCase):
    """``sandbox.browser`` with the browser group on."""

    timeout = 120
    skip = BROWSER_SKIP
    policy = {"groups": {"browser": True}}

    def setUp(self) -> Any:
        browser_start_room(self)
        self.site = serve_pages(self)
        return super().setUp()

    def test_page(self) -> Any:
        """Navigate, read the content, evaluate, screenshot (a PNG)."""

        def body() -> None:
            sb = self.sandbox(timeout=90)
            page = sb.browser.navigate(self.site + "/")
            self.assertEqual(page["status"], 200)
            self.assertIn("<", sb.browser.content()["content"])
            self.assertEqual(sb.browser.evaluate("1 + 1"), 2)
            self.assertEqual(sb.browser.screenshot()[:8], b"\x89PNG\r\n\x1a\n")
            self.assertIsInstance(sb.browser.console(), list)

        return self.in_thread(body)


class AgentsTests(ClientCase):
    """``sandbox.agents`` against the SDK-built fake agent of the agents tests."""

    timeout = 90
    policy = {"groups": {"agents": True}, "agents": {"catalog": CATALOG}}

    def test_session(self) -> Any:
        """
        The catalogue lists the agent; a session answers a prompt; its
        event log is followed (and ends after ``session.closed``); the
        session is listed, read and closed.
        """

        def body() -> None:
            sb = self.sandbox(timeout=60)
            self.assertIn("fake", [a["id"] for a in sb.agents.catalog()])
            created = sb.agents.create("fake", title="client")
            sid = created["session_id"]
            turn = sb.agents.prompt(sid, "echo hello client", wait=20)
            self.assertEqual(turn["text"], "hello client")
            self.assertIn(sid, [s["session_id"] for s in sb.agents.sessions()])
            self.assertEqual(sb.agents.get(sid)["title"], "client")
            roles = [m["role"] for m in sb.agents.read(sid, "messages")["messages"]]
            self.assertEqual(roles, ["user", "agent"])
            self.assertEqual(sb.agents.requests(session_id=sid), [])
            with sb.agents.events(sid) as events:
                for event in events:
                    if event.event == "turn.ended":
                        break
            self.assertIsNotNone(event.id)
            sb.agents.close(sid)
            with self.assertRaises(NotFound):
                sb.agents.describe("no-such-agent")

        return self.in_thread(body)
