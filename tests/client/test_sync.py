# -*- test-case-name: tests.client.test_sync -*-
"""
The blocking client (:class:`sandboxd.client.Sandbox`) against a real
daemon on loopback: every namespace that works without optional tools.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.threads import blockingCallFromThread

from sandboxd.client import (
    AsyncSandbox,
    InvalidParam,
    NotFound,
    PathNotAllowed,
    PreconditionFailed,
    RequestTimeout,
    Sandbox,
    Timeout,
)
from tests.client.base import ROOT, ClientCase, CutProxy


class ImportTests(ClientCase):
    """What importing the client costs."""

    autostart = False

    def test_no_twisted(self) -> None:
        """
        Importing ``sandboxd.client`` (and the client CLI) loads no module
        of Twisted, Autobahn or zope: the client runs without the daemon's
        stack.
        """
        code = (
            "import sys, sandboxd.client, sandboxd.client.cli;"
            "bad = sorted(m for m in sys.modules"
            " if m.split('.')[0] in ('twisted', 'autobahn', 'zope', 'txaio'));"
            "print(bad); sys.exit(1 if bad else 0)"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONPATH": ROOT, "PATH": os.environ.get("PATH", "")},
            capture_output=True,
            timeout=30,
        )
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertEqual(done.stdout.strip(), b"[]")

    def test_console_script_client_command_without_twisted(self) -> None:
        """
        The ``sandboxd`` console script runs a client command (here one whose
        daemon is unreachable) without importing Twisted either.
        """
        code = (
            "import sys, sandboxd.__main__ as m;"
            "rc = m.main(['ls', '--url', 'http://127.0.0.1:9', '--request-timeout', '2']);"
            "bad = sorted(x for x in sys.modules if x.split('.')[0] in ('twisted', 'autobahn'));"
            "print(rc, bad)"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONPATH": ROOT, "PATH": os.environ.get("PATH", "")},
            capture_output=True,
            timeout=60,
        )
        self.assertEqual(done.stdout.strip(), b"1 []", done.stderr)


class FilesTests(ClientCase):
    """``sandbox.files``."""

    def test_text_bytes_and_tree(self) -> Any:
        """
        Text and bytes round-trip; list, stat, exists, mkdir, move, search
        and delete answer what the daemon's routes answer.
        """

        def body() -> None:
            sb = self.sandbox()
            written = sb.files.write_text("docs/a.txt", "héllo\n")
            self.assertEqual(written["bytes"], len("héllo\n".encode()))
            self.assertEqual(sb.files.read_text("docs/a.txt"), "héllo\n")
            blob = bytes(range(256)) * 10
            sb.files.write_bytes("docs/b.bin", blob, mode=0o600)
            self.assertEqual(sb.files.read_bytes("docs/b.bin"), blob)
            self.assertEqual(os.stat(self.path("docs/b.bin")).st_mode & 0o777, 0o600)
            names = sorted(e["name"] for e in sb.files.list("docs"))
            self.assertEqual(names, ["a.txt", "b.bin"])
            stat = sb.files.stat("docs/b.bin")
            self.assertEqual((stat["type"], stat["size"]), ("file", 2560))
            self.assertFalse(sb.files.exists("docs/nope"))
            sb.files.mkdir("docs/sub/deeper")
            self.assertTrue(os.path.isdir(self.path("docs/sub/deeper")))
            sb.files.move("docs/a.txt", "docs/sub/a.txt")
            found = sb.files.search("*.txt", "docs")
            self.assertEqual([r["name"] for r in found["results"]], ["a.txt"])
            sb.files.delete("docs/sub")
            self.assertFalse(os.path.exists(self.path("docs/sub")))

        return self.in_thread(body)

    def test_edit(self) -> Any:
        """
        ``edit`` replaces text in place and gives the new etag; a missing
        text raises InvalidParam saying so (its ``kind``), a stale etag
        PreconditionFailed, and neither changes the file.
        """

        def body() -> None:
            sb = self.sandbox()
            sb.files.write_text("app.py", "DEBUG = True\nLEVEL = 1\n")
            done = sb.files.edit("app.py", "DEBUG = True", "DEBUG = False")
            self.assertEqual(done["replacements"], 1)
            self.assertEqual(sb.files.read_text("app.py"), "DEBUG = False\nLEVEL = 1\n")
            with self.assertRaises(InvalidParam) as caught:
                sb.files.edit("app.py", "DEBUG = True", "x")
            self.assertEqual(caught.exception.body["kind"], "not_found")
            edits = [{"old_text": "LEVEL = 1", "new_text": "LEVEL = 2"}]
            with self.assertRaises(PreconditionFailed):
                sb.files.edit("app.py", edits=edits, if_match='"0-0-0"')
            done = sb.files.edit("app.py", edits=edits, if_match=done["etag"])
            self.assertEqual(sb.files.read_text("app.py"), "DEBUG = False\nLEVEL = 2\n")
            with self.assertRaises(TypeError):
                sb.files.edit("app.py", "only old text")
            self.assertEqual(sb.files.chmod("app.py", 0o750)["mode"], "750")
            self.assertEqual(os.stat(self.path("app.py")).st_mode & 0o777, 0o750)

        return self.in_thread(body)

    def test_grep(self) -> Any:
        """
        ``files.grep`` answers the daemon's matches; a pattern that is not a
        regular expression raises the error of its code.
        """

        def body() -> None:
            sb = self.sandbox()
            sb.files.write_text("src/a.py", "x = 1\nprint(x)  # x?\n")
            sb.files.write_text("src/b.txt", "x?\n")
            found = sb.files.grep("x?", "src", fixed_strings=True, include="*.py")
            self.assertEqual(
                [(m["line"], m["column"], m["text"]) for m in found["matches"]],
                [(2, 13, "print(x)  # x?")],
            )
            self.assertEqual(
                (found["files_searched"], found["truncated"], found["timed_out"]),
                (1, False, False),
            )
            everywhere = sb.files.grep("X", ignore_case=True, max_results=2)
            self.assertEqual(len(everywhere["matches"]), 2)
            self.assertTrue(everywhere["truncated"])
            with self.assertRaises(InvalidParam) as caught:
                sb.files.grep("x(")
            self.assertIn("fixed_strings", str(caught.exception))

        return self.in_thread(body)

    def test_read_lines(self) -> Any:
        """``files.read_lines``: some lines as text, where they lie; from the end too."""

        def body() -> None:
            sb = self.sandbox()
            sb.files.write_text(
                "log.txt", "".join(f"line {n}\n" for n in range(1, 101))
            )
            part = sb.files.read_lines("log.txt", 10, 2)
            self.assertEqual(part["text"], "line 10\nline 11\n")
            self.assertEqual(
                (part["offset"], part["lines"], part["total_lines"], part["more"]),
                (10, 2, 100, True),
            )
            tail = sb.files.read_lines("log.txt", -1)
            self.assertEqual(
                (tail["text"], tail["offset"], tail["more"]), ("line 100\n", 100, False)
            )
            with self.assertRaises(InvalidParam):
                sb.files.read_lines("log.txt", 0)

        return self.in_thread(body)

    def test_archive_and_extract(self) -> Any:
        """``archive`` returns the archive's bytes; ``extract`` unpacks them."""

        def body() -> None:
            sb = self.sandbox()
            sb.files.write_text("src/one.txt", "1")
            sb.files.write_text("src/two.txt", "22")
            data = sb.files.archive("src")
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                self.assertIn("src/two.txt", tar.getnames())
            result = sb.files.extract(data, "copy")
            self.assertEqual(result["files"], 2)
            with open(self.path("copy", "src", "two.txt")) as f:
                self.assertEqual(f.read(), "22")

        return self.in_thread(body)

    def test_upload_download_progress(self) -> Any:
        """
        ``upload`` and ``download`` stream a local file over the raw route,
        reporting progress up to the total; the download lands whole, with
        no ``.part`` left behind.
        """
        local = os.path.join(self.mktemp())
        os.makedirs(local)
        source = os.path.join(local, "big.bin")
        data = os.urandom(3 * 1024 * 1024 + 17)
        with open(source, "wb") as f:
            f.write(data)

        def body() -> None:
            sb = self.sandbox()
            seen: list[tuple[int, int | None]] = []
            written = sb.files.upload(
                source, "in/big.bin", progress=lambda d, t: seen.append((d, t))
            )
            self.assertEqual(written["sha256"], hashlib.sha256(data).hexdigest())
            self.assertEqual(seen[-1], (len(data), len(data)))
            got: list[tuple[int, int | None]] = []
            target = os.path.join(local, "back.bin")
            size = sb.files.download(
                "in/big.bin", target, progress=lambda d, t: got.append((d, t))
            )
            self.assertEqual(size, len(data))
            self.assertEqual(got[-1], (len(data), len(data)))
            with open(target, "rb") as f:
                self.assertEqual(f.read(), data)
            self.assertFalse(os.path.exists(target + ".part"))

        return self.in_thread(body)

    def test_download_resumes_a_partial_file(self) -> Any:
        """
        A ``.part`` left by an earlier download (with the file's ETag) is
        continued with ``Range``: only the rest is fetched.  One whose ETag
        no longer matches is fetched again from the start (``If-Range``).
        """
        data = os.urandom(600_000)
        with open(self.path("file.bin"), "wb") as f:
            f.write(data)
        local = os.path.realpath(self.mktemp())
        os.makedirs(local)
        target = os.path.join(local, "file.bin")

        def body() -> None:
            sb = self.sandbox()
            etag = sb.files.stat("file.bin")["etag"]
            with open(target + ".part", "wb") as f:
                f.write(data[:250_000])
            with open(target + ".part.etag", "w") as f:
                f.write(etag)
            progress: list[int] = []
            sb.files.download(
                "file.bin", target, progress=lambda d, t: progress.append(d)
            )
            self.assertEqual(progress[0], 250_000)
            with open(target, "rb") as f:
                self.assertEqual(f.read(), data)
            # A stale partial file (another version): fetched whole again.
            with open(target + ".part", "wb") as f:
                f.write(b"x" * 1000)
            with open(target + ".part.etag", "w") as f:
                f.write('"stale"')
            sb.files.download("file.bin", target)
            with open(target, "rb") as f:
                self.assertEqual(f.read(), data)
            self.assertFalse(os.path.exists(target + ".part.etag"))

        return self.in_thread(body)

    def test_watch(self) -> Any:
        """``watch`` yields change events for the watched directory."""
        os.makedirs(self.path("w"))

        def body() -> None:
            sb = self.sandbox()
            events = sb.files.watch("w")
            sb.files.write_text("w/new.txt", "x")
            with events:
                for event in events:
                    # An atomic write: a temporary file moved into place.
                    if event.data.get("dest", event.data["path"]).endswith("/new.txt"):
                        break
            self.assertIn(event.event, ("moved", "created"))
            self.assertIsNotNone(event.id)

        return self.in_thread(body)

    def test_exists_with_a_missing_parent(self) -> Any:
        """
        ``exists`` answers False for a path whose parent directory is
        missing, or is a file (was: NotFound and InvalidPath raised), as
        ``os.path.exists`` does; ``stat`` says ``exists: false`` with the
        path it looked at.  Outside the boundary is still refused.
        """
        os.makedirs(self.path("a"))
        with open(self.path("a", "f.txt"), "w") as f:
            f.write("x")

        def body() -> None:
            sb = self.sandbox()
            self.assertTrue(sb.files.exists("a/f.txt"))
            for path in ("nope.txt", "nodir/x.txt", "a/nodir/x.txt", "a/f.txt/x"):
                self.assertIs(sb.files.exists(path), False, path)
            found = sb.files.stat("nodir/x.txt")
            self.assertEqual(
                (found["exists"], found["type"], found["path"], found["name"]),
                (False, "unknown", self.path("nodir", "x.txt"), "x.txt"),
            )
            with self.assertRaises(PathNotAllowed):
                sb.files.exists("/etc/nodir/x")

        return self.in_thread(body)

    def test_close_a_watch_another_thread_reads(self) -> Any:
        """
        ``close()`` from one thread ends a watch another thread is blocked
        reading: the reader's loop ends quietly at once (was: ``close()``
        raised RuntimeError and the reader stayed blocked); closing the
        whole client under a reader ends it with a ``SandboxError``.
        """
        import threading

        from sandboxd.client import ConnectionFailed

        os.makedirs(self.path("w"))

        def read(events: Any, ended: dict[str, Any]) -> None:
            try:
                for _event in events:
                    pass
                ended["how"] = "end"
            except BaseException as e:
                ended["how"] = e

        def body() -> None:
            sb = self.sandbox()
            events = sb.files.watch("w")
            ended: dict[str, Any] = {}
            reader = threading.Thread(target=read, args=(events, ended))
            reader.start()
            time.sleep(0.5)
            started = time.monotonic()
            events.close()
            reader.join(10)
            self.assertFalse(reader.is_alive())
            self.assertLess(time.monotonic() - started, 2)
            self.assertEqual(ended, {"how": "end"})
            self.assertEqual(list(events), [])

            other = self.sandbox()
            events = other.files.watch("w")
            ended = {}
            reader = threading.Thread(target=read, args=(events, ended))
            reader.start()
            time.sleep(0.5)
            other.close()
            reader.join(10)
            self.assertFalse(reader.is_alive())
            self.assertIsInstance(ended["how"], ConnectionFailed)

        return self.in_thread(body)

    def test_break_out_of_watch(self) -> Any:
        """
        A ``break`` out of ``for event in stream`` with no ``with`` or
        ``close()`` closes the stream quietly when it is dropped (was:
        "async generator ignored GeneratorExit" printed as it was
        collected).
        """
        import gc
        import sys

        os.makedirs(self.path("w"))
        unraisable: list[Any] = []

        def body() -> None:
            sb = self.sandbox()
            events = sb.files.watch("w")
            sb.files.write_text("w/a.txt", "x")
            for _event in events:
                break
            del events, _event
            gc.collect()

        saved = sys.unraisablehook
        sys.unraisablehook = unraisable.append
        self.addCleanup(setattr, sys, "unraisablehook", saved)
        d = self.in_thread(body)

        def check(_: Any) -> None:
            self.assertEqual([repr(u.exc_value) for u in unraisable], [])

        return d.addCallback(check)

    def test_edit_with_empty_old_text_says_so(self) -> Any:
        """
        ``edit(path, "", new)`` is refused naming the field the caller gave
        (``old_text``, empty), not an ``edits[0]`` it never wrote.
        """
        with open(self.path("e.txt"), "w") as f:
            f.write("hi\n")

        def body() -> None:
            with self.assertRaises(InvalidParam) as caught:
                self.sandbox().files.edit("e.txt", "", "x")
            self.assertEqual(
                caught.exception.message,
                "'old_text' is empty: give the text to replace, or 'insert_line' "
                "to add new_text after a line",
            )

        return self.in_thread(body)

    def test_watch_resumes_a_stream_the_daemon_ended(self) -> Any:
        """
        A watch stream the daemon ends without its ``end`` event (as when
        it stops) is a cut: the client reconnects, is told of the gap and
        goes on with the changes made after.
        """
        os.makedirs(self.path("w"))

        def close_watches() -> None:
            for watch in list(self.daemon.context.watches.get().watches.values()):
                watch.close()

        def body() -> None:
            sb = self.sandbox()
            seen: list[str] = []
            with sb.files.watch("w") as events:
                with open(self.path("w/a.txt"), "w"):
                    pass
                for event in events:
                    seen.append(event.event)
                    if event.data.get("path", "").endswith("/a.txt"):
                        blockingCallFromThread(reactor, close_watches)
                    elif event.event == "gap":  # the new watch is live
                        with open(self.path("w/b.txt"), "w"):
                            pass
                    elif event.data.get("path", "").endswith("/b.txt"):
                        break
            self.assertIn("gap", seen)
            self.assertEqual(seen[-1], "created")

        return self.in_thread(body)

    def test_watch_ends_when_its_directory_goes(self) -> Any:
        """A watch whose directory is deleted ends with ``end``, and the loop stops."""
        os.makedirs(self.path("w"))

        def body() -> None:
            sb = self.sandbox()
            with sb.files.watch("w") as events:
                os.rmdir(self.path("w"))
                kinds = [event.event for event in events]
            self.assertEqual(kinds[-2:], ["deleted", "end"])

        return self.in_thread(body)


