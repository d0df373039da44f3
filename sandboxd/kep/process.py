# -*- test-case-name: tests.kep.test_process -*-
"""
The runtime protocol's ``process.v1.ProcessService`` over sandboxd's own
processes and terminals, on the door's gRPC listener.

Every RPC is one :class:`Rpc`: admitted by the one gate as the door's
endpoint ``kep`` and then as the sandboxd endpoint that does the same job
(``Start`` is ``process_start``, or ``pty_create_session`` with a ``pty``;
``Execute`` is ``shell``; ``WriteStdin``, ``SendSignal`` and ``ResizeTTY``
are ``process_stdin``, ``process_signal`` and ``pty_resize``, or the
terminal's endpoints for a process on a PTY), checked by the same
functions as the HTTP routes (argv and shell rules, cwd through the path
guard, environment without secrets, user, timeouts and output caps), and
written to the audit once, ``via: kep``, whatever the outcome.  A refusal
is a gRPC status with sandboxd's code and rule in the trailers
``x-sandboxd-code`` and ``x-sandboxd-rule``.

What the protocol says and the daemon keeps: a ``Start``'s process lives
as long as its stream.  A client that cancels, loses its connection or
passes its deadline ends the process's whole group (the reference ends
only the direct child, so a ``sh -c`` pipeline outlived it), and a
process id answers ``WriteStdin``, ``SendSignal`` and ``ResizeTTY`` while
the process runs.  Ids are the processes' own pids.
"""

from __future__ import annotations

import os
import shlex
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import CancelledError, Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from sandboxd.access import gate
from sandboxd.access import held as held_connections
from sandboxd.access.tracing import trace_headers
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    conflict,
    exhausted,
    forbidden,
    internal,
    limit_exceeded,
    limit_rule,
    not_found,
    timed_out,
    unmet_precondition,
)
from sandboxd.kep import schema
from sandboxd.kep.access import admit
from sandboxd.kep.errors import error_headers, grpc_status_name
from sandboxd.kep.grpc import Call as GrpcCall
from sandboxd.kep.grpc import GrpcFactory, Method, Refusal, Status
from sandboxd.kep.rest import below_root
from sandboxd.policy.defaults import (
    KEP_EXECUTE_DRAIN_SECONDS,
    KEP_MAX_MESSAGE_BYTES,
    KEP_START_DRAIN_SECONDS,
    KEP_TERMINAL_UNREAD_SECONDS,
)
from sandboxd.processes.command import (
    check_not_denied,
    check_shell,
    find_executable,
    is_shell,
    shell_script,
)
from sandboxd.processes.environment import note_argv
from sandboxd.processes.managed import Managed
from sandboxd.routes import process as process_routes
from sandboxd.routes import terminal as terminal_routes
from sandboxd.terminals.service import TERM
from sandboxd.terminals.session import OutputLost, PtySession, SpawnRequest
from sandboxd.web.connections import ConnectionLimits
from sandboxd.web.messages import ServerRequest
from sandboxd.web.params import dimension
from sandboxd.web.portdoor import Pauser, governed_request, run_each

if TYPE_CHECKING:
    from sandboxd.access.auth import Identity
    from sandboxd.policy.rules import EffectiveRule

log = Logger(namespace="sandboxd.kep")

#: The protocol's signals (its ``Signal`` enum is their numbers).
SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGKILL})

#: What a process's exit code is when a signal ended it (Go's ``ExitCode``).
SIGNALLED = -1


def status_of(error: ApiError) -> Status:
    """The gRPC status of a sandboxd error (the door's one table)."""
    return Status[grpc_status_name(error)]


def trailers_of(error: ApiError) -> dict[str, str]:
    """sandboxd's own code and rule, as the REST side's headers name them."""
    return {name.lower(): value for name, value in error_headers(error).items()}


# -- one call -------------------------------------------------------------------


