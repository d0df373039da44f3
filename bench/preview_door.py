#!/usr/bin/env python3
"""
The preview door against nginx as a reverse proxy, in one run, to the same
upstreams.

Starts, on loopback ports: an nginx serving static files (the origin of the
1 KiB and 64 MiB cases), the SSE/WebSocket app of
``bench/preview_upstream.py``, an nginx reverse proxy to both (HTTP/1.1 and
keep-alive to the origin, ``proxy_buffering off`` and the upgrade headers
for the app, as a dev preview is usually set up), and a fresh daemon with
its preview door (the ``preview`` group on, both ports exposed ``public``
so neither proxy checks a credential). Then, through each proxy and
directly:

- ``wrk`` GETs of a 1 KiB file at ``--connections`` (32): requests/s, and
  the proxy's own CPU time per request (its processes' user and system
  time over the run, from ``/proc``);
- a 64 MiB download with ``http.client``: MB/s (MiB per second);
- the first event of an event stream: median time from request to event,
  and what the proxy adds to going direct;
- WebSocket echo of a small message (``websocket-client``), ``--messages``
  round trips: p50/p99, and the p99 the proxy adds.

Prints one JSON line per case and proxy.  Needs nginx and wrk
(apt-get install nginx wrk); says so and stops when they are missing.

``--instructions N`` measures instead what the machine's load cannot
move: the instructions the daemon executes for ``N`` small GETs through
its door (``valgrind --tool=callgrind``, counted only while those
requests run, after 300 to warm up), per GET, for this tree and
``--base-tree``.

Every round runs each proxy once, in a rotated order, and the figures are
the medians over ``--rounds``: a burst of load elsewhere on a shared
machine then falls on every proxy alike.  ``--base-tree`` adds a daemon
run from another checkout (an A/B of two versions of the door).

    .venv/bin/python bench/preview_door.py [--duration 5] [--connections 32]
        [--rounds 3] [--base-tree ../main]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

MiB = 1024 * 1024
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon import free_port, start_with_door, stop_all  # noqa: E402

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {base}/nginx-{name}.pid;
error_log {base}/nginx-{name}.err;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {base}/tmp-{name};
    proxy_temp_path {base}/ptmp-{name};
    fastcgi_temp_path {base}/f-{name};
    uwsgi_temp_path {base}/u-{name};
    scgi_temp_path {base}/s-{name};
    sendfile on;
    keepalive_requests 100000;
    {body}
}}
"""

ORIGIN = """
    server {{
        listen 127.0.0.1:{port};
        root {root};
    }}
"""

PROXY = """
    upstream origin {{ server 127.0.0.1:{origin}; keepalive 32; }}
    upstream app {{ server 127.0.0.1:{app}; keepalive 32; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
        location /sse {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
        location /ws {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";
        }}
    }}
"""


