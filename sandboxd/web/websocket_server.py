# -*- test-case-name: tests.web.test_websocket_server,tests.terminals.test_websocket -*-
"""
autobahn's WebSocket server classes, imported the way the daemon wants them.

Both WebSocket doors (the terminal socket and the ``/v1`` Responses socket)
take their autobahn classes from here, so the import is decided once.

autobahn's native helpers (NVX) parse their C declarations with pycparser
when imported: about 1.3 MB of idle RSS, spent to speed up unmasking and
UTF-8 checks of client frames, which for a terminal are keystrokes.  Unless
the operator says otherwise (``AUTOBAHN_USE_NVX``), the pure-Python helpers
are used.  The variable is set only for the import, so children never see it.
"""

from __future__ import annotations

import os

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

__all__ = ["ConnectionDeny", "WebSocketServerFactory", "WebSocketServerProtocol"]
