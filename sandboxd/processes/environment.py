# -*- test-case-name: tests.processes.test_command -*-
"""
What a child's environment holds (SPEC §11.3): the daemon's boot snapshot,
the secrets stripped from every child, and validation of a request's
``env``.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sandboxd.access.audit import audit_argv
from sandboxd.errors import Code, bad_request, forbidden, quoted
from sandboxd.policy.defaults import (
    ARG_STRING_MAX_BYTES,
)
from sandboxd.policy.rules import EffectiveRule

#: The environment the daemon started with.  ``POST /env`` changes
#: ``os.environ`` (what later user children inherit); the daemon's own
#: helpers (git, the browser worker, package listings) start from this
#: snapshot instead, so a caller cannot steer them through the environment.
BOOT_ENVIRON: dict[str, str] = dict(os.environ)


class _EnvironSnapshot:
    """
    ``os.environ`` as a plain dict, decoded once per change of the
    environment rather than once per child.

    ``dict(os.environ)`` decodes every name and value through Python-level
    calls, on every command the daemon starts (docs/performance.md).  A
    change is noticed by comparing the bytes mapping behind ``os.environ``
    (POSIX CPython keeps it in ``_data``) with a copy, a C-level compare
    well under a microsecond; whoever changes the environment, and however,
    the next child sees it.
    """

    def __init__(self) -> None:
        self._raw: dict[bytes, bytes] | None = None
        self._decoded: dict[str, str] = {}
        #: Changes each time the environment is found changed.
        self.version = 0
        #: :meth:`without` and :meth:`audit_view`'s last answers, by their key.
        self._without: tuple[Any, dict[str, str]] | None = None
        self._audit: tuple[Any, tuple[dict[str, str], frozenset[str]]] | None = None

    def current(self) -> dict[str, str] | None:
        """
        The decoded environment, brought up to date (not to be changed);
        None where ``os.environ`` cannot be compared cheaply.
        """
        raw = getattr(os.environ, "_data", None)
        if not isinstance(raw, dict):
            return None
        if raw != self._raw:
            self._raw = dict(raw)
            self._decoded = dict(os.environ)
            self.version += 1
        return self._decoded

    def copy(self) -> dict[str, str]:
        """A fresh dict of the daemon's current environment."""
        current = self.current()
        return dict(os.environ) if current is None else dict(current)

    def without(self, drop: frozenset[str]) -> dict[str, str]:
        """
        A fresh dict of the current environment minus ``drop`` and the
        daemon's own secrets: filtered once per change of either (a child's
        environment is forty names or more, filtered on every command).
        """
        current = self.current()
        if current is None:
            return _filtered(dict(os.environ), drop)
        key = (self.version, drop)
        if self._without is None or self._without[0] != key:
            self._without = (key, _filtered(current, drop))
        return dict(self._without[1])

    def audit_view(
        self, names: frozenset[str]
    ) -> tuple[dict[str, str], frozenset[str]]:
        """
        What :func:`note_argv` masks by, without a request's ``env``: the
        boot and current environments together (not to be changed), and
        ``names`` with the daemon's own secrets; once per change of either.
        """
        current = self.current()
        key = (self.version, names)
        if current is not None and self._audit is not None and self._audit[0] == key:
            return self._audit[1]
        environ = dict(BOOT_ENVIRON)
        environ.update(dict(os.environ) if current is None else current)
        hidden = frozenset(
            names.union(n for n in environ if n.startswith(_SECRET_PREFIXES))
        )
        if current is not None:
            self._audit = (key, (environ, hidden))
        return environ, hidden


def _filtered(env: Mapping[str, str], drop: frozenset[str]) -> dict[str, str]:
    """``env`` without ``drop`` and the daemon's own secrets."""
    return {
        k: v
        for k, v in env.items()
        if k not in drop and not k.startswith(_SECRET_PREFIXES)
    }


_ENVIRON = _EnvironSnapshot()

#: Names never passed to a child, whatever the policy says.
_SECRET_PREFIXES = ("ABX_SERVER_",)


