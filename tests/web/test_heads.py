"""
The one-pass request-head parser: what it reads from a buffer, what it
waits for, and every hostile head the daemon refuses (the same shapes as
the HTTP framing catalogue in ``tests/security/test_hostile_inputs.py``).
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.policy.defaults import MAX_HEAD_BYTES, MAX_HEADERS
from sandboxd.web.heads import LIMITS, Head, HeadError, HeadLimits, parse_head

GET = b"GET /health HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer t\r\n\r\n"


def head_with(*lines: bytes, request: bytes = b"POST /files/raw HTTP/1.1") -> bytes:
    """A head of ``request`` then ``Host`` and ``lines``."""
    return b"\r\n".join([request, b"Host: localhost", *lines]) + b"\r\n\r\n"


class ParseTests(SynchronousTestCase):
    """Heads the parser reads."""

    def parse(self, data: bytes, start: int = 0) -> Head:
        head = parse_head(data, start)
        assert head is not None
        return head

    def test_simple_get(self) -> None:
        """A GET's request line, fields by lower-cased name, no body, kept alive."""
        head = self.parse(GET)
        self.assertEqual(
            (head.method, head.target, head.version),
            (b"GET", b"/health", b"HTTP/1.1"),
        )
        self.assertEqual(
            head.fields,
            {b"host": [b"localhost"], b"authorization": [b"Bearer t"]},
        )
        self.assertEqual((head.length, head.chunked), (0, False))
        self.assertTrue(head.keep_alive)
        self.assertFalse(head.expect_continue)
        self.assertEqual(head.size, len(GET))

    def test_request_line_only(self) -> None:
        """A head with no header lines at all is read."""
        head = self.parse(b"GET / HTTP/1.0\r\n\r\n")
        self.assertEqual((head.target, head.fields, head.size), (b"/", {}, 18))
        self.assertFalse(head.keep_alive)

    def test_incomplete(self) -> None:
        """Every proper prefix of a head waits for more (None), never refuses."""
        for cut in range(len(GET)):
            self.assertIsNone(parse_head(GET[:cut]), cut)

    def test_body_and_pipelined_heads(self) -> None:
        """``size`` says where the body starts; ``start`` reads the next head."""
        first = head_with(b"Content-Length: 3") + b"abc"
        data = first + GET
        head = self.parse(data)
        self.assertEqual(head.length, 3)
        self.assertEqual(data[head.size : head.size + 3], b"abc")
        second = self.parse(data, head.size + 3)
        self.assertEqual(second.target, b"/health")
        self.assertEqual(head.size + 3 + second.size, len(data))

    def test_values_stripped_and_repeated(self) -> None:
        """Values lose surrounding spaces and tabs; a repeated name keeps every value in order."""
        head = self.parse(head_with(b"X-A:  one \t", b"x-a:two", b"X-B:"))
        self.assertEqual(head.fields[b"x-a"], [b"one", b"two"])
        self.assertEqual(head.fields[b"x-b"], [b""])

    def test_one_leading_empty_line(self) -> None:
        """One empty line before the request line is skipped and counted in ``size``."""
        head = self.parse(b"\r\n" + GET)
        self.assertEqual((head.target, head.size), (b"/health", len(GET) + 2))

    def test_chunked(self) -> None:
        """``chunked`` (any case, padded) frames the body; ``identity`` is ignored."""
        for value in (b"chunked", b"CHUNKED", b" chunked\t"):
            head = self.parse(head_with(b"Transfer-Encoding: " + value))
            self.assertEqual((head.length, head.chunked), (None, True), value)
        head = self.parse(
            head_with(b"Transfer-Encoding: identity", b"Content-Length: 2")
        )
        self.assertEqual((head.length, head.chunked), (2, False))

    def test_content_length_forms(self) -> None:
        """Leading zeros are fine; a length past every bound stays beyond every bound."""
        self.assertEqual(self.parse(head_with(b"Content-Length: 007")).length, 7)
        huge = self.parse(head_with(b"Content-Length: " + b"9" * 5000)).length
        assert huge is not None
        self.assertGreater(huge, 10**20)
        self.assertEqual(
            self.parse(head_with(b"Content-Length: 100000000000000000000000")).length,
            10**23,
        )

    def test_connection_close(self) -> None:
        """``close`` among the Connection options ends keep-alive; HTTP/1.0 never keeps it."""
        for value in (b"close", b"Close", b"keep-alive, close", b"close, te"):
            self.assertFalse(self.parse(head_with(b"Connection: " + value)).keep_alive)
        self.assertTrue(self.parse(head_with(b"Connection: keep-alive")).keep_alive)
        self.assertFalse(
            self.parse(head_with(request=b"GET / HTTP/1.0")).keep_alive,
        )

    def test_expect_continue(self) -> None:
        """``Expect: 100-continue`` is noticed on HTTP/1.1 only."""
        self.assertTrue(self.parse(head_with(b"Expect: 100-Continue")).expect_continue)
        self.assertFalse(
            self.parse(
                head_with(b"Expect: 100-continue", request=b"POST / HTTP/1.0")
            ).expect_continue
        )

    def test_at_the_limits(self) -> None:
        """Exactly the allowed header count and head size are read."""
        many = [b"X-H%d: v" % i for i in range(MAX_HEADERS - 1)]
        self.assertEqual(len(self.parse(head_with(*many)).fields), MAX_HEADERS)
        line = b"GET / HTTP/1.1"
        filler = b"X: " + b"a" * (MAX_HEAD_BYTES - len(line) - 3)
        self.assertIsNotNone(parse_head(line + b"\r\n" + filler + b"\r\n\r\n"))

    def test_other_targets_and_methods(self) -> None:
        """``OPTIONS *``, ``CONNECT host:port`` and any token method parse (the pipeline decides)."""
        for line in (
            b"OPTIONS * HTTP/1.1",
            b"CONNECT localhost:22 HTTP/1.1",
            b"get /x HTTP/1.1",
            b"PROPFIND /x HTTP/1.1",
        ):
            self.assertEqual(self.parse(line + b"\r\n\r\n").method, line.split()[0])


