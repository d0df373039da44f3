#!/usr/bin/env python3
"""
W9 with the busy work started through the daemon itself: how responsive
the control plane stays while the sandbox's own build keeps every core and
the disk busy.

For each policy (``priority`` and ``cgroups`` on, the default, and both
off for comparison), a fresh daemon answers, idle and then busy (the row
says whether the children had a cgroup of their own: ``cgroups``):

- ``/health`` one at a time on one keep-alive connection for ``--seconds``
  (req/s, p50, p99);
- ``--shells`` sequential ``/shell true`` (p50, p99);

"busy" is one CPU burner per core and a looping ``dd ... conv=fsync``
writer, all started with ``POST /process/start`` (so they get whatever
priority the daemon gives its children); last, ``POST
/process/{pid}/signal`` TERMs each burner and the time to its answer is
recorded (the target is 100 ms). Figures are busy/idle ratios; the target
is 2x or less.

    .venv/bin/python bench/busy.py [--seconds 5] [--shells 30]

One JSON line per policy.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import shlex
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import start_daemon


class Client:
    """One keep-alive connection with the token."""

    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Bearer {token}"}

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any, float]:
        """One request: status, parsed body, milliseconds."""
        payload = json.dumps(body).encode() if body is not None else None
        headers = dict(self.headers)
        if payload is not None:
            headers["Content-Type"] = "application/json"
        began = time.perf_counter()
        self.conn.request(method, path, body=payload, headers=headers)
        response = self.conn.getresponse()
        data = response.read()
        ms = (time.perf_counter() - began) * 1000
        return response.status, json.loads(data) if data else None, ms


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))], 3)


def health(client: Client, seconds: float) -> dict[str, Any]:
    """``/health`` back to back for ``seconds``."""
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        status, _, ms = client.call("GET", "/health")
        if status == 200:
            times.append(ms)
    return {
        "req_per_s": round(len(times) / seconds, 1),
        "p50_ms": pct(times, 50),
        "p99_ms": pct(times, 99),
    }


def shells(client: Client, n: int) -> dict[str, Any]:
    """``n`` sequential ``/shell true``."""
    times = []
    for _ in range(n):
        status, _, ms = client.call("POST", "/shell", {"command": "true"})
        if status == 200:
            times.append(ms)
    return {"p50_ms": pct(times, 50), "p99_ms": pct(times, 99), "ok": len(times)}


def start_busy(client: Client, scratch: str) -> list[int]:
    """One CPU burner per core and a disk writer, started through the daemon."""
    burn = shlex.join([sys.executable, "-c", "while True: pass"])
    writer = shlex.join(
        [
            "sh",
            "-c",
            f"while :; do dd if=/dev/zero of={scratch}/w bs=1M count=64 "
            "conv=fsync 2>/dev/null; done",
        ]
    )
    pids = []
    for command in [burn] * (os.cpu_count() or 2) + [writer]:
        status, body, _ = client.call("POST", "/process/start", {"command": command})
        if status != 200:
            raise SystemExit(f"/process/start: {status} {body}")
        pids.append(int(body["pid"]))
    return pids


def stop_busy(client: Client, pids: list[int]) -> list[float]:
    """TERM each, through the daemon: milliseconds to each answer."""
    times = []
    for pid in pids:
        _, _, ms = client.call("POST", f"/process/{pid}/signal", {"signal": "TERM"})
        times.append(ms)
    return times


def ratio(busy: float | None, idle: float | None) -> float | None:
    return round(busy / idle, 2) if busy and idle else None


def run(policy: dict[str, Any], label: str, args: argparse.Namespace) -> dict[str, Any]:
    token = secrets.token_hex(16)
    work = tempfile.mkdtemp(prefix="busy-")
    base = os.path.join(work, "base")
    os.makedirs(base)
    proc, port = start_daemon(base, token, policy)
    row: dict[str, Any] = {"workload": "W9-DAEMON", "priority": label}
    try:
        client = Client(port, token)
        _, info, _ = client.call("GET", "/system/info")
        row["cgroups"] = (info or {}).get("cgroups", {}).get("state")
        idle_h = health(client, args.seconds)
        idle_s = shells(client, args.shells)
        pids = start_busy(client, base)
        try:
            time.sleep(1.0)
            busy_h = health(client, args.seconds)
            busy_s = shells(client, args.shells)
        finally:
            signal_ms = stop_busy(client, pids)
        row.update(
            idle_health=idle_h,
            busy_health=busy_h,
            idle_shell=idle_s,
            busy_shell=busy_s,
            health_rate_ratio=ratio(idle_h["req_per_s"], busy_h["req_per_s"]),
            health_p99_ratio=ratio(busy_h["p99_ms"], idle_h["p99_ms"]),
            shell_p50_ratio=ratio(busy_s["p50_ms"], idle_s["p50_ms"]),
            signal_max_ms=round(max(signal_ms), 2),
            loadavg=open("/proc/loadavg").read().split()[:3],
        )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except Exception:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--shells", type=int, default=30)
    args = ap.parse_args()
    off = {"priority": False, "cgroups": False}
    for policy, label in (({}, "default"), (off, "off")):
        print(json.dumps(run(policy, label, args)), flush=True)


if __name__ == "__main__":
    main()
