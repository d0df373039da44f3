#!/usr/bin/env python3
"""
The E2B door against sandboxd's own HTTP API, in one run, on one daemon.

Starts a fresh daemon (twistd, a temp base dir, a random token, the ``e2b``
group on, ``max_bytes`` raised), then, each case through the real ``e2b``
SDK (debug mode, its sync client) and through the HTTP API (``http.client``):

- ``commands.run("true")`` vs ``POST /shell {"command": "true"}``, at
  concurrency ``--concurrency`` (8) for ``--commands`` calls: commands/s and
  p50/p99 latency;
- a ``--size-mib`` (64) file: ``files.write`` (multipart, the SDK's default
  for bytes) vs ``POST /files/raw``, and ``files.read`` vs ``GET /files/raw``:
  MB/s (MiB per second, as ``raw_files.py``), best of ``--rounds``.

Prints one JSON line per case.

    .venv/bin/python bench/e2b_door.py [--commands 400] [--concurrency 8] [--size-mib 64]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

MiB = 1024 * 1024
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import cpu_seconds, e2b_sandbox, start_with_door, stop_all  # noqa: E402
from raw_files import LARGE_FILES  # noqa: E402


def sandbox(e2b_port: int, token: str) -> Any:
    """The ``e2b`` SDK's ``Sandbox`` on the daemon's E2B door."""
    from e2b import Sandbox

    return e2b_sandbox(Sandbox, e2b_port, token)


def concurrently(
    count: int, workers: int, make: Callable[[], Callable[[], None]]
) -> dict[str, Any]:
    """Run ``count`` calls on ``workers`` threads (each with its own client)."""
    latencies: list[float] = []
    lock = threading.Lock()
    left = [count]
    errors: list[str] = []

    def worker() -> None:
        call = make()
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            start = time.perf_counter()
            try:
                call()
            except Exception as e:
                errors.append(repr(e)[:200])
                return
            with lock:
                latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "calls": len(latencies),
        "per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2) if latencies else None,
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 2)
        if latencies
        else None,
        "errors": errors[:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = os.path.realpath(tempfile.mkdtemp(prefix="sandboxd-e2b-bench-"))
    token = secrets.token_hex(16)
    proc, port, e2b_port = start_with_door(base, token, LARGE_FILES, "e2b")
    try:
        run(args, port, e2b_port, token, proc.pid)
    finally:
        stop_all([proc])
        shutil.rmtree(base, ignore_errors=True)


def run(args: Any, port: int, e2b_port: int, token: str, pid: int) -> None:
    def sdk_run() -> Callable[[], None]:
        sbx = sandbox(e2b_port, token)
        return lambda: sbx.commands.run("true") and None

    def http_shell() -> Callable[[], None]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = json.dumps({"command": "true"})
        headers = {"X-Access-Token": token, "Content-Type": "application/json"}

        def call() -> None:
            conn.request("POST", "/shell", body, headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(response.status)

        return call

    def http_shell_login() -> Callable[[], None]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = json.dumps({"command": "true", "shell": "bash"})
        headers = {"X-Access-Token": token, "Content-Type": "application/json"}

        def call() -> None:
            conn.request("POST", "/shell", body, headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(response.status)

        return call

    cases = (
        ("sdk commands.run(true)", sdk_run),
        ("http POST /shell true", http_shell),
        ("http POST /shell bash -c true", http_shell_login),
    )
    for name, make in cases:
        concurrently(args.concurrency * 2, args.concurrency, make)  # warm-up
        cpu = cpu_seconds(pid)
        result = concurrently(args.commands, args.concurrency, make)
        per_call = (cpu_seconds(pid) - cpu) / max(1, result["calls"]) * 1000
        result["daemon_cpu_ms_per_call"] = round(per_call, 2)
        print(
            json.dumps(
                {
                    "workload": "E2B",
                    "case": name,
                    "concurrency": args.concurrency,
                    **result,
                }
            )
        )

    size = args.size_mib * MiB
    blob = os.urandom(size)
    sbx = sandbox(e2b_port, token)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

    def sdk_write() -> None:
        sbx.files.write("bench/sdk.bin", blob)

    def sdk_read() -> None:
        if len(sbx.files.read("bench/sdk.bin", format="bytes")) != size:
            raise RuntimeError("short read")

    def door_read() -> None:
        # The door's GET /files with a plain client: the server's share.
        door = http.client.HTTPConnection("127.0.0.1", e2b_port, timeout=600)
        door.request(
            "GET", "/files?path=bench/sdk.bin", headers={"X-Access-Token": token}
        )
        response = door.getresponse()
        if len(response.read()) != size or response.status != 200:
            raise RuntimeError("short read")

    def http_write() -> None:
        conn.request(
            "POST",
            "/files/raw?path=bench/http.bin&overwrite=true",
            blob,
            {"X-Access-Token": token, "Content-Length": str(size)},
        )
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(response.status)

    def http_read() -> None:
        conn.request(
            "GET", "/files/raw?path=bench/http.bin", headers={"X-Access-Token": token}
        )
        response = conn.getresponse()
        if len(response.read()) != size or response.status != 200:
            raise RuntimeError("short read")

    for name, call in (
        ("sdk files.write", sdk_write),
        ("http POST /files/raw", http_write),
        ("sdk files.read", sdk_read),
        ("http.client GET /files (E2B port)", door_read),
        ("http GET /files/raw", http_read),
    ):
        best = min(_timed(call) for _ in range(args.rounds))
        print(
            json.dumps(
                {
                    "workload": "E2B",
                    "case": name,
                    "mib": args.size_mib,
                    "mb_s": round(args.size_mib / best, 1),
                    "seconds": round(best, 3),
                }
            )
        )


def _timed(call: Callable[[], None]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
