# -*- test-case-name: tests.agents.test_process -*-
"""
Agent trees (:mod:`sandboxd.agents.process`, :mod:`sandboxd.agents.terminals`)
end like every other child's: a descendant that left the session with
``setsid`` and ignores SIGTERM is killed and reaped with the agent, with
the agent's terminal, and at daemon shutdown.

Each test marks its processes with a sleep of ``60.<random>`` seconds,
which no other process uses, as :mod:`tests.processes.test_children` does.
"""

from __future__ import annotations

import os
import secrets
import sys
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from sandboxd.processes import tree as proctree
from tests.agents.test_agents import CATALOG, FAKE, AgentsTestCase, agents_policy
from tests.helpers import alive, kill_marked, marked_pids


class AgentTreeTests(AgentsTestCase):
    """What an agent or its terminal leaves behind goes with it."""

    autostart = False

    def setUp(self) -> Any:
        self.marker = f"60.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, self.marker)
        if not proctree.become_subreaper():
            raise self.skipTest("no PR_SET_CHILD_SUBREAPER here")
        super().setUp()
        return self.start(policy=self.policy_with_escapee())

    def escapee(self, name: str) -> str:
        """
        Shell that leaves a grandchild in a session of its own, deaf to TERM,
        and waits until it has left (it touches ``name`` once out).

        It calls ``setsid`` after its only exec: late in an exec, /proc's
        environ reads empty, and :func:`sandboxd.processes.tree.kill_tree` cannot
        tell that a process outside the session carries the tree's marker.
        """
        ready = os.path.join(self.base_dir, name)
        code = (
            "import os, signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f'os.setsid(); open("{ready}", "w").close(); time.sleep({self.marker})'
        )
        wait = f"until [ -e {ready} ]; do sleep 0.01; done"
        return f"({sys.executable} -c '{code}' &); {wait}"

    def policy_with_escapee(self) -> dict[str, Any]:
        """The test catalogue plus ``escaping``: the fake agent after the escapee."""
        catalog = dict(CATALOG)
        script = f"{self.escapee('agent.ready')}; exec {sys.executable} {FAKE}"
        catalog["escaping"] = {"name": "Escaping", "command": ["sh", "-c", script]}
        policy = agents_policy()
        policy["agents"] = {"catalog": catalog}
        return policy

    @inlineCallbacks
    def wait_marked(self, present: bool) -> Any:
        """Poll until marked processes exist (or are all gone); returns them."""
        for _ in range(200):
            if bool(marked_pids(self.marker)) == present:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        return marked_pids(self.marker)

    @inlineCallbacks
    def assert_reaped(self, pids: list[int]) -> Any:
        """Every one of ``pids`` is gone from /proc: killed and reaped, no zombie."""
        for _ in range(200):
            if all(proctree.proc_info(pid) is None for pid in pids):
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual([p for p in pids if proctree.proc_info(p) is not None], [])

    def script(self, name: str, body: str) -> str:
        """A shell script in the base directory, for the agent's terminal."""
        path = os.path.join(self.base_dir, name)
        with open(path, "w") as f:
            f.write(body)
        return path

    @inlineCallbacks
    def test_delete_ends_an_escaped_grandchild(self) -> Any:
        """DELETE ends the agent and the setsid'd, TERM-ignoring grandchild its command started."""
        sid = yield self.session("escaping")
        seen = yield self.wait_marked(True)
        self.assertNotEqual(seen, [])
        reply = yield self.request("DELETE", f"/agents/sessions/{sid}")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["state"], "closed")
        left = yield self.wait_marked(False)
        self.assertEqual(left, [])
        yield self.assert_reaped(seen)

    @inlineCallbacks
    def test_failed_agent_takes_its_escapee(self) -> Any:
        """An agent that dies mid-turn leaves no escaped grandchild behind."""
        sid = yield self.session("escaping")
        seen = yield self.wait_marked(True)
        reply = yield self.prompt(sid, "exit")
        self.assertEqual(reply.json()["state"], "failed")
        left = yield self.wait_marked(False)
        self.assertEqual(left, [])
        yield self.assert_reaped(seen)

    @inlineCallbacks
    def test_shutdown_ends_an_escaped_grandchild(self) -> Any:
        """Stopping the daemon ends the agent's escaped grandchild too, well within the kill grace."""
        reply = yield self.create("escaping")
        self.assertEqual(reply.status, 201, reply.body)
        seen = yield self.wait_marked(True)
        began = reactor.seconds()
        yield self.daemon.stop()
        self.assertLess(reactor.seconds() - began, 4.0)
        left = yield self.wait_marked(False)
        self.assertEqual(left, [])
        yield self.assert_reaped(seen)
        yield self.start()

    @inlineCallbacks
    def test_terminal_exit_ends_its_escapee(self) -> Any:
        """A terminal command that exits at once leaves no escaped grandchild behind."""
        path = self.script("leave.sh", self.escapee("leave.ready") + "\necho left\n")
        sid = yield self.session()
        reply = yield self.prompt(sid, f"terminal sh {path}")
        self.assertEqual(reply.json()["text"], "exit=0 signal=None output='left\\n'")
        left = yield self.wait_marked(False)
        self.assertEqual(left, [])

    @inlineCallbacks
    def test_terminal_kill_ends_its_escapee(self) -> Any:
        """Killing a terminal (TERM) ends its command and the TERM-ignoring grandchild that escaped its session."""
        path = self.script(
            "hold.sh", f"{self.escapee('hold.ready')}\nsleep {self.marker}\n"
        )
        sid = yield self.session()
        reply = yield self.prompt(sid, f"terminal sh {path}", wait=0)
        self.assertEqual(reply.status, 202, reply.body)
        for _ in range(100):
            if len(marked_pids(self.marker)) >= 2:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        seen = marked_pids(self.marker)
        reply = yield self.request("GET", f"/agents/sessions/{sid}/terminals")
        tid = reply.json()["terminals"][-1]["terminal_id"]
        reply = yield self.request(
            "POST", f"/agents/sessions/{sid}/terminals/{tid}/kill", {"signal": 15}
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request(
            "GET", f"/agents/sessions/{sid}/turns/turn_1?wait=10"
        )
        text = reply.json()["text"]
        self.assertTrue(text.startswith("exit=None signal=SIGTERM "), text)
        left = yield self.wait_marked(False)
        self.assertEqual(left, [])
        yield self.assert_reaped(seen)


def _nice_and_group(pid: int) -> tuple[int, str]:
    """A process's nice value (stat field 19) and its autogroup line (or ``none``)."""
    with open(f"/proc/{pid}/stat") as f:
        nice = int(f.read().rsplit(")", 1)[1].split()[19 - 3])
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            group = f.read().strip()
    except OSError:
        group = "none"
    return nice, group


class AgentPriorityTests(AgentsTestCase):
    """
    The agent answers the user's every turn: it runs at ``agents_nice``
    (0 by default), not behind the sandbox's work; the terminals the
    daemon runs for it stay at ``children_nice``.
    """

    @inlineCallbacks
    def agent_pid(self) -> Any:
        """A new session's agent pid."""
        sid = yield self.session()
        reply = yield self.request("GET", f"/agents/sessions/{sid}")
        self.assertEqual(reply.status, 200, reply.body)
        return sid, reply.json()["process"]["pid"]

    @inlineCallbacks
    def test_agent_runs_at_agents_nice(self) -> Any:
        """
        By default the agent runs at nice 0 in a session group of nice 0,
        while a command its terminal runs is at nice 10.
        """
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            raise self.skipTest("the test process itself runs above nice 0")
        sid, pid = yield self.agent_pid()
        nice, group = _nice_and_group(pid)
        self.assertEqual(nice, 0)
        if group != "none":
            self.assertTrue(group.endswith(" nice 0"), group)
        path = os.path.join(self.base_dir, "nice.sh")
        with open(path, "w") as f:
            f.write("cut -d' ' -f19 /proc/$$/stat\n")
        reply = yield self.prompt(sid, f"terminal sh {path}")
        self.assertEqual(reply.json()["text"], "exit=0 signal=None output='10\\n'")


def _agents_below_policy() -> dict[str, Any]:
    policy = agents_policy()
    policy["priority"] = {"agents_nice": 10}
    return policy


class AgentPriorityPolicyTests(AgentPriorityTests):
    """The policy can still put agents with the sandbox's other work."""

    policy = _agents_below_policy()

    @inlineCallbacks
    def test_agent_runs_at_agents_nice(self) -> Any:
        """``priority.agents_nice: 10`` starts the agent at nice 10, in a group of nice 10."""
        _, pid = yield self.agent_pid()
        nice, group = _nice_and_group(pid)
        self.assertEqual(nice, 10)
        if group != "none":
            self.assertTrue(group.endswith(" nice 10"), group)


class WaitGoneTests(TestCase):
    """An agent's exit and the end of what it left behind, apart."""

    @inlineCallbacks
    def test_wait_gone_outlasts_the_leftovers(self) -> Any:
        """
        A leader that exits leaving a background child: ``wait_exit`` fires
        at its exit, ``wait_gone`` only once the child is gone too, so a
        stop that waits for it leaves no kill in progress behind.
        """
        from sandboxd import processes
        from sandboxd.agents.process import AgentProcess, HeadTailLog
        from sandboxd.jsonrpc import LineFramer

        pid_file = os.path.realpath(self.mktemp())
        agent = AgentProcess(
            reactor,
            processes.ChildTable(),
            HeadTailLog(4096),
            LineFramer(4096, lambda line: None, lambda: None),
            lambda code, sig: None,
        )
        agent.spawn(
            "/bin/sh",
            ["sh", "-c", f"sleep 30 & echo $! > {pid_file}; exit 0"],
            dict(os.environ),
            os.getcwd(),
            None,
        )
        code = yield agent.wait_gone()
        self.assertEqual(code, 0)
        with open(pid_file) as f:
            leftover = int(f.read())
        self.assertFalse(alive(leftover))
