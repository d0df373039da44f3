"""
The real E2B SDK against sandboxd's E2B port (SPEC §18): what a team's
unchanged E2B code sees.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import struct
import threading
import time
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.e2b.sdk import E2BCase, caught
from tests.helpers import alive
from tests.test_guard import bind_mount


class CommandTests(E2BCase):
    """``sbx.commands``: run, exit codes, live output, background, stdin, kill."""

    @inlineCallbacks
    def test_run_echo(self) -> Any:
        """commands.run("echo hi") gives stdout "hi\\n" and exit code 0."""

        def job() -> Any:
            sbx = self.sandbox()
            return sbx.commands.run("echo hi")

        result = yield self.sdk(job)
        self.assertEqual(
            (result.stdout, result.stderr, result.exit_code), ("hi\n", "", 0)
        )

    @inlineCallbacks
    def test_failing_command_raises(self) -> Any:
        """A non-zero exit raises CommandExitException with the code and output."""
        from e2b import CommandExitException

        error = yield self.sdk(
            caught, lambda: self.sandbox().commands.run("echo oops >&2; exit 3")
        )
        self.assertIsInstance(error, CommandExitException)
        self.assertEqual((error.exit_code, error.stderr), (3, "oops\n"))

    @inlineCallbacks
    def test_output_callbacks_are_live(self) -> Any:
        """on_stdout/on_stderr get each chunk as it is printed, not at the end."""

        def job() -> Any:
            seen: list[tuple[float, str, str]] = []
            start = time.monotonic()
            self.sandbox().commands.run(
                "echo one; sleep 0.6; echo two >&2; sleep 0.6; echo three",
                on_stdout=lambda s: seen.append((time.monotonic() - start, "out", s)),
                on_stderr=lambda s: seen.append((time.monotonic() - start, "err", s)),
            )
            return seen, time.monotonic() - start

        seen, total = yield self.sdk(job)
        self.assertEqual(
            [(k, s) for _, k, s in seen],
            [("out", "one\n"), ("err", "two\n"), ("out", "three\n")],
        )
        # The first line arrived well before the command ended.
        self.assertLess(seen[0][0], total - 0.8)

    @inlineCallbacks
    def test_background_list_connect_stdin_kill(self) -> Any:
        """
        background=True gives a handle; commands.list shows it; connect(pid)
        follows it; send_stdin feeds it; kill ends it and it leaves the list.
        """

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.commands.run(
                "read line; echo got:$line; sleep 60", background=True, stdin=True
            )
            listed = [p.pid for p in sbx.commands.list()]
            handle.disconnect()
            follower = sbx.commands.connect(handle.pid)
            sbx.commands.send_stdin(handle.pid, "hello\n")
            got = []
            for stdout, _, _ in follower:
                if stdout:
                    got.append(stdout)
                if "".join(got).endswith("\n"):
                    break
            killed = sbx.commands.kill(handle.pid)
            time.sleep(0.3)
            after = [p.pid for p in sbx.commands.list()]
            again = sbx.commands.kill(handle.pid)
            return handle.pid, listed, "".join(got), killed, after, again

        pid, listed, got, killed, after, again = yield self.sdk(job)
        self.assertIn(pid, listed)
        self.assertEqual(got, "got:hello\n")
        self.assertTrue(killed)
        self.assertNotIn(pid, after)
        self.assertFalse(again, "a second kill finds nothing (NOT_FOUND → False)")
        self.assertFalse(alive(pid))

    @inlineCallbacks
    def test_close_stdin(self) -> Any:
        """close_stdin sends EOF: cat ends with what it was given."""

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.commands.run("cat", background=True, stdin=True)
            handle.send_stdin("abc\n")
            handle.close_stdin()
            return handle.wait()

        result = yield self.sdk(job)
        self.assertEqual((result.stdout, result.exit_code), ("abc\n", 0))

    @inlineCallbacks
    def test_send_stdin_waits_for_a_process_not_reading_yet(self) -> Any:
        """
        Eight 1 MiB ``send_stdin`` calls to a process that reads only after
        3 s (more than the 4 MiB that may wait on its stdin) each wait
        for room, as envd's blocking write does, and every byte arrives
        in order; none is refused as a rate limit.
        """

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.commands.run(
                "sleep 3; sha256sum", background=True, stdin=True, timeout=60
            )
            chunks = [bytes([65 + i]) * (1 << 20) for i in range(8)]
            for chunk in chunks:
                sbx.commands.send_stdin(handle.pid, chunk)
            sbx.commands.close_stdin(handle.pid)
            return handle.wait().stdout, hashlib.sha256(b"".join(chunks)).hexdigest()

        out, want = yield self.sdk(job)
        self.assertEqual(out.split()[0], want)

    @inlineCallbacks
    def test_stdin_over_the_message_cap_is_invalid_argument(self) -> Any:
        """
        ``send_stdin`` of more than one Connect message may carry raises
        InvalidArgumentException naming the limit, not RateLimitException
        ("please try again later": the same call can never pass), and the
        process gets none of it.
        """
        from e2b import InvalidArgumentException

        from sandboxd.policy.defaults import E2B_MAX_MESSAGE_BYTES

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.commands.run("wc -c", background=True, stdin=True)
            error = caught(
                lambda: sbx.commands.send_stdin(
                    handle.pid, b"x" * (E2B_MAX_MESSAGE_BYTES + 1)
                )
            )
            handle.close_stdin()
            return error, handle.wait()

        error, result = yield self.sdk(job)
        self.assertIsInstance(error, InvalidArgumentException)
        self.assertIn("payload_too_large", str(error))
        self.assertNotIn("try again", str(error))
        self.assertEqual(result.stdout.strip(), "0")

    @inlineCallbacks
    def test_timeout_ends_the_group(self) -> Any:
        """
        A command's timeout (Connect-Timeout-Ms) raises TimeoutException and
        ends its whole process group: the grandchild is gone too.
        """
        from e2b import TimeoutException

        marker = os.path.join(self.base_dir, "pid")

        def job() -> Any:
            start = time.monotonic()
            try:
                self.sandbox().commands.run(
                    f"sleep 300 & echo $! > {marker}; wait", timeout=1.5
                )
            except TimeoutException as e:
                return e, time.monotonic() - start
            return None, time.monotonic() - start

        error, took = yield self.sdk(job)
        self.assertIsInstance(error, TimeoutException)
        self.assertLess(took, 10)
        with open(marker) as f:
            grandchild = int(f.read())
        deadline = time.monotonic() + 10
        while alive(grandchild) and time.monotonic() < deadline:
            yield self.sdk(time.sleep, 0.1)
        self.assertFalse(alive(grandchild))

    @inlineCallbacks
    def test_cwd_and_envs(self) -> Any:
        """cwd and envs reach the command."""
        os.makedirs(os.path.join(self.base_dir, "work"))

        def job() -> Any:
            return self.sandbox().commands.run(
                "pwd; echo $GREETING", cwd="work", envs={"GREETING": "hola"}
            )

        result = yield self.sdk(job)
        self.assertEqual(
            result.stdout, os.path.join(self.base_dir, "work") + "\nhola\n"
        )

    @inlineCallbacks
    def test_cwd_home(self) -> Any:
        """
        A leading ``~`` in a command's or a terminal's ``cwd`` is the home
        its commands get, as envd expands it; still checked by the path
        rules (a home outside the base dir is refused), ``~name`` refused.
        """
        home = os.path.join(self.base_dir, "home")
        os.makedirs(os.path.join(home, "d"))
        os.environ["HOME"] = home  # the daemon's, so its commands' too

        def job() -> Any:
            from e2b.sandbox.commands.command_handle import PtySize

            sbx = self.sandbox()
            handle = sbx.pty.create(PtySize(rows=24, cols=80), cwd="~/d")
            wanted = os.path.join(home, "d")
            deadline = time.monotonic() + 10
            try:
                # The child moves there between its fork and its exec.
                where = os.readlink(f"/proc/{handle.pid}/cwd")
                while where != wanted and time.monotonic() < deadline:
                    time.sleep(0.05)
                    where = os.readlink(f"/proc/{handle.pid}/cwd")
            finally:
                sbx.pty.kill(handle.pid)
            return (
                sbx.commands.run("pwd", cwd="~").stdout,
                sbx.commands.run("pwd", cwd="~/d").stdout,
                where,
                caught(lambda: sbx.commands.run("pwd", cwd="~root")),
            )

        at_home, below, terminal, other = yield self.sdk(job)
        self.assertEqual((at_home, below), (home + "\n", home + "/d\n"))
        self.assertEqual(terminal, os.path.join(home, "d"))
        self.assertIn("cannot expand another user's home directory", str(other))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "~")))

        os.environ["HOME"] = os.path.realpath(self.mktemp())
        os.makedirs(os.environ["HOME"])
        refused = yield self.sdk(
            lambda: caught(lambda: self.sandbox().commands.run("pwd", cwd="~"))
        )
        self.assertIn("path_not_allowed", str(refused))


class FileTests(E2BCase):
    """``sbx.files``: read, write, list, exists, info, rename, mkdir, remove, watch."""

    @inlineCallbacks
    def test_write_read_text_and_bytes(self) -> Any:
        """Text and bytes round-trip, and land on disk below the base dir."""

        def job() -> Any:
            sbx = self.sandbox()
            info = sbx.files.write("notes/a.txt", "héllo\n")
            sbx.files.write("blob.bin", bytes(range(256)))
            return (
                info,
                sbx.files.read("notes/a.txt"),
                bytes(sbx.files.read("blob.bin", format="bytes")),
            )

        info, text, blob = yield self.sdk(job)
        self.assertEqual(info.path, os.path.join(self.base_dir, "notes/a.txt"))
        self.assertEqual(text, "héllo\n")
        self.assertEqual(blob, bytes(range(256)))
        with open(os.path.join(self.base_dir, "blob.bin"), "rb") as f:
            self.assertEqual(f.read(), bytes(range(256)))

    @inlineCallbacks
    def test_large_file_round_trip(self) -> Any:
        """A few MiB of arbitrary bytes round-trip, multipart and octet-stream."""
        blob = os.urandom(3 * 1024 * 1024 + 7)

        def job() -> Any:
            sbx = self.sandbox()
            sbx.files.write("big/multi.bin", blob)
            sbx.files.write("big/octet.bin", blob, use_octet_stream=True)
            return (
                bytes(sbx.files.read("big/multi.bin", format="bytes")),
                bytes(sbx.files.read("big/octet.bin", format="bytes")),
            )

        multi, octet = yield self.sdk(job)
        self.assertEqual(multi, blob)
        self.assertEqual(octet, blob)
        with open(os.path.join(self.base_dir, "big/multi.bin"), "rb") as f:
            self.assertEqual(f.read(), blob)

    @inlineCallbacks
    def test_write_files_several(self) -> Any:
        """write_files sends several files in one multipart upload."""
        from e2b.sandbox.filesystem.filesystem import WriteEntry

        def job() -> Any:
            return self.sandbox().files.write_files(
                [
                    WriteEntry(path="m/a.txt", data="A"),
                    WriteEntry(path="m/b.txt", data=b"B"),
                ]
            )

        infos = yield self.sdk(job)
        self.assertEqual(
            [i.path for i in infos],
            [
                os.path.join(self.base_dir, "m/a.txt"),
                os.path.join(self.base_dir, "m/b.txt"),
            ],
        )
        for name, want in (("a.txt", "A"), ("b.txt", "B")):
            with open(os.path.join(self.base_dir, "m", name)) as f:
                self.assertEqual(f.read(), want)

    @inlineCallbacks
    def test_list_depth_exists_info(self) -> Any:
        """list honours depth; exists and get_info answer as envd does."""
        os.makedirs(os.path.join(self.base_dir, "d/e"))
        with open(os.path.join(self.base_dir, "d/e/f.txt"), "w") as f:
            f.write("12345")
        os.chmod(os.path.join(self.base_dir, "d/e/f.txt"), 0o640)

        def job() -> Any:
            from e2b import FileType

            sbx = self.sandbox()
            one = sorted(e.name for e in sbx.files.list("d"))
            deep = sorted(e.path for e in sbx.files.list("d", depth=3))
            info = sbx.files.get_info("d/e/f.txt")
            return (
                one,
                deep,
                info,
                sbx.files.exists("d/e/f.txt"),
                sbx.files.exists("d/nope"),
                FileType,
            )

        one, deep, info, yes, no, file_type = yield self.sdk(job)
        self.assertEqual(one, ["e"])
        self.assertEqual(
            deep,
            [os.path.join(self.base_dir, p) for p in ("d/e", "d/e/f.txt")],
        )
        self.assertEqual(
            (info.name, info.type, info.size, info.mode, info.permissions),
            ("f.txt", file_type.FILE, 5, 0o640, "-rw-r-----"),
        )
        self.assertTrue(yes)
        self.assertFalse(no)

    @inlineCallbacks
    def test_rename_make_dir_remove(self) -> Any:
        """rename moves; make_dir is True then False (exists); remove deletes trees."""

        def job() -> Any:
            sbx = self.sandbox()
            made = sbx.files.make_dir("x/y")
            again = sbx.files.make_dir("x/y")
            sbx.files.write("x/y/z.txt", "z")
            moved = sbx.files.rename("x/y/z.txt", "x/w.txt")
            sbx.files.remove("x/y")
            return made, again, moved, sbx.files.exists("x/y")

        made, again, moved, exists = yield self.sdk(job)
        self.assertEqual((made, again, exists), (True, False, False))
        self.assertEqual(moved.path, os.path.join(self.base_dir, "x/w.txt"))
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "x/w.txt")))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "x/y")))

    @inlineCallbacks
    def test_a_refused_rename_moves_nothing(self) -> Any:
        """
        Renaming a link that leads out of the base dir is refused before
        anything moves: the link is still under its old name and no new
        name appeared.  A link whose new place leads it out answers the
        rename (it was done) describing the link without its target.
        """
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        links = os.path.join(self.base_dir, "rl")
        os.makedirs(links)
        os.symlink(outside, os.path.join(links, "out"))
        os.symlink("..", os.path.join(links, "up"))

        def job() -> Any:
            sbx = self.sandbox()
            refused = caught(lambda: sbx.files.rename("rl/out", "rl/out2"))
            moved = sbx.files.rename("rl/up", "up")
            return refused, moved

        refused, moved = yield self.sdk(job)
        from e2b import SandboxException

        self.assertIsInstance(refused, SandboxException)
        self.assertIn("path_not_allowed", str(refused))
        self.assertEqual(sorted(os.listdir(links)), ["out"])
        self.assertEqual(os.readlink(os.path.join(links, "out")), outside)
        self.assertEqual(moved.path, os.path.join(self.base_dir, "up"))
        self.assertTrue(os.path.islink(os.path.join(self.base_dir, "up")))

    @inlineCallbacks
    def test_a_mounted_file_is_written_and_kept(self) -> Any:
        """
        A bind-mounted file (a container's /etc/hosts) takes a write in
        place; removing it or renaming onto it is refused, and it stays.
        """
        outside = os.path.realpath(self.mktemp())
        with open(outside, "w") as f:
            f.write("127.0.0.1 localhost\n")
        hosts = os.path.join(self.base_dir, "hosts")
        with open(hosts, "w"):
            pass
        bind_mount(self, outside, hosts)

        def job() -> Any:
            sbx = self.sandbox()
            sbx.files.write("hosts", "127.0.0.1 localhost\n10.0.0.1 app\n")
            sbx.files.write("other.txt", "other")
            return (
                sbx.files.read("hosts"),
                caught(lambda: sbx.files.remove("hosts")),
                caught(lambda: sbx.files.rename("other.txt", "hosts")),
            )

        text, removed, renamed = yield self.sdk(job)
        self.assertEqual(text, "127.0.0.1 localhost\n10.0.0.1 app\n")
        for refused in (removed, renamed):
            self.assertIn("it is a mount point", str(refused))
        with open(outside) as f:
            self.assertEqual(f.read(), "127.0.0.1 localhost\n10.0.0.1 app\n")
        self.assertEqual(sorted(os.listdir(self.base_dir)), ["hosts", "other.txt"])

    @inlineCallbacks
    def test_rename_into_a_mounted_volume(self) -> Any:
        """rename into a directory mounted from elsewhere moves the file there."""
        volume = os.path.realpath(self.mktemp())
        os.makedirs(volume)
        os.makedirs(os.path.join(self.base_dir, "vol"))
        bind_mount(self, volume, os.path.join(self.base_dir, "vol"))

        def job() -> Any:
            sbx = self.sandbox()
            sbx.files.write("report.txt", "done")
            return sbx.files.rename("report.txt", "vol/report.txt")

        moved = yield self.sdk(job)
        self.assertEqual(moved.path, os.path.join(self.base_dir, "vol/report.txt"))
        with open(os.path.join(volume, "report.txt")) as f:
            self.assertEqual(f.read(), "done")
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "report.txt")))

    @inlineCallbacks
    def test_watch_dir(self) -> Any:
        """watch_dir reports a created file by its name relative to the directory."""
        os.makedirs(os.path.join(self.base_dir, "w"))

        def job() -> Any:
            from e2b.sandbox.filesystem.watch_handle import FilesystemEventType

            sbx = self.sandbox()
            handle = sbx.files.watch_dir("w")
            sbx.files.write("w/new.txt", "x")
            os.remove(os.path.join(self.base_dir, "w/new.txt"))
            events: list[Any] = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                events += handle.get_new_events()
                if any(e.type == FilesystemEventType.REMOVE for e in events):
                    break
                time.sleep(0.1)
            handle.stop()
            return [(e.name, e.type.value) for e in events]

        events = yield self.sdk(job)
        self.assertIn(("new.txt", "create"), events)
        self.assertIn(("new.txt", "remove"), events)
        self.assertFalse([n for n, _ in events if n.endswith(".upload")])

    @inlineCallbacks
    def test_watch_dir_sees_a_tree_removed(self) -> Any:
        """
        A recursive watch_dir reports each file of a tree removed at once
        (``rm -rf``), not only the directories: the files' events are
        sent after their directory has gone.
        """
        os.makedirs(os.path.join(self.base_dir, "w", "p", "q"))
        for name in ("p/a.txt", "p/q/b.txt"):
            with open(os.path.join(self.base_dir, "w", name), "w"):
                pass

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.files.watch_dir("w", recursive=True)
            shutil.rmtree(os.path.join(self.base_dir, "w", "p"))
            events: list[Any] = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                events += handle.get_new_events()
                if any(e.name == "p" for e in events):
                    break
                time.sleep(0.1)
            handle.stop()
            return sorted((e.name, e.type.value) for e in events)

        events = yield self.sdk(job)
        self.assertEqual(
            events,
            [
                ("p", "remove"),
                ("p/a.txt", "remove"),
                ("p/q", "remove"),
                ("p/q/b.txt", "remove"),
            ],
        )


class WatchPollLossTests(E2BCase):
    """The sync SDK's polled ``watch_dir`` never loses events without a word."""

    extra_policy = {
        "endpoints": {"files_watch": {"limits": {"max_output_bytes": 4096}}}
    }

    @inlineCallbacks
    def test_a_poll_after_events_were_dropped_says_so(self) -> Any:
        """
        When more events came between two ``get_new_events()`` than a
        watch keeps (4 KiB here), the poll raises an error saying events
        were lost and what to do, never a short list that looks whole;
        the next poll reports what happened after it.
        """
        os.makedirs(os.path.join(self.base_dir, "wl"))

        def job() -> Any:
            from e2b import SandboxException

            sbx = self.sandbox()
            handle = sbx.files.watch_dir("wl")
            for i in range(200):
                with open(os.path.join(self.base_dir, "wl", f"f{i:03d}.txt"), "w"):
                    pass
            time.sleep(0.5)
            error = caught(handle.get_new_events)
            with open(os.path.join(self.base_dir, "wl", "after.txt"), "w"):
                pass
            events: list[Any] = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not events:
                events += handle.get_new_events()
                time.sleep(0.1)
            handle.stop()
            return error, SandboxException, [e.name for e in events]

        error, base, names = yield self.sdk(job)
        self.assertIsInstance(error, base)
        self.assertIn("DATA_LOSS", str(error))
        self.assertIn("events since the last poll were not kept", str(error))
        self.assertIn("list the directory again", str(error))
        self.assertIn("after.txt", names)


class SlowUploadTests(E2BCase):
    """
    A streamed upload is held to the idle bound on each read, not to the
    port's minimum body rate: a slow but steady source is not cut (made
    1 s of grace and 1000 bytes a second here).
    """

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        kwargs.setdefault("head_deadline", 1.0)
        kwargs.setdefault("body_min_rate", 1000.0)
        kwargs.setdefault("idle_timeout", 2.0)
        return super().start(stop_at_end, **kwargs)

    @inlineCallbacks
    def test_a_slow_steady_stream_is_written_whole(self) -> Any:
        """
        ``files.write`` of an iterable that gives 100 bytes every 0.2 s
        for 4 s (half the minimum rate) writes the file whole.
        """

        def chunks() -> Any:
            for i in range(20):
                time.sleep(0.2)
                yield b"%03d" % i + b"x" * 97

        def job() -> Any:
            sbx = self.sandbox()
            return caught(lambda: sbx.files.write("slow.txt", chunks()))

        result = yield self.sdk(job)
        self.assertNotIsInstance(result, Exception)
        with open(os.path.join(self.base_dir, "slow.txt"), "rb") as f:
            data = f.read()
        self.assertEqual(data, b"".join(b"%03d" % i + b"x" * 97 for i in range(20)))

    @inlineCallbacks
    def test_a_stalled_stream_is_still_cut(self) -> Any:
        """
        A streamed upload whose source stops giving anything for longer
        than the idle bound (made 2 s here) is cut, and nothing is written.
        """

        def chunks() -> Any:
            yield b"first"
            time.sleep(4)
            yield b"never"

        def job() -> Any:
            sbx = self.sandbox()
            return caught(lambda: sbx.files.write("stalled.txt", chunks()))

        result = yield self.sdk(job)
        self.assertIsInstance(result, Exception)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "stalled.txt")))


