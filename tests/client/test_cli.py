# -*- test-case-name: tests.client.test_cli -*-
"""
The commands that drive a daemon (``sandboxd exec``, ``cp``, ``ls``,
``ps``, ``logs``, ``kill``, ``caps``, ``term``), run as a user runs them:
a separate process talking to a real daemon on loopback.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import time
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.client import upload_ids
from sandboxd.client._core import RESUMABLE_UPLOAD_BYTES
from sandboxd.client.cli import DetachFilter, parse_keys
from tests.client.base import ROOT, ClientCase, listen_proxy


class ExecTests(ClientCase):
    """``sandboxd exec``."""

    @inlineCallbacks
    def test_exit_code_and_output(self) -> Any:
        """The child's stdout, stderr and exit code are exec's own."""
        done = yield self.cli(
            "exec", "--", "sh", "-c", "echo out; echo err >&2; exit 7"
        )
        self.assertEqual(done.returncode, 7)
        self.assertEqual(done.stdout, b"out\n")
        self.assertEqual(done.stderr, b"err\n")
        ok = yield self.cli("exec", "--", "true")
        self.assertEqual(ok.returncode, 0)

    @inlineCallbacks
    def test_options(self) -> Any:
        """``--cwd``, ``--env`` and ``--json`` are honoured."""
        os.makedirs(self.path("work"))
        done = yield self.cli(
            "exec",
            "--cwd",
            "work",
            "--env",
            "A=1",
            "--json",
            "--",
            "sh",
            "-c",
            "pwd; echo $A",
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        answer = json.loads(done.stdout)
        self.assertEqual(answer["exit_code"], 0)
        self.assertEqual(answer["stdout"].split("\n")[1], "1")
        self.assertTrue(answer["stdout"].startswith(self.path("work")))

    @inlineCallbacks
    def test_signal_and_timeout(self) -> Any:
        """A child killed by a signal exits 128+N; one past --timeout exits 124."""
        killed = yield self.cli("exec", "--", "sh", "-c", "kill -TERM $$")
        self.assertEqual(killed.returncode, 128 + 15)
        late = yield self.cli("exec", "--timeout", "0.5", "--", "sleep", "10")
        self.assertEqual(late.returncode, 124)
        self.assertIn(b"timed out", late.stderr)

    @inlineCallbacks
    def test_shell_statuses(self) -> Any:
        """
        A command that is not there exits 127, as in a shell;
        ps shows a process ended by SIGTERM as 143, as exec would exit; caps
        says "preset default" (what discovery names no preset), not "None".
        """
        missing = yield self.cli("exec", "--", "no-such-command-zz")
        self.assertEqual(missing.returncode, 127, missing.stderr)
        self.assertIn(b"no-such-command-zz", missing.stderr)

        def start_and_term() -> int:
            sb = self.sandbox()
            proc = sb.commands.start("sleep 30", tag="ps-status")
            proc.signal(15)
            return int(proc.wait(timeout=10) or 0)

        code = yield self.in_thread(start_and_term)
        self.assertEqual(code, -15)
        ps = yield self.cli("ps", "--tag", "ps-status")
        self.assertIn(b" 143 ", ps.stdout)
        self.assertNotIn(b"-15", ps.stdout)
        caps = yield self.cli("caps")
        self.assertIn(b"preset default", caps.stdout)

    @inlineCallbacks
    def test_bad_token_and_url(self) -> Any:
        """A wrong token or an unreachable daemon is a clear message and exit 1."""
        bad = yield self.cli("exec", "--token", "wrong", "--", "true")
        self.assertEqual(bad.returncode, 1)
        self.assertIn(b"token rejected", bad.stderr)
        gone = yield self.cli("ls", "--url", "http://127.0.0.1:9")
        self.assertEqual(gone.returncode, 1)
        self.assertIn(b"cannot reach the daemon", gone.stderr)
        malformed = yield self.cli("ls", "--url", "http://[::")
        self.assertEqual(malformed.returncode, 2)
        self.assertIn(b"invalid daemon URL", malformed.stderr)

    @inlineCallbacks
    def test_bad_numbers_of_seconds(self) -> Any:
        """
        A timeout that is not a number of seconds above 0 (``-1``, ``0``,
        ``nan``, ``inf``) is bad usage: exit 2 with a line naming it, no
        traceback, nothing run (was: a traceback, or a network error for 0).
        """
        for args in (
            ("ls", "--request-timeout", "-1"),
            ("ls", "--request-timeout", "0"),
            ("ls", "--request-timeout", "nan"),
            ("exec", "--timeout", "nan", "--", "touch", "ran"),
            ("exec", "--timeout", "inf", "--", "touch", "ran"),
            ("code", "--timeout", "-5", "-c", "1"),
        ):
            done = yield self.cli(*args)
            self.assertEqual(done.returncode, 2, (args, done.stderr))
            self.assertIn(b"number of seconds", done.stderr, args)
            self.assertNotIn(b"Traceback", done.stderr, args)
        self.assertFalse(os.path.exists(self.path("ran")))

    @inlineCallbacks
    def test_messages_say_what_went_wrong(self) -> Any:
        """
        A download from a daemon that cannot be reached says so (was: "download
        cut at 0 of ? bytes" and a .part file that is not there); an exec
        whose connection is cut mid-output says its output is incomplete
        and the command ended (was: "cannot reach the daemon").
        """
        local = os.path.realpath(self.mktemp())
        os.makedirs(local)
        target = os.path.join(local, "x")
        gone = yield self.cli("cp", ":f.txt", target, "--url", "http://127.0.0.1:9")
        self.assertEqual(gone.returncode, 1)
        self.assertIn(b"cannot reach the daemon at http://127.0.0.1:9", gone.stderr)
        self.assertNotIn(b"cut", gone.stderr)
        self.assertNotIn(b".part", gone.stderr)
        self.assertEqual(os.listdir(local), [])

        _, url = listen_proxy(self, lambda index, data: len(data) > 20_000)
        cut = yield self.cli(
            "exec", "--url", url, "--", "sh", "-c", "seq -f line-%g 100000; sleep 30"
        )
        self.assertEqual(cut.returncode, 1)
        self.assertIn(b"was lost", cut.stderr)
        self.assertIn(b"the output above is incomplete", cut.stderr)
        self.assertIn(b"line-1\n", cut.stdout)

    @inlineCallbacks
    def test_token_and_url_mistakes(self) -> Any:
        """
        A token with a trailing newline (read from a file or a secret)
        works; a non-ASCII one is refused as such (exit 2), with no codec
        message; an ``https://`` URL for the plain-HTTP port fails at once
        saying the port speaks plain HTTP, not after a 30 s timeout.
        """
        token = self.daemon.token or ""
        padded = yield self.cli("ls", env={"SANDBOXD_TOKEN": f" {token}\n"})
        self.assertEqual(padded.returncode, 0, padded.stderr)
        accented = yield self.cli("ls", env={"SANDBOXD_TOKEN": "t\u00f6k"})
        self.assertEqual(accented.returncode, 2, accented.stderr)
        self.assertIn(b"must be printable ASCII", accented.stderr)
        self.assertNotIn(b"codec", accented.stderr)
        https = self.daemon.url.replace("http://", "https://")
        started = time.monotonic()
        tls = yield self.cli("ls", "--url", https, "--request-timeout", "20")
        self.assertLess(time.monotonic() - started, 10)
        self.assertEqual(tls.returncode, 1, tls.stderr)
        self.assertIn(b"TLS handshake failed", tls.stderr)
        self.assertIn(b"use http:// rather than https://", tls.stderr)

    @inlineCallbacks
    def test_refused_path(self) -> Any:
        """A path the policy refuses names the code and the rule."""
        done = yield self.cli("ls", "/etc")
        self.assertEqual(done.returncode, 1)
        self.assertIn(b"path_not_allowed", done.stderr)
        self.assertIn(b"rule", done.stderr)


class ExecBytesTests(ClientCase):
    """``sandboxd exec`` through pipes: bytes as they are, stdin forwarded."""

    @inlineCallbacks
    def test_binary_output_byte_exact(self) -> Any:
        """A megabyte of every byte value, no final newline, arrives as sent."""
        script = "import sys; sys.stdout.buffer.write(bytes(range(256)) * 3907 + b'\\xff\\xfe')"
        done = yield self.cli("exec", "--", "python3", "-c", script)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, bytes(range(256)) * 3907 + b"\xff\xfe")
        err = yield self.cli("exec", "--", "sh", "-c", "printf '\\377ok' >&2")
        self.assertEqual(err.stderr, b"\xffok")

    @inlineCallbacks
    def test_json_output_not_utf8_and_timed_out(self) -> Any:
        """
        ``exec --json`` gives output that is not UTF-8 also as
        ``stdout_base64``, its exact bytes (was: U+FFFD in their place and
        no word of it); a run past ``--timeout`` has the same shape, with
        the output so far, plus ``error`` and ``code`` (status 124).
        """
        done = yield self.cli("exec", "--json", "--", "printf", "a\\377b\\n")
        doc = json.loads(done.stdout)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(doc["stdout"], "a\ufffdb\n")
        self.assertEqual(base64.b64decode(doc["stdout_base64"]), b"a\xffb\n")
        self.assertNotIn("stderr_base64", doc)
        late = yield self.cli(
            "exec", "--json", "--timeout", "1", "--", "sh", "-c", "echo hi; sleep 30"
        )
        self.assertEqual(late.returncode, 124)
        doc = json.loads(late.stdout)
        self.assertEqual(
            {k: doc[k] for k in ("stdout", "stderr", "truncated", "code")},
            {"stdout": "hi\n", "stderr": "", "truncated": False, "code": "timeout"},
        )
        self.assertIn("exit_code", doc)
        self.assertIn("error", doc)

    @inlineCallbacks
    def test_archive_through_a_pipe(self) -> Any:
        """``tar czf - dir > x.tgz`` gives an archive that lists its member."""
        os.makedirs(self.path("d"))
        with open(self.path("d", "f.bin"), "wb") as f:
            f.write(os.urandom(200_000))
        done = yield self.cli("exec", "--", "tar", "czf", "-", "d")
        self.assertEqual(done.returncode, 0, done.stderr)
        import io
        import tarfile

        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
            member = tar.extractfile("d/f.bin")
            assert member is not None
            with open(self.path("d", "f.bin"), "rb") as f:
                self.assertEqual(member.read(), f.read())

    @inlineCallbacks
    def test_stdin_forwarded(self) -> Any:
        """Piped stdin reaches the command (``echo x | sandboxd exec -- cat``); -n keeps it."""
        done = yield self.cli("exec", "--", "cat", input=b"x\n\xff\x00")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, b"x\n\xff\x00")
        kept = yield self.cli("exec", "-n", "--", "cat", input=b"x\n")
        self.assertEqual(kept.stdout, b"")

    @inlineCallbacks
    def test_stdin_over_the_request_limit(self) -> Any:
        """
        Stdin travels base64 in one request: 700 KB fits the default 1 MiB
        ``max_request_bytes``; 1 MB does not, and the refusal says stdin
        filled it, which limit to raise, and to copy the data in instead.
        """
        fits = yield self.cli("exec", "--", "wc", "-c", input=b"a" * 700_000)
        self.assertEqual(fits.returncode, 0, fits.stderr)
        self.assertEqual(fits.stdout.split(), [b"700000"])
        over = yield self.cli("exec", "--", "wc", "-c", input=b"a" * 1_000_000)
        self.assertEqual(over.returncode, 1, over.stderr)
        self.assertEqual(over.stdout, b"")
        self.assertIn(b"shell_stream.limits.max_request_bytes", over.stderr)
        self.assertIn(b"stdin (1000000 bytes)", over.stderr)
        self.assertIn(b"`sandboxd cp`", over.stderr)

    @inlineCallbacks
    def test_idle_stdin_pipe_not_waited_for(self) -> Any:
        """A stdin pipe that stays open and silent (a CI runner's) does not hang exec."""
        import subprocess

        def run() -> tuple[int, bytes]:
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sandboxd.client.cli",
                    "exec",
                    "--",
                    "echo",
                    "ok",
                ],
                env={
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "PYTHONPATH": ROOT,
                    "SANDBOXD_URL": self.daemon.url,
                    "SANDBOXD_TOKEN": self.daemon.token or "",
                },
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            try:
                code = child.wait(timeout=20)
                assert child.stdout is not None
                return code, child.stdout.read()
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
                assert child.stdin is not None
                child.stdin.close()
                if child.stdout is not None:
                    child.stdout.close()

        code, out = yield self.in_thread(run)
        self.assertEqual((code, out), (0, b"ok\n"))

    @inlineCallbacks
    def test_closed_pipe_is_quiet(self) -> Any:
        """Piping exec and caps into ``head`` ends with no traceback."""
        import shlex
        import subprocess

        me = f"{shlex.quote(sys.executable)} -m sandboxd.client.cli"
        environ = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": ROOT,
            "SANDBOXD_URL": self.daemon.url,
            "SANDBOXD_TOKEN": self.daemon.token or "",
        }
        for line in (
            f"{me} exec -- seq 1 2000000 | head -n 1",
            f"{me} caps --json | head -c 10",
        ):
            done = yield self.in_thread(
                subprocess.run,
                ["bash", "-c", f"set -o pipefail; {line}"],
                env=environ,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=40,
            )
            self.assertEqual(done.stderr, b"", line)
            self.assertTrue(done.stdout, line)


