"""
The policy engine as a client meets it: scoped tokens, rate and concurrency
limits, discovery and audit, against a real daemon.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import deferLater

from sandboxd.commands import CommandRegistry
from sandboxd.endpoints import CapabilityGroup
from sandboxd.routes import builtin_table
from sandboxd.web.messages import ServerResponse
from tests.helpers import DaemonTestCase, free_port, someone_listens

READER = "reader-token"
ADMIN = "admin-token"
RUNNER = "runner-token"

POLICY = {
    "auth": {
        "tokens": [
            {
                "id": "reader",
                "token_env": "READER_TOKEN",
                "scopes": ["core:read", "files:read"],
            },
            {
                "id": "admin",
                "token_sha256": hashlib.sha256(ADMIN.encode()).hexdigest(),
                "scopes": ["*"],
            },
            {
                "id": "runner",
                "token_env": "RUNNER_TOKEN",
                "scopes": ["commands:run:hello"],
            },
        ]
    },
}
ENV = {"READER_TOKEN": READER, "RUNNER_TOKEN": RUNNER}


def registry() -> CommandRegistry:
    r = CommandRegistry()

    @r.command("hello", description="Say hello.")
    def hello(name: str = "World") -> str:
        return f"Hello, {name}!"

    @r.command("secret")
    def secret() -> str:
        return "s"

    return r


class ScopeTests(DaemonTestCase):
    """Two identities, different scopes (SPEC §4, §5)."""

    policy = POLICY
    environ = ENV
    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        return self.start(registry=registry())

    @inlineCallbacks
    def test_identity_in_capabilities(self) -> Any:
        """/capabilities names the caller and says what it may do."""
        reply = yield self.request("GET", "/capabilities", token=READER)
        body = reply.json()
        self.assertEqual(
            body["identity"], {"id": "reader", "scopes": ["core:read", "files:read"]}
        )
        self.assertFalse(body["endpoints"]["list_commands"]["allowed"])
        self.assertEqual(body["endpoints"]["list_commands"]["reason"], "missing_scope")
        self.assertTrue(body["endpoints"]["capabilities"]["allowed"])

    @inlineCallbacks
    def test_missing_scope(self) -> Any:
        """A call outside the identity's scopes is 403 missing_scope naming the scope."""
        reply = yield self.request("GET", "/commands", token=READER)
        self.assertEqual(reply.status, 403)
        body = reply.json()
        self.assertEqual(
            (body["code"], body["scope"], body["endpoint"]),
            ("missing_scope", "commands:list", "list_commands"),
        )

    @inlineCallbacks
    def test_sha256_token(self) -> Any:
        """A token given by its SHA-256 authenticates as its identity."""
        reply = yield self.request("POST", "/commands/secret", {}, token=ADMIN)
        self.assertEqual((reply.status, reply.json()), (200, {"result": "s"}))

    @inlineCallbacks
    def test_command_scope_admits_one_command(self) -> Any:
        """commands:run:hello runs hello and nothing else."""
        reply = yield self.request(
            "POST", "/commands/hello", {"name": "Qoder"}, token=RUNNER
        )
        self.assertEqual(reply.json(), {"result": "Hello, Qoder!"})
        reply = yield self.request("POST", "/commands/secret", {}, token=RUNNER)
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "missing_scope")

    @inlineCallbacks
    def test_check_endpoint(self) -> Any:
        """/capabilities/check decides scopes and paths without touching the disk."""
        reply = yield self.request(
            "POST",
            "/capabilities/check",
            {"endpoint": "files_delete", "path": "x"},
            token=READER,
        )
        body = reply.json()
        self.assertFalse(body["allowed"])
        reply = yield self.request(
            "POST",
            "/capabilities/check",
            {"endpoint": "download", "paths": ["/etc/passwd", "/etc/nonexistent-xyz"]},
            token=ADMIN,
        )
        paths = reply.json()["paths"]
        self.assertEqual(
            [p["code"] for p in paths], ["path_not_allowed", "path_not_allowed"]
        )


