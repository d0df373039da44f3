#!/usr/bin/env python3
"""
How the daemon answers while the ``/v1`` door reads a large kept state.

A state dir is filled with ``--sessions`` session files of about
``--kib`` KiB each (the bounds are 100 files of at most 1 MiB), then a
fresh daemon is started on it for each tree given (``--tree``: this one,
and for comparison an older one, run with ``PYTHONPATH=TREE``), rounds
alternating.  In each round one thread asks ``/health`` one at a time on a
keep-alive connection while another makes the first ``/v1`` call (after
one native agents call, so that the group's first-use imports are done)
(``GET /v1/agents/sessions?limit=100``); reported: that call's time, how
many sessions it listed, and the ``/health`` latencies (p50, max) seen
while it waited (the call in flight when it answered included).

    .venv/bin/python bench/openai_state_load.py [--sessions 100] [--kib 900]
        [--rounds 3] [--tree /path/to/older/tree]

One JSON line per round and tree.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import start_daemon

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def session_record(n: int, kib: int) -> dict[str, Any]:
    """One kept session of about ``kib`` KiB: events up to 256 KiB, then items."""
    sid = f"agsess_bench{n:06d}"
    text = "x" * 1000
    events = []
    size = 0
    seq = 0
    while size < min(kib, 250) * 1024:
        seq += 1
        data = {
            "type": "agent.session.turn.output_text.delta",
            "event_id": f"evt_{seq:010d}",
            "delta": text,
        }
        events.append([seq, data["type"], data])
        size += len(json.dumps(data))
    # A kept session ends idle (one cut by a stop would be written again).
    seq += 1
    idle = {"type": "agent.session.idle", "event_id": f"evt_{seq:010d}"}
    events.append([seq, idle["type"], idle])
    items: list[dict[str, Any]] = []
    while size < kib * 1024:
        items.append(
            {
                "id": f"msg_{len(items)}",
                "type": "message",
                "status": "completed",
                "content": [{"type": "output_text", "text": text * 10}],
            }
        )
        size += 10 * 1024
    now = int(time.time())
    return {
        "version": 1,
        "id": sid,
        "owner": "legacy",
        "agent": {"id": "fake", "runtime": "fake", "model": "fake"},
        "environment": {"type": "self_hosted", "id": "env_local"},
        "metadata": {},
        "created_at": now,
        "last_active_at": now,
        "cwd": "/tmp",
        "acp_session_id": None,
        "turns": [
            {
                "id": f"turn_{n}",
                "status": "completed",
                "created_at": now,
                "started_at": now,
                "completed_at": now,
                "error": None,
                "usage": None,
                "items": items,
            }
        ],
        "last_seq": seq,
        "events": events,
    }


def fill(state: str, sessions: int, kib: int) -> None:
    folder = os.path.join(state, "openai", "sessions")
    os.makedirs(folder, mode=0o700)
    for n in range(sessions):
        record = session_record(n, kib)
        with open(os.path.join(folder, record["id"] + ".json"), "w") as f:
            json.dump(record, f)


def one_round(tree: str, sessions: int, kib: int) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="bench-oa-state-")
    state = os.path.join(base, "state")
    fill(state, sessions, kib)
    token = secrets.token_hex(16)
    env = {"PYTHONPATH": tree} if tree != HERE else {}
    proc, port = start_daemon(
        base,
        token,
        policy={"groups": {"agents": True}},
        args=["--state-dir", state],
        env=env,
        wait_seconds=30.0,
    )
    headers = {"Authorization": f"Bearer {token}"}
    health: list[float] = []
    done = threading.Event()

    def poll() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while not done.is_set():
            t0 = time.perf_counter()
            conn.request("GET", "/health")
            conn.getresponse().read()
            health.append(time.perf_counter() - t0)

    try:
        # The group's modules are imported on its first call: done first,
        # through a native route that does not read the /v1 state, so the
        # figures are the state's read alone.
        warm = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        warm.request("GET", "/agents/sessions", headers=headers)
        warm.getresponse().read()
        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.2)
        before = len(health)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        t0 = time.perf_counter()
        conn.request("GET", "/v1/agents/sessions?limit=100", headers=headers)
        answer = conn.getresponse()
        body = json.loads(answer.read())
        took = time.perf_counter() - t0
        # The /health call in flight when the answer came counts too (a
        # reactor blocked by the read holds it until then).
        done.set()
        poller.join()
        during = health[before:]
        return {
            "tree": tree,
            "sessions": sessions,
            "kib": kib,
            "status": answer.status,
            "listed": len(body.get("data", [])),
            "first_v1_s": round(took, 3),
            "health_during": len(during),
            "health_p50_ms": round(statistics.median(during) * 1000, 2)
            if during
            else None,
            "health_max_ms": round(max(during) * 1000, 2) if during else None,
        }
    finally:
        done.set()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--kib", type=int, default=900)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", action="append", default=[])
    args = parser.parse_args()
    trees = [HERE, *args.tree]
    for _ in range(args.rounds):
        for tree in trees:
            print(json.dumps(one_round(tree, args.sessions, args.kib)), flush=True)


if __name__ == "__main__":
    main()
