# -*- test-case-name: tests.processes.test_command -*-
"""
How a child is started in its own session: Twisted's ``Process`` for a
session leader, ``posix_spawn`` where it is faster
(:mod:`sandboxd.processes.posix_spawn`), and slow spawns on worker threads
so the reactor never waits for one.
"""

from __future__ import annotations

import _thread
import errno
import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from queue import Empty, SimpleQueue
from typing import Any

from twisted.internet import abstract
from twisted.internet import process as _twisted_process
from twisted.internet._baseprocess import BaseProcess
from twisted.internet.defer import Deferred, fail
from twisted.internet.main import CONNECTION_DONE, CONNECTION_LOST
from twisted.internet.protocol import connectionDone
from twisted.python import log
from twisted.python.failure import Failure

from sandboxd import landlock
from sandboxd.policy.confinement import Confinement
from sandboxd.policy.defaults import (
    EXITED_DRAIN_READS,
    SLOW_SPAWN_SECONDS,
    SPAWN_THREADS,
)
from sandboxd.processes import posix_spawn as _spawn
from sandboxd.processes import reaping
from sandboxd.processes.command import NICE, SETPRIV
from sandboxd.processes.priority import CHILD_PRIORITY, holding_gil
from sandboxd.processes.tree import reaps_own_orphans

_IGNORED_SIGNALS: list[int] | None = None


def _ignored_signals() -> list[int]:
    """Signals the daemon ignores, reset to default in every child (cached)."""
    global _IGNORED_SIGNALS
    if _IGNORED_SIGNALS is None:
        _IGNORED_SIGNALS = [
            n for n in range(1, signal.NSIG) if signal.getsignal(n) == signal.SIG_IGN
        ]
    return _IGNORED_SIGNALS


#: Every signal, for the mask held across a fork.
_ALL_SIGNALS = signal.valid_signals()


def _caught_to_default() -> None:
    """
    In a forked child: every signal the daemon catches back to its default
    action.  The daemon's handlers are Python code that would run in the
    child until it execs, and take a signal meant for the child (a
    terminal's hang-up, a ``TERM`` right after a start) as the daemon's own.
    """
    for number in _ALL_SIGNALS:
        try:
            handler = signal.getsignal(number)
        except (OSError, ValueError):
            continue
        if handler not in (signal.SIG_DFL, signal.SIG_IGN, None):
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):
                pass


class SignalsHeldAtFork:
    """
    A Twisted process transport whose forked child cannot lose a signal.

    Twisted's fork path runs Python in the child (closing descriptors,
    switching users, searching ``PATH``) before it execs, with the
    daemon's signal handlers still in place: a ``HUP`` or ``TERM`` sent to
    the new pid then ran the daemon's handler in the child, which went on
    to exec as if nothing had come.  Here every signal is blocked across
    the fork; the child puts the handlers it caught back to their default
    actions, then unblocks, so a signal that came early ends it as it
    would have ended the program.
    """

    #: The spawning thread's mask before the fork (the child's after it).
    _mask: set[int | signal.Signals] = set()

    #: The nice value the child gives itself before it switches user and
    #: execs (:meth:`ChildPriority.nice_to_take`), or None.
    _nice: int | None = None

    def _fork(self, *args: Any, **kwargs: Any) -> None:
        self._nice = CHILD_PRIORITY.nice_to_take()
        self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, _ALL_SIGNALS)
        try:
            super()._fork(*args, **kwargs)  # type: ignore[misc]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)

    def _setupChild(self, *args: Any, **kwargs: Any) -> None:
        _caught_to_default()
        if self._nice is not None:
            # The value itself, not a step: the daemon may give the same
            # by pid at the same moment.
            try:
                os.setpriority(os.PRIO_PROCESS, 0, self._nice)
            except OSError:
                pass
        super()._setupChild(*args, **kwargs)  # type: ignore[misc]
        signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)


class SessionPTYProcess(SignalsHeldAtFork, _twisted_process.PTYProcess):
    """
    Twisted's PTY process transport (a terminal's shell), its signals held
    at fork, and the shell the subreaper of its jobs
    (:func:`sandboxd.processes.tree.reaps_own_orphans`).
    """

    def _setupChild(self, *args: Any, **kwargs: Any) -> None:
        reaps_own_orphans()
        super()._setupChild(*args, **kwargs)


