#!/usr/bin/env python3
"""
A small sandboxd client, standard library only, that does what an SDK does.

Against a running daemon (``make serve`` in another terminal) it:

1. uploads a tiny Python project as one tar.gz (``POST /files/extract``);
2. runs its tests with the output streamed line by line
   (``POST /shell/stream``, Server-Sent Events) and saves that output in the
   sandbox (``POST /files/raw``);
3. opens a terminal (``POST /pty/sessions``), attaches to it over the
   WebSocket on the PTY port and runs a command in it;
4. downloads an archive of the results (``POST /files/archive``).

Run::

    python3 examples/sdk_client.py                      # make serve, local mode
    python3 examples/sdk_client.py --url http://sandbox:9000 --token "$TOKEN"

The token may also come from ``SANDBOXD_TOKEN``.  Exit status 0 when every
step worked and the tests passed.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import socket
import struct
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

PROJECT = {
    "calc.py": (
        "def add(a, b):\n"
        "    return a + b\n\n\n"
        "def mul(a, b):\n"
        "    return a * b\n\n\n"
        "if __name__ == '__main__':\n"
        "    print('6 x 7 =', mul(6, 7))\n"
    ),
    "test_calc.py": (
        "import unittest\n\n"
        "from calc import add, mul\n\n\n"
        "class CalcTests(unittest.TestCase):\n"
        "    def test_add(self):\n"
        "        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_mul(self):\n"
        "        self.assertEqual(mul(6, 7), 42)\n\n\n"
        "if __name__ == '__main__':\n"
        "    unittest.main()\n"
    ),
}


class SandboxError(Exception):
    """An error answer: the daemon's ``code`` and message."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.code = body.get("code")
        self.body = body
        super().__init__(f"{status} {self.code}: {body.get('error')}")


class Sandbox:
    """The HTTP side: JSON calls, a raw upload, an SSE stream."""

    def __init__(self, url: str, token: str | None, timeout: float = 60) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> Any:
        headers = {"Accept": "application/json, text/event-stream"}
        if self.token:
            headers["X-Access-Token"] = self.token
        if body is not None:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(
            self.url + path, data=body, method=method, headers=headers
        )
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read() or b"{}")
            except ValueError:
                detail = {"error": e.reason}
            raise SandboxError(e.code, detail) from None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One JSON request; raises :class:`SandboxError` on an error answer."""
        data = json.dumps(body).encode() if body is not None else None
        with self._request(method, path, data) as response:
            return json.loads(response.read())

    def write_raw(self, path: str, data: bytes) -> Any:
        """``POST /files/raw``: bytes as they are, no base64."""
        query = urllib.parse.urlencode({"path": path, "overwrite": "true"})
        with self._request(
            "POST", f"/files/raw?{query}", data, "application/octet-stream"
        ) as response:
            return json.loads(response.read())

    def stream(
        self, path: str, body: dict[str, Any]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """POST and read Server-Sent Events: yields ``(event, data)``."""
        response = self._request("POST", path, json.dumps(body).encode())
        with response:
            event = "message"
            data: list[str] = []
            for raw in response:
                line = raw.decode("utf-8").rstrip("\r\n")
                if line == "":
                    if data:
                        yield event, json.loads("\n".join(data))
                    event, data = "message", []
                elif line.startswith(":"):
                    continue  # a keep-alive comment
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())


class WebSocket:
    """
    Just enough RFC 6455 for the PTY protocol: one connection, JSON text
    frames, masked client frames, ping answered with pong.
    """

    def __init__(self, url: str, token: str | None, timeout: float = 30) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "ws":
            raise ValueError("this small client speaks ws:// only (use a TLS proxy)")
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        target = parts.path + ("?" + parts.query if parts.query else "")
        lines = [
            f"GET {target} HTTP/1.1",
            f"Host: {parts.netloc}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        if token:
            lines.append(f"X-Access-Token: {token}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the WebSocket handshake was cut off")
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n", 1)[0].decode()
        if " 101 " not in status + " ":
            raise ConnectionError(f"WebSocket refused: {status}")

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the WebSocket closed")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack("!Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def send(self, message: dict[str, Any]) -> None:
        """One JSON text frame."""
        self._send_frame(0x1, json.dumps(message).encode())

    def receive(self) -> dict[str, Any] | None:
        """The next JSON message, or None once the server closed."""
        fragments = b""
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8))[0]
            payload = self._read(n)
            if opcode == 0x8:  # close: say goodbye back
                self._send_frame(0x8, payload[:2])
                return None
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            fragments += payload
            if b0 & 0x80:
                return json.loads(fragments)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close politely (1000), then drop the socket."""
        try:
            self._send_frame(0x8, struct.pack("!H", 1000))
        except OSError:
            pass
        self.sock.close()