class RateLimitTests(DaemonTestCase):
    """rate_per_minute per identity and endpoint (SPEC §5.5)."""

    policy = {"endpoints": {"capabilities": {"limits": {"rate_per_minute": 2}}}}

    @inlineCallbacks
    def test_rate_limited(self) -> Any:
        """The third call in a minute is 429 with retry_after and Retry-After."""
        for _ in range(2):
            reply = yield self.request("GET", "/capabilities")
            self.assertEqual(reply.status, 200)
        reply = yield self.request("GET", "/capabilities")
        self.assertEqual(reply.status, 429)
        body = reply.json()
        self.assertEqual(body["code"], "rate_limited")
        self.assertGreaterEqual(body["retry_after"], 1)
        self.assertEqual(reply.header("retry-after"), str(body["retry_after"]))
        self.assertEqual(body["rule"], "policy:endpoints.capabilities")
        other = yield self.request("GET", "/openapi.json")
        self.assertEqual(other.status, 200)


class ConcurrencyTests(DaemonTestCase):
    """max_concurrency counts requests in flight; a slot frees when a request ends."""

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        self.gate: Deferred[None] = Deferred()
        table = builtin_table()

        @table.route("GET", "/slow", group=CapabilityGroup.COMMANDS, name="slow")
        def slow(request: Any) -> Any:
            return self.gate.addCallback(lambda _: {"ok": True})

        return self.start(
            table=table,
            policy={"endpoints": {"slow": {"limits": {"max_concurrency": 1}}}},
        )

    @inlineCallbacks
    def test_concurrency_limited(self) -> Any:
        """A second call while one is in flight is 429 concurrency_limited; later ones pass."""
        first = self.request("GET", "/slow")
        yield deferLater(reactor, 0.1, lambda: None)
        second = yield self.request("GET", "/slow")
        self.assertEqual(second.status, 429)
        self.assertEqual(second.json()["code"], "concurrency_limited")
        self.gate.callback(None)
        reply = yield first
        self.assertEqual(reply.status, 200)
        self.gate = Deferred()
        self.gate.callback(None)
        third = yield self.request("GET", "/slow")
        self.assertEqual(third.status, 200)


class AuditTests(DaemonTestCase):
    """One JSON line per recorded request, never a token (SPEC §11.5)."""

    token = "audit-secret"
    policy = {"defaults": {"audit": "all"}}
    audit = True

    @inlineCallbacks
    def test_records(self) -> Any:
        """
        Allowed and refused requests are recorded with identity, status,
        the seed's decision, code and rule.
        """
        yield self.request("GET", "/capabilities?token=abc&x=1")
        yield self.request("GET", "/capabilities", token="wrong")
        yield self.request("GET", "/browser/console")
        lines = self.audit_lines()
        self.assertEqual([r["status"] for r in lines], [200, 401, 404])
        self.assertEqual([r["decision"] for r in lines], ["allow", "deny", "deny"])
        self.assertEqual(lines[0]["identity"], "legacy")
        self.assertEqual(lines[0]["endpoint"], "capabilities")
        self.assertEqual(lines[0]["query"], "token=%2A%2A%2A&x=1")
        self.assertEqual(lines[1]["code"], "unauthorized")
        self.assertEqual(lines[2]["code"], "endpoint_disabled")
        self.assertIn(
            lines[2]["rule"], ("default:opt-in:browser", "code:not-implemented")
        )
        with open(self.audit_path) as f:
            text = f.read()
        self.assertNotIn("audit-secret", text)
        self.assertNotIn("wrong", text)
        self.assertNotIn("abc", text)