class SessionProcess(SignalsHeldAtFork, _twisted_process.Process):
    """
    Twisted's pipe process transport, started in a session of its own.

    Twisted's ``posix_spawnp`` fast path cannot ask for a new session, so
    children used to be started through ``/usr/bin/setsid``: one more exec
    per command.  Here the fast path passes ``setsid=True`` to
    ``os.posix_spawn`` instead (pid = pgid = sid), and the fork path (user
    switching, another working directory) calls ``setsid()`` in the child
    (with its signals held: :class:`SignalsHeldAtFork`).  Everything else
    (pipes, reaping, ``ProcessProtocol`` callbacks) is Twisted's.
    """

    def _trySpawnInsteadOfFork(
        self,
        path: Any,
        uid: Any,
        gid: Any,
        executable: Any,
        args: Any,
        environment: Any,
        kwargs: Any,
    ) -> bool:
        if uid is not None or gid is not None:
            # posix_spawn cannot switch users; util-linux's setpriv can,
            # for one exec instead of a fork of the whole daemon.
            wrapped = _as_user(executable, args, uid, gid)
            if wrapped is None:
                return False
            executable, args = wrapped
        if path is not None and os.path.abspath(path) != os.path.abspath("."):
            return False
        state: list[tuple[int, bool]] = []
        for fd in _twisted_process._listOpenFDs():
            try:
                flags = fcntl.fcntl(fd, fcntl.F_GETFD, fcntl.FD_CLOEXEC)
                state.append((fd, bool(flags)))
            except OSError:
                pass
        actions = _twisted_process._getFileActions(
            state,
            kwargs.get("fdmap"),
            doClose=_twisted_process._PS_CLOSE,
            doDup2=_twisted_process._PS_DUP2,
        )
        self.pid = os.posix_spawn(
            executable,
            args,
            os.environ if environment is None else environment,
            file_actions=actions,
            setsigdef=_ignored_signals(),
            # Not the mask held across the fork (SignalsHeldAtFork).
            setsigmask=self._mask,
            setsid=True,
        )
        self.status = -1
        return True

    def _setupChild(self, *args: Any, **kwargs: Any) -> None:
        os.setsid()
        super()._setupChild(*args, **kwargs)

    def processEnded(self, status: int) -> None:
        """Reaped: the child's pid leaves the priorities' count."""
        _reaped(self.pid)
        super().processEnded(status)


def _reaped(pid: int | None) -> None:
    if pid is not None:
        CHILD_PRIORITY.ended(pid)


def _as_user(
    executable: str,
    args: list[str],
    uid: int | None,
    gid: int | None,
    with_nice: bool = True,
) -> tuple[str, list[str]] | None:
    """
    ``args`` run through setpriv as ``uid``/``gid``; None without setpriv.
    Through nice first where the child must lower its own priority
    (:meth:`~sandboxd.processes.priority.ChildPriority.nice_to_take`): once
    it runs as the other user, the daemon may no longer do it for it.
    Without ``with_nice`` for a forked child, which lowers its own before
    it execs (:class:`SignalsHeldAtFork`).
    """
    if uid is None or gid is None or not os.access(SETPRIV, os.X_OK):
        return None
    wrapped = [
        SETPRIV,
        f"--reuid={uid}",
        f"--regid={gid}",
        "--init-groups",
        "--",
        executable,
        *args[1:],
    ]
    step = _nice_step(uid, gid) if with_nice else None
    if step is not None:
        return NICE, [NICE, "-n", str(step), *wrapped]
    return SETPRIV, wrapped


def _read_by_the_loader(name: str) -> bool:
    """Whether the dynamic loader acts on the variable ``name`` at a start."""
    return name.startswith("LD_") or name == "GLIBC_TUNABLES"


