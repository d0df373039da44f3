"""
:mod:`sandboxd.spawn`: one ``posix_spawn`` that sets up the whole child,
checked on real children.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.processes import posix_spawn as spawn

if not spawn.AVAILABLE:
    skip = "this C library lacks posix_spawn's closefrom/addchdir (Twisted's spawn is used)"


def run(
    argv: list[str],
    cwd: str | None = None,
    extra: dict[int, int] | None = None,
    default_signals: Any = (signal.SIGPIPE,),
    env: dict[str, str] | None = None,
    prepared: bool = False,
) -> tuple[int, bytes]:
    """
    Spawn ``argv`` with stdout and stderr on a pipe; its status and output.

    :param prepared: spawn as a worker thread does (``posix_spawn_alone``).
    """
    read_end, write_end = os.pipe()
    fds = {0: write_end, 1: write_end, 2: write_end, **(extra or {})}
    try:
        made = spawn.plan(
            argv[0],
            argv,
            {"PATH": "/usr/bin:/bin"} if env is None else env,
            cwd,
            fds,
            default_signals,
        )
        if prepared:
            pid = spawn.posix_spawn_alone(made, spawn.prepare(made))
        else:
            pid = spawn.posix_spawn(made)
    except OSError:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        output = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), output


class SpawnTests(SynchronousTestCase):
    """What the child gets, and what it does not."""

    def test_plan_encodes_as_fsencode(self) -> None:
        """Arguments and environment are encoded as os.fsencode would, undecodable bytes included."""
        odd = os.fsdecode(b"caf\xe9-\xff")
        made = spawn.plan(
            "/bin/echo", ["echo", odd, "é"], {"K": odd, "É": "v"}, None, {}, ()
        )
        self.assertEqual(made.argv, [b"echo", b"caf\xe9-\xff", "é".encode()])
        self.assertEqual(made.env, [b"K=caf\xe9-\xff", "É=v".encode()])

    def test_environment_kept_encoded(self) -> None:
        """
        Children whose environments differ only in the last entry each get
        their own; one that differs anywhere else gets exactly its own too
        (nothing of an environment kept from an earlier child leaks in).
        """
        base = {"PATH": "/usr/bin:/bin", "A": "1", "B": "two"}
        seen = []
        for env, prepared in [
            ({**base, "MARK": "x"}, False),
            ({**base, "MARK": "y"}, True),
            ({**base, "B": "three", "MARK": "z"}, False),
            ({"MARK": "alone"}, True),
            ({}, False),
        ]:
            code, out = run(["/usr/bin/env"], env=env, prepared=prepared)
            self.assertEqual(code, 0)
            seen.append(out.decode().splitlines())
        self.assertEqual(
            seen,
            [
                ["PATH=/usr/bin:/bin", "A=1", "B=two", "MARK=x"],
                ["PATH=/usr/bin:/bin", "A=1", "B=two", "MARK=y"],
                ["PATH=/usr/bin:/bin", "A=1", "B=three", "MARK=z"],
                ["MARK=alone"],
                [],
            ],
        )

    def test_argv_with_empty_strings(self) -> None:
        """Empty arguments arrive as empty arguments, in order."""
        code, out = run(["/usr/bin/printf", "[%s]", "", "a", ""], prepared=True)
        self.assertEqual((code, out), (0, b"[][a][]"))

    def test_undecodable_bytes_reach_the_child(self) -> None:
        """A byte string that is not UTF-8 arrives in the child's argv unchanged."""
        code, out = run(["/bin/echo", os.fsdecode(b"a\xffb")])
        self.assertEqual((code, out), (0, b"a\xffb\n"))

    def test_own_session_and_cwd(self) -> None:
        """The child leads its own session and group, in the directory given."""
        cwd = os.path.realpath(self.mktemp())
        os.makedirs(cwd)
        code, out = run(["/bin/sh", "-c", "pwd; cut -d' ' -f1,5,6 /proc/$$/stat"], cwd)
        self.assertEqual(code, 0)
        where, ids = out.decode().splitlines()
        self.assertEqual(where, cwd)
        pid, pgid, sid = ids.split()
        self.assertEqual((pgid, sid), (pid, pid))

    def test_daemon_descriptors_not_inherited(self) -> None:
        """An inheritable descriptor of the daemon is closed in the child."""
        fd = os.open(os.devnull, os.O_RDONLY)
        self.addCleanup(os.close, fd)
        os.set_inheritable(fd, True)
        code, out = run(["/bin/sh", "-c", f"test -e /proc/$$/fd/{fd} && echo open"])
        self.assertEqual((code, out), (1, b""))

    def test_descriptor_moved_onto_another_slot(self) -> None:
        """A parent descriptor mapped onto a child slot arrives there."""
        read_end, write_end = os.pipe()
        self.addCleanup(os.close, read_end)
        try:
            code, _ = run(["/bin/sh", "-c", "echo via-fd-5 >&5"], extra={5: write_end})
        finally:
            os.close(write_end)
        self.assertEqual(code, 0)
        self.assertEqual(os.read(read_end, 100), b"via-fd-5\n")

    def test_ignored_signals_reset_and_mask_empty(self) -> None:
        """SIGPIPE, which Python ignores, is back to its default in the child."""
        # grep reads its own status: through a shell, $$ named the shell,
        # which now and then forks grep and waits with nearly every signal
        # blocked (1 run in ~200 under trial's reactor).
        code, out = run(["/bin/grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"])
        self.assertEqual(code, 0)
        fields = dict(line.split(":") for line in out.decode().splitlines())
        ignored = int(fields["SigIgn"].strip(), 16)
        self.assertFalse(ignored & (1 << (signal.SIGPIPE - 1)))
        self.assertEqual(int(fields["SigBlk"].strip(), 16), 0)

    def test_all_signals_reset(self) -> None:
        """With ALL_SIGNALS, a signal the daemon ignores and one it handles are both at their default in the child, and none is blocked."""
        previous = (
            signal.signal(signal.SIGUSR1, signal.SIG_IGN),
            signal.signal(signal.SIGUSR2, lambda *_: None),
        )
        self.addCleanup(signal.signal, signal.SIGUSR1, previous[0])
        self.addCleanup(signal.signal, signal.SIGUSR2, previous[1])
        # cat installs no handler of its own (grep catches SIGSEGV).
        code, out = run(
            ["/bin/cat", "/proc/self/status"], default_signals=spawn.ALL_SIGNALS
        )
        self.assertEqual(code, 0)
        fields = {
            name: int(value.strip(), 16)
            for name, value in (
                line.split(":", 1) for line in out.decode().splitlines()
            )
            if name in ("SigIgn", "SigCgt", "SigBlk")
        }
        # The C library ignores its own two signals (32, 33) in the child.
        internal = (1 << 31) | (1 << 32)
        fields["SigIgn"] &= ~internal
        self.assertEqual(fields, {"SigIgn": 0, "SigCgt": 0, "SigBlk": 0})
        self.assertNotIn(signal.SIGKILL, spawn.ALL_SIGNALS)
        self.assertIn(signal.SIGPIPE, spawn.ALL_SIGNALS)

    def test_failures_are_oserrors(self) -> None:
        """A missing executable or directory, or a file that cannot run, raises."""
        with self.assertRaises(FileNotFoundError):
            run(["/nonexistent/program"])
        with self.assertRaises(FileNotFoundError):
            run(["/bin/true"], cwd="/nonexistent/directory")
        plain = self.mktemp()
        with open(plain, "w") as f:
            f.write("not a program\n")
        with self.assertRaises(PermissionError):
            run([os.path.abspath(plain)])