class CheckParamsTests(DaemonTestCase):
    """/capabilities/check decides parameter rules too."""

    policy = {"endpoints": {"shell": {"params": {"deny_commands": ["rm"]}}}}

    @inlineCallbacks
    def test_command_refused(self) -> Any:
        """A denied command is refused with its rule, an allowed one is not."""
        reply = yield self.request(
            "POST",
            "/capabilities/check",
            {"endpoint": "shell", "params": {"command": "rm -rf x"}},
        )
        body = reply.json()
        if body.get("code") == "endpoint_disabled":
            self.skipTest("shell is not built yet")
        self.assertEqual(
            (body["allowed"], body["code"], body["rule"]),
            (False, "command_not_allowed", "policy:endpoints.shell"),
        )
        reply = yield self.request(
            "POST",
            "/capabilities/check",
            {"endpoint": "shell", "params": {"command": "ls"}},
        )
        self.assertTrue(reply.json()["allowed"])

    @inlineCallbacks
    def test_signal_refused(self) -> Any:
        """A signal outside allowed_signals is signal_not_allowed."""
        reply = yield self.request(
            "POST",
            "/capabilities/check",
            {"endpoint": "process_signal", "params": {"signal": 1}},
        )
        body = reply.json()
        if body.get("code") == "endpoint_disabled":
            self.skipTest("process_signal is not built yet")
        self.assertEqual(body["code"], "signal_not_allowed")


class CheckAgreesWithTheCallTests(DaemonTestCase):
    """
    ``/capabilities/check``'s answer about a call's params is the call's
    own: allowed when the call goes through, else the call's code and rule,
    naming the param that was refused.
    """

    policy = {
        "groups": {"dev_tools": True},
        "endpoints": {
            "shell": {"params": {"deny_commands": ["rm"]}},
            "code_run": {"params": {"languages": ["python"]}},
            "process_signal": {"params": {"allowed_signals": [9, 15]}},
        },
    }

    @inlineCallbacks
    def agree(
        self, endpoint: str, method: str, path: str, params: dict[str, Any]
    ) -> Any:
        """Ask check about ``params``, then make the call; the check's answer."""
        reply = yield self.request(
            "POST", "/capabilities/check", {"endpoint": endpoint, "params": params}
        )
        self.assertEqual(reply.status, 200, reply.body)
        check = reply.json()
        real = yield self.request(method, path, params)
        self.assertEqual(check["allowed"], real.status < 300, (params, real.body))
        if not check["allowed"]:
            answer = real.json()
            self.assertEqual(
                (check["code"], check["rule"]),
                (answer["code"], answer.get("rule")),
                params,
            )
        elif endpoint == "pty_create_session":
            session = real.json()["session_id"]
            yield self.request("DELETE", f"/pty/sessions/{session}")
        return check

    @inlineCallbacks
    def test_terminal_shell(self) -> Any:
        """A terminal's shell is decided alone: a refused one, by name or path, is refused."""
        for shell in ("python3", "/usr/bin/python3"):
            check = yield self.agree(
                "pty_create_session", "POST", "/pty/sessions", {"shell": shell}
            )
            self.assertEqual(
                (check["code"], check["param"]), ("param_not_allowed", "shell")
            )
        check = yield self.agree(
            "pty_create_session", "POST", "/pty/sessions", {"shell": "sh"}
        )
        self.assertTrue(check["allowed"])

    @inlineCallbacks
    def test_command_and_shell(self) -> Any:
        """With a command, a refused shell is named as ``shell``, a refused command as ``command``."""
        check = yield self.agree(
            "shell", "POST", "/shell", {"command": "print(1)", "shell": "python3"}
        )
        self.assertEqual(check["param"], "shell")
        check = yield self.agree(
            "shell", "POST", "/shell", {"command": "rm -rf x", "shell": "sh"}
        )
        self.assertEqual(
            (check["code"], check["param"]), ("command_not_allowed", "command")
        )
        check = yield self.agree(
            "shell", "POST", "/shell", {"command": "true", "shell": "sh"}
        )
        self.assertTrue(check["allowed"])

    @inlineCallbacks
    def test_language(self) -> Any:
        """A language is named in any case; one the policy leaves out, or none known, is refused."""
        check = yield self.agree(
            "code_run", "POST", "/code/run", {"language": "Python", "code": "1"}
        )
        self.assertTrue(check["allowed"])
        check = yield self.agree(
            "code_run", "POST", "/code/run", {"language": "node", "code": "1"}
        )
        self.assertEqual(check["param"], "language")
        check = yield self.agree(
            "code_run", "POST", "/code/run", {"language": "cobol", "code": "1"}
        )
        self.assertEqual(check["code"], "invalid_param")

    @inlineCallbacks
    def test_signal_by_name(self) -> Any:
        """A signal is decided by name as by number, as the call reads it."""
        started = yield self.request("POST", "/process/start", {"command": "sleep 30"})
        self.assertEqual(started.status, 200, started.body)
        pid = started.json()["pid"]
        path = f"/process/{pid}/signal"
        check = yield self.agree("process_signal", "POST", path, {"signal": "INT"})
        self.assertEqual(check["param"], "signal")
        check = yield self.agree("process_signal", "POST", path, {"signal": "SIGTERM"})
        self.assertTrue(check["allowed"])


