"""Connect framing and the mapping of sandboxd's errors to Connect codes."""

from __future__ import annotations

import json
import math
import stat

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.e2b import codeinterp, connect, door
from sandboxd.e2b.entries import go_mode_string
from sandboxd.errors import (
    ApiError,
    endpoint_disabled,
    missing_scope,
    no_thread,
    payload_too_large,
    unauthorized,
    unavailable,
)


class EnvelopeTests(SynchronousTestCase):
    """Envelopes as the Connect protocol lays them out."""

    def test_round_trip(self) -> None:
        """Messages come back in order; the end-of-stream envelope stops the list."""
        body = (
            connect.envelope({"a": 1})
            + connect.envelope({"b": 2})
            + connect.end_stream()
        )
        self.assertEqual(connect.split_envelopes(body, 1024), [{"a": 1}, {"b": 2}])

    def test_end_stream_carries_the_error(self) -> None:
        """The end-of-stream message is flag 2 with {"error": {code, message}}."""
        data = connect.end_stream(unauthorized())
        self.assertEqual(data[0], 2)
        self.assertIn(b'"code":"unauthenticated"', data)

    def test_truncated_and_compressed_are_malformed(self) -> None:
        """A short envelope or a compressed one is 400 malformed_request."""
        for body in (
            b"\x00\x00\x00",
            b"\x00\x00\x00\x00\x09{}",
            b"\x01\x00\x00\x00\x02{}",
        ):
            error = self.assertRaises(ApiError, connect.split_envelopes, body, 1024)
            self.assertEqual((error.status, error.code), (400, "malformed_request"))

    def test_oversized_message(self) -> None:
        """An envelope announcing more than the cap is 413, before it is read."""
        error = self.assertRaises(
            ApiError, connect.split_envelopes, b"\x00\x00\x10\x00\x00", 1024
        )
        self.assertEqual((error.status, error.code), (413, "payload_too_large"))


class NotFiniteTests(SynchronousTestCase):
    """No answer of the door carries ``NaN`` or ``Infinity``, which are not JSON."""

    def test_envelope_refuses(self) -> None:
        """An envelope of a non-finite number raises before a byte is made."""
        self.assertRaises(ValueError, connect.envelope, {"x": math.inf})

    def test_answer_bodies(self) -> None:
        """A REST or unary answer refuses it; a finite one is as before."""
        for kind in (door.REST, door.UNARY, door.CLIENT_STREAM):
            self.assertRaises(ValueError, door._encoded, kind, {"x": math.nan})
        self.assertEqual(door._encoded(door.REST, {"x": 0.5}), b'{"x": 0.5}')
        self.assertEqual(door._encoded(door.UNARY, {"x": 1e308}), b'{"x":1e+308}')

    def test_code_line(self) -> None:
        """
        An execution's line holding one becomes an error line saying where
        (the answer has begun); a line around it is untouched.
        """
        line = {"type": "result", "json": {"mean": math.nan}, "is_main_result": True}
        sent = json.loads(b"".join(codeinterp._line(line)), parse_constant=_no_constant)
        self.assertEqual((sent["type"], sent["name"]), ("error", "ValueError"))
        self.assertIn("the result line is not JSON: $.json.mean", sent["value"])
        self.assertEqual(
            b"".join(codeinterp._line({"type": "stdout", "text": "1.5"})),
            b'{"type":"stdout","text":"1.5"}',
        )


def _no_constant(name: str) -> None:
    raise ValueError(name)


class CodeTests(SynchronousTestCase):
    """Each §6 code becomes the nearest Connect code, with code and rule in the message."""

    def test_mapping(self) -> None:
        """The refusals a door meets most, mapped."""
        cases = [
            (unauthorized(), "unauthenticated"),
            (
                missing_scope("shell", "process:run", "endpoint:shell"),
                "permission_denied",
            ),
            (endpoint_disabled("shell", "policy:x", "is disabled"), "unimplemented"),
            (ApiError(404, "x", code="not_found"), "not_found"),
            (ApiError(409, "x", code="file_exists"), "already_exists"),
            (ApiError(429, "x", code="too_many_processes"), "resource_exhausted"),
            (ApiError(413, "x", code="payload_too_large"), "invalid_argument"),
            (payload_too_large(10), "invalid_argument"),
            (ApiError(408, "x", code="timeout"), "deadline_exceeded"),
            (ApiError(400, "x", code="invalid_path"), "invalid_argument"),
            (ApiError(507, "x", code="insufficient_storage"), "resource_exhausted"),
            (no_thread(), "resource_exhausted"),
            (unavailable("the browser is not installed"), "unavailable"),
        ]
        for error, code in cases:
            self.assertEqual(connect.error_json(error)["code"], code, error)

    def test_message_names_code_and_rule(self) -> None:
        """The message ends with (code: …, rule: …)."""
        error = missing_scope("shell", "process:run", "endpoint:shell")
        self.assertTrue(
            connect.error_message(error).endswith(
                "(code: missing_scope, rule: endpoint:shell)"
            )
        )

    def test_status_of_every_code(self) -> None:
        """Every Connect code has the HTTP status the protocol gives it."""
        self.assertEqual(connect.HTTP_STATUS[connect.ConnectCode.UNAUTHENTICATED], 401)
        self.assertEqual(connect.HTTP_STATUS[connect.ConnectCode.UNIMPLEMENTED], 501)
        self.assertEqual(set(connect.HTTP_STATUS), set(connect.ConnectCode))


