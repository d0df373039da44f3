# -*- test-case-name: tests.browser.test_browser -*-
"""
Which URLs the sandbox's browser may load (SPEC §7.8).

Standard library only: the daemon imports it to refuse a bad URL before a
browser starts, and the browser worker (a separate process that does not
import sandboxd) loads the same file to judge every request the page makes,
redirects included, after resolving its host.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

#: Schemes never loaded, whatever ``url_schemes`` says: they reach the
#: container's files or the browser's own internals, where no path guard
#: or network rule applies.
NEVER_SCHEMES = frozenset(
    {
        "file",
        "filesystem",
        "view-source",
        "chrome",
        "chrome-extension",
        "chrome-untrusted",
        "chrome-search",
        "devtools",
        "javascript",
    }
)

#: Ranges that ``ipaddress`` counts as global but a sandbox must not reach.
_EXTRA_BLOCKED = (ipaddress.ip_network("100.64.0.0/10"),)

#: Names that are this machine whatever a resolver says: Chromium answers
#: ``localhost``, ``localhost.`` and every ``*.localhost`` with loopback
#: itself (RFC 6761 §6.3), without asking the OS resolver the worker asks.
LOOPBACK_NAMES = frozenset(
    {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
)


def error_fields(
    status: int, message: str, type: str, code: str, **extra: Any
) -> dict[str, Any]:
    """
    An error as the worker sends it over its pipe (the daemon's
    ``ApiError.from_body`` reads it back): the body of SPEC §3 plus its
    ``status``.  The worker cannot import ``sandboxd.errors``, so this is the
    one place on its side of the pipe that spells the fields.
    """
    return {"status": status, "error": message, "type": type, "code": code, **extra}


class Refusal(Exception):
    """A URL the policy refuses, with the rule that refused it."""

    def __init__(self, message: str, rule: str) -> None:
        super().__init__(message)
        self.message = message
        self.rule = rule

    def as_json(self) -> dict[str, Any]:
        """The error fields of SPEC §3."""
        return error_fields(
            403, self.message, "PermissionError", "url_not_allowed", rule=self.rule
        )


@dataclass(frozen=True)
class UrlPolicy:
    """
    The URL rules of the browser.

    :ivar rules: leaf key (``params.url_deny``) -> the rule string that set
        it, so a refusal names its rule.
    :ivar also: rules every URL must meet as well (see :func:`combined`).
    """

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    schemes: tuple[str, ...] = ("http", "https")
    block_private: bool = False
    rules: dict[str, str] = field(default_factory=dict)
    also: tuple[UrlPolicy, ...] = ()

    def rule(self, leaf: str) -> str:
        """The rule string of a leaf, or its built-in default."""
        return self.rules.get(leaf) or f"default:{leaf}"

    def to_json(self) -> dict[str, Any]:
        """A JSON object for the worker."""
        return {
            "allow": list(self.allow) if self.allow is not None else None,
            "deny": list(self.deny),
            "schemes": list(self.schemes),
            "block_private": self.block_private,
            "rules": dict(self.rules),
            "also": [other.to_json() for other in self.also],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UrlPolicy:
        """The inverse of :meth:`to_json`."""
        allow = data.get("allow")
        return cls(
            allow=tuple(allow) if allow is not None else None,
            deny=tuple(data.get("deny") or ()),
            schemes=tuple(data.get("schemes") or ("http", "https")),
            block_private=bool(data.get("block_private")),
            rules=dict(data.get("rules") or {}),
            also=tuple(cls.from_json(other) for other in data.get("also") or ()),
        )


def combined(policies: list[UrlPolicy]) -> UrlPolicy:
    """
    One rule for the browser from the URL rules of its endpoints: the
    strictest.  Every request of the one shared page meets it, whichever
    endpoint made the page ask (a click that submits a form, a script
    that sets ``location``), so a URL is loaded only when each endpoint's
    rules let it: every ``url_deny`` applies, a URL must be in every
    ``url_allow`` list and every ``url_schemes`` list, and
    ``block_private_networks`` set on one holds for all.

    :param policies: at least one; those that differ are kept in ``also``.
    """
    distinct: list[UrlPolicy] = []
    for policy in policies:
        if policy not in distinct:
            distinct.append(policy)
    first, rest = distinct[0], tuple(distinct[1:])
    if not rest:
        return first
    blocking = next((p for p in distinct if p.block_private), None)
    rules = dict(first.rules)
    if blocking is not None:
        leaf = "params.block_private_networks"
        rules[leaf] = blocking.rule(leaf)
    return UrlPolicy(
        allow=first.allow,
        deny=first.deny,
        schemes=first.schemes,
        block_private=blocking is not None,
        rules=rules,
        also=rest,
    )


#: The port a URL without one means, by scheme.
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ssh": 22}


@dataclass(frozen=True)
class UrlTarget:
    """
    What ``url_allow`` and ``url_deny`` globs are matched against: a URL's
    scheme, host (lower case, no brackets) and port, and its path with the
    query.  Never its ``user:pass@`` part, which names no place.
    """

    scheme: str
    host: str
    port: int | None
    path: str

    @classmethod
    def of(cls, url: str) -> UrlTarget | None:
        """The target of ``url``, or None when it has no scheme and host."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return None
        if not parts.scheme or not parts.hostname:
            return None
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(parts.scheme.lower(), parts.hostname.lower(), port, path)

    def shown_host(self) -> str:
        """The host as a URL writes it (an IPv6 address in brackets)."""
        return f"[{self.host}]" if ":" in self.host else self.host

    def forms(self) -> list[str]:
        """``host/path`` and ``scheme://host[:port]/path``, as deny globs also see it."""
        host = self.shown_host()
        port = "" if self.port is None else f":{self.port}"
        return [host + self.path, f"{self.scheme}://{host}{port}{self.path}"]


