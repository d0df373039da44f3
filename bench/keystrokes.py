#!/usr/bin/env python3
"""
Keystroke echo through the terminal WebSocket, one keystroke at a time,
with each keystroke's position kept: which ones are slow, not only how
slow the slowest are.

W6 of the shared harness sends 200 single keystrokes into ``cat`` and
reports the p99 of their round trips, that is the third-slowest of 200:
three slow keystrokes decide it.  This bench runs the same loop (the same
``websockets`` client, the same JSON messages, ``cat`` started first) for
several rounds, each against a freshly started daemon as W6's is, and
prints every keystroke as a JSON line (round, tree, index, round trip)
before a summary per tree: the median p50/p99 of the rounds, the indexes
the slow keystrokes fell on (the first few of a round point at a cold
path, a steady period at a timer, anything else at scheduling) and the
daemon's CPU time per keystroke, which the machine's load stretches less
than wall-clock time.

Several trees compare in one run, alternated round by round::

    .venv/bin/python bench/keystrokes.py --rounds 20 \\
        --tree base=/tmp/old-checkout --tree this=.

A tree is put first on the daemon's ``PYTHONPATH``; ``.`` is this checkout.
The shared harness's peers join the same rotation by their command, as
``compare.sh`` starts them (``--peer NAME='COMMAND'`` with ``{port}``,
``{pty_port}``, ``{base_dir}``).  Needs the ``websockets`` package (13 or
later) where it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import free_port, run_seconds, start_daemon, wait_healthy

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def w6_percentile(values: list[float], p: float) -> float:
    """The harness's percentile: the nearest rank, no interpolation."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100.0 * (len(s) - 1))))]


def new_session(port: int, token: str, shell: str | None = None) -> dict[str, Any]:
    """``POST /pty/sessions``: the session's JSON (its id and socket URL)."""
    body: dict[str, Any] = {"cols": 80, "rows": 24}
    if shell:
        body["shell"] = shell
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/pty/sessions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def start_burners(port: int, token: str, count: int) -> None:
    """
    ``count`` CPU burners started through the daemon (``/process/start``),
    as an agent's build would be: the sandbox busy while someone types.
    """
    burn = json.dumps({"command": f"{sys.executable} -c 'while True: pass'"})
    for _ in range(count):
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/process/start",
            data=burn.encode(),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()


async def drain(ws: Any, quiet: float) -> None:
    """Read until ``quiet`` seconds pass with nothing."""
    while True:
        try:
            await asyncio.wait_for(ws.recv(), quiet)
        except TimeoutError:
            return


async def keystrokes(
    url: str,
    token: str,
    count: int,
    pid: int,
    warmup: int = 0,
    measure: Callable[[str], None] | None = None,
    wait: float = 5.0,
    into: str = "cat",
) -> dict[str, Any]:
    """
    ``into`` (``cat``: the terminal's line discipline echoes; a shell
    with line editing echoes itself), then ``count`` keystrokes each timed until its echo: the
    round trips (seconds, in order) and the daemon's CPU seconds over them.
    ``warmup`` keystrokes go first, untimed; ``measure("start")`` and
    ``measure("stop")`` are called around the timed ones.
    """
    from websockets.asyncio.client import connect

    async with connect(
        url,
        additional_headers={"Authorization": f"Bearer {token}"},
        max_size=None,
        open_timeout=max(10.0, wait),
        close_timeout=2,
    ) as ws:
        extensions = [getattr(e, "name", str(e)) for e in ws.protocol.extensions or []]
        await asyncio.wait_for(ws.recv(), max(10.0, wait))  # started
        await drain(ws, 0.5)
        await ws.send(json.dumps({"type": "input", "data": into + "\r"}))
        await drain(ws, 0.3)
        for i in range(warmup):
            await ws.send(json.dumps({"type": "input", "data": LETTERS[i % 26]}))
            await asyncio.wait_for(ws.recv(), wait)
        rtts: list[float] = []
        sent: list[float] = []
        lost = 0
        if measure is not None:
            measure("start")
        cpu_before = run_seconds(pid)
        for i in range(count):
            ch = LETTERS[i % 26]
            began = time.perf_counter()
            sent.append(time.monotonic())
            await ws.send(json.dumps({"type": "input", "data": ch}))
            while True:
                try:
                    message = json.loads(await asyncio.wait_for(ws.recv(), wait))
                except TimeoutError:
                    lost += 1
                    rtts.append(float("nan"))
                    break
                if message.get("type") == "output" and ch in message.get("data", ""):
                    rtts.append(time.perf_counter() - began)
                    break
        cpu = run_seconds(pid) - cpu_before
        if measure is not None:
            measure("stop")
        await ws.send(json.dumps({"type": "input", "data": "\r\x04"}))
        await drain(ws, 0.2)
    return {
        "rtts": rtts,
        "sent": sent,
        "lost": lost,
        "cpu": cpu,
        "extensions": extensions,
        "pid": pid,
    }