class RefusalTests(SynchronousTestCase):
    """Heads the parser refuses, each with a 400."""

    def assertRefused(self, data: bytes, limits: HeadLimits = LIMITS) -> None:
        with self.assertRaises(HeadError, msg=repr(data[:80])) as caught:
            parse_head(data, 0, limits)
        self.assertEqual(caught.exception.status, 400)
        self.assertTrue(caught.exception.reason)

    def test_content_length_with_transfer_encoding(self) -> None:
        """Content-Length and chunked together, either order."""
        self.assertRefused(
            head_with(b"Content-Length: 5", b"Transfer-Encoding: chunked")
        )
        self.assertRefused(
            head_with(b"Transfer-Encoding: chunked", b"Content-Length: 5")
        )

    def test_transfer_encoding_spellings(self) -> None:
        """Codings other than chunked, a list, chunked twice, and a folded one."""
        for te in (
            b"Transfer-Encoding: gzip",
            b"Transfer-Encoding: gzip, chunked",
            b"Transfer-Encoding: chunked, chunked",
            b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
            b"Transfer-Encoding: x\r\n chunked",
        ):
            self.assertRefused(head_with(te))

    def test_ambiguous_content_length(self) -> None:
        """Duplicated, listed, signed, hex, underscored, non-ASCII or junk lengths."""
        for cl in (
            b"Content-Length: 3\r\nContent-Length: 3",
            b"Content-Length: 3\r\nContent-Length: 4",
            b"Content-Length: 3, 3",
            b"Content-Length: +3",
            b"Content-Length: -3",
            b"Content-Length: 0x3",
            b"Content-Length: 1_0",
            "Content-Length: \u0663".encode(),
            b"Content-Length: 3x",
            b"Content-Length: 3 3",
            b"Content-Length: ",
        ):
            self.assertRefused(head_with(cl))

    def test_bare_cr_lf_and_nul(self) -> None:
        """A bare CR or LF or a NUL, in a value, a name or the request line."""
        for header in (
            b"Foo: x\rContent-Length: 44",
            b"Foo: x\nContent-Length: 44",
            b"Foo: x\x00y",
            b"X-Access-Token: a\x00b",
            b"Fo\ro: x",
        ):
            self.assertRefused(head_with(header))
        self.assertRefused(b"GET /a\x00b HTTP/1.1\r\n\r\n")
        self.assertRefused(b"GET /a\rb HTTP/1.1\r\n\r\n")

    def test_obs_fold(self) -> None:
        """A continuation line, folding an auth, Host, length or other value."""
        for folded in (
            b"X-Access-Token: a\r\n b",
            b"Host: localhost\r\n evil.example",
            b"Content-Length: 1\r\n 0",
            b"X-Other: a\r\n\tb",
            b"X-Other: a\r\n b: c",
        ):
            self.assertRefused(head_with(folded))

    def test_malformed_request_lines(self) -> None:
        """Missing parts, extra spaces, bad methods, targets and versions."""
        for line in (
            b"",
            b"GET",
            b"GET /",
            b"GET  / HTTP/1.1",
            b"GET / HTTP/1.1 ",
            b" GET / HTTP/1.1",
            b"G(T / HTTP/1.1",
            b"GET / HTTP/2.0",
            b"GET / http/1.1",
            b"GET / HTTP/1.1x",
            b"GET /\xff HTTP/1.1",
        ):
            self.assertRefused(line + b"\r\nHost: x\r\n\r\n")
        self.assertRefused(b"\r\n\r\nGET / HTTP/1.1\r\n\r\n")

    def test_tls_handshake_refused_at_once(self) -> None:
        """
        The first byte of a TLS ClientHello is refused on its own, saying
        the port speaks plain HTTP: waiting for a head end would hold an
        ``https://`` client until the head deadline.
        """
        with self.assertRaises(HeadError) as caught:
            parse_head(b"\x16")
        self.assertIn("plain HTTP", caught.exception.reason)
        self.assertRaises(HeadError, parse_head, b"\x16\x03\x01\x02\x00\x01")

    def test_malformed_header_lines(self) -> None:
        """No colon, an empty name, whitespace before the colon, a non-token name."""
        for line in (
            b"Host",
            b": x",
            b"Host : x",
            b"Ho st: x",
            b"H\xe9: x",
            b"X(y): z",
        ):
            self.assertRefused(b"GET / HTTP/1.1\r\n" + line + b"\r\n\r\n")

    def test_cached_name_still_needs_a_colon(self) -> None:
        """A name seen before is still refused without its colon."""
        self.assertIsNotNone(parse_head(GET))
        self.assertRefused(b"GET / HTTP/1.1\r\nHost\r\n\r\n")

    def test_oversized(self) -> None:
        """Too many headers, one huge header or target, complete or still arriving."""
        many = b"".join(b"X-H%d: v\r\n" % i for i in range(600))
        self.assertRefused(b"GET / HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
        self.assertRefused(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 20480 + b"\r\n\r\n")
        self.assertRefused(b"GET /?q=" + b"a" * 20480 + b" HTTP/1.1\r\n\r\n")
        self.assertRefused(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 20480)
        self.assertRefused(b"GET /?q=" + b"a" * 20480)
        self.assertRefused(
            head_with(*[b"X-H%d: v" % i for i in range(MAX_HEADERS)]),
        )

    def test_own_limits(self) -> None:
        """A caller's tighter limits are the ones applied."""
        tight = HeadLimits(max_headers=1, max_bytes=64)
        self.assertIsNotNone(parse_head(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0, tight))
        self.assertRefused(b"GET / HTTP/1.1\r\nHost: x\r\nA: b\r\n\r\n", tight)
        self.assertRefused(b"GET /" + b"a" * 100 + b" HTTP/1.1\r\n\r\n", tight)
