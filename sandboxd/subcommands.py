"""
The subcommands of ``sandboxd`` that drive a daemon (SPEC §19): their
names and the line each shows in ``sandboxd --help`` and in its own
``--help``.  A leaf module: the console script, the daemon's usage
(:mod:`sandboxd.cli`) and the client's parser (:mod:`sandboxd.client.cli`)
all read it, and it imports nothing.
"""

from __future__ import annotations

#: Subcommands that drive a daemon (SPEC §19), served by ``sandboxd.client.cli``,
#: with the line ``sandboxd --help`` and ``sandboxd COMMAND --help`` show.
CLIENT_COMMANDS = {
    "exec": "Run a command in the sandbox, output live; exit with its code.",
    "cp": "Copy a file to or from the sandbox (:PATH is remote); resumable.",
    "ls": "List a directory in the sandbox.",
    "grep": "Lines of files in the sandbox that match a pattern.",
    "diagnostics": "A file's errors and warnings from its language server.",
    "definition": "Where the name at PATH:LINE[:COLUMN] is defined.",
    "ps": "List the managed processes.",
    "logs": "A process's output (-f follows it).",
    "kill": "Signal a process (default TERM).",
    "term": "An interactive terminal; reattach to SESSION.",
    "caps": "What this token may do (--explain ENDPOINT: why).",
    "commands": "List the template's commands, or run one: NAME [ARG=VALUE ...].",
    "code": "Run code in a kernel that keeps state (-c CODE, or a REPL).",
    "ui": "Print a URL that opens the web console with a short-lived link.",
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
