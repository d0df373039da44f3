"""
The terminal group against a real daemon: REST sessions on real PTYs and
the WebSocket a user attaches with (SPEC §7.5, §8).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import sys
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import deferLater

from sandboxd.policy.defaults import KILL_GRACE_SECONDS
from sandboxd.processes.tree import descendants, proc_info
from tests.helpers import (
    DaemonTestCase,
    alive,
    group_nice,
    kill_marked,
    marked_argv0,
    marked_pids,
    need_autogroups,
)
from tests.terminals.wsclient import TestClient, connect, quiet_server

TOKEN = "pty-token"


def sleep(seconds: float) -> Deferred[None]:
    """Let the reactor run (only to wait for something outside it)."""
    return deferLater(reactor, seconds, lambda: None)


@inlineCallbacks
def wait_until(predicate: Any, tries: int = 200) -> Any:
    """Poll a condition outside the reactor (a process state) until it holds."""
    for _ in range(tries):
        if predicate():
            return True
        yield sleep(0.05)
    return False


def is_output(message: dict[str, Any]) -> bool:
    return message.get("type") == "output"


def is_exited(message: dict[str, Any]) -> bool:
    return message.get("event") == "exited"


class TerminalCase(DaemonTestCase):
    """A daemon with its WebSocket timers off, and session helpers."""

    @inlineCallbacks
    def start(self, **kwargs: Any) -> Any:
        daemon = yield super().start(**kwargs)
        quiet_server(daemon.context.terminals)
        return daemon

    @property
    def pty_port(self) -> int:
        port: int = self.daemon.context.pty_port
        return port

    @inlineCallbacks
    def create(self, body: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """
        POST /pty/sessions; returns the JSON (fails the test unless 200).

        ``sh`` by default: an interactive bash would source the developer's
        ~/.bashrc, which is not what these tests are about.
        """
        body = {"shell": "sh", **(body or {})}
        reply = yield self.request("POST", "/pty/sessions", body, **kwargs)
        self.assertEqual(reply.status, 200, reply.body)
        return reply.json()

    @inlineCallbacks
    def attach(self, session_id: str | None, **kwargs: Any) -> Any:
        """A connected client whose connection is closed after the test."""
        client: TestClient = yield connect(self.pty_port, session_id, **kwargs)
        self.addCleanup(self.hang_up, client)
        return client

    def hang_up(self, client: TestClient) -> Deferred[Any]:
        if client.closed.called:
            return client.closed
        client.transport.loseConnection()
        return client.closed


def _sleep_in_foreground(shell: int) -> bool:
    """Whether a ``sleep`` below ``shell`` leads its terminal's foreground group."""
    try:
        with open(f"/proc/{shell}/stat", "rb") as f:
            foreground = int(f.read().rsplit(b")", 1)[1].split()[5])
        for pid in descendants(shell):
            with open(f"/proc/{pid}/comm", "rb") as f:
                if f.read().strip() == b"sleep" and os.getpgid(pid) == foreground:
                    return True
    except (OSError, ValueError, IndexError):
        pass
    return False


