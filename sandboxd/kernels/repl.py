# -*- test-case-name: tests.kernels.test_repl -*-
"""
The built-in kernels, for images without ipykernel: ``sandboxd-python``
and ``sandboxd-bash``.

Run as a script (``python3 repl.py`` or ``python3 repl.py bash``) by the
sandbox's own Python, so it uses the standard library only and imports
nothing of sandboxd. It speaks the hub's events directly, one JSON object
per line on its original stdout; the code's own stdout and stderr are
pipes it reads and reports as ``stream`` events.

``sandboxd-python``: the code runs in this process (file descriptors 1
and 2 are the pipes, so a subprocess's output is caught too). The value of
a last expression is shown as ``text/plain`` (and
``_repr_html_``/``_repr_png_`` where the value has them); open matplotlib
figures are sent as PNG after each execution (the Agg backend, when
matplotlib is importable). SIGINT interrupts the running code.

``sandboxd-bash``: one bash for the context's life, so ``cd``, variables,
functions and ``export`` carry from one execution to the next, as in a
terminal. See :class:`BashRepl`.

Commands: ``{"op": "execute", "xid", "code", "silent", "allow_stdin"}``,
``{"op": "input", "value"}``.
"""

from __future__ import annotations

import ast
import base64
import builtins
import codecs
import io
import json
import linecache
import os
import platform
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

#: Bytes read from the code's stdout or stderr at a time.
READ_BYTES = 65536

#: How long the end of an execution waits for its output to be read.
DRAIN_SECONDS = 2.0

_lock = threading.Lock()
_proto: Any = None


def emit(event: dict[str, Any]) -> None:
    """One event line on the protocol stream."""
    line = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    data = line.encode("utf-8", "surrogatepass") + b"\n"
    with _lock:
        _proto.write(data)
        _proto.flush()


