"""
The agents group (SPEC §15) against a real daemon and real fake agents:
an SDK-built agent for the scenarios, a stdlib script for misbehaviour.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from acp.schema import (
    InitializeRequest,
    NewSessionRequest,
    PromptRequest,
    ReadTextFileResponse,
    RequestPermissionResponse,
)
from twisted.internet import reactor
from twisted.internet.defer import Deferred, DeferredList, inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import SkipTest, SynchronousTestCase, TestCase
from twisted.web.client import Agent
from twisted.web.http_headers import Headers

from sandboxd.agents.process import is_alive
from sandboxd.jsonrpc import LineFramer
from sandboxd.policy import defaults
from sandboxd.testing import SSEReader
from tests.helpers import DaemonTestCase, marked_pids

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "fake_agent.py")
SCRIPT = os.path.join(HERE, "script_agent.py")


def fake(*flags: str, **extra: Any) -> dict[str, Any]:
    """A policy catalogue entry running the SDK fake agent."""
    entry = {"name": "Fake agent", "command": [sys.executable, FAKE, *flags]}
    entry.update(extra)
    return entry


#: The ``init_timeout_seconds`` of the cases that wait it out for a call the
#: script agent never answers: the same bound covers the script agent's
#: start (the standard library only), which needs a small part of it.
UNANSWERED_SECONDS = 3


def script(mode: str) -> dict[str, Any]:
    """A policy catalogue entry running the misbehaving script agent."""
    return {"name": f"Script {mode}", "command": [sys.executable, SCRIPT, mode]}


CATALOG = {
    "fake": fake(),
    "fake-embedded": fake("--embedded", "--close"),
    "fake-auth": fake("--auth", auth_method="fake-key"),
    "fake-bare": fake("--no-load", "--no-list"),
    "fake-secret": fake(env_pass=["FAKE_SECRET"]),
    **{
        f"script-{m}": script(m)
        for m in (
            "silent",
            "garbage",
            "huge",
            "cancel_request",
            "reused_ids",
            "question",
            "cancel_error",
            "grandchild",
            "exit_at_init",
            "stuck_config",
            "odd_lines",
        )
    },
}


def agents_policy(
    limits: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
    **rule: Any,
) -> dict[str, Any]:
    """The agents group on, the test catalogue, optional group:agents rule."""
    group: dict[str, Any] = dict(rule)
    if limits:
        group["limits"] = limits
    if params:
        group["params"] = params
    policy: dict[str, Any] = {
        "groups": {"agents": True},
        "agents": {"catalog": CATALOG},
    }
    if group:
        policy["endpoints"] = {"group:agents": group}
    return policy


#: A catalogue entry whose command is not installed, with an npm package.
MISSING_AGENT = {
    "name": "Missing",
    "command": ["sandboxd-no-such-agent"],
    "install": {"package": "fake-agent-pkg", "version": "1.2.3"},
}


def on_path(test: Any, scripts: dict[str, str]) -> str:
    """
    Put executables running each script (sh) first on ``PATH`` for
    ``test``, named by the keys; the directory they are in.
    """
    bin_dir = os.path.realpath(test.mktemp())
    os.makedirs(bin_dir)
    for name, script in scripts.items():
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\n{script}\n")
        os.chmod(path, 0o755)
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = bin_dir + os.pathsep + old
    test.addCleanup(os.environ.__setitem__, "PATH", old)
    return bin_dir


def fake_npm(test: Any, script: str) -> str:
    """Put an ``npm`` running ``script`` (sh) first on ``PATH`` for ``test``."""
    return on_path(test, {"npm": script})


class AgentsTestCase(DaemonTestCase):
    """A daemon with the agents group on and the fake catalogue."""

    timeout = 60
    policy = agents_policy()

    def create(self, agent: str = "fake", **body: Any) -> Deferred[Any]:
        body["agent"] = agent
        return self.request("POST", "/agents/sessions", body)

    @inlineCallbacks
    def session(self, agent: str = "fake", **body: Any) -> Any:
        """Create a session; return its id."""
        reply = yield self.create(agent, **body)
        self.assertEqual(reply.status, 201, reply.body)
        sid = reply.json()["session_id"]
        self.addCleanup(self.request, "DELETE", f"/agents/sessions/{sid}")
        return sid

    def prompt(self, sid: str, prompt: Any, **body: Any) -> Deferred[Any]:
        body["prompt"] = prompt
        body.setdefault("wait", 20)
        return self.request("POST", f"/agents/sessions/{sid}/prompt", body)

    @inlineCallbacks
    def events(self, sid: str, query: str = "") -> Any:
        reply = yield self.request(
            "GET", f"/agents/sessions/{sid}/events?follow=false{query}"
        )
        self.assertEqual(reply.status, 200, reply.body)
        return reply.json()

    @inlineCallbacks
    def follow(self, path: str, headers: dict[str, str] | None = None) -> Any:
        """Open an SSE stream; returns the collecting client."""
        hdrs = Headers()
        for k, v in (headers or {}).items():
            hdrs.addRawHeader(k, v)
        response = yield Agent(reactor).request(
            b"GET", (self.daemon.url + path).encode(), hdrs
        )
        self.assertEqual(response.code, 200)
        client = SSEReader()
        response.deliverBody(client)
        self.addCleanup(
            lambda: client.transport.stopProducing() if not client.done.called else None
        )
        return client

    @inlineCallbacks
    def pending(self, sid: str, tries: int = 100) -> Any:
        """Wait for a held request of ``sid`` to appear."""
        for _ in range(tries):
            reply = yield self.request("GET", f"/agents/requests?session_id={sid}")
            requests = reply.json()["requests"]
            if requests:
                return requests
            yield deferLater(reactor, 0.1, lambda: None)
        self.fail("no pending request appeared")

    @inlineCallbacks
    def wait_state(self, sid: str, states: tuple[str, ...], tries: int = 150) -> Any:
        for _ in range(tries):
            reply = yield self.request("GET", f"/agents/sessions/{sid}")
            if reply.json()["state"] in states:
                return reply.json()
            yield deferLater(reactor, 0.1, lambda: None)
        self.fail(f"session never reached {states}")


class CatalogTests(AgentsTestCase):
    """The catalogue: built-in and policy entries, probe."""

    @inlineCallbacks
    def test_catalog_lists_builtin_and_policy_agents(self) -> Any:
        """Built-in agents are listed with pinned packages; policy agents are installed when their command exists."""
        reply = yield self.request("GET", "/agents/catalog")
        self.assertEqual(reply.status, 200)
        agents = {a["id"]: a for a in reply.json()["agents"]}
        self.assertEqual(agents["claude"]["source"], "builtin")
        self.assertEqual(
            agents["claude"]["install"]["package"],
            "@agentclientprotocol/claude-agent-acp",
        )
        self.assertIn("ANTHROPIC_API_KEY", agents["claude"]["env_present"])
        self.assertEqual(agents["codex"]["auth_method"], "api-key")
        self.assertEqual(agents["fake"]["source"], "policy")
        self.assertTrue(agents["fake"]["installed"])
        self.assertTrue(agents["fake"]["allowed"])

    @inlineCallbacks
    def test_probe_runs_initialize(self) -> Any:
        """probe=true starts the agent, initializes it and reports what it said; the process is gone after."""
        reply = yield self.request("GET", "/agents/catalog/fake?probe=true")
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertEqual(body["protocol_version"], 1)
        self.assertEqual(body["agent_info"]["name"], "fake-agent")
        self.assertTrue(body["agent_capabilities"]["loadSession"])

    @inlineCallbacks
    def test_unknown_agent(self) -> Any:
        """An unknown agent id is 404 not_found, for the catalogue and for create."""
        reply = yield self.request("GET", "/agents/catalog/nope")
        self.assertEqual(reply.status, 404)
        reply = yield self.create("nope")
        self.assertEqual(reply.status, 404)
        self.assertEqual(reply.json()["code"], "not_found")

    @inlineCallbacks
    def test_not_installed_is_503(self) -> Any:
        """A built-in agent whose binary is missing cannot start: 503 agent_unavailable with the package to install."""
        reply = yield self.create("gemini")
        if reply.status == 201:
            self.skipTest("gemini is installed here")
        self.assertEqual(reply.status, 503)
        self.assertEqual(reply.json()["code"], "agent_unavailable")
        self.assertEqual(reply.json()["install"]["package"], "@google/gemini-cli")

    @inlineCallbacks
    def test_agent_sessions_list(self) -> Any:
        """session/list on a short-lived agent; 501 unsupported without the capability."""
        reply = yield self.request("GET", "/agents/catalog/fake/sessions")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["sessions"][0]["acp_session_id"], "old-1")
        self.assertEqual(reply.json()["sessions"][0]["title"], "Earlier work")
        reply = yield self.request("GET", "/agents/catalog/fake-bare/sessions")
        self.assertEqual(reply.status, 501)
        self.assertEqual(reply.json()["code"], "unsupported")


class SessionTests(AgentsTestCase):
    """Create, prompt, events, config, cancel, delete."""

    @inlineCallbacks
    def test_create_and_echo(self) -> Any:
        """Create answers 201 with the agent's modes and config; a prompt within wait answers 200 with the text; its messages show their documented fields only."""
        reply = yield self.create(title="first")
        self.assertEqual(reply.status, 201, reply.body)
        body = reply.json()
        sid = body["session_id"]
        self.addCleanup(self.request, "DELETE", f"/agents/sessions/{sid}")
        self.assertEqual(body["state"], "idle")
        self.assertTrue(body["acp_session_id"].startswith("fake-"))
        self.assertEqual(body["modes"]["currentModeId"], "default")
        self.assertEqual(body["config_options"][0]["id"], "model")
        self.assertEqual(body["agent_info"]["name"], "fake-agent")
        reply = yield self.prompt(sid, "echo hello world")
        self.assertEqual(reply.status, 200, reply.body)
        turn = reply.json()
        self.assertEqual(turn["stop_reason"], "end_turn")
        self.assertEqual(turn["text"], "hello world")
        self.assertEqual(turn["usage"], {"used": 42, "size": 1000})
        reply = yield self.request("GET", f"/agents/sessions/{sid}/messages")
        messages = reply.json()["messages"]
        self.assertEqual([m["role"] for m in messages], ["user", "agent"])
        self.assertEqual(
            messages[1]["content"], [{"type": "text", "text": "hello world"}]
        )
        self.assertEqual(
            set(messages[1]),
            {"message_id", "turn_id", "role", "content", "tool_call_ids"}
            | {"seq_from", "seq_to"},
        )
        reply = yield self.request("GET", f"/agents/sessions/{sid}")
        self.assertEqual(reply.json()["title"], "first")
        self.assertEqual(reply.json()["usage"]["used"], 42)
        self.assertEqual(reply.json()["stop_reason"], "end_turn")

    @inlineCallbacks
    def test_events_page(self) -> Any:
        """The paged event log is in wire order with monotonic seq, typed events and no raw unless asked."""
        sid = yield self.session()
        yield self.prompt(sid, "echo abc")
        page = yield self.events(sid)
        types = [e["type"] for e in page["events"]]
        self.assertEqual(types[0], "session.state")
        self.assertIn("turn.started", types)
        self.assertEqual(
            types.index("turn.started")
            < types.index("message.delta")
            < types.index("turn.ended"),
            True,
        )
        seqs = [e["seq"] for e in page["events"]]
        self.assertEqual(seqs, list(range(1, len(seqs) + 1)))
        self.assertEqual(page["next"], seqs[-1])
        self.assertFalse(any("raw" in e for e in page["events"]))
        raw = yield self.events(sid, "&include_raw=true&types=message.delta")
        self.assertTrue(all(e["type"] == "message.delta" for e in raw["events"]))
        self.assertTrue(any("raw" in e for e in raw["events"]))
        after = yield self.events(sid, f"&after={seqs[-2]}")
        self.assertEqual([e["seq"] for e in after["events"]], [seqs[-1]])

    @inlineCallbacks
    def test_second_prompt_is_409(self) -> Any:
        """During a turn a second prompt is 409 turn_in_progress; wait=0 answers 202 with the events URL."""
        sid = yield self.session()
        reply = yield self.prompt(sid, "slow", wait=0)
        self.assertEqual(reply.status, 202, reply.body)
        self.assertEqual(reply.json()["state"], "running")
        self.assertIn("/events", reply.json()["events_url"])
        reply = yield self.prompt(sid, "echo again", wait=0)
        self.assertEqual(reply.status, 409)
        self.assertEqual(reply.json()["code"], "turn_in_progress")
        reply = yield self.request("POST", f"/agents/sessions/{sid}/cancel", {})
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.json()["stop_reason"], "cancelled")
        self.assertFalse(reply.json()["forced"])

    @inlineCallbacks
    def test_turn_long_poll(self) -> Any:
        """GET a turn with wait long-polls until it ends."""
        sid = yield self.session()
        reply = yield self.prompt(sid, "slow", wait=0)
        turn_id = reply.json()["turn_id"]
        reply = yield self.request(
            "GET", f"/agents/sessions/{sid}/turns/{turn_id}?wait=0.2"
        )
        self.assertEqual(reply.json()["state"], "running")
        self.request("POST", f"/agents/sessions/{sid}/cancel", {"wait": 0})
        reply = yield self.request(
            "GET", f"/agents/sessions/{sid}/turns/{turn_id}?wait=10"
        )
        self.assertEqual(reply.json()["state"], "ended")
        self.assertEqual(reply.json()["stop_reason"], "cancelled")
        reply = yield self.request("GET", f"/agents/sessions/{sid}/turns")
        self.assertEqual([t["turn_id"] for t in reply.json()["turns"]], [turn_id])

    @inlineCallbacks
    def test_delete_ends_the_agent(self) -> Any:
        """DELETE closes the session, the agent process is gone, and session.closed is the last event."""
        sid = yield self.session()
        reply = yield self.request("GET", f"/agents/sessions/{sid}")
        pid = reply.json()["process"]["pid"]
        self.assertTrue(is_alive(pid))
        reply = yield self.request("DELETE", f"/agents/sessions/{sid}")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["state"], "closed")
        self.assertFalse(is_alive(pid))
        page = yield self.events(sid)
        self.assertEqual(page["events"][-1]["type"], "session.closed")
        self.assertTrue(page["closed"])
        reply = yield self.prompt(sid, "echo x")
        self.assertEqual(reply.status, 503)
        self.assertEqual(reply.json()["code"], "agent_unavailable")

    @inlineCallbacks
    def test_config_mode_model_title(self) -> Any:
        """Mode, model (as the model config option) and title change; a permission-skipping mode is 403."""
        sid = yield self.session()
        reply = yield self.request(
            "POST",
            f"/agents/sessions/{sid}/config",
            {"mode": "plan", "model": "large", "title": "renamed"},
        )
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertEqual(body["modes"]["currentModeId"], "plan")
        self.assertEqual(body["config_options"][0]["currentValue"], "large")
        self.assertEqual(body["title"], "renamed")
        reply = yield self.request(
            "POST", f"/agents/sessions/{sid}/config", {"mode": "bypassPermissions"}
        )
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "param_not_allowed")
        reply = yield self.request(
            "POST", f"/agents/sessions/{sid}/config", {"mode": "nonsense"}
        )
        self.assertEqual(reply.status, 400)

    @inlineCallbacks
    def test_bypass_mode_refused_at_create(self) -> Any:
        """Create with a permission-skipping mode is refused before any agent starts."""
        reply = yield self.create(mode="bypassPermissions")
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "param_not_allowed")
        reply = yield self.request("GET", "/agents/sessions")
        self.assertEqual(reply.json()["sessions"], [])

    @inlineCallbacks
    def test_stdio_mcp_server_refused(self) -> Any:
        """A stdio MCP server is a command the agent would run: refused by default."""
        reply = yield self.create(
            mcp_servers=[{"name": "x", "command": "/bin/sh", "args": [], "env": []}]
        )
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "param_not_allowed")

    @inlineCallbacks
    def test_cwd_outside_is_refused(self) -> Any:
        """The session's cwd passes the path guard."""
        reply = yield self.create(cwd="/etc")
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "path_not_allowed")

    @inlineCallbacks
    def test_list_and_filters(self) -> Any:
        """Sessions are listed with their state; filters by agent and state apply."""
        sid = yield self.session()
        reply = yield self.request("GET", "/agents/sessions?agent=fake")
        sessions = reply.json()["sessions"]
        self.assertEqual([s["session_id"] for s in sessions], [sid])
        self.assertEqual(sessions[0]["state"], "idle")
        reply = yield self.request("GET", "/agents/sessions?state=running")
        self.assertEqual(reply.json()["sessions"], [])

    @inlineCallbacks
    def test_unknown_filters_are_refused(self) -> Any:
        """
        A session or request filter no session or request could match (a
        misspelt state, an agent not in the catalogue) is 400 naming the
        allowed values, not an empty list that reads as "none".
        """
        cases = (
            ("/agents/sessions?state=runing", "idle, running, awaiting_input"),
            ("/agents/sessions?agent=no-such-agent", "fake, fake-auth"),
            ("/agents/requests?state=open", "pending, resolved, withdrawn, all"),
        )
        for path, named in cases:
            reply = yield self.request("GET", path)
            self.assertEqual(reply.status, 400, path)
            self.assertEqual(reply.json()["code"], "invalid_param", path)
            self.assertIn(named, reply.json()["error"], path)
        for path in (
            "/agents/sessions?state=closed",
            "/agents/sessions?agent=claude",
            "/agents/requests?state=all",
            "/agents/requests?state=withdrawn",
        ):
            reply = yield self.request("GET", path)
            self.assertEqual(reply.status, 200, path)

    @inlineCallbacks
    def test_empty_prompt_is_refused(self) -> Any:
        """An empty, blank or block-less prompt is 400 invalid_param, at create too; no turn starts."""
        sid = yield self.session()
        for prompt in ("", "   \n", [], [{"type": "text", "text": " "}]):
            reply = yield self.prompt(sid, prompt)
            self.assertEqual(reply.status, 400, (prompt, reply.body))
            self.assertEqual(
                (reply.json()["code"], reply.json()["param"]),
                ("invalid_param", "prompt"),
            )
            reply = yield self.create(prompt=prompt)
            self.assertEqual(reply.status, 400, reply.body)
        reply = yield self.request("GET", f"/agents/sessions/{sid}/turns")
        self.assertEqual(reply.json()["turns"], [])
        reply = yield self.request("GET", "/agents/sessions")
        self.assertEqual(len(reply.json()["sessions"]), 1)

    @inlineCallbacks
    def test_create_with_prompt(self) -> Any:
        """A prompt given to create starts the first turn at once."""
        reply = yield self.create(prompt="echo started")
        self.assertEqual(reply.status, 201)
        self.assertEqual(reply.json()["state"], "running")
        sid = reply.json()["session_id"]
        self.addCleanup(self.request, "DELETE", f"/agents/sessions/{sid}")
        turn_id = reply.json()["turn_id"]
        reply = yield self.request(
            "GET", f"/agents/sessions/{sid}/turns/{turn_id}?wait=10"
        )
        self.assertEqual(reply.json()["text"], "started")

    @inlineCallbacks
    def test_authenticate(self) -> Any:
        """An agent that needs authenticate gets it with the entry's auth_method before session/new."""
        sid = yield self.session("fake-auth")
        reply = yield self.prompt(sid, "echo authed")
        self.assertEqual(reply.json()["text"], "authed")

    @inlineCallbacks
    def test_env_pass_and_scrub(self) -> Any:
        """env_pass keys reach the agent; their values are redacted from its logs."""
        os.environ["FAKE_SECRET"] = "sup3r-s3cret-value"
        self.addCleanup(os.environ.pop, "FAKE_SECRET", None)
        sid = yield self.session("fake-secret")
        reply = yield self.request("GET", f"/agents/sessions/{sid}/logs")
        text = "".join(c["data"] for c in reply.json()["chunks"])
        self.assertIn("FAKE_SECRET=[redacted]", text)
        self.assertNotIn("sup3r-s3cret-value", text)
        sid2 = yield self.session("fake")
        reply = yield self.request("GET", f"/agents/sessions/{sid2}/logs")
        text = "".join(c["data"] for c in reply.json()["chunks"])
        self.assertIn("FAKE_SECRET=None", text)

    @inlineCallbacks
    def test_given_env_is_redacted(self) -> Any:
        """
        A key handed to the agent in the create body's ``env``, or in its
        catalogue entry's fixed ``env``, is masked in its logs and in
        every event (its exit's stderr tail, what it says); so is any
        longer value given there.
        """
        yield self.daemon.stop()
        policy = agents_policy()
        policy["agents"]["catalog"] = {
            **CATALOG,
            "fake-fixed": fake(env={"FAKE_SECRET": "sk-fixed-entry-value-0987"}),
        }
        yield self.start(policy=policy)
        key = "sk-ant-api03-verysecretvalue1234567890"
        sid = yield self.session(
            env={"FAKE_SECRET": key, "PROJECT_LABEL": "plain-label-x"}
        )
        # (The key whole in one of the two chunks the fake says it in.)
        reply = yield self.prompt(sid, f"echo {key} plain-label-x {'.' * 80}")
        self.assertEqual(reply.status, 200, reply.body)
        sid2 = yield self.session("fake-fixed")
        for session, secret in ((sid, key), (sid2, "sk-fixed-entry-value-0987")):
            reply = yield self.request("GET", f"/agents/sessions/{session}/logs")
            text = "".join(c["data"] for c in reply.json()["chunks"])
            self.assertIn("FAKE_SECRET=[redacted]", text)
            self.assertNotIn(secret, text)
            yield self.request("DELETE", f"/agents/sessions/{session}")
            page = yield self.events(session)
            shown = json.dumps(page["events"])
            self.assertNotIn(secret, shown)
            self.assertNotIn("plain-label-x", shown)
            exited = next(e for e in page["events"] if e["type"] == "agent.exited")
            self.assertIn("FAKE_SECRET=[redacted]", exited["stderr_tail"])
        reply = yield self.request("GET", f"/agents/sessions/{sid}/messages")
        self.assertNotIn(key, reply.body.decode())
        self.assertEqual(reply.body.decode().count("[redacted] [redacted]"), 2)

    @inlineCallbacks
    def test_commands_plan_info(self) -> Any:
        """Slash commands, the agent's title and its own mode switch are folded into the session."""
        sid = yield self.session()
        yield self.prompt(sid, "commands")
        reply = yield self.request("GET", f"/agents/sessions/{sid}/commands")
        self.assertEqual(
            reply.json()["commands"],
            [{"name": "web", "description": "Search the web", "input_hint": "query"}],
        )
        yield self.prompt(sid, "info")
        reply = yield self.request("GET", f"/agents/sessions/{sid}")
        self.assertEqual(reply.json()["title"], "Fake title")
        self.assertEqual(reply.json()["modes"]["currentModeId"], "plan")

    @inlineCallbacks
    def test_thoughts_are_their_own_messages(self) -> Any:
        """Thought chunks become thought messages, apart from the agent's text."""
        sid = yield self.session()
        reply = yield self.prompt(sid, "think")
        self.assertEqual(reply.json()["text"], "done")
        reply = yield self.request("GET", f"/agents/sessions/{sid}/messages")
        self.assertEqual(
            [m["role"] for m in reply.json()["messages"]], ["user", "thought", "agent"]
        )

    @inlineCallbacks
    def test_load_replays_history(self) -> Any:
        """session/load replays the history as events marked replay: true."""
        reply = yield self.request(
            "POST",
            "/agents/sessions/load",
            {"agent": "fake", "acp_session_id": "old-1", "cwd": self.base_dir},
        )
        self.assertEqual(reply.status, 201, reply.body)
        sid = reply.json()["session_id"]
        self.addCleanup(self.request, "DELETE", f"/agents/sessions/{sid}")
        self.assertEqual(reply.json()["acp_session_id"], "old-1")
        page = yield self.events(sid, "&types=message.delta")
        self.assertTrue(page["events"])
        self.assertTrue(all(e.get("replay") for e in page["events"]))
        reply = yield self.request("GET", f"/agents/sessions/{sid}/messages")
        messages = reply.json()["messages"]
        self.assertEqual([m["role"] for m in messages], ["user", "agent"])
        self.assertEqual(messages[1]["content"][0]["text"], "hi, I remember")
        reply = yield self.prompt(sid, "echo after load")
        self.assertEqual(reply.json()["text"], "after load")

    @inlineCallbacks
    def test_stored_session_is_loaded_once(self) -> Any:
        """
        Two loads of one stored session, at once and after: one agent
        process; the others answer 200 with the live session.  Once it is
        closed, it may be loaded again.
        """
        body = {"agent": "fake", "acp_session_id": "fake-abc"}
        replies = yield DeferredList(
            [self.request("POST", "/agents/sessions/load", body) for _ in range(2)]
        )
        replies = [r for _, r in replies]
        replies.append((yield self.request("POST", "/agents/sessions/load", body)))
        self.assertEqual(
            sorted(r.status for r in replies),
            [200, 200, 201],
            [r.body for r in replies],
        )
        sids = {r.json()["session_id"] for r in replies}
        self.assertEqual(len(sids), 1)
        [sid] = sids
        self.assertEqual(
            [r.json().get("already_loaded") for r in replies if r.status == 200],
            [True, True],
        )
        reply = yield self.request("GET", "/agents/sessions")
        self.assertEqual(len(reply.json()["sessions"]), 1)
        yield self.request("DELETE", f"/agents/sessions/{sid}")
        reply = yield self.request("POST", "/agents/sessions/load", body)
        self.assertEqual(reply.status, 201, reply.body)
        self.addCleanup(
            self.request, "DELETE", f"/agents/sessions/{reply.json()['session_id']}"
        )

    @inlineCallbacks
    def test_load_without_load_session_is_501(self) -> Any:
        """
        An agent whose initialize says loadSession false: 501 unsupported
        before it is asked to load; the session is listed failed with that
        reason, its agent gone.
        """
        reply = yield self.request(
            "POST",
            "/agents/sessions/load",
            {"agent": "fake-bare", "acp_session_id": "fake-abc"},
        )
        self.assertEqual(reply.status, 501, reply.body)
        self.assertEqual(reply.json()["code"], "unsupported")
        reply = yield self.request("GET", "/agents/sessions")
        [session] = reply.json()["sessions"]
        state = yield self.wait_state(session["session_id"], ("failed",))
        self.assertEqual(state["error"]["code"], "unsupported")
        self.assertFalse(is_alive(state["process"]["pid"]))

    @inlineCallbacks
    def test_too_many_sessions(self) -> Any:
        """
        max_sessions bounds live sessions: 429 too_many_sessions, once the
        request is known to be good (a missing cwd is still its 400).
        """
        yield self.daemon.stop()
        yield self.start(policy=agents_policy(limits={"max_sessions": 1}))
        yield self.session()
        bad = yield self.create(cwd=os.path.join(self.base_dir, "no-such-dir"))
        self.assertEqual((bad.status, bad.json()["code"]), (400, "invalid_param"))
        reply = yield self.create()
        self.assertEqual(reply.status, 429)
        self.assertEqual(reply.json()["code"], "too_many_sessions")

    @inlineCallbacks
    def test_scopes(self) -> Any:
        """agents:read sees, agents:run drives, agents:approve answers; each is separate."""
        yield self.daemon.stop()
        policy = agents_policy()
        policy["auth"] = {
            "tokens": [
                {"id": "reader", "token_env": "READER", "scopes": ["agents:read"]},
                {
                    "id": "driver",
                    "token_env": "DRIVER",
                    "scopes": ["agents:run", "agents:read"],
                },
            ]
        }
        yield self.start(
            policy=policy, environ={"READER": "r-token", "DRIVER": "d-token"}
        )
        reply = yield self.daemon.request("GET", "/agents/catalog", token="r-token")
        self.assertEqual(reply.status, 200)
        reply = yield self.daemon.request(
            "POST", "/agents/sessions", {"agent": "fake"}, token="r-token"
        )
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "missing_scope")
        reply = yield self.daemon.request(
            "POST",
            "/agents/requests/req_x",
            {"decision": "allow_once"},
            token="d-token",
        )
        self.assertEqual(reply.status, 403)
        self.assertEqual(
            reply.json()["scope"], "agents:approve"
        ) if "scope" in reply.json() else None


