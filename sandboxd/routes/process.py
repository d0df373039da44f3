# -*- test-case-name: tests.routes.test_process -*-
"""
Handlers of the ``process`` group (SPEC §7.4, §9): ``/shell``,
``/shell/stream`` and background processes with a resumable output log.

Every request is checked whole (command, shell, allow/deny lists, cwd
through the path guard, env, user, timeouts) before anything is spawned,
so a refusal is always a plain JSON error and never half a stream.
"""

from __future__ import annotations

import base64
import binascii
import errno
import os
from collections.abc import Callable, Coroutine
from typing import Any

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.python.failure import Failure

from sandboxd import processes
from sandboxd.access import held as held_connections
from sandboxd.access.guard import MAX_LINKS, PathGuard, system_refusal
from sandboxd.errors import (
    RESOURCE_ERRNOS,
    ApiError,
    Code,
    bad_request,
    conflict,
    forbidden,
    not_found,
    out_of_resources,
    policy_rule,
    rate_limited,
    signal_not_allowed,
    timed_out,
    unavailable,
)
from sandboxd.eventlog import Event
from sandboxd.policy.confinement import Confinement, confinement_of
from sandboxd.policy.defaults import PROCESS_OUTPUT_WAIT_SECONDS, STDIN_PENDING_BYTES
from sandboxd.policy.rules import Params
from sandboxd.processes.child import Child, timeout_message
from sandboxd.processes.command import (
    RunAs,
    command_argv,
    resolve_user,
    signal_number,
    system_program,
)
from sandboxd.processes.environment import (
    child_environment,
    note_argv,
    refuse_secret_variables,
    secret_names,
    validate_env,
)
from sandboxd.processes.managed import readable
from sandboxd.processes.priority import CHILD_PRIORITY
from sandboxd.processes.run import RunResult, run_collect, spawn
from sandboxd.processes.service import ProcessService
from sandboxd.web.linestream import ChunkStream, LineStream
from sandboxd.web.messages import ServerRequest, SSEResponse
from sandboxd.web.params import flag, integer, number, seconds, string
from sandboxd.web.sse import Follower, SSEChannel, default_format, resume_point


@attrs.frozen
class Launch:
    """A request's child, fully checked and ready to spawn."""

    argv: list[str]
    command: str
    env: dict[str, str]
    cwd: str
    run_as: RunAs | None
    timeout: float | None
    idle_timeout: float | None
    confine: Confinement | None = None


def launch(request: ServerRequest) -> Launch:
    """
    Check a request that starts a child (SPEC §7.4).

    :raises ApiError: 400 malformed, 403 refused by policy or guard, 503
        while the daemon shuts down.
    """
    if request.context.draining:
        raise unavailable("the daemon is shutting down")
    body = request.body
    rule = request.rule
    guard = PathGuard(rule)
    cwd = guard.cwd(body.get("cwd"))
    # A {path} of an allow pattern is the file the child would open: a
    # relative one is relative to the child's working directory.
    argv = command_argv(body, rule, lambda arg: guard.check(os.path.join(cwd, arg)))
    # The boundary no file call crosses is not crossed by the daemon's
    # execve either (as on the seed): /proc/self/exe, a link to it.
    if system_program(argv, cwd, MAX_LINKS):
        raise system_refusal(argv[0])
    extra = validate_env(body.get("env"))
    refuse_secret_variables(request.context, extra)
    # The call's trace context, for a child that reads it (a test runner
    # instrumented with OpenTelemetry): one the caller set stays.
    for name, value in request.context.tracer.child_context(
        request.headers, request.audit, request.path
    ).items():
        extra.setdefault(name, value)
    run_as = resolve_user(body.get("user"), rule)
    # The names kept from the child are the names masked in the audit.
    hidden = frozenset(secret_names(request.context, rule))
    env = child_environment(request.context, rule, extra, drop=hidden)
    note_argv(request, argv, extra, hidden)
    timeout = seconds(body.get("timeout"), "timeout", None)
    configured = rule.limits.timeout_seconds
    if timeout is None:
        timeout = configured
    elif (
        configured is not None
        and rule.source("limits.timeout_seconds") is not None
        and timeout > configured
    ):
        # A policy's timeout_seconds caps what a request asks for, as on the
        # seed; the built-in default only fills in a missing one.
        timeout = configured
    ceiling = rule.limits.max_duration_seconds
    if ceiling is not None and (timeout is None or timeout > ceiling):
        timeout = ceiling
    idle = seconds(body.get("idle_timeout"), "idle_timeout", None)
    if idle is None:
        idle = rule.limits.idle_timeout_seconds
    return Launch(
        argv,
        str(body["command"]),
        env,
        cwd,
        run_as,
        timeout,
        idle,
        # ``~`` is the home of the user it runs as (``run_as`` is applied
        # to the environment only at the spawn).
        confinement_of(rule, run_as.home if run_as is not None else env.get("HOME")),
    )


