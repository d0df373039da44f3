#!/usr/bin/env python3
"""
Where W7's wall time goes (200 streams at once, each a shell printing 50
lines 20 ms apart; the time until the last client has read its ``exit``),
for sandboxd and for the shared harness's threaded stdlib server, with the
harness's own client (``sse_stream`` of the shared harness's ``run.py``).

Each round starts a fresh server the way ``compare.sh`` does (its own
process group, in the client's session: a daemon that sets its session's
scheduling group sets the client's too) and reports:

- the wall time, the first events' and the streams' ends' quantiles
  (a long tail of a few late streams, or all of them late together);
- CPU time over the round: the server's (all its threads, ended ones
  too; its time in the kernel; its live threads' wait for a CPU), its
  children's (``cutime``/``cstime``: the shells and their ``sleep``\\ s),
  the client's (and its wait for a CPU), the machine's busy time
  (``/proc/stat``) and what is left of it for other work, by kind
  (user, system, interrupts), and its context switches; the CPU time
  left idle, in the whole round and in its last fifth;
- the server's CPU per line relayed, and how many events each of the
  client's reads handed on (1.0: every event read on its own);
- a timeline in tenths of the wall: busy CPUs, the server's and the
  client's share, the client's wait, the streams ended so far.

``--py-spy PREFIX`` records the server's stacks over each round (py-spy
installed in this checkout's venv).

Run with the harness's Python (it imports the harness's client)::

    ~/.cache/sandboxd-bench/venv/bin/python bench/wall_time.py \\
        [--rounds 2] [--clients 200] SERVER [SERVER ...]

A SERVER is ``stdlib`` (``stdlib_server.py --tuned``, as ``compare.sh
stdlib-tuned``) or ``NAME=TREE``: ``twistd -n sandboxd`` of this
checkout's venv with ``PYTHONPATH=TREE`` (compile the tree first), under
``bench/root-children.json`` as root, or ``NAME=TREE@POLICY`` under the
policy file ``POLICY``.  The servers take turns, round after round.  One
JSON line per round.

The script runs in a session of its own, so that the scheduling group a
daemon gives its session is the script's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from types import SimpleNamespace
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from daemon import free_port, schedstat, stop  # noqa: E402

#: The shared harness (``SHARED_BENCH``, as for ``make bench``; by default
#: beside the checkout).
HARNESS = os.environ.get(
    "SHARED_BENCH",
    os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "bench"),
)
COMMAND = "sh -c 'for i in $(seq 1 50); do echo $i; sleep 0.02; done'"
LINES = 50
TICK = os.sysconf("SC_CLK_TCK")
CPUS = len(os.sched_getaffinity(0))
#: How often the sampler looks at the machine, the server and the client.
SAMPLE_SECONDS = 0.05


def harness() -> Any:
    """The shared harness's ``run.py``, imported as a module."""
    spec = importlib.util.spec_from_file_location(
        "harness_run", os.path.join(HARNESS, "run.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command(server: str, port: int, base: str) -> tuple[list[str], dict[str, str]]:
    """The argv and extra environment that start ``server`` on ``port``."""
    pty_port = free_port()
    if server == "stdlib":
        return [
            sys.executable,
            os.path.join(HARNESS, "peers", "stdlib_server.py"),
            "--tuned",
            *("--port", str(port), "--pty-port", str(pty_port)),
            *("--base-dir", base),
        ], {}
    tree, _, policy = server.split("=", 1)[1].partition("@")
    twistd = os.path.join(os.path.dirname(HERE), ".venv", "bin", "twistd")
    argv = [
        *(twistd, "-n", "--pidfile=", "sandboxd"),
        *("--port", f"tcp:{port}:interface=127.0.0.1"),
        *("--pty-port", f"tcp:{pty_port}:interface=127.0.0.1"),
        *("--base-dir", base),
    ]
    if policy:
        argv += ["--policy", policy]
    elif os.geteuid() == 0:
        argv += ["--policy", os.path.join(HERE, "root-children.json")]
    return argv, {"PYTHONPATH": os.path.abspath(tree)}


def start(server: str, base: str, token: str) -> tuple[subprocess.Popen[bytes], int]:
    """``server`` started and answering ``/health``: its process and port."""
    port = free_port()
    argv, env = command(server, port, base)
    proc = subprocess.Popen(
        argv,
        env={
            **os.environ,
            **env,
            "ABX_SERVER_TOKEN": token,
            "ABX_SERVER_BASE_DIR": base,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        process_group=0,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc, port
        except OSError:
            time.sleep(0.1)
    stop(proc)
    raise SystemExit(f"{server} did not start")


def system_ticks(pid: int) -> int:
    """The CPU time ``pid`` spent in the kernel, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[12])


def machine_busy() -> int:
    """The machine's busy CPU time so far, in clock ticks."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields[:8]) - idle


def machine_counts() -> dict[str, int]:
    """
    The machine's CPU time so far by kind (user, system, interrupts), in
    clock ticks, and its context switches.
    """
    with open("/proc/stat") as f:
        lines = f.read().splitlines()
    cpu = [int(v) for v in lines[0].split()[1:]]
    out = {
        "user": cpu[0] + cpu[1],
        "system": cpu[2],
        "interrupts": cpu[5] + cpu[6],
    }
    for line in lines:
        if line.startswith("ctxt "):
            out["switches"] = int(line.split()[1])
    return out


def cpu_ticks(pid: int) -> tuple[int, int]:
    """
    The CPU time of ``pid`` (all its threads, ended ones too: a threaded
    server's thread per connection ends with it) and of its reaped
    children, in clock ticks.
    """
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


class Sampler(threading.Thread):
    """Every ``SAMPLE_SECONDS``: the machine, the server, the client."""

    def __init__(self, pid: int, ended: list[float]) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.ended = ended
        self.me = threading.get_native_id()
        self.samples: list[tuple[float, int, int, int, int, int]] = []
        self.running = True

    def sample(self) -> None:
        server = cpu_ticks(self.pid)[0] * 10**9 // TICK
        client, client_wait = schedstat(os.getpid())
        self.samples.append(
            (
                time.perf_counter(),
                machine_busy(),
                server,
                client,
                client_wait,
                len(self.ended),
            )
        )

    def run(self) -> None:
        while self.running:
            self.sample()
            time.sleep(SAMPLE_SECONDS)
        self.sample()


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


async def streams(
    run: Any, port: int, token: str, clients: int, ended: list[float]
) -> list[Any]:
    """``clients`` streams at once, as the harness's W7 runs them."""
    cfg = SimpleNamespace(
        host="127.0.0.1", port=port, auth=lambda: {"X-Access-Token": token}
    )
    expect = [str(i) for i in range(1, LINES + 1)]

    async def one() -> tuple[bool, float, float | None, int]:
        got: list[str] = []
        code: list[int | None] = [None]
        first: list[float | None] = [None]
        # The times the client's reads handed on events: one per read.
        reads: set[float] = set()

        def on(event: str, data: dict[str, Any], t: float) -> None:
            reads.add(t)
            if event == "stdout":
                if first[0] is None:
                    first[0] = t
                got.append(data.get("data", ""))
            elif event == "exit":
                code[0] = data.get("exit_code")

        status, secs = await run.sse_stream(cfg, COMMAND, 60, on, budget=75)
        ended.append(time.perf_counter())
        ok = status == 200 and got == expect and code[0] == 0
        return ok, secs, first[0], len(reads)

    return await asyncio.gather(
        *(one() for _ in range(clients)), return_exceptions=True
    )


def timeline(
    samples: list[tuple[float, int, int, int, int, int]], t0: float, wall: float
) -> list[dict[str, float]]:
    """The samples in tenths of the wall: CPUs busy, server's, client's."""
    out = []
    for tenth in range(10):
        lo, hi = t0 + wall * tenth / 10, t0 + wall * (tenth + 1) / 10
        inside = [s for s in samples if lo <= s[0] <= hi]
        if len(inside) < 2:
            continue
        a, b = inside[0], inside[-1]
        span = b[0] - a[0]
        if span <= 0:
            continue
        out.append(
            {
                "busy_cpus": round((b[1] - a[1]) / TICK / span, 2),
                "server_cpus": round((b[2] - a[2]) / 1e9 / span, 2),
                "client_cpus": round((b[3] - a[3]) / 1e9 / span, 2),
                "client_waiting": round((b[4] - a[4]) / 1e9 / span, 2),
                "ended": b[5],
            }
        )
    return out


def one_round(
    run: Any, server: str, clients: int, spy: str | None = None
) -> dict[str, Any]:
    """
    One round against a fresh ``server``: one JSON line's figures.

    :param spy: where ``py-spy`` (of this checkout's venv) writes the
        server's stacks over the round (collapsed, one line per stack).
    """
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="wall-time-") as base:
        proc, port = start(server, base, token)
        try:
            time.sleep(1.0)
            load = os.getloadavg()[0]
            ended: list[float] = []
            sampler = Sampler(proc.pid, ended)
            server0, children0 = cpu_ticks(proc.pid)
            server_wait0 = schedstat(proc.pid)[1]
            system0 = system_ticks(proc.pid)
            client0 = schedstat(os.getpid())
            busy0 = machine_busy()
            counts0 = machine_counts()
            spying = None
            if spy:
                spying = subprocess.Popen(
                    [
                        os.path.join(os.path.dirname(HERE), ".venv", "bin", "py-spy"),
                        *("record", "--nonblocking", "--rate", "250", "--threads"),
                        *("--format", "raw", "--output", spy, "--pid", str(proc.pid)),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(0.5)
            sampler.start()
            t0 = time.perf_counter()
            results = asyncio.run(streams(run, port, token, clients, ended))
            wall = time.perf_counter() - t0
            sampler.running = False
            sampler.join()
            if spying is not None:
                spying.send_signal(signal.SIGINT)
                spying.wait(30)
            busy1 = machine_busy()
            counts1 = machine_counts()
            client1 = schedstat(os.getpid())
            server_wait1 = schedstat(proc.pid)[1]
            time.sleep(0.5)  # the last children reaped
            server1, children1 = cpu_ticks(proc.pid)
            system1 = system_ticks(proc.pid)
        finally:
            stop(proc)
    done = [r for r in results if not isinstance(r, BaseException)]
    ends = [r[1] for r in done]
    firsts = [r[2] * 1000 for r in done if r[2] is not None]
    samples = sampler.samples
    tail = [s for s in samples if s[0] >= t0 + 0.8 * wall]
    tail_busy = (tail[-1][1] - tail[0][1]) / TICK if len(tail) > 1 else 0.0
    tail_span = tail[-1][0] - tail[0][0] if len(tail) > 1 else 0.0
    busy = (busy1 - busy0) / TICK
    server_cpu = (server1 - server0) / TICK
    children_cpu = (children1 - children0) / TICK
    client_cpu = (client1[0] - client0[0]) / 1e9
    lines = clients * LINES
    return {
        "server": server.split("=", 1)[0],
        "load1": load,
        "ok": sum(1 for r in done if r[0]),
        "wall_s": round(wall, 3),
        "first_p50_ms": round(quantile(firsts, 0.5)) if firsts else None,
        "first_p99_ms": round(quantile(firsts, 0.99)) if firsts else None,
        "end_s": {
            q: round(quantile(ends, v), 2)
            for q, v in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9), ("max", 1.0))
        }
        if ends
        else None,
        "events_per_read": round(
            sum(LINES + 1 for _ in done) / max(1, sum(r[3] for r in done)), 2
        ),
        "server_cpu_s": round(server_cpu, 2),
        "server_system_s": round((system1 - system0) / TICK, 2),
        "server_wait_s": round((server_wait1 - server_wait0) / 1e9, 2),
        "children_cpu_s": round(children_cpu, 2),
        "client_cpu_s": round(client_cpu, 2),
        "client_wait_s": round((client1[1] - client0[1]) / 1e9, 2),
        "machine_busy_s": round(busy, 2),
        "other_cpu_s": round(busy - server_cpu - children_cpu - client_cpu, 2),
        "idle_cpu_s": round(CPUS * wall - busy, 2),
        "tail_idle_cpu_s": round(CPUS * tail_span - tail_busy, 2),
        **{
            f"machine_{k}_s" if k != "switches" else "machine_switches": (
                round((counts1[k] - counts0[k]) / TICK, 2)
                if k != "switches"
                else counts1[k] - counts0[k]
            )
            for k in counts0
        },
        "server_us_per_line": round(server_cpu / lines * 1e6, 1),
        "timeline": timeline(samples, t0, wall),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("servers", nargs="+", help="stdlib or NAME=TREE")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--py-spy", help="the servers' stacks into PREFIX.NAME.ROUND")
    a = ap.parse_args()
    run = harness()
    for n in range(a.rounds):
        for server in a.servers:
            spy = None
            if a.py_spy:
                spy = f"{a.py_spy}.{server.split('=', 1)[0]}.{n}"
            figures = one_round(run, server, a.clients, spy)
            print(json.dumps({"round": n, **figures}), flush=True)


def in_own_session() -> None:
    """:func:`main` in a child that leads a session of its own."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        code = 0
        try:
            main()
        except SystemExit as e:
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    in_own_session()
