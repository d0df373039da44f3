# -*- test-case-name: tests.agents.test_agents -*-
"""
Handlers of the ``agents`` group (SPEC §15.2): coding agents over ACP.

The handlers are thin: they parse the request, find the session and hand
over to :mod:`sandboxd.agents`; the session manager service
(:class:`~sandboxd.agents.manager.AgentManager`) lives in
``context.agents``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from sandboxd.agents import catalog
from sandboxd.agents.manager import AgentManager, build_prompt
from sandboxd.agents.permissions import REQUEST_STATES
from sandboxd.agents.state import SESSION_STATES
from sandboxd.agents.updates import settled
from sandboxd.api.schema import schema_for
from sandboxd.errors import (
    Code,
    bad_request,
    conflict,
    not_found,
    policy_rule,
    signal_not_allowed,
    unavailable,
    unsupported,
)
from sandboxd.eventlog import Event
from sandboxd.policy import defaults
from sandboxd.policy.defaults import MAX_TURN_WAIT_SECONDS
from sandboxd.processes.command import find_executable
from sandboxd.processes.environment import child_environment
from sandboxd.web.messages import ServerRequest, ServerResponse, SSEResponse
from sandboxd.web.params import (
    declared_types,
    flag,
    integer,
    number,
    one_of,
    required,
)
from sandboxd.web.sse import Follower, SSEChannel, frame, resume_point

if TYPE_CHECKING:
    from sandboxd.agents.session import AgentSession
    from sandboxd.agents.state import Turn


def manager(request: ServerRequest) -> AgentManager:
    """The group's session manager."""
    service = request.context.agents
    assert service is not None
    return service.get()


def session_of(request: ServerRequest) -> AgentSession:
    """The ``{sid}`` session, or 404."""
    return manager(request).get(request.path_params["sid"])


def _wait(value: Any, default: float) -> float:
    """A ``wait`` in seconds: not negative, at most :data:`MAX_TURN_WAIT_SECONDS`."""
    return number(value, "wait", default, 0, MAX_TURN_WAIT_SECONDS, clamp=True) or 0.0


async def _wait_turn(request: ServerRequest, turn: Turn, seconds: float) -> None:
    from sandboxd.agents.session import within

    if turn.state == "running" and seconds > 0:
        await within(request.context.reactor, turn.wait(), seconds)


# -- catalogue -----------------------------------------------------------------


def agents_catalog(request: ServerRequest) -> dict[str, Any]:
    """Every known agent, whether it is installed and has its keys."""
    return {
        "agents": [
            catalog.describe(e, request.rule) for e in catalog.entries(request.context)
        ]
    }


async def agents_catalog_get(request: ServerRequest) -> dict[str, Any]:
    """One entry; ``probe=true`` runs ``initialize`` on a short-lived agent."""
    entry = catalog.find(
        request.context,
        request.rule,
        request.path_params["agent"],
        require_allowed=False,
    )
    out = catalog.describe(entry, request.rule)
    if flag(request.query.get("probe"), "probe"):
        entry = catalog.find(request.context, request.rule, entry.id)
        out.update(await manager(request).transient(request, entry, None))
    return out


async def agents_catalog_sessions(request: ServerRequest) -> dict[str, Any]:
    """The agent's own stored sessions (``session/list``)."""
    entry = catalog.find(request.context, request.rule, request.path_params["agent"])
    params: dict[str, Any] = {}
    if request.query.get("cwd"):
        from sandboxd.access.guard import PathGuard

        params["cwd"] = PathGuard(request.rule).cwd(request.query["cwd"])
    if request.query.get("cursor"):
        params["cursor"] = request.query["cursor"]
    probe = await manager(request).transient(request, entry, None)
    caps = probe.get("agent_capabilities") or {}
    session_caps = caps.get("sessionCapabilities") if isinstance(caps, dict) else None
    if not isinstance(session_caps, dict) or session_caps.get("list") is None:
        raise unsupported(
            f"the agent {entry.id!r} cannot list its sessions", "RuntimeError"
        )
    result = (
        await manager(request).transient(request, entry, ("session/list", params))
    ).get("result") or {}
    sessions = [
        {
            "acp_session_id": s.get("sessionId"),
            "cwd": s.get("cwd"),
            "title": s.get("title"),
            "updated_at": s.get("updatedAt"),
        }
        for s in result.get("sessions") or []
        if isinstance(s, dict)
    ]
    return {"sessions": sessions, "next_cursor": result.get("nextCursor")}