@attrs.define(eq=False)
class Rpc:
    """One RPC through the door, from admission to its audit line."""

    context: Any
    call: GrpcCall
    endpoint_id: str | None = None
    passed: gate.Passed | None = None
    door_passed: gate.Passed | None = None
    #: Who a refused caller turned out to be, for the audit line.
    refused_identity: Identity | None = None
    error: ApiError | None = None
    #: The audit's status and code of an outcome that is not an error.
    status: int = 200
    code: str | None = None
    audit_fields: dict[str, Any] = attrs.Factory(dict)
    #: Trailers an OK answer carries (what the message has no field for).
    trailers: dict[str, str] = attrs.Factory(dict)
    over: bool = False
    #: Fires (None) once the call is over, whichever way: the transport
    #: takes the call's end from it.
    ended: Deferred[None] = attrs.Factory(Deferred)
    _on_gone: list[Callable[[], object]] = attrs.Factory(list)
    _on_over: list[Callable[[], object]] = attrs.Factory(list)

    @property
    def identity(self) -> Identity:
        """Who is calling (once admitted)."""
        passed = self.passed or self.door_passed
        assert passed is not None
        return passed.identity

    @property
    def rule(self) -> EffectiveRule:
        """The mapped endpoint's rule (once admitted)."""
        assert self.passed is not None
        return self.passed.rule

    def admit(self, endpoint_id: str, spend: bool = True) -> None:
        """
        Admit the call as ``endpoint_id`` (the door's own ``kep``, then,
        in a second call, the endpoint doing the job); a call without a
        credential is ``params.unauthenticated_as`` when set.

        :param spend: spend a use of a counted link (the second
            admission only: one call, one use, none for a refused one).
        :raises ApiError: the gate's refusal, audited as what refused it.
        """
        context = self.context
        self.endpoint_id = endpoint_id
        try:
            passed = admit(
                context,
                context.table.get(endpoint_id),
                self.call.headers,
                spend=spend,
            )
        except gate.Refused as refused:
            self.refused_identity = refused.identity
            raise refused.error from None
        if endpoint_id == "kep":
            self.door_passed = passed
        else:
            self.passed = passed

    def hold(self) -> None:
        """
        Note the admitted call as one that may last (a stream, as long as
        its client keeps it; an ``Execute``, as long as its command runs),
        so that a policy reload that takes its identity, scope or endpoint
        away ends it (:meth:`_revoked`).
        """
        assert self.passed is not None
        held = held_connections.hold(
            self.context,
            self.passed.identity,
            self.passed.endpoint,
            self._revoked,
            stream=True,
        )
        self.on_over(lambda: held_connections.release(self.context, held))

    def _revoked(self, error: ApiError) -> None:
        """
        A reload no longer lets the call's caller in: answered with the
        refusal, then what it ran ends as when its client cancels (the
        protocol ties a process to its stream; an ``Execute``'s command
        is its call's).
        """
        callbacks = list(self._on_gone)
        self.fail(error)
        run_each(callbacks, "sandboxd: kep cleanup failed")

    def server_request(
        self,
        body: dict[str, Any] | None = None,
        path_params: dict[str, str] | None = None,
    ) -> ServerRequest:
        """
        The call as the sandboxd handler of its endpoint sees a request,
        so that handler's rules apply as they are, not as a copy.
        """
        assert self.passed is not None
        return governed_request(
            self.context,
            self.passed,
            self.call.peer,
            self.audit_fields,
            body=body,
            path_params=path_params,
            headers=trace_headers(self.call.headers),
        )

    def on_gone(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` if the call ends before it is answered."""
        if self.over:
            return
        self._on_gone.append(callback)

    def on_over(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` once the call is over, whichever way."""
        if self.over:
            callback()
        else:
            self._on_over.append(callback)

    def gone(self, why: str) -> None:
        """
        The client cancelled or left (``cancelled``), its deadline passed
        (``deadline``: the transport answered DEADLINE_EXCEEDED itself), or
        it left a stream's output unread past its bound (``overrun``).
        """
        if self.over:
            return
        if why == "deadline":
            self.status, self.code = 504, "timeout"
        elif why == "overrun":
            self.status, self.code = 429, "rate_limited"
        else:
            # As the HTTP door audits a client that left.
            self.status, self.code = 499, "client_closed"
        # Over first: what the cleanup cancels then fails quietly.
        callbacks = list(self._on_gone)
        self.done()
        run_each(callbacks, "sandboxd: kep cleanup failed")

    def send(self, message: dict[str, Any]) -> None:
        """One response message of a stream."""
        if not self.over:
            self.call.send(message)

    def answer(self, message: dict[str, Any] | None = None) -> None:
        """The response (of a unary call), then OK; a stream: just OK."""
        if self.over:
            return
        try:
            if message is not None:
                self.call.send(message)
        except Exception as e:
            self.failed(Failure(e))
            return
        self.call.finish(Status.OK, trailers=self.trailers)
        self.done()

    def fail(self, error: ApiError) -> None:
        """Answer ``error`` as a gRPC status (and audit it)."""
        if self.over:
            return
        if self.error is None:
            self.error = error
        self.call.finish(status_of(error), error.message, trailers_of(error))
        self.done()

    def failed(self, failure: Failure) -> None:
        """An errback: an ApiError is answered, anything else is a 500."""
        if self.over and failure.check(CancelledError):
            return
        if isinstance(failure.value, ApiError):
            self.fail(failure.value)
            return
        refused = exhausted(failure.value)
        if refused is not None:
            self.fail(refused)
            return
        log.failure(
            "sandboxd: kep call {path} failed", failure, path=self.call.method.path
        )
        self.fail(internal("the call failed"))

    def done(self) -> None:
        """The call is over: release its slots, write its audit line (once)."""
        if self.over:
            return
        self.over = True
        self._on_gone.clear()
        over, self._on_over = self._on_over, []
        run_each(over, "sandboxd: kep cleanup failed")
        context = self.context
        for held in (self.door_passed, self.passed):
            if held is not None:
                gate.release(context, held)
        error = self.error
        endpoint = self.passed.endpoint if self.passed is not None else None
        if endpoint is None and self.endpoint_id is not None:
            endpoint = context.table.get(self.endpoint_id)
        rule = (
            self.passed.rule
            if self.passed is not None
            else context.policy.rules.get(self.endpoint_id or "kep")
        )
        identity = (
            (self.passed or self.door_passed).identity  # type: ignore[union-attr]
            if (self.passed or self.door_passed) is not None
            else self.refused_identity
        )
        gate.audit(
            context,
            door=gate.Door.KEP,
            endpoint=endpoint,
            identity=identity,
            rule=rule,
            method="POST",
            path=self.call.method.path,
            query="",
            status=error.status if error is not None else self.status,
            code=str(error.code) if error is not None and error.code else self.code,
            decided_by=error.rule if error is not None else None,
            started=self.call.started,
            bytes_in=self.call.bytes_in,
            bytes_out=self.call.bytes_out,
            client=self.call.peer,
            extra=self.audit_fields,
            headers=self.call.headers,
        )
        if not self.ended.called:
            self.ended.callback(None)


Handler = Callable[[Rpc, dict[str, Any]], Any]
Chooser = Callable[[Rpc, dict[str, Any]], str]


def serve(
    context: Any, endpoint: str | Chooser, run: Handler
) -> Callable[[GrpcCall, dict[str, Any]], Deferred[None]]:
    """
    The transport's handler of one method: admit, run, answer, audit.  A
    unary handler returns its response (or a Deferred of it); a stream's
    sends its messages and calls :meth:`Rpc.answer` or :meth:`Rpc.fail`
    itself, returning None.
    """

    def handle(call: GrpcCall, message: dict[str, Any]) -> Deferred[None]:
        rpc = Rpc(context, call)
        call.on_end(rpc.gone)
        try:
            # The door first: who is calling is known before the endpoint
            # is chosen (a terminal's only for one the caller may drive).
            rpc.admit("kep", spend=False)
            rpc.admit(endpoint if isinstance(endpoint, str) else endpoint(rpc, message))
            # Every call, not only the streams: an Execute's command runs
            # as long as a Start's, and a revoked caller's must end too.
            rpc.hold()
            d = maybeDeferred(run, rpc, message)
        except ApiError as e:
            rpc.fail(e)
            return rpc.ended
        except Exception as e:
            rpc.failed(Failure(e))
            return rpc.ended
        streaming = call.method.server_streaming
        d.addCallbacks(
            lambda value: None if streaming else rpc.answer(value), rpc.failed
        )
        return rpc.ended

    return handle


# -- what a message asks for ------------------------------------------------------


@attrs.frozen
class Config:
    """A ``ProcessConfig``: argv, extra environment, working directory."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None

    @classmethod
    def of(cls, message: dict[str, Any]) -> Config:
        """
        The config of a ``StartRequest`` or ``ExecuteRequest``.

        :raises ApiError: 400 without a command, as the reference answers;
            400 for a ``cwd`` holding NUL, as for a command holding one.
        """
        config = message.get("config") or {}
        argv = list(config.get("command") or [])
        if not argv or not argv[0]:
            raise bad_request("command is required")
        cwd = config.get("cwd")
        if cwd and "\x00" in cwd:
            raise bad_request("'cwd' must not contain NUL")
        return cls(argv, dict(config.get("env_vars") or {}), cwd or None)


def launch_body(rpc: Rpc, config: Config) -> dict[str, Any]:
    """
    The ``/process/start`` body that makes the HTTP routes' checks check
    this argv, in the door's root (a ``cwd`` is relative to it, as the
    REST side's paths are; the path rules apply to it as to any cwd): a
    shell's ``-c`` script as ``/shell`` checks ``{"shell", "command"}``
    (the SDK sends every command as ``/bin/sh -c COMMAND``), any other
    argv as its words.

    :raises ApiError: 403 ``param_not_allowed`` for a shell the policy's
        ``shells`` leave out, however it is called.
    """
    argv = config.argv
    root = rpc.context.kep.root
    cwd = below_root(root, config.cwd) if config.cwd else root
    if not os.path.isdir(cwd):
        # NOT_FOUND, as the reference answers a cwd that is not there.
        raise not_found(f"cwd {config.cwd!r} is not a directory under the sandbox root")
    body: dict[str, Any] = {"env": config.env, "cwd": cwd}
    script = None
    if is_shell(argv[0]):
        # A shell the policy leaves out is refused as ``/shell`` refuses
        # it, never run as a plain program its words no longer describe.
        check_shell(argv[0], rpc.rule)
        script, handed = shell_script(argv) or (None, [])
        # The arguments a script is handed run as a command of their own
        # when it says ``"$@"``: ``deny_commands`` sees them so too.
        check_not_denied(rpc.rule, handed)
    if script is not None:
        body["command"] = script
        body["shell"] = argv[0]
    else:
        body["command"] = shlex.join(argv)
    if rpc.call.deadline is not None:
        body["timeout"] = rpc.call.deadline
    return body


def not_started(error: OSError, argv: list[str], cwd: str) -> Exception:
    """
    A command that could not start, as the HTTP routes answer it (naming
    its program, not the script it was handed), except that a program that
    cannot be found is answered as the reference's ``mapCommandError`` does.
    """
    if isinstance(error, FileNotFoundError):
        return missing_program(argv[0], cwd)
    return process_routes._spawn_failed(error, argv[0])


def missing_program(program: str, cwd: str) -> ApiError:
    """
    A program the spawn found nothing to run for: PERMISSION_DENIED for a
    path that is there but is no executable file (a directory, a file
    without the execute bit), as ``execve``'s EACCES is in the reference;
    NOT_FOUND otherwise (a bare name no PATH entry has as a program).
    """
    shown = repr(program[:200])
    if "/" in program:
        path = os.path.join(cwd, program)
        if os.path.isdir(path) or (
            os.path.exists(path) and not os.access(path, os.X_OK)
        ):
            return forbidden(
                f"cannot run {shown}: permission denied (not an executable file)",
                Code.PERMISSION_DENIED,
            )
    return not_found(f"cannot run {shown}: command or path not found")


def exit_code(code: int | None) -> int:
    """The protocol's exit code: a signal's end is -1, as the reference's."""
    if code is None or code < 0:
        return SIGNALLED
    return code


def _processes(rpc: Rpc) -> Any:
    service = rpc.context.processes
    assert service is not None
    return service


def _terminals(rpc: Rpc) -> Any:
    service = rpc.context.terminals
    assert service is not None
    return service.table


def _terminal(rpc: Rpc, pid: int) -> PtySession | None:
    """The running terminal of ``pid`` the caller may drive (else None)."""
    session: PtySession | None = _terminals(rpc).running(pid, rpc.identity)
    return session


def find(rpc: Rpc, message: dict[str, Any]) -> Managed | PtySession:
    """
    The running process or terminal of the message's ``process_id``.

    :raises ApiError: 404 as the reference answers an id it does not know
        (another identity's terminal included).
    """
    pid = int(message.get("process_id") or 0)
    managed = _processes(rpc).get(pid) if pid > 0 else None
    if managed is not None and managed.running:
        return managed  # type: ignore[no-any-return]
    session = _terminal(rpc, pid) if pid > 0 else None
    if session is None:
        raise not_found(f"process {pid} not found")
    return session


def by_target(process_endpoint: str, terminal_endpoint: str) -> Chooser:
    """
    An endpoint chooser: the terminal's when the id names a terminal the
    caller may drive; another identity's is not there for it (NOT_FOUND,
    as an id nobody has, whatever scopes the caller holds).
    """

    def choose(rpc: Rpc, message: dict[str, Any]) -> str:
        pid = int(message.get("process_id") or 0)
        found = _terminal(rpc, pid) if pid > 0 else None
        return terminal_endpoint if found is not None else process_endpoint

    return choose


# -- Start ------------------------------------------------------------------------


def start_endpoint(rpc: Rpc, message: dict[str, Any]) -> str:
    """``Start`` with a ``pty`` is a terminal, else a process."""
    return "pty_create_session" if "pty" in message else "process_start"


def start(rpc: Rpc, message: dict[str, Any]) -> None:
    """``Start``: ``init``, the output as it comes, ``exit``."""
    config = Config.of(message)
    if "pty" in message:
        start_terminal(rpc, message, config)
        return
    request = rpc.server_request(launch_body(rpc, config))
    spec = process_routes.launch(request)
    spec = attrs.evolve(spec, argv=config.argv)
    note_argv(request, spec.argv, config.env)
    try:
        managed = process_routes.start_managed(
            request, spec, stdin=True, tag=None, command=shlex.join(spec.argv)
        )
    except OSError as e:
        raise not_started(e, config.argv, spec.cwd) from None
    child = managed.child
    child.wait_for_pipes(KEP_START_DRAIN_SECONDS)
    # The stream is the process's life: a client gone ends the group.
    rpc.on_gone(lambda: child.kill("cancelled"))

    def running(_: object = None) -> None:
        rpc.send({"init": {"process_id": managed.pid}})
        follow(rpc, managed)

    def not_spawned(failure: Failure) -> None:
        error = failure.value
        if isinstance(error, OSError):
            error = not_started(error, config.argv, spec.cwd)
        if not isinstance(error, ApiError):
            error = internal("the command could not start", "OSError")
        rpc.fail(error)

    if child.pending:
        child.when_spawned().addCallbacks(running, not_spawned)
    else:
        running()


def follow(rpc: Rpc, managed: Managed) -> None:
    """Send a process's output as it was read, then its exit."""
    child = managed.child

    def deliver(event: Any) -> None:
        if rpc.over:
            return
        if event is None:
            rpc.send({"exit": {"exit_code": exit_code(child.exit_code)}})
            rpc.answer()
            return
        if event.event in ("stdout", "stderr"):
            data = event.data["data"].encode("utf-8", "surrogateescape")
            rpc.send({event.event: data})
        elif event.event == "exit":
            if child.reason in ("timeout", "idle_timeout"):
                idle = child.reason == "idle_timeout"
                rpc.fail(
                    _timeout(rpc, child.idle_timeout if idle else child.timeout, idle)
                )
                return
            rpc.send({"exit": {"exit_code": exit_code(event.data.get("exit_code"))}})
            rpc.answer()

    _, kept = managed.log.since(0)
    for event in kept:
        deliver(event)
    if rpc.over:
        return
    rpc.on_over(managed.log.subscribe(deliver))
    rpc.call.register_producer(Pauser(child.pause_reading, child.resume_reading))
    if managed.log.closed and not rpc.over:
        deliver(None)


def _timeout(rpc: Rpc, seconds: float | None, idle: bool = False) -> ApiError:
    """
    A command that ran out of time.  The call's own deadline is
    ``DEADLINE_EXCEEDED``, which the SDK reports as its ``command_timeout``
    (exit 124).  A shorter limit of the policy's is not the caller's: the
    SDK would report it with the caller's number, so it is
    ``RESOURCE_EXHAUSTED``, whose message the SDK shows, naming the limit.
    """
    deadline = rpc.call.deadline
    if (
        not idle
        and seconds is not None
        and deadline is not None
        and seconds >= deadline
    ):
        return timed_out(
            f"the command's time ran out after {seconds:g} seconds (the call's "
            "deadline); its process group was killed",
            limit="timeout_seconds",
        )
    limits = rpc.rule.limits
    if idle:
        key = "idle_timeout_seconds"
    elif seconds is not None and seconds == limits.max_duration_seconds:
        key = "max_duration_seconds"
    else:
        key = "timeout_seconds"
    shown = f" ({seconds:g} seconds)" if seconds else ""
    what = "went without output past" if idle else "ran past"
    return timed_out(
        f"the command {what} the policy's {key}{shown}, before the call's "
        "deadline; its process group was killed",
        idle=idle,
        status=429,
        rule=limit_rule(rpc.rule, key),
        limit=key,
    )


def start_terminal(rpc: Rpc, message: dict[str, Any], config: Config) -> None:
    """A ``Start`` with a ``pty``: the command on a terminal of the caller's."""
    pty = message.get("pty") or {}
    # 0 (unset) is the default size; any other size is checked as
    # ResizeTTY checks it (the proto's uint32 is wider than a winsize).
    cols = dimension(int(pty.get("cols") or 0) or 80, "cols")
    rows = dimension(int(pty.get("rows") or 0) or 24, "rows")
    body = launch_body(rpc, config)
    body["env"] = {"TERM": TERM, **config.env}
    request = rpc.server_request(body)
    spec = process_routes.launch(request)
    executable = find_executable(config.argv[0], spec.env)
    if executable is None:
        raise missing_program(config.argv[0], spec.cwd)
    env = dict(spec.env)
    if spec.run_as is not None:
        spec.run_as.apply(env)
    session = terminal_routes.open_session(
        request,
        SpawnRequest(
            executable,
            config.argv,
            env,
            spec.cwd,
            cols,
            rows,
            spec.run_as,
            spec.confine,
        ),
        via="kep",
    )
    table = _terminals(rpc)
    rpc.on_gone(lambda: table.close(session.id))
    if spec.timeout is not None:
        timeout = spec.timeout

        def ran_out() -> None:
            # Named as a command's limit is: the policy's, or the call's.
            rpc.fail(_timeout(rpc, timeout))
            table.close(session.id)

        timer = rpc.context.reactor.callLater(timeout, ran_out)
        session.when_ended().addBoth(
            lambda _: timer.cancel() if timer.active() else None
        )
    rpc.send({"init": {"process_id": session.pid}})
    client = _TerminalClient(rpc, session)
    if not session.attach(client, 0):
        rpc.fail(internal("the terminal took no client"))
        return
    rpc.on_over(lambda: session.detach(client))
    # A slow reader pauses the terminal as long as a plain Start's pauses
    # its pipes, not the few seconds a WebSocket viewer is given: an agent
    # may think for a while between two reads of its build's output.
    rpc.call.register_producer(
        Pauser(
            lambda: session.pause(client, KEP_TERMINAL_UNREAD_SECONDS),
            lambda: session.resume(client),
        )
    )


class _TerminalClient:
    """A terminal's client that sends its output as ``stdout`` messages."""

    def __init__(self, rpc: Rpc, session: PtySession) -> None:
        self.rpc = rpc
        self.session = session
        #: The output offset the next message starts at.
        self.sent = 0

    def send_frame(self, frame: bytes) -> None:
        """
        An output frame's bytes, as the terminal wrote them, in one message.
        The frames follow each other with no gap; one that does not (output
        the scrollback forgot before this client had it) ends the call with
        an error rather than a stream that silently misses bytes.
        """
        if self.rpc.over:
            return
        try:
            output = self.session.output_bytes(frame)
        except OutputLost as e:
            self._lost(e.kept_from)
            return
        if output is None or not output[1]:
            return
        begin, data = output
        if begin != self.sent:
            self._lost(begin)
            return
        self.sent += len(data)
        self.rpc.send({"stdout": data})

    def _lost(self, begin: int) -> None:
        self.rpc.fail(
            internal(
                f"terminal output from byte {self.sent} to {begin} was lost "
                "before it could be sent; the stream ends here"
            )
        )

    def session_ended(self, frame: bytes) -> None:
        """The program ended (its last output came in frames): ``exit``."""
        self.rpc.send({"exit": {"exit_code": exit_code(self.session.exit_code)}})
        self.rpc.answer()

    def pause_input(self) -> None:
        """Input comes by RPC here: nothing to pause."""

    def resume_input(self) -> None:
        """Input comes by RPC here: nothing to resume."""

    def drop_slow(self) -> None:
        """The client left the output unread too long: the call ends."""
        self.rpc.fail(
            limit_exceeded(
                429,
                "the client left terminal output unread for too long",
                Code.RATE_LIMITED,
            )
        )


# -- Execute ----------------------------------------------------------------------

#: What an ``ExecuteResponse`` holds besides the two outputs' bytes: their
#: tags and lengths, and the exit code (ten bytes when negative).
_RESPONSE_FIELDS = 64


def execute(rpc: Rpc, message: dict[str, Any]) -> Deferred[dict[str, Any]]:
    """``Execute``: run to the end; the exit code and both outputs."""
    config = Config.of(message)
    request = rpc.server_request(launch_body(rpc, config))
    spec = process_routes.launch(request)
    spec = attrs.evolve(spec, argv=config.argv)
    note_argv(request, spec.argv, config.env)
    ran = Deferred.fromCoroutine(
        process_routes.run_to_end(
            request,
            spec,
            max_total_bytes=KEP_MAX_MESSAGE_BYTES - _RESPONSE_FIELDS,
            on_spawned=lambda child: child.wait_for_pipes(KEP_EXECUTE_DRAIN_SECONDS),
        )
    )
    rpc.on_gone(ran.cancel)

    def answered(result: Any) -> dict[str, Any]:
        if result.timed_out or result.idle_timed_out:
            idle = bool(result.idle_timed_out)
            raise _timeout(rpc, spec.idle_timeout if idle else spec.timeout, idle)
        if result.truncated:
            # ExecuteResponse has no field for it: the head and the tail
            # are kept (a marker between them), and the trailers say so.
            # Both outputs together fit one message, which a client takes
            # only up to its 4 MiB default, so that cuts them too.
            rpc.audit_fields["truncated"] = True
            rpc.trailers["x-sandboxd-truncated"] = "true"
            rpc.trailers["x-sandboxd-dropped-bytes"] = str(result.dropped_bytes)
        return {
            "exit_code": exit_code(result.exit_code),
            "stdout": result.stdout,
            "stderr": result.stderr,
        }

    def not_run(failure: Failure) -> Failure:
        if isinstance(failure.value, OSError):
            raise not_started(failure.value, config.argv, spec.cwd)
        return failure

    return ran.addCallbacks(answered, not_run)


# -- WriteStdin, SendSignal, ResizeTTY --------------------------------------------


def write_stdin(rpc: Rpc, message: dict[str, Any]) -> dict[str, Any]:
    """``WriteStdin``: bytes for the process's stdin, or its end."""
    target = find(rpc, message)
    if isinstance(target, PtySession):
        if "eof" in message:
            target.write(b"\x04")
        else:
            target.write(message.get("input") or b"")
        return {}
    if "eof" in message:
        if not target.child.stdin_open:
            # Closed already: closing it again changes nothing, as in the
            # reference.
            return {}
        process_routes.process_stdin(
            rpc.server_request(
                body={"data": "", "eof": True}, path_params={"pid": str(target.pid)}
            )
        )
        return {}
    if not target.child.stdin_open:
        # Every Start has a stdin here: it is closed only by an eof.
        raise conflict(
            f"process {target.pid}'s stdin is closed (an eof was sent)",
            Code.STDIN_CLOSED,
            "ConflictError",
        )
    process_routes.feed_stdin(target, message.get("input") or b"")
    return {}


def send_signal(rpc: Rpc, message: dict[str, Any]) -> dict[str, Any]:
    """``SendSignal``: SIGINT, SIGTERM or SIGKILL, to the process's group."""
    # The id first: an unknown one is NOT_FOUND whatever the signal, as
    # the reference answers.
    target = find(rpc, message)
    number = int(message.get("signal") or 0)
    if number not in SIGNALS:
        raise bad_request(f"unsupported or unspecified signal: {number}")
    if isinstance(target, PtySession):
        target.send_signal(signal.Signals(number).name)
        return {}
    process_routes.process_signal(
        rpc.server_request(
            body={"signal": number}, path_params={"pid": str(target.pid)}
        )
    )
    return {}


def resize(rpc: Rpc, message: dict[str, Any]) -> dict[str, Any]:
    """``ResizeTTY``: a terminal's size; a process without one is refused."""
    target = find(rpc, message)
    if not isinstance(target, PtySession):
        # FAILED_PRECONDITION, as the reference answers.
        raise unmet_precondition(f"process {target.pid} has no terminal to resize")
    terminal_routes.pty_resize(
        rpc.server_request(
            body={"cols": message.get("cols"), "rows": message.get("rows")},
            path_params={"id": target.id},
        )
    )
    return {}


# -- the service ------------------------------------------------------------------


def methods(context: Any) -> dict[str, Method]:
    """The service's methods, each served through the gate."""

    def method(
        rpc: schema.Rpc, endpoint: str | Chooser, run: Handler
    ) -> tuple[str, Method]:
        return rpc.path, Method(
            rpc.path,
            rpc.request,
            rpc.response,
            rpc.server_streaming,
            serve(context, endpoint, run),
        )

    return dict(
        [
            method(schema.START, start_endpoint, start),
            method(schema.EXECUTE, "shell", execute),
            method(
                schema.WRITE_STDIN,
                by_target("process_stdin", "pty_connect"),
                write_stdin,
            ),
            method(
                schema.SEND_SIGNAL,
                by_target("process_signal", "pty_delete_session"),
                send_signal,
            ),
            method(schema.RESIZE_TTY, "pty_resize", resize),
        ]
    )


#: How a call the transport refused reads in the audit: status and code.
REFUSED_AS = {
    Status.UNIMPLEMENTED: (501, "unsupported"),
    Status.INVALID_ARGUMENT: (400, "malformed_request"),
    Status.INTERNAL: (400, "malformed_request"),
    Status.RESOURCE_EXHAUSTED: (413, "payload_too_large"),
}


def audit_refusal(context: Any, refusal: Refusal) -> None:
    """
    The one audit line of a call the transport answered itself (no
    handler ran, so no identity was asked for): as the door's ``kep``.
    """
    status, code = REFUSED_AS.get(refusal.status, (500, "internal"))
    if refusal.code == Code.CONCURRENCY_LIMITED:
        status, code = 429, refusal.code
    gate.audit(
        context,
        door=gate.Door.KEP,
        endpoint=context.table.get("kep"),
        identity=None,
        rule=context.policy.rules.get("kep"),
        method="POST",
        path=refusal.path[:1024],
        query="",
        status=status,
        code=code,
        decided_by=None,
        started=refusal.started,
        bytes_in=refusal.bytes_in,
        client=refusal.peer,
        extra={"grpc_status": refusal.status.name},
        headers=refusal.headers,
    )


def grpc_factory(context: Any, limits: ConnectionLimits | None = None) -> GrpcFactory:
    """
    The door's gRPC listener: the process service on the reactor, a
    request message's time bounded as the HTTP door bounds a body
    (``--head-deadline``, ``--body-min-rate``).
    """
    limits = limits or ConnectionLimits()
    return GrpcFactory(
        context.reactor,
        methods(context),
        read_grace=limits.head_deadline,
        read_min_rate=limits.body_min_rate,
        on_refusal=lambda refusal: audit_refusal(context, refusal),
    )
