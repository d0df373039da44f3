# -*- test-case-name: tests.web.test_ptysocket -*-
"""
The PTY WebSocket on the API port: ``GET /pty/sessions/{id}/ws``.

The web console is served by the API port, and a browser page may only
open a WebSocket to another port if that port's Origin check lets it; so
the terminal socket answers here as well, as the same endpoint
(``pty_connect``) through the same gate.  The request's connection is
handed to the PTY port's WebSocket protocol
(:meth:`sandboxd.web.channel.SandboxChannel.take_over`) with its head
rewritten to the PTY port's form (``/pty?session_id=ID&...``), and autobahn
reads the handshake from there: no thread, no second parser, one audit line
(``via: ws``) as for the PTY port.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from sandboxd.errors import unavailable

#: The API port's path of a terminal's socket.
PTY_SOCKET = re.compile(rb"^/pty/sessions/([^/?#]+)/ws/?$")


def session_of(raw_path: bytes) -> str | None:
    """The session id of a ``/pty/sessions/{id}/ws`` request path, else None."""
    m = PTY_SOCKET.match(raw_path.partition(b"?")[0])
    return m.group(1).decode("latin-1") if m else None


def rewritten_head(request: Any, raw_path: bytes, session_id: str) -> bytes:
    """
    The request's head as the PTY port would have received it: path
    ``/pty``, ``session_id`` from the path (any given in the query is
    dropped: the path says which), every header as sent.
    """
    _, _, query = raw_path.partition(b"?")
    pairs = [
        (k, v)
        for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True)
        if k != "session_id"
    ]
    target = "/pty?" + urlencode([("session_id", session_id), *pairs], quote_via=quote)
    lines = [f"GET {target} HTTP/1.1".encode("latin-1")]
    for name, values in request.requestHeaders.getAllRawHeaders():
        lines += [name + b": " + value for value in values]
    return b"\r\n".join(lines) + b"\r\n\r\n"


class PtySocketExchange:
    """One upgrade request for a terminal's socket, handed to the PTY protocol."""

    def __init__(self, request: Any, raw_path: bytes, session_id: str) -> None:
        self.request = request
        self.raw_path = raw_path
        self.session_id = session_id

    def write(self, data: bytes) -> None:
        """A GET carries no body; anything sent is ignored."""

    def process(self) -> None:
        """Hand the connection to a new PTY WebSocket protocol."""
        request = self.request
        channel = request.channel
        transport = channel.transport
        if transport is None:
            return
        terminals = request.context.terminals
        if terminals is None:
            request.respond_error(unavailable("terminals are not running"))
            return
        protocol = terminals.factory.buildProtocol(transport.getPeer())
        protocol.secure = request.isSecure()
        protocol.asked_path = self.raw_path.partition(b"?")[0].decode("latin-1")
        channel.take_over(
            protocol, replay=rewritten_head(request, self.raw_path, self.session_id)
        )


__all__ = ["PTY_SOCKET", "PtySocketExchange", "rewritten_head", "session_of"]
