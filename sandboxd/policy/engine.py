# -*- test-case-name: tests.policy.test_engine -*-
"""
Merging the five layers of SPEC §5.3 into one rule per endpoint.

Layers, lowest first: ``default`` → ``code`` → ``preset`` → ``policy`` →
``environment``.  For each leaf key the most specific selector wins (exact
id, then glob, then group, then defaults); at equal specificity the later
layer wins; within one layer and specificity any ``enabled: false`` wins.
The result is computed once per policy load, never per request.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from typing import Any

import attrs

from sandboxd.endpoints import (
    DEFAULT_ON,
    FORMER_IDS,
    CapabilityGroup,
    Endpoint,
    RouteTable,
)
from sandboxd.errors import Code
from sandboxd.policy import defaults as builtin
from sandboxd.policy.document import PolicyDocument, PolicyError, suggest
from sandboxd.policy.presets import PRESETS
from sandboxd.policy.rules import (
    SECTIONS,
    Anchors,
    EffectiveRule,
    Limits,
    Params,
    PathRule,
)

LAYERS = ("default", "code", "preset", "policy", "environment")
EXACT, GLOB, GROUP, DEFAULTS = 3, 2, 1, 0
NOT_IMPLEMENTED = "code:not-implemented"


@attrs.frozen
class Entry:
    """One selector's rule in one layer, flattened to leaf keys."""

    layer: int
    specificity: int
    selector: str
    leaves: Mapping[str, Any]
    rule: str
    order: int

    def applies_to(self, endpoint: Endpoint) -> bool:
        """Whether this selector selects ``endpoint``."""
        if self.specificity == DEFAULTS:
            return True
        if self.specificity == GROUP:
            return endpoint.group.value == self.selector
        if self.specificity == GLOB:
            # A pattern written for the old ids (``commands_*``) still
            # selects the endpoints those ids now go by.
            former = FORMER_IDS.get(endpoint.id)
            return fnmatch.fnmatchcase(endpoint.id, self.selector) or (
                former is not None and fnmatch.fnmatchcase(former, self.selector)
            )
        return endpoint.id == self.selector


def flatten(rule: Mapping[str, Any]) -> dict[str, Any]:
    """``{"limits": {"max_bytes": 5}}`` → ``{"limits.max_bytes": 5}``."""
    out: dict[str, Any] = {}
    for key, value in rule.items():
        if key in SECTIONS:
            for name, v in value.items():
                out[f"{key}.{name}"] = v
        else:
            out[key] = value
    return out


def _selector_kind(selector: str) -> tuple[int, str]:
    if selector.startswith("group:"):
        return GROUP, selector[6:]
    if any(c in selector for c in "*?["):
        return GLOB, selector
    return EXACT, selector


class _Builder:
    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def add(
        self, layer: str, selector: str, rule: Mapping[str, Any], origin: str
    ) -> None:
        kind, name = (
            (DEFAULTS, "@defaults")
            if selector == "@defaults"
            else _selector_kind(selector)
        )
        self.entries.append(
            Entry(
                LAYERS.index(layer),
                kind,
                name,
                flatten(rule),
                origin,
                len(self.entries),
            )
        )

    def add_document_like(
        self, layer: str, prefix: str, doc: Mapping[str, Any]
    ) -> None:
        """Add a policy- or preset-shaped mapping (groups, defaults, endpoints)."""
        for group, on in doc.get("groups", {}).items():
            origin = f"{prefix}:groups.{group}" if layer == "policy" else prefix
            self.add(layer, f"group:{group}", {"enabled": on}, origin)
        if doc.get("defaults"):
            origin = f"{prefix}:defaults" if layer == "policy" else prefix
            self.add(layer, "@defaults", doc["defaults"], origin)
        for selector, rule in doc.get("endpoints", {}).items():
            origin = f"{prefix}:endpoints.{selector}" if layer == "policy" else prefix
            self.add(layer, selector, rule, origin)


def enabled_groups_from_env(environ: Mapping[str, str]) -> list[str]:
    """Parse ``ABX_SERVER_ENABLED_GROUPS``; unknown names stop the daemon."""
    raw = environ.get("ABX_SERVER_ENABLED_GROUPS", "")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    valid = [g.value for g in CapabilityGroup]
    for name in names:
        if name not in valid:
            raise PolicyError(
                f"ABX_SERVER_ENABLED_GROUPS: unknown group {name!r}{suggest(name, valid)}"
            )
    return names


