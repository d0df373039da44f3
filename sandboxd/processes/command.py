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
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from sandboxd.errors import ApiError, Code, bad_request, forbidden, policy_rule
from sandboxd.libc import libc
from sandboxd.policy.commandrules import first_match, split_short_options
from sandboxd.policy.defaults import EXECUTABLE_PATHS_KEPT, USER_ENTRIES_KEPT
from sandboxd.policy.paths import in_system_root
from sandboxd.policy.rules import EffectiveRule

#: util-linux's setpriv: switches user and groups, then execs.
SETPRIV = "/usr/bin/setpriv"

#: coreutils' nice: lowers its own priority, then execs.
NICE = "/usr/bin/nice"


def find_executable(name: str, env: Mapping[str, str]) -> str | None:
    """``name`` resolved against the child's PATH (not the daemon's)."""
    if "/" in name:
        return name if _runnable(name) else None
    return EXECUTABLE_PATHS.find(name, env.get("PATH", os.defpath))


def shell_allowed(shell: str, allowed: Sequence[str]) -> bool:
    """
    Whether a policy's ``shells`` allow ``shell``: an entry that is a name
    (``bash``) allows that name by any path, an entry that is a path
    (``/bin/bash``, as agent-sandbox-server's policies write them) that
    path alone.
    """
    name = os.path.basename(shell)
    for entry in allowed:
        if "/" in entry:
            if "/" in shell and os.path.normpath(entry) == os.path.normpath(shell):
                return True
        elif entry == name:
            return True
    return False


#: The names of the shells a command can be handed to as a string
#: (``NAME -c SCRIPT``): a door that takes an argv checks such an argv as
#: a shell, whether or not the policy's ``shells`` list the name.
SHELL_NAMES = frozenset(
    {
        "sh",
        "bash",
        "rbash",
        "dash",
        "ash",
        "zsh",
        "ksh",
        "mksh",
        "pdksh",
        "oksh",
        "yash",
        "posh",
        "fish",
        "csh",
        "tcsh",
    }
)


def is_shell(program: str) -> bool:
    """Whether ``program`` (a name or a path) is a shell (:data:`SHELL_NAMES`)."""
    return os.path.basename(program) in SHELL_NAMES


def check_shell(shell: Any, rule: EffectiveRule) -> str:
    """
    ``shell`` as a request names it (a name or a path), if the policy's
    ``shells`` allow it: the one decision ``command_argv`` and a terminal's
    start make, and that ``/capabilities/check`` answers with.

    :raises ApiError: 400 ``invalid_param`` for what is no shell name,
        403 ``param_not_allowed`` for a shell the policy leaves out.
    """
    if not isinstance(shell, str) or not shell or "\x00" in shell:
        raise bad_request("'shell' must be a shell name or path")
    if not shell_allowed(shell, rule.params.shells):
        raise forbidden(
            f"the shell {shell!r} is not allowed (allowed: {', '.join(rule.params.shells)})",
            Code.PARAM_NOT_ALLOWED,
            rule=policy_rule(rule, "params.shells"),
        )
    return shell


def terminal_shell_refusal(error: ApiError, rule: EffectiveRule) -> ApiError:
    """
    A terminal's shell refused by :func:`check_shell`, answered as
    agent-sandbox-server answers it: a shell the policy's own ``shells``
    leave out is its policy refusal, 403 ``shell_not_allowed`` (type
    ``PolicyDenied``; its SDK raises ``PolicyDeniedError``); one outside
    the built-in list (no policy set ``shells``) is 400, as its fixed list
    of shells refuses one (``ServerAPIError``).  Both name the rule.
    """
    if error.code is not Code.PARAM_NOT_ALLOWED:
        return error
    if rule.source("params.shells") is not None:
        return forbidden(
            error.message, Code.SHELL_NOT_ALLOWED, "PolicyDenied", **error.extra
        )
    return bad_request(error.message, error.code, **error.extra)


def _runnable(path: str) -> bool:
    return os.access(path, os.X_OK) and not os.path.isdir(path)


