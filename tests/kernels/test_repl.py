"""
The built-in kernel ``sandboxd-python`` (stdlib only) through the same
API: state, output (a subprocess's too), values, errors, figures,
``input()``, interrupts, and the default where no ipykernel can run.
"""

from __future__ import annotations

import base64
import os
import sys
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.trial.unittest import SkipTest

from sandboxd.kernels import kernelspecs
from tests.helpers import alive
from tests.kernels.test_contexts import CodeTestCase


class BuiltinKernelTests(CodeTestCase):
    """A context of ``sandboxd-python``."""

    def setUp(self) -> Any:
        # No ipykernel needed: skip CodeTestCase's check.
        return super(CodeTestCase, self).setUp()

    @inlineCallbacks
    def test_state_output_values_errors(self) -> Any:
        """Names kept, prints and a subprocess's output streamed, the last value shown, errors named."""
        ctx = yield self.context(kernel="sandboxd-python")
        self.assertEqual(ctx["kernel"], "sandboxd-python")
        first = yield self.execute(ctx["id"], "x = 20\nprint('hi')")
        self.assertEqual((first["state"], first["stdout"]), ("ok", "hi\n"))
        second = yield self.execute(ctx["id"], "x * 2 + 2")
        self.assertEqual(second["results"][0]["data"]["text/plain"], "42")
        self.assertTrue(second["results"][0]["is_result"])
        self.assertEqual(second["execution_count"], 2)
        sub = yield self.execute(
            ctx["id"],
            "import subprocess\nsubprocess.run(['echo', 'from a child'])\nNone",
        )
        self.assertEqual(sub["stdout"], "from a child\n")
        err = yield self.execute(
            ctx["id"], "import sys\nprint('e', file=sys.stderr)\n1/0"
        )
        self.assertEqual(err["state"], "error")
        self.assertEqual(err["stderr"], "e\n")
        self.assertEqual(err["error"]["ename"], "ZeroDivisionError")
        self.assertTrue(any("1/0" in line for line in err["error"]["traceback"]))

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
    def test_matplotlib_figure(self) -> Any:
        """An open matplotlib figure comes back as PNG (the Agg backend)."""
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SkipTest("matplotlib is not installed") from None
        # The kernel runs the python3 of its own PATH: this venv's.
        path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        ctx = yield self.context(kernel="sandboxd-python", env={"PATH": path})
        result = yield self.execute(
            ctx["id"], "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"
        )
        self.assertEqual(result["state"], "ok", result)
        pngs = [
            r["data"]["image/png"]
            for r in result["results"]
            if "image/png" in r["data"]
        ]
        self.assertEqual(len(pngs), 1)
        self.assertTrue(base64.b64decode(pngs[0]).startswith(b"\x89PNG"))

    @inlineCallbacks
    def test_input(self) -> Any:
        """input() asks (``input.requested``) and takes the answer; refused without allow_stdin."""
        ctx = yield self.context(kernel="sandboxd-python")
        refused = yield self.execute(ctx["id"], "input('name? ')")
        self.assertEqual(refused["state"], "error")
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {
                "code": "answer = input('name? ')\nprint('hello', answer)",
                "allow_stdin": True,
                "wait": 0,
            },
        )
        xid = reply.json()["execution_id"]
        reader = yield self.stream(reply.json()["events_url"])
        yield reader.wait_for_event(lambda e: e["event"] == "input.requested")
        asked = next(e for e in reader.events if e["event"] == "input.requested")
        self.assertEqual(asked["data"]["prompt"], "name? ")
        answered = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/executions/{xid}/input",
            {"value": "ada"},
        )
        self.assertEqual(answered.status, 200, answered.body)
        yield reader.done
        got = yield self.request("GET", f"/code/contexts/{ctx['id']}/executions/{xid}")
        self.assertEqual(got.json()["stdout"], "hello ada\n")
        again = yield self.request(
            "POST", f"/code/contexts/{ctx['id']}/executions/{xid}/input", {"value": "x"}
        )
        self.assertEqual(again.json()["code"], "already_resolved")

    @inlineCallbacks
    def test_interrupt_and_delete(self) -> Any:
        """SIGINT interrupts a loop (state kept); delete ends the kernel."""
        ctx = yield self.context(kernel="sandboxd-python")
        yield self.execute(ctx["id"], "kept = 1")
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {"code": "while True: pass", "wait": 0},
        )
        xid = reply.json()["execution_id"]
        yield deferLater(reactor, 0.3, lambda: None)
        yield self.request("POST", f"/code/contexts/{ctx['id']}/interrupt", {})
        got = yield self.request(
            "GET", f"/code/contexts/{ctx['id']}/executions/{xid}?wait=10"
        )
        self.assertEqual(got.json()["state"], "interrupted")
        self.assertEqual(got.json()["error"]["ename"], "KeyboardInterrupt")
        after = yield self.execute(ctx["id"], "kept")
        self.assertEqual(after["results"][0]["data"]["text/plain"], "1")
        yield self.request("DELETE", f"/code/contexts/{ctx['id']}")
        self.assertFalse(alive(ctx["pid"]))

    @inlineCallbacks
    def test_default_without_jupyter(self) -> Any:
        """Where the hub cannot run, a context with no kernel named is ``sandboxd-python``."""
        self.patch(kernelspecs, "jupyter_usable", lambda: False)
        listed = yield self.request("GET", "/code/kernels")
        self.assertEqual(
            [k["name"] for k in listed.json()["kernels"]], ["sandboxd-python"]
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
