"""
The system group (SPEC §7.6, §11.3) against a real daemon: facts, the
environment later children inherit, listening ports, package listings.
"""

from __future__ import annotations

import os
import platform
import socket
import stat
import sys
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import deferLater
from twisted.internet.utils import getProcessOutput
from twisted.trial.unittest import SkipTest

from sandboxd import sysinfo
from sandboxd.processes import environment
from tests.helpers import DaemonTestCase

INFO_FIELDS = {
    "os",
    "arch",
    "cpu_count",
    "memory_total_mb",
    "memory_available_mb",
    "disk_total_gb",
    "disk_free_gb",
    "python_version",
    "hostname",
}

METRICS_FIELDS = {
    "cpu_load_1m",
    "cpu_load_5m",
    "cpu_load_15m",
    "memory_used_mb",
    "memory_total_mb",
    "memory_percent",
    "disk_used_gb",
    "disk_total_gb",
    "disk_percent",
    "uptime_seconds",
}


class EnvMixin:
    """Sets process environment variables for one test, restored after."""

    def setenv(self, **values: str) -> None:
        """Set ``values`` in os.environ until the test ends."""
        for name, value in values.items():
            self.forget_env(name)
            os.environ[name] = value

    def forget_env(self, *names: str) -> None:
        """Restore ``names`` (to their value, or unset) when the test ends."""
        for name in names:
            old = os.environ.get(name)

            def restore(name: str = name, old: str | None = old) -> None:
                if old is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = old

            self.addCleanup(restore)  # type: ignore[attr-defined]


class InfoTests(DaemonTestCase):
    """``GET /system/info`` and ``GET /system/metrics``."""

    @inlineCallbacks
    def test_info_fields(self) -> Any:
        """Every field of §7.6 is there with a sensible value and type."""
        reply = yield self.request("GET", "/system/info")
        self.assertEqual(reply.status, 200)
        info = reply.json()
        self.assertTrue(INFO_FIELDS <= set(info), INFO_FIELDS - set(info))
        self.assertEqual(info["os"], platform.system())
        self.assertEqual(info["arch"], platform.machine())
        self.assertEqual(info["python_version"], platform.python_version())
        self.assertEqual(info["hostname"], socket.gethostname())
        self.assertIsInstance(info["cpu_count"], int)
        self.assertGreaterEqual(info["cpu_count"], 1)
        self.assertIsInstance(info["memory_total_mb"], int)
        self.assertGreater(info["memory_total_mb"], 0)
        self.assertTrue(0 <= info["memory_available_mb"] <= info["memory_total_mb"])
        self.assertTrue(0 <= info["disk_free_gb"] <= info["disk_total_gb"])

    @inlineCallbacks
    def test_info_says_its_sources(self) -> Any:
        """The reply says whether memory and CPU are the container's or the host's."""
        info = (yield self.request("GET", "/system/info")).json()
        self.assertIn(info["memory_source"], ("cgroup", "host"))
        self.assertIn(info["cpu_source"], ("cgroup", "affinity", "host"))
        if info["cpu_limit"] is not None:
            self.assertGreater(info["cpu_limit"], 0)

    @inlineCallbacks
    def test_container_limits_reported(self) -> Any:
        """Under a 512 MiB, half-CPU cgroup, info and metrics report the container."""
        root = os.path.realpath(self.mktemp())
        group_dir = os.path.join(root, "sys/fs/cgroup/box")
        os.makedirs(group_dir)
        os.makedirs(os.path.join(root, "proc/self"))
        files = {
            "proc/self/cgroup": "0::/box\n",
            "proc/self/mountinfo": "30 1 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
            "sys/fs/cgroup/box/memory.max": f"{512 * 1024 * 1024}\n",
            "sys/fs/cgroup/box/memory.current": f"{128 * 1024 * 1024}\n",
            "sys/fs/cgroup/box/cpu.max": "50000 100000\n",
        }
        for rel, text in files.items():
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        group = sysinfo.Cgroup.find(root)
        self.patch(sysinfo.Cgroup, "find", classmethod(lambda cls, root="/": group))
        info = (yield self.request("GET", "/system/info")).json()
        self.assertEqual(info["memory_total_mb"], 512)
        self.assertLessEqual(info["memory_available_mb"], 384)
        self.assertEqual(info["memory_source"], "cgroup")
        self.assertEqual((info["cpu_count"], info["cpu_limit"]), (1, 0.5))
        self.assertEqual(info["cpu_source"], "cgroup")
        metrics = (yield self.request("GET", "/system/metrics")).json()
        self.assertEqual(metrics["memory_total_mb"], 512)
        self.assertEqual(metrics["memory_used_mb"], 128)
        self.assertEqual(metrics["memory_percent"], 25.0)

    @inlineCallbacks
    def test_disk_is_the_base_dir(self) -> Any:
        """The disk figures are those of the file system holding the base dir."""
        info = (yield self.request("GET", "/system/info")).json()
        st = os.statvfs(self.base_dir)
        total_gb = st.f_blocks * st.f_frsize / 1024**3
        self.assertLess(abs(info["disk_total_gb"] - total_gb), 0.01)

    @inlineCallbacks
    def test_metrics_fields(self) -> Any:
        """Every field of §7.6 with percentages in range and a growing uptime."""
        reply = yield self.request("GET", "/system/metrics")
        self.assertEqual(reply.status, 200)
        metrics = reply.json()
        self.assertTrue(METRICS_FIELDS <= set(metrics), METRICS_FIELDS - set(metrics))
        self.assertEqual(metrics["cpu_load_1m"], round(os.getloadavg()[0], 2))
        for name in ("cpu_load_5m", "cpu_load_15m"):
            self.assertGreaterEqual(metrics[name], 0)
        self.assertTrue(0 <= metrics["memory_used_mb"] <= metrics["memory_total_mb"])
        self.assertTrue(0 <= metrics["memory_percent"] <= 100)
        self.assertTrue(0 <= metrics["disk_used_gb"] <= metrics["disk_total_gb"])
        self.assertTrue(0 <= metrics["disk_percent"] <= 100)
        self.assertGreaterEqual(metrics["uptime_seconds"], 0)

    @inlineCallbacks
    def test_info_and_metrics_agree(self) -> Any:
        """Both endpoints report the same memory and disk totals."""
        info = (yield self.request("GET", "/system/info")).json()
        metrics = (yield self.request("GET", "/system/metrics")).json()
        self.assertEqual(info["memory_total_mb"], metrics["memory_total_mb"])
        self.assertEqual(info["disk_total_gb"], metrics["disk_total_gb"])
        self.assertEqual(info["memory_source"], metrics["memory_source"])


