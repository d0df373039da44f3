#!/usr/bin/env python3
"""
Where the slow keystrokes' time went, from a scheduler trace taken beside
``bench/keystrokes.py --out``.

A keystroke's round trip crosses four tasks: the client sends it, the
daemon reads it and writes it to the terminal, a kernel worker runs the
terminal's line discipline (which echoes), and the daemon reads the echo
and sends it back to the client.  Each hand-over is a wake-up; a wake-up
that does not find a free CPU waits.  For each slow keystroke this prints,
per task, how long it ran and how long it sat runnable but waiting for a
CPU after being woken, and what else ran on the CPUs meanwhile.  Run::

    perf record -k CLOCK_MONOTONIC -a -o perf.data \\
        -e sched:sched_switch -e sched:sched_wakeup &
    .venv/bin/python bench/keystrokes.py --rounds 5 --out keys.jsonl
    kill -INT %1
    .venv/bin/python bench/keystroke_trace.py perf.data keys.jsonl --slowest 10

``keystrokes.py`` stamps each keystroke with ``CLOCK_MONOTONIC``, the
clock ``-k CLOCK_MONOTONIC`` gives the trace.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections import defaultdict
from typing import Any

_SWITCH = re.compile(
    r"prev_comm=(.*?) prev_pid=(\d+) prev_prio=(\d+) prev_state=(\S+) ==> "
    r"next_comm=(.*?) next_pid=(\d+) next_prio=(\d+)"
)
_WAKEUP = re.compile(r"comm=(.*?) pid=(\d+) prio=(\d+) target_cpu=(\d+)")


def events(data: str, start: float, end: float) -> list[tuple[float, int, str, str]]:
    """(time, cpu, event, fields) of the trace between ``start`` and ``end``."""
    out = subprocess.run(
        [
            "perf",
            "script",
            "-i",
            data,
            "--time",
            f"{start:.6f},{end:.6f}",
            "-F",
            "cpu,time,event,trace",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*\[(\d+)\]\s+([\d.]+):\s+sched:(\w+):\s+(.*)", line)
        if m:
            rows.append((float(m[2]), int(m[1]), m[3], m[4]))
    return rows


def explain(data: str, key: dict[str, Any]) -> dict[str, Any]:
    """One keystroke: per task, time run and time waiting for a CPU once woken."""
    start = key["sent_s"]
    end = start + key["rtt_ms"] / 1000.0
    # From a little before: a task already runnable at the send.
    rows = events(data, start - 0.05, end)
    woken: dict[int, float] = {}
    running: dict[int, tuple[int, float, str]] = {}  # cpu -> (pid, since, label)
    ran: dict[str, float] = defaultdict(float)
    waited: dict[str, float] = defaultdict(float)
    names: dict[int, str] = {}
    ours = {key["server_pid"]: "daemon", key.get("client_pid", -1): "client"}

    def label(pid: int, comm: str, prio: str = "") -> str:
        if pid in ours:
            return ours[pid]
        name = re.sub(r"[/:]?\d+(?=$|[:-])", "", comm) or comm
        # The nice value (a task's prio is 120 + nice): the daemon's
        # children run at 10 unless the policy says otherwise.
        return f"{name}@{int(prio) - 120}" if prio else name

    for at, cpu, event, fields in rows:
        if event == "sched_wakeup":
            m = _WAKEUP.search(fields)
            if m:
                woken[int(m[2])] = at
                names[int(m[2])] = m[1]
            continue
        m = _SWITCH.search(fields)
        if not m:
            continue
        prev, nxt = int(m[2]), int(m[6])
        was = running.get(cpu)
        if was is not None and at > start:
            pid, since, name = was
            ran[name] += at - max(since, start)
        running[cpu] = (nxt, at, label(nxt, m[5], m[7]))
        if m[4].startswith("R") and prev:
            woken[prev] = at  # preempted: runnable from now
        began = woken.pop(nxt, None)
        if began is not None and nxt and at > start:
            waited[label(nxt, m[5], m[7])] += at - max(began, start)
    for _cpu, (_pid, since, name) in running.items():
        ran[name] += end - max(since, start)
    for pid, began in woken.items():
        if pid in ours:
            waited[ours[pid]] += end - max(began, start)
    top = sorted(ran.items(), key=lambda kv: -kv[1])[:6]
    return {
        "index": key["index"],
        "round": key["round"],
        "tree": key["tree"],
        "rtt_ms": round(key["rtt_ms"], 3),
        "waited_for_cpu_ms": {
            k: round(v * 1000, 3)
            for k, v in sorted(waited.items(), key=lambda kv: -kv[1])[:5]
        },
        "on_cpu_ms": {k: round(v * 1000, 3) for k, v in top},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("perf_data")
    parser.add_argument("keys", help="keystrokes.py --out")
    parser.add_argument("--slowest", type=int, default=10)
    parser.add_argument("--tree", help="only this tree's keystrokes")
    parser.add_argument("--index", type=int, help="only keystrokes at this index")
    args = parser.parse_args()
    keys = [json.loads(line) for line in open(args.keys)]
    if args.tree:
        keys = [k for k in keys if k["tree"] == args.tree]
    if args.index is not None:
        keys = [k for k in keys if k["index"] == args.index]
    keys.sort(key=lambda k: -k["rtt_ms"])
    for key in keys[: args.slowest]:
        print(json.dumps(explain(args.perf_data, key)), flush=True)


if __name__ == "__main__":
    main()
