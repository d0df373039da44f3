"""
The SDK's asyncio face against the door: ``AsyncCommandExecutor`` over
``grpc.aio`` and ``AsyncFilesystem`` over httpx, as an asyncio application
(an agent framework) runs them.  Each test runs its own event loop in a
thread, beside the daemon's reactor.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.kep.case import KepCase


class AsyncSdkTests(KepCase):
    """The asyncio SDK: commands and files, as ``AsyncSandbox`` drives them."""

    grpc = True

    def run_async(self, job: Any) -> Any:
        """Run ``job(connector)`` on an event loop of its own, off the reactor."""
        from k8s_agent_sandbox.async_connector import AsyncSandboxConnector
        from k8s_agent_sandbox.models import SandboxdInClusterConnectionConfig

        rest, grpc_port = self.rest_port, self.grpc_port

        async def ip() -> str:
            return "127.0.0.1"

        async def main() -> Any:
            config = SandboxdInClusterConnectionConfig(
                mode="in-cluster-pod-ip", rest_port=rest, grpc_port=grpc_port
            )
            connector = AsyncSandboxConnector(
                "sandbox",
                "default",
                config,
                k8s_helper=None,  # type: ignore[arg-type]
                get_pod_ip=ip,
            )
            try:
                return await job(connector)
            finally:
                await connector.close()

        return self.blocking(asyncio.run, main())

    @inlineCallbacks
    def test_commands_and_files(self) -> Any:
        """
        Commands run concurrently on one channel; a file written is read,
        listed and deleted; a command's timeout is reported as the SDK says.
        """
        from k8s_agent_sandbox.commands.async_command_executor import (
            AsyncCommandExecutor,
        )
        from k8s_agent_sandbox.files.async_filesystem import AsyncFilesystem

        async def job(connector: Any) -> Any:
            commands = AsyncCommandExecutor(connector, None, "sandbox-client")
            files = AsyncFilesystem(connector, None, "sandbox-client")
            began = time.monotonic()
            results = await asyncio.gather(
                *(commands.run(f"sleep 0.5; echo {n}") for n in range(5))
            )
            together = time.monotonic() - began
            await files.write("out/answer.txt", b"42\n")
            read = await files.read("out/answer.txt")
            listed = [entry.name for entry in await files.list("out")]
            ran = await commands.run("cat out/answer.txt")
            timed = await commands.run("sleep 30", command_timeout=0.5)
            await files.delete("out", recursive=True)
            gone = not await files.exists("out")
            return results, together, read, listed, ran, timed, gone

        results, together, read, listed, ran, timed, gone = yield self.run_async(job)
        # Five half-second commands at once on one channel, not one by one.
        self.assertLess(together, 2.0)
        self.assertEqual([r.stdout for r in results], [f"{n}\n" for n in range(5)])
        self.assertEqual((read, listed, ran.stdout), (b"42\n", ["answer.txt"], "42\n"))
        self.assertEqual((timed.exit_code, timed.timed_out), (124, True))
        self.assertTrue(gone)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "out")))