class EnvGetTests(EnvMixin, DaemonTestCase):
    """``GET /env``: filtering and redaction."""

    policy = {
        "auth": {"tokens": [{"id": "ci", "token_env": "CI_LOGIN", "scopes": ["*"]}]},
        "endpoints": {"env_get": {"params": {"env_deny": ["HIDDEN_BY_POLICY"]}}},
    }
    environ = {"CI_LOGIN": "ci-login-value"}

    def get(self, path: str) -> Any:
        """A GET with the ``ci`` token."""
        return self.request("GET", path, token="ci-login-value")

    @inlineCallbacks
    def test_plain_variables_shown(self) -> Any:
        """An ordinary variable is returned with its value."""
        self.setenv(SANDBOXD_TEST_PLAIN="hello world")
        reply = yield self.get("/env")
        self.assertEqual(reply.status, 200)
        self.assertEqual(
            reply.json()["variables"]["SANDBOXD_TEST_PLAIN"], "hello world"
        )

    @inlineCallbacks
    def test_secret_names_redacted(self) -> Any:
        """TOKEN, SECRET, KEY, PASSWORD, CREDENTIAL in any case are never returned."""
        secrets = {
            "GITHUB_TOKEN": "a",
            "aws_secret_access": "b",
            "My_Api_Key": "c",
            "db_password": "d",
            "GOOGLE_APPLICATION_CREDENTIALS": "e",
            "xtokenx": "f",
        }
        self.setenv(**secrets, SANDBOXD_TEST_PLAIN="1")
        variables = (yield self.get("/env")).json()["variables"]
        for name in secrets:
            self.assertNotIn(name, variables)
        self.assertIn("SANDBOXD_TEST_PLAIN", variables)
        filtered = (yield self.get("/env?filter=" + ",".join(secrets))).json()
        self.assertEqual(filtered, {"variables": {}})

    @inlineCallbacks
    def test_server_secrets_redacted(self) -> Any:
        """The server's own names (token_env, ABX_SERVER_*) and env_deny are hidden."""
        self.setenv(
            CI_LOGIN="ci-login-value",
            ABX_SERVER_POLICY="{}",
            HIDDEN_BY_POLICY="x",
            SANDBOXD_TEST_PLAIN="1",
        )
        variables = (yield self.get("/env")).json()["variables"]
        for name in ("CI_LOGIN", "ABX_SERVER_POLICY", "HIDDEN_BY_POLICY"):
            self.assertNotIn(name, variables)
        self.assertNotIn("ci-login-value", variables.values())

    @inlineCallbacks
    def test_filter(self) -> Any:
        """``filter=A,B`` returns only those names (spaces ignored, unknown skipped)."""
        self.setenv(SANDBOXD_TEST_A="1", SANDBOXD_TEST_B="2", SANDBOXD_TEST_C="3")
        reply = yield self.get(
            "/env?filter=SANDBOXD_TEST_A,%20SANDBOXD_TEST_C,NOPE_NOT_SET"
        )
        self.assertEqual(
            reply.json(),
            {"variables": {"SANDBOXD_TEST_A": "1", "SANDBOXD_TEST_C": "3"}},
        )

    @inlineCallbacks
    def test_empty_filter(self) -> Any:
        """An empty filter names nothing, so nothing is returned."""
        self.setenv(SANDBOXD_TEST_A="1")
        reply = yield self.get("/env?filter=")
        self.assertEqual(reply.json(), {"variables": {}})


