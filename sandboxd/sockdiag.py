# -*- test-case-name: tests.test_sockdiag -*-
"""
The kernel's TCP sockets asked for through ``sock_diag`` netlink, the
interface ``ss`` uses.

``/proc/net/tcp`` and ``tcp6`` are built by walking the kernel's whole
table of connections, every bucket of it, whatever the sockets in it: on
a machine with a lot of memory that table is large, and each file took
about 5 ms to read here with a few hundred sockets open, the IPv6 file
with one.  Through ``sock_diag`` the kernel walks only the listening
sockets for a listing of those, and finds one connection by its
addresses with a hash look-up: tens of microseconds either way.

Each function answers None where netlink or ``sock_diag`` is not there
(a kernel without it, a sandbox runtime that does not offer it), so that
the caller falls back to the ``/proc`` files.  Both see the sockets of
the caller's own network namespace.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 0x1
_NLM_F_DUMP = 0x300
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_HEADER = struct.Struct("=IHHII")
#: ``inet_diag_req_v2`` before its socket id: family, protocol, extensions,
#: padding, the states asked for.
_REQUEST = struct.Struct("=BBBBI")
#: ``inet_diag_sockid``: ports and addresses in network order, the
#: interface, and the cookie (none: the kernel checks no cookie).
_SOCKID = struct.Struct("!HH16s16sI")
_NO_COOKIE = struct.pack("=II", 0xFFFFFFFF, 0xFFFFFFFF)
#: ``inet_diag_msg``: family, state, timer, retransmits, then the socket
#: id (48 bytes), then expires, read queue, write queue, uid, inode.
_MSG_HEAD = struct.Struct("=BBBB")
_MSG_TAIL = struct.Struct("=IIIII")
_MSG_TAIL_AT = _MSG_HEAD.size + _SOCKID.size + len(_NO_COOKIE)

_TCP_LISTEN = 10
_ALL_STATES = 0xFFFFFFFF
_FAMILIES = ((socket.AF_INET, "tcp"), (socket.AF_INET6, "tcp6"))

#: How long one answer may take: the kernel answers at once, so this only
#: keeps a wedged netlink socket from holding the caller.
_TIMEOUT_SECONDS = 2.0


def _request(
    family: int,
    states: int,
    flags: int,
    source: tuple[bytes, int] = (b"", 0),
    destination: tuple[bytes, int] = (b"", 0),
) -> bytes:
    sockid = (
        _SOCKID.pack(
            source[1],
            destination[1],
            source[0].ljust(16, b"\0"),
            destination[0].ljust(16, b"\0"),
            0,
        )
        + _NO_COOKIE
    )
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, states) + sockid
    return (
        _HEADER.pack(_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, flags, 1, 0) + body
    )


def _ask(message: bytes, dump: bool) -> list[bytes] | None:
    """
    The ``inet_diag_msg`` payloads the kernel answers ``message`` with;
    an empty list for a socket not found, None when netlink or
    ``sock_diag`` is not available.
    """
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return None
    try:
        sock.settimeout(_TIMEOUT_SECONDS)
        sock.sendto(message, (0, 0))
        found: list[bytes] = []
        while True:
            data = sock.recv(65536)
            at = 0
            while at + _HEADER.size <= len(data):
                length, kind, _, _, _ = _HEADER.unpack_from(data, at)
                if length < _HEADER.size:
                    return None
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", data, at + _HEADER.size)
                    if code == 0 or -code == errno.ENOENT:
                        return found
                    return None
                found.append(data[at + _HEADER.size : at + length])
                at += (length + 3) & ~3
            if not dump:
                return found
    except OSError:
        return None
    finally:
        sock.close()


def listening() -> list[tuple[str, str, int, int]] | None:
    """
    Every listening TCP socket, IPv4 and IPv6: ``(protocol, address, port,
    inode)`` with ``protocol`` ``"tcp"`` or ``"tcp6"``, as
    ``/proc/net/tcp{,6}`` would list them; None when ``sock_diag`` cannot
    be asked.
    """
    found: list[tuple[str, str, int, int]] = []
    for family, protocol in _FAMILIES:
        answers = _ask(
            _request(family, 1 << _TCP_LISTEN, _NLM_F_REQUEST | _NLM_F_DUMP), True
        )
        if answers is None:
            return None
        size = 4 if family == socket.AF_INET else 16
        for answer in answers:
            if len(answer) < _MSG_TAIL_AT + _MSG_TAIL.size:
                continue
            port, _, source, _, _ = _SOCKID.unpack_from(answer, _MSG_HEAD.size)
            inode = _MSG_TAIL.unpack_from(answer, _MSG_TAIL_AT)[4]
            address = socket.inet_ntop(family, source[:size])
            found.append((protocol, address, port, inode))
    return found


def connection_uid(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """
    The uid owning the TCP socket bound to ``local`` and connected to
    ``remote`` (addresses as text, of one family); -1 when no such socket
    exists, None when ``sock_diag`` cannot be asked.
    """
    family = socket.AF_INET6 if ":" in local[0] else socket.AF_INET
    try:
        source = socket.inet_pton(family, local[0])
        destination = socket.inet_pton(family, remote[0])
    except (OSError, ValueError):
        return -1
    message = _request(
        family,
        _ALL_STATES,
        _NLM_F_REQUEST,
        (source, local[1]),
        (destination, remote[1]),
    )
    answers = _ask(message, False)
    if answers is None:
        return None
    for answer in answers:
        if len(answer) >= _MSG_TAIL_AT + _MSG_TAIL.size:
            uid: int = _MSG_TAIL.unpack_from(answer, _MSG_TAIL_AT)[3]
            return uid
    return -1


def same_namespace(pid: int, proc: str = "/proc") -> bool:
    """Whether process ``pid`` shares this process's network namespace."""
    try:
        theirs = os.stat(os.path.join(proc, str(pid), "ns", "net"))
        ours = os.stat(os.path.join(proc, "self", "ns", "net"))
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)
