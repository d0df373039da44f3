#!/usr/bin/env python3
"""
What a code context costs over driving the same ipykernel with
``jupyter_client`` directly.

Starts a fresh daemon (twistd, the ``code`` group on), creates one context
(a real ipykernel, spawned by sandboxd, spoken to through its hub child),
and, in the same run, starts the same kernelspec with ``jupyter_client``'s
``KernelManager`` and a blocking client. Then, alternating the two so drift
on a shared machine hits both alike:

- ``1+1``: ``--calls`` executions, latency p50/p99 of each; the overhead is
  sandboxd's p50 minus the direct p50 (the issue's target: at most 2 ms);
- a print of ``--mib`` MiB: the time until the whole output is in the
  client's hands (sandboxd: the 200 result document, head and tail within
  max_output_bytes; direct: every iopub ``stream`` message until ``idle``),
  as MB/s (the target: at least 0.8x direct).

Prints one JSON line per case and round, then a summary line.

    .venv/bin/python bench/code_contexts.py [--calls 300] [--mib 10] [--rounds 2]
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
import time
from typing import Any

from daemon import start_daemon


def post(conn: http.client.HTTPConnection, token: str, path: str, body: Any) -> Any:
    conn.request(
        "POST",
        path,
        json.dumps(body),
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    reply = conn.getresponse()
    data = reply.read()
    if reply.status not in (200, 201):
        raise SystemExit(f"{path}: {reply.status} {data[:300]!r}")
    return json.loads(data)


class Direct:
    """The same kernelspec, driven by jupyter_client's blocking client."""

    def __init__(self) -> None:
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel()
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str) -> int:
        """Execute; the output characters seen, once the kernel is idle again."""
        msg_id = self.kc.execute(code)
        seen = 0
        while True:
            msg = self.kc.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                seen += len(msg["content"]["text"])
            elif (
                msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            ):
                break
        self.kc.get_shell_msg(timeout=120)
        return seen

    def stop(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--mib", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    try:
        import ipykernel  # noqa: F401
        import jupyter_client  # noqa: F401
    except ImportError:
        print(
            json.dumps(
                {"workload": "CODE", "skipped": "ipykernel or jupyter_client missing"}
            )
        )
        return
    token = secrets.token_hex(16)
    base = tempfile.mkdtemp(prefix="bench-code-")
    proc, port = start_daemon(base, token, {"groups": {"code": True}})
    direct = Direct()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        ctx = post(conn, token, "/code/contexts", {})
        path = f"/code/contexts/{ctx['id']}/execute"
        size = int(args.mib * 1024 * 1024)
        big = f"print('x' * {size - 1})"
        # Warm both (imports, first compile).
        for _ in range(5):
            post(conn, token, path, {"code": "1+1"})
            direct.run("1+1")
        summary: dict[str, list[float]] = {
            "sandboxd": [],
            "direct": [],
            "sb_mbs": [],
            "d_mbs": [],
        }
        for round_ in range(args.rounds):
            lat: dict[str, list[float]] = {"sandboxd": [], "direct": []}
            for _ in range(args.calls):
                t = time.perf_counter()
                result = post(conn, token, path, {"code": "1+1"})
                lat["sandboxd"].append((time.perf_counter() - t) * 1000)
                assert result["results"][0]["data"]["text/plain"] == "2", result
                t = time.perf_counter()
                direct.run("1+1")
                lat["direct"].append((time.perf_counter() - t) * 1000)
            for name, values in lat.items():
                summary[name] += values
                print(
                    json.dumps(
                        {
                            "workload": "CODE",
                            "case": f"1+1 {name}",
                            "round": round_,
                            "calls": len(values),
                            "p50_ms": round(statistics.median(values), 3),
                            "p99_ms": round(percentile(values, 99), 3),
                        }
                    )
                )
            t = time.perf_counter()
            result = post(conn, token, path, {"code": big})
            sb_s = time.perf_counter() - t
            t = time.perf_counter()
            seen = direct.run(big)
            d_s = time.perf_counter() - t
            assert result["state"] == "ok", result["state"]
            summary["sb_mbs"].append(size / 1e6 / sb_s)
            summary["d_mbs"].append(seen / 1e6 / d_s)
            print(
                json.dumps(
                    {
                        "workload": "CODE",
                        "case": f"print {args.mib:g} MiB",
                        "round": round_,
                        "sandboxd_mb_s": round(size / 1e6 / sb_s, 1),
                        "direct_mb_s": round(seen / 1e6 / d_s, 1),
                        "sandboxd_truncated": result["truncated"],
                    }
                )
            )
        sb50 = statistics.median(summary["sandboxd"])
        d50 = statistics.median(summary["direct"])
        print(
            json.dumps(
                {
                    "workload": "CODE",
                    "case": "summary",
                    "sandboxd_p50_ms": round(sb50, 3),
                    "sandboxd_p99_ms": round(percentile(summary["sandboxd"], 99), 3),
                    "direct_p50_ms": round(d50, 3),
                    "direct_p99_ms": round(percentile(summary["direct"], 99), 3),
                    "p50_overhead_ms": round(sb50 - d50, 3),
                    "sandboxd_mb_s": round(statistics.median(summary["sb_mbs"]), 1),
                    "direct_mb_s": round(statistics.median(summary["d_mbs"]), 1),
                    "throughput_ratio": round(
                        statistics.median(summary["sb_mbs"])
                        / statistics.median(summary["d_mbs"]),
                        2,
                    ),
                    "loadavg": os.getloadavg()[0],
                }
            )
        )
    finally:
        direct.stop()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
