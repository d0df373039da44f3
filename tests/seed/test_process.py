"""
The seed SDK's ``process.*`` and ``shell*`` methods against a sandboxd
daemon, each scenario run against the seed's own server too: the same
typed results, the same exception classes.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.seed.harness import SeedCase

Scenario = Callable[[Any], Awaitable[Any]]


def counting(client: Any, endpoint: str) -> list[int]:
    """Count the client's requests to ``endpoint`` (a one-item list, updated in place)."""
    count = [0]
    request = client._request

    async def counted(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == endpoint:
            count[0] += 1
        return await request(name, *args, **kwargs)

    client._request = counted
    return count


def kind(value: Any) -> Any:
    """What a comparison looks at: an exception's class and status, or the value."""
    if isinstance(value, BaseException):
        return (type(value).__name__, getattr(value, "status_code", None))
    return value


class Compared(SeedCase):
    """Runs a scenario against both servers."""

    @inlineCallbacks
    def both(self, scenario: Scenario) -> Any:
        """``(sandboxd's outcome, the seed's outcome)`` of one scenario."""
        yield self.reference()
        ours = yield self.outcome(scenario)
        theirs = yield self.outcome(scenario, reference=True)
        return ours, theirs

    @inlineCallbacks
    def same(self, scenario: Scenario) -> Any:
        """Run on both; assert equal outcomes; return sandboxd's."""
        ours, theirs = yield self.both(scenario)
        self.assertEqual(kind(ours), kind(theirs))
        return ours


class ShellTests(Compared):
    """``process.shell``, ``shell_stream`` and ``run_stream``."""

    @inlineCallbacks
    def test_shell(self) -> Any:
        """shell() is a ShellResult with the output and the exit code."""
        from agent_sandbox.models.server import ShellResult

        async def scenario(c: Any) -> Any:
            ok = await c.process.shell("echo hi")
            failed = await c.process.shell("sh -c 'echo no >&2; exit 3'")
            return (type(ok), ok.stdout, ok.exit_code, failed.stderr, failed.exit_code)

        result = yield self.same(scenario)
        self.assertEqual(result, (ShellResult, "hi\n", 0, "no\n", 3))

    @inlineCallbacks
    def test_shell_timeout(self) -> Any:
        """A shell() past its timeout raises CommandTimeoutError."""
        from agent_sandbox.models.errors import CommandTimeoutError

        error = yield self.same(lambda c: c.process.shell("sleep 5", timeout=0.5))
        self.assertIsInstance(error, CommandTimeoutError)

    @inlineCallbacks
    def test_shell_sync(self) -> Any:
        """shell_sync() from blocking code."""
        client = self.client()
        result = yield self.call(client.process.shell_sync, "echo sync")
        self.assertEqual((result.stdout, result.exit_code), ("sync\n", 0))

    @inlineCallbacks
    def test_shell_stream(self) -> Any:
        """shell_stream() yields stdout and stderr lines, then exit."""
        from agent_sandbox.models.server import ShellEventType

        async def scenario(c: Any) -> Any:
            events = []
            async for event in c.process.shell_stream(
                "sh -c 'echo a; echo b >&2; exit 2'"
            ):
                events.append((event.event, event.data, event.exit_code))
            return sorted(events[:-1]), events[-1]

        lines, last = yield self.same(scenario)
        self.assertEqual(
            lines,
            [(ShellEventType.STDERR, "b", None), (ShellEventType.STDOUT, "a", None)],
        )
        self.assertEqual(last, (ShellEventType.EXIT, "", 2))

    @inlineCallbacks
    def test_run_stream(self) -> Any:
        """run_stream() calls back per line and returns the collected result."""

        async def scenario(c: Any) -> Any:
            seen: list[str] = []
            result = await c.process.run_stream(
                "sh -c 'echo one; echo two'", on_stdout=seen.append
            )
            return seen, result.stdout, result.exit_code

        result = yield self.same(scenario)
        self.assertEqual(result, (["one", "two"], "one\ntwo\n", 0))

    @inlineCallbacks
    def test_run_stream_timeout(self) -> Any:
        """A stream past its timeout raises CommandTimeoutError."""
        from agent_sandbox.models.errors import CommandTimeoutError

        error = yield self.same(lambda c: c.process.run_stream("sleep 5", timeout=0.5))
        self.assertIsInstance(error, CommandTimeoutError)

    @inlineCallbacks
    def test_run_stream_sync(self) -> Any:
        """run_stream_sync() from blocking code, timeout included."""
        from agent_sandbox.models.errors import CommandTimeoutError

        client = self.client()
        result = yield self.call(client.process.run_stream_sync, "echo s")
        self.assertEqual(result.stdout, "s\n")
        error = yield self.call(
            client.process.run_stream_sync, "sleep 5", timeout=0.5
        ).addErrback(lambda f: f.value)
        self.assertIsInstance(error, CommandTimeoutError)


class BackgroundTests(Compared):
    """``process.start``, ``list``, ``get``, ``wait``, signals."""

    @inlineCallbacks
    def test_start_get_list_wait(self) -> Any:
        """start() is a ServerProcess; get() and list() know it; wait() gives its exit code."""
        from agent_sandbox.models.server import ServerProcess

        async def scenario(c: Any) -> Any:
            started = await c.process.start("sh -c 'sleep 0.3; exit 4'")
            got = await c.process.get(started.pid)
            listed = [p.pid for p in await c.process.list()]
            code = await c.process.wait(started.pid, poll=0.1)
            after = await c.process.get(started.pid)
            return (
                type(started),
                started.command,
                type(got),
                got.state,
                started.pid in listed,
                code,
                after.state,
                after.exit_code,
            )

        result = yield self.same(scenario)
        self.assertEqual(
            result,
            (
                ServerProcess,
                "sh -c 'sleep 0.3; exit 4'",
                ServerProcess,
                "running",
                True,
                4,
                "exited",
                4,
            ),
        )

    @inlineCallbacks
    def test_wait_timeout(self) -> Any:
        """wait() past its timeout raises CommandTimeoutError."""
        from agent_sandbox.models.errors import CommandTimeoutError

        async def scenario(c: Any) -> Any:
            started = await c.process.start("sleep 30")
            try:
                return await c.process.wait(started.pid, timeout=0.3, poll=0.1)
            finally:
                await c.process.kill(started.pid)

        error = yield self.same(scenario)
        self.assertIsInstance(error, CommandTimeoutError)

    @inlineCallbacks
    def test_get_unknown(self) -> Any:
        """get() of a pid the server does not manage is a ServerAPIError 404."""
        from agent_sandbox.models.errors import ServerAPIError

        error = yield self.same(lambda c: c.process.get(2**22 + 7))
        self.assertIsInstance(error, ServerAPIError)
        self.assertEqual(error.status_code, 404)

    @inlineCallbacks
    def test_signals(self) -> Any:
        """signal(), terminate() and kill() answer SignalResult; the process ends."""
        from agent_sandbox.models.server import SignalResult

        async def scenario(c: Any) -> Any:
            out = []
            for method, number in (("terminate", 15), ("kill", 9), ("signal", 2)):
                started = await c.process.start("sleep 30")
                if method == "signal":
                    result = await c.process.signal(started.pid, 2)
                else:
                    result = await getattr(c.process, method)(started.pid)
                code = await c.process.wait(started.pid, timeout=10, poll=0.1)
                out.append((type(result), result.signal == number, code))
            return out

        result = yield self.same(scenario)
        self.assertEqual(
            result,
            [
                (SignalResult, True, -15),
                (SignalResult, True, -9),
                (SignalResult, True, -2),
            ],
        )

    @inlineCallbacks
    def test_signal_not_allowed(self) -> Any:
        """A signal outside the allowed ones is a ServerAPIError 400."""
        from agent_sandbox.models.errors import ServerAPIError

        async def scenario(c: Any) -> Any:
            started = await c.process.start("sleep 30")
            try:
                return await c.process.signal(started.pid, 1)
            finally:
                await c.process.kill(started.pid)

        error = yield self.same(scenario)
        self.assertIsInstance(error, ServerAPIError)
        self.assertEqual(error.status_code, 400)

    @inlineCallbacks
    def test_sync_methods(self) -> Any:
        """start/get/list/signal/kill/terminate/wait in their *_sync forms."""
        client = self.client()
        process = client.process
        started = yield self.call(process.start_sync, "sleep 30")
        got = yield self.call(process.get_sync, started.pid)
        self.assertEqual(got.state, "running")
        listed = yield self.call(process.list_sync)
        self.assertIn(started.pid, [p.pid for p in listed])
        signalled = yield self.call(process.signal_sync, started.pid, 18)
        self.assertEqual(signalled.signal, 18)
        yield self.call(process.terminate_sync, started.pid)
        code = yield self.call(process.wait_sync, started.pid, timeout=10, poll=0.1)
        self.assertEqual(code, -15)
        other = yield self.call(process.start_sync, "sleep 30")
        killed = yield self.call(process.kill_sync, other.pid)
        self.assertEqual(killed.signal, 9)


class OutputTests(Compared):
    """``process.output`` and ``process.follow``."""

    @inlineCallbacks
    def test_follow_ends_without_hot_loop(self) -> Any:
        """follow() yields every chunk once and ends with the process, in a few requests."""

        async def scenario(c: Any) -> Any:
            count = counting(c, "process_output")
            started = await c.process.start(
                "sh -c 'echo one; sleep 1; echo two'", capture_output=True
            )
            chunks = [e.data async for e in c.process.follow(started.pid, poll=5.0)]
            return "".join(chunks), count[0]

        (ours, our_requests), (theirs, _) = yield self.both(scenario)
        self.assertEqual(ours, "one\ntwo\n")
        self.assertEqual(ours, theirs)
        # one, two, then the end: a handful of long-polls, not hundreds.
        self.assertLessEqual(our_requests, 6)

    @inlineCallbacks
    def test_follow_quiet_process(self) -> Any:
        """A quiet process is long-polled: two seconds of silence cost a few requests."""

        async def scenario(c: Any) -> Any:
            count = counting(c, "process_output")
            started = await c.process.start("sleep 2", capture_output=True)
            chunks = [e async for e in c.process.follow(started.pid, poll=1.0)]
            return chunks, count[0]

        chunks, requests = yield self.drive(scenario)
        self.assertEqual(chunks, [])
        self.assertLessEqual(requests, 5)

    @inlineCallbacks
    def test_output_cursor(self) -> Any:
        """output(since=next) gives only what is new; next moves past what was seen."""
        from agent_sandbox.models.server import ProcessOutput

        async def scenario(c: Any) -> Any:
            started = await c.process.start("echo hello", capture_output=True)
            await c.process.wait(started.pid, poll=0.1)
            first = await c.process.output(started.pid, wait=2.0)
            again = await c.process.output(started.pid, since=first.next)
            return (
                type(first),
                first.stdout,
                first.state,
                first.exit_code,
                again.events,
                again.next == first.next,
            )

        result = yield self.same(scenario)
        self.assertEqual(result, (ProcessOutput, "hello\n", "exited", 0, [], True))

    @inlineCallbacks
    def test_output_numbering(self) -> Any:
        """
        ``seq`` is an output event's index from 0 and ``next`` the count so
        far, as on the seed: a client resuming with ``since`` = the events
        it has seen gets no event twice (was: seq from 1, skipping numbers,
        and ``since=2`` gave ``err`` again); a silent process says next 0.
        """

        async def scenario(c: Any) -> Any:
            started = await c.process.start(
                "sh -c 'echo a; sleep 0.3; echo err >&2; sleep 1; echo b'",
                capture_output=True,
            )
            seen: list[tuple[int, str, str]] = []
            nexts = []
            while len(seen) < 3:
                page = await c.process.output(started.pid, since=len(seen), wait=5)
                seen += [(e.seq, e.stream, e.data) for e in page.events]
                nexts.append(page.next)
            await c.process.wait(started.pid, poll=0.1)
            end = await c.process.output(started.pid, since=len(seen))
            quiet = await c.process.start("true", capture_output=True)
            await c.process.wait(quiet.pid, poll=0.1)
            silent = await c.process.output(quiet.pid)
            return (
                seen,
                nexts[-1],
                (end.events, end.next),
                (silent.events, silent.next),
            )

        result = yield self.same(scenario)
        self.assertEqual(
            result,
            (
                [(0, "stdout", "a\n"), (1, "stderr", "err\n"), (2, "stdout", "b\n")],
                3,
                ([], 3),
                ([], 0),
            ),
        )

    @inlineCallbacks
    def test_output_without_capture(self) -> Any:
        """output() of a process started without capture_output is a ServerAPIError 409."""
        from agent_sandbox.models.errors import ServerAPIError

        async def scenario(c: Any) -> Any:
            started = await c.process.start("sleep 30")
            try:
                return await c.process.output(started.pid)
            finally:
                await c.process.kill(started.pid)

        error = yield self.same(scenario)
        self.assertIsInstance(error, ServerAPIError)
        self.assertEqual(error.status_code, 409)

    @inlineCallbacks
    def test_output_sync(self) -> Any:
        """output_sync() from blocking code."""
        client = self.client()
        started = yield self.call(
            client.process.start_sync, "echo sync-out", capture_output=True
        )
        yield self.call(client.process.wait_sync, started.pid, poll=0.1)
        output = yield self.call(client.process.output_sync, started.pid, wait=1.0)
        self.assertEqual(output.stdout, "sync-out\n")


class StdinTests(Compared):
    """``process.send_stdin`` and ``process.close_stdin``."""

    @inlineCallbacks
    def test_text_and_bytes(self) -> Any:
        """Text and bytes both reach the process; close_stdin ends it; written and closed say so."""
        from agent_sandbox.models.server import StdinResult

        async def scenario(c: Any) -> Any:
            started = await c.process.start("cat", capture_output=True, stdin=True)
            text = await c.process.send_stdin(started.pid, "abc\n")
            raw = await c.process.send_stdin(started.pid, b"\x00\xffxyz\n")
            closed = await c.process.close_stdin(started.pid)
            code = await c.process.wait(started.pid, timeout=10, poll=0.1)
            output = await c.process.output(started.pid, wait=1.0)
            return (
                type(text),
                (text.written, text.closed),
                (raw.written, raw.closed),
                (closed.written, closed.closed),
                code,
                base64.b64encode(output.stdout.encode()).decode(),
            )

        result = yield self.same(scenario)
        self.assertEqual(
            result[:5], (StdinResult, (4, False), (6, False), (0, True), 0)
        )
        self.assertEqual(base64.b64decode(result[5]), "abc\n\x00\ufffdxyz\n".encode())

    @inlineCallbacks
    def test_without_stdin(self) -> Any:
        """send_stdin() to a process started without stdin is a ServerAPIError 409."""
        from agent_sandbox.models.errors import ServerAPIError

        async def scenario(c: Any) -> Any:
            started = await c.process.start("sleep 30")
            try:
                return await c.process.send_stdin(started.pid, "x")
            finally:
                await c.process.kill(started.pid)

        error = yield self.same(scenario)
        self.assertIsInstance(error, ServerAPIError)
        self.assertEqual(error.status_code, 409)

    @inlineCallbacks
    def test_sync(self) -> Any:
        """send_stdin_sync() and close_stdin_sync()."""
        client = self.client()
        process = client.process
        started = yield self.call(
            process.start_sync, "cat", capture_output=True, stdin=True
        )
        sent = yield self.call(process.send_stdin_sync, started.pid, b"hi\n")
        self.assertEqual(sent.written, 3)
        closed = yield self.call(process.close_stdin_sync, started.pid)
        self.assertTrue(closed.closed)
        code = yield self.call(process.wait_sync, started.pid, timeout=10, poll=0.1)
        self.assertEqual(code, 0)


async def sync_face_scenario(c: Any) -> Any:
    """
    Every ``process`` method that has a ``*_sync`` twin, called through the
    twin on a worker thread: what each gave, reduced to what both servers
    must agree on (types, states, codes, output; not pids or times).
    """
    from tests.seed.sdkcase import Face, outcome

    call = Face(sync=True)
    p = c.process
    out: dict[str, Any] = {}
    shell = await call(p.shell, "sh -c 'echo out; echo err >&2; exit 3'")
    out["shell"] = (type(shell), shell.stdout, shell.stderr, shell.exit_code)
    seen: list[str] = []
    streamed = await call(p.run_stream, "sh -c 'echo a; echo b'", on_stdout=seen.append)
    out["run_stream"] = (type(streamed), seen, streamed.stdout, streamed.exit_code)
    out["run_stream_timeout"] = kind(
        await outcome(call(p.run_stream, "sleep 5", timeout=0.5))
    )
    started = await call(p.start, "cat", capture_output=True, stdin=True)
    got = await call(p.get, started.pid)
    listed = await call(p.list)
    out["start"] = (type(started), started.command, type(got), got.state)
    out["list"] = started.pid in [q.pid for q in listed]
    sent = await call(p.send_stdin, started.pid, b"hi\n")
    closed = await call(p.close_stdin, started.pid)
    out["stdin"] = (type(sent), sent.written, sent.closed, closed.closed)
    out["wait"] = await call(p.wait, started.pid, timeout=10, poll=0.1)
    output = await call(p.output, started.pid, wait=1.0)
    out["output"] = (type(output), output.stdout, output.exit_code)
    out["get_unknown"] = kind(await outcome(call(p.get, 2**22 + 7)))
    signals = []
    for method, number in (("signal", 18), ("terminate", 15), ("kill", 9)):
        victim = await call(p.start, "sleep 30")
        args = (victim.pid, number) if method == "signal" else (victim.pid,)
        result = await call(getattr(p, method), *args)
        signals.append((type(result), result.signal))
        if method == "signal":
            await call(p.kill, victim.pid)
        code = await call(p.wait, victim.pid, timeout=10, poll=0.1)
        signals.append(code if method != "signal" else "killed")
    out["signals"] = signals
    return out


class SyncFaceTests(Compared):
    """The ``*_sync`` twins of ``process`` give on sandboxd what they give on the seed."""

    @inlineCallbacks
    def test_sync_face_compared(self) -> Any:
        """shell, run_stream, start, get, list, stdin, wait, output and signals through their twins."""
        from agent_sandbox.models.server import (
            ProcessOutput,
            ServerProcess,
            ShellResult,
            SignalResult,
            StdinResult,
        )

        ours, theirs = yield self.both(sync_face_scenario)
        self.assertEqual(kind(ours), kind(theirs))
        self.assertEqual(
            ours,
            {
                "shell": (ShellResult, "out\n", "err\n", 3),
                "run_stream": (ShellResult, ["a", "b"], "a\nb\n", 0),
                "run_stream_timeout": ("CommandTimeoutError", None),
                "start": (ServerProcess, "cat", ServerProcess, "running"),
                "list": True,
                "stdin": (StdinResult, 3, False, True),
                "wait": 0,
                "output": (ProcessOutput, "hi\n", 0),
                "get_unknown": ("ServerAPIError", 404),
                "signals": [
                    (SignalResult, 18),
                    "killed",
                    (SignalResult, 15),
                    -15,
                    (SignalResult, 9),
                    -9,
                ],
            },
        )


class NarrowedSignalTests(Compared):
    """
    A policy that narrows ``allowed_signals``: a signal it leaves out is a
    policy refusal (``PolicyDeniedError``, 403), one no policy may allow
    stays a 400, on both servers.
    """

    policy = {"endpoints": {"process_signal": {"params": {"allowed_signals": [15]}}}}

    @inlineCallbacks
    def test_left_out_by_the_policy(self) -> Any:
        from agent_sandbox.models.errors import ServerAPIError

        path = os.path.realpath(self.mktemp()) + "-policy.json"
        with open(path, "w") as f:
            json.dump(self.policy, f)
        yield self.reference("--policy", path)

        async def scenario(c: Any) -> Any:
            started = await c.process.start("sleep 30")
            outcomes = []
            for number in (9, 1):
                try:
                    await c.process.signal(started.pid, number)
                except ServerAPIError as e:
                    outcomes.append(kind(e))
            await c.process.terminate(started.pid)
            return outcomes

        outcomes = yield self.same(scenario)
        self.assertEqual(
            outcomes, [("PolicyDeniedError", 403), ("ServerAPIError", 400)]
        )
