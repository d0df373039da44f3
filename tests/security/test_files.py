"""
Hostile paths and archives against a real daemon (security note §3 C and D):
encoded traversal, NUL, links in listings and searches, zip-slip and
tar-slip, links already in the destination, bombs, and a full disk.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import io
import mmap
import os
import stat
import tarfile
import zipfile
from typing import Any
from urllib.parse import quote

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.access.guard import PathGuard
from sandboxd.errors import ApiError
from sandboxd.files import atomic
from tests.helpers import DaemonTestCase
from tests.routes.test_files import FilesCase, b64
from tests.test_guard import bind_mount, make_rule, sans_error, tmpfs


def tar_of(*members: tuple[str, str, Any]) -> str:
    """Members as (name, kind, payload): kind file/dir/sym/hard/fifo."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind, payload in members:
            ti = tarfile.TarInfo(name)
            if kind == "file":
                ti.size = len(payload)
                tar.addfile(ti, io.BytesIO(payload))
                continue
            ti.type = {
                "dir": tarfile.DIRTYPE,
                "sym": tarfile.SYMTYPE,
                "hard": tarfile.LNKTYPE,
                "fifo": tarfile.FIFOTYPE,
                "chr": tarfile.CHRTYPE,
            }[kind]
            if kind in ("sym", "hard"):
                ti.linkname = payload
            tar.addfile(ti)
    return base64.b64encode(buf.getvalue()).decode()


def zip_of(*members: tuple[str, bytes], links: dict[str, str] | None = None) -> str:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members:
            z.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777) << 16
            z.writestr(info, target)
    return base64.b64encode(buf.getvalue()).decode()


class OutsideCase(FilesCase):
    """A daemon, plus a directory outside its base holding ``secret``."""

    def setUp(self) -> Any:
        d = super().setUp()
        self.outside = os.path.realpath(self.mktemp())
        os.makedirs(self.outside)
        with open(os.path.join(self.outside, "secret"), "wb") as f:
            f.write(b"OUTSIDE")
        return d


class HostilePathTests(OutsideCase):
    @inlineCallbacks
    def test_encoded_traversal_and_nul(self) -> Any:
        """Traversal spelled raw or percent-encoded is 403; a NUL is 400; never 500."""
        for raw in (
            "../x",
            "%2e%2e%2fx",
            "..%2F..%2Fetc%2Fpasswd",
            "%2Fetc%2Fpasswd",
            "....//x",
            "/proc/self/environ",
        ):
            reply = yield self.request("GET", "/download?path=" + raw)
            self.assertIn(reply.status, (403, 404), raw)
            if raw != "....//x":
                self.assertEqual(reply.status, 403, raw)
        reply = yield self.request("GET", "/download?path=a%00b")
        self.assertEqual(reply.status, 400)
        reply = yield self.request(
            "POST", "/upload", {"path": "a\u0000b", "content_base64": ""}
        )
        self.assertEqual(reply.status, 400)

    @inlineCallbacks
    def test_outside_refusal_identical(self) -> Any:
        """The refusal for an outside path is the same body whether the target exists or not."""
        a = yield self.get("/download", os.path.join(self.outside, "secret"))
        b = yield self.get("/download", os.path.join(self.outside, "nothing"))
        self.assertEqual(a.status, 403)
        self.assertEqual(
            {k: v for k, v in a.json().items() if k != "error"},
            {k: v for k, v in b.json().items() if k != "error"},
        )
        os.symlink(
            os.path.join(self.outside, "secret"), os.path.join(self.base_dir, "l1")
        )
        os.symlink(
            os.path.join(self.outside, "nothing"), os.path.join(self.base_dir, "l2")
        )
        a = yield self.get("/files/raw", "l1")
        b = yield self.get("/files/raw", "l2")
        self.assertEqual((a.status, b.status), (403, 403))
        self.assertEqual(a.json()["code"], b.json()["code"])

    @inlineCallbacks
    def test_links_out_skipped_in_list_and_search(self) -> Any:
        """Listing and search skip links leading out and never descend through them."""
        self.put("in.txt")
        os.symlink(self.outside, os.path.join(self.base_dir, "outdir"))
        os.symlink("in.txt", os.path.join(self.base_dir, "inlink"))
        os.symlink(self.base_dir, os.path.join(self.base_dir, "loop"))
        reply = yield self.request("GET", "/files/list?depth=3")
        names = sorted(e["name"] for e in reply.json()["entries"])
        self.assertEqual(names, ["in.txt", "inlink", "loop"])
        reply = yield self.request("POST", "/files/search", {"pattern": "*"})
        found = sorted(r["name"] for r in reply.json()["results"])
        self.assertEqual(found, ["in.txt", "inlink", "loop"])
        reply = yield self.request("POST", "/files/search", {"pattern": "secret"})
        self.assertEqual(reply.json()["results"], [])

    @inlineCallbacks
    def test_write_through_link_refused(self) -> Any:
        """Uploads to a link out, or a dangling link, are refused and leave the outside untouched."""
        os.symlink(
            os.path.join(self.outside, "secret"), os.path.join(self.base_dir, "out")
        )
        os.symlink("missing-target", os.path.join(self.base_dir, "dangle"))
        for path in ("out", "dangle", "out/x"):
            reply = yield self.request(
                "POST", "/upload", {"path": path, "content_base64": b64(b"pwn")}
            )
            self.assertEqual(reply.status, 403, path)
            reply = yield self.request(
                "POST", "/files/raw?path=" + quote(path), raw_body=b"pwn"
            )
            self.assertEqual(reply.status, 403, path)
        with open(os.path.join(self.outside, "secret"), "rb") as f:
            self.assertEqual(f.read(), b"OUTSIDE")
        self.assertFalse(os.path.lexists(os.path.join(self.base_dir, "missing-target")))


class ReadOnlyTests(FilesCase):
    preset = "read-only"

    @inlineCallbacks
    def test_read_only_preset(self) -> Any:
        """Under read-only nothing on disk changes; reads still work."""
        self.put("r.txt", b"keep")
        reply = yield self.get("/download", "r.txt")
        self.assertEqual(reply.status, 200)
        for method, route, body in (
            ("POST", "/upload", {"path": "r.txt", "content_base64": b64(b"x")}),
            ("POST", "/files/mkdir", {"path": "newdir"}),
            ("DELETE", "/files?path=r.txt", None),
        ):
            reply = yield self.request(method, route, body)
            self.assertIn(reply.status, (403, 404), route)
        self.assertEqual(self.read("r.txt"), b"keep")
        self.assertEqual(os.listdir(self.base_dir), ["r.txt"])


