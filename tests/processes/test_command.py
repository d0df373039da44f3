"""
Starting children (sandboxd.processes): every child leads its own session,
on the posix_spawn path and on the fork path, as the daemon or as another
user.
"""

from __future__ import annotations

import os
import pwd
import random
import shlex
import signal
import string
import threading
import time
from types import SimpleNamespace
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.error import ProcessTerminated
from twisted.internet.protocol import ProcessProtocol
from twisted.trial.unittest import SynchronousTestCase, TestCase

from sandboxd.processes import spawning
from sandboxd.processes.command import (
    SETPRIV,
    ExecutablePaths,
    UserEntries,
    find_executable,
    split_command,
    system_program,
)
from sandboxd.processes.environment import child_environment, note_argv
from sandboxd.processes.spawning import _SpawnThreads, spawn_session


class Collect(ProcessProtocol):
    """Gathers stdout and the exit status (and why it ended)."""

    def __init__(self) -> None:
        self.out = b""
        self.done: Deferred[Any] = Deferred()
        self.reason: Any = None

    def outReceived(self, data: bytes) -> None:
        self.out += data

    def processExited(self, reason: Any) -> None:
        pass

    def processEnded(self, reason: Any) -> None:
        self.reason = reason.value
        self.done.callback(reason.value.exitCode)


SHOW = "echo $$ $(ps -o pgid= -p $$) $(ps -o sid= -p $$); id -un; pwd"


class SessionTests(TestCase):
    """pid = pgid = sid for every child."""

    timeout = 20

    @inlineCallbacks
    def run_child(
        self, path: str | None, uid: int | None = None, gid: int | None = None
    ) -> Any:
        env = {"PATH": os.environ.get("PATH", os.defpath)}
        sh = find_executable("sh", env)
        assert sh is not None
        proto = Collect()
        spawn_session(
            reactor,
            proto,
            sh,
            [sh, "-c", SHOW],
            env,
            path,
            uid,
            gid,
            {0: "w", 1: "r", 2: 2},
        )
        proto.transport.closeStdin()
        code = yield proto.done
        self.assertEqual(code, 0, proto.out)
        ids, user, cwd = proto.out.decode().strip().split("\n")
        return [int(x) for x in ids.split()], user, cwd

    @inlineCallbacks
    def test_spawn_path(self) -> Any:
        """In the daemon's own directory (posix_spawn with setsid)."""
        if not find_executable("ps", os.environ):
            self.skipTest("ps is not installed")
        (pid, pgid, sid), _, cwd = yield self.run_child(None)
        self.assertEqual(pid, pgid)
        self.assertEqual(pid, sid)
        self.assertEqual(cwd, os.getcwd())

    @inlineCallbacks
    def test_fork_path(self) -> Any:
        """In another directory (Twisted's fork path, setsid in the child)."""
        if not find_executable("ps", os.environ):
            self.skipTest("ps is not installed")
        where = os.path.realpath(self.mktemp())
        os.makedirs(where)
        (pid, pgid, sid), _, cwd = yield self.run_child(where)
        self.assertEqual((pgid, sid), (pid, pid))
        self.assertEqual(cwd, where)

    @inlineCallbacks
    def test_output_pipes_blocking_only_in_the_child(self) -> Any:
        """The daemon reads a child's stdout without blocking; the child writes its end blocking (a full pipe waits, never fails)."""
        proto = Collect()
        process = spawn_session(
            reactor,
            proto,
            "/bin/cat",
            ["/bin/cat", "/proc/self/fdinfo/1"],
            {"PATH": os.defpath},
            None,
            None,
            None,
            {0: "w", 1: "r", 2: 2},
        )
        self.assertFalse(os.get_blocking(process.pipes[1].fileno()))
        proto.transport.closeStdin()
        code = yield proto.done
        self.assertEqual(code, 0, proto.out)
        flags = dict(
            line.split(":", 1)
            for line in proto.out.decode().splitlines()
            if ":" in line
        )
        self.assertFalse(int(flags["flags"].strip(), 8) & os.O_NONBLOCK, flags)

    @inlineCallbacks
    def test_other_user_through_setpriv(self) -> Any:
        """As root, another user without forking the daemon (setpriv), still its own session."""
        if os.geteuid() != 0:
            self.skipTest("needs root")
        if not os.access(SETPRIV, os.X_OK):
            self.skipTest("setpriv (util-linux) is not installed")
        if not find_executable("ps", os.environ):
            self.skipTest("ps is not installed")
        nobody = pwd.getpwnam("nobody")
        (pid, pgid, sid), user, _ = yield self.run_child(
            None, nobody.pw_uid, nobody.pw_gid
        )
        self.assertEqual(user, "nobody")
        self.assertEqual((pgid, sid), (pid, pid))


