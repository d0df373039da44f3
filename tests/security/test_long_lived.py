"""
A daemon that lives as long as its sandbox gives back what each call took.

An agent calls its sandbox thousands of times a day, and many of those
calls end badly: the client goes away in the middle of a stream, an
upload is cut, a terminal's socket drops without a close.  Each case
below starts the real daemon (``twistd -n sandboxd``), makes one kind of
call a few times to warm it, notes what the daemon holds (its open
descriptors by kind, the processes below it, the files in its base and
temporary directories), makes the same call many more times through the
client its users run, and checks that once the calls are over the daemon
holds what it held before (and what a daemon killed outright left, the
next start removes).  Threads are not compared: the daemon's pool
keeps idle threads for the next call; nor are connections a client keeps
open for its next call.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shutil
import signal
import socket
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.processes.tree import descendants
from tests.helpers import fd_targets, tcp_rows
from tests.kernels.test_contexts import need_ipykernel
from tests.security.test_full_sandbox import BoxedDaemon, e2b_sandbox

#: How many calls each case makes after its warm-up.
CALLS = 25

#: How long what the calls took may take to be given back (a cut
#: connection is noticed, a terminal's shell reaped).
SETTLE_SECONDS = 10.0


def client_held() -> set[str]:
    """
    The inodes of TCP connections whose other end is open too: a client's
    idle keep-alive connection (the e2b SDK keeps a pool of them, as many
    as it found it needed) is the client's to close, not the daemon's.
    A connection the daemon failed to close after its client left is not
    in it: its client's end is gone (the daemon's is in ``CLOSE_WAIT``).
    """
    established = [row for row in tcp_rows() if row[3] == "01"]
    ends = {(row[1], row[2]) for row in established}
    return {row[9] for row in established if (row[2], row[1]) in ends}


def held(pid: int, directories: list[str]) -> dict[str, Any]:
    """What the daemon ``pid`` holds: descriptors by kind, child processes, files."""
    kinds: collections.Counter[str] = collections.Counter()
    in_use = client_held()
    for _, target in fd_targets(pid):
        if target.startswith("socket:[") and target[8:-1] in in_use:
            continue
        # "socket:[123]" and "pipe:[45]" by kind; files by name.
        kinds[target.split("[")[0] if target.endswith("]") else target] += 1
    files = sorted(
        os.path.join(folder, name)
        for directory in directories
        for folder, dirs, names in os.walk(directory)
        for name in names + dirs
    )
    return {"descriptors": dict(kinds), "children": descendants(pid), "files": files}


class LongLivedTests(SynchronousTestCase):
    """Each kind of call, many times over, leaves nothing behind."""

    def setUp(self) -> None:
        # A home of its own: the E2B SDK runs commands in a login shell,
        # which must not read the machine's profile.
        home = os.path.realpath(self.mktemp())
        os.makedirs(home)
        environ = {k: v for k, v in os.environ.items() if not k.startswith("ABX_")}
        self.box = BoxedDaemon(
            self,
            policy={
                "groups": {"code": True, "dev_tools": True, "git": True, "e2b": True}
            },
            environ={**environ, "HOME": home},
        )
        self.url = self.box.url
        self.tmp = f"{self.box.root}/tmp"

    def assert_gives_back(self, call: Callable[[], None]) -> None:
        """After ``CALLS`` more calls, the daemon holds what it held after three."""
        for _ in range(3):
            call()
        before = self.settled(None)
        for _ in range(CALLS):
            call()
        after = self.settled(before)
        self.assertEqual(after, before)

    def settled(self, expected: dict[str, Any] | None) -> dict[str, Any]:
        """
        What the daemon holds once it stops changing (or equals
        ``expected``), within :data:`SETTLE_SECONDS`.
        """
        directories = [self.box.base, self.tmp]
        deadline = time.monotonic() + SETTLE_SECONDS
        last = held(self.box.proc.pid, directories)
        while time.monotonic() < deadline:
            time.sleep(0.2)
            now = held(self.box.proc.pid, directories)
            if now == expected or (expected is None and now == last):
                return now
            last = now
        return last

    def post(self, path: str, body: Any) -> Any:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read())

    def delete(self, path: str) -> None:
        request = urllib.request.Request(self.url + path, method="DELETE")
        with urllib.request.urlopen(request, timeout=30) as r:
            r.read()

    def cut_after_first_line(self, method: str, path: str, body: Any = None) -> None:
        """A stream read to its first line, then the connection dropped."""
        import httpx

        with httpx.Client(base_url=self.url, timeout=30) as client:
            with client.stream(method, path, json=body) as r:
                self.assertEqual(r.status_code, 200)
                for _ in r.iter_lines():
                    break

    def test_commands(self) -> None:
        """``/shell``, and a ``/process/start`` ended by a signal."""

        def call() -> None:
            self.assertEqual(
                self.post("/shell", {"command": "echo hi"})["stdout"], "hi\n"
            )
            pid = self.post("/process/start", {"command": "sleep 60"})["pid"]
            self.post(f"/process/{pid}/signal", {"signal": "KILL"})

        self.assert_gives_back(call)

    def test_streams_cut(self) -> None:
        """A command's stream and a watch, each dropped after its first line."""

        def call() -> None:
            self.cut_after_first_line(
                "POST", "/shell/stream", {"command": "echo a; sleep 60", "shell": "sh"}
            )
            self.cut_after_first_line("GET", "/files/watch?path=.&follow=true")

        self.assert_gives_back(call)

    def test_uploads_cut(self) -> None:
        """A raw upload whose connection drops a tenth of the way in."""

        def call() -> None:
            with socket.create_connection(("127.0.0.1", self.box.port)) as s:
                s.sendall(
                    b"POST /files/raw?path=cut.bin HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Length: 1000000\r\n\r\n" + b"y" * 100_000
                )
                time.sleep(0.02)

        self.assert_gives_back(call)
        self.assertFalse(os.path.exists(f"{self.box.base}/cut.bin"))

    def test_terminals(self) -> None:
        """
        Terminals opened over the WebSocket (websocket-client) and closed:
        one with a close frame, one whose socket just drops, each then
        deleted.
        """
        try:
            import websocket
        except ImportError:
            raise SkipTest("websocket-client is not installed") from None

        def call() -> None:
            for clean in (True, False):
                created = self.post("/pty/sessions", {"shell": "sh"})
                ws = websocket.create_connection(created["ws_url"], timeout=10)
                ws.recv()
                if clean:
                    ws.close()
                else:
                    ws.sock.close()
                self.delete(f"/pty/sessions/{created['session_id']}")

        self.assert_gives_back(call)

    def test_the_sdks(self) -> None:
        """
        The e2b SDK (a command, a file written and read), the
        agent-sandbox SDK (a shell, an upload) and the MCP SDK (a session
        that runs a tool), each a new client per call as an agent's tool
        would make.
        """
        try:
            import anyio
            import httpx2
            from agent_sandbox.api.server_client import ServerClient
            from mcp.client.client import Client
            from mcp.client.streamable_http import streamable_http_client
        except ImportError as e:
            raise SkipTest(f"an SDK is not installed: {e}") from None
        e2b = e2b_sandbox(self, self.box)

        async def seed() -> None:
            async with ServerClient(self.url) as client:
                await client.process.shell("echo seed")
                await client.files.upload(f"{self.box.base}/seed.bin", b"abc")

        async def mcp() -> None:
            async with httpx2.AsyncClient(timeout=20) as http:
                transport = streamable_http_client(f"{self.url}/mcp", http_client=http)
                async with Client(transport) as client:
                    await client.call_tool("shell", {"command": "echo mcp"})

        def call() -> None:
            self.assertEqual(e2b.commands.run("echo e2b").stdout, "e2b\n")
            e2b.files.write(f"{self.box.base}/e2b.txt", "x")
            self.assertEqual(e2b.files.read(f"{self.box.base}/e2b.txt"), "x")
            asyncio.run(seed())
            anyio.run(mcp)

        self.assert_gives_back(call)

    def test_git(self) -> None:
        """A repository made, a commit, its status, the repository removed."""
        if shutil.which("git") is None:
            raise SkipTest("git is not installed")

        def call() -> None:
            self.post("/git/init", {"path": "repo"})
            with open(f"{self.box.base}/repo/a", "w") as f:
                f.write("a")
            self.post("/git/add", {"path": "repo", "all": True})
            author = {"name": "A", "email": "a@example.com"}
            self.post("/git/commit", {"path": "repo", "message": "m", "author": author})
            with urllib.request.urlopen(f"{self.url}/git/status?path=repo") as r:
                self.assertEqual(json.loads(r.read())["files"], [])
            shutil.rmtree(f"{self.box.base}/repo")

        self.assert_gives_back(call)

    def test_code_contexts(self) -> None:
        """A kernel started, asked to run code, and deleted."""
        need_ipykernel()

        def call() -> None:
            created = self.post("/code/contexts", {"language": "python"})
            ran = self.post(
                f"/code/contexts/{created['id']}/execute", {"code": "print(6 * 7)"}
            )
            self.assertIn("42", json.dumps(ran))
            self.delete(f"/code/contexts/{created['id']}")

        self.assert_gives_back(call)

    def test_start_removes_what_a_killed_daemon_left(self) -> None:
        """
        A daemon SIGKILLed with a code context open (the OOM killer's way)
        leaves the context's directory in the temporary directory; the
        daemon a supervisor starts next removes it, and says so in its log.
        """
        need_ipykernel()
        created = self.post("/code/contexts", {"language": "python"})
        self.post(f"/code/contexts/{created['id']}/execute", {"code": "x = 1"})
        [left] = os.listdir(self.tmp)
        self.assertTrue(left.startswith("sandboxd-run-"))
        self.assertTrue(
            any(
                n.startswith("sandboxd-code-") for n in os.listdir(f"{self.tmp}/{left}")
            )
        )
        os.killpg(self.box.proc.pid, signal.SIGKILL)
        self.box.proc.wait()
        self.assertEqual(os.listdir(self.tmp), [left])
        self.box.output.close()
        self.box.spawn()
        self.box.wait_healthy()
        deadline = time.monotonic() + SETTLE_SECONDS
        while left in os.listdir(self.tmp) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertNotIn(left, os.listdir(self.tmp))
        self.assertIn(f"removed {self.tmp}/{left}, left by a daemon", self.box.log())
