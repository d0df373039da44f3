# -*- test-case-name: tests.preview.test_channel -*-
"""
The request heads the preview door reads itself: one pass over the bytes
up to the blank line, for the common case only.

The door's own channel (:mod:`sandboxd.preview.channel`) answers the
requests most of a preview's traffic is made of (page loads, assets,
event streams: no body, no upgrade) without Twisted's ``HTTPChannel`` and
``Request``, which were most of the door's time for a small request.  This
parser therefore only has to say yes to a plain head; anything it is not
sure of (a body, an upgrade, HTTP/1.0, an obs-folded line, a bare LF, a
name that is not a token, too many headers) is ``None``, and the channel
hands the connection to Twisted's parser, which answers or refuses it as
the door always did.
"""

from __future__ import annotations

import re

from sandboxd.policy.defaults import MAX_HEADERS

#: A method: upper-case letters (RFC 9110 §9 registers no other shape).
_METHOD = re.compile(rb"[A-Z]{1,20}\Z")

#: A header name: an RFC 9110 §5.6.2 token.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")

#: What a request target or a header value must not hold: controls but tab.
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")

#: Headers that mean the request is not the plain kind (see the module).
_NOT_PLAIN = frozenset({b"transfer-encoding", b"upgrade", b"expect"})


class RequestHead:
    """
    A plain request head: method, target, and headers in the client's order.

    :ivar fields: ``lower name -> (name as sent, [values])``.
    :ivar close: the client asked to close after this request.
    """

    __slots__ = ("close", "fields", "method", "target")

    def __init__(
        self,
        method: bytes,
        target: bytes,
        fields: dict[bytes, tuple[bytes, list[bytes]]],
        close: bool,
    ) -> None:
        self.method = method
        self.target = target
        self.fields = fields
        self.close = close


def parse_plain_head(raw: bytes) -> RequestHead | None:
    """
    The head of a plain HTTP/1.1 request without a body, from the bytes
    before its blank line; ``None`` for anything else (see the module).
    """
    lines = raw.split(b"\r\n")
    if len(lines) - 1 > MAX_HEADERS or b"\n" in raw.replace(b"\r\n", b""):
        return None
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1":
        return None
    method, target = parts[0], parts[1]
    if _METHOD.match(method) is None or not target or _CONTROL.search(target):
        return None
    fields: dict[bytes, tuple[bytes, list[bytes]]] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.match(name) is None:
            return None  # also an obs-folded line (it starts with a space)
        value = value.strip(b" \t")
        if _CONTROL.search(value):
            return None
        key = name.lower()
        entry = fields.get(key)
        if entry is None:
            fields[key] = (name, [value])
        else:
            entry[1].append(value)
    if not _plain(fields):
        return None
    connection = fields.get(b"connection")
    close = connection is not None and any(
        token.strip().lower() == b"close"
        for value in connection[1]
        for token in value.split(b",")
    )
    return RequestHead(method, target, fields, close)


def _plain(fields: dict[bytes, tuple[bytes, list[bytes]]]) -> bool:
    """No body (at most ``Content-Length: 0``), no upgrade, no expectation."""
    if not _NOT_PLAIN.isdisjoint(fields):
        return False
    length = fields.get(b"content-length")
    return length is None or length[1] == [b"0"]
