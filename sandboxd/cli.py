# -*- test-case-name: tests.test_cli -*-
"""
The ``sandboxd`` console script: serve, healthcheck, check-config, reload,
version (SPEC §1).
"""

from __future__ import annotations

import gc
import http.client
import json
import os
import signal
import sys
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from twisted.python import usage

from sandboxd._version import __version__
from sandboxd.console import client_main
from sandboxd.subcommands import CLIENT_COMMANDS, client_usage

# The daemon's modules are imported by the commands that need them:
# ``sandboxd healthcheck`` runs every few seconds in every sandbox (Docker
# HEALTHCHECK, exec probes) and must not pay for Twisted's reactor,
# pyOpenSSL and the policy engine each time.
if TYPE_CHECKING:
    from sandboxd.access.auth import Identity
    from sandboxd.daemon.tap import Options as ServeOptions
    from sandboxd.policy import Policy

#: ``sandboxd.daemon.server.DEFAULT_PORT`` (a test checks they agree).
DEFAULT_PORT = 9000


def serve_options() -> ServeOptions:
    """``sandboxd serve``'s options (the same as ``twistd sandboxd``'s)."""
    from sandboxd.daemon.tap import Options

    return Options()


class _CommandOptions(usage.Options):
    """A command's options: ``--version`` is sandboxd's, not Twisted's."""

    def opt_version(self) -> None:
        """Print sandboxd's version and exit."""
        print(__version__)
        raise SystemExit(0)


class HealthcheckOptions(_CommandOptions):
    """``sandboxd healthcheck``."""

    optParameters = [
        ["host", None, "127.0.0.1", "Host to ask."],
        ["port", None, str(DEFAULT_PORT), "HTTP port."],
        ["timeout", None, "3", "Seconds to wait."],
    ]


class CheckConfigOptions(_CommandOptions):
    """``sandboxd check-config``."""

    optFlags = [
        ["strict", None, "Treat warnings as errors."],
        ["json", None, "Print JSON."],
    ]
    optParameters = [
        ["policy", None, None, "Policy file (JSON or YAML)."],
        ["preset", None, None, "Preset name."],
        ["base-dir", None, None, "Path boundary."],
        ["explain", None, None, "Explain the decision for one endpoint."],
        ["path", None, None, "With --explain: a path to decide."],
        ["scopes", None, None, "With --explain: comma-separated scopes of the caller."],
        ["op", None, None, "With --explain: read, write or delete."],
    ]

    def __init__(self) -> None:
        super().__init__()
        self["commands"] = []

    def opt_commands(self, spec: str) -> None:
        """Import a commands file or module first (repeatable)."""
        self["commands"].append(spec)


class ReloadOptions(_CommandOptions):
    """``sandboxd reload``."""

    optParameters = [
        [
            "pid",
            None,
            None,
            "The daemon's pid (default: the one sandboxd running here).",
        ],
        [
            "pidfile",
            None,
            None,
            "A pidfile twistd wrote (--pidfile F); its pid must be a sandboxd.",
        ],
    ]


class Options(usage.Options):
    """``sandboxd COMMAND [options]``."""

    subCommands: list[list[Any]] = [
        ["serve", None, serve_options, "Run the daemon in the foreground."],
        ["healthcheck", None, HealthcheckOptions, "Exit 0 when /health answers ok."],
        [
            "check-config",
            None,
            CheckConfigOptions,
            "Validate a policy and show its effect.",
        ],
        ["reload", None, ReloadOptions, "Ask a running daemon to re-read its policy."],
        ["version", None, usage.Options, "Print the version."],
    ]

    def getUsage(self, width: int | None = None) -> str:
        """Twisted's usage, then the commands that drive a daemon."""
        return super().getUsage(width) + client_usage()

    def opt_version(self) -> None:
        """Print sandboxd's version and exit."""
        print(__version__)
        raise SystemExit(0)

    def opt_h(self) -> None:
        """Display this help and exit."""
        self.opt_help()

    def postOptions(self) -> None:
        """A command is required."""
        if self.subCommand is None:
            names = [c[0] for c in self.subCommands] + list(CLIENT_COMMANDS)
            raise usage.UsageError("a command is required: " + ", ".join(names))


def healthcheck(host: str, port: int, timeout: float) -> int:
    """GET /health; 0 when it answers 200 ``{"status": "ok"}``."""
    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.request("GET", "/health", headers={"Host": "localhost"})
        response = conn.getresponse()
        body = json.loads(response.read() or b"null")
        conn.close()
    except (OSError, ValueError, http.client.HTTPException):
        return 1
    return 0 if response.status == 200 and body == {"status": "ok"} else 1


