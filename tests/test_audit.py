"""The audit file: JSON lines, masked secrets, rotation by size."""

from __future__ import annotations

import errno
import json
import os
import time
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.logger import Logger
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access.audit import (
    AuditLog,
    audit_argv,
    make_record,
    mask_secrets,
    redact_query,
    should_record,
)
from sandboxd.policy.defaults import AUDIT_KEEP_FILES
from tests.routes.test_terminal import TerminalCase, sleep


class AuditTests(SynchronousTestCase):
    """What an operator finds in the audit file."""

    def test_modes(self) -> None:
        """all records everything, deny only refusals and failures, off nothing."""
        self.assertTrue(should_record("all", 200))
        self.assertFalse(should_record("deny", 200))
        self.assertTrue(should_record("deny", 403))
        self.assertFalse(should_record("off", 500))

    def test_redaction(self) -> None:
        """Values of token-like parameters are masked; others kept."""
        self.assertEqual(
            redact_query("access_token=abc&path=x&api_key=k"),
            "access_token=%2A%2A%2A&path=x&api_key=%2A%2A%2A",
        )

    def test_links_masked_whatever_carries_them(self) -> None:
        """
        A capability link is masked as the preview door's ``sbx_link``, as
        the value of any other parameter, and as a parameter's name: it is
        a bearer credential wherever it shows up.
        """
        self.assertEqual(
            redact_query("sbx_link=sbxl_eyJh.c2ln&path=x&next=sbxl_eyJh.c2ln&sbxl_a.b"),
            "sbx_link=%2A%2A%2A&path=x&next=%2A%2A%2A&%2A%2A%2A=",
        )

    def test_rotation(self) -> None:
        """Past the size bound the file rotates, keeping a bounded number of old files."""
        path = os.path.join(os.path.abspath(self.mktemp()))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        log = AuditLog(path, rotate_bytes=2000)
        record = make_record(
            identity="ci",
            endpoint="download",
            method="GET",
            path="/download",
            query="path=a",
            status=200,
            code=None,
            rule=None,
            started=time.monotonic(),
            bytes_in=0,
            bytes_out=10,
            client="127.0.0.1",
        )
        for _ in range(200):
            log.write(record)
        log.close()
        names = sorted(os.listdir(os.path.dirname(path)))
        base = os.path.basename(path)
        self.assertIn(base, names)
        self.assertIn(base + ".1", names)
        self.assertLessEqual(
            len([n for n in names if n.startswith(base + ".")]), AUDIT_KEEP_FILES
        )
        with open(path) as f:
            for line in f:
                self.assertEqual(json.loads(line)["identity"], "ci")


class OutsideRotationTests(SynchronousTestCase):
    """An audit file renamed or removed under the daemon is followed to its path."""

    def record(self, identity: str) -> dict[str, Any]:
        return make_record(
            identity=identity,
            endpoint="download",
            method="GET",
            path="/download",
            query="",
            status=200,
            code=None,
            rule=None,
            started=time.monotonic(),
            bytes_in=0,
            bytes_out=10,
            client="127.0.0.1",
        )

    def test_renamed_and_removed(self) -> None:
        """
        Renamed away (logrotate), then removed (a clean-up): within a
        second the records go to a new file at the path, mode 0600.
        """
        folder = os.path.abspath(self.mktemp())
        os.makedirs(folder)
        path = os.path.join(folder, "audit.log")
        now = [0.0]
        log = AuditLog(path, clock=lambda: now[0])
        self.addCleanup(log.close)
        log.write(self.record("first"))
        os.rename(path, path + ".1")
        now[0] += 1.5
        log.write(self.record("second"))
        os.unlink(path)
        now[0] += 1.5
        log.write(self.record("third"))
        log.flush()
        with open(path + ".1") as f:
            self.assertEqual([json.loads(x)["identity"] for x in f], ["first"])
        with open(path) as f:
            self.assertEqual([json.loads(x)["identity"] for x in f], ["third"])
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)

    def test_logger_name(self) -> None:
        """Records sent to the daemon's log are ``sandboxd.audit``'s, as documented."""
        from twisted.logger import globalLogPublisher

        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        AuditLog().write(self.record("ci"))
        [event] = [e for e in events if "audit_line" in e]
        self.assertEqual(event["log_namespace"], "sandboxd.audit")