class CopyTests(ClientCase):
    """``sandboxd cp``."""

    @inlineCallbacks
    def test_round_trip(self) -> Any:
        """A local file copied in (``:PATH``) and back out is the same bytes."""
        local = os.path.realpath(self.mktemp())
        os.makedirs(local)
        data = os.urandom(1_500_000)
        with open(os.path.join(local, "f.bin"), "wb") as f:
            f.write(data)
        up = yield self.cli("cp", os.path.join(local, "f.bin"), ":in/")
        self.assertEqual(up.returncode, 0, up.stderr)
        with open(self.path("in", "f.bin"), "rb") as f:
            self.assertEqual(f.read(), data)
        down = yield self.cli("cp", "--json", ":in/f.bin", os.path.join(local, "g.bin"))
        self.assertEqual(down.returncode, 0, down.stderr)
        self.assertEqual(json.loads(down.stdout)["bytes"], len(data))
        with open(os.path.join(local, "g.bin"), "rb") as f:
            self.assertEqual(f.read(), data)
        self.assertEqual(up.stderr, b"")  # no progress bar off a terminal
        both = yield self.cli("cp", ":a", ":b")
        self.assertEqual(both.returncode, 2)

    @inlineCallbacks
    def test_local_errors_name_the_file(self) -> Any:
        """
        A local file that cannot be read or written is named as ``cp``
        names it, the one the user gave (never the ``.part`` beside it),
        without Python's errno text.
        """
        local = os.path.realpath(self.mktemp())
        os.makedirs(local)
        with open(self.path("there.txt"), "wb") as f:
            f.write(b"x")
        cases = (
            (("cp", f"{local}/missing.txt", ":a.txt"), f"{local}/missing.txt"),
            (("cp", local, ":a.txt"), local),
            (("cp", ":there.txt", f"{local}/no/dir/b.txt"), f"{local}/no/dir/b.txt"),
        )
        for argv, named in cases:
            done = yield self.cli(*argv)
            self.assertEqual(done.returncode, 1, done.stderr)
            message = done.stderr.decode()
            self.assertTrue(message.startswith(f"sandboxd cp: {named}: "), message)
            self.assertNotIn("Errno", message)
            self.assertNotIn(".part", message)

    @inlineCallbacks
    def test_dash_is_stdin_and_stdout(self) -> Any:
        """
        ``-`` is stdout as a destination and stdin as a source (piped
        bytes arrive as they are); no local file named ``-`` is read or
        written, and stdin needs a file name on the remote side.
        """
        data = bytes(range(256)) * 40
        with open(self.path("r.bin"), "wb") as f:
            f.write(data)
        down = yield self.cli("cp", ":r.bin", "-")
        self.assertEqual(down.returncode, 0, down.stderr)
        self.assertEqual(down.stdout, data)
        up = yield self.cli("cp", "-", ":in/fromstdin.bin", input=data[::-1])
        self.assertEqual(up.returncode, 0, up.stderr)
        self.assertIn(b"- -> :", up.stdout)
        with open(self.path("in", "fromstdin.bin"), "rb") as f:
            self.assertEqual(f.read(), data[::-1])
        self.assertFalse(os.path.exists("-"))
        into_dir = yield self.cli("cp", "-", ":in/", input=b"x")
        self.assertEqual(into_dir.returncode, 2, into_dir.stderr)
        self.assertIn(b"name the file", into_dir.stderr)

    @inlineCallbacks
    def test_into_an_existing_directory(self) -> Any:
        """
        A target that is an existing directory, named without a trailing
        slash, means into it, either way; a local directory without ``-r``
        says to use it.
        """
        local = os.path.realpath(self.mktemp())
        os.makedirs(local)
        with open(os.path.join(local, "f.txt"), "wb") as f:
            f.write(b"local\n")
        os.makedirs(self.path("rdir"))
        up = yield self.cli("cp", os.path.join(local, "f.txt"), ":rdir")
        self.assertEqual(up.returncode, 0, up.stderr)
        with open(self.path("rdir", "f.txt"), "rb") as f:
            self.assertEqual(f.read(), b"local\n")
        with open(self.path("r.txt"), "wb") as f:
            f.write(b"remote\n")
        down = yield self.cli("cp", ":r.txt", local)
        self.assertEqual(down.returncode, 0, down.stderr)
        with open(os.path.join(local, "r.txt"), "rb") as f:
            self.assertEqual(f.read(), b"remote\n")
        tree = yield self.cli("cp", local, ":rdir")
        self.assertEqual(tree.returncode, 1)
        self.assertIn(b"is a directory (copy it with -r)", tree.stderr)

    @inlineCallbacks
    def test_remote_directory_without_r(self) -> Any:
        """``cp :DIR LOCAL`` without -r says to copy it with -r, as for a local one."""
        os.makedirs(self.path("rdir"))
        local = os.path.realpath(self.mktemp())
        done = yield self.cli("cp", ":rdir", local)
        self.assertEqual(done.returncode, 1)
        self.assertIn(b":rdir: is a directory (copy it with -r)", done.stderr)

    @inlineCallbacks
    def test_recursive_leaves_out_links_out_of_the_tree(self) -> Any:
        """
        ``cp -r`` of a tree holding a link out of it (a virtualenv's python)
        copies the rest and says which link it left out; a tree with a hard
        link copies both names; a tree the daemon refuses (a named pipe)
        leaves no empty target behind.
        """
        local = os.path.realpath(self.mktemp())
        os.makedirs(os.path.join(local, ".venv", "bin"))
        os.symlink("/usr/bin/python3", os.path.join(local, ".venv", "bin", "python"))
        os.symlink("../main.py", os.path.join(local, ".venv", "inside"))
        with open(os.path.join(local, "main.py"), "w") as f:
            f.write("x\n")
        done = yield self.cli("cp", "-r", local, ":proj")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn(b".venv/bin/python: a link to /usr/bin/python3", done.stderr)
        with open(self.path("proj", "main.py")) as f:
            self.assertEqual(f.read(), "x\n")
        self.assertFalse(os.path.lexists(self.path("proj", ".venv", "bin", "python")))
        self.assertEqual(
            os.readlink(self.path("proj", ".venv", "inside")), "../main.py"
        )
        linked = os.path.realpath(self.mktemp())
        os.makedirs(linked)
        with open(os.path.join(linked, "a"), "w") as f:
            f.write("a")
        os.link(os.path.join(linked, "a"), os.path.join(linked, "b"))
        done = yield self.cli("cp", "-r", linked, ":hard")
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(self.path("hard", "b")) as f:
            self.assertEqual(f.read(), "a")
        piped = os.path.realpath(self.mktemp())
        os.makedirs(piped)
        os.mkfifo(os.path.join(piped, "pipe"))
        refused = yield self.cli("cp", "-r", piped, ":piped")
        self.assertEqual(refused.returncode, 1)
        self.assertFalse(os.path.exists(self.path("piped")))

    @inlineCallbacks
    def test_recursive(self) -> Any:
        """
        ``cp -r`` copies a tree in (nested and empty directories) and out
        (nested ones): into a directory that exists, as the target when it
        does not.
        """
        local = os.path.realpath(self.mktemp())
        os.makedirs(os.path.join(local, "proj", "src", "deep"))
        os.makedirs(os.path.join(local, "proj", "empty"))
        with open(os.path.join(local, "proj", "src", "deep", "a.bin"), "wb") as f:
            f.write(b"\x00a" * 1000)
        with open(os.path.join(local, "proj", "top.txt"), "wb") as f:
            f.write(b"top\n")
        with open(os.path.join(local, "proj", "src", ".dot"), "wb") as f:
            f.write(b"hidden\n")
        os.makedirs(self.path("dest"))
        into = yield self.cli("cp", "-r", os.path.join(local, "proj"), ":dest")
        self.assertEqual(into.returncode, 0, into.stderr)
        with open(self.path("dest", "proj", "src", "deep", "a.bin"), "rb") as f:
            self.assertEqual(f.read(), b"\x00a" * 1000)
        self.assertTrue(os.path.isdir(self.path("dest", "proj", "empty")))
        named = yield self.cli("cp", "-r", os.path.join(local, "proj"), ":copy")
        self.assertEqual(named.returncode, 0, named.stderr)
        with open(self.path("copy", "top.txt"), "rb") as f:
            self.assertEqual(f.read(), b"top\n")

        back = os.path.join(local, "back")
        os.makedirs(back)
        out = yield self.cli("cp", "-r", ":dest/proj", back)
        self.assertEqual(out.returncode, 0, out.stderr)
        with open(os.path.join(back, "proj", "src", "deep", "a.bin"), "rb") as f:
            self.assertEqual(f.read(), b"\x00a" * 1000)
        with open(os.path.join(back, "proj", "src", ".dot"), "rb") as f:
            self.assertEqual(f.read(), b"hidden\n")
        fresh = os.path.join(local, "fresh")
        again = yield self.cli("cp", "-r", ":copy", fresh)
        self.assertEqual(again.returncode, 0, again.stderr)
        with open(os.path.join(fresh, "top.txt"), "rb") as f:
            self.assertEqual(f.read(), b"top\n")

    @inlineCallbacks
    def test_refused_download_leaves_nothing(self) -> Any:
        """A download the daemon refuses (missing, outside the base dir) leaves no ``.part``."""
        local = os.path.realpath(self.mktemp())
        os.makedirs(local)
        for remote in (":missing.bin", ":/etc/passwd"):
            done = yield self.cli("cp", remote, os.path.join(local, "x.bin"))
            self.assertEqual(done.returncode, 1, done.stderr)
            self.assertEqual(os.listdir(local), [], remote)

    @inlineCallbacks
    def test_resume(self) -> Any:
        """
        A download whose daemon goes away keeps its ``.part`` and exits 1
        saying so; the same ``cp`` again resumes it (``Range``) to the
        whole file, and shows progress when asked.
        """
        data = os.urandom(2_000_000)
        with open(self.path("big.bin"), "wb") as f:
            f.write(data)

        def cut(index: int, seen: bytes) -> bool:
            if proxy.cuts == 0 and len(seen) > 500_000:
                proxy.refuse = True
                return True
            return False

        proxy, url = listen_proxy(self, cut)
        local = os.path.realpath(self.mktemp())
        os.makedirs(local)
        target = os.path.join(local, "big.bin")
        first = yield self.cli("cp", "--url", url, ":big.bin", target)
        self.assertEqual(first.returncode, 1)
        self.assertIn(b"run the same cp again to resume", first.stderr)
        self.assertFalse(os.path.exists(target))
        kept = os.path.getsize(target + ".part")
        self.assertGreater(kept, 0)
        proxy.refuse = False
        again = yield self.cli("cp", "--url", url, "--progress", ":big.bin", target)
        self.assertEqual(again.returncode, 0, again.stderr)
        with open(target, "rb") as f:
            self.assertEqual(f.read(), data)
        self.assertIn(b"100%", again.stderr)
        # stderr is a pipe here: plain lines, no escape codes or \r.
        self.assertNotIn(b"\x1b", again.stderr)
        self.assertNotIn(b"\r", again.stderr)
        self.assertIn(f"bytes={kept}-".encode(), bytes(proxy.requests[-1]))


