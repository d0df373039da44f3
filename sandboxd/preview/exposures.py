# -*- test-case-name: tests.preview.test_exposures -*-
"""
Which ports the preview door forwards to, and which it never may.

Nothing is proxied unless exposed (``preview_expose``).  An exposure names
one port inside the sandbox; the policy bounds which ports may be exposed
(``params.ports``, ``params.deny_ports``), and the daemon adds its own
listeners and the browser's debugging port to the denied ones, whatever the
policy says: the door must never become a way around the daemon's own
authentication.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import attrs

from sandboxd.access.links import iso
from sandboxd.errors import (
    Code,
    bad_request,
    forbidden,
    limit_exceeded,
    port_not_allowed,
    port_not_exposed,
)
from sandboxd.policy.defaults import PREVIEW_PORTS

#: Where the door finds an app: loopback only, IPv4 first (an app bound to
#: ``::1`` alone, as Node binds ``localhost`` on some systems, is found next).
LOOPBACKS = ("127.0.0.1", "::1")

#: The bound addresses through which a listener takes connections to
#: :data:`LOOPBACKS` (the wildcards, and IPv4's loopback as IPv6 maps it).
REACHED_ON = frozenset({*LOOPBACKS, "0.0.0.0", "::", "::ffff:127.0.0.1"})


def reached(addresses: set[str]) -> bool:
    """
    Whether the door reaches a port listening on ``addresses`` (an empty
    set: nothing is known to listen, so nothing to say against it).
    """
    return not addresses or not addresses.isdisjoint(REACHED_ON)


class Closable(Protocol):
    """Something in flight to an exposed port (a request, a WebSocket)."""

    def close(self, why: str | None = None) -> None:
        """End it now (the port was unexposed, ``why`` in words)."""


def parse_ranges(specs: Iterable[str]) -> tuple[tuple[int, int], ...]:
    """``["3000", "8000-8999"]`` as inclusive ranges (bad items are skipped)."""
    return _ranges(tuple(specs))


@functools.lru_cache(maxsize=16)
def _ranges(specs: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
    """:func:`parse_ranges` once per policy's list (it is asked on every request)."""
    out = []
    for spec in specs:
        low, _, high = spec.strip().partition("-")
        try:
            lo, hi = int(low), int(high or low)
        except ValueError:
            continue
        out.append((lo, hi))
    return tuple(out)


def check_port(value: Any) -> int:
    """
    :raises ApiError: 400 ``invalid_param`` unless ``value`` is a port 1-65535.
    """
    if isinstance(value, bool):
        raise bad_request("'port' must be a port number 1-65535")
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise bad_request("'port' must be a port number 1-65535") from None
    if not 0 < port < 65536 or (isinstance(value, float) and not value.is_integer()):
        raise bad_request("'port' must be a port number 1-65535")
    return port


def allowed(
    port: int,
    ports: Iterable[str] | None,
    deny: Iterable[int],
    own: Iterable[int],
    sources: Callable[[str], str | None],
) -> None:
    """
    :raises ApiError: 403 ``port_not_allowed`` naming the rule: one of the
        daemon's own ports, a denied one, or outside the allowed ranges.
    """
    if port in own:
        raise port_not_allowed(port, "daemon:own_ports")
    if port in deny:
        raise port_not_allowed(
            port, sources("params.deny_ports") or "params.deny_ports"
        )
    ranges = parse_ranges(ports if ports is not None else PREVIEW_PORTS)
    if not any(lo <= port <= hi for lo, hi in ranges):
        raise port_not_allowed(port, sources("params.ports") or "default:params.ports")


@attrs.define(eq=False)
class Exposure:
    """One exposed port and what went through it."""

    port: int
    label: str | None
    public: bool
    host_header: str
    exposed_by: str
    created_at: float
    expires_at: float | None = None
    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    #: What is in flight to the port now (closed when it is unexposed).
    open: set[Closable] = attrs.Factory(set)
    websockets: int = 0

    def as_json(self, url: str, listening: bool) -> dict[str, Any]:
        """What ``preview_get`` answers."""
        return {
            "port": self.port,
            "label": self.label,
            "public": self.public,
            "host_header": self.host_header,
            "url": url,
            "listening": listening,
            "exposed_by": self.exposed_by,
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at) if self.expires_at else None,
            "requests": self.requests,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "open_websockets": self.websockets,
        }

    def close_all(self, why: str) -> None:
        """End everything in flight to the port, told ``why`` (a WebSocket's close reason)."""
        for item in list(self.open):
            item.close(why)
        self.open.clear()


