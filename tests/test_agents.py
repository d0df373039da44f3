"""
The agents group (SPEC §15) against a real daemon and real fake agents:
an SDK-built agent for the scenarios, a stdlib script for misbehaviour.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.protocol import Protocol
from twisted.internet.task import deferLater
from twisted.web.client import Agent
from twisted.web.http_headers import Headers

from sandboxd.agents.jsonrpc import LineFramer
from sandboxd.agents.process import is_alive
from tests.helpers import DaemonTestCase

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "agents", "fake_agent.py")
SCRIPT = os.path.join(HERE, "agents", "script_agent.py")


def fake(*flags: str, **extra: Any) -> dict[str, Any]:
    """A policy catalogue entry running the SDK fake agent."""
    entry = {"name": "Fake agent", "command": [sys.executable, FAKE, *flags]}
    entry.update(extra)
    return entry


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


class SSEClient(Protocol):
    """Collects SSE frames from a streaming response."""

    def __init__(self) -> None:
        self.buffer = b""
        self.events: list[dict[str, Any]] = []
        self.done: Deferred[None] = Deferred()
        self.waiters: list[tuple[Any, Deferred[None]]] = []

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while b"\n\n" in self.buffer:
            block, self.buffer = self.buffer.split(b"\n\n", 1)
            event: dict[str, Any] = {}
            for line in block.decode().split("\n"):
                if line.startswith("id: "):
                    event["id"] = int(line[4:])
                elif line.startswith("event: "):
                    event["event"] = line[7:]
                elif line.startswith("data: "):
                    event["data"] = json.loads(line[6:])
            if "event" in event:
                self.events.append(event)
        for predicate, d in list(self.waiters):
            if any(predicate(e) for e in self.events):
                self.waiters.remove((predicate, d))
                d.callback(None)

    def connectionLost(self, reason: Any = None) -> None:
        if not self.done.called:
            self.done.callback(None)

    def wait_for(self, predicate: Any) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        if any(predicate(e) for e in self.events):
            d.callback(None)
        else:
            self.waiters.append((predicate, d))
        return d

    def disconnect(self) -> None:
        self.transport.stopProducing()


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
        client = SSEClient()
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
        """Create answers 201 with the agent's modes and config; a prompt within wait answers 200 with the text."""
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
    def test_create_with_prompt(self) -> Any:
        """A prompt given to create starts the first turn at once."""
        reply = yield self.create(prompt="echo started")
        self.assertEqual(reply.status, 201)
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
    def test_too_many_sessions(self) -> Any:
        """max_sessions bounds live sessions: 429 too_many_sessions."""
        yield self.daemon.stop()
        yield self.start(policy=agents_policy(limits={"max_sessions": 1}))
        yield self.session()
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