#: What ``execve`` answers about the command itself (its size, its file),
#: as opposed to the daemon's resources.
_COMMAND_ERRNOS = frozenset(
    {
        errno.E2BIG,
        errno.ENOEXEC,
        errno.EACCES,
        errno.EPERM,
        errno.ENOENT,
        errno.ENOTDIR,
        errno.ELOOP,
        errno.ENAMETOOLONG,
        errno.EISDIR,
        errno.ETXTBSY,
    }
)


def _spawn_failed(error: OSError, command: str) -> Exception:
    """
    The answer to a command that could not be started: 400 when it cannot
    run as given (not on PATH, too long for the kernel, not a program), 503
    while the daemon is out of processes or descriptors; anything else is
    left to be a 500.
    """
    if isinstance(error, FileNotFoundError) and error.errno is None:
        return bad_request(str(error), type="FileNotFoundError")
    reason = os.strerror(error.errno) if error.errno else str(error)
    if error.errno in _COMMAND_ERRNOS:
        return bad_request(f"cannot run {command[:200]!r}: {reason}", type="OSError")
    if error.errno in RESOURCE_ERRNOS:
        return out_of_resources(error, "cannot start a process now")
    return error


def _cap(request: ServerRequest) -> int:
    cap = request.rule.limits.max_output_bytes
    return processes.DEFAULT_CAPTURE_BYTES if cap is None else int(cap)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


# --------------------------------------------------------------------------
# /shell


async def shell(request: ServerRequest) -> dict[str, Any]:
    """
    ``POST /shell``: run a command to completion.

    → ``{"stdout", "stderr", "exit_code", "truncated", "dropped_bytes"}``;
    past the timeout the group is killed and the answer is 500
    TimeoutError (with the output gathered so far).  A policy reload that
    no longer lets its caller in (the identity gone, ``process:run`` taken
    away) ends the command's group and answers that refusal, as it ends
    the caller's streams.
    """
    spec = launch(request)
    ran = Deferred.fromCoroutine(
        run_to_end(request, spec, max_total_bytes=request.output_bytes)
    )
    revoked: list[ApiError] = []

    def close(error: ApiError) -> None:
        revoked.append(error)
        ran.cancel()

    held = held_connections.hold(
        request.context, request.identity, request.endpoint, close
    )
    try:
        result = await ran
    except OSError as e:
        raise _spawn_failed(e, spec.command) from None
    except CancelledError:
        if revoked:
            raise revoked[0] from None
        raise
    finally:
        held_connections.release(request.context, held)
    body = {
        "stdout": _text(result.stdout),
        "stderr": _text(result.stderr),
        "exit_code": result.exit_code,
        "truncated": result.truncated,
        "dropped_bytes": result.dropped_bytes,
    }
    if result.timed_out or result.idle_timed_out:
        idle = result.idle_timed_out
        seconds = spec.idle_timeout if idle else spec.timeout
        raise timed_out(
            timeout_message(seconds, idle),
            idle,
            status=500,
            limit="idle_timeout" if idle else "timeout_seconds",
            **body,
        )
    return body


