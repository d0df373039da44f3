#!/usr/bin/env python3
"""
Many streams started at once (the shared harness's W7), seen from each
client and from the scheduler: when each client's head and first
``stdout`` event arrived, whether the first events came in the order the
streams were started, and how long the daemon ran and how long it waited
for a CPU meanwhile (``/proc/PID/task/*/schedstat``).

The wait is the figure that explains a late first event: when it is large
against the run time, the daemon was ready to answer and relay but the
children had the CPUs.

    .venv/bin/python bench/first_events.py [--clients 200] [--rounds 3] [--policy FILE]
        [--profile FILE]

``--profile`` runs the daemon under cProfile (one file per round, the
round's number appended) to see where its time went.

One JSON line per round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import schedstat, start_daemon, stop

#: The shared harness's W7 command: 50 lines, 20 ms apart.
COMMAND = "sh -c 'for i in $(seq 1 50); do echo $i; sleep 0.02; done'"


async def one(port: int, token: str, index: int, t0: float) -> dict[str, Any]:
    """One stream: seconds from ``t0`` to its head, first event and end."""
    body = json.dumps({"command": COMMAND, "timeout": 60}).encode()
    head = (
        f"POST /shell/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    record: dict[str, Any] = {"i": index}
    try:
        writer.write(head + body)
        seen = b""
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            now = time.perf_counter() - t0
            seen += data
            if "head" not in record and b"\r\n\r\n" in seen:
                record["head"] = now
            if "first" not in record and b"event: stdout" in seen:
                record["first"] = now
                seen = b""
            elif len(seen) > 4096:
                seen = seen[-64:]
        record["end"] = time.perf_counter() - t0
    finally:
        writer.close()
    return record


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


async def streams(port: int, token: str, clients: int) -> list[Any]:
    t0 = time.perf_counter()
    results: list[Any] = await asyncio.gather(
        *(one(port, token, i, t0) for i in range(clients)), return_exceptions=True
    )
    return results


def round_(port: int, token: str, pid: int, clients: int) -> dict[str, Any]:
    """One round of ``clients`` streams: the figures of one JSON line."""
    ran0, waited0 = schedstat(pid)
    results = asyncio.run(streams(port, token, clients))
    ran1, waited1 = schedstat(pid)
    done = [r for r in results if isinstance(r, dict) and "first" in r]
    out: dict[str, Any] = {"clients": clients, "with_first_event": len(done)}
    for key in ("head", "first", "end"):
        values = [r[key] for r in done if key in r]
        if values:
            out[f"{key}_p50_ms"] = round(quantile(values, 0.5) * 1000)
            out[f"{key}_p99_ms"] = round(quantile(values, 0.99) * 1000)
    waits = [r["first"] - r["head"] for r in done if "head" in r]
    if waits:
        # From the stream's head (the child runs) to its first line: the
        # shell's start, against the other children and the daemon.
        out["head_to_first_p50_ms"] = round(quantile(waits, 0.5) * 1000)
    firsts = [r["first"] for r in sorted(done, key=lambda r: r["i"])]
    pairs = len(firsts) * (len(firsts) - 1) // 2
    inverted = sum(
        1
        for a in range(len(firsts))
        for b in range(a + 1, len(firsts))
        if firsts[a] > firsts[b]
    )
    out["first_events_out_of_start_order"] = (
        round(inverted / pairs, 3) if pairs else None
    )
    out["daemon_ran_ms"] = (ran1 - ran0) // 10**6
    out["daemon_waited_ms"] = (waited1 - waited0) // 10**6
    out["load1"] = os.getloadavg()[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--policy", help="a policy file for the daemon")
    ap.add_argument("--profile", help="cProfile the daemon into FILE.N")
    a = ap.parse_args()
    policy = None
    if a.policy:
        with open(a.policy) as f:
            policy = json.load(f)
    token = secrets.token_hex(16)
    for n in range(a.rounds):
        prefix = []
        if a.profile:
            prefix = [sys.executable, "-m", "cProfile", "-o", f"{a.profile}.{n}"]
        with tempfile.TemporaryDirectory(prefix="first-events-") as base:
            proc, port = start_daemon(base, token, policy, prefix=prefix)
            try:
                time.sleep(1.0)
                print(json.dumps(round_(port, token, proc.pid, a.clients)), flush=True)
            finally:
                # The daemon first (a profiler writes its file as it
                # stops), then anything left in its group.
                stop(proc)


if __name__ == "__main__":
    main()
