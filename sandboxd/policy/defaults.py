# -*- test-case-name: tests.policy.test_engine -*-
"""
Every built-in bound of SPEC §13, in one place.

A policy overrides them per endpoint through ``limits``; handlers read the
merged values from ``request.rule.limits`` and never hold literals of their
own.
"""

from __future__ import annotations

from typing import Any

KIB = 1024
MIB = 1024 * 1024
MB = 10**6

#: ABX_MAX_UPLOAD_SIZE's default (100 MB).
DEFAULT_UPLOAD_BYTES = 100 * MB

#: Template commands running for their callers at once (``run_command``'s
#: ``max_concurrency``, the figure used when a policy sets none).  Plain
#: functions that were answered at their timeout and have not returned
#: may hold as many threads again; past that a call is 429 naming them.
COMMANDS_AT_ONCE = 32

#: Limits every endpoint starts from.
GLOBAL_LIMITS: dict[str, Any] = {
    "max_request_bytes": MIB,
}

#: Per-endpoint defaults layered over GLOBAL_LIMITS.
ENDPOINT_LIMITS: dict[str, dict[str, Any]] = {
    "upload": {"max_bytes": DEFAULT_UPLOAD_BYTES},
    "files_upload_stream": {"max_bytes": DEFAULT_UPLOAD_BYTES},
    "files_write_raw": {"max_bytes": DEFAULT_UPLOAD_BYTES},
    # A resumable upload's size is checked at create; its appends are
    # capped by the same figure.  max_sessions counts the open uploads of
    # the daemon, idle_timeout_seconds how long one lives without a byte.
    "files_uploads_create": {
        "max_bytes": DEFAULT_UPLOAD_BYTES,
        "max_sessions": 16,
        "idle_timeout_seconds": 3600,
    },
    "files_uploads_append": {"max_bytes": DEFAULT_UPLOAD_BYTES},
    "files_extract": {"max_bytes": DEFAULT_UPLOAD_BYTES, "max_entries": 10000},
    "files_archive": {"max_bytes": DEFAULT_UPLOAD_BYTES, "max_entries": 10000},
    "download": {"max_bytes": DEFAULT_UPLOAD_BYTES},
    "files_download_stream": {"max_bytes": DEFAULT_UPLOAD_BYTES},
    "files_list": {"max_entries": 10000},
    # A move to another file system copies the tree: its entries and time.
    "files_move": {"max_entries": 100_000, "timeout_seconds": 300},
    "files_search": {"timeout_seconds": 10, "max_entries": 1000},
    # An edited file is held in memory twice (as read, and as edited).
    "files_edit": {"max_bytes": 10 * MIB},
    # A content search: its time and matches as a name search's; a file
    # over max_bytes is skipped (it is read whole, and counted as skipped).
    "files_grep": {"timeout_seconds": 10, "max_entries": 1000, "max_bytes": 16 * MIB},
    "files_watch": {"max_output_bytes": MIB},
    "shell": {"timeout_seconds": 300, "max_output_bytes": 10 * MIB},
    "shell_stream": {"timeout_seconds": 300, "max_output_bytes": 10 * MIB},
    "process_start": {"max_processes": 100, "max_output_bytes": MIB},
    "process_output": {"max_output_bytes": MIB},
    "pty_create_session": {"max_sessions": 10, "idle_timeout_seconds": 1800},
    "pty_connect": {"max_message_bytes": MIB},
    "mcp": {"max_sessions": 32, "idle_timeout_seconds": 3600},
    "code_run": {"timeout_seconds": 30, "max_output_bytes": 10 * MIB},
    # A template's command is answered 500 TimeoutError past this, as /shell
    # is; a plain function's thread cannot be stopped and runs on (see
    # sandboxd.routes.commands.CommandThreads).  max_concurrency: commands
    # running for a caller at once (agent-sandbox-server runs each on a
    # thread of its own, with no cap).  A command is a template's own API
    # and may take data: its body may be as large as agent-sandbox-server
    # takes any body (10 MiB), so a command moved over keeps working.
    "run_command": {
        "timeout_seconds": 300,
        "max_concurrency": COMMANDS_AT_ONCE,
        "max_request_bytes": 10 * MIB,
    },
    "git_status": {"timeout_seconds": 30},
    "git_diff": {"timeout_seconds": 30, "max_output_bytes": MB},
    "packages": {"timeout_seconds": 60, "max_output_bytes": 10 * MIB},
    "browser_console": {"max_entries": 1000},
    # One answer's page text, or a script's result as JSON: a page may be
    # any size; more of it is read with offset (content).
    "browser_content": {"max_bytes": MIB},
    "browser_evaluate": {"max_bytes": MIB},
    "agents_session_create": {
        "max_sessions": 4,
        "max_turn_seconds": 1800,
        "idle_timeout_seconds": 3600,
        "init_timeout_seconds": 30,
        "max_terminals": 8,
        "max_output_bytes": MIB,
        "max_message_bytes": 64 * MIB,
        "max_event_bytes": 16 * MIB,
        "max_prompt_bytes": MIB,
        "permission_timeout_seconds": 600,
        # Input messages that may wait behind a running turn, per session
        # (an ACP agent takes none mid-turn; the seed queues 32 as well).
        "max_queued": 32,
    },
}

# Capability links and the preview door: a link lives at most an hour and
# the daemon keeps at most 1000 (revocations included) until they expire;
# a preview's upstream must send its response head within a minute, a
# proxied stream may stay silent five minutes, a request body may be large
# (an app's uploads), a preview may hold 64 WebSockets open, and one that
# passes no byte either way for an hour is closed (an app's HMR socket
# pings far more often; a tab left open on a dead app does not).
_LINK_LIMITS: dict[str, Any] = {"max_link_ttl_seconds": 3600, "max_sessions": 1000}
ENDPOINT_LIMITS.update(
    {
        "links_mint": _LINK_LIMITS,
        "preview_link": _LINK_LIMITS,
        "preview_expose": {"max_sessions": 64},
        "preview_proxy": {
            "timeout_seconds": 60,
            "idle_timeout_seconds": 300,
            "max_request_bytes": 100 * MB,
            "max_sessions": 64,
            "ws_idle_timeout_seconds": 3600,
        },
    }
)
#: Code contexts (SPEC §22): shared by every code_* endpoint, so a
#: context's bounds do not depend on the route that reads them.
CODE_LIMITS: dict[str, Any] = {
    "max_contexts": 8,
    "max_contexts_per_identity": 4,
    "timeout_seconds": 300,
    "max_duration_seconds": 3600,
    "idle_timeout_seconds": 1800,
    "start_timeout_seconds": 30,
    "max_output_bytes": 10 * MIB,
    "max_display_bytes": 8 * MIB,
    "max_event_bytes": 16 * MIB,
    "max_queued": 8,
    "interrupt_grace_seconds": 5,
}

#: Language servers: shared by every lsp_* endpoint, like CODE_LIMITS.
#: ``max_sessions`` counts the daemon's servers (each a process that holds a
#: project's index in memory), ``max_bytes`` the largest file sent to one,
#: ``timeout_seconds`` one question, ``max_results`` the locations,
#: symbols or completions one answer lists.
LSP_LIMITS: dict[str, Any] = {
    "max_sessions": 4,
    "idle_timeout_seconds": 900,
    "start_timeout_seconds": 30,
    "timeout_seconds": 10,
    "max_message_bytes": 16 * MIB,
    "max_bytes": 4 * MIB,
    "max_results": 200,
}

#: Language servers: the documents one session keeps open (the oldest
#: closed first).
LSP_OPEN_DOCUMENTS = 64

