"""
The seed's live-server helpers, answering with a sandboxd child.

``scripts/seed_suite/run.py`` puts this file where the seed's own test
suite keeps its ``tests/test_server/_live.py``. Its tests start a server
in one of two ways, and both get a sandboxd child on the port the test
chose:

- ``Live(policy=...)`` (the ``live_server`` fixture): a server with that
  policy document;
- ``wire(httpd, auth_token=..., registry=...)`` on a ``ThreadingHTTPServer``
  the test bound itself: the listener is closed and sandboxd takes its
  port; the server's ``serve_forever`` does nothing and its ``shutdown``
  stops the child.

What the seed's test process set up in memory is carried where it can
be: the policy document as ``--policy``, the token the seed reads from
``ABX_SERVER_TOKEN`` through the inherited environment, group switches
made with ``default_table().enable_group`` as a ``--commands`` file that
makes the same calls. A ``CommandRegistry`` of Python functions defined
in the test cannot be carried; the tests that rely on one are listed in
``differences.txt``.
"""

from __future__ import annotations

import atexit
import hashlib
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

from agent_sandbox.server.router import default_table

from sandboxd.sysinfo import ports_of

#: How to start sandboxd (a command line; ``serve`` and its options follow).
COMMAND = shlex.split(os.environ.get("SEED_SUITE_SANDBOXD", "sandboxd"))
#: How long a child has to start listening.
START_SECONDS = 15.0
#: How long a child has to stop after SIGTERM before it is killed.
STOP_SECONDS = 10.0

_running: list[subprocess.Popen[bytes]] = []


#: Where this helper picks its own ports: below the kernel's ephemeral
#: range, where the seed's tests pick theirs (by binding port 0), and a
#: block of its own for each pytest-xdist worker, so that a port one test
#: chose and released is not handed to another test's daemon meanwhile.
PORT_BASE = 20000
PORTS_PER_WORKER = 500


def _worker_block() -> range:
    """This pytest-xdist worker's ports (``gw3`` has the fourth block)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    start = PORT_BASE + (index % 20) * PORTS_PER_WORKER
    return range(start, start + PORTS_PER_WORKER)


_next_port = [0]


def free_port() -> int:
    """A loopback port in this worker's block that nobody listens on now."""
    block = _worker_block()
    for _ in range(len(block)):
        port = block[_next_port[0] % len(block)]
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {block.start}-{block.stop - 1}")


def _other_port(taken: int) -> int:
    """A free port that is not ``taken`` (a released port can come back)."""
    for _ in range(32):
        port = free_port()
        if port != taken:
            return port
    raise RuntimeError("no second free port")


def _policy_file(folder: str, document: dict[str, Any]) -> str:
    """
    Write ``document`` for ``--policy``. As root with tokens, sandboxd
    refuses to start until the policy names the user commands run as
    (the seed runs them as root without asking): the seed's tests mean
    root, so that is what is named.
    """
    document = json.loads(json.dumps(document))
    if os.geteuid() == 0 and (document.get("auth") or {}).get("tokens"):
        params = document.setdefault("defaults", {}).setdefault("params", {})
        params.setdefault("default_user", "root")
    path = os.path.join(folder, "policy.json")
    with open(path, "w") as f:
        json.dump(document, f)
    return path


