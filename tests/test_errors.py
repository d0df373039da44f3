"""
Errors as a small family (``sandboxd.errors``): the codes are exactly SPEC
§6's, each constructor gives its documented status, type, code and rule, and
error bodies are built in one place (``ApiError.body``), never by hand.
"""

from __future__ import annotations

import ast
import errno
import json
import os
from types import SimpleNamespace
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd import errors
from sandboxd.errors import ApiError, Code
from sandboxd.processes.child import timeout_error
from sandboxd.web.messages import ServerResponse

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "sandboxd")

#: SPEC §6 ("Error codes"), row by row, by status.  Hard-coded: the SPEC is
#: not shipped with the package, and a change to §6 should be a change here.
SPEC_6 = {
    400: (
        "invalid_json",
        "invalid_param",
        "invalid_path",
        "duplicate_parameter",
        "transfer_encoding_not_allowed",
        "ambiguous_credentials",
        "signal_not_allowed",
        "malformed_request",
        "git_error",
        "agents.websocket_upgrade_required",
        "agents.websocket_handshake_invalid",
    ),
    401: ("unauthorized", "link_invalid", "link_expired"),
    403: (
        "missing_scope",
        "path_not_allowed",
        "path_denied",
        "read_only",
        "symlink_denied",
        "param_not_allowed",
        "origin_not_allowed",
        "host_not_allowed",
        "protected_variable",
        "port_not_allowed",
        "permission_denied",
    ),
    404: (
        "not_found",
        "endpoint_disabled",
        "port_not_exposed",
        "agents.not_implemented_locally",
    ),
    421: ("misdirected_request",),
    409: (
        "turn_in_progress",
        "already_resolved",
        "withdrawn",
        "file_exists",
        "stdin_closed",
        "output_not_captured",
        "context_busy",
        "context_dead",
        "idempotency.mismatch",
    ),
    408: ("timeout", "idle_timeout"),
    501: ("unsupported",),
    412: ("precondition_failed",),
    413: ("payload_too_large",),
    429: (
        "rate_limited",
        "concurrency_limited",
        "too_many_processes",
        "too_many_sessions",
        "too_many_contexts",
        "too_many_executions",
    ),
    500: ("internal",),
    502: ("agent_error", "upstream_unavailable"),
    504: ("agent_timeout", "upstream_timeout"),
    503: ("unavailable", "agent_unavailable"),
    507: ("insufficient_storage",),
}

#: The seed's own codes that SPEC §6 takes where §21 makes a seed
#: behaviour ours, merged into the check.
SPEC_6_SEED = {
    403: (
        "command_not_allowed",
        "language_not_allowed",
        "extension_not_allowed",
        # a terminal's shell the policy's own ``shells`` leave out
        "shell_not_allowed",
    ),
}

#: The codes git adds (SPEC §24): its own rows, merged into the check.
SPEC_6_GIT = {
    403: ("url_not_allowed", "protected_branch"),
    409: ("git_conflict",),
    429: ("too_many_jobs",),
    502: ("remote_error",),
}

#: The one place on the browser worker's side of its pipe (which cannot
#: import sandboxd) that spells an error's fields.
WORKER_FIELDS = (os.path.join("browser", "urlpolicy.py"), "error_fields")

#: Where a dict with ``error`` and ``type`` keys may be written out: the one
#: builder, the worker's, and the OpenAPI schema *of* an error body.
BODY_BUILDERS = {
    ("errors.py", "body"),
    WORKER_FIELDS,
    (os.path.join("api", "openapi.py"), ""),
    # The Responses WebSocket's events that carry an error (an event's
    # ``type`` beside its ``error``, not an error body).
    (os.path.join("openai_api", "envelope.py"), "socket_event"),
    # The ``error`` event that ends a /v1 stream: OpenAI's event, whose
    # ``type`` is the event's, its error object built by openai_error.
    (os.path.join("openai_api", "envelope.py"), "stream_error"),
}

#: Where ``ApiError(...)`` may be called directly: the family itself, and
#: ``ServerResponse.error`` (SPEC §10: an extension's handler names its own
#: status and type).
DIRECT_CALLS_ALLOWED = {"errors.py", os.path.join("web", "messages.py")}


