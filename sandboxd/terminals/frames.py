# -*- test-case-name: tests.terminals.test_frames -*-
"""
The two WebSocket frames a keystroke's round trip is made of, read and
written directly (RFC 6455 §5.2).

A keystroke arrives as one small masked text frame and its echo leaves as
one small unmasked text frame.  autobahn handles both through a dozen
calls each (frame state machine, per-frame masker object, a pure-Python
UTF-8 validator, logging calls whose arguments are built whether or not
anything logs), which is most of the daemon's work per keystroke.  These
functions cover only the plain case, byte for byte as autobahn would;
anything else (a fragment, a control frame, a reserved bit, a length over
a limit, an unmasked client frame, a frame split across reads) answers
None and goes through autobahn, which enforces the rules as before.
"""

from __future__ import annotations

#: FIN with the text opcode, no reserved bits: a whole text message.
_FINAL_TEXT = 0x81
#: The mask bit of the second byte.
_MASKED = 0x80
#: The 7-bit length values that announce a 16-bit length, a 64-bit one.
_LEN16 = 126
_LEN64 = 127


def client_text_payload(data: bytes, limit: int = 0) -> bytes | None:
    """
    The unmasked payload when ``data`` is exactly one whole client text
    message in one frame (final, masked, no reserved bits, at most
    ``limit`` bytes when ``limit`` is set, valid UTF-8), else None.

    A 64-bit length is never this case: a keystroke or a paste that big
    is not latency-bound, and autobahn's path checks it.
    """
    size = len(data)
    if size < 6 or data[0] != _FINAL_TEXT or not data[1] & _MASKED:
        return None
    length = data[1] & 0x7F
    start = 6
    if length == _LEN16:
        length = int.from_bytes(data[2:4], "big")
        if length < _LEN16:
            return None  # not the minimal encoding: a protocol error
        start = 8
    elif length == _LEN64:
        return None
    if size != start + length or (limit and length > limit):
        return None
    mask = data[start - 4 : start]
    payload = (
        int.from_bytes(data[start:], "big")
        ^ int.from_bytes((mask * (length // 4 + 1))[:length], "big")
    ).to_bytes(length, "big")
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return None  # autobahn fails the connection with 1007
    return payload


def server_text_frame(payload: bytes) -> bytes:
    """One final, unmasked text frame carrying ``payload``."""
    length = len(payload)
    if length < _LEN16:
        head = bytes((_FINAL_TEXT, length))
    elif length <= 0xFFFF:
        head = bytes((_FINAL_TEXT, _LEN16)) + length.to_bytes(2, "big")
    else:
        head = bytes((_FINAL_TEXT, _LEN64)) + length.to_bytes(8, "big")
    return head + payload


__all__ = ["client_text_payload", "server_text_frame"]
