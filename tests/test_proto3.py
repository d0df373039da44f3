"""
The proto3 codec, checked against protobuf itself: the SDK's generated
``process_pb2`` classes parse what we encode and we decode what they
serialize; and malformed bytes raise one ``WireError``.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.kep import schema
from sandboxd.proto3 import (
    MAX_DEPTH,
    Kind,
    WireError,
    decode,
    encode,
    field,
    message,
    oneof,
)

try:
    from google.protobuf import json_format
    from k8s_agent_sandbox.commands._process_stubs import process_pb2 as pb
except ImportError:  # pragma: no cover - the dev extra installs them
    pb = None


def _needs_pb(case: SynchronousTestCase) -> None:
    if pb is None:
        raise case.skipTest("k8s-agent-sandbox[grpc] is not installed")


class AgainstProtobufTests(SynchronousTestCase):
    """What a client built on protobuf sends and reads."""

    def setUp(self) -> None:
        _needs_pb(self)

    def test_every_message_matches_the_generated_descriptor(self) -> None:
        """Each schema has the .proto's field names, numbers and cardinality."""
        pairs = {
            schema.PTY: pb.PTY,
            schema.PROCESS_CONFIG: pb.ProcessConfig,
            schema.START_REQUEST: pb.StartRequest,
            schema.INIT_EVENT: pb.InitEvent,
            schema.EXIT_EVENT: pb.ExitEvent,
            schema.START_RESPONSE: pb.StartResponse,
            schema.EXECUTE_REQUEST: pb.ExecuteRequest,
            schema.EXECUTE_RESPONSE: pb.ExecuteResponse,
            schema.WRITE_STDIN_REQUEST: pb.WriteStdinRequest,
            schema.WRITE_STDIN_RESPONSE: pb.WriteStdinResponse,
            schema.SEND_SIGNAL_REQUEST: pb.SendSignalRequest,
            schema.SEND_SIGNAL_RESPONSE: pb.SendSignalResponse,
            schema.RESIZE_TTY_REQUEST: pb.ResizeTTYRequest,
            schema.RESIZE_TTY_RESPONSE: pb.ResizeTTYResponse,
        }
        for ours, theirs in pairs.items():
            descriptor = theirs.DESCRIPTOR
            self.assertEqual(ours.name, descriptor.full_name)
            self.assertEqual(
                {f.name: f.number for f in ours.fields},
                {f.name: f.number for f in descriptor.fields},
                ours.name,
            )
            for f in descriptor.fields:
                spec = ours.by_name[f.name]
                oneof_group = f.containing_oneof
                real_oneof = (
                    oneof_group is not None and not oneof_group.name.startswith("_")
                )
                self.assertEqual(
                    spec.oneof, oneof_group.name if real_oneof else None, f.name
                )
                self.assertEqual(
                    spec.optional, oneof_group is not None and not real_oneof
                )
        service = pb.DESCRIPTOR.services_by_name["ProcessService"]
        self.assertEqual(
            [(m.name, m.server_streaming) for m in service.methods],
            [(r.name, r.server_streaming) for r in schema.RPCS],
        )
        self.assertEqual(service.full_name, schema.SERVICE)
        self.assertEqual(
            {s.name: s.value for s in schema.Signal}, dict(pb.Signal.items())
        )

    def _both_ways(self, ours: Any, theirs: Any, value: dict[str, Any]) -> None:
        parsed = theirs()
        parsed.ParseFromString(encode(ours, value))
        self.assertEqual(
            decode(ours, parsed.SerializeToString()), decode(ours, encode(ours, value))
        )
        self.assertEqual(decode(ours, parsed.SerializeToString()), value)

    def test_execute_request(self) -> None:
        """The SDK's ExecuteRequest (argv, env, cwd) decodes, and ours parses in protobuf."""
        request = pb.ExecuteRequest(
            config=pb.ProcessConfig(
                command=["/bin/sh", "-c", "echo é"],
                env_vars={"A": "1", "B": ""},
                cwd="/tmp",
            )
        )
        self.assertEqual(
            decode(schema.EXECUTE_REQUEST, request.SerializeToString()),
            {
                "config": {
                    "command": ["/bin/sh", "-c", "echo é"],
                    "env_vars": {"A": "1", "B": ""},
                    "cwd": "/tmp",
                }
            },
        )
        ours = encode(
            schema.EXECUTE_REQUEST,
            {"config": {"command": ["ls"], "env_vars": {"K": "v"}, "cwd": ""}},
        )
        parsed = pb.ExecuteRequest.FromString(ours)
        self.assertEqual(list(parsed.config.command), ["ls"])
        self.assertEqual(dict(parsed.config.env_vars), {"K": "v"})
        self.assertTrue(parsed.config.HasField("cwd"))
        self.assertEqual(parsed.config.cwd, "")

    def test_presence(self) -> None:
        """Unset optional and message fields are absent; plain fields default."""
        self.assertEqual(
            decode(schema.START_REQUEST, pb.StartRequest().SerializeToString()), {}
        )
        self.assertEqual(
            decode(
                schema.START_REQUEST, pb.StartRequest(config={}).SerializeToString()
            ),
            {"config": {"command": [], "env_vars": {}}},
        )
        self.assertEqual(
            decode(schema.START_REQUEST, pb.StartRequest(pty={}).SerializeToString()),
            {"pty": {"cols": 0, "rows": 0}},
        )
        self.assertEqual(
            decode(schema.EXECUTE_RESPONSE, b""),
            {"exit_code": 0, "stdout": b"", "stderr": b""},
        )

    def test_negative_int32(self) -> None:
        """A negative int32 is a ten-byte varint both ways."""
        data = encode(schema.EXECUTE_RESPONSE, {"exit_code": -9})
        self.assertEqual(data, pb.ExecuteResponse(exit_code=-9).SerializeToString())
        self.assertEqual(len(data), 11)
        self.assertEqual(pb.ExecuteResponse.FromString(data).exit_code, -9)
        self._both_ways(
            schema.EXECUTE_RESPONSE,
            pb.ExecuteResponse,
            {"exit_code": -(2**31), "stdout": b"\x00\xff", "stderr": b"e"},
        )

    def test_oneof(self) -> None:
        """Each member of StartResponse's oneof, the empty-message member of WriteStdin's."""
        for value in (
            {"init": {"process_id": 42}},
            {"stdout": b""},
            {"stderr": b"x" * 300},
            {"exit": {"exit_code": 0}},
            {"exit": {"exit_code": -1}},
        ):
            self._both_ways(schema.START_RESPONSE, pb.StartResponse, value)
        self._both_ways(
            schema.WRITE_STDIN_REQUEST,
            pb.WriteStdinRequest,
            {"process_id": 3, "eof": {}},
        )
        self._both_ways(
            schema.WRITE_STDIN_REQUEST,
            pb.WriteStdinRequest,
            {"process_id": 0, "input": b"hi"},
        )
        parsed = pb.StartResponse.FromString(
            encode(schema.START_RESPONSE, {"stdout": b""})
        )
        self.assertEqual(parsed.WhichOneof("event"), "stdout")

    def test_oneof_last_member_wins(self) -> None:
        """Two members on the wire: the last one is kept, as protobuf keeps it."""
        data = (
            pb.StartResponse(stdout=b"a").SerializeToString()
            + pb.StartResponse(exit={"exit_code": 3}).SerializeToString()
        )
        self.assertEqual(
            json_format.MessageToDict(pb.StartResponse.FromString(data)),
            {"exit": {"exitCode": 3}},
        )
        self.assertEqual(
            decode(schema.START_RESPONSE, data), {"exit": {"exit_code": 3}}
        )

    def test_repeated_message_fields_merge(self) -> None:
        """A message field seen twice is merged; repeated fields append."""
        data = (
            pb.ExecuteRequest(
                config={"command": ["a"], "env_vars": {"X": "1"}}
            ).SerializeToString()
            + pb.ExecuteRequest(
                config={"command": ["b"], "cwd": "/"}
            ).SerializeToString()
        )
        self.assertEqual(
            decode(schema.EXECUTE_REQUEST, data),
            {"config": {"command": ["a", "b"], "env_vars": {"X": "1"}, "cwd": "/"}},
        )

    def test_enum_and_uint32(self) -> None:
        """Signals and terminal sizes; an unknown enum number is kept."""
        self._both_ways(
            schema.SEND_SIGNAL_REQUEST,
            pb.SendSignalRequest,
            {"process_id": 7, "signal": schema.Signal.SIGNAL_SIGKILL},
        )
        self._both_ways(
            schema.RESIZE_TTY_REQUEST,
            pb.ResizeTTYRequest,
            {"process_id": 1, "cols": 2**32 - 1, "rows": 24},
        )
        wire = pb.SendSignalRequest(signal=99).SerializeToString()
        self.assertEqual(decode(schema.SEND_SIGNAL_REQUEST, wire)["signal"], 99)

    def test_unknown_fields_skipped(self) -> None:
        """Fields of every wire type this schema does not know are passed over."""
        unknown = (
            b"\x50\x96\x01"  # 10: varint
            + b"\x59"
            + b"\x00" * 8  # 11: fixed64
            + b"\x62\x03abc"  # 12: length-delimited
            + b"\x6d"
            + b"\x00" * 4  # 13: fixed32
        )
        data = unknown + pb.InitEvent(process_id=5).SerializeToString()
        self.assertEqual(decode(schema.INIT_EVENT, data), {"process_id": 5})


