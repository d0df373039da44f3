#!/usr/bin/env python3
"""Run trial, pass its output through, and end with a plain `N passed, N failed` line.

CI reads pytest-style closing lines, not trial's `PASSED (successes=N)`.
Exits with trial's own status.

Trial runs in a session of its own: the tests start and kill process
trees, and a stray signal to "our own group" must end the test run (and
be reported here, with the seed that ordered it) rather than take make
and whatever started make down with it.

Trial also runs with a HOME of its own (removed afterwards): the tests
start interactive shells and kill them, and a shell killed while it runs
the developer's ~/.bashrc leaves whatever that was doing half done in the
developer's home (a stale pyenv rehash lock, seen here, then makes every
new shell wait a minute).  XDG_CACHE_HOME keeps pointing at the real
cache, so what the tests install once there (Vite, fonts) is kept.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

home = tempfile.mkdtemp(prefix="sandboxd-test-home-")
env = dict(os.environ, HOME=home)
env.setdefault("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
proc = subprocess.Popen(
    [sys.executable, "-b", "-m", "twisted.trial", *sys.argv[1:]],
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    start_new_session=True,
    env=env,
)
assert proc.stdout is not None


def forward(signum: int, frame: object) -> None:
    """A ^C or a stop for make reaches trial, now outside make's group."""
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, forward)

last = ""
seed = ""
for raw in proc.stdout:
    line = raw.decode("utf-8", "replace")
    sys.stdout.write(line)
    sys.stdout.flush()
    if line.startswith(("PASSED", "FAILED")):
        last = line
    elif line.startswith("Running tests shuffled with seed"):
        seed = line.strip()
status = proc.wait()
shutil.rmtree(home, ignore_errors=True)
if status < 0:
    print(f"trial was killed by signal {-status} ({seed or 'no seed printed'})")
elif status and seed:
    print(seed)
counts = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", last)}
passed = counts.get("successes", 0)
failed = (
    counts.get("failures", 0)
    + counts.get("errors", 0)
    + counts.get("unexpectedSuccesses", 0)
)
skipped = counts.get("skips", 0)
if not last:
    failed = max(failed, 1)
print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
sys.exit(128 - status if status < 0 else status or (1 if failed else 0))
