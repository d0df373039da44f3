# -*- test-case-name: tests.preview.test_answer -*-
"""
An app's response head read once and turned into the browser's.

On the door's direct path (:mod:`sandboxd.preview.channel` and
:meth:`sandboxd.preview.rawpool.RawConnection.send_to`) the app's head is
split into lines once; every line the rules leave alone is passed on as
the very bytes the app sent, and only the few that matter are looked at:
the framing (``Content-Length``, ``Transfer-Encoding``, ``Connection``),
hop-by-hop headers (dropped), ``Set-Cookie`` (dropped when the preview
may not set it) and ``Location`` (rewritten).  The rules are those of
:mod:`sandboxd.preview.headers`, which says why; a head that is not
HTTP/1.x is :class:`~sandboxd.preview.rawpool.UpstreamBroken`'s business,
raised here as :class:`NotHttp`.
"""

from __future__ import annotations

import re
from typing import Protocol

from sandboxd.policy.defaults import HEADER_NAME_CACHE
from sandboxd.preview import headers as h

__all__ = ["Answer", "NotHttp", "Rules", "read_answer"]

#: What the rules do with a header, by lower-cased name (absent: passed on).
_LENGTH, _CODING, _CONNECTION, _HOP, _COOKIE, _LOCATION = range(6)
_KINDS: dict[bytes, int] = {name: _HOP for name in h.HOP_BY_HOP}
_KINDS.update(
    {
        b"content-length": _LENGTH,
        b"transfer-encoding": _CODING,
        b"connection": _CONNECTION,
        b"set-cookie": _COOKIE,
        b"location": _LOCATION,
    }
)

#: A head's header lines, each a token, a colon and a value without CR or LF.
_PLAIN_LINES = re.compile(rb"(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\r\n]*)*")

#: The header lines the rules act on (the others pass as they are).
_SPECIAL = re.compile(
    rb"\r\n("
    + b"|".join(re.escape(name) for name in sorted(_KINDS, key=len, reverse=True))
    + rb"):([^\r\n]*)",
    re.IGNORECASE,
)

#: Header names as sent to their lower-cased form (bounded).
_LOWER: dict[bytes, bytes] = {}


class NotHttp(Exception):
    """The app's answer is not an HTTP/1.x response head."""


class Rules:
    """
    What the rules need to know of one preview, worked out once per
    exchange: its host name (for cookies), port, origin and path prefix
    (for ``Location``).
    """

    __slots__ = ("host", "origin", "port", "prefix")

    def __init__(self, host: str, port: int, origin: str, prefix: str) -> None:
        self.host = host
        self.port = port
        self.origin = origin
        self.prefix = prefix


class Answer:
    """
    One response head from the app, read (see the module).

    :ivar block: the header lines the browser gets, joined by CRLF (no
        CRLF at either end; empty for none).
    :ivar length: the body's ``Content-Length``, or None.
    :ivar chunked: the body is chunked (its length line then dropped).
    :ivar close: the app closes the connection after this answer (or
        frames the body by its close).
    :ivar plain: read without the preview's rules (no ``Set-Cookie``, no
        ``Location``), so the same bytes read the same for any preview.
    """

    __slots__ = (
        "block",
        "chunked",
        "close",
        "code",
        "length",
        "phrase",
        "plain",
        "version",
    )

    def __init__(
        self,
        version: bytes,
        code: int,
        phrase: bytes,
        block: bytes,
        length: int | None,
        chunked: bool,
        close: bool,
    ) -> None:
        self.version = version
        self.code = code
        self.phrase = phrase
        self.block = block
        self.length = length
        self.chunked = chunked
        self.close = close
        self.plain = True

    @property
    def lines(self) -> list[bytes]:
        """The header lines the browser gets, one by one."""
        return self.block.split(b"\r\n") if self.block else []


def _lower(name: bytes) -> bytes:
    lower = _LOWER.get(name)
    if lower is None:
        if not name or name != name.strip():
            raise NotHttp("a malformed header line")
        lower = name.lower()
        if len(_LOWER) < HEADER_NAME_CACHE:
            _LOWER[name] = lower
    return lower


class HasRules(Protocol):
    """Who knows the preview's :class:`Rules` (asked only when a line needs them)."""

    @property
    def rules(self) -> Rules:
        """The preview's rules."""


def read_answer(raw: bytes, owner: HasRules) -> Answer:
    """
    The answer in ``raw`` (a head without its blank line), the rules of
    ``owner`` applied to its lines (asked for only when a ``Set-Cookie``
    or a ``Location`` comes).

    :raises NotHttp: not an HTTP/1.x head, a malformed line or a bad
        ``Content-Length``.
    """
    answer = _read_plain(raw, owner)
    if answer is None:
        answer = _read_lines(raw, owner)
    return answer


def _status(line: bytes) -> tuple[bytes, int, bytes]:
    """``(version, code, reason)`` of a status line."""
    if not line.startswith(b"HTTP/1."):
        raise NotHttp("not an HTTP/1.x response")
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise NotHttp("not an HTTP/1.x response")
    return parts[0], int(parts[1]), parts[2] if len(parts) > 2 else b""


