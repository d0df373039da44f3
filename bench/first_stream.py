#!/usr/bin/env python3
"""
W5's first event, one sample at a time: ms from sending ``POST
/shell/stream`` of ``sh -c 'echo a; sleep 1; echo b'`` to its first
``stdout`` event, and the daemon's CPU time meanwhile (its threads, to the
nanosecond, from ``schedstat``), for each of ``--daemons`` fresh daemons:

- ``fresh``: the daemon's first request of all (after the start-up heap
  trim): it imports the process group and sets up what a first spawn needs;
- ``after_shell``: after 20 sequential ``/shell true`` and a pause;
- ``after_burst``: the moment a burst of ``/shell true`` at concurrency 8
  (W4's shape, ``--burst`` seconds; by wrk if installed) ends, as the
  shared harness runs W5 right after W4;
- ``after_burst_pause``: the same burst, then ``--pause`` seconds.

``--tree NAME=DIR`` (repeatable) runs another checkout's ``sandboxd``
(put first on the path) with this venv, alternating daemon by daemon:

    .venv/bin/python bench/first_stream.py --daemons 7 --tree base=/tmp/base

``--paired N`` takes only ``after_burst``, N times on one daemon per tree,
all daemons up side by side and the trees alternated sample by sample
(a burst of ``--burst`` seconds before each), so that a busy machine's
swings fall on every tree alike:

    .venv/bin/python bench/first_stream.py --paired 20 --burst 1 --tree base=/tmp/base
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import run_seconds, start_daemon

COMMAND = "sh -c 'echo a; sleep 1; echo b'"
#: After the daemon's heap trim (sandboxd.daemon.server.TRIM_AFTER_SECONDS).
SETTLE_SECONDS = 1.0
CASES = ("fresh", "after_shell", "after_burst", "after_burst_pause")


def first_stdout(
    conn: http.client.HTTPConnection, body: bytes, headers: dict[str, str]
) -> float:
    """Send the stream on ``conn``; the clock's time at its first stdout event."""
    conn.request("POST", "/shell/stream", body=body, headers=headers)
    response = conn.getresponse()
    if response.status != 200:
        raise SystemExit(f"/shell/stream: {response.status}")
    event = None
    while True:
        line = response.fp.readline()
        if not line:
            raise SystemExit("the stream ended before a stdout event")
        if line.startswith(b"event:"):
            event = line[6:].strip()
        elif line.startswith(b"data:") and event == b"stdout":
            return time.perf_counter()


