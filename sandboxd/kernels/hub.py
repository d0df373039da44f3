# -*- test-case-name: tests.kernels.test_contexts -*-
"""
The kernel hub: the one child process that speaks ZMQ to Jupyter kernels.

The daemon never imports ``jupyter_client``, ``pyzmq`` or ``tornado``
(their asyncio loops and signal handling would share the daemon's process
with Twisted's). It starts this program (``python -m sandboxd.kernels.hub``)
on the first code context and talks to it over its stdin and stdout: one
JSON object per line each way. The hub only *connects* to kernels the
daemon has spawned (it never launches one, so every kernel stays in the
daemon's process tree, as its user, and dies with it); it turns the
Jupyter messages of each execution into the small events the daemon logs.

Commands (daemon to hub), each naming a context ``cid``:

- ``{"op": "open", "cid", "conn": {connection info}, "timeout"}`` →
  ``{"ev": "ready", "cid", "info": {language_info...}}`` or
  ``{"ev": "failed", "cid", "message"}``
- ``{"op": "execute", "cid", "xid", "code", "silent", "store_history",
  "allow_stdin"}`` → ``started``, ``stream``, ``display``, ``clear``,
  ``error``, ``input`` events, then ``{"ev": "done", "xid", "status",
  "count"}`` once the reply and the kernel's ``idle`` are both in
- ``{"op": "input", "cid", "value"}``, ``{"op": "interrupt", "cid"}``
- ``{"op": "close", "cid", "shutdown": bool}`` → ``{"ev": "closed", "cid"}``

Kept stdlib-plus-jupyter_client only: it runs in its own interpreter.
"""

from __future__ import annotations

import asyncio
import codecs
import hmac
import json
import os
import sys
import warnings
from typing import Any

#: One stream event carries at most this many bytes of output; a bigger
#: chunk is split between characters, so no frame grows past the daemon's
#: bound and each decodes alone.
STREAM_CHUNK_BYTES = 256 * 1024

#: Queued event lines are written at once past this many bytes (else at
#: the end of the event loop's turn).
FLUSH_BYTES = 1024 * 1024

#: A command line from the daemon is at most this long (code is 1 MiB max).
MAX_COMMAND_BYTES = 16 * 1024 * 1024


class Output:
    """
    The hub's stdout: one compact JSON line per event.

    Lines are gathered and written once per turn of the event loop: the
    messages of one execution that arrive together (a result, ``idle`` and
    the reply) cross the pipe in one write, so the daemon wakes once for
    them instead of once a line. At :data:`FLUSH_BYTES` the lines go out at
    once, which bounds what waits here.
    """

    def __init__(self) -> None:
        self._out = sys.stdout.buffer
        self._lines: list[bytes | memoryview] = []
        self._size = 0
        self._scheduled = False

    def send(self, event: dict[str, Any], payload: Pieces | None = None) -> None:
        """
        Queue one event line; it leaves at the end of this turn of the loop.

        :param payload: raw bytes that follow the line, in pieces (the line
            says how many bytes in ``bytes``): output text crosses as it
            is, with no JSON escaping here and no JSON parsing in the
            daemon, its pieces never joined here.
        """
        size = sum(len(piece) for piece in payload) if payload is not None else 0
        if payload is not None:
            event["bytes"] = size
        line = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        data = line.encode("utf-8", "surrogatepass") + b"\n"
        self._lines.append(data)
        self._size += len(data)
        if payload is not None:
            self._lines += payload
            self._size += size
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop (a last word at exit): now
                self.flush()

    def flush(self) -> None:
        """
        Write what is queued now (a full pipe blocks the hub: that is the
        backpressure on the kernels' output).
        """
        self._scheduled = False
        if not self._lines:
            return
        parts, self._lines, self._size = self._lines, [], 0
        self._out.flush()  # nothing goes there but this; in order if it did
        write_all(self._out.fileno(), parts)


#: The most buffers one ``writev`` takes (Linux's IOV_MAX).
IOV_MAX = 1024


