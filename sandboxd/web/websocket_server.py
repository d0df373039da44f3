# -*- test-case-name: tests.web.test_websocket_server,tests.terminals.test_websocket -*-
"""
autobahn's WebSocket server classes, imported the way the daemon wants them.

Every WebSocket the daemon serves (the terminal socket, the ``/v1``
Responses socket, the language server socket for editors) takes its
autobahn classes from here, so the import is decided once; so do the
upgrade handlers' handshake checks and the replay of an admitted request's
head to the protocol that takes its connection over.

autobahn's native helpers (NVX) parse their C declarations with pycparser
when imported: about 1.3 MB of idle RSS, spent to speed up unmasking and
UTF-8 checks of client frames, which for a terminal are keystrokes.  Unless
the operator says otherwise (``AUTOBAHN_USE_NVX``), the pure-Python helpers
are used.  The variable is set only for the import, so children never see it.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import Any

_OPERATOR_CHOICE = os.environ.get("AUTOBAHN_USE_NVX")
if _OPERATOR_CHOICE is None:
    os.environ["AUTOBAHN_USE_NVX"] = "0"
try:
    from autobahn.twisted.websocket import (
        WebSocketServerFactory,
        WebSocketServerProtocol,
    )
    from autobahn.websocket.types import ConnectionDeny
finally:
    if _OPERATOR_CHOICE is None:
        del os.environ["AUTOBAHN_USE_NVX"]


def header_tokens(value: str) -> set[str]:
    """The comma-separated tokens of a header (``Connection: keep-alive, Upgrade``), lowercased."""
    return {t.strip().lower() for t in value.split(",")}


def asks_upgrade(headers: Any) -> bool:
    """Whether a request asks to become a WebSocket (``Upgrade: websocket``)."""
    return "websocket" in header_tokens(headers.get("upgrade", ""))


def valid_key(value: str) -> bool:
    """RFC 6455 §4.1: the key is 16 random bytes, base64-encoded."""
    try:
        return len(base64.b64decode(value.strip(), validate=True)) == 16
    except (binascii.Error, ValueError):
        return False


def valid_handshake(headers: Any) -> bool:
    """
    Whether an upgrade carries what RFC 6455 requires of it: ``Connection:
    Upgrade``, a ``Sec-WebSocket-Key`` and ``Sec-WebSocket-Version: 13``.
    A handler checks this before anything is started for the socket, so a
    broken client hears a 400 in the door's error body, not autobahn's.
    """
    return bool(
        "upgrade" in header_tokens(headers.get("connection", ""))
        and headers.get("sec-websocket-version", "").strip() == "13"
        and valid_key(headers.get("sec-websocket-key", ""))
    )


def request_head(raw: Any) -> bytes:
    """
    The head of an admitted upgrade request, as sent (method, target, every
    header), for :meth:`~sandboxd.web.channel.SandboxChannel.take_over` to
    replay to the WebSocket protocol, which reads the handshake from it.
    """
    lines = [b"GET " + raw.uri + b" HTTP/1.1"]
    for name, values in raw.requestHeaders.getAllRawHeaders():
        lines += [name + b": " + value for value in values]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def server_options(
    ping_seconds: float,
    ping_timeout_seconds: float,
    handshake_seconds: float,
    close_seconds: float,
) -> dict[str, Any]:
    """
    autobahn's options for a socket upgraded from the API port: keep-alive
    pings, handshake and close timeouts, RFC 6455 only, no status page, and
    a ``null`` Origin let through (the gate has already decided Origin).
    """
    return {
        "autoPingInterval": ping_seconds,
        "autoPingTimeout": ping_timeout_seconds,
        "openHandshakeTimeout": handshake_seconds,
        "closeHandshakeTimeout": close_seconds,
        "failByDrop": False,
        "versions": [13],
        "webStatus": False,
        "allowNullOrigin": True,
        "tcpNoDelay": True,
    }


__all__ = [
    "ConnectionDeny",
    "WebSocketServerFactory",
    "WebSocketServerProtocol",
    "asks_upgrade",
    "header_tokens",
    "request_head",
    "server_options",
    "valid_handshake",
    "valid_key",
]
