"""
``posix_spawn(3)`` through ctypes, with what ``os.posix_spawn`` lacks.

The child is set up entirely by file actions and attributes, with no
Python in it: its own session (``POSIX_SPAWN_SETSID``), default handlers
for the signals the daemon ignores, an empty signal mask, its working
directory (``addchdir_np``), its standard streams, and every other
descriptor closed (``addclosefrom_np``).

``os.posix_spawn`` has no working directory and no closefrom, so
Twisted's spawn path lists ``/proc/self/fd`` and asks ``fcntl`` about each
descriptor on every spawn, and forks the whole daemon (running Python in
the child) whenever the child needs another directory.  Here a spawn is
one C call whatever the directory.  Where the C library lacks any of
these (musl before 1.2.2, glibc before 2.34), :data:`AVAILABLE` is false
and the caller keeps Twisted's spawn.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate
from typing import Any

import attrs

from sandboxd.libc import libc as c_library
from sandboxd.policy.defaults import (
    SPAWN_ACTIONS_KEPT,
    SPAWN_ENVIRONMENT_KEPT_BYTES,
    SPAWN_ENVIRONMENTS_KEPT,
)

# glibc and musl share these values (spawn.h).
_POSIX_SPAWN_SETSIGDEF = 0x04
_POSIX_SPAWN_SETSIGMASK = 0x08
_POSIX_SPAWN_SETSID = 0x80

# Generous sizes for the opaque C types (glibc x86-64: file actions 80
# bytes, attributes 336, sigset_t 128; musl's are smaller).
_OPAQUE_BYTES = 1024
#: File actions are kept by the hundred (:data:`_ACTIONS`): three times
#: the largest C library's, not the attributes' room.
_ACTIONS_BYTES = 256

_REQUIRED = (
    "posix_spawn",
    "posix_spawn_file_actions_init",
    "posix_spawn_file_actions_destroy",
    "posix_spawn_file_actions_adddup2",
    "posix_spawn_file_actions_addopen",
    "posix_spawn_file_actions_addchdir_np",
    "posix_spawn_file_actions_addclosefrom_np",
    "posix_spawnattr_init",
    "posix_spawnattr_destroy",
    "posix_spawnattr_setflags",
    "posix_spawnattr_setsigdefault",
    "posix_spawnattr_setsigmask",
    "sigemptyset",
    "sigaddset",
)


def _load_libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    libc = c_library()
    if libc is None or not all(hasattr(libc, name) for name in _REQUIRED):
        return None
    libc.posix_spawn.argtypes = [
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,  # char *const argv[], see _Strings
        ctypes.c_void_p,  # char *const envp[]
    ]
    libc.posix_spawn_file_actions_adddup2.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
    ]
    libc.posix_spawn_file_actions_addopen.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_uint,
    ]
    libc.posix_spawn_file_actions_addchdir_np.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
    ]
    libc.posix_spawn_file_actions_addclosefrom_np.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
    ]
    libc.posix_spawnattr_setflags.argtypes = [ctypes.c_void_p, ctypes.c_short]
    libc.sigaddset.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return libc


_LIBC = _load_libc()


def _pipes_reopen() -> bool:
    """
    Whether a pipe's read end can be opened again for writing through
    ``/proc/self/fd`` (Linux with ``/proc`` mounted): then a child's
    output pipe needs no write end in the daemon (see
    :attr:`SpawnPlan.writers`).
    """
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return False
    try:
        os.close(write_end)
        os.close(os.open(f"/proc/self/fd/{read_end}", os.O_WRONLY | os.O_CLOEXEC))
    except OSError:
        return False
    finally:
        os.close(read_end)
    return True


#: Whether children's output pipes are opened by the children themselves.
REOPEN_PIPES = _LIBC is not None and _pipes_reopen()

#: Whether :func:`posix_spawn` can be used on this system.
AVAILABLE = _LIBC is not None


def _settable_signals(libc: Any) -> tuple[int, ...]:
    """
    Every signal a child's disposition can be reset for: all but SIGKILL,
    SIGSTOP and the C library's own (which ``sigaddset`` refuses).
    """
    if libc is None:
        return ()
    scratch = ctypes.create_string_buffer(_OPAQUE_BYTES)
    libc.sigemptyset(scratch)
    return tuple(
        n
        for n in range(1, signal.NSIG)
        if n not in (signal.SIGKILL, signal.SIGSTOP) and libc.sigaddset(scratch, n) == 0
    )


#: Pass as ``default_signals`` to reset every disposition in the child.
#: The result is what the C library arranges anyway (handlers and ignored
#: signals back to default), but glibc then sets each signal once instead
#: of asking about each first: 62 system calls in the suspended child
#: instead of 120, while the caller waits.
ALL_SIGNALS = _settable_signals(_LIBC)


class _Strings:
    """
    NUL-terminated strings laid out in one C buffer, and the address of
    each: the pieces of an ``argv`` or ``envp`` array.

    A ctypes array of ``c_char_p`` filled item by item keeps a Python
    reference per item (a formatted dictionary key each), which cost more
    than the rest of a spawn's preparation for a forty-name environment;
    here the bytes are copied once and the addresses are plain integers.
    """

    __slots__ = ("addresses", "buffer", "size")

    def __init__(self, items: Sequence[bytes]) -> None:
        blob = b"\0".join(items) + b"\0" if items else b""
        self.size = len(blob)
        self.buffer = ctypes.create_string_buffer(blob, max(1, self.size))
        base = ctypes.addressof(self.buffer)
        # "L" is the C long, pointer-sized on Linux (LP64 and ILP32 alike).
        self.addresses = array(
            "L",
            accumulate((len(item) + 1 for item in items[:-1]), initial=base)
            if items
            else (),
        )


def _pointers(*parts: _Strings) -> array[int]:
    """A NULL-terminated array of the addresses in ``parts``, in order."""
    pointers = array("L")
    for part in parts:
        pointers.extend(part.addresses)
    pointers.append(0)
    return pointers


@attrs.frozen
class SpawnPlan:
    """
    Everything a child needs, as C data, prepared on the reactor thread.

    :ivar fds: child descriptor → parent descriptor to ``dup2`` onto it.
    :ivar writers: child descriptors whose parent descriptor is a pipe's
        read end, which the child opens again for writing (through
        ``/proc/self/fd``) instead: the daemon then holds no write end
        between making the pipe and the spawn, so no other child spawned
        meanwhile gets a copy of it, and the pipe ends when this child's
        tree lets go of it, not once every other child spawned meanwhile
        has exec'd too.
    :ivar env_head: the first entries of ``env`` already laid out in C
        (see :func:`plan`), or None.
    """

    executable: bytes
    argv: Sequence[bytes]
    env: Sequence[bytes]
    cwd: bytes | None
    fds: Mapping[int, int]
    default_signals: Sequence[int]
    env_head: _Strings | None = None
    writers: frozenset[int] = frozenset()

    def c_env(self) -> tuple[list[_Strings], array[int]]:
        """
        The ``envp`` array (and the buffers its pointers point into, to
        keep alive for the call).
        """
        if self.env_head is None:
            parts = [_Strings(self.env)]
        else:
            head = self.env_head
            parts = [head, _Strings(self.env[len(head.addresses) :])]
        return parts, _pointers(*parts)


@attrs.frozen
class _Encoded:
    """An environment's entries encoded, and laid out in C."""

    entries: list[bytes]
    strings: _Strings