#: Language servers: the files of a project the daemon watches for its
#: server (``workspace/didChangeWatchedFiles``); a project with more is
#: not watched (the files open are still sent as they change).
LSP_WATCHED_FILES = 20_000

#: Language servers: a server that lets this many questions in a row time
#: out is taken for hung: its tree is killed and the next question starts a
#: new one.  More than one, so that one slow question (the first over a
#: large project) does not throw an index away.
LSP_TIMEOUTS_BEFORE_RESTART = 2

#: Language servers: the requests an editor's server has sent it and it
#: has not answered yet, kept by id (an answer to any other id is dropped).
LSP_EDITOR_PENDING_REQUESTS = 1024

#: Language servers: how long a server stopped politely (``shutdown``,
#: ``exit``) has before its tree is ended.
LSP_SHUTDOWN_SECONDS = 1.0

#: Language servers: the head and tail of a server's stderr kept (what a
#: 502 and the session document show of why it failed).
LSP_STDERR_BYTES = 64 * KIB

#: Language servers: the diagnostics kept of one document (the most severe
#: first; the answer says when there were more, and counts them all).
LSP_KEPT_DIAGNOSTICS = 1000

#: Language servers: how long diagnostics must stay unchanged before they
#: are taken as the server's answer.
LSP_DIAGNOSTICS_SETTLE_SECONDS = 0.3

#: Language servers: a project's symbols asked this soon after its server
#: started, and none found, are asked again every
#: ``LSP_WARMUP_RETRY_SECONDS`` until then: a server still listing the
#: project's files answers an empty list (pyright does), which an agent
#: would take for "no such symbol".
LSP_WARMUP_SECONDS = 5.0
LSP_WARMUP_RETRY_SECONDS = 0.5

#: Code contexts: executions kept listed per context (finished ones go first).
CODE_KEPT_EXECUTIONS = 64

#: Code contexts: a kernel that dies is restarted at most this often a minute.
CODE_RESTARTS_PER_MINUTE = 3

#: Code contexts: a kernel hub that dies more often than this in a minute is
#: not started again for its contexts (they fail; a later call tries anew).
CODE_HUB_RESTARTS_PER_MINUTE = 3

#: Code contexts: a kernel hub that has sent nothing at all this long after
#: a context's start timed out is presumed stuck (stopped, or wedged) and
#: ended, so that the next call starts a new one: a working hub reports the
#: failed start itself at the same deadline.
CODE_HUB_ANSWER_GRACE_SECONDS = 5.0

#: Code contexts: output a kernel sends for an execution that has ended (a
#: thread a cell started prints on while no execution runs), kept per
#: stream, head and tail, for the next execution to start.
CODE_BETWEEN_OUTPUT_BYTES = 64 * KIB

#: Code contexts: what the kernel hub holds for the daemon while the daemon
#: does not read (busy, stopped): a kernel publishes its output without
#: waiting for its reader, so the hub keeps reading it and holds it here;
#: past this it leaves the rest in the kernel's queue until half has gone,
#: and past twice this it drops output, saying how much (``truncated``,
#: ``dropped_bytes``, a line on the execution's stderr).
CODE_HUB_BUFFER_BYTES = 64 * MIB

#: Code contexts: the messages the kernel hub's sockets queue per kernel
#: before ZMQ drops (a kernel's iopub) what its loop has not read yet: a
#: burst of small flushed prints fits, where ZMQ's default (1000) drops.
CODE_HUB_IOPUB_HWM = 100_000

#: Code contexts: display items spilled to disk, all contexts together.
CODE_MAX_SPILL_BYTES = 512 * MIB

#: Code contexts: how often idle contexts are looked for.
CODE_SWEEP_SECONDS = 30.0

#: Code contexts: one JSON line from the kernel hub (a display item in
#: base64 and its JSON framing, under ``max_display_bytes``'s ceiling).
CODE_HUB_MAX_LINE_BYTES = 64 * MIB

#: One read of the kernel hub's stdout takes at most this (the hub widens
#: its pipe to as much): a big output crosses in few reactor turns, not one
#: per 8 KiB.
CODE_HUB_READ_BYTES = MIB

#: After the rest of a payload, the same read takes at most this much more
#: from the kernel hub: the next line and the start of the next payload,
#: copied into that payload's buffer (the rest of which is then read
#: straight into its place).
CODE_HUB_SPILL_BYTES = 4 * KIB

#: Shared by every agents_* endpoint so that a session's limits do not
#: depend on which route created it.
AGENT_LIMITS = ENDPOINT_LIMITS["agents_session_create"]

#: Agents (SPEC §15): how long an agent gets to end a cancelled turn before
#: its process tree is killed (``turn.ended`` then says ``forced``).
AGENT_CANCEL_GRACE_SECONDS = 10.0

#: Agents: how long a closing agent gets after stdin is closed before TERM.
AGENT_STOP_GRACE_SECONDS = 2.0

#: Agents: the ``Retry-After`` of a 429 at ``max_sessions`` or
#: ``max_per_identity`` while conversations behind ``/v1`` responses hold
#: the slots (each gives its slot up once its turn ends).
AGENT_SLOT_RETRY_SECONDS = 2

#: Agents: turns, messages, tool calls, files and terminals kept per session,
#: and closed sessions kept listed.
AGENT_KEPT_ITEMS = 1000

#: Agents: the bytes the event logs of closed sessions kept listed may hold
#: together (the oldest closed sessions are forgotten past it, as past
#: :data:`AGENT_KEPT_ITEMS`); each may hold as much as a live one.
AGENT_KEPT_CLOSED_BYTES = 64 * MIB

#: Agents: default permission_mode when the policy sets none (SPEC §15.3).
AGENT_PERMISSION_MODE = {"read": "auto", "search": "auto", "think": "auto", "*": "ask"}

#: Agents: the agent's stderr kept per session (head and tail).
AGENT_STDERR_BYTES = 256 * KIB

#: Agents: the modes that skip permission requests, refused unless the
#: policy allows them (``params.deny_modes``' default); a CLI run without
#: an ACP adapter gets full access only where they are allowed.
AGENT_FULL_ACCESS_MODES = ("bypassPermissions", "yolo", "agent-full-access")

#: Agents that run their own CLI (:mod:`sandboxd.agents.clibridge`): the
#: longest line of its output taken, how long its output is read once it
#: has exited (something it started may hold its pipes), how much of its
#: stderr a failed turn quotes, and how many sessions' CLI sessions are
#: kept for a resume after a restart.
AGENT_CLI_MAX_LINE_BYTES = 16 * MIB
AGENT_CLI_OUTPUT_GRACE_SECONDS = 2.0
AGENT_CLI_ERROR_TAIL_BYTES = 2000
AGENT_CLI_KEPT_SESSIONS = 1000

