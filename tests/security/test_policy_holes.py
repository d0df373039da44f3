"""
Policy rules that some path did not enforce (SPEC §5, §11): each case
sends the request to a real daemon and checks the SPEC §6 code, the
``rule`` and that nothing was made on the way.
"""

from __future__ import annotations

import os
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from tests.agents.test_agents import MISSING_AGENT, agents_policy, fake_npm
from tests.e2b.sdk import E2BCase
from tests.helpers import DaemonTestCase, alive
from tests.routes.test_uploads import UploadCase, _open_part
from tests.security.files import b64, tar_gz, tree

DENY_SECRET = {"endpoints": {"group:file_ops": {"paths": {"deny": ["**/*.secret"]}}}}


#: The rule a path refused by DENY_SECRET names (as for `x.secret` itself).
RULE = "policy:endpoints.group:file_ops"


class ImplicitParentTests(DaemonTestCase):
    """
    A directory the policy denies is not created as the parent of a write:
    every route that makes parents refuses with the code and rule the
    denied directory gets, before anything is made.
    """

    policy = DENY_SECRET

    def assert_denied(self, reply: Any, before: list[str]) -> None:
        self.assertEqual(reply.status, 403, reply.body)
        body = reply.json()
        self.assertEqual(body["code"], "path_denied", body)
        self.assertEqual(body.get("rule"), RULE, body)
        self.assertEqual(tree(self.base_dir), before)

    @inlineCallbacks
    def test_upload(self) -> Any:
        """``POST /upload`` to ``a/x.secret/f`` makes neither ``a`` nor ``a/x.secret``."""
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST", "/upload", {"path": "a/x.secret/f", "content_base64": b64(b"x")}
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_upload_stream(self) -> Any:
        """``POST /files/upload-stream`` likewise."""
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST",
            "/files/upload-stream",
            {"path": "x.secret/deep/f", "content_base64": b64(b"x")},
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_raw_write(self) -> Any:
        """``POST /files/raw`` likewise."""
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST",
            "/files/raw?path=x.secret/f",
            raw_body=b"abc",
            headers={"Content-Type": "application/octet-stream"},
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_mkdir(self) -> Any:
        """``POST /files/mkdir`` of ``x.secret/sub`` makes no ``x.secret``."""
        before = tree(self.base_dir)
        reply = yield self.request("POST", "/files/mkdir", {"path": "x.secret/sub"})
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_move_destination(self) -> Any:
        """A move into ``x.secret/f`` leaves the source and makes no directory."""
        with open(os.path.join(self.base_dir, "src.txt"), "wb") as f:
            f.write(b"src")
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST", "/files/move", {"source": "src.txt", "destination": "x.secret/f"}
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_extract_destination(self) -> Any:
        """An extract to ``out/x.secret/d`` makes no destination directories."""
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST",
            "/files/extract",
            {
                "content_base64": b64(tar_gz([("f.txt", b"x")])),
                "format": "tar.gz",
                "destination": "out/x.secret/d",
            },
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_extract_member(self) -> Any:
        """A member ``m.secret/f.txt`` is refused before any member is written."""
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST",
            "/files/extract",
            {
                "content_base64": b64(
                    tar_gz([("ok.txt", b"x"), ("m.secret/f.txt", b"y")])
                ),
                "format": "tar.gz",
                "destination": "out",
            },
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_resumable_upload_create(self) -> Any:
        """``POST /files/uploads`` to ``x.secret/f`` makes no directory and no upload."""
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST", "/files/uploads", {"path": "x.secret/f", "size": 3}
        )
        self.assert_denied(reply, before)

    @inlineCallbacks
    def test_existing_parent_still_writable(self) -> Any:
        """
        Only creating a denied directory is refused: the final path's own
        decision stands for a directory that already exists, and a write
        whose new parents are all allowed makes them.
        """
        reply = yield self.request(
            "POST", "/upload", {"path": "ok/deep/f", "content_base64": b64(b"x")}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertTrue(os.path.isfile(os.path.join(self.base_dir, "ok/deep/f")))


#: ``max_duration_seconds`` of the launching routes in the duration tests.
CEILING = 1

DURATION_POLICY = {
    "groups": {"dev_tools": True},
    "endpoints": {
        name: {"limits": {"max_duration_seconds": CEILING}}
        for name in (
            "process_start",
            "shell",
            "shell_stream",
            "code_run",
            "pty_create_session",
        )
    },
}


class MaxDurationTests(DaemonTestCase):
    """
    ``limits.max_duration_seconds`` bounds every child a request starts: a
    request's ``timeout`` above it is cut to it (as ``seconds(ceiling=)``
    does for ``/shell``), and a request without one gets it.
    """

    policy = DURATION_POLICY

    @inlineCallbacks
    def wait_exited(self, pid: int, within: float = 10.0) -> Any:
        """Poll ``GET /process/{pid}`` until it says exited; the seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < within:
            reply = yield self.request("GET", f"/process/{pid}")
            if reply.json().get("state") == "exited":
                return time.monotonic() - started
            yield deferLater(reactor, 0.1, lambda: None)
        self.fail(f"process {pid} still running after {within} s")

    @inlineCallbacks
    def start_sleep(self, **fields: Any) -> Any:
        reply = yield self.request(
            "POST", "/process/start", {"command": "sleep 30", **fields}
        )
        self.assertEqual(reply.status, 200, reply.body)
        pid = reply.json()["pid"]
        self.addCleanup(self._kill, pid)
        return pid

    def _kill(self, pid: int) -> None:
        if alive(pid):
            os.kill(pid, 9)

    @inlineCallbacks
    def test_process_start_timeout_above_ceiling(self) -> Any:
        """``timeout: 100`` under a ceiling of 1 s: the process ends within seconds."""
        pid = yield self.start_sleep(timeout=100)
        took = yield self.wait_exited(pid)
        self.assertLess(took, CEILING + 5)

    @inlineCallbacks
    def test_process_start_without_timeout(self) -> Any:
        """No ``timeout``: the rule's ceiling still ends the process."""
        pid = yield self.start_sleep()
        took = yield self.wait_exited(pid)
        self.assertLess(took, CEILING + 5)

    @inlineCallbacks
    def test_shell_timeout_above_ceiling(self) -> Any:
        """``/shell`` with ``timeout: 100`` answers the timeout error after about 1 s."""
        started = time.monotonic()
        reply = yield self.request(
            "POST", "/shell", {"command": "sleep 30", "timeout": 100}
        )
        self.assertEqual(reply.status, 500, reply.body)
        self.assertLess(time.monotonic() - started, CEILING + 5)

    @inlineCallbacks
    def test_code_run_timeout_above_ceiling(self) -> Any:
        """``/code/run`` with ``timeout: 100`` is 408 after about 1 s."""
        started = time.monotonic()
        reply = yield self.request(
            "POST",
            "/code/run",
            {"language": "bash", "code": "sleep 20", "timeout": 100},
        )
        self.assertEqual(reply.status, 408, reply.body)
        self.assertLess(time.monotonic() - started, CEILING + 5)

    @inlineCallbacks
    def test_pty_session_ends_at_ceiling(self) -> Any:
        """A terminal session is closed (its shell ended) once it ran ``max_duration_seconds``."""
        reply = yield self.request("POST", "/pty/sessions", {})
        self.assertEqual(reply.status, 200, reply.body)
        created = reply.json()
        self.addCleanup(self._kill, created["pid"])
        started = time.monotonic()
        while time.monotonic() - started < CEILING + 5:
            reply = yield self.request("GET", f"/pty/sessions/{created['session_id']}")
            if reply.status == 404 and not alive(created["pid"]):
                return
            yield deferLater(reactor, 0.1, lambda: None)
        self.fail("the terminal outlived max_duration_seconds")


class E2BMaxDurationTests(E2BCase):
    """The E2B door's commands and terminals are bounded by ``max_duration_seconds`` too."""

    policy = DURATION_POLICY

    @inlineCallbacks
    def test_command_timeout_above_ceiling(self) -> Any:
        """``commands.run(timeout=100)`` under a 1 s ceiling ends after about 1 s."""

        def job() -> Any:
            started = time.monotonic()
            try:
                self.sandbox().commands.run("sleep 20", timeout=100)
            except Exception as e:
                return e, time.monotonic() - started
            return None, time.monotonic() - started

        error, took = yield self.sdk(job)
        self.assertIsNotNone(error)
        self.assertLess(took, CEILING + 5)

    @inlineCallbacks
    def test_terminal_ends_at_ceiling(self) -> Any:
        """A terminal made with ``pty.create(timeout=100)`` is ended after about 1 s."""

        def job() -> Any:
            from e2b.sandbox.commands.command_handle import PtySize

            handle = self.sandbox().pty.create(PtySize(rows=24, cols=80), timeout=100)
            return handle.pid

        pid = yield self.sdk(job)
        started = time.monotonic()
        while alive(pid) and time.monotonic() - started < CEILING + 5:
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(alive(pid))


class InstallProcessLimitTests(DaemonTestCase):
    """
    ``POST /agents/catalog/{agent}/install`` starts npm as a managed
    process, so it counts against ``max_processes`` (SPEC §5.5, §11.4) like
    every other child and is refused by it, 429 ``too_many_processes``,
    before npm starts.
    """

    def setUp(self) -> Any:
        self.bin_dir = fake_npm(self, 'touch "$(dirname "$0")/npm-ran"')
        self.ran = os.path.join(self.bin_dir, "npm-ran")
        self.policy = agents_policy()
        self.policy["agents"]["catalog"]["missing"] = MISSING_AGENT
        self.policy.setdefault("endpoints", {})["process_start"] = {
            "limits": {"max_processes": 1}
        }
        return super().setUp()

    @inlineCallbacks
    def test_install_refused_at_the_process_limit(self) -> Any:
        """One process running under ``max_processes: 1``: the install is 429 and npm never runs."""
        reply = yield self.request("POST", "/process/start", {"command": "sleep 30"})
        self.assertEqual(reply.status, 200, reply.body)
        pid = reply.json()["pid"]
        self.addCleanup(lambda: os.kill(pid, 9) if alive(pid) else None)
        reply = yield self.request("POST", "/agents/catalog/missing/install", {})
        self.assertEqual(reply.status, 429, reply.body)
        body = reply.json()
        self.assertEqual(body["code"], "too_many_processes", body)
        self.assertEqual(body["rule"], "policy:endpoints.process_start")
        yield deferLater(reactor, 0.5, lambda: None)
        self.assertFalse(os.path.exists(self.ran))
        listed = yield self.request("GET", "/process/list")
        self.assertEqual([p["pid"] for p in listed.json()["processes"]], [pid])

    @inlineCallbacks
    def test_install_counts_against_the_limit(self) -> Any:
        """A running install is one of the ``max_processes``: process_start is then 429."""
        fake_npm(self, "exec sleep 30")
        reply = yield self.request("POST", "/agents/catalog/missing/install", {})
        self.assertEqual(reply.status, 202, reply.body)
        pid = reply.json()["pid"]
        self.addCleanup(lambda: os.kill(pid, 9) if alive(pid) else None)
        reply = yield self.request("POST", "/process/start", {"command": "sleep 30"})
        self.assertEqual(reply.status, 429, reply.body)
        self.assertEqual(reply.json()["code"], "too_many_processes")


def _finish(sock: Any, rest: bytes) -> bytes:
    """Send the rest of a body on an open connection; the answer's bytes."""
    sock.sendall(rest)
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    return answer


class UploadReloadTests(UploadCase):
    """
    A resumable upload is decided again under the policy in force at each
    append and at completion: a reload that denies its target refuses the
    append (403 with the guard's code and rule) and renames nothing; the
    upload stays open, as it was, so a policy that allows the path again
    lets it finish.
    """

    autostart = False

    def deny_policy(self, deny: list[str]) -> dict[str, Any]:
        return {"endpoints": {"group:file_ops": {"paths": {"deny": deny}}}}

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        os.mkdir(os.path.join(self.base_dir, "data"))
        yield self.start_on_policy_file(self.deny_policy([]))

    def reload(self, deny: list[str]) -> None:
        self.reload_policy(self.deny_policy(deny))

    @inlineCallbacks
    def test_append_after_a_reload_that_denies(self) -> Any:
        """The append is 403 path_denied, writes nothing, and the upload is kept."""
        reply = yield self.create("data/f.bin", 6)
        self.assertEqual(reply.status, 201, reply.body)
        uid = reply.json()["upload_id"]
        reply = yield self.append(uid, 0, b"abc")
        self.assertEqual(reply.status, 200, reply.body)
        self.reload(["**/data/**"])
        reply = yield self.append(uid, 3, b"def")
        self.assertEqual(reply.status, 403, reply.body)
        self.assertEqual(reply.json()["code"], "path_denied")
        self.assertEqual(reply.json()["rule"], RULE)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "data/f.bin")))
        staged = self.staging("data")
        self.assertEqual(len(staged), 1)
        with open(os.path.join(self.base_dir, "data", staged[0]), "rb") as f:
            self.assertEqual(f.read(), b"abc")
        self.reload([])
        reply = yield self.request("GET", f"/files/uploads/{uid}")
        self.assertEqual(reply.json()["offset"], 3)
        reply = yield self.append(uid, 3, b"def")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertTrue(reply.json()["complete"])
        self.assertEqual(self.read("data/f.bin"), b"abcdef")

    @inlineCallbacks
    def test_completion_after_a_reload_mid_body(self) -> Any:
        """
        A reload that denies the target while the last append's body is
        arriving: no rename, 403 path_denied; the bytes that arrived stay
        in the staging file (counted), and an empty append completes it
        once the path is allowed again.
        """
        reply = yield self.create("data/g.bin", 2000)
        uid = reply.json()["upload_id"]
        sock = yield deferToThread(
            _open_part,
            self.daemon.port,
            f"/files/uploads/{uid}?offset=0",
            2000,
            b"x" * 1000,
            self.token,
        )
        self.addCleanup(sock.close)
        for _ in range(100):
            reply = yield self.append(uid, 0, b"")
            if reply.status == 429:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.reload(["**/data/**"])
        answer = yield deferToThread(_finish, sock, b"y" * 1000)
        self.assertTrue(answer.startswith(b"HTTP/1.1 403"), answer)
        self.assertIn(b"path_denied", answer)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "data/g.bin")))
        self.reload([])
        reply = yield self.request("GET", f"/files/uploads/{uid}")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["offset"], 2000)
        reply = yield self.append(uid, 2000, b"")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(self.read("data/g.bin"), b"x" * 1000 + b"y" * 1000)
