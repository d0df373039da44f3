"""
One seed-style policy file, loaded by the seed's own server and by sandboxd,
compared endpoint by endpoint through ``GET /capabilities``.

Both servers run as their own processes on loopback, each started with the
file, as an operator would start them.  For every identity the file defines
(each token, and ``anonymous`` where a call without credentials gets in),
both discovery documents are fetched and, for every endpoint id both
servers know, ``enabled``, ``scopes`` and ``allowed`` are compared.

Run as a script for the table of every file (the before/after figure)::

    python -m tests.seed.policycompare [--sandboxd PATH] [FILE ...]
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

from tests.helpers import free_port, port_was_taken, session_listens

HERE = os.path.dirname(os.path.abspath(__file__))
POLICIES = os.path.join(HERE, "policies")
BIN = os.path.dirname(sys.executable)
#: The fields compared for each endpoint both servers list.
FIELDS = ("enabled", "scopes", "allowed")


def policy_files() -> list[str]:
    """Every seed-style policy file, in name order."""
    return sorted(glob.glob(os.path.join(POLICIES, "*.json")))


#: ``ABX_SERVER_ENABLED_GROUPS`` beside a policy: ``(name, policy, value)``.
#: The variable is the highest layer for a group, so it turns a group back
#: on over a preset's or a policy's ``groups``; an endpoint rule (an id or
#: a pattern) is more specific and still wins.
ENABLED_GROUPS_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("env-alone", {}, "dev_tools,browser"),
    ("env-spaces-and-core", {}, " dev_tools , ,core"),
    (
        "env-over-groups-off",
        {"groups": {"dev_tools": False, "process": False}},
        "dev_tools,process",
    ),
    ("env-beside-groups-list", {"groups": ["browser"]}, "dev_tools"),
    (
        "env-under-endpoint-off",
        {"endpoints": {"git_status": {"enabled": False}}},
        "dev_tools",
    ),
    (
        "env-under-glob-off",
        {"endpoints": {"browser_*": {"enabled": False}}},
        "browser,dev_tools",
    ),
    ("env-under-star-off", {"endpoints": {"*": {"enabled": False}}}, "file_ops"),
    ("env-over-hardened", {"preset": "hardened"}, "process,terminal"),
    ("env-over-read-only", {"preset": "read-only"}, "process"),
    ("env-under-locked", {"preset": "locked"}, "file_ops"),
    ("env-under-transfer-only", {"preset": "transfer-only"}, "dev_tools"),
    (
        "env-with-tokens",
        {
            "auth": {
                "tokens": [
                    {"id": "ops", "token_env": "OPS_TOKEN", "scopes": ["*"]},
                    {
                        "id": "reader",
                        "token_env": "READER_TOKEN",
                        "scopes": ["core:read", "devtools:read", "files:read"],
                    },
                ]
            }
        },
        "dev_tools",
    ),
]

#: Values both servers refuse to start with (an unknown group name).
BAD_ENABLED_GROUPS = ("browsr", "dev_tools,nope")


def token_for(identity: str) -> str:
    """The token the files' ``token_sha256`` entries and ``token_env`` values use."""
    return f"seed-token-{identity}"


def identities(
    doc: dict[str, Any],
) -> tuple[dict[str, str], list[tuple[str, str | None]]]:
    """
    The environment the file's ``token_env`` names need, and each identity
    to ask as: ``(name, token or None for no credentials)``.
    """
    auth = doc.get("auth", {})
    env: dict[str, str] = {}
    who: list[tuple[str, str | None]] = []
    for entry in auth.get("tokens", []):
        token = token_for(entry["id"])
        if "token_env" in entry:
            env[entry["token_env"]] = token
        else:
            assert entry["token_sha256"] == hashlib.sha256(token.encode()).hexdigest()
        who.append((entry["id"], token))
    if not auth.get("tokens") or auth.get("allow_anonymous"):
        who.append(("anonymous", None))
    return env, who


