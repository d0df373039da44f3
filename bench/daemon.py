"""
What the benches in this folder share: a fresh ``twistd -n sandboxd`` on
loopback ports, waited on until ``/health`` answers (which, by
``sandboxd.daemon.readiness``, also means every other port it opens listens),
with one of its doors (E2B, preview) on a port of its own when a bench
drives it, stopped with its children; and the daemon's own CPU time.
"""

from __future__ import annotations

import glob
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any


def callgrind_total(path: str) -> int:
    """A callgrind dump's total instruction count."""
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daemon(
    base: str,
    token: str,
    policy: Mapping[str, Any] | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
    wait_seconds: float = 10.0,
) -> tuple[subprocess.Popen[bytes], int]:
    """
    The daemon serving ``base`` under ``policy`` (written beside it), with
    ``args`` added to its command line: its process and HTTP port.
    ``prefix`` runs it under another program (valgrind, a profiler).
    """
    for _ in range(START_TRIES):
        proc, port = _start_once(base, token, policy, args, env, prefix, wait_seconds)
        if _answers_with(port, token):
            return proc, port
        # Another server holds a port picked for this one (a free port is
        # free only until someone binds it), and ours could not bind it.
        stop(proc)
    raise SystemExit(
        f"daemon did not start: a port of its was taken {START_TRIES} times"
    )


#: How many ports :func:`start_daemon` tries.
START_TRIES = 3


def _answers_with(port: int, token: str) -> bool:
    """
    Whether the server on ``port`` is the one just started: it takes
    ``token`` and refuses another.  Another test's daemon refuses ``token``
    with 401; one in local mode (no token) takes any, the wrong one too.
    """
    return _status(port, token) not in (401, None) and _status(port, "x" + token) == 401


def _status(port: int, token: str) -> int | None:
    """The status ``GET /capabilities`` with ``token`` answers; None if none."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request("GET", "/capabilities", headers={"X-Access-Token": token})
        return c.getresponse().status
    except OSError:
        return None
    finally:
        c.close()


def _start_once(
    base: str,
    token: str,
    policy: Mapping[str, Any] | None,
    args: Sequence[str],
    env: Mapping[str, str] | None,
    prefix: Sequence[str],
    wait_seconds: float,
) -> tuple[subprocess.Popen[bytes], int]:
    """One try of :func:`start_daemon`: on a port free a moment ago."""
    port = free_port()
    argv = [
        *prefix,
        os.path.join(os.path.dirname(sys.executable), "twistd"),
        "-n",
        "--pidfile=",
        "sandboxd",
        "--port",
        f"tcp:{port}:interface=127.0.0.1",
        "--pty-port",
        f"tcp:{free_port()}:interface=127.0.0.1",
        "--base-dir",
        base,
        *args,
    ]
    if os.geteuid() == 0:
        # A root daemon with a token must be told who its children run as;
        # the figures are for children that run as the daemon's user.
        policy = dict(policy or {})
        defaults = dict(policy.get("defaults", {}))
        defaults["params"] = {"default_user": "root", **defaults.get("params", {})}
        policy["defaults"] = defaults
    if policy is not None:
        path = os.path.join(base, ".policy.json")
        with open(path, "w") as f:
            json.dump(policy, f)
        argv += ["--policy", path]
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **(env or {}), "ABX_SERVER_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    # A daemon that could not bind one of its two ports exits at once: the
    # caller tries other ports rather than wait out the deadline.
    wait_healthy(proc, port, wait_seconds, "daemon", exited_ok=True)
    return proc, port


def start_with_door(
    base: str,
    token: str,
    policy: Mapping[str, Any],
    door: str,
    tree: str | None = None,
    prefix: Sequence[str] = (),
    wait_seconds: float = 10.0,
) -> tuple[subprocess.Popen[bytes], int, int]:
    """
    :func:`start_daemon` with the ``door`` group (``e2b``, ``preview``)
    turned on in ``policy`` and its door listening on a port of its own
    (``--DOOR-port``), run from the checkout ``tree`` when given
    (``PYTHONPATH``: an A/B in one run): its process, HTTP port and door
    port.  The daemon gets a HOME of its own in ``base``: ``bash -l`` (the
    E2B SDK's way to run a command) and the SDKs read it, and the machine's
    profile must stay out of the figures.
    """
    door_port = free_port()
    home = os.path.join(base, ".home")
    os.makedirs(home, exist_ok=True)
    env = {"HOME": home}
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree)
    groups = {**policy.get("groups", {}), door: True}
    proc, port = start_daemon(
        base,
        token,
        {**policy, "groups": groups},
        [f"--{door}-port", f"tcp:{door_port}:interface=127.0.0.1"],
        env=env,
        prefix=prefix,
        wait_seconds=wait_seconds,
    )
    return proc, port, door_port


def stop_all(procs: Sequence[subprocess.Popen[bytes]], seconds: float = 15.0) -> None:
    """
    TERM the process group of each of ``procs`` (each started in a session
    of its own), then wait for each; a group still there after ``seconds``
    is killed.  The last started is told first, as it may depend on the
    ones before it.
    """
    for proc in reversed(procs):
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for proc in procs:
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def stop(proc: subprocess.Popen[bytes]) -> None:
    """The server stopped, then anything left in its process group."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def e2b_sandbox(sandbox_class: Any, port: int, token: str) -> Any:
    """
    An ``e2b`` or ``e2b_code_interpreter`` ``Sandbox`` (``sandbox_class``)
    in debug mode, speaking to the daemon's E2B door on ``port``.
    """
    from e2b.connection_config import ConnectionConfig
    from e2b.envd.versions import ENVD_DEBUG_FALLBACK

    config = ConnectionConfig(
        debug=True,
        sandbox_url=f"http://127.0.0.1:{port}",
        extra_sandbox_headers={"X-Access-Token": token},
    )
    return sandbox_class(
        sandbox_id="bench",
        sandbox_domain=None,
        envd_version=ENVD_DEBUG_FALLBACK,
        envd_access_token=token,
        traffic_access_token=None,
        connection_config=config,
    )


def wait_healthy(
    proc: subprocess.Popen[bytes],
    port: int,
    seconds: float,
    what: str,
    exited_ok: bool = False,
) -> None:
    """
    Wait for ``200 /health`` on ``port``; kill ``proc`` and exit if it never
    comes.  With ``exited_ok``, a ``proc`` that has exited ends the wait
    (the caller finds out whose server, if any, answers on ``port``).
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if exited_ok and proc.poll() is not None:
            return
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"{what} did not start")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far (children not counted)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def schedstat(pid: int) -> tuple[int, int]:
    """
    Nanoseconds ``pid``'s threads have run and waited on a run queue so
    far (``/proc/PID/task/*/schedstat``): finer than the 10 ms ticks of
    :func:`cpu_seconds`, which are as coarse as a keystroke's or a print's
    whole cost.
    """
    ran = waited = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                run, wait, _ = f.read().split()
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        ran += int(run)
        waited += int(wait)
    return ran, waited


def run_seconds(pid: int) -> float:
    """CPU time ``pid``'s threads have run so far, to the nanosecond."""
    return schedstat(pid)[0] / 1e9
