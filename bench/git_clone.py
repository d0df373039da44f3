#!/usr/bin/env python3
"""
A clone through ``POST /git/clone`` against plain ``git clone`` of the same
remote, in one run.

Builds a repository of ``--size-mib`` (50) MiB of incompressible blobs over
a few commits, serves it with ``git http-backend`` over TLS on loopback
(the tests' remote: ``tests/git/remote.py``, in a child process), starts a
fresh daemon with the ``git`` group on, then clones ``--rounds`` (3) times
each way, alternating: plain git with the same CA, and the daemon's job with
``wait`` (its hardened configuration, the address check, the job and its
progress parsing included). Prints one JSON line: the medians and their
ratio (target: at most 1.1).

    .venv/bin/python bench/git_clone.py [--size-mib 50] [--rounds 3]
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
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from daemon import start_daemon  # noqa: E402

#: The remote, run as a child so that its CGI work is not the daemon's.
SERVER = """
import sys
sys.path.insert(0, {root!r})
from twisted.internet import reactor
from tests.git.remote import LoopbackRemote
remote = LoopbackRemote({directory!r})
remote.start()
print(remote.port, remote.ca, flush=True)
reactor.run()
"""

GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
}


def git(cwd: str, *args: str) -> None:
    subprocess.run(
        ["git", *args],
        cwd=cwd,
        env={**os.environ, **GIT_ENV},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def make_repository(srv: str, work: str, size_mib: int) -> None:
    """``srv/repo.git``: ``size_mib`` MiB of random 1 MiB blobs over 5 commits."""
    bare = os.path.join(srv, "repo.git")
    git(srv, "init", "-q", "--bare", "-b", "main", bare)
    git(srv, "init", "-q", "-b", "main", work)
    per_commit = max(1, size_mib // 5)
    made = 0
    while made < size_mib:
        for _ in range(min(per_commit, size_mib - made)):
            with open(os.path.join(work, f"blob-{made:04d}.bin"), "wb") as f:
                f.write(os.urandom(1024 * 1024))
            made += 1
        git(work, "add", "-A")
        git(work, "commit", "-q", "-m", f"{made} MiB")
    git(work, "push", "-q", bare, "main")


def plain_clone(url: str, ca: str, dest: str) -> float:
    began = time.perf_counter()
    subprocess.run(
        ["git", "clone", "-q", url, dest],
        env={**os.environ, **GIT_ENV, "GIT_SSL_CAINFO": ca},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - began


def daemon_clone(port: int, token: str, url: str, dest: str) -> float:
    body = json.dumps({"url": url, "path": dest, "wait": 600})
    began = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    c.request(
        "POST",
        "/git/clone",
        body,
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    response = c.getresponse()
    data = response.read()
    elapsed = time.perf_counter() - began
    if response.status != 200:
        raise SystemExit(f"git_clone answered {response.status}: {data[:500]!r}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("git") is None or not os.path.exists(
        "/usr/lib/git-core/git-http-backend"
    ):
        print(
            "git or git-http-backend is not installed; skipping GIT-CLONE",
            file=sys.stderr,
        )
        return
    base = tempfile.mkdtemp(prefix="sandboxd-bench-git-")
    token = secrets.token_hex(16)
    server = daemon = None
    try:
        remote_dir = os.path.join(base, "remote")
        os.makedirs(os.path.join(remote_dir, "srv"))
        make_repository(
            os.path.join(remote_dir, "srv"), os.path.join(base, "seed"), args.size_mib
        )
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER.format(root=ROOT, directory=remote_dir)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert server.stdout is not None
        port_text, ca = server.stdout.readline().split()
        url = f"https://127.0.0.1:{port_text}/repo.git"
        served = os.path.join(base, "served")
        os.makedirs(served)
        policy = {
            "groups": {"git": True},
            "git": {"ca_file": ca},
            "endpoints": {"group:git": {"params": {"block_private_networks": False}}},
        }
        daemon, port = start_daemon(served, token, policy)
        plain: list[float] = []
        through: list[float] = []
        for i in range(args.rounds):
            plain.append(plain_clone(url, ca, os.path.join(base, f"plain-{i}")))
            through.append(
                daemon_clone(port, token, url, os.path.join(served, f"clone-{i}"))
            )
            shutil.rmtree(os.path.join(base, f"plain-{i}"))
            shutil.rmtree(os.path.join(served, f"clone-{i}"))
        p, t = statistics.median(plain), statistics.median(through)
        print(
            json.dumps(
                {
                    "workload": "GIT-CLONE",
                    "size_mib": args.size_mib,
                    "rounds": args.rounds,
                    "plain_git_s": round(p, 3),
                    "git_clone_s": round(t, 3),
                    "ratio": round(t / p, 3),
                    "plain_all_s": [round(x, 3) for x in plain],
                    "git_clone_all_s": [round(x, 3) for x in through],
                    "load": os.getloadavg()[0],
                }
            ),
            flush=True,
        )
    finally:
        for proc in (daemon, server):
            if proc is not None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
