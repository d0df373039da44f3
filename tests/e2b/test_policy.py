"""
The E2B door is governed by sandboxd's policy (SPEC §16, §18): tokens,
scopes, paths, secrets, audit, and the ``e2b`` switch itself.
"""

from __future__ import annotations

import os
import pwd
import socket
import threading
import time
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest

from tests.e2b.sdk import E2BCase, caught
from tests.helpers import free_port, process_listens


class TokenTests(E2BCase):
    """A token's scopes decide what it may do through the E2B port."""

    environ = {"READER": "reader-token", "ADMIN": "admin-token"}
    policy = {
        "auth": {
            "tokens": [
                {"id": "reader", "token_env": "READER", "scopes": ["files:read"]},
                {"id": "admin", "token_env": "ADMIN", "scopes": ["*"]},
            ]
        }
    }

    @inlineCallbacks
    def test_files_read_token_cannot_run_commands(self) -> Any:
        """
        A files:read token reads files but cannot run a command (Start is
        process_start: missing_scope process:run) nor write one.
        """
        from e2b import SandboxException

        with open(os.path.join(self.base_dir, "r.txt"), "w") as f:
            f.write("readable")

        def job() -> Any:
            sbx = self.sandbox(token="reader-token")
            return (
                sbx.files.read("r.txt"),
                caught(lambda: sbx.commands.run("touch ran")),
                caught(lambda: sbx.files.write("w.txt", "x")),
            )

        text, ran, wrote = yield self.sdk(job)
        self.assertEqual(text, "readable")
        self.assertIsInstance(ran, SandboxException)
        self.assertIn("missing_scope", str(ran))
        # The SDK spells the Connect code PERMISSION_DENIED (e2b 2.31, as
        # the seed's fork, writes Code.permission_denied).
        self.assertIn("permission_denied", str(ran).lower())
        self.assertIsInstance(wrote, SandboxException)
        self.assertIn("missing_scope", str(wrote))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "ran")))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "w.txt")))

    @inlineCallbacks
    def test_no_token_or_a_wrong_one_is_unauthenticated(self) -> Any:
        """Without a token (or with a wrong one) the SDK gets AuthenticationException."""
        from e2b import AuthenticationException

        def job() -> Any:
            return (
                caught(lambda: self.sandbox().commands.run("true")),
                caught(lambda: self.sandbox(token="nope").files.list(".")),
                caught(lambda: self.sandbox(token="nope").files.read("x")),
            )

        results = yield self.sdk(job)
        for result in results:
            self.assertIsInstance(result, AuthenticationException)
            self.assertIn("unauthorized", str(result))

    @inlineCallbacks
    def test_admin_token_runs(self) -> Any:
        """A token with * runs commands through the door."""

        def job() -> Any:
            return self.sandbox(token="admin-token").commands.run("echo ok")

        result = yield self.sdk(job)
        self.assertEqual(result.stdout, "ok\n")

    @inlineCallbacks
    def test_counted_link_spends_one_use_per_call(self) -> Any:
        """
        A link for three uses given to the SDK as its API key: creating
        the sandbox (one request) and reading a file spend one use each,
        a refused write none, so the third use is still there; the fourth
        call is refused as used up.
        """
        from e2b import Sandbox

        with open(os.path.join(self.base_dir, "r.txt"), "w") as f:
            f.write("readable")
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["files:read"], "uses": 3},
            token="admin-token",
        )
        link = minted.json()["token"]

        def job() -> Any:
            # Not the debug mode: the SDK asks the door's control plane
            # for the sandbox, with the link as its API key.
            os.environ.pop("E2B_DEBUG", None)
            sbx = Sandbox.create(
                api_key=link, api_url=self.e2b_url, sandbox_url=self.e2b_url
            )
            return (
                sbx.files.read("r.txt"),
                caught(lambda: sbx.files.write("w.txt", "x")),
                sbx.files.read("r.txt"),
                caught(lambda: sbx.files.read("r.txt")),
            )

        first, wrote, third, fourth = yield self.sdk(job)
        self.assertEqual((first, third), ("readable", "readable"))
        self.assertIn("missing_scope", str(wrote))
        self.assertIn("used up", str(fourth))
        listed = yield self.request("GET", "/auth/links", token="admin-token")
        self.assertEqual(
            [(x["uses"], x["used"]) for x in listed.json()["links"]], [(3, 3)]
        )


