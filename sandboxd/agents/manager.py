# -*- test-case-name: tests.agents.test_agents -*-
"""
The service that owns every agent session (``context.agents``).

It creates sessions under the caller's rule (catalogue entry allowed,
guarded cwd, scrubbed environment, the right user, no forbidden mode or
MCP server, then a free slot of ``max_sessions``, which an idle agent kept
only for reuse gives up when none is free), keeps the index of held
permission requests and questions across sessions, runs the short-lived
agent processes behind ``probe`` and ``session/list``, and on stop ends
every agent's whole tree within a bound.

The group is opt-in, so the service starts lazily: it is created with the
daemon, but the ACP machinery (:mod:`.session` and the collaborators and
framing under it) is imported when the first agent is started, never in a
daemon that serves none.
"""

from __future__ import annotations

import json
import os
import secrets
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, succeed

from sandboxd.access.audit import secret_param
from sandboxd.access.guard import PathGuard
from sandboxd.agents import catalog, climcp
from sandboxd.agents.catalog import CatalogEntry
from sandboxd.agents.permissions import headless_access
from sandboxd.errors import (
    ApiError,
    Code,
    agent_error,
    agent_unavailable,
    bad_request,
    forbidden,
    limit_exceeded,
    limit_rule,
    not_found,
    payload_too_large,
    policy_rule,
)
from sandboxd.eventlog import forget_closed
from sandboxd.policy import defaults
from sandboxd.policy.defaults import identity_cap
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import resolve_user
from sandboxd.processes.environment import child_environment, keep_only, validate_env
from sandboxd.waiters import Waiters

if TYPE_CHECKING:
    from sandboxd.agents.permissions import HeldRequest
    from sandboxd.agents.session import AgentSession

#: What an agent inherits from the daemon besides its ``env_pass`` keys.
BASE_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
    "TZ",
)

_PROMPT_TYPES = ("text", "image", "audio", "resource_link", "resource")


def agent_environment(
    context: Any, rule: EffectiveRule, entry: CatalogEntry, extra: dict[str, str]
) -> dict[str, str]:
    """
    A scrubbed environment: a few basics, the entry's ``env_pass`` names,
    its fixed ``env``, the request's ``env``; never the daemon's secrets or
    ``env_deny``, and no npm variables (npx would resolve against them).
    """
    base = keep_only(os.environ, (*BASE_ENV, *entry.env_pass))
    base.update(entry.env)
    base.update(extra)
    env = child_environment(context, rule, base=base)
    return {
        k: v
        for k, v in env.items()
        if not k.lower().startswith("npm_") and k != "INIT_CWD"
    }


def agent_secrets(
    env: dict[str, str], entry: CatalogEntry, given: dict[str, str]
) -> list[str]:
    """
    The values masked wherever an agent's session shows them (its stderr
    log, its events): what the entry passes on from the daemon
    (``env_pass``), every value given for its environment (the entry's
    fixed ``env``, the create request's ``env``: how a driver hands an
    agent its provider key), and the value of every variable whose name
    says it holds a secret (``*_API_KEY``, ``*_TOKEN``), as the audit log
    masks such names in URLs.
    """
    values = [env[n] for n in entry.env_pass if env.get(n)]
    values.extend(v for k, v in env.items() if v and secret_param(k))
    values.extend(
        v
        for v in (*entry.env.values(), *given.values())
        if len(v) >= defaults.AGENT_GIVEN_ENV_MASK_MIN_CHARS
    )
    return values


