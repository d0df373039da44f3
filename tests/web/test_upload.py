"""
Streaming decode of upload bodies (sandboxd.web.upload): the result must be
exactly what parsing the whole body and decoding the string would give,
for every way the body can be cut into chunks.
"""

from __future__ import annotations

import base64
import json
import os

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import ApiError
from sandboxd.policy.defaults import UPLOAD_HEAD_LIMIT
from sandboxd.web.upload import UploadBody


def feed(body: bytes, size: int, cap: int = 10**9) -> UploadBody:
    upload = UploadBody(cap)
    for i in range(0, len(body), size):
        upload.write(body[i : i + size])
    return upload


class UploadBodyTests(SynchronousTestCase):
    """Equivalence with json.loads + b64decode, and the refusals."""

    def test_every_chunking(self) -> None:
        """Chunks of 1..17 bytes give the same body and payload."""
        data = os.urandom(300)
        body = json.dumps(
            {
                "path": "a/b.bin",
                "content_base64": base64.b64encode(data).decode(),
                "overwrite": False,
            }
        ).encode()
        for size in range(1, 18):
            parsed, payload = feed(body, size).result()
            self.assertEqual(
                parsed, {"path": "a/b.bin", "content_base64": "", "overwrite": False}
            )
            self.assertEqual(payload, data, size)

    def test_escaped_slashes(self) -> None:
        """A JSON encoder that writes \\/ still decodes right, even split after the backslash."""
        data = bytes(range(256)) * 3
        text = base64.b64encode(data).decode().replace("/", "\\/")
        body = ('{"path": "x", "content_base64": "' + text + '"}').encode()
        for size in (1, 2, 3, 7, 64):
            self.assertEqual(feed(body, size).result()[1], data)

    def test_nested_key_and_key_as_value_are_not_it(self) -> None:
        """Only the top-level key counts; the value of another key spelled alike is skipped."""
        inner = base64.b64encode(b"nested").decode()
        real = base64.b64encode(b"real").decode()
        body = json.dumps(
            {
                "path": "content_base64",
                "meta": {"content_base64": inner},
                "content_base64": real,
            }
        ).encode()
        parsed, payload = feed(body, 3).result()
        self.assertEqual(payload, b"real")
        self.assertEqual(parsed["meta"], {"content_base64": inner})
        self.assertEqual(parsed["path"], "content_base64")

    def test_late_key_falls_back(self) -> None:
        """A key past the head limit still gives the right payload (parsed whole)."""
        data = b"late"
        body = json.dumps(
            {
                "padding": "x" * (2 * UPLOAD_HEAD_LIMIT),
                "content_base64": base64.b64encode(data).decode(),
            }
        ).encode()
        for size in (1024, 4096):
            parsed, payload = feed(body, size).result()
            if size == 1024:
                self.assertIsNone(payload)
            got = (
                payload
                if payload is not None
                else base64.b64decode(parsed["content_base64"])
            )
            self.assertEqual(got, data)

    def test_non_string_value_falls_back(self) -> None:
        """A non-string value is left for the handler to refuse."""
        parsed, payload = feed(b'{"path": "x", "content_base64": 5}', 2).result()
        self.assertEqual((parsed["content_base64"], payload), (5, None))

    def test_invalid_base64(self) -> None:
        """Bad characters, bad padding and other escapes are 400 invalid_param."""
        for value in ("ab!d", "abc", "a\\u0041bc", "ab\\nc"):
            body = ('{"content_base64": "' + value + '"}').encode()
            with self.assertRaises(ApiError) as cm:
                feed(body, 2).result()
            self.assertEqual(cm.exception.code, "invalid_param", value)

    def test_over_cap(self) -> None:
        """A payload over max_bytes is 413 as soon as it passes the cap."""
        body = json.dumps(
            {"content_base64": base64.b64encode(b"x" * 100).decode()}
        ).encode()
        upload = feed(body, 8, cap=50)
        with self.assertRaises(ApiError) as cm:
            upload.result()
        self.assertEqual(cm.exception.status, 413)

    def test_broken_json(self) -> None:
        """An unterminated string or broken JSON is 400 invalid_json; empty is {}."""
        for body in (b'{"content_base64": "abcd', b'{"content_base64": "abcd"', b"[1]"):
            with self.assertRaises(ApiError) as cm:
                feed(body, 3).result()
            self.assertEqual(cm.exception.code, "invalid_json", body)
        self.assertEqual(feed(b"", 1).result(), ({}, None))

    def test_duplicate_content_key(self) -> None:
        """A second content_base64 (or any repeated key) is 400 invalid_json, never 'last wins'."""
        body = b'{"path": "x", "content_base64": "YWJj", "content_base64": "ZGVm"}'
        with self.assertRaises(ApiError) as cm:
            feed(body, 5).result()
        self.assertEqual(cm.exception.code, "invalid_json")
