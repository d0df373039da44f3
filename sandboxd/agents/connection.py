# -*- test-case-name: tests.agents.test_agents -*-
"""
Newline-delimited JSON-RPC 2.0 over a child's stdio (ACP's stdio transport).

Twisted's ``LineReceiver`` is no use here: 16 KiB lines and ``\\r\\n``
delimiters, while ACP lines hold whole files.  :class:`LineFramer` splits on
``\\n`` (a trailing ``\\r`` is dropped) with its own cap; a line over the cap
fails the connection instead of growing without bound or hanging.

:class:`Connection` keeps the table of our pending requests.  Each
direction has its own id space, so a message is a response exactly when it
has an ``id`` and no ``method``; everything is handled synchronously as the
line is read, so the order of events is the wire order.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.python.failure import Failure

from sandboxd import jsonrpc
from sandboxd.jsonrpc import INTERNAL_ERROR, INVALID_REQUEST, RpcError


class ConnectionLost(Exception):
    """The agent went away with our request unanswered."""


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
                self._on_line(line)

    def _overflow(self, size: int) -> None:
        self.stop()
        self._on_overflow(size)

    def stop(self) -> None:
        """Drop the buffer and ignore further input."""
        self.stopped = True
        self._buffer = bytearray()


class Peer(Protocol):
    """What a :class:`Connection` hands incoming traffic to."""

    def handle_request(self, request_id: Any, method: str, params: Any) -> Any:
        """A request from the agent: a result, a Deferred of one, or raise :class:`RpcError`."""

    def handle_notification(self, method: str, params: Any) -> None:
        """A notification from the agent."""

    def handle_garbage(self, line: bytes, reason: str, message: Any) -> None:
        """A line that is not a message we understand (recorded, not fatal)."""


class Connection:
    """
    One JSON-RPC peer over a writer function.

    :param write: sends bytes to the agent's stdin.
    :param peer: receives requests, notifications and garbage.
    """

    def __init__(self, write: Callable[[bytes], None], peer: Peer) -> None:
        self._write = write
        self.peer = peer
        self._next_id = 0
        self._pending: dict[int, tuple[str, Deferred[Any]]] = {}
        #: ids of the agent's requests we have not answered yet.
        self.held: set[Any] = set()
        self.closed: Failure | None = None

    # -- sending ---------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        if self.closed is not None:
            return
        data = (
            json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
            + b"\n"
        )
        self._write(data)

    def request(self, method: str, params: Any) -> Deferred[Any]:
        """Send a request; the Deferred fires with its result or fails with :class:`RpcError`."""
        d: Deferred[Any] = Deferred()
        if self.closed is not None:
            d.errback(self.closed)
            return d
        request_id = self._next_id
        self._next_id += 1
        self._pending[request_id] = (method, d)
        self._send(jsonrpc.request(request_id, method, params))
        return d

    def notify(self, method: str, params: Any) -> None:
        """Send a notification."""
        self._send(jsonrpc.notification(method, params))

    def respond(self, request_id: Any, result: Any) -> None:
        """Answer one of the agent's requests."""
        if request_id not in self.held:
            return
        self.held.discard(request_id)
        self._send(jsonrpc.result(request_id, result))

    def respond_error(self, request_id: Any, error: RpcError) -> None:
        """Answer one of the agent's requests with an error."""
        if request_id not in self.held:
            return
        self.held.discard(request_id)
        self._send(jsonrpc.error(request_id, error.code, error.message, error.data))

    # -- receiving -------------------------------------------------------

    def line_received(self, line: bytes) -> None:
        """One frame from the agent's stdout."""
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            self.peer.handle_garbage(line, "not UTF-8", None)
            return
        try:
            message = json.loads(text)
        except ValueError:
            self.peer.handle_garbage(line, "not JSON", None)
            return
        if not isinstance(message, dict):
            self.peer.handle_garbage(line, "not a JSON-RPC object", message)
            return
        method = message.get("method")
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
            self._send(
                jsonrpc.error(request_id, INVALID_REQUEST, "request id already in use")
            )
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
        entry = (
            self._pending.pop(request_id, None) if isinstance(request_id, int) else None
        )
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
        """The agent is gone: every pending request fails with ``reason``."""
        if self.closed is not None:
            return
        self.closed = Failure(reason)
        pending, self._pending = self._pending, {}
        for _, d in pending.values():
            d.errback(Failure(reason))
        self.held.clear()