class ListCapTests(E2BCase):
    """``files.list`` never answers a cut listing as if it were whole."""

    extra_policy = {"endpoints": {"files_list": {"limits": {"max_entries": 5}}}}

    @inlineCallbacks
    def test_a_listing_over_the_cap_is_refused(self) -> Any:
        """
        A listing of more entries than ``max_entries`` (5 here) raises an
        error naming the limit and what to do; one within it is whole.
        """
        for d, count in (("big", 6), ("small", 5)):
            os.makedirs(os.path.join(self.base_dir, d))
            for i in range(count):
                with open(os.path.join(self.base_dir, d, f"f{i}"), "w"):
                    pass

        def job() -> Any:
            sbx = self.sandbox()
            return caught(lambda: sbx.files.list("big")), sbx.files.list("small")

        error, small = yield self.sdk(job)
        from e2b import InvalidArgumentException

        self.assertIsInstance(error, InvalidArgumentException)
        self.assertIn("the listing has more than 5 entries", str(error))
        self.assertIn("endpoints.files_list.limits.max_entries", str(error))
        self.assertEqual(sorted(e.name for e in small), [f"f{i}" for i in range(5)])


class PtyTests(E2BCase):
    """``sbx.pty``: create, send_stdin, resize, kill, output to on_data."""

    @inlineCallbacks
    def test_pty(self) -> Any:
        """A terminal echoes what it is sent, takes a resize, and dies on kill."""

        def job() -> Any:
            from e2b.sandbox.commands.command_handle import PtySize

            sbx = self.sandbox()
            data: list[bytes] = []
            handle = sbx.pty.create(PtySize(rows=24, cols=80))
            ended: list[Any] = []

            def follow() -> None:
                try:
                    ended.append(handle.wait(on_pty=data.append))
                except Exception as e:
                    ended.append(e)

            reader = threading.Thread(target=follow, daemon=True)
            reader.start()
            sbx.pty.send_stdin(handle.pid, b"echo pty-$((40+2))\n")
            sbx.pty.resize(handle.pid, PtySize(rows=33, cols=101))
            sbx.pty.send_stdin(handle.pid, b"stty size\n")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and b"33 101" not in b"".join(data):
                time.sleep(0.05)
            listed = [p.pid for p in sbx.commands.list()]
            killed = sbx.pty.kill(handle.pid)
            reader.join(10)
            return handle.pid, b"".join(data), listed, killed, ended

        pid, data, listed, killed, ended = yield self.sdk(job)
        self.assertIn(b"pty-42", data)
        self.assertIn(b"33 101", data)
        self.assertIn(pid, listed)
        self.assertTrue(killed)
        self.assertEqual(len(ended), 1, "the stream ended once the terminal was killed")
        self.assertFalse(alive(pid))

    @inlineCallbacks
    def test_pty_output_past_the_scrollback_is_exact(self) -> Any:
        """
        ``seq 1 100000`` on a terminal (about 670 KB, far past its 64 KiB
        scrollback) reaches ``on_pty`` as exactly the bytes the terminal
        wrote: none skipped, none sent twice.
        """
        want = b"".join(b"%d\r\n" % i for i in range(1, 100001))

        def job() -> Any:
            from e2b.sandbox.commands.command_handle import PtySize

            sbx = self.sandbox()
            data: list[bytes] = []
            handle = sbx.pty.create(PtySize(rows=24, cols=80))
            sbx.pty.send_stdin(handle.pid, b"stty -echo; seq 1 100000; exit\n")
            handle.wait(on_pty=data.append)
            return b"".join(data)

        for _ in range(3):
            data = yield self.sdk(job)
            self.assertEqual(data.count(b"\r\n50000\r\n"), 1)
            self.assertIn(want, data)

    @inlineCallbacks
    def test_pty_deadline(self) -> Any:
        """A terminal's timeout (Connect-Timeout-Ms) ends it, as envd does."""

        def job() -> Any:
            from e2b.sandbox.commands.command_handle import PtySize

            # Long enough that a loaded machine still creates the terminal
            # within it; the test is that the deadline then ends it.
            handle = self.sandbox().pty.create(PtySize(rows=24, cols=80), timeout=4)
            try:
                handle.wait()
            except Exception as e:
                return handle.pid, e
            return handle.pid, None

        pid, error = yield self.sdk(job)
        self.assertIsNotNone(error)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            yield self.sdk(time.sleep, 0.1)
        self.assertFalse(alive(pid))


