"""
The path guard (SPEC §11.1) on real files, with openat2 and with the
per-component fallback walk: traversal, NUL, system paths, links in and out,
trailing slashes, dangling links, read-only, deny globs, symlinks: deny, and
a rename race that must never let a read or write escape.
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd import guard as guard_module
from sandboxd.errors import ApiError
from sandboxd.files.atomic import AtomicWrite
from sandboxd.guard import PathGuard
from sandboxd.policy.rules import EffectiveRule, Limits, Params, PathRule


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
        },
    )


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


class OpenAt2Tests(GuardMixin, SynchronousTestCase):
    """Resolution through openat2 (when the kernel has it)."""

    use_openat2 = True


class WalkTests(GuardMixin, SynchronousTestCase):
    """Resolution through the O_PATH|O_NOFOLLOW per-component walk."""

    use_openat2 = False


def _rmtree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
