#!/usr/bin/env python3
"""
The fixed cost of one call at concurrency 1, in instructions and in
profiles rather than in wall-clock time: on a shared, loaded machine
``callgrind``'s instruction counts repeat where req/s do not.

For each case a fresh daemon (or the Twisted floor, ``--server floor``)
serves ``--calls`` requests on one keep-alive connection after a warm-up:

- ``--mode callgrind``: the daemon runs under ``valgrind --tool=callgrind``;
  the counters are zeroed after the warm-up and dumped after the calls, so
  the figure is the daemon's instructions per call (its children are not
  traced: ``/shell true`` counts the daemon's side of a spawn only);
- ``--mode cprofile``: the daemon runs under ``cProfile``, switched on
  after the warm-up and off after the calls (``profiled.py``); the top
  frames by own time, and the own time by module (Twisted's, each of
  sandboxd's, the socket and epoll calls), per call;
- ``--mode strace``: ``strace -f`` attached after the warm-up; the system
  calls per call, counted apart for the daemon's threads and for its
  children (a ``posix_spawn`` child runs the spawn's file actions and
  signal resets before its ``execve``, while the daemon waits);
- ``--mode cpu``: the daemon's CPU time per call (all its threads, from
  ``/proc/PID/task/*/schedstat``), the figure a loaded machine stretches
  least after instructions; ``--trees A,B`` alternates two checkouts
  ``--rounds`` times in one run;
- ``--mode time``: plain, microseconds per call (noisy when the machine is).

``--background N`` starts N background ``sleep`` processes through
``/process/start`` before the warm-up: what each call costs while a user's
processes run (a child's exit cost one ``waitpid`` per child alive when
every child was asked on each SIGCHLD).

    .venv/bin/python bench/percall.py --mode callgrind --calls 2000 [--cases health,json,shell]
    .venv/bin/python bench/percall.py --mode cpu --cases shell --trees /tmp/base,. --rounds 5
    .venv/bin/python bench/percall.py --mode cpu --cases shell --concurrency 8 ...
    .venv/bin/python bench/percall.py --mode callgrind --cases shell --policy priority-off.json
    .venv/bin/python bench/percall.py --mode callgrind --cases shell --background 100

One JSON line per case.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import io
import json
import os
import pstats
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import callgrind_total, free_port, schedstat, start_daemon, wait_healthy

#: case → (method, path, JSON body); ``{base}`` is the daemon's base folder.
CASES: dict[str, tuple[str, str, Any]] = {
    "health": ("GET", "/health", None),
    "json": ("GET", "/process/list", None),
    "shell": ("POST", "/shell", {"command": "true"}),
    # W1b's request: a 1 KiB file as base64 JSON.
    "download": ("GET", "/files/download-stream?path={base}/w1b-1k.bin", None),
}

#: The file the ``download`` case reads, written into the base folder.
DOWNLOAD_FIXTURE = ("w1b-1k.bin", 1024)

HERE = os.path.dirname(os.path.abspath(__file__))
PROFILED = os.path.join(HERE, "profiled.py")
#: The Twisted floor (the reactor, the endpoint parser, one resource): this
#: checkout's, run as a script; the shared harness's
#: ``peers/twisted_floor.py`` is the same daemon (``--floor`` takes either).
FLOOR = os.path.join(HERE, "twistd_floor", "floor_tap.py")

#: A profiled function as pstats keys it: (file, line, name).
Frame = tuple[str, int, str]
#: What pstats keeps of a frame: primitive calls, calls, own seconds,
#: cumulative seconds, and the same four for each caller.
Row = tuple[int, int, float, float, dict[Frame, tuple[int, int, float, float]]]


#: The base folder of the daemon being measured (for ``{base}`` in a case).
BASE = ""


def calls(port: int, token: str, case: str, n: int) -> float:
    """``n`` requests of ``case`` on one connection; seconds taken."""
    method, path, body = CASES[case]
    path = path.replace("{base}", BASE)
    payload = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {token}"}
    if payload is not None:
        headers["Content-Type"] = "application/json"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    began = time.perf_counter()
    for _ in range(n):
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"{method} {path}: {response.status}")
    took = time.perf_counter() - began
    conn.close()
    return took


def start_background(port: int, token: str, n: int) -> None:
    """``n`` background processes that outlive the run (the daemon's stop ends them)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    body = json.dumps({"command": "sleep 3600"}).encode()
    for _ in range(n):
        conn.request("POST", "/process/start", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"POST /process/start: {response.status}")
    conn.close()


def _start(args: argparse.Namespace, base: str, token: str, prefix: list[str]) -> Any:
    if args.server == "floor":
        import subprocess

        port = free_port()
        # The profiler's wrapper runs the floor's script itself.
        python = [] if args.mode == "cprofile" else [sys.executable]
        proc = subprocess.Popen(
            [*prefix, *python, args.floor, "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_healthy(proc, port, 120, "floor")
        return proc, port
    env = {"PYTHONHASHSEED": "0"}
    if args.tree:
        # Another checkout's code (a commit exported with git archive).
        env["PYTHONPATH"] = os.path.abspath(args.tree)
        # The profiler's wrapper would put its own folder (this checkout's
        # bench/) first on sys.path, ahead of PYTHONPATH.
        env["PYTHONSAFEPATH"] = "1"
    policy = None
    if args.policy:
        with open(args.policy) as f:
            policy = json.load(f)
    return start_daemon(base, token, policy, prefix=prefix, wait_seconds=120, env=env)


def concurrent_calls(
    port: int, token: str, case: str, n: int, concurrency: int
) -> float:
    """:func:`calls` on ``concurrency`` connections at once, ``n`` in all; seconds taken."""
    if concurrency <= 1:
        return calls(port, token, case, n)
    from concurrent.futures import ThreadPoolExecutor

    each = n // concurrency
    began = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda _: calls(port, token, case, each), range(concurrency)))
    return time.perf_counter() - began


def _user_system_ticks(pid: int) -> tuple[int, int]:
    """Clock ticks ``pid`` has spent in user space and in the kernel (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def _threads(pid: int) -> set[int]:
    return {int(t) for t in os.listdir(f"/proc/{pid}/task")}


_STRACE_LINE = re.compile(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\()")


def _strace_counts(path: str, daemon: set[int]) -> dict[str, dict[str, int]]:
    """
    System calls by name in an ``strace -f -o`` file, for the daemon's
    threads and for the other processes (its children), each counted once
    (a call interrupted and resumed is one call).
    """
    counts: dict[str, dict[str, int]] = {"daemon": {}, "children": {}}
    with open(path) as f:
        for line in f:
            m = _STRACE_LINE.match(line)
            if m is None or m.group(2) is not None:
                continue
            who = "daemon" if int(m.group(1)) in daemon else "children"
            name = m.group(3)
            counts[who][name] = counts[who].get(name, 0) + 1
    return counts


def _strace(
    proc: Any, port: int, token: str, case: str, n: int, out: str
) -> dict[str, Any]:
    import subprocess

    tracer = subprocess.Popen(
        ["strace", "-f", "-o", out, "-p", str(proc.pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # strace says "Process N attached [with M threads]" once it holds them.
    assert tracer.stderr is not None
    while b"attached" not in tracer.stderr.readline():
        if tracer.poll() is not None:
            raise SystemExit("strace could not attach")
    daemon = _threads(proc.pid)
    took = calls(port, token, case, n)
    daemon |= _threads(proc.pid)
    tracer.send_signal(signal.SIGINT)
    tracer.wait(timeout=60)
    counts = _strace_counts(out, daemon)
    return {
        "us_per_call": round(took / n * 1e6, 1),
        "syscalls_per_call": {
            who: {
                "total": round(sum(c.values()) / n, 2),
                "by_name": {
                    k: round(v / n, 2)
                    for k, v in sorted(c.items(), key=lambda kv: -kv[1])
                    if v >= n / 20
                },
            }
            for who, c in counts.items()
        },
    }


def run_case(args: argparse.Namespace, case: str) -> dict[str, Any]:
    token = secrets.token_hex(16)
    work = tempfile.mkdtemp(prefix="percall-")
    base = os.path.join(work, "base")
    os.makedirs(base)
    global BASE
    BASE = base
    name, size = DOWNLOAD_FIXTURE
    with open(os.path.join(base, name), "wb") as f:
        f.write(os.urandom(size))
    prefix: list[str] = []
    out = os.path.join(work, "out")
    if args.mode == "callgrind":
        prefix = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=yes",
            f"--callgrind-out-file={out}.%p",
        ]
    elif args.mode == "cprofile":
        prefix = [sys.executable, PROFILED, out]
    proc, port = _start(args, base, token, prefix)
    row: dict[str, Any] = {
        "workload": "PERCALL",
        "case": case,
        "server": args.server,
        "mode": args.mode,
    }
    if args.background:
        row["background"] = args.background
    try:
        start_background(port, token, args.background)
        calls(port, token, case, args.warmup)
        if args.mode == "strace":
            row.update(_strace(proc, port, token, case, args.calls, out))
            return row
        ran_before = schedstat(proc.pid)[0]
        ticks_before = _user_system_ticks(proc.pid)
        if args.mode == "callgrind":
            os.system(f"callgrind_control -z {proc.pid} >/dev/null")
        elif args.mode == "cprofile":
            os.kill(proc.pid, signal.SIGUSR1)
        took = concurrent_calls(port, token, case, args.calls, args.concurrency)
        row["us_per_call"] = round(took / args.calls * 1e6, 1)
        if args.mode == "cpu":
            ran = schedstat(proc.pid)[0] - ran_before
            row["daemon_cpu_us_per_call"] = round(ran / args.calls / 1e3, 1)
            user, system = (
                (after - before) / os.sysconf("SC_CLK_TCK") / args.calls * 1e6
                for after, before in zip(
                    _user_system_ticks(proc.pid), ticks_before, strict=True
                )
            )
            row["user_us_per_call"] = round(user, 1)
            row["system_us_per_call"] = round(system, 1)
        if args.mode == "cprofile":
            os.kill(proc.pid, signal.SIGUSR2)
            _wait_for(out)
        if args.mode == "callgrind":
            os.system(f"callgrind_control -d {proc.pid} >/dev/null")
            dumps = sorted(glob.glob(f"{out}.{proc.pid}.*"))
            row["instructions_per_call"] = round(
                callgrind_total(dumps[-1]) / args.calls
            )
            if args.keep:
                # For ``callgrind_annotate --inclusive=yes``: where they went.
                kept = os.path.join(args.keep, f"callgrind.{case}.{args.server}")
                shutil.copyfile(dumps[-1], kept)
                row["callgrind_out"] = kept
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except Exception:
            os.killpg(proc.pid, signal.SIGKILL)
    if args.mode == "cprofile":
        table = profile_table(out)
        by_own_time = sorted(table.items(), key=lambda kv: -kv[1][2])
        row["top"] = [
            {
                "frame": frame_name(func),
                "calls": nc,
                "own_us_per_call": round(tt / args.calls * 1e6, 2),
                "cum_us_per_call": round(ct / args.calls * 1e6, 2),
            }
            for func, (_cc, nc, tt, ct, _callers) in by_own_time[: args.top]
        ]
        row["own_us_per_call_by_owner"] = {
            owner: round(seconds / args.calls * 1e6, 2)
            for owner, seconds in sorted(by_owner(table).items(), key=lambda kv: -kv[1])
            if seconds / args.calls * 1e6 >= 0.05
        }
    return row


def profile_table(path: str) -> dict[Frame, Row]:
    """
    The statistics ``profiled.py`` wrote to ``path``, as pstats keeps them
    (its ``Stats.stats``, which typeshed does not declare).
    """
    table: dict[Frame, Row] = vars(pstats.Stats(path, stream=io.StringIO()))["stats"]
    return table


def frame_name(func: Frame) -> str:
    """A frame as pstats prints it: ``file:line(name)``, or ``{name}`` for a builtin."""
    path, line, name = func
    if (path, line) == ("~", 0):
        builtin = name.startswith("<") and name.endswith(">")
        return "{" + name[1:-1] + "}" if builtin else name
    return f"{path}:{line}({name})"


def _wait_for(path: str, seconds: float = 30.0) -> None:
    """Wait until the profiler has written ``path`` (it does on SIGUSR2)."""
    deadline = time.monotonic() + seconds
    size = -1
    while time.monotonic() < deadline:
        now = os.path.getsize(path) if os.path.exists(path) else -1
        if now > 0 and now == size:
            return
        size = now
        time.sleep(0.2)
    raise SystemExit(f"the profiler wrote no {path}")


#: System calls a call waits in, kept apart from the Python that makes them.
_SYSTEM_CALLS = re.compile(r"of '(select\.epoll|_socket\.socket)' objects")


def owner(func: Frame) -> str:
    """
    Who a profiled function belongs to: a module of sandboxd, Twisted, the
    standard library, another package; a socket or epoll method by name.
    """
    path, _line, name = func
    if path == "~":
        m = _SYSTEM_CALLS.search(name)
        return f"system call: {name}" if m else "builtin"
    for marker, label in (("/sandboxd/", "sandboxd."), ("/twisted/", "twisted.")):
        where = path.rfind(marker)
        if where >= 0:
            module = path[where + len(marker) :].removesuffix(".py")
            return label + module.replace("/", ".").removesuffix(".__init__")
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0]
    return "stdlib"


def by_owner(raw: dict[Frame, Row]) -> dict[str, float]:
    """
    Own time by :func:`owner`, a C builtin's (``dict.get``, ``isinstance``)
    counted with the Python code that called it, in proportion to its calls.
    """
    totals: dict[str, float] = {}
    for func, (_cc, nc, tt, _ct, callers) in raw.items():
        who = owner(func)
        if who != "builtin" or not callers or not nc:
            totals[who] = totals.get(who, 0.0) + tt
            continue
        for caller, edge in callers.items():
            share = tt * edge[1] / nc  # edge: (cc, nc, tt, ct) of that caller
            name = owner(caller)
            totals[name] = totals.get(name, 0.0) + share
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument(
        "--mode",
        choices=("callgrind", "cprofile", "strace", "cpu", "time"),
        default="time",
    )
    ap.add_argument("--server", choices=("sandboxd", "floor"), default="sandboxd")
    ap.add_argument("--floor", default=FLOOR, help="the Twisted floor peer")
    ap.add_argument("--cases", default="health,json,shell,download")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--tree", help="run the daemon from this checkout (PYTHONPATH)")
    ap.add_argument("--keep", help="callgrind: copy each case's counts to this folder")
    ap.add_argument(
        "--trees",
        help="comma-separated checkouts, alternated --rounds times in this run",
    )
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--policy", help="the daemon's policy, a JSON file")
    ap.add_argument(
        "--background",
        type=int,
        default=0,
        help="background sleep processes started before the warm-up",
    )
    ap.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="connections at once (--mode cpu/time): W4's 8, say",
    )
    args = ap.parse_args()
    cases = args.cases.split(",")
    if args.server == "floor":
        cases = ["health"]
    trees = args.trees.split(",") if args.trees else [args.tree]
    for n in range(args.rounds):
        for tree in trees:
            args.tree = tree
            for case in cases:
                row = run_case(args, case)
                if args.trees:
                    row["tree"], row["round"] = tree, n
                row["load"] = os.getloadavg()[0]
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