def _search(name: str, directories: list[str]) -> str | None:
    for directory in directories:
        candidate = os.path.join(directory or ".", name)
        if _runnable(candidate):
            return candidate
    return None


#: inotify(7) events that can change what a name resolves to in a
#: directory: an entry created, removed, renamed or its mode changed, and
#: the directory itself removed or renamed.
_IN_CHANGES = (
    0x004  # IN_ATTRIB
    | 0x040  # IN_MOVED_FROM
    | 0x080  # IN_MOVED_TO
    | 0x100  # IN_CREATE
    | 0x200  # IN_DELETE
    | 0x400  # IN_DELETE_SELF
    | 0x800  # IN_MOVE_SELF
)
_IN_ONLYDIR = 0x01000000


class ExecutablePaths:
    """
    Where a command name resolves on a ``PATH``, kept until a directory on
    that ``PATH`` changes.

    Resolving ``true`` on a typical ``PATH`` cost eight system calls per
    command (an ``access`` for each directory until the hit, a ``stat``
    for it), the same answer every time.  Here every directory of a
    ``PATH`` whose answer is kept is watched with inotify, and a lookup
    first reads the inotify descriptor (one system call, which finds
    nothing while nothing changed): any change in any watched directory
    (an executable installed, removed, renamed or made (non-)executable, the
    directory itself removed) drops every kept answer and every watch, and
    the next lookup searches again.  The kernel queues the event within
    the call that made the change, so a lookup after it never sees the
    answer from before.

    Not kept: a ``PATH`` with a relative entry (it depends on the daemon's
    working directory), or one whose directories cannot all be watched
    (one missing, inotify unavailable or out of watches): those are
    searched every time, as before.  Where a ``PATH`` entry is a symbolic
    link, the directory it leads to is watched, not the link.
    """

    def __init__(self, size: int = EXECUTABLE_PATHS_KEPT) -> None:
        self.size = size
        self._lock = threading.Lock()
        #: The inotify descriptor; None before first use, -1 where inotify
        #: is unavailable.
        self._fd: int | None = None
        self._watched: dict[str, bool] = {}
        self._found: dict[tuple[str, str], str | None] = {}

    def find(self, name: str, path: str) -> str | None:
        """``name`` resolved on ``path`` (a ``PATH`` value), or None."""
        directories = path.split(os.pathsep)
        with self._lock:
            if not self._ready():
                return _search(name, directories)
            self._forget_if_changed()
            key = (name, path)
            if key in self._found:
                return self._found[key]
            # Watched before the search: a change during it is seen next time.
            keep = len(self._found) < self.size and all(
                self._watch(d) for d in directories
            )
            found = _search(name, directories)
            if keep:
                self._found[key] = found
            return found

    def _ready(self) -> bool:
        if self._fd is None:
            self._fd = _inotify_init()
        return self._fd >= 0

    def _watch(self, directory: str) -> bool:
        if not directory.startswith("/"):
            return False
        known = self._watched.get(directory)
        if known is None:
            known = _add_watch(self._fd, directory)
            self._watched[directory] = known
        return known

    def _forget_if_changed(self) -> None:
        assert self._fd is not None
        try:
            changed = bool(os.read(self._fd, 65536))
        except BlockingIOError:
            return
        except OSError:
            changed = True
        if changed:
            # Start over with a new descriptor: its watches and the events
            # still queued on the old one go with it.
            os.close(self._fd)
            self._fd = _inotify_init()
            self._watched.clear()
            self._found.clear()


def _inotify_init() -> int:
    """A non-blocking inotify descriptor, or -1."""
    c = libc()
    init = getattr(c, "inotify_init1", None)
    if init is None or not hasattr(c, "inotify_add_watch"):
        return -1
    fd = int(init(os.O_NONBLOCK | os.O_CLOEXEC))
    return fd if fd >= 0 else -1


def _add_watch(fd: int | None, directory: str) -> bool:
    """Whether ``directory`` is now watched on ``fd``."""
    if fd is None or fd < 0:
        return False
    add = libc().inotify_add_watch
    return int(add(fd, os.fsencode(directory), _IN_CHANGES | _IN_ONLYDIR)) >= 0


