"""
E2B's code interpreter through the E2B door, driven by the real
``e2b_code_interpreter`` SDK in debug mode against a real ipykernel:
state kept, charts as PNG, errors, contexts, timeouts and env values.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import threading
import time
import urllib.request
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import DeferredList, inlineCallbacks
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.e2b.codeinterp import lines_of
from sandboxd.eventlog import Event
from tests.e2b.sdk import E2BCase, caught
from tests.kernels.test_contexts import (
    KERNEL_CALL_SECONDS,
    KERNEL_CASE_SECONDS,
    KERNEL_START,
    code_policy,
    need_ipykernel,
)

# A first ``run_code`` starts the kernel hub and a kernel: these cases give
# the start, and the SDK call that waits for it, a kernel start's room.


class InterpreterCase(E2BCase):
    """
    A daemon with the code group on, for the ``e2b_code_interpreter`` SDK;
    the kernel the cases run is checked for first (skipped, saying why).
    """

    policy: dict[str, Any] = {"groups": {"code": True}, **KERNEL_START}
    call_seconds = KERNEL_CALL_SECONDS
    timeout = KERNEL_CASE_SECONDS
    #: The cases' kernel: ``python`` (ipykernel) or ``bash`` (built in).
    kernel = "python"

    def setUp(self) -> Any:
        if self.kernel == "bash":
            if shutil.which("bash") is None:
                raise SkipTest("bash is not installed")
        else:
            need_ipykernel()
        try:
            import e2b_code_interpreter  # noqa: F401
        except ImportError:
            raise SkipTest("e2b-code-interpreter is not installed") from None
        return super().setUp()

    def code_sandbox(self, token: str | None = None, traffic: str | None = None) -> Any:
        """``e2b_code_interpreter.Sandbox`` in debug mode, pointed at the door."""
        from e2b.connection_config import ConnectionConfig
        from e2b.envd.versions import ENVD_DEBUG_FALLBACK
        from e2b_code_interpreter import Sandbox

        if token is None and traffic is None:
            return Sandbox.create()
        config = ConnectionConfig(
            debug=True,
            sandbox_url=self.e2b_url,
            extra_sandbox_headers={"X-Access-Token": token} if token else None,
        )
        return Sandbox(
            sandbox_id="debug_sandbox_id",
            sandbox_domain=None,
            envd_version=ENVD_DEBUG_FALLBACK,
            envd_access_token=token,
            traffic_access_token=traffic,
            connection_config=config,
        )


class CodeInterpreterTests(InterpreterCase):
    """``Sandbox.run_code`` and the context calls, unchanged, against sandboxd."""

    @inlineCallbacks
    def test_state_png_and_error(self) -> Any:
        """State is kept across run_code; a plot is a PNG result; 1/0 is ZeroDivisionError."""
        sbx = self.code_sandbox()
        yield self.sdk(sbx.run_code, "x = 1")
        execution = yield self.sdk(sbx.run_code, "x + 1")
        self.assertEqual(execution.text, "2")
        seen: list[str] = []
        execution = yield self.sdk(
            sbx.run_code,
            "print('a')\nprint('b')",
            on_stdout=lambda m: seen.append(m.line),
        )
        self.assertEqual(execution.logs.stdout, ["a\nb\n"])
        self.assertEqual("".join(seen), "a\nb\n")
        plot = yield self.sdk(
            sbx.run_code,
            "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
        )
        self.assertIsNone(plot.error)
        self.assertTrue(base64.b64decode(plot.results[0].png).startswith(b"\x89PNG"))
        failed = yield self.sdk(sbx.run_code, "1/0")
        self.assertEqual(failed.error.name, "ZeroDivisionError")
        self.assertIn("ZeroDivisionError", failed.error.traceback)

    @inlineCallbacks
    def test_big_output(self) -> Any:
        """
        Output of hundreds of KiB (sent from its escaped parts, not joined)
        reaches run_code whole: quotes, backslashes, tabs and non-ASCII
        text as printed.
        """
        sbx = self.code_sandbox()
        code = "s = ('x\"y\\\\z\\t\\u00e9' * 100000)[:600000]\nprint(s)"
        out = yield self.sdk(sbx.run_code, code)
        self.assertIsNone(out.error)
        expected = ('x"y\\z\t\u00e9' * 100000)[:600000] + "\n"
        self.assertEqual("".join(out.logs.stdout), expected)

    @inlineCallbacks
    def test_line_separators(self) -> Any:
        """
        Output holding NEL, U+2028 or U+2029 reaches run_code whole, in a
        small line and in a big one: JSON may leave them raw, but the SDK
        reads the NDJSON answer with httpx's ``iter_lines``, which cuts a
        line there too (so each line is sent with them escaped).
        """
        sbx = self.code_sandbox()
        for repeat in (1, 20000):
            code = f"print('a\\x85b\\u2028c\\u2029d' * {repeat})"
            out = yield self.sdk(sbx.run_code, code)
            self.assertIsNone(out.error)
            expected = "a\x85b\u2028c\u2029d" * repeat + "\n"
            self.assertEqual("".join(out.logs.stdout), expected)

    @inlineCallbacks
    def test_contexts(self) -> Any:
        """Contexts are created (cwd kept), listed, restarted (state gone) and removed."""
        sbx = self.code_sandbox()
        cwd = os.path.join(self.base_dir, "work")
        os.makedirs(cwd)
        ctx = yield self.sdk(sbx.create_code_context, cwd=cwd)
        self.assertEqual(ctx.cwd, cwd)
        self.assertEqual(ctx.language, "python")
        out = yield self.sdk(
            sbx.run_code, "import os\nv = 5\nprint(os.getcwd())", context=ctx
        )
        self.assertEqual(out.logs.stdout, [cwd + "\n"])
        listed = yield self.sdk(sbx.list_code_contexts)
        self.assertIn(ctx.id, [c.id for c in listed])
        yield self.sdk(sbx.restart_code_context, ctx)
        gone = yield self.sdk(sbx.run_code, "v", context=ctx)
        self.assertEqual(gone.error.name, "NameError")
        yield self.sdk(sbx.remove_code_context, ctx)
        listed = yield self.sdk(sbx.list_code_contexts)
        self.assertNotIn(ctx.id, [c.id for c in listed])

    @inlineCallbacks
    def test_timeout_then_working(self) -> Any:
        """A client timeout on a busy loop interrupts it: the next run_code works."""
        sbx = self.code_sandbox()
        yield self.sdk(sbx.run_code, "kept = 'yes'")
        result = yield self.sdk(
            caught, lambda: sbx.run_code("while True: pass", timeout=1)
        )
        self.assertIsInstance(result, Exception)
        after = yield self.sdk(sbx.run_code, "kept")
        self.assertEqual(after.text, "yes")

    @inlineCallbacks
    def test_env_quotes(self) -> Any:
        """envs with quotes round-trip (no code injection) and end with the run."""
        sbx = self.code_sandbox()
        value = "a'b\"c"
        out = yield self.sdk(
            sbx.run_code, "import os\nprint(os.environ['Q'])", envs={"Q": value}
        )
        self.assertEqual(out.logs.stdout, [value + "\n"])
        after = yield self.sdk(sbx.run_code, "import os\nprint(os.environ.get('Q'))")
        self.assertEqual(after.logs.stdout, ["None\n"])


class BashTests(InterpreterCase):
    """
    ``run_code(..., language="bash")``: the built-in bash kernel, no
    ipykernel or bash kernel installed, its shell's state kept across calls.
    """

    kernel = "bash"

    @inlineCallbacks
    def test_bash_state_and_errors(self) -> Any:
        """
        cd and a variable carry to the next call; stdout and stderr are the
        logs; a failing command is the execution's error with its status;
        a bash context of its own starts fresh.
        """
        from e2b_code_interpreter import Sandbox

        os.mkdir(os.path.join(self.base_dir, "work"))
        sbx = Sandbox.create()
        yield self.sdk(sbx.run_code, "cd work; NAME=ada", language="bash")
        out = yield self.sdk(
            sbx.run_code, "pwd; echo hi $NAME; echo oops >&2", language="bash"
        )
        self.assertEqual(
            "".join(out.logs.stdout), os.path.join(self.base_dir, "work") + "\nhi ada\n"
        )
        self.assertEqual("".join(out.logs.stderr), "oops\n")
        self.assertIsNone(out.error)
        failed = yield self.sdk(sbx.run_code, "ls /no/such/dir", language="bash")
        self.assertEqual((failed.error.name, failed.error.value), ("ExitCode", "2"))
        ctx = yield self.sdk(sbx.create_code_context, language="bash")
        self.assertEqual(ctx.language, "bash")
        fresh = yield self.sdk(sbx.run_code, 'echo "[$NAME]"', context=ctx)
        self.assertEqual(fresh.logs.stdout, ["[]\n"])

    @inlineCallbacks
    def test_bash_envs(self) -> Any:
        """
        run_code(language="bash", envs=...) exports the values for that call
        (its commands see them; quotes, ``$(...)`` and newlines are only
        text), then gives back what was there before: a name that was
        exported keeps its old value, one that was not is unset again.  A
        name bash cannot export is refused 400.
        """
        from e2b_code_interpreter import Sandbox

        sbx = Sandbox.create()
        yield self.sdk(sbx.run_code, "export OLD=before", language="bash")
        value = "a'b\"c $(touch pwned) `touch pwned` \\ $HOME\nline two"
        out = yield self.sdk(
            sbx.run_code,
            'printf \'%s|%s\\n\' "$Q" "$OLD"; sh -c \'printf "%s\\n" "$Q"\'',
            language="bash",
            envs={"Q": value, "OLD": "during"},
        )
        self.assertIsNone(out.error)
        self.assertEqual("".join(out.logs.stdout), f"{value}|during\n{value}\n")
        after = yield self.sdk(
            sbx.run_code,
            'echo "[${Q-unset}]"; sh -c \'echo "$OLD"\'',
            language="bash",
        )
        self.assertEqual("".join(after.logs.stdout), "[unset]\nbefore\n")
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "pwned")))
        refused = yield self.sdk(
            caught,
            lambda: sbx.run_code("true", language="bash", envs={"A-B": "x"}),
        )
        self.assertIn("400", str(refused))

    @inlineCallbacks
    def test_concurrent_first_calls_share_the_default(self) -> Any:
        """
        Six run_code(language="bash") at once, before any bash context
        exists, all run in the one default shell: one context is made, no
        call is refused at the identity's context quota.  A default that
        cannot be made fails the calls waiting for it, and the next call
        tries again.
        """
        from e2b_code_interpreter import Sandbox

        sbx = Sandbox.create()
        for _ in range(2):
            refused = yield DeferredList(
                [
                    self.sdk(caught, lambda: sbx.run_code("1", language="cobol"))
                    for _ in range(3)
                ]
            )
            for _, error in refused:
                self.assertIn("400", str(error))
        runs = yield DeferredList(
            [
                self.sdk(caught, lambda: sbx.run_code("echo $$", language="bash"))
                for _ in range(6)
            ]
        )
        outs = [result for _, result in runs]
        for out in outs:
            self.assertNotIsInstance(out, Exception)
            self.assertIsNone(out.error)
        self.assertEqual(len({"".join(out.logs.stdout) for out in outs}), 1)
        listed = yield self.sdk(sbx.list_code_contexts)
        self.assertEqual([c.language for c in listed], ["bash"])


class SpilledDisplayTests(InterpreterCase):
    """A display item over ``max_display_bytes`` through the E2B door."""

    policy = code_policy(limits={"max_display_bytes": 2000})

    @inlineCallbacks
    def test_ref_served_on_the_e2b_port(self) -> Any:
        """
        A spilled item comes in the result's ``extra.sandboxd_refs``, and its
        URL is served on the E2B port (all an E2B client has), the bytes its
        ref describes: the decoded PNG, the text.
        """
        from e2b_code_interpreter import Sandbox

        sbx = Sandbox.create()
        out = yield self.sdk(
            sbx.run_code,
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\n"
            "display('x' * 3000)",
        )
        self.assertIsNone(out.error)
        refs = [ref for r in out.results for ref in r.extra["sandboxd_refs"]]
        self.assertEqual(
            sorted(ref["mime"] for ref in refs), ["image/png", "text/plain"]
        )
        for ref in refs:
            url = self.e2b_url + ref["url"]
            body = yield self.sdk(lambda u=url: urllib.request.urlopen(u).read())
            self.assertEqual(
                (len(body), hashlib.sha256(body).hexdigest()),
                (ref["bytes"], ref["sha256"]),
            )
            if ref["mime"] == "image/png":
                self.assertTrue(body.startswith(b"\x89PNG"))


class DeadDefaultTests(InterpreterCase):
    """``params.auto_restart: false``: a default context whose kernel dies."""

    policy = code_policy(params={"auto_restart": False})
    kernel = "bash"

    @inlineCallbacks
    def test_dead_default_restarted(self) -> Any:
        """
        Each time the default's kernel dies, the next run_code restarts it:
        the same context, its state new, and no dead context left holding
        one of the identity's slots (five deaths, four slots).
        """
        from e2b_code_interpreter import Sandbox

        sbx = Sandbox.create()
        yield self.sdk(sbx.run_code, "NAME=ada", language="bash")
        listed = yield self.sdk(sbx.list_code_contexts)
        ids = [c.id for c in listed]
        self.assertEqual(len(ids), 1)
        for _ in range(5):
            died = yield self.sdk(sbx.run_code, "kill -9 $PPID", language="bash")
            self.assertEqual(died.error.name, "ContextRestarting")
            out = yield self.sdk(sbx.run_code, 'echo "[$NAME]"', language="bash")
            self.assertEqual(out.logs.stdout, ["[]\n"])
            listed = yield self.sdk(sbx.list_code_contexts)
            self.assertEqual([c.id for c in listed], ids)


class TokenModeTests(CodeInterpreterTests):
    """Token mode: /execute carries X-Access-Token, /contexts* the traffic token."""

    policy = {
        "groups": {"code": True},
        "auth": {"tokens": [{"id": "agent", "token_env": "AGENT", "scopes": ["*"]}]},
        **KERNEL_START,
    }
    environ = {"AGENT": "tok-123"}
    token = "tok-123"

    def code_sandbox(self, token: str | None = None, traffic: str | None = None) -> Any:
        return super().code_sandbox(token="tok-123", traffic="tok-123")

    @inlineCallbacks
    def test_no_token_refused(self) -> Any:
        """Without the traffic token, /contexts is 401 (never served unauthenticated)."""
        sbx = super().code_sandbox(token="tok-123", traffic=None)
        result = yield self.sdk(caught, sbx.list_code_contexts)
        self.assertIsInstance(result, Exception)
        self.assertIn("401", str(result))


class SeedSdkTests(E2BCase):
    """
    The seed SDK's ``agent_sandbox.code_interpreter`` in debug mode: it
    reaches the code interpreter at ``localhost:49999``, so the door's
    second listener (``--e2b-code-port``) serves it; the test points the
    SDK's port constant at the kernel-chosen one.
    """

    policy = {"groups": {"code": True}, **KERNEL_START}
    call_seconds = KERNEL_CALL_SECONDS
    timeout = KERNEL_CASE_SECONDS

    def setUp(self) -> Any:
        need_ipykernel()
        try:
            from agent_sandbox.code_interpreter import code_interpreter_sync
        except ImportError:
            raise SkipTest("agent-sandbox-client is not installed") from None
        self.module = code_interpreter_sync
        return super().setUp()

    @inlineCallbacks
    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        kwargs.setdefault("e2b_code_port", "tcp:0:interface=127.0.0.1")
        daemon = yield super().start(stop_at_end, **kwargs)
        code_port = daemon.context.e2b.code_port.getHost().port
        self.patch(self.module, "JUPYTER_PORT", code_port)
        return daemon

    @inlineCallbacks
    def test_run_code(self) -> Any:
        """State, a PNG, an error and a context through the second listener."""
        from agent_sandbox.code_interpreter import Sandbox

        sbx = Sandbox.create()
        yield self.sdk(sbx.run_code, "y = 20")
        out = yield self.sdk(sbx.run_code, "y * 2 + 2")
        self.assertEqual(out.text, "42")
        plot = yield self.sdk(
            sbx.run_code,
            "import matplotlib.pyplot as plt\nplt.bar([1, 2], [3, 4])\nplt.show()",
        )
        self.assertTrue(base64.b64decode(plot.results[0].png).startswith(b"\x89PNG"))
        failed = yield self.sdk(sbx.run_code, "raise ValueError('no')")
        self.assertEqual((failed.error.name, failed.error.value), ("ValueError", "no"))
        ctx = yield self.sdk(sbx.create_code_context)
        fresh = yield self.sdk(sbx.run_code, "'y' in globals()", context=ctx)
        self.assertEqual(fresh.text, "False")


class ReloadTests(InterpreterCase):
    """A policy reload ends a run_code whose caller it no longer lets in."""

    autostart = False
    environ = {"AGENT": "agent-token", "KEEPER": "keeper-token"}

    def tokens_policy(self, *ids: str) -> dict[str, Any]:
        tokens = [{"id": i, "token_env": i.upper(), "scopes": ["*"]} for i in ids]
        return {
            **KERNEL_START,
            "groups": {"e2b": True, "code": True},
            "auth": {"tokens": tokens},
        }

    @inlineCallbacks
    def test_a_removed_tokens_run_code_ends(self) -> Any:
        """
        Taking a token out of the policy ends its running ``run_code`` at
        the reload: the SDK's execution holds an error saying why, and the
        code was interrupted.
        """
        yield self.start_on_policy_file(self.tokens_policy("agent", "keeper"))
        sbx = self.code_sandbox(token="agent-token")
        yield self.sdk(sbx.run_code, "import time")
        marker = os.path.join(self.base_dir, "finished")
        up = threading.Event()
        running = self.sdk(
            sbx.run_code,
            f"print('up', flush=True); time.sleep(8); open({marker!r}, 'w').close()",
            on_stdout=lambda _: up.set(),
        )
        for _ in range(200):
            if up.is_set():
                break
            yield self.sdk(time.sleep, 0.05)
        self.reload_policy(self.tokens_policy("keeper"))
        started = time.monotonic()
        execution = yield running
        self.assertLess(time.monotonic() - started, 5)
        self.assertIsNotNone(execution.error, execution)
        self.assertIn("agent", execution.error.value)
        yield self.sdk(time.sleep, 8)
        self.assertFalse(os.path.exists(marker))


def _held_for_clients() -> int:
    """Bytes the reactor's TCP connections hold, waiting for their clients."""
    held = 0
    for writer in reactor.getWriters():
        buffer = getattr(writer, "dataBuffer", None)
        if buffer is not None:
            held += len(buffer) - writer.offset + writer._tempDataLen
    return held