def write_all(fd: int, parts: list[bytes | memoryview]) -> None:
    """
    Write ``parts`` in order with ``writev``: lines and output go to the
    pipe as they are, never joined into one more copy first.
    """
    i = 0
    while i < len(parts):
        done = os.writev(fd, parts[i : i + IOV_MAX])
        while i < len(parts) and done >= len(parts[i]):
            done -= len(parts[i])
            i += 1
        if done:  # a part written in part: the rest of it next
            parts[i] = memoryview(parts[i])[done:]


#: Bytes in pieces, in order (views of a kernel's frame between escapes,
#: and what those escapes stand for).
Pieces = list[bytes | memoryview]


def utf8_pieces(pieces: Pieces, size: int) -> list[Pieces]:
    """
    ``pieces`` (UTF-8, each cut between characters) regrouped into chunks
    of at most ``size`` bytes, never cut inside a character: views, so no
    byte is copied.
    """
    out: list[Pieces] = []
    chunk: Pieces = []
    room = size
    for piece in pieces:
        view = memoryview(piece)
        while len(view) > room:
            cut = room
            # Back off continuation bytes (10xxxxxx) so a character stays whole.
            while cut > 0 and view[cut] & 0xC0 == 0x80:
                cut -= 1
            if cut == 0 and not chunk:
                cut = room  # not UTF-8: cut anyway, never stall
            if cut:
                chunk.append(view[:cut])
            out.append(chunk)
            chunk, room = [], size
            view = view[cut:]
        if len(view):
            chunk.append(view)
            room -= len(view)
    if chunk or not out:
        out.append(chunk)
    return out


def utf8_chunks(raw: bytes, size: int) -> list[bytes]:
    """``raw`` (UTF-8) in pieces of at most ``size`` bytes, never inside a character."""
    return [b"".join(chunk) for chunk in utf8_pieces([raw], size)]


#: A ``stream`` message's content frame at least this long is read
#: without a JSON parser when it can be (:func:`stream_content`).
FAST_STREAM_BYTES = 64 * 1024

#: How a ``stream`` message's content frame starts, as the Python kernel's
#: packer (``json.dumps``) and ``orjson`` write it: the head, the stream,
#: and what that encoder writes between a string and the next key.
_STREAM_HEADS = (
    (b'{"name": "stdout", "text": "', "stdout", b'", "'),
    (b'{"name": "stderr", "text": "', "stderr", b'", "'),
    (b'{"name":"stdout","text":"', "stdout", b'","'),
    (b'{"name":"stderr","text":"', "stderr", b'","'),
)


def stream_content(frame: bytes) -> dict[str, Any] | None:
    """
    A big ``stream`` message's content, ``{"name", "pieces"}``, read from its
    frame without decoding the text to a string, unescaping it and
    encoding it back (three passes over what may be megabytes, the
    hub's dearest work): only when the frame is what kernels send, the
    name and then the text, valid UTF-8, whose escapes Python's own bytes
    unescaping reads alike (quotes, tabs, newlines...).

    The text is never sliced out of the frame (a copy of it all): with
    nothing escaped it is a view of the frame; with a few escapes (a
    print's last newline) it is the views between them and what each
    escape stands for, never joined here; with many, the frame's text is
    unescaped in one C pass.

    :returns: None when the frame is anything else (another key order, a
        key after the text, ``\\uXXXX`` or backslash escapes, bad UTF-8):
        JSON-decode it then.
    """
    known = next((k for k in _STREAM_HEADS if frame.startswith(k[0])), None)
    if known is None or not frame.endswith(b'"}'):
        return None
    head, name, between = known
    start, end = len(head), len(frame) - 2
    if not frame.isascii():
        try:
            frame.decode("utf-8")  # its head and end are ASCII: the text's check
        except UnicodeDecodeError:
            return None  # the JSON way reads it with U+FFFD
    first = frame.find(b"\\", start, end)
    if first < 0:
        # Nothing escaped, so no quote either.
        if frame.find(b'"', start, end) >= 0:
            return None
        return {"name": name, "pieces": [memoryview(frame)[start:end]]}
    try:
        pieces = _unescape_few(frame, start, end, first)
    except ValueError:
        return None
    if pieces is None:
        text = _unescape_many(frame, start, end, between)
        pieces = None if text is None else [text]
    return None if pieces is None else {"name": name, "pieces": pieces}


