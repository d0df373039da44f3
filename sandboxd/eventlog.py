# -*- test-case-name: tests.test_eventlog -*-
"""
The one stream contract of SPEC §9: an ordered, bounded log of events
numbered by ``seq`` (data only: :class:`~sandboxd.web.sse.Follower` serves
one over SSE).

Background process output, file watches and agent sessions each keep an
:class:`EventLog`.  A reader asks for the events after a ``seq`` (``after``
or ``Last-Event-ID``) and gets exactly those still retained, in order, then
live ones with no gap and no repeat; events already dropped are announced
with one ``gap`` event.  A follower whose client reads slowly stops taking
events and catches up from the log when it drains, so memory stays bounded
by the log, never by the client.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Mapping
from itertools import islice
from typing import Any, TypeVar

import attrs


@attrs.frozen
class Event:
    """One retained event."""

    seq: int
    event: str
    data: Any
    size: int

    def as_json(self) -> dict[str, Any]:
        """``{seq, event, data}`` for paged (non-SSE) reads."""
        return {"seq": self.seq, "event": self.event, "data": self.data}


def json_size(data: Any) -> int:
    """Bytes an event's data costs in the log (its JSON length)."""
    return len(json.dumps(data, separators=(",", ":")))


class EventLog:
    """
    A bounded, ordered log; ``seq`` starts at ``start + 1`` (1 by default).

    :param max_bytes: retention bound; the oldest events go first, but the
        newest event is always kept, so a finished stream keeps its ``exit``.
    :param start: the seq before the first event.  A stream that one URL
        serves from a new log each time (a directory's watch, started again
        after a restart or an idle close) numbers from a point in time, so
        that an id of an earlier log falls before this one's first event
        and is answered with a ``gap``, not taken for one of its own.
    """

    def __init__(self, max_bytes: int, start: int = 0) -> None:
        self.max_bytes = max_bytes
        self._events: deque[Event] = deque()
        self._bytes = 0
        self.start = start
        self.last_seq = start
        self.dropped_bytes = 0
        self.closed = False
        self._listeners: list[Callable[[Event | None], None]] = []

    @property
    def first_seq(self) -> int:
        """The oldest retained seq (``last_seq + 1`` when empty)."""
        return self._events[0].seq if self._events else self.last_seq + 1

    @property
    def retained_bytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def append(self, event: str, data: Any, size: int | None = None) -> Event:
        """Record an event and tell every listener."""
        if self.closed:
            raise RuntimeError("the event log is closed")
        self.last_seq += 1
        item = Event(
            self.last_seq, event, data, json_size(data) if size is None else size
        )
        self._events.append(item)
        self._bytes += item.size
        while self._bytes > self.max_bytes and len(self._events) > 1:
            old = self._events.popleft()
            self._bytes -= old.size
            self.dropped_bytes += old.size
        for listener in list(self._listeners):
            listener(item)
        return item

    def close(self) -> None:
        """No more events; listeners get None."""
        if self.closed:
            return
        self.closed = True
        for listener in list(self._listeners):
            listener(None)
        self._listeners.clear()

    def since(self, after: int) -> tuple[tuple[int, int] | None, list[Event]]:
        """
        The retained events with ``seq > after``, and the ``(from, to)``
        range of asked-for events already dropped, if any.

        An ``after`` this log never reached is not one of its ids (it came
        from another log: before a restart, or of a watch closed since):
        the events are given from the log's start (:meth:`resumed`), never
        filtered by it, which would hide the first ones without a word.
        """
        after = self.resumed(after)
        first = self.first_seq
        gap = (
            (after + 1, first - 1)
            if after + 1 < first and self.last_seq >= after + 1
            else None
        )
        # The retained seqs are consecutive, so the wanted ones are the
        # last ``count``, taken from the end: a live follower asks after
        # every event, and a scan of the whole log each time made a burst
        # cost its length times the log's on the reactor.
        count = self.last_seq - max(after, first - 1)
        if count <= 0:
            return gap, []
        if count >= len(self._events):
            return gap, list(self._events)
        tail = list(islice(reversed(self._events), count))
        tail.reverse()
        return gap, tail

    def resumed(self, after: int) -> int:
        """
        Where a reader resuming after ``after`` starts: ``after`` itself;
        the log's start for 0 (no resume point: every event) and for an
        ``after`` past its last event (an id no reader of this log was
        given).  An ``after`` before the start is kept: the events between
        are another log's, missed, and :meth:`since` says so with a gap.
        """
        if after == 0 or after > self.last_seq:
            return self.start
        return after

    def subscribe(self, listener: Callable[[Event | None], None]) -> Callable[[], None]:
        """Call ``listener`` with each new event (None at close); returns unsubscribe."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe


_Key = TypeVar("_Key")
_Holder = TypeVar("_Holder")


def forget_closed(
    table: Mapping[_Key, _Holder],
    log_of: Callable[[_Holder], EventLog],
    forget: Callable[[_Key], object],
    max_items: int,
    max_bytes: int,
) -> None:
    """
    Forget what ``table`` holds whose log is closed, oldest first, while it
    holds more than ``max_items`` or the closed logs more than ``max_bytes``.

    A count alone is no bound on memory: each closed session may keep a log
    as large as a live one's.  The newest closed one always stays, so its
    caller can still read how it ended; what is still open is never
    forgotten here.
    """
    closed = [
        (key, log_of(held).retained_bytes)
        for key, held in table.items()
        if log_of(held).closed
    ]
    count = len(table)
    weight = sum(size for _, size in closed)
    for key, size in closed[:-1]:
        if count <= max_items and weight <= max_bytes:
            break
        forget(key)
        count -= 1
        weight -= size
