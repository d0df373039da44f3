# -*- test-case-name: tests.test_startup -*-
"""
Starts that cannot serve are refused, and a start that can says what it is
(SPEC §20).

A listener that cannot bind, a base dir that does not exist, a listener
reachable from outside with no token: each stops the start with one line,
so a supervisor's restart policy sees a failure instead of a daemon that
runs and serves nothing (or serves everyone).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from sandboxd.endpoints import CapabilityGroup, RouteTable
from sandboxd.gate import is_loopback
from sandboxd.policy import Policy, PolicyError

#: Where numeric ports bind in local mode (no token) when --host is not given.
LOOPBACK_HOST = "127.0.0.1"
#: Where numeric ports bind when a token is configured and --host is not given.
ANY_HOST = "0.0.0.0"


class StartRefused(SystemExit):
    """
    A start that cannot serve; the message is the one line an operator sees.

    A :class:`SystemExit`: twistd starts the service outside any handler of
    ours, and a ``SystemExit`` carrying a message makes the interpreter print
    just that line and exit 1 (no traceback, no reactor left running with no
    listener), which is what ``Restart=on-failure`` and container restart
    policies act on.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def default_host(policy: Policy) -> str:
    """The interface numeric ports bind when none is given."""
    return LOOPBACK_HOST if policy.tokens.local_mode else ANY_HOST


def check_base_dir(path: str) -> None:
    """
    :raises PolicyError: when the base dir is missing or not a directory
        (every command would start in a directory that is not there).
    """
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise PolicyError(f"the base dir {path!r} {what}")


def interface_of(description: str) -> str:
    """The interface an endpoint string binds (``0.0.0.0`` when unspecified)."""
    for part in description.replace("\\:", "\x00").split(":"):
        if part.startswith("interface="):
            return part[10:].replace("\x00", ":")
    return "unix" if description.startswith("unix:") else ANY_HOST


def exposed(description: str) -> bool:
    """Whether a listener is reachable from other machines (not unix, not loopback)."""
    iface = interface_of(description)
    return iface != "unix" and not is_loopback(iface)


def check_exposure(
    descriptions: Iterable[str], policy: Policy, allow_unauthenticated: bool
) -> None:
    """
    Local mode stays local: a listener reachable from outside with no token
    is refused unless the operator asked for it.

    :raises PolicyError: naming the listener.
    """
    if not policy.tokens.local_mode or allow_unauthenticated:
        return
    for description in descriptions:
        if exposed(description):
            raise PolicyError(
                f"no token is configured and {description} listens on "
                f"{interface_of(description)}: anyone who can reach it would "
                "control this sandbox. Set ABX_SERVER_TOKEN_FILE or policy "
                "auth.tokens, bind 127.0.0.1, or pass --allow-unauthenticated"
            )


#: The groups whose endpoints start children (commands, terminals, code,
#: agents, the browser's worker).
CHILD_GROUPS = frozenset(
    {
        CapabilityGroup.PROCESS,
        CapabilityGroup.TERMINAL,
        CapabilityGroup.DEV_TOOLS,
        CapabilityGroup.AGENTS,
        CapabilityGroup.BROWSER,
    }
)


def check_children_user(policy: Policy, table: RouteTable, euid: int) -> None:
    """
    A root daemon with tokens does not run children as root by default.

    With tokens configured the daemon serves identities narrower than its
    own user; a child of a root daemon that names no user runs as root and
    can read whatever root can (the token file included).  So every enabled
    endpoint must name the user its children run as: a sandbox user, or
    ``root`` written out when that is really what is meant.

    :param euid: the daemon's effective uid (``os.geteuid()``).
    :raises PolicyError: naming ``params.default_user`` and the endpoints
        that leave it unset.
    """
    if euid != 0 or policy.tokens.local_mode:
        return
    unset = [
        endpoint.id
        for endpoint in table
        if endpoint.group in CHILD_GROUPS
        and policy.rules[endpoint.id].enabled
        and policy.rules[endpoint.id].params.default_user is None
    ]
    if not unset:
        return
    shown = ", ".join(unset[:5]) + (
        f" and {len(unset) - 5} more" if len(unset) > 5 else ""
    )
    raise PolicyError(
        "the daemon runs as root with tokens configured, and params.default_user "
        f"is not set for {shown}: every command would run as root and could read "
        "the token file. Set defaults.params.default_user in the policy to the "
        'sandbox user (e.g. "user"), or to "root" if commands should run as root'
    )


def groups_on(policy: Policy, table: RouteTable) -> list[str]:
    """The capability groups with at least one enabled endpoint, in table order."""
    names: list[str] = []
    for endpoint in table:
        group = endpoint.group.value
        if policy.rules[endpoint.id].enabled and group not in names:
            names.append(group)
    return names


def startup_line(
    version: str,
    listeners: Sequence[tuple[str, str]],
    policy: Policy,
    groups: Sequence[str],
) -> str:
    """
    The one line that says what is running.

    :param listeners: ``(name, address)`` pairs, e.g. ``("http", "127.0.0.1:9000")``.
    """
    ports = ", ".join(f"{name} on {address}" for name, address in listeners)
    tokens = policy.tokens
    if tokens.local_mode:
        auth = "local (no token)"
    else:
        auth = "tokens " + ", ".join(tokens.ids())
    revision = policy.revision if policy.revision is not None else "none"
    return (
        f"sandboxd {version}: {ports or 'no listener'}; base dir {policy.base_dir}; "
        f"auth {auth}; policy {policy.document.source} (revision {revision}"
        f"{', preset ' + policy.preset if policy.preset else ''}); "
        f"groups on: {', '.join(groups) or 'none'}"
    )


def address_text(address: object) -> str:
    """``host:port`` (``[v6]:port``) of a listening address, or a unix path."""
    host = getattr(address, "host", None)
    port = getattr(address, "port", None)
    if host is None or port is None:
        return str(getattr(address, "name", address))
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