class SlowReaderTests(InterpreterCase):
    """``/execute`` to a client that reads nothing: the daemon holds the log's bound."""

    policy = code_policy(limits={"max_event_bytes": 2 * 1024 * 1024})

    @inlineCallbacks
    def test_unread_output_waits_in_the_log(self) -> Any:
        """
        40 MB printed to a ``run_code`` client that reads none of it: the
        connection holds little (the rest waits in the execution's log,
        bounded by ``max_event_bytes``); once the client reads, the stream
        says how much was dropped meanwhile and ends as usual, with the
        output's end (was: the whole output queued for the socket).
        """
        import http.client
        import socket

        def open_stream() -> Any:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            sock.connect(("127.0.0.1", self.e2b_port))
            conn = http.client.HTTPConnection("127.0.0.1", self.e2b_port)
            conn.sock = sock
            code = (
                "import sys\nblock = ('x' * 1023 + '\\n') * 1024\n"
                "for i in range(40):\n    sys.stdout.write(block)\n"
                "print('the end')"
            )
            conn.request(
                "POST",
                "/execute",
                json.dumps({"code": code}),
                {"Content-Type": "application/json"},
            )
            response = conn.getresponse()
            assert response.status == 200, response.read()
            return conn, response

        conn, response = yield self.sdk(open_stream)
        self.addCleanup(conn.close)
        service = self.daemon.context.code.get()
        for _ in range(1200):
            runs = [
                x for ctx in service.contexts.values() for x in ctx.executions.values()
            ]
            if runs and all(x.done for x in runs):
                break
            yield self.sdk(time.sleep, 0.05)
        self.assertEqual([x.state for x in runs], ["ok"])
        self.assertLess(runs[0].log.retained_bytes, 3 * 1024 * 1024)
        held = _held_for_clients()
        self.assertLess(held, 4 * 1024 * 1024, f"{held} bytes held for the client")
        body = yield self.sdk(response.read)
        lines = [json.loads(line) for line in body.splitlines()]
        self.assertEqual(lines[-1], {"type": "end_of_execution"})
        stdout = "".join(line["text"] for line in lines if line["type"] == "stdout")
        self.assertTrue(stdout.endswith("the end\n"))
        self.assertLess(len(stdout), 20 * 1024 * 1024)
        notes = [line["text"] for line in lines if line["type"] == "stderr"]
        self.assertEqual(len(notes), 1)
        self.assertIn("outputs dropped", notes[0])