#: Environments encoded and laid out in C, by their entries but the last.
#: Children's environments differ from one another in their last entry
#: (the tree marker each child is given) and hardly ever in the others, so
#: one encoding of those serves command after command.  Bounded in count
#: and in size; the oldest goes first.
_ENVIRONMENTS: OrderedDict[tuple[tuple[str, str], ...], _Encoded] = OrderedDict()


def _encoded_head(
    items: list[tuple[str, str]], encoding: str, errors: str
) -> _Encoded | None:
    """All but the last of ``items`` encoded, from :data:`_ENVIRONMENTS` when there."""
    if len(items) < 2:
        return None
    key = tuple(items[:-1])
    found = _ENVIRONMENTS.get(key)
    if found is not None:
        _ENVIRONMENTS.move_to_end(key)
        return found
    entries = [f"{k}={v}".encode(encoding, errors) for k, v in key]
    encoded = _Encoded(entries, _Strings(entries))
    if encoded.strings.size <= SPAWN_ENVIRONMENT_KEPT_BYTES:
        _ENVIRONMENTS[key] = encoded
        if len(_ENVIRONMENTS) > SPAWN_ENVIRONMENTS_KEPT:
            _ENVIRONMENTS.popitem(last=False)
    return encoded


def plan(
    executable: str,
    argv: Iterable[str],
    env: Mapping[str, str],
    cwd: str | None,
    fds: Mapping[int, int],
    default_signals: Iterable[int],
    writers: Iterable[int] = (),
) -> SpawnPlan:
    """
    A :class:`SpawnPlan` from Python values, encoded as ``os.fsencode``
    does (its per-call checks cost more than the encoding itself, and a
    child's environment is forty strings or more).  Call on the reactor
    thread: the environments kept (:data:`_ENVIRONMENTS`) are not locked.
    """
    encoding, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    items = list(env.items())
    head = _encoded_head(items, encoding, errors)
    if head is None:
        entries = [f"{k}={v}".encode(encoding, errors) for k, v in items]
    else:
        k, v = items[-1]
        entries = [*head.entries, f"{k}={v}".encode(encoding, errors)]
    return SpawnPlan(
        os.fsencode(executable),
        [a.encode(encoding, errors) for a in argv],
        entries,
        None if cwd is None else os.fsencode(cwd),
        dict(fds),
        list(default_signals),
        None if head is None else head.strings,
        frozenset(writers),
    )


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise OSError(rc, f"{what}: {os.strerror(rc)}")


