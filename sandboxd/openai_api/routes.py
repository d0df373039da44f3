# -*- test-case-name: tests.openai_api.test_sessions -*-
"""
Handlers of the ``/v1`` door's sessions, events, turns, items, models and
the routes a local daemon refuses (SPEC §26).

Each handler parses OpenAI's request, hands the work to the ACP engine
(:class:`~sandboxd.agents.manager.AgentManager` and the session's
collaborators) through the session's face, and answers OpenAI's object.
The responses routes are in :mod:`.responses`.
"""

from __future__ import annotations

from typing import Any

import attrs

from sandboxd.agents import catalog
from sandboxd.agents.manager import agent_environment, build_prompt
from sandboxd.agents.session import within
from sandboxd.api.schema import schema_for
from sandboxd.errors import (
    ApiError,
    Code,
    agent_unavailable,
    bad_request,
    not_found,
    not_implemented_locally,
)
from sandboxd.openai_api import (
    artifacts,
    definitions,
    environments,
    runtimes,
    tools,
    vaults,
)
from sandboxd.openai_api.face import IdempotencyBook, SessionFace, WireTurn
from sandboxd.openai_api.inputs import (
    known_keys,
    message_text,
    metadata,
    reasoning_effort,
    refuse_multi_agent,
)
from sandboxd.openai_api.registry import (
    door,
    face_of,
    manager,
    matches,
    metadata_filter,
    owner_of,
    page,
    restored_first,
)
from sandboxd.openai_api.stream import follow, resume_after
from sandboxd.policy import defaults
from sandboxd.web.messages import ServerRequest, ServerResponse, SSEResponse
from sandboxd.web.params import declared_types, flag

#: What ``POST /v1/agents/sessions`` takes.
_SESSION_KEYS = (
    "agent",
    "agent_id",
    "adapter",
    "runtime",
    "environment",
    "input",
    "metadata",
    "vault_ids",
    "stream",
    "stream_options",
    "review",
    "spend_control",
    "prompt_cache_options",
)
#: What an inline ``agent`` takes (the rest of OpenAI's is refused).
_AGENT_KEYS = (
    "model",
    "name",
    "instructions",
    "adapter",
    "runtime",
    "reasoning",
    "service_tier",
    "text",
    "tools",
    "multi_agent",
)

#: Input event types and their short aliases.
_MESSAGE = "agent.session.input.message"
_CANCEL = "agent.session.input.cancel"
_APPROVAL = "agent.session.input.mcp_approval_request_result"
_ALIASES = {"input.message": _MESSAGE, "input.cancel": _CANCEL}
#: An approval's decision as the engine's permission reply.
_DECISIONS: dict[str, dict[str, Any]] = {
    "approve": {"decision": "allow_once"},
    "deny": {"decision": "reject_once"},
    "cancel": {"cancel": True},
}


def accepted() -> ServerResponse:
    """202 with an empty body (what OpenAI's events create answers)."""
    return ServerResponse(
        status=202, raw=b"", headers={"content-type": "application/json"}
    )


# -- creating a session ------------------------------------------------------


def _agent_spec(request: ServerRequest, body: dict[str, Any]) -> dict[str, Any]:
    """
    The agent checked: which catalogue agent runs (``runtime``, chosen as
    :func:`.runtimes.select` says), and how the session shows it — a stored
    definition (``agent_id``), with the inline ``agent``'s fields over it,
    or the inline ``agent`` alone.
    """
    agent = body.get("agent")
    if agent is not None and not isinstance(agent, dict):
        raise bad_request("'agent' must be an object", param="agent")
    agent = agent or {}
    spec: dict[str, Any] = {}
    if body.get("agent_id") is not None:
        spec = definitions.session_agent(
            definitions.find(request, str(body["agent_id"]))
        )
    for key in agent:
        if key not in _AGENT_KEYS:
            raise bad_request(
                f"agent.{key}: unknown or unsupported parameter", param=f"agent.{key}"
            )
    if "tools" in agent:
        spec["tools"] = tools.parse_tools(agent["tools"], "agent.tools")
    refuse_multi_agent(agent.get("multi_agent"), "agent.multi_agent")
    model = agent.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise bad_request("agent.model must be a string", param="agent.model")
    if "runtime" not in spec or model is not None or _names_agent(request, body):
        # A definition's agent is the default of an inline model over it.
        wanted = model if model is not None else spec.get("model")
        runtime, passed = runtimes.select(
            request, body, agent, wanted, default=spec.get("runtime")
        )
        spec.update(runtime=runtime, model=wanted or runtime, pass_model=passed)
        spec.setdefault("id", runtime)
    for key in ("name", "instructions"):
        if key in agent:
            value = agent[key]
            if value is not None and not isinstance(value, str):
                raise bad_request(f"agent.{key} must be a string", param=f"agent.{key}")
            spec[key] = value
    if "reasoning" in agent:
        spec["reasoning_effort"] = reasoning_effort(
            agent["reasoning"], "agent.reasoning"
        )
    spec.setdefault("name", None)
    spec.setdefault("instructions", None)
    spec.setdefault("tools", [])
    return spec


