# -*- test-case-name: tests.e2b.test_token_mode -*-
"""
The E2B SDK with a token, exactly as ``docs/e2b.md`` shows it: the
documented exports and snippet, run by a fresh interpreter whose
environment holds nothing else, against a real daemon with a token.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SkipTest

from tests.e2b.sdk import E2BCase
from tests.kernels.test_contexts import (
    KERNEL_CASE_SECONDS,
    KERNEL_START,
    need_ipykernel,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def documented() -> tuple[dict[str, str], str]:
    """The exports and the Python snippet of docs/e2b.md's token section."""
    with open(os.path.join(ROOT, "docs", "e2b.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("### With a token") :]
    sh = re.search(r"```sh\n(.*?)```", section, re.S)
    py = re.search(r"```python\n(.*?)```", section, re.S)
    assert sh is not None and py is not None
    exports: dict[str, str] = {}
    for line in sh.group(1).splitlines():
        words = shlex.split(line, posix=True)
        assert words[0] == "export", line
        for word in words[1:]:
            name, _, value = word.partition("=")
            exports[name] = value
    return exports, py.group(1)


class DocumentedCase(E2BCase):
    """A token-mode door, and the docs' exports for a fresh interpreter."""

    token = "e2b-token-mode-secret"

    def run_snippet(self, key: str) -> Any:
        """The docs' snippet, with the docs' exports and ``key`` as the token."""
        return self.run_python(documented()[1], key)

    @inlineCallbacks
    def run_python(self, snippet: str, key: str) -> Any:
        """``snippet`` in a fresh interpreter with the docs' exports only."""
        exports, _ = documented()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.mktemp()}
        for name, value in exports.items():
            value = value.replace("http://127.0.0.1:49983", self.e2b_url)
            if "$(cat /etc/sandboxd/token)" in value:
                value = key
            env[name] = value
        done = yield deferToThread(
            subprocess.run,
            [sys.executable, "-c", snippet],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return done


class TokenModeTests(DocumentedCase):
    """The documented token recipe works, and a wrong key is refused."""

    @inlineCallbacks
    def test_documented_snippet(self) -> Any:
        """The docs' exports and snippet print hi and hello through a token-mode door."""
        yield self.start()
        done = yield self.run_snippet(self.token)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, "hi\n\nhello\n")
        with open(os.path.join(self.base_dir, "notes.txt")) as f:
            self.assertEqual(f.read(), "hello")

    @inlineCallbacks
    def test_connect_by_id(self) -> Any:
        """``Sandbox.connect("sandboxd")``, as the SDK sends it now, reaches the same machine."""
        yield self.start()
        snippet = (
            "from e2b import Sandbox\n"
            "sbx = Sandbox.connect('sandboxd')\n"
            "print(sbx.sandbox_id)\n"
            "print(sbx.commands.run('echo hi').stdout, end='')\n"
        )
        done = yield self.run_python(snippet, self.token)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, "sandboxd\nhi\n")

    @inlineCallbacks
    def test_wrong_key_refused_at_create(self) -> Any:
        """A key that is no token fails Sandbox.create() with the door's 401."""
        yield self.start()
        done = yield self.run_snippet("not-a-token")
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("401", done.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "notes.txt")))

    @inlineCallbacks
    def test_create_options_it_cannot_honour_are_refused(self) -> Any:
        """
        ``Sandbox.create()`` with an option this sandbox cannot honour (no
        internet, network rules, a sandbox-wide environment, another
        template, a pause lifecycle) fails naming the option, rather than
        hand back a sandbox code would take for offline or configured;
        options that change nothing code relies on still create it.
        """
        yield self.start()
        snippet = (
            "from e2b import Sandbox\n"
            "calls = [\n"
            "    ('offline', dict(allow_internet_access=False)),\n"
            "    ('network', dict(network={'deny_out': ['0.0.0.0/0']})),\n"
            "    ('envs', dict(envs={'FOO': 'bar'})),\n"
            "    ('template', dict(template='my-template')),\n"
            "    ('lifecycle', dict(lifecycle={'on_timeout': 'pause'})),\n"
            "    ('fine', dict(metadata={'k': 'v'}, timeout=120,"
            " allow_internet_access=True)),\n"
            "]\n"
            "for name, kw in calls:\n"
            "    try:\n"
            "        print(name, 'ok', Sandbox.create(**kw).sandbox_id)\n"
            "    except Exception as e:\n"
            "        print(name, type(e).__name__, e)\n"
        )
        done = yield self.run_python(snippet, self.token)
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
        self.assertEqual(lines["fine"], "ok sandboxd")
        for name, option in (
            ("offline", "Sandbox.create(allow_internet_access=False)"),
            ("network", "Sandbox.create(network=...)"),
            ("envs", "Sandbox.create(envs=...)"),
            ("template", "Sandbox.create(template='my-template')"),
            ("lifecycle", "Sandbox.create(lifecycle=...)"),
        ):
            self.assertIn(option + " cannot be honoured", lines[name])
            self.assertIn("400", lines[name])

    @inlineCallbacks
    def test_calls_not_served(self) -> Any:
        """
        With the key ``Sandbox.create()`` took, ``set_timeout`` is done (the
        machine has no timeout), ``connect`` to another id is not found,
        and ``get_info`` and ``Sandbox.list`` say this port does not serve
        them: none of them blames the credentials.
        """
        yield self.start()
        snippet = (
            "from e2b import Sandbox\n"
            "sbx = Sandbox.create()\n"
            "calls = [\n"
            "    ('set_timeout', lambda: sbx.set_timeout(600)),\n"
            "    ('connect', lambda: Sandbox.connect('other')),\n"
            "    ('get_info', lambda: sbx.get_info()),\n"
            "    ('list', lambda: Sandbox.list().next_items()),\n"
            "]\n"
            "for name, call in calls:\n"
            "    try:\n"
            "        print(name, 'ok', call())\n"
            "    except Exception as e:\n"
            "        print(name, type(e).__name__, e)\n"
        )
        done = yield self.run_python(snippet, self.token)
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
        self.assertEqual(lines["set_timeout"], "ok None")
        # The SDK's own words for a 404 there ("Paused sandbox other not found").
        self.assertTrue(lines["connect"].startswith("SandboxNotFoundException"))
        self.assertIn("other not found", lines["connect"])
        for name in ("get_info", "list"):
            self.assertIn("501: ", lines[name])
            self.assertIn("this port does not serve", lines[name])
            self.assertNotIn("credentials", lines[name])

    @inlineCallbacks
    def test_seed_fork_creates(self) -> Any:
        """
        agent-sandbox-client's ``agent_sandbox.Sandbox.create()``, with the
        docs' exports and the token as its key, reaches the machine: its
        fork posts to ``POST /sandboxes``, served as ``POST /v2/sandboxes``
        (was: 401 "please check your credentials" for a valid token).
        """
        yield self.start()
        snippet = (
            "from agent_sandbox import Sandbox\n"
            "sbx = Sandbox.create()\n"
            "print(sbx.sandbox_id)\n"
            "print(sbx.commands.run('echo hi').stdout, end='')\n"
        )
        done = yield self.run_python(snippet, self.token)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, "sandboxd\nhi\n")
        done = yield self.run_python(snippet, "not-a-token")
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("AuthenticationException", done.stderr)


