# -*- test-case-name: tests.test_pipeline -*-
"""
Steps 1–5 of the request pipeline (SPEC §3), decided from the request line
and headers alone, before any body byte is read.

:func:`admit` is pure apart from the rate and concurrency counters it
updates: it takes the method, the raw target and the headers, and returns an
:class:`Admission` or raises the :class:`~sandboxd.errors.ApiError` the
client will see.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping, Sequence

import attrs

from sandboxd.auth import Identity, authenticate
from sandboxd.context import Context
from sandboxd.endpoints import HTTP_METHODS, Endpoint
from sandboxd.errors import ApiError
from sandboxd.policy.defaults import LOOPBACK_NAMES_KEPT
from sandboxd.policy.rules import EffectiveRule
from sandboxd.web.target import invalid_path, parse_path, parse_query

_LOOPBACK_NAMES = (
    "localhost",
    "localhost.localdomain",
    "ip6-localhost",
    "ip6-loopback",
)


@attrs.define(eq=False)
class Admission:
    """What the header-time steps decided about one request."""

    endpoint: Endpoint
    path: str
    path_params: dict[str, str]
    query: dict[str, str]
    raw_query: str
    identity: Identity
    rule: EffectiveRule
    slot: bool = False


@attrs.define(eq=False)
class Refusal:
    """What is known about a request the pipeline refused (for audit)."""

    error: ApiError
    path: str
    raw_query: str
    endpoint: Endpoint | None = None
    identity: Identity | None = None
    rule: EffectiveRule | None = None


class PipelineRefusal(Exception):
    """Carries a :class:`Refusal` out of :func:`admit`."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.error.message)
        self.refusal = refusal


def not_found(path: str) -> ApiError:
    """The seed's 404 for a path nothing serves."""
    return ApiError(404, f"Not found: {path}", "ValueError", "not_found")


def endpoint_disabled(endpoint: Endpoint, rule: EffectiveRule) -> ApiError:
    """404 ``endpoint_disabled`` naming the rule that switched it off."""
    why = (
        "is not implemented yet" if rule.reason == "not_implemented" else "is disabled"
    )
    return ApiError(
        404,
        f"endpoint {endpoint.id!r} {why}",
        "ValueError",
        "endpoint_disabled",
        endpoint=endpoint.id,
        rule=rule.enabled_by,
    )


def missing_scope(
    identity: Identity, rule: EffectiveRule, path_params: Mapping[str, str]
) -> str | None:
    """
    The first scope of the rule the caller lacks, or None.

    ``commands:run:NAME`` stands in for ``commands:run`` on that one command.
    """
    for scope in rule.scopes:
        if identity.has_scope(scope):
            continue
        if (
            scope == "commands:run"
            and rule.endpoint_id == "commands_run"
            and identity.has_scope(f"commands:run:{path_params.get('name', '')}")
        ):
            continue
        return scope
    return None


