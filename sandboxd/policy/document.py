# -*- test-case-name: tests.policy.test_engine -*-
"""
Reading and validating a policy document (SPEC §5.2).

A document is checked whole before anything uses it: an unknown key,
endpoint id, group, preset or scope is an error that names its place in the
document and suggests the nearest valid name.  The result is plain,
normalised data (sizes in bytes, lists as tuples) for the merger.
"""

from __future__ import annotations

import fnmatch
import functools
import ipaddress
import json
import math
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from sandboxd.endpoints import (
    RENAMED_IDS,
    CapabilityGroup,
    RouteTable,
    renamed_warning,
)
from sandboxd.policy.cgroup_limits import CgroupLimits, cgroup_limits_from
from sandboxd.policy.commandrules import pattern_words
from sandboxd.policy.priorities import Priorities, priorities_from
from sandboxd.policy.rules import AUDIT_MODES, RULE_KEYS, section_fields
from sandboxd.policy.sizes import parse_size

TOP_KEYS = (
    "version",
    "description",
    "preset",
    "base_dir",
    "groups",
    "defaults",
    "endpoints",
    "auth",
    "revision",
    "agents",
    "git",
    "allowed_origins",
    "allowed_hosts",
    "pty_public_url",
    "trusted_proxies",
    "preview_domain",
    "preview_public_url",
    "priority",
    "cgroups",
)
PRESETS = ("default", "transfer-only", "read-only", "hardened", "locked")
TOKEN_KEYS = ("id", "token_env", "token_sha256", "token_file", "scopes")
AUTH_KEYS = ("tokens", "allow_anonymous", "anonymous_scopes", "link_key_file")
#: The one version of the document format (the seed's ``version: 1``).
POLICY_VERSION = 1
#: Scope namespaces the built-in table uses: a scope in one of them must
#: name a real scope (a typo is refused); a scope in any other namespace
#: (``myapp:deploy``) is a template's own, needed by its custom routes.
BUILTIN_NAMESPACES = (
    "core",
    "commands",
    "files",
    "process",
    "terminal",
    "system",
    "devtools",
    "browser",
    "agents",
    "code",
    "git",
    "lsp",
    "preview",
    "links",
)
#: What a scope may look like: ``*``, a bare word, or ``namespace:name``
#: (``name`` may be ``*`` or hold further colons).
_SCOPE_GRAMMAR = re.compile(
    r"\*|[a-z][a-z0-9_.\-]*|[a-z][a-z0-9_]*:(?:\*|[a-z][a-z0-9_.:\-]*)"
)
#: The seed's spellings of ``paths.symlinks`` and what each means here.
SYMLINK_SPELLINGS = {"within": "follow", "never": "deny"}
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


class PolicyError(ValueError):
    """A policy document that cannot be used; the message says where and why."""


