"""
SPEC §20: starts that cannot serve are refused with one clear line, local
mode stays local, and a start says what it is in one line.
"""

from __future__ import annotations

import errno
import gc
import os
import socket
import subprocess
import sys
import tempfile
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import formatEvent, globalLogPublisher
from twisted.python import usage
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd._version import __version__
from sandboxd.daemon.server import (
    Settings,
    build,
    login_environ_note,
    validate_settings,
)
from sandboxd.daemon.startup import StartRefused
from sandboxd.daemon.tap import Options
from sandboxd.libc import QuietTrim, free_heap_bytes, libc, trim_when_free
from sandboxd.policy import PolicyError
from sandboxd.policy.defaults import HEAP_KEPT_FREE_BYTES, HEAP_TRIM_QUIET_SECONDS
from tests.helpers import DaemonTestCase
from tests.test_cli import ROOT, on_ports, serve_argv, twistd_argv


def run(
    argv: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a daemon command to its end (it must end by itself)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ABX_")}
    full_env.update(env or {})
    return subprocess.run(
        argv,
        env=full_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


class Occupied:
    """A loopback port some other program already listens on."""

    def __init__(self, test: SynchronousTestCase) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        test.addCleanup(self.sock.close)


class ListenFailureTests(SynchronousTestCase):
    """A listener that cannot bind ends the process non-zero with one line."""

    def setUp(self) -> None:
        self.base = os.path.abspath(self.mktemp())
        os.makedirs(self.base)

    def assert_one_clear_line(
        self, result: subprocess.CompletedProcess[str], port: int, text: str
    ) -> None:
        output = result.stdout + result.stderr
        self.assertNotEqual(result.returncode, 0, output)
        self.assertNotIn("Traceback", output)
        self.assertNotIn("ReactorNotRunning", output)
        lines = [line for line in text.splitlines() if "cannot listen" in line]
        self.assertEqual(len(lines), 1, output)
        self.assertIn(f"cannot listen on 127.0.0.1:{port}: ", lines[0])
        self.assertIn("in use", lines[0])

    def test_http_port_in_use_twistd(self) -> None:
        """twistd sandboxd on a port already in use exits non-zero, one line, no traceback."""
        busy = Occupied(self)
        result = run(on_ports(twistd_argv(self.base), port=busy.port))
        # twistd's log holds stderr: the line is in the log, once.
        self.assert_one_clear_line(result, busy.port, result.stdout + result.stderr)

    def test_pty_port_in_use_serve(self) -> None:
        """sandboxd serve whose PTY port is in use exits 1 with one line."""
        busy = Occupied(self)
        result = run(on_ports(serve_argv(self.base), pty=busy.port))
        self.assertEqual(result.returncode, 1)
        self.assert_one_clear_line(result, busy.port, result.stderr)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1)

    def test_embedded_start_raises(self) -> None:
        """An embedded daemon whose port is taken raises StartRefused from startService."""
        busy = Occupied(self)
        from twisted.internet import reactor

        daemon = build(
            Settings(
                port=f"tcp:{busy.port}:interface=127.0.0.1",
                pty_port="tcp:0:interface=127.0.0.1",
                policy={"endpoints": {"pty_connect": {"enabled": False}}},
                base_dir=self.base,
                environ={},
            ),
            reactor,
        )
        with self.assertRaises(StartRefused) as cm:
            daemon.startService()
        self.assertIn(f"127.0.0.1:{busy.port}", cm.exception.message)


class BadSettingTests(SynchronousTestCase):
    """An audit file or a listener that cannot be: one line, no traceback."""

    def setUp(self) -> None:
        self.base = os.path.abspath(self.mktemp())
        os.makedirs(self.base)

    def refused(self, *extra: str) -> str:
        result = run([*on_ports(serve_argv(self.base)), *extra])
        output = result.stdout + result.stderr
        self.assertNotEqual(result.returncode, 0, output)
        self.assertNotIn("Traceback", output)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, output)
        return lines[0]

    def test_audit_log_cannot_be_opened(self) -> None:
        """An audit file in a missing directory, or a directory: named, why."""
        missing = os.path.join(self.base, "nodir", "audit.log")
        line = self.refused("--audit-log", missing)
        self.assertIn(f"--audit-log: cannot open {missing!r}", line)
        self.assertIn("No such file or directory", line)
        self.assertIn("Is a directory", self.refused("--audit-log", self.base))

    def test_listener_strings(self) -> None:
        """An unknown endpoint type and a port out of range are named."""
        line = self.refused("--port", "tcpp:21300")
        self.assertIn("cannot listen on 'tcpp:21300'", line)
        self.assertIn("tcpp", line)
        line = self.refused("--pty-port", "tcp:99999:interface=127.0.0.1")
        self.assertIn("cannot listen on 'tcp:99999:interface=127.0.0.1'", line)
        self.assertIn("0 to 65535", line)