class SessionTests(TerminalCase):
    """REST sessions and one client at a time."""

    @inlineCallbacks
    def test_create_answers_id_url_pid(self) -> Any:
        """POST /pty/sessions answers session_id, pid and a ws_url naming the
        request's host and the real PTY port."""
        created = yield self.create()
        self.assertEqual(set(created), {"session_id", "ws_url", "pid"})
        self.assertEqual(
            created["ws_url"],
            f"ws://127.0.0.1:{self.pty_port}/pty?session_id={created['session_id']}",
        )
        self.assertTrue(alive(created["pid"]))

    @inlineCallbacks
    def test_started_then_echo(self) -> Any:
        """A client gets ``started`` first, then the echo of what it types."""
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        first = yield client.wait_for(lambda m: True)
        self.assertEqual(
            first,
            {
                "type": "event",
                "event": "started",
                "session_id": created["session_id"],
                "pid": created["pid"],
            },
        )
        client.type("echo hel''lo-there\n")
        yield client.wait_output("hello-there")

    @inlineCallbacks
    def test_sized_before_start(self) -> Any:
        """cols/rows are the terminal's size from the shell's first instruction."""
        created = yield self.create({"cols": 111, "rows": 33})
        client = yield self.attach(created["session_id"])
        client.type("stty size\n")
        yield client.wait_output("33 111")

    @inlineCallbacks
    def test_term_and_cwd(self) -> Any:
        """TERM is xterm-256color and cwd goes through the guard."""
        os.mkdir(os.path.join(self.base_dir, "sub"))
        created = yield self.create({"cwd": "sub", "env": {"GREETING": "hi"}})
        client = yield self.attach(created["session_id"])
        client.type('echo "<$TERM>" "<$PWD>" "<$GREETING>"\n')
        yield client.wait_output(f"<xterm-256color> <{self.base_dir}/sub> <hi>")

    @inlineCallbacks
    def test_resize_rest_and_ws(self) -> Any:
        """Resizing over REST and over the socket is what `stty size` sees."""
        created = yield self.create()
        sid = created["session_id"]
        reply = yield self.request(
            "POST", f"/pty/sessions/{sid}/resize", {"cols": 120, "rows": 40}
        )
        self.assertEqual(reply.status, 200)
        self.assertEqual((reply.json()["cols"], reply.json()["rows"]), (120, 40))
        client = yield self.attach(sid)
        client.type("stty size\n")
        yield client.wait_output("40 120")
        client.send_json({"type": "resize", "cols": 100, "rows": 50})
        client.type("stty size\n")
        yield client.wait_output("50 100")

    @inlineCallbacks
    def test_sigint_interrupts_foreground_job(self) -> Any:
        """A SIGINT message stops the foreground `sleep`, not the shell."""
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        client.type("sleep 30\n")
        # Until sleep runs as the terminal's foreground group: before the
        # shell hands it the terminal, SIGINT goes to the shell's group.
        found = yield wait_until(lambda: _sleep_in_foreground(created["pid"]))
        self.assertTrue(found)
        client.send_json({"type": "signal", "signal": "SIGINT"})
        client.type("echo after''-int\n")
        yield client.wait_output("after-int")
        self.assertTrue(alive(created["pid"]))

    @inlineCallbacks
    def test_signal_with_no_foreground_group_goes_to_the_shell(self) -> Any:
        """
        A terminal with no foreground group (its shell not yet settled, or
        just gone) reports group 0: the signal goes to the shell's group,
        never to killpg(0), which is the daemon's own group.
        """
        created = yield self.create()
        session = self.daemon.context.terminals.table.get(created["session_id"])
        sent: list[tuple[int, int]] = []
        self.patch(os, "tcgetpgrp", lambda fd: 0)
        self.patch(os, "killpg", lambda group, sig: sent.append((group, sig)))
        self.assertTrue(session.send_signal("SIGINT"))
        self.assertEqual(sent, [(created["pid"], signal.SIGINT)])

    @inlineCallbacks
    def test_signal_before_the_shell_leads_its_group(self) -> Any:
        """
        Just after the fork the shell is not yet the leader of a group of
        its own: killpg finds no such group, and the signal goes to the
        shell itself instead of being lost.
        """
        created = yield self.create()
        session = self.daemon.context.terminals.table.get(created["session_id"])
        killed: list[tuple[int, int]] = []
        self.patch(os, "tcgetpgrp", lambda fd: 0)

        def no_group(group: int, sig: int) -> None:
            raise ProcessLookupError(group)

        self.patch(os, "killpg", no_group)
        self.patch(os, "kill", lambda pid, sig: killed.append((pid, sig)))
        self.assertTrue(session.send_signal("SIGTERM"))
        self.assertEqual(killed, [(created["pid"], signal.SIGTERM)])

    @inlineCallbacks
    def test_exit_code_delivered(self) -> Any:
        """`exit 3` ends the session: `exited` with 3, then a normal close."""
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        client.type("exit 3\n")
        exited = yield client.wait_for(is_exited)
        self.assertEqual(
            exited,
            {
                "type": "event",
                "event": "exited",
                "session_id": created["session_id"],
                "exit_code": 3,
            },
        )
        code, _ = yield client.closed
        self.assertEqual(code, 1000)
        reply = yield self.request("GET", "/pty/sessions")
        self.assertEqual(reply.json(), {"sessions": []})

    @inlineCallbacks
    def test_reconnect_scrollback_and_offset(self) -> Any:
        """A new client gets the scrollback; with offset=N only what followed N."""
        created = yield self.create()
        sid = created["session_id"]
        first = yield self.attach(sid)
        first.type("echo mark''-one\n")
        yield first.wait_output("mark-one")
        yield self.hang_up(first)
        second = yield self.attach(sid)
        yield second.wait_output("mark-one")
        second.type("echo mark''-two\n")
        yield second.wait_output("mark-two")
        outputs = [m for m in second.messages if is_output(m)]
        last = outputs[-1]
        resume_at = last["offset"]
        third = yield self.attach(sid, offset=str(resume_at))
        replay = yield third.wait_for(is_output)
        self.assertEqual(replay["offset"], resume_at)
        # Everything kept after the offset: the shell's next prompt may
        # already have followed the frame the second client saw last.
        self.assertTrue(replay["data"].startswith(last["data"]), replay["data"])
        self.assertNotIn("mark-one", third.output())

    @inlineCallbacks
    def test_shell_group_is_its_own(self) -> Any:
        """
        The shell's session group is lowered to a terminal's level (nice 10)
        and the daemon's own group keeps its raised level: the shell calls
        ``setsid`` a moment after the fork returns, and a write by its pid
        before that would have lowered the daemon's group instead.
        """
        need_autogroups()
        own = group_nice(os.getpid())  # the daemon runs in this process
        for _ in range(5):
            pid = (yield self.create())["pid"]
            self.assertTrue((yield wait_until(lambda p=pid: group_nice(p) == 10)))
        self.assertEqual(group_nice(os.getpid()), own)

    @inlineCallbacks
    def test_unattended_shell_yields(self) -> Any:
        """
        A terminal nobody has attached to yet runs its shell's session
        group at the children's level (nice 10); with a client attached, at
        an agent's (``agents_nice``, 0 by default): somebody waits on each
        keystroke.  Once its last client has gone, at the lightest weight
        (nice 19) until a client attaches again.  The shell itself keeps
        the children's nice value throughout.
        """
        need_autogroups()
        created = yield self.create()
        sid, pid = created["session_id"], created["pid"]
        self.assertTrue((yield wait_until(lambda: group_nice(pid) == 10)))
        first = yield self.attach(sid)
        yield first.wait_for(lambda m: True)
        self.assertTrue((yield wait_until(lambda: group_nice(pid) == 0)))
        yield self.hang_up(first)
        self.assertTrue((yield wait_until(lambda: group_nice(pid) == 19)))
        second = yield self.attach(sid)
        second.type("echo back''-again\n")
        yield second.wait_output("back-again")
        self.assertEqual(group_nice(pid), 0)
        self.assertEqual(os.getpriority(os.PRIO_PROCESS, pid), 10)

    @inlineCallbacks
    def test_two_clients(self) -> Any:
        """Two clients at once: both see what either types."""
        created = yield self.create()
        one = yield self.attach(created["session_id"])
        two = yield self.attach(created["session_id"])
        one.type("echo from''-one\n")
        yield two.wait_output("from-one")
        two.type("echo from''-two\n")
        yield one.wait_output("from-two")
        reply = yield self.request("GET", f"/pty/sessions/{created['session_id']}")
        self.assertEqual(reply.json()["clients"], 2)

    @inlineCallbacks
    def test_list_and_get(self) -> Any:
        """List and get describe sessions with the fields of SPEC 7.5."""
        created = yield self.create({"cols": 90, "rows": 30})
        reply = yield self.request("GET", "/pty/sessions")
        (session,) = reply.json()["sessions"]
        self.assertEqual(
            set(session),
            {"id", "pid", "created_at", "cols", "rows", "alive", "clients", "ws_url"},
        )
        # Where to attach, as the create said, for a client that did not create it.
        self.assertEqual(session["ws_url"], created["ws_url"])
        self.assertEqual(
            (
                session["id"],
                session["pid"],
                session["cols"],
                session["rows"],
                session["alive"],
            ),
            (created["session_id"], created["pid"], 90, 30, True),
        )
        reply = yield self.request("GET", f"/pty/sessions/{created['session_id']}")
        self.assertEqual(reply.json(), session)
        reply = yield self.request("GET", "/pty/sessions/nope")
        self.assertEqual(reply.status, 404)

    @inlineCallbacks
    def test_delete_ends_whole_session(self) -> Any:
        """DELETE ends the shell and the jobs it started in their own groups."""
        created = yield self.create()
        pid = created["pid"]
        client = yield self.attach(created["session_id"])
        client.type("sleep 1000 &\n")
        found = yield wait_until(lambda: descendants(pid))
        self.assertTrue(found)
        job = descendants(pid)[0]
        reply = yield self.request("DELETE", f"/pty/sessions/{created['session_id']}")
        self.assertEqual(reply.status, 200)
        self.assertEqual(
            reply.json(), {"status": "closed", "session_id": created["session_id"]}
        )
        gone = yield wait_until(lambda: not alive(pid) and not alive(job))
        self.assertTrue(gone)
        yield client.wait_for(is_exited)
        reply = yield self.request("DELETE", f"/pty/sessions/{created['session_id']}")
        self.assertEqual(reply.status, 404)

    @inlineCallbacks
    def test_delete_lets_a_job_clean_up_on_its_hangup(self) -> Any:
        """
        A terminal deleted while a job runs hangs up as a closing terminal
        window does: the job's trap on HUP (here a lock file removed after
        a moment's work, as ``pyenv rehash`` does) runs to its end before
        anything harder comes, DELETE answers once it has, and nothing of
        the tree is left.
        """
        lock = os.path.join(self.base_dir, "lock")
        pid_file = os.path.join(self.base_dir, "job.pid")
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        client.type(
            f"sh -c 'echo $$ > {pid_file}; : > {lock}; "
            f'trap "sleep 0.3; rm {lock}; exit 0" HUP; '
            "echo ar''med; while :; do sleep 0.1; done'\n"
        )
        yield client.wait_output("armed")
        with open(pid_file) as f:
            job = int(f.read())
        reply = yield self.request("DELETE", f"/pty/sessions/{created['session_id']}")
        self.assertEqual(reply.status, 200)
        self.assertFalse(os.path.exists(lock), "the job's trap was cut short")
        self.assertFalse(alive(job))
        self.assertFalse(alive(created["pid"]))
        self.assertEqual(descendants(created["pid"]), [])

    @inlineCallbacks
    def test_delete_ends_job_that_left_the_session(self) -> Any:
        """
        A job that called setsid (so it is no longer in the terminal's
        session, and its parent is gone) and ignores TERM and HUP still
        ends with the session.
        """
        marker = f"60.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, marker)
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        client.type(
            f"setsid sh -c 'trap \"\" TERM HUP; exec sleep {marker}'"
            " </dev/null >/dev/null 2>&1 &\n"
        )
        # setsid and sh carry the marker too until each has exec'd: wait for
        # the sleep alone.
        escaped = yield wait_until(lambda: marked_argv0(marker) == [b"sleep"])
        self.assertTrue(escaped, marked_argv0(marker))
        (job,) = marked_pids(marker)
        info = proc_info(job)
        self.assertNotEqual(info.sid if info else None, created["pid"])
        reply = yield self.request("DELETE", f"/pty/sessions/{created['session_id']}")
        self.assertEqual(reply.status, 200)
        gone = yield wait_until(lambda: not marked_pids(marker))
        self.assertTrue(gone, "the setsid job outlived its terminal session")

    @inlineCallbacks
    def test_exit_told_while_a_job_holds_the_terminal(self) -> Any:
        """
        ``exit 3`` with a job still holding the terminal (it ignores the
        hang-up, so it lasts until the KILL after the grace): clients hear
        ``exited`` with 3 when the shell exits, not after the grace; the job
        ends all the same.
        """
        marker = f"60.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, marker)
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        client.type(f"setsid sh -c 'trap \"\" TERM HUP; exec sleep {marker}' &\n")
        started = yield wait_until(lambda: marked_argv0(marker) == [b"sleep"])
        self.assertTrue(started, marked_argv0(marker))
        began = time.monotonic()
        client.type("exit 3\n")
        exited = yield client.wait_for(is_exited)
        self.assertLess(time.monotonic() - began, KILL_GRACE_SECONDS / 2)
        self.assertEqual(exited["exit_code"], 3)
        code, _ = yield client.closed
        self.assertEqual(code, 1000)
        gone = yield wait_until(lambda: not marked_pids(marker))
        self.assertTrue(gone, "the job outlived its terminal session")

    @inlineCallbacks
    def test_delete_ends_job_that_cleared_its_environment(self) -> Any:
        """
        A job that left with ``setsid -f`` (its parent gone at once), cleared
        its environment and ignores TERM and HUP still ends with the
        session: it stays below the shell, the subreaper of its jobs.
        """
        marker = f"60.{secrets.randbelow(10**12):012d}"
        self.addCleanup(kill_marked, marker)
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        client.type(
            f"setsid -f env -i sh -c 'trap \"\" TERM HUP; exec sleep {marker}'"
            " </dev/null >/dev/null 2>&1\n"
        )
        escaped = yield wait_until(lambda: marked_argv0(marker) == [b"sleep"])
        self.assertTrue(escaped, marked_argv0(marker))
        reply = yield self.request("DELETE", f"/pty/sessions/{created['session_id']}")
        self.assertEqual(reply.status, 200)
        gone = yield wait_until(lambda: not marked_pids(marker))
        self.assertTrue(gone, "the job outlived its terminal session")

    @inlineCallbacks
    def test_shutdown_ends_sessions(self) -> Any:
        """Stopping the daemon ends every session and closes sockets with 1001."""
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        yield self.daemon.stop()
        code, _ = yield client.closed
        self.assertEqual(code, 1001)
        gone = yield wait_until(lambda: not alive(created["pid"]))
        self.assertTrue(gone)


