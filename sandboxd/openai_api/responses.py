# -*- test-case-name: tests.openai_api.test_responses -*-
"""
The Responses routes of the ``/v1`` door: one response is one turn of a
session the caller does not see (one per conversation; a
``previous_response_id`` continues the same agent session).

A streamed response is translated from the session's projected events as
the turn runs (each agent message chunk is an ``output_text.delta`` the
moment the agent sends it), not replayed after the turn as the seed does.

With a state dir a stored response outlives the daemon: its record is kept
in its conversation's session file (:mod:`.store`), so it is read back
with the turns it shows.  After a restart its owner retrieves it, lists
its input items and continues it with ``previous_response_id`` (the
conversation's agent starts again); a response whose turn the restart cut
is ``failed``.  A conversation whose idle agent gave its slot up to a new
agent at ``max_sessions`` (:meth:`.Registry.make_room`) is continued the
same way, with or without a state dir.  Each identity keeps at most
:data:`~sandboxd.policy.defaults.OPENAI_RESPONSES_PER_IDENTITY` responses
(the oldest that have ended are forgotten, never a running one); a
conversation's file is bounded as every session's.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from twisted.internet.defer import Deferred

from sandboxd.agents import catalog
from sandboxd.api.schema import schema_for
from sandboxd.errors import ApiError, Code, bad_request, limit_exceeded, not_found
from sandboxd.eventlog import Event, json_size
from sandboxd.openai_api import definitions, runtimes
from sandboxd.openai_api.envelope import stream_error
from sandboxd.openai_api.face import (
    NATIVE_TOOL_PREFIX,
    IdempotencyBook,
    SessionFace,
    WireTurn,
    new_id,
)
from sandboxd.openai_api.inputs import (
    known_keys,
    message_text,
    metadata,
    reasoning_effort,
)
from sandboxd.openai_api.registry import (
    Registry,
    door,
    owner_of,
    page,
    restored_first,
)
from sandboxd.openai_api.routes import open_session, submit_text, wake
from sandboxd.policy import defaults
from sandboxd.waiters import Waiters
from sandboxd.web.messages import ServerRequest, ServerResponse, SSEResponse
from sandboxd.web.params import declared_types, flag
from sandboxd.web.sse import Follower, SSEChannel, frame

log = logging.getLogger(__name__)

#: Keys ``POST /v1/responses`` honours.
_KEYS = (
    "model",
    "input",
    "instructions",
    "metadata",
    "previous_response_id",
    "store",
    "background",
    "stream",
    "tool_choice",
    "tools",
    "include",
    "conversation",
    "prompt",
    "reasoning",
    "text",
    "service_tier",
    "adapter",
    "runtime",
)
#: Keys accepted and ignored, named back in a header (as the seed does).
_IGNORED = (
    "temperature",
    "top_p",
    "max_output_tokens",
    "top_logprobs",
    "truncation",
    "parallel_tool_calls",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "stream_options",
)
_IGNORED_HEADER = "x-agent-sandbox-ignored-params"

#: A turn's status as a response's.
_STATUS = {
    "queued": "queued",
    "in_progress": "in_progress",
    "waiting": "in_progress",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}


class WireResponse:
    """One response: its turn on a hidden session, and what was asked."""

    def __init__(
        self,
        owner: str,
        face: SessionFace,
        turn: WireTurn,
        body: dict[str, Any],
        instructions: str | None,
        inputs: list[dict[str, Any]],
        log_from: int,
        items_from: int = 0,
        model: str | None = None,
    ) -> None:
        self.id = new_id("resp_")
        self.owner = owner
        self.face = face
        self.turn = turn
        #: What the conversation's first response asked for: its agent
        #: answers the ones that continue it, whatever model they name.
        self.model = model or str(body["model"])
        self.instructions = instructions
        self.metadata = metadata(body.get("metadata"))
        self.previous_response_id = body.get("previous_response_id")
        self.store = body.get("store") is not False
        self.background = body.get("background") is True
        self.input_items = inputs
        #: What the response costs its owner's bound (its input's bytes).
        self.weight = json_size(inputs)
        self.log_from = log_from
        self.created_at = int(time.time())
        #: This response's part of its turn's items (a response that goes
        #: on after an approval starts where the one that asked stopped).
        self.items_from = items_from
        self.items_until: int | None = None
        #: The approval requests this response ended with (it then shows
        #: them as ``mcp_approval_request`` items and is ``completed``).
        self.approvals: list[dict[str, Any]] = []
        self.paused_at: int | None = None
        #: Fired when the response has its answer: its turn ended, or it
        #: asks for approvals.
        self.settled: Waiters[None] = Waiters()
        self._unsubscribe = face.log.subscribe(self._on_event)
        turn.waiters.wait().addCallback(self._ended)
        #: The response's stream as it is sent live, numbered and sent
        #: nowhere: its numbers stay known when the log drops its events
        #: (a stream rebuilt from the response ends on the live number).
        self.numbering: ResponseStream | None = ResponseStream(
            self, cast(SSEChannel, _Nowhere()), _UNSENT
        )

    #: What a response's record keeps (its face and turn are kept by id).
    _KEPT = (
        "id",
        "owner",
        "model",
        "instructions",
        "metadata",
        "previous_response_id",
        "store",
        "background",
        "input_items",
        "log_from",
        "created_at",
        "items_from",
        "items_until",
        "approvals",
        "paused_at",
    )

    def record(self) -> dict[str, Any]:
        """What is kept of the response in its conversation's file."""
        kept = {key: getattr(self, key) for key in self._KEPT}
        kept["turn_id"] = self.turn.id
        return kept

    @classmethod
    def restored(cls, record: dict[str, Any], face: SessionFace) -> WireResponse:
        """
        A response read back after a restart, on its restored conversation:
        its turn has ended (or was failed by the restart), so it is settled.
        """
        response = cls.__new__(cls)
        for key in cls._KEPT:
            setattr(response, key, record[key])
        response.face = face
        response.turn = face.turns[record["turn_id"]]
        response.weight = json_size(response.input_items)
        response.settled = Waiters()
        response._unsubscribe = lambda: None
        response.numbering = None
        if response.paused_at is not None and response.turn.status == "failed":
            # It asked for approvals the restart took away: it shows its end.
            response.approvals, response.paused_at, response.items_until = (
                [],
                None,
                None,
            )
        return response

    @property
    def done(self) -> bool:
        """Whether the response has its answer."""
        return self.paused_at is not None or self.turn.ended

    def _on_event(self, event: Event | None) -> None:
        if event is None or event.event != "agent.session.requires_action":
            return
        asked = [
            a
            for a in self.face.required.values()
            if a["turn_id"] == self.turn.id
            and a["request_id"] not in {x["request_id"] for x in self.approvals}
        ]
        if asked and not self.done:
            self._pause(asked)

    def _pause(self, asked: list[dict[str, Any]]) -> None:
        """
        The agent waits for approvals: this response ends with them, as
        OpenAI's does; the turn goes on in the response that answers them.
        """
        self.approvals = asked
        self.paused_at = int(time.time())
        items = self.turn.items
        waiting = [
            i
            for i, item in enumerate(items)
            if i >= self.items_from
            and item["type"] in ("mcp_call", "command_execution")
            and item["status"] == "in_progress"
        ]
        # The tool call that asks is shown as the approval request here, and
        # as the call it became in the response that answers.
        self.items_until = waiting[0] if waiting else len(items)
        self._unsubscribe()
        self.settled.fire(None)

    def _ended(self, _: Any) -> None:
        self._unsubscribe()
        self.settled.fire(None)

    def own_items(self) -> list[dict[str, Any]]:
        """The turn's items this response shows."""
        return self.turn.items[self.items_from : self.items_until]

    def describe(self) -> dict[str, Any]:
        """The ``response`` object."""
        turn = self.turn
        status = _STATUS[turn.status]
        completed_at = turn.completed_at
        output = [output_item(i) for i in self.own_items()]
        usage = wire_usage(turn.usage)
        if self.paused_at is not None:
            status, completed_at, usage = "completed", self.paused_at, None
            output += [approval_item(a) for a in self.approvals]
        error = None
        if turn.error is not None and self.paused_at is None:
            error = {"code": "server_error", "message": turn.error.get("message") or ""}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": completed_at,
            "status": status,
            "background": self.background,
            "error": error,
            "incomplete_details": None,
            "instructions": self.instructions,
            "metadata": self.metadata,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": False,
            "previous_response_id": self.previous_response_id,
            "service_tier": None,
            "store": self.store,
            "temperature": None,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": None,
            "usage": usage,
        }