class UploadResumeTests(ClientCase):
    """``sandboxd cp LOCAL :REMOTE`` resumed across runs."""

    def cut_upload(self) -> tuple[Any, str, str, bytes, dict[str, str]]:
        """A big local file, a proxy that goes away after ~3 MB, a cache dir."""
        data = os.urandom(RESUMABLE_UPLOAD_BYTES + 2_000_000)
        local = os.path.realpath(self.mktemp())
        with open(local, "wb") as f:
            f.write(data)

        def cut(index: int, sent: bytes) -> bool:
            if proxy.cuts == 0 and len(sent) > 3_000_000:
                proxy.refuse = True  # and it does not come back
                return True
            return False

        proxy, url = listen_proxy(self, lambda i, seen: False, cut)
        env = {"XDG_CACHE_HOME": os.path.realpath(self.mktemp())}
        return proxy, url, local, data, env

    def appends(self, proxy: Any, since: int) -> list[int]:
        """The offsets of the appends sent on connections ``since`` on."""
        pattern = re.compile(rb"POST /files/uploads/\w+\?offset=(\d+) HTTP/1.1\r\n")
        return [
            int(m.group(1))
            for sent in proxy.requests[since:]
            for m in pattern.finditer(sent)
        ]

    @inlineCallbacks
    def test_second_cp_continues(self) -> Any:
        """
        An upload whose daemon goes away exits 1 saying to run it again; the
        same cp again sends only what the daemon lacks (one append, from
        past 0, far fewer bytes than the file), the remote file is
        byte-identical and the remembered id is gone.
        """
        proxy, url, local, data, env = self.cut_upload()
        first = yield self.cli("cp", "--url", url, local, ":up.bin", env=env)
        self.assertEqual(first.returncode, 1, first.stderr)
        self.assertIn(b"run the same cp again to resume", first.stderr)
        self.assertFalse(os.path.exists(self.path("up.bin")))
        cache = os.path.join(env["XDG_CACHE_HOME"], "sandboxd", "uploads")
        self.assertEqual(len(os.listdir(cache)), 1)
        proxy.refuse = False
        since = len(proxy.requests)
        again = yield self.cli("cp", "--url", url, local, ":up.bin", env=env)
        self.assertEqual(again.returncode, 0, again.stderr)
        with open(self.path("up.bin"), "rb") as f:
            self.assertEqual(f.read(), data)
        [offset] = self.appends(proxy, since)
        self.assertGreater(offset, 1_000_000)
        sent = sum(len(r) for r in proxy.requests[since:])
        self.assertLess(sent, len(data) - offset + 100_000)
        self.assertEqual(os.listdir(cache), [])

    @inlineCallbacks
    def test_changed_local_file_starts_over(self) -> Any:
        """A local file changed since the cut upload is sent again from offset 0."""
        proxy, url, local, data, env = self.cut_upload()
        first = yield self.cli("cp", "--url", url, local, ":up.bin", env=env)
        self.assertEqual(first.returncode, 1, first.stderr)
        changed = os.urandom(len(data))
        with open(local, "wb") as f:
            f.write(changed)
        os.utime(local, ns=(1, 1))
        proxy.refuse = False
        since = len(proxy.requests)
        again = yield self.cli("cp", "--url", url, local, ":up.bin", env=env)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertEqual(self.appends(proxy, since), [0])
        with open(self.path("up.bin"), "rb") as f:
            self.assertEqual(f.read(), changed)

    @inlineCallbacks
    def test_kept_id_of_another_upload_starts_afresh(self) -> Any:
        """
        A kept id whose upload is for another target (here other.bin)
        is dropped and cp starts a new upload: exit 0, the file whole at
        up.bin, nothing at other.bin, that upload untouched at its offset,
        the stale id forgotten.
        """
        data = os.urandom(300_000)
        local = os.path.realpath(self.mktemp())
        with open(local, "wb") as f:
            f.write(data)
        reply = yield self.request(
            "POST", "/files/uploads", {"path": "other.bin", "size": len(data)}
        )
        other = reply.json()["upload_id"]
        reply = yield self.request(
            "POST",
            f"/files/uploads/{other}?offset=0",
            raw_body=data[:1000],
            headers={"Content-Type": "application/octet-stream"},
        )
        self.assertEqual(reply.status, 200, reply.body)
        env = {"XDG_CACHE_HOME": os.path.realpath(self.mktemp())}
        cache = os.path.join(env["XDG_CACHE_HOME"], "sandboxd", "uploads")
        self.patch(upload_ids, "cache_dir", lambda: cache)
        kept = upload_ids.UploadIds(self.daemon.url, "up.bin", local)
        kept.save(other)
        self.assertEqual(kept.load(), other)
        done = yield self.cli("cp", local, ":up.bin", env=env)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn(other.encode(), done.stderr)
        with open(self.path("up.bin"), "rb") as f:
            self.assertEqual(f.read(), data)
        self.assertFalse(os.path.exists(self.path("other.bin")))
        reply = yield self.request("GET", f"/files/uploads/{other}")
        self.assertEqual(reply.json()["offset"], 1000)
        self.assertEqual(os.listdir(cache), [])


