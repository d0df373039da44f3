# -*- test-case-name: tests.kernels.test_output -*-
"""
An execution's result document as JSON bytes, its output escaped from the
bytes it arrived as.

A finished execution's stdout and stderr are UTF-8 bytes (head and tail,
up to ``max_output_bytes`` each). Decoding them to a string for
``json.dumps`` and encoding the document back costs the daemon three passes
over every character, the escaping one the slowest of all (a 10 MiB output
took longer to encode than to arrive). Output text is nearly always valid
UTF-8 whose only characters JSON escapes are quotes, backslashes, tabs,
newlines and carriage returns: for that, the escaped string is made from
the bytes with a few C-speed replacements, the very bytes ``json.dumps``
(with ``ensure_ascii=False``) would give. Anything else (a lone control
character, a cut or bad UTF-8 sequence) goes the ordinary way.
"""

from __future__ import annotations

from typing import Any, cast, overload

from sandboxd.web.jsonbody import json_bytes

#: Bytes JSON escapes that the fast path does not: control characters
#: other than tab, newline and carriage return (``\\b``, ``\\f``,
#: ``\\u00XX``).
_RARE = bytes(c for c in range(0x20) if c not in (0x09, 0x0A, 0x0D))

#: The same, each alone: in a big chunk they are looked for one by one
#: (``memchr``, several bytes a cycle), a third to a fifth of the cost of
#: deleting them all in one pass (``bytes.translate``, a byte at a time
#: into a new copy), which stays the cheaper for a small chunk.
_RARE_EACH = tuple(bytes((c,)) for c in _RARE)

#: What the fast path escapes, the backslash first (so the escapes added
#: after it stay single).
_ESCAPES = (
    (b"\\", b"\\\\"),
    (b'"', b'\\"'),
    (b"\n", b"\\n"),
    (b"\r", b"\\r"),
    (b"\t", b"\\t"),
)

#: From this many bytes on, :data:`_RARE_EACH` is the cheaper check.
_SCAN_EACH_BYTES = 16 * 1024


def _has_rare(raw: bytes | bytearray) -> bool:
    """Whether ``raw`` holds a byte of :data:`_RARE`."""
    if len(raw) >= _SCAN_EACH_BYTES:
        return any(c in raw for c in _RARE_EACH)
    return len(raw.translate(None, _RARE)) != len(raw)


@overload
def _escaped(raw: bytes) -> bytes | None: ...


@overload
def _escaped(raw: bytearray) -> bytearray | None: ...


def _escaped(raw: bytes | bytearray) -> bytes | bytearray | None:
    """
    The inside of the JSON string literal of ``raw`` (UTF-8), or None
    when it holds what only ``json.dumps`` escapes right.
    """
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return None  # replaced by U+FFFD on the ordinary path
    if _has_rare(raw):
        return None
    # Only what is there is replaced: a bytearray's replace copies it even
    # when there is nothing to replace (the hub's output comes as one).
    for byte, escape in _ESCAPES:
        if byte in raw:
            raw = raw.replace(byte, escape)
    return raw


#: Output under this many bytes is cheaper to decode and encode with the
#: rest of its document than to splice in.
SMALL_OUTPUT_BYTES = 64 * 1024


def text_value(raw: bytes) -> list[bytes]:
    """
    ``raw`` (UTF-8, bad sequences read as U+FFFD) as a JSON string, in
    parts to be joined once with the rest of the document.
    """
    inside = _escaped(raw)
    if inside is None:
        return [json_bytes(raw.decode("utf-8", "replace"))]
    return [b'"', inside, b'"']


class JsonParts:
    """A JSON value already encoded, in parts (a :func:`document` field)."""

    def __init__(self, parts: list[bytes | bytearray]) -> None:
        self.parts = parts


def document(fields: dict[str, Any]) -> bytes:
    """
    A flat JSON object, compact, in ``fields``' order; a ``bytes`` value is
    a UTF-8 text (as :func:`text_value`), a :class:`JsonParts` one already
    encoded (:meth:`EscapedText.take`). The same bytes the API's answer
    would be with those values decoded first, in one final copy.
    """
    return b"".join(document_parts(fields))


def document_parts(fields: dict[str, Any]) -> list[bytes | bytearray]:
    """:func:`document` in parts, for a caller that joins them with more."""
    parts: list[bytes | bytearray] = [b"{"]
    plain: dict[str, Any] = {}
    for name, value in fields.items():
        if not isinstance(value, bytes | JsonParts):
            plain[name] = value
            continue
        if plain:  # the ordinary fields before it, encoded together
            parts += (json_bytes(plain)[1:-1], b",")
            plain = {}
        parts += (json_bytes(name), b":")
        parts += text_value(value) if isinstance(value, bytes) else value.parts
        parts.append(b",")
    if plain:
        parts.append(json_bytes(plain)[1:-1])
    elif len(parts) > 1:
        parts.pop()  # the last comma
    parts.append(b"}")
    return parts


class EscapedText:
    """
    A stream's output escaped for JSON chunk by chunk as it arrives, so a
    result document is one copy away when the execution ends, the
    escaping done while the kernel was still talking (on the daemon's own
    core, while the hub works on the other).

    Kept while the whole output fits ``cap`` (its head-and-tail buffer's
    bound: then that buffer holds all of it too, and both say the same)
    and every chunk is plain (:func:`text_value`'s fast case; each chunk
    the hub sends is cut between characters); else given up for good and
    the document escapes the head and tail the ordinary way.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._parts: list[bytes | bytearray] | None = []
        self._size = 0
        #: Bytes held (what the execution's memory bound counts).
        self.held_bytes = 0

    def write(self, raw: bytes | bytearray) -> None:
        """Take the next chunk of output (UTF-8)."""
        if self._parts is None:
            return
        self._size += len(raw)
        inside = _escaped(raw) if self._size <= self.cap else None
        if inside is None:
            self.drop()
            return
        self._parts.append(inside)
        self.held_bytes += len(inside)

    def drop(self) -> None:
        """Give up (and free what is held)."""
        self._parts = None
        self.held_bytes = 0

    def take(self) -> list[bytes | bytearray] | None:
        """
        The whole output as a JSON string in parts, once (then dropped),
        or None if it was given up.
        """
        parts = self._parts
        self.drop()
        if parts is None:
            return None
        return [b'"', *parts, b'"']


def text_object(fields: dict[str, Any]) -> bytes | None:
    """:func:`text_object_parts`, joined."""
    parts = text_object_parts(fields)
    return None if parts is None else b"".join(parts)


def text_object_parts(fields: dict[str, Any]) -> list[bytes] | None:
    """
    ``fields``, a flat object with a big ``text`` (an output event), as
    compact JSON (UTF-8), its text escaped from its bytes (:func:`document`):
    the same bytes as encoding it whole, at a fraction of the cost for a
    stream's chunk of output, which every event stream sends as it comes.

    :returns: None when ``text`` is not a string of at least
        :data:`SMALL_OUTPUT_BYTES` characters, or holds a lone surrogate:
        encode it the ordinary way then.
    """
    text = fields.get("text")
    if not isinstance(text, str) or len(text) < SMALL_OUTPUT_BYTES:
        return None
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    # All bytes: its one buffer field is the text just encoded.
    return cast(list[bytes], document_parts({**fields, "text": raw}))
