"""
Request bodies are strict UTF-8 JSON (RFC 8259 §8.1, SPEC §3 step 6), and an
error answer means nothing happened (issue 22, item 1).
"""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import ApiError
from sandboxd.web.jsonbody import json_bytes, line_safe, parse_object
from sandboxd.web.sse import frame
from tests.helpers import DaemonTestCase


class ParseObjectTests(SynchronousTestCase):
    """What :func:`parse_object` refuses as 400 invalid_json."""

    def refused(self, raw: bytes) -> None:
        with self.assertRaises(ApiError) as cm:
            parse_object(raw)
        self.assertEqual(
            (cm.exception.status, cm.exception.code), (400, "invalid_json")
        )

    def test_utf16_and_utf32_refused(self) -> None:
        """A body in UTF-16 or UTF-32 (with or without a BOM) is refused, never guessed."""
        text = '{"command": "echo hi"}'
        for codec in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"):
            self.refused(text.encode(codec))

    def test_utf8_bom_skipped(self) -> None:
        """
        A UTF-8 byte order mark in front of the body is skipped, as RFC 8259
        §8.1 lets a parser do and the seed does; one anywhere else, or two,
        is still refused.
        """
        self.assertEqual(parse_object(b'\xef\xbb\xbf{"a": 1}'), {"a": 1})
        self.assertEqual(parse_object(b"\xef\xbb\xbf"), {})
        self.refused(b'\xef\xbb\xbf\xef\xbb\xbf{"a": 1}')
        self.refused(b' \xef\xbb\xbf{"a": 1}')

    def test_encoded_surrogate_refused(self) -> None:
        """A surrogate encoded as UTF-8 bytes (CESU-style ``\\xed\\xa0\\x80``) is refused."""
        self.refused(b'{"command": "echo \xed\xa0\x80"}')

    def test_escaped_lone_surrogates_refused_anywhere(self) -> None:
        """A ``\\ud800``-style escape that is not half of a pair is refused in keys and nested values."""
        for raw in (
            rb'{"command": "echo \ud800"}',
            rb'{"path": "\udcff-acc.txt"}',
            rb'{"\ud800": 1}',
            rb'{"env": {"A\udfff": "x"}}',
            rb'{"a": [1, {"b": ["ok", "\udc00"]}]}',
            rb'{"a": "\ud800\ud800"}',
            rb'{"a": "\udc00\ud800"}',
        ):
            self.refused(raw)

    def test_pairs_and_escaped_backslashes_accepted(self) -> None:
        """A surrogate pair, and a literal backslash followed by ``ud800``, are fine."""
        self.assertEqual(parse_object(rb'{"a": "\ud83d\ude00"}'), {"a": "\U0001f600"})
        self.assertEqual(parse_object(rb'{"a": "\\ud800"}'), {"a": "\\ud800"})
        self.assertEqual(parse_object('{"a": "é ✓"}'.encode()), {"a": "é ✓"})


class AnswerEncodingTests(SynchronousTestCase):
    """Encoding an answer never fails on a string."""

    def test_json_bytes_with_surrogate(self) -> None:
        """A surrogate-escaped file name is sent as a JSON escape, not a 500."""
        data = json_bytes({"path": "\udcff-acc.txt", "ok": "é"})
        self.assertEqual(json.loads(data), {"path": "\udcff-acc.txt", "ok": "é"})
        data.decode("ascii")

    def test_json_bytes_stays_utf8(self) -> None:
        """Ordinary answers stay compact UTF-8 (no ``\\u`` escapes)."""
        self.assertEqual(json_bytes({"a": "é"}), '{"a":"é"}'.encode())

    def test_sse_frame_with_surrogate(self) -> None:
        """An SSE frame carrying a surrogate is escaped too."""
        data = frame("created", {"path": "\udcff"}, 3)
        self.assertEqual(data, b'id: 3\nevent: created\ndata: {"path":"\\udcff"}\n\n')


