"""
The door's ``process.v1.ProcessService`` with the clients users run: the
SDK's ``CommandExecutor`` (``Execute``, as ``sandbox.commands.run`` calls
it) and, for the calls the SDK does not make yet, the ``ProcessServiceStub``
generated from the protocol's ``.proto`` that the SDK ships.
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
from twisted.internet.defer import inlineCallbacks

from tests.helpers import alive
from tests.kep.case import KepCase

TOKEN = "kep-process-token"
DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()


def stubs() -> Any:
    """The SDK's generated messages and stub (through its own import shim)."""
    from k8s_agent_sandbox.commands._process_stubs import process_pb2, process_pb2_grpc

    return process_pb2, process_pb2_grpc


def config(pb: Any, command: list[str], **kwargs: Any) -> Any:
    return pb.ProcessConfig(command=command, **kwargs)


def events(stream: Iterator[Any]) -> list[tuple[str, Any]]:
    """A Start stream as ``(kind, value)`` pairs, stdout and stderr joined per run."""
    out: list[tuple[str, Any]] = []
    for response in stream:
        kind = response.WhichOneof("event")
        if kind == "init":
            out.append(("init", response.init.process_id))
        elif kind == "exit":
            out.append(("exit", response.exit.exit_code))
        else:
            data = getattr(response, kind)
            if out and out[-1][0] == kind:
                out[-1] = (kind, out[-1][1] + data)
            else:
                out.append((kind, data))
    return out


def status_of(error: Any) -> tuple[str, str, dict[str, str]]:
    """A grpc.RpcError's status name, details, and its sandboxd trailers."""
    trailers = {
        k: v
        for k, v in (error.trailing_metadata() or ())
        if k.startswith("x-sandboxd-")
    }
    return error.code().name, error.details(), trailers


