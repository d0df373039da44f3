"""
A page of many small images through the daemon's browser: how long
``POST /browser/navigate`` takes to its ``load`` when every image is a
connection of its own through the browser's SOCKS gate.

The page and its images come from two local ``http.server`` instances
(HTTP/1.0: each answer closes its connection, so Chromium opens one
connection per image); the daemon is a fresh one from ``TREE`` (or the
checkout) with the browser group on.

    .venv/bin/python bench/browser_page.py [--images 60] [--rounds 8] [TREE]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import threading
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from busy import Client
from daemon import free_port, start_daemon

SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
    '<rect width="10" height="10"/></svg>'
)


class Quiet(http.server.SimpleHTTPRequestHandler):
    """Files of the site, never cached, nothing logged."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        super().end_headers()


def make_site(images: int, image_port: int) -> str:
    """A directory with ``index.html`` naming ``images`` images on ``image_port``."""
    site = tempfile.mkdtemp(prefix="browser-page-")
    tags = "".join(
        f'<img src="http://127.0.0.1:{image_port}/i{i}.svg" width="10">'
        for i in range(images)
    )
    with open(os.path.join(site, "index.html"), "w") as f:
        f.write(f"<html><body>{tags}</body></html>")
    for i in range(images):
        with open(os.path.join(site, f"i{i}.svg"), "w") as f:
            f.write(SVG)
    return site


def serve(site: str, port: int) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", port), functools.partial(Quiet, directory=site)
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", nargs="?", help="a sandboxd tree (default: this one)")
    parser.add_argument("--images", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    env = {"PYTHONPATH": os.path.abspath(args.tree)} if args.tree else None
    page_port, image_port = free_port(), free_port()
    site = make_site(args.images, image_port)
    servers = [serve(site, page_port), serve(site, image_port)]
    base = tempfile.mkdtemp(prefix="browser-page-base-")
    token = secrets.token_hex(8)
    proc, port = start_daemon(
        base, token, {"groups": {"browser": True}}, env=env, wait_seconds=30
    )
    client = Client(port, token)
    times: list[float] = []
    try:
        url = f"http://127.0.0.1:{page_port}/index.html"
        status, body, _ = client.call("POST", "/browser/navigate", {"url": url})
        if status != 200:
            raise SystemExit(f"navigate answered {status}: {body}")
        for i in range(args.rounds):
            request = {"url": f"{url}?round={i}", "wait_until": "load"}
            status, body, ms = client.call("POST", "/browser/navigate", request)
            if status != 200:
                raise SystemExit(f"navigate answered {status}: {body}")
            times.append(ms)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        for server in servers:
            server.shutdown()
        shutil.rmtree(site, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
    with open("/proc/loadavg") as f:
        load = float(f.read().split()[0])
    print(
        json.dumps(
            {
                "tree": args.tree or ".",
                "images": args.images,
                "navigate_p50_ms": round(statistics.median(times), 1),
                "min_ms": round(min(times), 1),
                "max_ms": round(max(times), 1),
                "load": load,
            }
        )
    )


if __name__ == "__main__":
    main()
