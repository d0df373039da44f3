# -*- test-case-name: tests.lsp.test_connect,tests.preview.test_door -*-
"""
Connections admitted once that last as long as their client keeps them (a
language server's socket for an editor, a ``/v1`` Responses socket, the
preview door's spliced WebSocket), held here so that a policy reload can
ask each again (:func:`~sandboxd.access.gate.still_allowed`) and close
those it no longer lets in.  The terminal sockets and the HTTP door's
event streams keep their own tables and are asked the same way.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import attrs
from twisted.logger import Logger

from sandboxd.access.auth import Identity
from sandboxd.access.gate import still_allowed
from sandboxd.endpoints import Endpoint
from sandboxd.errors import ApiError

log = Logger(namespace="sandboxd.access.held")

#: WebSocket close code of a policy violation (RFC 6455 §7.4.1).
POLICY_VIOLATION = 1008
#: A close frame's reason fits in 123 bytes (125 less the code).
MAX_CLOSE_REASON_BYTES = 123


def close_frame(code: int, reason: str) -> bytes:
    """
    A server's WebSocket close frame (unmasked), the reason cut to fit
    and never inside a character.
    """
    cut = reason.encode("utf-8")[:MAX_CLOSE_REASON_BYTES]
    data = code.to_bytes(2, "big") + cut.decode("utf-8", "ignore").encode("utf-8")
    return bytes([0x88, len(data)]) + data


@attrs.define(eq=False)
class Held:
    """
    One long-lived connection: who opened it, to what, and how to end it.

    :ivar close: ends the connection, told why (an :class:`ApiError`).
    """

    identity: Identity
    endpoint: Endpoint
    close: Callable[[ApiError], None]
    #: Let in with no credential (a public preview): only the endpoint's
    #: being switched off ends it.
    public: bool = False
    #: A call's stream (a port door's: E2B, the agent-sandbox runtime),
    #: counted in ``sandboxd_streams_active``.
    stream: bool = False


_HELD: weakref.WeakKeyDictionary[Any, set[Held]] = weakref.WeakKeyDictionary()


def hold(
    context: Any,
    identity: Identity,
    endpoint: Endpoint,
    close: Callable[[ApiError], None],
    public: bool = False,
    stream: bool = False,
) -> Held:
    """Note a connection that outlives its request; :func:`release` it when it ends."""
    held = Held(identity, endpoint, close, public, stream)
    _HELD.setdefault(context, set()).add(held)
    return held


def release(context: Any, held: Held | None) -> None:
    """The connection ended (idempotent)."""
    if held is not None:
        _HELD.get(context, set()).discard(held)


def streams_held(context: Any) -> int:
    """How many of the connections held are calls' streams."""
    return sum(1 for held in _HELD.get(context, ()) if held.stream)


def end_revoked(context: Any) -> None:
    """
    After a policy reload: end every held connection whose identity is gone,
    no longer holds its endpoint's scopes, or whose endpoint is switched
    off; the others go on as the identity the policy now defines.
    """
    for held in list(_HELD.get(context, ())):
        current, error = still_allowed(context, held.identity, held.endpoint)
        if held.public and context.policy.rules[held.endpoint.id].enabled:
            continue
        if error is None and current is not None:
            held.identity = current
            continue
        assert error is not None
        release(context, held)
        log.info(
            "sandboxd: {endpoint} connection of {identity} closed: {why}",
            endpoint=held.endpoint.id,
            identity=held.identity.id,
            why=error.message,
        )
        held.close(error)


__all__ = [
    "MAX_CLOSE_REASON_BYTES",
    "POLICY_VIOLATION",
    "Held",
    "close_frame",
    "end_revoked",
    "hold",
    "release",
    "streams_held",
]
