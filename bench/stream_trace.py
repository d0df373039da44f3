#!/usr/bin/env python3
"""
Where a stream's child spent its time before its first output was read,
from a scheduler trace taken beside ``bench/stream_stamps.py --notes``.

``posix_spawn`` returns once the child has exec'd, so the daemon's stamps
cannot tell a child that ran slowly from one that waited for a CPU.  The
trace can: for each sample's stream child it splits the time from its
fork to the daemon's first read of its output into three phases (fork to
``setsid``, ``setsid`` to ``exec``, ``exec`` to the read) and each phase
into time run, time runnable but waiting for a CPU, and time asleep (after
``exec``, mostly the child done printing and waiting for ``sleep`` while
the daemon has not read it yet), with what ran instead while it waited
(command and kernel priority: 115 is nice -5, 130 nice 10).  Run::

    perf record -k CLOCK_MONOTONIC -a -o perf.data -e sched:sched_switch \\
        -e sched:sched_wakeup -e sched:sched_wakeup_new \\
        -e sched:sched_process_fork -e sched:sched_process_exec \\
        -e syscalls:sys_exit_setsid &
    .venv/bin/python bench/stream_stamps.py --samples 15 --notes notes.jsonl
    kill -INT %1
    .venv/bin/python bench/stream_trace.py perf.data notes.jsonl

Both clocks are ``CLOCK_MONOTONIC``.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import re
import subprocess
from typing import Any

_LINE = re.compile(r"\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)")
_SWITCH = re.compile(
    r"prev_comm=(.*?) prev_pid=(\d+) prev_prio=(\d+) prev_state=(\S+) ==> "
    r"next_comm=(.*?) next_pid=(\d+) next_prio=(\d+)"
)
_WAKEUP = re.compile(r"comm=(.*?) pid=(\d+) prio=(\d+)")
_FORK = re.compile(r"child_pid=(\d+)")

Event = tuple[float, int, str, str]  # time, tid, event, fields


def events(data: str) -> list[Event]:
    """The trace's events, in time order."""
    out = subprocess.run(
        ["perf", "script", "-i", data, "-F", "comm,pid,tid,cpu,time,event,trace"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        m = _LINE.match(line)
        if m:
            rows.append((float(m[5]), int(m[3]), m[6], m[7]))
    rows.sort()
    return rows


def _stream_child(sample: dict[str, Any]) -> tuple[int | None, float | None]:
    """The stream's child (the first to tell its first output) and its first read."""
    sent = sample["sent"]
    pid = next(
        (
            d
            for t, step, d, _ in sample["notes"]
            if t >= sent and step == "first_output"
        ),
        None,
    )
    read = next(
        (
            t
            for t, step, d, _ in sample["notes"]
            if t >= sent and step == "read" and d == [pid, 1]
        ),
        None,
    )
    return pid, read


def explain(rows: list[Event], times: list[float], sample: dict[str, Any]) -> Any:
    """One sample: the child's phases, each as run / wait / sleep ms."""
    pid, first_read = _stream_child(sample)
    sent = sample["sent"]
    if pid is None or first_read is None:
        return None
    start = bisect.bisect_left(times, sent - 0.01)
    fork = setsid = execd = None
    state = since = None
    spent: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    behind: collections.Counter[str] = collections.Counter()

    def phase() -> str:
        if setsid is None:
            return "fork>setsid"
        if execd is None:
            return "setsid>exec"
        return "exec>read"

    def move(t: float, new: str) -> None:
        nonlocal state, since
        if state is not None and since is not None:
            spent[phase()][state] += t - since
        state, since = new, t

    for t, tid, name, fields in rows[start:]:
        if t > first_read:
            break
        if name == "sched:sched_process_fork":
            m = _FORK.search(fields)
            if m and int(m[1]) == pid:
                fork = t
                state, since = "wait", t
            continue
        if fork is None:
            continue
        if name == "syscalls:sys_exit_setsid" and tid == pid:
            move(t, state or "run")
            setsid = t
        elif name == "sched:sched_process_exec" and tid == pid:
            move(t, state or "run")
            execd = t
        elif name == "sched:sched_switch":
            m = _SWITCH.match(fields)
            if m is None:
                continue
            if int(m[2]) == pid:
                move(t, "wait" if m[4].startswith("R") else "sleep")
            if int(m[6]) == pid:
                move(t, "run")
            elif state == "wait":
                behind[f"{m[5]}/{m[7]}"] += 1
        elif name in ("sched:sched_wakeup", "sched:sched_wakeup_new"):
            m = _WAKEUP.match(fields)
            if m and int(m[2]) == pid and state == "sleep":
                move(t, "wait")
    if since is not None:
        move(first_read, state or "run")

    def ms(t: float | None) -> float | None:
        return None if t is None else round((t - sent) * 1000, 2)

    return {
        "tree": sample["tree"],
        "sample": sample["sample"],
        "first_ms": ms(sample["got"]),
        "fork": ms(fork),
        "setsid": ms(setsid),
        "exec": ms(execd),
        "first_read": ms(first_read),
        "phases": {
            name: {k: round(v * 1000, 2) for k, v in counts.items()}
            for name, counts in spent.items()
        },
        "waited_behind": behind.most_common(5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="perf.data")
    parser.add_argument("notes", help="stream_stamps.py --notes output")
    args = parser.parse_args()
    rows = events(args.data)
    times = [row[0] for row in rows]
    with open(args.notes) as f:
        for line in f:
            got = explain(rows, times, json.loads(line))
            if got is not None:
                print(json.dumps(got))


if __name__ == "__main__":
    main()
