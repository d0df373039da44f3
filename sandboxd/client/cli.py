"""
The commands that drive a daemon (SPEC §19): ``sandboxd exec``, ``cp``,
``ls``, ``grep``, ``diagnostics``, ``definition``, ``ps``, ``logs``,
``kill``, ``term``, ``caps``, ``code`` and ``ui``.

They talk to ``--url`` (or ``SANDBOXD_URL``) with ``--token`` (or
``SANDBOXD_TOKEN``) through :class:`sandboxd.client.Sandbox`, print for
humans by default and JSON with ``--json``, and import nothing from
Twisted.  ``sandboxd.cli`` hands these names to :func:`main`; ``python -m
sandboxd.client.cli`` runs them directly.
"""

from __future__ import annotations

import argparse
import base64
import codecs
import contextlib
import io
import json
import math
import os
import posixpath
import select
import shlex
import signal
import stat
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO, cast

from sandboxd.client._api import Terminal
from sandboxd.client._core import CHUNK_BYTES, exit_status, seg
from sandboxd.client._shared import RangeState
from sandboxd.client._sync import Blocking, Sandbox
from sandboxd.client.errors import (
    ConnectionFailed,
    DeadlineExceeded,
    NotFoundError,
    PayloadTooLarge,
    ProtocolError,
    RequestTimeout,
    SandboxError,
    Unauthorized,
    UploadMismatch,
)
from sandboxd.client.models import Diagnostic, Entry, Listing, Stat, Written
from sandboxd.client.upload_ids import UploadIds
from sandboxd.subcommands import CLIENT_COMMANDS

#: The subcommand names this module serves.
COMMANDS = tuple(CLIENT_COMMANDS)

#: Exit status of ``exec`` when the daemon killed the command at its timeout
#: (as ``timeout(1)``).
TIMED_OUT = 124

#: The default detach sequence of ``term`` (as ``docker attach``).
DETACH_KEYS = "ctrl-p,ctrl-q"