def agents_install(request: ServerRequest) -> Any:
    """
    Install an agent's pinned package (``npm install -g PKG@VERSION``) as a
    managed process whose output ``process_output`` shows; one install per
    agent at a time.
    """
    entry = catalog.find(request.context, request.rule, request.path_params["agent"])
    described = catalog.describe(entry, request.rule)
    wanted = request.body.get("version")
    if described["installed"] and not wanted:
        return {"agent": entry.id, "already_installed": True, "path": described["path"]}
    if not entry.package:
        raise bad_request(f"the agent {entry.id!r} has no package to install")
    version = wanted or entry.version
    if (
        not isinstance(version, str)
        or not version
        or version.startswith("-")
        or any(c.isspace() for c in version)
    ):
        raise bad_request("'version' must be a version string")
    processes = request.context.processes
    if processes is None:
        raise unavailable("managed processes are not available")
    tag = f"agents-install:{entry.id}"
    running = [m for m in processes.list(tag) if m.running]
    if running:
        return ServerResponse(
            status=202,
            body={
                "agent": entry.id,
                "state": "installing",
                "pid": running[0].pid,
                "already_running": True,
            },
        )
    _check_process_limit(request, processes)
    env = child_environment(request.context, request.rule)
    npm = find_executable("npm", env)
    if npm is None:
        raise unavailable("npm is not installed")
    argv = [npm, "install", "-g", f"{entry.package}@{version}"]
    managed = processes.start(
        argv,
        command=" ".join(["npm", *argv[1:]]),
        env=env,
        cwd=request.context.base_dir,
        run_as=None,
        stdin_pipe=False,
        tag=tag,
        retention=request.rule.limits.max_output_bytes or defaults.MIB,
    )
    return ServerResponse(
        status=202,
        body={
            "agent": entry.id,
            "state": "installing",
            "pid": managed.pid,
            "command": managed.command,
            "output_url": f"/process/{managed.pid}/output",
        },
    )


def _check_process_limit(request: ServerRequest, processes: Any) -> None:
    """
    npm is a managed process, so ``max_processes`` bounds it as it bounds
    ``process_start`` (SPEC §11.4): the install's own rule if it sets the
    limit, else the one ``process_start`` runs under.

    :raises ApiError: 429 ``too_many_processes`` at the limit.
    """
    rule = request.rule
    if rule.limits.max_processes is None:
        rule = request.context.policy.rule("process_start")
    processes.check_room(rule)


# -- sessions ------------------------------------------------------------------


async def agents_session_create(request: ServerRequest) -> ServerResponse:
    """spawn → initialize → session/new → [mode, model, config] → [prompt]."""
    # Mode, model and config reach the agent only once it runs: their
    # types are checked before anything is looked up or started.
    declared_types(request.body, schema_for("agents_session_create").body)
    body = await manager(request).create(request)
    return ServerResponse(status=201, body=body)


async def agents_session_load(request: ServerRequest) -> ServerResponse:
    """``session/load`` (history replayed as events) or ``session/resume``."""
    declared_types(request.body, schema_for("agents_session_load").body)
    acp_session_id = required(request.body.get("acp_session_id"), "acp_session_id")
    replay = flag(request.body.get("replay"), "replay", True)
    catalog.find(request.context, request.rule, request.body.get("agent"))
    out = await manager(request).create(
        request, load={"acp_session_id": acp_session_id, "replay": replay}
    )
    return ServerResponse(status=200 if out.get("already_loaded") else 201, body=out)


