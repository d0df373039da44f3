# -*- test-case-name: tests.lsp.test_catalog -*-
"""
Which language servers sandboxd knows how to start, which language a file
is in, and where a file's project begins.

A server is found on the child's PATH (as every command is), or, for one
written in Python, as a module of the daemon's own interpreter: ``pip
install 'sandboxd[lsp]'`` puts pylsp beside the daemon without putting it
on anyone's PATH.  Nothing here imports a server.
"""

from __future__ import annotations

import importlib.util
import os
import posixpath
import sys
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from sandboxd.processes.command import find_executable


@attrs.frozen
class ServerSpec:
    """
    One language server sandboxd can start.

    :ivar argv: the command, speaking LSP on its stdin and stdout.
    :ivar module: a Python module that is the same server, run with the
        daemon's interpreter when ``argv[0]`` is not on the PATH.
    :ivar install: how to get it, for the 503 that says it is missing.
    :ivar initialization_options: what ``initialize`` tells it besides
        the daemon's capabilities (None: nothing).
    :ivar counts_in: the unit its columns really count, whatever it says
        (None: as it says); for a server that counts characters where the
        protocol says UTF-16 units, which differ past the BMP.
    :ivar diagnostics_count_in: for diagnostics from one of its plugins
        (by ``source``), the unit that plugin's columns count.
    """

    id: str
    languages: tuple[str, ...]
    argv: tuple[str, ...]
    install: str
    module: str | None = None
    initialization_options: Mapping[str, Any] | None = attrs.field(
        default=None, eq=False
    )
    counts_in: str | None = None
    diagnostics_count_in: Mapping[str, str] = attrs.field(factory=dict, eq=False)

    def command(self, env: Mapping[str, str]) -> list[str] | None:
        """The argv to start it with, executable resolved; None: not installed."""
        found = find_executable(self.argv[0], env)
        if found is not None and not unbacked_proxy(found, env):
            return [found, *self.argv[1:]]
        if self.module is not None and _module_exists(self.module):
            return [sys.executable, "-m", self.module, *self.argv[1:]]
        return None

    def describe(self, env: Mapping[str, str], allowed: bool) -> dict[str, object]:
        """The entry of ``lsp_servers``."""
        command = self.command(env)
        return {
            "id": self.id,
            "languages": list(self.languages),
            "command": command or list(self.argv),
            "installed": command is not None,
            "allowed": allowed,
            "install": self.install,
        }


def unbacked_proxy(path: str, env: Mapping[str, str]) -> bool:
    """
    Whether ``path`` is one of rustup's proxies for a tool no toolchain has.

    rustup puts ``rust-analyzer`` on the PATH whether or not its component
    is installed; the proxy then fails with "Unknown binary".  Such a
    server is not installed, and its 503 says how to install it.
    """
    if os.path.basename(os.path.realpath(path)) != "rustup":
        return False
    name = os.path.basename(path)
    home = env.get("RUSTUP_HOME") or os.path.join(env.get("HOME", "/"), ".rustup")
    toolchains = os.path.join(home, "toolchains")
    try:
        names = os.listdir(toolchains)
    except OSError:
        return True
    return not any(
        os.access(os.path.join(toolchains, toolchain, "bin", name), os.X_OK)
        for toolchain in names
    )


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


_TS = ("typescript", "typescriptreact", "javascript", "javascriptreact")

#: The built-in servers; for a language, the first installed one is used.
SERVERS: tuple[ServerSpec, ...] = (
    ServerSpec(
        "pyright",
        ("python",),
        ("pyright-langserver", "--stdio"),
        "npm install -g pyright",
    ),
    ServerSpec(
        "basedpyright",
        ("python",),
        ("basedpyright-langserver", "--stdio"),
        "pip install basedpyright",
    ),
    ServerSpec(
        "pylsp",
        ("python",),
        ("pylsp",),
        "pip install 'python-lsp-server[pyflakes]'",
        module="pylsp",
        # It hands LSP columns to Jedi, which counts characters; its pyflakes
        # plugin passes on Python's AST offsets, which count UTF-8 bytes.
        counts_in="utf-32",
        diagnostics_count_in={"pyflakes": "utf-8"},
    ),
    ServerSpec(
        "jedi-language-server",
        ("python",),
        ("jedi-language-server",),
        "pip install jedi-language-server",
    ),
    ServerSpec(
        "typescript-language-server",
        _TS,
        ("typescript-language-server", "--stdio"),
        "npm install -g typescript typescript-language-server "
        "(on Node.js 20: typescript@6 typescript-language-server@5)",
        # By default, while tsserver loads the project, definitions,
        # references, hover and completions go to a second tsserver that
        # sees only the open file: an import's binding as the definition,
        # nothing after ``obj.``.  An editor shows that and asks again; an
        # agent takes the first answer, so every question waits for the
        # project.
        initialization_options={"tsserver": {"useSyntaxServer": "never"}},
    ),
    ServerSpec(
        "bash-language-server",
        ("shellscript",),
        ("bash-language-server", "start"),
        "npm install -g bash-language-server",
    ),
    ServerSpec(
        "gopls", ("go",), ("gopls",), "go install golang.org/x/tools/gopls@latest"
    ),
    ServerSpec(
        "rust-analyzer",
        ("rust",),
        ("rust-analyzer",),
        "rustup component add rust-analyzer",
    ),
    ServerSpec("clangd", ("c", "cpp"), ("clangd",), "apt-get install clangd"),
)

SERVERS_BY_ID = {spec.id: spec for spec in SERVERS}

#: LSP's language identifiers by file name extension.
LANGUAGES = {
    ".py": "python",
    ".pyi": "python",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "typescriptreact",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascriptreact",
    ".sh": "shellscript",
    ".bash": "shellscript",
    ".go": "go",
    ".rs": "rust",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".hh": "cpp",
    ".hpp": "cpp",
}

#: What marks the top of a project, nearest first wins.
ROOT_MARKERS = (
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "package.json",
    "tsconfig.json",
    "go.mod",
    "Cargo.toml",
    "compile_commands.json",
    ".git",
)


def language_of(path: str) -> str | None:
    """The language of ``path`` by its extension, or None."""
    return LANGUAGES.get(posixpath.splitext(path)[1].lower())


def allowed_ids(allowed: tuple[str, ...] | None) -> tuple[str, ...]:
    """The catalogue ids ``params.lsp_servers`` allows (None: every one)."""
    if allowed is None:
        return tuple(SERVERS_BY_ID)
    return tuple(i for i in allowed if i in SERVERS_BY_ID)


def servers_for(language: str, allowed: tuple[str, ...] | None) -> list[ServerSpec]:
    """The allowed servers of ``language``, in order of preference."""
    ids = allowed_ids(allowed)
    return [s for s in SERVERS if language in s.languages and s.id in ids]


def find_root(directory: str, within: Callable[[str], bool], fallback: str) -> str:
    """
    The nearest directory from ``directory`` up holding a project marker,
    going no higher than ``within`` allows; ``fallback`` (the base dir)
    when none does and ``directory`` is below it, else ``directory``.

    Blocking (it stats): call it from a thread.
    """
    here = directory
    while within(here):
        if any(os.path.exists(posixpath.join(here, m)) for m in ROOT_MARKERS):
            return here
        parent = posixpath.dirname(here)
        if parent == here:
            break
        here = parent
    below = directory == fallback or directory.startswith(fallback.rstrip("/") + "/")
    return fallback if below else directory