class LoginEnvironNoteTests(SynchronousTestCase):
    """The start's line about the login variables it fills in says who gets them."""

    def test_default_user_gets_its_own(self) -> None:
        """
        A root daemon whose children run as ``params.default_user`` does
        not say that its children get ``USER=root``: only those run as the
        daemon's user do, the others get their user's.
        """
        added = {"LOGNAME": "root", "USER": "root"}
        line = login_environ_note(added, ["cloudsdk"])
        self.assertIn("children run as the daemon's user get LOGNAME=root", line)
        self.assertIn("params.default_user 'cloudsdk'", line)
        self.assertNotIn("children get", line)
        self.assertEqual(
            login_environ_note(added, []),
            "sandboxd: LOGNAME, USER not set in the daemon's environment;"
            " children get LOGNAME=root, USER=root",
        )


class BaseDirTests(SynchronousTestCase):
    """A base dir that is not there is refused at start, named."""

    def test_missing_base_dir(self) -> None:
        """validate_settings and twistd refuse a missing base dir, naming it."""
        missing = os.path.abspath(self.mktemp())
        with self.assertRaises(PolicyError) as cm:
            validate_settings(Settings(base_dir=missing, policy={}, environ={}))
        self.assertIn(missing, str(cm.exception))
        result = run(on_ports(twistd_argv(missing)))
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(missing, result.stdout + result.stderr)
        self.assertIn("does not exist", result.stdout + result.stderr)

    def test_file_as_base_dir(self) -> None:
        """A file is not a base dir."""
        path = os.path.abspath(self.mktemp())
        open(path, "w").close()
        with self.assertRaises(PolicyError) as cm:
            validate_settings(Settings(base_dir=path, policy={}, environ={}))
        self.assertIn("is not a directory", str(cm.exception))


class StateDirTests(SynchronousTestCase):
    """
    A ``--state-dir`` the daemon cannot write is warned about at start,
    naming it and why, rather than found out by the first link mint.
    """

    def setUp(self) -> None:
        self.base = os.path.abspath(self.mktemp())
        os.makedirs(self.base)
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def start(self, state_dir: str) -> list[str]:
        options = Options()
        options.parseOptions(["--base-dir", self.base, "--state-dir", state_dir])
        settings = options.settings()
        settings.environ, settings.policy, settings.chdir = {}, {}, False
        daemon = build(settings, MemoryReactorClock())
        self.addCleanup(daemon.stopService)
        return [formatEvent(e) for e in self.events]

    def test_state_dir_under_a_file(self) -> None:
        """A state dir that cannot be made (a file where a folder must be) is warned about."""
        blocker = os.path.join(self.base, "file")
        open(blocker, "w").close()
        state = os.path.join(blocker, "state")
        warned = [line for line in self.start(state) if "state dir" in line]
        self.assertEqual(len(warned), 1, warned)
        self.assertIn(state, warned[0])
        self.assertIn("not a directory", warned[0])

    def test_read_only_state_dir(self) -> None:
        """A state dir on a read-only file system is warned about, with the system's reason."""

        def read_only(*_: Any, **__: Any) -> Any:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

        self.patch(tempfile, "mkstemp", read_only)
        state = os.path.join(self.base, "state")
        warned = [line for line in self.start(state) if "state dir" in line]
        self.assertEqual(len(warned), 1, warned)
        self.assertIn(state, warned[0])
        self.assertIn("not writable (Read-only file system)", warned[0])

    def test_writable_state_dir(self) -> None:
        """A state dir that can be written (made later) gives no warning."""
        state = os.path.join(self.base, "later", "state")
        self.assertEqual(
            [line for line in self.start(state) if "state dir" in line], []
        )