def approval_item(action: dict[str, Any]) -> dict[str, Any]:
    """A held permission request as OpenAI's ``mcp_approval_request`` item."""
    request = action["request"]
    return {
        "id": action["request_id"],
        "type": "mcp_approval_request",
        "server_label": request["server_label"],
        "name": request["name"],
        "arguments": json.dumps(request["arguments"]),
    }


def wire_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """
    A turn's token usage as the Responses API reports it: OpenAI's usage
    object carries ``cache_write_tokens``, which no local agent counts.
    """
    if usage is None:
        return None
    return {
        **usage,
        "input_tokens_details": {
            **usage["input_tokens_details"],
            "cache_write_tokens": 0,
        },
    }


def output_item(item: dict[str, Any]) -> dict[str, Any]:
    """A session item as a Responses output item."""
    kind = item["type"]
    if kind == "message":
        return {
            "id": item["id"],
            "type": "message",
            "role": "assistant",
            "status": item["status"],
            "content": [
                {"type": "output_text", "text": c["text"], "annotations": []}
                for c in item["content"]
            ],
        }
    if kind == "reasoning":
        return {
            "id": item["id"],
            "type": "reasoning",
            "status": item["status"],
            "summary": [dict(s) for s in item["summary"]],
        }
    status = (
        item["status"] if item["status"] in ("completed", "in_progress") else "failed"
    )
    if kind == "command_execution":
        # agent-sandbox-server's own output type (OpenAI's API has none for
        # a command an agent ran); the SDK parses it loosely.
        return {
            "id": item["id"],
            "type": "command_execution",
            "status": status,
            "command": item["command"],
            "cwd": item.get("cwd"),
            "output": item.get("output"),
            "exit_code": item["exit_code"],
            "duration_ms": item.get("duration_ms"),
        }
    if item["id"].startswith(NATIVE_TOOL_PREFIX):
        # The agent's own tool (an edit, a read): agent-sandbox-server's
        # ``tool_call`` type, its arguments as the object they are.
        native = {
            "id": item["id"],
            "type": "tool_call",
            "status": status,
            "tool_name": item["name"],
            "arguments": item["arguments"],
            "output": item.get("output"),
        }
        native["error"] = item.get("error")  # the call's field, not an error body
        return native
    call = {
        "id": item["id"],
        "type": "mcp_call",
        "server_label": item["server_label"],
        "name": item["name"],
        "arguments": json.dumps(item["arguments"]),
        "output": item.get("output"),
        "status": status,
    }
    call["error"] = item.get("error")  # the call's field, not an error body
    return call