def _names_agent(request: ServerRequest, body: dict[str, Any]) -> bool:
    """Whether the request names the agent that runs (header, adapter, runtime)."""
    agent = body.get("agent") or {}
    return bool(request.headers.get(runtimes.ADAPTER_HEADER)) or any(
        source.get(key) is not None
        for source in (body, agent)
        for key in ("adapter", "runtime")
    )


def _environment(
    request: ServerRequest, body: dict[str, Any]
) -> tuple[dict[str, Any], str | None, dict[str, str]]:
    """
    The wire ``environment``, the working directory it names and its
    variables: a stored environment's (``environment.id``), or inline.
    """
    env = body.get("environment")
    if env is None:
        env = {"type": "self_hosted"}
    if not isinstance(env, dict):
        raise bad_request("'environment' must be an object", param="environment")
    kind = env.get("type", "self_hosted")
    if kind not in ("self_hosted", "none"):
        raise bad_request(
            f"environment.type {kind!r} is a hosted environment; use self_hosted",
            param="environment.type",
        )
    cwd = env.get("workspace_directory")
    if cwd is not None and not isinstance(cwd, str):
        raise bad_request(
            "environment.workspace_directory must be a path",
            param="environment.workspace_directory",
        )
    variables: dict[str, str] = {}
    env_id = "env_local"
    if env.get("id") is not None:
        record = environments.find(request, str(env["id"]), "environment.id")
        if cwd and cwd != record["workspace_directory"]:
            raise bad_request(
                "environment.workspace_directory differs from the environment's",
                param="environment.workspace_directory",
            )
        cwd, variables, env_id = (
            record["workspace_directory"],
            dict(record["env"]),
            record["id"],
        )
    return (
        {
            "type": "self_hosted",
            "id": env_id,
            "capability_directories": [],
            "remote_url": "",
            "workspace_directory": cwd or "",
        },
        cwd,
        variables,
    )


def _check_unsupported(body: dict[str, Any]) -> None:
    if body.get("review") not in (None, "none"):
        raise bad_request(
            "review: automatic action review is not supported", param="review"
        )
    for key in ("spend_control", "prompt_cache_options"):
        if body.get(key) is not None:
            raise bad_request(f"{key}: not supported by a local agent", param=key)


