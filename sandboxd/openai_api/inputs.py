# -*- test-case-name: tests.openai_api.test_sessions -*-
"""
OpenAI's input shapes as the engine takes them: message content flattened
to text (ACP ``text`` blocks), checked before anything runs.
"""

from __future__ import annotations

from typing import Any

from sandboxd.errors import bad_request

#: Content part types whose text is taken.
_TEXT_PARTS = ("input_text", "text", "output_text")


def message_text(value: Any, where: str) -> str:
    """
    The text of an input: a string, a message ``{role, content}``, a list
    of messages, or a list of content parts.

    :raises ApiError: 400 naming ``where`` for anything else.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        if value.get("role", "user") not in ("user", "system", "developer"):
            raise bad_request(
                f"{where}: only user messages can be sent (an agent's history "
                "cannot be replayed)",
                param=where,
            )
        if "content" in value:
            return message_text(value["content"], where)
        if value.get("type") in _TEXT_PARTS and isinstance(value.get("text"), str):
            return str(value["text"])
        kind = value.get("type")
        if isinstance(kind, str) and kind not in ("message", *_TEXT_PARTS):
            # An image, a file, a function call's output: an agent's prompt
            # is text, and saying so beats "needs content".
            raise bad_request(
                f"{where}: {kind[:64]} is not supported; an agent takes text "
                "(input_text parts or messages)",
                param=where,
            )
        raise bad_request(f"{where}: a message needs content", param=where)
    if isinstance(value, list):
        parts = []
        for part in value:
            if isinstance(part, dict) and part.get("type") in _TEXT_PARTS:
                text = part.get("text")
                if not isinstance(text, str):
                    raise bad_request(f"{where}: a text part needs text", param=where)
                parts.append(text)
            elif isinstance(part, (dict, str)):
                parts.append(message_text(part, where))
            else:
                raise bad_request(f"{where}: unsupported content", param=where)
        return "\n".join(p for p in parts if p)
    raise bad_request(
        f"{where} must be a string, a message or a list of messages", param=where
    )


def metadata(value: Any) -> dict[str, str]:
    """OpenAI's metadata: at most 16 string pairs, keys ≤64, values ≤512."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 16:
        raise bad_request(
            "metadata must be an object of at most 16 pairs", param="metadata"
        )
    out = {}
    for key, item in value.items():
        if not 0 < len(key) <= 64 or not isinstance(item, str) or len(item) > 512:
            raise bad_request(
                "metadata keys are 1-64 characters, values strings of at most 512",
                param="metadata",
            )
        out[key] = item
    return out


def known_keys(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """Refuse keys the door would otherwise ignore (as the seed does)."""
    for key in body:
        if key not in allowed:
            raise bad_request(f"{key}: unknown or unsupported parameter", param=key)


def refuse_multi_agent(value: Any, where: str) -> None:
    """
    Refuse an agent's ``multi_agent`` setting that turns subagents on (the
    ACP engine runs none); anything but an object or null is a 400 too.
    """
    if value is None:
        return
    if not isinstance(value, dict):
        raise bad_request(f"{where} must be an object", param=where)
    if value.get("enabled"):
        raise bad_request(f"{where}: subagents are not supported", param=where)


#: OpenAI's reasoning efforts, as agent-sandbox-server takes them.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def reasoning_effort(value: Any, where: str) -> str | None:
    """
    The effort of a ``reasoning`` object, for the agent's thought-level
    setting (None: the agent's own).  A summary cannot be asked of an agent.

    :raises ApiError: 400 naming ``where`` for anything else.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request(f"{where}: expected an object", param=where)
    if value.get("summary") is not None:
        raise bad_request(
            f"{where}.summary: summaries cannot be requested from an agent",
            param=f"{where}.summary",
        )
    effort = value.get("effort")
    if effort is None:
        return None
    if effort not in REASONING_EFFORTS:
        raise bad_request(
            f"{where}.effort: must be {'|'.join(REASONING_EFFORTS)}",
            param=f"{where}.effort",
        )
    return str(effort)
