"""
Which ``sandboxd`` subcommands drive a daemon rather than run one, and
how they start: :mod:`sandboxd.client.cli`, imported only then, so that
neither Twisted (for a client command) nor httpx (for the daemon) is
loaded for nothing.  A leaf module: ``sandboxd.cli`` and the console
script (``sandboxd.__main__``) both use it.
"""

from __future__ import annotations

import sys

#: Subcommands that drive a daemon (SPEC §19), served by ``sandboxd.client.cli``,
#: with the line ``sandboxd --help`` and ``sandboxd COMMAND --help`` show.
CLIENT_COMMANDS = {
    "exec": "Run a command in the sandbox, output live; exit with its code.",
    "cp": "Copy a file to or from the sandbox (:PATH is remote); resumable.",
    "ls": "List a directory in the sandbox.",
    "ps": "List the managed processes.",
    "logs": "A process's output (-f follows it).",
    "kill": "Signal a process (default TERM).",
    "term": "An interactive terminal; reattach to SESSION.",
    "caps": "What this token may do (--explain ENDPOINT: why).",
}


def client_usage() -> str:
    """The client commands, for the daemon's ``--help``."""
    lines = [
        "Commands that drive a daemon (--url/--token or SANDBOXD_URL/SANDBOXD_TOKEN;",
        "sandboxd COMMAND --help for their options):",
    ]
    # Aligned as Twisted's usage aligns the daemon's commands above them.
    lines += [f"    {name:<18}{text}" for name, text in CLIENT_COMMANDS.items()]
    return "\n".join(lines) + "\n"


def client_main(args: list[str]) -> int:
    """Run one client command (or say which extra is missing)."""
    try:
        from sandboxd.client.cli import main
    except ImportError as e:
        print(f"sandboxd {args[0]}: {e}; install sandboxd[client]", file=sys.stderr)
        return 2
    return main(args)
