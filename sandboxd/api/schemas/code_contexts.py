"""What the endpoints of code contexts and their executions take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, Event, F, Schema
from sandboxd.api.fragments import GAP, LAST_EVENT_ID, QUERY_TOKEN, RESUME

#: Code contexts (SPEC §22).
_CONTEXT = (
    F("id"),
    F("kernel"),
    F("language"),
    F("name", nullable=True),
    F("cwd"),
    F("user", nullable=True),
    F("state", enum=("starting", "idle", "busy", "restarting", "dead", "closed")),
    F("created_at", "number"),
    F("last_activity", "number"),
    F("execution_count", "integer"),
    F("pid", "integer", nullable=True),
    F("owner"),
    F("restarts", "integer"),
)


_RESULT = (
    F("execution_id"),
    F("context_id"),
    F(
        "state",
        enum=("queued", "running", "ok", "error", "interrupted", "timeout", "lost"),
    ),
    F(
        "started",
        "boolean",
        "false: the kernel never took the code (safe to retry); a lost execution"
        " the kernel was sent is true: it may have run",
    ),
    F("execution_count", "integer", nullable=True),
    F("stdout"),
    F("stderr"),
    F(
        "results",
        "array",
        "[{data: {mime: value}, metadata, is_result, refs?}]",
        items="object",
    ),
    F("error", "object", "{ename, evalue, traceback}", nullable=True),
    F("duration_ms", "number", nullable=True),
    F("truncated", "boolean"),
    F("dropped_bytes", "integer"),
    F("events_url"),
)


_CODE_EVENTS = (
    Event("execution.queued", "{execution_id, position}"),
    Event("execution.started", "{execution_id, execution_count}"),
    Event("stdout", "{execution_id, text}"),
    Event("stderr", "{execution_id, text}"),
    Event(
        "display",
        "{execution_id, data: {mime: value}, metadata, is_result, display_id?, refs?}",
    ),
    Event(
        "display.update",
        "{execution_id, data, metadata, is_result, display_id, refs?}: replaces "
        "the results shown with this display_id",
    ),
    Event(
        "clear_output",
        "{execution_id, wait}: what the execution showed is cleared (wait: "
        "when its next output arrives)",
    ),
    Event("error", "{execution_id, ename, evalue, traceback, traceback_text}"),
    Event("input.requested", "{execution_id, prompt, password}"),
    Event(
        "context.restarted", "{execution_id, reason: user|timeout|died|hub, exit_code?}"
    ),
    Event(
        "execution.ended",
        "{execution_id, state: ok|error|interrupted|timeout|lost, started, "
        "execution_count, duration_ms, truncated, dropped_bytes}: always last",
    ),
)


_NO_CONTEXT = E(404, "not_found", "unknown context or execution, or another identity's")


SCHEMAS: dict[str, Schema] = {
    "code_kernels": Schema(
        response=(
            F(
                "kernels",
                "array",
                "[{name, display_name, language, argv0, interrupt_mode, source, allowed}]",
                items="object",
            ),
            F("default", doc="the kernel a context gets when none is named"),
        ),
    ),
    "code_contexts_list": Schema(
        response=(F("contexts", "array", "context documents", items="object"),),
    ),
    "code_context_create": Schema(
        body=(
            F(
                "kernel",
                doc="a kernelspec name allowed by params.kernels",
                default="python3",
            ),
            F("language", doc="pick the first allowed kernel of this language"),
            F("cwd", doc="guarded; default base_dir"),
            F("env", "object", "environment of the kernel (env_deny applies)"),
            F("user", "any", "who the kernel runs as (params.users)"),
            F("name", doc="a label"),
        ),
        status=201,
        response=_CONTEXT,
        errors=(
            E(400, "invalid_param", "unknown or disallowed kernel (body: allowed)"),
            E(403, "param_not_allowed", "a refused user"),
            E(
                429,
                "too_many_contexts",
                "max_contexts or max_contexts_per_identity",
                "ResourceError",
            ),
            E(
                504,
                "timeout",
                "the kernel did not answer within start_timeout_seconds",
                "TimeoutError",
            ),
        ),
        notes="Waits for the kernel's kernel_info reply. The kernel runs in its own "
        "process group, as the request's user, without the daemon's secrets.",
    ),
    "code_context_get": Schema(
        response=(
            *_CONTEXT,
            F("current_execution", nullable=True),
            F("queued", "array", items="string"),
            F("exit_code", "integer", nullable=True),
        ),
        errors=(_NO_CONTEXT,),
    ),
    "code_context_delete": Schema(
        response=(F("id"), F("state", enum=("closed",))),
        errors=(_NO_CONTEXT,),
    ),
    "code_context_restart": Schema(
        response=_CONTEXT,
        errors=(_NO_CONTEXT,),
        notes="The kernel's whole process tree is killed; a running execution "
        "ends lost after context.restarted.",
    ),
    "code_context_interrupt": Schema(
        response=(F("id"), F("execution_id", nullable=True), F("state")),
        errors=(_NO_CONTEXT,),
    ),
    "code_execute": Schema(
        body=(
            F("code", required=True, example="print(1 + 1)"),
            F(
                "timeout",
                "number",
                "seconds; then interrupt, then restart",
                default=300,
            ),
            F("wait", "number", "seconds to wait for the result before 202"),
            F("stream", "boolean", "answer the events as SSE", default=False),
            F(
                "queue",
                "boolean",
                "wait behind a running execution (false: 409)",
                default=True,
            ),
            F("on_disconnect", enum=("continue", "interrupt"), default="continue"),
            F("env", "object", "set for this execution only (python and bash kernels)"),
            F(
                "allow_stdin",
                "boolean",
                "let input() ask (params.allow_stdin)",
                default=False,
            ),
            F("silent", "boolean", default=False),
            F("store_history", "boolean", default=True),
        ),
        response=_RESULT,
        events=_CODE_EVENTS,
        errors=(
            _NO_CONTEXT,
            E(403, "param_not_allowed", "allow_stdin or an env_deny name"),
            E(409, "context_busy", "busy and queue is false"),
            E(409, "context_dead", "the kernel died and was not restarted"),
            E(413, "payload_too_large", "code over max_request_bytes"),
            E(
                429,
                "too_many_executions",
                "max_queued executions wait",
                "ResourceError",
            ),
        ),
        notes="200 with the result when it ends within wait (default: its timeout), "
        "else 202 {execution_id, state, events_url}; with stream: true, SSE.",
    ),
    "code_executions_list": Schema(
        query=(F("state", doc="only executions in this state"),),
        response=(F("executions", "array", items="object"),),
        errors=(_NO_CONTEXT,),
    ),
    "code_execution_get": Schema(
        query=(F("wait", "number", "seconds to long-poll while it runs", default=0),),
        response=_RESULT,
        errors=(_NO_CONTEXT,),
    ),
    "code_execution_events": Schema(
        query=(
            *RESUME,
            F("follow", "boolean", "SSE (false: one JSON page)", default=True),
            F("limit", "integer", "page size", default=1000),
            QUERY_TOKEN,
        ),
        headers=(LAST_EVENT_ID,),
        produces="sse",
        events=(*_CODE_EVENTS, GAP),
        errors=(_NO_CONTEXT,),
    ),
    "code_execution_input": Schema(
        body=(F("value", required=True, example="42"),),
        response=(F("execution_id"),),
        errors=(
            _NO_CONTEXT,
            E(409, "already_resolved", "the execution is not waiting for input"),
        ),
    ),
    "code_output_get": Schema(
        produces="binary",
        errors=(_NO_CONTEXT,),
        notes="The bytes of a display item bigger than max_display_bytes, with its "
        "MIME type, X-Content-Type-Options: nosniff and Content-Security-Policy: sandbox.",
    ),
}