# The /v1 door's stored files, vaults and templates (SPEC §26), bounded per
# identity as the seed bounds them: a file is at most 10 MiB (its body,
# base64 or multipart, a third more), an identity holds at most 256 MiB in
# at most ``max_files`` files, 100 vaults of 100 credentials each, and 64
# templates (whose inline files are kept in memory).
OPENAI_FILE_BYTES = 10 * MIB
_OPENAI_UPLOAD = {
    "max_bytes": OPENAI_FILE_BYTES,
    "max_request_bytes": OPENAI_FILE_BYTES * 4 // 3 + 64 * KIB,
}
ENDPOINT_LIMITS.update(
    {
        "agents_files_create": {**_OPENAI_UPLOAD, "max_files": 1000},
        "agents_environments_create": {**_OPENAI_UPLOAD, "max_files": 100},
        "agents_environment_files_create": _OPENAI_UPLOAD,
        "agents_environment_files_list": {"max_entries": 10000, "max_depth": 20},
        # The Responses WebSocket: a client event is at most 10 MiB (the
        # seed's bound), an identity holds at most 8 sockets, and a socket
        # with no frame and no running response for 10 minutes is closed.
        "agents_responses_connect": {
            "max_message_bytes": 10 * MIB,
            "max_sessions": 8,
            "idle_timeout_seconds": 600,
        },
    }
)
#: /v1 files: what one identity may keep, all files together.
OPENAI_FILES_TOTAL_BYTES = 256 * MIB
#: /v1 vaults: per identity, and credentials per vault.
OPENAI_MAX_VAULTS = 100
OPENAI_MAX_CREDENTIALS = 100
#: /v1 credentials: a token or access token (one line).
OPENAI_MAX_TOKEN_CHARS = 8192
#: /v1 agent definitions and webhook endpoints: the characters of a name
#: (and of a definition's model), as the seed's.
OPENAI_MAX_NAME_CHARS = 256
#: /v1 files: the characters of a file's name.
OPENAI_MAX_FILENAME_CHARS = 255
#: /v1 agent definitions: the characters of one's instructions, and the MCP
#: tools one carries (the seed's bounds).
OPENAI_MAX_INSTRUCTIONS_CHARS = 256 * KIB
OPENAI_MAX_TOOLS = 32
#: /v1 environment templates per identity; files per template or request.
OPENAI_MAX_TEMPLATES = 64
OPENAI_MAX_STAGED_FILES = 100

#: How long a group's children get between TERM and KILL.
KILL_GRACE_SECONDS = 5.0

# The /v1 door's state under --state-dir (what outlives the daemon): how
# many sessions are kept, how much of each (its events' tail, then the
# whole file), and how soon a change is written after it happens.
OPENAI_STATE_SESSIONS = 100
#: A tool call's output (or error) a ``/v1`` item keeps, in characters: its
#: end, which says how it ended (an agent may send a whole file as one).
OPENAI_ITEM_OUTPUT_CHARS = 1 * MIB
#: The items (messages, thoughts, tool calls) one ``/v1`` turn may make:
#: an agent that goes past it is stopped, as a cancel stops it, and its
#: turn ends with an error saying so (a runaway agent would grow the
#: turn's items for as long as it ran).
OPENAI_TURN_ITEMS = 2000
OPENAI_STATE_EVENT_BYTES = 256 * KIB
OPENAI_STATE_FILE_BYTES = 1 * MIB
OPENAI_STATE_SAVE_DELAY_SECONDS = 1.0
#: Session files that could not be read back, kept set aside (``.bad``)
#: for an operator to look at: the newest this many.
OPENAI_STATE_SET_ASIDE = 16
#: How soon a state file whose write failed (a full disk) is written again.
OPENAI_STATE_RETRY_SECONDS = 10.0
#: The /v1 door's vaults, credentials, templates, definitions and
#: environments, kept in one file: at most this many bytes (else the last
#: file written stays).
OPENAI_STATE_RECORDS_BYTES = 16 * MIB
#: How long a /v1 call waits for the kept state to be read after a start.
OPENAI_STATE_LOAD_SECONDS = 60.0
#: Stored responses per identity, and the bytes of their input items (the
#: oldest is forgotten past either).
OPENAI_RESPONSES_PER_IDENTITY = 200
OPENAI_RESPONSES_BYTES_PER_IDENTITY = 8 * MIB
#: ``Idempotency-Key`` values remembered per session (its events) and per
#: identity (its creates of each kind); past it the oldest is a new key.
OPENAI_IDEMPOTENCY_KEYS = 256
#: How long an ``Idempotency-Key`` answers its first result again: OpenAI
#: documents 24 hours; past that the key is new (the count bound of each
#: book still holds within the window).
OPENAI_IDEMPOTENCY_SECONDS = 24 * 60 * 60.0

# The /v1 door's webhooks: endpoints per identity, deliveries waiting (or
# being retried) per identity, one delivery's timeout, the attempts of one
# event and the waits between them, deliveries in flight per identity.
WEBHOOK_ENDPOINTS_PER_IDENTITY = 16
WEBHOOK_QUEUE_PER_IDENTITY = 256
WEBHOOK_TIMEOUT_SECONDS = 10.0
WEBHOOK_BACKOFF_SECONDS = (1.0, 5.0, 30.0, 120.0, 600.0)
WEBHOOK_ATTEMPTS = len(WEBHOOK_BACKOFF_SECONDS) + 1
WEBHOOK_IN_FLIGHT_PER_IDENTITY = 4
#: What a receiver's answer to a delivery may cost the daemon: the rest is
#: not read.
WEBHOOK_ANSWER_BYTES = 64 * KIB

#: MCP (SPEC §17): output of a stream kept in one tool result; the rest is
#: counted, reported as progress, and marked ``truncated``.
MCP_RESULT_BYTES = MIB
#: MCP: a stream's tool result as JSON, at most (its output cut to fit): the
#: official SDK refuses an SSE event over 1 MiB, and the result carries the
#: output twice (as text and as ``structuredContent``), escaped.
MCP_RESULT_JSON_BYTES = 960 * KIB

#: MCP: what a command's tool result (``shell``) keeps of its output, both
#: streams together, head and tail: the result carries it twice (as text
#: and as ``structuredContent``) within :data:`MCP_RESULT_JSON_BYTES`, and
#: a call in flight holds no more than this while its command runs.
MCP_OUTPUT_BYTES = 384 * KIB

#: MCP: the widest or tallest image a tool result carries (model APIs
#: refuse bigger ones, and a refused image can break a client's whole
#: conversation): a full page's screenshot past it is refused with a hint.
MCP_IMAGE_PIXELS = 8000

#: MCP: SSE events kept per session for resuming by ``Last-Event-ID``.
MCP_REPLAY_BYTES = MIB

#: MCP: a session with no call running and no connection open for this
#: long (a client that crashed, or went without a DELETE) is closed to make
#: room when a new one would be past ``max_sessions`` or an identity's share.
MCP_SESSION_QUIET_SECONDS = 60.0

#: MCP: a call whose SSE stream was lost is kept this long (at most the
#: idle timeout) for its client to resume it with ``Last-Event-ID``; then it
#: is cancelled, so that a client that died cannot hold its session open.
MCP_LOST_STREAM_SECONDS = 60.0

#: MCP: a ``tools/call`` still running after this long is answered as SSE
#: (the answer so far is nothing), so that keep-alive comments reach a
#: client whose read timeout is short (httpx's default is 5 s).
MCP_JSON_ANSWER_SECONDS = 2.0

#: MCP: characters of ``run_command``'s description that list the caller's
#: template commands with their arguments (about 300 tokens of the
#: ``tools/list`` a model reads first); commands past it are counted and
#: left to ``list_commands``.
MCP_COMMANDS_NOTE_CHARS = 1200

#: MCP: how often idle sessions are looked for (at most; shorter when the
#: idle timeout is).
MCP_SWEEP_SECONDS = 60.0

#: MCP: tool calls one session may have in flight (each also holds its
#: endpoint's concurrency slot); past it a call is concurrency_limited.
MCP_CALLS_PER_SESSION = 64

#: MCP: progress notifications of one call are gathered for this long.
MCP_PROGRESS_SECONDS = 0.05

#: MCP: the most output one progress notification carries (its tail).
MCP_PROGRESS_MESSAGE_CHARS = 64 * KIB

#: An SSE stream silent this long gets a ``: keep-alive`` comment (SPEC §9).
#: Under the 5 s read timeout of httpx's defaults, the shortest among
#: common clients (requests has none, Node's fetch 300 s between chunks,
#: browsers' EventSource none; proxies commonly 60 s).
HEARTBEAT_SECONDS = 4.0