class SpawnThreadsTests(TestCase):
    """The worker threads that wait in posix_spawn: results, failures, bounds, stop."""

    timeout = 20

    @inlineCallbacks
    def test_results_failures_and_bound(self) -> Any:
        """Each job's result or exception comes back on the reactor; no more threads than the bound start, and all end at stop."""
        threads = _SpawnThreads(size=2)
        self.addCleanup(threads._stop)
        gate = threading.Event()

        def job(n: int) -> int:
            gate.wait(5)
            if n == 3:
                raise OSError(2, "no such thing")
            return n * 10

        waits = []
        for n in range(5):
            threads.in_flight += 1
            waits.append(threads.run(reactor, job, n))
        self.assertEqual(len(threads.threads), 2)
        gate.set()
        results = []
        for d in waits:
            try:
                results.append((yield d))
            except OSError as e:
                results.append(e.errno)
        self.assertEqual(results, [0, 10, 20, 2, 40])
        workers = list(threads.threads)
        threads._stop()
        self.assertEqual(threads.threads, [])
        self.assertFalse(any(w.is_alive() for w in workers))

    def held_start(self, gate: threading.Event, hold: float) -> list[threading.Thread]:
        """
        Make a spawn worker's ``Thread.start`` wait for ``gate`` (at most
        ``hold`` seconds), as it waits for a CPU on a busy machine; returns
        the threads each such start was called on.
        """
        callers: list[threading.Thread] = []
        original = threading.Thread.start

        def start(thread: threading.Thread) -> None:
            if thread.name == "sandboxd-spawn":
                callers.append(threading.current_thread())
                gate.wait(hold)
            original(thread)

        self.patch(threading.Thread, "start", start)
        return callers

    @inlineCallbacks
    def test_start_does_not_hold_the_reactor(self) -> Any:
        """
        A worker whose start is slow does not hold the reactor: the job is
        queued at once and runs once the worker has started.
        """
        threads = _SpawnThreads(size=1)
        self.addCleanup(threads._stop)
        gate = threading.Event()
        hold = 10.0
        callers = self.held_start(gate, hold)
        threads.in_flight += 1
        began = time.monotonic()
        d = threads.run(reactor, lambda: threading.current_thread().name)
        took = time.monotonic() - began
        self.assertLess(took, hold / 2)
        self.assertNoResult(d)
        gate.set()
        name = yield d
        self.assertEqual(name, "sandboxd-spawn")
        self.assertEqual(len(callers), 1)
        self.assertIsNot(callers[0], threading.main_thread())

    @inlineCallbacks
    def test_start_failure(self) -> Any:
        """
        A worker that cannot start fails the spawn waiting for it (not the
        reactor's call) and is forgotten: the next spawn starts another.
        """
        threads = _SpawnThreads(size=1)
        self.addCleanup(threads._stop)
        original = threading.Thread.start
        self.patch(
            threading.Thread,
            "start",
            lambda thread: (_ for _ in ()).throw(
                RuntimeError("can't start new thread")
            ),
        )
        threads.in_flight += 1
        d = threads.run(reactor, lambda: 1)
        with self.assertRaises(RuntimeError):
            yield d
        self.assertEqual(threads.threads, [])
        self.patch(threading.Thread, "start", original)
        result = yield threads.run(reactor, lambda: 2)
        self.assertEqual(result, 2)
        self.assertEqual(len(threads.threads), 1)

    @inlineCallbacks
    def test_no_thread_to_start_it(self) -> Any:
        """
        When not even the short-lived thread that starts a worker can be
        made (a process at its limit), the spawn's Deferred fails (the
        caller then gives back its count of spawns in flight); the call
        itself does not raise.
        """

        def refuse(*_: Any) -> None:
            raise RuntimeError("can't start new thread")

        threads = _SpawnThreads(size=1)
        self.addCleanup(threads._stop)
        self.patch(spawning, "_thread", SimpleNamespace(start_new_thread=refuse))
        threads.in_flight += 1
        d = threads.run(reactor, lambda: 1)
        with self.assertRaises(RuntimeError):
            yield d
        self.assertEqual(threads.threads, [])