def run_to_end(
    request: ServerRequest,
    spec: Launch,
    *,
    max_total_bytes: int | None = None,
    on_spawned: Callable[[Child], None] | None = None,
) -> Coroutine[Any, Any, RunResult]:
    """
    Run ``spec`` to its end, its output kept up to the endpoint's
    ``max_output_bytes`` (head and tail), within its timeouts (``/shell``,
    and the doors' calls that do its job).  Cancelling it ends the group.

    :param max_total_bytes: both streams together (a door's answer limit).
    :param on_spawned: called with the child once it runs.
    """
    return run_collect(
        request.context.reactor,
        spec.argv,
        children=request.context.children,
        env=spec.env,
        cwd=spec.cwd,
        timeout=spec.timeout,
        idle_timeout=spec.idle_timeout,
        # A door with a bounded answer holds no more than it can send.
        max_output_bytes=min(_cap(request), max_total_bytes or _cap(request)),
        run_as=spec.run_as,
        confine=spec.confine,
        max_total_bytes=max_total_bytes,
        on_spawned=on_spawned,
    )


# --------------------------------------------------------------------------
# /shell/stream


class _Pauser:
    """What a slow client pauses: reading from the child's pipes."""

    def __init__(self, child: Child) -> None:
        self.child = child

    def pauseProducing(self) -> None:
        self.child.pause_reading()

    def resumeProducing(self) -> None:
        self.child.resume_reading()


def shell_stream(request: ServerRequest) -> SSEResponse | Deferred[SSEResponse]:
    """
    ``POST /shell/stream``: SSE of ``stdout``/``stderr`` lines as they
    complete, interleaved in the order produced, then ``error`` (timeouts)
    and ``exit``, always last.  A client that leaves kills the tree; a
    slow one pauses the child.  A spawn that fails is a JSON error, not a
    stream, even when it happened on a worker thread.
    """
    spec = launch(request)
    as_bytes, stdin = _stream_options(request.body)
    clock = request.context.reactor
    channel_box: list[SSEChannel] = []
    early: list[bytes] = []

    def write(data: bytes) -> None:
        if channel_box:
            channel_box[0].write_raw(data)
        else:
            early.append(data)

    stream = (ChunkStream if as_bytes else LineStream)(clock, write, _cap(request))
    child = Child(
        clock,
        _first_output_noted(lambda: child, stream.feed),
        timeout=spec.timeout,
        idle_timeout=spec.idle_timeout,
        claims_escapees=True,
    )
    try:
        spawn(
            clock,
            child,
            spec.argv,
            children=request.context.children,
            env=spec.env,
            cwd=spec.cwd,
            run_as=spec.run_as,
            stdin_pipe=stdin is not None,
            may_wait=True,
            confine=spec.confine,
        )
    except OSError as e:
        raise _spawn_failed(e, spec.command) from None
    if stdin is not None:
        _feed_stdin(child, stdin)
    child.when_spawned().addCallbacks(
        lambda _: CHILD_PRIORITY.starting(child.pid), lambda _: None
    )

    def ended(code: int | None) -> None:
        stream.finish()
        error = processes.timeout_error(child)
        if error is not None:
            # ``error`` is "timeout" for either limit, which the seed's SDK
            # turns into its CommandTimeoutError; ``code`` says which limit
            # (timeout, idle_timeout) and ``message`` says it in words.
            stream.event(
                "error",
                {
                    **error.event(),
                    "error": "timeout",
                    "code": error.code,
                    "message": error.message,
                },
            )
        stream.event("exit", {"exit_code": code})
        stream.close()
        if channel_box:
            channel_box[0].close()

    def start(channel: SSEChannel) -> None:
        channel_box.append(channel)
        for data in early:
            channel.write_raw(data)
        early.clear()
        # From now on every frame goes straight to the channel.
        stream.write = channel.write_raw

        def gone() -> None:
            child.kill("disconnected")

        channel.on_disconnect(gone)
        channel.register_producer(_Pauser(child), gone)
        child.ended.addCallback(ended)

    response = SSEResponse(start=start)
    if not child.pending:
        return response

    def not_spawned(failure: Failure) -> Failure:
        if failure.check(CancelledError):
            child.kill("disconnected")
        elif isinstance(failure.value, OSError):
            raise _spawn_failed(failure.value, spec.command)
        return failure

    return child.when_spawned().addCallbacks(lambda _: response, not_spawned)


