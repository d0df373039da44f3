# -*- test-case-name: tests.test_landlock -*-
"""
Linux Landlock, from Python: what this kernel offers, and a child that
confines itself before it runs a command.

Landlock lets an unprivileged process take rights away from itself and
from everything it starts afterwards: which directories it may read,
run and write beneath, which TCP ports it may bind or connect to, and
whether it may signal processes outside its own domain.  The daemon
cannot do that for a child it starts with ``posix_spawn`` (no code runs
in the child before the exec), so a confined child is started as this
file, run by the daemon's own interpreter with ``-I -S``::

    python -I -S landlock.py --read=DIR --write=DIR [--signals]
        [--tcp-connect=PORTS] [--tcp-bind=PORTS] [--setenv=NAME=VALUE]
        [--unsetenv=NAME] -- EXECUTABLE ARGV0 ARGS...

which builds the ruleset its options describe (:func:`options`), sets
``no_new_privs``, restricts itself and execs ``EXECUTABLE``.  The pid is
the command's from the start, so signals, process groups and exit codes
are unchanged.

This module imports nothing from sandboxd, and of the standard library
only ``ctypes``: the child runs it as a plain script, isolated from the
caller's environment and site packages, on every confined spawn, so what
it imports is time every such command waits.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: True only for a type checker (``typing`` is not imported at run time).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any

# The system calls (the same numbers on every architecture Linux added
# them to after 5.12) and their flags, from <linux/landlock.h>.
_CREATE_RULESET = 444
_ADD_RULE = 445
_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13
TRUNCATE = 1 << 14
IOCTL_DEV = 1 << 15

BIND_TCP = 1 << 0
CONNECT_TCP = 1 << 1

SCOPE_SIGNAL = 1 << 1

#: File-system rights each ABI version knows.
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}

#: The rights a rule on a file (not a directory) may grant.
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV

#: What a directory children may read grants: list, read, run.
READ_RIGHTS = EXECUTE | READ_FILE | READ_DIR

#: The devices every program expects to open whatever its rules: the
#: sinks and sources, its terminal and the pseudo-terminals.
DEVICES = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
)
_DEVICE_RIGHTS = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV | READ_DIR

#: The first ABI version with each feature.
NETWORK_ABI = 4
SIGNALS_ABI = 6


def fs_rights(abi: int) -> int:
    """Every file-system right the kernel's Landlock ``abi`` can take away."""
    return _FS_BY_ABI[max(v for v in _FS_BY_ABI if v <= abi)]


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """
    The kernel's Landlock ABI version; 0 when it has none (too old, not
    built in, not among the active security modules, or a seccomp
    filter that refuses the call).
    """
    try:
        libc = _libc()
    except OSError:
        return 0
    version = libc.syscall(
        _CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION
    )
    return max(int(version), 0)


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _NetPortAttr(ctypes.Structure):
    _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))


def _check(result: int, what: str) -> int:
    if result < 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")
    return result


def restrict(spec: dict[str, Any]) -> None:
    """
    Confine this process (this thread, and everything it execs or starts
    afterwards) to ``spec``:

    - ``read``: directories (or files) beneath which it may list, read and
      run;
    - ``write``: directories beneath which it may also create, change,
      rename and remove;
    - ``signals``: true to signal only processes in its own domain;
    - ``connect``, ``bind``: the only TCP ports it may connect to or bind
      (absent or null: any).

    A path that does not exist is skipped: nothing there to reach.  The
    devices in :data:`DEVICES` stay open to it.

    :raises OSError: the kernel refused; nothing was restricted unless the
        last step (the restriction itself) succeeded.
    """
    abi = abi_version()
    if abi < 1:
        raise OSError(0, "this kernel has no Landlock")
    libc = _libc()
    handled = fs_rights(abi)
    attr = _RulesetAttr(handled_access_fs=handled)
    connect, bind = spec.get("connect"), spec.get("bind")
    if connect is not None or bind is not None:
        if abi < NETWORK_ABI:
            raise OSError(0, f"TCP port rules need Landlock ABI {NETWORK_ABI}")
        attr.handled_access_net = (CONNECT_TCP if connect is not None else 0) | (
            BIND_TCP if bind is not None else 0
        )
    if spec.get("signals"):
        if abi < SIGNALS_ABI:
            raise OSError(0, f"signal scoping needs Landlock ABI {SIGNALS_ABI}")
        attr.scoped = SCOPE_SIGNAL
    fd = _check(
        libc.syscall(
            _CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0
        ),
        "landlock_create_ruleset",
    )
    try:
        _add_paths(libc, fd, spec.get("read", ()), READ_RIGHTS & handled)
        _add_paths(libc, fd, spec.get("write", ()), handled)
        _add_paths(libc, fd, DEVICES, _DEVICE_RIGHTS & handled)
        for right, ports in ((CONNECT_TCP, connect), (BIND_TCP, bind)):
            for port in ports or ():
                rule = _NetPortAttr(allowed_access=right, port=port)
                _check(
                    libc.syscall(_ADD_RULE, fd, _RULE_NET_PORT, ctypes.byref(rule), 0),
                    f"landlock_add_rule(port {port})",
                )
        _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _check(libc.syscall(_RESTRICT_SELF, fd, 0), "landlock_restrict_self")
    finally:
        os.close(fd)


