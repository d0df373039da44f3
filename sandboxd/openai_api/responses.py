# -*- test-case-name: tests.openai_api.test_responses -*-
"""
The Responses routes of the ``/v1`` door: one response is one turn of a
session the caller does not see (one per conversation; a
``previous_response_id`` continues the same agent session).

A streamed response is translated from the session's projected events as
the turn runs (each agent message chunk is an ``output_text.delta`` the
moment the agent sends it), not replayed after the turn as the seed does.
"""

from __future__ import annotations

import json
import time
from typing import Any

from twisted.internet.defer import Deferred

from sandboxd.agents import catalog
from sandboxd.errors import bad_request, not_found
from sandboxd.eventlog import Event
from sandboxd.openai_api import definitions
from sandboxd.openai_api.face import SessionFace, WireTurn, new_id
from sandboxd.openai_api.inputs import known_keys, message_text, metadata
from sandboxd.openai_api.registry import door, manager, page
from sandboxd.openai_api.routes import open_session, submit_text
from sandboxd.policy import defaults
from sandboxd.web.messages import ServerRequest, ServerResponse, SSEResponse
from sandboxd.web.sse import Follower, SSEChannel, frame

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
    ) -> None:
        self.id = new_id("resp_")
        self.owner = owner
        self.face = face
        self.turn = turn
        self.model = str(body["model"])
        self.instructions = instructions
        self.metadata = metadata(body.get("metadata"))
        self.previous_response_id = body.get("previous_response_id")
        self.store = body.get("store") is not False
        self.background = body.get("background") is True
        self.input_items = inputs
        self.log_from = log_from
        self.created_at = int(time.time())

    def describe(self) -> dict[str, Any]:
        """The ``response`` object."""
        turn = self.turn
        status = _STATUS[turn.status]
        error = None
        if turn.error is not None:
            error = {"code": "server_error", "message": turn.error.get("message") or ""}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": turn.completed_at,
            "status": status,
            "background": self.background,
            "error": error,
            "incomplete_details": None,
            "instructions": self.instructions,
            "metadata": self.metadata,
            "model": self.model,
            "output": [output_item(i) for i in turn.items],
            "parallel_tool_calls": False,
            "previous_response_id": self.previous_response_id,
            "service_tier": None,
            "store": self.store,
            "temperature": None,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": None,
            "usage": _usage(turn.usage),
        }


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
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
    if kind == "command_execution":
        name, arguments = "shell", {"command": item["command"], "cwd": item.get("cwd")}
        error = (
            None if item["exit_code"] in (0, None) else f"exit code {item['exit_code']}"
        )
    else:
        name, arguments, error = item["name"], item["arguments"], item.get("error")
    status = (
        item["status"] if item["status"] in ("completed", "in_progress") else "failed"
    )
    call = {
        "id": item["id"],
        "type": "mcp_call",
        "server_label": "agent",
        "name": name,
        "arguments": json.dumps(arguments),
        "output": item.get("output"),
        "status": status,
    }
    call["error"] = error  # the call's field, not an error body
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


def _check(body: dict[str, Any]) -> list[str]:
    """Refuse what cannot be honoured; the ignored keys, named."""
    ignored = [k for k in body if k in _IGNORED]
    known_keys(body, _KEYS + _IGNORED)
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
    return ignored


