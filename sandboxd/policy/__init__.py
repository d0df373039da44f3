# -*- test-case-name: tests.policy.test_engine -*-
"""
The policy engine (SPEC §5): where a policy comes from, how it is checked,
and the compiled form the pipeline consults on every request.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

# The module, not the name: sandboxd.access.auth imports sandboxd.policy.document,
# which runs this package first, so whichever of the two is imported first
# must not need the other's names at import time.
from sandboxd.access import auth

if TYPE_CHECKING:
    from sandboxd.access.auth import TokenStore
from sandboxd.endpoints import RouteTable
from sandboxd.policy import confinement, lint
from sandboxd.policy.document import (
    PolicyDocument,
    PolicyError,
    find_policy,
    suggest,
    validate,
)
from sandboxd.policy.engine import compile_rules, resolve_base_dir
from sandboxd.policy.presets import PRESETS
from sandboxd.policy.rules import Anchors, EffectiveRule

__all__ = ["Policy", "PolicyError", "load_policy"]


@attrs.frozen
class Policy:
    """A validated, compiled policy: one :class:`EffectiveRule` per endpoint."""

    document: PolicyDocument
    rules: Mapping[str, EffectiveRule]
    tokens: TokenStore
    base_dir: str
    preset: str | None
    file: str | None
    warnings: tuple[str, ...]
    #: What the path guard pinned of the directories this policy serves.
    anchors: Anchors = attrs.field(factory=Anchors, eq=False)
    #: A hash of the document as written and the preset chosen.
    digest: str = ""
    #: Whether the document sets anything beyond ``version``, or a preset
    #: was chosen (the seed's ``configured``).
    configured: bool = False

    @property
    def revision(self) -> str | None:
        """The document's ``revision`` label."""
        return self.document.revision

    @property
    def shown_revision(self) -> str:
        """
        What discovery reports as the revision: the document's label, or
        (as the seed reports) a hash that changes with the policy.
        """
        return self.revision if self.revision is not None else self.digest

    def rule(self, endpoint_id: str) -> EffectiveRule:
        """The merged rule of one endpoint."""
        return self.rules[endpoint_id]

    def secret_env_names(self) -> frozenset[str]:
        """Environment names that hold secrets and never reach a child."""
        git = {c.token_env for c in self.document.git.credentials.values()}
        return self.tokens.secret_env | {n for n in git if n}


def own_files(
    policy_file: str | None,
    doc: PolicyDocument,
    environ: Mapping[str, str],
    extra: Iterable[str],
) -> tuple[str, ...]:
    """
    The real paths of the daemon's own files: the policy file, every token
    file (the policy's and ``ABX_SERVER_TOKEN_FILE``) and ``extra``.
    """
    names = [policy_file, environ.get("ABX_SERVER_TOKEN_FILE"), *extra]
    names += [spec.token_file for spec in doc.tokens]
    names.append(doc.link_key_file)
    names += [c.token_file for c in doc.git.credentials.values()]
    return tuple(sorted({os.path.realpath(n) for n in names if n}))


def load_policy(
    table: RouteTable,
    explicit: Any = None,
    path: str | None = None,
    preset: str | None = None,
    base_dir: str | None = None,
    environ: Mapping[str, str] | None = None,
    daemon_files: Iterable[str] = (),
    fail_closed: bool = True,
) -> Policy:
    """
    Find, validate and compile the policy (SPEC §5.1, first found wins).

    :param preset: ``--preset``; overrides the document's ``preset`` key.
    :param daemon_files: the daemon's own files besides those the policy
        names (the audit log, TLS keys): no path operation reaches them.
    :param fail_closed: a token source that yields nothing is an error (a
        start, a reload); False makes it a warning (``check-config``).
    :raises PolicyError: for anything that must stop the daemon at start.
    """
    env = os.environ if environ is None else environ
    data, source, file = find_policy(explicit, path, env)
    try:
        doc = validate(data, table, source)
    except PolicyError as e:
        raise located(e, source, path, env) from None
    chosen = preset or doc.preset
    if chosen is not None and chosen not in PRESETS:
        raise PolicyError(
            f"--preset: unknown preset {chosen!r}{suggest(chosen, PRESETS)}"
        )
    boundary = resolve_base_dir(base_dir, doc, env)
    own = own_files(file, doc, env, daemon_files)
    anchors = Anchors()
    try:
        rules = compile_rules(table, doc, chosen, boundary, env, own, anchors)
        tokens = auth.TokenStore.build(
            doc.tokens,
            env,
            fail_closed=fail_closed,
            allow_anonymous=doc.allow_anonymous,
            anonymous_scopes=doc.anonymous_scopes,
        )
        check_unauthenticated_as(rules, doc, tokens)
        confinement.check(rules)
    except PolicyError as e:
        raise located(e, source, path, env) from None
    return Policy(
        document=doc,
        rules=rules,
        tokens=tokens,
        base_dir=boundary,
        preset=chosen,
        file=file,
        warnings=tuple(doc.warnings)
        + tuple(tokens.warnings)
        + lint.warnings(table, doc, rules),
        anchors=anchors,
        digest=_digest(data, chosen),
        configured=chosen is not None
        or (isinstance(data, Mapping) and bool(set(data) - {"version"})),
    )


def located(
    error: PolicyError, source: str, path: str | None, environ: Mapping[str, str]
) -> PolicyError:
    """
    ``error`` naming the policy source it came from (the file, or the
    variable that held or named it) before the place in the document: an
    operator with a policy file, an inline variable and a system file
    should not have to guess which one is wrong.  An error about the
    environment or the command line (``ABX_...``, ``--...``) already names
    its source, and a policy given as an argument has no other name.
    """
    message = str(error)
    if source in ("none", "argument") or message.startswith(("ABX_", "--", source)):
        return error
    label = source
    if path is None and source == environ.get("ABX_SERVER_POLICY_FILE"):
        label = f"{source} (ABX_SERVER_POLICY_FILE)"
    return PolicyError(f"{label}: {message}")


def check_unauthenticated_as(
    rules: Mapping[str, EffectiveRule], doc: PolicyDocument, tokens: TokenStore
) -> None:
    """
    Refuse a ``params.unauthenticated_as`` that names no token of the
    policy: a caller without credentials would otherwise be refused on
    every call, or worse, stand for whoever a later token is named.

    :raises PolicyError: naming the rule that set it and the known ids.
    """
    for rule in rules.values():
        wanted = rule.params.unauthenticated_as
        if wanted is None:
            continue
        known = [spec.id for spec in doc.tokens] + [
            i for i in tokens.ids() if i not in {s.id for s in doc.tokens}
        ]
        if wanted not in known:
            where = rule.source("params.unauthenticated_as") or rule.endpoint_id
            listed = ", ".join(repr(i) for i in known) or "none: no token is configured"
            raise PolicyError(
                f"{where}: params.unauthenticated_as names the token id {wanted!r}, "
                f"which is not one of the policy's tokens (ids: {listed})"
            )


def _digest(data: Any, preset: str | None) -> str:
    """16 hex digits of SHA-256 over the document (keys sorted) and the preset."""
    blob = json.dumps(
        {"document": data, "preset": preset},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