class FramerTests(AgentsTestCase):
    """The line framer on its own (no process needed)."""

    autostart = False

    def test_split_cr_and_cap(self) -> None:
        """Lines split on \\n, a trailing \\r is dropped, blank lines skipped, and a line over the cap stops the framer."""
        lines: list[bytes] = []
        overflow: list[int] = []
        framer = LineFramer(10, lines.append, overflow.append)
        framer.feed(b"abc\r\n\r\nde")
        framer.feed(b"f\n0123456789")
        self.assertEqual(lines, [b"abc", b"def"])
        self.assertEqual(overflow, [])
        framer.feed(b"0")
        self.assertEqual(overflow, [11])
        framer.feed(b"\nmore\n")
        self.assertEqual(lines, [b"abc", b"def"])


def sent_recorder(test: AgentsTestCase, sid: str) -> list[dict[str, Any]]:
    """Record every message sandboxd writes to the session's agent."""
    session = test.daemon.context.agents.sessions[sid]
    sent: list[dict[str, Any]] = []
    write = session.conn._write

    def recording(data: bytes) -> None:
        sent.append(json.loads(data))
        write(data)

    session.conn._write = recording
    return sent


class EndToEndTests(AgentsTestCase):
    """What a user does: edit a file through the agent, approve over HTTP, follow the stream."""

    @inlineCallbacks
    def test_edit_with_approval_and_resumed_stream(self) -> Any:
        """
        The agent asks to edit a file; the approver allows it over HTTP; the
        diff and the file on disk show the change; a second client that
        reconnects midway with Last-Event-ID sees every event exactly once.
        """
        target = os.path.join(self.base_dir, "hello.txt")
        with open(target, "w") as f:
            f.write("old line\n")
        sid = yield self.session(cwd=self.base_dir)
        sent = sent_recorder(self, sid)
        first = yield self.follow(f"/agents/sessions/{sid}/events?follow=true")
        reply = yield self.prompt(sid, f"edit {target} new line", wait=0)
        self.assertEqual(reply.status, 202, reply.body)
        turn_id = reply.json()["turn_id"]

        requests = yield self.pending(sid)
        request = requests[0]
        self.assertEqual(request["kind"], "permission")
        self.assertEqual(request["tool_call"]["id"], "edit1")
        self.assertEqual(request["tool_call"]["kind"], "edit")
        self.assertEqual(request["tool_call"]["diffs"][0]["path"], target)
        self.assertEqual(request["tool_call"]["diffs"][0]["new_text"], "new line")
        self.assertEqual(request["policy"]["decision"], "ask")
        self.assertEqual(
            [o["option_id"] for o in request["options"]], ["allow", "always", "reject"]
        )
        reply = yield self.request("GET", f"/agents/sessions/{sid}")
        self.assertEqual(reply.json()["state"], "awaiting_input")
        self.assertEqual(reply.json()["pending_requests"], 1)

        yield first.wait_for_event(lambda e: e["event"] == "permission.requested")
        first.disconnect()
        yield first.done
        seen = [e["id"] for e in first.events]
        last = seen[-1]

        reply = yield self.request(
            "POST", f"/agents/requests/{request['request_id']}", {"option_id": "allow"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            reply.json(),
            {
                "request_id": request["request_id"],
                "state": "resolved",
                "outcome": {"outcome": "selected", "optionId": "allow"},
            },
        )
        reply = yield self.request(
            "POST", f"/agents/requests/{request['request_id']}", {"option_id": "reject"}
        )
        self.assertEqual(reply.status, 409)
        self.assertEqual(reply.json()["code"], "already_resolved")

        second = yield self.follow(
            f"/agents/sessions/{sid}/events?follow=true", {"Last-Event-ID": str(last)}
        )
        yield second.wait_for_event(lambda e: e["event"] == "turn.ended")
        reply = yield self.request(
            "GET", f"/agents/sessions/{sid}/turns/{turn_id}?wait=10"
        )
        self.assertEqual(reply.json()["stop_reason"], "end_turn")
        self.assertEqual(reply.json()["text"], "edited hello.txt (allow)")
        with open(target) as f:
            self.assertEqual(f.read(), "new line")

        page = yield self.events(sid)
        resumed = [e["id"] for e in second.events]
        self.assertEqual(resumed[0], last + 1)
        self.assertEqual(
            seen + resumed,
            [e["seq"] for e in page["events"]][: len(seen) + len(resumed)],
        )
        types = [e["type"] for e in page["events"]]
        for expected in (
            "plan",
            "tool_call",
            "permission.requested",
            "permission.resolved",
            "file.written",
            "tool_call.update",
            "turn.ended",
        ):
            self.assertIn(expected, types)
        resolved = next(e for e in page["events"] if e["type"] == "permission.resolved")
        self.assertEqual(
            (resolved["by"], resolved["identity"], resolved["option_id"]),
            ("identity", "anonymous", "allow"),
        )
        written = next(e for e in page["events"] if e["type"] == "file.written")
        self.assertEqual(
            (written["path"], written["bytes"], written["tool_call_id"]),
            (target, 8, "edit1"),
        )

        reply = yield self.request(
            "GET", f"/agents/sessions/{sid}/tool-calls/edit1?format=unified"
        )
        tool_call = reply.json()
        self.assertEqual(tool_call["status"], "completed")
        self.assertIn("-old line", tool_call["diffs"][0]["unified"])
        self.assertIn("+new line", tool_call["diffs"][0]["unified"])
        self.assertEqual(tool_call["permission_history"][0]["option_id"], "allow")
        reply = yield self.request(
            "GET", f"/agents/sessions/{sid}/tool-calls?kind=edit"
        )
        self.assertEqual(
            [t["tool_call_id"] for t in reply.json()["tool_calls"]], ["edit1"]
        )
        self.assertTrue(reply.json()["tool_calls"][0]["has_diff"])
        reply = yield self.request("GET", f"/agents/sessions/{sid}/files?diff=true")
        files = reply.json()["files"]
        self.assertEqual(files[0]["path"], target)
        self.assertEqual(files[0]["change"], "modified")
        self.assertIn("fs_write", files[0]["sources"])
        self.assertIn("+new line", files[0]["diff"])
        reply = yield self.request("GET", f"/agents/sessions/{sid}/plan")
        self.assertEqual(
            [e["content"] for e in reply.json()["entries"]],
            ["Read the file", "Edit it"],
        )

        # What sandboxd sent is valid ACP, checked with the SDK's own models.
        by_method = {m.get("method"): m for m in sent if "method" in m}
        PromptRequest.model_validate(by_method["session/prompt"]["params"])
        answers = [m for m in sent if "result" in m]
        self.assertTrue(any("outcome" in (m["result"] or {}) for m in answers))
        for m in answers:
            if "outcome" in (m["result"] or {}):
                RequestPermissionResponse.model_validate(m["result"])
            elif "content" in (m["result"] or {}):
                ReadTextFileResponse.model_validate(m["result"])

    @inlineCallbacks
    def test_initialize_and_new_session_are_valid_acp(self) -> Any:
        """The initialize and session/new params sandboxd sends validate against the SDK's models."""
        sid = yield self.session()
        session = self.daemon.context.agents.sessions[sid]
        InitializeRequest.model_validate(
            {
                "protocolVersion": 1,
                "clientCapabilities": session.handshake.client_capabilities(),
                "clientInfo": {"name": "sandboxd", "version": "1"},
            }
        )
        NewSessionRequest.model_validate({"cwd": session.cwd, "mcpServers": []})
        reply = yield self.request("GET", f"/agents/sessions/{sid}/logs")
        text = "".join(c["data"] for c in reply.json()["chunks"])
        self.assertIn("'readTextFile': True", text)
        self.assertIn("'terminal': True", text)


class PermissionPolicyTests(AgentsTestCase):
    """permission_mode, paths outside the rule, timeouts, allow_always."""

    policy = agents_policy(params={"permission_mode": {"edit": "auto", "*": "ask"}})

    @inlineCallbacks
    def test_auto_allows_once(self) -> Any:
        """permission_mode auto picks the first allow_once (never allow_always), answered by policy."""
        target = os.path.join(self.base_dir, "a.txt")
        sid = yield self.session()
        reply = yield self.prompt(sid, f"edit {target} auto text")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["text"], "edited a.txt (allow)")
        page = yield self.events(sid, "&types=permission.resolved")
        self.assertEqual(page["events"][0]["by"], "policy")
        with open(target) as f:
            self.assertEqual(f.read(), "auto text")
        reply = yield self.request("GET", f"/agents/sessions/{sid}/files")
        self.assertEqual(reply.json()["files"][0]["change"], "created")

    @inlineCallbacks
    def test_path_outside_rule_rejected_whatever_the_mode(self) -> Any:
        """A tool call naming a path outside the paths rule is rejected by policy with the rule, even in auto mode."""
        sid = yield self.session()
        reply = yield self.prompt(sid, "edit /etc/sandboxd-test-file nope")
        self.assertEqual(reply.json()["text"], "permission refused")
        page = yield self.events(sid, "&types=permission.requested,permission.resolved")
        requested, resolved = page["events"]
        self.assertEqual(requested["policy"]["decision"], "deny")
        self.assertEqual(requested["policy"]["code"], "path_not_allowed")
        self.assertEqual((resolved["by"], resolved["option_id"]), ("policy", "reject"))
        self.assertFalse(os.path.exists("/etc/sandboxd-test-file"))


