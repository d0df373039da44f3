# -*- test-case-name: tests.e2b.test_codeinterp -*-
"""
E2B's code-interpreter API on the E2B door (SPEC §22): ``POST /execute``
(NDJSON lines, one per output, ``end_of_execution`` last), ``GET|POST
/contexts``, ``POST /contexts/{id}/restart`` and ``DELETE /contexts/{id}``,
so ``e2b_code_interpreter.Sandbox.run_code`` and the seed SDK's
``agent_sandbox.code_interpreter`` run unchanged.

Each route is governed as the native endpoint doing the same job
(``code_execute``, ``code_contexts_list``, ``code_context_create``,
``code_context_restart``, ``code_context_delete``) and runs through its
handler's own functions, so limits, kernels, users and ownership are the
native ones. A client that disconnects interrupts the execution, as E2B's
server does; a context per language is made on first use.
"""

from __future__ import annotations

import datetime
from typing import Any

from twisted.internet.defer import ensureDeferred
from twisted.logger import Logger
from twisted.web.server import NOT_DONE_YET

from sandboxd.api.fields import F
from sandboxd.e2b.door import REST, Call, Procedure
from sandboxd.errors import ApiError, bad_request, internal, not_json
from sandboxd.eventlog import Event
from sandboxd.kernels.jsontext import text_object_parts
from sandboxd.policy.defaults import E2B_CODE_KEEPALIVE_SECONDS
from sandboxd.waiters import Waiters
from sandboxd.web import params
from sandboxd.web.jsonbody import json_bytes, line_safe
from sandboxd.web.messages import ServerResponse
from sandboxd.web.sending import write_chunk_now

log = Logger(namespace="sandboxd.e2b")

#: Jupyter MIME types to the fields of E2B's ``Result``; others go in ``extra``.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}


def _routes() -> Any:
    from sandboxd.routes import kernels

    return kernels


def _context_id(call: Call) -> str:
    parts = call.request.path.decode("latin-1").strip("/").split("/")
    return parts[1] if len(parts) >= 2 else ""


def _e2b_context(ctx: Any) -> dict[str, Any]:
    return {"id": ctx.id, "language": ctx.language or "python", "cwd": ctx.cwd}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def result_line(data: dict[str, Any]) -> dict[str, Any]:
    """A ``display`` event as E2B's ``result`` line."""
    out: dict[str, Any] = {
        "type": "result",
        "is_main_result": bool(data.get("is_result")),
    }
    extra: dict[str, Any] = {}
    for mime, value in (data.get("data") or {}).items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        elif field == "text" and _quoted(value):
            # As E2B's server: a str repr's quotes are not part of the text.
            out[field] = value[1:-1]
        else:
            out[field] = value
    if data.get("refs"):
        extra["sandboxd_refs"] = data["refs"]
    if extra:
        out["extra"] = extra
    return out


def _quoted(value: Any) -> bool:
    return isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == "'"


def lines_of(event: Event) -> list[dict[str, Any]]:
    """The E2B lines one execution event becomes (often none)."""
    data = event.data
    kind = event.event
    if kind in ("stdout", "stderr"):
        return [{"type": kind, "text": data.get("text", ""), "timestamp": _now()}]
    if kind == "display":
        return [result_line(data)]
    if kind == "error":
        return [
            {
                "type": "error",
                "name": data.get("ename", ""),
                "value": data.get("evalue", ""),
                "traceback": "\n".join(data.get("traceback") or []),
            }
        ]
    if kind == "execution.started":
        return [
            {
                "type": "number_of_executions",
                "execution_count": data.get("execution_count"),
            }
        ]
    if kind == "execution.ended":
        state = data.get("state")
        out: list[dict[str, Any]] = []
        if state == "lost" and data.get("reason") == "restarted":
            out.append(
                {
                    "type": "error",
                    "name": "ContextRestarting",
                    "value": "the context's kernel was restarted while this"
                    " execution waited its turn: it did not run (its state is"
                    " gone; send it again)",
                    "traceback": "",
                }
            )
        elif state == "lost":
            name, value = _LOST.get(data.get("reason"), _LOST[None])
            out.append({"type": "error", "name": name, "value": value, "traceback": ""})
        elif state == "timeout":
            out.append(
                {
                    "type": "error",
                    "name": "TimeoutError",
                    "value": "the execution ended timeout"
                    + (f" ({data['reason']})" if data.get("reason") else ""),
                    "traceback": "",
                }
            )
        out.append({"type": "end_of_execution"})
        return out
    return []