class ArchiveTests(FilesCase):
    @inlineCallbacks
    def test_archive_round_trip(self) -> Any:
        """tar.gz and zip archives hold members relative to the base; extract restores them."""
        self.put("proj/a.txt", b"A")
        self.put("proj/sub/b.txt", b"B")
        os.symlink("a.txt", os.path.join(self.base_dir, "proj/lnk"))
        for fmt in ("tar.gz", "zip"):
            reply = yield self.request(
                "POST", "/files/archive", {"paths": ["proj"], "format": fmt}
            )
            self.assertEqual(reply.status, 200, reply.body)
            body = reply.json()
            self.assertEqual(body["format"], fmt)
            data = base64.b64decode(body["content_base64"])
            self.assertEqual(body["bytes"], len(data))
            if fmt == "zip":
                names = zipfile.ZipFile(io.BytesIO(data)).namelist()
            else:
                names = tarfile.open(fileobj=io.BytesIO(data)).getnames()
            self.assertIn("proj/sub/b.txt", names)
            self.assertIn("proj/lnk", names)
            reply = yield self.request(
                "POST",
                "/files/extract",
                {
                    "content_base64": body["content_base64"],
                    "format": fmt,
                    "destination": f"out-{fmt}",
                },
            )
            self.assertEqual(reply.status, 200, reply.body)
            self.assertEqual(reply.json()["files"], 2)
            self.assertEqual(self.read(f"out-{fmt}/proj/sub/b.txt"), b"B")
            self.assertEqual(
                os.readlink(os.path.join(self.base_dir, f"out-{fmt}/proj/lnk")), "a.txt"
            )

    @inlineCallbacks
    def test_backslash_names_round_trip(self) -> Any:
        """
        What files_archive packs, files_extract takes: a name holding a
        backslash (legal on Linux) comes back in tar.gz and zip; a zip made
        on Windows, where a backslash may be a separator, is still refused.
        """
        name = "dev-disk-by\\x2duuid.mount"
        self.put(f"bs/{name}", b"unit")
        for fmt in ("tar.gz", "zip"):
            reply = yield self.request(
                "POST", "/files/archive", {"paths": ["bs"], "format": fmt}
            )
            reply = yield self.request(
                "POST",
                "/files/extract",
                {
                    "content_base64": reply.json()["content_base64"],
                    "format": fmt,
                    "destination": f"out-{fmt}",
                },
            )
            self.assertEqual(reply.status, 200, reply.body)
            self.assertEqual(self.read(f"out-{fmt}/bs/{name}"), b"unit")
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            info = zipfile.ZipInfo("dir\\f.txt")
            info.create_system = 0
            z.writestr(info, b"x")
        yield self.assertRefused(base64.b64encode(buf.getvalue()).decode(), "zip")

    @inlineCallbacks
    def test_archive_errors(self) -> Any:
        """Unknown format 400, missing path 404, path outside 403."""
        reply = yield self.request(
            "POST", "/files/archive", {"paths": ["x"], "format": "rar"}
        )
        self.assertEqual(reply.status, 400)
        reply = yield self.request("POST", "/files/archive", {"paths": ["nope"]})
        self.assertEqual(reply.status, 404)
        reply = yield self.request("POST", "/files/archive", {"paths": ["/etc"]})
        self.assertEqual(reply.status, 403)

    @inlineCallbacks
    def assertRefused(
        self, content: str, fmt: str = "tar.gz", status: int = 403
    ) -> Any:
        reply = yield self.request(
            "POST",
            "/files/extract",
            {"content_base64": content, "format": fmt, "destination": "dst"},
        )
        self.assertEqual(reply.status, status, reply.body)
        found = (
            os.listdir(os.path.join(self.base_dir, "dst"))
            if os.path.isdir(os.path.join(self.base_dir, "dst"))
            else []
        )
        self.assertEqual([n for n in found if n != "ok"], [], "nothing written")
        return reply

    @inlineCallbacks
    def test_tar_slip(self) -> Any:
        """Absolute names, '..', link members pointing out, links then files through them, hard links, devices: 403, nothing written."""
        good = ("good.txt", "file", b"g")
        cases = [
            tar_of(good, ("../evil.txt", "file", b"x")),
            tar_of(good, ("/abs.txt", "file", b"x")),
            tar_of(good, ("a/../../evil.txt", "file", b"x")),
            tar_of(good, ("lnk", "sym", "/etc")),
            tar_of(good, ("lnk", "sym", "../../outside")),
            tar_of(good, ("lnk", "sym", "sub"), ("lnk/x.txt", "file", b"x")),
            tar_of(good, ("h", "hard", "/etc/passwd")),
            tar_of(good, ("dev", "chr", "")),
            tar_of(good, ("f", "fifo", "")),
            tar_of(good, ("a\\..\\..\\x", "file", b"x")),
        ]
        for content in cases:
            yield self.assertRefused(content)

    @inlineCallbacks
    def test_hard_link_to_an_earlier_member(self) -> Any:
        """
        A tree with hard links, as GNU tar packs it (the second name a hard
        link to the first member), extracts with the second name a copy of
        the first's bytes and mode; a hard link to a member that is not an
        earlier file of the archive (a later one, a directory, a missing
        name, '..') is 403 with nothing written.
        """
        outside = os.path.realpath(self.mktemp())
        os.makedirs(os.path.join(outside, "proj"))
        with open(os.path.join(outside, "proj", "a"), "wb") as f:
            f.write(b"hi\n")
        os.chmod(os.path.join(outside, "proj", "a"), 0o750)
        os.link(os.path.join(outside, "proj", "a"), os.path.join(outside, "proj", "b"))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(os.path.join(outside, "proj"), arcname="proj")
        reply = yield self.request(
            "POST",
            "/files/extract",
            {
                "content_base64": base64.b64encode(buf.getvalue()).decode(),
                "destination": "out",
            },
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["files"], 2)
        for name in ("a", "b"):
            path = os.path.join(self.base_dir, "out", "proj", name)
            self.assertEqual(self.read(f"out/proj/{name}"), b"hi\n")
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o750)
        good = ("good.txt", "file", b"g")
        for members in (
            [("early", "hard", "good.txt"), good],
            [good, ("d", "dir", None), ("h", "hard", "d")],
            [good, ("h", "hard", "missing.txt")],
            [good, ("h", "hard", "../good.txt")],
        ):
            yield self.assertRefused(tar_of(*members))

    @inlineCallbacks
    def test_zip_slip(self) -> Any:
        """zip names with '..', absolute, drive letters, and link members pointing out: 403, nothing written."""
        for content in (
            zip_of(("good", b"g"), ("../../x", b"x")),
            zip_of(("good", b"g"), ("/abs", b"x")),
            zip_of(("good", b"g"), ("C:\\win.txt", b"x")),
            zip_of(("good", b"g"), links={"l": "/etc"}),
        ):
            yield self.assertRefused(content, "zip")

    @inlineCallbacks
    def test_link_already_in_destination(self) -> Any:
        """A link already in the destination is not written through (zipfile.extract would)."""
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        os.makedirs(os.path.join(self.base_dir, "dst"))
        os.symlink(outside, os.path.join(self.base_dir, "dst", "ok"))
        reply = yield self.request(
            "POST",
            "/files/extract",
            {
                "content_base64": zip_of(("ok/pwned.txt", b"x")),
                "format": "zip",
                "destination": "dst",
            },
        )
        self.assertEqual(reply.status, 403)
        self.assertEqual(os.listdir(outside), [])

    @inlineCallbacks
    def test_overwrite_and_bomb(self) -> Any:
        """Existing files need overwrite (409 otherwise); members over the size cap are 413."""
        self.put("dst/f.txt", b"old")
        reply = yield self.request(
            "POST",
            "/files/extract",
            {"content_base64": tar_of(("f.txt", "file", b"new")), "destination": "dst"},
        )
        self.assertEqual(reply.status, 409)
        self.assertEqual(self.read("dst/f.txt"), b"old")
        reply = yield self.request(
            "POST",
            "/files/extract",
            {
                "content_base64": tar_of(("f.txt", "file", b"new")),
                "destination": "dst",
                "overwrite": True,
            },
        )
        self.assertEqual(reply.status, 200)
        self.assertEqual(self.read("dst/f.txt"), b"new")


