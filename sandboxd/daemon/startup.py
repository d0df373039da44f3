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

import importlib
import importlib.util
import os
import sys
import sysconfig
import tempfile
import traceback
from collections.abc import Iterable, Sequence

from sandboxd.access.auth import Identity
from sandboxd.access.gate import is_loopback, lacking_scope
from sandboxd.endpoints import CapabilityGroup, RouteTable
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


def check_endpoint(description: str) -> str:
    """
    ``description`` once Twisted can listen on what it says: an endpoint
    type it knows, with arguments it takes, a TCP port 0-65535.  Asked
    before anything listens, so a typo stops the start with one line, not
    a traceback from the listener.

    :raises PolicyError: naming the string and what is wrong with it.
    """
    from sandboxd.daemon.listener import parsed_endpoint

    try:
        # Parsing builds the endpoint and keeps the reactor for later.
        endpoint = parsed_endpoint(None, description)
    except (ValueError, TypeError, KeyError, IndexError, OSError) as e:
        raise PolicyError(f"cannot listen on {description!r}: {e}") from None
    port = getattr(endpoint, "_port", None)
    if isinstance(port, int) and not 0 <= port <= 65535:
        raise PolicyError(
            f"cannot listen on {description!r}: a port is a number from 0 to 65535"
        )
    return description


def default_host(policy: Policy) -> str:
    """The interface numeric ports bind when none is given."""
    return LOOPBACK_HOST if policy.tokens.local_mode else ANY_HOST