class AsyncSdkTests(E2BCase):
    """The SDK's async client: ``AsyncSandbox``, whose pty takes ``on_data``."""

    @inlineCallbacks
    def test_async_pty_on_data_and_watch(self) -> Any:
        """pty.create(on_data=…) gets the terminal's output; watch_dir streams events."""
        os.makedirs(os.path.join(self.base_dir, "aw"))

        def job() -> Any:
            import asyncio

            from e2b import AsyncSandbox
            from e2b.sandbox.commands.command_handle import PtySize

            async def main() -> Any:
                sbx = await AsyncSandbox.create()
                data: list[bytes] = []
                handle = await sbx.pty.create(
                    PtySize(rows=24, cols=80), on_data=data.append
                )
                await sbx.pty.send_stdin(handle.pid, b"echo async-$((6*7))\n")
                for _ in range(100):
                    if b"async-42" in b"".join(data):
                        break
                    await asyncio.sleep(0.05)
                killed = await sbx.pty.kill(handle.pid)
                events: list[Any] = []
                watch = await sbx.files.watch_dir("aw", on_event=events.append)
                await sbx.files.write("aw/x.txt", "x")
                for _ in range(100):
                    if events:
                        break
                    await asyncio.sleep(0.05)
                await watch.stop()
                return b"".join(data), killed, [(e.name, e.type.value) for e in events]

            return asyncio.run(main())

        data, killed, events = yield self.sdk(job)
        self.assertIn(b"async-42", data)
        self.assertTrue(killed)
        self.assertIn(("x.txt", "create"), events)


