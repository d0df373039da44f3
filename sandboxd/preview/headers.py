# -*- test-case-name: tests.preview.test_headers -*-
"""
What the preview door changes in the headers it forwards, both ways.

Towards the app: hop-by-hop headers dropped (RFC 9110 §7.6.1), our
credentials taken out (the door's cookie, a link, our token), the Host the
exposure asks for, ``X-Forwarded-*`` added.  Towards the browser:
hop-by-hop headers dropped, a ``Set-Cookie`` for the door's cookie or for a
wider ``Domain`` than the preview's own host dropped (one preview must not
set cookies another preview, or the door, would receive), and a
``Location`` pointing at the app's own ``localhost:PORT`` rewritten to the
preview's URL.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable
from http.cookies import CookieError, SimpleCookie

#: Hop-by-hop headers (RFC 9110 §7.6.1), plus what HTTP/1.1 proxies never pass.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)

#: What never reaches the app from the browser's request: hop-by-hop
#: headers, the framing and Host the door sets itself, our token.
NOT_TO_APP = HOP_BY_HOP | {b"host", b"expect", b"content-length", b"x-access-token"}

#: The door's cookies are named ``sbx_p_PORT``; every ``sbx_p_`` name is ours.
COOKIE_PREFIX = "sbx_p_"

#: The query parameter a link arrives in.
LINK_PARAM = b"sbx_link"

RawHeaders = list[tuple[bytes, list[bytes]]]


def cookie_name(port: int) -> str:
    """The name of the door's cookie for ``port``."""
    return f"{COOKIE_PREFIX}{port}"


def connection_listed(headers: Iterable[tuple[bytes, list[bytes]]]) -> set[bytes]:
    """The header names a ``Connection`` header lists (hop-by-hop too)."""
    names: set[bytes] = set()
    for name, values in headers:
        if name.lower() == b"connection":
            for value in values:
                names.update(v.strip().lower() for v in value.split(b",") if v.strip())
    return names


def end_to_end(headers: RawHeaders, keep_upgrade: bool = False) -> RawHeaders:
    """
    The headers without hop-by-hop ones.

    :param keep_upgrade: keep ``Connection: upgrade`` and ``Upgrade`` (a
        request being spliced).
    """
    # One pass for the names (this runs twice per request, both ways).
    lowered = [name.lower() for name, _ in headers]
    drop = HOP_BY_HOP
    if b"connection" in lowered:
        drop = drop | connection_listed(headers)
    if keep_upgrade:
        drop = drop - {b"upgrade", b"connection"}
    out = []
    for lower, (name, values) in zip(lowered, headers, strict=True):
        if lower in drop:
            continue
        if keep_upgrade and lower == b"connection":
            values = [b"Upgrade"]
        out.append((name, list(values)))
    return out


def cookies_without_ours(values: list[bytes]) -> list[bytes]:
    """``Cookie`` header values with the door's cookies taken out."""
    out = []
    for value in values:
        kept = [
            part
            for part in (p.strip() for p in value.split(b";"))
            if part and not part.decode("latin-1").startswith(COOKIE_PREFIX)
        ]
        if kept:
            out.append(b"; ".join(kept))
    return out


def our_cookie(values: list[bytes], port: int) -> bytes | None:
    """The door's cookie for ``port`` among ``Cookie`` header values."""
    name = cookie_name(port).encode()
    for value in values:
        for part in value.split(b";"):
            key, eq, rest = part.strip().partition(b"=")
            if eq and key == name:
                return rest.strip().strip(b'"')
    return None


def query_without(raw_query: bytes, name: bytes) -> bytes:
    """A query string with every ``name=`` parameter taken out."""
    parts = [p for p in raw_query.split(b"&") if p and p.split(b"=", 1)[0] != name]
    return b"&".join(parts)


def query_value(raw_query: bytes, name: bytes) -> bytes | None:
    """The first value of ``name`` in a raw query string, percent-decoded."""
    for part in raw_query.split(b"&"):
        key, eq, value = part.partition(b"=")
        if key == name and eq:
            return urllib.parse.unquote_to_bytes(value)
    return None