class ListingTests(ClientCase):
    """``ls``, ``ps``, ``logs``, ``kill``, ``caps``."""

    @inlineCallbacks
    def test_ls(self) -> Any:
        """Names for humans (directories marked), entries with --json."""
        os.makedirs(self.path("d", "sub"))
        with open(self.path("d", "f.txt"), "w") as f:
            f.write("x")
        done = yield self.cli("ls", "d")
        self.assertEqual(done.stdout.decode().split(), ["f.txt", "sub/"])
        long = yield self.cli("ls", "-l", "d")
        self.assertIn("file", long.stdout.decode())
        self.assertIn("directory", long.stdout.decode())
        one = yield self.cli("ls", "d/f.txt")
        self.assertEqual((one.returncode, one.stdout), (0, b"f.txt\n"), one.stderr)
        js = yield self.cli("ls", "--json", "d")
        self.assertEqual(len(json.loads(js.stdout)["entries"]), 2)

    @inlineCallbacks
    def test_grep(self) -> Any:
        """
        ``PATH:LINE:TEXT`` per matching line (a line once however many
        matches it holds), exit 0; no match exits 1, trouble 2; --json the
        answer.
        """
        os.makedirs(self.path("src"))
        with open(self.path("src", "a.py"), "w") as f:
            f.write("x = 1\nx = x + x\n")
        with open(self.path("src", "b.txt"), "w") as f:
            f.write("x\n")
        done = yield self.cli("grep", "-F", "x", "src", "--include", "*.py")
        self.assertEqual(done.returncode, 0, done.stderr)
        a = self.path("src", "a.py")
        self.assertEqual(
            done.stdout.decode().splitlines(), [f"{a}:1:x = 1", f"{a}:2:x = x + x"]
        )
        around = yield self.cli("grep", "-C", "1", "x = x", "src")
        self.assertEqual(
            around.stdout.decode().splitlines(), [f"{a}-1-x = 1", f"{a}:2:x = x + x"]
        )
        none = yield self.cli("grep", "nowhere", "src")
        self.assertEqual((none.returncode, none.stdout), (1, b""))
        # Trouble is 2, as grep(1) says it: a bad pattern, a refused path,
        # a wrong token, no daemon.
        for args, env in (
            (("grep", "(", "src"), None),
            (("grep", "x", "/etc"), None),
            (("grep", "x", "src"), {"SANDBOXD_TOKEN": "wrong"}),
            (("grep", "x", "src"), {"SANDBOXD_URL": "http://127.0.0.1:9"}),
        ):
            trouble = yield self.cli(*args, env=env)
            self.assertEqual(trouble.returncode, 2, (args, env, trouble.stderr))
            self.assertIn(b"sandboxd grep: ", trouble.stderr)
        js = yield self.cli("grep", "--json", "-i", "X", "src")
        self.assertEqual(len(json.loads(js.stdout)["matches"]), 5)

    @inlineCallbacks
    def test_ps_logs_kill(self) -> Any:
        """
        ``ps`` lists a started process; ``logs`` prints its output, ``-f``
        follows it to the end; ``kill`` ends it.
        """
        from sandboxd.client import Sandbox

        sb = Sandbox(self.daemon.url, token=self.daemon.token)
        self.addCleanup(sb.close)
        p = yield self.in_thread(
            sb.commands.start, ["sh", "-c", "echo hello; sleep 30"], tag="t1"
        )
        listed = yield self.cli("ps")
        self.assertIn(str(p.pid), listed.stdout.decode())
        self.assertIn("running", listed.stdout.decode())
        as_json = yield self.cli("ps", "--json", "--tag", "t1")
        self.assertEqual([x["pid"] for x in json.loads(as_json.stdout)], [p.pid])
        deadline = time.monotonic() + 10
        logs = yield self.cli("logs", str(p.pid))
        while logs.stdout != b"hello\n" and time.monotonic() < deadline:
            logs = yield self.cli("logs", str(p.pid))
        self.assertEqual(logs.stdout, b"hello\n")
        killed = yield self.cli("kill", str(p.pid))
        self.assertEqual(killed.returncode, 0, killed.stderr)
        followed = yield self.cli("logs", "-f", str(p.pid))
        self.assertEqual(followed.stdout, b"hello\n")
        # How it ended, as exec says it (was: 0 and nothing).
        self.assertEqual(followed.returncode, 143)
        self.assertIn(f"[process {p.pid} exited, status 143]".encode(), followed.stderr)
        info = yield self.in_thread(sb.commands.get, p.pid)
        self.assertEqual(info["exit_code"], -15)
        missing = yield self.cli("logs", "999999")
        self.assertEqual(missing.returncode, 1)

    @inlineCallbacks
    def test_caps(self) -> Any:
        """``caps`` tabulates the endpoints; ``--explain`` gives one decision and its rule."""
        table = yield self.cli("caps")
        text = table.stdout.decode()
        self.assertIn("identity legacy", text)
        self.assertRegex(text, r"shell\s+POST\s+yes")
        self.assertRegex(text, r"code_run\s+POST\s+off \(default:opt-in:dev_tools\)")
        refused = yield self.cli(
            "caps", "--explain", "files_read_raw", "--path", "/etc/passwd"
        )
        self.assertEqual(refused.returncode, 1)
        self.assertIn(
            b"refused (path_not_allowed, rule guard:base_dir)", refused.stdout
        )
        allowed = yield self.cli("caps", "--explain", "shell", "--json")
        self.assertEqual(allowed.returncode, 0)
        self.assertTrue(json.loads(allowed.stdout)["allowed"])
        unknown = yield self.cli("caps", "--explain", "shel")
        self.assertEqual(unknown.returncode, 1)
        self.assertIn(
            b"shel: refused (unknown_endpoint, unknown endpoint 'shel'; "
            b"did you mean 'shell'?)",
            unknown.stdout,
        )

    @inlineCallbacks
    def test_console_script(self) -> Any:
        """The installed ``sandboxd`` script runs exec with the child's exit code."""
        script = os.path.join(os.path.dirname(sys.executable), "sandboxd")
        if not os.path.exists(script):
            raise SkipTest(f"no console script at {script} (not an installed checkout)")
        done = yield self.in_thread(
            __import__("subprocess").run,
            [script, "exec", "--", "sh", "-c", "echo hi; exit 6"],
            env={
                "PATH": os.environ.get("PATH", ""),
                "SANDBOXD_URL": self.daemon.url,
                "SANDBOXD_TOKEN": self.daemon.token or "",
            },
            capture_output=True,
            timeout=40,
        )
        self.assertEqual((done.returncode, done.stdout), (6, b"hi\n"), done.stderr)

    @inlineCallbacks
    def test_dispatch_from_sandboxd_cli(self) -> Any:
        """``sandboxd.cli.main`` hands the client commands on (the console script)."""
        done = yield self.in_thread(
            __import__("subprocess").run,
            [
                sys.executable,
                "-c",
                "import sys, sandboxd.cli; sys.exit(sandboxd.cli.main(sys.argv[1:]))",
                "exec",
                "--",
                "sh",
                "-c",
                "exit 5",
            ],
            env={
                "PATH": os.environ.get("PATH", ""),
                "PYTHONPATH": ROOT,
                "SANDBOXD_URL": self.daemon.url,
                "SANDBOXD_TOKEN": self.daemon.token or "",
            },
            capture_output=True,
            timeout=40,
        )
        self.assertEqual(done.returncode, 5, done.stderr)


