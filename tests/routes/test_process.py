"""
The ``process`` group over HTTP (SPEC §7.4, §9) against a real daemon and
real children: /shell, /shell/stream, background processes and their
resumable output.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any
from unittest import SkipTest

from twisted.internet import reactor
from twisted.internet.defer import Deferred, DeferredList, inlineCallbacks
from twisted.internet.task import deferLater
from twisted.web.client import Agent
from twisted.web.http_headers import Headers

from sandboxd.policy import defaults
from sandboxd.processes import posix_spawn as spawn_module
from sandboxd.processes import service as service_module
from sandboxd.processes import spawning
from sandboxd.processes.tree import TREE_MARKER, proc_info
from sandboxd.testing import BytesProducer, SSEReader
from tests.helpers import (
    DaemonTestCase,
    group_nice,
    kill_marked,
    marked_pids,
    need_autogroups,
)


def rss_bytes() -> int:
    """The daemon's (this process's) resident memory."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def sleep_(seconds: float = 0.05) -> Deferred[None]:
    """Let the reactor run a little."""
    return deferLater(reactor, seconds, lambda: None)


def escaped(marker: str) -> bool:
    """
    Whether a ``sleep`` carrying ``marker`` has left its tree: adopted by
    the daemon (this process), its environment already cleared.
    """
    for pid in marked_pids(marker):
        info = proc_info(pid)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0]
        except OSError:
            continue
        if (
            info
            and info.ppid == os.getpid()
            and TREE_MARKER.encode() not in environ
            and argv0 == b"sleep"
        ):
            return True
    return False


@inlineCallbacks
def wait_until(predicate: Any, tries: int = 200) -> Any:
    """Poll a condition outside the reactor (processes running) until it holds."""
    for _ in range(tries):
        if predicate():
            return True
        yield sleep_(0.05)
    return False


@inlineCallbacks
def wait_exited(case: DaemonTestCase, pid: int) -> Any:
    """Poll ``/process/{pid}`` until it has exited; its last document."""
    for _ in range(200):
        reply = yield case.request("GET", f"/process/{pid}")
        if reply.json()["state"] == "exited":
            return reply.json()
        yield sleep_(0.05)
    case.fail("process did not exit")