def stream_request(token: str) -> tuple[bytes, dict[str, str]]:
    """The stream's body and headers."""
    body = json.dumps({"command": COMMAND}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return body, headers


def first_event_ms(port: int, token: str) -> float:
    """One stream on a fresh connection: ms from send to its first stdout event."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.connect()
    body, headers = stream_request(token)
    start = time.perf_counter()
    got = first_stdout(conn, body, headers)
    conn.close()
    return (got - start) * 1000


def shells(port: int, token: str, until: float, cut: bool = False) -> None:
    """
    ``/shell true`` on one keep-alive connection until ``until``; with
    ``cut``, a last one is sent and its connection closed unanswered, as
    wrk leaves the requests in flight when its time is up.
    """
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    while time.monotonic() < until:
        conn.request("POST", "/shell", body=b'{"command": "true"}', headers=headers)
        conn.getresponse().read()
    if cut:
        conn.request("POST", "/shell", body=b'{"command": "true"}', headers=headers)
    conn.close()


#: W4's request, for wrk.
WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = '{"command": "true"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("BENCH_TOKEN")
"""


def burst(port: int, token: str, seconds: float) -> None:
    """
    W4's shape: eight connections of ``/shell true`` for ``seconds``, each
    left with a request in flight at the end; by wrk (as W4) when it is
    installed, else by eight threads.
    """
    wrk = shutil.which("wrk")
    if wrk is not None:
        with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
            script.write(WRK_SCRIPT)
            script.flush()
            url = f"http://127.0.0.1:{port}/shell"
            subprocess.run(
                [wrk, "-t1", "-c8", f"-d{seconds:g}s", "-s", script.name, url],
                env={**os.environ, "BENCH_TOKEN": token},
                capture_output=True,
                check=True,
                timeout=seconds + 30,
            )
        return
    until = time.monotonic() + seconds
    threads = [
        threading.Thread(target=shells, args=(port, token, until, True))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def timed(pid: int, port: int, token: str) -> tuple[float, float]:
    """One stream's first event (ms) and the daemon's CPU meanwhile (ms)."""
    cpu = run_seconds(pid)
    ms = first_event_ms(port, token)
    return ms, (run_seconds(pid) - cpu) * 1000


def one_daemon(
    tree: str | None, args: argparse.Namespace
) -> dict[str, tuple[float, float]]:
    """Each case once on one fresh daemon of ``tree`` (None: this checkout)."""
    token = secrets.token_hex(16)
    env = {"PYTHONPATH": tree} if tree else {}
    out: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as base:
        proc, port = start_daemon(base, token, env=env)
        try:
            time.sleep(SETTLE_SECONDS)
            out["fresh"] = timed(proc.pid, port, token)
            time.sleep(1.2)
            shells(port, token, time.monotonic() + 0.3)
            time.sleep(0.5)
            out["after_shell"] = timed(proc.pid, port, token)
            time.sleep(1.2)
            burst(port, token, args.burst)
            out["after_burst"] = timed(proc.pid, port, token)
            time.sleep(1.2)
            burst(port, token, args.burst)
            time.sleep(args.pause)
            out["after_burst_pause"] = timed(proc.pid, port, token)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    return out


def paired(trees: dict[str, str | None], args: argparse.Namespace) -> None:
    """``after_burst`` ``args.paired`` times per tree, trees alternated."""
    token = secrets.token_hex(16)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as base:
        daemons: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        try:
            for name, tree in trees.items():
                env = {"PYTHONPATH": tree} if tree else {}
                os.makedirs(os.path.join(base, name))
                daemons[name] = start_daemon(os.path.join(base, name), token, env=env)
            time.sleep(SETTLE_SECONDS)
            for i in range(args.paired):
                for name, (proc, port) in daemons.items():
                    burst(port, token, args.burst)
                    sample = timed(proc.pid, port, token)
                    samples[name].append(sample)
                    if args.samples:
                        print(
                            json.dumps(
                                {
                                    "tree": name,
                                    "sample": i,
                                    "first_ms": round(sample[0], 3),
                                    "daemon_cpu_ms": round(sample[1], 3),
                                    "load_average": round(os.getloadavg()[0], 2),
                                }
                            ),
                            flush=True,
                        )
                    time.sleep(1.2)
        finally:
            for proc, _ in daemons.values():
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
    for name, got in samples.items():
        ms = [s[0] for s in got]
        cpu = [s[1] for s in got]
        print(
            json.dumps(
                {
                    "workload": "FIRST-STREAM",
                    "tree": name,
                    "case": "after_burst",
                    "samples": len(got),
                    "first_ms_median": round(statistics.median(ms), 2),
                    "first_ms_quartiles": [
                        round(q, 2) for q in statistics.quantiles(ms, n=4)
                    ],
                    "daemon_cpu_ms_median": round(statistics.median(cpu), 2),
                    "load_average": [round(x, 1) for x in os.getloadavg()],
                }
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--daemons", type=int, default=7)
    parser.add_argument("--burst", type=float, default=2.0)
    parser.add_argument("--pause", type=float, default=3.0)
    parser.add_argument("--paired", type=int, default=0, help="samples per tree")
    parser.add_argument(
        "--samples", action="store_true", help="with --paired, print every sample"
    )
    parser.add_argument(
        "--tree", action="append", default=[], help="NAME=DIR, another checkout"
    )
    args = parser.parse_args()
    os.chdir(tempfile.gettempdir())  # not this checkout's sandboxd by the cwd
    trees: dict[str, str | None] = {"this": None}
    for spec in args.tree:
        name, _, path = spec.partition("=")
        trees[name] = path
    if args.paired:
        paired(trees, args)
        return
    rows: dict[str, list[dict[str, tuple[float, float]]]] = {name: [] for name in trees}
    for _ in range(args.daemons):
        for name, tree in trees.items():
            rows[name].append(one_daemon(tree, args))
    for name, runs in rows.items():
        for case in CASES:
            ms = [r[case][0] for r in runs]
            cpu = [r[case][1] for r in runs]
            print(
                json.dumps(
                    {
                        "workload": "FIRST-STREAM",
                        "tree": name,
                        "case": case,
                        "daemons": len(runs),
                        "first_ms_median": round(statistics.median(ms), 2),
                        "first_ms": [round(x, 2) for x in ms],
                        "daemon_cpu_ms_median": round(statistics.median(cpu), 2),
                    }
                )
            )


if __name__ == "__main__":
    main()