def _first_output_noted(
    child: Callable[[], Child], feed: Callable[[int, bytes], None]
) -> Callable[[int, bytes], None]:
    """
    The child's first output handler: tells the priorities when the child
    first prints (:meth:`ChildPriority.first_output`; it counts as
    starting once it runs), so that a stream whose first line is out waits
    while the others started with it get theirs; then the child hands
    this read and every later one to ``feed`` itself.
    """

    def first(fd: int, data: bytes) -> None:
        running = child()
        running.on_output = feed
        CHILD_PRIORITY.first_output(running.pid)
        feed(fd, data)

    return first


def _stream_options(body: dict[str, Any]) -> tuple[bool, bytes | None]:
    """
    ``output`` (``lines``, the default, or ``bytes``: raw chunks as
    ``data_base64``) and ``stdin_base64`` (bytes the child reads on its
    stdin, then end of file) of a ``/shell/stream`` request.

    :raises ApiError: 400 for an unknown ``output`` or bad base64.
    """
    output = string(body.get("output"), "output", "lines")
    if output not in ("lines", "bytes"):
        raise bad_request("output must be 'lines' or 'bytes'")
    raw = body.get("stdin_base64")
    if raw is None:
        return output == "bytes", None
    if not isinstance(raw, str):
        raise bad_request("stdin_base64 must be a base64 string")
    try:
        data = base64.b64decode(raw, validate=True)
    except (ValueError, binascii.Error):
        raise bad_request("stdin_base64 is not valid base64") from None
    return output == "bytes", data


def _feed_stdin(child: Child, data: bytes) -> None:
    """Write ``data`` to the child's stdin once it runs, then close it."""

    def feed(_: object = None) -> None:
        child.write_stdin(data)
        child.close_stdin()

    if child.pending:
        child.when_spawned().addCallbacks(feed, lambda _: None)
    else:
        feed()


# --------------------------------------------------------------------------
# Background processes


def _service(request: ServerRequest) -> ProcessService:
    service = request.context.processes
    assert service is not None
    return service


async def process_start(request: ServerRequest) -> dict[str, Any]:
    """
    ``POST /process/start``: start a background process.

    → ``{"pid", "command", "tag"}``, once it runs; 429 ResourceError past
    ``max_processes`` running.  A client that leaves before the answer
    leaves the process running, as a background process outlives its
    request anyway.
    """
    spec = launch(request)
    body = request.body
    tag = string(body.get("tag"), "tag", None)
    stdin = flag(body.get("stdin", False), "stdin", words=False)
    capture = body.get("capture_output")
    if capture is not None:
        capture = flag(capture, "capture_output", words=False)
    # A background process has no time limit unless the request or the rule
    # gives one (launch() cut the request's to ``max_duration_seconds``).
    try:
        managed = start_managed(request, spec, stdin=stdin, tag=tag)
        if managed.child.pending:
            await managed.child.when_spawned()
    except OSError as e:
        raise _spawn_failed(e, spec.command) from None
    managed.capture_output = capture
    return {"pid": managed.pid, "command": managed.command, "tag": managed.tag}


def start_managed(
    request: ServerRequest,
    spec: Launch,
    *,
    stdin: bool,
    tag: str | None,
    command: str | None = None,
) -> processes.Managed:
    """
    Start ``spec`` as one of the daemon's background processes, within the
    endpoint's ``max_processes`` and the caller's share of them
    (``max_per_identity``), its output kept up to ``max_output_bytes``
    (for ``/process/start`` and the doors' calls that start a process).

    :param command: how listings show it (default: the request's command).
    :raises ApiError: 429 past ``max_processes`` running, or the caller's share.
    :raises OSError: the spawn failed at once (each caller says how).
    """
    service = _service(request)
    rule = request.rule
    # A link's processes count against its minter's share.
    owner = request.identity.root
    service.check_room(rule, owner, len(request.context.policy.tokens.ids()))
    retention = rule.limits.max_output_bytes or processes.DEFAULT_RETENTION_BYTES
    return service.start(
        spec.argv,
        command=command or spec.command,
        env=spec.env,
        cwd=spec.cwd,
        run_as=spec.run_as,
        stdin_pipe=stdin,
        tag=tag,
        retention=int(retention),
        timeout=spec.timeout,
        idle_timeout=spec.idle_timeout,
        may_wait=True,
        confine=spec.confine,
        owner=owner,
    )


