# -*- test-case-name: tests.routes.test_files -*-
"""
Streamed file bodies: a push producer that reads an fd a chunk at a time
and writes only while the client keeps up.

Memory per response is one chunk plus the transport's buffer, whatever the
file's size: the transport pauses the producer when its buffer fills and
resumes it once drained.  The same producer serves raw bytes
(``files_read_raw``, with a byte range) and base64 inside a JSON envelope
(``files_download_stream``); base64 chunks are whole multiples of 3 bytes so
their encodings concatenate.

Raw bytes to a plain TCP (or Unix) connection go by ``sendfile(2)``, from
the page cache to the socket with no copy through Python.  Twisted has no
call for it, so the producer uses the transport's own flow control: once
the socket is full it marks the transport's producer paused and asks it to
watch for writability, and the transport's drain wakes it up as it would
after a buffered write.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

import pybase64
from twisted.internet import tcp
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

from sandboxd.policy.defaults import STREAM_CHUNK_BYTES

log = Logger(namespace="sandboxd.files")

#: What a send meets when the client has gone (a reset, a closed socket):
#: a browser cancelling a download, ``curl | head``; routine, not a failure.
CLIENT_GONE_ERRNOS = frozenset(
    {errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN}
)


def b64_chunk(data: bytes) -> bytes:
    """Base64 of one chunk, no newline."""
    return pybase64.b64encode(data)


def _sendfile_transport(request: Any) -> Any:
    """
    The plain TCP or Unix transport under a twisted.web ``request``, or
    None (TLS, HTTP/2, tests' string transports): only there do the bytes
    on the socket equal the body.
    """
    channel = getattr(request, "channel", None)
    transport = getattr(channel, "transport", None)
    if not isinstance(transport, tcp.Connection):
        return None
    if not hasattr(transport, "producerPaused"):
        return None
    return transport


class FileShrank(OSError):
    """The file ended before the length the response announced."""

    def __init__(self, sent: int, expected: int) -> None:
        super().__init__(
            f"the file shrank while it was sent ({sent} of {expected} bytes)"
        )


def read_all(fd: int, size: int) -> bytes:
    """``size`` bytes from ``fd`` (fewer when the file shrank meanwhile)."""
    chunks = []
    left = size
    while left > 0:
        data = os.read(fd, left)
        if not data:
            break
        chunks.append(data)
        left -= len(data)
    return b"".join(chunks)


def b64_length(size: int) -> int:
    """Length of the base64 (padded, no newlines) of ``size`` bytes."""
    return 4 * ((size + 2) // 3)


@implementer(IPushProducer)
class FileProducer:
    """
    Write ``length`` bytes of ``fd`` from ``offset`` to a consumer.

    Owns ``fd`` and closes it when done, stopped, or failed.  Exactly
    ``length`` bytes are sent (the response announced them); a file that
    ends sooner fails the Deferred with :class:`FileShrank`.

    :param transform: applied to each chunk read (base64 for the JSON route).
    :param trailer: bytes to write after the last chunk.
    """

    def __init__(
        self,
        fd: int,
        offset: int,
        length: int,
        *,
        transform: Callable[[bytes], bytes] | None = None,
        trailer: bytes = b"",
        chunk: int = STREAM_CHUNK_BYTES,
    ) -> None:
        self.fd = fd
        self.pos = offset
        self.left = length
        self.sent = 0
        self.transform = transform
        self.trailer = trailer
        self.chunk = (chunk // 3) * 3 if transform is not None else chunk
        self.paused = False
        self.consumer: Any = None
        self.done: Deferred[int] = Deferred()
        self._busy = False
        self._socket: Any = None

    def start(self, consumer: Any) -> Deferred[int]:
        """Register with ``consumer`` and start writing; fires with bytes sent."""
        self.consumer = consumer
        if self.transform is None and self.left > 0:
            transport = _sendfile_transport(consumer)
            if transport is not None:
                consumer.write(b"")  # the status line and headers go first
                if not getattr(consumer, "chunked", False):
                    self._socket = transport
        consumer.registerProducer(self, True)
        self.resumeProducing()
        return self.done

    def resumeProducing(self) -> None:
        """Write chunks until the consumer pauses us or the range is done."""
        self.paused = False
        if self._busy or self.fd < 0:
            return
        self._busy = True
        try:
            if self._socket is not None:
                self._send_file(self._socket)
                return
            while not self.paused and self.fd >= 0:
                if self.left <= 0:
                    self._finish()
                    return
                data = os.pread(self.fd, min(self.chunk, self.left), self.pos)
                if not data:
                    # The file shrank under us. The response announced its
                    # length, and padding would corrupt it: fail, and the
                    # connection is cut so the client sees an error.
                    raise FileShrank(self.sent, self.sent + self.left)
                self.pos += len(data)
                self.left -= len(data)
                self.sent += len(data)
                self.consumer.write(self.transform(data) if self.transform else data)
        except OSError as e:
            if e.errno in CLIENT_GONE_ERRNOS:
                log.debug("a client left a file's download: {error}", error=e)
            else:
                log.warn("streaming a file failed: {error}", error=e)
            self._close()
            self.consumer.unregisterProducer()
            if not self.done.called:
                self.done.errback(e)
        finally:
            self._busy = False

    def _send_file(self, transport: Any) -> None:
        """``sendfile`` until the range is done or the socket is full."""
        if transport.dataBuffer or transport._tempDataBuffer:
            self._when_writable(transport)  # the headers are still queued
            return
        out = transport.socket.fileno()
        while not self.paused and self.left > 0:
            try:
                n = os.sendfile(out, self.fd, self.pos, min(self.left, self.chunk))
            except BlockingIOError:
                self._when_writable(transport)
                return
            if n == 0:
                raise FileShrank(self.sent, self.sent + self.left)
            self.pos += n
            self.left -= n
            self.sent += n
            self.consumer.sentLength += n
        if self.left <= 0:
            self._finish()

    @staticmethod
    def _when_writable(transport: Any) -> None:
        # What the transport does itself when its buffer fills: its drain
        # then resumes its producer (the HTTP channel), which resumes us.
        transport.producerPaused = True
        transport.startWriting()

    def pauseProducing(self) -> None:
        """The client is behind: stop until resumed."""
        self.paused = True

    def stopProducing(self) -> None:
        """The client went away."""
        self._close()
        if not self.done.called:
            self.done.callback(self.sent)

    def _finish(self) -> None:
        self._close()
        if self.trailer:
            self.consumer.write(self.trailer)
        self.consumer.unregisterProducer()
        if not self.done.called:
            self.done.callback(self.sent)

    def _close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """
    A single ``bytes=`` range as ``(start, length)``.

    :return: None to serve the whole file (no header, several ranges, or a
        unit we do not know), ``"unsatisfiable"`` for a range past the end
        (a suffix range of an empty file included).
    """
    if not header:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if first == "":
            n = int(last)
            if n <= 0 or size == 0:
                # RFC 9110: a suffix of an empty representation is none.
                return "unsatisfiable"
            n = min(n, size)
            return (size - n, n)
        start = int(first)
        end = int(last) if last != "" else size - 1
    except ValueError:
        return None
    if start >= size and start >= 0:
        return "unsatisfiable"
    if start < 0 or end < start:
        return None
    end = min(end, size - 1)
    return (start, end - start + 1)