class UnreadOutputTests(E2BCase):
    """
    Output a client leaves unread pauses the program (it blocks in
    ``write``), as under envd, however long the client takes within the
    door's bound; the connection is not cut as a stalled one meanwhile
    (the HTTP front's idle bound here is 1 s, so it cuts one after 2 s).
    """

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        kwargs.setdefault("idle_timeout", 1.0)
        return super().start(stop_at_end, **kwargs)

    @inlineCallbacks
    def test_command_read_late_arrives_whole(self) -> Any:
        """
        A background command's output read 5 s after it started (far more
        than the socket buffers hold) arrives whole, with its exit code.
        """

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.commands.run(
                "seq 1 3000000; echo END", background=True, timeout=60
            )
            time.sleep(5)
            return handle.wait()

        result = yield self.sdk(job)
        lines = result.stdout.split("\n")
        self.assertEqual(result.exit_code, 0)
        self.assertEqual(lines[-3:], ["3000000", "END", ""])
        self.assertEqual(len(lines), 3000002)

    @inlineCallbacks
    def test_past_the_bound_the_stream_ends_with_a_timeout(self) -> Any:
        """
        Past the bound on unread output (made 2 s here) the stream ends
        with an error the SDK maps (TimeoutException, not a raw
        ``connectrpc`` error); the command itself runs on.
        """
        from e2b import TimeoutException

        from sandboxd.e2b import process as process_module

        self.patch(process_module, "E2B_UNREAD_OUTPUT_SECONDS", 2.0)
        marker = os.path.join(self.base_dir, "pid")

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.commands.run(
                f"echo $$ > {marker}; seq 1 3000000; sleep 30",
                background=True,
                timeout=60,
            )
            time.sleep(5)
            return caught(handle.wait)

        error = yield self.sdk(job)
        self.assertIsInstance(error, TimeoutException)
        self.assertIn("took none of the output for 2 seconds", str(error))
        with open(marker) as f:
            pid = int(f.read())
        self.assertTrue(alive(pid), "the command runs on")
        os.kill(pid, 9)

    @inlineCallbacks
    def test_a_quiet_input_stream_is_kept(self) -> Any:
        """
        A ``stream_input`` whose client sends nothing for 3 s (a keyboard
        at rest) is not closed as an idle connection: the line after the
        pause arrives.
        """

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.commands.run("cat", background=True, stdin=True, timeout=60)

            def lines() -> Any:
                yield "one\n"
                time.sleep(3)
                yield "two\n"

            sbx.commands.stream_input(handle.pid, lines())
            sbx.commands.close_stdin(handle.pid)
            return handle.wait().stdout

        out = yield self.sdk(job)
        self.assertEqual(out, "one\ntwo\n")

    @inlineCallbacks
    def test_terminal_read_late_arrives_whole(self) -> Any:
        """
        A terminal whose handle is read 12 s after a command filled it
        (past the 10 s a WebSocket viewer is given) has the shell wait
        for it: every line arrives, none lost to a cut.
        """

        def job() -> Any:
            from e2b.sandbox.commands.command_handle import PtySize

            sbx = self.sandbox()
            handle = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
            sbx.pty.send_stdin(
                handle.pid, b"stty -echo; seq 1 1500000; echo END''MARK; exit\n"
            )
            time.sleep(12)
            data: list[bytes] = []
            error = caught(lambda: handle.wait(on_pty=data.append))
            return error, b"".join(data)

        error, data = yield self.sdk(job)
        self.assertNotIsInstance(error, Exception)
        want = b"".join(b"%d\r\n" % i for i in range(1, 1500001))
        self.assertIn(want + b"ENDMARK", data)


