"""
What the benches in this folder share: a fresh ``twistd -n sandboxd`` on
loopback ports, waited on until ``/health`` answers (which, by
``sandboxd.daemon.readiness``, also means every other port it opens listens), and
the daemon's own CPU time.
"""

from __future__ import annotations

import glob
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daemon(
    base: str,
    token: str,
    policy: Mapping[str, Any] | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
    wait_seconds: float = 10.0,
) -> tuple[subprocess.Popen[bytes], int]:
    """
    The daemon serving ``base`` under ``policy`` (written beside it), with
    ``args`` added to its command line: its process and HTTP port.
    ``prefix`` runs it under another program (valgrind, a profiler).
    """
    port = free_port()
    argv = [
        *prefix,
        os.path.join(os.path.dirname(sys.executable), "twistd"),
        "-n",
        "--pidfile=",
        "sandboxd",
        "--port",
        f"tcp:{port}:interface=127.0.0.1",
        "--pty-port",
        f"tcp:{free_port()}:interface=127.0.0.1",
        "--base-dir",
        base,
        *args,
    ]
    if os.geteuid() == 0:
        # A root daemon with a token must be told who its children run as;
        # the figures are for children that run as the daemon's user.
        policy = dict(policy or {})
        defaults = dict(policy.get("defaults", {}))
        defaults["params"] = {"default_user": "root", **defaults.get("params", {})}
        policy["defaults"] = defaults
    if policy is not None:
        path = os.path.join(base, ".policy.json")
        with open(path, "w") as f:
            json.dump(policy, f)
        argv += ["--policy", path]
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **(env or {}), "ABX_SERVER_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_healthy(proc, port, wait_seconds, "daemon")
    return proc, port


def wait_healthy(
    proc: subprocess.Popen[bytes], port: int, seconds: float, what: str
) -> None:
    """Wait for ``200 /health`` on ``port``; kill ``proc`` and exit if it never comes."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"{what} did not start")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far (children not counted)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def schedstat(pid: int) -> tuple[int, int]:
    """
    Nanoseconds ``pid``'s threads have run and waited on a run queue so
    far (``/proc/PID/task/*/schedstat``): finer than the 10 ms ticks of
    :func:`cpu_seconds`, which are as coarse as a keystroke's or a print's
    whole cost.
    """
    ran = waited = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                run, wait, _ = f.read().split()
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        ran += int(run)
        waited += int(wait)
    return ran, waited


def run_seconds(pid: int) -> float:
    """CPU time ``pid``'s threads have run so far, to the nanosecond."""
    return schedstat(pid)[0] / 1e9