class EnvGetVarsTests(EnvMixin, DaemonTestCase):
    """``GET /env`` under a seed policy's ``allow_vars`` / ``deny_vars``."""

    policy = {
        "endpoints": {
            "env_get": {
                "params": {
                    "deny_vars": ["DB_*", "*_URL"],
                    "allow_vars": ["APP_*", "DB_*", "HOME", "*_URL"],
                }
            }
        }
    }

    @inlineCallbacks
    def test_globs_filter_the_answer(self) -> Any:
        """
        Only names an ``allow_vars`` glob matches are read, and a
        ``deny_vars`` glob wins over it, as on the seed: a ``DATABASE_URL``
        holding a password is not returned.
        """
        self.setenv(
            HOME="/root",
            APP_NAME="demo",
            DB_HOST="db.internal",
            DATABASE_URL="postgres://u:p@db/app",
            INTERNAL_HOST="10.0.0.5",
        )
        reply = yield self.request(
            "GET", "/env?filter=APP_NAME,DB_HOST,DATABASE_URL,INTERNAL_HOST,HOME"
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            reply.json(), {"variables": {"APP_NAME": "demo", "HOME": "/root"}}
        )
        everything = (yield self.request("GET", "/env")).json()["variables"]
        self.assertEqual(sorted(everything), ["APP_NAME", "HOME"])


