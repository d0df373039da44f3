#!/usr/bin/env python3
"""
The reactor's stalls under W4, and whose they are: a fresh daemon from
``TREE`` (``PYTHONPATH``) run with a probe inside it, a ``SECONDS`` ``wrk``
run of ``/shell true`` at 8 connections, then every gap of the reactor
longer than ``--stall`` ms::

    .venv/bin/python bench/lag_probe.py TREE [SECONDS] [--stall=MS] [--cold] [--priority-off]

``--cold`` skips the 2 s warm-up (``compare.sh``'s W4 starts on a fresh
daemon); ``--priority-off`` runs the daemon with ``"priority": false``.
Besides the gaps it prints each child's life from its spawn to its
reaping (a request's answer waits for it), each spawn's wait for the
child's exec, and each session group due to be lowered at
``children_group_after_ms`` with the child's state then (``R ran 0.4
waited 0.9``: runnable, 0.4 ms of CPU had; a wait in progress is not
counted in ``waited`` until the task runs).

The probe (this file run as ``--wrap OUT TWISTD ARGS...``, which starts
twistd in the same process) ticks a ``LoopingCall`` every 5 ms on the
reactor and reads the reactor thread's ``/proc/self/task/TID/schedstat``
at each tick. A gap between two ticks splits into the time the reactor
thread ran (its own work: ours), the time it sat runnable on a run queue
(waiting for a CPU: the machine's), and the rest, asleep (a blocking
system call, the interpreter's lock held by another thread, or simply no
event). A watchdog thread takes the reactor's Python stack once a tick is
overdue, and every collection of the garbage collector is logged with its
generation and length, so that a long gap can be matched to what ran.
"""

from __future__ import annotations

import collections
import gc
import os
import re
import runpy
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import IO, Any

#: How often the probe's tick runs on the reactor.
TICK_SECONDS = 0.005
#: How late a tick must be before the watchdog takes the reactor's stack.
OVERDUE_SECONDS = 0.015


