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
  "count"}`` once the reply and the kernel's ``idle`` are both in (or the
  reply and :data:`IDLE_GRACE_SECONDS` of quiet on iopub: then with
  ``"idle_lost": true``); ``{"ev": "dropped", "cid", "xid", "stdout",
  "stderr", "displays"}`` where output was dropped (see :class:`Output`)
- ``{"op": "input", "cid", "value"}``, ``{"op": "interrupt", "cid"}``
- ``{"op": "close", "cid", "shutdown": bool}`` → ``{"ev": "closed", "cid"}``

Kept stdlib-plus-jupyter_client only: it runs in its own interpreter.
"""

from __future__ import annotations

import codecs
import heapq
import hmac
import json
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

#: One stream event carries at most this many bytes of output; a bigger
#: chunk is split between characters, so no frame grows past the daemon's
#: bound and each decodes alone.
STREAM_CHUNK_BYTES = 256 * 1024

#: Queued event lines are written at once past this many bytes (else at
#: the end of the loop's turn).
FLUSH_BYTES = 1024 * 1024

#: The longest a held line (what an execution says on its way) waits for
#: the lines after it: imperceptible to whoever watches the execution,
#: longer than a short cell takes to run.
HOLD_SECONDS = 0.005

#: A command line from the daemon is at most this long (code is 1 MiB max).
MAX_COMMAND_BYTES = 16 * 1024 * 1024

#: The most the hub reads from its stdin at once.
COMMAND_READ_BYTES = 1024 * 1024

#: What the hub holds for the daemon while its pipe is full (the daemon
#: passes its own bound, ``CODE_HUB_BUFFER_BYTES``, on the command line):
#: past it the hub stops reading the kernels' iopub until half of it has
#: gone, and past twice it drops output, counted (see :class:`Output`).
BUFFER_BYTES = 64 * 1024 * 1024

#: Messages a kernel socket queues before ZMQ drops (iopub) or waits (the
#: daemon passes ``CODE_HUB_IOPUB_HWM``).
IOPUB_HWM = 100_000

#: After an execution's reply, how long iopub may stay quiet about it
#: before it ends without its ``idle`` (a message ZMQ may have dropped).
IDLE_GRACE_SECONDS = 2.0

#: The events that carry output the hub may drop past its bound.
DROPPABLE = ("stream", "late", "display")


class Output:
    """
    The hub's stdout: one compact JSON line per event.

    Lines are gathered and written once per turn of the hub's loop: the
    messages of one execution that arrive together (a result, ``idle`` and
    the reply) cross the pipe in one write, so the daemon wakes once for
    them instead of once a line. At :data:`FLUSH_BYTES` the lines go out at
    once.

    A line sent with ``hold`` (what an execution says on its way: that it
    started, its output) may wait up to :data:`HOLD_SECONDS` for the
    next: a short cell's lines then cross with its end, and the daemon
    wakes once for the whole execution instead of two or three times (a
    chatty cell's, once per moment instead of once per print).

    The pipe is written without blocking: a kernel publishes its output on
    a ZMQ PUB socket, which never waits for its reader but drops what it
    cannot queue, so a hub that stopped reading while the daemon is slow
    would have the kernel's output (and the ``idle`` that ends a cell) lost
    with no word. What the pipe does not take waits here instead (the hub
    stops reading iopub well before ``bound``: see :meth:`Hub._pace`); past
    ``bound`` bytes waiting all the same, output (``stream``, ``late``,
    ``display``) is dropped and counted, and a ``dropped`` event says how
    much before the next line of that execution (its ``done`` at the
    latest).
    """

    def __init__(self, bound: int = BUFFER_BYTES) -> None:
        self._out = sys.stdout.buffer
        self._lines: list[bytes | memoryview] = []
        self._size = 0
        self.bound = bound
        #: Something queued may not wait past this turn of the loop.
        self.urgent = False
        #: What was dropped and not yet told, by (cid, xid): counts by kind.
        self._dropped: dict[tuple[Any, Any], dict[str, int]] = {}
        #: The pipe took less than it was offered last time: no more
        #: offers until the loop sees it take more.
        self.full = False

    @property
    def waiting(self) -> bool:
        """Whether any line is queued."""
        return bool(self._lines)

    @property
    def waiting_bytes(self) -> int:
        """What is queued, in bytes."""
        return self._size

    def send(
        self, event: dict[str, Any], payload: Pieces | None = None, hold: bool = False
    ) -> None:
        """
        Queue one event line; it leaves at the end of this turn of the loop
        (:meth:`flush`), or with ``hold`` up to :data:`HOLD_SECONDS` later.

        :param payload: raw bytes that follow the line, in pieces (the line
            says how many bytes in ``bytes``): output text crosses as it
            is, with no JSON escaping here and no JSON parsing in the
            daemon, its pieces never joined here.
        """
        size = sum(len(piece) for piece in payload) if payload is not None else 0
        ev = event.get("ev")
        if ev in DROPPABLE and self._size >= self.bound:
            counts = self._dropped.setdefault((event.get("cid"), event.get("xid")), {})
            kind = "displays" if ev == "display" else _stream_name(event)
            counts[kind] = counts.get(kind, 0) + (1 if ev == "display" else size)
            return
        if self._dropped:
            self._tell_dropped()
        if payload is not None:
            event["bytes"] = size
        line = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        data = line.encode("utf-8", "surrogatepass") + b"\n"
        self._lines.append(data)
        self._size += len(data)
        self.urgent = self.urgent or not hold
        if payload is not None:
            self._lines += payload
            self._size += size
        if self._size >= FLUSH_BYTES and not self.full:
            self.flush()

    def _tell_dropped(self) -> None:
        """A ``dropped`` line for each execution that lost output since the last."""
        dropped, self._dropped = self._dropped, {}
        for (cid, xid), counts in dropped.items():
            event = {"ev": "dropped", "cid": cid, "xid": xid, **counts}
            line = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
            data = line.encode("utf-8", "surrogatepass") + b"\n"
            self._lines.append(data)
            self._size += len(data)

    def flush(self) -> None:
        """
        Write what is queued, as much as the pipe takes now; the rest waits
        for the pipe to take more (:attr:`waiting`).
        """
        self.urgent = False
        if not self._lines:
            return
        self._out.flush()  # nothing goes there but this; in order if it did
        written = write_some(self._out.fileno(), self._lines)
        self._size -= written
        self.full = bool(self._lines)


#: The most buffers one ``writev`` takes (Linux's IOV_MAX).
IOV_MAX = 1024


def write_some(fd: int, parts: list[bytes | memoryview]) -> int:
    """
    Write ``parts`` in order with ``writev`` as far as ``fd`` takes them
    now (all of them on a blocking ``fd``): lines and output go to the pipe
    as they are, never joined into one more copy first. What was written
    is taken off ``parts``.

    :returns: the bytes written.
    """
    i = 0
    total = 0
    try:
        while i < len(parts):
            done = os.writev(fd, parts[i : i + IOV_MAX])
            total += done
            while i < len(parts) and done >= len(parts[i]):
                done -= len(parts[i])
                i += 1
            if done:  # a part written in part: the rest of it next
                parts[i] = memoryview(parts[i])[done:]
    except BlockingIOError:
        pass
    finally:
        del parts[:i]
    return total


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
    headers (a third of a small message's cost in the hub), the metadata
    frame, and the adaptation of protocol-5 messages, which changes
    nothing in them.

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
    current = str(header.get("version", "")).startswith("5.")
    message = {
        "header": header,
        "msg_id": header["msg_id"],
        "msg_type": header["msg_type"],
        "parent_header": session.unpack(parts[2]),
        # The hub never reads a message's metadata (a rich result's is in
        # its content): parsed only for the adapter of older protocols.
        "metadata": {} if current else session.unpack(parts[3]),
        "content": content if content is not None else session.unpack(parts[4]),
        "buffers": [memoryview(b) for b in parts[5:]],
    }
    if not current:
        from jupyter_client.adapter import adapt

        return adapt(message)
    return message


#: A Jupyter message id as ``jupyter_client``'s ``Session`` makes it (the
#: one ipykernel uses): the session and pid, and the message's number.
_NUMBERED_ID = re.compile(r"(.+_\d+)_(\d+)")

#: Numbers seen past a gap that are held before the gap is taken as lost.
MAX_NUMBERS_HELD = 100_000


class Numbers:
    """
    The numbers of the messages a kernel sent that the hub received, to
    count those it never did.

    A kernel publishes output on a ZMQ PUB socket, which drops messages
    when its queue for a reader is full (1000 messages: a kernel printing
    fast while the hub's process waits for a CPU) and says nothing. A
    ``jupyter_client`` session numbers every message it sends, on every
    socket, one after the other: a number never received (every socket
    the kernel answers on is read) is a message lost.
    """

    def __init__(self) -> None:
        self._prefix: str | None = None
        #: Every number up to this one is received or counted lost.
        self._base: int | None = None
        self._seen: set[int] = set()
        #: Messages counted lost, and those of them already reported.
        self.lost = 0
        self.told = 0

    def saw(self, msg_id: str) -> int | None:
        """Note a message received; its number (None: not numbered so)."""
        match = _NUMBERED_ID.fullmatch(msg_id)
        if match is None:
            return None
        prefix, number = match.group(1), int(match.group(2))
        if self._prefix is None:
            self._prefix = prefix
        if prefix != self._prefix:
            return None
        if self._base is None:
            self._base = number - 1
        if number > self._base:
            self._seen.add(number)
            self._advance()
            if len(self._seen) > MAX_NUMBERS_HELD:
                self.settle(min(self._seen) - 1)
        return number

    def settle(self, upto: int) -> None:
        """Count each number up to ``upto`` not received as lost."""
        if self._base is None or upto <= self._base:
            return
        got = {n for n in self._seen if n <= upto}
        self.lost += upto - self._base - len(got)
        self._seen -= got
        self._base = upto
        self._advance()

    def _advance(self) -> None:
        assert self._base is not None
        while self._base + 1 in self._seen:
            self._base += 1
            self._seen.discard(self._base)

    def start_over(self) -> None:
        """
        Count from the last number seen: what went before is nobody's loss
        (a subscription joins late, so a kernel's first messages, before
        it answered, may never come).
        """
        top = max(self._seen, default=self._base)
        self._base = top
        self._seen.clear()
        self.told = self.lost

    def untold(self) -> int:
        """The messages counted lost since the last call."""
        lost, self.told = self.lost - self.told, self.lost
        return lost


class Pending:
    """
    One execution in flight: done once both its reply and ``idle`` are in,
    or its reply and :data:`IDLE_GRACE_SECONDS` with nothing about it on
    iopub (its ``idle`` travels on a socket that may drop it; the reply
    does not).
    """

    def __init__(self, xid: str) -> None:
        self.xid = xid
        self.reply: dict[str, Any] | None = None
        self.idle = False
        #: When iopub last said anything about it (monotonic).
        self.heard = time.monotonic()
        #: The number of the last message about it (see :class:`Numbers`).
        self.last: int | None = None


#: How long an unanswered ``kernel_info_request`` waits before another is
#: sent, while a kernel is being opened.
KERNEL_INFO_RETRY_SECONDS = 1.0

#: How long a ``shutdown_request`` is given to leave before the kernel's
#: sockets close (they drop what is unsent).
SHUTDOWN_SEND_SECONDS = 0.05

#: At most this many messages are taken from one socket per turn of the
#: loop, so a kernel printing without pause never starves the commands.
MESSAGES_PER_TURN = 64


class Opening:
    """A kernel being opened: the ``kernel_info`` asked, its answer awaited."""

    def __init__(self, deadline: float, timeout: float) -> None:
        self.deadline = deadline
        self.timeout = timeout
        self.msg_id = ""
        self.info: dict[str, Any] | None = None
        self.idle = False


def _stream_name(content: dict[str, Any]) -> str:
    """A ``stream`` message's stream: ``stderr``, else ``stdout``."""
    return "stderr" if content.get("name") == "stderr" else "stdout"


def _stream_chunks(content: dict[str, Any]) -> list[Pieces]:
    """
    A ``stream`` message's text in chunks of whole UTF-8 characters:
    views, not copies, written to the pipe as they are.
    """
    pieces = content.get("pieces")
    if pieces is None:
        text = str(content.get("text", ""))
        pieces = [text.encode("utf-8", "surrogatepass")]
    return utf8_pieces(pieces, STREAM_CHUNK_BYTES)


class Kernel:
    """
    One connected kernel: its client's sockets, read by the hub's loop,
    and its executions.
    """

    def __init__(self, hub: Hub, cid: str, conn: dict[str, Any]) -> None:
        from jupyter_client.blocking.client import BlockingKernelClient

        self.hub = hub
        self.cid = cid
        # One ZMQ context for the hub (one I/O thread), no heartbeat thread:
        # the hub never reads the heartbeat.
        self.client = BlockingKernelClient(context=hub.context)
        self.client.load_connection_info(conn)  # type: ignore[arg-type]
        self.client.start_channels(hb=False)
        self.pending: dict[str, Pending] = {}
        self.opening: Opening | None = None
        self.closed = False
        #: The sockets the hub's loop reads, each with what reads it.
        self.iopub = self.client.iopub_channel.socket
        self.readers: dict[Any, Callable[[dict[str, Any]], None]] = {
            self.iopub: self._iopub,
            self.client.shell_channel.socket: self._shell,
            self.client.stdin_channel.socket: self._stdin,
            # Read for its messages' numbers only (an interrupt's reply).
            self.client.control_channel.socket: lambda msg: None,
        }
        self.numbers = Numbers()

    def open(self, timeout: float) -> None:
        """
        Ask ``kernel_info`` until the kernel answers it on shell *and* its
        ``idle`` arrives on iopub (a subscription made before the kernel
        bound its sockets may miss the first messages otherwise), once a
        second, for at most ``timeout`` seconds.
        """
        self.opening = Opening(time.monotonic() + timeout, timeout)
        self._ask_info()

    def _ask_info(self) -> None:
        opening = self.opening
        if opening is None or self.closed:
            return
        left = opening.deadline - time.monotonic()
        if left <= 0:
            self.hub.failed_open(self, opening.timeout)
            return
        opening.msg_id = self.client.kernel_info()
        opening.info, opening.idle = None, False
        self.hub.later(min(KERNEL_INFO_RETRY_SECONDS, left), self._ask_info)

    def _opened(self, msg: dict[str, Any]) -> None:
        """A message while opening: the ``kernel_info`` answer, or dropped."""
        opening = self.opening
        assert opening is not None
        if msg["parent_header"].get("msg_id") != opening.msg_id:
            return
        if msg["msg_type"] == "kernel_info_reply":
            content = msg["content"]
            opening.info = dict(
                content.get("language_info") or {},
                implementation=content.get("implementation"),
            )
        elif (
            msg["msg_type"] == "status"
            and msg["content"].get("execution_state") == "idle"
        ):
            opening.idle = True
        if opening.info is not None and opening.idle:
            self.opening = None
            self.numbers.start_over()
            self.hub.out.send({"ev": "ready", "cid": self.cid, "info": opening.info})

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

    def read(self, socket: Any) -> None:
        """
        Take the messages waiting on ``socket`` (up to
        :data:`MESSAGES_PER_TURN`), straight from it: no poll before each
        receive. A message that fails its check is dropped, as
        ``jupyter_client`` would raise on it.
        """
        import zmq

        handle = self.readers[socket]
        for _ in range(MESSAGES_PER_TURN):
            if self.closed:
                return
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = decode_message(self.client.session, frames)
            except (ValueError, TypeError, KeyError):
                continue
            number = self.numbers.saw(str(msg["msg_id"]))
            if number is not None:
                about = self.pending.get(msg["parent_header"].get("msg_id", ""))
                if about is not None and (about.last is None or number > about.last):
                    about.last = number
            if self.opening is not None:
                if socket is not self.client.stdin_channel.socket:
                    self._opened(msg)
                continue
            handle(msg)

    def _emit(
        self,
        pending: Pending,
        ev: str,
        payload: Pieces | None = None,
        **fields: Any,
    ) -> None:
        # What an execution says on its way may wait a moment for its end;
        # its end, and a question to whoever runs it, may not.
        hold = ev not in ("done", "input")
        self.hub.out.send(
            {"ev": ev, "cid": self.cid, "xid": pending.xid, **fields}, payload, hold
        )

    def _iopub(self, msg: dict[str, Any]) -> None:
        pending = self.pending.get(msg["parent_header"].get("msg_id", ""))
        kind = msg["msg_type"]
        content = msg["content"]
        if pending is not None:
            pending.heard = time.monotonic()
        if pending is None:
            if kind == "stream":
                # Output whose execution has ended: a thread a cell started
                # prints on, and ipykernel gives it the last cell's header.
                # The daemon decides where it goes (``late``).
                for chunk in _stream_chunks(content):
                    self.hub.out.send(
                        {"ev": "late", "cid": self.cid, "name": _stream_name(content)},
                        chunk,
                        True,
                    )
            return
        if kind == "stream":
            for chunk in _stream_chunks(content):
                self._emit(pending, "stream", chunk, name=_stream_name(content))
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

    def _shell(self, msg: dict[str, Any]) -> None:
        msg_id = msg["parent_header"].get("msg_id", "")
        pending = self.pending.get(msg_id)
        if pending is None or msg["msg_type"] != "execute_reply":
            return
        pending.reply = msg["content"]
        self._finish(msg_id, pending)
        if not pending.idle:
            self.hub.later(IDLE_GRACE_SECONDS, lambda: self._idle_due(msg_id))

    def _idle_due(self, msg_id: str) -> None:
        """
        The reply came a while ago and ``idle`` has not: once iopub has
        been quiet about the execution for :data:`IDLE_GRACE_SECONDS`
        (what it printed last may still be arriving), it ends without it.
        """
        pending = self.pending.get(msg_id)
        if pending is None or self.closed:
            return
        if self.hub.iopub_paused:
            # Unread, not quiet: its output waits in the kernel's queue.
            pending.heard = time.monotonic()
        quiet = time.monotonic() - pending.heard
        if quiet < IDLE_GRACE_SECONDS:
            self.hub.later(IDLE_GRACE_SECONDS - quiet, lambda: self._idle_due(msg_id))
            return
        self._finish(msg_id, pending, idle_lost=True)

    def _stdin(self, msg: dict[str, Any]) -> None:
        pending = self.pending.get(msg["parent_header"].get("msg_id", ""))
        if pending is None or msg["msg_type"] != "input_request":
            return
        content = msg["content"]
        self._emit(
            pending,
            "input",
            prompt=content.get("prompt", ""),
            password=bool(content.get("password")),
        )

    def _finish(self, msg_id: str, pending: Pending, idle_lost: bool = False) -> None:
        if pending.reply is None or not (pending.idle or idle_lost):
            return
        del self.pending[msg_id]
        extra: dict[str, Any] = {"idle_lost": True} if idle_lost else {}
        if pending.last is not None:
            # Every message before its last is in by now (each socket keeps
            # its order); a lost idle came after its reply.
            self.numbers.settle(pending.last + (1 if idle_lost else 0))
        lost = self.numbers.untold()
        if lost:
            extra["lost_messages"] = lost
        self._emit(
            pending,
            "done",
            status=pending.reply.get("status", "error"),
            count=pending.reply.get("execution_count"),
            **extra,
        )

    def interrupt(self) -> None:
        """``interrupt_request`` on control (kernels whose spec says ``message``)."""
        msg = self.client.session.msg("interrupt_request", {})
        self.client.control_channel.send(msg)

    def close(self, shutdown: bool, then: Callable[[], None] | None = None) -> None:
        """
        Stop reading, optionally ask the kernel to shut down (its sockets
        close a moment later, so the request leaves), disconnect; then
        ``then``.
        """
        self.closed = True
        self.opening = None
        self.hub.forget(self)
        if shutdown:
            try:
                self.client.shutdown()
            except Exception:
                shutdown = False
        if shutdown:
            self.hub.later(SHUTDOWN_SEND_SECONDS, lambda: self._disconnect(then))
        else:
            self._disconnect(then)

    def _disconnect(self, then: Callable[[], None] | None) -> None:
        self.client.stop_channels()
        if then is not None:
            then()


class Hub:
    """
    The command loop: one :class:`Kernel` per open context.

    A plain ``zmq.Poller`` over the kernels' sockets and the hub's stdin,
    no asyncio: each kernel message then costs one receive and its
    handling, not a future, a task switch and a poll of its own (the hub's
    loop turns about five messages an execution, each a wakeup of this
    process on a machine that may be busy).
    """

    def __init__(
        self, buffer_bytes: int = BUFFER_BYTES, iopub_hwm: int = IOPUB_HWM
    ) -> None:
        import zmq

        #: Past this much waiting for the daemon, iopub is left unread.
        self.buffer_bytes = buffer_bytes
        self.out = Output(2 * buffer_bytes)
        #: Whether the kernels' iopub is left unread for now (:meth:`_pace`).
        self.iopub_paused = False
        self.kernels: dict[str, Kernel] = {}
        self.context = zmq.Context()
        # Every socket made on it (set before each connects): a kernel's
        # burst of small prints queues here for the loop to read rather
        # than being dropped by the kernel's PUB socket at ZMQ's default
        # of 1000 messages.
        self.context.setsockopt(zmq.RCVHWM, iopub_hwm)
        #: Whether the loop waits for the pipe to the daemon to take more.
        self._writing = False
        self.poller = zmq.Poller()
        #: The socket each kernel reads, to its kernel.
        self._owners: dict[Any, Kernel] = {}
        #: Calls due later, as (when, order, call): a heap.
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._order = 0
        self._command = bytearray()
        #: A flush of held lines is due (:meth:`_flush`).
        self._holding = False

    def later(self, seconds: float, call: Callable[[], None]) -> None:
        """Run ``call`` in ``seconds`` (on a turn of the loop)."""
        self._order += 1
        heapq.heappush(self._timers, (time.monotonic() + seconds, self._order, call))

    def watch(self, kernel: Kernel) -> None:
        """Read ``kernel``'s sockets in the loop."""
        import zmq

        for socket in kernel.readers:
            self._owners[socket] = kernel
            if not (self.iopub_paused and socket is kernel.iopub):
                self.poller.register(socket, zmq.POLLIN)

    def forget(self, kernel: Kernel) -> None:
        """Stop reading ``kernel``'s sockets; it is no longer open."""
        for socket in kernel.readers:
            if self._owners.pop(socket, None) is not None:
                try:
                    self.poller.unregister(socket)
                except KeyError:  # its iopub, left unread for now
                    pass
        if self.kernels.get(kernel.cid) is kernel:
            del self.kernels[kernel.cid]

    def run(self) -> None:
        """Read commands until stdin closes, then disconnect everything."""
        import zmq

        os.set_blocking(0, False)
        os.set_blocking(1, False)
        self.poller.register(0, zmq.POLLIN)
        try:
            while True:
                for socket, _ in self.poller.poll(self._wait()):
                    if socket == 0:
                        if not self._commands():
                            return
                    elif socket == 1:
                        self.out.flush()
                    else:
                        owner = self._owners.get(socket)
                        if owner is not None:
                            owner.read(socket)
                self._due()
                self._flush()
        finally:
            for kernel in list(self.kernels.values()):
                kernel.close(False)
            os.set_blocking(1, True)
            self.out.flush()

    def _flush(self) -> None:
        """
        Write the turn's lines, unless all may wait: then in
        :data:`HOLD_SECONDS` at the latest.
        """
        if self.out.urgent:
            self.out.flush()
        elif self.out.waiting and not self._holding:
            self._holding = True
            self.later(HOLD_SECONDS, self._held)
        self._watch_pipe()

    def _watch_pipe(self) -> None:
        """
        Wake the loop when the pipe to the daemon takes more, while lines
        wait that it did not take (never a busy wait on a full pipe).
        """
        import zmq

        self._pace()
        blocked = self.out.waiting and not self.out.urgent and not self._holding
        if blocked != self._writing:
            self._writing = blocked
            if blocked:
                self.poller.register(1, zmq.POLLOUT)
            else:
                self.poller.unregister(1)

    def _pace(self) -> None:
        """
        Leave the kernels' iopub unread while :attr:`buffer_bytes` wait for
        the daemon, until half of that has gone: a large output then waits
        in the kernel's own queue (its thousand messages hold a lot of it)
        as it did before the hub held anything, and the hub's memory stays
        bounded. A flood of small messages is held here first: that queue
        would drop them (counted then: see :class:`Numbers`).
        """
        import zmq

        size = self.out.waiting_bytes
        if self.iopub_paused:
            pause = size >= self.buffer_bytes // 2
        else:
            pause = size >= self.buffer_bytes
        if pause == self.iopub_paused:
            return
        self.iopub_paused = pause
        for kernel in self.kernels.values():
            if kernel.closed or kernel.iopub not in self._owners:
                continue
            if self.iopub_paused:
                self.poller.unregister(kernel.iopub)
            else:
                self.poller.register(kernel.iopub, zmq.POLLIN)

    def _held(self) -> None:
        self._holding = False
        self.out.flush()
        self._watch_pipe()

    def _wait(self) -> int | None:
        """Milliseconds until the next timer (None: none)."""
        if not self._timers:
            return None
        return max(0, math.ceil((self._timers[0][0] - time.monotonic()) * 1000))

    def _due(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            heapq.heappop(self._timers)[2]()

    def _commands(self) -> bool:
        """
        Take what stdin holds and carry out each whole line; False once
        stdin is closed or a line runs past :data:`MAX_COMMAND_BYTES`.
        """
        try:
            data = os.read(0, COMMAND_READ_BYTES)
        except BlockingIOError:
            return True
        if not data:
            return False
        buffer = self._command
        start = len(buffer)
        buffer += data
        pos = 0
        while True:
            nl = buffer.find(b"\n", max(pos, start))
            if nl < 0:
                break
            if nl - pos > MAX_COMMAND_BYTES:
                break
            self.command(bytes(buffer[pos:nl]))
            pos = nl + 1
            start = pos
        del buffer[:pos]
        if len(buffer) > MAX_COMMAND_BYTES:
            self.out.send({"ev": "fatal", "message": "a command line is too long"})
            return False
        return True

    def command(self, line: bytes) -> None:
        """Carry out one command line (one bad command never ends the hub)."""
        try:
            self.dispatch(json.loads(line))
        except Exception as e:
            self.out.send(
                {
                    "ev": "bad_command",
                    "cid": _cid(line),
                    "message": f"{type(e).__name__}: {e}",
                }
            )

    def dispatch(self, command: dict[str, Any]) -> None:
        """Carry out one command."""
        op = command["op"]
        cid = command["cid"]
        if op == "open":
            self.open(cid, command["conn"], float(command.get("timeout", 30)))
            return
        if op == "close":
            self.close(cid, bool(command.get("shutdown")))
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

    def open(self, cid: str, conn: dict[str, Any], timeout: float) -> None:
        """Connect to a kernel the daemon spawned; ``ready`` once it answers."""
        old = self.kernels.get(cid)
        if old is not None:
            old.close(False)
        try:
            kernel = Kernel(self, cid, conn)
        except Exception as e:
            self.out.send(
                {"ev": "failed", "cid": cid, "message": f"{type(e).__name__}: {e}"}
            )
            return
        self.kernels[cid] = kernel
        self.watch(kernel)
        kernel.open(timeout)

    def failed_open(self, kernel: Kernel, timeout: float) -> None:
        """``kernel`` did not answer within ``timeout`` seconds: disconnect it."""
        kernel.close(False)
        self.out.send(
            {
                "ev": "failed",
                "cid": kernel.cid,
                "message": f"the kernel did not answer within {timeout:g} s",
            }
        )

    def close(self, cid: str, shutdown: bool) -> None:
        """Disconnect from a context's kernel (the daemon kills its tree)."""
        kernel = self.kernels.get(cid)

        def closed() -> None:
            self.out.send({"ev": "closed", "cid": cid})

        if kernel is None:
            closed()
        else:
            kernel.close(shutdown, closed)


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
    Hub(*_bounds(sys.argv[1:])).run()


def _bounds(args: list[str]) -> tuple[int, int]:
    """
    The bounds the daemon passes (``--buffer-bytes N --iopub-hwm N``),
    the defaults here for those it does not.
    """
    given = dict(zip(args[::2], args[1::2], strict=False))
    return (
        int(given.get("--buffer-bytes", BUFFER_BYTES)),
        int(given.get("--iopub-hwm", IOPUB_HWM)),
    )


if __name__ == "__main__":
    main()
