"""
The children of the daemon (SPEC §7.4, §11.2–§11.4).

- :mod:`~sandboxd.processes.child`: the one ``ProcessProtocol`` and its
  output cap;
- :mod:`~sandboxd.processes.run`: starting children and running them to
  completion;
- :mod:`~sandboxd.processes.service` and :mod:`~sandboxd.processes.managed`:
  the table of background processes, and one of them;
- :mod:`~sandboxd.processes.table`: the daemon's table of its children;
- :mod:`~sandboxd.processes.command` and
  :mod:`~sandboxd.processes.environment`: what a child runs, as whom, with
  which environment;
- :mod:`~sandboxd.processes.spawning` and
  :mod:`~sandboxd.processes.posix_spawn`: how it is started in its own
  session;
- :mod:`~sandboxd.processes.tree`: finding and ending a child's whole tree;
- :mod:`~sandboxd.processes.reaping`: reaping the child that exited, on
  SIGCHLD, without asking every other one.

The names below are the package's face: ``sandboxd.processes.Child`` and the
rest keep working as they did when this was one module. They are imported
on first use (PEP 562): the daemon starts before any child does, and
importing one submodule (the guard reads ``command``) must not import them
all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandboxd.lazyexports import lazy_exports

if TYPE_CHECKING:
    from sandboxd.processes.child import (
        DEFAULT_CAPTURE_BYTES,
        DEFAULT_RETENTION_BYTES,
        STREAM_NAMES,
        Child,
        HeadTail,
        OutputCallback,
        count_leftovers,
        signal_child,
        signal_exited_tree,
        timeout_error,
    )
    from sandboxd.processes.managed import Managed
    from sandboxd.processes.run import (
        ENV_PROGRAM,
        RunResult,
        end_all,
        held_directory,
        run_collect,
        spawn,
    )
    from sandboxd.processes.service import ProcessService
    from sandboxd.processes.table import ChildTable

#: Name -> the submodule that defines it.
_EXPORTS = {
    "DEFAULT_CAPTURE_BYTES": "sandboxd.processes.child",
    "DEFAULT_RETENTION_BYTES": "sandboxd.processes.child",
    "STREAM_NAMES": "sandboxd.processes.child",
    "Child": "sandboxd.processes.child",
    "HeadTail": "sandboxd.processes.child",
    "OutputCallback": "sandboxd.processes.child",
    "count_leftovers": "sandboxd.processes.child",
    "signal_child": "sandboxd.processes.child",
    "signal_exited_tree": "sandboxd.processes.child",
    "timeout_error": "sandboxd.processes.child",
    "ENV_PROGRAM": "sandboxd.processes.run",
    "RunResult": "sandboxd.processes.run",
    "end_all": "sandboxd.processes.run",
    "held_directory": "sandboxd.processes.run",
    "run_collect": "sandboxd.processes.run",
    "spawn": "sandboxd.processes.run",
    "Managed": "sandboxd.processes.managed",
    "ProcessService": "sandboxd.processes.service",
    "ChildTable": "sandboxd.processes.table",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = [
    "DEFAULT_CAPTURE_BYTES",
    "DEFAULT_RETENTION_BYTES",
    "ENV_PROGRAM",
    "STREAM_NAMES",
    "Child",
    "ChildTable",
    "HeadTail",
    "Managed",
    "OutputCallback",
    "ProcessService",
    "RunResult",
    "count_leftovers",
    "end_all",
    "held_directory",
    "run_collect",
    "signal_child",
    "signal_exited_tree",
    "spawn",
    "timeout_error",
]