def _seconds(text: str) -> float:
    """
    A number of seconds from the command line: finite and above 0 (float()
    alone takes ``nan``, ``inf`` and negatives, which fail later with a
    traceback, or as a network error for 0).
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return value


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", help="daemon URL (default $SANDBOXD_URL, else http://127.0.0.1:9000)"
    )
    common.add_argument("--token", help="access token (default $SANDBOXD_TOKEN)")
    common.add_argument(
        "--pty-url",
        help="PTY WebSocket base, ws://HOST:PORT (default $SANDBOXD_PTY_URL, else the HTTP port + 1)",
    )
    common.add_argument(
        "--request-timeout",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="seconds to wait for each answer (default 30)",
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")

    parser = argparse.ArgumentParser(
        prog="sandboxd", description="Drive a sandboxd daemon."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("exec", parents=[common], help=CLIENT_COMMANDS["exec"])
    p.add_argument("--cwd", help="working directory in the sandbox")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a variable (repeatable)",
    )
    p.add_argument("--user", help="run as this user")
    p.add_argument("--shell", help="run COMMAND through this shell (bash, sh)")
    p.add_argument(
        "--timeout",
        dest="limit",
        type=_seconds,
        metavar="SECONDS",
        help="seconds before the daemon kills it",
    )
    p.add_argument(
        "-n",
        "--no-stdin",
        action="store_true",
        help="do not forward local stdin (default: forwarded when not a terminal)",
    )
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD...")

    p = sub.add_parser(
        "cp",
        parents=[common],
        help=CLIENT_COMMANDS["cp"],
    )
    p.add_argument("source", help="a local path, :PATH in the sandbox, or - (stdin)")
    p.add_argument(
        "destination", help="a local path, :PATH in the sandbox, or - (stdout)"
    )
    p.add_argument(
        "-r",
        "--recursive",
        action="store_true",
        help="copy a directory and what it holds",
    )
    p.add_argument(
        "--no-resume",
        action="store_true",
        help="start over instead of resuming a cut download (.part) or upload",
    )
    p.add_argument(
        "--no-overwrite", action="store_true", help="refuse to replace a remote file"
    )
    p.add_argument(
        "--progress",
        action="store_true",
        default=None,
        help="show progress even when stderr is not a terminal",
    )

    p = sub.add_parser("ls", parents=[common], help=CLIENT_COMMANDS["ls"])
    p.add_argument("path", nargs="?")
    p.add_argument(
        "-l", dest="long", action="store_true", help="type, size and time too"
    )
    p.add_argument("--depth", type=int)

    p = sub.add_parser("grep", parents=[common], help=CLIENT_COMMANDS["grep"])
    p.add_argument("pattern", help="a regular expression (RE2), or text with -F")
    p.add_argument("path", nargs="?", help="a directory or a file (default: base dir)")
    p.add_argument(
        "-F", dest="fixed_strings", action="store_true", help="PATTERN is text"
    )
    p.add_argument("-i", dest="ignore_case", action="store_true", help="ignore case")
    p.add_argument("--include", metavar="GLOB", help="only files named so (*.py)")
    p.add_argument("-m", "--max-count", type=int, metavar="N", help="at most N matches")
    p.add_argument(
        "-C", "--context", type=int, default=0, metavar="N", help="N lines around (0-5)"
    )

    p = sub.add_parser(
        "diagnostics", parents=[common], help=CLIENT_COMMANDS["diagnostics"]
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="files in the sandbox")
    p.add_argument("--server", help="a language server id (default: by file type)")
    p.add_argument(
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        help="wait this long for the server's report (default: the daemon's)",
    )

    p = sub.add_parser(
        "definition", parents=[common], help=CLIENT_COMMANDS["definition"]
    )
    p.add_argument(
        "position",
        type=_position,
        metavar="PATH:LINE[:COLUMN]",
        help="lines and columns from 1 (as grep and compilers print them)",
    )
    p.add_argument("--server", help="a language server id (default: by file type)")

    p = sub.add_parser("ps", parents=[common], help=CLIENT_COMMANDS["ps"])
    p.add_argument("--tag")

    p = sub.add_parser("logs", parents=[common], help=CLIENT_COMMANDS["logs"])
    p.add_argument("pid", type=int)
    p.add_argument("-f", "--follow", action="store_true", help="follow until it exits")
    p.add_argument("--after", type=int, default=0, help="only output after this seq")

    p = sub.add_parser("kill", parents=[common], help=CLIENT_COMMANDS["kill"])
    p.add_argument("pid", type=int)
    p.add_argument("-s", "--signal", default="TERM")

    p = sub.add_parser("term", parents=[common], help=CLIENT_COMMANDS["term"])
    p.add_argument("session", nargs="?")
    p.add_argument(
        "--detach-keys",
        default=DETACH_KEYS,
        help=f"key sequence that detaches (default {DETACH_KEYS})",
    )
    p.add_argument("--shell")
    p.add_argument("--cwd")

    p = sub.add_parser("caps", parents=[common], help=CLIENT_COMMANDS["caps"])
    p.add_argument(
        "--explain",
        metavar="ENDPOINT",
        help="the decision for one endpoint, with its rule",
    )
    p.add_argument("--path", help="with --explain: a path to decide")
    p.add_argument("--op", choices=("read", "write", "delete"))
    p.add_argument(
        "--command",
        dest="command_name",
        metavar="NAME",
        help="with --explain run_command: the template command to decide",
    )

    p = sub.add_parser("commands", parents=[common], help=CLIENT_COMMANDS["commands"])
    p.add_argument("name", nargs="?", help="the command to run (none: list them)")
    p.add_argument(
        "arguments",
        nargs="*",
        metavar="ARG=VALUE",
        help='its arguments; a VALUE that reads as JSON (2, true, ["a"]) is '
        "sent as that, any other as text",
    )
    p.add_argument(
        "--timeout", type=_seconds, help="seconds to wait (default: the daemon's limit)"
    )

    p = sub.add_parser("code", parents=[common], help=CLIENT_COMMANDS["code"])
    p.add_argument("-c", "--code", dest="source", help="run this and exit")
    p.add_argument("--kernel", help="a kernelspec (default: the daemon's default)")
    p.add_argument("--context", help="use this context (kept at exit)")
    p.add_argument("--keep", action="store_true", help="keep a new context at exit")
    p.add_argument("--timeout", type=_seconds, help="seconds per execution")
    p = sub.add_parser("ui", parents=[common], help=CLIENT_COMMANDS["ui"])
    p.add_argument(
        "--ttl",
        type=int,
        default=3600,
        help="seconds the link (and so the console) works (default 3600)",
    )
    p.add_argument(
        "--scope",
        action="append",
        dest="scopes",
        metavar="SCOPE",
        help="narrow the console to these scopes (repeatable; default: all of yours)",
    )
    return parser


def _sandbox(args: argparse.Namespace) -> Sandbox:
    return Sandbox(
        args.url,
        token=args.token,
        timeout=args.request_timeout,
        pty_url=args.pty_url,
    )


def _print_json(data: Any, out: TextIO) -> None:
    out.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def _explain(error: SandboxError, url: str) -> str:
    if isinstance(error, Unauthorized):
        return f"token rejected: {url} refused it ({error.message}): pass --token or set SANDBOXD_TOKEN"
    if isinstance(error, ConnectionFailed) and "ws_url" in error.body:
        return (
            f"cannot reach the terminal port ({error.message}), though the daemon "
            f"at {url} answered: give its PTY port as --pty-url or SANDBOXD_PTY_URL"
        )
    if isinstance(error, ConnectionFailed) and error.body.get("cut"):
        return f"the connection to the daemon at {url} was lost mid-answer: {error.message}"
    if isinstance(error, ConnectionFailed):
        return f"cannot reach the daemon at {url}: {error.message}"
    return str(error)


# -- exec ----------------------------------------------------------------------


def cmd_exec(
    sb: Sandbox,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    inp: Any = None,
) -> int:
    """
    Run a command to its end: its stdout and stderr byte for byte, local
    stdin forwarded when it is not a terminal, the child's exit code.
    """
    argv = list(args.argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        err.write("sandboxd exec: give a command after --\n")
        return 2
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            err.write(f"sandboxd exec: --env wants NAME=VALUE, not {item!r}\n")
            return 2
        env[name] = value
    command = argv[0] if args.shell and len(argv) == 1 else shlex.join(argv)
    options: dict[str, Any] = {
        "cwd": args.cwd,
        "env": env or None,
        "user": args.user,
        "shell": args.shell,
        "timeout": args.limit,
    }
    try:
        stdin = _local_stdin(args, inp)
    except ValueError as e:
        err.write(f"sandboxd exec: {e}\n")
        return 2
    try:
        return _run_exec(sb, args, command, options, stdin, out, err)
    except PayloadTooLarge as e:
        if stdin is None:
            raise
        # The daemon names its limit; what the user needs is that stdin is
        # what filled it, and the ways round it.
        err.write(
            f"sandboxd exec: {e.message}; stdin ({len(stdin)} bytes) goes "
            "base64-encoded in that request, a third larger: raise that limit, "
            "or copy the data in with `sandboxd cp` and redirect from the file\n"
        )
        return 1


def _run_exec(
    sb: Sandbox,
    args: argparse.Namespace,
    command: str,
    options: dict[str, Any],
    stdin: bytes | None,
    out: TextIO,
    err: TextIO,
) -> int:
    """``exec`` once its command line and stdin are known."""
    if args.json:
        got: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        timed_out: DeadlineExceeded | None = None
        try:
            result = sb.commands.run_bytes(
                command,
                stdin=stdin,
                on_stdout=got["stdout"].append,
                on_stderr=got["stderr"].append,
                **options,
            )
            exit_code, truncated = result.exit_code, result.truncated
        except DeadlineExceeded as e:
            timed_out = e
            exit_code = e.body.get("exit_code")
            truncated = bool(e.body.get("truncated"))
        # One shape whether or not it timed out: the output so far, then
        # what ended it.
        doc: dict[str, Any] = {
            **_json_output("stdout", got["stdout"]),
            **_json_output("stderr", got["stderr"]),
            "exit_code": exit_code,
            "truncated": truncated,
        }
        if timed_out is not None:
            doc.update(error=timed_out.message, code=timed_out.code)
        _print_json(doc, out)
        return TIMED_OUT if timed_out is not None else exit_status(exit_code)
    try:
        result = sb.commands.run_bytes(
            command,
            stdin=stdin,
            on_stdout=_binary_writer(out),
            on_stderr=_binary_writer(err),
            **options,
        )
    except DeadlineExceeded as e:
        err.write(f"sandboxd exec: {e.message}\n")
        return TIMED_OUT
    except ConnectionFailed as e:
        if not e.body.get("cut"):
            raise
        err.write(
            f"sandboxd exec: the connection to the daemon at {sb.url} was lost "
            f"({e.message}): the output above is incomplete, and the daemon ends "
            "a command whose client is gone\n"
        )
        return 1
    except SandboxError as e:
        status = _cannot_run(e)
        if status is None:
            raise
        err.write(f"sandboxd exec: {e.message}\n")
        return status
    if result.truncated:
        err.write(
            f"sandboxd exec: the output went over the daemon's max_output_bytes; "
            f"{result.dropped_bytes} bytes were dropped\n"
        )
        return exit_status(result.exit_code) or 1
    return exit_status(result.exit_code)


def _json_output(name: str, chunks: list[bytes]) -> dict[str, str]:
    """
    ``exec --json``'s ``stdout`` (or ``stderr``) as text; output that is
    not UTF-8 also as ``NAME_base64``, its exact bytes, since the text then
    holds U+FFFD where they were.
    """
    data = b"".join(chunks)
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {
            name: data.decode("utf-8", "replace"),
            f"{name}_base64": base64.b64encode(data).decode("ascii"),
        }


#: Exit statuses of a command that could not be run, as a shell gives them.
NOT_FOUND, NOT_EXECUTABLE = 127, 126


def _cannot_run(error: SandboxError) -> int | None:
    """127 for a command that is not there, 126 for one that cannot run; else None."""
    if error.status != 400:
        return None
    if error.type == "FileNotFoundError":
        return NOT_FOUND
    if error.type == "OSError" and error.message.startswith("cannot run"):
        return NOT_EXECUTABLE
    return None


#: The most local stdin ``exec`` reads (it goes base64 in one request, so
#: the daemon's ``shell_stream`` ``max_request_bytes``, 1 MiB by default,
#: is the bound that usually applies first).
MAX_STDIN_BYTES = 64 * 1024 * 1024


#: How long a pipe on stdin has to show data or its end before ``exec``
#: starts the command without it (a supervisor's or CI runner's stdin is
#: often a pipe that stays open and silent: waiting for its end would hang).
STDIN_GRACE_SECONDS = 0.25


def _local_stdin(args: argparse.Namespace, stream: Any) -> bytes | None:
    """
    What ``exec`` forwards as the command's stdin: all of local stdin when
    it is not a terminal (a file; a pipe that has data or its end within
    :data:`STDIN_GRACE_SECONDS`), nothing for a terminal, an idle pipe or
    with ``--no-stdin``.

    :raises ValueError: past :data:`MAX_STDIN_BYTES`.
    """
    if args.no_stdin or stream is None:
        return None
    try:
        if stream.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    if not _stdin_ready(stream):
        return None
    source = getattr(stream, "buffer", stream)
    data = source.read(MAX_STDIN_BYTES + 1)
    if isinstance(data, str):
        data = data.encode()
    if len(data) > MAX_STDIN_BYTES:
        raise ValueError(
            f"stdin is over {MAX_STDIN_BYTES} bytes; copy it in with "
            "`sandboxd cp` and redirect from the file"
        )
    # Nothing at all is what /dev/null gives the command already.
    return bytes(data) or None


def _stdin_ready(stream: Any) -> bool:
    """Whether a pipe or socket on stdin has data or its end (files always do)."""
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):
        return True  # not a descriptor (a test's buffer): read it
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return True
    ready, _, _ = select.select([fd], [], [], STDIN_GRACE_SECONDS)
    return bool(ready)


def _binary_writer(stream: TextIO) -> Callable[[bytes], None]:
    """
    Write chunks to ``stream``'s bytes (its ``buffer``) as they come, so
    output through a pipe is byte-exact; a text-only stream gets them
    decoded.
    """
    raw = getattr(stream, "buffer", None)

    def write(data: bytes) -> None:
        if raw is not None:
            stream.flush()
            raw.write(data)
            raw.flush()
        else:
            stream.write(data.decode("utf-8", "replace"))
            stream.flush()

    return write


# -- cp ------------------------------------------------------------------------


class ProgressBar:
    """
    A one-line progress bar on a terminal (redrawn at most 10 times a
    second); elsewhere (``--progress`` into a log or a pipe) one plain line
    per second, with no escape codes or carriage returns.
    """

    def __init__(self, stream: TextIO, label: str) -> None:
        self.stream = stream
        self.label = label
        self.started = time.monotonic()
        self.drawn = 0.0
        self.first: int | None = None
        try:
            self.terminal = stream.isatty()
        except (AttributeError, ValueError):
            self.terminal = False

    def __call__(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = done
        interval = 0.1 if self.terminal else 1.0
        if now - self.drawn < interval and done != total:
            return
        self.drawn = now
        rate = (done - self.first) / max(now - self.started, 1e-3)
        if total:
            share = done / total
            bar = "#" * int(share * 24)
            text = f"\r{self.label} {share:4.0%} [{bar:<24}] {_size(done)}/{_size(total)} {_size(rate)}/s"
        else:
            text = f"\r{self.label} {_size(done)} {_size(rate)}/s"
        if self.terminal:
            self.stream.write(text + "\x1b[K")
        else:
            self.stream.write(text[1:] + "\n")
        self.stream.flush()

    def end(self) -> None:
        """Leave the last state on its own line."""
        if self.terminal:
            self.stream.write("\n")
            self.stream.flush()


def _local_error(error: OSError, local: str) -> str:
    """
    A local file's error as ``cp`` says it (``NAME: reason``), naming the
    file the user gave rather than the ``.part`` written beside it.
    """
    name = error.filename
    if name is None:
        return error.strerror or str(error)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if name == local + ".part":
        name = local
    return f"{name}: {error.strerror}"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


#: What ``cp`` takes for stdin (as a source) or stdout (as a destination).
STDIO = "-"


def _remote_stat(sb: Sandbox, remote: str) -> Stat | None:
    """
    ``remote``'s stat, or None when it is missing or cannot be asked for
    (the copy itself then says why).
    """
    try:
        found = sb.files.stat(remote)
    except SandboxError:
        return None
    return found if found.get("exists") else None


def _is_remote_dir(sb: Sandbox, remote: str) -> bool:
    found = _remote_stat(sb, remote)
    return found is not None and found["type"] == "directory"


def cmd_cp(
    sb: Sandbox,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    inp: Any = None,
) -> int:
    """
    Copy one file in or out (``-`` is stdin or stdout), into a directory
    when the target is one, or a directory tree with ``-r``.
    """
    src, dst = args.source, args.destination
    remote_src, remote_dst = src.startswith(":"), dst.startswith(":")
    if remote_src == remote_dst:
        err.write("sandboxd cp: exactly one side must be in the sandbox (:PATH)\n")
        return 2
    if args.recursive and STDIO in (src, dst):
        err.write("sandboxd cp: -r copies a directory, not stdin or stdout\n")
        return 2
    if args.recursive:
        if remote_src and _is_remote_dir(sb, src[1:]):
            return _cp_tree_out(sb, args, out, err)
        if not remote_src and os.path.isdir(src):
            return _cp_tree_in(sb, args, out, err)
    elif not remote_src and src != STDIO and os.path.isdir(src):
        err.write(f"sandboxd cp: {src}: is a directory (copy it with -r)\n")
        return 1
    show = (
        args.progress if args.progress is not None else (err.isatty() and not args.json)
    )
    bar = ProgressBar(err, os.path.basename(src.lstrip(":")) or src) if show else None
    if remote_src and dst == STDIO:
        return _cp_to_stdout(sb, src[1:], out, err, bar)
    if src == STDIO:
        return _cp_from_stdin(sb, args, out, err, bar, inp)
    try:
        if remote_src:
            remote = src[1:]
            local = dst
            if os.path.isdir(local):
                local = os.path.join(local, os.path.basename(remote.rstrip("/")))
            size = sb.files.download(
                remote, local, progress=bar, resume=not args.no_resume
            )
            result = {"source": src, "destination": local, "bytes": size}
        else:
            remote = dst[1:] or "."
            # Into a directory, as cp does: named so, or one that exists.
            if remote.endswith("/") or remote == "." or _is_remote_dir(sb, remote):
                remote = remote.rstrip("/") + "/" + os.path.basename(src)
            # A big file goes as a resumable upload: its id is kept until it
            # completes, so the same cp run again carries a cut one on.
            ids = UploadIds(sb.settings.url, remote, src)

            def upload(upload_id: str | None) -> Written:
                return sb.files.upload(
                    src,
                    remote,
                    progress=bar,
                    overwrite=not args.no_overwrite,
                    resume=not args.no_resume,
                    upload_id=upload_id,
                    on_upload_id=ids.save,
                )

            try:
                written = upload(None if args.no_resume else ids.load())
            except UploadMismatch as e:
                # The kept id is another upload's (another target or size
                # than this cp's): forget it and start afresh; nothing was
                # sent to that upload, which is left to its idle expiry.
                ids.clear()
                err.write(f"sandboxd cp: {e.message}; starting a new upload\n")
                written = upload(None)
            ids.clear()
            result = {
                "source": src,
                "destination": ":" + written["path"],
                "bytes": written["bytes"],
            }
    except SandboxError as e:
        if bar is not None:
            bar.end()
        if remote_src and e.type == "IsADirectoryError":
            err.write(f"sandboxd cp: {src}: is a directory (copy it with -r)\n")
            return 1
        part = (local if remote_src else "") + ".part"
        if remote_src and isinstance(e, ConnectionFailed) and os.path.exists(part):
            err.write(
                f"sandboxd cp: {e.message}; the partial file {part} is kept: run the same cp again to resume\n"
            )
            return 1
        if isinstance(e, ConnectionFailed) and e.body.get("upload_id"):
            err.write(
                f"sandboxd cp: {e.message}; the daemon keeps what arrived for an hour: run the same cp again to resume\n"
            )
            return 1
        raise
    except OSError as e:
        err.write(f"sandboxd cp: {_local_error(e, local if remote_src else src)}\n")
        return 1
    if bar is not None:
        bar.end()
    _copied(result, args, out)
    return 0


def _copied(result: dict[str, Any], args: argparse.Namespace, out: TextIO) -> None:
    """What ``cp`` prints once done: ``SOURCE -> DESTINATION (SIZE)``, or JSON."""
    if args.json:
        _print_json(result, out)
    else:
        out.write(
            f"{result['source']} -> {result['destination']} ({_size(result['bytes'])})\n"
        )


def _cp_to_stdout(
    sb: Sandbox, remote: str, out: TextIO, err: TextIO, bar: ProgressBar | None
) -> int:
    """
    ``cp :REMOTE -``: the file's bytes to stdout as they come (resumed by
    ``Range`` after a cut, like a download); nothing else is printed there.
    """
    write = _binary_writer(out)

    def restart() -> None:
        # The file changed under a resumed read: what went out is gone.
        if state.offset:
            raise ProtocolError(
                "the file changed during the copy: what reached stdout mixes two versions"
            )

    state = RangeState(restart)
    try:
        sb._face.run(sb._http.fetch_raw(remote, write, state, bar))
    finally:
        if bar is not None:
            bar.end()
    return 0


def _cp_from_stdin(
    sb: Sandbox,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    bar: ProgressBar | None,
    inp: Any,
) -> int:
    """
    ``cp - :REMOTE``: stdin, read to its end into a local temporary file
    (so its size is known and a big one goes as a resumable upload), then
    uploaded to REMOTE, which must name the file.
    """
    remote = args.destination[1:]
    if (
        not remote
        or remote.endswith("/")
        or remote == "."
        or _is_remote_dir(sb, remote)
    ):
        err.write(
            "sandboxd cp: name the file stdin is copied to (:DIR/NAME), "
            "not a directory\n"
        )
        return 2
    if inp is None:
        err.write("sandboxd cp: no stdin to copy\n")
        return 2
    source = getattr(inp, "buffer", inp)
    with tempfile.TemporaryDirectory(prefix="sandboxd-cp-") as spool_dir:
        spool = os.path.join(spool_dir, "stdin")
        with open(spool, "wb") as f:
            while chunk := source.read(CHUNK_BYTES):
                f.write(chunk.encode() if isinstance(chunk, str) else chunk)
        try:
            written = sb.files.upload(
                spool,
                remote,
                progress=bar,
                overwrite=not args.no_overwrite,
                resume=not args.no_resume,
            )
        finally:
            if bar is not None:
                bar.end()
    _copied(
        {
            "source": STDIO,
            "destination": ":" + written["path"],
            "bytes": written["bytes"],
        },
        args,
        out,
    )
    return 0


def _cp_tree_in(sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """
    ``cp -r DIR :REMOTE``: DIR packed into a tar.gz here and unpacked there
    (``files_extract``: every member checked before anything is written),
    into REMOTE when it is a directory, else as REMOTE, as ``cp -r`` does.
    """
    src = args.source
    remote = args.destination[1:] or "."
    if remote == "." or _is_remote_dir(sb, remote):
        name = os.path.basename(os.path.abspath(src))
        target = remote.rstrip("/") + "/" + name
    else:
        target = remote.rstrip("/") or "/"
    packed = io.BytesIO()

    def leaving_out_links_out(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        # The daemon refuses a link that leads out of the tree (as any
        # Python virtualenv's interpreter does) and then the whole copy:
        # such a link is left out, and said so.
        if member.issym() and _leads_out(member.name, member.linkname):
            err.write(
                f"sandboxd cp: {member.name}: a link to {member.linkname}, out of "
                "the tree, is not copied\n"
            )
            return None
        return member

    try:
        with tarfile.open(fileobj=packed, mode="w:gz") as tar:
            for name in sorted(os.listdir(src)):
                tar.add(
                    os.path.join(src, name), arcname=name, filter=leaving_out_links_out
                )
    except OSError as e:
        err.write(f"sandboxd cp: {_local_error(e, src)}\n")
        return 1
    # The directory itself, so an empty one is copied too; removed again
    # when the copy is refused, if this cp made it.
    made = _remote_stat(sb, target) is None
    sb.files.mkdir(target)
    try:
        done = sb.files.extract(
            packed.getvalue(), target, overwrite=not args.no_overwrite
        )
    except SandboxError:
        if made:
            try:
                sb.files.delete(target)
            except SandboxError:
                pass  # the refusal is what the user needs to see
        raise
    _copied(
        {
            "source": src,
            "destination": ":" + done["destination"],
            "bytes": done["bytes"],
            "files": done["files"],
        },
        args,
        out,
    )
    return 0


def _leads_out(name: str, target: str) -> bool:
    """Whether a link ``name`` (relative to the tree's top) to ``target`` leaves the tree."""
    if posixpath.isabs(target):
        return True
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    return resolved == ".." or resolved.startswith("../")


def _cp_tree_out(
    sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO
) -> int:
    """
    ``cp -r :DIR LOCAL``: DIR packed there (``files_archive``) and unpacked
    here, into LOCAL when it is a directory, else as LOCAL.  Members are
    unpacked with tarfile's ``data`` filter: nothing lands outside LOCAL,
    no device or set-id file is made.
    """
    remote = args.source[1:]
    found = _remote_stat(sb, remote)
    name = posixpath.basename((found["path"] if found else remote).rstrip("/"))
    local = args.destination
    if os.path.isdir(local):
        local = os.path.join(local, name or "copy")
    data = sb.files.archive([remote])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        # The archive holds DIR's files under DIR's own name: drop that
        # first part, so they land in LOCAL.
        inside = []
        for member in tar.getmembers():
            named = member.name[2:] if member.name.startswith("./") else member.name
            _, sep, rest = named.partition("/")
            if sep and rest:
                member.name = rest
                inside.append(member)
        try:
            os.makedirs(local, exist_ok=True)
            tar.extractall(local, members=inside, filter="data")
        except (OSError, tarfile.TarError) as e:
            message = (
                _local_error(e, local) if isinstance(e, OSError) else f"{local}: {e}"
            )
            err.write(f"sandboxd cp: {message}\n")
            return 1
    size = sum(m.size for m in inside if m.isfile())
    _copied(
        {
            "source": args.source,
            "destination": local,
            "bytes": size,
            "files": sum(1 for m in inside if m.isfile()),
        },
        args,
        out,
    )
    return 0


# -- ls, ps, logs, kill ----------------------------------------------------------


def _shown_name(name: str) -> str:
    """
    A file name (or a command line, a tag) as ``ls`` (``ps``) prints it:
    what is not printable (a newline, an escape, NEL, U+2028) as its Python
    escape, so a name written in the sandbox can neither pass for two
    entries nor send control sequences to the user's terminal.  ``--json``
    gives them as they are.
    """
    if name.isprintable():
        return name
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
        for c in name
    )