class _Rule:
    """An effective rule that set only the leaves it is given."""

    def __init__(self, **sources: str) -> None:
        self.sources = sources

    def source(self, leaf: str) -> str | None:
        return self.sources.get(leaf)


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    out.append((os.path.relpath(path, PACKAGE), ast.parse(f.read())))
    return out


def _enclosing_functions(tree: ast.Module) -> dict[ast.AST, str]:
    """Each node's innermost enclosing function name."""
    owner: dict[ast.AST, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = (
                child.name
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                else name
            )
            owner[child] = inner
            visit(child, inner)

    visit(tree, "")
    return owner


def hand_built_bodies(modules: list[tuple[str, ast.Module]]) -> list[str]:
    """Where a dict with ``error`` and ``type`` keys is spelled out."""
    found = []
    for path, tree in modules:
        owner = _enclosing_functions(tree)
        for node in ast.walk(tree):
            keys: set[Any] = set()
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "dict"
            ):
                keys = {k.arg for k in node.keywords}
            if not {"error", "type"} <= keys:
                continue
            if (path, owner.get(node, "")) in BODY_BUILDERS:
                continue
            found.append(f"{path}:{node.lineno}")
    return found


class CodeTests(SynchronousTestCase):
    """:class:`Code` against SPEC §6."""

    def test_code_is_spec_6(self) -> None:
        """Code holds exactly the codes of SPEC §6, no more and no fewer."""
        rows = [*SPEC_6.values(), *SPEC_6_SEED.values(), *SPEC_6_GIT.values()]
        spec = sorted(c for row in rows for c in row)
        self.assertEqual(sorted(c.value for c in Code), spec)

    def test_unknown_code_is_a_bug(self) -> None:
        """An ApiError with a code SPEC §6 does not list raises ValueError."""
        self.assertRaises(ValueError, ApiError, 400, "x", "ValueError", "no_such_code")

    def test_code_is_a_string_on_the_wire(self) -> None:
        """A Code serialises as its plain value."""
        body = errors.bad_request("x").body()
        self.assertEqual(json.loads(json.dumps(body))["code"], "invalid_param")


