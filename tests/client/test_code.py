"""
``sb.code``'s code contexts in both faces of the client, against a real
daemon and a real ipykernel.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import inlineCallbacks

from sandboxd.client import Sandbox
from sandboxd.client.errors import NotFoundError
from tests.client.base import ClientCase
from tests.kernels.test_contexts import need_ipykernel


class CodeContextClientTests(ClientCase):
    """Create, execute with state, follow events, restart, delete."""

    policy = {"groups": {"code": True}}

    def setUp(self) -> Any:
        need_ipykernel()
        return super().setUp()

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


class CodeCommandTests(ClientCase):
    """``sandboxd code``: one-shot and a REPL fed on stdin."""

    policy = {"groups": {"code": True}}

    def setUp(self) -> Any:
        need_ipykernel()
        return super().setUp()

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
    def test_repl_keeps_state(self) -> Any:
        """Lines on stdin are cells of one context; a block ends at an empty line."""
        script = b"x = 5\nfor i in range(2):\n    x += 1\n\nprint(x)\n"
        done = yield self.cli("code", input=script)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, b"7\n")