def confined(
    confine: Confinement | None,
    executable: str,
    args: list[str],
    env: dict[str, str],
    uid: int | None,
    gid: int | None,
    forked: bool = False,
) -> tuple[str, list[str], dict[str, str], int | None, int | None]:
    """
    What to spawn for a child under ``confine``: the daemon's interpreter
    running :mod:`sandboxd.landlock`, which confines itself and execs the
    command (through setpriv when it runs as another user, so the switch
    happens after the interpreter started as the daemon's user, who can
    always run it).  Unchanged when ``confine`` is None.

    The variables the dynamic loader reads (``LD_PRELOAD``,
    ``LD_LIBRARY_PATH``, ``LD_AUDIT``...) would load a caller's library
    into the interpreter before it confines itself: the interpreter starts
    with the daemon's own, and the command gets the child's back (set or
    unset on the script's command line), so its environment is what it
    would have been unconfined.

    :param forked: the child is forked by Twisted (a terminal), and lowers
        its own nice value before it execs.
    :returns: executable, argv, environment, and the uid and gid left for
        the spawn itself to switch to (None once setpriv does it).
    """
    if confine is None:
        return executable, args, env, uid, gid
    if uid is not None or gid is not None:
        wrapped = _as_user(executable, args, uid, gid, with_nice=not forked)
        if wrapped is not None:
            (executable, args), uid, gid = wrapped, None, None
    own = {k: v for k, v in os.environ.items() if _read_by_the_loader(k)}
    asked = {k: v for k, v in env.items() if _read_by_the_loader(k)}
    handed = [f"--setenv={k}={v}" for k, v in asked.items() if own.get(k) != v]
    handed += [f"--unsetenv={k}" for k in own if k not in asked]
    if asked or own:
        env = {k: v for k, v in env.items() if k not in asked} | own
    python = sys.executable
    argv = [python, "-I", "-S", landlock.__file__, *confine.options, *handed]
    return python, [*argv, "--", executable, *args], env, uid, gid


def _nice_step(uid: int | None, gid: int | None) -> int | None:
    """
    The ``nice -n`` a child spawned as ``uid``/``gid`` goes through before
    setpriv (see :func:`_as_user`), or None when it does not.
    """
    if uid is None and gid is None:
        return None
    target = CHILD_PRIORITY.nice_to_take()
    if target is None or not os.access(NICE, os.X_OK):
        return None
    return target - os.getpriority(os.PRIO_PROCESS, 0)


def _lowers_itself(uid: int | None, gid: int | None) -> bool:
    """Whether a child spawned as ``uid``/``gid`` goes through nice first."""
    return _nice_step(uid, gid) is not None


class _OutputReader(_twisted_process.ProcessReader):
    """
    Twisted's reader of a child's output pipe, on a parent end that
    :func:`_pipes` made non-blocking already: one ``F_SETFL`` there, where
    Twisted's ``setNonBlocking`` reads the flags first (a system call
    fewer per pipe, two per command).  It joins the reactor only when told
    to (see :class:`AdoptedProcess`), and can read what is in its pipe
    without it (:meth:`drain`).  The rest is ``ProcessReader``'s.
    """

    def __init__(
        self, reactor: Any, proc: Any, name: int, fileno: int, start: bool = True
    ) -> None:
        abstract.FileDescriptor.__init__(self, reactor)
        self.proc = proc
        self.name = name
        self.fd = fileno
        if start:
            self.startReading()  # type: ignore[no-untyped-call]

    def doRead(self) -> Any:
        """
        Read what the pipe holds and hand it to the process: what Twisted's
        ``ProcessReader.doRead`` does through ``fdesc.readFromFD`` and
        ``dataReceived``, in one call, for a stream's every line.
        """
        try:
            data = os.read(self.fd, _READ_CHUNK)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EINTR):
                return None
            return CONNECTION_LOST
        if not data:
            return CONNECTION_DONE
        self.proc.childDataReceived(self.name, data)
        return None

    def drain(self, reads: int, paused: Callable[[], bool]) -> Any:
        """
        Read what the pipe holds now, without the reactor, at most
        ``reads`` times: ``CONNECTION_DONE`` at its end, ``CONNECTION_LOST``
        on an error, None while it stays open (empty for now, more than
        ``reads`` reads in it, or ``paused()`` turned true on the way).
        """
        for _ in range(reads):
            try:
                data = os.read(self.fd, _DRAIN_CHUNK)
            except BlockingIOError:
                return None
            except OSError:
                return CONNECTION_LOST
            if not data:
                return CONNECTION_DONE
            self.dataReceived(data)  # type: ignore[no-untyped-call]
            if paused():
                return None
        return None


#: What one read of :meth:`_OutputReader.drain` asks for: a whole pipe's
#: default capacity.
_DRAIN_CHUNK = 65536

#: What one read of :meth:`_OutputReader.doRead` asks for (Twisted's own).
_READ_CHUNK = 8192