_NUMBERS = message(
    "t.Numbers",
    field(1, "values", Kind.INT32, repeated=True),
    field(2, "flags", Kind.BOOL, repeated=True),
    field(3, "big", Kind.INT64),
    field(4, "name", Kind.STRING),
)


class CodecTests(SynchronousTestCase):
    """Behaviour that needs no reference: packing, bounds, malformed input."""

    def test_packed_and_unpacked(self) -> None:
        """Repeated numbers are read packed or not, and written packed."""
        unpacked = b"\x08\x01\x08\x7f\x10\x01"
        packed = b"\x0a\x02\x01\x7f\x12\x01\x01"
        for data in (unpacked, packed, unpacked + packed):
            got = decode(_NUMBERS, data)
            self.assertEqual(got["values"][:2], [1, 127])
            self.assertEqual(got["flags"][0], True)
        self.assertEqual(
            encode(_NUMBERS, {"values": [1, 127], "flags": [True]}), packed
        )
        self.assertEqual(
            decode(_NUMBERS, encode(_NUMBERS, {"values": [-1]}))["values"], [-1]
        )

    def test_int64_range(self) -> None:
        """int64 extremes round-trip; wide values are refused on encode."""
        for value in (-(2**63), 2**63 - 1, -1):
            self.assertEqual(
                decode(_NUMBERS, encode(_NUMBERS, {"big": value}))["big"], value
            )
        self.assertRaises(WireError, encode, _NUMBERS, {"big": 2**63})
        self.assertRaises(WireError, encode, schema.PTY, {"cols": -1})
        self.assertRaises(WireError, encode, schema.EXIT_EVENT, {"exit_code": 2**31})

    def test_encode_type_errors(self) -> None:
        """Wrong types, unknown keys and two oneof members are refused."""
        for bad in (
            {"exit_code": "1"},
            {"exit_code": True},
            {"stdout": "text"},
            {"nope": 1},
        ):
            self.assertRaises(WireError, encode, schema.EXECUTE_RESPONSE, bad)
        self.assertRaises(
            WireError, encode, schema.START_RESPONSE, {"stdout": b"", "stderr": b""}
        )
        self.assertRaises(WireError, encode, schema.PROCESS_CONFIG, {"command": "ls"})
        self.assertRaises(
            WireError, encode, schema.PROCESS_CONFIG, {"env_vars": {"A": 1}}
        )

    def test_malformed(self) -> None:
        """Every kind of broken input raises WireError with where it broke."""
        cases = {
            b"\x08": "truncated varint",
            b"\x08\xff": "truncated varint",
            b"\x08" + b"\xff" * 10 + b"\x01": "longer than ten bytes",
            b"\x22\x05ab": "runs past the end",
            b"\x0a\x01": "runs past the end",
            b"\x0d\x00\x00\x00\x00": "wire type 5",
            b"\x22\x02\xc3\x28": "invalid UTF-8",
            b"\x00": "field number 0",
            b"\x5b": "unsupported wire type 3",
            b"\x62\x09abc": "runs past the end",
        }
        for data, text in cases.items():
            with self.assertRaises(WireError, msg=repr(data)) as caught:
                decode(_NUMBERS, data)
            self.assertIn(text, str(caught.exception), repr(data))
            self.assertTrue(str(caught.exception).startswith("t.Numbers"))

    def test_malformed_nested(self) -> None:
        """The error names the field path; a map entry's bytes are checked too."""
        with self.assertRaises(WireError) as caught:
            decode(schema.EXECUTE_REQUEST, b"\x0a\x04\x12\x02\x0a\x05")
        self.assertIn(
            "process.v1.ExecuteRequest.config.env_vars", str(caught.exception)
        )
        with self.assertRaises(WireError) as caught:
            decode(schema.EXECUTE_REQUEST, b"\x0a\x06\x12\x04\x0a\x02\xff\xfe")
        self.assertIn("invalid UTF-8", str(caught.exception))
        with self.assertRaises(WireError):
            decode(schema.EXECUTE_REQUEST, b"\x0a\x02\x08\x01")

    def test_depth_bound(self) -> None:
        """A message nested past MAX_DEPTH is refused, not recursed into."""
        node = message("t.Node", field(2, "leaf", Kind.INT32))
        for _ in range(MAX_DEPTH + 2):
            node = message("t.Node", field(1, "child", Kind.MESSAGE, message=node))
        nested = b""
        for _ in range(MAX_DEPTH + 2):
            nested = b"\x0a" + _len(nested) + nested
        with self.assertRaises(WireError) as caught:
            decode(node, nested)
        self.assertIn("nested deeper", str(caught.exception))

    def test_oneof_helper(self) -> None:
        """Fields put in a oneof have presence."""
        schema_ = message(
            "t.O", oneof("x", field(1, "a", Kind.INT32), field(2, "b", Kind.STRING))
        )
        self.assertEqual(decode(schema_, b""), {})
        self.assertEqual(decode(schema_, b"\x08\x00"), {"a": 0})
        self.assertEqual(encode(schema_, {"a": 0}), b"\x08\x00")


