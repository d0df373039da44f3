#!/usr/bin/env python3
"""
What a group's first request costs: a group's handlers (and the services
built on first use) are imported by its first request, not at start
(docs/architecture.md, "Start-up"). For each case, ``--daemons`` fresh
daemons each answer the request twice, after the start-up heap trim; the
medians of the first and of the second are printed, one JSON line per
case.

    .venv/bin/python bench/first_request.py [--daemons 7]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import start_daemon

#: (case, method, path, JSON body): one request of a group each.
CASES: list[tuple[str, str, str, Any]] = [
    ("files_list", "GET", "/files/list?path=.", None),
    ("shell", "POST", "/shell", {"command": "true"}),
    ("system_info", "GET", "/system/info", None),
    ("capabilities", "GET", "/capabilities", None),
]

#: After the daemon's heap trim (sandboxd.daemon.server.TRIM_AFTER_SECONDS).
SETTLE_SECONDS = 1.0


def timed(port: int, token: str, method: str, path: str, body: Any) -> float:
    """One request on a fresh connection: ms from send to the whole answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.connect()
    payload = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    start = time.perf_counter()
    conn.request(method, path, body=payload, headers=headers)
    response = conn.getresponse()
    response.read()
    elapsed = (time.perf_counter() - start) * 1000
    conn.close()
    if response.status != 200:
        raise SystemExit(f"{method} {path}: {response.status}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--daemons", type=int, default=7)
    args = parser.parse_args()
    first: dict[str, list[float]] = {case: [] for case, *_ in CASES}
    second: dict[str, list[float]] = {case: [] for case, *_ in CASES}
    for _ in range(args.daemons):
        token = secrets.token_hex(16)
        with tempfile.TemporaryDirectory() as base:
            proc, port = start_daemon(base, token)
            try:
                time.sleep(SETTLE_SECONDS)
                for case, method, path, body in CASES:
                    first[case].append(timed(port, token, method, path, body))
                    second[case].append(timed(port, token, method, path, body))
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
    for case, *_ in CASES:
        print(
            json.dumps(
                {
                    "workload": "FIRST-REQUEST",
                    "case": case,
                    "daemons": args.daemons,
                    "first_ms_median": round(statistics.median(first[case]), 2),
                    "second_ms_median": round(statistics.median(second[case]), 2),
                    "first_ms_max": round(max(first[case]), 2),
                }
            )
        )


if __name__ == "__main__":
    main()