def cmd_ls(sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """
    A directory's entries; a path that is not a directory is shown as its
    one entry, as ``ls FILE`` shows the file.
    """
    try:
        listing = sb.files.listing(args.path, depth=args.depth)
    except SandboxError as e:
        if e.type != "NotADirectoryError":
            raise
        found = sb.files.stat(args.path)
        if not found.get("exists"):
            raise
        entry = Entry(
            name=found["name"],
            path=found["path"],
            type=cast(Any, found["type"]),
            size=found["size"],
            modified=found["modified"],
        )
        listing = Listing(entries=[entry], truncated=False)
    if args.json:
        _print_json(listing, out)
        return 0
    for entry in sorted(listing["entries"], key=lambda e: e["path"]):
        name = _shown_name(entry["name"] if not args.depth else entry["path"])
        if entry["type"] == "directory":
            name += "/"
        elif entry["type"] == "symlink":
            name += "@"
        if args.long:
            out.write(
                f"{entry['type']:<10}{entry['size']:>12}  {entry['modified']}  {name}\n"
            )
        else:
            out.write(name + "\n")
    if listing.get("truncated"):
        err.write(
            "sandboxd ls: the listing was truncated at the daemon's max_entries\n"
        )
    return 0


def cmd_grep(sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``PATH:LINE:TEXT`` per matching line, as grep -n prints; 1 when none match."""
    found = sb.files.grep(
        args.pattern,
        args.path,
        fixed_strings=args.fixed_strings,
        ignore_case=args.ignore_case,
        include=args.include,
        max_results=args.max_count,
        context=args.context,
    )
    if args.json:
        _print_json(found, out)
        return 0 if found["matches"] else 1
    shown: set[tuple[str, int]] = set()
    for match in found["matches"]:
        line = (match["path"], match["line"])
        if line in shown:
            continue  # several matches on one line: the line once
        shown.add(line)
        name = _shown_name(match["path"])
        # As grep -C prints them: context lines with '-', the match with ':'.
        before = match.get("before", [])
        for n, text in enumerate(before):
            out.write(f"{name}-{match['line'] - len(before) + n}-{text}\n")
        out.write(f"{name}:{match['line']}:{match['text']}\n")
        for n, text in enumerate(match.get("after", []), 1):
            out.write(f"{name}-{match['line'] + n}-{text}\n")
    if found["truncated"]:
        err.write("sandboxd grep: more matches than were asked for (-m)\n")
    if found["timed_out"]:
        err.write("sandboxd grep: the search ran out of time; matches may be missing\n")
    return 0 if found["matches"] else 1


# -- diagnostics, definition ----------------------------------------------------

#: Commands whose status 1 is an answer (errors found, no definition), so
#: a refusal or an unreachable daemon exits 2, as compilers and grep report
#: trouble.
ANSWERS_WITH_ONE = frozenset({"grep", "diagnostics", "definition"})


def _position(spec: str) -> tuple[str, int, int]:
    """``PATH:LINE[:COLUMN]`` as its parts (a ``:`` in PATH is kept)."""
    head, _, last = spec.rpartition(":")
    if not head or not last.isdigit():
        raise argparse.ArgumentTypeError(f"{spec!r} is not PATH:LINE[:COLUMN]")
    path, _, middle = head.rpartition(":")
    if path and middle.isdigit():
        return path, int(middle), int(last)
    return head, int(last), 1


def _diagnostic_line(path: str, d: Diagnostic) -> str:
    """``PATH:LINE:COLUMN: SEVERITY: MESSAGE [SOURCE CODE]``, as compilers print."""
    tag = " ".join(str(x) for x in (d["source"], d["code"]) if x not in (None, ""))
    # One line each: a message of several lines keeps its newlines escaped.
    message = _shown_name(d["message"])
    return f"{path}:{d['line']}:{d['column']}: {d['severity']}: {message}" + (
        f" [{tag}]" if tag else ""
    )


def cmd_diagnostics(
    sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO
) -> int:
    """A line per diagnostic of each PATH; 1 when any is an error."""
    answers = []
    for path in args.paths:
        answer = sb.lsp.diagnostics(path, timeout=args.timeout, server=args.server)
        answers.append(answer)
        if args.json:
            continue
        name = _shown_name(answer["path"])
        for d in answer["diagnostics"]:
            out.write(_diagnostic_line(name, d) + "\n")
        if not answer["settled"]:
            err.write(
                f"sandboxd diagnostics: {name}: the server had not finished within "
                "the timeout; these may be its earlier ones\n"
            )
        left_out = sum(answer["counts"].values()) - len(answer["diagnostics"])
        if answer.get("truncated") and left_out > 0:
            err.write(
                f"sandboxd diagnostics: {name}: {left_out} more not shown "
                "(the most severe are)\n"
            )
    if args.json:
        _print_json(answers, out)
    return 1 if any(a["counts"].get("error") for a in answers) else 0


def cmd_definition(
    sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO
) -> int:
    """``PATH:LINE:COLUMN: TEXT`` per place the name is defined; 1 when none."""
    path, line, column = args.position
    found = sb.lsp.definition(path, line, column, server=args.server)
    if args.json:
        _print_json(found, out)
        return 0 if found["locations"] else 1
    for place in found["locations"]:
        name = _shown_name(place["path"])
        out.write(f"{name}:{place['line']}:{place['column']}: {place['text']}\n")
    if found["outside"]:
        err.write(
            f"sandboxd definition: {found['outside']} left out "
            "(in files this token may not read)\n"
        )
    return 0 if found["locations"] else 1


def cmd_ps(sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    processes = sb.commands.list(args.tag)
    if args.json:
        _print_json(processes, out)
        return 0
    out.write(f"{'PID':>7}  {'STATE':<8}{'EXIT':>5}  {'TAG':<12}COMMAND\n")
    for p in processes:
        # As a shell (and `exec`) reports it: 143 for SIGTERM, not -15.
        code = "" if p["exit_code"] is None else str(exit_status(p["exit_code"]))
        tag = _shown_name(p.get("tag") or "-")
        out.write(
            f"{p['pid']:>7}  {p['state']:<8}{code:>5}  {tag:<12}{_shown_name(p['command'])}\n"
        )
    return 0


def cmd_logs(sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    process = sb.commands.connect(args.pid)
    process.cursor = args.after
    if not args.follow:
        page = process.output()
        if args.json:
            _print_json(page, out)
            return 0
        for chunk in page["events"]:
            (err if chunk["stream"] == "stderr" else out).write(chunk["data"])
        out.flush()
        return 0
    for event in process.stream():
        data = event.data if isinstance(event.data, dict) else {}
        if args.json:
            out.write(
                json.dumps({"seq": event.id, "event": event.event, **data}) + "\n"
            )
            out.flush()
        elif event.event in ("stdout", "stderr"):
            stream = err if event.event == "stderr" else out
            stream.write(str(data.get("data", "")))
            stream.flush()
        elif event.event == "gap":
            err.write(f"[output {data.get('from')}..{data.get('to')} no longer kept]\n")
        if event.event == "exit":
            # How it ended, as exec reports it: 143 for SIGTERM, not -15.
            status = exit_status(data.get("exit_code"))
            if not args.json:
                err.write(f"[process {args.pid} exited, status {status}]\n")
            return status
    return 0


def cmd_kill(sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    value: int | str = int(args.signal) if str(args.signal).isdigit() else args.signal
    sb.commands.connect(args.pid).signal(value)
    if args.json:
        _print_json({"pid": args.pid, "signal": value}, out)
    return 0


# -- caps ----------------------------------------------------------------------


def cmd_caps(sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.explain:
        decision = sb.check(
            args.explain, args.path, op=args.op, command=args.command_name
        )
        if args.json:
            _print_json(decision, out)
        else:
            verdict = "allowed" if decision["allowed"] else "refused"
            line = f"{decision['endpoint']}: {verdict}"
            if not decision["allowed"]:
                # An unknown id has no rule; its reason names the nearest id.
                why = (
                    f"rule {decision['rule']}"
                    if "rule" in decision
                    else decision.get("reason", "rule ?")
                )
                line += f" ({decision.get('code', '?')}, {why})"
            out.write(line + "\n")
            for item in decision.get("paths", []):
                mark = (
                    "allowed"
                    if item.get("allowed")
                    else f"refused ({item.get('code')}, rule {item.get('rule', '?')})"
                )
                out.write(f"  {item.get('path')}: {mark}\n")
        return 0 if decision["allowed"] else 1
    caps = sb.capabilities()
    if args.json:
        _print_json(caps, out)
        return 0
    identity = caps.get("identity", {})
    policy = caps.get("policy", {})
    out.write(
        f"identity {identity.get('id')} (scopes {', '.join(identity.get('scopes', []))}); "
        f"server {caps.get('server_version')}; preset {policy.get('preset') or 'none'}, "
        f"revision {policy.get('revision') or 'none'}\n"
    )
    endpoints = caps.get("endpoints", {})
    by_group: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, info in endpoints.items():
        by_group.setdefault(str(info.get("group")), []).append((name, info))
    for group in sorted(by_group):
        out.write(f"\n{group}:\n")
        for name, info in sorted(by_group[group]):
            if info.get("allowed"):
                state = "yes"
            elif not info.get("enabled"):
                state = f"off ({info.get('rule') or info.get('reason')})"
            else:
                state = f"no ({info.get('reason') or 'missing scope'})"
            out.write(f"  {name:<26}{info.get('method', ''):<7}{state}\n")
    for warning in caps.get("warnings", []):
        err.write(f"warning: {warning}\n")
    return 0


# -- commands ------------------------------------------------------------------


def _command_arguments(pairs: Sequence[str]) -> dict[str, Any]:
    """``ARG=VALUE`` pairs: a value that reads as JSON is that, else text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"{pair!r}: write an argument as ARG=VALUE")
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out


def cmd_commands(
    sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO
) -> int:
    if args.name is None:
        listed = sb.commands.custom()
        if args.json:
            _print_json(listed, out)
            return 0
        for cmd in listed:
            shown = ", ".join(
                f"{a['name']}: {a['type']}"
                + ("" if a["required"] else f" = {json.dumps(a['default'])}")
                for a in cmd.get("args", [])
            )
            line = f"{cmd['name']}({shown})"
            if cmd.get("description"):
                line += f"  {cmd['description']}"
            out.write(line + "\n")
        return 0
    try:
        kwargs = _command_arguments(args.arguments)
    except ValueError as e:
        err.write(f"sandboxd commands: {e}\n")
        return 2
    result = sb.commands.call(args.name, kwargs, timeout=args.timeout)
    if isinstance(result, str) and not args.json:
        out.write(result + ("" if result.endswith("\n") else "\n"))
    else:
        _print_json(result, out)
    return 0


# -- ui ------------------------------------------------------------------------


def console_url(base: str, token: str) -> str:
    """
    The console's URL with the link in its fragment: a fragment is never
    sent to the server nor written to its logs, and the page moves it to
    ``sessionStorage`` at once.
    """
    return f"{base.rstrip('/')}/ui/#link={token}"


def cmd_ui(sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """
    Mint a console link and print the console's URL with it; nothing is
    minted when the daemon does not serve the console (a link is a
    credential: printed for a page that answers 404, it would sit in a
    terminal's scrollback or a CI log for nothing).
    """
    decision = sb.check("ui_assets")
    if not decision["allowed"]:
        why = decision.get("rule") or decision.get("reason") or decision.get("code")
        err.write(
            f"sandboxd ui: the daemon at {sb.url} does not serve the web console "
            f"({why}); turn its console group on "
            '(policy {"groups": {"console": true}}, or ABX_SERVER_ENABLED_GROUPS=console); '
            "no link was minted\n"
        )
        return 1
    body: dict[str, Any] = {"audience": "console", "ttl_seconds": args.ttl}
    if args.scopes:
        body["scopes"] = args.scopes
    minted = sb.request("POST", "/auth/links", json=body)
    url = console_url(sb.url, minted["token"])
    if args.json:
        _print_json({**minted, "url": url}, out)
    else:
        out.write(url + "\n")
        err.write(
            f"(works until {minted['expires_at']}; revoke: link {minted['link_id']})\n"
        )
    return 0


# -- term ----------------------------------------------------------------------


def parse_keys(spec: str) -> bytes:
    """``ctrl-p,ctrl-q`` (or ``ctrl-]``, ``a,b``) as the bytes those keys send."""
    out = bytearray()
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        if item.lower().startswith("ctrl-") and len(item) == 6:
            key = item[5].upper()
            if not "@" <= key <= "_":
                raise ValueError(f"no control key {item!r}")
            out.append(ord(key) - 64)
        elif len(item) == 1:
            out.append(ord(item))
        else:
            raise ValueError(
                f"cannot read the key {item!r} (use ctrl-X or one character)"
            )
    if not out:
        raise ValueError("the detach sequence is empty")
    return bytes(out)


class DetachFilter:
    """
    Watches typed bytes for the detach sequence: a prefix of it is held
    back until the next key says whether it completes it.
    """

    def __init__(self, keys: bytes) -> None:
        self.keys = keys
        self.held = b""

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """The bytes to send now, and whether the sequence was typed."""
        send = bytearray()
        for byte in data:
            candidate = self.held + bytes([byte])
            if self.keys.startswith(candidate):
                if candidate == self.keys:
                    self.held = b""
                    return bytes(send), True
                self.held = candidate
                continue
            # Not the sequence after all: what was held goes through.
            send += self.held
            self.held = b""
            if self.keys.startswith(bytes([byte])):
                self.held = bytes([byte])
            else:
                send.append(byte)
        return bytes(send), False


def _window_size(fd: int) -> tuple[int, int] | None:
    """
    The window's ``(cols, rows)``; None when ``fd`` is no terminal or one
    that reports no size (0x0: a pty nobody sized yet, as ``docker exec
    -t`` before its first resize and many harnesses give), which the
    daemon would refuse.
    """
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    if size.columns <= 0 or size.lines <= 0:
        return None
    return size.columns, size.lines


def cmd_term(sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        keys = parse_keys(args.detach_keys)
    except ValueError as e:
        err.write(f"sandboxd term: --detach-keys: {e}\n")
        return 2
    stdin = sys.stdin.fileno()
    stdout = sys.stdout.fileno()
    if not args.session and not os.isatty(stdin):
        # A new session nobody can type into would be left behind, detached.
        err.write(
            "sandboxd term: stdin is not a terminal; use `sandboxd exec` to run "
            "a command, or `sandboxd term SESSION` to attach to one\n"
        )
        return 2
    size = _window_size(stdin) or _window_size(stdout) or (80, 24)
    terminal: Terminal[Blocking] | None = None
    try:
        with _signals_raise(signal.SIGTERM, signal.SIGHUP), _raw_mode(stdin):
            if args.session:
                terminal = sb.pty.attach(args.session)
                # A session whose shell has just ended closes the connection
                # after its scrollback: the loop below reads and says so.
                with contextlib.suppress(ConnectionFailed):
                    terminal.resize(*size)
            else:
                # Detaching leaves the session for `sandboxd term SESSION`.
                terminal = sb.pty.open(
                    keep=True,
                    cols=size[0],
                    rows=size[1],
                    shell=args.shell,
                    cwd=args.cwd,
                )
            err.write(
                f"[session {terminal.session_id}; detach with {args.detach_keys}]\r\n"
            )
            err.flush()
            return run_terminal(terminal, keys, stdin, stdout, err)
    except (Signalled, KeyboardInterrupt) as e:
        # Killed (a supervisor's SIGTERM, a closed window's SIGHUP): the
        # terminal is restored by now, and the session lives on as after
        # a detach, so the user is told how to get back to it.
        signum = e.signum if isinstance(e, Signalled) else signal.SIGINT
        if terminal is not None:
            with contextlib.suppress(OSError, ValueError):
                err.write(_detached(terminal.session_id, signal.Signals(signum).name))
                err.flush()
        return 128 + signum


class Signalled(BaseException):
    """A signal that ends ``term`` (SIGTERM, SIGHUP), raised where the program is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_raise(*signums: int) -> Iterator[None]:
    """
    ``signums`` raise :class:`Signalled` for the block (their default
    ends the interpreter without running ``finally`` clauses, which would
    leave the local terminal raw); after the first, all are ignored so
    the cleanup runs to its end.
    """

    def handler(signum: int, frame: Any) -> None:
        for each in signums:
            signal.signal(each, signal.SIG_IGN)
        raise Signalled(signum)

    saved = {each: signal.signal(each, handler) for each in signums}
    try:
        yield
    finally:
        for each, previous in saved.items():
            signal.signal(each, previous)


def _detached(session_id: str, why: str | None = None) -> str:
    """The line that says a session runs on, and how to get back to it."""
    cause = f" ({why})" if why else ""
    return (
        f"\r\n[detached from session {session_id}{cause}; reattach with: sandboxd term {session_id}"
        "\r\n with no client and no output the daemon closes it after its idle"
        " timeout (30 min by default), ending what runs in it]\r\n"
    )


@contextlib.contextmanager
def _raw_mode(fd: int) -> Iterator[None]:
    """
    The local terminal in raw mode for the block, restored after it.

    Raw from before the session is created or attached, and switched
    without flushing input (``tty.setraw``'s default, ``TCSAFLUSH``,
    drops it): keys typed while the WebSocket opens wait in the kernel's
    input queue (its bound, about 4 KiB) and are sent once attached,
    neither echoed locally nor lost, as ssh and ``docker exec -it`` do.
    """
    import termios
    import tty

    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd, termios.TCSANOW)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run_terminal(
    terminal: Terminal[Blocking], keys: bytes, stdin: int, stdout: int, err: TextIO
) -> int:
    """
    The interactive loop (the local terminal already in raw mode, see
    :func:`_raw_mode`): output written as it comes (a thread), keys sent
    as typed, SIGWINCH forwarded as a resize.
    """
    done = threading.Event()
    failure: list[BaseException] = []

    def pump() -> None:
        try:
            while True:
                event = terminal.recv()
                if event is None or event.kind == "exited":
                    break
                os.write(stdout, event.data.encode("utf-8", "replace"))
        except BaseException as e:  # reported by the main thread
            failure.append(e)
        finally:
            done.set()

    def winch(signum: int, frame: Any) -> None:
        size = _window_size(stdin)
        if size is not None:
            try:
                terminal.resize(*size)
            except Exception:
                pass  # the terminal is going away

    old_winch = signal.signal(signal.SIGWINCH, winch)
    reader = threading.Thread(target=pump, name="sandboxd-term-output", daemon=True)
    reader.start()
    detached = False
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    detach = DetachFilter(keys)
    try:
        while not done.is_set():
            try:
                ready, _, _ = select.select([stdin], [], [], 0.1)
            except InterruptedError:
                continue
            if not ready:
                continue
            data = os.read(stdin, 4096)
            if not data:
                break
            send, detached = detach.feed(data)
            if send:
                terminal.send(decoder.decode(send))
            if detached:
                break
    finally:
        signal.signal(signal.SIGWINCH, old_winch)
        terminal.close()
        reader.join(timeout=2)
    if detached:
        # The daemon closes a session with no client and no output after
        # its idle timeout: a quiet job left running here would end with it.
        err.write(_detached(terminal.session_id))
        return 0
    if failure and not isinstance(failure[0], ConnectionFailed):
        raise failure[0]
    if terminal.exit_code is not None:
        err.write(
            f"\r\n[session {terminal.session_id} ended, exit code {terminal.exit_code}]\r\n"
        )
        return exit_status(terminal.exit_code)
    sid = terminal.session_id
    try:
        terminal._pty.get(sid)
    except NotFoundError:
        err.write(f"\r\n[session {sid} is gone: the daemon ended it]\r\n")
    except SandboxError:
        err.write(
            f"\r\n[connection to the daemon lost; session {sid} ended with it if the "
            f"daemon stopped; once it is back, try: sandboxd term {sid}]\r\n"
        )
    else:
        err.write(
            f"\r\n[connection to session {sid} lost; reattach with: sandboxd term {sid}]\r\n"
        )
    return 1


# -- code ----------------------------------------------------------------------


def _run_cell(
    sb: Sandbox,
    cid: str,
    source: str,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
) -> bool:
    """
    One execution, its output as it comes; whether it ended ``ok``.  With
    ``--json``, its result document once it ended (``stdout``, ``results``
    with every MIME bundle, ``error``): one indented document for ``-c``,
    one line per cell in the loop.
    """
    if args.json:
        doc = sb.code.execute(cid, source, timeout=args.timeout)
        if args.source is not None:
            _print_json(doc, out)
        else:
            out.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
            out.flush()
        return doc.get("state") == "ok"
    body: dict[str, Any] = {"code": source, "stream": True}
    if args.timeout is not None:
        body["timeout"] = args.timeout
    path = f"/code/contexts/{seg(cid)}/execute"
    state = "lost"
    events = sb._http.events("POST", path, json=body, resumable=False)
    for event in sb._face.iterate(events):
        data = event.data if isinstance(event.data, dict) else {}
        if event.event == "stdout":
            out.write(data.get("text", ""))
            out.flush()
        elif event.event == "stderr":
            err.write(data.get("text", ""))
            err.flush()
        elif event.event == "display":
            bundle = data.get("data") or {}
            text = bundle.get("text/plain")
            others = sorted(m for m in bundle if m != "text/plain")
            if text is not None:
                out.write(f"{text}\n")
            elif others:
                out.write(f"[{', '.join(others)}]\n")
        elif event.event == "error":
            err.write(
                data.get("traceback_text")
                or f"{data.get('ename')}: {data.get('evalue')}"
            )
            err.write("\n")
        elif event.event == "context.restarted":
            err.write(
                f"[the kernel restarted ({data.get('reason')}): its state is gone]\n"
            )
        elif event.event == "execution.ended":
            state = str(data.get("state"))
            if state not in ("ok", "error"):
                err.write(f"[{state}]\n")
    return state == "ok"


def _cells(lines: Any, prompt: Callable[[str], None]) -> Any:
    """
    Cells from lines: one line is a cell, unless it opens a block (ends
    with ``:`` or ``\\``): then lines until an empty one.
    """
    prompt(">>> ")
    block: list[str] = []
    for line in lines:
        line = line.rstrip("\n")
        if block:
            if line.strip():
                block.append(line)
                prompt("... ")
                continue
            yield "\n".join(block)
            block = []
        elif line.rstrip().endswith((":", "\\")):
            block = [line]
            prompt("... ")
            continue
        elif line.strip():
            yield line
        prompt(">>> ")
    if block:
        yield "\n".join(block)


#: Two Ctrl-C within this many seconds leave the ``code`` loop (one
#: interrupts the running cell).
DOUBLE_INTERRUPT_SECONDS = 1.0


def cmd_code(sb: Sandbox, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """
    ``sandboxd code``: a context (new unless ``--context``), then ``-c``'s
    code or a read-eval-print loop on stdin; a new context is deleted at
    exit unless ``--keep``.  In the loop, Ctrl-C interrupts the running
    cell and the loop goes on; a second within a second leaves (130).
    """
    created = args.context is None
    if created:
        fields = {"kernel": args.kernel} if args.kernel else {}
        cid = sb.code.create_context(**fields)["id"]
    else:
        cid = args.context
    ok = True
    try:
        if args.source is not None:
            ok = _run_cell(sb, cid, args.source, args, out, err)
        else:
            interactive = sys.stdin.isatty()

            def prompt(text: str) -> None:
                if interactive:
                    err.write(text)
                    err.flush()

            last_interrupt = -DOUBLE_INTERRUPT_SECONDS
            for cell in _cells(sys.stdin, prompt):
                try:
                    ok = _run_cell(sb, cid, cell, args, out, err) and ok
                except KeyboardInterrupt:
                    # As python's own prompt: Ctrl-C interrupts the cell and
                    # the state stays; twice in a row leaves.
                    now = time.monotonic()
                    if now - last_interrupt < DOUBLE_INTERRUPT_SECONDS:
                        raise
                    last_interrupt = now
                    sb.code.interrupt(cid)
                    err.write("KeyboardInterrupt (twice to leave)\n")
                    err.flush()
                    ok = False
    except KeyboardInterrupt:
        sb.code.interrupt(cid)
        return 130
    finally:
        if created and not args.keep:
            sb.code.delete_context(cid)
        elif created:
            err.write(f"context {cid} kept\n")
    return 0 if ok else 1


HANDLERS: dict[str, Callable[[Sandbox, argparse.Namespace, TextIO, TextIO], int]] = {
    "exec": cmd_exec,
    "cp": cmd_cp,
    "ls": cmd_ls,
    "grep": cmd_grep,
    "diagnostics": cmd_diagnostics,
    "definition": cmd_definition,
    "ps": cmd_ps,
    "logs": cmd_logs,
    "kill": cmd_kill,
    "term": cmd_term,
    "caps": cmd_caps,
    "commands": cmd_commands,
    "code": cmd_code,
    "ui": cmd_ui,
}


def main(
    argv: Sequence[str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    inp: Any = None,
) -> int:
    """
    Run one client command; its exit status (``exec``: the child's;
    1 for a refusal or an unreachable daemon, 2 for bad usage or, from
    ``grep``, ``diagnostics`` and ``definition``, a refusal; 141, as a
    shell reports SIGPIPE, when the reader of our output went away).

    :param inp: the local stdin ``exec`` forwards when it is not a
        terminal (the console script passes ``sys.stdin``; None: nothing).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        sb = _sandbox(args)
    except ValueError as e:
        err.write(f"sandboxd {args.command}: {e}\n")
        return 2
    try:
        if args.command == "exec":
            return cmd_exec(sb, args, out, err, inp)
        if args.command == "cp":
            return cmd_cp(sb, args, out, err, inp)
        return HANDLERS[args.command](sb, args, out, err)
    except BrokenPipeError:
        return _reader_gone(out)
    except NotFoundError as e:
        err.write(f"sandboxd {args.command}: {e}\n")
        return 2 if args.command in ANSWERS_WITH_ONE else 1
    except (SandboxError, RequestTimeout) as e:
        err.write(f"sandboxd {args.command}: {_explain(e, sb.url)}\n")
        return 2 if args.command in ANSWERS_WITH_ONE else 1
    except KeyboardInterrupt:
        return 130
    finally:
        sb.close()


#: The exit status of a command whose output pipe closed (128 + SIGPIPE).
PIPE_CLOSED = 128 + 13


def _reader_gone(out: TextIO) -> int:
    """
    Our reader (``head``) went away: end quietly.  Whatever is still
    buffered for stdout goes to /dev/null, so the interpreter's last flush
    prints no BrokenPipeError either.
    """
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):
        return PIPE_CLOSED
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return PIPE_CLOSED


def console() -> int:
    """
    The ``sandboxd`` command of the client-only distribution
    (``sandboxd-client``): the commands that drive a daemon, ``--version``
    and ``--help``; running a daemon needs the ``sandboxd`` distribution.
    """
    from sandboxd._version import __version__

    args = sys.argv[1:]
    if args[:1] and args[0] in COMMANDS:
        return main(args, inp=sys.stdin)
    if args[:1] in (["--version"], ["version"]):
        print(f"sandboxd {__version__} (client)")
        return 0
    if args[:1] in ([], ["-h"], ["--help"]):
        _parser().print_help()
        return 0
    sys.stderr.write(
        f"sandboxd: {args[0]!r} is not a client command ({', '.join(COMMANDS)}); "
        "running a daemon needs the sandboxd distribution, not sandboxd-client\n"
    )
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(inp=sys.stdin))