def start_nginx(base: str, name: str, body: str) -> subprocess.Popen[bytes]:
    """One nginx (one worker) with ``body`` as its http block's servers."""
    path = os.path.join(base, f"nginx-{name}.conf")
    with open(path, "w") as f:
        f.write(NGINX_CONF.format(base=base, name=name, body=body))
    return subprocess.Popen(
        ["nginx", "-c", path, "-p", base],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_port(port: int) -> None:
    """Until something accepts on ``port`` (10 s at most)."""
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def wrk(port: int, host: str, path: str, connections: int, duration: float) -> float:
    """Requests per second of ``wrk`` GETs."""
    out = subprocess.run(
        [
            "wrk",
            "-t2",
            f"-c{connections}",
            f"-d{int(duration)}s",
            "-H",
            f"Host: {host}",
            f"http://127.0.0.1:{port}{path}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = re.search(r"Requests/sec:\s+([0-9.]+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m is None or errors is not None:
        raise RuntimeError(f"wrk failed:\n{out}")
    return float(m.group(1))


def download(port: int, host: str, path: str, rounds: int) -> float:
    """Best MiB/s of reading ``path`` whole."""
    best = 0.0
    for _ in range(rounds):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        started = time.monotonic()
        c.request("GET", path, headers={"Host": host})
        r = c.getresponse()
        n = 0
        while chunk := r.read(1024 * 1024):
            n += len(chunk)
        elapsed = time.monotonic() - started
        c.close()
        if r.status != 200 or n != 64 * MiB:
            raise RuntimeError(f"download: {r.status}, {n} bytes")
        best = max(best, n / MiB / elapsed)
    return best


def first_event(port: int, host: str, rounds: int) -> list[float]:
    """Seconds from sending a GET /sse to reading its first event, each round."""
    times = []
    for _ in range(rounds):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.monotonic()
        s.sendall(
            f"GET /sse HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        data = b""
        while b"data: first" not in data:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError(f"sse: closed after {data!r}")
            data += chunk
        times.append(time.monotonic() - started)
        s.close()
    return times


def ws_echo(port: int, host: str, messages: int) -> list[float]:
    """Round-trip seconds of ``messages`` small WebSocket echoes."""
    import websocket

    ws = websocket.create_connection(
        f"ws://127.0.0.1:{port}/ws", host=host, timeout=10, enable_multithread=False
    )
    assert ws.sock is not None
    ws.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    try:
        for i in range(messages):
            started = time.monotonic()
            ws.send(f"m{i}")
            ws.recv()
            times.append(time.monotonic() - started)
    finally:
        ws.close()
    return times


def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def workers(pid: int) -> list[int]:
    """The children of ``pid`` (an nginx master's workers)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds ``pids`` have used."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def measure(
    name: str,
    targets: tuple[tuple[int, str], tuple[int, str]],
    args: Any,
    pids: list[int],
) -> dict[str, Any]:
    """
    One round of every case through one proxy; ``pids`` are the proxy's
    processes, whose CPU per small GET is a figure the machine's load
    moves far less than requests per second.
    """
    (sport, shost), (aport, ahost) = targets
    r: dict[str, Any] = {"proxy": name}
    before = cpu_seconds(pids)
    r["get_1k_rps"] = wrk(sport, shost, "/1k.bin", args.connections, args.duration)
    spent = cpu_seconds(pids) - before
    r["get_1k_cpu_us"] = spent / (r["get_1k_rps"] * args.duration) * 1e6
    r["download_64m_mib_s"] = download(sport, shost, "/64m.bin", 1)
    r["sse_first_event_ms_p50"] = (
        statistics.median(first_event(aport, ahost, args.events)) * 1000
    )
    echoes = ws_echo(aport, ahost, args.messages)
    r["ws_echo_ms_p50"] = pct(echoes, 50) * 1000
    r["ws_echo_ms_p99"] = pct(echoes, 99) * 1000
    return r


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the rounds (best for throughput's spread too)."""
    out: dict[str, Any] = {"proxy": rounds[0]["proxy"], "rounds": len(rounds)}
    for key in rounds[0]:
        if key == "proxy":
            continue
        values = [r[key] for r in rounds]
        out[key] = round(statistics.median(values), 3)
    return out


def start_door(
    base: str,
    name: str,
    tree: str | None,
    origin: int,
    app: int,
    prefix: tuple[str, ...] = (),
) -> tuple[subprocess.Popen[bytes], int]:
    """
    A fresh daemon (from ``tree`` when given, under ``prefix``) with its
    door; both ports exposed public.
    """
    token = "bench-" + os.urandom(8).hex()
    home = os.path.join(base, f"home-{name}")
    os.makedirs(home)
    daemon, api, door = start_with_door(
        home,
        token,
        {},
        "preview",
        tree,
        prefix=prefix,
        wait_seconds=120 if prefix else 10,
    )
    for port in (origin, app):
        c = http.client.HTTPConnection("127.0.0.1", api, timeout=10)
        c.request(
            "POST",
            "/preview/ports",
            body=json.dumps({"port": port, "public": True}),
            headers={"X-Access-Token": token, "Content-Type": "application/json"},
        )
        r = c.getresponse()
        if r.status != 201:
            raise RuntimeError(f"expose {port}: {r.status} {r.read()!r}")
    return daemon, door


def fixed_gets(port: int, host: str, count: int, connections: int = 8) -> None:
    """``count`` GETs of ``/1k.bin`` over ``connections`` kept-alive connections."""
    import selectors

    head = f"GET /1k.bin HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\n\r\n".encode()
    selector = selectors.DefaultSelector()
    left, done = count, 0
    sockets = []
    for _ in range(min(connections, count)):
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sockets.append(s)
        selector.register(s, selectors.EVENT_READ, [b""])
        s.sendall(head)
        left -= 1
    try:
        while done < count:
            ready = selector.select(60)
            if not ready:
                raise RuntimeError("no answer in 60 s")
            for key, _ in ready:
                conn, buffer = key.fileobj, key.data
                assert isinstance(conn, socket.socket)
                chunk = conn.recv(65536)
                if not chunk:
                    raise RuntimeError("the door closed a connection")
                buffer[0] += chunk
                while (end := buffer[0].find(b"\r\n\r\n")) >= 0:
                    if not buffer[0].startswith(b"HTTP/1.1 200"):
                        raise RuntimeError(f"not a 200: {buffer[0][:80]!r}")
                    size = end + 4 + 1024  # the file's length, kept by the door
                    if len(buffer[0]) < size:
                        break
                    buffer[0] = buffer[0][size:]
                    done += 1
                    if left > 0:
                        conn.sendall(head)
                        left -= 1
    finally:
        for s in sockets:
            s.close()


def instructions(args: Any) -> None:
    """Instructions per small GET in each daemon, under callgrind (see the module)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("preview_door.py: valgrind not installed; skipped", file=sys.stderr)
        return
    base = tempfile.mkdtemp(prefix="sandboxd-preview-bench-")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        os.chmod(base, 0o755)
        root = os.path.join(base, "www")
        os.makedirs(root)
        with open(os.path.join(root, "1k.bin"), "wb") as f:
            f.write(b"x" * 1024)
        os.chmod(os.path.join(root, "1k.bin"), 0o644)
        origin = free_port()
        procs.append(start_nginx(base, "origin", ORIGIN.format(port=origin, root=root)))
        wait_port(origin)
        doors = [("sandboxd", None)]
        if args.base_tree:
            doors.append(("base", args.base_tree))
        for name, tree in doors:
            out = os.path.join(base, f"callgrind-{name}.out")
            prefix = (
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out}",
                sys.executable,
            )
            daemon, door = start_door(base, name, tree, origin, origin, prefix)
            procs.append(daemon)
            host = f"{origin}.localhost:{door}"
            fixed_gets(door, host, 300)
            control = ["callgrind_control"]
            subprocess.run(
                [*control, "-i", "on", str(daemon.pid)], check=True, capture_output=True
            )
            fixed_gets(door, host, args.instructions)
            subprocess.run(
                [*control, "-i", "off", str(daemon.pid)],
                check=True,
                capture_output=True,
            )
            subprocess.run(
                [*control, "-d", str(daemon.pid)], check=True, capture_output=True
            )
            total = 0
            for entry in os.listdir(base):
                if entry.startswith(f"callgrind-{name}.out"):
                    with open(os.path.join(base, entry)) as f:
                        for line in f:
                            if line.startswith("totals:"):
                                total += int(line.split()[1])
            print(
                json.dumps(
                    {
                        "workload": "PREVIEW_INSTRUCTIONS",
                        "proxy": name,
                        "gets": args.instructions,
                        "instructions_per_get": round(total / args.instructions),
                    }
                )
            )
    finally:
        stop_all(procs, 30)
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument(
        "--base-tree",
        help="also run a daemon from this checkout (PYTHONPATH), as 'base'",
    )
    parser.add_argument(
        "--instructions",
        type=int,
        metavar="N",
        help="count the daemon's instructions per small GET over N GETs instead",
    )
    args = parser.parse_args()
    if args.instructions:
        instructions(args)
        return
    missing = [tool for tool in ("nginx", "wrk") if shutil.which(tool) is None]
    if missing:
        print(
            f"preview_door.py: {', '.join(missing)} not installed (apt-get install nginx wrk); skipped",
            file=sys.stderr,
        )
        return
    base = tempfile.mkdtemp(prefix="sandboxd-preview-bench-")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # nginx's workers drop to an unprivileged user: they must read these.
        os.chmod(base, 0o755)
        root = os.path.join(base, "www")
        os.makedirs(root)
        with open(os.path.join(root, "1k.bin"), "wb") as f:
            f.write(b"x" * 1024)
        with open(os.path.join(root, "64m.bin"), "wb") as f:
            f.write(os.urandom(64 * MiB))
        for name in ("1k.bin", "64m.bin"):
            os.chmod(os.path.join(root, name), 0o644)
        origin, app, proxy = free_port(), free_port(), free_port()
        procs.append(start_nginx(base, "origin", ORIGIN.format(port=origin, root=root)))
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    os.path.join(os.path.dirname(__file__), "preview_upstream.py"),
                    str(app),
                ],
                start_new_session=True,
            )
        )
        procs.append(
            start_nginx(base, "proxy", PROXY.format(origin=origin, app=app, port=proxy))
        )
        for port in (origin, app, proxy):
            wait_port(port)
        targets = {
            "direct": ((origin, f"127.0.0.1:{origin}"), (app, f"127.0.0.1:{app}")),
            "nginx": ((proxy, f"127.0.0.1:{proxy}"), (proxy, f"127.0.0.1:{proxy}")),
        }
        pids: dict[str, list[int]] = {}
        doors = [("sandboxd", None)]
        if args.base_tree:
            doors.append(("base", args.base_tree))
        for name, tree in doors:
            daemon, door = start_door(base, name, tree, origin, app)
            procs.append(daemon)
            pids[name] = [daemon.pid]
            targets[name] = (
                (door, f"{origin}.localhost:{door}"),
                (door, f"{app}.localhost:{door}"),
            )
        # Whose CPU a small GET costs: the origin's worker going direct,
        # the proxy's worker for nginx, the daemon for a door.
        pids["direct"] = workers(procs[0].pid)
        pids["nginx"] = workers(procs[2].pid)
        # Alternate: every round runs each proxy once, in a rotated order,
        # so a burst of load elsewhere on the machine hits them alike.
        names = list(targets)
        rounds: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for i in range(args.rounds):
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                rounds[name].append(measure(name, targets[name], args, pids[name]))
        results = {n: summarise(rs) for n, rs in rounds.items()}
        direct, nginx = results["direct"], results["nginx"]
        for name in names[1:]:
            r = results[name]
            r["sse_added_ms"] = round(
                r["sse_first_event_ms_p50"] - direct["sse_first_event_ms_p50"], 3
            )
            r["ws_p99_added_ms"] = round(
                r["ws_echo_ms_p99"] - direct["ws_echo_ms_p99"], 3
            )
            if name != "nginx":
                r["rps_vs_nginx"] = round(r["get_1k_rps"] / nginx["get_1k_rps"], 2)
                # What the rate would be with a core each: nginx's CPU per
                # request over the door's.
                r["cpu_vs_nginx"] = round(
                    nginx["get_1k_cpu_us"] / r["get_1k_cpu_us"], 2
                )
                r["mib_s_vs_nginx"] = round(
                    r["download_64m_mib_s"] / nginx["download_64m_mib_s"], 2
                )
                r["sse_vs_nginx_ms"] = round(
                    r["sse_first_event_ms_p50"] - nginx["sse_first_event_ms_p50"], 3
                )
                r["ws_p99_vs_nginx_ms"] = round(
                    r["ws_echo_ms_p99"] - nginx["ws_echo_ms_p99"], 3
                )
        load = os.getloadavg()
        for r in results.values():
            print(
                json.dumps(
                    {
                        "workload": "PREVIEW",
                        "connections": args.connections,
                        "loadavg": [round(x, 2) for x in load],
                        **r,
                    }
                )
            )
    finally:
        stop_all(procs, 10)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
