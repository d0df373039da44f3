# -*- test-case-name: tests.openai_api.test_traces -*-
"""
A session's traces through the ``/v1`` door: one ``agent.session.trace`` per ended turn, an OTLP/JSON export
holding a single ``agent.turn`` span built from the turn's start and end
times, its status and its item count — never its text, commands or
arguments, so a trace can be shipped to a collector without leaking what
the agent saw.  Ids derive from the turn id (SHA-256), as the seed's do, so
a trace keeps its id across calls.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sandboxd.openai_api.face import SessionFace, WireTurn
from sandboxd.openai_api.registry import face_of, page, restored_first
from sandboxd.web.messages import ServerRequest

#: The OTLP resource's ``service.name`` and the instrumentation scope.
SERVICE_NAME = "sandboxd"
SCOPE_NAME = "sandboxd.agents"
#: OTLP span kind INTERNAL; status codes OK and ERROR.
_KIND_INTERNAL = 1
_STATUS_OK, _STATUS_ERROR = 1, 2


def _attr(key: str, value: Any) -> dict[str, Any]:
    """An OTLP/JSON attribute (64-bit integers are strings in OTLP/JSON)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _times(face: SessionFace, turn: WireTurn) -> tuple[float, float] | None:
    """The turn's start and end (the engine's, to the sub-second), if it ran."""
    engine_turn = face.engine.turns.get(turn.engine_id or "")
    if engine_turn is not None and engine_turn.ended_at is not None:
        return engine_turn.started_at, engine_turn.ended_at
    if turn.started_at is None or turn.completed_at is None:
        return None
    return float(turn.started_at), float(turn.completed_at)


def trace_of(face: SessionFace, turn: WireTurn) -> dict[str, Any] | None:
    """The ``agent.session.trace`` of an ended turn (None before it ends)."""
    times = _times(face, turn) if turn.ended else None
    if times is None:
        return None
    start, end = times
    digest = hashlib.sha256(turn.id.encode()).hexdigest()
    span = {
        "traceId": digest[:32],
        "spanId": digest[32:48],
        "name": "agent.turn",
        "kind": _KIND_INTERNAL,
        "startTimeUnixNano": str(int(start * 1e9)),
        "endTimeUnixNano": str(int(end * 1e9)),
        "attributes": [
            _attr("turn.id", turn.id),
            _attr("turn.status", turn.status),
            _attr("turn.items", len(turn.items)),
        ],
        "status": {"code": _STATUS_ERROR if turn.status == "failed" else _STATUS_OK},
    }
    return {
        "id": "trace_" + digest[:24],
        "object": "agent.session.trace",
        "created_at": int(end),
        "session_id": face.id,
        "otlp": {
            "resourceSpans": [
                {
                    "resource": {"attributes": [_attr("service.name", SERVICE_NAME)]},
                    "scopeSpans": [{"scope": {"name": SCOPE_NAME}, "spans": [span]}],
                }
            ]
        },
    }


def agents_traces_list(request: ServerRequest) -> dict[str, Any]:
    """One trace per ended turn of the session."""
    face = face_of(request)
    traces = [trace_of(face, t) for t in face.turns.values()]
    return page(request, [t for t in traces if t is not None])


HANDLERS: dict[str, Any] = {"agents_traces_list": agents_traces_list}
HANDLERS = restored_first(HANDLERS)