# -- create ------------------------------------------------------------------


def _inputs(body: dict[str, Any]) -> tuple[str, list[str], list[dict[str, Any]]]:
    """The prompt, the extra instructions, and the stored input items."""
    value = body.get("input")
    users: list[str] = []
    systems: list[str] = []
    if isinstance(value, str):
        users.append(value)
    elif isinstance(value, list):
        for i, message in enumerate(value):
            where = f"input[{i}]"
            if not isinstance(message, dict):
                raise bad_request(f"{where} must be a message", param=where)
            if message.get("type") == "mcp_approval_response":
                continue
            role = message.get("role", "user")
            text = message_text(message, where)
            (systems if role in ("system", "developer") else users).append(text)
    elif value is not None:
        raise bad_request("input must be a string or a list of messages", param="input")
    items = [
        {
            "id": new_id("msg_"),
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_text", "text": text}],
        }
        for text in users
    ]
    return "\n\n".join(users), systems, items


def check_input(value: Any) -> None:
    """
    A steer's input, checked before it is accepted: a string or user
    messages, as OpenAI's steering takes (no approvals, no system text).

    :raises ApiError: 400 naming the item that is not a user message.
    """
    for i, item in enumerate(value if isinstance(value, list) else []):
        if (
            not isinstance(item, dict)
            or item.get("type", "message") != "message"
            or item.get("role", "user") != "user"
        ):
            raise bad_request(
                f"input[{i}]: a steer takes user messages only", param=f"input[{i}]"
            )
    _inputs({"input": value})


def _approvals(body: dict[str, Any]) -> list[tuple[str, bool]]:
    """The ``mcp_approval_response`` items of the input: (request id, approve)."""
    value = body.get("input")
    found = []
    for i, item in enumerate(value if isinstance(value, list) else []):
        if isinstance(item, dict) and item.get("type") == "mcp_approval_response":
            where = f"input[{i}]"
            request_id = item.get("approval_request_id")
            if not isinstance(request_id, str) or not request_id:
                raise bad_request(
                    f"{where}.approval_request_id is required",
                    param=where + ".approval_request_id",
                )
            if not isinstance(item.get("approve"), bool):
                raise bad_request(
                    f"{where}.approve must be true or false",
                    param=where + ".approve",
                )
            found.append((request_id, bool(item["approve"])))
    return found


def _check(body: dict[str, Any]) -> list[str]:
    """Refuse what cannot be honoured; the ignored keys, named."""
    ignored = [k for k in body if k in _IGNORED]
    known_keys(body, _KEYS + _IGNORED)
    declared_types(body, schema_for("agents_responses_create").body, name_param=True)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise bad_request(
            "'model' is required: an agent of the catalogue", param="model"
        )
    if body.get("tools"):
        raise bad_request(
            "tools: the agent's own tools run; none can be added", param="tools"
        )
    if body.get("tool_choice") not in (None, "auto"):
        raise bad_request("tool_choice: only auto", param="tool_choice")
    if body.get("include"):
        raise bad_request("include: not supported", param="include")
    for key in ("conversation", "prompt"):
        if body.get(key) is not None:
            raise bad_request(
                f"{key}: not supported; use previous_response_id", param=key
            )
    if body.get("background") is True and body.get("store") is False:
        raise bad_request("background responses must be stored", param="background")
    if body.get("service_tier") not in (None, "auto", "default"):
        raise bad_request("service_tier: only auto and default", param="service_tier")
    text = body.get("text") or {}
    form = text.get("format")
    if form is not None and not (isinstance(form, dict) and form.get("type") == "text"):
        # The agent answers in its own words: a schema it was asked to
        # follow would be a promise nothing here keeps.
        raise bad_request(
            "text.format: only text; an agent's answer follows no schema",
            param="text.format",
        )
    if text.get("verbosity") is not None:
        ignored.append("text.verbosity")
    return ignored