def _connection(value: bytes, version: bytes, close: bool) -> tuple[bool, set[bytes]]:
    """
    A ``Connection`` header's say: whether the connection closes after
    this answer (``close``; ``keep-alive`` keeps an HTTP/1.0 one open),
    and the other headers it names, which are hop-by-hop too.
    """
    others: set[bytes] = set()
    for token in value.split(b","):
        token = token.strip().lower()
        if token == b"close":
            close = True
        elif token == b"keep-alive":
            if version == b"HTTP/1.0":
                close = False
        elif token:
            others.add(token)
    return close, others


def _read_plain(raw: bytes, owner: HasRules) -> Answer | None:
    """
    The common head, read by two regular expressions: every line a token,
    a colon and a value (checked in one match), and only the lines the
    rules act on visited (:data:`_SPECIAL`); the others are copied as
    slices of ``raw``.  None for anything less plain (a bare CR or LF, a
    name that is not a token, ``Connection`` naming other headers, two
    framings): :func:`_read_lines` reads those.
    """
    end = raw.find(b"\r\n")
    if end < 0:
        version, code, phrase = _status(raw)
        return Answer(version, code, phrase, b"", None, False, version == b"HTTP/1.0")
    version, code, phrase = _status(raw[:end])
    if _PLAIN_LINES.fullmatch(raw, end) is None:
        return None
    close = version == b"HTTP/1.0"
    length: int | None = None
    chunked = False
    parts: list[bytes] = []
    last = end
    kinds = _KINDS
    rules: Rules | None = None
    for match in _SPECIAL.finditer(raw, end):
        name, value = match.group(1, 2)
        kind = kinds[_LOWER.get(name) or _lower(name)]
        value = value.strip()
        if kind == _LENGTH:
            if length is not None or not value.isdigit():
                return None
            length = int(value)
            continue  # kept
        if kind == _CODING:
            chunked = value.split(b",")[-1].strip().lower() == b"chunked"
            if not chunked:
                close = True
        elif kind == _CONNECTION:
            close, others = _connection(value, version, close)
            if others:
                return None  # it names other headers
        elif kind == _COOKIE:
            rules = rules or owner.rules
            if h.cookie_allowed(value, rules.host):
                continue  # kept
        elif kind == _LOCATION:
            rules = rules or owner.rules
            parts.append(raw[last : match.start()])
            parts.append(
                b"\r\n"
                + name
                + b": "
                + h.rewrite_location(value, rules.port, rules.origin, rules.prefix)
            )
            last = match.end()
            continue
        # Dropped: the slice before it, and on after it.
        parts.append(raw[last : match.start()])
        last = match.end()
    if chunked and length is not None:
        return None  # two framings
    if parts:
        parts.append(raw[last:])
        block = b"".join(parts)[2:]
    else:
        block = raw[end + 2 :]
    answer = Answer(version, code, phrase, block, length, chunked, close)
    answer.plain = rules is None
    return answer


def _read_lines(raw: bytes, owner: HasRules) -> Answer:
    """Any head, line by line (see :func:`read_answer`)."""
    lines = raw.split(b"\r\n")
    version, code, phrase = _status(lines[0])
    out: list[bytes] = []
    length: int | None = None
    chunked = False
    close = version == b"HTTP/1.0"
    listed: set[bytes] | None = None
    kinds = _KINDS
    names = _LOWER
    rules: Rules | None = None
    for index in range(1, len(lines)):
        line = lines[index]
        name, colon, value = line.partition(b":")
        if not colon:
            raise NotHttp("a malformed header line")
        lower = names.get(name) or _lower(name)
        kind = kinds.get(lower)
        if kind is None:
            out.append(line)
            continue
        value = value.strip()
        if kind == _LENGTH:
            if not value.isdigit() or (length is not None and int(value) != length):
                raise NotHttp("a bad Content-Length")
            if length is None:
                out.append(line)
            length = int(value)
        elif kind == _CODING:
            chunked = value.split(b",")[-1].strip().lower() == b"chunked"
            if not chunked:
                close = True  # framed by the close (RFC 9112 §6.3)
        elif kind == _CONNECTION:
            close, others = _connection(value, version, close)
            if others:
                listed = (listed or set()) | others
        elif kind == _COOKIE:
            rules = rules or owner.rules
            if h.cookie_allowed(value, rules.host):
                out.append(line)
        elif kind == _LOCATION:
            rules = rules or owner.rules
            out.append(
                name
                + b": "
                + h.rewrite_location(value, rules.port, rules.origin, rules.prefix)
            )
    if chunked and length is not None:
        # Both framings: chunked wins, and the length must not reach the
        # browser (RFC 9112 §6.3, a response-splitting attempt).
        length = None
        listed = (listed or set()) | {b"content-length"}
    if listed:
        out = [line for line in out if _lower(line.partition(b":")[0]) not in listed]
    ends = len(lines) - 1
    if raw.count(b"\r") != ends or raw.count(b"\n") != ends:
        # A bare CR or LF inside a value would start a line of the app's
        # making at the browser: a space, as Twisted's Headers does.
        out = [line.replace(b"\r", b" ").replace(b"\n", b" ") for line in out]
    answer = Answer(version, code, phrase, b"\r\n".join(out), length, chunked, close)
    answer.plain = rules is None
    return answer