class Probe:
    """The tick, the watchdog and the collector's callback, writing to one file."""

    def __init__(self, out: IO[str], stall_seconds: float) -> None:
        self.out = out
        self.stall = stall_seconds
        self.lines: collections.deque[str] = collections.deque()
        self.last = time.monotonic()
        self.reactor_ident: int | None = None
        self.sampled_for = 0.0
        self.gc_began = 0.0
        self.schedstat = -1
        self.ran = self.waited = 0
        self.ticks = 0
        self.tid = 0
        #: Every thread's schedstat descriptor, and its run and wait at the last tick.
        self.others: dict[int, int] = {}
        self.others_at: dict[int, tuple[int, int]] = {}
        self.listed = 0.0

    def write(self, line: str) -> None:
        """
        Queue ``line``: only the watchdog writes the file, so that a
        collection that starts inside a write can log itself without a
        lock or a reentrant write.
        """
        self.lines.append(line)

    def flush(self) -> None:
        """On the watchdog: the queued lines to the file."""
        while self.lines:
            self.out.write(self.lines.popleft() + "\n")

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """Every collection: when it ended, its generation and milliseconds."""
        now = time.monotonic()
        if phase == "start":
            self.gc_began = now
            return
        took = (now - self.gc_began) * 1000
        self.write(f"gc {now:.6f} {info['generation']} {took:.3f} {info['collected']}")

    def _read(self) -> tuple[int, int]:
        run, wait, _ = os.pread(self.schedstat, 128, 0).split()
        return int(run), int(wait)

    def start_ticking(self, reactor: Any) -> None:
        """On the reactor thread: note who it is and tick every 5 ms."""
        from twisted.internet.task import LoopingCall

        self.reactor_ident = threading.get_ident()
        tid = threading.get_native_id()
        self.schedstat = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        self.tid = tid
        self.ran, self.waited = self._read()
        self.last = time.monotonic()
        self.write(f"start {self.last:.6f} tid {tid}")
        tick = LoopingCall(self.tick)
        tick.clock = reactor
        tick.start(TICK_SECONDS, now=False)

    def _threads(self, now: float) -> dict[int, tuple[int, int]]:
        """Every other thread's run and wait so far (the list renewed each second)."""
        if now - self.listed > 1.0:
            self.listed = now
            for tid in map(int, os.listdir("/proc/self/task")):
                if tid != self.tid and tid not in self.others:
                    try:
                        path = f"/proc/self/task/{tid}/schedstat"
                        self.others[tid] = os.open(path, os.O_RDONLY)
                    except OSError:
                        pass
        found = {}
        for tid, fd in list(self.others.items()):
            try:
                run, wait, _ = os.pread(fd, 128, 0).split()
            except OSError:
                os.close(fd)
                del self.others[tid]
                continue
            found[tid] = (int(run), int(wait))
        return found

    def tick(self) -> None:
        """A gap longer than the stall bound is written with its split."""
        now = time.monotonic()
        ran, waited = self._read()
        others = self._threads(now)
        gap = now - self.last
        self.ticks += 1
        if gap >= self.stall:
            split = []
            for tid, (run, wait) in others.items():
                run0, wait0 = self.others_at.get(tid, (run, wait))
                if run - run0 + wait - wait0 > 500_000:
                    split.append(
                        f"{tid}:{(run - run0) / 1e6:.1f}/{(wait - wait0) / 1e6:.1f}"
                    )
            self.write(
                f"stall {self.last:.6f} {gap * 1000:.3f} "
                f"ran {(ran - self.ran) / 1e6:.3f} waited {(waited - self.waited) / 1e6:.3f} "
                f"load {_procs_running()} threads {','.join(split) or '-'}"
            )
        self.last = now
        self.ran, self.waited = ran, waited
        self.others_at = others

    def watch_children(self) -> None:
        """
        Each child's life from its spawn's return to its reaping, each
        spawn's wait for the child's exec, and each session group lowered
        because its child outlived ``children_group_after_ms``.
        """
        from sandboxd.processes import priority, spawning

        children = priority.CHILD_PRIORITY
        born: dict[int, float] = {}
        spawned, ended, lower = children.spawned, children.ended, children._lower_due
        record = spawning.SPAWN_TIMES.record

        def on_spawned(
            pid: int, tracked: bool = True, lowers_itself: bool = False
        ) -> None:
            born[pid] = time.monotonic()
            spawned(pid, tracked, lowers_itself)

        def on_ended(pid: int) -> None:
            began = born.pop(pid, None)
            if began is not None:
                self.write(f"child {began:.6f} {(time.monotonic() - began) * 1000:.3f}")
            ended(pid)

        def on_lower() -> None:
            now = children._reactor().seconds()
            due = [pid for pid, (when, _) in children._young.items() if when <= now]
            lower()
            for pid in due:
                what = "postponed" if pid in children._young else "lowered"
                self.write(f"{what} {time.monotonic():.6f} {pid} {_task_state(pid)}")

        def on_record(seconds: float) -> None:
            self.write(f"spawn {time.monotonic():.6f} {seconds * 1000:.3f}")
            record(seconds)

        from sandboxd.daemon import server

        module: Any = server
        sweep = module.trim_when_free

        def on_sweep(limit: int) -> bool:
            began = time.monotonic()
            trimmed = bool(sweep(limit))
            self.write(
                f"sweep {began:.6f} {(time.monotonic() - began) * 1000:.3f} {trimmed}"
            )
            return trimmed

        module.trim_when_free = on_sweep
        children.spawned = on_spawned  # type: ignore[method-assign]
        children.ended = on_ended  # type: ignore[method-assign]
        children._lower_due = on_lower  # type: ignore[method-assign]
        spawning.SPAWN_TIMES.record = on_record  # type: ignore[method-assign]

    def watch(self) -> None:
        """A thread: the reactor's stack, once per overdue tick."""
        while True:
            time.sleep(TICK_SECONDS)
            self.flush()
            last = self.last
            if self.reactor_ident is None or last == self.sampled_for:
                continue
            late = time.monotonic() - last
            if late < OVERDUE_SECONDS:
                continue
            self.sampled_for = last
            syscall = _syscall_of(self.tid)
            frame = sys._current_frames().get(self.reactor_ident)
            if frame is None:
                continue
            frames = traceback.extract_stack(frame)[-6:]
            where = " < ".join(
                f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}"
                for f in reversed(frames)
            )
            self.write(f"stack {last:.6f} {late * 1000:.3f} syscall={syscall} {where}")