def start_peer(command: str, base: str, token: str) -> tuple[Any, int]:
    """
    Another server from a ``compare.sh``-style command (``{port}``,
    ``{pty_port}``, ``{base_dir}``; the token in ``ABX_SERVER_TOKEN``).
    """
    port = free_port()
    argv = command.format(port=port, pty_port=free_port(), base_dir=base)
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {argv}"],
        env={**os.environ, "ABX_SERVER_TOKEN": token, "ABX_SERVER_BASE_DIR": base},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_healthy(proc, port, 30, argv)
    return proc, port


def one_round(
    server: str,
    count: int,
    policy: str | None,
    shell: str | None = None,
    into: str = "cat",
    busy: int = 0,
) -> dict[str, Any]:
    """
    A fresh server, one session, ``count`` keystrokes: ``server`` is a
    checkout to run the daemon from, or ``cmd:`` and a peer's command.
    """
    base = tempfile.mkdtemp(prefix="keystrokes-")
    token = "keystrokes-" + os.urandom(8).hex()
    if server.startswith("cmd:"):
        proc, port = start_peer(server[4:], base, token)
    else:
        env = {"PYTHONPATH": os.path.abspath(server)}
        args = ["--policy", policy] if policy else []
        proc, port = start_daemon(base, token, args=args, env=env)
    try:
        url = new_session(port, token, shell).get("ws_url")
        if not url:
            raise SystemExit("the server gave no ws_url")
        start_burners(port, token, busy)
        return asyncio.run(keystrokes(url, token, count, proc.pid, into=into))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except Exception:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


def instructions(tree: str, count: int, warmup: int, policy: str | None) -> float:
    """
    The daemon's instructions per keystroke under ``callgrind`` (counters
    zeroed after ``warmup`` keystrokes, dumped after ``count`` more): the
    figure a loaded machine does not stretch.
    """
    work = tempfile.mkdtemp(prefix="keystrokes-cg-")
    base = os.path.join(work, "base")
    os.makedirs(base)
    out = os.path.join(work, "callgrind")
    token = "keystrokes-" + os.urandom(8).hex()
    prefix = [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=yes",
        f"--callgrind-out-file={out}.%p",
    ]
    env = {"PYTHONPATH": os.path.abspath(tree), "PYTHONHASHSEED": "0"}
    args = ["--policy", policy] if policy else []
    proc, port = start_daemon(
        base, token, args=args, env=env, prefix=prefix, wait_seconds=180
    )

    def measure(when: str) -> None:
        flag = "-z" if when == "start" else "-d"
        subprocess.run(
            ["callgrind_control", flag, str(proc.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )

    try:
        url = new_session(port, token)["ws_url"]
        asyncio.run(
            keystrokes(url, token, count, proc.pid, warmup, measure, wait=180.0)
        )
        dumps = sorted(glob.glob(f"{out}.{proc.pid}.*"))
        with open(dumps[-1]) as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1]) / count
        raise SystemExit(f"no totals in {dumps[-1]}")
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(120)
        except Exception:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