class PathTests(E2BCase):
    """Paths pass the guard: outside the base is refused and nothing is written."""

    @inlineCallbacks
    def test_write_outside_base_is_refused(self) -> Any:
        """files.write outside the base dir is refused (path_not_allowed); no file appears."""
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        target = os.path.join(outside, "escape.txt")

        def job() -> Any:
            sbx = self.sandbox()
            return (
                caught(lambda: sbx.files.write(target, "x")),
                caught(lambda: sbx.files.write("../escape2.txt", "x")),
                caught(lambda: sbx.files.read("/etc/hostname")),
                caught(lambda: sbx.files.list("/")),
                caught(lambda: sbx.commands.run("true", cwd="/")),
            )

        results = yield self.sdk(job)
        for result in results:
            self.assertIsInstance(result, Exception)
            self.assertIn("path_not_allowed", str(result))
        self.assertFalse(os.path.exists(target))
        self.assertFalse(
            os.path.exists(os.path.join(os.path.dirname(self.base_dir), "escape2.txt"))
        )

    @inlineCallbacks
    def test_multi_upload_with_one_bad_path_writes_nothing(self) -> Any:
        """A write_files with one refused path writes none of its files."""
        from e2b.sandbox.filesystem.filesystem import WriteEntry

        def job() -> Any:
            return caught(
                lambda: self.sandbox().files.write_files(
                    [
                        WriteEntry(path="ok.txt", data="fine"),
                        WriteEntry(path="/etc/evil.txt", data="bad"),
                    ]
                )
            )

        error = yield self.sdk(job)
        self.assertIn("path_not_allowed", str(error))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "ok.txt")))
        self.assertFalse(os.path.exists("/etc/evil.txt"))


class SecretTests(E2BCase):
    """Children started through the door never see the daemon's secrets."""

    environ = {"READER": "reader-token"}
    policy = {
        "auth": {"tokens": [{"id": "reader", "token_env": "READER", "scopes": ["*"]}]}
    }

    @inlineCallbacks
    def test_no_secret_in_the_environment(self) -> Any:
        """
        ABX_SERVER_* and token_env names are stripped; a client that asks
        to set one is refused and nothing runs.
        """
        saved = {k: os.environ.get(k) for k in ("ABX_SERVER_TEST_SECRET", "READER")}

        def restore() -> None:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

        self.addCleanup(restore)
        os.environ["ABX_SERVER_TEST_SECRET"] = "s3cret"
        os.environ["READER"] = "reader-token"

        def job() -> Any:
            sbx = self.sandbox(token="reader-token")
            plain = sbx.commands.run("env").stdout
            asked = sbx.commands.run("env", envs={"OK_VAR": "1"}).stdout
            for name in ("ABX_SERVER_X", "READER"):
                try:
                    sbx.commands.run("env", envs={name: "y"})
                except Exception as e:
                    refused.append(str(e))
            return plain, asked

        refused: list[str] = []
        plain, asked = yield self.sdk(job)
        self.assertEqual(len(refused), 2, refused)
        self.assertTrue(all("secret" in r for r in refused), refused)
        self.assertIn("OK_VAR=1", asked)
        for out in (plain, asked):
            self.assertNotIn("s3cret", out)
            self.assertNotIn("reader-token", out)
            self.assertNotIn("ABX_SERVER_", out)
        self.assertIn("OK_VAR=1", asked)


class AuditTests(E2BCase):
    """Each call through the door is one audit line, via e2b, as its endpoint."""

    audit = True
    policy = {"defaults": {"audit": "all"}}

    @inlineCallbacks
    def test_one_line_per_call(self) -> Any:
        """run, write, read, list: four calls, four lines naming their endpoints."""

        def job() -> Any:
            sbx = self.sandbox()
            sbx.commands.run("true")
            sbx.files.write("a.txt", "a")
            sbx.files.read("a.txt")
            sbx.files.list(".")
            caught(lambda: sbx.files.read("/etc/passwd"))

        yield self.sdk(job)
        lines = [line for line in self.audit_lines() if line.get("via") == "e2b"]
        self.assertEqual(
            [(line["endpoint"], line["procedure"], line["status"]) for line in lines],
            [
                ("process_start", "process.Process/Start", 200),
                ("files_write_raw", "POST /files", 200),
                ("files_read_raw", "GET /files", 200),
                ("files_list", "filesystem.Filesystem/ListDir", 200),
                ("files_read_raw", "GET /files", 403),
            ],
        )
        self.assertEqual(lines[-1]["code"], "path_not_allowed")
        self.assertNotIn("a.txt\\n", str(lines))