def stalled_connect(port: int, pid: int) -> socket.socket:
    """
    A raw ``Connect`` on ``pid`` whose client reads nothing (a hung
    dashboard, a suspended laptop): its socket's receive buffer is small,
    so the daemon's sends to it fill up at once.
    """
    body = json.dumps({"process": {"pid": pid}}).encode()
    message = struct.pack(">BI", 0, len(body)) + body
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"POST /process.Process/Connect HTTP/1.1\r\n"
        b"Host: 127.0.0.1\r\n"
        b"Content-Type: application/connect+json\r\n"
        b"Connect-Protocol-Version: 1\r\n"
        b"Content-Length: %d\r\n\r\n" % len(message) + message
    )
    return sock


def read_to_end(sock: socket.socket, seconds: float = 30.0) -> bytes:
    """Everything the daemon sends ``sock`` until it stops for a second."""
    sock.settimeout(1.0)
    chunks = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            break
        if not data:
            break
        chunks.append(data)
    sock.close()
    return b"".join(chunks)


class StalledFollowerTests(E2BCase):
    """
    A ``Connect`` whose client stops reading never stops the program: its
    owner's stream (and the program's own progress) goes on, and the
    follower is dropped with an error saying why.
    """

    @inlineCallbacks
    def test_a_stalled_follower_does_not_stop_the_command(self) -> Any:
        """
        While a second client's ``Connect`` on a background command reads
        nothing, the owner's ``wait()`` gets all 20 MB of its output and
        its exit code; the stalled follower's stream ends with a timeout
        saying it was dropped and the process runs on.
        """

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.commands.run(
                "sleep 1; seq 1 3000000; echo END", background=True, timeout=60
            )
            follower = stalled_connect(self.e2b_port, handle.pid)
            result = handle.wait()
            return result, read_to_end(follower)

        result, seen = yield self.sdk(job)
        lines = result.stdout.split("\n")
        self.assertEqual(result.exit_code, 0)
        self.assertEqual(lines[-3:], ["3000000", "END", ""])
        self.assertEqual(len(lines), 3000002)
        self.assertIn(b"it is dropped so the process does not wait for it", seen)
        self.assertIn(b"deadline_exceeded", seen)

    @inlineCallbacks
    def test_a_follower_taking_nothing_is_dropped_after_the_bound(self) -> Any:
        """
        A follower that takes none of what waits for it for the bound
        (made 1 s here; 15 s by default, as envd's) is dropped although it
        is far from the byte bound: its stream ends with a timeout saying
        how long it took nothing; the command runs on.
        """
        from sandboxd.e2b import process as process_module

        self.patch(process_module, "E2B_STALLED_FOLLOWER_SECONDS", 1.0)
        marker = os.path.join(self.base_dir, "pid")

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.commands.run(
                f"echo $$ > {marker}; sleep 1; seq 1 300000; sleep 30",
                background=True,
                timeout=60,
            )
            follower = stalled_connect(self.e2b_port, handle.pid)
            time.sleep(5)
            return read_to_end(follower)

        seen = yield self.sdk(job)
        self.assertIn(b"took none of the output for 1 seconds", seen)
        with open(marker) as f:
            pid = int(f.read())
        self.assertTrue(alive(pid), "the command runs on")
        os.kill(pid, 9)

    @inlineCallbacks
    def test_a_stalled_follower_does_not_stop_a_terminal(self) -> Any:
        """
        The same for a terminal: a ``Connect`` on its pid that reads
        nothing does not stop the shell; its creator's handle gets every
        line of a burst far larger than the socket buffers hold.
        """

        def job() -> Any:
            from e2b.sandbox.commands.command_handle import PtySize

            sbx = self.sandbox()
            handle = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
            follower = stalled_connect(self.e2b_port, handle.pid)
            time.sleep(0.5)
            sbx.pty.send_stdin(
                handle.pid, b"stty -echo; seq 1 1500000; echo END''MARK; exit\n"
            )
            data: list[bytes] = []
            error = caught(lambda: handle.wait(on_pty=data.append))
            follower.close()
            return error, b"".join(data)

        error, data = yield self.sdk(job)
        self.assertNotIsInstance(error, Exception)
        want = b"".join(b"%d\r\n" % i for i in range(1, 1500001))
        self.assertIn(want + b"ENDMARK", data)