class Pump(threading.Thread):
    """
    Reads one of the code's streams and reports it to the current
    execution; what is printed while none runs (a background job, a
    subprocess a cell left behind) is reported as ``late``, which the
    daemon keeps, bounded, for the next execution (as it does for
    ipykernel's), instead of being lost.
    """

    def __init__(self, fd: int, name: str) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.name_ = name
        self.xid: str | None = None
        self.marker: bytes | None = None
        self.synced = threading.Event()

    def run(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = b""
        while True:
            try:
                data = os.read(self.fd, READ_BYTES)
            except OSError:
                return
            if not data:
                return
            pending += data
            marker = self.marker
            synced = False
            if marker is not None and marker in pending:
                pending = pending.replace(marker, b"")
                synced = True
            keep = b""
            if marker is not None and not synced:
                # The marker may be split across reads: hold a possible start.
                for i in range(1, len(marker)):
                    if pending.endswith(marker[:i]):
                        keep, pending = pending[-i:], pending[:-i]
                        break
            text = decoder.decode(pending) if pending else ""
            if text:
                xid = self.xid
                if xid is not None:
                    emit({"ev": "stream", "xid": xid, "name": self.name_, "text": text})
                else:
                    emit({"ev": "late", "name": self.name_, "text": text})
            pending = keep
            if synced:
                self.marker = None
                self.synced.set()


def parsed(lines: Any) -> Iterator[dict[str, Any]]:
    """The commands on ``lines``, one JSON object a line (others skipped)."""
    for line in lines:
        if not line.strip():
            continue
        try:
            command = json.loads(line)
        except ValueError:
            continue
        if isinstance(command, dict):
            yield command


def _redirect(fd: int) -> int:
    """Point ``fd`` at a new pipe; its read end."""
    read, write = os.pipe()
    os.dup2(write, fd)
    os.close(write)
    return read


class Repl:
    """The namespace and the execution loop."""

    def __init__(self, commands: Any) -> None:
        self.commands = commands
        self.namespace: dict[str, Any] = {
            "__name__": "__main__",
            "__builtins__": builtins,
        }
        self.count = 0
        self.cells = 0
        self.xid: str | None = None
        self.allow_stdin = False
        self.pumps: list[Pump] = []

    def start(self) -> None:
        """Take over fds 1 and 2, and say we are ready."""
        out = Pump(_redirect(1), "stdout")
        err = Pump(_redirect(2), "stderr")
        self.pumps = [out, err]
        for pump in self.pumps:
            pump.start()
        sys.stdout = os.fdopen(
            1, "w", buffering=1, encoding="utf-8", errors="backslashreplace"
        )
        sys.stderr = os.fdopen(
            2, "w", buffering=1, encoding="utf-8", errors="backslashreplace"
        )
        builtins.input = self._input
        os.environ.setdefault("MPLBACKEND", "Agg")
        emit(
            {
                "ev": "ready",
                "info": {
                    "name": "python",
                    "version": platform.python_version(),
                    "implementation": "sandboxd-python",
                },
            }
        )

    def loop(self) -> None:
        """Run commands until stdin closes."""
        for command in parsed(self.commands):
            if command.get("op") == "execute":
                self.execute(command)

    def _input(self, prompt: Any = "") -> str:
        if not self.allow_stdin or self.xid is None:
            raise RuntimeError("input() is not allowed in this execution (allow_stdin)")
        emit({"ev": "input", "xid": self.xid, "prompt": str(prompt), "password": False})
        for command in parsed(self.commands):
            if command.get("op") == "input":
                return str(command.get("value", ""))
        raise EOFError

    def execute(self, command: dict[str, Any]) -> None:
        """Run one piece of code; its events; ``done`` last."""
        xid = str(command.get("xid"))
        silent = bool(command.get("silent"))
        self.xid = xid
        self.allow_stdin = bool(command.get("allow_stdin"))
        for pump in self.pumps:
            pump.xid = xid
        if not silent:
            self.count += 1
            emit({"ev": "started", "xid": xid, "count": self.count})
        status = "ok"
        value: Any = None
        failure: tuple[Any, BaseException, Any] | None = None
        try:
            value = self._run(str(command.get("code", "")), silent)
        except KeyboardInterrupt:
            failure = (KeyboardInterrupt, KeyboardInterrupt(), None)
        except BaseException as e:  # the user's code raised: reported, not fatal
            failure = (type(e), e, e.__traceback__)
        # What the code printed comes before its value or its error, as
        # in Jupyter (a notebook shows them in that order).
        self._sync()
        if failure is None and value is not None and not silent:
            try:
                self.namespace["_"] = value
                emit(
                    {
                        "ev": "display",
                        "xid": xid,
                        "data": bundle(value),
                        "metadata": {},
                        "is_result": True,
                    }
                )
            except BaseException as e:  # a _repr_*_ raised
                failure = (type(e), e, e.__traceback__)
        if failure is not None:
            status = "error"
            self._error(xid, *failure)
        if not silent:
            self._figures(xid)
        self._sync()
        # What is printed from here on is no longer this execution's.
        for pump in self.pumps:
            pump.xid = None
        emit({"ev": "done", "xid": xid, "status": status, "count": self.count})
        self.xid = None

    def _run(self, code: str, silent: bool) -> Any:
        # A name of its own per cell, its source in linecache: tracebacks
        # show the lines, as IPython's do, and a user's cell is named by its
        # execution count (the daemon's own silent cells, an execution's
        # env set and put back, are not counted).
        self.cells += 1
        name = f"<silent-{self.cells}>" if silent else f"<cell-{self.count}>"
        # Lines as the compiler numbers them (LF, CRLF, CR): splitlines
        # would also end one at a form feed or U+2028 and shift the rest.
        lines = io.StringIO(code, newline="").readlines()
        linecache.cache[name] = (len(code), None, lines, name)
        tree = ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body[-1].value)
            tree.body.pop()
        exec(compile(tree, name, "exec"), self.namespace)
        if last is not None:
            return eval(compile(last, name, "eval"), self.namespace)
        return None

    def _error(self, xid: str, kind: Any, error: BaseException, tb: Any) -> None:
        lines = traceback.format_exception(kind, error, tb)
        # The frames of this file are not the user's.
        lines = [line for line in lines if __file__ not in line]
        emit(
            {
                "ev": "error",
                "xid": xid,
                "ename": kind.__name__,
                "evalue": str(error),
                "traceback": [line.rstrip("\n") for line in lines],
            }
        )

    def _figures(self, xid: str) -> None:
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            for number in plt.get_fignums():
                buffer = io.BytesIO()
                plt.figure(number).savefig(buffer, format="png")
                data = {
                    "image/png": base64.b64encode(buffer.getvalue()).decode(),
                    "text/plain": f"<Figure {number}>",
                }
                emit(
                    {
                        "ev": "display",
                        "xid": xid,
                        "data": data,
                        "metadata": {},
                        "is_result": False,
                    }
                )
            plt.close("all")
        except Exception as e:
            emit(
                {
                    "ev": "stream",
                    "xid": xid,
                    "name": "stderr",
                    "text": f"[figure not sent: {e}]\n",
                }
            )

    def _sync(self) -> None:
        """Wait until what the code wrote to fds 1 and 2 has been reported."""
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        sync(zip((1, 2), self.pumps, strict=True))


#: The descriptors of ``sandboxd-bash``'s shell: the file it reads each
#: cell from, and those it writes a cell's stderr and its exit status to.
#: High, so that a script's own ``exec 3>file`` leaves them alone.
BASH_CELL_FD = 61
BASH_STDERR_FD = 62
BASH_STATUS_FD = 63

