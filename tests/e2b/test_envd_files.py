"""
The file calls of the E2B door where envd has its own behaviour, seen
through the real SDK (and a plain HTTP client where the SDK cannot send
what is tested): what E2B code ported unchanged meets.
"""

from __future__ import annotations

import os
import time
from io import BytesIO
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.web.client import Agent, FileBodyProducer, readBody
from twisted.web.http_headers import Headers

from sandboxd.policy.defaults import E2B_MAX_UPLOAD_FILES
from tests.e2b.sdk import E2BCase, caught


class UploadRefusalTests(E2BCase):
    """A refused upload big enough to be spooled to disk keeps its answer."""

    @inlineCallbacks
    def test_too_many_files(self) -> Any:
        """
        ``write_files`` of more files than an upload takes is 413 with the
        bound named (not 500), and writes nothing.
        """
        from e2b.sandbox.filesystem.filesystem import WriteEntry

        count = E2B_MAX_UPLOAD_FILES + 1

        def job() -> Any:
            entries = [
                WriteEntry(path=f"up/f{i}.txt", data="x" * 200) for i in range(count)
            ]
            return caught(lambda: self.sandbox().files.write_files(entries))

        refused = yield self.sdk(job)
        self.assertIn(
            f"413: at most {E2B_MAX_UPLOAD_FILES} files per upload", str(refused)
        )
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "up")))

    @inlineCallbacks
    def test_malformed_big_multipart(self) -> Any:
        """A spooled multipart body whose last part never closes is 400."""
        body = b"".join(
            b'--B\r\nContent-Disposition: form-data; name="file"; '
            b'filename="up/m%d.txt"\r\n\r\n%s\r\n' % (i, b"y" * 1000)
            for i in range(300)
        )
        body += (
            b'--B\r\nContent-Disposition: form-data; name="file"; '
            b'filename="up/bad.txt"\r\n\r\nno closing delimiter'
        )
        response = yield Agent(reactor).request(
            b"POST",
            f"{self.e2b_url}/files".encode(),
            Headers({b"content-type": [b"multipart/form-data; boundary=B"]}),
            FileBodyProducer(BytesIO(body)),
        )
        answer = yield readBody(response)
        self.assertEqual(response.code, 400, answer)
        self.assertIn(b"a multipart part without its closing delimiter", answer)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "up")))


class RenameTests(E2BCase):
    """``files.rename`` is envd's ``os.Rename``: never a move into a directory."""

    @inlineCallbacks
    def test_onto_directories(self) -> Any:
        """
        A directory replaces an empty directory (its files are then there);
        a non-empty directory, or a file onto a directory, is refused and
        nothing moves.
        """
        base = self.base_dir
        for d in ("src/in", "empty", "full", "other"):
            os.makedirs(os.path.join(base, d))
        for f in ("src/in/x.txt", "full/y.txt", "a.txt"):
            with open(os.path.join(base, f), "w") as out:
                out.write(f)

        def job() -> Any:
            files = self.sandbox().files
            return (
                files.rename("src", "empty"),
                caught(lambda: files.rename("empty", "full")),
                caught(lambda: files.rename("a.txt", "other")),
            )

        moved, full, onto_dir = yield self.sdk(job)
        self.assertEqual(moved.path, os.path.join(base, "empty"))
        with open(os.path.join(base, "empty/in/x.txt")) as f:
            self.assertEqual(f.read(), "src/in/x.txt")
        self.assertFalse(os.path.exists(os.path.join(base, "src")))
        self.assertIn("Directory not empty", str(full))
        self.assertEqual(os.listdir(os.path.join(base, "full")), ["y.txt"])
        self.assertIn("Is a directory", str(onto_dir))
        self.assertTrue(os.path.exists(os.path.join(base, "a.txt")))
        self.assertEqual(os.listdir(os.path.join(base, "other")), [])


class HomeTests(E2BCase):
    """A leading ``~`` is the user's home, as envd and the shell take it."""

    @inlineCallbacks
    def test_tilde_is_the_home(self) -> Any:
        """
        ``~/x`` in the file calls is the same file as ``~/x`` in a command;
        ``~name`` is refused, and a home outside the base dir is refused
        by the path policy as any outside path is.
        """
        from e2b import InvalidArgumentException
        from e2b.sandbox.filesystem.filesystem import WriteEntry

        home = os.path.join(self.base_dir, "home")
        os.makedirs(home)
        os.environ["HOME"] = home  # the daemon's, so its commands' too

        def job() -> Any:
            sbx = self.sandbox()
            files = sbx.files
            written = files.write("~/t.txt", "tilde")
            files.write_files([WriteEntry(path="~/m.txt", data="many")])
            files.make_dir("~/d")
            moved = files.rename("~/m.txt", "~/d/m.txt")
            return (
                written.path,
                moved.path,
                files.read("~/t.txt"),
                sorted(e.name for e in files.list("~")),
                sbx.commands.run("cat ~/t.txt ~/d/m.txt").stdout,
                caught(lambda: files.read("~root/t.txt")),
            )

        path, moved, text, names, shell, other = yield self.sdk(job)
        self.assertEqual(path, os.path.join(home, "t.txt"))
        self.assertEqual(moved, os.path.join(home, "d/m.txt"))
        self.assertEqual((text, names, shell), ("tilde", ["d", "t.txt"], "tildemany"))
        self.assertIsInstance(other, InvalidArgumentException)
        self.assertIn("cannot expand another user's home directory", str(other))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "~")))

        os.environ["HOME"] = os.path.realpath(self.mktemp())
        os.makedirs(os.environ["HOME"])
        refused = yield self.sdk(
            lambda: caught(lambda: self.sandbox().files.write("~/t.txt", "x"))
        )
        self.assertIn("path_not_allowed", str(refused))
        self.assertFalse(os.path.exists(os.path.join(os.environ["HOME"], "t.txt")))