async def agents_responses_create(request: ServerRequest) -> Any:
    """One turn: answered when it ends, at once (background), or streamed live."""
    body = request.body
    reg = door(request)
    book = reg.book(owner_of(request), "responses")
    key = request.headers.get("idempotency-key")
    known = await book.claim(key, body)
    if known is not None:
        _materialize(reg)  # the first may be from before a restart
    if known is not None and known in reg.responses:
        return await _answer(request, reg.responses[known], body)
    try:
        return await _create(request, book, key)
    finally:
        book.release(key)


async def _create(
    request: ServerRequest, book: IdempotencyBook, key: str | None
) -> Any:
    """:func:`agents_responses_create` once its ``Idempotency-Key`` is claimed."""
    body = request.body
    reg = door(request)
    ignored = _check(body)
    text, systems, items = _inputs(body)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("instructions must be a string", param="instructions")
    preamble = "\n\n".join([s for s in [instructions, *systems] if s])
    previous = body.get("previous_response_id")
    approvals = _approvals(body)
    if not approvals and not text.strip():
        # System and developer messages instruct; without a user message
        # the agent would be handed its instructions and no task.
        raise bad_request(
            "input: no user message (system and developer messages only "
            "instruct the agent)",
            param="input",
        )
    if approvals and previous is None:
        raise bad_request(
            "mcp_approval_response answers a response: give its previous_response_id",
            param="previous_response_id",
        )
    if previous is not None:
        prior = owned_response(request, str(previous), "previous_response_id")
        face = prior.face
        if face.last_response_id != prior.id:
            raise bad_request(
                "previous_response_id must be the latest response of its conversation",
                param="previous_response_id",
            )
        if prior.approvals and not prior.turn.ended:
            return await _go_on(request, prior, body, approvals, text, items, key)
        if approvals:
            raise bad_request(
                "the previous response asks for no approval (or its turn has ended)",
                param="input",
            )
        if face.log.closed:
            raise bad_request(
                "this conversation's agent has ended (it failed, or is gone); "
                "start a new response",
                param="previous_response_id",
            )
        _room(request, json_size(items))
        # Read back after a restart, its agent gave its slot up to another,
        # or failed: its agent starts again.
        await wake(request, face)
        face.require_live()
    else:
        agent = _agent(request, body)
        _room(request, json_size(items))
        face = await open_session(
            request, agent, None, {"type": "self_hosted"}, {}, hidden=True
        )
        # A definition's instructions lead every response's prompt, below.
        face.instructions = None
    if face.agent.get("instructions"):
        preamble = "\n\n".join(filter(None, [face.agent["instructions"], preamble]))
    prompt = f"{preamble}\n\n---\n\n{text}" if preamble else text
    log_from = face.log.last_seq
    try:
        turn = submit_text(request, face, prompt)
    except Exception:
        if previous is None:
            await face.engine.close(reason="input_refused")
            reg.forget(face.id)
        raise
    response = WireResponse(
        owner_of(request),
        face,
        turn,
        body,
        instructions,
        items,
        log_from,
        model=prior.model if previous is not None else None,
    )
    face.last_response_id = response.id
    reg.responses[response.id] = response
    _bound(request)
    book.store(key, body, response.id)
    if not response.store:
        turn.waiters.wait().addCallback(lambda _: _release(request, response))
    answer = await _answer(request, response, body)
    if ignored and isinstance(answer, ServerResponse):
        answer.headers[_IGNORED_HEADER] = ",".join(ignored)
    return answer


async def _go_on(
    request: ServerRequest,
    prior: WireResponse,
    body: dict[str, Any],
    approvals: list[tuple[str, bool]],
    text: str,
    items: list[dict[str, Any]],
    key: str | None,
) -> Any:
    """
    Answer the approvals ``prior`` asked for: the agent's held requests
    are replied to, and a new response shows the rest of the same turn.
    """
    asked = {a["request_id"] for a in prior.approvals}
    if text.strip() or not approvals:
        raise bad_request(
            "the previous response waits for approvals: send only "
            "mcp_approval_response items for its mcp_approval_request items",
            param="input",
        )
    face = prior.face
    held = []
    for request_id, approve in approvals:
        found = face.engine.pending.get(request_id)
        if request_id not in asked or found is None:
            raise not_found(
                f"No pending approval request with id {request_id!r}",
                param="approval_request_id",
            )
        held.append((found, {"decision": "allow_once" if approve else "reject_once"}))
    inputs = [
        {
            "id": new_id("mcpr_"),
            "type": "mcp_approval_response",
            "approval_request_id": request_id,
            "approve": approve,
        }
        for request_id, approve in approvals
    ] + items
    reg = door(request)
    response = WireResponse(
        owner_of(request),
        face,
        prior.turn,
        body,
        body.get("instructions"),
        inputs,
        face.log.last_seq,
        items_from=prior.items_until or 0,
        model=prior.model,
    )
    face.last_response_id = response.id
    reg.responses[response.id] = response
    _bound(request)
    reg.book(owner_of(request), "responses").store(key, body, response.id)
    for found, reply in held:
        face.engine.held.reply(found, reply, request.identity.id, request.rule)
    return await _answer(request, response, body)


