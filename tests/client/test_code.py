"""
``sb.code``'s code contexts in both faces of the client, against a real
daemon and a real ipykernel.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from twisted.internet.defer import inlineCallbacks

from sandboxd.client import Sandbox
from sandboxd.client.errors import NotFoundError, RateLimited
from tests.client.base import ROOT, ClientCase
from tests.kernels.test_contexts import (
    KERNEL_CALL_SECONDS,
    KERNEL_CASE_SECONDS,
    KERNEL_START,
    KERNEL_START_SECONDS,
    code_policy,
    need_ipykernel,
)


class KernelClientCase(ClientCase):
    """A client case whose daemon starts ipykernels (skipped without one)."""

    call_seconds = KERNEL_CALL_SECONDS

    def setUp(self) -> Any:
        need_ipykernel()
        return super().setUp()


class CodeContextClientTests(KernelClientCase):
    """Create, execute with state, follow events, restart, delete."""

    timeout = KERNEL_CASE_SECONDS
    policy = code_policy()

    @inlineCallbacks
    def test_sync(self) -> Any:
        """The blocking face: state kept, 202 then events, errors as ApiError."""

        def body(sb: Sandbox) -> Any:
            kernels = sb.code.kernels()
            ctx = sb.code.create_context()
            sb.code.execute(ctx["id"], "a = 2")
            done = sb.code.execute(ctx["id"], "a * 21")
            started = sb.code.execute(
                ctx["id"],
                "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.1)",
                wait=0,
            )
            with sb.code.events(ctx["id"], started["execution_id"]) as stream:
                names = [e.event for e in stream]
            later = sb.code.execution(ctx["id"], started["execution_id"], wait=5)
            sb.code.restart(ctx["id"])
            gone = sb.code.execute(ctx["id"], "a")
            listed = sb.code.contexts()
            sb.code.delete_context(ctx["id"])
            try:
                sb.code.context(ctx["id"])
            except NotFoundError as e:
                missing = e.status
            return kernels, done, started, names, later, gone, listed, missing

        (
            kernels,
            done,
            started,
            names,
            later,
            gone,
            listed,
            missing,
        ) = yield self.in_thread(lambda: body(self.sandbox()))
        self.assertIn("python3", [k["name"] for k in kernels])
        self.assertEqual(done["results"][0]["data"]["text/plain"], "42")
        self.assertIn(started["state"], ("queued", "running"))
        self.assertEqual(names[0], "execution.started")
        self.assertEqual(names[-1], "execution.ended")
        self.assertEqual(later["stdout"], "0\n1\n2\n")
        self.assertEqual(gone["error"]["ename"], "NameError")
        self.assertEqual(len(listed), 1)
        self.assertEqual(missing, 404)

    @inlineCallbacks
    def test_async(self) -> Any:
        """The asyncio face: the same calls, awaited."""

        async def body() -> Any:
            async with self.async_sandbox() as sb:
                ctx = await sb.code.create_context(name="async")
                await sb.code.execute(ctx["id"], "b = 'x' * 3")
                result = await sb.code.execute(ctx["id"], "print(b)")
                await sb.code.delete_context(ctx["id"])
                return ctx, result

        ctx, result = yield self.in_loop(body)
        self.assertEqual(ctx["name"], "async")
        self.assertEqual(result["stdout"], "xxx\n")


class CodeCommandTests(KernelClientCase):
    """``sandboxd code``: one-shot and a REPL fed on stdin."""

    timeout = KERNEL_CASE_SECONDS
    policy = code_policy()

    @inlineCallbacks
    def test_one_shot(self) -> Any:
        """-c runs once: output and value on stdout, exit 0; an error exits 1 with the traceback."""
        done = yield self.cli("code", "-c", "print('hi')\n6 * 7")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, b"hi\n42\n")
        failed = yield self.cli("code", "-c", "1/0")
        self.assertEqual(failed.returncode, 1)
        self.assertIn(b"ZeroDivisionError", failed.stderr)
        listed = yield self.request("GET", "/code/contexts")
        self.assertEqual(listed.json()["contexts"], [])

    @inlineCallbacks
    def test_json(self) -> Any:
        """
        ``--json`` prints the execution's result document (was: the same
        text as without it): output, the value's MIME bundle, the error;
        in the loop, one document per line.
        """
        done = yield self.cli("code", "--json", "-c", "print('hi')\n6 * 7")
        self.assertEqual(done.returncode, 0, done.stderr)
        doc = json.loads(done.stdout)
        self.assertEqual((doc["state"], doc["stdout"]), ("ok", "hi\n"))
        self.assertEqual(doc["results"][-1]["data"]["text/plain"], "42")
        failed = yield self.cli("code", "--json", "-c", "1/0")
        self.assertEqual(failed.returncode, 1)
        self.assertEqual(
            json.loads(failed.stdout)["error"]["ename"], "ZeroDivisionError"
        )
        loop = yield self.cli("code", "--json", input=b"x = 5\nx + 1\n")
        docs = [json.loads(line) for line in loop.stdout.splitlines()]
        self.assertEqual([d["state"] for d in docs], ["ok", "ok"])
        self.assertEqual(docs[1]["results"][-1]["data"]["text/plain"], "6")

    @inlineCallbacks
    def test_repl_keeps_state(self) -> Any:
        """Lines on stdin are cells of one context; a block ends at an empty line."""
        script = b"x = 5\nfor i in range(2):\n    x += 1\n\nprint(x)\n"
        done = yield self.cli("code", input=script)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, b"7\n")

    @inlineCallbacks
    def test_repl_ctrl_c_interrupts_the_cell(self) -> Any:
        """
        Ctrl-C (SIGINT) during a cell of the loop interrupts that cell and
        the loop goes on with the context's state kept (was: the loop
        ended and deleted the context); two within a second leave it.
        """

        def body() -> tuple[bytes, bytes, int, bytes, int]:
            env = {
                "PATH": os.environ.get("PATH", ""),
                "PYTHONPATH": ROOT,
                "SANDBOXD_URL": self.daemon.url,
                "SANDBOXD_TOKEN": self.daemon.token or "",
            }
            command = [sys.executable, "-m", "sandboxd.client.cli", "code"]
            command += ["--request-timeout", str(self.call_seconds)]
            child = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(
                b"import time\nx = 41\nprint('sleeping', flush=True); time.sleep(60)\n"
            )
            child.stdin.flush()
            line = child.stdout.readline()
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(b"print(x + 1)\n", timeout=60)
            first = (line + out, err, child.returncode)

            again = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert again.stdin is not None and again.stdout is not None
            again.stdin.write(
                b"import time; print('sleeping', flush=True); time.sleep(60)\n"
            )
            again.stdin.flush()
            again.stdout.readline()
            again.send_signal(signal.SIGINT)
            time.sleep(0.3)
            again.send_signal(signal.SIGINT)
            _, err2 = again.communicate(timeout=60)
            return (*first, err2, again.returncode)

        out, err, status, err2, status2 = yield self.in_thread(body)
        self.assertIn(b"KeyboardInterrupt", err)
        self.assertEqual(out, b"sleeping\n42\n", err)
        self.assertEqual(status, 1)
        self.assertEqual(status2, 130, err2)
        listed = yield self.request("GET", "/code/contexts")
        self.assertEqual(listed.json()["contexts"], [])


#: Cells whose result documents the streamed ``execute`` must reproduce:
#: output on both streams (with characters beyond ASCII), rich results,
#: an error after output, a display updated in place, output over the
#: bound (head and tail kept).
SAME_RESULT_CELLS = [
    "import sys\nprint('a \"q\" \\\\ \\t é ✓')\nsys.stderr.write('warn\\n')\n6 * 7",
    "from IPython.display import HTML, JSON, display\n"
    "display(HTML('<b>x</b>'))\ndisplay(JSON({'k': [1, 2]}))\n"
    "display({'image/png': 'iVBORw0KGgo=', 'text/plain': 'a PNG'}, raw=True)",
    "h = display('first', display_id=True)\nh.update('second')\nprint('then')",
    "print('before')\n1/0",
    "print('x' * 3000)\nprint('the end')",
    "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.05)",
]


class StreamedExecuteTests(KernelClientCase):
    """``sb.code.execute`` reads the events; its result is the daemon's document."""

    timeout = 120 + KERNEL_START_SECONDS
    policy = code_policy(limits={"max_output_bytes": 2000})

    @inlineCallbacks
    def test_same_as_document(self) -> Any:
        """
        For every cell, the result assembled from the stream equals the
        document the daemon keeps for that execution, field for field; a
        cell told to wait (the document's way) gives the same outputs.
        """

        def body(sb: Sandbox) -> Any:
            ctx = sb.code.create_context()
            out = []
            for cell in SAME_RESULT_CELLS:
                streamed = sb.code.execute(ctx["id"], cell)
                kept = sb.code.execution(ctx["id"], streamed["execution_id"])
                waited = sb.code.execute(ctx["id"], cell, wait=60)
                out.append((streamed, kept, waited))
            return out

        outcomes = yield self.in_thread(lambda: body(self.sandbox()))
        self.assertEqual(len(outcomes), len(SAME_RESULT_CELLS))
        for cell, (streamed, kept, waited) in zip(
            SAME_RESULT_CELLS, outcomes, strict=True
        ):
            self.assertEqual(streamed, kept, cell)
            for field in ("state", "stdout", "stderr", "truncated"):
                self.assertEqual(streamed[field], waited[field], (cell, field))
            # The traceback names the cell's number, which differs.
            self.assertEqual(
                (streamed["error"] or {}).get("ename"),
                (waited["error"] or {}).get("ename"),
            )
            self.assertEqual(
                [r["data"] for r in streamed["results"]],
                [r["data"] for r in waited["results"]],
                cell,
            )
        first, rich, updated, failed, long, slow = (s for s, _, _ in outcomes)
        self.assertEqual(first["stdout"], 'a "q" \\ \t é ✓\n')
        self.assertEqual(first["stderr"], "warn\n")
        self.assertEqual(first["results"][0]["data"]["text/plain"], "42")
        mimes = [set(r["data"]) for r in rich["results"]]
        self.assertIn("text/html", mimes[0])
        self.assertIn("application/json", mimes[1])
        self.assertIn("image/png", mimes[2])
        # An update replaces what its display_id showed, as in a notebook.
        self.assertEqual(
            [r["data"]["text/plain"] for r in updated["results"]], ["'second'"]
        )
        self.assertEqual(failed["state"], "error")
        self.assertEqual(failed["error"]["ename"], "ZeroDivisionError")
        self.assertEqual(failed["stdout"], "before\n")
        self.assertTrue(long["truncated"])
        self.assertTrue(long["stdout"].endswith("the end\n"))
        self.assertEqual(slow["stdout"], "0\n1\n2\n")

    @inlineCallbacks
    def test_async_refusal(self) -> Any:
        """The asyncio face streams too; a context of nobody's is 404 before anything runs."""

        async def body() -> Any:
            async with self.async_sandbox() as sb:
                ctx = await sb.code.create_context()
                result = await sb.code.execute(ctx["id"], "print('hi')\n1/0")
                kept = await sb.code.execution(ctx["id"], result["execution_id"])
                try:
                    await sb.code.execute("ctx_nothere", "1")
                except NotFoundError as e:
                    return result, kept, e.status
                return result, kept, None

        result, kept, missing = yield self.in_loop(body)
        self.assertEqual(result, kept)
        self.assertEqual(result["error"]["ename"], "ZeroDivisionError")
        self.assertEqual(missing, 404)


class StreamedExecuteRateTests(KernelClientCase):
    """The streamed execute meets the rate limit as every call does."""

    timeout = 120 + KERNEL_START_SECONDS
    policy = {
        "groups": {"code": True},
        "endpoints": {
            **KERNEL_START["endpoints"],
            "code_execute": {"limits": {"rate_per_minute": 30}},
        },
    }

    @inlineCallbacks
    def test_rate_limit(self) -> Any:
        """
        Past the rate it raises RateLimited (nothing ran); a client made
        with ``wait_on_rate_limit`` waits and gets the result instead.
        """

        def body() -> Any:
            sb = self.sandbox()
            ctx = sb.code.create_context()
            ran = 0
            with self.assertRaises(RateLimited) as cm:
                for _ in range(100):  # a bucket of 30, one back every 2 s
                    sb.code.execute(ctx["id"], "1")
                    ran += 1
            patient = self.sandbox(wait_on_rate_limit=True)
            return cm.exception.status, ran, patient.code.execute(ctx["id"], "6 * 7")

        status, ran, result = yield self.in_thread(body)
        self.assertEqual(status, 429)
        self.assertGreaterEqual(ran, 29)
        self.assertEqual(result["results"][0]["data"]["text/plain"], "42")
