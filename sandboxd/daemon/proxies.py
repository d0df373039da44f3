# -*- test-case-name: tests.test_proxies -*-
"""
Behind a proxy or a port mapping (SPEC §20): the URL clients reach the
terminal port at, and which ``X-Forwarded-*`` headers are believed.

A forwarded header is a claim by whoever sent the request; it is believed
only from an address in the policy's ``trusted_proxies``, so a client
cannot point the ``ws_url`` it is handed (or anyone else's) elsewhere.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Mapping, Sequence

import attrs


@functools.lru_cache(maxsize=64)
def _networks(
    entries: tuple[str, ...],
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(e, strict=False) for e in entries)


def is_trusted(client: str, trusted_proxies: Sequence[str]) -> bool:
    """Whether ``client`` (an address) is one of ``trusted_proxies``."""
    if not trusted_proxies or not client:
        return False
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return any(address in net for net in _networks(tuple(trusted_proxies)))


@attrs.frozen
class Forwarded:
    """What a trusted proxy said about the client's view of the daemon."""

    scheme: str | None = None
    host: str | None = None


#: A host name or address with an optional port: nothing that could add a
#: path, credentials or a second URL to the answer.
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?$")


def _first(value: str) -> str:
    # A chain of proxies appends; the first entry is the client's.
    return value.split(",", 1)[0].strip()


def forwarded(
    headers: Mapping[str, str], client: str, trusted_proxies: Sequence[str]
) -> Forwarded:
    """
    ``X-Forwarded-Proto`` and ``X-Forwarded-Host``, when the request comes
    from a trusted proxy; nothing otherwise.

    :param headers: lower-cased names to values.
    """
    if not is_trusted(client, trusted_proxies):
        return Forwarded()
    proto = _first(headers.get("x-forwarded-proto", "")).lower()
    host = _first(headers.get("x-forwarded-host", ""))
    return Forwarded(
        scheme=proto if proto in ("http", "https", "ws", "wss") else None,
        host=host if _HOST.match(host) else None,
    )


def pty_url(
    base: str | None,
    own_scheme: str,
    host: str,
    port: int | None,
    session_id: str,
    via: Forwarded = Forwarded(),
) -> str:
    """
    The ``ws_url`` of a terminal session.

    :param base: ``--pty-public-url`` or the policy's ``pty_public_url``:
        when set it is the whole answer's base, whatever the request says.
    :param own_scheme: ``ws`` or ``wss``, from the PTY listener.
    :param host: the name the client used (its Host header).
    :param port: the PTY port the daemon listens on.
    :param via: what a trusted proxy forwarded: its scheme decides ``ws``
        or ``wss``, and its host (with the port it names, else the scheme's
        default) replaces the Host header and the daemon's port: the proxy
        is what the client reaches, and it routes ``/pty`` on.
    """
    query = f"/pty?session_id={session_id}"
    if base:
        return base.rstrip("/") + query
    scheme = own_scheme
    if via.scheme is not None:
        scheme = "wss" if via.scheme in ("https", "wss") else "ws"
    if via.host is not None:
        return f"{scheme}://{via.host}{query}"
    name = f"[{host}]" if ":" in host else host
    return f"{scheme}://{name}{f':{port}' if port else ''}{query}"
