"""
The built-in kernel ``sandboxd-python`` (stdlib only) through the same
API: the scenarios every kernel shares (state, values, errors, figures,
``input()``, interrupts: :class:`~tests.kernels.test_contexts.KernelScenarios`),
a subprocess's output, and the default where no ipykernel can run.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.trial.unittest import SkipTest

from sandboxd.kernels import kernelspecs
from tests.kernels.test_contexts import KERNEL_START, CodeTestCase, KernelScenarios


class BuiltinScenarios(KernelScenarios, CodeTestCase):
    """The shared scenarios on ``sandboxd-python``."""

    kernel = "sandboxd-python"

    def setUp(self) -> Any:
        # No ipykernel needed: skip CodeTestCase's check.
        return super(CodeTestCase, self).setUp()


class BuiltinKernelTests(CodeTestCase):
    """What only the built-in kernel does."""

    def setUp(self) -> Any:
        # No ipykernel needed: skip CodeTestCase's check.
        return super(CodeTestCase, self).setUp()

    @inlineCallbacks
    def test_subprocess_output(self) -> Any:
        """A subprocess's output is the execution's stdout too."""
        ctx = yield self.context(kernel="sandboxd-python")
        sub = yield self.execute(
            ctx["id"],
            "import subprocess\nsubprocess.run(['echo', 'from a child'])\nNone",
        )
        self.assertEqual(sub["stdout"], "from a child\n")

    @inlineCallbacks
    def test_output_between_cells_kept(self) -> Any:
        """
        What a subprocess a cell left behind prints while no execution
        runs is not lost: the next execution starts with it, after a stderr
        line saying where it came from (was: dropped).
        """
        ctx = yield self.context(kernel="sandboxd-python")
        first = yield self.execute(
            ctx["id"],
            "import subprocess\n"
            "subprocess.Popen('sleep 0.5; echo late; echo late-err >&2', shell=True)\n"
            "None",
        )
        self.assertEqual(first["stdout"], "")
        yield deferLater(reactor, 2, lambda: None)
        second = yield self.execute(ctx["id"], "print('own')")
        self.assertEqual(second["stdout"], "late\nown\n")
        self.assertIn("printed while no execution ran", second["stderr"])
        self.assertTrue(second["stderr"].endswith("late-err\n"), second["stderr"])

    @inlineCallbacks
    def test_traceback_names_the_execution(self) -> Any:
        """
        A traceback names the cell by its ``execution_count``, however many
        executions before it set their own env (the daemon's own silent
        cells, which are not counted).
        """
        ctx = yield self.context(kernel="sandboxd-python")
        for _ in range(3):
            yield self.execute(ctx["id"], "x = 1", env={"GREETING": "hi"})
        failed = yield self.execute(ctx["id"], "def f():\n    1/0\nf()")
        count = failed["execution_count"]
        self.assertEqual(count, 4)
        trace = "\n".join(failed["error"]["traceback"])
        self.assertIn(f'File "<cell-{count}>", line 3', trace)
        self.assertIn(f'File "<cell-{count}>", line 2, in f', trace)
        self.assertIn("    1/0", trace)

    @inlineCallbacks
    def test_output_before_value_and_error(self) -> Any:
        """What a cell prints is logged before its value, and before its error, as Jupyter orders them."""
        ctx = yield self.context(kernel="sandboxd-python")
        orders = []
        # No newline: the text waits in the line buffer until the cell ends.
        for code in ("print('seen', end=''); 6 * 7", "print('before', end=''); 1/0"):
            ran = yield self.execute(ctx["id"], code)
            page = yield self.request("GET", ran["events_url"] + "?follow=false")
            orders.append(
                [
                    e["event"]
                    for e in page.json()["events"]
                    if e["event"] in ("stdout", "display", "error")
                ]
            )
        self.assertEqual(orders, [["stdout", "display"], ["stdout", "error"]])

    @inlineCallbacks
    def test_default_without_jupyter(self) -> Any:
        """Where the hub cannot run, a context with no kernel named is ``sandboxd-python``."""
        self.patch(kernelspecs, "jupyter_usable", lambda: False)
        listed = yield self.request("GET", "/code/kernels")
        self.assertEqual(
            [k["name"] for k in listed.json()["kernels"]],
            ["sandboxd-bash", "sandboxd-python"],
        )
        self.assertEqual(listed.json()["default"], "sandboxd-python")
        ctx = yield self.context()
        self.assertEqual(ctx["kernel"], "sandboxd-python")
        result = yield self.execute(ctx["id"], "1 + 1")
        self.assertEqual(result["results"][0]["data"]["text/plain"], "2")


class LinkOwnerTests(CodeTestCase):
    """A capability link acts for its minter's contexts, and no one else's."""

    policy = {
        "groups": {"code": True},
        **KERNEL_START,
        "auth": {
            "tokens": [
                {
                    "id": "agent",
                    "token_env": "AGENT",
                    "scopes": ["code:read", "code:run", "code:manage", "links:mint"],
                },
                {
                    "id": "other",
                    "token_env": "OTHER",
                    "scopes": ["code:read", "links:mint"],
                },
            ]
        },
    }
    environ = {"AGENT": "agent-token", "OTHER": "other-token"}
    token = "agent-token"

    def setUp(self) -> Any:
        # The built-in kernel: no ipykernel needed.
        return super(CodeTestCase, self).setUp()

    @inlineCallbacks
    def link(self, token: str) -> Any:
        """A ``code:read`` console link minted by ``token``'s identity."""
        reply = yield self.daemon.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["code:read"]},
            token=token,
        )
        self.assertEqual(reply.status, 201, reply.body)
        return reply.json()["token"]

    @inlineCallbacks
    def test_minters_link_sees_contexts(self) -> Any:
        """
        A link the agent minted lists the agent's context and reads its
        executions (a person watching in the console); a link another
        identity minted gets 404, as if it did not exist.
        """
        ctx = yield self.context(kernel="sandboxd-python")
        ran = yield self.execute(ctx["id"], "6 * 7")
        mine = yield self.link("agent-token")
        theirs = yield self.link("other-token")
        listed = yield self.daemon.request("GET", "/code/contexts", token=mine)
        self.assertEqual([c["id"] for c in listed.json()["contexts"]], [ctx["id"]])
        got = yield self.daemon.request(
            "GET",
            f"/code/contexts/{ctx['id']}/executions/{ran['execution_id']}",
            token=mine,
        )
        self.assertEqual(got.json()["results"][0]["data"]["text/plain"], "42")
        listed = yield self.daemon.request("GET", "/code/contexts", token=theirs)
        self.assertEqual(listed.json()["contexts"], [])
        refused = yield self.daemon.request(
            "GET", f"/code/contexts/{ctx['id']}", token=theirs
        )
        self.assertEqual(refused.status, 404)
        self.assertEqual(refused.json()["code"], "not_found")