def forwarded(
    headers: RawHeaders,
    client: str,
    host: str,
    proto: str,
    port: int | None,
    prefix: str,
) -> RawHeaders:
    """
    ``X-Forwarded-For/-Proto/-Host/-Port`` (and ``-Prefix`` in path mode),
    and ``X-Real-IP`` (the client, as nginx sets it): the browser's own
    ``X-Real-IP`` and ``Forwarded`` never reach the app, which would take
    them for an address the door vouches for (its rate limits, its logs).
    """
    before = [v for n, vs in headers if n.lower() == b"x-forwarded-for" for v in vs]
    out = [
        (n, vs)
        for n, vs in headers
        if not n.lower().startswith(b"x-forwarded-")
        and n.lower() not in (b"forwarded", b"x-real-ip")
    ]
    chain = b", ".join([*before, client.encode()]) if before else client.encode()
    out.append((b"X-Forwarded-For", [chain]))
    out.append((b"X-Real-IP", [client.encode()]))
    out.append((b"X-Forwarded-Proto", [proto.encode()]))
    out.append((b"X-Forwarded-Host", [host.encode("latin-1")]))
    if port is not None:
        out.append((b"X-Forwarded-Port", [str(port).encode()]))
    if prefix:
        out.append((b"X-Forwarded-Prefix", [prefix.encode()]))
    return out


def cookie_allowed(value: bytes, host: str) -> bool:
    """
    Whether an upstream ``Set-Cookie`` may reach the browser: not one of
    the door's cookies, and no ``Domain`` wider than the preview's host.
    """
    text = value.decode("latin-1")
    name = text.split("=", 1)[0].strip()
    if name.startswith(COOKIE_PREFIX):
        return False
    for attribute in text.split(";")[1:]:
        key, _, domain = attribute.strip().partition("=")
        if key.strip().lower() == "domain":
            domain = domain.strip().lstrip(".").lower()
            if domain and domain != host.lower():
                return False
    return True


def set_cookie(port: int, token: str, max_age: int, path: str, secure: bool) -> bytes:
    """The door's cookie: host-only (no Domain), HttpOnly, SameSite=Lax."""
    cookie: SimpleCookie = SimpleCookie()
    try:
        cookie[cookie_name(port)] = token
    except CookieError:  # pragma: no cover (a link is base64url and a dot)
        raise ValueError("a link cannot be a cookie value") from None
    morsel = cookie[cookie_name(port)]
    morsel["httponly"] = True
    morsel["samesite"] = "Lax"
    morsel["path"] = path
    morsel["max-age"] = max_age
    if secure:
        morsel["secure"] = True
    return morsel.OutputString().encode("latin-1")


#: The app's own address in a ``Location``: with a scheme, or without one
#: (``//localhost:PORT/x``, which a browser would take to its own machine).
_LOCAL = re.compile(
    r"^((?:https?:)?//)(localhost|127\.0\.0\.1|\[::1\]|0\.0\.0\.0):([0-9]+)(?=/|\?|#|$)",
    re.IGNORECASE,
)


def rewrite_location(value: bytes, port: int, origin: str, prefix: str) -> bytes:
    """
    A ``Location`` to the app's own ``http://localhost:PORT/x`` (or
    ``//localhost:PORT/x``) as the preview's ``ORIGIN/x``; a path-absolute
    one gets the path mode's prefix.

    :param origin: the preview's scheme and authority (``http://3000.localhost:9002``).
    """
    text = value.decode("latin-1")
    m = _LOCAL.match(text)
    if m is not None and int(m.group(3)) == port:
        rest = text[m.end() :]
        return (origin + prefix + (rest or "/")).encode("latin-1")
    if prefix and text.startswith("/") and not text.startswith("//"):
        return (prefix + text).encode("latin-1")
    return value


def request_head(method: bytes, target: bytes, headers: RawHeaders) -> bytes:
    """
    A request head as the app gets it, ready to write.  A line break
    inside a value (which would start a header of the browser's making)
    becomes a space, as Twisted's own ``Headers`` does.
    """
    lines = [method + b" " + target + b" HTTP/1.1"]
    for name, values in headers:
        for value in values:
            if b"\n" in value or b"\r" in value:
                value = value.replace(b"\r", b" ").replace(b"\n", b" ")
            lines.append(name + b": " + value)
    lines.append(b"\r\n")
    return b"\r\n".join(lines)