def _split_glob(pattern: str) -> tuple[str | None, str, str | None]:
    """A glob's scheme (or None), host and path (or None: any path)."""
    scheme: str | None = None
    rest = pattern
    if "://" in pattern:
        scheme, rest = pattern.split("://", 1)
    host, slash, path = rest.partition("/")
    return scheme, host, ("/" + path) if slash else None


def glob_names(pattern: str, target: UrlTarget) -> bool:
    """
    Whether a ``url_allow``/``url_deny`` glob names ``target``: its host
    part against the host (with the port when the glob gives one), so no
    ``*`` there reaches into the path, then its path part, if it has one,
    against the path and query.  ``https://*.example.com/*``,
    ``example.com`` (any scheme, port and path), ``*/private/*``.
    """
    scheme, host, path = _split_glob(pattern.strip())
    if scheme is not None and not fnmatch.fnmatchcase(target.scheme, scheme.lower()):
        return False
    shown = target.shown_host()
    host = host.lower()
    if ":" in (host.rpartition("]")[2] if host.startswith("[") else host):
        # The glob names a port: the URL's, or its scheme's default.
        port = target.port or DEFAULT_PORTS.get(target.scheme)
        shown += f":{port}"
    # Brackets in a host are an IPv6 address's, not a glob's set.
    literal = "".join({"[": "[[]", "]": "[]]"}.get(c, c) for c in host)
    if not fnmatch.fnmatchcase(shown, literal):
        return False
    return path is None or fnmatch.fnmatchcase(target.path, path)