async def open_session(
    request: ServerRequest,
    agent: dict[str, Any],
    cwd: str | None,
    environment: dict[str, Any],
    meta: dict[str, str],
    hidden: bool = False,
    variables: dict[str, str] | None = None,
    vault_ids: list[str] | None = None,
) -> SessionFace:
    """
    Start an engine session for ``agent`` and put a face on it.

    The agent's MCP tools, with the credentials of ``vault_ids`` bound to
    them, go to the agent in its ``session/new`` (:func:`.tools.bind`);
    the secrets handed over are masked in everything the session shows.
    """
    engine_body: dict[str, Any] = {"agent": agent["runtime"]}
    if agent.get("pass_model"):
        engine_body["model"] = agent["pass_model"]
    if agent.get("reasoning_effort"):
        engine_body["thought_level"] = agent["reasoning_effort"]
    if cwd:
        engine_body["cwd"] = cwd
    if variables:
        engine_body["env"] = variables
    if agent.get("name"):
        engine_body["title"] = agent["name"]
    servers, credential_ids, secrets = tools.bind(
        request, agent.get("tools") or [], vault_ids or []
    )
    if servers:
        engine_body["mcp_servers"] = servers
    mgr = manager(request)
    created = await mgr.create(
        attrs.evolve(request, body=engine_body), handed=tuple(secrets)
    )
    engine = mgr.sessions[created["session_id"]]
    if not environment.get("workspace_directory"):
        environment = {**environment, "workspace_directory": engine.cwd}
    face = SessionFace(engine, owner_of(request), agent, environment, meta, hidden)
    face.redactor.add(secrets)
    face.vault_ids = list(vault_ids or [])
    face.credential_ids = credential_ids
    face.tools = tools.describe_tools(agent.get("tools") or [])
    if not hidden:
        artifacts.attach(face)  # a response's session has no artifacts route
    door(request).add(face)
    return face


async def wake(request: ServerRequest, face: SessionFace) -> None:
    """
    New input for ``face``: an agent that is failing (killed for a turn it
    would not end, crashed) is let go first (a moment); a dormant one is
    started again (:func:`revive`).
    """
    if face.falling:
        await within(
            request.context.reactor,
            face.fallen.wait(),
            defaults.KILL_GRACE_SECONDS + 1,
        )
    if face.dormant:
        await revive(request, face)


async def revive(request: ServerRequest, face: SessionFace) -> None:
    """
    New input for a dormant session (restored after a restart, or whose
    idle agent gave its slot up to another): its agent starts again in the
    same directory, resuming the agent's own session
    (``session/load``) when the agent can, else as a fresh one, with its
    stored environment's variables and its MCP tools bound to its vaults'
    credentials again (their secrets masked in its output, as before).
    """
    if face.reviving:
        raise agent_unavailable("the session's agent is starting again; retry")
    face.reviving = True
    try:
        mgr = manager(request)
        engine_body: dict[str, Any] = {
            "agent": face.agent["runtime"],
            "cwd": face.engine.cwd,
        }
        if face.agent.get("pass_model"):
            engine_body["model"] = face.agent["pass_model"]
        if face.agent.get("reasoning_effort"):
            engine_body["thought_level"] = face.agent["reasoning_effort"]
        if face.agent.get("name"):
            engine_body["title"] = face.agent["name"]
        kept_env = door(request).environments.get(face.environment.get("id") or "")
        if kept_env is not None and kept_env["owner"] == face.owner and kept_env["env"]:
            engine_body["env"] = dict(kept_env["env"])
        servers, _, secrets = tools.bind(
            request, face.agent.get("tools") or [], face.vault_ids
        )
        if servers:
            engine_body["mcp_servers"] = servers
        started = attrs.evolve(request, body=engine_body)
        created = None
        acp_session_id = face.engine.acp_session_id
        if acp_session_id:
            try:
                created = await mgr.create(
                    started,
                    load={"acp_session_id": acp_session_id, "replay": True},
                    handed=tuple(secrets),
                )
            except ApiError as e:
                if e.code == Code.TOO_MANY_SESSIONS:
                    raise
        if created is None:
            created = await mgr.create(started, handed=tuple(secrets))
        face.revive(mgr.sessions[created["session_id"]])
        face.redactor.add(secrets)
        door(request).revived(face)
    finally:
        face.reviving = False


def submit_text(request: ServerRequest, face: SessionFace, text: str) -> WireTurn:
    """One turn for ``text``, checked as the engine checks a prompt."""
    face.require_live()
    if not text.strip():
        raise bad_request("the input is empty", param="input")
    tools.check_bound(request, face.credential_ids)
    blocks = build_prompt(face.engine, {"prompt": text}, request.rule)
    queued = request.rule.limits.max_queued
    if queued is None:
        return face.submit(text, blocks)
    return face.submit(text, blocks, queued)