class CodeInterpreterTokenTests(DocumentedCase):
    """
    ``e2b_code_interpreter`` set up as the docs lead (``Sandbox.create()``
    or ``connect()`` with the token as the API key): its context calls
    carry the token too.
    """

    policy = {"groups": {"code": True}, **KERNEL_START}
    timeout = KERNEL_CASE_SECONDS

    def setUp(self) -> Any:
        need_ipykernel()
        try:
            import e2b_code_interpreter  # noqa: F401
        except ImportError:
            raise SkipTest("e2b-code-interpreter is not installed") from None
        return super().setUp()

    @inlineCallbacks
    def test_contexts_after_create_and_connect(self) -> Any:
        """
        After ``Sandbox.create()`` and ``Sandbox.connect("sandboxd")``,
        ``create/list/restart/remove_code_context`` and ``run_code`` in the
        new context all work (was: 401 on every ``/contexts*`` call: the
        SDK sends a token there only as the sandbox's traffic token, which
        the door's answer did not give).
        """
        yield self.start()
        snippet = (
            "from e2b_code_interpreter import Sandbox\n"
            "for sbx in (Sandbox.create(), Sandbox.connect('sandboxd')):\n"
            "    ctx = sbx.create_code_context()\n"
            "    sbx.run_code('v = 6 * 7', context=ctx)\n"
            "    print(sbx.run_code('v', context=ctx).text)\n"
            "    print(ctx.id in [c.id for c in sbx.list_code_contexts()])\n"
            "    sbx.restart_code_context(ctx)\n"
            "    print(sbx.run_code('v', context=ctx).error.name)\n"
            "    sbx.remove_code_context(ctx)\n"
            "    print(ctx.id in [c.id for c in sbx.list_code_contexts()])\n"
        )
        done = yield self.run_python(snippet, self.token)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, "42\nTrue\nNameError\nFalse\n" * 2)