#: A shell that misses the first hangup it is sent (as bash can while it
#: starts: its handler is installed, the signal taken, the shell still
#: there) and ignores TERM, as an interactive bash does.
_MISSES_A_HANGUP = """\
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGHUP, lambda *_: signal.signal(signal.SIGHUP, signal.SIG_DFL))
sys.stdout.write("ready\\n")
sys.stdout.flush()
while True:
    time.sleep(60)
"""


class LostHangupTests(TerminalCase):
    """A shell that missed its hangup is not left to the KILL's grace."""

    autostart = False

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        self.shell = os.path.join(self.base_dir, "misses-a-hangup")
        with open(self.shell, "w") as f:
            f.write(f"#!{sys.executable}\n{_MISSES_A_HANGUP}")
        os.chmod(self.shell, 0o755)
        yield self.start(
            policy={
                "endpoints": {
                    "pty_create_session": {"params": {"shells": [self.shell]}}
                }
            }
        )

    @inlineCallbacks
    def test_shells_by_path(self) -> Any:
        """
        A ``shells`` entry that is a path allows that path, is the shell
        when none is asked for, and allows no other program of its name.
        """
        created = yield self.create({"shell": None})
        client = yield self.attach(created["session_id"])
        yield client.wait_output("ready")
        impostor = os.path.join(self.base_dir, "elsewhere", "misses-a-hangup")
        os.makedirs(os.path.dirname(impostor))
        os.symlink(self.shell, impostor)
        for other in (impostor, "misses-a-hangup"):
            reply = yield self.request("POST", "/pty/sessions", {"shell": other})
            self.assertEqual(
                (reply.status, reply.json()["code"]), (403, "shell_not_allowed")
            )

    @inlineCallbacks
    def test_delete_is_prompt(self) -> Any:
        """
        DELETE answers within a second, the shell gone, though the first
        hangup did not end it (the KILL comes only after five seconds).
        """
        created = yield self.create({"shell": self.shell})
        client = yield self.attach(created["session_id"])
        yield client.wait_output("ready")
        started = time.monotonic()
        reply = yield self.request("DELETE", f"/pty/sessions/{created['session_id']}")
        took = time.monotonic() - started
        self.assertEqual(reply.status, 200)
        self.assertFalse(alive(created["pid"]))
        self.assertLess(took, 1.0)
        exited = yield client.wait_for(is_exited)
        self.assertEqual(exited["exit_code"], -signal.SIGHUP)