class Server:
    """One server process started with the policy file."""

    def __init__(self, argv: list[str], env: dict[str, str], port: int) -> None:
        self.port = port
        self.up: bool | None = None
        self.log = tempfile.TemporaryFile("w+")
        clean = {k: v for k, v in os.environ.items() if not k.startswith("ABX_")}
        clean.update(env)
        self.proc = subprocess.Popen(
            argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=clean,
            start_new_session=True,
        )

    def wait(self, timeout: float = 60) -> bool:
        """
        Whether ``/health`` answers before the process exits or time runs
        out, from this process: another test's server that took the port
        first answers too, and is not the one compared.  Waits once: later
        calls give the first one's answer.
        """
        if self.up is None:
            self.up = self._wait(timeout)
        return self.up

    def _wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/health", timeout=2
                ) as r:
                    up = r.status == 200
            except urllib.error.HTTPError:
                # Up, but a policy closed /health (the seed lets one).
                up = True
            except (OSError, urllib.error.URLError):
                up = False
            if up and session_listens(self.proc.pid, self.port):
                return True
            time.sleep(0.1)
        return False

    def lost_its_port(self) -> bool:
        """Whether it ended because another process had taken its port."""
        return self.proc.poll() is not None and port_was_taken(self.output())

    def capabilities(self, token: str | None) -> dict[str, Any]:
        """``GET /capabilities`` as ``token`` (or with no credentials)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/capabilities", headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                body: dict[str, Any] = json.loads(r.read())
                body["status"] = r.status
                return body
        except urllib.error.HTTPError as e:
            return {"status": e.code, "endpoints": {}}

    def output(self) -> str:
        """What the process printed (its refusal, when it did not start)."""
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        """Kill the process group and close the log."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


