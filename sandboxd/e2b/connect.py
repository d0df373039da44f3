# -*- test-case-name: tests.e2b.test_connect -*-
"""
Connect RPC framing, JSON codec only, as the E2B SDKs speak it to envd.

Unary calls are a JSON body answered by a JSON body (or a JSON error with
the HTTP status of its Connect code); server and client streams are
``application/connect+json``: every message is an envelope of one flags
byte and a 4-byte big-endian length, and the last envelope of a response
(flag ``0x02``) is the end-of-stream message, which carries the error if
the call failed.  Field names follow protobuf's JSON mapping (lowerCamelCase
on the wire; either spelling accepted on the way in), ``bytes`` fields are
base64.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import struct
from typing import Any

from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    malformed_request,
    payload_too_large,
)
from sandboxd.web.jsonbody import parse_object

STREAM_CONTENT_TYPE = "application/connect+json"
UNARY_CONTENT_TYPE = "application/json"

#: Envelope flags (connect protocol).
FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02

_HEADER = struct.Struct(">BI")


class ConnectCode(enum.StrEnum):
    """Connect's error codes (the subset a door can answer)."""

    CANCELED = "canceled"
    UNKNOWN = "unknown"
    INVALID_ARGUMENT = "invalid_argument"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    NOT_FOUND = "not_found"
    ALREADY_EXISTS = "already_exists"
    PERMISSION_DENIED = "permission_denied"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    FAILED_PRECONDITION = "failed_precondition"
    ABORTED = "aborted"
    UNIMPLEMENTED = "unimplemented"
    INTERNAL = "internal"
    UNAVAILABLE = "unavailable"
    DATA_LOSS = "data_loss"
    UNAUTHENTICATED = "unauthenticated"


#: The HTTP status of a unary error, per the Connect protocol.
HTTP_STATUS = {
    ConnectCode.CANCELED: 499,
    ConnectCode.UNKNOWN: 500,
    ConnectCode.INVALID_ARGUMENT: 400,
    ConnectCode.DEADLINE_EXCEEDED: 504,
    ConnectCode.NOT_FOUND: 404,
    ConnectCode.ALREADY_EXISTS: 409,
    ConnectCode.PERMISSION_DENIED: 403,
    ConnectCode.RESOURCE_EXHAUSTED: 429,
    ConnectCode.FAILED_PRECONDITION: 400,
    ConnectCode.ABORTED: 409,
    ConnectCode.UNIMPLEMENTED: 501,
    ConnectCode.INTERNAL: 500,
    ConnectCode.UNAVAILABLE: 503,
    ConnectCode.DATA_LOSS: 500,
    ConnectCode.UNAUTHENTICATED: 401,
}


class DataLoss(ApiError):
    """
    An error that says what a client was owed is gone (events a watcher
    was not polled for in time): Connect's ``data_loss``, which the E2B
    SDKs raise as a plain ``SandboxException`` naming it, so it is neither
    retried as a rate limit nor taken for a bad argument.
    """


#: SPEC §6 codes whose nearest Connect code is not their status's.
_BY_CODE = {
    Code.ENDPOINT_DISABLED: ConnectCode.UNIMPLEMENTED,
    Code.FILE_EXISTS: ConnectCode.ALREADY_EXISTS,
    Code.PRECONDITION_FAILED: ConnectCode.FAILED_PRECONDITION,
    Code.TIMEOUT: ConnectCode.DEADLINE_EXCEEDED,
    Code.IDLE_TIMEOUT: ConnectCode.DEADLINE_EXCEEDED,
    # Too big is final: as resource_exhausted the E2B SDK raises
    # RateLimitException, "please try again later", and a retry of the
    # same payload can never pass.
    Code.PAYLOAD_TOO_LARGE: ConnectCode.INVALID_ARGUMENT,
}