class ProcessCase(KepCase):
    """A daemon with the door's both ports, and a stub on its gRPC one."""

    grpc = True

    def stub(self, token: str | None = None) -> Any:
        channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.addCleanup(channel.close)
        if token is not None:
            channel = grpc.intercept_channel(channel, _Bearer(token))
        return stubs()[1].ProcessServiceStub(channel)

    def sleep(self, seconds: float) -> Any:
        from twisted.internet import reactor
        from twisted.internet.task import deferLater

        return deferLater(reactor, seconds, lambda: None)

    def caught(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except grpc.RpcError as e:
            return e


class _Details(
    collections.namedtuple(
        "_Details",
        (
            "method",
            "timeout",
            "metadata",
            "credentials",
            "wait_for_ready",
            "compression",
        ),
    ),
    grpc.ClientCallDetails,  # type: ignore[misc]
):
    """A call's details with metadata of our own (grpcio's documented way)."""


class _Bearer(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds ``authorization: Bearer T`` to every call, as a user wraps the SDK's channel."""

    def __init__(self, token: str) -> None:
        self.token = token

    def intercept_unary_unary(
        self, continuation: Any, details: Any, request: Any
    ) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(
        self, continuation: Any, details: Any, request: Any
    ) -> Any:
        return continuation(self._with_token(details), request)

    def _with_token(self, details: Any) -> Any:
        metadata = [
            *(details.metadata or ()),
            ("authorization", f"Bearer {self.token}"),
        ]
        return _Details(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )


class ExecuteTests(ProcessCase):
    """``sandbox.commands.run``: the SDK's own command executor."""

    audit = True
    extra_policy = {"defaults": {"audit": "all"}}

    @inlineCallbacks
    def test_run(self) -> Any:
        """Output, exit codes, env and cwd, as the SDK reads them."""
        os.makedirs(os.path.join(self.base_dir, "sub"))
        executor = self.commands()
        result = yield self.blocking(executor.run, "echo hi; echo err >&2")
        self.assertEqual(
            (result.stdout, result.stderr, result.exit_code), ("hi\n", "err\n", 0)
        )
        result = yield self.blocking(executor.run, "exit 3")
        self.assertEqual(result.exit_code, 3)
        result = yield self.blocking(
            executor.run, "echo $GREETING; pwd", env={"GREETING": "hello"}, cwd="sub"
        )
        self.assertEqual(
            result.stdout, f"hello\n{os.path.join(self.base_dir, 'sub')}\n"
        )
        [line] = [
            r
            for r in self.audit_lines()
            if r.get("endpoint") == "shell" and "exit 3" in str(r)
        ]
        self.assertEqual(
            (line["via"], line["path"]), ("kep", "/process.v1.ProcessService/Execute")
        )

    @inlineCallbacks
    def test_command_timeout(self) -> Any:
        """
        ``command_timeout`` is the call's deadline: the SDK reports exit 124
        and ``timed_out``, and the command's whole group is gone.
        """
        marker = os.path.join(self.base_dir, "pid")
        executor = self.commands()
        started = time.monotonic()
        result = yield self.blocking(
            executor.run, f"sleep 300 & echo $! > {marker}; wait", command_timeout=1
        )
        self.assertLess(time.monotonic() - started, 10)
        self.assertEqual((result.exit_code, result.timed_out), (124, True))
        with open(marker) as f:
            pid = int(f.read())
        for _ in range(50):
            if not alive(pid):
                break
            yield self.sleep(0.1)
        self.assertFalse(
            alive(pid), "the command's background child outlived the deadline"
        )

    @inlineCallbacks
    def test_refusals(self) -> Any:
        """
        A cwd outside the root is PERMISSION_DENIED, a program that is not
        there NOT_FOUND, as the SDK reports them.
        """
        executor = self.commands()
        error = yield self.blocking(
            self.caught_plain, executor.run, "true", cwd="../.."
        )
        self.assertIsInstance(error, RuntimeError)
        self.assertIn("PERMISSION_DENIED", str(error))
        # Absolute paths are the root's, as the protocol reads them.
        error = yield self.blocking(self.caught_plain, executor.run, "true", cwd="/etc")
        self.assertIn("NOT_FOUND", str(error))
        pb, _ = stubs()
        error = yield self.blocking(
            self.caught,
            self.stub().Execute,
            pb.ExecuteRequest(config=config(pb, ["no-such-program-kep"])),
            timeout=10,
        )
        self.assertEqual(status_of(error)[0], "NOT_FOUND")
        error = yield self.blocking(
            self.caught, self.stub().Execute, pb.ExecuteRequest(), timeout=10
        )
        self.assertEqual(status_of(error)[0], "INVALID_ARGUMENT")

    @inlineCallbacks
    def test_a_nul_in_cwd(self) -> Any:
        """
        A ``cwd`` holding a NUL byte is INVALID_ARGUMENT for ``Execute`` and
        ``Start``, as a NUL in the command is, with nothing logged.
        """
        pb, _ = stubs()
        bad = config(pb, ["true"], cwd="a\x00b")
        errors = [
            (
                yield self.blocking(
                    self.caught,
                    self.stub().Execute,
                    pb.ExecuteRequest(config=bad),
                    timeout=10,
                )
            ),
            (
                yield self.blocking(
                    self.caught,
                    lambda: list(
                        self.stub().Start(pb.StartRequest(config=bad), timeout=10)
                    ),
                )
            ),
        ]
        for error in errors:
            self.assertIsInstance(error, grpc.RpcError)
            self.assertEqual(
                status_of(error)[:2],
                ("INVALID_ARGUMENT", "'cwd' must not contain NUL"),
            )
        self.assertEqual(self.flushLoggedErrors(), [])

    def caught_plain(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            return e


class TruncatedTests(ProcessCase):
    """Output past ``max_output_bytes``: head and tail kept, the trailers say so."""

    extra_policy = {"endpoints": {"shell": {"limits": {"max_output_bytes": 4096}}}}

    @inlineCallbacks
    def test_execute_output_capped(self) -> Any:
        """
        Execute of a command printing 100 KB answers at most the cap (its
        head and tail) with ``x-sandboxd-truncated`` and the dropped bytes.
        """
        pb, _ = stubs()
        request = pb.ExecuteRequest(
            config=config(
                pb, ["/bin/sh", "-c", "head -c 100000 /dev/zero | tr '\\0' a"]
            )
        )
        answer, call = yield self.blocking(
            self.stub().Execute.with_call, request, timeout=10
        )
        self.assertEqual(answer.exit_code, 0)
        self.assertLessEqual(len(answer.stdout), 4096 + 200)
        self.assertTrue(answer.stdout.startswith(b"aaaa"))
        self.assertTrue(answer.stdout.endswith(b"aaaa"))
        trailers = dict(call.trailing_metadata())
        self.assertEqual(trailers["x-sandboxd-truncated"], "true")
        self.assertGreater(int(trailers["x-sandboxd-dropped-bytes"]), 90000)


class NarrowedShellsTests(ProcessCase):
    """A policy whose ``shells`` leave ``sh`` out, with ``rm`` denied."""

    extra_policy = {
        "endpoints": {
            "shell": {"params": {"shells": ["bash"], "deny_commands": ["rm"]}}
        }
    }

    @inlineCallbacks
    def test_a_refused_shell_is_refused_not_run_as_a_program(self) -> Any:
        """
        The SDK's ``/bin/sh -c CMD`` is refused 403 PERMISSION_DENIED
        naming ``params.shells`` (nothing runs), and an allowed shell's
        script is still checked by ``deny_commands`` however the shell is
        called: grouped options, or the words handed to ``"$@"``.
        """
        victim = os.path.join(self.base_dir, "victim.txt")
        with open(victim, "w") as f:
            f.write("keep me")
        error = yield self.blocking(
            self._caught, self.commands().run, "rm -f victim.txt; echo ran"
        )
        self.assertIsInstance(error, RuntimeError)
        self.assertIn("PERMISSION_DENIED", str(error))
        self.assertIn("the shell '/bin/sh' is not allowed (allowed: bash)", str(error))
        pb, _ = stubs()
        stub = self.stub()
        for argv in (
            ["/bin/sh", "-c", "echo ran"],
            ["bash", "-lc", "rm -f victim.txt"],
            ["bash", "-e", "-o", "pipefail", "-c", "rm -f victim.txt"],
            ["bash", "-c", 'exec "$@"', "bash", "rm", "-f", "victim.txt"],
        ):
            error = yield self.blocking(
                self.caught,
                stub.Execute,
                pb.ExecuteRequest(config=config(pb, argv)),
                timeout=10,
            )
            self.assertIsInstance(error, grpc.RpcError, str(argv))
            name, message, trailers = status_of(error)
            self.assertEqual(name, "PERMISSION_DENIED", str(argv))
            code = (
                "param_not_allowed" if argv[0] == "/bin/sh" else "command_not_allowed"
            )
            self.assertEqual(trailers["x-sandboxd-code"], code, f"{argv} {message}")
        self.assertTrue(os.path.exists(victim))
        answer = yield self.blocking(
            stub.Execute,
            pb.ExecuteRequest(config=config(pb, ["bash", "-c", "echo ok"])),
            timeout=10,
        )
        self.assertEqual(answer.stdout, b"ok\n")

    def _caught(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            return e


class PolicyTimeoutTests(ProcessCase):
    """A policy ``timeout_seconds`` shorter than the call's deadline."""

    extra_policy = {
        "endpoints": {
            "shell": {"limits": {"timeout_seconds": 2}},
            "process_start": {"limits": {"timeout_seconds": 2}},
            "pty_create_session": {"limits": {"timeout_seconds": 2}},
        }
    }

    @inlineCallbacks
    def test_a_terminal_ended_by_the_policy_limit_says_so(self) -> Any:
        """
        A ``Start`` with a pty that the policy's limit ends is
        RESOURCE_EXHAUSTED naming the limit, as a command's is, not an
        ``exit`` that looks like the program ended by itself; its process
        is gone.
        """
        pb, _ = stubs()

        def job() -> Any:
            stream = self.stub().Start(
                pb.StartRequest(
                    config=config(pb, ["/bin/sh", "-c", "echo $$; sleep 10"]),
                    pty=pb.PTY(cols=80, rows=24),
                ),
                timeout=20,
            )
            out = b""
            try:
                for response in stream:
                    out += response.stdout
                    if response.WhichOneof("event") == "exit":
                        return out, None
            except grpc.RpcError as e:
                return out, status_of(e)
            return out, None

        started = time.monotonic()
        out, error = yield self.blocking(job)
        self.assertLess(time.monotonic() - started, 10)
        self.assertIsNotNone(error, "the terminal's stream ended with an exit")
        name, message, trailers = error
        self.assertEqual(
            (name, trailers["x-sandboxd-code"]), ("RESOURCE_EXHAUSTED", "timeout")
        )
        self.assertEqual(
            trailers["x-sandboxd-rule"], "policy:endpoints.pty_create_session"
        )
        self.assertIn("the policy's timeout_seconds (2 seconds)", message)
        shell = int(out.split()[0])
        for _ in range(50):
            if not alive(shell):
                break
            yield self.sleep(0.1)
        self.assertFalse(alive(shell))

    @inlineCallbacks
    def test_the_policy_limit_is_named_not_the_callers(self) -> Any:
        """
        A command the policy's limit ends before the SDK's
        ``command_timeout`` is reported as the policy's limit (a
        RESOURCE_EXHAUSTED the SDK shows with its message), not as the
        SDK's own timeout with the caller's number; a deadline shorter than
        the policy's is still the SDK's ``timed_out``.
        """
        executor = self.commands()
        started = time.monotonic()
        error = yield self.blocking(
            self._caught,
            executor.run,
            "echo started; sleep 10; echo done",
            command_timeout=20,
        )
        self.assertLess(time.monotonic() - started, 10)
        self.assertIsInstance(error, RuntimeError)
        self.assertIn("RESOURCE_EXHAUSTED", str(error))
        self.assertIn("the policy's timeout_seconds (2 seconds)", str(error))
        result = yield self.blocking(executor.run, "sleep 10", command_timeout=1)
        self.assertEqual((result.exit_code, result.timed_out), (124, True))
        pb, _ = stubs()
        error = yield self.blocking(
            lambda: self.caught(
                events,
                self.stub().Start(
                    pb.StartRequest(config=config(pb, ["sleep", "10"])), timeout=20
                ),
            )
        )
        name, message, trailers = status_of(error)
        self.assertEqual(
            (name, trailers["x-sandboxd-code"]), ("RESOURCE_EXHAUSTED", "timeout")
        )
        self.assertEqual(trailers["x-sandboxd-rule"], "policy:endpoints.process_start")
        self.assertIn("the policy's timeout_seconds (2 seconds)", message)

    def _caught(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            return e


class LargeOutputTests(ProcessCase):
    """Execute's output past what one gRPC message a client takes can hold."""

    @inlineCallbacks
    def test_execute_output_over_the_message_limit(self) -> Any:
        """
        Output under ``max_output_bytes`` (10 MiB) but over the 4 MiB a
        client takes in one message is answered, not INTERNAL: both outputs
        keep their head and tail within the limit, a line names what was
        dropped, and the trailers say so, as for the output cap.
        """
        pb, _ = stubs()
        script = (
            "head -c 3000000 /dev/zero | tr '\\0' a; printf END;"
            " head -c 3000000 /dev/zero | tr '\\0' b >&2; printf FIN >&2"
        )
        request = pb.ExecuteRequest(config=config(pb, ["/bin/sh", "-c", script]))
        answer, call = yield self.blocking(
            self.stub().Execute.with_call, request, timeout=20
        )
        self.assertEqual(answer.exit_code, 0)
        self.assertLessEqual(answer.ByteSize(), 4 * 1024 * 1024)
        self.assertTrue(answer.stdout.startswith(b"aaaa"))
        self.assertTrue(answer.stdout.endswith(b"aEND"))
        self.assertTrue(answer.stderr.startswith(b"bbbb"))
        self.assertTrue(answer.stderr.endswith(b"bFIN"))
        trailers = dict(call.trailing_metadata())
        self.assertEqual(trailers["x-sandboxd-truncated"], "true")
        dropped = int(trailers["x-sandboxd-dropped-bytes"])
        kept = sum(
            len(out.replace(b"\n[... %d bytes dropped ...]\n" % n, b""))
            for out in (answer.stdout, answer.stderr)
            for n in [int(out.split(b"[... ")[1].split(b" ")[0])]
        )
        self.assertEqual(kept + dropped, 6000006)


class CallCapTests(ProcessCase):
    """Calls on one connection, which the SDK uses for all of its calls."""

    audit = True
    extra_policy = {"defaults": {"audit": "all"}}
    timeout = 120

    @inlineCallbacks
    def test_control_calls_get_through_while_100_starts_run(self) -> Any:
        """
        With ``max_processes`` (100) ``Start`` streams open on the SDK's
        channel, ``commands.run`` still runs and ``SendSignal`` still ends
        one of them, at once, instead of waiting unseen for a free stream
        until the deadline and reading as a command timeout.
        """
        from k8s_agent_sandbox.commands.command_executor import CommandExecutor

        pb, grpc_stubs = stubs()
        connector = self.connector()
        connector.connect()
        stub = grpc_stubs.ProcessServiceStub(connector.grpc_channel())
        executor = CommandExecutor(connector, None, "sandbox-client")

        def job() -> Any:
            streams = [
                stub.Start(
                    pb.StartRequest(config=config(pb, ["sleep", "60"])), timeout=90
                )
                for _ in range(100)
            ]
            try:
                pids = [next(stream).init.process_id for stream in streams]
                started = time.monotonic()
                result = executor.run("echo hi", command_timeout=10)
                stub.SendSignal(
                    pb.SendSignalRequest(process_id=pids[0], signal=pb.SIGNAL_SIGTERM),
                    timeout=10,
                )
                ended = events(streams[0])
                return result, ended, time.monotonic() - started
            finally:
                for stream in streams:
                    stream.cancel()

        result, ended, took = yield self.blocking(job)
        self.assertEqual((result.stdout, result.exit_code), ("hi\n", 0))
        self.assertEqual(ended, [("exit", -1)])
        self.assertLess(took, 5)

    @inlineCallbacks
    def test_a_call_over_the_cap_is_refused_at_once(self) -> Any:
        """
        A call past the connection's cap of calls is RESOURCE_EXHAUSTED at
        once, saying why (code ``concurrency_limited``, audited as 429),
        not left waiting for its deadline.
        """
        self.daemon.context.kep._grpc_factory.max_concurrent_calls = 3
        pb, _ = stubs()
        stub = self.stub()

        def job() -> Any:
            streams = [
                stub.Start(
                    pb.StartRequest(config=config(pb, ["sleep", "60"])), timeout=30
                )
                for _ in range(3)
            ]
            try:
                for stream in streams:
                    next(stream)
                started = time.monotonic()
                error = self.caught(
                    stub.Execute,
                    pb.ExecuteRequest(config=config(pb, ["echo", "hi"])),
                    timeout=10,
                )
                return error, time.monotonic() - started
            finally:
                for stream in streams:
                    stream.cancel()

        error, took = yield self.blocking(job)
        self.assertIsInstance(error, grpc.RpcError)
        name, message, trailers = status_of(error)
        self.assertEqual(
            (name, trailers.get("x-sandboxd-code")),
            ("RESOURCE_EXHAUSTED", "concurrency_limited"),
        )
        self.assertIn("too many calls open on this connection (at most 3)", message)
        self.assertLess(took, 5)
        self.assertIn(
            (429, "concurrency_limited"),
            [(r["status"], r["code"]) for r in self.audit_lines()],
        )


class StartTests(ProcessCase):
    """``Start`` and the calls on a started process, through the generated stub."""

    @inlineCallbacks
    def test_start_streams_init_output_exit(self) -> Any:
        """init with the pid, stdout and stderr apart, then the exit code."""
        pb, _ = stubs()
        request = pb.StartRequest(
            config=config(pb, ["/bin/sh", "-c", "echo out; echo err >&2; exit 7"])
        )
        got = yield self.blocking(
            lambda: events(self.stub().Start(request, timeout=10))
        )
        self.assertEqual(got[0][0], "init")
        self.assertGreater(got[0][1], 0)
        self.assertEqual(got[-1], ("exit", 7))
        self.assertIn(("stdout", b"out\n"), got)
        self.assertIn(("stderr", b"err\n"), got)

    @inlineCallbacks
    def test_stdin_and_eof(self) -> Any:
        """WriteStdin feeds the process; eof ends its input."""
        pb, _ = stubs()
        stub = self.stub()

        def job() -> Any:
            stream = stub.Start(pb.StartRequest(config=config(pb, ["cat"])), timeout=10)
            first = next(stream)
            pid = first.init.process_id
            stub.WriteStdin(
                pb.WriteStdinRequest(process_id=pid, input=b"abc\n"), timeout=5
            )
            stub.WriteStdin(_eof(pb, pid), timeout=5)
            return events(stream)

        got = yield self.blocking(job)
        self.assertEqual(got, [("stdout", b"abc\n"), ("exit", 0)])

    @inlineCallbacks
    def test_signals(self) -> Any:
        """SIGTERM ends the process (exit -1); an unspecified signal is refused."""
        pb, _ = stubs()
        stub = self.stub()

        def job() -> Any:
            stream = stub.Start(
                pb.StartRequest(config=config(pb, ["sleep", "300"])), timeout=10
            )
            pid = next(stream).init.process_id
            refused = self.caught(
                stub.SendSignal, pb.SendSignalRequest(process_id=pid), timeout=5
            )
            odd = self.caught(
                stub.SendSignal,
                pb.SendSignalRequest(process_id=pid, signal=9999),
                timeout=5,
            )
            stub.SendSignal(
                pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGTERM),
                timeout=5,
            )
            return pid, refused, odd, events(stream)

        pid, refused, odd, got = yield self.blocking(job)
        self.assertEqual(status_of(refused)[0], "INVALID_ARGUMENT")
        self.assertEqual(status_of(odd)[0], "INVALID_ARGUMENT")
        self.assertEqual(got, [("exit", -1)])
        error = yield self.blocking(
            self.caught,
            stub.SendSignal,
            pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGKILL),
            timeout=5,
        )
        self.assertEqual(status_of(error)[0], "NOT_FOUND")

    @inlineCallbacks
    def test_cancel_ends_the_group(self) -> Any:
        """A client that cancels its Start ends the command's whole process group."""
        pb, _ = stubs()
        stub = self.stub()

        def job() -> Any:
            stream = stub.Start(
                pb.StartRequest(
                    config=config(pb, ["/bin/sh", "-c", "sleep 300 & echo $!; wait"])
                ),
                timeout=30,
            )
            next(stream)
            line = b""
            while not line.endswith(b"\n"):
                line += next(stream).stdout
            stream.cancel()
            return int(line)

        pid = yield self.blocking(job)
        for _ in range(50):
            if not alive(pid):
                break
            yield self.sleep(0.1)
        self.assertFalse(alive(pid))

    @inlineCallbacks
    def test_pty(self) -> Any:
        """
        A Start with a pty runs the command on a terminal of that size;
        ResizeTTY resizes it, and is FAILED_PRECONDITION for a process
        without one.
        """
        pb, _ = stubs()
        stub = self.stub()
        script = "stty size; read x; stty size"

        def job() -> Any:
            stream = stub.Start(
                pb.StartRequest(
                    config=config(pb, ["/bin/sh", "-c", script]),
                    pty=pb.PTY(cols=100, rows=30),
                ),
                timeout=20,
            )
            pid = next(stream).init.process_id
            seen = b""
            while b"30 100" not in seen:
                seen += next(stream).stdout
            stub.ResizeTTY(
                pb.ResizeTTYRequest(process_id=pid, cols=120, rows=40), timeout=5
            )
            stub.WriteStdin(
                pb.WriteStdinRequest(process_id=pid, input=b"\n"), timeout=5
            )
            rest = events(stream)
            return seen, rest

        _seen, rest = yield self.blocking(job)
        output = b"".join(v for k, v in rest if k == "stdout")
        self.assertIn(b"40 120", output)
        self.assertEqual(rest[-1], ("exit", 0))

        def plain() -> Any:
            stream = stub.Start(
                pb.StartRequest(config=config(pb, ["sleep", "30"])), timeout=20
            )
            pid = next(stream).init.process_id
            error = self.caught(
                stub.ResizeTTY,
                pb.ResizeTTYRequest(process_id=pid, cols=1, rows=1),
                timeout=5,
            )
            stream.cancel()
            return error

        error = yield self.blocking(plain)
        self.assertEqual(status_of(error)[0], "FAILED_PRECONDITION")

    @inlineCallbacks
    def test_pty_size_out_of_range(self) -> Any:
        """
        A pty wider or taller than a terminal can be (the proto's fields
        are uint32) is INVALID_ARGUMENT naming the field, as ResizeTTY
        answers, and starts nothing.
        """
        pb, _ = stubs()
        stub = self.stub()
        for size in ({"cols": 100000, "rows": 24}, {"cols": 80, "rows": 70000}):

            def job(size: dict[str, int] = size) -> Any:
                stream = stub.Start(
                    pb.StartRequest(
                        config=config(pb, ["/bin/sh", "-c", "echo ran"]),
                        pty=pb.PTY(**size),
                    ),
                    timeout=10,
                )
                return self.caught(list, stream)

            error = yield self.blocking(job)
            self.assertIsInstance(error, grpc.RpcError)
            name, message, _ = status_of(error)
            field = "cols" if size["cols"] > 65535 else "rows"
            self.assertEqual(
                (name, message),
                ("INVALID_ARGUMENT", f"'{field}' must be within 1..65535"),
            )
        self.assertEqual(self.flushLoggedErrors(), [])


class PtyOutputTests(ProcessCase):
    """What a program writes to its terminal comes through whole."""

    @inlineCallbacks
    def test_seq_through_a_pty_is_exact(self) -> Any:
        """
        ``seq 1 100000`` on a pty (about 670 KB, far past the terminal's
        64 KiB scrollback) arrives as exactly the bytes the terminal wrote,
        once and in order, with a reader that starts late (the output piles
        up meanwhile) and with one that reads at once.
        """
        pb, _ = stubs()
        stub = self.stub()
        want = b"".join(b"%d\r\n" % i for i in range(1, 100001))

        def job(delay: float) -> Any:
            stream = stub.Start(
                pb.StartRequest(
                    config=config(pb, ["seq", "1", "100000"]),
                    pty=pb.PTY(cols=120, rows=40),
                ),
                timeout=30,
            )
            first = next(stream)
            time.sleep(delay)
            out = bytearray()
            code = None
            for response in stream:
                if response.HasField("stdout"):
                    out += response.stdout
                elif response.HasField("exit"):
                    code = response.exit.exit_code
            return first.WhichOneof("event"), bytes(out), code

        for delay in (0.5, 0.0, 0.0):
            kind, out, code = yield self.blocking(job, delay)
            self.assertEqual((kind, code), ("init", 0))
            self.assertEqual(len(out), len(want))
            self.assertTrue(out == want, "the terminal's output was not exact")

    @inlineCallbacks
    def test_a_terminal_waits_for_a_slow_reader(self) -> Any:
        """
        A client that stops reading a terminal ``Start`` for longer than a
        WebSocket viewer may lag pauses the terminal, as a plain ``Start``
        pauses its pipes: once it reads again every byte comes and the
        command runs to its end, rather than the stream being cut and the
        command killed.
        """
        from sandboxd.routes import terminal as terminal_routes

        opened = terminal_routes.open_session

        def open_session(*args: Any, **kwargs: Any) -> Any:
            # A viewer's patience this short, so that the test need not
            # outwait the default ten seconds.
            session = opened(*args, **kwargs)
            session.slow_client_seconds = 0.2
            return session

        self.patch(terminal_routes, "open_session", open_session)
        pb, _ = stubs()
        stub = self.stub()
        lines = 1500000
        want = b"".join(b"%d\r\n" % i for i in range(1, lines + 1))

        def job() -> Any:
            stream = stub.Start(
                pb.StartRequest(
                    config=config(pb, ["seq", "1", str(lines)]),
                    pty=pb.PTY(cols=120, rows=40),
                ),
                timeout=60,
            )
            next(stream)
            time.sleep(2)
            out = bytearray()
            code = None
            try:
                for response in stream:
                    if response.HasField("stdout"):
                        out += response.stdout
                    elif response.HasField("exit"):
                        code = response.exit.exit_code
            except grpc.RpcError as e:
                return bytes(out), status_of(e)
            return bytes(out), code

        out, code = yield self.blocking(job)
        self.assertEqual(code, 0)
        self.assertEqual(len(out), len(want))
        self.assertTrue(out == want, "the terminal's output was not exact")


def _eof(pb: Any, pid: int) -> Any:
    from google.protobuf import empty_pb2

    return pb.WriteStdinRequest(process_id=pid, eof=empty_pb2.Empty())


class AccessTests(ProcessCase):
    """The gate on the gRPC port: tokens in metadata, scopes, the door switched off."""

    audit = True
    extra_policy = {
        "defaults": {"audit": "all"},
        "auth": {
            "tokens": [
                {"id": "agent", "token_sha256": DIGEST, "scopes": ["*"]},
                {
                    "id": "reader",
                    "token_sha256": hashlib.sha256(b"reader-token").hexdigest(),
                    "scopes": ["core:read", "files:read"],
                },
            ]
        },
    }

    @inlineCallbacks
    def test_tokens_and_scopes(self) -> Any:
        """
        No credential is UNAUTHENTICATED, a token in metadata runs, a token
        without ``process:run`` is PERMISSION_DENIED; sandboxd's code rides
        in the trailers.
        """
        pb, _ = stubs()
        request = pb.ExecuteRequest(config=config(pb, ["/bin/sh", "-c", "echo ok"]))
        error = yield self.blocking(
            self.caught, self.stub().Execute, request, timeout=10
        )
        self.assertEqual(status_of(error)[0], "UNAUTHENTICATED")
        self.assertEqual(status_of(error)[2]["x-sandboxd-code"], "unauthorized")
        answer = yield self.blocking(self.stub(TOKEN).Execute, request, timeout=10)
        self.assertEqual((answer.stdout, answer.exit_code), (b"ok\n", 0))
        error = yield self.blocking(
            self.caught, self.stub("reader-token").Execute, request, timeout=10
        )
        name, _, trailers = status_of(error)
        self.assertEqual(
            (name, trailers["x-sandboxd-code"]), ("PERMISSION_DENIED", "missing_scope")
        )
        lines = [r for r in self.audit_lines() if r.get("via") == "kep"]
        self.assertEqual(
            [(r["identity"], r["status"]) for r in lines],
            [("-", 401), ("agent", 200), ("reader", 403)],
        )

    @inlineCallbacks
    def test_a_bad_header_fails_its_call_not_the_channel(self) -> Any:
        """
        On the one channel the SDK shares between calls, a call whose
        ``authorization`` is ``Bearer `` (an empty token, as an interceptor
        sends for an unset variable) is UNAUTHENTICATED, and one whose
        metadata value ends with a space runs; a ``Start`` running on the
        same channel meanwhile goes on to its end.
        """
        pb, pb_grpc = stubs()
        channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.addCleanup(channel.close)
        stub = pb_grpc.ProcessServiceStub(channel)
        auth = ("authorization", f"Bearer {TOKEN}")
        request = pb.ExecuteRequest(config=config(pb, ["/bin/sh", "-c", "echo ok"]))

        def job() -> Any:
            stream = stub.Start(
                pb.StartRequest(
                    config=config(pb, ["/bin/sh", "-c", "echo up; sleep 1; echo done"])
                ),
                metadata=[auth],
                timeout=20,
            )
            next(stream)
            seen = b""
            while b"up" not in seen:
                seen += next(stream).stdout
            empty = self.caught(
                stub.Execute,
                request,
                metadata=[("authorization", "Bearer ")],
                timeout=10,
            )
            spaced = self.caught(
                stub.Execute,
                request,
                metadata=[auth, ("x-request-tag", "abc ")],
                timeout=10,
            )
            try:
                rest = events(stream)
            except grpc.RpcError as e:
                rest = [("error", status_of(e))]
            return empty, spaced, rest

        empty, spaced, rest = yield self.blocking(job)
        self.assertIsInstance(empty, grpc.RpcError)
        self.assertEqual(status_of(empty)[0], "UNAUTHENTICATED")
        self.assertEqual((spaced.stdout, spaced.exit_code), (b"ok\n", 0))
        self.assertEqual(rest, [("stdout", b"done\n"), ("exit", 0)])


class TransportRefusalTests(ProcessCase):
    """What the transport refuses before any handler runs is audited too."""

    audit = True
    extra_policy = {"defaults": {"audit": "all"}}

    @inlineCallbacks
    def test_refused_calls_are_audited(self) -> Any:
        """
        A method the door does not serve and a message that does not decode
        each get their gRPC status and one audit line ``via: kep``.
        """
        channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.addCleanup(channel.close)
        unknown = channel.unary_unary("/process.v1.ProcessService/Nope")
        garbled = channel.unary_unary("/process.v1.ProcessService/Execute")
        first = yield self.blocking(self.caught, unknown, b"", timeout=10)
        # Field 1 (config) sent as a varint: the wrong wire type.
        second = yield self.blocking(self.caught, garbled, b"\x08\x01", timeout=10)
        self.assertEqual(status_of(first)[0], "UNIMPLEMENTED")
        self.assertEqual(status_of(second)[0], "INVALID_ARGUMENT")
        lines = [r for r in self.audit_lines() if r.get("via") == "kep"]
        self.assertEqual(
            [(r["path"], r["endpoint"], r["status"], r["code"]) for r in lines],
            [
                ("/process.v1.ProcessService/Nope", "kep", 501, "unsupported"),
                ("/process.v1.ProcessService/Execute", "kep", 400, "malformed_request"),
            ],
        )


class ReloadTests(ProcessCase):
    """A policy reload ends the streams of a caller it no longer lets in."""

    def tokens_policy(self, tokens: list[dict[str, Any]]) -> dict[str, Any]:
        return {"groups": {"kep": True}, "auth": {"tokens": tokens}}

    @inlineCallbacks
    def test_a_removed_tokens_start_stream_ends(self) -> Any:
        """
        Taking a token out of the policy ends its open ``Start`` stream at
        the reload, UNAUTHENTICATED and saying why, and its command with
        it; another token's stream goes on to its end.
        """
        agent = {"id": "agent", "token_sha256": DIGEST, "scopes": ["*"]}
        keeper = {
            "id": "keeper",
            "token_sha256": hashlib.sha256(b"keeper-token").hexdigest(),
            "scopes": ["*"],
        }
        yield self.start_on_policy_file(self.tokens_policy([agent, keeper]))
        pb, _ = stubs()
        up = {"agent": threading.Event(), "keeper": threading.Event()}

        def job(token: str, who: str) -> Any:
            stream = self.stub(token).Start(
                pb.StartRequest(
                    config=config(pb, ["/bin/sh", "-c", "echo $$; sleep 6; echo done"])
                ),
                timeout=30,
            )
            out = b""
            try:
                for response in stream:
                    out += response.stdout
                    if out.endswith(b"\n"):
                        up[who].set()
            except grpc.RpcError as e:
                return out, status_of(e)
            return out, None

        ended = self.blocking(job, TOKEN, "agent")
        went_on = self.blocking(job, "keeper-token", "keeper")
        for _ in range(100):
            if up["agent"].is_set() and up["keeper"].is_set():
                break
            yield self.sleep(0.05)
        self.reload_policy(self.tokens_policy([keeper]))
        out, error = yield ended
        self.assertIsNotNone(error, "the removed token's stream ran to its end")
        name, details, trailers = error
        self.assertEqual(name, "UNAUTHENTICATED")
        self.assertEqual(trailers["x-sandboxd-code"], "unauthorized")
        self.assertIn("'agent' is no longer in the policy", details)
        self.assertNotIn(b"done", out)
        shell = int(out.split()[0])
        for _ in range(50):
            if not alive(shell):
                break
            yield self.sleep(0.1)
        self.assertFalse(alive(shell))
        out, error = yield went_on
        self.assertIsNone(error)
        self.assertTrue(out.endswith(b"done\n"), out)

    @inlineCallbacks
    def test_a_revoked_callers_execute_ends(self) -> Any:
        """
        Taking a token out of the policy, or ``process:run`` from it, ends
        its running ``Execute`` at the reload (UNAUTHENTICATED or
        PERMISSION_DENIED, saying why) and kills its command, as it ends
        its ``Start`` streams; the command does not run on to its end.
        """
        agent = {"id": "agent", "token_sha256": DIGEST, "scopes": ["*"]}
        pb, _ = stubs()
        for narrowed, status, says in (
            (None, "UNAUTHENTICATED", "'agent' is no longer in the policy"),
            (["files:read"], "PERMISSION_DENIED", "process:run"),
        ):
            yield self.start_on_policy_file(self.tokens_policy([agent]))
            pid_file = os.path.join(self.base_dir, "pid")
            if os.path.exists(pid_file):
                os.remove(pid_file)
            script = f"echo $$ > {pid_file}; sleep 30; echo done"
            request = pb.ExecuteRequest(config=config(pb, ["/bin/sh", "-c", script]))
            running = self.blocking(
                self.caught, self.stub(TOKEN).Execute, request, timeout=60
            )
            for _ in range(100):
                if os.path.exists(pid_file) and open(pid_file).read().strip():
                    break
                yield self.sleep(0.05)
            with open(pid_file) as f:
                shell = int(f.read())
            began = time.monotonic()
            self.reload_policy(
                self.tokens_policy(
                    [] if narrowed is None else [{**agent, "scopes": narrowed}]
                )
            )
            error = yield running
            self.assertIsInstance(error, grpc.RpcError)
            name, details, _ = status_of(error)
            self.assertEqual(name, status)
            self.assertIn(says, details)
            self.assertLess(time.monotonic() - began, 10)
            for _ in range(50):
                if not alive(shell):
                    break
                yield self.sleep(0.1)
            self.assertFalse(alive(shell))
