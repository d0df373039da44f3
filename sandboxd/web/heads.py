# -*- test-case-name: tests.web.test_heads -*-
"""
An HTTP/1.1 request head parsed in one pass from a bytes buffer.

Twisted's server parser splits a head line by line (``LineReceiver``),
calls a method per header and canonicalises every name through
``Headers``: most of the instructions a small request costs.  This module
reads a whole head at once, with the same rules the daemon enforced on
top of Twisted's parser, and nothing else: it is pure (no I/O, no
Twisted), so any door that reads raw HTTP/1.1 requests can use it.

The API, kept stable for its users:

- :func:`parse_head` ``(buffer, start=0, limits=LIMITS)`` returns a
  :class:`Head` when ``buffer[start:]`` begins with a complete head, None
  when more bytes are needed (and the bytes so far are within the limits),
  and raises :class:`HeadError` when the head is refused;
- :class:`Head` holds the request line, the header fields (lower-cased
  names to their values, in order), the body framing (``length``,
  ``chunked``), ``keep_alive``, ``expect_continue`` and ``size``, the
  bytes the head took (so the body starts at ``start + size``);
- :class:`HeadError` carries the ``status`` to answer (400) and a
  ``reason`` for the client;
- :class:`HeadLimits` and :data:`LIMITS`: the bounds (header count, head
  bytes), from :mod:`sandboxd.policy.defaults`.

What is refused (RFC 9112), each as a :class:`HeadError`:

- a request line that is not ``token SP target SP HTTP/1.x`` (a target of
  printable bytes, as Twisted accepted);
- a header line without a colon, a name that is not a token (whitespace
  before the colon included), a value holding NUL, a bare CR or a bare LF
  anywhere in the head;
- obs-fold (a line starting with a space or tab): a proxy in front may
  read a folded token, Host or length differently;
- a head over :data:`~sandboxd.policy.defaults.MAX_HEAD_BYTES` or with more
  than :data:`~sandboxd.policy.defaults.MAX_HEADERS` headers;
- ``Content-Length`` that is not plain ASCII digits, or given twice;
  ``Transfer-Encoding`` other than ``chunked`` (``identity`` is ignored),
  ``chunked`` twice, or ``chunked`` with a ``Content-Length`` (a smuggling
  shape).

One empty line before the request line is skipped (RFC 9112 §2.2; old
clients send one after a POST body).

A TLS handshake (its first byte, 0x16, can begin no request line) is
refused at its first byte rather than waited on for a head end that never
comes: a client given ``https://`` for a plain-HTTP port gets its TLS
error at once instead of after the head deadline.
"""

from __future__ import annotations

import re

import attrs

from sandboxd.policy.defaults import HEADER_NAME_CACHE, MAX_HEAD_BYTES, MAX_HEADERS

__all__ = ["LIMITS", "Head", "HeadError", "HeadLimits", "parse_head"]

#: RFC 9110 §5.6.2 ``token``: methods and header names.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: A request target: no controls, no space (the bytes Twisted accepted).
_TARGET = re.compile(rb"[\x21-\xb0]+")
_VERSIONS = frozenset({b"HTTP/1.1", b"HTTP/1.0"})
#: Methods known to be tokens, so not matched against :data:`_TOKEN` again.
_KNOWN_METHODS = frozenset(
    {b"GET", b"HEAD", b"POST", b"PUT", b"PATCH", b"DELETE", b"OPTIONS"}
)
#: The first byte of a TLS record carrying a handshake (a ClientHello).
_TLS_HANDSHAKE = b"\x16"
#: Digits past which a Content-Length is beyond every bound anyway.
_LENGTH_DIGITS = 30
_TOO_LONG = 10**_LENGTH_DIGITS

#: Header names already checked, to their lower-cased form (bounded).
_NAMES: dict[bytes, bytes] = {}


@attrs.frozen
class HeadLimits:
    """
    The bounds one head is read under.

    :ivar max_headers: header lines allowed.
    :ivar max_bytes: the request line and header lines together, line ends
        not counted.
    """

    max_headers: int = MAX_HEADERS
    max_bytes: int = MAX_HEAD_BYTES

    @property
    def max_buffered(self) -> int:
        """The most an incomplete head may take before it is refused."""
        return self.max_bytes + 2 * (self.max_headers + 3)


LIMITS = HeadLimits()


class HeadError(Exception):
    """
    A head the parser refuses; the connection cannot be read further.

    :ivar status: the HTTP status to answer with.
    :ivar reason: what was wrong, for the client.
    """

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@attrs.define
class Head:
    """
    One parsed request head (read, never changed: not frozen only because
    a frozen class's constructor costs four times as much, once per call).

    :ivar method: as sent (case kept: ``get`` is not ``GET``).
    :ivar target: the request target, raw.
    :ivar version: ``HTTP/1.1`` or ``HTTP/1.0``.
    :ivar fields: lower-cased header names to their values (stripped of
        surrounding spaces and tabs), in the order received.
    :ivar length: the body's length: Content-Length, 0 without one, None
        for a chunked body.
    :ivar chunked: whether the body is chunked.
    :ivar keep_alive: HTTP/1.1 without ``Connection: close``.
    :ivar expect_continue: HTTP/1.1 with ``Expect: 100-continue``.
    :ivar size: the bytes the head took, leading empty line and the blank
        line that ends it included.
    """

    method: bytes
    target: bytes
    version: bytes
    fields: dict[bytes, list[bytes]]
    length: int | None
    chunked: bool
    keep_alive: bool
    expect_continue: bool
    size: int