def _opened(port: int) -> bool:
    """
    Whether this process (the daemon under test) listens on ``port``: a
    connection's refusal would say so only until another test's server
    took the free port.
    """
    return process_listens(os.getpid(), port)


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closes (or resets) the connection within 5 s."""
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


class SwitchTests(E2BCase):
    """Nothing listens unless both --e2b-port and the policy say so."""

    autostart = False

    @inlineCallbacks
    def test_group_off_nothing_listens(self) -> Any:
        """With the e2b group off (the default), the E2B port is not opened."""
        self.enable_e2b = False
        port = free_port()
        yield self.start(e2b_port=f"tcp:{port}:interface=127.0.0.1")
        self.assertIsNone(self.e2b_port)
        self.assertFalse(_opened(port))

    @inlineCallbacks
    def test_endpoint_disabled_nothing_listens(self) -> Any:
        """With the group on but the e2b endpoint disabled, the port is not opened."""
        self.extra_policy = {"endpoints": {"e2b": {"enabled": False}}}
        port = free_port()
        yield self.start(e2b_port=f"tcp:{port}:interface=127.0.0.1")
        self.assertIsNone(self.e2b_port)
        self.assertFalse(_opened(port))

    @inlineCallbacks
    def test_no_option_no_service(self) -> Any:
        """Without --e2b-port there is no E2B service at all, even when enabled."""
        daemon = yield super(E2BCase, self).start(policy={"groups": {"e2b": True}})
        self.assertIsNone(daemon.context.e2b)


class ReloadTests(E2BCase):
    """A policy reload opens and closes the E2B port (SPEC §18)."""

    autostart = False

    def e2b_policy(self, e2b: bool) -> dict[str, Any]:
        return {**(self.policy or {}), "groups": {"e2b": e2b}}

    @inlineCallbacks
    def test_reload_turns_the_port_off_and_on(self) -> Any:
        """
        A reload that turns the group off stops the port listening and
        closes a kept-alive connection; one that turns it back on listens
        again on the same port, and the SDK's calls work.
        """
        port = free_port()
        yield self.start_on_policy_file(
            self.e2b_policy(True), e2b_port=f"tcp:{port}:interface=127.0.0.1"
        )
        kept = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.addCleanup(kept.close)
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = yield self.sdk(kept.recv, 4096)
        self.assertTrue(first.startswith(b"HTTP/1.1 204"), first)

        self.reload_policy(self.e2b_policy(False))
        closed = yield self.sdk(_closed, kept)
        self.assertTrue(closed)
        self.assertFalse(_opened(port))

        self.reload_policy(self.e2b_policy(True))
        deadline = time.monotonic() + 10
        while self.daemon.context.e2b.port is None and time.monotonic() < deadline:
            yield self.sdk(time.sleep, 0.05)
        result = yield self.sdk(lambda: self.sandbox().commands.run("echo back"))
        self.assertEqual(result.stdout, "back\n")


class UserTests(E2BCase):
    """envd's user (``Authorization: Basic``) is §7.4's ``user``, allowed by ``params.users``."""

    policy = {"endpoints": {"process_start": {"params": {"users": ["nobody"]}}}}

    def setUp(self) -> Any:
        if os.geteuid() != 0:
            raise SkipTest("switching users needs a root daemon")
        try:
            pwd.getpwnam("nobody")
        except KeyError:
            raise SkipTest("no user 'nobody' here") from None
        return super().setUp()

    @inlineCallbacks
    def test_allowed_user_runs_as_itself(self) -> Any:
        """user="nobody" runs the command as nobody."""

        def job() -> Any:
            return self.sandbox().commands.run("id -un", user="nobody")

        result = yield self.sdk(job)
        self.assertEqual(result.stdout, "nobody\n")

    @inlineCallbacks
    def test_user_not_allowed_is_refused(self) -> Any:
        """user="root", not in params.users, is refused with param_not_allowed."""
        marker = os.path.join(self.base_dir, "ran")

        def job() -> Any:
            return caught(
                lambda: self.sandbox().commands.run(f"touch {marker}", user="root")
            )

        error = yield self.sdk(job)
        self.assertIn("param_not_allowed", str(error))
        self.assertIn("rule: policy:endpoints.process_start", str(error))
        self.assertFalse(os.path.exists(marker))


class LimitTests(E2BCase):
    """The write endpoint's max_bytes bounds uploads through the door."""

    policy = {"endpoints": {"files_write_raw": {"limits": {"max_bytes": 1000}}}}

    @inlineCallbacks
    def test_upload_over_max_bytes(self) -> Any:
        """
        A file over max_bytes is 413 payload_too_large and is not written,
        whether the body is just over (checked per file) or far over (refused
        as it arrives).
        """

        def job() -> Any:
            sbx = self.sandbox()
            return (
                caught(lambda: sbx.files.write("small-over.bin", b"x" * 5000)),
                caught(
                    lambda: sbx.files.write(
                        "far-over.bin", b"x" * (3 * 1024 * 1024), use_octet_stream=True
                    )
                ),
                sbx.files.write("fits.bin", b"x" * 900).path,
            )

        small, far, fits = yield self.sdk(job)
        for error in (small, far):
            self.assertIsInstance(error, Exception)
            self.assertIn("payload_too_large", str(error))
        self.assertIn("request body", str(far))
        for name in ("small-over.bin", "far-over.bin"):
            self.assertFalse(os.path.exists(os.path.join(self.base_dir, name)))
        self.assertEqual(fits, os.path.join(self.base_dir, "fits.bin"))


