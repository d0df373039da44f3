# -*- test-case-name: tests.client.test_errors -*-
"""
The daemon's refusals as the client's exceptions: the class named for
the SPEC §6 code, in its family, carrying status, code, rule and message.
"""

from __future__ import annotations

import os
import time
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.client import errors
from sandboxd.client.errors import (
    BY_CODE,
    EndpointDisabled,
    FileExists,
    InvalidParam,
    InvalidRequest,
    LimitExceeded,
    MissingScope,
    NotFound,
    NotFoundError,
    PathNotAllowed,
    PayloadTooLarge,
    PermissionDenied,
    PreconditionFailed,
    RateLimited,
    SandboxError,
    Timeout,
    Unauthorized,
    error_for,
)
from tests.client.base import ClientCase

ADMIN = "admin-token-for-client-tests"
READER = "reader-token-for-client-tests"

#: Every code of the SPEC §6 table.
SPEC_CODES = """
invalid_json invalid_param invalid_path duplicate_parameter
transfer_encoding_not_allowed ambiguous_credentials signal_not_allowed
malformed_request git_error unauthorized missing_scope path_not_allowed
path_denied read_only symlink_denied param_not_allowed origin_not_allowed
host_not_allowed protected_variable permission_denied not_found endpoint_disabled
turn_in_progress already_resolved withdrawn file_exists stdin_closed
output_not_captured timeout idle_timeout
unsupported precondition_failed payload_too_large rate_limited
concurrency_limited too_many_processes too_many_sessions internal agent_error
agent_timeout unavailable agent_unavailable insufficient_storage
""".split()


class MappingTests(SynchronousTestCase):
    """The code → class table, without a daemon."""

    def test_every_spec_code_has_a_class(self) -> None:
        """Each SPEC §6 code maps to its own class, named for it."""
        for code in SPEC_CODES:
            cls = BY_CODE.get(code)
            self.assertIsNotNone(cls, code)
            assert cls is not None
            self.assertEqual(cls.__name__.lower(), code.replace("_", ""))
            self.assertTrue(issubclass(cls, SandboxError))

    def test_families(self) -> None:
        """403 codes are PermissionDenied, 429 codes LimitExceeded, and so on."""
        for code in (
            "missing_scope",
            "path_not_allowed",
            "read_only",
            "protected_variable",
        ):
            self.assertTrue(issubclass(BY_CODE[code], PermissionDenied), code)
        for code in ("rate_limited", "concurrency_limited", "too_many_processes"):
            self.assertTrue(issubclass(BY_CODE[code], LimitExceeded), code)
        self.assertTrue(issubclass(EndpointDisabled, NotFoundError))
        self.assertTrue(issubclass(InvalidParam, InvalidRequest))

    def test_unknown_code_falls_back_to_status(self) -> None:
        """A code this client does not know is still caught by its family."""
        error = error_for(403, {"error": "new refusal", "code": "brand_new"})
        self.assertIs(type(error), PermissionDenied)
        self.assertEqual((error.code, error.status), ("brand_new", 403))
        self.assertIs(type(error_for(502, {"error": "x"})), errors.ServerError)

    def test_fields(self) -> None:
        """An error carries the body's rule, retry_after, scope and message."""
        error = error_for(
            429,
            {
                "error": "slow down",
                "code": "rate_limited",
                "retry_after": 3,
                "endpoint": "shell",
            },
        )
        assert isinstance(error, RateLimited)
        self.assertEqual(
            (error.retry_after, error.endpoint, error.message),
            (3.0, "shell", "slow down"),
        )
        self.assertIn("rate_limited", str(error))