class CancelWithHeldRequestTests(AgentsTestCase):
    """Cancel answers held requests and ends the turn."""

    @inlineCallbacks
    def test_cancel_answers_the_held_permission(self) -> Any:
        """Cancelling a turn waiting on a human answers the permission 'cancelled' (by: cancel); a late reply is 409."""
        sid = yield self.session()
        yield self.prompt(sid, f"edit {self.base_dir}/c.txt x", wait=0)
        requests = yield self.pending(sid)
        reply = yield self.request("POST", f"/agents/sessions/{sid}/cancel", {})
        self.assertEqual(reply.status, 200)
        self.assertEqual(
            (reply.json()["stop_reason"], reply.json()["forced"]), ("cancelled", False)
        )
        page = yield self.events(sid, "&types=permission.resolved")
        self.assertEqual(
            (page["events"][0]["by"], page["events"][0]["outcome"]),
            ("cancel", "cancelled"),
        )
        reply = yield self.request(
            "POST",
            f"/agents/requests/{requests[0]['request_id']}",
            {"option_id": "allow"},
        )
        self.assertEqual(reply.status, 409)
        self.assertEqual(reply.json()["code"], "already_resolved")
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "c.txt")))

    @inlineCallbacks
    def test_agent_killed_while_asking(self) -> Any:
        """
        An agent killed by a signal while its permission request is held:
        the request is withdrawn (nobody cancelled it), the session goes
        from running straight to failed, and the exit reads as every
        process's does: exit_code null, the signal named.
        """
        import signal

        sid = yield self.session()
        yield self.prompt(sid, f"edit {self.base_dir}/c.txt x", wait=0)
        [held] = yield self.pending(sid)
        reply = yield self.request("GET", f"/agents/sessions/{sid}")
        os.kill(reply.json()["process"]["pid"], signal.SIGKILL)
        state = yield self.wait_state(sid, ("failed",))
        self.assertEqual(state["process"]["exit_code"], None)
        self.assertEqual(state["process"]["signal"], "SIGKILL")
        self.assertEqual(state["error"]["message"], "the agent was killed by SIGKILL")
        reply = yield self.request(
            "GET", f"/agents/requests?session_id={sid}&state=all"
        )
        [after] = reply.json()["requests"]
        self.assertEqual(
            (after["request_id"], after["state"]), (held["request_id"], "withdrawn")
        )
        page = yield self.events(sid)
        exited = next(e for e in page["events"] if e["type"] == "agent.exited")
        self.assertEqual((exited["exit_code"], exited["signal"]), (None, "SIGKILL"))
        states = [e["state"] for e in page["events"] if e["type"] == "session.state"]
        self.assertEqual(states[-2:], ["running", "failed"])
        self.assertNotIn("idle", states[states.index("running") :])

    @inlineCallbacks
    def test_timeout_can_cancel_the_turn(self) -> Any:
        """permission_timeout_action cancel_turn cancels the turn when nobody answers."""
        yield self.daemon.stop()
        yield self.start(
            policy=agents_policy(
                limits={"permission_timeout_seconds": 0.3},
                params={"permission_timeout_action": "cancel_turn"},
            )
        )
        sid = yield self.session()
        reply = yield self.prompt(sid, f"edit {self.base_dir}/c.txt x")
        self.assertEqual(reply.json()["stop_reason"], "cancelled")
        page = yield self.events(sid, "&types=permission.resolved")
        self.assertEqual(page["events"][0]["by"], "timeout")