def _agent(request: ServerRequest, body: dict[str, Any]) -> dict[str, Any]:
    """
    A stored definition (``model: agent_…``) or a catalogue agent (chosen
    as :func:`.runtimes.select` says), as a session's agent.
    """
    model = str(body["model"])
    effort = reasoning_effort(body.get("reasoning"), "reasoning")
    if model.startswith("agent_"):
        agent = definitions.session_agent(
            definitions.find(request, model, param="model")
        )
        if effort is not None:
            agent["reasoning_effort"] = effort
        return agent
    runtime, passed = runtimes.select(request, body, model=model)
    catalog.find(request.context, request.rule, runtime)
    return {
        "id": runtime,
        "runtime": runtime,
        "model": model,
        "pass_model": passed,
        "name": None,
        "instructions": None,
        "reasoning_effort": effort,
    }


def _within(clock: Any, d: Deferred[Any], seconds: float) -> Deferred[Any]:
    """:func:`sandboxd.agents.session.within`, imported when an agent runs."""
    from sandboxd.agents.session import within

    return within(clock, d, seconds)


async def wait_for_turn(request: ServerRequest, waited: Deferred[Any]) -> None:
    """
    Wait for ``waited`` (a turn's end) as long as the caller's rule lets a
    turn run, plus the graces its cancel and kill take: past that, the turn
    is stuck and the caller is answered with what there is.
    """
    limit = request.rule.limits.max_turn_seconds or 1800
    await _within(
        request.context.reactor,
        waited,
        limit + defaults.AGENT_CANCEL_GRACE_SECONDS + defaults.KILL_GRACE_SECONDS,
    )


def _room(request: ServerRequest, weight: int) -> None:
    """
    Refuse a new response when the caller's bound
    (:data:`~sandboxd.policy.defaults.OPENAI_RESPONSES_PER_IDENTITY`
    responses, :data:`~sandboxd.policy.defaults.OPENAI_RESPONSES_BYTES_PER_IDENTITY`
    of input) is held by responses still queued or running: those are
    never forgotten (a poller would lose its job and the job its agent), so
    the caller waits for one to end, or cancels one.

    :param weight: the new response's input's bytes.
    :raises ApiError: 429 ``concurrency_limited`` with ``Retry-After``.
    """
    reg = door(request)
    _materialize(reg)
    running = [
        r
        for r in reg.responses.values()
        if r.owner == owner_of(request) and not r.turn.ended
    ]
    count = defaults.OPENAI_RESPONSES_PER_IDENTITY
    limit = defaults.OPENAI_RESPONSES_BYTES_PER_IDENTITY
    held = sum(r.weight for r in running)
    if len(running) < count and (not running or held + weight <= limit):
        return
    seconds = defaults.AGENT_SLOT_RETRY_SECONDS
    raise limit_exceeded(
        429,
        f"{len(running)} of your responses are queued or running, holding "
        f"{held} bytes of input; each identity keeps at most {count} responses "
        f"and {limit} bytes of their input, and one that has not ended is never "
        "forgotten: retry once one ends, or cancel one",
        Code.CONCURRENCY_LIMITED,
        limit=count,
        headers={"Retry-After": str(seconds)},
        retry_after=seconds,
    )


def _bound(request: ServerRequest) -> None:
    """
    At most :data:`~sandboxd.policy.defaults.OPENAI_RESPONSES_PER_IDENTITY`
    responses of the caller, whose input items weigh at most
    :data:`~sandboxd.policy.defaults.OPENAI_RESPONSES_BYTES_PER_IDENTITY`:
    the oldest that have ended are forgotten (with their kept record: the
    next write of their conversation leaves them out; a conversation left
    with none ends).  One still queued or running is never forgotten, so
    its turn is never cut by its owner's newer responses; :func:`_room`
    refused the new one when those alone fill the bound.
    """
    reg = door(request)
    _materialize(reg)
    mine = [r for r in reg.responses.values() if r.owner == owner_of(request)]
    newest = mine[-1] if mine else None
    weight = sum(r.weight for r in mine)
    count = len(mine)
    for gone in mine:
        if not (
            count > defaults.OPENAI_RESPONSES_PER_IDENTITY
            or weight > defaults.OPENAI_RESPONSES_BYTES_PER_IDENTITY
        ):
            break
        if gone is newest or not gone.turn.ended:
            continue  # the one just made stays, whatever it weighs
        count -= 1
        weight -= gone.weight
        reg.responses.pop(gone.id, None)
        reg.changed(gone.face)
        _after_forgetting(request, gone.face)


def _materialize(reg: Registry) -> None:
    """The responses read back after a restart, made objects (once)."""
    while reg.kept_responses:
        response_id, (record, face) = reg.kept_responses.popitem(last=False)
        if face.id not in reg.faces:
            continue  # its conversation was forgotten since
        try:
            restored = WireResponse.restored(record, face)
        except (KeyError, TypeError) as e:
            log.warning("response %s cannot be restored (%s)", response_id, e)
            continue
        reg.responses[response_id] = restored