def process_list(request: ServerRequest) -> dict[str, Any]:
    """``GET /process/list?tag=``: running and recently exited processes."""
    tag = request.arg("tag")
    return {"processes": _described(_service(request).list(tag))}


def _described(listed: list[processes.Managed]) -> list[dict[str, Any]]:
    """
    The documents of ``listed``, each exited one with ``leftovers``: how
    many processes it started still run (one look at ``/proc`` for all).
    """
    exited = [m for m in listed if not m.running]
    found = processes.count_leftovers([m.child for m in exited])
    counts = dict(zip(map(id, exited), found, strict=True))
    return [{**m.describe(), "leftovers": counts.get(id(m))} for m in listed]


def _pid(request: ServerRequest) -> int:
    return integer(request.path_params.get("pid"), "pid", low=1)


def _managed(request: ServerRequest) -> processes.Managed:
    pid = _pid(request)
    managed = _service(request).get(pid)
    if managed is None:
        raise not_found(f"process {pid} not found: this daemon manages no such process")
    return managed


def process_detail(request: ServerRequest) -> dict[str, Any]:
    """``GET /process/{pid}``: one managed process."""
    return _described([_managed(request)])[0]


#: The signals a process may be sent when no policy narrows the list.
BUILT_IN_SIGNALS = frozenset(Params().allowed_signals)


def process_signal(request: ServerRequest) -> dict[str, Any]:
    """
    ``POST /process/{pid}/signal {"signal": 15}``: signal a managed
    process's group (and descendants that left it).

    400 for a signal outside the built-in ``allowed_signals``, 403 for
    one the policy's list leaves out; 403 for pid 1 or the daemon; 404
    for a pid that is not a running managed process.
    """
    pid = _pid(request)
    if pid in (1, os.getpid()):
        raise forbidden(
            f"signalling pid {pid} is not allowed",
            Code.PARAM_NOT_ALLOWED,
            rule="guard:signal",
        )
    if "signal" not in request.body:
        raise bad_request("'signal' is required")
    number = signal_number(request.body["signal"])
    allowed = request.rule.params.allowed_signals
    if number not in allowed:
        raise signal_not_allowed(
            f"signal {number} is not allowed (allowed: {', '.join(map(str, sorted(allowed)))})",
            policy_rule(request.rule, "params.allowed_signals"),
            narrowed=number in BUILT_IN_SIGNALS,
        )
    managed = _managed(request)
    if managed.running:
        processes.signal_child(managed.child, number)
        return {"pid": pid, "signal": number}
    # The command ended, but what it started in the background may not
    # have: that is still this process's to stop.
    left = processes.signal_exited_tree(managed.child, number)
    if not left:
        raise not_found(
            f"process {pid} has exited, and no process it started was found running"
        )
    return {"pid": pid, "signal": number, "exited": True, "leftovers": left}