class PermissionTimeoutTests(AgentsTestCase):
    """A question nobody answers does not hold the turn forever."""

    policy = agents_policy(
        limits={"permission_timeout_seconds": 0.5}, params={"allow_always": False}
    )

    @inlineCallbacks
    def test_timeout_denies(self) -> Any:
        """Past permission_timeout_seconds the request is rejected (by: timeout)."""
        sid = yield self.session()
        reply = yield self.prompt(sid, f"edit {self.base_dir}/t.txt x")
        self.assertEqual(reply.json()["text"], "permission refused")
        page = yield self.events(sid, "&types=permission.resolved")
        self.assertEqual(page["events"][0]["by"], "timeout")

    @inlineCallbacks
    def test_allow_always_forbidden(self) -> Any:
        """With allow_always false a human cannot pick an 'always' option: 403 param_not_allowed."""
        yield self.daemon.stop()
        yield self.start(policy=agents_policy(params={"allow_always": False}))
        sid = yield self.session()
        yield self.prompt(sid, f"edit {self.base_dir}/t.txt x", wait=0)
        requests = yield self.pending(sid)
        rid = requests[0]["request_id"]
        reply = yield self.request(
            "POST", f"/agents/requests/{rid}", {"decision": "allow_always"}
        )
        self.assertEqual(reply.status, 403)
        self.assertEqual(reply.json()["code"], "param_not_allowed")
        reply = yield self.request(
            "POST", f"/agents/requests/{rid}", {"decision": "reject_once"}
        )
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.json()["outcome"]["optionId"], "reject")