async def _answer(
    request: ServerRequest, response: WireResponse, body: dict[str, Any]
) -> Any:
    if body.get("stream") is True:
        return SSEResponse(start=_streamer(response, -1))
    if not response.background and not response.done:
        await wait_for_turn(request, response.settled.wait())
    return ServerResponse(status=200, body=response.describe())


def _release(request: ServerRequest, response: WireResponse) -> None:
    """``store: false``: the response is forgotten once its turn is over."""
    reg = door(request)
    reg.responses.pop(response.id, None)
    _after_forgetting(request, response.face)


def _after_forgetting(request: ServerRequest, face: SessionFace) -> None:
    """
    A response of ``face`` was forgotten (deleted, not stored, or the
    oldest past the caller's bound): when it was the latest, the newest one
    left is the one to continue from again, as agent-sandbox-server has it;
    with none left, a response's conversation ends.
    """
    reg = door(request)
    left = [r for r in reg.responses.values() if r.face is face]
    if left and face.last_response_id not in {r.id for r in left}:
        face.last_response_id = left[-1].id
    if face.hidden and not left:
        reg.forget(face.id)
        Deferred.fromCoroutine(face.engine.close(reason="released"))


# -- streaming -----------------------------------------------------------------


class ResponseStream(Follower):
    """
    The Responses events of one turn, translated from the session's
    events as they are appended; ends with the turn's terminal event.

    Each event is an SSE frame, unless the channel frames events its own
    way (the Responses WebSocket's lane, one JSON text frame per event)
    and says so with an ``encode_event(type, data)`` of its own.
    """

    def __init__(self, response: WireResponse, channel: SSEChannel, skip: int) -> None:
        self.response = response
        self.number = 0
        self.skip = skip
        self.finished = False
        #: The items this stream added (id → output index), and those it
        #: said were done: each index is added once and done once.
        self.announced: dict[str, int] = {}
        self.closed: set[str] = set()
        self.gapped = False
        self.encode: Callable[[str, dict[str, Any]], bytes] = getattr(
            channel, "encode_event", frame
        )
        if isinstance(channel, SSEChannel):
            # Ended from the server side (a revoked link): OpenAI's error
            # event, numbered as the stream's others are.
            channel.error_frame = self._error_frame
        for type in ("response.created", "response.in_progress"):
            channel.write_raw(self.send_event(type, response=self._snapshot()))
        super().__init__(response.face.log, channel, response.log_from, self._translate)

    def _snapshot(self) -> dict[str, Any]:
        """
        The response as it was when its turn began: no output yet, even
        when some is there already (a stream followed again, the call an
        approval let run). The events that follow add each item, and the
        SDK's stream helper refuses an item added twice.
        """
        shown = self.response.describe()
        if shown["status"] not in ("queued", "in_progress"):
            shown["status"] = "in_progress"
        shown.update(output=[], usage=None, completed_at=None)
        return shown

    def send_event(self, type: str, **fields: Any) -> bytes:
        """The next frame (empty when the client asked to start after it)."""
        number, self.number = self.number, self.number + 1
        if number <= self.skip:
            return b""
        data = {"type": type, "sequence_number": number, **fields}
        return self.encode(type, data)

    def on_gap(self, gap: tuple[int, int]) -> None:
        """
        Events of a response still running were dropped from its log: a
        Responses stream has no ``gap`` event, so nothing is said; the
        items whose beginning went are added as they are done, whole, and
        the text events of theirs that are left are not sent (an item's
        text may not come before it is added).
        """
        self.gapped = True

    def interrupt(self, message: str) -> None:
        """
        The stream is cut with its response still running (the daemon
        stops, and closes the Responses WebSockets before it ends the
        agents): ``response.failed`` saying why is its last event.
        """
        if self.finished or not self.channel.open:
            return
        self.finished = True
        shown = self.response.describe()
        shown.update(
            status="failed", error={"code": "server_error", "message": message}
        )
        self.channel.write_raw(self.send_event("response.failed", response=shown))

    def _error_frame(self, error: ApiError) -> bytes:
        fields = stream_error(error)
        del fields["type"]
        return self.send_event("error", **fields)

    def _translate(self, event: Event) -> bytes:
        data = event.data
        response = self.response
        if self.finished:
            return b""
        if event.event == "agent.session.requires_action":
            return self._asks() if response.paused_at is not None else b""
        if data.get("turn_id") != response.turn.id:
            return b""
        kind = event.event.removeprefix("agent.session.turn.")
        ref = {
            k: data[k]
            for k in ("item_id", "content_index", "summary_index")
            if k in data
        }
        if "output_index" in data:
            # The index in this response's output, not in the turn's items.
            index = data["output_index"] - response.items_from
            if index < 0:
                return b""
            ref["output_index"] = index
        if self.gapped and "item_id" in data and data["item_id"] not in self.announced:
            return b""  # its beginning was dropped: it comes whole, when done
        if kind == "item.added":
            self.announced[data["item"]["id"]] = ref["output_index"]
            return self.send_event(
                "response.output_item.added",
                output_index=ref["output_index"],
                item=output_item(data["item"]),
            )
        if kind == "item.done":
            added = b""
            self.closed.add(data["item"]["id"])
            if data["item"]["id"] not in self.announced:
                # Added before this response began (the call an approval let run).
                self.announced[data["item"]["id"]] = ref["output_index"]
                added = self.send_event(
                    "response.output_item.added",
                    output_index=ref["output_index"],
                    item={**output_item(data["item"]), "status": "in_progress"},
                )
            return added + self.send_event(
                "response.output_item.done",
                output_index=ref["output_index"],
                item=output_item(data["item"]),
            )
        if kind in ("content_part.added", "content_part.done"):
            part = {**data["part"], "annotations": []}
            return self.send_event(f"response.{kind}", part=part, **ref)
        if kind == "output_text.delta":
            return self.send_event(
                "response.output_text.delta", delta=data["delta"], logprobs=[], **ref
            )
        if kind == "output_text.done":
            return self.send_event(
                "response.output_text.done", text=data["text"], logprobs=[], **ref
            )
        if kind.startswith("reasoning_summary_"):
            extra = {k: data[k] for k in ("part", "delta", "text") if k in data}
            return self.send_event(f"response.{kind}", **extra, **ref)
        terminal = {
            "completed": "response.completed",
            "failed": "response.failed",
            "cancelled": "response.incomplete",
        }.get(kind)
        if terminal is not None:
            self.finished = True
            return self.send_event(terminal, response=self.response.describe())
        return b""

    def _asks(self) -> bytes:
        """The approval requests this response ends with, then its end."""
        response = self.response
        out = b""
        start = len(response.own_items())
        # The call that asks was added to this stream as it began; it is
        # shown as the approval request (and as the call it becomes in the
        # response that answers), so here it is closed as it stands, and
        # the requests take the indexes after it: the SDK's stream helper
        # refuses an index added twice, or one added and never done.
        items = {item["id"]: item for item in response.turn.items}
        for item_id, index in sorted(self.announced.items(), key=lambda kv: kv[1]):
            start = max(start, index + 1)
            if item_id in self.closed or item_id not in items:
                continue
            self.closed.add(item_id)
            out += self.send_event(
                "response.output_item.done",
                output_index=index,
                item=output_item(items[item_id]),
            )
        for offset, action in enumerate(response.approvals):
            item = approval_item(action)
            for type in ("response.output_item.added", "response.output_item.done"):
                out += self.send_event(type, output_index=start + offset, item=item)
        self.finished = True
        return out + self.send_event("response.completed", response=response.describe())

    def _pump(self) -> None:
        super()._pump()
        if self.finished and self.channel.open:
            self._unsubscribe()
            self.channel.close()