#: A stream text with more escapes than this is unescaped in one C pass
#: (:func:`_unescape_many`); up to it, piece by piece.
FEW_ESCAPES = 256

#: The escapes :func:`_unescape_few` reads: those JSON and Python read
#: alike, but for the backslash and ``/`` (which it leaves to JSON).
_ESCAPES = {
    ord('"'): b'"',
    ord("n"): b"\n",
    ord("r"): b"\r",
    ord("t"): b"\t",
    ord("b"): b"\b",
    ord("f"): b"\f",
}


def _unescape_few(frame: bytes, start: int, end: int, first: int) -> Pieces | None:
    """
    The text between ``start`` and ``end`` unescaped, in pieces, its
    first backslash at ``first``, or None when it has more than
    :data:`FEW_ESCAPES` escapes.

    :raises ValueError: an escape not in :data:`_ESCAPES`, or a quote not
        escaped (the text ends there: another key follows).
    """
    view = memoryview(frame)
    parts: Pieces = []
    escapes: set[int] = set()
    pos, at = start, first
    while at >= 0:
        if len(escapes) == FEW_ESCAPES:
            return None
        char = _ESCAPES.get(frame[at + 1]) if at + 1 < end else None
        if char is None:
            raise ValueError("an escape JSON reads otherwise")
        escapes.add(at)
        parts += (view[pos:at], char)
        pos = at + 2
        at = frame.find(b"\\", pos, end)
    parts.append(view[pos:end])
    quote = frame.find(b'"', start, end)
    while quote >= 0:
        if quote - 1 not in escapes:
            raise ValueError("a quote not escaped")
        quote = frame.find(b'"', quote + 1, end)
    return parts


def _unescape_many(frame: bytes, start: int, end: int, between: bytes) -> bytes | None:
    """
    The text between ``start`` and ``end`` unescaped by Python's bytes
    unescaping, when that reads it as JSON would; else None.
    """
    # Another key after the text: its encoder put ``between`` before it
    # (an escaped quote in the text is preceded by a backslash, never a
    # quote, so the text itself cannot hold it).
    if frame.find(between, start, end) >= 0:
        return None
    try:
        with warnings.catch_warnings():
            # ``\\u`` is an invalid escape to it: left as it is, seen below.
            warnings.simplefilter("ignore")
            text: bytes = codecs.escape_decode(memoryview(frame)[start:end])[0]
    except ValueError:
        return None
    # A backslash left: ``\\\\``, ``\\u`` or ``\\/`` were there, which
    # JSON reads otherwise (or the same, but that is not worth telling).
    if b"\\" in text:
        return None
    return text


def decode_message(session: Any, frames: list[bytes]) -> dict[str, Any]:
    """
    One Jupyter message from its frames, checked as ``jupyter_client``'s
    ``Session.deserialize`` checks it (an HMAC signature, never one seen
    before), without what the hub never reads: the dates parsed out of both
    headers (a third of a small message's cost in the hub) and the
    adaptation of protocol-5 messages, which changes nothing in them.

    :raises ValueError: a message unsigned, replayed or badly signed.
    """
    _, parts = session.feed_identities(frames)
    if session.auth is not None:
        signature = parts[0]
        if not signature:
            raise ValueError("Unsigned Message")
        if signature in session.digest_history:
            raise ValueError(f"Duplicate Signature: {signature!r}")
        session._add_digest(signature)
        if not hmac.compare_digest(signature, session.sign(parts[1:5])):
            raise ValueError(f"Invalid Signature: {signature!r}")
    if len(parts) < 5:
        raise TypeError("malformed message, must have at least 5 elements")
    header = session.unpack(parts[1])
    content = None
    if header["msg_type"] == "stream" and len(parts[4]) >= FAST_STREAM_BYTES:
        content = stream_content(parts[4])
    message = {
        "header": header,
        "msg_id": header["msg_id"],
        "msg_type": header["msg_type"],
        "parent_header": session.unpack(parts[2]),
        "metadata": session.unpack(parts[3]),
        "content": content if content is not None else session.unpack(parts[4]),
        "buffers": [memoryview(b) for b in parts[5:]],
    }
    if not str(header.get("version", "")).startswith("5."):
        from jupyter_client.adapter import adapt

        return adapt(message)
    return message


