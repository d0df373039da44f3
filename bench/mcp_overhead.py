#!/usr/bin/env python3
"""
What the MCP door costs per call over the plain HTTP API.

Starts a fresh daemon (twistd, a temp base dir, a random token), then runs
the same two calls at concurrency 8, through ``POST /mcp`` ``tools/call``
(one session per worker, JSON answers) and over plain HTTP, in one run:
``files_stat`` of a small file and ``shell`` running ``true``.  Each worker
is a thread with one keep-alive connection and the standard library's
client, so the client's own cost is the same on both sides.  Cases
alternate (HTTP, MCP, HTTP, MCP ...) so drift on a shared machine hits
both alike.  Prints one JSON line per case and round, then one summary
line per call: calls/s, mean latency, and the MCP overhead per call in
microseconds, as daemon time (the daemon is single-threaded, so 1/rate is
its time per call), as the daemon's own CPU time per call (from
/proc/PID/stat; the figure that holds on a shared machine; a shell
call's child is not counted) and as latency.

    .venv/bin/python bench/mcp_overhead.py [--calls 2000] [--shell-calls 400] [--rounds 2]
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
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from daemon import cpu_seconds, start_daemon

CONCURRENCY = 8


class Worker:
    """One connection; ``call()`` makes one request of the case and checks it."""

    def __init__(self, port: int, token: str, mode: str, call: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.token = token
        self.mode = mode
        self.call_name = call
        self.session = ""
        self.next_id = 1
        if mode == "mcp":
            reply = self._post(
                "/mcp",
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-11-25",
                        "capabilities": {},
                        "clientInfo": {"name": "bench", "version": "1"},
                    },
                },
            )
            self.session = reply[1]
            self._post(
                "/mcp", {"jsonrpc": "2.0", "method": "notifications/initialized"}
            )

    def _post(self, path: str, body: Any) -> tuple[Any, str]:
        data = json.dumps(body).encode()
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        if self.session:
            headers["Mcp-Session-Id"] = self.session
            headers["MCP-Protocol-Version"] = "2025-11-25"
        self.conn.request("POST", path, data, headers)
        response = self.conn.getresponse()
        raw = response.read()
        if response.status >= 300 and response.status != 202:
            raise RuntimeError(f"{path}: {response.status} {raw[:200]!r}")
        return (json.loads(raw) if raw else None), response.getheader(
            "mcp-session-id", ""
        )

    def _get(self, path: str) -> Any:
        self.conn.request(
            "GET", path, headers={"Authorization": f"Bearer {self.token}"}
        )
        response = self.conn.getresponse()
        raw = response.read()
        if response.status != 200:
            raise RuntimeError(f"{path}: {response.status}")
        return json.loads(raw)

    def call(self) -> None:
        if self.mode == "http":
            if self.call_name == "files_stat":
                body = self._get("/files/stat?path=a.txt")
                assert body["exists"], body
            else:
                body, _ = self._post("/shell", {"command": "true"})
                assert body["exit_code"] == 0, body
            return
        arguments = (
            {"path": "a.txt"} if self.call_name == "files_stat" else {"command": "true"}
        )
        self.next_id += 1
        body, _ = self._post(
            "/mcp",
            {
                "jsonrpc": "2.0",
                "id": self.next_id,
                "method": "tools/call",
                "params": {"name": self.call_name, "arguments": arguments},
            },
        )
        result = body["result"]
        assert not result["isError"], result

    def close(self) -> None:
        if self.session:
            self.conn.request(
                "DELETE",
                "/mcp",
                headers={
                    "Authorization": f"Bearer {self.token}",
                    "Mcp-Session-Id": self.session,
                },
            )
            self.conn.getresponse().read()
        self.conn.close()


def run_case(
    port: int, token: str, mode: str, call: str, calls: int, pid: int
) -> dict[str, Any]:
    """``calls`` calls spread over CONCURRENCY workers; rate, latencies, daemon CPU."""
    workers = [Worker(port, token, mode, call) for _ in range(CONCURRENCY)]
    for w in workers:  # warm each connection
        w.call()
    per = calls // CONCURRENCY
    latencies: list[list[float]] = [[] for _ in workers]
    errors: list[BaseException] = []
    start_line = threading.Barrier(CONCURRENCY + 1)

    def drive(i: int, worker: Worker, record: Callable[[float], None]) -> None:
        start_line.wait()
        try:
            for _ in range(per):
                began = time.perf_counter()
                worker.call()
                record(time.perf_counter() - began)
        except BaseException as e:
            errors.append(e)

    threads = [
        threading.Thread(target=drive, args=(i, w, latencies[i].append))
        for i, w in enumerate(workers)
    ]
    for t in threads:
        t.start()
    start_line.wait()
    began = time.perf_counter()
    cpu = cpu_seconds(pid)
    for t in threads:
        t.join()
    seconds = time.perf_counter() - began
    cpu = cpu_seconds(pid) - cpu
    for w in workers:
        w.close()
    if errors:
        raise errors[0]
    flat = sorted(x for lat in latencies for x in lat)
    return {
        "workload": "MCP",
        "call": call,
        "via": mode,
        "calls": len(flat),
        "seconds": round(seconds, 3),
        "calls_per_s": round(len(flat) / seconds, 1),
        "mean_ms": round(statistics.fmean(flat) * 1000, 3),
        "p50_ms": round(flat[len(flat) // 2] * 1000, 3),
        "p99_ms": round(flat[int(len(flat) * 0.99)] * 1000, 3),
        "daemon_cpu_us_per_call": round(cpu / len(flat) * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--shell-calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="sandboxd-mcp-bench-")
    token = secrets.token_hex(16)
    with open(os.path.join(base, "a.txt"), "w") as f:
        f.write("hello\n")
    proc, port = start_daemon(base, token)
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        for _ in range(args.rounds):
            for call, calls in (
                ("files_stat", args.calls),
                ("shell", args.shell_calls),
            ):
                for mode in ("http", "mcp"):
                    row = run_case(port, token, mode, call, calls, proc.pid)
                    results.setdefault((call, mode), []).append(row)
                    print(json.dumps(row), flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)
    for call in ("files_stat", "shell"):
        http_rows, mcp_rows = results[(call, "http")], results[(call, "mcp")]
        http_rate = statistics.median(r["calls_per_s"] for r in http_rows)
        mcp_rate = statistics.median(r["calls_per_s"] for r in mcp_rows)
        http_cpu = statistics.median(r["daemon_cpu_us_per_call"] for r in http_rows)
        mcp_cpu = statistics.median(r["daemon_cpu_us_per_call"] for r in mcp_rows)
        http_mean = statistics.median(r["mean_ms"] for r in http_rows)
        mcp_mean = statistics.median(r["mean_ms"] for r in mcp_rows)
        print(
            json.dumps(
                {
                    "workload": "MCP",
                    "summary": call,
                    "concurrency": CONCURRENCY,
                    "http_calls_per_s": http_rate,
                    "mcp_calls_per_s": mcp_rate,
                    "http_mean_ms": http_mean,
                    "mcp_mean_ms": mcp_mean,
                    "http_daemon_cpu_us": http_cpu,
                    "mcp_daemon_cpu_us": mcp_cpu,
                    "mcp_overhead_cpu_us_per_call": round(mcp_cpu - http_cpu, 1),
                    "mcp_overhead_us_per_call": round(
                        (1 / mcp_rate - 1 / http_rate) * 1e6, 1
                    ),
                    "mcp_overhead_us_latency": round((mcp_mean - http_mean) * 1000, 1),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
