"""
Every endpoint of the table, every door that maps it, hostile input: a
clear error and nothing done.

The HTTP sweep reads the endpoint table (:mod:`sandboxd.endpoints`) and
each endpoint's declared fields (:mod:`sandboxd.api.schema`), so a new
endpoint is swept the day it is added.  For every endpoint that takes a
body, a query or a path parameter it sends the cases of
:mod:`tests.security.sweep` to a real daemon with every group on, and
asserts what a client sees:

- never a 5xx, and every 4xx a JSON body with a ``code`` string in the
  door's framing (SPEC §3's ``code``; the ``/v1`` door's ``error.code``);
- a case that must be refused is refused (4xx), and once an endpoint's
  refused cases are sent, nothing happened: the files under the base dir
  (names, sizes, mtimes), the daemon's child processes, what the list
  endpoints show (processes, terminals, code contexts, exposures, links,
  git jobs, agent sessions, the ``/v1`` door's stored objects, the
  environment) and every live thing's own ``GET`` are as they were, field
  by field (a refused resize that resized, a half-applied update, a
  changed TTL or cwd is a change; :data:`VOLATILE` names the fields left
  out);
- ``/health`` still answers.

Cases a valid call could look like (an empty object, unknown fields, a
null that means "not given") may be taken; they are sent after the refused
ones and the sweep's picture of the sandbox is taken again afterwards.

What the HTTP sweep leaves out, and why:

- ``health`` and ``ui_assets`` take no body, query or parameter that
  could be wrong (any text is a name that is not there: 404);
- ``pty_connect``, ``e2b``, ``kep`` and ``preview_proxy`` are doors of
  their own ports, not HTTP routes (the E2B door is swept below; the KEP
  door's hostile paths are in :mod:`tests.kep.test_rest`; the PTY
  WebSocket's messages in :mod:`tests.security.test_pty_messages`; the
  preview door's hostile hosts in :mod:`tests.preview`);
- ``mcp`` is the MCP door, swept below through ``tools/call``; the
  seed's door (a template written for the seed's server) is swept below
  through its commands;
- the browser group's cases that a valid call could look like (``{}``
  screenshots the page) would start Chromium, so only the refused ones
  are sent there, and the sweep checks no browser was started for them;
- an endpoint with path parameters gets its body and query cases sent to
  a live thing (see :data:`LIVE`: a process, a terminal, an upload, an
  exposure, a link, a code context, an execution and its spilled output
  (:meth:`HttpSweepTests.live_execution`), an ended git job
  (:meth:`HttpSweepTests.live_job`), a vault and a
  credential, a template, an environment, a stored file, an agent
  definition, a webhook endpoint; :meth:`HttpSweepTests.live_acp` and
  :meth:`HttpSweepTests.live_v1`: an agent session of the fake ACP agent
  with an ended turn, its tool call and terminal, a ``/v1`` session with
  a turn and an artifact, a stored response, a permission request held
  for a human (:meth:`HttpSweepTests.live_held`, in a session of its own:
  it blocks its turn); :data:`THERE`: the catalogue's agent and model, the
  sweep's template command).  Subagent ids alone are sent ids nothing has:
  no session ever has a subagent (ACP has no such notion; an agent's
  helpers are its tool calls), so every subagent route answers 404 and has
  nothing past it to check;
- streaming GETs (``files_watch``, ``process_output``...) get only the
  cases they must refuse: one they may take opens a stream that does not
  end; so does ``packages``, whose taken calls list every installed
  package (pip and npm run for each).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from io import BytesIO
from typing import Any

import psutil
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import Agent, FileBodyProducer, readBody
from twisted.web.http_headers import Headers

from sandboxd.commands import CommandRegistry
from sandboxd.endpoints import CapabilityGroup, Endpoint, catalogue_table
from tests.agents.test_agents import fake
from tests.helpers import DaemonTestCase
from tests.security.sweep import Case, cases, deep_array, fill_path, live_id

#: Every group on, nothing else narrowed.
ALL_GROUPS: dict[str, Any] = {
    "groups": {g.value: True for g in CapabilityGroup},
    # The SDK-built fake ACP agent, for live agent sessions, turns and
    # stored responses (no agent CLI is needed).
    "agents": {"catalog": {"fake": fake()}},
    # A clone from a loopback port nothing listens on: a live git job
    # that fails at once, without leaving the machine.
    "endpoints": {
        "group:git": {"params": {"block_private_networks": False}},
        # A display value past this is spilled to a file of its own: a
        # live code output (see HttpSweepTests.live_execution).
        "group:code": {"limits": {"max_display_bytes": 1024}},
    },
}

#: Ids the HTTP sweep does not send to (see the module docstring).
NOT_SWEPT = frozenset(
    {"health", "ui_assets", "pty_connect", "e2b", "kep", "preview_proxy", "mcp"}
)

#: Endpoints sent only the cases they must refuse: one they may take does
#: slow real work (listing every installed package runs pip and npm).
ONLY_REFUSED = frozenset({"packages"})

#: The list endpoints whose answers must not change when a call is refused.
LISTS = (
    "process_list",
    "agents_requests",
    "pty_list_sessions",
    "code_contexts_list",
    "preview_ports_list",
    "links_list",
    "git_jobs_list",
    "agents_session_list",
    "env_get",
    "agents_sessions_list",
    "agents_definitions_list",
    "agents_environments_list",
    "agents_files_list",
    "agents_vaults_list",
    "agents_environment_templates_list",
    "agents_webhooks_list",
)

#: Live things the body and query cases of endpoints with path parameters
#: are sent to (else their cases meet a 404 first): the path parameter ->
#: the endpoint that makes one, its body, and the answer's key for the id.
LIVE: dict[str, tuple[str, dict[str, Any], str]] = {
    "pid": ("process_start", {"command": "sleep 300"}, "pid"),
    "id": ("pty_create_session", {}, "session_id"),
    "upload_id": (
        "files_uploads_create",
        {"path": "live-upload.bin", "size": 10},
        "upload_id",
    ),
    "port": ("preview_expose", {"port": 45678}, "port"),
    "link_id": ("links_mint", {"audience": "preview:45678"}, "link_id"),
    "cid": ("code_context_create", {}, "id"),
    "vault_id": ("agents_vaults_create", {"name": "live"}, "id"),
    "template_id": ("agents_environment_templates_create", {"name": "live"}, "id"),
    "environment_id": (
        "agents_environments_create",
        {"environment": {"type": "self_hosted"}},
        "id",
    ),
    # After vault_id: it is made in that vault.
    "credential_id": (
        "agents_vault_credentials_create",
        {
            "name": "live",
            "auth": {
                "type": "static_bearer",
                "mcp_server_url": "https://mcp.example.com/mcp",
                "token": "secret",
            },
        },
        "id",
    ),
    "file_id": (
        "agents_files_create",
        {"purpose": "user_data", "filename": "live.txt", "data": "aGkK"},
        "id",
    ),
    "agent_id": ("agents_definitions_create", {"model": "claude"}, "id"),
    # For an event no sweep call raises (no permission is ever held), so
    # nothing is delivered off the machine.
    "webhook_endpoint_id": (
        "agents_webhooks_create",
        {
            "url": "https://hooks.example.com/sweep",
            "event_types": ["agent.session.action_required"],
            "name": "live",
        },
        "id",
    ),
}

#: Path parameters that name what is there without anything being made
#: (``name``: the sweep's template command, :func:`sweep_registry`).
THERE: dict[str, str] = {"agent": "fake", "model": "fake", "name": "sweep_echo"}


def sweep_echo(
    text: str = "", count: int = 0, ratio: float = 0.0, flag: bool = False
) -> dict[str, Any]:
    """Answer the arguments: a template command any call of which is harmless."""
    return {"text": text[:20], "count": count, "ratio": ratio, "flag": flag}


def command_cases(path: str) -> list[Case]:
    """
    The sweep's template command's declared arguments, each wrong-typed
    (:data:`SEED_WRONG`, as the seed's door is swept): the body cases of
    ``run_command`` beyond its declared ``*``.
    """
    command = sweep_registry().get(THERE["name"])
    assert command is not None
    return [
        Case(
            f"{arg.name}: {wrong!r}",
            "POST",
            path,
            json.dumps({arg.name: wrong}).encode(),
            True,
        )
        for arg in command.args
        for wrong in SEED_WRONG[arg.type]
    ]


def sweep_registry() -> CommandRegistry:
    """The sweep's command template: one command, each argument type once."""
    registry = CommandRegistry()
    registry.register(sweep_echo)
    return registry


#: Seconds a live agent turn may take to end.
TURN_SECONDS = 30

#: Fields of a list entry or a detail that change by themselves, not by a
#: call, left out of the comparison.  None so far: the live things are at
#: rest while the refused calls are sent (a ``sleep``, a shell at its
#: prompt, agents between turns, an execution ended), and the answers
#: compared carry no clock (``created_at``/``started_at`` are fixed;
#: ``updated_at`` moves only on a change, which is the point).  A field
#: that moves on its own (an uptime, an output counter of a thing still
#: writing) goes here, with why.
VOLATILE: frozenset[str] = frozenset()


def state(value: Any) -> Any:
    """A list answer or a detail as compared: lists sorted, :data:`VOLATILE` left out."""
    if isinstance(value, list):
        return sorted((state(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {k: state(v) for k, v in value.items() if k not in VOLATILE}
    return value


def details(ids: Mapping[str, str]) -> list[str]:
    """
    The endpoints that show one live thing in full (``GET .../{param}``):
    one per thing ``ids`` names, whose every path parameter it names.
    """
    found = []
    for endpoint in catalogue_table():
        params = [s[1:-1] for s in endpoint.segments if s.startswith("{")]
        if (
            endpoint.method == "GET"
            and not endpoint.streaming
            and params
            and endpoint.segments[-1].startswith("{")
            and all(live_id(endpoint, p, ids) is not None for p in params)
        ):
            found.append(endpoint.id)
    return found


#: Seconds one hostile request may take.
REQUEST_SECONDS = 20


def files_under(root: str) -> dict[str, tuple[int, int] | None]:
    """Every path under ``root``: files with (size, mtime), directories None."""
    found: dict[str, tuple[int, int] | None] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs:
            found[os.path.relpath(os.path.join(top, name), root)] = None
        for name in files:
            path = os.path.join(top, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            found[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return found


def _process_clock() -> float:
    """
    Now, as psutil dates a process's start: the boot time it reads (whole
    seconds) plus the time since boot, so that a process started after
    this call is never dated before it.
    """
    with open("/proc/uptime") as f:
        return float(psutil.boot_time()) + float(f.read().split()[0])


def children(since: float = 0.0) -> set[tuple[int, str]]:
    """
    The daemon's live child processes (the daemon runs in this process);
    not their descendants, which a shell a taken call started may add to
    while the refused calls are sent.

    :param since: leave out those started before (a time from
        :func:`_process_clock`): an earlier test's process orphaned now
        becomes a child of this process too, which an in-process daemon
        makes a subreaper.
    """
    found = set()
    for child in psutil.Process().children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and child.create_time() >= since:
                found.add((child.pid, child.name()))
        except psutil.Error:
            continue
    return found


def described(found: set[tuple[int, str]]) -> list[str]:
    """
    Children as a failure shows them: their command lines, so that one a
    refused call did not start (seen on busy machines: a ``python`` child
    of the test's process) can be told from one it did.
    """
    out = []
    for pid, name in sorted(found):
        try:
            process = psutil.Process(pid)
            line = " ".join(process.cmdline())[:300]
            out.append(f"{pid} {name}: {line!r} (parent {process.ppid()})")
        except psutil.Error:
            out.append(f"{pid} {name}: gone")
    return out


def error_code(endpoint: Endpoint, body: Any) -> Any:
    """
    The ``code`` of an error body in the endpoint's door framing (a request
    head refused before it is routed too: its path names the door).
    """
    if not isinstance(body, dict):
        return None
    if endpoint.door == "openai":
        error = body.get("error")
        return error.get("code") if isinstance(error, dict) else None
    return body.get("code")


def endpoints_of(group: CapabilityGroup) -> list[Endpoint]:
    """The group's endpoints the HTTP sweep sends to."""
    return [
        e
        for e in catalogue_table()
        if e.group is group and e.id not in NOT_SWEPT and cases(e)
    ]


class SweepCase(DaemonTestCase):
    """A daemon with every group on, and the sweep's picture of the sandbox."""

    timeout = 300
    policy = ALL_GROUPS

    #: When this test's daemon was started (:func:`_process_clock`): the
    #: children compared are the ones started since.
    since = 0.0

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        """
        The daemon, with the preview door listening (its routes need it)
        and a command template (:func:`sweep_registry`).
        """
        self.since = _process_clock()
        kwargs.setdefault("preview_port", "tcp:0:interface=127.0.0.1")
        kwargs.setdefault("registry", sweep_registry())
        return super().start(stop_at_end, **kwargs)

    #: The live things' ids, by path parameter (see :data:`LIVE`).
    ids: Mapping[str, str] = {}

    @inlineCallbacks
    def picture(self) -> Any:
        """
        What the sandbox holds now, as the sweep compares it: every list
        and every live thing's detail in full (but :data:`VOLATILE`), the
        files, the daemon's children.
        """
        shown: dict[str, Any] = {}
        table = catalogue_table()
        for endpoint_id in (*LISTS, *details(self.ids)):
            endpoint = table.get(endpoint_id)
            reply = yield self.request("GET", fill_path(endpoint, self.ids))
            body: Any = reply.status
            if reply.status == 200:
                # A spilled output is its raw bytes.
                kind = reply.header("content-type") or ""
                body = reply.json() if "json" in kind else reply.body
            if endpoint_id == "preview_ports_list" and isinstance(body, dict):
                # The exposures, not the ports other sessions listen on.
                body = [p for p in body["ports"] if p["exposed"]]
            shown[endpoint_id] = state(body)
        shown["files"] = files_under(self.base_dir)
        shown["children"] = children(self.since)
        return shown

    def compare(self, what: str, before: Any, after: Any, problems: list[str]) -> None:
        """Note what the refused calls of ``what`` changed."""
        new = after["children"] - before["children"]
        if new:
            problems.append(f"{what}: refused calls left {described(new)}")
        for key in before:
            if key != "children" and before[key] != after[key]:
                problems.append(
                    f"{what}: refused calls changed {key}: "
                    f"{_diff(before[key], after[key])}"
                )


def _absent_agent(endpoint: Endpoint, case: Case, status: int, body: Any) -> bool:
    """
    Whether a case a valid call could look like was answered that the agent
    it runs is not installed: a session asked for with no agent named runs
    the default one (codex, as agent-sandbox-server's does), which this
    machine need not have. An honest answer, not a failure.
    """
    return (
        not case.refuse
        and status == 503
        and error_code(endpoint, body) == "agent_unavailable"
    )


class HttpSweepTests(SweepCase):
    """The HTTP door: every endpoint of the table, group by group."""

    @inlineCallbacks
    def send(self, endpoint: Endpoint, case: Case, problems: list[str]) -> Any:
        """Send one case; note what is wrong with its answer."""
        label = f"{endpoint.id} [{case.what}]"
        headers = {"Content-Type": "application/json"} if case.body else {}
        d = self.daemon.request(
            case.method, case.target, headers=headers, raw_body=case.body
        )
        d.addTimeout(REQUEST_SECONDS, reactor)
        try:
            reply = yield d
        except Exception as e:
            problems.append(f"{label}: no answer ({e.__class__.__name__})")
            return None
        try:
            body = json.loads(reply.body)
        except ValueError:
            body = None
        status = reply.status
        if status >= 500 and not _absent_agent(endpoint, case, status, body):
            problems.append(f"{label}: {status} {reply.body[:200]!r}")
        elif status >= 400 and not isinstance(error_code(endpoint, body), str):
            problems.append(f"{label}: {status} with no code: {reply.body[:200]!r}")
        elif status < 400 and case.refuse:
            problems.append(f"{label}: taken ({status}) {reply.body[:120]!r}")
        return status

    @inlineCallbacks
    def settle(self) -> Any:
        """
        Wait (bounded) until the daemon's children stop changing: what a
        taken call started (a terminal's shell) may be spawned a moment
        after its answer, and must not be counted against the next
        endpoint's refused calls.
        """
        seen = children(self.since)
        for _ in range(30):
            yield deferLater(reactor, 0.1, lambda: None)
            now = children(self.since)
            if now == seen:
                return
            seen = now

    @inlineCallbacks
    def live(self, group: CapabilityGroup) -> Any:
        """One live thing per path parameter the group's endpoints name."""
        table = catalogue_table()
        wanted = {
            s[1:-1]
            for e in endpoints_of(group)
            for s in e.segments
            if s.startswith("{") and s[1:-1] in LIVE
        }
        ids: dict[str, str] = dict(THERE)
        for name in (n for n in LIVE if n in wanted or n == "vault_id"):
            endpoint_id, body, key = LIVE[name]
            path = fill_path(table.get(endpoint_id), ids)
            reply = yield self.request("POST", path, body)
            if reply.status < 300:
                ids[name] = str(reply.json()[key])
        if group is CapabilityGroup.AGENTS:
            yield self.live_acp(ids)
            yield self.live_v1(ids)
        if group is CapabilityGroup.GIT:
            yield self.live_job(ids)
        if group is CapabilityGroup.CODE and "cid" in ids:
            yield self.live_execution(ids)
        return ids

    @inlineCallbacks
    def live_execution(self, ids: dict[str, str]) -> Any:
        """An ended execution in the live context, whose result was spilled."""
        done = yield self.got(
            f"/code/contexts/{ids['cid']}/execute",
            {"code": "print(1 + 1); 'x' * 4096", "wait": TURN_SECONDS},
        )
        ids["xid"] = done["execution_id"]
        ids["oid"] = done["results"][0]["refs"][0]["oid"]

    @inlineCallbacks
    def got(self, path: str, body: Any = None) -> Any:
        """POST ``body`` (or GET when None) to ``path``; the answer, which must be 2xx."""
        reply = yield self.request("GET" if body is None else "POST", path, body)
        self.assertLess(reply.status, 300, f"{path}: {reply.body[:300]!r}")
        return reply.json()

    @inlineCallbacks
    def live_job(self, ids: dict[str, str]) -> Any:
        """A git job, ended: a clone from a loopback port nothing listens on."""
        job = yield self.got(
            "/git/clone", {"url": "https://127.0.0.1:9/none.git", "path": "live-clone"}
        )
        job_id = ids["job_id"] = job["job_id"]
        for _ in range(TURN_SECONDS * 10):
            shown = yield self.got(f"/git/jobs/{job_id}")
            if shown["state"] != "running":
                break
            yield deferLater(reactor, 0.1, lambda: None)

    @inlineCallbacks
    def live_acp(self, ids: dict[str, str]) -> Any:
        """
        An agent session of the fake agent with one ended turn, which ran a
        tool call and a terminal (released, so nothing of it runs on).
        """
        made = yield self.got("/agents/sessions", {"agent": "fake"})
        sid = ids["sid"] = made["session_id"]
        turn = yield self.got(
            f"/agents/sessions/{sid}/prompt",
            {"prompt": "terminal printf hi", "wait": TURN_SECONDS},
        )
        ids["agents/turn_id"] = turn["turn_id"]
        calls = yield self.got(f"/agents/sessions/{sid}/tool-calls")
        ids["tool_call_id"] = calls["tool_calls"][0]["tool_call_id"]
        terminals = yield self.got(f"/agents/sessions/{sid}/terminals")
        ids["terminal_id"] = terminals["terminals"][0]["terminal_id"]
        yield self.live_held(ids)

    @inlineCallbacks
    def live_held(self, ids: dict[str, str]) -> Any:
        """
        A held permission request: a turn of a session of its own (a held
        request blocks its turn), waiting for a human for the default
        ``permission_timeout_seconds``, far longer than the sweep; it is
        refused at the end, and the file the turn would edit is never
        written.
        """
        made = yield self.got("/agents/sessions", {"agent": "fake"})
        held_sid = made["session_id"]
        target = os.path.join(self.base_dir, "live-held.txt")
        yield self.got(
            f"/agents/sessions/{held_sid}/prompt",
            {"prompt": f"edit {target} x", "wait": 0},
        )
        for _ in range(TURN_SECONDS * 10):
            listed = yield self.got(f"/agents/requests?session_id={held_sid}")
            if listed["requests"]:
                break
            yield deferLater(reactor, 0.1, lambda: None)
        request_id = ids["request_id"] = listed["requests"][0]["request_id"]

        @inlineCallbacks
        def refuse() -> Any:
            yield self.request(
                "POST", f"/agents/requests/{request_id}", {"option_id": "reject"}
            )
            self.assertFalse(os.path.exists(target))

        self.addCleanup(refuse)

    @inlineCallbacks
    def live_v1(self, ids: dict[str, str]) -> Any:
        """
        A ``/v1`` session whose one ended turn wrote a file (an artifact),
        and a stored response.
        """
        target = os.path.join(self.base_dir, "live-artifact.txt")
        made = yield self.got(
            "/v1/agents/sessions",
            {
                "environment": {
                    "type": "self_hosted",
                    "workspace_directory": self.base_dir,
                },
                "agent": {"model": "fake"},
                "input": f"write {target} hi",
            },
        )
        session_id = ids["session_id"] = made["id"]
        for _ in range(TURN_SECONDS * 10):
            shown = yield self.got(f"/v1/agents/sessions/{session_id}")
            if shown["status"] == "idle":
                break
            yield deferLater(reactor, 0.1, lambda: None)
        turns = yield self.got(f"/v1/agents/sessions/{session_id}/turns")
        ids["v1/turn_id"] = turns["data"][0]["id"]
        artifacts = yield self.got(f"/v1/agents/sessions/{session_id}/artifacts")
        ids["artifact_id"] = artifacts["data"][0]["id"]
        response = yield self.got(
            "/v1/responses", {"model": "fake", "input": "echo hi"}
        )
        ids["response_id"] = response["id"]

    @inlineCallbacks
    def sweep(self, group: CapabilityGroup) -> Any:
        """Every endpoint of ``group``: refused cases, checks, then the rest."""
        problems: list[str] = []
        ids = yield self.live(group)
        self.ids = ids
        yield self.settle()
        before = yield self.picture()
        for endpoint in endpoints_of(group):
            every = cases(endpoint, ids)
            if endpoint.id == "run_command":
                every += command_cases(fill_path(endpoint, ids))
            refused = [c for c in every if c.refuse]
            maybe = [c for c in every if not c.refuse]
            if (
                group is CapabilityGroup.BROWSER
                or endpoint.streaming
                or endpoint.id in ONLY_REFUSED
                # A call it may take would end a live thing the next
                # endpoints' cases need.
                or endpoint.method == "DELETE"
            ):
                maybe = []
            for case in refused:
                yield self.send(endpoint, case, problems)
            after = yield self.picture()
            self.compare(endpoint.id, before, after, problems)
            health = yield self.request("GET", "/health")
            if health.status != 200:
                problems.append(f"{endpoint.id}: /health answered {health.status}")
            taken = False
            for case in maybe:
                status = yield self.send(endpoint, case, problems)
                taken = taken or status is None or status < 400
            if maybe:
                if taken:
                    yield self.settle()
                now = yield self.picture()
                if not taken:
                    # Refused too: they must have left nothing either.
                    self.compare(endpoint.id, after, now, problems)
                after = now
            before = after
        self.assertEqual(problems, [], "\n".join(problems))


class PictureTests(SynchronousTestCase):
    """What the sweep compares: whole objects, not only their ids."""

    def test_a_changed_field_is_a_change(self) -> None:
        """A list entry whose id stayed but whose fields changed compares unequal."""
        before = {"sessions": [{"id": "a", "cols": 80}, {"id": "b", "cols": 80}]}
        after = {"sessions": [{"id": "b", "cols": 80}, {"id": "a", "cols": 81}]}
        self.assertNotEqual(state(before), state(after))
        self.assertEqual(state(before), state({"sessions": before["sessions"][::-1]}))

    def test_every_live_thing_is_read_whole(self) -> None:
        """Each live thing's own GET is in the picture, by the door that names it."""
        shown = details({"pid": "1", "cid": "c", "xid": "x", "v1/turn_id": "t"})
        self.assertIn("process_detail", shown)
        self.assertIn("code_execution_get", shown)
        self.assertNotIn("agents_turn_get", shown)
        shown = details({"session_id": "s", "v1/turn_id": "t", "sid": "s"})
        self.assertIn("agents_sessions_turns_get", shown)
        self.assertNotIn("agents_turn_get", shown)


def _diff(before: Any, after: Any) -> str:
    if isinstance(before, dict) and isinstance(after, dict):
        changed = {
            k: (before.get(k), after.get(k))
            for k in set(before) | set(after)
            if before.get(k) != after.get(k)
        }
        return repr(changed)[:300]
    return f"{before!r:.150} -> {after!r:.150}"


def _group_test(group: CapabilityGroup) -> Any:
    def test(self: HttpSweepTests) -> Any:
        return self.sweep(group)

    test.__name__ = f"test_{group.value}"
    test.__doc__ = f"Every endpoint of the {group.value} group, hostile input."
    return test


def _add_group_tests(groups: Iterable[CapabilityGroup]) -> None:
    for group in groups:
        if endpoints_of(group):
            setattr(HttpSweepTests, f"test_{group.value}", _group_test(group))


_add_group_tests(CapabilityGroup)


#: One value of each JSON type, by the declared type it is wrong for.
WRONG: dict[str, Any] = {
    "string": {"sweep": 1},
    "integer": "sweep",
    "number": "sweep",
    "boolean": "sweep",
    "object": "sweep",
    "array": {"sweep": 1},
}


def tool_cases(tool: dict[str, Any]) -> list[tuple[str, Any]]:
    """A tool's hostile ``arguments``: not an object, then each property wrong-typed."""
    found: list[tuple[str, Any]] = [("arguments: []", []), ("arguments: 0", 0)]
    properties = tool.get("inputSchema", {}).get("properties", {})
    for name, declared in sorted(properties.items()):
        kind = declared.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        for candidate in kinds:
            if candidate in WRONG:
                wrong = WRONG[candidate]
                found.append((f"{name}: {type(wrong).__name__}", {name: wrong}))
                break
    return found


class McpSweepTests(SweepCase):
    """The MCP door: every tool ``tools/list`` shows, wrong-typed arguments."""

    #: The MCP revision the sweep speaks.
    version = "2025-11-25"

    @inlineCallbacks
    def rpc(self, message: dict[str, Any], session: str | None) -> Any:
        """One JSON-RPC message to ``/mcp``: (status, headers, the answer or None)."""
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": self.version,
        }
        if session is not None:
            headers["Mcp-Session-Id"] = session
        d = self.daemon.request(
            "POST", "/mcp", headers=headers, raw_body=json.dumps(message).encode()
        )
        d.addTimeout(REQUEST_SECONDS, reactor)
        reply = yield d
        answer = None
        if (
            reply.header(
                "content-type",
            )
            == "text/event-stream"
        ):
            for line in reply.body.decode().splitlines():
                if line.startswith("data:") and line[5:].strip():
                    data = json.loads(line[5:])
                    if data.get("id") == message.get("id"):
                        answer = data
        elif reply.body:
            answer = json.loads(reply.body)
        return reply.status, reply, answer

    @inlineCallbacks
    def test_tools_call(self) -> Any:
        """
        Every tool, each property of its input schema wrong-typed (and
        arguments that are no object): a tool error with the §6 code in
        ``structuredContent`` (or a JSON-RPC error), never a 5xx, nothing
        done, the daemon healthy.
        """
        problems: list[str] = []
        status, reply, answer = yield self.rpc(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": self.version,
                    "capabilities": {},
                    "clientInfo": {"name": "sweep", "version": "0"},
                },
            },
            None,
        )
        session = reply.header("mcp-session-id")
        yield self.rpc(
            {"jsonrpc": "2.0", "method": "notifications/initialized"}, session
        )
        _, _, listed = yield self.rpc(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, session
        )
        tools = listed["result"]["tools"]
        self.assertGreater(len(tools), 100)
        before = yield self.picture()
        number = 2
        for tool in tools:
            for what, arguments in tool_cases(tool):
                label = f"{tool['name']} [{what}]"
                number += 1
                try:
                    status, _, answer = yield self.rpc(
                        {
                            "jsonrpc": "2.0",
                            "id": number,
                            "method": "tools/call",
                            "params": {"name": tool["name"], "arguments": arguments},
                        },
                        session,
                    )
                except Exception as e:
                    problems.append(f"{label}: no answer ({e.__class__.__name__})")
                    continue
                if status >= 500 or answer is None:
                    problems.append(f"{label}: HTTP {status}")
                elif "error" in answer:
                    if not isinstance(answer["error"].get("code"), int):
                        problems.append(f"{label}: {answer['error']}")
                elif not answer["result"].get("isError"):
                    problems.append(f"{label}: taken {str(answer)[:120]}")
                else:
                    shown = answer["result"].get("structuredContent", {})
                    if not isinstance(shown.get("code"), str):
                        problems.append(f"{label}: no code {str(shown)[:120]}")
                    elif shown.get("status", 400) >= 500:
                        problems.append(f"{label}: {shown['status']} {shown}")
        after = yield self.picture()
        self.compare("tools/call", before, after, problems)
        health = yield self.request("GET", "/health")
        self.assertEqual(health.status, 200)
        self.assertEqual(problems, [], "\n".join(problems))


#: Wrong values for a seed ``CommandArg`` type (a string argument takes a
#: number or boolean as its text, as on the seed; a whole number past 64
#: bits is still an integer to a Python command).
SEED_WRONG: dict[str, list[Any]] = {
    "string": [{"sweep": 1}, ["sweep"]],
    "integer": ["sweep", 1.5, {"sweep": 1}, True, "1e309"],
    "float": ["sweep", {"sweep": 1}, True, "1e309"],
    "boolean": ["maybe", {"sweep": 1}, 7],
    "string_array": ["sweep", [1], {"sweep": 1}],
}

#: A right value for each ``CommandArg`` type: a wrong value is sent beside
#: the command's other required arguments at these, so that it is the
#: value, not a missing argument, that must be refused.
SEED_RIGHT: dict[str, Any] = {
    "string": "sweep",
    "integer": 1,
    "float": 1.5,
    "boolean": True,
    "string_array": ["sweep"],
}


class SeedDoorSweepTests(SynchronousTestCase):
    """
    The seed's door: a template written for the seed's server
    (``tests/seed/templates/commands.py``, loaded through
    :mod:`sandboxd.seedface`), each of its commands' declared arguments
    wrong-typed, and bodies that are no object: a 4xx with a ``code``
    (the daemon's framing, as the seed's own server answers a bad
    argument with ``error`` and ``type``), never a 5xx; each wrong value
    beside the command's required arguments at right values
    (:data:`SEED_RIGHT`), so that the value itself is what is refused.
    """

    def test_template_commands(self) -> None:
        """Every command the template declares, every argument wrong-typed."""
        from tests.seedface.test_template import POLICY, TEMPLATE, TOKENS
        from tests.test_cli import DaemonProcess, serve_argv

        policy = os.path.abspath(self.mktemp())
        with open(policy, "w") as f:
            json.dump(POLICY, f)
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        daemon = DaemonProcess(
            self, serve_argv(base, "--policy", policy, "--commands", TEMPLATE), TOKENS
        )
        daemon.wait_healthy()

        def call(method: str, path: str, data: bytes | None) -> tuple[int, Any]:
            request = urllib.request.Request(
                f"http://127.0.0.1:{daemon.port}{path}",
                data=data,
                method=method,
                headers={
                    "Authorization": "Bearer admin-token",
                    "Content-Type": "application/json",
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=REQUEST_SECONDS) as r:
                    return r.status, json.loads(r.read() or b"null")
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read() or b"null")

        _, listed = call("GET", "/commands", None)
        commands = listed["commands"]
        self.assertGreater(len(commands), 3)
        problems: list[str] = []
        before = files_under(base)
        for declared in commands:
            name = declared["name"]
            args = {a["name"]: a for a in declared.get("args", [])}
            sent: list[tuple[str, bytes]] = [
                ("not JSON", b"{nope"),
                ("a JSON array", b"[]"),
            ]
            right = {
                a: SEED_RIGHT[spec["type"]]
                for a, spec in args.items()
                if spec["required"]
            }
            for arg, spec in sorted(args.items()):
                for wrong in SEED_WRONG.get(spec["type"], []):
                    body = json.dumps({**right, arg: wrong}).encode()
                    sent.append((f"{arg}: {wrong!r}", body))
            for what, data in sent:
                status, body = call("POST", f"/commands/{name}", data)
                code = body.get("code") if isinstance(body, dict) else None
                if not 400 <= status < 500 or not isinstance(code, str):
                    problems.append(f"{name} [{what}]: {status} {str(body)[:160]}")
        self.assertEqual(files_under(base), before)
        status, _ = call("GET", "/health", None)
        self.assertEqual(status, 200)
        self.assertEqual(problems, [], "\n".join(problems))


#: A wrong value for each JSON type a message field has.
E2B_WRONG: dict[str, Any] = {
    "string": {"sweep": 1},
    "integer": "sweep",
    "boolean": "sweep",
    "object": "sweep",
    "array": {"sweep": 1},
}

#: The door's REST routes that take no JSON object: ``POST /files`` takes
#: the file's bytes (multipart or raw: any body is a file), a context's
#: restart reads nothing but its path.
E2B_NOT_JSON = frozenset({"POST /files", "POST /contexts/{id}/restart"})


def proto_type(field: Any) -> str:
    """The JSON type of a protobuf field in protobuf's JSON mapping."""
    kind, label = field.proto.type.name, field.proto.label.name
    if kind == "MESSAGE" and field.proto.type_name.endswith("Entry"):
        return "object"  # a map
    if label == "REPEATED":
        return "array"
    if kind == "MESSAGE":
        return "object"
    if kind == "BOOL":
        return "boolean"
    if kind in ("STRING", "BYTES", "ENUM"):
        return "string"
    return "integer"


def e2b_fields(name: str, procedure: Any) -> dict[str, str] | None:
    """
    The fields a procedure of the door reads, by JSON name, with their JSON
    types: a Connect procedure's from envd's own protos (the SDK's copy),
    a REST route's from its declaration; None for a route with no JSON body.
    """
    if procedure.kind == "rest":
        if procedure.fields is None:
            return None
        return {f.name: f.type for f in procedure.fields}
    from e2b.envd.filesystem import filesystem_pb
    from e2b.envd.process import process_pb

    service, _, method = name.partition("/")
    for described in (process_pb.desc(), filesystem_pb.desc()):
        for declared in described.services:
            if declared.type_name != service:
                continue
            for rpc in declared.methods:
                if rpc.name == method:
                    return {f.json_name: proto_type(f) for f in rpc.input.fields}
    raise AssertionError(f"{name} is no procedure of envd's protos")


class E2BDoorSweepTests(SweepCase):
    """
    The E2B door: every Connect procedure and JSON route of
    :func:`sandboxd.e2b.service.procedures`, hostile messages: a Connect
    error (``code`` and ``message``; a stream's end message) or the REST
    route's JSON error, never a 5xx, nothing done.

    Each procedure's body cases are derived: a Connect procedure's fields
    from envd's protos, a REST route's from the fields it declares
    (:attr:`sandboxd.e2b.door.Procedure.fields`), each wrong-typed and
    refused.  A POST route that declares none must be one of
    :data:`E2B_NOT_JSON`, so a new JSON route is swept the day it is added.
    The routes that take no body (``GET``, ``DELETE``) are left out.
    """

    timeout = 120

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        """The daemon, with the E2B door listening too."""
        kwargs.setdefault("e2b_port", "tcp:0:interface=127.0.0.1")
        return super().start(stop_at_end, **kwargs)

    @inlineCallbacks
    def post(self, path: str, content_type: str, data: bytes) -> Any:
        """One POST to the door: (status, content type, body bytes)."""
        port = yield self.daemon.context.e2b.listening()
        agent = Agent(reactor)
        d = agent.request(
            b"POST",
            f"http://127.0.0.1:{port.getHost().port}{path}".encode(),
            Headers(
                {"Content-Type": [content_type], "Connect-Protocol-Version": ["1"]}
            ),
            FileBodyProducer(BytesIO(data)),
        )
        d.addTimeout(REQUEST_SECONDS, reactor)
        response = yield d
        body = yield readBody(response)
        kind = (response.headers.getRawHeaders(b"content-type") or [b""])[0]
        return response.code, kind.decode(), body

    @inlineCallbacks
    def test_procedures(self) -> Any:
        """Every unary, streaming and JSON REST procedure, hostile bodies."""
        from sandboxd.e2b.service import procedures
        from tests.e2b.sdk import envelope, envelopes

        problems: list[str] = []
        before = yield self.picture()
        malformed: list[tuple[str, bytes, bool]] = [
            ("not JSON", b"{nope", True),
            ("a JSON array", b"[]", True),
            ("a JSON string", b'"sweep"', True),
            ("nested arrays", deep_array().encode(), True),
        ]
        for name, procedure in sorted(procedures().items()):
            streaming = procedure.kind in ("server_stream", "client_stream")
            fields = e2b_fields(name, procedure)
            if procedure.kind == "rest":
                method, _, path = name.partition(" ")
                if method != "POST":
                    continue  # no body (see the docstring)
                if fields is None:
                    if name not in E2B_NOT_JSON:
                        problems.append(f"{name}: a POST route declaring no fields")
                    continue
                content_type = "application/json"
            else:
                path = "/" + name
                content_type = (
                    "application/connect+json" if streaming else "application/json"
                )
            assert fields is not None
            sent_bodies = malformed + [
                (
                    f"{field}: {E2B_WRONG[kind]!r}",
                    json.dumps({field: E2B_WRONG[kind]}).encode(),
                    True,
                )
                for field, kind in sorted(fields.items())
            ]
            for what, data, refuse in sent_bodies:
                label = f"{name} [{what}]"
                sent = (
                    envelope(json.loads(data))
                    if streaming
                    and data[:1] in b'{["'
                    and what != "nested arrays"
                    and what != "not JSON"
                    else data
                )
                if streaming and sent is data:
                    sent = b"\x00" + len(data).to_bytes(4, "big") + data
                try:
                    status, kind, body = yield self.post(path, content_type, sent)
                except Exception as e:
                    problems.append(f"{label}: no answer ({e.__class__.__name__})")
                    continue
                if status >= 500:
                    problems.append(f"{label}: {status} {body[:160]!r}")
                    continue
                if kind.startswith("application/connect+"):
                    end = envelopes(body)[-1][1] if body else {}
                    error = end.get("error") if isinstance(end, dict) else None
                    if refuse and not error:
                        problems.append(f"{label}: stream ended without an error")
                    if error and not isinstance(error.get("code"), str):
                        problems.append(f"{label}: {error}")
                    continue
                if status < 400:
                    if refuse:
                        problems.append(f"{label}: taken ({status}) {body[:120]!r}")
                    continue
                try:
                    answer = json.loads(body)
                except ValueError:
                    answer = None
                if not isinstance(answer, dict) or not isinstance(
                    answer.get("code", answer.get("message")), str | int
                ):
                    problems.append(f"{label}: {status} {body[:160]!r}")
        after = yield self.picture()
        self.compare("the E2B door", before, after, problems)
        health = yield self.request("GET", "/health")
        self.assertEqual(health.status, 200)
        self.assertEqual(problems, [], "\n".join(problems))
