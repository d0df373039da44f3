"""
The app's response head read once for the browser: the lines the rules
leave alone pass as sent, the framing is read, and the rules hold.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.preview.answer import (
    NotHttp,
    Rules,
    _read_lines,
    _read_plain,
    read_answer,
)


class Preview:
    """A preview's rules, as the exchange gives them."""

    rules = Rules("3000.localhost", 3000, "http://3000.localhost:9002", "")


RULES = Preview()


def head(*lines: str, status: str = "HTTP/1.1 200 OK") -> bytes:
    return "\r\n".join([status, *lines]).encode("latin-1")


class ReadAnswerTests(SynchronousTestCase):
    """What the browser is sent of an app's head."""

    def test_lines_pass_as_sent(self) -> None:
        """Ordinary lines keep their bytes and order; hop-by-hop ones go."""
        answer = read_answer(
            head(
                "content-TYPE:  text/html",
                "Keep-Alive: timeout=5",
                "Connection: keep-alive",
                "X-A: 1",
                "Content-Length: 5",
            ),
            RULES,
        )
        self.assertEqual(
            answer.lines,
            [b"content-TYPE:  text/html", b"X-A: 1", b"Content-Length: 5"],
        )
        self.assertEqual((answer.code, answer.length, answer.close), (200, 5, False))

    def test_framings(self) -> None:
        """
        Chunked (with a length too: the length dropped), to the close,
        ``Connection: close``, HTTP/1.0, and what ``Connection`` lists.
        """
        both = read_answer(
            head("Content-Length: 3", "Transfer-Encoding: chunked"), RULES
        )
        self.assertEqual((both.chunked, both.length, both.lines), (True, None, []))
        gzip = read_answer(head("Transfer-Encoding: gzip"), RULES)
        self.assertTrue(gzip.close)
        closing = read_answer(head("Connection: close, X-Secret", "X-Secret: 1"), RULES)
        self.assertEqual((closing.close, closing.lines), (True, []))
        old = read_answer(head(status="HTTP/1.0 200 OK"), RULES)
        self.assertTrue(old.close)
        kept = read_answer(
            head("Connection: keep-alive", status="HTTP/1.0 200 OK"), RULES
        )
        self.assertFalse(kept.close)

    def test_cookies_and_location(self) -> None:
        """Our cookie and a wider one dropped; the app's own URL rewritten."""
        answer = read_answer(
            head(
                "Set-Cookie: a=1; Path=/",
                "Set-Cookie: sbx_p_3000=stolen",
                "Set-Cookie: w=1; Domain=localhost",
                "Location: http://localhost:3000/next?x=1",
            ),
            RULES,
        )
        self.assertEqual(
            answer.lines,
            [
                b"Set-Cookie: a=1; Path=/",
                b"Location: http://3000.localhost:9002/next?x=1",
            ],
        )

    def test_bare_line_breaks_become_spaces(self) -> None:
        """A bare LF or CR inside a value cannot start a line at the browser."""
        answer = read_answer(
            b"HTTP/1.1 200 OK\r\nX-A: 1\nSet-Cookie: evil=1\r\nX-B: 2\r3", RULES
        )
        self.assertEqual(answer.lines, [b"X-A: 1 Set-Cookie: evil=1", b"X-B: 2 3"])

    def test_refused(self) -> None:
        """Not HTTP, a line without a colon, a bad or a second different length."""
        for raw in (
            b"SSH-2.0-OpenSSH_9.2",
            b"HTTP/1.1 abc OK",
            head("no colon"),
            head(" X-A: 1"),
            head("Content-Length: x"),
            head("Content-Length: 1", "Content-Length: 2"),
        ):
            with self.assertRaises(NotHttp, msg=raw):
                read_answer(raw, RULES)
        same = read_answer(head("Content-Length: 2", "Content-Length: 2"), RULES)
        self.assertEqual((same.length, same.lines), (2, [b"Content-Length: 2"]))

    def test_both_readings_agree(self) -> None:
        """
        The plain head's quick reading gives what reading it line by line
        gives, on heads with and without the lines the rules act on.
        """
        heads = [
            head(),
            head("Server: nginx", "Content-Length: 1024", "Connection: keep-alive"),
            head("Transfer-Encoding: chunked", "X-A: 1", "TE: trailers"),
            head("Set-Cookie: a=1", "set-cookie: sbx_p_1=x", "X-B: 2"),
            head("Location: http://127.0.0.1:3000/", "Keep-Alive: 5", "Upgrade: h2c"),
            head("Location: /x", "Content-Length: 0", status="HTTP/1.0 302 Found"),
            head("X-Empty:", "Connection: close", "Trailer: x", "Vary: *"),
        ]
        for raw in heads:
            quick = _read_plain(raw, RULES)
            assert quick is not None, raw
            slow = _read_lines(raw, RULES)
            self.assertEqual(
                (quick.code, quick.block, quick.length, quick.chunked, quick.close),
                (slow.code, slow.block, slow.length, slow.chunked, slow.close),
                raw,
            )