class AdoptedProcess(_twisted_process.Process):
    """
    Twisted's pipe process transport around a child that is already
    running (started by :func:`sandboxd.processes.posix_spawn.posix_spawn`).

    What follows the fork in Twisted's ``Process.__init__`` happens here:
    readers and writers on the parent's pipe ends, ``makeConnection``, and
    registration for reaping, with one ``waitpid`` first.  A short command
    has often exited by then (its spawn waited on a worker thread): it is
    reaped there.  When nothing else may still hold its output pipes'
    write ends (``pipes_alone``: the child opened them itself, see
    :attr:`sandboxd.processes.posix_spawn.SpawnPlan.writers`, or no spawn
    that could have copied them is still waiting for its exec, see
    :func:`_copies_may_remain`), its output pipes never join the
    reactor: on the reactor's next turn what they
    hold is read to their end and the exit announced, pipes closed first,
    as for a short command whose pipes close before it is reaped.  That
    spares each pipe the registration and removal (two ``epoll_ctl``), the
    reactor's dispatch of the end of file, and the exit-drain timer a
    protocol arms for pipes still open at the exit.  A pipe still open
    after that read (a grandchild holds it) joins the reactor then, as it
    would have.  Otherwise the exit is announced at once and the pipes
    are the reactor's, as with Twisted's own registration.
    """

    processReaderFactory = _OutputReader

    def __init__(
        self,
        reactor: Any,
        pid: int,
        protocol: Any,
        pipes: dict[int, tuple[str, int]],
        pipes_alone: bool = False,
    ) -> None:
        self._reactor = reactor
        BaseProcess.__init__(self, protocol)
        self.pid = pid
        self.status = -1
        #: The pid, kept after reaping (Twisted's ``pid`` goes to None).
        self.leader = pid
        self.paused = False
        #: The exit status of a child reaped at adoption, until announced.
        self._unannounced: int | None = None
        self.pipes: dict[int, Any] = {}
        readers: list[_OutputReader] = []
        for child_fd, (kind, parent_fd) in pipes.items():
            if kind == "r":
                reader = self.processReaderFactory(
                    reactor, self, child_fd, parent_fd, start=False
                )
                self.pipes[child_fd] = reader
                readers.append(reader)
            else:
                self.pipes[child_fd] = self.processWriterFactory(  # type: ignore[no-untyped-call]
                    reactor, self, child_fd, parent_fd, forceReadHack=True
                )
        try:
            protocol.makeConnection(self)
        except BaseException:
            log.err()
        status = _exit_status(pid)
        if status is None or not pipes_alone:
            for reader in readers:
                if not self.paused and reader.connected and not reader.disconnecting:
                    reader.startReading()  # type: ignore[no-untyped-call]
            if status is None:
                # Twisted's registerReapProcessHandler would waitpid again.
                _twisted_process.reapProcessHandlers[pid] = self
            else:
                self.processEnded(status)
            return
        self.pid = None
        self._unannounced = status
        reactor.callLater(0, self._announce_exit)

    def _announce_exit(self) -> None:
        """A child reaped at adoption: read its pipes, then say it ended."""
        status = self._unannounced
        assert status is not None
        for reader in list(self.pipes.values()):
            if (
                not isinstance(reader, _OutputReader)
                or not reader.connected
                or reader.disconnecting
            ):
                continue
            why = None
            if not self.paused:
                why = reader.drain(EXITED_DRAIN_READS, lambda: self.paused)
            if why is not None:
                reader.connectionLost(_ended(why))  # type: ignore[no-untyped-call]
            elif not self.paused:
                reader.startReading()  # type: ignore[no-untyped-call]
        self._unannounced = None
        self.processEnded(status)

    def maybeCallProcessEnded(self) -> None:
        """Not before an exit found at adoption is announced (its pipes read)."""
        if self._unannounced is None:
            super().maybeCallProcessEnded()  # type: ignore[no-untyped-call]

    def pauseProducing(self) -> None:
        """Stop reading the output pipes (and keep them out of the reactor)."""
        self.paused = True
        super().pauseProducing()  # type: ignore[no-untyped-call]

    def resumeProducing(self) -> None:
        """Read the output pipes again."""
        self.paused = False
        super().resumeProducing()  # type: ignore[no-untyped-call]

    def processEnded(self, status: int) -> None:
        """Reaped: the child's pid leaves the priorities' count."""
        _reaped(self.leader)
        super().processEnded(status)


def _ended(why: Exception) -> Failure:
    """
    The reason a pipe read at its end is given: Twisted's one shared
    failure for a clean end (a new ``Failure`` per pipe cost more than the
    pipe's read), a new one for anything else.
    """
    return connectionDone if why is CONNECTION_DONE else Failure(why)


def _exit_status(pid: int) -> int | None:
    """
    ``pid``'s exit status if it has exited (reaping it), else None, as
    Twisted's registration for reaping looks (a failure is logged, and the
    child is taken as running).
    """
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except BaseException:
        log.msg(f"Failed to reap {pid}:")
        log.err()
        return None
    return status if reaped else None