#: What bash runs once, before the first cell: no history expansion of
#: ``!`` in the lines written to it, no prompts, and the function that
#: reports a cell's exit status (``$?`` as the function starts) with the
#: tag of the cell it follows.
BASH_SETUP = (
    "set +H\n"
    "PS1= PS2= PROMPT_COMMAND=\n"
    "__sandboxd_done() { local s=$?; "
    f'printf \'%s %s\\n\' "$1" "$s" >&{BASH_STATUS_FD}; }}\n'
)

#: How long an interrupted cell's status is waited for before its report
#: is asked for again (the interrupt may have cut the line that reports).
BASH_INTERRUPT_RETRY_SECONDS = 0.5


class BashRepl:
    """
    ``sandboxd-bash``: one interactive bash, fed each cell as a sourced file.

    The bash is interactive (``-i``, without line editing or job control)
    for one reason: on SIGINT an interactive shell abandons the command
    line it is running and reads the next one, where a script would go on
    with its next command or exit.  Each cell is written to a file and run
    with ``source`` in the shell itself, so its ``cd``, variables,
    functions and ``export`` stay; a syntax error ends that cell only.  Its
    stdin is ``/dev/null`` (the shell's own stdin carries the cells), its
    stderr goes to :data:`BASH_STDERR_FD` (the shell's own messages, its
    prompts and its job-control warnings, go nowhere).  The line after the
    cell's reports its exit status; a status other than 0 is the
    execution's error (``ExitCode``, or ``KeyboardInterrupt`` after an
    interrupt).  ``exit`` in a cell ends the shell: a new one is started
    at once and the cell's error (``ShellExited``) says its state is new.
    """

    def __init__(self, commands: Any) -> None:
        self.commands = commands
        self.count = 0
        self.interrupted = False
        self.pumps: list[Pump] = []
        self.writers: list[int] = []
        self.bash = ""
        self.out_write = -1
        self.shell: Any = None
        self.statuses: Any = None

    def start(self) -> None:
        """Make the pipes, start bash, and say we are ready."""
        import shutil
        import tempfile

        bash = shutil.which("bash")
        if bash is None:
            emit({"ev": "failed", "message": "bash is not installed"})
            sys.exit(1)
        self.bash = bash
        # A file with no name (nothing is left behind if the kernel is
        # killed), rewritten for each cell and read by the shell through
        # its own descriptor.
        with tempfile.TemporaryFile() as cell:
            os.dup2(cell.fileno(), BASH_CELL_FD)
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        status_read, status_write = os.pipe()
        # Kept open here for the next shell after an ``exit``: a shell's
        # end is seen by its pid, not by the end of this pipe.
        os.dup2(err_write, BASH_STDERR_FD)
        os.dup2(status_write, BASH_STATUS_FD)
        os.close(err_write)
        os.close(status_write)
        self.out_write = out_write
        self.statuses = os.fdopen(status_read, "rb", buffering=0)
        self.writers = [out_write, BASH_STDERR_FD]
        self.pumps = [Pump(out_read, "stdout"), Pump(err_read, "stderr")]
        for pump in self.pumps:
            pump.start()
        # SIGINT reaches this process with bash (the context signals the
        # group): noted here, acted on by bash.  A handler, not SIG_IGN,
        # which bash would inherit.
        signal.signal(signal.SIGINT, self._on_interrupt)
        version = self._spawn()
        if version is None:
            emit({"ev": "failed", "message": "bash ended as it started"})
            sys.exit(1)
        emit(
            {
                "ev": "ready",
                "info": {
                    "name": "bash",
                    "version": version,
                    "implementation": "sandboxd-bash",
                },
            }
        )

    def _spawn(self) -> str | None:
        """A new shell, set up: its version, or None if it ended before it answered."""
        import subprocess

        self.shell = subprocess.Popen(
            [self.bash, "--noprofile", "--norc", "--noediting", "-i"],
            stdin=subprocess.PIPE,
            stdout=self.out_write,
            stderr=subprocess.DEVNULL,
            pass_fds=(BASH_CELL_FD, BASH_STDERR_FD, BASH_STATUS_FD),
        )
        self._send(
            BASH_SETUP + f"printf 'ready %s\\n' \"$BASH_VERSION\" >&{BASH_STATUS_FD}\n"
        )
        return self._report("ready")

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        self.interrupted = True

    def _send(self, text: str) -> None:
        try:
            self.shell.stdin.write(text.encode("utf-8", "surrogateescape"))
            self.shell.stdin.flush()
        except OSError:
            pass  # the shell has ended: _report sees it by its pid

    def _report(self, tag: str) -> str | None:
        """
        What the shell reported with ``tag`` (a cell's exit status, its
        version at the start), or None if it ended.  After an interrupt the
        report is asked for again now and then: the interrupt may have cut
        the line that makes it.
        """
        import select

        asked_again = 0.0
        line: bytes = b""
        while True:
            try:
                ready, _, _ = select.select([self.statuses], [], [], 0.2)
            except InterruptedError:
                ready = []
            if ready:
                line += self.statuses.read(4096)
                while b"\n" in line:
                    one, line = line.split(b"\n", 1)
                    got, _, said = one.decode("ascii", "replace").partition(" ")
                    if got == tag:
                        return said
            elif self.shell.poll() is not None:
                return None
            if self.interrupted:
                now = time.monotonic()
                if not asked_again:
                    asked_again = now
                elif now - asked_again > BASH_INTERRUPT_RETRY_SECONDS:
                    asked_again = now
                    self._send(f"__sandboxd_done {tag}\n")

    def loop(self) -> None:
        """Run commands until stdin closes, or bash ends."""
        for command in parsed(self.commands):
            if command.get("op") == "execute" and not self.execute(command):
                return

    def execute(self, command: dict[str, Any]) -> bool:
        """Run one cell; its events; ``done`` last.  False once bash has ended."""
        xid = str(command.get("xid"))
        silent = bool(command.get("silent"))
        if not silent:
            self.count += 1
            emit({"ev": "started", "xid": xid, "count": self.count})
        code = str(command.get("code", "")).encode("utf-8", "surrogateescape")
        os.ftruncate(BASH_CELL_FD, 0)
        os.pwrite(BASH_CELL_FD, code, 0)
        for pump in self.pumps:
            pump.xid = xid
        self.interrupted = False
        tag = os.urandom(6).hex()
        self._send(
            f"source /dev/fd/{BASH_CELL_FD} </dev/null 2>&{BASH_STDERR_FD}\n"
            f"__sandboxd_done {tag}\n"
        )
        said = self._report(tag)
        status = None if said is None else int(said) if said.isdigit() else 1
        self._sync()
        if status is None:
            self._ended(xid)
        elif status != 0:
            emit(
                {
                    "ev": "error",
                    "xid": xid,
                    "ename": "KeyboardInterrupt" if self.interrupted else "ExitCode",
                    "evalue": str(status),
                    "traceback": [],
                }
            )
        # What is printed from here on (a job left running) is no longer
        # this cell's.
        for pump in self.pumps:
            pump.xid = None
        emit(
            {
                "ev": "done",
                "xid": xid,
                "status": "ok" if status == 0 else "error",
                "count": self.count,
            }
        )
        return self.shell.poll() is None

    def _ended(self, xid: str) -> None:
        """
        The shell exited during the cell (``exit``): the cell's error says
        so, and a new shell takes its place, its state new.
        """
        code = self.shell.wait()
        started = self._spawn() is not None
        emit(
            {
                "ev": "error",
                "xid": xid,
                "ename": "ShellExited",
                "evalue": f"the shell exited with status {code}; "
                + (
                    "a new one was started (its variables, functions and "
                    "directory are new)"
                    if started
                    else "a new one did not start"
                ),
                "traceback": [],
            }
        )

    def _sync(self) -> None:
        """Wait until what bash wrote to its two pipes has been reported."""
        sync(zip(self.writers, self.pumps, strict=True))


