# -*- test-case-name: tests.web.test_sending -*-
"""
Bytes that leave now: a finished response or a terminal's frame is sent
in the call that wrote it, not on the reactor's next turn; and the bytes
of a whole JSON response for a connection Twisted no longer serves.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from twisted.internet import unix
from twisted.internet.tcp import Client, Server

__all__ = [
    "raw_json_response",
    "send_now",
    "write_chunk_now",
    "write_head_and_body_now",
    "write_now",
]

#: The transports whose socket :func:`write_now` may write to directly:
#: the daemon's accepted connections and the preview door's connections
#: to the apps.
_PLAIN_TCP = (Server, Client)

#: The accepted connections whose buffered bytes :func:`send_now` sends:
#: TCP's and a unix socket's (Twisted's unix transport is its TCP one with
#: descriptor passing added).
_ACCEPTED = (Server, unix.Server)


def send_now(transport: Any) -> None:
    """
    Send a finished response now rather than on the reactor's next turn.

    Twisted's TCP transport only buffers a write and asks the reactor to
    say when the socket is writable: one more ``epoll_wait`` and a whole
    reactor turn before the first byte of every response leaves, which is
    a visible share of a call at concurrency 1.  A plain TCP or unix-socket
    connection that is not closing and whose producer (the HTTP channel
    itself, a streaming one) is not paused is written at once: then the
    flush can neither close the connection nor resume a producer under the
    caller, which are left to Twisted's own turn.  Whatever the socket does not
    take stays buffered and Twisted sends it as before; an error is left
    for the reactor, which sees the socket again.
    """
    if (
        type(transport) not in _ACCEPTED
        or not transport.connected
        or transport.disconnecting
        or transport._writeDisconnecting
        or (transport.producer is not None and not transport.streamingProducer)
        or transport.producerPaused
        or not (transport._tempDataLen or transport.dataBuffer)
    ):
        return
    transport.doWrite()


def write_now(transport: Any, data: bytes) -> None:
    """
    Write ``data`` to ``transport``, sending it on the socket at once when
    nothing is queued ahead of it.

    Twisted's ``write`` asks the reactor to watch the socket for
    writability and, once the bytes are out, to stop watching: two
    ``epoll_ctl`` calls around every response, beside the one ``send``
    that carries it.  A plain TCP connection that is open, not closing
    and has nothing buffered is sent to directly; what the socket does not
    take (a full buffer, an error) goes to the transport as before, so
    the order of bytes and Twisted's handling of a full buffer, a paused
    producer or a broken connection are unchanged.  The preview door
    writes through it on both of its sockets (the browser's and the
    app's): request heads, responses and every spliced WebSocket frame.
    """
    # _sends_directly's test, written out: this runs for every response
    # and every relayed piece, and the call was a visible share of one.
    if (
        data
        and type(transport) in _PLAIN_TCP
        and transport.connected
        and not transport.disconnecting
        and not transport._writeDisconnected
        and not transport._writeDisconnecting
        and not transport.producerPaused
        and not transport._tempDataLen
        and len(transport.dataBuffer) == transport.offset
    ):
        try:
            sent = transport.socket.send(data)
        except OSError:
            sent = 0  # Twisted's own write finds the error and closes.
        if sent == len(data):
            return
        data = data[sent:]
    transport.write(data)


def write_head_and_body_now(transport: Any, head: bytes, body: bytes) -> None:
    """
    Write a response's head then its (big) body, as :func:`write_now`
    would write them joined, without joining them.

    Joining a head to a body of megabytes copies the body once more only
    to put a few hundred bytes before it; one ``sendmsg`` sends both from
    where they are.  What the socket does not take goes to the transport
    in order, as :func:`write_now` leaves it.
    """
    if _sends_directly(transport):
        try:
            sent = transport.socket.sendmsg((head, body))
        except OSError:
            sent = 0  # Twisted's own write finds the error and closes.
        if sent >= len(head):
            if sent - len(head) < len(body):
                _queue_rest(transport, body, sent - len(head))
            return
        head = head[sent:]
    transport.write(head)
    transport.write(body)


#: How much of a big body Twisted sends per writable turn once it holds
#: the rest (its own default, 128 KiB, is one reactor turn per 128 KiB).
#: Twisted copies what is left of its buffer once that is under this
#: much, so it bounds that copy too.
BIG_SEND_BYTES = 1024 * 1024


def _queue_rest(transport: Any, body: bytes, offset: int) -> None:
    """
    Leave the rest of ``body``, from ``offset``, to the transport as Twisted
    holds what it is sending: the body itself and an offset into it, so
    the megabytes the socket did not take are not copied first (only the
    last :data:`BIG_SEND_BYTES`, by Twisted); and up to that much per send,
    so they leave in a few turns, not one per 128 KiB. Only called when
    nothing else was queued.
    """
    transport.SEND_LIMIT = max(transport.SEND_LIMIT, BIG_SEND_BYTES)
    transport.dataBuffer = body
    transport.offset = offset
    transport._maybePauseProducer()
    transport.startWriting()


#: The most parts :func:`write_chunk_now` sends in one ``sendmsg`` (Linux
#: takes 1024 buffers at most; two go to the chunk's framing).
MAX_CHUNK_PARTS = 1022


def write_chunk_now(request: Any, parts: list[bytes]) -> bool:
    """
    Write one piece of a streamed (chunked) body given in ``parts``, as
    ``request.write`` of them joined would, without joining them.

    An event stream's big event (a chunk of output, hundreds of KiB)
    comes in parts: its frame's head, the escaped text, its end. Joining
    them, then Twisted joining the chunk's length line and end to that,
    copies the text twice only to put a few bytes around it; one
    ``sendmsg`` sends the chunk from where its parts are, and only what
    the socket does not take is joined and queued, in order.  A small
    event (one part) saves the reactor's watching the socket and
    stopping again.  Anything but a started chunked response without a
    content encoder, on a connection that may be written to at once,
    goes through ``request.write`` as before.

    :return: whether the socket took the whole chunk in this call (then
        nothing of it waits in the transport for :func:`send_now`).
    """
    # One part (an event of a line or a few) is the usual write of a stream.
    size = len(parts[0]) if len(parts) == 1 else sum(map(len, parts))
    channel = getattr(request, "channel", None)
    transport = getattr(channel, "transport", None)
    if (
        not size
        or len(parts) > MAX_CHUNK_PARTS
        or not getattr(request, "chunked", False)
        or not getattr(request, "startedWriting", False)
        or getattr(request, "finished", True)
        or getattr(request, "_disconnected", True)
        or getattr(request, "_encoder", None) is not None
        or transport is None
        or not _sends_directly(transport)
    ):
        request.write(parts[0] if len(parts) == 1 else b"".join(parts))
        return False
    request.sentLength += size
    head = b"%x\r\n" % size
    chunk = [head, *parts, b"\r\n"]
    try:
        sent = transport.socket.sendmsg(chunk)
    except OSError:
        sent = 0  # Twisted's own write finds the error and closes.
    if sent == len(head) + size + 2:
        return True
    for i, part in enumerate(chunk):
        if sent < len(part):
            transport.write(b"".join((part[sent:], *chunk[i + 1 :])))
            return False
        sent -= len(part)
    return False


def _sends_directly(transport: Any) -> bool:
    """
    Whether bytes for ``transport`` may go to its socket at once (the
    same test is written out in :func:`write_now`: change both).
    """
    return bool(
        type(transport) in _PLAIN_TCP
        and transport.connected
        and not transport.disconnecting
        and not transport._writeDisconnected
        and not transport._writeDisconnecting
        and not transport.producerPaused
        and not transport._tempDataLen
        and len(transport.dataBuffer) == transport.offset
    )


def raw_json_response(
    status: int, body: Any, headers: Iterable[tuple[str, str]] = ()
) -> bytes:
    """
    A whole HTTP/1.1 response with a JSON body that closes the connection,
    for a connection Twisted's ``Request`` no longer serves: a WebSocket
    handshake refused by autobahn after the handler let it through.
    """
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    data = json.dumps(body, separators=(",", ":")).encode()
    head = f"HTTP/1.1 {status} {phrase}\r\n"
    for name, value in headers:
        head += f"{name}: {value}\r\n"
    head += (
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1", "replace") + data