#: Scrollback kept per terminal session.
PTY_SCROLLBACK_BYTES = 64 * KIB

#: Terminal output gathered from the PTY into one WebSocket frame at most.
PTY_FRAME_BYTES = 64 * KIB

#: How long bulk terminal output is gathered before it is sent (echoes of
#: keystrokes are sent at once).
PTY_COALESCE_SECONDS = 0.002

#: WebSocket clients attached to one terminal session at once.
PTY_MAX_CLIENTS = 8

#: After a terminal's shell exits while something it left still holds the
#: terminal open (a job that ignores the hang-up, until the KILL after the
#: grace): how long that job's output still reaches clients before they are
#: told the shell exited.
PTY_EXIT_DRAIN_SECONDS = 0.25

#: How long a closing terminal's jobs have after its hang-up to end as they
#: do when a terminal window closes (their traps run: a lock file removed,
#: a file saved) before they are sent TERM, or KILLed once the shell is
#: gone; the KILL after ``KILL_GRACE_SECONDS`` still ends what is left.
PTY_HANGUP_GRACE_SECONDS = 2.0

#: WebSocket connections the PTY port holds at once (all sessions), and
#: from one client address (at most ``--max-connections-per-address``).
#: A connection whose handshake has not come whole is counted too, and
#: makes room at a cap for a new one after ``RECLAIM_HEAD_AFTER_SECONDS``.
PTY_MAX_CONNECTIONS = 100
PTY_MAX_CONNECTIONS_PER_ADDRESS = 50

#: How long a client may leave output unread (pausing the terminal for
#: every client) before it is dropped.
PTY_SLOW_CLIENT_SECONDS = 10.0

#: WebSocket keep-alive: ping interval and how long a pong may take.
WS_PING_SECONDS = 30.0
WS_PING_TIMEOUT_SECONDS = 30.0

#: How long a WebSocket opening handshake may take.
WS_HANDSHAKE_SECONDS = 10.0

#: How long a closing WebSocket may take before its connection is dropped.
WS_CLOSE_SECONDS = 2.0

#: The Responses WebSocket: ``response.create`` events that may wait on
#: one socket for the response before them to end.
OPENAI_WS_QUEUED_EVENTS = 16

#: The Responses WebSocket: bytes of events that may pile up for a client
#: that does not read (written while its connection's buffer is full and
#: the response's feed paused) before it is dropped with close code 4008.
OPENAI_WS_UNREAD_BYTES = 4 * MIB

#: Default audit mode when no layer sets one.
DEFAULT_AUDIT = "deny"

#: What an audit record keeps of a child's argv (SPEC §20): this many
#: arguments, each cut at this many characters, this many in all.
AUDIT_ARGV_MAX_ITEMS = 32
AUDIT_ARG_MAX_CHARS = 512
AUDIT_ARGV_MAX_CHARS = 2048

#: audit: patterns kept for masking ``NAME=value`` in an argv, one per set of
#: names whose values are hidden (a policy revision and the daemon's
#: environment give each command the same set).
AUDIT_PATTERNS_KEPT = 32

#: Values shorter than this are not treated as secrets: not searched for in
#: an audited argv (``env_deny`` values) nor in what the /v1 door redacts
#: (masking every "1" or "on" would say nothing and hide everything).
SECRET_MIN_CHARS = 4

#: The shortest value of an agent's given environment (its catalogue
#: entry's ``env``, the create request's ``env``) masked when its name does
#: not say it is a secret: a key is long, while ``true``, ``debug`` or a
#: port number masked in every event would hide what the agent says.
AGENT_GIVEN_ENV_MASK_MIN_CHARS = 8

#: Upper bounds (seconds) of the request latency histogram of ``/metrics``.
METRICS_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)

#: Default path boundary.
DEFAULT_BASE_DIR = "/home/user"

#: How long graceful shutdown may take before the reactor stops anyway.
SHUTDOWN_TIMEOUT_SECONDS = 10.0

#: Blocks under this size come from the daemon's heap, and twice as much
#: may stay free there (glibc's ceiling for the thresholds it moves
#: itself): see :func:`sandboxd.daemon.server.steady_heap`.
HEAP_MMAP_THRESHOLD_BYTES = 32 * MIB

#: What a big code output freed goes back to the system once no other has
#: ended for this long (until then the next one reuses it).
HEAP_TRIM_QUIET_SECONDS = 30.0

#: Every :data:`HEAP_TRIM_QUIET_SECONDS` the daemon hands its free heap back
#: to the system when more than this lies free in it, whatever freed it (a
#: big command output, a download, an upload's body): the heap kept for the
#: next big output is bounded in time as well as in size.
HEAP_KEPT_FREE_BYTES = 8 * MIB


#: file_ops: bytes read or written per step of a streamed file body (one
#: ``pread``, or one ``sendfile``: on a cold page cache it reads the disk
#: on the reactor thread, so a step stays small).
STREAM_CHUNK_BYTES = MIB

#: HTTP: a request body over this many bytes is read from the socket in
#: pieces of up to :data:`LARGE_READ_BYTES` instead of Twisted's 64 KiB.
LARGE_BODY_BYTES = MIB
LARGE_READ_BYTES = MIB

#: HTTP: Host names remembered as loopback or not.
LOOPBACK_NAMES_KEPT = 256

#: policy: path decisions kept per endpoint rule (the working directory
#: of every command, decided again and again); emptied when full.
PATH_DECISIONS_KEPT = 256

#: process: prepared ``posix_spawn`` file-action sets kept (one per
#: working directory and descriptor map).  The pipes' descriptors differ
#: from spawn to spawn while other children hold theirs: eight commands at
#: a time went through about 300 distinct sets, and a set built again
#: costs ten times one found.
SPAWN_ACTIONS_KEPT = 512

#: process: children's environments kept encoded for ``posix_spawn`` (all
#: but their last entry, the tree marker), and the largest one kept.
SPAWN_ENVIRONMENTS_KEPT = 16
SPAWN_ENVIRONMENT_KEPT_BYTES = 256 * 1024

#: process: a spawn that held its caller longer than this (the new child
#: waited for a CPU before it could exec) sends the next ones that can wait
#: through worker threads, until one is quick again.  Beside other work
#: (load 8 to 60 on two cores) spawns held the reactor 0.5-1.6 ms on
#: average, each one with every other client waiting: 2 ms let most of
#: them through, half a millisecond sends them to the threads.
SLOW_SPAWN_SECONDS = 0.0005

#: process: worker threads that wait in ``posix_spawn`` for a busy machine.
SPAWN_THREADS = 4

#: process: password entries kept for the users children run as (while
#: ``/etc/passwd`` is unchanged).
USER_ENTRIES_KEPT = 64

#: process: command names kept resolved on the children's ``PATH`` (while
#: its directories are unchanged).
EXECUTABLE_PATHS_KEPT = 256

#: file_ops: files up to this size are read in one call on the reactor
#: thread (a page-cache read is cheaper than a thread hop); bigger ones are
#: read and encoded in a worker thread.
INLINE_READ_BYTES = 256 * KIB

#: file_ops: longest search pattern accepted (fnmatch compiles to a regex).
MAX_PATTERN_CHARS = 1024

#: file_ops: edits in one ``files_edit`` call (each scans the whole file).
MAX_EDITS = 100

#: file_ops: how many times a ``files_edit`` without ``if_match`` is
#: applied when another writer changes the file between its read and its
#: write (each time to the new text), before it is refused (412).
EDIT_ATTEMPTS = 3

#: files_grep: a matching line is shown cut at this many characters (marked
#: ``cut``), so one minified line does not fill the answer once per match.
GREP_LINE_CHARS = 1024