async def agents_sessions_create(request: ServerRequest) -> Any:
    """Create a session: an ACP agent started, with its first input if given."""
    body = request.body
    book = door(request).book(owner_of(request), "sessions")
    key = request.headers.get("idempotency-key")
    known = await book.claim(key, body)
    if known is not None:
        return door(request).face(request, known).describe()
    try:
        return await _create_session(request, book, key)
    finally:
        book.release(key)


async def _create_session(
    request: ServerRequest, book: IdempotencyBook, key: str | None
) -> Any:
    """:func:`agents_sessions_create` once its ``Idempotency-Key`` is claimed."""
    body = request.body
    known_keys(body, _SESSION_KEYS)
    declared_types(body, schema_for("agents_sessions_create").body, name_param=True)
    agent = _agent_spec(request, body)
    environment, cwd, variables = _environment(request, body)
    meta = metadata(body.get("metadata"))
    _check_unsupported(body)
    attached = vaults.vault_ids(request, body.get("vault_ids"), "vault_ids")
    text = None
    if body.get("input") is not None:
        text = message_text(body["input"], "input")
    stream = body.get("stream") is True
    # The agent must be one the caller may run before anything starts.
    catalog.find(request.context, request.rule, agent["runtime"])
    if environment["id"] != "env_local":
        record = environments.find(request, environment["id"], "environment.id")
        attached = list(dict.fromkeys([*attached, *record.get("vault_ids", [])]))
    face = await open_session(
        request, agent, cwd, environment, meta, variables=variables, vault_ids=attached
    )
    if text:
        try:
            submit_text(request, face, text)
        except Exception:
            await face.engine.close(reason="input_refused")
            door(request).faces.pop(face.id, None)
            raise
    book.store(key, body, face.id)
    if stream:
        return SSEResponse(start=follow(face, 0))
    return face.describe()


# -- reading and changing sessions --------------------------------------------


def agents_sessions_list(request: ServerRequest) -> dict[str, Any]:
    """
    The caller's sessions (responses' own are not listed), filtered by
    ``agent_id`` and ``metadata[KEY]=VALUE``.
    """
    agent_id = request.query.get("agent_id")
    wanted = metadata_filter(request)
    faces = [
        f.describe()
        for f in door(request).faces.values()
        if f.owner == owner_of(request)
        and not f.hidden
        and (agent_id is None or f.agent["id"] == agent_id)
        and matches(f.metadata, wanted)
    ]
    return page(request, faces)


def agents_sessions_get(request: ServerRequest) -> dict[str, Any]:
    """One session."""
    return face_of(request).describe()


def agents_sessions_update(request: ServerRequest) -> dict[str, Any]:
    """Only ``metadata`` changes after a session is created."""
    face = face_of(request)
    for key in request.body:
        if key in ("agent", "vault_ids", "environment"):
            raise bad_request(
                f"{key}: cannot change after the session is created", param=key
            )
        if key != "metadata":
            raise bad_request(f"{key}: unknown or unsupported parameter", param=key)
    if "metadata" in request.body:
        face.metadata = metadata(request.body["metadata"])
        door(request).changed(face)
    return face.describe()


async def agents_sessions_delete(request: ServerRequest) -> dict[str, Any]:
    """Close the agent (its turn cancelled, its tree ended) and forget the session."""
    face = face_of(request)
    await face.engine.close()
    door(request).forget(face.id)
    return {"id": face.id, "object": "agent.session.deleted", "deleted": True}


# -- events --------------------------------------------------------------------


def _input_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    events = body.get("events")
    if events is None and "input" in body:
        events = [{"type": _MESSAGE, "input": body["input"]}]
    for key in body:
        if key not in ("events", "input"):
            raise bad_request(f"{key}: unknown or unsupported parameter", param=key)
    if not isinstance(events, list) or not events:
        raise bad_request("'events' must be a non-empty list", param="events")
    if not all(isinstance(e, dict) for e in events):
        raise bad_request("each event must be an object", param="events")
    return events