_BY_STATUS = {
    400: ConnectCode.INVALID_ARGUMENT,
    401: ConnectCode.UNAUTHENTICATED,
    403: ConnectCode.PERMISSION_DENIED,
    404: ConnectCode.NOT_FOUND,
    408: ConnectCode.DEADLINE_EXCEEDED,
    409: ConnectCode.ABORTED,
    412: ConnectCode.FAILED_PRECONDITION,
    413: ConnectCode.INVALID_ARGUMENT,
    415: ConnectCode.INVALID_ARGUMENT,
    416: ConnectCode.INVALID_ARGUMENT,
    429: ConnectCode.RESOURCE_EXHAUSTED,
    501: ConnectCode.UNIMPLEMENTED,
    502: ConnectCode.UNAVAILABLE,
    503: ConnectCode.UNAVAILABLE,
    504: ConnectCode.DEADLINE_EXCEEDED,
    507: ConnectCode.RESOURCE_EXHAUSTED,
}


def connect_code(error: ApiError) -> ConnectCode:
    """
    The Connect code nearest to an error's SPEC §6 code and status.

    A 503 for want of room right now (type ``ResourceError``: processes,
    threads, descriptors, inotify watches) is ``resource_exhausted``, as
    gRPC defines it: as ``unavailable`` the E2B SDK took it for a sandbox
    it could not reach, "it may have been killed", and an agent would
    throw away a sandbox that only needed a moment.
    """
    if isinstance(error, DataLoss):
        return ConnectCode.DATA_LOSS
    if error.code is not None and error.code in _BY_CODE:
        return _BY_CODE[error.code]
    if error.status == 503 and error.type == "ResourceError":
        return ConnectCode.RESOURCE_EXHAUSTED
    return _BY_STATUS.get(error.status, ConnectCode.INTERNAL)


def error_message(error: ApiError) -> str:
    """The error's message with its SPEC §6 code and rule, for a Connect client."""
    parts = []
    if error.code is not None:
        parts.append(f"code: {error.code}")
    if error.rule:
        parts.append(f"rule: {error.rule}")
    return f"{error.message} ({', '.join(parts)})" if parts else error.message


def error_json(error: ApiError) -> dict[str, Any]:
    """The Connect error object: ``{"code", "message"}``."""
    return {"code": str(connect_code(error)), "message": error_message(error)}


# -- envelopes ----------------------------------------------------------------


def envelope(message: Any, flags: int = 0) -> bytes:
    """One enveloped JSON message."""
    data = _COMPACT.encode(message).encode()
    return _HEADER.pack(flags, len(data)) + data


#: A non-finite number raises ValueError rather than becoming ``NaN``.
_COMPACT = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def end_stream(error: ApiError | None = None) -> bytes:
    """The end-of-stream envelope, carrying ``error`` if the call failed."""
    return envelope({"error": error_json(error)} if error is not None else {}, 2)


def malformed(message: str) -> ApiError:
    """400 ``malformed_request`` for framing the door cannot read."""
    return malformed_request(message)


def split_envelopes(data: bytes, max_message: int) -> list[Any]:
    """
    The JSON messages of an enveloped request body, in order.

    :raises ApiError: 400 ``malformed_request`` for a short or compressed
        envelope or a message that is not JSON; 413 for one over
        ``max_message`` bytes.
    """
    out: list[Any] = []
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        if len(view) - offset < _HEADER.size:
            raise malformed("a truncated Connect envelope")
        flags, length = _HEADER.unpack_from(view, offset)
        offset += _HEADER.size
        if flags & FLAG_COMPRESSED:
            raise malformed("compressed Connect messages are not accepted")
        if length > max_message:
            raise payload_too_large(max_message, f"a Connect message of {length} bytes")
        if len(view) - offset < length:
            raise malformed("a truncated Connect envelope")
        chunk = bytes(view[offset : offset + length])
        offset += length
        if flags & FLAG_END_STREAM:
            break
        out.append(decode_json(chunk))
    return out


