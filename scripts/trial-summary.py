#!/usr/bin/env python3
"""Run trial, pass its output through, and end with a plain `N passed, N failed` line.

CI reads pytest-style closing lines, not trial's `PASSED (successes=N)`.
Exits with trial's own status.
"""

import re
import subprocess
import sys

proc = subprocess.Popen(
    [sys.executable, "-b", "-m", "twisted.trial", *sys.argv[1:]],
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
)
assert proc.stdout is not None
last = ""
for raw in proc.stdout:
    line = raw.decode("utf-8", "replace")
    sys.stdout.write(line)
    sys.stdout.flush()
    if line.startswith(("PASSED", "FAILED")):
        last = line
status = proc.wait()
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
sys.exit(status if status else (1 if failed else 0))
