# -*- test-case-name: tests.processes.test_command -*-
"""
What a child runs and as whom (SPEC §7.4): argv from a request's
``command``/``args``, the allow and deny lists, the user a child may run as,
and the names and exit codes reported for it.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import signal
from collections.abc import Mapping
from typing import Any

import attrs

from sandboxd.errors import Code, bad_request, forbidden, policy_rule
from sandboxd.policy.rules import EffectiveRule

#: util-linux's setpriv: switches user and groups, then execs.
SETPRIV = "/usr/bin/setpriv"


def find_executable(name: str, env: Mapping[str, str]) -> str | None:
    """``name`` resolved against the child's PATH (not the daemon's)."""
    if "/" in name:
        return name if os.access(name, os.X_OK) and not os.path.isdir(name) else None
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def command_argv(body: Mapping[str, Any], rule: EffectiveRule) -> list[str]:
    """
    The argv of a ``command`` (SPEC §7.4): ``shlex.split`` without a shell,
    or ``[shell, "-c", command]`` when ``shell`` names an allowed shell.

    :raises ApiError: 400 for a missing or unparsable command or unknown
        shell; 403 ``param_not_allowed`` for a refused command or shell.
    """
    command = body.get("command")
    if not isinstance(command, str) or not command.strip():
        raise bad_request("'command' must be a non-empty string")
    if "\x00" in command:
        raise bad_request("'command' must not contain NUL")
    shell = body.get("shell")
    if shell is not None and shell is not False:
        if not isinstance(shell, str) or not shell:
            raise bad_request("'shell' must be a shell name")
        if os.path.basename(shell) not in rule.params.shells:
            raise forbidden(
                f"the shell {shell!r} is not allowed (allowed: {', '.join(rule.params.shells)})",
                Code.PARAM_NOT_ALLOWED,
                rule=policy_rule(rule, "params.shells"),
            )
        argv = [shell, "-c", command]
        check_command_allowed(rule, [shell])
        check_command_allowed(rule, _first_word(command))
        return argv
    try:
        argv = split_command(command)
    except ValueError as e:
        raise bad_request(f"cannot parse the command: {e}") from None
    if not argv:
        raise bad_request("'command' is empty")
    check_command_allowed(rule, argv)
    return argv


#: Characters that make ``shlex.split`` differ from ``str.split``: quotes,
#: backslashes, and whitespace other than shlex's own four.
_NEEDS_SHLEX = re.compile(r"['\"\\]|[^\S \t\r\n]")


def split_command(command: str) -> list[str]:
    """
    ``shlex.split(command)``, through ``str.split`` when that gives the same
    words (no quotes, no backslashes, only shlex's whitespace): the common
    ``ls -la`` then costs a regex search instead of shlex's character loop.
    """
    if _NEEDS_SHLEX.search(command) is None:
        return command.split()
    return shlex.split(command)


def _first_word(command: str) -> list[str]:
    try:
        words = split_command(command)
    except ValueError:
        words = command.split()
    return words[:1]


def check_command_allowed(rule: EffectiveRule, argv: list[str]) -> None:
    """``allow_commands``/``deny_commands`` on argv[0]'s basename."""
    if not argv:
        return
    name = os.path.basename(argv[0])
    params = rule.params
    if name in params.deny_commands:
        raise forbidden(
            f"the command {name!r} is not allowed",
            Code.PARAM_NOT_ALLOWED,
            rule=rule.source("params.deny_commands"),
        )
    if params.allow_commands is not None and name not in params.allow_commands:
        raise forbidden(
            f"the command {name!r} is not in the allowed list",
            Code.PARAM_NOT_ALLOWED,
            rule=rule.source("params.allow_commands"),
        )


@attrs.frozen
class RunAs:
    """The user a child runs as (only when the daemon is root)."""

    name: str
    uid: int
    gid: int
    home: str

    def apply(self, env: dict[str, str]) -> dict[str, str]:
        """``HOME``, ``USER``, ``LOGNAME`` set to match."""
        env.update(HOME=self.home, USER=self.name, LOGNAME=self.name)
        return env


def resolve_user(requested: Any, rule: EffectiveRule) -> RunAs | None:
    """
    Who a child runs as: the request's ``user``, else ``params.default_user``.

    Only a root daemon can switch; the user must be allowed by
    ``params.users`` (default: any non-root user, and root when
    ``params.default_user`` names it; a request's root only when listed).

    :raises ApiError: 400 unknown user, 403 ``param_not_allowed``.
    """
    wanted = requested if requested is not None else rule.params.default_user
    if wanted is None:
        return None
    try:
        entry = (
            pwd.getpwuid(wanted)
            if isinstance(wanted, int) and not isinstance(wanted, bool)
            else pwd.getpwnam(str(wanted))
        )
    except (KeyError, TypeError):
        raise bad_request(f"unknown user {wanted!r}") from None
    if os.geteuid() != 0:
        if entry.pw_uid == os.geteuid():
            return None
        raise forbidden(
            "the daemon does not run as root, so it cannot switch users",
            Code.PARAM_NOT_ALLOWED,
            rule="guard:users",
        )
    allowed = rule.params.users
    if allowed is not None:
        ok = entry.pw_name in allowed
    else:
        # Root only when the policy itself names it (default_user: root).
        ok = entry.pw_uid != 0 or requested is None
    if not ok:
        raise forbidden(
            f"running as {entry.pw_name!r} is not allowed",
            Code.PARAM_NOT_ALLOWED,
            rule=policy_rule(rule, "params.users"),
        )
    if entry.pw_uid == os.geteuid():
        return None  # the daemon's own user (root named as root): no switch
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def signal_name(number: int) -> str:
    """``SIGTERM`` for 15."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def exit_code(reason: Any) -> int | None:
    """
    SPEC §9's exit code from a ``processEnded``/``processExited`` reason:
    the status, or minus the signal number.
    """
    value = getattr(reason, "value", reason)
    sig = getattr(value, "signal", None)
    if sig:
        return -int(sig)
    code = getattr(value, "exitCode", None)
    return int(code) if code is not None else None
