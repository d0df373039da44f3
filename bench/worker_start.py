#!/usr/bin/env python3
"""
How long the reactor is held while the spawn workers start: in a fresh
process per tree (``PYTHONPATH``), the first four jobs handed to the spawn
threads (each starts a worker) are timed on the reactor, while
``--burners`` busy loops keep the CPUs taken (as W4's children do)::

    .venv/bin/python bench/worker_start.py TREE_A TREE_B [--rounds 6] [--burners 2]

Rounds alternate the trees (A B A B ...); each prints the four calls'
milliseconds on the reactor as ``wall/asleep`` and the load average then.
``asleep`` is the wall time less the reactor thread's own CPU time and its
wait on a run queue (``/proc/thread-self/schedstat``): the time it was
blocked (on a lock, or for the interpreter's lock), as opposed to
preempted by the burners, which any code is.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

#: Run in the probe's process: four jobs, each starting a worker, timed.
CHILD = """
import os, time
from twisted.internet import reactor
from twisted.internet.defer import gatherResults
from sandboxd.processes.spawning import _SpawnThreads

pool = _SpawnThreads(size=4)
took = []

def waited():
    with open(f"/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1]) / 1e6

def go():
    waits = []
    for _ in range(4):
        pool.in_flight += 1
        began, cpu, queued = time.perf_counter(), time.thread_time(), waited()
        waits.append(pool.run(reactor, time.sleep, 0.05))
        wall = (time.perf_counter() - began) * 1000
        ran = (time.thread_time() - cpu) * 1000
        took.append((wall, wall - ran - (waited() - queued)))
    gatherResults(waits).addBoth(lambda _: reactor.stop())

reactor.callWhenRunning(go)
reactor.run()
print(" ".join(f"{wall:.2f}/{asleep:.2f}" for wall, asleep in took))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trees", nargs=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--burners", type=int, default=2)
    options = parser.parse_args()
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(options.burners)
    ]
    try:
        time.sleep(1)
        for n in range(options.rounds):
            for tree in options.trees:
                env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
                out = subprocess.run(
                    [sys.executable, "-c", CHILD],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                asleep = [float(x.split("/")[1]) for x in out]
                print(
                    f"round {n} {tree}: {' '.join(out)} ms"
                    f" (asleep max {max(asleep):.2f}),"
                    f" load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


if __name__ == "__main__":
    main()