class ConstructorTests(SynchronousTestCase):
    """Each constructor gives the status, type, code and fields it documents."""

    def check(
        self,
        error: ApiError,
        status: int,
        type: str,
        code: str | None,
        **extra: Any,
    ) -> None:
        self.assertEqual(
            (error.status, error.type, error.code), (status, type, code), error
        )
        if code is not None and status in SPEC_6:
            self.assertIn(code, SPEC_6[status], "a code of another status row")
        for key, value in extra.items():
            self.assertEqual(error.extra.get(key), value, key)

    def test_4xx(self) -> None:
        """The 400s, 401, 403s, 404s, 408s, 409s, 412, 413 and 416."""
        rule = _Rule(**{"params.allowed_signals": "preset:x"})
        cases: list[tuple[ApiError, int, str, str | None, dict[str, Any]]] = [
            (errors.bad_request("m"), 400, "ValueError", "invalid_param", {}),
            (
                errors.bad_request("m", Code.DUPLICATE_PARAMETER, param="a"),
                400,
                "ValueError",
                "duplicate_parameter",
                {"param": "a"},
            ),
            (errors.invalid_json(), 400, "ValueError", "invalid_json", {}),
            (errors.invalid_path("m"), 400, "ValueError", "invalid_path", {}),
            (
                errors.malformed_request("m"),
                400,
                "ValueError",
                "malformed_request",
                {},
            ),
            (
                errors.is_a_directory("/d"),
                400,
                "IsADirectoryError",
                "invalid_param",
                {},
            ),
            (
                errors.not_a_directory("/f"),
                400,
                "NotADirectoryError",
                "invalid_param",
                {},
            ),
            (
                errors.signal_not_allowed(
                    "m", errors.policy_rule(rule, "params.allowed_signals")
                ),
                400,
                "ValueError",
                "signal_not_allowed",
                {"rule": "preset:x"},
            ),
            (errors.git_error("m"), 400, "GitError", "git_error", {}),
            (errors.unauthorized(), 401, "AuthError", "unauthorized", {}),
            (
                errors.ambiguous_credentials(),
                400,
                "AuthError",
                "ambiguous_credentials",
                {},
            ),
            (
                errors.forbidden("m", Code.READ_ONLY, rule="r"),
                403,
                "PermissionError",
                "read_only",
                {"rule": "r"},
            ),
            (
                errors.permission_denied("/p"),
                403,
                "PermissionError",
                "permission_denied",
                {},
            ),
            (
                errors.missing_scope("e", "s", "r"),
                403,
                "PermissionError",
                "missing_scope",
                {"endpoint": "e", "scope": "s", "rule": "r"},
            ),
            (errors.not_found("m"), 404, "NotFoundError", "not_found", {}),
            (errors.no_route("/x"), 404, "ValueError", "not_found", {}),
            (
                errors.file_not_found("/x"),
                404,
                "FileNotFoundError",
                "not_found",
                {},
            ),
            (
                errors.endpoint_disabled("e", "r", "is off"),
                404,
                "ValueError",
                "endpoint_disabled",
                {"endpoint": "e", "rule": "r"},
            ),
            (errors.timed_out("m"), 408, "TimeoutError", "timeout", {}),
            (
                errors.timed_out("m", idle=True),
                408,
                "TimeoutError",
                "idle_timeout",
                {},
            ),
            (
                errors.conflict("m", Code.WITHDRAWN, request_id="r1"),
                409,
                "RuntimeError",
                "withdrawn",
                {"request_id": "r1"},
            ),
            (errors.file_exists("m"), 409, "FileExistsError", "file_exists", {}),
            (
                errors.precondition_failed("/p"),
                412,
                "ValueError",
                "precondition_failed",
                {},
            ),
            (
                errors.payload_too_large(10),
                413,
                "ValueError",
                "payload_too_large",
                {"limit": 10},
            ),
            (errors.range_not_satisfiable(5), 416, "ValueError", "invalid_param", {}),
        ]
        for error, status, type, code, extra in cases:
            self.check(error, status, type, code, **extra)

    def test_5xx(self) -> None:
        """The 500, 501, 502, 503s, 504 and 507."""
        cases: list[tuple[ApiError, int, str, str]] = [
            (errors.internal("m"), 500, "RuntimeError", "internal"),
            (errors.internal("m", "OSError"), 500, "OSError", "internal"),
            (errors.unexpected(KeyError("k")), 500, "KeyError", "internal"),
            (errors.unsupported("m"), 501, "ValueError", "unsupported"),
            (errors.agent_error("m"), 502, "RuntimeError", "agent_error"),
            (errors.unavailable("m"), 503, "RuntimeError", "unavailable"),
            (errors.agent_unavailable("m"), 503, "RuntimeError", "agent_unavailable"),
            (errors.agent_timeout("m"), 504, "TimeoutError", "agent_timeout"),
            (errors.insufficient_storage(), 507, "OSError", "insufficient_storage"),
        ]
        for error, status, type, code in cases:
            self.check(error, status, type, code)

    def test_out_of_resources(self) -> None:
        """
        A call refused because the sandbox is out of descriptors, processes
        or memory is 503 ``unavailable`` of type ResourceError, with the
        kernel's words and a Retry-After, wherever the errno was met: the
        guard's file operations, a process, a terminal.
        """
        from sandboxd.access.guard import os_error

        emfile = OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        for error in (
            errors.out_of_resources(emfile, "cannot start a process now"),
            os_error(emfile, "/home/user/a.txt"),
            os_error(OSError(errno.ENFILE, "x"), "/home/user/a.txt"),
        ):
            self.check(error, 503, "ResourceError", "unavailable")
            self.assertEqual(
                error.headers, {"Retry-After": str(errors.RESOURCE_RETRY_SECONDS)}
            )
        self.assertEqual(
            errors.out_of_resources(emfile, "cannot start a process now").message,
            "cannot start a process now: Too many open files",
        )

    def test_unexpected_out_of_resources(self) -> None:
        """
        An OSError of a fork or an open the sandbox had no room for, which
        no handler expected, is that 503 too; any other is the 500.
        """
        eagain = BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        self.check(errors.unexpected(eagain), 503, "ResourceError", "unavailable")
        self.assertIsNotNone(errors.exhausted(eagain))
        self.check(
            errors.unexpected(OSError(errno.EIO, "x")), 500, "OSError", "internal"
        )
        self.assertIsNone(errors.exhausted(OSError(errno.EIO, "x")))
        self.assertIsNone(errors.exhausted(ValueError("x")))

    def test_unexpected_full_disk(self) -> None:
        """
        An OSError of a write the disk (or the quota) had no room for, which
        no handler expected, is the 507 every write path answers itself.
        """
        for number in (errno.ENOSPC, errno.EDQUOT):
            error = errors.unexpected(OSError(number, os.strerror(number)))
            self.check(error, 507, "OSError", "insufficient_storage")
            self.assertIn(os.strerror(number), error.message)

    def test_limit_refusals(self) -> None:
        """
        A limit refusal names the policy rule that set the limit, or
        ``default:limits.KEY`` for the built-in one; a rate refusal carries
        ``Retry-After`` as a header and ``retry_after`` as a field.
        """
        set_by = _Rule(**{"limits.max_processes": "preset:small"})
        self.assertEqual(errors.limit_rule(set_by, "max_processes"), "preset:small")
        self.assertEqual(
            errors.limit_rule(_Rule(), "max_processes"), "default:limits.max_processes"
        )
        self.assertEqual(
            errors.policy_rule(_Rule(), "params.shells"), "default:params.shells"
        )
        error = errors.limit_exceeded(
            429,
            "too many",
            Code.TOO_MANY_PROCESSES,
            errors.limit_rule(_Rule(), "max_processes"),
            limit="max_processes",
        )
        self.check(
            error,
            429,
            "ResourceError",
            "too_many_processes",
            rule="default:limits.max_processes",
            limit="max_processes",
        )
        rated = errors.rate_limited("slow down", 3, limit=60)
        self.check(rated, 429, "ResourceError", "rate_limited", retry_after=3)
        self.assertEqual(rated.headers, {"Retry-After": "3"})

    def test_child_timeout_error(self) -> None:
        """
        A child ended on its timeout gives an ApiError (``timeout`` or
        ``idle_timeout``, type TimeoutError) whose body is the event log's
        ``error`` event; a child that ended otherwise gives None.
        """
        hard = timeout_error(
            SimpleNamespace(reason="timeout", timeout=2.0, idle_timeout=None)  # type: ignore[arg-type]
        )
        assert hard is not None
        self.assertEqual(
            hard.body(),
            {
                "error": "Command timed out after 2 seconds; its process group was killed",
                "type": "TimeoutError",
                "code": "timeout",
            },
        )
        idle = timeout_error(
            SimpleNamespace(reason="idle_timeout", timeout=None, idle_timeout=1.5)  # type: ignore[arg-type]
        )
        assert idle is not None
        self.assertEqual((idle.status, idle.code), (408, "idle_timeout"))
        self.assertIn("IdleTimeout: no output for 1.5 seconds", idle.message)
        self.assertIsNone(timeout_error(SimpleNamespace(reason="exit")))  # type: ignore[arg-type]