def host_name(value: str) -> str:
    """The name part of a Host header (no port, no IPv6 brackets), lower-cased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


@functools.lru_cache(maxsize=LOOPBACK_NAMES_KEPT)
def is_loopback(name: str) -> bool:
    """
    Whether a host name or address is this machine's loopback.

    (Asked on every request without a token; parsing an address costs more
    than the rest of the Host check, and clients send the same few names.)
    """
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _refuse(
    error: ApiError, path: str, raw_query: str, **known: object
) -> PipelineRefusal:
    return PipelineRefusal(Refusal(error, path, raw_query, **known))  # type: ignore[arg-type]


def admit(
    context: Context,
    method: str,
    raw_target: bytes,
    headers: Mapping[bytes, Sequence[bytes]],
) -> Admission:
    """
    Run steps 1–5 for one request.

    :param headers: lower-cased header names to their raw values.
    :raises PipelineRefusal: carrying the error and what was known.
    """
    raw_path, _, raw_query_b = raw_target.partition(b"?")
    raw_query = raw_query_b.decode("latin-1")
    display = raw_path.decode("latin-1")
    # 1. One normal form of the path.
    try:
        path, segments = parse_path(raw_path)
    except ApiError as e:
        raise _refuse(e, display, raw_query) from None
    # 2. Route.
    if method not in HTTP_METHODS:
        raise _refuse(
            ApiError(
                501,
                f"method {method} is not supported",
                "ValueError",
                "not_implemented",
            ),
            path,
            raw_query,
        )
    match = context.router.match(method, segments)
    if match is None:
        raise _refuse(not_found(path), path, raw_query)
    endpoint, path_params = match
    rule = context.policy.rules[endpoint.id]
    # 3. Authentication.
    try:
        identity = (
            authenticate(context.policy.tokens, headers)
            if endpoint.auth_required
            else Identity("anonymous", frozenset())
        )
    except ApiError as e:
        raise _refuse(e, path, raw_query, endpoint=endpoint, rule=rule) from None
    known = {"endpoint": endpoint, "identity": identity, "rule": rule}
    # 4. Policy gate: enabled, scopes, rate (concurrency after step 5).
    if not rule.enabled:
        raise _refuse(endpoint_disabled(endpoint, rule), path, raw_query, **known)
    if endpoint.auth_required:
        lacking = missing_scope(identity, rule, path_params)
        if lacking is not None:
            raise _refuse(
                ApiError(
                    403,
                    f"this identity lacks the scope {lacking!r}",
                    "PermissionError",
                    "missing_scope",
                    endpoint=endpoint.id,
                    scope=lacking,
                    rule=rule.source("scopes") or "endpoint:" + endpoint.id,
                ),
                path,
                raw_query,
                **known,
            )
    try:
        if rule.limits.rate_per_minute is not None:
            context.rates.take(identity.id, endpoint.id, rule.limits.rate_per_minute)
        # 5. Query, framing, origin and host.
        query = parse_query(raw_query_b)
        _check_headers(context, headers)
        slot = context.gate.acquire(endpoint.id, rule.limits.max_concurrency)
    except ApiError as e:
        if e.code in ("rate_limited", "concurrency_limited"):
            e.extra.setdefault(
                "rule",
                rule.source(
                    "limits.rate_per_minute"
                    if e.code == "rate_limited"
                    else "limits.max_concurrency"
                ),
            )
        raise _refuse(e, path, raw_query, **known) from None
    for value in path_params.values():
        if "\x00" in value:
            raise _refuse(
                invalid_path("NUL is not allowed in a path"), path, raw_query, **known
            )
    return Admission(
        endpoint, path, path_params, query, raw_query, identity, rule, slot
    )


def _check_headers(context: Context, headers: Mapping[bytes, Sequence[bytes]]) -> None:
    """Step 5's header checks: Transfer-Encoding, Origin, Host."""
    if headers.get(b"transfer-encoding"):
        raise ApiError(
            400,
            "Transfer-Encoding is not accepted; send a Content-Length",
            "ValueError",
            "transfer_encoding_not_allowed",
        )
    policy = context.policy
    origins = headers.get(b"origin")
    if origins:
        origin = origins[-1].decode("latin-1").strip()
        if origin not in policy.document.allowed_origins:
            raise ApiError(
                403,
                f"requests from the browser origin {origin!r} are not allowed",
                "PermissionError",
                "origin_not_allowed",
                rule="policy:allowed_origins",
            )
    hosts = headers.get(b"host", [])
    if len(hosts) != 1 or not hosts[0].strip():
        raise ApiError(
            400, "exactly one Host header is required", "ValueError", "invalid_param"
        )
    if policy.tokens.local_mode:
        name = host_name(hosts[0].decode("latin-1"))
        if not (
            is_loopback(name)
            or name == context.hostname.lower()
            or name in (h.lower() for h in policy.document.allowed_hosts)
        ):
            raise ApiError(
                403,
                f"the Host {name!r} is not allowed without a token",
                "PermissionError",
                "host_not_allowed",
                rule="policy:allowed_hosts",
            )
