#!/usr/bin/env python3
"""
Run a Python program (``twistd``) with a profiler that is on only between
two signals, so a profile holds the calls being measured and none of the
start-up or the warm-up.

    python bench/profiled.py OUT PROGRAM [ARGS...]

``SIGUSR1`` turns ``cProfile`` on, ``SIGUSR2`` turns it off and writes the
statistics to ``OUT`` (read them with ``pstats``).  The handlers run on the
main thread between two bytecodes, which for ``twistd -n`` is the reactor's
thread: what it does on other threads is not counted.
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys
from types import FrameType


def main() -> None:
    out, program = sys.argv[1], sys.argv[2]
    profile = cProfile.Profile()

    def start(_signum: int, _frame: FrameType | None) -> None:
        profile.enable()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        profile.disable()
        profile.dump_stats(out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = sys.argv[2:]
    runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main()