class TemplateCommandsCliTests(ClientCase):
    """``sandboxd commands`` lists and runs the template's commands."""

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        from sandboxd.commands import CommandRegistry

        registry = CommandRegistry()

        @registry.command("hello", description="Say hello.")
        def hello(name: str = "World") -> str:
            return f"Hello, {name}!"

        @registry.command("add")
        def add(a: int, b: int = 1) -> dict[str, int]:
            return {"sum": a + b}

        return self.start(registry=registry)

    @inlineCallbacks
    def test_list_run_and_explain(self) -> Any:
        """
        Without a name it lists each command with its arguments; with one
        it runs it (ARG=VALUE, JSON where it reads as JSON) and prints the
        result; a bad pair is usage (2), nothing run; ``caps --explain
        run_command --command NAME`` decides that command (was: none of
        this without curl).
        """
        listed = yield self.cli("commands")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertIn(b'hello(name: string = "World")  Say hello.', listed.stdout)
        self.assertIn(b"add(a: integer, b: integer = 1)", listed.stdout)
        ran = yield self.cli("commands", "hello", "name=Alice")
        self.assertEqual((ran.returncode, ran.stdout), (0, b"Hello, Alice!\n"))
        ran = yield self.cli("commands", "add", "a=2", "b=3", "--timeout", "30")
        self.assertEqual(json.loads(ran.stdout), {"sum": 5})
        bad = yield self.cli("commands", "add", "a")
        self.assertEqual(bad.returncode, 2)
        self.assertIn(b"write an argument as ARG=VALUE", bad.stderr)
        explained = yield self.cli(
            "caps", "--explain", "run_command", "--command", "nosuch", "--json"
        )
        self.assertEqual(explained.returncode, 1, explained.stderr)
        self.assertEqual(json.loads(explained.stdout)["code"], "not_found")