def _available_libc() -> Any:
    """The C library with ``posix_spawn`` and its helpers, or OSError."""
    if _LIBC is None:
        raise OSError(0, "posix_spawn through ctypes is not available here")
    return _LIBC


def posix_spawn(spawn_plan: SpawnPlan) -> int:
    """
    Start the child described by ``spawn_plan``; returns its pid.

    Returns once the child has exec'd (glibc suspends the caller until
    then).

    :raises OSError: the spawn failed (``ENOENT``, ``EACCES``, ...).
    """
    libc = _available_libc()
    attributes = _attributes(libc, tuple(spawn_plan.default_signals))
    return _call(libc, spawn_plan, _actions(libc, spawn_plan).buffer, attributes)


@attrs.frozen
class Prepared:
    """What :func:`posix_spawn_alone` passes to the C library besides the plan."""

    attributes: Any
    actions: _FileActions


def prepare(spawn_plan: SpawnPlan) -> Prepared:
    """
    The attributes and file actions :func:`posix_spawn_alone` will use,
    found or built now: the caches behind them are used on the reactor
    thread only.
    """
    libc = _available_libc()
    return Prepared(
        _attributes(libc, tuple(spawn_plan.default_signals)),
        _actions(libc, spawn_plan),
    )


def posix_spawn_alone(spawn_plan: SpawnPlan, prepared: Prepared) -> int:
    """
    :func:`posix_spawn` for a worker thread, with what :func:`prepare` gave
    on the reactor thread: the file actions stay alive for the call (the
    reference held here outlives the cache's, if the reactor evicts them
    meanwhile), and the attributes are never destroyed.
    """
    libc = _available_libc()
    return _call(libc, spawn_plan, prepared.actions.buffer, prepared.attributes)


class _FileActions:
    """
    One prepared ``posix_spawn_file_actions_t``, destroyed when the last
    reference to it goes: the cache's, or a worker thread's still spawning
    with it.
    """

    __slots__ = ("buffer", "destroy")

    def __init__(self, libc: Any) -> None:
        self.buffer = ctypes.create_string_buffer(_ACTIONS_BYTES)
        _check(libc.posix_spawn_file_actions_init(self.buffer), "file actions")
        self.destroy = libc.posix_spawn_file_actions_destroy

    def __del__(self) -> None:
        self.destroy(self.buffer)


#: Prepared file actions by (working directory, descriptor map): pipes
#: reuse the lowest free descriptors, so a busy daemon asks for the same
#: sets over and over (a few hundred while several children run at once,
#: their pipes holding descriptors between).  Bounded; the oldest set
#: goes first.
_ACTIONS: OrderedDict[
    tuple[bytes | None, tuple[tuple[int, int], ...], frozenset[int]], _FileActions
] = OrderedDict()