#: Code that ignores every interrupt.  (A bare ``except:`` retry loop is
#: not deaf for certain: an interrupt landing outside its ``try`` ends it.)
DEAF_PYTHON = (
    "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "while True:\n    time.sleep(0.2)"
)


class AbandonTests(InterpreterCase):
    """
    A ``run_code`` whose client leaves (the SDK's ``timeout``) on code that
    will not be interrupted: the kernel is restarted after the grace, and
    the next call says so.
    """

    policy = code_policy(limits={"interrupt_grace_seconds": 1})

    @inlineCallbacks
    def test_deaf_python_restarted_and_said(self) -> Any:
        """
        After a client timeout on a loop that catches KeyboardInterrupt, the
        next run_code answers at once (not after the policy timeout) and
        its stderr says the kernel was restarted, as its NameError shows
        (was: it waited for the policy timeout, then ran in a fresh kernel
        with no word of it).
        """
        sbx = self.code_sandbox()
        yield self.sdk(sbx.run_code, "y = 5")
        left = yield self.sdk(caught, lambda: sbx.run_code(DEAF_PYTHON, timeout=2))
        self.assertIsInstance(left, Exception)
        yield self.sdk(time.sleep, 3)
        started = time.monotonic()
        after = yield self.sdk(sbx.run_code, "y")
        self.assertLess(time.monotonic() - started, 20)
        self.assertEqual(after.error.name, "NameError")
        self.assertIn(
            "the kernel was restarted (disconnected)", "".join(after.logs.stderr)
        )