class BodyTests(SynchronousTestCase):
    """The wire forms of an error, all derived from :meth:`ApiError.body`."""

    def test_body(self) -> None:
        """error, type, code, then the extra fields; None fields are left out."""
        error = errors.forbidden("no", Code.PATH_DENIED, rule="r", scope=None)
        self.assertEqual(
            error.body(),
            {
                "error": "no",
                "type": "PermissionError",
                "code": "path_denied",
                "rule": "r",
            },
        )
        self.assertEqual(
            errors.permission_denied("/p").body(),
            {
                "error": "Permission denied: /p",
                "type": "PermissionError",
                "code": "permission_denied",
            },
        )

    def test_event(self) -> None:
        """An SSE ``error`` event carries only ``error`` and ``type`` (SPEC §9)."""
        self.assertEqual(
            errors.timed_out("late").event(), {"error": "late", "type": "TimeoutError"}
        )

    def test_from_body_round_trip(self) -> None:
        """
        An error read back from its body (the browser worker's replies) is
        the same error; an unknown code becomes ``internal``, a missing
        status 500.
        """
        error = errors.forbidden("no", Code.PARAM_NOT_ALLOWED, rule="r")
        back = ApiError.from_body(403, error.body())
        self.assertEqual((back.status, back.body()), (403, error.body()))
        odd = ApiError.from_body(None, {"error": "x", "code": "bogus"})
        self.assertEqual(
            (odd.status, odd.code, odd.type), (500, "internal", "RuntimeError")
        )

    def test_server_response_error(self) -> None:
        """``ServerResponse.error`` (SPEC §10) gives the same body as ApiError."""
        response = ServerResponse.error(400, "Invalid 'count'", "ValueError", hint=None)
        self.assertEqual(
            (response.status, response.body),
            (400, {"error": "Invalid 'count'", "type": "ValueError"}),
        )


