# -*- test-case-name: tests.preview.test_routing -*-
"""
Which port a request on the preview door is for, from its Host (or path).

Host mode: ``{port}.{domain}`` or ``{port}-{label}.{domain}`` (the domain
defaults to ``localhost``, which browsers resolve to loopback without DNS),
or the host of ``preview_public_url`` when it holds ``{port}``.  Path mode:
``/p/{port}/...`` or ``/p/{port}-{label}/...`` on the door's own host
names (the bare domain, a loopback name, the public URL's host), for
set-ups with one host name; the label is in the path as it is in the host
name, so a labelled exposure opens in either mode at the URL handed out.  Anything
else matches nothing, and the door answers 421: a DNS-rebinding page on
another name never reaches an app.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import NamedTuple

import attrs

from sandboxd.access.gate import host_name, is_loopback
from sandboxd.policy.defaults import PREVIEW_HOST_CACHE


class Target(NamedTuple):
    """
    Where a request goes: a value made for every request through the door,
    so a named tuple (made in one step) rather than a frozen attrs class
    (one guarded attribute store per field).

    :ivar prefix: the path mode's ``/p/PORT`` or ``/p/PORT-LABEL`` (empty
        in host mode), taken off the path sent upstream and put back on
        redirects and the door's cookie path.
    :ivar path: the request target to send upstream (path and query).
    """

    port: int
    label: str | None
    prefix: str
    path: bytes


#: Stands for ``{port}`` while a URL template is parsed.
_MARK = "sbxportsbx"

#: A port and an optional label, as a host name or a path segment holds them.
_PORT_LABEL = r"([0-9]{1,5})(?:-([a-z0-9][a-z0-9-]{0,62}))?"

_PATH = re.compile(rb"^/p/" + _PORT_LABEL.encode() + rb"(?=/|\?|$)")


def _host_pattern(template: str) -> re.Pattern[str]:
    """A regular expression for a host template holding ``{port}``."""
    head, _, tail = template.partition("{port}")
    return re.compile("^" + re.escape(head) + _PORT_LABEL + re.escape(tail) + "$")


@attrs.frozen
class Routes:
    """The door's host patterns, built once per policy."""

    domain: str
    public_url: str | None = None
    #: Host templates: ``{port}.DOMAIN`` and the public URL's.
    host_patterns: tuple[re.Pattern[str], ...] = attrs.field(init=False)
    #: Hosts already matched to ``(port, label)`` or None (bounded).
    _hosts: dict[str, tuple[int, str | None] | None] = attrs.field(
        init=False, factory=dict, eq=False, repr=False
    )

    @host_patterns.default
    def _patterns(self) -> tuple[re.Pattern[str], ...]:
        out = [_host_pattern("{port}." + self.domain)]
        template = self._public_host()
        if template is not None and "{port}" in template:
            out.append(_host_pattern(template))
        return tuple(out)

    def _public_host(self) -> str | None:
        if self.public_url is None:
            return None
        netloc = urllib.parse.urlsplit(self.public_url.replace("{port}", _MARK)).netloc
        return host_name(netloc).replace(_MARK, "{port}", 1)

    def path_hosts(self, name: str) -> bool:
        """Whether ``name`` is one of the door's own names (path mode)."""
        public = self._public_host()
        return name == self.domain or is_loopback(name) or name == public

    def match(self, host: str, target: bytes) -> Target | None:
        """The target of a request, or None (421)."""
        try:
            known = self._hosts[host]
        except KeyError:
            known = self._host_match(host)
            if len(self._hosts) < PREVIEW_HOST_CACHE:
                self._hosts[host] = known
        if known is not None:
            return _target(known[0], known[1], "", target)
        name = host_name(host)
        if self.path_hosts(name):
            found = _PATH.match(target)
            if found is not None:
                rest = target[found.end() :]
                if not rest.startswith(b"/"):
                    rest = b"/" + rest
                prefix = found.group(0).decode()
                label = found.group(2)
                return _target(
                    int(found.group(1)),
                    label.decode() if label is not None else None,
                    prefix,
                    rest,
                )
        return None

    def _host_match(self, host: str) -> tuple[int, str | None] | None:
        """The port and label a Host names by the patterns, or None."""
        name = host_name(host)
        for pattern in self.host_patterns:
            m = pattern.match(name)
            if m is not None:
                return int(m.group(1)), m.group(2)
        return None

    def url(
        self, port: int, label: str | None, door_port: int | None, secure: bool = False
    ) -> str:
        """
        The URL a browser opens for ``port``: the label is in it in every
        mode, since a labelled exposure answers to its label only.

        :param secure: the door listens with TLS: its URLs are ``https``
            (plain HTTP to a TLS door gets no answer at all, which a
            browser shows as an empty response with no hint why).
        """
        name = f"{port}-{label}" if label else str(port)
        if self.public_url is not None:
            if "{port}" in self.public_url:
                return self.public_url.replace("{port}", name) + "/"
            return f"{self.public_url}/p/{name}/"
        suffix = f":{door_port}" if door_port else ""
        scheme = "https" if secure else "http"
        return f"{scheme}://{name}.{self.domain}{suffix}/"


def _target(port: int, label: str | None, prefix: str, path: bytes) -> Target | None:
    if not 0 < port < 65536:
        return None
    return Target(port, label, prefix, path)