class ClientSideTests(AgentsTestCase):
    """The agent's fs/* and terminal/* requests, served through the guard."""

    @inlineCallbacks
    def test_fs_read_write_and_refusals(self) -> Any:
        """Reads and writes inside the rule work; outside it the agent gets -32603 naming the code; missing is -32002."""
        path = os.path.join(self.base_dir, "r.txt")
        with open(path, "w") as f:
            f.write("readable")
        sid = yield self.session()
        reply = yield self.prompt(sid, f"read {path}")
        self.assertEqual(reply.json()["text"], "content: readable")
        reply = yield self.prompt(sid, "read /etc/passwd")
        self.assertIn("error -32603", reply.json()["text"])
        self.assertIn("path_not_allowed", reply.json()["text"])
        reply = yield self.prompt(sid, f"read {self.base_dir}/missing.txt")
        self.assertIn("error -32002", reply.json()["text"])
        self.assertIn("Resource not found", reply.json()["text"])
        reply = yield self.prompt(sid, f"write {self.base_dir}/sub/new.txt fresh")
        self.assertEqual(reply.json()["text"], "written")
        with open(os.path.join(self.base_dir, "sub", "new.txt")) as f:
            self.assertEqual(f.read(), "fresh")
        reply = yield self.prompt(sid, "write /tmp/sandboxd-agent-escape nope")
        self.assertIn("path_not_allowed", reply.json()["text"])
        self.assertFalse(os.path.exists("/tmp/sandboxd-agent-escape"))

    @inlineCallbacks
    def test_fs_write_follows_the_paths_rule(self) -> Any:
        """
        The agent's writes obey the same paths rule as the file routes:
        under hard_links deny_writes a file with another name is refused and
        both names keep their bytes; a file's mode survives a rewrite.
        """
        yield self.daemon.stop()
        yield self.start(policy=agents_policy(paths={"hard_links": "deny_writes"}))
        shared = os.path.join(self.base_dir, "shared.txt")
        with open(shared, "w") as f:
            f.write("original")
        os.link(shared, os.path.join(self.base_dir, "other-name.txt"))
        plain = os.path.join(self.base_dir, "plain.sh")
        with open(plain, "w") as f:
            f.write("old")
        os.chmod(plain, 0o750)
        sid = yield self.session()
        reply = yield self.prompt(sid, f"write {shared} changed")
        self.assertIn("error -32603", reply.json()["text"])
        self.assertIn("path_denied", reply.json()["text"])
        with open(os.path.join(self.base_dir, "other-name.txt")) as f:
            self.assertEqual(f.read(), "original")
        reply = yield self.prompt(sid, f"write {plain} new")
        self.assertEqual(reply.json()["text"], "written")
        with open(plain) as f:
            self.assertEqual(f.read(), "new")
        self.assertEqual(os.stat(plain).st_mode & 0o777, 0o750)

    @inlineCallbacks
    def test_terminal(self) -> Any:
        """terminal/create runs the command; its output and exit reach the agent and the HTTP routes."""
        sid = yield self.session()
        reply = yield self.prompt(sid, "terminal sh -c echo")
        self.assertEqual(reply.status, 200)
        reply = yield self.prompt(sid, "terminal printf hello-term")
        self.assertEqual(reply.json()["text"], "exit=0 signal=None output='hello-term'")
        reply = yield self.request("GET", f"/agents/sessions/{sid}/terminals")
        terminals = reply.json()["terminals"]
        self.assertEqual(terminals[-1]["command"], "printf")
        self.assertEqual(terminals[-1]["state"], "exited")
        self.assertTrue(terminals[-1]["released"])
        self.assertEqual(terminals[-1]["tool_call_id"], "run1")
        tid = terminals[-1]["terminal_id"]
        reply = yield self.request(
            "GET", f"/agents/sessions/{sid}/terminals/{tid}/output"
        )
        self.assertEqual(
            "".join(e["data"] for e in reply.json()["events"]), "hello-term"
        )
        stream = yield self.follow(
            f"/agents/sessions/{sid}/terminals/{tid}/output?follow=true"
        )
        yield stream.done
        self.assertEqual([e["event"] for e in stream.events], ["stdout", "exit"])
        self.assertEqual(stream.events[-1]["data"], {"exit_code": 0})

    @inlineCallbacks
    def test_terminal_denied_command(self) -> Any:
        """deny_commands applies to the agent's terminals; the refusal names the rule."""
        yield self.daemon.stop()
        yield self.start(policy=agents_policy(params={"deny_commands": ["printf"]}))
        sid = yield self.session()
        reply = yield self.prompt(sid, "terminal printf nope")
        self.assertIn("error -32603", reply.json()["text"])
        self.assertIn("command_not_allowed", reply.json()["text"])


