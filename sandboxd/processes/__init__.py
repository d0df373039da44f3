"""
The children of the daemon (SPEC §7.4, §11.2–§11.4).

- :mod:`~sandboxd.processes.child`: the one ``ProcessProtocol`` and its
  output cap;
- :mod:`~sandboxd.processes.run`: starting children and running them to
  completion;
- :mod:`~sandboxd.processes.service`: the table of background processes;
- :mod:`~sandboxd.processes.command` and
  :mod:`~sandboxd.processes.environment`: what a child runs, as whom, with
  which environment;
- :mod:`~sandboxd.processes.spawning` and
  :mod:`~sandboxd.processes.posix_spawn`: how it is started in its own
  session;
- :mod:`~sandboxd.processes.tree`: finding and ending a child's whole tree.

The names below are the package's face: ``sandboxd.processes.Child`` and the
rest keep working as they did when this was one module.
"""

from sandboxd.processes.child import (
    DEFAULT_CAPTURE_BYTES,
    DEFAULT_RETENTION_BYTES,
    STREAM_NAMES,
    Child,
    ChildTable,
    HeadTail,
    OutputCallback,
    signal_child,
    timeout_error,
)
from sandboxd.processes.run import ENV_PROGRAM, RunResult, end_all, run_collect, spawn
from sandboxd.processes.service import Managed, ProcessService

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
    "end_all",
    "run_collect",
    "signal_child",
    "spawn",
    "timeout_error",
]