class LocalModeTests(SynchronousTestCase):
    """Without a token the daemon listens on loopback unless told otherwise."""

    def setUp(self) -> None:
        self.base = os.path.abspath(self.mktemp())
        os.makedirs(self.base)
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def settings(self, *argv: str, environ: dict[str, str] | None = None) -> Settings:
        options = Options()
        options.parseOptions(["--base-dir", self.base, *argv])
        s = options.settings()
        s.environ = environ if environ is not None else {}
        s.policy = {}
        s.chdir = False
        return s

    def start(self, settings: Settings) -> tuple[MemoryReactorClock, list[str]]:
        reactor = MemoryReactorClock()
        daemon = build(settings, reactor)
        daemon.startService()
        self.addCleanup(daemon.stopService)
        return reactor, [formatEvent(e) for e in self.events]

    def test_default_is_loopback(self) -> None:
        """No --host and no token: both ports bind 127.0.0.1."""
        reactor, _ = self.start(self.settings())
        self.assertEqual(
            sorted((port, iface) for port, _, _, iface in reactor.tcpServers),
            [(9000, "127.0.0.1"), (9001, "127.0.0.1")],
        )

    def test_pty_port_follows_port(self) -> None:
        """--port 9100 alone puts the PTY port on 9101, so two daemons can run."""
        reactor, _ = self.start(self.settings("--port", "9100"))
        self.assertEqual(
            sorted(port for port, _, _, _ in reactor.tcpServers), [9100, 9101]
        )
        reactor, _ = self.start(self.settings("--port", "9200", "--pty-port", "9300"))
        self.assertEqual(
            sorted(port for port, _, _, _ in reactor.tcpServers), [9200, 9300]
        )

    def test_default_with_token_is_every_interface(self) -> None:
        """No --host with a token: every interface (the container's default)."""
        reactor, _ = self.start(self.settings(environ={"ABX_SERVER_TOKEN": "t"}))
        self.assertEqual({iface for _, _, _, iface in reactor.tcpServers}, {"0.0.0.0"})

    def test_non_loopback_refused(self) -> None:
        """--host 0.0.0.0 (or an endpoint string on it) without a token is refused."""
        self.patch(os, "environ", {})
        for argv in (
            ["--host", "0.0.0.0"],
            ["--port", "tcp:9000"],
            ["--pty-port", "tcp:9001:interface=0.0.0.0"],
        ):
            with self.assertRaises(usage.UsageError) as cm:
                Options().parseOptions(["--base-dir", self.base, *argv])
            self.assertIn("--allow-unauthenticated", str(cm.exception))
        with self.assertRaises(PolicyError):
            validate_settings(
                Settings(host="::", base_dir=self.base, policy={}, environ={})
            )
        # A token, or the PTY port switched off, makes the same start valid.
        validate_settings(
            Settings(
                host="0.0.0.0",
                base_dir=self.base,
                policy={"defaults": {"params": {"default_user": "root"}}},
                environ={"ABX_SERVER_TOKEN": "t"},
            )
        )
        validate_settings(
            Settings(
                port="tcp:9000:interface=127.0.0.1",
                pty_port="tcp:9001:interface=0.0.0.0",
                base_dir=self.base,
                policy={"endpoints": {"pty_connect": {"enabled": False}}},
                environ={},
            )
        )

    def test_allow_unauthenticated_warns(self) -> None:
        """--allow-unauthenticated serves and warns at start, naming each open listener."""
        reactor, lines = self.start(
            self.settings("--host", "0.0.0.0", "--allow-unauthenticated")
        )
        self.assertEqual(len(reactor.tcpServers), 2)
        warnings = [line for line in lines if "NO TOKEN" in line]
        self.assertEqual(len(warnings), 2)
        self.assertIn("--allow-unauthenticated", warnings[0])

    def test_startup_line(self) -> None:
        """One line names the version, listeners, base dir, auth, policy and groups."""
        s = self.settings("--port", "9000", "--pty-port", "9001")
        s.policy = {"revision": "r-7", "groups": {"dev_tools": True}}
        s.environ = {"ABX_SERVER_TOKEN": "t"}
        _, lines = self.start(s)
        [line] = [line for line in lines if line.startswith("sandboxd " + __version__)]
        for part in (
            "http on 0.0.0.0:9000",
            "pty on 0.0.0.0:9001",
            f"base dir {self.base}",
            "auth tokens legacy",
            "policy argument (revision r-7)",
            "dev_tools",
            "groups on: core",
        ):
            self.assertIn(part, line)
        self.assertNotIn("browser", line)
        self.assertNotIn("traces", line)

    def test_startup_line_names_the_collector(self) -> None:
        """With a collector named, the line says where spans go; a problem is warned."""
        s = self.settings("--port", "9000", "--pty-port", "9001")
        s.environ = {
            "ABX_SERVER_TOKEN": "t",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
            "OTEL_TRACES_SAMPLER": "sometimes",
        }
        _, lines = self.start(s)
        [line] = [line for line in lines if line.startswith("sandboxd " + __version__)]
        self.assertIn("traces to http://collector:4318/v1/traces (http/protobuf)", line)
        [warning] = [line for line in lines if "OTEL_TRACES_SAMPLER" in line]
        self.assertIn("'sometimes'", warning)
        s = self.settings()
        _, lines = self.start(s)
        self.assertTrue(any("auth local (no token)" in line for line in lines))

    def test_policy_warning_logged(self) -> None:
        """
        A policy warning is logged at start, and a legacy (twistd) observer
        formats it: its key is not the one Twisted keeps for Python warnings.
        """
        from twisted.python.log import textFromEventDict

        s = self.settings()
        s.policy = {"endpoints": {"pty_get": {"enabled": False}}}
        _, _ = self.start(s)
        [event] = [
            e for e in self.events if "policy warning" in e.get("log_format", "")
        ]
        legacy = dict(event, message=(), isError=0)
        text = textFromEventDict(legacy)
        assert text is not None
        self.assertIn("'pty_get' is an old endpoint id", text)
        self.assertIn("'pty_detail'", text)


