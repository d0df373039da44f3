# -*- test-case-name: tests.mcp.test_tools,tests.mcp.test_door -*-
"""
One ``tools/call``: through the gate as its endpoint, into the endpoint's
own handler, and back as an MCP tool result (SPEC §17).

The handler is the one the HTTP door runs, given the same
:class:`~sandboxd.web.messages.ServerRequest`; what it answers is turned
into a result here instead of an HTTP response.  An event stream
(``shell_stream``, ``process_output`` with ``follow``) is read to its end
through a :class:`CollectingChannel`, which stands where the HTTP door's
SSE channel would: its disconnect is what a cancelled call triggers, so a
cancelled stream kills the child's process group exactly as a client that
leaves an HTTP stream does.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import json
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from sandboxd.access import gate
from sandboxd.access.tracing import trace_headers
from sandboxd.errors import (
    ApiError,
    bad_request,
    nonfinite_at,
    not_json,
    payload_too_large,
    unexpected,
    unsupported,
)
from sandboxd.files.lines import count_lines
from sandboxd.files.walk import display_name
from sandboxd.mcp.collecting import CollectingChannel, Progress, command_text
from sandboxd.mcp.fitting import fitted, result_size
from sandboxd.mcp.tools import (
    COMMAND_RESULTS,
    FILE_READS,
    IMAGES,
    LINE_STREAMS,
    ArgumentError,
    Tool,
    summarise,
)
from sandboxd.policy.defaults import (
    MCP_IMAGE_PIXELS,
    MCP_OUTPUT_BYTES,
    MCP_RESULT_BYTES,
    MCP_RESULT_JSON_BYTES,
)
from sandboxd.web.messages import (
    ServerRequest,
    ServerResponse,
    SSEResponse,
    StreamResponse,
)

log = Logger(namespace="sandboxd.mcp")

Headers = Mapping[bytes, Any]


def error_result(error: ApiError) -> dict[str, Any]:
    """
    A refusal or failure as a tool result: ``isError`` and the §6 body
    (a failed command's output in it cut to fit one result).
    """
    body = shown(error.body())
    body["status"] = error.status

    def build(pieces: dict[str, Any], cut: bool) -> dict[str, Any]:
        structured = {**pieces, "truncated": True} if cut else pieces
        text = json.dumps(structured, ensure_ascii=False)
        return {
            "content": [{"type": "text", "text": text}],
            "structuredContent": structured,
            "isError": True,
        }

    try:
        return fitted(build, body)
    except ApiError:
        brief: dict[str, Any] = {
            k: body[k] for k in ("error", "type", "code", "status") if k in body
        }
        return build(brief, True)


def shown(value: Any) -> Any:
    """
    ``value`` with each name that is not UTF-8 (a path the handler holds
    with ``surrogateescape``) shown as the file tools list it, ``\\xNN``
    per byte: a lone surrogate is no JSON a client's parser takes, and the
    tools take that spelling back (:func:`~sandboxd.mcp.tools.byte_names`).
    """
    if isinstance(value, str):
        return value if value.isascii() else display_name(value)
    if isinstance(value, dict):
        return {
            k: v if str(k).endswith("_base64") else shown(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [shown(v) for v in value]
    return value


#: A tool result's text rendering; a non-finite number raises ValueError
#: (Python would write ``NaN``, which is not JSON).
_TEXT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _text(value: Any) -> str:
    return _TEXT.encode(value)


def value_result(
    tool: Tool, value: Any, arguments: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """
    A handler's answer as a tool result: structured content plus text
    (summarised for the tools whose answers would flood a model's context),
    within :data:`MCP_RESULT_JSON_BYTES` as JSON: its biggest texts and
    lists are cut to fit (:func:`~sandboxd.mcp.fitting.fitted`), and it
    then says ``truncated``.
    """
    try:
        value = summarise(tool.name, value, arguments or {})
    except ArgumentError as e:
        raise bad_request(str(e)) from None
    structured = shown(value if isinstance(value, dict) else {"result": value})
    if tool.name in FILE_READS:
        read = _text_read(tool, structured)
        if read is not None:
            return read
    if tool.name in _BROWSER_FITS:
        result = _rendered(tool, structured, False)
        if result_size(result) > MCP_RESULT_JSON_BYTES or _too_tall(structured):
            return _BROWSER_FITS[tool.name](tool, structured)
        return result
    return fitted(lambda pieces, cut: _rendered(tool, pieces, cut), structured)


def _rendered(tool: Tool, structured: dict[str, Any], cut: bool) -> dict[str, Any]:
    """One result of ``structured``; ``cut`` when some of it was left out."""
    if cut:
        structured = {**structured, "truncated": True}
    content: list[dict[str, Any]] = []
    image = IMAGES.get(tool.name)
    if image is not None and isinstance(structured.get(image[0]), str):
        data = structured[image[0]]
        kind = structured.get(image[1]) or "png"
        content.append(
            {"type": "image", "data": data, "mimeType": f"image/{kind}"},
        )
        structured = {k: v for k, v in structured.items() if k != image[0]}
        structured["image"] = f"(image/{kind}, {len(data) * 3 // 4} bytes, as content)"
    elif tool.name in FILE_READS and isinstance(structured.get("content_base64"), str):
        data = structured["content_base64"]
        text = decoded_text(data, partial=cut)
        kind = None if text is not None or cut else image_type(data)
        if kind is not None:
            # A picture is shown to the model as one, not as base64 text.
            content.append({"type": "image", "data": data, "mimeType": kind})
            structured = {k: v for k, v in structured.items() if k != "content_base64"}
            structured["content"] = f"({kind}, {len(data) * 3 // 4} bytes, as content)"
        if text is not None:
            if cut:
                text += (
                    "\n[truncated: only the start of the file fits one result; "
                    "read on with offset and limit (lines)]"
                )
            content.append({"type": "text", "text": text})
    elif tool.name in COMMAND_RESULTS and isinstance(structured.get("stdout"), str):
        content.append(
            {
                "type": "text",
                "text": command_text(
                    structured["stdout"],
                    str(structured.get("stderr") or ""),
                    structured.get("exit_code"),
                    truncated=bool(structured.get("truncated")),
                ),
            }
        )
    elif tool.name in _TEXTS:
        rendered = _TEXTS[tool.name](structured)
        if rendered is not None:
            if structured.get("truncated"):
                rendered += "\n[truncated: part of it was left out to fit one result]"
            content.append({"type": "text", "text": rendered})
    # A result JSON cannot carry (a non-finite number) is the call's
    # failure, answered as a tool error, never a message that is not JSON.
    if not content:
        try:
            content.append({"type": "text", "text": _text(structured)})
        except ValueError:
            raise not_json(structured, "the tool's result") from None
    elif nonfinite_at(structured) is not None:
        raise not_json(structured, "the tool's result")
    return {"content": content, "structuredContent": structured, "isError": False}


def _text_read(tool: Tool, structured: dict[str, Any]) -> dict[str, Any] | None:
    """
    A ``download`` of UTF-8 text as a model reads it: the text once, as
    text content (``structuredContent`` says where it lies, without the
    same bytes again as base64), or None for bytes that are not text.

    Text that does not fit one result (:data:`MCP_RESULT_JSON_BYTES`) is
    cut at the end of a line, and ``lines``, ``more`` and ``next_offset``
    count what was given: a model that reads on from ``next_offset``
    skips nothing.  A note after the text says the same, as does one for
    an ``offset`` past the file's end (no text at all).
    """
    data = structured.get("content_base64")
    if not isinstance(data, str):
        return None
    try:
        raw = base64.b64decode(data, validate=True)
        raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    if b"\x00" in raw:
        return None
    rest = {k: v for k, v in structured.items() if k != "content_base64"}
    first = int(rest.get("offset") or 1)
    note = None
    if rest.get("lines") == 0 and isinstance(rest.get("total_lines"), int):
        note = (
            f"[no lines: offset {first} is past the end of the file, which has "
            f"{rest['total_lines']} lines]"
        )
    elif rest.get("more"):
        rest["next_offset"] = first + int(rest.get("lines") or 0)
    result = _text_result(raw.decode("utf-8"), rest, note)
    size = result_size(result)
    keep = len(raw)
    for _ in range(12):
        if size <= MCP_RESULT_JSON_BYTES:
            return result
        keep = min(keep - 1, int(keep * MCP_RESULT_JSON_BYTES / size * 0.97))
        result = _text_cut(raw, keep, first, rest)
        size = result_size(result)
    if size <= MCP_RESULT_JSON_BYTES:
        return result
    raise payload_too_large(
        MCP_RESULT_JSON_BYTES,
        message="the file's text does not fit one MCP tool result: read it "
        "with offset and limit (lines)",
    )


def _text_cut(
    raw: bytes, keep: int, first: int, rest: dict[str, Any]
) -> dict[str, Any]:
    """
    The result of the whole lines among ``raw``'s first ``keep`` bytes
    (or, when its first line alone is longer, that line's start).
    """
    total = rest.get("total_lines")
    if not isinstance(total, int):
        total = first - 1 + count_lines(raw)
    end = raw.rfind(b"\n", 0, max(0, keep)) + 1
    if end > 0:
        given = raw[:end].count(b"\n")
        text = raw[:end].decode("utf-8")
        next_offset = first + given
        note = (
            f"[truncated: lines {first}-{next_offset - 1} of {total} fit one "
            f"result; read on with offset {next_offset}]"
        )
    else:
        # One line longer than a result: its start, whole characters.
        head = raw[:keep]
        head = head[: len(head) - _cut_at_end(head)]
        given = 0
        text = head.decode("utf-8")
        next_offset = first + 1
        note = (
            f"[truncated: line {first} alone is longer than one result; its first "
            f"{len(head)} bytes are shown; the next line is offset {next_offset}]"
        )
    cut = {
        **rest,
        "offset": first,
        "lines": given,
        "total_lines": total,
        "more": True,
        "next_offset": next_offset,
        "truncated": True,
    }
    return _text_result(text, cut, note)


def _text_result(
    text: str, structured: dict[str, Any], note: str | None
) -> dict[str, Any]:
    content = [{"type": "text", "text": text}]
    if note is not None:
        content.append({"type": "text", "text": note})
    return {"content": content, "structuredContent": structured, "isError": False}


def _diff_text(structured: dict[str, Any]) -> str | None:
    """``git_diff`` as a model reads it: the patch, then a line of its counts."""
    diff = structured.get("diff")
    if not isinstance(diff, str):
        return None
    stats = structured.get("stats")
    counts = ""
    if isinstance(stats, dict):
        counts = (
            f"[{stats.get('files_changed', 0)} files changed, "
            f"+{stats.get('insertions', 0)} -{stats.get('deletions', 0)}]"
        )
    if not diff:
        return counts or "[no changes]"
    return diff + ("" if diff.endswith("\n") else "\n") + counts


def _person(who: Any) -> str:
    if not isinstance(who, dict):
        return ""
    when = who.get("time")
    stamp = ""
    if isinstance(when, int) and when:
        stamp = "  " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))
    return f"{who.get('name', '')} <{who.get('email', '')}>{stamp}"


def _show_text(structured: dict[str, Any]) -> str | None:
    """``git_show`` as ``git show`` prints it: the commit, its message, its patch."""
    commit = structured.get("commit")
    if not isinstance(commit, str):
        return None
    lines = [f"commit {commit}"]
    parents = structured.get("parents")
    if isinstance(parents, list) and len(parents) > 1:
        lines.append("Merge: " + " ".join(str(p)[:12] for p in parents))
    lines.append("Author: " + _person(structured.get("author")))
    lines.append("")
    message = str(structured.get("subject") or "")
    body = str(structured.get("body") or "").rstrip("\n")
    if body:
        message += "\n\n" + body
    lines.extend("    " + line for line in message.split("\n"))
    withheld = structured.get("withheld")
    if isinstance(withheld, list) and withheld:
        lines.append("")
        lines.append(
            "[withheld by policy: the changes of " + ", ".join(map(str, withheld)) + "]"
        )
    text = "\n".join(lines) + "\n"
    diff = structured.get("diff")
    if isinstance(diff, str) and diff:
        text += "\n" + diff
    return text


def _output_text(structured: dict[str, Any]) -> str | None:
    """
    A ``process_output`` page as a model reads it: the output as printed
    (a ``[stderr]`` line where it passes to stderr, ``[stdout]`` back),
    then the process's state and the ``after`` to read on from.
    """
    events = structured.get("events")
    if not isinstance(events, list):
        return None
    out: list[str] = []
    last = "stdout"
    for event in events:
        if not isinstance(event, dict):
            continue
        stream = str(event.get("stream") or "stdout")
        if stream != last:
            joined = out[-1] if out else ""
            out.append(
                ("\n" if joined and not joined.endswith("\n") else "") + f"[{stream}]\n"
            )
            last = stream
        out.append(str(event.get("data") or ""))
    text = "".join(out)
    if text and not text.endswith("\n"):
        text += "\n"
    if structured.get("dropped"):
        text += f"[dropped: {structured.get('dropped_bytes', 0)} bytes of older output are no longer kept]\n"
    state = structured.get("state")
    if structured.get("exit_code") is not None:
        text += f"[{state}: exit_code {structured['exit_code']}]"
    else:
        text += f"[{state}]"
    if structured.get("next") is not None:
        text += f"\n[next: {structured['next']}]"
    return text


#: Tools whose answer is mostly text a model reads, and how it is shown:
#: the text itself rather than one JSON string of escaped newlines
#: (``structuredContent`` keeps the answer as it is).
_TEXTS = {
    "git_diff": _diff_text,
    "git_show": _show_text,
    "process_output": _output_text,
}


def _fit_content(tool: Tool, structured: dict[str, Any]) -> dict[str, Any]:
    """
    A ``browser_content`` answer cut until its result fits
    :data:`MCP_RESULT_JSON_BYTES` (the page's text is in it twice, escaped):
    its start is kept, and ``truncated`` and ``next_offset`` say where to
    read on with ``offset``.
    """
    text = str(structured.get("content") or "")
    while True:
        text = text[: len(text) // 2]
        start = int(structured.get("offset") or 0)
        cut = {
            **structured,
            "content": text,
            "truncated": True,
            "next_offset": start + len(text.encode("utf-8", "replace")),
        }
        result = _rendered(tool, cut, False)
        if not text or result_size(result) <= MCP_RESULT_JSON_BYTES:
            return result


def _fit_console(tool: Tool, structured: dict[str, Any]) -> dict[str, Any]:
    """
    A ``browser_console`` answer with its oldest entries left out until
    it fits :data:`MCP_RESULT_JSON_BYTES`; ``dropped`` counts them.
    """
    logs = list(structured.get("logs") or [])
    dropped = int(structured.get("dropped") or 0)
    while True:
        half = len(logs) // 2 or len(logs)
        dropped += half
        logs = logs[half:]
        result = _rendered(
            tool, {**structured, "logs": logs, "dropped": dropped}, False
        )
        if not logs or result_size(result) <= MCP_RESULT_JSON_BYTES:
            return result


def _refuse_large(tool: Tool, structured: dict[str, Any]) -> dict[str, Any]:
    """A script's result no MCP message can carry: refused, as the HTTP door's 413 is."""
    raise payload_too_large(
        MCP_RESULT_JSON_BYTES,
        message="the script's result does not fit one MCP tool result "
        f"({MCP_RESULT_JSON_BYTES} bytes as JSON): return a part of it, e.g. "
        "JSON.stringify(value).slice(0, N)",
    )


def _too_tall(structured: dict[str, Any]) -> bool:
    """An image wider or taller than models take (a full page's screenshot)."""
    sides = (structured.get("width"), structured.get("height"))
    return any(isinstance(n, int) and n > MCP_IMAGE_PIXELS for n in sides)


def _refuse_image(tool: Tool, structured: dict[str, Any]) -> dict[str, Any]:
    """
    A screenshot no model takes (over :data:`MCP_IMAGE_PIXELS` a side) or
    no tool result carries: refused, saying how to take one that fits
    (the image is not scaled here: the daemon has no image library).
    """
    data = str(structured.get("image_base64") or "")
    raise payload_too_large(
        MCP_RESULT_JSON_BYTES,
        message=f"the screenshot is {structured.get('width')}x"
        f"{structured.get('height')} px, {len(data) * 3 // 4} bytes: over what "
        f"one MCP tool result carries ({MCP_RESULT_JSON_BYTES} bytes as JSON) or "
        f"a model takes ({MCP_IMAGE_PIXELS} px a side); take the viewport "
        "(full_page: false), one element (selector), or type: jpeg with a low "
        "quality",
        width=structured.get("width"),
        height=structured.get("height"),
    )


#: Browser tools whose answer may be any size, and how each is made to fit
#: one tool result (the official SDK refuses a message over 1 MiB).
_BROWSER_FITS = {
    "browser_screenshot": _refuse_image,
    "browser_content": _fit_content,
    "browser_console": _fit_console,
    "browser_evaluate": _refuse_large,
}


def raw_result(response: ServerResponse) -> dict[str, Any]:
    """
    A raw answer (``/metrics``' Prometheus text): text as text content, up
    to the result bound; anything else is refused as not a tool answer.
    """
    raw = response.raw or b""
    kind = next(
        (v for k, v in response.headers.items() if k.lower() == "content-type"),
        "application/octet-stream",
    )
    try:
        text = raw[:MCP_RESULT_BYTES].decode("utf-8")
    except UnicodeDecodeError:
        raise unsupported("this endpoint answers with binary bytes") from None
    structured = {
        "content_type": kind,
        "bytes": len(raw),
        "truncated": len(raw) > MCP_RESULT_BYTES,
    }
    return {
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": False,
    }


def decoded_text(data: str, partial: bool = False) -> str | None:
    """
    The UTF-8 text a base64 string holds, or None for binary data.

    :param partial: the bytes are a file's start: a character cut at their
        end is left out.
    """
    try:
        raw = base64.b64decode(data, validate=True)
        if partial:
            raw = raw[: len(raw) - _cut_at_end(raw)]
        text = raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return None if "\x00" in text else text


#: The first bytes of the image formats model APIs take, by MIME type.
_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def image_type(data: str) -> str | None:
    """The MIME type of a PNG, JPEG, GIF or WebP a base64 string holds, or None."""
    try:
        head = base64.b64decode(data[:24], validate=True)
    except (binascii.Error, ValueError):
        return None
    for magic, kind in _IMAGE_MAGIC:
        if head.startswith(magic):
            return kind
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def _cut_at_end(raw: bytes) -> int:
    """How many bytes at the end of ``raw`` begin a UTF-8 character it cuts."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII)
            need = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if need > back else 0
    return 0


class ToolCall:
    """
    One call in flight: admitted by the gate, running its handler, and
    cancellable (:meth:`cancel`) until its result is in.
    """

    def __init__(
        self,
        context: Any,
        tool: Tool,
        split: tuple[dict[str, str], dict[str, str], dict[str, Any]],
        headers: Headers,
        *,
        secure: bool,
        client: str,
        session_id: str,
        progress: Progress | None = None,
        trace_headers: Headers | None = None,
    ) -> None:
        self.context = context
        self.tool = tool
        self.split = split
        self.headers = headers
        #: Where the call's trace context is read (:func:`~sandboxd.access.tracing.with_meta_context`).
        self.trace_headers = headers if trace_headers is None else trace_headers
        self.secure = secure
        self.client = client
        self.session_id = session_id
        self.progress = progress
        self.channel: CollectingChannel | None = None
        self.pending: Deferred[Any] | None = None
        self.cancelled = False
        self.started = time.monotonic()
        #: What the handler noted for the audit line (``argv``), as on HTTP.
        self.audit_fields: dict[str, Any] = {}

    def cancel(self) -> None:
        """Stop the call as a client leaving its HTTP request would."""
        if self.cancelled:
            return
        self.cancelled = True
        if self.channel is not None:
            self.channel.disconnect()
        elif self.pending is not None:
            self.pending.cancel()

    def run(self) -> Deferred[dict[str, Any]]:
        """Admit, run and answer: fires with the tool result (never fails)."""
        return ensureDeferred(self._run())

    async def _run(self) -> dict[str, Any]:
        tool, endpoint = self.tool, self.tool.endpoint
        path_params, query, body = self.split
        path = _resolve(endpoint.path, path_params)
        if tool.name == "code_execute":
            from sandboxd.mcp.coderesult import CODE_EXECUTE_BODY

            # Stream the execution (stdout as progress) and interrupt it
            # when the call is cancelled.
            body = {**body, **CODE_EXECUTE_BODY}
        try:
            passed = gate.admit(
                self.context,
                endpoint,
                self.headers,
                secure=self.secure,
                path_params=path_params,
            )
        except gate.Refused as e:
            self._audit(e.identity, e.rule, path, e.error.status, e.error)
            return error_result(e.error)
        status, error = 200, None
        try:
            request = ServerRequest(
                method=endpoint.method,
                path=path,
                query=query,
                headers=trace_headers(self.trace_headers),
                body=body,
                path_params=path_params,
                identity=passed.identity,
                endpoint=endpoint,
                rule=passed.rule,
                context=self.context,
                raw=None,
                client=self.client,
                audit=self.audit_fields,
                output_bytes=MCP_OUTPUT_BYTES,
            )
            result = await self._answer(request)
            if result.get("isError"):
                structured = result.get("structuredContent") or {}
                status = int(structured.get("status", 500))
                error = (
                    ApiError.from_body(status, structured)
                    if structured.get("code")
                    else None
                )
            return result
        except CancelledError:
            status = 499
            error = None
            raise
        except ApiError as e:
            status, error = e.status, e
            return error_result(e)
        except Exception as e:
            error = unexpected(e)
            if error.status == 500:
                log.failure("tool {tool} failed", Failure(), tool=tool.name)
            status = error.status
            return error_result(error)
        finally:
            gate.release(self.context, passed)
            self._audit(passed.identity, passed.rule, path, status, error)

    async def _answer(self, request: ServerRequest) -> dict[str, Any]:
        handler = self.tool.endpoint.handler
        assert handler is not None
        value = handler(request)
        if inspect.iscoroutine(value):
            value = ensureDeferred(value)
        if isinstance(value, Deferred):
            self.pending = value
            value = await value
            self.pending = None
        if self.cancelled:
            raise CancelledError()
        if isinstance(value, ApiError):
            raise value
        if isinstance(value, ServerResponse):
            if value.raw is not None and value.body is None and value.status < 400:
                return raw_result(value)
            if value.raw is not None and value.body is None:
                raise unsupported("this endpoint answers with raw bytes")
            if value.status >= 400:
                body = value.body if isinstance(value.body, dict) else {}
                return error_result(ApiError.from_body(value.status, body))
            return value_result(
                self.tool,
                value.body if value.body is not None else {},
                request.body,
            )
        if isinstance(value, SSEResponse):
            return await self._collect(value)
        if isinstance(value, StreamResponse):
            raise unsupported("this endpoint answers with a streamed body")
        return value_result(self.tool, value if value is not None else {}, request.body)

    async def _collect(self, response: SSEResponse) -> dict[str, Any]:
        channel: CollectingChannel
        if self.tool.name == "code_execute":
            from sandboxd.mcp.coderesult import CodeCollector

            channel = CodeCollector(self.progress)
        else:
            channel = CollectingChannel(
                self.progress, lines=self.tool.name in LINE_STREAMS
            )
            if self.tool.endpoint.custom:
                # A template's events are its own: kept as sent.
                channel.events = []
        self.channel = channel
        if response.start is not None:
            started = response.start(channel)  # type: ignore[arg-type]
            if isinstance(started, Deferred):
                started.addErrback(lambda f: channel.close())
        else:
            # A template's generator too (the seed's usual custom stream):
            # pumped as the HTTP door pumps it, and stopped, its ``finally``
            # run, when the call is cancelled.
            from sandboxd.web.dispatch import pump_events

            pumped = pump_events(channel, response.event_iterator)
            pumped.addCallbacks(
                lambda _: channel.close(),
                lambda f: _source_failed(channel, f),
            )
        await channel.done
        flush = getattr(self.progress, "flush", None)
        if flush is not None:
            flush()
        if channel.client_gone:
            raise CancelledError()
        return channel.result()

    def _audit(
        self,
        identity: Any,
        rule: Any,
        path: str,
        status: int,
        error: ApiError | None,
    ) -> None:
        gate.audit(
            self.context,
            door=gate.Door.MCP,
            endpoint=self.tool.endpoint,
            identity=identity,
            rule=rule,
            method=self.tool.endpoint.method,
            path=path,
            # A name that is not UTF-8 as the HTTP door logs it: %NN.
            query=urllib.parse.urlencode(
                self.split[1], encoding="utf-8", errors="surrogateescape"
            ),
            status=status,
            code=str(error.code) if error is not None and error.code else None,
            decided_by=error.rule if error is not None else None,
            started=self.started,
            client=self.client,
            extra={
                "tool": self.tool.name,
                "mcp_session": self.session_id[:8],
                **self.audit_fields,
            },
            headers=self.trace_headers,
        )


def _resolve(template: str, params: Mapping[str, str]) -> str:
    """``/process/{pid}`` with its parameters filled in."""
    out = template
    for name, value in params.items():
        out = out.replace("{" + name + "}", value)
    return out


def _source_failed(channel: CollectingChannel, failure: Failure) -> None:
    """A stream's source raised: its ``error`` event ends what is collected."""
    if not failure.check(CancelledError) and channel.open:
        log.failure("event stream failed", failure)
        channel.send("error", unexpected(failure.value).event())
    channel.close()