#: Command names resolved on the children's ``PATH``.
EXECUTABLE_PATHS = ExecutablePaths()


def command_argv(
    body: Mapping[str, Any],
    rule: EffectiveRule,
    resolve: Callable[[str], str] | None = None,
) -> list[str]:
    """
    The argv of a ``command`` (SPEC §7.4): ``shlex.split`` without a shell,
    or ``[shell, "-c", command]`` when ``shell`` names an allowed shell.

    :param resolve: for :func:`check_command_allowed`.
    :raises ApiError: 400 for a missing or unparsable command or unknown
        shell; 403 ``command_not_allowed`` for a refused command,
        ``param_not_allowed`` for a refused shell.
    """
    command = command_text(body)
    shell = body.get("shell")
    if shell is not None and shell is not False:
        argv = [check_shell(shell, rule), "-c", command]
        check_command_allowed(rule, [shell])
        check_command_allowed(rule, _words(command))
        return argv
    try:
        argv = split_command(command)
    except ValueError as e:
        raise bad_request(f"cannot parse the command: {e}") from None
    if not argv:
        raise bad_request("'command' is empty")
    return check_command_allowed(rule, argv, resolve)


def command_text(body: Mapping[str, Any]) -> str:
    """
    A request's ``command``, before any rule decides it.

    :raises ApiError: 400 ``invalid_param`` for no text, or text with NUL.
    """
    command = body.get("command")
    if not isinstance(command, str) or not command.strip():
        raise bad_request("'command' must be a non-empty string")
    if "\x00" in command:
        raise bad_request("'command' must not contain NUL")
    return command


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


def _words(command: str) -> list[str]:
    """A shell command's words, as far as ``shlex`` can tell them apart."""
    try:
        return split_command(command)
    except ValueError:
        return command.split()


def system_program(argv: list[str], cwd: str, max_links: int) -> bool:
    """
    Whether ``argv`` names its program by a path below /proc, /sys or
    /dev, as given from ``cwd`` or at any link on the way to the file
    (``/proc/self/exe``, a link in the base to it: the link's own text is
    judged, since resolving ``/proc``'s magic links would hide where they
    are).  A bare name is looked up on the child's ``PATH`` by the child
    and is not judged here.

    :param max_links: links followed before the answer is yes (a loop,
        which the kernel would refuse too).
    """
    if not argv or "/" not in argv[0]:
        return False
    path = os.path.join(cwd, argv[0])
    for _ in range(max_links):
        path = os.path.normpath(path)
        if in_system_root(path):
            return True
        head, tail = os.path.split(path)
        parent = os.path.realpath(head)
        path = os.path.join(parent, tail)
        if in_system_root(path):
            return True
        try:
            target = os.readlink(path)
        except OSError:
            return False  # not a link (or not there): the file itself
        path = os.path.join(parent, target)
    return True


def shell_script(argv: list[str]) -> tuple[str, list[str]] | None:
    """
    What ``SHELL [options] -c SCRIPT [NAME [ARG...]]`` runs, for the
    command rules to check: the script, and the arguments it is handed
    (``ARG...``); None for a shell that runs no ``-c`` script (a script
    file, or an interactive shell), whose argv is checked as it is.
    """
    reads_command = False
    index = 1
    while index < len(argv):
        arg = argv[index]
        if arg in ("--", "-"):
            index += 1
            break
        if arg in _SHELL_OPTIONS_WITH_VALUE:
            index += 2
            continue
        if arg.startswith("--"):
            index += 1
            continue
        if len(arg) > 1 and arg[0] in "-+":
            if arg[0] == "-" and "c" in arg[1:]:
                reads_command = True
            index += 1
            continue
        break
    if not reads_command or index >= len(argv):
        return None
    return argv[index], argv[index + 2 :]


#: A shell's options whose value is the next word.
_SHELL_OPTIONS_WITH_VALUE = frozenset(
    {"-o", "+o", "-O", "+O", "--rcfile", "--init-file"}
)