def serve(options: ServeOptions) -> int:
    """Run the daemon on the global reactor until SIGTERM/SIGINT."""
    from twisted.internet import reactor
    from twisted.logger import globalLogBeginner

    from sandboxd.daemon.log_observer import observer_for
    from sandboxd.daemon.server import build
    from sandboxd.daemon.startup import StartRefused
    from sandboxd.policy import PolicyError

    globalLogBeginner.beginLoggingTo([observer_for(sys.stdout, options["log-format"])])
    try:
        daemon = build(options.settings(), reactor, policy=options.policy)
        daemon.startService()
    except PolicyError as e:
        print(f"sandboxd: {e}", file=sys.__stderr__)
        return 1
    except StartRefused as e:
        # The log has taken sys.stderr over; this line is for the operator.
        print(e.message, file=sys.__stderr__)
        return 1
    reactor.addSystemEventTrigger("before", "shutdown", daemon.stopService)
    reactor.run()
    return 0


def _rule_row(endpoint: Any, policy: Policy) -> dict[str, Any]:
    rule = policy.rules[endpoint.id]
    from sandboxd.policy.discovery import _non_default

    return {
        "endpoint": endpoint.id,
        "group": endpoint.group.value,
        "enabled": rule.enabled,
        "rule": rule.enabled_by,
        "scopes": list(rule.scopes),
        "audit": rule.audit,
        "limits": _non_default(rule.limits),
        "paths": _non_default(rule.paths),
        "set_by": dict(rule.sources),
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    """The effective per-endpoint table as aligned text."""
    header = ("endpoint", "group", "enabled", "decided by", "scopes", "limits")
    lines = [header]
    for row in rows:
        limits = ", ".join(f"{k}={v}" for k, v in row["limits"].items())
        lines.append(
            (
                row["endpoint"],
                row["group"],
                "yes" if row["enabled"] else "no",
                row["rule"],
                ",".join(row["scopes"]) or "-",
                limits or "-",
            )
        )
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header) - 1)]
    out = []
    for line in lines:
        cells = [str(c).ljust(w) for c, w in zip(line[:-1], widths, strict=True)]
        out.append("  ".join([*cells, str(line[-1])]).rstrip())
    return "\n".join(out)


def unknown_users(policy: Policy, table: Any) -> list[str]:
    """
    A warning for each ``params.default_user`` (and ``params.users`` entry)
    that is no user on this machine: every command of that endpoint would
    be refused at run time.
    """
    import pwd

    from sandboxd.daemon.startup import CHILD_GROUPS, READS_CHILDREN_ONLY
    from sandboxd.endpoints import CapabilityGroup as G

    # The groups whose calls act as the user: they start children, or
    # give what they write to the user (``health`` and the like do neither).
    acting = CHILD_GROUPS | {G.FILE_OPS, G.COMMANDS, G.SYSTEM, G.MCP, G.E2B, G.KEP}
    missing: dict[str, list[str]] = {}
    for endpoint in table:
        rule = policy.rules[endpoint.id]
        if (
            not rule.enabled
            or endpoint.group not in acting
            or endpoint.id in READS_CHILDREN_ONLY
        ):
            continue
        names = {rule.params.default_user, *(rule.params.users or ())}
        for name in sorted(str(n) for n in names if n is not None):
            if name.isdigit():
                continue
            try:
                pwd.getpwnam(name)
            except KeyError:
                missing.setdefault(name, []).append(endpoint.id)
    return [
        f"the user {name!r} (params.default_user or params.users of "
        f"{', '.join(ids[:3])}{' and more' if len(ids) > 3 else ''}) does not "
        "exist on this machine: those endpoints' commands and file writes"
        " would be refused"
        for name, ids in missing.items()
    ]


def trace_problems() -> list[str]:
    """What the OpenTelemetry variables ask for that the daemon cannot do."""
    from sandboxd.access.tracing import TraceSettings

    settings = TraceSettings.from_environ(os.environ)
    problems = list(settings.problems)
    if settings.endpoint is not None and (
        settings.certificate or settings.client_certificate
    ):
        # The files are opened at start, where an unreadable one only warns.
        from sandboxd.access.otlp import certificate_problem

        problems.append(certificate_problem(settings) or "")
    return [f"traces: {p}" for p in problems if p]