class FixedWidthTests(SynchronousTestCase):
    """``fixed32`` and ``fixed64``, checked against OpenTelemetry's generated ``Span``."""

    def setUp(self) -> None:
        try:
            from opentelemetry.proto.trace.v1 import trace_pb2
        except ImportError:  # pragma: no cover - the dev extra installs it
            raise SkipTest("opentelemetry-proto is not installed") from None
        self.pb = trace_pb2
        self.schema = message(
            "Span",
            field(5, "name", Kind.STRING),
            field(7, "start", Kind.FIXED64),
            field(16, "flags", Kind.FIXED32),
        )

    def test_both_ways(self) -> None:
        big = (1 << 64) - 1
        ours = encode(self.schema, {"name": "s", "start": big, "flags": 0x301})
        theirs = self.pb.Span.FromString(ours)
        self.assertEqual(
            (theirs.name, theirs.start_time_unix_nano, theirs.flags), ("s", big, 0x301)
        )
        back = self.pb.Span(name="t", start_time_unix_nano=12345, flags=7)
        self.assertEqual(
            decode(self.schema, back.SerializeToString()),
            {"name": "t", "start": 12345, "flags": 7},
        )
        self.assertEqual(decode(self.schema, b""), {"name": "", "start": 0, "flags": 0})

    def test_bounds_and_truncation(self) -> None:
        with self.assertRaises(WireError):
            encode(self.schema, {"flags": 1 << 32})
        with self.assertRaises(WireError):
            encode(self.schema, {"start": -1})
        with self.assertRaises(WireError):
            decode(self.schema, b"\x39\x01\x02")
        # A fixed field read with a varint's wire type is refused, not misread.
        with self.assertRaises(WireError):
            decode(self.schema, b"\x38\x01")

    def test_packed_round_trip(self) -> None:
        schema_ = message("t.P", field(1, "xs", Kind.FIXED32, repeated=True))
        data = encode(schema_, {"xs": [1, 2, (1 << 32) - 1]})
        self.assertEqual(
            data, b"\x0a\x0c" + b"\x01\x00\x00\x00\x02\x00\x00\x00\xff\xff\xff\xff"
        )
        self.assertEqual(decode(schema_, data), {"xs": [1, 2, (1 << 32) - 1]})
        # Unpacked, as an older writer may send them.
        self.assertEqual(
            decode(schema_, b"\x0d\x05\x00\x00\x00\x0d\x06\x00\x00\x00"), {"xs": [5, 6]}
        )
        with self.assertRaises(WireError):
            decode(schema_, b"\x0a\x03\x01\x02\x03")


def _len(data: bytes) -> bytes:
    out = bytearray()
    n = len(data)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
