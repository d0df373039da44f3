# -*- test-case-name: tests.openai_api.test_sessions -*-
"""
A session's projected events as SSE (the §9 contract, OpenAI's payloads).

Every frame carries its own ``id:`` (its seq in the face's log); a client
resumes with ``after`` (a seq or an ``event_id`` ``evt_…``) or
``Last-Event-ID``; without either the stream starts now, as OpenAI's does.
The stream ends after an ``agent.session.idle`` (or ``.failed``) that
leaves the client caught up with a session that has nothing to run, so
``for event in client.beta.agents.sessions.events.stream(...)`` ends with
the turn; and after the session's last event once it is closed.
Heartbeats are a lone comment line (see :func:`follow`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twisted.internet.defer import Deferred

from sandboxd.errors import bad_request
from sandboxd.eventlog import Event
from sandboxd.openai_api.face import SessionFace
from sandboxd.web.sse import Follower, SSEChannel, frame

#: Events after which a caught-up client of a quiet session is done.
_RESTING = ("agent.session.idle", "agent.session.failed")


def resume_after(
    face: SessionFace, query: dict[str, str], headers: Mapping[str, str]
) -> int:
    """
    The seq to resume after: ``after`` (``N`` or ``evt_N``), else
    ``Last-Event-ID``, else the log's end (now).
    """
    raw, name = query.get("after"), "after"
    if raw is None:
        raw, name = headers.get("last-event-id"), "Last-Event-ID"
    if raw is None or raw == "":
        return face.log.last_seq
    text = raw[4:] if raw.startswith("evt_") else raw
    if not text.isdigit():
        raise bad_request(
            f"'{name}' must be a sequence number or an event_id (evt_…)", param=name
        )
    return int(text)


def _format(event: Event) -> bytes:
    return frame(event.event, event.data, event.seq)


class WireFollower(Follower):
    """:class:`~sandboxd.web.sse.Follower` that ends when the session rests."""

    def __init__(self, face: SessionFace, channel: SSEChannel, after: int) -> None:
        self.face = face
        self.start = after
        super().__init__(face.log, channel, after, _format)

    def on_gap(self, gap: tuple[int, int]) -> None:
        """
        The ``gap`` frame with a ``type``, as every event of the door's
        streams has: the SDK's ``sessions.events.stream`` yields it as an
        event whose ``type`` a client can switch on.
        """
        self.channel.send("gap", {"type": "gap", "from": gap[0], "to": gap[1]})

    def _pump(self) -> None:
        super()._pump()
        if self.channel.open and self._rests():
            self._unsubscribe()
            self.channel.close()

    def _rests(self) -> bool:
        log = self.log
        if self.sent <= self.start or self.sent != log.last_seq or self.face.busy:
            return False
        _, tail = log.since(self.sent - 1)
        return bool(tail) and tail[-1].event in _RESTING


def follow(face: SessionFace, after: int) -> Any:
    """The ``start`` of an :class:`~sandboxd.web.messages.SSEResponse`."""

    def start(channel: SSEChannel) -> Deferred[None]:
        # The comment line alone, with no blank line after it: the openai
        # SDK's decoder dispatches a blank line as an event whenever an
        # ``id:`` came before (the last event id is kept, as the SSE spec
        # says), and its empty data then fails to parse as JSON, ending
        # the stream of a turn quiet for a heartbeat's interval.
        channel.heartbeat_frame = b": keep-alive\n"
        return WireFollower(face, channel, after).done

    return start
