# -*- test-case-name: tests.test_proto3 -*-
"""
A small proto3 codec: messages declared as data, bytes in and out as dicts.

The KEP door speaks a handful of flat messages and the trace exporter
writes one (OTLP's spans); a ``protobuf`` runtime (and the generated code
that goes with it) would be a large, native dependency of the daemon for
that.  What is kept of protobuf's behaviour is what a
peer can observe on the wire, so that the real client's bytes decode and
ours parse in it:

- unknown fields are skipped, whatever their wire type (groups excepted:
  proto3 never writes them);
- repeated numbers are read packed or unpacked, and written packed;
- a negative ``int32`` is written as a ten-byte varint (sign-extended to
  64 bits), and a wide varint read into an ``int32`` is truncated to 32
  bits, as protobuf does;
- of a ``oneof`` seen more than once, the last member wins; a message field
  seen twice is merged;
- a decoded message gives an absent plain field its proto3 default, but
  leaves out absent ``optional``, message and ``oneof`` fields, so that a
  caller can tell "not set" from "zero".

Malformed input raises :class:`WireError` and nothing else.  The codec
bounds nesting (:data:`MAX_DEPTH`); the size of what it is handed is the
caller's bound (the transport refuses a message over its maximum before
buffering it).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

__all__ = [
    "MAX_DEPTH",
    "Field",
    "Kind",
    "Schema",
    "WireError",
    "decode",
    "encode",
    "field",
    "message",
    "oneof",
    "varint",
]

#: How deeply messages may nest in what is decoded (protobuf's own limit
#: is 100; the messages of the door nest three deep).
MAX_DEPTH = 32

_VARINT = 0
_FIXED64 = 1
_LENGTH = 2
_FIXED32 = 5

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


class WireError(ValueError):
    """Bytes that are no valid encoding of the message, or a dict that cannot be encoded."""


class Kind(enum.Enum):
    """The value kinds the daemon's messages use."""

    INT32 = "int32"
    UINT32 = "uint32"
    INT64 = "int64"
    UINT64 = "uint64"
    BOOL = "bool"
    STRING = "string"
    BYTES = "bytes"
    ENUM = "enum"
    #: Unsigned integers written in four or eight bytes (OTLP's times and flags).
    FIXED32 = "fixed32"
    FIXED64 = "fixed64"
    MESSAGE = "message"
    #: ``map<string, string>``: on the wire, a repeated entry message whose
    #: key is field 1 and value field 2.
    MAP = "map<string,string>"


_NUMERIC = frozenset(
    {Kind.INT32, Kind.UINT32, Kind.INT64, Kind.UINT64, Kind.BOOL, Kind.ENUM}
)

#: The fixed-width kinds: their wire type and ``struct`` format.
_FIXED: dict[Kind, tuple[int, str]] = {
    Kind.FIXED32: (_FIXED32, "<I"),
    Kind.FIXED64: (_FIXED64, "<Q"),
}

_DEFAULTS: dict[Kind, Any] = {
    Kind.INT32: 0,
    Kind.UINT32: 0,
    Kind.INT64: 0,
    Kind.UINT64: 0,
    Kind.ENUM: 0,
    Kind.FIXED32: 0,
    Kind.FIXED64: 0,
    Kind.BOOL: False,
    Kind.STRING: "",
    Kind.BYTES: b"",
}

_RANGES: dict[Kind, tuple[int, int]] = {
    Kind.INT32: (-(1 << 31), (1 << 31) - 1),
    Kind.ENUM: (-(1 << 31), (1 << 31) - 1),
    Kind.UINT32: (0, _U32),
    Kind.FIXED32: (0, _U32),
    Kind.FIXED64: (0, _U64),
    Kind.INT64: (-(1 << 63), (1 << 63) - 1),
    Kind.UINT64: (0, _U64),
}


@attrs.frozen
class Field:
    """
    One field of a message, as the ``.proto`` declares it.

    :ivar number: the field number (the wire fact).
    :ivar name: the key of the field in decoded dicts.
    :ivar repeated: a list of values (never with ``optional`` or a oneof).
    :ivar optional: proto3 ``optional``: absent unless set.
    :ivar oneof: the name of the ``oneof`` group the field belongs to.
    :ivar message: the schema of a ``MESSAGE`` field.
    """

    number: int
    name: str
    kind: Kind
    repeated: bool = False
    optional: bool = False
    oneof: str | None = None
    message: Schema | None = None

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.number <= (1 << 29) - 1:
            raise ValueError(f"field number out of range: {self.number}")
        if (self.kind is Kind.MESSAGE) != (self.message is not None):
            raise ValueError(
                f"{self.name}: a message schema goes with kind MESSAGE only"
            )
        if self.kind is Kind.MAP and (self.repeated or self.optional or self.oneof):
            raise ValueError(
                f"{self.name}: a map is neither repeated, optional nor in a oneof"
            )
        if self.repeated and (self.optional or self.oneof):
            raise ValueError(
                f"{self.name}: a repeated field is neither optional nor in a oneof"
            )

    @property
    def has_presence(self) -> bool:
        """Whether an unset value is left out of a decoded dict rather than defaulted."""
        return not self.repeated and (
            self.optional or self.oneof is not None or self.kind is Kind.MESSAGE
        )