class StreamInputTests(E2BCase):
    """``commands.stream_input``: each message reaches the process as it is sent."""

    @inlineCallbacks
    def test_input_is_applied_as_it_arrives(self) -> Any:
        """
        A line the iterable yields reaches ``cat`` (and comes back as
        output) before the iterable yields the next one, as envd applies
        each message on receipt: not once the client's stream has ended.
        """

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.commands.run("cat", background=True, stdin=True, timeout=60)
            seen: list[str] = []
            threading.Thread(
                target=lambda: handle.wait(on_stdout=seen.append), daemon=True
            ).start()
            echoed = []

            def lines() -> Any:
                for i in range(3):
                    yield f"line{i}\n"
                    deadline = time.monotonic() + 5
                    while f"line{i}" not in "".join(seen):
                        if time.monotonic() > deadline:
                            echoed.append(False)
                            break
                        time.sleep(0.02)
                    else:
                        echoed.append(True)

            sbx.commands.stream_input(handle.pid, lines())
            sbx.commands.kill(handle.pid)
            return echoed

        echoed = yield self.sdk(job)
        self.assertEqual(echoed, [True, True, True])

    @inlineCallbacks
    def test_a_stream_larger_than_any_body_gets_through(self) -> Any:
        """
        20 MiB streamed in 64 KiB messages (more than a request body may
        hold) reaches ``wc -c`` whole: each message is bounded, not the
        stream.
        """

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.commands.run("wc -c", background=True, stdin=True, timeout=60)
            sbx.commands.stream_input(handle.pid, (b"z" * 65536 for _ in range(320)))
            sbx.commands.close_stdin(handle.pid)
            return handle.wait().stdout.strip()

        count = yield self.sdk(job)
        self.assertEqual(count, str(320 * 65536))

    @inlineCallbacks
    def test_a_process_not_reading_makes_the_stream_wait(self) -> Any:
        """
        Input for a process that does not read yet waits in the client
        (its stream is read no further meanwhile), not in the daemon: none
        is refused, and it all arrives once the process reads.
        """

        def job() -> Any:
            sbx = self.sandbox()
            handle = sbx.commands.run(
                "sleep 3; wc -c", background=True, stdin=True, timeout=60
            )
            sbx.commands.stream_input(handle.pid, (b"z" * 65536 for _ in range(160)))
            sbx.commands.close_stdin(handle.pid)
            return handle.wait().stdout.strip()

        count = yield self.sdk(job)
        self.assertEqual(count, str(160 * 65536))

    @inlineCallbacks
    def test_a_missing_process_is_refused_at_once(self) -> Any:
        """
        A stream naming no process is NotFoundException as soon as its
        start is read, and the next call on the door is served.
        """
        from e2b import NotFoundException

        def job() -> Any:
            sbx = self.sandbox()

            def forever() -> Any:
                for _ in range(300):
                    yield b"x"
                    time.sleep(0.05)

            start = time.monotonic()
            error = caught(lambda: sbx.commands.stream_input(4_000_000, forever()))
            took = time.monotonic() - start
            return error, took, sbx.commands.run("echo next").stdout

        error, took, after = yield self.sdk(job)
        self.assertIsInstance(error, NotFoundException)
        self.assertLess(took, 10, "refused before the stream's 15 s were sent")
        self.assertEqual(after, "next\n")