class SplitCommandTests(SynchronousTestCase):
    """split_command is shlex.split, whichever way it takes."""

    def test_same_words_as_shlex(self) -> None:
        """Quotes, escapes, comments and every kind of whitespace split (or fail) exactly as shlex does."""
        fixed = [
            "ls -la",
            "  a\tb\r\nc  ",
            "echo 'a b' \"c d\"",
            "a\\ b",
            "x\x0by",
            "x\u00a0y",
            "x\u2028y",
            "a # not a comment",
            "echo 'unclosed",
            "",
        ]
        rng = random.Random(7)
        alphabet = string.ascii_letters + " \t\r\n\x0b\x0c\x1c\x85\xa0'\"\\#;|&$"
        generated = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 16)))
            for _ in range(5000)
        ]
        for command in fixed + generated:
            try:
                want: object = shlex.split(command)
            except ValueError:
                want = ValueError
            try:
                got: object = split_command(command)
            except ValueError:
                got = ValueError
            self.assertEqual(got, want, repr(command))


class SystemProgramTests(SynchronousTestCase):
    """system_program judges where a program path leads, link by link."""

    def test_paths_and_links(self) -> None:
        """
        /proc, /sys and /dev paths, links to them and links to directories
        below them are system programs; bare names and ordinary files and
        links are not; a link loop counts as one.
        """
        base = self.mktemp()
        os.makedirs(os.path.join(base, "bin"))
        os.symlink("/proc/self/exe", os.path.join(base, "exe"))
        os.symlink("/proc/self", os.path.join(base, "self"))
        os.symlink("exe", os.path.join(base, "again"))
        os.symlink("/bin/sh", os.path.join(base, "sh"))
        os.symlink("loop", os.path.join(base, "loop"))
        for argv0, expected in [
            ("/proc/self/exe", True),
            ("/dev/../proc/1/exe", True),
            ("/sys/x", True),
            ("./exe", True),
            ("again", False),  # a bare name: the child's PATH decides
            ("./again", True),
            ("self/exe", True),
            ("bin/../exe", True),
            ("./sh", False),
            ("/bin/sh", False),
            ("./missing", False),
            ("./loop", True),
            ("sh", False),
        ]:
            self.assertEqual(system_program([argv0], base, 40), expected, argv0)