class EnvSetTests(EnvMixin, DaemonTestCase):
    """``POST /env``: what is set, what is refused, who inherits it."""

    @inlineCallbacks
    def post(self, vars: Any, expect: int = 200) -> Any:
        """POST /env and check the status."""
        reply = yield self.request("POST", "/env", {"vars": vars})
        self.assertEqual(reply.status, expect, reply.body)
        return reply.json()

    @inlineCallbacks
    def test_set_and_read_back(self) -> Any:
        """Variables are set in the daemon's environment; names come back sorted."""
        self.forget_env("SANDBOXD_TEST_Z", "SANDBOXD_TEST_A")
        body = yield self.post({"SANDBOXD_TEST_Z": "last", "SANDBOXD_TEST_A": "first"})
        self.assertEqual(body, {"updated": ["SANDBOXD_TEST_A", "SANDBOXD_TEST_Z"]})
        self.assertEqual(os.environ["SANDBOXD_TEST_A"], "first")
        reply = yield self.request("GET", "/env?filter=SANDBOXD_TEST_A,SANDBOXD_TEST_Z")
        self.assertEqual(
            reply.json()["variables"],
            {"SANDBOXD_TEST_A": "first", "SANDBOXD_TEST_Z": "last"},
        )

    @inlineCallbacks
    def test_numbers_become_strings(self) -> Any:
        """A number is stored as its text; an empty object updates nothing."""
        self.forget_env("SANDBOXD_TEST_N")
        yield self.post({"SANDBOXD_TEST_N": 42})
        self.assertEqual(os.environ["SANDBOXD_TEST_N"], "42")
        self.assertEqual((yield self.post({})), {"updated": []})

    @inlineCallbacks
    def test_null_unsets(self) -> Any:
        """
        A null value removes the variable: later commands no longer see it,
        and the answer names it; a name not set is no error.
        """
        self.forget_env("SANDBOXD_TEST_GONE", "SANDBOXD_TEST_KEPT")
        yield self.post({"SANDBOXD_TEST_GONE": "x", "SANDBOXD_TEST_KEPT": "y"})
        body = yield self.post(
            {"SANDBOXD_TEST_GONE": None, "SANDBOXD_TEST_NEVER": None}
        )
        self.assertEqual(
            body,
            {
                "updated": ["SANDBOXD_TEST_GONE", "SANDBOXD_TEST_NEVER"],
                "unset": ["SANDBOXD_TEST_GONE", "SANDBOXD_TEST_NEVER"],
            },
        )
        reply = yield self.request(
            "POST",
            "/shell",
            {
                "command": 'echo "${SANDBOXD_TEST_GONE-unset}" $SANDBOXD_TEST_KEPT',
                "shell": "sh",
            },
        )
        self.assertEqual(reply.json()["stdout"], "unset y\n")
        body = yield self.post({"PATH": None}, expect=403)
        self.assertEqual(body["code"], "protected_variable")
        self.assertIn("PATH", os.environ)

    @inlineCallbacks
    def test_later_child_inherits(self) -> Any:
        """A child started after POST /env sees the variable; secrets stay out."""
        self.forget_env("SANDBOXD_TEST_CHILD")
        yield self.post({"SANDBOXD_TEST_CHILD": "inherited"})
        context = self.daemon.context
        env = environment.child_environment(context, context.policy.rule("shell"))
        self.assertEqual(env["SANDBOXD_TEST_CHILD"], "inherited")
        out = yield getProcessOutput(
            "/bin/sh",
            ["-c", 'printf %s "$SANDBOXD_TEST_CHILD"'],
            env=env,
            reactor=reactor,
        )
        self.assertEqual(out, b"inherited")

    @inlineCallbacks
    def test_shell_sees_it(self) -> Any:
        """A later ``POST /shell`` prints the variable set through ``POST /env``."""
        self.forget_env("SANDBOXD_TEST_SHELL")
        yield self.post({"SANDBOXD_TEST_SHELL": "from-env"})
        reply = yield self.request(
            "POST",
            "/shell",
            {"command": 'printf %s "$SANDBOXD_TEST_SHELL"', "shell": "sh"},
        )
        if reply.json().get("rule") == "code:not-implemented":
            raise SkipTest("/shell is not live yet")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stdout"], "from-env")

    @inlineCallbacks
    def test_helpers_keep_boot_environment(self) -> Any:
        """The daemon's own helpers start from the boot snapshot, not from POST /env."""
        self.forget_env("SANDBOXD_TEST_BOOT")
        yield self.post({"SANDBOXD_TEST_BOOT": "x"})
        self.assertNotIn("SANDBOXD_TEST_BOOT", environment.BOOT_ENVIRON)

    @inlineCallbacks
    def test_invalid_bodies(self) -> Any:
        """A ``vars`` that is missing or not an object is 400 invalid_param."""
        for body in ({}, {"vars": ["A"]}, {"vars": "A=1"}, {"vars": None}):
            reply = yield self.request("POST", "/env", body)
            self.assertEqual(reply.status, 400, body)
            self.assertEqual(reply.json()["code"], "invalid_param")
            self.assertEqual(reply.json()["type"], "ValueError")

    @inlineCallbacks
    def test_invalid_names_and_values(self) -> Any:
        """Empty names, ``=`` or NUL in names, NUL or non-strings in values: 400."""
        cases = [
            {"": "x"},
            {"A=B": "x"},
            {"A\x00B": "x"},
            {"SANDBOXD_TEST_V": "a\x00b"},
            {"SANDBOXD_TEST_V": True},
            {"SANDBOXD_TEST_V": ["x"]},
        ]
        for vars in cases:
            body = yield self.post(vars, expect=400)
            self.assertEqual(body["code"], "invalid_param", vars)
        # A lone surrogate never gets past the body parser (issue 22).
        body = yield self.post({"SANDBOXD_TEST_V": "\ud800"}, expect=400)
        self.assertEqual(body["code"], "invalid_json")

    @inlineCallbacks
    def test_all_or_nothing(self) -> Any:
        """One bad entry refuses the whole request: nothing is set."""
        self.forget_env("SANDBOXD_TEST_GOOD")
        yield self.post({"SANDBOXD_TEST_GOOD": "1", "BAD=NAME": "2"}, expect=400)
        self.assertNotIn("SANDBOXD_TEST_GOOD", os.environ)
        yield self.post({"SANDBOXD_TEST_GOOD": "1", "PATH": "/evil"}, expect=403)
        self.assertNotIn("SANDBOXD_TEST_GOOD", os.environ)

    @inlineCallbacks
    def test_protected_names(self) -> Any:
        """
        PATH, HOME, USER, SHELL and every ABX_* (any case: the daemon's
        settings, which a reload reads again) are 403 protected_variable.
        """
        before = dict(os.environ)
        for name in (
            "PATH",
            "HOME",
            "USER",
            "SHELL",
            "ABX_SERVER_TOKEN",
            "ABX_SERVER_TOKEN_FILE",
            "ABX_SERVER_POLICY",
            "ABX_SERVER_BASE_DIR",
            "ABX_MAX_UPLOAD_SIZE",
            "ABX_MAX_CONNECTIONS",
            "abx_pty_port",
            "ABX_GUARD_PROBE",
        ):
            body = yield self.post({name: "x"}, expect=403)
            self.assertEqual(body["code"], "protected_variable", name)
            self.assertEqual(body["type"], "PermissionError")
            self.assertEqual(body["variable"], name)
            self.assertEqual(body["rule"], "default:protected_variables")
        self.assertEqual(dict(os.environ), before)