#: files_grep: the most names an ``include`` glob's ``{a,b}`` groups may
#: spell out (each group multiplies them), so a short glob cannot make
#: a matcher of millions of alternatives.
GREP_INCLUDE_CHOICES = 256

#: files_grep: the most lines of ``context`` shown before and after each
#: match (each cut as a matching line is).
GREP_CONTEXT_LINES = 5

#: files_grep: the memory one compiled pattern may take (RE2's ``max_mem``:
#: a pattern whose program would need more is refused, 400; its matching
#: cache shares the figure and falls back to a slower way past it).
GREP_PROGRAM_BYTES = 8 * MIB

#: files_grep: a file with a NUL byte in its first this many bytes is
#: binary, and skipped (as grep and ripgrep take it).
GREP_BINARY_PROBE_BYTES = 8 * KIB

#: files_grep and files_search: the most of one ignore file (``.gitignore``,
#: ``.ignore``, ``.rgignore``) read; past it its patterns are not.
IGNORE_FILE_BYTES = 1 * MIB

#: files_grep and files_search: the most globs in ``exclude``.
MAX_EXCLUDES = 64

#: file_ops: deepest listing (``depth`` is 1..this).
MAX_LIST_DEPTH = 10

#: file_ops: how deep ``files_list?recursive=true`` goes when no ``depth``
#: is given (the seed's default ``max_depth``).
RECURSIVE_LIST_DEPTH = 3

#: files_watch: quiet time that merges bursts of events for one path.
WATCH_DEBOUNCE_SECONDS = 0.05

#: files_watch: how long a watch with no client keeps its log for resumes.
WATCH_IDLE_SECONDS = 60.0

#: files_uploads_create: at the open-upload bound (the daemon's, or an
#: identity's share), an upload that took no byte for this long is taken
#: as abandoned (its client died) and dropped to make room, rather than
#: holding its slot and staging file for the whole idle timeout.
UPLOAD_RECLAIM_SECONDS = 300.0

#: files_watch in the seed's form (``timeout`` or ``interval`` given): the
#: window when none is asked for, and its ceiling when the policy sets no
#: ``max_duration_seconds``; a shorter window asked for is this long.
WATCH_WINDOW_SECONDS = 300.0
WATCH_MIN_WINDOW_SECONDS = 0.1

#: files_watch: concurrent distinct watches (each holds inotify watches).
MAX_WATCHES = 64

#: process: exited background processes kept listed (the most recent).
PROCESS_HISTORY = 100
#: ... and the bytes their output logs may hold together (the oldest go
#: first; the most recent always stays): each may hold its caller's
#: ``max_output_bytes``.
PROCESS_HISTORY_BYTES = 64 * MIB

#: process: after the command exits, how long its pipes may stay quiet
#: before they are closed (a grandchild holding them must not hang a call),
#: and the longest a chatty grandchild may keep them open.
EXIT_DRAIN_SECONDS = 0.1
EXIT_DRAIN_MAX_SECONDS = 2.0

#: process: a child found exited when it is adopted has what is left in
#: its output pipes read at once, up to this many reads of 64 KiB per pipe
#: (a pipe holds 64 KiB unless resized); a pipe still open after them (a
#: grandchild writing into it) is left to the reactor as usual.
EXITED_DRAIN_READS = 16

#: process: /shell/stream coalesces frames written within this window, or
#: up to this many bytes, into one write.
STREAM_FLUSH_SECONDS = 0.01
STREAM_FLUSH_BYTES = 64 * KIB

#: process: a /shell/stream line longer than this is sent in pieces.
MAX_LINE_BYTES = 64 * KIB

#: process: what one retained output event costs beyond its bytes (so a
#: child printing one byte at a time cannot grow the log past its bound).
EVENT_OVERHEAD_BYTES = 64

#: process: how often adopted orphans (the daemon is their subreaper) are reaped.
ORPHAN_REAP_SECONDS = 2.0

#: process: bytes queued to a child's stdin pipe before process_stdin says 429.
STDIN_PENDING_BYTES = 4 * MIB

#: process: the longest a process_output read waits for new output
#: (``wait``); a longer wait asked for is cut to this, as the seed does.
PROCESS_OUTPUT_WAIT_SECONDS = 30.0

#: system: the longest ``GET /ports?port=N&wait=S`` waits for a port to
#: listen (a longer wait is cut to this), and how often it looks.
PORT_WAIT_SECONDS = 120.0
PORT_WAIT_POLL_SECONDS = 0.2


#: The kernel's MAX_ARG_STRLEN: the longest single argv or environment
#: string ``execve`` takes, its NUL included.
ARG_STRING_MAX_BYTES = 128 * KIB

#: dev_tools: the longest ``code`` /code/run passes as one argv string.
CODE_MAX_BYTES = ARG_STRING_MAX_BYTES - 1

#: browser: shared by every browser_* endpoint, since one worker serves them
#: all and whichever call comes first starts it: how long the worker may
#: take to start Playwright and Chromium.
#: browser: ``idle_timeout_seconds``: Chromium (about 1 GB with a page or
#: two) is closed after this long without a call; the next call starts it
#: again (a fresh page: no cookies or history carried over).
BROWSER_LIMITS: dict[str, Any] = {
    "start_timeout_seconds": 30,
    "idle_timeout_seconds": 900,
}

#: browser: the daemon's watchdog on one call, beyond the call's own timeout;
#: past it the worker is presumed stuck and killed.  The worker answers a
#: call that ran out of time itself, after stopping its navigation and
#: replacing a page stuck in a script (bounded waits of a few seconds):
#: the watchdog is for a worker that no longer answers at all.
BROWSER_WATCHDOG_SLACK_SECONDS = 15.0

#: browser: per-call timeouts (milliseconds) when the request names none.
BROWSER_TIMEOUTS_MS: dict[str, int] = {
    "navigate": 30000,
    "screenshot": 30000,
    "content": 30000,
    "click": 5000,
    "type": 5000,
    "evaluate": 10000,
    "pdf": 30000,
    "console": 5000,
}

#: browser: the largest timeout a request may ask for (milliseconds), unless
#: the endpoint's ``limits.timeout_seconds`` says otherwise.
BROWSER_MAX_TIMEOUT_MS = 300000

#: browser: one JSON line from the worker (a full-page screenshot in base64).
BROWSER_MAX_MESSAGE_BYTES = 64 * MIB

#: browser: one JSON line the daemon sends the worker (a request: a script
#: to evaluate, text to type); the worker reads no longer line.
BROWSER_MAX_REQUEST_BYTES = 16 * MIB

#: browser: a reply's ``error`` message is cut at this many characters
#: (Playwright appends its call log, which says nothing to a caller).
BROWSER_ERROR_MESSAGE_CHARS = 2000

#: browser: one console entry's text (the rest is cut, the entry marked
#: ``truncated``), and the texts of the whole buffer (the oldest entries are
#: dropped past it, and counted): a page may log strings of any size.
BROWSER_CONSOLE_ENTRY_BYTES = 16 * KIB
BROWSER_CONSOLE_BUFFER_BYTES = MIB

#: browser: values of a script's result walked at most (a graph that shares
#: one object is walked once per path to it: 2^n for n levels), past which
#: it is a 413 like a result over ``max_bytes``.
BROWSER_RESULT_MAX_VALUES = 1_000_000

#: browser: after a call ran out of time, how long the page may take to
#: answer a trivial script before it counts as stuck, and how long closing
#: a stuck or crashed page (then its context) may take before the worker
#: gives up and ends (the daemon's watchdog slack covers both).
BROWSER_PROBE_SECONDS = 2.0
BROWSER_CLOSE_SECONDS = 3.0

#: browser: calls waiting for the one shared page before 429.
BROWSER_QUEUE_MAX = 16

