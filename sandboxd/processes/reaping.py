# -*- test-case-name: tests.processes.test_reaping -*-
"""
Reaping on SIGCHLD: the children that exited, not every child.

Twisted answers each SIGCHLD (and the reactor's start) with
``twisted.internet.process.reapAllProcesses``, which calls ``reapProcess``
(one ``waitpid``) on every registered child: each exit costs as many system
calls as there are children alive, so a user's background processes make
every short command's exit dearer.  :func:`reap_exited` asks the kernel
which child exited instead: ``waitid`` with ``WNOWAIT`` names a zombie
without reaping it, and the transport registered for that pid reaps it
with its own ``reapProcess``, exactly as Twisted's sweep would have.

A zombie Twisted does not know is never touched here: an orphan the daemon
adopted as subreaper (:func:`sandboxd.processes.tree.reap_orphans` reaps
those, by pid), a child whose spawn has not registered it yet, or a child
some other code waits for.  The kernel names the same zombie again until
it is reaped, so on meeting one the hook falls back to Twisted's sweep,
once, which still reaps every registered child that exited behind it.
One case is common enough to be spared that sweep: a short command spawned
on a worker thread (spawns are slow when the machine is busy) often exits
before the reactor adopts it.  The adoption's own ``waitpid`` reaps it,
and the hook looks again right after (:func:`adopted`) instead of
sweeping now.  That wait is taken for a zombie whose pid a worker has
returned (:func:`spawned`); for any other zombie only while a spawn's pid
is still on its way, and once: the same zombie met again is swept past.

Twisted has no hook for this: its SIGCHLD handling
(``twisted.internet._signals``) looks ``reapAllProcesses`` up on the
``twisted.internet.process`` module at every call, so :func:`install`
replaces that module attribute, once, when the daemon's process service
starts.  ``tests.processes.test_reaping`` fails if Twisted stops calling
it.  It stays in place after a daemon stops: it reaps what Twisted's sweep
reaps, and several daemons may run in one process (tests do).
"""

from __future__ import annotations

import errno
import os
import time

from twisted.internet import process as _twisted_process
from twisted.python import log

#: Twisted's own sweep: one ``reapProcess`` for every registered child.
_twisted_reap_all = _twisted_process.reapAllProcesses

#: The ``waitid`` flags that name an exited child and leave it a zombie;
#: None where the platform has none of them (then Twisted's sweep is used).
_PEEK: int | None = (
    os.WEXITED | os.WNOHANG | os.WNOWAIT
    if all(hasattr(os, name) for name in ("waitid", "P_ALL", "WEXITED", "WNOWAIT"))
    else None
)

#: When each spawn on a worker thread not yet adopted by the reactor
#: (registered or reaped), or given up, began: one entry per
#: :func:`adopting`, as many as the spawn pool has in flight.
#: ``CLOCK_BOOTTIME`` nanoseconds, the clock of a process's start time in
#: ``/proc/PID/stat``: no child of theirs started before the oldest.
_BEGAN: list[int] = []

#: The pids of those whose worker has returned.
_ADOPTING: set[int] = set()

#: Nanoseconds in one clock tick, the unit of ``/proc/PID/stat``'s start time.
TICK_NS = 10**9 // os.sysconf("SC_CLK_TCK")

#: Whether a look stopped at a zombie of theirs and is owed at an adoption.
_owed = False

#: The last zombie Twisted did not know that a look stopped at.
_waited_for: int | None = None

#: What a kernel that cannot peek at its children answers (then Twisted's
#: sweep is used from then on).
_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})


def reap_exited() -> None:
    """
    Reap the registered children that have exited, each through its own
    transport's ``reapProcess`` (which reports its exit), as Twisted's
    ``reapAllProcesses`` does, without asking the children still running.

    At most one more round than there are registered children: a round
    that does not reap the child it was given, or finds a zombie Twisted
    does not know, ends in Twisted's sweep instead, or in a look after the
    next adoption when the zombie may be a child a worker thread has just
    spawned (see the module's docstring).
    """
    global _PEEK, _owed, _waited_for
    handlers = _twisted_process.reapProcessHandlers
    if _PEEK is None:
        _twisted_reap_all()
        return
    for _ in range(len(handlers) + 1):
        try:
            exited = os.waitid(os.P_ALL, 0, _PEEK)
        except ChildProcessError:
            # No child at all: every waitpid of a sweep would say so too.
            return
        except OSError as e:
            if e.errno in _UNSUPPORTED:
                _PEEK = None
                log.msg(f"sandboxd: waitid failed ({e}); reaping every child")
            _twisted_reap_all()
            return
        if exited is None:
            return
        pid = exited.si_pid
        handler = handlers.get(pid)
        if handler is None:
            unreturned = len(_BEGAN) > len(_ADOPTING)
            if pid in _ADOPTING or (unreturned and pid != _waited_for):
                _owed, _waited_for = True, pid
                return
            _twisted_reap_all()
            return
        handler.reapProcess()
        if handlers.get(pid) is handler:
            # Not reaped (its failure logged): whatever it is, the kernel
            # would name it again.
            _twisted_reap_all()
            return
    # More exits than registered children when this began (a child's
    # processEnded started others that exited already): sweep the rest.
    _twisted_reap_all()


def adopting() -> int:
    """
    A spawn goes to a worker thread (call from the reactor thread): its
    token, to give :func:`adopted`.
    """
    began = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    _BEGAN.append(began)
    return began


def spawned(pid: int) -> None:
    """
    A worker thread has just spawned ``pid``; the reactor will adopt it
    (call from that worker).
    """
    _ADOPTING.add(pid)


def adopted(pid: int | None, token: int) -> None:
    """
    The reactor has adopted ``pid`` (registered it for reaping, or reaped
    it), or given up on a spawn (None when it has no pid): a look that
    stopped at a zombie Twisted did not know is made now.  Call from the
    reactor thread, once for every :func:`adopting`, with its token.
    """
    global _owed
    try:
        _BEGAN.remove(token)
    except ValueError:
        pass
    if pid is not None:
        _ADOPTING.discard(pid)
    if not _owed:
        return
    _owed = False
    try:
        reap_exited()
    except BaseException:
        # The caller is a spawn's callback: a reaped child's failure is
        # not the spawn's.
        log.err(None, "sandboxd: reaping after an adoption failed")


def may_be_unadopted(pid: int, start: int) -> bool:
    """
    Whether a zombie child Twisted does not know, started at ``start``
    (clock ticks since boot, ``/proc/PID/stat``'s field), may be one a
    spawn in flight started: its pid returned by a worker and not adopted
    yet, or started no earlier than the oldest spawn in flight began.
    Anything older is an orphan the daemon adopted, for the orphan sweep
    to reap even while spawns go on without a pause (it waited for one
    before, and under a steady stream of commands the orphans of a
    process that double-forks piled up as zombies without bound).
    """
    if pid in _ADOPTING:
        return True
    return bool(_BEGAN) and start >= min(_BEGAN) // TICK_NS


def install() -> bool:
    """
    Make Twisted's SIGCHLD handling call :func:`reap_exited`; whether it
    was not already.  Called when the daemon's process service starts.
    """
    if _twisted_process.reapAllProcesses is reap_exited:
        return False
    _twisted_process.reapAllProcesses = reap_exited
    return True
