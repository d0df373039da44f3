# -*- test-case-name: tests.mcp.test_tools -*-
"""
:class:`CollectingChannel`: where a streaming handler writes when the MCP
door calls it, in place of the HTTP door's SSE channel.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred

from sandboxd.policy import defaults
from sandboxd.policy.defaults import MCP_RESULT_BYTES

#: ``(new output, bytes so far)`` for a call that asked for progress.
Progress = Callable[[str, int], None]


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
        self.truncated = False
        self.exit_code: int | None = None
        self.error: dict[str, Any] | None = None
        self.gap: dict[str, Any] | None = None

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

    def _event(self, event: str, data: Any) -> None:
        self.events_sent += 1
        if event in ("stdout", "stderr") and isinstance(data, dict):
            line = str(data.get("data", ""))
            if self.lines and data.get("newline", True) is not False:
                line += "\n"
            size = len(line.encode("utf-8"))
            self.seen += size
            if self.kept + size <= self._cap:
                self.kept += size
                self.output[event].append(line)
            else:
                self.truncated = True
            if self._progress is not None:
                self._progress(line.removesuffix("\n"), self.seen)
        elif event == "exit" and isinstance(data, dict):
            self.exit_code = data.get("exit_code")
        elif event == "error" and isinstance(data, dict):
            self.error = data
        elif event == "gap" and isinstance(data, dict):
            self.gap = data

    def result(self) -> dict[str, Any]:
        """
        The stream as one tool result, within :data:`MCP_RESULT_JSON_BYTES`
        as JSON: output that would take it past is cut (its start kept) and
        the result says ``truncated``.
        """
        stdout = "".join(self.output["stdout"])
        stderr = "".join(self.output["stderr"])
        while True:
            answer = self._answer(stdout, stderr)
            if (stdout or stderr) and len(
                json.dumps(answer)
            ) > defaults.MCP_RESULT_JSON_BYTES:
                self.truncated = True
                stdout, stderr = stdout[: len(stdout) // 2], stderr[: len(stderr) // 2]
                continue
            return answer

    def _answer(self, stdout: str, stderr: str) -> dict[str, Any]:
        structured: dict[str, Any] = {
            "stdout": stdout,
            "stderr": stderr,
            "exit_code": self.exit_code,
            "truncated": self.truncated,
            "event_count": self.events_sent,
        }
        if self.error is not None:
            # The stream's own error event, as it sent it.
            structured["error"] = self.error
        text = structured["stdout"] + (
            f"\n[stderr]\n{structured['stderr']}" if structured["stderr"] else ""
        )
        text += f"\n[exit_code {self.exit_code}]"
        return {
            "content": [{"type": "text", "text": text}],
            "structuredContent": structured,
            "isError": self.error is not None,
        }