#: The error of an execution that ended without finishing, by why: the
#: name an E2B client reads and words a person can act on.
_LOST: dict[str | None, tuple[str, str]] = {
    "user": (
        "ContextRestarting",
        "the context was restarted while this code ran: it was stopped, and "
        "the context's state is gone",
    ),
    "died": (
        "ContextRestarting",
        "the context's kernel died while this code ran (it ran out of memory, "
        "or the code ended it): the context's state is gone",
    ),
    "closed": (
        "ContextClosed",
        "the context was removed, or the daemon stopped, while this code ran: "
        "it did not finish",
    ),
    None: (
        "ExecutionLost",
        "the context's kernel stopped answering while this code ran: it did not finish",
    ),
}


async def _target(call: Call, body: dict[str, Any]) -> Any:
    """
    The context an ``/execute`` runs in: named, or the language's default
    (made on first use, restarted if its kernel died).
    """
    routes = _routes()
    request = call.server_request()
    context_id = body.get("context_id")
    language = body.get("language")
    if context_id and language:
        raise bad_request("give context_id or language, not both")
    service = routes.service(request)
    if context_id:
        if not isinstance(context_id, str):
            raise bad_request("'context_id' must be a string")
        return service.get(context_id, call.identity)
    lang = str(language or "python").lower()
    key = (call.identity.root, lang)
    pending = service.e2b_pending.get(key)
    if pending is not None:
        # Calls that come while the default is being made share it: each
        # making its own would leave all but one holding a context slot
        # (and a kernel) nobody uses, and refuse the rest at the quota.
        return await pending.wait()
    cid = service.e2b_defaults.get(key)
    ctx = service.contexts.get(cid) if cid else None
    if ctx is not None and ctx.state not in ("closed", "dead"):
        return ctx
    waiters: Waiters[Any] = Waiters()
    service.e2b_pending[key] = waiters
    try:
        if ctx is not None and ctx.state == "dead":
            # Its kernel died and was not restarted: it is restarted now,
            # as E2B's server keeps its default contexts running (the
            # state is lost either way; the context keeps its id, cwd and
            # slot).  A new context beside it would leave the dead one
            # holding a slot of the identity's until the idle timeout.
            await ctx.restart("died")
        else:
            ctx = await routes.create_context(request, {"language": lang})
    except BaseException as e:
        # Those waiting get the same answer; the next call tries afresh.
        del service.e2b_pending[key]
        waiters.fail(e)
        raise
    del service.e2b_pending[key]
    service.e2b_defaults[key] = ctx.id
    waiters.fire(ctx)
    return ctx


def execute(call: Call, body: dict[str, Any]) -> Any:
    """
    ``POST /execute``: the execution's outputs as NDJSON, as they come.
    ``body`` is the request's JSON object, read and checked by the door.
    """
    d = ensureDeferred(_execute(call, body))

    def failed(failure: Any) -> None:
        error = failure.value if isinstance(failure.value, ApiError) else None
        if error is None:
            log.failure("sandboxd: e2b /execute failed", failure)
            error = internal("the execution failed")
        call.door.fail(call, error)

    d.addErrback(failed)
    return NOT_DONE_YET