class FullTableTests(TerminalCase):
    """A refusal at max_sessions says when an unattended terminal lapses."""

    policy = {
        "endpoints": {
            "pty_create_session": {
                "limits": {"max_sessions": 1, "idle_timeout_seconds": 30}
            }
        }
    }

    @inlineCallbacks
    def test_retry_after_the_unattended_terminal_lapses(self) -> Any:
        """
        The one terminal has no client (its client crashed): a new one is
        429 with ``Retry-After`` (header and field), the time until the
        idle timeout closes the unattended one; with a client attached to
        it, no time is known and none is said.
        """
        created = yield self.create()
        reply = yield self.request("POST", "/pty/sessions", {"shell": "sh"})
        self.assertEqual(
            (reply.status, reply.json()["code"]), (429, "too_many_sessions")
        )
        retry = int(reply.header("retry-after") or 0)
        self.assertTrue(25 <= retry <= 31, retry)
        self.assertEqual(reply.json()["retry_after"], retry)
        client = yield self.attach(created["session_id"])
        yield client.wait_for(lambda m: True)
        reply = yield self.request("POST", "/pty/sessions", {"shell": "sh"})
        self.assertEqual(reply.status, 429)
        self.assertIsNone(reply.header("retry-after"))
        self.assertNotIn("retry_after", reply.json())