class UiTests(ClientCase):
    """``sandboxd ui`` on a daemon serving the web console."""

    policy = {"groups": {"console": True}}

    @inlineCallbacks
    def test_ui(self) -> Any:
        """
        ``ui`` prints the console's URL with a console link in its fragment
        (narrowed with ``--scope``), and that link works as a bearer token.
        """
        done = yield self.cli("ui", "--scope", "core:read", "--scope", "files:read")
        self.assertEqual(done.returncode, 0, done.stderr)
        url = done.stdout.decode().strip()
        prefix = f"{self.daemon.url}/ui/#link="
        self.assertTrue(url.startswith(prefix), url)
        link = url[len(prefix) :]
        self.assertTrue(link.startswith("sbxl_"))
        self.assertIn(b"works until", done.stderr)
        caps = yield self.request(
            "GET",
            "/capabilities",
            headers={"Authorization": f"Bearer {link}"},
            token=None,
        )
        self.assertEqual(caps.status, 200)
        self.assertEqual(caps.json()["identity"]["scopes"], ["core:read", "files:read"])
        as_json = yield self.cli("ui", "--json", "--ttl", "60")
        self.assertEqual(json.loads(as_json.stdout)["audience"], "console")


class UiConsoleOffTests(ClientCase):
    """``sandboxd ui`` on a daemon whose console group is off (the default)."""

    @inlineCallbacks
    def test_refused_and_nothing_minted(self) -> Any:
        """
        It exits 1 saying the console is off and how to turn it on, prints
        no URL, and mints no link (one would be a live credential printed
        for a page that answers 404).
        """
        done = yield self.cli("ui")
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertEqual(done.stdout, b"")
        self.assertIn(b"does not serve the web console", done.stderr)
        self.assertIn(b'{"groups": {"console": true}}', done.stderr)
        self.assertNotIn(b"sbxl_", done.stderr)
        links = yield self.request("GET", "/auth/links")
        self.assertEqual(links.status, 200)
        self.assertEqual(links.json()["links"], [])


