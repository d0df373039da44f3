#!/usr/bin/env python3
"""
The fixed cost of one call at concurrency 1, in instructions and in
profiles rather than in wall-clock time: on a shared, loaded machine
``callgrind``'s instruction counts repeat where req/s do not.

For each case a fresh daemon (or the Twisted floor, ``--server floor``)
serves ``--calls`` requests on one keep-alive connection after a warm-up:

- ``--mode callgrind``: the daemon runs under ``valgrind --tool=callgrind``;
  the counters are zeroed after the warm-up and dumped after the calls, so
  the figure is the daemon's instructions per call (its children are not
  traced: ``/shell true`` counts the daemon's side of a spawn only);
- ``--mode cprofile``: the daemon runs under ``cProfile``; the top frames
  by own time are printed (warm-up included);
- ``--mode time``: plain, microseconds per call (noisy when the machine is).

    .venv/bin/python bench/percall.py --mode callgrind --calls 2000 [--cases health,json,shell]

One JSON line per case.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import os
import pstats
import secrets
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import free_port, start_daemon, wait_healthy

#: case → (method, path, JSON body)
CASES: dict[str, tuple[str, str, Any]] = {
    "health": ("GET", "/health", None),
    "json": ("GET", "/process/list", None),
    "shell": ("POST", "/shell", {"command": "true"}),
}

HERE = os.path.dirname(os.path.abspath(__file__))
FLOOR = os.path.join(HERE, "..", "..", "shared", "bench", "peers", "twisted_floor.py")


def calls(port: int, token: str, case: str, n: int) -> float:
    """``n`` requests of ``case`` on one connection; seconds taken."""
    method, path, body = CASES[case]
    payload = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {token}"}
    if payload is not None:
        headers["Content-Type"] = "application/json"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    began = time.perf_counter()
    for _ in range(n):
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"{method} {path}: {response.status}")
    took = time.perf_counter() - began
    conn.close()
    return took


def _start(args: argparse.Namespace, base: str, token: str, prefix: list[str]) -> Any:
    if args.server == "floor":
        import subprocess

        port = free_port()
        proc = subprocess.Popen(
            [*prefix, sys.executable, args.floor, "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_healthy(proc, port, 120, "floor")
        return proc, port
    env = {"PYTHONHASHSEED": "0"}
    if args.tree:
        # Another checkout's code (a commit exported with git archive).
        env["PYTHONPATH"] = os.path.abspath(args.tree)
    return start_daemon(base, token, prefix=prefix, wait_seconds=120, env=env)


def _callgrind_total(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def run_case(args: argparse.Namespace, case: str) -> dict[str, Any]:
    token = secrets.token_hex(16)
    work = tempfile.mkdtemp(prefix="percall-")
    base = os.path.join(work, "base")
    os.makedirs(base)
    prefix: list[str] = []
    out = os.path.join(work, "out")
    if args.mode == "callgrind":
        prefix = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=yes",
            f"--callgrind-out-file={out}.%p",
        ]
    elif args.mode == "cprofile":
        prefix = [sys.executable, "-m", "cProfile", "-o", out]
    proc, port = _start(args, base, token, prefix)
    row: dict[str, Any] = {
        "workload": "PERCALL",
        "case": case,
        "server": args.server,
        "mode": args.mode,
    }
    try:
        calls(port, token, case, args.warmup)
        if args.mode == "callgrind":
            os.system(f"callgrind_control -z {proc.pid} >/dev/null")
        took = calls(port, token, case, args.calls)
        row["us_per_call"] = round(took / args.calls * 1e6, 1)
        if args.mode == "callgrind":
            os.system(f"callgrind_control -d {proc.pid} >/dev/null")
            dumps = sorted(glob.glob(f"{out}.{proc.pid}.*"))
            row["instructions_per_call"] = round(
                _callgrind_total(dumps[-1]) / args.calls
            )
            if args.keep:
                # For ``callgrind_annotate --inclusive=yes``: where they went.
                kept = os.path.join(args.keep, f"callgrind.{case}.{args.server}")
                shutil.copyfile(dumps[-1], kept)
                row["callgrind_out"] = kept
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except Exception:
            os.killpg(proc.pid, signal.SIGKILL)
    if args.mode == "cprofile":
        stats = pstats.Stats(out)
        stats.sort_stats("tottime")
        _width, entries = stats.get_print_list([args.top])  # type: ignore[attr-defined]
        top = []
        for func in entries:
            _cc, nc, tt, ct, _ = stats.stats[func]  # type: ignore[attr-defined]
            top.append(
                {
                    "frame": pstats.func_std_string(func),
                    "calls": nc,
                    "own_us_per_call": round(
                        tt / max(1, args.calls + args.warmup) * 1e6, 2
                    ),
                    "cum_us_per_call": round(
                        ct / max(1, args.calls + args.warmup) * 1e6, 2
                    ),
                }
            )
        row["top"] = top
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--mode", choices=("callgrind", "cprofile", "time"), default="time")
    ap.add_argument("--server", choices=("sandboxd", "floor"), default="sandboxd")
    ap.add_argument("--floor", default=FLOOR, help="the Twisted floor peer")
    ap.add_argument("--cases", default="health,json,shell")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--tree", help="run the daemon from this checkout (PYTHONPATH)")
    ap.add_argument("--keep", help="callgrind: copy each case's counts to this folder")
    args = ap.parse_args()
    cases = args.cases.split(",")
    if args.server == "floor":
        cases = ["health"]
    for case in cases:
        print(json.dumps(run_case(args, case)), flush=True)


if __name__ == "__main__":
    main()