def _streamer(response: WireResponse, skip: int) -> Any:
    def start(channel: SSEChannel) -> Deferred[None]:
        gap, _ = response.face.log.since(response.log_from)
        if gap is not None and response.done:
            # Its first events are gone from the log: followed, the stream
            # would lack the items' beginnings and text.
            return rebuilt(response, channel, skip)
        return ResponseStream(response, channel, skip).done

    return start


#: A frame number past any stream's: nothing is sent (see ``numbering``).
_UNSENT = 2**62


class _Nowhere:
    """The channel of a stream only numbered, never sent (``numbering``)."""

    open = True

    def __init__(self) -> None:
        self.done: Deferred[None] = Deferred()

    def send(self, event: str, data: Any, id: int | None = None) -> None:
        """Nothing is sent."""

    def write_raw(self, data: Any) -> None:
        """Nothing is written."""

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        """Never disconnected."""

    def register_producer(self, producer: Any) -> None:
        """Never slow."""

    def close(self) -> None:
        """The stream ended."""
        self.open = False


def rebuilt(response: WireResponse, channel: SSEChannel, skip: int) -> Deferred[None]:
    """
    The stream of a response that has ended and whose first events its
    log dropped (it outgrew the session's ``max_event_bytes``, or was read
    back after a restart): rebuilt from the response, each item added,
    its whole text as one delta, then done, then the response's end.
    Every frame has its type, in the live stream's order; the last one has
    the live stream's number, the others increasing before it, so a
    client resuming with ``starting_after`` still gets the end.
    """
    frames: list[tuple[str, dict[str, Any]]] = []
    own = response.own_items()
    for index, item in enumerate(own):
        shown = output_item(item)
        head = {**shown, "status": "in_progress"}
        ref = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            head["content"] = []
        elif item["type"] == "reasoning":
            head["summary"] = []
        frames.append(
            ("response.output_item.added", {"output_index": index, "item": head})
        )
        if item["type"] == "message":
            for i, part in enumerate(shown["content"]):
                at = {**ref, "content_index": i}
                empty = {**part, "text": ""}
                frames.append(("response.content_part.added", {**at, "part": empty}))
                if part["text"]:
                    frames.append(
                        (
                            "response.output_text.delta",
                            {**at, "delta": part["text"], "logprobs": []},
                        )
                    )
                frames.append(
                    (
                        "response.output_text.done",
                        {**at, "text": part["text"], "logprobs": []},
                    )
                )
                frames.append(("response.content_part.done", {**at, "part": part}))
        elif item["type"] == "reasoning":
            for i, part in enumerate(shown["summary"]):
                at = {**ref, "summary_index": i}
                frames.append(
                    (
                        "response.reasoning_summary_part.added",
                        {**at, "part": {**part, "text": ""}},
                    )
                )
                if part["text"]:
                    frames.append(
                        (
                            "response.reasoning_summary_text.delta",
                            {**at, "delta": part["text"]},
                        )
                    )
                frames.append(
                    (
                        "response.reasoning_summary_text.done",
                        {**at, "text": part["text"]},
                    )
                )
                frames.append(
                    ("response.reasoning_summary_part.done", {**at, "part": part})
                )
        frames.append(
            ("response.output_item.done", {"output_index": index, "item": shown})
        )
    for offset, action in enumerate(response.approvals):
        item = approval_item(action)
        for type in ("response.output_item.added", "response.output_item.done"):
            frames.append((type, {"output_index": len(own) + offset, "item": item}))
    status = response.describe()["status"]
    terminal = {"failed": "response.failed", "cancelled": "response.incomplete"}
    frames.append(
        (terminal.get(status, "response.completed"), {"response": response.describe()})
    )
    live = response.numbering
    last = live.number - 1 if live is not None and live.finished else 0
    # Two frames (created, in progress) come first, as in every stream.
    first = max(2, last - len(frames) + 1)
    encode: Callable[[str, dict[str, Any]], bytes] = getattr(
        channel, "encode_event", frame
    )
    shown = response.describe()
    if shown["status"] not in ("queued", "in_progress"):
        shown["status"] = "in_progress"
    shown.update(output=[], usage=None, completed_at=None)
    numbered = [
        (0, "response.created", {"response": shown}),
        (1, "response.in_progress", {"response": shown}),
    ] + [(first + i, type, fields) for i, (type, fields) in enumerate(frames)]
    for number, type, fields in numbered:
        if number > skip:
            data = {"type": type, "sequence_number": number, **fields}
            channel.write_raw(encode(type, data))
    channel.close()
    return channel.done