class DetachKeyTests(SynchronousTestCase):
    """The detach sequence of ``sandboxd term``."""

    def test_parse(self) -> None:
        """``ctrl-p,ctrl-q`` is ``\\x10\\x11``; nonsense is a ValueError."""
        self.assertEqual(parse_keys("ctrl-p,ctrl-q"), b"\x10\x11")
        self.assertEqual(parse_keys("ctrl-]"), b"\x1d")
        self.assertRaises(ValueError, parse_keys, "ctrl-pp")
        self.assertRaises(ValueError, parse_keys, "")

    def test_filter(self) -> None:
        """
        A prefix of the sequence is held back until the next key; a key
        that breaks the sequence sends what was held; the whole sequence
        detaches and is never sent.
        """
        f = DetachFilter(b"\x10\x11")
        self.assertEqual(f.feed(b"ab\x10"), (b"ab", False))
        self.assertEqual(f.feed(b"x"), (b"\x10x", False))
        self.assertEqual(f.feed(b"\x10\x10"), (b"\x10", False))
        self.assertEqual(f.feed(b"\x11"), (b"", True))


class TermWithoutTtyTests(ClientCase):
    """``sandboxd term`` with no terminal on stdin."""

    @inlineCallbacks
    def test_refused_and_nothing_left(self) -> Any:
        """It exits 2 saying why, and leaves no terminal session behind."""
        done = yield self.cli("term", input=b"echo hi\n")
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn(b"not a terminal", done.stderr)
        sessions = yield self.in_thread(lambda: self.sandbox().pty.list())
        self.assertEqual(sessions, [])