_EXTENSION_RULE = {
    "paths": {"deny": ["**/*.key"]},
    "params": {"deny_extensions": [".sh"], "allow_extensions": [".txt", ".key"]},
}


class MoveExtractExtensionTests(DaemonTestCase):
    """
    A move or an archive's member gives a file a name the extension rules
    refuse no more than a write does: renaming ``x.txt`` to ``x.sh`` under
    ``deny_extensions: [".sh"]`` was a way round the rule.
    """

    policy = {
        "endpoints": {
            "group:file_ops": {"params": {"deny_extensions": [".sh"]}},
        }
    }

    @inlineCallbacks
    def test_move_to_a_denied_name(self) -> Any:
        """Refused, saying so; the file keeps its name; a directory may move."""
        with open(os.path.join(self.base_dir, "x.txt"), "w") as f:
            f.write("echo hi\n")
        os.mkdir(os.path.join(self.base_dir, "d"))
        reply = yield self.request(
            "POST", "/files/move", {"source": "x.txt", "destination": "x.sh"}
        )
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "extension_not_allowed")
        )
        self.assertTrue(reply.json()["error"].startswith("destination: "))
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "x.txt")))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "x.sh")))
        check = yield self.request(
            "POST",
            "/capabilities/check",
            {"endpoint": "files_move", "path": "x.sh"},
        )
        self.assertEqual(check.json()["code"], "extension_not_allowed")
        moved = yield self.request(
            "POST", "/files/move", {"source": "d", "destination": "e.sh"}
        )
        self.assertEqual(moved.status, 200, moved.body)

    @inlineCallbacks
    def test_archive_with_a_denied_member(self) -> Any:
        """The whole archive is refused, nothing unpacked."""
        import base64
        import io
        import tarfile

        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for name in ("ok.txt", "run.sh"):
                info = tarfile.TarInfo(name)
                info.size = 2
                tar.addfile(info, io.BytesIO(b"hi"))
        reply = yield self.request(
            "POST",
            "/files/extract",
            {
                "destination": "out",
                "content_base64": base64.b64encode(buffer.getvalue()).decode(),
            },
        )
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "extension_not_allowed")
        )
        self.assertIn("run.sh", reply.json()["error"])
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "out")))