class Pending:
    """One execution in flight: done once both its reply and ``idle`` are in."""

    def __init__(self, xid: str) -> None:
        self.xid = xid
        self.reply: dict[str, Any] | None = None
        self.idle = False


class Kernel:
    """One connected kernel: its client, its executions, its reader tasks."""

    def __init__(self, hub: Hub, cid: str, conn: dict[str, Any]) -> None:
        from jupyter_client.asynchronous.client import AsyncKernelClient

        self.hub = hub
        self.cid = cid
        self.client = AsyncKernelClient()
        self.client.load_connection_info(conn)  # type: ignore[arg-type]
        self.client.start_channels()
        self.pending: dict[str, Pending] = {}
        self.tasks: list[asyncio.Task[None]] = []

    async def ready(self, timeout: float) -> dict[str, Any]:
        """
        Wait until the kernel answers ``kernel_info`` on shell *and* its
        ``idle`` arrives on iopub: a subscription made before the kernel
        bound its sockets may miss the first messages otherwise.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        info: dict[str, Any] = {}
        while loop.time() < deadline:
            msg_id = self.client.kernel_info()
            try:
                info = await self._reply_and_idle(
                    msg_id, min(1.0, deadline - loop.time())
                )
            except TimeoutError:
                continue
            self.tasks = [
                asyncio.ensure_future(self._iopub()),
                asyncio.ensure_future(self._shell()),
                asyncio.ensure_future(self._stdin()),
            ]
            return info
        raise TimeoutError

    async def _reply_and_idle(self, msg_id: str, wait: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        content: dict[str, Any] | None = None
        idle = False
        while content is None or not idle:
            left = end - loop.time()
            if left <= 0:
                raise TimeoutError
            if content is None:
                try:
                    msg = await asyncio.wait_for(
                        self.client.get_shell_msg(), min(left, 0.05)
                    )
                except TimeoutError:
                    msg = None
                if msg is not None and msg["parent_header"].get("msg_id") == msg_id:
                    content = msg["content"]
            if not idle:
                try:
                    msg = await asyncio.wait_for(
                        self.client.get_iopub_msg(), min(left, 0.05)
                    )
                except TimeoutError:
                    msg = None
                if (
                    msg is not None
                    and msg["msg_type"] == "status"
                    and msg["parent_header"].get("msg_id") == msg_id
                    and msg["content"].get("execution_state") == "idle"
                ):
                    idle = True
        return dict(
            content.get("language_info") or {},
            implementation=content.get("implementation"),
        )

    def execute(self, command: dict[str, Any]) -> None:
        """Send one ``execute_request``."""
        msg_id = self.client.execute(
            command["code"],
            silent=bool(command.get("silent")),
            store_history=bool(command.get("store_history", True)),
            allow_stdin=bool(command.get("allow_stdin")),
            stop_on_error=False,
        )
        self.pending[msg_id] = Pending(command["xid"])

    async def _next(self, channel: Any) -> dict[str, Any]:
        """
        The channel's next message, straight from its socket (no poll
        before each receive, as ``get_*_msg`` does). A message that fails
        its check is dropped, as ``jupyter_client`` would raise on it.
        """
        while True:
            frames = await channel.socket.recv_multipart()
            try:
                return decode_message(self.client.session, frames)
            except (ValueError, TypeError, KeyError):
                continue

    def _emit(
        self,
        pending: Pending,
        ev: str,
        payload: Pieces | None = None,
        **fields: Any,
    ) -> None:
        self.hub.out.send(
            {"ev": ev, "cid": self.cid, "xid": pending.xid, **fields}, payload
        )

    async def _iopub(self) -> None:
        while True:
            msg = await self._next(self.client.iopub_channel)
            pending = self.pending.get(msg["parent_header"].get("msg_id", ""))
            if pending is None:
                continue
            kind = msg["msg_type"]
            content = msg["content"]
            if kind == "stream":
                pieces = content.get("pieces")
                if pieces is None:
                    text = str(content.get("text", ""))
                    pieces = [text.encode("utf-8", "surrogatepass")]
                # Views, not copies: written to the pipe as they are.
                for chunk in utf8_pieces(pieces, STREAM_CHUNK_BYTES):
                    self._emit(
                        pending, "stream", chunk, name=content.get("name", "stdout")
                    )
            elif kind in ("display_data", "execute_result", "update_display_data"):
                self._emit(
                    pending,
                    "display",
                    data=content.get("data", {}),
                    metadata=content.get("metadata", {}),
                    is_result=kind == "execute_result",
                    update=kind == "update_display_data",
                    display_id=(content.get("transient") or {}).get("display_id"),
                )
            elif kind == "execute_input":
                self._emit(pending, "started", count=content.get("execution_count"))
            elif kind == "error":
                self._emit(
                    pending,
                    "error",
                    ename=content.get("ename", ""),
                    evalue=content.get("evalue", ""),
                    traceback=list(content.get("traceback") or []),
                )
            elif kind == "clear_output":
                self._emit(pending, "clear", wait=bool(content.get("wait")))
            elif kind == "status" and content.get("execution_state") == "idle":
                pending.idle = True
                self._finish(msg["parent_header"]["msg_id"], pending)

    async def _shell(self) -> None:
        while True:
            msg = await self._next(self.client.shell_channel)
            msg_id = msg["parent_header"].get("msg_id", "")
            pending = self.pending.get(msg_id)
            if pending is None or msg["msg_type"] != "execute_reply":
                continue
            pending.reply = msg["content"]
            self._finish(msg_id, pending)

    async def _stdin(self) -> None:
        while True:
            msg = await self._next(self.client.stdin_channel)
            pending = self.pending.get(msg["parent_header"].get("msg_id", ""))
            if pending is None or msg["msg_type"] != "input_request":
                continue
            content = msg["content"]
            self._emit(
                pending,
                "input",
                prompt=content.get("prompt", ""),
                password=bool(content.get("password")),
            )

    def _finish(self, msg_id: str, pending: Pending) -> None:
        if pending.reply is None or not pending.idle:
            return
        del self.pending[msg_id]
        self._emit(
            pending,
            "done",
            status=pending.reply.get("status", "error"),
            count=pending.reply.get("execution_count"),
        )

    def interrupt(self) -> None:
        """``interrupt_request`` on control (kernels whose spec says ``message``)."""
        msg = self.client.session.msg("interrupt_request", {})
        self.client.control_channel.send(msg)

    async def close(self, shutdown: bool) -> None:
        """Stop reading, optionally ask the kernel to shut down, disconnect."""
        for task in self.tasks:
            task.cancel()
        if shutdown:
            try:
                self.client.shutdown()
                await asyncio.sleep(0.05)
            except Exception:
                pass
        self.client.stop_channels()


class Hub:
    """The command loop: one :class:`Kernel` per open context."""

    def __init__(self) -> None:
        self.out = Output()
        self.kernels: dict[str, Kernel] = {}
        #: Opens and closes under way (a task nobody holds may be collected).
        self._tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run(self) -> None:
        """Read commands until stdin closes, then disconnect everything."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_COMMAND_BYTES)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
        )
        while True:
            try:
                line = await reader.readline()
            except ValueError:
                self.out.send({"ev": "fatal", "message": "a command line is too long"})
                self.out.flush()
                return
            if not line:
                break
            try:
                command = json.loads(line)
                self.dispatch(command)
            except Exception as e:  # one bad command never ends the hub
                self.out.send(
                    {
                        "ev": "bad_command",
                        "cid": _cid(line),
                        "message": f"{type(e).__name__}: {e}",
                    }
                )
        for kernel in list(self.kernels.values()):
            await kernel.close(False)
        self.out.flush()

    def dispatch(self, command: dict[str, Any]) -> None:
        """Carry out one command (``open`` and ``close`` run as tasks)."""
        op = command["op"]
        cid = command["cid"]
        if op == "open":
            self._spawn(
                self.open(cid, command["conn"], float(command.get("timeout", 30)))
            )
            return
        if op == "close":
            self._spawn(self.close(cid, bool(command.get("shutdown"))))
            return
        kernel = self.kernels.get(cid)
        if kernel is None:
            self.out.send(
                {
                    "ev": "bad_command",
                    "cid": cid,
                    "xid": command.get("xid"),
                    "message": "no such context",
                }
            )
            return
        if op == "execute":
            kernel.execute(command)
        elif op == "input":
            kernel.client.input(str(command.get("value", "")))
        elif op == "interrupt":
            kernel.interrupt()
        else:
            raise ValueError(f"unknown op {op!r}")

    async def open(self, cid: str, conn: dict[str, Any], timeout: float) -> None:
        """Connect to a kernel the daemon spawned and wait until it answers."""
        old = self.kernels.pop(cid, None)
        if old is not None:
            await old.close(False)
        try:
            kernel = Kernel(self, cid, conn)
        except Exception as e:
            self.out.send(
                {"ev": "failed", "cid": cid, "message": f"{type(e).__name__}: {e}"}
            )
            return
        self.kernels[cid] = kernel
        try:
            info = await kernel.ready(timeout)
        except TimeoutError:
            if self.kernels.get(cid) is kernel:
                del self.kernels[cid]
            await kernel.close(False)
            self.out.send(
                {
                    "ev": "failed",
                    "cid": cid,
                    "message": f"the kernel did not answer within {timeout:g} s",
                }
            )
            return
        self.out.send({"ev": "ready", "cid": cid, "info": info})

    async def close(self, cid: str, shutdown: bool) -> None:
        """Disconnect from a context's kernel (the daemon kills its tree)."""
        kernel = self.kernels.pop(cid, None)
        if kernel is not None:
            await kernel.close(shutdown)
        self.out.send({"ev": "closed", "cid": cid})