class EnvironmentSnapshotTests(SynchronousTestCase):
    """A child's environment follows every change of the daemon's, however made."""

    def test_changes_are_seen(self) -> None:
        """A name set, changed or removed in os.environ shows in the next child's environment."""
        name = "SANDBOXD_TEST_SNAPSHOT"
        self.addCleanup(os.environ.pop, name, None)
        self.assertNotIn(name, child_environment(None, None))
        os.environ[name] = "one"
        self.assertEqual(child_environment(None, None)[name], "one")
        os.environ[name] = "two"
        self.assertEqual(child_environment(None, None)[name], "two")
        del os.environ[name]
        self.assertNotIn(name, child_environment(None, None))

    def test_copies_are_independent(self) -> None:
        """Changing one child's environment leaves the next one's alone."""
        first = child_environment(None, None)
        first["SANDBOXD_TEST_LEAK"] = "x"
        self.assertNotIn("SANDBOXD_TEST_LEAK", child_environment(None, None))

    def test_denied_names_follow_the_rule(self) -> None:
        """
        The names a rule denies are dropped, whichever rule asks and in
        whatever order: another rule's set never leaks into the next child.
        """
        name = "SANDBOXD_TEST_DENIED"
        os.environ[name] = "v"
        self.addCleanup(os.environ.pop, name, None)
        deny = _Rule(env_deny=(name,))
        allow = _Rule(env_deny=())
        self.assertNotIn(name, child_environment(None, deny))
        self.assertEqual(child_environment(None, allow)[name], "v")
        self.assertNotIn(name, child_environment(None, deny))
        self.assertNotIn(name, child_environment(None, deny, {name: "w"}))
        self.assertEqual(child_environment(None, allow, {name: "w"})[name], "w")

    def test_audit_masks_current_values(self) -> None:
        """
        The audit record masks the current value of a denied name, and a
        request's own ``env`` value too, after the environment changed.
        """
        name = "SANDBOXD_TEST_MASKED"
        self.addCleanup(os.environ.pop, name, None)
        request = _Request(_Rule(env_deny=(name,)))
        os.environ[name] = "first-secret-value"
        note_argv(request, ["echo", "first-secret-value"])
        self.assertEqual(request.audit["argv"], ["echo", "***"])
        os.environ[name] = "second-secret-value"
        note_argv(request, ["echo", "second-secret-value", "first-secret-value"])
        self.assertEqual(request.audit["argv"], ["echo", "***", "first-secret-value"])
        note_argv(request, ["echo", "third-secret-value"], {name: "third-secret-value"})
        self.assertEqual(request.audit["argv"], ["echo", "***"])

    def test_same_as_os_environ(self) -> None:
        """Apart from the daemon's secrets, it is os.environ."""
        expected = {
            k: v for k, v in os.environ.items() if not k.startswith("ABX_SERVER_")
        }
        self.assertEqual(child_environment(None, None), expected)


class _Params:
    def __init__(self, env_deny: tuple[str, ...]) -> None:
        self.env_deny = env_deny
        self.confine = False


class _Rule:
    """The part of an effective rule the environment reads."""

    def __init__(self, env_deny: tuple[str, ...]) -> None:
        self.params = _Params(env_deny)


class _Request:
    """The part of a request the audit note reads."""

    def __init__(self, rule: _Rule) -> None:
        self.context = None
        self.rule = rule
        self.audit: dict[str, Any] = {}


class ExecutablePathsTests(SynchronousTestCase):
    """Command names resolved on a PATH follow changes to its directories."""

    def setUp(self) -> None:
        self.paths = ExecutablePaths()
        if not self.paths._ready():
            raise self.skipTest("inotify is not available here: nothing is kept")
        self.addCleanup(self._close)
        self.first = os.path.abspath(self.mktemp())
        self.second = os.path.abspath(self.mktemp())
        os.makedirs(self.first)
        os.makedirs(self.second)
        self.path = os.pathsep.join([self.first, self.second])
        self.later = self._program(self.second)

    def _close(self) -> None:
        if self.paths._fd is not None and self.paths._fd >= 0:
            os.close(self.paths._fd)

    def _program(self, directory: str, name: str = "tool") -> str:
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(path, 0o755)
        return path

    def test_answer_is_kept(self) -> None:
        """A second lookup gives the same answer, from what was kept."""
        self.assertEqual(self.paths.find("tool", self.path), self.later)
        self.assertEqual(self.paths._found, {("tool", self.path): self.later})
        self.assertEqual(self.paths.find("tool", self.path), self.later)

    def test_installed_earlier_on_the_path(self) -> None:
        """An executable installed in an earlier directory wins from the next lookup on."""
        self.assertEqual(self.paths.find("tool", self.path), self.later)
        earlier = self._program(self.first)
        self.assertEqual(self.paths.find("tool", self.path), earlier)

    def test_removed_or_made_not_executable(self) -> None:
        """A removed executable, or one no longer executable, is not found."""
        self.assertEqual(self.paths.find("tool", self.path), self.later)
        os.chmod(self.later, 0o644)
        self.assertIsNone(self.paths.find("tool", self.path))
        os.chmod(self.later, 0o755)
        self.assertEqual(self.paths.find("tool", self.path), self.later)
        os.unlink(self.later)
        self.assertIsNone(self.paths.find("tool", self.path))

    def test_missing_name_then_installed(self) -> None:
        """A name found nowhere is found once installed."""
        self.assertIsNone(self.paths.find("other", self.path))
        installed = self._program(self.first, "other")
        self.assertEqual(self.paths.find("other", self.path), installed)

    def test_relative_or_missing_directories_are_searched_every_time(self) -> None:
        """A PATH with a relative or missing directory is never kept, and still answers."""
        for path in (
            os.pathsep.join(["relative", self.second]),
            os.pathsep.join([self.first + "-missing", self.second]),
        ):
            self.assertEqual(self.paths.find("tool", path), self.later)
            self.assertNotIn(("tool", path), self.paths._found)

    def test_bounded(self) -> None:
        """No more answers are kept than the bound; the rest are searched."""
        paths = ExecutablePaths(size=1)
        self.addCleanup(lambda: paths._fd is not None and os.close(paths._fd))
        self.assertEqual(paths.find("tool", self.path), self.later)
        self.assertIsNone(paths.find("nothing", self.path))
        self.assertEqual(list(paths._found), [("tool", self.path)])

    def test_find_executable_uses_the_child_path(self) -> None:
        """find_executable resolves on the PATH it is given, not the daemon's."""
        self.assertEqual(find_executable("tool", {"PATH": self.path}), self.later)
        self.assertIsNone(find_executable("tool", {"PATH": self.first}))


