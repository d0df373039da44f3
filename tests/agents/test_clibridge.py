"""
Headless coding-agent CLIs behind the ACP bridge, against a real daemon:
fake ``codex``, ``qwen`` and ``claude`` executables on PATH print the
lines the real ones print (``tests/agents/fake_cli.py``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.agents.clibridge import (
    CLIS,
    Bounds,
    Bridge,
    RpcFailure,
    Session,
    Turn,
    invocation,
)
from sandboxd.agents.permissions import headless_access
from sandboxd.agents.process import is_alive
from sandboxd.policy import defaults
from sandboxd.testing import memory_context
from tests.agents.test_agents import AgentsTestCase, agents_policy, on_path

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_CLI = os.path.join(HERE, "fake_cli.py")


def fake_clis(test: Any, names: tuple[str, ...] = ("codex", "qwen", "claude")) -> str:
    """
    Put fake headless CLIs first on ``PATH`` for ``test``, and give it a
    ``HOME`` of its own (the bridge keeps its sessions there); their directory.
    """
    home = os.path.realpath(test.mktemp())
    os.makedirs(home)
    old = os.environ.get("HOME")
    os.environ["HOME"] = home
    test.addCleanup(
        lambda: os.environ.pop("HOME") if old is None else os.environ.update(HOME=old)
    )
    return on_path(
        test, {name: f'exec {sys.executable} {FAKE_CLI} {name} "$@"' for name in names}
    )


def runs(directory: str) -> list[dict[str, Any]]:
    """How the fake CLIs were called in ``directory``, oldest first."""
    try:
        with open(os.path.join(directory, ".fake-cli-runs.jsonl")) as f:
            return [json.loads(line) for line in f]
    except FileNotFoundError:
        return []


class HeadlessTestCase(AgentsTestCase):
    def setUp(self) -> Any:
        self.bin_dir = fake_clis(self)
        return super().setUp()


class HeadlessSessionTests(HeadlessTestCase):
    """The seed's runtimes, run as the seed runs them, through the agents API."""

    @inlineCallbacks
    def test_qwen_code_turns_resume(self) -> Any:
        """
        ``qwen-code`` runs ``qwen`` once per turn: the streamed deltas are the
        agent's message (not sent twice), a tool call is reported, the usage
        is the turn's, and the second turn resumes the CLI's session.
        """
        reply = yield self.create("qwen-code")
        self.assertEqual(reply.status, 201, reply.body)
        body = reply.json()
        sid = body["session_id"]
        self.addCleanup(self.request, "DELETE", f"/agents/sessions/{sid}")
        self.assertEqual(body["agent_info"]["name"], "qwen (headless)")
        reply = yield self.prompt(sid, "echo hello there world")
        self.assertEqual(reply.status, 200, reply.body)
        turn = reply.json()
        self.assertEqual(turn["stop_reason"], "end_turn")
        self.assertEqual(turn["text"], "hello there world")
        reply = yield self.prompt(sid, "run echo from-the-tool")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["text"], "done")
        reply = yield self.request("GET", f"/agents/sessions/{sid}/tool-calls")
        [call] = reply.json()["tool_calls"]
        self.assertEqual(call["kind"], "execute")
        self.assertEqual(call["status"], "completed")
        self.assertEqual(call["title"], "echo from-the-tool")
        first, second = runs(self.base_dir)
        self.assertEqual(first["cli"], "qwen")
        self.assertEqual(first["prompt"], "echo hello there world")
        self.assertFalse([a for a in first["argv"] if a.startswith("--resume")])
        self.assertIn("--resume=sess_fake_1", second["argv"])
        # The default policy asks before edits: the CLI may only plan.
        self.assertEqual(
            first["argv"][first["argv"].index("--approval-mode") + 1], "plan"
        )
        self.assertNotIn("echo hello there world", first["argv"])

    @inlineCallbacks
    def test_codex_without_its_adapter(self) -> Any:
        """
        ``codex`` runs codex-acp where installed; without it, ``codex exec
        --json`` with the prompt on stdin, in the read-only sandbox, never
        asking for approval (nobody could answer).
        """
        sid = yield self.session("codex")
        reply = yield self.prompt(sid, "think -- a prompt that starts like an option")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["text"], "-- a prompt that starts like an option")
        [run] = runs(self.base_dir)
        self.assertEqual(run["argv"][:2], ["exec", "--json"])
        self.assertIn('sandbox_mode="read-only"', run["argv"])
        self.assertIn('approval_policy="never"', run["argv"])
        self.assertEqual(run["argv"][-1], "-")
        reply = yield self.request("GET", f"/agents/sessions/{sid}/messages")
        roles = [m["role"] for m in reply.json()["messages"]]
        self.assertEqual(roles, ["user", "thought", "agent"])

    @inlineCallbacks
    def test_claude_without_its_adapter(self) -> Any:
        """
        ``claude`` runs claude-agent-acp where installed; without it, ``claude
        -p`` with stream-json output, in plan mode under the default policy.
        """
        sid = yield self.session("claude")
        reply = yield self.prompt(sid, "echo from claude")
        self.assertEqual(reply.json()["text"], "from claude", reply.body)
        [run] = runs(self.base_dir)
        self.assertEqual(run["cli"], "claude")
        self.assertEqual(run["argv"][:3], ["-p", "--output-format", "stream-json"])
        mode = run["argv"][run["argv"].index("--permission-mode") + 1]
        self.assertEqual(mode, "plan")

    @inlineCallbacks
    def test_thought_level(self) -> Any:
        """
        codex's reasoning effort is its thought-level option: set at create
        and changed later, each turn runs with the latest; an agent without
        one refuses it (400), and nothing is left running.
        """
        sid = yield self.session("codex", thought_level="medium")
        yield self.prompt(sid, "echo one")
        reply = yield self.request(
            "POST", f"/agents/sessions/{sid}/config", {"thought_level": "low"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        [option] = reply.json()["config_options"]
        self.assertEqual(
            (option["category"], option["currentValue"]), ("thought_level", "low")
        )
        yield self.prompt(sid, "echo two")
        one, two = runs(self.base_dir)
        self.assertIn('model_reasoning_effort="medium"', one["argv"])
        self.assertIn('model_reasoning_effort="low"', two["argv"])
        reply = yield self.create("qwen-code", thought_level="high")
        self.assertEqual(reply.status, 400, reply.body)
        self.assertIn("no reasoning effort setting", reply.json()["error"])
        reply = yield self.request("GET", "/agents/sessions")
        self.assertEqual([s["agent"] for s in reply.json()["sessions"]], ["codex"])

    @inlineCallbacks
    def test_failures(self) -> Any:
        """
        A turn the CLI reports failed, and a CLI that exits with an error,
        fail the turn with the CLI's words; the session takes the next turn.
        """
        sid = yield self.session("codex")
        reply = yield self.prompt(sid, "fail")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["state"], "failed")
        self.assertIn("model said no", reply.json()["error"]["message"])
        reply = yield self.prompt(sid, "crash")
        self.assertEqual(reply.json()["state"], "failed")
        self.assertIn("no credentials", reply.json()["error"]["message"])
        self.assertIn("status 3", reply.json()["error"]["message"])
        reply = yield self.prompt(sid, "echo still here")
        self.assertEqual(reply.json()["text"], "still here")

    @inlineCallbacks
    def test_cancel_ends_the_cli(self) -> Any:
        """A cancelled turn ends ``cancelled`` and its CLI is gone."""
        sid = yield self.session("qwen-code")
        reply = yield self.prompt(sid, "slow", wait=0)
        self.assertEqual(reply.status, 202, reply.body)
        pid_file = os.path.join(self.base_dir, ".fake-cli-pid")
        for _ in range(100):
            if os.path.exists(pid_file):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        with open(pid_file) as f:
            pid = int(f.read())
        self.assertTrue(is_alive(pid))
        reply = yield self.request("POST", f"/agents/sessions/{sid}/cancel", {})
        self.assertEqual(reply.status, 200, reply.body)
        state = yield self.wait_state(sid, ("idle",))
        self.assertEqual(state["stop_reason"], "cancelled")
        for _ in range(50):
            if not is_alive(pid):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(is_alive(pid))

    @inlineCallbacks
    def test_turn_ends_with_the_cli(self) -> Any:
        """
        A process the CLI leaves behind holding its output does not hold
        the turn: it ends with the CLI, after a short grace.
        """
        sid = yield self.session("codex")
        started = reactor.seconds()
        reply = yield self.prompt(sid, "linger answered")
        with open(os.path.join(self.base_dir, ".fake-cli-pid")) as f:
            lingering = int(f.read())
        self.addCleanup(os.kill, lingering, 9)
        self.assertEqual(reply.json()["text"], "answered")
        self.assertLess(reactor.seconds() - started, 10)
        self.assertTrue(is_alive(lingering))

    @inlineCallbacks
    def test_catalogue_shows_what_runs(self) -> Any:
        """The catalogue says an agent is installed, and how it runs."""
        reply = yield self.request("GET", "/agents/catalog")
        shown = {a["id"]: a for a in reply.json()["agents"]}
        self.assertTrue(shown["qwen-code"]["installed"])
        self.assertEqual(shown["qwen-code"]["protocol"], "headless:qwen")
        self.assertEqual(shown["codex"]["protocol"], "headless:codex")
        self.assertEqual(shown["codex"]["path"], os.path.join(self.bin_dir, "codex"))
        self.assertEqual(shown["fake"]["protocol"], "acp")
        reply = yield self.request("GET", "/agents/catalog/qwen-code?probe=true")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["agent_info"]["name"], "qwen (headless)")