def check_command_allowed(
    rule: EffectiveRule,
    argv: list[str],
    resolve: Callable[[str], str] | None = None,
) -> list[str]:
    """
    ``allow_commands``/``deny_commands`` on ``argv``, in the seed's pattern
    language (:mod:`sandboxd.policy.commandrules`); the argv to run.

    :param resolve: puts an argument an allow pattern binds to ``{path}``
        through the path guard; the argv returned carries what it answers.
        Without one, such a pattern admits nothing.
    :raises ApiError: 403 ``command_not_allowed`` naming the list that refused.
    """
    if not argv:
        return argv
    if is_shell(argv[0]) and len(argv) > 1:
        # A shell handed a script (``sh -c 'rm -rf x'``) is checked as the
        # ``shell`` and ``command`` fields are: the shell against
        # ``shells``, then the script's own words, and the arguments the
        # script is handed as a command of their own; never as an argv
        # whose first word alone the rules would see.
        check_shell(argv[0], rule)
        script = shell_script(argv)
        if script is not None:
            text, handed = script
            check_command_allowed(rule, [argv[0]])
            check_command_allowed(rule, _words(text))
            check_not_denied(rule, handed)
            return argv
    name = os.path.basename(argv[0])
    params = rule.params
    words = split_short_options(argv)
    check_not_denied(rule, argv, words)
    if params.allow_commands is None:
        return argv
    allowed = first_match(params.allow_commands, words)
    if allowed is None:
        raise forbidden(
            f"the command {name!r} is not in the allowed list",
            Code.COMMAND_NOT_ALLOWED,
            rule=rule.source("params.allow_commands"),
        )
    pattern, paths = allowed
    if not paths:
        return argv
    if resolve is None or words != argv:
        raise forbidden(
            f"the command {name!r} matches {pattern!r}, whose {{path}} can only"
            " be checked in a command without a shell and without grouped options",
            Code.COMMAND_NOT_ALLOWED,
            rule=rule.source("params.allow_commands"),
        )
    out = list(argv)
    for index in paths:
        out[index] = resolve(argv[index])
    return out