class CollectorTests(DaemonTestCase):
    """The cyclic collector the console script turns off for the start-up is back on after it."""

    autostart = False

    @inlineCallbacks
    def test_collector_back_on_once_listening(self) -> Any:
        """
        ``sandboxd serve`` and the twistd plugin start with ``gc`` off; a
        daemon that never turned it back on would keep every reference
        cycle it makes for as long as it runs.  Shortly after it listens,
        it is on.
        """
        gc.disable()
        self.addCleanup(gc.enable)
        yield self.start()
        yield deferLater(reactor, 0.5, lambda: None)
        self.assertTrue(gc.isenabled())


class RootChildrenTests(SynchronousTestCase):
    """
    A root daemon with a token does not run commands as root unless the
    policy says so: the start is refused, naming params.default_user.
    """

    def setUp(self) -> None:
        self.base = os.path.abspath(self.mktemp())
        os.makedirs(self.base)

    def policy(self, doc: dict[str, Any], token: bool = True) -> Any:
        from sandboxd.policy import load_policy
        from sandboxd.routes import default_table

        env = {"ABX_SERVER_TOKEN": "t"} if token else {}
        return load_policy(
            default_table(), explicit=doc, base_dir=self.base, environ=env
        )

    def test_refused_without_default_user(self) -> None:
        """Root, a token, no params.default_user: refused with the setting named."""
        from sandboxd.daemon.startup import check_children_user
        from sandboxd.routes import default_table

        with self.assertRaises(PolicyError) as cm:
            check_children_user(self.policy({}), default_table(), 0)
        self.assertIn("params.default_user", str(cm.exception))
        self.assertIn("shell", str(cm.exception))

    def test_allowed_when_named_or_not_root(self) -> None:
        """A user (root written out included), local mode or a non-root daemon start."""
        from sandboxd.daemon.startup import check_children_user
        from sandboxd.routes import default_table

        table = default_table()
        for user in ("root", "user"):
            doc = {"defaults": {"params": {"default_user": user}}}
            check_children_user(self.policy(doc), table, 0)
        check_children_user(self.policy({}, token=False), table, 0)
        check_children_user(self.policy({}), table, 1000)

    def test_one_endpoint_left_unset(self) -> None:
        """A user set for ``shell`` alone leaves ``process_start`` named."""
        from sandboxd.daemon.startup import check_children_user
        from sandboxd.routes import default_table

        doc = {"endpoints": {"shell": {"params": {"default_user": "root"}}}}
        with self.assertRaises(PolicyError) as cm:
            check_children_user(self.policy(doc), default_table(), 0)
        self.assertIn("process_start", str(cm.exception))
        self.assertNotIn("shell,", str(cm.exception))

    def test_refusal_names_key_source_and_callers(self) -> None:
        """
        The one line names the key to add as JSON, where the policy came
        from (or that there is none), and the identities that could start
        a child as root.
        """
        from sandboxd.daemon.startup import check_children_user
        from sandboxd.routes import default_table

        with self.assertRaises(PolicyError) as cm:
            check_children_user(self.policy({}), default_table(), 0)
        message = str(cm.exception)
        self.assertIn("'legacy' may call shell, shell_stream, process_start", message)
        self.assertIn(
            "Set defaults.params.default_user in the policy (argument) to the "
            'user commands run as, e.g. {"defaults": {"params": '
            '{"default_user": "user"}}}, or to "root"',
            message,
        )
        self.assertNotIn("process_list", message)

    def test_no_caller_can_start_a_child(self) -> None:
        """
        Tokens that hold no scope of an endpoint that starts a child (file
        transfer, reading process output, the template's commands) start
        as root as they are: no request can make a root child.
        """
        from sandboxd.daemon.startup import check_children_user
        from sandboxd.routes import default_table

        for scopes in (
            ["files:read", "files:write"],
            ["process:read", "system:read", "files:*"],
            ["commands:list", "commands:run"],
        ):
            doc = {
                "auth": {
                    "tokens": [{"id": "t", "token_sha256": "0" * 64, "scopes": scopes}]
                }
            }
            check_children_user(self.policy(doc, token=False), default_table(), 0)

    def test_anonymous_and_code_count(self) -> None:
        """
        anonymous (let in beside tokens) counts as a caller, and code
        contexts and git start children like shells do.
        """
        from sandboxd.daemon.startup import check_children_user
        from sandboxd.routes import default_table

        table = default_table()
        reader = {"id": "r", "token_sha256": "0" * 64, "scopes": ["files:read"]}
        cases = (
            (
                {
                    "auth": {
                        "tokens": [reader],
                        "allow_anonymous": True,
                        "anonymous_scopes": ["terminal:use"],
                    }
                },
                "'anonymous' may call pty_create_session",
            ),
            (
                {
                    "groups": {"code": True, "process": False},
                    "auth": {
                        "tokens": [
                            reader,
                            {"id": "c", "token_sha256": "1" * 64, "scopes": ["code:*"]},
                        ]
                    },
                },
                "'c' may call code_",
            ),
            (
                {
                    "groups": {"git": True, "process": False},
                    "auth": {
                        "tokens": [
                            {"id": "g", "token_sha256": "1" * 64, "scopes": ["git:*"]}
                        ]
                    },
                },
                "'g' may call git_",
            ),
        )
        for doc, fragment in cases:
            with self.assertRaises(PolicyError) as cm:
                check_children_user(self.policy(doc, token=False), table, 0)
            self.assertIn(fragment, str(cm.exception))

    def test_documented_start_refused_as_root(self) -> None:
        """
        The README's start as root, with the shipped generic policy and a
        token file, exits 1 with one line naming params.default_user.
        """
        if os.geteuid() != 0:
            raise self.skipTest("needs root: the refusal is for root daemons")
        token = os.path.join(self.base, "token")
        with open(token, "w") as f:
            f.write("t" * 32)
        policy = os.path.join(ROOT, "etc", "policy.json")
        result = run(
            on_ports(twistd_argv(self.base, "--policy", policy)),
            env={"ABX_SERVER_TOKEN_FILE": token},
        )
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("params.default_user", result.stdout + result.stderr)
        served = run(
            on_ports(serve_argv(self.base)), env={"ABX_SERVER_TOKEN_FILE": token}
        )
        self.assertNotEqual(served.returncode, 0)
        self.assertIn("params.default_user", served.stderr)