class OnePlaceTests(SynchronousTestCase):
    """No module under sandboxd/ spells an error body or an ApiError itself."""

    def test_no_hand_built_error_bodies(self) -> None:
        """
        No dict literal (or ``dict(...)`` call) under sandboxd/ has both an
        ``error`` and a ``type`` key, outside ``ApiError.body`` and the
        browser worker's ``error_fields``.
        """
        self.assertEqual(
            hand_built_bodies(_modules()), [], "build error bodies with ApiError.body()"
        )

    def test_no_direct_api_errors(self) -> None:
        """
        ``ApiError(...)`` is called only in errors.py (and by
        ``ServerResponse.error``): every other refusal uses a constructor.
        """
        found = []
        for path, tree in _modules():
            if path in DIRECT_CALLS_ALLOWED:
                continue
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name | ast.Attribute)
                    and getattr(node.func, "id", getattr(node.func, "attr", ""))
                    == "ApiError"
                ):
                    found.append(f"{path}:{node.lineno}")
        self.assertEqual(found, [], "use (or add) a constructor in sandboxd/errors.py")

    def test_check_sees_a_hand_built_body(self) -> None:
        """The body check is not vacuous: it finds both shapes it forbids."""
        tree = ast.parse(
            'def f():\n    return {"error": "m", "type": "T", "code": "x"}\n'
            'y = dict(error="m", type="T")\n'
        )
        self.assertEqual(
            sorted(hand_built_bodies([("m.py", tree)])), ["m.py:2", "m.py:3"]
        )


class NotJsonTests(SynchronousTestCase):
    """The 500 for an answer JSON cannot carry says where."""

    def test_names_the_first_non_finite_number(self) -> None:
        """The JSONPath of the first inf or nan, through objects and arrays."""
        value = {
            "ok": 1.5,
            "rows": [{"v": 2.0}, {"v": float("-inf")}],
            "z": float("nan"),
        }
        error = errors.not_json(value)
        self.assertEqual(
            (error.status, error.code, error.type), (500, "internal", "ValueError")
        )
        self.assertIn("the answer is not JSON: $.rows[1].v is", error.message)
        self.assertIsNone(errors.nonfinite_at({"big": 1e308, "t": (1, "x")}))

    def test_a_cycle_is_only_not_json(self) -> None:
        """A value that refers to itself (the encoder's other ValueError) is said plainly."""
        cycle: dict[str, Any] = {}
        cycle["self"] = cycle
        self.assertEqual(errors.not_json(cycle).message, "the answer is not JSON")


class QuotedTests(SynchronousTestCase):
    """A caller's value in a message is cut, so a refusal stays small."""

    def test_short_value_is_its_repr(self) -> None:
        """A short value is quoted whole, as ``repr`` quotes it."""
        self.assertEqual(errors.quoted("a'b"), repr("a'b"))

    def test_long_value_is_cut(self) -> None:
        """A long one: its first characters, an ellipsis, and its length."""
        shown = errors.quoted("\u00e9" * 100000)
        self.assertEqual(shown, repr("\u00e9" * 200) + "\u2026 (100000 characters)")
        self.assertEqual(errors.quoted("xyz", limit=2), "'xy'\u2026 (3 characters)")