def _actions(libc: Any, spawn_plan: SpawnPlan) -> _FileActions:
    """The file actions of ``spawn_plan``, built once per distinct set."""
    key = (spawn_plan.cwd, tuple(sorted(spawn_plan.fds.items())), spawn_plan.writers)
    cached = _ACTIONS.get(key)
    if cached is not None:
        _ACTIONS.move_to_end(key)
        return cached
    actions = _FileActions(libc)
    _file_actions(libc, spawn_plan, actions.buffer)
    _ACTIONS[key] = actions
    if len(_ACTIONS) > SPAWN_ACTIONS_KEPT:
        _ACTIONS.popitem(last=False)
    return actions


_ATTRIBUTES: dict[tuple[int, ...], Any] = {}


def _attributes(libc: Any, default_signals: tuple[int, ...]) -> Any:
    """
    The spawn attributes, the same for every child: its own session, an
    empty signal mask, ``default_signals`` reset (built once per set).
    """
    cached = _ATTRIBUTES.get(default_signals)
    if cached is not None:
        return cached
    attributes = ctypes.create_string_buffer(_OPAQUE_BYTES)
    defaults = ctypes.create_string_buffer(_OPAQUE_BYTES)
    mask = ctypes.create_string_buffer(_OPAQUE_BYTES)
    _check(libc.posix_spawnattr_init(attributes), "attributes")
    _check(libc.sigemptyset(defaults), "sigemptyset")
    for number in default_signals:
        _check(libc.sigaddset(defaults, number), "sigaddset")
    _check(libc.sigemptyset(mask), "sigemptyset")
    _check(libc.posix_spawnattr_setsigdefault(attributes, defaults), "signals")
    _check(libc.posix_spawnattr_setsigmask(attributes, mask), "signal mask")
    flags = _POSIX_SPAWN_SETSID | _POSIX_SPAWN_SETSIGDEF | _POSIX_SPAWN_SETSIGMASK
    _check(libc.posix_spawnattr_setflags(attributes, flags), "flags")
    _ATTRIBUTES[default_signals] = attributes
    return attributes


def _file_actions(libc: Any, spawn_plan: SpawnPlan, actions: Any) -> None:
    """Working directory, standard streams, and nothing else open."""
    if spawn_plan.cwd is not None:
        _check(
            libc.posix_spawn_file_actions_addchdir_np(actions, spawn_plan.cwd),
            "chdir",
        )
    # A parent descriptor that is also a child slot is moved out of the
    # way first, so no dup2 overwrites a source another one still needs.
    targets = set(spawn_plan.fds)
    top = max([*targets, *spawn_plan.fds.values(), 2]) + 1
    moved: dict[int, int] = {}
    for source in sorted(set(spawn_plan.fds.values())):
        if source in targets:
            moved[source] = top
            _check(libc.posix_spawn_file_actions_adddup2(actions, source, top), "dup2")
            top += 1
    for child_fd, source in sorted(spawn_plan.fds.items()):
        source = moved.get(source, source)
        if child_fd in spawn_plan.writers:
            path = b"/proc/self/fd/%d" % source
            _check(
                libc.posix_spawn_file_actions_addopen(
                    actions, child_fd, path, os.O_WRONLY, 0
                ),
                "open",
            )
            continue
        _check(
            libc.posix_spawn_file_actions_adddup2(actions, source, child_fd),
            "dup2",
        )
    _check(
        libc.posix_spawn_file_actions_addclosefrom_np(actions, max(targets) + 1),
        "closefrom",
    )


def _call(libc: Any, spawn_plan: SpawnPlan, actions: Any, attributes: Any) -> int:
    argv_strings = _Strings(spawn_plan.argv)
    argv = _pointers(argv_strings)
    _env_strings, envp = spawn_plan.c_env()
    pid = ctypes.c_int(0)
    rc = libc.posix_spawn(
        ctypes.byref(pid),
        spawn_plan.executable,
        actions,
        attributes,
        argv.buffer_info()[0],
        envp.buffer_info()[0],
    )
    if rc != 0:
        raise OSError(rc, os.strerror(rc), os.fsdecode(spawn_plan.executable))
    return pid.value