async def _execute(call: Call, body: dict[str, Any]) -> None:
    routes = _routes()
    # Checked before the target: a refused call must not leave the
    # language's default context (and its kernel) started for it.
    code = params.string(body.get("code"), "code")
    env = params.string_map(body.get("env_vars") or None, "env_vars", None)
    ctx = await _target(call, body)
    native = {"code": code, "env": env}
    x = routes.new_execution(call.server_request(), ctx, native)
    if call.closed:
        ctx.abandon(x)
        call.done()
        return
    NdjsonStream(call, ctx, x)


#: Lines written together of at least this many bytes are sent from their
#: parts (:func:`~sandboxd.web.sending.write_chunk_now`), not joined first.
BIG_WRITE_BYTES = 64 * 1024


def _line(line: dict[str, Any]) -> list[bytes]:
    """
    One NDJSON line's JSON, in parts (a big output's text escaped from its
    bytes, never joined here: the lines written together are joined once).
    """
    big = text_object_parts(line)
    if big is not None:
        return [line_safe(part) for part in big]
    try:
        data = json_bytes(line)
    except ApiError:
        # A result JSON cannot carry (a non-finite number in display data):
        # the answer has begun, so the line says so as an error line the
        # SDK reads, rather than ``NaN``, which its JSON parser may refuse.
        data = json_bytes(
            {
                "type": "error",
                "name": "ValueError",
                "value": not_json(line, f"the {line.get('type')} line").message,
                "traceback": "",
            }
        )
    return [line_safe(data)]


def _gap_line(gap: tuple[int, int]) -> dict[str, Any]:
    """
    The ``stderr`` line that stands for events the execution's log let go
    before a slow client took them (E2B's lines have no gap of their own).
    """
    count = gap[1] - gap[0] + 1
    return {
        "type": "stderr",
        "text": f"\n[sandboxd] {count} outputs dropped here: this client read"
        " more slowly than the code printed, and the execution's log keeps"
        " only its newest output (max_event_bytes)\n",
        "timestamp": _now(),
    }