def agents_session_list(request: ServerRequest) -> dict[str, Any]:
    """
    Sessions, optionally by agent and state.  A filter no session could
    match (a misspelt state, an agent nobody knows) is refused rather than
    answered with an empty list that looks like "none running".
    """
    sessions = manager(request).sessions.values()
    agent = request.query.get("agent") or None
    if agent is not None:
        known = {e.id for e in catalog.entries(request.context)}
        # A session outlives its entry when a reload drops it from the catalogue.
        known.update(s.entry.id for s in sessions)
        agent = one_of(agent, "agent", tuple(sorted(known)))
    state = request.query.get("state") or None
    if state is not None:
        state = one_of(state, "state", SESSION_STATES)
    return {
        "sessions": [
            s.summary()
            for s in sessions
            if (agent is None or s.entry.id == agent)
            and (state is None or s.state == state)
        ]
    }


def agents_session_get(request: ServerRequest) -> dict[str, Any]:
    """One session in full."""
    return session_of(request).describe()


async def agents_session_config(request: ServerRequest) -> dict[str, Any]:
    """Mode, model, config options, title."""
    session = session_of(request)
    return await session.configuration.configure(request.body, request.rule)


async def agents_session_cancel(request: ServerRequest) -> dict[str, Any]:
    """``session/cancel``, then wait (bounded) for the turn to end."""
    session = session_of(request)
    default_wait = defaults.AGENT_CANCEL_GRACE_SECONDS + defaults.KILL_GRACE_SECONDS
    wait = _wait(request.body.get("wait"), default_wait)
    turn = session.turn_control.cancel()
    if turn is None:
        last = next(reversed(session.turns.values()), None) if session.turns else None
        return {
            "turn_id": last.turn_id if last else None,
            "state": last.state if last else None,
            "stop_reason": last.stop_reason if last else None,
            "forced": last.forced if last else False,
        }
    await _wait_turn(request, turn, wait)
    return {
        "turn_id": turn.turn_id,
        "state": turn.state,
        "stop_reason": turn.stop_reason,
        "forced": turn.forced,
    }


async def agents_session_delete(request: ServerRequest) -> dict[str, Any]:
    """Close the session and end the agent's tree."""
    session = session_of(request)
    forget = flag(request.query.get("forget"), "forget")
    return await session.close(forget=forget)


async def agents_prompt(request: ServerRequest) -> Any:
    """One turn: 200 when it ends within ``wait``, else 202 and follow the events."""
    session = session_of(request)
    wait = _wait(request.body.get("wait"), 30.0)
    session.require_live()
    if session.current is not None:
        raise conflict(
            "a turn is already running",
            Code.TURN_IN_PROGRESS,
            turn_id=session.current.turn_id,
        )
    blocks = build_prompt(session, request.body, request.rule)
    turn = session.turn_control.start(blocks)
    await _wait_turn(request, turn, wait)
    if turn.state == "running":
        return ServerResponse(
            status=202,
            body={
                "turn_id": turn.turn_id,
                "state": "running",
                "events_url": session.events_url() + f"&after={turn.seq_from - 1}",
            },
        )
    return turn.result()


def agents_turns(request: ServerRequest) -> dict[str, Any]:
    """Every kept turn."""
    return {"turns": [t.describe() for t in session_of(request).turns.values()]}


async def agents_turn_get(request: ServerRequest) -> dict[str, Any]:
    """One turn, long-polled up to ``wait`` seconds while it runs."""
    session = session_of(request)
    turn = session.turns.get(request.path_params["turn_id"])
    if turn is None:
        raise not_found(f"unknown turn {request.path_params['turn_id']!r}")
    await _wait_turn(request, turn, _wait(request.query.get("wait"), 0.0))
    out = turn.describe()
    out.update(
        {
            k: v
            for k, v in turn.result().items()
            if k in ("text", "tool_call_ids", "usage")
        }
    )
    return out


def agents_messages(request: ServerRequest) -> dict[str, Any]:
    """Messages with their chunks coalesced."""
    session = session_of(request)
    turn_id = request.query.get("turn_id")
    after = integer(request.query.get("after"), "after", 0, low=0)
    limit = integer(request.query.get("limit"), "limit", 100, low=0) or 100
    selected = [
        {k: v for k, v in settled(m).items() if not k.startswith("_")}
        for m in session.messages
        if m["seq_to"] > after and (turn_id is None or m["turn_id"] == turn_id)
    ][:limit]
    return {
        "messages": selected,
        "next": selected[-1]["seq_to"] if selected else after,
    }


