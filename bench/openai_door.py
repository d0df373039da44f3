#!/usr/bin/env python3
"""
The ``/v1`` door's Responses against the seed's own server, in one run.

Both servers answer the same fake agent (stdlib Python, no model): it reads
the prompt and answers ``hello world`` in two chunks. For sandboxd it speaks
ACP (the agents group's engine: one agent process per conversation); for the
seed (``agent-sandbox-server`` 0.4.0a6) it is a ``codex`` on ``PATH`` that
prints ``codex exec --json`` lines (the seed runs the CLI once per turn).
Each server is driven by the official ``openai`` SDK, cases interleaved:

- ``create``: ``responses.create`` (non-stream) of a new conversation, round
  trip (the agent is started for it on both);
- ``follow_up``: ``responses.create`` with ``previous_response_id`` (sandboxd
  reuses the conversation's agent; the seed starts its CLI again);
- ``first_delta``: ``responses.create(stream=True)`` of a new conversation,
  time to the first ``response.output_text.delta``;
- ``ws_first_delta``: the same over the Responses WebSocket
  (``responses.connect()``, one ``response.create``), timed from the send on
  an open socket; ``ws_follow_up``: on an open socket after a first response,
  a ``response.create`` with its ``previous_response_id``, to the first delta.

Prints one JSON line per case and server: p50 and p90 in milliseconds.
``--baseline`` adds another checkout's sandboxd to the same interleaved
run (A/B); ``--busy`` keeps the CPUs busy with other work meanwhile (what
the daemon's child priorities are about).

    .venv/bin/python bench/openai_door.py [--rounds 30] [--baseline CHECKOUT] [--busy N]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import free_port, start_daemon

#: The ACP fake: initialize, session/new, then each prompt answered in two chunks.
FAKE_ACP = r"""
import json, sys
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    method, mid = m.get("method"), m.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": 1,
              "agentCapabilities": {}, "authMethods": []}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": "s1"}})
    elif method == "session/prompt":
        for text in ("hello ", "world"):
            send({"jsonrpc": "2.0", "method": "session/update", "params": {
                  "sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk",
                  "content": {"type": "text", "text": text}}}})
        send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn"}})
    elif mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no"}})
"""

#: The codex fake: ``codex exec --json`` output for the same answer.
FAKE_CODEX = r"""
import json, sys
sys.stdin.read()
def out(o):
    sys.stdout.write(json.dumps(o) + "\n"); sys.stdout.flush()
out({"type": "thread.started", "thread_id": "t-1"})
out({"type": "turn.started"})
out({"type": "item.completed", "item": {"id": "i0", "type": "agent_message", "text": "hello world"}})
out({"type": "turn.completed", "usage": {"input_tokens": 1, "cached_input_tokens": 0,
     "output_tokens": 2, "reasoning_output_tokens": 0}})
