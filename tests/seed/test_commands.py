"""
The seed SDK's ``commands.*`` methods against a sandboxd daemon, each
scenario run against the seed's own server (loaded with the same commands
from a seed-style file) too.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import pathlib
import time
from typing import Any

from twisted.internet.defer import inlineCallbacks

from sandboxd import CommandRegistry
from tests.seed.test_process import Compared

#: The same commands, written for the seed's server.
SEED_COMMANDS = """
from agent_sandbox.server import command


@command("hello", description="Say hello.")
def hello(name: str = "World") -> str:
    return f"Hello, {name}!"


@command("add", description="Add two integers.")
def add(a: int, b: int = 1) -> int:
    return a + b


@command("boom", description="Always fails.")
def boom() -> None:
    raise KeyError("missing thing")


@command("odd", hidden=True)
def odd(kind: str) -> object:
    import datetime
    import pathlib

    return {
        "dt": datetime.datetime(2020, 1, 1),
        "path": pathlib.Path("/tmp"),
        "bytes": b"abc",
        "set": {1},
        "nested": {"when": [datetime.date(2021, 2, 3)]},
    }[kind]


@command("nap", hidden=True)
def nap(seconds: float = 1.0) -> str:
    import time

    time.sleep(seconds)
    return f"slept {seconds}"


@command("size", hidden=True)
def size(data: str) -> int:
    return len(data)