#: The children's ``PATH`` when the daemon was started without one.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def login_defaults(environ: Mapping[str, str], uid: int) -> dict[str, str]:
    """
    What a login would have set that ``environ`` lacks: ``HOME``, ``USER``
    and ``LOGNAME`` from ``uid``'s password entry, and a ``PATH``.  A
    service manager sets the first three only for a service with a user of
    its own (systemd's ``User=``), and an empty environment has none; the
    children (a build, a package manager, an agent) look for their home
    and their tools there.
    """
    missing = {} if "PATH" in environ else {"PATH": DEFAULT_PATH}
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return missing
    for name, value in (
        ("HOME", entry.pw_dir),
        ("USER", entry.pw_name),
        ("LOGNAME", entry.pw_name),
    ):
        if name not in environ:
            missing[name] = value
    return missing


def secret_names(context: Any, rule: EffectiveRule | None) -> set[str]:
    """Environment names removed from every child's environment."""
    names = set(context.policy.secret_env_names()) if context is not None else set()
    if rule is not None:
        names.update(rule.params.env_deny)
    return names


def refuse_secret_variables(context: Any, extra: Mapping[str, str]) -> None:
    """
    Refuse a child's own variable named as one of the daemon's secrets (a
    token's variable, an ``ABX_SERVER_*`` name), as the seed does: dropping
    it quietly would run the command without what was asked for.

    :raises ApiError: 403 ``protected_variable`` naming the variable.
    """
    secrets = context.policy.secret_env_names()
    for name in extra:
        if name in secrets or name.startswith(_SECRET_PREFIXES):
            raise forbidden(
                f"the variable {quoted(name)} holds the daemon's secret and cannot be set",
                Code.PROTECTED_VARIABLE,
                rule="policy:auth.tokens",
                variable=name,
            )


def child_environment(
    context: Any,
    rule: EffectiveRule | None,
    extra: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
    drop: frozenset[str] | None = None,
) -> dict[str, str]:
    """
    The environment of a new child: the daemon's (which ``POST /env``
    changes), plus ``extra``, minus secrets and ``env_deny``.

    :param drop: :func:`secret_names` of ``context`` and ``rule``, when
        the caller has them already (for :func:`note_argv` too).
    """
    if drop is None:
        drop = frozenset(secret_names(context, rule))
    if base is not None:
        return _filtered({**base, **(extra or {})}, drop)
    env = _ENVIRON.without(drop)
    if extra:
        env.update(_filtered(extra, drop))
    return env


def note_argv(
    request: Any,
    argv: Sequence[str],
    extra: Mapping[str, str] | None = None,
    hidden: frozenset[str] | None = None,
) -> None:
    """
    Put what runs into the request's audit record (SPEC §20): the argv,
    capped, without the values of secret and ``env_deny`` names, and
    ``confined`` when the rule confines it (``params.confine``).

    :param extra: the request's ``env``, whose values count as well.
    :param hidden: the request's :func:`secret_names`, when the caller has
        them already.
    """
    if hidden is None:
        hidden = frozenset(secret_names(request.context, request.rule))
    environ, names = _ENVIRON.audit_view(hidden)
    if extra:
        environ = {**environ, **extra}
        names = names.union(n for n in extra if n.startswith(_SECRET_PREFIXES))
    request.audit["argv"] = audit_argv(argv, names, environ)
    if request.rule.params.confine:
        request.audit["confined"] = True


def validate_env(value: Any) -> dict[str, str]:
    """A request's ``env`` object: string names (no ``=``/NUL) to string values."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request("'env' must be an object of strings")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k or "=" in k or "\x00" in k:
            raise bad_request(f"invalid environment name {quoted(k)}")
        if not isinstance(v, str):
            # Strings only, as the schema says: a number would be a guess
            # at its spelling (1.0 or 1?).
            raise bad_request(f"the value of {quoted(k)} must be a string")
        if "\x00" in v:
            # The kernel's environment ends each entry at a NUL.
            raise bad_request(f"the value of {quoted(k)} must not contain NUL")
        entry = len(os.fsencode(k)) + len(os.fsencode(v)) + 2  # '=' and NUL
        if entry > ARG_STRING_MAX_BYTES:
            raise bad_request(
                f"the environment entry {k[:40]!r} is {entry} bytes; "
                f"the kernel takes at most {ARG_STRING_MAX_BYTES}"
            )
        out[k] = v
    return out


def keep_only(mapping: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The entries of ``mapping`` whose names are in ``names``."""
    wanted = set(names)
    return {k: v for k, v in mapping.items() if k in wanted}