class ShortFile:
    """A file that takes ``room`` more bytes and then refuses, as a full disk does."""

    def __init__(self, inner: Any, room: int) -> None:
        self.inner = inner
        self.room = room

    def write(self, data: Any) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = int(self.inner.write(bytes(data[: self.room])))
        self.room -= written
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class FullDiskTests(SynchronousTestCase):
    """The audit file on a full disk: the request goes on, the file keeps whole lines."""

    def test_lines_whole_or_dropped(self) -> None:
        """
        A record the disk takes only part of is cut off again and dropped,
        as is one it refuses outright; neither raises.  The drops are
        counted and warned about once per interval (the rest once records
        land again), and the next records are whole lines.
        """
        path = os.path.abspath(self.mktemp())
        events: list[dict[str, Any]] = []
        now = [0.0]
        log = AuditLog(path, clock=lambda: now[0], warn_every=30)
        self.patch(log, "log", Logger(observer=events.append))
        log.write({"n": 1})
        disk = log._file._file  # type: ignore[union-attr]
        log._file._file = ShortFile(disk, room=5)  # type: ignore[union-attr]
        log.write({"n": 2})
        log.write({"n": 3})
        now[0] = 1.0
        log.write({"n": 4})
        self.assertEqual(log.dropped, 3)
        self.assertEqual([e["count"] for e in events], [1])
        self.assertEqual(events[0]["why"], "No space left on device")
        log._file._file = disk  # type: ignore[union-attr]
        log.write({"n": 5})
        self.assertEqual([e["count"] for e in events], [1, 2])
        log.close()
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
        self.assertEqual(lines[-1], b"")
        self.assertEqual([json.loads(line)["n"] for line in lines[:-1]], [1, 5])


class FileModeTests(SynchronousTestCase):
    """SPEC §20: the audit file and its rotations are the daemon's alone."""

    def test_created_0600_with_rotations(self) -> None:
        """A new audit file, and every file rotation makes, is mode 0600 (whatever the umask)."""
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        path = os.path.join(directory, "audit.log")
        old = os.umask(0o022)
        self.addCleanup(os.umask, old)
        log = AuditLog(path, rotate_bytes=500)
        for i in range(40):
            log.write({"n": i, "pad": "x" * 40})
        log.close()
        names = sorted(os.listdir(directory))
        self.assertIn("audit.log.1", names)
        for name in names:
            mode = os.stat(os.path.join(directory, name)).st_mode & 0o777
            self.assertEqual(mode, 0o600, name)

    def test_existing_file_tightened(self) -> None:
        """An audit file left 0644 by an older daemon is made 0600 when opened."""
        path = os.path.abspath(self.mktemp())
        with open(path, "w"):
            pass
        os.chmod(path, 0o644)
        AuditLog(path).close()
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)


class ArgvTests(SynchronousTestCase):
    """What an audit record keeps of a child's argv."""

    def test_values_and_assignments_masked(self) -> None:
        """The value of a hidden name is masked wherever it appears, and in NAME=value."""
        argv = audit_argv(
            ["sh", "-c", "curl -H 'Authorization: s3cr3t-v' x; API_KEY=other run"],
            ["API_KEY", "SVC_TOKEN"],
            {"SVC_TOKEN": "s3cr3t-v", "API_KEY": "unused-value", "HOME": "/home/user"},
        )
        self.assertEqual(
            argv, ["sh", "-c", "curl -H 'Authorization: ***' x; API_KEY=*** run"]
        )

    def test_each_set_of_names_its_own(self) -> None:
        """Names hidden for one command are not masked for the next that does not hide them."""
        line = "A_TOKEN=one B_TOKEN=two A_TOKEN_X=three"
        self.assertEqual(
            audit_argv(["env", line], ["A_TOKEN"], {}),
            ["env", "A_TOKEN=*** B_TOKEN=two A_TOKEN_X=three"],
        )
        self.assertEqual(
            audit_argv(["env", line], ["B_TOKEN", "A_TOKEN_X"], {}),
            ["env", "A_TOKEN=one B_TOKEN=*** A_TOKEN_X=***"],
        )
        self.assertEqual(audit_argv(["env", line], [], {}), ["env", line])
        self.assertEqual(
            audit_argv(["env", line], ["A_TOKEN"], {}),
            ["env", "A_TOKEN=*** B_TOKEN=two A_TOKEN_X=three"],
        )

    def test_short_values_not_searched(self) -> None:
        """A hidden name whose value is a couple of characters does not blank every match."""
        argv = audit_argv(["echo", "1 2 3"], ["FLAG"], {"FLAG": "1"})
        self.assertEqual(argv, ["echo", "1 2 3"])

    def test_capped(self) -> None:
        """Too many arguments, too long an argument: capped, and the record says by how much."""
        from sandboxd.policy.defaults import (
            AUDIT_ARG_MAX_CHARS,
            AUDIT_ARGV_MAX_CHARS,
            AUDIT_ARGV_MAX_ITEMS,
        )

        many = audit_argv(["a"] * (AUDIT_ARGV_MAX_ITEMS + 5), [], {})
        self.assertEqual(len(many), AUDIT_ARGV_MAX_ITEMS + 1)
        self.assertIn("5 more arguments", many[-1])
        [long] = audit_argv(["x" * (AUDIT_ARG_MAX_CHARS + 10)], [], {})
        self.assertTrue(long.startswith("x" * AUDIT_ARG_MAX_CHARS))
        self.assertIn("10 more characters", long)
        wide = audit_argv(["y" * AUDIT_ARG_MAX_CHARS] * 20, [], {})
        self.assertLessEqual(
            sum(len(a) for a in wide if a.startswith("y")),
            AUDIT_ARGV_MAX_CHARS + 100 * len(wide),
        )
        self.assertIn("more arguments", wide[-1])


