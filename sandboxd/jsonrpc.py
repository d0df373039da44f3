# -*- test-case-name: tests.test_jsonrpc -*-
"""
JSON-RPC 2.0: the error codes, the four message shapes, and a peer over a
child's byte stream with its two framings.

Three parts of the daemon speak it with the same message semantics over
different transports: the MCP door answers requests read from HTTP bodies
(:mod:`sandboxd.mcp.protocol`), the agents engine is a peer of a coding
agent over its stdio in lines (ACP), and the language servers are spoken to
over theirs in ``Content-Length`` frames (LSP).  Each keeps its protocol's
own codes; what a message is, and the table of requests waiting for an
answer, live here once.

Twisted's ``LineReceiver`` is no use for the stdio transports: 16 KiB lines
and ``\\r\\n`` delimiters, while ACP lines hold whole files.  Each framer
here has its own cap; a message over it fails the connection instead of
growing without bound or hanging.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from sandboxd.errors import ApiError, not_json
from sandboxd.web.jsonbody import json_bytes

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
#: MCP and ACP alike: the resource (a file, a URI) does not exist.
RESOURCE_NOT_FOUND = -32002
#: LSP's code, which ACP uses for a request the caller cancelled.
REQUEST_CANCELLED = -32800
#: LSP's code for a request that was well formed but refused.
REQUEST_FAILED = -32803

Message = dict[str, Any]

log = Logger(namespace="sandboxd.jsonrpc")

#: A ``\\u`` escape of a UTF-16 surrogate in a raw message: only a message
#: holding one can decode to a string with a lone half.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")

#: A surrogate code point left in decoded text (a pair is joined by the
#: decoder, so whatever is left is a lone half).
_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(value: Any) -> Any:
    """
    ``value`` (decoded JSON) with every lone UTF-16 surrogate replaced by
    U+FFFD.  JSON may carry one as a ``\\u`` escape (a JavaScript peer that
    cut a string through an emoji sends exactly that), but no text holding
    one can be encoded as UTF-8: kept as it is, it would break whatever
    stores, writes or sends it on.
    """
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {
            without_lone_surrogates(k): without_lone_surrogates(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [without_lone_surrogates(v) for v in value]
    return value


def valid_id(request_id: Any) -> bool:
    """Whether ``request_id`` is one JSON-RPC allows: a string, a number or null."""
    return request_id is None or (
        isinstance(request_id, (str, int, float)) and not isinstance(request_id, bool)
    )


def _deliver(callback: Callable[[bytes], None], data: bytes) -> None:
    """
    Hand one framed message on; a handler's failure is logged and the
    stream read on, so one odd message never stops the reader (an
    exception escaping a transport's read would drop the connection).
    """
    try:
        callback(data)
    except Exception:
        log.failure("a message from the peer could not be handled")


class RpcError(Exception):
    """A JSON-RPC error, received from a peer or to be sent to one."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def as_json(self) -> dict[str, Any]:
        """The ``error`` member of a response."""
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            out["data"] = self.data
        return out


def request(request_id: Any, method: str, params: Any) -> Message:
    """A JSON-RPC request."""
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def notification(method: str, params: Mapping[str, Any] | None = None) -> Message:
    """A JSON-RPC notification (``params`` left out when None)."""
    out: Message = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        out["params"] = dict(params)
    return out


def result(request_id: Any, value: Any) -> Message:
    """A JSON-RPC result response."""
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def error(request_id: Any, code: int, message: str, data: Any = None) -> Message:
    """A JSON-RPC error response."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": RpcError(code, message, data).as_json(),
    }


def encode(message: Any) -> bytes:
    """
    ``message`` as compact JSON, UTF-8 (:func:`~sandboxd.web.jsonbody.json_bytes`:
    a lone surrogate, from a file name that is not UTF-8, as a ``\\u``
    escape).  A message JSON cannot carry (a non-finite number in a result)
    is replaced by an internal error for the same id, so whatever is sent is
    JSON and answers the request.
    """
    try:
        return json_bytes(message)
    except ApiError:
        rid = message.get("id") if isinstance(message, dict) else None
        failure = not_json(message, "the message")
        return json_bytes(error(rid, INTERNAL_ERROR, failure.message, failure.body()))


def request_key(request_id: Any) -> str:
    """A dict key telling ``1`` and ``"1"`` apart, as JSON-RPC does."""
    return f"{type(request_id).__name__}:{request_id}"


# -- framing -------------------------------------------------------------------


def newline_frame(data: bytes) -> bytes:
    """One message as a line (ACP's stdio transport)."""
    return data + b"\n"


def content_length_frame(data: bytes) -> bytes:
    """One message behind a ``Content-Length`` header (LSP's base protocol)."""
    return b"Content-Length: %d\r\n\r\n" % len(data) + data


class LineFramer:
    """
    Split a byte stream on ``\\n`` with a cap on one line's length.

    :param max_bytes: the longest line accepted (``max_message_bytes``).
    :param on_line: called with each complete line (without ``\\r\\n``).
    :param on_overflow: called once when a line exceeds the cap; the framer
        then drops everything that follows.
    """

    def __init__(
        self,
        max_bytes: int,
        on_line: Callable[[bytes], None],
        on_overflow: Callable[[int], None],
    ) -> None:
        self.max_bytes = max_bytes
        self._on_line = on_line
        self._on_overflow = on_overflow
        self._buffer = bytearray()
        self._scanned = 0
        self.stopped = False

    def feed(self, data: bytes) -> None:
        """Take the next chunk of stdout."""
        if self.stopped:
            return
        self._buffer += data
        while not self.stopped:
            index = self._buffer.find(b"\n", self._scanned)
            if index < 0:
                self._scanned = len(self._buffer)
                if len(self._buffer) > self.max_bytes:
                    self._overflow(len(self._buffer))
                return
            if index > self.max_bytes:
                self._overflow(index)
                return
            line = bytes(self._buffer[:index])
            del self._buffer[: index + 1]
            self._scanned = 0
            if line.endswith(b"\r"):
                line = line[:-1]
            if line.strip():
                _deliver(self._on_line, line)

    def _overflow(self, size: int) -> None:
        self.stop()
        self._on_overflow(size)

    def stop(self) -> None:
        """Drop the buffer and ignore further input."""
        self.stopped = True
        self._buffer = bytearray()


#: The longest header block of a ``Content-Length`` frame.
MAX_HEADER_BYTES = 1024


#: What :class:`ContentLengthFramer` keeps of a message it reads past.
OVERSIZED_HEAD_BYTES = 64 * 1024


class ContentLengthFramer:
    """
    Split a byte stream into ``Content-Length`` framed messages (LSP).

    Headers are ASCII lines ended by ``\\r\\n``, then an empty line, then
    exactly ``Content-Length`` bytes.  A header block over
    :data:`MAX_HEADER_BYTES`, one with no usable ``Content-Length``, or a
    length over ``max_bytes`` is broken framing: nothing after it can be
    trusted to start a message, so the framer stops and says why once.

    With ``on_oversized``, a length over ``max_bytes`` is not broken
    framing: the length is still known, so the body is read past (never
    held whole) and the next message read as usual; ``on_oversized`` gets
    the body's first :data:`OVERSIZED_HEAD_BYTES` (enough to tell what
    the message was) and its length.

    :param on_message: each message's body.
    :param on_broken: the reason, once, when the framing breaks.
    :param on_oversized: ``(head, length)`` of each message over ``max_bytes``.
    """

    def __init__(
        self,
        max_bytes: int,
        on_message: Callable[[bytes], None],
        on_broken: Callable[[str], None],
        on_oversized: Callable[[bytes, int], None] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self._on_message = on_message
        self._on_broken = on_broken
        self._on_oversized = on_oversized
        self._buffer = bytearray()
        #: The body length of the message being read, once its headers are.
        self._length: int | None = None
        #: Bytes left of an oversized body being read past, its length and head.
        self._skip = 0
        self._skipped_length = 0
        self._head = bytearray()
        self.stopped = False

    def feed(self, data: bytes) -> None:
        """Take the next chunk of stdout."""
        if self.stopped:
            return
        self._buffer += data
        while not self.stopped:
            if self._skip:
                if not self._read_past():
                    return
                continue
            if self._length is None and not self._read_headers():
                return
            if self._skip:
                continue
            assert self._length is not None
            if len(self._buffer) < self._length:
                return
            body = bytes(self._buffer[: self._length])
            del self._buffer[: self._length]
            self._length = None
            _deliver(self._on_message, body)

    def _read_headers(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n", 0, MAX_HEADER_BYTES + 4)
        if end < 0:
            if len(self._buffer) > MAX_HEADER_BYTES + 3:
                self._broken(f"a header block over {MAX_HEADER_BYTES} bytes")
            return False
        length = None
        for line in bytes(self._buffer[:end]).split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if sep and name.strip().lower() == b"content-length":
                text = value.strip()
                length = int(text) if text.isdigit() else None
        del self._buffer[: end + 4]
        if length is None:
            self._broken("a message with no valid Content-Length")
            return False
        if length > self.max_bytes:
            if self._on_oversized is not None:
                self._skip = self._skipped_length = length
                return True
            self._broken(
                f"a message of {length} bytes (max_message_bytes {self.max_bytes})"
            )
            return False
        self._length = length
        return True

    def _read_past(self) -> bool:
        """Drop what is buffered of an oversized body; True once it is all gone."""
        take = min(self._skip, len(self._buffer))
        room = OVERSIZED_HEAD_BYTES - len(self._head)
        if room > 0:
            self._head += self._buffer[: min(take, room)]
        del self._buffer[:take]
        self._skip -= take
        if self._skip:
            return False
        head, self._head = bytes(self._head), bytearray()
        length = self._skipped_length
        on_oversized = self._on_oversized
        assert on_oversized is not None
        _deliver(lambda h: on_oversized(h, length), head)
        return True

    def _broken(self, reason: str) -> None:
        self.stop()
        self._on_broken(reason)

    def stop(self) -> None:
        """Drop the buffer and ignore further input."""
        self.stopped = True
        self._buffer = bytearray()


# -- a peer ------------------------------------------------------------------


class ConnectionLost(Exception):
    """The peer went away with our request unanswered."""


class Peer(Protocol):
    """What a :class:`Connection` hands incoming traffic to."""

    def handle_request(self, request_id: Any, method: str, params: Any) -> Any:
        """A request from the peer: a result, a Deferred of one, or raise :class:`RpcError`."""

    def handle_notification(self, method: str, params: Any) -> None:
        """A notification from the peer."""

    def handle_garbage(self, line: bytes, reason: str, message: Any) -> None:
        """A line that is not a message we understand (recorded, not fatal)."""


class Connection:
    """
    One JSON-RPC peer over a writer function.

    :param write: sends bytes to the peer (a child's stdin).
    :param peer: receives requests, notifications and garbage.
    :param frame: one encoded message as the transport frames it
        (:func:`newline_frame` or :func:`content_length_frame`).
    """

    def __init__(
        self,
        write: Callable[[bytes], None],
        peer: Peer,
        frame: Callable[[bytes], bytes] = newline_frame,
    ) -> None:
        self._write = write
        self._frame = frame
        self.peer = peer
        self._next_id = 0
        self._pending: dict[int, tuple[str, Deferred[Any]]] = {}
        #: ids of the peer's requests we have not answered yet.
        self.held: set[Any] = set()
        self.closed: Failure | None = None

    # -- sending ---------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        if self.closed is not None:
            return
        self._write(self._frame(encode(message)))

    def request(self, method: str, params: Any) -> Deferred[Any]:
        """Send a request; the Deferred fires with its result or fails with :class:`RpcError`."""
        d: Deferred[Any] = Deferred()
        if self.closed is not None:
            d.errback(self.closed)
            return d
        request_id = self._next_id
        self._next_id += 1
        self._pending[request_id] = (method, d)
        self._send(request(request_id, method, params))
        return d

    @property
    def last_request_id(self) -> int:
        """The id of the request sent last (to cancel it by)."""
        return self._next_id - 1

    def forget(self, request_id: int) -> None:
        """
        Stop waiting for ``request_id``'s answer (a caller that gave up on
        it); its Deferred is left as it is, and a late answer is garbage.
        """
        self._pending.pop(request_id, None)

    def notify(self, method: str, params: Any) -> None:
        """Send a notification."""
        self._send(notification(method, params))

    def respond(self, request_id: Any, value: Any) -> None:
        """Answer one of the peer's requests."""
        if request_id not in self.held:
            return
        self.held.discard(request_id)
        self._send(result(request_id, value))

    def respond_error(self, request_id: Any, failure: RpcError) -> None:
        """Answer one of the peer's requests with an error."""
        if request_id not in self.held:
            return
        self.held.discard(request_id)
        self._send(error(request_id, failure.code, failure.message, failure.data))

    # -- receiving -------------------------------------------------------

    def message_received(self, line: bytes) -> None:
        """
        One framed message from the peer (a line, or a frame's body).

        Whatever the message holds, it is handled, answered or recorded as
        garbage, and the next one is read: a handler that fails on it is
        logged and the message recorded, never the end of the reading.
        """
        try:
            self._dispatch(line)
        except Exception as e:
            log.failure("a message from the peer could not be handled")
            try:
                self.peer.handle_garbage(
                    line, f"could not be handled ({type(e).__name__})", None
                )
            except Exception:
                log.failure("recording an unhandled message")

    def _dispatch(self, line: bytes) -> None:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            self.peer.handle_garbage(line, "not UTF-8", None)
            return
        try:
            message = json.loads(text)
        except (ValueError, RecursionError):
            self.peer.handle_garbage(line, "not JSON", None)
            return
        if _SURROGATE_ESCAPE.search(line) is not None:
            message = without_lone_surrogates(message)
        if not isinstance(message, dict):
            self.peer.handle_garbage(line, "not a JSON-RPC object", message)
            return
        method = message.get("method")
        if "method" in message and "id" in message:
            # A request we cannot answer as asked: JSON-RPC's Invalid
            # Request, with its id when that is one it allows (else null).
            problem = None
            if not valid_id(message["id"]):
                problem = "invalid request id"
            elif not isinstance(method, str):
                problem = "the method must be a string"
            if problem is not None:
                self.peer.handle_garbage(line, problem, message)
                rid = message["id"] if valid_id(message["id"]) else None
                self._send(error(rid, INVALID_REQUEST, f"Invalid Request: {problem}"))
                return
        if isinstance(method, str):
            params = message.get("params")
            if "id" in message:
                self._incoming_request(message["id"], method, params, line)
            else:
                self.peer.handle_notification(method, params)
            return
        if "id" in message and ("result" in message or "error" in message):
            self._response(message, line)
            return
        self.peer.handle_garbage(line, "not a JSON-RPC message", message)

    def _incoming_request(
        self, request_id: Any, method: str, params: Any, line: bytes
    ) -> None:
        if request_id in self.held:
            # A reused id would make our two answers indistinguishable.
            self.peer.handle_garbage(line, "request id already in use", None)
            self._send(error(request_id, INVALID_REQUEST, "request id already in use"))
            return
        self.held.add(request_id)
        d = maybeDeferred(self.peer.handle_request, request_id, method, params)

        def answered(result: Any) -> None:
            self.respond(request_id, result)

        def failed(failure: Failure) -> None:
            if isinstance(failure.value, RpcError):
                self.respond_error(request_id, failure.value)
            else:
                self.respond_error(
                    request_id, RpcError(INTERNAL_ERROR, "internal error")
                )

        d.addCallbacks(answered, failed)

    def _response(self, message: dict[str, Any], line: bytes) -> None:
        request_id = message.get("id")
        entry = self._pending.pop(request_id, None) if type(request_id) is int else None
        if entry is None:
            self.peer.handle_garbage(line, "response to no pending request", message)
            return
        _, d = entry
        error = message.get("error")
        if error is not None:
            if isinstance(error, dict):
                code = error.get("code")
                d.errback(
                    RpcError(
                        code if isinstance(code, int) else INTERNAL_ERROR,
                        str(error.get("message", "error")),
                        error.get("data"),
                    )
                )
            else:
                d.errback(RpcError(INTERNAL_ERROR, str(error)))
        else:
            d.callback(message.get("result"))

    def close(self, reason: Exception) -> None:
        """The peer is gone: every pending request fails with ``reason``."""
        if self.closed is not None:
            return
        self.closed = Failure(reason)
        pending, self._pending = self._pending, {}
        for _, d in pending.values():
            d.errback(Failure(reason))
        self.held.clear()