class CommandsTests(ClientCase):
    """``sandbox.commands``."""

    def test_run(self) -> Any:
        """
        ``run`` answers stdout, stderr and the exit code; with callbacks it
        streams each line as it completes, in order.
        """

        def body() -> None:
            sb = self.sandbox()
            result = sb.commands.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
            self.assertEqual(
                (result.stdout, result.stderr, result.exit_code), ("out\n", "err\n", 3)
            )
            lines: list[tuple[str, str]] = []
            result = sb.commands.run(
                "printf 'a\\nb\\n'; echo c >&2",
                shell="sh",
                on_stdout=lambda line: lines.append(("out", line)),
                on_stderr=lambda line: lines.append(("err", line)),
            )
            self.assertEqual(lines, [("out", "a"), ("out", "b"), ("err", "c")])
            self.assertEqual(result.exit_code, 0)
            os.makedirs(self.path("sub"))
            self.assertTrue(sb.commands.run("pwd", cwd="sub").stdout.endswith("/sub\n"))
            env = sb.commands.run(
                ["sh", "-c", "echo $GREETING"], env={"GREETING": "hi"}
            )
            self.assertEqual(env.stdout, "hi\n")

        return self.in_thread(body)

    def test_start_wait_stdin_signal(self) -> Any:
        """
        ``start`` returns a handle: its stdin feeds the child, ``wait``
        passes output on and returns the exit code, ``signal`` ends a
        process (exit code minus the signal), and ``list``/``get`` see it.
        """

        def body() -> None:
            sb = self.sandbox()
            cat = sb.commands.start("cat", stdin=True, tag="cat")
            cat.send_stdin("one\n")
            cat.send_stdin("two\n", eof=True)
            chunks: list[str] = []
            self.assertEqual(cat.wait(timeout=20, on_stdout=chunks.append), 0)
            self.assertEqual("".join(chunks), "one\ntwo\n")
            self.assertEqual([p["pid"] for p in sb.commands.list(tag="cat")], [cat.pid])
            sleeper = sb.commands.start("sleep 30")
            self.assertEqual(sb.commands.get(sleeper.pid)["state"], "running")
            sleeper.signal("SIGTERM")
            self.assertEqual(sleeper.wait(timeout=20), -15)
            killed = sb.commands.start("sleep 30")
            killed.kill()
            self.assertEqual(killed.wait(timeout=20), -9)

        return self.in_thread(body)

    def test_wait_raises_timeout(self) -> Any:
        """
        ``wait`` on a process the daemon ended on its own ``timeout``
        raises ``Timeout``, as ``run`` does, rather than return -15 like
        any other kill; ``info`` says ``timed_out``.
        """

        def body() -> None:
            sb = self.sandbox()
            p = sb.commands.start("sleep 30", timeout=0.3)
            with self.assertRaises(Timeout):
                p.wait(timeout=20)
            self.assertIs(p.info()["timed_out"], True)
            done = sb.commands.start("true")
            self.assertEqual(done.wait(timeout=20), 0)
            self.assertIs(done.info()["timed_out"], False)

        return self.in_thread(body)

    def test_wait_timeout_on_a_silent_process(self) -> Any:
        """
        ``wait(timeout=N)`` raises ``RequestTimeout`` about N seconds in
        when the process prints nothing (the daemon sends only heartbeats),
        also for an N longer than the heartbeat's interval, and after some
        output; the process runs on.
        """

        def body() -> None:
            sb = self.sandbox()
            for timeout, command in (
                (1.0, "sleep 30"),
                (6.0, "sleep 30"),
                (1.0, "sh -c 'echo one; sleep 30'"),
            ):
                p = sb.commands.start(command)
                started = time.monotonic()
                with self.assertRaises(RequestTimeout) as raised:
                    p.wait(timeout=timeout)
                took = time.monotonic() - started
                self.assertGreaterEqual(took, timeout)
                self.assertLess(took, timeout + 1.5, command)
                self.assertIn("still runs", raised.exception.message)
                self.assertEqual(p.info()["state"], "running")
                p.kill()

        return self.in_thread(body)

    def test_output_cursor(self) -> Any:
        """
        ``output`` pages from the handle's cursor: a second read returns
        only what came after the first.
        """

        def body() -> None:
            sb = self.sandbox()
            p = sb.commands.start(
                ["sh", "-c", "echo first; read x; echo second"], stdin=True
            )
            deadline = time.monotonic() + 10
            first: list[str] = []
            while not first and time.monotonic() < deadline:
                first = [e["data"] for e in p.output()["events"]]
                time.sleep(0.05)
            self.assertEqual(first, ["first\n"])
            p.send_stdin("go\n", eof=True)
            while p.info()["state"] == "running" and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual([e["data"] for e in p.output()["events"]], ["second\n"])
            self.assertEqual(
                [e["data"] for e in p.output(after=0)["events"]],
                ["first\n", "second\n"],
            )

        return self.in_thread(body)