class CheckExtensionTests(DaemonTestCase):
    """
    ``/capabilities/check`` decides ``allow_extensions`` and
    ``deny_extensions`` as the write calls do, after the path decision.
    """

    policy = {
        "endpoints": {
            "files_write_raw": _EXTENSION_RULE,
            "upload": _EXTENSION_RULE,
            "files_uploads_create": _EXTENSION_RULE,
        }
    }

    def call(self, endpoint: str, path: str) -> Any:
        """The real call of ``endpoint`` writing ``path``."""
        if endpoint == "files_write_raw":
            return self.request("POST", f"/files/raw?path={path}", raw_body=b"data")
        if endpoint == "upload":
            return self.request(
                "POST", "/upload", {"path": path, "content_base64": "ZGF0YQ=="}
            )
        return self.request("POST", "/files/uploads", {"path": path, "size": 4})

    @inlineCallbacks
    def test_check_agrees_with_the_call(self) -> Any:
        """
        A name the deny list or the allow list refuses is
        ``extension_not_allowed`` with the call's rule (was: check said
        allowed); a path both a path rule and an extension rule refuse is
        the path's refusal in the check and in every call (was:
        ``path_denied`` in the check, ``extension_not_allowed`` in the
        raw write); nothing is written when refused.
        """
        expected = {
            "x.sh": "extension_not_allowed",
            "new.py": "extension_not_allowed",
            "a.key": "path_denied",
            "ok.txt": None,
        }
        for endpoint in ("files_write_raw", "upload", "files_uploads_create"):
            for path, code in expected.items():
                reply = yield self.request(
                    "POST",
                    "/capabilities/check",
                    {"endpoint": endpoint, "path": path},
                )
                check = reply.json()
                real = yield self.call(endpoint, path)
                where = (endpoint, path, real.body)
                self.assertEqual(check["allowed"], code is None, where)
                self.assertEqual(real.status < 300, code is None, where)
                if code is None:
                    continue
                self.assertEqual(
                    (check["code"], check["rule"]),
                    (code, real.json()["rule"]),
                    where,
                )
                self.assertEqual(real.json()["code"], code, where)
                self.assertFalse(
                    os.path.exists(os.path.join(self.base_dir, path)), where
                )


class OpenAPITests(DaemonTestCase):
    """``GET /openapi.json`` is made once per policy in force."""

    policy = {"endpoints": {"files_stat": {"enabled": True}}}

    @inlineCallbacks
    def test_follows_a_reload(self) -> Any:
        """
        The same bytes on every call until a reload changes the policy;
        then the document says what the new policy says.
        """
        first = yield self.request("GET", "/openapi.json")
        again = yield self.request("GET", "/openapi.json")
        self.assertEqual(again.body, first.body)
        operation = first.json()["paths"]["/files/stat"]["get"]
        self.assertTrue(operation["x-sandboxd-enabled"])
        service = self.daemon.daemon
        service.settings.policy["endpoints"]["files_stat"] = {"enabled": False}
        self.assertTrue(service.reload())
        after = yield self.request("GET", "/openapi.json")
        operation = after.json()["paths"]["/files/stat"]["get"]
        self.assertFalse(operation["x-sandboxd-enabled"])
        self.assertEqual(after.header("content-type"), "application/json")


