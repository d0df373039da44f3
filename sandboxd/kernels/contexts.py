# -*- test-case-name: tests.kernels.test_contexts -*-
"""
A code context (one kernel and its executions) and an execution (one piece
of code run in it, with its own bounded event log).

A context's kernel is a governed child: spawned by the daemon from its
kernelspec, in its own session, as the request's user, with the secrets
stripped from its environment; restarting or deleting the context ends
the kernel's whole tree. Executions queue FIFO and run one at a time; the
hub (:mod:`sandboxd.kernels.hubclient`) turns their Jupyter messages into the
events logged here. Every execution ends with one ``execution.ended`` event
whose ``state`` says what happened (``ok``, ``error``, ``interrupted``,
``timeout``, ``lost``); a kernel that had to be restarted says so with
``context.restarted`` first, so a lost state is never silent.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import time
from collections import OrderedDict, deque
from typing import Any, Protocol

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

from sandboxd.errors import (
    ApiError,
    Code,
    conflict,
    exhausted,
    internal,
    limit_exceeded,
    timed_out,
    unavailable,
)
from sandboxd.eventlog import EventLog
from sandboxd.kernels.hubclient import attend
from sandboxd.kernels.jsontext import (
    SMALL_OUTPUT_BYTES,
    EscapedText,
    JsonParts,
    document,
)
from sandboxd.kernels.kernelspecs import KernelSpec, builtin_python, kernel_argv
from sandboxd.policy import defaults
from sandboxd.policy.confinement import Confinement
from sandboxd.processes.child import Child, HeadTail, signal_child
from sandboxd.processes.command import RunAs
from sandboxd.processes.run import spawn
from sandboxd.sysinfo import ports_of
from sandboxd.waiters import Waiters

log = Logger(namespace="sandboxd.kernels")

#: The states an execution ends in.
FINAL_STATES = ("ok", "error", "interrupted", "timeout", "lost")

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class Host(Protocol):
    """What a context needs of its service (:class:`~sandboxd.kernels.service.CodeService`)."""

    reactor: Any
    children: Any
    #: The daemon's :class:`~sandboxd.daemon.context.Context`.
    context: Any

    def hub(self, run_as: RunAs | None = None) -> Any:
        """The hub of ``run_as``'s kernels, started if none runs."""

    def hub_send(self, run_as: RunAs | None, command: dict[str, Any]) -> None:
        """Send to ``run_as``'s hub if one runs."""

    def spill(
        self, ctx: CodeContext, x: Execution, data: dict[str, Any]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Display values within bounds, the rest spilled to files."""

    def execution_ended(self, ctx: CodeContext, x: Execution) -> None:
        """An execution ended."""


@attrs.frozen
class ExecutionLimits:
    """The bounds one execution runs under (from its ``code_execute`` rule)."""

    timeout: float
    max_output_bytes: int
    max_display_bytes: int
    max_event_bytes: int
    interrupt_grace: float


@attrs.define(eq=False)
class Execution:
    """
    One piece of code run in a context.

    :ivar log: its events (SPEC §9: resumable by ``seq``), closed after
        ``execution.ended``.
    """

    id: str
    context_id: str
    code: str
    limits: ExecutionLimits
    allow_stdin: bool = False
    silent: bool = False
    store_history: bool = True
    env: dict[str, str] | None = None
    #: Answered as a result document over HTTP: its output is escaped for
    #: JSON as it arrives, ready when it ends (:meth:`result_json`).
    escape_output: bool = False
    state: str = "queued"
    started: bool = False
    execution_count: int | None = None
    created_at: float = attrs.Factory(time.time)
    started_at: float | None = None
    ended_at: float | None = None
    error: dict[str, Any] | None = None
    input_pending: bool = False
    interrupted: bool = False
    timing_out: bool = False
    #: Its client left and asked for it to be interrupted: nobody reads
    #: what it says from then on.
    abandoned: bool = False
    log: EventLog = attrs.field(init=False)
    stdout: HeadTail = attrs.field(init=False)
    stderr: HeadTail = attrs.field(init=False)
    stdout_json: EscapedText | None = attrs.field(init=False)
    stderr_json: EscapedText | None = attrs.field(init=False)
    results: list[dict[str, Any]] = attrs.Factory(list)
    results_bytes: int = 0
    #: Output bytes dropped on the way from the kernel (the hub's buffer
    #: full while the daemon did not read), and display items.
    lost_bytes: int = 0
    lost_displays: int = 0
    #: Messages of the kernel's that never reached the hub (ZMQ dropped
    #: them): what they held is not known, only that it is missing.
    lost_messages: int = 0
    #: A ``clear_output(wait=True)`` waiting for the next output.
    clear_pending: bool = False
    ended: Waiters[None] = attrs.Factory(Waiters)
    timer: IDelayedCall | None = None
    #: What it held as it ended (see ``CodeContext._forget_old``).
    held_at_end: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self.log = EventLog(self.limits.max_event_bytes)
        self.stdout = HeadTail(self.limits.max_output_bytes)
        self.stderr = HeadTail(self.limits.max_output_bytes)
        cap = self.limits.max_output_bytes
        self.stdout_json = EscapedText(cap) if self.escape_output else None
        self.stderr_json = EscapedText(cap) if self.escape_output else None

    @property
    def done(self) -> bool:
        """Whether it has ended."""
        return self.state in FINAL_STATES

    @property
    def code_sha256(self) -> str:
        """The sha256 of its code (what the audit line carries)."""
        return hashlib.sha256(self.code.encode("utf-8", "surrogatepass")).hexdigest()

    @property
    def events_url(self) -> str:
        """Where its events stream from."""
        return f"/code/contexts/{self.context_id}/executions/{self.id}/events"

    def emit(self, event: str, size: int | None = None, **data: Any) -> None:
        """
        Log one event (every event names its execution).

        :param size: what it costs in the log, when the caller knows it
            cheaper than by encoding it (output text: its length).
        """
        if not self.log.closed:
            self.log.append(event, {"execution_id": self.id, **data}, size)

    def wait(self) -> Deferred[None]:
        """Fires once it has ended (at once if it has)."""
        if self.done:
            d: Deferred[None] = Deferred()
            d.callback(None)
            return d
        return self.ended.wait()

    def duration_ms(self) -> float | None:
        """How long it ran (so far)."""
        if self.started_at is None:
            return None
        end = self.ended_at if self.ended_at is not None else time.time()
        return round((end - self.started_at) * 1000.0, 2)

    @property
    def big_output(self) -> bool:
        """
        Whether its output is worth :meth:`result_json` (under
        :data:`~sandboxd.kernels.jsontext.SMALL_OUTPUT_BYTES`, one encode of
        the whole :meth:`result` is cheaper).
        """
        return self.stdout.total_bytes + self.stderr.total_bytes >= SMALL_OUTPUT_BYTES

    @property
    def truncated(self) -> bool:
        """Whether output was dropped from its result (head and tail kept)."""
        return (
            self.stdout.truncated
            or self.stderr.truncated
            or self.lost_bytes > 0
            or self.lost_displays > 0
            or self.lost_messages > 0
        )

    @property
    def dropped_bytes(self) -> int:
        """Output bytes dropped between head and tail, or on their way."""
        return self.stdout.dropped_bytes + self.stderr.dropped_bytes + self.lost_bytes

    def summary(self) -> dict[str, Any]:
        """The ``code_executions_list`` entry."""
        return {
            "execution_id": self.id,
            "context_id": self.context_id,
            "state": self.state,
            "started": self.started,
            "execution_count": self.execution_count,
            "code_sha256": self.code_sha256,
            "code_head": self.code[:256],
            "created_at": self.created_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "events_url": self.events_url,
        }

    def result(self) -> dict[str, Any]:
        """The result document (what a finished ``code_execute`` answers)."""
        return {
            name: value.decode("utf-8", "replace")
            if isinstance(value, bytes)
            else value
            for name, value in self._result_fields(
                self.stdout.value(), self.stderr.value()
            ).items()
        }

    def result_json(self) -> bytes:
        """
        :meth:`result` as the JSON bytes the API answers, its output
        escaped as it arrived (once) or from its bytes, never decoded and
        encoded again (:mod:`sandboxd.kernels.jsontext`).
        """
        return document(
            self._result_fields(
                _output_json(self.stdout, self.stdout_json),
                _output_json(self.stderr, self.stderr_json),
            )
        )

    def _result_fields(self, stdout: Any, stderr: Any) -> dict[str, Any]:
        """The result document with its output as given."""
        return {
            "execution_id": self.id,
            "context_id": self.context_id,
            "state": self.state,
            "started": self.started,
            "execution_count": self.execution_count,
            "stdout": stdout,
            "stderr": stderr,
            "results": list(self.results),
            "error": self.error,
            "duration_ms": self.duration_ms(),
            "truncated": self.truncated,
            "dropped_bytes": self.dropped_bytes,
            "events_url": self.events_url,
        }


#: Said on an execution's stderr when the kernel's notice that it is idle
#: never came and it ended on its reply alone.
IDLE_LOST_NOTE = (
    "\n[sandboxd] the kernel's last messages for this execution did not"
    " arrive (its end was taken from its reply): output may be missing\n"
)


def _update_display(x: Execution, item: dict[str, Any]) -> bool:
    """
    An ``update_display_data``: replace the items of ``x`` that show the
    same ``display_id`` (as Jupyter redraws them in place), so a progress
    display updated a thousand times is one item in the document, in its
    last state. False if ``x`` has none.
    """
    found = False
    for i, old in enumerate(x.results):
        if item.get("display_id") and old.get("display_id") == item["display_id"]:
            x.results_bytes = max(0, x.results_bytes - _inline_bytes(old))
            x.results[i] = {**item, "is_result": bool(old.get("is_result"))}
            found = True
    return found


def _clear(x: Execution) -> None:
    """
    A ``clear_output``: what ``x`` showed so far (its output and display
    items) is gone from its document, as from a notebook's cell.
    """
    x.clear_pending = False
    x.results.clear()
    x.results_bytes = 0
    cap = x.limits.max_output_bytes
    x.stdout = HeadTail(cap)
    x.stderr = HeadTail(cap)
    x.stdout_json = EscapedText(cap) if x.escape_output else None
    x.stderr_json = EscapedText(cap) if x.escape_output else None


def _inline_bytes(item: dict[str, Any]) -> int:
    """What a display item's values held in the document count (near enough)."""
    data = item.get("data") or {}
    return sum(
        len(v.encode("utf-8", "surrogatepass"))
        if isinstance(v, str)
        else len(json.dumps(v))
        for v in data.values()
    )


#: Said on the stderr of an execution whose end the hub could not report.
HUB_LOST_NOTE = (
    "\n[sandboxd] the kernel hub was lost: the rest of this execution's"
    " output and its end were not seen (the kernel and its state are kept)\n"
)


def _restart_note(reason: str, exit_code: int | None, when: str) -> str:
    """The stderr line of an execution whose kernel was restarted (``when``)."""
    why = reason if exit_code is None else f"{reason}, exit code {exit_code}"
    # Mid-execution, on a line of its own after what the code printed.
    lead = "\n" if when.startswith("during") else ""
    return (
        f"{lead}[sandboxd] the kernel was restarted ({why}) {when}: its state"
        " (variables, imports, cwd) is gone\n"
    )


def _count(event: dict[str, Any], key: str) -> int:
    """A non-negative count from a hub event (0 if it has none)."""
    value = event.get(key)
    return value if type(value) is int and value > 0 else 0


def _dropped_note(event: dict[str, Any], where: str) -> str:
    """The stderr line that says what the hub dropped (``dropped`` event)."""
    parts = [
        f"{_count(event, name)} bytes of {name}"
        for name in ("stdout", "stderr")
        if _count(event, name)
    ]
    if _count(event, "displays"):
        parts.append(f"{_count(event, 'displays')} display items")
    return (
        f"\n[sandboxd] {' and '.join(parts) or 'output'} dropped {where}: the"
        " kernel printed faster than the daemon read, past the kernel hub's"
        " buffer\n"
    )


def _output_json(output: HeadTail, escaped: EscapedText | None) -> Any:
    """A stream's output for :func:`document`: escaped already, or its bytes."""
    parts = escaped.take() if escaped is not None else None
    return JsonParts(parts) if parts is not None else output.value()


def _held_bytes(x: Execution) -> int:
    """What a finished execution keeps in memory (near enough)."""
    kept = x.stdout.total_bytes - x.stdout.dropped_bytes
    kept += x.stderr.total_bytes - x.stderr.dropped_bytes
    for escaped in (x.stdout_json, x.stderr_json):
        if escaped is not None:
            kept += escaped.held_bytes
    return x.log.retained_bytes + kept + x.results_bytes


def hub_key(run_as: RunAs | None) -> int:
    """The uid whose hub speaks for a kernel run as ``run_as``."""
    return run_as.uid if run_as is not None else os.geteuid()


#: The languages whose kernels take a per-execution ``env``.
ENV_LANGUAGES = ("python", "bash")

#: A name bash can ``export`` (the others it refuses).
BASH_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_prologue(env: dict[str, str], language: str = "python") -> tuple[str, str]:
    """
    The code, in ``language``, that sets ``env`` for one execution and the
    code that puts the old values back.

    Python: the values travel as one JSON document in a Python string
    literal (``repr``), never pasted into code, so no quote in a value can
    change the code.  Bash (``export``, as E2B's server applies ``envs``
    there): each value is single-quoted by :func:`shlex.quote`, and each
    name is one bash takes (see :data:`BASH_NAME`); the old values and
    attributes are kept as ``declare -p`` prints them (quoted by bash)
    and given back with ``eval``, a name that had none unset.
    """
    if language == "bash":
        # The names are checked where the request is read; one that is not
        # a bash name is never pasted into the shell's code all the same.
        env = {k: v for k, v in env.items() if BASH_NAME.fullmatch(k)}
        if not env:
            return "", ""
        names = " ".join(env)
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        before = (
            f"__sandboxd_saved_env=$(declare -p {names} 2>/dev/null)\n"
            f"export {assignments}\n"
        )
        after = (
            f'unset {names}\neval "$__sandboxd_saved_env"\nunset __sandboxd_saved_env\n'
        )
        return before, after
    literal = repr(json.dumps(env))
    before = (
        "(lambda os, env: (os.__dict__.__setitem__('_sandboxd_saved_env', "
        "{k: os.environ.get(k) for k in env}), os.environ.update(env)))"
        f"(__import__('os'), __import__('json').loads({literal}))"
    )
    after = (
        "(lambda os: [os.environ.pop(k, None) if v is None else "
        "os.environ.__setitem__(k, v) for k, v in "
        "os.__dict__.pop('_sandboxd_saved_env', {}).items()])(__import__('os'))"
    )
    return before, after


class CodeContext:
    """
    One kernel and its executions.

    States: ``starting`` → ``idle`` ⇄ ``busy``, ``restarting``, ``dead``
    (restarts exhausted), ``closed``.
    """

    def __init__(
        self,
        service: Host,
        spec: KernelSpec,
        owner: str,
        cwd: str,
        env: dict[str, str],
        run_as: RunAs | None,
        limits: Any,
        auto_restart: bool,
        name: str | None = None,
        confine: Confinement | None = None,
    ) -> None:
        self.service = service
        self.reactor = service.reactor
        self.id = "ctx_" + secrets.token_hex(8)
        self.spec = spec
        #: ``sandboxd-python``: spoken to directly, not through the hub.
        self.builtin = spec.source == "builtin"
        self.owner = owner
        self.cwd = cwd
        self.env = env
        self.run_as = run_as
        #: Which hub speaks for it: the one of its kernel's user.
        self.hub_key = hub_key(run_as)
        #: The kernel's connection info (kept here: the file in its
        #: directory is its user's to change).
        self._conn: dict[str, Any] | None = None
        self._conn_path: str | None = None
        self.name = name
        self.auto_restart = auto_restart
        self.start_timeout: float = limits["start_timeout_seconds"]
        self.idle_timeout: float = limits["idle_timeout_seconds"]
        self.max_queued: int = limits["max_queued"]
        self.created_at = time.time()
        self.last_activity = time.monotonic()
        self.last_activity_at = time.time()
        self.state = "starting"
        self.kernel: Child | None = None
        #: The TCP ports the kernel listened on once ready, before any of
        #: the user's code ran: its own (ipykernel binds a ZMQ socket on
        #: loopback TCP even with ``transport: ipc``).  The preview door
        #: never forwards to them; a port the user's code opens later is
        #: not among them.
        self.kernel_ports: frozenset[int] = frozenset()
        self.kernel_stderr = HeadTail(8 * defaults.KIB)
        self.exit_code: int | None = None
        self.restarts = 0
        self._recent_deaths: deque[float] = deque()
        self.info: dict[str, Any] = {}
        self.queue: deque[Execution] = deque()
        self.current: Execution | None = None
        self.executions: OrderedDict[str, Execution] = OrderedDict()
        #: What the last execution's end forgot of earlier ones (bytes).
        self.forgotten_bytes = 0
        #: The sizes the finished executions listed had as each ended.
        self._held_at_ends = 0
        self._ready: Waiters[None] = Waiters()
        self._start_timer: IDelayedCall | None = None
        #: The hub a kernel's open was sent to, and its lines heard by then.
        self._opened_on: tuple[Any, int] | None = None
        self._grace_timer: IDelayedCall | None = None
        self._pending_epilogue: str | None = None
        #: A restart no client was told of (the kernel died while idle, or
        #: under an execution whose client had left): the next execution
        #: to start says so (:meth:`_tell_restart`).
        self._unseen_restart: dict[str, Any] | None = None
        #: Output the kernel sent for an execution that had ended while no
        #: other ran (a cell's thread printing on), by stream, for the next
        #: execution to start (:meth:`_late_output`).
        self._between: dict[str, HeadTail] = {}
        self.dir = service.context.scratch.mkdtemp("sandboxd-code-")
        if run_as is not None and os.geteuid() == 0:
            os.chown(self.dir, run_as.uid, run_as.gid)
        #: What the kernel is confined to (``params.confine``), its own
        #: directory (its sockets, its connection file) writable too.
        self.confine = (
            None
            if confine is None
            else attrs.evolve(confine, write=(*confine.write, self.dir))
        )
        if confine is not None and not confine.may_write(env.get("HOME", "")):
            # IPython makes ~/.ipython if access(2) says it may, which the
            # kernel's confinement does not change, and dies when the
            # kernel refuses: it gets a directory the kernel may write.
            env.setdefault("IPYTHONDIR", os.path.join(self.dir, "ipython"))

    # -- views --------------------------------------------------------------

    @property
    def language(self) -> str:
        """The kernel's language (what its spec or ``kernel_info`` says)."""
        return str(self.info.get("name") or self.spec.language or "")

    def describe(self, detail: bool = False) -> dict[str, Any]:
        """The context document."""
        out: dict[str, Any] = {
            "id": self.id,
            "kernel": self.spec.name,
            "language": self.language,
            "name": self.name,
            "cwd": self.cwd,
            "user": self.run_as.name if self.run_as is not None else None,
            "state": self.state,
            "created_at": self.created_at,
            "last_activity": self.last_activity_at,
            "execution_count": self._last_count(),
            "pid": self.kernel.pid if self.kernel is not None else None,
            "owner": self.owner,
            "restarts": self.restarts,
        }
        if detail:
            out["current_execution"] = self.current.id if self.current else None
            out["queued"] = [x.id for x in self.queue]
            out["exit_code"] = self.exit_code
        return out

    def _last_count(self) -> int:
        for x in reversed(self.executions.values()):
            if x.execution_count is not None:
                return x.execution_count
        return 0

    def touch(self) -> None:
        """Note activity (the idle timeout counts from here)."""
        self.last_activity = time.monotonic()
        self.last_activity_at = time.time()

    # -- the kernel -----------------------------------------------------------

    def start(self) -> Deferred[None]:
        """Spawn the kernel and connect the hub; fires once it answers."""
        waiting = self._ready.wait()
        self._spawn()
        return waiting

    def _spawn(self) -> None:
        self.state = "starting" if self.state != "restarting" else "restarting"
        if self.builtin:
            self._spawn_builtin()
            return
        conn = {
            "transport": "ipc",
            "ip": os.path.join(self.dir, f"k{secrets.token_hex(3)}"),
            "shell_port": 1,
            "iopub_port": 2,
            "stdin_port": 3,
            "control_port": 4,
            "hb_port": 5,
            "key": secrets.token_hex(32),
            "signature_scheme": "hmac-sha256",
            "kernel_name": self.spec.name,
        }
        try:
            path = self._write_connection(conn)
        except OSError as e:
            self._start_failed(
                exhausted(e)
                or internal(
                    f"cannot write the kernel's connection file: {e}", "OSError"
                )
            )
            return
        self._conn = conn
        env = dict(self.env)
        child = Child(self.reactor, self._kernel_output)
        try:
            spawn(
                self.reactor,
                child,
                kernel_argv(self.spec, path),
                children=self.service.children,
                env=env,
                cwd=self.cwd,
                run_as=self.run_as,
                confine=self.confine,
            )
        except OSError as e:
            self._start_failed(
                exhausted(e) or internal(f"the kernel could not start: {e}", "OSError")
            )
            return
        self.kernel = child
        child.ended.addCallback(self._kernel_ended, child)
        attend(child)
        self._start_timer = self.reactor.callLater(
            self.start_timeout, self._start_timed_out, child
        )
        self._open_on_hub(conn)

    def _open_on_hub(self, conn: dict[str, Any]) -> None:
        """
        Ask the hub to connect to the kernel, noting what it had said by
        then (a start that times out with the hub silent since is the
        hub's fault: see :meth:`_start_timed_out`).
        """
        hub = self.service.hub(self.run_as)
        self._opened_on = (hub, hub.heard)
        hub.send(
            {"op": "open", "cid": self.id, "conn": conn, "timeout": self.start_timeout}
        )

    def _write_connection(self, conn: dict[str, Any]) -> str:
        """
        The kernel's connection file: a new name each start, created (never
        opened if it exists: the directory is the kernel's user's, who may
        have left a link there), 0600 and owned by that user through its
        descriptor, not its path.  The last start's file goes first, so a
        restart on a full disk has its room.
        """
        if self._conn_path is not None:
            # The last start's (unlink never follows a link).
            try:
                os.unlink(self._conn_path)
            except OSError:
                pass
        self._conn_path = None
        path = os.path.join(self.dir, f"connection-{secrets.token_hex(4)}.json")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                if self.run_as is not None and os.geteuid() == 0:
                    os.fchown(f.fileno(), self.run_as.uid, self.run_as.gid)
                json.dump(conn, f)
        except OSError:
            # A full disk: no half-written file is left for the next start.
            os.unlink(path)
            raise
        self._conn_path = path
        return path

    def _spawn_builtin(self) -> None:
        """
        ``sandboxd-python``: no hub; the kernel's stdin takes the commands
        and its stdout carries the events, one JSON line each.
        """
        from sandboxd.kernels.hubclient import LineSplitter

        def overflow(size: int) -> None:
            log.warn("code context {id}: a line of {size} bytes", id=self.id, size=size)
            if self.kernel is not None:
                self.kernel.kill("killed")

        splitter = LineSplitter(
            defaults.CODE_HUB_MAX_LINE_BYTES, self._builtin_line, overflow
        )

        def output(fd: int, data: bytes) -> None:
            if fd == 1:
                splitter.feed(data)
            else:
                self.kernel_stderr.write(data)

        try:
            # The Python of the kernel's own PATH (the sandbox's), one its
            # user can run: else the kernel dies at once (126), unexplained.
            python = builtin_python(self.env, self.run_as)
        except ValueError as e:
            self._start_failed(unavailable(str(e)))
            return
        child = Child(self.reactor, output)
        try:
            spawn(
                self.reactor,
                child,
                [python, *kernel_argv(self.spec, "")[1:]],
                children=self.service.children,
                env=dict(self.env),
                cwd=self.cwd,
                run_as=self.run_as,
                stdin_pipe=True,
                confine=self.confine,
            )
        except OSError as e:
            self._start_failed(
                exhausted(e) or internal(f"the kernel could not start: {e}", "OSError")
            )
            return
        self.kernel = child
        child.read_chunks(1, defaults.CODE_HUB_READ_BYTES)
        child.ended.addCallback(self._kernel_ended, child)
        attend(child)
        self._start_timer = self.reactor.callLater(
            self.start_timeout, self._start_timed_out, child
        )

    def _builtin_line(self, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        if isinstance(event, dict):
            self.hub_event(event)

    def _send(self, command: dict[str, Any]) -> None:
        """A command for the kernel: through the hub, or on the built-in kernel's stdin."""
        if not self.builtin:
            self.service.hub(self.run_as).send(command)
        elif self.kernel is not None:
            line = json.dumps(command, separators=(",", ":"), ensure_ascii=False)
            self.kernel.write_stdin(
                line.encode("utf-8", "surrogatepass") + b"\n", now=True
            )

    def _hub_close(self) -> None:
        if not self.builtin:
            self.service.hub_send(self.run_as, {"op": "close", "cid": self.id})

    def _kernel_output(self, fd: int, data: bytes) -> None:
        self.kernel_stderr.write(data)

    def _start_timed_out(self, child: Child) -> None:
        self._start_timer = None
        if child is self.kernel and self.state in ("starting", "restarting"):
            if self._opened_on is not None:
                hub, heard = self._opened_on
                hub.suspect(heard, defaults.CODE_HUB_ANSWER_GRACE_SECONDS)
            self._start_failed(
                timed_out(
                    f"the kernel did not answer within {self.start_timeout:g} seconds;"
                    " its process tree was killed",
                    status=504,
                )
            )

    def _start_failed(self, error: ApiError) -> None:
        if self._start_timer is not None and self._start_timer.active():
            self._start_timer.cancel()
        self._start_timer = None
        kernel, self.kernel = self.kernel, None
        if kernel is not None:
            kernel.kill("killed")
        self._hub_close()
        self.state = "dead"
        for x in list(self.queue):
            self._end(x, "lost")
        self.queue.clear()
        self._ready.fail(error)

    def hub_event(self, event: dict[str, Any]) -> None:
        """One event from the hub about this context."""
        kind = event.get("ev")
        if kind == "ready":
            self._on_ready(event.get("info") or {})
            return
        if kind == "late":
            self._late_output(event)
            return
        if kind == "dropped" and event.get("xid") is None:
            self._late_output(
                {
                    "name": "stderr",
                    "text": _dropped_note(event, "while no execution ran"),
                }
            )
            return
        if kind == "failed":
            if self.state in ("starting", "restarting"):
                tail = self.kernel_stderr.value().decode("utf-8", "replace").strip()
                msg = f"the kernel did not start: {event.get('message')}"
                self._start_failed(
                    internal(msg + (f" ({tail[-500:]})" if tail else ""))
                )
            return
        xid = event.get("xid")
        if not isinstance(xid, str):
            return
        x = self.current
        if x is None or x.id != xid:
            if kind == "done" and self._pending_epilogue == xid:
                self._pending_epilogue = None
                self._next()
            return
        self.touch()
        if kind == "stream":
            self._on_stream(x, event)
        elif kind == "display":
            self._on_display(x, event)
        elif kind == "started":
            x.started = True
            x.execution_count = event.get("count")
            x.emit("execution.started", execution_count=x.execution_count)
        elif kind == "error":
            tb = [str(t) for t in event.get("traceback") or []]
            x.error = {
                "ename": event.get("ename", ""),
                "evalue": event.get("evalue", ""),
                "traceback": tb,
            }
            x.emit("error", traceback_text=_ANSI.sub("", "\n".join(tb)), **x.error)
        elif kind == "input":
            x.input_pending = True
            x.emit(
                "input.requested",
                prompt=event.get("prompt", ""),
                password=bool(event.get("password")),
            )
        elif kind == "clear":
            wait = bool(event.get("wait"))
            x.emit("clear_output", wait=wait)
            if wait:
                x.clear_pending = True
            else:
                _clear(x)
        elif kind == "dropped":
            self._on_dropped(x, event)
        elif kind == "done":
            lost = _count(event, "lost_messages")
            if lost:
                x.lost_messages += lost
                self._note(
                    x,
                    f"\n[sandboxd] {lost} of the kernel's messages never arrived:"
                    " its output socket drops what its reader has not taken"
                    " (the machine was busy), so output may be missing\n",
                )
            if event.get("idle_lost"):
                self._note(x, IDLE_LOST_NOTE)
            self._on_done(x, str(event.get("status")), event.get("count"))
        elif kind == "bad_command":
            self._end(x, "lost")
            self._next()

    def _on_ready(self, info: dict[str, Any]) -> None:
        if self._start_timer is not None and self._start_timer.active():
            self._start_timer.cancel()
        self._start_timer = None
        if self.state not in ("starting", "restarting"):
            return
        self.info = info
        self.state = "idle"
        if self.kernel is not None and self.kernel.pid:
            self.kernel_ports = ports_of(self.kernel.pid)
        self.touch()
        self._ready.fire(None)
        self._next()

    def _on_stream(self, x: Execution, event: dict[str, Any]) -> None:
        name = "stderr" if event.get("name") == "stderr" else "stdout"
        raw = event.get("raw")
        if isinstance(raw, bytes | bytearray):  # the hub's: UTF-8 after the line
            text = raw.decode("utf-8", "surrogatepass")
        else:  # the built-in kernel's: text in the line
            text = str(event.get("text", ""))
            raw = text.encode("utf-8", "surrogatepass")
        if x.clear_pending:
            _clear(x)
        (x.stderr if name == "stderr" else x.stdout).write(raw)
        escaped = x.stderr_json if name == "stderr" else x.stdout_json
        if escaped is not None:
            escaped.write(raw)
        # Its size in the log is its length plus the frame: no second encode.
        x.emit(name, size=len(raw) + 64, text=text)

    def _on_dropped(self, x: Execution, event: dict[str, Any]) -> None:
        """
        Output the hub dropped (its buffer full while the daemon did not
        read): counted in ``dropped_bytes`` and ``truncated``, and said on
        stderr where it happened, as output cut by ``max_output_bytes`` is.
        """
        x.lost_bytes += _count(event, "stdout") + _count(event, "stderr")
        x.lost_displays += _count(event, "displays")
        self._on_stream(x, {"name": "stderr", "text": _dropped_note(event, "here")})

    def _note(self, x: Execution, text: str) -> None:
        """
        A word of the daemon's own on ``x``'s stderr: in its document and
        its events alike, as the kernel's output is.
        """
        self._on_stream(x, {"name": "stderr", "text": text})

    def _on_display(self, x: Execution, event: dict[str, Any]) -> None:
        data = event.get("data")
        if not isinstance(data, dict):
            return
        data, refs = self.service.spill(self, x, data)
        item: dict[str, Any] = {
            "data": data,
            "metadata": event.get("metadata") or {},
            "is_result": bool(event.get("is_result")),
        }
        if event.get("display_id"):
            item["display_id"] = event["display_id"]
        if refs:
            item["refs"] = refs
        if x.clear_pending:
            _clear(x)
        if event.get("update"):
            x.emit("display.update", **item)
            if _update_display(x, item):
                return
            # A display an earlier execution showed: this one's item now.
        else:
            x.emit("display", **item)
        x.results.append(item)

    def _on_done(self, x: Execution, status: str, count: Any) -> None:
        if isinstance(count, int):
            x.execution_count = count
        if x.timing_out:
            state = "timeout"
        elif x.interrupted and status != "ok":
            state = "interrupted"
        elif status == "ok":
            state = "ok"
        else:
            state = "error"
        self._end(x, state)
        if x.env:
            _, after = env_prologue(x.env, self.language)
            self._pending_epilogue = x.id + ":env-restore"
            self._send(
                {
                    "op": "execute",
                    "cid": self.id,
                    "xid": self._pending_epilogue,
                    "code": after,
                    "silent": True,
                    "store_history": False,
                }
            )
            return
        self._next()

    def _end(self, x: Execution, state: str, **extra: Any) -> None:
        """End ``x`` with ``state``: its last event, then its waiters."""
        if x.done:
            return
        if x.timer is not None and x.timer.active():
            x.timer.cancel()
        x.timer = None
        if self.current is x:
            self.current = None
            if self._grace_timer is not None and self._grace_timer.active():
                self._grace_timer.cancel()
            self._grace_timer = None
        x.state = state
        x.ended_at = time.time()
        x.input_pending = False
        if state == "lost" and x.started_at is not None:
            # Sent to the kernel, which died (or its hub did) before its
            # notice of taking the code came back, as when the code itself
            # ends the kernel at once: it may have run, so it is not
            # reported as safe to send again.
            x.started = True
        x.emit(
            "execution.ended",
            state=state,
            started=x.started,
            execution_count=x.execution_count,
            duration_ms=x.duration_ms(),
            truncated=x.truncated,
            dropped_bytes=x.dropped_bytes,
            **extra,
        )
        x.log.close()
        x.ended.fire(None)
        self._forget_old(x, x.limits.max_event_bytes)
        self.service.execution_ended(self, x)

    def _forget_old(self, ended: Execution, budget: int) -> None:
        """
        Keep what finished executions hold (events, output, results) within
        ``budget`` bytes: the oldest are forgotten first (then 404), the
        newest is always kept, so a context's memory is bounded whatever
        its executions printed.

        What a finished execution holds only shrinks (its escaped output
        is handed to its answer), so the sizes noted as each ended add up
        to at least what they hold now: while that sum is within the
        budget nothing is counted again, and a context's every end does
        not walk all its kept executions.
        """
        self.forgotten_bytes = 0
        ended.held_at_end = _held_bytes(ended)
        self._held_at_ends += ended.held_at_end
        if self._held_at_ends <= budget:
            return
        finished = [e for e in self.executions.values() if e.done]
        for e in finished:
            e.held_at_end = _held_bytes(e)
        held = self._held_at_ends = sum(e.held_at_end for e in finished)
        for old in finished[:-1]:
            if held <= budget:
                break
            held -= old.held_at_end
            self.forgotten_bytes += old.held_at_end
            self._forget(old)

    def _forget(self, x: Execution) -> None:
        """Drop a finished execution from the context's list."""
        del self.executions[x.id]
        self._held_at_ends -= x.held_at_end

    # -- executions -----------------------------------------------------------

    def submit(self, x: Execution, queue: bool) -> None:
        """
        Queue ``x`` (FIFO) and run it when the kernel is free.

        :raises ApiError: 409 ``context_busy`` when busy and ``queue`` is
            false; 409 ``context_dead``; 429 ``too_many_executions``.
        """
        if self.state in ("dead", "closed"):
            raise conflict(
                f"the context {self.id} is {self.state}: restart it or delete it",
                Code.CONTEXT_DEAD,
            )
        busy = self.current is not None or bool(self.queue) or self.state != "idle"
        if busy and not queue:
            raise conflict(
                f"the context {self.id} is busy"
                + (f" with {self.current.id}" if self.current else ""),
                Code.CONTEXT_BUSY,
                execution_id=self.current.id if self.current else None,
            )
        if len(self.queue) >= self.max_queued:
            raise limit_exceeded(
                429,
                f"the context {self.id} has {len(self.queue)} executions queued"
                f" (max_queued {self.max_queued})",
                Code.TOO_MANY_EXECUTIONS,
                limit=self.max_queued,
            )
        self.executions[x.id] = x
        while len(self.executions) > defaults.CODE_KEPT_EXECUTIONS:
            oldest = next(iter(self.executions.values()))
            if not oldest.done:
                break
            self._forget(oldest)
        self.queue.append(x)
        if busy:
            x.emit("execution.queued", position=len(self.queue))
        self.touch()
        self._next()

    def _next(self) -> None:
        if (
            self.current is not None
            or self.state not in ("idle", "busy")
            or self._pending_epilogue is not None
        ):
            return
        if not self.queue:
            self.state = "idle"
            return
        x = self.queue.popleft()
        self.current = x
        self.state = "busy"
        x.state = "running"
        x.started_at = time.time()
        self._tell_restart(x)
        self._give_between(x)
        x.timer = self.reactor.callLater(x.limits.timeout, self._timed_out, x)
        if x.env:
            before, _ = env_prologue(x.env, self.language)
            self._send(
                {
                    "op": "execute",
                    "cid": self.id,
                    "xid": x.id + ":env",
                    "code": before,
                    "silent": True,
                    "store_history": False,
                }
            )
        self._send(
            {
                "op": "execute",
                "cid": self.id,
                "xid": x.id,
                "code": x.code,
                "silent": x.silent,
                "store_history": x.store_history,
                "allow_stdin": x.allow_stdin,
            }
        )

    def input(self, x: Execution, value: str) -> None:
        """Answer ``x``'s pending ``input()``."""
        if not x.input_pending or self.current is not x:
            raise conflict(
                f"the execution {x.id} is not waiting for input", Code.ALREADY_RESOLVED
            )
        x.input_pending = False
        self._send({"op": "input", "cid": self.id, "value": value})

    def _tell_restart(self, x: Execution) -> None:
        """
        ``x`` is the first execution since a restart that nobody was told
        of: it says so first (``context.restarted``, and a line on stderr,
        which every client shows), so code that relies on the old state
        is not left to fail on its own with no word of why.
        """
        unseen, self._unseen_restart = self._unseen_restart, None
        if unseen is None:
            return
        x.emit("context.restarted", before_start=True, **unseen)
        note = (
            f"[sandboxd] the kernel was restarted ({unseen['reason']}) before"
            " this execution: its state (variables, imports, cwd) is gone\n"
        )
        # In its document too, as the kernel's own output: a client that
        # reads the result and one that assembles it from the events see
        # the same.
        self._on_stream(x, {"name": "stderr", "text": note})

    def _late_output(self, event: dict[str, Any]) -> None:
        """
        Output the kernel sent for an execution that has ended (ipykernel
        gives a thread's output the header of the last cell that ran):
        the running execution's, if one runs (the kernel sends the thread's
        next output with its header anyway); else kept, bounded, for the
        next execution to start, which says where it came from.  Dropped,
        it would be output nobody is told of.
        """
        if self.state in ("closed", "dead"):
            return
        x = self.current
        if x is not None:
            self._on_stream(x, event)
            return
        name = "stderr" if event.get("name") == "stderr" else "stdout"
        raw = event.get("raw")
        if not isinstance(raw, bytes | bytearray):
            raw = str(event.get("text", "")).encode("utf-8", "surrogatepass")
        kept = self._between.get(name)
        if kept is None:
            kept = self._between[name] = HeadTail(defaults.CODE_BETWEEN_OUTPUT_BYTES)
        kept.write(raw)

    def _give_between(self, x: Execution) -> None:
        """``x`` starts: the output printed while none ran comes first, said as such."""
        between, self._between = self._between, {}
        if not between:
            return
        total = sum(kept.total_bytes for kept in between.values())
        self._on_stream(
            x,
            {
                "name": "stderr",
                "text": f"[sandboxd] {total} bytes printed while no execution ran"
                " (a thread an earlier cell started?) follow\n",
            },
        )
        for name, kept in between.items():
            self._on_stream(x, {"name": name, "raw": kept.value()})

    def abandon(self, x: Execution) -> None:
        """
        The client of ``x`` left and asked for an interrupt: running, it is
        interrupted, and if the kernel is still busy with it
        ``interrupt_grace`` later (code that catches ``KeyboardInterrupt``,
        a shell that traps SIGINT) the kernel is restarted, as on a
        timeout, so the next execution does not wait behind it until the
        timeout; still queued, it never starts (``interrupted``,
        ``started: false``).
        """
        if self.current is x:
            x.abandoned = True
            if self.interrupt() is not None and self._grace_timer is None:
                self._grace_timer = self.reactor.callLater(
                    x.limits.interrupt_grace, self._grace_over, x, "disconnected"
                )
        elif x in self.queue:
            self.queue.remove(x)
            x.interrupted = True
            self._end(x, "interrupted", reason="disconnected")

    def interrupt(self) -> Execution | None:
        """Interrupt the running execution (SIGINT to the kernel's group, or a message)."""
        x = self.current
        if x is None or self.kernel is None:
            return None
        x.interrupted = True
        if self.spec.interrupt_mode == "message":
            self._send({"op": "interrupt", "cid": self.id})
        else:
            signal_child(self.kernel, signal.SIGINT)
        return x

    def _timed_out(self, x: Execution) -> None:
        x.timer = None
        if self.current is not x:
            return
        x.timing_out = True
        # In its document too, not only in its events: a client that reads
        # the result learns why it ended as one that follows the events does.
        self._note(
            x, f"\n[sandboxd] timeout after {x.limits.timeout:g} s: interrupting\n"
        )
        self.interrupt()
        if self._grace_timer is not None and self._grace_timer.active():
            self._grace_timer.cancel()
        self._grace_timer = self.reactor.callLater(
            x.limits.interrupt_grace, self._grace_over, x, "timeout"
        )

    def _grace_over(self, x: Execution, reason: str) -> None:
        """The interrupt of ``x`` was not heeded within the grace: a fresh kernel."""
        self._grace_timer = None
        if self.current is x and not x.done:
            # The waiter fails if the context is deleted meanwhile: nobody
            # else waits on it.
            self.restart(reason).addErrback(lambda _: None)

    def restart(self, reason: str, exit_code: int | None = None) -> Deferred[None]:
        """
        Kill the kernel's whole tree and start a fresh one; the running
        execution ends (``timeout``, ``interrupted`` when its client had
        left, or ``lost``) after ``context.restarted``.

        Those queued end at once, ``lost`` and ``started: false`` after
        their own ``context.restarted``: they were sent against the state
        the kernel had, and run in a fresh one they would act on what is
        not there (a ``chdir`` undone: files written in the wrong place),
        as Jupyter aborts the cells queued when a kernel restarts.  Each is
        safe to send again.
        """
        if self.state == "closed":
            raise conflict(f"the context {self.id} is closed", Code.CONTEXT_DEAD)
        old, self.kernel = self.kernel, None
        if self._start_timer is not None and self._start_timer.active():
            self._start_timer.cancel()
        self._start_timer = None
        self.state = "restarting"
        self.restarts += 1
        x = self.current
        if x is not None:
            x.emit("context.restarted", reason=reason, exit_code=exit_code)
            self._note(x, _restart_note(reason, exit_code, "during this execution"))
        queued = list(self.queue)
        self.queue.clear()
        for q in queued:
            q.emit(
                "context.restarted",
                reason=reason,
                exit_code=exit_code,
                before_start=True,
            )
            self._note(q, _restart_note(reason, exit_code, "before this execution"))
            self._end(q, "lost", reason="restarted")
        if reason == "user" or (x is not None and not x.abandoned) or queued:
            # Its caller, the running execution's client or those queued
            # are told.
            self._unseen_restart = None
        else:
            self._unseen_restart = {"reason": reason, "exit_code": exit_code}
        self._hub_close()
        waiting = self._ready.wait()
        killed = old.kill("killed") if old is not None else Deferred()
        if old is None:
            killed.callback(None)

        def respawn(_: Any) -> None:
            # The execution ends once the old tree is gone: whoever sees
            # execution.ended can rely on no survivor of that kernel.
            if x is not None:
                state = {"timeout": "timeout", "disconnected": "interrupted"}
                self._end(x, state.get(reason, "lost"), reason=reason)
            self._pending_epilogue = None
            if self.state == "restarting":
                self._spawn()

        killed.addBoth(respawn)
        return waiting

    def _kernel_ended(self, code: int | None, child: Child) -> None:
        if child is not self.kernel:
            return  # a kernel the daemon ended itself (restart, close)
        self.kernel = None
        self.kernel_ports = frozenset()
        self.exit_code = code
        if self.state in ("starting",):
            self._start_failed(internal(f"the kernel exited while starting ({code})"))
            return
        now = time.monotonic()
        while self._recent_deaths and now - self._recent_deaths[0] > 60:
            self._recent_deaths.popleft()
        if (
            self.auto_restart
            and len(self._recent_deaths) < defaults.CODE_RESTARTS_PER_MINUTE
        ):
            self._recent_deaths.append(now)
            self.restart("died", code).addErrback(lambda _: None)
            return
        x = self.current
        if x is not None:
            x.emit("context.restarted", reason="died", exit_code=code, restarted=False)
            self._note(
                x,
                f"\n[sandboxd] the kernel died (exit code {code}) and was not"
                " restarted: its state is gone; restart the context or delete it\n",
            )
            self._end(x, "lost", reason="died")
        self.state = "dead"
        self.touch()  # the idle timeout counts from its death
        for q in list(self.queue):
            self._end(q, "lost", reason="died")
        self.queue.clear()
        self._hub_close()

    def hub_lost(self) -> None:
        """
        The hub is gone: what was running is lost (its output with it), but
        the kernel and its state live on; reconnect through a new hub.
        """
        if self.state in ("dead", "closed") or self.builtin:
            return
        x = self.current
        if x is not None:
            x.emit("context.restarted", reason="hub", restarted=False)
            self._note(x, HUB_LOST_NOTE)
            self._end(x, "lost", reason="hub")
        self._pending_epilogue = None
        if self.kernel is None:
            return
        # The kernel keeps its state: the new hub connects to it again.
        self.state = "restarting"
        self.restart_hub_only()

    def hub_failed(self, reason: str) -> None:
        """
        The hub keeps dying: a starting context fails its start; any other
        ends what runs (``lost``) and is ``dead`` (its kernel killed)
        until restarted or deleted.
        """
        if self.state in ("dead", "closed") or self.builtin:
            return
        if self.state in ("starting",):
            self._start_failed(unavailable(f"the kernel hub failed: {reason}"))
            return
        x = self.current
        if x is not None:
            x.emit("context.restarted", reason="hub", restarted=False)
            self._note(
                x,
                "\n[sandboxd] the kernel hub failed: the kernel was ended, its"
                " state is gone; restart the context or delete it\n",
            )
            self._end(x, "lost", reason="hub")
        for q in list(self.queue):
            self._end(q, "lost", reason="hub")
        self.queue.clear()
        self._ready.fail(unavailable(f"the kernel hub failed: {reason}"))
        self.state = "dead"
        self.touch()
        kernel, self.kernel = self.kernel, None
        if kernel is not None:
            kernel.kill("killed")

    def restart_hub_only(self) -> None:
        """Reconnect to the running kernel (the hub changed)."""
        conn = self._conn
        if conn is None or self.kernel is None:
            return
        if self._start_timer is not None and self._start_timer.active():
            self._start_timer.cancel()
        self._start_timer = self.reactor.callLater(
            self.start_timeout, self._start_timed_out, self.kernel
        )
        self._open_on_hub(conn)

    def close(self) -> Deferred[None]:
        """End every execution, kill the kernel's tree, remove its files."""
        if self.state == "closed":
            d: Deferred[None] = Deferred()
            d.callback(None)
            return d
        self.state = "closed"
        if self._start_timer is not None and self._start_timer.active():
            self._start_timer.cancel()
        x = self.current
        if x is not None:
            self._end(x, "lost", reason="closed")
        for q in list(self.queue):
            self._end(q, "lost", reason="closed")
        self.queue.clear()
        self._ready.fail(
            conflict(f"the context {self.id} was deleted", Code.CONTEXT_DEAD)
        )
        self._hub_close()
        kernel, self.kernel = self.kernel, None
        killed: Deferred[None]
        if kernel is not None:
            killed = kernel.kill("killed")
        else:
            killed = Deferred()
            killed.callback(None)

        def cleanup(result: Any) -> Any:
            shutil.rmtree(self.dir, ignore_errors=True)
            return None

        killed.addBoth(cleanup)
        return killed