def _syscall_of(tid: int) -> str:
    """The system call ``tid`` is in (its number), ``running``, or ``?``."""
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            return f.read().split()[0]
    except (OSError, IndexError):
        return "?"


def _task_state(pid: int) -> str:
    """A child's state letter, and its milliseconds run and waiting for a CPU."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/schedstat") as f:
            run, wait, _ = f.read().split()
    except (OSError, ValueError, IndexError):
        return "gone"
    return f"{state} ran {int(run) / 1e6:.1f} waited {int(wait) / 1e6:.1f}"


def _tcp_counters() -> dict[str, int]:
    """The machine's TCP retransmission and drop counters (``/proc/net``)."""
    wanted = {
        "RetransSegs",
        "TCPTimeouts",
        "ListenDrops",
        "ListenOverflows",
        "TCPBacklogDrop",
    }
    found: dict[str, int] = {}
    for path in ("/proc/net/snmp", "/proc/net/netstat"):
        with open(path) as f:
            lines = f.read().splitlines()
        for names, values in zip(lines[::2], lines[1::2], strict=True):
            for name, value in zip(names.split()[1:], values.split()[1:], strict=True):
                if name in wanted:
                    found[name] = int(value)
    return found


def _procs_running() -> str:
    """The machine's runnable tasks now (``/proc/loadavg``'s fourth field)."""
    with open("/proc/loadavg") as f:
        return f.read().split()[3]


def wrap(out_path: str, argv: list[str]) -> None:
    """Run twistd (``argv``) in this process with the probe inside."""
    out = open(out_path, "a", buffering=1)
    probe = Probe(out, float(os.environ.get("LAG_PROBE_STALL_MS", "15")) / 1000)
    gc.callbacks.append(probe.on_gc)

    def wait_for_reactor() -> None:
        # The module's entry is the module itself until it has installed
        # the reactor in its place.
        while not hasattr(
            sys.modules.get("twisted.internet.reactor"), "callFromThread"
        ):
            time.sleep(0.02)
        reactor: Any = sys.modules["twisted.internet.reactor"]
        reactor.callFromThread(probe.start_ticking, reactor)
        reactor.callFromThread(probe.watch_children)
        probe.watch()

    threading.Thread(target=wait_for_reactor, name="lag-probe", daemon=True).start()
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


def summarize(log: str, stall_ms: float) -> None:
    """The stalls in the probe's log, each with its split and what ran."""
    gcs: list[tuple[float, int, float]] = []
    stalls: list[tuple[float, float, float, float, str, str]] = []
    stacks: dict[str, str] = {}
    with open(log) as f:
        for line in f:
            parts = line.split()
            if parts[0] == "gc":
                gcs.append((float(parts[1]), int(parts[2]), float(parts[3])))
            elif parts[0] == "stall":
                stalls.append(
                    (
                        float(parts[1]),
                        float(parts[2]),
                        float(parts[4]),
                        float(parts[6]),
                        parts[8],
                        parts[10],
                    )
                )
            elif parts[0] == "stack":
                stacks[parts[1]] = " ".join(parts[3:])
    lives: list[float] = []
    spawns: list[float] = []
    lowered = 0
    with open(log) as f:
        for line in f:
            parts = line.split()
            if parts[0] == "child":
                lives.append(float(parts[2]))
            elif parts[0] == "spawn":
                spawns.append(float(parts[2]))
            elif parts[0] == "sweep":
                print(f"  heap sweep: {float(parts[2]):.2f} ms, trimmed: {parts[3]}")
            elif parts[0] in ("lowered", "postponed"):
                lowered += parts[0] == "lowered"
                print(f"  {parts[0]}: " + " ".join(parts[3:]))
    for name, values in (("child lives", lives), ("spawn waits", spawns)):
        values.sort()
        if values:
            q = [values[int(len(values) * f)] for f in (0.5, 0.99)]
            over = " ".join(
                f">={b}ms:{sum(v >= b for v in values)}" for b in (30, 50, 100)
            )
            print(
                f"{name}: n {len(values)} p50 {q[0]:.1f} p99 {q[1]:.1f} "
                f"max {values[-1]:.1f} ms; {over}"
            )
    print(f"session groups lowered at children_group_after_ms: {lowered}")
    generations = [0, 0, 0]
    for _, gen, _ in gcs:
        generations[gen] += 1
    slowest = sorted(gcs, key=lambda g: -g[2])[:3]
    print(
        f"collections by generation {generations}; slowest "
        + ", ".join(f"gen {g} {ms:.1f} ms" for _, g, ms in slowest)
    )
    bounds = (stall_ms, 30, 50, 100)
    print(
        "stalls >= "
        + ", ".join(f"{b:g} ms: {sum(s[1] >= b for s in stalls)}" for b in bounds)
    )
    for began, gap, ran, waited, running, others in sorted(stalls, key=lambda s: -s[1])[
        :15
    ]:
        asleep = gap - ran - waited
        during = [
            f"gen{g} {ms:.1f}ms"
            for end, g, ms in gcs
            if began < end <= began + gap / 1000
        ]
        print(
            f"  {gap:7.1f} ms: ran {ran:6.1f} waited {waited:6.1f} asleep {asleep:6.1f}"
            f" runnable {running:>3} gc [{', '.join(during)}]"
        )
        print(f"           other threads ran/waited ms: {others}")
        stack = stacks.get(f"{began:.6f}")
        if stack:
            print(f"           {stack}")