class AttendedLevelTests(TerminalCase):
    """The attended terminal's level is the policy's."""

    policy = {"priority": {"agents_nice": 10}}

    @inlineCallbacks
    def test_attended_level_follows_policy(self) -> Any:
        """
        The attended terminal's group follows the policy's ``agents_nice``:
        ``"agents_nice": 10`` puts it back with the rest of the sandbox's work.
        """
        need_autogroups()
        created = yield self.create()
        first = yield self.attach(created["session_id"])
        first.type("echo here''-now\n")
        yield first.wait_output("here-now")
        self.assertEqual(group_nice(created["pid"]), 10)


class RefusalTests(TerminalCase):
    """What the REST routes and the handshake refuse."""

    @inlineCallbacks
    def test_bad_dimensions(self) -> Any:
        """Non-integer cols or rows are 400."""
        for body in ({"cols": "80"}, {"rows": 2.5}, {"cols": True}, {"rows": 0}):
            reply = yield self.request("POST", "/pty/sessions", body)
            self.assertEqual(reply.status, 400, body)

    @inlineCallbacks
    def test_shell_not_allowed(self) -> Any:
        """
        A shell outside params.shells is 400 ``param_not_allowed`` (type
        ValueError, as agent-sandbox-server answers it), naming the rule.
        """
        reply = yield self.request("POST", "/pty/sessions", {"shell": "python3"})
        self.assertEqual(reply.status, 400)
        body = reply.json()
        self.assertEqual(
            (body["code"], body["type"], body["rule"]),
            ("param_not_allowed", "ValueError", "default:params.shells"),
        )

    @inlineCallbacks
    def test_shell_refused_by_the_policy(self) -> Any:
        """
        A shell the policy's own ``shells`` leave out is its refusal, 403
        ``shell_not_allowed`` (type PolicyDenied), as on
        agent-sandbox-server; ``/capabilities/check`` says the same, and
        no session is started.
        """
        yield self.daemon.stop()
        yield self.start(
            policy={
                "endpoints": {
                    "pty_create_session": {"params": {"shells": ["/bin/bash"]}}
                }
            }
        )
        reply = yield self.request("POST", "/pty/sessions", {"shell": "/bin/sh"})
        body = reply.json()
        self.assertEqual(
            (reply.status, body["code"], body["type"], body["rule"]),
            (
                403,
                "shell_not_allowed",
                "PolicyDenied",
                "policy:endpoints.pty_create_session",
            ),
        )
        check = yield self.request(
            "POST",
            "/capabilities/check",
            {"endpoint": "pty_create_session", "params": {"shell": "/bin/sh"}},
        )
        self.assertEqual(
            (check.json()["allowed"], check.json()["code"]),
            (False, "shell_not_allowed"),
        )
        listed = yield self.request("GET", "/pty/sessions")
        self.assertEqual(listed.json()["sessions"], [])

    @inlineCallbacks
    def test_session_cap(self) -> Any:
        """The 11th session is 429 RuntimeError too_many_sessions."""
        for _ in range(10):
            yield self.create()
        reply = yield self.request("POST", "/pty/sessions", {})
        self.assertEqual(reply.status, 429)
        self.assertEqual(reply.json()["type"], "RuntimeError")
        self.assertEqual(reply.json()["code"], "too_many_sessions")

    @inlineCallbacks
    def test_missing_and_unknown_session(self) -> Any:
        """No session_id, or an unknown one, is closed 1008 with the seed's reason."""
        client = yield self.attach(None)
        code, reason = yield client.closed
        self.assertEqual((code, reason), (1008, "Missing session_id parameter"))
        client = yield self.attach("nope")
        code, reason = yield client.closed
        self.assertEqual((code, reason), (1008, "Unknown session: nope"))

    @inlineCallbacks
    def test_origin_refused(self) -> Any:
        """A browser Origin the policy does not allow fails the handshake."""
        created = yield self.create()
        d = connect(
            self.pty_port, created["session_id"], headers={"Origin": "http://evil.test"}
        )
        yield self.assertFailure(d, ConnectionError)

    @inlineCallbacks
    def test_hostile_frames(self) -> Any:
        """Binary frames, invalid JSON and unknown messages are dropped; the
        session carries on."""
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        client.sendMessage(b"\x00\x01binary", isBinary=True)
        client.sendMessage(b"{not json", isBinary=False)
        client.sendMessage(b"[1, 2]", isBinary=False)
        client.send_json({"type": "signal", "signal": "SIGSTOP"})
        client.send_json({"type": "resize", "cols": "wide", "rows": -1})
        client.send_json({"type": "input", "data": 7})
        client.sendMessage(
            json.dumps({"type": "input", "data": "echo frag''mented\n"}).encode(),
            isBinary=False,
            fragmentSize=5,
        )
        yield client.wait_output("fragmented")

    @inlineCallbacks
    def test_oversize_message(self) -> Any:
        """A message over the cap closes that socket (1009); the session lives."""
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        client.send_json({"type": "input", "data": "x" * (1024 * 1024 + 1)})
        code, _ = yield client.closed
        self.assertEqual(code, 1009)
        again = yield self.attach(created["session_id"])
        again.type("echo still''-here\n")
        yield again.wait_output("still-here")

    @inlineCallbacks
    def test_invalid_utf8_text(self) -> Any:
        """A text frame that is not UTF-8 fails that socket (1007), not the session."""
        created = yield self.create()
        client = yield self.attach(created["session_id"])
        client.sendMessage(b'{"type": "input", "data": "\xff"}', isBinary=False)
        code, _ = yield client.closed
        self.assertEqual(code, 1007)
        reply = yield self.request("GET", f"/pty/sessions/{created['session_id']}")
        self.assertTrue(reply.json()["alive"])


