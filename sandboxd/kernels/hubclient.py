# -*- test-case-name: tests.kernels.test_hubclient,tests.kernels.test_contexts -*-
"""
The daemon's side of the kernel hub (:mod:`sandboxd.kernels.hub`): one child,
started on the first code context, spoken to in JSON lines over its stdin
and stdout. An event line with ``bytes: N`` is followed by N raw bytes
(output text, UTF-8), handed on as the event's ``raw``.

A line longer than :data:`~sandboxd.policy.defaults.CODE_HUB_MAX_LINE_BYTES`
or one that is not a JSON object ends the hub (the framing is broken, so
nothing after it can be trusted); its contexts hear of it and reconnect to
their kernels through a new hub.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from sandboxd.policy.defaults import CODE_HUB_MAX_LINE_BYTES, CODE_HUB_READ_BYTES, KIB
from sandboxd.processes.child import Child, HeadTail
from sandboxd.processes.command import RunAs
from sandboxd.processes.priority import CHILD_PRIORITY
from sandboxd.processes.run import spawn

log = Logger(namespace="sandboxd.kernels")

#: The hub's command line (a test puts a misbehaving hub here).
HUB_COMMAND = [sys.executable, "-m", "sandboxd.kernels.hub"]


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

    Parts of an unfinished line or payload are kept in a list and joined
    once, so a 27 MB line (a big PNG in base64) arriving in 64 KiB reads
    costs one copy, not one per read.
    """

    def __init__(
        self,
        max_bytes: int,
        on_line: Callable[[bytes], None],
        on_overflow: Callable[[int], None],
        on_payload: Callable[[bytes], None] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self._on_line = on_line
        self._on_overflow = on_overflow
        self._on_payload = on_payload
        self._parts: list[bytes] = []
        self._size = 0
        #: Raw bytes still owed to the payload being read (None: lines).
        self._want: int | None = None
        self.stopped = False

    def expect(self, size: int) -> None:
        """The next ``size`` bytes are a payload (called from ``on_line``)."""
        if size > self.max_bytes or self._on_payload is None:
            self._overflow(size)
        elif size == 0:
            self._on_payload(b"")
        else:
            self._want = size

    def feed(self, data: bytes) -> None:
        """Take the next chunk."""
        pos, end = 0, len(data)
        while pos < end and not self.stopped:
            if self._want is not None:
                pos = self._take_payload(data, pos)
                continue
            nl = data.find(b"\n", pos)
            if nl < 0:
                self._parts.append(data[pos:] if pos else data)
                self._size += end - pos
                if self._size > self.max_bytes:
                    self._overflow(self._size)
                return
            if self._parts:
                line = b"".join(self._parts) + data[pos:nl]
                self._parts, self._size = [], 0
            else:
                line = data[pos:nl]
            pos = nl + 1
            if len(line) > self.max_bytes:
                self._overflow(len(line))
                return
            if line:
                self._on_line(line)

    def _take_payload(self, data: bytes, pos: int) -> int:
        assert self._want is not None and self._on_payload is not None
        take = min(self._want, len(data) - pos)
        whole = take == len(data)
        self._parts.append(data if whole else data[pos : pos + take])
        self._want -= take
        if self._want == 0:
            payload = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
            self._parts, self._size, self._want = [], 0, None
            self._on_payload(payload)
        return pos + take

    def _overflow(self, size: int) -> None:
        self.stopped = True
        self._parts = []
        self._want = None
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
        self.gone = False
        self.reason: str | None = None
        self.child = Child(reactor, self._output)
        spawn(
            reactor,
            self.child,
            list(HUB_COMMAND),
            children=children,
            env=env,
            cwd=cwd,
            run_as=run_as,
            stdin_pipe=True,
        )
        self.child.read_chunks(1, CODE_HUB_READ_BYTES)
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

    def _payload(self, data: bytes) -> None:
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