class MaskSecretsTests(SynchronousTestCase):
    """The daemon's tokens masked in what an audit record holds."""

    def test_whole_and_cut(self) -> None:
        """
        A token is masked wherever it appears; at the end of an argument
        cut for length, its beginning is masked too.
        """
        token = "tok-0123456789abcdef"
        self.assertEqual(mask_secrets(f"a {token} b{token}", [token]), "a *** b***")
        [cut] = audit_argv(["x" * 500 + token], [], {})
        self.assertTrue(cut.endswith("more characters)"))
        self.assertNotIn(token[:12], mask_secrets(cut, [token]))
        self.assertIn("x***... (", mask_secrets(cut, [token]))
        self.assertEqual(mask_secrets("short abc", ["abc"]), "short abc")


class AuditedChildrenTests(TerminalCase):
    """Records of requests that start a child say what ran (SPEC §20)."""

    audit = True
    policy = {
        "groups": {"dev_tools": True},
        "defaults": {"audit": "all", "params": {"env_deny": ["SBX_AUDIT_SECRET"]}},
    }

    def setUp(self) -> Any:
        os.environ["SBX_AUDIT_SECRET"] = "hush-hush-42"
        self.addCleanup(os.environ.pop, "SBX_AUDIT_SECRET", None)
        return super().setUp()

    def records(self, endpoint: str) -> list[dict[str, Any]]:
        return [r for r in self.audit_lines() if r["endpoint"] == endpoint]

    @inlineCallbacks
    def test_shell_process_code_argv(self) -> Any:
        """shell, shell_stream, process_start and code_run records carry the masked argv."""
        reply = yield self.request(
            "POST", "/shell", {"command": "echo hush-hush-42 SBX_AUDIT_SECRET=abc"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        [record] = self.records("shell")
        self.assertTrue(
            " ".join(record["argv"]).endswith("echo *** SBX_AUDIT_SECRET=***"),
            record["argv"],
        )
        self.assertNotIn("hush-hush-42", json.dumps(self.audit_lines()))
        reply = yield self.request(
            "POST", "/shell/stream", {"command": "echo streamed"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        [record] = self.records("shell_stream")
        self.assertTrue(" ".join(record["argv"]).endswith("echo streamed"))
        reply = yield self.request(
            "POST",
            "/process/start",
            {"command": "sleep 0", "env": {"OTHER": "x"}},
        )
        self.assertEqual(reply.status, 200, reply.body)
        [record] = self.records("process_start")
        self.assertEqual(record["argv"][-2:], ["sleep", "0"])
        reply = yield self.request(
            "POST", "/code/run", {"language": "python", "code": "print(40 + 2)"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        [record] = self.records("code_run")
        self.assertEqual(record["argv"][-2:], ["-c", "print(40 + 2)"])

    @inlineCallbacks
    def test_pty_audited_on_close(self) -> Any:
        """A terminal is audited when created (argv) and again when it ends (duration, bytes)."""
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        client.type("echo audited-out\n")
        yield client.wait_output("audited-out")
        client.type("exit 0\n")
        yield client.closed
        for _ in range(100):
            closed = [r for r in self.records("pty_create_session") if r.get("event")]
            if closed:
                break
            yield sleep(0.05)
        opened = [r for r in self.records("pty_create_session") if not r.get("event")]
        self.assertEqual(len(opened), 1)
        self.assertEqual(os.path.basename(opened[0]["argv"][0]), "sh")
        self.assertEqual(opened[0]["session_id"], created["session_id"])
        [end] = closed
        self.assertEqual(end["event"], "pty_closed")
        self.assertEqual(end["session_id"], created["session_id"])
        self.assertEqual(end["exit_code"], 0)
        self.assertEqual(end["bytes_in"], len("echo audited-out\nexit 0\n"))
        self.assertGreaterEqual(end["bytes_out"], len("audited-out"))
        self.assertGreater(end["duration_ms"], 0)


class UrlSecretTests(SynchronousTestCase):
    """:func:`redact_url_secrets` on the shapes clients send."""

    def test_shapes(self) -> None:
        """user:pass@, a bare token as user, token-like query values; e-mail addresses and scp forms stay."""
        from sandboxd.access.audit import redact_url_secrets

        self.assertEqual(redact_url_secrets("https://u:p@h/r"), "https://***@h/r")
        self.assertEqual(redact_url_secrets("https://TOKEN@h/r"), "https://***@h/r")
        self.assertEqual(
            redact_url_secrets("https://h/x?token=a&x=1;secret_key=b"),
            "https://h/x?token=***&x=1;secret_key=***",
        )
        self.assertEqual(
            redact_url_secrets("ada@example.com git@h:r"), "ada@example.com git@h:r"
        )
        self.assertEqual(
            redact_url_secrets(
                "http://h/?sbx_link=x&a=1 -HX-Access-Token:sbxl_eyJ-_.c2l"
            ),
            "http://h/?sbx_link=***&a=1 -HX-Access-Token:***",
        )