def collect_entries(
    table: RouteTable,
    doc: PolicyDocument,
    preset: str | None,
    environ: Mapping[str, str],
) -> list[Entry]:
    """Every layer's entries, in layer order."""
    b = _Builder()
    # Only the opt-in groups are a rule: a default-on endpoint is on because
    # nothing says otherwise, so ``defaults: {enabled: false}`` (the least
    # specific rule) switches it off, as on the seed.
    for group in CapabilityGroup:
        if group not in DEFAULT_ON:
            origin = f"default:opt-in:{group.value}"
            b.add("default", f"group:{group.value}", {"enabled": False}, origin)
    for group, (on, origin) in table.code_layer.items():
        b.add("code", f"group:{group.value}", {"enabled": on}, origin)
    if preset:
        b.add_document_like("preset", f"preset:{preset}", PRESETS[preset])
    b.add_document_like(
        "policy",
        "policy",
        {"groups": doc.groups, "defaults": doc.defaults, "endpoints": doc.endpoints},
    )
    for name in enabled_groups_from_env(environ):
        b.add(
            "environment",
            f"group:{name}",
            {"enabled": True},
            "env:ABX_SERVER_ENABLED_GROUPS",
        )
    return b.entries


#: Deny lists: every layer's entries add up (a preset's denials survive a
#: policy that denies more), as on the seed; other lists are replaced.
UNION_LEAVES = frozenset(
    {
        "paths.deny",
        "params.deny_extensions",
        "params.deny_commands",
        "params.deny_vars",
        "params.env_deny",
        "params.url_deny",
    }
)

#: Allow lists that mean no list at all when written empty, as the seed
#: reads them (``allow_commands: []`` lets every command through there).
#: Other lists (``shells``, ``languages``, ``allowed_signals``, ``users``)
#: allow nothing when empty, there as here.  ``check-config`` warns.
OPEN_WHEN_EMPTY = frozenset(
    {
        "params.allow_commands",
        "params.allow_extensions",
        "params.allow_vars",
        "params.url_allow",
    }
)


def _sort_key(entry: Entry) -> tuple[int, int, int, int]:
    # Between two globs of one layer the one with the longer literal head
    # (``files_up*`` over ``files_*``) is the more specific.
    head = len(entry.selector.split("*")[0]) if entry.specificity == GLOB else 0
    return (entry.specificity, entry.layer, head, entry.order)


def _selects(entry: Entry, endpoint: Endpoint, leaf: str) -> bool:
    """
    Whether ``entry`` may set ``leaf`` on ``endpoint``: a pattern or the
    defaults never switch a core endpoint off (``"*": {enabled: false}``
    means every endpoint but the core ones, as on the seed).
    """
    return not (
        leaf == "enabled"
        and endpoint.group is CapabilityGroup.CORE
        and entry.specificity in (GLOB, DEFAULTS)
    )


def merge_leaves(
    endpoint: Endpoint, entries: list[Entry]
) -> dict[str, tuple[Any, str]]:
    """Leaf key -> (value, rule string) for one endpoint, by SPEC §5.3."""
    chosen: dict[str, tuple[Any, str, tuple[int, int]]] = {}
    applicable = sorted(
        (e for e in entries if e.applies_to(endpoint)),
        key=_sort_key,
    )
    for entry in applicable:
        rank = (entry.specificity, entry.layer)
        for leaf, value in entry.leaves.items():
            if not _selects(entry, endpoint, leaf):
                continue
            current = chosen.get(leaf)
            if (
                leaf == "enabled"
                and current is not None
                and current[2] == rank
                and current[0] is False
            ):
                continue
            if leaf in UNION_LEAVES and current is not None:
                value = tuple(dict.fromkeys((*current[0], *value)))
            chosen[leaf] = (value, entry.rule, rank)
    return {leaf: (v, rule) for leaf, (v, rule, _) in chosen.items()}


#: The routes that write a file from a raw body as ``files_write_raw`` does
#: (a resumable upload: the client switches to it for big files).
RAW_WRITE_ALIKES = frozenset({"files_uploads_create", "files_uploads_append"})

#: ``limits`` a resumable route takes from ``files_write_raw`` (its rate and
#: concurrency are its own: one upload is many appends).
_INHERITED_LIMITS = frozenset({"limits.max_bytes"})


def inherit_raw_write(
    endpoint: Endpoint,
    entries: list[Entry],
    merged: dict[str, tuple[Any, str]],
) -> dict[str, tuple[Any, str]]:
    """
    A resumable upload route's rule with what the policy says about
    ``files_write_raw`` by name (enabled, scopes, paths, params,
    ``max_bytes``, audit) wherever the route's own name sets nothing: a
    policy that restricts raw writes restricts the uploads a client
    switches to for big files.
    """
    own = {
        leaf
        for e in entries
        if e.specificity == EXACT and e.selector == endpoint.id
        for leaf in e.leaves
    }
    raw = [
        e for e in entries if e.specificity == EXACT and e.selector == "files_write_raw"
    ]
    out = dict(merged)
    for entry in sorted(raw, key=lambda e: (e.layer, e.order)):
        for leaf, value in entry.leaves.items():
            if leaf in own:
                continue
            if leaf.startswith("limits.") and leaf not in _INHERITED_LIMITS:
                continue
            out[leaf] = (value, entry.rule)
    return out


def _section(
    cls: type[Any], base: Mapping[str, Any], leaves: Mapping[str, Any], name: str
) -> Any:
    values = dict(base)
    prefix = name + "."
    for leaf, value in leaves.items():
        if leaf.startswith(prefix):
            values[leaf[len(prefix) :]] = value
    return cls(**values)