class BashKernelTests(CodeTestCase):
    """
    ``sandboxd-bash``: one shell per context, whose directory, variables
    and functions carry from one execution to the next.
    """

    def setUp(self) -> Any:
        if shutil.which("bash") is None:
            raise SkipTest("bash is not installed")
        # No ipykernel needed: skip CodeTestCase's check.
        return super(CodeTestCase, self).setUp()

    @inlineCallbacks
    def test_background_job_output_kept(self) -> Any:
        """
        What a background job prints after its cell ended (a server's
        start-up line, its error) comes at the start of the next
        execution, said as such (was: lost).
        """
        ctx = yield self.context(kernel="sandboxd-bash")
        first = yield self.execute(
            ctx["id"], "(sleep 0.5; echo bg-late; echo bg-err >&2) &\necho started"
        )
        self.assertEqual(first["stdout"], "started\n")
        yield deferLater(reactor, 2, lambda: None)
        second = yield self.execute(ctx["id"], "echo third")
        self.assertEqual(second["stdout"], "bg-late\nthird\n")
        self.assertIn("printed while no execution ran", second["stderr"])
        self.assertTrue(second["stderr"].endswith("bg-err\n"), second["stderr"])

    @inlineCallbacks
    def test_state_carries(self) -> Any:
        """
        ``cd``, a variable and a function set in one execution are there in
        the next; stdout and stderr are the execution's; a cell's stdin is
        empty (``cat`` ends at once).
        """
        os.mkdir(os.path.join(self.base_dir, "sub"))
        ctx = yield self.context(language="bash")
        self.assertEqual(ctx["kernel"], "sandboxd-bash")
        first = yield self.execute(
            ctx["id"],
            'cd sub; GREETING=hello; greet() { echo "$GREETING $1"; }\n'
            "echo to-err >&2; cat",
        )
        self.assertEqual((first["state"], first["stderr"]), ("ok", "to-err\n"))
        second = yield self.execute(ctx["id"], "pwd; greet ada")
        self.assertEqual(
            second["stdout"], os.path.join(self.base_dir, "sub") + "\nhello ada\n"
        )

    @inlineCallbacks
    def test_exit_status_and_syntax_error(self) -> Any:
        """
        A cell whose last command fails is an error with its status; a
        syntax error ends that cell only, with bash's message on stderr.
        """
        ctx = yield self.context(kernel="sandboxd-bash")
        failed = yield self.execute(ctx["id"], "KEPT=1; (exit 3)")
        self.assertEqual(failed["state"], "error")
        self.assertEqual(
            (failed["error"]["ename"], failed["error"]["evalue"]), ("ExitCode", "3")
        )
        broken = yield self.execute(ctx["id"], "echo 'unterminated")
        self.assertEqual(broken["state"], "error")
        self.assertIn("unexpected EOF", broken["stderr"])
        after = yield self.execute(ctx["id"], "echo $KEPT")
        self.assertEqual((after["state"], after["stdout"]), ("ok", "1\n"))

    @inlineCallbacks
    def test_interrupt_keeps_the_shell(self) -> Any:
        """
        Interrupting a loop of sleeps ends the whole cell (not just the
        sleep running), ``interrupted``; the shell's variables survive.
        """
        ctx = yield self.context(kernel="sandboxd-bash")
        yield self.execute(ctx["id"], "KEPT=7")
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {"code": "for i in 1 2 3; do sleep 5; echo late $i; done", "wait": 0},
        )
        xid = reply.json()["execution_id"]
        yield deferLater(reactor, 0.5, lambda: None)
        yield self.request("POST", f"/code/contexts/{ctx['id']}/interrupt", {})
        got = yield self.request(
            "GET", f"/code/contexts/{ctx['id']}/executions/{xid}?wait=10"
        )
        self.assertEqual(got.json()["state"], "interrupted")
        self.assertEqual(got.json()["stdout"], "")
        after = yield self.execute(ctx["id"], "echo $KEPT")
        self.assertEqual(after["stdout"], "7\n")

    @inlineCallbacks
    def test_exit_starts_a_new_shell(self) -> Any:
        """
        ``exit`` in a cell is that cell's error (``ShellExited``, saying the
        state is new); the next cell runs in a new shell at once.
        """
        ctx = yield self.context(kernel="sandboxd-bash")
        yield self.execute(ctx["id"], "KEPT=7")
        ended = yield self.execute(ctx["id"], "echo bye; exit 4")
        self.assertEqual((ended["state"], ended["stdout"]), ("error", "bye\n"))
        self.assertEqual(ended["error"]["ename"], "ShellExited")
        self.assertIn("status 4", ended["error"]["evalue"])
        after = yield self.execute(ctx["id"], 'echo "[$KEPT]"')
        self.assertEqual((after["state"], after["stdout"]), ("ok", "[]\n"))