def _pipes(
    child_fds: Mapping[int, Any],
) -> tuple[dict[int, int], dict[int, tuple[str, int]]]:
    """
    Pipes for the ``"r"``/``"w"`` entries of ``child_fds``: the child's
    ends by child descriptor, and the parent's (with their direction).
    Integer entries are the caller's descriptors, passed as they are.

    Where :data:`~sandboxd.processes.posix_spawn.REOPEN_PIPES`, an output
    pipe's write end is closed at once and the child opens the read end
    again for writing (see :func:`_writers`): its child end is then the
    parent's read end itself.
    """
    fdmap: dict[int, int] = {}
    pipes: dict[int, tuple[str, int]] = {}
    # A write end nothing else holds yet: its close never blocks, and one
    # that let go of the interpreter's lock could wait for a spawn worker.
    close = holding_gil("close") or _close_quietly
    try:
        for child_fd, target in child_fds.items():
            if target == "r" and _spawn.REOPEN_PIPES:
                # Made non-blocking with the pipe (see _OutputReader): the
                # write end, the only other end with that flag, is closed
                # at once, and the child's own write end is opened anew.
                read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                close(write_end)
                fdmap[child_fd], pipes[child_fd] = read_end, ("r", read_end)
            elif target == "r":
                read_end, write_end = os.pipe()
                fdmap[child_fd], pipes[child_fd] = write_end, ("r", read_end)
                # A new pipe's end has no status flags yet: this sets
                # O_NONBLOCK alone (see _OutputReader).
                fcntl.fcntl(read_end, fcntl.F_SETFL, os.O_NONBLOCK)
            elif target == "w":
                read_end, write_end = os.pipe()
                fdmap[child_fd], pipes[child_fd] = read_end, ("w", write_end)
            else:
                fdmap[child_fd] = int(target)
    except OSError:
        _close_pipes(fdmap, pipes, parent=True)
        raise
    return fdmap, pipes


def _writers(
    fdmap: dict[int, int], pipes: dict[int, tuple[str, int]]
) -> frozenset[int]:
    """The child descriptors the child opens itself from a pipe's read end."""
    return frozenset(
        child_fd
        for child_fd, (_, parent_fd) in pipes.items()
        if fdmap.get(child_fd) == parent_fd
    )


def _child_ends(fdmap: dict[int, int], pipes: dict[int, tuple[str, int]]) -> list[int]:
    """The daemon's descriptors that are only the child's pipe ends."""
    ends = []
    for child_fd, (_, parent_fd) in pipes.items():
        fd = fdmap.get(child_fd)
        if fd is not None and fd != parent_fd:
            ends.append(fd)
    return ends


def _close_pipes(
    fdmap: dict[int, int], pipes: dict[int, tuple[str, int]], parent: bool
) -> None:
    fds = _child_ends(fdmap, pipes)
    if parent:
        fds.extend(parent_fd for _, parent_fd in pipes.values())
    for fd in fds:
        _close_quietly(fd)


#: When each spawn worker now waiting in ``posix_spawn`` began, by thread.
_EXEC_WAITS: dict[int, float] = {}


def _copies_may_remain(closed: float) -> bool:
    """
    Whether a child's pipe ends, closed in the daemon at ``closed``
    (``time.perf_counter``), may still be open in a spawn's child that has
    not exec'd yet: one began before then and is still waiting.  Such a
    child got copies of every descriptor the daemon held, and the pipes
    reach their end only once it execs.
    """
    return any(began < closed for began in list(_EXEC_WAITS.values()))


def _close_child_ends(fdmap: dict[int, int], pipes: dict[int, tuple[str, int]]) -> None:
    """
    Close the daemon's copies of a child's pipe ends, on the spawn worker
    as soon as ``posix_spawn`` has returned, holding the interpreter's lock.

    Every child spawned while they are open gets copies of them too, until
    its own exec closes them, and the child's pipes reach their end only
    once all copies are gone: with eight short commands at a time, most
    pipes of a command found exited at its adoption were still held that
    way.  Closing here, not on the reactor after the hand-off back, leaves
    fewer spawns to inherit them; and a ``close`` that lets go of the lock
    would wait on a busy reactor to get it back.  (Where the child opens
    its output pipes itself, the only such end is a stdin pipe's.)
    """
    close = holding_gil("close") or _close_quietly
    for fd in _child_ends(fdmap, pipes):
        close(fd)


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _planned(
    executable: str,
    args: list[str],
    env: dict[str, str],
    path: str | None,
    child_fds: Mapping[int, Any],
) -> tuple[dict[int, int], dict[int, tuple[str, int]], Any]:
    """The child's pipes and its spawn plan; the pipes closed if the plan fails."""
    fdmap, pipes = _pipes(child_fds)
    try:
        plan = _spawn.plan(
            executable,
            args,
            env,
            path,
            fdmap,
            _spawn.ALL_SIGNALS,
            _writers(fdmap, pipes),
        )
    except BaseException:
        _close_pipes(fdmap, pipes, parent=True)
        raise
    return fdmap, pipes, plan


