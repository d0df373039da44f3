# -*- test-case-name: tests.policy.test_engine -*-
"""
The typed result of policy merging: what a handler reads.

Handlers never parse the policy document; they read ``request.rule.limits``,
``request.rule.paths`` and ``request.rule.params``.  Every field that the
policy can set is declared here once; the schema the validator enforces is
derived from these classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from sandboxd.policy.defaults import AGENT_FULL_ACCESS_MODES

if TYPE_CHECKING:
    from sandboxd.browser.urlpolicy import UrlTarget


@attrs.frozen
class Limits:
    """Numeric bounds (SPEC §5.2 ``limits`` and §15.3's agent limits)."""

    max_bytes: int | None = None
    max_request_bytes: int | None = None
    max_entries: int | None = None
    #: How deep a listing or search may go (the seed's name).
    max_depth: int | None = None
    #: How many matches a search may return (the seed's name).
    max_results: int | None = None
    #: How many files an archive may hold (the seed's name).
    max_files: int | None = None
    max_duration_seconds: float | None = None
    max_output_bytes: int | None = None
    timeout_seconds: float | None = None
    rate_per_minute: int | None = None
    max_concurrency: int | None = None
    max_processes: int | None = None
    max_sessions: int | None = None
    # what one identity may hold of a daemon-wide cap (MCP sessions, open
    # uploads, watches); None: half of it when several identities exist
    max_per_identity: int | None = None
    max_turn_seconds: float | None = None
    idle_timeout_seconds: float | None = None
    init_timeout_seconds: float | None = None
    max_terminals: int | None = None
    max_message_bytes: int | None = None
    max_event_bytes: int | None = None
    max_prompt_bytes: int | None = None
    permission_timeout_seconds: float | None = None
    # capability links
    max_link_ttl_seconds: float | None = None
    # the preview door: how long a spliced upgrade (a WebSocket) may pass
    # no byte either way before both its connections are closed
    ws_idle_timeout_seconds: float | None = None
    max_jobs: int | None = None
    # code contexts (SPEC §22)
    max_contexts: int | None = None
    max_contexts_per_identity: int | None = None
    start_timeout_seconds: float | None = None
    max_display_bytes: int | None = None
    max_queued: int | None = None
    interrupt_grace_seconds: float | None = None

    @property
    def run_ceiling(self) -> float | None:
        """
        The longest a call's child may run: the smaller of ``timeout_seconds``
        and ``max_duration_seconds`` (None when neither is set).
        """
        bounds = [
            b
            for b in (self.timeout_seconds, self.max_duration_seconds)
            if b is not None
        ]
        return min(bounds) if bounds else None


def smallest(*bounds: int | None) -> int | None:
    """
    The tightest of several bounds that may be unset: the seed's limit
    names (``max_results``, ``max_files``) and ours (``max_entries``) both
    bound the same count, and the lower one holds.
    """
    present = [b for b in bounds if b is not None]
    return min(present) if present else None


@attrs.frozen
class PathRule:
    """Where an endpoint may touch the file system (SPEC §5.2 ``paths``)."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    read_only: tuple[str, ...] = ()
    symlinks: str = "follow"
    hard_links: str = "follow"


@attrs.frozen
class Params:
    """Behavioural switches and allow/deny lists (SPEC §5.2 ``params``)."""

    overwrite: bool | None = None
    allow_extensions: tuple[str, ...] | None = None
    deny_extensions: tuple[str, ...] = ()
    allow_commands: tuple[str, ...] | None = None
    deny_commands: tuple[str, ...] = ()
    languages: tuple[str, ...] = ("python", "node", "bash")
    allowed_signals: tuple[int, ...] = (2, 9, 15, 18, 20)
    url_allow: tuple[str, ...] | None = None
    url_deny: tuple[str, ...] = ()
    url_schemes: tuple[str, ...] = ("http", "https")
    block_private_networks: bool = False
    shells: tuple[str, ...] = ("bash", "sh")
    env_deny: tuple[str, ...] = ()
    allow_vars: tuple[str, ...] | None = None
    deny_vars: tuple[str, ...] = ()
    users: tuple[str, ...] | None = None
    default_user: str | None = None
    # agents (SPEC §15.3)
    agents: tuple[str, ...] | None = None
    permission_mode: dict[str, str] | None = None
    permission_timeout_action: str = "deny"
    allow_always: bool = True
    allow_modes: tuple[str, ...] | None = None
    deny_modes: tuple[str, ...] = AGENT_FULL_ACCESS_MODES
    mcp_servers: str = "none"
    client_fs: str = "read_write"
    client_terminal: bool = True
    # the preview door: which ports may be exposed (``"3000"``,
    # ``"8000-8999"``), which never, whether publicly, and the Host the app sees
    ports: tuple[str, ...] | None = None
    deny_ports: tuple[int, ...] = ()
    allow_public: bool = True
    host_header: str = "upstream"
    # git (SPEC §24)
    git_protocols: tuple[str, ...] = ("https",)
    protected_branches: tuple[str, ...] = ()
    allow_force_push: bool = False
    allow_hard_reset: bool = True
    git_hooks: bool = False
    git_config_keys: tuple[str, ...] = (
        "user.name",
        "user.email",
        "pull.rebase",
        "init.defaultBranch",
        "core.autocrlf",
    )
    allow_url_credentials: bool = False
    # code contexts (SPEC §22)
    kernels: tuple[str, ...] = ("python3", "sandboxd-python", "sandboxd-bash")
    allow_stdin: bool = True
    auto_restart: bool = True
    # language servers: the catalogue ids a session may start (None: all)
    lsp_servers: tuple[str, ...] | None = None
    # the editor socket: the workspace/executeCommand commands an editor may
    # send its server (a command runs whatever the server makes of it)
    lsp_commands: tuple[str, ...] = ()
    # the editor socket: whether an editor's settings reach its server
    # (settings can name programs the server runs)
    lsp_settings: bool = False
    # the MCP door: "default" lists the tools a model uses; "all" every tool
    mcp_tools: str = "default"
    # the KEP door: the token id a call with no credential at all stands
    # for (agent-sandbox's SDK sends none); None: such a call is 401
    unauthenticated_as: str | None = None
    # children confined with Landlock (sandboxd.policy.confinement): where
    # they may read and write (relative paths under the base dir), whom they
    # may signal, which TCP ports they may connect to or bind (None: any)
    confine: bool = False
    confine_read: tuple[str, ...] = ("/",)
    confine_write: tuple[str, ...] = (".", "/tmp", "/var/tmp", "/dev/shm")
    confine_signals: str = "own"
    confine_tcp_connect: tuple[int, ...] | None = None
    confine_tcp_bind: tuple[int, ...] | None = None

    def url_refusal(self, target: UrlTarget) -> tuple[str, str] | None:
        """
        What ``url_deny`` and ``url_allow`` say of a URL (see
        :func:`~sandboxd.browser.urlpolicy.url_refusal`): None when they let
        it pass, else why (``denied by policy (PATTERN)``, ``not in
        url_allow``) and the leaf key that decided it (for
        :func:`sandboxd.errors.policy_rule`).
        """
        # Only the groups that take URLs (git, webhooks) ask, so the
        # matcher is imported by the first of them, not at every start.
        from sandboxd.browser.urlpolicy import url_refusal

        refused = url_refusal(self.url_deny, self.url_allow, target)
        if refused is None:
            return None
        pattern, leaf = refused
        if pattern:
            return f"denied by policy ({pattern})", leaf
        return "not in url_allow", leaf


#: The sections of a rule and the class describing each.
SECTIONS: dict[str, type[Any]] = {"limits": Limits, "paths": PathRule, "params": Params}

#: Keys a rule may hold at its top level.
RULE_KEYS = ("enabled", "scopes", "paths", "limits", "params", "audit")

AUDIT_MODES = ("off", "deny", "all")


def section_fields(section: str) -> dict[str, attrs.Attribute[Any]]:
    """The declared fields of a rule section, by name."""
    return {a.name: a for a in attrs.fields(SECTIONS[section])}


@attrs.define(eq=False)
class Anchors:
    """
    What the path guard remembers of the directories one policy serves: the
    ``(st_dev, st_ino)`` of each anchor (the base dir, every allowed root) as
    pinned when the policy took effect, and the base dir's device.  One per
    compiled policy, shared by its rules, so a reload pins afresh and two
    daemons in one process never share the memory.
    """

    pinned: dict[str, tuple[int, int]] = attrs.Factory(dict)
    devices: dict[str, int] = attrs.Factory(dict)


@attrs.frozen
class EffectiveRule:
    """
    One endpoint's merged rule, computed once when a policy is loaded.

    :ivar enabled_by: the rule string that decided ``enabled``.
    :ivar sources: leaf key (``limits.max_bytes``) -> the rule string that
        set it, so every decision can explain itself.
    :ivar reason: ``None`` when enabled, else ``disabled`` or
        ``not_implemented``.
    :ivar daemon_files: the daemon's own files (real paths): the audit log,
        token files, the policy file, TLS keys.  They and their rotations
        (``NAME.1``...) are refused to every path operation.
    """

    endpoint_id: str
    enabled: bool
    enabled_by: str
    scopes: tuple[str, ...]
    audit: str
    limits: Limits
    paths: PathRule
    params: Params
    base_dir: str
    sources: dict[str, str] = attrs.field(factory=dict, eq=False)
    reason: str | None = None
    daemon_files: tuple[str, ...] = ()
    anchors: Anchors = attrs.field(factory=Anchors, eq=False, repr=False)
    #: Path decisions already made under this rule, by (path, operation)
    #: (:func:`sandboxd.policy.paths.decide`).
    decisions: dict[tuple[str, str], Any] = attrs.field(
        factory=dict, eq=False, repr=False
    )

    def source(self, leaf: str) -> str | None:
        """The rule string behind a leaf key, if a layer set it."""
        return self.sources.get(leaf)