async def agents_responses_create(request: ServerRequest) -> Any:
    """One turn: answered when it ends, at once (background), or streamed live."""
    body = request.body
    reg = door(request)
    book = reg.book(request.identity.id, "responses")
    key = request.headers.get("idempotency-key")
    known = book.lookup(key, body)
    if known is not None and known in reg.responses:
        return await _answer(request, reg.responses[known], body)
    ignored = _check(body)
    text, systems, items = _inputs(body)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("instructions must be a string", param="instructions")
    preamble = "\n\n".join([s for s in [instructions, *systems] if s])
    previous = body.get("previous_response_id")
    if previous is not None:
        prior = _response(request, str(previous), "previous_response_id")
        face = prior.face
        if face.last_response_id != prior.id:
            raise bad_request(
                "previous_response_id must be the latest response of its conversation",
                param="previous_response_id",
            )
        if face.log.closed:
            raise bad_request(
                "this conversation's agent has ended (closed to make room for "
                "another, or gone); start a new response",
                param="previous_response_id",
            )
        face.require_live()
    else:
        agent = _agent(request, body["model"])
        await _make_room(request)
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
            reg.faces.pop(face.id, None)
        raise
    response = WireResponse(
        request.identity.id, face, turn, body, instructions, items, log_from
    )
    face.last_response_id = response.id
    reg.responses[response.id] = response
    _bound(reg.responses)
    book.store(key, body, response.id)
    if not response.store:
        turn.waiters.wait().addCallback(lambda _: _release(request, response))
    answer = await _answer(request, response, body)
    if ignored and isinstance(answer, ServerResponse):
        answer.headers[_IGNORED_HEADER] = ",".join(ignored)
    return answer


def _agent(request: ServerRequest, model: str) -> dict[str, Any]:
    """A stored definition (``agent_…``) or a catalogue agent, as a session's agent."""
    if model.startswith("agent_"):
        record = definitions.find(request, model, param="model")
        return {
            "id": record["id"],
            "runtime": record["model"],
            "model": record["model"],
            "name": record.get("name"),
            "instructions": record.get("instructions"),
            # Its MCP tools reach the agent (header values, no vault).
            "tools": list(record.get("tools") or []),
        }
    catalog.find(request.context, request.rule, model)
    return {
        "id": model,
        "runtime": model,
        "model": model,
        "name": None,
        "instructions": None,
    }


def _within(clock: Any, d: Deferred[Any], seconds: float) -> Deferred[Any]:
    """:func:`sandboxd.agents.session.within`, imported when an agent runs."""
    from sandboxd.agents.session import within

    return within(clock, d, seconds)


async def _make_room(request: ServerRequest) -> None:
    """
    A new conversation at ``max_sessions``: the caller's least recently
    used idle conversation gives its agent up (as the seed evicts idle
    sessions), so stored responses do not hold agents forever.  Its
    responses stay readable; continuing it is refused.
    """
    limit = request.rule.limits.max_sessions or 4
    if len(manager(request).live()) < limit:
        return
    idle = [
        f
        for f in door(request).faces.values()
        if f.hidden
        and f.owner == request.identity.id
        and not f.busy
        and not f.log.closed
    ]
    if idle:
        oldest = min(idle, key=lambda f: f.last_active_at)
        await oldest.engine.close(reason="evicted")


def _bound(responses: Any) -> None:
    while len(responses) > defaults.AGENT_KEPT_ITEMS:
        responses.popitem(last=False)


async def _answer(
    request: ServerRequest, response: WireResponse, body: dict[str, Any]
) -> Any:
    if body.get("stream") is True:
        return SSEResponse(start=_streamer(response, -1))
    if not response.background and not response.turn.ended:
        limit = request.rule.limits.max_turn_seconds or 1800
        await _within(
            request.context.reactor,
            response.turn.waiters.wait(),
            limit + defaults.AGENT_CANCEL_GRACE_SECONDS + defaults.KILL_GRACE_SECONDS,
        )
    return ServerResponse(status=200, body=response.describe())


def _release(request: ServerRequest, response: WireResponse) -> None:
    """``store: false``: the response is forgotten once its turn is over."""
    reg = door(request)
    reg.responses.pop(response.id, None)
    _close_if_unused(request, response.face)


def _close_if_unused(request: ServerRequest, face: SessionFace) -> None:
    reg = door(request)
    if face.hidden and not any(r.face is face for r in reg.responses.values()):
        reg.faces.pop(face.id, None)
        Deferred.fromCoroutine(face.engine.close(reason="released"))


# -- streaming -----------------------------------------------------------------


