# -*- test-case-name: tests.web.test_delivery -*-
"""
How much of what the daemon sent a client that client has taken.

A client that reads slowly and one that reads nothing look the same from
the daemon's own buffers for a long time: the kernel's send queue takes
megabytes before the transport's buffer grows, and a paused response
stays paused either way.  The kernel knows: TCP counts the bytes the
peer acknowledged (``tcpi_bytes_acked``, Linux 4.1 and later), and
``SIOCOUTQ`` says how many bytes still wait in the socket's send queue.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
from typing import Any

import attrs

#: Where ``tcpi_bytes_acked`` (an unsigned 64-bit count) sits in Linux's
#: ``struct tcp_info``, and how much of the struct to ask for.
_BYTES_ACKED_OFFSET = 120
_TCP_INFO_BYTES = 128


@attrs.frozen
class Delivery:
    """
    One look at a connection's outgoing bytes.

    :ivar taken: bytes the client has acknowledged since the connection
        began, or None where the kernel does not say (not TCP, an old
        kernel).
    :ivar waiting: bytes written towards the client that it has not taken
        yet: the transport's buffer and the socket's send queue.
    """

    taken: int | None
    waiting: int


def descriptor(transport: Any) -> Any:
    """
    The file descriptor object under ``transport`` (a TLS transport wraps
    the TCP one), or None.
    """
    for _ in range(4):
        if transport is None:
            return None
        if getattr(transport, "socket", None) is not None:
            return transport
        transport = getattr(transport, "transport", None)
    return None


def delivery(transport: Any) -> Delivery | None:
    """What the client of ``transport`` has taken so far, or None when unknown."""
    fd_object = descriptor(transport)
    if fd_object is None:
        return None
    sock = fd_object.socket
    buffered = (
        len(getattr(fd_object, "dataBuffer", b""))
        - getattr(fd_object, "offset", 0)
        + getattr(fd_object, "_tempDataLen", 0)
    )
    try:
        fileno = sock.fileno()
    except OSError:
        return None
    if fileno < 0:
        return None
    queued = 0
    try:
        raw = fcntl.ioctl(fileno, termios.TIOCOUTQ, b"\0\0\0\0")
        queued = struct.unpack("i", raw)[0]
    except OSError:
        pass
    taken: int | None = None
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
        except OSError:
            info = b""
        if len(info) >= _BYTES_ACKED_OFFSET + 8:
            taken = struct.unpack_from("Q", info, _BYTES_ACKED_OFFSET)[0]
    return Delivery(taken, max(buffered, 0) + queued)


def stalled(before: Delivery | None, now: Delivery | None) -> bool:
    """
    Whether a client took nothing between two looks although bytes waited
    for it at both: its acknowledged count did not move, or (where the
    kernel does not count) what waits for it did not shrink.
    """
    if before is None or now is None or not before.waiting or not now.waiting:
        return False
    if before.taken is not None and now.taken is not None:
        return now.taken == before.taken
    return now.waiting >= before.waiting


def untouched(before: Delivery | None, now: Delivery | None) -> bool:
    """
    Whether a client took no byte at all between two looks: nothing was
    sent to it (its answer is silent) or it read nothing.  Unknown counts
    (not TCP) say no.
    """
    return (
        before is not None
        and now is not None
        and before.taken is not None
        and before.taken == now.taken
    )