def sync(pairs: Any) -> None:
    """
    Wait until each pump has reported what came before a marker written
    to its pipe (``pairs``: write end, pump).
    """
    for fd, pump in pairs:
        marker = b"\x00sandboxd-sync-" + os.urandom(6).hex().encode() + b"\x00"
        pump.synced.clear()
        pump.marker = marker
        try:
            os.write(fd, marker)
        except OSError:
            continue
        pump.synced.wait(DRAIN_SECONDS)


def bundle(value: Any) -> dict[str, Any]:
    """A value's MIME bundle: ``text/plain`` and what its ``_repr_*_`` give."""
    data: dict[str, Any] = {"text/plain": repr(value)}
    for method, mime in (
        ("_repr_html_", "text/html"),
        ("_repr_png_", "image/png"),
        ("_repr_svg_", "image/svg+xml"),
    ):
        fn = getattr(value, method, None)
        if callable(fn):
            try:
                out = fn()
            except Exception:
                continue
            if isinstance(out, bytes):
                out = base64.b64encode(out).decode()
            if isinstance(out, str):
                data[mime] = out
    return data


def main() -> None:
    """Serve until the daemon closes stdin."""
    global _proto
    _proto = os.fdopen(os.dup(1), "wb", buffering=0)
    commands = io.TextIOWrapper(
        os.fdopen(os.dup(0), "rb", buffering=0), encoding="utf-8"
    )
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    if sys.argv[1:] == ["bash"]:
        shell = BashRepl(commands)
        shell.start()
        shell.loop()
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    repl = Repl(commands)
    repl.start()
    repl.loop()


if __name__ == "__main__":
    main()
