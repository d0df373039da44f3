# -*- test-case-name: tests.kernels.test_hubclient,tests.kernels.test_contexts -*-
"""
The daemon's side of the kernel hub (:mod:`sandboxd.kernels.hub`): one child,
started on the first code context, spoken to in JSON lines over its stdin
and stdout. An event line with ``bytes: N`` is followed by N raw bytes
(output text, UTF-8), handed on as the event's ``raw`` (a ``bytearray``,
read straight into its place: see :class:`LineSplitter`).

A line longer than :data:`~sandboxd.policy.defaults.CODE_HUB_MAX_LINE_BYTES`
or one that is not a JSON object ends the hub (the framing is broken, so
nothing after it can be trusted); its contexts hear of it and reconnect to
their kernels through a new hub.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from sandboxd.policy import defaults
from sandboxd.policy.defaults import (
    CODE_HUB_MAX_LINE_BYTES,
    CODE_HUB_READ_BYTES,
    CODE_HUB_SPILL_BYTES,
    KIB,
)
from sandboxd.processes.child import Child, HeadTail
from sandboxd.processes.command import RunAs
from sandboxd.processes.priority import CHILD_PRIORITY
from sandboxd.processes.run import spawn

log = Logger(namespace="sandboxd.kernels")

#: The hub's command line (a test puts a misbehaving hub here).  ``-I``:
#: the hub runs in the base directory, where callers write files, and
#: ``-m`` alone would import a ``sandboxd`` package found there first.
HUB_COMMAND = [sys.executable, "-I", "-m", "sandboxd.kernels.hub"]


def attend(child: Child) -> None:
    """
    Once ``child`` runs, its session group at an agent's level
    (``agents_nice``) rather than the children's: a kernel and the hub
    that relays its messages answer an agent that waits on each
    execution, as an attended terminal's shell answers each keystroke.
    At the children's level each would get a small share of the CPUs
    beside every busy session of the sandbox's own work (a build), and a
    kernel's start alone ran past its start timeout.  Its tasks keep the
    children's nice value, so what a cell starts still yields to it.
    """

    def running(_: Any) -> None:
        if child.pid and not child.has_exited:
            CHILD_PRIORITY.attended(child.pid)

    child.when_spawned().addCallbacks(running, lambda _: None)


class LineSplitter:
    """
    Splits a byte stream on ``\\n``, a line at most ``max_bytes`` long; a
    line may announce raw bytes that follow it (:meth:`expect`), which
    come whole to ``on_payload``, newlines and all.

    A payload is a ``bytearray`` of the announced size, made once: what
    a read brought of it is copied in, and :meth:`read_from` reads the rest
    of it from the pipe straight into its place, so a big output is not
    copied out of a read buffer, sliced and joined on its way (its bytes
    are copied once, by the kernel, into the object that keeps them).
    Parts of an unfinished line are kept in a list and joined once, so a
    27 MB line (a big PNG in base64) costs one copy, not one per read.
    """

    def __init__(
        self,
        max_bytes: int,
        on_line: Callable[[bytes], None],
        on_overflow: Callable[[int], None],
        on_payload: Callable[[bytes | bytearray], None] | None = None,
        read_bytes: int = CODE_HUB_READ_BYTES,
    ) -> None:
        self.max_bytes = max_bytes
        self._on_line = on_line
        self._on_overflow = on_overflow
        self._on_payload = on_payload
        self.read_bytes = read_bytes
        self._parts: list[bytes] = []
        self._size = 0
        #: The payload being read and how much of it has come.
        self._payload: bytearray | None = None
        self._filled = 0
        #: The buffer reads go to, made on the first read.
        self._buffer: bytearray | None = None
        self.stopped = False

    def expect(self, size: int) -> None:
        """The next ``size`` bytes are a payload (called from ``on_line``)."""
        if size > self.max_bytes or self._on_payload is None:
            self._overflow(size)
        elif size == 0:
            self._on_payload(b"")
        else:
            self._payload = bytearray(size)
            self._filled = 0

    def feed(self, data: bytes | bytearray) -> None:
        """Take the next chunk."""
        self._feed(data, len(data))

    def read_from(self, fd: int) -> int:
        """
        Read what ``fd`` has, up to :attr:`read_bytes`, and take it; the
        rest of a payload under way goes straight into it.

        :returns: the bytes read, 0 at the end of the stream.
        :raises OSError: from the first read (``EAGAIN``: nothing yet).
        """
        if self._buffer is None:
            self._buffer = bytearray(self.read_bytes)
        total = 0
        while total < self.read_bytes:
            try:
                got = self._read_once(fd, self._buffer)
            except BlockingIOError:
                if total:
                    break
                raise
            if not got:
                return total
            total += got
            if self._payload is None and got < len(self._buffer):
                break  # the pipe is empty (or nearly)
        return total

    def _read_once(self, fd: int, buffer: bytearray) -> int:
        payload = self._payload
        if payload is None or self.stopped:
            got = os.readv(fd, [buffer])
            self._feed(buffer, got)
            return got
        with memoryview(payload) as whole, memoryview(buffer) as spill:
            got = os.readv(fd, [whole[self._filled :], spill[:CODE_HUB_SPILL_BYTES]])
        taken = min(got, len(payload) - self._filled)
        self._filled += taken
        if self._filled == len(payload):
            self._deliver()
        if got > taken:
            self._feed(buffer, got - taken)
        return got

    def _feed(self, data: bytes | bytearray, end: int) -> None:
        """Take ``data[:end]`` (copied where kept: ``data`` may be reused)."""
        pos = 0
        with memoryview(data) as view:
            while pos < end and not self.stopped:
                if self._payload is not None:
                    pos = self._take_payload(view, pos, end)
                    continue
                nl = data.find(b"\n", pos, end)
                if nl < 0:
                    self._parts.append(bytes(view[pos:end]))
                    self._size += end - pos
                    if self._size > self.max_bytes:
                        self._overflow(self._size)
                    return
                line = bytes(view[pos:nl])
                if self._parts:
                    line = b"".join((*self._parts, line))
                    self._parts, self._size = [], 0
                pos = nl + 1
                if len(line) > self.max_bytes:
                    self._overflow(len(line))
                    return
                if line:
                    self._on_line(line)

    def _take_payload(self, view: memoryview, pos: int, end: int) -> int:
        payload = self._payload
        assert payload is not None
        take = min(len(payload) - self._filled, end - pos)
        payload[self._filled : self._filled + take] = view[pos : pos + take]
        self._filled += take
        if self._filled == len(payload):
            self._deliver()
        return pos + take

    def _deliver(self) -> None:
        payload, self._payload, self._filled = self._payload, None, 0
        assert payload is not None and self._on_payload is not None
        self._on_payload(payload)

    def _overflow(self, size: int) -> None:
        self.stopped = True
        self._parts = []
        self._payload = None
        self._on_overflow(size)


class HubClient:
    """
    One hub child and its pipe.

    :param on_event: called with each event object the hub sends.
    :param on_exit: called once with a reason when the hub is gone.
    :param run_as: the user it runs as (that of its kernels), when not the
        daemon's.
    """

    def __init__(
        self,
        reactor: Any,
        children: Any,
        env: dict[str, str],
        cwd: str,
        on_event: Callable[[dict[str, Any]], None],
        on_exit: Callable[[str], None],
        run_as: RunAs | None = None,
    ) -> None:
        self.reactor = reactor
        self._on_event = on_event
        self._on_exit = on_exit
        self._splitter = LineSplitter(
            CODE_HUB_MAX_LINE_BYTES, self._line, self._overflow, self._payload
        )
        #: The event whose raw bytes are being read.
        self._awaiting: dict[str, Any] | None = None
        self._stderr = HeadTail(8 * KIB)
        #: Lines heard from the hub so far (see :meth:`suspect`).
        self.heard = 0
        self.gone = False
        self.reason: str | None = None
        self.child = Child(reactor, self._output)
        spawn(
            reactor,
            self.child,
            [
                *HUB_COMMAND,
                "--buffer-bytes",
                str(defaults.CODE_HUB_BUFFER_BYTES),
                "--iopub-hwm",
                str(defaults.CODE_HUB_IOPUB_HWM),
            ],
            children=children,
            env=env,
            cwd=cwd,
            run_as=run_as,
            stdin_pipe=True,
        )
        self.child.read_with(1, self._splitter.read_from)
        self.child.ended.addCallback(self._ended)
        attend(self.child)

    @property
    def pid(self) -> int:
        """The hub's pid."""
        return self.child.pid

    def send(self, command: dict[str, Any]) -> None:
        """Write one command line (dropped once the hub is gone)."""
        if self.gone:
            return
        line = json.dumps(command, separators=(",", ":"), ensure_ascii=False)
        self.child.write_stdin(line.encode("utf-8", "surrogatepass") + b"\n", now=True)

    def _output(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self._splitter.feed(data)
        else:
            self._stderr.write(data)

    def _line(self, line: bytes) -> None:
        self.heard += 1
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            self._fail("the kernel hub sent a line that is not a JSON object")
            return
        if event.get("ev") == "fatal":
            self._fail(f"the kernel hub failed: {event.get('message')}")
            return
        size = event.pop("bytes", None)
        if size is None:
            self._on_event(event)
            return
        if type(size) is not int or size < 0:
            self._fail("the kernel hub announced a payload of no valid size")
            return
        self._awaiting = event
        self._splitter.expect(size)

    def _payload(self, data: bytes | bytearray) -> None:
        event, self._awaiting = self._awaiting, None
        if event is not None:
            event["raw"] = data
            self._on_event(event)

    def _overflow(self, size: int) -> None:
        self._fail(f"the kernel hub sent a line of {size} bytes, over the limit")

    def _fail(self, reason: str) -> None:
        log.warn("{reason}", reason=reason)
        self.reason = self.reason or reason
        self._splitter.stopped = True
        self.child.kill("killed")

    def suspect(self, heard: int, grace: float) -> None:
        """
        A call to the hub went unanswered past its deadline: unless the hub
        says anything within ``grace`` seconds (beyond the ``heard`` lines
        it had sent when the call went out), it is stuck (stopped, wedged)
        and is ended, so that its contexts and the next call get a new one
        rather than waiting on it for good.
        """

        def check() -> None:
            if not self.gone and self.heard == heard:
                self._fail(
                    "the kernel hub answered nothing for a context's whole "
                    "start timeout: ended as stuck"
                )

        self.reactor.callLater(grace, check)

    def _ended(self, code: int | None) -> None:
        self.gone = True
        if self.reason is None:
            tail = self.stderr_tail()
            self.reason = f"the kernel hub exited ({code})" + (
                f": {tail}" if tail else ""
            )
        self._on_exit(self.reason)

    def stderr_tail(self) -> str:
        """The last words of the hub's stderr (for an error message)."""
        return self._stderr.value().decode("utf-8", "replace").strip()[-2000:]

    def stop(self) -> Deferred[None]:
        """Close its stdin (it disconnects from every kernel) and end its tree."""
        self.reason = self.reason or "stopped"
        self.child.close_stdin()
        return self.child.kill("shutdown")