class BashAbandonTests(InterpreterCase):
    """The same with the built-in bash kernel and a shell that traps SIGINT."""

    policy = AbandonTests.policy
    kernel = "bash"

    @inlineCallbacks
    def test_deaf_shell_restarted_and_said(self) -> Any:
        """
        ``trap '' INT`` and a loop, left by its client: the next bash
        run_code answers at once, in a fresh shell, and says so (was: 67 s
        and an empty line).
        """
        sbx = self.code_sandbox()
        yield self.sdk(sbx.run_code, "X=kept", language="bash")
        left = yield self.sdk(
            caught,
            lambda: sbx.run_code(
                "trap '' INT; while true; do sleep 0.2; done",
                language="bash",
                timeout=2,
            ),
        )
        self.assertIsInstance(left, Exception)
        yield self.sdk(time.sleep, 3)
        started = time.monotonic()
        after = yield self.sdk(sbx.run_code, 'echo "[$X]"', language="bash")
        self.assertLess(time.monotonic() - started, 20)
        self.assertEqual("".join(after.logs.stdout), "[]\n")
        self.assertIn(
            "the kernel was restarted (disconnected)", "".join(after.logs.stderr)
        )


class QueuedBehindAbandonTests(InterpreterCase):
    """A run_code queued behind an abandoned cell that will not stop."""

    # Longer than the SDK takes to give up on its call: the deaf cell
    # still holds the kernel when the next call is sent.
    policy = code_policy(limits={"interrupt_grace_seconds": 8})

    @inlineCallbacks
    def test_queued_behind_a_deaf_cell_told(self) -> Any:
        """
        A run_code sent while the abandoned cell still holds the kernel
        does not run in the fresh kernel: it ends ``ContextRestarting``
        saying it did not run; the call after it runs normally.
        """
        sbx = self.code_sandbox()
        yield self.sdk(sbx.run_code, "y = 5")
        left = yield self.sdk(caught, lambda: sbx.run_code(DEAF_PYTHON, timeout=1))
        self.assertIsInstance(left, Exception)
        ctx = next(iter(self.daemon.context.code.get().contexts.values()))
        if ctx.current is None:
            raise SkipTest("the kernel was restarted before the next call was sent")
        queued = yield self.sdk(sbx.run_code, "open('ran', 'w').close()")
        self.assertEqual(queued.error.name, "ContextRestarting")
        self.assertIn("did not run", queued.error.value)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "ran")))
        fresh = yield self.sdk(sbx.run_code, "1 + 1")
        self.assertEqual(fresh.text, "2")