def _read_alone(spawned_at: float) -> bool:
    """
    Whether a child spawned at ``spawned_at`` that has already exited may
    have its pipes read at adoption: no other child can hold their write
    ends (see :class:`AdoptedProcess`).
    """
    return _spawn.REOPEN_PIPES or not _copies_may_remain(spawned_at)


def _spawn_adopted(
    reactor: Any,
    protocol: Any,
    executable: str,
    args: list[str],
    env: dict[str, str],
    path: str | None,
    child_fds: Mapping[int, Any],
    lowers_itself: bool = False,
) -> AdoptedProcess:
    """
    The child through :func:`sandboxd.processes.posix_spawn.posix_spawn`,
    then adopted (``lowers_itself``: see :meth:`ChildPriority.spawned`).
    """
    fdmap, pipes, plan = _planned(executable, args, env, path, child_fds)
    try:
        began = time.perf_counter()
        with CHILD_PRIORITY.spawning():
            pid = _spawn.posix_spawn(plan)
        SPAWN_TIMES.record(time.perf_counter() - began)
        CHILD_PRIORITY.spawned(pid, lowers_itself=lowers_itself)
    except BaseException:
        _close_pipes(fdmap, pipes, parent=True)
        raise
    _close_pipes(fdmap, pipes, parent=False)
    return AdoptedProcess(
        reactor, pid, protocol, pipes, _read_alone(time.perf_counter())
    )


class SpawnTimes:
    """
    Whether spawns are slow right now, judged by how long the last one held
    its caller.

    ``posix_spawn`` returns once the child has exec'd.  On an idle machine
    that is quick, and the reactor calls it directly: a worker thread's
    hand-offs would cost more.  On a saturated one the new child first
    waits for a CPU (with the kernel's autogroup scheduling, a child that
    has just started its own session is a new group competing with every
    other session), and under hundreds of concurrent streams each spawn
    held the reactor for milliseconds, with every other client waiting too
    (docs/performance.md).  Once a spawn takes longer than ``threshold`` seconds, the
    spawns that can wait go through worker threads until one of them is
    quick again.
    """

    def __init__(self, threshold: float = SLOW_SPAWN_SECONDS) -> None:
        self.threshold = threshold
        self.slow = False

    def record(self, seconds: float) -> None:
        """How long one spawn held its caller."""
        self.slow = seconds > self.threshold


SPAWN_TIMES = SpawnTimes()


