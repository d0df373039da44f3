# -*- test-case-name: tests.security.test_confinement_doors -*-
"""
``params.confine`` through every front door: the same confined rule holds
whichever door starts the command and whichever client its users run,
against a real daemon on loopback.

Each door's command writes a file inside ``confine_write``, probes the
daemon with ``kill -0`` (no signal is sent: the daemon is this trial
process), then writes a file outside.  Confined, the first write lands,
the probe is refused ("Operation not permitted", Landlock's signal
scoping) and the second write is refused ("Permission denied"), so the
command exits non-zero and nothing exists outside.  Unconfined, all three
succeed and every test here fails.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

import attrs
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest

from sandboxd import landlock
from tests.client.base import ClientCase
from tests.e2b.sdk import E2BCase, caught
from tests.helpers import DaemonTestCase
from tests.kep.case import KepCase
from tests.kernels.test_contexts import (
    KERNEL_CALL_SECONDS,
    KERNEL_CASE_SECONDS,
    code_policy,
    need_ipykernel,
)
from tests.seed.harness import SeedCase

try:
    from tests.mcp.helpers import McpTestCase
except ImportError as e:  # the mcp SDK is a test dependency
    McpTestCase = DaemonTestCase  # type: ignore[misc,assignment]
    MCP_MISSING: str | None = f"the mcp SDK is not installed: {e}"
else:
    MCP_MISSING = None

#: What each endpoint that starts commands is confined to: writes beneath
#: the base dir only (and signals to its own command only, the default).
CONFINE: dict[str, Any] = {"confine": True, "confine_write": ["."]}

#: The policy of every daemon here: ``CONFINE`` on every group whose
#: endpoints start commands, terminals, snippets (``code_run``, in the
#: opt-in ``dev_tools``) or kernels (the opt-in ``code``), those two on.
CONFINED: dict[str, Any] = {
    "groups": {"dev_tools": True, "code": True},
    "endpoints": {
        **{
            group: {"params": CONFINE}
            for group in ("group:process", "group:terminal", "group:dev_tools")
        },
        **code_policy(params=CONFINE)["endpoints"],
    },
}

#: What Linux tells a confined child it refuses (the shell prints it).
DENIED_WRITE = "Permission denied"
DENIED_SIGNAL = "Operation not permitted"


def need_confinement(*modules: str) -> None:
    """
    Skip, saying why, unless this kernel scopes signals with Landlock (ABI
    6: what :data:`CONFINED`'s default ``confine_signals: own`` needs) and
    each client module in ``modules`` is installed.
    """
    abi = landlock.abi_version()
    if abi < landlock.SIGNALS_ABI:
        raise SkipTest(
            f"this kernel has Landlock ABI {abi}; confine_signals: own needs"
            f" {landlock.SIGNALS_ABI}"
        )
    for module in modules:
        try:
            __import__(module)
        except ImportError as e:
            raise SkipTest(f"{module} is not installed: {e}") from None


@attrs.frozen
class Attempt:
    """
    One command's try at writing inside and outside ``confine_write`` and
    at reaching the daemon, and what a confined run of it leaves behind.

    :ivar inside: a file under the base dir (allowed).
    :ivar outside: a file in a directory beside it (refused).
    :ivar payload: what the command writes to each.
    """

    inside: str
    outside: str
    payload: bytes

    @classmethod
    def of(cls, test: DaemonTestCase, door: str) -> Attempt:
        """The attempt of ``test``'s daemon's ``door``, its paths fresh."""
        elsewhere = os.path.realpath(test.mktemp())
        os.makedirs(elsewhere)
        return cls(
            inside=os.path.join(test.base_dir, f"{door}-inside.txt"),
            outside=os.path.join(elsewhere, f"{door}-outside.txt"),
            payload=f"written through {door}".encode(),
        )

    @property
    def script(self) -> str:
        """
        The shell line: the outside write last, so its failure is the
        command's exit status.
        """
        data = shlex.quote(self.payload.decode())
        return (
            f"printf %s {data} > {shlex.quote(self.inside)};"
            f" kill -0 {os.getpid()};"
            f" printf %s {data} > {shlex.quote(self.outside)}"
        )

    @property
    def argv(self) -> list[str]:
        """:attr:`script` as a program and its arguments."""
        return ["/bin/sh", "-c", self.script]

    @property
    def python(self) -> str:
        """
        Python that runs :attr:`argv` as its child (which inherits its
        confinement), prints its exit code and writes its stderr.
        """
        return (
            "import subprocess, sys\n"
            f"ran = subprocess.run({self.argv!r}, capture_output=True, text=True)\n"
            "sys.stderr.write(ran.stderr)\n"
            "print(ran.returncode)\n"
        )

    def assert_held(
        self, test: DaemonTestCase, exit_code: int | None, errors: str
    ) -> None:
        """
        The inside file holds the payload, nothing was written outside,
        and the command failed saying why (``errors``: its stderr, or a
        terminal's output).
        """
        test.assertFalse(
            os.path.exists(self.outside),
            f"an unconfined write: {self.outside} was made; said {errors!r}",
        )
        with open(self.inside, "rb") as f:
            test.assertEqual(f.read(), self.payload)
        test.assertNotIn(exit_code, (0, None), errors)
        test.assertIn(DENIED_WRITE, errors)
        test.assertIn(DENIED_SIGNAL, errors)


class SeedDoorTests(SeedCase):
    """The HTTP API, driven by the seed's own SDK (``agent_sandbox``)."""

    policy = CONFINED

    def setUp(self) -> Any:
        need_confinement("agent_sandbox")
        return super().setUp()

    @inlineCallbacks
    def test_shell(self) -> Any:
        """``process.shell`` runs confined: the write outside fails, inside lands."""
        attempt = Attempt.of(self, "seed-shell")
        # The seed's shell() splits its line as a shell would, and runs no shell.
        line = shlex.join(attempt.argv)
        result = yield self.drive(lambda c: c.process.shell(line))
        attempt.assert_held(self, result.exit_code, result.stderr)

    @inlineCallbacks
    def test_pty(self) -> Any:
        """A terminal of ``pty.create`` runs its shell confined."""
        attempt = Attempt.of(self, "seed-pty")

        async def scenario(c: Any) -> str:
            created = await c.pty.create(cols=200, rows=30)
            try:
                async with c.pty.connect(created.session_id) as term:
                    # The marker's digits are computed: the echo of the
                    # typed line does not match it.
                    await term.send(f"{attempt.script}; echo rc=$?-$((40+2))\n")
                    seen: str = await term.expect("-42", timeout=10)
            finally:
                await c.pty.delete(created.session_id)
            return seen

        seen = yield self.drive(scenario)
        status = re.search(r"rc=(\d+)-42", seen)
        attempt.assert_held(self, int(status[1]) if status else None, seen)


class E2BDoorTests(E2BCase):
    """The E2B door, driven by the ``e2b`` SDK."""

    policy = CONFINED

    def setUp(self) -> Any:
        need_confinement("e2b")
        return super().setUp()

    @inlineCallbacks
    def test_commands_run(self) -> Any:
        """``commands.run`` runs confined: it raises the exit, nothing written outside."""
        from e2b import CommandExitException

        attempt = Attempt.of(self, "e2b-run")
        error = yield self.sdk(
            caught, lambda: self.sandbox().commands.run(attempt.script)
        )
        self.assertIsInstance(error, CommandExitException)
        attempt.assert_held(self, error.exit_code, error.stderr)

    @inlineCallbacks
    def test_pty(self) -> Any:
        """A terminal of ``pty.create`` runs its shell confined."""
        attempt = Attempt.of(self, "e2b-pty")

        def job() -> Any:
            from e2b.sandbox.commands.command_handle import PtySize

            sbx = self.sandbox()
            handle = sbx.pty.create(PtySize(rows=30, cols=200))
            sbx.pty.send_stdin(handle.pid, f"{attempt.script}; exit\n".encode())
            data: list[bytes] = []
            ended = caught(lambda: handle.wait(on_pty=data.append))
            return ended, b"".join(data).decode(errors="replace")

        ended, output = yield self.sdk(job)
        attempt.assert_held(self, getattr(ended, "exit_code", None), output)


class McpDoorTests(McpTestCase):
    """The MCP door, driven by the official ``mcp`` SDK."""

    # Confined by default too: a tool that starts no command must not say so.
    policy = {**CONFINED, "defaults": {"params": CONFINE}}

    def setUp(self) -> Any:
        if MCP_MISSING is not None:
            raise SkipTest(MCP_MISSING)
        need_confinement()
        return super().setUp()

    @inlineCallbacks
    def test_shell_tool(self) -> Any:
        """The ``shell`` tool runs confined: its stderr says why the write failed."""
        attempt = Attempt.of(self, "mcp-shell")

        async def body(client: Any) -> Any:
            return await client.call_tool("shell", {"command": attempt.script})

        result = yield self.with_client(body)
        answer = result.structured_content
        attempt.assert_held(self, answer["exit_code"], answer["stderr"])

    @inlineCallbacks
    def test_tools_say_so(self) -> Any:
        """
        ``tools/list`` tells a model where confined tools' commands may
        write, before a refusal does; a tool that runs nothing says nothing.
        """

        async def body(client: Any) -> Any:
            return {
                tool.name: tool.description
                for tool in (await client.list_tools()).tools
            }

        described = yield self.with_client(body)
        note = (
            "Commands run confined by the kernel: they may write only below"
            f" {self.base_dir}; signal only processes they started."
        )
        self.assertTrue(described["shell"].endswith(" " + note), described["shell"])
        # A tool that starts no command says nothing, whatever its rule.
        self.assertNotIn("confined", described["files_list"])


class KepDoorTests(KepCase):
    """
    The KEP door, driven by ``k8s-agent-sandbox``: its ``CommandExecutor``
    (``Execute``) and the ``ProcessService`` stub it ships (``Start``).
    """

    policy = CONFINED
    grpc = True

    def setUp(self) -> Any:
        need_confinement("k8s_agent_sandbox", "grpc")
        return super().setUp()

    def start_events(self, attempt: Attempt, pty: bool = False) -> Any:
        """
        ``Start`` of the attempt's command (on a terminal with ``pty``), in
        a thread: its events, each kind's output joined.
        """
        import grpc

        from tests.kep.test_process import events, stubs

        pb, pb_grpc = stubs()
        channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.addCleanup(channel.close)
        stub = pb_grpc.ProcessServiceStub(channel)
        started = pb.StartRequest(
            config=pb.ProcessConfig(command=attempt.argv),
            pty=pb.PTY(cols=200, rows=30) if pty else None,
        )
        return self.blocking(lambda: events(stub.Start(started, timeout=20)))

    @inlineCallbacks
    def test_execute(self) -> Any:
        """``sandbox.commands.run`` (``Execute``) runs confined."""
        attempt = Attempt.of(self, "kep-execute")
        result = yield self.blocking(self.commands().run, attempt.script)
        attempt.assert_held(self, result.exit_code, result.stderr)

    @inlineCallbacks
    def test_start(self) -> Any:
        """A ``Start`` (a background process) runs confined."""
        attempt = Attempt.of(self, "kep-start")
        got = yield self.start_events(attempt)
        stderr = b"".join(v for k, v in got if k == "stderr").decode()
        attempt.assert_held(self, dict(got).get("exit"), stderr)

    @inlineCallbacks
    def test_start_pty(self) -> Any:
        """A ``Start`` with a ``pty`` (a terminal) runs confined."""
        attempt = Attempt.of(self, "kep-pty")
        got = yield self.start_events(attempt, pty=True)
        output = b"".join(v for k, v in got if k == "stdout").decode()
        attempt.assert_held(self, dict(got).get("exit"), output)


class ClientDoorTests(ClientCase):
    """The HTTP API, driven by ``sandboxd.client`` and the ``sandboxd`` CLI."""

    policy = CONFINED

    def setUp(self) -> Any:
        need_confinement()
        return super().setUp()

    @inlineCallbacks
    def test_commands_run(self) -> Any:
        """``Sandbox.commands.run`` (``/shell``) runs confined."""
        attempt = Attempt.of(self, "client-run")
        result = yield self.in_thread(self.sandbox().commands.run, attempt.argv)
        attempt.assert_held(self, result.exit_code, result.stderr)

    @inlineCallbacks
    def test_commands_start(self) -> Any:
        """``Sandbox.commands.start`` (``/process/start``) runs confined."""
        attempt = Attempt.of(self, "client-start")

        def job() -> tuple[int | None, str]:
            errors: list[str] = []
            process = self.sandbox().commands.start(attempt.argv)
            code = process.wait(timeout=20, on_stderr=errors.append)
            return code, "".join(errors)

        code, errors = yield self.in_thread(job)
        attempt.assert_held(self, code, errors)

    @inlineCallbacks
    def test_cli_exec(self) -> Any:
        """``sandboxd exec`` (``/shell/stream``) runs confined."""
        attempt = Attempt.of(self, "cli-exec")
        done = yield self.cli("exec", "--", *attempt.argv)
        attempt.assert_held(self, done.returncode, done.stderr.decode())

    @inlineCallbacks
    def test_code_run(self) -> Any:
        """``Sandbox.code.run`` (``code_run``, a snippet) runs confined."""
        attempt = Attempt.of(self, "client-code-run")
        result = yield self.in_thread(self.sandbox().code.run, attempt.script, "bash")
        attempt.assert_held(self, result["exit_code"], result["stderr"])

    @inlineCallbacks
    def test_code_context(self) -> Any:
        """
        ``Sandbox.code.execute`` in a code context (a kernel) runs confined
        when ``code_context_create``'s rule says ``confine``.
        """
        need_ipykernel()
        attempt = Attempt.of(self, "client-kernel")

        def job() -> Any:
            sb = self.sandbox(timeout=KERNEL_CALL_SECONDS)
            context = sb.code.create_context()
            try:
                return sb.code.execute(context["id"], attempt.python)
            finally:
                sb.code.delete_context(context["id"])

        done = yield self.in_thread(job)
        code = int(done["stdout"]) if done["stdout"].strip().isdigit() else None
        attempt.assert_held(self, code, done["stderr"])

    test_code_context.timeout = KERNEL_CASE_SECONDS  # type: ignore[attr-defined]
