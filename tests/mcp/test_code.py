"""
``code_execute`` through the MCP door with the official ``mcp`` client:
a plot comes back as ``image`` content, stdout as progress, and a
cancelled call interrupts the execution (the context's state survives).
"""

from __future__ import annotations

import base64
from typing import Any

import anyio
from twisted.internet.defer import inlineCallbacks

from tests.kernels.test_contexts import (
    KERNEL_CALL_SECONDS,
    KERNEL_CASE_SECONDS,
    code_policy,
    need_ipykernel,
)
from tests.mcp.helpers import McpTestCase


class CodeToolTests(McpTestCase):
    """The code group's tools, with a real ipykernel."""

    timeout = KERNEL_CASE_SECONDS
    policy = code_policy()
    # A conversation starts a kernel, then imports matplotlib in it (both at
    # the children's nice value): it has a start's room and more for the
    # calls after it.
    client_seconds = KERNEL_CALL_SECONDS + 60

    def setUp(self) -> Any:
        need_ipykernel()
        return super().setUp()

    @inlineCallbacks
    def test_image_and_progress(self) -> Any:
        """A matplotlib figure is image content; printed lines arrive as progress first."""
        seen: list[str] = []

        async def progress(
            done: float, total: float | None, message: str | None
        ) -> None:
            if message:
                seen.append(message)

        async def body(client: Any) -> Any:
            ctx = await client.call_tool("code_context_create", {})
            cid = ctx.structured_content["id"]
            await client.call_tool("code_execute", {"cid": cid, "code": "n = 3"})
            return await client.call_tool(
                "code_execute",
                {
                    "cid": cid,
                    "code": "import matplotlib.pyplot as plt\nprint('plotting', n)\n"
                    "plt.plot(range(n))\nplt.show()",
                },
                progress_callback=progress,
            )

        result = yield self.with_client(body)
        self.assertFalse(result.is_error, result)
        self.assertEqual(result.structured_content["state"], "ok")
        self.assertEqual(result.structured_content["stdout"], "plotting 3\n")
        images = [c for c in result.content if c.type == "image"]
        self.assertEqual(len(images), 1)
        self.assertEqual(images[0].mime_type, "image/png")
        self.assertTrue(base64.b64decode(images[0].data).startswith(b"\x89PNG"))
        self.assertIn("plotting 3", result.content[0].text)
        self.assertIn("plotting 3", "".join(seen))

    @inlineCallbacks
    def test_a_big_chunk_of_output(self) -> Any:
        """A chunk of output the stream sends in parts comes back whole."""

        async def body(client: Any) -> Any:
            ctx = await client.call_tool("code_context_create", {})
            return await client.call_tool(
                "code_execute",
                {"cid": ctx.structured_content["id"], "code": "print('z' * 70000)"},
            )

        result = yield self.with_client(body)
        self.assertEqual(result.structured_content["stdout"], "z" * 70000 + "\n")
        self.assertFalse(result.structured_content["truncated"])

    @inlineCallbacks
    def test_within_the_sdk_bound(self) -> Any:
        """
        Output and a picture too big together for one message of the SDK's
        (1 MiB) come back cut to fit: the picture named in its place, the
        output's start kept, ``truncated`` said, rather than the SDK failing.
        """

        async def body(client: Any) -> Any:
            ctx = await client.call_tool("code_context_create", {})
            return await client.call_tool(
                "code_execute",
                {
                    "cid": ctx.structured_content["id"],
                    "code": "import os\nfrom IPython.display import Image, display\n"
                    "print(('y' * 99 + '\\n') * 6000, end='')\n"
                    "display(Image(data=b'\\x89PNG' + os.urandom(700000), format='png'))",
                },
            )

        result = yield self.with_client(body)
        content = result.structured_content
        self.assertEqual(content["state"], "ok")
        self.assertTrue(content["truncated"])
        self.assertTrue(content["stdout"].startswith("y" * 99 + "\n"))
        self.assertLess(len(content["stdout"]), 600_000)
        [item] = content["results"]
        self.assertIn("left out", item["data"]["image/png"])
        self.assertEqual([c.type for c in result.content], ["text"])
        self.assertIn("[truncated", result.content[0].text)

    @inlineCallbacks
    def test_error_is_an_error_result(self) -> Any:
        """An exception is ``isError`` with the traceback in the text."""

        async def body(client: Any) -> Any:
            ctx = await client.call_tool("code_context_create", {})
            return await client.call_tool(
                "code_execute", {"cid": ctx.structured_content["id"], "code": "1/0"}
            )

        result = yield self.with_client(body)
        self.assertTrue(result.is_error)
        self.assertEqual(
            result.structured_content["error"]["ename"], "ZeroDivisionError"
        )
        self.assertIn("ZeroDivisionError", result.content[0].text)

    @inlineCallbacks
    def test_cancel_interrupts(self) -> Any:
        """Cancelling a running code_execute interrupts it; the next call finds the state."""

        async def body(client: Any) -> Any:
            ctx = await client.call_tool("code_context_create", {})
            cid = ctx.structured_content["id"]
            await client.call_tool("code_execute", {"cid": cid, "code": "kept = 11"})
            started = anyio.Event()

            async def progress(done: float, total: Any, message: str | None) -> None:
                started.set()

            async def call() -> None:
                await client.call_tool(
                    "code_execute",
                    {"cid": cid, "code": "print('go', flush=True)\nwhile True: pass"},
                    progress_callback=progress,
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await started.wait()
                tg.cancel_scope.cancel()
            listed = None
            for _ in range(50):
                listed = await client.call_tool("code_executions_list", {"cid": cid})
                states = [x["state"] for x in listed.structured_content["executions"]]
                if states[-1] != "running":
                    break
                await anyio.sleep(0.1)
            after = await client.call_tool("code_execute", {"cid": cid, "code": "kept"})
            return states, after

        states, after = yield self.with_client(body)
        self.assertEqual(states[-1], "interrupted")
        self.assertIn("11", after.content[0].text)