"""


def start_seed(base: str, token: str) -> tuple[subprocess.Popen[bytes], int]:
    """The seed's server with its agents group on and the fake codex first on PATH."""
    bin_dir = os.path.join(base, ".bin")
    os.makedirs(bin_dir)
    codex = os.path.join(bin_dir, "codex")
    with open(codex, "w") as f:
        f.write(f"#!{sys.executable}" + FAKE_CODEX)
    os.chmod(codex, 0o755)
    port = free_port()
    seed = shutil.which("agent-sandbox-server", path=os.path.dirname(sys.executable))
    assert seed is not None, "agent-sandbox-server is not installed in this venv"
    env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "ABX_SERVER_TOKEN": token,
        "ABX_SERVER_ENABLED_GROUPS": "agents",
        "ABX_AGENTS_STATE_DIR": os.path.join(base, ".seed-state"),
    }
    proc = subprocess.Popen(
        [
            seed,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--pty-port",
            str(free_port()),
            "--base-dir",
            base,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the seed's server did not start")


def start_sandboxd(
    base: str, token: str, checkout: str | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """
    sandboxd with the agents group on and the ACP fake in its catalogue;
    with ``checkout``, that checkout's code run by its own ``.venv`` (the
    fake still runs on this interpreter, as the seed's does).
    """
    fake = os.path.join(base, ".fake_acp.py")
    with open(fake, "w") as f:
        f.write(FAKE_ACP)
    policy = {
        "groups": {"agents": True},
        "agents": {
            "catalog": {"codex": {"name": "Fake", "command": [sys.executable, fake]}}
        },
        "endpoints": {"group:agents": {"limits": {"max_sessions": 64}}},
    }
    if checkout is None:
        return start_daemon(base, token, policy)
    python = os.path.join(checkout, ".venv", "bin", "python")
    return start_daemon(
        base, token, policy, env={"PYTHONPATH": checkout}, prefix=[python, "-P"]
    )


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def cases(client: Any) -> dict[str, Callable[[], float]]:
    """Each case: one measured call, in milliseconds."""

    def create() -> float:
        start = time.perf_counter()
        r = client.responses.create(model="codex", input="say hello")
        ms = (time.perf_counter() - start) * 1000
        assert r.output_text == "hello world", r.output_text
        client.responses.delete(r.id)
        return ms

    def follow_up() -> float:
        first = client.responses.create(model="codex", input="say hello")
        start = time.perf_counter()
        r = client.responses.create(
            model="codex", input="again", previous_response_id=first.id
        )
        ms = (time.perf_counter() - start) * 1000
        assert r.output_text == "hello world", r.output_text
        client.responses.delete(r.id)
        client.responses.delete(first.id)
        return ms

    def first_delta() -> float:
        start = time.perf_counter()
        ms = -1.0
        rid = None
        with client.responses.create(
            model="codex", input="say hello", stream=True
        ) as s:
            for event in s:
                if event.type == "response.created":
                    rid = event.response.id
                if event.type == "response.output_text.delta" and ms < 0:
                    ms = (time.perf_counter() - start) * 1000
        assert ms >= 0
        if rid:
            client.responses.delete(rid)
        return ms

    def ws_first_delta() -> float:
        with client.responses.connect() as connection:
            start = time.perf_counter()
            connection.send(
                {"type": "response.create", "model": "codex", "input": "say hello"}
            )
            ms = -1.0
            rid = None
            for event in connection:
                if event.type == "response.created":
                    rid = event.response.id
                if event.type == "response.output_text.delta" and ms < 0:
                    ms = (time.perf_counter() - start) * 1000
                if event.type in _ENDS:
                    break
        assert ms >= 0, event
        if rid:
            client.responses.delete(rid)
        return ms

    def ws_follow_up() -> float:
        with client.responses.connect() as connection:
            connection.send(
                {"type": "response.create", "model": "codex", "input": "say hello"}
            )
            first = [e for e in _one(connection) if e.type == "response.completed"]
            start = time.perf_counter()
            connection.send(
                {
                    "type": "response.create",
                    "model": "codex",
                    "input": "again",
                    "previous_response_id": first[0].response.id,
                }
            )
            ms = -1.0
            for event in _one(connection):
                if event.type == "response.output_text.delta" and ms < 0:
                    ms = (time.perf_counter() - start) * 1000
                if event.type == "response.completed":
                    client.responses.delete(event.response.id)
        client.responses.delete(first[0].response.id)
        assert ms >= 0
        return ms

    return {
        "create": create,
        "follow_up": follow_up,
        "first_delta": first_delta,
        "ws_first_delta": ws_first_delta,
        "ws_follow_up": ws_follow_up,
    }


def _one(connection: Any) -> list[Any]:
    """The events of one response on the Responses WebSocket."""
    events = []
    for event in connection:
        events.append(event)
        if event.type in _ENDS:
            break
    return events


#: The events that end one response on the Responses WebSocket.
_ENDS = ("response.completed", "response.failed", "response.incomplete", "error")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        action="append",
        default=[],
        help="also run this checkout's sandboxd (its .venv), named for its "
        "directory (repeatable)",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="N CPU burners (each its own session, nice 0) while measuring: "
        "the machine busy with other work, as when the user waits",
    )
    args = parser.parse_args()
    from openai import OpenAI

    token = "bench-" + os.urandom(8).hex()
    servers: dict[str, tuple[subprocess.Popen[bytes], Any]] = {}
    bases = []
    burners: list[subprocess.Popen[bytes]] = []
    try:
        starts: list[tuple[str, Callable[[str, str], Any]]] = [
            ("sandboxd", start_sandboxd)
        ]
        for checkout in map(os.path.realpath, args.baseline):
            starts.append(
                (
                    os.path.basename(checkout),
                    functools.partial(start_sandboxd, checkout=checkout),
                )
            )
        starts.append(("seed", start_seed))
        for name, start in starts:
            base = os.path.realpath(tempfile.mkdtemp(prefix=f"oa-{name}-"))
            bases.append(base)
            proc, port = start(base, token)
            client = OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1",
                api_key=token,
                max_retries=0,
                timeout=60,
            )
            servers[name] = (proc, client)
        burners += [
            subprocess.Popen(
                ["sh", "-c", "while :; do :; done"], start_new_session=True
            )
            for _ in range(args.busy)
        ]
        results: dict[tuple[str, str], list[float]] = {}
        for _, client in servers.values():
            for fn in cases(client).values():
                fn()  # warm-up: imports, first spawn
        for _ in range(args.rounds):
            for name, (_, client) in servers.items():
                for case, fn in cases(client).items():
                    results.setdefault((case, name), []).append(fn())
        for (case, name), samples in sorted(results.items()):
            samples.sort()
            print(
                json.dumps(
                    {
                        "bench": "openai_door",
                        "case": case,
                        "server": name,
                        "rounds": len(samples),
                        "p50_ms": round(statistics.median(samples), 1),
                        "p90_ms": round(samples[-(-len(samples) * 9 // 10) - 1], 1),
                    }
                )
            )
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
        for proc, client in servers.values():
            client.close()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for base in bases:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