async def agents_sessions_events_create(request: ServerRequest) -> ServerResponse:
    """
    Input for a session: messages become one turn (queued behind a running
    one), a cancel cancels the running turn, an approval result answers
    the agent's held permission request.  A message to a session restored
    after a restart starts its agent again.
    """
    face = face_of(request)
    body = request.body
    key = request.headers.get("idempotency-key")
    if face.idempotency.lookup(key, body) is not None:
        return accepted()
    texts: list[str] = []
    cancel = False
    approvals: list[tuple[str, dict[str, Any]]] = []
    for i, event in enumerate(_input_events(body)):
        kind = _ALIASES.get(str(event.get("type")), event.get("type"))
        where = f"events[{i}]"
        if kind == _MESSAGE:
            value = next(
                (event[k] for k in ("input", "content", "text") if k in event), None
            )
            texts.append(message_text(value, where + ".input"))
        elif kind == _CANCEL:
            cancel = True
        elif kind == _APPROVAL:
            approvals.append(_approval(event, where))
        else:
            raise bad_request(
                f"{where}.type {kind!r} is not supported here (tool results and "
                "computer-use approvals have no local counterpart)",
                param=where + ".type",
            )
    text = "\n".join(t for t in texts if t)
    if not text and not cancel and not approvals:
        raise bad_request("the input is empty", param="events")
    for request_id, reply in approvals:
        held = face.engine.pending.get(request_id) or manager(request).requests.get(
            request_id
        )
        if held is None or held.session_id != face.engine.session_id:
            raise not_found(
                f"No pending request with id {request_id!r}", param="request_id"
            )
        face.engine.held.reply(held, reply, request.identity.id, request.rule)
    if cancel:
        face.cancel()
    if text:
        await wake(request, face)
        submit_text(request, face, text)
    face.idempotency.store(key, body, True)
    return accepted()


def _approval(event: dict[str, Any], where: str) -> tuple[str, dict[str, Any]]:
    request_id = event.get("request_id")
    response = event.get("response")
    if not isinstance(request_id, str) or not request_id:
        raise bad_request(
            f"{where}.request_id is required", param=where + ".request_id"
        )
    decision = response.get("decision") if isinstance(response, dict) else None
    if decision not in _DECISIONS:
        raise bad_request(
            f"{where}.response.decision must be approve, deny or cancel",
            param=where + ".response.decision",
        )
    return request_id, dict(_DECISIONS[decision])


def agents_sessions_events_stream(request: ServerRequest) -> SSEResponse:
    """The session's events, live, resumable."""
    # Taken for the SDK's sake and ignored, but only as a boolean.
    flag(request.query.get("include_obfuscation"), "include_obfuscation")
    face = face_of(request)
    after = resume_after(face, request.query, request.headers)
    return SSEResponse(start=follow(face, after))


# -- turns and items -----------------------------------------------------------


def _turn(request: ServerRequest, face: SessionFace) -> WireTurn:
    turn = face.turns.get(request.path_params["turn_id"])
    if turn is None:
        raise not_found(
            f"No turn found with id {request.path_params['turn_id']!r}", param="turn_id"
        )
    return turn


def agents_sessions_items_list(request: ServerRequest) -> dict[str, Any]:
    """Every item of the session's kept turns."""
    face = face_of(request)
    return page(request, [_shown(i) for i in face.items()])


def agents_sessions_turns_list(request: ServerRequest) -> dict[str, Any]:
    """The session's turns."""
    face = face_of(request)
    return page(request, [t.describe() for t in face.turns.values()])


def agents_sessions_turns_get(request: ServerRequest) -> dict[str, Any]:
    """One turn."""
    face = face_of(request)
    return _turn(request, face).describe()


def agents_sessions_turns_items_list(request: ServerRequest) -> dict[str, Any]:
    """One turn's items."""
    face = face_of(request)
    turn = _turn(request, face)
    return page(request, [_shown(i) for i in turn.items])


def _shown(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if not k.startswith("_")}


# -- models --------------------------------------------------------------------