class EnvPolicyTests(EnvMixin, DaemonTestCase):
    """``POST /env`` under a policy: token_env names and deny_vars."""

    policy = {
        "auth": {"tokens": [{"id": "ci", "token_env": "CI_LOGIN", "scopes": ["*"]}]},
        "endpoints": {"env_set": {"params": {"deny_vars": ["LD_PRELOAD"]}}},
    }
    environ = {"CI_LOGIN": "ci-login-value"}

    def post(self, vars: Any) -> Any:
        """POST /env with the ``ci`` token."""
        return self.request("POST", "/env", {"vars": vars}, token="ci-login-value")

    @inlineCallbacks
    def test_token_env_protected(self) -> Any:
        """A configured token_env name cannot be set (it would change a login)."""
        reply = yield self.post({"CI_LOGIN": "mine"})
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "protected_variable")
        self.assertEqual(reply.json()["rule"], "policy:auth.tokens")

    @inlineCallbacks
    def test_deny_vars(self) -> Any:
        """``params.deny_vars`` refuses its names and names the rule."""
        reply = yield self.post({"LD_PRELOAD": "/tmp/x.so"})
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "protected_variable")
        self.assertEqual(reply.json()["rule"], "policy:endpoints.env_set")
        self.assertNotIn("/tmp/x.so", os.environ.get("LD_PRELOAD", ""))

    @inlineCallbacks
    def test_other_names_allowed(self) -> Any:
        """Names no rule protects are set."""
        self.forget_env("SANDBOXD_TEST_OK")
        reply = yield self.post({"SANDBOXD_TEST_OK": "1"})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json(), {"updated": ["SANDBOXD_TEST_OK"]})


