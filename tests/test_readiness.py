"""
What the first ``200 /health`` promises, and what start-up leaves unimported.

Both run the real daemon (``twistd -n sandboxd``) as its own process on
loopback ports, as a platform starting a sandbox does, and wait on it from a
synchronous test with the standard library.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import sys
import textwrap
import time

from twisted.trial.unittest import SynchronousTestCase

from tests.helpers import free_port, refusing_port
from tests.test_cli import DaemonProcess, twistd_argv

TOKEN = "readiness-token-0123456789"

#: A server endpoint ``slowtcp:PORT:delay=S`` whose listen completes S
#: seconds late, as a socket-activated or TLS-loading listener may: the
#: daemon must not claim to be ready before it listens.
SLOW_ENDPOINT_PLUGIN = textwrap.dedent(
    """
    from twisted.internet import endpoints, task
    from twisted.internet.interfaces import (
        IStreamServerEndpoint,
        IStreamServerEndpointStringParser,
    )
    from twisted.plugin import IPlugin
    from zope.interface import implementer


    @implementer(IStreamServerEndpoint)
    class SlowEndpoint:
        def __init__(self, reactor, inner, delay):
            self.reactor, self.inner, self.delay = reactor, inner, delay

        def listen(self, factory):
            return task.deferLater(
                self.reactor, self.delay, self.inner.listen, factory
            )


    @implementer(IPlugin, IStreamServerEndpointStringParser)
    class SlowParser:
        prefix = "slowtcp"

        def parseStreamServer(self, reactor, port, delay="1", interface="127.0.0.1"):
            inner = endpoints.TCP4ServerEndpoint(reactor, int(port), interface=interface)
            return SlowEndpoint(reactor, inner, float(delay))


    slowtcp = SlowParser()
    """
)

#: Run twistd in-process; write the names in sys.modules to OUT just before
#: the daemon loads its everyday groups once listening, and to OUT.settled
#: just after.
MODULES_WRAPPER = textwrap.dedent(
    """
    import os, sys

    out = sys.argv[1]

    def dump(path):
        with open(path + ".part", "w") as f:
            f.write("\\n".join(sorted(sys.modules)))
        os.replace(path + ".part", path)

    import sandboxd.daemon.server as server

    everyday = server.load_everyday

    def dumping(*args):
        dump(out)
        everyday(*args)
        dump(out + ".settled")

    server.load_everyday = dumping
    sys.argv = ["twistd", *sys.argv[2:]]
    from twisted.scripts.twistd import run

    run()
    """
)

#: What :func:`sandboxd.daemon.startup.load_everyday` loads once the daemon
#: listens: the handlers of the process and file groups, and what they import
#: (a child's machinery, the upload and watch services' modules; not the
#: services, nor inotify).
EVERYDAY = (
    "sandboxd.routes.files",
    "sandboxd.routes.uploads",
    "sandboxd.routes.process",
    "sandboxd.files.uploads",
    "sandboxd.files.watch",
    "sandboxd.processes.child",
    "sandboxd.processes.managed",
    "sandboxd.processes.posix_spawn",
    "sandboxd.processes.run",
    "sandboxd.processes.spawning",
)

#: Modules that the default policy's daemon must not have imported before
#: its first request: each belongs to a group or door not yet used.
NOT_AT_START = (
    # the handlers of every group but core (which answered /health): a
    # group's modules are imported on its first request
    "sandboxd.routes.commands",
    "sandboxd.routes.files",
    "sandboxd.routes.uploads",
    "sandboxd.routes.process",
    "sandboxd.routes.terminal",
    "sandboxd.routes.system",
    "sandboxd.routes.devtools",
    "sandboxd.routes.browser",
    "sandboxd.routes.agents",
    "sandboxd.routes.mcp",
    # the browser: Playwright runs in a worker child, never in the daemon
    "playwright",
    # code contexts: ZMQ, Jupyter's client and its asyncio stack run in the
    # kernel hub child, never in the daemon; the group is off by default
    "zmq",
    "jupyter_client",
    "tornado",
    "ipykernel",
    "sandboxd.kernels",
    "sandboxd.routes.kernels",
    # agents and the browser, off by default: their services are built on
    # first use
    "sandboxd.agents",
    "sandboxd.browser",
    # files: archives and watches (zipfile is not listed: Twisted's plugin
    # discovery imports it through twisted.python.zippath)
    "sandboxd.files.archive",
    "tarfile",
    "twisted.internet.inotify",
    # system facts, git
    "psutil",
    "sandboxd.git",
    # a child's machinery: imported when the first child starts
    "sandboxd.processes.child",
    "sandboxd.processes.run",
    "sandboxd.processes.managed",
    "sandboxd.processes.spawning",
    "sandboxd.processes.posix_spawn",
    # the services built on first use
    "sandboxd.files.watch",
    "sandboxd.files.uploads",
    # a terminal session's machinery: imported when the first shell starts
    "sandboxd.terminals.session",
    # the PTY door's WebSocket machinery: built on the first connection
    "autobahn",
    "sandboxd.terminals.websocket",
    # the OpenAPI document and its field schemas
    "sandboxd.api.schema",
    "sandboxd.api.openapi",
    # doors imported when enabled or first used (docs/architecture.md)
    "sandboxd.mcp",
    "sandboxd.e2b",
    "sandboxd.preview",
    "sandboxd.kep",
    # metrics exposition
    "prometheus_client",
    # the trace exporter (no collector named) and the HTTP client it uses
    "sandboxd.access.otlp",
    "twisted.web.client",
)


def http_get(port: int, path: str, token: str | None = None) -> tuple[int, bytes]:
    """One GET over a fresh connection: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {"Host": "127.0.0.1"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def http_post(
    port: int, path: str, body: dict[str, object], token: str
) -> tuple[int, bytes]:
    """One JSON POST over a fresh connection: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(
            "POST",
            path,
            body=json.dumps(body),
            headers={
                "Host": "127.0.0.1",
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
            },
        )
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def first_health(daemon: DaemonProcess, timeout: float = 30) -> None:
    """
    Poll /health as a platform does until the first 200 from the daemon
    itself (another test's server that took its port would answer too).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, _ = http_get(daemon.port, "/health")
            if status == 200 and daemon.listens():
                return
        except OSError:
            pass
        if daemon.proc.poll() is not None and not daemon.start_again():
            break
        time.sleep(0.01)
    raise AssertionError(f"no 200 /health; output:\n{daemon.output()}")


def websocket_handshake(port: int, session_id: str, token: str) -> bytes:
    """The status line of an RFC 6455 upgrade to the PTY port."""
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /pty?session_id={session_id} HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Authorization: Bearer {token}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request.encode())
        return s.recv(4096).split(b"\r\n", 1)[0]


def stop(daemon: DaemonProcess) -> None:
    """SIGTERM, so the daemon ends its terminals; SIGKILL by cleanup after."""
    if daemon.proc.poll() is None:
        daemon.proc.send_signal(signal.SIGTERM)
        try:
            daemon.proc.wait(15)
        except Exception:
            pass


class ReadyTests(SynchronousTestCase):
    """The first ``200 /health`` means the daemon can serve."""

    def slow_daemon(self, argv: list[str]) -> DaemonProcess:
        """
        Run ``argv`` with the ``slowtcp:PORT:delay=S`` endpoint plugin on
        the path (a listener whose listen completes S seconds late).
        """
        plugins = os.path.join(os.path.abspath(self.mktemp()), "twisted", "plugins")
        os.makedirs(plugins)
        with open(os.path.join(plugins, "slow_listen.py"), "w") as f:
            f.write(SLOW_ENDPOINT_PLUGIN)
        search = os.path.dirname(os.path.dirname(plugins))
        env = {
            "ABX_SERVER_TOKEN": TOKEN,
            "PYTHONPATH": os.pathsep.join([search, os.environ.get("PYTHONPATH", "")]),
        }
        daemon = DaemonProcess(self, argv, env)
        self.addCleanup(stop, daemon)
        return daemon

    def base_dir(self) -> str:
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        return base

    def slow_pty_daemon(self) -> DaemonProcess:
        """A daemon whose PTY port's listen completes 1.5 s late."""
        self.pty_port = free_port()
        argv = twistd_argv(self.base_dir())
        argv[argv.index("tcp:{pty}:interface=127.0.0.1")] = (
            f"slowtcp:{self.pty_port}:delay=1.5"
        )
        return self.slow_daemon(argv)

    def test_first_health_means_pty_and_policy(self) -> None:
        """
        Even when the PTY port's listen completes late, the first 200 on
        /health comes after it: at that moment a WebSocket handshake on the
        PTY port succeeds (101) and /capabilities answers under the policy.
        """
        daemon = self.slow_pty_daemon()
        first_health(daemon)
        # Nothing waits here: these are the very next requests.
        status, body = http_post(daemon.port, "/pty/sessions", {}, TOKEN)
        self.assertEqual(status, 200, body)
        session_id = json.loads(body)["session_id"]
        line = websocket_handshake(self.pty_port, session_id, TOKEN)
        self.assertEqual(line, b"HTTP/1.1 101 Switching Protocols")
        status, body = http_get(daemon.port, "/capabilities", TOKEN)
        self.assertEqual(status, 200, body)
        self.assertIn("pty_connect", body.decode())

    def slow_e2b_daemon(self) -> DaemonProcess:
        """A daemon whose E2B port's listen completes 1.5 s late."""
        policy = os.path.abspath(self.mktemp())
        with open(policy, "w") as f:
            json.dump({"groups": {"e2b": True}}, f)
        self.e2b_port = free_port()
        argv = twistd_argv(
            self.base_dir(),
            "--policy",
            policy,
            "--e2b-port",
            f"slowtcp:{self.e2b_port}:delay=1.5",
        )
        return self.slow_daemon(argv)

    def test_first_health_means_e2b_port(self) -> None:
        """
        With the E2B port on, the first 200 on /health comes after it
        listens, however late its listen completes: envd's ``GET /health``
        on the E2B port answers 204 at once.
        """
        daemon = self.slow_e2b_daemon()
        first_health(daemon)
        status, body = http_get(self.e2b_port, "/health")
        self.assertEqual(status, 204, body)

    def test_pty_port_in_use_fails_the_start(self) -> None:
        """
        A PTY port that cannot listen stops the start: /health never
        answers and the process exits non-zero.
        """
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        self.addCleanup(busy.close)
        argv = twistd_argv(base)
        argv[argv.index("tcp:{pty}:interface=127.0.0.1")] = (
            f"tcp:{busy.getsockname()[1]}:interface=127.0.0.1"
        )
        daemon = DaemonProcess(self, argv, {"ABX_SERVER_TOKEN": TOKEN})
        self.addCleanup(stop, daemon)
        code = daemon.proc.wait(30)
        self.assertNotEqual(code, 0, daemon.output())
        with self.assertRaises(OSError):
            http_get(daemon.port, "/health")


class StartImportsTests(SynchronousTestCase):
    """Groups and doors not yet used import nothing at start."""

    def test_default_policy_imports_no_unused_group(self) -> None:
        """
        With the default policy (every group on), what the daemon has
        imported by the time it listens holds none of ``NOT_AT_START``;
        once it has settled, the everyday groups' handlers are loaded and
        still nothing else of the list.
        """
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        wrapper = os.path.abspath(self.mktemp())
        with open(wrapper, "w") as f:
            f.write(MODULES_WRAPPER)
        out = os.path.abspath(self.mktemp())
        argv = [sys.executable, wrapper, out, *twistd_argv(base)[1:]]
        daemon = DaemonProcess(self, argv, {"ABX_SERVER_TOKEN": TOKEN})
        self.addCleanup(stop, daemon)
        first_health(daemon)
        deadline = time.monotonic() + 10
        while not os.path.exists(out + ".settled") and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertTrue(os.path.exists(out + ".settled"), daemon.output())
        with open(out) as f:
            at_start = set(f.read().split())
        with open(out + ".settled") as f:
            settled = set(f.read().split())
        self.assertIn("sandboxd.routes.core", at_start)
        self.assertEqual(unwanted(at_start, NOT_AT_START), [])
        self.assertEqual(sorted(settled & set(EVERYDAY)), sorted(EVERYDAY))
        self.assertNotIn("twisted.internet.inotify", settled)
        later = tuple(m for m in NOT_AT_START if m not in EVERYDAY)
        self.assertEqual(unwanted(settled, later), [])


def unwanted(modules: set[str], listed: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` that are, or are inside, one of ``listed``."""
    return sorted(
        m for m in modules for name in listed if m == name or m.startswith(name + ".")
    )


class EverydayGroupsTests(SynchronousTestCase):
    """Which groups are loaded once the daemon listens (in memory)."""

    def loaded(self, policy: dict[str, object]) -> set[str]:
        from sandboxd.daemon.startup import load_everyday
        from sandboxd.routes import FirstCall
        from sandboxd.testing import memory_context

        context = memory_context(policy)
        load_everyday(context.policy, context.table)
        return {
            e.group.value
            for e in context.table
            if e.handler is not None and not isinstance(e.handler, FirstCall)
        }

    def test_process_and_files_when_on(self) -> None:
        loaded = self.loaded({})
        self.assertIn("process", loaded)
        self.assertIn("file_ops", loaded)
        self.assertNotIn("terminal", loaded)
        self.assertNotIn("system", loaded)

    def test_a_group_switched_off_stays_unloaded(self) -> None:
        """Nothing of a group the policy turned off is loaded ahead of use."""
        loaded = self.loaded({"groups": {"process": False}})
        self.assertNotIn("process", loaded)
        self.assertIn("file_ops", loaded)


class HealthcheckImportsTests(SynchronousTestCase):
    """``sandboxd healthcheck`` (run by every probe) does not import the daemon."""

    def test_healthcheck_imports_no_reactor(self) -> None:
        """
        ``sandboxd healthcheck`` against a closed port exits 1 without having
        imported Twisted's reactor, pyOpenSSL or the daemon's server module.
        """
        probe = (
            "import sys\n"
            "from sandboxd import cli\n"
            "code = cli.main(['healthcheck', '--port', sys.argv[1], '--timeout', '1'])\n"
            "heavy = [m for m in ('twisted.internet.reactor', 'OpenSSL',"
            " 'sandboxd.daemon.server', 'sandboxd.policy') if m in sys.modules]\n"
            "print(code, heavy)\n"
        )
        import subprocess

        out = subprocess.run(
            [sys.executable, "-c", probe, str(refusing_port(self))],
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(out.stdout.strip(), "1 []", out.stderr)

    def test_default_port_agrees(self) -> None:
        """The healthcheck's default port is the daemon's."""
        from sandboxd import cli
        from sandboxd.daemon import server

        self.assertEqual(cli.DEFAULT_PORT, server.DEFAULT_PORT)


class FirstImportTests(SynchronousTestCase):
    """Since ``sandboxd/__init__`` imports nothing, any module may come first."""

    def test_each_module_imports_first(self) -> None:
        """
        Each top-level module and subpackage of sandboxd imports in a fresh
        interpreter as the first thing imported (an import cycle that an
        eager package ``__init__`` used to hide fails here).
        """
        import pkgutil
        import subprocess

        import sandboxd

        names = [
            f"sandboxd.{info.name}"
            for info in pkgutil.iter_modules(sandboxd.__path__)
            if not info.name.startswith("_")
        ]
        # The daemon's lifecycle and the access layer were top-level modules
        # once; their modules are checked one by one as before.
        for package in ("daemon", "access"):
            where = [os.path.join(sandboxd.__path__[0], package)]
            names += [
                f"sandboxd.{package}.{info.name}"
                for info in pkgutil.iter_modules(where)
            ]
        self.assertIn("sandboxd.access.auth", names)
        script = (
            "import importlib, subprocess, sys\n"
            "bad = []\n"
            "for name in sys.argv[1:]:\n"
            "    r = subprocess.run([sys.executable, '-c', f'import {name}'],"
            " capture_output=True, text=True)\n"
            "    if r.returncode:\n"
            "        bad.append((name, r.stderr.strip().splitlines()[-1]))\n"
            "print(bad)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", script, *names],
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.assertEqual(out.stdout.strip(), "[]", out.stderr)
