"""
The ``sandboxd`` console script (and ``python -m sandboxd``): a command
that drives a daemon starts without loading Twisted; anything else goes to
:func:`sandboxd.cli.main`, which runs one.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence

from sandboxd.console import client_main
from sandboxd.subcommands import CLIENT_COMMANDS


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] and args[0] in CLIENT_COMMANDS:
        return client_main(args)
    if args[:1] == ["serve"]:
        # Start-up creates a great many objects (Twisted, pyOpenSSL, the
        # daemon) that live as long as the process: a cyclic collection
        # while they are being created only walks them again.  None runs
        # until the daemon listens (sandboxd.daemon.server.release_memory).
        gc.disable()
    from sandboxd.cli import main as daemon_main

    return daemon_main(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
