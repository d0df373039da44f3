#!/usr/bin/env python3
"""
Workloads the reference peers cannot run: sandboxd's raw file routes.

Starts a fresh daemon (twistd, a temp base dir, a random token, a policy
raising ``max_bytes`` to 2 GiB), then writes a file of ``--size`` bytes with
``POST /files/raw`` and reads it back with ``GET /files/raw``, each over one
loopback connection, and prints one JSON line per case: MB/s and the
daemon's peak RSS growth over idle (VmHWM reset through clear_refs).
"MB/s" is MiB per second, as in ../shared/bench/run.py, so the figures
compare with the peers' W2 as they stand.

    .venv/bin/python bench/raw_files.py [--size-mib 1024] [--rounds 1]
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import secrets
import shutil
import signal
import tempfile
import time
from typing import Any

from daemon import start_daemon

MiB = 1024 * 1024
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak(pid: int) -> None:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def file_system(path: str) -> str:
    """The type of the file system holding ``path`` (from /proc/self/mounts)."""
    best, kind = "", "?"
    real = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            point = fields[1]
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, kind = point, fields[2]
    return kind


#: Raised limits, so a 1 GiB file goes through every route that carries one.
LARGE_FILES: dict[str, Any] = {
    "endpoints": {
        "files_write_raw": {"limits": {"max_bytes": "2GiB"}},
        "files_read_raw": {"limits": {"max_bytes": "2GiB"}},
        # The client sends large files as resumable uploads.
        "files_uploads_create": {"limits": {"max_bytes": "2GiB"}},
        "files_uploads_append": {"limits": {"max_bytes": "2GiB"}},
    }
}


def expected_sha256(size: int, block: bytes) -> str:
    """The sha256 the server must answer for the file, untimed."""
    sha = hashlib.sha256()
    left = size
    while left:
        chunk = block[: min(left, len(block))]
        sha.update(chunk)
        left -= len(chunk)
    return sha.hexdigest()


def write_raw(
    port: int, token: str, path: str, size: int, block: bytes
) -> tuple[float, str]:
    """POST the file in one request; returns (seconds, the server's sha256)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.putrequest("POST", f"/files/raw?path={path}&overwrite=true")
    conn.putheader("X-Access-Token", token)
    conn.putheader("Content-Length", str(size))
    conn.endheaders()
    start = time.perf_counter()
    view = memoryview(block)
    left = size
    while left:
        chunk = view[: min(left, len(view))]
        conn.send(chunk)
        left -= len(chunk)
    response = conn.getresponse()
    body = response.read()
    elapsed = time.perf_counter() - start
    if response.status != 200:
        raise SystemExit(f"write failed: {response.status} {body[:200]!r}")
    return elapsed, json.loads(body)["sha256"]


def read_raw(port: int, token: str, path: str, block: bytes) -> tuple[float, int, bool]:
    """
    GET the file; returns (seconds, bytes, every byte as written).

    The file is ``block`` over and over, so each MiB read into one reused
    buffer is compared with it (a memcmp): every byte is checked while the
    client stays far faster than the server.  A checksum in Python's zlib
    (adler32, about 2 GB/s here) made the client the bottleneck.
    """
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request("GET", f"/files/raw?path={path}", headers={"X-Access-Token": token})
    response = conn.getresponse()
    buffer = bytearray(len(block))
    view = memoryview(buffer)
    total = 0
    intact = True
    while True:
        filled = 0
        while filled < len(buffer):
            n = response.readinto(view[filled:])
            if not n:
                break
            filled += n
        if not filled:
            break
        total += filled
        # bytearray == bytes is a memcmp; comparing memoryviews is not.
        whole = filled == len(buffer)
        intact = intact and (
            buffer == block if whole else buffer[:filled] == block[:filled]
        )
    elapsed = time.perf_counter() - start
    if response.status != 200:
        raise SystemExit(f"read failed: {response.status}")
    return elapsed, total, intact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--dir",
        default=None,
        help="where the daemon's base dir is made (default: the temp dir); "
        "a tmpfs takes the disk out of the write figure",
    )
    args = parser.parse_args()
    size = args.size_mib * MiB
    token = secrets.token_hex(16)
    base = tempfile.mkdtemp(prefix="sandboxd-bench-", dir=args.dir)
    fs = file_system(base)
    proc, port = start_daemon(base, token, LARGE_FILES)
    block = os.urandom(MiB)
    sha = expected_sha256(size, block)
    try:
        idle = status_kb(proc.pid, "VmRSS")
        for _ in range(args.rounds):
            reset_peak(proc.pid)
            elapsed, got_sha = write_raw(port, token, "big.bin", size, block)
            peak = status_kb(proc.pid, "VmHWM")
            print(
                json.dumps(
                    {
                        "server": "sandboxd",
                        "workload": "RAW",
                        "case": f"write {args.size_mib} MiB",
                        "file_system": fs,
                        "mb_per_s": round(size / MiB / elapsed, 1),
                        "verified": got_sha == sha,
                        "peak_rss_growth_mb": round((peak - idle) / 1024, 1),
                    }
                )
            )
            reset_peak(proc.pid)
            elapsed, total, intact = read_raw(port, token, "big.bin", block)
            peak = status_kb(proc.pid, "VmHWM")
            print(
                json.dumps(
                    {
                        "server": "sandboxd",
                        "workload": "RAW",
                        "case": f"read {args.size_mib} MiB",
                        "file_system": fs,
                        "mb_per_s": round(total / MiB / elapsed, 1),
                        "verified": intact and total == size,
                        "peak_rss_growth_mb": round((peak - idle) / 1024, 1),
                    }
                )
            )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
