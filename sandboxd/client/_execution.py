"""
A code execution's result document, assembled from its event stream.

``sb.code.execute`` reads the execution's events as they come (``stream:
true``) instead of waiting for the result document: each piece of output
is decoded while the kernel still prints, where the document is one JSON
value decoded whole once everything has crossed (for a big print, a
quarter of the call). The result is the document, field for field; where
the events cannot say what the document would (output cut to its head
and tail, events dropped from a slow reader's stream, an execution that
timed out or was lost), the caller fetches the document itself.
"""

from __future__ import annotations

import json
from typing import Any

#: The states whose events say all the document does. A ``timeout`` or
#: ``lost`` execution is read from its document, which holds the daemon's
#: own words on it (``[sandboxd] timeout ...``, the restart) as the
#: daemon wrote them, whatever of its events this client saw.
_PLAIN_STATES = ("ok", "error", "interrupted")

#: A display item's fields in the document (its event adds the execution's id).
_DISPLAY_FIELDS = ("data", "metadata", "is_result", "display_id", "refs")


#: Reads a JSON value from an index of a string, without slicing it out first.
_DECODER = json.JSONDecoder()


class EventSplitter:
    """
    Server-Sent Events from the bytes of a stream, as they arrive: each
    chunk is searched for line ends once (a big event's line is joined
    once, when its end arrives), and each event's ``data`` decoded from
    its line in place. ``httpx``'s text lines search and split the whole
    unfinished line again for every chunk that extends it, which for an
    execution's 256 KiB output events cost as much as decoding them.
    """

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._event = ""
        #: The event's ``data:`` lines, each with where its value starts.
        self._data: list[tuple[bytes, int]] = []

    def feed(self, chunk: bytes) -> list[tuple[str, Any]]:
        """The events ``chunk`` completes: ``(name, decoded data)`` each."""
        out: list[tuple[str, Any]] = []
        pos = 0
        while True:
            nl = chunk.find(b"\n", pos)
            if nl < 0:
                if pos < len(chunk):
                    self._parts.append(chunk[pos:] if pos else chunk)
                return out
            if self._parts:
                self._parts.append(chunk[pos:nl])
                line = b"".join(self._parts)
                self._parts = []
            else:
                line = chunk[pos:nl]
            pos = nl + 1
            self._line(line[:-1] if line.endswith(b"\r") else line, out)

    def _line(self, line: bytes, out: list[tuple[str, Any]]) -> None:
        if not line:
            if self._data or self._event:
                out.append((self._event or "message", self._decoded()))
            self._event, self._data = "", []
        elif line.startswith(b"data:"):
            self._data.append((line, 6 if line.startswith(b"data: ") else 5))
        elif line.startswith(b"event:"):
            self._event = line[6:].strip().decode("utf-8", "replace")

    def _decoded(self) -> Any:
        """The event's data, JSON-decoded (as text when it is not JSON)."""
        if len(self._data) == 1:
            line, start = self._data[0]
        else:
            line, start = b"\n".join(raw[at:] for raw, at in self._data), 0
        text = line.decode("utf-8", "surrogatepass")
        try:
            value, end = _DECODER.raw_decode(text, start)
        except ValueError:
            return text[start:]
        return value if not text[end:].strip() else text[start:]


class ExecutionEvents:
    """
    Takes one execution's events in order (:meth:`feed`) and gives its
    result document (:meth:`result`), or None when only the document can
    say it.
    """

    def __init__(self, context_id: str) -> None:
        self.context_id = context_id
        self.execution_id: str | None = None
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._results: list[dict[str, Any]] = []
        self._error: dict[str, Any] | None = None
        self._ended: dict[str, Any] | None = None
        #: Something seen that the document does not mirror.
        self._unsure = False
        #: A ``clear_output(wait=True)`` waiting for the next output.
        self._clear = False

    def _update(self, data: dict[str, Any]) -> None:
        """A display update: it replaces the items with its ``display_id``."""
        item = {k: data[k] for k in _DISPLAY_FIELDS if k in data}
        shown = item.get("display_id")
        found = False
        for i, old in enumerate(self._results):
            if shown and old.get("display_id") == shown:
                self._results[i] = {**item, "is_result": bool(old.get("is_result"))}
                found = True
        if not found:
            self._results.append(item)

    @property
    def ended(self) -> bool:
        """Whether ``execution.ended`` is in."""
        return self._ended is not None

    def feed(self, event: str, data: Any) -> None:
        """One event (its name and decoded ``data``)."""
        if not isinstance(data, dict):
            if event not in ("keepalive", "message"):
                self._unsure = True
            return
        if self.execution_id is None and isinstance(data.get("execution_id"), str):
            self.execution_id = data["execution_id"]
        if event in ("stdout", "stderr", "display", "display.update") and self._clear:
            self._stdout, self._stderr, self._results = [], [], []
            self._clear = False
        if event == "stdout":
            self._stdout.append(str(data.get("text", "")))
        elif event == "stderr":
            self._stderr.append(str(data.get("text", "")))
        elif event == "display":
            self._results.append({k: data[k] for k in _DISPLAY_FIELDS if k in data})
        elif event == "display.update":
            self._update(data)
        elif event == "clear_output":
            # As the daemon folds it into the document (and Jupyter into a
            # cell): gone now, or with the next output when told to wait.
            self._clear = True
            if not data.get("wait"):
                self._stdout, self._stderr, self._results = [], [], []
                self._clear = False
        elif event == "error":
            self._error = {
                "ename": data.get("ename", ""),
                "evalue": data.get("evalue", ""),
                "traceback": data.get("traceback") or [],
            }
        elif event == "execution.ended":
            self._ended = data
        elif event in ("gap", "context.restarted"):
            self._unsure = True

    def result(self) -> dict[str, Any] | None:
        """
        The result document, or None: not ended, or the document holds
        what the events do not (truncated output, dropped events, a
        ``timeout`` or ``lost`` state, text the daemon would have replaced).
        """
        end = self._ended
        if (
            end is None
            or self._unsure
            or self.execution_id is None
            or end.get("truncated")
            or end.get("state") not in _PLAIN_STATES
        ):
            return None
        stdout = "".join(self._stdout)
        stderr = "".join(self._stderr)
        if not (_plain(stdout) and _plain(stderr)):
            return None
        return {
            "execution_id": self.execution_id,
            "context_id": self.context_id,
            "state": end["state"],
            "started": end.get("started"),
            "execution_count": end.get("execution_count"),
            "stdout": stdout,
            "stderr": stderr,
            "results": self._results,
            "error": self._error,
            "duration_ms": end.get("duration_ms"),
            "truncated": end.get("truncated", False),
            "dropped_bytes": end.get("dropped_bytes", 0),
            "events_url": (
                f"/code/contexts/{self.context_id}"
                f"/executions/{self.execution_id}/events"
            ),
        }


def _plain(text: str) -> bool:
    """
    Whether ``text`` is valid Unicode text (the document replaces a lone
    surrogate, which an event passes on as it is).
    """
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
