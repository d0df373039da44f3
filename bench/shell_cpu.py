#!/usr/bin/env python3
"""
W4's shape (``/shell true`` at 8 connections, by ``wrk``) and where its CPU
goes: for each server, commands/s and the CPU per command of the server's
threads (those that ended too: a threaded server's, from ``/proc/PID/stat``),
of the children it reaped, and of the whole machine (from
``/proc``), each server fresh and the servers alternated ``--rounds``
times so that a machine's swings fall on each alike.

    .venv/bin/python bench/shell_cpu.py --rounds 8 \\
        --policy default={} --policy priority-off='{"priority": false}'

``--policy NAME=JSON`` (repeatable) runs sandboxd with that policy;
``--stdlib`` adds the threaded stdlib server of the shared harness
(``../shared/bench/peers/stdlib_server.py --tuned``). One JSON line per
run, then one per server with the medians and ranges.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import cpu_seconds, free_port, start_daemon, stop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STDLIB = os.path.join(ROOT, "..", "shared", "bench", "peers", "stdlib_server.py")


def machine_ticks() -> tuple[int, int]:
    """Busy and total clock ticks of every CPU so far (``/proc/stat``)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def reaped_seconds(pid: int) -> float:
    """CPU time of the children ``pid`` has reaped so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def burst(port: int, token: str | None, seconds: int, script: str) -> int:
    """``wrk`` at 8 connections for ``seconds``: the commands it had answered."""
    with open(script, "w") as f:
        f.write('wrk.method = "POST"\nwrk.body = \'{"command": "true"}\'\n')
        f.write('wrk.headers["Content-Type"] = "application/json"\n')
        if token:
            f.write(f'wrk.headers["Authorization"] = "Bearer {token}"\n')
    url = f"http://127.0.0.1:{port}/shell"
    out = subprocess.run(
        ["wrk", "-t2", "-c8", f"-d{seconds}s", "-s", script, url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = re.search(r"(\d+) requests in", out)
    if found is None:
        raise SystemExit(f"wrk said: {out}")
    return int(found.group(1))


def measure(
    name: str, pid: int, port: int, token: str | None, seconds: int
) -> dict[str, Any]:
    """One warm-up second, then one measured burst."""
    script = os.path.join(tempfile.mkdtemp(), "post.lua")
    burst(port, token, 1, script)
    time.sleep(0.5)
    ran, reaped, (busy, total) = cpu_seconds(pid), reaped_seconds(pid), machine_ticks()
    commands = burst(port, token, seconds, script)
    tick = 1e6 / os.sysconf("SC_CLK_TCK")
    busy_after, total_after = machine_ticks()
    return {
        "workload": "SHELL-CPU",
        "server": name,
        "commands_per_s": round(commands / seconds),
        "server_us": round((cpu_seconds(pid) - ran) * 1e6 / commands),
        "children_us": round((reaped_seconds(pid) - reaped) * 1e6 / commands),
        "machine_busy_us": round((busy_after - busy) * tick / commands),
        "machine_total_us": round((total_after - total) * tick / commands),
        "load": round(os.getloadavg()[0], 2),
    }


def run_sandboxd(name: str, policy: dict[str, Any], seconds: int) -> dict[str, Any]:
    token = secrets.token_hex(8)
    proc, port = start_daemon(tempfile.mkdtemp(), token, policy)
    try:
        return measure(name, proc.pid, port, token, seconds)
    finally:
        stop(proc)


def run_stdlib(seconds: int) -> dict[str, Any]:
    port = free_port()
    argv = [sys.executable, STDLIB, "--tuned", "--port", str(port)]
    argv += ["--pty-port", str(free_port()), "--base-dir", tempfile.mkdtemp()]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.5)
        return measure("stdlib-tuned", proc.pid, port, None, seconds)
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--policy", action="append", default=[], metavar="NAME=JSON")
    ap.add_argument("--stdlib", action="store_true")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed")
    policies = [p.split("=", 1) for p in args.policy] or [["default", "{}"]]
    rows: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        if args.stdlib:
            rows.append(run_stdlib(args.seconds))
            print(json.dumps(rows[-1]), flush=True)
        for name, document in policies:
            rows.append(run_sandboxd(name, json.loads(document), args.seconds))
            print(json.dumps(rows[-1]), flush=True)
    for name in dict.fromkeys(r["server"] for r in rows):
        mine = [r for r in rows if r["server"] == name]
        rates = [r["commands_per_s"] for r in mine]
        summary: dict[str, Any] = {
            "workload": "SHELL-CPU",
            "server": name,
            "runs": len(mine),
            "commands_per_s_median": statistics.median(rates),
            "commands_per_s_range": [min(rates), max(rates)],
        }
        for key in ("server_us", "children_us", "machine_busy_us"):
            summary[key + "_median"] = statistics.median(r[key] for r in mine)
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
