#!/usr/bin/env python3
"""
The kernel's own ceiling for W6's ``seq 1 300000`` through a terminal.

Runs ``seq`` on a fresh pseudo-terminal, with no daemon, no WebSocket and
no JSON, and reads the master side as fast as the kernel hands it over
(64 KiB reads in a tight loop).  ``seq`` writes a tty line by line, so
this is the most any server can relay; W6's MB/s for every server should
be compared with it.  Prints one JSON line per round and the median.

    .venv/bin/python bench/pty_ceiling.py [--rounds 5] [--lines 300000]
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import statistics
import time

MiB = 1024 * 1024


def one_round(lines: int) -> dict[str, float]:
    """``seq 1 lines`` on a new pty; bytes, reads and MB/s as read."""
    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.execvp("seq", ["seq", "1", str(lines)])
    began = time.perf_counter()
    total = reads = 0
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its side
                break
            if not data:
                break
            total += len(data)
            reads += 1
    finally:
        seconds = time.perf_counter() - began
        os.close(master)
        os.waitpid(pid, 0)
    return {
        "bytes": total,
        "reads": reads,
        "seconds": round(seconds, 4),
        "mb_per_s": round(total / MiB / seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lines", type=int, default=300000)
    args = parser.parse_args()
    rates = []
    for _ in range(args.rounds):
        result = one_round(args.lines)
        rates.append(result["mb_per_s"])
        print(json.dumps({"workload": "PTY-CEILING", **result}))
    print(
        json.dumps(
            {
                "workload": "PTY-CEILING",
                "case": f"seq 1 {args.lines}, no server",
                "median_mb_per_s": round(statistics.median(rates), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