def _commands_file(folder: str) -> str | None:
    """The test's group switches, as a template's ``commands.py`` makes them."""
    switches = default_table().group_overrides
    if not switches:
        return None
    lines = ["from agent_sandbox.server.router import CapabilityGroup, default_table"]
    for group, on in switches.items():
        call = "enable_group" if on else "disable_group"
        lines.append(f"default_table().{call}(CapabilityGroup({group.value!r}))")
    path = os.path.join(folder, "commands.py")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def start(
    port: int, pty_port: int, document: dict[str, Any] | None
) -> subprocess.Popen[bytes]:
    """Start sandboxd on ``port`` and return once it accepts connections."""
    # Under the runner's scratch folder, which goes with the run (or stays,
    # with --keep: each daemon's policy, commands and log).
    folder = tempfile.mkdtemp(
        prefix="daemon-", dir=os.environ.get("SEED_SUITE_SCRATCH")
    )
    argv = [*COMMAND, "serve", "--port", str(port), "--pty-port", str(pty_port)]
    if document is not None:
        argv += ["--policy", _policy_file(folder, document)]
    commands = _commands_file(folder)
    if commands is not None:
        argv += ["--commands", commands]
    log_path = os.path.join(folder, "daemon.log")
    with open(log_path, "wb") as log:
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    _running.append(child)
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if child.poll() is not None:
            with open(log_path, errors="replace") as f:
                said = f.read()[-2000:]
            raise RuntimeError(f"sandboxd exited with {child.returncode}: {said}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            time.sleep(0.03)
            continue
        if port in ports_of(child.pid):
            return child
        # Anything that accepts is not enough: another test's server may
        # have bound the port first, and then the child fails to bind it
        # and exits, which the next round reports with its log.
        time.sleep(0.03)
    stop(child)
    raise RuntimeError(f"sandboxd did not listen on {port} within {START_SECONDS} s")


def stop(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not gone within ``STOP_SECONDS``."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    if child in _running:
        _running.remove(child)


def stop_all() -> None:
    """Whatever a test left running (called at the end of the session)."""
    for child in list(_running):
        stop(child)


atexit.register(stop_all)


def _with_token(
    auth_token: str | None, policy: dict[str, Any] | None
) -> dict[str, Any]:
    """The seed's ``wire``: a given token becomes an all-scopes identity."""
    document = dict(policy or {})
    if auth_token:
        digest = hashlib.sha256(auth_token.encode()).hexdigest()
        auth = dict(document.get("auth", {}))
        auth["tokens"] = [{"id": "server", "scopes": ["*"], "token_sha256": digest}]
        document["auth"] = auth
    return document


def wire(
    httpd: Any,
    *,
    auth_token: str | None = None,
    registry: Any = None,
    policy: dict[str, Any] | None = None,
) -> Any:
    """Give the port ``httpd`` holds to a sandboxd child."""
    port = httpd.server_address[1]
    httpd.socket.close()
    child = start(port, free_port(), _with_token(auth_token, policy))
    httpd.serve_forever = lambda *args, **kwargs: None
    httpd.shutdown = lambda: stop(child)
    httpd.server_close = lambda: None
    return httpd


class Live:
    """A sandboxd child with the policy a test gave, and a small client."""

    def __init__(
        self,
        policy: Any = None,
        registry: Any = None,
        pty_port: int | None = None,
        **unsupported: Any,
    ) -> None:
        if unsupported:
            raise TypeError(f"not carried to sandboxd: {sorted(unsupported)}")
        if hasattr(policy, "to_dict"):
            policy = policy.to_dict()
        self.registry = registry
        if pty_port is None:
            self.port = free_port()
            self.pty_port = _other_port(self.port)
        else:
            self.pty_port = pty_port
            self.port = _other_port(pty_port)
        self.server = None
        self._child: subprocess.Popen[bytes] | None = start(
            self.port, self.pty_port, dict(policy or {})
        )

    def close(self) -> None:
        if self._child is not None:
            stop(self._child)
            self._child = None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw_body: bytes | None = None,
    ) -> tuple[int, Any, dict[str, str]]:
        """One request on a new connection: status, body (JSON when it is), headers."""
        sent = dict(headers or {})
        if body is not None:
            raw_body = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        try:
            connection.request(method, path, body=raw_body, headers=sent)
            answer = connection.getresponse()
            payload = answer.read()
            got = {name.lower(): value for name, value in answer.getheaders()}
        finally:
            connection.close()
        parsed: Any = payload
        if payload:
            try:
                parsed = json.loads(payload)
            except ValueError:
                pass
        else:
            parsed = None
        return answer.status, parsed, got

    def get(self, path: str, **kwargs: Any) -> tuple[int, Any]:
        status, body, _ = self.request("GET", path, **kwargs)
        return status, body

    def post(self, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        status, answer, _ = self.request(
            "POST", path, {} if body is None else body, **kwargs
        )
        return status, answer


class LiveServer(Live):
    """The SDK suite's name for the same thing, with the URLs its client takes."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pty_url(self) -> str:
        return f"http://127.0.0.1:{self.pty_port}"
