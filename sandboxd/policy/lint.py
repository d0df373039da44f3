# -*- test-case-name: tests.policy.test_seed_forms -*-
"""
Warnings a valid policy still earns (``check-config`` prints them; the
daemon logs them at start).

Each names something that works but may not do what its author meant:
a custom route anyone who can authenticate may call, an anonymous caller
holding every scope, a token whose scopes were enough for an endpoint
before that endpoint took the seed's own scope.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sandboxd.endpoints import CapabilityGroup, RouteTable
from sandboxd.policy import confinement
from sandboxd.policy.document import PolicyDocument, suggest, valid_scope
from sandboxd.policy.engine import OPEN_WHEN_EMPTY
from sandboxd.policy.rules import EffectiveRule

#: scope a token may hold -> (the scope some endpoints now need instead,
#: those endpoints): reading took a scope of its own, as on the seed.
NARROWED = {
    "process:manage": ("process:read", "process_list, the process detail and output"),
    "commands:run": ("commands:list", "the command list"),
    "devtools:run": ("devtools:read", "git_status and git_diff"),
    "browser:use": ("browser:evaluate", "browser_evaluate"),
}


def _holds(scopes: Iterable[str], scope: str) -> bool:
    held = set(scopes)
    namespace = scope.partition(":")[0]
    if scope == "commands:run" and any(s.startswith("commands:run:") for s in held):
        return True  # one command's scope: listing changed for it too
    return "*" in held or scope in held or f"{namespace}:*" in held


def open_custom_routes(
    table: RouteTable, rules: Mapping[str, EffectiveRule]
) -> list[str]:
    """A custom route that needs no scope: authentication is all it asks."""
    out = []
    for endpoint in table:
        rule = rules.get(endpoint.id)
        if endpoint.custom and rule is not None and rule.enabled and not rule.scopes:
            who = (
                "any caller that can authenticate"
                if endpoint.auth_required
                else "anyone who can reach the port"
            )
            out.append(
                f"custom route {endpoint.id!r} requires no scope: {who} may call it "
                "(give the route scopes=, or the policy endpoints."
                f"{endpoint.id!r}.scopes)"
            )
    return out


def ignored_scopes(table: RouteTable, rules: Mapping[str, EffectiveRule]) -> list[str]:
    """
    A built-in route that answers without a credential (``health``, the
    console's static page) for which the policy names scopes: they are not
    applied (a liveness probe has no token), and saying so beats letting
    the policy's author believe the route is locked.
    """
    out = []
    for endpoint in table:
        rule = rules.get(endpoint.id)
        if endpoint.auth_required or endpoint.custom or rule is None:
            continue
        origin = rule.source("scopes")
        if origin is not None and origin.endswith(f"endpoints.{endpoint.id}"):
            out.append(
                f"{origin}.scopes: not applied: {endpoint.id!r} answers every "
                "caller without a credential"
            )
    return out


def narrowed_tokens(doc: PolicyDocument) -> list[str]:
    """A token that holds the old scope of an endpoint but not its new one."""
    out = []
    for token in doc.tokens:
        for old, (new, what) in NARROWED.items():
            if _holds(token.scopes, old) and not _holds(token.scopes, new):
                out.append(
                    f"auth.tokens {token.id!r} holds {old!r} but not {new!r}: "
                    f"{what} now need {new!r}, as on the seed"
                )
    return out


def anonymous_everything(doc: PolicyDocument) -> list[str]:
    """``allow_anonymous`` with no ``anonymous_scopes``: every scope to everyone."""
    if doc.tokens and doc.allow_anonymous and doc.anonymous_scopes is None:
        return [
            "auth.allow_anonymous without auth.anonymous_scopes: a caller with no "
            "token holds every scope ('*'), as on the seed"
        ]
    return []


#: The params that say which URLs the browser may load.
BROWSER_URL_PARAMS = ("url_allow", "url_deny", "url_schemes", "block_private_networks")


def browser_url_rules(
    table: RouteTable, rules: Mapping[str, EffectiveRule]
) -> list[str]:
    """
    Browser endpoints with URL rules of their own: the browser has one page,
    and every request it makes meets the strictest of them, whichever
    endpoint was called.  Written on one endpoint (``browser_navigate``),
    such a rule reads as if it held for that endpoint alone.
    """
    ids = [
        e.id
        for e in table
        if e.group is CapabilityGroup.BROWSER and not e.custom and e.id in rules
    ]
    differing = [
        key
        for key in BROWSER_URL_PARAMS
        if len({getattr(rules[i].params, key) for i in ids}) > 1
    ]
    if not differing:
        return []
    variants: dict[tuple[object, ...], list[str]] = {}
    for i in ids:
        shape = tuple(getattr(rules[i].params, key) for key in differing)
        variants.setdefault(shape, []).append(i)
    sets = "; ".join(", ".join(v) for v in variants.values())
    return [
        f"params {', '.join(differing)} differ between browser endpoints ({sets}): "
        "the browser has one page, so every request it makes, whichever endpoint "
        "is called, meets the strictest of them (each url_deny applies, a URL must "
        "be in every url_allow and url_schemes list, block_private_networks set on "
        "one holds for all); set them once, on group:browser"
    ]


def empty_allow_lists(doc: PolicyDocument) -> list[str]:
    """
    An allow list written empty, which reads as "allow nothing" but means
    no list (every command, extension, variable or URL), as on the seed.
    """
    rules = {
        "defaults": doc.defaults,
        **{f"endpoints.{k}": v for k, v in doc.endpoints.items()},
    }
    out = []
    for where, rule in rules.items():
        params = rule.get("params") or {}
        for name in sorted(params):
            if (
                f"params.{name}" in OPEN_WHEN_EMPTY
                and params[name] is not None
                and not params[name]
            ):
                out.append(
                    f"{where}.params.{name} is empty, which means no list: nothing is "
                    "narrowed by it (as on agent-sandbox-server); to refuse everything, "
                    "switch the endpoint off, or remove the key if no list was meant"
                )
    return out


def warnings(
    table: RouteTable, doc: PolicyDocument, rules: Mapping[str, EffectiveRule]
) -> tuple[str, ...]:
    """Every warning above, in a stable order."""
    return tuple(
        open_custom_routes(table, rules)
        + ignored_scopes(table, rules)
        + narrowed_tokens(doc)
        + anonymous_everything(doc)
        + browser_url_rules(table, rules)
        + empty_allow_lists(doc)
        + confinement.unconfined(table, rules)
        + confinement.exposed_files(rules)
    )


def template_warnings(
    registry: Iterable[Any], table: RouteTable, doc: PolicyDocument
) -> list[str]:
    """
    What a template declares that cannot work as written: a command whose
    name holds ``/`` (no URL reaches it), a scope on a command or custom
    route in a built-in namespace that is no built-in scope (a typo such
    as ``files:delte``), and a scope of the template's own that no token
    of the policy holds, so that only a ``*`` token may call it.  Warned,
    not refused: a template written for agent-sandbox-server loads as it
    did there, and such commands fail closed.
    """
    known = sorted({s for e in table if not e.custom for s in e.scopes} | {"*"})
    holders = [set(t.scopes) for t in doc.tokens]
    if doc.anonymous_scopes is not None:
        holders.append(set(doc.anonymous_scopes))

    def held(scope: str) -> bool:
        namespace = scope.partition(":")[0]
        return any(scope in h or f"{namespace}:*" in h for h in holders)

    places: list[tuple[str, Iterable[str]]] = []
    out = []
    for cmd in sorted(registry, key=lambda c: c.name):
        if "/" in cmd.name:
            out.append(
                f"command {cmd.name!r} cannot be called: its name holds '/', "
                "which no URL path segment carries (rename it, e.g. with ':')"
            )
        places.append((f"command {cmd.name!r}", cmd.scopes))
    places.extend((f"custom route {e.id!r}", e.scopes) for e in table if e.custom)
    for where, scopes in places:
        for scope in scopes:
            if not valid_scope(scope, known):
                out.append(
                    f"{where}: the scope {scope!r} is no built-in scope"
                    f"{suggest(scope, known)}; no token can hold it, so only "
                    "a '*' token may call it"
                )
            elif scope not in known and holders and not held(scope):
                out.append(
                    f"{where}: no token of the policy holds the scope "
                    f"{scope!r}, so only a '*' token may call it"
                )
    return out