#: The guard's own resolution, for the tests that run code right after it.
_LOCATE = PathGuard.locate


class ArchiveRaceTests(OutsideCase):
    """
    A directory asked for in ``/files/archive``, removed or swapped for a
    link to outside once the guard resolved it (what a process racing the
    call does): the call answers as files_list does, 404 for what is gone
    and 403 for a link out, never a 500, and nothing from outside.
    """

    def swap_after(self, calls: int, swap: Any) -> None:
        """Run ``swap`` right after the guard resolves ``race`` for the ``calls``-th time."""
        real = _LOCATE
        seen = []

        def locate(guard: PathGuard, path: Any, *args: Any, **kwargs: Any) -> Any:
            loc = real(guard, path, *args, **kwargs)
            if path == "race":
                seen.append(path)
                if len(seen) == calls:
                    swap()
            return loc

        self.patch(PathGuard, "locate", locate)

    def to_outside(self) -> None:
        race = os.path.join(self.base_dir, "race")
        os.rename(race, race + ".old")
        os.symlink(self.outside, race)

    def removed(self) -> None:
        race = os.path.join(self.base_dir, "race")
        os.rename(race, race + ".old")

    @inlineCallbacks
    def test_swapped_or_gone(self) -> Any:
        """
        Swapped before the count (the call's second resolution) or before
        the packing (its third): 403 ``path_not_allowed``; removed: 404.
        """
        for calls, swap, answer in (
            (2, self.to_outside, (403, "path_not_allowed")),
            (3, self.to_outside, (403, "path_not_allowed")),
            (2, self.removed, (404, "not_found")),
        ):
            race = os.path.join(self.base_dir, "race")
            for left in (race, race + ".old"):
                if os.path.islink(left):
                    os.unlink(left)
                elif os.path.isdir(left):
                    os.rename(left, self.mktemp())
            self.put("race/inside.txt", b"inside")
            self.swap_after(calls, swap)
            reply = yield self.request("POST", "/files/archive", {"paths": ["race"]})
            self.assertEqual(
                (reply.status, reply.json()["code"]), answer, (calls, reply.body)
            )
            self.assertNotIn(b"OUTSIDE", reply.body)
        # Untouched, the same directory packs as ever.
        self.patch(PathGuard, "locate", _LOCATE)
        self.put("race.old/again.txt", b"again")
        reply = yield self.request("POST", "/files/archive", {"paths": ["race.old"]})
        self.assertEqual(reply.status, 200, reply.body)