def effective_rule(
    endpoint: Endpoint,
    entries: list[Entry],
    base_dir: str,
    upload_cap: int,
    daemon_files: tuple[str, ...] = (),
    anchors: Anchors | None = None,
) -> EffectiveRule:
    """Merge every layer into ``endpoint``'s rule, with built-in defaults below."""
    merged = merge_leaves(endpoint, entries)
    if endpoint.id in RAW_WRITE_ALIKES:
        merged = inherit_raw_write(endpoint, entries, merged)
    leaves: dict[str, Any] = {
        k: None if k in OPEN_WHEN_EMPTY and not v else v for k, (v, _) in merged.items()
    }
    sources = {k: rule for k, (_, rule) in merged.items()}
    base_limits = builtin.endpoint_limits(endpoint.id, endpoint.group.value)
    if (
        "max_bytes" in base_limits
        and base_limits["max_bytes"] == builtin.DEFAULT_UPLOAD_BYTES
    ):
        base_limits["max_bytes"] = upload_cap
    limits: Limits = _section(Limits, base_limits, leaves, "limits")
    if (
        endpoint.upload
        and "limits.max_request_bytes" not in leaves
        and limits.max_bytes
    ):
        cap = (
            limits.max_bytes
            if endpoint.body == "raw"
            else builtin.upload_request_cap(limits.max_bytes)
        )
        limits = attrs.evolve(limits, max_request_bytes=cap)
    enabled, enabled_by = merged.get(
        "enabled", (True, f"default:on:{endpoint.group.value}")
    )
    # The seed's word for it, which its SDK reports as the error code.
    reason = None if enabled else str(Code.ENDPOINT_DISABLED)
    if not endpoint.implemented:
        enabled, enabled_by, reason = False, NOT_IMPLEMENTED, "not_implemented"
    # A built-in route that answers without a credential (the liveness
    # probe, the console's static page) keeps the scopes the policy names,
    # shown as the seed shows them, but stays open whatever they are
    # (gate.needs_credential); lint warns about such a policy.
    scopes = tuple(leaves.get("scopes", endpoint.scopes))
    return EffectiveRule(
        endpoint_id=endpoint.id,
        enabled=bool(enabled),
        enabled_by=enabled_by,
        scopes=scopes,
        audit=leaves.get("audit", builtin.DEFAULT_AUDIT),
        limits=limits,
        paths=_section(PathRule, {}, leaves, "paths"),
        params=_section(Params, {}, leaves, "params"),
        base_dir=base_dir,
        sources=sources,
        reason=reason,
        daemon_files=daemon_files,
        anchors=anchors if anchors is not None else Anchors(),
    )


def resolve_base_dir(
    explicit: str | None, doc: PolicyDocument, environ: Mapping[str, str]
) -> str:
    """The path boundary: option, then policy, then environment, then default."""
    raw = (
        explicit
        or doc.base_dir
        or environ.get("ABX_SERVER_BASE_DIR")
        or builtin.DEFAULT_BASE_DIR
    )
    resolved = os.path.realpath(os.path.abspath(raw))
    if resolved == "/" or resolved.split("/")[1] in ("proc", "sys", "dev"):
        raise PolicyError(
            f"base_dir: {raw!r} cannot be the boundary (/, /proc, /sys, /dev)"
        )
    return resolved


def upload_cap_from_env(environ: Mapping[str, str]) -> int:
    """``ABX_MAX_UPLOAD_SIZE`` in bytes (default 100 MB)."""
    raw = environ.get("ABX_MAX_UPLOAD_SIZE")
    if not raw:
        return builtin.DEFAULT_UPLOAD_BYTES
    from sandboxd.policy.sizes import parse_size

    try:
        return parse_size(int(raw) if raw.isdigit() else raw)
    except ValueError as e:
        raise PolicyError(f"ABX_MAX_UPLOAD_SIZE: {e}") from None


def compile_rules(
    table: RouteTable,
    doc: PolicyDocument,
    preset: str | None,
    base_dir: str,
    environ: Mapping[str, str],
    daemon_files: tuple[str, ...] = (),
    anchors: Anchors | None = None,
) -> dict[str, EffectiveRule]:
    """Every endpoint's effective rule; refuses a policy that disables core."""
    entries = collect_entries(table, doc, preset, environ)
    cap = upload_cap_from_env(environ)
    rules: dict[str, EffectiveRule] = {}
    shared = anchors if anchors is not None else Anchors()
    for endpoint in table:
        rule = effective_rule(endpoint, entries, base_dir, cap, daemon_files, shared)
        if (
            endpoint.group is CapabilityGroup.CORE
            and not rule.enabled
            and rule.reason != "not_implemented"
        ):
            raise PolicyError(
                f"{rule.enabled_by}: disables the core endpoint {endpoint.id!r}, "
                "which cannot be turned off"
            )
        rules[endpoint.id] = rule
    return rules
