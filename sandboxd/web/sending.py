# -*- test-case-name: tests.web.test_sending -*-
"""
Bytes that leave now: a finished response or a terminal's frame is sent
in the call that wrote it, not on the reactor's next turn.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.tcp import Server

__all__ = ["send_now"]


def send_now(transport: Any) -> None:
    """
    Send a finished response now rather than on the reactor's next turn.

    Twisted's TCP transport only buffers a write and asks the reactor to
    say when the socket is writable: one more ``epoll_wait`` and a whole
    reactor turn before the first byte of every response leaves, which is
    a visible share of a call at concurrency 1.  A plain TCP connection
    that is not closing and whose producer (the HTTP channel itself, a
    streaming one) is not paused is written at once: then the flush can
    neither close the connection nor resume a producer under the caller,
    which are left to Twisted's own turn.  Whatever the socket does not
    take stays buffered and Twisted sends it as before; an error is left
    for the reactor, which sees the socket again.
    """
    if (
        type(transport) is not Server
        or not transport.connected
        or transport.disconnecting
        or transport._writeDisconnecting
        or (transport.producer is not None and not transport.streamingProducer)
        or transport.producerPaused
        or not (transport._tempDataLen or transport.dataBuffer)
    ):
        return
    transport.doWrite()