class ChangedMeanwhileTests(FilesCase):
    """
    A file rewritten while it is archived, a directory that gains an entry
    while it is deleted (a dev server's log, a build's output): a clear
    refusal with its code, never a 500, and nothing half-made.
    """

    def shrink_while_packed(self, rel: str, times: int) -> list[int]:
        """
        Truncate ``rel`` after the archive stat-ed it, before it is read,
        the first ``times`` times it is packed (writing it back after each
        such try, so that the next one stats its whole size again).
        """
        from sandboxd.files import archive

        real = archive._add
        target = os.path.join(self.base_dir, rel)
        with open(target, "rb") as f:
            content = f.read()
        shrunk: list[int] = []

        def add(writer: Any, fmt: str, fd: int, path: str, *rest: Any) -> None:
            if path != target or len(shrunk) >= times:
                real(writer, fmt, fd, path, *rest)
                return
            shrunk.append(1)
            os.truncate(target, 10)
            try:
                real(writer, fmt, fd, path, *rest)
            finally:
                with open(target, "wb") as f:
                    f.write(content)

        self.patch(archive, "_add", add)
        return shrunk

    @inlineCallbacks
    def test_archive_of_a_file_that_shrinks(self) -> Any:
        """
        A file that shrank once is packed again, whole; one that shrinks
        on every try is 412 ``precondition_failed`` naming it, not a 500.
        """
        self.put("logs/app.log", b"x" * 100_000)
        self.put("logs/other.txt", b"other")
        self.shrink_while_packed("logs/app.log", 1)
        reply = yield self.request("POST", "/files/archive", {"paths": ["logs"]})
        self.assertEqual(reply.status, 200, reply.body)
        packed = tarfile.open(
            fileobj=io.BytesIO(base64.b64decode(reply.json()["content_base64"]))
        )
        member = packed.extractfile("logs/app.log")
        assert member is not None
        self.assertEqual(member.read(), b"x" * 100_000)
        self.shrink_while_packed("logs/app.log", 100)
        reply = yield self.request("POST", "/files/archive", {"paths": ["logs"]})
        self.assertEqual(
            (reply.status, reply.json()["code"]), (412, "precondition_failed")
        )
        self.assertIn("logs/app.log", reply.json()["error"])

    @inlineCallbacks
    def test_delete_of_a_directory_that_gains_an_entry(self) -> Any:
        """
        An entry made in a directory while it is deleted: 409 ``file_exists``
        saying so (the new entry stays); deleting again removes it.
        """
        import shutil

        self.put("race/sub/old.txt", b"old")
        real = shutil.rmtree
        made: list[int] = []

        def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
            dir_fd = kwargs.get("dir_fd")
            if not made and dir_fd is not None:
                made.append(1)
                real_rmdir = os.rmdir

                def rmdir(name: Any, *a: Any, **k: Any) -> None:
                    if name == path:
                        fd = os.open(path, os.O_RDONLY, dir_fd=dir_fd)
                        try:
                            with open(
                                os.open("new.txt", os.O_CREAT | os.O_WRONLY, dir_fd=fd),
                                "w",
                            ):
                                pass
                        finally:
                            os.close(fd)
                    real_rmdir(name, *a, **k)

                self.patch(os, "rmdir", rmdir)
                try:
                    real(path, *args, **kwargs)
                finally:
                    self.patch(os, "rmdir", real_rmdir)
                return
            real(path, *args, **kwargs)

        self.patch(shutil, "rmtree", rmtree)
        reply = yield self.request("DELETE", "/files?path=race/sub")
        self.assertEqual((reply.status, reply.json()["code"]), (409, "file_exists"))
        self.assertIn("delete it again", reply.json()["error"])
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "race/sub/new.txt")))
        again = yield self.request("DELETE", "/files?path=race/sub")
        self.assertEqual(again.status, 200, again.body)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "race/sub")))


class BombTests(FilesCase):
    policy = {
        "endpoints": {
            "files_extract": {"limits": {"max_bytes": 10000, "max_entries": 3}}
        }
    }

    @inlineCallbacks
    def test_bomb_and_count(self) -> Any:
        """A highly compressible member past max_bytes, or too many members, is 413 with nothing written."""
        bomb = tar_of(("zeros", "file", b"\0" * 50000))
        self.assertLess(len(bomb), 10000)
        reply = yield self.request(
            "POST", "/files/extract", {"content_base64": bomb, "destination": "d"}
        )
        self.assertEqual(reply.status, 413)
        many = tar_of(*[(f"f{i}", "file", b"x") for i in range(4)])
        reply = yield self.request(
            "POST", "/files/extract", {"content_base64": many, "destination": "d"}
        )
        self.assertEqual(reply.status, 413)
        self.assertEqual(os.listdir(self.base_dir), [])


class DiskFullTests(SynchronousTestCase):
    def test_enospc_is_507_and_leaves_nothing(self) -> None:
        """ENOSPC while writing is 507 insufficient_storage; the old file and directory are as before."""
        base = os.path.realpath(self.mktemp())
        os.makedirs(base)
        with open(os.path.join(base, "f"), "wb") as f:
            f.write(b"old")
        guard = PathGuard(make_rule(base))
        writer = atomic.AtomicWrite(guard.locate("f", "write", follow=True))
        real_write = os.write

        def full(fd: int, data: Any) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        self.patch(atomic.os, "write", full)
        with self.assertRaises(ApiError) as cm:
            writer.write(b"new content")
        self.patch(atomic.os, "write", real_write)
        self.assertEqual(
            (cm.exception.status, cm.exception.code), (507, "insufficient_storage")
        )
        self.assertEqual(os.listdir(base), ["f"])
        with open(os.path.join(base, "f"), "rb") as f:
            self.assertEqual(f.read(), b"old")

    def test_enospc_lets_go_of_a_mapped_body(self) -> None:
        """
        After a 507 part-way through, nothing of the write still holds a
        view of the data: a body mapped from the request's spool file (the
        E2B door's uploads) can be unmapped while the error is raised, so
        the client gets the 507 rather than a 500 from the unmapping.
        """
        base = os.path.realpath(self.mktemp())
        os.makedirs(base)
        spool = os.path.join(base, "spool")
        with open(spool, "wb") as f:
            f.write(b"x" * 100_000)
        guard = PathGuard(make_rule(base))
        writer = atomic.AtomicWrite(guard.locate("f", "write", follow=True))
        real_write = os.write
        room = [4096]

        def filling(fd: int, data: Any) -> int:
            if room[0] <= 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            room[0] -= 4096
            return int(real_write(fd, bytes(data[:4096])))

        self.patch(atomic.os, "write", filling)
        with open(spool, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        body = memoryview(mapped)
        try:
            writer.write(body)
        except ApiError as e:
            self.assertEqual((e.status, e.code), (507, "insufficient_storage"))
            body.release()  # as the door lets go of its own view
            mapped.close()  # BufferError while a view of it lived on
        else:
            self.fail("no 507")
        self.assertEqual(os.listdir(base), ["spool"])


class ProtectedInsideTreeTests(DaemonTestCase):
    """A recursive delete cannot remove what the policy protects inside the tree."""

    policy = {"endpoints": {"files_*": {"paths": {"deny": ["**/.git/**"]}}}}

    @inlineCallbacks
    def test_delete_tree_holding_denied_files(self) -> Any:
        """Deleting a repository directory is path_denied and removes nothing."""
        repo = os.path.join(self.base_dir, "repo")
        os.makedirs(os.path.join(repo, ".git"))
        with open(os.path.join(repo, ".git", "config"), "w") as f:
            f.write("x")
        with open(os.path.join(repo, "a.txt"), "w") as f:
            f.write("a")
        reply = yield self.request("DELETE", "/files?path=repo")
        self.assertEqual((reply.status, reply.json()["code"]), (403, "path_denied"))
        self.assertNotIn(".git", reply.json()["error"])
        # The tree itself is not denied: what it holds is.
        self.assertEqual(
            reply.json()["error"],
            f"{repo} holds a path the policy denies, so the tree is left as it is",
        )
        self.assertTrue(os.path.exists(os.path.join(repo, "a.txt")))
        self.assertTrue(os.path.exists(os.path.join(repo, ".git", "config")))
        os.makedirs(os.path.join(self.base_dir, "plain", "sub"))
        reply = yield self.request("DELETE", "/files?path=plain")
        self.assertEqual(reply.status, 200)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "plain")))

    @inlineCallbacks
    def test_move_tree_holding_denied_files(self) -> Any:
        """Moving a tree out from under a path-specific deny is refused, nothing moved."""
        yield self.daemon.stop()
        yield self.start(
            policy={"endpoints": {"files_*": {"paths": {"deny": ["a/secrets/**"]}}}}
        )
        os.makedirs(os.path.join(self.base_dir, "a", "secrets"))
        with open(os.path.join(self.base_dir, "a", "secrets", "key"), "w") as f:
            f.write("k")
        reply = yield self.request(
            "POST", "/files/move", {"source": "a", "destination": "b"}
        )
        self.assertEqual((reply.status, reply.json()["code"]), (403, "path_denied"))
        self.assertTrue(reply.json()["error"].startswith("source:"))
        self.assertTrue(
            os.path.exists(os.path.join(self.base_dir, "a", "secrets", "key"))
        )
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "b")))