def summary(name: str, rounds: list[list[float]], cpus: list[float]) -> dict[str, Any]:
    """Medians over rounds, and where each round's slow keystrokes fell."""
    p50s = [w6_percentile(r, 50) for r in rounds]
    p99s = [w6_percentile(r, 99) for r in rounds]
    slow_at: Counter[int] = Counter()
    for r in rounds:
        # The three keystrokes that decide a round's p99.
        for index in sorted(range(len(r)), key=r.__getitem__)[-3:]:
            slow_at[index] += 1
    keys = len(rounds[0]) if rounds else 1
    return {
        "tree": name,
        "rounds": len(rounds),
        "p50_ms": round(statistics.median(p50s) * 1000, 3),
        "p99_ms": round(statistics.median(p99s) * 1000, 3),
        "p99_ms_min_max": [round(min(p99s) * 1000, 3), round(max(p99s) * 1000, 3)],
        "max_ms_median": round(statistics.median(max(r) for r in rounds) * 1000, 3),
        "slowest_3_at": dict(sorted(slow_at.items(), key=lambda kv: -kv[1])[:12]),
        "daemon_cpu_us_per_key": round(statistics.median(cpus) / keys * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a checkout to run the daemon from (repeat to alternate several)",
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="NAME=COMMAND",
        help="another server, started as compare.sh starts it ({port}, "
        "{pty_port}, {base_dir}), in the same rotation",
    )
    parser.add_argument("--policy", help="a policy file for the daemon")
    parser.add_argument("--out", help="also write the per-keystroke lines here")
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="instructions per keystroke under callgrind instead of timings",
    )
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--shell", help="the session's shell (the server's default)")
    parser.add_argument(
        "--into",
        default="cat",
        help="what the keystrokes go to: cat (the terminal echoes), or a "
        "command with line editing (say 'bash --norc --noprofile': it echoes)",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        help="CPU burners started through the server first (/process/start)",
    )
    args = parser.parse_args()
    trees = [t.split("=", 1) for t in args.tree] or [["this", "."]]
    servers = trees + [[n, "cmd:" + c] for n, c in (p.split("=", 1) for p in args.peer)]
    if args.callgrind:
        for n in range(args.rounds):
            for name, path in trees:
                per_key = instructions(path, args.keys, args.warmup, args.policy)
                line = {
                    "round": n,
                    "tree": name,
                    "instructions_per_key": round(per_key),
                }
                print(json.dumps(line), flush=True)
        return
    results: dict[str, tuple[list[list[float]], list[float]]] = {
        name: ([], []) for name, _ in servers
    }
    out = open(args.out, "w") if args.out else None
    print(json.dumps({"uptime": open("/proc/loadavg").read().split()[:3]}))
    for n in range(args.rounds):
        for name, path in servers:
            r = one_round(
                path, args.keys, args.policy, args.shell, args.into, args.busy
            )
            rtts = [x for x in r["rtts"] if x == x]
            results[name][0].append(rtts)
            results[name][1].append(r["cpu"])
            line = {
                "round": n,
                "tree": name,
                "p50_ms": round(w6_percentile(rtts, 50) * 1000, 3),
                "p99_ms": round(w6_percentile(rtts, 99) * 1000, 3),
                "lost": r["lost"],
                "extensions": r["extensions"],
                "slowest": sorted(
                    ((i, round(x * 1000, 3)) for i, x in enumerate(r["rtts"])),
                    key=lambda ix: -ix[1],
                )[:5],
            }
            print(json.dumps(line), flush=True)
            if out is not None:
                # ``sent`` is CLOCK_MONOTONIC, the clock ``perf record -k
                # CLOCK_MONOTONIC`` stamps scheduler events with: a slow
                # keystroke can be found in a trace taken beside the run.
                for i, (x, at) in enumerate(zip(r["rtts"], r["sent"], strict=True)):
                    key = {"round": n, "tree": name, "index": i, "rtt_ms": x * 1000}
                    key |= {"sent_s": at, "server_pid": r["pid"]}
                    key["client_pid"] = os.getpid()
                    out.write(json.dumps(key) + "\n")
    for name, (rounds, cpus) in results.items():
        print(json.dumps(summary(name, rounds, cpus)))
    print(json.dumps({"uptime": open("/proc/loadavg").read().split()[:3]}))
    if out is not None:
        out.close()


if __name__ == "__main__":
    main()
