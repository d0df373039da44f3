#!/usr/bin/env python3
"""
What the Python client costs over the wire it speaks, in one run against
one fresh daemon:

- ``Sandbox.files.upload`` / ``download`` of a ``--size-mib`` file (1 GiB)
  against ``curl`` on the same raw routes (``POST``/``GET /files/raw``),
  local file to daemon and back;
- ``Sandbox.commands.run("true")`` in a loop against a bare ``httpx.Client``
  loop posting the same ``/shell`` body.

Prints one JSON line per case and the client's overhead as a ratio
(client time / reference time; 1.0 is free).  Cases alternate, the best of
``--rounds`` counts (the machine is shared and noisy).

    .venv/bin/python bench/client_overhead.py [--size-mib 1024] [--runs 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import start_daemon
from raw_files import LARGE_FILES, MiB

from sandboxd.client import Sandbox


def best(rounds: int, fn: Callable[[], None]) -> float:
    """The fastest of ``rounds`` timed calls, in seconds."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def curl(*args: str) -> None:
    """Run curl quietly; fail loudly."""
    subprocess.run(
        ["curl", "-sS", "--fail", *args], check=True, stdout=subprocess.DEVNULL
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=200, help="commands per loop")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the temp files go")
    args = parser.parse_args()
    if shutil.which("curl") is None:
        raise SystemExit("curl is not installed")
    size = args.size_mib * MiB
    token = secrets.token_hex(16)
    base = tempfile.mkdtemp(prefix="sandboxd-bench-", dir=args.dir)
    local = tempfile.mkdtemp(prefix="sandboxd-bench-local-", dir=args.dir)
    source = os.path.join(local, "source.bin")
    block = os.urandom(MiB)
    with open(source, "wb") as f:
        for _ in range(args.size_mib):
            f.write(block)
    proc, port = start_daemon(base, token, LARGE_FILES)
    url = f"http://127.0.0.1:{port}"
    auth = f"Authorization: Bearer {token}"
    out = os.path.join(local, "back.bin")
    results: list[dict[str, object]] = []

    def report(
        case: str, client: float, reference: float, unit: str, amount: float
    ) -> None:
        line = {
            "server": "sandboxd",
            "workload": "CLIENT",
            "case": case,
            "client_" + unit: round(amount / client, 1),
            "reference_" + unit: round(amount / reference, 1),
            "overhead_ratio": round(client / reference, 3),
        }
        results.append(line)
        print(json.dumps(line), flush=True)

    try:
        with Sandbox(url, token=token, timeout=600) as sb:

            def client_up() -> None:
                sb.files.upload(source, "client.bin")

            def curl_up() -> None:
                curl(
                    "-T",
                    source,
                    "-X",
                    "POST",
                    "-H",
                    auth,
                    "-H",
                    "Expect:",
                    f"{url}/files/raw?path=curl.bin&overwrite=true",
                )

            def client_down() -> None:
                os.unlink(out) if os.path.exists(out) else None
                sb.files.download("client.bin", out, resume=False)

            def curl_down() -> None:
                curl("-H", auth, "-o", out, f"{url}/files/raw?path=curl.bin")

            up_client = up_curl = down_client = down_curl = float("inf")
            for _ in range(args.rounds):
                up_curl = min(up_curl, best(1, curl_up))
                up_client = min(up_client, best(1, client_up))
                down_curl = min(down_curl, best(1, curl_down))
                down_client = min(down_client, best(1, client_down))
            if os.path.getsize(out) != size:
                raise SystemExit("the download is short")
            mib = size / MiB
            report(
                f"upload {args.size_mib} MiB vs curl",
                up_client,
                up_curl,
                "mb_per_s",
                mib,
            )
            report(
                f"download {args.size_mib} MiB vs curl",
                down_client,
                down_curl,
                "mb_per_s",
                mib,
            )

            raw = httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
            )

            def client_loop() -> None:
                for _ in range(args.runs):
                    assert sb.commands.run("true").exit_code == 0

            def httpx_loop() -> None:
                for _ in range(args.runs):
                    r = raw.post("/shell", json={"command": "true"})
                    assert r.status_code == 200 and r.json()["exit_code"] == 0

            loop_client = loop_httpx = float("inf")
            for _ in range(args.rounds):
                loop_httpx = min(loop_httpx, best(1, httpx_loop))
                loop_client = min(loop_client, best(1, client_loop))
            raw.close()
            report(
                f'commands.run("true") x{args.runs} vs httpx',
                loop_client,
                loop_httpx,
                "runs_per_s",
                args.runs,
            )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)


if __name__ == "__main__":
    main()