def process_output(request: ServerRequest) -> Any:
    """
    ``GET /process/{pid}/output``: the kept output, in one of two forms.

    - ``?after=SEQ`` (ours): the events after ``after``; ``next`` is the
      last seq returned.  With ``follow=true`` an SSE stream with the
      stream contract of SPEC §9 (``id:``, ``Last-Event-ID``, ``gap``,
      ``exit``).
    - ``?since=SEQ&wait=S`` (the seed's): the events from ``since`` on,
      numbered as the seed numbers them (``seq`` is an event's index among
      the output events, from 0), so ``since`` may be ``next``, the count
      of events seen or the last ``seq`` plus one alike; ``next`` is the
      count of output events so far.  Needs a process
      started with ``capture_output: true`` (409 otherwise).  A read of
      such a process that names no cursor at all (no ``since``, ``after``,
      ``Last-Event-ID`` or ``follow``) is in this form too, as on the seed,
      so its ``next`` can be passed as ``since``.

    In either form ``wait`` holds the answer until there is output to give,
    the output ends, or ``wait`` seconds pass (at most
    :data:`PROCESS_OUTPUT_WAIT_SECONDS`), so a reader that follows a quiet
    process asks a few times a minute, not hundreds of times a second.

    ``output=bytes`` gives each event's bytes as ``data_base64`` instead of
    its text as ``data``: what is not UTF-8 (``gzip -c``, ``tar c``) would
    otherwise arrive as U+FFFD, and stdin already takes bytes.
    """
    managed = _managed(request)
    as_bytes = _output_form(request.arg("output"))
    seed_form = request.arg("since") is not None or _seed_by_default(request, managed)
    if managed.capture_output is False or (
        seed_form and managed.capture_output is not True
    ):
        raise conflict(
            f"process {managed.pid} was started without capture_output",
            Code.OUTPUT_NOT_CAPTURED,
            "ConflictError",
        )
    if not seed_form and flag(request.arg("follow"), "follow"):
        after = resume_point(request.query, request.headers)

        def start(channel: SSEChannel) -> None:
            Follower(
                managed.log, channel, after, _bytes_format if as_bytes else _text_format
            )

        return SSEResponse(start=start)
    if seed_form:
        since = integer(request.arg("since"), "since", 0, low=0)
        # Output event ``since`` (from 0) is at log seq ``since + 1``.
        after = since
    else:
        after = resume_point(request.query, {})
    wait = number(
        request.arg("wait"),
        "wait",
        0.0,
        low=0.0,
        high=PROCESS_OUTPUT_WAIT_SECONDS,
        clamp=True,
    )
    waited = output_after(request.context.reactor, managed, after, wait)
    return waited.addCallback(
        lambda _: _output_page(managed, after, since if seed_form else None, as_bytes)
    )


def _output_form(value: str | None) -> bool:
    """
    Whether a read asked for ``output=bytes`` (else ``text``, the default).

    :raises ApiError: 400 for any other value.
    """
    output = string(value, "output", "text")
    if output not in ("text", "bytes"):
        raise bad_request("output must be 'text' or 'bytes'")
    return output == "bytes"


def _output_data(text: str, as_bytes: bool) -> dict[str, str]:
    """
    One output event's payload: its text (what was not UTF-8 as U+FFFD),
    or with ``as_bytes`` the exact bytes read, base64 (the log keeps them
    as text whose undecodable bytes are surrogate escapes).
    """
    if as_bytes:
        raw = text.encode("utf-8", "surrogateescape")
        return {"data_base64": base64.b64encode(raw).decode("ascii")}
    return {"data": readable(text)}


def _seed_by_default(request: ServerRequest, managed: processes.Managed) -> bool:
    """
    Whether a read that names no cursor is in the seed's form: for a
    process started with ``capture_output: true`` (only the seed's clients
    ask for it), unless the read names one of ours.
    """
    return (
        managed.capture_output is True
        and request.arg("after") is None
        and request.arg("follow") is None
        and "last-event-id" not in request.headers
    )


def output_after(
    clock: Any, managed: processes.Managed, after: int, wait: float
) -> Deferred[None]:
    """
    Fires once ``managed``'s log holds an event past ``after``, the log is
    closed (the output ended), or ``wait`` seconds pass, whichever comes
    first: the bounded wait of a long-polled read.
    """
    log = managed.log
    done: Deferred[None] = Deferred()
    if wait <= 0 or log.closed or log.last_seq > after:
        done.callback(None)
        return done

    def wake(_: Any = None) -> None:
        if not done.called:
            done.callback(None)

    unsubscribe = log.subscribe(wake)
    timer = clock.callLater(wait, wake)

    def settle(result: Any) -> Any:
        unsubscribe()
        if timer.active():
            timer.cancel()
        return result

    return done.addBoth(settle)