class EnvAllowVarsTests(EnvMixin, DaemonTestCase):
    """``params.allow_vars`` narrows POST /env to its names."""

    policy = {
        "endpoints": {"env_set": {"params": {"allow_vars": ["SANDBOXD_TEST_ALLOWED"]}}}
    }

    @inlineCallbacks
    def test_allow_vars(self) -> Any:
        """A listed name is set; any other is 403 naming the rule."""
        self.forget_env("SANDBOXD_TEST_ALLOWED", "SANDBOXD_TEST_OTHER")
        reply = yield self.request(
            "POST", "/env", {"vars": {"SANDBOXD_TEST_ALLOWED": "1"}}
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request(
            "POST", "/env", {"vars": {"SANDBOXD_TEST_OTHER": "1"}}
        )
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "protected_variable")
        self.assertEqual(reply.json()["rule"], "policy:endpoints.env_set")
        self.assertNotIn("SANDBOXD_TEST_OTHER", os.environ)


class EnvScopeTests(DaemonTestCase):
    """Reading and writing the environment are separate scopes."""

    policy = {
        "auth": {
            "tokens": [{"id": "ro", "token_env": "RO_LOGIN", "scopes": ["system:read"]}]
        }
    }
    environ = {"RO_LOGIN": "ro-login-value"}

    @inlineCallbacks
    def test_read_only_token(self) -> Any:
        """``system:read`` may GET /env but not POST it (403 missing_scope)."""
        reply = yield self.request("GET", "/env", token="ro-login-value")
        self.assertEqual(reply.status, 200)
        reply = yield self.request(
            "POST", "/env", {"vars": {"SANDBOXD_TEST_X": "1"}}, token="ro-login-value"
        )
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "missing_scope")
        self.assertNotIn("SANDBOXD_TEST_X", os.environ)


class _Silent(Protocol):
    pass


class PortsTests(DaemonTestCase):
    """``GET /ports``."""

    def listen(self, interface: str) -> int:
        """Listen on ``interface`` (closed after the test); returns the port."""
        port = reactor.listenTCP(0, Factory.forProtocol(_Silent), interface=interface)
        self.addCleanup(port.stopListening)
        return int(port.getHost().port)

    @inlineCallbacks
    def test_own_socket_listed_with_pid(self) -> Any:
        """A socket this test opens shows up with its address and this process's pid."""
        number = self.listen("127.0.0.1")
        reply = yield self.request("GET", "/ports")
        self.assertEqual(reply.status, 200)
        entries = reply.json()["listening"]
        self.assertIn(
            {
                "port": number,
                "protocol": "tcp",
                "address": "127.0.0.1",
                "pid": os.getpid(),
            },
            entries,
        )
        # The daemon's own HTTP port is there too.
        self.assertIn(self.daemon.port, [e["port"] for e in entries])

    @inlineCallbacks
    def test_ipv6_socket(self) -> Any:
        """An IPv6 socket is listed as tcp6."""
        if not socket.has_ipv6:
            raise SkipTest("no IPv6")
        try:
            number = self.listen("::1")
        except Exception as e:
            raise SkipTest(f"cannot listen on ::1: {e}") from None
        entries = (yield self.request("GET", "/ports")).json()["listening"]
        self.assertIn(
            {"port": number, "protocol": "tcp6", "address": "::1", "pid": os.getpid()},
            entries,
        )

    @inlineCallbacks
    def test_shape_and_no_duplicates(self) -> Any:
        """Every entry has the four fields, sorted by port, each socket once."""
        self.listen("127.0.0.1")
        entries = (yield self.request("GET", "/ports")).json()["listening"]
        keys = [(e["protocol"], e["address"], e["port"]) for e in entries]
        self.assertEqual(len(keys), len(set(keys)))
        self.assertEqual(
            [e["port"] for e in entries], sorted(e["port"] for e in entries)
        )
        for e in entries:
            self.assertEqual(set(e), {"port", "protocol", "address", "pid"})
            self.assertIn(e["protocol"], ("tcp", "tcp6"))

    @inlineCallbacks
    def test_closed_socket_gone(self) -> Any:
        """A socket that stopped listening is no longer listed."""
        port = reactor.listenTCP(0, Factory.forProtocol(_Silent), interface="127.0.0.1")
        number = port.getHost().port
        yield port.stopListening()
        entries = (yield self.request("GET", "/ports")).json()["listening"]
        self.assertNotIn(number, [e["port"] for e in entries])