def _add_paths(libc: Any, ruleset: int, paths: Iterable[str], rights: int) -> None:
    for path in paths:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            allowed = rights
            if not os.path.isdir(f"/proc/self/fd/{fd}"):
                allowed &= _FILE_RIGHTS
            rule = _PathBeneathAttr(allowed_access=allowed, parent_fd=fd)
            _check(
                libc.syscall(
                    _ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0
                ),
                f"landlock_add_rule({path})",
            )
        finally:
            os.close(fd)


def options(spec: dict[str, Any]) -> list[str]:
    """
    The command-line options that carry ``spec`` (see :func:`restrict`)
    to the child; :func:`parse` reads them back.
    """
    out = [f"--read={p}" for p in spec.get("read", ())]
    out += [f"--write={p}" for p in spec.get("write", ())]
    if spec.get("signals"):
        out.append("--signals")
    for key in ("connect", "bind"):
        ports = spec.get(key)
        if ports is not None:
            out.append(f"--tcp-{key}=" + ",".join(str(p) for p in ports))
    return out


def parse(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """
    The spec and the command (executable, argv0, arguments) of a child's
    command line, ``argv`` without the script's own name.

    :raises ValueError: an unknown option, or no command after ``--``.
    """
    spec: dict[str, Any] = {"read": [], "write": [], "signals": False}
    for index, arg in enumerate(argv):
        if arg == "--":
            command = list(argv[index + 1 :])
            if len(command) < 2:
                raise ValueError("no command after --")
            return spec, command
        name, _, value = arg.partition("=")
        if name in ("--read", "--write"):
            spec[name[2:]].append(value)
        elif name == "--signals":
            spec["signals"] = True
        elif name in ("--tcp-connect", "--tcp-bind"):
            spec[name[6:]] = [int(p) for p in value.split(",") if p]
        elif name == "--setenv" and "=" in value:
            spec.setdefault("setenv", []).append(value)
        elif name == "--unsetenv" and value:
            spec.setdefault("unsetenv", []).append(value)
        else:
            raise ValueError(f"unknown option {arg!r}")
    raise ValueError("no command after --")


def main(argv: Sequence[str]) -> int:
    """``landlock.py OPTIONS -- EXECUTABLE ARGV0 ARGS...``: confine, then exec."""
    try:
        spec, (executable, *args) = parse(argv[1:])
    except ValueError as e:
        sys.stderr.write(
            f"landlock.py: {e}\nusage: landlock.py [--read=DIR] [--write=DIR]"
            " [--signals] [--tcp-connect=PORTS] [--tcp-bind=PORTS]"
            " [--setenv=NAME=VALUE] [--unsetenv=NAME]"
            " -- EXECUTABLE ARGV0 [ARGS...]\n"
        )
        return 2
    try:
        restrict(spec)
    except OSError as e:
        sys.stderr.write(f"sandboxd: could not confine the command: {e.strerror}\n")
        return 126
    # The command's own values of the loader's variables, which were kept
    # from this interpreter's start (see sandboxd.processes.spawning).
    for item in spec.get("setenv", ()):
        name, _, value = item.partition("=")
        os.environ[name] = value
    for name in spec.get("unsetenv", ()):
        os.environ.pop(name, None)
    try:
        os.execv(executable, args)
    except OSError as e:
        sys.stderr.write(f"sandboxd: cannot run {executable}: {e.strerror}\n")
        return 127 if e.errno == 2 else 126
    return 0  # pragma: no cover (execv does not return)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