class Schema:
    """A message type: its name (for errors) and its fields."""

    __slots__ = ("by_name", "by_number", "fields", "name", "oneofs")

    def __init__(self, name: str, fields: Iterable[Field]) -> None:
        self.name = name
        self.fields = tuple(fields)
        self.by_number = {f.number: f for f in self.fields}
        self.by_name = {f.name: f for f in self.fields}
        if len(self.by_number) != len(self.fields) or len(self.by_name) != len(
            self.fields
        ):
            raise ValueError(f"{name}: field numbers and names must be unique")
        oneofs: dict[str, list[str]] = {}
        for f in self.fields:
            if f.oneof is not None:
                oneofs.setdefault(f.oneof, []).append(f.name)
        #: Each oneof group's member names.
        self.oneofs = {group: tuple(names) for group, names in oneofs.items()}

    def __repr__(self) -> str:
        return f"<Schema {self.name}>"


def field(
    number: int,
    name: str,
    kind: Kind,
    *,
    repeated: bool = False,
    optional: bool = False,
    message: Schema | None = None,
) -> Field:
    """Declare a field (a ``MESSAGE`` field names its schema with ``message``)."""
    return Field(
        number, name, kind, repeated=repeated, optional=optional, message=message
    )


def oneof(group: str, *fields: Field) -> tuple[Field, ...]:
    """Put ``fields`` into the ``oneof`` named ``group``."""
    return tuple(attrs.evolve(f, oneof=group) for f in fields)


def message(name: str, *fields: Field | tuple[Field, ...]) -> Schema:
    """Declare a message from its fields and :func:`oneof` groups."""
    flat: list[Field] = []
    for item in fields:
        if isinstance(item, Field):
            flat.append(item)
        else:
            flat.extend(item)
    return Schema(name, flat)


# -- decoding ---------------------------------------------------------------


def decode(schema: Schema, data: bytes) -> dict[str, Any]:
    """
    Decode one message.

    :raises WireError: when ``data`` is not a valid encoding of ``schema``.
    """
    out: dict[str, Any] = {}
    _decode_into(schema, bytes(data), out, 0, schema.name)
    return out