def check_mcp_servers(value: Any, rule: EffectiveRule) -> list[dict[str, Any]]:
    """``mcp_servers`` as ACP takes them, within ``params.mcp_servers``."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(s, dict) for s in value):
        raise bad_request("'mcp_servers' must be a list of objects")
    allowed = rule.params.mcp_servers
    source = policy_rule(rule, "params.mcp_servers")
    for server in value:
        kind = server.get("type") or ("stdio" if "command" in server else None)
        if allowed == "none" or (allowed == "http" and kind not in ("http", "sse")):
            raise forbidden(
                f"MCP servers of type {kind!r} are not allowed (params.mcp_servers={allowed})",
                Code.PARAM_NOT_ALLOWED,
                rule=source,
            )
    return value


def check_headless_servers(protocol: str, servers: list[dict[str, Any]]) -> None:
    """
    The MCP servers a headless CLI (``protocol``: ``headless:CLI``) would
    be handed, checked before anything starts: what it cannot take is the
    caller's 400, not the agent's 502.
    """
    if not protocol.startswith("headless:") or not servers:
        return
    try:
        climcp.handover(protocol.partition(":")[2], servers)
    except climcp.Refused as e:
        raise bad_request(str(e), param="mcp_servers") from None


def _retry_when(busy: int) -> dict[str, Any]:
    """
    What a refusal at a slot limit adds when ``busy`` agents will give
    their slots up on their own: a ``Retry-After``, so a client (the OpenAI
    SDK) waits and tries again rather than give up.
    """
    if not busy:
        return {}
    seconds = defaults.AGENT_SLOT_RETRY_SECONDS
    return {"headers": {"Retry-After": str(seconds)}, "retry_after": seconds}


class AgentManager(Service):
    """
    Every agent session of the daemon: the agents group's service
    (:class:`~sandboxd.agents.session.SessionOwner` of each session).
    """

    name = "agents"

    def __init__(self, context: Any) -> None:
        self.context = context
        self.reactor = context.reactor
        self.sessions: OrderedDict[str, AgentSession] = OrderedDict()
        self.requests: OrderedDict[str, HeldRequest] = OrderedDict()
        self._transient: set[AgentSession] = set()
        #: Called first when the daemon stops, while every agent still runs
        #: (the ``/v1`` door keeps its sessions as they stand).
        self.before_stop: list[Callable[[], Deferred[Any] | None]] = []
        #: Loads under way, by ``(agent, acp_session_id)``: a second load
        #: of the same stored session waits for the first's outcome.
        self._loading: dict[tuple[str, str], Waiters[None]] = {}
        #: Asked, in turn, for a slot when ``max_sessions`` agents run (or
        #: an identity's share of them, the identity given): each ends an
        #: idle agent (of that identity's) it keeps only to reuse it (the
        #: Deferred fires once it is gone), or answers None when it has none.
        self.room_makers: list[Callable[[str | None], Deferred[Any] | None]] = []
        #: Asked, when no slot could be made, how many running agents (of
        #: the identity given) hold theirs only while they serve a turn
        #: (``/v1`` conversations behind responses): each gives it up once
        #: idle, so the refusal is one to retry, not to act on.
        self.slots_in_use: list[Callable[[str | None], int]] = []
        #: Of those, the ones that wait for their caller's approval (a
        #: retry does not free them: an answer, a cancel or a delete does).
        self.slots_waiting: list[Callable[[str | None], int]] = []
        #: The sessions whose agent is starting (handshake, ``session/new``):
        #: live, but no caller holds them yet.
        self._starting: set[AgentSession] = set()

    # -- bookkeeping -----------------------------------------------------------

    def live(self) -> list[AgentSession]:
        """Sessions whose agent is still running."""
        return [s for s in self.sessions.values() if not s.log.closed]

    def get(self, session_id: str) -> AgentSession:
        """A session by id, or 404."""
        session = self.sessions.get(session_id)
        if session is None:
            raise not_found(f"unknown agent session {session_id!r}")
        return session

    def register_request(self, held: HeldRequest) -> None:
        """Index a held request so ``/agents/requests`` can find it."""
        self.requests[held.request_id] = held
        while len(self.requests) > defaults.AGENT_KEPT_ITEMS:
            oldest = next(iter(self.requests))
            if self.requests[oldest].state == "pending":
                break
            self.requests.popitem(last=False)

    def session_ended(self, session: AgentSession) -> None:
        """Called once a session's agent is gone."""
        self._transient.discard(session)
        forget_closed(
            self.sessions,
            lambda s: s.log,
            lambda sid: self.sessions.pop(sid, None),
            defaults.AGENT_KEPT_ITEMS,
            defaults.AGENT_KEPT_CLOSED_BYTES,
        )

    def policy_reloaded(self) -> None:
        """
        A reload reaches the running agents: each session takes the new
        rule of the endpoint it was created through, so what the daemon
        decides for it from now on (the agent's file and terminal
        requests, its permission requests, its limits) follows the policy
        in force.  A session whose rule is now off, or whose agent the new
        ``params.agents`` leaves out, is ended: it could no longer be
        driven, nor stopped, through routes that now answer 404.
        """
        policy = self.context.policy
        for session in self.live():
            if session.state in ("closing", "closed", "failed"):
                continue
            rule: EffectiveRule = policy.rule(session.rule.endpoint_id)
            if rule.enabled and catalog.allowed(session.entry, rule):
                session.rule = rule
                continue
            session.error = {
                "code": "policy_reload",
                "message": "a policy reload turned this session's endpoint or agent off",
            }
            Deferred.fromCoroutine(session.close(reason="policy_reload"))

    def owners_removed(self, before: Any) -> None:
        """
        After a reload, end every session whose owner the new policy no
        longer lets drive it: the identity (or the minter of the link that
        made it) was taken out of ``auth.tokens``, or no longer holds the
        scope of the endpoint that created it.  An agent runs commands and
        writes files for its owner, as a terminal does, so a leaked
        identity taken out of the policy must not keep a running turn, nor
        have the turns it queued (``/v1`` sessions and responses included)
        run after its token answers 401.

        :param before: the identities of the policy replaced
            (:class:`~sandboxd.access.auth.TokenStore`): only a session
            owned by one of them is asked about, never one owned by
            something other than a policy identity.
        """
        from sandboxd.access.gate import still_allowed

        table = self.context.table
        for session in self.live():
            if session.state in ("closing", "closed", "failed"):
                continue
            owner = before.current(session.identity)
            if owner is None:
                continue
            # Asked by name, not by token: a session belongs to its owner,
            # so a rotated token leaves it to the holder of the new one.
            owner = attrs.evolve(owner, credential=None)
            endpoint = table.get(session.rule.endpoint_id)
            _, error = still_allowed(self.context, owner, endpoint)
            if error is None:
                continue
            session.error = {"code": "identity_removed", "message": error.message}
            Deferred.fromCoroutine(session.close(reason="identity_removed"))

    # -- creating --------------------------------------------------------------

    def _new_session(
        self,
        request: Any,
        entry: CatalogEntry,
        body: dict[str, Any],
        transient: bool = False,
        handed: tuple[str, ...] = (),
    ) -> tuple[AgentSession, tuple[list[str], str]]:
        """The session, and the argv and executable that start its agent."""
        from sandboxd.agents.session import AgentSession

        rule: EffectiveRule = request.rule
        if rule.params.confine:
            request.audit["confined"] = True
        guard = PathGuard(rule)
        cwd = guard.cwd(body.get("cwd"))
        extra_dirs = body.get("additional_directories")
        if extra_dirs is not None:
            if not isinstance(extra_dirs, list):
                raise bad_request("'additional_directories' must be a list")
            body["additional_directories"] = [guard.cwd(p) for p in extra_dirs]
        body["mcp_servers"] = check_mcp_servers(body.get("mcp_servers"), rule)
        given = validate_env(body.get("env"))
        env = agent_environment(self.context, rule, entry, given)
        run_as = resolve_user(body.get("user"), rule)
        if run_as is not None:
            run_as.apply(env)
        found = entry.found(env)
        launch = entry.launch(found, headless_access(rule))
        check_headless_servers(entry.protocol(found), body["mcp_servers"])
        if launch is None:
            raise agent_unavailable(
                f"the agent {entry.id!r} is not installed ({' or '.join(entry.programs())} not found on PATH)",
                install={"package": entry.package, "version": entry.version}
                if entry.package
                else None,
            )
        secret_values = agent_secrets(env, entry, given)
        secret_values.extend(handed)
        session = AgentSession(
            self,
            "as_" + secrets.token_hex(6),
            entry,
            rule,
            cwd,
            env,
            run_as,
            secret_values,
            title=body.get("title") if isinstance(body.get("title"), str) else None,
            # Whose max_per_identity share it counts against: a link's is
            # its minter's (:meth:`_free_share`).
            identity=request.identity.root,
        )
        return session, launch

    async def create(
        self,
        request: Any,
        load: dict[str, Any] | None = None,
        handed: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """
        ``agents_session_create`` / ``agents_session_load``.

        :param handed: secrets the agent is handed in its session (the
            ``/v1`` door's vault credentials), masked in its stderr log.
        """
        body = dict(request.body)
        rule: EffectiveRule = request.rule
        entry = catalog.find(self.context, rule, body.get("agent"))
        if load is not None:
            key = (entry.id, str(load["acp_session_id"]))
            while key in self._loading:
                await self._loading[key].wait()
            live = self.loaded(*key)
            if live is not None:
                # One agent process per stored conversation: a second one
                # would write the same transcript and the two diverge.
                return {**self.created_body(live), "already_loaded": True}
            self._loading[key] = Waiters()
            try:
                return await self._create(request, body, rule, entry, load, handed)
            finally:
                self._loading.pop(key).fire(None)
        return await self._create(request, body, rule, entry, load, handed)

    def loaded(self, agent: str, acp_session_id: str) -> AgentSession | None:
        """The live session of ``agent`` bound to its stored ``acp_session_id``."""
        for session in self.live():
            if (
                session.entry.id == agent
                and session.acp_session_id == acp_session_id
                and session.state not in ("closing", "closed", "failed")
            ):
                return session
        return None

    def created_body(self, session: AgentSession) -> dict[str, Any]:
        """What a create (or load) answers about ``session``."""
        return {
            "session_id": session.session_id,
            "agent": session.entry.id,
            "acp_session_id": session.acp_session_id,
            "state": session.state,
            "modes": session.modes,
            "config_options": session.config_options,
            "models": session.models,
            "agent_info": session.agent_info,
            "capabilities": session.capabilities,
            "commands": session.command_list(),
            "title": session.title,
            "events_url": session.events_url(),
        }

    async def _create(
        self,
        request: Any,
        body: dict[str, Any],
        rule: EffectiveRule,
        entry: CatalogEntry,
        load: dict[str, Any] | None,
        handed: tuple[str, ...],
    ) -> dict[str, Any]:
        from sandboxd.agents.configuration import check_mode

        if load is None:
            check_mode(body.get("mode"), rule)
            if isinstance(body.get("config"), dict):
                for value in body["config"].values():
                    if isinstance(value, str):
                        check_mode(value, rule)
            if body.get("prompt") is not None:
                check_prompt(body, rule)  # before an agent runs for it
        session, (argv, executable) = self._new_session(
            request, entry, body, handed=handed
        )
        # Checked once the request is known to be good: a bad one is its
        # own error, and no idle agent gives its slot up for it.
        await self._free_share(session.identity, rule)
        await self._free_slot(rule)
        self.sessions[session.session_id] = session
        self._starting.add(session)
        try:
            return await self._start(session, argv, executable, body, rule, load)
        finally:
            self._starting.discard(session)

    async def _start(
        self,
        session: AgentSession,
        argv: list[str],
        executable: str,
        body: dict[str, Any],
        rule: EffectiveRule,
        load: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """:meth:`_create` once the session has its place: its agent starts."""
        try:
            session.handshake.spawn(argv, executable)
        except OSError as e:
            self.sessions.pop(session.session_id, None)
            raise agent_unavailable(f"cannot start the agent: {e.strerror}") from None
        await session.handshake.run(body, load)
        settings = ("mode", "model", "config", "thought_level")
        if any(body.get(k) is not None for k in settings):
            try:
                await session.configuration.configure(
                    {k: body.get(k) for k in settings}, rule
                )
            except ApiError:
                await self._withdraw(session, "configure_failed")
                raise
        out = self.created_body(session)
        if load is None and body.get("prompt") is not None:
            try:
                # What this agent's promptCapabilities refuse is known only now.
                blocks = build_prompt(session, body, rule)
            except ApiError:
                await self._withdraw(session, "prompt_refused")
                raise
            out["turn_id"] = session.turn_control.start(blocks).turn_id
            out["state"] = session.state
        return out

    async def _free_slot(self, rule: EffectiveRule) -> None:
        """
        A slot of ``max_sessions`` for one more agent: at the limit, idle
        agents kept only to be reused (:attr:`room_makers`) give theirs up,
        one at a time, until one is free; else 429.
        """
        limit = rule.limits.max_sessions or 4
        while len(self.live()) >= limit:
            freed = next(
                (d for room in self.room_makers if (d := room(None)) is not None),
                None,
            )
            if freed is None:
                busy = min(limit, self._serving_turns(None) + len(self._starting))
                raise limit_exceeded(
                    429,
                    f"too many agent sessions (limit {limit})"
                    + (
                        f"; {busy} of them serve responses in progress, retry "
                        "once one completes"
                        if busy
                        else ""
                    ),
                    Code.TOO_MANY_SESSIONS,
                    rule=limit_rule(rule, "max_sessions"),
                    limit=limit,
                    **_retry_when(busy),
                )
            await freed

    async def _free_share(self, owner: str, rule: EffectiveRule) -> None:
        """
        A place in ``owner``'s share of ``max_sessions`` (``max_per_identity``;
        by default half when more than one identity can log in), so one
        identity, or the links it minted, cannot take every agent and lock
        the others out: at its share, an idle ``/v1`` conversation of its own
        gives its agent up; else 429.  The native sessions and the ``/v1``
        door's share one count, as they share the slots.
        """
        limit = rule.limits.max_sessions or 4
        mine = identity_cap(
            limit, len(self.context.policy.tokens.ids()), rule.limits.max_per_identity
        )
        while (held := sum(1 for s in self.live() if s.identity == owner)) >= mine:
            freed = next(
                (d for room in self.room_makers if (d := room(owner)) is not None),
                None,
            )
            if freed is None:
                waiting = sum(count(owner) for count in self.slots_waiting)
                serving = self._serving_turns(owner) - waiting
                starting = sum(1 for s in self._starting if s.identity == owner)
                busy = min(held, serving + starting)
                asking = (
                    f"{waiting} of your responses wait for an approval: answer, "
                    "cancel or delete them"
                    if waiting
                    else ""
                )
                if busy:
                    # Conversations behind responses give their agents up
                    # once their turn ends, and agents still starting (a
                    # burst of responses) soon serve one: the caller only
                    # has to wait.
                    sessions = max(0, held - busy - waiting)
                    parts = [
                        f"{serving} of your responses in progress" if serving else "",
                        f"{starting} agents starting" if starting else "",
                        f"{sessions} agent sessions" if sessions else "",
                    ]
                    message = (
                        f"your share of {limit} agents ({mine}, max_per_identity) "
                        f"is in use: {' and '.join(p for p in parts if p)}"
                        "; retry once a response completes"
                        + (f" ({asking})" if asking else "")
                    )
                elif waiting:
                    sessions = max(0, held - waiting)
                    message = (
                        f"your share of {limit} agents ({mine}, max_per_identity) "
                        f"is in use: {asking}"
                        + (
                            f"; {sessions} agent sessions run besides"
                            if sessions
                            else ""
                        )
                    )
                else:
                    message = (
                        f"you have {held} agent sessions running, your share of "
                        f"{limit} (max_per_identity); close one first"
                    )
                raise limit_exceeded(
                    429,
                    message,
                    Code.TOO_MANY_SESSIONS,
                    rule=limit_rule(rule, "max_per_identity"),
                    limit=mine,
                    **_retry_when(busy),
                )
            await freed

    def _serving_turns(self, owner: str | None) -> int:
        """
        How many running agents (``owner``'s, or anyone's) hold their slot
        only for the turn they serve (:attr:`slots_in_use`).
        """
        return sum(count(owner) for count in self.slots_in_use)

    async def _withdraw(self, session: AgentSession, reason: str) -> None:
        """
        A create refused after its agent started: end the agent and forget
        the session, so the error answer leaves nothing behind (SPEC §6).
        """
        try:
            await session.close(reason=reason)
        finally:
            self.sessions.pop(session.session_id, None)

    # -- transient agents (probe, session/list) --------------------------------

    async def transient(
        self, request: Any, entry: CatalogEntry, call: tuple[str, dict[str, Any]] | None
    ) -> dict[str, Any]:
        """
        Start the agent, ``initialize`` it (and make one more call), then
        end it: the catalogue's probe and ``session/list``.
        """
        from sandboxd.agents.handshake import agent_refused
        from sandboxd.agents.session import within
        from sandboxd.jsonrpc import ConnectionLost, RpcError

        body = {"cwd": request.query.get("cwd")} if request.query.get("cwd") else {}
        session, (argv, executable) = self._new_session(
            request, entry, body, transient=True
        )
        self._transient.add(session)
        session.handshake.spawn(argv, executable)
        out: dict[str, Any] = {}
        try:
            await session.handshake.run(body, probe=True)
            out = {
                "protocol_version": session.protocol_version,
                "agent_info": session.agent_info,
                "agent_capabilities": session.capabilities,
                "auth_methods": session.auth_methods,
            }
            if call is not None:
                method, params = call
                try:
                    out["result"] = await session.ask(method, params)
                except RpcError as e:
                    raise agent_refused(method, e) from None
                except ConnectionLost:
                    raise agent_error(f"the agent exited during {method}") from None
        finally:
            session.process.close_stdin()
            await within(
                self.reactor,
                session.process.wait_exit(),
                defaults.AGENT_STOP_GRACE_SECONDS,
            )
            if not session.process.exited:
                await within(
                    self.reactor,
                    session.process.terminate(),
                    defaults.KILL_GRACE_SECONDS + 1,
                )
        return out

    # -- stopping --------------------------------------------------------------

    def stopService(self) -> Deferred[Any]:
        """End every agent's whole tree: TERM now, KILL after the grace period."""
        super().stopService()  # type: ignore[no-untyped-call]
        waits = [d for hook in self.before_stop if (d := hook()) is not None]
        sessions = [*self.sessions.values(), *self._transient]
        if not sessions and not waits:
            return succeed(None)
        from sandboxd.agents.session import within

        for session in sessions:
            if session.process.pid is not None and not session.process.exited:
                if session.state not in ("closing", "closed", "failed"):
                    session.set_state("closing")
                waits.append(
                    within(
                        self.reactor,
                        session.process.terminate(),
                        defaults.KILL_GRACE_SECONDS + 1,
                    )
                )
                for terminal in session.terminals.values():
                    terminal.kill()
        return DeferredList(waits)


#: What a prompt is checked against before any agent runs: every block
#: kind allowed, files linked rather than read (their existence checked).
_ANY_AGENT = {"image": True, "audio": True, "embeddedContext": False}


def check_prompt(body: dict[str, Any], rule: EffectiveRule) -> None:
    """
    Refuse a malformed ``prompt`` before an agent is started for it: what
    :func:`build_prompt` would refuse whatever the agent accepts.
    """
    prompt_blocks(body, rule, _ANY_AGENT)


def build_prompt(
    session: AgentSession, body: dict[str, Any], rule: EffectiveRule
) -> list[dict[str, Any]]:
    """
    ``prompt`` (a string or content blocks) plus guarded ``files``, as ACP
    blocks within ``max_prompt_bytes`` and the agent's ``promptCapabilities``.
    """
    caps = session.capabilities.get("promptCapabilities") or {}
    return prompt_blocks(body, rule, caps if isinstance(caps, dict) else {})


def prompt_blocks(
    body: dict[str, Any], rule: EffectiveRule, caps: dict[str, Any]
) -> list[dict[str, Any]]:
    """:func:`build_prompt` for an agent with these ``promptCapabilities``."""
    prompt = body.get("prompt")
    blocks: list[dict[str, Any]]
    if isinstance(prompt, str):
        blocks = [{"type": "text", "text": prompt}]
    elif isinstance(prompt, list) and all(isinstance(b, dict) for b in prompt):
        blocks = [dict(b) for b in prompt]
    else:
        raise bad_request("'prompt' must be a string or a list of content blocks")
    needs = {"image": "image", "audio": "audio", "resource": "embeddedContext"}
    for block in blocks:
        kind = block.get("type")
        if kind not in _PROMPT_TYPES:
            raise bad_request(f"unknown content block type {kind!r}")
        if kind == "text" and not isinstance(block.get("text"), str):
            raise bad_request("a text block's 'text' must be a string", param="prompt")
        if kind in needs and not caps.get(needs[kind]):
            raise bad_request(
                f"this agent does not accept {kind} blocks (promptCapabilities.{needs[kind]} is off)"
            )
    cap = rule.limits.max_prompt_bytes or defaults.MIB
    files = body.get("files") or []
    if not isinstance(files, list):
        raise bad_request("'files' must be a list of paths")
    if not files and all(
        b.get("type") == "text"
        and not (isinstance(b.get("text"), str) and b["text"].strip())
        for b in blocks
    ):
        # An agent would spend a model call on nothing (or fail on it).
        raise bad_request("the prompt is empty", param="prompt")
    guard = PathGuard(rule)
    for path in files:
        if caps.get("embeddedContext"):
            # Read through the guard's descriptors (a link swapped in by the
            # agent meanwhile cannot point the read outside the boundary).
            with guard.open_file(path, "read") as opened:
                data = os.read(opened.fd, cap + 1)
                uri = "file://" + opened.path
            blocks.append(
                {
                    "type": "resource",
                    "resource": {
                        "uri": uri,
                        "text": data.decode("utf-8", "replace"),
                        "mimeType": "text/plain",
                    },
                }
            )
        else:
            real = guard.check(path, "read")
            uri = "file://" + real
            if not os.path.exists(real):
                raise not_found(f"no such file: {path}", "FileNotFoundError")
            blocks.append(
                {"type": "resource_link", "uri": uri, "name": os.path.basename(real)}
            )
    size = len(json.dumps(blocks))
    if size > cap:
        raise payload_too_large(
            cap,
            message=f"the prompt is {size} bytes; the limit is {cap}",
            rule=limit_rule(rule, "max_prompt_bytes"),
        )
    return blocks