def _event_filter(request: ServerRequest) -> tuple[set[str] | None, bool]:
    types = request.query.get("types")
    wanted = {t.strip() for t in types.split(",") if t.strip()} if types else None
    return wanted, flag(request.query.get("include_raw"), "include_raw")


def _event_view(event: Event, include_raw: bool) -> dict[str, Any]:
    data: dict[str, Any] = event.data
    if include_raw or "raw" not in data or data.get("type") == "unknown":
        return data
    return {k: v for k, v in data.items() if k != "raw"}


def agents_events(request: ServerRequest) -> Any:
    """The session's event log: SSE with ``follow=true``, else one page."""
    session = session_of(request)
    after = resume_point(request.query, request.headers)
    wanted, include_raw = _event_filter(request)
    follow = flag(request.query.get("follow"), "follow", False)
    if follow:

        def formatter(event: Event) -> bytes:
            if wanted is not None and event.event not in wanted:
                return b""
            return frame(event.event, _event_view(event, include_raw), event.seq)

        def start(channel: SSEChannel) -> Deferred[None]:
            return Follower(session.log, channel, after, formatter).done

        return SSEResponse(start=start)
    limit = integer(request.query.get("limit"), "limit", 1000, low=0) or 1000
    gap, events = session.log.since(after)
    selected: list[Event] = []
    last = after
    for event in events:
        if len(selected) >= limit:
            break
        last = event.seq
        if wanted is None or event.event in wanted:
            selected.append(event)
    return {
        "events": [_event_view(e, include_raw) for e in selected],
        "next": last,
        "dropped": {"from": gap[0], "to": gap[1]} if gap else None,
        "closed": session.log.closed,
    }


#: What a held request is: a tool's permission, or a question to the user.
REQUEST_KINDS = ("permission", "question")


def agents_requests(request: ServerRequest) -> dict[str, Any]:
    """Held permission requests and questions across sessions."""
    session_id = request.query.get("session_id")
    state = request.query.get("state", "pending") or "all"
    state = one_of(state, "state", (*REQUEST_STATES, "all"))
    kind = request.query.get("kind")
    if kind is not None:
        kind = one_of(kind, "kind", REQUEST_KINDS)
    return {
        "requests": [
            r.describe()
            for r in manager(request).requests.values()
            if (session_id is None or r.session_id == session_id)
            and (state == "all" or r.state == state)
            and (kind is None or r.kind == kind)
        ]
    }


def agents_request_reply(request: ServerRequest) -> dict[str, Any]:
    """A human's answer, sent to the agent as the JSON-RPC response."""
    held = manager(request).requests.get(request.path_params["request_id"])
    if held is None:
        raise not_found(f"unknown request {request.path_params['request_id']!r}")
    session = manager(request).get(held.session_id)
    return session.held.reply(held, request.body, request.identity.id, request.rule)


def agents_plan(request: ServerRequest) -> dict[str, Any]:
    """The agent's latest plan (each update replaces the last)."""
    session = session_of(request)
    return {"entries": session.plan, "updated_seq": session.plan_seq}


def agents_tool_calls(request: ServerRequest) -> dict[str, Any]:
    """Tool calls, filtered by turn, status or kind."""
    session = session_of(request)
    q = request.query
    return {
        "tool_calls": [
            session.updates.tool_call_view(tc)
            for tc in session.tool_calls.values()
            if (q.get("turn_id") is None or tc.get("turn_id") == q["turn_id"])
            and (q.get("status") is None or tc.get("status") == q["status"])
            and (q.get("kind") is None or tc.get("kind") == q["kind"])
        ]
    }


def agents_tool_call_get(request: ServerRequest) -> dict[str, Any]:
    """One tool call whole, diffs unified with ``format=unified``."""
    form = request.query.get("format")
    unified = form is not None and one_of(form, "format", ("unified",)) == "unified"
    session = session_of(request)
    tc = session.tool_calls.get(request.path_params["tool_call_id"])
    if tc is None:
        raise not_found(f"unknown tool call {request.path_params['tool_call_id']!r}")
    return session.updates.tool_call_view(tc, full=True, unified=unified)