def project_archive() -> str:
    """The project as a base64 tar.gz, built in memory."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, text in PROJECT.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(out.getvalue()).decode()


def run_tests(sandbox: Sandbox, workdir: str) -> tuple[int, str]:
    """Step 2: stream the test run; returns its exit code and output."""
    lines = []
    exit_code = None
    body = {"command": "python3 -m unittest -v", "cwd": workdir, "timeout": 120}
    for event, data in sandbox.stream("/shell/stream", body):
        if event in ("stdout", "stderr"):
            print(f"  [{event}] {data['data']}")
            lines.append(data["data"])
        elif event == "error":
            print(f"  [error] {data['type']}: {data['error']}")
        elif event == "exit":
            exit_code = data["exit_code"]
    if exit_code is None:
        raise ConnectionError("the stream ended without an exit event")
    return exit_code, "\n".join(lines) + "\n"


def use_terminal(sandbox: Sandbox, workdir: str) -> tuple[int | None, str]:
    """
    Step 3: run ``calc.py`` in a terminal, saving its answer to
    ``answer.txt``; returns the command's exit status (None when it never
    finished) and what it printed.
    """
    # sh rather than the user's login shell: no rc files, so a slow or
    # interactive ~/.bashrc cannot hold the example up.
    session = sandbox.call(
        "POST", "/pty/sessions", {"cwd": workdir, "cols": 100, "shell": "sh"}
    )
    ws = WebSocket(session["ws_url"], sandbox.token)
    try:
        output = ""
        started = ws.receive()
        assert started is not None and started.get("event") == "started", started
        # The marker's "$?" is not expanded in the echo of what we type, so
        # only the shell's own output can match DONE-<digits>.
        ws.send(
            {
                "type": "input",
                "data": "python3 calc.py | tee answer.txt; echo DONE-$?\n",
            }
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = ws.receive()
            if message is None:
                break
            if message.get("type") == "output":
                output += message["data"]
                if re.search(r"DONE-\d+", output):
                    break
        ws.send({"type": "input", "data": "exit\n"})
    finally:
        ws.close()
    try:
        sandbox.call("DELETE", f"/pty/sessions/{session['session_id']}")
    except SandboxError as e:
        if e.status != 404:  # gone already: the shell exited
            raise
    done = re.search(r"DONE-(\d+)", output)
    found = re.search(r"6 x 7 = (\d+)", output)
    return (int(done.group(1)) if done else None), (found.group(0) if found else output)


def download_results(sandbox: Sandbox, workdir: str, out: str) -> list[str]:
    """Step 4: a tar.gz of the work directory, saved locally."""
    reply = sandbox.call(
        "POST", "/files/archive", {"paths": [workdir], "format": "tar.gz"}
    )
    data = base64.b64decode(reply["content_base64"])
    with open(out, "wb") as f:
        f.write(data)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted(tar.getnames())


def main(argv: list[str] | None = None) -> int:
    """Run the four steps; exit 0 when they all worked and the tests passed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:9000")
    parser.add_argument("--token", default=os.environ.get("SANDBOXD_TOKEN"))
    parser.add_argument(
        "--dir", default="sdk-example", help="work directory in the sandbox"
    )
    parser.add_argument("--out", default="sdk-example-results.tar.gz")
    args = parser.parse_args(argv)
    sandbox = Sandbox(args.url, args.token)

    health = sandbox.call("GET", "/health")
    caps = sandbox.call("GET", "/capabilities")
    print(
        f"daemon {caps.get('server_version')} is {health['status']}; groups on:",
        ", ".join(g for g, on in sorted(caps["groups"].items()) if on),
    )

    print(f"1. uploading the project to {args.dir}/")
    extracted = sandbox.call(
        "POST",
        "/files/extract",
        {
            "content_base64": project_archive(),
            "format": "tar.gz",
            "destination": args.dir,
            "overwrite": True,
        },
    )
    print(f"   {extracted['files']} files, {extracted['bytes']} bytes")

    print("2. running the tests, output streamed:")
    exit_code, output = run_tests(sandbox, args.dir)
    saved = sandbox.write_raw(f"{args.dir}/test-output.txt", output.encode())
    print(f"   exit code {exit_code}; output saved ({saved['bytes']} bytes)")

    print("3. running calc.py in a terminal over the WebSocket:")
    status, printed = use_terminal(sandbox, args.dir)
    print("  ", printed)
    failed = exit_code != 0
    if status != 0:
        # e.g. tee could not create answer.txt: the directory is not the
        # terminal user's to write in.
        print(f"   FAILED: the terminal command ended with status {status}")
        failed = True

    print(f"4. downloading the results to {args.out}:")
    names = download_results(sandbox, args.dir, args.out)
    for name in names:
        print("  ", name)
    if f"{args.dir}/answer.txt" not in names:
        print("   FAILED: answer.txt is missing from the results")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SandboxError as error:
        print(f"sandboxd refused: {error}", file=sys.stderr)
        sys.exit(2)
    except OSError as error:
        print(f"cannot reach sandboxd: {error}", file=sys.stderr)
        sys.exit(2)