class PortWaitTests(DaemonTestCase):
    """``GET /ports?port=N&wait=S``: an app's port, waited for."""

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    @inlineCallbacks
    def test_waits_for_an_app_started_through_the_daemon(self) -> Any:
        """
        Asked before the app listens, the answer comes once it does: ready,
        its socket with the app's pid; other ports are not listed.
        """
        number = self.free_port()
        began = reactor.seconds()
        waiting = self.request("GET", f"/ports?port={number}&wait=20")
        yield deferLater(reactor, 0.5, lambda: None)
        started = yield self.request(
            "POST",
            "/process/start",
            {"command": f"{sys.executable} -m http.server {number} --bind 127.0.0.1"},
        )
        self.assertEqual(started.status, 200, started.body)
        self.addCleanup(
            self.request,
            "POST",
            f"/process/{started.json()['pid']}/signal",
            {"signal": 9},
        )
        reply = yield waiting
        took = reactor.seconds() - began
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertTrue(body["ready"])
        self.assertEqual(
            [(e["port"], e["pid"]) for e in body["listening"]],
            [(number, started.json()["pid"])],
        )
        self.assertGreater(took, 0.5)
        self.assertLess(took, 10)

    @inlineCallbacks
    def test_wait_runs_out(self) -> Any:
        """Nothing listening within the wait: 200, ready false, after the wait."""
        # Held (bound, not listening) so that no other test's server takes it
        # meanwhile, as a port only picked as free could be.
        held = socket.socket()
        self.addCleanup(held.close)
        held.bind(("127.0.0.1", 0))
        number = held.getsockname()[1]
        began = reactor.seconds()
        reply = yield self.request("GET", f"/ports?port={number}&wait=0.6")
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.json(), {"listening": [], "ready": False})
        self.assertGreaterEqual(reactor.seconds() - began, 0.6)

    @inlineCallbacks
    def test_bad_queries(self) -> Any:
        """A wait without a port, or a port out of range, is 400 invalid_param."""
        for query in ("wait=1", "port=0", "port=70000", "port=x", "port=80&wait=-1"):
            reply = yield self.request("GET", f"/ports?{query}")
            self.assertEqual(
                (reply.status, reply.json()["code"]), (400, "invalid_param"), query
            )


def write_script(directory: str, name: str, text: str) -> str:
    """An executable shell script ``directory/name``."""
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


