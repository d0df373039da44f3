#!/usr/bin/env python3
"""
W5's first event right after a burst, step by step: each sample's
``/shell/stream`` path through a daemon run under ``bench/stamped.py``,
so that slow and fast samples can be told apart by where their time went.

For each of ``--samples`` samples (trees alternated, one daemon each): a
burst of ``/shell true`` at concurrency 8 for ``--burst`` seconds (wrk, as
W4), then at once one stream of ``sh -c 'echo a; sleep 1; echo b'``
timed to its first ``stdout`` event; then the daemon's notes, and one JSON
line per sample with, in ms from the stream's send:

- ``accept``, ``handler``, ``spawn_called``: the connection accepted, the
  route's handler called, ``spawn`` called;
- ``spawn_on``: ``reactor`` (inline) or ``thread``; ``queued`` (thread only),
  ``spawn_begin``, ``spawn_end``: ``posix_spawn`` called and returned (it
  returns once the child has exec'd), ``adopted``: the child taken over on the
  reactor;
- ``first_read``, ``event_written``, ``client_event``: the child's first
  output read, its event written to the socket, and read by the client;
- before the accept, counted from wrk's exit: connections lost, tree kills,
  and the reactor's busy ms (not waiting in ``epoll_wait``); ``reactor_busy``:
  its busy ms in the stream's whole window;
- ``gc_runs``, ``gc_oldest``, ``gc_ms``: the cyclic collector's runs from
  wrk's exit to the event, the oldest generation collected, their ms;
- ``killed_pending``: after wrk's exit, the burst's cut requests whose
  child was killed while its spawn was still pending on a spawn thread.

    .venv/bin/python bench/stream_stamps.py --samples 20 --tree base=/tmp/base
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import start_daemon
from first_stream import SETTLE_SECONDS, burst, first_stdout, stream_request

HERE = os.path.dirname(os.path.abspath(__file__))


def stream(port: int, token: str) -> tuple[float, float]:
    """One stream on a fresh connection: (send, first stdout event) times."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body, headers = stream_request(token)
    sent = time.perf_counter()
    conn.connect()
    got = first_stdout(conn, body, headers)
    conn.close()
    return sent, got


def notes_of(path: str, proc: subprocess.Popen[bytes], seen: int) -> list[list[Any]]:
    """The notes the daemon dumps on ``SIGUSR2`` (those after line ``seen``)."""
    os.kill(proc.pid, signal.SIGUSR2)
    for _ in range(200):
        time.sleep(0.01)
        try:
            with open(path) as f:
                lines = f.readlines()
        except FileNotFoundError:
            continue
        if lines and lines[-1].endswith("\n") and '"dumped"' in lines[-1]:
            return [json.loads(line) for line in lines[seen:]]
    raise SystemExit("the daemon did not dump its notes")


def _first(
    notes: list[list[Any]], step: str, since: float, **match: Any
) -> list[Any] | None:
    for row in notes:
        if row[0] < since or row[1] != step:
            continue
        if "thread" in match and row[3] != match["thread"]:
            continue
        if "detail" in match and row[2] != match["detail"]:
            continue
        return row
    return None


def _busy(notes: list[list[Any]], start: float, end: float) -> float:
    """Seconds the reactor's thread spent outside ``epoll_wait`` in [start, end]."""
    busy = 0.0
    mark = start
    polling = False
    for t, step, _, thread in notes:
        if thread != "MainThread" or step not in ("wait", "wait+"):
            continue
        if t < start:
            polling = step == "wait"
            continue
        if t > end:
            break
        if step == "wait":
            if not polling:
                busy += t - mark
            polling = True
        else:
            mark = t
            polling = False
    if not polling:
        busy += end - mark
    return busy


def _collections(notes: list[list[Any]], start: float, end: float) -> dict[str, Any]:
    """
    The collector's runs that began in [start, end]: how many, the oldest
    generation among them (None for none) and the ms they took together.
    """
    runs = 0
    oldest = None
    took = 0.0
    began: float | None = None
    for t, step, generation, _ in notes:
        if step == "gc" and start <= t <= end:
            runs += 1
            oldest = generation if oldest is None else max(oldest, generation)
            began = t
        elif step == "gc+" and began is not None:
            took += t - began
            began = None
    return {"gc_runs": runs, "gc_oldest": oldest, "gc_ms": round(took * 1000, 3)}


