#!/usr/bin/env python3
"""
Where W4's CPU goes, thread by thread: a fresh daemon from ``TREE``
(``PYTHONPATH``), or the shared harness's threaded stdlib server
(``stdlib``), warmed up with a 2 s ``wrk`` run, then each thread's
running and run-queue time (``/proc/PID/task/*/schedstat``) over a
``SECONDS`` ``wrk`` run of ``/shell true`` at 8 connections; the
children's CPU (the server's ``cutime`` and ``cstime``), ``wrk``'s, and
how many of the machine's cores were busy meanwhile (``/proc/stat``)::

    .venv/bin/python bench/thread_cpu.py TREE|stdlib [SECONDS]

Whether the reactor is at a whole core (its Python is the bound) or
waits part of the time (hand-offs, a busy machine) reads off the
reactor thread's share and its run-queue wait.
"""

from __future__ import annotations

import glob
import os
import re
import resource
import secrets
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import free_port, start_daemon, wait_healthy
from switches import post_script

#: The shared harness's threaded server, as ``compare.sh stdlib-tuned`` starts it.
#: (``SHARED_BENCH``, as for ``make bench``; by default beside the checkout).
STDLIB = os.path.join(
    os.environ.get(
        "SHARED_BENCH",
        os.path.join(
            os.path.dirname(
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            ),
            "shared",
            "bench",
        ),
    ),
    "peers",
    "stdlib_server.py",
)
BENCH_PYTHON = os.path.expanduser("~/.cache/sandboxd-bench/venv/bin/python")


def threads(pid: int) -> dict[str, tuple[str, int, int, int]]:
    """Each thread's name, nanoseconds run and waited, and time slices so far."""
    out = {}
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        tid = path.split("/")[4]
        try:
            with open(path) as f:
                run, wait, slices = map(int, f.read().split())
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        out[tid] = (name, run, wait, slices)
    return out


def children_seconds(pid: int) -> float:
    """CPU seconds of ``pid``'s reaped children (clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def busy() -> tuple[int, int]:
    """The machine's busy and total jiffies so far."""
    with open("/proc/stat") as f:
        values = list(map(int, f.readline().split()[1:]))
    return sum(values) - values[3] - values[4], sum(values)


def start(tree: str, base: str, token: str) -> tuple[subprocess.Popen[bytes], int]:
    if tree != "stdlib":
        os.environ["PYTHONPATH"] = os.path.abspath(tree)
        proc, port = start_daemon(base, token, {})
        return proc, port
    port = free_port()
    argv = [BENCH_PYTHON, STDLIB, "--tuned", "--port", str(port)]
    argv += ["--pty-port", str(free_port()), "--base-dir", base]
    proc = subprocess.Popen(
        argv,
        env={**os.environ, "ABX_SERVER_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_healthy(proc, port, 10, "stdlib")
    return proc, port


def main() -> None:
    tree = sys.argv[1]
    seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    base = tempfile.mkdtemp(prefix="thread-cpu-")
    token = secrets.token_hex(8)
    proc, port = start(tree, base, token)
    script = post_script(base, token)
    url = f"http://127.0.0.1:{port}/shell"
    wrk = ["wrk", "-t1", "-c8", "-s", script, url]
    try:
        subprocess.run([*wrk, "-d2"], capture_output=True)
        before = threads(proc.pid), children_seconds(proc.pid), busy()
        own = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.monotonic()
        report = subprocess.run([*wrk, f"-d{seconds}"], capture_output=True, text=True)
        wall = time.monotonic() - began
        after = threads(proc.pid), children_seconds(proc.pid), busy()
        own_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        proc.terminate()
        proc.wait()
    found = re.search(r"(\d+) requests in", report.stdout)
    n = int(found.group(1)) if found else 0
    if not n:
        raise SystemExit(f"wrk: {report.stdout} {report.stderr}")
    print(f"{tree}: {n / wall:.0f} commands/s, load {os.getloadavg()[0]:.2f}")
    total = 0
    for tid, (name, run, wait, slices) in sorted(after[0].items()):
        _, run0, wait0, slices0 = before[0].get(tid, (name, 0, 0, 0))
        total += run - run0
        if run - run0 < 1e6:
            continue
        print(
            f"  {tid:>8} {name:16} running {100 * (run - run0) / 1e9 / wall:5.1f}% "
            f"of a core, {(run - run0) / n / 1e3:6.1f} µs/command; "
            f"waiting for a CPU {(wait - wait0) / n / 1e3:6.1f} µs/command; "
            f"{(slices - slices0) / n:.2f} slices/command"
        )
    wrk_cpu = (own_after.ru_utime + own_after.ru_stime) - (own.ru_utime + own.ru_stime)
    machine = (after[2][0] - before[2][0]) / (after[2][1] - before[2][1])
    print(
        f"  server threads {total / n / 1e3:.0f} µs/command; children "
        f"{(after[1] - before[1]) / n * 1e6:.0f} µs/command; wrk "
        f"{wrk_cpu / n * 1e6:.0f} µs/command; machine busy "
        f"{machine * (os.cpu_count() or 1):.2f} cores"
    )


if __name__ == "__main__":
    main()