class ReloadTests(AgentsTestCase):
    """A policy reload reaches the agents already running."""

    @inlineCallbacks
    def test_tightened_paths_reach_a_live_session(self) -> Any:
        """A session created before a reload that denies a path: its agent's write there is refused, nothing written."""
        yield self.start_on_policy_file(agents_policy())
        sid = yield self.session()
        self.reload_policy(agents_policy(paths={"deny": ["**/secret*"]}))
        target = os.path.join(self.base_dir, "secret-after.txt")
        reply = yield self.prompt(sid, f"write {target} leaked")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertIn("path_denied", reply.json()["text"])
        self.assertFalse(os.path.exists(target))

    @inlineCallbacks
    def test_group_off_ends_running_agents(self) -> Any:
        """
        Turning the agents group off ends the running sessions: the agent
        is gone before it could write, its turn ended cancelled.
        """
        yield self.start_on_policy_file(agents_policy())
        sid = yield self.session()
        gate = os.path.join(self.base_dir, "gate")
        target = os.path.join(self.base_dir, "after-reload.txt")
        reply = yield self.prompt(sid, f"waitfor {gate} write {target} late", wait=0)
        self.assertEqual(reply.status, 202, reply.body)
        pid = self.daemon.context.agents.sessions[sid].process.pid
        self.reload_policy({"groups": {"agents": False}})
        session = self.daemon.context.agents.sessions[sid]
        yield session.wait_closed()
        self.assertEqual(session.state, "closed")
        self.assertEqual(session.error["code"], "policy_reload")
        self.assertEqual(session.turns["turn_1"].stop_reason, "cancelled")
        self.assertFalse(is_alive(pid))
        with open(gate, "w"):
            pass
        yield deferLater(reactor, 0.3, lambda: None)
        self.assertFalse(os.path.exists(target))
        reply = yield self.request("GET", f"/agents/sessions/{sid}")
        self.assertEqual(reply.status, 404)

    @inlineCallbacks
    def test_v1_door_sessions_follow_the_reload(self) -> Any:
        """The ``/v1`` door's sessions run on the same engine: they take the new rule, and end when it is off."""
        yield self.start_on_policy_file(agents_policy())
        reply = yield self.request(
            "POST",
            "/v1/agents/sessions",
            {
                "agent": {"model": "fake"},
                "environment": {
                    "type": "self_hosted",
                    "workspace_directory": self.base_dir,
                },
            },
        )
        self.assertEqual(reply.status, 200, reply.body)
        [engine] = self.daemon.context.agents.sessions.values()
        self.reload_policy(agents_policy(paths={"deny": ["**/secret*"]}))
        self.assertEqual(list(engine.rule.paths.deny), ["**/secret*"])
        self.reload_policy({"groups": {"agents": False}})
        yield engine.wait_closed()
        self.assertEqual(engine.state, "closed")
        self.assertFalse(is_alive(engine.process.pid))


