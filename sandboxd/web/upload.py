# -*- test-case-name: tests.web.test_upload -*-
"""
Decoding the ``content_base64`` of an upload body as it arrives.

The base64 upload routes take ``{"path": ..., "content_base64": "<MBs>"}``.
Parsing that whole document and then decoding the string holds the body
three times (raw bytes, the str, the decoded bytes) and does all the work
after the last byte arrives.  :class:`UploadBody` instead finds the
top-level ``content_base64`` string near the start of the body and decodes
it chunk by chunk while the rest of the body is still on the wire; the
small remainder of the document is parsed as JSON with that value left
empty.  Anything unusual (the key late in the body, escapes other than
``\\/``) falls back to buffering the body and parsing it whole.
"""

from __future__ import annotations

import binascii
import io
from typing import Any

import pybase64

from sandboxd.errors import ApiError, bad_request, invalid_json, payload_too_large
from sandboxd.policy.defaults import UPLOAD_HEAD_LIMIT
from sandboxd.web.jsonbody import parse_object

_KEY = b"content_base64"
_WHITESPACE = b" \t\r\n"


def _invalid_base64() -> ApiError:
    return bad_request("'content_base64' is not valid base64")


class _HeadScanner:
    """
    Finds where the value of the top-level ``content_base64`` key starts.

    A tiny JSON tokenizer over the head of the body: it tracks strings
    (with escapes) and nesting so that a key of that name inside a nested
    object, or a string value spelled like it, is not mistaken for it.
    """

    def __init__(self) -> None:
        self.pos = 0
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.string_start = 0
        self.last_key_match = False
        self.expect_value = False

    def scan(self, buf: bytes | bytearray) -> int | None:
        """Index of the opening quote of the value, or None (not yet / never)."""
        i = self.pos
        n = len(buf)
        while i < n:
            c = buf[i]
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == 0x5C:  # backslash
                    self.escape = True
                elif c == 0x22:  # closing quote
                    self.in_string = False
                    self.last_key_match = (
                        self.depth == 1 and buf[self.string_start : i] == _KEY
                    )
                    i += 1
                    continue
                i += 1
                continue
            if c in _WHITESPACE:
                i += 1
                continue
            if self.expect_value:
                self.pos = i
                return i if c == 0x22 else -1
            if c == 0x22:
                self.in_string = True
                self.string_start = i + 1
            elif c in b"{[":
                self.depth += 1
                self.last_key_match = False
            elif c in b"}]":
                self.depth -= 1
                self.last_key_match = False
            elif c == 0x3A and self.last_key_match:  # ':' after the key
                self.expect_value = True
            else:
                self.last_key_match = False
            i += 1
        self.pos = i
        return None


class UploadBody:
    """
    A request body buffer for upload routes (see the module docstring).

    :param max_bytes: the decoded payload's cap (413 as soon as it is passed).
    :param setting: the policy key of that cap, named in the 413.
    """

    def __init__(self, max_bytes: int, setting: str | None = None) -> None:
        self.max_bytes = max_bytes
        self.setting = setting
        self._head = bytearray()
        self._scanner = _HeadScanner()
        self._mode = "head"  # head -> value -> tail, or buffered
        self._fallback = io.BytesIO()
        self._carry = b""
        self._payload = bytearray()
        self._tail = bytearray()
        self.error: ApiError | None = None

    def write(self, data: bytes) -> None:
        """Take the next chunk of the body."""
        if self.error is not None:
            return
        if self._mode == "buffered":
            self._fallback.write(data)
        elif self._mode == "tail":
            self._tail += data
        elif self._mode == "value":
            self._value(data)
        else:
            self._head += data
            start = self._scanner.scan(self._head)
            if start is None:
                if len(self._head) > UPLOAD_HEAD_LIMIT:
                    self._buffer_everything()
                return
            if start < 0:
                self._buffer_everything()
                return
            rest = bytes(self._head[start + 1 :])
            del self._head[start:]
            self._mode = "value"
            self._value(rest)

    def _buffer_everything(self) -> None:
        self._mode = "buffered"
        self._fallback.write(self._head)
        self._head = bytearray()

    def _value(self, data: bytes) -> None:
        end = data.find(b'"')
        segment = data if end < 0 else data[:end]
        self._decode(segment, final=end >= 0)
        if end >= 0 and self.error is None:
            self._mode = "tail"
            self._tail += data[end + 1 :]

    def _decode(self, segment: bytes, final: bool) -> None:
        text = self._carry + segment
        if b"\\" in text:
            if text.endswith(b"\\") and not final:
                text, self._carry = text[:-1], b"\\"
            else:
                self._carry = b""
            text = text.replace(b"\\/", b"/")
            if b"\\" in text:
                self.error = _invalid_base64()
                return
        else:
            self._carry = b""
        usable = len(text) if final else len(text) - len(text) % 4
        if not final:
            self._carry = text[usable:] + self._carry
        if usable:
            try:
                self._payload += pybase64.b64decode(
                    memoryview(text)[:usable], validate=True
                )
            except binascii.Error:
                self.error = _invalid_base64()
                return
        if final and self._carry:
            self.error = _invalid_base64()
            return
        if len(self._payload) > self.max_bytes:
            self.error = payload_too_large(
                self.max_bytes,
                message=f"the file is over the limit of {self.max_bytes} bytes",
                setting=self.setting,
            )

    def result(self) -> tuple[dict[str, Any], bytearray | None]:
        """
        The parsed body and the decoded payload (None when not streamed).

        :raises ApiError: 400 ``invalid_json``/``invalid_param`` or 413.
        """
        if self.error is not None:
            raise self.error
        if self._mode == "value":
            raise invalid_json()  # the string never ended
        if self._mode == "tail":
            text = bytes(self._head) + b'""' + bytes(self._tail)
            payload: bytearray | None = self._payload
        else:
            text = (
                self._fallback.getvalue()
                if self._mode == "buffered"
                else bytes(self._head)
            )
            payload = None
        return parse_object(text), payload