"""


def registry() -> CommandRegistry:
    """The same commands, registered with sandboxd."""
    commands = CommandRegistry()

    @commands.command("hello", description="Say hello.")
    def hello(name: str = "World") -> str:
        return f"Hello, {name}!"

    @commands.command("add", description="Add two integers.")
    def add(a: int, b: int = 1) -> int:
        return a + b

    @commands.command("boom", description="Always fails.")
    def boom() -> None:
        raise KeyError("missing thing")

    @commands.command("odd", hidden=True)
    def odd(kind: str) -> object:
        return {
            "dt": datetime.datetime(2020, 1, 1),
            "path": pathlib.Path("/tmp"),
            "bytes": b"abc",
            "set": {1},
            "nested": {"when": [datetime.date(2021, 2, 3)]},
        }[kind]

    @commands.command("nap", hidden=True)
    def nap(seconds: float = 1.0) -> str:
        time.sleep(seconds)
        return f"slept {seconds}"

    @commands.command("size", hidden=True)
    def size(data: str) -> int:
        return len(data)

    return commands


class CommandsTests(Compared):
    """commands.list and commands.run."""

    autostart = False

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        yield self.start(registry=registry())

    @inlineCallbacks
    def reference(self, *extra: str) -> Any:
        """The seed's server, with the same commands loaded from a file."""
        path = os.path.realpath(self.mktemp()) + ".py"
        with open(path, "w") as f:
            f.write(SEED_COMMANDS)
        ref = yield super().reference("--commands", path, *extra)
        return ref

    @inlineCallbacks
    def test_list(self) -> Any:
        """list() is ServerCommand entries with their arguments."""
        from agent_sandbox.models.server import ServerCommand

        async def scenario(c: Any) -> Any:
            listed = await c.commands.list()
            return sorted(
                (
                    type(cmd),
                    cmd.name,
                    cmd.description,
                    tuple((a.name, a.type, a.required) for a in cmd.args),
                )
                for cmd in listed
            )

        result = yield self.same(scenario)
        self.assertEqual(
            result,
            [
                (
                    ServerCommand,
                    "add",
                    "Add two integers.",
                    (("a", "integer", True), ("b", "integer", False)),
                ),
                (ServerCommand, "boom", "Always fails.", ()),
                (ServerCommand, "hello", "Say hello.", (("name", "string", False),)),
            ],
        )

    @inlineCallbacks
    def test_run(self) -> Any:
        """run() returns the command's result."""

        async def scenario(c: Any) -> Any:
            return (
                await c.commands.run("hello", name="Qoder"),
                await c.commands.run("add", a=2, b=3),
            )

        result = yield self.same(scenario)
        self.assertEqual(result, ("Hello, Qoder!", 5))

    @inlineCallbacks
    def test_errors(self) -> Any:
        """Unknown, bad arguments and a failing command raise the SDK's three classes."""
        from agent_sandbox.models.errors import (
            CommandArgumentError,
            CommandExecutionError,
            CommandNotFoundError,
        )

        async def scenario(c: Any) -> Any:
            out = []
            for name, kwargs in (("nope", {}), ("add", {"a": "x"}), ("boom", {})):
                try:
                    await c.commands.run(name, **kwargs)
                except Exception as e:
                    out.append(type(e))
            return out

        result = yield self.same(scenario)
        self.assertEqual(
            result, [CommandNotFoundError, CommandArgumentError, CommandExecutionError]
        )

    @inlineCallbacks
    def test_result_not_json(self) -> Any:
        """
        A command returning what JSON has no type for (a datetime, a Path,
        bytes, a set) gives its ``str()``, as the seed's server sends it
        (was: 500 TypeError, the SDK's CommandExecutionError).
        """

        async def scenario(c: Any) -> Any:
            return [
                await c.commands.run("odd", kind=kind)
                for kind in ("dt", "path", "bytes", "set", "nested")
            ]

        result = yield self.same(scenario)
        self.assertEqual(
            result,
            [
                "2020-01-01 00:00:00",
                "/tmp",
                "b'abc'",
                "{1}",
                {"when": ["2021-02-03"]},
            ],
        )

    @inlineCallbacks
    def test_large_argument(self) -> Any:
        """
        A command handed a 2 MB argument runs, as on the seed, whose cap on
        a request body is 10 MiB (was: PayloadTooLargeError at 1 MiB); a
        body over 10 MiB is still 413 naming the setting.
        """
        data = "x" * 2_000_000

        result = yield self.same(lambda c: c.commands.run("size", data=data))
        self.assertEqual(result, 2_000_000)
        reply = yield self.request(
            "POST", "/commands/size", {"data": "x" * (10 * 1024 * 1024)}
        )
        self.assertEqual(reply.status, 413)
        self.assertEqual(reply.json()["limit"], 10 * 1024 * 1024)

    @inlineCallbacks
    def test_many_at_once(self) -> Any:
        """
        Ten blocking commands run at once all return, as on the seed's
        threaded server (was: two of them ServerAPIError, 503 at a cap of
        eight command threads).
        """

        async def scenario(c: Any) -> Any:
            return await asyncio.gather(
                *(c.commands.run("nap", seconds=1) for _ in range(10))
            )

        result = yield self.same(scenario)
        self.assertEqual(result, ["slept 1.0"] * 10)

    @inlineCallbacks
    def test_sync(self) -> Any:
        """list_sync() and run_sync()."""
        commands = self.client().commands
        listed = yield self.call(commands.list_sync)
        self.assertEqual(sorted(c.name for c in listed), ["add", "boom", "hello"])
        result = yield self.call(commands.run_sync, "add", a=40, b=2)
        self.assertEqual(result, 42)

    @inlineCallbacks
    def test_sync_face_compared(self) -> Any:
        """list and run through their ``*_sync`` twins give what they give on the seed, typed errors included."""
        from tests.seed.sdkcase import Face, outcome

        async def scenario(c: Any) -> Any:
            call = Face(sync=True)
            listed = await call(c.commands.list)
            return (
                sorted((type(d).__name__, d.name) for d in listed),
                await call(c.commands.run, "hello", name="sync"),
                await call(c.commands.run, "add", a=40, b=2),
                type(await outcome(call(c.commands.run, "nope"))).__name__,
                type(await outcome(call(c.commands.run, "add", b=2))).__name__,
                type(await outcome(call(c.commands.run, "boom"))).__name__,
            )

        result = yield self.same(scenario)
        self.assertEqual(result[1:3], ("Hello, sync!", 42))
        self.assertEqual([name for _, name in result[0]], ["add", "boom", "hello"])
        self.assertEqual(
            result[3:],
            ("CommandNotFoundError", "CommandArgumentError", "CommandExecutionError"),
        )