class ExposureTable:
    """
    The exposed ports, by port.  An exposure past its ``ttl_seconds`` ends
    on a timer, with what is open through it (a WebSocket, an event
    stream, a download): an exposure for ten minutes must leave the app
    unreachable after ten minutes, not at the next look-up, which may be
    never.  A look-up ends it too (the timer may be a moment late).
    """

    def __init__(
        self,
        clock: Callable[[], float],
        call_later: Callable[..., Any] | None = None,
    ) -> None:
        """
        :param clock: the time now (seconds).
        :param call_later: the reactor's ``callLater`` (None: expiry only at
            a look-up, for tests of the table alone).
        """
        self._clock = clock
        self._call_later = call_later
        #: The timer set for :attr:`_due`, and the time it was set for.
        self._timer: Any = None
        self._timer_at: float | None = None
        self.by_port: dict[int, Exposure] = {}
        #: No exposure expires before this (None: none has a ``ttl``), so
        #: that a look-up walks the table only when one may have expired.
        #: An exposure replaced or ended may leave it early: the walk it
        #: causes then finds nothing and moves it on.
        self._due: float | None = None

    def expose(
        self,
        port: int,
        label: str | None,
        public: bool,
        host_header: str,
        exposed_by: str,
        ttl: float | None,
        max_exposures: int | None,
        rule: str | None = None,
        share: int | None = None,
        share_rule: str | None = None,
        any_owner: bool = False,
    ) -> Exposure:
        """
        Expose ``port`` (again: the new exposure replaces the old one, whose
        connections stay).

        :param share: the exposures one identity may hold
            (:func:`~sandboxd.policy.defaults.identity_cap`), so that one
            cannot take every place of the table.
        :param any_owner: the caller may replace another identity's
            exposure (it holds ``*``); else only its own.
        :raises ApiError: 403 ``permission_denied`` for a port another
            identity exposed; 429 when ``max_exposures`` other ports are
            exposed, or the caller's share of them.
        """
        self.prune()
        old = self.by_port.get(port)
        if old is not None:
            self._check_owner(old, exposed_by, any_owner, "expose again")
        else:
            if max_exposures is not None and len(self.by_port) >= max_exposures:
                raise limit_exceeded(
                    429,
                    f"{len(self.by_port)} ports are exposed; unexpose one first",
                    Code.TOO_MANY_SESSIONS,
                    rule,
                    limit=max_exposures,
                )
            mine = sum(1 for e in self.by_port.values() if e.exposed_by == exposed_by)
            if share is not None and mine >= share:
                raise limit_exceeded(
                    429,
                    f"you have {mine} ports exposed, your share of "
                    f"{max_exposures} (max_per_identity); unexpose one first",
                    Code.TOO_MANY_SESSIONS,
                    share_rule or rule,
                    limit="max_per_identity",
                )
        now = self._clock()
        exposure = Exposure(
            port,
            label,
            public,
            host_header,
            exposed_by,
            now,
            now + ttl if ttl else None,
        )
        if old is not None:
            exposure.open = old.open
            exposure.requests, exposure.bytes_in = old.requests, old.bytes_in
            exposure.bytes_out, exposure.websockets = old.bytes_out, old.websockets
        self.by_port[port] = exposure
        ends = exposure.expires_at
        if ends is not None and (self._due is None or ends < self._due):
            self._due = ends
            self._schedule()
        return exposure

    def _schedule(self) -> None:
        """One timer, at :attr:`_due` (the earliest ``expires_at``)."""
        if self._call_later is None:
            return
        timer = self._timer
        if timer is not None and timer.active():
            if self._timer_at == self._due:
                return
            timer.cancel()
        self._timer = self._timer_at = None
        if self._due is None:
            return
        self._timer_at = self._due
        self._timer = self._call_later(
            max(0.0, self._due - self._clock()), self._expire
        )

    def _expire(self) -> None:
        """The timer: end what is due, and wait for the next one."""
        self._timer = self._timer_at = None
        self.prune()
        self._schedule()

    def prune(self) -> None:
        """End the exposures past their ``ttl_seconds``."""
        if self._due is None:
            return
        now = self._clock()
        if self._due > now:
            return
        due = None
        for port, exposure in list(self.by_port.items()):
            ends = exposure.expires_at
            if ends is None:
                continue
            if ends <= now:
                del self.by_port[port]
                exposure.close_all(f"the preview of port {port} expired")
            elif due is None or ends < due:
                due = ends
        self._due = due
        self._schedule()

    def get(self, port: int) -> Exposure:
        """
        :raises ApiError: 404 ``port_not_exposed``.
        """
        self.prune()
        exposure = self.by_port.get(port)
        if exposure is None:
            raise port_not_exposed(port)
        return exposure

    def unexpose(
        self, port: int, by: str | None = None, any_owner: bool = True
    ) -> Exposure:
        """
        Stop exposing ``port`` and close what is in flight to it.

        :param by: who asks (None: the daemon itself).
        :param any_owner: ``by`` may end another identity's exposure.
        :raises ApiError: 404 ``port_not_exposed``; 403 ``permission_denied``
            for another identity's exposure.
        """
        exposure = self.get(port)
        if by is not None:
            self._check_owner(exposure, by, any_owner, "unexpose")
        del self.by_port[port]
        exposure.close_all(f"port {port} is no longer exposed")
        return exposure

    @staticmethod
    def _check_owner(exposure: Exposure, by: str, any_owner: bool, doing: str) -> None:
        """
        :raises ApiError: 403 ``permission_denied`` when ``by`` may not
            change ``exposure``: one identity silently taking another's
            port (its label gone, its private preview made public) or
            ending it.
        """
        if exposure.exposed_by == by or any_owner:
            return
        raise forbidden(
            f"port {exposure.port} was exposed by {exposure.exposed_by!r}: only "
            f"that identity, or one holding '*', may {doing} it",
            Code.PERMISSION_DENIED,
            rule="preview:exposed_by",
        )

    def close(self) -> list[int]:
        """
        End every exposure (the door stops: the daemon stops, or a reload
        switched the preview group off); the ports that were exposed.
        """
        ports = sorted(self.by_port)
        for exposure in self.by_port.values():
            exposure.close_all("the preview door closed")
        self.by_port.clear()
        self._due = None
        self._schedule()
        return ports
