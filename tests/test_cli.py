"""
Starting and stopping the real daemon: twistd plugin, console script,
healthcheck exit codes, SIGTERM shutdown, SIGHUP reload, check-config.

These run the daemon as a separate process, as an operator would, so they
use the standard library to wait on it from a synchronous test.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from twisted.plugin import IPlugin, getPlugins
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from sandboxd import cli
from sandboxd._version import __version__
from sandboxd.daemon.tap import Options
from tests.helpers import (
    free_port,
    group_listens,
    group_nice,
    need_autogroups,
    port_was_taken,
    refusing_port,
)

BIN = os.path.dirname(sys.executable)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def daemon_options(base: str) -> list[str]:
    """The options both commands take: loopback ports ``{port}``, ``{pty}``, ``base``."""
    return [
        "--port",
        "tcp:{port}:interface=127.0.0.1",
        "--pty-port",
        "tcp:{pty}:interface=127.0.0.1",
        "--base-dir",
        base,
    ]


def serve_argv(base: str, *extra: str) -> list[str]:
    """``sandboxd serve`` serving ``base`` (see :func:`daemon_options`)."""
    return [os.path.join(BIN, "sandboxd"), "serve", *daemon_options(base), *extra]


def twistd_argv(base: str, *extra: str) -> list[str]:
    """``twistd -n sandboxd`` serving ``base`` (see :func:`daemon_options`)."""
    return [
        os.path.join(BIN, "twistd"),
        "-n",
        "--pidfile=",
        "sandboxd",
        *daemon_options(base),
        *extra,
    ]


def on_ports(
    argv: list[str], port: int | None = None, pty: int | None = None
) -> list[str]:
    """
    ``argv`` (:func:`serve_argv`, :func:`twistd_argv`) with its ``{port}``
    and ``{pty}`` filled in: the ports given, else free ones.
    """
    http = str(port if port is not None else free_port())
    terminal = str(pty if pty is not None else free_port())
    return [a.replace("{port}", http).replace("{pty}", terminal) for a in argv]


def policy_has_tokens(argv: list[str]) -> bool:
    """Whether the ``--policy`` file of ``argv`` (JSON) configures tokens."""
    if "--policy" not in argv:
        return False
    with open(argv[argv.index("--policy") + 1]) as f:
        doc = json.load(f)
    return bool(doc.get("auth", {}).get("tokens"))


def children_as_root(test: SynchronousTestCase, argv: list[str]) -> list[str]:
    """
    ``argv`` with a policy that names root as the children's user: a root
    daemon with a token refuses to start without one (the tests run as
    root, and have no other user to run commands as).
    """
    doc: dict[str, Any] = {}
    argv = list(argv)
    if "--policy" in argv:
        at = argv.index("--policy") + 1
        with open(argv[at]) as f:
            doc = json.load(f)
    else:
        argv += ["--policy", ""]
        at = len(argv) - 1
    params = doc.setdefault("defaults", {}).setdefault("params", {})
    if "default_user" in params:
        return argv
    params["default_user"] = "root"
    argv[at] = os.path.abspath(test.mktemp()) + ".json"
    with open(argv[at], "w") as f:
        json.dump(doc, f)
    return argv


class DaemonProcess:
    """
    A daemon started as its own process group.

    Its ``{port}`` and ``{pty}`` ports are picked here (:func:`on_ports`);
    one may be taken by another test's server before the daemon binds it,
    so the daemon counts as up only once it holds its own listening
    socket, and one that could not bind a port picked here is started
    again on fresh ones.
    """

    #: How many times a start that lost its picked ports is tried.
    TRIES = 3

    def __init__(
        self,
        test: SynchronousTestCase,
        argv: list[str],
        env: dict[str, str] | None = None,
        own_session: bool = True,
    ) -> None:
        self.test = test
        self.template = argv
        self.own_session = own_session
        self.full_env = {
            k: v for k, v in os.environ.items() if not k.startswith("ABX_")
        }
        self.full_env.update(env or {})
        self.log: Any = None
        self.tries = 0
        test.addCleanup(self.kill)
        self.spawn()

    def spawn(self) -> None:
        """Start the daemon on fresh ``{port}``/``{pty}`` ports."""
        self.tries += 1
        self.port = free_port()
        argv = on_ports(self.template, self.port)
        if self.log is not None:
            self.log.close()
        self.log = open(self.test.mktemp(), "w+")
        # A token in the environment or in a policy: a root daemon needs
        # to be told its children run as root.
        tokens = "ABX_SERVER_TOKEN" in self.full_env or policy_has_tokens(argv)
        if tokens and os.geteuid() == 0:
            argv = children_as_root(self.test, argv)
        self.proc = subprocess.Popen(
            argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.full_env,
            cwd=ROOT,
            # Its own session, or at least its own process group (for the kill).
            start_new_session=self.own_session,
            process_group=None if self.own_session else 0,
            stdin=subprocess.DEVNULL,
        )

    def listens(self) -> bool:
        """Whether the daemon (its process group) holds the socket listening on its port."""
        return group_listens(self.proc.pid, self.port)

    def start_again(self) -> bool:
        """
        When it ended because a port picked here was taken, start it again
        on fresh ones (a few times at most); whether it was.
        """
        picked = "{port}" in " ".join(self.template)
        lost = self.proc.poll() is not None and port_was_taken(self.output())
        if not (picked and lost and self.tries < self.TRIES):
            return False
        self.kill_tree()
        self.spawn()
        return True

    def wait_healthy(self, timeout: float = 20) -> None:
        """Until its own /health answers (else fail with its output)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Another test's server on the port would answer too.
            if cli.healthcheck("127.0.0.1", self.port, 0.5) == 0 and self.listens():
                # The port opens before the reactor has installed its
                # signal handlers; give it a moment before signalling.
                time.sleep(0.3)
                return
            if self.proc.poll() is not None and not self.start_again():
                break
            time.sleep(0.1)
        raise AssertionError(f"daemon not healthy; output:\n{self.output()}")

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", headers=headers or {}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def kill_tree(self) -> None:
        """SIGKILL its process group, if it still runs, and reap it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def kill(self) -> None:
        self.kill_tree()
        self.log.close()


class SessionGroupTests(SynchronousTestCase):
    """
    A root daemon raises its session group only when the session is its
    own: started from a shell, the group is the shell's.
    """

    def start(self, own_session: bool) -> DaemonProcess:
        need_autogroups()
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        policy = os.path.join(ROOT, "etc", "policy.json")
        d = DaemonProcess(
            self, serve_argv(base, "--policy", policy), own_session=own_session
        )
        d.wait_healthy()
        return d

    def test_raises_its_own_session(self) -> None:
        """A daemon leading its session (a service, a container) raises its group."""
        d = self.start(own_session=True)
        self.assertEqual(group_nice(d.proc.pid), -5)

    def test_leaves_the_shell_session_alone(self) -> None:
        """
        A daemon started in its caller's session leaves that session's group
        (the caller's, and everything else it runs) at its nice value, while
        it runs and after it stops.
        """
        before = group_nice(os.getpid())
        d = self.start(own_session=False)
        self.assertEqual(os.getsid(d.proc.pid), os.getsid(0))
        self.assertEqual(group_nice(os.getpid()), before)
        d.proc.send_signal(signal.SIGTERM)
        self.assertEqual(d.proc.wait(timeout=15), 0)
        self.assertEqual(group_nice(os.getpid()), before)


class Impostor(http.server.BaseHTTPRequestHandler):
    """Another test's daemon, as its ``/health`` looks: 200 ``{"status": "ok"}`` to every GET."""

    def do_GET(self) -> None:
        body = json.dumps({"status": "ok"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class TakenPortTests(SynchronousTestCase):
    """A daemon whose picked port another server took first."""

    def test_started_again_not_mistaken(self) -> None:
        """
        Another server that answers ``/health`` 200 holds the port picked
        for the daemon: the daemon, unable to bind, is started again on a
        fresh port, and the case reads the daemon's answers, not the
        other server's.
        """
        impostor = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Impostor)
        self.addCleanup(impostor.server_close)
        threading.Thread(target=impostor.serve_forever, daemon=True).start()
        self.addCleanup(impostor.shutdown)
        taken = impostor.server_address[1]
        picks, fresh = iter([taken]), free_port
        self.patch(
            sys.modules[__name__], "free_port", lambda: next(picks, None) or fresh()
        )
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        d = DaemonProcess(self, serve_argv(base))
        d.wait_healthy()
        self.assertNotEqual(d.port, taken)
        status, body = d.get("/capabilities", {"Host": "localhost"})
        self.assertEqual(status, 200)
        self.assertIn("policy", body)


class JsonLogTests(SynchronousTestCase):
    """
    ``--log-format json``: every line the daemon writes is one JSON object,
    the start's line and, with no audit file, each audit record as an object.
    """

    def run_daemon(self, command: Callable[..., list[str]]) -> list[dict[str, Any]]:
        """The records the daemon ``command`` builds (:func:`serve_argv`, :func:`twistd_argv`) writes."""
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        policy = os.path.abspath(self.mktemp()) + ".json"
        with open(policy, "w") as f:
            json.dump({"defaults": {"audit": "all"}}, f)
        argv = command(base, "--policy", policy, "--log-format", "json")
        d = DaemonProcess(self, argv)
        d.wait_healthy()
        d.get("/capabilities", {"Host": "localhost"})
        deadline = time.monotonic() + 10
        while True:
            # The lines written whole (the last may be on its way).
            lines = [line for line in d.output().split("\n")[:-1] if line.strip()]
            records = [json.loads(line) for line in lines]
            audited = [r["audit"].get("endpoint") for r in records if "audit" in r]
            if "capabilities" in audited or time.monotonic() > deadline:
                return records
            time.sleep(0.05)

    def check(self, records: list[dict[str, Any]]) -> None:
        self.assertTrue(records)
        for record in records:
            self.assertEqual(
                set(record) - {"audit", "error"}, {"time", "level", "logger", "message"}
            )
        [start] = [r for r in records if r["message"].startswith("sandboxd ")]
        self.assertIn("groups on:", start["message"])
        audits = [r["audit"] for r in records if "audit" in r]
        self.assertIn("capabilities", [a["endpoint"] for a in audits])

    def test_serve(self) -> None:
        """``sandboxd serve --log-format json`` logs JSON lines."""
        self.check(self.run_daemon(serve_argv))

    def test_twistd(self) -> None:
        """``twistd sandboxd --log-format json`` logs JSON lines."""
        self.check(self.run_daemon(twistd_argv))


class PluginTests(SynchronousTestCase):
    """The twistd plugin is discoverable and validates its options."""

    def test_discovered(self) -> None:
        """twistd lists sandboxd among its plugins."""
        from twisted.application.service import IServiceMaker

        names = [p.tapname for p in getPlugins(IServiceMaker)]
        self.assertIn("sandboxd", names)
        self.assertTrue(list(getPlugins(IPlugin)))

    def test_bad_policy_is_usage_error(self) -> None:
        """An invalid policy stops option parsing with the validator's message."""
        path = self.mktemp()
        with open(path, "w") as f:
            json.dump({"endpoints": {"shel": {}}}, f)
        options = Options()
        with self.assertRaises(usage.UsageError) as cm:
            options.parseOptions(["--policy", path, "--base-dir", "/tmp"])
        self.assertIn("did you mean 'shell'", str(cm.exception))

    def test_kep_grpc_port_without_h2(self) -> None:
        """
        The KEP door's gRPC port without the h2 library is refused at once,
        saying which extra installs it (not a traceback once it listens).
        """
        from sandboxd.daemon import tap

        self.patch(tap.importlib.util, "find_spec", lambda name: None)
        options = Options()
        argv = ["--base-dir", "/tmp", "--kep-rest-port", "0", "--kep-grpc-port", "0"]
        with self.assertRaises(usage.UsageError) as cm:
            options.parseOptions(argv)
        self.assertIn("sandboxd[kep]", str(cm.exception))

    def test_policy_compiled_once(self) -> None:
        """
        The policy the options validated is the one the daemon serves with:
        a start compiles it once, not once to check and again to build.
        """
        from twisted.internet.testing import MemoryReactor

        from sandboxd.daemon.tap import makeService

        base = self.mktemp()
        os.makedirs(base)
        options = Options()
        options.parseOptions(
            ["--port", "tcp:0:interface=127.0.0.1", "--base-dir", base]
        )
        self.assertIsNotNone(options.policy)
        daemon = makeService(options, MemoryReactor())
        self.assertIs(daemon.context.policy, options.policy)

    def test_state_dir(self) -> None:
        """
        ``--state-dir`` (else ``$ABX_SERVER_STATE_DIR``) reaches the daemon
        absolute, and is one of the daemon's files no path operation reaches.
        """
        from twisted.internet.testing import MemoryReactor

        from sandboxd.daemon.tap import makeService

        base = os.path.realpath(self.mktemp())
        os.makedirs(base)
        options = Options()
        options.parseOptions(
            [
                "--port",
                "tcp:0:interface=127.0.0.1",
                "--base-dir",
                base,
                "--state-dir",
                os.path.relpath(os.path.join(base, "state")),
            ]
        )
        daemon = makeService(options, MemoryReactor())
        state = os.path.join(base, "state")
        self.assertEqual(daemon.context.state_dir, state)
        self.assertIn(state, daemon.context.policy.rule("download").daemon_files)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (and is not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_quietly(pid: int) -> None:
    """SIGKILL ``pid`` if it still runs (a test that failed left it)."""
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


class TwistdTests(SynchronousTestCase):
    """twistd -n sandboxd, as an operator starts it."""

    def serves_then_stops(self, d: DaemonProcess) -> None:
        """The daemon serves with etc/policy.json in force; SIGTERM ends it with 0."""
        d.wait_healthy()
        status, body = d.get("/capabilities", {"Host": "localhost"})
        self.assertEqual(status, 200)
        self.assertEqual(body["policy"]["revision"], "default-1")
        d.proc.send_signal(signal.SIGTERM)
        self.assertEqual(d.proc.wait(timeout=15), 0)

    def test_start_health_sigterm(self) -> None:
        """The daemon answers /health, and SIGTERM ends it with status 0."""
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        d = DaemonProcess(
            self,
            twistd_argv(base, "--policy", os.path.join(ROOT, "etc", "policy.json")),
        )
        self.serves_then_stops(d)

    def test_serve_health_sigterm(self) -> None:
        """
        ``sandboxd serve`` (the image's command) answers /health with the
        policy in force, and SIGTERM (what tini forwards) ends it with 0.
        Its log names each port by its door, not by a class, and has no
        object reprs.
        """
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        d = DaemonProcess(
            self, serve_argv(base, "--policy", os.path.join(ROOT, "etc", "policy.json"))
        )
        self.serves_then_stops(d)
        log = d.output()
        self.assertIn(f"http starting on {d.port}", log)
        self.assertIn("pty starting on ", log)
        self.assertNotIn(" object at 0x", log)

    def test_healthcheck_exit_codes(self) -> None:
        """sandboxd healthcheck exits 0 when /health answers and 1 when nothing listens."""
        port = refusing_port(self)
        result = subprocess.run(
            [
                os.path.join(BIN, "sandboxd"),
                "healthcheck",
                "--port",
                str(port),
                "--timeout",
                "1",
            ],
            stdin=subprocess.DEVNULL,
        )
        self.assertEqual(result.returncode, 1)

    def test_reload_on_hup(self) -> None:
        """SIGHUP re-reads the policy file; an invalid new policy leaves the old one in force."""
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        policy = os.path.join(base, "policy.json")
        with open(policy, "w") as f:
            json.dump({"revision": "one"}, f)
        d = DaemonProcess(self, serve_argv(base, "--policy", policy))
        d.wait_healthy()
        self.assertEqual(
            subprocess.run(
                [os.path.join(BIN, "sandboxd"), "healthcheck", "--port", str(d.port)],
                stdin=subprocess.DEVNULL,
            ).returncode,
            0,
        )
        with open(policy, "w") as f:
            json.dump({"revision": "two"}, f)
        d.proc.send_signal(signal.SIGHUP)
        self.assertTrue(self._wait_revision(d, "two"))
        with open(policy, "w") as f:
            json.dump({"revision": "three", "endpoints": {"shel": {}}}, f)
        d.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        self.assertEqual(
            d.get("/capabilities", {"Host": "localhost"})[1]["policy"]["revision"],
            "two",
        )
        self.assertIn("reload refused", d.output())
        d.proc.send_signal(signal.SIGTERM)
        self.assertEqual(d.proc.wait(timeout=15), 0)

    def test_reload_reads_the_starting_environment(self) -> None:
        """
        A SIGHUP reload reads the environment the daemon started with: a
        variable put in the daemon's environment since (by a template's
        command here; ``POST /env`` refuses these names) changes nothing.
        """
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        commands = os.path.join(base, "commands.py")
        with open(commands, "w") as f:
            f.write(
                "import os\n"
                "from agent_sandbox.server import command\n"
                "@command()\n"
                "def setenv(name: str, value: str) -> str:\n"
                "    os.environ[name] = value\n"
                "    return name\n"
            )
        d = DaemonProcess(self, serve_argv(base, "--commands", commands))
        d.wait_healthy()
        groups = d.get("/capabilities", {"Host": "localhost"})[1]["groups"]
        self.assertFalse(groups["dev_tools"])
        request = urllib.request.Request(
            f"http://127.0.0.1:{d.port}/commands/setenv",
            data=json.dumps(
                {"name": "ABX_SERVER_ENABLED_GROUPS", "value": "dev_tools"}
            ).encode(),
            headers={"Content-Type": "application/json", "Host": "localhost"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            self.assertEqual(response.status, 200)
        d.proc.send_signal(signal.SIGHUP)
        for _ in range(100):
            if "policy reloaded" in d.output():
                break
            time.sleep(0.1)
        self.assertIn("policy reloaded", d.output())
        groups = d.get("/capabilities", {"Host": "localhost"})[1]["groups"]
        self.assertFalse(groups["dev_tools"])
        d.proc.send_signal(signal.SIGTERM)
        self.assertEqual(d.proc.wait(timeout=15), 0)

    def stubborn_child(self, d: DaemonProcess) -> int:
        """A background process of ``d`` that ignores SIGTERM (the stop takes 5 s); its pid."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{d.port}/process/start",
            data=json.dumps(
                {"shell": "bash", "command": "trap '' TERM; exec sleep 101"}
            ).encode(),
            headers={"Content-Type": "application/json", "Host": "localhost"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            pid: int = json.loads(response.read())["pid"]
        self.addCleanup(_kill_quietly, pid)
        time.sleep(0.3)  # until bash has set its trap
        return pid

    def signal_during_stop(self, second: signal.Signals) -> tuple[DaemonProcess, int]:
        """
        A ``sandboxd serve`` with a stubborn child, sent SIGTERM and, a
        second into its stop, ``second``; the daemon and the child's pid.
        """
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        d = DaemonProcess(self, serve_argv(base))
        d.wait_healthy()
        child = self.stubborn_child(d)
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(1)
        d.proc.send_signal(second)
        d.proc.wait(timeout=20)
        return d, child

    def test_hup_during_stop(self) -> None:
        """
        A SIGHUP (a reload) that lands while the daemon stops is ignored:
        the stop goes on, the stubborn child is killed, and the daemon
        exits 0.
        """
        d, child = self.signal_during_stop(signal.SIGHUP)
        self.assertEqual(d.proc.returncode, 0, d.output())
        self.assertFalse(_alive(child))
        self.assertIn("SIGHUP while stopping: ignored", d.output())

    def test_second_sigterm_during_stop(self) -> None:
        """
        A second SIGTERM (a supervisor that sends it again, Ctrl-C twice)
        is logged at info and changes nothing: no critical traceback, exit 0.
        """
        d, child = self.signal_during_stop(signal.SIGTERM)
        self.assertEqual(d.proc.returncode, 0, d.output())
        self.assertFalse(_alive(child))
        log = d.output()
        self.assertIn("SIGTERM while stopping: ignored", log)
        self.assertNotIn("ReactorNotRunning", log)
        self.assertNotIn("critical", log)

    def test_usr1_to_serve(self) -> None:
        """
        ``sandboxd serve`` logs to stdout, so SIGUSR1 has no log file to
        rotate: it is logged and ignored, and the daemon goes on serving.
        """
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        d = DaemonProcess(self, serve_argv(base))
        d.wait_healthy()
        d.proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        self.assertIsNone(d.proc.poll(), d.output())
        self.assertEqual(d.get("/health"), (200, {"status": "ok"}))
        self.assertIn("SIGUSR1 ignored: there is no log file to rotate", d.output())
        d.proc.send_signal(signal.SIGTERM)
        self.assertEqual(d.proc.wait(timeout=15), 0)

    def test_quit_stops_in_order(self) -> None:
        """
        SIGQUIT (some images' ``STOPSIGNAL``) stops the daemon as SIGTERM
        does: the stubborn child is ended, the daemon exits 0.
        """
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        d = DaemonProcess(self, serve_argv(base))
        d.wait_healthy()
        child = self.stubborn_child(d)
        d.proc.send_signal(signal.SIGQUIT)
        self.assertEqual(d.proc.wait(timeout=20), 0, d.output())
        self.assertFalse(_alive(child))
        self.assertIn("SIGQUIT: stopping", d.output())

    def test_usr2_ignored(self) -> None:
        """SIGUSR2 is logged and ignored: the daemon goes on serving."""
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        d = DaemonProcess(self, serve_argv(base))
        d.wait_healthy()
        d.proc.send_signal(signal.SIGUSR2)
        time.sleep(0.5)
        self.assertIsNone(d.proc.poll(), d.output())
        self.assertEqual(d.get("/health"), (200, {"status": "ok"}))
        self.assertIn("SIGUSR2 ignored", d.output())
        d.proc.send_signal(signal.SIGTERM)
        self.assertEqual(d.proc.wait(timeout=15), 0)

    def test_usr1_reopens_the_audit_file(self) -> None:
        """
        With ``--audit-log``, SIGUSR1 reopens the audit file at its path
        after an outside rotation (renamed away): the next records go to a
        new file there, none to the renamed one.
        """
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        audit = os.path.join(os.path.dirname(base), "audit.log")
        d = DaemonProcess(
            self,
            serve_argv(base, "--audit-log", audit),
            env={"ABX_SERVER_POLICY": '{"defaults": {"audit": "all"}}'},
        )
        d.wait_healthy()
        d.get("/capabilities", {"Host": "localhost"})
        os.rename(audit, audit + ".1")
        d.proc.send_signal(signal.SIGUSR1)
        for _ in range(50):
            if "reopened (SIGUSR1)" in d.output():
                break
            time.sleep(0.1)
        d.get("/capabilities", {"Host": "localhost"})
        d.proc.send_signal(signal.SIGTERM)
        self.assertEqual(d.proc.wait(timeout=15), 0)
        with open(audit + ".1") as f:
            before = f.read().count('"capabilities"')
        with open(audit) as f:
            after = f.read().count('"capabilities"')
        self.assertEqual((before, after), (1, 1), d.output())

    def _wait_revision(self, d: DaemonProcess, revision: str) -> bool:
        for _ in range(50):
            if (
                d.get("/capabilities", {"Host": "localhost"})[1]["policy"]["revision"]
                == revision
            ):
                return True
            time.sleep(0.1)
        return False


class HelpTests(SynchronousTestCase):
    """``sandboxd --help`` tells every command, the daemon's and the client's."""

    def test_help_lists_every_command(self) -> None:
        """
        The console script's help names the commands that run a daemon and
        those that drive one (SPEC §19), each with its line, and exits 0;
        without a command it names them all and exits 2.
        """
        script = os.path.join(BIN, "sandboxd")
        shown = subprocess.run(
            [script, "--help"], capture_output=True, text=True, timeout=30
        )
        self.assertEqual(shown.returncode, 0, shown.stderr)
        lines = shown.stdout.splitlines()
        for name in ("serve", "healthcheck", "check-config", "reload", "version"):
            self.assertTrue(any(line.split()[:1] == [name] for line in lines), name)
        for name in ("exec", "cp", "ls", "ps", "logs", "kill", "term", "caps"):
            (line,) = [line for line in lines if line.split()[:1] == [name]]
            self.assertGreater(len(line.split()), 2, line)
        bare = subprocess.run([script], capture_output=True, text=True, timeout=30)
        self.assertEqual(bare.returncode, 2)
        self.assertIn(
            "exec, cp, ls, grep, diagnostics, definition, ps, logs, kill, term, caps",
            bare.stderr,
        )


class CheckConfigTests(SynchronousTestCase):
    """sandboxd check-config."""

    def run_check(self, policy: Any, *args: str) -> tuple[int, str]:
        path = self.mktemp() + ".json"
        with open(path, "w") as f:
            json.dump(policy, f)
        options = cli.CheckConfigOptions()
        options.parseOptions(["--policy", path, "--base-dir", "/tmp", *args])
        out = io.StringIO()
        return cli.check_config(options, out), out.getvalue()

    def test_valid_table(self) -> None:
        """A valid policy prints the per-endpoint table and exits 0."""
        code, out = self.run_check({"groups": {"dev_tools": True}})
        self.assertEqual(code, 0)
        self.assertIn("decided by", out)
        self.assertIn("valid:", out)

    def test_invalid(self) -> None:
        """An invalid policy exits 1 with the suggestion."""
        code, out = self.run_check({"endpoints": {"shel": {}}})
        self.assertEqual(code, 1)
        self.assertIn("did you mean 'shell'", out)

    def test_strict(self) -> None:
        """--strict turns warnings (a glob matching nothing) into errors."""
        policy = {"endpoints": {"zzz_*": {"enabled": False}}}
        self.assertEqual(self.run_check(policy)[0], 0)
        self.assertEqual(self.run_check(policy, "--strict")[0], 1)

    def test_non_finite_number(self) -> None:
        """NaN as a limit is invalid, named by file and key; --strict too."""
        policy = {"endpoints": {"shell": {"limits": {"timeout_seconds": float("nan")}}}}
        for args in ((), ("--strict",)):
            code, out = self.run_check(policy, *args)
            self.assertEqual(code, 1)
            self.assertRegex(
                out,
                r"invalid: \S+\.json: endpoints\.shell\.limits\.timeout_seconds: "
                "expected a finite number, got nan",
            )

    def test_strict_near_misses(self) -> None:
        """A near-miss scope and a repeated selector are warnings, errors with --strict."""
        path = self.mktemp() + ".json"
        with open(path, "w") as f:
            f.write(
                '{"endpoints": {"files_list": {"scopes": ["file:read"]},'
                ' "shell": {"enabled": false}, "shell": {"enabled": true}}}'
            )
        for args, code in (((), 0), (("--strict",), 1)):
            options = cli.CheckConfigOptions()
            options.parseOptions(["--policy", path, "--base-dir", "/tmp", *args])
            out = io.StringIO()
            self.assertEqual(cli.check_config(options, out), code)
            self.assertIn("did you mean 'files:read'?", out.getvalue())
            self.assertIn("the key 'shell' is written more than once", out.getvalue())

    def test_template_scopes_and_names(self) -> None:
        """
        check-config warns about a template command no caller can run as
        meant (was: ``valid``, even with ``--strict``): a scope in a
        built-in namespace that is no built-in scope, a scope of its own no
        token holds, a name holding '/'; ``--strict`` refuses them.  A
        scope a token holds, or holds by its namespace's ``*``, is fine.
        """
        from sandboxd import commands

        registry = commands.CommandRegistry()
        registry.register(lambda: None, name="wipe", scopes=["files:delte"])
        registry.register(lambda: None, name="ship", scopes=["myap:deploy"])
        registry.register(lambda: None, name="deploy", scopes=["myapp:deploy"])
        registry.register(lambda: None, name="tidy", scopes=["ops:tidy"])
        registry.register(lambda: None, name="ci/run")
        self.patch(commands, "default_registry", registry)
        policy = {
            "auth": {
                "tokens": [
                    {
                        "id": "deployer",
                        "token_sha256": "0" * 64,
                        "scopes": ["commands:run", "myapp:deploy", "ops:*"],
                    }
                ]
            }
        }
        code, out = self.run_check(policy)
        self.assertEqual(code, 0, out)
        self.assertIn(
            "command 'wipe': the scope 'files:delte' is no built-in scope; did "
            "you mean 'files:delete'?",
            out,
        )
        self.assertIn(
            "command 'ship': no token of the policy holds the scope 'myap:deploy'",
            out,
        )
        self.assertIn("command 'ci/run' cannot be called: its name holds '/'", out)
        self.assertNotIn("'deploy'", out)
        self.assertNotIn("'tidy'", out)
        code, out = self.run_check(policy, "--strict")
        self.assertEqual(code, 1, out)
        self.assertIn("error (--strict): command 'ship'", out)

    def test_explain_allowed_exits_0(self) -> None:
        """--explain exits 0 for an allowed call, 1 for a refused one."""
        code, out = self.run_check({}, "--explain", "files_stat", "--path", "/tmp/x")
        self.assertEqual(code, 0, out)
        self.assertIn("ALLOWED", out)

    def test_strict_unknown_user(self) -> None:
        """A default_user that does not exist passes plain check-config (warned), not --strict."""
        policy = {"defaults": {"params": {"default_user": "no-such-user-zz"}}}
        code, out = self.run_check(policy)
        self.assertEqual(code, 0)
        self.assertIn("no-such-user-zz", out)
        code, out = self.run_check(policy, "--strict")
        self.assertEqual(code, 1)
        self.assertIn("does not exist", out)

    def test_unknown_user_names_endpoints_once(self) -> None:
        """
        A user that does not exist is named with the endpoints that would
        act as it, each once (it is both ``default_user`` and in ``users``),
        and not ``health`` or ``capabilities``, which run nothing.
        """
        policy = {
            "defaults": {
                "params": {
                    "default_user": "no-such-user-zz",
                    "users": ["no-such-user-zz"],
                }
            }
        }
        code, out = self.run_check(policy)
        self.assertEqual(code, 0)
        [line] = [x for x in out.splitlines() if "no-such-user-zz" in x]
        named = line.split(" of ", 1)[1].split(")", 1)[0]
        ids = named.replace(" and more", "").split(", ")
        self.assertEqual(len(ids), len(set(ids)), line)
        self.assertNotIn("health", ids)
        self.assertNotIn("capabilities", ids)

    def test_trace_variables(self) -> None:
        """
        What the OpenTelemetry variables ask for that cannot be done is a
        warning, an error with --strict.
        """
        os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "grpc"
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://collector:4317"
        self.addCleanup(os.environ.pop, "OTEL_EXPORTER_OTLP_PROTOCOL")
        self.addCleanup(os.environ.pop, "OTEL_EXPORTER_OTLP_ENDPOINT")
        code, out = self.run_check({})
        self.assertEqual(code, 0)
        self.assertIn("traces: OTLP protocol 'grpc'", out)
        code, out = self.run_check({}, "--strict")
        self.assertEqual(code, 1)
        self.assertIn("error (--strict): traces: OTLP protocol 'grpc'", out)

    def test_trace_certificate_files(self) -> None:
        """
        A CA bundle, client certificate or key the daemon could not read
        (the start would only warn and send nothing) is a warning here, an
        error with --strict, naming the file.
        """
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "https://collector:4318"
        self.addCleanup(os.environ.pop, "OTEL_EXPORTER_OTLP_ENDPOINT")
        missing = os.path.abspath(self.mktemp())
        for names in (
            ["OTEL_EXPORTER_OTLP_CERTIFICATE"],
            ["OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_KEY"],
        ):
            for name in names:
                os.environ[name] = missing
            code, out = self.run_check({})
            self.assertEqual(code, 0)
            self.assertIn("traces: the OTLP certificate files cannot be read", out)
            self.assertIn(missing, out)
            code, out = self.run_check({}, "--strict")
            self.assertEqual(code, 1)
            self.assertIn("error (--strict): traces: the OTLP certificate", out)
            for name in names:
                os.environ.pop(name)

    def test_version_and_h(self) -> None:
        """
        --version prints sandboxd's version (not Twisted's), after a
        command too; -h is help, and serve's says where the PTY port is
        by default.
        """
        for argv, expect in (
            (["--version"], __version__),
            (["serve", "--version"], __version__),
            (["check-config", "--version"], __version__),
            (["reload", "--version"], __version__),
            (["-h"], "Usage:"),
            (["serve", "--help"], "else the HTTP port + 1"),
        ):
            done = subprocess.run(
                [os.path.join(BIN, "sandboxd"), *argv],
                capture_output=True,
                text=True,
                timeout=60,
            )
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn(expect, done.stdout)
            self.assertNotIn("Twisted", done.stdout.splitlines()[0])

    def test_explain(self) -> None:
        """--explain names the rule behind a decision."""
        code, out = self.run_check(
            {"endpoints": {"files_*": {"paths": {"deny": ["**/.git/**"]}}}},
            "--explain",
            "files_stat",
            "--path",
            "/tmp/repo/.git/config",
        )
        self.assertEqual(code, 1)  # a refusal, as caps --explain exits
        self.assertIn("path_denied", out)
        self.assertIn("policy:endpoints.files_*", out)

    def test_explain_unknown_endpoint(self) -> None:
        """--explain of an id no endpoint has is a mistake: invalid, with the nearest id, exit 1."""
        code, out = self.run_check({}, "--explain", "files_lst")
        self.assertEqual(code, 1)
        self.assertIn(
            "invalid: unknown endpoint 'files_lst'; did you mean 'files_list'?", out
        )

    def test_explain_json_scopes(self) -> None:
        """--explain --json with --scopes decides for that caller."""
        code, out = self.run_check(
            {}, "--explain", "list_commands", "--scopes", "files:read", "--json"
        )
        self.assertEqual(code, 1)
        decision = json.loads(out)
        self.assertEqual(
            (decision["allowed"], decision["code"]), (False, "missing_scope")
        )
