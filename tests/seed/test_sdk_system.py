"""
The seed SDK's top-level calls (``health``, ``discover``, ``check``),
``server.system`` and ``server.devtools`` against a real daemon, through
its async and its sync face, with the seed's own server as the control.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.defer import inlineCallbacks

from tests.seed.sdkcase import CompareCase, Face, outcome

#: Both servers: the dev tools on (they are opt-in on each).
POLICY = {"groups": {"dev_tools": True}}

#: A variable the scenario sets through the SDK.
VARIABLE = "SEED_WIRE_VARIABLE"


def make_repo(base: str) -> None:
    """A git repository with one commit, one change and one new file."""

    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
            cwd=os.path.join(base, "repo"),
            check=True,
            capture_output=True,
            timeout=30,
        )

    os.makedirs(os.path.join(base, "repo"))
    git("init", "-q", "-b", "main")
    with open(os.path.join(base, "repo", "a.txt"), "w") as f:
        f.write("one\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "first")
    with open(os.path.join(base, "repo", "a.txt"), "w") as f:
        f.write("one\ntwo\n")
    with open(os.path.join(base, "repo", "new.txt"), "w") as f:
        f.write("new\n")


async def core_scenario(c: Any, base: str, call: Face) -> dict[str, Any]:
    """``health``, ``check`` and ``discover``, and what discovery then refuses."""
    out: dict[str, Any] = {}
    stranger = c.with_token("not-the-token")
    out["health"] = await outcome(call(c.health))
    out["health_stranger"] = await outcome(call(stranger.health))
    out["stranger"] = await outcome(call(stranger.files.list, base))
    await stranger.aclose()
    out["check"] = await outcome(call(c.check, "files_list", path=base))
    outside = await outcome(call(c.check, "files_list", path="/etc"))
    # The reason is a sentence of each server's own.
    out["check_outside"] = (
        outside
        if isinstance(outside, BaseException)
        else (
            outside.endpoint,
            outside.allowed,
            outside.code,
        )
    )
    caps = await outcome(call(c.discover))
    out["discover"] = type(caps)
    if not isinstance(caps, BaseException):
        out["can"] = [
            caps.can(e) for e in ("files_list", "code_run", "browser_navigate", "shell")
        ]
        # Known to be off: refused before any request is sent.
        out["disabled"] = await outcome(call(c.browser.navigate, "http://example.com"))
    return out


async def system_scenario(c: Any, base: str, call: Face) -> dict[str, Any]:
    """Every ``server.system`` method."""
    s = c.system
    out: dict[str, Any] = {}
    info = await outcome(call(s.info))
    out["info"] = type(info)
    out["info_filled"] = [
        bool(getattr(info, k)) for k in ("os", "arch", "cpu_count", "python_version")
    ]
    metrics = await outcome(call(s.metrics))
    out["metrics"] = type(metrics)
    out["metrics_filled"] = [bool(metrics.memory_total_mb), bool(metrics.disk_total_gb)]
    out["env_path"] = sorted(await call(s.env, ["PATH"]))
    out["env_token"] = "ABX_SERVER_TOKEN" in await call(s.env)
    out["set_env"] = await outcome(call(s.set_env, {VARIABLE: "set by the SDK"}))
    out["env_set"] = await outcome(call(s.env, [VARIABLE]))
    out["set_protected"] = await outcome(call(s.set_env, {"ABX_SERVER_TOKEN": "x"}))
    ports = await outcome(call(s.ports))
    own = urlsplit(c.base_url).port
    out["ports"] = sorted({type(p).__name__ for p in ports})
    out["ports_own"] = any(p.port == own for p in ports)
    packages = await outcome(call(s.packages))
    out["packages"] = (type(packages), packages.manager, bool(packages.packages))
    out["packages_unknown"] = await outcome(call(s.packages, "nosuch"))
    return out


async def devtools_scenario(c: Any, base: str, call: Face) -> dict[str, Any]:
    """Every ``server.devtools`` method."""
    d = c.devtools
    out: dict[str, Any] = {}
    out["python"] = await outcome(call(d.run_code, "print(6 * 7)"))
    out["bash"] = await outcome(call(d.run_code, "echo hi; exit 3", "bash"))
    out["language"] = await outcome(call(d.run_code, "x", "cobol"))
    repo = base + "/repo"
    out["status"] = await outcome(call(d.git_status, repo))
    diff = await outcome(call(d.git_diff, repo))
    out["diff"] = type(diff)
    out["diff_text"] = "+two" in diff.diff
    out["diff_staged"] = (await call(d.git_diff, repo, staged=True)).diff
    out["diff_file"] = "+two" in (await call(d.git_diff, repo, file="a.txt")).diff
    return out


class SystemTests(CompareCase):
    """Core, system and dev-tool calls give on sandboxd what they give on the seed."""

    policy = POLICY

    def setUp(self) -> Any:
        path = os.path.join(os.path.realpath(self.mktemp()) + "-policy.json")
        with open(path, "w") as f:
            json.dump(POLICY, f)
        self.reference_args = ("--policy", path)
        self.addCleanup(os.environ.pop, VARIABLE, None)
        return super().setUp()

    @inlineCallbacks
    def check_core(self, sync: bool) -> Any:
        from agent_sandbox.api.server_capabilities import ServerCapabilities
        from agent_sandbox.models.errors import (
            EndpointNotAvailableError,
            ServerAuthError,
        )
        from agent_sandbox.models.server import PathDecision

        ours, seed, dirs = yield self.both(core_scenario, sync)
        self.assertSameShapes(ours, seed, dirs)
        self.assertEqual((ours["health"], ours["health_stranger"]), (True, True))
        self.assertIsInstance(ours["stranger"], ServerAuthError)
        check = ours["check"]
        self.assertIsInstance(check, PathDecision)
        self.assertEqual(
            (check.endpoint, check.allowed, check.code), ("files_list", True, None)
        )
        self.assertEqual(
            ours["check_outside"], ("files_list", False, "path_not_allowed")
        )
        self.assertIs(ours["discover"], ServerCapabilities)
        self.assertEqual(ours["can"], [True, True, False, True])
        self.assertIsInstance(ours["disabled"], EndpointNotAvailableError)

    def test_core_async(self) -> Any:
        """health, check, discover and a wrong token, through the async face."""
        return self.check_core(sync=False)

    def test_core_sync(self) -> Any:
        """The same through the ``*_sync`` face."""
        return self.check_core(sync=True)

    @inlineCallbacks
    def check_system(self, sync: bool) -> Any:
        from agent_sandbox.models.errors import PolicyDeniedError, ServerAPIError
        from agent_sandbox.models.server import PackageList, SystemInfo, SystemMetrics

        ours, seed, dirs = yield self.both(system_scenario, sync)
        self.assertSameShapes(ours, seed, dirs)
        self.assertEqual((ours["info"], ours["metrics"]), (SystemInfo, SystemMetrics))
        self.assertEqual(ours["info_filled"], [True] * 4)
        self.assertEqual(ours["env_path"], ["PATH"])
        self.assertFalse(ours["env_token"])
        self.assertEqual(ours["set_env"], [VARIABLE])
        self.assertEqual(ours["env_set"], {VARIABLE: "set by the SDK"})
        self.assertIsInstance(ours["set_protected"], PolicyDeniedError)
        self.assertEqual((ours["ports"], ours["ports_own"]), (["ListeningPort"], True))
        self.assertEqual(ours["packages"], (PackageList, "pip", True))
        self.assertIsInstance(ours["packages_unknown"], ServerAPIError)

    def test_system_async(self) -> Any:
        """Every server.system method through the async face."""
        return self.check_system(sync=False)

    def test_system_sync(self) -> Any:
        """The same through the ``*_sync`` face."""
        return self.check_system(sync=True)

    @inlineCallbacks
    def check_devtools(self, sync: bool) -> Any:
        from agent_sandbox.models.errors import ServerAPIError
        from agent_sandbox.models.server import CodeRunResult, GitDiff, GitStatus

        ours, seed, dirs = yield self.both(devtools_scenario, sync, make_repo)
        self.assertSameShapes(ours, seed, dirs)
        python = ours["python"]
        self.assertIsInstance(python, CodeRunResult)
        self.assertEqual(
            (python.stdout, python.exit_code, python.language), ("42\n", 0, "python")
        )
        self.assertEqual((ours["bash"].stdout, ours["bash"].exit_code), ("hi\n", 3))
        self.assertIsInstance(ours["language"], ServerAPIError)
        status = ours["status"]
        self.assertIsInstance(status, GitStatus)
        self.assertEqual((status.branch, status.clean), ("main", False))
        # Not a repository inside the boundary (the seed would use the
        # checkout these tests run in, above its base dir).
        outside = yield self.drive(lambda c: outcome(c.devtools.git_status(dirs[0])))
        self.assertIsInstance(outside, ServerAPIError)
        self.assertIs(ours["diff"], GitDiff)
        self.assertEqual((ours["diff_text"], ours["diff_file"]), (True, True))
        self.assertEqual(ours["diff_staged"], "")

    def test_devtools_async(self) -> Any:
        """run_code, git_status and git_diff through the async face."""
        return self.check_devtools(sync=False)

    def test_devtools_sync(self) -> Any:
        """The same through the ``*_sync`` face."""
        return self.check_devtools(sync=True)
