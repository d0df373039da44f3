"""
Children confined with Landlock (``params.confine``) against a real
daemon: what a command may write, whom it may signal and which TCP ports
it may use, through every endpoint that starts one.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import tempfile
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd import landlock
from sandboxd.access.auth import ANONYMOUS
from sandboxd.routes.process import launch
from sandboxd.testing import memory_context
from sandboxd.web.messages import ServerRequest
from tests.helpers import DaemonTestCase
from tests.kernels.test_contexts import CodeTestCase, code_policy
from tests.routes.test_process import sleep_, wait_exited
from tests.routes.test_terminal import TerminalCase, is_exited


def need_landlock(abi: int = landlock.SIGNALS_ABI) -> None:
    """Skip, saying why, on a kernel without the Landlock these tests use."""
    have = landlock.abi_version()
    if have < abi:
        raise DaemonTestCase.skipException(
            f"needs Landlock ABI {abi} (this kernel has {have or 'none'})"
        )


def confined_policy(**params: Any) -> dict[str, Any]:
    """Every endpoint that starts a child, confined as ``params`` adds."""
    rule = {"params": {"confine": True, "confine_write": ["."], **params}}
    return {
        "groups": {"dev_tools": True},
        "endpoints": {"group:process": rule, "group:terminal": rule, "code_run": rule},
    }


def sh(script: str, **body: Any) -> dict[str, Any]:
    return {"command": f"sh -c {json.dumps(script)}", **body}


class ConfinedCase(DaemonTestCase):
    """A daemon whose children may write only below its base dir."""

    params: dict[str, Any] = {}
    #: Top-level policy keys beside the confined rules.
    more_policy: dict[str, Any] = {}

    def setUp(self) -> Any:
        need_landlock()
        self.policy = {**confined_policy(**self.params), **self.more_policy}
        self.outside = os.path.realpath(self.mktemp())
        os.makedirs(self.outside)
        return super().setUp()

    def wait_exited(self, pid: int) -> Any:
        return wait_exited(self, pid)

    @inlineCallbacks
    def shell(self, script: str, **body: Any) -> Any:
        reply = yield self.request("POST", "/shell", sh(script, **body))
        self.assertEqual(reply.status, 200, reply.body)
        return reply.json()


class FileTests(ConfinedCase):
    """Writes land below ``confine_write`` and nowhere else."""

    @inlineCallbacks
    def test_shell_writes_inside_not_outside(self) -> Any:
        """
        Inside the base dir a write lands; outside it the command gets
        EACCES and nothing is written, while reading outside still works.
        """
        readable = os.path.join(self.outside, "readable")
        with open(readable, "w") as f:
            f.write("seen")
        out = yield self.shell(
            f"echo in > inside.txt; echo out > {self.outside}/outside.txt;"
            f" cat {readable}"
        )
        self.assertIn("Permission denied", out["stderr"])
        self.assertEqual(out["stdout"], "seen")
        with open(os.path.join(self.base_dir, "inside.txt")) as f:
            self.assertEqual(f.read(), "in\n")
        self.assertEqual(os.listdir(self.outside), ["readable"])

    @inlineCallbacks
    def test_no_remove_rename_or_mkdir_outside(self) -> Any:
        """Removing, renaming and creating directories outside are refused too."""
        victim = os.path.join(self.outside, "victim")
        with open(victim, "w") as f:
            f.write("keep")
        out = yield self.shell(
            f"rm -f {victim}; mv {victim} {victim}.2; mkdir {self.outside}/d;"
            f" ln -s /etc {self.outside}/l; mv {victim} ./stolen"
        )
        self.assertNotEqual(out["exit_code"], 0)
        self.assertEqual(os.listdir(self.outside), ["victim"])
        with open(victim) as f:
            self.assertEqual(f.read(), "keep")

    @inlineCallbacks
    def test_descendants_stay_confined(self) -> Any:
        """A grandchild started in the background is as confined as its parent."""
        out = yield self.shell(
            f"(sh -c 'echo x > {self.outside}/late' 2>late.err &); sleep 0.3;"
            " cat late.err"
        )
        self.assertIn("Permission denied", out["stdout"])
        self.assertEqual(os.listdir(self.outside), [])

    @inlineCallbacks
    def test_stream_and_background(self) -> Any:
        """``/shell/stream`` and ``/process/start`` children are confined alike."""
        reply = yield self.request(
            "POST", "/shell/stream", sh(f"echo s > {self.outside}/stream")
        )
        self.assertEqual(reply.status, 200)
        self.assertIn(b"Permission denied", reply.body)
        reply = yield self.request(
            "POST",
            "/process/start",
            sh(f"echo b > {self.outside}/background; echo done > bg.txt"),
        )
        self.assertEqual(reply.status, 200, reply.body)
        yield self.wait_exited(reply.json()["pid"])
        self.assertEqual(os.listdir(self.outside), [])
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "bg.txt")))

    @inlineCallbacks
    def test_code_run(self) -> Any:
        """Code run through ``/code/run`` cannot write outside either."""
        reply = yield self.request(
            "POST",
            "/code/run",
            {
                "language": "python",
                "code": f"open({self.outside + '/code'!r}, 'w').write('x')",
            },
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertIn("PermissionError", reply.json()["stderr"])
        self.assertEqual(os.listdir(self.outside), [])

    @inlineCallbacks
    def test_exit_codes_and_pid_are_the_commands(self) -> Any:
        """The wrapper execs: the pid and the exit code are the command's own."""
        out = yield self.shell("echo $$ > pid.txt; exit 7")
        self.assertEqual(out["exit_code"], 7)
        reply = yield self.request("POST", "/process/start", sh("sleep 5"))
        pid = reply.json()["pid"]
        self.addCleanup(self.request, "POST", f"/process/{pid}/signal", {"signal": 9})
        with open(os.path.join(self.base_dir, "pid.txt")) as f:
            self.assertNotEqual(f.read(), "")
        for _ in range(100):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if argv[0].endswith(b"/sh"):
                break
            yield sleep_(0.02)
        self.assertEqual(
            (os.path.basename(argv[0]), argv[1:3]), (b"sh", [b"-c", b"sleep 5"])
        )