#: browser: the worker's stderr kept for error messages after a crash.
BROWSER_STDERR_TAIL_BYTES = 8 * KIB


#: Links: how long a link lives unless its minter says.
LINK_DEFAULT_TTL_SECONDS = 900

#: Preview: the longest ``ttl_seconds`` of an exposure (longer is cut to
#: this), so its end is a time a timestamp can hold.
PREVIEW_MAX_TTL_SECONDS = 366 * 24 * 3600

#: Preview: the ports an exposure may name unless ``params.ports`` says.
PREVIEW_PORTS = ("1024-65535",)

#: Preview: idle connections the upstream pool keeps per port, and for how
#: long (shorter than Node's 5 s keep-alive, so a connection the app is
#: about to close is not reused).
PREVIEW_POOL_PER_PORT = 32
PREVIEW_POOL_IDLE_SECONDS = 4

#: Preview: bytes a request body may gather before the app's connection is
#: up; past it the browser's socket is paused.
PREVIEW_EARLY_BODY_BYTES = 64 * KIB

#: Preview: a request head sent to an upgrading upstream (WebSocket) and
#: its answer's head are bounded like any head.
PREVIEW_UPGRADE_HEAD_BYTES = 64 * KIB

#: Preview: a connection's last request head kept to be recognised in the
#: next one (its header lines, byte for byte), when no longer than this.
HEAD_MEMO_BYTES = 8 * KIB

#: Preview: what one connection keeps worked out from its repeated header
#: lines (one entry per port and exposure it reached).
PREVIEW_DERIVED_ENTRIES = 16

#: Preview: the browser's retry page reloads after this many seconds.
PREVIEW_RETRY_SECONDS = 2

#: Preview: a WebSocket through the door that passed no byte for this long
#: gives its place to a new one of the same holder (or any new one, the
#: door being full) rather than refusing it: an idle socket must not hold
#: its place for ``ws_idle_timeout_seconds``.
PREVIEW_WS_RECLAIM_IDLE_SECONDS = 60

#: Preview: Host headers whose port and label the door remembers (per
#: policy; a Host is matched against the patterns once, not per request).
PREVIEW_HOST_CACHE = 256
#: git (SPEC §24): local calls, and the remote jobs (clone, fetch, pull,
#: push) whose table holds at most ``max_jobs`` running at once.
GIT_LOCAL_LIMITS: dict[str, Any] = {"timeout_seconds": 60, "max_output_bytes": MB}
GIT_REMOTE_LIMITS: dict[str, Any] = {
    "timeout_seconds": 600,
    "idle_timeout_seconds": 120,
    "max_jobs": 4,
    "max_output_bytes": MIB,
}
GIT_REMOTE_IDS = frozenset({"git_clone", "git_fetch", "git_pull", "git_push"})

#: git: finished jobs kept for ``git_job_get`` after they end, oldest first out.
GIT_JOBS_KEPT = 32

#: git: a job's progress log (SPEC §9 retention), in bytes.
GIT_JOB_LOG_BYTES = 256 * KIB

#: git: how long an askpass helper may take to connect and ask, per prompt.
GIT_ASKPASS_TIMEOUT_SECONDS = 30.0

#: git: a commit message, a config value, a stash message (bytes).
GIT_MESSAGE_MAX_BYTES = 64 * KIB

#: git: the most commits ``git_log`` returns.
GIT_LOG_MAX = 1000

#: git: the most commits a checkout's answer names as left behind (a
#: detached HEAD's commits no ref holds), newest first.
GIT_LEFT_BEHIND_MAX = 100

#: git: the bytes of the user's files a restore or a stash pop keeps in
#: memory, so that a call that fails half-way can put them back.
GIT_KEEP_BYTES = 32 * MIB
#: ... and of all such calls in flight together.
GIT_KEEP_TOTAL_BYTES = 128 * MIB
#: ... which they do only while the work tree's disk has less free than
#: this (a stash pop always): a call that finds more is not expected to
#: fill it.
GIT_KEEP_BELOW_FREE_BYTES = 1024 * MIB


def endpoint_limits(endpoint_id: str, group: str) -> dict[str, Any]:
    """The built-in limits of one endpoint, before any policy layer."""
    out = dict(GLOBAL_LIMITS)
    if group == "agents":
        out.update(AGENT_LIMITS)
    if group == "git":
        remote = endpoint_id in GIT_REMOTE_IDS
        out.update(GIT_REMOTE_LIMITS if remote else GIT_LOCAL_LIMITS)
    if group == "code":
        out.update(CODE_LIMITS)
    if group == "lsp":
        out.update(LSP_LIMITS)
    if group == "browser":
        out.update(BROWSER_LIMITS)
    out.update(ENDPOINT_LIMITS.get(endpoint_id, {}))
    return out


def upload_request_cap(max_bytes: int) -> int:
    """The HTTP body cap of an upload route: base64 growth plus JSON slack."""
    return max_bytes * 4 // 3 + 64 * KIB


#: A streamed upload may queue this much for the writer thread before the
#: client's socket is paused.
UPLOAD_QUEUE_BYTES = 8 * MIB

#: HTTP connections open at once, and from one client address
#: (overridable: ``--max-connections``, ``--max-connections-per-address``).
MAX_HTTP_CONNECTIONS = 1024
MAX_CONNECTIONS_PER_PEER = 256

#: A request's head (request line and headers) must be complete this long
#: after the connection is made, or after the first byte of a later request
#: on a kept-alive connection (overridable: ``--head-deadline``).
HEADER_DEADLINE_SECONDS = 30.0

#: A request's body must average at least this many bytes a second once
#: its first ``HEADER_DEADLINE_SECONDS`` are over (counting only the time
#: the daemon reads it): a client on the slowest mobile link sends several
#: times as much, and one that sends less holds a request and its slot for
#: nothing (overridable: ``--body-min-rate``).
BODY_MIN_RATE_BYTES = 1024

#: After answering a request before reading all of it (a refusal at its
#: head, a body over its cap), the daemon reads and drops what the client
#: still sends before it closes (see
#: :meth:`sandboxd.web.channel.SandboxChannel.close_after_answer`): until
#: the client has sent nothing for this long (nginx's
#: ``lingering_timeout``), or the request-head deadline is over.
LINGER_QUIET_SECONDS = 5.0

#: ... and at most this much of it: a refused upload at the default upload
#: cap, base64 in JSON included, is read whole; a client sending more is cut.
LINGER_MAX_BYTES = 128 * MIB

#: At a connection cap, a connection whose request head has been on its way
#: this long may be closed to make room for a new one.
RECLAIM_HEAD_AFTER_SECONDS = 1.0

#: The warning that a connection cap refused connections (and the note of
#: connections reclaimed or cut) is logged at most this often.
CAP_WARNING_INTERVAL_SECONDS = 30.0

#: Headers per request (Twisted allows 500).
MAX_HEADERS = 100

#: A request's head: the request line and header lines together, line ends
#: not counted (Twisted's own bound, kept when the daemon parses heads).
MAX_HEAD_BYTES = 16 * KIB

#: Distinct header names whose validation the head parser remembers (the
#: few a client sends on every request; a client inventing names only
#: misses the cache).
HEADER_NAME_CACHE = 512

#: Directories one recursive watch may cover (each is an inotify watch).
MAX_WATCH_DIRS = 8192

#: How many times ``files_archive`` packs again when a file shrank while it
#: was packed (a tar member's size is written before its bytes).
ARCHIVE_ATTEMPTS = 3

#: files_extract: the longest member name, or link target, an archive may
#: hold (PATH_MAX).
ARCHIVE_MAX_NAME_BYTES = 4096

#: Depth bound for unbounded walks (search, archive): open fds stay below it.
WALK_DEPTH = 64