class HeadlessNotInstalledTests(AgentsTestCase):
    @inlineCallbacks
    def test_neither_installed(self) -> Any:
        """With neither the adapter nor the CLI on PATH: 503, naming both."""
        old = os.environ.get("PATH", "")
        os.environ["PATH"] = os.path.realpath(self.mktemp())
        self.addCleanup(os.environ.__setitem__, "PATH", old)
        reply = yield self.create("codex")
        self.assertEqual(reply.status, 503, reply.body)
        self.assertEqual(reply.json()["code"], "agent_unavailable")
        self.assertIn("codex-acp or codex not found", reply.json()["error"])


class HeadlessAccessTests(HeadlessTestCase):
    """What the policy answers without a person is what the CLI may do."""

    policy = agents_policy(params={"permission_mode": {"*": "auto"}, "deny_modes": []})

    @inlineCallbacks
    def test_everything_automatic_is_full_access(self) -> Any:
        sid = yield self.session("codex")
        reply = yield self.prompt(sid, "echo ok")
        self.assertEqual(reply.json()["text"], "ok")
        [run] = runs(self.base_dir)
        self.assertIn('sandbox_mode="danger-full-access"', run["argv"])


class AccessTests(SynchronousTestCase):
    """:func:`headless_access` from the policy, in memory."""

    def access(self, **params: Any) -> str:
        rule: dict[str, Any] = {"params": params}
        paths = params.pop("paths", None)
        if paths is not None:
            rule["paths"] = paths
        context = memory_context(
            policy={"groups": {"agents": True}, "endpoints": {"group:agents": rule}}
        )
        return headless_access(context.policy.rule("agents_session_create"))

    def test_default_is_read_only(self) -> None:
        self.assertEqual(self.access(), "read_only")

    def test_edits_automatic(self) -> None:
        mode = {"edit": "auto", "delete": "auto", "move": "auto", "*": "ask"}
        self.assertEqual(self.access(permission_mode=mode), "workspace_write")
        mode = {"edit": "auto", "*": "ask"}
        self.assertEqual(self.access(permission_mode=mode), "read_only")

    def test_full_access_needs_every_condition(self) -> None:
        everything = {"*": "auto"}
        self.assertEqual(
            self.access(permission_mode=everything, deny_modes=[]), "full_access"
        )
        # The default deny_modes refuse the modes that skip permission requests.
        self.assertEqual(self.access(permission_mode=everything), "workspace_write")
        self.assertEqual(
            self.access(
                permission_mode=everything, deny_modes=[], paths={"deny": ["/etc/**"]}
            ),
            "workspace_write",
        )


