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
import sys
from collections.abc import Mapping
from typing import Any

import attrs

#: The kernel a context gets when the request names none.
DEFAULT_KERNEL = "python3"


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


def find_kernelspecs(environ: Mapping[str, str]) -> dict[str, KernelSpec]:
    """Every kernelspec on the search path, by name (the first one wins)."""
    found: dict[str, KernelSpec] = {}
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