class AuditTests(ConfinedCase):
    """The audit line of a confined call says so."""

    audit = True
    params = {"confine_signals": "any"}
    more_policy = {"defaults": {"audit": "all"}}

    @inlineCallbacks
    def test_confined_in_the_audit_line(self) -> Any:
        """``confined: true`` beside the argv; an unconfined endpoint's line has none."""
        yield self.shell("true")
        yield self.request("GET", "/files/list?path=.")
        lines = {line["endpoint"]: line for line in self.audit_lines()}
        self.assertIs(lines["shell"]["confined"], True, lines["shell"])
        self.assertNotIn("confined", lines["files_list"])


class LoaderTests(ConfinedCase):
    """The dynamic loader's variables reach the command, not the confining step."""

    params = {"env_deny": ["LD_SANDBOXD_DAEMONS"]}

    @inlineCallbacks
    def test_loader_variables(self) -> Any:
        """
        ``LD_DEBUG`` (as ``LD_PRELOAD`` would) acts on the command alone:
        the interpreter that confines it starts before any of the caller's
        libraries could load unconfined. The command's loader variables
        are its own: set as asked, and one the daemon has but the rule
        keeps from children stays unset.
        """
        self.patch(os, "environ", {**os.environ, "LD_SANDBOXD_DAEMONS": "daemon's"})
        reply = yield self.request(
            "POST",
            "/shell",
            {"command": "/bin/true", "env": {"LD_DEBUG": "libs"}},
        )
        stderr = reply.json()["stderr"]
        self.assertIn("initialize program: /bin/true", stderr)
        self.assertNotIn("python", stderr)
        out = yield self.shell(
            'echo "$LD_SANDBOXD_ASKED/${LD_SANDBOXD_DAEMONS-unset}"',
            env={"LD_SANDBOXD_ASKED": "asked"},
        )
        self.assertEqual(out["stdout"], "asked/unset\n", out)


