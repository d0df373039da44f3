"""
The path guard (SPEC §11.1) on real files, with openat2 and with the
per-component fallback walk: traversal, NUL, system paths, links in and out,
trailing slashes, dangling links, read-only, deny globs, symlinks: deny, and
a rename race that must never let a read or write escape; kernel file
systems mounted inside the base, device nodes, and hard links.
"""

from __future__ import annotations

import ctypes
import os
import stat
import tempfile
import threading
from typing import Any

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.access import guard as guard_module
from sandboxd.access.guard import PathGuard, special_filesystem
from sandboxd.errors import ApiError
from sandboxd.files.atomic import AtomicWrite
from sandboxd.files.walk import list_dir, search
from sandboxd.policy import PolicyError, load_policy
from sandboxd.policy.rules import EffectiveRule, Limits, Params, PathRule
from sandboxd.routes import builtin_table

_MS_RDONLY = 1
_MS_BIND = 4096
_MNT_DETACH = 2


def make_rule(base: str, **paths: Any) -> EffectiveRule:
    return EffectiveRule(
        endpoint_id="download",
        enabled=True,
        enabled_by="test",
        scopes=(),
        audit="off",
        limits=Limits(),
        paths=PathRule(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in paths.items()}
        ),
        params=Params(),
        base_dir=base,
        sources={
            "paths.symlinks": "policy:test",
            "paths.read_only": "policy:test",
            "paths.deny": "policy:test",
            "paths.hard_links": "policy:test",
        },
    )