class ArgvTests(SynchronousTestCase):
    def test_codex_resume_model_and_mcp(self) -> None:
        session = Session(
            "s",
            "/w",
            [{"name": "my_tools", "url": "http://127.0.0.1:9/mcp", "type": "http"}],
            model="gpt-x",
            resume="th_9",
        )
        argv = invocation("codex", "/bin/codex", "workspace_write", session, "").argv
        self.assertEqual(argv[:4], ["/bin/codex", "exec", "resume", "th_9"])
        self.assertIn("--model=gpt-x", argv)
        self.assertIn('mcp_servers.my_tools.url="http://127.0.0.1:9/mcp"', argv)
        self.assertIn('sandbox_mode="workspace-write"', argv)
        self.assertEqual(argv[-1], "-")

    def test_mcp_name_refused(self) -> None:
        for name in ("a=b", 'x".url', "", "a b"):
            session = Session("s", "/w", [{"name": name, "url": "http://x/"}])
            for cli in CLIS:
                self.assertRaises(
                    RpcFailure, invocation, cli, "/bin/x", "read_only", session, ""
                )

    def test_mcp_secrets_stay_off_the_command_line(self) -> None:
        """A header's value reaches each CLI, never through its arguments."""
        server = {
            "type": "http",
            "name": "t",
            "url": "http://x/",
            "headers": [{"name": "Authorization", "value": "Bearer s3cret"}],
        }
        for cli in CLIS:
            call = invocation(
                cli, "/bin/x", "read_only", Session("s", "/w", [server]), ""
            )
            self.assertFalse([a for a in call.argv if "s3cret" in a], cli)
            handed = json.dumps(call.env) + (call.mcp_config or b"").decode()
            self.assertIn("Bearer s3cret", handed, cli)

    def test_claude_full_access_as_root(self) -> None:
        """
        Claude Code's full-access mode as root gets ``IS_SANDBOX=1`` (it
        refuses that mode to root otherwise); nothing else does.
        """
        session = Session("s", "/w", [])
        self.patch(os, "geteuid", lambda: 0)
        call = invocation("claude", "/bin/claude", "full_access", session, "")
        self.assertEqual(call.env, {"IS_SANDBOX": "1"})
        for cli, access in (("claude", "workspace_write"), ("codex", "full_access")):
            self.assertEqual(invocation(cli, "/bin/x", access, session, "").env, {})
        self.patch(os, "geteuid", lambda: 1000)
        call = invocation("claude", "/bin/claude", "full_access", session, "")
        self.assertEqual(call.env, {})

    def test_values_stay_values(self) -> None:
        """A model or a session id like an option is given as a value."""
        session = Session("s", "/w", [], model="--yolo", resume="abc-1")
        for cli in CLIS:
            argv = invocation(cli, "/bin/x", "read_only", session, "hi").argv
            self.assertIn("--model=--yolo", argv)
            self.assertNotIn("--yolo", argv)

    def test_only_plain_session_ids_are_resumed(self) -> None:
        """A CLI session id that could be read as an option is not passed back."""
        from sandboxd.agents.cliparsers import Parsed

        bounds = Bounds(1024, 1.0, 1.0, 100, 10)
        bridge = Bridge("codex", "/bin/codex", "read_only", bounds, lambda data: None)
        bridge.pointers.directory = os.path.realpath(self.mktemp())
        session = Session("cli_" + "0" * 32, "/w", [])
        bridge._take(session, Turn(), Parsed(session_id="--yolo"))
        self.assertIsNone(session.resume)
        bridge._take(session, Turn(), Parsed(session_id="019a-thread"))
        self.assertEqual(session.resume, "019a-thread")
        self.assertEqual(bridge.pointers.read(session.session_id), "019a-thread")

    def test_prompt_on_stdin(self) -> None:
        """Every CLI takes the prompt on stdin: one like an option stays a prompt."""
        for cli in CLIS:
            call = invocation(
                cli, "/bin/x", "read_only", Session("s", "/w", []), "--yolo"
            )
            argv, stdin = call.argv, call.stdin
            self.assertNotIn("--yolo", argv)
            self.assertEqual(stdin, b"--yolo")


