# -*- test-case-name: tests.preview.test_channel -*-
"""
Bytes through the door leave in the call that wrote them, on both of its
sockets: the client's (a TCP server connection) and the app's (a TCP
client connection).

Twisted's TCP transport buffers a write, asks epoll to say when the socket
is writable, sends on the reactor's next turn and then asks epoll to stop
saying so: two ``epoll_ctl`` calls and a turn per write.  For a proxy that
is every request head to the app, every response to the client and, for a
spliced WebSocket, every frame each way: most of what the door added to a
small round trip.  When nothing is waiting in the transport's buffer, the
socket is tried first; only what it does not take goes through Twisted's
buffer (which then pauses a producer, reports errors and closes as
always).  :func:`sandboxd.web.sending.send_now` flushes a buffer already
written under the same conditions.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.tcp import Client, Server

#: The transports whose socket this module may write to directly.
_PLAIN_TCP = (Server, Client)


def write_now(transport: Any, data: bytes) -> None:
    """Write ``data`` to ``transport``: straight to the socket when that is safe."""
    if (
        data
        and type(transport) in _PLAIN_TCP
        and transport.connected
        and not transport.disconnecting
        and not transport._writeDisconnecting
        and not transport.dataBuffer
        and not transport._tempDataLen
        and not transport.producerPaused
    ):
        try:
            sent = transport.socket.send(data)
        except OSError:
            sent = 0  # full, or broken: Twisted's own write sees to it
        if sent == len(data):
            return
        data = data[sent:]
    transport.write(data)