class TokenTests(TerminalCase):
    """With tokens, the handshake needs credentials and the scope, and only
    the creator may attach."""

    token = TOKEN
    policy = {
        "auth": {
            "tokens": [
                {"id": "admin", "token_env": "ABX_SERVER_TOKEN", "scopes": ["*"]},
                {
                    "id": "other",
                    "token_sha256": hashlib.sha256(b"other-token").hexdigest(),
                    "scopes": ["terminal:use"],
                },
                {
                    "id": "reader",
                    "token_sha256": hashlib.sha256(b"reader-token").hexdigest(),
                    "scopes": ["files:read"],
                },
            ]
        }
    }

    @inlineCallbacks
    def test_credentials_required(self) -> Any:
        """No token or a wrong one: 401 at the HTTP level."""
        created = yield self.create()
        for headers in ({}, {"X-Access-Token": "wrong"}):
            d = connect(self.pty_port, created["session_id"], headers=headers)
            yield self.assertFailure(d, ConnectionError)

    @inlineCallbacks
    def test_malformed_host_is_refused(self) -> Any:
        """
        A Host no URL can carry (``/``, ``?``, ``#``, ``@`` in it) is 400
        ``invalid_param`` and starts no terminal, rather than a ``ws_url``
        pointing elsewhere; a plain name with a port is used as before.
        """
        for host in ("127.0.0.1/x?y=", "a@evil.example", "evil.example#"):
            reply = yield self.request(
                "POST", "/pty/sessions", {"shell": "sh"}, headers={"Host": host}
            )
            self.assertEqual(
                (reply.status, reply.json()["code"]), (400, "invalid_param"), host
            )
        listed = yield self.request("GET", "/pty/sessions")
        self.assertEqual(listed.json()["sessions"], [])
        created = yield self.create(headers={"Host": "sandbox.example:8080"})
        self.assertTrue(
            created["ws_url"].startswith("ws://sandbox.example:"), created["ws_url"]
        )

    @inlineCallbacks
    def test_header_and_query_token(self) -> Any:
        """Bearer header or access_token query parameter both attach."""
        created = yield self.create()
        client = yield self.attach(
            created["session_id"], headers={"Authorization": f"Bearer {TOKEN}"}
        )
        yield client.wait_for(lambda m: m.get("event") == "started")
        client = yield self.attach(created["session_id"], access_token=TOKEN)
        yield client.wait_for(lambda m: m.get("event") == "started")

    @inlineCallbacks
    def test_seed_url_forms(self) -> Any:
        """
        The seed's forms attach too: ``/`` for ``/pty``, and the token in a
        ``token`` query parameter; a wrong one there is refused, and two
        different query tokens are ambiguous.
        """
        created = yield self.create()
        sid = created["session_id"]
        client = yield self.attach(sid, path="/", token=TOKEN)
        yield client.wait_for(lambda m: m.get("event") == "started")
        client = yield self.attach(sid, path="/pty", token=TOKEN)
        yield client.wait_for(lambda m: m.get("event") == "started")
        for query in ({"token": "wrong"}, {"token": TOKEN, "access_token": "wrong"}):
            d = connect(self.pty_port, sid, path="/", **query)
            yield self.assertFailure(d, ConnectionError)
        d = connect(self.pty_port, sid, path="/elsewhere", token=TOKEN)
        yield self.assertFailure(d, ConnectionError)

    @inlineCallbacks
    def test_scope_required(self) -> Any:
        """A token without terminal:use is refused (403)."""
        created = yield self.create()
        d = connect(
            self.pty_port,
            created["session_id"],
            headers={"X-Access-Token": "reader-token"},
        )
        yield self.assertFailure(d, ConnectionError)

    @inlineCallbacks
    def test_only_creator_attaches(self) -> Any:
        """Another identity sees someone else's session as unknown."""
        created = yield self.create(token="other-token")
        sid = created["session_id"]
        reply = yield self.request("GET", f"/pty/sessions/{sid}")
        self.assertEqual(reply.status, 200)  # the legacy token holds *
        theirs = yield self.create()
        client = yield self.attach(
            theirs["session_id"], headers={"X-Access-Token": "other-token"}
        )
        code, reason = yield client.closed
        self.assertEqual(
            (code, reason), (1008, f"Unknown session: {theirs['session_id']}")
        )
        reply = yield self.request(
            "GET", f"/pty/sessions/{theirs['session_id']}", token="other-token"
        )
        self.assertEqual(reply.status, 404)