#: Rate limits: past this many buckets, the ones unused for a minute (full
#: again, as a new one is) are dropped.
RATE_BUCKETS_PRUNED_PAST = 1024

#: Rotate the audit file at this size; keep this many old files.
AUDIT_ROTATE_BYTES = 10 * MIB
AUDIT_KEEP_FILES = 5
#: How often, at most, the audit file's path is checked for a file renamed
#: or removed under the daemon (then reopened): two system calls a second.
AUDIT_REOPEN_CHECK_SECONDS = 1.0

#: The same for the daemon's own log file (``--logfile``).
LOG_ROTATE_BYTES = 10 * MIB
LOG_KEEP_FILES = 5

#: Pre-images kept for diffs are capped like ``git_diff`` output (SPEC §13).
PRE_IMAGE_BYTES = 10**6

#: The key must start within this many bytes for the streaming path.
UPLOAD_HEAD_LIMIT = 64 * KIB

#: A refused request whose body is at most this big is read and dropped,
#: so the connection can be kept alive; a bigger one is answered at once
#: and the connection closed.
DRAIN_LIMIT_BYTES = 64 * KIB

#: Close keep-alive connections idle for this long; a response whose client
#: takes none of its bytes for two such periods in a row is cut
#: (overridable: ``--idle-timeout``).
HTTP_IDLE_TIMEOUT_SECONDS = 60

#: The longest a request may wait for a turn (``wait``), whatever it asks.
MAX_TURN_WAIT_SECONDS = 600.0

#: The largest window a terminal accepts (``struct winsize`` holds shorts).
MAX_DIMENSION = 65535

#: E2B door: one Connect message (a request's JSON, base64 stdin included).
E2B_MAX_MESSAGE_BYTES = 4 * MIB

#: E2B door: watchers made with ``CreateWatcher`` alive at once (the events
#: one keeps until ``GetWatcherEvents`` takes them are its watch's log's).
E2B_MAX_WATCHERS = 64

#: E2B door: the configs of the commands it started, kept for ``List``
#: (the oldest go first past either).
E2B_CONFIGS_KEPT = 512
E2B_CONFIGS_BYTES = 16 * MIB

#: E2B door: how long the stream that started a command or a terminal may
#: wait for a client that reads none of its output.  Meanwhile the program
#: is paused (it blocks in ``write``, as under envd) and the connection is
#: kept; past it the stream ends with ``deadline_exceeded`` (the program
#: runs on).  Generous: a script may start a job and read it minutes later.
E2B_UNREAD_OUTPUT_SECONDS = 1800.0

#: E2B door: a ``Connect`` stream (a follower, not the stream that started
#: the program) never pauses the program: one client that stops reading
#: must not stop the program for its owner and every other follower.  A
#: follower that takes none of its output for this long is dropped (its
#: stream ends with ``deadline_exceeded``), as envd drops a subscriber
#: whose send is stuck for 15 s; one that falls this many bytes behind
#: the output is dropped too, so a slow follower of a fast program holds
#: no more of the daemon's memory than that.
E2B_STALLED_FOLLOWER_SECONDS = 15.0
E2B_FOLLOWER_BEHIND_BYTES = 16 * MIB

#: E2B door: input a ``StreamInput`` has queued to a process's stdin past
#: which its client's stream is read no further until the process takes
#: some (what one message may add stays within ``STDIN_PENDING_BYTES``),
#: and how often that is looked at meanwhile.
E2B_INPUT_PENDING_BYTES = 1 * MIB
E2B_INPUT_RECHECK_SECONDS = 0.02

#: E2B door: how long a ``SendInput`` whose bytes do not fit beside what
#: waits on the process's stdin (``STDIN_PENDING_BYTES``) waits for the
#: process to read, as envd's blocking write does, when the call names no
#: ``Connect-Timeout-Ms`` of its own (the SDK's default request timeout).
E2B_SEND_INPUT_WAIT_SECONDS = 60.0

#: E2B door: a watcher nobody polled for this long is removed.
E2B_WATCHER_IDLE_SECONDS = 600.0

#: E2B door, code interpreter: a ``keepalive`` line after this much silence
#: on ``/execute`` (E2B's own interval), so a vanished client is noticed.
E2B_CODE_KEEPALIVE_SECONDS = 5.0

#: KEP door: the body of a request that carries no file (everything but
#: ``PUT /v1/files/...``, whose cap is ``files_write_raw``'s ``max_bytes``).
KEP_MAX_REQUEST_BYTES = 64 * 1024

#: KEP door: parts a multipart ``PUT`` may carry (only ``file`` is read).
KEP_MAX_UPLOAD_PARTS = 64

#: E2B door: files one ``POST /files`` may carry.
E2B_MAX_UPLOAD_FILES = 1000

#: E2B door: the keepalive interval a client may ask for with
#: ``Keepalive-Ping-Interval`` is moved into this range (seconds): a
#: shorter one would spend the daemon on pings, a longer one would leave a
#: vanished client's stream unnoticed.
E2B_KEEPALIVE_MIN_SECONDS = 1.0
E2B_KEEPALIVE_MAX_SECONDS = 3600.0