class RemoveTests(E2BCase):
    """``files.remove`` is envd's ``os.RemoveAll``."""

    @inlineCallbacks
    def test_missing_path_is_removed_already(self) -> Any:
        """
        Removing what is not there (or below a missing directory) succeeds,
        as the SDK's own tests expect; a path outside is still refused.
        """

        def job() -> Any:
            files = self.sandbox().files
            return (
                files.remove("not-there"),
                files.remove("no/such/dir"),
                caught(lambda: files.remove("/etc/hostname")),
            )

        gone, below, outside = yield self.sdk(job)
        self.assertEqual((gone, below), (None, None))
        self.assertIn("path_not_allowed", str(outside))


class ListLinkTests(E2BCase):
    """``files.list`` shows a link as ``files.get_info`` (and envd) does."""

    @inlineCallbacks
    def test_links_listed_as_their_targets(self) -> Any:
        """
        A link to a file or directory lists with its target's type and
        mode and its ``symlink_target``, the same as ``get_info``; one that
        leaves the base dir is not listed.
        """
        top = os.path.join(self.base_dir, "l")
        os.makedirs(os.path.join(top, "dir"))
        with open(os.path.join(top, "f.txt"), "w"):
            pass
        os.chmod(os.path.join(top, "f.txt"), 0o640)
        os.symlink("f.txt", os.path.join(top, "link"))
        os.symlink("dir", os.path.join(top, "dirlink"))
        os.symlink("/etc", os.path.join(top, "out"))

        def job() -> Any:
            files = self.sandbox().files
            listed = {e.name: e for e in files.list("l")}
            return listed, files.get_info("l/link"), files.get_info("l/dirlink")

        listed, link_info, dirlink_info = yield self.sdk(job)
        from e2b import FileType

        for name, info, kind in (
            ("link", link_info, FileType.FILE),
            ("dirlink", dirlink_info, FileType.DIR),
        ):
            entry = listed[name]
            self.assertEqual(entry.type, kind)
            self.assertEqual(
                (entry.type, entry.mode, entry.symlink_target),
                (info.type, info.mode, info.symlink_target),
            )
        self.assertEqual(listed["link"].mode, 0o640)
        self.assertEqual(listed["link"].symlink_target, os.path.join(top, "f.txt"))
        self.assertNotIn("out", listed)  # outside: not listed at all


class WatchChmodTests(E2BCase):
    """``watch_dir`` reports attribute changes as envd does (``CHMOD``)."""

    @inlineCallbacks
    def test_chmod_and_touch(self) -> Any:
        """
        A chmod of a watched file is one ``chmod`` event, as is a touch of
        it (its times change); an overwrite through the door is no chmod.
        """
        watched = os.path.join(self.base_dir, "w")
        os.makedirs(watched)
        target = os.path.join(watched, "x.txt")
        with open(target, "w") as f:
            f.write("old")

        def events_after(handle: Any, change: Any) -> list[tuple[str, str]]:
            change()
            seen: list[Any] = []
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                seen += handle.get_new_events()
                time.sleep(0.1)
            return [(e.name, e.type.value) for e in seen]

        def job() -> Any:
            files = self.sandbox().files
            handle = files.watch_dir("w")
            chmod = events_after(handle, lambda: os.chmod(target, 0o600))
            touch = events_after(handle, lambda: os.utime(target, (1, 1)))
            write = events_after(handle, lambda: files.write("w/x.txt", "new"))
            handle.stop()
            return chmod, touch, write

        chmod, touch, write = yield self.sdk(job)
        self.assertEqual(chmod, [("x.txt", "chmod")])
        self.assertEqual(touch, [("x.txt", "chmod")])
        self.assertNotIn(("x.txt", "chmod"), write)


class WatchDeadlineTests(E2BCase):
    """A streamed ``watch_dir`` that reaches its ``timeout`` says so."""

    @inlineCallbacks
    def test_on_exit_hears_the_timeout(self) -> Any:
        """
        The async SDK's ``watch_dir(timeout=…)`` hands ``on_exit`` a
        ``TimeoutException`` at the deadline, as with envd, not None (a
        watch that was stopped).
        """
        os.makedirs(os.path.join(self.base_dir, "w"))

        def job() -> Any:
            import asyncio

            from e2b import AsyncSandbox

            async def main() -> Any:
                sbx = await AsyncSandbox.create()
                ended: list[Any] = []
                await sbx.files.watch_dir(
                    "w",
                    on_event=lambda e: None,
                    on_exit=lambda e=None: ended.append(e),
                    timeout=1,
                )
                for _ in range(100):
                    if ended:
                        break
                    await asyncio.sleep(0.05)
                return ended

            return asyncio.run(main())

        from e2b import TimeoutException

        ended = yield self.sdk(job)
        self.assertEqual(len(ended), 1, ended)
        self.assertIsInstance(ended[0], TimeoutException)
        self.assertIn("the watch's deadline passed after 1 seconds", str(ended[0]))
