# -*- test-case-name: tests.mcp.test_tools -*-
"""
:class:`CollectingChannel`: where a streaming handler writes when the MCP
door calls it, in place of the HTTP door's SSE channel.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred

from sandboxd.mcp.fitting import fitted
from sandboxd.policy import defaults
from sandboxd.policy.defaults import MCP_RESULT_BYTES

#: ``(new output as printed, bytes so far, "stdout" or "stderr")`` for a
#: call that asked for progress.
Progress = Callable[[str, int, str], None]


def command_text(
    stdout: str,
    stderr: str,
    exit_code: Any,
    error: dict[str, Any] | None = None,
    truncated: bool = False,
) -> str:
    """
    A command's result as a model reads it: the output, then what it must
    not miss (why it failed, that some output was left out) and the exit
    code, each on a line of its own in brackets.
    """
    text = stdout + (f"\n[stderr]\n{stderr}" if stderr else "")
    if error is not None:
        code = error.get("code") or error.get("type") or "error"
        text += f"\n[{code}: {error.get('message') or error.get('error') or ''}]"
    if truncated:
        text += "\n[truncated: the middle of the output was left out to fit one result]"
    return text + f"\n[exit_code {exit_code}]"


class CollectingChannel:
    """
    What an SSE handler writes into, in place of the HTTP door's
    :class:`~sandboxd.web.sse.SSEChannel`: it reads the frames back into
    events, keeps the output up to a bound, reports progress, and is
    "disconnected" when the call is cancelled.
    """

    def __init__(
        self,
        progress: Progress | None,
        lines: bool = True,
        cap: int = MCP_RESULT_BYTES,
    ) -> None:
        """
        :param lines: each ``stdout``/``stderr`` event is one line without
            its newline (``shell_stream``); else a chunk as printed (a
            process's output log).
        """
        self.lines = lines
        self.open = True
        self.client_gone = False
        self.done: Deferred[None] = Deferred()
        self.events_sent = 0
        self._progress = progress
        self._partial = b""
        self._callbacks: list[Callable[[], None]] = []
        self._cap = cap
        self.kept = 0
        self.seen = 0
        self.output: dict[str, list[str]] = {"stdout": [], "stderr": []}
        #: Output past the head: the latest, within what the cap leaves.
        self._tail: collections.deque[tuple[str, str, int]] = collections.deque()
        self._tail_bytes = 0
        self.dropped: dict[str, int] = {"stdout": 0, "stderr": 0}
        self.truncated = False
        self.exit_code: int | None = None
        self.error: dict[str, Any] | None = None
        self.gap: dict[str, Any] | None = None
        #: Events of other names (a template's own stream), in order,
        #: within the same cap as the output; None where not kept.
        self.events: list[dict[str, Any]] | None = None

    # -- the SSEChannel surface the handlers use --------------------------

    def send(self, event: str, data: Any, id: int | None = None) -> None:
        """One event (as ``SSEChannel.send``)."""
        if self.open:
            self._event(event, data)

    def write_raw(self, data: bytes | list[bytes]) -> None:
        """Pre-formatted frames, or one frame in parts (as ``SSEChannel.write_raw``)."""
        if not self.open:
            return
        self._partial += data if isinstance(data, bytes) else b"".join(data)
        *frames, self._partial = self._partial.split(b"\n\n")
        for frame in frames:
            self._frame(frame)

    def comment(self, text: str = "keep-alive") -> None:
        """Heartbeats mean nothing here."""

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` if the call is cancelled before the stream ends."""
        self._callbacks.append(callback)

    def register_producer(
        self, producer: Any, on_stop: Callable[[], None] | None = None
    ) -> None:
        """Nothing is ever paused: output past the cap is counted, not kept."""

    def close(self) -> None:
        """The stream is over."""
        if self.open:
            self.open = False
            self.done.callback(None)

    # -- cancellation ------------------------------------------------------

    def disconnect(self) -> None:
        """The call was cancelled: run the handler's disconnect callbacks."""
        if not self.open:
            return
        self.open = False
        self.client_gone = True
        for callback in self._callbacks:
            callback()
        self.done.callback(None)

    # -- reading events ----------------------------------------------------

    def _frame(self, frame: bytes) -> None:
        event = "message"
        data: list[str] = []
        for line in frame.decode("utf-8", "replace").split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            try:
                value = json.loads("\n".join(data))
            except ValueError:
                value = "\n".join(data)
            self._event(event, value)

    def _keep(self, event: str, text: str) -> None:
        """
        Keep one piece of output: the first half of the cap as the head,
        then the latest output within the rest as the tail (what a model
        needs is often the end: the error, the summary).
        """
        size = len(text.encode("utf-8", "surrogatepass"))
        self.seen += size
        if not self._tail and self.kept + size <= self._cap // 2:
            self.kept += size
            self.output[event].append(text)
        else:
            if size > self._cap // 2:
                text = text[-(self._cap // 4) :]
                self.truncated = True
                self.dropped[event] += size - len(text.encode("utf-8", "surrogatepass"))
                size = len(text.encode("utf-8", "surrogatepass"))
            self._tail.append((event, text, size))
            self._tail_bytes += size
            while self._tail and self._tail_bytes > self._cap - self.kept:
                old, _, gone = self._tail.popleft()
                self._tail_bytes -= gone
                self.dropped[old] += gone
                self.truncated = True
        if self._progress is not None:
            self._progress(text, self.seen, event)

    def joined(self, event: str) -> str:
        """One stream's kept output: its head, a mark if some was left out, its tail."""
        head = "".join(self.output[event])
        tail = "".join(text for name, text, _ in self._tail if name == event)
        if self.dropped[event]:
            mark = f"\n[... {self.dropped[event]} bytes left out ...]\n"
            return head + mark + tail
        return head + tail

    def _event(self, event: str, data: Any) -> None:
        self.events_sent += 1
        if event in ("stdout", "stderr") and isinstance(data, dict):
            line = str(data.get("data", ""))
            if self.lines and data.get("newline", True) is not False:
                line += "\n"
            self._keep(event, line)
        elif event == "exit" and isinstance(data, dict):
            self.exit_code = data.get("exit_code")
        elif event == "error" and isinstance(data, dict):
            self.error = data
        elif event == "gap" and isinstance(data, dict):
            self.gap = data
        elif self.events is not None:
            size = len(json.dumps(data, default=str)) + len(event)
            if self.kept + size > self._cap // 2:
                self.truncated = True
                return
            self.kept += size
            self.events.append({"event": event, "data": data})

    def result(self) -> dict[str, Any]:
        """
        The stream as one tool result, within :data:`MCP_RESULT_JSON_BYTES`
        as JSON: output that would take it past is cut to its head and
        tail (:func:`~sandboxd.mcp.fitting.fitted`) and the result says
        ``truncated``.
        """

        def build(pieces: dict[str, Any], cut: bool) -> dict[str, Any]:
            self.truncated = self.truncated or cut
            return self._answer(pieces["stdout"], pieces["stderr"])

        return fitted(
            build,
            {"stdout": self.joined("stdout"), "stderr": self.joined("stderr")},
            defaults.MCP_RESULT_JSON_BYTES,
        )

    def _answer(self, stdout: str, stderr: str) -> dict[str, Any]:
        structured: dict[str, Any] = {
            "stdout": stdout,
            "stderr": stderr,
            "exit_code": self.exit_code,
            "truncated": self.truncated,
            "event_count": self.events_sent,
        }
        if self.events is not None:
            structured["events"] = self.events
        if self.error is not None:
            # The stream's own error event, as it sent it.
            structured["error"] = self.error
        text = command_text(stdout, stderr, self.exit_code, self.error, self.truncated)
        if self.events:
            # What a template's stream said is its answer, not the
            # (absent) exit code.
            text = json.dumps(self.events, default=str)
        return {
            "content": [{"type": "text", "text": text}],
            "structuredContent": structured,
            "isError": self.error is not None,
        }
