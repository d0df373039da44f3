# -*- test-case-name: tests.policy.test_http -*-
"""
Discovery (SPEC §5.6): what the calling identity may do, and why.

Everything here is computed from the endpoint table and the compiled policy;
nothing touches the file system.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from sandboxd._version import __version__
from sandboxd.access.auth import Identity
from sandboxd.access.gate import lacking_scope, needs_credential, runs_some_commands
from sandboxd.endpoints import CapabilityGroup, Endpoint, current_id
from sandboxd.errors import ApiError, Code, bad_request, forbidden, policy_rule
from sandboxd.policy import Policy
from sandboxd.policy.paths import (
    EXTENSION_ENDPOINTS,
    absolute,
    check_extension,
    decide,
    matches,
)
from sandboxd.policy.rules import EffectiveRule


def _non_default(obj: Any) -> dict[str, Any]:
    """
    The fields of a rule section, without unset (None) values, as JSON
    would have them (tuples as lists, dicts copied).

    Read field by field rather than through ``attrs.asdict``, whose
    recursion is most of what ``GET /capabilities`` costs: it runs three
    times for every endpoint of every answer.
    """
    out: dict[str, Any] = {}
    for field in attrs.fields(type(obj)):
        value = getattr(obj, field.name)
        if value is None:
            continue
        if isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, dict):
            value = dict(value)
        out[field.name] = value
    return out


def disclosed_paths(rule: EffectiveRule) -> dict[str, Any]:
    """
    An endpoint's path rule as discovery shows it: the seed's fields
    (``allow``, ``read_only`` as a yes/no, ``deny_count``, ``symlinks``),
    which its SDK's models check, plus ours (``deny``, the read-only list
    as ``read_only_paths``, ``hard_links``).
    """
    paths = rule.paths
    return {
        "allow": list(paths.allow),
        "deny": list(paths.deny),
        "deny_count": len(paths.deny),
        "read_only": read_only_everywhere(rule),
        "read_only_paths": list(paths.read_only),
        "symlinks": paths.symlinks,
        "hard_links": paths.hard_links,
    }


def read_only_everywhere(rule: EffectiveRule) -> bool:
    """
    Whether the read-only list covers every place the endpoint may touch
    (each ``allow`` entry, or the base dir when there is none): what the
    seed's ``read_only: true`` means.
    """
    entries = rule.paths.read_only
    if not entries:
        return False
    roots = rule.paths.allow or (rule.base_dir,)
    for root in roots:
        if any(c in root for c in "*?["):
            covered = root in entries or "**" in entries or "/**" in entries
        else:
            target = absolute(root, rule.base_dir)
            covered = any(matches(entry, target, rule.base_dir) for entry in entries)
        if not covered:
            return False
    return True


def describe(
    endpoint: Endpoint, rule: EffectiveRule, identity: Identity
) -> dict[str, Any]:
    """One endpoint as ``/capabilities`` shows it to ``identity``."""
    lacking = lacking_scope(identity, rule, {})
    allowed = rule.enabled and (not needs_credential(endpoint, rule) or lacking is None)
    if lacking and runs_some_commands(endpoint.id, lacking, identity):
        allowed, lacking = rule.enabled, None
    reason = (
        rule.reason
        if not rule.enabled
        else (Code.MISSING_SCOPE if not allowed else None)
    )
    entry: dict[str, Any] = {
        "method": endpoint.method,
        "path": endpoint.path,
        "group": endpoint.group.value,
        "summary": endpoint.summary,
        "streaming": endpoint.streaming,
        "enabled": rule.enabled,
        "allowed": allowed,
        "reason": reason,
        "rule": rule.enabled_by,
        "scopes": list(rule.scopes),
    }
    if allowed:
        # How an endpoint is configured is shown only to callers that may
        # call it, as on the seed: another identity's allowed paths are not
        # this caller's business.
        entry["limits"] = _non_default(rule.limits)
        entry["paths"] = disclosed_paths(rule)
        entry["params"] = _non_default(rule.params)
    return entry


def capabilities(context: Any, identity: Identity) -> dict[str, Any]:
    """The whole ``GET /capabilities`` document."""
    policy: Policy = context.policy
    endpoints: dict[str, Any] = {}
    summary: dict[str, dict[str, int]] = {
        g.value: {"enabled": 0, "total": 0} for g in CapabilityGroup
    }
    for endpoint in context.table:
        rule = policy.rules[endpoint.id]
        endpoints[endpoint.id] = describe(endpoint, rule, identity)
        counts = summary[endpoint.group.value]
        counts["total"] += 1
        counts["enabled"] += int(rule.enabled)
    return {
        "groups": {name: counts["enabled"] > 0 for name, counts in summary.items()},
        "api_version": 2,
        "server_version": __version__,
        "identity": identity.as_json(),
        "policy": {
            "preset": policy.preset or "default",
            "revision": policy.shown_revision,
            "configured": policy.configured,
            "base_dir": policy.base_dir,
        },
        "group_summary": summary,
        "endpoints": endpoints,
        "warnings": list(policy.warnings) + identity_warnings(policy, identity),
    }


def identity_warnings(policy: Policy, identity: Identity) -> list[str]:
    """What discovery warns the caller about itself (as the seed does)."""
    if "*" in identity.scopes and not policy.tokens.local_mode:
        return ["identity holds the wildcard scope '*'"]
    return []


def default_op(endpoint: Endpoint) -> str:
    """The file operation an endpoint performs, for path decisions."""
    if "files:delete" in endpoint.scopes and endpoint.method == "DELETE":
        return "delete"
    if (
        any(s.endswith(":write") for s in endpoint.scopes)
        or endpoint.id == "files_move"
    ):
        return "write"
    return "read"


#: The decision's ``code`` for an id that names no endpoint.  The seed's
#: server answers such a check with 200 and this code, and its SDK's
#: ``check()`` reads the decision; a refused request would raise there
#: instead.  Never an error body's code (it is not an error: the answer to
#: "may I call X?" is no), so it is not one of :class:`Code`'s.
UNKNOWN_ENDPOINT = "unknown_endpoint"


def unknown_endpoint(endpoint_id: str, known: Iterable[str]) -> dict[str, Any]:
    """The decision for an id no endpoint has: not allowed, with the nearest id."""
    from sandboxd.policy.document import suggest

    return {
        "endpoint": endpoint_id,
        "allowed": False,
        "code": UNKNOWN_ENDPOINT,
        "reason": f"unknown endpoint {endpoint_id!r}{suggest(endpoint_id, known)}",
    }


def check(context: Any, identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /capabilities/check``: the decision for a hypothetical call."""
    endpoint_id = body.get("endpoint")
    if not isinstance(endpoint_id, str) or not endpoint_id:
        raise bad_request("'endpoint' is required")
    op = body.get("op")
    if op is not None and op not in ("read", "write", "delete"):
        raise bad_request("'op' must be read, write or delete")
    listed = body.get("paths")
    if listed is None:
        listed = []
    if not isinstance(listed, list):
        # Not a string either: list("abc") would decide "a", "b" and "c".
        raise bad_request("'paths' must be a list of paths")
    paths = list(listed)
    if body.get("path") is not None:
        paths.insert(0, body["path"])
    if not all(isinstance(p, str) for p in paths):
        raise bad_request("paths must be strings")
    command = body.get("command")
    if command is not None and not isinstance(command, str):
        raise bad_request("'command' must be a string")
    scopes = body.get("scopes")
    if scopes is not None:
        if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
            raise bad_request("'scopes' must be a list of strings")
        identity = Identity(identity.id, frozenset(scopes))
    params = body.get("params")
    if params is not None and not isinstance(params, dict):
        raise bad_request("'params' must be an object")
    # A well-formed question about an id no endpoint has is answered, not
    # refused (the body's other fields are checked first all the same).
    if endpoint_id not in context.table:
        endpoint_id = current_id(endpoint_id)
    if endpoint_id not in context.table:
        return unknown_endpoint(endpoint_id, context.table.ids())
    endpoint = context.table.get(endpoint_id)
    rule: EffectiveRule = context.policy.rules[endpoint_id]
    out: dict[str, Any] = {"endpoint": endpoint_id, "allowed": True}
    if not rule.enabled:
        out.update(
            allowed=False,
            code=Code.ENDPOINT_DISABLED,
            rule=rule.enabled_by,
            reason=rule.reason,
        )
    else:
        lacking = lacking_scope(identity, rule, {"name": command or ""})
        if (
            lacking
            and command is None
            and runs_some_commands(endpoint_id, lacking, identity)
        ):
            lacking = None
        if needs_credential(endpoint, rule) and lacking:
            out.update(
                allowed=False,
                code=Code.MISSING_SCOPE,
                scope=lacking,
                rule=rule.source("scopes") or f"endpoint:{endpoint_id}",
                reason=f"identity {identity.id!r} lacks the scope {lacking!r} "
                f"that endpoint {endpoint_id!r} requires",
            )
    if out["allowed"] and endpoint_id == "run_command" and command is not None:
        out.update(_command_refusal(context, identity, command) or {})
    if out["allowed"] and params:
        refusal = check_params(rule, params, endpoint_id)
        if refusal is not None:
            out.update(allowed=False, **refusal)
    decisions = [decide(rule, p, op or default_op(endpoint)) for p in paths]
    out["paths"] = [d.as_json() for d in decisions]
    if out["allowed"] and any(not d.allowed for d in decisions):
        first = next(d for d in decisions if not d.allowed)
        out.update(
            allowed=False,
            code=first.code,
            rule=first.rule,
            reason=f"the path {first.path!r} is refused ({first.code})",
        )
    if out["allowed"] and endpoint_id in EXTENSION_ENDPOINTS:
        # After the path decision, with the very check the call makes.
        for path in paths:
            try:
                check_extension(rule, path)
            except ApiError as e:
                out.update(
                    allowed=False,
                    code=e.code,
                    rule=e.extra.get("rule"),
                    reason=e.message,
                )
                break
    return out