class DeviceFileTests(FilesCase):
    """Device files inside the base are never replaced, removed or moved (C11)."""

    @inlineCallbacks
    def test_device_file_left_alone(self) -> Any:
        """
        Upload over, raw write over, delete, move away and move onto a
        character device are 403 guard:device-files; the node stays.
        """
        node = os.path.join(self.base_dir, "null")
        try:
            os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            raise SkipTest("mknod needs CAP_MKNOD (root)") from None
        self.put("plain.txt")
        attempts = (
            ("POST", "/upload", {"path": "null", "content_base64": b64(b"x")}),
            ("DELETE", "/files?path=null", None),
            ("POST", "/files/move", {"source": "null", "destination": "moved"}),
            (
                "POST",
                "/files/move",
                {"source": "plain.txt", "destination": "null", "overwrite": True},
            ),
        )
        for method, route, body in attempts:
            reply = yield self.request(method, route, body)
            self.assertEqual(
                (reply.status, reply.json().get("rule")),
                (403, "guard:device-files"),
                route,
            )
        reply = yield self.request(
            "POST", "/files/raw?path=null&overwrite=true", raw_body=b"x"
        )
        self.assertEqual(
            (reply.status, reply.json().get("rule")), (403, "guard:device-files")
        )
        self.assertTrue(stat.S_ISCHR(os.lstat(node).st_mode))
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "plain.txt")))