#: ``python -c`` this, then a module's name and its arguments: the module
#: run as ``python -m`` runs it, with the signal dispositions of a program
#: started from a terminal.  A test run started in the background by a
#: non-interactive shell ignores SIGINT and SIGQUIT; an ignored signal
#: stays ignored across exec, and the seed's server hands its own
#: dispositions on to every process it starts (sandboxd gives its children
#: the defaults back), so its ``signal(pid, 2)`` left a ``sleep`` running
#: and the comparison failed for a reason of how the suite was started.
DEFAULT_SIGNALS = (
    "import runpy, signal, sys;"
    "signal.signal(signal.SIGINT, signal.default_int_handler);"
    "signal.signal(signal.SIGQUIT, signal.SIG_DFL);"
    "del sys.argv[0];"
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


def python_module_argv(module: str, *args: str) -> list[str]:
    """``python -m module args``, with default signal dispositions (see above)."""
    return [sys.executable, "-c", DEFAULT_SIGNALS, module, *args]


def seed_argv(port: int, pty_port: int, *extra: str) -> list[str]:
    """The seed's server (``python -m agent_sandbox.server serve``) on loopback ports."""
    return python_module_argv(
        "agent_sandbox.server",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--pty-port",
        str(pty_port),
        *extra,
    )


def seed_server(path: str, env: dict[str, str], base: str) -> Server:
    """The seed's server with the file."""
    port = free_port()
    argv = seed_argv(port, free_port(), "--policy", path)
    return Server(argv, {**env, "ABX_SERVER_BASE_DIR": base}, port)


def sandboxd_server(
    path: str, env: dict[str, str], base: str, program: str, port: int | None = None
) -> Server:
    """sandboxd (``sandboxd serve``) with the file, on ``port`` or a free one."""
    port = port or free_port()
    argv = [
        program,
        "serve",
        "--port",
        f"tcp:{port}:interface=127.0.0.1",
        "--pty-port",
        f"tcp:{free_port()}:interface=127.0.0.1",
        "--base-dir",
        base,
        "--policy",
        path,
    ]
    return Server(argv, env, port)


def differences(seed: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """One line per endpoint field that differs, for the endpoint ids both list."""
    out = []
    if seed["status"] != ours["status"]:
        out.append(f"/capabilities: seed {seed['status']}, sandboxd {ours['status']}")
    theirs, mine = seed["endpoints"], ours["endpoints"]
    for endpoint in sorted(set(theirs) & set(mine)):
        for field in FIELDS:
            a, b = theirs[endpoint].get(field), mine[endpoint].get(field)
            if field == "scopes":
                a, b = sorted(a or []), sorted(b or [])
            if a != b:
                out.append(f"{endpoint}.{field}: seed {a!r}, sandboxd {b!r}")
    return out


def children_as_root(path: str, doc: dict[str, Any], folder: str) -> str:
    """
    ``path``, or as root a copy of it naming root as the children's user:
    a root sandboxd with tokens refuses to start until a policy says whom
    commands run as (agent-sandbox-server runs them as itself), and these
    comparisons are about what each endpoint allows, not whom it runs as.
    """
    if os.geteuid() != 0:
        return path
    copy = json.loads(json.dumps(doc))
    defaults = copy.setdefault("defaults", {})
    defaults.setdefault("params", {}).setdefault("default_user", "root")
    named = os.path.join(folder, "policy-as-root.json")
    with open(named, "w") as f:
        json.dump(copy, f)
    return named


def last_line(server: Server) -> str:
    """The last line a server printed (its refusal, when it did not start)."""
    lines = [ln for ln in server.output().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def start_both(
    path: str, doc: dict[str, Any], env: dict[str, str], base: str, program: str
) -> tuple[Server, Server]:
    """
    Both servers with the file, started together, each up on its own port:
    a server that lost its port to another test's before it could bind is
    started again on a fresh one (at most three tries), since its refusal
    would say nothing about the policy.
    """
    for attempt in range(3):
        seed = seed_server(path, env, base)
        ours = sandboxd_server(children_as_root(path, doc, base), env, base, program)
        seed.wait()
        ours.wait()
        lost = seed.lost_its_port() or ours.lost_its_port()
        if not lost or attempt == 2:
            break
        seed.stop()
        ours.stop()
    return seed, ours


def compare(
    path: str, program: str | None = None, enabled_groups: str | None = None
) -> dict[str, Any]:
    """
    Load ``path`` in both servers and compare.

    :param enabled_groups: ``ABX_SERVER_ENABLED_GROUPS`` for both servers.
    :return: ``{"file", "seed_loads", "sandboxd_loads", "shared", "differences",
        "refusal", "seed_refusal", "enabled"}``; ``differences`` maps each
        identity to its lines, ``enabled`` each identity to the endpoint
        ids sandboxd has on.
    """
    program = program or os.path.join(BIN, "sandboxd")
    with open(path) as f:
        doc = json.load(f)
    env, who = identities(doc)
    if enabled_groups is not None:
        env["ABX_SERVER_ENABLED_GROUPS"] = enabled_groups
    result: dict[str, Any] = {
        "file": os.path.basename(path),
        "differences": {},
        "enabled": {},
        "refusal": None,
        "seed_refusal": None,
        "shared": 0,
    }
    with tempfile.TemporaryDirectory() as base:
        seed, ours = start_both(path, doc, env, base, program)
        try:
            result["seed_loads"] = seed.wait()
            result["sandboxd_loads"] = ours.wait()
            if not result["sandboxd_loads"]:
                result["refusal"] = last_line(ours)
            if not result["seed_loads"]:
                result["seed_refusal"] = last_line(seed)
            if result["seed_loads"] and result["sandboxd_loads"]:
                for name, token in who:
                    theirs, mine = seed.capabilities(token), ours.capabilities(token)
                    shared = set(theirs["endpoints"]) & set(mine["endpoints"])
                    # One identity may be refused /capabilities on both.
                    result["shared"] = max(result["shared"], len(shared))
                    result["differences"][name] = differences(theirs, mine)
                    result["enabled"][name] = sorted(
                        e for e, info in mine["endpoints"].items() if info["enabled"]
                    )
        finally:
            seed.stop()
            ours.stop()
    return result


def compare_doc(
    name: str, doc: dict[str, Any], enabled_groups: str, program: str | None = None
) -> dict[str, Any]:
    """:func:`compare` for a policy given as a mapping (written to a file first)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, name + ".json")
        with open(path, "w") as f:
            json.dump(doc, f)
        return compare(path, program, enabled_groups)


def matches(result: dict[str, Any]) -> bool:
    """Both load and no identity sees a difference."""
    return bool(
        result.get("seed_loads")
        and result.get("sandboxd_loads")
        and not any(result["differences"].values())
    )


def main(argv: list[str] | None = None) -> int:
    """Print one line per file and the totals; exit 1 unless every file matches."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandboxd", help="the sandboxd program to compare")
    parser.add_argument("files", nargs="*")
    args = parser.parse_args(argv)
    files = args.files or policy_files()
    results = [compare(path, args.sandboxd) for path in files]
    if not args.files:
        for name, doc, value in ENABLED_GROUPS_CASES:
            r = compare_doc(name, doc, value, args.sandboxd)
            r["file"] = f"{name} ({value.strip()})"
            results.append(r)
    loads = same = 0
    for r in results:
        loads += bool(r["sandboxd_loads"])
        same += matches(r)
        state = (
            "match"
            if matches(r)
            else "refused"
            if not r["sandboxd_loads"]
            else "differs"
        )
        print(f"{r['file']:40} {state:8} {r['refusal'] or ''}")
        for name, lines in r["differences"].items():
            for line in lines:
                print(f"    {name}: {line}")
    print(f"{len(results)} policies: sandboxd loads {loads}, same effect {same}")
    return 0 if same == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