class UserEntriesTests(SynchronousTestCase):
    """Password entries are kept only while they are the files source's answer."""

    def setUp(self) -> None:
        self.me = pwd.getpwuid(os.getuid())
        self.passwd = self.mktemp()
        self.nsswitch = self.mktemp()
        self._write(self.nsswitch, "passwd: files systemd\n")
        self._write(self.passwd, f"# users\n{self._line(self.me)}\n")
        self.entries = UserEntries(self.passwd, self.nsswitch)

    def _write(self, path: str, text: str) -> None:
        with open(path, "w") as f:
            f.write(text)

    def _line(self, e: pwd.struct_passwd) -> str:
        fields = (e.pw_name, e.pw_passwd, e.pw_uid, e.pw_gid, e.pw_gecos, e.pw_dir)
        return ":".join([*map(str, fields), e.pw_shell])

    def test_same_answers_as_pwd(self) -> None:
        """By name and by uid, the answers are pwd's, and kept."""
        self.assertEqual(self.entries.lookup(self.me.pw_name), self.me)
        self.assertEqual(self.entries.lookup(self.me.pw_uid), self.me)
        self.assertEqual(len(self.entries._entries), 2)
        self.assertEqual(self.entries.lookup(self.me.pw_name), self.me)

    def test_unknown_users_are_errors(self) -> None:
        """An unknown name is KeyError, every time (not kept)."""
        name = "no-such-user-" + "".join(random.choices(string.ascii_lowercase, k=8))
        for _ in range(2):
            with self.assertRaises(KeyError):
                self.entries.lookup(name)
        self.assertEqual(self.entries._entries, {})

    def test_not_kept_unless_files_first(self) -> None:
        """With another source first in NSS, every lookup asks NSS."""
        self._write(self.nsswitch, "passwd:   ldap files\n")
        self.assertEqual(self.entries.lookup(self.me.pw_name), self.me)
        self.assertEqual(self.entries._entries, {})

    def test_not_kept_unless_the_line_is_in_the_file(self) -> None:
        """An entry that another source answered (its line not in the file) is not kept."""
        self._write(self.passwd, "someone:x:12345:12345::/nonexistent:/bin/false\n")
        self.assertEqual(self.entries.lookup(self.me.pw_name), self.me)
        self.assertEqual(self.entries._entries, {})

    def test_lines_end_at_lf_only(self) -> None:
        """
        A CR inside a line (a GECOS field holding one) does not start a
        line: the entry after it is not the file's line, so it is not kept.
        """
        self._write(self.passwd, f"someone:x:12345:12345:a\r{self._line(self.me)}\n")
        self.assertEqual(self.entries.lookup(self.me.pw_name), self.me)
        self.assertEqual(self.entries._entries, {})

    def test_forgotten_when_the_file_changes(self) -> None:
        """A changed passwd file drops what was kept."""
        self.entries.lookup(self.me.pw_name)
        self.assertEqual(len(self.entries._entries), 1)
        with open(self.passwd, "a") as f:
            f.write("someone:x:12345:12345::/nonexistent:/bin/false\n")
        self.entries.lookup(self.me.pw_uid)
        self.assertEqual(list(self.entries._entries), [(True, self.me.pw_uid)])