def explain(
    notes: list[list[Any]], wrk_end: float, sent: float, got: float
) -> dict[str, Any]:
    """One sample's steps, in ms from the send."""

    def ms(t: float | None) -> float | None:
        return None if t is None else round((t - sent) * 1000, 3)

    out: dict[str, Any] = {
        "first_ms": round((got - sent) * 1000, 3),
        "wrk_end": round((wrk_end - sent) * 1000, 3),
    }
    accept = _first(notes, "accept", sent)
    handler = _first(notes, "handler", sent)
    called = _first(notes, "spawn_called", sent)
    # The stream's child: the first to print its first output (only a
    # stream's child tells the priorities), then its spawn by its pid.
    printed = _first(notes, "first_output", handler[0] if handler else sent)
    pid = printed[2] if printed else None
    end = _first(notes, "posix_spawn+", sent, detail=pid) if pid else None
    begin = None
    if end is not None:
        for row in notes:
            if row[0] > end[0]:
                break
            if row[1] == "posix_spawn" and row[3] == end[3]:
                begin = row
    spawn_on = (
        None if end is None else ("reactor" if end[3] == "MainThread" else "thread")
    )
    adopted = _first(notes, "adopted", sent, detail=pid) if pid else None
    queued = _first(notes, "queued", called[0]) if called else None
    if spawn_on != "thread":
        queued = None
    first_read = _first(notes, "read", sent, detail=[pid, 1]) if pid else None
    write = _first(notes, "write+", first_read[0]) if first_read else None
    window_start = wrk_end
    before = [row for row in notes if wrk_end <= row[0] < (accept or [got])[0]]
    out.update(
        accept=ms(accept[0] if accept else None),
        handler=ms(handler[0] if handler else None),
        spawn_called=ms(called[0] if called else None),
        spawn_on=spawn_on,
        queued=ms(queued[0] if queued else None),
        spawn_begin=ms(begin[0] if begin else None),
        spawn_end=ms(end[0] if end else None),
        adopted=ms(adopted[0] if adopted else None),
        first_read=ms(first_read[0] if first_read else None),
        event_written=ms(write[0] if write else None),
        client_event=ms(got),
        lost_before_accept=sum(1 for row in before if row[1] == "lost"),
        kills_before_accept=sum(1 for row in before if row[1] == "kill_tree"),
        cancels_before_handler=sum(
            1
            for row in notes
            if row[1] == "cancel" and wrk_end <= row[0] < (handler or [got])[0]
        ),
        looks_before_handler=sum(
            1
            for row in notes
            if row[1] == "tree_look" and wrk_end <= row[0] < (handler or [got])[0]
        ),
        busy_before_accept=round(
            _busy(notes, window_start, (accept or [got])[0]) * 1000, 3
        ),
        reactor_busy=round(_busy(notes, sent, got) * 1000, 3),
        killed_pending=sum(
            1 for row in notes if row[1] == "kill_pending" and row[0] >= wrk_end
        ),
        **_collections(notes, wrk_end, got),
        spawns_in_window=sum(
            1 for row in notes if row[1] == "posix_spawn" and wrk_end <= row[0] <= got
        ),
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20, help="per tree")
    parser.add_argument("--burst", type=float, default=1.0)
    parser.add_argument(
        "--tree", action="append", default=[], help="NAME=DIR, another checkout"
    )
    parser.add_argument("--notes", default=None, help="also keep every note here")
    parser.add_argument(
        "--policy", default=None, help="a policy document (JSON) for every daemon"
    )
    args = parser.parse_args()
    policy = None
    if args.policy:
        with open(args.policy) as f:
            policy = json.load(f)
    os.chdir(tempfile.gettempdir())
    trees: dict[str, str | None] = {"this": None}
    for spec in args.tree:
        name, _, path = spec.partition("=")
        trees[name] = path
    token = secrets.token_hex(16)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as base:
        daemons: dict[str, tuple[subprocess.Popen[bytes], int, str]] = {}
        seen: dict[str, int] = {}
        try:
            for name, tree in trees.items():
                env = {"PYTHONPATH": tree} if tree else {}
                home = os.path.join(base, name)
                os.makedirs(home)
                out = os.path.join(base, f"{name}.notes")
                prefix = [sys.executable, os.path.join(HERE, "stamped.py"), out]
                proc, port = start_daemon(
                    home, token, policy=policy, env=env, prefix=prefix
                )
                daemons[name] = (proc, port, out)
                seen[name] = 0
            time.sleep(SETTLE_SECONDS)
            for i in range(args.samples):
                for name, (proc, port, out) in daemons.items():
                    burst(port, token, args.burst)
                    wrk_end = time.perf_counter()
                    sent, got = stream(port, token)
                    time.sleep(1.2)
                    notes = notes_of(out, proc, seen[name])
                    seen[name] += len(notes)
                    if args.notes:
                        with open(args.notes, "a") as f:
                            f.write(
                                json.dumps(
                                    {
                                        "tree": name,
                                        "sample": i,
                                        "wrk_end": wrk_end,
                                        "sent": sent,
                                        "got": got,
                                        "notes": notes,
                                    }
                                )
                                + "\n"
                            )
                    row = {
                        "tree": name,
                        "sample": i,
                        "load_average": round(os.getloadavg()[0], 2),
                        **explain(notes, wrk_end, sent, got),
                    }
                    rows[name].append(row)
                    print(json.dumps(row), flush=True)
        finally:
            for proc, _, _ in daemons.values():
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
    for name, got_rows in rows.items():
        ms = [r["first_ms"] for r in got_rows]
        print(
            json.dumps(
                {
                    "tree": name,
                    "samples": len(ms),
                    "first_ms_median": round(statistics.median(ms), 2),
                    "first_ms_quartiles": [
                        round(q, 2) for q in statistics.quantiles(ms, n=4)
                    ],
                    "on_thread": sum(r["spawn_on"] == "thread" for r in got_rows),
                }
            )
        )


if __name__ == "__main__":
    main()
