# -*- test-case-name: tests.e2b.test_sdk -*-
"""
envd's ``process.Process`` service over sandboxd's processes and terminals.

A command is a background process of the daemon's
:class:`~sandboxd.processes.service.ProcessService` (so ``process_list``
shows it and ``max_processes`` counts it), checked by the same
:func:`~sandboxd.routes.process.launch` as ``/process/start`` (argv rules,
shell rules, cwd through the guard, environment without secrets, user,
duration ceiling); a command with a ``pty`` is a terminal session of the
:class:`~sandboxd.terminals.table.TerminalTable`, created by the
``pty_create_session`` handler itself.

As in envd, a process outlives the stream that started it (the E2B SDK's
``disconnect()`` then ``commands.connect(pid)`` rely on it): what bounds it
is the ``Connect-Timeout-Ms`` deadline the SDK sends with every command
(60 s unless told otherwise), which ends its whole process group like a
``/shell`` timeout, and the policy's ``max_duration_seconds``.  ``Connect``
streams live output only, as envd does; ``List`` shows running processes.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import Deferred

from sandboxd import processes
from sandboxd.access.audit import redact_url_secrets
from sandboxd.e2b.connect import (
    b64,
    bad_field,
    bool_field,
    bytes_field,
    field,
    oneof,
    string_field,
    uint_field,
)
from sandboxd.e2b.door import (
    CLIENT_STREAM,
    SERVER_STREAM,
    UNARY,
    Call,
    Procedure,
    Stream,
)
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    internal,
    limit_exceeded,
    not_found,
    timed_out,
)
from sandboxd.eventlog import Event
from sandboxd.policy.defaults import (
    E2B_CONFIGS_BYTES,
    E2B_CONFIGS_KEPT,
    E2B_FOLLOWER_BEHIND_BYTES,
    E2B_INPUT_PENDING_BYTES,
    E2B_INPUT_RECHECK_SECONDS,
    E2B_SEND_INPUT_WAIT_SECONDS,
    E2B_STALLED_FOLLOWER_SECONDS,
    E2B_UNREAD_OUTPUT_SECONDS,
    STDIN_PENDING_BYTES,
)
from sandboxd.processes.environment import note_argv, secret_names
from sandboxd.processes.managed import Managed
from sandboxd.processes.service import ProcessService
from sandboxd.routes import process as process_routes
from sandboxd.routes import system as system_routes
from sandboxd.routes import terminal as terminal_routes
from sandboxd.terminals.session import OutputLost, PtySession

if TYPE_CHECKING:
    from sandboxd.access.auth import Identity

_SIGNALS = {"SIGNAL_SIGTERM": 15, "SIGNAL_SIGKILL": 9, "SIGNAL_UNSPECIFIED": 0}

KEEPALIVE: dict[str, Any] = {"event": {"keepalive": {}}}


def _keepalive() -> dict[str, Any]:
    return KEEPALIVE


@attrs.define
class Config:
    """
    What a command was started with, for ``List``.

    :ivar owner: the identity that started it (None: not through this door).
    """

    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str | None
    owner: str | None = None

    def weight(self) -> int:
        """About the bytes it holds (a command's arguments and environment)."""
        return (
            len(self.cmd)
            + sum(map(len, self.args))
            + sum(len(k) + len(v) for k, v in self.envs.items())
            + len(self.cwd or "")
        )

    def as_json(self, viewer: Identity, hidden: frozenset[str]) -> dict[str, Any]:
        """
        The ``ProcessConfig`` message as ``viewer`` may see it: no more than
        ``process_list`` shows (the command) unless ``viewer`` acts for the
        identity that started it (that identity, or a link of its minter's);
        then also its ``cwd`` and ``envs``, without the names ``GET /env``
        hides (``hidden``, and names holding TOKEN, SECRET, KEY…).  The
        command and its arguments are shown with the secrets in their URLs
        masked, as the audit masks them (the SDK's git helpers put
        ``https://user:token@`` there).
        """
        out: dict[str, Any] = {
            "cmd": redact_url_secrets(self.cmd),
            "args": [redact_url_secrets(arg) for arg in self.args],
            "envs": {},
        }
        if self.owner is None or not viewer.acts_for(self.owner):
            return out
        out["envs"] = {
            name: value
            for name, value in self.envs.items()
            if not system_routes.is_redacted(name, hidden)
        }
        if self.cwd is not None:
            out["cwd"] = self.cwd
        return out


@attrs.define
class ProcessDoor:
    """The door's own memory of what it started (configs, for ``List``)."""

    configs: dict[int, Config] = attrs.Factory(dict)
    #: What :attr:`configs` weigh together.
    config_bytes: int = 0
    #: Terminal id -> the timer of its deadline.
    deadlines: dict[str, Any] = attrs.Factory(dict)
    #: Pid -> the ``SendInput`` calls waiting for room on its stdin, in
    #: the order they came (each is written in that order).
    stdin_waits: dict[int, list[object]] = attrs.Factory(dict)

    def deadline(self, clock: Any, seconds: float, session_id: str, end: Any) -> None:
        """End terminal ``session_id`` after ``seconds`` (its Connect-Timeout-Ms)."""

        def fire() -> None:
            self.deadlines.pop(session_id, None)
            end(session_id)

        self.deadlines[session_id] = clock.callLater(seconds, fire)

    def forget_deadline(self, session_id: str) -> None:
        """The terminal ended before its deadline."""
        timer = self.deadlines.pop(session_id, None)
        if timer is not None and timer.active():
            timer.cancel()

    def stop(self) -> None:
        """Shutdown: the terminal service ends the terminals itself."""
        for session_id in list(self.deadlines):
            self.forget_deadline(session_id)

    def remember(self, pid: int, config: Config) -> None:
        """
        Keep ``config`` for ``List``: the most recent
        :data:`E2B_CONFIGS_KEPT`, holding :data:`E2B_CONFIGS_BYTES`
        together (a command's arguments and environment may be as large
        as a request), the oldest going first.
        """
        old = self.configs.pop(pid, None)
        if old is not None:
            self.config_bytes -= old.weight()
        self.configs[pid] = config
        self.config_bytes += config.weight()
        while len(self.configs) > 1 and (
            len(self.configs) > E2B_CONFIGS_KEPT
            or self.config_bytes > E2B_CONFIGS_BYTES
        ):
            self.config_bytes -= self.configs.pop(next(iter(self.configs))).weight()


# -- helpers ---------------------------------------------------------------------


def _service(call: Call) -> ProcessService:
    service: ProcessService | None = call.context.processes
    assert service is not None
    return service


def _terminals(call: Call) -> Any:
    service = call.context.terminals
    assert service is not None
    return service.table


def _state(call: Call) -> ProcessDoor:
    state: ProcessDoor = call.context.e2b.processes
    return state


def _config(message: dict[str, Any]) -> Config:
    process = field(message, "process") or {}
    if not isinstance(process, dict):
        raise bad_field("process", "an object")
    cmd = string_field(process, "cmd", "") or ""
    args = field(process, "args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise bad_field("args", "a list of strings")
    envs = field(process, "envs") or {}
    if not isinstance(envs, dict):
        raise bad_field("envs", "an object of strings")
    cwd = string_field(process, "cwd")
    return Config(cmd, list(args), dict(envs), cwd)


def _selector(message: dict[str, Any]) -> tuple[str, Any]:
    selector = field(message, "process")
    chosen = oneof(selector, ("pid", "tag"))
    if chosen is None:
        raise bad_request("'process' must select a 'pid' or a 'tag'")
    name, _ = chosen
    if name == "pid":
        return "pid", uint_field(selector, "pid")
    return "tag", string_field(selector, "tag")


def _pty_session(call: Call, pid: int) -> PtySession | None:
    """
    The caller's running terminal with ``pid``: another identity's is not
    there for it (SPEC §4), so every procedure answers it as a pid nobody has.
    """
    session: PtySession | None = _terminals(call).running(pid, call.identity)
    return session


def _find(call: Call, message: dict[str, Any]) -> Managed | PtySession | None:
    """
    The running process or terminal a selector names, or None (a terminal
    of another identity's included).
    """
    kind, value = _selector(message)
    if kind == "pid":
        managed = _service(call).get(int(value))
        if managed is not None and managed.running:
            return managed
        return _pty_session(call, int(value))
    for managed in reversed(_service(call).list(value)):
        if managed.running:
            return managed
    return None


def _missing(message: dict[str, Any]) -> ApiError:
    kind, value = _selector(message)
    return not_found(f"process with {kind} {value} not found")


def _by_target(process_endpoint: str, pty_endpoint: str) -> Any:
    """An endpoint chooser: the pty one when the selector names a terminal."""

    def choose(call: Call, message: dict[str, Any]) -> str:
        try:
            target = _find(call, message)
        except ApiError:
            return process_endpoint
        return pty_endpoint if isinstance(target, PtySession) else process_endpoint

    return choose


def end_event(code: int | None, error: str | None = None) -> dict[str, Any]:
    """envd's ``EndEvent`` (Go's ``ProcessState``: -1 and ``signal: …`` when signalled)."""
    if code is None:
        end: dict[str, Any] = {"exitCode": -1, "exited": False, "status": "unknown"}
    elif code < 0:
        try:
            name = (signal.strsignal(-code) or str(-code)).lower()
        except ValueError:
            name = str(-code)
        end = {"exitCode": -1, "exited": False, "status": f"signal: {name}"}
    else:
        end = {"exitCode": code, "exited": True, "status": f"exit status {code}"}
    if error:
        end["error"] = error
    return {"event": {"end": end}}


def _deadline_error(seconds: float | None) -> ApiError:
    shown = f" after {seconds:g} seconds" if seconds else ""
    return timed_out(
        f"the deadline passed{shown}; the command's process group was killed",
        limit="Connect-Timeout-Ms",
    )


def _watch_deadline_error(seconds: float | None) -> ApiError:
    """
    A ``Connect`` stream's own deadline: it ends the watching only, as
    envd's does; the process it watched goes on (its own deadline is the
    one its ``Start`` was given).
    """
    shown = f" after {seconds:g} seconds" if seconds else ""
    return timed_out(
        f"this connection's deadline passed{shown}; the connection ends here, "
        "the process still runs",
        limit="Connect-Timeout-Ms",
    )


def unread_too_long(seconds: float) -> ApiError:
    """
    A stream whose client took none of its output for ``seconds``: it
    ends (``deadline_exceeded``, a ``TimeoutException`` in the SDK); the
    program it followed runs on.
    """
    return timed_out(
        f"the client took none of the output for {seconds:g} seconds; the stream "
        "ends here, the process still runs",
        idle=True,
    )


def follower_dropped(why: str) -> ApiError:
    """
    A ``Connect`` stream whose client fell behind (``why``): it ends
    (``deadline_exceeded``, a ``TimeoutException`` in the SDK); the
    program, which never waited for it, runs on.
    """
    return timed_out(
        f"this client {why}; it is dropped so the process does not wait for it: "
        "the stream ends here, the process still runs (connect again to follow it)",
        idle=True,
    )


def _wait_for(stream: Stream, pause: Any, resume: Any, follower: bool) -> None:
    """
    How a stream's slow client is met: the stream that started the
    program pauses it (it blocks in ``write``, as under envd) within
    :data:`E2B_UNREAD_OUTPUT_SECONDS`; a follower never does (one client
    that stops reading would stop the program for its owner, every other
    follower and the HTTP API): it is dropped past its own bounds.
    """
    if follower:
        stream.register_follower(
            E2B_STALLED_FOLLOWER_SECONDS, E2B_FOLLOWER_BEHIND_BYTES, follower_dropped
        )
    else:
        stream.register_producer(
            pause, resume, E2B_UNREAD_OUTPUT_SECONDS, unread_too_long
        )


# -- following a process's output -----------------------------------------------


def _follow(
    call: Call, stream: Stream, managed: Managed, replay: bool, follower: bool
) -> None:
    """
    Stream a process's output events, then its end (``follower``: a
    ``Connect``, which never pauses the process).
    """
    child = managed.child

    def deliver(event: Event | None) -> None:
        if stream.ended:
            return
        if event is None:
            if not stream.ended:
                stream.send(end_event(child.exit_code))
                stream.end()
            return
        if event.event in ("stdout", "stderr"):
            data = event.data["data"].encode("utf-8", "surrogateescape")
            stream.send({"event": {"data": {event.event: b64(data)}}})
        elif event.event == "exit":
            error = processes.timeout_error(child)
            stream.send(
                end_event(event.data.get("exit_code"), error.message if error else None)
            )
            stream.end(
                _deadline_error(child.timeout) if child.reason == "timeout" else None
            )

    if replay:
        _, kept = managed.log.since(0)
        for event in kept:
            deliver(event)
    if stream.ended:
        return
    stream.on_end(managed.log.subscribe(deliver))
    _wait_for(stream, child.pause_reading, child.resume_reading, follower)
    if managed.log.closed and not stream.ended:
        stream.send(end_event(child.exit_code))
        stream.end()


class _PtyClient:
    """A terminal session's client that turns its frames into envd events."""

    def __init__(self, stream: Stream, session: PtySession) -> None:
        self.stream = stream
        self.session = session
        self.on_ended: Any = None

    def send_frame(self, frame: bytes) -> None:
        """
        Terminal output becomes a ``pty`` data event carrying the bytes the
        terminal wrote, as envd sends them (the frame's text has U+FFFD for
        what is not UTF-8: the bytes are read from the scrollback instead).
        """
        if self.stream.ended:
            return
        try:
            output = self.session.output_bytes(frame)
        except OutputLost as e:
            # Never a stream that silently misses bytes.
            self.stream.end(internal(f"{e}; the stream ends here"))
            return
        if output is not None and output[1]:
            self.stream.send({"event": {"data": {"pty": b64(output[1])}}})

    def session_ended(self, frame: bytes) -> None:
        """The shell ended: the ``end`` event, then the end of the stream."""
        if self.on_ended is not None:
            self.on_ended()
        code = json.loads(frame).get("exit_code")
        if not self.stream.ended:
            self.stream.send(end_event(code))
            self.stream.end()

    def pause_input(self) -> None:
        """Input is by RPC here: nothing to pause."""

    def resume_input(self) -> None:
        """Input is by RPC here: nothing to resume."""

    def drop_slow(self) -> None:
        """The client left output unread past the bound: end its stream."""
        self.stream.end(unread_too_long(E2B_UNREAD_OUTPUT_SECONDS))


def _attach(
    call: Call, stream: Stream, session: PtySession, replay: bool, follower: bool
) -> None:
    client = _PtyClient(stream, session)
    client.on_ended = lambda: _state(call).forget_deadline(session.id)
    attached = session.attach(client, None if replay else session.emitted)
    if not attached:
        stream.end(
            limit_exceeded(
                429, "the terminal has its maximum of clients", Code.TOO_MANY_SESSIONS
            )
        )
        return
    stream.on_end(lambda: session.detach(client))
    # The shell waits for its creator's slow client, as under envd, not the
    # 10 s a WebSocket viewer gets: an SDK client may read its handle much
    # later.  A follower never pauses it.
    _wait_for(
        stream,
        lambda: session.pause(client, E2B_UNREAD_OUTPUT_SECONDS),
        lambda: session.resume(client),
        follower,
    )


# -- procedures -------------------------------------------------------------------


def _start_endpoint(call: Call, message: dict[str, Any]) -> str:
    return (
        "pty_create_session" if field(message, "pty") is not None else "process_start"
    )


def _cwd(call: Call, config: Config) -> str | None:
    """
    The command's ``cwd``, a leading ``~`` the home of the user it runs as,
    as envd expands it (so ``cwd="~"`` is where ``cd ~`` goes); the
    endpoint's path rules then check it as any ``cwd`` (``List`` shows it
    as it was given).
    """
    return call.expand(config.cwd) if config.cwd else config.cwd


def _launch_body(call: Call, config: Config) -> dict[str, Any]:
    """The ``/process/start`` body that makes :func:`launch` check this command."""
    if not config.cmd:
        raise bad_field("cmd", "a non-empty string")
    body: dict[str, Any] = {
        "env": config.envs,
        "cwd": _cwd(call, config),
        "user": call.user(),
    }
    args = config.args
    shells = call.rule.params.shells
    if os.path.basename(config.cmd) in shells and "-c" in args:
        # bash -l -c SCRIPT: checked as /shell checks {"shell", "command"}.
        script_at = args.index("-c") + 1
        if script_at >= len(args):
            raise bad_field("args", "a script after '-c'")
        body["command"] = args[script_at]
        body["shell"] = config.cmd
    else:
        body["command"] = shlex.join([config.cmd, *args])
    timeout = call.timeout_seconds()
    if timeout is not None:
        body["timeout"] = timeout
    return body


def start(call: Call, message: dict[str, Any]) -> Any:
    """``Start``: a command (``process_start``) or a terminal (``pty_create_session``)."""
    config = _config(message)
    tag = string_field(message, "tag")
    if field(message, "pty") is not None:
        return _start_pty(call, message, config)
    stdin = bool_field(message, "stdin", True)
    request = call.server_request(_launch_body(call, config))
    spec = process_routes.launch(request)
    spec = attrs.evolve(spec, argv=[config.cmd, *config.args])
    # What runs is on record as it runs (a shell's -l included), as HTTP's.
    note_argv(request, spec.argv, config.envs)
    try:
        managed = process_routes.start_managed(
            request, spec, stdin=stdin, tag=tag, command=shlex.join(spec.argv)
        )
    except OSError as e:
        raise process_routes._spawn_failed(e, spec.command) from None

    def running(_: object = None) -> None:
        _state(call).remember(
            managed.pid, attrs.evolve(config, owner=call.identity.root)
        )
        stream = Stream(call, _keepalive)
        stream.send({"event": {"start": {"pid": managed.pid}}})
        _follow(call, stream, managed, replay=True, follower=False)

    def not_spawned(failure: Any) -> None:
        error = failure.value
        if isinstance(error, OSError):
            error = process_routes._spawn_failed(error, spec.command)
        if not isinstance(error, ApiError):
            error = internal("the command could not start", "OSError")
        call.door.fail(call, error)

    if managed.child.pending:
        managed.child.when_spawned().addCallbacks(running, not_spawned)
    else:
        running()


def _pty_size(message: dict[str, Any]) -> dict[str, Any] | None:
    """
    The ``pty.size`` of a message (None when not given), refused unless
    each level is an object: a terminal is not started, nor resized, for a
    ``pty`` that is no ``PTY`` message.
    """
    pty = field(message, "pty")
    if pty is None:
        return None
    if not isinstance(pty, dict):
        raise bad_field("pty", "an object")
    size = field(pty, "size")
    if size is not None and not isinstance(size, dict):
        raise bad_field("pty.size", "an object")
    return size


def _start_pty(call: Call, message: dict[str, Any], config: Config) -> None:
    size = _pty_size(message) or {}
    body: dict[str, Any] = {
        "cols": uint_field(size, "cols") or 80,
        "rows": uint_field(size, "rows") or 24,
        "env": config.envs,
        "cwd": _cwd(call, config),
        "user": call.user(),
        "shell": config.cmd or None,
    }
    timeout = call.timeout_seconds()
    created = terminal_routes.pty_create_session(call.server_request(body))
    table = _terminals(call)
    session = table.get(created["session_id"])
    # The shell runs without the -i -l the SDK asks for: List shows what runs.
    _state(call).remember(
        session.pid, attrs.evolve(config, args=[], owner=call.identity.root)
    )
    stream = Stream(call, _keepalive)

    if timeout is not None:
        # As envd: the terminal's deadline ends it (its whole tree), whether
        # or not its stream is still there to say so.
        stream.deadline(timeout, lambda: stream.end(_deadline_error(timeout)))
        _state(call).deadline(call.context.reactor, timeout, session.id, table.close)
    stream.send({"event": {"start": {"pid": session.pid}}})
    _attach(call, stream, session, replay=True, follower=False)


def connect_(call: Call, message: dict[str, Any]) -> None:
    """``Connect``: live output of a running process or terminal."""
    target = _find(call, message)
    if target is None:
        raise _missing(message)
    timeout = call.timeout_seconds()
    stream = Stream(call, _keepalive)
    stream.deadline(timeout, lambda: stream.end(_watch_deadline_error(timeout)))
    stream.send({"event": {"start": {"pid": target.pid}}})
    if isinstance(target, PtySession):
        _attach(call, stream, target, replay=False, follower=True)
    else:
        _follow(call, stream, target, replay=False, follower=True)


def list_(call: Call, message: dict[str, Any]) -> dict[str, Any]:
    """
    ``List``: running processes (as ``process_list`` shows them) and the
    caller's own terminals (as ``pty_list`` does).
    """
    state = _state(call)
    viewer = call.identity
    hidden = frozenset(secret_names(call.context, call.rule))
    out = []
    for managed in _service(call).list():
        if not managed.running:
            continue
        config = state.configs.get(managed.pid)
        if config is None:
            config = Config(managed.command, [], {}, None)
        info: dict[str, Any] = {
            "config": config.as_json(viewer, hidden),
            "pid": managed.pid,
        }
        if managed.tag is not None:
            info["tag"] = managed.tag
        out.append(info)
    for session in _terminals(call).sessions.values():
        if session.ended or not session.usable_by(viewer):
            continue
        config = state.configs.get(session.pid) or Config("", [], {}, None)
        out.append({"config": config.as_json(viewer, hidden), "pid": session.pid})
    return {"processes": out}


def _write_input(call: Call, target: Managed | PtySession, message: Any) -> int:
    chosen = oneof(field(message, "input"), ("stdin", "pty"))
    if chosen is None:
        return 0
    name, _ = chosen
    data = bytes_field(field(message, "input"), name) or b""
    if isinstance(target, PtySession):
        target.write(data)
        return len(data)
    process_routes.feed_stdin(target, data)
    return len(data)


def send_input(call: Call, message: dict[str, Any]) -> Any:
    """
    ``SendInput``: stdin bytes, or keystrokes for a terminal.  Bytes that
    do not fit beside what already waits for the process to read
    (``STDIN_PENDING_BYTES``) wait for it, as envd's blocking write does,
    rather than being refused: a loop of ``send_stdin`` calls feeding a
    file to a program just works.
    """
    target = _find(call, message)
    if target is None:
        raise _missing(message)
    chosen = oneof(field(message, "input"), ("stdin", "pty"))
    data = b""
    if chosen is not None and chosen[0] == "stdin":
        data = bytes_field(field(message, "input"), "stdin") or b""
    if (
        isinstance(target, Managed)
        and data
        and target.child.stdin_open
        and (
            target.pid in _state(call).stdin_waits
            or target.child.stdin_pending() + len(data) > STDIN_PENDING_BYTES
        )
    ):
        return _wait_for_room(call, target, data)
    _write_input(call, target, message)
    return {}


def _wait_for_room(call: Call, managed: Managed, data: bytes) -> Deferred[Any]:
    """
    Write ``data`` to ``managed``'s stdin once it fits (after the calls
    that waited before it), within the call's ``Connect-Timeout-Ms`` (else
    :data:`E2B_SEND_INPUT_WAIT_SECONDS`); past it, or once the process
    ends, nothing of it is written and the call fails saying so.
    """
    waits = _state(call).stdin_waits
    queue = waits.setdefault(managed.pid, [])
    me = object()
    queue.append(me)
    clock = call.context.reactor
    seconds = call.timeout_seconds() or E2B_SEND_INPUT_WAIT_SECONDS
    give_up = clock.seconds() + seconds
    done: Deferred[Any] = Deferred()
    timer: list[Any] = [None]

    def leave() -> None:
        if me in queue:
            queue.remove(me)
        if not queue and waits.get(managed.pid) is queue:
            del waits[managed.pid]
        if timer[0] is not None and timer[0].active():
            timer[0].cancel()
        timer[0] = None

    def look() -> None:
        timer[0] = None
        if done.called:
            return
        child = managed.child
        if not managed.running:
            leave()
            done.errback(
                not_found(
                    f"process with pid {managed.pid} has ended; "
                    "none of this input was written"
                )
            )
            return
        fits = child.stdin_pending() + len(data) <= STDIN_PENDING_BYTES
        if queue and queue[0] is me and (fits or not child.stdin_open):
            leave()
            try:
                process_routes.feed_stdin(managed, data)
            except ApiError as e:
                done.errback(e)
                return
            done.callback({})
            return
        if clock.seconds() >= give_up:
            leave()
            done.errback(
                timed_out(
                    f"process {managed.pid} did not read its stdin for "
                    f"{seconds:g} seconds; none of this input was written",
                    limit="Connect-Timeout-Ms",
                )
            )
            return
        timer[0] = clock.callLater(E2B_INPUT_RECHECK_SECONDS, look)

    def gone() -> None:
        leave()
        if not done.called:
            done.cancel()

    call.on_close(gone)
    look()
    return done


class _InputFeed:
    """A ``StreamInput``'s messages after its start, applied as they arrive."""

    def __init__(self, call: Call, target: Managed | PtySession) -> None:
        self.call = call
        self.target = target

    def alive(self) -> bool:
        """Whether the process or terminal still runs."""
        if isinstance(self.target, PtySession):
            return self.target.alive
        return self.target.running

    def waiting(self) -> bool:
        """Whether what was written waits for the process to read it."""
        if not self.alive():
            return False
        if isinstance(self.target, PtySession):
            return self.target.input_waiting()
        child = self.target.child
        return child.stdin_open and child.stdin_pending() >= E2B_INPUT_PENDING_BYTES

    def message(self, message: dict[str, Any]) -> None:
        """One ``data`` message (a keepalive carries none)."""
        data = field(message, "data")
        if data is None:
            return
        if not self.alive():
            raise not_found(f"process with pid {self.target.pid} has ended")
        _write_input(self.call, self.target, data)

    def end(self) -> dict[str, Any]:
        """The client's stream is over: envd's empty response."""
        return {}


def stream_input(call: Call, first: dict[str, Any]) -> _InputFeed:
    """
    ``StreamInput``: a start naming the process, then input applied as
    each message arrives (envd's ``for stream.Receive()``), so a live
    keyboard or a stream larger than memory gets through.
    """
    start = field(first, "start")
    if start is None:
        raise bad_request("the input stream must begin with a 'start' message")
    target = _find(call, start)
    if target is None:
        raise _missing(start)
    return _InputFeed(call, target)


def _stream_input_endpoint(call: Call, message: dict[str, Any]) -> str:
    chosen: str = _by_target("process_stdin", "pty_connect")(
        call, field(message, "start") or {}
    )
    return chosen


def _signal(message: dict[str, Any]) -> int:
    value = field(message, "signal")
    if isinstance(value, str) and value in _SIGNALS:
        return _SIGNALS[value]
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise bad_field("signal", "SIGNAL_SIGTERM or SIGNAL_SIGKILL")


def send_signal(call: Call, message: dict[str, Any]) -> Any:
    """``SendSignal``: to the process group (SIGKILL ends the whole tree)."""
    number = _signal(message)
    target = _find(call, message)
    if target is None:
        raise _missing(message)
    if isinstance(target, PtySession):
        closing: Deferred[Any] = terminal_routes.pty_delete_session(
            call.server_request(path_params={"id": target.id})
        )
        return closing.addCallback(lambda _: {})
    if number == 0:
        raise bad_field("signal", "SIGNAL_SIGTERM or SIGNAL_SIGKILL")
    process_routes.process_signal(
        call.server_request(
            body={"signal": number}, path_params={"pid": str(target.pid)}
        )
    )
    return {}


def close_stdin(call: Call, message: dict[str, Any]) -> dict[str, Any]:
    """``CloseStdin``: EOF on the process's stdin pipe."""
    target = _find(call, message)
    if target is None:
        raise _missing(message)
    if isinstance(target, PtySession):
        raise bad_request("a terminal has no stdin to close: send Ctrl+D (0x04)")
    process_routes.process_stdin(
        call.server_request(
            body={"data": "", "eof": True}, path_params={"pid": str(target.pid)}
        )
    )
    return {}


def update(call: Call, message: dict[str, Any]) -> dict[str, Any]:
    """``Update``: resize a terminal."""
    target = _find(call, message)
    if target is None:
        raise _missing(message)
    if not isinstance(target, PtySession):
        raise bad_request(f"process {target.pid} has no terminal to resize")
    size = _pty_size(message)
    if size is None:
        return {}
    body = {"cols": uint_field(size, "cols"), "rows": uint_field(size, "rows")}
    terminal_routes.pty_resize(
        call.server_request(body=body, path_params={"id": target.id})
    )
    return {}


_P = "process.Process/"

PROCEDURES = {
    _P + "Start": Procedure(_P + "Start", SERVER_STREAM, _start_endpoint, start),
    _P + "Connect": Procedure(
        _P + "Connect",
        SERVER_STREAM,
        _by_target("process_output", "pty_connect"),
        connect_,
    ),
    _P + "List": Procedure(_P + "List", UNARY, "process_list", list_),
    _P + "SendInput": Procedure(
        _P + "SendInput", UNARY, _by_target("process_stdin", "pty_connect"), send_input
    ),
    _P + "StreamInput": Procedure(
        _P + "StreamInput",
        CLIENT_STREAM,
        _stream_input_endpoint,
        stream_input,
        live=True,
    ),
    _P + "SendSignal": Procedure(
        _P + "SendSignal",
        UNARY,
        _by_target("process_signal", "pty_delete_session"),
        send_signal,
    ),
    _P + "CloseStdin": Procedure(
        _P + "CloseStdin", UNARY, "process_stdin", close_stdin
    ),
    _P + "Update": Procedure(_P + "Update", UNARY, "pty_resize", update),
}
