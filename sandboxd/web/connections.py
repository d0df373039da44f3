# -*- test-case-name: tests.web.test_connections -*-
"""
Which HTTP connections the daemon keeps: the caps, the request-head
deadline, and who makes room when a cap is reached.

A connection is in one of three states, as far as admission goes:

- *head*: a request's head (request line and headers) is on its way.
  That starts when the connection is made and, on a kept-alive
  connection, with the first byte of each next request; it ends once every
  header is in.  A head must be complete within
  :attr:`ConnectionLimits.head_deadline` seconds: a client dripping its
  request line one byte a second resets Twisted's idle timeout with every
  byte, and the old deadline only started once the request line was
  complete, so 1,024 such clients filled the cap for good.
- *idle*: a kept-alive connection between requests.
- *busy*: a request is being read, handled or answered.

A request's body, once its head is in, must keep coming: after the first
:attr:`ConnectionLimits.head_deadline` seconds it must have averaged at
least :attr:`ConnectionLimits.body_min_rate` bytes a second (Apache's
``mod_reqtimeout`` rule), counting only the time the daemon was reading
it (an upload waiting for the disk, or a preview waiting for its app,
pauses the socket, and that is not the client's slowness).  Without it a
client sending one byte every 59 s held a request, its concurrency slot
and its connection for as long as it liked: every byte resets the idle
timeout.

When a cap is reached (all connections, or those from one address), a
new connection takes the place of the connection idle the longest, else
of the one whose head has been on its way the longest, if that is more
than :data:`~sandboxd.policy.defaults.RECLAIM_HEAD_AFTER_SECONDS`; a
client that sends its head in one packet is never that slow.  Only when
neither exists is the new connection refused, and that is logged as a
warning (at most once per
:data:`~sandboxd.policy.defaults.CAP_WARNING_INTERVAL_SECONDS`, with the
counts since the last one).  A busy connection is never reclaimed.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs
from twisted.logger import Logger

from sandboxd.policy.defaults import (
    BODY_MIN_RATE_BYTES,
    CAP_WARNING_INTERVAL_SECONDS,
    HEADER_DEADLINE_SECONDS,
    HTTP_IDLE_TIMEOUT_SECONDS,
    LINGER_QUIET_SECONDS,
    MAX_CONNECTIONS_PER_PEER,
    MAX_HTTP_CONNECTIONS,
    RECLAIM_HEAD_AFTER_SECONDS,
)

log = Logger(namespace="sandboxd.connections")

#: Environment variables that override :class:`ConnectionLimits`.
ENV_MAX_CONNECTIONS = "ABX_MAX_CONNECTIONS"
ENV_MAX_CONNECTIONS_PER_ADDRESS = "ABX_MAX_CONNECTIONS_PER_ADDRESS"
ENV_HEAD_DEADLINE = "ABX_HEAD_DEADLINE_SECONDS"
ENV_IDLE_TIMEOUT = "ABX_IDLE_TIMEOUT_SECONDS"
ENV_BODY_MIN_RATE = "ABX_BODY_MIN_RATE"


class Connection(Protocol):
    """What the table needs of a channel."""

    peer_host: str

    def close_idle(self) -> None:
        """Close a connection that is between requests."""

    def close_slow(self) -> None:
        """Close a connection whose request head is overdue."""

    def close_slow_body(self) -> None:
        """Refuse a request whose body comes too slowly, and close."""


@attrs.frozen
class ConnectionLimits:
    """
    The HTTP connection bounds (documented in docs/operations.md).

    :ivar max_connections: open at once.
    :ivar max_per_address: open at once from one client address.
    :ivar head_deadline: seconds a request head may take, from the
        connection (first request) or its first byte (later ones); a
        body's grace before :attr:`body_min_rate` applies.
    :ivar idle_timeout: seconds a kept-alive connection may wait for its
        next request; a response whose client takes no byte of it for
        two such periods in a row is cut (see
        :class:`~sandboxd.web.channel.SandboxChannel`).
    :ivar body_min_rate: bytes a second a request body must average
        after its grace.
    """

    max_connections: int = MAX_HTTP_CONNECTIONS
    max_per_address: int = MAX_CONNECTIONS_PER_PEER
    head_deadline: float = HEADER_DEADLINE_SECONDS
    idle_timeout: float = HTTP_IDLE_TIMEOUT_SECONDS
    body_min_rate: float = BODY_MIN_RATE_BYTES

    def __attrs_post_init__(self) -> None:
        if self.max_connections < 1 or self.max_per_address < 1:
            raise ValueError("connection caps must be at least 1")
        if not self.head_deadline > 0:
            raise ValueError("the request head deadline must be positive")
        if not self.idle_timeout > 0:
            raise ValueError("the idle timeout must be positive")
        if not self.body_min_rate > 0:
            raise ValueError("the request body's minimum rate must be positive")

    @property
    def linger_seconds(self) -> float:
        """
        The longest a connection answered before its request was read
        whole stays open to read what its client still sends: the head
        deadline, the time any client may already hold a connection
        without a complete request.
        """
        return self.head_deadline

    @property
    def linger_quiet(self) -> float:
        """
        How long such a connection may go without a byte from its client
        before it is closed (never longer than :attr:`linger_seconds`).
        """
        return min(LINGER_QUIET_SECONDS, self.head_deadline)

    @classmethod
    def from_settings(
        cls,
        environ: Mapping[str, str] | None = None,
        max_connections: int | None = None,
        max_per_address: int | None = None,
        head_deadline: float | None = None,
        idle_timeout: float | None = None,
        body_min_rate: float | None = None,
    ) -> ConnectionLimits:
        """
        The limits from explicit values, else the environment, else the
        defaults.

        :raises ValueError: for a value that is not a positive number.
        """
        env = os.environ if environ is None else environ

        def pick(
            value: Any, name: str, kind: Callable[[str], Any], default: Any
        ) -> Any:
            text = str(value) if value is not None else env.get(name, "").strip()
            if not text:
                return default
            try:
                return kind(text)
            except ValueError:
                where = "the option" if value is not None else name
                raise ValueError(f"{where}: {text!r} is not a number") from None

        return cls(
            pick(max_connections, ENV_MAX_CONNECTIONS, int, MAX_HTTP_CONNECTIONS),
            pick(
                max_per_address,
                ENV_MAX_CONNECTIONS_PER_ADDRESS,
                int,
                MAX_CONNECTIONS_PER_PEER,
            ),
            pick(head_deadline, ENV_HEAD_DEADLINE, float, HEADER_DEADLINE_SECONDS),
            pick(idle_timeout, ENV_IDLE_TIMEOUT, float, HTTP_IDLE_TIMEOUT_SECONDS),
            pick(body_min_rate, ENV_BODY_MIN_RATE, float, BODY_MIN_RATE_BYTES),
        )


@attrs.define
class BodyClock:
    """
    How a request body is coming: the seconds the daemon has spent reading
    it, when that was last counted, and the bytes received.
    """

    checked: float
    active: float = 0.0
    received: int = 0


class ConnectionTable:
    """
    The open connections of one site, by state (see the module docstring).

    ``heads`` and ``idle`` are ordered by when the state began, so the
    oldest is the first entry and the deadline sweep stops at the first
    head that is not overdue.
    """

    def __init__(
        self,
        limits: ConnectionLimits,
        seconds: Callable[[], float],
        reclaim_after: float = RECLAIM_HEAD_AFTER_SECONDS,
        warn_every: float = CAP_WARNING_INTERVAL_SECONDS,
        name: str = "HTTP",
    ) -> None:
        """:param name: what the log calls the connections."""
        self.limits = limits
        self.name = name
        self._seconds = seconds
        self._reclaim_after = reclaim_after
        self._warn_every = warn_every
        self.open: set[Connection] = set()
        self.per_peer: dict[str, int] = {}
        self.heads: OrderedDict[Connection, float] = OrderedDict()
        self.idle: OrderedDict[Connection, float] = OrderedDict()
        #: Connections reading a request body, and how that is going.
        self.bodies: dict[Connection, BodyClock] = {}
        self._last_warning: float | None = None
        self._last_info: float | None = None
        self._why = ""
        self._refused = 0
        self._reclaimed_idle = 0
        self._reclaimed_slow = 0
        self._cut = 0
        self._slow_bodies = 0
        self._timed_out = 0
        self._stalled = 0

    def use_clock(self, seconds: Callable[[], float]) -> None:
        """Read the time from ``seconds`` from now on."""
        self._seconds = seconds

    # -- admission --------------------------------------------------------

    def admit(self, conn: Connection) -> bool:
        """Count a new connection (False: over a cap with no room to make)."""
        peer = conn.peer_host
        if self.per_peer.get(peer, 0) >= self.limits.max_per_address:
            if not self._make_room(peer):
                self._note(refused=True, why="per-address")
                return False
        if len(self.open) >= self.limits.max_connections:
            if not self._make_room(None):
                self._note(refused=True, why="total")
                return False
        self.open.add(conn)
        self.per_peer[peer] = self.per_peer.get(peer, 0) + 1
        self.heads[conn] = self._seconds()
        return True

    def _make_room(self, peer: str | None) -> bool:
        """Reclaim one connection (of ``peer`` when given); whether one was."""
        victim = _first(self.idle, peer)
        if victim is not None:
            self.forget(victim)
            self._reclaimed_idle += 1
            self._note()
            victim.close_idle()
            return True
        limit = self._seconds() - self._reclaim_after
        victim = _first(self.heads, peer, before=limit)
        if victim is not None:
            self.forget(victim)
            self._reclaimed_slow += 1
            self._note()
            victim.close_slow()
            return True
        return False

    def forget(self, conn: Connection) -> None:
        """The connection is closed (or being closed): uncount it."""
        if conn not in self.open:
            return
        self.open.discard(conn)
        self.heads.pop(conn, None)
        self.idle.pop(conn, None)
        self.bodies.pop(conn, None)
        left = self.per_peer.get(conn.peer_host, 1) - 1
        if left > 0:
            self.per_peer[conn.peer_host] = left
        else:
            self.per_peer.pop(conn.peer_host, None)

    # -- state changes ------------------------------------------------------

    def head_started(self, conn: Connection) -> None:
        """A request head has begun (its first byte, or buffered data)."""
        if conn in self.open and conn not in self.heads:
            self.idle.pop(conn, None)
            self.heads[conn] = self._seconds()

    def head_done(self, conn: Connection) -> None:
        """Every header is in: the request is busy now."""
        self.heads.pop(conn, None)
        self.idle.pop(conn, None)

    def went_idle(self, conn: Connection) -> None:
        """A response is done and the connection waits for another request."""
        if conn in self.open and conn not in self.heads:
            self.idle.pop(conn, None)
            self.idle[conn] = self._seconds()

    def body_started(self, conn: Connection) -> None:
        """The head is in and a body follows: its clock starts."""
        if conn in self.open:
            self.bodies[conn] = BodyClock(self._seconds())

    def body_read(self, conn: Connection, size: int) -> None:
        """``size`` bytes of the body arrived."""
        clock = self.bodies.get(conn)
        if clock is not None:
            clock.received += size

    def body_done(self, conn: Connection) -> None:
        """The body is whole (or the request is over)."""
        self.bodies.pop(conn, None)

    def cut_slow_bodies(self, reading: Callable[[Connection], bool]) -> int:
        """
        Refuse every request whose body has come too slowly for the time
        the daemon spent reading it (see the module docstring); how many.

        :param reading: whether the daemon reads a connection now (time
            it spent paused is not counted against its client).
        """
        if not self.bodies:
            return 0
        now = self._seconds()
        grace = self.limits.head_deadline
        rate = self.limits.body_min_rate
        late = []
        for conn, clock in self.bodies.items():
            if reading(conn):
                clock.active += now - clock.checked
            clock.checked = now
            if clock.active > grace + clock.received / rate:
                late.append(conn)
        for conn in late:
            self.bodies.pop(conn, None)
            conn.close_slow_body()
        if late:
            self._slow_bodies += len(late)
            self.flush_log()
        return len(late)

    # -- the deadline -------------------------------------------------------

    def overdue(self) -> list[Connection]:
        """Connections whose request head is past the deadline (oldest first)."""
        limit = self._seconds() - self.limits.head_deadline
        late = []
        for conn, started in self.heads.items():
            if started > limit:
                break
            late.append(conn)
        return late

    def timed_out(self, stalled: bool = False) -> None:
        """
        A connection was closed at the idle timeout (``stalled``: cut, its
        client taking nothing of a response): counted for the paced line,
        since a client opening idle sockets would otherwise set the log's
        pace.
        """
        if stalled:
            self._stalled += 1
        else:
            self._timed_out += 1
        self.flush_log()

    def cut_overdue(self) -> int:
        """Close every connection whose head is overdue; how many."""
        late = self.overdue()
        for conn in late:
            self.forget(conn)
            conn.close_slow()
        self._cut += len(late)
        self.flush_log()
        return len(late)

    # -- the log ------------------------------------------------------------

    def _note(self, refused: bool = False, why: str = "") -> None:
        if refused:
            self._refused += 1
            self._why = why
        self.flush_log()

    def flush_log(self) -> None:
        """
        Log what happened since the last lines, at most once per interval
        each: refusals as a warning, reclaims and cuts as information.
        Called on each event and by the site's sweep, so counts held back
        by the interval are reported once it is over.
        """
        now = self._seconds()
        if self._refused and (
            self._last_warning is None or now - self._last_warning >= self._warn_every
        ):
            log.warn(
                "{name} connection cap reached ({why}): refused {refused} "
                "connection(s) since the last warning (caps: {total} open, "
                "{per} per address; {open} open now)",
                name=self.name,
                why=self._why,
                refused=self._refused,
                total=self.limits.max_connections,
                per=self.limits.max_per_address,
                open=len(self.open),
            )
            self._last_warning = now
            self._refused = 0
        if (
            self._reclaimed_idle
            or self._reclaimed_slow
            or self._cut
            or self._slow_bodies
            or self._timed_out
            or self._stalled
        ) and (self._last_info is None or now - self._last_info >= self._warn_every):
            log.info(
                "{name} connections: {idle} idle and {slow} slow reclaimed at a cap, "
                "{cut} cut at the {deadline:g} s request-head deadline, "
                "{bodies} request bodies refused under {rate:g} bytes/s, "
                "{timed_out} closed after {timeout:g} s idle, {stalled} cut "
                "whose client took nothing of its response",
                name=self.name,
                idle=self._reclaimed_idle,
                slow=self._reclaimed_slow,
                cut=self._cut,
                deadline=self.limits.head_deadline,
                bodies=self._slow_bodies,
                rate=self.limits.body_min_rate,
                timed_out=self._timed_out,
                timeout=self.limits.idle_timeout,
                stalled=self._stalled,
            )
            self._last_info = now
            self._reclaimed_idle = self._reclaimed_slow = self._cut = 0
            self._slow_bodies = self._timed_out = self._stalled = 0


def _first(
    table: OrderedDict[Connection, float],
    peer: str | None,
    before: float | None = None,
) -> Connection | None:
    """The oldest entry (of ``peer``), optionally only one older than ``before``."""
    for conn, since in table.items():
        if before is not None and since > before:
            return None
        if peer is None or conn.peer_host == peer:
            return conn
    return None