class _SpawnThreads:
    """
    The worker threads that wait in ``posix_spawn`` (started as spawns
    need them, up to ``size``; told to end with the reactor), and how many
    spawns are in their hands.

    Not Twisted's ``ThreadPool``: a spawn is one C call that needs none of
    its context and logging wrappers, and its Python-level queue and
    condition variables cost a spawn more than the rest of the hand-off.
    Here a job is one ``SimpleQueue.put`` (C) on the way in and one
    ``callFromThread`` on the way out.

    A worker is started from a short-lived low-level thread, not from the
    reactor: ``Thread.start`` waits until the new thread has run, which on
    a busy machine is a wait for a CPU, and the reactor would stand still
    for it.  The job is queued at once and taken by whichever worker runs
    first.
    """

    def __init__(self, size: int = SPAWN_THREADS) -> None:
        self.size = size
        self.jobs: SimpleQueue[tuple[Any, Deferred[Any], Any, tuple[Any, ...]] | None]
        self.jobs = SimpleQueue()
        self.threads: list[threading.Thread] = []
        #: Each worker's start, set once ``Thread.start`` has returned or failed.
        self._started: dict[threading.Thread, threading.Event] = {}
        #: Spawns handed to a thread whose child is not adopted yet.
        self.in_flight = 0

    def run(self, reactor: Any, f: Any, *args: Any) -> Deferred[Any]:
        """``f(*args)`` on a worker thread; its result or failure on the reactor."""
        if not self.threads:
            reactor.addSystemEventTrigger("during", "shutdown", self._stop)
        # in_flight counts this job already (the caller adds it first).
        if len(self.threads) < min(self.size, self.in_flight):
            worker = threading.Thread(
                target=self._work, name="sandboxd-spawn", daemon=True
            )
            started = threading.Event()
            self.threads.append(worker)
            self._started[worker] = started
            try:
                _thread.start_new_thread(self._start, (reactor, worker, started))
            except Exception:
                # Not even the thread that starts it (a process at its
                # limit): as a worker that could not start, the caller's
                # Deferred fails, never the call, which would leave the
                # spawn counted in flight.
                self._forget(worker)
                if not self.threads:
                    return fail()
        d: Deferred[Any] = Deferred()
        self.jobs.put((reactor, d, f, args))
        return d

    def _start(
        self, reactor: Any, worker: threading.Thread, started: threading.Event
    ) -> None:
        """Start ``worker`` (off the reactor); tell the reactor if it cannot."""
        try:
            worker.start()
        except BaseException:
            reactor.callFromThread(self._lost, worker, Failure())
        finally:
            started.set()

    def _lost(self, worker: threading.Thread, failure: Failure) -> None:
        """
        A worker that could not start: forgotten (a later spawn tries again);
        with no worker left, the queued jobs fail with its error, as the
        spawn that would have started it did before.
        """
        self._forget(worker)
        if self.threads:
            return
        # Every queued job is taken before any is failed: a failure's
        # callbacks may queue a new spawn, which starts a worker of its own.
        waiting: list[Deferred[Any]] = []
        while True:
            try:
                job = self.jobs.get_nowait()
            except Empty:
                break
            if job is not None:
                waiting.append(job[1])
        for d in waiting:
            d.errback(failure)

    def _forget(self, worker: threading.Thread) -> None:
        """A worker that will not run: a later spawn may start another."""
        if worker in self.threads:
            self.threads.remove(worker)
        self._started.pop(worker, None)

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            reactor, d, f, args = job
            try:
                result = f(*args)
            except BaseException:
                reactor.callFromThread(d.errback, Failure())
            else:
                reactor.callFromThread(d.callback, result)

    def _stop(self) -> None:
        threads, self.threads = self.threads, []
        started, self._started = self._started, {}
        for worker in threads:
            # A worker whose start is still on its way is waited for.
            event = started.get(worker)
            if event is not None:
                event.wait()
        threads = [worker for worker in threads if worker.ident is not None]
        for _ in threads:
            self.jobs.put(None)
        for worker in threads:
            worker.join()


SPAWN_THREADS_POOL = _SpawnThreads()


def _spawn_adopted_later(
    reactor: Any,
    protocol: Any,
    executable: str,
    args: list[str],
    env: dict[str, str],
    path: str | None,
    child_fds: Mapping[int, Any],
    lowers_itself: bool = False,
) -> Deferred[AdoptedProcess]:
    """
    :func:`_spawn_adopted` with the wait for the child's exec on a worker
    thread (``ctypes`` lets go of the GIL during the call).
    """
    fdmap, pipes, plan = _planned(executable, args, env, path, child_fds)
    try:
        prepared = _spawn.prepare(plan)
    except BaseException:
        _close_pipes(fdmap, pipes, parent=True)
        raise
    threads = SPAWN_THREADS_POOL
    threads.in_flight += 1
    token = reaping.adopting()
    #: The child's pid, once the worker has spawned it.
    started: list[int] = []

    def timed() -> tuple[int, float, float]:
        began = time.perf_counter()
        worker = threading.get_ident()
        _EXEC_WAITS[worker] = began
        try:
            with CHILD_PRIORITY.spawning(dedicated=True):
                pid = _spawn.posix_spawn_alone(plan, prepared)
                # Until the reactor adopts it, its exit is not Twisted's to
                # reap (see sandboxd.processes.reaping).
                started.append(pid)
                reaping.spawned(pid)
        finally:
            del _EXEC_WAITS[worker]
            _close_child_ends(fdmap, pipes)
        closed = time.perf_counter()
        seconds = closed - began
        # Setting the child's session group weight takes the scheduler's
        # locks (~0.1 ms idle, milliseconds on a saturated machine): here,
        # not on the reactor.
        CHILD_PRIORITY.spawned(pid, lowers_itself=lowers_itself)
        return pid, seconds, closed

    def adopt(result: tuple[int, float, float]) -> AdoptedProcess:
        threads.in_flight -= 1
        pid, seconds, closed = result
        SPAWN_TIMES.record(seconds)
        try:
            return AdoptedProcess(reactor, pid, protocol, pipes, _read_alone(closed))
        finally:
            reaping.adopted(pid, token)

    def failed(failure: Failure) -> Failure:
        threads.in_flight -= 1
        _close_pipes({}, pipes, parent=True)
        reaping.adopted(started[0] if started else None, token)
        return failure

    d = threads.run(reactor, timed)
    d.addCallbacks(adopt, failed)
    return d