class SignalTests(ConfinedCase):
    """``confine_signals: own`` keeps a command's signals to its own tree."""

    @inlineCallbacks
    def test_cannot_signal_the_daemon(self) -> Any:
        """The daemon (this test's own process) cannot be signalled; a job of its own can."""
        out = yield self.shell(
            f"kill -0 {os.getpid()} 2>&1; echo daemon=$?;"
            " sleep 5 & kill $!; echo own=$?"
        )
        self.assertIn("daemon=1", out["stdout"])
        self.assertIn("Operation not permitted", out["stdout"])
        self.assertIn("own=0", out["stdout"])

    @inlineCallbacks
    def test_the_daemon_still_ends_it(self) -> Any:
        """The daemon's kill endpoint still ends a confined background process."""
        reply = yield self.request("POST", "/process/start", sh("sleep 30"))
        pid = reply.json()["pid"]
        reply = yield self.request("POST", f"/process/{pid}/signal", {"signal": 15})
        self.assertEqual(reply.status, 200, reply.body)
        info = yield self.wait_exited(pid)
        self.assertEqual(info["exit_code"], -15)


class AnySignalTests(ConfinedCase):
    """``confine_signals: any`` leaves signals alone."""

    params = {"confine_signals": "any"}

    @inlineCallbacks
    def test_may_signal_outside(self) -> Any:
        """``kill -0`` of the daemon succeeds (and sends nothing)."""
        out = yield self.shell(f"kill -0 {os.getpid()}; echo daemon=$?")
        self.assertEqual(out["stdout"], "daemon=0\n")


class PortTests(ConfinedCase):
    """TCP ports: none may be bound, only the daemon's own connected to."""

    def setUp(self) -> Any:
        need_landlock(landlock.NETWORK_ABI)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.allowed_port = probe.getsockname()[1]
        probe.close()
        self.params = {
            "confine_tcp_bind": [],
            "confine_tcp_connect": [self.allowed_port],
        }
        return super().setUp()

    @inlineCallbacks
    def test_bind_and_connect(self) -> Any:
        """
        Binding any port fails; connecting to the listed port is allowed
        (refused only because nothing listens) and to another is denied.
        """
        other = self.daemon.port
        script = (
            "import socket\n"
            "def attempt(f):\n"
            "    try:\n"
            "        f(); return 'ok'\n"
            "    except OSError as e:\n"
            "        return e.strerror\n"
            "print(attempt(lambda: socket.socket().bind(('127.0.0.1', 0))))\n"
            f"print(attempt(lambda: socket.create_connection(('127.0.0.1', {other}))))\n"
            "print(attempt(lambda: socket.create_connection("
            f"('127.0.0.1', {self.allowed_port}))))\n"
        )
        reply = yield self.request(
            "POST", "/code/run", {"language": "python", "code": script}
        )
        self.assertEqual(
            reply.json()["stdout"].splitlines(),
            ["Permission denied", "Permission denied", "Connection refused"],
            reply.body,
        )


class UserTests(ConfinedCase):
    """Confinement and another user together (a root daemon only)."""

    def setUp(self) -> Any:
        if os.geteuid() != 0:
            raise self.skipException("switching users needs a root daemon")
        return super().setUp()

    @inlineCallbacks
    def test_runs_as_the_user_still_confined(self) -> Any:
        """
        The command runs as ``nobody`` and is confined all the same: a
        directory ``nobody`` may write to stays untouched.
        """
        open_to_all = tempfile.mkdtemp(prefix="sandboxd-confine-")
        self.addCleanup(shutil.rmtree, open_to_all)
        os.chmod(open_to_all, 0o777)
        out = yield self.shell(f"id -un; echo x > {open_to_all}/f", user="nobody")
        self.assertEqual(out["stdout"], "nobody\n", out)
        self.assertIn("Permission denied", out["stderr"])
        self.assertEqual(os.listdir(open_to_all), [])