class _LateExec:
    """A child that takes 0.3 s before it execs (the window a signal can come in)."""

    def _setupChild(self, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.3)
        super()._setupChild(*args, **kwargs)  # type: ignore[misc]


class _LatePTY(_LateExec, spawning.SessionPTYProcess):
    pass


class _LatePipes(_LateExec, spawning.SessionProcess):
    pass


def _started(transport: type, argv: list[str], path: str | None, fds: Any) -> Collect:
    """``argv`` started through the Twisted transport class ``transport``."""
    proto = Collect()
    transport(
        reactor, argv[0], argv, {"PATH": os.defpath}, path, proto, None, None, fds
    )
    return proto


class SignalsAtForkTests(TestCase):
    """
    A signal sent to a child that has not exec'd yet (Twisted's fork path:
    a terminal's shell, a command in another directory) ends it as it
    would end the program, instead of running the daemon's own handler in
    the child; and every child starts with no signal blocked.
    """

    timeout = 20

    def setUp(self) -> None:
        # Handlers of the daemon's kind (its HUP reloads, TERM stops it).
        for number in (signal.SIGHUP, signal.SIGTERM):
            previous = signal.signal(number, lambda *_: None)
            self.addCleanup(signal.signal, number, previous)

    @inlineCallbacks
    def signalled_before_exec(
        self, transport: type, path: str | None, fds: Any, number: int
    ) -> Any:
        """``sleep 30`` started by ``transport`` and sent ``number`` at once ends by it."""
        proto = _started(transport, ["/bin/sleep", "30"], path, fds)
        os.kill(proto.transport.pid, number)
        yield proto.done
        self.assertIsInstance(proto.reason, ProcessTerminated, repr(proto.reason))
        self.assertEqual(proto.reason.signal, number, repr(proto.reason))

    def test_terminal_shell_hung_up_before_exec(self) -> Any:
        """A shell on a PTY sent HUP before it execs ends by HUP."""
        master, slave = os.openpty()
        pty = (master, slave, os.ttyname(slave))
        return self.signalled_before_exec(_LatePTY, None, pty, signal.SIGHUP)

    def test_command_terminated_before_exec(self) -> Any:
        """A command on the fork path (another directory) sent TERM before it execs ends by TERM."""
        where = os.path.realpath(self.mktemp())
        os.makedirs(where)
        fds = {0: "w", 1: "r", 2: 2}
        return self.signalled_before_exec(_LatePipes, where, fds, signal.SIGTERM)

    @inlineCallbacks
    def test_no_signal_blocked_after_exec(self) -> Any:
        """On the spawn path, the fork path and a PTY, the program runs with an empty mask."""
        where = os.path.realpath(self.mktemp())
        os.makedirs(where)
        show = ["/bin/sh", "-c", "grep SigBlk /proc/self/status"]
        master, slave = os.openpty()
        started = (
            (spawning.SessionProcess, None, {0: "w", 1: "r", 2: 2}),
            (spawning.SessionProcess, where, {0: "w", 1: "r", 2: 2}),
            (spawning.SessionPTYProcess, None, (master, slave, os.ttyname(slave))),
        )
        outputs = []
        for transport, path, fds in started:
            proto = _started(transport, show, path, fds)
            proto.transport.closeStdin()
            yield proto.done
            outputs.append(proto.out)
        for out in outputs:
            self.assertEqual(out.split(), [b"SigBlk:", b"0" * 16], outputs)
