"""
Template commands and custom routes (SPEC §7.2, §10) through a real daemon.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred, inlineCallbacks, succeed
from twisted.internet.task import deferLater
from twisted.logger import LogLevel, formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from sandboxd import (
    CapabilityGroup,
    CommandArg,
    CommandRegistry,
    ServerResponse,
    SSEResponse,
)
from sandboxd.routes import builtin_table, commands
from tests.helpers import DaemonTestCase


def make_registry() -> CommandRegistry:
    registry = CommandRegistry()

    @registry.command("hello", description="Say hello.")
    def hello(name: str = "World") -> str:
        return f"Hello, {name}!"

    @registry.command("add")
    def add(a: int, b: float = 0.5, flag: bool = False) -> dict[str, Any]:
        return {"sum": a + b, "flag": flag, "thread": threading.current_thread().name}

    @registry.command(hidden=True)
    def _debug_info() -> str:
        return "debug"

    @registry.command("boom")
    def boom() -> None:
        raise KeyError("missing thing")

    @registry.command("later")
    async def later(x: int) -> int:
        return x * 2

    @registry.command("deferred")
    def deferred() -> Deferred[str]:
        return succeed("from a Deferred")

    @registry.command("stats")
    def stats(empty: bool = False) -> dict[str, Any]:
        values = [] if empty else [1.5, 2.5]
        mean = sum(values) / len(values) if values else float("nan")
        return {"values": values, "mean": mean, "max": max(values, default=-math.inf)}

    @registry.command("ratio")
    async def ratio(a: float, b: float) -> float:
        return a / b if b else math.copysign(math.inf, a)

    @registry.command("admin_only", scopes=("system:write",))
    def admin_only() -> str:
        return "ok"

    return registry


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(data: bytes) -> Any:
    """``data`` parsed as JSON proper: ``NaN`` and ``Infinity`` refused."""
    return json.loads(data, parse_constant=_refuse_constant)


class RegistryTests(SynchronousTestCase):
    """Registration rules."""

    def test_signature_inference(self) -> None:
        """int/float/bool/else string; no default means required."""
        cmd = make_registry().get("add")
        assert cmd is not None
        self.assertEqual(
            [(a.name, a.type, a.required, a.default) for a in cmd.args],
            [
                ("a", "integer", True, None),
                ("b", "float", False, 0.5),
                ("flag", "boolean", False, False),
            ],
        )

    def test_bad_arg_type(self) -> None:
        """CommandArg refuses types outside string/integer/float/boolean."""
        with self.assertRaises(ValueError):
            CommandArg("x", "list")

    def test_args_must_fit_the_function(self) -> None:
        """
        Declared args the function cannot be called with are refused at
        registration, naming the command and the mismatch (was: loaded,
        then every call was 500 TypeError): an argument it does not take
        by keyword, a parameter it needs that none declares.  Arguments
        its ``**kwargs`` takes, and parameters with defaults left
        undeclared, are fine.
        """
        registry = CommandRegistry()

        def mismatch(n: str) -> str:
            return n

        def positional(n: str, /) -> str:
            return n

        def two(a: str, b: str) -> str:
            return a + b

        def loose(a: str, b: str = "", **extra: Any) -> str:
            return a

        for func, args, message in (
            (
                mismatch,
                [CommandArg("m")],
                "command 'bad' declares the argument 'm', which mismatch() does"
                " not take by keyword (it takes: n)",
            ),
            (
                positional,
                [CommandArg("n")],
                "command 'bad' declares the argument 'n', which positional() does"
                " not take by keyword (it takes: no arguments)",
            ),
            (
                two,
                [CommandArg("a")],
                "command 'bad': two() needs the argument 'b', which its args= do"
                " not declare (declared: a)",
            ),
        ):
            with self.assertRaises(ValueError) as raised:
                registry.register(func, "bad", args=args)
            self.assertEqual(str(raised.exception), message)
        self.assertNotIn("bad", registry)
        registry.register(loose, "loose", args=[CommandArg("a"), CommandArg("z")])
        self.assertIn("loose", registry)

    def test_frozen(self) -> None:
        """Registering after the freeze raises."""
        registry = CommandRegistry()
        registry.freeze()
        with self.assertRaises(RuntimeError):
            registry.register(lambda: None, "late")

    def test_boolean_coercion(self) -> None:
        """true/false/yes/no/1/0 in any case."""
        arg = CommandArg("f", "boolean")
        for text, value in (
            ("TRUE", True),
            ("no", False),
            ("1", True),
            ("0", False),
            ("Yes", True),
        ):
            self.assertEqual(arg.coerce(text), value)
        with self.assertRaises(ValueError):
            arg.coerce("maybe")


class CommandTests(DaemonTestCase):
    """GET /commands and POST /commands/{name}."""

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        table = builtin_table()

        @table.route("GET", "/hello/{name}", group=CapabilityGroup.COMMANDS)
        def hello_route(request: Any) -> ServerResponse:
            return ServerResponse.ok(
                {"greeting": f"Hello, {request.path_params['name']}!"}
            )

        @table.route(
            "POST", "/my/stream", group=CapabilityGroup.COMMANDS, streaming=True
        )
        def my_stream(request: Any) -> Any:
            count = request.body.get("count", 3)
            if not isinstance(count, int) or count <= 0:
                return ServerResponse.error(400, "Invalid 'count'", "ValueError")

            def events() -> Any:
                for i in range(count):
                    yield f'event: progress\ndata: {{"step": {i + 1}}}\n\n'
                yield ("done", {"total": count})

            return SSEResponse(event_iterator=events())

        @table.route(
            "POST",
            "/my/build",
            group=CapabilityGroup.COMMANDS,
            streaming=True,
            name="my_build",
        )
        def my_build(request: Any) -> Any:
            # The seed's usual form: a generator, not a list.
            def steps() -> Any:
                yield ("step", {"n": 1})
                yield {"event": "step", "data": {"n": 2}}
                yield ("done", {"ok": True})

            return SSEResponse(event_iterator=steps())

        @table.route(
            "POST", "/my/samples", group=CapabilityGroup.COMMANDS, streaming=True
        )
        def my_samples(request: Any) -> Any:
            samples = [1.5, math.inf, 2.5]
            return SSEResponse(
                event_iterator=iter([("sample", {"value": v}) for v in samples])
            )

        @table.route(
            "GET", "/public/status", group=CapabilityGroup.COMMANDS, auth_required=False
        )
        def public_status(request: Any) -> ServerResponse:
            return ServerResponse.ok({"status": "running", "public": True})

        return self.start(table=table, registry=make_registry(), token="tok")

    @inlineCallbacks
    def test_list(self) -> Any:
        """Visible commands with their args; hidden and unreachable ones are not listed."""
        reply = yield self.request("GET", "/commands")
        names = [c["name"] for c in reply.json()["commands"]]
        self.assertEqual(
            names,
            [
                "add",
                "admin_only",
                "boom",
                "deferred",
                "hello",
                "later",
                "ratio",
                "stats",
            ],
        )
        hello = next(c for c in reply.json()["commands"] if c["name"] == "hello")
        self.assertEqual(
            hello["args"],
            [
                {
                    "name": "name",
                    "type": "string",
                    "required": False,
                    "default": "World",
                    "description": "",
                }
            ],
        )

    @inlineCallbacks
    def test_run(self) -> Any:
        """Coerced kwargs; plain functions run off the reactor thread."""
        reply = yield self.request(
            "POST", "/commands/add", {"a": "2", "b": "1.5", "flag": "yes"}
        )
        self.assertEqual(reply.status, 200)
        result = reply.json()["result"]
        self.assertEqual((result["sum"], result["flag"]), (3.5, True))
        self.assertNotEqual(result["thread"], "MainThread")

    @inlineCallbacks
    def test_hidden_runs(self) -> Any:
        """A hidden command is not listed but runs."""
        reply = yield self.request("POST", "/commands/_debug_info")
        self.assertEqual(reply.json(), {"result": "debug"})

    @inlineCallbacks
    def test_async_and_deferred(self) -> Any:
        """Coroutine functions and Deferred-returning functions work."""
        reply = yield self.request("POST", "/commands/later", {"x": 21})
        self.assertEqual(reply.json(), {"result": 42})
        reply = yield self.request("POST", "/commands/deferred")
        self.assertEqual(reply.json(), {"result": "from a Deferred"})

    @inlineCallbacks
    def test_raise_logged_with_traceback(self) -> Any:
        """
        A command that raises is answered with its message and type, and
        its traceback goes to the daemon's log at ``warn``, naming the
        command and where it raised (was: no line anywhere).
        """
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        reply = yield self.request("POST", "/commands/boom")
        self.assertEqual(reply.status, 500)
        self.assertNotIn("Traceback", reply.body.decode())
        raised = [e for e in events if e.get("command") == "boom"]
        self.assertEqual(len(raised), 1, events)
        self.assertEqual(raised[0]["log_level"], LogLevel.warn)
        text = formatEvent(raised[0])
        self.assertIn("command 'boom' raised KeyError at ", text)
        self.assertIn("test_commands.py:", text)
        self.assertIn('raise KeyError("missing thing")', text)

    @inlineCallbacks
    def test_errors(self) -> Any:
        """Unknown → 404 listing the rest; bad args → 400; a raising command → 500 with its type."""
        reply = yield self.request("POST", "/commands/nope")
        self.assertEqual(reply.status, 404)
        self.assertEqual(
            reply.json()["error"],
            "Unknown command 'nope'; available: add, admin_only, boom, deferred,"
            " hello, later, ratio, stats",
        )
        self.assertEqual(reply.json()["type"], "ValueError")
        for body in ({}, {"a": 1, "zzz": 2}, {"a": "two"}):
            reply = yield self.request("POST", "/commands/add", body)
            self.assertEqual(reply.status, 400, body)
        reply = yield self.request("POST", "/commands/boom")
        self.assertEqual(reply.status, 500)
        self.assertEqual(reply.json()["type"], "KeyError")
        self.assertNotIn("Traceback", reply.body.decode())

    @inlineCallbacks
    def test_float_not_finite(self) -> Any:
        """
        A float argument that reads as infinite or not a number ("1e309",
        "inf", "nan") is 400 ``invalid_param`` and the command does not run
        (was run with inf, and answered ``Infinity``, which is not JSON).
        """
        for text in ("1e309", "-inf", "nan", "Infinity"):
            reply = yield self.request("POST", "/commands/add", {"a": 1, "b": text})
            self.assertEqual(reply.status, 400, text)
            self.assertEqual(reply.json()["code"], "invalid_param", text)
            self.assertIn("finite", reply.json()["error"])
        reply = yield self.request("POST", "/commands/add", {"a": 1, "b": "2.5"})
        self.assertEqual(reply.json()["result"]["sum"], 3.5)

    @inlineCallbacks
    def test_result_not_finite(self) -> Any:
        """
        A command whose result holds ``inf`` or ``nan`` is answered 500
        ``internal`` saying where, as strict JSON (was ``NaN`` and
        ``-Infinity`` in a 200, which no strict JSON reader takes); a
        finite result is untouched.
        """
        cases = [
            ("/commands/stats", {"empty": True}, "$.result.mean"),
            ("/commands/ratio", {"a": -1, "b": 0}, "$.result"),
            ("/commands/ratio", {"a": 1e308, "b": 0.5}, "$.result"),
        ]
        for path, body, where in cases:
            reply = yield self.request("POST", path, body)
            self.assertEqual(reply.status, 500, path)
            answer = strict_json(reply.body)
            self.assertEqual(
                (answer["code"], answer["type"]), ("internal", "ValueError")
            )
            self.assertIn(f"the answer is not JSON: {where} is", answer["error"])
        reply = yield self.request("POST", "/commands/stats")
        self.assertEqual(reply.status, 200)
        self.assertEqual(
            strict_json(reply.body),
            {"result": {"values": [1.5, 2.5], "mean": 2.0, "max": 2.5}},
        )
        reply = yield self.request("POST", "/commands/ratio", {"a": 1e308, "b": 1.25})
        self.assertEqual(reply.body, b'{"result":8e+307}')

    @inlineCallbacks
    def test_result_not_finite_over_mcp(self) -> Any:
        """
        Through MCP the same result is a tool error with ``internal``, in a
        message that is JSON (was ``NaN`` in its structured content and text).
        """
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
        }
        reply = yield self.request(
            "POST",
            "/mcp",
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"},
                },
            },
            headers=headers,
        )
        headers["Mcp-Session-Id"] = reply.headers.getRawHeaders("mcp-session-id")[0]
        answers = []
        for arguments in ({"name": "stats", "empty": True}, {"name": "stats"}):
            reply = yield self.request(
                "POST",
                "/mcp",
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {"name": "run_command", "arguments": arguments},
                },
                headers=headers,
            )
            answers.append(strict_json(reply.body)["result"])
        failed, passed = answers
        self.assertTrue(failed["isError"])
        self.assertEqual(failed["structuredContent"]["code"], "internal")
        self.assertIn("$.result.mean", failed["structuredContent"]["error"])
        self.assertFalse(passed["isError"])
        self.assertEqual(passed["structuredContent"]["result"]["mean"], 2.0)

    @inlineCallbacks
    def test_generator_stream_over_mcp(self) -> Any:
        """
        A template's streaming route over a generator is collected through
        MCP as over HTTP, every event in order (was: listed as a tool, and
        every call a 501 ``unsupported``).
        """
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
        }
        reply = yield self.request(
            "POST",
            "/mcp",
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"},
                },
            },
            headers=headers,
        )
        headers["Mcp-Session-Id"] = reply.headers.getRawHeaders("mcp-session-id")[0]
        reply = yield self.request(
            "POST",
            "/mcp",
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "my_build", "arguments": {}},
            },
            headers=headers,
        )
        self.assertEqual(reply.status, 200, reply.body)
        frame = reply.body.decode().split("data: ", 1)[1]
        answer = strict_json(frame)["result"]
        self.assertFalse(answer["isError"], answer)
        self.assertEqual(
            answer["structuredContent"]["events"],
            [
                {"event": "step", "data": {"n": 1}},
                {"event": "step", "data": {"n": 2}},
                {"event": "done", "data": {"ok": True}},
            ],
        )

    @inlineCallbacks
    def test_custom_route(self) -> Any:
        """{param} routes get path_params, percent-decoded."""
        reply = yield self.request("GET", "/hello/Q%20oder")
        self.assertEqual(reply.json(), {"greeting": "Hello, Q oder!"})

    @inlineCallbacks
    def test_custom_stream(self) -> Any:
        """A streaming route answers text/event-stream with every frame."""
        reply = yield self.request("POST", "/my/stream", {"count": 2})
        self.assertEqual(reply.header("content-type"), "text/event-stream")
        self.assertEqual(
            reply.body,
            b'event: progress\ndata: {"step": 1}\n\nevent: progress\ndata: {"step": 2}\n\n'
            b'event: done\ndata: {"total":2}\n\n',
        )
        reply = yield self.request("POST", "/my/stream", {"count": 0})
        self.assertEqual(reply.status, 400)

    @inlineCallbacks
    def test_stream_event_not_finite(self) -> Any:
        """
        An event whose data JSON cannot carry (``inf``), once the stream has
        begun, is sent as an ``error`` event in its place saying so; the
        events around it are untouched (was ``data: {"value":Infinity}``).
        """
        reply = yield self.request("POST", "/my/samples")
        frames = reply.body.decode().split("\n\n")[:-1]
        self.assertEqual(
            [f.split("\n")[0] for f in frames],
            ["event: sample", "event: error", "event: sample"],
        )
        data = [strict_json(f.split("\n")[1][len("data: ") :]) for f in frames]
        self.assertEqual((data[0], data[2]), ({"value": 1.5}, {"value": 2.5}))
        self.assertEqual(data[1]["type"], "ValueError")
        self.assertIn("the sample event is not JSON: $.value is", data[1]["error"])

    @inlineCallbacks
    def test_public_route(self) -> Any:
        """auth_required=False opens a custom route without a token."""
        reply = yield self.request("GET", "/public/status", token=None)
        self.assertEqual(reply.json(), {"status": "running", "public": True})

    @inlineCallbacks
    def test_custom_routes_are_discoverable(self) -> Any:
        """Custom routes appear in /capabilities and /openapi.json under their ids."""
        caps = yield self.request("GET", "/capabilities")
        self.assertIn("GET /hello/{name}", caps.json()["endpoints"])
        spec = yield self.request("GET", "/openapi.json")
        self.assertIn("/hello/{name}", spec.json()["paths"])
        self.assertEqual(spec.json()["paths"]["/health"]["get"]["security"], [])


class CommandPolicyTests(DaemonTestCase):
    """A policy can address custom routes by id and disable commands."""

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        table = builtin_table()

        @table.route(
            "GET",
            "/public/status",
            group=CapabilityGroup.COMMANDS,
            auth_required=False,
            name="public_status",
        )
        def public_status(request: Any) -> ServerResponse:
            return ServerResponse.ok({})

        return self.start(
            table=table,
            registry=make_registry(),
            policy={"groups": {"commands": False}},
        )

    @inlineCallbacks
    def test_group_gate_applies_to_public_routes(self) -> Any:
        """An unauthenticated route is still gated by its group."""
        reply = yield self.request("GET", "/public/status")
        self.assertEqual(reply.status, 404)
        self.assertEqual(reply.json()["rule"], "policy:groups.commands")


class ListRunnableTests(DaemonTestCase):
    """``GET /commands`` lists what the caller may run, nothing more."""

    autostart = False
    policy = {
        "auth": {
            "tokens": [
                {
                    "id": "runner",
                    "token_env": "RUNNER_TOKEN",
                    "scopes": ["commands:list", "commands:run:hello"],
                },
                {
                    "id": "lister",
                    "token_env": "LISTER_TOKEN",
                    "scopes": ["commands:list", "system:write"],
                },
                {
                    "id": "all",
                    "token_env": "ALL_TOKEN",
                    "scopes": ["commands:list", "commands:run"],
                },
            ]
        }
    }
    environ = {
        "RUNNER_TOKEN": "runner-token",
        "LISTER_TOKEN": "lister-token",
        "ALL_TOKEN": "all-token",
    }

    def setUp(self) -> Any:
        super().setUp()
        return self.start(registry=make_registry())

    @inlineCallbacks
    def test_only_runnable_listed(self) -> Any:
        """
        A token holding ``commands:run:hello`` lists hello alone, one with
        no ``commands:run`` lists none, and one with ``commands:run`` all
        but the command whose own scope it lacks: each listed command runs
        (was: every command was listed, and most answered 403).
        """
        expected = {
            "runner-token": ["hello"],
            "lister-token": [],
            "all-token": [
                "add",
                "boom",
                "deferred",
                "hello",
                "later",
                "ratio",
                "stats",
            ],
        }
        for token, names in expected.items():
            reply = yield self.request("GET", "/commands", token=token)
            self.assertEqual(reply.status, 200, reply.body)
            listed = [c["name"] for c in reply.json()["commands"]]
            self.assertEqual(listed, names, token)
        reply = yield self.request("POST", "/commands/hello", token="runner-token")
        self.assertEqual(reply.json(), {"result": "Hello, World!"})
        reply = yield self.request("POST", "/commands/stats", token="runner-token")
        self.assertEqual((reply.status, reply.json()["code"]), (403, "missing_scope"))

    @inlineCallbacks
    def test_unknown_names_only_runnable(self) -> Any:
        """
        The 404 for a mistyped name offers only the commands the caller
        may run, as ``GET /commands`` lists them (was: every visible
        command, those whose own scopes it lacks included).
        """
        reply = yield self.request("POST", "/commands/nope", token="all-token")
        self.assertEqual(reply.status, 404)
        self.assertEqual(
            reply.json()["error"],
            "Unknown command 'nope'; available: add, boom, deferred, hello,"
            " later, ratio, stats",
        )

    @inlineCallbacks
    def test_check_names_the_command_scope(self) -> Any:
        """
        ``capabilities/check`` for ``run_command`` and a command answers
        what the call would: refused for a command whose own scope the
        caller lacks (was: ``allowed: true``, then 403), or for a name no
        command has (was: allowed, then 404); allowed for one it may run.
        """
        expected = {
            "admin_only": (False, "missing_scope", "system:write"),
            "nosuch": (False, "not_found", None),
            "hello": (True, None, None),
        }
        for name, (allowed, code, scope) in expected.items():
            reply = yield self.request(
                "POST",
                "/capabilities/check",
                {"endpoint": "run_command", "command": name},
                token="all-token",
            )
            self.assertEqual(reply.status, 200, reply.body)
            body = reply.json()
            self.assertEqual(
                (body["allowed"], body.get("code"), body.get("scope")),
                (allowed, code, scope),
                name,
            )
            if name == "admin_only":
                self.assertEqual(body["rule"], "command:admin_only")
            call = yield self.request("POST", f"/commands/{name}", token="all-token")
            self.assertEqual(call.status == 200, allowed, name)


class AsyncioCommandTests(DaemonTestCase):
    """A coroutine command runs on an asyncio loop of its own, off the reactor."""

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        registry = CommandRegistry()

        @registry.command("aslow")
        async def aslow(seconds: float = 0.01) -> str:
            await asyncio.sleep(seconds)
            return threading.current_thread().name

        @registry.command("twisted_sleep")
        async def twisted_sleep() -> str:
            await Deferred()
            return "never"

        async def _twisted_nap() -> str:
            await deferLater(reactor, 0.01, lambda: None)
            return threading.current_thread().name

        @registry.command("twisted_on_the_reactor")
        def twisted_on_the_reactor() -> Deferred[str]:
            return ensureDeferred(_twisted_nap())

        @registry.command("asyncio_on_a_thread")
        def asyncio_on_a_thread() -> str:
            async def nap() -> str:
                await asyncio.sleep(0.01)
                return "slept"

            return asyncio.run(nap())

        return self.start(registry=registry)

    @inlineCallbacks
    def test_asyncio_awaited_works(self) -> Any:
        """
        A coroutine command may await asyncio (was: 500 "awaited asyncio",
        since it ran on the reactor): it runs on a command thread, on a loop
        of its own.  One awaiting a Deferred there answers 500 naming the
        command and saying what to write instead; a plain function
        annotated ``-> Deferred`` still runs its Twisted coroutine on the
        reactor, and a plain function may still call ``asyncio.run``.
        """
        reply = yield self.request("POST", "/commands/aslow")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertNotEqual(reply.json()["result"], "MainThread")
        reply = yield self.request("POST", "/commands/twisted_sleep")
        self.assertEqual(reply.status, 500, reply.body)
        body = reply.json()
        self.assertEqual((body["code"], body["type"]), ("internal", "RuntimeError"))
        self.assertTrue(
            body["error"].startswith("command 'twisted_sleep' awaited a Deferred"),
            body["error"],
        )
        self.assertIn("'-> Deferred'", body["error"])
        reply = yield self.request("POST", "/commands/twisted_on_the_reactor")
        self.assertEqual(reply.json(), {"result": "MainThread"})
        reply = yield self.request("POST", "/commands/asyncio_on_a_thread")
        self.assertEqual(reply.json(), {"result": "slept"})


class BlockingCoroutineTests(DaemonTestCase):
    """A command that blocks never stalls the daemon, whatever its kind."""

    autostart = False
    policy = {"endpoints": {"run_command": {"limits": {"timeout_seconds": 1}}}}

    def setUp(self) -> Any:
        super().setUp()
        self.threads = commands.CommandThreads()
        self.patch(commands, "THREADS", self.threads)
        registry = CommandRegistry()

        @registry.command("async_build")
        async def async_build(seconds: float = 3) -> str:
            # The slip this guards against: a blocking call in ``async def``.
            time.sleep(seconds)
            return "built"

        class DeferredJob(dict[str, Any]):
            """The template's own type, nothing to do with Twisted."""

        @registry.command("queue_job")
        def queue_job() -> DeferredJob:
            return DeferredJob(thread=threading.current_thread().name)

        return self.start(registry=registry, policy=self.policy)

    @inlineCallbacks
    def test_blocking_coroutine_answered_at_its_timeout(self) -> Any:
        """
        A coroutine command that blocks (``time.sleep`` inside ``async
        def``) leaves the daemon answering at once, and is answered 500
        ``timeout`` at ``timeout_seconds`` (was: the reactor it ran on froze
        for the whole call, ``/health`` included, and it answered 200 after
        the timeout, since the timer could not fire).
        """
        started = time.monotonic()
        pending = self.request("POST", "/commands/async_build")
        yield deferLater(reactor, 0.2, lambda: None)
        health_sent = time.monotonic()
        reply = yield self.request("GET", "/health")
        self.assertEqual(reply.status, 200)
        self.assertLess(time.monotonic() - health_sent, 0.5)
        reply = yield pending
        self.assertEqual(reply.status, 500, reply.body)
        self.assertEqual(reply.json()["code"], "timeout")
        self.assertLess(time.monotonic() - started, 2.5)
        for _ in range(100):
            if not self.threads.stuck:
                break
            yield deferLater(reactor, 0.05, lambda: None)

    @inlineCallbacks
    def test_return_type_named_deferred_runs_on_a_thread(self) -> Any:
        """
        A plain function whose return type merely has "Deferred" in its
        name runs on a command thread like any other (was: on the reactor,
        where a blocking one froze the daemon).
        """
        reply = yield self.request("POST", "/commands/queue_job")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertNotEqual(reply.json()["result"]["thread"], "MainThread")