class CredentialFreeRouteTests(DaemonTestCase):
    """
    A custom route registered with ``auth_required=False`` is gated by the
    policy like any other: scopes the policy names for it are asked for,
    and discovery says what the call will do.
    """

    policy = {
        **POLICY,
        "endpoints": {
            "open_route": {"scopes": ["myapp:admin"]},
        },
    }
    environ = ENV
    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        table = builtin_table()

        @table.route(
            "POST",
            "/open/delete-everything",
            group=CapabilityGroup.COMMANDS,
            name="open_route",
            auth_required=False,
        )
        def open_route(request: Any) -> ServerResponse:
            return ServerResponse.ok({"ran": True, "identity": request.identity.id})

        @table.route("GET", "/open/status", name="status", auth_required=False)
        def status(request: Any) -> ServerResponse:
            return ServerResponse.ok({"identity": request.identity.id})

        return self.start(table=table)

    @inlineCallbacks
    def test_policy_scopes_asked_for(self) -> Any:
        """No credential is 401, a token without the scope 403; the scope's holder runs it."""
        reply = yield self.request("POST", "/open/delete-everything", {}, token=None)
        self.assertEqual((reply.status, reply.json()["code"]), (401, "unauthorized"))
        reply = yield self.request("POST", "/open/delete-everything", {}, token=READER)
        self.assertEqual(
            (reply.status, reply.json()["code"], reply.json()["scope"]),
            (403, "missing_scope", "myapp:admin"),
        )
        reply = yield self.request("POST", "/open/delete-everything", {}, token=ADMIN)
        self.assertEqual(
            (reply.status, reply.json()), (200, {"ran": True, "identity": "admin"})
        )

    @inlineCallbacks
    def test_discovery_tells_the_truth(self) -> Any:
        """/capabilities and capabilities/check refuse whom the call refuses."""
        caps = yield self.request("GET", "/capabilities", token=READER)
        entry = caps.json()["endpoints"]["open_route"]
        self.assertEqual(
            (entry["allowed"], entry["reason"], entry["scopes"]),
            (False, "missing_scope", ["myapp:admin"]),
        )
        check = yield self.request(
            "POST", "/capabilities/check", {"endpoint": "open_route"}, token=READER
        )
        self.assertEqual(
            (check.json()["allowed"], check.json()["code"]), (False, "missing_scope")
        )
        spec = yield self.request("GET", "/openapi.json", token=ADMIN)
        operation = spec.json()["paths"]["/open/delete-everything"]["post"]
        self.assertNotEqual(operation["security"], [])

    @inlineCallbacks
    def test_route_without_scopes_stays_open(self) -> Any:
        """
        With no scopes from the policy, the route answers anyone, claims no
        scope in discovery, and the policy's warnings say so.
        """
        reply = yield self.request("GET", "/open/status", token=None)
        self.assertEqual((reply.status, reply.json()), (200, {"identity": "anonymous"}))
        caps = yield self.request("GET", "/capabilities", token=READER)
        entry = caps.json()["endpoints"]["status"]
        self.assertEqual((entry["allowed"], entry["scopes"]), (True, []))
        self.assertTrue(
            any(
                "'status' requires no scope: anyone who can reach the port" in w
                for w in self.daemon.context.policy.warnings
            )
        )


class NonFiniteReloadTests(DaemonTestCase):
    """A reload refuses a policy whose numbers are not finite; the old one stays."""

    autostart = False

    @inlineCallbacks
    def test_nan_refused_on_reload(self) -> Any:
        """NaN in the file on reload is refused; discovery keeps answering."""
        import os

        path = os.path.join(self.base_dir, "policy.json")
        with open(path, "w") as f:
            f.write('{"revision": "r1"}')
        yield self.start(policy=None, policy_file=path)
        with open(path, "w") as f:
            f.write(
                '{"revision": "r2", "endpoints": {"shell":'
                ' {"limits": {"timeout_seconds": NaN}}}}'
            )
        self.assertFalse(self.daemon.daemon.reload())
        caps = yield self.request("GET", "/capabilities")
        self.assertEqual(caps.status, 200)
        self.assertEqual(caps.json()["policy"]["revision"], "r1")


class ExposingReloadTests(DaemonTestCase):
    """
    A reload meets the start's rule: no listener reachable from outside
    without a token.  One that would open one is refused; the old policy
    stays, and nothing listens.
    """

    autostart = False

    @inlineCallbacks
    def test_token_removed_with_an_outside_listener(self) -> Any:
        """
        A reload that drops the last token and turns on the E2B door, whose
        port listens on every interface, is refused: the token still works,
        the port never opens.
        """
        token = {"id": "admin", "token_env": "ADMIN", "scopes": ["*"]}
        port = free_port()
        yield self.start_on_policy_file(
            {
                "auth": {"tokens": [token]},
                "defaults": {"params": {"default_user": "root"}},
            },
            environ={"ADMIN": "admin-secret"},
            e2b_port=f"tcp:{port}:interface=0.0.0.0",
        )
        self.write_policy_file({"groups": {"e2b": True}})
        self.assertFalse(self.daemon.daemon.reload())
        reply = yield self.request("GET", "/system/info", token="admin-secret")
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request("GET", "/system/info")
        self.assertEqual(reply.status, 401, reply.body)
        self.assertFalse(someone_listens(port))