class SystemTests(ClientCase):
    """``sandbox.system``, ``sandbox.env``, capabilities and ``check``."""

    def test_system_and_env(self) -> Any:
        """System facts, ports, packages; env set then get (secrets hidden)."""

        def body() -> None:
            sb = self.sandbox()
            self.assertTrue(sb.health())
            self.assertGreater(sb.system.info()["cpu_count"], 0)
            self.assertIn("memory_percent", sb.system.metrics())
            self.assertIsInstance(sb.system.ports(), list)
            # The daemon's own port listens; a closed one does not, in time.
            self.assertTrue(sb.system.wait_for_port(self.daemon.port, timeout=5))
            self.assertFalse(sb.system.wait_for_port(1, timeout=0.3))
            self.assertIsInstance(sb.system.packages("pip"), list)
            self.assertEqual(
                sb.env.set(CLIENT_TEST_VAR="1", OTHER_VAR="2"),
                ["CLIENT_TEST_VAR", "OTHER_VAR"],
            )
            self.assertEqual(sb.env.get("CLIENT_TEST_VAR"), {"CLIENT_TEST_VAR": "1"})
            self.assertEqual(
                sb.commands.run(["sh", "-c", "echo $CLIENT_TEST_VAR"]).stdout, "1\n"
            )
            os.environ.pop("CLIENT_TEST_VAR", None)
            os.environ.pop("OTHER_VAR", None)

        return self.in_thread(body)

    def test_capabilities_and_check(self) -> Any:
        """``capabilities`` names the caller; ``check`` decides without acting."""

        def body() -> None:
            sb = self.sandbox()
            caps = sb.capabilities()
            self.assertEqual(caps["identity"]["id"], "legacy")
            self.assertTrue(caps["endpoints"]["shell"]["allowed"])
            self.assertFalse(caps["endpoints"]["code_run"]["enabled"])
            decision = sb.check("files_read_raw", "/etc/passwd")
            self.assertFalse(decision["allowed"])
            self.assertEqual(decision["code"], "path_not_allowed")
            self.assertTrue(sb.check("files_read_raw", "inside.txt")["allowed"])
            self.assertEqual(sb.openapi()["openapi"][:3], "3.1")

        return self.in_thread(body)


