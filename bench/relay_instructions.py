#!/usr/bin/env python3
"""
Instructions the daemon executes per line it relays on ``/shell/stream``,
under callgrind: a figure the machine's load does not move, for the
relay's own cost per line (W7's lines, one at a time).

A daemon from TREE runs under ``valgrind --tool=callgrind``; after one
warm-up stream (the group's first request imports its handlers), STREAMS
streams each print LINES lines 30 ms apart, read by raw clients.  The
counters are zeroed once every stream has had 20 lines and dumped when
the first has LINES - 20; the dump's total over the lines the clients
got in between is the figure (one JSON line).  Compare trees at paths of
the same length (a path's length moves the counts a little)::

    .venv/bin/python bench/relay_instructions.py TREE [STREAMS] [LINES]
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from daemon import callgrind_total, free_port  # noqa: E402

#: Lines the counters leave out at each end of a stream.
MARGIN = 20


def start(tree: str, work: str, token: str) -> tuple[subprocess.Popen[bytes], int]:
    """The daemon from ``tree`` under callgrind, answering: its process and port."""
    port = free_port()
    argv = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={work}/cg.%p",
        os.path.join(os.path.dirname(HERE), ".venv", "bin", "twistd"),
        *("-n", "--pidfile=", "sandboxd"),
        *("--port", f"tcp:{port}:interface=127.0.0.1"),
        *("--pty-port", f"tcp:{free_port()}:interface=127.0.0.1"),
        *("--base-dir", work),
    ]
    if os.geteuid() == 0:
        argv += ["--policy", os.path.join(HERE, "root-children.json")]
    proc = subprocess.Popen(
        argv,
        env={**os.environ, "PYTHONPATH": tree, "ABX_SERVER_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        process_group=0,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc, port
        except OSError:
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                raise SystemExit("the daemon did not start") from None
            time.sleep(0.5)


def measure(pid: int, port: int, token: str, streams: int, lines: int) -> int:
    """Run the streams; the lines the clients got between zero and dump."""
    command = f"for i in $(seq 1 {lines}); do echo $i; sleep 0.03; done"
    counts = [0] * streams
    marks: dict[str, int] = {}

    def control(what: str) -> None:
        subprocess.run(
            ["callgrind_control", what, str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    async def one(index: int | None, command: str) -> None:
        body = json.dumps({"command": command, "shell": "sh", "timeout": 600})
        head = (
            f"POST /shell/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head.encode() + body.encode())
        while data := await reader.read(65536):
            if index is None:
                continue
            counts[index] += data.count(b"event: stdout")
            if "zeroed" not in marks and min(counts) >= MARGIN:
                control("-z")
                marks["zeroed"] = sum(counts)
            if "zeroed" in marks and "dumped" not in marks:
                if max(counts) >= lines - MARGIN:
                    control("-d")
                    marks["dumped"] = sum(counts)
        writer.close()

    async def run() -> None:
        await one(None, "echo warm")
        await asyncio.gather(*(one(i, command) for i in range(streams)))

    asyncio.run(run())
    return marks["dumped"] - marks["zeroed"]


def main() -> None:
    tree = os.path.abspath(sys.argv[1])
    streams = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    lines = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="relay-instructions-") as work:
        proc, port = start(tree, work, token)
        try:
            relayed = measure(proc.pid, port, token, streams, lines)
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        dumps = sorted(glob.glob(f"{work}/cg.{proc.pid}.*"), key=os.path.getmtime)
        counted = callgrind_total(dumps[-1])
    print(
        json.dumps(
            {
                "tree": tree,
                "load1": round(os.getloadavg()[0], 1),
                "lines": relayed,
                "instructions": counted,
                "per_line": round(counted / relayed),
            }
        )
    )


if __name__ == "__main__":
    main()
