# -*- test-case-name: tests.policy.test_confinement -*-
"""
Children confined with Landlock: what a rule's ``params.confine*`` keys
ask of the kernel, and whether this kernel can give it.

The path guard decides what a *call* may touch; once a command runs, it
has its OS user's whole file system.  With ``params.confine`` an
endpoint's children (and everything they start) may write only beneath
``confine_write``, read and run only beneath ``confine_read``, signal
only processes of their own command (``confine_signals: own``), and,
where ``confine_tcp_connect`` / ``confine_tcp_bind`` list ports, use TCP
on those ports only.  The kernel enforces it (:mod:`sandboxd.landlock`);
the daemon only says what to ask for.

A policy that asks for what the kernel cannot give is refused when it
loads, as an unknown key is: a confinement that silently did nothing
would be worse than none.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import attrs

from sandboxd import landlock
from sandboxd.endpoints import RouteTable
from sandboxd.policy.document import PolicyError
from sandboxd.policy.rules import EffectiveRule, Params


@attrs.frozen
class Confinement:
    """
    One endpoint's confinement, its paths absolute.

    :ivar options: the command-line options of the child's
        ``landlock.py`` (:func:`sandboxd.landlock.options`).
    """

    read: tuple[str, ...]
    write: tuple[str, ...]
    signals: bool
    tcp_connect: tuple[int, ...] | None
    tcp_bind: tuple[int, ...] | None
    options: tuple[str, ...] = attrs.field(init=False, eq=False)

    def may_write(self, path: str) -> bool:
        """Whether ``path`` (absolute) is below a directory it may write."""
        return bool(path) and any(_below(path, d) for d in self.write)

    @options.default
    def _options(self) -> tuple[str, ...]:
        spec = {
            "read": self.read,
            "write": self.write,
            "signals": self.signals,
            "connect": self.tcp_connect,
            "bind": self.tcp_bind,
        }
        return tuple(landlock.options(spec))


#: The endpoints whose children confine themselves.
CONFINED = (
    "shell",
    "shell_stream",
    "process_start",
    "pty_create_session",
    "code_run",
    "code_context_create",
    "agents_session_create",
    "lsp_session_create",
    "lsp_connect",
)

#: Groups whose endpoints start children that ``confine`` does not reach
#: (yet): git, a browser.
UNCONFINED_GROUPS = {
    "git": "git",
    "browser": "the browser",
}


def unconfined(table: RouteTable, rules: Mapping[str, EffectiveRule]) -> list[str]:
    """
    A warning when ``confine`` is set on endpoints whose children it does
    not reach, so that ``defaults.params.confine`` is not read as more
    than it is.
    """
    missed: set[str] = set()
    for endpoint in table:
        rule = rules.get(endpoint.id)
        if rule is None or not rule.enabled or not rule.params.confine:
            continue
        group = endpoint.group.value
        if group in UNCONFINED_GROUPS:
            missed.add(UNCONFINED_GROUPS[group])
        elif endpoint.id in ("git_status", "git_diff"):
            missed.add("git")
    if not missed:
        return []
    return [
        f"params.confine confines the commands of {', '.join(CONFINED)} only;"
        f" what {', '.join(sorted(missed))} start is not confined"
    ]


def exposed_files(rules: Mapping[str, EffectiveRule]) -> list[str]:
    """
    A warning for each of the daemon's own files (its audit log, token and
    policy files, TLS keys) below a directory confined commands may write:
    the path guard keeps calls away from them, the kernel would not keep
    a command away.
    """
    out: dict[str, str] = {}
    seen: set[str] = set()
    for rule in rules.values():
        confine = confinement_of(rule)
        if confine is None or not rule.enabled:
            continue
        for directory in confine.write:
            # Most rules share one list: each directory is resolved once.
            if directory in seen:
                continue
            seen.add(directory)
            real = os.path.realpath(directory)
            for name in rule.daemon_files:
                if name not in out and _below(name, real):
                    where = rule.source("params.confine_write") or rule.source(
                        "params.confine"
                    )
                    out[name] = (
                        f"{where}: the daemon's own file {name} is below"
                        f" confine_write {directory}: a confined command may change it"
                    )
    return list(out.values())


def _starters() -> dict[str, str]:
    """
    What every confined command starts through: the interpreter (the
    path spawned and its real one), its virtualenv's settings, its
    standard library and extension modules (``-S``: no site packages),
    the library directory it loads from, the script.
    """
    import _ctypes
    import sysconfig

    out = {
        os.path.abspath(sys.executable): "the interpreter confined commands start in",
        os.path.realpath(sys.executable): "the interpreter confined commands start in",
        os.path.realpath(
            os.path.dirname(os.__file__)
        ): "the interpreter's standard library",
        os.path.realpath(
            os.path.dirname(_ctypes.__file__)
        ): "the interpreter's extension modules",
        os.path.realpath(landlock.__file__): "the script that confines commands",
    }
    venv = os.path.join(sys.prefix, "pyvenv.cfg")
    if os.path.exists(venv):
        # It names the interpreter's home, where the standard library is.
        out[os.path.abspath(venv)] = "the interpreter's virtualenv settings"
    libdir = sysconfig.get_config_var("LIBDIR")
    if isinstance(libdir, str) and libdir:
        out.setdefault(os.path.realpath(libdir), "the interpreter's library directory")
    return out


def _check_starters(
    rule: EffectiveRule, directory: str, starters: Mapping[str, str]
) -> None:
    """
    Refuse a ``confine_write`` directory over the interpreter or the
    script every confined command starts through (``starters``): a command
    that changed them would leave the next ones unconfined.
    """
    real = os.path.realpath(directory)
    for name, what in starters.items():
        if _below(name, real):
            where = rule.source("params.confine_write") or rule.source("params.confine")
            raise PolicyError(
                f"{where}: confine_write {directory} holds {what} ({name}):"
                " a confined command could change it and leave the next ones"
                " unconfined; install sandboxd outside the directories"
                " commands may write, or narrow confine_write"
            )


def _below(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _in_home(path: str) -> bool:
    """Whether a confinement path is written from the home (``~``, ``~/...``)."""
    return path == "~" or path.startswith("~/")


def _absolute(
    paths: tuple[str, ...], base_dir: str, home: str | None
) -> tuple[str, ...]:
    out = []
    for path in paths:
        if _in_home(path):
            if not home:
                continue  # no home known: nothing there to grant
            path = home + path[1:]
        out.append(os.path.normpath(os.path.join(base_dir, path)))
    return tuple(out)


def confinement_of(rule: EffectiveRule, home: str | None = None) -> Confinement | None:
    """
    What ``rule`` confines its children to; None when it does not.

    :param home: the child's ``HOME``, for paths written ``~`` or ``~/...``
        (left out when None).
    """
    if not rule.params.confine:
        return None
    return _build(rule, home)


def _build(rule: EffectiveRule, home: str | None) -> Confinement:
    params = rule.params
    return Confinement(
        read=_absolute(params.confine_read, rule.base_dir, home),
        write=_absolute(params.confine_write, rule.base_dir, home),
        signals=params.confine_signals == "own",
        tcp_connect=params.confine_tcp_connect,
        tcp_bind=params.confine_tcp_bind,
    )


def confinement_note(rule: EffectiveRule) -> str | None:
    """
    One sentence for a model about the confinement of ``rule``'s
    commands (None when they are not confined): where they may write,
    whom they may signal, which ports they may use.
    """
    confine = confinement_of(rule)
    if confine is None:
        return None
    shown = [
        p if _in_home(p) else os.path.normpath(os.path.join(rule.base_dir, p))
        for p in rule.params.confine_write
    ]
    parts = [
        "Commands run confined by the kernel: they may write only below "
        + (", ".join(shown) or "nothing")
    ]
    if confine.signals:
        parts.append("signal only processes they started")
    for verb, ports in (
        ("connect to", confine.tcp_connect),
        ("listen on", confine.tcp_bind),
    ):
        if ports is not None:
            listed = ", ".join(map(str, ports))
            parts.append(
                f"{verb} TCP ports {listed} only" if ports else f"{verb} no TCP port"
            )
    return "; ".join(parts) + "."


def _needs(params: Params) -> tuple[int, str]:
    """The Landlock ABI version ``params`` needs, and for what."""
    if params.confine_signals == "own":
        return 6, "confine_signals: own (signals kept within a command)"
    if params.confine_tcp_connect is not None or params.confine_tcp_bind is not None:
        return 4, "confine_tcp_connect / confine_tcp_bind"
    return 1, "confine"


def check(rules: Mapping[str, EffectiveRule], abi: int | None = None) -> None:
    """
    Refuse rules whose confinement this kernel cannot enforce, or whose
    ports are not ports.

    :param abi: the kernel's Landlock ABI version (default: asked).
    :raises PolicyError: naming the rule that asked and what is missing.
    """
    starters: Mapping[str, str] | None = None
    checked: set[str] = set()
    for rule in rules.values():
        params = rule.params
        if not params.confine:
            continue
        for key in ("confine_tcp_connect", "confine_tcp_bind"):
            for port in getattr(params, key) or ():
                if not 0 < port < 65536:
                    where = rule.source(f"params.{key}") or rule.endpoint_id
                    raise PolicyError(f"{where}: {port} is not a TCP port (1-65535)")
        for directory in _build(rule, None).write:
            # Most rules share one list: each directory is looked at once.
            if directory not in checked:
                checked.add(directory)
                if starters is None:
                    starters = _starters()
                _check_starters(rule, directory, starters)
        if abi is None:
            abi = landlock.abi_version()
        needed, what = _needs(params)
        if abi >= needed:
            continue
        where = rule.source("params.confine") or rule.endpoint_id
        have = f"has Landlock ABI {abi}" if abi else "has no Landlock"
        hint = (
            "; set confine_signals: any to confine without it"
            if needed == 6 and abi >= 1
            else ""
        )
        raise PolicyError(
            f"{where}: {what} needs Landlock ABI {needed} and this kernel {have}{hint}"
        )