def next_envelope(buffer: bytearray, max_message: int) -> tuple[int, Any] | None:
    """
    Take the first whole envelope off the front of ``buffer`` (a stream's
    body as it arrives): ``(flags, message)``, the end-of-stream message
    as ``{}``; None while it is not whole.

    :raises ApiError: as :func:`split_envelopes`, as soon as the envelope's
        header says so (a message over ``max_message`` is not waited for).
    """
    if len(buffer) < _HEADER.size:
        return None
    flags, length = _HEADER.unpack_from(buffer, 0)
    if flags & FLAG_COMPRESSED:
        raise malformed("compressed Connect messages are not accepted")
    if length > max_message:
        raise payload_too_large(max_message, f"a Connect message of {length} bytes")
    end = _HEADER.size + length
    if len(buffer) < end:
        return None
    chunk = bytes(buffer[_HEADER.size : end])
    del buffer[:end]
    if flags & FLAG_END_STREAM:
        return flags, {}
    return flags, decode_json(chunk)


def decode_json(data: bytes) -> dict[str, Any]:
    """
    One JSON message (empty means ``{}``), read as strictly as the HTTP
    door reads a body: UTF-8 only, no repeated key, no lone surrogate, no
    ``NaN`` or overflowing number, no nesting past the parser's depth.

    :raises ApiError: 400 ``invalid_json``.
    """
    return parse_object(data)


# -- protobuf's JSON mapping --------------------------------------------------


def camel(name: str) -> str:
    """``exit_code`` → ``exitCode``."""
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def field(message: Any, name: str, default: Any = None) -> Any:
    """A field by its proto name, in either JSON spelling."""
    if not isinstance(message, dict):
        return default
    for key in (camel(name), name):
        if key in message and message[key] is not None:
            return message[key]
    return default


def bad_field(name: str, what: str) -> ApiError:
    """400 ``invalid_param`` naming the field."""
    return bad_request(f"'{camel(name)}' must be {what}")


def string_field(message: Any, name: str, default: str | None = None) -> str | None:
    """A ``string`` field, or ``default`` when absent."""
    value = field(message, name)
    if value is None:
        return default
    if not isinstance(value, str):
        raise bad_field(name, "a string")
    return value


#: The most digits a ``uint32`` has in decimal.
_UINT32_DIGITS = 10


def uint_field(message: Any, name: str, default: int | None = None) -> int | None:
    """A ``uint32`` field (JSON number, or a string of ASCII decimal digits)."""
    value = field(message, name)
    if value is None:
        return default
    if isinstance(value, str):
        # str.isdigit() takes "²" and other digits int() refuses, and a
        # long string costs int() quadratic time: only short ASCII digits.
        if not (value.isascii() and value.isdigit()) or len(value) > _UINT32_DIGITS:
            raise bad_field(name, "a 32-bit unsigned integer")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_field(name, "a non-negative integer")
    if value > 0xFFFFFFFF:
        raise bad_field(name, "a 32-bit unsigned integer")
    return value


def bool_field(message: Any, name: str, default: bool = False) -> bool:
    """A ``bool`` field."""
    value = field(message, name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_field(name, "true or false")
    return value


def bytes_field(message: Any, name: str) -> bytes | None:
    """A ``bytes`` field (base64, standard or URL-safe, padded or not)."""
    value = field(message, name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_field(name, "base64 text")
    text = value.strip().replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad_field(name, "base64 text") from None


def b64(data: bytes) -> str:
    """A ``bytes`` field's JSON value."""
    return base64.b64encode(data).decode("ascii")


def oneof(message: Any, names: tuple[str, ...]) -> tuple[str, Any] | None:
    """The set member of a ``oneof``: ``(proto name, value)``, or None."""
    found = [(n, field(message, n)) for n in names if field(message, n) is not None]
    if len(found) > 1:
        raise bad_field(found[1][0], "alone (it shares a oneof with another field)")
    return found[0] if found else None