def spawn_anywhere() -> bool:
    """Whether :func:`spawn_session` starts a child in any directory without a fork."""
    return _spawn.AVAILABLE


def _posix_spawn_program(
    executable: str, args: list[str], uid: int | None, gid: int | None
) -> tuple[str, list[str]] | None:
    """
    What one ``posix_spawn`` runs for a child (``setpriv`` in front of it
    for another user); None where Twisted's spawn has to start it.
    """
    if not _spawn.AVAILABLE:
        return None
    if uid is None and gid is None:
        return executable, args
    return _as_user(executable, args, uid, gid)


def _standard_fds(child_fds: dict[int, Any] | None) -> dict[int, Any]:
    return {0: "w", 1: "r", 2: "r"} if child_fds is None else child_fds


def spawn_session_later(
    reactor: Any,
    protocol: Any,
    executable: str,
    args: list[str],
    env: dict[str, str],
    path: str | None = None,
    uid: int | None = None,
    gid: int | None = None,
    child_fds: dict[int, Any] | None = None,
    confine: Confinement | None = None,
) -> Deferred[AdoptedProcess] | None:
    """
    :func:`spawn_session` with the wait for the child's exec on a worker
    thread, when spawns are slow right now (:class:`SpawnTimes`) and the
    ``posix_spawn`` path applies; None when the caller should spawn at once.
    """
    lowers = _lowers_itself(uid, gid)
    executable, args, env, uid, gid = confined(confine, executable, args, env, uid, gid)
    program = _posix_spawn_program(executable, args, uid, gid)
    if not SPAWN_TIMES.slow or program is None:
        return None
    fds = _standard_fds(child_fds)
    d = _spawn_adopted_later(reactor, protocol, *program, env, path, fds, lowers)

    def unsupported(failure: Failure) -> Any:
        error = failure.value
        if not isinstance(error, OSError) or error.errno not in _UNSUPPORTED:
            return failure
        _give_up_posix_spawn(error)
        return spawn_session(
            reactor, protocol, executable, args, env, path, uid, gid, fds
        )

    return d.addErrback(unsupported)


def spawn_session(
    reactor: Any,
    protocol: Any,
    executable: str,
    args: list[str],
    env: dict[str, str],
    path: str | None = None,
    uid: int | None = None,
    gid: int | None = None,
    child_fds: dict[int, Any] | None = None,
    confine: Confinement | None = None,
) -> _twisted_process.Process:
    """
    ``reactor.spawnProcess`` for a child that leads its own session.

    ``executable`` must be absolute (see :func:`find_executable`).  Where
    :data:`sandboxd.processes.posix_spawn.AVAILABLE`, one ``posix_spawn`` starts it in any
    directory (as another user through setpriv); otherwise Twisted spawns
    it (:class:`SessionProcess`).  Under ``confine`` it confines itself
    first (:func:`confined`).
    """
    fds = _standard_fds(child_fds)
    lowers = _lowers_itself(uid, gid)
    executable, args, env, uid, gid = confined(
        confine, executable, args, env, uid, gid, forked=not _spawn.AVAILABLE
    )
    program = _posix_spawn_program(executable, args, uid, gid)
    if program is not None:
        try:
            return _spawn_adopted(reactor, protocol, *program, env, path, fds, lowers)
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                raise
            _give_up_posix_spawn(e)
    with CHILD_PRIORITY.spawning():
        process = SessionProcess(  # type: ignore[no-untyped-call]
            reactor, executable, args, env, path, protocol, uid, gid, fds
        )
    if process.pid is not None:
        CHILD_PRIORITY.spawned(process.pid, lowers_itself=lowers)
    return process


#: What ``posix_spawn`` answers when the system, not the command, is at
#: fault (an action or flag it cannot perform).
_UNSUPPORTED = frozenset({errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP})


def _give_up_posix_spawn(error: OSError) -> None:
    """
    A kernel or sandbox (seccomp, gVisor) refused one of the file actions:
    Twisted's spawn does the same job, slower, from now on.
    """
    _spawn.AVAILABLE = False
    log.msg(
        f"sandboxd: posix_spawn with closefrom/chdir failed ({error}); using Twisted's spawn"
    )