class TemplateCommandsTests(ClientCase):
    """Template commands through ``commands.custom``/``commands.call``."""

    autostart = False

    @inlineCallbacks
    def test_custom(self) -> Any:
        """A registered command is listed and runs with keyword arguments."""
        from sandboxd.commands import CommandRegistry

        registry = CommandRegistry()

        @registry.command(name="add", description="Add two numbers.")
        def add(a: int, b: int = 1) -> int:
            return a + b

        yield self.start(registry=registry)

        def body() -> None:
            sb = self.sandbox()
            self.assertEqual([c["name"] for c in sb.commands.custom()], ["add"])
            self.assertEqual(sb.commands.call("add", a=2, b="3"), 5)

        yield self.in_thread(body)

    @inlineCallbacks
    def test_call_waits_for_the_command(self) -> Any:
        """
        ``commands.call`` waits for the daemon's limit for commands plus a
        margin, not the client's own ``timeout`` (was: a command running
        longer than it raised ``RequestTimeout`` while the daemon allowed
        it, and ran on); ``timeout=`` is the call's own wait, never sent
        as an argument, and a command's argument called ``timeout`` goes
        in ``args``.
        """
        from sandboxd.commands import CommandRegistry

        registry = CommandRegistry()

        @registry.command(name="nap")
        def nap(seconds: float = 0.0, timeout: int = 0) -> list[float]:
            time.sleep(seconds)
            return [seconds, timeout]

        yield self.start(
            registry=registry,
            policy={"endpoints": {"run_command": {"limits": {"timeout_seconds": 30}}}},
        )

        def body() -> None:
            sb = self.sandbox(timeout=0.5)
            self.assertEqual(sb.commands.call("nap", seconds=1.5), [1.5, 0])
            self.assertEqual(
                sb.commands.call("nap", {"timeout": 7}, timeout=5), [0.0, 7]
            )
            with self.assertRaises(RequestTimeout):
                sb.commands.call("nap", seconds=2, timeout=0.5)

        yield self.in_thread(body)