class PackagesTests(DaemonTestCase):
    """``GET /packages`` with fake tools on a PATH the test controls."""

    policy = {"endpoints": {"packages": {"limits": {"timeout_seconds": 1}}}}

    def setUp(self) -> Any:
        self.bin = os.path.realpath(self.mktemp())
        os.makedirs(self.bin)
        # Package listings start from the boot environment, not os.environ.
        self.patch(environment, "BOOT_ENVIRON", {"PATH": self.bin, "LANG": "C.UTF-8"})
        return super().setUp()

    @inlineCallbacks
    def test_other_manager(self) -> Any:
        """A manager other than pip or npm is 400, in the seed's words."""
        reply = yield self.request("GET", "/packages?manager=cargo")
        self.assertEqual(reply.status, 400)
        self.assertEqual(reply.json()["code"], "invalid_param")
        self.assertIn("Unsupported package manager 'cargo'", reply.json()["error"])

    @inlineCallbacks
    def test_missing_tools(self) -> Any:
        """No python3 or npm on PATH: an empty list, not an error."""
        for manager in ("pip", "npm"):
            reply = yield self.request("GET", f"/packages?manager={manager}")
            self.assertEqual(reply.status, 200, reply.body)
            self.assertEqual(
                reply.json(), {"manager": manager, "packages": [], "interpreter": None}
            )

    @inlineCallbacks
    def test_pip_listing(self) -> Any:
        """pip's JSON is reported as name/version pairs, sorted; pip is the default."""
        python = write_script(
            self.bin,
            "python3",
            """[ "$1 $2 $3 $4" = "-m pip list --format=json" ] || exit 3
echo '[{"name": "requests", "version": "2.32.0"}, {"name": "Attrs", "version": "24.1"}]'
""",
        )
        reply = yield self.request("GET", "/packages")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            reply.json(),
            {
                "manager": "pip",
                "packages": [
                    {"name": "Attrs", "version": "24.1"},
                    {"name": "requests", "version": "2.32.0"},
                ],
                "interpreter": python,
            },
        )

    @inlineCallbacks
    def test_python_without_pip(self) -> Any:
        """A python3 without pip is a missing tool: an empty list."""
        write_script(self.bin, "python3", "echo 'No module named pip' >&2; exit 1\n")
        reply = yield self.request("GET", "/packages?manager=pip")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["packages"], [])

    @inlineCallbacks
    def test_npm_listing(self) -> Any:
        """npm's global dependencies become name/version pairs."""
        write_script(
            self.bin,
            "npm",
            """[ "$*" = "ls -g --json --depth=0" ] || exit 3
echo '{"dependencies": {"typescript": {"version": "5.4.0"}, "npm": {"version": "10.2.0"}}}'
exit 1
""",
        )
        reply = yield self.request("GET", "/packages?manager=npm")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            reply.json()["packages"],
            [
                {"name": "npm", "version": "10.2.0"},
                {"name": "typescript", "version": "5.4.0"},
            ],
        )

    @inlineCallbacks
    def test_timeout(self) -> Any:
        """A tool slower than limits.timeout_seconds: 500 TimeoutError, child killed."""
        pidfile = os.path.join(self.bin, "pid")
        write_script(self.bin, "npm", f"echo $$ > {pidfile}\nexec /bin/sleep 30\n")
        reply = yield self.request("GET", "/packages?manager=npm")
        self.assertEqual(reply.status, 500, reply.body)
        body = reply.json()
        self.assertEqual(body["type"], "TimeoutError")
        self.assertEqual(body["rule"], "policy:endpoints.packages")
        with open(pidfile) as f:
            pid = int(f.read())
        for _ in range(50):
            if not _alive(pid):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(_alive(pid), f"the timed-out child {pid} is still running")

    @inlineCallbacks
    def test_garbage_output(self) -> Any:
        """Output that is not the tool's JSON is a 500 with the tool's complaint."""
        write_script(self.bin, "npm", "echo 'not json'; echo 'npm broke' >&2; exit 2\n")
        reply = yield self.request("GET", "/packages?manager=npm")
        self.assertEqual(reply.status, 500)
        self.assertIn("npm broke", reply.json()["error"])

    @inlineCallbacks
    def test_secrets_not_passed(self) -> Any:
        """The listing child gets no ABX_SERVER_* variables."""
        self.patch(
            environment,
            "BOOT_ENVIRON",
            {"PATH": self.bin, "ABX_SERVER_TOKEN": "boot-secret"},
        )
        write_script(
            self.bin,
            "npm",
            """printf '{"dependencies": {"seen": {"version": "%s"}}}' "$ABX_SERVER_TOKEN"\n""",
        )
        reply = yield self.request("GET", "/packages?manager=npm")
        self.assertEqual(reply.json()["packages"], [{"name": "seen", "version": ""}])


class PackagesOutputCapTests(DaemonTestCase):
    """``GET /packages`` past its output bound."""

    policy = {"endpoints": {"packages": {"limits": {"max_output_bytes": 1000}}}}

    def setUp(self) -> Any:
        self.bin = os.path.realpath(self.mktemp())
        os.makedirs(self.bin)
        self.patch(environment, "BOOT_ENVIRON", {"PATH": self.bin})
        return super().setUp()

    @inlineCallbacks
    def test_output_cap(self) -> Any:
        """A listing larger than max_output_bytes is refused, naming the limit."""
        write_script(
            self.bin,
            "python3",
            """printf '['; i=0; while [ $i -lt 500 ]; do
printf '{"name": "p%s", "version": "1"},' $i; i=$((i+1)); done
echo '{"name": "last", "version": "1"}]'
""",
        )
        reply = yield self.request("GET", "/packages?manager=pip")
        self.assertEqual(reply.status, 500, reply.body)
        self.assertEqual(reply.json()["limit"], "max_output_bytes")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie waiting for its reaper is not running.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