class ProcessCase(DaemonTestCase):
    """A daemon plus a per-test marker for the processes a test starts."""

    timeout = 30

    def setUp(self) -> Any:
        # A sleep length no other process uses: it marks the test's processes.
        self.marker = f"60.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, self.marker)
        return super().setUp()

    @inlineCallbacks
    def stream(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """Open a streaming request; returns (response, SSEReader)."""
        hdrs = Headers()
        for k, v in (headers or {}).items():
            hdrs.addRawHeader(k, v)
        producer = None
        if body is not None:
            producer = BytesProducer(json.dumps(body).encode())
            hdrs.addRawHeader("Content-Type", "application/json")
        agent = Agent(reactor)
        response = yield agent.request(
            method.encode(), (self.daemon.url + path).encode(), hdrs, producer
        )
        reader = SSEReader()
        response.deliverBody(reader)
        self.addCleanup(lambda: reader.done.called or reader.disconnect())
        return response, reader

    @inlineCallbacks
    def gone(self, marker: str | None = None) -> Any:
        """Wait (bounded) until no process carries the marker; return what is left."""
        marker = marker or self.marker
        for _ in range(200):
            if not marked_pids(marker):
                break
            yield sleep_(0.05)
        return marked_pids(marker)


class ShellTests(ProcessCase):
    """POST /shell."""

    @inlineCallbacks
    def test_runs_without_shell(self) -> Any:
        """A command is shlex-split and run without a shell: no expansion."""
        reply = yield self.request("POST", "/shell", {"command": "echo 'a b' $HOME"})
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertEqual(body["stdout"], "a b $HOME\n")
        self.assertEqual((body["stderr"], body["exit_code"]), ("", 0))
        self.assertFalse(body["truncated"])

    @inlineCallbacks
    def test_shell_option(self) -> Any:
        """``"shell": "bash"`` runs the command with shell syntax; exit status kept."""
        reply = yield self.request(
            "POST",
            "/shell",
            {"command": "echo out; echo err >&2; exit 7", "shell": "bash"},
        )
        self.assertEqual(
            reply.json(),
            {
                "stdout": "out\n",
                "stderr": "err\n",
                "exit_code": 7,
                "truncated": False,
                "dropped_bytes": 0,
            },
        )

    @inlineCallbacks
    def test_cwd_defaults_to_base_dir(self) -> Any:
        """The child runs in the base dir unless cwd says otherwise."""
        reply = yield self.request("POST", "/shell", {"command": "pwd"})
        self.assertEqual(reply.json()["stdout"], self.base_dir + "\n")

    @inlineCallbacks
    def test_cwd_outside_refused(self) -> Any:
        """A cwd outside the boundary is refused by the path guard."""
        reply = yield self.request("POST", "/shell", {"command": "pwd", "cwd": "/etc"})
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "path_not_allowed")

    @inlineCallbacks
    def test_bad_commands(self) -> Any:
        """Missing, unparsable or unknown commands are 400 and spawn nothing."""
        for body in (
            {},
            {"command": ""},
            {"command": "echo 'unclosed"},
            {"command": 5},
        ):
            reply = yield self.request("POST", "/shell", body)
            self.assertEqual(reply.status, 400, body)
        reply = yield self.request(
            "POST", "/shell", {"command": "no-such-cmd-" + secrets.token_hex(3)}
        )
        self.assertEqual(reply.status, 400)
        self.assertEqual(reply.json()["type"], "FileNotFoundError")

    @inlineCallbacks
    def test_commands_the_kernel_refuses_are_400(self) -> Any:
        """An oversized env entry or argument, or a file that is not a program, is 400 on every route that starts one."""
        script = os.path.join(self.base_dir, "noshebang")
        with open(script, "w") as f:
            f.write("echo hi\n")
        os.chmod(script, 0o755)
        bodies = [
            {"command": "true", "env": {"BIG": "x" * 200_000}},
            {"command": "true", "env": {"N" * 200_000: "1"}},
            {"command": "echo " + "y" * 200_000},
            {"command": script},
        ]
        for route in ("/shell", "/shell/stream", "/process/start"):
            for body in bodies:
                reply = yield self.request("POST", route, body)
                self.assertEqual(reply.status, 400, (route, reply.body[:200]))
                self.assertEqual(reply.json()["code"], "invalid_param")
        self.assertEqual(self.flushLoggedErrors(), [])

    @inlineCallbacks
    def test_timeout_kills_group(self) -> Any:
        """Past ``timeout`` the whole group is killed and the answer is 500 TimeoutError."""
        reply = yield self.request(
            "POST",
            "/shell",
            {
                "command": f"echo started; sleep {self.marker} & sleep {self.marker}",
                "shell": "sh",
                "timeout": 0.5,
            },
        )
        self.assertEqual(reply.status, 500)
        body = reply.json()
        self.assertEqual(body["type"], "TimeoutError")
        self.assertEqual(body["stdout"], "started\n")
        left = yield self.gone()
        self.assertEqual(left, [])

    @inlineCallbacks
    def test_idle_timeout(self) -> Any:
        """No output for ``idle_timeout`` seconds: 500 and the error says IdleTimeout."""
        reply = yield self.request(
            "POST",
            "/shell",
            {
                "command": f"echo hi; sleep {self.marker}",
                "shell": "sh",
                "idle_timeout": 0.5,
            },
        )
        self.assertEqual(reply.status, 500)
        self.assertIn("IdleTimeout", reply.json()["error"])
        left = yield self.gone()
        self.assertEqual(left, [])

    @inlineCallbacks
    def test_setsid_grandchild_ignoring_term_is_killed(self) -> Any:
        """A grandchild that leaves the group with setsid and ignores TERM is still killed."""
        script = (
            f"setsid sh -c 'trap \"\" TERM; sleep {self.marker}; sleep {self.marker}' & "
            f"sleep {self.marker}"
        )
        self.daemon.context.processes.grace = 0.5
        reply = yield self.request(
            "POST", "/shell", {"command": script, "shell": "sh", "timeout": 1}
        )
        self.assertEqual(reply.status, 500)
        left = yield self.gone()
        self.assertEqual(left, [])

    @inlineCallbacks
    def test_escapee_that_cleared_its_environment_is_killed(self) -> Any:
        """
        A grandchild that leaves with ``setsid -f`` (its parent gone at
        once, so the daemon adopts it), clears its environment and ignores
        TERM still ends with the command on its timeout.
        """
        script = (
            f"setsid -f env -i sh -c 'trap \"\" TERM; exec sleep {self.marker}'; "
            f"sleep {self.marker}"
        )
        self.daemon.context.processes.grace = 0.5
        reply = yield self.request(
            "POST", "/shell", {"command": script, "shell": "sh", "timeout": 1}
        )
        self.assertEqual(reply.status, 500)
        left = yield self.gone()
        self.assertEqual(left, [])

    @inlineCallbacks
    def test_stdin_is_closed(self) -> Any:
        """A command reading stdin gets EOF at once instead of hanging."""
        reply = yield self.request("POST", "/shell", {"command": "cat", "timeout": 10})
        self.assertEqual(reply.json()["exit_code"], 0)

    @inlineCallbacks
    def test_output_cap_keeps_head_and_tail(self) -> Any:
        """Output past max_output_bytes keeps its start and end with dropped_bytes."""
        yield self.daemon.stop()
        yield self.start(
            policy={"endpoints": {"shell": {"limits": {"max_output_bytes": 1000}}}}
        )
        script = "echo FIRST; head -c 200000000 /dev/zero; echo; echo LAST"
        rss = rss_bytes()
        reply = yield self.request("POST", "/shell", {"command": script, "shell": "sh"})
        self.assertLess(rss_bytes() - rss, 32 << 20)
        body = reply.json()
        self.assertTrue(body["truncated"])
        self.assertTrue(body["stdout"].startswith("FIRST\n"))
        self.assertTrue(body["stdout"].endswith("LAST\n"))
        # The cap includes the line naming what was dropped (issue 22).
        self.assertLessEqual(len(body["stdout"]), 1000)
        line = f"\n[... {body['dropped_bytes']} bytes dropped ...]\n"
        self.assertIn(line, body["stdout"])
        kept = len(body["stdout"]) - len(line)
        self.assertEqual(body["dropped_bytes"], 200000000 + 6 + 1 + 5 - kept)

    @inlineCallbacks
    def test_secrets_absent_from_child_env(self) -> Any:
        """
        ABX_SERVER_*, token_env names and env_deny never reach the child; a
        request's env naming a secret one is 403.
        """
        os.environ["ABX_SERVER_SECRET_THING"] = "leak1"
        os.environ["SBX_TEST_CI_TOKEN"] = "leak2"
        os.environ["SBX_TEST_DENIED"] = "leak3"
        os.environ["SBX_TEST_KEPT"] = "kept"
        for name in (
            "ABX_SERVER_SECRET_THING",
            "SBX_TEST_CI_TOKEN",
            "SBX_TEST_DENIED",
            "SBX_TEST_KEPT",
        ):
            self.addCleanup(os.environ.pop, name, None)
        yield self.daemon.stop()
        yield self.start(
            policy={
                "auth": {
                    "tokens": [
                        {"id": "ci", "token_env": "SBX_TEST_CI_TOKEN", "scopes": ["*"]}
                    ]
                },
                "endpoints": {"shell": {"params": {"env_deny": ["SBX_TEST_DENIED"]}}},
            },
            environ={"SBX_TEST_CI_TOKEN": "leak2"},
        )
        for name in ("ABX_SERVER_TOKEN", "SBX_TEST_CI_TOKEN"):
            # Asking for one is refused, as on the seed, not quietly dropped.
            reply = yield self.request(
                "POST",
                "/shell",
                {"command": "env", "env": {name: "x", "MINE": "1"}},
                token="leak2",
            )
            self.assertEqual(
                (reply.status, reply.json()["code"]), (403, "protected_variable")
            )
        reply = yield self.request(
            "POST", "/shell", {"command": "env", "env": {"MINE": "1"}}, token="leak2"
        )
        self.assertEqual(reply.status, 200, reply.body)
        out = reply.json()["stdout"]
        for leak in ("leak1", "leak2", "leak3", "ABX_SERVER"):
            self.assertNotIn(leak, out)
        self.assertIn("SBX_TEST_KEPT=kept", out)
        self.assertIn("MINE=1", out)

    @inlineCallbacks
    def test_disallowed_shell_and_command(self) -> Any:
        """
        A shell outside params.shells is 403 param_not_allowed; a denied
        command is 403 command_not_allowed (the seed's code).
        """
        yield self.daemon.stop()
        yield self.start(
            policy={"endpoints": {"shell": {"params": {"deny_commands": ["rm"]}}}}
        )
        reply = yield self.request(
            "POST", "/shell", {"command": "true", "shell": "zsh"}
        )
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "param_not_allowed")
        )
        reply = yield self.request("POST", "/shell", {"command": "rm -rf x"})
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "command_not_allowed")
        )

    @inlineCallbacks
    def test_shell_in_the_command_is_checked_as_one(self) -> Any:
        """
        A command whose program is a shell handed a script (``sh -c '...'``)
        is checked as the ``shell``
        and ``command`` fields are: the script's words see deny_commands,
        and a shell params.shells leaves out is refused, not run.
        """
        yield self.daemon.stop()
        yield self.start(
            policy={
                "endpoints": {
                    "shell": {"params": {"deny_commands": ["rm"]}},
                    "process_start": {
                        "params": {"deny_commands": ["rm"], "shells": ["bash"]}
                    },
                }
            }
        )
        target = os.path.join(self.base_dir, "kept")
        os.makedirs(target)
        for command in (f"sh -c 'rm -rf {target}'", f"bash -lc 'rm -r {target}'"):
            reply = yield self.request("POST", "/shell", {"command": command})
            self.assertEqual(
                (reply.status, reply.json()["code"]), (403, "command_not_allowed")
            )
        reply = yield self.request(
            "POST", "/process/start", {"command": f"/bin/bash -c 'rm -r {target}'"}
        )
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "command_not_allowed")
        )
        reply = yield self.request("POST", "/process/start", {"command": "sh -c true"})
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "param_not_allowed")
        )
        self.assertTrue(os.path.isdir(target))
        reply = yield self.request("POST", "/shell", {"command": "sh -c 'echo fine'"})
        self.assertEqual((reply.status, reply.json()["stdout"]), (200, "fine\n"))

    @inlineCallbacks
    def test_shells_by_path(self) -> Any:
        """
        A ``shells`` entry that is a path (as agent-sandbox-server's
        policies write them) allows that path, not another program of the
        same name, nor the name alone.
        """
        sh = shutil.which("sh")
        assert sh is not None
        impostor = os.path.join(self.base_dir, "sh")
        os.symlink(sh, impostor)
        yield self.daemon.stop()
        yield self.start(policy={"endpoints": {"shell": {"params": {"shells": [sh]}}}})
        reply = yield self.request(
            "POST", "/shell", {"command": "echo $0", "shell": sh}
        )
        self.assertEqual((reply.status, reply.json()["stdout"]), (200, f"{sh}\n"))
        for other in (impostor, "sh"):
            reply = yield self.request(
                "POST", "/shell", {"command": "true", "shell": other}
            )
            self.assertEqual(
                (reply.status, reply.json()["code"]), (403, "param_not_allowed")
            )

    @inlineCallbacks
    def test_program_below_proc_refused(self) -> Any:
        """
        A program named by a path below /proc, /sys or /dev, or by a link
        in the base that leads there, is 403 path_not_allowed on every
        route that starts one, and nothing runs.
        """
        marker = os.path.join(self.base_dir, "ran")
        os.symlink("/proc/self/exe", os.path.join(self.base_dir, "python"))
        for command in (
            "/proc/self/exe",
            f"/proc/self/exe -c 'open({marker!r}, \"w\")'",
            f"./python -c 'open({marker!r}, \"w\")'",
            "/dev/../proc/self/exe",
        ):
            for path in ("/shell", "/shell/stream", "/process/start"):
                reply = yield self.request("POST", path, {"command": command})
                self.assertEqual(
                    (reply.status, reply.json()["code"], reply.json()["rule"]),
                    (403, "path_not_allowed", "guard:system-paths"),
                    (path, command),
                )
        self.assertFalse(os.path.exists(marker))
        reply = yield self.request("GET", "/process/list")
        self.assertEqual(reply.json()["processes"], [])
        reply = yield self.request("POST", "/shell", {"command": "/bin/echo ok"})
        self.assertEqual((reply.status, reply.json()["stdout"]), (200, "ok\n"))

    @inlineCallbacks
    def test_run_as_user(self) -> Any:
        """As root, ``user`` runs the child as that user with HOME/USER set."""
        if os.geteuid() != 0:
            self.skipTest("needs root")
        reply = yield self.request(
            "POST",
            "/shell",
            {
                "command": "sh -c 'id -un; echo $USER'",
                "user": "nobody",
                "cwd": "/tmp" if False else None,
            },
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stdout"], "nobody\nnobody\n", reply.body)
        reply = yield self.request(
            "POST", "/shell", {"command": "id -un", "user": "root"}
        )
        self.assertEqual(reply.status, 403)

    @inlineCallbacks
    def test_draining_refuses(self) -> Any:
        """While the daemon shuts down, new children are refused with 503."""
        self.daemon.context.draining = True
        reply = yield self.request("POST", "/shell", {"command": "true"})
        self.assertEqual(reply.status, 503)
        self.daemon.context.draining = False


class ShellRevokedTests(ProcessCase):
    """A policy reload ends the ``/shell`` command of a caller it no longer lets in."""

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        return self.start_on_policy_file(self.tokens_policy(["*"]))

    def tokens_policy(self, agent_scopes: list[str] | None) -> dict[str, Any]:
        tokens = [
            {
                "id": "keeper",
                "token_sha256": hashlib.sha256(b"keeper-token").hexdigest(),
                "scopes": ["*"],
            }
        ]
        if agent_scopes is not None:
            tokens.append(
                {
                    "id": "agent",
                    "token_sha256": hashlib.sha256(b"agent-token").hexdigest(),
                    "scopes": agent_scopes,
                }
            )
        return {"auth": {"tokens": tokens}}

    @inlineCallbacks
    def check_revoked(self, policy: dict[str, Any], status: int, says: str) -> Any:
        running = self.request(
            "POST",
            "/shell",
            {"command": f"sleep {self.marker}"},
            token="agent-token",
        )
        up = yield wait_until(lambda: bool(marked_pids(self.marker)))
        self.assertTrue(up)
        began = time.monotonic()
        self.reload_policy(policy)
        reply = yield running
        self.assertLess(time.monotonic() - began, 10)
        self.assertEqual(reply.status, status, reply.body)
        self.assertIn(says, reply.json()["error"])
        left = yield self.gone()
        self.assertEqual(left, [])
        other = yield self.request(
            "POST", "/shell", {"command": "echo ok"}, token="keeper-token"
        )
        self.assertEqual((other.status, other.json()["stdout"]), (200, "ok\n"))

    def test_removed_identity(self) -> Any:
        """
        Taking the caller's token out of the policy answers its running
        ``/shell`` 401 at the reload and kills the command, rather than
        letting it run to its end; another token's calls go on.
        """
        return self.check_revoked(
            self.tokens_policy(None), 401, "'agent' is no longer in the policy"
        )

    def test_scope_taken_away(self) -> Any:
        """Taking ``process:run`` away does the same, 403."""
        return self.check_revoked(
            self.tokens_policy(["files:read"]), 403, "process:run"
        )


class ShellStreamTests(ProcessCase):
    """POST /shell/stream."""

    @inlineCallbacks
    def test_interleaved_in_order_then_exit(self) -> Any:
        """stdout and stderr lines arrive in the order produced; exit is last."""
        script = "for i in 1 2 3; do echo out$i; sleep 0.05; echo err$i >&2; sleep 0.05; done; printf tail"
        response, reader = yield self.stream(
            "POST", "/shell/stream", {"command": script, "shell": "sh"}
        )
        self.assertEqual(response.code, 200)
        self.assertEqual(
            response.headers.getRawHeaders("content-type"), ["text/event-stream"]
        )
        events = yield reader.done
        got = [(e["event"], e["data"]) for e in events]
        expected = []
        for i in (1, 2, 3):
            expected += [
                ("stdout", {"data": f"out{i}"}),
                ("stderr", {"data": f"err{i}"}),
            ]
        # The last line had no newline: its event says so.
        expected += [
            ("stdout", {"data": "tail", "newline": False}),
            ("exit", {"exit_code": 0}),
        ]
        self.assertEqual(got, expected)

    @inlineCallbacks
    def test_first_event_before_command_ends(self) -> Any:
        """A line is sent as soon as it completes, while the command still runs."""
        _, reader = yield self.stream(
            "POST",
            "/shell/stream",
            {"command": f"echo first; sleep {self.marker}", "shell": "sh"},
        )
        yield reader.wait_for(lambda r: r.events)
        self.assertEqual(reader.events[0]["data"], {"data": "first"})
        self.assertNotEqual(marked_pids(self.marker), [])

    @inlineCallbacks
    def test_disconnect_kills_tree(self) -> Any:
        """A client that leaves kills the child's whole tree."""
        _, reader = yield self.stream(
            "POST",
            "/shell/stream",
            {
                "command": f"echo go; sleep {self.marker} & sleep {self.marker}",
                "shell": "sh",
            },
        )
        yield reader.wait_for(lambda r: r.events)
        self.assertNotEqual(marked_pids(self.marker), [])
        reader.disconnect()
        left = yield self.gone()
        self.assertEqual(left, [])

    @inlineCallbacks
    def test_timeout_error_then_exit(self) -> Any:
        """A timeout sends ``error`` (TimeoutError) then ``exit`` with minus the signal."""
        _, reader = yield self.stream(
            "POST",
            "/shell/stream",
            {"command": f"sleep {self.marker}", "timeout": 0.3},
        )
        events = yield reader.done
        self.assertEqual([e["event"] for e in events], ["error", "exit"])
        error = events[0]["data"]
        # "error" is the seed's word its SDK turns into CommandTimeoutError.
        self.assertEqual(
            (error["error"], error["type"], error["code"]),
            ("timeout", "TimeoutError", "timeout"),
        )
        self.assertIn("timed out after 0.3 seconds", error["message"])
        self.assertEqual(events[1]["data"], {"exit_code": -signal.SIGTERM})

    @inlineCallbacks
    def test_bursts_coalesced(self) -> Any:
        """Many lines produced at once arrive in few writes, every line intact."""
        _, reader = yield self.stream(
            "POST", "/shell/stream", {"command": "seq 1 20000"}
        )
        events = yield reader.done
        lines = [e["data"]["data"] for e in events if e["event"] == "stdout"]
        self.assertEqual(lines, [str(i) for i in range(1, 20001)])
        self.assertLess(reader.writes, 200)

    @inlineCallbacks
    def test_slow_client_pauses_child(self) -> Any:
        """A client that stops reading pauses the child instead of growing daemon memory."""
        _, reader = yield self.stream(
            "POST", "/shell/stream", {"command": f"yes {self.marker}"}
        )
        yield reader.wait_for(lambda r: r.events)
        reader.transport.pauseProducing()
        paused = []
        for _ in range(400):
            paused = [c for c in self.daemon.context.children.live if c.paused]
            if paused:
                break
            yield sleep_(0.05)
        self.assertEqual(len(paused), 1)
        rss = rss_bytes()
        yield sleep_(0.5)
        self.assertLess(rss_bytes() - rss, 8 << 20)
        reader.transport.resumeProducing()
        yield reader.wait_for(
            lambda r: not [c for c in self.daemon.context.children.live if c.paused]
        )
        reader.disconnect()
        left = yield self.gone()
        self.assertEqual(left, [])

    @inlineCallbacks
    def test_invalid_request_is_json(self) -> Any:
        """An invalid request gets an ordinary JSON error, not a stream."""
        reply = yield self.request("POST", "/shell/stream", {"command": "echo 'x"})
        self.assertEqual(reply.status, 400)
        self.assertEqual(reply.json()["type"], "ValueError")

    @inlineCallbacks
    def test_special_characters(self) -> Any:
        """Quotes, backslashes, CRLF, tabs and invalid UTF-8 survive as JSON lines."""
        script = r"printf 'a\042b\134c\r\nt\tx\n\377z\nend'"
        _, reader = yield self.stream(
            "POST", "/shell/stream", {"command": script, "shell": "sh"}
        )
        events = yield reader.done
        lines = [e["data"]["data"] for e in events if e["event"] == "stdout"]
        self.assertEqual(lines, ['a"b\\c', "t\tx", "\ufffdz", "end"])

    @inlineCallbacks
    def test_bytes_of_a_multi_line_read(self) -> Any:
        """Lines printed at once, plain and awkward, arrive as these exact bytes."""
        script = r"printf '1\n2\nq\042b\134c\r\nt\tx\n\377z\n3\nend'"
        _, reader = yield self.stream(
            "POST", "/shell/stream", {"command": script, "shell": "sh"}
        )
        yield reader.done
        self.assertEqual(
            reader.raw,
            b'event: stdout\ndata: {"data":"1"}\n\n'
            b'event: stdout\ndata: {"data":"2"}\n\n'
            b'event: stdout\ndata: {"data":"q\\"b\\\\c"}\n\n'
            b'event: stdout\ndata: {"data":"t\\tx"}\n\n'
            b'event: stdout\ndata: {"data":"\xef\xbf\xbdz"}\n\n'
            b'event: stdout\ndata: {"data":"3"}\n\n'
            b'event: stdout\ndata: {"data":"end","newline":false}\n\n'
            b'event: exit\ndata: {"exit_code":0}\n\n',
        )


class ShellStreamBytesTests(ProcessCase):
    """POST /shell/stream with output=bytes and stdin_base64."""

    @inlineCallbacks
    def test_bytes_and_stdin(self) -> Any:
        """Raw reads as data_base64 rebuild the output exactly; stdin is read to EOF."""
        sent = b"\xff\xfe\x00line\nno newline"
        response, reader = yield self.stream(
            "POST",
            "/shell/stream",
            {
                "command": "cat; printf '\\377' >&2",
                "shell": "sh",
                "output": "bytes",
                "stdin_base64": base64.b64encode(sent).decode(),
            },
        )
        self.assertEqual(response.code, 200)
        events = yield reader.done
        out = b"".join(
            base64.b64decode(e["data"]["data_base64"])
            for e in events
            if e["event"] == "stdout"
        )
        err = b"".join(
            base64.b64decode(e["data"]["data_base64"])
            for e in events
            if e["event"] == "stderr"
        )
        self.assertEqual(out, sent)
        self.assertEqual(err, b"\xff")
        self.assertEqual(events[-1], {"event": "exit", "data": {"exit_code": 0}})

    @inlineCallbacks
    def test_bad_options_are_400(self) -> Any:
        """An unknown output mode or stdin that is not base64 is 400, not a stream."""
        for body in (
            {"command": "true", "output": "text"},
            {"command": "true", "stdin_base64": "not base64!"},
            {"command": "true", "stdin_base64": 5},
        ):
            reply = yield self.request("POST", "/shell/stream", body)
            self.assertEqual(reply.status, 400, body)


class BackgroundTests(ProcessCase):
    """POST /process/start and friends."""

    @inlineCallbacks
    def start_process(self, command: str, **extra: Any) -> Any:
        body = {"command": command, "shell": "sh"}
        body.update(extra)
        reply = yield self.request("POST", "/process/start", body)
        self.assertEqual(reply.status, 200, reply.body)
        pid = reply.json()["pid"]
        self.addCleanup(self._kill, pid)
        return reply.json()

    def _kill(self, pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass

    def wait_exited(self, pid: int) -> Any:
        return wait_exited(self, pid)

    @inlineCallbacks
    def test_start_list_get(self) -> Any:
        """A started process is listed with its tag, running, then exited with its code."""
        started = yield self.start_process(f"sleep {self.marker}", tag="build")
        self.assertEqual(started["tag"], "build")
        pid = started["pid"]
        reply = yield self.request("GET", "/process/list?tag=build")
        [entry] = reply.json()["processes"]
        self.assertEqual(
            (entry["pid"], entry["state"], entry["exit_code"]), (pid, "running", None)
        )
        reply = yield self.request("GET", "/process/list?tag=other")
        self.assertEqual(reply.json()["processes"], [])
        reply = yield self.request("POST", f"/process/{pid}/signal", {"signal": 15})
        self.assertEqual(reply.json(), {"pid": pid, "signal": 15})
        info = yield self.wait_exited(pid)
        self.assertEqual(info["exit_code"], -15)
        reply = yield self.request("GET", "/process/list")
        self.assertIn(pid, [p["pid"] for p in reply.json()["processes"]])

    @inlineCallbacks
    def test_exited_kept_within_their_bytes(self) -> Any:
        """
        Exited processes stay listed while their output fits the bytes
        kept for them all; past it the oldest go first, and the most
        recent stays with its whole output.
        """
        self.patch(defaults, "PROCESS_HISTORY_BYTES", 1500)
        self.patch(service_module, "PROCESS_HISTORY_BYTES", 1500)
        pids = []
        for size in (600, 600, 2000):
            started = yield self.start_process(
                f"head -c {size} /dev/zero | tr '\\0' a", capture_output=True
            )
            pids.append(started["pid"])
            yield self.wait_exited(pids[-1])
            reply = yield self.request("GET", "/process/list")
            listed = [p["pid"] for p in reply.json()["processes"]]
            self.assertEqual(listed, pids if size < 1000 else pids[-1:])
        reply = yield self.request("GET", f"/process/{pids[-1]}/output?after=0")
        output = "".join(e["data"] for e in reply.json()["events"])
        self.assertEqual(output, "a" * 2000)
        reply = yield self.request("GET", f"/process/{pids[0]}")
        self.assertEqual(reply.status, 404)

    @inlineCallbacks
    def test_get_errors(self) -> Any:
        """Non-integer pid → 400; unmanaged → 404 NotFoundError, saying "not found"."""
        reply = yield self.request("GET", "/process/abc")
        self.assertEqual(reply.status, 400)
        reply = yield self.request("GET", f"/process/{os.getpid()}")
        self.assertEqual((reply.status, reply.json()["type"]), (404, "NotFoundError"))
        self.assertIn(f"process {os.getpid()} not found", reply.json()["error"])

    @inlineCallbacks
    def test_signal_what_an_exited_command_left(self) -> Any:
        """
        A command that started something in the background and ended can
        still be signalled: what it left running (in its group, and one
        that left the group) gets the signal; once nothing is left, 404.
        """
        m = self.marker
        started = yield self.start_process(f"sleep {m} & setsid sleep {m} & echo ok")
        pid = started["pid"]
        yield self.wait_exited(pid)
        self.assertEqual(len(marked_pids(m)), 2)
        reply = yield self.request("POST", f"/process/{pid}/signal", {"signal": "TERM"})
        self.assertEqual(reply.status, 200, reply.body)
        answer = reply.json()
        # Both, or on a busy machine the one in the group alone at first,
        # the other (setsid, still exec'ing) found a moment later.
        self.assertIn(answer.pop("leftovers"), (1, 2))
        self.assertEqual(answer, {"pid": pid, "signal": 15, "exited": True})
        left = yield self.gone(m)
        self.assertEqual(left, [])
        reply = yield self.request("POST", f"/process/{pid}/signal", {"signal": 15})
        self.assertEqual((reply.status, reply.json()["code"]), (404, "not_found"))
        self.assertIn("no process it started was found running", reply.json()["error"])

    @inlineCallbacks
    def test_kill_what_an_exited_command_left(self) -> Any:
        """9 ends what an exited command left, a process that ignores TERM too."""
        m = self.marker
        started = yield self.start_process(
            f"(trap '' TERM; setsid sleep {m}) & sleep {m} & echo ok"
        )
        pid = started["pid"]
        yield self.wait_exited(pid)
        reply = yield self.request("POST", f"/process/{pid}/signal", {"signal": 9})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertTrue(reply.json()["exited"])
        left = yield self.gone(m)
        self.assertEqual(left, [])

    @inlineCallbacks
    def test_kill_escapee_that_cleared_its_environment(self) -> Any:
        """
        9 to a running process ends a descendant that left with ``setsid
        -f`` and cleared its environment (nothing in it names its tree),
        as it ends the rest; one the same way that started before the
        process began is someone else's and is left alone.
        """
        m = self.marker
        before = f"61.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, before)
        earlier = yield self.start_process(f"setsid -f env -i sleep {before}")
        yield self.wait_exited(earlier["pid"])
        found = yield wait_until(lambda: escaped(before))
        self.assertTrue(found)
        yield sleep_(0.02)  # a clock tick: /proc's start times are no finer
        started = yield self.start_process(
            f"setsid -f env -i sh -c 'trap \"\" TERM HUP; exec sleep {m}'; sleep {m}"
        )
        found = yield wait_until(lambda: escaped(m))
        self.assertTrue(found, marked_pids(m))
        reply = yield self.request(
            "POST", f"/process/{started['pid']}/signal", {"signal": 9}
        )
        self.assertEqual(reply.status, 200, reply.body)
        left = yield self.gone(m)
        self.assertEqual(left, [])
        self.assertEqual(len(marked_pids(before)), 1)

    @inlineCallbacks
    def test_kill_spares_the_daemons_own_children(self) -> Any:
        """
        A child the daemon's process started some other way (no marker, in
        the daemon's own session, after the command began) is not taken
        for the command's escapee: 9 to the command leaves it running.
        """
        m = self.marker
        started = yield self.start_process(f"sleep {m}")
        yield sleep_(0.02)  # a clock tick: /proc's start times are no finer
        other = f"62.{secrets.randbelow(10**12):012d}"
        own = subprocess.Popen(["sleep", other], env={})
        self.addCleanup(lambda: (own.kill(), own.wait()))
        reply = yield self.request(
            "POST", f"/process/{started['pid']}/signal", {"signal": 9}
        )
        self.assertEqual(reply.status, 200, reply.body)
        left = yield self.gone(m)
        self.assertEqual(left, [])
        yield sleep_(0.2)
        self.assertIsNone(own.poll())

    @inlineCallbacks
    def test_kill_what_an_exited_command_left_without_environment(self) -> Any:
        """
        9 ends what an exited command left when that cleared its
        environment and ignores TERM: it started while the command ran.
        """
        m = self.marker
        started = yield self.start_process(
            f"setsid -f env -i sh -c 'trap \"\" TERM; exec sleep {m}'; echo ok"
        )
        pid = started["pid"]
        yield self.wait_exited(pid)
        found = yield wait_until(lambda: escaped(m))
        self.assertTrue(found)
        reply = yield self.request("POST", f"/process/{pid}/signal", {"signal": 9})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["leftovers"], 1)
        left = yield self.gone(m)
        self.assertEqual(left, [])

    @inlineCallbacks
    def test_kill_double_forked_daemon_that_cleared_its_environment(self) -> Any:
        """
        A classic double-fork daemon (fork, the command exits; ``setsid``;
        fork again, the first child exits; the grandchild clears its
        environment and execs) is what the exited command left, every
        time: its document counts it and 9 ends it.  The grandchild starts
        after the command was reaped and nothing it carries names the
        tree; it is known by the session its parent, a process of the
        tree that the daemon adopted, led.  Some rounds fork at once, as
        the prober's did; others work a moment before the second fork.
        """
        m = self.marker
        program = (
            "import os, time\n"
            "if os.fork(): os._exit(0)\n"
            "os.setsid()\n"
            "time.sleep({pause})\n"
            "if os.fork(): os._exit(0)\n"
            f"os.environ.clear(); os.execv('/bin/sleep', ['sleep', '{m}'])"
        )
        for pause in (0, 0, 0, 0, 0, 0.05, 0.2, 0.3):
            command = f"{shlex.quote(sys.executable)} -c {shlex.quote(program.format(pause=pause))}"
            started = yield self.start_process(command)
            pid = started["pid"]
            yield self.wait_exited(pid)
            found = yield wait_until(lambda: escaped(m))
            self.assertTrue(found, marked_pids(m))
            yield sleep_(0.1)
            detail = (yield self.request("GET", f"/process/{pid}")).json()
            self.assertEqual(detail["leftovers"], 1, (pause, detail))
            reply = yield self.request("POST", f"/process/{pid}/signal", {"signal": 9})
            self.assertEqual(reply.status, 200, (pause, reply.body))
            self.assertEqual(reply.json()["leftovers"], 1)
            left = yield self.gone(m)
            self.assertEqual(left, [], pause)

    # Eight rounds of spawns and waits: room for a busy machine.
    test_kill_double_forked_daemon_that_cleared_its_environment.timeout = 60  # type: ignore[attr-defined]

    @inlineCallbacks
    def test_tstp_stops_and_cont_resumes(self) -> Any:
        """
        20 (TSTP) pauses a process (state T), though the kernel ignores a
        terminal's stop in its group; 18 (CONT) resumes it.
        """
        started = yield self.start_process(f"exec sleep {self.marker}")
        pid = started["pid"]

        def state() -> str | None:
            info = proc_info(pid)
            return info.state if info else None

        reply = yield self.request("POST", f"/process/{pid}/signal", {"signal": "TSTP"})
        self.assertEqual(reply.json(), {"pid": pid, "signal": 20})
        stopped = yield wait_until(lambda: state() == "T", tries=40)
        self.assertTrue(stopped, state())
        reply = yield self.request("POST", f"/process/{pid}/signal", {"signal": 18})
        self.assertEqual(reply.status, 200)
        resumed = yield wait_until(lambda: state() == "S", tries=40)
        self.assertTrue(resumed, state())

    @inlineCallbacks
    def test_timed_out_is_said_everywhere(self) -> Any:
        """
        A background process ended on its timeout says so in its document,
        the list and its output page, not only in the follow stream.
        """
        started = yield self.start_process(f"sleep {self.marker}", timeout=0.3)
        pid = started["pid"]
        detail = yield self.wait_exited(pid)
        self.assertIs(detail["timed_out"], True)
        listed = (yield self.request("GET", "/process/list")).json()["processes"]
        self.assertEqual([p["timed_out"] for p in listed if p["pid"] == pid], [True])
        page = (yield self.request("GET", f"/process/{pid}/output?after=0")).json()
        self.assertIs(page["timed_out"], True)
        quick = yield self.start_process("true")
        detail = yield self.wait_exited(quick["pid"])
        self.assertIs(detail["timed_out"], False)

    @inlineCallbacks
    def test_leftovers_shown(self) -> Any:
        """
        An exited command that left something running says how many in its
        document and the list; none once they are gone; null while running.
        """
        m = self.marker
        started = yield self.start_process(f"(sleep {m}) & echo started")
        pid = started["pid"]
        detail = yield self.wait_exited(pid)
        self.assertEqual((detail["exit_code"], detail["leftovers"]), (0, 1))
        listed = (yield self.request("GET", "/process/list")).json()["processes"]
        self.assertEqual([p["leftovers"] for p in listed if p["pid"] == pid], [1])
        running = yield self.start_process(f"sleep {m}")
        detail = (yield self.request("GET", f"/process/{running['pid']}")).json()
        self.assertIsNone(detail["leftovers"])
        reply = yield self.request("POST", f"/process/{pid}/signal", {"signal": 9})
        self.assertEqual(reply.json()["leftovers"], 1)
        for _ in range(100):
            detail = (yield self.request("GET", f"/process/{pid}")).json()
            if detail["leftovers"] == 0:
                break
            yield sleep_(0.05)
        self.assertEqual(detail["leftovers"], 0)

    @inlineCallbacks
    def test_signal_rules(self) -> Any:
        """Signals outside the allowlist are 400; pid 1 and the daemon are 403."""
        started = yield self.start_process(f"sleep {self.marker}")
        pid = started["pid"]
        reply = yield self.request("POST", f"/process/{pid}/signal", {"signal": 1})
        self.assertEqual(
            (reply.status, reply.json()["code"]), (400, "signal_not_allowed")
        )
        for target in (1, os.getpid()):
            reply = yield self.request(
                "POST", f"/process/{target}/signal", {"signal": 15}
            )
            self.assertEqual(
                (reply.status, reply.json()["type"]), (403, "PermissionError")
            )
        reply = yield self.request("POST", f"/process/{pid}/signal", {})
        self.assertEqual(reply.status, 400)
        reply = yield self.request("POST", "/process/999999999/signal", {"signal": 15})
        self.assertEqual(reply.status, 404)

    @inlineCallbacks
    def test_cap_429(self) -> Any:
        """Past max_processes running, /process/start is 429 ResourceError."""
        yield self.daemon.stop()
        yield self.start(
            policy={"endpoints": {"process_start": {"limits": {"max_processes": 2}}}}
        )
        yield self.start_process(f"sleep {self.marker}")
        yield self.start_process(f"sleep {self.marker}")
        reply = yield self.request(
            "POST", "/process/start", {"command": f"sleep {self.marker}"}
        )
        self.assertEqual(reply.status, 429)
        self.assertEqual(reply.json()["type"], "ResourceError")

    @inlineCallbacks
    def test_paged_output(self) -> Any:
        """Output is kept as seq-numbered chunks; ``after`` pages it."""
        started = yield self.start_process(
            "echo one; echo two >&2; sleep 0.2; echo three"
        )
        pid = started["pid"]
        yield self.wait_exited(pid)
        yield sleep_(0.3)
        reply = yield self.request("GET", f"/process/{pid}/output")
        body = reply.json()
        self.assertEqual(body["state"], "exited")
        self.assertEqual(body["exit_code"], 0)
        text = "".join(e["data"] for e in body["events"] if e["stream"] == "stdout")
        self.assertEqual(text, "one\nthree\n")
        self.assertEqual(
            [e["seq"] for e in body["events"]], list(range(1, len(body["events"]) + 1))
        )
        self.assertEqual(body["next"], body["events"][-1]["seq"])
        reply = yield self.request("GET", f"/process/{pid}/output?after={body['next']}")
        self.assertEqual(reply.json()["events"], [])
        self.assertEqual(reply.json()["next"], body["next"])

    @inlineCallbacks
    def test_stdin_pipe(self) -> Any:
        """``stdin: true`` keeps a pipe: data is fed, eof ends the reader."""
        started = yield self.start_process("cat", stdin=True)
        pid = started["pid"]
        reply = yield self.request("POST", f"/process/{pid}/stdin", {"data": "hello\n"})
        self.assertEqual(
            reply.json(), {"pid": pid, "written": 6, "closed": False, "bytes": 6}
        )
        reply = yield self.request("POST", f"/process/{pid}/stdin", {"eof": True})
        self.assertEqual(
            reply.json(), {"pid": pid, "written": 0, "closed": True, "bytes": 0}
        )
        info = yield self.wait_exited(pid)
        self.assertEqual(info["exit_code"], 0)
        yield sleep_(0.3)
        reply = yield self.request("GET", f"/process/{pid}/output")
        self.assertEqual("".join(e["data"] for e in reply.json()["events"]), "hello\n")

    @inlineCallbacks
    def test_stdin_closed_by_default(self) -> Any:
        """Without ``stdin: true`` the child's stdin is /dev/null and stdin writes are 409."""
        started = yield self.start_process(f"cat; sleep {self.marker}")
        reply = yield self.request(
            "POST", f"/process/{started['pid']}/stdin", {"data": "x"}
        )
        self.assertEqual(
            (reply.status, reply.json()["code"], reply.json()["type"]),
            (409, "stdin_closed", "ConflictError"),
        )

    @inlineCallbacks
    def test_follow_resume_without_loss_or_repeat(self) -> Any:
        """A follower that reconnects with Last-Event-ID gets every chunk exactly once, then exit."""
        started = yield self.start_process(
            "i=0; while [ $i -lt 30 ]; do echo line$i; i=$((i+1)); sleep 0.02; done"
        )
        pid = started["pid"]
        _, first = yield self.stream("GET", f"/process/{pid}/output?follow=true")
        yield first.wait_for(lambda r: len(r.events) >= 3)
        first.disconnect()
        last = first.events[-1]["id"]
        yield sleep_(0.2)
        _, second = yield self.stream(
            "GET",
            f"/process/{pid}/output?follow=true",
            headers={"Last-Event-ID": str(last)},
        )
        events = yield second.done
        self.assertEqual(events[-1]["event"], "exit")
        ids = [e["id"] for e in first.events] + [e["id"] for e in events]
        self.assertEqual(ids, list(range(1, len(ids) + 1)))
        text = "".join(
            e["data"]["data"] for e in first.events + events if e["event"] == "stdout"
        )
        self.assertEqual(text, "".join(f"line{i}\n" for i in range(30)))

    @inlineCallbacks
    def test_follow_ends_when_its_link_is_revoked(self) -> Any:
        """
        Output followed with a capability link ends, with an ``error``
        event saying why, when the link is revoked: the stream lasts as
        long as its client keeps it, the link's power must not.
        """
        started = yield self.start_process("while true; do echo tick; sleep 0.1; done")
        minted = yield self.request(
            "POST", "/auth/links", {"audience": "console", "scopes": ["process:read"]}
        )
        self.assertEqual(minted.status, 201, minted.body)
        link = minted.json()
        _, reader = yield self.stream(
            "GET",
            f"/process/{started['pid']}/output?follow=true",
            headers={"Authorization": f"Bearer {link['token']}"},
        )
        yield reader.wait_for(lambda r: len(r.events) >= 2)
        gone = yield self.request("DELETE", f"/auth/links/{link['link_id']}")
        self.assertEqual(gone.status, 200, gone.body)
        events = yield reader.done
        self.assertEqual(events[-1]["event"], "error")
        self.assertEqual(
            events[-1]["data"], {"error": "the link was revoked", "type": "AuthError"}
        )

    @inlineCallbacks
    def test_follow_finished_process_ends_with_exit(self) -> Any:
        """Following a finished process replays what is kept and ends with its exit."""
        started = yield self.start_process("echo done")
        yield self.wait_exited(started["pid"])
        yield sleep_(0.3)
        _, reader = yield self.stream(
            "GET", f"/process/{started['pid']}/output?follow=true&after=0"
        )
        events = yield reader.done
        self.assertEqual([e["event"] for e in events], ["stdout", "exit"])
        self.assertEqual(events[-1]["data"], {"exit_code": 0})

    @inlineCallbacks
    def test_gap_when_dropped(self) -> Any:
        """Asking for events already dropped starts the stream with ``gap``."""
        yield self.daemon.stop()
        yield self.start(
            policy={
                "endpoints": {"process_start": {"limits": {"max_output_bytes": 2000}}}
            }
        )
        started = yield self.start_process("seq 1 5000")
        yield self.wait_exited(started["pid"])
        yield sleep_(0.3)
        _, reader = yield self.stream(
            "GET", f"/process/{started['pid']}/output?follow=true"
        )
        events = yield reader.done
        self.assertEqual(events[0]["event"], "gap")
        self.assertEqual(events[0]["data"]["from"], 1)
        self.assertEqual(events[-1]["event"], "exit")
        reply = yield self.request("GET", f"/process/{started['pid']}/output")
        self.assertGreater(reply.json()["dropped_bytes"], 0)

    @inlineCallbacks
    def test_shutdown_ends_every_tree(self) -> Any:
        """Stopping the daemon ends background and streaming children's trees."""
        yield self.start_process(f"sleep {self.marker} & sleep {self.marker}")
        _, reader = yield self.stream(
            "POST",
            "/shell/stream",
            {"command": f"echo x; sleep {self.marker}", "shell": "sh"},
        )
        yield reader.wait_for(lambda r: r.events)
        yield self.daemon.stop()
        left = yield self.gone()
        self.assertEqual(left, [])


class SeedFormTests(ProcessCase):
    """
    The seed's forms of process_output and process_stdin, on the wire:
    ``since``/``wait``/``next``, ``data_base64``, ``written``/``closed``
    and the seed's 409s.
    """

    start_process = BackgroundTests.start_process
    _kill = BackgroundTests._kill
    wait_exited = BackgroundTests.wait_exited

    @inlineCallbacks
    def test_since_and_next(self) -> Any:
        """since is inclusive; next is the since of the next read; nothing new keeps it."""
        started = yield self.start_process(
            "echo one; echo two >&2", capture_output=True
        )
        pid = started["pid"]
        yield self.wait_exited(pid)
        reply = yield self.request("GET", f"/process/{pid}/output?since=0&wait=2")
        body = reply.json()
        seqs = [e["seq"] for e in body["events"]]
        self.assertEqual(sorted(e["data"] for e in body["events"]), ["one\n", "two\n"])
        self.assertGreater(body["next"], seqs[-1])
        self.assertIs(body["dropped"], False)
        reply = yield self.request(
            "GET", f"/process/{pid}/output?since={seqs[-1]}&wait=0"
        )
        self.assertEqual([e["seq"] for e in reply.json()["events"]], seqs[-1:])
        reply = yield self.request(
            "GET", f"/process/{pid}/output?since={body['next']}&wait=5"
        )
        self.assertEqual(
            (reply.json()["events"], reply.json()["next"]), ([], body["next"])
        )

    @inlineCallbacks
    def test_bare_read_is_the_seed_form(self) -> Any:
        """
        A read naming no cursor of a process started with capture_output:
        true is the seed's form: its next, passed as since, gives only
        what came after (no line twice).
        """
        started = yield self.start_process(
            "echo one; sleep 0.5; echo two", capture_output=True
        )
        pid = started["pid"]
        reply = yield self.request("GET", f"/process/{pid}/output?wait=5")
        first = reply.json()
        self.assertEqual([e["data"] for e in first["events"]], ["one\n"])
        reply = yield self.request(
            "GET", f"/process/{pid}/output?wait=5&since={first['next']}"
        )
        self.assertEqual([e["data"] for e in reply.json()["events"]], ["two\n"])
        reply = yield self.request("GET", f"/process/{pid}/output?after=0")
        after = reply.json()
        self.assertEqual(after["next"], after["events"][-1]["seq"])

    @inlineCallbacks
    def test_wait_answers_on_output(self) -> Any:
        """A long-poll answers as soon as output comes, not when wait runs out."""
        started = yield self.start_process("sleep 0.5; echo late", capture_output=True)
        before = time.monotonic()
        reply = yield self.request(
            "GET", f"/process/{started['pid']}/output?since=0&wait=20"
        )
        took = time.monotonic() - before
        self.assertEqual([e["data"] for e in reply.json()["events"]], ["late\n"])
        self.assertLess(took, 10)

    @inlineCallbacks
    def test_wait_is_bounded(self) -> Any:
        """A quiet process is answered, empty and running, once wait is over."""
        started = yield self.start_process(f"sleep {self.marker}", capture_output=True)
        before = time.monotonic()
        reply = yield self.request(
            "GET", f"/process/{started['pid']}/output?since=0&wait=0.5"
        )
        took = time.monotonic() - before
        body = reply.json()
        self.assertEqual((body["events"], body["state"]), ([], "running"))
        self.assertGreaterEqual(took, 0.4)

    @inlineCallbacks
    def test_bad_wait(self) -> Any:
        """A wait that is not a number is 400 invalid_param."""
        started = yield self.start_process("true", capture_output=True)
        reply = yield self.request(
            "GET", f"/process/{started['pid']}/output?since=0&wait=soon"
        )
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_param"))

    @inlineCallbacks
    def test_not_captured(self) -> Any:
        """The seed's form needs capture_output: true; capture_output: false refuses both forms."""
        plain = yield self.start_process("true")
        reply = yield self.request("GET", f"/process/{plain['pid']}/output?since=0")
        self.assertEqual(
            (reply.status, reply.json()["code"], reply.json()["type"]),
            (409, "output_not_captured", "ConflictError"),
        )
        reply = yield self.request("GET", f"/process/{plain['pid']}/output")
        self.assertEqual(reply.status, 200)
        off = yield self.start_process("true", capture_output=False)
        reply = yield self.request("GET", f"/process/{off['pid']}/output")
        self.assertEqual(reply.status, 409)

    @inlineCallbacks
    def test_stdin_base64(self) -> Any:
        """data_base64 writes bytes as given; written and closed say what happened."""
        started = yield self.start_process(
            "od -An -tx1", stdin=True, capture_output=True
        )
        pid = started["pid"]
        reply = yield self.request(
            "POST", f"/process/{pid}/stdin", {"data_base64": "AP8K", "eof": True}
        )
        self.assertEqual(
            reply.json(), {"pid": pid, "written": 3, "closed": True, "bytes": 3}
        )
        yield self.wait_exited(pid)
        reply = yield self.request("GET", f"/process/{pid}/output?since=0&wait=2")
        text = "".join(e["data"] for e in reply.json()["events"])
        self.assertEqual(text.split(), ["00", "ff", "0a"])

    @inlineCallbacks
    def test_output_as_bytes(self) -> Any:
        """
        output=bytes gives the exact bytes a process wrote, base64, in every
        form of the read (page, the seed's cursor, follow), a UTF-8
        character split across writes included; text keeps U+FFFD; any
        other value is a 400 with its code.
        """
        written = b"\xff\x00\x01A\xc3"
        started = yield self.start_process(
            "printf '\\377\\000\\001A\\303'; sleep 0.1; printf '\\251 ok'",
            capture_output=True,
        )
        pid = started["pid"]
        yield self.wait_exited(pid)
        whole = written + b"\xa9 ok"

        def joined(events: list[dict[str, Any]]) -> bytes:
            return b"".join(base64.b64decode(e["data_base64"]) for e in events)

        for query in ("since=0", "after=0"):
            reply = yield self.request(
                "GET", f"/process/{pid}/output?{query}&output=bytes"
            )
            self.assertEqual(reply.status, 200, reply.body)
            events = reply.json()["events"]
            self.assertEqual(joined(events), whole, query)
            self.assertNotIn("data", events[0])
        _, reader = yield self.stream(
            "GET", f"/process/{pid}/output?follow=true&after=0&output=bytes"
        )
        events = yield reader.done
        self.assertEqual(
            joined([e["data"] for e in events if e["event"] == "stdout"]), whole
        )
        reply = yield self.request("GET", f"/process/{pid}/output?since=0")
        text = "".join(e["data"] for e in reply.json()["events"])
        self.assertEqual(text, "\ufffd\x00\x01A\u00e9 ok")
        reply = yield self.request("GET", f"/process/{pid}/output?output=base64")
        self.assertEqual(
            (reply.status, reply.json()["code"]), (400, "invalid_param"), reply.body
        )
        self.assertIn("output", reply.json()["error"])

    @inlineCallbacks
    def test_stdin_refusals(self) -> Any:
        """
        Bad base64, both data forms and nothing to write without eof are
        400; a closed stdin is 409 stdin_closed.
        """
        started = yield self.start_process(f"cat; sleep {self.marker}", stdin=True)
        pid = started["pid"]
        for body in (
            {"data_base64": "not base64!"},
            {"data": "x", "data_base64": "eA=="},
            {},
            {"data": ""},
            {"data_base64": "", "eof": False},
        ):
            reply = yield self.request("POST", f"/process/{pid}/stdin", body)
            self.assertEqual(
                (reply.status, reply.json()["code"]), (400, "invalid_param"), body
            )
        reply = yield self.request("POST", f"/process/{pid}/stdin", {"eof": True})
        self.assertEqual(reply.status, 200)
        reply = yield self.request("POST", f"/process/{pid}/stdin", {"data": "x"})
        self.assertEqual((reply.status, reply.json()["code"]), (409, "stdin_closed"))


class ClientLeftTests(ProcessCase):
    """A request whose client closed before it ran is not carried out."""

    audit = True

    def send_and_close(self, path: str, body: dict[str, Any]) -> socket.socket:
        """
        Send a request and shut the socket's sending side, both before the
        daemon (which runs in this thread) reads any of it.
        """
        data = json.dumps(body).encode()
        sock = socket.create_connection(("127.0.0.1", self.daemon.port))
        sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data)
        )
        sock.shutdown(socket.SHUT_WR)
        self.addCleanup(sock.close)
        return sock

    @inlineCallbacks
    def test_command_not_run(self) -> Any:
        """/shell and /process/start read with their client's close start nothing; both are audited 499."""
        made = os.path.join(self.base_dir, "made")
        for path, command in (
            ("/shell", "touch made"),
            ("/process/start", f"sh -c 'touch made; sleep {self.marker}'"),
        ):
            sock = self.send_and_close(path, {"command": command})
            yield sleep_(0.3)
            sock.settimeout(2)
            self.assertEqual(sock.recv(1024), b"", path)
            self.assertFalse(os.path.exists(made), path)
            self.assertEqual(marked_pids(self.marker), [])
        closed = [r for r in self.audit_lines() if r["code"] == "client_closed"]
        self.assertEqual(
            [(r["path"], r["status"]) for r in closed],
            [("/shell", 499), ("/process/start", 499)],
        )

    @inlineCallbacks
    def test_upload_not_written(self) -> Any:
        """An upload read with its client's close leaves no file."""
        sock = self.send_and_close(
            "/upload", {"path": "up.txt", "content_base64": "aGk="}
        )
        yield sleep_(0.3)
        sock.settimeout(2)
        self.assertEqual(sock.recv(1024), b"")
        self.assertEqual(sorted(os.listdir(self.base_dir)), ["audit.log"])

    @inlineCallbacks
    def test_pipelined_requests_still_run(self) -> Any:
        """A second request waiting behind the first is not mistaken for a close."""
        data = json.dumps({"command": "echo hi"}).encode()
        one = (
            b"POST /shell HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )
        sock = socket.create_connection(("127.0.0.1", self.daemon.port))
        self.addCleanup(sock.close)
        sock.sendall(one + one)
        received = b""
        for _ in range(100):
            yield sleep_(0.02)
            sock.setblocking(False)
            try:
                received += sock.recv(65536)
            except BlockingIOError:
                pass
            if received.count(b'"exit_code":0') == 2:
                break
        self.assertEqual(received.count(b"HTTP/1.1 200 OK"), 2, received)


class StreamHeadersTests(ProcessCase):
    """A stream's status and headers do not wait for its first event."""

    @inlineCallbacks
    def test_silent_command_gets_headers_at_once(self) -> Any:
        """While a command prints nothing, the client already has 200 and the event-stream type."""
        data = json.dumps({"command": f"sleep {self.marker}"}).encode()
        sock = socket.create_connection(("127.0.0.1", self.daemon.port))
        self.addCleanup(sock.close)
        sock.sendall(
            b"POST /shell/stream HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )
        sock.setblocking(False)
        received = b""
        for _ in range(50):
            yield sleep_(0.02)
            try:
                received += sock.recv(65536)
            except BlockingIOError:
                pass
            if b"\r\n\r\n" in received:
                break
        head = received.split(b"\r\n\r\n")[0].lower()
        self.assertTrue(head.startswith(b"http/1.1 200 "), received)
        self.assertIn(b"content-type: text/event-stream", head)
        # The head leaves the moment the child is spawned, which may be while
        # its shell is still exec'ing sleep (an empty /proc/PID/cmdline).
        for _ in range(50):
            if marked_pids(self.marker):
                break
            yield sleep_(0.02)
        self.assertEqual(len(marked_pids(self.marker)), 1)


class _SlowSpawns:
    """Every spawn that may wait goes through a worker thread."""

    def setUp(self) -> Any:
        if not spawn_module.AVAILABLE:
            raise SkipTest("no posix_spawn through ctypes here")
        always = spawning.SpawnTimes(threshold=-1.0)
        always.slow = True
        self.patch(spawning, "SPAWN_TIMES", always)  # type: ignore[attr-defined]
        return super().setUp()  # type: ignore[misc]


class ThreadedShellTests(_SlowSpawns, ShellTests):
    """/shell, its spawn waited for on a worker thread (a saturated machine)."""


class ThreadedShellStreamTests(_SlowSpawns, ShellStreamTests):
    """/shell/stream, its spawn waited for on a worker thread."""


class ThreadedBackgroundTests(_SlowSpawns, BackgroundTests):
    """Background processes, their spawn waited for on a worker thread."""


class SlowSpawnTests(_SlowSpawns, ProcessCase):
    """While a spawn waits for its child's exec, the daemon goes on serving."""

    def delay_spawns(self, seconds: float) -> None:
        """Every spawn first waits ``seconds``, as one whose child is starved of CPU."""
        alone, direct = spawn_module.posix_spawn_alone, spawn_module.posix_spawn

        def slow_alone(plan: Any, attributes: Any) -> int:
            time.sleep(seconds)
            return alone(plan, attributes)

        def slow_direct(plan: Any) -> int:
            time.sleep(seconds)
            return direct(plan)

        self.patch(spawn_module, "posix_spawn_alone", slow_alone)
        self.patch(spawn_module, "posix_spawn", slow_direct)

    @inlineCallbacks
    def test_reactor_serves_while_a_spawn_waits(self) -> Any:
        """A /health asked while a stream's spawn waits is answered at once; the stream then runs."""
        self.delay_spawns(1.2)
        began = time.monotonic()
        streaming = self.stream("POST", "/shell/stream", {"command": "echo late"})
        yield sleep_(0.1)
        reply = yield self.request("GET", "/health")
        self.assertEqual(reply.status, 200)
        self.assertLess(time.monotonic() - began, 0.9)
        _, reader = yield streaming
        events = yield reader.done
        self.assertEqual(
            [(e["event"], e["data"]) for e in events],
            [("stdout", {"data": "late"}), ("exit", {"exit_code": 0})],
        )

    @inlineCallbacks
    def test_client_leaving_during_the_spawn_kills_the_child(self) -> Any:
        """A client gone while its command's spawn waits: the command is killed once it starts."""
        self.delay_spawns(0.4)
        data = json.dumps({"command": f"sleep {self.marker}"}).encode()
        sock = socket.create_connection(("127.0.0.1", self.daemon.port))
        sock.sendall(
            b"POST /shell/stream HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )
        yield sleep_(0.1)
        sock.close()
        yield sleep_(0.6)
        left = yield self.gone()
        self.assertEqual(left, [])
        self.assertEqual(self.daemon.context.children.pending, set())

    @inlineCallbacks
    def test_shell_waits_for_a_slow_spawn(self) -> Any:
        """/shell answers with the output of a command whose spawn waited."""
        self.delay_spawns(0.3)
        reply = yield self.request("POST", "/shell", {"command": "echo waited"})
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.json()["stdout"], "waited\n")

    @inlineCallbacks
    def test_cap_counts_processes_still_spawning(self) -> Any:
        """Starts whose spawns are still waiting count toward max_processes."""
        yield self.daemon.stop()
        yield self.start(
            policy={"endpoints": {"process_start": {"limits": {"max_processes": 2}}}}
        )
        self.delay_spawns(0.5)
        body = {"command": f"sleep {self.marker}"}
        replies = yield DeferredList(
            [self.request("POST", "/process/start", body) for _ in range(3)]
        )
        statuses = sorted(reply.status for _, reply in replies)
        self.assertEqual(statuses, [200, 200, 429])
        listed = yield self.request("GET", "/process/list")
        self.assertEqual(
            len([p for p in listed.json()["processes"] if p["state"] == "running"]), 2
        )


class FirstOutputTests(ProcessCase):
    """
    Streams started together: one whose first line is out waits at the
    lightest session group weight while another has printed nothing yet.
    """

    @inlineCallbacks
    def test_printed_stream_waits_for_a_starting_one(self) -> Any:
        """
        The child that printed has its session group at nice 19 while the
        other stream's child is silent, and at the children's 10 once that
        one no longer counts as starting (a second after it started).
        """
        need_autogroups()
        sleeper = {"command": f"sleep {self.marker}", "shell": "sh"}
        yield self.stream("POST", "/shell/stream", sleeper)
        started = time.monotonic()
        _, early = yield self.stream(
            "POST",
            "/shell/stream",
            {"command": f"echo $$; sleep {self.marker}", "shell": "sh"},
        )
        yield early.wait_for(lambda r: r.events)
        if time.monotonic() - started > 0.8:
            raise SkipTest("the daemon took too long to start the second stream")
        pid = int(early.events[0]["data"]["data"])
        # The daemon (in this process) lowered it before sending the line.
        self.assertEqual(group_nice(pid), 19)
        while group_nice(pid) == 19 and time.monotonic() - started < 5:
            yield sleep_(0.02)
        self.assertEqual(group_nice(pid), 10)
        self.assertGreater(time.monotonic() - started, 0.9)
