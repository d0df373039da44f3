# -*- test-case-name: tests.mcp.test_code -*-
"""
``code_execute`` as an MCP tool (SPEC §22): the execution's events are
read to their end, stdout and stderr reported as progress while they come,
and the answer is text (output, the error's traceback) plus one ``image``
content per PNG or JPEG the code displayed; ``structuredContent`` is the
native result document's shape. A cancelled call interrupts the execution
(the tool asks for ``on_disconnect: interrupt``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from sandboxd.mcp.collecting import CollectingChannel, Progress
from sandboxd.mcp.fitting import head_and_tail, result_size
from sandboxd.policy import defaults
from sandboxd.policy.defaults import MCP_RESULT_BYTES

#: What the MCP door adds to a ``code_execute`` call's body.
CODE_EXECUTE_BODY = {"stream": True, "on_disconnect": "interrupt"}

#: Display MIME types sent as MCP ``image`` content.
IMAGE_TYPES = ("image/png", "image/jpeg")

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class CodeCollector(CollectingChannel):
    """Collects one execution's events into an MCP tool result."""

    def __init__(self, progress: Progress | None, cap: int = MCP_RESULT_BYTES) -> None:
        super().__init__(progress, lines=False, cap=cap)
        self.results: list[dict[str, Any]] = []
        self.code_error: dict[str, Any] | None = None
        self.ended: dict[str, Any] = {}
        self.result_bytes = 0

    def _event(self, event: str, data: Any) -> None:
        self.events_sent += 1
        if not isinstance(data, dict):
            return
        if event in ("stdout", "stderr"):
            self._keep(event, str(data.get("text", "")))
        elif event in ("display", "display.update"):
            item = {
                k: data[k]
                for k in ("data", "metadata", "is_result", "refs")
                if k in data
            }
            size = sum(len(str(v)) for v in (item.get("data") or {}).values())
            if self.result_bytes + size <= 4 * self._cap:
                self.result_bytes += size
                self.results.append(item)
            else:
                self.truncated = True
        elif event == "error":
            self.code_error = {k: data.get(k) for k in ("ename", "evalue", "traceback")}
        elif event == "execution.ended":
            self.ended = data
        elif event == "gap":
            self.gap = data

    def result(self) -> dict[str, Any]:
        """
        Text, images, and the result document, within
        :data:`~sandboxd.policy.defaults.MCP_RESULT_JSON_BYTES` as JSON (the
        official SDK refuses a bigger message): the biggest piece goes
        first, a display value (named in its place, its ``refs`` kept) or
        the output (its head and tail kept, cut in proportion to how far
        the result is over), until it fits; the result then says
        ``truncated``.
        """
        stdout = self.joined("stdout")
        stderr = self.joined("stderr")
        left_out: set[tuple[int, str]] = set()
        bound = defaults.MCP_RESULT_JSON_BYTES
        for _ in range(64):
            answer = self._code_answer(stdout, stderr, left_out)
            size = result_size(answer)
            if size <= bound:
                return answer
            self.truncated = True
            value = self._largest_value(left_out)
            output = len(stdout) + len(stderr)
            if value is not None and value[0] >= output:
                left_out.add(value[1])
            elif output > 256:
                ratio = min(bound / size * 0.97, 0.9)
                stdout = head_and_tail(stdout, int(len(stdout) * ratio))
                stderr = head_and_tail(stderr, int(len(stderr) * ratio))
            elif self.code_error is not None and self._cut_error():
                continue
            else:
                break
        return self._code_answer(stdout, stderr, left_out)

    def _largest_value(
        self, left_out: set[tuple[int, str]]
    ) -> tuple[int, tuple[int, str]] | None:
        """The size and place of the biggest display value still in."""
        best: tuple[int, tuple[int, str]] | None = None
        for index, item in enumerate(self.results):
            for mime, value in (item.get("data") or {}).items():
                size = len(value) if isinstance(value, str) else len(json.dumps(value))
                if (index, mime) not in left_out and (best is None or size > best[0]):
                    best = (size, (index, mime))
        return best

    def _cut_error(self) -> bool:
        """Halve the error's value and traceback; False when nothing is left."""
        assert self.code_error is not None
        evalue = str(self.code_error.get("evalue") or "")
        traceback = [str(line) for line in self.code_error.get("traceback") or []]
        if not evalue and not any(traceback):
            return False
        self.code_error["evalue"] = evalue[: len(evalue) // 2]
        self.code_error["traceback"] = [line[: len(line) // 2] for line in traceback]
        return True

    def _code_answer(
        self, stdout: str, stderr: str, left_out: set[tuple[int, str]]
    ) -> dict[str, Any]:
        state = self.ended.get("state", "lost")
        structured: dict[str, Any] = {
            "execution_id": self.ended.get("execution_id"),
            "state": state,
            "started": self.ended.get("started"),
            "execution_count": self.ended.get("execution_count"),
            "stdout": stdout,
            "stderr": stderr,
            "results": [],
            "error": self.code_error,
            "duration_ms": self.ended.get("duration_ms"),
            "truncated": self.truncated or bool(self.ended.get("truncated")),
        }
        content: list[dict[str, Any]] = []
        text = stdout + (f"\n[stderr]\n{stderr}" if stderr else "")
        for index, item in enumerate(self.results):
            data = dict(item.get("data") or {})
            for mime, value in data.items():
                size = len(value) if isinstance(value, str) else len(json.dumps(value))
                if (index, mime) in left_out:
                    data[mime] = (
                        f"({mime}, {size} characters, left out: too big for one result)"
                    )
                elif mime in IMAGE_TYPES and isinstance(value, str):
                    content.append(
                        {"type": "image", "data": value.strip(), "mimeType": mime}
                    )
                    data[mime] = f"({mime}, {len(value) * 3 // 4} bytes, as content)"
            plain = data.get("text/plain")
            if item.get("is_result") and isinstance(plain, str):
                text += ("\n" if text and not text.endswith("\n") else "") + plain
            structured["results"].append({**item, "data": data})
        if self.code_error is not None:
            tb = "\n".join(self.code_error.get("traceback") or [])
            text += "\n" + (
                _ANSI.sub("", tb)
                or f"{self.code_error.get('ename')}: {self.code_error.get('evalue')}"
            )
        if structured["truncated"]:
            text += "\n[truncated: output or values were left out to fit one result]"
        text += f"\n[{state}]"
        content.insert(0, {"type": "text", "text": text.lstrip("\n")})
        return {
            "content": content,
            "structuredContent": structured,
            "isError": state != "ok",
        }
