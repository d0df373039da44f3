"""
The seed SDK's own E2B fork (``agent_sandbox.Sandbox``, a copy of e2b
2.31 under ``agent_sandbox._standard``) through sandboxd's E2B port, in
debug mode: the E2B SDK tests, run again with the fork in the SDK's place.

For each test, ``e2b`` and its modules are the fork's (the fork is the
same code under another name), so every call the tests make goes through
the code a seed user runs.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest

from tests.e2b import test_policy, test_sdk

#: Where the seed's SDK keeps its E2B fork.
FORK = "agent_sandbox._standard"

#: The fork's modules the tests name through ``e2b``.
NAMED = (
    "connection_config",
    "envd.versions",
    "exceptions",
    "sandbox.commands.command_handle",
    "sandbox.filesystem.filesystem",
    "sandbox.filesystem.watch_handle",
    "sandbox_sync.main",
    "sandbox_async.main",
)


def fork_modules() -> dict[str, ModuleType]:
    """Every loaded module of the fork under its ``e2b`` name."""
    try:
        for name in NAMED:
            importlib.import_module(f"{FORK}.{name}")
    except ImportError as e:
        raise SkipTest(
            f"agent-sandbox-client's E2B fork is not installed: {e}"
        ) from None
    return {
        "e2b" + name[len(FORK) :]: module
        for name, module in list(sys.modules.items())
        if name == FORK or name.startswith(FORK + ".")
    }


class ForkInPlace:
    """A mixin: for the test's duration, ``import e2b`` gives the seed's fork."""

    def setUp(self) -> Any:
        aliases = fork_modules()
        saved = {name: sys.modules.get(name) for name in aliases}

        def restore() -> None:
            for name, module in saved.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module

        self.addCleanup(restore)  # type: ignore[attr-defined]
        sys.modules.update(aliases)
        return super().setUp()  # type: ignore[misc]


class ForkCommandTests(ForkInPlace, test_sdk.CommandTests):
    """The fork's ``sbx.commands``."""


class ForkFileTests(ForkInPlace, test_sdk.FileTests):
    """The fork's ``sbx.files``."""


class ForkPtyTests(ForkInPlace, test_sdk.PtyTests):
    """The fork's ``sbx.pty``."""


class ForkAsyncTests(ForkInPlace, test_sdk.AsyncSdkTests):
    """The fork's ``AsyncSandbox``."""


class ForkTokenTests(ForkInPlace, test_policy.TokenTests):
    """The fork's access token: scopes and refusals as the E2B SDK sees them."""


class ForkPathTests(ForkInPlace, test_policy.PathTests):
    """The fork's writes outside the boundary are refused."""


class ForkTests(ForkInPlace, test_sdk.E2BCase):
    """What is the fork's own, and what the E2B SDK tests leave out."""

    def test_the_fork_is_what_runs(self) -> None:
        """``e2b.Sandbox`` is the seed SDK's ``agent_sandbox.Sandbox`` here."""
        import agent_sandbox
        import e2b

        self.assertIs(e2b.Sandbox, agent_sandbox.Sandbox)
        self.assertTrue(e2b.Sandbox.__module__.startswith(FORK))

    @inlineCallbacks
    def test_urls_connect_and_git(self) -> Any:
        """
        upload_url and download_url carry a file through the door's REST
        routes; commands.connect follows a running command to its end;
        sbx.git (commands underneath) makes and reads a repository.
        """
        import httpx

        def job() -> Any:
            sbx = self.sandbox()
            posted = httpx.post(
                sbx.upload_url("up.txt"), files={"file": ("up.txt", b"via url")}
            )
            fetched = httpx.get(sbx.download_url("up.txt"))
            handle = sbx.commands.run("sleep 0.5; echo done", background=True)
            followed = sbx.commands.connect(handle.pid).wait()
            sbx.git.init("repo")
            sbx.files.write("repo/new.txt", "x")
            status = sbx.git.status("repo")
            return posted.status_code, fetched.content, followed, status

        posted, fetched, followed, status = yield self.sdk(job)
        self.assertEqual((posted, fetched), (200, b"via url"))
        with open(os.path.join(self.base_dir, "up.txt"), "rb") as f:
            self.assertEqual(f.read(), b"via url")
        self.assertEqual((followed.stdout, followed.exit_code), ("done\n", 0))
        self.assertIn("new.txt", [f.name for f in status.file_status])
