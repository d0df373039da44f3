# -*- test-case-name: tests.web.test_linestream,tests.routes.test_process -*-
"""
``/shell/stream``'s output: stdout and stderr lines as they complete,
framed as SSE events and coalesced into few writes.
"""

from __future__ import annotations

import base64
import re
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IDelayedCall

from sandboxd.policy.defaults import (
    MAX_LINE_BYTES,
    STREAM_FLUSH_BYTES,
    STREAM_FLUSH_SECONDS,
)
from sandboxd.processes.child import STREAM_NAMES
from sandboxd.web.sse import frame

_NEEDS_JSON = re.compile(rb'[\x00-\x09\x0b-\x1f"\\\x80-\xff]')
_PREFIX = {
    fd: f'event: {name}\ndata: {{"data":"'.encode() for fd, name in STREAM_NAMES.items()
}
_SUFFIX = b'"}\n\n'


def _line_event(line: bytes, newline: bool) -> dict[str, Any]:
    """A ``stdout``/``stderr`` event's data: ``newline: false`` only when none ended it."""
    data: dict[str, Any] = {"data": line.decode("utf-8", "replace")}
    if not newline:
        data["newline"] = False
    return data


def _between_characters(data: bytes, limit: int) -> int:
    """
    Where to cut ``data`` (longer than ``limit``) into a piece of at most
    ``limit`` bytes: before the character ``limit`` falls inside, so both
    pieces decode as the text that was printed rather than each with a
    replacement character; at ``limit`` itself when ``data`` is not UTF-8
    there.
    """
    cut = limit
    # A UTF-8 character is at most 4 bytes: at most 3 continuation bytes
    # (10xxxxxx) follow its first byte.
    while cut > limit - 3 and data[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut if data[cut] & 0xC0 != 0x80 else limit


class LineStream:
    """
    Turns a child's output into SSE ``stdout``/``stderr`` line events.

    Lines are sent in the order their reads arrived, each as soon as it is
    complete; writes closer together than ``flush_seconds`` are coalesced
    (the first one goes out at once, so the first event is never delayed).
    Each stream sends its first ``cap // 2`` bytes live and keeps the last
    ``cap // 2`` for the end, announcing what was dropped between them.

    :param write: takes the frame bytes (``SSEChannel.write_raw``).
    """

    def __init__(
        self,
        clock: Any,
        write: Callable[[bytes], None],
        cap: int,
        flush_seconds: float = STREAM_FLUSH_SECONDS,
        flush_bytes: int = STREAM_FLUSH_BYTES,
        max_line: int = MAX_LINE_BYTES,
    ) -> None:
        self.clock = clock
        self.write = write
        self.flush_seconds = flush_seconds
        self.flush_bytes = flush_bytes
        self.max_line = max_line
        self._partial = {1: b"", 2: b""}
        self._live = {1: cap // 2, 2: cap // 2}
        self._tail_cap = cap - cap // 2
        #: Lines kept for the end, each with whether a newline ended it.
        self._tail: dict[int, deque[tuple[bytes, bool]]] = {1: deque(), 2: deque()}
        self._tail_len = {1: 0, 2: 0}
        self.dropped = {1: 0, 2: 0}
        self._pending: list[bytes] = []
        self._pending_len = 0
        self._last_flush = -1e9
        self._timer: IDelayedCall | None = None
        self.closed = False

    # -- input -------------------------------------------------------------

    def feed(self, fd: int, data: bytes) -> None:
        """A read from the child's stdout (1) or stderr (2)."""
        if fd not in _PREFIX or self.closed:
            return
        partial = self._partial[fd]
        buf = partial + data if partial else data
        cut = buf.rfind(b"\n")
        if cut >= 0:
            block = buf[:cut]
            buf = buf[cut + 1 :]
            size = len(block) + 1
            # A line longer than max_line is cut into pieces below: the
            # kept start of a line joined with this read's end of it can be
            # one, and so can a line inside a read longer than max_line.
            first = block.find(b"\n")
            short = (first if first >= 0 else len(block)) <= self.max_line and (
                len(data) <= self.max_line
            )
            if short and size <= self._live[fd] and _NEEDS_JSON.search(block) is None:
                # Whole lines of plain text: their frames in one pass.
                self._live[fd] -= size
                frames = (
                    _PREFIX[fd] + block.replace(b"\n", _SUFFIX + _PREFIX[fd]) + _SUFFIX
                )
                if not self._pending and len(buf) <= self.max_line:
                    self._partial[fd] = buf
                    self._only(frames)
                    return
                self._add(frames)
            else:
                for line in block.split(b"\n"):
                    while len(line) > self.max_line:
                        piece = _between_characters(line, self.max_line)
                        self._line(fd, line[:piece], newline=False)
                        line = line[piece:]
                    self._line(fd, line)
        while len(buf) > self.max_line:
            cut = _between_characters(buf, self.max_line)
            self._line(fd, buf[:cut], newline=False)
            buf = buf[cut:]
        self._partial[fd] = buf
        self._queued()

    def _line(self, fd: int, line: bytes, newline: bool = True) -> None:
        """
        One line, or with ``newline`` false a piece of one that no newline
        ended (of a line too long to wait for, or the output's last): its
        event says so, for a client that puts the output back together.
        """
        if newline and line.endswith(b"\r"):
            line = line[:-1]
        size = len(line) + 1
        if size <= self._live[fd]:
            self._live[fd] -= size
            self._add(frame(STREAM_NAMES[fd], _line_event(line, newline)))
            return
        self._live[fd] = 0
        tail = self._tail[fd]
        tail.append((line, newline))
        self._tail_len[fd] += size
        while self._tail_len[fd] > self._tail_cap and tail:
            old, _ = tail.popleft()
            self._tail_len[fd] -= len(old) + 1
            self.dropped[fd] += len(old) + 1

    # -- output ------------------------------------------------------------

    def _add(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_len += len(data)

    def _only(self, data: bytes) -> None:
        """
        What :meth:`_add` then :meth:`_queued` do with the only frames of a
        read when nothing waits before them (the usual read), in one call:
        written now once the window has passed, else queued behind a timer
        (none is set while nothing waits).
        """
        now = self.clock.seconds()
        waited = now - self._last_flush
        if waited >= self.flush_seconds or len(data) >= self.flush_bytes:
            self._last_flush = now
            self.write(data)
            return
        self._add(data)
        self._timer = self.clock.callLater(self.flush_seconds - waited, self.flush)

    def _queued(self) -> None:
        if not self._pending:
            return
        waited = self.clock.seconds() - self._last_flush
        if self._pending_len >= self.flush_bytes or waited >= self.flush_seconds:
            self.flush()
        elif self._timer is None:
            self._timer = self.clock.callLater(self.flush_seconds - waited, self.flush)

    def flush(self) -> None:
        """Write whatever is pending as one write."""
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending.clear()
        self._pending_len = 0
        self._last_flush = self.clock.seconds()
        self.write(data)

    def event(self, name: str, data: Any) -> None:
        """Queue a non-line event (``truncated``, ``error``, ``exit``)."""
        self._add(frame(name, data))

    def finish(self) -> None:
        """The child's pipes are closed: last partial lines, then the kept tails."""
        for fd in (1, 2):
            if self._partial[fd]:
                self._line(fd, self._partial[fd], newline=False)
                self._partial[fd] = b""
        for fd in (1, 2):
            if self.dropped[fd] or self._tail[fd]:
                if self.dropped[fd]:
                    self.event(
                        "truncated",
                        {
                            "stream": STREAM_NAMES[fd],
                            "dropped_bytes": self.dropped[fd],
                        },
                    )
                for line, newline in self._tail[fd]:
                    self.event(STREAM_NAMES[fd], _line_event(line, newline))
                self._tail[fd].clear()

    def close(self) -> None:
        """No more writes (flushes first)."""
        self.flush()
        self.closed = True


class ChunkStream(LineStream):
    """
    Turns a child's output into SSE ``stdout``/``stderr`` events of raw
    bytes, ``{"data_base64"}``, each read as it came (no line splitting, no
    decoding), so a client can rebuild the output byte for byte (a tar
    archive, an image).  Each stream sends its first ``cap`` bytes; what
    is past it is counted and announced by a ``truncated`` event at the end.
    """

    def __init__(self, clock: Any, write: Callable[[bytes], None], cap: int) -> None:
        super().__init__(clock, write, cap)
        self._room = {1: cap, 2: cap}

    def feed(self, fd: int, data: bytes) -> None:
        """A read from the child's stdout (1) or stderr (2), sent as it is."""
        if fd not in _PREFIX or self.closed:
            return
        room = self._room[fd]
        if len(data) > room:
            self.dropped[fd] += len(data) - room
            data = data[:room]
        if data:
            self._room[fd] -= len(data)
            encoded = base64.b64encode(data).decode("ascii")
            self._add(frame(STREAM_NAMES[fd], {"data_base64": encoded}))
        self._queued()

    def finish(self) -> None:
        """The child's pipes are closed: say what the cap dropped."""
        for fd in (1, 2):
            if self.dropped[fd]:
                self.event(
                    "truncated",
                    {"stream": STREAM_NAMES[fd], "dropped_bytes": self.dropped[fd]},
                )