#: An HTTP server holding a vault's token, and a stdio server with a key.
MCP_SERVERS = [
    {
        "type": "http",
        "name": "issues",
        "url": "http://127.0.0.1:9/mcp",
        "headers": [{"name": "Authorization", "value": "Bearer tok-123"}],
    },
    {
        "name": "local",
        "command": "/usr/bin/env",
        "args": ["mcp-server", "--stdio"],
        "env": [{"name": "MCP_TEST_KEY", "value": "key-456"}],
    },
]


class McpHandoverTests(HeadlessTestCase):
    """A session's MCP servers reach each CLI, their credentials never in its argv."""

    policy = agents_policy(params={"mcp_servers": "all"})

    @inlineCallbacks
    def turn(self, agent: str) -> Any:
        sid = yield self.session(agent, mcp_servers=MCP_SERVERS)
        reply = yield self.prompt(sid, "echo with tools")
        self.assertEqual(reply.status, 200, reply.body)
        [run] = runs(self.base_dir)
        for secret in ("tok-123", "key-456"):
            self.assertFalse([a for a in run["argv"] if secret in a], run["argv"])
        return run

    @inlineCallbacks
    def test_claude_reads_a_file_with_no_name(self) -> Any:
        """
        claude gets ``--mcp-config`` naming an open descriptor of an
        anonymous file (nothing on disk to leave behind) with both servers.
        """
        run = yield self.turn("claude")
        [config] = [a for a in run["argv"] if a.startswith("--mcp-config=")]
        self.assertRegex(config, r"^--mcp-config=/proc/\d+/fd/\d+$")
        self.assertEqual(
            run["mcp_config"],
            {
                "mcpServers": {
                    "issues": {
                        "type": "http",
                        "url": "http://127.0.0.1:9/mcp",
                        "headers": {"Authorization": "Bearer tok-123"},
                    },
                    "local": {
                        "type": "stdio",
                        "command": "/usr/bin/env",
                        "args": ["mcp-server", "--stdio"],
                        "env": {"MCP_TEST_KEY": "key-456"},
                    },
                }
            },
        )
        self.assertEqual(run["mcp_env"], {})

    @inlineCallbacks
    def test_qwen_in_its_own_format(self) -> Any:
        run = yield self.turn("qwen-code")
        self.assertEqual(
            run["mcp_config"]["mcpServers"]["issues"],
            {
                "httpUrl": "http://127.0.0.1:9/mcp",
                "headers": {"Authorization": "Bearer tok-123"},
            },
        )
        self.assertEqual(
            run["mcp_config"]["mcpServers"]["local"]["env"], {"MCP_TEST_KEY": "key-456"}
        )

    @inlineCallbacks
    def test_codex_by_its_environment(self) -> Any:
        """
        codex's overrides name variables of its environment: the header's
        value in one of ours, the stdio server's under its own name.
        """
        run = yield self.turn("codex")
        argv = run["argv"]
        self.assertIn('mcp_servers.issues.url="http://127.0.0.1:9/mcp"', argv)
        self.assertIn(
            'mcp_servers.issues.env_http_headers={"Authorization" = '
            '"SANDBOXD_MCP_SECRET_0_0"}',
            argv,
        )
        self.assertIn('mcp_servers.local.env_vars=["MCP_TEST_KEY"]', argv)
        self.assertEqual(
            run["mcp_env"],
            {"SANDBOXD_MCP_SECRET_0_0": "Bearer tok-123", "MCP_TEST_KEY": "key-456"},
        )
        self.assertNotIn("mcp_config", run)

    @inlineCallbacks
    def test_refused_before_any_turn(self) -> Any:
        """
        Servers a CLI cannot take are the caller's 400, with the reason,
        before any agent starts.
        """
        sse = {"type": "sse", "name": "old", "url": "http://127.0.0.1:9/sse"}
        bad = {**MCP_SERVERS[0], "headers": [{"name": "X", "value": "a\r\nB: c"}]}
        for agent, servers, said in (
            ("codex", [sse], "not SSE"),
            ("claude", [bad], "header 'X'"),
        ):
            reply = yield self.create(agent, mcp_servers=servers)
            self.assertEqual(reply.status, 400, reply.body)
            self.assertEqual(reply.json()["code"], "invalid_param")
            self.assertEqual(reply.json()["param"], "mcp_servers")
            self.assertIn(said, reply.json()["error"])
        reply = yield self.request("GET", "/agents/sessions")
        self.assertEqual(reply.json()["sessions"], [])
        self.assertEqual(runs(self.base_dir), [])


