"""Which server a file gets, where its project starts, and what is installed."""

from __future__ import annotations

import os
import sys

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.lsp import catalog


class CatalogTests(SynchronousTestCase):
    """The catalogue, read against a PATH of the test's making."""

    def test_language_by_extension(self) -> None:
        """Extensions map to LSP's language ids, case-insensitively; others to None."""
        self.assertEqual(catalog.language_of("/w/A.PY"), "python")
        self.assertEqual(catalog.language_of("x.tsx"), "typescriptreact")
        self.assertIsNone(catalog.language_of("notes.txt"))

    def test_servers_follow_the_policy(self) -> None:
        """Preference order, narrowed by params.lsp_servers; unknown ids ignored."""
        ids = [s.id for s in catalog.servers_for("python", None)]
        self.assertEqual(ids[:3], ["pyright", "basedpyright", "pylsp"])
        only = catalog.servers_for("python", ("pylsp", "nonesuch"))
        self.assertEqual([s.id for s in only], ["pylsp"])
        self.assertEqual(catalog.allowed_ids(("nonesuch",)), ())

    def test_command_on_path_or_as_module(self) -> None:
        """A server on the child's PATH is run from there; pylsp also as the daemon's module."""
        bin_dir = self.mktemp()
        os.makedirs(bin_dir)
        exe = os.path.join(bin_dir, "gopls")
        with open(exe, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(exe, 0o755)
        env = {"PATH": bin_dir}
        self.assertEqual(catalog.SERVERS_BY_ID["gopls"].command(env), [exe])
        self.assertIsNone(catalog.SERVERS_BY_ID["clangd"].command(env))
        pylsp = catalog.SERVERS_BY_ID["pylsp"]
        if catalog._module_exists("pylsp"):
            self.assertEqual(pylsp.command(env), [sys.executable, "-m", "pylsp"])
        entry = catalog.SERVERS_BY_ID["clangd"].describe(env, allowed=False)
        self.assertEqual((entry["installed"], entry["allowed"]), (False, False))

    def test_rustup_proxy_without_its_component(self) -> None:
        """
        rustup's rust-analyzer proxy counts as installed only once a
        toolchain has the tool (the proxy alone fails with "Unknown binary").
        """
        root = os.path.realpath(self.mktemp())
        bin_dir = os.path.join(root, "cargo", "bin")
        os.makedirs(bin_dir)
        rustup = os.path.join(bin_dir, "rustup")
        with open(rustup, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(rustup, 0o755)
        os.symlink(rustup, os.path.join(bin_dir, "rust-analyzer"))
        home = os.path.join(root, "rustup")
        tools = os.path.join(home, "toolchains", "stable", "bin")
        os.makedirs(tools)
        env = {"PATH": bin_dir, "RUSTUP_HOME": home}
        server = catalog.SERVERS_BY_ID["rust-analyzer"]
        self.assertIsNone(server.command(env))
        self.assertIs(server.describe(env, allowed=True)["installed"], False)
        tool = os.path.join(tools, "rust-analyzer")
        with open(tool, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(tool, 0o755)
        self.assertEqual(server.command(env), [os.path.join(bin_dir, "rust-analyzer")])

    def test_project_root(self) -> None:
        """The nearest marker wins; nothing above the allowed area is looked at."""
        base = os.path.realpath(self.mktemp())
        deep = os.path.join(base, "repo", "pkg", "sub")
        os.makedirs(deep)
        os.makedirs(os.path.join(base, "repo", ".git"))
        everywhere = lambda d: True  # noqa: E731
        self.assertEqual(
            catalog.find_root(deep, everywhere, base), os.path.join(base, "repo")
        )
        with open(os.path.join(base, "repo", "pkg", "pyproject.toml"), "w"):
            pass
        self.assertEqual(
            catalog.find_root(deep, everywhere, base), os.path.join(base, "repo", "pkg")
        )
        below = lambda d: d.startswith(os.path.join(base, "repo", "pkg", "sub"))  # noqa: E731
        self.assertEqual(catalog.find_root(deep, below, base), base)
        self.assertEqual(catalog.find_root("/elsewhere", below, base), "/elsewhere")