# -- the other routes ----------------------------------------------------------


def owned_response(
    request: ServerRequest, response_id: str, param: str = "response_id"
) -> WireResponse:
    """
    The caller's response ``response_id``: anyone else's is as unknown as
    one that never was (404 naming ``param``, the field that gave the id).
    """
    reg = door(request)
    _materialize(reg)
    found: WireResponse | None = reg.responses.get(response_id)
    if found is None or found.owner != owner_of(request):
        raise not_found(f"No response found with id {response_id!r}", param=param)
    return found


async def agents_responses_get(request: ServerRequest) -> Any:
    """The response; ``stream=true`` streams it (live while it runs)."""
    stream = flag(request.query.get("stream"), "stream")
    raw = request.query.get("starting_after")
    skip = -1
    if raw:
        if not raw.isdigit():
            raise bad_request(
                "starting_after must be a sequence number (0 or more), as the "
                "stream's events carry",
                param="starting_after",
            )
        skip = int(raw)
    response = owned_response(request, request.path_params["response_id"])
    if stream:
        return SSEResponse(start=_streamer(response, skip))
    return response.describe()


async def agents_responses_cancel(request: ServerRequest) -> dict[str, Any]:
    """Cancel a queued or running response; answered once it has ended."""
    response = owned_response(request, request.path_params["response_id"])
    turn = response.turn
    if turn.ended:
        raise bad_request(
            f"the response is {response.describe()['status']}; only a queued or "
            "running response can be cancelled",
            param="response_id",
        )
    response.face.cancel_turn(turn)
    if not turn.ended:
        # A queued turn ended at once; a running one ends once its agent
        # has stopped (its waiters fire then, and only then).
        await _within(
            request.context.reactor,
            turn.waiters.wait(),
            defaults.AGENT_CANCEL_GRACE_SECONDS + defaults.KILL_GRACE_SECONDS + 1,
        )
    return response.describe()


def agents_responses_delete(request: ServerRequest) -> dict[str, Any]:
    """Forget the response (its conversation's agent ends with its last one)."""
    response = owned_response(request, request.path_params["response_id"])
    reg = door(request)
    reg.responses.pop(response.id, None)
    reg.changed(response.face)
    if not response.turn.ended:
        response.face.cancel_turn(response.turn)
    _after_forgetting(request, response.face)
    return {"id": response.id, "object": "response", "deleted": True}


def agents_responses_input_items(request: ServerRequest) -> dict[str, Any]:
    """The response's input messages."""
    response = owned_response(request, request.path_params["response_id"])
    return page(request, list(response.input_items))


HANDLERS: dict[str, Any] = {
    "agents_responses_create": agents_responses_create,
    "agents_responses_get": agents_responses_get,
    "agents_responses_cancel": agents_responses_cancel,
    "agents_responses_delete": agents_responses_delete,
    "agents_responses_input_items": agents_responses_input_items,
}
HANDLERS = restored_first(HANDLERS)