class PolicyEntryTests(HeadlessTestCase):
    """A policy's own catalogue entry may name a headless CLI."""

    policy = agents_policy()
    policy["agents"]["catalog"] = {
        **policy["agents"]["catalog"],
        "team-codex": {"name": "Team codex", "command": ["codex"], "headless": "codex"},
    }

    @inlineCallbacks
    def test_policy_headless_entry(self) -> Any:
        sid = yield self.session("team-codex")
        reply = yield self.prompt(sid, "echo from the team")
        self.assertEqual(reply.json()["text"], "from the team")
        [run] = runs(self.base_dir)
        self.assertEqual(run["cli"], "codex")

    def test_unknown_cli_refused(self) -> None:
        from sandboxd.agents.catalog import policy_entry
        from sandboxd.errors import ApiError

        error = self.assertRaises(
            ApiError, policy_entry, "x", {"command": ["x"], "headless": "cursor"}
        )
        self.assertIn("headless must be one of codex, qwen, claude", error.message)


class PointerTests(SynchronousTestCase):
    """Which CLI session a bridge session resumes, kept on disk."""

    def test_kept_bounded_and_refused_names(self) -> None:
        from sandboxd.agents import clibridge

        directory = os.path.join(os.path.realpath(self.mktemp()), "pointers")
        pointers = clibridge.Pointers(directory, kept=3)
        ids = [f"cli_{i:032x}" for i in range(5)]
        for n, session_id in enumerate(ids):
            pointers.write(session_id, f"native-{n}")
            os.utime(os.path.join(directory, session_id), (n, n))
        self.assertEqual(sorted(os.listdir(directory)), ids[2:])
        self.assertEqual(pointers.read(ids[4]), "native-4")
        self.assertIsNone(pointers.read(ids[0]))
        self.assertEqual(oct(os.stat(directory).st_mode & 0o777), "0o700")
        pointers.write("../escape", "x")
        self.assertIsNone(pointers.read("../escape"))
        self.assertFalse(os.path.exists(os.path.join(directory, "..", "escape")))


