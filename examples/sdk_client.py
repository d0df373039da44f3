#!/usr/bin/env python3
"""
What an SDK user does with sandboxd, on its Python client
(``pip install ./client`` from a checkout: the client alone).

Against a running daemon (``make serve`` in another terminal) it:

1. uploads a tiny Python project as one tar.gz (``files.extract``);
2. runs its tests with the output streamed line by line
   (``commands.run`` with ``on_stdout``/``on_stderr``, over
   ``/shell/stream``) and saves that output in the sandbox
   (``files.write_text``, the raw route);
3. opens a terminal (``pty.open``), runs a command in it over the PTY
   WebSocket and reads its output;
4. downloads an archive of the results (``files.archive``).

Run::

    python3 examples/sdk_client.py                      # make serve, local mode
    python3 examples/sdk_client.py --url http://sandbox:9000 --token "$TOKEN"

The URL and token may also come from ``SANDBOXD_URL`` and
``SANDBOXD_TOKEN``.  Exit status 0 when every step worked and the tests
passed, 1 when the tests failed, 2 when the daemon refused a call.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import tarfile
import time
from collections.abc import Callable

from sandboxd.client import Sandbox, SandboxError

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


def project_archive() -> bytes:
    """The project as a tar.gz, built in memory."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, text in PROJECT.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def run_tests(sb: Sandbox, workdir: str) -> tuple[int | None, str]:
    """Step 2: stream the test run; its exit code and output."""
    lines: list[str] = []

    def show(stream: str) -> Callable[[str], None]:
        def line(text: str) -> None:
            print(f"  [{stream}] {text}")
            lines.append(text)

        return line

    result = sb.commands.run(
        "python3 -m unittest -v",
        cwd=workdir,
        timeout=120,
        on_stdout=show("stdout"),
        on_stderr=show("stderr"),
    )
    return result.exit_code, "\n".join(lines) + "\n"


def use_terminal(sb: Sandbox, workdir: str) -> tuple[int | None, str]:
    """
    Step 3: run ``calc.py`` in a terminal, saving its answer to
    ``answer.txt``; the command's exit status (None when it never
    finished) and what it printed.
    """
    # sh rather than the user's login shell: no rc files, so a slow or
    # interactive ~/.bashrc cannot hold the example up.
    output = ""
    with sb.pty.open(cwd=workdir, cols=100, shell="sh") as term:
        # "$?" is not expanded in the echo of what we type, so only the
        # shell's own output matches DONE-<digits>.
        term.send("python3 calc.py | tee answer.txt; echo DONE-$?\n")
        deadline = time.monotonic() + 30
        while not re.search(r"DONE-\d+\s", output) and time.monotonic() < deadline:
            event = term.recv(timeout=max(0.1, deadline - time.monotonic()))
            if event is None:
                break
            output += event.data
        sb.pty.close(term.session_id)
    done = re.search(r"DONE-(\d+)", output)
    found = re.search(r"6 x 7 = (\d+)", output)
    return (int(done.group(1)) if done else None), (found.group(0) if found else output)


def download_results(sb: Sandbox, workdir: str, out: str) -> list[str]:
    """Step 4: a tar.gz of the work directory, saved locally."""
    data = sb.files.archive([workdir], format="tar.gz")
    with open(out, "wb") as f:
        f.write(data)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted(tar.getnames())


def main(argv: list[str] | None = None) -> int:
    """Run the four steps; exit 0 when they all worked and the tests passed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", help="default $SANDBOXD_URL, else http://127.0.0.1:9000"
    )
    parser.add_argument("--token", help="default $SANDBOXD_TOKEN")
    parser.add_argument(
        "--dir", default="sdk-example", help="work directory in the sandbox"
    )
    parser.add_argument("--out", default="sdk-example-results.tar.gz")
    args = parser.parse_args(argv)

    with Sandbox(args.url, token=args.token, timeout=60) as sb:
        caps = sb.capabilities()
        print(
            f"daemon {caps.get('server_version')} is {'ok' if sb.health() else 'down'}; groups on:",
            ", ".join(g for g, on in sorted(caps["groups"].items()) if on),
        )

        print(f"1. uploading the project to {args.dir}/")
        extracted = sb.files.extract(project_archive(), args.dir, overwrite=True)
        print(f"   {extracted['files']} files, {extracted['bytes']} bytes")

        print("2. running the tests, output streamed:")
        exit_code, output = run_tests(sb, args.dir)
        saved = sb.files.write_text(f"{args.dir}/test-output.txt", output)
        print(f"   exit code {exit_code}; output saved ({saved['bytes']} bytes)")

        print("3. running calc.py in a terminal over the WebSocket:")
        status, printed = use_terminal(sb, args.dir)
        print("  ", printed)
        failed = exit_code != 0
        if status != 0:
            # e.g. tee could not create answer.txt: the directory is not the
            # terminal user's to write in.
            print(f"   FAILED: the terminal command ended with status {status}")
            failed = True

        print(f"4. downloading the results to {args.out}:")
        names = download_results(sb, args.dir, args.out)
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
        # Every refusal names its code (and the policy rule behind it).
        print(f"sandboxd: {error}", file=sys.stderr)
        sys.exit(2)
