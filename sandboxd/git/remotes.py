# -*- test-case-name: tests.git.test_outcomes -*-
"""
Which remotes git may talk to (SPEC §24), decided by the daemon before git
starts.

git itself is told to speak only ``https`` (and ``ssh`` when the policy
lists it) and never to follow a redirect; this module refuses every other
form up front with a clear error, matches ``url_allow``/``url_deny``,
resolves the host and refuses private addresses when
``block_private_networks`` is on, and hands git the address it checked
(``http.curloptResolve``), so a second lookup by git cannot land somewhere
else (DNS rebinding).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

import attrs

from sandboxd.access.audit import redact_url_secrets, secret_param
from sandboxd.browser.urlpolicy import (
    UrlTarget,
    ip_literal,
    is_loopback_name,
    is_private_address,
)
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    forbidden,
    policy_rule,
    remote_error,
)
from sandboxd.policy.rules import EffectiveRule

#: ``user@host:path``: git's scp-like ssh form.
_SCP_LIKE = re.compile(
    r"^(?:(?P<user>[^@/]+)@)?(?P<host>[^:/\[\]]+|\[[^\]]+\]):(?P<path>.*)$"
)

Resolver = Callable[[str, int], list[str]]


def system_resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (blocking: run it in a thread)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


@attrs.frozen
class Remote:
    """A remote URL the policy allows, as git will be given it."""

    url: str
    scheme: str
    host: str
    port: int
    path: str

    @property
    def origin(self) -> str:
        """``scheme://host[:port]``: what git names in its prompts."""
        default = {"https": 443, "ssh": 22}.get(self.scheme)
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "" if self.port == default else f":{self.port}"
        return f"{self.scheme}://{host}{port}"


def _secret_params(query: str) -> list[str]:
    """
    The parameters in a URL's query whose names say their value is a
    secret, as a message may name them: ``name=`` (a bare item matching
    may be the secret itself, so it is only counted).
    """
    names = []
    for pair in re.split(r"[&;]", query):
        name, equals, _ = pair.partition("=")
        if secret_param(unquote(name)):
            names.append(f"{unquote(name)[:40]}=" if equals else "a bare item")
    return names


def _refuse(message: str, rule: str) -> ApiError:
    return forbidden(message, Code.URL_NOT_ALLOWED, rule=rule)


def parse_remote(url: Any, rule: EffectiveRule) -> Remote:
    """
    Parse ``url`` and refuse every form outside the policy.

    :raises ApiError: 400 ``invalid_param`` for a URL that is not one, or
        that carries credentials; 403 ``url_not_allowed`` for a transport or
        destination the policy does not allow.
    """
    if not isinstance(url, str) or not url or "\x00" in url or "\n" in url:
        raise bad_request("'url' must be a non-empty string")
    if url.startswith("-"):
        raise bad_request("'url' must not start with '-'")
    protocols = rule.params.git_protocols
    protocols_rule = policy_rule(rule, "params.git_protocols")
    if "::" in url.split("/", 1)[0]:
        # git's remote helper syntax (ext::, fd::, any transport::address)
        # runs programs: never.
        raise _refuse(
            f"remote helper URLs ({url.split('::', 1)[0]}::) are never allowed",
            "guard:git_protocols",
        )
    scp = _SCP_LIKE.match(url) if "://" not in url else None
    if scp is not None:
        if "ssh" not in protocols:
            raise _refuse(
                "ssh remotes are not allowed (allowed: " + ", ".join(protocols) + ")",
                protocols_rule,
            )
        host = scp.group("host").strip("[]")
        return _checked(
            Remote(url, "ssh", host.lower(), 22, "/" + scp.group("path")), rule
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise bad_request(f"not a valid URL: {redact_url_secrets(url)!r}") from None
    scheme = parts.scheme.lower()
    if not scheme:
        raise _refuse(
            "local paths are not remotes; give an https URL", "guard:git_protocols"
        )
    if scheme not in ("https", "ssh") or scheme not in protocols:
        raise _refuse(
            f"the {scheme}:// transport is not allowed"
            f" (allowed: {', '.join(protocols)})",
            protocols_rule if scheme in ("https", "ssh") else "guard:git_protocols",
        )
    if not parts.hostname:
        raise bad_request(f"the URL has no host: {redact_url_secrets(url)!r}")
    if scheme == "https" and (parts.username or parts.password):
        if not rule.params.allow_url_credentials:
            raise bad_request(
                "credentials in the URL are refused (they would land in argv and"
                " .git/config); pass 'auth' instead",
            )
    secret_params = _secret_params(parts.query)
    if secret_params and not rule.params.allow_url_credentials:
        raise bad_request(
            f"the URL's query holds a credential ({', '.join(secret_params)}), which"
            " is refused (it would land in argv and .git/config); pass 'auth'"
            " instead: a credential the policy names, or a username and password",
        )
    default_port = 443 if scheme == "https" else 22
    return _checked(
        Remote(
            url,
            scheme,
            parts.hostname.lower(),
            port or default_port,
            parts.path or "/",
        ),
        rule,
    )


def match_target(remote: Remote) -> UrlTarget:
    """What ``url_allow``/``url_deny`` globs are matched against."""
    path = remote.path if remote.path.startswith("/") else "/" + remote.path
    return UrlTarget(remote.scheme, remote.host.lower(), remote.port, path)


def _checked(remote: Remote, rule: EffectiveRule) -> Remote:
    """Apply the ``url_deny`` and ``url_allow`` globs."""
    refused = rule.params.url_refusal(match_target(remote))
    if refused is not None:
        why, leaf = refused
        shown = redact_url_secrets(remote.url)
        raise _refuse(f"the remote {shown} is {why}", policy_rule(rule, leaf))
    return remote


def blocks_private(rule: EffectiveRule) -> bool:
    """
    Whether private networks are refused for git: yes unless a policy layer
    set ``block_private_networks`` (the browser's default is off; git's is
    on, since a clone URL is how an agent is talked into reaching the
    metadata service).
    """
    if rule.source("params.block_private_networks") is None:
        return True
    return rule.params.block_private_networks


def check_addresses(remote: Remote, addresses: list[str], rule: EffectiveRule) -> str:
    """
    The address git is pinned to, after refusing private ones.

    :raises ApiError: 403 ``url_not_allowed`` when one is private and the
        policy blocks them; 502 ``remote_error`` (network) when there is none.
    """
    if not addresses:
        raise remote_error(f"{remote.host} did not resolve", "network")
    if blocks_private(rule):
        source = rule.source("params.block_private_networks")
        rule_text = source or "default:params.block_private_networks"
        if is_loopback_name(remote.host):
            raise _refuse(
                f"the remote {remote.host} is this machine, a private network host",
                rule_text,
            )
        for address in addresses:
            if is_private_address(address):
                raise _refuse(
                    f"the remote {remote.host} resolves to a private network"
                    f" address ({address})",
                    rule_text,
                )
    return addresses[0]


def literal_addresses(remote: Remote) -> list[str] | None:
    """The host's address when it is a literal (no lookup needed), else None."""
    literal = ip_literal(remote.host)
    return [literal] if literal is not None else None


def pin_setting(remote: Remote, address: str) -> str:
    """The ``http.curloptResolve`` value that pins ``remote``'s host to ``address``."""
    shown = f"[{address}]" if ":" in address else address
    return f"http.curloptResolve={remote.host}:{remote.port}:{shown}"