class ResponseStream(Follower):
    """
    The Responses events of one turn, translated from the session's
    events as they are appended; ends with the turn's terminal event.
    """

    def __init__(self, response: WireResponse, channel: SSEChannel, skip: int) -> None:
        self.response = response
        self.number = 0
        self.skip = skip
        self.finished = False
        for type in ("response.created", "response.in_progress"):
            channel.write_raw(self.send_event(type, response=self._snapshot()))
        super().__init__(response.face.log, channel, response.log_from, self._translate)

    def _snapshot(self) -> dict[str, Any]:
        """The response as it was when its turn began."""
        shown = self.response.describe()
        if shown["status"] not in ("queued", "in_progress"):
            shown.update(status="in_progress", output=[], usage=None, completed_at=None)
        return shown

    def send_event(self, type: str, **fields: Any) -> bytes:
        """The next frame (empty when the client asked to start after it)."""
        number, self.number = self.number, self.number + 1
        if number <= self.skip:
            return b""
        data = {"type": type, "sequence_number": number, **fields}
        return frame(type, data)

    def _translate(self, event: Event) -> bytes:
        data = event.data
        if self.finished or data.get("turn_id") != self.response.turn.id:
            return b""
        kind = event.event.removeprefix("agent.session.turn.")
        ref = {
            k: data[k]
            for k in ("item_id", "output_index", "content_index", "summary_index")
            if k in data
        }
        if kind == "item.added":
            item = output_item(data["item"])
            return self.send_event(
                "response.output_item.added",
                output_index=data["output_index"],
                item=item,
            )
        if kind == "item.done":
            return self.send_event(
                "response.output_item.done",
                output_index=data["output_index"],
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

    def _pump(self) -> None:
        super()._pump()
        if self.finished and self.channel.open:
            self._unsubscribe()
            self.channel.close()


def _streamer(response: WireResponse, skip: int) -> Any:
    def start(channel: SSEChannel) -> Deferred[None]:
        return ResponseStream(response, channel, skip).done

    return start


# -- the other routes ----------------------------------------------------------


def _response(
    request: ServerRequest, response_id: str, param: str = "response_id"
) -> WireResponse:
    found: WireResponse | None = door(request).responses.get(response_id)
    if found is None or found.owner != request.identity.id:
        raise not_found(f"No response found with id {response_id!r}", param=param)
    return found


async def agents_responses_get(request: ServerRequest) -> Any:
    """The response; ``stream=true`` streams it (live while it runs)."""
    response = _response(request, request.path_params["response_id"])
    if request.query.get("stream") in ("true", "1"):
        raw = request.query.get("starting_after")
        skip = -1
        if raw:
            if not raw.isdigit():
                raise bad_request(
                    "starting_after must be a number", param="starting_after"
                )
            skip = int(raw)
        return SSEResponse(start=_streamer(response, skip))
    return response.describe()


async def agents_responses_cancel(request: ServerRequest) -> dict[str, Any]:
    """Cancel a queued or running response; answered once it has ended."""
    response = _response(request, request.path_params["response_id"])
    turn = response.turn
    if turn.ended:
        raise bad_request(
            f"the response is {response.describe()['status']}; only a queued or "
            "running response can be cancelled",
            param="response_id",
        )
    response.face.cancel_turn(turn)
    await _within(
        request.context.reactor,
        turn.waiters.wait(),
        defaults.AGENT_CANCEL_GRACE_SECONDS + defaults.KILL_GRACE_SECONDS + 1,
    )
    return response.describe()


def agents_responses_delete(request: ServerRequest) -> dict[str, Any]:
    """Forget the response (its conversation's agent ends with its last one)."""
    response = _response(request, request.path_params["response_id"])
    door(request).responses.pop(response.id, None)
    if not response.turn.ended:
        response.face.cancel_turn(response.turn)
    _close_if_unused(request, response.face)
    return {"id": response.id, "object": "response", "deleted": True}


def agents_responses_input_items(request: ServerRequest) -> dict[str, Any]:
    """The response's input messages."""
    response = _response(request, request.path_params["response_id"])
    return page(request, list(response.input_items))


HANDLERS: dict[str, Any] = {
    "agents_responses_create": agents_responses_create,
    "agents_responses_get": agents_responses_get,
    "agents_responses_cancel": agents_responses_cancel,
    "agents_responses_delete": agents_responses_delete,
    "agents_responses_input_items": agents_responses_input_items,
}