class ReturnsDeferredTests(SynchronousTestCase):
    """Which plain functions run on the reactor, read from their types."""

    def test_annotations(self) -> None:
        """Deferred itself (generic, optional, as text) yes; look-alikes no."""

        class DeferredJob(dict[str, Any]):
            pass

        def plain() -> str:
            return ""

        def job() -> DeferredJob:
            return DeferredJob()

        def real() -> Deferred[str]:
            return succeed("")

        def maybe() -> Deferred[str] | None:
            return None

        def text_job() -> DeferredResult:  # type: ignore[name-defined]  # noqa: F821
            return None

        def text_real() -> Deferred[Unknown]:  # type: ignore[name-defined]  # noqa: F821
            return succeed("")

        self.assertEqual(
            [
                commands.returns_deferred(f)
                for f in (plain, job, real, maybe, text_job, text_real)
            ],
            [False, False, True, True, False, True],
        )
        self.assertFalse(commands.runs_on_reactor(real.__call__))


class FormBodyTests(DaemonTestCase):
    """A form-encoded body never becomes arguments (SPEC §3 step 5)."""

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        table = builtin_table()

        @table.route("POST", "/args", group=CapabilityGroup.COMMANDS, name="args")
        def args(request: Any) -> dict[str, Any]:
            return {
                "args": sorted(k.decode() for k in request.raw.args),
                "body": request.body,
            }

        return self.start(table=table)

    @inlineCallbacks
    def test_form_body_not_parsed(self) -> Any:
        """A body labelled urlencoded is read as JSON only; it adds no arguments."""
        reply = yield self.request(
            "POST",
            "/args?q=1",
            raw_body=b'{"x": "y=z"}',
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        self.assertEqual(reply.json(), {"args": ["q"], "body": {"x": "y=z"}})
        reply = yield self.request(
            "POST",
            "/args",
            raw_body=b"path=/etc/passwd",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_json"))


class CommandBoundTests(DaemonTestCase):
    """A command that never returns is answered at its timeout and bounded."""

    autostart = False
    policy = {
        "endpoints": {
            "run_command": {"limits": {"timeout_seconds": 1, "max_concurrency": 2}}
        }
    }

    def setUp(self) -> Any:
        super().setUp()
        self.release = threading.Event()
        self.addCleanup(self.release.set)
        self.cancelled: list[bool] = []
        self.threads = commands.CommandThreads()
        self.patch(commands, "THREADS", self.threads)
        registry = CommandRegistry()

        @registry.command("quick")
        def quick() -> str:
            return "quick"

        @registry.command("stuck")
        def stuck() -> str:
            self.release.wait(30)
            return "returned"

        @registry.command("stuck_async")
        async def stuck_async() -> str:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.append(True)
                raise
            return "never"

        return self.start(registry=registry, policy=self.policy)

    def assertTimedOut(self, reply: Any, started: float) -> None:
        self.assertEqual(reply.status, 500, reply.body)
        body = reply.json()
        self.assertEqual((body["code"], body["type"]), ("timeout", "TimeoutError"))
        self.assertEqual(
            (body["rule"], body["limit"]),
            ("policy:endpoints.run_command", "timeout_seconds"),
        )
        self.assertLess(time.monotonic() - started, 10)

    @inlineCallbacks
    def test_plain_function_answered_at_its_timeout(self) -> Any:
        """
        A plain function that blocks is answered 500 ``timeout`` at
        ``timeout_seconds``; the daemon serves on, file walks included (the
        command's thread is not the reactor pool's).
        """
        started = time.monotonic()
        reply = yield self.request("POST", "/commands/stuck")
        self.assertTimedOut(reply, started)
        reply = yield self.request("GET", "/health")
        self.assertEqual(reply.status, 200)
        reply = yield self.request("GET", f"/files/list?path={self.base_dir}")
        self.assertEqual(reply.status, 200, reply.body)

    @inlineCallbacks
    def test_coroutine_cancelled_at_its_timeout(self) -> Any:
        """A coroutine command is answered at its timeout and what it awaits is cancelled."""
        started = time.monotonic()
        reply = yield self.request("POST", "/commands/stuck_async")
        self.assertTimedOut(reply, started)
        for _ in range(100):
            if self.cancelled:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual(self.cancelled, [True])

    @inlineCallbacks
    def test_stuck_commands_give_their_slot_back(self) -> Any:
        """
        A plain function answered at its timeout gives its caller's slot
        back at once (was: held until it returned, so two stuck calls made
        every command, a quick one too, 503 for as long as they ran): its
        thread is counted apart, up to as many again as may run for
        callers; past that a call is 429 ``concurrency_limited`` naming the
        stuck command, with no Retry-After (no wait is known to help); when
        they return, commands run again.
        """
        for _ in range(2):
            reply = yield self.request("POST", "/commands/stuck")
            self.assertEqual(reply.status, 500, reply.body)
        reply = yield self.request("POST", "/commands/quick")
        self.assertEqual((reply.status, reply.json()), (200, {"result": "quick"}))
        for _ in range(2):
            reply = yield self.request("POST", "/commands/stuck")
            self.assertEqual(reply.status, 500, reply.body)
        self.assertEqual(len(self.threads.stuck), 4)
        reply = yield self.request("POST", "/commands/quick")
        self.assertEqual(reply.status, 429, reply.body)
        body = reply.json()
        self.assertEqual(
            (body["code"], body["endpoint"], body["limit"]),
            ("concurrency_limited", "run_command", 2),
        )
        self.assertEqual(
            [(s["command"], s["threads"]) for s in body["stuck"]], [("stuck", 4)]
        )
        self.assertIn("'stuck' (4,", body["error"])
        self.assertIsNone(reply.header("retry-after"))
        self.release.set()
        for _ in range(100):
            if not self.threads.stuck:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        reply = yield self.request("POST", "/commands/stuck")
        self.assertEqual(reply.json(), {"result": "returned"})


class CommandsAtOnceTests(DaemonTestCase):
    """Plain-function commands run side by side, as the seed runs them."""

    autostart = False
    timeout = 60

    def setUp(self) -> Any:
        super().setUp()
        self.threads = commands.CommandThreads()
        self.patch(commands, "THREADS", self.threads)
        self.gate = threading.Barrier(12, timeout=20)
        self.hold = threading.Event()
        self.addCleanup(self.hold.set)
        registry = CommandRegistry()

        @registry.command("meet")
        def meet() -> str:
            # Returns only once twelve calls are in it at once.
            self.gate.wait()
            return "met"

        @registry.command("hold")
        def hold() -> str:
            self.hold.wait(20)
            return "held"

        return self.start(registry=registry)

    @inlineCallbacks
    def test_twelve_at_once(self) -> Any:
        """
        Twelve blocking commands at once all run and answer (was: the
        ninth on was 503 ``unavailable`` at a cap of 8 threads that no
        document mentioned).
        """
        from twisted.internet.defer import gatherResults

        replies = yield gatherResults(
            [self.request("POST", "/commands/meet") for _ in range(12)]
        )
        self.assertEqual(
            [(r.status, r.json()) for r in replies], [(200, {"result": "met"})] * 12
        )

    @inlineCallbacks
    def test_over_max_concurrency(self) -> Any:
        """
        Past ``max_concurrency`` (32 unless the policy says otherwise)
        commands running for callers, a call is 429 ``concurrency_limited``,
        which the seed SDK raises as ``RateLimitedError`` (was 503, a plain
        ServerAPIError, from the ninth on).
        """
        from twisted.internet.defer import gatherResults

        held = [self.request("POST", "/commands/hold") for _ in range(32)]
        for _ in range(200):
            if len(self.threads.running) == 32:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual(len(self.threads.running), 32)
        reply = yield self.request("POST", "/commands/hold")
        self.assertEqual(reply.status, 429, reply.body)
        self.assertEqual(
            (reply.json()["code"], reply.json()["limit"]), ("concurrency_limited", 32)
        )
        self.hold.set()
        replies = yield gatherResults(held)
        self.assertEqual({r.status for r in replies}, {200})


class ThreadStartRefusedTests(DaemonTestCase):
    """
    A plain-function command when no thread can be started (the process
    at its thread or pid limit): 503 ``unavailable``, nothing run.
    """

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        self.ran: list[bool] = []
        registry = CommandRegistry()

        @registry.command("plain")
        def plain() -> str:
            self.ran.append(True)
            return "ran"

        return self.start(registry=registry)

    @inlineCallbacks
    def test_no_thread_left(self) -> Any:
        """
        ``can't start new thread`` is 503 ``unavailable`` (type
        ResourceError) with ``Retry-After``, as every other start the
        sandbox has no room for; once threads start again, so does the
        command.
        """
        import _thread

        def refuse(*_: Any, **__: Any) -> Any:
            raise RuntimeError("can't start new thread")

        starts = self.patch(_thread, "start_new_thread", refuse)
        reply = yield self.request("POST", "/commands/plain")
        self.assertEqual(reply.status, 503, reply.body)
        body = reply.json()
        self.assertEqual((body["code"], body["type"]), ("unavailable", "ResourceError"))
        self.assertEqual(reply.header("retry-after"), "1")
        self.assertEqual(self.ran, [])
        self.assertEqual(commands.THREADS.running, {})
        starts.restore()
        reply = yield self.request("POST", "/commands/plain")
        self.assertEqual(reply.json(), {"result": "ran"})


class ListDefaultTests(DaemonTestCase):
    """A list default is the declared one on every call."""

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        registry = CommandRegistry()

        @registry.command("defaults")
        def defaults(args: list[str] = ["seed"]) -> list[str]:  # noqa: B006
            args.append("new")
            return args

        return self.start(registry=registry)

    @inlineCallbacks
    def test_copied_per_call(self) -> Any:
        """A handler that changes its list default does not change the next call's."""
        for _ in range(2):
            reply = yield self.request("POST", "/commands/defaults", {})
            self.assertEqual(reply.json(), {"result": ["seed", "new"]})


class OptionalWithoutDefaultTests(DaemonTestCase):
    """
    An argument declared optional (the seed's ``CommandArg`` default) whose
    function has no default for it: a call without it is a 400 naming it.
    """

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        registry = CommandRegistry()

        @registry.command("greet", args=[CommandArg("who", required=False)])
        def greet(who: str) -> str:
            return f"hello {who}"

        return self.start(registry=registry)

    @inlineCallbacks
    def test_omitted_is_a_400_not_a_500(self) -> Any:
        """Was: 500 TypeError from the call; given, it runs."""
        reply = yield self.request("POST", "/commands/greet", {})
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_param"))
        self.assertIn("missing argument 'who'", reply.json()["error"])
        reply = yield self.request("POST", "/commands/greet", {"who": "you"})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertIn("hello you", reply.body.decode())