class CatalogueEntryTests(SynchronousTestCase):
    """How an entry with an adapter and a CLI starts, by what PATH holds."""

    def entry_and_path(self, *names: str) -> tuple[Any, dict[str, str]]:
        from sandboxd.agents.catalog import CatalogEntry, Headless

        bin_dir = os.path.realpath(self.mktemp())
        os.makedirs(bin_dir)
        for name in names:
            path = os.path.join(bin_dir, name)
            with open(path, "w") as f:
                f.write("#!/bin/sh\n")
            os.chmod(path, 0o755)
        entry = CatalogEntry(
            id="x",
            name="X",
            command=("x-acp", "--stdio"),
            headless=Headless("codex", "x"),
        )
        return entry, {"PATH": bin_dir}

    def test_adapter_first(self) -> None:
        entry, env = self.entry_and_path("x-acp", "x")
        self.assertEqual(entry.protocol(entry.found(env)), "acp")
        argv, executable = entry.launch(entry.found(env), "read_only")
        self.assertEqual(argv, ["x-acp", "--stdio"])
        self.assertEqual(executable, os.path.join(env["PATH"], "x-acp"))

    def test_cli_without_adapter(self) -> None:
        entry, env = self.entry_and_path("x")
        self.assertEqual(entry.protocol(entry.found(env)), "headless:codex")
        argv, executable = entry.launch(entry.found(env), "workspace_write")
        self.assertEqual(executable, sys.executable)
        self.assertEqual(
            argv[1:8],
            [
                "-I",
                "-m",
                "sandboxd.agents.clibridge",
                "--cli",
                "codex",
                "--access",
                "workspace_write",
            ],
        )
        self.assertEqual(argv[-1], os.path.join(env["PATH"], "x"))
        # The bridge's bounds are the policy defaults'.
        self.assertIn(f"--kill-grace={defaults.KILL_GRACE_SECONDS}", argv)
        self.assertIn(f"--kept-sessions={defaults.AGENT_CLI_KEPT_SESSIONS}", argv)

    def test_neither(self) -> None:
        entry, env = self.entry_and_path()
        self.assertIsNone(entry.found(env))
        self.assertIsNone(entry.launch(None, "read_only"))
        self.assertEqual(entry.protocol(None), "acp")
        self.assertEqual(entry.programs(), ("x-acp", "x"))