def suggest(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the nearest choice, or nothing."""
    # Imported here: only a policy that is being refused needs it.
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _unknown(where: str, what: str, name: str, choices: Iterable[str]) -> PolicyError:
    return PolicyError(f"{where}: unknown {what} {name!r}{suggest(name, choices)}")


@attrs.frozen
class TokenSpec:
    """One policy token identity (the secret itself is resolved by auth)."""

    id: str
    scopes: tuple[str, ...]
    token_env: str | None = None
    token_sha256: str | None = None
    token_file: str | None = None


GIT_KEYS = ("credentials", "author", "ca_file")
CREDENTIAL_KEYS = ("token_file", "token_env", "username", "url_prefix")


@attrs.frozen
class GitCredential:
    """
    A secret the policy holds for git (SPEC §24): where to read it, the
    user name to give with it, and the remote URLs it may be sent to.
    """

    name: str
    url_prefix: str
    username: str = "x-access-token"
    token_file: str | None = None
    token_env: str | None = None


@attrs.frozen
class GitSettings:
    """The policy's top-level ``git`` key."""

    credentials: Mapping[str, GitCredential] = attrs.field(factory=dict)
    author: Mapping[str, str] | None = None
    ca_file: str | None = None


@attrs.frozen
class PolicyDocument:
    """A validated policy; ``rules`` maps selectors to normalised rules."""

    preset: str | None = None
    base_dir: str | None = None
    groups: Mapping[str, bool] = attrs.field(factory=dict)
    defaults: Mapping[str, Any] = attrs.field(factory=dict)
    endpoints: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    tokens: tuple[TokenSpec, ...] = ()
    #: With tokens configured, whether a request with no credentials is let
    #: in as ``anonymous`` (the seed's ``auth.allow_anonymous``).
    allow_anonymous: bool = False
    #: The scopes ``anonymous`` holds (default ``*``); with no tokens they
    #: bound local mode itself.
    anonymous_scopes: tuple[str, ...] | None = None
    revision: str | None = None
    #: Free text describing the policy (the seed's ``description``).
    description: str | None = None
    agents: Mapping[str, Any] = attrs.field(factory=dict)
    git: GitSettings = attrs.field(factory=lambda: GitSettings())
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    #: The base of the ``ws_url`` that ``pty_create_session`` answers (SPEC §20).
    pty_public_url: str | None = None
    #: Addresses and networks whose X-Forwarded-Proto/-Host are believed.
    trusted_proxies: tuple[str, ...] = ()
    #: ``auth.link_key_file``: the key links are signed with (else random
    #: per start, and links die with the daemon).
    link_key_file: str | None = None
    #: The preview door's host names: ``{port}.DOMAIN``, ``{port}-LABEL.DOMAIN``.
    preview_domain: str = "localhost"
    #: Where browsers reach the preview door behind an ingress.
    preview_public_url: str | None = None
    #: The daemon's CPU, I/O and memory priority over its children's.
    priority: Priorities = attrs.field(factory=Priorities)
    #: The daemon's and its children's cgroups, where one is delegated.
    cgroups: CgroupLimits = attrs.field(factory=CgroupLimits)
    source: str = "none"
    warnings: tuple[str, ...] = ()


def valid_scope(scope: str, known: Iterable[str]) -> bool:
    """
    Whether a scope can be used in a policy.

    Built-in namespaces are closed (``files:reed`` is a typo), except the
    open-ended ``commands:run:NAME`` and a namespace wildcard ``files:*``;
    any other well-formed scope (``myapp:deploy``, ``admin``) belongs to a
    template's custom routes, as on the seed.
    """
    if scope in known or (scope.startswith("commands:run:") and len(scope) > 13):
        return True
    if not _SCOPE_GRAMMAR.fullmatch(scope):
        return False
    namespace, colon, name = scope.partition(":")
    if colon and name == "*":
        return True
    return namespace not in BUILTIN_NAMESPACES


def _shown(value: Any) -> str:
    """A number as an error shows it (a huge integer not digit by digit)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return "an integer too large to be a number of seconds"
    return repr(value)


def _one_edit(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` differ by one letter added, dropped, changed or swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    if len(a) < len(b):
        return a[i:] == b[i + 1 :]
    return a[i + 1 :] == b[i + 1 :] or (
        a[i + 2 :] == b[i + 2 :] and a[i : i + 2] == b[i : i + 2][::-1]
    )


def near_miss_scopes(
    places: Iterable[tuple[str, Iterable[str]]], known: Iterable[str]
) -> list[str]:
    """
    Warnings for scopes in a namespace one letter away from a built-in one
    (``file:read``, ``proces:run``).  Such a scope is valid, as any
    template's own namespace is, but no token holding the built-in scope
    meets it, so the endpoint silently becomes callable by ``*`` alone.
    """
    known = sorted(known)
    out = []
    for where, scopes in places:
        for scope in scopes:
            namespace, colon, name = scope.partition(":")
            if not colon or scope in known or namespace in BUILTIN_NAMESPACES:
                continue
            for builtin in BUILTIN_NAMESPACES:
                if _one_edit(namespace, builtin):
                    meant = f"{builtin}:{name}"
                    hint = (
                        f"; did you mean {meant!r}?"
                        if meant in known or name == "*"
                        else suggest(meant, known)
                    )
                    out.append(
                        f"{where}: the scope {scope!r} is not built in (its "
                        f"namespace {namespace!r} is none of sandboxd's){hint}"
                    )
                    break
    return out


def _coerce(where: str, type_text: str, value: Any) -> Any:
    """Check one section value against its declared type, normalising it."""
    optional = type_text.endswith("| None")
    base = type_text.removesuffix(" | None").strip()
    if value is None:
        if optional:
            return None
        raise PolicyError(f"{where}: must not be null")
    name = where.rsplit(".", 1)[-1]
    if base == "int" and name.endswith("_bytes"):
        try:
            return parse_size(value)
        except ValueError as e:
            raise PolicyError(f"{where}: {e}") from None
    if base == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PolicyError(
                f"{where}: expected a non-negative integer, got {value!r}"
            )
        return value
    if base == "float":
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise PolicyError(f"{where}: expected a non-negative number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        # NaN passes ``value < 0`` and ``min()`` keeps whichever side it is
        # on, so an unchecked NaN or infinity would reach a timer (which
        # refuses it after the child started) and discovery (whose JSON
        # cannot carry it).
        if not math.isfinite(number):
            raise PolicyError(f"{where}: expected a finite number, got {_shown(value)}")
        return number
    if base == "bool":
        if not isinstance(value, bool):
            raise PolicyError(f"{where}: expected true or false, got {value!r}")
        return value
    if base == "str":
        if not isinstance(value, str):
            raise PolicyError(f"{where}: expected a string, got {value!r}")
        return value
    if base.startswith("tuple["):
        item = int if "int" in base else str
        if not isinstance(value, list | tuple) or not all(
            isinstance(v, item) and not isinstance(v, bool) for v in value
        ):
            raise PolicyError(f"{where}: expected a list of {item.__name__}s")
        return tuple(value)
    if base.startswith("dict["):
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise PolicyError(f"{where}: expected an object of strings")
        return dict(value)
    raise PolicyError(f"{where}: cannot check type {type_text}")  # pragma: no cover


_CHOICES = {
    "paths.symlinks": ("follow", "deny"),
    "paths.hard_links": ("follow", "deny_writes"),
    "params.permission_timeout_action": ("deny", "cancel_turn"),
    "params.mcp_servers": ("none", "http", "all"),
    "params.client_fs": ("none", "read", "read_write"),
    "params.host_header": ("upstream", "preserve"),
    "params.mcp_tools": ("default", "all"),
    "params.confine_signals": ("own", "any"),
}


#: Lists read in the seed's command pattern language.
_COMMAND_LISTS = frozenset({"params.allow_commands", "params.deny_commands"})


def validate_rule(where: str, rule: Any, known_scopes: Iterable[str]) -> dict[str, Any]:
    """Check one rule object and return it normalised."""
    if not isinstance(rule, dict):
        raise PolicyError(f"{where}: a rule must be an object")
    out: dict[str, Any] = {}
    for key, value in rule.items():
        place = f"{where}.{key}"
        if key not in RULE_KEYS:
            raise _unknown(where, "rule key", key, RULE_KEYS)
        if key == "enabled":
            out[key] = _coerce(place, "bool", value)
        elif key == "audit":
            if value not in AUDIT_MODES:
                raise PolicyError(f"{place}: expected one of {', '.join(AUDIT_MODES)}")
            out[key] = value
        elif key == "scopes":
            out[key] = _scope_list(place, value, known_scopes)
        else:
            if not isinstance(value, dict):
                raise PolicyError(f"{place}: must be an object")
            fields = section_fields(key)
            section: dict[str, Any] = {}
            for name, v in value.items():
                if name not in fields:
                    raise _unknown(place, f"{key} key", name, fields)
                if key == "paths":
                    v = seed_path_value(name, v)
                typed = _coerce(f"{place}.{name}", str(fields[name].type), v)
                choices = _CHOICES.get(f"{key}.{name}")
                if choices and typed not in choices:
                    raise PolicyError(
                        f"{place}.{name}: expected one of {', '.join(choices)}"
                    )
                if f"{key}.{name}" in _COMMAND_LISTS and typed is not None:
                    for pattern in typed:
                        try:
                            pattern_words(pattern)
                        except ValueError as e:
                            raise PolicyError(f"{place}.{name}: {e}") from None
                section[name] = typed
            out[key] = section
    return out


def seed_path_value(name: str, value: Any) -> Any:
    """
    A ``paths`` value in the seed's spelling, as this engine reads it.

    ``read_only: true`` makes every path read-only (``["/"]``), ``false``
    none; ``symlinks: within`` is ``follow`` (a link is followed only while
    its target stays inside the boundary) and ``never`` is ``deny``.  Other
    values pass unchanged.
    """
    if name == "read_only" and isinstance(value, bool):
        return ["/"] if value else []
    if name == "symlinks" and isinstance(value, str):
        return SYMLINK_SPELLINGS.get(value, value)
    return value


def _check_selector(where: str, selector: str, table: RouteTable) -> str | None:
    """Validate an ``endpoints`` key; return a warning when a glob matches nothing."""
    groups = [g.value for g in CapabilityGroup]
    if selector == "@defaults":
        # The seed's spelling of ``defaults`` inside ``endpoints``.
        return None
    if selector.startswith("group:"):
        name = selector[6:]
        if name not in groups:
            raise _unknown(where, "group", name, groups)
        return None
    if any(c in selector for c in "*?["):
        if fnmatch.filter(table.ids(), selector):
            return None
        former = [
            RENAMED_IDS[old]
            for old in fnmatch.filter(RENAMED_IDS, selector)
            if RENAMED_IDS[old] in table
        ]
        if former:
            return (
                f"{where}: the pattern {selector!r} matches only old endpoint "
                f"ids; it now selects {', '.join(map(repr, former))}: name those"
            )
        return f"{where}: the pattern {selector!r} matches no endpoint"
    if selector not in table:
        hint = suggest(selector, table.ids()) or (
            # No built-in id is near it: most likely a custom route whose
            # --commands file this start (or check-config) was not given.
            "; a custom route's id is known only when the file that registers"
            " it is loaded (--commands FILE)"
        )
        raise PolicyError(f"{where}: unknown endpoint {selector!r}{hint}")
    return None


def _scope_list(where: str, value: Any, known_scopes: Iterable[str]) -> tuple[str, ...]:
    scopes: tuple[str, ...] = _coerce(where, "tuple[str, ...]", value)
    known = list(known_scopes)
    for scope in scopes:
        if not valid_scope(scope, known):
            raise _unknown(where, "scope", scope, known)
    return scopes


def _anonymous(
    value: Any, known_scopes: Iterable[str]
) -> tuple[bool, tuple[str, ...] | None]:
    """``auth.allow_anonymous`` and ``auth.anonymous_scopes``, checked."""
    if not isinstance(value, dict):
        raise PolicyError("auth: must be an object")
    allow = _coerce("auth.allow_anonymous", "bool", value.get("allow_anonymous", False))
    scopes = None
    if "anonymous_scopes" in value:
        scopes = _scope_list(
            "auth.anonymous_scopes", value["anonymous_scopes"], known_scopes
        )
    return allow, scopes


def _git_settings(value: Any) -> GitSettings:
    """Check the ``git`` key: named credentials, the default author, a CA file."""
    if not isinstance(value, dict):
        raise PolicyError("git: must be an object")
    for key in value:
        if key not in GIT_KEYS:
            raise _unknown("git", "key", key, GIT_KEYS)
    raw = value.get("credentials", {})
    if not isinstance(raw, dict):
        raise PolicyError("git.credentials: must be an object of name: credential")
    credentials: dict[str, GitCredential] = {}
    for name, entry in raw.items():
        where = f"git.credentials.{name}"
        if not isinstance(entry, dict):
            raise PolicyError(f"{where}: must be an object")
        for key in entry:
            if key not in CREDENTIAL_KEYS:
                raise _unknown(where, "key", key, CREDENTIAL_KEYS)
        fields = {k: _coerce(f"{where}.{k}", "str", v) for k, v in entry.items()}
        if len([k for k in ("token_file", "token_env") if k in fields]) != 1:
            raise PolicyError(f"{where}: give exactly one of token_file, token_env")
        prefix = fields.get("url_prefix", "")
        if not prefix.startswith(("https://", "ssh://")) or prefix.count("/") < 3:
            raise PolicyError(
                f"{where}.url_prefix: an https:// URL prefix with a host and a"
                " path (https://github.com/myorg/) is required"
            )
        credentials[name] = GitCredential(name=name, **fields)
    author = value.get("author")
    if author is not None:
        author = _coerce("git.author", "dict[str, str]", author)
        for key in author:
            if key not in ("name", "email"):
                raise _unknown("git.author", "key", key, ["name", "email"])
    ca_file = value.get("ca_file")
    if ca_file is not None:
        ca_file = _coerce("git.ca_file", "str", ca_file)
    return GitSettings(credentials=credentials, author=author, ca_file=ca_file)


def _tokens(value: Any, known_scopes: Iterable[str]) -> tuple[TokenSpec, ...]:
    if not isinstance(value, dict):
        raise PolicyError("auth: must be an object")
    for key in value:
        if key not in AUTH_KEYS:
            raise _unknown("auth", "key", key, AUTH_KEYS)
    raw = value.get("tokens", [])
    if not isinstance(raw, list):
        raise PolicyError("auth.tokens: must be a list")
    out: list[TokenSpec] = []
    seen: set[str] = set()
    #: (source key, value) -> the id of the entry that gave it first.
    sources_seen: dict[tuple[str, str], str] = {}
    for i, entry in enumerate(raw):
        where = f"auth.tokens[{i}]"
        if not isinstance(entry, dict):
            raise PolicyError(f"{where}: must be an object")
        for key in entry:
            if key not in TOKEN_KEYS:
                raise _unknown(where, "key", key, TOKEN_KEYS)
        ident = entry.get("id")
        if not isinstance(ident, str) or not ident:
            raise PolicyError(f"{where}.id: a non-empty string is required")
        if ident in seen or ident in ("anonymous", "legacy"):
            raise PolicyError(f"{where}.id: {ident!r} is already taken")
        seen.add(ident)
        sources = [k for k in ("token_env", "token_sha256", "token_file") if k in entry]
        if len(sources) != 1:
            raise PolicyError(
                f"{where}: give exactly one of token_env, token_sha256, token_file"
            )
        for k in sources:
            _coerce(f"{where}.{k}", "str", entry[k])
        sha = entry.get("token_sha256")
        if sha is not None and not _SHA256.match(sha):
            raise PolicyError(f"{where}.token_sha256: expected 64 hex digits")
        source = (sources[0], sha.lower() if sha else entry[sources[0]])
        if source in sources_seen:
            raise same_token(f"{where}.{sources[0]}", sources_seen[source], ident)
        sources_seen[source] = ident
        scopes = _scope_list(f"{where}.scopes", entry.get("scopes", []), known_scopes)
        out.append(
            TokenSpec(
                id=ident,
                scopes=scopes,
                token_env=entry.get("token_env"),
                token_sha256=sha.lower() if sha else None,
                token_file=entry.get("token_file"),
            )
        )
    return tuple(out)


def same_token(where: str, first: str, second: str) -> PolicyError:
    """
    The error for two token entries with one secret: the token would log
    in as whichever entry comes first, so the other identity (its scopes,
    its audit name) could never be used and a reordering would change who
    the token is.
    """
    return PolicyError(
        f"{where}: the tokens {first!r} and {second!r} are the same secret; "
        "a token logs in as one identity, so give each entry its own token"
    )


def _string_list(where: str, value: Any) -> tuple[str, ...]:
    result: tuple[str, ...] = _coerce(where, "tuple[str, ...]", value)
    return result


def check_public_url(where: str, value: Any) -> str:
    """
    A ``ws://`` or ``wss://`` URL with a host and no query or fragment.

    :raises PolicyError: naming ``where``.
    """
    if not isinstance(value, str):
        raise PolicyError(f"{where}: expected a ws:// or wss:// URL")
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise PolicyError(
            f"{where}: expected a ws:// or wss:// URL with a host, got {value!r}"
        )
    if parts.query or parts.fragment:
        raise PolicyError(f"{where}: the URL must not have a query or fragment")
    try:
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError:
        raise PolicyError(f"{where}: bad port in {value!r}") from None
    return value.rstrip("/")


def _link_key_file(auth: Mapping[str, Any]) -> str | None:
    value = auth.get("link_key_file")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise PolicyError("auth.link_key_file: expected a file path")
    return value


_DOMAIN = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$"
)


def _preview_domain(value: Any) -> str:
    if not isinstance(value, str) or not _DOMAIN.match(value.lower()):
        raise PolicyError(f"preview_domain: expected a DNS name, got {value!r}")
    return value.lower()


def check_preview_url(value: Any, where: str = "preview_public_url") -> str:
    """
    An ``http(s)://`` URL where browsers reach the preview door: with
    ``{port}`` in its host (``https://{port}-sbx42.example.com``) for host
    routing, else the base of the path mode (``https://sbx42.example.com``).

    :raises PolicyError: naming ``where``.
    """
    if not isinstance(value, str):
        raise PolicyError(f"{where}: expected an http:// or https:// URL")
    parts = urllib.parse.urlsplit(value.replace("{port}", "0"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PolicyError(
            f"{where}: expected an http:// or https:// URL with a host, got {value!r}"
        )
    if parts.query or parts.fragment or parts.path.strip("/"):
        raise PolicyError(f"{where}: the URL must have no path, query or fragment")
    if value.count("{port}") > 1 or "{port}" in parts.path:
        raise PolicyError(f"{where}: {{port}} may appear once, in the host")
    return value.rstrip("/")


def _networks(where: str, value: Any) -> tuple[str, ...]:
    items = _string_list(where, value)
    for item in items:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise PolicyError(
                f"{where}: {item!r} is not an address or a network (CIDR)"
            ) from None
    return items


def validate(doc: Any, table: RouteTable, source: str = "inline") -> PolicyDocument:
    """
    Check a whole document against the route table.

    :raises PolicyError: naming the first problem's place in the document.
    """
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise PolicyError("policy: the document must be an object")
    known_scopes = sorted({s for e in table for s in e.scopes} | {"*"})
    warnings: list[str] = []
    for key in doc:
        if key not in TOP_KEYS:
            raise _unknown("policy", "key", key, TOP_KEYS)
    version = doc.get("version", POLICY_VERSION)
    if isinstance(version, bool) or version != POLICY_VERSION:
        raise PolicyError(
            f"version: {version!r} is not a version this daemon reads "
            f"(it reads {POLICY_VERSION})"
        )
    description = doc.get("description")
    if description is not None and not isinstance(description, str):
        raise PolicyError("description: expected a string")
    preset = doc.get("preset")
    if preset is not None and preset not in PRESETS:
        raise _unknown("preset", "preset", str(preset), PRESETS)
    base_dir = doc.get("base_dir")
    if base_dir is not None and (not isinstance(base_dir, str) or not base_dir):
        raise PolicyError("base_dir: expected a non-empty path")
    groups_raw = doc.get("groups", {})
    if isinstance(groups_raw, list):
        # The seed's short form: the groups listed are turned on.
        if not all(isinstance(name, str) for name in groups_raw):
            raise PolicyError("groups: a list must hold group names")
        groups_raw = dict.fromkeys(groups_raw, True)
    if not isinstance(groups_raw, dict):
        raise PolicyError(
            "groups: must be an object of group: true|false, or a list of groups to turn on"
        )
    group_names = [g.value for g in CapabilityGroup]
    groups: dict[str, bool] = {}
    for name, on in groups_raw.items():
        if name not in group_names:
            raise _unknown("groups", "group", name, group_names)
        groups[name] = _coerce(f"groups.{name}", "bool", on)
    defaults = validate_rule("defaults", doc.get("defaults", {}), known_scopes)
    endpoints_raw = doc.get("endpoints", {})
    if not isinstance(endpoints_raw, dict):
        raise PolicyError("endpoints: must be an object of selector: rule")
    endpoints: dict[str, dict[str, Any]] = {}
    for selector, rule in endpoints_raw.items():
        where = f"endpoints.{selector}"
        if selector in RENAMED_IDS and selector not in table:
            warnings.append(renamed_warning(where, selector))
            selector = RENAMED_IDS[selector]
            if selector in endpoints_raw:
                raise PolicyError(
                    f"{where}: names the same endpoint as endpoints.{selector}; "
                    f"keep only {selector!r}"
                )
        warning = _check_selector(where, selector, table)
        if warning:
            warnings.append(warning)
        endpoints[selector] = validate_rule(where, rule, known_scopes)
    tokens = _tokens(doc.get("auth", {}), known_scopes)
    allow_anonymous, anonymous_scopes = _anonymous(doc.get("auth", {}), known_scopes)
    revision = doc.get("revision")
    if (revision is not None and not isinstance(revision, str | int | float)) or (
        isinstance(revision, float) and not math.isfinite(revision)
    ):
        raise PolicyError("revision: expected a string")
    agents = doc.get("agents", {})
    if not isinstance(agents, dict):
        raise PolicyError("agents: must be an object")
    for key in agents:
        if key != "catalog":
            raise _unknown("agents", "key", key, ["catalog"])
    git = _git_settings(doc.get("git", {}))
    scope_places: list[tuple[str, Iterable[str]]] = [
        ("defaults.scopes", defaults.get("scopes", ())),
        *((f"endpoints.{k}.scopes", r.get("scopes", ())) for k, r in endpoints.items()),
        *((f"auth.tokens[{i}].scopes", t.scopes) for i, t in enumerate(tokens)),
        ("auth.anonymous_scopes", anonymous_scopes or ()),
    ]
    warnings += near_miss_scopes(scope_places, known_scopes)
    warnings += duplicate_keys(doc)
    return PolicyDocument(
        preset=preset,
        base_dir=base_dir,
        groups=groups,
        defaults=defaults,
        endpoints=endpoints,
        tokens=tokens,
        allow_anonymous=allow_anonymous,
        anonymous_scopes=anonymous_scopes,
        revision=str(revision) if revision is not None else None,
        description=description,
        agents=agents,
        git=git,
        allowed_origins=_string_list("allowed_origins", doc.get("allowed_origins", [])),
        allowed_hosts=_string_list("allowed_hosts", doc.get("allowed_hosts", [])),
        pty_public_url=check_public_url("pty_public_url", doc["pty_public_url"])
        if doc.get("pty_public_url") is not None
        else None,
        trusted_proxies=_networks("trusted_proxies", doc.get("trusted_proxies", [])),
        link_key_file=_link_key_file(doc.get("auth", {})),
        preview_domain=_preview_domain(doc.get("preview_domain", "localhost")),
        preview_public_url=check_preview_url(doc["preview_public_url"])
        if doc.get("preview_public_url") is not None
        else None,
        priority=_priority(doc.get("priority", True)),
        cgroups=_cgroups(doc.get("cgroups", True)),
        source=source,
        warnings=tuple(warnings),
    )


def _priority(value: Any) -> Priorities:
    try:
        return priorities_from(value)
    except ValueError as e:
        raise PolicyError(str(e)) from None


def _cgroups(value: Any) -> CgroupLimits:
    try:
        return cgroup_limits_from(value)
    except ValueError as e:
        raise PolicyError(str(e)) from None


class _Repeated(dict[str, Any]):
    """A JSON object some of whose keys were written more than once."""

    repeated: tuple[str, ...] = ()


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """
    A JSON object as ``json`` builds it (the last of a repeated key wins),
    remembering which keys were repeated: a selector written twice is
    almost always an edit that meant to change the first one.
    """
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    marked = _Repeated(out)
    seen: set[str] = set()
    repeated: dict[str, None] = {}
    for key, _ in pairs:
        if key in seen:
            repeated[key] = None
        seen.add(key)
    marked.repeated = tuple(repeated)
    return marked


def duplicate_keys(doc: Any, where: str = "policy") -> list[str]:
    """Warnings for every key written twice in one object of the document."""
    out = []
    if isinstance(doc, _Repeated):
        out += [
            f"{where}: the key {key!r} is written more than once; only the last counts"
            for key in doc.repeated
        ]
    if isinstance(doc, dict):
        for key, value in doc.items():
            place = key if where == "policy" else f"{where}.{key}"
            out += duplicate_keys(value, place)
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += duplicate_keys(value, f"{where}[{i}]")
    return out


@functools.cache
def _yaml_loader() -> type[Any]:
    """
    PyYAML's safe loader, its mappings built as JSON's objects are
    (:func:`_object`): a key written twice is remembered, not silently the
    last.  Made on the first YAML policy: ``yaml`` is not imported before.
    """
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader: Any, node: Any) -> dict[Any, Any]:
        loader.flatten_mapping(node)
        return _object(
            [
                (
                    loader.construct_object(key, deep=True),
                    loader.construct_object(value, deep=True),
                )
                for key, value in node.value
            ]
        )

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return Loader


def parse_text(text: str, name: str) -> Any:
    """
    Parse a policy file's text: JSON, or YAML for ``.yaml``/``.yml``.

    A YAML template's ``server:`` block is the policy (SPEC §5.2).  Text
    that holds no document (empty, only a comment, ``null``) is refused: it
    is a failed render or a rewrite caught half-way far more often than a
    wish for every default, and a reload would drop every token and rule.
    """
    data = _parse(text, name)
    if data is None:
        raise PolicyError(
            f"{name}: holds no policy (empty, a comment or null); "
            "write {} for the one with every default"
        )
    return data


def _parse(text: str, name: str) -> Any:
    if name.endswith((".yaml", ".yml")):
        import yaml

        try:
            data = yaml.load(text, Loader=_yaml_loader())
        except yaml.YAMLError as e:
            raise PolicyError(f"{name}: not valid YAML: {e}") from None
        if (
            isinstance(data, dict)
            and "server" in data
            and isinstance(data["server"], dict)
        ):
            return data["server"]
        return data
    try:
        return json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as e:
        raise PolicyError(f"{name}: not valid JSON: {e}") from None


def read_file(path: str) -> Any:
    """Load a policy file (JSON or YAML) as data."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise PolicyError(f"{path}: cannot read the policy: {e.strerror}") from None
    return parse_text(text, path)


SYSTEM_POLICY_FILE = "/etc/agent-sandbox/server-policy.json"


def find_policy(
    explicit: Any = None,
    path: str | None = None,
    environ: Mapping[str, str] | None = None,
    system_file: str = SYSTEM_POLICY_FILE,
) -> tuple[Any, str, str | None]:
    """
    Locate the policy by SPEC §5.1's order; first found wins.

    :return: ``(data, source description, file path or None)``.
    """
    env = os.environ if environ is None else environ
    if explicit is not None:
        return explicit, "argument", None
    if path:
        return read_file(path), path, path
    inline = env.get("ABX_SERVER_POLICY")
    if inline:
        return parse_text(inline, "ABX_SERVER_POLICY"), "ABX_SERVER_POLICY", None
    env_file = env.get("ABX_SERVER_POLICY_FILE")
    if env_file:
        return read_file(env_file), env_file, env_file
    if os.path.exists(system_file):
        return read_file(system_file), system_file, system_file
    return {}, "none", None