class PtyTests(ClientCase):
    """
    ``sandbox.pty`` and :class:`~sandboxd.client.Terminal`.  The sessions
    run ``sh``: an interactive bash reads the user's rc files, which can
    take seconds on a loaded machine.
    """

    def test_terminal(self) -> Any:
        """
        A created terminal runs a shell; ``send`` types, ``resize`` changes
        the window, and ``reconnect`` replays only what followed the
        offset already seen; ``close`` ends the session.
        """

        def body() -> None:
            sb = self.sandbox()
            with sb.pty.open(cols=100, rows=30, shell="sh") as term:
                term.send("stty size\n")
                term.expect("30 100")
                term.resize(120, 40)
                term.send("stty size\n")
                term.expect("40 120")
                seen = term.offset
                self.assertIsNotNone(seen)
                term.reconnect()
                term.send("echo $((6*7))\n")
                again = term.expect("42")
                self.assertNotIn("40 120", again)
                self.assertEqual(sb.pty.get(term.session_id)["cols"], 120)
                self.assertEqual([s["id"] for s in sb.pty.list()], [term.session_id])
                sb.pty.resize(term.session_id, 90, 20)
                term.send("exit 3\n")
                while term.recv(timeout=10) is not None:
                    pass
                self.assertEqual(term.exit_code, 3)

        return self.in_thread(body)

    def test_open_ends_its_session(self) -> Any:
        """
        Eleven rounds of ``with sb.pty.open()`` stay under the 10-session
        cap (the block ends the session); ``keep=True`` only detaches; a
        listed or fetched session carries ``session_id`` as create does.
        """

        def body() -> None:
            sb = self.sandbox()
            for n in range(11):
                with sb.pty.open(shell="sh") as term:
                    term.send(f"echo round{n}\n")
                    term.expect(f"round{n}")
            self.assertEqual(sb.pty.list(), [])
            with sb.pty.open(shell="sh", keep=True) as kept:
                pass
            [info] = sb.pty.list()
            self.assertEqual(info["session_id"], kept.session_id)
            self.assertEqual(sb.pty.get(kept.session_id)["session_id"], kept.session_id)
            sb.pty.close(kept.session_id)

        return self.in_thread(body)

    def test_expect_keeps_what_it_read(self) -> Any:
        """
        ``expect`` that times out says so with what it read (was: "no
        terminal output" although output came) and keeps that output for
        the next ``expect``; a match returns the text up to it and keeps
        the rest.
        """

        def body() -> None:
            sb = self.sandbox()
            with sb.pty.open(shell="sh") as term:
                term.send("echo hel''lo wor''ld; echo sec''ond\n")
                with self.assertRaises(RequestTimeout) as raised:
                    term.expect("never", timeout=2)
                self.assertIn("'never' not seen within 2", raised.exception.message)
                self.assertIn("hello world", raised.exception.message)
                head = term.expect("hello")
                self.assertTrue(head.endswith("hello"), head)
                self.assertIn(" world", term.expect("world"))
                self.assertIn("second", term.expect("second"))

        return self.in_thread(body)

    def test_no_deprecated_websockets_call(self) -> Any:
        """
        Opening, using and closing a terminal of the blocking client warns
        of nothing (was: websockets' DeprecationWarning that connect() must
        be used as a context manager, from a call a later release drops).
        """
        import warnings

        def body() -> list[str]:
            sb = self.sandbox()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with sb.pty.open(shell="sh") as term:
                    term.send("echo ok$((1+1))\n")
                    term.expect("ok2")
                    term.reconnect()
                    term.send("echo ok$((2+2))\n")
                    term.expect("ok4")
            return [
                str(w.message)
                for w in caught
                if issubclass(w.category, DeprecationWarning)
            ]

        d = self.in_thread(body)
        d.addCallback(self.assertEqual, [])
        return d

    def test_send_after_the_shell_ended(self) -> Any:
        """
        ``send``, ``resize`` and ``signal`` on a terminal whose shell has
        ended raise ``ConnectionFailed`` (a ``SandboxError``), not
        websockets' own ``ConnectionClosedOK``.
        """
        from sandboxd.client import ConnectionFailed, SandboxError

        def body() -> None:
            sb = self.sandbox()
            with sb.pty.open(shell="sh") as term:
                term.send("exit 3\n")
                while term.recv(timeout=10) is not None:
                    pass
                self.assertEqual(term.exit_code, 3)
                for call in (
                    lambda: term.send("x"),
                    lambda: term.resize(80, 24),
                    lambda: term.signal("SIGINT"),
                ):
                    with self.assertRaises(ConnectionFailed) as raised:
                        call()
                    self.assertIsInstance(raised.exception, SandboxError)

        return self.in_thread(body)

    def test_open_that_cannot_attach_ends_its_session(self) -> Any:
        """
        ``pty.open`` whose WebSocket cannot connect (a ``pty_url`` where
        nothing listens) raises ``ConnectionFailed`` naming that URL and
        ends the session it created: six such failures leave no session
        and do not lock the identity out of terminals (was: each left a
        running shell, the sixth open got ``TooManySessions``).
        """
        import socket

        from sandboxd.client import ConnectionFailed

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]

        def body() -> None:
            wrong = self.sandbox(pty_url=f"ws://127.0.0.1:{closed}")
            for _ in range(6):
                with self.assertRaises(ConnectionFailed) as raised:
                    wrong.pty.open(shell="sh")
                self.assertEqual(
                    raised.exception.body["ws_url"].split("/pty")[0],
                    f"ws://127.0.0.1:{closed}",
                )
            sb = self.sandbox()
            self.assertEqual(sb.pty.list(), [])
            with sb.pty.open(shell="sh") as term:
                term.send("echo ok$((1+1))\n")
                term.expect("ok2")

        return self.in_thread(body)

    def test_attach_scrollback(self) -> Any:
        """``attach`` without an offset replays the session's scrollback."""

        def body() -> None:
            sb = self.sandbox()
            created = sb.pty.create(shell="sh")
            with sb.pty.attach(created["session_id"]) as term:
                term.send("echo mark-$((40+2))\n")
                term.expect("mark-42")
            with sb.pty.attach(created["session_id"]) as term:
                term.expect("mark-42")
            sb.pty.close(created["session_id"])
            self.assertEqual(sb.pty.list(), [])

        return self.in_thread(body)

    def test_attach_where_the_daemon_says(self) -> Any:
        """
        A client that did not create a session, and is given no PTY URL,
        attaches at the session's ``ws_url`` (the test daemon's PTY port
        is not the HTTP port + 1, so a guess would miss it); an unknown
        session is NotFound before any WebSocket is opened.
        """

        def body() -> None:
            creator = self.sandbox()
            created = creator.pty.create(shell="sh")
            stranger = Sandbox(self.daemon.url, token=self.daemon.token)
            self.addCleanup(stranger.close)
            with stranger.pty.attach(created["session_id"]) as term:
                term.send("echo there-$((40+2))\n")
                term.expect("there-42")
            with self.assertRaises(NotFound):
                stranger.pty.attach("no-such-session")
            creator.pty.close(created["session_id"])

        return self.in_thread(body)

    def test_open_through_pty_url(self) -> Any:
        """
        A new terminal is dialled at ``pty_url`` when one is given, as a
        reattach is: through a port-forward whose local port is not the
        daemon's, the ``ws_url`` the daemon answers names a port nobody
        forwards.
        """
        from twisted.internet import reactor

        forward = CutProxy(self.daemon.context.pty_port, lambda index, seen: False)
        port = reactor.listenTCP(0, forward, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        url = f"ws://127.0.0.1:{port.getHost().port}"

        def body() -> None:
            sb = self.sandbox(pty_url=url)
            with sb.pty.open(shell="sh") as term:
                term.send("echo fwd-$((40+2))\n")
                term.expect("fwd-42")
            self.assertEqual(len(forward.requests), 1)
            self.assertIn(b"GET /pty?session_id=", bytes(forward.requests[0]))

        return self.in_thread(body)

    def test_async_attach_where_the_daemon_says(self) -> Any:
        """The asyncio client attaches at the session's ``ws_url`` too."""

        async def body() -> None:
            created = self.sandbox().pty.create(shell="sh")
            async with AsyncSandbox(self.daemon.url, token=self.daemon.token) as sb:
                term = await sb.pty.attach(created["session_id"])
                await term.send("echo async-$((40+2))\n")
                await term.expect("async-42")
                await term.close()
                await sb.pty.close(created["session_id"])

        return self.in_loop(body)


class ConfigTests(ClientCase):
    """Where the client takes its settings from."""

    autostart = False

    def test_environment(self) -> None:
        """``SANDBOXD_URL`` and ``SANDBOXD_TOKEN`` are the defaults."""
        saved = {k: os.environ.get(k) for k in ("SANDBOXD_URL", "SANDBOXD_TOKEN")}
        os.environ["SANDBOXD_URL"] = "http://127.0.0.1:1234/"
        os.environ["SANDBOXD_TOKEN"] = "t0k"
        try:
            sb = Sandbox()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        sb.close()
        self.assertEqual((sb.url, sb.settings.token), ("http://127.0.0.1:1234", "t0k"))
        self.assertEqual(sb.pty_base(), "ws://127.0.0.1:1235")


class OwnHttpClientTests(ClientCase):
    """``http_client=``: the caller's own httpx client carries the calls."""

    def test_url_and_token_still_decide(self) -> Any:
        """
        Given an ``httpx.Client`` with no ``base_url`` (or one elsewhere) and
        no token, the calls still go to the sandbox's URL with its token,
        through that client (its hooks see them: was ``ConnectionFailed``,
        or 401, or the other host); closing the sandbox leaves the caller's
        client open.
        """
        import httpx

        def body() -> None:
            seen: list[str] = []
            for own in (
                httpx.Client(
                    event_hooks={"request": [lambda r: seen.append(str(r.url))]}
                ),
                httpx.Client(base_url="http://127.0.0.1:9"),
            ):
                sb = self.sandbox(http_client=own)
                sb.files.write_text("a.txt", "hi")
                self.assertEqual(sb.files.read_text("a.txt"), "hi")
                with sb.pty.open(shell="sh") as term:
                    term.send("echo ok$((1+1))\n")
                    term.expect("ok2")
                sb.close()
                self.assertEqual(own.get(self.daemon.url + "/health").status_code, 200)
                own.close()
            self.assertTrue(seen)
            self.assertTrue(
                all(u.startswith(self.daemon.url + "/") for u in seen), seen
            )

        return self.in_thread(body)

    def test_async_url_and_token_still_decide(self) -> Any:
        """The same for ``AsyncSandbox(http_client=httpx.AsyncClient())``."""
        import httpx

        async def body() -> None:
            async with httpx.AsyncClient() as own:
                async with self.async_sandbox(http_client=own) as sb:
                    await sb.files.write_text("b.txt", "yo")
                    self.assertEqual(await sb.files.read_text("b.txt"), "yo")
                reply = await own.get(self.daemon.url + "/health")
                self.assertEqual(reply.status_code, 200)

        return self.in_loop(body)