def _output_page(
    managed: processes.Managed, after: int, since: int | None, as_bytes: bool = False
) -> dict[str, Any]:
    """
    One page of a process's kept output after ``after``.

    :param since: the seed's cursor when the read used its form: each
        event's ``seq`` is then its index among the output events (log seq
        minus one) and ``next`` the count of output events, as on the seed;
        otherwise ``seq`` is the log's and ``next`` the last seq returned.
    :param as_bytes: each event's bytes as ``data_base64`` (``output=bytes``).
    """
    gap, scanned = managed.log.since(after)
    shown = [e for e in scanned if e.event in ("stdout", "stderr")]
    offset = 0 if since is None else 1
    out = [
        {
            "seq": e.seq - offset,
            "stream": e.event,
            **_output_data(e.data["data"], as_bytes),
        }
        for e in shown
    ]
    described = managed.describe()
    dropped = managed.dropped_bytes()
    if since is not None:
        following = managed.outputs
    else:
        following = shown[-1].seq if shown else after
    return {
        "pid": managed.pid,
        "state": described["state"],
        "exit_code": described["exit_code"],
        "timed_out": described["timed_out"],
        "events": out,
        "next": following,
        "dropped": gap is not None or dropped > 0,
        "dropped_bytes": dropped,
    }


def _text_format(event: Event) -> bytes | list[bytes]:
    """An output event as text (what was not UTF-8 as U+FFFD)."""
    if event.event in ("stdout", "stderr"):
        data = {**event.data, "data": readable(event.data["data"])}
        event = Event(event.seq, event.event, data, event.size)
    return default_format(event)


def _bytes_format(event: Event) -> bytes | list[bytes]:
    """An output event as its exact bytes, base64 (``output=bytes``)."""
    if event.event in ("stdout", "stderr"):
        data = {k: v for k, v in event.data.items() if k != "data"}
        data.update(_output_data(event.data["data"], True))
        event = Event(event.seq, event.event, data, event.size)
    return default_format(event)


def process_stdin(request: ServerRequest) -> dict[str, Any]:
    """
    ``POST /process/{pid}/stdin {"data" | "data_base64", "eof"}``: feed the
    stdin pipe (text, or bytes as base64); ``eof`` closes it after.

    → ``{"pid", "written", "closed", "bytes"}`` (``bytes`` is ``written``
    under its older name); 409 ``stdin_closed`` when the process was not
    started with ``"stdin": true`` or its stdin is closed already; 400
    when there is nothing to write and no ``eof``, as on the seed.
    """
    managed = _managed(request)
    body = request.body
    if "data_base64" in body and "data" in body:
        raise bad_request("give 'data' or 'data_base64', not both")
    if "data_base64" in body:
        encoded = string(body["data_base64"], "data_base64")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise bad_request("'data_base64' is not valid base64") from None
    else:
        raw = string(body.get("data", ""), "data").encode()
    eof = flag(body.get("eof", False), "eof", words=False)
    if not managed.running:
        raise not_found(f"process {managed.pid} has exited")
    feed_stdin(managed, raw)
    if not raw and not eof:
        # After feed_stdin, so a process without a pipe is still its 409.
        raise bad_request("give 'data' or 'data_base64' to write, or 'eof': true")
    if eof:
        managed.child.close_stdin()
    return {"pid": managed.pid, "written": len(raw), "closed": eof, "bytes": len(raw)}


def feed_stdin(managed: processes.Managed, data: bytes) -> None:
    """
    Queue ``data`` on a managed process's stdin pipe, for every door that
    writes one.

    :raises ApiError: 409 when it has no open stdin pipe; 429 when it is
        not reading and :data:`STDIN_PENDING_BYTES` are queued already.
    """
    child = managed.child
    if not child.stdin_open:
        raise conflict(
            f"process {managed.pid} has no open stdin: it was closed (by a "
            'client, or by the process), or it was started without one ("stdin": true)',
            Code.STDIN_CLOSED,
            "ConflictError",
        )
    if data and child.stdin_pending() + len(data) > STDIN_PENDING_BYTES:
        raise rate_limited(
            "the process is not reading its stdin fast enough; retry later",
            1,
            limit="stdin_pending_bytes",
        )
    if data:
        child.write_stdin(data)


HANDLERS: dict[str, Any] = {
    "shell": shell,
    "shell_stream": shell_stream,
    "process_start": process_start,
    "process_list": process_list,
    "process_detail": process_detail,
    "process_signal": process_signal,
    "process_output": process_output,
    "process_stdin": process_stdin,
}
