"""
The sandbox out of room: its disk full, its file descriptors used up, its
processes at their limit.

An agent's build fills the disk, a leak eats the descriptors, a runaway
loop forks until the pid limit.  The disk and descriptor cases start the
real daemon (``twistd -n sandboxd``) as an operator would, with the
resource made small (a tmpfs of a few MiB as its base dir, temporary
directory, audit file and log, in a mount namespace of its own; a low
``RLIMIT_NOFILE``), and drive it through the clients users run; the pid
limit (which binds no root daemon) is every fork failing.  Each checks what
a user sees: the call refused with its code, the old bytes intact, no
temporary file left, the daemon answering every other call, and the same
call succeeding once the resource is back.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import functools
import io
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from unittest import mock

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.browser import supervisor
from sandboxd.client import Sandbox
from sandboxd.client.errors import InsufficientStorage, SandboxError
from sandboxd.files.atomic import TEMPORARY_NAME
from sandboxd.kernels.kernelspecs import find_kernelspecs
from sandboxd.processes import posix_spawn
from tests.git.remote import missing as remote_missing
from tests.git.remote import run as remote_git
from tests.helpers import (
    DaemonTestCase,
    free_port,
    session_listens,
    someone_listens,
    unnamed_files,
    until_exited,
)
from tests.kernels.test_contexts import need_ipykernel
from tests.test_guard import tmpfs

BIN = os.path.dirname(sys.executable)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Mounts a tmpfs of size ``$2`` on ``$1`` in the namespace ``unshare``
#: made, then becomes the daemon: the tmpfs lives as long as the daemon.
_MOUNT_THEN_EXEC = (
    'mount -t tmpfs -o "size=$2,mode=0755" tmpfs "$1" && '
    'mkdir "$1/home" "$1/log" "$1/tmp" && shift 2 && exec "$@"'
)


@functools.cache
def tmpfs_refusal() -> str | None:
    """Why a tmpfs cannot be mounted in a private mount namespace here (None: it can)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    with tempfile.TemporaryDirectory() as d:
        try:
            result = subprocess.run(
                [
                    *("unshare", "--mount", "--propagation", "private"),
                    *("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d),
                ],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"unshare could not run: {e}"
    if result.returncode != 0:
        return (
            "mounting a tmpfs in a private mount namespace is not permitted here: "
            + (result.stderr.strip() or f"exit {result.returncode}")
        )
    return None


class BoxedDaemon:
    """
    ``twistd -n sandboxd`` as its own process group; with ``disk``, on a
    tmpfs of that size (its base dir, its temporary directory, its audit
    file and its log) that only it sees; with ``nofile``, under that
    ``RLIMIT_NOFILE``; with ``nproc``, that ``RLIMIT_NPROC`` (which binds
    the children that run as another user than root); with ``state``, a
    state directory (``--state-dir``) beside its base dir; with
    ``inotify_watches``, in a user namespace of its own (as root there)
    whose limit of inotify watches is that.
    """

    def __init__(
        self,
        test: SynchronousTestCase,
        *,
        disk: str | None = None,
        nofile: int | None = None,
        nproc: int | None = None,
        policy: dict[str, Any] | None = None,
        state: bool = False,
        capabilities: str | None = None,
        environ: dict[str, str] | None = None,
        inotify_watches: int | None = None,
    ) -> None:
        if disk is not None and (why := tmpfs_refusal()) is not None:
            raise SkipTest(why)
        if capabilities is not None and shutil.which("setpriv") is None:
            raise SkipTest("setpriv (util-linux) is not installed")
        # Short: a kernel's sockets live under TMPDIR, within a socket
        # path's 108 bytes.
        self.root = os.path.realpath(tempfile.mkdtemp(prefix="sandboxd-box-"))
        test.addCleanup(self.remove)
        self.base = f"{self.root}/home"
        # Beside the root, which the tmpfs covers.
        self.policy_path = f"{self.root}.policy.json"
        with open(self.policy_path, "w") as f:
            json.dump(policy or {}, f)
        self.disk, self.nofile, self.nproc = disk, nofile, nproc
        self.capabilities = capabilities
        self.environ = environ
        self.inotify_watches = inotify_watches
        if inotify_watches is not None and shutil.which("unshare") is None:
            raise SkipTest("unshare (util-linux) is not installed")
        self.state = state
        if disk is None:
            for sub in ("home", "log", "tmp"):
                os.makedirs(f"{self.root}/{sub}")
        self.spawn()
        test.addCleanup(self.stop)
        # A port picked here may be taken by another test's server before
        # the daemon binds it: then it ends, and is started on fresh ones.
        for _ in range(2):
            if self.healthy(30) or not self.lost_a_port():
                break
            self.stop()
            if disk is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{self.root}/log/twistd.log")
            self.spawn()
        self.wait_healthy()

    def spawn(self) -> None:
        """Start the daemon on fresh ports."""
        self.port = free_port()
        self.e2b_port = free_port()
        self.pty_port = free_port()
        argv = [
            os.path.join(BIN, "twistd"),
            "-n",
            "--pidfile=",
            f"--logfile={self.root}/log/twistd.log",
            "sandboxd",
            "--port",
            f"tcp:{self.port}:interface=127.0.0.1",
            "--pty-port",
            f"tcp:{self.pty_port}:interface=127.0.0.1",
            "--e2b-port",
            f"tcp:{self.e2b_port}:interface=127.0.0.1",
            "--base-dir",
            self.base,
            "--audit-log",
            f"{self.root}/log/audit.log",
            "--policy",
            self.policy_path,
        ]
        if self.state:
            argv += ["--state-dir", f"{self.root}/state"]
        limits = []
        if self.nofile is not None:
            limits.append(f"--nofile={self.nofile}:{self.nofile}")
        if self.nproc is not None:
            limits.append(f"--nproc={self.nproc}:{self.nproc}")
        if limits:
            argv = ["prlimit", *limits, "--", *argv]
        if self.capabilities is not None:
            argv = ["setpriv", "--bounding-set", self.capabilities, *argv]
        if self.inotify_watches is not None:
            argv = [
                "unshare",
                "--user",
                "--map-root-user",
                "sh",
                "-c",
                'echo "$1" > /proc/sys/user/max_inotify_watches && shift && exec "$@"',
                "sh",
                str(self.inotify_watches),
                *argv,
            ]
        if self.disk is not None:
            argv = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                _MOUNT_THEN_EXEC,
                "sh",
                self.root,
                self.disk,
                *argv,
            ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABX_")}
        if self.environ is not None:
            env = dict(self.environ)
        env["TMPDIR"] = f"{self.root}/tmp"
        self.output = open(f"{self.root}.out", "w+")
        self.proc = subprocess.Popen(
            argv,
            stdout=self.output,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )

    def lost_a_port(self) -> bool:
        """
        Whether it ended and another process now listens on one of its
        ports (its log, on its tmpfs, went with it).
        """
        ports = (self.port, self.pty_port, self.e2b_port)
        return self.proc.poll() is not None and any(map(someone_listens, ports))

    @property
    def url(self) -> str:
        """The HTTP door's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def inside(self, path: str) -> str:
        """``path`` as the daemon sees it (through its own mount namespace)."""
        return f"/proc/{self.proc.pid}/root{path}"

    def log(self) -> str:
        """What the daemon wrote to its log and to its stdout."""
        try:
            with open(self.inside(f"{self.root}/log/twistd.log")) as f:
                text = f.read()
        except OSError:
            text = ""
        self.output.seek(0)
        return text + self.output.read()

    def health(self, timeout: float = 5) -> int | None:
        """``GET /health``'s status, or None when no answer came."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    def healthy(self, timeout: float) -> bool:
        """
        Whether its own ``/health`` answers 200 within ``timeout`` (another
        test's server that took its port would answer too).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.health(0.5) == 200 and session_listens(self.proc.pid, self.port):
                return True
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        return False

    def wait_healthy(self, timeout: float = 30) -> None:
        """Until its own ``/health`` answers 200 (else fail with the daemon's log)."""
        if not self.healthy(timeout):
            raise AssertionError(f"daemon not healthy; its log:\n{self.log()}")

    def cpu_seconds(self) -> float:
        """The daemon's CPU time so far (user + system)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def fill(self, room: int = 0) -> None:
        """
        Fill the daemon's tmpfs to the last byte with a file of its own,
        then give ``room`` bytes of it back.
        """
        chunk = b"\0" * 65536
        filler = self.inside(f"{self.root}/filler")
        with open(filler, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
        st = os.statvfs(self.inside(self.root))
        assert st.f_bavail == 0, st
        if room:
            os.truncate(filler, os.path.getsize(filler) - room)

    def free(self) -> None:
        """Give the space back."""
        os.unlink(self.inside(f"{self.root}/filler"))

    def remove(self) -> None:
        """Remove the root and the files beside it (once the daemon is gone)."""
        shutil.rmtree(self.root, ignore_errors=True)
        for suffix in (".policy.json", ".out"):
            try:
                os.unlink(self.root + suffix)
            except FileNotFoundError:
                pass

    def stop(self) -> None:
        """SIGTERM (the daemon ends its children), then SIGKILL; the tmpfs goes with it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.output.close()


def e2b_sandbox(test: SynchronousTestCase, box: BoxedDaemon) -> Any:
    """The e2b SDK's ``Sandbox`` (debug mode) on ``box``'s E2B port."""
    from e2b import Sandbox as E2BSandbox

    environ = mock.patch.dict(
        os.environ,
        {"E2B_DEBUG": "true", "E2B_SANDBOX_URL": f"http://127.0.0.1:{box.e2b_port}"},
    )
    environ.start()
    test.addCleanup(environ.stop)
    return E2BSandbox.create()


def work_tree(root: str) -> dict[str, bytes]:
    """The files of the work tree at ``root`` (not ``.git``), by path, and their bytes."""
    found = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = f.read()
    return found


def temporaries(directory: str) -> list[str]:
    """The daemon's temporary names left in ``directory``."""
    return [n for n in os.listdir(directory) if TEMPORARY_NAME.match(n)]


def tar_gz(members: dict[str, bytes]) -> bytes:
    """A tar.gz of regular files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def raised(fn: Callable[[], Any]) -> BaseException | None:
    """The exception ``fn()`` raised, or None."""
    try:
        fn()
    except BaseException as e:
        return e
    return None


#: Enough to be refused on a full disk, small enough to be kept on an empty one.
NEW = os.urandom(256 * 1024)
OLD = b"the old bytes\n"


class FullDiskTests(SynchronousTestCase):
    """
    Every way a user writes a file, on a full disk: 507
    ``insufficient_storage``, the old file as it was, no temporary file,
    the daemon answering; the same call succeeds once there is room.
    """

    policy: dict[str, Any] = {
        "defaults": {"audit": "all"},
        "groups": {"e2b": True, "git": True, "code": True},
        "endpoints": {
            "group:code": {
                "limits": {"max_display_bytes": 2000, "start_timeout_seconds": 60}
            }
        },
    }

    def setUp(self) -> None:
        self.box = BoxedDaemon(self, disk="16m", policy=self.policy)
        self.sb = Sandbox(self.box.url, timeout=20, retries=0)
        self.addCleanup(self.sb.close)

    def on_disk(self, name: str) -> str:
        """``name`` in the base dir, as the test reads it."""
        return self.box.inside(f"{self.box.base}/{name}")

    def old_file(self, name: str) -> None:
        """Put :data:`OLD` at ``name`` (while there is room)."""
        with open(self.on_disk(name), "wb") as f:
            f.write(OLD)

    def e2b_sandbox(self) -> Any:
        """The e2b SDK's ``Sandbox`` on the boxed daemon's E2B port."""
        return e2b_sandbox(self, self.box)

    def assert_refused_intact(self, error: BaseException | None, name: str) -> None:
        """A 507 ``insufficient_storage``; ``name`` holds :data:`OLD`; no temporary left."""
        self.assertIsInstance(error, InsufficientStorage, repr(error))
        assert isinstance(error, SandboxError)
        self.assertEqual((error.status, error.code), (507, "insufficient_storage"))
        with open(self.on_disk(name), "rb") as f:
            self.assertEqual(f.read(), OLD)
        directory = os.path.dirname(self.on_disk(name))
        self.assertEqual(temporaries(directory), [])

    def test_our_client(self) -> None:
        """
        write_bytes (raw), /upload and /files/upload-stream (base64), a
        resumable upload and an archive's extraction, through our client.
        """
        big = os.path.join(self.mktemp())
        with open(big, "wb") as f:
            f.write(os.urandom(9 * 1024 * 1024))
        self.sb.files.mkdir("d")
        for name in ("raw.bin", "b64.bin", "stream.bin", "big.bin", "d/a.bin"):
            self.old_file(name)
        payload = base64.b64encode(NEW).decode()
        archive = tar_gz({"a.bin": NEW, "b.bin": NEW})
        calls: dict[str, Callable[[], Any]] = {
            "raw.bin": lambda: self.sb.files.write_bytes("raw.bin", NEW),
            "b64.bin": lambda: self.sb.request(
                "POST", "/upload", json={"path": "b64.bin", "content_base64": payload}
            ),
            "stream.bin": lambda: self.sb.request(
                "POST",
                "/files/upload-stream",
                json={"path": "stream.bin", "content_base64": payload},
            ),
            "big.bin": lambda: self.sb.files.upload(big, "big.bin"),
            "d/a.bin": lambda: self.sb.files.extract(archive, "d", overwrite=True),
        }
        self.box.fill()
        for name, call in calls.items():
            self.assert_refused_intact(raised(call), name)
        self.assertFalse(os.path.exists(self.on_disk("d/b.bin")))
        self.assertEqual(self.box.health(), 200)
        self.assertEqual(self.sb.commands.run("echo still here").stdout, "still here\n")
        self.assertIn("raw.bin", [e["name"] for e in self.sb.files.list(".")])
        session = self.sb.pty.create()
        self.sb.pty.close(session["session_id"])

        self.box.free()
        for call in calls.values():
            call()
        for name in ("raw.bin", "b64.bin", "stream.bin", "d/a.bin", "d/b.bin"):
            with open(self.on_disk(name), "rb") as f:
                self.assertEqual(f.read(), NEW, name)
        self.assertEqual(os.path.getsize(self.on_disk("big.bin")), 9 * 1024 * 1024)

    def test_the_sdks(self) -> None:
        """
        The e2b SDK's ``files.write`` (507 as its NotEnoughSpaceException),
        the seed SDK's ``files.upload`` and MCP's ``upload`` tool.
        """
        for name in ("e2b.bin", "seed.bin", "mcp.bin"):
            self.old_file(name)
        from e2b import NotEnoughSpaceException

        e2b = self.e2b_sandbox()
        e2b_write = functools.partial(e2b.files.write, f"{self.box.base}/e2b.bin", NEW)

        def seed_upload() -> Any:
            from agent_sandbox.api.server_client import ServerClient

            async def upload() -> Any:
                async with ServerClient(self.box.url) as client:
                    return await client.files.upload(f"{self.box.base}/seed.bin", NEW)

            return asyncio.run(upload())

        def mcp_upload() -> Any:
            import anyio
            import httpx2
            from mcp.client.client import Client
            from mcp.client.streamable_http import streamable_http_client

            async def call() -> Any:
                async with httpx2.AsyncClient(timeout=20) as http:
                    transport = streamable_http_client(
                        f"{self.box.url}/mcp", http_client=http
                    )
                    async with Client(transport) as client:
                        return await client.call_tool(
                            "upload",
                            {
                                "path": "mcp.bin",
                                "content_base64": base64.b64encode(NEW).decode(),
                            },
                        )

            return anyio.run(call)

        self.box.fill()
        error = raised(e2b_write)
        self.assertIsInstance(error, NotEnoughSpaceException, repr(error))
        error = raised(seed_upload)
        self.assertEqual(
            (getattr(error, "status_code", None), getattr(error, "error_code", None)),
            (507, "insufficient_storage"),
            repr(error),
        )
        result = mcp_upload()
        self.assertTrue(result.is_error, result)
        self.assertEqual(result.structured_content["code"], "insufficient_storage")
        for name in ("e2b.bin", "seed.bin", "mcp.bin"):
            with open(self.on_disk(name), "rb") as f:
                self.assertEqual(f.read(), OLD, name)
        self.assertEqual(temporaries(self.on_disk("")), [])
        self.assertEqual(self.box.health(), 200)

        self.box.free()
        e2b_write()
        seed_upload()
        self.assertFalse(mcp_upload().is_error)
        for name in ("e2b.bin", "seed.bin", "mcp.bin"):
            with open(self.on_disk(name), "rb") as f:
                self.assertEqual(f.read(), NEW, name)

    def test_git_commit(self) -> None:
        """A commit on a full disk is 507; the branch still points where it did."""
        self.sb.git.init("repo")
        self.sb.files.write_bytes("repo/a.txt", OLD)
        self.sb.git.add("repo", all=True)
        first = self.sb.git.commit(
            "repo", "first", author={"name": "T", "email": "t@x"}
        )
        self.sb.files.write_bytes("repo/a.txt", NEW)
        self.sb.git.add("repo", all=True)
        self.box.fill()
        error = raised(
            lambda: self.sb.git.commit(
                "repo", "second", author={"name": "T", "email": "t@x"}
            )
        )
        self.assertIsInstance(error, InsufficientStorage, repr(error))
        self.assertEqual(self.sb.git.log("repo")[0]["commit"], first["commit"])
        self.assertEqual(
            [n for n in os.listdir(self.on_disk("repo/.git")) if n.endswith(".lock")],
            [],
        )
        self.box.free()
        second = self.sb.git.commit(
            "repo", "second", author={"name": "T", "email": "t@x"}
        )
        self.assertNotEqual(second["commit"], first["commit"])

    def test_e2b_several_files(self) -> None:
        """
        The e2b SDK's ``files.write_files`` of two files where only the
        first fits: NotEnoughSpaceException (507), and neither file nor a
        new directory changed: the first, written already, is taken back
        with its old content.  With room, both are written.
        """
        self.old_file("first.bin")
        self.old_file("second.bin")
        from e2b import NotEnoughSpaceException
        from e2b.sandbox.filesystem.filesystem import WriteEntry

        e2b = self.e2b_sandbox()
        small, big = os.urandom(4096), os.urandom(4 * 1024 * 1024)
        entries = [
            WriteEntry(path=f"{self.box.base}/first.bin", data=small),
            WriteEntry(path=f"{self.box.base}/new-dir/third.bin", data=small),
            WriteEntry(path=f"{self.box.base}/second.bin", data=big),
        ]
        self.box.fill()
        filler = self.box.inside(f"{self.box.root}/filler")
        # No room for the request's body (the door keeps a big one on
        # disk until it is all there), then room for the body and the
        # small files but not the big one.
        for free in (1, 6):
            os.truncate(filler, os.path.getsize(filler) - 1024 * 1024)
            if free == 6:
                os.truncate(filler, os.path.getsize(filler) - 5 * 1024 * 1024)
            error = raised(lambda: e2b.files.write_files(entries))
            self.assertIsInstance(error, NotEnoughSpaceException, f"{free} MiB free")
            if free == 1:
                # Where the body was to be held, for the operator to give room.
                self.assertIn(f"temporary directory ({self.box.root}/tmp", str(error))
            for name in ("first.bin", "second.bin"):
                with open(self.on_disk(name), "rb") as f:
                    self.assertEqual(f.read(), OLD, f"{name}, {free} MiB free")
            self.assertFalse(os.path.exists(self.on_disk("new-dir")))
            self.assertEqual(temporaries(self.on_disk("")), [])
        self.box.free()
        e2b.files.write_files(entries)
        with open(self.on_disk("first.bin"), "rb") as f:
            self.assertEqual(f.read(), small)
        self.assertEqual(os.path.getsize(self.on_disk("second.bin")), len(big))

    def test_git_switch(self) -> None:
        """
        A checkout of a branch with bigger files, and a hard reset to it,
        on a full disk: 507, and the work tree as it was (HEAD's files
        whole, none of the target's new files nor the directories made for
        them, the user's untracked file kept, the branch where it was), also
        when the call names a directory below the top; a restore from it is
        507 too; with room the checkout switches.
        """
        author = {"name": "T", "email": "t@x"}
        self.sb.git.init("r")
        small = {f"f{i}.txt": f"small {i}\n".encode() for i in range(20)}
        small["src/keep.txt"] = b"in both\n"
        for name, data in small.items():
            self.sb.files.write_bytes(f"r/{name}", data)
        self.sb.git.add("r", all=True)
        self.sb.git.commit("r", "small", author=author)
        self.sb.git.checkout("r", "big", create=True)
        big = {name: base64.b64encode(os.urandom(100_000)) for name in small}
        big["src/keep.txt"] = small["src/keep.txt"]
        big["new/deep/n.txt"] = base64.b64encode(os.urandom(100_000))
        for name, data in big.items():
            self.sb.files.write_bytes(f"r/{name}", data)
        self.sb.git.add("r", all=True)
        self.sb.git.commit("r", "big", author=author)
        self.sb.git.checkout("r", "main")
        self.sb.files.write_bytes("r/local.txt", OLD)
        expected = {**small, "local.txt": OLD}

        def tree() -> dict[str, bytes]:
            return self.work_tree("r")

        self.box.fill()
        calls: dict[str, Callable[[], Any]] = {
            "checkout": lambda: self.sb.git.checkout("r", "big"),
            # Named by a directory below the top: git's paths are the top's.
            "reset": lambda: self.sb.request(
                "POST",
                "/git/reset",
                json={"path": "r/src", "mode": "hard", "target": "big"},
            ),
        }
        for what, call in calls.items():
            error = raised(call)
            self.assertIsInstance(error, InsufficientStorage, f"{what}: {error!r}")
            self.assertIn("put back as it was", str(error))
            self.assertEqual(tree(), expected, what)
            # The directories made for the new file went with it.
            self.assertFalse(os.path.exists(self.on_disk("r/new")), what)
            # (git status itself refreshes the index, which a full disk refuses.)
            status = self.sb.commands.run(
                "sh -c 'cd r && git symbolic-ref --short HEAD"
                "; git diff --name-only HEAD; git ls-files --others'"
            )
            self.assertEqual(status.stdout, "main\nlocal.txt\n", f"{what}: {status}")
        # A restore of a file from the other branch: git says only that it
        # could not write it, and the disk is full: 507, not git_error.
        error = raised(
            lambda: self.sb.request(
                "POST",
                "/git/restore",
                json={"path": "r", "files": ["f1.txt"], "source": "big"},
            )
        )
        self.assertIsInstance(error, InsufficientStorage, f"restore: {error!r}")
        self.box.free()
        self.sb.git.checkout("r", "big", force=True)
        self.assertEqual(tree(), {**big, "local.txt": OLD})

    def test_git_restore_and_pop(self) -> None:
        """
        A restore over the user's edits, and a stash pop of bigger files
        with an untracked one, each stopped by a full disk half-way: 507,
        and the work tree as it was (the user's edits whole, nothing of
        the stash's, the stash kept); with room both do their work.
        """
        author = {"name": "T", "email": "t@x"}
        self.sb.git.init("r")
        big = {f"f{i}.txt": base64.b64encode(os.urandom(100_000)) for i in range(20)}
        for name, data in big.items():
            self.sb.files.write_bytes(f"r/{name}", data)
        self.sb.git.add("r", all=True)
        self.sb.git.commit("r", "big", author=author)
        edits = {name: f"the user's edit of {name}\n".encode() for name in big}
        for name, data in edits.items():
            self.sb.files.write_bytes(f"r/{name}", data)
        self.sb.files.write_bytes("r/local.txt", OLD)

        def tree() -> dict[str, bytes]:
            return self.work_tree("r")

        def stashes() -> str:
            return self.sb.commands.run("sh -c 'cd r && git stash list'").stdout

        restore = {"path": "r", "files": ["."]}
        expected = tree()
        self.box.fill()
        error = raised(lambda: self.sb.request("POST", "/git/restore", json=restore))
        self.assertIsInstance(error, InsufficientStorage, f"restore: {error!r}")
        self.assertIn("put back as it was", str(error))
        self.assertEqual(tree(), expected)
        self.box.free()
        self.sb.request("POST", "/git/restore", json=restore)
        self.assertEqual(tree(), {**big, "local.txt": OLD})

        # Small files committed (the untracked one with them); the big ones
        # and a new one in new directories stashed over them.
        small = {name: f"small {name}\n".encode() for name in big}
        small["local.txt"] = OLD
        for name, data in small.items():
            self.sb.files.write_bytes(f"r/{name}", data)
        self.sb.git.add("r", all=True)
        self.sb.git.commit("r", "small", author=author)
        for name, data in big.items():
            self.sb.files.write_bytes(f"r/{name}", data)
        deep = base64.b64encode(os.urandom(100_000))
        self.sb.files.write_bytes("r/new/deep/n.txt", deep)
        self.sb.request("POST", "/git/stash", json={"path": "r"})
        self.assertEqual(tree(), small)
        self.assertEqual(len(stashes().splitlines()), 1)
        pop = {"path": "r", "action": "pop"}
        self.box.fill(room=300_000)
        error = raised(lambda: self.sb.request("POST", "/git/stash", json=pop))
        self.assertIsInstance(error, InsufficientStorage, f"pop: {error!r}")
        self.assertIn("put back as it was", str(error))
        self.assertEqual(tree(), small)
        self.assertFalse(os.path.exists(self.on_disk("r/new")))
        self.box.free()
        self.assertEqual(len(stashes().splitlines()), 1)
        self.sb.request("POST", "/git/stash", json=pop)
        self.assertEqual(tree(), {**small, **big, "new/deep/n.txt": deep})
        self.assertEqual(stashes(), "")

    def test_git_stash_push_and_hard_reset(self) -> None:
        """
        A stash push and a hard reset over the user's local changes, each
        stopped by a full disk half-way: 507, the changes as they were
        (a reset's put-back is the user's edits, not HEAD's files), no
        stash left by the push; with room both do their work.
        """
        author = {"name": "T", "email": "t@x"}
        self.sb.git.init("r")

        def commit(branch: str) -> dict[str, bytes]:
            files = {
                f"f{i}.txt": base64.b64encode(os.urandom(100_000)) for i in range(20)
            }
            files["same.txt"] = b"the same in both\n"
            for name, data in files.items():
                self.sb.files.write_bytes(f"r/{name}", data)
            self.sb.git.add("r", all=True)
            self.sb.git.commit("r", branch, author=author)
            return files

        big = commit("main")
        self.sb.git.checkout("r", "other", create=True)
        other = commit("other")
        self.sb.git.checkout("r", "main")
        edits = {name: f"the user's edit of {name}\n".encode() for name in big}
        for name, data in edits.items():
            self.sb.files.write_bytes(f"r/{name}", data)
        self.sb.files.write_bytes("r/new/u.txt", OLD)
        expected = {**edits, "new/u.txt": OLD}
        self.assertEqual(self.work_tree("r"), expected)

        self.box.fill(room=300_000)
        push = {"path": "r", "action": "push"}
        error = raised(lambda: self.sb.request("POST", "/git/stash", json=push))
        self.assertIsInstance(error, InsufficientStorage, f"push: {error!r}")
        self.assertIn("put back as it was", str(error))
        self.assertEqual(self.work_tree("r"), expected)
        reset = {"path": "r", "mode": "hard", "target": "other"}
        error = raised(lambda: self.sb.request("POST", "/git/reset", json=reset))
        self.assertIsInstance(error, InsufficientStorage, f"reset: {error!r}")
        self.assertIn("put back as it was", str(error))
        self.assertEqual(self.work_tree("r"), expected)
        self.box.free()
        status = self.sb.commands.run(
            "sh -c 'cd r && git stash list; git symbolic-ref --short HEAD'"
        )
        self.assertEqual(status.stdout, "main\n")

        self.sb.request("POST", "/git/stash", json=push)
        self.assertEqual(self.work_tree("r"), big)
        self.sb.request("POST", "/git/stash", json={"path": "r", "action": "pop"})
        self.assertEqual(self.work_tree("r"), expected)
        self.sb.request("POST", "/git/reset", json=reset)
        self.assertEqual(self.work_tree("r"), {**other, "new/u.txt": OLD})

    def work_tree(self, repo: str) -> dict[str, bytes]:
        """The files of ``repo``'s work tree, by path, and their bytes."""
        return work_tree(self.on_disk(repo))

    def test_git_init(self) -> None:
        """
        A repository made on a full disk is 507 and leaves nothing: no
        half-made directory, no ``.git`` in a directory that was there
        (empty, or with the user's files), for a bare one neither; once
        there is room the same calls make the repositories.
        """
        self.sb.files.mkdir("empty")
        self.sb.files.mkdir("work")
        self.sb.files.write_bytes("work/a.txt", OLD)
        self.sb.files.mkdir("bare-here")
        calls: dict[str, Callable[[], Any]] = {
            "new": lambda: self.sb.git.init("new"),
            "empty": lambda: self.sb.git.init("empty"),
            "work": lambda: self.sb.git.init("work"),
            "bare": lambda: self.sb.git.init("bare", bare=True),
            "bare-here": lambda: self.sb.git.init("bare-here", bare=True),
        }
        self.box.fill()
        for name, call in calls.items():
            error = raised(call)
            self.assertIsInstance(error, InsufficientStorage, f"{name}: {error!r}")
        self.assertFalse(os.path.exists(self.on_disk("new")))
        self.assertFalse(os.path.exists(self.on_disk("bare")))
        self.assertEqual(os.listdir(self.on_disk("empty")), [])
        self.assertEqual(os.listdir(self.on_disk("bare-here")), [])
        self.assertEqual(os.listdir(self.on_disk("work")), ["a.txt"])
        with open(self.on_disk("work/a.txt"), "rb") as f:
            self.assertEqual(f.read(), OLD)
        self.box.free()
        for call in calls.values():
            call()
        for name in ("new", "empty", "work"):
            self.assertTrue(os.path.isfile(self.on_disk(f"{name}/.git/HEAD")), name)
        for name in ("bare", "bare-here"):
            self.assertTrue(os.path.isfile(self.on_disk(f"{name}/HEAD")), name)

    def test_code_output(self) -> None:
        """
        A code context's display item too big to answer inline, on a full
        disk: reported ``dropped``, the execution ends ``ok``; once there is
        room, the next one is kept and served.
        """
        need_ipykernel()
        cid = self.sb.code.create_context()["id"]
        self.box.fill()
        result = self.sb.code.execute(cid, "display('x' * 5000)", wait=60)
        self.assertEqual(result["state"], "ok", result)
        [item] = [r for r in result["results"] if r.get("refs")]
        self.assertEqual([r.get("dropped") for r in item["refs"]], [True])
        self.box.free()
        result = self.sb.code.execute(cid, "display('y' * 5000)", wait=60)
        [item] = [r for r in result["results"] if r.get("refs")]
        [ref] = item["refs"]
        with urllib.request.urlopen(self.box.url + ref["url"], timeout=10) as r:
            self.assertIn(b"y" * 5000, r.read())

    def test_code_context(self) -> None:
        """
        A code context started on a full disk (its kernel's connection file
        has no room), through our client and ``e2b_code_interpreter``: 507;
        no new context listed and nothing of it left in the temporary
        directory; the live contexts keep their state, and one restarted
        there gets a fresh kernel (its old connection file's room is
        enough).  Once there is room the same calls start contexts.
        """
        need_ipykernel()
        try:
            from e2b_code_interpreter import Sandbox as CodeSandbox
        except ImportError:
            raise SkipTest("e2b-code-interpreter is not installed") from None
        self.e2b_sandbox()  # its environment, for the code interpreter's
        code = CodeSandbox.create()
        # A context while there was room: the daemon's temporary directory
        # is its own from then on (Python's first choice of one skips a
        # directory it cannot write a file in).
        live = self.sb.code.create_context()["id"]
        self.sb.code.execute(live, "x = 6 * 7", wait=60)
        e2b_live = code.create_code_context()
        code.run_code("y = 7", context=e2b_live)
        tmp = self.box.inside(f"{self.box.root}/tmp")
        before = {n: sorted(os.listdir(f"{tmp}/{n}")) for n in os.listdir(tmp)}
        self.box.fill()
        error = raised(self.sb.code.create_context)
        self.assertIsInstance(error, InsufficientStorage, repr(error))
        error = raised(code.create_code_context)
        self.assertIn("507", str(error))
        self.assertEqual(
            sorted(c["id"] for c in self.sb.code.contexts()),
            sorted([live, e2b_live.id]),
        )
        self.assertEqual(
            {n: sorted(os.listdir(f"{tmp}/{n}")) for n in os.listdir(tmp)}, before
        )
        result = self.sb.code.execute(live, "x", wait=60)
        self.assertEqual(result["results"][0]["data"]["text/plain"], "42", result)
        self.assertEqual(code.run_code("y", context=e2b_live).text, "7")
        self.assertEqual(self.sb.code.restart(live)["restarts"], 1)
        result = self.sb.code.execute(live, "x", wait=60)
        self.assertEqual(result["error"]["ename"], "NameError", result)
        self.box.free()
        cid = self.sb.code.create_context()["id"]
        self.assertEqual(self.sb.code.execute(cid, "6 * 7", wait=60)["state"], "ok")
        self.assertEqual(code.run_code("6 * 7").text, "42")
        self.assertFalse(
            re.search(r"Traceback|Unhandled", self.box.log()), self.box.log()
        )

    def test_own_logs(self) -> None:
        """
        The daemon's own writes (audit file and log) on a full disk never
        stop it answering; once there is room, the audit file goes on with
        whole lines.
        """
        self.box.fill()
        started = self.box.cpu_seconds()
        for i in range(50):
            self.assertEqual(self.box.health(), 200)
            with self.assertRaises(SandboxError):
                self.sb.files.read_bytes(f"missing-{i}")
            self.sb.files.stat(".")
        self.assertLess(self.box.cpu_seconds() - started, 10)
        self.box.free()
        self.sb.files.stat("after-free")
        audit = self.box.inside(f"{self.box.root}/log/audit.log")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with open(audit, "rb") as f:
                lines = f.read().split(b"\n")
            if any(b"after-free" in line for line in lines):
                break
            time.sleep(0.1)
        self.assertEqual(lines[-1], b"", "the file ends with a whole line")
        records = [json.loads(line) for line in lines[:-1]]
        self.assertTrue(
            any("after-free" in r.get("query", "") for r in records), records[-3:]
        )
        self.assertFalse(
            re.search(r"Traceback|Unhandled", self.box.log()), self.box.log()
        )


class LinkStateFullDiskTests(SynchronousTestCase):
    """
    Capability links whose state (``--state-dir`` with a key file) cannot be
    written because the disk is full, through our client: a mint is refused
    and makes nothing; a revocation holds at once but says it was not kept;
    a counted link's use is refused rather than given back by a restart.
    """

    def setUp(self) -> None:
        key = os.path.join(self.mktemp())
        with open(key, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        self.box = BoxedDaemon(
            self,
            disk="16m",
            state=True,
            policy={"auth": {"link_key_file": os.path.abspath(key)}},
        )
        self.sb = Sandbox(self.box.url, timeout=20, retries=0)
        self.addCleanup(self.sb.close)

    def presented(self, token: str) -> tuple[int | None, str | None]:
        """``(status, code)`` of ``GET /system/info`` with the link's token."""
        with Sandbox(self.box.url, token=token, timeout=20, retries=0) as linked:
            return error_of(lambda: linked.request("GET", "/system/info"))

    def test_mint_revoke_use(self) -> None:
        """
        On a full disk: mint 507 and no new link listed; revoke 507 with the
        link refused from then on; a counted link's use 507 and not counted.
        Once there is room: the revocation is kept and the use counted.
        """
        kept = self.sb.links.mint("console")
        counted = self.sb.links.mint("console", uses=2)
        listed = self.sb.links.list()
        self.box.fill()
        for call in (
            lambda: self.sb.links.mint("console"),
            lambda: self.sb.links.revoke(kept["link_id"]),
        ):
            error = raised(call)
            self.assertIsInstance(error, InsufficientStorage, repr(error))
        self.assertEqual(self.presented(kept["token"]), (401, "link_invalid"))
        self.assertEqual(
            self.presented(counted["token"]), (507, "insufficient_storage")
        )
        now = self.sb.links.list()
        self.assertEqual([x["link_id"] for x in now], [x["link_id"] for x in listed])
        self.assertEqual([x["used"] for x in now], [0, 0])
        self.box.free()
        self.assertTrue(self.sb.links.revoke(kept["link_id"])["revoked"])
        self.assertEqual(self.presented(counted["token"]), (200, None))
        with open(self.box.inside(f"{self.box.root}/state/links.json")) as f:
            state = {x["jti"]: x for x in json.load(f)["links"]}
        self.assertTrue(state[kept["link_id"]]["revoked"])
        self.assertEqual(state[counted["link_id"]]["used"], 1)


class PullFullDiskTests(SynchronousTestCase):
    """
    A pull whose fast-forward meets a full disk, from a loopback remote
    (``git http-backend`` over TLS, in a process of its own), through our
    client: 507, the work tree as it was, the fetched commit kept.
    """

    def setUp(self) -> None:
        if (why := remote_missing()) is not None:
            raise SkipTest(why)
        directory = os.path.realpath(self.mktemp())
        os.makedirs(directory)
        self.server = subprocess.Popen(
            [sys.executable, "-m", "tests.git.remote", directory],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(self.server.wait)
        self.addCleanup(self.server.kill)
        assert self.server.stdout is not None
        port = int(self.server.stdout.readline())
        ca = self.server.stdout.readline().strip()
        self.url = f"https://127.0.0.1:{port}/repo.git"
        self.work = os.path.join(directory, "seed-repo.git")
        self.bare = os.path.join(directory, "srv", "repo.git")
        policy = {
            "groups": {"git": True},
            "git": {"ca_file": ca, "author": {"name": "T", "email": "t@x"}},
            "endpoints": {"group:git": {"params": {"block_private_networks": False}}},
        }
        self.box = BoxedDaemon(self, disk="16m", policy=policy)
        self.sb = Sandbox(self.box.url, timeout=60, retries=0)
        self.addCleanup(self.sb.close)

    def test_fast_forward(self) -> None:
        """
        The remote gains twenty big files, one in a directory where the
        user has untracked files of their own; a pull on a full disk is 507
        and leaves none of them, the local edit and the user's files kept
        and HEAD where it was; with room the same pull brings them.
        """
        clone = self.sb.request(
            "POST", "/git/clone", json={"url": self.url, "path": "r", "wait": 30}
        )
        self.assertEqual(clone["state"], "done", clone)
        big = {f"f{i}.txt": base64.b64encode(os.urandom(100_000)) for i in range(20)}
        # Written first (git goes in path order), into the user's directory.
        big["a-new/x.txt"] = base64.b64encode(os.urandom(100_000))
        for name, data in big.items():
            os.makedirs(os.path.dirname(os.path.join(self.work, name)), exist_ok=True)
            with open(os.path.join(self.work, name), "wb") as f:
                f.write(data)
        remote_git(self.work, "add", "-A")
        remote_git(self.work, "commit", "-q", "-m", "big")
        remote_git(self.work, "push", "-q", self.bare, "main")
        self.sb.files.write_bytes("r/README", b"a local edit\n")
        self.sb.files.write_bytes("r/a-new/mine.txt", b"the user's own\n")
        expected = {"README": b"a local edit\n", "a-new/mine.txt": b"the user's own\n"}
        root = self.box.inside(f"{self.box.base}/r")

        def tree() -> dict[str, bytes]:
            return work_tree(root)

        self.assertEqual(tree(), expected)
        # Room for the fetched objects, not for the files as well.
        self.box.fill(room=2_900_000)
        pull = {"path": "r", "wait": 30}
        error = raised(lambda: self.sb.request("POST", "/git/pull", json=pull))
        self.assertIsInstance(error, InsufficientStorage, repr(error))
        self.assertIn("put back as it was", str(error))
        self.assertEqual(tree(), expected)
        self.box.free()
        head = self.sb.commands.run("sh -c 'cd r && git log --format=%s'")
        self.assertEqual(head.stdout, "seed\n")
        done = self.sb.request("POST", "/git/pull", json=pull)
        self.assertEqual(done["state"], "done", done)
        self.assertEqual(tree(), {**expected, **big})

    def test_merge_after_a_rename(self) -> None:
        """
        A merge where this side renamed a file the remote changed (git
        carries the change to the new name and writes nothing at the old
        one, where the user now keeps an untracked file): on a full disk
        507, and the put-back removes the remote's new files but not the
        user's file at the old name.
        """
        self.sb.request(
            "POST", "/git/clone", json={"url": self.url, "path": "r", "wait": 30}
        )
        text = "".join(f"line {i}\n" for i in range(200))
        with open(os.path.join(self.work, "README"), "w") as f:
            f.write(text)
        remote_git(self.work, "commit", "-q", "-a", "-m", "long readme")
        remote_git(self.work, "push", "-q", self.bare, "main")
        self.sb.request("POST", "/git/pull", json={"path": "r", "wait": 30})
        # Theirs: the readme changed, big files added.
        with open(os.path.join(self.work, "README"), "w") as f:
            f.write(text + "theirs\n")
        big = {f"f{i}.txt": base64.b64encode(os.urandom(100_000)) for i in range(20)}
        for name, data in big.items():
            with open(os.path.join(self.work, name), "wb") as f:
                f.write(data)
        remote_git(self.work, "add", "-A")
        remote_git(self.work, "commit", "-q", "-m", "theirs")
        remote_git(self.work, "push", "-q", self.bare, "main")
        # Ours: the readme renamed, then a file of the user's at the old name.
        self.sb.commands.run("sh -c 'cd r && git mv README README.md'")
        self.sb.git.commit("r", "renamed")
        self.sb.files.write_bytes("r/README", b"the user's own\n")
        root = self.box.inside(f"{self.box.base}/r")
        expected = work_tree(root)
        self.box.fill(room=2_900_000)
        pull = {"path": "r", "ff_only": False, "wait": 30}
        error = raised(lambda: self.sb.request("POST", "/git/pull", json=pull))
        self.assertIsInstance(error, InsufficientStorage, repr(error))
        self.assertIn("put back as it was", str(error))
        self.assertEqual(work_tree(root), expected)
        self.box.free()
        done = self.sb.request("POST", "/git/pull", json=pull)
        self.assertEqual(done["state"], "done", done)
        merged = work_tree(root)
        self.assertEqual(merged["README"], b"the user's own\n")
        self.assertTrue(merged["README.md"].endswith(b"theirs\n"))


class OpenAIStateFullDiskTests(SynchronousTestCase):
    """
    The ``/v1`` door's records kept in a state directory on a disk that
    fills, through the ``openai`` SDK: a change made while the disk is full
    is written once there is room, without another call.
    """

    def test_deleted_credential_kept_once_there_is_room(self) -> None:
        """
        A credential deleted on a full disk is still in the file (its older
        state) until there is room; then, within the retry's delay, the
        file no longer holds it (a restart would not bring it back).
        """
        import openai

        from sandboxd.policy import defaults

        box = BoxedDaemon(
            self, disk="16m", state=True, policy={"groups": {"agents": True}}
        )
        client = openai.OpenAI(base_url=f"{box.url}/v1", api_key="local")
        self.addCleanup(client.close)
        vault = client.beta.agents.vaults.create(name="v")
        credential = client.beta.agents.vaults.credentials.create(
            vault.id,
            name="docs",
            auth={
                "type": "static_bearer",
                "mcp_server_url": "https://mcp.example.com/mcp",
                "token": "secret-token",
            },
        )
        path = box.inside(f"{box.root}/state/openai/credentials.json")

        def kept() -> list[str]:
            try:
                with open(path) as f:
                    return [r["id"] for r in json.load(f)["records"]]
            except FileNotFoundError:
                return []

        def wait_for(ids: list[str], seconds: float) -> list[str]:
            deadline = time.monotonic() + seconds
            while (now := kept()) != ids and time.monotonic() < deadline:
                time.sleep(0.1)
            return now

        self.assertEqual(wait_for([credential.id], 10), [credential.id])
        box.fill()
        client.beta.agents.vaults.credentials.delete(credential.id, vault_id=vault.id)
        time.sleep(defaults.OPENAI_STATE_SAVE_DELAY_SECONDS + 1)
        self.assertEqual(kept(), [credential.id])
        box.free()
        self.assertEqual(wait_for([], defaults.OPENAI_STATE_RETRY_SECONDS + 10), [])
        self.assertIn("is kept again", box.log())


def fd_count(pid: int) -> int:
    """How many descriptors ``pid`` has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def error_of(fn: Callable[[], Any]) -> tuple[int | None, str | None]:
    """``(status, code)`` of the client error ``fn()`` raised (``(200, None)``: none)."""
    try:
        fn()
    except SandboxError as e:
        return e.status, e.code
    return 200, None


class DescriptorTests(SynchronousTestCase):
    """
    The daemon at its ``RLIMIT_NOFILE``: connections over it are closed
    at once without the listener spinning, calls that need a descriptor
    are 503 ``unavailable``, and everything works again once the holders
    let go, with no descriptor leaked.
    """

    #: Low enough to reach with a few hundred sockets, high enough to start.
    nofile = 160

    def fill_descriptors(self, box: BoxedDaemon) -> list[socket.socket]:
        """
        Connections held open until the daemon is at its descriptor limit
        (bounded wait): the list, closed at the test's end.
        """
        holders: list[socket.socket] = []
        self.addCleanup(lambda: [s.close() for s in holders])
        for _ in range(self.nofile + 40):
            holders.append(socket.create_connection(("127.0.0.1", box.port)))
        deadline = time.monotonic() + 10
        while fd_count(box.proc.pid) < self.nofile - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        return holders

    def test_at_the_limit(self) -> None:
        """Files, a watch, a process, a terminal at the limit; recovery after."""
        box = BoxedDaemon(self, nofile=self.nofile)
        sb = Sandbox(box.url, timeout=20, retries=0)
        self.addCleanup(sb.close)
        sb.files.write_bytes("a.txt", OLD)
        # The client's one kept-alive connection carries the calls made at
        # the limit: a new connection then is closed as soon as accepted.
        baseline = fd_count(box.proc.pid)
        holders = self.fill_descriptors(box)
        self.assertGreaterEqual(fd_count(box.proc.pid), self.nofile - 1)

        # At the limit, with more connections knocking: the daemon idles.
        started = box.cpu_seconds()
        knocks = time.monotonic() + 2
        while time.monotonic() < knocks:
            try:
                socket.create_connection(("127.0.0.1", box.port), timeout=1).close()
            except OSError:
                pass
            time.sleep(0.01)
        self.assertLess(box.cpu_seconds() - started, 1.0)

        refused = (503, "unavailable")
        self.assertEqual(error_of(lambda: sb.files.read_bytes("a.txt")), refused)
        self.assertEqual(error_of(lambda: sb.commands.run("true")), refused)
        self.assertEqual(error_of(lambda: sb.commands.start("sleep 30")), refused)
        self.assertEqual(error_of(lambda: sb.pty.create()), refused)
        self.assertEqual(error_of(lambda: sb.files.watch(".")), refused)
        self.assertEqual(sb.commands.list(), [])
        # Last: an upload refused before its body has all arrived (the
        # client may send the head and the body in two writes) ends its
        # connection after the answer, and a new one is closed as soon
        # as accepted at the limit.
        self.assertEqual(error_of(lambda: sb.files.write_bytes("b.txt", NEW)), refused)
        self.assertFalse(os.path.exists(f"{box.base}/b.txt"))
        self.assertEqual(temporaries(box.base), [])

        for s in holders:
            s.close()
        holders.clear()
        deadline = time.monotonic() + 10
        while fd_count(box.proc.pid) > baseline and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertLessEqual(fd_count(box.proc.pid), baseline)
        self.assertEqual(box.health(), 200)
        self.assertEqual(sb.files.read_bytes("a.txt"), OLD)
        sb.files.write_bytes("b.txt", NEW)
        self.assertEqual(sb.commands.run("echo ok").stdout, "ok\n")
        session = sb.pty.create()
        sb.pty.close(session["session_id"])
        self.assertLessEqual(fd_count(box.proc.pid), baseline + 2)

    def test_refused_connections_logged_in_bounds(self) -> None:
        """
        500 connections closed at once at the limit add a few lines to the
        daemon's log, not three each (a client retrying in a loop would
        fill the log's disk): one line says how many went unlogged.
        """
        box = BoxedDaemon(self, nofile=self.nofile)
        holders = self.fill_descriptors(box)
        time.sleep(0.5)
        before = len(box.log().splitlines())
        for _ in range(500):
            try:
                with socket.create_connection(("127.0.0.1", box.port), timeout=2) as s:
                    s.recv(1)
            except OSError:
                pass
        time.sleep(0.5)
        added = box.log().splitlines()[before:]
        self.assertLess(len(added), 10, "\n".join(added[:20]))
        self.assertEqual(box.health(), None)  # still at the limit
        for s in holders:
            s.close()
        holders.clear()
        deadline = time.monotonic() + 10
        while box.health(1) != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(box.health(), 200)


class ProcessLimitTests(DaemonTestCase):
    """
    The daemon at the pid limit, where every fork answers ``EAGAIN`` (a
    pids cgroup at ``pids.max``; a user at ``RLIMIT_NPROC``): a command, a
    background process, a terminal, git, a code run, a code context and the
    browser's worker are 503 ``unavailable``, nothing half-started is
    listed, and they start again once forks succeed.
    """

    policy = {"groups": {"git": True, "dev_tools": True, "code": True, "browser": True}}
    timeout = 120

    @inlineCallbacks
    def test_at_the_limit(self) -> Any:
        """Each kind of start refused with Retry-After; none listed; all start after."""
        os.makedirs(os.path.join(self.base_dir, "repo"))
        reply = yield self.request("POST", "/git/init", {"path": "repo"})
        self.assertEqual(reply.status, 200, reply.body)

        def refuse(*_: Any, **__: Any) -> Any:
            raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))

        spawns = self.patch(posix_spawn, "_call", refuse)
        forks = self.patch(os, "fork", refuse)  # Twisted forks a terminal's shell
        starts = (
            ("/shell", {"command": "true"}),
            ("/process/start", {"command": "sleep 30"}),
            ("/pty/sessions", {}),
            (
                "/git/commit",
                {
                    "path": "repo",
                    "message": "m",
                    "allow_empty": True,
                    "author": {"name": "T", "email": "t@example.com"},
                },
            ),
            ("/code/run", {"language": "bash", "code": "true"}),
        )
        for path, body in starts:
            reply = yield self.request("POST", path, body)
            got = (reply.status, reply.json()["code"], reply.json()["type"])
            self.assertEqual(got, (503, "unavailable", "ResourceError"), path)
            self.assertEqual(reply.header("retry-after"), "1", path)
        self.patch(supervisor, "playwright_installed", lambda: True)
        browser = self.patch(supervisor, "spawn_session", refuse)
        reply = yield self.request("POST", "/browser/evaluate", {"script": "1"})
        got = (reply.status, reply.json()["code"], reply.json()["type"])
        self.assertEqual(got, (503, "unavailable", "ResourceError"), "browser")
        browser.restore()
        listed = yield self.request("GET", "/process/list")
        self.assertEqual(listed.json()["processes"], [])
        sessions = yield self.request("GET", "/pty/sessions")
        self.assertEqual(sessions.json()["sessions"], [])
        if "python3" in find_kernelspecs(os.environ):
            reply = yield self.request("POST", "/code/contexts", {})
            got = (reply.status, reply.json()["code"], reply.json()["type"])
            self.assertEqual(got, (503, "unavailable", "ResourceError"))
            listed = yield self.request("GET", "/code/contexts")
            self.assertEqual(listed.json()["contexts"], [])

        spawns.restore()
        forks.restore()
        for path, body in starts:
            reply = yield self.request("POST", path, body)
            self.assertEqual(reply.status, 200, (path, reply.body))
        listed = yield self.request("GET", "/process/list")
        self.assertEqual(len(listed.json()["processes"]), 1)


def body_sent(port: int, target: str, length: int, test: SynchronousTestCase) -> None:
    """
    A POST whose body (``Content-Length: length``) a thread sends as fast
    as the daemon takes it, until the connection ends: an upload under
    way, with a chunk most likely being written when the daemon stops.
    """
    conn = socket.create_connection(("127.0.0.1", port))
    test.addCleanup(conn.close)
    head = (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    conn.sendall(head.encode())
    chunk = b"x" * 65536

    def send() -> None:
        with contextlib.suppress(OSError):
            for _ in range(length // len(chunk)):
                conn.sendall(chunk)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    test.addCleanup(sender.join, 10)


class StopTests(SynchronousTestCase):
    """A daemon told to stop (SIGTERM, as ``docker stop`` or Kubernetes does)."""

    def tree_and_mount(self, box: BoxedDaemon) -> None:
        """
        ``tree`` (two sparse files of 1 GiB: made at once, copied as zeros)
        and ``mnt``, a tmpfs: a move of one into the other copies for a
        while.
        """
        os.mkdir(f"{box.base}/mnt")
        tmpfs(self, f"{box.base}/mnt", "3g")
        os.mkdir(f"{box.base}/tree")
        for name in ("a", "b"):
            with open(f"{box.base}/tree/{name}", "wb") as f:
                f.truncate(2**30)

    def moving(self, box: BoxedDaemon, source: str, destination: str) -> None:
        """``POST /files/move`` of ``source`` to ``destination``, sent by a thread."""

        def move() -> None:
            request = urllib.request.Request(
                f"{box.url}/files/move",
                data=json.dumps(
                    {"source": source, "destination": destination}
                ).encode(),
                headers={"Content-Type": "application/json"},
            )
            with contextlib.suppress(OSError):
                urllib.request.urlopen(request, timeout=60).read()

        mover = threading.Thread(target=move, daemon=True)
        mover.start()
        self.addCleanup(mover.join, 60)

    def copy_begun(self, box: BoxedDaemon) -> None:
        """Until the copy's temporary name shows in ``mnt`` (bounded)."""
        deadline = time.monotonic() + 10
        while not os.listdir(f"{box.base}/mnt") and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertTrue(TEMPORARY_NAME.match(os.listdir(f"{box.base}/mnt")[0]))

    def assert_given_up(self, box: BoxedDaemon) -> None:
        """No part of the copy left (within 5 s); the source whole where it was."""
        deadline = time.monotonic() + 5
        while os.listdir(f"{box.base}/mnt") and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(os.listdir(f"{box.base}/mnt"), [])
        self.assertEqual(sorted(os.listdir(f"{box.base}/tree")), ["a", "b"])
        self.assertEqual(os.path.getsize(f"{box.base}/tree/a"), 2**30)

    def test_uploads_under_way_leave_nothing(self) -> None:
        """
        Raw writes and a resumable upload's append still receiving their
        bodies when the daemon stops leave no temporary file and no
        directory made for them in the user's tree; a file they were
        replacing keeps its bytes.
        """
        box = BoxedDaemon(self)
        with open(f"{box.base}/kept.txt", "wb") as f:
            f.write(OLD)
        self.three_under_way(box)
        box.stop()
        self.assertEqual(box.proc.returncode, 0)
        self.assertEqual(os.listdir(box.base), ["kept.txt"])
        with open(f"{box.base}/kept.txt", "rb") as f:
            self.assertEqual(f.read(), OLD)

    def test_uploads_under_way_leave_no_file_when_killed(self) -> None:
        """
        The same uploads when the daemon is killed (``SIGKILL``, as the OOM
        killer or a supervisor out of patience does it): nothing ran to
        clean up, and still no file of theirs is left in the user's tree
        (they had no name yet); the file they were replacing keeps its
        bytes.  The directories made for them stay.
        """
        box = BoxedDaemon(self)
        with open(f"{box.base}/kept.txt", "wb") as f:
            f.write(OLD)
        self.three_under_way(box)
        box.proc.kill()
        box.proc.wait(10)
        files = [
            os.path.relpath(os.path.join(top, name), box.base)
            for top, _, names in os.walk(box.base)
            for name in names
        ]
        self.assertEqual(files, ["kept.txt"])
        with open(f"{box.base}/kept.txt", "rb") as f:
            self.assertEqual(f.read(), OLD)

    def three_under_way(self, box: BoxedDaemon) -> None:
        """
        Two raw writes (a new file in new directories, a replacement) and a
        resumable upload's append, each receiving its body, until all
        three have their files open (bounded).
        """
        made = json.loads(
            urllib.request.urlopen(
                urllib.request.Request(
                    f"{box.url}/files/uploads",
                    data=json.dumps({"path": "up/big.bin", "size": 9 * 10**7}).encode(),
                    headers={"Content-Type": "application/json"},
                ),
                timeout=20,
            ).read()
        )
        length = 9 * 10**7
        body_sent(box.port, "/files/raw?path=new/dir/raw.bin", length, self)
        body_sent(box.port, "/files/raw?path=kept.txt", length, self)
        body_sent(
            box.port, f"/files/uploads/{made['upload_id']}?offset=0", length, self
        )

        def staged() -> list[str]:
            named = [
                name
                for _, _, names in os.walk(box.base)
                for name in names
                if TEMPORARY_NAME.match(name)
            ]
            return named + unnamed_files(box.base, box.proc.pid)

        deadline = time.monotonic() + 10
        while len(staged()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(len(staged()), 3, staged())

    def test_a_move_across_file_systems_is_given_up(self) -> None:
        """
        A move whose copy to another file system is under way when the
        daemon stops is given up at once (a stop neither waits for a big
        tree nor is cut off by the supervisor's kill halfway through):
        the source is where it was, whole, and no part of the copy is left.
        """
        box = BoxedDaemon(self)
        self.tree_and_mount(box)
        self.moving(box, "tree", "mnt/tree")
        self.copy_begun(box)
        began = time.monotonic()
        box.stop()
        self.assertLess(time.monotonic() - began, 5)
        self.assertEqual(box.proc.returncode, 0)
        self.assert_given_up(box)

    def test_a_file_moved_across_file_systems_leaves_no_copy_when_killed(
        self,
    ) -> None:
        """
        A file moved on its own to another file system is copied into a file
        with no name until it is whole: a daemon killed during the copy
        (``SIGKILL``) leaves nothing at the destination, and the source is
        where it was, whole.
        """
        box = BoxedDaemon(self)
        os.mkdir(f"{box.base}/mnt")
        tmpfs(self, f"{box.base}/mnt", "3g")
        with open(f"{box.base}/big", "wb") as f:
            f.truncate(2**30)
        self.moving(box, "big", "mnt/big")
        deadline = time.monotonic() + 10
        while (
            not unnamed_files(f"{box.base}/mnt", box.proc.pid)
            and time.monotonic() < deadline
        ):
            time.sleep(0.005)
        self.assertEqual(os.listdir(f"{box.base}/mnt"), [])
        self.assertTrue(unnamed_files(f"{box.base}/mnt", box.proc.pid))
        box.proc.kill()
        box.proc.wait(10)
        self.assertEqual(os.listdir(f"{box.base}/mnt"), [])
        self.assertEqual(os.path.getsize(f"{box.base}/big"), 2**30)

    def test_a_move_whose_caller_left_is_given_up(self) -> None:
        """
        A caller that leaves during a move's copy to another file system
        gets no answer, so the copy is given up at once rather than go on
        holding a thread of the daemon's for a move nobody hears of: the
        source is whole where it was and no part of the copy is left.
        """
        box = BoxedDaemon(self)
        self.tree_and_mount(box)
        body = json.dumps({"source": "tree", "destination": "mnt/tree"}).encode()
        conn = socket.create_connection(("127.0.0.1", box.port))
        self.addCleanup(conn.close)
        conn.sendall(
            b"POST /files/move HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        self.copy_begun(box)
        conn.close()
        self.assert_given_up(box)
        sb = Sandbox(box.url, timeout=20, retries=0)
        self.addCleanup(sb.close)
        self.assertEqual([e["name"] for e in sb.files.list("tree")], ["a", "b"])

    def test_an_e2b_rename_whose_caller_left_is_given_up(self) -> None:
        """
        The same through the E2B door: the SDK's ``files.rename`` that
        times out on the client's side leaves nothing moved, nothing
        copied, and the call audited as the client's leaving.
        """
        box = BoxedDaemon(self, policy={"groups": {"e2b": True}})
        self.tree_and_mount(box)
        e2b = e2b_sandbox(self, box)
        from e2b.exceptions import TimeoutException

        refused = raised(
            lambda: e2b.files.rename(
                f"{box.base}/tree", f"{box.base}/mnt/tree", request_timeout=0.3
            )
        )
        self.assertIsInstance(refused, TimeoutException, repr(refused))
        self.assert_given_up(box)
        log = box.log()
        self.assertNotIn("Traceback", log)
        with open(f"{box.root}/log/audit.log") as f:
            moves = [json.loads(line) for line in f if "Filesystem/Move" in line]
        self.assertEqual([m["code"] for m in moves], ["client_closed"])


class InotifyLimitTests(SynchronousTestCase):
    """
    A sandbox whose dev servers and editors hold nearly all of the user's
    inotify watches (``fs.inotify.max_user_watches``, commonly 8192).
    """

    def test_a_watch_over_the_limit_says_so(self) -> None:
        """
        A recursive watch of a tree with more directories than watches are
        left is refused with 503 ``unavailable`` naming the limit (not a
        watch silently blind to part of the tree, nor "Failed to add watch
        ... (-1)"), and leaves nothing held: a smaller watch works after.
        """
        box = BoxedDaemon(self, inotify_watches=20)
        for n in range(30):
            os.makedirs(f"{box.base}/tree/d{n}")
        request = urllib.request.Request(
            f"{box.url}/files/watch?path=tree&recursive=true"
        )
        with self.assertRaises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=20)
        self.assertEqual(caught.exception.code, 503)
        self.assertEqual(caught.exception.headers["Retry-After"], "1")
        body = json.loads(caught.exception.read())
        self.assertEqual((body["code"], body["type"]), ("unavailable", "ResourceError"))
        self.assertIn("the limit of inotify watches is reached", body["error"])
        self.assertIn("fs.inotify.max_user_watches", body["error"])
        sb = Sandbox(box.url, timeout=20, retries=0)
        self.addCleanup(sb.close)
        with sb.files.watch("tree/d0") as events:
            sb.files.write_bytes("tree/d0/new.txt", b"x")
            first = next(iter(events))
        self.assertTrue(first.data["path"].endswith("tree/d0/new.txt"), first)

    def test_directories_made_past_the_limit_are_logged(self) -> None:
        """
        A recursive watch that started whole but meets the limit as new
        directories are made goes on for the rest and says, once, in the
        log, that changes below the ones it could not watch are missed.
        """
        box = BoxedDaemon(self, inotify_watches=10)
        os.makedirs(f"{box.base}/small")
        sb = Sandbox(box.url, timeout=20, retries=0)
        self.addCleanup(sb.close)
        with sb.files.watch("small", recursive=True) as events:
            for n in range(15):
                os.mkdir(f"{box.base}/small/d{n}")
            sb.files.write_bytes("small/last.txt", b"x")
            for event in events:
                if event.data.get("dest", event.data["path"]).endswith("/last.txt"):
                    break
        log = box.log()
        self.assertEqual(
            log.count("a recursive watch cannot watch the new directory"), 1
        )
        self.assertIn("fs.inotify.max_user_watches", log)


def pids_cgroup(test: SynchronousTestCase) -> str:
    """
    A new pids cgroup (v1, or v2 with the controller on at its root),
    removed at the test's cleanup once emptied; SkipTest saying why when
    there is none to make.
    """
    found = None
    with open("/proc/self/mounts") as f:
        for line in f:
            _, where, kind, options = line.split()[:4]
            if kind == "cgroup" and "pids" in options.split(","):
                found = where
                break
            if kind == "cgroup2":
                try:
                    with open(f"{where}/cgroup.subtree_control") as control:
                        if "pids" in control.read().split():
                            found = where
                            break
                except OSError:
                    continue
    if found is None:
        raise SkipTest(
            "no pids cgroup controller is mounted here (v1, or on at a v2 root)"
        )
    path = os.path.join(found, f"sandboxd-test-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.mkdir(path)
    except OSError as e:
        raise SkipTest(f"cannot make a pids cgroup under {found}: {e}") from e
    test.addCleanup(os.rmdir, path)
    return path


def cgroup_file(path: str, name: str, value: str | None = None) -> str:
    """A cgroup file's value, after writing ``value`` to it when given."""
    if value is not None:
        with open(os.path.join(path, name), "w") as f:
            f.write(value)
    with open(os.path.join(path, name)) as f:
        return f.read().strip()


class ThreadLimitTests(SynchronousTestCase):
    """
    The daemon in a container at its pid limit (``pids.max`` counts
    threads too): work the daemon does on a thread of its pool is 503
    ``unavailable`` while no thread can start, nothing is half-done, and
    it all works once the sandbox lets some go; the daemon then stops
    cleanly.
    """

    def test_at_the_limit(self) -> None:
        """Files, a search, a move, an upload and /ports refused with Retry-After; all work after."""
        group = pids_cgroup(self)
        box = BoxedDaemon(self, policy={"groups": {"e2b": True}})
        # Stopped while still in the group, so that it can be removed.
        self.addCleanup(box.stop)
        sb = Sandbox(box.url, timeout=20, retries=0)
        self.addCleanup(sb.close)
        with open(f"{box.base}/a.txt", "wb") as f:
            f.write(OLD)
        cgroup_file(group, "cgroup.procs", str(box.proc.pid))
        # Not one more thread or process than the daemon has now: a fresh
        # daemon has not started its pool's threads yet.
        cgroup_file(group, "pids.max", cgroup_file(group, "pids.current"))

        refused = (503, "unavailable")
        calls: dict[str, Callable[[], Any]] = {
            "list": lambda: sb.files.list("."),
            "search": lambda: sb.files.search("*.txt", "."),
            "move": lambda: sb.files.move("a.txt", "b.txt"),
            "ports": lambda: sb.system.ports(),
            "upload": lambda: sb.files.write_bytes("c.txt", NEW),
        }
        for name, call in calls.items():
            self.assertEqual(error_of(call), refused, name)
        request = urllib.request.Request(f"{box.url}/files/list?path=.")
        with self.assertRaises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=20)
        self.assertEqual(caught.exception.headers["Retry-After"], "1")
        body = json.loads(caught.exception.read())
        self.assertEqual(body["type"], "ResourceError")
        self.assertEqual(
            body["error"],
            "cannot start a thread for this call now: Resource temporarily unavailable",
        )
        # The E2B SDK is told to try again later, not that the sandbox may
        # have been killed (what it makes of Connect's "unavailable").
        from e2b.exceptions import RateLimitException

        refused = raised(lambda: e2b_sandbox(self, box).files.list(box.base))
        self.assertIsInstance(refused, RateLimitException, repr(refused))
        self.assertIn("cannot start a thread for this call now", str(refused))
        self.assertEqual(sorted(os.listdir(box.base)), ["a.txt"])
        self.assertEqual(temporaries(box.base), [])
        self.assertNotIn("Traceback", box.log())

        cgroup_file(group, "pids.max", "max")
        self.assertEqual([e["name"] for e in sb.files.list(".")], ["a.txt"])
        sb.files.move("a.txt", "b.txt")
        self.assertEqual(sb.files.read_bytes("b.txt"), OLD)
        self.assertTrue(any(p["port"] == box.port for p in sb.system.ports()))
        sb.files.write_bytes("c.txt", NEW)
        self.assertEqual(sb.files.read_bytes("c.txt"), NEW)
        box.stop()
        self.assertEqual(box.proc.returncode, 0)
        with open(f"{box.root}/log/twistd.log") as f:
            self.assertNotIn("Traceback", f.read())


#: The capabilities Docker gives a container's root by default: no
#: CAP_SYS_NICE, CAP_SYS_RESOURCE or CAP_SYS_ADMIN.
DOCKER_DEFAULT = (
    "-all,+chown,+dac_override,+fowner,+fsetid,+kill,+setgid,+setuid,+setpcap,"
    "+net_bind_service,+net_raw,+sys_chroot,+mknod,+audit_write,+setfcap"
)


def thread_nice_values(pid: int) -> set[int]:
    """The nice value of each of ``pid``'s threads."""
    values = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            values.add(int(f.read().rsplit(")", 1)[1].split()[16]))
    return values


class ContainerRootTests(SynchronousTestCase):
    """A daemon started as a container or a service starts it: few capabilities, little environment."""

    def test_children_start_and_the_daemon_keeps_its_priority(self) -> None:
        """
        Without CAP_SYS_NICE a thread cannot take back a priority it gave
        up: the first command still answers, a background process is the
        daemon's to list and end and runs below the daemon, and every
        thread of the daemon stays at its own priority.
        """
        box = BoxedDaemon(self, capabilities=DOCKER_DEFAULT)
        sb = Sandbox(box.url, timeout=20, retries=0)
        self.addCleanup(sb.close)
        self.assertEqual(sb.commands.run("echo first").stdout, "first\n")
        sleeper = sb.commands.start("sleep 30")
        self.assertEqual([p["pid"] for p in sb.commands.list()], [sleeper.pid])
        # Without the capability the daemon gives a child its nice value by
        # pid just after the spawn, not before its exec.
        deadline = time.monotonic() + 5
        while thread_nice_values(sleeper.pid) != {10} and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(thread_nice_values(sleeper.pid), {10})
        sleeper.kill()
        until_exited(sleeper.pid)
        self.assertEqual(sb.commands.run("echo again").stdout, "again\n")
        self.assertEqual(thread_nice_values(box.proc.pid), {0})

    def test_what_a_command_starts_at_once_runs_below_the_daemon(self) -> None:
        """
        Without CAP_SYS_NICE a child gets its nice value by pid just after
        its spawn, by when a shell has often forked its first command:
        that command, and everything it starts, must not keep the daemon's
        priority.  A subshell forked at once reads its own nice value a
        moment later, and the shell its own, forty times; thirty times more
        as another user, whom the daemon may not renice once the child
        runs as that user (the child does it itself, once).
        """
        box = BoxedDaemon(self, capabilities=DOCKER_DEFAULT)
        for path in (box.root, box.base):
            os.chmod(path, 0o755)  # the child's working directory, as nobody
        sb = Sandbox(box.url, timeout=20, retries=0)
        self.addCleanup(sb.close)
        command = (
            "(sleep 0.05; cut -d ' ' -f 19 /proc/self/stat); "
            "cut -d ' ' -f 19 /proc/$$/stat"
        )
        seen = [sb.commands.run(command, shell="sh").stdout.split() for _ in range(40)]
        self.assertEqual({n for pair in seen for n in pair}, {"10"}, seen)
        seen = [
            sb.commands.run(command, shell="sh", user="nobody").stdout.split()
            for _ in range(30)
        ]
        self.assertEqual({n for pair in seen for n in pair}, {"10"}, seen)
        terminal = sb.pty.create(user="nobody")
        self.addCleanup(sb.pty.close, terminal["session_id"])
        self.assertEqual(thread_nice_values(terminal["pid"]), {10})

    def test_ports_name_the_process_of_another_user(self) -> None:
        """
        Without CAP_SYS_PTRACE a root daemon may not read the descriptors
        of a child it runs as another user; ``/ports`` still names the
        child that listens (read as that user).
        """
        box = BoxedDaemon(
            self, capabilities=DOCKER_DEFAULT, policy={"groups": {"system": True}}
        )
        for path in (box.root, box.base):
            os.chmod(path, 0o755)  # the child's working directory, as nobody
        sb = Sandbox(box.url, timeout=20, retries=0)
        self.addCleanup(sb.close)
        port = free_port()
        server = sb.commands.start(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
            user="nobody",
        )
        deadline = time.monotonic() + 10
        while not someone_listens(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        listed = [p for p in sb.system.ports() if p["port"] == port]
        self.assertEqual([p["pid"] for p in listed], [server.pid])
        server.kill()

    def test_an_empty_environment_gets_a_login_s_variables(self) -> None:
        """
        A daemon started with no environment at all (a service manager
        without a user of its own sets no HOME) gives its children the
        HOME, USER and LOGNAME of their user and a PATH, and logs that it
        did; what the environment does have is left as it is.
        """
        box = BoxedDaemon(self, environ={"LANG": "C.UTF-8"})
        sb = Sandbox(box.url, timeout=20, retries=0)
        self.addCleanup(sb.close)
        env = dict(
            line.split("=", 1) for line in sb.commands.run("env").stdout.splitlines()
        )
        entry = pwd.getpwuid(os.geteuid())
        self.assertEqual(
            {k: env.get(k) for k in ("HOME", "USER", "LOGNAME", "PATH", "LANG")},
            {
                "HOME": entry.pw_dir,
                "USER": entry.pw_name,
                "LOGNAME": entry.pw_name,
                "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG": "C.UTF-8",
            },
        )
        self.assertIn("HOME, LOGNAME, PATH, USER not set", box.log())