class MisbehaviourTests(AgentsTestCase):
    """Failures end in a clear state, never a hang; the tree is gone."""

    @inlineCallbacks
    def test_garbage_is_recorded_not_fatal(self) -> Any:
        """Non-JSON, non-UTF-8, unknown update kinds and stray responses become unknown events; the turn still ends."""
        sid = yield self.session("script-garbage")
        reply = yield self.prompt(sid, "go")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["text"], "still here")
        page = yield self.events(sid, "&types=unknown")
        reasons = [e["reason"] for e in page["events"]]
        for expected in (
            "not JSON",
            "not UTF-8",
            "not a JSON-RPC object",
            "session update 'brand_new_kind'",
            "response to no pending request",
            "notification",
        ):
            self.assertIn(expected, reasons)

    @inlineCallbacks
    def test_odd_lines_do_not_stop_the_reader(self) -> Any:
        """
        A chunk holding a lone UTF-16 surrogate, a request whose id is an
        object and one whose method is a number: each is answered or kept
        (the half as U+FFFD), and the turn ends with the answer that came
        in the same write as the odd chunk.
        """
        sid = yield self.session("script-odd_lines")
        reply = yield self.prompt(sid, "go", wait=15)
        self.assertEqual(reply.status, 200, reply.body)
        turn = reply.json()
        self.assertEqual((turn["state"], turn["stop_reason"]), ("ended", "end_turn"))
        replies = json.loads(turn["text"].split("replies: ", 1)[1].split(" \ufffd")[0])
        self.assertEqual([r and r.get("code") for r in replies[:2]], [-32600, -32600])
        self.assertEqual(replies[2], {})
        self.assertTrue(turn["text"].endswith(" \ufffd lone"), turn["text"])
        with open(os.path.join(self.base_dir, "lone.txt"), "rb") as f:
            self.assertEqual(f.read(), "a\ufffdb".encode())
        page = yield self.events(sid, "&types=unknown")
        reasons = [e["reason"] for e in page["events"]]
        self.assertIn("invalid request id", reasons)
        self.assertIn("the method must be a string", reasons)
        state = yield self.request("GET", f"/agents/sessions/{sid}")
        self.assertEqual(state.json()["state"], "idle")

    @inlineCallbacks
    def test_silent_initialize_is_504(self) -> Any:
        """An agent that never answers initialize: 504 agent_timeout after init_timeout_seconds, process gone."""
        yield self.daemon.stop()
        yield self.start(policy=agents_policy(limits={"init_timeout_seconds": 1}))
        reply = yield self.create("script-silent")
        self.assertEqual(reply.status, 504, reply.body)
        self.assertEqual(reply.json()["code"], "agent_timeout")
        reply = yield self.request("GET", "/agents/sessions")
        session = reply.json()["sessions"][0]
        state = yield self.wait_state(session["session_id"], ("failed",))
        self.assertFalse(is_alive(state["process"]["pid"]))

    @inlineCallbacks
    def test_unanswered_mode_change_is_504(self) -> Any:
        """
        An agent that never answers a mode change: the config call is 504
        agent_timeout within init_timeout_seconds, the session fails and
        its agent is gone, and the session slot is free again.  (The
        bound is the agent's start bound too: the stdlib script agent,
        which starts in a small part of it on a loaded machine, is the
        one started under it.)
        """
        yield self.daemon.stop()
        yield self.start(
            policy=agents_policy(
                limits={"init_timeout_seconds": UNANSWERED_SECONDS, "max_sessions": 1}
            )
        )
        sid = yield self.session("script-stuck_config")
        started = reactor.seconds()
        reply = yield self.request(
            "POST", f"/agents/sessions/{sid}/config", {"mode": "code"}
        )
        self.assertEqual(reply.status, 504, reply.body)
        self.assertEqual(reply.json()["code"], "agent_timeout")
        self.assertIn("session/set_mode", reply.json()["error"])
        self.assertLess(reactor.seconds() - started, 16)
        state = yield self.wait_state(sid, ("failed",))
        self.assertEqual(state["error"]["code"], "agent_timeout")
        self.assertFalse(is_alive(state["process"]["pid"]))
        again = yield self.session("script-stuck_config")
        self.assertTrue(again)

    @inlineCallbacks
    def test_unanswered_mode_at_create_is_504(self) -> Any:
        """
        A create whose mode the agent never confirms: 504 agent_timeout,
        nothing left listed, the agent's process gone.
        """
        yield self.daemon.stop()
        yield self.start(
            policy=agents_policy(limits={"init_timeout_seconds": UNANSWERED_SECONDS})
        )
        reply = yield self.create("script-stuck_config", mode="code")
        self.assertEqual(reply.status, 504, reply.body)
        self.assertEqual(reply.json()["code"], "agent_timeout")
        self.assertIn("session/set_mode", reply.json()["error"])
        reply = yield self.request("GET", "/agents/sessions")
        self.assertEqual(reply.json()["sessions"], [])

    @inlineCallbacks
    def test_unanswered_session_list_is_504(self) -> Any:
        """
        An agent that never answers ``session/list``: the catalogue's
        sessions call is 504 agent_timeout, and the transient agent is gone.
        """
        yield self.daemon.stop()
        yield self.start(
            policy=agents_policy(limits={"init_timeout_seconds": UNANSWERED_SECONDS})
        )
        started = reactor.seconds()
        reply = yield self.request(
            "GET", "/agents/catalog/script-stuck_config/sessions"
        )
        self.assertEqual(reply.status, 504, reply.body)
        self.assertEqual(reply.json()["code"], "agent_timeout")
        self.assertIn("session/list", reply.json()["error"])
        self.assertLess(reactor.seconds() - started, 20)
        # Ended as a tree once the call is answered: TERM, then KILL after
        # its grace; on a busy machine the last exit may come a moment later.
        for _ in range(100):
            if not marked_pids(f"{SCRIPT}\0stuck_config"):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertEqual(marked_pids(f"{SCRIPT}\0stuck_config"), [])

    @inlineCallbacks
    def test_exit_at_init_is_502_with_stderr(self) -> Any:
        """An agent that dies during session/new: 502 agent_error carrying its stderr tail."""
        reply = yield self.create("script-exit_at_init")
        self.assertEqual(reply.status, 502, reply.body)
        self.assertEqual(reply.json()["code"], "agent_error")
        self.assertIn("no API key configured", reply.json()["stderr_tail"])

    @inlineCallbacks
    def test_over_long_line_fails_the_session(self) -> Any:
        """A line over max_message_bytes fails the session with the reason; the prompt does not hang."""
        yield self.daemon.stop()
        yield self.start(policy=agents_policy(limits={"max_message_bytes": 100000}))
        sid = yield self.session("script-huge")
        reply = yield self.prompt(sid, "go")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["state"], "failed")
        self.assertEqual(reply.json()["error"]["code"], "message_too_large")
        state = yield self.wait_state(sid, ("failed",))
        self.assertEqual(state["error"]["code"], "message_too_large")
        self.assertFalse(is_alive(state["process"]["pid"]))

    @inlineCallbacks
    def test_exit_mid_turn(self) -> Any:
        """The agent dies mid-turn: the turn fails, the session is failed, agent.exited has the stderr tail."""
        sid = yield self.session()
        reply = yield self.prompt(sid, "exit")
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.json()["state"], "failed")
        yield self.wait_state(sid, ("failed",))
        page = yield self.events(sid)
        exited = next(e for e in page["events"] if e["type"] == "agent.exited")
        self.assertEqual(exited["exit_code"], 3)
        self.assertIn("crashed on purpose", exited["stderr_tail"])
        states = [e["state"] for e in page["events"] if e["type"] == "session.state"]
        self.assertEqual(states[-2:], ["running", "failed"])
        self.assertEqual(page["events"][-1]["type"], "session.closed")

    @inlineCallbacks
    def test_cancel_request_withdraws(self) -> Any:
        """$/cancel_request withdraws a held permission: -32800 to the agent, 409 withdrawn to a late reply."""
        sid = yield self.session("script-cancel_request")
        yield self.prompt(sid, "go", wait=0)
        requests = yield self.pending(sid)
        rid = requests[0]["request_id"]
        reply = yield self.request(
            "GET", f"/agents/sessions/{sid}/turns/turn_1?wait=10"
        )
        self.assertIn("-32800", reply.json()["text"])
        reply = yield self.request(
            "POST", f"/agents/requests/{rid}", {"decision": "allow_once"}
        )
        self.assertEqual(reply.status, 409)
        self.assertEqual(reply.json()["code"], "withdrawn")
        page = yield self.events(sid, "&types=permission.resolved")
        self.assertEqual(page["events"][0]["by"], "withdrawn")

    @inlineCallbacks
    def test_reused_ids(self) -> Any:
        """A request reusing a held id is refused with -32600 and recorded; nothing hangs."""
        sid = yield self.session("script-reused_ids")
        reply = yield self.prompt(sid, "go")
        self.assertIn("-32600", reply.json()["text"])
        page = yield self.events(sid, "&types=unknown")
        self.assertIn(
            "request id already in use", [e["reason"] for e in page["events"]]
        )

    @inlineCallbacks
    def test_question(self) -> Any:
        """elicitation/create is held as a question; the approver's answer goes back as the JSON-RPC result."""
        sid = yield self.session("script-question")
        yield self.prompt(sid, "go", wait=0)
        requests = yield self.pending(sid)
        question = requests[0]
        self.assertEqual(
            (question["kind"], question["message"]), ("question", "Which branch?")
        )
        for content, problem in (
            ({"branch": 5}, "content.branch must be a string"),
            ({"branch": "main", "force": True}, "content.force was not asked for"),
        ):
            reply = yield self.request(
                "POST",
                f"/agents/requests/{question['request_id']}",
                {"action": "accept", "content": content},
            )
            self.assertEqual(reply.status, 400, reply.body)
            self.assertEqual(
                (reply.json()["code"], reply.json()["param"]),
                ("invalid_param", "content"),
            )
            self.assertIn(problem, reply.json()["error"])
        reply = yield self.request(
            "POST",
            f"/agents/requests/{question['request_id']}",
            {"action": "accept", "content": {"branch": "main"}},
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request(
            "GET", f"/agents/sessions/{sid}/turns/turn_1?wait=10"
        )
        self.assertEqual(
            reply.json()["text"],
            'answer: {"action": "accept", "content": {"branch": "main"}}',
        )

    @inlineCallbacks
    def test_error_after_cancel_is_cancelled(self) -> Any:
        """An agent that answers a cancelled prompt with an error still ends the turn cancelled."""
        sid = yield self.session("script-cancel_error")
        yield self.prompt(sid, "go", wait=0)
        reply = yield self.request(
            "POST", f"/agents/sessions/{sid}/cancel", {"wait": 10}
        )
        self.assertEqual(reply.json()["stop_reason"], "cancelled")
        self.assertFalse(reply.json()["forced"])
        reply = yield self.request("GET", f"/agents/sessions/{sid}")
        self.assertEqual(reply.json()["state"], "idle")

    @inlineCallbacks
    def test_ignored_cancel_is_forced(self) -> Any:
        """An agent that ignores cancel is killed after the grace period: cancelled, forced; its tree is gone."""
        from sandboxd.policy import defaults

        self.patch(defaults, "AGENT_CANCEL_GRACE_SECONDS", 1.0)
        sid = yield self.session()
        yield self.prompt(sid, "stubborn", wait=0)
        reply = yield self.request("POST", f"/agents/sessions/{sid}/cancel", {})
        self.assertEqual(reply.status, 200)
        self.assertEqual(
            (
                reply.json()["state"],
                reply.json()["stop_reason"],
                reply.json()["forced"],
            ),
            ("ended", "cancelled", True),
        )
        state = yield self.wait_state(sid, ("failed",))
        self.assertFalse(is_alive(state["process"]["pid"]))
        self.assertEqual(state["error"]["code"], "agent_killed")

    @inlineCallbacks
    def test_turn_limit(self) -> Any:
        """max_turn_seconds cancels the turn; the agent that honours cancel ends it cleanly."""
        yield self.daemon.stop()
        yield self.start(policy=agents_policy(limits={"max_turn_seconds": 0.5}))
        sid = yield self.session()
        reply = yield self.prompt(sid, "slow", wait=10)
        self.assertEqual(reply.status, 200)
        self.assertEqual(reply.json()["stop_reason"], "cancelled")

    @inlineCallbacks
    def test_grandchild_ignoring_term_is_killed(self) -> Any:
        """Deleting a session whose agent and grandchild ignore SIGTERM still kills the whole tree."""
        pidfile = os.path.join(self.base_dir, "grandchild.pid")
        yield self.daemon.stop()
        catalog = dict(CATALOG)
        catalog["script-grandchild"] = dict(
            script("grandchild"), env={"PIDFILE": pidfile}
        )
        policy = agents_policy()
        policy["agents"] = {"catalog": catalog}
        yield self.start(policy=policy)
        sid = yield self.session("script-grandchild")
        for _ in range(50):
            if os.path.exists(pidfile) and open(pidfile).read().strip():
                break
            yield deferLater(reactor, 0.1, lambda: None)
        grandchild = int(open(pidfile).read())
        self.assertTrue(is_alive(grandchild))
        reply = yield self.request("GET", f"/agents/sessions/{sid}")
        pid = reply.json()["process"]["pid"]
        reply = yield self.request("DELETE", f"/agents/sessions/{sid}")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["state"], "closed")
        yield deferLater(reactor, 0.3, lambda: None)
        self.assertFalse(is_alive(pid))
        self.assertFalse(is_alive(grandchild))


