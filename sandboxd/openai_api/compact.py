# -*- test-case-name: tests.openai_api.test_compact -*-
"""
``POST /v1/responses/compact``: shrink a conversation's context with the
agent's own command.

OpenAI compacts server-side into an encrypted item; a local agent keeps its
context itself, so compaction is the agent's slash command (``/compact``, or
``/compress`` as Qwen Code names it), run as one more turn of the
conversation's session, waited for, and answered as OpenAI's
``response.compaction`` with the agent's reply as its output.  The seed
does the same for the one CLI with such a command and refuses the others;
here any agent that offers one of those commands can, and one that offers
neither is refused (400) before anything runs.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from sandboxd.errors import Code, agent_error, agent_timeout, bad_request
from sandboxd.openai_api.inputs import known_keys
from sandboxd.openai_api.registry import restored_first
from sandboxd.openai_api.responses import (
    output_item,
    owned_response,
    wait_for_turn,
    wire_usage,
)
from sandboxd.openai_api.routes import submit_text, wake
from sandboxd.web.messages import ServerRequest

#: What the compact body takes: the conversation, and the model it runs
#: (the SDK requires ``model``; the conversation's agent is used).
_KEYS = ("previous_response_id", "model", "adapter", "runtime")
#: Agent commands that compact a conversation, in order of preference.
COMMANDS = ("compact", "compress")


def compact_command(commands: list[dict[str, Any]]) -> str | None:
    """The agent's compaction command among those it offers, if any."""
    offered = {c.get("name") for c in commands if isinstance(c, dict)}
    return next((name for name in COMMANDS if name in offered), None)


def _counts(text: str) -> dict[str, int]:
    """The token counts an agent may answer as JSON (Qwen Code does)."""
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    out = {}
    if isinstance(found, dict):
        for key, name in (
            ("originalTokenCount", "original_token_count"),
            ("newTokenCount", "new_token_count"),
        ):
            value = found.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                out[name] = value
    return out


def _zero_usage() -> dict[str, Any]:
    """OpenAI's usage with nothing counted (the agent reported none)."""
    return {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }


async def agents_responses_compact(request: ServerRequest) -> dict[str, Any]:
    """Run the agent's compaction command on the conversation and answer its reply."""
    body = request.body
    known_keys(body, _KEYS)
    previous = body.get("previous_response_id")
    if not isinstance(previous, str) or not previous:
        raise bad_request(
            "previous_response_id is required: the conversation to compact",
            param="previous_response_id",
        )
    prior = owned_response(request, previous, "previous_response_id")
    face = prior.face
    if face.last_response_id != prior.id:
        raise bad_request(
            "previous_response_id must be the latest response of its conversation",
            param="previous_response_id",
        )
    if face.log.closed:
        raise bad_request(
            "this conversation's agent has ended; there is nothing to compact",
            param="previous_response_id",
        )
    # Its agent gave its slot up, failed, or a restart ended it: it starts
    # again (resuming its own session when it can), as for a new response.
    await wake(request, face)
    face.require_live()
    command = compact_command(face.engine.commands)
    if command is None:
        raise bad_request(
            f"the agent {face.agent['runtime']!r} offers no /compact or /compress "
            "command: its conversation cannot be compacted",
            Code.INVALID_PARAM,
            param="model",
        )
    turn = submit_text(request, face, "/" + command)
    await wait_for_turn(request, turn.waiters.wait())
    if not turn.ended:
        face.cancel_turn(turn)
        raise agent_timeout("the agent did not finish compacting in time")
    if turn.status != "completed":
        message = (turn.error or {}).get("message") or turn.status
        raise agent_error(f"the agent could not compact the conversation: {message}")
    output = [output_item(i) for i in turn.items if i["type"] == "message"]
    text = " ".join(
        part.get("text", "") for item in output for part in item.get("content", [])
    )
    answer: dict[str, Any] = {
        "id": "resp_cmp_" + secrets.token_hex(10),
        "object": "response.compaction",
        "created_at": turn.created_at or int(time.time()),
        "output": output,
        "usage": wire_usage(turn.usage) or _zero_usage(),
    }
    counts = _counts(text.strip())
    if counts:
        # Beside OpenAI's fields, under the seed's label key.
        answer["x_agent_sandbox"] = counts
    return answer


HANDLERS: dict[str, Any] = {"agents_responses_compact": agents_responses_compact}
HANDLERS = restored_first(HANDLERS)
