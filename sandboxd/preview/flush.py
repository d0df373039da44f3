# -*- test-case-name: tests.preview.test_channel -*-
"""
Bytes through the door leave in the call that wrote them, on both of its
sockets: the client's (a TCP server connection) and the app's (a TCP
client connection).

Twisted's TCP transport buffers a write and sends it on the reactor's next
turn; for a proxy that is two extra turns per request (the request head to
the app, the response to the client) and, for a spliced WebSocket, one
more turn per frame each way, which is most of what the door added to a
small round trip.  :func:`sandboxd.web.sending.send_now` does this for
server connections under conditions that keep Twisted's own bookkeeping
intact; the same conditions hold for the app's side, which it does not
accept.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.tcp import Client

from sandboxd.web.sending import send_now


def flush(transport: Any) -> None:
    """Send what ``transport`` has buffered now, when that is safe (see the module)."""
    if type(transport) is not Client:
        send_now(transport)
        return
    if (
        not transport.connected
        or transport.disconnecting
        or transport._writeDisconnecting
        or (transport.producer is not None and not transport.streamingProducer)
        or transport.producerPaused
        or not (transport._tempDataLen or transport.dataBuffer)
    ):
        return
    transport.doWrite()