def main() -> None:
    if sys.argv[1] == "--wrap":
        wrap(sys.argv[2], sys.argv[3:])
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from daemon import start_daemon, stop_all
    from switches import post_script

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    cold = "--cold" in sys.argv
    stall_ms = 15.0
    for a in sys.argv[1:]:
        if a.startswith("--stall="):
            stall_ms = float(a.split("=", 1)[1])
    tree = args[0]
    seconds = int(args[1]) if len(args) > 1 else 30
    base = tempfile.mkdtemp(prefix="lag-probe-")
    log = os.path.join(base, ".lag.log")
    token = secrets.token_hex(8)
    os.environ["PYTHONPATH"] = os.path.abspath(tree)
    prefix = [sys.executable, os.path.abspath(__file__), "--wrap", log]
    # ``--priority-off``: the same with the children's priorities off, to
    # tell the machine's share of a child's wait from their weights'.
    policy: dict[str, Any] = {"priority": False} if "--priority-off" in sys.argv else {}
    proc, port = start_daemon(
        base, token, policy, prefix=prefix, env={"LAG_PROBE_STALL_MS": str(stall_ms)}
    )
    script = post_script(base, token)
    wrk = [
        "wrk",
        "-t1",
        "-c8",
        "--latency",
        "-s",
        script,
        f"http://127.0.0.1:{port}/shell",
    ]
    try:
        if not cold:
            subprocess.run([*wrk, "-d2"], capture_output=True)
        load = os.getloadavg()[0]
        tcp = _tcp_counters()
        began = time.monotonic()
        report = subprocess.run(
            [*wrk, f"-d{seconds}"], capture_output=True, text=True
        ).stdout
        tcp_after = _tcp_counters()
    finally:
        stop_all([proc])
    rate = re.search(r"Requests/sec:\s+([\d.]+)", report)
    tail = {p: re.search(rf"\s{p}%\s+(\S+)", report) for p in ("50", "99")}
    top = re.search(r"Latency\s+\S+\s+\S+\s+(\S+)", report)
    print(
        f"{tree}: {rate.group(1) if rate else '?'} commands/s, "
        + " ".join(f"p{p} {m.group(1) if m else '?'}" for p, m in tail.items())
        + f" max {top.group(1) if top else '?'}, load {load:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    print(f"log: {log}; wrk began at {began:.6f}")
    print(
        "machine's TCP counters over the run: "
        + " ".join(
            f"{k} {tcp_after[k] - tcp[k]}" for k in tcp if tcp_after[k] != tcp[k]
        )
    )
    summarize(log, stall_ms)


if __name__ == "__main__":
    main()