class LineFramedTests(SynchronousTestCase):
    """
    JSON sent as lines (SSE, NDJSON) never holds a character that
    ``str.splitlines`` ends a line at: httpx's ``iter_lines``, which E2B's
    SDKs and many other clients read streams with, would cut the line there.
    """

    #: What JSON leaves unescaped and ``splitlines`` splits at.
    SPLITTERS = "a\x85b\u2028c\u2029d"

    def test_line_safe(self) -> None:
        """The three are escaped, the same string to a JSON parser; ASCII and other text kept."""
        raw = json.dumps({"t": self.SPLITTERS + " é ✓"}, ensure_ascii=False).encode()
        safe = line_safe(raw)
        self.assertEqual(safe, '{"t": "a\\u0085b\\u2028c\\u2029d é ✓"}'.encode())
        self.assertEqual(json.loads(safe), json.loads(raw))
        self.assertEqual(len(safe.decode().splitlines()), 1)
        plain = b'{"t":"abc"}'
        self.assertIs(line_safe(plain), plain)

    def test_sse_frame(self) -> None:
        """An SSE frame's data line, small or a big chunk of output, stays one line."""
        for text in (self.SPLITTERS, self.SPLITTERS + "x" * 70_000):
            data = frame("stdout", {"text": text}, 4)
            lines = data.decode().splitlines()
            self.assertEqual(lines[:2], ["id: 4", "event: stdout"])
            self.assertEqual(len(lines), 4)  # the blank line ending the event
            self.assertEqual(
                json.loads(lines[2].removeprefix("data: ")), {"text": text}
            )


class DaemonBodyTests(DaemonTestCase):
    """What a client sees from the daemon."""

    @inlineCallbacks
    def post(self, path: str, raw: bytes) -> Any:
        reply = yield self.request(
            "POST", path, raw_body=raw, headers={"Content-Type": "application/json"}
        )
        return reply

    @inlineCallbacks
    def test_shell_surrogates_are_400(self) -> Any:
        """/shell with an encoded or an escaped lone surrogate is 400 invalid_json, not a 500."""
        for raw in (
            b'{"command": "echo \xed\xa0\x80"}',
            rb'{"command": "echo \ud800"}',
        ):
            reply = yield self.post("/shell", raw)
            self.assertEqual(
                (reply.status, reply.json()["code"]), (400, "invalid_json"), raw
            )

    @inlineCallbacks
    def test_upload_surrogate_writes_nothing(self) -> Any:
        """/upload to a surrogate path is 400 invalid_json, and no file appears."""
        before = set(os.listdir(self.base_dir))
        reply = yield self.post(
            "/upload", rb'{"path": "\udcff-acc.txt", "content_base64": "eA=="}'
        )
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_json"))
        self.assertEqual(set(os.listdir(self.base_dir)), before)

    @inlineCallbacks
    def test_utf8_bom_accepted(self) -> Any:
        """
        A body a Windows tool wrote with a UTF-8 byte order mark in front
        (PowerShell 5's ``Out-File``, then ``curl -d @file``) is taken, as
        on the seed (was: 400 invalid_json): the command runs, the upload
        lands.
        """
        bom = b"\xef\xbb\xbf"
        reply = yield self.post("/shell", bom + b'{"command": "echo with-bom"}')
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stdout"], "with-bom\n")
        reply = yield self.post(
            "/upload", bom + b'{"path": "bom.txt", "content_base64": "eA=="}'
        )
        self.assertEqual(reply.status, 200, reply.body)
        with open(os.path.join(self.base_dir, "bom.txt"), "rb") as f:
            self.assertEqual(f.read(), b"x")

    @inlineCallbacks
    def test_utf16_command_not_run(self) -> Any:
        """A UTF-16 body is 400 invalid_json and its command does not run."""
        marker = os.path.join(self.base_dir, "ran")
        body = json.dumps({"command": f"touch {marker}"}).encode("utf-16")
        reply = yield self.post("/shell", body)
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_json"))
        self.assertFalse(os.path.exists(marker))