class DaemonErrorTests(ClientCase):
    """Real refusals from a daemon with two tokens."""

    token = None
    policy = {
        "auth": {
            "tokens": [
                {"id": "admin", "token_env": "ADMIN_T", "scopes": ["*"]},
                {
                    "id": "reader",
                    "token_env": "READER_T",
                    "scopes": ["files:read", "core:read"],
                },
            ]
        },
        "endpoints": {"system_metrics": {"limits": {"rate_per_minute": 20}}},
    }
    environ = {"ADMIN_T": ADMIN, "READER_T": READER}

    def test_policy_refusals(self) -> Any:
        """
        Wrong token → Unauthorized (401); a missing scope → MissingScope with
        the scope; a path outside the boundary → PathNotAllowed with its
        rule; an opt-in group → EndpointDisabled with its rule; each is a
        PermissionDenied or NotFoundError as its status says.  The PTY
        port's handshake refusals map the same way, and an unknown session
        is NotFound.
        """

        def body() -> None:
            bad = self.sandbox(token="wrong")
            with self.assertRaises(Unauthorized) as cm:
                bad.files.list()
            self.assertEqual(
                (cm.exception.status, cm.exception.code), (401, "unauthorized")
            )

            reader = self.sandbox(token=READER)
            with self.assertRaises(MissingScope) as scope:
                reader.commands.run("true")
            self.assertEqual(scope.exception.status, 403)
            self.assertEqual(scope.exception.scope, "process:run")
            self.assertIsInstance(scope.exception, PermissionDenied)
            # The PTY port refuses the handshake with the same code.
            with self.assertRaises(MissingScope):
                reader.pty.attach("no-such-session")
            with self.assertRaises(Unauthorized):
                bad.pty.attach("no-such-session")

            admin = self.sandbox(token=ADMIN)
            with self.assertRaises(PathNotAllowed) as path:
                admin.files.read_text("/etc/passwd")
            self.assertEqual(path.exception.status, 403)
            self.assertTrue(path.exception.rule)
            with self.assertRaises(EndpointDisabled) as off:
                admin.code.run("print(1)")
            self.assertEqual(off.exception.rule, "default:opt-in:dev_tools")
            self.assertIsInstance(off.exception, NotFoundError)
            with self.assertRaises(NotFound):
                admin.pty.attach("no-such-session")  # closed 1008 "Unknown session"

        return self.in_thread(body)

    def test_state_and_input_errors(self) -> Any:
        """
        404 NotFound, 409 FileExists, 412 PreconditionFailed, 400
        InvalidParam and a command's Timeout (both /shell and the stream)
        are raised as such; nothing was written by a refused write.
        """

        def body() -> None:
            sb = self.sandbox(token=ADMIN)
            with self.assertRaises(NotFound):
                sb.commands.get(999_999)
            with self.assertRaises(NotFound):
                sb.files.read_bytes("missing.txt")
            first = sb.files.write_text("f.txt", "one")
            with self.assertRaises(FileExists):
                sb.files.write_text("f.txt", "two", overwrite=False)
            sb.files.write_text("f.txt", "three")
            with self.assertRaises(PreconditionFailed):
                sb.files.write_text("f.txt", "four", if_match=first["etag"])
            self.assertEqual(sb.files.read_text("f.txt"), "three")
            with self.assertRaises(InvalidParam):
                sb.files.list(depth=99)
            with self.assertRaises(Timeout) as cm:
                sb.commands.run(["sh", "-c", "echo before; sleep 20"], timeout=0.5)
            self.assertEqual(cm.exception.body.get("stdout"), "before\n")
            lines: list[str] = []
            with self.assertRaises(Timeout) as streamed:
                sb.commands.run(
                    ["sh", "-c", "echo before; sleep 20"],
                    timeout=0.5,
                    on_stdout=lines.append,
                )
            self.assertEqual(lines, ["before"])
            self.assertEqual(streamed.exception.body.get("stdout"), "before\n")

        return self.in_thread(body)

    def test_rate_limit(self) -> Any:
        """
        Past ``rate_per_minute`` the call raises RateLimited with
        ``retry_after``; a client made with ``wait_on_rate_limit`` waits
        that long and succeeds instead.
        """

        def body() -> None:
            sb = self.sandbox(token=ADMIN)
            with self.assertRaises(RateLimited) as cm:
                for _ in range(200):  # a bucket of 20, refilled one per 3 s
                    sb.system.metrics()
            self.assertEqual(cm.exception.status, 429)
            wait = cm.exception.retry_after
            assert wait is not None
            self.assertGreaterEqual(wait, 1)
            patient = self.sandbox(token=ADMIN, wait_on_rate_limit=True)
            started = time.monotonic()
            self.assertIn("memory_percent", patient.system.metrics())
            self.assertGreaterEqual(time.monotonic() - started, 0.5)

        return self.in_thread(body)

    def test_unreachable(self) -> Any:
        """A daemon that does not listen is ConnectionFailed, after the retries."""

        def body() -> None:
            from sandboxd.client import Sandbox
            from sandboxd.client.errors import ConnectionFailed

            with (
                Sandbox("http://127.0.0.1:9", retries=1, timeout=2) as sb,
                self.assertRaises(ConnectionFailed),
            ):
                sb.files.list()

        return self.in_thread(body)


class PayloadTests(ClientCase):
    """A body over the limit."""

    policy = {"endpoints": {"files_write_raw": {"limits": {"max_bytes": "1MB"}}}}

    def test_upload_over_the_limit(self) -> Any:
        """
        An upload over ``max_bytes`` is PayloadTooLarge (the daemon refuses it
        from Content-Length), not a retried connection error; nothing is
        written.
        """
        local = os.path.realpath(self.mktemp())
        os.makedirs(local)
        source = os.path.join(local, "big.bin")
        with open(source, "wb") as f:
            f.write(os.urandom(3_000_000))

        def body() -> None:
            sb = self.sandbox()
            with self.assertRaises(PayloadTooLarge) as cm:
                sb.files.upload(source, "big.bin")
            self.assertEqual(cm.exception.status, 413)
            self.assertFalse(os.path.exists(self.path("big.bin")))

        return self.in_thread(body)