def _command_refusal(
    context: Any, identity: Identity, name: str
) -> dict[str, Any] | None:
    """
    What ``POST /commands/{name}`` would refuse past the gate, with the
    call's own checks: a name no command has (404), or the command's own
    scopes not held (403, ``rule: command:NAME``).
    """
    cmd = context.registry.get(name)
    if cmd is None:
        return {
            "allowed": False,
            "code": Code.NOT_FOUND,
            "reason": f"Unknown command {name!r}",
        }
    lacking = identity.missing(cmd.scopes)
    if lacking is None:
        return None
    return {
        "allowed": False,
        "code": Code.MISSING_SCOPE,
        "scope": lacking,
        "rule": f"command:{name}",
        "reason": f"identity {identity.id!r} lacks the scope {lacking!r} "
        f"that command {name!r} requires",
    }


def check_params(
    rule: EffectiveRule, params: dict[str, Any], endpoint_id: str = ""
) -> dict[str, Any] | None:
    """
    Decide the parameter rules a hypothetical call would meet, with the
    very checks the call makes, in the order it makes them: what check
    answers is what the call would.

    Understands ``command``, ``shell`` (with a command, as ``/shell``
    takes it; alone, as a terminal's), ``language`` and ``signal``;
    returns ``{code, rule, param, reason}`` for the first refusal (naming the
    parameter that was refused), or None.
    """
    from sandboxd.processes.command import (
        check_command_allowed,
        check_shell,
        command_argv,
        command_text,
        language_name,
        signal_number,
        terminal_shell_refusal,
    )
    from sandboxd.web.params import integer

    def lexical(path: str) -> str:
        # What the guard would decide, from the policy alone (no file system).
        decision = decide(rule, path, "read")
        if not decision.allowed:
            assert decision.code is not None
            raise forbidden(
                f"path not allowed: {path}", decision.code, rule=decision.rule
            )
        return decision.target or path

    def refused(error: ApiError, param: str) -> dict[str, Any]:
        return {
            "code": error.code,
            "rule": error.extra.get("rule"),
            "param": param,
            "reason": error.message,
        }

    with_command = "command" in params
    shell = params.get("shell")
    # Beside a command, false is no shell (``/shell``); a terminal takes
    # no command, and its ``shell`` must name one.
    given_shell = shell is not None and not (with_command and shell is False)
    if with_command:
        try:
            command_text(params)
        except ApiError as e:
            return refused(e, "command")
    if given_shell:
        try:
            name = check_shell(shell, rule)
            if with_command:
                check_command_allowed(rule, [name])
        except ApiError as e:
            # A terminal's shell is refused as the terminal refuses it.
            return refused(
                e if with_command else terminal_shell_refusal(e, rule), "shell"
            )
    if with_command:
        try:
            command_argv({"command": params["command"], "shell": shell}, rule, lexical)
        except ApiError as e:
            return refused(e, "command")
    if params.get("language") is not None:
        try:
            language = language_name(params["language"])
        except ApiError as e:
            return refused(e, "language")
        if language not in rule.params.languages:
            return {
                "code": Code.LANGUAGE_NOT_ALLOWED,
                "rule": policy_rule(rule, "params.languages"),
                "param": "language",
            }
    if params.get("signal") is not None:
        try:
            if endpoint_id == "agents_terminal_kill":
                number = integer(params["signal"], "signal")
            else:
                number = signal_number(params["signal"])
        except ApiError as e:
            return refused(e, "signal")
        if number not in rule.params.allowed_signals:
            return {
                "code": Code.SIGNAL_NOT_ALLOWED,
                "rule": policy_rule(rule, "params.allowed_signals"),
                "param": "signal",
            }
    return None