def _readvarint(data: bytes, pos: int, where: str) -> tuple[int, int]:
    result = 0
    shift = 0
    end = len(data)
    for _ in range(10):
        if pos >= end:
            raise WireError(f"{where}: truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & _U64, pos
        shift += 7
    raise WireError(f"{where}: varint longer than ten bytes")


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _scalar_fromvarint(kind: Kind, value: int) -> Any:
    if kind is Kind.BOOL:
        return value != 0
    if kind in (Kind.INT32, Kind.ENUM):
        return _signed(value, 32)
    if kind is Kind.UINT32:
        return value & _U32
    if kind is Kind.INT64:
        return _signed(value, 64)
    return value


def _skip(data: bytes, pos: int, wire_type: int, where: str) -> int:
    if wire_type == _VARINT:
        return _readvarint(data, pos, where)[1]
    if wire_type == _FIXED64:
        pos += 8
    elif wire_type == _FIXED32:
        pos += 4
    elif wire_type == _LENGTH:
        length, pos = _readvarint(data, pos, where)
        pos += length
    else:
        raise WireError(f"{where}: unsupported wire type {wire_type}")
    if pos > len(data):
        raise WireError(f"{where}: field runs past the end of the message")
    return pos


def _decode_into(
    schema: Schema, data: bytes, out: dict[str, Any], depth: int, where: str
) -> None:
    if depth > MAX_DEPTH:
        raise WireError(f"{where}: messages nested deeper than {MAX_DEPTH}")
    pos = 0
    end = len(data)
    while pos < end:
        key, pos = _readvarint(data, pos, where)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise WireError(f"{where}: field number 0")
        spec = schema.by_number.get(number)
        if spec is None:
            pos = _skip(data, pos, wire_type, f"{where}#{number}")
            continue
        path = f"{where}.{spec.name}"
        if wire_type == _LENGTH:
            length, pos = _readvarint(data, pos, path)
            if length > end - pos:
                raise WireError(
                    f"{path}: length {length} runs past the end of the message"
                )
            chunk = data[pos : pos + length]
            pos += length
            _take_length_delimited(spec, chunk, out, depth, path)
        elif wire_type == _VARINT and spec.kind in _NUMERIC:
            value, pos = _readvarint(data, pos, path)
            _store(spec, out, _scalar_fromvarint(spec.kind, value))
        elif spec.kind in _FIXED and wire_type == _FIXED[spec.kind][0]:
            fmt = _FIXED[spec.kind][1]
            size = struct.calcsize(fmt)
            if size > end - pos:
                raise WireError(f"{path}: runs past the end of the message")
            _store(spec, out, struct.unpack_from(fmt, data, pos)[0])
            pos += size
        else:
            raise WireError(
                f"{path}: wire type {wire_type} for a {spec.kind.value} field"
            )
        if spec.oneof is not None:
            for other in schema.oneofs[spec.oneof]:
                if other != spec.name:
                    out.pop(other, None)
    for spec in schema.fields:
        if spec.name in out or spec.has_presence:
            continue
        if spec.repeated:
            out[spec.name] = []
        elif spec.kind is Kind.MAP:
            out[spec.name] = {}
        else:
            out[spec.name] = _DEFAULTS[spec.kind]


def _store(spec: Field, out: dict[str, Any], value: Any) -> None:
    if spec.repeated:
        out.setdefault(spec.name, []).append(value)
    else:
        out[spec.name] = value


def _text(chunk: bytes, path: str) -> str:
    try:
        return chunk.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WireError(f"{path}: invalid UTF-8 at byte {e.start}") from None


def _take_length_delimited(
    spec: Field, chunk: bytes, out: dict[str, Any], depth: int, path: str
) -> None:
    kind = spec.kind
    if kind is Kind.STRING:
        value: Any = _text(chunk, path)
    elif kind is Kind.BYTES:
        value = chunk
    elif kind is Kind.MESSAGE:
        assert spec.message is not None
        if spec.repeated:
            value = {}
            _decode_into(spec.message, chunk, value, depth + 1, path)
        else:
            # A message seen twice is merged into the first, as protobuf does.
            value = out.get(spec.name)
            if value is None:
                value = {}
            _decode_into(spec.message, chunk, value, depth + 1, path)
    elif kind is Kind.MAP:
        key, item = _map_entry(chunk, path)
        out.setdefault(spec.name, {})[key] = item
        return
    elif spec.repeated and kind in _FIXED:
        fmt = _FIXED[kind][1]
        size = struct.calcsize(fmt)
        if len(chunk) % size:
            raise WireError(f"{path}: packed {kind.value} values of {len(chunk)} bytes")
        out.setdefault(spec.name, []).extend(
            v for (v,) in struct.iter_unpack(fmt, chunk)
        )
        return
    elif spec.repeated:
        # Packed numbers.
        values = out.setdefault(spec.name, [])
        pos = 0
        while pos < len(chunk):
            raw, pos = _readvarint(chunk, pos, path)
            values.append(_scalar_fromvarint(kind, raw))
        return
    else:
        raise WireError(f"{path}: wire type 2 for a {kind.value} field")
    if spec.repeated:
        out.setdefault(spec.name, []).append(value)
    else:
        out[spec.name] = value


def _map_entry(chunk: bytes, path: str) -> tuple[str, str]:
    key = value = ""
    pos = 0
    while pos < len(chunk):
        tag, pos = _readvarint(chunk, pos, path)
        number, wire_type = tag >> 3, tag & 7
        if number in (1, 2):
            if wire_type != _LENGTH:
                raise WireError(f"{path}: wire type {wire_type} for a map's string")
            length, pos = _readvarint(chunk, pos, path)
            if length > len(chunk) - pos:
                raise WireError(
                    f"{path}: length {length} runs past the end of the map entry"
                )
            text = _text(chunk[pos : pos + length], path)
            pos += length
            if number == 1:
                key = text
            else:
                value = text
        elif number == 0:
            raise WireError(f"{path}: field number 0")
        else:
            pos = _skip(chunk, pos, wire_type, path)
    return key, value


# -- encoding ---------------------------------------------------------------


def encode(schema: Schema, value: Mapping[str, Any]) -> bytes:
    """
    Encode one message from a dict shaped as :func:`decode` returns it.

    A plain field equal to its default is not written (proto3); an
    ``optional``, message or ``oneof`` field is written whenever its key is
    present and not ``None``.

    :raises WireError: for an unknown key, a value of the wrong type or out
        of its kind's range, or two members of one ``oneof``.
    """
    parts: list[bytes] = []
    _encode_into(schema, value, parts, 0, schema.name)
    return b"".join(parts)


#: The one-byte varints (lengths and numbers under 128: most of them).
_ONE_BYTE = tuple(bytes((n,)) for n in range(0x80))


def varint(value: int) -> bytes:
    """``value`` as a base-128 varint (negative numbers as their 64-bit two's complement)."""
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    value &= _U64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def _number(kind: Kind, value: Any, path: str) -> int:
    if kind is Kind.BOOL:
        if not isinstance(value, bool):
            raise WireError(f"{path}: expected a bool, got {type(value).__name__}")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{path}: expected an int, got {type(value).__name__}")
    low, high = _RANGES[kind]
    if not low <= value <= high:
        raise WireError(f"{path}: {value} is out of range for {kind.value}")
    return value


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _tag(number, _LENGTH) + varint(len(payload)) + payload


def _encode_scalar(spec: Field, value: Any, depth: int, path: str) -> bytes:
    kind = spec.kind
    if kind is Kind.STRING:
        if not isinstance(value, str):
            raise WireError(f"{path}: expected a str, got {type(value).__name__}")
        try:
            return _length_delimited(spec.number, value.encode("utf-8"))
        except UnicodeEncodeError:
            raise WireError(f"{path}: not encodable as UTF-8") from None
    if kind is Kind.BYTES:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise WireError(f"{path}: expected bytes, got {type(value).__name__}")
        return _length_delimited(spec.number, bytes(value))
    if kind is Kind.MESSAGE:
        assert spec.message is not None
        if not isinstance(value, Mapping):
            raise WireError(f"{path}: expected a mapping, got {type(value).__name__}")
        inner: list[bytes] = []
        _encode_into(spec.message, value, inner, depth + 1, path)
        return _length_delimited(spec.number, b"".join(inner))
    if kind in _FIXED:
        wire_type, fmt = _FIXED[kind]
        return _tag(spec.number, wire_type) + struct.pack(
            fmt, _number(kind, value, path)
        )
    return _tag(spec.number, _VARINT) + varint(_number(kind, value, path))


def _encode_into(
    schema: Schema, value: Mapping[str, Any], parts: list[bytes], depth: int, where: str
) -> None:
    if depth > MAX_DEPTH:
        raise WireError(f"{where}: messages nested deeper than {MAX_DEPTH}")
    unknown = [k for k in value if k not in schema.by_name]
    if unknown:
        raise WireError(f"{where}: no field named {sorted(map(str, unknown))}")
    for group, members in schema.oneofs.items():
        set_members = [m for m in members if value.get(m) is not None]
        if len(set_members) > 1:
            raise WireError(
                f"{where}: more than one member of oneof {group}: {set_members}"
            )
    for spec in schema.fields:
        item = value.get(spec.name)
        if item is None:
            continue
        path = f"{where}.{spec.name}"
        if spec.kind is Kind.MAP:
            _encode_map(spec, item, parts, path)
        elif spec.repeated:
            _encode_repeated(spec, item, parts, depth, path)
        elif (
            spec.has_presence
            or item != _DEFAULTS[spec.kind]
            or type(item) is not type(_DEFAULTS[spec.kind])
        ):
            # A value of the wrong type that compares equal to the default
            # (0.0, a bytearray) still goes through the type checks.
            parts.append(_encode_scalar(spec, item, depth, path))


def _encode_repeated(
    spec: Field, items: Any, parts: list[bytes], depth: int, path: str
) -> None:
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise WireError(f"{path}: expected a list, got {type(items).__name__}")
    items = list(items)
    if not items:
        return
    if spec.kind in _FIXED:
        fmt = f"<{len(items)}{_FIXED[spec.kind][1][1]}"
        packed = struct.pack(fmt, *(_number(spec.kind, v, path) for v in items))
        parts.append(_length_delimited(spec.number, packed))
        return
    if spec.kind in _NUMERIC:
        packed = b"".join(varint(_number(spec.kind, v, path)) for v in items)
        parts.append(_length_delimited(spec.number, packed))
        return
    for item in items:
        parts.append(_encode_scalar(spec, item, depth, path))


def _encode_map(spec: Field, items: Any, parts: list[bytes], path: str) -> None:
    if not isinstance(items, Mapping):
        raise WireError(f"{path}: expected a mapping, got {type(items).__name__}")
    for key, item in items.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise WireError(f"{path}: keys and values must be str")
        try:
            entry = _length_delimited(1, key.encode("utf-8")) + _length_delimited(
                2, item.encode("utf-8")
            )
        except UnicodeEncodeError:
            raise WireError(f"{path}: not encodable as UTF-8") from None
        parts.append(_length_delimited(spec.number, entry))