class SpecialMountTests(FilesCase):
    """/proc mounted inside the base dir, against a real daemon (C12)."""

    @inlineCallbacks
    def test_proc_bind_mount_refused_like_proc(self) -> Any:
        """
        Every route refuses a bind mount of /proc inside the base exactly as
        it refuses /proc (403 path_not_allowed, guard:system-paths), for
        existing and missing names; listings and searches do not show it.
        """
        self.put("keep.txt")
        p = os.path.join(self.base_dir, "p")
        os.mkdir(p)
        bind_mount(self, "/proc", p)
        expected = yield self.get("/download", "/proc/self/environ")
        self.assertEqual(expected.status, 403)
        self.assertEqual(expected.json()["rule"], "guard:system-paths")
        for route, path in (
            ("/download", "p/self/environ"),
            ("/download", "p/self/nosuch"),
            ("/download", "p/nosuch/deeper"),
            ("/files/raw", "p/self/status"),
            ("/files/stat", "p"),
            ("/files/stat", "p/nosuch"),
            ("/files/list", "p"),
        ):
            reply = yield self.get(route, path)
            self.assertEqual(
                (reply.status, sans_error(reply.json())),
                (403, sans_error(expected.json())),
                (route, path),
            )
        for method, route, body in (
            ("DELETE", "/files?path=p", None),
            ("POST", "/upload", {"path": "p/x", "content_base64": b64(b"x")}),
            ("POST", "/files/move", {"source": "p", "destination": "q"}),
            ("POST", "/files/mkdir", {"path": "p/new"}),
        ):
            reply = yield self.request(method, route, body)
            self.assertEqual(
                (reply.status, reply.json()["code"]), (403, "path_not_allowed"), route
            )
        reply = yield self.request("GET", "/files/list?depth=3")
        names = sorted(e["name"] for e in reply.json()["entries"])
        self.assertEqual(names, ["keep.txt"])
        reply = yield self.request("POST", "/files/search", {"pattern": "environ"})
        self.assertEqual(reply.json()["results"], [])
        self.assertTrue(os.path.isdir(os.path.join(p, "self")), "mount untouched")

    @inlineCallbacks
    def test_delete_stops_at_a_mount_point(self) -> Any:
        """
        Deleting a directory that holds a bind mount (of a directory of the
        same file system, so st_dev alone cannot tell) is refused before
        anything is removed: the mounted files and the tree stay.
        """
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        with open(os.path.join(outside, "precious.txt"), "wb") as f:
            f.write(b"keep me")
        sub = os.path.join(self.base_dir, "tree", "sub")
        os.makedirs(sub)
        self.put("tree/own.txt")
        bind_mount(self, outside, sub)
        reply = yield self.request("DELETE", "/files?path=tree")
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "path_not_allowed")
        )
        self.assertIn("mount point", reply.json()["error"])
        with open(os.path.join(outside, "precious.txt"), "rb") as f:
            self.assertEqual(f.read(), b"keep me")
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "tree", "own.txt")))

    def mounted_volume(self) -> tuple[str, str]:
        """A directory outside with a file in it, bind-mounted at ``vol``."""
        outside = os.path.realpath(self.mktemp())
        os.makedirs(os.path.join(outside, "deep"))
        with open(os.path.join(outside, "deep", "precious.txt"), "wb") as f:
            f.write(b"keep me")
        vol = os.path.join(self.base_dir, "vol")
        os.makedirs(vol)
        bind_mount(self, outside, vol)
        return outside, vol

    def assert_refused_mounted(self, reply: Any, words: str) -> None:
        self.assertEqual(
            (reply.status, reply.json()["code"], reply.json()["rule"]),
            (403, "path_not_allowed", "guard:mount-point"),
        )
        self.assertIn(words, reply.json()["error"])
        self.assertIn("it is a mount point", reply.json()["error"])

    @inlineCallbacks
    def test_a_mount_point_is_not_emptied(self) -> Any:
        """
        Deleting the mount point itself (a volume mounted in the sandbox) is
        refused before anything is removed: the kernel would refuse only the
        last step, after every file on the volume was gone.
        """
        outside, _vol = self.mounted_volume()
        reply = yield self.request("DELETE", "/files?path=vol")
        self.assert_refused_mounted(reply, "refusing to delete vol")
        with open(os.path.join(outside, "deep", "precious.txt"), "rb") as f:
            self.assertEqual(f.read(), b"keep me")
        # Inside the volume, files are files.
        reply = yield self.request("DELETE", "/files?path=vol/deep")
        self.assertEqual(reply.status, 200)
        self.assertEqual(os.listdir(outside), [])

    @inlineCallbacks
    def test_a_mount_point_is_not_moved_or_replaced(self) -> Any:
        """
        A mounted directory or file cannot be renamed or replaced: a clear
        403 naming the side, not a 500, and both names stay as they were.
        """
        outside, vol = self.mounted_volume()
        reply = yield self.request(
            "POST", "/files/move", {"source": "vol", "destination": "moved"}
        )
        self.assert_refused_mounted(reply, "source: refusing to move vol")
        self.assertTrue(os.path.exists(os.path.join(vol, "deep", "precious.txt")))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "moved")))

        settings = os.path.join(self.base_dir, "settings.conf")
        with open(settings, "wb"):
            pass
        mounted_file = os.path.join(outside, "settings.conf")
        with open(mounted_file, "wb") as f:
            f.write(b"mounted")
        bind_mount(self, mounted_file, settings)
        self.put("mine.txt")
        reply = yield self.request(
            "POST",
            "/files/move",
            {"source": "mine.txt", "destination": "settings.conf", "overwrite": True},
        )
        self.assert_refused_mounted(
            reply, "destination: refusing to replace settings.conf"
        )
        reply = yield self.request("DELETE", "/files?path=settings.conf")
        self.assert_refused_mounted(reply, "refusing to delete settings.conf")
        with open(settings, "rb") as f:
            self.assertEqual(f.read(), b"mounted")
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "mine.txt")))

    @inlineCallbacks
    def test_files_of_an_overlay_are_not_mount_points(self) -> Any:
        """
        On an overlay whose layers are on two file systems (a container's
        root may be one) a file reports its layer's device, not the
        directory's: it is still deleted, moved and replaced as any file.
        """
        top = os.path.realpath(self.mktemp())
        lower, upper, work = (os.path.join(top, n) for n in ("lower", "upper", "work"))
        for d in (lower, upper, work):
            os.makedirs(d)
        merged = os.path.join(self.base_dir, "root")
        os.makedirs(merged)
        tmpfs(self, lower, "1m")
        for name in ("a.txt", "b.txt", "c.txt"):
            with open(os.path.join(lower, name), "wb") as f:
                f.write(name.encode())
        options = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(b"overlay", merged.encode(), b"overlay", 0, options) != 0:
            raise SkipTest(
                f"cannot mount an overlay here ({os.strerror(ctypes.get_errno())})"
            )
        self.addCleanup(libc.umount2, merged.encode(), 2)
        if os.stat(os.path.join(merged, "a.txt")).st_dev == os.stat(merged).st_dev:
            raise SkipTest("this overlay gives its files the directory's device")

        reply = yield self.request("DELETE", "/files?path=root/a.txt")
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request(
            "POST",
            "/files/move",
            {"source": "root/b.txt", "destination": "root/b2.txt"},
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request(
            "POST",
            "/files/move",
            {"source": "root/b2.txt", "destination": "root/c.txt", "overwrite": True},
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(os.listdir(merged), ["c.txt"])
        with open(os.path.join(merged, "c.txt"), "rb") as f:
            self.assertEqual(f.read(), b"b.txt")

    def mounted_file(self) -> str:
        """A file outside bind-mounted at ``hosts`` (as a container's /etc/hosts is)."""
        outside = os.path.realpath(self.mktemp())
        with open(outside, "wb") as f:
            f.write(b"127.0.0.1 localhost\n" * 20)
        target = os.path.join(self.base_dir, "hosts")
        with open(target, "wb"):
            pass
        bind_mount(self, outside, target)
        return outside

    @inlineCallbacks
    def test_a_mounted_file_is_written_in_place(self) -> Any:
        """
        A bind-mounted file (a container's /etc/hosts) cannot be replaced by
        a rename, so each write route replaces its content instead: the
        mounted file holds the new bytes, shorter or longer, and no
        temporary file is left beside it.
        """
        outside = self.mounted_file()
        before = os.stat(outside)
        reply = yield self.request(
            "POST", "/files/raw?path=hosts&overwrite=true", raw_body=b"10.0.0.1 app\n"
        )
        self.assertEqual(reply.status, 200, reply.body)
        with open(outside, "rb") as f:
            self.assertEqual(f.read(), b"10.0.0.1 app\n")
        reply = yield self.get("/files/raw", "hosts")
        self.assertEqual((reply.status, reply.body), (200, b"10.0.0.1 app\n"))
        longer = b"x" * 100_000
        reply = yield self.request(
            "POST",
            "/files/upload-stream",
            {"path": "hosts", "content_base64": base64.b64encode(longer).decode()},
        )
        self.assertEqual(reply.status, 200, reply.body)
        with open(outside, "rb") as f:
            self.assertEqual(f.read(), longer)
        after = os.stat(outside)
        self.assertEqual(
            (after.st_ino, stat.S_IMODE(after.st_mode)),
            (before.st_ino, stat.S_IMODE(before.st_mode)),
        )
        self.assertEqual(sorted(os.listdir(self.base_dir)), ["hosts"])

    @inlineCallbacks
    def test_a_mounted_pipe_is_not_written(self) -> Any:
        """
        A named pipe bind-mounted over a file's name is refused (403) at
        once, not waited on for a reader, and stays a pipe.
        """
        fifo = os.path.realpath(self.mktemp())
        os.mkfifo(fifo)
        target = os.path.join(self.base_dir, "pipe")
        with open(target, "wb"):
            pass
        bind_mount(self, fifo, target)
        reply = yield self.request(
            "POST", "/files/raw?path=pipe&overwrite=true", raw_body=b"x"
        )
        self.assertEqual(
            (reply.status, reply.json()["rule"]), (403, "guard:mount-point"), reply.body
        )
        self.assertTrue(stat.S_ISFIFO(os.stat(target).st_mode))
        self.assertEqual(os.listdir(self.base_dir), ["pipe"])

    @inlineCallbacks
    def test_a_mounted_file_is_not_part_of_a_change_that_may_be_undone(self) -> Any:
        """
        An archive extracted over a bind-mounted file is refused whole (its
        content could not be put back if a later member failed), with the
        mounted file and the tree as they were.
        """
        outside = self.mounted_file()
        with open(outside, "rb") as f:
            original = f.read()
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for name, data in (("a.txt", b"a"), ("hosts", b"replaced")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        reply = yield self.request(
            "POST",
            "/files/extract",
            {
                "content_base64": base64.b64encode(buffer.getvalue()).decode(),
                "destination": ".",
                "format": "tar.gz",
                "overwrite": True,
            },
        )
        self.assertEqual(
            (reply.status, reply.json()["code"], reply.json()["rule"]),
            (403, "path_not_allowed", "guard:mount-point"),
            reply.body,
        )
        with open(outside, "rb") as f:
            self.assertEqual(f.read(), original)
        self.assertEqual(sorted(os.listdir(self.base_dir)), ["hosts"])


class HardLinkCase(FilesCase):
    """``link`` in the base and ``shared`` outside it name one inode (C7)."""

    def setUp(self) -> Any:
        d = super().setUp()
        self.outside = os.path.realpath(self.mktemp())
        os.makedirs(self.outside)
        self.shared = os.path.join(self.outside, "shared")
        with open(self.shared, "wb") as f:
            f.write(b"OUTSIDE")
        os.link(self.shared, os.path.join(self.base_dir, "link"))
        return d

    def assert_shared_intact(self, links: int = 2) -> None:
        """Both names (and ``links`` in all) still hold the one inode, with its bytes."""
        inside = os.stat(os.path.join(self.base_dir, "link"))
        outside = os.stat(self.shared)
        self.assertEqual((inside.st_ino, outside.st_nlink), (outside.st_ino, links))
        with open(self.shared, "rb") as f:
            self.assertEqual(f.read(), b"OUTSIDE")

    @inlineCallbacks
    def assert_reads_follow(self) -> Any:
        """Reads of the link answer the shared inode's bytes."""
        reply = yield self.get("/download", "link")
        self.assertEqual(reply.status, 200)
        self.assertEqual(base64.b64decode(reply.json()["content_base64"]), b"OUTSIDE")
        reply = yield self.get("/files/raw", "link")
        self.assertEqual((reply.status, reply.body), (200, b"OUTSIDE"))


class HardLinkFollowTests(HardLinkCase):
    """The default, ``hard_links: follow``."""

    @inlineCallbacks
    def test_reads_follow_writes_replace_the_name(self) -> Any:
        """
        Reads follow the inode.  A write is atomic (a new file renamed over
        the name), so it detaches the link: the outside name keeps its bytes
        and drops to one link.  A delete removes only the inside name.
        """
        yield self.assert_reads_follow()
        reply = yield self.request(
            "POST", "/upload", {"path": "link", "content_base64": b64(b"new")}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(self.read("link"), b"new")
        with open(self.shared, "rb") as f:
            self.assertEqual(f.read(), b"OUTSIDE")
        self.assertEqual(os.stat(self.shared).st_nlink, 1)
        os.link(self.shared, os.path.join(self.base_dir, "again"))
        reply = yield self.request("DELETE", "/files?path=again")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(os.stat(self.shared).st_nlink, 1)


class HardLinkDenyWritesTests(HardLinkCase):
    """``hard_links: deny_writes``: reads as before, changes refused."""

    policy = {"defaults": {"paths": {"hard_links": "deny_writes"}}}

    @inlineCallbacks
    def test_changes_refused_reads_work(self) -> Any:
        """
        Upload (overwrite), upload-stream, raw write, delete, move from and
        onto the link, extracting over it, and deleting or moving a tree
        holding it are 403 path_denied naming paths.hard_links; nothing on
        disk changes and reads still answer the shared bytes.
        """
        os.makedirs(os.path.join(self.base_dir, "tree"))
        os.link(self.shared, os.path.join(self.base_dir, "tree", "inner"))
        self.put("tree/plain.txt", b"plain")
        self.put("other.txt", b"other")
        before = sorted(os.listdir(self.base_dir))
        payload = {"path": "link", "content_base64": b64(b"pwn"), "overwrite": True}
        extract = {
            "content_base64": tar_of(("inner", "file", b"pwn")),
            "destination": "tree",
            "overwrite": True,
        }
        for method, route, body, raw in (
            ("POST", "/upload", payload, None),
            ("POST", "/files/upload-stream", payload, None),
            ("POST", "/files/raw?path=link", None, b"pwn"),
            ("DELETE", "/files?path=link", None, None),
            ("POST", "/files/move", {"source": "link", "destination": "m"}, None),
            (
                "POST",
                "/files/move",
                {"source": "other.txt", "destination": "link", "overwrite": True},
                None,
            ),
            ("POST", "/files/extract", extract, None),
            ("DELETE", "/files?path=tree", None, None),
            ("POST", "/files/move", {"source": "tree", "destination": "t2"}, None),
        ):
            reply = yield self.request(method, route, body, raw_body=raw)
            got = reply.json()
            self.assertEqual(
                (reply.status, got.get("code"), got.get("rule")),
                (403, "path_denied", "policy:defaults"),
                (route, body),
            )
            self.assertIn("hard links", got["error"])
        self.assertEqual(sorted(os.listdir(self.base_dir)), before)
        self.assertEqual(self.read("other.txt"), b"other")
        self.assertEqual(self.read("tree/plain.txt"), b"plain")
        self.assert_shared_intact(links=3)
        yield self.assert_reads_follow()

    @inlineCallbacks
    def test_single_link_files_unaffected(self) -> Any:
        """A file with one name is written, moved and deleted as usual."""
        self.put("one.txt", b"1")
        reply = yield self.request(
            "POST", "/upload", {"path": "one.txt", "content_base64": b64(b"2")}
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request(
            "POST", "/files/move", {"source": "one.txt", "destination": "two.txt"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request("DELETE", "/files?path=two.txt")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(sorted(os.listdir(self.base_dir)), ["link"])
        self.assert_shared_intact()


class HardenedHardLinkTests(HardLinkCase):
    """The hardened preset denies writes to multiply-linked files."""

    preset = "hardened"

    @inlineCallbacks
    def test_hardened_denies_writes(self) -> Any:
        """Under hardened an upload over a hard link is 403 naming preset:hardened."""
        reply = yield self.request(
            "POST", "/upload", {"path": "link", "content_base64": b64(b"pwn")}
        )
        self.assertEqual(
            (reply.status, reply.json()["code"], reply.json()["rule"]),
            (403, "path_denied", "preset:hardened"),
        )
        self.assert_shared_intact()
        yield self.assert_reads_follow()


class DaemonFilesTests(FilesCase):
    """
    The daemon's own files (audit log and its rotations, token files) are
    out of the file API's reach even inside the base: a
    token that may only read files must not read another token's secret or
    erase the trail of what it did.
    """

    audit = True
    autostart = False

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        secrets_dir = os.path.join(self.base_dir, "secrets")
        os.makedirs(secrets_dir)
        self.token_file = os.path.join(secrets_dir, "admin.tok")
        with open(self.token_file, "w") as f:
            f.write("admin-secret-token\n")
        policy = {
            "auth": {
                "tokens": [
                    {"id": "admin", "token_file": self.token_file, "scopes": ["*"]},
                    {"id": "reader", "token_env": "READER", "scopes": ["files:read"]},
                ]
            }
        }
        self.put("audit.log.1", b"rotated audit lines")
        yield self.start(policy=policy, environ={"READER": "r"})

    def as_reader(self, method: str, path: str, body: Any = None) -> Any:
        return self.request(method, path, body, token="r")

    @inlineCallbacks
    def test_reads_refused(self) -> Any:
        """Downloading, stat-ing or archiving them is 403 guard:daemon-files; other files still read."""
        self.put("notes.txt", b"fine")
        for rel in ("secrets/admin.tok", "audit.log", "audit.log.1"):
            for route in ("/download", "/files/raw", "/files/download-stream"):
                reply = yield self.as_reader("GET", f"{route}?path={quote(rel)}")
                self.assertEqual(reply.status, 403, (route, rel, reply.body))
                self.assertEqual(
                    (reply.json()["code"], reply.json()["rule"]),
                    ("path_denied", "guard:daemon-files"),
                )
        reply = yield self.as_reader("GET", "/download?path=notes.txt")
        self.assertEqual(reply.status, 200)

    @inlineCallbacks
    def test_hidden_from_listings_and_archives(self) -> Any:
        """They are not listed, found, or packed into an archive of the base."""
        reply = yield self.as_reader("GET", "/files/list?path=.&depth=3")
        names = {e["name"] for e in reply.json()["entries"]}
        self.assertNotIn("admin.tok", names)
        self.assertFalse(names & {"audit.log", "audit.log.1"})
        reply = yield self.request(
            "POST",
            "/files/search",
            {"path": ".", "pattern": "*"},
            token="admin-secret-token",
        )
        found = " ".join(str(m) for m in reply.json()["results"])
        self.assertNotIn("admin.tok", found)
        reply = yield self.request(
            "POST",
            "/files/archive",
            {"paths": ["."], "format": "tar.gz"},
            token="admin-secret-token",
        )
        self.assertEqual(reply.status, 200, reply.body)
        packed = tarfile.open(
            fileobj=io.BytesIO(base64.b64decode(reply.json()["content_base64"]))
        )
        members = " ".join(packed.getnames())
        for name in ("admin.tok", "audit.log"):
            self.assertNotIn(name, members)

    @inlineCallbacks
    def test_writes_and_deletes_refused(self) -> Any:
        """Even a token with every scope cannot overwrite, move or delete them through the API."""
        admin = "admin-secret-token"
        for rel in ("secrets/admin.tok", "audit.log", "audit.log.1"):
            reply = yield self.request(
                "POST",
                "/upload",
                {"path": rel, "content_base64": b64(b"x")},
                token=admin,
            )
            self.assertEqual(reply.status, 403, (rel, reply.body))
            reply = yield self.request(
                "DELETE", f"/files?path={quote(rel)}", token=admin
            )
            self.assertEqual(reply.status, 403, (rel, reply.body))
            reply = yield self.request(
                "POST",
                "/files/move",
                {"source": rel, "destination": "stolen"},
                token=admin,
            )
            self.assertEqual(reply.status, 403, (rel, reply.body))
        with open(self.token_file) as f:
            self.assertEqual(f.read(), "admin-secret-token\n")
        self.assertTrue(os.path.exists(os.path.join(self.base_dir, "audit.log.1")))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "stolen")))


class CommandsFileTests(FilesCase):
    """
    A ``--commands`` template inside the base is the daemon's own code: a
    token that may write files must not rewrite it to run as the daemon's
    user at the next start, nor read it.
    """

    autostart = False

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        self.put("tpl/cmds.py", b"# the template's commands\n")
        self.put("tpl/other.py", b"# not the daemon's\n")
        yield self.start(
            policy={
                "auth": {
                    "tokens": [
                        {"id": "files", "token_env": "FILES", "scopes": ["files:*"]}
                    ]
                }
            },
            environ={"FILES": "f"},
            commands=(os.path.join(self.base_dir, "tpl", "cmds.py"),),
        )

    @inlineCallbacks
    def test_commands_file_out_of_reach(self) -> Any:
        """
        Reading, writing, deleting the commands file, or planting a bytecode
        cache for it, is 403 ``guard:daemon-files``, and the file is
        unchanged; a file beside it is still read and written.
        """
        for rel in ("tpl/cmds.py", "tpl/__pycache__/cmds.cpython-311.pyc"):
            reply = yield self.request(
                "POST",
                f"/files/raw?path={quote(rel)}",
                raw_body=b"import os\n",
                token="f",
            )
            self.assertEqual(
                (reply.status, reply.json()["rule"]), (403, "guard:daemon-files"), rel
            )
        for method, route in (("GET", "/files/raw"), ("DELETE", "/files")):
            reply = yield self.request(method, f"{route}?path=tpl/cmds.py", token="f")
            self.assertEqual(
                (reply.status, reply.json()["rule"]), (403, "guard:daemon-files")
            )
        with open(os.path.join(self.base_dir, "tpl", "cmds.py"), "rb") as f:
            self.assertEqual(f.read(), b"# the template's commands\n")
        reply = yield self.request(
            "POST", "/files/raw?path=tpl/other.py", raw_body=b"x = 1\n", token="f"
        )
        self.assertEqual(reply.status, 200, reply.body)