def _cid(line: bytes) -> str | None:
    try:
        value = json.loads(line).get("cid")
    except Exception:
        return None
    return value if isinstance(value, str) else None


#: Linux's F_SETPIPE_SZ, and the size asked for the pipe to the daemon.
F_SETPIPE_SZ = 1031
PIPE_BYTES = 1024 * 1024


def _widen_pipe(fd: int) -> None:
    """
    A 1 MiB pipe to the daemon instead of 64 KiB: a large output crosses
    in 16 times fewer hand-overs between the two processes (each one a
    context switch, dear on a busy machine). Best effort.
    """
    import fcntl

    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass


#: Linux's prctl(2) option that makes a process not dumpable.
PR_SET_DUMPABLE = 4


def _not_dumpable() -> None:
    """
    Out of reach of its kernels, which run as the same user: a process
    that is not dumpable cannot be traced by that user, and its ``/proc``
    entries (its pipes to the daemon under ``fd/``, its memory with the
    kernels' keys) belong to root. Best effort (Linux only).
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main() -> None:
    """Run the hub until the daemon closes its stdin."""
    # The daemon interrupts kernels, never the hub.
    import signal

    _not_dumpable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _widen_pipe(1)
    os.environ.pop("PYTHONSTARTUP", None)
    asyncio.run(Hub().run())


if __name__ == "__main__":
    main()