def identity_cap(total: int, identities: int, explicit: int | None = None) -> int:
    """
    The most of a daemon-wide cap of ``total`` (MCP sessions, open uploads,
    watches) one identity may hold, so that one cannot lock the others out:
    ``explicit`` (the endpoint's ``limits.max_per_identity``) when set, else
    half of ``total`` when more than one identity can log in, else all of it.
    """
    if explicit is not None:
        return min(explicit, total)
    if identities <= 1:
        return total
    return max(1, total // 2)


# The control plane above the sandbox's work (policy ``priority``): every
# child started through the daemon runs at this nice value, best-effort I/O
# level and oom_score_adj; the daemon, when it runs as root, at its own
# (docs/operations.md).
CHILD_NICE = 10
# An agent process (the agents group, the ``/v1`` door) is what the user
# waits on for every turn: it and its session group run at this nice value
# instead (``priority.agents_nice``); its own tools inherit it, the
# terminals the daemon runs for it keep ``CHILD_NICE``.
AGENT_NICE = 0
CHILD_IO_LEVEL = 7
CHILD_OOM_SCORE_ADJ = 500
#: Milliseconds a child's session group runs before it is lowered to the
#: children's group nice value; until then it is only as light as the
#: daemon's share requires (a `/shell true` is over long before).
CHILD_GROUP_AFTER_MS = 100
#: The longest ``children_group_after_ms`` a policy may ask for.
CHILD_GROUP_AFTER_MAX_MS = 10_000
#: A child whose group is due to be lowered while it is still runnable
#: and has had less than this much CPU (milliseconds) has not started
#: yet: a short command waiting for a CPU on a busy machine, not a build.
#: Its lowering waits another ``children_group_after_ms``, at most until
#: ``CHILD_STARTING_SECONDS`` after its spawn.
CHILD_UNSTARTED_CPU_MS = 5
#: Seconds after its spawn a child that has printed nothing yet still
#: counts as starting: while one does, the streams' children that have
#: printed their first line run at the lightest group weight, so the ones
#: still starting get the CPUs first (many streams started at once).
CHILD_STARTING_SECONDS = 1.0
#: How long after the last starting child printed (or ended) the ones
#: that waited get their level back, unless another stream starts first.
CHILD_STARTING_GRACE_SECONDS = 0.2
DAEMON_NICE = -5
DAEMON_OOM_SCORE_ADJ = -500

# Where a delegated cgroup v2 hierarchy is writable (policy ``cgroups``):
# the daemon and its children in leaves of their own, the daemon's CPU
# weight above the children's, a memory reserve for the daemon, and the
# children's process count bounded (docs/operations.md).  cpu.weight runs
# 1..10000 (the kernel's default is 100).
CGROUP_DAEMON_CPU_WEIGHT = 1000
CGROUP_CHILDREN_CPU_WEIGHT = 100
#: The daemon's memory reserve: ``memory.min`` (never reclaimed) and
#: ``memory.low`` (reclaimed only when nothing else is left).
CGROUP_DAEMON_MEMORY_MIN = 64 * MIB
CGROUP_DAEMON_MEMORY_LOW = 128 * MIB
#: ``pids.max`` of the children's leaf: a fork bomb stops here.
CGROUP_CHILDREN_PIDS_MAX = 8192
#: The leaves' names, under the daemon's own cgroup.
CGROUP_DAEMON_LEAF = "sandboxd-daemon"
CGROUP_CHILDREN_LEAF = "sandboxd-children"
#: Children waiting for the thread that moves them into their leaf; past
#: it a spawn moves its child itself.
CGROUP_PLACEMENTS_QUEUED = 1024
#: Processes moved per child: the child and what it started before it
#: was moved.
CGROUP_TREE_MOVES = 256
#: How long the daemon's stop waits for the moves still queued.
CGROUP_STOP_SECONDS = 1.0

# -- the /v1 door's artifacts (copies of the files a turn wrote) -------------
#: The largest file copied as an artifact.
V1_ARTIFACT_BYTES = 10 * MIB
#: Files copied per completed turn.
V1_ARTIFACTS_PER_TURN = 100
#: Artifacts kept per session, and the bytes of their copies (the oldest
#: copy goes beyond either; the newest always stays).
V1_ARTIFACTS_KEPT = 1000
V1_ARTIFACTS_KEPT_BYTES = 256 * MIB

# -- error messages (sandboxd.errors) --------------------------------------------
#: Characters of a caller's value an error message quotes; a longer value is
#: cut, with an ellipsis and its length (:func:`sandboxd.errors.quoted`).
QUOTED_VALUE_CHARS = 200

# -- the agent-sandbox door's gRPC transport (sandboxd.kep.grpc) -------------
#: The largest request message, and the largest response the door sends
#: (grpc-go's and grpcio's default receive limit).
KEP_MAX_MESSAGE_BYTES = 4 * MIB
#: Calls running at once on one connection; one more is refused at once
#: (``RESOURCE_EXHAUSTED``).  Above ``max_processes``' default, since the
#: SDK runs every call on one connection: a ``SendSignal`` or ``Execute``
#: still gets through while 100 ``Start`` streams run.
KEP_MAX_CONCURRENT_CALLS = 200
#: Streams open at once on one connection (SETTINGS_MAX_CONCURRENT_STREAMS):
#: above the calls, so a call over that cap reaches the door and is
#: refused, rather than waiting unseen in the client for a free stream
#: until its deadline.
KEP_MAX_CONCURRENT_STREAMS = 256
#: Request bytes held for messages not yet whole, on one connection and on
#: the port: a stream that passes either is refused RESOURCE_EXHAUSTED (so
#: streams that never end cannot pile up messages of the size above).
KEP_MAX_BUFFERED_REQUEST_BYTES = 16 * MIB
KEP_MAX_BUFFERED_REQUEST_BYTES_TOTAL = 64 * MIB
#: Connections open at once; a connection over it is closed as it opens.
KEP_MAX_CONNECTIONS = 256
#: A connection with no open stream for this long is sent GOAWAY and closed.
KEP_IDLE_TIMEOUT_SECONDS = 300.0
#: The request headers' size (SETTINGS_MAX_HEADER_LIST_SIZE), as grpc-go's.
KEP_MAX_HEADER_LIST_BYTES = 16 * KIB
#: A stream's unsent response bytes past which its producer is paused; it
#: is resumed once they are down to a quarter of it.
KEP_STREAM_HIGH_WATER_BYTES = 256 * KIB
#: A stream's unsent response bytes past which the stream is reset: a
#: handler that ignores the pause cannot make the daemon hold more.
KEP_STREAM_MAX_QUEUED_BYTES = 16 * MIB
#: What the daemon writes to a connection whose client reads nothing (its
#: transport paused: acknowledgements of PINGs and SETTINGS, answers'
#: headers) past which the connection is cut.
KEP_MAX_UNREAD_CONTROL_BYTES = 1 * MIB
#: How long a stop lets running calls finish after its GOAWAY.
KEP_STOP_GRACE_SECONDS = 5.0
#: Once a command's own process exits, how long its output pipes are
#: still read while a job it left in the background holds them, as the
#: reference daemon waits (``Execute``: its ``WaitDelay``; ``Start``: its
#: ``pipeDrainGrace``).
KEP_EXECUTE_DRAIN_SECONDS = 10.0
KEP_START_DRAIN_SECONDS = 5.0
#: How long a ``Start`` on a terminal waits for a client that reads none of
#: its output (the terminal is not read meanwhile, as a plain ``Start``'s
#: pipes are not).  The caller is the terminal's one client, not a viewer
#: holding up others, so it gets a plain ``Start``'s patience: in effect the
#: stream's own life (its deadline, the policy's ``timeout_seconds``); a day
#: only so that the timer stays within what the reactor's poller takes.
KEP_TERMINAL_UNREAD_SECONDS = 24 * 3600.0
#: A client's reset this close to a call's deadline is that deadline: the
#: client's clock started first, so its timer fires before ours.
KEP_DEADLINE_SLACK_SECONDS = 0.1
#: The longest ``grpc-message`` (percent-encoded) and trailer value a call
#: ends with; a longer message is cut with an ellipsis.  h2 Huffman-codes
#: header blocks on the reactor, in time that grows faster than their
#: size, and gRPC clients refuse metadata past 16 KiB anyway.
KEP_MAX_STATUS_MESSAGE_BYTES = 1 * KIB

# -- traces (sandboxd.access.tracing, sandboxd.access.otlp) --------------------
#: OpenTelemetry's batch defaults, each overridden by its ``OTEL_BSP_*``
#: variable: spans waiting to be sent (the queue is capped at eight times
#: this whatever the variable says), spans per export, how often a
#: partial batch goes, and how long one export may take with its retries.
TRACE_QUEUE_SPANS = 2048
TRACE_BATCH_SPANS = 512
TRACE_SCHEDULE_DELAY_SECONDS = 5.0
TRACE_EXPORT_TIMEOUT_SECONDS = 30.0
#: One request to the collector (``OTEL_EXPORTER_OTLP_TIMEOUT``).
TRACE_REQUEST_TIMEOUT_SECONDS = 10.0
#: The first wait before a retry of an export the collector asked to
#: retry (429, 502, 503, 504) or that could not connect; it doubles each time.
TRACE_RETRY_FIRST_SECONDS = 1.0
#: A ``Retry-After`` longer than this is not waited for: the batch is dropped.
TRACE_RETRY_AFTER_MAX_SECONDS = 30.0
#: What is read of the collector's answer (a partial success names how
#: many spans it rejected, and why).
TRACE_RESPONSE_BYTES = 64 * KIB
#: An attribute's text is cut at this many characters (unless
#: ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` says otherwise), a list at this many items.
TRACE_ATTRIBUTE_VALUE_CHARS = 4096
TRACE_ATTRIBUTE_ITEMS = 64
#: The longest ``tracestate`` passed on (the W3C's minimum to propagate).
TRACE_STATE_CHARS = 512
#: Attribute names whose encoding is kept (the daemon's own few, and the
#: audit fields' names: a fixed set).
TRACE_KEYS_KEPT = 256
#: How long a stop waits for the last spans to reach the collector.
TRACE_STOP_SECONDS = 5.0