class RecordingLibc:
    """The file-action calls of :func:`sandboxd.processes.posix_spawn._file_actions`, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def posix_spawn_file_actions_adddup2(self, _: Any, source: int, target: int) -> int:
        self.calls.append(("dup2", source, target))
        return 0

    def posix_spawn_file_actions_addclosefrom_np(self, _: Any, lowest: int) -> int:
        self.calls.append(("closefrom", lowest))
        return 0

    def posix_spawn_file_actions_addchdir_np(self, _: Any, path: bytes) -> int:
        self.calls.append(("chdir", path))
        return 0


class FileActionTests(SynchronousTestCase):
    """Descriptor shuffles that would overwrite a source are ordered safely."""

    def actions(self, fds: dict[int, int]) -> list[tuple[Any, ...]]:
        libc = RecordingLibc()
        plan = spawn.plan("/bin/true", ["true"], {}, "/tmp", fds, [])
        spawn._file_actions(libc, plan, None)
        return libc.calls

    def test_swapped_descriptors(self) -> None:
        """Child 0 from parent 1 and child 1 from parent 0: both moved out first."""
        self.assertEqual(
            self.actions({0: 1, 1: 0}),
            [
                ("chdir", b"/tmp"),
                ("dup2", 0, 3),
                ("dup2", 1, 4),
                ("dup2", 4, 0),
                ("dup2", 3, 1),
                ("closefrom", 2),
            ],
        )

    def test_plain_pipes(self) -> None:
        """Sources above the child's slots are duplicated directly."""
        self.assertEqual(
            self.actions({0: 7, 1: 8, 2: 8}),
            [
                ("chdir", b"/tmp"),
                ("dup2", 7, 0),
                ("dup2", 8, 1),
                ("dup2", 8, 2),
                ("closefrom", 3),
            ],
        )