def parse_head(
    buffer: bytes, start: int = 0, limits: HeadLimits = LIMITS
) -> Head | None:
    """
    Parse the head at ``buffer[start:]``.

    :return: the head, or None when it is not complete yet.
    :raises HeadError: the head is refused (see the module docstring).
    """
    begin = start + 2 if buffer.startswith(b"\r\n", start) else start
    if buffer.startswith(_TLS_HANDSHAKE, begin):
        raise HeadError(
            "a TLS handshake: this port speaks plain HTTP (use http://, not https://)"
        )
    end = buffer.find(b"\r\n\r\n", begin)
    if end < 0:
        if len(buffer) - begin > limits.max_buffered:
            raise HeadError("the request head is too large")
        return None
    block = buffer[begin:end]
    line_ends = block.count(b"\r\n")
    if len(block) - 2 * line_ends > limits.max_bytes:
        raise HeadError("the request head is too large")
    if line_ends > limits.max_headers:
        raise HeadError("too many headers")
    if b"\x00" in block:
        raise HeadError("NUL in the request head")
    if block.count(b"\r") != line_ends or block.count(b"\n") != line_ends:
        raise HeadError("a bare CR or LF in the request head")
    lines = block.split(b"\r\n")
    method, target, version = _request_line(lines[0])
    fields = _fields(lines)
    length, chunked = _framing(fields)
    keep_alive = version == b"HTTP/1.1" and not _closes(fields.get(b"connection"))
    expect = fields.get(b"expect")
    return Head(
        method,
        target,
        version,
        fields,
        length,
        chunked,
        keep_alive,
        expect is not None
        and version == b"HTTP/1.1"
        and expect[0].lower() == b"100-continue",
        end + 4 - start,
    )


def _request_line(line: bytes) -> tuple[bytes, bytes, bytes]:
    """``method SP target SP version``, each part checked."""
    parts = line.split(b" ")
    if len(parts) != 3:
        raise HeadError("a malformed request line")
    method, target, version = parts
    if version not in _VERSIONS:
        raise HeadError("only HTTP/1.1 and HTTP/1.0 are served")
    if method not in _KNOWN_METHODS and _TOKEN.fullmatch(method) is None:
        raise HeadError("a malformed request method")
    if _TARGET.fullmatch(target) is None:
        raise HeadError("a malformed request target")
    return method, target, version


def _fields(lines: list[bytes]) -> dict[bytes, list[bytes]]:
    """The header lines after the request line, by lower-cased name."""
    fields: dict[bytes, list[bytes]] = {}
    names = _NAMES
    for index in range(1, len(lines)):
        line = lines[index]
        name, colon, value = line.partition(b":")
        if not colon:
            if line[:1] in (b" ", b"\t"):
                raise HeadError("obs-folded header lines are not accepted")
            raise HeadError("a header line without a colon")
        lower = names.get(name)
        if lower is None:
            if _TOKEN.fullmatch(name) is None:
                if line[:1] in (b" ", b"\t"):
                    raise HeadError("obs-folded header lines are not accepted")
                raise HeadError("a malformed header name")
            lower = name.lower()
            if len(names) < HEADER_NAME_CACHE:
                names[name] = lower
        value = value.strip(b" \t")
        values = fields.get(lower)
        if values is None:
            fields[lower] = [value]
        else:
            values.append(value)
    return fields


def _framing(fields: dict[bytes, list[bytes]]) -> tuple[int | None, bool]:
    """The body's ``(length, chunked)`` from Content-Length and Transfer-Encoding."""
    chunked = False
    codings = fields.get(b"transfer-encoding")
    if codings is not None:
        for coding in codings:
            lowered = coding.lower()
            if lowered == b"chunked" and not chunked:
                chunked = True
            elif lowered != b"identity":
                raise HeadError("an unsupported Transfer-Encoding")
    lengths = fields.get(b"content-length")
    if lengths is None:
        return (None, True) if chunked else (0, False)
    if chunked:
        raise HeadError("both Content-Length and Transfer-Encoding")
    if len(lengths) != 1:
        raise HeadError("more than one Content-Length")
    text = lengths[0]
    if not text.isdigit():
        raise HeadError("a malformed Content-Length")
    digits = text.lstrip(b"0")
    if len(digits) > _LENGTH_DIGITS:
        return _TOO_LONG, False
    return int(digits or b"0"), False


def _closes(connection: list[bytes] | None) -> bool:
    """Whether the ``Connection`` header lists ``close``."""
    if connection is None:
        return False
    for value in connection:
        for option in value.split(b","):
            if option.strip(b" \t").lower() == b"close":
                return True
    return False
