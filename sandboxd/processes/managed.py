# -*- test-case-name: tests.processes.test_children -*-
"""
One background process (SPEC §7.4): its child, its label and the
:class:`~sandboxd.eventlog.EventLog` of its output.
"""

from __future__ import annotations

import codecs
import time
from typing import Any

from sandboxd.access.audit import redact_url_secrets
from sandboxd.eventlog import EventLog
from sandboxd.policy.defaults import EVENT_OVERHEAD_BYTES
from sandboxd.processes.child import STREAM_NAMES, Child, timeout_error


def readable(text: str) -> str:
    """
    Output text as a text door shows it: bytes that were not UTF-8 become
    U+FFFD, as a decoder with ``errors="replace"`` would have made them.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return text


class Managed:
    """
    One background process: its child, its label, and its output log.

    Output is recorded as it is read, one event per read (``stdout`` or
    ``stderr``, ``{"data": text}``), then ``error`` (timeouts) and ``exit``:
    every output event comes before any other, so the output event at log
    seq ``n`` is the ``n - 1``-th output event, the seed's numbering
    (:attr:`outputs` counts them).
    The text keeps every byte: what is not UTF-8 is held as surrogate
    escapes, so a door that sends bytes (the E2B door) sends the very
    bytes written, and a door that sends text shows :func:`readable`.
    """

    def __init__(
        self, child: Child, command: str, tag: str | None, retention: int
    ) -> None:
        self.child = child
        self.command = command
        self.tag = tag
        self.log = EventLog(retention)
        self.output_bytes = 0
        #: Output events recorded so far (dropped ones too).
        self.outputs = 0
        #: ``capture_output`` as the start request gave it (None: not said).
        #: Output is kept either way; a read in the seed's form (``since``)
        #: needs True, and an explicit False refuses every read, as the
        #: seed answers both.
        self.capture_output: bool | None = None
        self.ended_at: float | None = None
        #: The identity whose ``max_per_identity`` share it counts against
        #: (a link's minter; None: started by the daemon itself).
        self.owner: str | None = None
        self._decoders = {
            fd: codecs.getincrementaldecoder("utf-8")("surrogateescape")
            for fd in STREAM_NAMES
        }

    @property
    def pid(self) -> int:
        """The leader's pid."""
        return self.child.pid

    @property
    def running(self) -> bool:
        """Whether the command has not exited yet."""
        return not self.child.has_exited

    def on_output(self, fd: int, data: bytes) -> None:
        """Record one read."""
        decoder = self._decoders.get(fd)
        if decoder is None:
            return
        self.output_bytes += len(data)
        held = len(decoder.getstate()[0])
        text = decoder.decode(data)
        if text:
            # The event holds the bytes of a character begun in an earlier
            # read too: counted here, or they would be reported dropped.
            size = held + len(data) - len(decoder.getstate()[0])
            # Counted first: the append wakes readers, who answer with it.
            self.outputs += 1
            self.log.append(
                STREAM_NAMES[fd], {"data": text}, size + EVENT_OVERHEAD_BYTES
            )

    def on_ended(self, code: int | None) -> None:
        """Pipes closed: flush decoders, then ``error`` and ``exit``; close the log."""
        self.ended_at = time.time()
        for fd, decoder in self._decoders.items():
            text = decoder.decode(b"", final=True)
            if text:
                self.outputs += 1
                self.log.append(
                    STREAM_NAMES[fd], {"data": text}, len(text) + EVENT_OVERHEAD_BYTES
                )
        error = timeout_error(self.child)
        if error is not None:
            self.log.append("error", error.body())
        self.log.append("exit", {"exit_code": code})
        self.log.close()

    def dropped_bytes(self) -> int:
        """Output bytes no longer kept."""
        _, events = self.log.since(0)
        kept = sum(
            e.size - EVENT_OVERHEAD_BYTES
            for e in events
            if e.event in ("stdout", "stderr")
        )
        return max(0, self.output_bytes - kept)

    def describe(self) -> dict[str, Any]:
        """
        The fields of process_list / process_detail: the command with the
        secrets a client put in its URLs masked, as the audit masks them
        (E2B's git helpers put ``https://user:token@`` on the command
        line), since every identity that may list processes sees it.
        """
        return {
            "pid": self.pid,
            "command": redact_url_secrets(self.command),
            "tag": self.tag,
            "state": "running" if self.running else "exited",
            "started_at": self.child.started_at,
            "exit_code": None if self.running else self.child.exit_code,
            "timed_out": self.timed_out,
            "stdin": self.child.stdin_open,
        }

    @property
    def timed_out(self) -> bool:
        """
        Whether the daemon ended it on its ``timeout`` or ``idle_timeout``:
        its exit code alone (-15, or -9 after the grace) reads like any
        other kill.
        """
        return self.child.reason in ("timeout", "idle_timeout")
