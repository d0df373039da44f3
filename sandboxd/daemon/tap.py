# -*- test-case-name: tests.test_cli -*-
"""
``twistd sandboxd``: command-line options and ``makeService``.

The reactor is never imported at module scope here, so ``twistd
--reactor=...`` keeps working.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from twisted.application.service import IService
from twisted.python import usage

from sandboxd.daemon.log_observer import (
    log_format_of,
    twistd_log_file,
    use_for_twistd,
)
from sandboxd.daemon.server import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    Settings,
    build,
    listen_string,
    validate_settings,
)
from sandboxd.daemon.startup import import_templates
from sandboxd.policy import Policy, PolicyError
from sandboxd.policy.document import check_preview_url, check_public_url


class Options(usage.Options):
    """Options shared by ``twistd sandboxd`` and ``sandboxd serve``."""

    optFlags = [
        [
            "allow-unauthenticated",
            None,
            "Serve a non-loopback listener with no token (anyone who can reach "
            "it controls the sandbox; warned at every start).",
        ],
    ]

    optParameters = [
        [
            "host",
            None,
            DEFAULT_HOST,
            "Interface to bind when --port/--pty-port are numbers (default "
            "127.0.0.1 without a token, 0.0.0.0 with one).",
        ],
        ["port", None, str(DEFAULT_PORT), "HTTP port, or a Twisted endpoint string."],
        [
            "pty-port",
            None,
            None,
            "PTY WebSocket port or endpoint (default $ABX_PTY_PORT, else the "
            "HTTP port + 1; 9001 when that has no number).",
        ],
        [
            "e2b-port",
            None,
            None,
            "E2B-compatible envd port or endpoint (off unless given and the "
            "e2b endpoint is enabled).",
        ],
        [
            "preview-port",
            None,
            None,
            "Preview door port or endpoint, where browsers open the sandbox's "
            "web apps (off unless given and the preview group is on).",
        ],
        [
            "e2b-code-port",
            None,
            None,
            "A second E2B port or endpoint, for platforms that route E2B's "
            "code interpreter by its port (49999); needs --e2b-port.",
        ],
        [
            "kep-rest-port",
            None,
            None,
            "Port or endpoint of agent-sandbox's REST filesystem API (KEP-539.2; "
            "off unless given and the kep endpoint is enabled).",
        ],
        [
            "kep-grpc-port",
            None,
            None,
            "Port or endpoint of agent-sandbox's gRPC ProcessService; needs "
            "--kep-rest-port.",
        ],
        [
            "kep-root",
            None,
            None,
            "The directory KEP paths are relative to (default: the base dir).",
        ],
        ["policy", None, None, "Policy file (JSON, or YAML with a server: block)."],
        [
            "preset",
            None,
            None,
            "Preset: default, transfer-only, read-only, hardened, locked.",
        ],
        [
            "base-dir",
            None,
            None,
            "Path boundary (default $ABX_SERVER_BASE_DIR or /home/user).",
        ],
        [
            "pty-public-url",
            None,
            None,
            "Base of the ws_url clients are given (ws:// or wss://), when they "
            "reach the PTY port through a proxy or a port mapping.",
        ],
        [
            "preview-public-url",
            None,
            None,
            "Where browsers reach the preview door behind an ingress "
            "(https://{port}-sbx.example.com, or a base for /p/PORT/).",
        ],
        [
            "audit-log",
            None,
            None,
            "Audit file (default $ABX_SERVER_AUDIT_LOG or the log).",
        ],
        [
            "log-format",
            None,
            None,
            "text, or json: one JSON object per line (time, level, logger, "
            "message; an audit record as an object) for a log collector "
            "(default $ABX_SERVER_LOG_FORMAT or text).",
        ],
        [
            "state-dir",
            None,
            None,
            "Where what must outlive a restart is kept: capability links' use "
            "counts and revocations, the /v1 door's sessions, files and webhook "
            "endpoints (default $ABX_SERVER_STATE_DIR, else $ABX_AGENTS_STATE_DIR; "
            "unset: memory only).",
        ],
        [
            "max-connections",
            None,
            None,
            "HTTP connections open at once (default $ABX_MAX_CONNECTIONS or 1024).",
        ],
        [
            "max-connections-per-address",
            None,
            None,
            "HTTP connections from one address "
            "(default $ABX_MAX_CONNECTIONS_PER_ADDRESS or 256).",
        ],
        [
            "head-deadline",
            None,
            None,
            "Seconds a request head may take, and a refused request's "
            "connection may stay to read what its client still sends "
            "(default $ABX_HEAD_DEADLINE_SECONDS or 30).",
        ],
        [
            "idle-timeout",
            None,
            None,
            "Seconds a kept-alive connection may wait for its next request; a "
            "client that takes none of a response for twice as long is cut "
            "(default $ABX_IDLE_TIMEOUT_SECONDS or 60).",
        ],
        [
            "body-min-rate",
            None,
            None,
            "Bytes a second a request body must average after the head "
            "deadline's grace (default $ABX_BODY_MIN_RATE or 1024).",
        ],
    ]

    def __init__(self) -> None:
        super().__init__()
        self["commands"] = []
        #: The policy as ``postOptions`` compiled it (None before).
        self.policy: Policy | None = None
        #: twistd's ``--logfile``, absolute (set by ``postOptions``): one of
        #: the daemon's own files.
        self.log_file: str | None = None

    def opt_version(self) -> None:
        """Print sandboxd's version and exit (not Twisted's, as usage's would)."""
        from sandboxd._version import __version__

        print(__version__)
        raise SystemExit(0)

    def opt_commands(self, spec: str) -> None:
        """Import a commands file or module (repeatable)."""
        self["commands"].append(spec)

    def postOptions(self) -> None:
        """Resolve paths now: twistd may chdir before the service starts."""
        for key in ("policy", "base-dir", "audit-log", "state-dir", "kep-root"):
            if self[key]:
                self[key] = os.path.abspath(self[key])
        self["commands"] = [
            os.path.abspath(c) if c.endswith(".py") else c for c in self["commands"]
        ]
        self["log-format"] = log_format_of(self["log-format"])
        self.log_file = twistd_log_file(self)
        if self["e2b-code-port"] and not self["e2b-port"]:
            raise usage.UsageError("--e2b-code-port needs --e2b-port")
        if self["kep-grpc-port"] and not self["kep-rest-port"]:
            raise usage.UsageError("--kep-grpc-port needs --kep-rest-port")
        if self["kep-grpc-port"] and importlib.util.find_spec("h2") is None:
            raise usage.UsageError(
                "--kep-grpc-port needs the h2 library: pip install 'sandboxd[kep]'"
            )
        try:
            if self["preview-public-url"] is not None:
                self["preview-public-url"] = check_preview_url(
                    self["preview-public-url"], "--preview-public-url"
                )
            if self["pty-public-url"] is not None:
                self["pty-public-url"] = check_public_url(
                    "--pty-public-url", self["pty-public-url"]
                )
            import_templates(self["commands"])
            self.policy = validate_settings(self.settings())
        except PolicyError as e:
            raise usage.UsageError(str(e)) from None
        use_for_twistd(self)

    def settings(self) -> Settings:
        """The options as daemon settings."""
        host = self["host"]
        return Settings(
            port=listen_string(self["port"], host),
            pty_port=listen_string(self["pty-port"], host)
            if self["pty-port"]
            else None,
            host=host,
            allow_unauthenticated=bool(self["allow-unauthenticated"]),
            pty_public_url=self["pty-public-url"],
            preview_public_url=self["preview-public-url"],
            e2b_port=listen_string(self["e2b-port"], host)
            if self["e2b-port"]
            else None,
            preview_port=listen_string(self["preview-port"], host)
            if self["preview-port"]
            else None,
            e2b_code_port=listen_string(self["e2b-code-port"], host)
            if self["e2b-code-port"]
            else None,
            kep_rest_port=listen_string(self["kep-rest-port"], host)
            if self["kep-rest-port"]
            else None,
            kep_grpc_port=listen_string(self["kep-grpc-port"], host)
            if self["kep-grpc-port"]
            else None,
            kep_root=self["kep-root"],
            policy_file=self["policy"],
            preset=self["preset"],
            base_dir=self["base-dir"],
            commands=tuple(self["commands"]),
            audit_log=self["audit-log"],
            log_file=self.log_file,
            state_dir=self["state-dir"],
            chdir=True,
            root_children_check=True,
            max_connections=self["max-connections"],
            max_connections_per_address=self["max-connections-per-address"],
            head_deadline=self["head-deadline"],
            idle_timeout=self["idle-timeout"],
            body_min_rate=self["body-min-rate"],
        )


def makeService(options: Options, reactor: Any = None) -> IService:
    """Build the daemon; a bad policy is a usage error that stops twistd."""
    try:
        return build(options.settings(), reactor, policy=options.policy)
    except PolicyError as e:
        raise usage.UsageError(str(e)) from None