class InstallTests(AgentsTestCase):
    """agents:install runs npm as a managed process."""

    policy = agents_policy()

    def setUp(self) -> Any:
        fake_npm(self, 'echo "fake npm $*"')
        self.policy = agents_policy()
        self.policy["agents"]["catalog"]["missing"] = MISSING_AGENT
        return super().setUp()

    @inlineCallbacks
    def test_install_runs_npm(self) -> Any:
        """A missing agent is installed with its pinned package; the output is a managed process's output."""
        reply = yield self.request("POST", "/agents/catalog/missing/install", {})
        self.assertEqual(reply.status, 202, reply.body)
        pid = reply.json()["pid"]
        self.assertEqual(reply.json()["state"], "installing")
        for _ in range(50):
            out = yield self.request("GET", f"/process/{pid}/output")
            if out.json()["state"] == "exited":
                break
            yield deferLater(reactor, 0.1, lambda: None)
        text = "".join(e["data"] for e in out.json()["events"])
        self.assertIn("fake npm install -g fake-agent-pkg@1.2.3", text)

    @inlineCallbacks
    def test_installed_agent(self) -> Any:
        """An installed agent answers 200 already_installed."""
        reply = yield self.request("POST", "/agents/catalog/fake/install", {})
        self.assertEqual(reply.status, 200)
        self.assertTrue(reply.json()["already_installed"])


class ShutdownTests(AgentsTestCase):
    """The daemon's stop ends every agent."""

    @inlineCallbacks
    def test_stop_kills_agents(self) -> Any:
        """Stopping the daemon ends each agent's whole tree, within the grace period."""
        reply = yield self.create()
        sid = reply.json()["session_id"]
        reply = yield self.request("GET", f"/agents/sessions/{sid}")
        pid = reply.json()["process"]["pid"]
        yield self.daemon.stop()
        self.assertFalse(is_alive(pid))
        yield self.start()


#: Builds a daemon in a fresh interpreter and says what its agents service is.
_LAZY_PROBE = """
import json, sys
from twisted.internet.testing import MemoryReactor
from sandboxd.daemon.server import Settings, build
daemon = build(Settings(port="tcp:0:interface=127.0.0.1", base_dir=sys.argv[1]),
               MemoryReactor())
agents = daemon.context.agents
agents.startService()
stopped = agents.stopService()
loaded = sorted(m for m in sys.modules if m.startswith("sandboxd.agents."))
built = agents.get()
print(json.dumps({
    "loaded": loaded,
    "stopped": stopped is None,
    "built": type(built).__module__ + "." + type(built).__name__,
}))
"""


class LazyStartTests(TestCase):
    """The agents group costs a daemon that serves no agent nothing."""

    timeout = 60

    @inlineCallbacks
    def test_no_agents_module_until_first_use(self) -> Any:
        """
        A daemon built, started and stopped without an agent imports no
        module of ``sandboxd.agents`` (the group is off by default) and
        stops at once; ``context.agents`` builds the session manager on
        first use.
        """
        base = self.mktemp()
        os.makedirs(base)
        stdout, stderr, code = yield getProcessOutputAndValue(
            sys.executable, ["-c", _LAZY_PROBE, base], env=dict(os.environ)
        )
        self.assertEqual(code, 0, stderr.decode())
        found = json.loads(stdout)
        self.assertEqual(found["loaded"], [])
        self.assertTrue(found["stopped"])
        self.assertEqual(found["built"], "sandboxd.agents.manager.AgentManager")


class IdleTests(AgentsTestCase):
    """idle_timeout_seconds closes a session nobody uses."""

    policy = agents_policy(limits={"idle_timeout_seconds": 0.5})

    @inlineCallbacks
    def test_idle_session_closes(self) -> Any:
        """An idle session is closed after the limit; its agent is gone."""
        sid = yield self.session()
        state = yield self.wait_state(sid, ("closed",))
        self.assertFalse(is_alive(state["process"]["pid"]))


class KeptClosedTests(AgentsTestCase):
    """Closed sessions stay listed within a count and a byte budget."""

    @inlineCallbacks
    def test_oldest_closed_forgotten_past_the_bytes(self) -> Any:
        """
        Past the bytes their logs may hold together, the oldest closed
        sessions are forgotten (404, not listed); the newest closed one and
        the live one stay (the count, far from its bound, forgets none).
        """
        sids = []
        for n in range(3):
            reply = yield self.create(prompt=f"hello {n}")
            self.assertEqual(reply.status, 201, reply.body)
            sids.append(reply.json()["session_id"])
            yield self.wait_state(sids[-1], ("idle",))
        live = yield self.session()
        # No room at all: only the newest closed session may stay.
        self.patch(defaults, "AGENT_KEPT_CLOSED_BYTES", 1)
        for sid in sids:
            reply = yield self.request("DELETE", f"/agents/sessions/{sid}")
            self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request("GET", "/agents/sessions")
        listed = {s["session_id"] for s in reply.json()["sessions"]}
        self.assertEqual(listed, {sids[2], live})
        reply = yield self.request("GET", f"/agents/sessions/{sids[0]}")
        self.assertEqual(reply.status, 404)


class RealAgentTests(AgentsTestCase):
    """
    Opt-in: the real agents of the built-in catalogue, where their binary
    and key exist (``SANDBOXD_REAL_AGENTS=1``); skipped everywhere else.
    """

    timeout = 300

    @inlineCallbacks
    def check(self, agent_id: str) -> Any:
        from sandboxd.agents.catalog import BUILTIN

        entry = next(e for e in BUILTIN if e.id == agent_id)
        if not os.environ.get("SANDBOXD_REAL_AGENTS"):
            raise SkipTest("set SANDBOXD_REAL_AGENTS=1 to run real agents")
        if entry.found(os.environ) is None or not all(
            os.environ.get(k) for k in entry.env_required
        ):
            raise SkipTest(f"{agent_id} or its key is not available here")
        yield self.daemon.stop()
        yield self.start(policy=agents_policy(limits={"init_timeout_seconds": 120}))
        sid = yield self.session(agent_id, cwd=self.base_dir)
        reply = yield self.prompt(sid, "Reply with the single word: pong", wait=240)
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stop_reason"], "end_turn")
        self.assertIn("pong", reply.json()["text"].lower())

    def test_claude(self) -> Any:
        """claude-agent-acp answers a prompt."""
        return self.check("claude")

    def test_codex(self) -> Any:
        """codex-acp answers a prompt (after authenticate)."""
        return self.check("codex")

    def test_gemini(self) -> Any:
        """gemini --acp answers a prompt (after authenticate)."""
        return self.check("gemini")

    def test_opencode(self) -> Any:
        """opencode acp answers a prompt."""
        return self.check("opencode")


class DocumentedFiltersTests(SynchronousTestCase):
    """The filters the API reference lists are the ones the routes take."""

    def test_states_as_documented(self) -> None:
        """The declared ``state`` choices are the session and request states."""
        from sandboxd.agents.permissions import REQUEST_STATES
        from sandboxd.agents.state import SESSION_STATES
        from sandboxd.api.schema import schema_for

        def declared(endpoint_id: str) -> tuple[str, ...]:
            (state,) = [f for f in schema_for(endpoint_id).query if f.name == "state"]
            return tuple(state.enum or ())

        self.assertEqual(declared("agents_session_list"), SESSION_STATES)
        self.assertEqual(declared("agents_requests"), (*REQUEST_STATES, "all"))
