"""
How a ``sandboxd`` subcommand that drives a daemon (one of
:data:`sandboxd.subcommands.CLIENT_COMMANDS`) starts: through
:mod:`sandboxd.client.cli`, imported only then, so that neither Twisted
(for a client command) nor httpx (for the daemon) is loaded for nothing.
``sandboxd.cli`` and the console script (``sandboxd.__main__``) both use it.
"""

from __future__ import annotations

import sys


def client_main(args: list[str]) -> int:
    """Run one client command (or say which extra is missing)."""
    try:
        from sandboxd.client.cli import main
    except ImportError as e:
        print(
            f"sandboxd {args[0]}: {e}; install the client's dependencies "
            "(httpx, websockets): pip install '.[client]' in this checkout",
            file=sys.stderr,
        )
        return 2
    return main(args, inp=sys.stdin)