class HandshakeAuditTests(DaemonTestCase):
    """WebSocket handshakes are audited like requests."""

    token = "tok"
    policy = {"defaults": {"audit": "all"}}
    audit = True

    @inlineCallbacks
    def test_refused_handshake_recorded(self) -> Any:
        """A handshake without credentials leaves a 401 pty_connect line, token masked."""
        from autobahn.twisted.websocket import (
            WebSocketClientFactory,
            WebSocketClientProtocol,
        )
        from twisted.internet.endpoints import TCP4ClientEndpoint

        port = self.daemon.context.pty_port
        factory = WebSocketClientFactory(
            f"ws://127.0.0.1:{port}/pty?session_id=x&access_token=bad"
        )
        factory.protocol = WebSocketClientProtocol
        factory.setProtocolOptions(openHandshakeTimeout=0, closeHandshakeTimeout=0)
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
        protocol = yield endpoint.connect(factory)
        closed: Deferred[None] = Deferred()
        protocol.onClose = lambda *a: (
            closed.callback(None) if not closed.called else None
        )
        yield closed
        ws = [r for r in self.audit_lines() if r["endpoint"] == "pty_connect"]
        self.assertEqual(
            [(r["status"], r["code"]) for r in ws], [(401, "unauthorized")]
        )
        self.assertNotIn("bad", ws[0]["query"])
