#!/usr/bin/env python3
"""
Context switches and CPU time per ``/shell true`` at 8 connections: a
fresh daemon from ``TREE`` (``PYTHONPATH``), warmed up with a 2 s ``wrk``
run, then ``perf stat -e context-switches,task-clock -p PID`` (its threads
and the children it spawns meanwhile) over a ``SECONDS`` ``wrk`` run::

    .venv/bin/python bench/switches.py TREE [SECONDS]

One JSON line: requests, commands/s, switches and task-clock
microseconds per command, the load average.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import start_daemon


def post_script(directory: str, token: str) -> str:
    """A ``wrk`` script in ``directory`` that posts ``/shell true`` with ``token``."""
    script = os.path.join(directory, "post.lua")
    with open(script, "w") as f:
        f.write(
            'wrk.method = "POST"\n'
            'wrk.body = \'{"command": "true"}\'\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
            f'wrk.headers["Authorization"] = "Bearer {token}"\n'
        )
    return script


def wrk(script: str, url: str, seconds: int) -> str:
    """``wrk`` at 8 connections for ``seconds``; its report."""
    argv = ["wrk", "-t1", "-c8", f"-d{seconds}", "-s", script, url]
    return subprocess.run(argv, capture_output=True, text=True).stdout


def main() -> None:
    tree = sys.argv[1]
    seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    base = tempfile.mkdtemp(prefix="switches-")
    token = secrets.token_hex(8)
    os.environ["PYTHONPATH"] = os.path.abspath(tree)
    proc, port = start_daemon(base, token, {})
    script = post_script(base, token)
    url = f"http://127.0.0.1:{port}/shell"
    try:
        wrk(script, url, 2)
        perf = subprocess.Popen(
            [
                "perf",
                "stat",
                "-x,",
                "-e",
                "context-switches,task-clock",
                "-p",
                str(proc.pid),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.2)
        report = wrk(script, url, seconds)
        perf.send_signal(signal.SIGINT)
        counters = perf.communicate()[1]
    finally:
        proc.terminate()
        proc.wait()
    found = re.search(r"(\d+) requests in", report)
    n = int(found.group(1)) if found else 0
    values = {}
    for line in counters.splitlines():
        fields = line.split(",")
        if len(fields) > 3 and fields[0].replace(".", "").isdigit():
            values[fields[2]] = float(fields[0])
    print(
        json.dumps(
            {
                "tree": tree,
                "requests": n,
                "cmds_per_s": round(n / seconds),
                "switches_per_cmd": round(
                    values.get("context-switches", 0) / max(n, 1), 2
                ),
                "task_clock_us_per_cmd": round(
                    values.get("task-clock", 0) * 1000 / max(n, 1), 1
                ),
                "load": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
