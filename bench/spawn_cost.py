#!/usr/bin/env python3
"""
The daemon's side of a short command without HTTP: ``run_collect(["true"])``
run ``N`` times, ``C`` at once, on a real reactor in this process, with the
policy's default priorities on (``prio``) or off (``noprio``).

What it prints is this process's CPU time per command (user and system,
all threads: the spawn workers too) and the wall-clock time per command.
The children's own time is not counted.  Under ``valgrind --tool=callgrind``
the difference between two runs of different ``N`` gives the instructions
per command, which a loaded machine does not move::

    .venv/bin/python bench/spawn_cost.py TREE 2000 8 prio
    for n in 100 500; do valgrind --tool=callgrind --callgrind-out-file=cg.$n \\
        .venv/bin/python bench/spawn_cost.py TREE $n 8 prio; done
    # (totals of cg.500 - totals of cg.100) / 400

``TREE`` is the checkout whose ``sandboxd`` is measured (a commit exported
with ``git archive``, or ``.``).
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any


def main() -> None:
    tree, n, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    priorities_on = len(sys.argv) <= 4 or sys.argv[4] != "noprio"
    sys.path.insert(0, os.path.abspath(tree))
    from twisted.internet import defer, reactor

    from sandboxd.policy.priorities import Priorities
    from sandboxd.processes.priority import CHILD_PRIORITY
    from sandboxd.processes.run import run_collect
    from sandboxd.processes.table import ChildTable

    if priorities_on:
        CHILD_PRIORITY.configure(Priorities())
    table = ChildTable()
    env = dict(os.environ)
    out: dict[str, float] = {}

    async def worker(count: int) -> None:
        for _ in range(count):
            result = await run_collect(
                reactor,
                ["true"],
                children=table,
                env=env,
                cwd="/tmp",
                timeout=30,
                max_output_bytes=1 << 20,
            )
            assert result.exit_code == 0

    def together(count: int) -> Any:
        return defer.DeferredList(
            [
                defer.ensureDeferred(worker(count // concurrency))
                for _ in range(concurrency)
            ]
        )

    async def measure() -> None:
        await together(max(concurrency, 50))  # warm-up: caches, threads
        before = resource.getrusage(resource.RUSAGE_SELF)
        began = time.perf_counter()
        await together(n)
        took = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_SELF)
        out["user_us"] = (after.ru_utime - before.ru_utime) / n * 1e6
        out["system_us"] = (after.ru_stime - before.ru_stime) / n * 1e6
        out["wall_us"] = took / n * 1e6

    def start() -> None:
        d = defer.ensureDeferred(measure())
        d.addErrback(lambda failure: failure.printTraceback())
        d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(start)
    reactor.run()
    out["cpu_us"] = out["user_us"] + out["system_us"]
    print(
        {k: round(v, 1) for k, v in out.items()},
        "load",
        os.getloadavg()[0],
        flush=True,
    )


if __name__ == "__main__":
    main()
