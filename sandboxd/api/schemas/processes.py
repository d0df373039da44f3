"""What the endpoints of one-shot commands, shells and managed processes take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, Event, F, Schema
from sandboxd.api.fragments import CHILD, GAP, GUARD, LAST_EVENT_ID, RESUME

_COMMAND = (
    F(
        "command",
        doc="the command line (shlex-split, no shell)",
        required=True,
        min_length=1,
        example="ls -la",
    ),
    F("shell", doc="run as [shell, -c, command] (params.shells)", enum=("bash", "sh")),
)


_CHILD_ERRORS = (
    E(400, "invalid_param", "bad command, cwd, env, user or timeout"),
    E(403, "command_not_allowed", "allow_commands or deny_commands refused it"),
    E(403, "param_not_allowed", "shell or user refused by params"),
    E(
        403,
        "path_not_allowed",
        "cwd outside base_dir or paths.allow, or a link leading out; a program "
        "named by a path below /proc, /sys or /dev, or a link there",
    ),
    *GUARD[3:],
    E(503, "unavailable", "the daemon is shutting down"),
)


_QUERY_TOKEN_FOLLOW = F(
    "access_token",
    doc="with follow=true only: the token, for EventSource (it cannot set headers)",
)


_PROC_FIELDS = (
    F("pid", "integer"),
    F("command"),
    F("tag", doc="the label given at start, or null", nullable=True),
    F("state", enum=("running", "exited")),
    F("started_at", "number", "Unix time"),
    F(
        "exit_code",
        "integer",
        "null while running; -N when killed by signal N",
        nullable=True,
    ),
    F("timed_out", "boolean", "ended on its timeout or idle_timeout"),
    F("stdin", "boolean", "whether a stdin pipe is open"),
    F(
        "leftovers",
        "integer",
        "exited: how many processes it left running; null while running",
        nullable=True,
    ),
)


#: What /shell and /shell/stream do with a job the command leaves running.
_BACKGROUND_JOBS = (
    "The answer comes once the command exits and its output goes quiet (0.1 s, "
    "at most 2 s): a job it leaves running (`cmd &`, `nohup`, `setsid`, a "
    "daemon) is not waited for, ended, listed or reported, and has no pid to "
    "signal; its output pipes are closed then, so a write after that fails "
    "(SIGPIPE ends a job that does not handle it). The timeout does not "
    "apply to it once the command has exited. Start what should outlive the "
    "call with process_start (listed, signallable, its output kept, "
    "leftovers counted); stopping the daemon ends every job either way."
)


SCHEMAS: dict[str, Schema] = {
    "shell": Schema(
        body=(*_COMMAND, *CHILD, F("timeout", "number", "seconds", default=300)),
        response=(
            F("stdout"),
            F("stderr"),
            F("exit_code", "integer", "-N when killed by signal N"),
            F(
                "truncated",
                "boolean",
                "output went over max_output_bytes (head and tail kept)",
            ),
            F("dropped_bytes", "integer"),
        ),
        errors=(
            *_CHILD_ERRORS,
            E(
                500,
                "timeout",
                "past timeout: the group was killed (output so far included); "
                "the command ran, so do not retry it",
                "TimeoutError",
            ),
            E(
                500,
                "idle_timeout",
                "no output for idle_timeout seconds (the command ran: do not retry)",
                "TimeoutError",
            ),
        ),
        notes="stdin is /dev/null. Output per stream is capped at max_output_bytes "
        "(10 MiB), keeping head and tail. A timeout is 500 (as the agent-sandbox "
        "server answers it), but "
        "the command did run: a client must not retry on it as on a server "
        "failure (check `code`). " + _BACKGROUND_JOBS,
    ),
    "shell_stream": Schema(
        body=(
            *_COMMAND,
            *CHILD,
            F("timeout", "number", "seconds", default=300),
            F(
                "output",
                doc="lines: one event per line, as text; bytes: one event per "
                "read, the raw bytes in data_base64 (byte-exact)",
                enum=("lines", "bytes"),
                default="lines",
            ),
            F(
                "stdin_base64",
                doc="bytes the command reads on its stdin, then end of file "
                "(default: stdin is /dev/null)",
            ),
        ),
        produces="sse",
        events=(
            Event(
                "stdout",
                '{"data": one line without its newline (U+FFFD for bytes that '
                "are not UTF-8; a line over 64 KiB comes in pieces, each cut "
                'between characters), "newline": false when none followed it '
                "(such a piece, or output's last line without one)}, or with "
                "output=bytes "
                '{"data_base64": the bytes of one read}',
            ),
            Event("stderr", "as stdout"),
            Event(
                "truncated",
                '{"stream", "dropped_bytes"}: the output went over max_output_bytes',
            ),
            Event(
                "error",
                '{"error": "timeout", "type", "code", "message"}: TimeoutError '
                "with code timeout or idle_timeout, sent before exit",
            ),
            Event("exit", '{"exit_code"}: always last'),
        ),
        errors=_CHILD_ERRORS,
        notes="stdout and stderr are interleaved in the order produced. Not resumable: "
        "a client that disconnects kills the child's group. Invalid requests get a "
        "JSON error, not a stream. " + _BACKGROUND_JOBS,
    ),
    "process_start": Schema(
        body=(
            *_COMMAND,
            *CHILD,
            F("stdin", "boolean", "keep a stdin pipe for process_stdin", default=False),
            F(
                "capture_output",
                "boolean",
                "true: output may be read with since/wait (agent-sandbox-server's form); "
                "false: process_output refuses it (409); unset: the after form only",
            ),
            F("tag", doc="a free label; process_list filters on it"),
            F("timeout", "number", "seconds (default: none)"),
        ),
        response=(F("pid", "integer"), F("command"), F("tag", nullable=True)),
        errors=(
            *_CHILD_ERRORS,
            E(
                429,
                "too_many_processes",
                "max_processes (100) are running, or the caller's share of "
                "them (max_per_identity)",
                "ResourceError",
            ),
        ),
    ),
    "process_list": Schema(
        query=(F("tag", doc="only processes with this tag"),),
        response=(
            F(
                "processes",
                "array",
                "[{" + ", ".join(f.name for f in _PROC_FIELDS) + "}]",
                items="object",
            ),
        ),
        notes=(
            "Exited processes stay listed: the 100 most recent whose output"
            " holds 64 MiB together (the most recent always)."
        ),
    ),
    "process_detail": Schema(
        response=_PROC_FIELDS,
        errors=(
            E(400, "invalid_param", "pid is not a positive integer"),
            E(404, "not_found", "not a process this daemon manages", "NotFoundError"),
        ),
    ),
    "process_signal": Schema(
        body=(
            F(
                "signal",
                "any",
                "a number or a name (TERM, SIGINT)",
                required=True,
                example=15,
            ),
        ),
        response=(
            F("pid", "integer"),
            F("signal", "integer"),
            F("exited", "boolean", "set when the command had exited"),
            F("leftovers", "integer", "then: how many it left running"),
        ),
        errors=(
            E(400, "invalid_param", "pid or signal malformed"),
            E(
                400,
                "signal_not_allowed",
                "outside the built-in allowed_signals (2, 9, 15, 18, 20)",
            ),
            E(
                403,
                "signal_not_allowed",
                "one of those the policy's params.allowed_signals leaves out",
            ),
            E(
                403,
                "param_not_allowed",
                "pid 1 or the daemon itself",
                "PermissionError",
            ),
            E(
                404,
                "not_found",
                "not managed, or exited leaving nothing found running",
                "NotFoundError",
            ),
        ),
        notes="Also to descendants that left the group, and to what an exited "
        "command left running. 20 (TSTP) stops it as STOP would; 18 resumes it.",
    ),
    "process_output": Schema(
        query=(
            *RESUME,
            F(
                "since",
                "integer",
                "agent-sandbox-server's cursor: events from this seq on, numbered "
                "as it numbers them (an event's seq is its index among the output "
                "events, from 0; next is their count so far, the since to pass next "
                "time); needs capture_output: true",
                minimum=0,
            ),
            F(
                "wait",
                "number",
                "hold the answer until there is output, it ends, or this many "
                "seconds pass (at most 30)",
                default=0,
                minimum=0,
            ),
            F(
                "follow",
                "boolean",
                "stream as SSE instead of one page",
                default=False,
                example="true",
            ),
            F(
                "output",
                doc="text: each event's data as text (U+FFFD for bytes that are "
                "not UTF-8); bytes: its exact bytes as data_base64 instead",
                enum=("text", "bytes"),
                default="text",
            ),
            _QUERY_TOKEN_FOLLOW,
        ),
        headers=(LAST_EVENT_ID,),
        response=(
            F("pid", "integer"),
            F("state"),
            F("exit_code", "integer", "null while running", nullable=True),
            F("timed_out", "boolean", "ended on its timeout or idle_timeout"),
            F(
                "events",
                "array",
                "[{seq, stream: stdout|stderr, data}], or with output=bytes "
                "[{seq, stream, data_base64}]",
                items="object",
            ),
            F(
                "next",
                "integer",
                "with after: the last seq returned (or after); with since, or "
                "no cursor on a process started with capture_output true: the "
                "since of the next read",
            ),
            F("dropped", "boolean", "some output is no longer kept"),
            F("dropped_bytes", "integer"),
        ),
        produces="json",
        events=(
            Event(
                "stdout",
                '{"data": a chunk as read}, or with output=bytes '
                '{"data_base64": its bytes}',
            ),
            Event("stderr", "as stdout"),
            Event("exit", '{"exit_code"}'),
            GAP,
        ),
        errors=(
            E(
                400,
                "invalid_param",
                "pid, after, since, wait, follow or output malformed",
            ),
            E(404, "not_found", "not a process this daemon manages", "NotFoundError"),
            E(
                409,
                "output_not_captured",
                "started with capture_output false, or read with since when "
                "it was not started with capture_output true",
                "ConflictError",
            ),
        ),
        notes="follow=true answers SSE with the stream contract (id: SEQ, "
        "Last-Event-ID, gap, exit last); see docs/protocols.md.",
    ),
    "process_stdin": Schema(
        body=(
            F("data", doc="text to write", default="", example="hello\n"),
            F("data_base64", doc="bytes to write, base64 (instead of data)"),
            F("eof", "boolean", "close stdin after writing", default=False),
        ),
        response=(
            F("pid", "integer"),
            F("written", "integer", "bytes queued"),
            F("closed", "boolean", "stdin was closed after them (eof)"),
            F("bytes", "integer", "written, by its older name"),
        ),
        errors=(
            E(
                400,
                "invalid_param",
                "pid, data, data_base64 or eof malformed, both data forms, "
                "or nothing to write and no eof",
            ),
            E(
                409,
                "stdin_closed",
                'no stdin pipe (start with "stdin": true) or it was closed',
                "ConflictError",
            ),
            E(404, "not_found", "not managed, or exited", "NotFoundError"),
            E(429, "rate_limited", "the process is not reading (4 MiB queued)"),
        ),
    ),
}