def state_dir_problem(path: str | None) -> str | None:
    """
    Why ``--state-dir`` cannot be written, or None when it can (or none was
    given): a file is made and removed in it, or in the nearest directory
    above it that exists, where the daemon would make it.  Asked once at
    start, so that an operator learns of a read-only or foreign state dir
    from the start-up log rather than from the first link mint's 507.
    """
    if path is None:
        return None
    probe = path
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return (
            f"the state dir {path} cannot be made: {probe} is not a directory; "
            "links cannot be minted, and revocations, counted uses and the "
            "/v1 door's state are not kept"
        )
    try:
        fd, name = tempfile.mkstemp(prefix=".sandboxd-probe-", dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        return (
            f"the state dir {path} is not writable ({e.strerror or e}): links "
            "cannot be minted, and revocations, counted uses and the /v1 "
            "door's state are not kept"
        )
    return None


def check_base_dir(path: str) -> None:
    """
    :raises PolicyError: when the base dir is missing or not a directory
        (every command would start in a directory that is not there).
    """
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise PolicyError(f"the base dir {path!r} {what}")


def import_commands(spec: str) -> None:
    """
    Import a template's commands: a ``.py`` file path or a module name.

    Its import registers commands and routes; it runs before the policy is
    validated so that the policy may name the routes it adds.  A template
    written for the seed's server imports ``agent_sandbox.server``: during
    the import that name is sandboxd's face of it
    (:mod:`sandboxd.seedface`), whatever else is installed.
    """
    from sandboxd.seedface.finder import seed_face

    with seed_face():
        _import_template(spec)


def _import_template(spec: str) -> None:
    if spec.endswith(".py") or os.sep in spec:
        path = os.path.abspath(spec)
        if not os.path.exists(path):
            raise PolicyError(f"--commands: no such file {spec!r}")
        name = "sandboxd_commands_" + os.path.splitext(os.path.basename(path))[0]
        if name in sys.modules:
            return
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise PolicyError(f"--commands: cannot import {spec!r}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    else:
        importlib.import_module(spec)


def import_templates(specs: Iterable[str]) -> None:
    """
    Import each ``--commands`` template, as the start would.

    A template that fails (a typo, a missing module, a command its own
    arguments do not fit) stops the start with one line naming the
    template, the error and the template's line it came from, rather than
    the interpreter's traceback through the daemon's start-up.

    :raises PolicyError: for the first template that cannot be imported.
    """
    for spec in specs:
        try:
            import_commands(spec)
        except PolicyError:
            raise
        except Exception as e:
            raise PolicyError(
                f"--commands {spec}: {type(e).__name__}: {e}{_where(spec, e)}"
            ) from None


def _where(spec: str, error: BaseException) -> str:
    """`` (at FILE:LINE)``: the template's deepest line in ``error``'s traceback."""
    if isinstance(error, SyntaxError):
        return ""  # its message already names the file and line
    frames = traceback.extract_tb(error.__traceback__)
    path = os.path.abspath(spec) if spec.endswith(".py") else None
    # A module name's frames: any but the daemon's and the import machinery's.
    skip = (
        "<",
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
        sysconfig.get_paths()["stdlib"] + os.sep,
    )
    mine = [
        f
        for f in frames
        if f.filename == path or (path is None and not f.filename.startswith(skip))
    ]
    if not mine:
        return ""
    return f" (at {mine[-1].filename}:{mine[-1].lineno})"


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


#: The groups whose endpoints start children or drive them (commands,
#: terminals, code runs and kernels, git, agents, the browser's worker).
CHILD_GROUPS = frozenset(
    {
        CapabilityGroup.PROCESS,
        CapabilityGroup.TERMINAL,
        CapabilityGroup.DEV_TOOLS,
        CapabilityGroup.AGENTS,
        CapabilityGroup.BROWSER,
        CapabilityGroup.CODE,
        CapabilityGroup.GIT,
        CapabilityGroup.LSP,
    }
)

#: Endpoints of those groups that only read what children printed: they
#: start none and write to none, so a caller holding nothing else cannot
#: make a child do anything.
READS_CHILDREN_ONLY = frozenset({"process_list", "process_detail", "process_output"})


def callers(policy: Policy) -> list[Identity]:
    """
    Every identity a request can be: each token's, and ``anonymous`` when
    requests without credentials get in.  A capability link holds at most
    its minter's scopes, so the minters stand for the links.
    """
    out: list[Identity] = []
    for _, identity in policy.tokens.entries:
        if identity not in out:
            out.append(identity)
    if policy.tokens.anonymous is not None:
        out.append(policy.tokens.anonymous)
    return out


def root_children(policy: Policy, table: RouteTable) -> dict[str, list[str]]:
    """
    The enabled endpoints that would start a child as root (no
    ``params.default_user``), each with the identities holding its scopes.
    An endpoint nobody may call starts nothing.
    """
    who = callers(policy)
    found: dict[str, list[str]] = {}
    for endpoint in table:
        rule = policy.rules[endpoint.id]
        if (
            endpoint.group not in CHILD_GROUPS
            or endpoint.id in READS_CHILDREN_ONLY
            or not rule.enabled
            or rule.params.default_user is not None
        ):
            continue
        able = [i.id for i in who if lacking_scope(i, rule, {}) is None]
        if able:
            found[endpoint.id] = able
    return found


def _some(names: Sequence[str], limit: int) -> str:
    """``a, b, c and 4 more``."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_children_user(policy: Policy, table: RouteTable, euid: int) -> None:
    """
    A root daemon with tokens does not run children as root by default.

    With tokens configured the daemon serves identities narrower than its
    own user; a child of a root daemon that names no user runs as root and
    can read whatever root can (the token files included), so an identity
    that may start one could become any other.  Every enabled endpoint
    that starts children and that some identity holds the scopes for must
    name the user its children run as: a sandbox user, or ``root`` written
    out when that is really what is meant.  An endpoint no identity may
    call is no way in, so a policy whose tokens hold no such scope (only
    file transfer, only the template's commands) starts as it is.

    :param euid: the daemon's effective uid (``os.geteuid()``).
    :raises PolicyError: naming the one key to add, where, the endpoints
        and the identities that could call them.
    """
    if euid != 0 or policy.tokens.local_mode:
        return
    found = root_children(policy, table)
    if not found:
        return
    ids = list(dict.fromkeys(i for able in found.values() for i in able))
    source = policy.document.source
    where = (
        "a policy (none is configured: --policy FILE or ABX_SERVER_POLICY)"
        if source == "none"
        else f"the policy ({source})"
    )
    raise PolicyError(
        "the daemon runs as root with tokens configured, and "
        f"{_some([repr(i) for i in ids], 3)} may call {_some(list(found), 5)}, "
        "whose children would run as root and could read every token. Set "
        f"defaults.params.default_user in {where} to the user commands run as, "
        'e.g. {"defaults": {"params": {"default_user": "user"}}}, or to "root" '
        "if they should run as root"
    )


def groups_on(policy: Policy, table: RouteTable) -> list[str]:
    """The capability groups with at least one enabled endpoint, in table order."""
    names: list[str] = []
    for endpoint in table:
        group = endpoint.group.value
        if policy.rules[endpoint.id].enabled and group not in names:
            names.append(group)
    return names


#: The groups nearly every caller uses, loaded once the daemon listens
#: rather than on their first request (:func:`load_everyday`).
EVERYDAY_GROUPS = (CapabilityGroup.PROCESS, CapabilityGroup.FILE_OPS)


def load_everyday(policy: Policy, table: RouteTable) -> None:
    """
    Attach the handlers of :data:`EVERYDAY_GROUPS` that the policy has on.

    A group's modules are imported on its first request so that a start
    loads only what answering ``/health`` needs; run once the daemon
    listens and is idle, this spares an agent's first command or file
    read the import (several milliseconds) at the cost of the memory the
    modules take, which the first such call would take anyway.
    """
    from sandboxd.routes import load_group

    on = groups_on(policy, table)
    for group in EVERYDAY_GROUPS:
        if group.value in on:
            load_group(table, group)


def startup_line(
    version: str,
    listeners: Sequence[tuple[str, str]],
    policy: Policy,
    groups: Sequence[str],
    traces: str | None = None,
) -> str:
    """
    The one line that says what is running.

    :param listeners: ``(name, address)`` pairs, e.g. ``("http", "127.0.0.1:9000")``.
    :param traces: where spans are sent (the collector's URL), if anywhere.
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
        f"{'; traces to ' + traces if traces else ''}"
    )


def address_text(address: object) -> str:
    """``host:port`` (``[v6]:port``) of a listening address, or a unix path."""
    host = getattr(address, "host", None)
    port = getattr(address, "port", None)
    if host is None or port is None:
        return str(getattr(address, "name", address))
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
