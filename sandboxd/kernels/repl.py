# -*- test-case-name: tests.kernels.test_repl -*-
"""
``sandboxd-python``: the built-in kernel for images without ipykernel.

Run as a script (``python3 repl.py``) by the sandbox's own Python, so it
uses the standard library only and imports nothing of sandboxd. It speaks
the hub's events directly, one JSON object per line on its original
stdout; the code's own stdout and stderr (file descriptors 1 and 2, so a
subprocess's output too) are pipes it reads and reports as ``stream``
events. The value of a last expression is shown as ``text/plain`` (and
``_repr_html_``/``_repr_png_`` where the value has them); open matplotlib
figures are sent as PNG after each execution (the Agg backend, when
matplotlib is importable). SIGINT interrupts the running code.

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
import traceback
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
    """Reads one of the code's streams and reports it to the current execution."""

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
                if self.xid is not None:
                    emit(
                        {
                            "ev": "stream",
                            "xid": self.xid,
                            "name": self.name_,
                            "text": text,
                        }
                    )
            pending = keep
            if synced:
                self.marker = None
                self.synced.set()


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
        for line in self.commands:
            if not line.strip():
                continue
            try:
                command = json.loads(line)
            except ValueError:
                continue
            if command.get("op") == "execute":
                self.execute(command)

    def _input(self, prompt: Any = "") -> str:
        if not self.allow_stdin or self.xid is None:
            raise RuntimeError("input() is not allowed in this execution (allow_stdin)")
        emit({"ev": "input", "xid": self.xid, "prompt": str(prompt), "password": False})
        for line in self.commands:
            try:
                command = json.loads(line)
            except ValueError:
                continue
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
            value = self._run(str(command.get("code", "")))
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
        emit({"ev": "done", "xid": xid, "status": status, "count": self.count})
        self.xid = None
        for pump in self.pumps:
            pump.xid = None

    def _run(self, code: str) -> Any:
        # A name of its own per cell, its source in linecache: tracebacks
        # show the lines, as IPython's do.
        self.cells += 1
        name = f"<cell-{self.cells}>"
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
        for fd, pump in zip((1, 2), self.pumps, strict=True):
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
    signal.signal(signal.SIGINT, signal.default_int_handler)
    repl = Repl(commands)
    repl.start()
    repl.loop()


if __name__ == "__main__":
    main()