class RootChildrenReloadTests(DaemonTestCase):
    """A reload may not take the children's user away, as a start may not."""

    autostart = False
    token = "reload-root-token"

    @inlineCallbacks
    def test_reload_without_default_user_refused(self) -> Any:
        """
        The command line's daemon (root, a token) keeps its old policy when
        the new one names no params.default_user.
        """
        if os.geteuid() != 0:
            raise self.skipTest("needs root: the refusal is for root daemons")
        import json

        path = os.path.join(self.base_dir, "policy.json")
        with open(path, "w") as f:
            json.dump(
                {"revision": "r1", "defaults": {"params": {"default_user": "root"}}}, f
            )
        yield self.start(policy=None, policy_file=path, root_children_check=True)
        with open(path, "w") as f:
            json.dump({"revision": "r2"}, f)
        self.assertFalse(self.daemon.daemon.reload())
        self.assertEqual(self.daemon.context.policy.revision, "r1")


#: Allocates 40 MiB in 256 KiB blocks twice, freeing it between, and
#: prints the page faults of the second time (``steady`` first if asked).
HEAP_SCRIPT = """
import resource, sys
if sys.argv[1] == "steady":
    from sandboxd.daemon.server import steady_heap
    steady_heap()
def fill():
    return [b"x" * (256 * 1024) for _ in range(160)]
blocks = fill()
del blocks
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
blocks = fill()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


class HeapTests(SynchronousTestCase):
    """Memory a big output freed is there for the next one."""

    def faults(self, mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", HEAP_SCRIPT, mode],
            capture_output=True,
            check=True,
            cwd=ROOT,
        )
        return int(out.stdout)

    def test_freed_blocks_reused(self) -> None:
        """
        40 MiB allocated again after it was freed costs next to no page
        faults (glibc left alone maps each block afresh, or gives the heap
        back, and faults all of it in again: about 10,000).
        """
        if not hasattr(libc(), "mallopt"):
            raise SkipTest("no mallopt in this C library")
        self.assertLess(self.faults("steady"), 1000)


class QuietTrimTests(SynchronousTestCase):
    """Freed memory goes back once big outputs stop coming."""

    def test_trims_once_quiet(self) -> None:
        """One trim, ``delay`` after the last of several calls, not before."""
        clock = Clock()
        trims: list[int] = []
        quiet = QuietTrim(clock, 10.0, trims.append)
        quiet.soon()
        clock.advance(6)
        quiet.soon()
        clock.advance(6)
        self.assertEqual(trims, [])
        clock.advance(4)
        self.assertEqual(trims, [0])
        clock.advance(60)
        self.assertEqual(trims, [0])

    def test_cancel(self) -> None:
        """A stopping daemon leaves no trim behind."""
        clock = Clock()
        trims: list[int] = []
        quiet = QuietTrim(clock, 10.0, trims.append)
        quiet.soon()
        quiet.cancel()
        clock.advance(20)
        self.assertEqual(trims, [])
        self.assertEqual(clock.getDelayedCalls(), [])


#: Allocates 40 MiB in 256 KiB blocks with the daemon's heap thresholds,
#: frees it, and prints the resident set (KiB) before and after
#: ``trim_when_free`` with an 8 MiB bound, then whether it trimmed.
SWEEP_SCRIPT = """
from sandboxd.daemon.server import steady_heap
from sandboxd.libc import trim_when_free
steady_heap()
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4
blocks = [b"x" * (256 * 1024) for _ in range(160)]
del blocks
before = rss()
trimmed = trim_when_free(8 * 1024 * 1024)
print(before, rss(), int(trimmed))
"""


class HeapSweepTests(SynchronousTestCase):
    """Whatever freed it, the heap kept free goes back within a period."""

    def setUp(self) -> None:
        self.base = os.path.abspath(self.mktemp())
        os.makedirs(self.base)

    settings = LocalModeTests.settings

    def test_trim_when_free(self) -> None:
        """A trim only when more than the bound lies free, and only if it can tell."""
        trims: list[int] = []
        for free, expected in ((9 << 20, True), (8 << 20, False), (None, False)):
            self.assertEqual(
                trim_when_free(8 << 20, lambda free=free: free, trims.append),
                expected,
            )
        self.assertEqual(trims, [0])

    def test_free_heap_returned(self) -> None:
        """40 MiB freed inside the kept heap leaves the resident set when swept."""
        if free_heap_bytes() is None:
            raise SkipTest("no mallinfo2 in this C library (glibc 2.33 or later)")
        out = subprocess.run(
            [sys.executable, "-c", SWEEP_SCRIPT],
            capture_output=True,
            check=True,
            cwd=ROOT,
        )
        before, after, trimmed = (int(v) for v in out.stdout.split())
        self.assertEqual(trimmed, 1)
        self.assertGreater(before - after, 20 * 1024)

    def test_daemon_sweeps_every_period(self) -> None:
        """The running daemon sweeps each period with the bound, and stops with it."""
        from sandboxd.daemon import server

        calls: list[int] = []
        self.patch(server, "trim_when_free", calls.append)
        self.patch(server, "release_memory", lambda: None)
        reactor = MemoryReactorClock()
        daemon = build(self.settings(), reactor)
        daemon.startService()
        reactor.advance(HEAP_TRIM_QUIET_SECONDS - 1)
        self.assertEqual(calls, [])
        reactor.advance(1)
        self.assertEqual(calls, [HEAP_KEPT_FREE_BYTES])
        reactor.advance(HEAP_TRIM_QUIET_SECONDS)
        self.assertEqual(len(calls), 2)
        daemon.stopService()
        reactor.advance(10 * HEAP_TRIM_QUIET_SECONDS)
        self.assertEqual(len(calls), 2)


class PolicyStartTests(SynchronousTestCase):
    """A policy that does not validate stops the start with one located line."""

    def test_non_finite_limit(self) -> None:
        """
        ``sandboxd serve`` with NaN as a limit exits non-zero with one line
        naming the policy file and the key, before anything is served.
        """
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        policy = os.path.join(base, "policy.json")
        with open(policy, "w") as f:
            f.write('{"endpoints": {"shell": {"limits": {"timeout_seconds": NaN}}}}')
        result = run(on_ports(serve_argv(base, "--policy", policy)))
        self.assertNotEqual(result.returncode, 0, result.stderr)
        self.assertEqual(
            result.stderr.strip(),
            f"sandboxd: {policy}: endpoints.shell.limits.timeout_seconds: "
            "expected a finite number, got nan",
        )