def check_config(options: CheckConfigOptions, out: Any = sys.stdout) -> int:
    """Validate, then print the table or one explained decision."""
    from sandboxd.access.auth import ANONYMOUS, Identity
    from sandboxd.commands import default_registry
    from sandboxd.daemon.startup import import_templates
    from sandboxd.endpoints import renamed_warning
    from sandboxd.policy import PolicyError, load_policy
    from sandboxd.policy.discovery import check
    from sandboxd.policy.lint import template_warnings
    from sandboxd.routes import default_table

    try:
        import_templates(options["commands"])
        table = default_table()
        policy = load_policy(
            table,
            path=options["policy"],
            preset=options["preset"],
            base_dir=options["base-dir"],
            fail_closed=False,
        )
    except PolicyError as e:
        print(f"invalid: {e}", file=out)
        return 1
    warnings = [
        *policy.warnings,
        *template_warnings(default_registry, table, policy.document),
        *unknown_users(policy, table),
        *trace_problems(),
    ]
    if options["strict"] and warnings:
        for warning in warnings:
            print(f"error (--strict): {warning}", file=out)
        return 1
    if options["explain"]:
        identity: Identity = ANONYMOUS
        if options["scopes"] is not None:
            identity = Identity(
                "explain", frozenset(s for s in options["scopes"].split(",") if s)
            )
        context = SimpleNamespace(table=table, policy=policy)
        body: dict[str, Any] = {"endpoint": options["explain"]}
        if options["path"]:
            body["path"] = options["path"]
        if options["op"]:
            body["op"] = options["op"]
        try:
            decision = check(context, identity, body)
        except Exception as e:
            print(f"invalid: {e}", file=out)
            return 1
        if decision["endpoint"] not in policy.rules:
            # An id no endpoint has: over HTTP a decision (as the seed's
            # server answers it), here a mistake in the command line.
            print(f"invalid: {decision['reason']}", file=out)
            return 1
        rule = policy.rules[decision["endpoint"]]
        decision["effective"] = _rule_row(table.get(decision["endpoint"]), policy)
        renamed: list[str] = []
        if options["explain"] != decision["endpoint"]:
            renamed.append(renamed_warning("--explain", options["explain"]))
        if options["json"]:
            if renamed:
                decision["warnings"] = renamed
            print(json.dumps(decision, indent=2), file=out)
        else:
            for warning in renamed:
                print(f"warning: {warning}", file=out)
            verdict = (
                "ALLOWED"
                if decision["allowed"]
                else f"REFUSED ({decision.get('code')})"
            )
            print(f"{decision['endpoint']}: {verdict}", file=out)
            print(f"  enabled: {rule.enabled} (by {rule.enabled_by})", file=out)
            print(f"  scopes required: {', '.join(rule.scopes) or 'none'}", file=out)
            if decision.get("rule"):
                print(f"  decided by: {decision['rule']}", file=out)
            for p in decision["paths"]:
                state = (
                    "allowed"
                    if p["allowed"]
                    else f"refused: {p.get('code')} ({p.get('rule')})"
                )
                print(f"  path {p['path']}: {state}", file=out)
            for leaf, origin in sorted(rule.sources.items()):
                print(f"  {leaf} set by {origin}", file=out)
        # As `sandboxd caps --explain`: a refusal is a non-zero exit.
        return 0 if decision["allowed"] else 1
    rows = [_rule_row(e, policy) for e in table]
    if options["json"]:
        print(
            json.dumps(
                {"valid": True, "warnings": warnings, "endpoints": rows},
                indent=2,
            ),
            file=out,
        )
    else:
        print(format_table(rows), file=out)
        for warning in warnings:
            print(f"warning: {warning}", file=out)
        print(
            f"valid: {policy.document.source} (preset {policy.preset or 'none'}, base_dir {policy.base_dir})",
            file=out,
        )
    return 0


def reload(options: ReloadOptions) -> int:
    """
    Send SIGHUP to the daemon: ``--pid``, else ``--pidfile``'s, else the
    one sandboxd running on this machine (``sandboxd serve`` and the
    documented twistd invocations write no pidfile, and a pidfile left in
    the current directory may name a pid reused since).  A pid that is not
    a running sandboxd is refused: SIGHUP's default action kills.
    """
    from sandboxd.daemon import running

    pid = options["pid"]
    if pid is None and options["pidfile"] is not None:
        try:
            with open(options["pidfile"]) as f:
                pid = f.read().strip()
        except OSError as e:
            print(
                f"sandboxd reload: cannot read {options['pidfile']}: {e.strerror}",
                file=sys.stderr,
            )
            return 1
    if pid is None:
        found = running.running_daemons()
        if len(found) != 1:
            which = (
                "no running sandboxd was found"
                if not found
                else "several sandboxd daemons run: "
                + ", ".join(map(str, found))
                + "; choose one with --pid"
            )
            print(f"sandboxd reload: {which}", file=sys.stderr)
            return 1
        pid = str(found[0])
    try:
        number = int(pid)
    except ValueError:
        print(f"sandboxd reload: {pid!r} is not a pid", file=sys.stderr)
        return 1
    if number <= 0 or not running.is_daemon(number):
        argv = running.command_of(number) if number > 0 else None
        what = (
            "does not run"
            if argv is None
            else f"is not sandboxd ({' '.join(argv)[:80]})"
        )
        print(
            f"sandboxd reload: process {number} {what}; nothing was signalled",
            file=sys.stderr,
        )
        return 1
    try:
        os.kill(number, signal.SIGHUP)
    except OSError as e:
        print(f"sandboxd reload: cannot signal {number}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"sandboxd reload: sent SIGHUP to sandboxd {number}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] and args[0] in CLIENT_COMMANDS:
        return client_main(args)
    # What is alive now (the interpreter, Twisted) lives as long as the
    # process: no collection during start-up walks it again.
    gc.freeze()
    options = Options()
    try:
        options.parseOptions(args)
    except usage.UsageError as e:
        print(f"sandboxd: {e}", file=sys.stderr)
        return 2
    command, sub = options.subCommand, options.subOptions
    if command == "version":
        print(__version__)
        return 0
    if command == "healthcheck":
        return healthcheck(sub["host"], int(sub["port"]), float(sub["timeout"]))
    if command == "check-config":
        return check_config(sub)
    if command == "reload":
        return reload(sub)
    return serve(sub)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
