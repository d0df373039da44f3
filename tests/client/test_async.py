# -*- test-case-name: tests.client.test_async -*-
"""
The asyncio client (:class:`sandboxd.client.AsyncSandbox`) against a real
daemon: the same namespaces as the blocking one, as coroutines.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from sandboxd.client import AsyncSandbox
from sandboxd.client.errors import (
    EndpointDisabled,
    MissingScope,
    PathNotAllowed,
    Timeout,
    Unauthorized,
)
from tests.client.base import ClientCase, listen_proxy


class AsyncClientTests(ClientCase):
    """Each namespace, awaited."""

    def test_aclose_a_watch_another_task_reads(self) -> Any:
        """
        ``aclose()`` from one task ends a watch another task is awaiting:
        its ``async for`` ends quietly (was: RuntimeError, the reader left
        waiting); ``close()``, the blocking client's, is refused with a
        pointer to ``aclose()`` rather than doing nothing.
        """
        os.makedirs(self.path("w"))

        async def body() -> None:
            async with self.async_sandbox() as sb:
                events = await sb.files.watch("w")

                async def read() -> str:
                    async for _event in events:
                        pass
                    return "end"

                reader = asyncio.create_task(read())
                await asyncio.sleep(0.5)
                with self.assertRaises(TypeError) as raised:
                    events.close()  # type: ignore[misc]
                self.assertIn("aclose", str(raised.exception))
                await events.aclose()
                self.assertEqual(await asyncio.wait_for(reader, 2), "end")

        return self.in_loop(body)

    def test_files(self) -> Any:
        """Text, bytes, tree operations, upload and download, watch."""
        local = os.path.realpath(self.mktemp())
        os.makedirs(local)
        source = os.path.join(local, "up.bin")
        data = os.urandom(700_000)
        with open(source, "wb") as f:
            f.write(data)
        os.makedirs(self.path("w"))

        async def body() -> None:
            async with self.async_sandbox() as sb:
                await sb.files.write_text("a/one.txt", "one")
                self.assertEqual(await sb.files.read_text("a/one.txt"), "one")
                await sb.files.write_bytes("a/two.bin", b"\x00\x01")
                self.assertEqual(await sb.files.read_bytes("a/two.bin"), b"\x00\x01")
                names = sorted(e["name"] for e in await sb.files.list("a"))
                self.assertEqual(names, ["one.txt", "two.bin"])
                self.assertTrue(await sb.files.exists("a/one.txt"))
                await sb.files.mkdir("b")
                await sb.files.move("a/one.txt", "b/one.txt")
                found = await sb.files.search("one.*")
                self.assertEqual([r["name"] for r in found["results"]], ["one.txt"])
                packed = await sb.files.archive(["b"], format="zip")
                self.assertEqual(
                    (await sb.files.extract(packed, "x", format="zip"))["files"], 1
                )
                await sb.files.delete("b")
                seen: list[int] = []
                await sb.files.upload(
                    source, "up.bin", progress=lambda d, t: seen.append(d)
                )
                self.assertEqual(seen[-1], len(data))
                back = os.path.join(local, "back.bin")
                self.assertEqual(await sb.files.download("up.bin", back), len(data))
                with open(back, "rb") as f:
                    self.assertEqual(f.read(), data)
                async with await sb.files.watch("w") as events:
                    await sb.files.write_text("w/n.txt", "x")
                    async for event in events:
                        if event.data.get("dest", event.data["path"]).endswith(
                            "/n.txt"
                        ):
                            break

        return self.in_loop(body)

    def test_commands(self) -> Any:
        """
        ``run`` (plain and streamed, with a coroutine callback), ``start``
        with stdin, ``wait``, ``signal``, ``list``.
        """

        async def body() -> None:
            async with self.async_sandbox() as sb:
                result = await sb.commands.run(["sh", "-c", "echo hi; exit 2"])
                self.assertEqual((result.stdout, result.exit_code), ("hi\n", 2))
                lines: list[str] = []

                async def collect(line: str) -> None:
                    lines.append(line)

                await sb.commands.run(["sh", "-c", "echo a; echo b"], on_stdout=collect)
                self.assertEqual(lines, ["a", "b"])
                with self.assertRaises(Timeout):
                    await sb.commands.run("sleep 10", timeout=0.3)
                cat = await sb.commands.start("cat", stdin=True)
                await cat.send_stdin("x\n", eof=True)
                out: list[str] = []
                self.assertEqual(await cat.wait(timeout=10, on_stdout=out.append), 0)
                self.assertEqual(out, ["x\n"])
                sleeper = await sb.commands.start("sleep 30")
                self.assertIn(sleeper.pid, [p["pid"] for p in await sb.commands.list()])
                await sleeper.kill()
                self.assertEqual(await sleeper.wait(timeout=10), -9)

        return self.in_loop(body)

    def test_pty_system_env_caps(self) -> Any:
        """A terminal round trip; system facts; env; capabilities and check."""

        async def body() -> None:
            async with self.async_sandbox() as sb:
                term = await sb.pty.open(cols=90, rows=20, shell="sh")
                await term.send("stty size\n")
                await term.expect("20 90")
                await term.resize(100, 30)
                await term.send("stty size\n")
                await term.expect("30 100")
                await term.reconnect()
                await term.send("exit 4\n")
                while await term.recv(timeout=10) is not None:
                    pass
                self.assertEqual(term.exit_code, 4)
                self.assertTrue(await sb.health())
                self.assertIn("hostname", await sb.system.info())
                await sb.env.set({"ASYNC_CLIENT_VAR": "v"})
                self.assertEqual(
                    await sb.env.get("ASYNC_CLIENT_VAR"), {"ASYNC_CLIENT_VAR": "v"}
                )
                os.environ.pop("ASYNC_CLIENT_VAR", None)
                caps = await sb.capabilities()
                self.assertEqual(caps["identity"]["id"], "legacy")
                self.assertFalse((await sb.check("files_list", "/etc"))["allowed"])
                with self.assertRaises(PathNotAllowed):
                    await sb.files.stat("/etc/passwd")
                with self.assertRaises(EndpointDisabled):
                    await sb.git.status()

        return self.in_loop(body)

    def test_concurrent_calls(self) -> Any:
        """Calls of one client run concurrently on one event loop."""

        async def body() -> None:
            async with self.async_sandbox() as sb:
                results = await asyncio.gather(
                    *(
                        sb.commands.run(["sh", "-c", f"sleep 0.3; echo {i}"])
                        for i in range(4)
                    )
                )
                self.assertEqual(
                    [r.stdout for r in results], [f"{i}\n" for i in range(4)]
                )

        return self.in_loop(body)

    def test_stream_resume(self) -> Any:
        """A followed output stream cut mid-way resumes with Last-Event-ID."""

        def cut(index: int, seen: bytes) -> bool:
            return proxy.cuts == 0 and b"\nid: 3\n" in seen

        proxy, url = listen_proxy(self, cut)

        async def body() -> None:
            async with self.async_sandbox() as direct:
                p = await direct.commands.start(
                    ["sh", "-c", "for i in 1 2 3 4 5; do echo $i; sleep 0.1; done"]
                )
            async with AsyncSandbox(url, token=self.daemon.token) as sb:
                handle = await sb.commands.connect(p.pid)
                ids = [e.id async for e in handle.stream()]
            self.assertEqual(ids, list(range(1, 7)))
            self.assertEqual(proxy.cuts, 1)

        return self.in_loop(body)


class AsyncAuthTests(ClientCase):
    """Refusals reach the async client as the same exceptions."""

    token = None
    policy = {
        "auth": {
            "tokens": [
                {"id": "reader", "token_env": "READER_T", "scopes": ["files:read"]}
            ]
        }
    }
    environ = {"READER_T": "reader-secret"}

    def test_refusals(self) -> Any:
        """A wrong token is Unauthorized; a missing scope MissingScope."""

        async def body() -> None:
            async with AsyncSandbox(self.daemon.url, token="nope") as bad:
                with self.assertRaises(Unauthorized):
                    await bad.files.list()
            async with AsyncSandbox(self.daemon.url, token="reader-secret") as reader:
                with self.assertRaises(MissingScope):
                    await reader.commands.run("true")

        return self.in_loop(body)


class AsyncBytesAndTerminalTests(ClientCase):
    """The asyncio face of run_bytes and of a terminal that ends with its block."""

    def test_run_bytes_and_pty_block(self) -> Any:
        """
        run_bytes passes stdin and gives the output byte for byte (a
        coroutine callback too); ``async with pty.open()`` ends its session.
        """

        async def body() -> None:
            async with self.async_sandbox() as sb:
                out: list[bytes] = []

                async def keep(chunk: bytes) -> None:
                    out.append(chunk)

                result = await sb.commands.run_bytes(
                    "cat", stdin=b"\xff\x00tail", on_stdout=keep
                )
                self.assertEqual(
                    (result.exit_code, b"".join(out)), (0, b"\xff\x00tail")
                )
                async with await sb.pty.open(shell="sh") as term:
                    await term.send("echo in-term\n")
                    await term.expect("in-term")
                self.assertEqual(await sb.pty.list(), [])

        return self.in_loop(body)