class JsonMappingTests(SynchronousTestCase):
    """Protobuf's JSON mapping: either field spelling, base64 bytes, oneofs."""

    def test_either_spelling(self) -> None:
        """watcher_id and watcherId name the same field."""
        self.assertEqual(connect.string_field({"watcherId": "a"}, "watcher_id"), "a")
        self.assertEqual(connect.string_field({"watcher_id": "a"}, "watcher_id"), "a")

    def test_bytes_and_bad_types(self) -> None:
        """bytes fields decode standard or URL-safe base64; wrong types are 400."""
        self.assertEqual(connect.bytes_field({"stdin": "aGk="}, "stdin"), b"hi")
        self.assertEqual(connect.bytes_field({"stdin": "aGk"}, "stdin"), b"hi")
        self.assertRaises(ApiError, connect.bytes_field, {"stdin": "%%"}, "stdin")
        self.assertRaises(ApiError, connect.uint_field, {"pid": -1}, "pid")
        self.assertRaises(ApiError, connect.uint_field, {"pid": True}, "pid")
        self.assertEqual(connect.uint_field({"pid": "12"}, "pid"), 12)

    def test_oneof(self) -> None:
        """A oneof with two members set is refused."""
        self.assertEqual(connect.oneof({"pid": 3}, ("pid", "tag")), ("pid", 3))
        self.assertRaises(
            ApiError, connect.oneof, {"pid": 3, "tag": "x"}, ("pid", "tag")
        )


class ModeStringTests(SynchronousTestCase):
    """Go's FileMode.String(), which envd sends as ``permissions``."""

    def test_go_letters(self) -> None:
        """Files, directories, links and special bits as Go prints them."""
        self.assertEqual(go_mode_string(stat.S_IFREG | 0o644), "-rw-r--r--")
        self.assertEqual(go_mode_string(stat.S_IFDIR | 0o755), "drwxr-xr-x")
        self.assertEqual(go_mode_string(stat.S_IFLNK | 0o777), "Lrwxrwxrwx")
        self.assertEqual(go_mode_string(stat.S_IFDIR | 0o1777), "dtrwxrwxrwx")
        self.assertEqual(go_mode_string(stat.S_IFCHR | 0o666), "Dcrw-rw-rw-")


class MultipartTests(SynchronousTestCase):
    """The upload parser finds parts by their delimiters."""

    def test_parts_and_names(self) -> None:
        """Two parts, their file names, and bytes that look like delimiters inside."""
        from sandboxd.e2b.rest import split_multipart

        body = (
            b"--XyZ\r\n"
            b'Content-Disposition: form-data; name="file"; filename="a/b.txt"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\n"
            b"one\r\n--XyZnot-a-delimiter\r\n"
            b"--XyZ\r\n"
            b'Content-Disposition: form-data; name="file"; filename="c.bin"\r\n\r\n'
            b"\x00\xff"
            b"\r\n--XyZ--\r\n"
        )
        parts = split_multipart(b"XyZ", body)
        self.assertEqual(
            [(n, bytes(d)) for n, d in parts],
            [("a/b.txt", b"one\r\n--XyZnot-a-delimiter"), ("c.bin", b"\x00\xff")],
        )

    def test_malformed(self) -> None:
        """No delimiter, or a part never closed, is 400."""
        from sandboxd.e2b.rest import split_multipart

        for body in (b"nothing", b"--XyZ\r\nContent-Disposition: x\r\n\r\nopen"):
            error = self.assertRaises(ApiError, split_multipart, b"XyZ", body)
            self.assertEqual(error.status, 400)


class OptionTests(SynchronousTestCase):
    """``--e2b-port`` on twistd's and ``sandboxd serve``'s command line."""

    def test_e2b_port_option(self) -> None:
        """A number becomes an endpoint on --host; absent, the door has no port."""
        import os

        from sandboxd.daemon.tap import Options

        base = self.mktemp()
        os.makedirs(base)
        options = Options()
        options.parseOptions(
            ["--host", "127.0.0.1", "--base-dir", base, "--e2b-port", "49983"]
        )
        self.assertEqual(options.settings().e2b_port, "tcp:49983:interface=127.0.0.1")
        options = Options()
        options.parseOptions(["--base-dir", base])
        self.assertIsNone(options.settings().e2b_port)