def _models(request: ServerRequest) -> list[dict[str, Any]]:
    created = int(request.context.started_at)
    agents = [
        e for e in catalog.entries(request.context) if catalog.allowed(e, request.rule)
    ]
    installed = {e.id: _installed(request, e) for e in agents}

    def local(kind: str, runtime: str) -> dict[str, Any]:
        # As agent-sandbox-server labels its models: whether a response
        # naming it can start its agent here.
        return {
            "local": True,
            "compute": "none",
            "differences": [],
            "kind": kind,
            "installed": installed.get(runtime, False),
        }

    stored = [
        {
            "id": record["id"],
            "object": "model",
            "created": record["created_at"],
            "owned_by": owner_of(request),
            "x_agent_sandbox": local(
                "agent_definition", record.get("runtime") or record["model"]
            ),
        }
        for record in door(request).definitions.values()
        if record["owner"] == owner_of(request)
    ]
    return stored + [
        {
            "id": entry.id,
            "object": "model",
            "created": created,
            "owned_by": "sandboxd",
            "x_agent_sandbox": local("adapter", entry.id),
        }
        for entry in agents
    ]


def _installed(request: ServerRequest, entry: catalog.CatalogEntry) -> bool:
    """Whether ``entry``'s program is on the PATH its agent would start with."""
    env = agent_environment(request.context, request.rule, entry, {})
    return entry.found(env) is not None


def agents_models_list(request: ServerRequest) -> dict[str, Any]:
    """The agents of the catalogue this caller may run, as models."""
    return {"object": "list", "data": _models(request)}


def agents_models_get(request: ServerRequest) -> dict[str, Any]:
    """One of them, or 404."""
    wanted = request.path_params["model"]
    for model in _models(request):
        if model["id"] == wanted:
            return model
    raise not_found(f"The model {wanted!r} does not exist", param="model")


# -- what a local daemon refuses -------------------------------------------------


def _refused(message: str) -> ApiError:
    """
    404 ``agents.not_implemented_locally``, labelled as agent-sandbox-server
    labels it: nothing runs for it, and where the local runtimes are listed.
    """
    error = not_implemented_locally(message)
    error.extra["x_agent_sandbox"] = {
        "local": True,
        "compute": "none",
        "differences": ["not_implemented_locally"],
        "runtimes": "/v1/agents/runtimes",
    }
    return error


def agents_cannot_models_delete(request: ServerRequest) -> Any:
    """No fine-tuned models here."""
    raise _refused(
        "models cannot be deleted here: the models are the agents of the policy's catalogue"
    )


def agents_cannot_responses_input_tokens(request: ServerRequest) -> Any:
    """No local tokenizer matches the agent's model."""
    raise _refused(
        "input tokens cannot be counted locally: the agent's model and its tokenizer are its own"
    )


def agents_cannot_executor_registration(request: ServerRequest) -> Any:
    """Executors register with OpenAI's hosted service."""
    raise _refused(
        "executor registration is part of OpenAI's hosted service; agents run here already"
    )


def agents_cannot_executor_channel(request: ServerRequest) -> Any:
    """The executor channel's peer is the hosted harness."""
    raise _refused(
        "the executor channel connects to OpenAI's hosted harness; agents run here already"
    )


HANDLERS: dict[str, Any] = {
    "agents_sessions_create": agents_sessions_create,
    "agents_sessions_list": agents_sessions_list,
    "agents_sessions_get": agents_sessions_get,
    "agents_sessions_update": agents_sessions_update,
    "agents_sessions_delete": agents_sessions_delete,
    "agents_sessions_events_create": agents_sessions_events_create,
    "agents_sessions_events_stream": agents_sessions_events_stream,
    "agents_sessions_items_list": agents_sessions_items_list,
    "agents_sessions_turns_list": agents_sessions_turns_list,
    "agents_sessions_turns_get": agents_sessions_turns_get,
    "agents_sessions_turns_items_list": agents_sessions_turns_items_list,
    "agents_models_list": agents_models_list,
    "agents_models_get": agents_models_get,
    "agents_cannot_models_delete": agents_cannot_models_delete,
    "agents_cannot_responses_input_tokens": agents_cannot_responses_input_tokens,
    "agents_cannot_executor_registration": agents_cannot_executor_registration,
    "agents_cannot_executor_channel": agents_cannot_executor_channel,
}
HANDLERS = restored_first(HANDLERS)