class ExposureTests(E2BCase):
    """The E2B port obeys the start-up rule of SPEC §20, like the others."""

    autostart = False

    def test_wide_open_without_token_is_refused(self) -> Any:
        """No token and the E2B port on every interface: the start is refused."""
        from sandboxd.policy import PolicyError

        return self.assertFailure(
            self.start(e2b_port="tcp:0:interface=0.0.0.0"), PolicyError
        )

    @inlineCallbacks
    def test_disabled_e2b_is_not_checked(self) -> Any:
        """With the e2b endpoint off, its port opens nothing, so it is not refused."""
        self.enable_e2b = False
        yield self.start(e2b_port="tcp:0:interface=0.0.0.0")
        self.assertIsNone(self.e2b_port)

    @inlineCallbacks
    def test_port_in_use_fails_the_start(self) -> Any:
        """A port that cannot bind fails the start, as the HTTP and PTY ports do."""
        from sandboxd.daemon.startup import StartRefused

        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            try:
                yield self.start(e2b_port=f"tcp:{port}:interface=127.0.0.1")
            except StartRefused as e:
                self.assertIn(str(port), str(e))
            else:
                self.fail("the start did not fail")


def _tokens_policy(tokens: list[dict[str, Any]], **groups: bool) -> dict[str, Any]:
    return {"groups": {"e2b": True, **groups}, "auth": {"tokens": tokens}}


#: Two tokens a stream reload test gives out; the first is taken away.
AGENT = {"id": "agent", "token_env": "AGENT", "scopes": ["*"]}
KEEPER = {"id": "keeper", "token_env": "KEEPER", "scopes": ["*"]}


class StreamReloadTests(E2BCase):
    """A policy reload ends the streams of a caller it no longer lets in."""

    autostart = False
    environ = {"AGENT": "agent-token", "KEEPER": "keeper-token"}

    @inlineCallbacks
    def test_a_removed_tokens_command_stream_ends(self) -> Any:
        """
        Taking a token out of the policy ends the SDK's wait on its
        command at the reload, with an error saying why; another token's
        wait goes on to the command's end.
        """
        yield self.start_on_policy_file(_tokens_policy([AGENT, KEEPER]))
        up = {"agent-token": threading.Event(), "keeper-token": threading.Event()}

        def job(token: str) -> Any:
            handle = self.sandbox(token=token).commands.run(
                "echo up; sleep 6; echo done", background=True
            )
            up[token].set()
            started = time.monotonic()
            out: list[str] = []
            try:
                handle.wait(on_stdout=out.append)
                return "".join(out), None, time.monotonic() - started
            except Exception as e:
                return "".join(out), e, time.monotonic() - started

        ended = self.sdk(job, "agent-token")
        went_on = self.sdk(job, "keeper-token")
        for _ in range(200):
            if all(event.is_set() for event in up.values()):
                break
            yield self.sdk(time.sleep, 0.05)
        self.reload_policy(_tokens_policy([KEEPER]))
        out, error, waited = yield ended
        self.assertIsNotNone(error, f"the removed token's stream ran on: {out!r}")
        self.assertIn("agent", str(error))
        self.assertNotIn("done", out)
        self.assertLess(waited, 5)
        out, error, _ = yield went_on
        self.assertIsNone(error)
        self.assertEqual(out, "up\ndone\n")