class TermTests(ClientCase):
    """``sandboxd term`` through a real pseudo-terminal (pexpect)."""

    timeout = 90

    def setUp(self) -> Any:
        try:
            import pexpect  # noqa: F401
        except ImportError:
            raise SkipTest(
                "pexpect is not installed (it is in the dev extra)"
            ) from None
        return super().setUp()

    def _spawn(self, *args: str, dimensions: tuple[int, int] = (24, 80)) -> Any:
        import pexpect

        env = {
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": ROOT,
            "SANDBOXD_URL": self.daemon.url,
            "SANDBOXD_PTY_URL": self.pty_url,
            "SANDBOXD_TOKEN": self.daemon.token or "",
            "TERM": "xterm",
        }
        child = pexpect.spawn(
            sys.executable,
            ["-m", "sandboxd.client.cli", "term", *args],
            env=env,
            dimensions=dimensions,
            timeout=20,
        )
        self.addCleanup(child.close, force=True)
        return child

    def test_interactive_detach_reattach(self) -> Any:
        """
        ``term`` opens a shell in raw mode: typed keys run commands, a
        window-size change reaches the shell, the detach keys leave the
        session running, and ``term SESSION`` reattaches with the
        scrollback; the shell's exit status is term's.
        """

        def body() -> None:
            child = self._spawn("--shell", "sh")
            child.expect(r"\[session ([0-9a-f]+); detach with ctrl-p,ctrl-q\]")
            session = child.match.group(1).decode()
            child.send("echo $((6*7))x\r")
            child.expect("42x")
            child.setwinsize(33, 101)
            # SIGWINCH reaches term asynchronously: ask until the shell sees it.
            for _ in range(20):
                child.send("stty size\r")
                if child.expect(["33 101", "24 80"]) == 0:
                    break
                time.sleep(0.2)
            else:
                self.fail("the new window size never reached the shell")
            child.send("\x10\x11")
            child.expect(r"detached from session")
            # A quiet job does not keep a detached session: the user is told.
            child.expect(r"no client and no output the daemon closes it")
            child.expect(pexpect_eof())
            child.wait()
            self.assertEqual(child.exitstatus, 0)

            again = self._spawn(session)
            again.expect("42x")  # the scrollback
            again.send("exit 3\r")
            again.expect(r"ended, exit code 3")
            again.expect(pexpect_eof())
            again.wait()
            self.assertEqual(again.exitstatus, 3)

        return self.in_thread(body)

    def test_killed_term_restores_the_terminal(self) -> Any:
        """
        ``term`` sent SIGTERM or SIGHUP (``timeout``, a supervisor, a
        closed window) puts the local terminal back as it was (echo, line
        editing: was left raw) and says the session runs on and how to
        reattach, as a detach does; its status is 128 + the signal.
        """
        import signal
        import termios

        def body() -> None:
            sb = self.sandbox()
            for sig in (signal.SIGTERM, signal.SIGHUP):
                child = self._spawn("--shell", "sh")
                child.expect(r"\[session ([0-9a-f]+); detach with")
                session = child.match.group(1).decode()
                child.send("echo $((6*7))x\r")
                child.expect("42x")
                child.kill(sig)
                child.expect(f"detached from session {session} \\({sig.name}\\)")
                child.expect(f"reattach with: sandboxd term {session}")
                lflag = termios.tcgetattr(child.child_fd)[3]
                child.expect(pexpect_eof())
                child.wait()
                self.assertEqual(child.exitstatus, 128 + sig, sig.name)
                self.assertTrue(lflag & termios.ECHO, sig.name)
                self.assertTrue(lflag & termios.ICANON, sig.name)
                self.assertIs(sb.pty.get(session)["alive"], True)
                sb.pty.close(session)

        return self.in_thread(body)

    def test_unsized_terminal(self) -> Any:
        """
        A terminal that reports no size (0x0: a pty nobody sized yet) gets
        a shell of 80x24, not a refusal of its size.
        """

        def body() -> None:
            child = self._spawn("--shell", "sh", dimensions=(0, 0))
            child.expect(r"\[session ([0-9a-f]+); detach with")
            child.send("stty size\r")
            child.expect("24 80")
            child.send("exit\r")
            child.expect(pexpect_eof())

        return self.in_thread(body)

    def test_typeahead_reaches_the_shell(self) -> Any:
        """
        Keys typed before ``term`` has attached (here at once, while the
        interpreter is still starting) run in the shell once it is up,
        rather than being dropped when the terminal goes raw.
        """

        def body() -> None:
            child = self._spawn("--shell", "sh")
            child.send("echo early-$((6*7))\r")
            child.expect(r"\[session ")
            child.expect("early-42")
            child.send("exit\r")
            child.expect(pexpect_eof())

        return self.in_thread(body)


def pexpect_eof() -> Any:
    """``pexpect.EOF`` (imported late: pexpect is a dev dependency)."""
    import pexpect

    return pexpect.EOF