def agents_files(request: ServerRequest) -> dict[str, Any]:
    """Files the agent wrote (through fs/*), showed diffs for, or named."""
    session = session_of(request)
    turn_id = request.query.get("turn_id")
    with_diff = flag(request.query.get("diff"), "diff")
    return {
        "files": [
            session.changes.file_view(record, with_diff)
            for record in session.files.values()
            if turn_id is None or turn_id in record["turn_ids"]
        ]
    }


def agents_terminals(request: ServerRequest) -> dict[str, Any]:
    """The agent's terminals."""
    return {"terminals": [t.describe() for t in session_of(request).terminals.values()]}


def _terminal(request: ServerRequest) -> Any:
    session = session_of(request)
    terminal = session.terminals.get(request.path_params["terminal_id"])
    if terminal is None:
        raise not_found(f"unknown terminal {request.path_params['terminal_id']!r}")
    return terminal


def agents_terminal_output(request: ServerRequest) -> Any:
    """A terminal's output with the process_output contract (SPEC §7.4)."""
    terminal = _terminal(request)
    after = resume_point(request.query, request.headers)
    if flag(request.query.get("follow"), "follow"):

        def start(channel: SSEChannel) -> Deferred[None]:
            return Follower(terminal.log, channel, after).done

        return SSEResponse(start=start)
    gap, events = terminal.log.since(after)
    return {
        "terminal_id": terminal.terminal_id,
        "pid": terminal.pid,
        "state": terminal.state,
        "exit_code": terminal.exit_code,
        "events": [
            {"seq": e.seq, "stream": e.event, "data": e.data.get("data")}
            for e in events
            if e.event != "exit"
        ],
        "next": events[-1].seq if events else after,
        "dropped_bytes": terminal.log.dropped_bytes,
        "gap": {"from": gap[0], "to": gap[1]} if gap else None,
    }


def agents_terminal_kill(request: ServerRequest) -> dict[str, Any]:
    """Signal an agent's terminal; the agent sees the exit."""
    terminal = _terminal(request)
    sig = integer(request.body.get("signal", 15), "signal")
    if sig not in request.rule.params.allowed_signals:
        raise signal_not_allowed(
            f"signal {sig} is not allowed",
            policy_rule(request.rule, "params.allowed_signals"),
        )
    terminal.kill(sig)
    return {"terminal_id": terminal.terminal_id, "signal": sig}


def agents_commands(request: ServerRequest) -> dict[str, Any]:
    """The agent's slash commands."""
    return {"commands": session_of(request).command_list()}


def agents_logs(request: ServerRequest) -> dict[str, Any]:
    """The agent's stderr, head and tail, secrets redacted."""
    session = session_of(request)
    after = integer(request.query.get("after"), "after", 0, low=0)
    return {
        "chunks": session.stderr.chunks(after),
        "dropped_bytes": session.stderr.dropped_bytes,
    }


HANDLERS: dict[str, Any] = {
    "agents_catalog": agents_catalog,
    "agents_catalog_get": agents_catalog_get,
    "agents_install": agents_install,
    "agents_catalog_sessions": agents_catalog_sessions,
    "agents_session_create": agents_session_create,
    "agents_session_load": agents_session_load,
    "agents_session_list": agents_session_list,
    "agents_session_get": agents_session_get,
    "agents_session_config": agents_session_config,
    "agents_session_cancel": agents_session_cancel,
    "agents_session_delete": agents_session_delete,
    "agents_prompt": agents_prompt,
    "agents_turns": agents_turns,
    "agents_turn_get": agents_turn_get,
    "agents_messages": agents_messages,
    "agents_events": agents_events,
    "agents_requests": agents_requests,
    "agents_request_reply": agents_request_reply,
    "agents_plan": agents_plan,
    "agents_tool_calls": agents_tool_calls,
    "agents_tool_call_get": agents_tool_call_get,
    "agents_files": agents_files,
    "agents_terminals": agents_terminals,
    "agents_terminal_output": agents_terminal_output,
    "agents_terminal_kill": agents_terminal_kill,
    "agents_commands": agents_commands,
    "agents_logs": agents_logs,
}