class NdjsonStream:
    """
    Writes one execution's events to an E2B client as NDJSON lines.

    It is the response's push producer: while the client's connection is
    full (a slow ``on_stdout``, a stalled network) it stops taking events,
    which wait in the execution's log, bounded by ``max_event_bytes`` as
    the native stream's are, and catches up from there when the client
    drains.  So what the daemon holds for a client that does not read is
    the log's bound, never the whole output; events the log let go
    meanwhile are said by one ``stderr`` line, as E2B has no gap line.
    """

    def __init__(self, call: Call, ctx: Any, x: Any) -> None:
        self.call = call
        self.ctx = ctx
        self.x = x
        self.sent = 0
        self.over = False
        self.paused = False
        #: The kernel's error line, kept back until the execution ends
        #: (see :meth:`_lines`).
        self._error: dict[str, Any] | None = None
        request = call.request
        request.setResponseCode(200)
        request.setHeader(b"content-type", b"application/x-ndjson")
        request.setHeader(b"cache-control", b"no-cache")
        self.clock = call.context.reactor
        self._beat = self.clock.callLater(E2B_CODE_KEEPALIVE_SECONDS, self._keepalive)
        self._unsubscribe = x.log.subscribe(self._on_event)
        self._producing = False
        call.on_close(self._gone)
        if call.hold(self._revoked):
            request.registerProducer(self, True)
            self._producing = True
            self._pump()

    def _write(self, lines: list[dict[str, Any]]) -> None:
        if not lines or self.call.closed:
            return
        parts: list[bytes] = []
        for line in lines:
            parts += _line(line)
            parts.append(b"\n")
        self._send(parts)

    def _send(self, parts: list[bytes]) -> None:
        size = sum(len(part) for part in parts)
        self.call.bytes_out += size
        if size >= BIG_WRITE_BYTES:
            # A big output's parts go to the socket as they are.
            write_chunk_now(self.call.request, parts)
        else:
            self.call.request.write(b"".join(parts))
        if self._beat.active():
            self._beat.reset(E2B_CODE_KEEPALIVE_SECONDS)

    def _keepalive(self) -> None:
        if self.over or self.call.closed:
            return
        if not self.paused:
            # A paused client has not read what it was sent: nothing to add.
            self._write([{"type": "keepalive"}])
        self._beat = self.clock.callLater(E2B_CODE_KEEPALIVE_SECONDS, self._keepalive)

    def _on_event(self, event: Event | None) -> None:
        if not self.paused:
            self._pump()

    def _pump(self) -> None:
        """
        Send the events after the last sent, in writes of about
        :data:`BIG_WRITE_BYTES`, until the client's connection is full.
        """
        if self.over:
            return
        gap, events = self.x.log.since(self.sent)
        parts: list[bytes] = []
        size = 0
        if gap is not None:
            parts += _line(_gap_line(gap))
            parts.append(b"\n")
        for event in events:
            if self.call.closed:
                return
            self.sent = event.seq
            for line in self._lines(event):
                for part in _line(line):
                    parts.append(part)
                    size += len(part)
                parts.append(b"\n")
            if size >= BIG_WRITE_BYTES:
                self._send(parts)
                parts, size = [], 0
                if self.paused:
                    # The write filled the connection: the rest waits in
                    # the log for resumeProducing, not in the transport.
                    return
        if parts and not self.call.closed:
            self._send(parts)
        if self.x.log.closed and self.x.log.last_seq <= self.sent:
            self._finish()

    def _lines(self, event: Event) -> list[dict[str, Any]]:
        """
        The lines of ``event``, the kernel's error kept back to the end:
        E2B's SDK keeps only the last error line it reads, and an execution
        that times out would otherwise end with a bare ``TimeoutError``
        after the kernel's ``KeyboardInterrupt``, whose traceback shows
        where the code was stuck.  Ended ``timeout``, the one error line is
        the ``TimeoutError`` carrying that traceback.
        """
        lines = lines_of(event)
        if event.event == "error":
            held, self._error = self._error, lines[0]
            return [held] if held is not None else []
        if event.event != "execution.ended" or self._error is None:
            return lines
        held, self._error = self._error, None
        if event.data.get("state") == "timeout" and lines[0]["type"] == "error":
            said = ": ".join(part for part in (held["name"], held["value"]) if part)
            lines[0]["value"] += f" ({said})" if said else ""
            lines[0]["traceback"] = held["traceback"]
            return lines
        return [held, *lines]

    def pauseProducing(self) -> None:
        """The client's connection is full: events wait in the log."""
        self.paused = True

    def resumeProducing(self) -> None:
        """The client drained: catch up from the log."""
        if self.paused:
            self.paused = False
            self._pump()

    def stopProducing(self) -> None:
        """The client left: :meth:`_gone` (by the call's close) lets go."""

    def _unregister(self) -> None:
        if self._producing:
            self._producing = False
            if self.call.request.channel is not None:
                self.call.request.unregisterProducer()

    def _finish(self) -> None:
        self.over = True
        self._unsubscribe()
        if self._beat.active():
            self._beat.cancel()
        self._unregister()
        if not self.call.closed:
            self.call.request.finish()
        self.call.done()

    def _revoked(self, error: ApiError) -> None:
        """
        A policy reload no longer lets the caller in: an error line says
        why, and the execution is interrupted, as when its client leaves.
        """
        if self.over:
            return
        self._write(
            [
                {
                    "type": "error",
                    "name": "PermissionError",
                    "value": error.message,
                    "traceback": "",
                }
            ]
        )
        if self.call.error is None:
            self.call.error = error
        self._gone()
        if not self.call.closed:
            self.call.request.finish()
        self.call.done()

    def _gone(self) -> None:
        """The client left: E2B's semantics, the execution is interrupted."""
        if self.over:
            return
        self.over = True
        self._unsubscribe()
        if self._beat.active():
            self._beat.cancel()
        self._unregister()
        self.ctx.abandon(self.x)