class PolicyTimeoutTests(InterpreterCase):
    """A policy timeout through the E2B door: one error, with the kernel's traceback."""

    policy = code_policy(limits={"timeout_seconds": 2, "interrupt_grace_seconds": 30})

    @inlineCallbacks
    def test_timeout_error_keeps_the_traceback(self) -> Any:
        """
        The execution's one error is ``TimeoutError``, and its traceback is
        the kernel's, naming the function the code was stuck in (was: a
        KeyboardInterrupt error line, then a bare TimeoutError, the one the
        SDK keeps, with no traceback).
        """
        sbx = self.code_sandbox()
        errors: list[Any] = []
        out = yield self.sdk(
            sbx.run_code,
            "import time\ndef stuck_here():\n    time.sleep(100)\nstuck_here()",
            timeout=0,
            on_error=errors.append,
        )
        self.assertEqual(len(errors), 1)
        self.assertEqual(out.error.name, "TimeoutError")
        self.assertIn("KeyboardInterrupt", out.error.value)
        self.assertIn("stuck_here", out.error.traceback)


class LostExecutionTests(SynchronousTestCase):
    """What an execution that ended without finishing says to an E2B client."""

    def error_of(self, reason: str | None) -> dict[str, Any]:
        data: dict[str, Any] = {"state": "lost"}
        if reason is not None:
            data["reason"] = reason
        lines = lines_of(Event(1, "execution.ended", data, 0))
        self.assertEqual(lines[-1], {"type": "end_of_execution"})
        (error,) = [line for line in lines if line["type"] == "error"]
        return error

    def test_removed_context_is_not_a_restart(self) -> None:
        """
        A context removed (or a daemon stopped) under a running execution
        says so by name, not ``ContextRestarting``, and in words, not the
        internal ``lost (closed)``.
        """
        error = self.error_of("closed")
        self.assertEqual(error["name"], "ContextClosed")
        self.assertIn("the context was removed, or the daemon stopped", error["value"])

    def test_restart_and_death_say_what_happened(self) -> None:
        """A restart and a kernel's death are ``ContextRestarting`` saying which."""
        restarted, died = self.error_of("user"), self.error_of("died")
        self.assertEqual(restarted["name"], "ContextRestarting")
        self.assertIn(
            "the context was restarted while this code ran", restarted["value"]
        )
        self.assertEqual(died["name"], "ContextRestarting")
        self.assertIn("kernel died", died["value"])
        for error in (restarted, died, self.error_of(None)):
            self.assertNotIn("ended lost", error["value"])
