"""
Run a command in a session of its own, as a service manager or a
container runtime starts the daemon, passing on the signals that stop it.

The shared harness (``compare.sh``) starts each server as a process group
in the harness's own session, beside its load generators. A root sandboxd
raises its session's scheduling group only when it leads the session (a
group it shares belongs to its caller), so under the harness as it is it
would run as it does when started from a shell, not as it is deployed::

    compare.sh stdlib-tuned sandboxd="python bench/own_session.py twistd -n ..."

This process stays the harness's server pid: it forwards SIGTERM, SIGINT,
SIGHUP and SIGQUIT to the command and exits as the command did. The
harness finds the listening process itself for its memory figures.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: own_session.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    pid = os.fork()
    if pid == 0:
        os.setsid()
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            print(f"own_session.py: {argv[0]}: {e.strerror}", file=sys.stderr)
            os._exit(127)

    def forward(signum: int, frame: FrameType | None) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