class UnconfinedTests(DaemonTestCase):
    """Without ``confine`` nothing changes: the same write lands."""

    @inlineCallbacks
    def test_write_outside_lands(self) -> Any:
        """The control case: an unconfined command writes where its user may."""
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        reply = yield self.request("POST", "/shell", sh(f"echo x > {outside}/f"))
        self.assertEqual(reply.json()["exit_code"], 0, reply.body)
        self.assertEqual(os.listdir(outside), ["f"])


class TerminalTests(TerminalCase):
    """A terminal's shell is confined like a command."""

    def setUp(self) -> Any:
        need_landlock()
        self.policy = confined_policy()
        self.outside = os.path.realpath(self.mktemp())
        os.makedirs(self.outside)
        return super().setUp()

    @inlineCallbacks
    def test_terminal_shell(self) -> Any:
        """What a user types in the terminal cannot write outside."""
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        client.type(f"echo x > {self.outside}/tty; echo t > tty.txt; exit\n")
        yield client.wait_for(is_exited)
        self.assertEqual(os.listdir(self.outside), [])
        with open(os.path.join(self.base_dir, "tty.txt")) as f:
            self.assertEqual(f.read(), "t\n")


class KernelTests(CodeTestCase):
    """A code context's kernel under ``confine``."""

    policy = code_policy(params={"confine": True, "confine_write": ["."]})

    def setUp(self) -> Any:
        need_landlock()
        return super().setUp()

    @inlineCallbacks
    def test_home_it_may_not_write(self) -> Any:
        """
        With a home the kernel may not write (and no ``~/.ipython`` yet),
        IPython still starts, in a directory of the context's own, and
        the kernel's code cannot write outside.
        """
        home = os.path.realpath(self.mktemp())
        os.makedirs(home)
        ctx = yield self.context(kernel="python3", env={"HOME": home})
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {
                "code": "import IPython.paths\n"
                "print(IPython.paths.get_ipython_dir())\n"
                f"open({home + '/x'!r}, 'w')"
            },
        )
        body = reply.json()
        self.assertIn("PermissionError", json.dumps(body["error"]), body)
        self.assertIn("/sandboxd-code-", body["stdout"])
        self.assertEqual(os.listdir(home), [])


class HomeTests(SynchronousTestCase):
    """``~`` in a confinement is the home of the user the command runs as."""

    def test_home_of_the_user(self) -> None:
        """As ``nobody``, ``~/w`` is below nobody's home, not the daemon's."""
        if os.geteuid() != 0:
            raise SkipTest("switching users needs a root daemon")
        context = memory_context(
            {
                "endpoints": {
                    "shell": {"params": {"confine": True, "confine_write": ["~/w"]}}
                }
            },
            environ={},
        )
        self.patch(landlock, "abi_version", lambda: 7)

        def confined_as(user: str | None) -> Any:
            body: dict[str, Any] = {"command": "true"}
            if user is not None:
                body["user"] = user
            request = ServerRequest(
                method="POST",
                path="/shell",
                query={},
                headers={},
                body=body,
                path_params={},
                identity=ANONYMOUS,
                endpoint=context.table.get("shell"),
                rule=context.policy.rule("shell"),
                context=context,
            )
            confine = launch(request).confine
            assert confine is not None
            return confine.write

        nobody = pwd.getpwnam("nobody").pw_dir
        self.assertEqual(confined_as("nobody"), (os.path.join(nobody, "w"),))
        self.assertNotEqual(confined_as(None), confined_as("nobody"))