def check_not_denied(
    rule: EffectiveRule, argv: list[str], words: list[str] | None = None
) -> None:
    """
    ``deny_commands`` on ``argv`` (``words``: it split already).

    :raises ApiError: 403 ``command_not_allowed`` naming the pattern.
    """
    if not argv:
        return
    denied = first_match(
        rule.params.deny_commands, split_short_options(argv) if words is None else words
    )
    if denied is not None:
        raise forbidden(
            f"the command {os.path.basename(argv[0])!r} is not allowed "
            f"(denied by {denied[0]!r})",
            Code.COMMAND_NOT_ALLOWED,
            rule=rule.source("params.deny_commands"),
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


def _signature(path: str) -> tuple[int, int, int, int, int] | None:
    """What changes when ``path`` is written, replaced or removed; None if absent."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _first_source_is_files(nsswitch: str) -> bool:
    """Whether ``nsswitch``'s ``passwd`` line asks ``files`` first."""
    try:
        with open(nsswitch, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, sources = line.partition(":")
                if key.strip() == "passwd":
                    words = sources.split("#", 1)[0].split()
                    return bool(words) and words[0] == "files"
    except OSError:
        return False
    return True  # no passwd line: glibc's default is files first


class UserEntries:
    """
    Password entries by the name or uid asked for, kept while
    ``/etc/passwd`` and ``/etc/nsswitch.conf`` are unchanged.

    A command runs as ``params.default_user`` (root, for a root daemon):
    looking that user up on every command cost an open, a read and a
    parse of ``/etc/passwd`` (and NSS's own checks), the same answer each
    time.  Here a command costs two ``stat`` calls.  Only entries that are
    the ``files`` source's answer are kept (that source first in NSS, the
    entry's exact line in the file), so an entry from another source (a
    directory service, systemd's dynamic users) is looked up every time,
    as before.  Unknown users are never kept.
    """

    def __init__(
        self,
        passwd: str = "/etc/passwd",
        nsswitch: str = "/etc/nsswitch.conf",
        size: int = USER_ENTRIES_KEPT,
    ) -> None:
        self.passwd = passwd
        self.nsswitch = nsswitch
        self.size = size
        self._signatures: tuple[Any, Any] | None = None
        self._files_first = False
        self._lines: frozenset[str] = frozenset()
        self._entries: dict[tuple[bool, Any], pwd.struct_passwd] = {}

    def lookup(self, wanted: Any) -> pwd.struct_passwd:
        """
        ``pwd.getpwuid`` for an int, else ``pwd.getpwnam``.

        :raises KeyError: no such user.
        :raises TypeError: not a name.
        """
        by_uid = isinstance(wanted, int) and not isinstance(wanted, bool)
        key = (by_uid, wanted)
        signatures = (_signature(self.passwd), _signature(self.nsswitch))
        if signatures != self._signatures:
            self._refresh(signatures)
        entry = self._entries.get(key)
        if entry is not None:
            return entry
        entry = pwd.getpwuid(wanted) if by_uid else pwd.getpwnam(str(wanted))
        if self._keepable(entry) and len(self._entries) < self.size:
            self._entries[key] = entry
        return entry

    def _refresh(self, signatures: tuple[Any, Any]) -> None:
        self._entries.clear()
        self._signatures = signatures
        self._lines = frozenset()
        self._files_first = signatures[0] is not None and _first_source_is_files(
            self.nsswitch
        )
        if not self._files_first:
            return
        try:
            # Lines end at LF only, as for NSS's files source: a CR is part
            # of its field, not the start of another line.
            with open(
                self.passwd, encoding="utf-8", errors="surrogateescape", newline="\n"
            ) as f:
                self._lines = frozenset(line.rstrip("\n") for line in f)
        except OSError:
            self._files_first = False

    def _keepable(self, entry: pwd.struct_passwd) -> bool:
        if not self._files_first:
            return False
        line = ":".join(
            (
                entry.pw_name,
                entry.pw_passwd,
                str(entry.pw_uid),
                str(entry.pw_gid),
                entry.pw_gecos,
                entry.pw_dir,
                entry.pw_shell,
            )
        )
        return line in self._lines


#: The daemon's password entries.
USER_ENTRIES = UserEntries()


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
        entry = USER_ENTRIES.lookup(wanted)
    except (KeyError, TypeError):
        raise bad_request(f"unknown user {wanted!r}") from None
    euid = os.geteuid()
    if euid != 0:
        if entry.pw_uid == euid:
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
    if entry.pw_uid == euid:
        return None  # the daemon's own user (root named as root): no switch
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def signal_number(value: Any) -> int:
    """
    A request's ``signal``: a number, its decimal text, or a name with or
    without ``SIG`` in any case (``15``, ``"15"``, ``"TERM"``, ``"SIGTERM"``).

    :raises ApiError: 400 ``invalid_param`` for anything else.
    """
    if isinstance(value, bool) or value is None:
        raise bad_request("'signal' must be a signal number or name")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip().upper()
        if text.lstrip("-").isdigit():
            return int(text)
        name = text if text.startswith("SIG") else "SIG" + text
        try:
            return int(signal.Signals[name])
        except KeyError:
            pass
    raise bad_request(f"unknown signal {value!r}")


#: Each language ``/code/run`` runs: its interpreters, first found on the
#: child's PATH wins, and the flag that runs a program given as an
#: argument.  Passing the code as an argument (not a file) keeps the
#: seed's behaviour: Python's ``sys.path[0]`` and Node's ``require``
#: resolve against the cwd.
RUNTIMES: dict[str, tuple[tuple[str, ...], str]] = {
    "python": (("python3", "python"), "-c"),
    "node": (("node", "nodejs"), "-e"),
    "bash": (("bash",), "-c"),
}


def language_name(value: Any) -> str:
    """
    A language :data:`RUNTIMES` knows, named in any case.

    :raises ApiError: 400 ``invalid_param`` naming the ones it knows.
    """
    name = value.lower() if isinstance(value, str) else value
    if isinstance(name, str) and name in RUNTIMES:
        return name
    raise bad_request(
        f"Unsupported language {value!r}; use one of: {', '.join(RUNTIMES)}"
    )


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