def url_refusal(
    deny: tuple[str, ...], allow: tuple[str, ...] | None, target: UrlTarget
) -> tuple[str, str] | None:
    """
    Which glob refuses ``target``, as ``(pattern, leaf key)``, or None.

    A deny glob refuses when it names the target or matches one of its
    :meth:`~UrlTarget.forms` as a whole (what a deny written as one glob
    over the URL means); an allow glob lets through only what it names, so
    an address cannot borrow an allowed host by carrying it in its path.
    """
    forms = target.forms()
    for pattern in deny:
        if glob_names(pattern, target) or any(
            fnmatch.fnmatchcase(form, pattern) for form in forms
        ):
            return pattern, "params.url_deny"
    if allow is not None and not any(glob_names(p, target) for p in allow):
        return "", "params.url_allow"
    return None


def check_url(policy: UrlPolicy, url: str) -> None:
    """
    Refuse ``url`` by scheme and by the ``url_deny``/``url_allow`` globs.

    :raises Refusal: when the policy says no.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        raise Refusal(f"not a valid URL: {url!r}", "guard:url") from None
    scheme = parts.scheme.lower()
    if not scheme:
        raise Refusal(f"the URL has no scheme: {url!r}", "guard:url")
    if scheme in NEVER_SCHEMES:
        raise Refusal(
            f"the scheme {scheme!r} is never allowed in the browser",
            "guard:url_schemes",
        )
    if scheme not in policy.schemes:
        raise Refusal(
            f"the scheme {scheme!r} is not allowed (allowed: {', '.join(policy.schemes)})",
            policy.rule("params.url_schemes"),
        )
    target = UrlTarget.of(url)
    if target is None:
        raise Refusal(f"the URL has no host: {url!r}", "guard:url")
    refused = url_refusal(policy.deny, policy.allow, target)
    if refused is not None:
        pattern, leaf = refused
        if pattern:
            raise Refusal(
                f"the URL {url} is denied by policy ({pattern})", policy.rule(leaf)
            )
        raise Refusal(f"the URL {url} is not in the allowed list", policy.rule(leaf))
    if policy.block_private and parts.hostname:
        check_host(policy, url, parts.hostname)
    for other in policy.also:
        check_url(other, url)


def is_loopback_name(host: str) -> bool:
    """``localhost``, ``localhost.``, ``*.localhost`` and the like, in any case."""
    name = host.lower().rstrip(".")
    return name in LOOPBACK_NAMES or name.endswith(".localhost") or name == ""


def check_host(policy: UrlPolicy, url: str, host: str) -> None:
    """
    What can be said of ``host`` without resolving it: a loopback name, or
    an address literal that is private.

    :raises Refusal: when ``block_private_networks`` is on and it is.
    """
    if not policy.block_private:
        return
    if is_loopback_name(host):
        raise Refusal(
            f"the URL {url} names this machine ({host}), a private network host",
            policy.rule("params.block_private_networks"),
        )
    literal = ip_literal(host)
    if literal is not None:
        check_addresses(policy, url, [literal])


def host_of(url: str) -> str | None:
    """The host of a URL (without brackets), or None."""
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None


def is_private_address(address: str) -> bool:
    """
    Whether an address is anything but the public internet: private,
    loopback, link-local (cloud metadata), shared, reserved, multicast,
    unspecified, and IPv6 forms that embed such an IPv4 address.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return True
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = (
            ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        )
        if embedded is not None and is_private_address(str(embedded)):
            return True
    if ip.is_multicast or not ip.is_global:
        return True
    return any(ip in net for net in _EXTRA_BLOCKED)


def ip_literal(host: str) -> str | None:
    """``host`` when it is an IP address literal, else None."""
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def check_addresses(policy: UrlPolicy, url: str, addresses: list[str]) -> None:
    """
    Refuse ``url`` when any address its host resolved to is private.

    Any, not all: a name that resolves to both a public and a private
    address could be connected to either.

    :raises Refusal: when ``block_private_networks`` is on and one is.
    """
    if not policy.block_private:
        return
    for address in addresses:
        if is_private_address(address):
            raise Refusal(
                f"the URL {url} resolves to a private network address ({address})",
                policy.rule("params.block_private_networks"),
            )