def bind_mount(case: Any, source: str, target: str) -> None:
    """
    Bind-mount ``source`` on ``target`` for the rest of the test (detached in
    cleanup, before the temporary tree is removed), or skip saying why.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), target.encode(), None, _MS_BIND, None) != 0:
        err = ctypes.get_errno()
        raise SkipTest(
            f"cannot bind-mount {source} here ({os.strerror(err)}): "
            "needs root with CAP_SYS_ADMIN in this mount namespace"
        )
    case.addCleanup(libc.umount2, target.encode(), _MNT_DETACH)


def tmpfs(case: Any, target: str, size: str, read_only: bool = False) -> None:
    """
    A tmpfs of ``size`` on ``target`` for the rest of the test (mounted
    read-only with ``read_only``, as a read-only container's root is), or
    skip.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"size={size}".encode()
    flags = _MS_RDONLY if read_only else 0
    if libc.mount(b"tmpfs", target.encode(), b"tmpfs", flags, options) != 0:
        err = ctypes.get_errno()
        raise SkipTest(f"cannot mount a tmpfs here ({os.strerror(err)}): needs root")
    case.addCleanup(libc.umount2, target.encode(), _MNT_DETACH)


def sans_error(body: dict[str, Any]) -> dict[str, Any]:
    """A refusal body without its message (which names the requested path)."""
    return {k: v for k, v in body.items() if k != "error"}


class GuardMixin:
    """The cases; subclasses pick openat2 or the fallback walk."""

    use_openat2 = True

    def setUp(self) -> None:
        saved = guard_module.USE_OPENAT2
        guard_module.USE_OPENAT2 = (
            self.use_openat2 and guard_module._syscall is not None
        )
        self.addCleanup(setattr, guard_module, "USE_OPENAT2", saved)
        top = os.path.realpath(tempfile.mkdtemp())
        self.addCleanup(_rmtree, top)
        self.base = os.path.join(top, "base")
        self.outside = os.path.join(top, "outside")
        os.makedirs(os.path.join(self.base, "sub"))
        os.makedirs(self.outside)
        self.write(os.path.join(self.base, "sub", "f.txt"), b"inside")
        self.write(os.path.join(self.outside, "secret"), b"OUTSIDE")
        self.guard = PathGuard(make_rule(self.base))

    def write(self, path: str, data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)

    def link(self, target: str, name: str) -> None:
        os.symlink(target, os.path.join(self.base, name))

    def refused(
        self, path: str, op: str = "read", guard: PathGuard | None = None, **kw: Any
    ) -> ApiError:
        g = guard or self.guard
        with self.assertRaises(ApiError) as cm:  # type: ignore[attr-defined]
            if op == "open":
                g.open_file(path).close()
            else:
                g.locate(path, op, **kw).close()
        return cm.exception  # type: ignore[no-any-return]

    def read(self, path: str) -> bytes:
        with self.guard.open_file(path) as f:
            return os.read(f.fd, 1 << 20)

    def test_plain_paths(self) -> None:
        """Relative and absolute paths inside the base resolve to the same real path."""
        self.assertEqual(self.read("sub/f.txt"), b"inside")
        self.assertEqual(self.read(os.path.join(self.base, "sub/f.txt")), b"inside")
        self.assertEqual(
            self.guard.check("sub/../sub/f.txt"), os.path.join(self.base, "sub/f.txt")
        )
        self.assertEqual(
            self.guard.check("new/file"), os.path.join(self.base, "new/file")
        )

    def test_traversal_is_uniform(self) -> None:
        """Traversal is 403 path_not_allowed, byte-identical for existing and missing targets."""
        for path in (
            "../outside/secret",
            "../outside/nope",
            "sub/../../outside/secret",
            "/etc/passwd",
            "/etc/nope",
            "//etc",
            "~root/x",
        ):
            e = self.refused(path, "open") if not path.startswith("~") else None
            if e is not None:
                self.assertEqual((e.status, e.code), (403, "path_not_allowed"), path)
        a = self.refused("../outside/secret", "open")
        b = self.refused("../outside/nosuch", "open")
        self.assertEqual(a.body()["code"], b.body()["code"])
        self.assertEqual(a.body()["rule"], b.body()["rule"])

    def test_nul(self) -> None:
        """A NUL in a path is 400 invalid_path, never a 500."""
        e = self.refused("a\x00b")
        self.assertEqual((e.status, e.code), (400, "invalid_path"))

    def test_system_paths(self) -> None:
        """/proc, /sys and /dev are refused, also when reached through a link."""
        for path in (
            "/proc/self/environ",
            "/proc/../proc/self",
            "/sys/kernel",
            "/dev/null",
        ):
            self.assertEqual(self.refused(path, "open").status, 403, path)
        self.link("/proc/self", "p")
        self.link("/dev/zero", "z")
        self.assertEqual(self.refused("p/environ", "open").code, "path_not_allowed")
        self.assertEqual(self.refused("z", "open").code, "path_not_allowed")

    def test_links_out_refused_uniformly(self) -> None:
        """A link leading out (file or dir, absolute or relative) is refused whether its target exists or not."""
        self.link(os.path.join(self.outside, "secret"), "out_file")
        self.link(self.outside, "out_dir")
        self.link("../outside", "up")
        self.link(os.path.join(self.outside, "missing"), "out_missing")
        for path in (
            "out_file",
            "out_dir/secret",
            "up/secret",
            "out_missing",
            "out_dir/missing",
        ):
            for op in ("open", "write"):
                e = (
                    self.refused(path, op, follow=True)
                    if op == "write"
                    else self.refused(path, op)
                )
                self.assertEqual(
                    (e.status, e.code), (403, "path_not_allowed"), (path, op)
                )

    def test_trailing_slash_and_dot(self) -> None:
        """``link/``, ``link/.`` and ``link//`` never follow a link out."""
        self.link(self.outside, "lnk")
        for path in ("lnk/", "lnk/.", "lnk//", "lnk/./secret"):
            self.assertEqual(
                self.refused(path, "read", follow=True).code, "path_not_allowed", path
            )
        with self.assertRaises(ApiError):
            self.guard.cwd("lnk/")

    def test_links_inside_followed(self) -> None:
        """Relative and absolute links that stay inside are followed to their real path."""
        self.link("sub/f.txt", "rel")
        self.link(os.path.join(self.base, "sub"), "abs")
        self.assertEqual(self.read("rel"), b"inside")
        self.assertEqual(self.read("abs/f.txt"), b"inside")
        self.assertEqual(
            self.guard.check("abs/f.txt"), os.path.join(self.base, "sub/f.txt")
        )
        self.assertEqual(self.guard.cwd("abs"), os.path.join(self.base, "sub"))

    def test_link_loop(self) -> None:
        """A link loop is refused, not followed forever."""
        self.link("b", "a")
        self.link("a", "b")
        self.assertEqual(self.refused("a", "read", follow=True).status, 400)

    def test_dangling_links_not_written_through(self) -> None:
        """Writing to a dangling link, or below a dangling directory link, is refused and creates nothing."""
        self.link("sub/missing.txt", "dangle")
        self.link("newdir_target", "newdir")
        e = self.refused("dangle", "write", follow=True, make_parents=True)
        self.assertEqual(e.status, 403)
        e = self.refused("newdir/file", "write", follow=True, make_parents=True)
        self.assertEqual(e.status, 403)
        self.assertFalse(os.path.lexists(os.path.join(self.base, "sub/missing.txt")))
        self.assertFalse(os.path.lexists(os.path.join(self.base, "newdir_target")))

    def test_write_replaces_link_not_target(self) -> None:
        """An atomic write to a name that became a link replaces the name, never writes through it."""
        loc = self.guard.locate("victim", "write", follow=True)
        writer = AtomicWrite(loc)
        self.link(
            os.path.join(self.outside, "secret"), "victim"
        )  # planted after the check
        writer.write(b"mine")
        writer.commit()
        with open(os.path.join(self.outside, "secret"), "rb") as f:
            self.assertEqual(f.read(), b"OUTSIDE")
        self.assertFalse(os.path.islink(os.path.join(self.base, "victim")))

    def test_read_only(self) -> None:
        """read_only refuses writes and deletes (also through a link into it) but allows reads."""
        g = PathGuard(make_rule(self.base, read_only=["sub"]))
        self.link("sub", "alias")
        self.assertEqual(self.refused("sub/f.txt", "write", guard=g).code, "read_only")
        self.assertEqual(
            self.refused("sub/new.txt", "write", guard=g).code, "read_only"
        )
        self.assertEqual(
            self.refused("alias/new.txt", "write", guard=g, follow=True).code,
            "read_only",
        )
        self.assertEqual(self.refused("sub/f.txt", "delete", guard=g).code, "read_only")
        g.open_file("sub/f.txt").close()

    def test_deny_globs_on_real_path(self) -> None:
        """Deny globs match the resolved path, so an alias link does not get around them."""
        os.makedirs(os.path.join(self.base, "secret"))
        self.write(os.path.join(self.base, "secret", "key"), b"k")
        self.link("secret", "alias")
        g = PathGuard(make_rule(self.base, deny=["secret/**", "**/.git/**"]))
        for path in (
            "secret/key",
            "./secret//key",
            "secret/../secret/key",
            "alias/key",
            "x/.git/config",
        ):
            self.assertEqual(
                self.refused(path, "read", guard=g, follow=True).code,
                "path_denied",
                path,
            )

    def test_deep_parents_are_decided_once(self) -> None:
        """
        Making 300 missing parents for an allowed path decides the path a
        few times, not once per directory (each decision walks the whole
        path again: a deep write took time quadratic in its depth), and
        a denied directory among them is still refused with nothing made.
        """
        g = PathGuard(make_rule(self.base, deny=["**/.git/**", "secret/**"]))
        calls = []
        real = guard_module.decide

        def counting(*args: Any) -> Any:
            calls.append(args[1])
            return real(*args)

        self.patch(guard_module, "decide", counting)
        path = "deep/" + "d/" * 300 + "f"
        g.locate(path, "write", follow=True, make_parents=True).close()
        self.assertLess(len(calls), 10)
        self.assertTrue(os.path.isdir(os.path.join(self.base, "deep/" + "d/" * 300)))
        denied = self.refused(
            "made/.git/x/f", "write", guard=g, follow=True, make_parents=True
        )
        self.assertEqual(denied.code, "path_denied")
        self.assertFalse(os.path.exists(os.path.join(self.base, "made")))

    def test_a_path_past_path_max_is_too_long(self) -> None:
        """
        A path longer than the kernel takes by name (PATH_MAX) is refused
        at once as too long, as a too-long name is, and nothing is made.
        """
        path = "long/" + "d/" * 2100 + "f"
        error = self.refused(path, "write", follow=True, make_parents=True)
        self.assertEqual(error.code, "invalid_path")
        self.assertIn("File name too long", error.message)
        self.assertFalse(os.path.exists(os.path.join(self.base, "long")))

    def test_symlinks_deny(self) -> None:
        """With symlinks: deny, any link on the way is symlink_denied, even one staying inside."""
        g = PathGuard(make_rule(self.base, symlinks="deny"))
        self.link("sub", "alias")
        self.link("sub/f.txt", "rel")
        self.assertEqual(
            self.refused("alias/f.txt", "read", guard=g).code, "symlink_denied"
        )
        self.assertEqual(self.refused("rel", "open", guard=g).code, "symlink_denied")
        g.open_file("sub/f.txt").close()

    def test_fifo_refused_without_blocking(self) -> None:
        """A FIFO is refused for reading (400) instead of blocking on open."""
        os.mkfifo(os.path.join(self.base, "fifo"))
        self.assertEqual(self.refused("fifo", "open").status, 400)

    def fake_proc(self) -> str:
        """
        ``fakeproc/self/environ`` in the base, reported as procfs through
        the :func:`special_filesystem` seam (as a mount of /proc would be).
        """
        fake = os.path.join(self.base, "fakeproc")
        os.makedirs(os.path.join(fake, "self"))
        self.write(os.path.join(fake, "self", "environ"), b"SECRET=1")
        inodes = {
            os.stat(os.path.join(fake, rel)).st_ino
            for rel in ("", "self", "self/environ")
        }
        real = guard_module.special_filesystem

        def seam(fd: int) -> str | None:
            return "proc" if os.fstat(fd).st_ino in inodes else real(fd)

        self.patch(guard_module, "special_filesystem", seam)  # type: ignore[attr-defined]
        # The fake sits on the base's own device, which the guard otherwise
        # (rightly) never asks fstatfs about.
        self.patch(guard_module, "base_device", lambda anchors, base_dir: None)  # type: ignore[attr-defined]
        return fake

    def test_special_filesystem_refused_like_proc(self) -> None:
        """
        A location whose directory is on a kernel file system is refused
        exactly as /proc is (403 path_not_allowed, guard:system-paths), the
        same for existing and missing names, for reads, writes and checks,
        and nothing is created there.
        """
        self.fake_proc()
        expected = sans_error(self.refused("/proc/self/environ", "open").body())
        self.assertEqual(expected["rule"], "guard:system-paths")
        for path in (
            "fakeproc/self/environ",
            "fakeproc/self/nosuch",
            "fakeproc/nosuch",
            "fakeproc/nosuch/deeper/x",
            "fakeproc/self/environ/x",
        ):
            e = self.refused(path, "open")
            self.assertEqual((e.status, sans_error(e.body())), (403, expected), path)
            with self.assertRaises(ApiError) as cm:  # type: ignore[attr-defined]
                self.guard.check(path)
            self.assertEqual(sans_error(cm.exception.body()), expected, path)
        e = self.refused("fakeproc/self/new", "write", follow=True, make_parents=True)
        self.assertEqual(sans_error(e.body()), expected)
        e = self.refused("fakeproc/a/b", "write", follow=True, make_parents=True)
        self.assertEqual(sans_error(e.body()), expected)
        self.assertEqual(
            sorted(os.listdir(os.path.join(self.base, "fakeproc"))), ["self"]
        )
        self.assertEqual(self.read("sub/f.txt"), b"inside")

    def test_proc_mounted_inside_base(self) -> None:
        """
        A real bind mount of /proc (and of one /proc file) inside the base is
        refused like /proc itself, mount point included, and listings and
        searches do not show or enter it.
        """
        p = os.path.join(self.base, "p")
        os.mkdir(p)
        status = os.path.join(self.base, "status")
        self.write(status, b"")
        bind_mount(self, "/proc", p)
        bind_mount(self, "/proc/self/status", status)
        expected = sans_error(self.refused("/proc/self/environ", "open").body())
        for path in ("p", "p/self/environ", "p/self/nosuch", "p/nosuch/x", "status"):
            e = self.refused(path, "open")
            self.assertEqual((e.status, sans_error(e.body())), (403, expected), path)
        for op in ("read", "write", "delete"):
            e = self.refused("p", op)
            self.assertEqual(sans_error(e.body()), expected, op)
        with self.assertRaises(ApiError):  # type: ignore[attr-defined]
            self.guard.cwd("p/self")
        listed = list_dir(self.guard, self.base, 3, True, 1000)["entries"]
        self.assertEqual(
            sorted(e["name"] for e in listed), ["f.txt", "sub"], "p and status hidden"
        )
        found = search(self.guard, self.base, "environ", 100, 10.0)["results"]
        self.assertEqual(found, [])
        self.assertTrue(os.path.exists(os.path.join(p, "self")), "mount untouched")

    def test_device_nodes_refused_as_content(self) -> None:
        """
        devtmpfs reports tmpfs's f_type, so device nodes are kept out by the
        regular-file check: a character or block device inside the base is
        400 "Not a regular file", never opened for reading.
        """
        for name, (kind, dev) in {
            "zero": (stat.S_IFCHR, os.makedev(1, 5)),
            "loop": (stat.S_IFBLK, os.makedev(7, 0)),
        }.items():
            try:
                os.mknod(os.path.join(self.base, name), kind | 0o600, dev)
            except PermissionError:
                raise SkipTest("mknod needs CAP_MKNOD (root)") from None
            e = self.refused(name, "open")
            self.assertEqual((e.status, e.code), (400, "invalid_param"), name)
            self.assertIn("Not a regular file", e.message)

    def test_hard_link_reads_follow_and_deny_writes(self) -> None:
        """
        A hard link to an outside file reads the shared inode under both
        settings; under deny_writes a write or delete location refuses it
        (403 path_denied, rule paths.hard_links) and the inode keeps its bytes.
        """
        outside = os.path.join(self.outside, "secret")
        os.link(outside, os.path.join(self.base, "hl"))
        for setting in ("follow", "deny_writes"):
            g = PathGuard(make_rule(self.base, hard_links=setting))
            with g.open_file("hl") as f:
                self.assertEqual(os.read(f.fd, 100), b"OUTSIDE", setting)
        g = PathGuard(make_rule(self.base, hard_links="deny_writes"))
        with g.locate("hl", "read") as loc:
            self.assertIsNone(loc.deny_shared)
        with self.assertRaises(ApiError) as cm:  # type: ignore[attr-defined]
            AtomicWrite(g.locate("hl", "write", follow=True), display="hl")
        e = cm.exception
        self.assertEqual(
            (e.status, e.code, e.extra["rule"]), (403, "path_denied", "policy:test")
        )
        self.assertIn("hard links", e.message)
        self.assertEqual(os.stat(outside).st_nlink, 2)
        with open(outside, "rb") as f:
            self.assertEqual(f.read(), b"OUTSIDE")
        self.assertEqual(sorted(os.listdir(self.base)), ["hl", "sub"])

    def test_swap_race(self) -> None:
        """
        A rename loop swapping ``dir`` between a real directory and a link to
        outside, raced against guarded reads and writes: zero escapes.
        """
        real = os.path.join(self.base, "real")
        os.makedirs(real)
        self.write(os.path.join(real, "secret"), b"inside")
        self.link(self.outside, "evil")
        stop = threading.Event()

        def swap() -> None:
            d = os.path.join(self.base, "dir")
            r, e = real, os.path.join(self.base, "evil")
            while not stop.is_set():
                for src in (r, e):
                    try:
                        os.rename(src, d)
                        os.rename(d, src)
                    except OSError:
                        pass

        t = threading.Thread(target=swap)
        t.start()
        escapes = 0
        try:
            for i in range(2000):
                try:
                    if self.read("dir/secret") == b"OUTSIDE":
                        escapes += 1
                except ApiError:
                    pass
                try:
                    loc = self.guard.locate(f"dir/w{i % 3}", "write", follow=True)
                    w = AtomicWrite(loc)
                    w.write(b"x")
                    w.commit()
                except ApiError:
                    pass
        finally:
            stop.set()
            t.join()
        self.assertEqual(escapes, 0)
        self.assertEqual(sorted(os.listdir(self.outside)), ["secret"])


class BaseDeviceShortcutTests(SynchronousTestCase):
    """Only descriptors on another device than the base are asked about."""

    def test_base_device_skips_fstatfs(self) -> None:
        """Same device as the base: no fstatfs; another device: fstatfs answers."""
        asked: list[int] = []

        def seam(fd: int) -> str | None:
            asked.append(fd)
            return "proc"

        self.patch(guard_module, "special_filesystem", seam)
        self.assertIsNone(guard_module.special_unless_base(7, 42, 42))
        self.assertEqual(asked, [])
        self.assertEqual(guard_module.special_unless_base(7, 43, 42), "proc")
        self.assertEqual(guard_module.special_unless_base(8, 42, None), "proc")
        self.assertEqual(asked, [7, 8])


class PinnedBaseCwdTests(SynchronousTestCase):
    """The base directory as a working directory: one stat against its pinned identity."""

    def setUp(self) -> None:
        top = os.path.realpath(tempfile.mkdtemp())
        self.addCleanup(_rmtree, top)
        self.base = os.path.join(top, "base")
        self.outside = os.path.join(top, "outside")
        os.makedirs(os.path.join(self.base, "sub"))
        os.makedirs(self.outside)
        self.rule = make_rule(self.base)
        guard_module.pin_anchors(self.rule.anchors, self.base)
        self.guard = PathGuard(self.rule)
        self.opened: list[Any] = []
        real_open = os.open

        def counting_open(*args: Any, **kw: Any) -> int:
            self.opened.append(args[0])
            return real_open(*args, **kw)

        self.patch(guard_module.os, "open", counting_open)

    def test_base_without_a_descriptor(self) -> None:
        """The base (by default, by name, with a trailing slash or ``.``) is answered without opening anything; a subdirectory still goes through the walk."""
        for given in (None, "", self.base, self.base + "/", ".", "sub/.."):
            self.assertEqual(self.guard.cwd(given), self.base, given)
        self.assertEqual(self.opened, [])
        self.assertEqual(self.guard.cwd("sub"), os.path.join(self.base, "sub"))
        self.assertNotEqual(self.opened, [])

    def test_base_swapped_is_refused(self) -> None:
        """A base replaced by a link out, or renamed away and replaced by another directory, is refused as the full walk refuses it."""
        aside = self.base + ".aside"
        os.rename(self.base, aside)
        try:
            os.symlink(self.outside, self.base)
            with self.assertRaises(ApiError) as cm:
                self.guard.cwd()
            self.assertEqual(
                (cm.exception.status, cm.exception.code), (403, "path_not_allowed")
            )
            os.unlink(self.base)
            os.mkdir(self.base)
            with self.assertRaises(ApiError) as cm:
                self.guard.cwd(self.base)
            self.assertEqual(cm.exception.status, 403)
            os.rmdir(self.base)
        finally:
            os.rename(aside, self.base)
        self.assertEqual(self.guard.cwd(), self.base)

    def test_odd_spellings_answer_as_the_walk(self) -> None:
        """A name too long for any file system, cancelled by ``..``, is refused as the walk refuses it; a path outside is refused too."""
        with self.assertRaises(ApiError) as cm:
            self.guard.cwd("x" * 300 + "/..")
        self.assertEqual(cm.exception.status, 400)
        with self.assertRaises(ApiError) as cm:
            self.guard.cwd(self.outside)
        self.assertEqual(cm.exception.status, 403)

    def test_unpinned_base_takes_the_walk(self) -> None:
        """Without a pinned identity the base is opened and walked as before."""
        guard = PathGuard(make_rule(self.base))
        self.assertEqual(guard.cwd(), self.base)
        self.assertNotEqual(self.opened, [])


class OneStatPerOpenTests(SynchronousTestCase):
    """Opening a file asks about its name once and about a pinned base once."""

    def setUp(self) -> None:
        top = os.path.realpath(tempfile.mkdtemp())
        self.addCleanup(_rmtree, top)
        self.base = os.path.join(top, "base")
        os.makedirs(os.path.join(self.base, "sub"))
        for name in ("f.txt", "sub/g.txt"):
            with open(os.path.join(self.base, name), "wb") as f:
                f.write(b"inside")
        self.rule = make_rule(self.base)
        guard_module.pin_anchors(self.rule.anchors, self.base)
        self.guard = PathGuard(self.rule)
        # The base's device, looked up once and remembered, is not counted.
        guard_module.base_device(self.rule.anchors, self.base)
        self.stats: list[Any] = []
        self.fstats: list[int] = []
        real_stat, real_fstat = os.stat, os.fstat

        def counting_stat(path: Any, *args: Any, **kw: Any) -> os.stat_result:
            self.stats.append(path)
            return real_stat(path, *args, **kw)

        def counting_fstat(fd: int) -> os.stat_result:
            self.fstats.append(fd)
            return real_fstat(fd)

        self.patch(guard_module.os, "stat", counting_stat)
        self.patch(guard_module.os, "fstat", counting_fstat)

    def test_top_level_file(self) -> None:
        """A file in the base: one stat of its name, one fstat of the base (its pinned identity) and one of the file opened."""
        with self.guard.open_file("f.txt") as f:
            self.assertEqual(os.read(f.fd, 100), b"inside")
        self.assertEqual(self.stats, ["f.txt"])
        self.assertEqual(len(self.fstats), 2)

    def test_nested_file(self) -> None:
        """A file below a subdirectory: its name is still asked about once."""
        with self.guard.open_file("sub/g.txt") as f:
            self.assertEqual(os.read(f.fd, 100), b"inside")
        self.assertEqual(self.stats, ["g.txt"])

    def test_what_the_checks_refuse_still_refused(self) -> None:
        """Missing is 404, a directory 400, a FIFO 400, with the name asked about once each."""
        os.mkfifo(os.path.join(self.base, "fifo"))
        for path, status in (("nope", 404), ("sub", 400), ("fifo", 400)):
            self.stats.clear()
            with self.assertRaises(ApiError) as cm:
                self.guard.open_file(path).close()
            self.assertEqual(cm.exception.status, status, path)
            self.assertEqual(self.stats, [path], path)


class SpecialFilesystemTests(SynchronousTestCase):
    """The f_type seam itself, and the policy choice for hard links."""

    def test_reads_f_type(self) -> None:
        """procfs and sysfs are named by their f_type, a temporary dir is not special, a bad fd refuses."""
        if guard_module._fstatfs is None:
            raise SkipTest("no usable fstatfs in this C library")
        for path, name in (("/proc", "proc"), ("/sys", "sysfs"), (self.mktemp(), None)):
            if name is None:
                os.makedirs(path)
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                self.assertEqual(special_filesystem(fd), name, path)
            finally:
                os.close(fd)
        self.assertEqual(special_filesystem(-1), "unknown")

    def test_hard_links_choice(self) -> None:
        """paths.hard_links takes follow or deny_writes; anything else is an invalid policy."""
        table = builtin_table()

        def load(value: str) -> Any:
            doc = {"defaults": {"paths": {"hard_links": value}}}
            return load_policy(
                table, explicit=doc, preset=None, base_dir="/tmp", environ={}
            )

        rule = load("deny_writes").rule("upload")
        self.assertEqual(rule.paths.hard_links, "deny_writes")
        self.assertEqual(rule.source("paths.hard_links"), "policy:defaults")
        self.assertEqual(load("follow").rule("upload").paths.hard_links, "follow")
        with self.assertRaises(PolicyError) as cm:
            load("deny")
        self.assertIn("follow, deny_writes", str(cm.exception))
        hardened = load_policy(
            table, explicit={}, preset="hardened", base_dir="/tmp", environ={}
        )
        self.assertEqual(hardened.rule("files_move").paths.hard_links, "deny_writes")


class OpenAt2Tests(GuardMixin, SynchronousTestCase):
    """Resolution through openat2 (when the kernel has it)."""

    use_openat2 = True


class WalkTests(GuardMixin, SynchronousTestCase):
    """Resolution through the O_PATH|O_NOFOLLOW per-component walk."""

    use_openat2 = False


def _rmtree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
