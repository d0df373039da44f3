"""
Which ``sandboxd`` subcommands drive a daemon rather than run one, and
how they start: :mod:`sandboxd.client.cli`, imported only then, so that
neither Twisted (for a client command) nor httpx (for the daemon) is
loaded for nothing.  A leaf module: ``sandboxd.cli`` and the console
script (``sandboxd.__main__``) both use it.
"""

from __future__ import annotations

import sys

#: Subcommands that drive a daemon (SPEC §19), served by ``sandboxd.client.cli``.
CLIENT_COMMANDS = ("exec", "cp", "ls", "ps", "logs", "kill", "term", "caps")


def client_main(args: list[str]) -> int:
    """Run one client command (or say which extra is missing)."""
    try:
        from sandboxd.client.cli import main
    except ImportError as e:
        print(f"sandboxd {args[0]}: {e}; install sandboxd[client]", file=sys.stderr)
        return 2
    return main(args)