async def _create(call: Call, body: dict[str, Any]) -> dict[str, Any]:
    native: dict[str, Any] = {"language": str(body.get("language") or "python").lower()}
    if body.get("cwd"):
        native["cwd"] = body["cwd"]
    ctx = await _routes().create_context(call.server_request(), native)
    return _e2b_context(ctx)


def create(call: Call, body: dict[str, Any]) -> Any:
    """``POST /contexts {language?, cwd?}`` → ``{id, language, cwd}``."""
    return ensureDeferred(_create(call, body))


def list_contexts(call: Call, _: Any) -> Any:
    """``GET /contexts`` → ``[{id, language, cwd}]`` (the caller's)."""
    service = _routes().service(call.server_request())
    return [_e2b_context(c) for c in service.visible(call.identity)]


async def _restart(call: Call) -> int:
    service = _routes().service(call.server_request())
    ctx = service.get(_context_id(call), call.identity)
    await ctx.restart("user")
    return 204


def restart(call: Call, _: Any) -> Any:
    """``POST /contexts/{id}/restart``: a fresh kernel."""
    return ensureDeferred(_restart(call))


async def _delete(call: Call) -> int:
    service = _routes().service(call.server_request())
    ctx = service.get(_context_id(call), call.identity)
    await service.remove(ctx)
    return 204


def delete(call: Call, _: Any) -> Any:
    """``DELETE /contexts/{id}``."""
    return ensureDeferred(_delete(call))


def output(call: Call, _: Any) -> Any:
    """
    ``GET /code/contexts/{id}/outputs/{oid}``: a spilled display item, as
    ``code_output_get`` serves it on the HTTP port.  A result line's
    ``extra.sandboxd_refs`` carries that path: an E2B client, which has
    this port only, fetches it here.
    """
    parts = call.request.path.decode("latin-1").strip("/").split("/")
    request = call.server_request(path_params={"cid": parts[2], "oid": parts[4]})

    def send(response: ServerResponse) -> None:
        raw = call.request
        raw.setResponseCode(response.status)
        call.status = response.status
        for name, value in response.headers.items():
            raw.setHeader(name.encode(), value.encode())
        body = response.raw or b""
        call.bytes_out = len(body)
        raw.write(body)
        raw.finish()
        call.done()

    def failed(failure: Any) -> None:
        error = failure.value if isinstance(failure.value, ApiError) else None
        if error is None:
            log.failure("sandboxd: e2b output read failed", failure)
            error = internal("the output could not be read")
        call.door.fail(call, error)

    _routes().code_output_get(request).addCallbacks(send, failed)
    return NOT_DONE_YET


#: What ``POST /execute`` reads.
EXECUTE_FIELDS = (
    F("code"),
    F("language"),
    F("context_id"),
    F("env_vars", "object"),
)

#: What ``POST /contexts`` reads.
CONTEXT_FIELDS = (F("language"), F("cwd"))

PROCEDURES = {
    "POST /execute": Procedure(
        "POST /execute", REST, "code_execute", execute, fields=EXECUTE_FIELDS
    ),
    "GET /contexts": Procedure(
        "GET /contexts", REST, "code_contexts_list", list_contexts
    ),
    "POST /contexts": Procedure(
        "POST /contexts", REST, "code_context_create", create, fields=CONTEXT_FIELDS
    ),
    "POST /contexts/{id}/restart": Procedure(
        "POST /contexts/{id}/restart", REST, "code_context_restart", restart
    ),
    "DELETE /contexts/{id}": Procedure(
        "DELETE /contexts/{id}", REST, "code_context_delete", delete
    ),
    "GET /code/contexts/{id}/outputs/{oid}": Procedure(
        "GET /code/contexts/{id}/outputs/{oid}", REST, "code_output_get", output
    ),
}