class SmallAnswerTests(E2BCase):
    """Small things an SDK user reads: names as given, what really runs, nothing dropped."""

    @inlineCallbacks
    def test_make_dir_onto_a_file_names_the_path_as_given(self) -> Any:
        """``make_dir`` onto a file names it as the caller did, not absolute."""
        os.makedirs(os.path.join(self.base_dir, "er"))
        with open(os.path.join(self.base_dir, "er", "file"), "w"):
            pass

        def job() -> Any:
            return caught(lambda: self.sandbox().files.make_dir("er/file"))

        error = yield self.sdk(job)
        self.assertIn(
            "path already exists but it is not a directory: er/file", str(error)
        )
        self.assertNotIn(self.base_dir, str(error))

    @inlineCallbacks
    def test_write_with_metadata_is_refused_not_dropped(self) -> Any:
        """
        ``files.write(..., metadata=...)`` is refused as a gzip upload is
        (metadata is not kept here), and nothing is written; without
        metadata the same write works.
        """

        def job() -> Any:
            sbx = self.sandbox()
            refused = caught(lambda: sbx.files.write("m.txt", "x", metadata={"k": "v"}))
            exists = os.path.exists(os.path.join(self.base_dir, "m.txt"))
            sbx.files.write("m.txt", "y")
            return refused, exists

        refused, exists = yield self.sdk(job)
        self.assertIsInstance(refused, Exception)
        self.assertIn("file metadata", str(refused))
        self.assertIn("is not kept on this port", str(refused))
        self.assertFalse(exists)
        with open(os.path.join(self.base_dir, "m.txt")) as f:
            self.assertEqual(f.read(), "y")

    @inlineCallbacks
    def test_list_shows_a_terminal_as_it_runs(self) -> Any:
        """``commands.list`` shows a terminal's shell without the ``-i -l`` it does not run with."""

        def job() -> Any:
            from e2b.sandbox.commands.command_handle import PtySize

            sbx = self.sandbox()
            handle = sbx.pty.create(PtySize(rows=24, cols=80), timeout=30)
            listed = {p.pid: p for p in sbx.commands.list()}
            sbx.pty.kill(handle.pid)
            return handle.pid, listed

        pid, listed = yield self.sdk(job)
        self.assertEqual(listed[pid].args, [])

    @inlineCallbacks
    def test_write_onto_a_named_pipe_is_refused(self) -> Any:
        """
        ``files.write`` onto a named pipe is refused as ``files.read`` of
        it is, and the pipe is left a pipe (not replaced by a file).
        """
        os.makedirs(os.path.join(self.base_dir, "sp"))
        fifo = os.path.join(self.base_dir, "sp", "fifo")
        os.mkfifo(fifo)

        def job() -> Any:
            return caught(lambda: self.sandbox().files.write("sp/fifo", "x"))

        error = yield self.sdk(job)
        self.assertIsInstance(error, Exception)
        self.assertIn("Not a regular file: sp/fifo", str(error))
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
