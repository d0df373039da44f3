# -*- test-case-name: tests.kernels.test_contexts -*-
"""
Jupyter kernelspecs, read by the daemon itself (no ``jupyter_client``).

sandboxd spawns each kernel from its ``kernel.json`` (argv with
``{connection_file}``, ``env``, ``interrupt_mode``), so the kernel is a
child the daemon governs; a launcher that starts a new session would take
it out of the tree kill.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from sandboxd.processes.command import RunAs

#: The kernel a context gets when the request names none.
DEFAULT_KERNEL = "python3"

#: The built-in kernel (stdlib only), used where no ipykernel is installed.
BUILTIN_KERNEL = "sandboxd-python"

#: The built-in bash kernel: one shell whose state carries between
#: executions (where the sandbox has bash).
BASH_KERNEL = "sandboxd-bash"

#: The built-in kernel's program, run by the sandbox's own Python.
REPL_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "repl.py")


@attrs.frozen
class KernelSpec:
    """One kernel the daemon may start."""

    name: str
    display_name: str
    language: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    interrupt_mode: str
    resource_dir: str
    source: str = "kernelspec"

    def describe(self, allowed: bool) -> dict[str, Any]:
        """The ``code_kernels`` entry."""
        return {
            "name": self.name,
            "display_name": self.display_name,
            "language": self.language,
            "argv0": self.argv[0] if self.argv else None,
            "interrupt_mode": self.interrupt_mode,
            "source": self.source,
            "allowed": allowed,
        }


def kernel_dirs(environ: Mapping[str, str]) -> list[str]:
    """Where kernelspecs live, most specific first (Jupyter's order)."""
    dirs = [
        os.path.join(p, "kernels")
        for p in environ.get("JUPYTER_PATH", "").split(os.pathsep)
        if p
    ]
    home = environ.get("HOME") or os.path.expanduser("~")
    dirs.append(os.path.join(home, ".local", "share", "jupyter", "kernels"))
    dirs.append(os.path.join(sys.prefix, "share", "jupyter", "kernels"))
    dirs += ["/usr/local/share/jupyter/kernels", "/usr/share/jupyter/kernels"]
    return dirs


def _read(directory: str, name: str) -> KernelSpec | None:
    path = os.path.join(directory, name, "kernel.json")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    argv = raw.get("argv") if isinstance(raw, dict) else None
    if (
        not isinstance(argv, list)
        or not argv
        or not all(isinstance(a, str) for a in argv)
    ):
        return None
    env = raw.get("env") or {}
    if not isinstance(env, dict):
        env = {}
    return KernelSpec(
        name=name,
        display_name=str(raw.get("display_name") or name),
        language=str(raw.get("language") or "").lower(),
        argv=tuple(argv),
        env={str(k): str(v) for k, v in env.items()},
        interrupt_mode=raw.get("interrupt_mode")
        if raw.get("interrupt_mode") in ("signal", "message")
        else "signal",
        resource_dir=os.path.dirname(path),
    )


def builtin_spec(environ: Mapping[str, str]) -> KernelSpec:
    """``sandboxd-python``: the sandbox's ``python3`` running :mod:`repl`."""
    from sandboxd.processes.command import find_executable

    python = find_executable("python3", environ) or sys.executable
    return KernelSpec(
        name=BUILTIN_KERNEL,
        display_name="Python 3 (sandboxd, no ipykernel)",
        language="python",
        argv=(python, "-u", REPL_SCRIPT),
        env={},
        interrupt_mode="signal",
        resource_dir=os.path.dirname(REPL_SCRIPT),
        source="builtin",
    )


def builtin_bash_spec(environ: Mapping[str, str]) -> KernelSpec | None:
    """``sandboxd-bash``: :mod:`repl` running bash, if the sandbox has bash."""
    from sandboxd.processes.command import find_executable

    if find_executable("bash", environ) is None:
        return None
    python = find_executable("python3", environ) or sys.executable
    return KernelSpec(
        name=BASH_KERNEL,
        display_name="Bash (sandboxd)",
        language="bash",
        argv=(python, "-u", REPL_SCRIPT, "bash"),
        env={},
        interrupt_mode="signal",
        resource_dir=os.path.dirname(REPL_SCRIPT),
        source="builtin",
    )


def _permits(st: os.stat_result, uid: int, gids: set[int], bit: int) -> bool:
    """Whether the mode bits of ``st`` give ``bit`` (4 read, 1 search/run) to the user."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & (bit << 6))
    if st.st_gid in gids:
        return bool(st.st_mode & (bit << 3))
    return bool(st.st_mode & bit)


def usable_by(path: str, uid: int, gids: set[int], bit: int) -> bool:
    """
    Whether the user of ``uid`` and ``gids`` may read (``bit`` 4) or run
    (1) the file ``path``: every directory on the way to the file it
    resolves to searchable, and the file's own bit.  A ``#!`` script is
    read by its interpreter, as the user, by the name it was run by: that
    path's directories count too, and its read bit.  Asked by the root
    daemon on the user's behalf, so :func:`os.access` (which answers for
    root) cannot.
    """
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            script = f.read(2) == b"#!"
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    ways = [os.path.realpath(path)]
    if bit == 4 or script:
        ways.append(os.path.abspath(path))
    for where in dict.fromkeys(ways):
        directory = os.path.dirname(where)
        while True:
            try:
                if not _permits(os.stat(directory), uid, gids, 1):
                    return False
            except OSError:
                return False
            if directory == "/":
                break
            directory = os.path.dirname(directory)
    if bit == 1 and script and not _permits(st, uid, gids, 4):
        return False
    return _permits(st, uid, gids, bit)


def builtin_python(environ: Mapping[str, str], run_as: RunAs | None) -> str:
    """
    The interpreter of the built-in kernels: the first ``python3`` on the
    kernel's ``PATH`` that its user may run (a root daemon's ``PATH`` may
    start with a directory only root enters, such as a ``pyenv`` shim
    under ``/root``), else the daemon's own Python if the user may run it.

    :raises ValueError: the user can run none, or cannot read the kernel's
        script; the message says which and what to do.
    """
    from sandboxd.processes.command import find_executable

    if run_as is None:
        return find_executable("python3", environ) or sys.executable
    gids = set(os.getgrouplist(run_as.name, run_as.gid))
    if not usable_by(REPL_SCRIPT, run_as.uid, gids, 4):
        raise ValueError(
            f"the built-in kernel's script {REPL_SCRIPT} cannot be read by"
            f" {run_as.name!r}: install sandboxd where that user can read it"
            " (not under a directory only root enters)"
        )
    first = None
    for directory in environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", "python3")
        if not os.path.isfile(candidate):
            continue
        first = first or candidate
        if usable_by(candidate, run_as.uid, gids, 1):
            return candidate
    if usable_by(sys.executable, run_as.uid, gids, 1):
        return sys.executable
    tried = f" ({first} is not)" if first else ""
    raise ValueError(
        f"no python3 on the kernel's PATH that {run_as.name!r} can run{tried}:"
        " install one that user may run, or give the context a PATH"
        " (env.PATH) that leads to one"
    )


def _builtins(found: dict[str, KernelSpec], environ: Mapping[str, str]) -> None:
    """Add the built-in kernels to ``found`` where no kernelspec has their names."""
    found.setdefault(BUILTIN_KERNEL, builtin_spec(environ))
    bash = builtin_bash_spec(environ)
    if bash is not None:
        found.setdefault(BASH_KERNEL, bash)


def jupyter_usable() -> bool:
    """
    Whether the hub can run (the ``code`` extra is installed for the
    daemon's Python); found without importing it.
    """
    import importlib.util

    return all(
        importlib.util.find_spec(m) is not None for m in ("jupyter_client", "zmq")
    )


def find_kernelspecs(environ: Mapping[str, str]) -> dict[str, KernelSpec]:
    """
    Every kernel the daemon can start, by name: the kernelspecs on the
    search path (the first one of a name wins; none when the hub's
    libraries are missing) and the built-in ``sandboxd-python`` and
    ``sandboxd-bash``.
    """
    found: dict[str, KernelSpec] = {}
    if not jupyter_usable():
        _builtins(found, environ)
        return found
    for directory in kernel_dirs(environ):
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if name in found:
                continue
            spec = _read(directory, name)
            if spec is not None:
                found[name] = spec
    _builtins(found, environ)
    return found


def kernel_argv(spec: KernelSpec, connection_file: str) -> list[str]:
    """
    The argv to spawn: ``{connection_file}`` and ``{resource_dir}``
    substituted; a spec installed with the daemon's own Python (its
    ``sys.prefix``) that says ``python`` runs that Python, as Jupyter does.
    """
    argv = [
        a.replace("{connection_file}", connection_file).replace(
            "{resource_dir}", spec.resource_dir
        )
        for a in spec.argv
    ]
    ours = spec.resource_dir.startswith(os.path.join(sys.prefix, "share") + os.sep)
    if ours and argv[0] in ("python", "python3", f"python3.{sys.version_info[1]}"):
        argv[0] = sys.executable
    return argv
